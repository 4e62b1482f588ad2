//! FQ-CoDel (RFC 8290): packets hashed into flow queues, each managed by CoDel, served by
//! deficit round robin with new (sparse) flows ahead of old (bulk) ones.

use crate::codel::{CodelParams, CodelState};
use crate::packet::Packet;
use crate::qdisc::Qdisc;
use crate::stats::DirCounters;
use std::collections::VecDeque;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FqCodelParams {
    pub flows: usize,
    pub quantum: usize,
    /// Total packets across all flows.
    pub limit: usize,
    /// Total bytes across all flows (stands in for Linux's memory_limit of skb truesize).
    pub memory_limit: usize,
    pub drop_batch: usize,
    pub codel: CodelParams,
    pub seed: u64,
}

impl Default for FqCodelParams {
    fn default() -> Self {
        FqCodelParams {
            flows: 1024,
            quantum: 1514,
            limit: 10_240,
            memory_limit: 32 << 20,
            drop_batch: 64,
            codel: CodelParams {
                ecn: true,
                ..Default::default()
            },
            seed: 0,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum List {
    None,
    New,
    Old,
}

struct Flow {
    queue: VecDeque<Packet>,
    bytes: usize,
    deficit: i64,
    codel: CodelState,
    list: List,
}

pub struct FqCodel {
    pub params: FqCodelParams,
    flows: Vec<Flow>,
    new_flows: VecDeque<usize>,
    old_flows: VecDeque<usize>,
    packets: usize,
    bytes: usize,
}

impl FqCodel {
    pub fn new(params: FqCodelParams) -> FqCodel {
        let flows = (0..params.flows.max(1))
            .map(|_| Flow {
                queue: VecDeque::new(),
                bytes: 0,
                deficit: 0,
                codel: CodelState::default(),
                list: List::None,
            })
            .collect();
        FqCodel {
            params,
            flows,
            new_flows: VecDeque::new(),
            old_flows: VecDeque::new(),
            packets: 0,
            bytes: 0,
        }
    }

    /// Linux's fat-flow drop: from the head of the flow with the largest backlog, until half of
    /// it is gone or `drop_batch` packets; CoDel of that flow is told to signal harder.
    fn drop_from_fattest(&mut self, stats: &mut DirCounters) {
        let Some((idx, _)) = self.flows.iter().enumerate().max_by_key(|(_, f)| f.bytes) else {
            return;
        };
        let f = &mut self.flows[idx];
        let threshold = f.bytes / 2;
        let mut dropped = 0;
        while dropped < self.params.drop_batch.max(1) {
            let Some(p) = f.queue.pop_front() else { break };
            f.bytes -= p.frame_len;
            self.bytes -= p.frame_len;
            self.packets -= 1;
            dropped += 1;
            if f.bytes <= threshold {
                break;
            }
        }
        f.codel.count = f.codel.count.saturating_add(dropped as u32);
        stats.drops.overflow += dropped as u64;
    }
}

impl Qdisc for FqCodel {
    fn enqueue(&mut self, mut pkt: Packet, now: u64, stats: &mut DirCounters) {
        let idx = (pkt.flow_hash(self.params.seed) % self.flows.len() as u64) as usize;
        pkt.enqueued_ns = now;
        let len = pkt.frame_len;
        let f = &mut self.flows[idx];
        f.queue.push_back(pkt);
        f.bytes += len;
        if f.list == List::None {
            f.list = List::New;
            f.deficit = self.params.quantum as i64;
            self.new_flows.push_back(idx);
        }
        self.packets += 1;
        self.bytes += len;
        if self.packets > self.params.limit || self.bytes > self.params.memory_limit {
            self.drop_from_fattest(stats);
        }
    }

    fn dequeue(&mut self, now: u64, stats: &mut DirCounters) -> Option<Packet> {
        loop {
            let (idx, from_new) = match self.new_flows.front() {
                Some(&i) => (i, true),
                None => (*self.old_flows.front()?, false),
            };
            let f = &mut self.flows[idx];
            if f.deficit <= 0 {
                f.deficit += self.params.quantum as i64;
                f.list = List::Old;
                if from_new {
                    self.new_flows.pop_front();
                } else {
                    self.old_flows.pop_front();
                }
                self.old_flows.push_back(idx);
                continue;
            }
            let (before_pk, before_b) = (f.queue.len(), f.bytes);
            let others = self.bytes - f.bytes;
            let got = f.codel.dequeue(
                &mut f.queue,
                &mut f.bytes,
                others,
                now,
                &self.params.codel,
                stats,
            );
            // CoDel may have dropped packets on the way: keep the totals in step.
            self.packets -= before_pk - f.queue.len();
            self.bytes -= before_b - f.bytes;
            match got {
                Some(p) => {
                    f.deficit -= p.frame_len as i64;
                    return Some(p);
                }
                None => {
                    // Anti-starvation: an emptied new flow passes through the old list once.
                    if from_new {
                        self.new_flows.pop_front();
                        if !self.old_flows.is_empty() {
                            f.list = List::Old;
                            self.old_flows.push_back(idx);
                        } else {
                            f.list = List::None;
                        }
                    } else {
                        self.old_flows.pop_front();
                        f.list = List::None;
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
        "fq_codel"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::udp4;
    use crate::MS;

    /// Four bulk flows keep the queue saturated at 2x the drain rate; a sparse flow sends one
    /// small packet every 20 ms. Its packets must wait under 1 ms while the bulk flows still
    /// fill the link.
    #[test]
    fn a_sparse_flow_skips_the_bulk_queue() {
        let mut q = FqCodel::new(FqCodelParams::default());
        let mut st = DirCounters::default();
        let tx = 1_200_000u64; // 1500 B at 10 Mbit/s
        let mut t = 0u64;
        let mut next_bulk = 0u64;
        let mut next_sparse = 0u64;
        let mut sparse_sojourns = Vec::new();
        let mut bulk_bytes = 0usize;
        while t < 10_000 * MS {
            while next_bulk <= t {
                for port in 0..4 {
                    q.enqueue(udp4(1500, 5000 + port, 80, 0), next_bulk, &mut st);
                }
                next_bulk += 2 * tx;
            }
            if next_sparse <= t {
                q.enqueue(udp4(200, 4000, 53, 0), next_sparse, &mut st);
                next_sparse += 20 * MS;
            }
            // The link serialises each packet at 10 Mbit/s (800 ns per byte).
            match q.dequeue(t, &mut st) {
                Some(p) => {
                    // From 1 s on: at the very start every bulk flow is new too and goes first.
                    if p.len() == 200 && t > 1000 * MS {
                        sparse_sojourns.push(t - p.enqueued_ns);
                    } else if p.len() == 1500 {
                        bulk_bytes += p.len();
                    }
                    t += p.len() as u64 * 800;
                }
                None => t += tx,
            }
        }
        let worst = *sparse_sojourns.iter().max().unwrap();
        assert!(worst < MS + tx, "sparse flow waited {} us", worst / 1000);
        assert!(
            sparse_sojourns.len() >= 440,
            "{} sparse packets",
            sparse_sojourns.len()
        );
        // The link stayed busy with bulk traffic (all but the sparse share).
        let busy = bulk_bytes as f64 * 800.0 / (10_000 * MS) as f64;
        assert!(busy > 0.95, "bulk used {busy:.3} of the link");
        assert!(st.drops.aqm > 0, "CoDel must have acted on the bulk flows");
    }

    /// Linux's one-MTU rule looks at the whole qdisc's backlog (`sch->qstats.backlog` in
    /// `codel_should_drop`), not the flow's: a thin flow that never has more than one packet
    /// queued is still dropped when its packets keep waiting behind a busy qdisc. On a 1 Mbit/s
    /// link (12 ms per 1500 B packet) with four bulk flows, a 1500 B packet every 97 ms waits
    /// for the packet on the wire: 11, 10, 9 ... ms in turn (97 = 8 * 12 + 1), so it stays
    /// above target for longer than an interval, and CoDel acts on it.
    #[test]
    fn a_thin_flow_behind_a_busy_qdisc_is_not_exempt_from_codel() {
        let mut q = FqCodel::new(FqCodelParams {
            codel: CodelParams {
                ecn: false,
                ..Default::default()
            },
            ..Default::default()
        });
        let mut st = DirCounters::default();
        let tx = 12 * MS; // 1500 B at 1 Mbit/s
        let (mut t, mut next_thin) = (0u64, 0u64);
        let (mut thin_sent, mut thin_got) = (0, 0);
        while t < 60_000 * MS {
            // Four bulk flows keep the qdisc at about 100 packets.
            if q.packets() < 100 {
                for port in 0..4u16 {
                    q.enqueue(udp4(1500, 5000 + port, 80, 0), t, &mut st);
                }
            }
            if next_thin <= t {
                q.enqueue(udp4(1500, 4000, 53, 0), next_thin, &mut st);
                thin_sent += 1;
                next_thin += 97 * MS;
            }
            if let Some(p) = q.dequeue(t, &mut st) {
                thin_got += (u16::from_be_bytes([p.data[20], p.data[21]]) == 4000) as usize;
            }
            t += tx;
        }
        let thin_queued = q
            .flows
            .iter()
            .map(|f| {
                f.queue
                    .iter()
                    .filter(|p| u16::from_be_bytes([p.data[20], p.data[21]]) == 4000)
                    .count()
            })
            .sum::<usize>();
        let thin_dropped = thin_sent - thin_got - thin_queued;
        assert!(
            thin_dropped > 0,
            "the thin flow lost nothing to CoDel ({thin_sent} sent)"
        );
        assert!(
            thin_dropped < thin_sent / 4,
            "{thin_dropped} of {thin_sent} thin packets dropped"
        );
    }

    #[test]
    fn overflow_drops_from_the_fattest_flow() {
        let params = FqCodelParams {
            limit: 100,
            ..Default::default()
        };
        let mut q = FqCodel::new(params);
        let mut st = DirCounters::default();
        for _ in 0..100 {
            q.enqueue(udp4(1500, 1, 80, 0), 0, &mut st);
        }
        q.enqueue(udp4(100, 2, 53, 0), 0, &mut st);
        assert_eq!(st.drops.overflow, 50, "half of the fat flow's 150000 bytes");
        // The small flow's packet survived.
        let mut small = 0;
        while let Some(p) = q.dequeue(0, &mut st) {
            small += (p.len() == 100) as usize;
        }
        assert_eq!(small, 1);
        assert_eq!((q.packets(), q.bytes()), (0, 0));
    }
}
