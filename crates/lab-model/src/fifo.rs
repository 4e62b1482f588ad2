//! First in, first out, with tail drop (refuse the arrival) or head drop (accept it, drop the
//! oldest): head drop gives the freshest data and a faster loss signal to the sender.

use crate::packet::Packet;
use crate::qdisc::{Limit, Qdisc};
use crate::stats::DirCounters;
use std::collections::VecDeque;

pub struct Fifo {
    queue: VecDeque<Packet>,
    bytes: usize,
    pub limit: Limit,
    pub head_drop: bool,
}

impl Fifo {
    pub fn new(limit: Limit, head_drop: bool) -> Fifo {
        Fifo {
            queue: VecDeque::new(),
            bytes: 0,
            limit,
            head_drop,
        }
    }
}

impl Qdisc for Fifo {
    fn enqueue(&mut self, mut pkt: Packet, now: u64, stats: &mut DirCounters) {
        if !self.head_drop
            && self
                .limit
                .exceeded(self.queue.len() + 1, self.bytes + pkt.frame_len)
        {
            stats.drops.overflow += 1;
            return;
        }
        pkt.enqueued_ns = now;
        self.bytes += pkt.frame_len;
        self.queue.push_back(pkt);
        while self.limit.exceeded(self.queue.len(), self.bytes) {
            let old = self
                .queue
                .pop_front()
                .expect("over a limit means not empty");
            self.bytes -= old.frame_len;
            stats.drops.overflow += 1;
        }
    }

    fn dequeue(&mut self, _now: u64, _stats: &mut DirCounters) -> Option<Packet> {
        let p = self.queue.pop_front()?;
        self.bytes -= p.frame_len;
        Some(p)
    }

    fn packets(&self) -> usize {
        self.queue.len()
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn name(&self) -> &'static str {
        if self.head_drop {
            "fifo-headdrop"
        } else {
            "fifo"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::udp4;

    fn seqs(q: &mut Fifo) -> Vec<u16> {
        let mut st = DirCounters::default();
        std::iter::from_fn(|| q.dequeue(0, &mut st))
            .map(|p| u16::from_be_bytes([p.data[20], p.data[21]]))
            .collect()
    }

    #[test]
    fn tail_drop_keeps_the_oldest_and_head_drop_the_newest() {
        for (head, want) in [(false, vec![0, 1, 2]), (true, vec![2, 3, 4])] {
            let mut q = Fifo::new(Limit::packets(3), head);
            let mut st = DirCounters::default();
            for i in 0..5 {
                q.enqueue(udp4(100, i, 9, 0), i as u64, &mut st);
            }
            assert_eq!(st.drops.overflow, 2);
            assert_eq!(seqs(&mut q), want, "head_drop={head}");
        }
    }

    #[test]
    fn byte_limit_counts_bytes() {
        let mut q = Fifo::new(
            Limit {
                packets: None,
                bytes: Some(3000),
            },
            false,
        );
        let mut st = DirCounters::default();
        for i in 0..3 {
            q.enqueue(udp4(1500, i, 9, 0), 0, &mut st);
        }
        assert_eq!((q.packets(), q.bytes(), st.drops.overflow), (2, 3000, 1));
    }
}
