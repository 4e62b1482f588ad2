//! rtnetlink for traffic control: one message changes a qdisc's or a class's options (no `tc`
//! process per change), and dumps show what a device has. Messages as `linux/rtnetlink.h`,
//! `linux/pkt_sched.h` lay them out; the kernel's replies are bounded and parsed defensively.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub const RTM_NEWQDISC: u16 = 36;
pub const RTM_GETQDISC: u16 = 38;
pub const RTM_NEWTCLASS: u16 = 40;
pub const RTM_GETTCLASS: u16 = 42;
pub const TCA_KIND: u16 = 1;
pub const TCA_OPTIONS: u16 = 2;
/// `tcm_parent` of a device's root qdisc and of a root qdisc's top classes.
pub const TC_H_ROOT: u32 = 0xFFFF_FFFF;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_MULTI: u16 = 2;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const HEADER: usize = 16;
const TCMSG: usize = 20;
/// More objects than any device has: a dump longer than this is refused.
const MAX_OBJECTS: usize = 10_000;

/// `struct tcmsg`'s addressing: the device, the object's handle and its parent's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcMsg {
    pub ifindex: i32,
    pub handle: u32,
    pub parent: u32,
}

/// A qdisc or class from a dump.
#[derive(Clone, Debug)]
pub struct TcObject {
    pub msg: TcMsg,
    pub attrs: Vec<(u16, Vec<u8>)>,
}

impl TcObject {
    pub fn attr(&self, kind: u16) -> Option<&[u8]> {
        self.attrs
            .iter()
            .find(|a| a.0 == kind)
            .map(|a| a.1.as_slice())
    }

    /// `TCA_KIND`: "cake", "htb", ...
    pub fn kind(&self) -> Option<&str> {
        let k = self.attr(TCA_KIND)?;
        std::str::from_utf8(k.strip_suffix(&[0]).unwrap_or(k)).ok()
    }
}

/// Attributes as `struct rtattr`s, each padded to 4 bytes.
#[derive(Clone, Debug, Default)]
pub struct Attrs(Vec<u8>);

impl Attrs {
    pub fn bytes(mut self, kind: u16, data: &[u8]) -> Attrs {
        let len = 4 + data.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().next_multiple_of(4), 0);
        self
    }

    pub fn string(self, kind: u16, s: &str) -> Attrs {
        let mut z = s.as_bytes().to_vec();
        z.push(0);
        self.bytes(kind, &z)
    }

    pub fn u64(self, kind: u16, v: u64) -> Attrs {
        self.bytes(kind, &v.to_ne_bytes())
    }

    pub fn nested(self, kind: u16, inner: Attrs) -> Attrs {
        self.bytes(kind, &inner.0)
    }
}

/// The attributes in `buf` (a message's tail or a nested attribute's payload); a malformed
/// one ends the list.
pub fn parse_attrs(buf: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 4 <= buf.len() {
        let len = u16::from_ne_bytes([buf[at], buf[at + 1]]) as usize;
        // NLA_F_NESTED and NLA_F_NET_BYTEORDER are flags, not the type.
        let kind = u16::from_ne_bytes([buf[at + 2], buf[at + 3]]) & 0x3FFF;
        if len < 4 || at + len > buf.len() {
            break;
        }
        out.push((kind, &buf[at + 4..at + len]));
        at += len.next_multiple_of(4);
    }
    out
}

/// Each message of a reply (type, body after its header) until it returns a verdict.
type EachMessage<'a> = &'a mut dyn FnMut(u16, &[u8]) -> Option<io::Result<()>>;

/// A NETLINK_ROUTE socket of the calling thread's network namespace.
pub struct Rtnl {
    fd: OwnedFd,
    seq: u32,
}

/// An `nlmsgerr`'s verdict: its first word is 0 (an ack) or a negative errno.
fn nlmsgerr(body: &[u8]) -> io::Result<()> {
    let errno = body
        .get(..4)
        .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap()));
    if errno == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-errno))
    }
}

impl Rtnl {
    pub fn open() -> io::Result<Rtnl> {
        // SAFETY: socket(2) with constant arguments; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A kernel that does not answer in 2 s is an error, not a hang.
        let tv = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        crate::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        Ok(Rtnl { fd, seq: 0 })
    }

    /// Sends one request and waits for the kernel's answer: an error carries its errno.
    pub fn change(&mut self, kind: u16, msg: TcMsg, attrs: &Attrs) -> io::Result<()> {
        let seq = self.send(kind, NLM_F_REQUEST | NLM_F_ACK, msg, attrs)?;
        let mut done = false;
        self.receive(seq, &mut |t, body| {
            if t == NLMSG_ERROR {
                done = true;
                return Some(nlmsgerr(body));
            }
            None
        })?;
        if done {
            Ok(())
        } else {
            Err(io::Error::other("netlink: no answer"))
        }
    }

    /// Every qdisc (`RTM_GETQDISC`) or class (`RTM_GETTCLASS`) of device `ifindex`.
    pub fn dump(&mut self, kind: u16, ifindex: i32) -> io::Result<Vec<TcObject>> {
        let msg = TcMsg {
            ifindex,
            handle: 0,
            parent: 0,
        };
        let seq = self.send(kind, NLM_F_REQUEST | NLM_F_DUMP, msg, &Attrs::default())?;
        let mut out = Vec::new();
        self.receive(seq, &mut |t, body| {
            if t == NLMSG_DONE {
                return Some(Ok(()));
            }
            if t == NLMSG_ERROR {
                return Some(nlmsgerr(body));
            }
            if body.len() < TCMSG || out.len() >= MAX_OBJECTS {
                return Some(Err(io::Error::other(
                    "netlink: a malformed or endless dump",
                )));
            }
            let word = |at: usize| u32::from_ne_bytes(body[at..at + 4].try_into().unwrap());
            let msg = TcMsg {
                ifindex: word(4) as i32,
                handle: word(8),
                parent: word(12),
            };
            if msg.ifindex == ifindex {
                let attrs = parse_attrs(&body[TCMSG..])
                    .into_iter()
                    .map(|(k, v)| (k, v.to_vec()))
                    .collect();
                out.push(TcObject { msg, attrs });
            }
            None
        })?;
        Ok(out)
    }

    fn send(&mut self, kind: u16, flags: u16, msg: TcMsg, attrs: &Attrs) -> io::Result<u32> {
        self.seq = self.seq.wrapping_add(1);
        let len = HEADER + TCMSG + attrs.0.len();
        let mut buf = Vec::with_capacity(len);
        buf.extend_from_slice(&(len as u32).to_ne_bytes());
        buf.extend_from_slice(&kind.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&self.seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        // struct tcmsg: family (AF_UNSPEC) and padding, then the addressing, then tcm_info.
        buf.extend_from_slice(&[0u8; 4]);
        buf.extend_from_slice(&msg.ifindex.to_ne_bytes());
        buf.extend_from_slice(&msg.handle.to_ne_bytes());
        buf.extend_from_slice(&msg.parent.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&attrs.0);
        // SAFETY: sockaddr_nl zeroed is the kernel's address; buf outlives the call.
        let rc = unsafe {
            let mut to: libc::sockaddr_nl = std::mem::zeroed();
            to.nl_family = libc::AF_NETLINK as u16;
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                0,
                &to as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(self.seq)
    }

    /// Reads messages of request `seq`, each (type, body after the header) to `each`, until it
    /// returns a verdict or a multipart message ends.
    fn receive(&mut self, seq: u32, each: EachMessage) -> io::Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: recv into a buffer of the length given.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let data = &buf[..n as usize];
            let mut at = 0;
            let mut multi = false;
            while at + HEADER <= data.len() {
                let len = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap()) as usize;
                let kind = u16::from_ne_bytes([data[at + 4], data[at + 5]]);
                let flags = u16::from_ne_bytes([data[at + 6], data[at + 7]]);
                let mseq = u32::from_ne_bytes(data[at + 8..at + 12].try_into().unwrap());
                if len < HEADER || at + len > data.len() {
                    return Err(io::Error::other("netlink: a truncated message"));
                }
                multi |= flags & NLM_F_MULTI != 0;
                if mseq == seq {
                    if let Some(verdict) = each(kind, &data[at + HEADER..at + len]) {
                        return verdict;
                    }
                }
                at += len.next_multiple_of(4);
            }
            if !multi {
                return Ok(());
            }
        }
    }
}

/// The index of device `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> io::Result<i32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::other("a NUL in the name"))?;
    // SAFETY: a NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_nested_and_read_back() {
        let a = Attrs::default()
            .string(TCA_KIND, "cake")
            .nested(TCA_OPTIONS, Attrs::default().u64(2, 1_250_000));
        // "cake\0" is 4 + 5 bytes, padded to 12; the nest is 4 + (4 + 8).
        assert_eq!(a.0.len(), 12 + 16);
        let top = parse_attrs(&a.0);
        assert_eq!(top[0], (TCA_KIND, &b"cake\0"[..]));
        let inner = parse_attrs(top[1].1);
        assert_eq!(inner, [(2, &1_250_000u64.to_ne_bytes()[..])]);
        // A length past the end ends the list instead of reading beyond it.
        let mut bad = a.0.clone();
        bad[12] = 200;
        assert_eq!(parse_attrs(&bad).len(), 1);
    }

    #[test]
    fn loopback_has_a_root_qdisc_in_the_dump() {
        let mut nl = Rtnl::open().unwrap();
        let lo = ifindex("lo").unwrap();
        let q = nl.dump(RTM_GETQDISC, lo).unwrap();
        assert!(q.iter().any(|o| o.msg.parent == TC_H_ROOT), "{q:?}");
        assert!(ifindex("no-such-device0").is_err());
    }
}
