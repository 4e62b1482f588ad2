//! The autorate controller: one-way delays and the line's load in, a shaper rate per direction
//! out, on the clock the caller gives (ns). No I/O, no clock of its own; quinn's congestion
//! controllers are the model.
//!
//! Two laws share the state and the inputs:
//! - [`Law::CakeAutorate`]: cake-autorate's published law and defaults (v3.x `defaults.sh`,
//!   `cake-autorate.sh`), re-implemented here as the baseline: an asymmetric EWMA baseline per
//!   direction, bufferbloat when 3 of the last 6 samples exceed 30 ms plus one packet's
//!   serialisation, a cut of x0.99 down to x0.75 scaled by the window's mean delay (at most one
//!   per 300 ms), an increase of up to x1.04 per sample under high load without bloat, a decay
//!   towards the base rate once a second otherwise.
//! - [`Law::Bloatlab`]: the same, and where the line says more: when the line delivers clearly less
//!   than the shaper's rate while delay rises, or the queue grows steadily (its capacity fell; a
//!   reading under high load only after one at high load, or over a queue of five times the
//!   threshold, as flows that start read low), the cut goes straight below what it delivers, by
//!   enough to drain the queue that stands within about a second (90% of it, down to half from 500
//!   ms of queue), and the download cuts again as soon as a reading shows the fall (not a
//!   refractory period later; not once at 90% of a cut below what the line carried, as the flows
//!   backing off from a cut read low too), the upload as soon as its queue has grown by twice the
//!   threshold since the last cut, then on to the rate that drains the queue the fall left (at what
//!   the latest reading says the line carries: the download's always, the upload's while its queue
//!   holds still), and not again while the delay falls by the threshold in 400 ms (that cut is
//!   draining the queue); when it delivers the shaper's rate and delay rises anyway (a queue
//!   elsewhere, a burst), the cut stops at 90% of the highest rate that carried high load without
//!   bloat in the last 10 minutes (a memory of safe rates), which a cut below it tests now and
//!   then. A delay that stands still through that test, or through cuts well below what the line
//!   carried, is the path's own (a satellite's new route): it joins the baseline instead of cutting
//!   on.
//!
//! With several servers, each has its own baselines; ours follows the least of their latest
//! delays (a queue on one server's path beyond the line is not the line's to cure).
//!
//! Both tell a stall ("no probes came back": the rate holds at the last one without bloat, and
//! after `stall_to_min` at MIN) from bloat ("delay rose"): only delayed samples cut.
//!
//! Round trips to ICMP reflectors (the fallback, [`Controller::on_round_trip`]) have no
//! direction: cake-autorate's law halves them into both; ours gives them to the busier one.

use std::collections::VecDeque;

pub mod log;
pub mod pinger;
pub mod reflectors;
pub mod run;
pub mod shaper;

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

/// A direction's bounds, bits per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    pub min: f64,
    pub base: f64,
    pub max: f64,
}

impl Bounds {
    /// MIN <= BASE <= MAX, all above zero: otherwise why not, in one line.
    pub fn new(min: f64, base: f64, max: f64) -> Result<Bounds, String> {
        if !(min > 0.0 && min <= base && base <= max && max.is_finite()) {
            return Err(format!(
                "rates must be 0 < MIN <= BASE <= MAX, got {min:.0}:{base:.0}:{max:.0} bit/s"
            ));
        }
        Ok(Bounds { min, base, max })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Law {
    CakeAutorate,
    Bloatlab,
}

/// cake-autorate's defaults, and ours.
#[derive(Clone, Debug)]
pub struct Config {
    pub law: Law,
    pub down: Bounds,
    pub up: Bounds,
    /// A sample is delayed above this (plus one packet's serialisation at the shaper's rate), ms.
    pub delay_thr_ms: f64,
    /// The cut reaches its deepest at this mean delay over the window, ms.
    pub delay_max_ms: f64,
    /// Bufferbloat: at least `detect` of the last `window` samples delayed.
    pub window: usize,
    pub detect: usize,
    pub alpha_baseline_increase: f64,
    pub alpha_baseline_decrease: f64,
    /// High load: the line carries at least this share of the shaper's rate.
    pub high_load: f64,
    /// Least time between two cuts, and between a cut and an increase, ns.
    pub bloat_refractory_ns: u64,
    /// Between two decay steps towards the base rate, ns.
    pub decay_every_ns: u64,
    /// No sample for this long: stalled (the rate holds), ns.
    pub stall_after_ns: u64,
    /// Stalled this long: MIN (`None`: hold until samples come back), ns.
    pub stall_to_min_ns: Option<u64>,
    /// Safe rates are remembered this long, ns.
    pub safe_memory_ns: u64,
    /// The wire size of a full packet, bytes (its serialisation adds to the threshold).
    pub packet_bytes: f64,
}

impl Config {
    /// cake-autorate's defaults for its law. Ours acts from 10 ms (sqm-autorate's 15 ms, 5 ms
    /// suggested for fibre): its one-way delays come from bloatlab's own UDP probes, which no
    /// router deprioritises as it may ICMP, so a small threshold is not noise.
    pub fn new(law: Law, down: Bounds, up: Bounds) -> Config {
        let (delay_thr_ms, delay_max_ms) = match law {
            Law::CakeAutorate => (30.0, 60.0),
            Law::Bloatlab => (10.0, 30.0),
        };
        Config {
            law,
            down,
            up,
            delay_thr_ms,
            delay_max_ms,
            window: 6,
            detect: 3,
            alpha_baseline_increase: 0.001,
            alpha_baseline_decrease: 0.9,
            high_load: 0.75,
            bloat_refractory_ns: 300 * MS,
            decay_every_ns: S,
            stall_after_ns: S,
            stall_to_min_ns: None,
            safe_memory_ns: 600 * S,
            packet_bytes: 1514.0,
        }
    }
}

/// One probe's one-way delays, ms (`None` where that direction's delay is unknown: a lost
/// reply still says the request arrived).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub down_ms: Option<f64>,
    pub up_ms: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Down,
    Up,
}

/// What the controller did, for the shell to apply and say.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Set this direction's shaper to this rate, bits per second.
    Rate {
        dir: Direction,
        bps: u64,
        why: Why,
    },
    /// A delay that stood still through cuts below what the line carried (or a test below the
    /// memory of safe rates) taken as the path's own: its baseline rose by this much, ms.
    PathLonger {
        dir: Direction,
        ms: f64,
    },
    /// No samples for a while: rates held (said once until samples return).
    Stalled,
    /// Stalled past `stall_to_min`: both at MIN.
    StalledToMin,
    Recovered,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    Bloat,
    /// A cut below what the line delivered (its capacity fell).
    Delivered,
    /// A cut that stopped at the memory of safe rates.
    SafeFloor,
    /// Below that floor for a moment, to tell a queue elsewhere from a capacity that fell.
    FloorTest,
    Increase,
    Decay,
    Stall,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Load {
    Idle,
    Low,
    High,
}

/// Load below this is idle, bits per second (cake-autorate's `connection_active_thr_kbps`).
const ACTIVE_BPS: f64 = 2_000_000.0;

/// A server's latest delay counts with the others' this long after it was answered, ns: a few
/// of its probe intervals (two servers at 10 a second each), so one lost probe does not drop it,
/// while a server gone stops speaking for the line within half a second.
const SOURCE_FRESH_NS: u64 = 500 * MS;

/// One server's view of a direction.
#[derive(Clone, Copy, Debug, Default)]
struct Source {
    baseline: Option<f64>,
    /// (time, delay over the baseline ms) of its last answer.
    latest: Option<(u64, f64)>,
}

struct Dir {
    which: Direction,
    bounds: Bounds,
    rate: f64,
    /// Per server probed (the index the shell gives it), its baseline and latest delay.
    sources: Vec<Source>,
    /// (delayed, delta ms) of the last samples.
    window: VecDeque<(bool, f64)>,
    last_cut: Option<u64>,
    /// The delay over the baseline the last cut was made at, ms.
    cut_delta: f64,
    last_decay: u64,
    /// The line's rate in this direction now, bits per second.
    delivered: f64,
    /// The last readings of it (the memory of safe rates takes their mean: one counter read
    /// late reads high, and a memory of its maximum would keep that error).
    readings: VecDeque<f64>,
    /// The last rate with no bloat: what a stall holds (if no higher than the rate now).
    last_safe: f64,
    /// (time, rate the line delivered) at high load without bloat, at most one a second.
    safe: VecDeque<(u64, f64)>,
    /// (time, delay over the baseline ms) of the last second's samples.
    recent: VecDeque<(u64, f64)>,
    /// Since when the memory of safe rates has held a delay that does not go away.
    floor_since: Option<u64>,
    /// A cut below that floor under way: (since, the floor, the least delay then).
    floor_test: Option<(u64, f64, f64)>,
    /// Since when the rate has been above the ceiling without bloat.
    above_since: Option<u64>,
    /// (until, growth): the queue's growth says the rate before the last cut it measured a
    /// capacity for, up to that growth, until then: for a second, and as long again as its
    /// queue delayed the probes that say so.
    growth_stale: Option<(u64, f64)>,
    /// (time, the capacity it fell to, measured) at the last fall of the line's capacity: the
    /// fast climb goes up to it, and cuts while its queue drains stop at the rate that drains
    /// it if it was measured (the download's counter, after the bottleneck, reads it; the
    /// upload's reads what TCP sent, a measure of it only through the queue's growth).
    fell_to: Option<(u64, f64, bool)>,
    /// Readings of the line's rate so far, and how many there were at the last cut.
    readings_seen: u64,
    readings_at_cut: u64,
    /// The first cut below what the line carried while the delay stands.
    below_carried: Option<BelowCarried>,
}

/// A cut below what the line carried, while the delay stands.
#[derive(Clone, Copy, Debug)]
struct BelowCarried {
    at: u64,
    rate: f64,
    /// The least delay then, ms.
    level: f64,
    /// Since when the rate has been at 90% of that cut or less.
    under_since: Option<u64>,
}

impl Dir {
    fn new(which: Direction, bounds: Bounds) -> Dir {
        Dir {
            which,
            bounds,
            rate: bounds.base,
            sources: Vec::new(),
            window: VecDeque::new(),
            last_cut: None,
            cut_delta: 0.0,
            last_decay: 0,
            delivered: 0.0,
            readings: VecDeque::new(),
            last_safe: bounds.base,
            safe: VecDeque::new(),
            recent: VecDeque::new(),
            floor_since: None,
            floor_test: None,
            above_since: None,
            growth_stale: None,
            fell_to: None,
            readings_seen: 0,
            readings_at_cut: 0,
            below_carried: None,
        }
    }

    /// The mean of the last readings of the line's rate.
    fn mean_reading(&self) -> f64 {
        self.readings.iter().sum::<f64>() / self.readings.len().max(1) as f64
    }

    /// The least delay over the baseline of the 200 ms that ended `ago_ms` before `now`.
    fn least(&self, now: u64, ago_ms: u64) -> Option<f64> {
        let (from, to) = (
            now.saturating_sub((ago_ms + 200) * MS),
            now.saturating_sub(ago_ms * MS),
        );
        self.recent
            .iter()
            .filter(|r| r.0 > from && r.0 <= to)
            .map(|r| r.1)
            .reduce(f64::min)
    }

    /// The memory of safe rates held the rate for a second while the delay stayed: either the
    /// queue is elsewhere (cutting cannot cure it) or the line's capacity fell to about the
    /// floor (a standing queue that a cut below it drains). The test: 15% below the floor for
    /// 600 ms, which drains a queue of ours by up to 90 ms. If the delay falls by the
    /// threshold `thr` (or under it), the memory is out of date and forgotten; if it grows by
    /// as much (which ends the test there), the line fell below the test's rate, and the memory
    /// goes too. If it stands still, it is not a queue of ours but the path's (or a queue
    /// beyond the line's, which no cut cures): it joins the baseline, and the floor holds.
    fn test_the_floor(
        &mut self,
        now: u64,
        rate: f64,
        why: Why,
        thr: f64,
        out: &mut Vec<Event>,
    ) -> (f64, Why) {
        let least = self.least(now, 0);
        if let Some((t0, floor, before)) = self.floor_test {
            // A queue that grows under the test's rate ends it at once: the line fell.
            let grew = least.is_some_and(|l| l > before + thr);
            if now.saturating_sub(t0) < 600 * MS && !grew {
                return (self.rate, Why::FloorTest);
            }
            self.floor_test = None;
            self.floor_since = None;
            if grew || least.is_some_and(|l| l < thr || l < before - thr) {
                self.safe.clear();
                self.fell_to = None;
                return (rate.min(0.85 * floor), Why::Bloat);
            }
            if let Some(l) = least {
                self.rebase(l, out);
            }
            return (floor, Why::SafeFloor);
        }
        if why != Why::SafeFloor {
            self.floor_since = None;
            return (rate, why);
        }
        // The floor's second counts from cuts a refractory period or so apart: a floor held
        // long ago does not put the first cut of a new bloat (a fall's, perhaps) into a test.
        if self.last_cut.is_none_or(|t| now.saturating_sub(t) > S) {
            self.floor_since = None;
        }
        let since = *self.floor_since.get_or_insert(now);
        if now - since < S {
            return (rate, why);
        }
        let Some(before) = least else {
            return (rate, why);
        };
        self.floor_test = Some((now, rate, before));
        (0.85 * rate, Why::FloorTest)
    }

    /// A delay that stood still through cuts below what the line carries is not a queue of
    /// ours but the path's (a satellite's new route, a route change): it joins every server's
    /// baseline, and the delays already taken are read against it. cake-autorate's baseline
    /// follows a rise at 0.1% a sample (a time constant of 50 s at 20 a second), cutting all
    /// along: in the lab's starlink, for a path 13 ms longer each way, its cuts took the shapers
    /// to a quarter of the line's download and under half its upload for the rest of the step.
    fn rebase(&mut self, by: f64, out: &mut Vec<Event>) {
        out.push(Event::PathLonger {
            dir: self.which,
            ms: by,
        });
        for s in &mut self.sources {
            if let Some(b) = s.baseline.as_mut() {
                *b += by;
            }
            if let Some((_, d)) = s.latest.as_mut() {
                *d -= by;
            }
        }
        for r in &mut self.recent {
            r.1 -= by;
        }
        self.window.clear();
        self.cut_delta -= by;
        self.below_carried = None;
        self.floor_since = None;
    }

    /// The delay over the threshold that has stood still (within half of it) for the last 300
    /// ms, at a rate at 90% or less of a cut below what the line carried for as long, cut
    /// further meanwhile or not: a queue of ours would drain at 19% or more of the line's rate
    /// then (57 ms in those 300 ms). That delay, if so. A rate held still is not asked for: the
    /// flows back off from every cut, so the reading after one reads low, and the next cut,
    /// sized by it, came 300 ms later each time (in the model, a longer path's delay took the
    /// download from 36 Mbit/s to 18 on a 40 Mbit/s line before it was taken for the path's).
    fn standing_still(&self, now: u64, thr: f64) -> Option<f64> {
        let span = 300 * MS;
        if self
            .below_carried?
            .under_since
            .is_none_or(|t| now < t + span)
        {
            return None;
        }
        let last = self
            .recent
            .iter()
            .filter(|r| now.saturating_sub(r.0) < span);
        let (n, lo, hi) = last.fold((0, f64::MAX, f64::MIN), |(n, lo, hi), r| {
            (n + 1, lo.min(r.1), hi.max(r.1))
        });
        (n >= 3 && lo > thr && hi - lo <= thr / 2.0).then_some(lo)
    }

    /// The queue grows: the least delay of 200 ms rose by over 5 ms in each half of the last
    /// second, by about as much in each (one late probe is not a trend, and a step, such as a
    /// queue elsewhere appearing, rises in one half); or, fast, by over 50 ms in each of the
    /// last two 200 ms (a line that fell to a third grows 2 s a second, and waiting for a
    /// second of it to look steady costs a second of buffer). Then its growth, seconds per
    /// second; none while it may be the growth before the last cut it measured (a rate cut
    /// slows it: twice that is new).
    fn growth(&self, now: u64) -> Option<f64> {
        let g = self.growth_now(now)?;
        match self.growth_stale {
            Some((until, before)) if now < until && g <= 2.0 * before => None,
            _ => Some(g),
        }
    }

    fn growth_now(&self, now: u64) -> Option<f64> {
        let (a, b, m, c) = (
            self.least(now, 800)?,
            self.least(now, 400)?,
            self.least(now, 200)?,
            self.least(now, 0)?,
        );
        // Steadily: a queue that grows because the line slowed grows at about the same pace
        // in both halves; a step (a queue appearing elsewhere) on top of a small rise does not.
        let (first, second) = (b - a, c - b);
        let steady = first > 5.0 && second > 5.0 && first.max(second) <= 2.5 * first.min(second);
        if steady {
            return Some((c - a) / 800.0);
        }
        (m - b > 50.0 && c - m > 50.0).then(|| (c - b) / 400.0)
    }

    /// How the queue moved, ms: the least delay of the last 200 ms less that of the 200 ms
    /// that ended 400 ms ago.
    fn moved(&self, now: u64) -> Option<f64> {
        Some(self.least(now, 0)? - self.least(now, 400)?)
    }

    /// A sample is delayed above this, ms: the threshold plus one packet's serialisation at
    /// the shaper's rate.
    fn thr(&self, cfg: &Config) -> f64 {
        cfg.delay_thr_ms + cfg.packet_bytes * 8.0 / self.rate * 1e3
    }

    /// The line carries enough this way for its reading to say what it can: cake-autorate's
    /// 2 Mbit/s, or high load on a shaper slower than that (a 1 Mbit/s upload never carries 2).
    fn carries(&self, cfg: &Config) -> bool {
        self.delivered >= ACTIVE_BPS.min(cfg.high_load * self.rate)
    }

    /// Bufferbloat: at least `detect` of the last `window` samples delayed.
    fn bloated(&self, cfg: &Config) -> bool {
        self.window.iter().filter(|w| w.0).count() >= cfg.detect
    }

    fn load(&self, cfg: &Config) -> Load {
        if self.delivered >= cfg.high_load * self.rate {
            Load::High
        } else if self.delivered >= ACTIVE_BPS {
            Load::Low
        } else {
            Load::Idle
        }
    }

    fn set(&mut self, now: u64, rate: f64, why: Why, out: &mut Vec<Event>) {
        let r = rate.clamp(self.bounds.min, self.bounds.max);
        if (r - self.rate).abs() >= 1.0 {
            self.rate = r;
            if let Some(b) = self.below_carried.as_mut() {
                b.under_since = if r <= 0.9 * b.rate {
                    b.under_since.or(Some(now))
                } else {
                    None
                };
            }
            out.push(Event::Rate {
                dir: self.which,
                bps: r.round() as u64,
                why,
            });
        }
    }

    /// A one-way delay from server `source`, over that server's own baseline (each path has
    /// its own length and clock offset). Ours then takes the least of every server's latest
    /// delay over its baseline (answered within [`SOURCE_FRESH_NS`]): the line's own queue is
    /// on every server's path, a queue beyond it (a server's uplink, a peering link) on one
    /// only, and is not the line's to cure. With one server, its own delay; cake-autorate's law
    /// puts each reflector's delay in its window as it comes, and so each server's here.
    fn sample(&mut self, now: u64, source: usize, owd_ms: f64, cfg: &Config, out: &mut Vec<Event>) {
        if self.sources.len() <= source {
            self.sources.resize(source + 1, Source::default());
        }
        let s = &mut self.sources[source];
        // The baseline follows a falling delay at once and a rising one very slowly.
        let base = match s.baseline {
            None => owd_ms,
            Some(b) if owd_ms > b => b + cfg.alpha_baseline_increase * (owd_ms - b),
            Some(b) => b + cfg.alpha_baseline_decrease * (owd_ms - b),
        };
        s.baseline = Some(base);
        let own = owd_ms - base;
        s.latest = Some((now, own));
        let delta = match cfg.law {
            Law::CakeAutorate => own,
            Law::Bloatlab => self
                .sources
                .iter()
                .filter_map(|s| s.latest)
                .filter(|(t, _)| now.saturating_sub(*t) <= SOURCE_FRESH_NS)
                .fold(own, |least, (_, d)| least.min(d)),
        };
        self.delta(now, delta, true, cfg, out);
    }

    /// A delay over the baseline, ms. `may_cut`: bloat in it may be this direction's (a round
    /// trip's delay, with no direction of its own, cuts only the busiest directions; the
    /// others still do not climb on it).
    fn delta(&mut self, now: u64, delta: f64, may_cut: bool, cfg: &Config, out: &mut Vec<Event>) {
        self.recent.push_back((now, delta));
        while self
            .recent
            .front()
            .is_some_and(|r| now.saturating_sub(r.0) > S)
        {
            self.recent.pop_front();
        }
        let thr = self.thr(cfg);
        // A cut below what the line carried tells about the delay that stands only while the
        // rate stays below it, for a few seconds, and the line does not fall further (its
        // queue grows over the delay then by the threshold: in the lab's starlink, a cut at a
        // fall, sized by a reading from before it, was 2 s later taken for one below the line).
        if self.below_carried.is_some_and(|b| {
            self.rate > b.rate
                || now > b.at + 5 * S
                || self.least(now, 0).is_some_and(|l| l > b.level + thr)
        }) {
            self.below_carried = None;
        }
        self.window.push_back((delta > thr, delta));
        while self.window.len() > cfg.window {
            self.window.pop_front();
        }
        let avg = self.window.iter().map(|w| w.1).sum::<f64>() / self.window.len() as f64;
        let bloat = self.bloated(cfg);
        let refractory = self
            .last_cut
            .is_some_and(|t| now.saturating_sub(t) < cfg.bloat_refractory_ns);
        let load = self.load(cfg);
        if bloat {
            self.above_since = None;
            // Ours cuts again within the refractory period when the download's first reading
            // since the last cut says the line delivers well under the rate: its capacity fell,
            // and that cut was sized by a reading from before the fall while the queue grows by
            // up to seconds a second. (The download's counter is after the bottleneck and reads
            // its rate while a queue stands there; the upload's reads what TCP sends.) Not once
            // the rate is 90% or less of a cut below what the line carried: the flows back off
            // from every cut (they halve their windows at the drops it brings), so the reading
            // after one reads low on a line that did not fall, and a delay that stands (a longer
            // path) cut again with each reading.
            let under_a_cut = self.below_carried.is_some_and(|b| b.under_since.is_some());
            let fell_since_cut = cfg.law == Law::Bloatlab
                && self.which == Direction::Down
                && self.readings_seen > self.readings_at_cut
                && self.carries(cfg)
                && self.delivered < 0.8 * self.rate
                && !under_a_cut;
            // Ours cuts the upload again within the refractory period when its delay has grown
            // by twice the threshold since the last cut: that cut left the shaper above a line
            // that fell (a queue elsewhere stands; this one grows), and the growth since it
            // says by how much (the upload's shaper is before the queue). The growth over the
            // 800 ms the steady test reads would come a refractory period or two later.
            let since_cut = self.last_cut.filter(|t| {
                cfg.law == Law::Bloatlab
                    && self.which == Direction::Up
                    && refractory
                    && now >= *t + 20 * MS
                    && delta > self.cut_delta + 2.0 * thr
            });
            let growing = since_cut.map(|t| (delta - self.cut_delta) / ((now - t) as f64 / 1e6));
            if (refractory && !fell_since_cut && growing.is_none()) || !may_cut {
                return;
            }
            // Ours does not cut a direction that carries under a tenth of its MIN: a shaper at
            // MIN or above passes ten times what arrives, so no cut changes any queue, and the
            // delay is the host's or a queue elsewhere (a busy CI host's probes read 3 of 6 over
            // 10 ms on an idle line; cake-autorate's law cuts at any load).
            if cfg.law == Law::Bloatlab && self.delivered < self.bounds.min / 10.0 {
                return;
            }
            if cfg.law == Law::Bloatlab {
                if let Some(standing) = self.standing_still(now, thr) {
                    self.rebase(standing, out);
                    return;
                }
                // Ours does not cut while the queue drains by the threshold in 400 ms (the
                // window still counts its samples from before): the last cut is doing its work
                // (in the lab's starlink, two cuts while the upload's queue drained took the
                // shaper to 56% of a 5 Mbit/s line).
                if self.moved(now).is_some_and(|m| m <= -thr) {
                    return;
                }
            }
            let f = ((avg - thr) / (cfg.delay_max_ms - thr)).clamp(0.0, 1.0);
            let cut = self.rate * (0.99 - f * 0.24);
            // Before the floor's test, which may move the baseline (and this delay with it).
            self.cut_delta = delta;
            let (rate, why) = match cfg.law {
                Law::CakeAutorate => (cut, Why::Bloat),
                Law::Bloatlab => {
                    let (rate, why) = self.bounded_cut(now, cut, cfg, growing);
                    self.test_the_floor(now, rate, why, thr, out)
                }
            };
            self.last_cut = Some(now);
            self.readings_at_cut = self.readings_seen;
            self.set(now, rate, why, out);
            if why == Why::Delivered && self.below_carried.is_none() {
                self.below_carried = Some(BelowCarried {
                    at: now,
                    rate: self.rate,
                    level: self.least(now, 0).unwrap_or(delta),
                    under_since: None,
                });
            }
            return;
        }
        self.last_safe = self.rate;
        if self.floor_test.take().is_some() {
            // The delay went away below the floor: the line's capacity fell.
            self.safe.clear();
            self.fell_to = None;
        }
        if load == Load::High {
            // At most one remembered rate a second.
            if self.safe.back().is_none_or(|s| now - s.0 >= S) {
                // The shaper passes no more than its rate: a reading above it is its timing.
                self.safe
                    .push_back((now, self.mean_reading().min(self.rate)));
            }
            if !refractory {
                // Full steps while the delay is at most 10 ms (cake-autorate's), ours a third of
                // its threshold.
                let span = match cfg.law {
                    Law::CakeAutorate => thr - 10.0,
                    Law::Bloatlab => thr * 2.0 / 3.0,
                };
                let f = ((thr - avg) / span).clamp(0.0, 1.0);
                // Ours climbs fast up to what the line has carried without bloat, then probes
                // above it gently (x1.005 a sample: 10% a second at 20 probes a second), twice
                // as fast for each 2 s the line carried all of it without bloat, up to x1.02 (a
                // capacity that grew is found in seconds; a probe above one that did not costs
                // a short queue now and then, not every few seconds).
                if self.delivered < 0.95 * self.rate {
                    self.above_since = None;
                }
                let step = match (cfg.law, self.ceiling(now, cfg)) {
                    (Law::Bloatlab, Some(c)) if self.rate >= c => {
                        let since = *self.above_since.get_or_insert(now);
                        let doublings = (now - since) / (2 * S);
                        0.005 * (1u64 << doublings.min(2)) as f64
                    }
                    _ => 0.04,
                };
                self.set(now, self.rate * (1.0 + step * f), Why::Increase, out);
            }
        }
        while self
            .safe
            .front()
            .is_some_and(|s| now.saturating_sub(s.0) > cfg.safe_memory_ns)
        {
            self.safe.pop_front();
        }
    }

    /// What a climb is fast up to: the highest rate the line delivered at high load without
    /// bloat in the safe memory, or the capacity it last fell to if higher.
    fn ceiling(&self, now: u64, cfg: &Config) -> Option<f64> {
        let fell_to = self
            .fell_to
            .filter(|f| now.saturating_sub(f.0) <= cfg.safe_memory_ns)
            .map(|f| f.1);
        self.safe_max(now, cfg)
            .into_iter()
            .chain(fell_to)
            .reduce(f64::max)
    }

    /// The highest rate the line delivered at high load without bloat in the safe memory.
    fn safe_max(&self, now: u64, cfg: &Config) -> Option<f64> {
        self.safe
            .iter()
            .filter(|s| now.saturating_sub(s.0) <= cfg.safe_memory_ns)
            .map(|s| s.1)
            .reduce(f64::max)
    }

    /// Our law's cut: to 90% of what the line carries when that is less than cake-autorate's
    /// cut; and, unless its capacity fell (it delivers clearly less than the shaper's rate, or
    /// the queue keeps growing), not below 90% of its ceiling (a delay that cutting does not
    /// cure: a queue elsewhere, a burst).
    /// `growing`: the queue's growth since the last cut (s a second), if that is what cuts.
    fn bounded_cut(
        &mut self,
        now: u64,
        cut: f64,
        cfg: &Config,
        growing: Option<f64>,
    ) -> (f64, Why) {
        let delivered = self.delivered;
        let growth = growing.or_else(|| self.growth(now));
        // The upload's shaper is before the bottleneck: what it sent in the growth's second
        // arrived there, and a queue growing g seconds a second says the bottleneck carries
        // 1/(1+g) of it. The download's (ingress) is after it, and sees the bottleneck's own
        // rate.
        let capacity = match (self.which, growth) {
            (Direction::Up, Some(g)) => self.mean_reading().min(self.rate) / (1.0 + g),
            _ => delivered,
        };
        let (mut rate, mut why) = (cut, Why::Bloat);
        // Below the capacity by enough to drain the queue that stands in about a second (the
        // least delay of the last 200 ms, s): 90% of it up to a queue of 100 ms, half of it
        // from 500 ms (a line that fell to a third fills 2 s of buffer a second till the cut).
        let standing = self.least(now, 0).unwrap_or(0.0) / 1e3;
        let drain = (0.9 - (standing - 0.1).max(0.0)).max(0.5);
        let thr = self.thr(cfg);
        // A reading below high load says what the line carries where the one before it was at
        // high load (the line was busy, and slowed), or over a queue of five times the
        // threshold: flows that start read low while their slow start's bursts cross the
        // threshold (in the lab's starlink, a test's first reading cut the download to 17 and
        // to 21 Mbit/s of 100, over 12-30 ms, and the climb back took 10 s).
        let busy_before = self.readings.len() >= 2
            && self.readings[self.readings.len() - 2] >= cfg.high_load * self.rate;
        let reads_line = self.carries(cfg)
            && (self.load(cfg) == Load::High || busy_before || self.cut_delta >= 5.0 * thr);
        if reads_line && drain * capacity < cut {
            (rate, why) = (drain * capacity, Why::Delivered);
        }
        // A queue that keeps growing is this line's, whatever it carried before.
        let capacity_fell = reads_line && (delivered < 0.8 * self.rate || growth.is_some());
        if capacity_fell {
            if let Some(g) = growth {
                let lag = self.least(now, 0).unwrap_or(0.0).max(0.0) * MS as f64;
                self.growth_stale = Some((now + S + lag as u64, g));
            }
            // What the line carried before is no guide now: the climb back is fast only up to
            // what it carries now, gentle above.
            self.safe.clear();
            let measured = self.which == Direction::Down || growth.is_some();
            self.fell_to = Some((now, capacity, measured));
        } else if reads_line
            && (self.which == Direction::Down || self.moved(now).is_some_and(|m| m.abs() <= thr))
        {
            // The download's counter, after the bottleneck, reads its rate while the queue
            // stands there: the capacity it fell to follows the readings down (the first after
            // a fall may have counted some of the line before it: in the lab's starlink, 52.8
            // Mbit/s of a fall from 80 to 40 held the shaper at 47.5 over a full queue for
            // 1.7 s). The upload's reads what TCP sent into the queue, which is what the line
            // carries while the queue holds still, within the threshold over 400 ms (there, its
            // floor held the shaper at 5.05 Mbit/s on a 5 Mbit/s line for 1.6 s, TCP's flows
            // keeping 130 ms in the queue).
            if let Some(f) = self.fell_to.as_mut().filter(|f| delivered < f.1) {
                f.1 = delivered;
            }
        }
        // Not below 90% of the memory of safe rates; after a fall (no safe rate since), not
        // below the rate that drains the queue standing now within about a second at the
        // capacity it fell to (the queue the fall left is ours, and 90% of that capacity
        // drains a queue of 300 ms in three seconds), where that capacity was measured: what
        // the upload's TCP sent as its round trip grew is no measure (in the lab's starlink it
        // held the cuts above a line that fell from 10 to 5 Mbit/s for a second).
        let floor = if capacity_fell {
            None
        } else if let Some(c) = self.safe_max(now, cfg) {
            Some(0.9 * c)
        } else {
            self.fell_to
                .filter(|(_, _, measured)| *measured)
                .map(|(_, c, _)| drain * c)
        };
        if let Some(floor) = floor.map(|f| f.min(self.rate)) {
            if rate < floor {
                (rate, why) = (floor, Why::SafeFloor);
            }
        }
        (rate, why)
    }

    /// Once a second without high load: a step towards the base rate.
    fn decay(&mut self, now: u64, cfg: &Config, out: &mut Vec<Event>) {
        if now.saturating_sub(self.last_decay) < cfg.decay_every_ns {
            return;
        }
        self.last_decay = now;
        // cake-autorate decays only without bloat: a decay up to a base above the line would
        // feed the queue it is cutting for.
        if self.load(cfg) == Load::High || self.bloated(cfg) {
            return;
        }
        let b = self.bounds.base;
        if self.rate > b {
            self.set(now, (self.rate * 0.99).max(b), Why::Decay, out);
        } else if self.rate < b {
            self.set(now, (self.rate * 1.01).min(b), Why::Decay, out);
        }
    }
}

pub struct Controller {
    cfg: Config,
    down: Dir,
    up: Dir,
    last_sample: Option<u64>,
    stalled_since: Option<u64>,
    at_min: bool,
}

impl Controller {
    /// Starts both directions at their base rate (the shell sets them first).
    pub fn new(cfg: Config) -> Controller {
        Controller {
            down: Dir::new(Direction::Down, cfg.down),
            up: Dir::new(Direction::Up, cfg.up),
            cfg,
            last_sample: None,
            stalled_since: None,
            at_min: false,
        }
    }

    fn side(&self, dir: Direction) -> &Dir {
        match dir {
            Direction::Down => &self.down,
            Direction::Up => &self.up,
        }
    }

    pub fn rate(&self, dir: Direction) -> f64 {
        self.side(dir).rate
    }

    /// A direction's baseline one-way delay to server `source`, ms.
    pub fn baseline(&self, dir: Direction, source: usize) -> Option<f64> {
        self.side(dir).sources.get(source).and_then(|s| s.baseline)
    }

    /// A direction's delay over its baseline as the controller last took it, ms (with
    /// several servers, the least of their latest).
    pub fn delta(&self, dir: Direction) -> Option<f64> {
        self.side(dir).window.back().map(|w| w.1)
    }

    /// The line's rate now per direction (the interface's counters), bits per second.
    pub fn on_load(&mut self, down_bps: f64, up_bps: f64) {
        for (d, bps) in [(&mut self.down, down_bps), (&mut self.up, up_bps)] {
            d.delivered = bps;
            d.readings_seen += 1;
            d.readings.push_back(bps);
            if d.readings.len() > 5 {
                d.readings.pop_front();
            }
        }
    }

    /// One probe's one-way delays at `now`, from server `source` (0 with one; the shell
    /// numbers the servers it probes from 0).
    pub fn on_sample(&mut self, now: u64, source: usize, s: Sample) -> Vec<Event> {
        let mut out = self.sampled(now);
        if let Some(ms) = s.down_ms {
            self.down.sample(now, source, ms, &self.cfg, &mut out);
        }
        if let Some(ms) = s.up_ms {
            self.up.sample(now, source, ms, &self.cfg, &mut out);
        }
        out
    }

    /// One round trip's delay over its reflector's baseline at `now`, ms: the fallback signal,
    /// with no direction of its own. cake-autorate (fping) takes half of it as each direction's
    /// delay, so bloat cuts both. Ours gives all of it to the busiest directions by load (high
    /// over low; an idle direction is never cut by it): a saturated upload's queue does not
    /// cut the download, and a queue while both idle is not the line's to cure. The other
    /// direction still sees the delay, so it does not climb through it.
    pub fn on_round_trip(&mut self, now: u64, delta_ms: f64) -> Vec<Event> {
        let mut out = self.sampled(now);
        let cfg = &self.cfg;
        match cfg.law {
            Law::CakeAutorate => {
                for d in [&mut self.down, &mut self.up] {
                    d.delta(now, delta_ms / 2.0, true, cfg, &mut out);
                }
            }
            Law::Bloatlab => {
                let (ld, lu) = (self.down.load(cfg), self.up.load(cfg));
                let busiest = ld.max(lu);
                for (d, l) in [(&mut self.down, ld), (&mut self.up, lu)] {
                    let may_cut = busiest != Load::Idle && l == busiest;
                    d.delta(now, delta_ms, may_cut, cfg, &mut out);
                }
            }
        }
        out
    }

    /// A sample came: a stall, if any, is over.
    fn sampled(&mut self, now: u64) -> Vec<Event> {
        let mut out = Vec::new();
        self.last_sample = Some(now);
        if self.stalled_since.take().is_some() {
            self.at_min = false;
            out.push(Event::Recovered);
        }
        out
    }

    /// Time passing: decay towards base, stall detection. Call it every 50-200 ms.
    pub fn on_tick(&mut self, now: u64) -> Vec<Event> {
        let mut out = Vec::new();
        let silent = self.last_sample.map_or(0, |t| now.saturating_sub(t));
        if self.last_sample.is_some() && silent >= self.cfg.stall_after_ns {
            if self.stalled_since.is_none() {
                self.stalled_since = Some(now);
                out.push(Event::Stalled);
                for d in [&mut self.down, &mut self.up] {
                    // Never up: a queue that grows past a second delays every answer that
                    // long and reads as silence here, and the rate before the cuts it already
                    // caused is the one that grew it.
                    let safe = d.last_safe.min(d.rate);
                    d.set(now, safe, Why::Stall, &mut out);
                }
            }
            let since = self.stalled_since.expect("just set");
            if let Some(limit) = self.cfg.stall_to_min_ns {
                if !self.at_min && now.saturating_sub(since) >= limit {
                    self.at_min = true;
                    out.push(Event::StalledToMin);
                    for d in [&mut self.down, &mut self.up] {
                        let min = d.bounds.min;
                        d.set(now, min, Why::Stall, &mut out);
                    }
                }
            }
            return out;
        }
        self.down.decay(now, &self.cfg, &mut out);
        self.up.decay(now, &self.cfg, &mut out);
        out
    }
}

#[cfg(test)]
mod tests;
