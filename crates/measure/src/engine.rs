//! The measurement's schedule, sans I/O: on the clock it is given (seconds from the test's
//! start), which phase the test is in (idle, a load stage, the drain after it, done) and when
//! each periodic piece of work falls due. The transports drive it: the bloatlab protocol on
//! threads (`run`), HTTP/2 on tokio (`http_rpm`); they do the work and tell it what only they
//! can see (an RPM stage saturated, every probe of a stage answered). Its tests run on
//! virtual time.

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
pub enum Drain {
    /// A fixed time: the queues empty while the probes go on (the bloatlab protocol's settle,
    /// whose probes also give the clock's second estimate).
    For(f64),
    /// Until every probe sent under the stage has its answer, or `timeout` s after its end:
    /// no probe may finish against the next stage's load (HTTP RPM's sequential stages).
    UntilAnswered { timeout: f64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Period {
    /// Before the first stage: the baseline.
    Idle,
    /// Load stage `i` is under way.
    Loading(usize),
    /// Stage `i` has ended; its queues and probes drain.
    Draining(usize),
    Done,
}

/// One stage as it ran: seconds from the test's start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageTimes {
    pub start: f64,
    pub end: Option<f64>,
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
    /// idle phase ends, each later one once the stage before has drained (`answered`: every
    /// probe sent under it has its answer or gave up); a stage ends at its length.
    pub fn advance(&mut self, t: f64, answered: bool) -> Period {
        if self.done {
            return Period::Done;
        }
        if let Some(i) = self.stages.len().checked_sub(1) {
            let s = &mut self.stages[i];
            if s.end.is_none() && t >= s.start + self.lengths[i] {
                s.end = Some(s.start + self.lengths[i]);
            }
        }
        match self.stages.last().copied() {
            None if t < self.idle => Period::Idle,
            None if self.lengths.is_empty() => self.drained_or(t, self.idle, answered, 0),
            None => self.begin(self.idle, t, answered),
            Some(StageTimes { end: None, .. }) => Period::Loading(self.stages.len() - 1),
            Some(StageTimes { end: Some(end), .. }) => {
                self.drained_or(t, end, answered, self.stages.len() - 1)
            }
        }
    }

    /// Stage `i` ended at `end`: drained by `t`, the next stage begins (or the test is done);
    /// else it is still draining.
    fn drained_or(&mut self, t: f64, end: f64, answered: bool, i: usize) -> Period {
        let drained = match self.drain {
            Drain::For(s) => t >= end + s,
            Drain::UntilAnswered { timeout } => answered || t >= end + timeout,
        };
        if !drained {
            return Period::Draining(i);
        }
        if self.stages.len() >= self.lengths.len() {
            self.done = true;
            return Period::Done;
        }
        self.begin(t, t, answered)
    }

    fn begin(&mut self, start: f64, t: f64, answered: bool) -> Period {
        self.stages.push(StageTimes { start, end: None });
        // A stage of no length ends as it begins (a test with no load).
        self.advance(t, answered)
    }

    /// The stage under way ends at `t` (an RPM stage saturated, or the test was cut short).
    pub fn end_stage(&mut self, t: f64) {
        if let Some(s) = self.stages.last_mut().filter(|s| s.end.is_none()) {
            s.end = Some(t);
        }
    }

    /// When the last stage's load ends, as far as is known at this point: its planned end
    /// until it begins or ends earlier.
    pub fn load_end(&self) -> f64 {
        let planned_start = self.stages.last().map_or(self.idle, |s| s.start);
        let i = self.stages.len().saturating_sub(1);
        match self.stages.last() {
            Some(StageTimes { end: Some(e), .. }) if self.stages.len() == self.lengths.len() => *e,
            _ => planned_start + self.lengths.get(i).copied().unwrap_or(0.0),
        }
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
        // 5 s idle, 10 s load, 2 s settle, ticks every 10 ms.
        let mut s = Schedule::new(5.0, vec![10.0], Drain::For(2.0));
        let mut seen = Vec::new();
        let mut t = 0.0;
        while t < 20.0 {
            let p = s.advance(t, false);
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
                Period::Draining(0),
                Period::Done
            ]
        );
        // The stage's times are the plan's, not the ticks'.
        assert_eq!(
            s.stages(),
            [StageTimes {
                start: 5.0,
                end: Some(15.0)
            }]
        );
        assert_eq!(s.load_end(), 15.0);
    }

    #[test]
    fn a_saturated_stage_ends_early_and_the_settle_follows_it() {
        let mut s = Schedule::new(2.0, vec![20.0], Drain::For(1.0));
        assert_eq!(s.advance(3.0, false), Period::Loading(0));
        assert_eq!(s.load_end(), 22.0);
        s.end_stage(8.5);
        assert_eq!(s.load_end(), 8.5);
        assert_eq!(s.advance(9.0, false), Period::Draining(0));
        assert_eq!(s.advance(9.5, false), Period::Done);
    }

    #[test]
    fn a_test_without_load_idles_then_settles() {
        let mut s = Schedule::new(10.0, vec![0.0], Drain::For(1.0));
        assert_eq!(s.advance(9.99, false), Period::Idle);
        assert_eq!(s.advance(10.0, false), Period::Draining(0));
        assert_eq!(s.advance(11.0, false), Period::Done);
    }

    #[test]
    fn sequential_stages_wait_for_their_probes_or_the_timeout() {
        // Download then upload, 20 s each at most; a stage's probes must come home first.
        let mut s = Schedule::new(
            2.0,
            vec![20.0, 20.0],
            Drain::UntilAnswered { timeout: 10.0 },
        );
        assert_eq!(s.advance(2.004, false), Period::Loading(0));
        s.end_stage(9.0);
        assert_eq!(s.advance(9.01, false), Period::Draining(0));
        assert_eq!(s.advance(12.0, true), Period::Loading(1));
        assert_eq!(s.stages()[1].start, 12.0);
        // The upload runs its full length; its probes never answer: the timeout ends it.
        assert_eq!(s.advance(32.0, false), Period::Draining(1));
        assert_eq!(s.stages()[1].end, Some(32.0));
        assert_eq!(s.advance(41.9, false), Period::Draining(1));
        assert_eq!(s.advance(42.0, false), Period::Done);
        assert_eq!(s.advance(50.0, true), Period::Done);
    }
}
