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

/// A duration as `100ms`, `500us`, `1s` or plain seconds (`0.001`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t.as_str(), 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale <= 3600.0 => Ok(Duration::from_secs_f64(v * scale)),
        _ => Err(format!("`{s}`: want a positive duration such as 1ms, 500us or 0.1s")),
    }
}

impl std::str::FromStr for Pacing {
    type Err = String;
    fn from_str(s: &str) -> Result<Pacing, String> {
        let t = s.trim().to_ascii_lowercase();
        let period = |d: &str| -> Result<Duration, String> {
            let d = parse_duration(d)?;
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
            _ => Err(format!("`{s}`: want auto, fq, timer, timer:PERIOD (e.g. timer:1ms) or burst:PERIOD (e.g. burst:100ms)")),
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
}

/// A sender more than this late (a stall, a stopped process) skips what it missed instead of
/// sending it all at once: catching up on 10 ms is what a timer does, on seconds a burst no
/// pacing meant.
pub const MAX_BEHIND: Duration = Duration::from_millis(10);

impl Schedule {
    pub fn new(start_ns: u64, rate_bps: u64, size: u16, tick: Option<Duration>) -> Schedule {
        let interval_ns = f64::from(size) * 8.0 * 1e9 / rate_bps.max(1) as f64;
        let tick_ns = tick.map_or(0, |d| d.as_nanos() as u64);
        Schedule { start_ns, interval_ns, tick_ns, sent: 0, skipped: 0, max_behind_ns: (MAX_BEHIND.as_nanos() as u64).max(tick_ns) }
    }

    /// Packets whose time is before `t` (packet k is due at start + k x interval).
    fn count_before(&self, t_ns: u64) -> u64 {
        if t_ns <= self.start_ns {
            return 0;
        }
        ((t_ns - self.start_ns) as f64 / self.interval_ns).ceil() as u64
    }

    /// Packets to send at `now`, counting from those already sent: those due by now, or with
    /// a tick, those due before the tick after the current one.
    pub fn due(&mut self, now_ns: u64) -> u64 {
        if now_ns < self.start_ns {
            return 0;
        }
        let horizon = match (now_ns - self.start_ns).checked_div(self.tick_ns) {
            None => now_ns + 1,
            Some(k) => self.start_ns + (k + 1) * self.tick_ns,
        };
        let behind_since = self.start_ns as f64 + (self.sent + self.skipped) as f64 * self.interval_ns;
        if (now_ns as f64) - behind_since > self.max_behind_ns as f64 {
            // Skip to what is due within the last MAX_BEHIND.
            let keep_from = self.count_before(now_ns - self.max_behind_ns);
            self.skipped = keep_from.saturating_sub(self.sent);
        }
        self.count_before(horizon).saturating_sub(self.sent + self.skipped)
    }

    /// `n` more packets went out.
    pub fn sent(&mut self, n: u64) {
        self.sent += n;
    }

    pub fn total_sent(&self) -> u64 {
        self.sent
    }

    /// When the next packet (or the next tick) is due.
    pub fn next_ns(&self) -> u64 {
        let next_packet = self.start_ns + ((self.sent + self.skipped) as f64 * self.interval_ns).ceil() as u64;
        if self.tick_ns == 0 {
            return next_packet;
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
        assert_eq!("timer:1ms".parse::<Pacing>(), Ok(Pacing::Tick(Duration::from_millis(1))));
        assert_eq!("burst:100ms".parse::<Pacing>(), Ok(Pacing::Burst(Duration::from_millis(100))));
        assert_eq!(Pacing::Burst(Duration::from_millis(100)).to_string(), "burst:100ms");
        assert_eq!(Pacing::Tick(Duration::from_micros(250)).to_string(), "timer:250us");
        assert!("burst:5s".parse::<Pacing>().is_err());
        assert!("jitter".parse::<Pacing>().is_err());
        assert_eq!(parse_duration("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_duration("0.001"), Ok(Duration::from_millis(1)));
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
        assert_eq!((s.total_sent(), s.skipped), (12_207, 0), "packets 0..=12206 fall at or before 999.95 ms");
    }

    /// iperf3's `-b` without pacing: 50 Mbit/s in 100 ms periods is 610 packets of 1 KB back to
    /// back, then nothing until the next period.
    #[test]
    fn a_burst_period_sends_its_share_at_each_tick() {
        let mut s = Schedule::new(0, 50_000_000, 1024, Some(Duration::from_millis(100)));
        let first = s.due(0);
        assert_eq!(first, 611, "packets due in [0, 100 ms): 100e6 / 163840 = 610.35");
        s.sent(first);
        assert_eq!(s.next_ns(), 100 * MS);
        assert_eq!(s.due(50 * MS), 0, "nothing between ticks");
        let second = s.due(100 * MS);
        assert_eq!(first + second, 1221);
    }

    #[test]
    fn a_late_sender_catches_up_ten_ms_and_skips_the_rest() {
        let mut s = Schedule::new(0, 8_000_000, 1000, None); // one packet per ms
        let first = s.due(0);
        s.sent(first);
        // Stalled for 50 ms: the last 10 ms of packets go, 39 are skipped.
        let n = s.due(50 * MS);
        assert_eq!((n, s.skipped), (11, 39));
        s.sent(n);
        assert_eq!(s.total_sent() + s.skipped, 51);
        assert_eq!(s.due(50 * MS), 0);
        assert_eq!(s.due(51 * MS), 1);
    }
}
