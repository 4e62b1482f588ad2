//! What the server keeps of a UDP load stream (`test udp`): distinct packets by sequence
//! number, their bytes per bucket of arrival time, reordering and duplicates, within a bound on
//! rate and memory set by what the test announced. Pure: the caller gives every time.

use crate::limits::Bucket;
use bloatlab_proto::buckets::Buckets;
use bloatlab_proto::{UdpLoadReport, UdpLoadSpec};
use std::time::{Duration, Instant};

/// Most packets one load may announce: its duplicate bitmap is an eighth of this in bytes.
pub const MAX_PACKETS: u64 = 1 << 24;
/// Most arrival buckets one load may ask for (the report carries them all).
pub const MAX_BUCKETS: u64 = 300_000;
/// Narrowest bucket accepted.
pub const MIN_BUCKET_US: u32 = 100;

/// Packets a load of `spec` sends over `duration` at its announced rate.
pub fn announced_packets(spec: &UdpLoadSpec, duration: Duration) -> u64 {
    let pps = spec.rate_bps as f64 / 8.0 / f64::from(spec.size.max(1));
    (pps * duration.as_secs_f64()).ceil() as u64
}

#[derive(Debug)]
pub struct UdpSink {
    /// One bit per sequence number up to `seen.len() * 64`: a bitmap sized by the announcement.
    seen: Vec<u64>,
    max_seq: Option<u32>,
    received: u64,
    /// Of those, arrived CE.
    ce: u64,
    bytes: u64,
    duplicates: u64,
    reordered: u64,
    limited: u64,
    arrivals: Buckets,
    /// Payload bytes per second the sink takes: twice the announced rate, a second of it as burst.
    rate: Bucket,
}

impl UdpSink {
    /// For a load announced as `spec` in a test of `duration` (plus the server's grace).
    pub fn new(spec: &UdpLoadSpec, duration: Duration, now: Instant) -> UdpSink {
        // 10% and 1000 packets of slack over the announcement: a sender's rounding, not a flood.
        let packets = announced_packets(spec, duration) * 11 / 10 + 1000;
        let buckets = duration.as_micros() as u64 / u64::from(spec.bucket_us.max(1)) + 1;
        let per_sec = spec.rate_bps as f64 / 8.0;
        UdpSink {
            seen: vec![0; packets.div_ceil(64) as usize],
            max_seq: None,
            received: 0,
            ce: 0,
            bytes: 0,
            duplicates: 0,
            reordered: 0,
            limited: 0,
            arrivals: Buckets::new(u64::from(spec.bucket_us) * 1000, buckets as usize),
            rate: Bucket::new(2.0 * per_sec, per_sec.max(65_536.0), now),
        }
    }

    /// One packet of `len` payload bytes with sequence number `seq`, arrived at `t_ns` (the
    /// monotonic clock of the report) and `now`, marked CE or not.
    pub fn arrive(&mut self, seq: u32, len: usize, t_ns: u64, ce: bool, now: Instant) {
        let (word, bit) = (seq as usize / 64, seq % 64);
        if word >= self.seen.len() || !self.rate.take_n(len as f64, now) {
            self.limited += 1;
            return;
        }
        if self.seen[word] & (1 << bit) != 0 {
            self.duplicates += 1;
            return;
        }
        self.seen[word] |= 1 << bit;
        if self.max_seq.is_some_and(|m| seq < m) {
            self.reordered += 1;
        }
        self.max_seq = self.max_seq.max(Some(seq));
        self.received += 1;
        self.ce += u64::from(ce);
        self.bytes += len as u64;
        self.arrivals.add(t_ns, len as u32);
    }

    pub fn report(&self, id: u16, socket_drops: Option<u64>) -> UdpLoadReport {
        UdpLoadReport {
            id,
            received: self.received,
            bytes: self.bytes,
            duplicates: self.duplicates,
            reordered: self.reordered,
            server_limited: self.limited,
            ce: self.ce,
            socket_drops,
            bucket_us: (self.arrivals.bucket_ns() / 1000) as u32,
            first_recv_ns: self.arrivals.first_ns().unwrap_or(0),
            buckets: self.arrivals.bytes().to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> UdpLoadSpec {
        // 8 Mbit/s of 1000-byte packets: 1000 per second.
        UdpLoadSpec {
            id: 1,
            rate_bps: 8_000_000,
            size: 1000,
            dscp: 0,
            ecn: 0,
            bucket_us: 1000,
        }
    }

    #[test]
    fn counts_distinct_packets_reordering_and_duplicates_per_bucket() {
        let t0 = Instant::now();
        let mut s = UdpSink::new(&spec(), Duration::from_secs(2), t0);
        for (seq, t_ms) in [(0u32, 10u64), (2, 10), (1, 11), (1, 12), (3, 14)] {
            s.arrive(
                seq,
                1000,
                t_ms * 1_000_000,
                seq == 3,
                t0 + Duration::from_millis(t_ms),
            );
        }
        let r = s.report(1, Some(0));
        assert_eq!(
            (
                r.received,
                r.bytes,
                r.duplicates,
                r.reordered,
                r.server_limited,
                r.ce
            ),
            (4, 4000, 1, 1, 0, 1)
        );
        assert_eq!(r.first_recv_ns, 10_000_000);
        assert_eq!(
            r.buckets,
            [2000, 1000, 0, 0, 1000],
            "1 ms buckets from the first arrival"
        );
    }

    /// Held to what it announced: twice the rate with a second of burst, and sequence numbers
    /// within the announced count; memory is the bitmap and the buckets, both sized by it.
    #[test]
    fn a_flood_beyond_the_announcement_is_declined_not_counted() {
        let t0 = Instant::now();
        let mut s = UdpSink::new(&spec(), Duration::from_secs(2), t0);
        // 5000 packets at one instant: a second's worth (1 MB) is taken, the rest declined.
        for seq in 0..5000 {
            s.arrive(seq, 1000, 0, false, t0);
        }
        let r = s.report(1, None);
        assert_eq!(r.received, 1000);
        assert_eq!(r.server_limited, 4000);
        s.arrive(10_000_000, 1000, 1, false, t0 + Duration::from_secs(1));
        assert_eq!(
            s.report(1, None).server_limited,
            4001,
            "a sequence number far beyond the announcement"
        );
        assert_eq!(
            s.seen.len(),
            (2000 * 11 / 10 + 1000_u64).div_ceil(64) as usize
        );
    }
}
