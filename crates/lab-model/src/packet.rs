//! Raw IP packets as read from a TUN device, and the few header fields the model needs.

use crate::vnet::{Payload, VnetHdr};

/// An IP packet in a queue, with the time it entered the queue (for sojourn time).
#[derive(Clone, Debug)]
pub struct Packet {
    /// The IP packet; for one wire segment of a super-packet, its IP and TCP headers only.
    pub data: Vec<u8>,
    /// A segment's TCP payload, shared with the super-packet it came in (see `gso`).
    pub payload: Option<Payload>,
    /// What the sending kernel left to the receiver (a checksum to complete), passed on as is.
    pub vnet: VnetHdr,
    pub enqueued_ns: u64,
    /// Bytes the link and its qdisc account for this packet: the IP packet plus the link's
    /// per-packet overhead and ATM framing, as Linux's `qdisc_pkt_len` with a size table (and
    /// the Ethernet header it counts anyway). Byte limits, DRR deficits and CoDel's backlog
    /// use it, so a 52-byte ACK costs a flow what it costs on the wire.
    pub frame_len: usize,
}

const ECN_MASK: u8 = 0b11;
const CE: u8 = 0b11;

impl Packet {
    /// A packet accounted at its IP length (a link without overhead).
    pub fn new(data: Vec<u8>) -> Packet {
        let frame_len = data.len();
        Packet {
            data,
            payload: None,
            vnet: VnetHdr::default(),
            enqueued_ns: 0,
            frame_len,
        }
    }

    /// A whole packet as read from a TUN device with its virtio header (no GSO).
    pub fn with_vnet(data: Vec<u8>, vnet: VnetHdr) -> Packet {
        Packet {
            vnet,
            ..Packet::new(data)
        }
    }

    /// Bytes of the IP packet on the wire (headers and payload).
    pub fn len(&self) -> usize {
        self.data.len() + self.payload.as_ref().map_or(0, |p| p.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn version(&self) -> u8 {
        self.data.first().map_or(0, |b| b >> 4)
    }

    /// The ECN field (RFC 3168): 0 Not-ECT, 1 ECT(1), 2 ECT(0), 3 CE.
    pub fn ecn(&self) -> u8 {
        match self.version() {
            4 if self.data.len() >= 20 => self.data[1] & ECN_MASK,
            6 if self.data.len() >= 40 => (self.data[1] >> 4) & ECN_MASK,
            _ => 0,
        }
    }

    /// ECN-capable transport: a CoDel signal may mark instead of drop.
    pub fn is_ect(&self) -> bool {
        self.ecn() != 0
    }

    /// Sets CE on an ECN-capable packet; IPv4's header checksum is updated incrementally
    /// (RFC 1624). Returns false (and changes nothing) for Not-ECT packets.
    pub fn mark_ce(&mut self) -> bool {
        if !self.is_ect() {
            return false;
        }
        match self.version() {
            4 => {
                let old = u16::from_be_bytes([self.data[0], self.data[1]]);
                self.data[1] |= CE;
                let new = u16::from_be_bytes([self.data[0], self.data[1]]);
                self.fix_ipv4_checksum(old, new);
            }
            _ => self.data[1] |= CE << 4,
        }
        true
    }

    /// The DSCP (the top six bits of IPv4's TOS or IPv6's traffic class); 0 if unparsable.
    pub fn dscp(&self) -> u8 {
        match self.version() {
            4 if self.data.len() >= 20 => self.data[1] >> 2,
            6 if self.data.len() >= 40 => ((self.data[0] & 0x0f) << 2) | (self.data[1] >> 6),
            _ => 0,
        }
    }

    /// Clears the DSCP and keeps the ECN bits (CAKE's `wash`); IPv4's checksum follows.
    pub fn clear_dscp(&mut self) {
        let ecn = self.ecn();
        self.set_tos(ecn);
    }

    /// Sets the whole TOS / traffic-class byte (DSCP and ECN); IPv4's checksum follows.
    pub fn set_tos(&mut self, tos: u8) {
        match self.version() {
            4 if self.data.len() >= 20 => {
                let old = u16::from_be_bytes([self.data[0], self.data[1]]);
                self.data[1] = tos;
                let new = u16::from_be_bytes([self.data[0], self.data[1]]);
                self.fix_ipv4_checksum(old, new);
            }
            6 if self.data.len() >= 40 => {
                // The traffic class straddles bytes 0 and 1: version | TC high | TC low | flow.
                self.data[0] = (self.data[0] & 0xf0) | (tos >> 4);
                self.data[1] = (self.data[1] & 0x0f) | (tos << 4);
            }
            _ => {}
        }
    }

    /// RFC 1624 incremental update for a changed 16-bit word of the IPv4 header:
    /// HC' = ~(~HC + ~m + m').
    fn fix_ipv4_checksum(&mut self, old: u16, new: u16) {
        let sum = u16::from_be_bytes([self.data[10], self.data[11]]);
        let mut acc = (!sum) as u32 + (!old) as u32 + new as u32;
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        self.data[10..12].copy_from_slice(&(!(acc as u16)).to_be_bytes());
    }

    /// Source and destination addresses (4 or 16 bytes each).
    pub fn addresses(&self) -> Option<(&[u8], &[u8])> {
        let d = &self.data;
        match self.version() {
            4 if d.len() >= 20 => Some((&d[12..16], &d[16..20])),
            6 if d.len() >= 40 => Some((&d[8..24], &d[24..40])),
            _ => None,
        }
    }

    /// A hash of the 5-tuple (addresses, protocol, ports) that FQ-CoDel uses to tell flows
    /// apart; packets it cannot parse all land in one flow.
    pub fn flow_hash(&self, seed: u64) -> u64 {
        use std::hash::{Hash, Hasher};
        let d = &self.data;
        let mut h = std::hash::DefaultHasher::new();
        seed.hash(&mut h);
        let (addrs, proto, l4) = match self.version() {
            4 if d.len() >= 20 => {
                let ihl = ((d[0] & 0x0f) as usize) * 4;
                (&d[12..20], d[9], ihl)
            }
            6 if d.len() >= 40 => (&d[8..40], d[6], 40),
            _ => (&d[..0], 0, 0),
        };
        addrs.hash(&mut h);
        proto.hash(&mut h);
        if matches!(proto, 6 | 17 | 132) && d.len() >= l4 + 4 {
            d[l4..l4 + 4].hash(&mut h);
        }
        h.finish()
    }
}

/// Test helpers: minimal IPv4/UDP packets with chosen ports and ECN.
#[cfg(test)]
pub fn udp4(len: usize, sport: u16, dport: u16, ecn: u8) -> Packet {
    let mut d = vec![0u8; len.max(28)];
    d[0] = 0x45;
    d[1] = ecn & ECN_MASK;
    d[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    d[8] = 64;
    d[9] = 17;
    d[12..16].copy_from_slice(&[10, 0, 0, 1]);
    d[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let sum = ipv4_checksum(&d[..20]);
    d[10..12].copy_from_slice(&sum.to_be_bytes());
    d[20..22].copy_from_slice(&sport.to_be_bytes());
    d[22..24].copy_from_slice(&dport.to_be_bytes());
    Packet::new(d)
}

#[cfg(test)]
pub use crate::vnet::ipv4_checksum;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ce_mark_keeps_the_ipv4_checksum_valid() {
        let mut p = udp4(100, 1, 2, 2);
        assert!(p.mark_ce());
        assert_eq!(p.ecn(), 3);
        let sum = u16::from_be_bytes([p.data[10], p.data[11]]);
        assert_eq!(sum, ipv4_checksum(&p.data[..20]));
        let mut not_ect = udp4(100, 1, 2, 0);
        assert!(!not_ect.mark_ce());
        assert_eq!(not_ect.ecn(), 0);
    }

    #[test]
    fn wash_clears_dscp_keeps_ecn_and_the_checksum() {
        let mut p = udp4(100, 1, 2, 2);
        p.data[1] |= 46 << 2;
        let sum = ipv4_checksum(&p.data[..20]);
        p.data[10..12].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(p.dscp(), 46);
        p.clear_dscp();
        assert_eq!((p.dscp(), p.ecn()), (0, 2));
        assert_eq!(
            u16::from_be_bytes([p.data[10], p.data[11]]),
            ipv4_checksum(&p.data[..20])
        );
    }

    #[test]
    fn flows_differ_by_port_and_agree_on_the_same_tuple() {
        let a = udp4(100, 1000, 53, 0).flow_hash(7);
        assert_eq!(a, udp4(1400, 1000, 53, 0).flow_hash(7));
        assert_ne!(a, udp4(100, 1001, 53, 0).flow_hash(7));
    }
}
