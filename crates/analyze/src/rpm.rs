//! Responsiveness (draft-ietf-ippm-responsiveness-09): round trips per minute from the trimmed
//! means of new-connection probes and of probes on loaded connections, and the draft's test
//! algorithm: load added each interval, goodput and then responsiveness declared saturated when
//! their moving averages stop moving.

use crate::stats::trimmed_mean;
use bloatlab_result::{RpmInterval, RpmRun};

/// The draft's single-sided trim: keep the best 95%.
pub const KEEP: f64 = 0.95;
/// MAD: intervals in a moving average, and moving averages in a stability test.
pub const MAD: usize = 4;
/// SDT: stable when the standard deviation is below this fraction of the current value.
pub const SDT: f64 = 0.05;
/// ID, seconds. Draft -09 sets 5 s "pending further investigation" (-08 and every client in the
/// field use 1 s); with 5 s a stable result takes at least 50 s, so 1 s is the default.
pub const DEFAULT_INTERVAL_S: f64 = 1.0;

/// How far the result can be trusted (the draft's confidence levels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Confidence {
    /// Fewer than MAD intervals ran.
    Low,
    /// MAD intervals or more, but goodput or responsiveness never became stable.
    Medium,
    /// Both became stable.
    High,
}

impl Confidence {
    pub fn name(self) -> &'static str {
        match self {
            Confidence::Low => "low",
            Confidence::Medium => "medium",
            Confidence::High => "high",
        }
    }
}

/// The draft's stability test on a series of moving averages: the (population) standard
/// deviation of the last MAD of them is below SDT times the current (last) one.
pub fn stable(moving_averages: &[f64]) -> bool {
    if moving_averages.len() < MAD {
        return false;
    }
    let last = &moving_averages[moving_averages.len() - MAD..];
    let mean = last.iter().sum::<f64>() / MAD as f64;
    let var = last.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / MAD as f64;
    let current = last[MAD - 1];
    current > 0.0 && var.sqrt() < SDT * current
}

/// The moving average at the end of `per_interval` (the draft's "moving average aggregate
/// goodput": the bytes of the last MAD intervals over MAD times ID, i.e. the mean of equal-length
/// intervals' rates); `None` before MAD intervals.
fn moving_average(per_interval: &[f64]) -> Option<f64> {
    (per_interval.len() >= MAD)
        .then(|| per_interval[per_interval.len() - MAD..].iter().sum::<f64>() / MAD as f64)
}

/// The draft's saturation algorithm, fed one interval at a time. Load is added every interval
/// regardless (the caller's schedule); this decides when the test has its answer.
#[derive(Clone, Debug)]
pub struct Saturation {
    run: RpmRun,
    /// Per-interval goodput per direction (down, up) and their moving averages.
    goodput: [Vec<f64>; 2],
    goodput_ma: [Vec<f64>; 2],
    /// Responsiveness of each interval since goodput saturated.
    responsiveness: Vec<f64>,
}

impl Saturation {
    pub fn new(interval_s: f64) -> Saturation {
        Saturation {
            run: RpmRun {
                interval_s,
                mad: MAD as u32,
                sdt: SDT,
                ..RpmRun::default()
            },
            goodput: [Vec::new(), Vec::new()],
            goodput_ma: [Vec::new(), Vec::new()],
            responsiveness: Vec::new(),
        }
    }

    /// Ends the interval that finished at `t` (seconds into the test) with its goodput per
    /// direction (Mbit/s; `None` for a direction without load) and the responsiveness of the
    /// probes of the last MAD intervals, with the load connections per direction it had (for
    /// the record). True once goodput and then responsiveness are both saturated: the test has
    /// its answer.
    pub fn interval(
        &mut self,
        t: f64,
        down: Option<f64>,
        up: Option<f64>,
        responsiveness: Option<f64>,
        load_connections: Option<u32>,
    ) -> bool {
        let n = self.run.intervals.len() + 1;
        for (i, g) in [down, up].into_iter().enumerate() {
            if let Some(g) = g {
                self.goodput[i].push(g);
                if let Some(ma) = moving_average(&self.goodput[i]) {
                    self.goodput_ma[i].push(ma);
                }
            }
        }
        let loaded = |i: usize| [down, up][i].is_some();
        if self.run.goodput_saturated_at.is_none()
            && (0..2)
                .filter(|&i| loaded(i))
                .all(|i| stable(&self.goodput_ma[i]))
            && (loaded(0) || loaded(1))
        {
            self.run.goodput_saturated_at = Some(t);
        }
        if self.run.goodput_saturated_at.is_some() {
            if let Some(r) = responsiveness {
                self.responsiveness.push(r);
            }
            if self.run.responsiveness_saturated_at.is_none() && stable(&self.responsiveness) {
                self.run.responsiveness_saturated_at = Some(t);
            }
        }
        self.run.intervals.push(RpmInterval {
            t,
            down_mbps: down,
            up_mbps: up,
            responsiveness,
            load_connections,
        });
        debug_assert_eq!(self.run.intervals.len(), n);
        self.run.responsiveness_saturated_at.is_some()
    }

    pub fn run(&self) -> &RpmRun {
        &self.run
    }
}

/// The curve of a run: responsiveness by load connections per direction, as the load grew (the
/// last interval that ran at each count). RPM falls as connections are added to a full line;
/// clients that ramp at other speeds (`mach` adds one every second interval) compare here, at
/// equal counts, not by their headlines.
pub fn by_connections(run: &RpmRun) -> Vec<(u32, f64)> {
    let mut out: Vec<(u32, f64)> = Vec::new();
    for i in &run.intervals {
        if let (Some(n), Some(r)) = (i.load_connections, i.responsiveness) {
            match out.last_mut() {
                Some(last) if last.0 == n => last.1 = r,
                _ => out.push((n, r)),
            }
        }
    }
    out
}

/// The confidence of a run that ended after its recorded intervals.
pub fn confidence(run: &RpmRun) -> Confidence {
    if run.intervals.len() < run.mad as usize {
        Confidence::Low
    } else if run.responsiveness_saturated_at.is_some() {
        Confidence::High
    } else {
        Confidence::Medium
    }
}

/// Returns (rpm, foreign, loaded). `foreign` holds the new-connection terms, each averaged
/// (trimmed) on its own: TCP handshake, TLS handshake when there is one, and the request time,
/// so the foreign term is 60000 over their mean (three terms over TLS, two without). All in ms.
/// `loaded`: the self probes' times, or None where the transport has no self probes (HTTP/1.1):
/// then the RPM is the foreign term alone. Some but empty (every self probe failed): no RPM.
pub fn rpm(foreign: &[&[f64]], loaded: Option<&[f64]>) -> Option<(f64, f64, Option<f64>)> {
    let terms: Vec<f64> = foreign
        .iter()
        .map(|t| trimmed_mean(t, KEEP))
        .collect::<Option<_>>()?;
    if terms.is_empty() {
        return None;
    }
    let foreign = 60_000.0 / (terms.iter().sum::<f64>() / terms.len() as f64);
    let Some(loaded) = loaded else {
        return Some((foreign, foreign, None));
    };
    let loaded = 60_000.0 / trimmed_mean(loaded, KEEP)?;
    Some(((foreign + loaded) / 2.0, foreign, Some(loaded)))
}

/// The draft's bands: < 300 poor, 300..1000 fair, 1000..6000 good, above excellent.
pub fn band(rpm: f64) -> &'static str {
    match rpm {
        r if r < 300.0 => "poor",
        r if r < 1000.0 => "fair",
        r if r < 6000.0 => "good",
        _ => "excellent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stability_needs_mad_moving_averages_within_five_percent() {
        assert!(!stable(&[10.0, 10.0, 10.0]), "fewer than MAD values");
        assert!(stable(&[1.0, 10.0, 10.0, 10.0, 10.0]));
        // Population standard deviation of 9.5, 10, 10, 10.5 is 0.354 < 0.5 = 5% of 10.5.
        assert!(stable(&[9.5, 10.0, 10.0, 10.5]));
        // 9, 10, 10, 11: 0.707 > 0.55.
        assert!(!stable(&[9.0, 10.0, 10.0, 11.0]));
        assert!(
            !stable(&[0.0, 0.0, 0.0, 0.0]),
            "no goodput is not saturation"
        );
    }

    /// A ramp that levels off at interval 5: goodput is saturated once MAD moving averages (each
    /// over MAD intervals) agree within 5%; then responsiveness needs MAD values of its own.
    #[test]
    fn goodput_then_responsiveness_saturate_in_the_drafts_order() {
        let mut s = Saturation::new(1.0);
        let goodput = |k: usize| if k < 6 { 10.0 * k as f64 } else { 50.0 };
        let mut ended = None;
        for k in 1..=30 {
            // Responsiveness settles only from interval 16 on.
            let r = if k < 16 { 100.0 * k as f64 } else { 2000.0 };
            if s.interval(
                k as f64,
                Some(goodput(k)),
                Some(goodput(k) / 10.0),
                Some(r),
                None,
            ) {
                ended = Some(k);
                break;
            }
        }
        let run = s.run();
        // Moving averages from interval 4: 25, 35, 42.5, 47.5, 50, 50, 50: the four ending at
        // interval 10 (47.5, 50, 50, 50) deviate by 1.08, below 5% of 50; those ending at 9 by
        // 3.06.
        assert_eq!(run.goodput_saturated_at, Some(10.0));
        // Responsiveness values from interval 10: stable once four in a row are 2000 (16..19).
        assert_eq!(run.responsiveness_saturated_at, Some(19.0));
        assert_eq!(ended, Some(19));
        assert_eq!(confidence(run), Confidence::High);
    }

    #[test]
    fn confidence_is_low_before_mad_intervals_and_medium_without_stability() {
        let mut s = Saturation::new(1.0);
        s.interval(1.0, Some(1.0), None, None, None);
        assert_eq!(confidence(s.run()), Confidence::Low);
        for k in 2..=10 {
            // Goodput doubling every interval never settles.
            assert!(!s.interval(k as f64, Some(2f64.powi(k)), None, Some(100.0), None));
        }
        assert_eq!(confidence(s.run()), Confidence::Medium);
        assert_eq!(s.run().goodput_saturated_at, None);
    }

    #[test]
    fn one_second_of_bloat_is_60_rpm() {
        let (r, f, l) = rpm(&[&[1000.0; 20][..], &[1000.0; 20][..]], Some(&[1000.0; 20])).unwrap();
        assert_eq!((r, f, l), (60.0, 60.0, Some(60.0)));
        assert_eq!(band(r), "poor");
    }

    #[test]
    fn foreign_and_loaded_are_averaged_after_inversion() {
        // 10 ms foreign (6000), 100 ms loaded (600): RPM = 3300.
        let (r, f, l) = rpm(&[&[10.0][..], &[10.0][..]], Some(&[100.0])).unwrap();
        assert_eq!((f, l), (6000.0, Some(600.0)));
        assert_eq!(r, 3300.0);
        assert_eq!(band(r), "good");
        assert_eq!(band(7000.0), "excellent");
        assert!(rpm(&[&[][..], &[1.0][..]], Some(&[1.0])).is_none());
        // Over TLS three terms: (10 + 20 + 30) / 3 = 20 ms -> 3000 foreign.
        let (_, f, _) = rpm(&[&[10.0][..], &[20.0][..], &[30.0][..]], Some(&[100.0])).unwrap();
        assert!((f - 3000.0).abs() < 1e-9);
    }

    /// HTTP/1.1 has no self probes: the RPM is the foreign term; self probes that all failed
    /// give no RPM rather than a foreign-only one.
    #[test]
    fn without_self_probes_the_foreign_term_is_the_rpm() {
        assert_eq!(
            rpm(&[&[10.0][..], &[10.0][..]], None),
            Some((6000.0, 6000.0, None))
        );
        assert_eq!(rpm(&[&[10.0][..], &[10.0][..]], Some(&[])), None);
    }

    #[test]
    fn the_curve_keeps_the_last_interval_at_each_connection_count() {
        let iv = |n: Option<u32>, r: Option<f64>| RpmInterval {
            load_connections: n,
            responsiveness: r,
            ..RpmInterval::default()
        };
        let run = RpmRun {
            intervals: vec![
                iv(Some(1), None),
                iv(Some(2), Some(2000.0)),
                iv(Some(3), Some(1800.0)),
                // A connection that failed: the count stays, the later interval speaks for it.
                iv(Some(3), Some(1500.0)),
                iv(None, Some(900.0)),
                iv(Some(5), Some(1000.0)),
            ],
            ..RpmRun::default()
        };
        assert_eq!(
            by_connections(&run),
            [(2, 2000.0), (3, 1500.0), (5, 1000.0)]
        );
    }
}
