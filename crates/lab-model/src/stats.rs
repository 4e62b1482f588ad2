//! Per-direction counters as the model keeps them live: what came in, what went out, and why
//! the rest did not. A result file keeps them as `bloatlab_result::lab::DirStats`.

use hdrhistogram::Histogram;

pub use bloatlab_result::lab::Drops;

/// Sojourn times in the queue, in microseconds, with two significant digits (an HDR histogram:
/// any recorded value is within 1% of its bucket's, from 1 us up to an hour). A result file
/// keeps its non-empty buckets (`to_sojourn`), from which any reader rebuilds the distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct SojournHistogram {
    hist: Histogram<u64>,
}

const SOJOURN_MAX_US: u64 = 3_600_000_000;

impl Default for SojournHistogram {
    fn default() -> Self {
        SojournHistogram {
            hist: Histogram::new_with_max(SOJOURN_MAX_US, 2).expect("valid HDR bounds"),
        }
    }
}

impl SojournHistogram {
    pub fn record(&mut self, ns: u64) {
        self.hist.saturating_record(ns / 1000);
    }

    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The sojourn, in microseconds, at quantile `q` (0..1), within 1%; None when empty.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        (!self.hist.is_empty()).then(|| self.hist.value_at_quantile(q))
    }

    /// The non-empty buckets, as result files keep them.
    pub fn to_sojourn(&self) -> bloatlab_result::lab::Sojourn {
        bloatlab_result::lab::Sojourn { us: self.buckets() }
    }

    fn buckets(&self) -> Vec<(u64, u64)> {
        self.hist
            .iter_recorded()
            .map(|v| {
                (
                    self.hist.highest_equivalent(v.value_iterated_to()),
                    v.count_at_value(),
                )
            })
            .collect()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct DirCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// What the sent packets took on the wire (`overhead`, ATM cells): what the rate counts.
    pub tx_wire_bytes: u64,
    pub drops: Drops,
    pub ecn_marks: u64,
    pub queue_packets: usize,
    pub queue_bytes: usize,
    pub max_queue_packets: usize,
    pub sojourn: SojournHistogram,
    /// The transmit ring below the qdisc (`ring`): packets in it now and at most, and how long
    /// each waited there before its serialisation began. Empty without a ring.
    pub ring_packets: usize,
    pub max_ring_packets: usize,
    pub ring_sojourn: SojournHistogram,
    /// With `bql`: the byte limit learnt now.
    pub bql_limit_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sojourn_quantiles_are_within_one_percent() {
        let mut h = SojournHistogram::default();
        // 1000 sojourns of 1..=1000 x 37 us: p50 is 18.5 ms, p99 36.63 ms.
        for i in 1..=1000u64 {
            h.record(i * 37_000);
        }
        let near = |got: u64, want: f64| (got as f64 - want).abs() <= want * 0.01;
        assert!(
            near(h.quantile_us(0.5).unwrap(), 18_500.0),
            "{:?}",
            h.quantile_us(0.5)
        );
        assert!(
            near(h.quantile_us(0.99).unwrap(), 36_630.0),
            "{:?}",
            h.quantile_us(0.99)
        );
        assert!(near(h.quantile_us(1.0).unwrap(), 37_000.0));
        assert_eq!(SojournHistogram::default().quantile_us(0.5), None);
    }

    #[test]
    fn a_result_files_buckets_give_the_live_histograms_quantiles() {
        let mut h = SojournHistogram::default();
        for ns in [500, 1_500, 3_000_000, 3_000_000, 250_000_000] {
            h.record(ns);
        }
        let kept = h.to_sojourn();
        assert_eq!(kept.us.len(), 4, "{kept:?}");
        assert_eq!(kept.us.iter().map(|b| b.1).sum::<u64>(), 5);
        for q in [0.1, 0.5, 0.7, 1.0] {
            assert_eq!(kept.quantile_us(q), h.quantile_us(q), "q {q}");
        }
    }
}
