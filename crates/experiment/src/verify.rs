//! `tune apply --verify`: measure, apply, measure again, keep the change only if it helped.
//! The tests run here (on a thread inside a namespace when the path starts in one, as from a
//! lab's client), the change through `bloatlab_tune::apply`.

use bloatlab_measure::{Params, TestKind};
use bloatlab_result::Summary;
use bloatlab_tune::apply::{self, Iface};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Goodput the change may cost, as a share of what was measured before: a shaper at 95% of
/// the line takes some 5-10% on purpose.
pub const KEEP_GOODPUT: f64 = 0.85;
/// What one direction may lose while the total holds: through a bloated line a download
/// starves because its ACKs wait behind the upload; shaped, the ACKs take their share of the
/// upload again (at 50 Mbit/s down, over 1 Mbit/s of a 3.5 Mbit/s up), so the upload falls on
/// purpose (measured 3.6 -> 1.6 Mbit/s while the download rose 5.9 -> 51.8). Below a quarter
/// of what it had, a direction has starved.
pub const KEEP_DIRECTION: f64 = 0.25;

pub struct Verify {
    /// The bloatlab server to measure against.
    pub host: String,
    /// Run the tests inside this network namespace.
    pub netns: Option<String>,
    /// Load phase of each test, seconds.
    pub length: f64,
    pub out_dir: PathBuf,
}

#[derive(Clone, Debug, Serialize)]
pub struct Verified {
    pub before: Summary,
    pub after: Summary,
    pub kept: bool,
    pub reason: String,
}

fn measure(v: &Verify, tag: &str) -> Result<Summary, String> {
    let file = v.out_dir.join(format!(
        "bloatlab-tune-{tag}-{}.json.gz",
        std::process::id()
    ));
    let params = Params {
        length: v.length,
        idle: 3.0,
        ..Params::new(TestKind::RrulBe)
    };
    let opts = crate::test_options(&file, true, &Arc::new(AtomicBool::new(false)));
    let run = || bloatlab_measure::run(&params, &v.host, &opts);
    let outcome = match &v.netns {
        Some(ns) => bloatlab_lab::ns::in_netns(ns, run)?,
        None => run(),
    }
    .map_err(|e| format!("the {tag} test failed: {e}"))?;
    crate::summary_of(outcome, tag)
}

/// Keep or not, and why: latency under load must not rise, the total goodput must keep
/// `KEEP_GOODPUT` of what it was, and each direction `KEEP_DIRECTION`.
pub fn judge(before: &Summary, after: &Summary) -> (bool, String) {
    // A change that stops TCP but not the probes (a firewall rule, a broken shaper) would
    // otherwise read as the best latency ever.
    for (tag, s) in [("before", before), ("after", after)] {
        if let Some(why) = &s.load_missing {
            return (false, format!("the {tag} test's load never ran: {why}"));
        }
    }
    let (Some(b), Some(a)) = (before.added_latency_ms, after.added_latency_ms) else {
        return (false, "a test measured no latency under load".into());
    };
    if a > b {
        return (
            false,
            format!("latency under load got worse: +{a:.1} ms after, +{b:.1} ms before"),
        );
    }
    let total =
        |s: &Summary| s.throughput_mbps.down.unwrap_or(0.0) + s.throughput_mbps.up.unwrap_or(0.0);
    if total(after) < KEEP_GOODPUT * total(before) {
        return (
            false,
            format!(
                "goodput fell to {:.1} Mbit/s from {:.1} in all (below {:.0}%)",
                total(after),
                total(before),
                KEEP_GOODPUT * 100.0
            ),
        );
    }
    for (name, b, a) in [
        (
            "download",
            before.throughput_mbps.down,
            after.throughput_mbps.down,
        ),
        (
            "upload",
            before.throughput_mbps.up,
            after.throughput_mbps.up,
        ),
    ] {
        if let (Some(b), Some(a)) = (b, a) {
            if a < KEEP_DIRECTION * b {
                return (
                    false,
                    format!(
                        "{name} goodput fell to {a:.1} Mbit/s from {b:.1} (below {:.0}%)",
                        KEEP_DIRECTION * 100.0
                    ),
                );
            }
        }
    }
    (
        true,
        format!(
            "latency under load +{a:.1} ms after, +{b:.1} ms before ({:.1}x less); goodput {:.1} \
                Mbit/s after, {:.1} before",
            if a > 0.0 { b / a } else { f64::INFINITY },
            total(after),
            total(before)
        ),
    )
}

impl Verified {
    /// Before and after, one line each, and whether the change stays.
    pub fn text(&self) -> String {
        let row = |n: &str, s: &Summary| {
            let m = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
            format!(
                "{n:<7} added latency {:>7} ms   down {:>6} Mbit/s   up {:>6} Mbit/s\n",
                m(s.added_latency_ms),
                m(s.throughput_mbps.down),
                m(s.throughput_mbps.up)
            )
        };
        let kept = if self.kept { "kept" } else { "not kept" };
        row("before", &self.before)
            + &row("after", &self.after)
            + &format!("{kept}: {}\n", self.reason)
    }
}

/// Measures, applies `script` to `iface`, measures again; rolls back unless `judge` keeps it.
pub fn apply_verified(iface: &Iface, script: &str, v: &Verify) -> Result<Verified, String> {
    std::fs::create_dir_all(&v.out_dir).map_err(|e| format!("{}: {e}", v.out_dir.display()))?;
    let before = measure(v, "before")?;
    apply::apply(iface, script)?;
    let after = match measure(v, "after") {
        Ok(s) => s,
        Err(e) => {
            apply::rollback(iface)?;
            return Err(format!("{e}; rolled back"));
        }
    };
    let (kept, mut reason) = judge(&before, &after);
    if !kept {
        apply::rollback(iface)?;
        reason += "; rolled back";
    }
    Ok(Verified {
        before,
        after,
        kept,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(added: f64, down: f64, up: f64) -> Summary {
        let mut s = Summary {
            added_latency_ms: Some(added),
            ..Default::default()
        };
        s.throughput_mbps.down = Some(down);
        s.throughput_mbps.up = Some(up);
        s
    }

    #[test]
    fn kept_only_when_latency_falls_and_goodput_stays() {
        assert!(judge(&s(600.0, 57.0, 3.7), &s(12.0, 52.0, 3.3)).0);
        // The download recovers from 6 to 52 Mbit/s, the upload gives up ACK room: kept.
        assert!(judge(&s(120.0, 5.9, 3.6), &s(24.0, 51.8, 1.6)).0);
        let (kept, why) = judge(&s(120.0, 6.1, 3.6), &s(21.0, 51.8, 0.0));
        assert!(
            !kept && why.starts_with("upload goodput fell to 0.0 Mbit/s from 3.6 (below 25%)"),
            "{why}"
        );
        let (kept, why) = judge(&s(600.0, 57.0, 3.7), &s(700.0, 52.0, 3.3));
        assert!(
            !kept && why.starts_with("latency under load got worse"),
            "{why}"
        );
        let (kept, why) = judge(&s(600.0, 57.0, 3.7), &s(12.0, 40.0, 3.3));
        assert!(
            !kept && why.starts_with("goodput fell to 43.3 Mbit/s from 60.7 in all"),
            "{why}"
        );
        let stopped_tcp = Summary {
            load_missing: Some("none of its 8 load flows opened (tcp down 1 BE: timed out)".into()),
            ..Default::default()
        };
        let (kept, why) = judge(&s(600.0, 57.0, 3.7), &stopped_tcp);
        assert!(
            !kept
                && why
                    == "the after test's load never ran: none of its 8 load flows opened (tcp \
                    down 1 BE: timed out)",
            "{why}"
        );
    }
}
