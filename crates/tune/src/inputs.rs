//! What the tuning commands read: result and locate files, and the advice → shaper → script
//! pipeline that `tune apply --from` and the lab's demo share.

use crate::advise::{self, Advice, RouterQdisc, Target};
use crate::config::{self, Shaping};
use crate::link::LinkType;
use crate::writeback::Feed;
use bloatlab_analyze::summary_of;
use bloatlab_result::{ResultFile, Summary};
use std::path::PathBuf;

/// Result files' summaries, and whether a locate file among them put the queue on this host.
pub fn read_runs(files: &[PathBuf]) -> Result<(Vec<Summary>, bool), String> {
    let (mut runs, mut on_host) = (Vec::new(), false);
    for f in files {
        if let Some(l) = bloatlab_result::locate::read(f)? {
            on_host |= l.verdict.hop == Some(0);
            continue;
        }
        let r = bloatlab_result::read(f).map_err(|e| e.to_string())?;
        runs.push(summary_of(&r));
    }
    if runs.is_empty() {
        return Err("no result file among the inputs (a locate file alone has no rates)".into());
    }
    Ok((runs, on_host))
}

/// The files among `files` that read as results, each with its path (a locate file and
/// unreadable ones are left out).
pub fn read_results(files: &[PathBuf]) -> Vec<(PathBuf, ResultFile)> {
    files
        .iter()
        .filter_map(|f| bloatlab_result::read(f).ok().map(|r| (f.clone(), r)))
        .collect()
}

/// The writeback result among `results`, if any.
pub fn writeback_of(results: &[(PathBuf, ResultFile)]) -> Option<&ResultFile> {
    results
        .iter()
        .map(|(_, r)| r)
        .find(|r| r.metadata.test == "writeback")
}

/// The rate that feeds a disk: `rate` when given, else the best goodput of the network results
/// (a writeback result among them is skipped).
pub fn feed_from(rate: Option<u64>, results: &[(PathBuf, ResultFile)]) -> Option<Feed> {
    let best = results
        .iter()
        .filter(|(_, r)| r.metadata.test != "writeback")
        .map(|(f, r)| (f, summary_of(r)))
        .flat_map(|(f, s)| {
            [s.throughput_mbps.down, s.throughput_mbps.up]
                .into_iter()
                .flatten()
                .map(move |m| (f, m))
        })
        .max_by(|x, y| x.1.total_cmp(&y.1));
    match (rate, best) {
        (Some(bps), _) => Some(Feed {
            bps,
            from: "given with --rate".into(),
        }),
        (None, Some((f, m))) => Some(Feed {
            bps: (m * 1e6) as u64,
            from: format!("the best goodput measured in {}", f.display()),
        }),
        (None, None) => None,
    }
}

/// The shaper the advice asks for on `dev`.
pub fn shaping(advice: &Advice, dev: &str, link: LinkType) -> Shaping {
    Shaping {
        dev: dev.to_string(),
        down_kbit: advice.down.as_ref().map(|d| d.rate_kbit),
        up_kbit: advice.up.as_ref().map(|d| d.rate_kbit),
        link,
        ack_filter: advice.upload_ack_filter(),
    }
}

/// From measured runs to the tc script for `dev`: CAKE's rates from the advice, as the best
/// qdisc `has` says the kernel runs; and what was given up, when anything was. An error where
/// the advice refused a direction (`advise::starved`): half a shaper built on a starved rate
/// is worse than none.
pub fn kernel_script(
    runs: &[Summary],
    dev: &str,
    link: LinkType,
    has: impl Fn(&str) -> bool,
) -> Result<(String, Option<String>), String> {
    let advice = advise_cake(runs, link);
    if let Some(why) = advice.refusal() {
        return Err(why);
    }
    Ok(config::for_kernel(&shaping(&advice, dev, link), has))
}

/// The advice for CAKE on `link` from measured runs, the queue not on this host: the rates
/// every shaper takes from it.
pub fn advise_cake(runs: &[Summary], link: LinkType) -> Advice {
    let target = Target {
        link,
        qdisc: RouterQdisc::Cake,
        queue_on_host: false,
    };
    advise::advise(runs, &target)
}

/// Page-cache thresholds (background, throttle; bytes) advised from the writeback result among
/// `from`, fed at `rate` or the best goodput of the network results beside it; `None` when
/// there is no writeback result.
pub fn writeback_thresholds(
    from: &[PathBuf],
    rate: Option<u64>,
) -> Result<Option<(u64, u64)>, String> {
    let results = from
        .iter()
        .map(|f| {
            bloatlab_result::read(f)
                .map(|r| (f.clone(), r))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some(wb) = writeback_of(&results) else {
        return Ok(None);
    };
    let a = crate::writeback::advise(wb, feed_from(rate, &results), 1 << 20, None)?;
    Ok(Some((a.dirty_background_bytes, a.dirty_bytes)))
}
