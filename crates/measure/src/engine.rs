//! The measurement's schedule, sans I/O: on the clock it is given (seconds from the test's
//! start), which phase the test is in (idle, a load stage, the drain after it, done) and when
//! each periodic piece of work falls due. The transports drive it: the bloatlab protocol on
//! threads (`run`), HTTP/2 on tokio (`http_rpm`); they do the work and tell it what only they
//! can see (an RPM stage saturated, every probe of a stage answered). Its tests run on
//! virtual time.

use bloatlab_analyze::rpm;
use bloatlab_result::{RpmRun, Series};

/// How a periodic deadline moves on when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// On a fixed grid: a loop that fell behind fires once per missed slot.
    Grid,
    /// On the grid, but a loop that fell behind skips to one period after now.
    GridSkip,
    /// One period after it fired.
    FromNow,
}

/// A periodic deadline.
#[derive(Clone, Copy, Debug)]
pub struct Timer {
    next: f64,
    every: f64,
    pace: Pace,
}

impl Timer {
    pub fn new(first: f64, every: f64, pace: Pace) -> Timer {
        Timer {
            next: first,
            every,
            pace,
        }
    }

    pub fn next(&self) -> f64 {
        self.next
    }

    pub fn is_due(&self, t: f64) -> bool {
        t >= self.next
    }

    /// Whether it is due at `t`; if so it moves on to its next deadline.
    pub fn fire(&mut self, t: f64) -> bool {
        if !self.is_due(t) {
            return false;
        }
        match self.pace {
            Pace::Grid => self.next += self.every,
            Pace::GridSkip => {
                self.next += self.every;
                if self.next < t {
                    self.next = t + self.every;
                }
            }
            Pace::FromNow => self.next = t + self.every,
        }
        true
    }

    /// Due again at `t` (a new stage's first interval).
    pub fn restart(&mut self, t: f64) {
        self.next = t;
    }
}

/// What follows a load stage before the next one begins or the test ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drain {
    /// The stage's load runs on, without new probes, until every probe sent under it has its
    /// answer or gave up, at most this long (the longest probe deadline): the probes still out
    /// when a load ends are its slowest, and cutting them off would make it read better than it
    /// was. Nor may one finish against the next stage's load.
    pub answers: f64,
    /// Then the load stops and its queues drain for this long while the probes that run
    /// throughout go on (the bloatlab protocol's settle, which gives the clock's second
    /// estimate).
    pub settle: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// Before the first stage: the baseline.
    Idle,
    /// Load stage `i` is under way.
    Loading(usize),
    /// Stage `i` has ended: its load runs on, without new probes, for the last answers.
    Answering(usize),
    /// Stage `i`'s load has stopped; its queues drain.
    Settling(usize),
    Done,
}

/// One stage as it ran: seconds from the test's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageTimes {
    pub start: f64,
    /// Where its length counts from: its start, or later while its load was still coming up
    /// (`hold`).
    pub counted_from: f64,
    /// When its probing ended (saturated, cut short, or its length ran out).
    pub end: Option<f64>,
    /// When its load stopped: every probe answered, or the deadline passed.
    pub stopped: Option<f64>,
}

/// The phases of a test: an idle baseline, then load stages one after another, each followed
/// by its drain.
#[derive(Clone, Debug)]
pub struct Schedule {
    idle: f64,
    lengths: Vec<f64>,
    drain: Drain,
    stages: Vec<StageTimes>,
    done: bool,
}

impl Schedule {
    /// `idle` s of baseline, then one stage per entry of `lengths` (each its longest), each
    /// followed by `drain`.
    pub fn new(idle: f64, lengths: Vec<f64>, drain: Drain) -> Schedule {
        Schedule {
            idle,
            lengths,
            drain,
            stages: Vec::new(),
            done: false,
        }
    }

    /// The stages begun so far.
    pub fn stages(&self) -> &[StageTimes] {
        &self.stages
    }

    /// Moves the phases on to `t` and says where the test is. The first stage begins when the
    /// idle phase ends, each later one once the stage before has drained; a stage ends at its
    /// length. `answered`: every probe sent under the stage has its answer or gave up.
    pub fn advance(&mut self, t: f64, answered: bool) -> Period {
        if self.done {
            return Period::Done;
        }
        let Some(i) = self.stages.len().checked_sub(1) else {
            return if t < self.idle {
                Period::Idle
            } else {
                self.begin(self.idle, t, answered)
            };
        };
        let (length, drain) = (self.lengths[i], self.drain);
        let s = &mut self.stages[i];
        if s.end.is_none() && t >= s.counted_from + length {
            s.end = Some(s.counted_from + length);
        }
        let Some(end) = s.end else {
            return Period::Loading(i);
        };
        if s.stopped.is_none() {
            // A stage without load (length 0) has no probes of its own to wait for.
            if length > 0.0 && !answered && t < end + drain.answers {
                return Period::Answering(i);
            }
            s.stopped = Some(if answered || length == 0.0 {
                t.max(end)
            } else {
                end + drain.answers
            });
        }
        let stopped = s.stopped.unwrap_or(end);
        if t < stopped + drain.settle {
            return Period::Settling(i);
        }
        if self.stages.len() >= self.lengths.len() {
            self.done = true;
            return Period::Done;
        }
        self.begin(t, t, answered)
    }

    fn begin(&mut self, start: f64, t: f64, answered: bool) -> Period {
        if self.lengths.is_empty() {
            self.done = true;
            return Period::Done;
        }
        self.stages.push(StageTimes {
            start,
            counted_from: start,
            end: None,
            stopped: None,
        });
        // A stage of no length ends as it begins (a test with no load).
        self.advance(t, answered)
    }

    /// Whether at `t` the stage under way has ended and its load waits for its probes' answers:
    /// only then does `advance` need to know whether they are in (a driver skips the looking).
    pub fn awaits_answers(&self, t: f64) -> bool {
        let Some(i) = self.stages.len().checked_sub(1) else {
            return false;
        };
        let s = &self.stages[i];
        !self.done
            && s.stopped.is_none()
            && (s.end.is_some() || t >= s.counted_from + self.lengths[i])
    }

    /// The stage under way counts its length from no earlier than `t`: its load is not up yet
    /// (a flow still in its handshake), and a load that ran for less than its length would read
    /// as lighter than it was. The transport bounds how long it holds.
    pub fn hold(&mut self, t: f64) {
        if let Some(s) = self.stages.last_mut().filter(|s| s.end.is_none()) {
            s.counted_from = s.counted_from.max(t);
        }
    }

    /// The stage under way ends at `t` (an RPM stage saturated, or the test was cut short).
    pub fn end_stage(&mut self, t: f64) {
        if let Some(s) = self.stages.last_mut().filter(|s| s.end.is_none()) {
            s.end = Some(t);
        }
    }

    /// When the last stage's load ends, as far as is known at this point: its length from
    /// where it counts (its planned start until it begins, later while held) until it ends.
    pub fn load_end(&self) -> f64 {
        let counted_from = self.stages.last().map_or(self.idle, |s| s.counted_from);
        let i = self.stages.len().saturating_sub(1);
        match self.stages.last() {
            Some(StageTimes { end: Some(e), .. }) if self.stages.len() == self.lengths.len() => *e,
            _ => counted_from + self.lengths.get(i).copied().unwrap_or(0.0),
        }
    }

    /// When the test ends, as far as is known at this point: the last stage's load end, the
    /// time its probes took to answer (once known; none before), and the settle.
    pub fn end(&self) -> f64 {
        let answering = match self.stages.last() {
            Some(s) if self.stages.len() == self.lengths.len() => {
                s.stopped.zip(s.end).map_or(0.0, |(stop, end)| stop - end)
            }
            _ => 0.0,
        };
        self.load_end() + answering + self.drain.settle
    }
}

/// One foreign probe (a new connection): when it was sent (s from the test's start) and its TCP
/// handshake, TLS handshake (where there is one) and request times (ms); `None` for a part that
/// failed or timed out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ForeignProbe {
    pub sent: f64,
    pub tcp: Option<f64>,
    pub tls: Option<f64>,
    pub request: Option<f64>,
}

/// RPM's probes as they answered, whatever carried them: what the ramp's responsiveness and the
/// result file's series are made of.
#[derive(Clone, Debug, Default)]
pub struct RpmProbes {
    /// Over TLS the handshake is a foreign term of its own.
    pub tls: bool,
    /// Whether the transport has self probes (HTTP/1.1 has none: the foreign term alone).
    pub self_probes: bool,
    pub foreign: Vec<ForeignProbe>,
    /// Self probes (a request on a load connection): sent (s), time (ms) or `None` (lost).
    pub loaded: Vec<(f64, Option<f64>)>,
}

impl RpmProbes {
    /// The draft's responsiveness of the probes sent since `since` (s) that have answered.
    pub fn responsiveness(&self, since: f64) -> Option<f64> {
        let recent: Vec<&ForeignProbe> = self.foreign.iter().filter(|f| f.sent >= since).collect();
        let pick = |part: fn(&ForeignProbe) -> Option<f64>| -> Vec<f64> {
            recent.iter().filter_map(|f| part(f)).collect()
        };
        let (tcp, tls, request) = (pick(|f| f.tcp), pick(|f| f.tls), pick(|f| f.request));
        let loaded: Vec<f64> = self
            .loaded
            .iter()
            .filter(|l| l.0 >= since)
            .filter_map(|l| l.1)
            .collect();
        let terms: Vec<&[f64]> = if self.tls {
            vec![&tcp, &tls, &request]
        } else {
            vec![&tcp, &request]
        };
        rpm::rpm(&terms, self.self_probes.then_some(loaded.as_slice())).map(|x| x.0)
    }

    /// The series the summary reads, in the order the probes were sent: "rpm foreign-connect",
    /// "rpm foreign-tls" (over TLS), "rpm foreign-request" and "rpm loaded" (with self probes).
    pub fn series(&self) -> Vec<Series> {
        let latency = Series::latency;
        let mut foreign = self.foreign.clone();
        foreign.sort_by(|a, b| a.sent.total_cmp(&b.sent));
        let part = |f: fn(&ForeignProbe) -> Option<f64>| -> Vec<(f64, Option<f64>)> {
            foreign.iter().map(|p| (p.sent, f(p))).collect()
        };
        let mut out = vec![latency("rpm foreign-connect", part(|p| p.tcp))];
        if self.tls {
            out.push(latency("rpm foreign-tls", part(|p| p.tls)));
        }
        out.push(latency("rpm foreign-request", part(|p| p.request)));
        if self.self_probes {
            let mut loaded = self.loaded.clone();
            loaded.sort_by(|a, b| a.0.total_cmp(&b.0));
            out.push(latency("rpm loaded", loaded));
        }
        out
    }
}

/// The responsiveness draft's load ramp over one stage (-09 section 5.4): one load connection
/// per direction at first and one more at the end of every interval, up to MNP; each interval
/// ends with the goodput it moved and the responsiveness of the last MAD intervals' probes,
/// and the stage has its answer once goodput and then responsiveness are saturated. The draft
/// adds load whether or not goodput still grows: on a full link the added connections are what
/// shows how much the path buffers (section 5.1.3).
#[derive(Clone, Debug)]
pub struct RpmRamp {
    start: f64,
    interval: f64,
    next: f64,
    /// When the last interval ended and the goodput bytes per direction it ended with.
    last: (f64, [Option<u64>; 2]),
    connections: u32,
    saturation: rpm::Saturation,
    saturated: bool,
}

impl RpmRamp {
    /// MNP: the most load connections per direction.
    pub const MAX_CONNECTIONS: u32 = 16;

    /// A ramp over a stage that begins at `start`, with intervals of `interval` s.
    pub fn new(start: f64, interval: f64) -> RpmRamp {
        RpmRamp {
            start,
            interval,
            next: start + interval,
            last: (start, [None, None]),
            connections: 1,
            saturation: rpm::Saturation::new(interval),
            saturated: false,
        }
    }

    /// Load connections per direction the stage should have by now.
    pub fn connections(&self) -> u32 {
        self.connections
    }

    /// When the current interval ends.
    pub fn next(&self) -> f64 {
        self.next
    }

    pub fn is_due(&self, t: f64) -> bool {
        !self.saturated && t >= self.next
    }

    /// Where the probes that count at `t` begin: the last MAD intervals of the stage.
    pub fn window_start(&self, t: f64) -> f64 {
        (t - self.interval * rpm::MAD as f64).max(self.start)
    }

    /// Ends the interval due at `t` with the goodput bytes each direction has moved in the stage
    /// so far (`None` for a direction without load), the probes answered so far, and the load
    /// connections per direction that ran in it: the interval's goodput and the responsiveness
    /// of the last MAD intervals' probes go to the draft's saturation test. True when the stage
    /// has its answer; otherwise the next interval runs with one more connection per direction.
    pub fn end_interval(
        &mut self,
        t: f64,
        bytes: [Option<u64>; 2],
        probes: &RpmProbes,
        connections: Option<u32>,
    ) -> bool {
        self.next += self.interval;
        let (since, before) = self.last;
        let secs = (t - since).max(1e-3);
        let [down, up] = [0, 1].map(|d| {
            bytes[d].map(|b| b.saturating_sub(before[d].unwrap_or(0)) as f64 * 8.0 / 1e6 / secs)
        });
        self.last = (t, bytes);
        let responsiveness = probes.responsiveness(self.window_start(t));
        self.saturated = self
            .saturation
            .interval(t, down, up, responsiveness, connections);
        if !self.saturated {
            self.connections = (self.connections + 1).min(Self::MAX_CONNECTIONS);
        }
        self.saturated
    }

    /// The run so far, as the result file records it.
    pub fn run(&self) -> &RpmRun {
        self.saturation.run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_keep_their_grid_skip_ahead_or_count_from_now() {
        let mut grid = Timer::new(0.1, 0.1, Pace::Grid);
        let mut skip = Timer::new(0.1, 0.1, Pace::GridSkip);
        let mut now = Timer::new(0.1, 0.1, Pace::FromNow);
        assert!(!grid.fire(0.05) && !skip.fire(0.05) && !now.fire(0.05));
        // A loop 0.25 s late: the grid owes two more slots, the others look ahead from now.
        assert!(grid.fire(0.35) && skip.fire(0.35) && now.fire(0.35));
        assert!((grid.next() - 0.2).abs() < 1e-9);
        assert!((skip.next() - 0.45).abs() < 1e-9);
        assert!((now.next() - 0.45).abs() < 1e-9);
        assert!(grid.fire(0.35) && grid.fire(0.35) && !grid.fire(0.35));
    }

    #[test]
    fn one_load_stage_then_a_fixed_settle_as_the_bloatlab_protocol_runs() {
        // 5 s idle, 10 s load, 2 s settle, ticks every 10 ms; no probes on the load.
        let drain = Drain {
            answers: 5.0,
            settle: 2.0,
        };
        let mut s = Schedule::new(5.0, vec![10.0], drain);
        let mut seen = Vec::new();
        let mut t = 0.0;
        while t < 20.0 {
            let p = s.advance(t, true);
            if seen.last() != Some(&p) {
                seen.push(p);
            }
            t += 0.01;
        }
        assert_eq!(
            seen,
            [
                Period::Idle,
                Period::Loading(0),
                Period::Settling(0),
                Period::Done
            ]
        );
        // The stage's times are the plan's, not the ticks' (the load stops at the first tick
        // after its end).
        let st = s.stages()[0];
        assert_eq!((st.start, st.end), (5.0, Some(15.0)));
        assert!(st.stopped.unwrap() - 15.0 < 0.011);
        assert_eq!(s.load_end(), 15.0);
        assert!(s.end() - 17.0 < 0.011);
    }

    #[test]
    fn a_stage_held_while_its_load_comes_up_runs_its_length_from_then() {
        let drain = Drain {
            answers: 0.0,
            settle: 2.0,
        };
        // 5 s idle, a 3 s load whose flows took 3.5 s to open (a starved host, a long path).
        let mut s = Schedule::new(5.0, vec![3.0], drain);
        assert_eq!(s.advance(5.0, true), Period::Loading(0));
        let mut t = 5.0;
        while t < 8.5 {
            s.hold(t);
            assert_eq!(s.advance(t, true), Period::Loading(0), "held at {t}");
            t += 0.01;
        }
        // Up at 8.5 s: three seconds of load from there, not the half second left of the plan.
        assert_eq!(s.advance(11.4, true), Period::Loading(0));
        assert!((s.load_end() - 11.5).abs() < 0.011);
        assert_eq!(s.advance(11.6, true), Period::Settling(0));
        let st = s.stages()[0];
        assert_eq!(
            st.start, 5.0,
            "the load phase still begins when the idle one ends"
        );
        assert!((st.end.unwrap() - 11.5).abs() < 0.011);
        // A hold after the stage ended moves nothing.
        s.hold(12.0);
        assert!((s.load_end() - 11.5).abs() < 0.011);
        // Stopped at the 11.6 s tick, then the 2 s settle.
        assert!((s.end() - 13.6).abs() < 0.011);
    }

    #[test]
    fn a_loads_last_probes_answer_before_it_stops_within_their_deadline() {
        let drain = Drain {
            answers: 5.0,
            settle: 2.0,
        };
        let mut s = Schedule::new(2.0, vec![20.0], drain);
        assert_eq!(s.advance(3.0, false), Period::Loading(0));
        assert_eq!(s.end(), 24.0);
        assert!(!s.awaits_answers(8.0));
        s.end_stage(8.5);
        assert_eq!(s.load_end(), 8.5);
        assert!(s.awaits_answers(8.6));
        // Probes still out: the load runs on for them.
        assert_eq!(s.advance(9.0, false), Period::Answering(0));
        assert_eq!(s.advance(10.2, false), Period::Answering(0));
        // The last answer came at 10.3 s: the load stops, the queues drain.
        assert_eq!(s.advance(10.3, true), Period::Settling(0));
        assert_eq!(s.stages()[0].stopped, Some(10.3));
        assert!(!s.awaits_answers(10.4));
        assert!((s.end() - 12.3).abs() < 1e-9);
        assert_eq!(s.advance(12.2, true), Period::Settling(0));
        assert_eq!(s.advance(12.3, true), Period::Done);
        // A probe that never answers holds the load at most its deadline.
        let mut s = Schedule::new(2.0, vec![20.0], drain);
        assert_eq!(s.advance(21.9, false), Period::Loading(0));
        assert_eq!(s.advance(26.9, false), Period::Answering(0));
        assert_eq!(s.advance(27.0, false), Period::Settling(0));
        assert_eq!(s.stages()[0].stopped, Some(27.0));
        assert_eq!(s.advance(29.0, false), Period::Done);
    }

    #[test]
    fn a_test_without_load_idles_then_settles() {
        let drain = Drain {
            answers: 5.0,
            settle: 1.0,
        };
        let mut s = Schedule::new(10.0, vec![0.0], drain);
        assert_eq!(s.advance(9.99, false), Period::Idle);
        // Nothing was loaded, so nothing is waited for.
        assert_eq!(s.advance(10.0, false), Period::Settling(0));
        assert_eq!(s.advance(11.0, false), Period::Done);
    }

    #[test]
    fn sequential_stages_wait_for_their_probes_or_the_timeout() {
        // Download then upload, 20 s each at most; a stage's probes must come home first.
        let drain = Drain {
            answers: 10.0,
            settle: 0.0,
        };
        let mut s = Schedule::new(2.0, vec![20.0, 20.0], drain);
        assert_eq!(s.advance(2.004, false), Period::Loading(0));
        s.end_stage(9.0);
        assert_eq!(s.advance(9.01, false), Period::Answering(0));
        assert_eq!(s.advance(12.0, true), Period::Loading(1));
        assert_eq!(s.stages()[1].start, 12.0);
        // The upload runs its full length; its probes never answer: the timeout ends it.
        assert_eq!(s.advance(32.0, false), Period::Answering(1));
        assert_eq!(s.stages()[1].end, Some(32.0));
        assert_eq!(s.advance(41.9, false), Period::Answering(1));
        assert_eq!(s.advance(42.0, false), Period::Done);
        assert_eq!(s.advance(50.0, true), Period::Done);
    }

    /// Probes sent every 0.1 s from `from` to `to`, each part taking `ms`.
    fn probes(from: f64, to: f64, ms: f64) -> RpmProbes {
        let mut p = RpmProbes {
            self_probes: true,
            ..RpmProbes::default()
        };
        for k in 0..((to - from) * 10.0).round() as u32 {
            let t = from + f64::from(k) * 0.1;
            p.foreign.push(ForeignProbe {
                sent: t,
                tcp: Some(ms),
                tls: None,
                request: Some(ms),
            });
            p.loaded.push((t, Some(ms)));
        }
        p
    }

    #[test]
    fn the_ramp_adds_a_connection_each_interval_until_the_answer_and_never_past_mnp() {
        let mut r = RpmRamp::new(2.0, 1.0);
        assert_eq!((r.connections(), r.next()), (1, 3.0));
        assert!(!r.is_due(2.99) && r.is_due(3.0));
        // Goodput that keeps growing (10 Mbit/s more each interval) never saturates: one more
        // connection per interval.
        let p = probes(2.0, 30.0, 100.0);
        let mut bytes = 0u64;
        for i in 1..=20u32 {
            let t = 2.0 + f64::from(i);
            assert!(r.is_due(t));
            assert_eq!(r.window_start(t), (t - 4.0).max(2.0));
            bytes += u64::from(i) * 10_000_000 / 8;
            let b = Some(bytes);
            assert!(!r.end_interval(t, [b, b], &p, Some(r.connections())));
            assert_eq!(r.connections(), (i + 1).min(16));
        }
        let run = r.run();
        assert_eq!(run.intervals.len(), 20);
        assert_eq!(run.intervals[15].load_connections, Some(16));
        // Each interval's goodput from its bytes; 100 ms probes are 600 RPM.
        assert!((run.intervals[2].down_mbps.unwrap() - 30.0).abs() < 1e-9);
        assert!((run.intervals[2].responsiveness.unwrap() - 600.0).abs() < 1e-6);
        // Steady goodput (20 down, 5 up), then steady responsiveness: the answer; no more load,
        // no more intervals.
        let mut r = RpmRamp::new(0.0, 1.0);
        let mut t = 0.0;
        let answered = loop {
            t += 1.0;
            let b = [Some((t * 20e6 / 8.0) as u64), Some((t * 5e6 / 8.0) as u64)];
            if r.end_interval(t, b, &probes(0.0, t, 50.0), Some(r.connections())) {
                break t;
            }
            assert!(t < 20.0, "never saturated");
        };
        // Goodput: MAD intervals for a moving average, MAD averages for the test (t = 7);
        // responsiveness: MAD values from then on (t = 10).
        assert_eq!(answered, 10.0);
        assert_eq!(r.connections(), 10);
        assert!(!r.is_due(100.0));
    }

    #[test]
    fn responsiveness_takes_the_window_and_its_series_keep_every_probe() {
        let mut p = probes(0.0, 2.0, 200.0);
        p.foreign.extend(probes(2.0, 4.0, 50.0).foreign);
        p.loaded.extend(probes(2.0, 4.0, 50.0).loaded);
        // A lost self probe is no time at all.
        p.loaded.push((3.05, None));
        assert!((p.responsiveness(2.0).unwrap() - 1200.0).abs() < 1e-6);
        // From the start: between the slow probes' 300 RPM and the fast ones' 1200.
        let all = p.responsiveness(0.0).unwrap();
        assert!(all > 300.0 && all < 1200.0, "{all}");
        let names: Vec<String> = p.series().into_iter().map(|s| s.name).collect();
        assert_eq!(
            names,
            ["rpm foreign-connect", "rpm foreign-request", "rpm loaded"]
        );
        let loaded = &p.series()[2].samples;
        assert_eq!(loaded.len(), 41);
        assert!(loaded.windows(2).all(|w| w[0].0 <= w[1].0));
        // Over TLS its handshake is a series and a term of its own.
        p.tls = true;
        assert_eq!(p.series().len(), 4);
        assert_eq!(p.responsiveness(2.0), None, "no TLS times: no foreign term");
    }
}
