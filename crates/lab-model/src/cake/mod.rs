//! CAKE (Linux `sch_cake`): a deficit-mode shaper, DiffServ tins with bandwidth thresholds,
//! 1024 set-associative flow queues per tin served by DRR++ with host fairness, and COBALT on
//! every queue. Follows `net/sched/sch_cake.c` (Linux 6.1) step by step on the caller's clock;
//! comments name the kernel function each part mirrors.

pub mod ack_filter;
pub mod cobalt;
pub mod params;

use crate::packet::Packet;
use crate::qdisc::Qdisc;
use crate::stats::DirCounters;
use cobalt::{CobaltParams, CobaltVars, Signal};
use params::{buffer_limit, duration_ns, tune_tin, TinTuning};
pub use params::{AckFilter, CakeParams, FlowMode, Framing, TinMode};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;

const QUEUES: usize = 1024;
const WAYS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    None,
    Sparse,
    /// Counted as sparse while already in the bulk rotation.
    SparseWait,
    Bulk,
    Decaying,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum List {
    New,
    Old,
    Decaying,
}

struct Flow {
    queue: VecDeque<Packet>,
    backlog: usize,
    deficit: i32,
    cvars: CobaltVars,
    srchost: u16,
    dsthost: u16,
    set: Set,
    list: Option<List>,
}

#[derive(Clone, Copy, Default)]
struct Host {
    srchost_tag: u32,
    dsthost_tag: u32,
    srchost_bulk_flow_count: u16,
    dsthost_bulk_flow_count: u16,
}

struct Tin {
    flows: Vec<Flow>,
    tags: Vec<u32>,
    hosts: Vec<Host>,
    tuning: TinTuning,
    cparams: CobaltParams,
    tin_quantum: i32,
    new_flows: VecDeque<u16>,
    old_flows: VecDeque<u16>,
    decaying_flows: VecDeque<u16>,
    bulk_flow_count: u32,
    sparse_flow_count: u32,
    decaying_flow_count: u32,
    unresponsive_flow_count: u32,
    time_next_packet: i64,
    tin_deficit: i32,
    backlog: usize,
    stats: TinCounters,
}

#[derive(Clone, Copy, Default)]
struct TinCounters {
    packets: u64,
    bytes: u64,
    dropped: u64,
    ecn_marked: u64,
    ack_drops: u64,
    drop_overlimit: u64,
    avge_delay: u64,
    peak_delay: u64,
    base_delay: u64,
    way_directs: u64,
    way_hits: u64,
    way_misses: u64,
    way_collisions: u64,
    max_skblen: usize,
}

impl Tin {
    fn new() -> Tin {
        let flows = (0..QUEUES)
            .map(|_| Flow {
                queue: VecDeque::new(),
                backlog: 0,
                deficit: 0,
                cvars: CobaltVars::default(),
                srchost: 0,
                dsthost: 0,
                set: Set::None,
                list: None,
            })
            .collect();
        Tin {
            flows,
            tags: vec![0; QUEUES],
            hosts: vec![Host::default(); QUEUES],
            tuning: tune_tin(0, 1514, 0, 0),
            cparams: CobaltParams::new(0, 0, 0),
            tin_quantum: 0,
            new_flows: VecDeque::new(),
            old_flows: VecDeque::new(),
            decaying_flows: VecDeque::new(),
            bulk_flow_count: 0,
            sparse_flow_count: 0,
            decaying_flow_count: 0,
            unresponsive_flow_count: 0,
            time_next_packet: 0,
            tin_deficit: 0,
            backlog: 0,
            stats: TinCounters::default(),
        }
    }

    fn list(&mut self, l: List) -> &mut VecDeque<u16> {
        match l {
            List::New => &mut self.new_flows,
            List::Old => &mut self.old_flows,
            List::Decaying => &mut self.decaying_flows,
        }
    }

    fn unlink(&mut self, idx: usize) {
        if let Some(l) = self.flows[idx].list.take() {
            let list = self.list(l);
            if let Some(pos) = list.iter().position(|&f| f as usize == idx) {
                list.remove(pos);
            }
        }
    }

    /// `list_move_tail`.
    fn move_tail(&mut self, idx: usize, to: List) {
        self.unlink(idx);
        self.list(to).push_back(idx as u16);
        self.flows[idx].list = Some(to);
    }

    fn active(&self) -> bool {
        self.sparse_flow_count + self.bulk_flow_count > 0
    }

    /// Host bulk-flow counters of a flow, in the modes that keep them.
    fn host_bulk(&mut self, idx: usize, mode: FlowMode, delta: i32) {
        let (s, d) = (
            self.flows[idx].srchost as usize,
            self.flows[idx].dsthost as usize,
        );
        if mode.dual_src() {
            let c = &mut self.hosts[s].srchost_bulk_flow_count;
            *c = (*c as i32 + delta).max(0) as u16;
        }
        if mode.dual_dst() {
            let c = &mut self.hosts[d].dsthost_bulk_flow_count;
            *c = (*c as i32 + delta).max(0) as u16;
        }
    }

    fn host_load(&self, idx: usize, mode: FlowMode) -> usize {
        let f = &self.flows[idx];
        let mut load = 1u16;
        if mode.dual_src() {
            load = load.max(self.hosts[f.srchost as usize].srchost_bulk_flow_count);
        }
        if mode.dual_dst() {
            load = load.max(self.hosts[f.dsthost as usize].dsthost_bulk_flow_count);
        }
        (load as usize).min(QUEUES)
    }
}

/// `quantum_div[n] = 65535 / n`: a flow's share of its host's quantum.
fn quantum_div(n: usize) -> u32 {
    if n == 0 {
        65535
    } else {
        65535 / n as u32
    }
}

/// Memory a packet holds in Linux (skb truesize), estimated: the data buffer rounded up to a
/// kmalloc size class with headroom (64) and `skb_shared_info` (320), plus the 256-byte
/// `sk_buff`. 1500-byte packets cost 2304, ACKs 768, as seen on veth and TUN.
fn truesize(len: usize) -> u64 {
    ((len + 64 + 320).next_power_of_two().max(512) + 256) as u64
}

fn ewma(avg: u64, sample: u64, shift: u32) -> u64 {
    avg - (avg >> shift) + (sample >> shift)
}

fn hash_bytes(seed: u64, b: &[u8]) -> u32 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    seed.hash(&mut h);
    b.hash(&mut h);
    h.finish() as u32
}

pub struct Cake {
    p: CakeParams,
    /// MTU-sized frame (`psched_mtu`: MTU plus the 14-byte Ethernet header).
    mtu: u32,
    seed: u64,
    tins: Vec<Tin>,
    /// Shaper rate, bytes/s (the kernel's `rate_bps`); 0 unlimited.
    rate: u64,
    time_next_packet: i64,
    failsafe_next_packet: i64,
    cur_tin: usize,
    buffer_used: u64,
    buffer_max_used: u64,
    buffer_limit: u64,
    packets: usize,
    bytes: usize,
    overlimits: u64,
    // autorate-ingress (`cake_enqueue`'s capacity estimate)
    last_packet_time: i64,
    avg_window_begin: i64,
    avg_packet_interval: u64,
    avg_window_bytes: u64,
    avg_peak_bandwidth: u64,
    rng: SmallRng,
}

impl Cake {
    /// `mtu` is the link's IP MTU.
    pub fn new(p: CakeParams, mtu: usize, seed: u64) -> Cake {
        let rate = p.bandwidth_bps / 8;
        let tins = (0..p.tin_mode.tin_count()).map(|_| Tin::new()).collect();
        let mut c = Cake {
            mtu: mtu as u32 + 14,
            seed,
            tins,
            rate,
            time_next_packet: 0,
            failsafe_next_packet: 0,
            cur_tin: 0,
            buffer_used: 0,
            buffer_max_used: 0,
            buffer_limit: 0,
            packets: 0,
            bytes: 0,
            overlimits: 0,
            last_packet_time: 0,
            avg_window_begin: 0,
            avg_packet_interval: 0,
            avg_window_bytes: 0,
            avg_peak_bandwidth: rate,
            rng: SmallRng::seed_from_u64(seed ^ 0xcafe),
            p,
        };
        c.reconfigure();
        c
    }

    pub fn params(&self) -> &CakeParams {
        &self.p
    }

    /// Shaper rate now, bits/s (moves with autorate-ingress).
    pub fn rate_bps(&self) -> u64 {
        self.rate * 8
    }

    /// `cake_reconfigure`: per-tin thresholds, CoDel tuning and the memory limit.
    fn reconfigure(&mut self) {
        let rates = self.p.tin_mode.tin_rates(self.rate);
        for (t, (rate, quantum)) in self.tins.iter_mut().zip(rates) {
            t.tuning = tune_tin(rate, self.mtu, self.p.target_ns, self.p.interval_ns);
            t.cparams = CobaltParams::new(
                t.tuning.target_ns,
                t.tuning.interval_ns,
                t.tuning.mtu_time_ns,
            );
            t.tin_quantum = quantum as i32;
        }
        self.buffer_limit = buffer_limit(&self.p, self.rate, self.mtu);
    }

    fn adjusted_len(&self, p: &Packet) -> u32 {
        self.p.adjusted_len(p.len(), p.frame_len)
    }

    /// `cake_hash`: the queue of a packet in tin `t`, with set-associative placement and the
    /// host slots the dual modes count bulk flows in.
    fn classify(&mut self, t: usize, pkt: &Packet) -> usize {
        let mode = self.p.flow_mode;
        if mode == FlowMode::Flowblind {
            return 0;
        }
        let (src_h, dst_h) = match (mode.hashes_hosts(), pkt.addresses()) {
            (true, Some((s, d))) => (hash_bytes(self.seed, s), hash_bytes(self.seed, d)),
            _ => (0, 0),
        };
        let mut flow_hash = if mode.hashes_flows() {
            pkt.flow_hash(self.seed) as u32
        } else {
            0
        };
        if !mode.hashes_flows() {
            if mode as u8 & 1 != 0 {
                flow_hash ^= src_h;
            }
            if mode as u8 & 2 != 0 {
                flow_hash ^= dst_h;
            }
        }
        let b = &mut self.tins[t];
        let reduced = flow_hash as usize % QUEUES;
        if b.tags[reduced] == flow_hash && b.flows[reduced].set != Set::None {
            b.stats.way_directs += 1;
            return reduced;
        }
        let inner = reduced % WAYS;
        let outer = reduced - inner;
        let way = |i: usize| outer + (inner + i) % WAYS;
        let (slot, allocate) = if let Some(i) = (0..WAYS).find(|&i| b.tags[way(i)] == flow_hash) {
            // A queue of this set is already reserved for the flow.
            if i > 0 {
                b.stats.way_hits += 1;
            }
            (way(i), b.flows[way(i)].set == Set::None)
        } else if let Some(i) = (0..WAYS).find(|&i| b.flows[way(i)].set == Set::None) {
            b.stats.way_misses += 1;
            (way(i), true)
        } else {
            // Every way busy: share the original queue; its host counts move to the newcomer.
            b.stats.way_collisions += 1;
            if b.flows[reduced].set == Set::Bulk {
                b.host_bulk(reduced, FlowMode::TripleIsolate, -1);
            }
            (reduced, true)
        };
        b.tags[slot] = flow_hash;
        if allocate && mode.dual_src() {
            let h = Self::host_slot(
                &b.hosts,
                src_h,
                |h| h.srchost_tag,
                |h| h.srchost_bulk_flow_count,
            );
            b.hosts[h].srchost_tag = src_h;
            if b.flows[slot].set == Set::Bulk {
                b.hosts[h].srchost_bulk_flow_count += 1;
            }
            b.flows[slot].srchost = h as u16;
        }
        if allocate && mode.dual_dst() {
            let h = Self::host_slot(
                &b.hosts,
                dst_h,
                |h| h.dsthost_tag,
                |h| h.dsthost_bulk_flow_count,
            );
            b.hosts[h].dsthost_tag = dst_h;
            if b.flows[slot].set == Set::Bulk {
                b.hosts[h].dsthost_bulk_flow_count += 1;
            }
            b.flows[slot].dsthost = h as u16;
        }
        slot
    }

    /// A host's slot: its tagged way, else an idle way, else the first way of its set.
    fn host_slot(
        hosts: &[Host],
        hash: u32,
        tag: impl Fn(&Host) -> u32,
        bulk: impl Fn(&Host) -> u16,
    ) -> usize {
        let reduced = hash as usize % QUEUES;
        let inner = reduced % WAYS;
        let outer = reduced - inner;
        let way = |i: usize| outer + (inner + i) % WAYS;
        (0..WAYS)
            .map(way)
            .find(|&k| tag(&hosts[k]) == hash)
            .or_else(|| (0..WAYS).map(way).find(|&k| bulk(&hosts[k]) == 0))
            .unwrap_or(way(0))
    }

    /// `cake_advance_shaper`: charges a packet to its tin's clock and the global shaper.
    fn advance_shaper(&mut self, t: usize, len: u32, now: i64, drop: bool) {
        if self.rate == 0 {
            return;
        }
        let b = &mut self.tins[t];
        let tin_dur = duration_ns(len as u64, b.tuning.rate) as i64;
        let global_dur = duration_ns(len as u64, self.rate) as i64;
        if b.time_next_packet < now {
            b.time_next_packet += tin_dur;
        } else if b.time_next_packet < now + tin_dur {
            b.time_next_packet = now + tin_dur;
        }
        self.time_next_packet += global_dur;
        if !drop {
            self.failsafe_next_packet += global_dur + global_dur / 2;
        }
    }

    /// `cake_drop`: the head packet of the longest queue, when memory runs out.
    fn drop_from_longest(&mut self, now: i64, stats: &mut DirCounters) {
        // Only flows on the new and old lists hold packets (decaying ones are empty), so the
        // search visits the active flows, not all 1024 queues of every tin, on each drop.
        let longest = self.tins.iter().enumerate().flat_map(|(t, b)| {
            b.new_flows
                .iter()
                .chain(&b.old_flows)
                .map(move |&i| (b.flows[i as usize].backlog, t, i as usize))
        });
        let Some((t, idx)) = longest
            .max_by_key(|x| x.0)
            .filter(|x| x.0 > 0)
            .map(|(_, t, i)| (t, i))
        else {
            return;
        };
        let b = &mut self.tins[t];
        let f = &mut b.flows[idx];
        let Some(pkt) = f.queue.pop_front() else {
            return;
        };
        if f.cvars.queue_full(&b.cparams, now) {
            b.unresponsive_flow_count += 1;
        }
        f.backlog -= pkt.frame_len;
        b.backlog -= pkt.frame_len;
        b.stats.dropped += 1;
        self.bytes -= pkt.frame_len;
        self.packets -= 1;
        self.buffer_used -= truesize(pkt.len());
        stats.drops.overflow += 1;
        if self.p.ingress {
            let len = self.adjusted_len(&pkt);
            self.advance_shaper(t, len, now, true);
        }
    }

    /// autorate-ingress: the arrival rate over bursts, as a peak EWMA; the shaper follows at
    /// 15/16 of it. (The kernel never updates `last_reconfig_time`, so after the first 250 ms
    /// every gap between bursts retunes the shaper; the lab does the same.)
    fn estimate_capacity(&mut self, now: i64) {
        let interval = ((now - self.last_packet_time).max(0) as u64).min(1_000_000_000);
        let shift = if interval > self.avg_packet_interval {
            2
        } else {
            8
        };
        self.avg_packet_interval = ewma(self.avg_packet_interval, interval, shift);
        self.last_packet_time = now;
        if interval > self.avg_packet_interval {
            let window = (now - self.avg_window_begin).max(1) as u64;
            let bw = (self.avg_window_bytes as u128 * 1_000_000_000 / window as u128) as u64;
            let shift = if bw > self.avg_peak_bandwidth { 2 } else { 8 };
            self.avg_peak_bandwidth = ewma(self.avg_peak_bandwidth, bw, shift);
            self.avg_window_bytes = 0;
            self.avg_window_begin = now;
            if now > 250_000_000 {
                self.rate = (self.avg_peak_bandwidth * 15) >> 4;
                self.reconfigure();
            }
        }
    }

    /// Takes flow `idx` of the current tin off its rotation once it is empty
    /// (`cake_dequeue`'s empty-queue branch): to the decaying list while COBALT has state.
    fn retire_empty_flow(&mut self, idx: usize, now: i64) {
        let mode = self.p.flow_mode;
        let b = &mut self.tins[self.cur_tin];
        let cp = b.cparams;
        if b.flows[idx].cvars.queue_empty(&cp, now) {
            b.unresponsive_flow_count = b.unresponsive_flow_count.saturating_sub(1);
        }
        let f = &b.flows[idx];
        let set = f.set;
        if f.cvars.p_drop != 0 || f.cvars.count != 0 || now < f.cvars.drop_next {
            b.move_tail(idx, List::Decaying);
            match set {
                Set::Bulk => {
                    b.bulk_flow_count -= 1;
                    b.host_bulk(idx, mode, -1);
                    b.decaying_flow_count += 1;
                }
                Set::Sparse | Set::SparseWait => {
                    b.sparse_flow_count -= 1;
                    b.decaying_flow_count += 1;
                }
                _ => {}
            }
            b.flows[idx].set = Set::Decaying;
        } else {
            b.unlink(idx);
            match set {
                Set::Sparse | Set::SparseWait => b.sparse_flow_count -= 1,
                Set::Bulk => {
                    b.bulk_flow_count -= 1;
                    b.host_bulk(idx, mode, -1);
                }
                _ => b.decaying_flow_count = b.decaying_flow_count.saturating_sub(1),
            }
            b.flows[idx].set = Set::None;
        }
    }

    /// Picks the tin to serve (`cake_dequeue`): by DRR weight when unlimited; when shaped, the
    /// highest tin still under its threshold, else the one whose clock expires first.
    fn choose_tin(&mut self, now: i64) -> bool {
        if self.rate == 0 {
            let (mut wrapped, mut empty) = (false, true);
            loop {
                let b = &mut self.tins[self.cur_tin];
                if b.tin_deficit >= 0 && b.active() {
                    return true;
                }
                if b.tin_deficit <= 0 {
                    b.tin_deficit += b.tin_quantum;
                }
                if b.active() {
                    empty = false;
                }
                self.cur_tin += 1;
                if self.cur_tin >= self.tins.len() {
                    self.cur_tin = 0;
                    if wrapped {
                        if empty {
                            return false;
                        }
                    } else {
                        wrapped = true;
                    }
                }
            }
        }
        let mut best = (i64::MAX, 0usize);
        for (t, b) in self.tins.iter().enumerate() {
            if b.active() {
                let to_go = b.time_next_packet - now;
                if to_go <= 0 || to_go <= best.0 {
                    best = (to_go, t);
                }
            }
        }
        self.cur_tin = best.1;
        self.tins[best.1].active()
    }

    /// Per-tin and overall statistics, as `tc -s qdisc show` prints them for cake.
    pub fn stats(&self) -> CakeStats {
        let names = self.p.tin_mode.names();
        let tins = self
            .p
            .tin_mode
            .stats_order()
            .into_iter()
            .map(|t| {
                let b = &self.tins[t];
                let s = &b.stats;
                TinStats {
                    name: names[t].to_string(),
                    thresh_bps: b.tuning.rate * 8,
                    target_us: b.tuning.target_ns / 1000,
                    interval_us: b.tuning.interval_ns / 1000,
                    pk_delay_us: s.peak_delay / 1000,
                    av_delay_us: s.avge_delay / 1000,
                    sp_delay_us: s.base_delay / 1000,
                    backlog_bytes: b.backlog as u64,
                    packets: s.packets,
                    bytes: s.bytes,
                    way_inds: s.way_hits,
                    way_miss: s.way_misses,
                    way_cols: s.way_collisions,
                    drops: s.dropped,
                    marks: s.ecn_marked,
                    ack_drops: s.ack_drops,
                    overlimit_drops: s.drop_overlimit,
                    sparse_flows: (b.sparse_flow_count + b.decaying_flow_count) as u64,
                    bulk_flows: b.bulk_flow_count as u64,
                    unresponsive_flows: b.unresponsive_flow_count as u64,
                    max_len: s.max_skblen as u64,
                    quantum: b.tuning.flow_quantum as u64,
                }
            })
            .collect();
        CakeStats {
            settings: self.p.describe(),
            rate_bps: self.rate * 8,
            capacity_estimate_bps: self.avg_peak_bandwidth * 8,
            memory_limit: self.buffer_limit,
            memory_used: self.buffer_max_used,
            overlimits: self.overlimits,
            tins,
        }
    }
}

impl Qdisc for Cake {
    /// `cake_enqueue`.
    fn enqueue(&mut self, mut pkt: Packet, now_ns: u64, stats: &mut DirCounters) {
        let now = now_ns as i64;
        let dscp = pkt.dscp();
        if self.p.wash && dscp != 0 {
            pkt.clear_dscp();
        }
        let t = self.p.tin_mode.tin_of(dscp).min(self.tins.len() - 1);
        let idx = self.classify(t, &pkt);
        let idle = self.packets == 0;
        let b = &mut self.tins[t];
        // No credit for idle time: stale clocks restart now.
        if b.backlog == 0 {
            if b.time_next_packet < now {
                b.time_next_packet = now;
            }
            if idle && self.time_next_packet < now {
                self.failsafe_next_packet = now;
                self.time_next_packet = now;
            } else if idle && self.time_next_packet > now && self.failsafe_next_packet > now {
                self.overlimits += 1;
            }
        }
        let len = pkt.frame_len;
        b.stats.max_skblen = b.stats.max_skblen.max(len);
        pkt.enqueued_ns = now_ns;
        let size = truesize(pkt.len());
        let f = &mut b.flows[idx];
        f.queue.push_back(pkt);
        let filtered = match self.p.ack_filter {
            AckFilter::Off => None,
            mode => ack_filter::redundant_ack(&f.queue, mode == AckFilter::Aggressive),
        };
        // With an ACK filtered out, the queue grows by the difference (`len -= ack len`).
        let mut ack_len = 0;
        let mut charge = None;
        match filtered.and_then(|i| f.queue.remove(i)) {
            Some(ack) => {
                b.stats.ack_drops += 1;
                stats.drops.ack_filter += 1;
                self.buffer_used = self.buffer_used + size - truesize(ack.len());
                ack_len = ack.frame_len;
                if self.p.ingress {
                    charge = Some(self.p.adjusted_len(ack.len(), ack.frame_len));
                }
            }
            None => {
                self.packets += 1;
                self.buffer_used += size;
            }
        }
        let f = &mut b.flows[idx];
        b.stats.packets += 1;
        b.stats.bytes += len as u64;
        f.backlog = f.backlog + len - ack_len;
        b.backlog = b.backlog + len - ack_len;
        self.bytes = self.bytes + len - ack_len;
        self.avg_window_bytes = (self.avg_window_bytes + len as u64).saturating_sub(ack_len as u64);
        if let Some(len) = charge {
            self.advance_shaper(t, len, now, true);
        }
        if self.p.autorate_ingress {
            self.estimate_capacity(now);
        } else {
            self.avg_window_bytes = 0;
            self.last_packet_time = now;
        }
        // Flowchain: an idle or decaying queue starts over as a sparse flow.
        let mode = self.p.flow_mode;
        let b = &mut self.tins[t];
        match b.flows[idx].set {
            Set::None | Set::Decaying => {
                if b.flows[idx].set == Set::Decaying {
                    b.decaying_flow_count -= 1;
                }
                b.move_tail(idx, List::New);
                b.flows[idx].set = Set::Sparse;
                b.sparse_flow_count += 1;
                let load = b.host_load(idx, mode);
                b.flows[idx].deficit = ((b.tuning.flow_quantum * quantum_div(load)) >> 16) as i32;
            }
            Set::SparseWait => {
                b.flows[idx].set = Set::Bulk;
                b.sparse_flow_count -= 1;
                b.bulk_flow_count += 1;
                b.host_bulk(idx, mode, 1);
            }
            _ => {}
        }
        self.buffer_max_used = self.buffer_max_used.max(self.buffer_used);
        while self.buffer_used > self.buffer_limit && self.packets > 0 {
            self.tins[t].stats.drop_overlimit += 1;
            self.drop_from_longest(now, stats);
        }
    }

    /// `cake_dequeue`.
    fn dequeue(&mut self, now_ns: u64, stats: &mut DirCounters) -> Option<Packet> {
        let now = now_ns as i64;
        let mode = self.p.flow_mode;
        // Decaying flows get one look per dequeue call (not per pass) so their state can rest.
        let mut first_flow = true;
        'begin: loop {
            if self.packets == 0 {
                return None;
            }
            if self.time_next_packet > now && self.failsafe_next_packet > now {
                self.overlimits += 1;
                return None;
            }
            if !self.choose_tin(now) {
                return None;
            }
            let t = self.cur_tin;
            'retry: loop {
                let b = &mut self.tins[t];
                let head = if first_flow && !b.decaying_flows.is_empty() {
                    List::Decaying
                } else if !b.new_flows.is_empty() {
                    List::New
                } else if !b.old_flows.is_empty() {
                    List::Old
                } else if !b.decaying_flows.is_empty() {
                    List::Decaying
                } else {
                    continue 'begin;
                };
                let idx = *b.list(head).front().expect("non-empty") as usize;
                first_flow = false;
                if b.flows[idx].deficit <= 0 {
                    // DRR++: out of credit, to the back of the bulk rotation with a new quantum
                    // shared among its host's bulk flows.
                    if b.flows[idx].set == Set::Sparse {
                        if !b.flows[idx].queue.is_empty() {
                            b.sparse_flow_count -= 1;
                            b.bulk_flow_count += 1;
                            b.flows[idx].set = Set::Bulk;
                            b.host_bulk(idx, mode, 1);
                        } else {
                            b.flows[idx].set = Set::SparseWait;
                        }
                    }
                    let load = b.host_load(idx, mode);
                    let dither = self.rng.random::<u32>() >> 16;
                    let b = &mut self.tins[t];
                    b.flows[idx].deficit +=
                        ((b.tuning.flow_quantum * quantum_div(load) + dither) >> 16) as i32;
                    b.move_tail(idx, List::Old);
                    continue 'retry;
                }
                // Through the AQM until a packet passes or the queue is empty.
                loop {
                    let b = &mut self.tins[t];
                    let f = &mut b.flows[idx];
                    let Some(mut pkt) = f.queue.pop_front() else {
                        self.retire_empty_flow(idx, now);
                        continue 'begin;
                    };
                    f.backlog -= pkt.frame_len;
                    b.backlog -= pkt.frame_len;
                    self.bytes -= pkt.frame_len;
                    self.packets -= 1;
                    self.buffer_used -= truesize(pkt.len());
                    let sojourn = now - pkt.enqueued_ns as i64;
                    let bulk = if self.p.ingress { b.bulk_flow_count } else { 0 };
                    // BLUE's coin, drawn only for a flow BLUE has marked as unresponsive.
                    let draw = if b.flows[idx].cvars.p_drop != 0 {
                        self.rng.random::<u32>()
                    } else {
                        u32::MAX
                    };
                    let b = &mut self.tins[t];
                    let cp = b.cparams;
                    let f = &mut b.flows[idx];
                    let signal = f
                        .cvars
                        .should_drop(&cp, now, sojourn, pkt.is_ect(), draw, bulk);
                    if f.cvars.ecn_marked {
                        pkt.mark_ce();
                    }
                    // The last packet of a queue is never dropped (it may be marked).
                    if matches!(signal, Signal::Pass | Signal::Mark) || f.queue.is_empty() {
                        if f.cvars.ecn_marked {
                            b.stats.ecn_marked += 1;
                            stats.ecn_marks += 1;
                        }
                        let delay = sojourn.max(0) as u64;
                        let s = &mut b.stats;
                        s.avge_delay = ewma(s.avge_delay, delay, 8);
                        s.peak_delay = ewma(
                            s.peak_delay,
                            delay,
                            if delay > s.peak_delay { 2 } else { 8 },
                        );
                        s.base_delay = ewma(
                            s.base_delay,
                            delay,
                            if delay < s.base_delay { 2 } else { 8 },
                        );
                        let len = self.adjusted_len(&pkt);
                        self.advance_shaper(t, len, now, false);
                        let b = &mut self.tins[t];
                        b.flows[idx].deficit -= len as i32;
                        b.tin_deficit -= len as i32;
                        return Some(pkt);
                    }
                    b.stats.dropped += 1;
                    stats.drops.aqm += 1;
                    if self.p.ingress {
                        // Downstream of the bottleneck, a dropped packet still used the link.
                        let len = self.adjusted_len(&pkt);
                        self.advance_shaper(t, len, now, true);
                        let b = &mut self.tins[t];
                        b.flows[idx].deficit -= len as i32;
                        b.tin_deficit -= len as i32;
                        continue 'retry;
                    }
                }
            }
        }
    }

    fn packets(&self) -> usize {
        self.packets
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn name(&self) -> &'static str {
        "cake"
    }

    fn next_ready(&self) -> u64 {
        if self.rate == 0 {
            0
        } else {
            self.time_next_packet.min(self.failsafe_next_packet).max(0) as u64
        }
    }

    fn drain(&mut self) -> Vec<Packet> {
        let mut all: Vec<Packet> = self
            .tins
            .iter_mut()
            .flat_map(|b| b.flows.iter_mut().flat_map(|f| f.queue.drain(..)))
            .collect();
        all.sort_by_key(|p| p.enqueued_ns);
        self.packets = 0;
        self.bytes = 0;
        all
    }

    /// `cake_change` with only `TCA_CAKE_BASE_RATE64`: the new rate, `cake_reconfigure`'s
    /// per-tin thresholds and memory limit from it; flows, queues and CoDel state kept.
    fn change_in_place(&mut self, to: &crate::config::QdiscConfig) -> bool {
        let crate::config::QdiscKind::Cake(p) = &to.kind else {
            return false;
        };
        let same_but_rate = CakeParams {
            bandwidth_bps: p.bandwidth_bps,
            ..self.p
        };
        if *p != same_but_rate {
            return false;
        }
        self.p.bandwidth_bps = p.bandwidth_bps;
        self.rate = p.bandwidth_bps / 8;
        self.reconfigure();
        true
    }

    fn cake_stats(&self) -> Option<CakeStats> {
        Some(self.stats())
    }
}

pub use bloatlab_result::lab::{CakeStats, TinStats};

#[cfg(test)]
mod tests;
