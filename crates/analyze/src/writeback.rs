//! The summary of a writeback test (`test writeback`): when the kernel began writing the test's
//! data to the disk, how long writes and the closing fsync took, and what else moved the
//! machine-wide counters. Pure: from the result file's series and phases.

use crate::stats;
use bloatlab_result::{ResultFile, Series, SeriesKind, Summary, WritebackStart};

/// Pages gone to the disk (or under writeback) since the first write before writeback counts
/// as started: a journal commit or a log line stays below it.
const STARTED_MB: f64 = 1.0;
/// Other writers' dirtied pages worth a word: above this, or 5% of the test's bytes.
const DISTURBED_MB: f64 = 4.0;

fn bytes_series<'a>(r: &'a ResultFile, name: &str) -> Option<&'a Series> {
    r.series
        .iter()
        .find(|s| s.kind == SeriesKind::Bytes && s.name == name)
}

/// The series' value at the last sample at or before `t` (its first value before that).
fn at(s: &Series, t: f64) -> f64 {
    s.samples
        .iter()
        .take_while(|x| x.0 <= t)
        .filter_map(|x| x.1)
        .last()
        .or_else(|| s.samples.iter().find_map(|x| x.1))
        .unwrap_or(0.0)
}

fn latency_in(r: &ResultFile, name: &str, from: f64, to: f64) -> Vec<f64> {
    r.series
        .iter()
        .filter(|s| s.kind == SeriesKind::Latency && s.name == name)
        .flat_map(|s| s.samples.iter())
        .filter(|x| x.0 >= from && x.0 < to)
        .filter_map(|x| x.1)
        .collect()
}

fn phase(r: &ResultFile, name: &str) -> Option<(f64, f64)> {
    r.metadata
        .phases
        .iter()
        .find(|p| p.name == name)
        .map(|p| (p.start, p.end))
}

/// Fills the writeback fields of `s` from a writeback test's result.
pub fn summarize(r: &ResultFile, s: &mut Summary) {
    let (Some((w0, w1)), Some(written)) = (phase(r, "write"), bytes_series(r, "test written"))
    else {
        return;
    };
    let (dirty, wb, disk, dirtied) = (
        bytes_series(r, "dirty"),
        bytes_series(r, "writeback"),
        bytes_series(r, "disk written"),
        bytes_series(r, "dirtied"),
    );
    let end = phase(r, "fsync").map_or(w1, |f| f.1);
    let bytes = (at(written, end) * 1e6).round() as u64;
    // Writeback started at the first sample of the write phase (the fsync's own writing
    // excluded) where the test's own pages were under writeback or on the disk (`cachestat`);
    // without it, where the machine's pages under writeback plus those written since the first
    // write pass a threshold.
    let disk0 = disk.map_or(0.0, |d| at(d, w0));
    let own = bytes_series(r, "file writeback").zip(bytes_series(r, "file on disk"));
    let started = written
        .samples
        .iter()
        .map(|x| x.0)
        .filter(|&t| t >= w0 && t < w1)
        .find(|&t| match own {
            Some((fw, fd)) => at(fw, t) + at(fd, t) > 0.0,
            None => {
                wb.map_or(0.0, |x| at(x, t)) + disk.map_or(0.0, |d| at(d, t) - disk0) >= STARTED_MB
            }
        });
    let peak = |x: Option<&Series>| {
        x.map_or(0.0, |x| {
            x.samples
                .iter()
                .filter(|p| p.0 >= w0 && p.0 <= end)
                .filter_map(|p| p.1)
                .fold(0.0, f64::max)
        })
    };
    let mut notes = Vec::new();
    if let Some(d) = dirty.map(|d| at(d, w0)).filter(|&d| d > DISTURBED_MB) {
        notes.push(format!(
            "{d:.0} MB were already dirty when the big write began (they count \
            toward the thresholds)"
        ));
    }
    if let Some(idle_disk) = disk
        .map(|d| at(d, w0) - at(d, 0.0))
        .filter(|&m| own.is_none() && m > STARTED_MB)
    {
        notes.push(format!(
            "{idle_disk:.1} MB went to the disk during the idle baseline: another \
            writer, which the start of writeback may be"
        ));
    }
    if let Some(d) = dirtied {
        let others = (at(d, end) - at(d, w0)) - bytes as f64 / 1e6;
        if others > DISTURBED_MB.max(0.05 * bytes as f64 / 1e6) {
            notes.push(format!(
                "other writers dirtied about {others:.0} MB during the test: Dirty, \
                Writeback and the start of writeback count them too"
            ));
        }
    }
    let idle = phase(r, "idle").map_or(Vec::new(), |(a, b)| latency_in(r, "small sync", a, b));
    s.writeback = Some(WritebackStart {
        started_after_bytes: started.map(|t| (at(written, t) * 1e6).round() as u64),
        started_after_ms: started.map(|t| (t - w0) * 1e3),
        bytes,
        dirty_peak_mb: peak(dirty),
        writeback_peak_mb: peak(wb),
        small_sync_idle_ms: stats::percentiles(idle),
        disturbed: (!notes.is_empty()).then(|| notes.join("; ")),
    });
    s.write_stall_ms = stats::percentiles(latency_in(r, "write", w0, w1 + 1.0));
    s.fsync_ms = phase(r, "fsync").map(|(a, b)| (b - a) * 1e3);
    let mbps = |secs: f64| (secs > 0.0).then(|| bytes as f64 * 8.0 / secs / 1e6);
    s.cache_mbps = mbps(w1 - w0);
    s.stable_mbps = mbps(end - w0);
    s.small_sync_ms = stats::percentiles(latency_in(r, "small sync", w0, end));
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::{Metadata, Phase};

    fn series(name: &str, kind: SeriesKind, samples: Vec<(f64, Option<f64>)>) -> Series {
        Series {
            name: name.into(),
            kind,
            direction: None,
            dscp: None,
            unit: if kind == SeriesKind::Bytes {
                "MB"
            } else {
                "ms"
            }
            .into(),
            samples,
        }
    }

    /// 1 s idle, then 100 MB written in 1 s (10 ms samples, 1 MB each), the closing fsync
    /// 2 s. The kernel starts writing at 32 MB written (dirty_background_bytes): pages under
    /// writeback appear at the sample where 33 MB have been written.
    fn run(background_mb: Option<f64>) -> ResultFile {
        let phases = vec![
            Phase {
                name: "idle".into(),
                start: 0.0,
                end: 1.0,
            },
            Phase {
                name: "write".into(),
                start: 1.0,
                end: 2.0,
            },
            Phase {
                name: "fsync".into(),
                start: 2.0,
                end: 4.0,
            },
        ];
        let mut r = ResultFile::new(Metadata {
            test: "writeback".into(),
            phases,
            ..Default::default()
        });
        let t = |i: usize| i as f64 * 0.01;
        let n = 401;
        let written: Vec<_> = (0..n)
            .map(|i| {
                (
                    t(i),
                    Some(((t(i) - 1.0).max(0.0) * 100.0).min(100.0).round()),
                )
            })
            .collect();
        let wb: Vec<_> = written
            .iter()
            .map(|&(tt, w)| {
                (
                    tt,
                    Some(match background_mb {
                        Some(b) if w.unwrap() > b && tt < 4.0 => 2.0,
                        _ if (2.0..4.0).contains(&tt) => 5.0,
                        _ => 0.0,
                    }),
                )
            })
            .collect();
        r.series
            .push(series("test written", SeriesKind::Bytes, written.clone()));
        r.series.push(series("writeback", SeriesKind::Bytes, wb));
        r.series.push(series(
            "dirty",
            SeriesKind::Bytes,
            written
                .iter()
                .map(|&(tt, w)| (tt, Some(if tt < 4.0 { w.unwrap() } else { 0.0 })))
                .collect(),
        ));
        r.series
            .push(series("dirtied", SeriesKind::Bytes, written.clone()));
        r.series.push(series(
            "disk written",
            SeriesKind::Bytes,
            (0..n).map(|i| (t(i), Some(0.0))).collect(),
        ));
        r.series.push(series(
            "write",
            SeriesKind::Latency,
            (0..100)
                .map(|i| {
                    (
                        1.0 + i as f64 * 0.01,
                        Some(if i == 50 { 40.0 } else { 1.0 }),
                    )
                })
                .collect(),
        ));
        r.series.push(series(
            "small sync",
            SeriesKind::Latency,
            (0..40)
                .map(|i| (i as f64 * 0.1, Some(if i < 10 { 2.0 } else { 300.0 })))
                .collect(),
        ));
        r
    }

    #[test]
    fn writeback_starts_where_the_background_threshold_is_crossed() {
        let mut s = Summary::default();
        summarize(&run(Some(32.0)), &mut s);
        let w = s.writeback.clone().unwrap();
        assert_eq!(
            (w.started_after_bytes, w.bytes),
            (Some(33_000_000), 100_000_000)
        );
        assert!((w.started_after_ms.unwrap() - 330.0).abs() < 1e-6);
        assert_eq!(w.disturbed, None);
        assert_eq!(s.fsync_ms, Some(2000.0));
        assert_eq!(s.cache_mbps, Some(800.0));
        assert!((s.stable_mbps.unwrap() - 800.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.write_stall_ms.unwrap().max, 40.0);
        assert_eq!(s.small_sync_ms.unwrap().p50, 300.0);
        assert_eq!(w.small_sync_idle_ms.unwrap().p50, 2.0);
        assert_eq!(w.dirty_peak_mb, 100.0);
    }

    #[test]
    fn nothing_before_the_fsync_is_null_and_other_writers_are_named() {
        let mut r = run(None);
        let mut s = Summary::default();
        summarize(&r, &mut s);
        let w = s.writeback.clone().unwrap();
        assert_eq!(
            (w.started_after_bytes, w.started_after_ms),
            (None, None),
            "only the fsync wrote"
        );
        // Another process dirtied 50 MB more than the test wrote.
        let d = r.series.iter_mut().find(|x| x.name == "dirtied").unwrap();
        for x in d.samples.iter_mut().filter(|x| x.0 >= 2.0) {
            x.1 = Some(150.0);
        }
        summarize(&r, &mut s);
        assert!(s
            .writeback
            .unwrap()
            .disturbed
            .unwrap()
            .contains("other writers dirtied about 50 MB"));
    }

    /// With the file's own pages (cachestat) another writer's writeback does not count: only
    /// the test's pages leaving the dirty state start it.
    #[test]
    fn the_files_own_pages_decide_when_they_are_known() {
        let mut r = run(Some(32.0));
        let zeros: Vec<_> = r.series[0]
            .samples
            .iter()
            .map(|&(t, _)| (t, Some(0.0)))
            .collect();
        let on_disk: Vec<_> = r.series[0]
            .samples
            .iter()
            .map(|&(t, w)| (t, Some(if w.unwrap() >= 50.0 { 1.0 } else { 0.0 })))
            .collect();
        r.series
            .push(series("file writeback", SeriesKind::Bytes, zeros));
        r.series
            .push(series("file on disk", SeriesKind::Bytes, on_disk));
        let mut s = Summary::default();
        summarize(&r, &mut s);
        assert_eq!(
            s.writeback.unwrap().started_after_bytes,
            Some(50_000_000),
            "the machine's writeback at 33 MB was someone else's"
        );
    }
}
