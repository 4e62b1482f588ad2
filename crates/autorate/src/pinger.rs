//! The reflectors' shell: ICMP echo sockets (IPv4, IPv6 as the reflectors need), the pings in
//! flight, and round trips timed from the kernel's arrival stamps; [`Reflectors`] decides whom
//! to ping and whom to replace.

use crate::reflectors::{ReflectorConfig, Reflectors, Replaced};
use bloatlab_netio::icmp::EchoSocket;
use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::time::{Duration, SystemTime};

/// A ping not answered within this is lost.
const LOST_AFTER: Duration = Duration::from_secs(2);

pub struct Pinger {
    v4: Option<EchoSocket>,
    v6: Option<EchoSocket>,
    pub reflectors: Reflectors<IpAddr>,
    /// (sequence, reflector, sent): bounded by LOST_AFTER at the ping rate.
    in_flight: VecDeque<(u16, IpAddr, SystemTime)>,
    seq: u16,
}

/// One answer: who, and its round trip, ms.
pub struct RoundTrip {
    pub from: IpAddr,
    pub rtt_ms: f64,
}

impl Pinger {
    /// Sockets for the families `pool` has; `rate` pings a second over the active ones.
    pub fn open(pool: Vec<IpAddr>, rate: f64, now: u64) -> io::Result<Pinger> {
        let open = |v6: bool| {
            pool.iter()
                .any(|a| a.is_ipv6() == v6)
                .then(|| EchoSocket::open(v6))
                .transpose()
        };
        let (v4, v6) = (open(false)?, open(true)?);
        let reflectors = Reflectors::new(pool, ReflectorConfig::new(rate), now)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no reflectors"))?;
        Ok(Pinger {
            v4,
            v6,
            reflectors,
            in_flight: VecDeque::new(),
            seq: 0,
        })
    }

    fn socket(&self, a: IpAddr) -> Option<&EchoSocket> {
        if a.is_ipv6() {
            self.v6.as_ref()
        } else {
            self.v4.as_ref()
        }
    }

    /// Sends the ping that is due, if any. A failed send (no route now) is a lost ping, which
    /// the reflectors' health counts; its error is returned for the caller to say once.
    pub fn send_due(&mut self, now: u64) -> io::Result<()> {
        let Some(to) = self.reflectors.poll_send(now) else {
            return Ok(());
        };
        self.seq = self.seq.wrapping_add(1);
        let sock = self.socket(to).expect("a socket per family in the pool");
        let sent = SystemTime::now();
        sock.send(to, self.seq)?;
        self.in_flight.push_back((self.seq, to, sent));
        Ok(())
    }

    /// The answers that came, each timed by its arrival; and how many pings were lost.
    pub fn answers(&mut self) -> io::Result<(Vec<RoundTrip>, u64)> {
        let mut out = Vec::new();
        for sock in [&self.v4, &self.v6].into_iter().flatten() {
            while let Some(r) = sock.recv()? {
                let Some(i) = self
                    .in_flight
                    .iter()
                    .position(|(seq, to, _)| *seq == r.seq && *to == r.from)
                else {
                    continue;
                };
                let (_, from, sent) = self.in_flight.remove(i).expect("found");
                let at = r.at.unwrap_or_else(SystemTime::now);
                // A wall clock stepped back between the send and the stamp: no round trip.
                if let Ok(rtt) = at.duration_since(sent) {
                    out.push(RoundTrip {
                        from,
                        rtt_ms: rtt.as_secs_f64() * 1e3,
                    });
                }
            }
        }
        let now = SystemTime::now();
        let before = self.in_flight.len();
        self.in_flight.retain(|(_, _, sent)| {
            now.duration_since(*sent)
                .is_ok_and(|waited| waited < LOST_AFTER)
        });
        Ok((out, (before - self.in_flight.len()) as u64))
    }

    /// Health checks due now: the reflectors replaced.
    pub fn check(&mut self, now: u64) -> Vec<Replaced<IpAddr>> {
        self.reflectors.check(now)
    }

    /// Pinging starts again after a pause; the pings of before are forgotten.
    pub fn resume(&mut self, now: u64) {
        self.in_flight.clear();
        self.reflectors.resume(now);
    }

    pub fn next_due(&self) -> u64 {
        self.reflectors.next_due()
    }

    /// Whether pings go out on raw sockets (ping sockets are not open to this process).
    pub fn raw(&self) -> bool {
        [&self.v4, &self.v6]
            .into_iter()
            .flatten()
            .any(EchoSocket::is_raw)
    }
}
