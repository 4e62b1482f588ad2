//! COBALT, CAKE's per-queue AQM: CoDel's control law with a gradual count decay, and BLUE for
//! flows that do not respond (sch_cake.c `cobalt_*`). Times are signed nanoseconds, as ktime.

/// Per-tin parameters (`struct cobalt_params`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CobaltParams {
    pub interval: i64,
    pub target: i64,
    pub mtu_time: i64,
    /// BLUE's steps, as fractions of 2^32.
    pub p_inc: u32,
    pub p_dec: u32,
}

impl CobaltParams {
    pub fn new(target_ns: u64, interval_ns: u64, mtu_time_ns: u64) -> CobaltParams {
        // 1/256 and 1/4096 (cake_set_rate).
        CobaltParams {
            interval: interval_ns as i64,
            target: target_ns as i64,
            mtu_time: mtu_time_ns as i64,
            p_inc: 1 << 24,
            p_dec: 1 << 20,
        }
    }
}

/// Per-flow state (`struct cobalt_vars`), zeroed as the kernel's: `rec_inv_sqrt` starts at 0,
/// so a flow that has never signalled schedules its first signal at once on entering the
/// dropping state (drop_next = now + interval x 0) and signals on its next packet above
/// target. Once its count has decayed back to 0 the cache's 1.0 applies: now + interval.
#[derive(Clone, Copy, Debug, Default)]
pub struct CobaltVars {
    pub count: u32,
    rec_inv_sqrt: u32,
    pub drop_next: i64,
    blue_timer: i64,
    pub p_drop: u32,
    pub dropping: bool,
    pub ecn_marked: bool,
}

/// 1/sqrt(count) for count < 16, each refined by four Newton steps from the previous one, with
/// entries 0 and 1 at 1.0 (`cobalt_cache_init`).
fn inv_sqrt_cache() -> &'static [u32; 16] {
    static CACHE: std::sync::OnceLock<[u32; 16]> = std::sync::OnceLock::new();
    CACHE.get_or_init(|| {
        let mut c = [0u32; 16];
        let mut v = !0u32;
        c[0] = v;
        for (count, slot) in c.iter_mut().enumerate().skip(1) {
            for _ in 0..4 {
                v = newton_step(v, count as u32);
            }
            *slot = v;
        }
        c
    })
}

/// `new = y/2 * (3 - count * y^2)` in Q0.32, with the kernel's shifts and wrapping.
fn newton_step(invsqrt: u32, count: u32) -> u32 {
    let invsqrt2 = (invsqrt as u64 * invsqrt as u64) >> 32;
    let val = (3u64 << 32).wrapping_sub((count as u64).wrapping_mul(invsqrt2)) >> 2;
    (val.wrapping_mul(invsqrt as u64) >> (32 - 2 + 1)) as u32
}

/// t + interval / sqrt(count): `reciprocal_scale`, whose value argument is 32 bits wide.
fn control(t: i64, interval: i64, rec_inv_sqrt: u32) -> i64 {
    t + ((interval as u32 as u64 * rec_inv_sqrt as u64) >> 32) as i64
}

impl CobaltVars {
    fn invsqrt(&mut self) {
        self.rec_inv_sqrt = if self.count < 16 {
            inv_sqrt_cache()[self.count as usize]
        } else {
            newton_step(self.rec_inv_sqrt, self.count)
        };
    }

    /// A packet of this flow was dropped because the qdisc was full. True when BLUE turned on.
    pub fn queue_full(&mut self, p: &CobaltParams, now: i64) -> bool {
        let mut up = false;
        if now - self.blue_timer > p.target {
            up = self.p_drop == 0;
            self.p_drop = self.p_drop.checked_add(p.p_inc).unwrap_or(!0);
            self.blue_timer = now;
        }
        self.dropping = true;
        self.drop_next = now;
        if self.count == 0 {
            self.count = 1;
        }
        up
    }

    /// The queue was serviced and found empty. True when BLUE turned off.
    pub fn queue_empty(&mut self, p: &CobaltParams, now: i64) -> bool {
        let mut down = false;
        if self.p_drop != 0 && now - self.blue_timer > p.target {
            self.p_drop = self.p_drop.saturating_sub(p.p_dec);
            self.blue_timer = now;
            down = self.p_drop == 0;
        }
        self.dropping = false;
        if self.count != 0 && now - self.drop_next >= 0 {
            self.count -= 1;
            self.invsqrt();
            self.drop_next = control(self.drop_next, p.interval, self.rec_inv_sqrt);
        }
        down
    }

    /// Judges a freshly dequeued packet: `Signal::Drop` to drop it. `ect` says whether it can
    /// carry a CE mark instead; `blue_draw` is a uniform u32 for BLUE's coin; `bulk_flows` is
    /// the tin's bulk-flow count in ingress mode, else 0.
    pub fn should_drop(
        &mut self,
        p: &CobaltParams,
        now: i64,
        sojourn: i64,
        ect: bool,
        blue_draw: u32,
        bulk_flows: u32,
    ) -> Signal {
        let mut schedule = now - self.drop_next;
        let over_target = sojourn > p.target
            && sojourn > p.mtu_time * bulk_flows as i64 * 2
            && sojourn > p.mtu_time * 4;
        let next_due = self.count != 0 && schedule >= 0;
        let mut drop = false;
        self.ecn_marked = false;
        if over_target {
            if !self.dropping {
                self.dropping = true;
                self.drop_next = control(now, p.interval, self.rec_inv_sqrt);
            }
            if self.count == 0 {
                self.count = 1;
            }
        } else if self.dropping {
            self.dropping = false;
        }
        if next_due && self.dropping {
            // Mark if the packet can carry it, else drop.
            self.ecn_marked = ect;
            drop = !ect;
            self.count = self.count.checked_add(1).unwrap_or(self.count);
            self.invsqrt();
            self.drop_next = control(self.drop_next, p.interval, self.rec_inv_sqrt);
            schedule = now - self.drop_next;
        } else {
            // Below target: one count less per control interval that has passed.
            let mut due = next_due;
            while due {
                self.count -= 1;
                self.invsqrt();
                self.drop_next = control(self.drop_next, p.interval, self.rec_inv_sqrt);
                schedule = now - self.drop_next;
                due = self.count != 0 && schedule >= 0;
            }
        }
        // BLUE never marks: it is for flows that ignore marks.
        let blue = self.p_drop != 0 && blue_draw < self.p_drop;
        // drop_next doubles as an activity timeout while count is 0.
        if self.count == 0 {
            self.drop_next = now + p.interval;
        } else if schedule > 0 && !(drop || blue) {
            self.drop_next = now;
        }
        match (drop, blue) {
            (true, _) => Signal::Drop,
            (false, true) => Signal::BlueDrop,
            (false, false) if self.ecn_marked => Signal::Mark,
            _ => Signal::Pass,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Pass,
    Mark,
    /// CoDel's drop (the packet was not ECN-capable).
    Drop,
    /// BLUE's random drop (even of an ECN-capable packet, perhaps already marked).
    BlueDrop,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn the_cache_holds_one_over_the_root_of_count() {
        let c = inv_sqrt_cache();
        assert_eq!(c[0], !0);
        for (n, v) in c.iter().enumerate().skip(1) {
            let exact = 1.0 / (n as f64).sqrt();
            let got = *v as f64 / 4294967296.0;
            assert!((got - exact).abs() < 0.002, "count {n}: {got} vs {exact}");
        }
    }

    /// A standing queue 10 ms above a 5 ms target: a fresh flow signals on its second packet
    /// (rec_inv_sqrt starts at 0), then at intervals shrinking as 1/sqrt(count).
    #[test]
    fn signals_follow_the_control_law() {
        let p = CobaltParams::new(5_000_000, 100_000_000, 0);
        let mut v = CobaltVars::default();
        let mut drops = Vec::new();
        for ms in 0..1000i64 {
            if v.should_drop(&p, ms * MS, 10 * MS, false, !0, 0) == Signal::Drop {
                drops.push(ms);
            }
        }
        assert_eq!(drops[0], 1, "{drops:?}");
        // Gaps: 100/sqrt(2) = 70.7, 100/sqrt(3) = 57.7, 50, ...
        let gaps: Vec<i64> = drops.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            (gaps[0] - 71).abs() <= 1 && (gaps[1] - 58).abs() <= 1 && (gaps[2] - 50).abs() <= 1,
            "{gaps:?}"
        );
        // Non-increasing, give or take the 1 ms steps of this clock.
        assert!(gaps.windows(2).all(|w| w[1] <= w[0] + 1), "{gaps:?}");
    }

    /// Below target the count decays by one per elapsed control interval instead of resetting.
    #[test]
    fn count_decays_gradually() {
        let p = CobaltParams::new(5_000_000, 100_000_000, 0);
        let mut v = CobaltVars::default();
        for ms in 0..2000i64 {
            v.should_drop(&p, ms * MS, 10 * MS, false, !0, 0);
        }
        let peak = v.count;
        assert!(peak > 10, "{peak}");
        v.should_drop(&p, 2100 * MS, 0, false, !0, 0);
        assert!(
            v.count < peak && v.count > 0,
            "one quiet packet 100 ms later: {} of {peak}",
            v.count
        );
        v.should_drop(&p, 20_000 * MS, 0, false, !0, 0);
        assert_eq!(v.count, 0, "decayed to rest after a long quiet spell");
    }

    #[test]
    fn blue_rises_on_overflow_and_falls_when_empty() {
        let p = CobaltParams::new(5_000_000, 100_000_000, 0);
        let mut v = CobaltVars::default();
        assert!(v.queue_full(&p, 10 * MS));
        assert!(!v.queue_full(&p, 12 * MS), "at most one step per target");
        v.queue_full(&p, 20 * MS);
        assert_eq!(v.p_drop, 2 << 24);
        // BLUE drops by its coin, even ECN-capable packets.
        assert_eq!(
            v.should_drop(&p, 21 * MS, 0, true, 1 << 24, 0),
            Signal::BlueDrop
        );
        let mut t = 30 * MS;
        while v.p_drop > 0 {
            v.queue_empty(&p, t);
            t += 6 * MS;
        }
        assert_eq!(
            (t - 30 * MS) / (6 * MS),
            32,
            "2/256 falls in 32 steps of 1/4096"
        );
    }
}
