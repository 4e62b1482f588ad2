//! How a UDP load's sender spaces its packets, and the schedule that follows. Pure: the
//! sender thread gives the clock.

use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// The sender's pacing (`--pacing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pacing {
    /// `fq` when the egress qdisc paces (is `fq`), else `timer`.
    Auto,
    /// Kernel pacing: the socket's `SO_MAX_PACING_RATE`, which only the `fq` qdisc honours;
    /// the sender hands over 10 ms of packets at a time and fq spaces them.
    Fq,
    /// One packet every size / rate (819 us for 1 KB at 10 Mbit/s).
    Timer,
    /// A timer of this period: each tick sends the packets due until the next one, back to back.
    Tick(Duration),
    /// The on/off sender on purpose (iperf3 `-b` without kernel pacing: every 100 ms, a tenth
    /// of a second's data at line rate). Mechanically a tick; named for what it reproduces.
    Burst(Duration),
}

impl fmt::Display for Pacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pacing::Auto => write!(f, "auto"),
            Pacing::Fq => write!(f, "fq"),
            Pacing::Timer => write!(f, "timer"),
            Pacing::Tick(d) => write!(f, "timer:{}", duration_text(*d)),
            Pacing::Burst(d) => write!(f, "burst:{}", duration_text(*d)),
        }
    }
}

impl Serialize for Pacing {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn duration_text(d: Duration) -> String {
    let us = d.as_micros();
    if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

impl std::str::FromStr for Pacing {
    type Err = String;
    fn from_str(s: &str) -> Result<Pacing, String> {
        let t = s.trim().to_ascii_lowercase();
        let period = |d: &str| -> Result<Duration, String> {
            let d = bloatlab_units::parse_duration(d)?;
            if d < Duration::from_micros(10) || d > Duration::from_secs(1) {
                return Err(format!("`{s}`: the period must be between 10us and 1s"));
            }
            Ok(d)
        };
        match t.split_once(':') {
            None if t == "auto" => Ok(Pacing::Auto),
            None if t == "fq" => Ok(Pacing::Fq),
            None if t == "timer" => Ok(Pacing::Timer),
            Some(("timer", d)) => Ok(Pacing::Tick(period(d)?)),
            Some(("burst", d)) => Ok(Pacing::Burst(period(d)?)),
            _ => Err(format!(
                "`{s}`: want auto, fq, timer, timer:PERIOD (e.g. timer:1ms) or \
                burst:PERIOD (e.g. burst:100ms)"
            )),
        }
    }
}

/// When each packet of a constant-rate stream is due, and how many are due at a given time.
#[derive(Clone, Debug)]
pub struct Schedule {
    start_ns: u64,
    /// Time between packets at the rate, ns (fractional: rounding would drift the rate).
    interval_ns: f64,
    /// 0: each packet at its own time; else the tick period, each tick sending what falls
    /// before the next.
    tick_ns: u64,
    /// Packets handed to the socket so far.
    sent: u64,
    /// Packets given up because the sender fell further behind than `max_behind_ns`.
    pub skipped: u64,
    max_behind_ns: u64,
    /// Timer pacing: packets the sender may still send back to back (a token bucket of
    /// `depth` filled at CATCH_UP times the rate), as of `tokens_at_ns`.
    tokens: f64,
    tokens_at_ns: u64,
    depth: f64,
}

/// A sender more than this late (a stall, a stopped process) skips what it missed instead of
/// sending it all at once: catching up on 10 ms is what a timer does, on seconds a burst no
/// pacing meant.
pub const MAX_BEHIND: Duration = Duration::from_millis(10);

/// A late timer sender catches up at 1.05x the rate, with at most two packets back to back,
/// not with everything it owes at once: a stall of the sender (a busy core) then costs no burst
/// (back to back, one 1 ms bucket held 2.3x the mean at 100 Mbit/s on this 2-core machine; at
/// 1.25x, 15 packets where 12.2 are due, often enough to lift the p99 to 1.23x; at 1.05x the
/// p99 stays at 13, 1.06x, and the peak at 1.15x: BENCHMARKS.md). Catching up on a 10 ms stall
/// takes 200 ms. The slack, two packets or SLACK of them where that is more, lets a sender
/// woken a little late keep the rate: at 1 Gbit/s a packet is due every 8 us, less than one
/// wakeup costs, and two packets a wakeup would cap it near a third of that.
const CATCH_UP: f64 = 1.05;
const SLACK: Duration = Duration::from_micros(100);

impl Schedule {
    pub fn new(start_ns: u64, rate_bps: u64, size: u16, tick: Option<Duration>) -> Schedule {
        let interval_ns = f64::from(size) * 8.0 * 1e9 / rate_bps.max(1) as f64;
        let tick_ns = tick.map_or(0, |d| d.as_nanos() as u64);
        let depth = (SLACK.as_nanos() as f64 / interval_ns).max(2.0);
        Schedule {
            start_ns,
            interval_ns,
            tick_ns,
            sent: 0,
            skipped: 0,
            max_behind_ns: (MAX_BEHIND.as_nanos() as u64).max(tick_ns),
            tokens: depth,
            tokens_at_ns: start_ns,
            depth,
        }
    }

    /// Packets whose time is before `t` (packet k is due at start + k x interval).
    fn count_before(&self, t_ns: u64) -> u64 {
        if t_ns <= self.start_ns {
            return 0;
        }
        ((t_ns - self.start_ns) as f64 / self.interval_ns).ceil() as u64
    }

    /// Packets to send at `now`, counting from those already sent: with a timer those due by
    /// now as far as the catch-up bucket allows; with a tick, those due before the tick after
    /// the current one.
    pub fn due(&mut self, now_ns: u64) -> u64 {
        if now_ns < self.start_ns {
            return 0;
        }
        let horizon = match (now_ns - self.start_ns).checked_div(self.tick_ns) {
            None => now_ns + 1,
            Some(k) => self.start_ns + (k + 1) * self.tick_ns,
        };
        let behind_since =
            self.start_ns as f64 + (self.sent + self.skipped) as f64 * self.interval_ns;
        if (now_ns as f64) - behind_since > self.max_behind_ns as f64 {
            // Skip to what is due within the last MAX_BEHIND.
            let keep_from = self.count_before(now_ns - self.max_behind_ns);
            self.skipped = keep_from.saturating_sub(self.sent);
        }
        let owed = self
            .count_before(horizon)
            .saturating_sub(self.sent + self.skipped);
        if self.tick_ns > 0 {
            return owed;
        }
        let refill = now_ns.saturating_sub(self.tokens_at_ns) as f64 * CATCH_UP / self.interval_ns;
        self.tokens = (self.tokens + refill).min(self.depth);
        self.tokens_at_ns = self.tokens_at_ns.max(now_ns);
        owed.min(self.tokens as u64)
    }

    /// `n` more packets went out.
    pub fn sent(&mut self, n: u64) {
        self.sent += n;
        if self.tick_ns == 0 {
            self.tokens -= n as f64;
        }
    }

    pub fn total_sent(&self) -> u64 {
        self.sent
    }

    /// When the next packet (or the next tick) is due.
    pub fn next_ns(&self) -> u64 {
        let next_packet =
            self.start_ns + ((self.sent + self.skipped) as f64 * self.interval_ns).ceil() as u64;
        if self.tick_ns == 0 {
            let token = self.tokens_at_ns
                + ((1.0 - self.tokens).max(0.0) * self.interval_ns / CATCH_UP).ceil() as u64;
            return next_packet.max(token);
        }
        // The tick that sends it: the last one at or before its time.
        let k = next_packet.saturating_sub(self.start_ns) / self.tick_ns;
        self.start_ns + k * self.tick_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn pacings_and_durations_parse_as_the_help_says() {
        assert_eq!("auto".parse::<Pacing>(), Ok(Pacing::Auto));
        assert_eq!(
            "timer:1ms".parse::<Pacing>(),
            Ok(Pacing::Tick(Duration::from_millis(1)))
        );
        assert_eq!(
            "burst:100ms".parse::<Pacing>(),
            Ok(Pacing::Burst(Duration::from_millis(100)))
        );
        assert_eq!(
            Pacing::Burst(Duration::from_millis(100)).to_string(),
            "burst:100ms"
        );
        assert_eq!(
            Pacing::Tick(Duration::from_micros(250)).to_string(),
            "timer:250us"
        );
        assert!("burst:5s".parse::<Pacing>().is_err());
        assert!("jitter".parse::<Pacing>().is_err());
        assert_eq!(
            "timer:500us".parse::<Pacing>(),
            Ok(Pacing::Tick(Duration::from_micros(500)))
        );
        assert!("timer:0".parse::<Pacing>().is_err() && "timer:0.001".parse::<Pacing>().is_err());
    }

    /// 1 KB at 100 Mbit/s: a packet every 81.92 us (the reference's 819 us is at 10 Mbit/s).
    #[test]
    fn timer_sends_one_packet_per_interval() {
        let mut s = Schedule::new(0, 100_000_000, 1024, None);
        assert_eq!(s.due(0), 1);
        s.sent(1);
        assert_eq!(s.next_ns(), 81_920);
        assert_eq!(s.due(81_919), 0);
        assert_eq!(s.due(81_920), 1);
        s.sent(1);
        // Woken every 50 us for a second: exactly the rate, nothing skipped.
        for t in (100_000..1_000_000_000).step_by(50_000) {
            let n = s.due(t);
            s.sent(n);
        }
        assert_eq!(
            (s.total_sent(), s.skipped),
            (12_207, 0),
            "packets 0..=12206 fall at or before 999.95 ms"
        );
    }

    /// iperf3's `-b` without pacing: 50 Mbit/s in 100 ms periods is 610 packets of 1 KB back to
    /// back, then nothing until the next period.
    #[test]
    fn a_burst_period_sends_its_share_at_each_tick() {
        let mut s = Schedule::new(0, 50_000_000, 1024, Some(Duration::from_millis(100)));
        let first = s.due(0);
        assert_eq!(
            first, 611,
            "packets due in [0, 100 ms): 100e6 / 163840 = 610.35"
        );
        s.sent(first);
        assert_eq!(s.next_ns(), 100 * MS);
        assert_eq!(s.due(50 * MS), 0, "nothing between ticks");
        let second = s.due(100 * MS);
        assert_eq!(first + second, 1221);
    }

    /// One packet per ms, stalled for 50 ms: what is more than 10 ms late is skipped (39); of
    /// the 11 owed, two go at once and the rest at 1.05x the rate, one every 0.952 ms.
    #[test]
    fn a_late_sender_skips_past_ten_ms_and_catches_up_gently() {
        let mut s = Schedule::new(0, 8_000_000, 1000, None);
        assert_eq!(s.due(0), 1);
        s.sent(1);
        assert_eq!((s.due(50 * MS), s.skipped), (2, 39));
        s.sent(2);
        assert_eq!(
            s.due(50 * MS + 952_380),
            0,
            "the next owed packet waits 1 / 1.05 ms"
        );
        assert_eq!(s.next_ns(), 50 * MS + 952_381);
        assert_eq!(s.due(50 * MS + 952_381), 1);
        s.sent(1);
        // 11 due at 50 ms and one more each ms after; 2 sent at 50 ms and 1.05 a ms after:
        // level about 160 ms later (9 behind, made up at 0.05 a ms).
        let mut t = 50 * MS + 952_381;
        while s.total_sent() + s.skipped < t / MS + 1 {
            t += 10_000;
            let n = s.due(t);
            s.sent(n);
        }
        assert!(
            (205 * MS..=215 * MS).contains(&t),
            "caught up at {t} ns, {} sent, {} skipped",
            s.total_sent(),
            s.skipped
        );
    }

    /// 100 Mbit/s of 1 KB packets (12.2 per ms), the sender stalled for 5 ms twice a second:
    /// no millisecond carries more than 1.05x its share and the two packets of slack (14.8),
    /// and the second's count is the rate's.
    #[test]
    fn stalls_cost_no_burst_and_no_packets() {
        let mut s = Schedule::new(0, 100_000_000, 1024, None);
        let mut per_ms = vec![0u64; 1000];
        let mut t = 0;
        while t < 1_000 * MS {
            let n = s.due(t);
            s.sent(n);
            per_ms[(t / MS) as usize] += n;
            let stalled = (t / MS) % 500 == 100;
            t = if stalled {
                t + 5 * MS
            } else {
                s.next_ns().max(t + 1_000)
            };
        }
        let peak = *per_ms.iter().max().unwrap();
        assert!(peak <= 15, "12.2 x 1.05 + 2 = 14.8 packets per ms: {peak}");
        assert!(
            (12_207..=12_208).contains(&s.total_sent()) && s.skipped == 0,
            "1 s at 100 Mbit/s: {} sent, {} skipped",
            s.total_sent(),
            s.skipped
        );
    }

    /// 1 Gbit/s of 1 KB packets (one every 8.2 us) from a sender that wakes only every 50 us:
    /// 100 us of slack (12 packets) a wakeup keeps the rate with nothing skipped; two packets a
    /// wakeup would have sent a third of it.
    #[test]
    fn a_fast_rate_keeps_up_with_coarse_wakeups() {
        let mut s = Schedule::new(0, 1_000_000_000, 1024, None);
        let mut t = 0;
        while t < 1_000 * MS {
            let n = s.due(t);
            s.sent(n);
            t += 50_000;
        }
        assert_eq!(s.skipped, 0);
        assert!(
            s.total_sent() >= 122_000,
            "{} of 122 070 sent",
            s.total_sent()
        );
    }
}
