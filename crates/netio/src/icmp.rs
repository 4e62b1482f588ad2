//! Hop probing without raw sockets: a UDP socket with IP_RECVERR / IPV6_RECVERR receives the
//! ICMP errors its own datagrams caused (Time Exceeded from routers, Port Unreachable from the
//! destination) on its error queue, with the answering router's address and a kernel
//! timestamp. This is how tracepath works, and it needs no privilege.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, SystemTime};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcmpKind {
    /// A router dropped the datagram at TTL / hop limit zero.
    TimeExceeded,
    /// The destination has no socket on the port: the probe got there.
    PortUnreachable,
    /// Any other unreachable (type, code): filtered, no route, ...
    Unreachable(u8, u8),
    /// Too big for the next hop (ICMP fragmentation needed, ICMPv6 packet too big), or for
    /// this host's own route (a local error): the MTU it named.
    TooBig(u32),
}

#[derive(Clone, Debug)]
pub struct IcmpError {
    /// Where the datagram that caused the error was going (its port names the probe).
    pub dest: SocketAddr,
    /// Who sent the ICMP error.
    pub from: Option<IpAddr>,
    pub kind: IcmpKind,
    /// When the error arrived, by the kernel's receive timestamp (CLOCK_REALTIME).
    pub at: Option<SystemTime>,
    /// The start of the datagram that caused it, as the router quoted it (for an ICMP echo
    /// probe: its header, whose sequence number names the probe).
    pub payload: Vec<u8>,
}

/// An echo reply on a ping socket: who answered, its sequence number, and when.
#[derive(Clone, Debug)]
pub struct EchoReply {
    pub from: IpAddr,
    pub seq: u16,
    pub at: Option<SystemTime>,
}

/// Sets an int-valued socket option.
pub(crate) fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    crate::setsockopt(fd, level, name, &value)
}

/// Has the kernel drop every ICMP message on raw socket `fd` but those of `types`, before it is
/// queued: a router's other ICMP then costs the socket nothing. IPv4: ICMP_FILTER (1 at SOL_RAW,
/// `linux/icmp.h`), 32 bits, a bit set drops that type (types above 31 pass). IPv6: ICMPV6_FILTER
/// (1 at IPPROTO_ICMPV6, `linux/icmpv6.h`), 256 bits as eight u32, a bit set drops that type
/// (`icmpv6_filter` in net/ipv6/raw.c; RFC 3542 3.2's filter).
fn raw_icmp_only(fd: i32, v6: bool, types: &[u8]) -> io::Result<()> {
    const FILTER: i32 = 1;
    if !v6 {
        let drop = types.iter().fold(!0u32, |m, &t| m & !(1u32 << (t & 31)));
        return setsockopt_int(fd, libc::SOL_RAW, FILTER, drop as i32);
    }
    let mut drop = [!0u32; 8];
    for &t in types {
        drop[usize::from(t >> 5)] &= !(1u32 << (t & 31));
    }
    crate::setsockopt(fd, libc::IPPROTO_ICMPV6, FILTER, &drop)
}

fn is_v6(sock: &UdpSocket) -> io::Result<bool> {
    Ok(sock.local_addr()?.is_ipv6())
}

/// Asks for the ICMP errors of this socket's datagrams, with receive timestamps.
pub fn enable_errors(sock: &UdpSocket) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    if is_v6(sock)? {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVERR, 1)?;
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVERR, 1)?;
    }
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// TTL (IPv4) or hop limit (IPv6) of the datagrams sent next.
pub fn set_hop_limit(sock: &UdpSocket, hops: u8) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    if is_v6(sock)? {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_UNICAST_HOPS, hops.into())
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_TTL, hops.into())
    }
}

/// Waits up to `timeout` for an error to be queued (or, with `data`, a datagram to arrive).
pub fn wait_error(sock: &UdpSocket, timeout: Duration, data: bool) -> bool {
    // POLLERR is always reported; asking for no events waits for exactly that.
    let mut p = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: if data { libc::POLLIN } else { 0 },
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
    r > 0 && p.revents & (libc::POLLERR | libc::POLLIN) != 0
}

/// An unprivileged ICMP echo ("ping") socket, where `net.ipv4.ping_group_range` admits this
/// process's group; the kernel fills in the echo identifier and delivers only its replies.
pub fn ping_socket(v6: bool) -> io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (domain, proto) = if v6 {
        (Domain::IPV6, Protocol::ICMPV6)
    } else {
        (Domain::IPV4, Protocol::ICMPV4)
    };
    let s =
        Socket::new(domain, Type::DGRAM, Some(proto)).map_err(|e| {
            io::Error::new(
            e.kind(),
            format!("no ICMP echo socket ({e}): this host allows them only to the groups in sysctl \
                net.ipv4.ping_group_range (sysctl -w net.ipv4.ping_group_range='0 2147483647' \
                admits all)"),
        )
        })?;
    Ok(s.into())
}

/// ICMP echo to many hosts, as fping does: a ping socket where `ping_group_range` admits this
/// process, else a raw socket (root or CAP_NET_RAW, as on a router), which sees every ICMP
/// message the host receives and keeps only echo replies that carry its identifier.
pub struct EchoSocket {
    sock: UdpSocket,
    v6: bool,
    /// The identifier it writes and looks for on a raw socket (a ping socket's kernel does both).
    raw_id: Option<u16>,
}

/// A raw socket's own identifier. It sees every echo reply the host receives, so two of one
/// process (a monitor's and a locate's, or two tests) would take each other's under one: the
/// process id, moved on by an odd stride per socket so that the next process's ids (pid + 1)
/// are not this one's second socket's.
fn raw_identifier() -> u16 {
    static OPENED: AtomicU16 = AtomicU16::new(0);
    let n = OPENED.fetch_add(1, Ordering::Relaxed);
    (std::process::id() as u16).wrapping_add(n.wrapping_mul(0x9e37))
}

/// The Internet checksum (RFC 1071) of `b`.
fn internet_checksum(b: &[u8]) -> u16 {
    let mut sum: u32 = b
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

impl EchoSocket {
    /// Opens one for IPv4 or IPv6, with the kernel's receive timestamps.
    pub fn open(v6: bool) -> io::Result<EchoSocket> {
        use socket2::{Domain, Protocol, Socket, Type};
        let (sock, raw_id) = match ping_socket(v6) {
            Ok(s) => (s, None),
            Err(ping) => {
                let (domain, proto) = if v6 {
                    (Domain::IPV6, Protocol::ICMPV6)
                } else {
                    (Domain::IPV4, Protocol::ICMPV4)
                };
                let raw = Socket::new(domain, Type::RAW, Some(proto)).map_err(|e| {
                    io::Error::new(e.kind(), format!("{ping}; nor a raw ICMP socket: {e}"))
                })?;
                // Echo replies only: ICMPv4's type 0, ICMPv6's 129.
                raw_icmp_only(raw.as_raw_fd(), v6, if v6 { &[129] } else { &[0] })?;
                (raw.into(), Some(raw_identifier()))
            }
        };
        sock.set_nonblocking(true)?;
        setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
        Ok(EchoSocket { sock, v6, raw_id })
    }

    /// Whether it is a raw socket (the fallback).
    pub fn is_raw(&self) -> bool {
        self.raw_id.is_some()
    }

    /// The socket, to wait on.
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// An echo request with sequence number `seq` to `to` (of this socket's family).
    pub fn send(&self, to: IpAddr, seq: u16) -> io::Result<()> {
        let mut m = echo_request(self.v6, seq, 16);
        if let Some(id) = self.raw_id {
            m[4..6].copy_from_slice(&id.to_be_bytes());
            // ICMPv6's checksum covers a pseudo-header: the kernel fills it on raw ICMPv6
            // sockets (RFC 3542 3.1); ICMPv4's is ours to write.
            if !self.v6 {
                let c = internet_checksum(&m);
                m[2..4].copy_from_slice(&c.to_be_bytes());
            }
        }
        self.sock.send_to(&m, SocketAddr::new(to, 0)).map(|_| ())
    }

    /// One echo reply to this socket, if any is waiting (never blocks); other ICMP messages
    /// and other processes' replies are read and passed over.
    pub fn recv(&self) -> io::Result<Option<EchoReply>> {
        let Some(id) = self.raw_id else {
            return recv_echo_reply(&self.sock);
        };
        loop {
            let mut data = [0u8; 256];
            let mut at = None;
            let Some((n, name)) = recv_with(&self.sock, 0, &mut data, &mut [0u64; 16], |c| {
                at = at.or(cmsg_time(c))
            })?
            else {
                return Ok(None);
            };
            // A raw IPv4 socket reads the IP header too (its length in the first byte's low
            // nibble); a raw IPv6 socket reads from the ICMPv6 header.
            let skip = if self.v6 {
                0
            } else {
                usize::from(data[0] & 0x0f) * 4
            };
            let Some(m) = data.get(skip..n).filter(|m| m.len() >= 8) else {
                continue;
            };
            let reply = if self.v6 { 129 } else { 0 };
            if m[0] != reply || u16::from_be_bytes([m[4], m[5]]) != id {
                continue;
            }
            let Some(from) = sockaddr_to(&name) else {
                continue;
            };
            return Ok(Some(EchoReply {
                from: from.ip(),
                seq: u16::from_be_bytes([m[6], m[7]]),
                at,
            }));
        }
    }
}

/// An ICMP error as a raw socket reads it: who sent it, and the start of the packet it quotes
/// as that router received it (RFC 792, RFC 4443: the IP header and at least 8 bytes after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotedError {
    pub from: IpAddr,
    /// Time Exceeded (a router at the probe's TTL); else Destination Unreachable.
    pub time_exceeded: bool,
    /// The quoted packet's TOS byte / traffic class: its marks as they arrived there.
    pub tos: u8,
    /// The quoted UDP header's ports.
    pub sport: u16,
    pub dport: u16,
}

/// Parses an ICMP error message as a raw socket delivers it (IPv4: from the IP header, IPv6:
/// from the ICMPv6 header) into the quoted packet's TOS and UDP ports; `None` for anything
/// else: other types, short or malformed messages, quotes of other protocols.
pub fn parse_quoted_error(v6: bool, msg: &[u8]) -> Option<(bool, u8, u16, u16)> {
    let icmp = if v6 {
        msg
    } else {
        let ihl = usize::from(*msg.first()? & 0x0f) * 4;
        msg.get(ihl.max(20)..)?
    };
    let time_exceeded = match (v6, *icmp.first()?) {
        (false, 11) | (true, 3) => true,
        (false, 3) | (true, 1) => false,
        _ => return None,
    };
    let quoted = icmp.get(8..)?;
    let (tos, udp) = if v6 {
        // Version | traffic class | flow label; next header at 6, UDP right after 40 bytes.
        let tc = ((quoted.first()? & 0x0f) << 4) | (quoted.get(1)? >> 4);
        (*quoted.get(6)? == 17).then_some(())?;
        (tc, quoted.get(40..44)?)
    } else {
        let ihl = usize::from(*quoted.first()? & 0x0f) * 4;
        (quoted.first()? >> 4 == 4 && ihl >= 20 && *quoted.get(9)? == 17).then_some(())?;
        (*quoted.get(1)?, quoted.get(ihl..ihl + 4)?)
    };
    Some((
        time_exceeded,
        tos,
        u16::from_be_bytes([udp[0], udp[1]]),
        u16::from_be_bytes([udp[2], udp[3]]),
    ))
}

/// A raw ICMP socket (root or CAP_NET_RAW) that reads the errors routers send this host with
/// the packets they quote: unlike a UDP socket's error queue, which hands back only the
/// datagram's payload, it sees the quoted IP header, so the marks as each router got them.
pub struct QuoteSocket {
    sock: UdpSocket,
    v6: bool,
}

impl QuoteSocket {
    pub fn open(v6: bool) -> io::Result<QuoteSocket> {
        use socket2::{Domain, Protocol, Socket, Type};
        let (domain, proto) = if v6 {
            (Domain::IPV6, Protocol::ICMPV6)
        } else {
            (Domain::IPV4, Protocol::ICMPV4)
        };
        let raw = Socket::new(domain, Type::RAW, Some(proto)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("a raw ICMP socket, to read what routers quote, needs root: {e}"),
            )
        })?;
        // Destination Unreachable and Time Exceeded only: ICMPv4's 3 and 11, ICMPv6's 1 and 3.
        raw_icmp_only(raw.as_raw_fd(), v6, if v6 { &[1, 3] } else { &[3, 11] })?;
        raw.set_nonblocking(true)?;
        Ok(QuoteSocket {
            sock: raw.into(),
            v6,
        })
    }

    /// The socket, to wait on.
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// The next ICMP error that quotes a UDP packet, if one is waiting (never blocks).
    pub fn recv(&self) -> io::Result<Option<QuotedError>> {
        loop {
            let mut data = [0u8; 600];
            let Some((n, name)) = recv_with(&self.sock, 0, &mut data, &mut [0u64; 8], |_| {})?
            else {
                return Ok(None);
            };
            let (Some(from), Some((time_exceeded, tos, sport, dport))) = (
                sockaddr_to(&name),
                parse_quoted_error(self.v6, &data[..n.min(data.len())]),
            ) else {
                continue;
            };
            return Ok(Some(QuotedError {
                from: from.ip(),
                time_exceeded,
                tos,
                sport,
                dport,
            }));
        }
    }
}

/// Sets the Don't Fragment bit (IPv6 never fragments in flight) on everything the socket
/// sends, without letting the kernel's cached path MTU refuse larger probes (tracepath's
/// IP_PMTUDISC_PROBE): a probe too big for the first hop fails at send with EMSGSIZE.
pub fn probe_mtu(sock: &UdpSocket) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    if is_v6(sock)? {
        setsockopt_int(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_PROBE,
        )
    } else {
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_PROBE,
        )
    }
}

/// Whether a send failed for being larger than the route's MTU (EMSGSIZE).
pub fn too_big(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EMSGSIZE)
}

/// The MTU of this host's route to `dest` (its interface's, or a smaller one the kernel
/// learnt): what a connected UDP socket reads back as IP_MTU / IPV6_MTU.
pub fn route_mtu(dest: IpAddr) -> io::Result<u32> {
    let bind: SocketAddr = if dest.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let s = UdpSocket::bind(bind)?;
    s.connect(SocketAddr::new(dest, 9))?;
    let (level, name) = if dest.is_ipv6() {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    } else {
        (libc::IPPROTO_IP, libc::IP_MTU)
    };
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as u32;
    // SAFETY: valid fd, a pointer to an int and its length.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v.max(0) as u32)
}

/// An ICMP or ICMPv6 echo request (the kernel sets the identifier and checksum on a ping
/// socket) with sequence number `seq` and `len` bytes in all.
pub fn echo_request(v6: bool, seq: u16, len: usize) -> Vec<u8> {
    let mut m = vec![0u8; len.max(8)];
    m[0] = if v6 { 128 } else { 8 };
    m[6..8].copy_from_slice(&seq.to_be_bytes());
    m
}

/// The kernel's receive time, when `c` is a timestamp control message.
pub(crate) fn cmsg_time(c: &libc::cmsghdr) -> Option<SystemTime> {
    if c.cmsg_level != libc::SOL_SOCKET || c.cmsg_type != libc::SCM_TIMESTAMPNS {
        return None;
    }
    // SAFETY: an SCM_TIMESTAMPNS message carries a timespec (read unaligned: cmsg data is
    // only aligned to the header's size).
    let ts: libc::timespec = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(c).cast()) };
    Some(SystemTime::UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// One datagram, or with `MSG_ERRQUEUE` one error-queue entry, without blocking: its length
/// and address, after `each` has seen every control message that came with it.
pub(crate) fn recv_with(
    sock: &UdpSocket,
    flags: i32,
    data: &mut [u8],
    control: &mut [u64],
    mut each: impl FnMut(&libc::cmsghdr),
) -> io::Result<Option<(usize, libc::sockaddr_storage)>> {
    // SAFETY: zeroed plain-old-data, then pointers to live buffers of the stated lengths.
    let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as u32;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // socklen_t on musl, size_t on glibc.
    msg.msg_controllen = std::mem::size_of_val(control) as _;
    // SAFETY: msg points at the buffers above for the duration of the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, flags | libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: the CMSG_* walk stays within msg_controllen as the kernel filled it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            each(&*c);
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Some((n as usize, name)))
}

/// With IP_RECVERR an ICMP error (a router's time exceeded too) also sets the socket's pending
/// error, which the next plain receive returns once (EHOSTUNREACH, ...) while the details wait
/// in the error queue: no failure of the socket. A locate run through the lab died of one that
/// came between draining the error queue and reading the echo replies.
fn is_pending_icmp_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::ECONNREFUSED
                | libc::EHOSTDOWN
                | libc::EPROTO
                | libc::EMSGSIZE
        )
    )
}

/// One echo reply waiting on a ping socket, if any (never blocks). An ICMP error reported in
/// its place reads as none: the caller finds it in the error queue on its next round.
pub fn recv_echo_reply(sock: &UdpSocket) -> io::Result<Option<EchoReply>> {
    let mut data = [0u8; 128];
    let mut at = None;
    let got = match recv_with(sock, 0, &mut data, &mut [0u64; 16], |c| {
        at = at.or(cmsg_time(c))
    }) {
        Err(e) if is_pending_icmp_error(&e) => return Ok(None),
        got => got?,
    };
    let Some((n, name)) = got else {
        return Ok(None);
    };
    // Echo reply: ICMP type 0, ICMPv6 type 129; anything else or short is not ours.
    if n < 8 || !(data[0] == 0 || data[0] == 129) {
        return Ok(None);
    }
    let Some(from) = sockaddr_to(&name) else {
        return Ok(None);
    };
    Ok(Some(EchoReply {
        from: from.ip(),
        seq: u16::from_be_bytes([data[6], data[7]]),
        at,
    }))
}

pub(crate) fn sockaddr_to(sa: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match sa.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let a: &libc::sockaddr_in = unsafe { &*(sa as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, a sockaddr_in6.
            let a: &libc::sockaddr_in6 = unsafe { &*(sa as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                0,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// What an IP_RECVERR / IPV6_RECVERR control message says: the kind of ICMP error and the
/// address of the router that sent it (SO_EE_OFFENDER, right after the struct).
fn cmsg_error(c: &libc::cmsghdr) -> Option<(Option<IcmpKind>, Option<IpAddr>)> {
    let (level, ty) = (c.cmsg_level, c.cmsg_type);
    if !((level == libc::IPPROTO_IP && ty == libc::IP_RECVERR)
        || (level == libc::IPPROTO_IPV6 && ty == libc::IPV6_RECVERR))
    {
        return None;
    }
    let ee_len = std::mem::size_of::<libc::sock_extended_err>();
    // SAFETY: a RECVERR message carries a sock_extended_err and then the offender's address,
    // copied out no further than the message's own length.
    unsafe {
        let body = libc::CMSG_DATA(c);
        let ee: libc::sock_extended_err = std::ptr::read_unaligned(body.cast());
        let kind = match (ee.ee_origin, ee.ee_type, ee.ee_code) {
            (libc::SO_EE_ORIGIN_ICMP, 3, 4) | (libc::SO_EE_ORIGIN_ICMP6, 2, _) => {
                Some(IcmpKind::TooBig(ee.ee_info))
            }
            (libc::SO_EE_ORIGIN_LOCAL, _, _) if ee.ee_errno == libc::EMSGSIZE as u32 => {
                Some(IcmpKind::TooBig(ee.ee_info))
            }
            (libc::SO_EE_ORIGIN_ICMP, 11, _) | (libc::SO_EE_ORIGIN_ICMP6, 3, _) => {
                Some(IcmpKind::TimeExceeded)
            }
            (libc::SO_EE_ORIGIN_ICMP, 3, 3) | (libc::SO_EE_ORIGIN_ICMP6, 1, 4) => {
                Some(IcmpKind::PortUnreachable)
            }
            (libc::SO_EE_ORIGIN_ICMP, 3, code) | (libc::SO_EE_ORIGIN_ICMP6, 1, code) => {
                Some(IcmpKind::Unreachable(ee.ee_type, code))
            }
            _ => None,
        };
        let mut off: libc::sockaddr_storage = std::mem::zeroed();
        let cmsg_len: usize = c.cmsg_len as _; // socklen_t on musl, size_t on glibc
        let avail =
            cmsg_len.saturating_sub(body as usize - c as *const libc::cmsghdr as usize + ee_len);
        let len = avail.min(std::mem::size_of::<libc::sockaddr_storage>());
        std::ptr::copy_nonoverlapping(
            body.add(ee_len),
            (&mut off as *mut libc::sockaddr_storage).cast(),
            len,
        );
        Some((kind, sockaddr_to(&off).map(|a| a.ip())))
    }
}

/// One error from the socket's error queue, if any is waiting (never blocks).
pub fn recv_error(sock: &UdpSocket) -> io::Result<Option<IcmpError>> {
    let mut data = [0u8; 512];
    let (mut kind, mut from, mut at) = (None, None, None);
    let got = recv_with(sock, libc::MSG_ERRQUEUE, &mut data, &mut [0u64; 64], |c| {
        if let Some((k, f)) = cmsg_error(c) {
            (kind, from) = (k, f);
        }
        at = at.or(cmsg_time(c));
    })?;
    let Some((n, name)) = got else {
        return Ok(None);
    };
    let Some(dest) = sockaddr_to(&name) else {
        return Ok(None);
    };
    let quoted = n.min(data.len());
    Ok(kind.map(|kind| IcmpError {
        dest,
        from,
        kind,
        at,
        payload: data[..quoted.min(64)].to_vec(),
    }))
}

/// The name a reverse lookup gives `ip` (blocking: run it under a deadline), if it is a
/// plausible host name. Whatever DNS answers is a stranger's text: anything but letters,
/// digits, '-', '_' and '.' is refused rather than printed.
pub fn reverse_name(ip: IpAddr) -> Option<String> {
    let sa: SocketAddr = SocketAddr::new(ip, 0);
    let sock = socket2::SockAddr::from(sa);
    let mut host = [0 as libc::c_char; 256];
    // SAFETY: a valid sockaddr of the stated length and an output buffer of the stated length.
    let r = unsafe {
        libc::getnameinfo(
            sock.as_ptr().cast(),
            sock.len(),
            host.as_mut_ptr(),
            host.len() as u32,
            std::ptr::null_mut(),
            0,
            libc::NI_NAMEREQD,
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: getnameinfo wrote a NUL-terminated string into `host`.
    let name = unsafe { std::ffi::CStr::from_ptr(host.as_ptr()) }
        .to_str()
        .ok()?
        .to_string();
    let plausible = !name.is_empty()
        && name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    plausible.then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_on_loopback_answers_port_unreachable_with_the_probe_destination() {
        // Loopback is exempt from ICMP rate limits; a port nobody listens on answers at once.
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dest = closed.local_addr().unwrap();
        drop(closed);
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable_errors(&s).unwrap();
        set_hop_limit(&s, 5).unwrap();
        let sent = SystemTime::now();
        s.send_to(b"probe", dest).unwrap();
        assert!(
            wait_error(&s, Duration::from_secs(2), false),
            "no ICMP error within 2 s"
        );
        let e = recv_error(&s).unwrap().expect("an error was queued");
        assert_eq!(e.dest, dest);
        assert_eq!(e.payload, b"probe", "the datagram that caused it");
        assert_eq!(e.kind, IcmpKind::PortUnreachable);
        assert_eq!(e.from, Some("127.0.0.1".parse().unwrap()));
        let at = e.at.expect("kernel timestamp");
        assert!(at.duration_since(sent).unwrap() < Duration::from_secs(1));
        assert!(recv_error(&s).unwrap().is_none(), "one probe, one error");
    }

    #[test]
    fn echo_to_loopback_is_answered_with_its_sequence_and_a_kernel_stamp() {
        // As root with the default ping_group_range ("1 0": nobody) this is the raw socket.
        let s = EchoSocket::open(false).unwrap();
        let sent = SystemTime::now();
        for seq in [7u16, 8] {
            s.send("127.0.0.1".parse().unwrap(), seq).unwrap();
        }
        let mut got = Vec::new();
        while got.len() < 2 && wait_error(s.socket(), Duration::from_secs(2), true) {
            while let Some(r) = s.recv().unwrap() {
                got.push(r);
            }
        }
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), [7, 8]);
        for r in got {
            assert_eq!(r.from, Ipv4Addr::LOCALHOST);
            let at = r.at.expect("kernel timestamp");
            assert!(at.duration_since(sent).unwrap() < Duration::from_secs(1));
        }
    }

    /// Two raw sockets of one process each get their own replies: under one identifier (the
    /// process id, as it was) each took the other's, and two tests running at once failed.
    #[test]
    fn two_raw_echo_sockets_of_one_process_do_not_take_each_others_replies() {
        let (a, b) = (
            EchoSocket::open(false).unwrap(),
            EchoSocket::open(false).unwrap(),
        );
        if !a.is_raw() {
            assert!(
                std::env::var_os("CI").is_none(),
                "needs root for a raw socket"
            );
            eprintln!("skipped: a ping socket, not a raw one (not root)");
            return;
        }
        let lo = "127.0.0.1".parse().unwrap();
        a.send(lo, 1).unwrap();
        b.send(lo, 2).unwrap();
        let seqs = |s: &EchoSocket| {
            let mut got = Vec::new();
            // Both replies are back within the wait: whatever is this socket's has come.
            while wait_error(s.socket(), Duration::from_millis(300), true) {
                while let Some(r) = s.recv().unwrap() {
                    got.push(r.seq);
                }
            }
            got
        };
        assert_eq!((seqs(&a), seqs(&b)), (vec![1], vec![2]));
    }

    /// The raw echo socket (root, the default ping_group_range) sees on loopback its own echo
    /// requests and every host's ICMP; the kernel's filter keeps only echo replies, both families.
    #[test]
    fn a_raw_echo_socket_is_given_echo_replies_alone() {
        for (v6, lo, reply) in [(false, "127.0.0.1", 0u8), (true, "::1", 129)] {
            let s = EchoSocket::open(v6).unwrap();
            if !s.is_raw() {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "needs root for a raw socket"
                );
                eprintln!("skipped: a ping socket, not a raw one (not root)");
                return;
            }
            let lo: IpAddr = lo.parse().unwrap();
            // A port unreachable for a datagram to a closed port, then two echoes.
            let closed = UdpSocket::bind((lo, 0)).unwrap();
            let dest = closed.local_addr().unwrap();
            drop(closed);
            UdpSocket::bind((lo, 0))
                .unwrap()
                .send_to(b"x", dest)
                .unwrap();
            for seq in [1u16, 2] {
                s.send(lo, seq).unwrap();
            }
            // Everything queued within 200 ms (other tests' echo replies too: a raw socket gets
            // every one; the identifier is looked at after).
            assert!(wait_error(s.socket(), Duration::from_secs(2), true));
            std::thread::sleep(Duration::from_millis(200));
            let mut types = Vec::new();
            let mut b = [0u8; 256];
            while let Ok(n) = s.socket().recv(&mut b) {
                // A raw IPv4 socket reads the IP header first; an IPv6 one the ICMP message.
                let at = if v6 { 0 } else { usize::from(b[0] & 15) * 4 };
                assert!(n > at);
                types.push(b[at]);
            }
            assert!(
                types.len() >= 2 && types.iter().all(|&t| t == reply),
                "IPv6: {v6}, types {types:?}"
            );
        }
    }

    #[test]
    fn the_internet_checksum_of_an_echo_request_is_rfc_1071s() {
        // RFC 1071 section 3's example sums to 0xddf2; an odd length pads with a zero byte.
        let b = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(internet_checksum(&b), !0xddf2);
        assert_eq!(internet_checksum(&[0xab]), !0xab00);
    }

    #[test]
    fn loopback_has_a_name() {
        // /etc/hosts names 127.0.0.1 localhost on every Linux install.
        assert_eq!(
            reverse_name("127.0.0.1".parse().unwrap()).as_deref(),
            Some("localhost")
        );
    }

    #[test]
    fn ipv6_works_the_same_way() {
        let closed = UdpSocket::bind("[::1]:0").expect("IPv6 loopback");
        let dest = closed.local_addr().unwrap();
        drop(closed);
        let s = UdpSocket::bind("[::1]:0").unwrap();
        enable_errors(&s).unwrap();
        set_hop_limit(&s, 5).unwrap();
        s.send_to(b"probe", dest).unwrap();
        assert!(wait_error(&s, Duration::from_secs(2), false));
        let e = recv_error(&s).unwrap().unwrap();
        assert_eq!(
            (e.dest, e.kind, e.from),
            (
                dest,
                IcmpKind::PortUnreachable,
                Some("::1".parse().unwrap())
            )
        );
    }

    #[test]
    fn a_quoted_header_gives_the_marks_as_the_router_got_them() {
        // IPv4: the outer header a raw socket reads, ICMP Time Exceeded, then the quote: an IP
        // header with TOS 0xb9 (EF, ECT(1)) carrying UDP 40000 -> 33434.
        let mut m = vec![
            0x45, 0, 0, 56, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        m.extend([11, 0, 0, 0, 0, 0, 0, 0]);
        m.extend([
            0x45, 0xb9, 0, 28, 0, 0, 0, 0, 1, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 3,
        ]);
        m.extend([0x9c, 0x40, 0x82, 0x9a, 0, 8, 0, 0]);
        assert_eq!(
            parse_quoted_error(false, &m),
            Some((true, 0xb9, 40000, 33434))
        );
        // Port Unreachable from the destination; a quote of TCP is not ours; short is nothing.
        m[20] = 3;
        assert_eq!(
            parse_quoted_error(false, &m),
            Some((false, 0xb9, 40000, 33434))
        );
        m[20 + 8 + 9] = 6;
        assert_eq!(parse_quoted_error(false, &m), None);
        assert_eq!(parse_quoted_error(false, &m[..40]), None);
        // IPv6: ICMPv6 Time Exceeded from its own header; traffic class 0xb9 straddles the
        // first two bytes of the quoted header.
        let mut m6 = vec![3, 0, 0, 0, 0, 0, 0, 0];
        let mut h = vec![0u8; 40];
        h[0] = 0x60 | (0xb9 >> 4);
        h[1] = (0xb9 & 0x0f) << 4;
        h[6] = 17;
        m6.extend(h);
        m6.extend([0x9c, 0x40, 0x82, 0x9a, 0, 8, 0, 0]);
        assert_eq!(
            parse_quoted_error(true, &m6),
            Some((true, 0xb9, 40000, 33434))
        );
        assert_eq!(parse_quoted_error(true, &m6[..47]), None);
    }
}
