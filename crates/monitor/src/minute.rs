//! Probes folded into one row per minute, target, load band and whether a scheduled test ran:
//! HDR histograms (2 significant digits) per row, so hours merge exactly later. Pure.

use bloatlab_measure::watch::Sample;
use bloatlab_result::history::{LoadBand, MinuteRow, Quantiles};
use bloatlab_store::quantiles;
use hdrhistogram::Histogram;
use std::collections::{BTreeMap, HashMap};

/// Delays are recorded in µs from 1 µs to 60 s.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 2).expect("valid bounds")
}

#[derive(Default)]
struct Acc {
    sent: u32,
    lost: u32,
    rtt: Option<Histogram<u64>>,
    up: Option<Histogram<u64>>,
    down: Option<Histogram<u64>>,
    rx_bits: f64,
    tx_bits: f64,
}

fn record(h: &mut Option<Histogram<u64>>, ms: Option<f64>) {
    if let Some(ms) = ms {
        h.get_or_insert_with(histogram)
            .saturating_record((ms * 1000.0).round().max(1.0) as u64);
    }
}

/// A histogram as (µs, count) pairs at each bucket's middle.
fn pairs(h: &Histogram<u64>) -> BTreeMap<u64, u64> {
    h.iter_recorded()
        .map(|v| {
            (
                h.median_equivalent(v.value_iterated_to()),
                v.count_at_value(),
            )
        })
        .collect()
}

/// One load tag of a probe: its band, whether a test of ours ran, the interface's rates.
#[derive(Clone, Copy, Debug)]
pub struct Tag {
    pub load: LoadBand,
    pub testing: bool,
    pub rx_bps: f64,
    pub tx_bps: f64,
}

pub struct Minutes {
    target: String,
    rows: HashMap<(i64, LoadBand, bool), Acc>,
}

impl Minutes {
    pub fn new(target: &str) -> Minutes {
        Minutes {
            target: target.into(),
            rows: HashMap::new(),
        }
    }

    /// A settled probe that left at Unix time `sent_s`.
    pub fn add(&mut self, sent_s: f64, s: &Sample, tag: Tag) {
        let minute = (sent_s.floor() as i64).div_euclid(60) * 60;
        let a = self
            .rows
            .entry((minute, tag.load, tag.testing))
            .or_default();
        a.sent += 1;
        if s.rtt_ms.is_none() {
            a.lost += 1;
        }
        record(&mut a.rtt, s.rtt_ms);
        record(&mut a.up, s.owd_up_ms);
        record(&mut a.down, s.owd_down_ms);
        a.rx_bits += tag.rx_bps;
        a.tx_bits += tag.tx_bps;
    }

    /// Rows of the minutes that began before `before_s` (all with `i64::MAX`), oldest first.
    pub fn take(&mut self, before_s: i64) -> Vec<MinuteRow> {
        let done: Vec<_> = self
            .rows
            .keys()
            .filter(|k| k.0 + 60 <= before_s || before_s == i64::MAX)
            .copied()
            .collect();
        let mut out: Vec<MinuteRow> = done
            .into_iter()
            .map(|k| {
                let a = self.rows.remove(&k).expect("key just listed");
                let q = |h: &Option<Histogram<u64>>| -> Option<Quantiles> {
                    h.as_ref().and_then(|h| quantiles(&pairs(h)))
                };
                MinuteRow {
                    minute: k.0,
                    target: self.target.clone(),
                    load: k.1,
                    testing: k.2,
                    sent: a.sent,
                    lost: a.lost,
                    rtt_ms: q(&a.rtt),
                    owd_up_ms: q(&a.up),
                    owd_down_ms: q(&a.down),
                    rx_mbps: a.rx_bits / f64::from(a.sent) / 1e6,
                    tx_mbps: a.tx_bits / f64::from(a.sent) / 1e6,
                    rtt_hist: a
                        .rtt
                        .as_ref()
                        .map(pairs)
                        .unwrap_or_default()
                        .into_iter()
                        .collect(),
                }
            })
            .collect();
        out.sort_by_key(|r| (r.minute, r.load, r.testing));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(rtt: Option<f64>) -> Sample {
        Sample {
            sent_ns: 0,
            rtt_ms: rtt,
            owd_up_ms: rtt.map(|r| r * 0.75),
            owd_down_ms: rtt.map(|r| r * 0.25),
            echo: None,
        }
    }

    #[test]
    fn probes_fold_into_minutes_per_band_with_loss_and_quantiles() {
        let mut m = Minutes::new("srv");
        let idle = Tag {
            load: LoadBand::Idle,
            testing: false,
            rx_bps: 0.0,
            tx_bps: 0.0,
        };
        let busy = Tag {
            load: LoadBand::Busy,
            rx_bps: 40e6,
            tx_bps: 2e6,
            ..idle
        };
        for i in 0..100 {
            m.add(120.0 + i as f64 * 0.5, &sample(Some(20.0)), idle);
        }
        for i in 0..9 {
            m.add(130.0 + i as f64, &sample(Some(300.0)), busy);
        }
        m.add(131.5, &sample(None), busy);
        m.add(185.0, &sample(Some(20.0)), idle);
        // The minute that began at 180 is not over at 200.
        let rows = m.take(200);
        assert_eq!(rows.len(), 2);
        let (i, b) = (&rows[0], &rows[1]);
        assert_eq!(
            (i.minute, i.load, i.sent, i.lost),
            (120, LoadBand::Idle, 100, 0)
        );
        assert_eq!((b.load, b.sent, b.lost), (LoadBand::Busy, 10, 1));
        // 2 significant digits: within 1 %.
        assert!((i.rtt_ms.unwrap().p50 - 20.0).abs() <= 0.2);
        let p = b.rtt_ms.unwrap().p90;
        assert!((p - 300.0).abs() <= 3.0, "{p}");
        assert!((b.owd_up_ms.unwrap().p50 - 225.0).abs() <= 2.5);
        assert_eq!((b.rx_mbps, b.tx_mbps), (40.0, 2.0));
        assert_eq!(b.rtt_hist.iter().map(|p| p.1).sum::<u64>(), 9);
        let rest = m.take(i64::MAX);
        assert_eq!((rest.len(), rest[0].minute), (1, 180));
    }
}
