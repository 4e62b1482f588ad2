//! What the TUN device's virtio-net header says of a super-packet, the payload a segment
//! shares with it, and the Internet checksums (RFC 1071) the segments need. Leaf of `packet`
//! and `gso`.

use std::sync::Arc;

/// `struct virtio_net_hdr` (include/uapi/linux/virtio_net.h), in the host's byte order as the
/// TUN driver uses it for legacy headers.
pub const VNET_HDR_LEN: usize = 10;
/// The checksum from `csum_start` on is left to the receiver (Linux's CHECKSUM_PARTIAL).
pub const F_NEEDS_CSUM: u8 = 1;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_TCPV6: u8 = 4;
/// The TCP sender uses ECN: CWR stays on the first segment only.
pub const GSO_ECN: u8 = 0x80;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn from_bytes(b: &[u8; VNET_HDR_LEN]) -> VnetHdr {
        let u = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        }
    }

    pub fn to_bytes(self) -> [u8; VNET_HDR_LEN] {
        let mut b = [0u8; VNET_HDR_LEN];
        b[0] = self.flags;
        b[1] = self.gso_type;
        for (i, v) in [
            (2, self.hdr_len),
            (4, self.gso_size),
            (6, self.csum_start),
            (8, self.csum_offset),
        ] {
            b[i..i + 2].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }

    /// A TCP super-packet (the only kind the lab's devices are offered: TSO4 and TSO6).
    pub fn is_tcp_gso(&self) -> bool {
        matches!(self.gso_type & !GSO_ECN, GSO_TCPV4 | GSO_TCPV6)
    }
}

/// One segment's TCP payload: `len` bytes at `start` of the super-packet `buf`, which was number
/// `train` of its direction; `index` counts the segments within it.
#[derive(Clone)]
pub struct Payload {
    pub buf: Arc<Vec<u8>>,
    pub start: usize,
    pub len: usize,
    pub train: u64,
    pub index: u32,
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Payload {{ train {} segment {}, {} bytes at {} }}",
            self.train, self.index, self.len, self.start
        )
    }
}

/// The one's-complement sum of 16-bit words (RFC 1071), not yet folded.
pub(crate) fn sum16(b: &[u8]) -> u32 {
    let mut acc = 0u32;
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        acc += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    if let [last] = words.remainder() {
        acc += (*last as u32) << 8;
    }
    acc
}

pub(crate) fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The IPv4 header checksum of `h` (its checksum field, bytes 10-11, taken as zero).
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    !fold(sum16(h) - u16::from_be_bytes([h[10], h[11]]) as u32)
}

/// What a partial TCP checksum field holds (Linux `__tcp_v4_send_check` and
/// `__tcp_v6_send_check`): the folded pseudo-header sum for `tcp_len` bytes, not inverted; the
/// receiver (or a device) adds the segment itself.
pub(crate) fn pseudo_header_csum(src: &[u8], dst: &[u8], tcp_len: usize) -> u16 {
    fold(sum16(src) + sum16(dst) + 6 + (tcp_len as u32 >> 16) + (tcp_len as u32 & 0xffff))
}
