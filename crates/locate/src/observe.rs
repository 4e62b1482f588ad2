//! From raw probes and the tests' phase windows to per-hop distributions. Pure.

use crate::verdict::{HopObs, Load, LocalObs};
use bloatlab_measure::hops::HopProbe;
use bloatlab_measure::localq::LocalQueue;

/// When, in wall-clock seconds since the Unix epoch, one test was idle and loaded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Windows {
    pub load: Load,
    pub idle: (f64, f64),
    pub loaded: (f64, f64),
    /// Upload goodput of the test, Mbit/s: how fast this host's own queue drains.
    pub up_mbps: Option<f64>,
}

fn within(t: f64, w: (f64, f64)) -> bool {
    t >= w.0 && t < w.1
}

/// Groups probes by TTL; a probe counts in a window by its send time.
pub fn hops(probes: &[HopProbe], windows: &[Windows]) -> Vec<HopObs> {
    let top = probes.iter().map(|p| p.ttl).max().unwrap_or(0);
    (1..=top)
        .map(|ttl| {
            let mine: Vec<&HopProbe> = probes.iter().filter(|p| p.ttl == ttl).collect();
            let mut h = HopObs {
                ttl,
                sent: mine.len() as u32,
                ..Default::default()
            };
            for p in &mine {
                let Some(rtt) = p.rtt_ms else { continue };
                h.answered += 1;
                h.address = p.from.or(h.address);
                h.destination |= p.reached;
                for w in windows {
                    if within(p.sent_unix, w.idle) {
                        h.idle.push(rtt);
                    } else if within(p.sent_unix, w.loaded) {
                        h.loaded[w.load as usize].push(rtt);
                    }
                }
            }
            h
        })
        .collect()
}

/// Median backlog of this host's queue per load phase, as the delay it means at the
/// phase's upload rate.
pub fn local(q: &LocalQueue, windows: &[Windows]) -> LocalObs {
    let mut out = LocalObs {
        interface: q.interface.clone(),
        ..Default::default()
    };
    for w in windows {
        let mut bytes: Vec<f64> = q
            .samples
            .iter()
            .filter(|s| within(s.t_unix, w.loaded))
            .map(|s| s.backlog_bytes as f64)
            .collect();
        let Some(mbps) = w.up_mbps.filter(|m| *m > 0.0) else {
            continue;
        };
        if bytes.is_empty() {
            continue;
        }
        bytes.sort_by(f64::total_cmp);
        let median = bloatlab_analyze::stats::quantile_sorted(&bytes, 0.5);
        out.delay_ms[w.load as usize] = Some(median * 8.0 / (mbps * 1e6) * 1e3);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_measure::localq::QueueSample;

    fn probe(ttl: u8, t: f64, rtt: Option<f64>) -> HopProbe {
        HopProbe {
            ttl,
            sent_unix: t,
            rtt_ms: rtt,
            from: rtt.map(|_| format!("10.0.0.{ttl}").parse().unwrap()),
            reached: ttl == 2,
        }
    }

    #[test]
    fn probes_fall_in_the_window_they_were_sent_in() {
        let w = [Windows {
            load: Load::Upload,
            idle: (0.0, 5.0),
            loaded: (7.0, 20.0),
            up_mbps: Some(4.0),
        }];
        let probes = [
            probe(1, 1.0, Some(1.0)),
            probe(1, 6.0, Some(50.0)),
            probe(1, 8.0, Some(90.0)),
            probe(1, 9.0, None),
            probe(2, 8.5, Some(95.0)),
        ];
        let h = hops(&probes, &w);
        assert_eq!(h.len(), 2);
        assert_eq!((h[0].sent, h[0].answered), (4, 3));
        assert_eq!(h[0].idle, vec![1.0]);
        assert_eq!(
            h[0].loaded[Load::Upload as usize],
            vec![90.0],
            "the ramp (5-7 s) counts nowhere"
        );
        assert!(h[1].destination && !h[0].destination);
    }

    #[test]
    fn a_backlog_becomes_delay_at_the_upload_rate() {
        // 50 full packets (75 kB) at 4 Mbit/s: 150 ms.
        let w = [Windows {
            load: Load::Upload,
            idle: (0.0, 5.0),
            loaded: (7.0, 20.0),
            up_mbps: Some(4.0),
        }];
        let q = LocalQueue {
            interface: "wlan0".into(),
            samples: (0..30)
                .map(|i| QueueSample {
                    t_unix: 6.0 + i as f64 * 0.5,
                    backlog_bytes: 75_000,
                    backlog_packets: 50,
                })
                .collect(),
            ..Default::default()
        };
        let l = local(&q, &w);
        assert!((l.delay_ms[Load::Upload as usize].unwrap() - 150.0).abs() < 1e-9);
        assert_eq!(l.delay_ms[Load::Download as usize], None);
    }
}
