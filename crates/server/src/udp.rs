//! UDP echo for probe streams of live tests.

use crate::Shared;
use bloatlab_netio as netio;
use bloatlab_proto::probe::{self, Kind, Probe};
use std::net::UdpSocket;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) fn serve(sock: UdpSocket, shared: &Shared) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; probe::MAX_LEN + 1];
    // The mark the socket carries now: (requested, read back).
    let mut current_dscp: Option<(u8, Option<u8>)> = None;
    while !shared.stop.load(Ordering::Relaxed) {
        let (n, from) = match sock.recv_from(&mut buf) {
            Ok(x) => x,
            Err(_) => continue,
        };
        let recv_ns = netio::mono_ns();
        let Ok(req) = Probe::decode(&buf[..n]) else { continue };
        if req.kind != Kind::Request {
            continue;
        }
        let Some(session) = shared.sessions.get(&req.token, from.ip().to_canonical()) else { continue };
        let dscp = {
            let streams = session.streams.lock().unwrap();
            let Some(st) = streams.get(&req.stream) else { continue };
            st.dscp
        };
        if current_dscp.map(|c| c.0) != Some(dscp) {
            // One socket serves every stream: switch its marking only when the stream's differs.
            current_dscp = Some((dscp, netio::apply_dscp(socket2::SockRef::from(&sock), dscp, &from).ok()));
        }
        let rx_count = {
            let mut streams = session.streams.lock().unwrap();
            let Some(st) = streams.get_mut(&req.stream) else { continue };
            if !st.bucket.take(Instant::now()) {
                st.limited += 1;
                continue;
            }
            st.received += 1;
            st.dscp_applied = current_dscp.and_then(|c| c.1);
            st.received
        };
        let reply = Probe {
            kind: Kind::Reply,
            server_recv_ns: recv_ns,
            server_send_ns: netio::mono_ns(),
            server_rx_count: rx_count as u32,
            ..req
        };
        // Same buffer, same length: the reply can never be larger than the request.
        if reply.encode(&mut buf[..n]).is_ok() {
            let _ = sock.send_to(&buf[..n], from);
        }
    }
}
