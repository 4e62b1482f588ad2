//! How busy the watched interface was when a probe left: its byte counters sampled every
//! 200 ms (as cake-autorate samples them) and each probe put in a band. Pure: the caller reads
//! the counters and gives their times.

use bloatlab_result::history::LoadBand;
use std::collections::VecDeque;

/// Rates over the last this many ns are kept (probes settle up to 4 s after they left).
const KEEP_NS: u64 = 30_000_000_000;

/// How far from a counter interval a probe may have left and still take its rate.
const NEAR_NS: u64 = 2_000_000_000;

/// Rates per interval between two counter readings, bits per second.
#[derive(Default)]
pub struct LoadMeter {
    last: Option<(u64, u64, u64)>,
    /// (interval start ns, end ns, rx bit/s, tx bit/s)
    rates: VecDeque<(u64, u64, f64, f64)>,
}

impl LoadMeter {
    /// A reading of the interface's rx and tx byte counters at `t_ns`. A counter that went back
    /// (the interface was re-created) starts over.
    pub fn add(&mut self, t_ns: u64, rx_bytes: u64, tx_bytes: u64) {
        if let Some((t0, rx0, tx0)) = self.last {
            if t_ns > t0 && rx_bytes >= rx0 && tx_bytes >= tx0 {
                let s = (t_ns - t0) as f64 / 1e9;
                self.rates.push_back((
                    t0,
                    t_ns,
                    (rx_bytes - rx0) as f64 * 8.0 / s,
                    (tx_bytes - tx0) as f64 * 8.0 / s,
                ));
            }
        }
        self.last = Some((t_ns, rx_bytes, tx_bytes));
        while self.rates.front().is_some_and(|r| r.1 + KEEP_NS < t_ns) {
            self.rates.pop_front();
        }
    }

    /// (rx, tx) bit/s over the interval that holds `t_ns`, or the nearest one within
    /// `NEAR_NS` (none nearer: the counters could not be read then, the load is unknown).
    pub fn rate_at(&self, t_ns: u64) -> Option<(f64, f64)> {
        let distance = |r: &(u64, u64, f64, f64)| {
            if t_ns < r.0 {
                r.0 - t_ns
            } else {
                t_ns.saturating_sub(r.1)
            }
        };
        self.rates
            .iter()
            .min_by_key(|r| distance(r))
            .filter(|r| distance(r) <= NEAR_NS)
            .map(|r| (r.2, r.3))
    }
}

/// Band thresholds from the line's capacity per direction (the last test's goodput, bit/s):
/// busy from half of it in either direction, idle under a twentieth in both. Before any test,
/// busy from 10 Mbit/s and idle under 1 Mbit/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bands {
    pub down_bps: Option<f64>,
    pub up_bps: Option<f64>,
}

impl Bands {
    pub fn classify(&self, rx_bps: f64, tx_bps: f64) -> LoadBand {
        let (busy_rx, idle_rx) = self.down_bps.map_or((10e6, 1e6), |c| (c / 2.0, c / 20.0));
        let (busy_tx, idle_tx) = self.up_bps.map_or((10e6, 1e6), |c| (c / 2.0, c / 20.0));
        if rx_bps >= busy_rx || tx_bps >= busy_tx {
            LoadBand::Busy
        } else if rx_bps < idle_rx && tx_bps < idle_tx {
            LoadBand::Idle
        } else {
            LoadBand::Light
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn rates_come_from_counter_differences_and_a_reset_starts_over() {
        let mut m = LoadMeter::default();
        m.add(0, 0, 0);
        m.add(S / 5, 250_000, 25_000); // 10 Mbit/s down, 1 Mbit/s up for 200 ms
        m.add(2 * S / 5, 250_000, 25_000); // then nothing
        assert_eq!(m.rate_at(S / 10), Some((10e6, 1e6)));
        assert_eq!(m.rate_at(3 * S / 10), Some((0.0, 0.0)));
        // Past the last reading: the nearest interval, up to 2 s away.
        assert_eq!(m.rate_at(S), Some((0.0, 0.0)));
        assert_eq!(m.rate_at(3 * S), None);
        m.add(3 * S / 5, 10, 10); // counters went back: no interval from it
        assert_eq!(m.rate_at(S), Some((0.0, 0.0)));
        m.add(4 * S / 5, 10 + 25_000, 10);
        assert_eq!(m.rate_at(7 * S / 10), Some((1e6, 0.0)));
    }

    #[test]
    fn bands_follow_the_measured_capacity_of_each_direction() {
        let unknown = Bands {
            down_bps: None,
            up_bps: None,
        };
        assert_eq!(unknown.classify(0.5e6, 0.1e6), LoadBand::Idle);
        assert_eq!(unknown.classify(5e6, 0.1e6), LoadBand::Light);
        assert_eq!(unknown.classify(12e6, 0.1e6), LoadBand::Busy);
        // A 100/10 Mbit/s line: 6 Mbit/s up fills more than half of its upload.
        let line = Bands {
            down_bps: Some(100e6),
            up_bps: Some(10e6),
        };
        assert_eq!(line.classify(12e6, 0.1e6), LoadBand::Light);
        assert_eq!(line.classify(1e6, 6e6), LoadBand::Busy);
        assert_eq!(line.classify(60e6, 0.0), LoadBand::Busy);
        assert_eq!(line.classify(4e6, 0.4e6), LoadBand::Idle);
    }
}
