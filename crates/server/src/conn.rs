//! TCP connections: accepted into a slot (or refused, naming the limit), then told apart by
//! their first line: a test's control connection, one of its data flows, or a new-connection
//! probe. Each phase has a total deadline, never a per-read timeout.

use crate::handshake::handshake_within;
use crate::lines::{read_line, send, send_while_taken, Reader};
use crate::session::Session;
use crate::{data, limits::Slot, random, Shared, GRACE};
use bloatlab_netio as netio;
use bloatlab_proto::{
    self as proto, auth, ClientMsg, HostInfo, RefuseReason, ServerMsg, TestRequest, Token,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout, timeout_at, Instant};

/// The next connection; out of descriptors or memory, it backs off instead of spinning.
pub(crate) async fn accept(listener: &TcpListener) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(x) => return x,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

pub(crate) async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let (stream, peer) = accept(&listener).await;
        let ip = peer.ip().to_canonical();
        if !shared.allowed(ip) {
            shared.counters.not_allowed.fetch_add(1, Ordering::Relaxed);
            refuse_in_background(
                stream,
                ip,
                &shared,
                RefuseReason::Forbidden,
                "your address is not among those this server serves".into(),
            );
            continue;
        }
        match shared.connections.take(ip) {
            Ok(slot) => {
                let s = shared.clone();
                tokio::spawn(async move { handle(stream, peer, slot, s).await });
            }
            Err(full) => {
                refuse_in_background(stream, ip, &shared, RefuseReason::Busy, full.to_string())
            }
        }
    }
}

/// Says why, then closes; at most `MAX_REFUSING` at once, each within a second, so a flood of
/// connections costs the server nothing lasting.
fn refuse_in_background(
    stream: TcpStream,
    ip: IpAddr,
    shared: &Arc<Shared>,
    reason: RefuseReason,
    message: String,
) {
    let Ok(slot) = shared.refusing.take(ip) else {
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let (_, mut w) = stream.into_split();
        let _ = timeout(
            Duration::from_secs(1),
            send(&mut w, &ServerMsg::Refused { reason, message }),
        )
        .await;
    });
}

async fn refuse(w: &mut OwnedWriteHalf, reason: RefuseReason, message: String) {
    let _ = timeout(
        Duration::from_secs(1),
        send(w, &ServerMsg::Refused { reason, message }),
    )
    .await;
}

async fn handle(stream: TcpStream, peer: SocketAddr, _slot: Slot, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    let ip = peer.ip().to_canonical();
    // A load flow's or a probe's hello crosses the loaded uplink, as a TLS ClientHello does on
    // the web faces: the same allowance for a lost first flight while the slots are not wanted.
    let crowded = || shared.connections.crowded(ip);
    let first = match handshake_within(
        read_line(&mut r, proto::MAX_LINE),
        shared.config.hello_timeout,
        crowded,
    )
    .await
    {
        Some(Ok(Some(line))) => line,
        Some(Err(e)) => {
            return refuse(
                &mut w,
                RefuseReason::Version,
                format!("not a bloatlab client ({e})"),
            )
            .await
        }
        // Silence or a trickle past the deadline: the slot is needed elsewhere.
        _ => return,
    };
    match proto::decode_line::<ClientMsg>(&first) {
        Ok(ClientMsg::Hello { magic, version, .. })
            if magic == proto::MAGIC && version == proto::PROTOCOL_VERSION =>
        {
            control(r, w, ip, shared).await
        }
        Ok(ClientMsg::Hello { version, .. }) => {
            let msg = format!(
                "this server speaks protocol version {}, the client {version}: use \
                the same bloatlab release on both ends",
                proto::PROTOCOL_VERSION
            );
            refuse(&mut w, RefuseReason::Version, msg).await
        }
        Ok(ClientMsg::DataHello { token, flow }) => match shared.sessions.get(&token, ip) {
            Some(session) => data::run(r, w, peer, session, flow).await,
            None => {
                refuse(
                    &mut w,
                    RefuseReason::Token,
                    "unknown or expired token".into(),
                )
                .await
            }
        },
        Ok(ClientMsg::ProbeHello { token }) => probe(r, w, ip, token, &shared).await,
        Ok(_) => refuse(&mut w, RefuseReason::BadRequest, "expected hello".into()).await,
        Err(e) => {
            refuse(
                &mut w,
                RefuseReason::Version,
                format!("not a bloatlab client ({e})"),
            )
            .await
        }
    }
}

/// A new-connection probe: answered at once if its test asked for them and keeps to their rate.
async fn probe(mut r: Reader, mut w: OwnedWriteHalf, ip: IpAddr, token: Token, shared: &Shared) {
    let Some(session) = shared.sessions.get(&token, ip) else {
        return refuse(
            &mut w,
            RefuseReason::Token,
            "unknown or expired token".into(),
        )
        .await;
    };
    if let Err(why) = session.admit_conn_probe() {
        return refuse(&mut w, RefuseReason::Limit, why.into()).await;
    }
    // What the SYN's marks became on the way here (`test marks`): two socket calls.
    let syn_tos = w
        .peer_addr()
        .ok()
        .and_then(|peer| netio::tcp_syn_tos(w.as_ref(), &peer));
    let _ = timeout(shared.config.hello_timeout, async {
        send(&mut w, &ServerMsg::ProbeReply { syn_tos }).await?;
        // Wait for the client to close, so that the close costs it nothing.
        let mut sink = [0u8; 64];
        r.read(&mut sink).await
    })
    .await;
}

/// A test's control connection: hello, the request (with proof of the key if the server has
/// one), acceptance within the limits, then waiting for `finish` until the test's deadline.
async fn control(mut r: Reader, mut w: OwnedWriteHalf, ip: IpAddr, shared: Arc<Shared>) {
    let cfg = &shared.config;
    let challenge = match &cfg.key {
        Some(_) => match random::<{ auth::CHALLENGE_LEN }>() {
            Some(c) => Some(c),
            None => {
                return refuse(
                    &mut w,
                    RefuseReason::Busy,
                    "the server has no randomness for a challenge".into(),
                )
                .await
            }
        },
        None => None,
    };
    let hello = ServerMsg::HelloOk {
        version: proto::PROTOCOL_VERSION,
        server_version: env!("CARGO_PKG_VERSION").into(),
        max_duration_ms: cfg.max_duration.as_millis() as u64,
        challenge: challenge.map(|c| auth::hex(&c)),
    };
    if send(&mut w, &hello).await.is_err() {
        return;
    }
    // The request follows the answer within the hello's deadline.
    let req = match timeout(cfg.hello_timeout, read_line(&mut r, proto::MAX_LINE)).await {
        Ok(Ok(Some(line))) => match proto::decode_line::<ClientMsg>(&line) {
            Ok(ClientMsg::Test(req)) => req,
            _ => {
                return refuse(
                    &mut w,
                    RefuseReason::BadRequest,
                    "expected a test request".into(),
                )
                .await
            }
        },
        _ => return,
    };
    let authenticated = match (&cfg.key, &challenge) {
        (Some(key), Some(c)) => match &req.auth {
            Some(a) if auth::verify_answer(key, c, a) => true,
            Some(_) => return refuse(&mut w, RefuseReason::Auth, "wrong key".into()).await,
            None => {
                return refuse(
                    &mut w,
                    RefuseReason::Auth,
                    "this server requires its key (bloatlab test --key FILE)".into(),
                )
                .await
            }
        },
        _ => false,
    };
    if let Err(why) = validate(&req, cfg) {
        return refuse(&mut w, RefuseReason::Limit, why).await;
    }
    let _test_slot = match shared.tests.take(ip) {
        Ok(s) => s,
        Err(full) => return refuse(&mut w, RefuseReason::Busy, full.to_string()).await,
    };
    let Some(token) = random::<16>().map(Token) else {
        return refuse(
            &mut w,
            RefuseReason::Busy,
            "the server has no randomness for a token".into(),
        )
        .await;
    };
    let duration = Duration::from_millis(req.duration_ms);
    let deadline = Instant::now() + duration + GRACE;
    let session = Arc::new(Session::new(
        ip,
        deadline.into_std(),
        req.clone(),
        cfg.max_rate_bytes,
    ));
    shared.sessions.insert(token, session.clone());
    let name = proto::printable(&req.test);
    shared.log(format_args!(
        "test {name} from {ip}: {} flows, {} probe streams, {:.1} s",
        req.flows.len(),
        req.streams.len(),
        duration.as_secs_f64()
    ));
    let host = (authenticated || cfg.expose_host).then(|| HostInfo {
        kernel: netio::kernel(),
        default_cc: netio::default_cc(),
    });
    let accepted = ServerMsg::Accepted {
        token,
        max_duration_ms: cfg.max_duration.as_millis() as u64,
        host,
    };
    if send(&mut w, &accepted).await.is_ok() {
        // Wait for `finish` (or the client's end) until the deadline.
        if let Ok(Ok(Some(line))) = timeout_at(deadline, read_line(&mut r, proto::MAX_LINE)).await {
            if let Ok(ClientMsg::Finish) = proto::decode_line::<ClientMsg>(&line) {
                // The report can be a megabyte or two (a long test's acknowledged bytes, a UDP
                // load's arrival profile): sent while the client takes it, within a minute.
                let stall = Duration::from_secs(if req.udp_loads.is_empty() { 2 } else { 10 });
                let report = session.report();
                let _ = send_while_taken(&mut w, &report, stall, proto::REPORT_DEADLINE).await;
            }
        }
    }
    session.end();
    shared.sessions.remove(&token);
    let c = &shared.counters;
    shared.log(format_args!(
        "test {name} from {ip} ended; pings dropped (client not reading) {}; server-wide: \
            unauthenticated probes {}, unknown UDP {}, refused addresses {}",
        session.pings_dropped.load(Ordering::Relaxed),
        c.udp_unauthenticated.load(Ordering::Relaxed),
        c.udp_unknown.load(Ordering::Relaxed),
        c.not_allowed.load(Ordering::Relaxed),
    ));
}

/// UDP load streams one test may send.
const MAX_UDP_LOADS: usize = 4;

/// The request against the server's limits; the error names the limit.
pub fn validate(req: &TestRequest, cfg: &crate::Config) -> Result<(), String> {
    if Duration::from_millis(req.duration_ms) > cfg.max_duration {
        return Err(format!(
            "test of {} s exceeds this server's limit of {} s",
            req.duration_ms / 1000,
            cfg.max_duration.as_secs()
        ));
    }
    if req.flows.len() > cfg.max_flows {
        return Err(format!(
            "{} flows exceed this server's limit of {}",
            req.flows.len(),
            cfg.max_flows
        ));
    }
    if req.streams.len() > cfg.max_streams {
        return Err(format!(
            "{} probe streams exceed this server's limit of {}",
            req.streams.len(),
            cfg.max_streams
        ));
    }
    let mut ids = std::collections::HashSet::new();
    if !req.flows.iter().all(|f| ids.insert(f.id)) {
        return Err("two flows with the same id".into());
    }
    let mut ids = std::collections::HashSet::new();
    if !req.streams.iter().all(|s| ids.insert(s.id)) {
        return Err("two probe streams with the same id".into());
    }
    let dscp_ok = |d: u8| -> Result<(), String> {
        if d > 63 {
            return Err(format!("DSCP {d} out of range 0..63"));
        }
        match &cfg.allow_dscp {
            Some(allowed) if !allowed.contains(&d) => Err(format!(
                "DSCP {d} ({}) is not allowed by this server (allowed: {})",
                proto::dscp_name(d),
                allowed
                    .iter()
                    .map(|&a| proto::dscp_name(a))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            _ => Ok(()),
        }
    };
    let available = netio::available_cc();
    for f in &req.flows {
        dscp_ok(f.dscp)?;
        if let Some(cc) = &f.cc {
            if !available.split_whitespace().any(|a| a == cc) {
                return Err(format!(
                    "congestion control {:?} not available on the server (it has: {available})",
                    proto::printable(cc)
                ));
            }
        }
    }
    let mut pps = 0.0;
    for s in &req.streams {
        dscp_ok(s.dscp)?;
        if Duration::from_micros(s.interval_us.into()) < cfg.min_interval {
            return Err(format!(
                "probe interval {} us below this server's minimum of {} us",
                s.interval_us,
                cfg.min_interval.as_micros()
            ));
        }
        let min_len = if cfg.key.is_some() {
            proto::probe::MIN_SIGNED_LEN
        } else {
            proto::probe::HEADER_LEN
        };
        if (s.size as usize) < min_len || s.size as usize > proto::probe::MAX_LEN {
            return Err(format!(
                "probe stream {}: size {} out of range {min_len}..{}",
                s.id,
                s.size,
                proto::probe::MAX_LEN
            ));
        }
        pps += 1e6 / f64::from(s.interval_us.max(1));
    }
    if pps > f64::from(cfg.max_probe_pps) {
        return Err(format!(
            "{pps:.0} probe packets per second exceed this server's limit of {}",
            cfg.max_probe_pps
        ));
    }
    validate_udp_loads(req, cfg, &dscp_ok)
}

/// The UDP loads of a request (`test udp`) against the server's limits.
fn validate_udp_loads(
    req: &TestRequest,
    cfg: &crate::Config,
    dscp_ok: &dyn Fn(u8) -> Result<(), String>,
) -> Result<(), String> {
    use crate::udpload::{announced_packets, MAX_BUCKETS, MAX_PACKETS, MIN_BUCKET_US};
    if req.udp_loads.len() > MAX_UDP_LOADS {
        return Err(format!(
            "{} UDP loads exceed this server's limit of {MAX_UDP_LOADS}",
            req.udp_loads.len()
        ));
    }
    let mut ids = std::collections::HashSet::new();
    if !req.udp_loads.iter().all(|l| ids.insert(l.id)) {
        return Err("two UDP loads with the same id".into());
    }
    let duration = Duration::from_millis(req.duration_ms);
    let total_bps: u64 = req.udp_loads.iter().map(|l| l.rate_bps).sum();
    if total_bps > cfg.max_udp_bps {
        return Err(format!(
            "UDP load of {:.1} Mbit/s exceeds this server's limit of {:.1} Mbit/s",
            total_bps as f64 / 1e6,
            cfg.max_udp_bps as f64 / 1e6
        ));
    }
    if let Some(max) = cfg.max_rate_bytes.filter(|&m| total_bps as f64 / 8.0 > m) {
        return Err(format!(
            "UDP load of {:.1} Mbit/s exceeds this server's --max-rate of {:.1} Mbit/s",
            total_bps as f64 / 1e6,
            max * 8.0 / 1e6
        ));
    }
    let min_len = if cfg.key.is_some() {
        proto::probe::MIN_SIGNED_LEN
    } else {
        proto::probe::HEADER_LEN
    };
    for l in &req.udp_loads {
        dscp_ok(l.dscp)?;
        if (l.size as usize) < min_len || l.size as usize > proto::probe::MAX_LEN {
            return Err(format!(
                "UDP load {}: size {} out of range {min_len}..{}",
                l.id,
                l.size,
                proto::probe::MAX_LEN
            ));
        }
        if l.rate_bps == 0 {
            return Err(format!("UDP load {}: rate 0", l.id));
        }
        if l.bucket_us < MIN_BUCKET_US
            || duration.as_micros() as u64 / u64::from(l.bucket_us) > MAX_BUCKETS
        {
            return Err(format!(
                "UDP load {}: buckets of {} us over {} s: want at least \
                {MIN_BUCKET_US} us and at most {MAX_BUCKETS} \
                buckets",
                l.id,
                l.bucket_us,
                duration.as_secs()
            ));
        }
        let packets = announced_packets(l, duration);
        if packets > MAX_PACKETS {
            return Err(format!(
                "UDP load {}: {packets} packets exceed this server's limit of \
                {MAX_PACKETS} a test (larger packets or a shorter test)",
                l.id
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_proto::{Direction, FlowSpec, StreamSpec};

    fn req() -> TestRequest {
        TestRequest {
            test: "rrul".into(),
            duration_ms: 10_000,
            flows: vec![FlowSpec {
                id: 1,
                direction: Direction::Down,
                dscp: 46,
                cc: None,
            }],
            streams: vec![StreamSpec {
                id: 0,
                interval_us: 10_000,
                size: 64,
                dscp: 0,
                ecn: 0,
            }],
            connection_probes: false,
            udp_loads: Vec::new(),
            auth: None,
        }
    }

    #[test]
    fn every_refusal_names_its_limit() {
        let cfg = crate::Config::default();
        assert!(validate(&req(), &cfg).is_ok());
        let mut r = req();
        r.streams = (0..9)
            .map(|id| StreamSpec {
                id,
                interval_us: 10_000,
                size: 64,
                dscp: 0,
                ecn: 0,
            })
            .collect();
        assert_eq!(
            validate(&r, &cfg).unwrap_err(),
            "9 probe streams exceed this server's limit of 8"
        );
        let mut r = req();
        r.streams = (0..3)
            .map(|id| StreamSpec {
                id,
                interval_us: 1_000,
                size: 64,
                dscp: 0,
                ecn: 0,
            })
            .collect();
        assert_eq!(
            validate(&r, &cfg).unwrap_err(),
            "3000 probe packets per second exceed this server's limit of 2000"
        );
        let mut r = req();
        r.flows.push(r.flows[0].clone());
        assert_eq!(
            validate(&r, &cfg).unwrap_err(),
            "two flows with the same id"
        );
        let strict = crate::Config {
            allow_dscp: Some(vec![0, 8]),
            ..Default::default()
        };
        assert_eq!(
            validate(&req(), &strict).unwrap_err(),
            "DSCP 46 (EF) is not allowed by this server (allowed: BE, BK)"
        );
        let load = |rate_bps: u64, size: u16, bucket_us: u32| proto::UdpLoadSpec {
            id: 0,
            rate_bps,
            size,
            dscp: 0,
            ecn: 0,
            bucket_us,
        };
        let mut r = req();
        r.udp_loads = vec![load(100_000_000, 1024, 1000)];
        assert!(validate(&r, &cfg).is_ok());
        r.udp_loads = vec![load(2_000_000_000, 1024, 1000)];
        assert_eq!(
            validate(&r, &cfg).unwrap_err(),
            "UDP load of 2000.0 Mbit/s exceeds this server's limit of 1000.0 Mbit/s"
        );
        r.udp_loads = vec![load(1_000_000, 1024, 10)];
        assert!(validate(&r, &cfg)
            .unwrap_err()
            .contains("want at least 100 us"));
        r.udp_loads = vec![load(1_000_000_000, 64, 1000)];
        r.duration_ms = 180_000;
        assert!(
            validate(&r, &cfg)
                .unwrap_err()
                .contains("packets exceed this server's limit of 16777216"),
            "1 Gbit/s of 64-byte packets for 3 minutes"
        );
        let capped = crate::Config {
            max_rate_bytes: Some(1e6),
            ..Default::default()
        };
        r.udp_loads = vec![load(10_000_000, 1024, 1000)];
        r.duration_ms = 10_000;
        assert_eq!(
            validate(&r, &capped).unwrap_err(),
            "UDP load of 10.0 Mbit/s exceeds this server's --max-rate of 8.0 Mbit/s"
        );
        let keyed = crate::Config {
            key: Some(vec![0; 16]),
            ..Default::default()
        };
        assert_eq!(
            validate(&req(), &keyed).unwrap_err(),
            "probe stream 0: size 64 out of range 72..1472",
            "a signed probe needs room for its MAC"
        );
    }
}
