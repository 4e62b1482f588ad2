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
use std::time::Duration;

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
}

impl ProbeStream {
    /// With `key`, every request is signed and only replies signed under it are taken.
    pub fn start(
        addr: SocketAddr,
        token: Token,
        stream: Stream,
        key: Option<Arc<[u8]>>,
    ) -> Result<ProbeStream, MeasureError> {
        let bind: SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let sock = UdpSocket::bind(bind).map_err(MeasureError::io("UDP socket"))?;
        sock.connect(addr)
            .map_err(|source| MeasureError::Unreachable { addr, source })?;
        let applied = netio::apply_dscp(socket2::SockRef::from(&sock), stream.spec.dscp, &addr);
        let dscp_refused = netio::dscp_refusal(stream.spec.dscp, &applied);
        let dscp_applied = applied.ok();
        let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
        let log = Arc::new(Mutex::new(Log::default()));
        let stop_send = Arc::new(AtomicBool::new(false));
        let stop_recv = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let size = stream.spec.size as usize;
        let interval = Duration::from_micros(stream.spec.interval_us.into());
        let id = stream.spec.id;
        {
            let (sock, log, stop, key) = (
                sock.try_clone().map_err(MeasureError::io("UDP socket"))?,
                log.clone(),
                stop_send.clone(),
                key.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; size.min(MAX_LEN)];
                let mut next = netio::mono_ns();
                let step = interval.as_nanos() as u64;
                while !stop.load(Ordering::Relaxed) {
                    let now = netio::mono_ns();
                    if now < next {
                        std::thread::sleep(Duration::from_nanos((next - now).min(50_000_000)));
                        continue;
                    }
                    let mut l = log.lock().unwrap();
                    let t1 = netio::mono_ns();
                    let flags = if key.is_some() { probe::FLAG_MAC } else { 0 };
                    let p = Probe {
                        kind: Kind::Request,
                        stream: id,
                        token,
                        seq: l.recs.len() as u32,
                        client_send_ns: t1,
                        server_recv_ns: 0,
                        server_send_ns: 0,
                        server_rx_count: 0,
                        flags,
                    };
                    let encoded = p.encode(&mut buf).is_ok();
                    if let (true, Some(k)) = (encoded, &key) {
                        auth::sign_probe(k, &mut buf);
                    }
                    if encoded && sock.send(&buf).is_ok() {
                        l.recs.push(Rec { t1, reply: None });
                    }
                    drop(l);
                    // Isochronous: keep the schedule, but never burst to catch up after a stall.
                    next += step;
                    if next + step < netio::mono_ns() {
                        next = netio::mono_ns();
                    }
                }
            }));
        }
        {
            let (log, stop) = (log.clone(), stop_recv.clone());
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; MAX_LEN + 1];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(n) = sock.recv(&mut buf) else { continue };
                    let t4 = netio::mono_ns();
                    let Ok(p) = Probe::decode(&buf[..n]) else {
                        continue;
                    };
                    if p.kind != Kind::Reply || p.token != token || p.stream != id {
                        continue;
                    }
                    if let Some(k) = &key {
                        if p.flags & probe::FLAG_MAC == 0 || !auth::probe_signed(k, &buf[..n]) {
                            continue;
                        }
                    }
                    let mut l = log.lock().unwrap();
                    if let Some(r) = l.recs.get_mut(p.seq as usize) {
                        // Duplicates, forged replies (wrong send time) and impossible server
                        // times (sent before received, or held longer than the whole round trip)
                        // are ignored: no later subtraction can then go below zero.
                        let held = p.server_send_ns.checked_sub(p.server_recv_ns);
                        let plausible = held.is_some_and(|h| h <= t4.saturating_sub(r.t1));
                        if r.reply.is_none() && r.t1 == p.client_send_ns && plausible {
                            r.reply = Some((p.server_recv_ns, p.server_send_ns, t4));
                            l.received += 1;
                        }
                    }
                }
            }));
        }
        Ok(ProbeStream {
            stream,
            dscp_applied,
            dscp_refused,
            log,
            stop_send,
            stop_recv,
            threads,
        })
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
