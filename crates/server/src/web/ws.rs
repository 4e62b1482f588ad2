//! The browser test's latency probes: WebSockets on a port of their own (`--ws`), so a probe
//! never waits behind the page's load in a shared HTTP/2 connection or a full connection pool.
//! The port speaks plain `ws://` and, when the server has a certificate, `wss://` (told apart
//! by the first byte: a TLS handshake starts with 0x16), so a page loaded over either scheme
//! can reach it.
//!
//! Protocol: the page sends its probe's sequence number as a text message; the server answers at
//! once with the number and its own view of the path: the kernel's smoothed round trip of this
//! WebSocket's connection and of the address's latest `/large` and `/slurp` connections
//! (`TCP_INFO`), so the page can show both views and where they differ, and the upload bytes
//! that arrived (the page's upload goodput).
//!
//! Limits: a slot from the same pools as every other connection, the opening (TLS and upgrade)
//! within the header deadline (up to `crate::handshake::LOSSY_HANDSHAKE` while neither the address
//! nor the
//! server holds half its slots, as on the HTTPS face), the connection within the HTTP face's
//! total deadline, a probe at least every `IDLE`, messages of at most 64 bytes. 1000 mute
//! sockets from one address hold its slots 5 s, and the last ones (under half of them) up to
//! 15 s.

use super::Web;
use crate::handshake::handshake_within;
use crate::limits::Slot;
use crate::Shared;
use futures_util::{SinkExt, StreamExt};
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A probe socket that sends nothing for this long is closed.
const IDLE: Duration = Duration::from_secs(5);
/// Largest message accepted: a sequence number needs 10 bytes.
const MAX_MESSAGE: usize = 64;
/// The path the page opens.
pub const PATH: &str = "/ws";

pub(crate) async fn accept_loop(
    listener: TcpListener,
    tls: Option<super::Cert>,
    shared: Arc<Shared>,
    web: Arc<Web>,
) {
    loop {
        let (stream, ip) = super::accept_allowed(&listener, &shared).await;
        // No slot: closed at once (a browser's WebSocket reports a failed connection, which is
        // what it is).
        let Ok(slot) = shared.connections.take(ip) else {
            continue;
        };
        tokio::spawn(serve(
            stream,
            ip,
            slot,
            tls.clone(),
            shared.clone(),
            web.clone(),
        ));
    }
}

async fn serve(
    stream: TcpStream,
    ip: IpAddr,
    slot: Slot,
    tls: Option<super::Cert>,
    shared: Arc<Shared>,
    web: Arc<Web>,
) {
    let _slot = slot;
    let _ = stream.set_nodelay(true);
    let Ok(socket) = stream.as_fd().try_clone_to_owned() else {
        return;
    };
    let handshake = shared.config.hello_timeout;
    let crowded = move || shared.connections.crowded(ip);
    let _ = timeout(web.cfg.max_conn_time, async move {
        // The whole opening (first byte, TLS, upgrade) within the handshake's time, longer only
        // while nobody else wants the slot, as on the HTTPS face (a lossy uplink's handshake).
        if let Some(Some(ws)) = handshake_within(open(stream, tls), handshake, crowded).await {
            probes(ws, ip, &socket, &web).await;
        }
    })
    .await;
}

/// A probe socket, plain or TLS.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
type Io = Box<dyn Stream>;

/// The WebSocket, over TLS when the first byte starts a TLS handshake and the server has a
/// certificate; `None` when the client gives up, or asks for another path.
async fn open(stream: TcpStream, tls: Option<super::Cert>) -> Option<WebSocketStream<Io>> {
    let mut first = [0u8; 1];
    let Ok(1) = stream.peek(&mut first).await else {
        return None;
    };
    let io: Io = match (first[0] == 0x16, tls) {
        #[cfg(feature = "https")]
        (true, Some(tls)) => Box::new(
            tokio_rustls::TlsAcceptor::from(tls.current())
                .accept(stream)
                .await
                .ok()?,
        ),
        (false, _) => Box::new(stream),
        (true, None) => return None,
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE));
    tokio_tungstenite::accept_hdr_async_with_config(io, only_probe_path, Some(config))
        .await
        .ok()
}

/// Refuses upgrades on any path but `PATH`.
#[allow(clippy::result_large_err)] // the signature tungstenite's handshake callback has
fn only_probe_path(req: &Request, resp: Response) -> Result<Response, ErrorResponse> {
    if req.uri().path() == PATH {
        return Ok(resp);
    }
    let mut r = ErrorResponse::new(Some("not found\n".into()));
    *r.status_mut() = tokio_tungstenite::tungstenite::http::StatusCode::NOT_FOUND;
    Err(r)
}

/// Answers probes until the page closes, sends something else, or nothing for `IDLE`.
async fn probes(mut ws: WebSocketStream<Io>, ip: IpAddr, socket: &OwnedFd, web: &Web) {
    while let Ok(Some(Ok(msg))) = timeout(IDLE, ws.next()).await {
        let seq = match &msg {
            Message::Text(t) => match parse_seq(t.as_str()) {
                Some(s) => s,
                None => break,
            },
            // Pings are answered by the library; a close ends the loop.
            Message::Ping(_) | Message::Pong(_) => continue,
            _ => break,
        };
        let kernel = bloatlab_netio::tcp_info(socket).ok().map(|i| i.rtt_us);
        let load = web.page.load_views.get(ip, Instant::now());
        if ws
            .send(Message::text(reply(seq, kernel, load)))
            .await
            .is_err()
        {
            break;
        }
    }
    let _ = ws.close(None).await;
}

/// A sequence number: decimal digits only, as the page sends it.
pub fn parse_seq(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The answer to one probe: its number, the server's views in ms (`null` when unknown), and the
/// upload bytes it has received from this address.
pub fn reply(seq: u32, ws_rtt_us: Option<u32>, load: super::LoadView) -> String {
    let ms = |us: Option<u32>| {
        us.filter(|&u| u > 0).map_or(serde_json::Value::Null, |u| {
            serde_json::json!(u as f64 / 1000.0)
        })
    };
    serde_json::json!({
        "seq": seq,
        "rtt_ms": ms(ws_rtt_us),
        "down_rtt_ms": ms(load.down_us),
        "up_rtt_ms": ms(load.up_us),
        "up_bytes": load.up_bytes,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_sequence_numbers_are_probes() {
        assert_eq!(parse_seq("0"), Some(0));
        assert_eq!(parse_seq("4294967295"), Some(u32::MAX));
        for bad in [
            "",
            "4294967296",
            "-1",
            "1e3",
            " 1",
            "<script>",
            "12345678901",
        ] {
            assert_eq!(parse_seq(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn replies_carry_the_views_in_ms() {
        let r: serde_json::Value = serde_json::from_str(&reply(
            7,
            Some(15_500),
            super::super::LoadView {
                down_us: Some(230_000),
                up_us: None,
                up_bytes: 7,
            },
        ))
        .unwrap();
        assert_eq!(
            (
                r["seq"].as_u64(),
                r["rtt_ms"].as_f64(),
                r["down_rtt_ms"].as_f64()
            ),
            (Some(7), Some(15.5), Some(230.0))
        );
        assert!(r["up_rtt_ms"].is_null());
        assert_eq!(r["up_bytes"], 7);
    }
}
