//! Link rates: fixed, a mahimahi packet-delivery trace, or a schedule of rates over time.

use crate::values::{parse_rate, ConfigError};
use crate::MS;

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
    /// `SECONDS RATE` per line: from that time on, that rate; the last one holds.
    Schedule(Vec<(u64, u64)>),
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
        let mut steps = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || {
                ConfigError::Value(format!(
                    "schedule line {}: want `SECONDS RATE`, got `{line}`",
                    n + 1
                ))
            };
            let (t, r) = line.split_once(char::is_whitespace).ok_or_else(bad)?;
            let secs: f64 = t.trim().parse().map_err(|_| bad())?;
            if !(secs >= 0.0 && secs.is_finite()) {
                return Err(bad());
            }
            steps.push(((secs * 1e9) as u64, parse_rate(r.trim())?));
        }
        if steps.is_empty() {
            return Err(ConfigError::Value("empty rate schedule".into()));
        }
        steps.sort_by_key(|s| s.0);
        Ok(Rate::Schedule(steps))
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
            Rate::Schedule(steps) => {
                Some(steps.iter().map(|s| s.1).sum::<u64>() / steps.len() as u64)
            }
        }
    }
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
            Rate::Schedule(steps) => {
                let since = start_ns.saturating_sub(self.origin_ns);
                let bps = steps
                    .iter()
                    .take_while(|s| s.0 <= since)
                    .last()
                    .map_or(steps[0].1, |s| s.1);
                at_rate(bps)
            }
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
    }
}
