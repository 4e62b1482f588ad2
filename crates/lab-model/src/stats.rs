//! Per-direction counters: what came in, what went out, and why the rest did not.

use serde::{Deserialize, Serialize};

/// Drops by reason, so that no loss goes unexplained.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Drops {
    /// Buffer full (tail drop, head drop, FQ-CoDel's fat-flow drop).
    pub overflow: u64,
    /// CoDel dropped the packet (sojourn above target for an interval).
    pub aqm: u64,
    /// Configured random or Gilbert-Elliott loss.
    pub loss: u64,
    /// Larger than the link MTU.
    pub mtu: u64,
}

/// Sojourn times in the queue, bucketed by powers of two of microseconds: bucket `i` holds
/// sojourns in [2^(i-1), 2^i) us, bucket 0 below 1 us.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SojournHistogram {
    pub buckets: Vec<u64>,
}

pub const SOJOURN_BUCKETS: usize = 24;

impl Default for SojournHistogram {
    fn default() -> Self {
        SojournHistogram { buckets: vec![0; SOJOURN_BUCKETS] }
    }
}

impl SojournHistogram {
    pub fn record(&mut self, ns: u64) {
        let us = ns / 1000;
        let i = (u64::BITS - us.leading_zeros()) as usize;
        self.buckets[i.min(SOJOURN_BUCKETS - 1)] += 1;
    }

    /// Upper edge, in microseconds, of the bucket holding quantile `q` (0..1); None when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total: u64 = self.buckets.iter().sum();
        if total == 0 {
            return None;
        }
        let want = ((q * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(1u64 << i);
            }
        }
        None
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DirStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drops: Drops,
    pub ecn_marks: u64,
    pub queue_packets: usize,
    pub queue_bytes: usize,
    pub max_queue_packets: usize,
    pub sojourn: SojournHistogram,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_powers_of_two() {
        let mut h = SojournHistogram::default();
        h.record(500); // 0 us
        h.record(1_500); // 1 us -> bucket 1
        h.record(3_000_000); // 3000 us -> [2048, 4096) -> bucket 12
        assert_eq!(h.buckets[0], 1);
        assert_eq!(h.buckets[1], 1);
        assert_eq!(h.buckets[12], 1);
        assert_eq!(h.quantile_us(1.0), Some(4096));
        assert_eq!(h.quantile_us(0.1), Some(1));
    }
}
