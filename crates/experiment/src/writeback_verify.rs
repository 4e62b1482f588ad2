//! `tune apply --sysctl --verify DIR`: measure the page cache in front of DIR's disk, set the
//! dirty thresholds, measure again, keep them only if they helped. The tests run here
//! (`bloatlab_measure::writeback`); the thresholds are global, so every way out of here that does
//! not keep them restores the machine's own (also when a measurement fails).

use bloatlab_measure::writeback::{Fsync, WritebackParams};
use bloatlab_result::Summary;
use bloatlab_tune::sysctl;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Rate to stable storage the change may cost, as a share of before: smaller thresholds
/// start the disk earlier, which should not slow it.
pub const KEEP_STABLE: f64 = 0.9;
/// How much longer a synced write may wait (share, plus a fixed allowance for a noisy disk).
pub const KEEP_SYNC_WAIT: f64 = 1.5;
pub const SYNC_WAIT_SLACK_MS: f64 = 5.0;

pub struct WritebackVerify {
    pub dir: PathBuf,
    /// Bytes each test writes, and the feeding rate it writes at (full speed when absent).
    pub size: u64,
    pub rate_bps: Option<u64>,
    pub out_dir: PathBuf,
}

#[derive(Clone, Debug, Serialize)]
pub struct SysctlVerified {
    pub before: Summary,
    pub after: Summary,
    pub kept: bool,
    pub reason: String,
}

fn measure(v: &WritebackVerify, tag: &str) -> Result<Summary, String> {
    let file = v.out_dir.join(format!(
        "bloatlab-tune-writeback-{tag}-{}.json.gz",
        std::process::id()
    ));
    let params = WritebackParams {
        dir: v.dir.clone(),
        size: v.size,
        rate_bps: v.rate_bps,
        fsync: Fsync::End,
        idle: 1.0,
    };
    let opts = crate::test_options(&file, true, &Arc::new(AtomicBool::new(false)));
    let outcome = bloatlab_measure::writeback::run(&params, &opts)
        .map_err(|e| format!("the {tag} test failed: {e}"))?;
    crate::summary_of(outcome, tag)
}

/// The longest a synced write waited: the small probes' p99 or the big file's closing fsync,
/// whichever is longer. Either alone misleads: with the default thresholds the disk is idle
/// while the cache fills (probes are fast) and the wait comes all at once in the fsync; with
/// small ones the probes share the disk with the writeback all along and the fsync is short.
fn sync_wait(s: &Summary) -> Option<f64> {
    match (s.small_sync_ms.map(|p| p.p99), s.fsync_ms) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0.0).max(b.unwrap_or(0.0))),
    }
}

/// Keep or not, and why: the cache must hold less at its fullest, the disk keep
/// `KEEP_STABLE` of its rate, and a synced write not wait much longer ([`sync_wait`]).
pub fn judge(before: &Summary, after: &Summary) -> (bool, String) {
    let peak = |s: &Summary| s.writeback.as_ref().map(|w| w.dirty_peak_mb);
    let (Some(pb), Some(pa), Some(sb), Some(sa)) = (
        peak(before),
        peak(after),
        before.stable_mbps,
        after.stable_mbps,
    ) else {
        return (false, "a test did not complete".into());
    };
    if pa >= pb {
        return (
            false,
            format!(
                "the page cache held as much as before at its fullest ({pa:.0} MB \
            dirty after, {pb:.0} MB before)"
            ),
        );
    }
    if sa < KEEP_STABLE * sb {
        return (
            false,
            format!(
                "the rate to stable storage fell to {sa:.0} Mbit/s from {sb:.0} (below {:.0}%)",
                KEEP_STABLE * 100.0
            ),
        );
    }
    if let (Some(b), Some(a)) = (sync_wait(before), sync_wait(after)) {
        if a > KEEP_SYNC_WAIT * b + SYNC_WAIT_SLACK_MS {
            return (
                false,
                format!(
                    "synced writes waited longer: {a:.1} ms after, {b:.1} ms before \
                (the small probes' p99 or the closing fsync)"
                ),
            );
        }
    }
    let ms = |x: Option<f64>| x.map_or("-".into(), |v| format!("{v:.1}"));
    (
        true,
        format!(
            "the cache held {pa:.0} MB dirty at most (before {pb:.0}); stable storage {sa:.0} \
                Mbit/s (before {sb:.0}); synced writes waited {} ms at most (before {})",
            ms(sync_wait(after)),
            ms(sync_wait(before))
        ),
    )
}

/// Restores the recorded thresholds when dropped, unless disarmed: the change is undone on
/// every path out of `apply_verified` but the one that keeps it.
struct Restore<'a> {
    vm: &'a Path,
    state: &'a Path,
    armed: bool,
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = sysctl::rollback(self.vm, self.state);
        }
    }
}

impl SysctlVerified {
    /// Before and after, one line each, and whether the thresholds stay.
    pub fn text(&self) -> String {
        let row = |n: &str, s: &Summary| {
            let m = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
            let w = s.writeback.as_ref();
            format!(
                "{n:<7} dirty peak {:>7} MB   to the disk {:>7} Mbit/s   closing fsync {:>7} \
                    ms   small sync p99 {:>7} ms\n",
                m(w.map(|w| w.dirty_peak_mb)),
                m(s.stable_mbps),
                m(s.fsync_ms),
                m(s.small_sync_ms.map(|p| p.p99))
            )
        };
        let kept = if self.kept { "kept" } else { "not kept" };
        row("before", &self.before)
            + &row("after", &self.after)
            + &format!("{kept}: {}\n", self.reason)
    }
}

/// Measures, applies the two byte thresholds, measures again; rolls back unless `judge`
/// keeps them.
pub fn apply_verified(
    vm: &Path,
    state: &Path,
    background_bytes: u64,
    bytes: u64,
    v: &WritebackVerify,
) -> Result<SysctlVerified, String> {
    std::fs::create_dir_all(&v.out_dir).map_err(|e| format!("{}: {e}", v.out_dir.display()))?;
    let before = measure(v, "before")?;
    sysctl::apply(vm, state, background_bytes, bytes)?;
    let mut restore = Restore {
        vm,
        state,
        armed: true,
    };
    let after = measure(v, "after").map_err(|e| format!("{e}; rolled back"))?;
    let (kept, mut reason) = judge(&before, &after);
    if kept {
        sysctl::keep(state)?;
        restore.armed = false;
    } else {
        reason += "; rolled back";
    }
    Ok(SysctlVerified {
        before,
        after,
        kept,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::{Percentiles, WritebackStart};

    fn s(peak: f64, stable: f64, p99: f64, fsync: f64) -> Summary {
        Summary {
            writeback: Some(WritebackStart {
                dirty_peak_mb: peak,
                ..Default::default()
            }),
            stable_mbps: Some(stable),
            small_sync_ms: Some(Percentiles {
                p99,
                ..Default::default()
            }),
            fsync_ms: Some(fsync),
            ..Default::default()
        }
    }

    #[test]
    fn kept_only_when_the_cache_holds_less_and_the_disk_keeps_its_pace() {
        assert!(
            judge(
                &s(1100.0, 450.0, 900.0, 15_000.0),
                &s(34.0, 470.0, 40.0, 300.0)
            )
            .0,
            "the seed's case: 44 -> 56 MB/s"
        );
        let (kept, why) = judge(&s(268.0, 1000.0, 60.0, 120.0), &s(34.0, 650.0, 20.0, 20.0));
        assert!(!kept && why.contains("fell to 650"), "{why}");
        assert!(
            !judge(&s(34.0, 800.0, 1.0, 10.0), &s(34.0, 800.0, 1.0, 10.0)).0,
            "no less in the cache"
        );
        // Measured here: probes 1.2 -> 13 ms, but the fsync 62.7 -> 16.6 ms: the wait moved
        // from the end into the run and got shorter.
        assert!(judge(&s(141.6, 770.0, 1.2, 62.7), &s(33.6, 796.0, 13.0, 16.6)).0);
        let (kept, why) = judge(&s(300.0, 800.0, 2.0, 10.0), &s(30.0, 800.0, 30.0, 5.0));
        assert!(!kept && why.contains("waited longer"), "{why}");
    }
}
