//! Chart data from a result file: time series binned for display, latency CDFs, box-plot
//! statistics per phase. Pure functions of the file.

use bloatlab_analyze::stats::quantile_sorted;
use bloatlab_result::autorate::LogLine;
use bloatlab_result::{Phase, ResultFile, SeriesKind, Summary};
use serde::Serialize;

/// Most points a time-series line gets on screen; raw samples are averaged into bins.
pub const MAX_POINTS: usize = 600;
/// Throughput is shown over bins of at least this long (s), flent's step: over tens of ms a
/// TCP receiver's goodput is its in-order delivery, which stalls behind a lost segment and
/// then hands over a whole window at once (10 ms samples reading 550 Mbit/s on a 60 Mbit/s
/// line). The result file keeps every sample.
pub const THROUGHPUT_BIN_S: f64 = 0.2;

#[derive(Clone, Debug, Serialize)]
pub struct Line {
    pub name: String,
    /// (seconds, value); None where nothing was measured (lost probe, gap).
    pub points: Vec<(f64, Option<f64>)>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BoxStats {
    pub label: String,
    /// min, first quartile, median, third quartile, max (ms).
    pub five: [f64; 5],
    pub samples: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct RunView {
    pub label: String,
    pub test: String,
    pub phases: Vec<Phase>,
    pub throughput: Vec<Line>,
    pub latency: Vec<Line>,
    /// Round trips of the load phase (all probe streams), sorted, as (ms, fraction <= it).
    pub cdf: Vec<(f64, f64)>,
    pub boxes: Vec<BoxStats>,
    /// UDP load tests: Mbit/s per profile bucket where the packets left and where they arrived,
    /// over one second of the load at full resolution (bursts disappear in any averaging).
    pub burst: Vec<Line>,
    /// Writeback tests: the page cache's dirty and writeback megabytes and the test's own
    /// progress over time.
    pub memory: Vec<Line>,
    /// RPM tests: responsiveness (y) by load connections per direction (x) as the ramp added
    /// them, per direction run.
    pub rpm_curve: Vec<Line>,
    /// Runs with autorate: the shaper's rate each way over the line's capacity and what the
    /// line carried (Mbit/s), from [`shaper_lines`].
    pub shaper: Vec<Line>,
    pub summary: Summary,
    pub metadata: serde_json::Value,
    pub partial: bool,
}

/// Averages samples into bins of `width` seconds (bin centre as x). Lost samples count as
/// missing, not zero.
pub fn bin(samples: &[(f64, Option<f64>)], width: f64) -> Vec<(f64, Option<f64>)> {
    if samples.is_empty() || width <= 0.0 {
        return samples.to_vec();
    }
    let mut out: Vec<(f64, Option<f64>)> = Vec::new();
    let (mut cur, mut sum, mut n, mut any) = (None::<i64>, 0.0, 0usize, false);
    let flush = |b: i64, sum: f64, n: usize, any: bool, out: &mut Vec<(f64, Option<f64>)>| {
        out.push((
            (b as f64 + 0.5) * width,
            (any && n > 0).then(|| sum / n as f64),
        ));
    };
    for &(t, v) in samples {
        let b = (t / width).floor() as i64;
        if cur != Some(b) {
            if let Some(c) = cur {
                flush(c, sum, n, any, &mut out);
            }
            (cur, sum, n, any) = (Some(b), 0.0, 0, false);
        }
        if let Some(v) = v {
            sum += v;
            n += 1;
            any = true;
        }
    }
    if let Some(c) = cur {
        flush(c, sum, n, any, &mut out);
    }
    out
}

/// Each flow's goodput in bins of `width` s, after a total per direction summed bin by bin
/// (flows that open later, as an RPM test's do, join the total where they start).
fn throughput_lines(r: &ResultFile, width: f64) -> Vec<Line> {
    let mut lines = Vec::new();
    // Per direction: bin index -> summed Mbit/s.
    let mut totals: [std::collections::BTreeMap<i64, f64>; 2] = Default::default();
    for s in r.series.iter().filter(|s| s.kind == SeriesKind::Throughput) {
        let points = bin(&s.samples, width);
        let total = &mut totals[(s.direction.as_deref() == Some("up")) as usize];
        for &(t, v) in &points {
            *total.entry((t / width).floor() as i64).or_insert(0.0) += v.unwrap_or(0.0);
        }
        lines.push(Line {
            name: s.name.clone(),
            points,
        });
    }
    for (i, name) in ["total down", "total up"].iter().enumerate() {
        if !totals[i].is_empty() {
            let points = totals[i]
                .iter()
                .map(|(&b, &v)| ((b as f64 + 0.5) * width, Some(v)))
                .collect();
            lines.insert(
                0,
                Line {
                    name: name.to_string(),
                    points,
                },
            );
        }
    }
    lines
}

fn values_in(samples: &[(f64, Option<f64>)], start: f64, end: f64) -> Vec<f64> {
    samples
        .iter()
        .filter(|(t, _)| *t >= start && *t < end)
        .filter_map(|(_, v)| *v)
        .collect()
}

pub fn five_numbers(mut v: Vec<f64>) -> Option<[f64; 5]> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some([
        v[0],
        quantile_sorted(&v, 0.25),
        quantile_sorted(&v, 0.5),
        quantile_sorted(&v, 0.75),
        v[v.len() - 1],
    ])
}

impl RunView {
    /// The test's start, Unix seconds (its metadata's RFC 3339 time).
    pub fn start_unix(&self) -> Option<f64> {
        let t = humantime::parse_rfc3339(self.metadata["start_time"].as_str()?).ok()?;
        Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
    }

    pub fn new(r: &ResultFile, label: &str) -> RunView {
        let end = r.metadata.phases.iter().map(|p| p.end).fold(0.0, f64::max);
        let width = (end / MAX_POINTS as f64).max(r.metadata.step);
        let throughput = throughput_lines(r, width.max(THROUGHPUT_BIN_S));
        let rtt: Vec<_> = r
            .series
            .iter()
            .filter(|s| s.kind == SeriesKind::Latency)
            .collect();
        let latency = rtt
            .iter()
            .map(|s| Line {
                name: s.name.clone(),
                points: bin(&s.samples, width),
            })
            .collect();
        let load = r.metadata.phases.iter().find(|p| p.name == "load");
        let mut cdf_values: Vec<f64> = Vec::new();
        let mut boxes = Vec::new();
        for s in rtt.iter().filter(|s| s.name.starts_with("rtt ")) {
            if let Some(p) = load {
                cdf_values.extend(values_in(&s.samples, p.start, p.end));
            }
            // Settling after the load only serves the clock estimate: no box of its own.
            for p in r.metadata.phases.iter().filter(|p| p.name != "settle") {
                let values = values_in(&s.samples, p.start, p.end);
                let samples = values.len();
                if let Some(five) = five_numbers(values) {
                    boxes.push(BoxStats {
                        label: format!("{} {}", s.name.trim_start_matches("rtt "), p.name),
                        five,
                        samples,
                    });
                }
            }
        }
        if cdf_values.is_empty() {
            // No load phase (ping, plain voip): the CDF of the whole run.
            cdf_values = rtt
                .iter()
                .filter(|s| s.name.starts_with("rtt "))
                .flat_map(|s| s.samples.iter().filter_map(|x| x.1))
                .collect();
        }
        cdf_values.sort_by(f64::total_cmp);
        let n = cdf_values.len();
        // At most ~MAX_POINTS steps: enough for the eye, small enough for the page.
        let stride = (n / MAX_POINTS).max(1);
        let mut cdf: Vec<(f64, f64)> = cdf_values
            .iter()
            .enumerate()
            .step_by(stride)
            .map(|(i, v)| (*v, (i + 1) as f64 / n as f64))
            .collect();
        if let (Some(last), Some(&max)) = (cdf.last(), cdf_values.last()) {
            if last.1 < 1.0 {
                cdf.push((max, 1.0));
            }
        }
        RunView {
            label: label.to_string(),
            test: r.metadata.test.clone(),
            phases: r.metadata.phases.clone(),
            throughput,
            latency,
            cdf,
            boxes,
            burst: burst_lines(r),
            rpm_curve: rpm_curve(r),
            shaper: Vec::new(),
            memory: r
                .series
                .iter()
                .filter(|s| s.kind == SeriesKind::Bytes)
                .map(|s| Line {
                    name: s.name.clone(),
                    points: bin(&s.samples, width),
                })
                .collect(),
            summary: bloatlab_analyze::summary_of(r),
            metadata: serde_json::to_value(&r.metadata).unwrap_or_default(),
            partial: r.partial,
        }
    }
}

/// A moving line's chart: the shaper's rate each way as autorate set it (each change a step),
/// the line's capacity (`capacity`: (s, down, up bit/s) over the test's seconds) and what the
/// line carried (autorate's once-a-second reading), in Mbit/s over seconds from the test's
/// start; `log_offset` is when autorate's log began on that clock (s). Only `0..=end` is kept.
pub fn shaper_lines(
    log: &[LogLine],
    log_offset: f64,
    capacity: &[(f64, f64, f64)],
    end: f64,
) -> Vec<Line> {
    let within = |t: f64| (0.0..=end).contains(&t);
    let mbit = |bps: f64| Some(bps / 1e6);
    let from_log = |pick: fn(&LogLine) -> f64, ticks_only: bool| -> Vec<(f64, Option<f64>)> {
        let mut points = Vec::new();
        let mut last: Option<f64> = None;
        for l in log.iter().filter(|l| !ticks_only || l.event == "tick") {
            let t = l.t + log_offset;
            // A step: the old value up to the change, the new one from it.
            if let (false, Some(v)) = (ticks_only, last) {
                if within(t) && v != pick(l) {
                    points.push((t, mbit(v)));
                }
            }
            if within(t) {
                points.push((t, mbit(pick(l))));
            }
            last = Some(pick(l));
        }
        points
    };
    let cap = |down: bool| -> Vec<(f64, Option<f64>)> {
        capacity
            .iter()
            .filter(|c| within(c.0))
            .map(|&(t, d, u)| (t, mbit(if down { d } else { u })))
            .collect()
    };
    let line = |name: &str, points| Line {
        name: name.into(),
        points,
    };
    vec![
        line("capacity down", cap(true)),
        line("shaper down", from_log(|l| l.down_bps, false)),
        line("carried down", from_log(|l| l.down_load_bps, true)),
        line("capacity up", cap(false)),
        line("shaper up", from_log(|l| l.up_bps, false)),
        line("carried up", from_log(|l| l.up_load_bps, true)),
    ]
}

fn rpm_curve(r: &ResultFile) -> Vec<Line> {
    let runs = match &r.metadata.rpm_by_direction {
        Some(d) => vec![("download", &d.down), ("upload", &d.up)],
        None => r
            .metadata
            .rpm
            .iter()
            .map(|run| ("both ways", run))
            .collect(),
    };
    runs.into_iter()
        .map(|(name, run)| Line {
            name: name.into(),
            points: bloatlab_analyze::rpm::by_connections(run)
                .into_iter()
                .map(|(n, rpm)| (f64::from(n), Some(rpm)))
                .collect(),
        })
        .filter(|l| l.points.len() > 1)
        .collect()
}

/// Seconds of a UDP load's profile shown at bucket resolution, from one second into the load
/// (past the start-up).
const BURST_WINDOW: (f64, f64) = (1.0, 2.0);

fn burst_lines(r: &ResultFile) -> Vec<Line> {
    let Some(u) = &r.metadata.udp else {
        return Vec::new();
    };
    let Some(send_start) = u.send_start else {
        return Vec::new();
    };
    let bucket = u.bucket_ms / 1e3;
    let (from, to) = (send_start + BURST_WINDOW.0, send_start + BURST_WINDOW.1);
    let line = |name: &str, start: f64, bytes: &[u32]| Line {
        name: name.into(),
        points: bytes
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                (
                    start + i as f64 * bucket,
                    Some(f64::from(b) * 8.0 / bucket / 1e6),
                )
            })
            .filter(|(t, _)| (from..to).contains(t))
            .collect(),
    };
    let mut lines = vec![line("sent", send_start, &u.send_bytes)];
    if let Some((start, bytes)) = u
        .server
        .as_ref()
        .and_then(|s| Some((s.recv_start?, &s.recv_bytes)))
    {
        lines.push(line("received", start, bytes));
    }
    lines
}

/// A short label for a result file: its name without directories and extensions.
pub fn label_for(path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    name.trim_end_matches(".gz")
        .trim_end_matches(".json")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_line(t: f64, event: &str, down_bps: f64, down_load_bps: f64) -> LogLine {
        LogLine {
            t,
            event: event.into(),
            down_bps,
            up_bps: 1e6,
            down_load_bps,
            up_load_bps: 0.5e6,
            ..LogLine::default()
        }
    }

    #[test]
    fn the_shaper_chart_steps_at_each_change_on_the_tests_clock() {
        // autorate began 1.5 s before the test: its t = 2.0 is the test's 0.5.
        let log = [
            log_line(1.0, "tick", 20e6, 0.0),
            log_line(2.0, "tick", 20e6, 18e6),
            log_line(3.5, "rate", 8e6, 18e6),
            log_line(4.0, "tick", 8e6, 7e6),
            log_line(30.0, "tick", 8e6, 7e6),
        ];
        let capacity = [(0.5, 20e6, 2e6), (1.5, 10e6, 2e6), (2.5, 10e6, 2e6)];
        let lines = shaper_lines(&log, -1.5, &capacity, 10.0);
        let named = |n: &str| &lines.iter().find(|l| l.name == n).unwrap().points;
        assert_eq!(
            named("capacity down"),
            &vec![(0.5, Some(20.0)), (1.5, Some(10.0)), (2.5, Some(10.0))]
        );
        // The change at the test's 2.0: 20 up to it, 8 from it; the line before the test and
        // the one after its end are left out.
        assert_eq!(
            named("shaper down"),
            &vec![
                (0.5, Some(20.0)),
                (2.0, Some(20.0)),
                (2.0, Some(8.0)),
                (2.5, Some(8.0))
            ]
        );
        assert_eq!(
            named("carried down"),
            &vec![(0.5, Some(18.0)), (2.5, Some(7.0))]
        );
        assert_eq!(named("shaper up")[0], (0.5, Some(1.0)));
    }

    #[test]
    fn binning_averages_and_keeps_gaps() {
        let s = vec![
            (0.0, Some(1.0)),
            (0.05, Some(3.0)),
            (0.1, None),
            (0.15, None),
            (0.2, Some(5.0)),
        ];
        let b = bin(&s, 0.1);
        assert_eq!(
            b,
            vec![
                (0.05, Some(2.0)),
                (0.15000000000000002, None),
                (0.25, Some(5.0))
            ]
        );
    }

    #[test]
    fn a_udp_load_shows_one_second_of_its_profile_at_bucket_resolution() {
        let mut r = ResultFile::new(bloatlab_result::Metadata {
            test: "udp".into(),
            ..Default::default()
        });
        let u = bloatlab_result::UdpLoadInfo {
            bucket_ms: 1.0,
            send_start: Some(5.0),
            send_bytes: vec![125; 3000],
            server: Some(bloatlab_result::UdpLoadServer {
                recv_start: Some(5.01),
                recv_bytes: vec![125; 3000],
                ..Default::default()
            }),
            ..Default::default()
        };
        r.metadata.udp = Some(u);
        let lines = burst_lines(&r);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].points.len(), 1000, "6..7 s at 1 ms");
        assert_eq!(
            lines[0].points[0],
            (6.0, Some(1.0)),
            "125 bytes a millisecond is 1 Mbit/s"
        );
        assert!(
            (lines[1].points[0].0 - 6.0).abs() < 1e-9,
            "the server's buckets on the client's clock"
        );
    }

    #[test]
    fn a_flow_opening_later_joins_the_total_where_it_starts() {
        let mut r = ResultFile::new(bloatlab_result::Metadata {
            test: "rpm".into(),
            ..Default::default()
        });
        let flow = |name: &str, from: f64, mbps: f64| bloatlab_result::Series {
            name: name.into(),
            kind: SeriesKind::Throughput,
            direction: Some("down".into()),
            dscp: None,
            unit: "Mbit/s".into(),
            samples: (0..100)
                .map(|i| (from + 0.01 * (i + 1) as f64, Some(mbps)))
                .collect(),
        };
        // 10 Mbit/s over 0..1 s; 30 Mbit/s over 0.6..1.6 s.
        r.series = vec![flow("tcp down 1", 0.0, 10.0), flow("tcp down 2", 0.6, 30.0)];
        let lines = throughput_lines(&r, 0.2);
        assert_eq!(lines[0].name, "total down");
        let at = |t: f64| {
            lines[0]
                .points
                .iter()
                .find(|p| (p.0 - t).abs() < 1e-9)
                .and_then(|p| p.1)
        };
        assert_eq!(at(0.1), Some(10.0), "the first flow alone");
        assert_eq!(at(0.9), Some(40.0), "both");
        assert_eq!(
            at(1.3),
            Some(30.0),
            "the second alone, where it ran (not shifted to the first's bins)"
        );
        assert!(
            (lines[2].points[0].0 - 0.7).abs() < 1e-9,
            "its own line starts at its first bin: {:?}",
            lines[2].points[0]
        );
    }

    #[test]
    fn five_numbers_of_one_to_five() {
        assert_eq!(
            five_numbers(vec![5.0, 1.0, 3.0, 2.0, 4.0]),
            Some([1.0, 2.0, 3.0, 4.0, 5.0])
        );
        assert_eq!(five_numbers(vec![]), None);
    }
}
