//! Link rates: fixed, a mahimahi packet-delivery trace, or a schedule of rates over time.

use crate::values::{parse_rate, ConfigError};
use crate::MS;
#[cfg(test)]
const S: u64 = 1_000_000_000;

/// A mahimahi delivery opportunity carries this many bytes (its `PACKET_SIZE`: a 1500-byte
/// packet plus the 4 bytes of its TUN framing).
pub const TRACE_OPPORTUNITY_BYTES: usize = 1504;

#[derive(Clone, Debug, PartialEq)]
pub enum Rate {
    /// No serialisation delay at all.
    Unlimited,
    BitsPerSecond(u64),
    /// mahimahi: one millisecond timestamp per line, each an opportunity to send 1504 bytes;
    /// loops after the last timestamp.
    Trace {
        opportunities_ms: Vec<u64>,
        period_ms: u64,
    },
    /// `SECONDS RATE` per line: from that time on, that rate; the last one holds, or with a
    /// `repeat SECONDS` line the whole schedule starts again after that long.
    Schedule {
        steps: Vec<(u64, u64)>,
        period_ns: Option<u64>,
    },
}

impl Rate {
    pub fn parse_trace(text: &str) -> Result<Rate, ConfigError> {
        let mut ops = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let t: u64 = line.parse().map_err(|_| {
                ConfigError::Value(format!(
                    "trace line {}: `{line}` is not a millisecond count",
                    n + 1
                ))
            })?;
            if ops.last().is_some_and(|&last| t < last) {
                return Err(ConfigError::Value(format!(
                    "trace line {}: timestamps must not decrease",
                    n + 1
                )));
            }
            ops.push(t);
        }
        match ops.last() {
            Some(&period_ms) if period_ms > 0 => Ok(Rate::Trace {
                opportunities_ms: ops,
                period_ms,
            }),
            _ => Err(ConfigError::Value(
                "trace needs at least one line and a last timestamp above 0".into(),
            )),
        }
    }

    pub fn parse_schedule(text: &str) -> Result<Rate, ConfigError> {
        let (steps, period_ns) = parse_steps(text, "RATE", parse_rate)?;
        Ok(Rate::Schedule { steps, period_ns })
    }

    /// The rate at `since_ns` into a schedule.
    fn scheduled(steps: &[(u64, u64)], period_ns: Option<u64>, since_ns: u64) -> u64 {
        step_at(steps, period_ns, since_ns)
    }

    /// The mean rate from `from_ns` to `to_ns` after the trace or schedule began (what a
    /// test in that window could carry at most); None when unlimited.
    pub fn mean_between(&self, from_ns: u64, to_ns: u64) -> Option<u64> {
        let span = to_ns.saturating_sub(from_ns).max(1);
        match self {
            Rate::Unlimited => None,
            Rate::BitsPerSecond(b) => Some(*b),
            Rate::Schedule { steps, period_ns } => {
                // 1 ms steps: schedules change on whole milliseconds at most.
                let n = (span / MS).max(1);
                let sum: u128 = (0..n)
                    .map(|i| Rate::scheduled(steps, *period_ns, from_ns + i * MS) as u128)
                    .sum();
                Some((sum / n as u128) as u64)
            }
            Rate::Trace {
                opportunities_ms,
                period_ms,
            } => {
                let (from_ms, to_ms) = (from_ns / MS, to_ns / MS);
                let count = |until_ms: u64| -> u64 {
                    let n = opportunities_ms.len() as u64;
                    let laps = until_ms / period_ms;
                    let rest = until_ms % period_ms;
                    laps * n + opportunities_ms.iter().filter(|&&t| t <= rest).count() as u64
                };
                let ops = count(to_ms) - count(from_ms);
                Some(ops * TRACE_OPPORTUNITY_BYTES as u64 * 8 * 1_000_000_000 / span)
            }
        }
    }

    /// The highest rate over any whole second: a trace's busiest second, a schedule's highest
    /// step (what autorate's MAX may reach); None when unlimited.
    pub fn max_bps(&self) -> Option<u64> {
        match self {
            Rate::Unlimited => None,
            Rate::BitsPerSecond(b) => Some(*b),
            Rate::Trace {
                opportunities_ms, ..
            } => {
                let mut per_second = std::collections::BTreeMap::new();
                for t in opportunities_ms {
                    *per_second.entry(t.saturating_sub(1) / 1000).or_insert(0u64) += 1;
                }
                per_second
                    .values()
                    .max()
                    .map(|n| n * TRACE_OPPORTUNITY_BYTES as u64 * 8)
            }
            Rate::Schedule { steps, .. } => steps.iter().map(|s| s.1).max(),
        }
    }

    /// Mean rate in bit/s (for time-based buffer limits); None when unlimited.
    pub fn mean_bps(&self) -> Option<u64> {
        match self {
            Rate::Unlimited => None,
            Rate::BitsPerSecond(b) => Some(*b),
            Rate::Trace {
                opportunities_ms,
                period_ms,
            } => Some(
                opportunities_ms.len() as u64 * TRACE_OPPORTUNITY_BYTES as u64 * 8 * 1000
                    / period_ms,
            ),
            // A repeating schedule: each step weighted by how long it holds.
            Rate::Schedule {
                steps,
                period_ns: Some(p),
            } => {
                let ends = steps.iter().skip(1).map(|s| s.0).chain([*p]);
                let bits: f64 = steps
                    .iter()
                    .zip(ends)
                    .map(|(s, end)| s.1 as f64 * (end - s.0) as f64)
                    .sum();
                Some((bits / (*p - steps[0].0.min(*p)) as f64) as u64)
            }
            Rate::Schedule { steps, .. } => {
                Some(steps.iter().map(|s| s.1).sum::<u64>() / steps.len() as u64)
            }
        }
    }
}

/// `SECONDS VALUE` lines (the value read by `value`, named `what` in errors), sorted by time,
/// and an optional `repeat SECONDS` line after the last step's time.
pub(crate) type Steps = (Vec<(u64, u64)>, Option<u64>);

pub(crate) fn parse_steps(
    text: &str,
    what: &str,
    value: impl Fn(&str) -> Result<u64, ConfigError>,
) -> Result<Steps, ConfigError> {
    let mut steps = Vec::new();
    let mut period_ns = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || {
            ConfigError::Value(format!(
                "schedule line {}: want `SECONDS {what}`, got `{line}`",
                n + 1
            ))
        };
        let (t, r) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
        if t == "repeat" {
            let secs: f64 = r.trim().parse().map_err(|_| bad())?;
            if !(secs > 0.0 && secs.is_finite()) {
                return Err(bad());
            }
            period_ns = Some((secs * 1e9) as u64);
            continue;
        }
        let secs: f64 = t.trim().parse().map_err(|_| bad())?;
        if !(secs >= 0.0 && secs.is_finite()) {
            return Err(bad());
        }
        steps.push(((secs * 1e9) as u64, value(r.trim())?));
    }
    if steps.is_empty() {
        return Err(ConfigError::Value(format!(
            "empty {} schedule",
            what.to_ascii_lowercase()
        )));
    }
    steps.sort_by_key(|s| s.0);
    if period_ns.is_some_and(|p| steps.last().is_some_and(|s| s.0 >= p)) {
        return Err(ConfigError::Value(
            "schedule: `repeat` must come after the last step's time".into(),
        ));
    }
    Ok((steps, period_ns))
}

/// The value at `since_ns` into a schedule (the first step's before its time).
pub(crate) fn step_at(steps: &[(u64, u64)], period_ns: Option<u64>, since_ns: u64) -> u64 {
    let t = period_ns.map_or(since_ns, |p| since_ns % p);
    steps
        .iter()
        .take_while(|s| s.0 <= t)
        .last()
        .map_or(steps[0].1, |s| s.1)
}

/// Serialises packets at a `Rate`: given when a packet starts, says when its last bit leaves.
#[derive(Clone, Debug)]
pub struct Serializer {
    pub rate: Rate,
    /// Time zero of traces and schedules.
    origin_ns: u64,
    /// Trace: global index of the current opportunity (loops counted) and bytes left in it.
    op_index: u64,
    op_left: usize,
}

impl Serializer {
    pub fn new(rate: Rate, origin_ns: u64) -> Serializer {
        Serializer {
            rate,
            origin_ns,
            op_index: 0,
            op_left: TRACE_OPPORTUNITY_BYTES,
        }
    }

    /// Time zero of traces and schedules (the link's delay schedule too).
    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    fn op_time(&self, index: u64) -> u64 {
        let Rate::Trace {
            opportunities_ms,
            period_ms,
        } = &self.rate
        else {
            unreachable!()
        };
        let n = opportunities_ms.len() as u64;
        self.origin_ns + ((index / n) * period_ms + opportunities_ms[(index % n) as usize]) * MS
    }

    /// Departure time of `wire_bytes` starting at `start_ns`.
    pub fn departure(&mut self, start_ns: u64, wire_bytes: usize) -> u64 {
        let at_rate =
            |bps: u64| start_ns + (wire_bytes as u64 * 8 * 1_000_000_000).div_ceil(bps.max(1));
        match &self.rate {
            Rate::Unlimited => start_ns,
            Rate::BitsPerSecond(bps) => at_rate(*bps),
            Rate::Schedule { steps, period_ns } => at_rate(Rate::scheduled(
                steps,
                *period_ns,
                start_ns.saturating_sub(self.origin_ns),
            )),
            Rate::Trace { .. } => {
                // Opportunities before the start are lost (mahimahi: unused ones do not carry).
                while self.op_time(self.op_index) < start_ns {
                    self.op_index += 1;
                    self.op_left = TRACE_OPPORTUNITY_BYTES;
                }
                let mut need = wire_bytes;
                while need > self.op_left {
                    need -= self.op_left;
                    self.op_index += 1;
                    self.op_left = TRACE_OPPORTUNITY_BYTES;
                }
                self.op_left -= need;
                self.op_time(self.op_index)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_rate_is_bits_over_rate() {
        let mut s = Serializer::new(Rate::BitsPerSecond(20_000_000), 0);
        assert_eq!(s.departure(0, 1500), 600_000);
    }

    #[test]
    fn trace_of_one_opportunity_per_ms_is_12_mbit() {
        let mut s = Serializer::new(Rate::parse_trace("1\n2\n3\n4\n").unwrap(), 0);
        assert_eq!(
            Rate::parse_trace("1\n2\n3\n4\n").unwrap().mean_bps(),
            Some(12_032_000)
        );
        // Back to back 1500-byte packets leave one per opportunity, looping after 4 ms.
        let mut t = 0;
        let mut deps = Vec::new();
        for _ in 0..6 {
            t = s.departure(t, 1500);
            deps.push(t / MS);
        }
        assert_eq!(deps, vec![1, 2, 3, 4, 5, 6]);
        // Two 750-byte packets share one opportunity.
        let d1 = s.departure(t + MS / 2, 750);
        let d2 = s.departure(d1, 750);
        assert_eq!((d1 / MS, d2 / MS), (7, 7));
        // An idle gap loses its opportunities.
        assert_eq!(s.departure(20 * MS, 1500) / MS, 20);
    }

    #[test]
    fn schedule_switches_rates_at_its_times() {
        let r = Rate::parse_schedule("0 10mbit\n2 1mbit\n").unwrap();
        let mut s = Serializer::new(r, 0);
        assert_eq!(s.departure(0, 1250), 1_000_000);
        assert_eq!(s.departure(3_000_000_000, 1250), 3_010_000_000);
        assert!(Rate::parse_schedule("x y").is_err());
        assert!(Rate::parse_schedule("0 10mbit\n5 1mbit\nrepeat 5").is_err());
    }

    #[test]
    fn a_repeating_schedule_starts_again_and_its_mean_weighs_each_step_by_its_time() {
        // 10 Mbit/s for 1 s, 1 Mbit/s for 3 s, again and again.
        let r = Rate::parse_schedule("0 10mbit\n1 1mbit\nrepeat 4\n").unwrap();
        assert_eq!(r.mean_bps(), Some(3_250_000));
        assert_eq!(r.max_bps(), Some(10_000_000));
        assert_eq!(r.mean_between(0, 2 * S), Some(5_500_000));
        assert_eq!(r.mean_between(4 * S, 8 * S), Some(3_250_000));
        let lte = Rate::parse_trace("1\n2\n3\n4\n").unwrap();
        assert_eq!(lte.mean_between(0, 8 * MS), Some(12_032_000));
        let mut s = Serializer::new(r, 0);
        // 1250 bytes: 1 ms at 10 Mbit/s, 10 ms at 1 Mbit/s.
        for (start, took) in [(0, MS), (2 * S, 10 * MS), (4 * S, MS), (9 * S, 10 * MS)] {
            assert_eq!(s.departure(start, 1250), start + took, "at {start}");
        }
    }
}
