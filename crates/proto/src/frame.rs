//! Frames on bulk data connections. Both directions carry frames so that a responsiveness probe
//! (`ping`) can ride on a loaded connection and wait behind its data, as an HTTP/2 request does
//! in the RPM method. Header: type (1 byte) and payload length (3 bytes, big endian).

pub const HEADER_LEN: usize = 4;
pub const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// Payload of a data frame the senders write: large enough that headers cost 0.02%.
pub const DATA_PAYLOAD: usize = 128 * 1024;
/// Largest payload of a data frame on a responsiveness (RPM) load connection: HTTP/2's default
/// frame, so a probe on the connection never waits behind more application data than in the
/// draft's tests. See [`responsive_payload`].
pub const RESPONSIVE_PAYLOAD: usize = 16 * 1024;

/// The payload of a responsive sender's next data frame, from the unsent data its socket may
/// hold (5 ms of the connection's rate): a probe queued behind the frame being written then
/// waits about as long as behind the socket's own budget. 1 KiB to 16 KiB: a 16 KiB frame takes
/// 0.4 s at the 0.3 Mbit/s one of 16 flows gets from 5 Mbit/s.
pub fn responsive_payload(unsent_budget: u32) -> usize {
    (unsent_budget as usize).clamp(1024, RESPONSIVE_PAYLOAD)
}
/// Read size of the receivers: the size iperf3 uses; larger buffers measured slower on loopback
/// (the copy out of the socket falls out of the L2 cache).
pub const READ_BUFFER: usize = 128 * 1024;

const TYPE_DATA: u8 = 0;
const TYPE_PING: u8 = 1;
const TYPE_PONG: u8 = 2;
const PING_LEN: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// `n` payload bytes of a data frame arrived (a frame may be reported in pieces).
    Data(usize),
    Ping(u64),
    Pong(u64),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    #[error("control frame of {0} bytes (expected 8)")]
    BadLength(usize),
}

pub fn data_header(len: usize) -> [u8; HEADER_LEN] {
    header(TYPE_DATA, len)
}

pub fn ping(id: u64) -> [u8; HEADER_LEN + PING_LEN] {
    control(TYPE_PING, id)
}

pub fn pong(id: u64) -> [u8; HEADER_LEN + PING_LEN] {
    control(TYPE_PONG, id)
}

fn header(kind: u8, len: usize) -> [u8; HEADER_LEN] {
    assert!(len <= MAX_PAYLOAD);
    let l = (len as u32).to_be_bytes();
    [kind, l[1], l[2], l[3]]
}

fn control(kind: u8, id: u64) -> [u8; HEADER_LEN + PING_LEN] {
    let mut out = [0u8; HEADER_LEN + PING_LEN];
    out[..HEADER_LEN].copy_from_slice(&header(kind, PING_LEN));
    out[HEADER_LEN..].copy_from_slice(&id.to_be_bytes());
    out
}

/// Incremental decoder: feed it whatever `read` returned, in order.
#[derive(Debug, Default)]
pub struct Decoder {
    head: [u8; HEADER_LEN],
    head_len: usize,
    kind: u8,
    remaining: usize,
    ctl: [u8; PING_LEN],
    ctl_len: usize,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes `buf`, calling `on_event` for each event. After an error the stream is not
    /// bloatlab's and must be closed.
    pub fn feed(
        &mut self,
        mut buf: &[u8],
        mut on_event: impl FnMut(Event),
    ) -> Result<(), FrameError> {
        while !buf.is_empty() {
            if self.head_len < HEADER_LEN {
                let n = (HEADER_LEN - self.head_len).min(buf.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&buf[..n]);
                self.head_len += n;
                buf = &buf[n..];
                if self.head_len < HEADER_LEN {
                    return Ok(());
                }
                self.kind = self.head[0];
                self.remaining =
                    u32::from_be_bytes([0, self.head[1], self.head[2], self.head[3]]) as usize;
                match self.kind {
                    TYPE_DATA => {}
                    TYPE_PING | TYPE_PONG if self.remaining == PING_LEN => self.ctl_len = 0,
                    TYPE_PING | TYPE_PONG => return Err(FrameError::BadLength(self.remaining)),
                    other => return Err(FrameError::UnknownType(other)),
                }
                if self.remaining == 0 {
                    self.head_len = 0;
                }
                continue;
            }
            let n = self.remaining.min(buf.len());
            if self.kind == TYPE_DATA {
                on_event(Event::Data(n));
            } else {
                self.ctl[self.ctl_len..self.ctl_len + n].copy_from_slice(&buf[..n]);
                self.ctl_len += n;
            }
            self.remaining -= n;
            buf = &buf[n..];
            if self.remaining == 0 {
                self.head_len = 0;
                if self.kind != TYPE_DATA {
                    let id = u64::from_be_bytes(self.ctl);
                    on_event(if self.kind == TYPE_PING {
                        Event::Ping(id)
                    } else {
                        Event::Pong(id)
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> Vec<u8> {
        let mut s = Vec::new();
        s.extend_from_slice(&data_header(5));
        s.extend_from_slice(b"hello");
        s.extend_from_slice(&ping(7));
        s.extend_from_slice(&data_header(0));
        s.extend_from_slice(&pong(u64::MAX));
        s.extend_from_slice(&data_header(3));
        s.extend_from_slice(b"abc");
        s
    }

    fn decode_in_pieces(s: &[u8], piece: usize) -> Vec<Event> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        for chunk in s.chunks(piece) {
            d.feed(chunk, |e| out.push(e)).unwrap();
        }
        // Merge split data events so that every split compares equal.
        let mut merged: Vec<Event> = Vec::new();
        for e in out {
            match (merged.last_mut(), e) {
                (Some(Event::Data(a)), Event::Data(b)) => *a += b,
                _ => merged.push(e),
            }
        }
        merged
    }

    #[test]
    fn decodes_the_same_whatever_the_read_sizes() {
        let s = stream();
        let want = vec![
            Event::Data(5),
            Event::Ping(7),
            Event::Pong(u64::MAX),
            Event::Data(3),
        ];
        for piece in 1..=s.len() {
            assert_eq!(decode_in_pieces(&s, piece), want, "piece size {piece}");
        }
    }

    #[test]
    fn rejects_unknown_types_and_bad_lengths() {
        let mut d = Decoder::new();
        assert_eq!(
            d.feed(&[9, 0, 0, 0], |_| {}),
            Err(FrameError::UnknownType(9))
        );
        let mut d = Decoder::new();
        assert_eq!(d.feed(&[1, 0, 0, 9], |_| {}), Err(FrameError::BadLength(9)));
    }
}
