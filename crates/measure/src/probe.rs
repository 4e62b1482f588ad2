//! Isochronous UDP echo streams: latency probes and VoIP-like calls.

use crate::plan::Stream;
use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_proto::auth;
use bloatlab_proto::probe::{self, Kind, Probe, MAX_LEN};
use bloatlab_proto::Token;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// One probe: client send time and, once answered, server receive, server send and client
/// receive times (ns; server times on the server's clock).
#[derive(Clone, Copy, Debug)]
pub struct Rec {
    pub t1: u64,
    pub reply: Option<(u64, u64, u64)>,
}

#[derive(Default)]
pub struct Log {
    /// Indexed by sequence number.
    pub recs: Vec<Rec>,
    pub received: u64,
    /// The TOS bytes the replies arrived with, and how many of each (`proto::tally_tos`).
    pub arrived: Vec<(u8, u64)>,
}

pub struct ProbeStream {
    pub stream: Stream,
    /// The DSCP our requests carry, read back after setting it.
    pub dscp_applied: Option<u8>,
    /// Why our requests do not carry the requested DSCP, when they do not.
    pub dscp_refused: Option<String>,
    pub log: Arc<Mutex<Log>>,
    stop_send: Arc<AtomicBool>,
    stop_recv: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// No threads: the caller drives it.
    driven: Option<Driven>,
}

/// A UDP socket connected to the server, with `dscp` and `ecn` in what it sends (and what
/// DSCP the socket carries, or why not).
pub(crate) fn socket(
    addr: SocketAddr,
    dscp: u8,
    ecn: u8,
) -> Result<(UdpSocket, Option<u8>, Option<String>), MeasureError> {
    let bind: SocketAddr = if addr.is_ipv4() {
        "0.0.0.0:0".parse().unwrap()
    } else {
        "[::]:0".parse().unwrap()
    };
    let sock = UdpSocket::bind(bind).map_err(MeasureError::io("UDP socket"))?;
    sock.connect(addr)
        .map_err(|source| MeasureError::Unreachable { addr, source })?;
    // The whole TOS byte: UDP's ECN bits go out as the socket sets them.
    let tos = dscp << 2 | ecn;
    let applied = netio::apply_tos(socket2::SockRef::from(&sock), tos, &addr);
    let ecn_refused = match &applied {
        Ok(a) if a & 3 != ecn => Some(format!(
            "TOS {tos:#04x} was requested but the socket carries {a:#04x}"
        )),
        _ => None,
    };
    let dscp_applied = applied.map(|a| a >> 2);
    let refused = ecn_refused.or_else(|| netio::dscp_refusal(dscp, &dscp_applied));
    Ok((sock, dscp_applied.ok(), refused))
}

/// Sends the next request (its sequence number is the log's length), signed with `key`, and
/// logs it once sent.
fn send_request(
    sock: &UdpSocket,
    buf: &mut [u8],
    l: &mut Log,
    id: u16,
    token: Token,
    key: Option<&[u8]>,
) {
    let t1 = netio::mono_ns();
    let p = Probe {
        kind: Kind::Request,
        stream: id,
        token,
        seq: l.recs.len() as u32,
        client_send_ns: t1,
        server_recv_ns: 0,
        server_send_ns: 0,
        server_rx_count: 0,
        flags: if key.is_some() { probe::FLAG_MAC } else { 0 },
    };
    let encoded = p.encode(buf).is_ok();
    if let (true, Some(k)) = (encoded, key) {
        auth::sign_probe(k, buf);
    }
    if encoded && sock.send(buf).is_ok() {
        l.recs.push(Rec { t1, reply: None });
    }
}

/// Logs `datagram`, received at `t4`, as the reply to its request if it is one of ours.
fn take_reply(
    datagram: &[u8],
    t4: u64,
    tos: Option<u8>,
    log: &Mutex<Log>,
    id: u16,
    token: Token,
    key: Option<&[u8]>,
) {
    let Ok(p) = Probe::decode(datagram) else {
        return;
    };
    if p.kind != Kind::Reply || p.token != token || p.stream != id {
        return;
    }
    if let Some(k) = key {
        if p.flags & probe::FLAG_MAC == 0 || !auth::probe_signed(k, datagram) {
            return;
        }
    }
    let mut l = log.lock().unwrap();
    if let Some(r) = l.recs.get_mut(p.seq as usize) {
        // Duplicates, forged replies (wrong send time) and impossible server times (sent
        // before received, or held longer than the whole round trip) are ignored: no later
        // subtraction can then go below zero.
        let held = p.server_send_ns.checked_sub(p.server_recv_ns);
        let plausible = held.is_some_and(|h| h <= t4.saturating_sub(r.t1));
        if r.reply.is_none() && r.t1 == p.client_send_ns && plausible {
            r.reply = Some((p.server_recv_ns, p.server_send_ns, t4));
            l.received += 1;
            if let Some(t) = tos {
                bloatlab_proto::tally_tos(&mut l.arrived, t);
            }
        }
    }
}

/// A stream driven by its caller's loop (`ProbeStream::start`, `driven`).
struct Driven {
    sock: UdpSocket,
    buf: Vec<u8>,
    next: u64,
    step: u64,
    token: Token,
    key: Option<Arc<[u8]>>,
}

impl ProbeStream {
    /// The stream's socket and an empty log, no threads yet.
    fn bare(addr: SocketAddr, stream: Stream) -> Result<(ProbeStream, UdpSocket), MeasureError> {
        let (sock, dscp_applied, dscp_refused) = socket(addr, stream.spec.dscp, stream.spec.ecn)?;
        let s = ProbeStream {
            stream,
            dscp_applied,
            dscp_refused,
            log: Arc::new(Mutex::new(Log::default())),
            stop_send: Arc::new(AtomicBool::new(false)),
            stop_recv: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            driven: None,
        };
        Ok((s, sock))
    }

    /// With `key`, every request is signed and only replies signed under it are taken.
    /// `driven`: no threads; the caller's loop calls [`ProbeStream::drive`] when each request
    /// is due, which sends it and takes the replies that came meanwhile, timed by the kernel
    /// as they arrived. One wake-up per probe instead of three (sender, receiver, the caller's
    /// poll): what a long-running prober on a small router costs.
    pub fn start(
        addr: SocketAddr,
        token: Token,
        stream: Stream,
        key: Option<Arc<[u8]>>,
        driven: bool,
    ) -> Result<ProbeStream, MeasureError> {
        let (mut s, sock) = ProbeStream::bare(addr, stream)?;
        // What the replies' marks became on the way (the result's `tos_arrived_down`); without
        // it they are unknown, nothing else.
        let _ = netio::udp::enable_recv_tos(&sock);
        if driven {
            netio::udp::enable_rx_timestamps(&sock).map_err(MeasureError::io("UDP timestamps"))?;
            // Else the first answers may be stamped when read, up to an interval late (once per
            // process: the kernel's stamping then stays on).
            netio::udp::ensure_rx_stamping(Duration::from_millis(200));
            s.driven = Some(Driven {
                sock,
                buf: vec![0u8; (s.stream.spec.size as usize).min(MAX_LEN)],
                next: netio::mono_ns(),
                step: u64::from(s.stream.spec.interval_us) * 1_000,
                token,
                key,
            });
            return Ok(s);
        }
        let size = s.stream.spec.size as usize;
        let interval = Duration::from_micros(s.stream.spec.interval_us.into());
        let id = s.stream.spec.id;
        {
            let (sock, log, stop, key) = (
                sock.try_clone().map_err(MeasureError::io("UDP socket"))?,
                s.log.clone(),
                s.stop_send.clone(),
                key.clone(),
            );
            s.threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; size.min(MAX_LEN)];
                let mut next = netio::mono_ns();
                let step = interval.as_nanos() as u64;
                while !stop.load(Ordering::Relaxed) {
                    let now = netio::mono_ns();
                    if now < next {
                        std::thread::sleep(Duration::from_nanos((next - now).min(50_000_000)));
                        continue;
                    }
                    let k = key.as_deref();
                    send_request(&sock, &mut buf, &mut log.lock().unwrap(), id, token, k);
                    // Isochronous: keep the schedule, but never burst to catch up after a stall.
                    next += step;
                    if next + step < netio::mono_ns() {
                        next = netio::mono_ns();
                    }
                }
            }));
        }
        {
            let (log, stop) = (s.log.clone(), s.stop_recv.clone());
            s.threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; MAX_LEN + 1];
                while !stop.load(Ordering::Relaxed) {
                    // Checks the stop at least every 100 ms.
                    if !netio::wait_readable(&sock, Duration::from_millis(100)) {
                        continue;
                    }
                    // An ICMP error (the server's port closed) is reported once in a
                    // datagram's place: the next wait goes on.
                    while let Ok(Some((n, _, tos))) = netio::udp::recv_from_tos(&sock, &mut buf) {
                        let t4 = netio::mono_ns();
                        take_reply(&buf[..n], t4, tos, &log, id, token, key.as_deref());
                    }
                }
            }));
        }
        Ok(s)
    }

    /// A driven stream: takes the replies waiting, sends the request due (one, never a burst
    /// to catch up after a stall), and returns when the next one is due (monotonic ns; a
    /// threaded stream has nothing to drive: never). Errors are a lost probe, as in the threads.
    pub fn drive(&mut self) -> u64 {
        let Some(d) = &mut self.driven else {
            return u64::MAX;
        };
        let (id, token) = (self.stream.spec.id, d.token);
        let mut reply = [0u8; MAX_LEN + 1];
        // An ICMP error (the server's port closed) is reported once in a datagram's place.
        while let Ok(Some(netio::udp::Stamped { len: n, at, tos })) =
            netio::udp::recv_stamped(&d.sock, &mut reply)
        {
            // The kernel's arrival stamp is on the wall clock; the requests' on the monotonic
            // one: the two read together give the offset (their rates agree).
            let (mono, wall) = (netio::mono_ns(), SystemTime::now());
            let ago = at
                .and_then(|a| wall.duration_since(a).ok())
                .unwrap_or_default();
            let t4 = mono.saturating_sub(ago.as_nanos() as u64);
            take_reply(&reply[..n], t4, tos, &self.log, id, token, d.key.as_deref());
        }
        let now = netio::mono_ns();
        if now >= d.next {
            // Stopped (a session's end, waiting for its last answers), the schedule still
            // runs: the caller keeps waking at the probes' pace, not in a spin.
            if !self.stop_send.load(Ordering::Relaxed) {
                let mut l = self.log.lock().unwrap();
                send_request(&d.sock, &mut d.buf, &mut l, id, token, d.key.as_deref());
            }
            d.next += d.step;
            if d.next < now {
                d.next = now + d.step;
            }
        }
        d.next
    }

    /// A driven stream's first request at `at` (monotonic ns) rather than at its first
    /// [`ProbeStream::drive`].
    pub fn first_at(&mut self, at: u64) {
        if let Some(d) = &mut self.driven {
            d.next = at;
        }
    }

    pub fn stop_sending(&self) {
        self.stop_send.store(true, Ordering::Relaxed);
    }

    /// Unanswered probes so far.
    pub fn outstanding(&self) -> u64 {
        let l = self.log.lock().unwrap();
        l.recs.len() as u64 - l.received
    }

    pub fn stop(&mut self) {
        self.stop_send.store(true, Ordering::Relaxed);
        self.stop_recv.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ProbeStream {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_proto::StreamSpec;

    /// A driven stream against a server that answers at once: an answer read 40 ms after it
    /// came keeps its own arrival time, and a stopped stream sends no more but keeps its pace.
    #[test]
    fn a_driven_stream_times_answers_as_they_arrived_and_keeps_its_pace_when_stopped() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let token = Token([7; 16]);
        let spec = StreamSpec {
            id: 3,
            interval_us: 10_000,
            size: 64,
            dscp: 0,
            ecn: 0,
        };
        let stream = Stream {
            name: "driven".into(),
            spec,
        };
        let addr = server.local_addr().unwrap();
        let mut s = ProbeStream::start(addr, token, stream, None, true).unwrap();
        let sent_at = netio::mono_ns();
        let next = s.drive();
        assert!(next >= sent_at + 5_000_000, "the next probe an interval on");
        // The server's answer, at once.
        let mut buf = [0u8; MAX_LEN];
        let (n, from) = server.recv_from(&mut buf).unwrap();
        let mut p = Probe::decode(&buf[..n]).unwrap();
        assert_eq!((p.seq, p.stream, p.token), (0, 3, token));
        p.kind = Kind::Reply;
        p.server_recv_ns = 1_000;
        p.server_send_ns = 2_000;
        p.encode(&mut buf[..n]).unwrap();
        server.send_to(&buf[..n], from).unwrap();
        std::thread::sleep(Duration::from_millis(40));
        s.drive();
        let r = s.log.lock().unwrap().recs[0];
        let (_, _, t4) = r.reply.expect("the answer was taken");
        let rtt_ms = (t4 - r.t1) as f64 / 1e6;
        assert!(
            rtt_ms < 10.0,
            "round trip {rtt_ms} ms: timed when read, not when it came"
        );
        // Stopped: no more requests, the next wake-up still an interval ahead.
        s.stop_sending();
        let sent = s.log.lock().unwrap().recs.len();
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(11));
            let due = s.drive();
            assert!(
                due > netio::mono_ns(),
                "a wake-up in the past: the caller would spin"
            );
        }
        assert_eq!(s.log.lock().unwrap().recs.len(), sent);
    }
}
