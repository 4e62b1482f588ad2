//! One-way delays from echo timestamps (client send t1, server receive t2, server send t3,
//! client receive t4; each side's own clock), with a clock offset that moves only when an echo
//! proves it wrong.
//!
//! An echo bounds the offset θ (server minus client): t2 = t1 + θ + up and t4 = t3 - θ + down
//! with both delays at least 0, so t3 - t4 <= θ <= t2 - t1. The estimate starts at the first
//! echo's midpoint and is clamped into each later echo's bounds. A wrong start is corrected by
//! the first fast echo (to within that echo's round trip); a constant error cancels in the
//! controller's delay-over-baseline; clock drift moves it a little at a time; and a server with
//! another clock (a restart on another machine) is followed at once. A per-session estimate
//! from the fastest echoes would move as each session learns it again, and every move reads as
//! delay in one direction.

#[derive(Clone, Debug, Default)]
pub struct OneWay {
    offset_ns: Option<i128>,
}

impl OneWay {
    /// (up, down) one-way delays, ms, each at least 0.
    pub fn delays(&mut self, t1: u64, t2: u64, t3: u64, t4: u64) -> (f64, f64) {
        let (t1, t2, t3, t4) = (t1 as i128, t2 as i128, t3 as i128, t4 as i128);
        let (lo, hi) = (t3 - t4, t2 - t1);
        let theta = match self.offset_ns {
            None => (lo + hi) / 2,
            Some(o) => o.clamp(lo.min(hi), hi.max(lo)),
        };
        self.offset_ns = Some(theta);
        let up = (t2 - t1 - theta).max(0) as f64 / 1e6;
        let down = (t4 - t3 + theta).max(0) as f64 / 1e6;
        (up, down)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// An echo with these true delays through a server clock `theta` ahead (may be negative).
    fn echo(at: u64, up: u64, down: u64, theta: i64) -> (u64, u64, u64, u64) {
        let t2 = (at as i64 + up as i64 + theta) as u64;
        let t3 = t2 + MS / 10;
        let t4 = (t3 as i64 - theta) as u64 + down;
        (at, t2, t3, t4)
    }

    #[test]
    fn a_loaded_first_echo_is_corrected_by_the_first_fast_one_and_then_holds() {
        let mut w = OneWay::default();
        let theta = 5_000 * MS as i64;
        // The first echo meets a 90 ms upload queue: split evenly, the download reads +45 ms.
        let (t1, t2, t3, t4) = echo(0, 95 * MS, 5 * MS, theta);
        let (up, down) = w.delays(t1, t2, t3, t4);
        assert!((up - 50.0).abs() < 0.01 && (down - 50.0).abs() < 0.01);
        // An unloaded echo (5 ms each way) bounds the offset within its 10 ms round trip.
        let (t1, t2, t3, t4) = echo(S, 5 * MS, 5 * MS, theta);
        let (up, down) = w.delays(t1, t2, t3, t4);
        assert!(up <= 10.0 && down <= 10.0, "{up} {down}");
        // From then on a queue in one direction reads in that direction only.
        let (t1, t2, t3, t4) = echo(2 * S, 5 * MS, 85 * MS, theta);
        let (up2, down2) = w.delays(t1, t2, t3, t4);
        assert!((up2 - up).abs() < 0.01, "{up2} vs {up}");
        assert!((down2 - down - 80.0).abs() < 0.01, "{down2} vs {down}");
    }

    #[test]
    fn a_server_with_another_clock_is_followed_at_once() {
        let mut w = OneWay::default();
        for i in 0..10 {
            let (t1, t2, t3, t4) = echo(i * S, 5 * MS, 5 * MS, 7 * S as i64);
            w.delays(t1, t2, t3, t4);
        }
        let (t1, t2, t3, t4) = echo(11 * S, 5 * MS, 5 * MS, -(3 * S as i64));
        let (up, down) = w.delays(t1, t2, t3, t4);
        assert!(up + down <= 10.0 + 1e-6 && up >= 0.0 && down >= 0.0);
    }

    const S: u64 = 1_000_000_000;
}
