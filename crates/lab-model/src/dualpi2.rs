//! DualPI2 (RFC 9332): the coupled dual-queue AQM for L4S. Packets with ECT(1) or CE go to the
//! L queue, all others to the classic (C) queue. One PI controller computes a base probability
//! p' from the queueing delay every `tupdate`; the classic queue drops (or, for ECT(0),
//! marks) with p_C = p'^2, the L queue marks CE with the coupled p_CL = k·p', or on its own
//! step when a packet waited longer than `step_thresh`. A weighted round robin gives the L
//! queue priority, bounded so the classic queue keeps `classic_protection` of the link.
//!
//! Written from the RFC's pseudocode (Appendix A.2, the enhanced version: the PI's delay is
//! the larger of the two queues', and the overload rule) with the defaults of Linux's
//! `sch_dualpi2` (6.17 and later; the Debian kernels this project checks its qdiscs against
//! predate it, so the checks here are the RFC's own arithmetic and physics on virtual time).

use crate::config::ConfigError;
use crate::packet::Packet;
use crate::qdisc::Qdisc;
use crate::stats::DirCounters;
use crate::values::parse_time_ns;
use crate::MS;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DualPi2Params {
    /// Packets both queues may hold together (Linux: 10000).
    pub limit: usize,
    /// The classic queue's delay target (15 ms).
    pub target_ns: u64,
    /// Time between two updates of p' (Linux 16 ms; the RFC's 15 ms is min(target, RTT_max/3)).
    pub tupdate_ns: u64,
    /// PI gains in Hz, applied once per update with the delay in seconds (0.16 and 3.2).
    pub alpha: f64,
    pub beta: f64,
    /// The coupling factor k (2).
    pub coupling: f64,
    /// An L packet that waited longer than this is marked (1 ms).
    pub step_ns: u64,
    /// The classic queue's share of the scheduler when both queues have packets, percent (10).
    pub classic_protection: u32,
}

impl Default for DualPi2Params {
    fn default() -> Self {
        DualPi2Params {
            limit: 10_000,
            target_ns: 15 * MS,
            tupdate_ns: 16 * MS,
            alpha: 0.16,
            beta: 3.2,
            coupling: 2.0,
            step_ns: MS,
            classic_protection: 10,
        }
    }
}

fn bad(msg: String) -> ConfigError {
    ConfigError::Value(format!("dualpi2: {msg}"))
}

impl DualPi2Params {
    /// tc's words: `limit N`, `target T`, `tupdate T`, `alpha A`, `beta B`, `coupling_factor K`,
    /// `step_thresh T`, `classic_protection PERCENT`.
    pub fn parse(words: &str) -> Result<DualPi2Params, ConfigError> {
        let mut p = DualPi2Params::default();
        let mut it = words.split_whitespace();
        while let Some(w) = it.next() {
            let v = it
                .next()
                .ok_or_else(|| bad(format!("`{w}` needs a value")))?;
            let num = |v: &str| -> Result<f64, ConfigError> {
                v.parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x >= 0.0)
                    .ok_or_else(|| bad(format!("{w} `{v}`: want a number")))
            };
            match w {
                "limit" => {
                    p.limit = v
                        .trim_end_matches('p')
                        .parse()
                        .ok()
                        .filter(|n| (1..=1_000_000).contains(n))
                        .ok_or_else(|| bad(format!("limit `{v}`: want 1..1000000 packets")))?
                }
                "target" => p.target_ns = parse_time_ns(v)?,
                "tupdate" => p.tupdate_ns = parse_time_ns(v)?.max(1),
                "alpha" => p.alpha = num(v)?,
                "beta" => p.beta = num(v)?,
                "coupling_factor" => p.coupling = num(v)?.max(0.1),
                "step_thresh" => p.step_ns = parse_time_ns(v)?,
                "classic_protection" => {
                    p.classic_protection = v
                        .parse()
                        .ok()
                        .filter(|n| *n <= 100)
                        .ok_or_else(|| bad(format!("classic_protection `{v}`: want 0..100")))?
                }
                _ => {
                    return Err(bad(format!(
                        "unknown option `{w}`: want limit, target, tupdate, alpha, beta, \
                         coupling_factor, step_thresh or classic_protection"
                    )))
                }
            }
        }
        Ok(p)
    }

    pub fn describe(&self) -> String {
        format!(
            "dualpi2 target {} ms, step {} ms, k {}, limit {} packets",
            self.target_ns as f64 / 1e6,
            self.step_ns as f64 / 1e6,
            self.coupling,
            self.limit
        )
    }
}

pub struct DualPi2 {
    p: DualPi2Params,
    mtu: usize,
    l: VecDeque<Packet>,
    c: VecDeque<Packet>,
    bytes: usize,
    /// The base probability p' (0..1).
    prob: f64,
    prev_qdelay_ns: u64,
    next_update_ns: Option<u64>,
    /// The WRR's credit: the L queue is served while it is at or below zero.
    credit: i64,
    /// `recur()`'s accumulator for the L queue's coupled marks (RFC 9332 A.1: one mark per
    /// 1/p packets rather than random draws, for a smoother signal).
    l_recur: f64,
    rng: SmallRng,
}

impl DualPi2 {
    pub fn new(p: DualPi2Params, mtu: usize, seed: u64) -> DualPi2 {
        let mut q = DualPi2 {
            p,
            mtu,
            l: VecDeque::new(),
            c: VecDeque::new(),
            bytes: 0,
            prob: 0.0,
            prev_qdelay_ns: 0,
            next_update_ns: None,
            credit: 0,
            l_recur: 0.0,
            rng: SmallRng::seed_from_u64(seed),
        };
        q.reset_credit();
        q
    }

    /// Linux: the credit starts at MTU x (wc - wl), so the L queue goes first.
    fn reset_credit(&mut self) {
        let wc = i64::from(self.p.classic_protection);
        self.credit = self.mtu as i64 * (wc - (100 - wc));
    }

    /// The base probability p'.
    pub fn prob(&self) -> f64 {
        self.prob
    }

    fn head_sojourn(q: &VecDeque<Packet>, now: u64) -> u64 {
        q.front().map_or(0, |p| now.saturating_sub(p.enqueued_ns))
    }

    /// Runs the PI updates due by `now` (RFC 9332 A.2 lines 1-8): the delay is the larger of
    /// the two head packets' sojourns at each update's time; Tupdate is folded into alpha and
    /// beta, so each update adds alpha·(q - target) + beta·(q - q_prev), q in seconds.
    pub fn update_to(&mut self, now: u64) {
        let next = *self.next_update_ns.get_or_insert(now + self.p.tupdate_ns);
        if now < next {
            return;
        }
        let mut t = next;
        let mut n = 0;
        while t <= now {
            let q = Self::head_sojourn(&self.c, t).max(Self::head_sojourn(&self.l, t));
            let s = |ns: u64| ns as f64 / 1e9;
            self.prob += self.p.alpha * (s(q) - s(self.p.target_ns))
                + self.p.beta * (s(q) - s(self.prev_qdelay_ns));
            self.prob = self.prob.clamp(0.0, 1.0);
            self.prev_qdelay_ns = q;
            t += self.p.tupdate_ns;
            n += 1;
            // After a long idle time p' is 0 and stays there: on to the first tick after now.
            if n > 64 && self.prob == 0.0 && q == 0 && t <= now {
                t += ((now - t) / self.p.tupdate_ns + 1) * self.p.tupdate_ns;
            }
        }
        self.next_update_ns = Some(t);
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random::<f64>() < p
    }

    /// Pops the next packet by the WRR (Linux's credit scheduler): the L queue while the
    /// credit is at or below zero or the C queue is empty; the credit moves only while both
    /// queues have packets, so over time C gets `classic_protection` percent of the bytes.
    fn pick(&mut self) -> Option<(Packet, bool)> {
        let both = !self.l.is_empty() && !self.c.is_empty();
        let from_l = !self.l.is_empty() && (self.c.is_empty() || self.credit <= 0);
        let pkt = if from_l {
            self.l.pop_front()?
        } else {
            self.c.pop_front()?
        };
        if both {
            let wc = i64::from(self.p.classic_protection);
            let len = pkt.frame_len as i64;
            if from_l {
                self.credit += wc * len;
            } else {
                self.credit -= (100 - wc) * len;
            }
        }
        self.bytes -= pkt.frame_len;
        Some((pkt, from_l))
    }
}

impl Qdisc for DualPi2 {
    fn enqueue(&mut self, mut pkt: Packet, now: u64, stats: &mut DirCounters) {
        self.update_to(now);
        if self.l.len() + self.c.len() >= self.p.limit {
            stats.drops.overflow += 1;
            return;
        }
        pkt.enqueued_ns = now;
        self.bytes += pkt.frame_len;
        // RFC 9332 §2.5.1.1: ECT(1) and CE are L4S; Not-ECT and ECT(0) classic.
        if pkt.ecn() & 1 == 1 {
            self.l.push_back(pkt);
        } else {
            self.c.push_back(pkt);
        }
    }

    fn dequeue(&mut self, now: u64, stats: &mut DirCounters) -> Option<Packet> {
        self.update_to(now);
        if self.l.is_empty() && self.c.is_empty() {
            self.reset_credit();
            return None;
        }
        loop {
            // Linux: no AQM signal while less than two packets' worth is queued.
            let aqm = self.bytes >= 2 * self.mtu;
            let (mut pkt, from_l) = self.pick()?;
            let p_cl = self.p.coupling * self.prob;
            let p_c = self.prob * self.prob;
            if from_l {
                let sojourn = now.saturating_sub(pkt.enqueued_ns);
                if p_cl < 1.0 {
                    // p_L = max(native step, coupled p_CL).
                    let step = sojourn > self.p.step_ns;
                    self.l_recur += if aqm { p_cl } else { 0.0 };
                    let coupled = self.l_recur >= 1.0;
                    if coupled {
                        self.l_recur -= 1.0;
                    }
                    if (step || coupled) && pkt.mark_ce() {
                        stats.ecn_marks += 1;
                    }
                } else {
                    // Overload: the L queue drops as the classic one does, then marks all.
                    if aqm && self.chance(p_c) {
                        stats.drops.aqm += 1;
                        continue;
                    }
                    if pkt.mark_ce() {
                        stats.ecn_marks += 1;
                    }
                }
            } else if aqm && self.chance(p_c) {
                // Classic: mark ECT(0), drop Not-ECT, and drop all once p_C reaches
                // p_Cmax = 1/k^2 (the overload rule: ECN no longer holds the queue).
                let overload = p_c >= 1.0 / (self.p.coupling * self.p.coupling);
                if !overload && pkt.mark_ce() {
                    stats.ecn_marks += 1;
                } else {
                    stats.drops.aqm += 1;
                    if self.l.is_empty() && self.c.is_empty() {
                        return None;
                    }
                    continue;
                }
            }
            return Some(pkt);
        }
    }

    fn packets(&self) -> usize {
        self.l.len() + self.c.len()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn name(&self) -> &'static str {
        "dualpi2"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::udp4;

    fn q() -> DualPi2 {
        DualPi2::new(DualPi2Params::default(), 1514, 1)
    }

    fn pkt(ecn: u8) -> Packet {
        udp4(1500, 1, 2, ecn)
    }

    #[test]
    fn the_pi_follows_the_rfcs_arithmetic_tick_by_tick() {
        // One packet enqueued at 24 ms and never served; updates at 16 ms x n. Each adds
        // 0.16 (q - 15 ms) + 3.2 (q - q_prev), q in seconds, and p' stays within 0..1.
        let mut d = q();
        let mut st = DirCounters::default();
        d.update_to(0);
        d.enqueue(pkt(0), 24 * MS, &mut st);
        let mut got = Vec::new();
        for n in 1..=5 {
            d.update_to(16 * MS * n);
            got.push(d.prob());
        }
        // 16 ms: empty queue, 0.16 x -0.015 < 0: clamped to 0. 32 ms: q = 8 ms:
        // 0.16 x -0.007 + 3.2 x 0.008 = 0.02448. Then q = 24, 40, 56 ms.
        let want = [0.0, 0.02448, 0.07712, 0.13232, 0.19008];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{got:?} against {want:?}");
        }
    }

    #[test]
    fn ect1_and_ce_take_the_l_queue_and_go_first_the_rest_is_classic() {
        let mut d = q();
        let mut st = DirCounters::default();
        for ecn in [0, 2, 1, 3] {
            d.enqueue(pkt(ecn), 0, &mut st);
        }
        assert_eq!((d.l.len(), d.c.len()), (2, 2));
        let order: Vec<u8> = std::iter::from_fn(|| d.dequeue(0, &mut st))
            .map(|p| p.ecn())
            .collect();
        assert_eq!(
            order[..2],
            [1, 3],
            "the L queue first while the credit allows"
        );
    }

    #[test]
    fn the_wrr_gives_the_classic_queue_its_protected_tenth() {
        let mut d = q();
        let mut st = DirCounters::default();
        for _ in 0..500 {
            d.enqueue(pkt(1), 0, &mut st);
            d.enqueue(pkt(0), 0, &mut st);
        }
        // At time 0 no packet has waited: no AQM acts, only the scheduler.
        let first: Vec<bool> = (0..200)
            .map(|_| d.dequeue(0, &mut st).unwrap().ecn() == 1)
            .collect();
        let l = first.iter().filter(|x| **x).count();
        assert!((178..=182).contains(&l), "{l} of 200 from L, want 90%");
    }

    #[test]
    fn the_step_marks_l_packets_that_waited_over_a_millisecond_and_no_others() {
        let mut d = q();
        let mut st = DirCounters::default();
        for i in 0..10u64 {
            d.enqueue(pkt(1), i * 200_000, &mut st);
        }
        // Served at 2 ms: those that came before 1 ms waited more than 1 ms.
        let marked: Vec<bool> = std::iter::from_fn(|| d.dequeue(2 * MS, &mut st))
            .map(|p| p.ecn() == 3)
            .collect();
        assert_eq!(
            marked,
            [true, true, true, true, true, false, false, false, false, false]
        );
        assert_eq!((st.ecn_marks, d.prob()), (5, 0.0));
    }

    /// Serves `n` packets of ECN code point `ecn` through a queue held at 20 packets (all at
    /// time 0: no step, no PI update) with p' fixed; returns (marks, drops).
    fn at_fixed_p(prob: f64, ecn: u8, n: usize) -> (u64, u64) {
        let mut d = q();
        d.prob = prob;
        d.next_update_ns = Some(u64::MAX);
        let mut st = DirCounters::default();
        for _ in 0..20 {
            d.enqueue(pkt(ecn), 0, &mut st);
        }
        for _ in 0..n {
            d.enqueue(pkt(ecn), 0, &mut st);
            while d.packets() > 20 {
                d.dequeue(0, &mut st);
            }
        }
        (st.ecn_marks, st.drops.aqm)
    }

    #[test]
    fn coupling_marks_l_at_k_p_and_signals_classic_at_p_squared() {
        // p' = 0.1: the L queue marks p_CL = k p' = 20%, one packet in five exactly (recur);
        // the classic queue marks ECT(0), and drops Not-ECT, with p_C = p'^2 = 1% (random:
        // 100 of 10000, sigma 10).
        let (marks, drops) = at_fixed_p(0.1, 1, 10_000);
        assert!(
            (1999..=2001).contains(&marks) && drops == 0,
            "{marks} {drops}"
        );
        let (marks, drops) = at_fixed_p(0.1, 2, 10_000);
        assert!((60..=140).contains(&marks) && drops == 0, "{marks} {drops}");
        let (marks, drops) = at_fixed_p(0.1, 0, 10_000);
        assert!(marks == 0 && (60..=140).contains(&drops), "{marks} {drops}");
        // Overload (p' >= 1/k, p_C >= 1/k^2): ECT(0) is dropped, not marked, and the L queue
        // drops with p_C too and marks every packet it keeps.
        let (marks, drops) = at_fixed_p(0.6, 2, 10_000);
        assert!(
            marks == 0 && (3400..=3800).contains(&drops),
            "{marks} {drops}"
        );
        let (marks, drops) = at_fixed_p(0.6, 1, 10_000);
        assert!(
            (3400..=3800).contains(&drops) && marks + drops >= 9_990,
            "{marks} {drops}"
        );
    }

    /// Unresponsive Not-ECT traffic at twice a 10 Mbit/s link's rate: the PI's integral term
    /// settles the queue's delay at the 15 ms target, dropping the half that does not fit.
    #[test]
    fn an_unresponsive_overload_is_held_at_the_target_delay() {
        use crate::config::DirConfig;
        use crate::link::LinkDirection;
        let mut cfg = DirConfig::default();
        let nofile = |_: &str| -> Result<String, String> { Err("none".into()) };
        cfg.set("rate", "10mbit", &nofile).unwrap();
        cfg.set("qdisc", "dualpi2", &nofile).unwrap();
        let mut link = LinkDirection::new(cfg, 0);
        let gap = 600_000; // 1500 B at 20 Mbit/s
        let (mut sent, mut out, mut late) = (0u64, 0u64, Vec::new());
        let mut now = 0;
        while now < 20_000 * MS {
            if now % gap == 0 {
                link.arrive(pkt(0), now);
                sent += 1;
            }
            while let Some(p) = link.poll(now) {
                out += 1;
                if now > 10_000 * MS {
                    late.push(now - p.enqueued_ns);
                }
            }
            now += 100_000;
        }
        let delivered = out as f64 / sent as f64;
        assert!((0.45..=0.55).contains(&delivered), "{delivered}");
        let mean_ms = late.iter().sum::<u64>() as f64 / late.len() as f64 / 1e6;
        assert!(
            (10.0..=20.0).contains(&mean_ms),
            "mean sojourn {mean_ms} ms"
        );
    }
}
