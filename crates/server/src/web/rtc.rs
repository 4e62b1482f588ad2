//! The browser test's probes that see loss as loss: a WebRTC data channel the page opens
//! unordered and never retransmitted (`ordered: false, maxRetransmits: 0`), so a probe a full
//! FIFO drops is lost, as the CLI's UDP probe is, where a WebSocket probe (TCP) waits for its
//! retransmission and reads as delay.
//!
//! Signalling is one request on the HTTP face: the page POSTs its SDP offer to `PATH` and gets
//! the answer: ICE-lite, one host candidate (the address the request came in on, with the
//! probe port's number over UDP: `--ws` binds TCP and UDP alike). The sessions then run
//! sans-I/O (str0m) in one task that owns the UDP socket, which hands each datagram to the
//! session it belongs to and wakes for the earliest timer among them. Probes are the
//! WebSocket's: a sequence number as text, answered with `ws::reply`.
//!
//! Limits: each session holds a connection slot from the same pools as every other
//! connection, at most `MAX_SESSIONS` run at once, each within the HTTP face's total
//! connection time and closed after `IDLE` without a probe (its first included); an offer is
//! at most `MAX_OFFER` bytes and offers data channels only (no media to decode); a probe
//! message at most `MAX_MESSAGE` bytes, else the session ends.

use super::ws;
use super::Web;
use crate::limits::{Full, Slot, Slots};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};
use str0m::change::SdpOffer;
use str0m::config::{CryptoProvider, DtlsCert};
use str0m::net::{Protocol, Receive};
use str0m::{Candidate, Event, IceConnectionState, Input, Output, Rtc};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// Where the page posts its offer.
pub const PATH: &str = "/rtc";
/// Largest offer read: Chromium's data-channel offer is under 1 kB, with candidates 2-3 kB.
pub const MAX_OFFER: usize = 16 * 1024;
/// Sessions at once, whatever the connection slots allow: each holds SCTP and DTLS state.
const MAX_SESSIONS: usize = 256;
/// A session with no probe for this long (or none since it opened) is closed.
const IDLE: Duration = Duration::from_secs(5);
/// Largest probe message: a sequence number needs 10 bytes.
const MAX_MESSAGE: usize = 64;
/// Largest datagram read; WebRTC keeps its packets under 1200 bytes or so.
const MAX_DATAGRAM: usize = 2048;

/// Turns offers into answers and the sessions they open (no I/O: the fuzzer drives it).
pub struct Answerer {
    provider: Arc<CryptoProvider>,
    /// One certificate for every session: generating a key per offer would hand whoever
    /// posts offers the server's CPU.
    cert: DtlsCert,
}

impl Answerer {
    /// `None` where the crypto provider cannot make a certificate.
    pub fn new() -> Option<Answerer> {
        let provider = str0m::crypto::from_feature_flags();
        let cert = provider.dtls_provider.generate_certificate()?;
        Some(Answerer {
            provider: Arc::new(provider),
            cert,
        })
    }

    /// The session an offer opens and the SDP answer for it, its one candidate `local`; or why
    /// the offer is refused (the server's words: nothing of the offer is echoed).
    pub fn accept(
        &self,
        offer: &str,
        local: SocketAddr,
        now: Instant,
    ) -> Result<(Rtc, String), &'static str> {
        if offer.len() > MAX_OFFER {
            return Err("an offer is at most 16 kB");
        }
        if offer
            .lines()
            .any(|l| l.starts_with("m=") && !l.starts_with("m=application "))
        {
            return Err("offer a data channel only");
        }
        let offer = SdpOffer::from_sdp_string(offer).map_err(|_| "not an SDP offer")?;
        let mut rtc = Rtc::builder()
            .set_ice_lite(true)
            .set_crypto_provider(self.provider.clone())
            .set_dtls_cert(self.cert.clone())
            .build(now);
        let candidate = Candidate::host(local, "udp").map_err(|_| "no candidate")?;
        rtc.add_local_candidate(candidate);
        let answer = rtc
            .sdp_api()
            .accept_offer(offer)
            .map_err(|_| "an offer this server cannot answer")?;
        Ok((rtc, answer.to_sdp_string()))
    }
}

/// Why an offer got no session.
pub(crate) enum Refused {
    /// The offer itself (400).
    Offer(&'static str),
    /// No slot for the address or the server, or the session task is full (429).
    Busy(String),
}

/// The HTTP face's half: answers offers, hands sessions to `serve`.
pub(crate) struct Face {
    answerer: Answerer,
    port: u16,
    slots: Arc<Slots>,
    max_time: Duration,
    /// One permit per live session, `MAX_SESSIONS` in all.
    room: Arc<Semaphore>,
    sessions: mpsc::Sender<Session>,
}

/// What `serve` runs on.
pub(crate) struct Socket {
    udp: std::net::UdpSocket,
    sessions: mpsc::Receiver<Session>,
}

impl Face {
    /// The face and its socket, bound (non-blocking) on `udp`; slots from `slots`.
    pub(crate) fn new(
        udp: std::net::UdpSocket,
        slots: Arc<Slots>,
        max_time: Duration,
    ) -> std::io::Result<(Face, Socket)> {
        let answerer =
            Answerer::new().ok_or_else(|| std::io::Error::other("no DTLS certificate"))?;
        let port = udp.local_addr()?.port();
        let (tx, rx) = mpsc::channel(MAX_SESSIONS);
        let face = Face {
            answerer,
            port,
            slots,
            max_time,
            room: Arc::new(Semaphore::new(MAX_SESSIONS)),
            sessions: tx,
        };
        Ok((face, Socket { udp, sessions: rx }))
    }

    /// Answers `offer` from `ip`, which reached this server at `local`, and starts its session.
    pub(crate) fn offer(&self, offer: &str, local: IpAddr, ip: IpAddr) -> Result<String, Refused> {
        let busy = || Refused::Busy("too many probe sessions at once".into());
        let room = self.room.clone().try_acquire_owned().map_err(|_| busy())?;
        let slot = self
            .slots
            .take(ip)
            .map_err(|f: Full| Refused::Busy(f.to_string()))?;
        let now = Instant::now();
        let local = SocketAddr::new(local.to_canonical(), self.port);
        let (rtc, answer) = self
            .answerer
            .accept(offer, local, now)
            .map_err(Refused::Offer)?;
        let session = Session {
            rtc,
            ip,
            local,
            deadline: now + self.max_time,
            last_probe: now,
            wake: now,
            _slot: slot,
            _room: room,
            outbox: Vec::new(),
        };
        self.sessions.try_send(session).map_err(|_| busy())?;
        Ok(answer)
    }
}

/// One page's data channel.
pub(crate) struct Session {
    rtc: Rtc,
    ip: IpAddr,
    /// The candidate the page was given: where its datagrams arrive.
    local: SocketAddr,
    deadline: Instant,
    last_probe: Instant,
    /// When str0m next wants time.
    wake: Instant,
    _slot: Slot,
    _room: OwnedSemaphorePermit,
    /// Datagrams str0m made since the last flush, in order.
    outbox: Vec<(SocketAddr, Vec<u8>)>,
}

impl Session {
    /// When this session next needs `tick`: str0m's timer, its idle limit or its deadline.
    fn next_due(&self) -> Instant {
        self.wake.min(self.last_probe + IDLE).min(self.deadline)
    }

    /// Ends a session past its limits, gives str0m the time it asked for; false once over.
    fn tick(&mut self, now: Instant, socket: &UdpSocket, web: &Web) -> bool {
        if now >= self.deadline || now >= self.last_probe + IDLE {
            return false;
        }
        if now >= self.wake && self.rtc.handle_input(Input::Timeout(now)).is_err() {
            return false;
        }
        self.poll(now, socket, web)
    }

    /// Sends what str0m has to send and answers probes until it waits for time or input.
    fn poll(&mut self, now: Instant, socket: &UdpSocket, web: &Web) -> bool {
        loop {
            match self.rtc.poll_output() {
                Ok(Output::Timeout(t)) => {
                    self.wake = t;
                    // A full socket buffer drops a datagram, as a full queue on the path would.
                    for (to, datagram) in coalesce(std::mem::take(&mut self.outbox)) {
                        let _ = socket.try_send_to(&datagram, to);
                    }
                    return self.rtc.is_alive();
                }
                Ok(Output::Transmit(t)) => self.outbox.push((t.destination, t.contents.to_vec())),
                Ok(Output::Event(Event::ChannelData(d))) => {
                    let seq = (d.data.len() <= MAX_MESSAGE)
                        .then(|| std::str::from_utf8(&d.data).ok())
                        .flatten()
                        .and_then(ws::parse_seq);
                    let Some(seq) = seq else {
                        return false;
                    };
                    self.last_probe = now;
                    let load = web.page.load_views.get(self.ip, now);
                    // No kernel view of a UDP path: the reply's own RTT is `null`.
                    let reply = ws::reply(seq, None, load);
                    if let Some(mut channel) = self.rtc.channel(d.id) {
                        let _ = channel.write(false, reply.as_bytes());
                    }
                }
                Ok(Output::Event(Event::IceConnectionStateChange(
                    IceConnectionState::Disconnected,
                ))) => return false,
                Ok(Output::Event(_)) => {}
                Err(_) => return false,
            }
        }
    }

    /// Takes a datagram if it is this session's.
    fn take(&mut self, now: Instant, from: SocketAddr, data: &[u8]) -> Option<bool> {
        let input = Input::Receive(
            now,
            Receive {
                proto: Protocol::Udp,
                source: from,
                destination: self.local,
                contents: data.try_into().ok()?,
            },
        );
        if !self.rtc.accepts(&input) {
            return None;
        }
        Some(self.rtc.handle_input(input).is_ok())
    }
}

/// Largest datagram `coalesce` makes: WebRTC's own packets stay under this (no IP
/// fragmentation on a 1280-byte IPv6 path).
const MAX_COALESCED: usize = 1200;

/// Puts consecutive DTLS records for one peer into one datagram, up to `MAX_COALESCED` bytes
/// (RFC 6347 §4.1.1 allows several records per datagram). str0m sends the SACK of a probe and
/// its answer as two datagrams, one after the other: through a drop-tail FIFO that TCP keeps
/// within a packet of full, the second of two back-to-back packets is dropped far more often
/// than a lone one, so two-packet answers read as several times the CLI's one-packet loss
/// (BENCHMARKS.md). STUN and anything else is sent as it came (RFC 7983: DTLS starts 20..=63).
pub fn coalesce(datagrams: Vec<(SocketAddr, Vec<u8>)>) -> Vec<(SocketAddr, Vec<u8>)> {
    let dtls = |d: &[u8]| d.first().is_some_and(|b| (20..=63).contains(b));
    let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::with_capacity(datagrams.len());
    let mut open = false; // whether the last datagram out may take more records
    for (to, d) in datagrams {
        match out.last_mut() {
            Some((last_to, last))
                if open && dtls(&d) && *last_to == to && last.len() + d.len() <= MAX_COALESCED =>
            {
                last.extend_from_slice(&d)
            }
            _ => {
                open = dtls(&d);
                out.push((to, d));
            }
        }
    }
    out
}

/// Runs every session on the socket until the runtime ends.
pub(crate) async fn serve(socket: Socket, web: Arc<Web>) {
    let Socket {
        udp,
        sessions: mut incoming,
    } = socket;
    let Ok(udp) = UdpSocket::from_std(udp) else {
        return;
    };
    let mut sessions: Vec<Session> = Vec::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let now = Instant::now();
        // Only sessions whose timer or limit is due: a datagram wakes this loop, and polling
        // every session for each one would cost sessions x datagrams.
        sessions.retain_mut(|s| now < s.next_due() || s.tick(now, &udp, &web));
        let wake = sessions
            .iter()
            .map(Session::next_due)
            .min()
            .unwrap_or(now + IDLE);
        tokio::select! {
            got = udp.recv_from(&mut buf) => {
                let Ok((n, from)) = got else { continue };
                let from = SocketAddr::new(from.ip().to_canonical(), from.port());
                let now = Instant::now();
                let data = &buf[..n];
                let hit = sessions
                    .iter_mut()
                    .enumerate()
                    .find_map(|(i, s)| Some((i, s.take(now, from, data)?)));
                if let Some((i, taken)) = hit {
                    if !taken || !sessions[i].poll(now, &udp, &web) {
                        sessions.swap_remove(i);
                    }
                }
            }
            s = incoming.recv() => match s {
                Some(s) => sessions.push(s),
                None => return,
            },
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A data-channel offer as Chromium makes it (no candidates: the server is ICE-lite).
    fn chromium_offer() -> String {
        include_str!("chromium-offer.sdp").to_string()
    }

    #[test]
    fn a_data_channel_offer_is_answered_ice_lite_with_one_host_candidate() {
        let answerer = Answerer::new().unwrap();
        let local: SocketAddr = "192.0.2.10:8081".parse().unwrap();
        let (_rtc, answer) = answerer
            .accept(&chromium_offer(), local, Instant::now())
            .unwrap();
        assert!(answer.contains("a=ice-lite"), "{answer}");
        let candidates: Vec<&str> = answer
            .lines()
            .filter(|l| l.starts_with("a=candidate"))
            .collect();
        assert_eq!(candidates.len(), 1, "{answer}");
        assert!(
            candidates[0].contains("192.0.2.10 8081 typ host"),
            "{answer}"
        );
        assert!(answer.contains("m=application"), "{answer}");
    }

    #[test]
    fn offers_of_media_garbage_or_bulk_are_refused() {
        let answerer = Answerer::new().unwrap();
        let local: SocketAddr = "192.0.2.10:8081".parse().unwrap();
        let media = chromium_offer().replace(
            "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
            "m=audio 9 UDP/TLS/RTP/SAVPF 111",
        );
        let huge = chromium_offer() + &"a=x\r\n".repeat(MAX_OFFER / 5);
        for (offer, why) in [
            (media.as_str(), "offer a data channel only"),
            ("GET / HTTP/1.1", "not an SDP offer"),
            ("", "not an SDP offer"),
            (huge.as_str(), "an offer is at most 16 kB"),
        ] {
            let got = answerer.accept(offer, local, Instant::now()).err();
            assert_eq!(got, Some(why), "{:.60}", offer);
        }
    }

    #[test]
    fn dtls_records_for_one_peer_share_a_datagram_up_to_its_size() {
        let a: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        let b: SocketAddr = "192.0.2.2:5000".parse().unwrap();
        // 23: DTLS application data; 0x00 0x01: a STUN binding request.
        let rec = |n: usize| vec![23u8; n];
        let stun = vec![0u8, 1, 0, 0];
        let out = coalesce(vec![
            (a, rec(60)),
            (a, rec(150)),
            (a, stun.clone()),
            (a, rec(60)),
            (b, rec(60)),
            (b, rec(1100)),
            (b, rec(100)),
        ]);
        let sizes: Vec<(SocketAddr, usize)> = out.iter().map(|(t, d)| (*t, d.len())).collect();
        assert_eq!(
            sizes,
            [
                (a, 210),       // a SACK and an answer: one packet
                (a, 4),         // STUN alone
                (a, 60),        // not after STUN
                (b, 60 + 1100), // another peer starts anew
                (b, 100),       // over 1200 bytes: its own datagram
            ]
        );
        assert_eq!(
            out[0].1,
            [rec(60), rec(150)].concat(),
            "records kept whole, in order"
        );
    }
}
