//! `test marks`: UDP probes to a bloatlab server, each sent with one DSCP and ECN code point and
//! asking for its reply to carry the same; the server says what TOS each request arrived with,
//! this host reads what each reply arrived with (IP_RECVTOS / IPV6_RECVTCLASS). Then a TCP
//! connection per DSCP, whose SYN's marks the server's kernel kept (the way out). What became
//! of each mark each way is `analyze::marks`'.

use crate::control::Control;
use crate::run::{Ended, Outcome, RunOptions};
use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_netio::icmp;
use bloatlab_proto::probe::{self, Kind, Marks, Probe};
use bloatlab_proto::{StreamSpec, TestRequest};
use bloatlab_result::marks::{HopSeen, MarkHop, MarkProbe};
use bloatlab_result::{self as result, Event, Host, Metadata, Phase, ResultFile, Summary};
use bloatlab_units::marks::{parse_dscp, parse_ecn, tos};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The DSCPs that matter to the fixes bloatlab recommends: best effort and bulk, the AF
/// classes, CAKE's and Wi-Fi's voice and video (CS5, EF, VA), network control (CS6).
pub const DEFAULT_DSCPS: &str = "CS0,CS1,AF11,AF21,AF31,AF41,CS5,EF,CS6,VA";
/// Every ECN code point (RFC 3168).
pub const DEFAULT_ECNS: &str = "not-ect,ect0,ect1,ce";

#[derive(Clone, Debug)]
pub struct MarksParams {
    /// DSCPs to send, each with every code point of `ecns`.
    pub dscps: Vec<u8>,
    pub ecns: Vec<u8>,
    /// Probes of each code point.
    pub rounds: u32,
    /// Time between two probes (of any code point).
    pub interval: Duration,
    /// Then walk the path with TTL-limited probes of the marks that changed on the way out.
    pub locate: bool,
}

impl MarksParams {
    /// From comma-separated lists of names; an unknown name is one line naming it.
    pub fn parse(
        dscps: &str,
        ecns: &str,
        rounds: u32,
        locate: bool,
    ) -> Result<MarksParams, String> {
        let list = |s: &str, f: fn(&str) -> Result<u8, String>| -> Result<Vec<u8>, String> {
            let mut v = Vec::new();
            for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let x = f(name)?;
                if !v.contains(&x) {
                    v.push(x);
                }
            }
            Ok(v)
        };
        let (dscps, ecns) = (list(dscps, parse_dscp)?, list(ecns, parse_ecn)?);
        if dscps.is_empty() || ecns.is_empty() {
            return Err("--dscp and --ecn each need at least one code point".into());
        }
        if !(1..=100).contains(&rounds) {
            return Err(format!("--rounds {rounds}: want 1..100"));
        }
        Ok(MarksParams {
            dscps,
            ecns,
            rounds,
            interval: Duration::from_millis(10),
            locate,
        })
    }

    /// Every code point, in the order they are sent in each round.
    fn codepoints(&self) -> Vec<u8> {
        let mut v = Vec::new();
        for &d in &self.dscps {
            for &e in &self.ecns {
                v.push(tos(d, e));
            }
        }
        v
    }
}

/// How long replies are awaited after the last probe: a bloated queue can hold a second.
const LAST_REPLY_WAIT: Duration = Duration::from_secs(2);

struct Sent {
    t1: Instant,
    probe: MarkProbe,
}

pub fn run(host: &str, mp: &MarksParams, opts: &RunOptions) -> Result<Outcome, MeasureError> {
    let addrs = crate::run::resolve(host)?;
    let codepoints = mp.codepoints();
    let total = codepoints.len() * mp.rounds as usize;
    let key = opts.key.as_deref();
    // The marks fields, beside a MAC when signed.
    let size = probe::HEADER_LEN
        + probe::MARKS_LEN
        + if key.is_some() {
            bloatlab_proto::auth::PROBE_MAC_LEN
        } else {
            0
        };
    let request = TestRequest {
        test: "marks".into(),
        duration_ms: (mp.interval * total as u32 + LAST_REPLY_WAIT).as_millis() as u64 + 1000,
        flows: Vec::new(),
        streams: vec![StreamSpec {
            id: 0,
            interval_us: mp.interval.as_micros() as u32,
            size: size as u16,
            dscp: 0,
            ecn: 0,
        }],
        // One per DSCP, for TCP's SYNs.
        connection_probes: true,
        udp_loads: Vec::new(),
        auth: None,
    };
    let control = Control::open(&addrs, request, key)?;
    let path = opts
        .output
        .clone()
        .unwrap_or_else(|| crate::run::default_output("marks"));
    let server = Host {
        name: host.into(),
        address: Some(control.addr.to_string()),
        software: format!("bloatlab {}", control.server.version),
        ..Default::default()
    };
    let params = |probes: &[Sent]| {
        serde_json::json!({
            "host": host,
            "dscps": mp.dscps,
            "ecns": mp.ecns,
            "rounds": mp.rounds,
            "interval_ms": mp.interval.as_secs_f64() * 1e3,
            "probes": probes.iter().map(|s| &s.probe).collect::<Vec<_>>(),
        })
    };
    let meta = crate::run::local_metadata("marks", params(&[]), server);
    // The file exists from the first moment, so even an immediate kill leaves something readable.
    result::write_atomic(&path, &ResultFile::new(meta.clone()))?;

    let server_addr = control.addr;
    let sock = socket(server_addr)?;
    let t0 = Instant::now();
    let mut sent: Vec<Sent> = Vec::with_capacity(total);
    let mut buf = vec![0u8; probe::MAX_LEN + 1];
    let mut ended = Ended::Complete;
    let mut refusals: Vec<String> = Vec::new();
    'rounds: for _ in 0..mp.rounds {
        for &cp in &codepoints {
            if opts.stop.load(Ordering::Relaxed) {
                ended = Ended::Interrupted;
                break 'rounds;
            }
            if control.server_gone() {
                ended = Ended::ServerLost("the server closed the test".into());
                break 'rounds;
            }
            let due = t0 + mp.interval * sent.len() as u32;
            receive_until(&sock, &mut buf, &mut sent, &control, key, due)?;
            match netio::apply_tos(socket2::SockRef::from(&sock), cp, &control.addr) {
                Ok(a) if a == cp => {}
                other => {
                    let why = format!(
                        "this host could not send {}: {}",
                        bloatlab_units::marks::tos_name(cp),
                        match other {
                            Ok(a) => format!("the socket carries {a:#04x}"),
                            Err(e) => e.to_string(),
                        }
                    );
                    if !refusals.contains(&why) {
                        refusals.push(why);
                    }
                }
            }
            send(
                &sock,
                &mut buf[..size],
                &control,
                key,
                cp,
                sent.len() as u32,
            )
            .map_err(MeasureError::io("sending a probe"))?;
            sent.push(Sent {
                t1: Instant::now(),
                probe: MarkProbe {
                    t: t0.elapsed().as_secs_f64(),
                    sent: cp,
                    rtt_ms: None,
                    request_arrived: None,
                    reply_sent: None,
                    reply_arrived: None,
                },
            });
            if opts.progress != crate::display::ProgressMode::Quiet && sent.len().is_multiple_of(40)
            {
                eprintln!("marks: {} of {total} probes sent", sent.len());
            }
        }
    }
    if ended == Ended::Complete {
        let last = Instant::now() + LAST_REPLY_WAIT;
        while Instant::now() < last
            && sent.iter().any(|s| s.probe.rtt_ms.is_none())
            && !opts.stop.load(Ordering::Relaxed)
        {
            let until = (Instant::now() + Duration::from_millis(100)).min(last);
            receive_until(&sock, &mut buf, &mut sent, &control, key, until)?;
        }
    }
    let syns: Vec<(u8, Option<u8>)> = if ended == Ended::Complete {
        mp.dscps
            .iter()
            .map(|&d| (d << 2, tcp_syn(server_addr, control.token, d)))
            .collect()
    } else {
        Vec::new()
    };
    let end_t = t0.elapsed().as_secs_f64();
    let server_received = if matches!(ended, Ended::ServerLost(_)) {
        None
    } else {
        control
            .finish(Duration::from_secs(3))
            .and_then(|r| r.streams.iter().find(|s| s.id == 0).map(|s| s.received))
    };
    let probes: Vec<MarkProbe> = sent.iter().map(|s| s.probe.clone()).collect();
    let mut marks = bloatlab_analyze::marks::report(&probes, server_received);
    bloatlab_analyze::marks::add_tcp(&mut marks, &syns);
    let mut notes: Vec<String> = Vec::new();
    if mp.locate && ended == Ended::Complete {
        // The walk may take ten seconds: a kill meanwhile keeps the probes' file.
        let mut snapshot = ResultFile::new(Metadata {
            params: params(&sent),
            ..meta.clone()
        });
        snapshot.summary = Some(Summary {
            test: "marks".into(),
            partial: true,
            marks: Some(marks.clone()),
            ..Default::default()
        });
        result::write_atomic(&path, &snapshot)?;
        let walk = bloatlab_analyze::marks::to_locate(&marks.up);
        if walk.is_empty() {
            notes.push(
                "--locate: every mark arrived at the server as sent, so there is nothing to \
                 locate on the way out (TTL-limited probes cannot walk the way in)"
                    .into(),
            );
        } else {
            match walk_hops(server_addr.ip().to_canonical(), &walk, opts) {
                Ok(hops) => bloatlab_analyze::marks::locate(&mut marks, hops),
                Err(e) => notes.push(format!("--locate: {e}")),
            }
            if opts.stop.load(Ordering::Relaxed) {
                ended = Ended::Interrupted;
            }
        }
    }
    let mut r = ResultFile::new(Metadata {
        params: params(&sent),
        phases: vec![Phase {
            name: "probes".into(),
            start: 0.0,
            end: end_t,
        }],
        ..meta
    });
    r.partial = ended != Ended::Complete;
    for why in refusals.into_iter().chain(notes) {
        r.events.push(Event {
            t: end_t,
            what: why,
        });
    }
    match &ended {
        Ended::Interrupted => r.events.push(Event {
            t: end_t,
            what: if probes.len() == total {
                "interrupted by the user during --locate's walk: the hops it reached are kept"
                    .into()
            } else {
                format!(
                    "interrupted by the user after {} of {total} probes",
                    probes.len()
                )
            },
        }),
        Ended::ServerLost(why) => r.events.push(Event {
            t: end_t,
            what: why.clone(),
        }),
        _ => {}
    }
    r.summary = Some(Summary {
        test: "marks".into(),
        partial: r.partial,
        marks: Some(marks),
        ..Default::default()
    });
    result::write_atomic(&path, &r)?;
    Ok(Outcome {
        result: r,
        path,
        ended,
    })
}

/// A TCP connection whose SYN carries `dscp`, opened as a new-connection probe: the TOS the
/// server's kernel saw that SYN arrive with (`None`: no answer, or a server that does not say).
fn tcp_syn(addr: SocketAddr, token: bloatlab_proto::Token, dscp: u8) -> Option<u8> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None).ok()?;
    netio::apply_dscp(socket2::SockRef::from(&s), dscp, &addr).ok()?;
    s.connect_timeout(&addr.into(), crate::control::CONNECT_TIMEOUT)
        .ok()?;
    crate::connprobe::probe_hello(s.into(), token)?
}

/// Highest TTL the walk tries; it ends earlier at the destination's Port Unreachable.
const MAX_HOPS: u8 = 30;
/// Rounds of the walk, a second apart: routers answer a burst of a few probes, then about one
/// a second (Linux's `icmp_ratelimit`), so the unanswered ones are sent again.
const WALK_ROUNDS: u32 = 10;
/// Destination ports of the walk's probes: traceroute's, one per (hop, code point).
const WALK_PORT: u16 = 33434;

/// Sends each code point in `cps` with every TTL up to the destination and reads what each
/// hop's ICMP error quotes of it (a raw socket: root).
fn walk_hops(dest: IpAddr, cps: &[u8], opts: &RunOptions) -> Result<Vec<MarkHop>, String> {
    let quotes = icmp::QuoteSocket::open(dest.is_ipv6()).map_err(|e| e.to_string())?;
    let bind: SocketAddr = if dest.is_ipv6() {
        "[::]:0".parse().unwrap()
    } else {
        "0.0.0.0:0".parse().unwrap()
    };
    let sock = UdpSocket::bind(bind).map_err(|e| format!("UDP socket: {e}"))?;
    let sport = sock.local_addr().map_err(|e| e.to_string())?.port();
    let n = cps.len();
    // (hop, index in cps) -> (who answered, TOS it quoted, from the destination)
    let mut seen: std::collections::BTreeMap<(u8, usize), (IpAddr, u8, bool)> = Default::default();
    let mut dest_hop = MAX_HOPS;
    for round in 0..WALK_ROUNDS {
        if opts.stop.load(Ordering::Relaxed) {
            break;
        }
        let mut sent = 0;
        for (i, &cp) in cps.iter().enumerate() {
            netio::apply_tos(socket2::SockRef::from(&sock), cp, &SocketAddr::new(dest, 0))
                .map_err(|e| format!("marking a probe: {e}"))?;
            for hop in 1..=dest_hop {
                if seen.contains_key(&(hop, i)) {
                    continue;
                }
                icmp::set_hop_limit(&sock, hop).map_err(|e| format!("TTL: {e}"))?;
                let port = WALK_PORT + (hop as usize - 1) as u16 * n as u16 + i as u16;
                // A send refused by a pending ICMP error of an earlier probe is sent next round.
                if sock.send_to(&[0u8; 8], SocketAddr::new(dest, port)).is_ok() {
                    sent += 1;
                }
            }
        }
        if sent == 0 {
            break;
        }
        if opts.progress != crate::display::ProgressMode::Quiet {
            eprintln!(
                "marks --locate: round {}: {sent} TTL-limited probes",
                round + 1
            );
        }
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            netio::wait_readable(
                quotes.socket(),
                until.saturating_duration_since(Instant::now()),
            );
            while let Some(q) = quotes
                .recv()
                .map_err(|e| format!("reading ICMP errors: {e}"))?
            {
                let Some(k) = q.dport.checked_sub(WALK_PORT).map(usize::from) else {
                    continue;
                };
                if q.sport != sport || k >= MAX_HOPS as usize * n {
                    continue;
                }
                let (hop, i) = ((k / n) as u8 + 1, k % n);
                if !q.time_exceeded {
                    dest_hop = dest_hop.min(hop);
                }
                seen.entry((hop, i))
                    .or_insert((q.from, q.tos, !q.time_exceeded));
            }
            // Every hop up to the destination answered for every code point: the next round
            // sends nothing and ends the walk.
            if (1..=dest_hop).all(|h| (0..n).all(|i| seen.contains_key(&(h, i)))) {
                break;
            }
        }
    }
    let hops = (1..=dest_hop)
        .filter_map(|hop| {
            let answers: Vec<(usize, &(IpAddr, u8, bool))> = (0..n)
                .filter_map(|i| seen.get(&(hop, i)).map(|a| (i, a)))
                .collect();
            let first = answers.first()?;
            Some(MarkHop {
                hop,
                from: Some(first.1 .0.to_canonical().to_string()),
                destination: answers.iter().any(|a| a.1 .2),
                seen: answers
                    .iter()
                    .map(|(i, a)| HopSeen {
                        sent: cps[*i],
                        arrived: a.1,
                    })
                    .collect(),
            })
        })
        .collect();
    Ok(hops)
}

/// A UDP socket connected to the server that reads the TOS of what arrives (its own marks
/// are set per probe).
fn socket(addr: SocketAddr) -> Result<UdpSocket, MeasureError> {
    let (sock, _, _) = crate::probe::socket(addr, 0, 0)?;
    netio::udp::enable_recv_tos(&sock)
        .map_err(MeasureError::io("asking for the TOS of arriving packets"))?;
    Ok(sock)
}

fn send(
    sock: &UdpSocket,
    buf: &mut [u8],
    control: &Control,
    key: Option<&[u8]>,
    tos: u8,
    seq: u32,
) -> std::io::Result<()> {
    let p = Probe {
        kind: Kind::Request,
        stream: 0,
        token: control.token,
        seq,
        client_send_ns: netio::mono_ns(),
        server_recv_ns: 0,
        server_send_ns: 0,
        server_rx_count: 0,
        flags: probe::FLAG_MARKS | if key.is_some() { probe::FLAG_MAC } else { 0 },
    };
    buf.fill(0);
    p.encode(buf).map_err(std::io::Error::other)?;
    let marks = Marks {
        reply_tos: tos,
        request_tos: None,
        answered: false,
    };
    marks.write(buf, key.is_some());
    if let Some(k) = key {
        bloatlab_proto::auth::sign_probe(k, buf);
    }
    sock.send(buf).map(|_| ())
}

/// Takes the replies that arrive until `until`.
fn receive_until(
    sock: &UdpSocket,
    buf: &mut [u8],
    sent: &mut [Sent],
    control: &Control,
    key: Option<&[u8]>,
    until: Instant,
) -> Result<(), MeasureError> {
    loop {
        while let Some((n, _, arrived)) = netio::udp::recv_from_tos(sock, buf)
            .or_else(|e| {
                // A port unreachable from an earlier probe: the next read goes on.
                if e.kind() == std::io::ErrorKind::ConnectionRefused {
                    Ok(None)
                } else {
                    Err(e)
                }
            })
            .map_err(MeasureError::io("reading replies"))?
        {
            take_reply(&buf[..n], arrived, sent, control, key);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        netio::wait_readable(sock, left);
    }
}

/// Logs `datagram`, which arrived with TOS `arrived`, as the reply to its request if it is
/// one of ours (the right token, stream, send time and, with a key, MAC).
fn take_reply(
    datagram: &[u8],
    arrived: Option<u8>,
    sent: &mut [Sent],
    control: &Control,
    key: Option<&[u8]>,
) {
    let Ok(p) = Probe::decode(datagram) else {
        return;
    };
    if p.kind != Kind::Reply || p.token != control.token || p.stream != 0 {
        return;
    }
    if let Some(k) = key {
        if p.flags & probe::FLAG_MAC == 0 || !bloatlab_proto::auth::probe_signed(k, datagram) {
            return;
        }
    }
    let Some(s) = sent.get_mut(p.seq as usize) else {
        return;
    };
    if s.probe.rtt_ms.is_some() {
        return;
    }
    s.probe.rtt_ms = Some(s.t1.elapsed().as_secs_f64() * 1e3);
    s.probe.reply_arrived = arrived;
    // An older server echoes the marks fields as they came: not answered, and its reply went
    // out with the stream's mark (CS0), not the one asked for.
    if let Some(m) = (p.flags & probe::FLAG_MARKS != 0)
        .then(|| Marks::read(datagram, key.is_some()))
        .flatten()
        .filter(|m| m.answered)
    {
        s.probe.request_arrived = m.request_tos;
        s.probe.reply_sent = Some(m.reply_tos);
    }
}
