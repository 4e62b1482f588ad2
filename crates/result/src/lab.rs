//! The lab's counters (`bloatlab lab stats --json`, and a result file's `metadata.lab` when a
//! test ran inside a lab): per link direction, what came in, what went out, why the rest did
//! not, and how long packets waited.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LabStats {
    /// The lab instance's name.
    pub lab: String,
    /// Its topology's name.
    pub topology: String,
    pub links: BTreeMap<String, LinkStats>,
}

/// One link: `up` runs from its side `a` to `b`, `down` back.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LinkStats {
    pub up: DirStats,
    pub down: DirStats,
}

/// Drops by reason, so that no loss goes unexplained.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct Drops {
    /// Buffer full (tail drop, head drop, FQ-CoDel's fat-flow drop).
    pub overflow: u64,
    /// CoDel dropped the packet (sojourn above target for an interval).
    pub aqm: u64,
    /// Configured random or Gilbert-Elliott loss.
    pub loss: u64,
    /// Larger than the link MTU.
    pub mtu: u64,
    /// Pure ACKs CAKE's ACK filter found redundant.
    pub ack_filter: u64,
}

/// Sojourn times in microseconds as an HDR histogram's non-empty buckets, `[value, count]`,
/// each value the highest of its bucket (two significant digits: within 1%).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Sojourn {
    pub us: Vec<(u64, u64)>,
}

impl Sojourn {
    /// The sojourn at quantile `q` (0..1] as the histogram gives it (hdrhistogram's
    /// `value_at_quantile`: the bucket where the count reaches ceil(q * total), at least 1).
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let total: u64 = self.us.iter().map(|&(_, n)| n).sum();
        if total == 0 {
            return None;
        }
        let want = ((q.min(1.0) * total as f64).ceil() as u64).max(1);
        let mut sorted = self.us.clone();
        sorted.sort_unstable();
        let mut seen = 0;
        sorted.into_iter().find_map(|(v, n)| {
            seen += n;
            (seen >= want).then_some(v)
        })
    }
}

/// One link direction: the model's counters, its settings, and the TUN device before it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DirStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub drops: Drops,
    pub ecn_marks: u64,
    pub queue_packets: u64,
    pub queue_bytes: u64,
    pub max_queue_packets: u64,
    pub sojourn: Sojourn,
    /// The transmit ring below the qdisc (`ring`): packets in it now and at most, and how long
    /// each waited there before its serialisation began. Empty without a ring.
    pub ring_packets: u64,
    pub max_ring_packets: u64,
    pub ring_sojourn: Sojourn,
    /// With `bql`: the byte limit learnt now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bql_limit_bytes: Option<u64>,
    /// The direction's settings in `lab set`'s words.
    pub config: String,
    pub qdisc: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cake: Option<CakeStats>,
    pub tun: TunStats,
}

/// The TUN device a direction's packets wait in before the model reads them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TunStats {
    pub txqueuelen: u64,
    /// The kernel's transmit drops on the device (unknown when it cannot be read).
    pub dropped: Option<u64>,
    /// Packets found waiting each time the device was emptied.
    pub waiting_packets: P99Max,
    /// How long a packet waited there, microseconds.
    pub wait_us: P99Max,
    /// GSO/GRO super-packets on (the topology's `offload`).
    pub offload: bool,
    pub reads: u64,
    pub super_packets_in: u64,
    pub writes: u64,
    pub super_packets_out: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct P99Max {
    pub p99: u64,
    pub max: u64,
}

/// One CAKE tin's counters, named as `tc -s qdisc show` prints them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct TinStats {
    pub name: String,
    pub thresh_bps: u64,
    pub target_us: u64,
    pub interval_us: u64,
    pub pk_delay_us: u64,
    pub av_delay_us: u64,
    pub sp_delay_us: u64,
    pub backlog_bytes: u64,
    pub packets: u64,
    pub bytes: u64,
    pub way_inds: u64,
    pub way_miss: u64,
    pub way_cols: u64,
    pub drops: u64,
    pub marks: u64,
    pub ack_drops: u64,
    pub overlimit_drops: u64,
    pub sparse_flows: u64,
    pub bulk_flows: u64,
    pub unresponsive_flows: u64,
    pub max_len: u64,
    pub quantum: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct CakeStats {
    /// The settings in tc's words.
    pub settings: String,
    pub rate_bps: u64,
    pub capacity_estimate_bps: u64,
    pub memory_limit: u64,
    pub memory_used: u64,
    pub overlimits: u64,
    pub tins: Vec<TinStats>,
}

/// A test's view of the lab it ran in, kept in its result file: the counters (which run
/// from the lab's start) at both ends of the test; their difference is what the test saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LabCounters {
    pub at_start: Option<LabStats>,
    pub at_end: LabStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_the_buckets_follow_the_histograms_rule() {
        let s = Sojourn {
            us: vec![(300, 1), (100, 2), (200, 1)],
        };
        // 4 samples: p50 wants the 2nd (100), p75 the 3rd (200), p99 the 4th (300).
        assert_eq!(s.quantile_us(0.5), Some(100));
        assert_eq!(s.quantile_us(0.75), Some(200));
        assert_eq!(s.quantile_us(0.99), Some(300));
        assert_eq!(s.quantile_us(0.0), Some(100));
        assert_eq!(Sojourn::default().quantile_us(0.5), None);
    }
}
