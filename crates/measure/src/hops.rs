//! Probes every hop of a path with TTL-limited UDP datagrams while a test loads it: the
//! routers' Time Exceeded answers (and the destination's Port Unreachable) give each hop's
//! round trip. Each hop is probed once per `interval`, the hops' probes spread evenly over it:
//! routers limit the ICMP errors they send to one host (Linux: one per second, bursts of 6,
//! `net.ipv4.icmp_ratelimit`), so probing a hop faster only buys unanswered probes.

use bloatlab_netio::icmp::{self, IcmpKind};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

/// Destination ports of the UDP probes: traceroute's range, one port per probe in flight
/// (ICMP probes use the same numbers as echo sequence numbers).
const FIRST_PORT: u16 = 33434;
const PORTS: u16 = 1024;
/// Datagram payload (bytes): small enough to cost nothing, as traceroute's.
const PAYLOAD: usize = 32;

#[derive(Clone, Debug)]
pub struct HopConfig {
    pub target: IpAddr,
    /// Highest TTL probed until the destination answers.
    pub max_hops: u8,
    /// Time between two probes of the same hop.
    pub interval: Duration,
    /// A probe unanswered this long is lost (a bloated queue can hold seconds).
    pub timeout: Duration,
    /// ICMP echo requests on an unprivileged ping socket instead of UDP datagrams, for paths
    /// that filter UDP to high ports (needs `net.ipv4.ping_group_range` to admit the user).
    pub icmp: bool,
}

impl HopConfig {
    pub fn new(target: IpAddr) -> HopConfig {
        HopConfig {
            target,
            max_hops: 30,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            icmp: false,
        }
    }
}

pub use bloatlab_result::locate::HopProbe;

pub struct HopProber {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<io::Result<Vec<HopProbe>>>,
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl HopProber {
    /// Opens the socket (errors here are the caller's to report) and starts probing.
    pub fn start(cfg: HopConfig) -> io::Result<HopProber> {
        let sock = if cfg.icmp {
            icmp::ping_socket(cfg.target.is_ipv6()).map_err(|e| {
                io::Error::new(e.kind(), format!("{e}; or use the default UDP probes"))
            })?
        } else {
            let bind: SocketAddr = if cfg.target.is_ipv6() {
                "[::]:0".parse().unwrap()
            } else {
                "0.0.0.0:0".parse().unwrap()
            };
            UdpSocket::bind(bind)?
        };
        icmp::enable_errors(&sock)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hop-prober".into())
            .spawn(move || probe_loop(&sock, &cfg, &flag))?;
        Ok(HopProber { stop, thread })
    }

    /// Stops sending, waits for the answers still due (at most `grace`), returns every probe.
    pub fn finish(self) -> io::Result<Vec<HopProbe>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("hop prober panicked")))
    }
}

/// The next TTL to probe: 1..=last round robin, where `last` is the destination's TTL once
/// known (the lowest TTL that reached it), else `max_hops`.
fn hops_to_probe(cfg: &HopConfig, reached_at: Option<u8>) -> u8 {
    reached_at.unwrap_or(cfg.max_hops).max(1)
}

fn probe_loop(sock: &UdpSocket, cfg: &HopConfig, stop: &AtomicBool) -> io::Result<Vec<HopProbe>> {
    let mut probes: Vec<HopProbe> = Vec::new();
    // Port -> index of the probe in flight on it.
    let mut in_flight: HashMap<u16, (usize, Instant)> = HashMap::new();
    let mut reached_at: Option<u8> = None;
    let mut seq: u64 = 0;
    let mut ttl: u8 = 1;
    let mut next_send = Instant::now();
    let mut stop_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if stop_at.is_none() && stop.load(Ordering::Relaxed) {
            // Answers to the last probes may still be queued behind a bloated buffer, but
            // the load ended with the last test's 2 s settle: with 1 s more, a queue of up to
            // 3 s has drained (waiting 3 s more cost every locate 3 s, since a rate-limited
            // router leaves some probes unanswered for good).
            stop_at = Some(now + cfg.timeout.min(Duration::from_secs(1)));
        }
        if stop_at.is_some_and(|s| now >= s || in_flight.is_empty()) {
            break;
        }
        if stop_at.is_none() && now >= next_send {
            // A probe's key: its UDP port's offset, or its echo sequence number.
            let key = (seq % PORTS as u64) as u16;
            seq += 1;
            in_flight.remove(&key);
            icmp::set_hop_limit(sock, ttl)?;
            let sent = SystemTime::now();
            let (dest, datagram) = if cfg.icmp {
                (
                    SocketAddr::new(cfg.target, 0),
                    icmp::echo_request(cfg.target.is_ipv6(), key, PAYLOAD),
                )
            } else {
                (
                    SocketAddr::new(cfg.target, FIRST_PORT + key),
                    vec![0u8; PAYLOAD],
                )
            };
            // An earlier ICMP error is also reported once on the next send; send again then.
            if sock.send_to(&datagram, dest).is_err() {
                let _ = sock.send_to(&datagram, dest);
            }
            in_flight.insert(key, (probes.len(), now));
            probes.push(HopProbe {
                ttl,
                sent_unix: unix(sent),
                rtt_ms: None,
                from: None,
                reached: false,
            });
            let last = hops_to_probe(cfg, reached_at);
            ttl = if ttl >= last { 1 } else { ttl + 1 };
            next_send += cfg.interval / u32::from(last);
            if next_send < now {
                next_send = now;
            }
        }
        in_flight.retain(|_, (_, at)| now.duration_since(*at) < cfg.timeout);
        let wait = match stop_at {
            Some(s) => s.saturating_duration_since(now),
            None => next_send.saturating_duration_since(now),
        };
        if icmp::wait_error(sock, wait.min(Duration::from_millis(100)), cfg.icmp) {
            // (key, who answered, when, reached the destination)
            let mut answers = Vec::new();
            while let Some(e) = icmp::recv_error(sock)? {
                if e.dest.ip() != cfg.target {
                    continue;
                }
                let key = if cfg.icmp {
                    match e.payload.get(6..8) {
                        Some(b) => u16::from_be_bytes([b[0], b[1]]),
                        None => continue,
                    }
                } else {
                    e.dest.port().wrapping_sub(FIRST_PORT)
                };
                answers.push((
                    key,
                    e.from,
                    e.at,
                    e.kind == IcmpKind::PortUnreachable || e.from == Some(cfg.target),
                ));
            }
            if cfg.icmp {
                while let Some(r) = icmp::recv_echo_reply(sock)? {
                    answers.push((r.seq, Some(r.from), r.at, true));
                }
            }
            for (key, from, at, reached) in answers {
                let Some((i, _)) = in_flight.remove(&key) else {
                    continue;
                };
                let p = &mut probes[i];
                let at = at.map_or_else(|| unix(SystemTime::now()), unix);
                p.rtt_ms = Some(((at - p.sent_unix) * 1e3).max(0.0));
                p.from = from;
                p.reached = reached;
                if reached && reached_at.is_none_or(|r| p.ttl < r) {
                    reached_at = Some(p.ttl);
                }
            }
        }
    }
    // Probes past the destination's TTL all reach it: keep only those up to it.
    if let Some(r) = reached_at {
        probes.retain(|p| p.ttl <= r);
    }
    Ok(probes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_one_hop_and_every_probe_answers() {
        let cfg = HopConfig {
            target: "127.0.0.1".parse().unwrap(),
            max_hops: 4,
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(2),
            icmp: false,
        };
        let p = HopProber::start(cfg).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
        let probes = p.finish().unwrap();
        // First round: TTL 1..4 all reach loopback; then only TTL 1, ten a second.
        assert!(probes.len() >= 6, "{probes:?}");
        assert!(
            probes
                .iter()
                .all(|p| p.ttl == 1 && p.reached && p.rtt_ms.unwrap() < 50.0),
            "{probes:?}"
        );
    }
}
