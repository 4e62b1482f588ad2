//! The interface every queue discipline implements. Time is passed in, never read.

use crate::packet::Packet;
use crate::stats::DirCounters;

pub trait Qdisc: Send {
    /// Takes a packet arriving at `now`. May drop it or others; drops are counted in `stats`.
    fn enqueue(&mut self, pkt: Packet, now: u64, stats: &mut DirCounters);
    /// The next packet to send at `now`, after any AQM drops or marks.
    fn dequeue(&mut self, now: u64, stats: &mut DirCounters) -> Option<Packet>;
    fn packets(&self) -> usize;
    fn bytes(&self) -> usize;
    fn name(&self) -> &'static str;
    /// The earliest time `dequeue` may release a packet: a shaping qdisc's clock (CAKE); 0
    /// for work-conserving ones, which release whenever the link is free.
    fn next_ready(&self) -> u64 {
        0
    }
    /// Every queued packet in arrival order, leaving the qdisc empty (to move them to another).
    fn drain(&mut self) -> Vec<Packet> {
        let mut scratch = DirCounters::default();
        // At each packet's own arrival time: sojourn 0, so no AQM acts on the move.
        std::iter::from_fn(|| self.dequeue(0, &mut scratch)).collect()
    }
    /// Takes a new shaper rate in place, state kept, when that is all `to` changes (as
    /// `cake_change` with only a bandwidth); false: the caller builds a new qdisc.
    fn change_in_place(&mut self, _to: &crate::config::QdiscConfig) -> bool {
        false
    }
    /// CAKE's per-tin statistics.
    fn cake_stats(&self) -> Option<bloatlab_result::lab::CakeStats> {
        None
    }
}

/// How much a queue may hold; whichever limit is reached first applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub packets: Option<usize>,
    pub bytes: Option<usize>,
}

impl Limit {
    pub fn packets(n: usize) -> Limit {
        Limit {
            packets: Some(n),
            bytes: None,
        }
    }

    pub fn exceeded(&self, packets: usize, bytes: usize) -> bool {
        self.packets.is_some_and(|p| packets > p) || self.bytes.is_some_and(|b| bytes > b)
    }
}
