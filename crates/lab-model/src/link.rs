//! One direction of an emulated link: loss, then the queue discipline, then serialisation at
//! the link rate, then propagation delay and jitter. Driven by `arrive` and `poll` with the
//! caller's clock.

use crate::config::{DirConfig, Loss};
use crate::dql::Dql;
use crate::packet::Packet;
use crate::qdisc::Qdisc;
use crate::rate::Serializer;
use crate::stats::DirCounters;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

struct InFlight {
    deliver_ns: u64,
    seq: u64,
    pkt: Packet,
}

impl PartialEq for InFlight {
    fn eq(&self, o: &Self) -> bool {
        (self.deliver_ns, self.seq) == (o.deliver_ns, o.seq)
    }
}
impl Eq for InFlight {}
impl PartialOrd for InFlight {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for InFlight {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.deliver_ns, self.seq).cmp(&(o.deliver_ns, o.seq))
    }
}

pub struct LinkDirection {
    cfg: DirConfig,
    qdisc: Box<dyn Qdisc>,
    serializer: Serializer,
    pub stats: DirCounters,
    /// When the packet being serialised has left: the next may start then.
    busy_until: u64,
    /// Departure times and frame bytes of the packets in the transmit ring, oldest first;
    /// each is removed (and, with BQL, reported completed) once its time has passed.
    ring: VecDeque<(u64, u64)>,
    /// Byte queue limits on the ring, when `cfg.bql`.
    dql: Option<Dql>,
    /// Time of the latest arrival: every queued packet arrived by then (see `pump`).
    last_arrival: u64,
    last_delivery: u64,
    seq: u64,
    in_flight: BinaryHeap<Reverse<InFlight>>,
    rng: SmallRng,
    ge_bad: bool,
}

impl LinkDirection {
    /// `now` is time zero of rate traces and schedules.
    pub fn new(cfg: DirConfig, now: u64) -> LinkDirection {
        LinkDirection {
            dql: cfg.bql.then(|| Dql::new(now)),
            qdisc: cfg.build_qdisc(),
            serializer: Serializer::new(cfg.rate.clone(), now),
            rng: SmallRng::seed_from_u64(cfg.seed),
            cfg,
            stats: DirCounters::default(),
            busy_until: 0,
            ring: VecDeque::new(),
            last_arrival: 0,
            last_delivery: 0,
            seq: 0,
            in_flight: BinaryHeap::new(),
            ge_bad: false,
        }
    }

    pub fn config(&self) -> &DirConfig {
        &self.cfg
    }

    /// The propagation delay for a packet that leaves at `t`.
    fn delay_at(&self, t: u64) -> u64 {
        self.cfg
            .delay_at(t.saturating_sub(self.serializer.origin_ns()))
    }

    /// A trace or schedule starts again from its beginning at `now` (so that each run of a
    /// comparison meets the same line).
    pub fn restart_rate(&mut self, now: u64) {
        self.pump(now);
        self.serializer = Serializer::new(self.cfg.rate.clone(), now);
    }

    /// Applies a new configuration at `now`. Queued packets move to a new qdisc when the
    /// discipline changed; packets already on the wire keep their times.
    pub fn reconfigure(&mut self, cfg: DirConfig, now: u64) {
        self.pump(now);
        let framing = (cfg.overhead, cfg.atm) != (self.cfg.overhead, self.cfg.atm);
        let in_place = cfg.qdisc != self.cfg.qdisc
            && cfg.rate == self.cfg.rate
            && cfg.mtu == self.cfg.mtu
            && !framing
            && self.qdisc.change_in_place(&cfg.qdisc);
        if (cfg.qdisc != self.cfg.qdisc && !in_place)
            || cfg.rate != self.cfg.rate
            || cfg.mtu != self.cfg.mtu
            || framing
        {
            let mut fresh = cfg.build_qdisc();
            for mut p in self.qdisc.drain() {
                p.frame_len = cfg.wire_bytes(p.len());
                let at = p.enqueued_ns;
                fresh.enqueue(p, at, &mut self.stats);
            }
            self.qdisc = fresh;
        }
        if cfg.rate != self.cfg.rate {
            self.serializer = Serializer::new(cfg.rate.clone(), now);
        }
        if cfg.seed != self.cfg.seed {
            self.rng = SmallRng::seed_from_u64(cfg.seed);
        }
        if cfg.bql != self.cfg.bql {
            // A driver (re)starts its limit from zero; what is in the ring counts from now on.
            self.dql = cfg.bql.then(|| {
                let mut d = Dql::new(now);
                d.queued(self.ring.iter().map(|e| e.1).sum());
                d
            });
        }
        self.cfg = cfg;
        self.note_queue();
    }

    fn lost(&mut self) -> bool {
        match self.cfg.loss {
            Loss::None => false,
            Loss::Random(p) => self.rng.random::<f64>() < p,
            Loss::GilbertElliott {
                p,
                r,
                bad_loss,
                good_loss,
            } => {
                let flip = self.rng.random::<f64>();
                self.ge_bad = if self.ge_bad { flip >= r } else { flip < p };
                self.rng.random::<f64>() < if self.ge_bad { bad_loss } else { good_loss }
            }
        }
    }

    /// An IP packet (one wire segment) arrives at `now`.
    pub fn arrive(&mut self, mut pkt: Packet, now: u64) {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += pkt.len() as u64;
        if pkt.len() > self.cfg.mtu {
            self.stats.drops.mtu += 1;
            return;
        }
        if self.lost() {
            self.stats.drops.loss += 1;
            return;
        }
        self.cfg.marks.apply(&mut pkt);
        self.pump(now);
        self.last_arrival = now;
        pkt.frame_len = self.cfg.wire_bytes(pkt.len());
        self.qdisc.enqueue(pkt, now, &mut self.stats);
        self.pump(now);
    }

    /// A packet its sending host was slow to originate (`slow_icmp`): it enters the wire
    /// `hold_ns` after `now`, past the queue and the serialiser (an ICMP error of some 100
    /// bytes; the link's delay still applies), so that it delays nothing behind it.
    pub fn arrive_held(&mut self, pkt: Packet, now: u64, hold_ns: u64) {
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += pkt.len() as u64;
        self.seq += 1;
        let deliver = now + hold_ns + self.delay_at(now);
        self.in_flight.push(Reverse(InFlight {
            deliver_ns: deliver,
            seq: self.seq,
            pkt,
        }));
    }

    /// When the qdisc may next hand a packet down: once every queued packet has arrived
    /// (`last_arrival`), the qdisc is ready, and there is room below it: the link free without
    /// a ring, else a free ring slot (the oldest of the last `ring` entries has left) and, with
    /// BQL, a queue the driver has not stopped (else the next completion, which may restart it).
    fn handoff_time(&self) -> u64 {
        let n = self.cfg.ring_entries();
        let slot = match n {
            0 => self.busy_until,
            n if self.ring.len() >= n => self.ring[self.ring.len() - n].0,
            _ => 0,
        };
        let bytes = match (&self.dql, self.ring.front()) {
            (Some(d), Some(&(depart, _))) if d.stopped() => depart,
            _ => 0,
        };
        slot.max(bytes)
            .max(self.last_arrival)
            .max(self.qdisc.next_ready())
    }

    /// Takes the packets that have left by `t` out of the ring, completing them in order.
    fn complete_ring(&mut self, t: u64) {
        while let Some(&(depart, bytes)) = self.ring.front().filter(|e| e.0 <= t) {
            self.ring.pop_front();
            if let Some(d) = self.dql.as_mut() {
                d.completed(bytes, depart);
            }
        }
    }

    /// Moves packets from the queue onto the wire (or into the ring) for every moment up to
    /// `now` at which there was room. Called before each arrival, so every queued packet
    /// arrived no later than `last_arrival`: a dequeue happens at max(room, last arrival),
    /// late wake-ups included (the link catches up instead of drifting).
    fn pump(&mut self, now: u64) {
        while self.qdisc.packets() > 0 {
            let t = self.handoff_time();
            if t > now {
                break;
            }
            self.complete_ring(t);
            if self.dql.as_ref().is_some_and(Dql::stopped) {
                // Completions so far did not restart the queue: wait for the next.
                continue;
            }
            let Some(p) = self.qdisc.dequeue(t, &mut self.stats) else {
                break;
            };
            self.stats.sojourn.record(t - p.enqueued_ns);
            // In a ring the packet waits for those ahead of it; without one the link is free.
            let start = t.max(self.busy_until);
            let depart = self.serializer.departure(start, p.frame_len);
            self.busy_until = depart;
            if self.cfg.ring_entries() > 0 {
                self.stats.ring_sojourn.record(start - t);
                self.ring.push_back((depart, p.frame_len as u64));
                if let Some(d) = self.dql.as_mut() {
                    d.queued(p.frame_len as u64);
                }
                self.stats.max_ring_packets = self.stats.max_ring_packets.max(self.ring.len());
            }
            // A delay that falls does not let a packet overtake those sent before it (below),
            // as on a path whose length changes.
            let mut deliver = depart + self.delay_at(depart);
            if self.cfg.jitter_ns > 0 {
                let j = self.cfg.jitter_ns as f64 * (2.0 * self.rng.random::<f64>() - 1.0);
                deliver = (deliver as f64 + j).max(depart as f64) as u64;
            }
            if !self.cfg.reorder {
                deliver = deliver.max(self.last_delivery);
            }
            self.last_delivery = self.last_delivery.max(deliver);
            self.seq += 1;
            self.in_flight.push(Reverse(InFlight {
                deliver_ns: deliver,
                seq: self.seq,
                pkt: p,
            }));
        }
        self.complete_ring(now);
        self.stats.ring_packets = self.ring.len();
        self.stats.bql_limit_bytes = self.dql.as_ref().map(|d| d.stats().limit_bytes);
        self.note_queue();
    }

    fn note_queue(&mut self) {
        self.stats.queue_packets = self.qdisc.packets();
        self.stats.queue_bytes = self.qdisc.bytes();
        self.stats.max_queue_packets = self.stats.max_queue_packets.max(self.stats.queue_packets);
    }

    /// The next packet due at the far end by `now`, if any.
    pub fn poll(&mut self, now: u64) -> Option<Packet> {
        self.pump(now);
        if self
            .in_flight
            .peek()
            .is_some_and(|Reverse(f)| f.deliver_ns <= now)
        {
            let Reverse(f) = self.in_flight.pop().unwrap();
            self.stats.tx_packets += 1;
            self.stats.tx_bytes += f.pkt.len() as u64;
            self.stats.tx_wire_bytes += f.pkt.frame_len as u64;
            return Some(f.pkt);
        }
        None
    }

    /// When `poll` next has something to do; None when idle.
    pub fn next_wakeup(&self) -> Option<u64> {
        let wire = self.in_flight.peek().map(|Reverse(f)| f.deliver_ns);
        let queue = (self.qdisc.packets() > 0).then(|| self.handoff_time());
        match (wire, queue) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    pub fn qdisc_name(&self) -> &'static str {
        self.qdisc.name()
    }

    pub fn cake_stats(&self) -> Option<crate::cake::CakeStats> {
        self.qdisc.cake_stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::udp4;
    use crate::MS;

    fn noop(_: &str) -> Result<String, String> {
        Err("no files".into())
    }

    fn dir(kv: &[(&str, &str)]) -> LinkDirection {
        let mut c = DirConfig::default();
        for (k, v) in kv {
            c.set(k, v, &noop).unwrap();
        }
        LinkDirection::new(c, 0)
    }

    /// Runs the direction until idle, collecting (delivery time, packet).
    fn drain(d: &mut LinkDirection, out: &mut Vec<(u64, Packet)>) {
        while let Some(t) = d.next_wakeup() {
            while let Some(p) = d.poll(t) {
                out.push((t, p));
            }
        }
    }

    #[test]
    fn a_full_fifo_drains_in_n_size_8_over_r() {
        // 1000 packets of 1500 B at 20 Mbit/s: the last waits 1000*1500*8/20e6 = 0.6 s.
        let mut d = dir(&[("rate", "20mbit"), ("limit", "1000")]);
        for _ in 0..1000 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        assert_eq!(out.len(), 1000);
        assert_eq!(out.last().unwrap().0, 600 * MS);
        // The last packet waits behind 999 others: 999 x 1500 B x 8 / 20 Mbit/s = 599.4 ms; the
        // median one behind 499: 299.4 ms (each within the histogram's 1%).
        let (p100, p50) = (
            d.stats.sojourn.quantile_us(1.0).unwrap(),
            d.stats.sojourn.quantile_us(0.5).unwrap(),
        );
        assert!(
            (p100 as f64 - 599_400.0).abs() < 5_994.0,
            "max sojourn {p100} us"
        );
        assert!(
            (p50 as f64 - 299_400.0).abs() < 2_994.0,
            "median sojourn {p50} us"
        );
        assert_eq!(d.stats.max_queue_packets, 999);
    }

    #[test]
    fn delay_adds_to_serialisation_and_overflow_is_counted() {
        let mut d = dir(&[("rate", "12mbit"), ("delay", "10ms"), ("limit", "10")]);
        for _ in 0..20 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        // One on the wire at once plus 10 queued; 1 ms each at 12 Mbit/s, +10 ms.
        assert_eq!(out.len(), 11);
        assert_eq!(d.stats.drops.overflow, 9);
        assert_eq!(out[0].0, 11 * MS);
        assert_eq!(out[10].0, 21 * MS);
    }

    #[test]
    fn a_delay_schedule_moves_the_delay_at_its_steps_from_the_rate_s_time_zero() {
        let mut c = DirConfig::default();
        let schedule = |_: &str| Ok("0 10ms\n1 30ms\n2 5ms\nrepeat 3\n".to_string());
        c.set("delay", "schedule:x", &schedule).unwrap();
        assert_eq!(c.delay_ns, 10 * MS);
        assert!(c
            .describe()
            .contains("delay 5-30 ms (a schedule of 3 steps)"));
        // Time zero at 100 ms: each packet (unlimited rate) takes the delay of its departure.
        let mut d = LinkDirection::new(c, 100 * MS);
        let mut out = Vec::new();
        for (i, at_ms) in [500u64, 1500, 2099, 2101, 2600, 3600].iter().enumerate() {
            d.arrive(udp4(100, i as u16, 2, 0), *at_ms * MS);
            drain(&mut d, &mut out);
        }
        let ms: Vec<u64> = out.iter().map(|(t, _)| t / MS).collect();
        // 2099 ms is 1999 into the schedule (30 ms, at 2129); 2101 is 2001 (5 ms: 2106), held
        // behind the one before it; 3600 is 3500, half a second into the repeat (10 ms).
        assert_eq!(ms, [510, 1530, 2129, 2129, 2605, 3610]);
    }

    #[test]
    fn jitter_without_reorder_keeps_order_and_with_reorder_does_not() {
        for reorder in [false, true] {
            let mut d = dir(&[
                ("delay", "20ms"),
                ("jitter", "10ms"),
                ("reorder", if reorder { "on" } else { "off" }),
            ]);
            for i in 0..200u16 {
                d.arrive(udp4(100, i, 2, 0), i as u64 * MS / 10);
            }
            let mut out = Vec::new();
            drain(&mut d, &mut out);
            let ports: Vec<u16> = out
                .iter()
                .map(|(_, p)| u16::from_be_bytes([p.data[20], p.data[21]]))
                .collect();
            let in_order = ports.windows(2).all(|w| w[0] < w[1]);
            assert_eq!(in_order, !reorder, "reorder={reorder}");
            assert!(out.iter().all(|(t, _)| *t >= 10 * MS && *t <= 50 * MS));
        }
    }

    #[test]
    fn random_and_burst_loss_rates() {
        let mut d = dir(&[("loss", "10%")]);
        for _ in 0..100_000 {
            d.arrive(udp4(100, 1, 2, 0), 0);
        }
        let lost = d.stats.drops.loss as f64 / 1e5;
        assert!((lost - 0.10).abs() < 0.01, "{lost}");
        // GE with p=1%, r=10%: stationary bad share p/(p+r) = 9.1%, lost in bursts of ~10.
        let mut d = dir(&[("ge", "1%,10%")]);
        let mut run = 0;
        let mut runs = Vec::new();
        for _ in 0..200_000 {
            let before = d.stats.drops.loss;
            d.arrive(udp4(100, 1, 2, 0), 0);
            if d.stats.drops.loss > before {
                run += 1;
            } else if run > 0 {
                runs.push(run);
                run = 0;
            }
        }
        let lost = d.stats.drops.loss as f64 / 2e5;
        let mean_burst = runs.iter().sum::<u32>() as f64 / runs.len() as f64;
        assert!((lost - 0.091).abs() < 0.015, "{lost}");
        assert!(mean_burst > 7.0 && mean_burst < 13.0, "{mean_burst}");
    }

    /// netem's `loss gemodel p r 1-h 1-k` (sch_netem.c `loss_gilb_ell`) judges each packet in the
    /// state it was in before the transition; the lab judges it after. Both walk the same Markov
    /// chain, so the loss process is the same: stationary rate pi_bad*(1-h) + pi_good*(1-k) with
    /// pi_bad = p/(p+r). Debian 6.1's netem, 20 000 UDP packets each through a veth
    /// (scripts/kernel-ref.sh, iperf3 -u), lost 0.92 %, 1.8 %, 45 % and 16 % for these rows.
    #[test]
    fn ge_loss_rates_match_netem_in_linux() {
        for (ge, kernel) in [
            ("1%", 0.0092),
            ("1%,30%,50%,0%", 0.018),
            ("10%,10%,80%,10%", 0.45),
            ("10%,10%,20%,10%", 0.16),
        ] {
            let mut d = dir(&[("ge", ge)]);
            let Loss::GilbertElliott {
                p,
                r,
                bad_loss,
                good_loss,
            } = d.config().loss
            else {
                unreachable!()
            };
            let bad = p / (p + r);
            let theory = bad * bad_loss + (1.0 - bad) * good_loss;
            let n = 200_000;
            for _ in 0..n {
                d.arrive(udp4(100, 1, 2, 0), 0);
            }
            let lab = d.stats.drops.loss as f64 / n as f64;
            // Bursty losses vary more than binomial ones: 10 % of the rate, at least 0.2 points.
            let tolerance = (0.1 * theory).max(0.002);
            assert!(
                (lab - theory).abs() < tolerance,
                "ge {ge}: lab {lab} theory {theory}"
            );
            assert!(
                (kernel - theory).abs() < 2.0 * tolerance,
                "ge {ge}: kernel {kernel} theory {theory}"
            );
        }
    }

    /// A bulk flow fills a 10 Mbit/s link behind FQ-CoDel; one sparse 100-byte packet arrives
    /// at 1 s. Returns how long it took to arrive, and the direction.
    fn sparse_packet_delay(below: &[(&str, &str)]) -> (u64, LinkDirection) {
        let mut d = dir(&[&[("rate", "10mbit"), ("qdisc", "fq_codel")], below].concat());
        for _ in 0..2000 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        let at = 1000 * MS;
        while let Some(t) = d.next_wakeup().filter(|&t| t < at) {
            while d.poll(t).is_some() {}
        }
        d.arrive(udp4(100, 3, 4, 0), at);
        loop {
            let t = d.next_wakeup().expect("the sparse packet is delivered");
            while let Some(p) = d.poll(t) {
                if p.len() == 100 {
                    return (t - at, d);
                }
            }
        }
    }

    /// The queue below the qdisc (Gettys: a driver ring of 256 on a slow link): FQ-CoDel sends
    /// the sparse packet next, but into a full ring, which drains FIFO at the link rate:
    /// 256 x 1500 B x 8 / 10 Mbit/s = 307.2 ms that no qdisc can see or remove. A 2-entry ring
    /// leaves about two packets' time (2.4 ms); none, at most the packet on the wire (1.2 ms).
    #[test]
    fn a_driver_ring_holds_what_the_qdisc_cannot_see() {
        let own = 100 * 8 * 1000 / 10; // 100 B at 10 Mbit/s, ns
        let (long, d) = sparse_packet_delay(&[("ring", "256")]);
        assert!(
            long >= 306 * MS && long <= 307_200_000 + own + 1_300_000,
            "ring 256: {long} ns"
        );
        assert_eq!(d.stats.max_ring_packets, 256);
        // The ring's wait is where the time went; the qdisc's own queue kept CoDel's target.
        let ring_p50 = d.stats.ring_sojourn.quantile_us(0.5).unwrap();
        assert!(
            (ring_p50 as f64 - 306_000.0).abs() < 4_000.0,
            "ring sojourn p50 {ring_p50} us"
        );
        let (short, d) = sparse_packet_delay(&[("ring", "2")]);
        assert!(short <= 2_400_000 + own + 1_300_000, "ring 2: {short} ns");
        assert_eq!(d.stats.max_ring_packets, 2);
        let (none, d) = sparse_packet_delay(&[]);
        assert!(none <= 1_200_000 + own, "no ring: {none} ns");
        assert_eq!(
            (d.stats.max_ring_packets, d.stats.ring_sojourn.count()),
            (0, 0)
        );
    }

    /// BQL on the same 256-entry ring: the ring takes only the bytes that cover one completion
    /// (a few packets when each packet completes as it leaves), so the queue stays in FQ-CoDel,
    /// where the sparse packet goes first: a few packets' time instead of 307 ms.
    #[test]
    fn bql_keeps_the_ring_short_and_the_queue_in_the_qdisc() {
        let (delay, d) = sparse_packet_delay(&[("ring", "256"), ("bql", "on")]);
        eprintln!(
            "BQL: sparse packet after {delay} ns, ring at most {} packets, limit {:?} B",
            d.stats.max_ring_packets, d.stats.bql_limit_bytes
        );
        assert!(delay <= 5 * 1_200_000, "with BQL: {delay} ns");
        assert!(
            d.stats.max_ring_packets <= 4,
            "ring held {}",
            d.stats.max_ring_packets
        );
        assert!(
            d.stats.bql_limit_bytes.is_some_and(|l| l <= 3 * 1500),
            "{:?}",
            d.stats.bql_limit_bytes
        );
    }

    /// FQ-CoDel shares the link in frame bytes, as Linux's deficits count `qdisc_pkt_len`: with
    /// 14 bytes of framing a flow of 52-byte ACKs gets 1514/66 = 22.9 packets per round against
    /// one 1500-byte packet of a bulk flow (29.1 if the framing were left out).
    #[test]
    fn fq_codel_deficits_count_the_framing() {
        let mut d = dir(&[
            ("rate", "10mbit"),
            ("qdisc", "fq_codel"),
            ("overhead", "14"),
            ("target", "10s"),
        ]);
        for _ in 0..200 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        for _ in 0..5000 {
            d.arrive(udp4(52, 3, 4, 0), 0);
        }
        let (mut bulk, mut acks) = (0, 0);
        while bulk < 150 {
            let t = d.next_wakeup().unwrap();
            while let Some(p) = d.poll(t) {
                if p.len() == 1500 {
                    bulk += 1
                } else {
                    acks += 1
                }
            }
        }
        let per_round = acks as f64 / bulk as f64;
        assert!(
            (per_round - 1514.0 / 66.0).abs() < 0.5,
            "{per_round} ACKs per bulk packet"
        );
    }

    /// A time limit is link time, framing included: on an ATM line a 1500-byte packet with 40
    /// bytes of overhead takes 33 cells (1749 bytes on the wire), so `100ms` at 8 Mbit/s holds
    /// 100 000 / 1749 = 57 packets, not the 66 that bare IP bytes would allow, and the last one
    /// waits no more than the 100 ms asked for.
    #[test]
    fn a_time_limit_counts_overhead_and_atm_cells() {
        let mut d = dir(&[
            ("rate", "8mbit"),
            ("atm", "on"),
            ("overhead", "40"),
            ("limit", "100ms"),
        ]);
        for _ in 0..200 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        let frame_ns = 1749 * 8 * 1000 / 8; // ns at 8 Mbit/s
        assert_eq!(out.len(), 1 + 57, "one on the wire, 57 queued");
        // The counters give the link time too: what `lab compare` reports the line carried.
        assert_eq!(d.stats.tx_bytes, 58 * 1500);
        assert_eq!(d.stats.tx_wire_bytes, 58 * 1749);
        let last_wait = out.last().unwrap().0 - frame_ns;
        assert!(
            last_wait <= 100 * MS && last_wait > 95 * MS,
            "last packet waited {} ms",
            last_wait as f64 / 1e6
        );
    }

    #[test]
    fn oversize_packets_are_dropped_as_mtu() {
        let mut d = dir(&[("mtu", "1400")]);
        d.arrive(udp4(1500, 1, 2, 0), 0);
        assert_eq!(d.stats.drops.mtu, 1);
    }

    #[test]
    fn a_new_cake_bandwidth_applies_in_place_as_tc_change_does() {
        let mut d = dir(&[("rate", "100mbit"), ("qdisc", "cake bandwidth 1mbit")]);
        for _ in 0..10 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        // Packets leave at 1 Mbit/s (12 ms each) for 20 ms, then autorate moves the shaper to
        // 100 Mbit/s.
        let before = (0..20 * MS)
            .step_by(MS as usize)
            .filter_map(|t| d.poll(t))
            .count();
        assert!((1..=2).contains(&before), "{before}");
        let mut c = d.config().clone();
        c.set("bandwidth", "100mbit", &noop).unwrap();
        d.reconfigure(c, 20 * MS);
        assert_eq!(d.cake_stats().unwrap().rate_bps, 100_000_000);
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        // The same qdisc, its counters and COBALT's state kept: all ten count (a new one would
        // have counted only those moved into it), and COBALT drops one that waited 24 ms.
        let tins = d.cake_stats().unwrap().tins;
        let sent: u64 = tins.iter().map(|t| t.packets).sum();
        let dropped: u64 = tins.iter().map(|t| t.drops).sum();
        assert_eq!(sent, 10);
        assert_eq!(out.len() as u64 + dropped, 10 - before as u64);
        // The packet whose time was set at the old rate leaves at 24 ms (as the kernel's
        // time_next_packet), the rest 0.12 ms apart at the new one.
        let last = out.last().unwrap().0;
        assert!((24 * MS..26 * MS).contains(&last), "{last}");
        // Only CAKE has a bandwidth to change.
        let mut fifo = dir(&[]).config().clone();
        assert!(fifo.set("bandwidth", "1mbit", &noop).is_err());
    }

    #[test]
    fn reconfigure_keeps_queued_packets() {
        let mut d = dir(&[("rate", "1mbit")]);
        for _ in 0..10 {
            d.arrive(udp4(1500, 1, 2, 0), 0);
        }
        let mut c = d.config().clone();
        c.set("qdisc", "fq_codel", &noop).unwrap();
        c.set("rate", "100mbit", &noop).unwrap();
        d.reconfigure(c, MS);
        let mut out = Vec::new();
        drain(&mut d, &mut out);
        assert_eq!(out.len(), 10);
        assert_eq!(d.qdisc_name(), "fq_codel");
        assert!(
            out.last().unwrap().0 < 15 * MS,
            "rest drained at 100 Mbit/s: {}",
            out.last().unwrap().0
        );
    }
}
