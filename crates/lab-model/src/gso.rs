//! Super-packets. A TUN device opened with IFF_VNET_HDR and TSO offloads hands its reader up to
//! 64 KB of one TCP connection per read, with a virtio-net header saying how the wire would cut
//! it (`gso_size` bytes of payload per segment). One read then moves what 44 reads did, which is
//! what lets the lab forward at 10 Gbit/s; but the link is a wire, so the model must see every
//! segment: serialisation, limits in packets, drops, marks and framing are per segment.
//!
//! `split` cuts a super-packet into its wire segments as Linux's `tcp_gso_segment` would (IP
//! length and id, TCP sequence number, flags, checksum) without copying the payload: each
//! segment's `Packet` owns its headers and shares the payload buffer. `coalesce` undoes it on
//! the way out: consecutive segments of one super-packet that left the link unchanged (none
//! dropped between them, the same ECN and DSCP) are written back as one super-packet, so a
//! write costs what a read did; any other packet is written as it is.

use crate::packet::Packet;
use crate::vnet::{
    ipv4_checksum, pseudo_header_csum, Payload, VnetHdr, F_NEEDS_CSUM, GSO_ECN, GSO_NONE,
    GSO_TCPV4, GSO_TCPV6,
};
use std::sync::Arc;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;
/// Where the checksum sits in a TCP header.
const TCP_CSUM_OFFSET: u16 = 16;

/// Where a TCP super-packet's parts are.
struct Layout {
    v4: bool,
    /// Offset of the TCP header.
    l4: usize,
    /// IP and TCP headers together.
    hdr: usize,
}

impl Layout {
    /// The headers of an IP packet carrying TCP whose checksum is partial, as the kernel builds
    /// a super-packet; None for anything else.
    fn of(d: &[u8], vnet: &VnetHdr) -> Option<Layout> {
        let v4 = match (d.first()? >> 4, vnet.gso_type & !GSO_ECN) {
            (4, GSO_TCPV4) => true,
            (6, GSO_TCPV6) => false,
            _ => return None,
        };
        if vnet.flags & F_NEEDS_CSUM == 0 || vnet.csum_offset != TCP_CSUM_OFFSET {
            return None;
        }
        let l4 = vnet.csum_start as usize;
        // The IP header must be whole and end where TCP begins (IPv6 may have extension
        // headers in between, which the segments carry unchanged).
        let ip_ok = if v4 {
            d.len() >= 20 && d[9] == 6 && l4 == ((d[0] & 0x0f) as usize) * 4 && l4 >= 20
        } else {
            d.len() >= 40 && l4 >= 40
        };
        if !ip_ok || d.len() < l4 + 20 {
            return None;
        }
        let hdr = l4 + ((d[l4 + 12] >> 4) as usize) * 4;
        (hdr >= l4 + 20 && hdr <= d.len()).then_some(Layout { v4, l4, hdr })
    }

    /// The IP addresses, for the pseudo-header.
    fn addresses<'a>(&self, h: &'a [u8]) -> (&'a [u8], &'a [u8]) {
        if self.v4 {
            (&h[12..16], &h[16..20])
        } else {
            (&h[8..24], &h[24..40])
        }
    }

    /// Sets the lengths and checksums of headers `h` carrying `payload` bytes.
    fn finish(&self, h: &mut [u8], payload: usize) {
        if self.v4 {
            h[2..4].copy_from_slice(&((self.hdr + payload) as u16).to_be_bytes());
            let ihl = self.l4;
            let sum = ipv4_checksum(&h[..ihl]);
            h[10..12].copy_from_slice(&sum.to_be_bytes());
        } else {
            h[4..6].copy_from_slice(&((self.hdr - 40 + payload) as u16).to_be_bytes());
        }
        let (src, dst) = self.addresses(h);
        let csum = pseudo_header_csum(src, dst, self.hdr - self.l4 + payload);
        h[self.l4 + 16..self.l4 + 18].copy_from_slice(&csum.to_be_bytes());
    }
}

/// The wire segments of a TCP super-packet `buf` (the IP packet as read, after `vnet`), as
/// Linux's `tcp_gso_segment` cuts them: each carries `gso_size` bytes of payload (the last the
/// rest), its IPv4 id counts up, its sequence number advances, CWR stays on the first, FIN and
/// PSH on the last, and each TCP checksum is left partial for its own length. None when `buf` is
/// not a TCP super-packet this understands; the caller then takes it as one packet.
pub fn split(vnet: &VnetHdr, buf: Arc<Vec<u8>>, train: u64) -> Option<Vec<Packet>> {
    if !vnet.is_tcp_gso() || vnet.gso_size == 0 {
        return None;
    }
    let d = buf.as_slice();
    let lay = Layout::of(d, vnet)?;
    let declared = if lay.v4 {
        u16::from_be_bytes([d[2], d[3]]) as usize
    } else {
        40 + u16::from_be_bytes([d[4], d[5]]) as usize
    };
    let body = d.len() - lay.hdr;
    if declared != d.len() || body == 0 {
        return None;
    }
    let mss = vnet.gso_size as usize;
    let count = body.div_ceil(mss);
    let seq = u32::from_be_bytes(d[lay.l4 + 4..lay.l4 + 8].try_into().expect("4 bytes"));
    let id = u16::from_be_bytes([d[4], d[5]]);
    let seg_vnet = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_NONE,
        hdr_len: lay.hdr as u16,
        gso_size: 0,
        csum_start: lay.l4 as u16,
        csum_offset: TCP_CSUM_OFFSET,
    };
    let mut out = Vec::with_capacity(count);
    for k in 0..count {
        let start = lay.hdr + k * mss;
        let len = mss.min(d.len() - start);
        let mut h = d[..lay.hdr].to_vec();
        if lay.v4 {
            h[4..6].copy_from_slice(&id.wrapping_add(k as u16).to_be_bytes());
        }
        h[lay.l4 + 4..lay.l4 + 8]
            .copy_from_slice(&seq.wrapping_add((k * mss) as u32).to_be_bytes());
        let flags = &mut h[lay.l4 + 13];
        if k > 0 {
            *flags &= !TCP_CWR;
        }
        if k + 1 < count {
            *flags &= !(TCP_FIN | TCP_PSH);
        }
        lay.finish(&mut h, len);
        let payload = Payload {
            buf: buf.clone(),
            start,
            len,
            train,
            index: k as u32,
        };
        out.push(Packet {
            payload: Some(payload),
            ..Packet::with_vnet(h, seg_vnet)
        });
    }
    Some(out)
}

/// One write into a TUN device: the virtio header, then `head`, then the payload, if any.
pub struct Write {
    pub vnet: VnetHdr,
    pub head: Vec<u8>,
    pub payload: Option<(Arc<Vec<u8>>, std::ops::Range<usize>)>,
}

impl Write {
    fn of(p: Packet) -> Write {
        Write {
            vnet: p.vnet,
            head: p.data,
            payload: p.payload.map(|s| (s.buf, s.start..s.start + s.len)),
        }
    }

    /// Wire segments this write carries.
    pub fn segments(&self) -> usize {
        match (&self.payload, self.vnet.gso_size) {
            (Some((_, r)), mss) if mss > 0 => r.len().div_ceil(mss as usize),
            _ => 1,
        }
    }
}

/// Whether `b` continues `a` on the wire unchanged: the next segment of the same super-packet
/// with the same IP header bytes that the link may change (ECN, DSCP).
fn continues(a: &Packet, b: &Packet) -> bool {
    match (&a.payload, &b.payload) {
        (Some(x), Some(y)) => {
            x.train == y.train
                && y.index == x.index + 1
                && a.data.len() == b.data.len()
                && a.data[..2] == b.data[..2]
        }
        _ => false,
    }
}

/// Merges a run of consecutive segments (at least two) back into one super-packet: the first
/// one's headers with the run's length, FIN and PSH of the last, and a partial checksum.
fn merge(run: Vec<Packet>) -> Write {
    let last_flags_of = |p: &Packet| p.data[p.vnet.csum_start as usize + 13];
    let last_flags = last_flags_of(run.last().expect("a run"));
    let mut first = run.into_iter();
    let head = first.next().expect("a run");
    let seg = head
        .payload
        .as_ref()
        .expect("segments have payloads")
        .clone();
    let mss = seg.len;
    let end = first
        .last()
        .and_then(|p| p.payload)
        .map_or(seg.start + seg.len, |s| s.start + s.len);
    let v4 = head.data[0] >> 4 == 4;
    let lay = Layout {
        v4,
        l4: head.vnet.csum_start as usize,
        hdr: head.data.len(),
    };
    let mut h = head.data;
    h[lay.l4 + 13] = (h[lay.l4 + 13] & !(TCP_FIN | TCP_PSH)) | (last_flags & (TCP_FIN | TCP_PSH));
    lay.finish(&mut h, end - seg.start);
    let ecn = if h[lay.l4 + 13] & TCP_CWR != 0 {
        GSO_ECN
    } else {
        0
    };
    let vnet = VnetHdr {
        gso_type: if v4 { GSO_TCPV4 } else { GSO_TCPV6 } | ecn,
        gso_size: mss as u16,
        ..head.vnet
    };
    Write {
        vnet,
        head: h,
        payload: Some((seg.buf, seg.start..end)),
    }
}

/// The writes that deliver `packets`, all due at once: consecutive unchanged segments of each
/// super-packet merged back, everything else as it is. A queue that serves flows in turn
/// (FQ-CoDel, CAKE) interleaves their segments, so a run may continue past other flows'
/// segments; it never passes a whole packet, which could belong to its own flow, so every
/// flow's order is kept.
pub fn coalesce(packets: impl IntoIterator<Item = Packet>) -> Vec<Write> {
    let mut out = Vec::new();
    let mut runs: Vec<Vec<Packet>> = Vec::new();
    let flush = |runs: &mut Vec<Vec<Packet>>, out: &mut Vec<Write>| {
        for mut run in runs.drain(..) {
            out.push(if run.len() == 1 {
                Write::of(run.pop().expect("one"))
            } else {
                merge(run)
            });
        }
    };
    for p in packets {
        if p.payload.is_none() {
            flush(&mut runs, &mut out);
            out.push(Write::of(p));
            continue;
        }
        match runs
            .iter_mut()
            .find(|r| continues(r.last().expect("runs are not empty"), &p))
        {
            Some(run) => run.push(p),
            None => runs.push(vec![p]),
        }
    }
    flush(&mut runs, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vnet::{fold, sum16};

    /// A TCP super-packet as the kernel hands it over: IPv4 (id 7) or IPv6, 12 bytes of TCP
    /// options, sequence number 1000, the given flags, `body` bytes of payload 0, 1, 2, ...
    fn super_packet(v4: bool, body: usize, flags: u8) -> (VnetHdr, Vec<u8>) {
        let (ip, l4) = if v4 { (20, 20) } else { (40, 40) };
        let hdr = l4 + 32;
        let mut d = vec![0u8; hdr + body];
        if v4 {
            d[0] = 0x45;
            d[1] = 0x02; // ECT(0)
            d[2..4].copy_from_slice(&((hdr + body) as u16).to_be_bytes());
            d[4..6].copy_from_slice(&7u16.to_be_bytes());
            d[8] = 64;
            d[9] = 6;
            d[12..16].copy_from_slice(&[10, 77, 0, 1]);
            d[16..20].copy_from_slice(&[10, 77, 0, 2]);
            let s = ipv4_checksum(&d[..20]);
            d[10..12].copy_from_slice(&s.to_be_bytes());
        } else {
            d[0] = 0x60;
            d[1] = 0x20; // ECT(0) in the traffic class
            d[4..6].copy_from_slice(&((hdr - 40 + body) as u16).to_be_bytes());
            d[6] = 6;
            d[7] = 64;
            d[8] = 0xfd;
            d[23] = 1;
            d[24] = 0xfd;
            d[39] = 2;
        }
        let t = &mut d[ip..];
        t[0..4].copy_from_slice(&[0x9c, 0x40, 0x14, 0x51]);
        t[4..8].copy_from_slice(&1000u32.to_be_bytes());
        t[12] = 8 << 4;
        t[13] = flags;
        for (i, b) in d[hdr..].iter_mut().enumerate() {
            *b = i as u8;
        }
        let vnet = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if v4 { GSO_TCPV4 } else { GSO_TCPV6 },
            hdr_len: hdr as u16,
            gso_size: 1448,
            csum_start: l4 as u16,
            csum_offset: 16,
        };
        (vnet, d)
    }

    /// The full IP packet of a segment, its partial checksum completed as a receiver would
    /// (`skb_checksum_help`: sum from csum_start, fold, invert into the field).
    fn wire(p: &Packet) -> Vec<u8> {
        let mut w = p.data.clone();
        if let Some(s) = &p.payload {
            w.extend_from_slice(&s.buf[s.start..s.start + s.len]);
        }
        let l4 = p.vnet.csum_start as usize;
        let c = !fold(sum16(&w[l4..]));
        w[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        w
    }

    /// RFC 793/8200 check of a whole TCP segment: pseudo-header plus segment sum to 0xffff.
    fn tcp_checksum_ok(w: &[u8]) -> bool {
        let (src, dst, l4) = if w[0] >> 4 == 4 {
            (&w[12..16], &w[16..20], 20)
        } else {
            (&w[8..24], &w[24..40], 40)
        };
        let len = (w.len() - l4) as u32;
        fold(sum16(src) + sum16(dst) + 6 + (len >> 16) + (len & 0xffff) + sum16(&w[l4..])) == 0xffff
    }

    #[test]
    fn segments_carry_what_the_wire_would() {
        for v4 in [true, false] {
            let (vnet, d) = super_packet(v4, 4000, TCP_CWR | TCP_PSH | 0x10);
            let hdr = d.len() - 4000;
            let segs = split(&vnet, Arc::new(d.clone()), 9).expect("a TCP super-packet");
            // 4000 bytes at 1448 per segment: 1448, 1448, 1104.
            assert_eq!(
                segs.iter().map(|p| p.len() - hdr).collect::<Vec<_>>(),
                [1448, 1448, 1104]
            );
            let l4 = vnet.csum_start as usize;
            for (k, p) in segs.iter().enumerate() {
                let w = wire(p);
                assert!(tcp_checksum_ok(&w), "v4 {v4}, segment {k}: TCP checksum");
                let seq = u32::from_be_bytes(w[l4 + 4..l4 + 8].try_into().unwrap());
                assert_eq!(seq, 1000 + 1448 * k as u32);
                let start = hdr + 1448 * k;
                assert_eq!(
                    &w[hdr..],
                    &d[start..start + p.len() - hdr],
                    "payload of segment {k}"
                );
                let flags = w[l4 + 13];
                assert_eq!(
                    (flags & TCP_CWR != 0, flags & TCP_PSH != 0),
                    (k == 0, k == 2),
                    "flags of segment {k}"
                );
                if v4 {
                    assert_eq!(u16::from_be_bytes([w[2], w[3]]) as usize, w.len());
                    assert_eq!(u16::from_be_bytes([w[4], w[5]]), 7 + k as u16);
                    assert_eq!(ipv4_checksum(&w[..20]), u16::from_be_bytes([w[10], w[11]]));
                } else {
                    assert_eq!(u16::from_be_bytes([w[4], w[5]]) as usize, w.len() - 40);
                }
                assert_eq!(p.ecn(), 2);
            }
        }
    }

    #[test]
    fn unchanged_runs_merge_back_into_the_super_packet() {
        for v4 in [true, false] {
            let (vnet, d) = super_packet(v4, 10_000, TCP_CWR | TCP_PSH | 0x10);
            let segs = split(&vnet, Arc::new(d.clone()), 1).unwrap();
            assert_eq!(segs.len(), 7);
            let writes = coalesce(segs);
            assert_eq!(writes.len(), 1);
            let w = &writes[0];
            assert_eq!(
                (w.vnet.gso_type, w.vnet.gso_size, w.segments()),
                (vnet.gso_type | GSO_ECN, 1448, 7)
            );
            let (buf, range) = w.payload.as_ref().unwrap();
            let mut whole = w.head.clone();
            whole.extend_from_slice(&buf[range.clone()]);
            // The super-packet as it came, but for the TCP checksum, which the merge recomputed
            // for the same length: the same partial value the kernel would put there.
            let l4 = vnet.csum_start as usize;
            let mut expect = d.clone();
            let (src, dst) = if v4 {
                (&d[12..16], &d[16..20])
            } else {
                (&d[8..24], &d[24..40])
            };
            expect[l4 + 16..l4 + 18]
                .copy_from_slice(&pseudo_header_csum(src, dst, d.len() - l4).to_be_bytes());
            assert_eq!(whole, expect);
        }
    }

    #[test]
    fn a_dropped_or_marked_segment_splits_the_run() {
        let (vnet, d) = super_packet(true, 10_000, TCP_PSH | 0x10);
        let mut segs = split(&vnet, Arc::new(d), 1).unwrap();
        segs.remove(2); // dropped on the link
        assert!(segs[3].mark_ce()); // segment 4 marked
        let writes = coalesce(segs);
        // Segments 0-1 merged; 3 alone (4 differs from it); 4 alone (marked); 5-6 merged.
        let shape: Vec<(usize, u8)> = writes
            .iter()
            .map(|w| (w.segments(), w.vnet.gso_type))
            .collect();
        assert_eq!(
            shape,
            [(2, GSO_TCPV4), (1, GSO_NONE), (1, GSO_NONE), (2, GSO_TCPV4)]
        );
        // The lone segments keep their own headers and partial checksums; PSH only on the last.
        let l4 = 20;
        assert_eq!(writes[3].head[l4 + 13] & TCP_PSH, TCP_PSH);
        assert_eq!(writes[0].head[l4 + 13] & TCP_PSH, 0);
        assert_eq!(writes[2].head[1] & 3, 3, "the marked one is CE");
        let seq = |w: &Write| u32::from_be_bytes(w.head[l4 + 4..l4 + 8].try_into().unwrap());
        assert_eq!(
            writes.iter().map(seq).collect::<Vec<_>>(),
            [1000, 1000 + 3 * 1448, 1000 + 4 * 1448, 1000 + 5 * 1448]
        );
    }

    /// Two flows served in turn, as FQ-CoDel does: each flow's segments merge past the other's,
    /// but never past a whole packet.
    #[test]
    fn interleaved_flows_merge_each_and_keep_their_order() {
        let (vnet, d) = super_packet(true, 4 * 1448, 0x10);
        let a = split(&vnet, Arc::new(d.clone()), 1).unwrap();
        let b = split(&vnet, Arc::new(d), 2).unwrap();
        let ack = Packet::new(vec![0x45; 52]);
        let mut order = Vec::new();
        for (x, y) in a.into_iter().zip(b) {
            order.extend([x, y]);
        }
        order.insert(4, ack);
        let shape: Vec<(Option<u64>, usize)> = coalesce(order)
            .iter()
            .map(|w| (w.payload.as_ref().map(|_| w.head[5] as u64), w.segments()))
            .collect();
        // a0 b0 a1 b1 | ack | a2 b2 a3 b3: IPv4 ids tell the segments apart (7 + index).
        assert_eq!(
            shape,
            [
                (Some(7), 2),
                (Some(7), 2),
                (None, 1),
                (Some(9), 2),
                (Some(9), 2)
            ]
        );
    }

    #[test]
    fn anything_else_is_not_split() {
        let (mut vnet, d) = super_packet(true, 3000, 0x10);
        vnet.gso_type = GSO_NONE;
        assert!(split(&vnet, Arc::new(d.clone()), 1).is_none());
        let (vnet, mut bad) = super_packet(true, 3000, 0x10);
        bad[2] = 0; // the IP length disagrees with what was read
        assert!(split(&vnet, Arc::new(bad), 1).is_none());
        // Any bytes at all: no panic, and whatever splits adds up to the payload.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (mut vnet, mut d) = super_packet(x & 1 == 0, (x >> 8) as usize % 5000 + 1, x as u8);
            let n = d.len();
            d[(x >> 20) as usize % n] ^= (x >> 40) as u8;
            vnet.gso_size = (x >> 32) as u16 % 2000;
            vnet.csum_start = if x & 2 == 0 {
                vnet.csum_start
            } else {
                (x >> 48) as u16 % 80
            };
            if let Some(segs) = split(&vnet, Arc::new(d.clone()), 1) {
                assert_eq!(
                    segs.iter()
                        .map(|p| p.payload.as_ref().unwrap().len)
                        .sum::<usize>(),
                    n - segs[0].data.len()
                );
                coalesce(segs);
            }
        }
    }
}
