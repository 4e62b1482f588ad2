//! UDP load helpers: the receive buffer a server needs for bursts, the host's count of
//! datagrams dropped for a full buffer, and kernel pacing (`SO_MAX_PACING_RATE`, honoured only
//! by the `fq` qdisc) with a check of the qdisc that would have to honour it.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::SystemTime;

use crate::icmp::setsockopt_int;

/// Asks the kernel to stamp each datagram this socket receives with its arrival time
/// (`SO_TIMESTAMPNS`, the wall clock): read with [`recv_stamped`] long after, it still says
/// when the datagram came.
pub fn enable_rx_timestamps(sock: &UdpSocket) -> io::Result<()> {
    setsockopt_int(sock.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
}

/// The kernel stamps arriving datagrams only once some socket asked, and switches that on
/// later (a deferred work item): until then a datagram is stamped when it is read. This keeps a
/// socket that asked open for the process's life (so stamping stays on between probe sessions)
/// and waits, at most `limit`, until a datagram it sends itself comes back stamped on arrival.
/// False when that could not be shown (no loopback here, or the kernel slower than `limit`).
pub fn ensure_rx_stamping(limit: std::time::Duration) -> bool {
    // The socket, and whether stamping was shown on: then it stays on while the socket lives.
    static KEEPER: std::sync::Mutex<Option<(UdpSocket, bool)>> = std::sync::Mutex::new(None);
    let mut keeper = KEEPER.lock().unwrap_or_else(|e| e.into_inner());
    if keeper.is_none() {
        let Ok(s) = UdpSocket::bind("127.0.0.1:0") else {
            return false;
        };
        if enable_rx_timestamps(&s).is_err() {
            return false;
        }
        *keeper = Some((s, false));
    }
    let (s, shown) = keeper.as_mut().expect("just set");
    if *shown {
        return true;
    }
    let Ok(me) = s.local_addr() else {
        return false;
    };
    let start = std::time::Instant::now();
    let mut buf = [0u8; 8];
    while start.elapsed() < limit {
        if s.send_to(b"stamp", me).is_err() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        let read = SystemTime::now();
        if let Ok(Some(Stamped { at: Some(at), .. })) = recv_stamped(s, &mut buf) {
            if read.duration_since(at).is_ok_and(|d| d.as_micros() >= 1000) {
                *shown = true;
                return true;
            }
        }
    }
    false
}

/// A datagram [`recv_stamped`] read.
pub struct Stamped {
    pub len: usize,
    /// The kernel's arrival stamp (with [`enable_rx_timestamps`]).
    pub at: Option<SystemTime>,
    /// The TOS byte it arrived with (with [`enable_recv_tos`]).
    pub tos: Option<u8>,
}

/// One waiting datagram into `buf`, without blocking; `None` when nothing waits.
pub fn recv_stamped(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<Option<Stamped>> {
    let (mut at, mut tos) = (None, None);
    let got = crate::icmp::recv_with(sock, 0, buf, &mut [0u64; 12], |c| {
        at = at.or(crate::icmp::cmsg_time(c));
        tos = tos.or(cmsg_tos(c));
    })?;
    Ok(got.map(|(len, _)| Stamped { len, at, tos }))
}

/// Asks the kernel to say with each datagram received what TOS byte (IPv4) or traffic class
/// (IPv6) it arrived with: the DSCP and ECN marks as the path left them. A dual-stack socket
/// gets both options, as IPv4-mapped peers send it IPv4 packets.
pub fn enable_recv_tos(sock: &UdpSocket) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    if sock.local_addr()?.is_ipv6() {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
        // A socket bound to a v6 address only never sees IPv4: the option is then moot.
        let _ = setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1);
        Ok(())
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)
    }
}

/// The TOS byte or traffic class a control message carries (with [`enable_recv_tos`]).
fn cmsg_tos(c: &libc::cmsghdr) -> Option<u8> {
    // SAFETY: IP_TOS carries one byte, IPV6_TCLASS an int (read unaligned: cmsg data is only
    // aligned to the header's size).
    unsafe {
        match (c.cmsg_level, c.cmsg_type) {
            (libc::IPPROTO_IP, libc::IP_TOS) => Some(*libc::CMSG_DATA(c)),
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                let v: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                Some(v as u8)
            }
            _ => None,
        }
    }
}

/// One waiting datagram into `buf`, without blocking: its length, sender and the TOS byte it
/// arrived with (`None` unless [`enable_recv_tos`] was asked); `None` when nothing waits.
pub fn recv_from_tos(
    sock: &UdpSocket,
    buf: &mut [u8],
) -> io::Result<Option<(usize, SocketAddr, Option<u8>)>> {
    let mut tos = None;
    let got = crate::icmp::recv_with(sock, 0, buf, &mut [0u64; 8], |c| tos = tos.or(cmsg_tos(c)))?;
    Ok(got.and_then(|(n, name)| Some((n, crate::icmp::sockaddr_to(&name)?, tos))))
}

/// Asks for a receive buffer of `bytes`, beyond `net.core.rmem_max` when privileged
/// (SO_RCVBUFFORCE), and returns what the socket got (the kernel doubles the request for its
/// bookkeeping and reports the doubled figure).
pub fn grow_rcvbuf(sock: &impl AsRawFd, bytes: usize) -> io::Result<usize> {
    let want = bytes.min(i32::MAX as usize) as libc::c_int;
    let fd = sock.as_raw_fd();
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, want).is_err() {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, want)?;
    }
    let mut got: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid fd, pointers to an int and its length.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&mut got as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(got.max(0) as usize)
}

/// The value of `field` in the `Udp:` rows of /proc/net/snmp (a row of names, then a row of
/// values).
fn snmp_udp(text: &str, field: &str) -> Option<u64> {
    let mut rows = text.lines().filter(|l| l.starts_with("Udp:"));
    let names = rows.next()?;
    let values = rows.next()?;
    let i = names.split_whitespace().position(|n| n == field)?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// The value of `name` in /proc/net/snmp6 (one "name value" per line).
fn snmp6(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(name))
            .then(|| it.next()?.parse().ok())
            .flatten()
    })
}

/// UDP datagrams this network namespace dropped because a socket's receive buffer was full,
/// IPv4 and IPv6 together, since boot. The calling thread's namespace: /proc/net is the
/// process leader's, which differs for a test run on a thread inside a lab host.
pub fn udp_rcvbuf_errors() -> Option<u64> {
    let v4 = snmp_udp(
        &std::fs::read_to_string("/proc/thread-self/net/snmp").ok()?,
        "RcvbufErrors",
    )?;
    let v6 = std::fs::read_to_string("/proc/thread-self/net/snmp6")
        .ok()
        .and_then(|t| snmp6(&t, "Udp6RcvbufErrors"))
        .unwrap_or(0);
    Some(v4 + v6)
}

/// Caps the socket's kernel pacing rate (bytes per second of packets, headers included).
pub fn set_max_pacing_rate(sock: &impl AsRawFd, bytes_per_s: u64) -> io::Result<()> {
    // An int: every kernel takes it (a u64 only since 5.x); ~0U means unlimited, so stay below.
    let v = bytes_per_s.min(u64::from(u32::MAX - 1)) as u32;
    crate::setsockopt(
        sock.as_raw_fd(),
        libc::SOL_SOCKET,
        libc::SO_MAX_PACING_RATE,
        &v,
    )
}

/// Makes the calling thread's sleeps end on time: timer slack 1 ns instead of the default
/// 50 us, which a sender spacing packets tens of microseconds apart cannot afford.
pub fn precise_sleeps() {
    // SAFETY: prctl on the calling thread with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// The device `ip route get` names for a destination.
fn route_dev(out: &str) -> Option<String> {
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "dev" {
            return words.next().map(String::from);
        }
    }
    None
}

/// Whether `tc qdisc show dev D` lists an `fq` qdisc (root, or under `mq`), the one that
/// paces by `SO_MAX_PACING_RATE`.
fn lists_fq(tc: &str) -> bool {
    tc.lines()
        .any(|l| l.split_whitespace().nth(1) == Some("fq"))
}

/// Where kernel pacing to `peer` would happen: the egress device and whether its qdisc is
/// `fq`. Err says why it could not be told (no `ip` or `tc`, no route).
pub fn egress_has_fq(peer: IpAddr) -> Result<(String, bool), String> {
    let run = |cmd: &str, args: &[&str]| -> Result<String, String> {
        let out = Command::new(cmd)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {cmd}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "`{cmd} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let peer = peer.to_canonical().to_string();
    let dev = route_dev(&run("ip", &["route", "get", &peer])?)
        .ok_or_else(|| format!("no route device for {peer}"))?;
    let fq = lists_fq(&run("tc", &["qdisc", "show", "dev", &dev])?);
    Ok((dev, fq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_read_late_keeps_the_time_it_arrived() {
        assert!(ensure_rx_stamping(std::time::Duration::from_secs(2)));
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable_rx_timestamps(&rx).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut buf = [0u8; 64];
        assert!(
            recv_stamped(&rx, &mut buf).unwrap().is_none(),
            "nothing waits yet"
        );
        let sent = SystemTime::now();
        tx.send_to(b"probe", rx.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(30));
        let Stamped { len: n, at, .. } = recv_stamped(&rx, &mut buf).unwrap().unwrap();
        let read = SystemTime::now();
        assert_eq!(&buf[..n], b"probe");
        // Loopback delivers within the send call: stamped then, not 30 ms later at the read.
        let at = at.expect("a kernel stamp");
        assert!(at >= sent, "stamped before it was sent");
        let late = read.duration_since(at).unwrap();
        assert!(
            late.as_millis() >= 29,
            "stamped at the read: {late:?} before it"
        );
    }

    #[test]
    fn snmp_rows_are_read_by_column_name() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors \
            OutDatagrams RcvbufErrors SndbufErrors\nUdp: 100 2 7 90 5 0\nUdpLite: \
            InDatagrams\nUdpLite: 0\n";
        assert_eq!(snmp_udp(snmp, "RcvbufErrors"), Some(5));
        assert_eq!(snmp_udp(snmp, "Nope"), None);
        assert_eq!(
            snmp6(
                "Udp6InDatagrams 4\nUdp6RcvbufErrors                	12\n",
                "Udp6RcvbufErrors"
            ),
            Some(12)
        );
    }

    #[test]
    fn route_and_qdisc_outputs_are_parsed() {
        assert_eq!(
            route_dev("10.0.0.2 dev veth0 src 10.0.0.1 uid 0 \n    cache \n").as_deref(),
            Some("veth0")
        );
        assert_eq!(
            route_dev("local 127.0.0.1 dev lo table local src 127.0.0.1").as_deref(),
            Some("lo")
        );
        assert!(lists_fq(
            "qdisc mq 0: root \nqdisc fq 0: parent :1 limit 10000p flow_limit 100p\n"
        ));
        assert!(!lists_fq(
            "qdisc htb 1: root refcnt 2 r2q 10 default 0x10\nqdisc pfifo 10: parent \
            1:10 limit 1000p\n"
        ));
        assert!(
            !lists_fq("qdisc fq_codel 0: root refcnt 2 limit 10240p\n"),
            "fq_codel does not pace"
        );
    }
}
