//! UDP echo for the probe streams of live tests, and the sink of their UDP loads (counted per
//! arrival, never answered). A reply is never longer than its request,
//! goes only to an address that completed a test's handshake (any port of it: the token is the
//! secret, and a NAT may give each client socket its own port), never exceeds the rate the test
//! negotiated, and with a shared key only answers, and signs, probes that carry a valid MAC.
//! A marks probe (`test marks`) gets its reply with the TOS byte it asks for (its own stream's
//! rate still bounds them) and learns the TOS its request arrived with.
//!
//! It runs on a thread of its own with a blocking socket, not on the runtime: a probe's reply
//! then leaves microseconds after its request arrives (p50 87 us round trip on loopback), where
//! a task woken through the runtime added 0.3 ms at p50 and 4 ms at p99 to every probe.

use crate::Shared;
use bloatlab_netio as netio;
use bloatlab_proto::auth;
use bloatlab_proto::probe::{self, Kind, Probe};
use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const RCVBUF: usize = 32 << 20;

/// Serves until the server stops (noticed within 200 ms).
pub(crate) fn serve(sock: UdpSocket, shared: Arc<Shared>) {
    let _ = sock.set_nonblocking(false);
    // A UDP load's bursts (a sender's 100 ms of data at line rate) must not overflow this
    // socket: what it drops would read as network loss. 32 MB holds 0.25 s at 1 Gbit/s.
    let _ = netio::udp::grow_rcvbuf(&sock, RCVBUF);
    // Without it every request's TOS reads as unknown: marks tests say so, nothing else needs it.
    let _ = netio::udp::enable_recv_tos(&sock);
    let mut buf = [0u8; probe::MAX_LEN + 1];
    // The TOS byte the socket carries now: (requested, read back).
    let mut current_tos: Option<(u8, Option<u8>)> = None;
    while !*shared.stop.borrow() {
        let (n, from, arrived_tos) = match netio::udp::recv_from_tos(&sock, &mut buf) {
            Ok(Some(x)) => x,
            Ok(None) => {
                // Waits at most 200 ms, so a stop is noticed.
                netio::wait_readable(&sock, Duration::from_millis(200));
                continue;
            }
            Err(_) => continue,
        };
        let recv_ns = netio::mono_ns();
        let ip = from.ip().to_canonical();
        if !shared.allowed(ip) {
            shared.counters.not_allowed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let Some(req) = Probe::decode(&buf[..n])
            .ok()
            .filter(|p| p.kind != Kind::Reply)
        else {
            shared.counters.udp_unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Some(session) = shared.sessions.get(&req.token, ip) else {
            shared.counters.udp_unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        if let Some(key) = &shared.config.key {
            if req.flags & probe::FLAG_MAC == 0 || !auth::probe_signed(key, &buf[..n]) {
                shared
                    .counters
                    .udp_unauthenticated
                    .fetch_add(1, Ordering::Relaxed);
                session
                    .probes_unauthenticated
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
        }
        if req.kind == Kind::Load {
            match session
                .udp_loads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&req.stream)
            {
                Some(sink) => {
                    let ce = arrived_tos.is_some_and(|t| t & 3 == 3);
                    sink.arrive(req.seq, n, recv_ns, ce, Instant::now())
                }
                None => {
                    shared.counters.udp_unknown.fetch_add(1, Ordering::Relaxed);
                }
            }
            continue;
        }
        let Some((dscp, ecn)) = session
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&req.stream)
            .map(|st| (st.dscp, st.ecn))
        else {
            shared.counters.udp_unknown.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let signed = req.flags & probe::FLAG_MAC != 0;
        let marks = (req.flags & probe::FLAG_MARKS != 0)
            .then(|| probe::Marks::read(&buf[..n], signed))
            .flatten();
        let tos = marks.map_or(dscp << 2 | ecn, |m| m.reply_tos);
        if current_tos.map(|c| c.0) != Some(tos) {
            // One socket serves every stream: switch its marking only when the stream's differs.
            current_tos = Some((
                tos,
                netio::apply_tos(socket2::SockRef::from(&sock), tos, &from).ok(),
            ));
        }
        let rx_count = {
            let mut streams = session.streams.lock().unwrap_or_else(|e| e.into_inner());
            let Some(st) = streams.get_mut(&req.stream) else {
                continue;
            };
            if !st.bucket.take(Instant::now()) {
                st.limited += 1;
                continue;
            }
            st.received += 1;
            if let Some(t) = arrived_tos {
                bloatlab_proto::tally_tos(&mut st.arrived, t);
            }
            if marks.is_none() {
                st.dscp_applied = current_tos.and_then(|c| c.1).map(|t| t >> 2);
            }
            st.received
        };
        let reply = Probe {
            kind: Kind::Reply,
            server_recv_ns: recv_ns,
            server_send_ns: netio::mono_ns(),
            server_rx_count: rx_count as u32,
            ..req
        };
        if let Some(m) = marks {
            let sent = probe::Marks {
                reply_tos: current_tos.and_then(|c| c.1).unwrap_or(m.reply_tos),
                request_tos: arrived_tos,
                answered: true,
            };
            sent.write(&mut buf[..n], signed);
        }
        // Same buffer, same length: the reply can never be larger than the request.
        if reply.encode(&mut buf[..n]).is_ok() {
            if let Some(key) = &shared.config.key {
                auth::sign_probe(key, &mut buf[..n]);
            }
            let _ = sock.send_to(&buf[..n], from);
        }
    }
}
