//! UDP probe packets. The client sends a request, the server overwrites its timestamp fields
//! and sends the same number of bytes back (never more: no amplification).
//!
//! A third kind, [`Kind::Load`], carries a constant-rate UDP load (`bloatlab test udp`): the
//! server counts it and answers nothing.
//!
//! Layout (big endian): magic "BLP1" | kind u8 | flags u8 | stream u16 | token [16] | seq u32 |
//! client_send_ns u64 | server_recv_ns u64 | server_send_ns u64 | server_rx_count u32 | padding.
//! With a shared key (flag [`FLAG_MAC`]) the last 16 bytes of the padding are the packet's MAC
//! ([`crate::auth::sign_probe`]), in requests and replies alike.
//!
//! A request with [`FLAG_MARKS`] (`test marks`) asks for the TOS byte its reply is to carry, and
//! its reply says what TOS the request arrived with: the three bytes after the header are
//! reply TOS (asked, then as sent) | request TOS as received | bit 1: the server wrote these
//! fields, bit 0: it could read the request's TOS. A server that predates the flag echoes the
//! bytes as they came: the last one stays 0.

pub const MAGIC: [u8; 4] = *b"BLP1";
pub const HEADER_LEN: usize = 56;
/// Largest probe the server echoes; larger ones are not bloatlab's.
pub const MAX_LEN: usize = 1472;
/// Flag: the packet ends in a MAC under the shared key.
pub const FLAG_MAC: u8 = 1;
/// Flag: the three bytes after the header are the marks fields ([`Marks`]).
pub const FLAG_MARKS: u8 = 2;
/// Bytes of the marks fields.
pub const MARKS_LEN: usize = 3;
/// Shortest probe that can carry a MAC.
pub const MIN_SIGNED_LEN: usize = HEADER_LEN + crate::auth::PROBE_MAC_LEN;

use crate::Token;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Request,
    Reply,
    /// A packet of a UDP load stream: counted by the server, never answered.
    Load,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub kind: Kind,
    pub stream: u16,
    pub token: Token,
    pub seq: u32,
    /// Client's monotonic clock at send, ns.
    pub client_send_ns: u64,
    /// Server's monotonic clock at receive and at reply, ns (0 in requests).
    pub server_recv_ns: u64,
    pub server_send_ns: u64,
    /// Requests of this stream the server had accepted, this one included (0 in requests).
    pub server_rx_count: u32,
    /// `FLAG_MAC` when the packet is signed.
    pub flags: u8,
}

/// The marks fields of a [`FLAG_MARKS`] probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marks {
    /// In a request, the TOS byte (DSCP and ECN) its reply is to carry; in a reply, the TOS
    /// the server's socket sent it with.
    pub reply_tos: u8,
    /// In a reply, the TOS byte the request arrived with; `None` in requests, and when the
    /// server could not read it.
    pub request_tos: Option<u8>,
    /// Written by a server that knows the flag (false in requests, and in an older server's
    /// echo of one).
    pub answered: bool,
}

impl Marks {
    /// Writes the fields after the header of `buf` (the whole packet); false when the packet
    /// has no room for them (beside its MAC when `signed`).
    pub fn write(&self, buf: &mut [u8], signed: bool) -> bool {
        if !Marks::fits(buf.len(), signed) {
            return false;
        }
        buf[HEADER_LEN] = self.reply_tos;
        buf[HEADER_LEN + 1] = self.request_tos.unwrap_or(0);
        buf[HEADER_LEN + 2] = u8::from(self.answered) << 1 | u8::from(self.request_tos.is_some());
        true
    }

    /// The fields of a packet whose header carries [`FLAG_MARKS`]; `None` when it has no room
    /// for them.
    pub fn read(buf: &[u8], signed: bool) -> Option<Marks> {
        Marks::fits(buf.len(), signed).then(|| Marks {
            reply_tos: buf[HEADER_LEN],
            request_tos: (buf[HEADER_LEN + 2] & 1 == 1).then_some(buf[HEADER_LEN + 1]),
            answered: buf[HEADER_LEN + 2] & 2 == 2,
        })
    }

    fn fits(len: usize, signed: bool) -> bool {
        let mac = if signed {
            crate::auth::PROBE_MAC_LEN
        } else {
            0
        };
        len >= HEADER_LEN + MARKS_LEN + mac && len <= MAX_LEN
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProbeError {
    #[error("probe of {0} bytes (allowed {HEADER_LEN}..={MAX_LEN})")]
    Length(usize),
    #[error("not a bloatlab probe")]
    Magic,
    #[error("unknown probe kind {0}")]
    Kind(u8),
}

impl Probe {
    /// Writes the header into `buf` (whose length is the packet length); padding is left as is.
    pub fn encode(&self, buf: &mut [u8]) -> Result<(), ProbeError> {
        if buf.len() < HEADER_LEN || buf.len() > MAX_LEN {
            return Err(ProbeError::Length(buf.len()));
        }
        buf[0..4].copy_from_slice(&MAGIC);
        buf[4] = match self.kind {
            Kind::Request => 0,
            Kind::Reply => 1,
            Kind::Load => 2,
        };
        buf[5] = self.flags;
        buf[6..8].copy_from_slice(&self.stream.to_be_bytes());
        buf[8..24].copy_from_slice(&self.token.0);
        buf[24..28].copy_from_slice(&self.seq.to_be_bytes());
        buf[28..36].copy_from_slice(&self.client_send_ns.to_be_bytes());
        buf[36..44].copy_from_slice(&self.server_recv_ns.to_be_bytes());
        buf[44..52].copy_from_slice(&self.server_send_ns.to_be_bytes());
        buf[52..56].copy_from_slice(&self.server_rx_count.to_be_bytes());
        Ok(())
    }

    pub fn decode(buf: &[u8]) -> Result<Probe, ProbeError> {
        if buf.len() < HEADER_LEN || buf.len() > MAX_LEN {
            return Err(ProbeError::Length(buf.len()));
        }
        if buf[0..4] != MAGIC {
            return Err(ProbeError::Magic);
        }
        let kind = match buf[4] {
            0 => Kind::Request,
            1 => Kind::Reply,
            2 => Kind::Load,
            k => return Err(ProbeError::Kind(k)),
        };
        let u64_at = |i: usize| u64::from_be_bytes(buf[i..i + 8].try_into().unwrap());
        let mut token = [0u8; 16];
        token.copy_from_slice(&buf[8..24]);
        Ok(Probe {
            kind,
            stream: u16::from_be_bytes([buf[6], buf[7]]),
            token: Token(token),
            seq: u32::from_be_bytes(buf[24..28].try_into().unwrap()),
            client_send_ns: u64_at(28),
            server_recv_ns: u64_at(36),
            server_send_ns: u64_at(44),
            server_rx_count: u32::from_be_bytes(buf[52..56].try_into().unwrap()),
            flags: buf[5],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_keeps_length() {
        let p = Probe {
            kind: Kind::Reply,
            stream: 3,
            token: Token([7; 16]),
            seq: 99,
            client_send_ns: 1,
            server_recv_ns: u64::MAX,
            server_send_ns: 5,
            server_rx_count: 42,
            flags: FLAG_MAC,
        };
        let mut buf = vec![0xee; 172];
        p.encode(&mut buf).unwrap();
        assert_eq!(Probe::decode(&buf).unwrap(), p);
        assert!(
            buf[HEADER_LEN..].iter().all(|&b| b == 0xee),
            "padding untouched"
        );
    }

    #[test]
    fn marks_fit_before_the_mac_and_say_when_the_server_read_none() {
        let m = Marks {
            reply_tos: 0xba,
            request_tos: Some(0x01),
            answered: true,
        };
        let mut buf = vec![0u8; HEADER_LEN + MARKS_LEN];
        assert!(m.write(&mut buf, false));
        assert_eq!(Marks::read(&buf, false), Some(m));
        assert!(!m.write(&mut buf, true), "no room beside a MAC");
        assert_eq!(Marks::read(&buf, true), None);
        // A request (and an old server's echo of it) says nothing of what arrived.
        let req = Marks {
            reply_tos: 4,
            request_tos: None,
            answered: false,
        };
        assert!(req.write(&mut buf, false));
        assert_eq!(Marks::read(&buf, false), Some(req));
    }

    #[test]
    fn rejects_short_long_and_foreign_packets() {
        assert_eq!(Probe::decode(&[0; 10]), Err(ProbeError::Length(10)));
        assert_eq!(
            Probe::decode(&[0; MAX_LEN + 1]),
            Err(ProbeError::Length(MAX_LEN + 1))
        );
        assert_eq!(Probe::decode(&[0; HEADER_LEN]), Err(ProbeError::Magic));
        let mut b = [0u8; HEADER_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = 9;
        assert_eq!(Probe::decode(&b), Err(ProbeError::Kind(9)));
    }
}
