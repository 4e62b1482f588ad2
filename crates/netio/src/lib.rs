//! Socket options and host facts that std does not expose. Linux only: bloatlab measures Linux
//! network stacks, and TCP_INFO / TCP_CONGESTION are Linux interfaces.

pub mod icmp;
pub mod rtnl;
pub mod sendbuf;
pub mod sysfs;
pub mod udp;

use socket2::SockRef;
use std::io::{self, BufRead};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::OnceLock;
use std::time::Instant;

/// A file's pages in the page cache (Linux `cachestat`, 6.5+): cached, dirty, under writeback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStat {
    pub cached: u64,
    pub dirty: u64,
    pub writeback: u64,
}

/// cachestat's number, one for every architecture since Linux 6.5 (the libc crate lacks it for
/// x86_64 glibc).
const SYS_CACHESTAT: libc::c_long = 451;

/// The page-cache state of the whole of `file`; an error on kernels without `cachestat`.
pub fn cachestat(file: &impl AsRawFd) -> io::Result<CacheStat> {
    // struct cachestat_range { off, len } (len 0: to the end) and struct cachestat's five
    // counters: nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted.
    let range = [0u64; 2];
    let mut out = [0u64; 5];
    // SAFETY: valid fd, pointers to the two structs as the syscall defines them, flags 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            range.as_ptr(),
            out.as_mut_ptr(),
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CacheStat {
        cached: out[0],
        dirty: out[1],
        writeback: out[2],
    })
}

/// Bytes per memory page (the unit of /proc/vmstat's page counts).
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// Nanoseconds on this process's monotonic clock. Client and server each use their own; the
/// clock offset between them is estimated, never assumed.
pub fn mono_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Seconds since 1970 on the wall clock (a log's or a file's own time; 0 before 1970).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Puts `dscp` (0..=63) in the TOS / traffic-class byte of everything the socket sends, then
/// reads back the DSCP the socket now carries: the mark as applied, which a kernel, a sandbox or
/// a policy may have refused or altered.
pub fn apply_dscp(sock: SockRef<'_>, dscp: u8, peer: &SocketAddr) -> io::Result<u8> {
    Ok(apply_tos(sock, dscp << 2, peer)? >> 2)
}

/// Puts the whole TOS / traffic-class byte (DSCP and ECN) on everything the socket sends and
/// reads back what it carries. UDP's ECN bits go out as set (a TCP socket's belong to the
/// kernel, which keeps its own). A dual-stack IPv6 socket talking to an IPv4-mapped peer sends
/// IPv4 packets, marked by IP_TOS: that is the option set and read back then.
pub fn apply_tos(sock: SockRef<'_>, tos: u8, peer: &SocketAddr) -> io::Result<u8> {
    let ipv4_packets = match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let applied = if ipv4_packets {
        sock.set_tos_v4(u32::from(tos))?;
        sock.tos_v4()?
    } else {
        sock.set_tclass_v6(u32::from(tos))?;
        sock.tclass_v6()?
    };
    Ok(applied as u8)
}

/// The TOS byte (IPv4, also through an IPv4-mapped IPv6 socket) or traffic class (IPv6) of
/// an accepted TCP connection's SYN, as it arrived: Linux keeps it for the passive side and
/// hands it out as a control message of IP_PKTOPTIONS (IPV6_2292PKTOPTIONS) once IP_RECVTOS
/// (IPV6_RECVTCLASS) is on. `None` where the kernel gives none (the active side gets 0 on IPv4).
pub fn tcp_syn_tos(stream: &impl AsRawFd, peer: &SocketAddr) -> Option<u8> {
    let fd = stream.as_raw_fd();
    let ipv4 = match peer {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    };
    let (level, recv, opts, cmsg) = if ipv4 {
        (
            libc::IPPROTO_IP,
            libc::IP_RECVTOS,
            libc::IP_PKTOPTIONS,
            libc::IP_TOS,
        )
    } else {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVTCLASS,
            libc::IPV6_2292PKTOPTIONS,
            libc::IPV6_TCLASS,
        )
    };
    icmp::setsockopt_int(fd, level, recv, 1).ok()?;
    let mut buf = [0u64; 16];
    let mut len = std::mem::size_of_val(&buf) as libc::socklen_t;
    // SAFETY: a buffer of `len` bytes the kernel fills with control messages, `len` updated.
    let r = unsafe { libc::getsockopt(fd, level, opts, buf.as_mut_ptr().cast(), &mut len) };
    if r != 0 {
        return None;
    }
    // SAFETY: a msghdr over the bytes the kernel wrote, walked with the CMSG_* macros, which
    // stay within msg_controllen; each value read unaligned (an int).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_control = buf.as_mut_ptr().cast();
        msg.msg_controllen = len as _; // socklen_t on musl, size_t on glibc
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == level && (*c).cmsg_type == cmsg {
                let v: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                return Some(v as u8);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    None
}

/// A host route to one address with `features ecn` (ip-route(8)): this host's TCP asks for ECN
/// on connections there whatever `net.ipv4.tcp_ecn` says, until the guard is dropped and the
/// route removed. Needs CAP_NET_ADMIN; refuses a destination that already has a host route (not
/// ours to change) or is this host's own.
pub struct EcnRoute {
    /// `-4` or `-6`, and the `ip` arguments after `route add` / `route del`.
    family: &'static str,
    route: Vec<String>,
}

impl EcnRoute {
    pub fn add(dest: std::net::IpAddr) -> Result<EcnRoute, String> {
        let family = if dest.is_ipv6() { "-6" } else { "-4" };
        let ip = |args: &[&str]| -> Result<String, String> {
            let out = std::process::Command::new("ip")
                .arg(family)
                .args(args)
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(String::from_utf8_lossy(&out.stdout).into_owned())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
            }
        };
        let d = dest.to_string();
        let got = ip(&["-o", "route", "get", &d])?;
        let words: Vec<&str> = got.split_whitespace().collect();
        if words.first() == Some(&"local") {
            return Err(format!(
                "{d} is this host's own address: no route to set ECN on"
            ));
        }
        let after = |key: &str| {
            words
                .windows(2)
                .find(|w| w[0] == key)
                .map(|w| w[1].to_string())
        };
        let dev = after("dev").ok_or_else(|| format!("no device in the route to {d}: {got}"))?;
        let prefix = format!("{d}/{}", if dest.is_ipv6() { 128 } else { 32 });
        let mut route = vec![prefix];
        if let Some(via) = after("via") {
            route.extend(["via".into(), via]);
        }
        route.extend(["dev".into(), dev]);
        let mut add: Vec<&str> = vec!["route", "add"];
        add.extend(route.iter().map(String::as_str));
        add.extend(["features", "ecn"]);
        ip(&add).map_err(|e| {
            format!("adding a route to {d} with ECN ({e}): it takes root, and no host route there")
        })?;
        Ok(EcnRoute { family, route })
    }
}

impl Drop for EcnRoute {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args([self.family, "route", "del"])
            .args(&self.route)
            .output();
    }
}

/// What became of a requested DSCP mark: `None` when it holds, else a sentence for the user.
pub fn dscp_refusal(requested: u8, applied: &io::Result<u8>) -> Option<String> {
    match applied {
        Ok(a) if *a == requested => None,
        Ok(a) => Some(format!(
            "DSCP {requested} was requested but the socket carries {a}"
        )),
        Err(e) => Some(format!("DSCP {requested} could not be set: {e}")),
    }
}

/// Sets the TCP congestion control of one socket; the error names the algorithms available.
pub fn set_cc(stream: &impl AsFd, name: &str) -> io::Result<()> {
    SockRef::from(stream)
        .set_tcp_congestion(name.as_bytes())
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "congestion control {name:?} not available ({e}); this host has: {}",
                    available_cc()
                ),
            )
        })
}

/// The congestion control in effect on a socket.
pub fn cc(stream: &impl AsFd) -> Option<String> {
    let raw = SockRef::from(stream).tcp_congestion().ok()?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    Some(String::from_utf8_lossy(&raw[..end]).into_owned())
}

fn proc_string(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

pub fn default_cc() -> String {
    proc_string("/proc/sys/net/ipv4/tcp_congestion_control")
}

pub fn available_cc() -> String {
    proc_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
}

pub fn kernel() -> String {
    proc_string("/proc/sys/kernel/osrelease")
}

pub fn hostname() -> String {
    proc_string("/proc/sys/kernel/hostname")
}

/// The fields of the kernel's `struct tcp_info` that bloatlab reads. Declared here because
/// libc's glibc variant stops before `tcpi_bytes_acked`; layout as in linux/tcp.h.
#[repr(C)]
#[derive(Default)]
struct RawTcpInfo {
    u8s: [u8; 8],
    rto: u32,
    ato: u32,
    snd_mss: u32,
    rcv_mss: u32,
    unacked: u32,
    sacked: u32,
    lost: u32,
    retrans: u32,
    fackets: u32,
    last_data_sent: u32,
    last_ack_sent: u32,
    last_data_recv: u32,
    last_ack_recv: u32,
    pmtu: u32,
    rcv_ssthresh: u32,
    rtt: u32,
    rttvar: u32,
    snd_ssthresh: u32,
    snd_cwnd: u32,
    advmss: u32,
    reordering: u32,
    rcv_rtt: u32,
    rcv_space: u32,
    total_retrans: u32,
    pacing_rate: u64,
    max_pacing_rate: u64,
    bytes_acked: u64,
    bytes_received: u64,
    segs_out: u32,
    segs_in: u32,
    notsent_bytes: u32,
    min_rtt: u32,
    data_segs_in: u32,
    data_segs_out: u32,
    delivery_rate: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Payload bytes the peer acknowledged cumulatively.
    pub bytes_acked: u64,
    /// Bytes the peer holds beyond a hole (selectively acknowledged segments x MSS): delivered,
    /// but counted in `bytes_acked` only once the hole is filled.
    pub sacked_bytes: u64,
    pub rtt_us: u32,
    /// The receiver's round-trip estimate (how long the peer takes to send a window), 0 before
    /// it has one: a receiving server's view of the path.
    pub rcv_rtt_us: u32,
    pub total_retrans: u32,
    pub snd_cwnd: u32,
    /// Bytes written to the socket and not yet sent.
    pub notsent_bytes: u32,
    /// The kernel's latest delivery-rate estimate, bytes per second (0 before it has one).
    pub delivery_rate: u64,
}

pub fn tcp_info(stream: &impl AsRawFd) -> io::Result<TcpInfo> {
    let mut raw = RawTcpInfo::default();
    let mut len = std::mem::size_of::<RawTcpInfo>() as libc::socklen_t;
    // SAFETY: raw is a plain repr(C) struct of `len` bytes that the kernel fills at most.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut raw as *mut RawTcpInfo as *mut libc::c_void,
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if (len as usize) < std::mem::size_of::<RawTcpInfo>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "TCP_INFO came back with {len} of {} bytes, without the delivery counters \
                 (a kernel before 4.9, or an emulator)",
                std::mem::size_of::<RawTcpInfo>()
            ),
        ));
    }
    // The kernel counts the SYN's sequence number as one acknowledged byte.
    Ok(TcpInfo {
        bytes_acked: raw.bytes_acked.saturating_sub(1),
        sacked_bytes: u64::from(raw.sacked) * u64::from(raw.snd_mss),
        rtt_us: raw.rtt,
        rcv_rtt_us: raw.rcv_rtt,
        total_retrans: raw.total_retrans,
        snd_cwnd: raw.snd_cwnd,
        notsent_bytes: raw.notsent_bytes,
        delivery_rate: raw.delivery_rate,
    })
}

/// How much unsent data a responsive sender lets its socket hold: 5 ms at the connection's
/// delivery rate (draft-ietf-ippm-responsiveness: 625 B at 1 Mbit/s, 62 500 B at 100 Mbit/s),
/// 16 KiB until the kernel has a rate estimate.
pub fn unsent_budget(delivery_rate_bytes_per_s: u64) -> u32 {
    if delivery_rate_bytes_per_s == 0 {
        return 16 * 1024;
    }
    (delivery_rate_bytes_per_s / 200).clamp(1, u64::from(u32::MAX)) as u32
}

/// Before a responsive sender's write: TCP_NOTSENT_LOWAT set to `unsent_budget` of the
/// connection's current delivery rate, so the write waits until the socket holds no more.
/// Returns the budget.
pub fn keep_unsent_small(stream: &impl AsRawFd) -> io::Result<u32> {
    let lowat = unsent_budget(tcp_info(stream)?.delivery_rate);
    set_unsent_limit(stream, lowat)?;
    Ok(lowat)
}

/// Sets socket option `name` at `level` to `value`, passed as the kernel reads it: its bytes and
/// their length (an int, a u32, a timeval, a filter's words).
pub(crate) fn setsockopt<T: Copy>(fd: i32, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: a pointer to a live `T` and exactly its size; the kernel copies it in.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// TCP_NOTSENT_LOWAT: the socket takes more data only while it holds fewer than `bytes` unsent.
pub fn set_unsent_limit(stream: &impl AsRawFd, bytes: u32) -> io::Result<()> {
    setsockopt(
        stream.as_raw_fd(),
        libc::IPPROTO_TCP,
        libc::TCP_NOTSENT_LOWAT,
        &bytes,
    )
}

/// Sends the acknowledgement of what was just read now rather than after the delayed-ACK timer
/// (TCP_QUICKACK, which the kernel clears again by itself). A server that has nothing to send
/// until a client's small write arrives would otherwise hold that client's next small write
/// behind Nagle's algorithm for up to the timer's 40 ms.
pub fn ack_now(stream: &impl AsFd) -> io::Result<()> {
    SockRef::from(stream).set_tcp_quickack(true)
}

/// Blocks SIGPIPE in the calling thread (for a client's network threads, e.g. a tokio runtime's
/// `on_thread_start`). A vectored write (`writev`, no MSG_NOSIGNAL; hyper's and rustls's way)
/// to a connection the peer has closed raises SIGPIPE in the writing thread: blocked there, it
/// stays pending and the write fails with EPIPE on that connection alone, while the main thread
/// keeps the default that ends output piped into `head` quietly. (The server and the lab print
/// little and ignore SIGPIPE in the whole process instead: the CLI's `ignore_sigpipe`.)
pub fn block_sigpipe() {
    // SAFETY: a sigset on the stack, initialised by sigemptyset; changes this thread's mask only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Waits until `fd` is readable (for a listener: a connection is waiting) or `timeout` passed.
pub fn wait_readable(fd: &impl AsRawFd, timeout: std::time::Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout.as_millis().min(i32::MAX as u128) as i32) };
    n > 0
}

/// Reads one `\n`-terminated line of at most `max` bytes. `Ok(None)` at a clean end of stream;
/// an error for an over-long line (the peer does not speak the protocol).
pub fn read_line(r: &mut impl BufRead, max: usize) -> io::Result<Option<Vec<u8>>> {
    let too_long = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("line longer than {max} bytes"),
        )
    };
    let mut line = Vec::new();
    loop {
        // A signal during a read with a socket timeout ends it with EINTR even under
        // SA_RESTART (signal(7)): read again; the caller's deadline still bounds the whole.
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return if line.is_empty() {
                Ok(None)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-line",
                ))
            };
        }
        let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        if line.len() + chunk.len() > max {
            return Err(too_long());
        }
        line.extend_from_slice(chunk);
        let used = end.unwrap_or(chunk.len());
        r.consume(used);
        if end.is_some() {
            return Ok(Some(line));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cachestat_sees_a_files_dirty_pages_until_it_is_synced() {
        use std::io::Write;
        let path = std::env::temp_dir().join(format!("bloatlab-cachestat-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![1u8; 64 * 1024]).unwrap();
        let before = cachestat(&f);
        f.sync_all().unwrap();
        let after = cachestat(&f);
        let _ = std::fs::remove_file(&path);
        let pages = 64 * 1024 / page_size();
        // tmpfs keeps no dirty pages to write back; a disk filesystem does until the sync.
        let (Ok(b), Ok(a)) = (before, after) else {
            return;
        };
        assert_eq!(b.cached, pages);
        assert!(b.dirty == pages || b.dirty == 0, "{b:?}");
        assert_eq!((a.dirty, a.writeback), (0, 0), "{a:?}");
    }

    #[test]
    fn read_line_reads_on_after_an_interrupted_read() {
        // The first read fails as a signal makes a timed socket read fail, then the line comes.
        struct Interrupted(bool, &'static [u8]);
        impl io::Read for Interrupted {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if !self.0 {
                    self.0 = true;
                    return Err(io::Error::from(io::ErrorKind::Interrupted));
                }
                let n = self.1.len().min(buf.len());
                buf[..n].copy_from_slice(&self.1[..n]);
                self.1 = &self.1[n..];
                Ok(n)
            }
        }
        let mut r = io::BufReader::new(Interrupted(false, b"hello\n"));
        assert_eq!(read_line(&mut r, 100).unwrap(), Some(b"hello".to_vec()));
    }
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn the_unsent_budget_is_five_ms_of_the_rate() {
        assert_eq!(unsent_budget(125_000), 625, "1 Mbit/s");
        assert_eq!(unsent_budget(12_500_000), 62_500, "100 Mbit/s");
        assert_eq!(unsent_budget(0), 16 * 1024, "no estimate yet");
        assert_eq!(unsent_budget(100), 1);
    }

    #[test]
    fn a_mark_is_read_back_and_a_refused_one_is_named() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = l.local_addr().unwrap();
        let s = TcpStream::connect(peer).unwrap();
        assert_eq!(apply_dscp(SockRef::from(&s), 46, &peer).unwrap(), 46);
        assert_eq!(dscp_refusal(46, &Ok(46)), None);
        assert_eq!(
            dscp_refusal(46, &Ok(0)).unwrap(),
            "DSCP 46 was requested but the socket carries 0"
        );
        let denied = Err(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(dscp_refusal(8, &denied)
            .unwrap()
            .starts_with("DSCP 8 could not be set"));
    }

    #[test]
    fn reads_lines_and_refuses_endless_ones() {
        let mut r = io::BufReader::new(&b"one\ntwo\nthree"[..]);
        assert_eq!(read_line(&mut r, 10).unwrap().unwrap(), b"one");
        assert_eq!(read_line(&mut r, 10).unwrap().unwrap(), b"two");
        assert!(read_line(&mut r, 10).is_err(), "unterminated last line");
        let long = [b'x'; 100];
        assert!(read_line(&mut io::BufReader::with_capacity(8, &long[..]), 10).is_err());
        assert!(read_line(&mut io::BufReader::new(&b""[..]), 10)
            .unwrap()
            .is_none());
    }

    #[test]
    fn tcp_info_counts_acknowledged_bytes_on_loopback() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        use std::io::{Read, Write};
        c.write_all(&[1u8; 100_000]).unwrap();
        let mut got = vec![0u8; 100_000];
        s.read_exact(&mut got).unwrap();
        let deadline = Instant::now() + std::time::Duration::from_secs(2);
        while tcp_info(&c).unwrap().bytes_acked < 100_000 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(tcp_info(&c).unwrap().bytes_acked, 100_000);
    }

    #[test]
    fn congestion_control_is_settable_and_readable() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        // reno is built into every Linux kernel.
        set_cc(&c, "reno").unwrap();
        assert_eq!(cc(&c).as_deref(), Some("reno"));
        let e = set_cc(&c, "no-such-cc").unwrap_err().to_string();
        assert!(e.contains("this host has"), "{e}");
    }

    /// In a child process with SIGPIPE at its default (Rust binaries start with it ignored): a
    /// writev to a closed peer kills the process, unless the thread blocked SIGPIPE first.
    #[test]
    fn a_thread_that_blocks_sigpipe_gets_epipe_instead_of_dying() {
        let writev_to_closed_peer = |block: bool| -> i32 {
            // SAFETY: the child only makes system calls and leaves with _exit.
            unsafe {
                let pid = libc::fork();
                if pid == 0 {
                    libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                    if block {
                        super::block_sigpipe();
                    }
                    let mut fds = [0; 2];
                    libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr());
                    libc::close(fds[1]);
                    let byte = 1u8;
                    let iov = libc::iovec {
                        iov_base: &byte as *const u8 as *mut libc::c_void,
                        iov_len: 1,
                    };
                    let n = libc::writev(fds[0], &iov, 1);
                    let epipe = n == -1 && *libc::__errno_location() == libc::EPIPE;
                    libc::_exit(if epipe { 0 } else { 1 });
                }
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
                status
            }
        };
        let died = writev_to_closed_peer(false);
        assert!(
            libc::WIFSIGNALED(died) && libc::WTERMSIG(died) == libc::SIGPIPE,
            "without the mask SIGPIPE ends the process: {died}"
        );
        let lived = writev_to_closed_peer(true);
        assert!(
            libc::WIFEXITED(lived) && libc::WEXITSTATUS(lived) == 0,
            "with SIGPIPE blocked the write fails with EPIPE: {lived}"
        );
    }
}
