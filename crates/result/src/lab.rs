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
    /// What the sent packets took on the wire (IP bytes plus the link's `overhead`, in ATM cells
    /// where set): the bytes the link's rate is a rate of. 0 in files from before it was counted.
    pub tx_wire_bytes: u64,
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

/// A wait in the TUN device before the model read the packet beyond this means the forwarder
/// fell behind: keeping up its p99 is 38-80 us; a link it cannot keep up with reads ~3 ms
/// (BENCHMARKS.md, 2026-11-23).
pub const TUN_WAIT_BEHIND_US: u64 = 1_000;

/// Why packets the hosts sent never reached the link model, or reached it late.
fn behind_words(dropped: u64, wait_p99_us: Option<u64>) -> String {
    let wait = wait_p99_us.map_or(String::new(), |w| {
        format!(", waited up to {:.1} ms (p99) there", w as f64 / 1e3)
    });
    format!(
        "the lab fell behind: {dropped} packets dropped in the TUN device before the model{wait}; \
        the hosts sent more packets per second than the lab forwards, so this link carried less \
        than it emulates (fewer or smaller packets, or a lower rate, stay within the lab)"
    )
}

impl DirStats {
    /// Since the lab started: whether packets the sending host wrote were dropped, or held over
    /// `TUN_WAIT_BEHIND_US`, before the model read them.
    pub fn fell_behind(&self) -> Option<String> {
        let (dropped, wait) = (self.tun.dropped.unwrap_or(0), self.tun.wait_us.p99);
        (dropped > 0 || wait > TUN_WAIT_BEHIND_US).then(|| behind_words(dropped, Some(wait)))
    }
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

impl LabCounters {
    /// Each link direction whose TUN device dropped packets during the test (between the two
    /// readings), as "link direction: why".
    pub fn fell_behind(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, link) in &self.at_end.links {
            let before = self.at_start.as_ref().and_then(|s| s.links.get(name));
            for (dir, d, d0) in [
                ("up", &link.up, before.map(|b| &b.up)),
                ("down", &link.down, before.map(|b| &b.down)),
            ] {
                let start = d0.and_then(|d| d.tun.dropped).unwrap_or(0);
                let dropped = d.tun.dropped.unwrap_or(0).saturating_sub(start);
                if dropped > 0 {
                    out.push(format!(
                        "link {name} {dir}: {}",
                        behind_words(dropped, None)
                    ));
                }
            }
        }
        out
    }
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

    #[test]
    fn a_lab_that_dropped_or_held_packets_before_its_model_says_it_fell_behind() {
        let dir = |dropped: u64, wait_p99: u64| DirStats {
            tun: TunStats {
                dropped: Some(dropped),
                wait_us: P99Max {
                    p99: wait_p99,
                    max: wait_p99,
                },
                ..TunStats::default()
            },
            ..DirStats::default()
        };
        assert_eq!(dir(0, 80).fell_behind(), None, "keeping up: 38-80 us");
        let held = dir(0, 3_100).fell_behind().unwrap();
        assert!(held.contains("waited up to 3.1 ms"), "{held}");
        assert!(dir(64, 80)
            .fell_behind()
            .unwrap()
            .contains("64 packets dropped"));
        // A test sees the drops between its two readings only.
        let stats = |up: u64| LabStats {
            links: [(
                "wan".to_string(),
                LinkStats {
                    up: dir(up, 80),
                    down: dir(5, 80),
                },
            )]
            .into(),
            ..LabStats::default()
        };
        let c = LabCounters {
            at_start: Some(stats(100)),
            at_end: stats(160),
        };
        let behind = c.fell_behind();
        assert_eq!(behind.len(), 1, "{behind:?}");
        assert!(
            behind[0].starts_with("link wan up: the lab fell behind: 60 packets dropped"),
            "{behind:?}"
        );
    }
}
