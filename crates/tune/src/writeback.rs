//! Advice from a writeback test (`bloatlab advise WRITEBACK-RESULT`): the two dirty thresholds
//! from the rate that feeds the disk times how long its data may wait, with the arithmetic,
//! against what the machine's settings did in the test; and what an NFS `sync` export costs at
//! that rate. Pure.

use crate::config::writeback_bytes;
use bloatlab_result::ResultFile;
use serde::Serialize;

/// How long the feeding link's data may sit dirty before writeback starts, and before writers
/// are throttled: 0.25 s and 1.5 s (on gigabit, 32 MiB and 192 MiB).
pub const BACKGROUND_NS: u64 = 250_000_000;
pub const THROTTLE_NS: u64 = 1_500_000_000;

/// Where the feeding rate came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Feed {
    pub bps: u64,
    pub from: String,
}

/// An NFS export's share of the link with `sync`: each block of `block_bytes` waits for the
/// disk's sync (`sync_s`) after `block_bytes / rate` on the wire: 1 / (1 + rate x sync / block).
/// For a spinning disk the sync is half a rotation, 30 / RPM seconds, which gives the usual
/// 1 / (1 + 30 B_w / (S_b RPM)).
pub fn sync_efficiency(rate_bytes_per_s: f64, block_bytes: f64, sync_s: f64) -> f64 {
    1.0 / (1.0 + rate_bytes_per_s * sync_s / block_bytes)
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Nfs {
    pub block_bytes: u64,
    pub rpm: Option<u32>,
    /// With the sync time of half a rotation at `rpm`.
    pub efficiency_rpm: Option<f64>,
    /// With the sync time this disk showed (the idle small write + fsync p50).
    pub measured_sync_ms: Option<f64>,
    pub efficiency_measured: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WritebackAdvice {
    pub feed: Feed,
    pub dirty_background_bytes: u64,
    pub dirty_bytes: u64,
    pub nfs: Nfs,
    /// The advice in words, each number with its arithmetic.
    pub text: String,
}

/// The machine's threshold as the test recorded it: bytes, or a ratio of `mem_kb`.
fn setting(bytes: Option<u64>, ratio: Option<u64>, mem_kb: Option<u64>) -> String {
    match (bytes, ratio) {
        (Some(b), _) if b > 0 => format!("{b} B ({:.0} MB)", b as f64 / 1e6),
        (_, Some(r)) => match mem_kb {
            Some(m) => format!(
                "{r}% of available memory (at most {:.0} MB of {:.0} MB)",
                r as f64 / 100.0 * m as f64 * 1024.0 / 1e6,
                m as f64 * 1024.0 / 1e6
            ),
            None => format!("{r}% of available memory"),
        },
        _ => "unknown".into(),
    }
}

/// `feed`: the rate that brings the data (given, or a network test's goodput); without it the
/// test's own `--rate`, else the disk's rate to stable storage as the test measured it.
pub fn advise(
    r: &ResultFile,
    feed: Option<Feed>,
    block_bytes: u64,
    rpm: Option<u32>,
) -> Result<WritebackAdvice, String> {
    let s = r
        .summary
        .as_ref()
        .ok_or("the writeback result has no summary")?;
    let w = s
        .writeback
        .as_ref()
        .ok_or("not a writeback result (bloatlab test writeback DIR)")?;
    let machine = r.metadata.writeback_machine();
    let feed = feed
        .or_else(|| {
            machine.rate_bps.map(|bps| Feed {
                bps,
                from: "the rate the test \
            wrote at (--rate)"
                    .into(),
            })
        })
        .or_else(|| {
            s.stable_mbps.map(|m| Feed {
                bps: (m * 1e6) as u64,
                from: "the disk's own rate \
            to stable storage in the test (no network rate given: --rate or a network \
            result)"
                    .into(),
            })
        })
        .ok_or("no rate to size the thresholds from: give --rate (the link that feeds the disk)")?;
    let (bg, fg) = (
        writeback_bytes(feed.bps, BACKGROUND_NS),
        writeback_bytes(feed.bps, THROTTLE_NS),
    );
    let bytes_per_s = feed.bps as f64 / 8.0;
    let mut t = String::new();
    t += &format!(
        "The data arrives at {} bit/s ({:.0} B/s): {}.\n",
        feed.bps, bytes_per_s, feed.from
    );
    let (vm, mem) = (&machine.vm, machine.mem_total_kb);
    t += &format!(
        "This machine's thresholds: writeback starts at {}, writers wait beyond {}.\n",
        setting(vm.dirty_background_bytes, vm.dirty_background_ratio, mem),
        setting(vm.dirty_bytes, vm.dirty_ratio, mem)
    );
    let mb = w.bytes as f64 / 1e6;
    match (w.started_after_bytes, w.started_after_ms) {
        (Some(b), Some(ms)) => {
            t += &format!(
                "In the test writeback began after {:.1} of {mb:.1} \
            MB, {ms:.0} ms after the first write",
                b as f64 / 1e6
            )
        }
        _ => {
            t += &format!(
                "In the test none of the {mb:.1} MB reached the disk before the closing \
            fsync"
            )
        }
    }
    t += &format!(
        "; the cache took {} Mbit/s, the disk {} Mbit/s; the fsync took {} ms; a small synced \
            write waited p99 {} ms (idle {} ms).\n",
        s.cache_mbps.map_or("?".into(), |m| format!("{m:.0}")),
        s.stable_mbps.map_or("?".into(), |m| format!("{m:.0}")),
        s.fsync_ms.map_or("?".into(), |m| format!("{m:.0}")),
        s.small_sync_ms
            .map_or("?".into(), |p| format!("{:.1}", p.p99)),
        w.small_sync_idle_ms
            .map_or("?".into(), |p| format!("{:.1}", p.p99)),
    );
    t += &format!(
        "Size the thresholds by the feeding rate times how long its data may wait:\n  \
            vm.dirty_background_bytes = {:.0} B/s x {} s = {bg}\n  vm.dirty_bytes            = \
            {:.0} B/s x {} s = {fg}\n",
        bytes_per_s,
        BACKGROUND_NS as f64 / 1e9,
        bytes_per_s,
        THROTTLE_NS as f64 / 1e9
    );
    t += "(Writing a *_bytes value sets its *_ratio twin to 0; `bloatlab config sysctl-writeback` \
        writes the file, `bloatlab tune apply --sysctl` applies, re-measures and keeps or rolls \
        back.)\n";
    let sync_ms = w.small_sync_idle_ms.map(|p| p.p50);
    let nfs = Nfs {
        block_bytes,
        rpm,
        efficiency_rpm: rpm
            .map(|r| sync_efficiency(bytes_per_s, block_bytes as f64, 30.0 / f64::from(r))),
        measured_sync_ms: sync_ms,
        efficiency_measured: sync_ms
            .map(|ms| sync_efficiency(bytes_per_s, block_bytes as f64, ms / 1e3)),
    };
    t += &format!(
        "NFS: an export with `sync` answers each {block_bytes}-byte block only once it \
        is on the disk, so the link idles while the disk syncs:\n"
    );
    if let (Some(r), Some(e)) = (rpm, nfs.efficiency_rpm) {
        t += &format!(
            "  at {r} RPM (half a rotation, 30/RPM = {:.2} ms): 1 / (1 + 30 x \
            {bytes_per_s:.0} / ({block_bytes} x {r})) = {e:.2} of the link\n",
            30e3 / f64::from(r)
        );
    }
    if let (Some(ms), Some(e)) = (sync_ms, nfs.efficiency_measured) {
        t += &format!(
            "  with this disk's measured sync ({ms:.2} ms, the idle small write + fsync \
            p50): 1 / (1 + {bytes_per_s:.0} x {:.5} / {block_bytes}) = {e:.2} of the \
            link\n",
            ms / 1e3
        );
    }
    t += &format!(
        "  `async` gets the whole link but a crash loses what is still dirty: up to \
        vm.dirty_bytes = {fg} B with the thresholds above.\n"
    );
    Ok(WritebackAdvice {
        feed,
        dirty_background_bytes: bg,
        dirty_bytes: fg,
        nfs,
        text: t,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::{Metadata, Percentiles, Summary, WritebackStart};

    /// The seed's numbers: gigabit is 1024^3 / 8 B/s; 0.25 s and 1.5 s of it are 33554432 and
    /// 201326592 bytes. NFS at 1 Mbit/s with 8 kB blocks on a 5600 RPM disk: 0.92.
    #[test]
    fn gigabit_gives_the_seeds_thresholds_and_the_efficiency_follows_the_formula() {
        let mut r = ResultFile::new(Metadata {
            test: "writeback".into(),
            params: serde_json::json!({
                "vm": {
                    "dirty_background_ratio": 10, "dirty_ratio": 20,
                    "dirty_background_bytes": 0, "dirty_bytes": 0
                },
                "mem_total_kb": 33_554_432,
            }),
            ..Default::default()
        });
        let idle = Percentiles {
            p50: 5.0,
            p99: 8.0,
            ..Default::default()
        };
        r.summary = Some(Summary {
            writeback: Some(WritebackStart {
                bytes: 1 << 30,
                small_sync_idle_ms: Some(idle),
                ..Default::default()
            }),
            stable_mbps: Some(352.0),
            cache_mbps: Some(8000.0),
            fsync_ms: Some(15_000.0),
            ..Default::default()
        });
        let gige = Feed {
            bps: 1 << 30,
            from: "given".into(),
        };
        let a = advise(&r, Some(gige), 1 << 20, Some(5600)).unwrap();
        assert_eq!(
            (a.dirty_background_bytes, a.dirty_bytes),
            (33_554_432, 201_326_592)
        );
        assert!(
            a.text
                .contains("vm.dirty_background_bytes = 134217728 B/s x 0.25 s = 33554432"),
            "{}",
            a.text
        );
        assert!(
            a.text
                .contains("10% of available memory (at most 3436 MB of 34360 MB)"),
            "{}",
            a.text
        );
        assert!(
            a.text
                .contains("none of the 1073.7 MB reached the disk before the closing fsync"),
            "{}",
            a.text
        );
        // 1 / (1 + 30 x 134217728 / (1048576 x 5600)) = 1 / 1.6857
        assert!(
            (a.nfs.efficiency_rpm.unwrap() - 0.5932).abs() < 1e-3,
            "{:?}",
            a.nfs
        );
        // 5 ms measured: 1 / (1 + 134217728 x 0.005 / 1048576) = 1 / 1.64
        assert!((a.nfs.efficiency_measured.unwrap() - 1.0 / 1.64).abs() < 1e-3);
        let slow = sync_efficiency(1_000_000.0 / 8.0, 8192.0, 30.0 / 5600.0);
        assert!((slow - 0.92).abs() < 0.01, "{slow}");
        // No rate anywhere: the disk's own.
        let own = advise(&r, None, 1 << 20, None).unwrap();
        assert_eq!(own.feed.bps, 352_000_000);
        assert!(advise(&ResultFile::new(Metadata::default()), None, 1, None).is_err());
    }
}
