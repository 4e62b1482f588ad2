//! `test mtu`: the path MTU by Don't-Fragment ICMP echo probes (a binary search between a size
//! that passes and the route's MTU), and black holes: large packets lost with no "fragmentation
//! needed" / "packet too big" to say why. The search is pure ([`Search`]); the shell sends the
//! probes from an unprivileged ping socket and reads its error queue.

use crate::run::{Ended, Outcome, RunOptions};
use crate::MeasureError;
use bloatlab_netio::icmp;
use bloatlab_result::{
    self as result, Event, Host, Metadata, MtuAdvice, Phase, ResultFile, Summary,
};
use serde::Serialize;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// What became of one probe size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "mtu")]
pub enum Probe {
    /// An echo reply came back: the size passes.
    Reply,
    /// A router said it is too big for its next hop, naming that hop's MTU.
    TooBig(u32),
    /// This host's own route refused it (EMSGSIZE), with the route's MTU.
    TooBigHere(u32),
    /// Neither a reply nor an error, however often it was sent.
    Lost,
}

/// The binary search over IP packet sizes: `ok` is the largest size known to pass, `bad` the
/// smallest known not to.
#[derive(Clone, Debug, PartialEq)]
pub struct Search {
    ok: u32,
    bad: u32,
    /// A size an ICMP error named, to try next.
    hint: Option<u32>,
    /// Sizes above the answer that were lost without a word, and whether any router spoke.
    lost_silently: bool,
    router_said_too_big: bool,
}

impl Search {
    /// `ok`: a size that passed; `max`: the largest worth trying (the route's MTU).
    pub fn new(ok: u32, max: u32) -> Search {
        Search {
            ok,
            bad: max + 1,
            hint: Some(max),
            lost_silently: false,
            router_said_too_big: false,
        }
    }

    /// The next size to probe, or `None` when the answer is known.
    pub fn next(&self) -> Option<u32> {
        if self.bad <= self.ok + 1 {
            return None;
        }
        match self.hint.filter(|h| *h > self.ok && *h < self.bad) {
            Some(h) => Some(h),
            None => Some(self.ok + (self.bad - self.ok) / 2),
        }
    }

    pub fn record(&mut self, size: u32, p: Probe) {
        self.hint = None;
        match p {
            Probe::Reply => self.ok = self.ok.max(size),
            Probe::TooBig(m) | Probe::TooBigHere(m) => {
                self.router_said_too_big |= matches!(p, Probe::TooBig(_));
                // Nothing above the MTU it named passes that hop either.
                self.bad = self.bad.min(size).min(if m < size { m + 1 } else { size });
                // The named MTU is the next thing to try (when it is news).
                self.hint = Some(m);
            }
            Probe::Lost => {
                self.bad = self.bad.min(size);
                self.lost_silently = true;
            }
        }
    }

    pub fn path_mtu(&self) -> u32 {
        self.ok
    }

    /// Large packets vanished and no router ever said they were too big.
    pub fn blackhole(&self) -> bool {
        self.lost_silently && !self.router_said_too_big
    }
}

/// What the path MTU means for TCP and for tunnels over this path.
pub fn advice(path_mtu: u32, v6: bool, blackhole: bool) -> MtuAdvice {
    let (ip, udp) = if v6 { (40, 8) } else { (20, 8) };
    let tcp_mss = path_mtu.saturating_sub(ip + 20);
    let mssfix = path_mtu.saturating_sub(ip + udp);
    // WireGuard adds 32 bytes (header 16, tag 16) to the inner packet, inside UDP and IP.
    let wireguard_mtu = path_mtu.saturating_sub(ip + udp + 32);
    let mut lines = vec![
        format!(
            "TCP over this path: MSS {tcp_mss} ({path_mtu} less {} of IP and TCP \
            headers)",
            ip + 20
        ),
        format!(
            "OpenVPN over UDP: mssfix {mssfix} (2.4: the largest UDP payload it sends) or \
            `mssfix {path_mtu} mtu` (2.6: the whole packet)"
        ),
        format!(
            "WireGuard: MTU = {wireguard_mtu} ({path_mtu} less {} of IP, UDP and WireGuard \
            headers)",
            ip + udp + 32
        ),
    ];
    if blackhole {
        lines.push(format!(
            "black hole: packets over {path_mtu} bytes vanish and no router says why, so TCP's \
                path MTU discovery stalls: clamp the MSS where traffic enters this path (iptables \
                -t mangle -A FORWARD -p tcp --tcp-flags SYN,RST SYN -j TCPMSS --set-mss \
                {tcp_mss}), set the tunnel MTUs above, or turn on net.ipv4.tcp_mtu_probing = 1 at \
                the hosts"
        ));
    }
    MtuAdvice {
        tcp_mss,
        openvpn_mssfix: mssfix,
        wireguard_mtu,
        lines,
    }
}

/// Smallest size probed first: a path that drops it is down, not narrow.
const SMALL: u32 = 128;
const TRIES: u32 = 3;

#[derive(Clone, Debug, Serialize)]
struct ProbeRec {
    size: u32,
    #[serde(flatten)]
    probe: Probe,
    /// Round trip of the reply, ms.
    rtt_ms: Option<f64>,
    /// Seconds from the start.
    t: f64,
}

/// Sends echo probes of one size (up to `TRIES`), each awaited up to `wait`.
fn probe_size(
    sock: &std::net::UdpSocket,
    dest: IpAddr,
    size: u32,
    seq: &mut u16,
    wait: Duration,
) -> Result<(Probe, Option<f64>), MeasureError> {
    let v6 = dest.is_ipv6();
    let ip_header = if v6 { 40 } else { 20 };
    for _ in 0..TRIES {
        *seq = seq.wrapping_add(1);
        let req = icmp::echo_request(v6, *seq, (size - ip_header) as usize);
        let sent = Instant::now();
        if let Err(e) = sock.send_to(&req, SocketAddr::new(dest, 0)) {
            if icmp::too_big(&e) {
                return Ok((
                    Probe::TooBigHere(icmp::route_mtu(dest).unwrap_or(size - 1)),
                    None,
                ));
            }
            return Err(MeasureError::io(format!("sending a {size}-byte probe"))(e));
        }
        while sent.elapsed() < wait {
            icmp::wait_error(
                sock,
                wait.saturating_sub(sent.elapsed())
                    .min(Duration::from_millis(20)),
                true,
            );
            while let Some(e) =
                icmp::recv_error(sock).map_err(MeasureError::io("reading ICMP errors"))?
            {
                let quoted_seq = (e.payload.len() >= 8)
                    .then(|| u16::from_be_bytes([e.payload[6], e.payload[7]]));
                if let (icmp::IcmpKind::TooBig(m), Some(q)) = (e.kind, quoted_seq) {
                    if q == *seq {
                        // A local error names no offender.
                        return Ok((
                            if e.from.is_none() {
                                Probe::TooBigHere(m)
                            } else {
                                Probe::TooBig(m)
                            },
                            None,
                        ));
                    }
                }
            }
            while let Some(r) =
                icmp::recv_echo_reply(sock).map_err(MeasureError::io("reading echo replies"))?
            {
                if r.seq == *seq {
                    return Ok((Probe::Reply, Some(sent.elapsed().as_secs_f64() * 1e3)));
                }
            }
        }
    }
    Ok((Probe::Lost, None))
}

/// Runs the search against `host` (a name or an address; no bloatlab server needed: ICMP echo).
pub fn run(host: &str, want_v6: Option<bool>, opts: &RunOptions) -> Result<Outcome, MeasureError> {
    let name = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<IpAddr> = (name, 0)
        .to_socket_addrs()
        .map_err(|e| MeasureError::Resolve {
            host: host.into(),
            why: e.to_string(),
        })?
        .map(|a| a.ip())
        .collect();
    let dest = addrs
        .iter()
        .copied()
        .find(|a| want_v6.is_none_or(|v6| a.is_ipv6() == v6))
        .ok_or_else(|| MeasureError::Resolve {
            host: host.into(),
            why: "no address of the asked family".into(),
        })?;
    let v6 = dest.is_ipv6();
    let sock = icmp::ping_socket(v6).map_err(MeasureError::io("ICMP echo socket"))?;
    icmp::enable_errors(&sock).map_err(MeasureError::io("ICMP errors"))?;
    icmp::probe_mtu(&sock).map_err(MeasureError::io("Don't Fragment"))?;
    let route = icmp::route_mtu(dest)
        .map_err(MeasureError::io(format!("route to {dest}")))?
        .min(65_535);
    let path = opts
        .output
        .clone()
        .unwrap_or_else(|| crate::run::default_output("mtu"));
    let t0 = Instant::now();
    let mut seq = 0u16;
    let mut recs = Vec::new();
    // The base: a small probe must pass, and its round trip sets how long to wait for others.
    let (base, rtt) = probe_size(&sock, dest, SMALL, &mut seq, Duration::from_secs(2))?;
    recs.push(ProbeRec {
        size: SMALL,
        probe: base,
        rtt_ms: rtt,
        t: 0.0,
    });
    let Some(rtt) = rtt else {
        return Err(MeasureError::Io {
            what: format!("{dest}"),
            source: std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no echo reply to a small probe: the host is down or drops ICMP echo",
            ),
        });
    };
    let wait = Duration::from_secs_f64((rtt * 4.0 / 1e3).clamp(0.2, 1.0));
    let mut search = Search::new(SMALL, route);
    let mut ended = Ended::Complete;
    while let Some(size) = search.next() {
        if opts.stop.load(Ordering::Relaxed) {
            ended = Ended::Interrupted;
            break;
        }
        let (p, rtt) = probe_size(&sock, dest, size, &mut seq, wait)?;
        if opts.progress != crate::display::ProgressMode::Quiet {
            eprintln!("mtu: {size} bytes: {p:?}");
        }
        recs.push(ProbeRec {
            size,
            probe: p,
            rtt_ms: rtt,
            t: t0.elapsed().as_secs_f64(),
        });
        search.record(size, p);
    }
    let mtu = search.path_mtu();
    let blackhole = search.blackhole();
    let params = serde_json::json!({
        "host": host,
        "address": dest.to_string(),
        "route_mtu": route,
        "wait_ms": wait.as_secs_f64() * 1e3,
        "probes": recs,
    });
    let server = Host {
        name: host.into(),
        address: Some(dest.to_string()),
        software: "ICMP echo".into(),
        ..Default::default()
    };
    let meta = Metadata {
        phases: vec![Phase {
            name: "search".into(),
            start: 0.0,
            end: t0.elapsed().as_secs_f64(),
        }],
        ..crate::run::local_metadata("mtu", params, server)
    };
    let mut r = ResultFile::new(meta);
    r.partial = ended != Ended::Complete;
    r.summary = Some(Summary {
        test: "mtu".into(),
        partial: r.partial,
        path_mtu: Some(mtu),
        blackhole: Some(blackhole),
        advice: Some(advice(mtu, v6, blackhole)),
        ..Default::default()
    });
    if ended == Ended::Interrupted {
        r.events.push(Event {
            t: t0.elapsed().as_secs_f64(),
            what: format!("interrupted by the user: {mtu} passes, larger sizes were not all tried"),
        });
    }
    result::write_atomic(&path, &r)?;
    Ok(Outcome {
        result: r,
        path,
        ended,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path that answers like `f` does for each size; returns the search's probes.
    fn walk(route: u32, f: impl Fn(u32) -> Probe) -> (Search, Vec<u32>) {
        let mut s = Search::new(SMALL, route);
        let mut tried = Vec::new();
        while let Some(size) = s.next() {
            tried.push(size);
            s.record(size, f(size));
            assert!(tried.len() < 40, "the search ends");
        }
        (s, tried)
    }

    #[test]
    fn a_router_naming_its_mtu_ends_the_search_in_two_probes() {
        let (s, tried) = walk(1500, |n| {
            if n <= 1400 {
                Probe::Reply
            } else {
                Probe::TooBig(1400)
            }
        });
        assert_eq!((s.path_mtu(), s.blackhole()), (1400, false));
        assert_eq!(tried, [1500, 1400]);
    }

    #[test]
    fn silence_above_the_mtu_is_a_black_hole_found_by_bisection() {
        let (s, tried) = walk(1500, |n| if n <= 1300 { Probe::Reply } else { Probe::Lost });
        assert_eq!((s.path_mtu(), s.blackhole()), (1300, true));
        // 128..1501 halved: about log2(1373) = 11 probes.
        assert!(tried.len() <= 12, "{tried:?}");
        let (open, _) = walk(1500, |_| Probe::Reply);
        assert_eq!((open.path_mtu(), open.blackhole()), (1500, false));
    }

    #[test]
    fn advice_follows_the_headers() {
        let a = advice(1500, false, false);
        assert_eq!(
            (a.tcp_mss, a.openvpn_mssfix, a.wireguard_mtu),
            (1460, 1472, 1440)
        );
        assert_eq!(
            advice(1500, true, false).wireguard_mtu,
            1420,
            "WireGuard's own default, for an IPv6 outer path"
        );
        assert!(advice(1400, false, true)
            .lines
            .last()
            .unwrap()
            .contains("--set-mss 1360"));
    }
}
