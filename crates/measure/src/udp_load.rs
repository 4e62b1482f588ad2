//! The sender of a UDP load (`test udp`): constant-rate packets to the server's sink with the
//! chosen pacing, each send's time and size counted per bucket (the sender's burst profile).

use crate::pacing::{Pacing, Schedule};
use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_proto::buckets::Buckets;
use bloatlab_proto::probe::{self, Kind, Probe};
use bloatlab_proto::{auth, Token, UdpLoadSpec};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the sender did, as it goes.
#[derive(Clone, Debug)]
pub struct SendLog {
    pub sent: u64,
    /// Sends the kernel refused (a full device queue: ENOBUFS), each retried the next round.
    pub send_errors: u64,
    /// Packets skipped after a stall of the sender (see [`crate::pacing::MAX_BEHIND`]).
    pub skipped: u64,
    pub buckets: Buckets,
}

pub struct UdpLoad {
    pub spec: UdpLoadSpec,
    /// The pacing asked for.
    pub asked: Pacing,
    /// The pacing the sender uses, after `auto` was resolved or `fq` fell back.
    pub pacing: Pacing,
    /// Why the pacing is not the one asked for, or how `auto` chose.
    pub pacing_note: Option<String>,
    pub dscp_refused: Option<String>,
    pub log: Arc<Mutex<SendLog>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Bytes on the wire per UDP payload byte, for the kernel's pacing rate (which counts whole
/// packets): IPv4 + UDP + Ethernet headers.
const HEADERS: u64 = 20 + 8 + 14;

/// `fq` or the timer for `auto`; `fq` only where the egress qdisc honours it.
fn resolve(asked: Pacing, addr: SocketAddr) -> (Pacing, Option<String>) {
    if !matches!(asked, Pacing::Auto | Pacing::Fq) {
        return (asked, None);
    }
    match netio::udp::egress_has_fq(addr.ip()) {
        Ok((_, true)) => (
            Pacing::Fq,
            (asked == Pacing::Auto).then(|| {
                "auto: the egress qdisc is \
            fq, so the kernel paces"
                    .to_string()
            }),
        ),
        Ok((dev, false)) => (
            Pacing::Timer,
            Some(format!(
                "the egress qdisc of {dev} is not fq, \
            which alone honours SO_MAX_PACING_RATE for UDP: pacing by timer instead"
            )),
        ),
        Err(why) => (
            Pacing::Timer,
            Some(format!(
                "cannot tell the egress qdisc ({why}): pacing by \
            timer"
            )),
        ),
    }
}

impl UdpLoad {
    /// Starts the sender; it sends from `start_ns` to `end_ns` (the monotonic clock).
    pub fn start(
        addr: SocketAddr,
        token: Token,
        spec: UdpLoadSpec,
        asked: Pacing,
        start_ns: u64,
        end_ns: u64,
        key: Option<Arc<[u8]>>,
    ) -> Result<UdpLoad, MeasureError> {
        let (sock, _, dscp_refused) = crate::probe::socket(addr, spec.dscp, spec.ecn)?;
        let (pacing, mut pacing_note) = resolve(asked, addr);
        let tick = match pacing {
            Pacing::Tick(d) | Pacing::Burst(d) => Some(d),
            // The kernel spaces the packets; the sender only keeps the average, 10 ms at a time.
            Pacing::Fq => Some(Duration::from_millis(10)),
            Pacing::Timer | Pacing::Auto => None,
        };
        if pacing == Pacing::Fq {
            // A percent above the payload rate with headers: the schedule keeps the average, fq
            // the spacing.
            let wire = spec.rate_bps / 8 * (u64::from(spec.size) + HEADERS) / u64::from(spec.size)
                * 101
                / 100;
            if let Err(e) = netio::udp::set_max_pacing_rate(&sock, wire) {
                pacing_note = Some(format!(
                    "SO_MAX_PACING_RATE refused ({e}): the 10 ms bursts go unpaced"
                ));
            }
        }
        let span = end_ns.saturating_sub(start_ns) + 1_000_000_000;
        let log = Arc::new(Mutex::new(SendLog {
            sent: 0,
            send_errors: 0,
            skipped: 0,
            buckets: Buckets::new(
                u64::from(spec.bucket_us) * 1000,
                (span / (u64::from(spec.bucket_us) * 1000)) as usize + 1,
            ),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let schedule = Schedule::new(start_ns, spec.rate_bps, spec.size, tick);
        let thread = {
            let (log, stop, spec) = (log.clone(), stop.clone(), spec.clone());
            std::thread::spawn(move || {
                send_loop(
                    &sock,
                    token,
                    &spec,
                    schedule,
                    end_ns,
                    key.as_deref(),
                    &log,
                    &stop,
                )
            })
        };
        Ok(UdpLoad {
            spec,
            asked,
            pacing,
            pacing_note,
            dscp_refused,
            log,
            stop,
            thread: Some(thread),
        })
    }

    /// Payload Mbit/s sent over the last `window` seconds before `now_ns`, for the progress line.
    pub fn recent_mbps(&self, now_ns: u64, window: f64) -> f64 {
        let l = self.log.lock().unwrap();
        let b = &l.buckets;
        let Some(first) = b.first_ns() else {
            return 0.0;
        };
        let now_i = (now_ns.saturating_sub(first) / b.bucket_ns()) as usize;
        let n = ((window * 1e9) as u64 / b.bucket_ns()).max(1) as usize;
        let bytes: u64 = b
            .bytes()
            .iter()
            .take(now_i + 1)
            .skip((now_i + 1).saturating_sub(n))
            .map(|&x| u64::from(x))
            .sum();
        bytes as f64 * 8.0 / window / 1e6
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for UdpLoad {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Sends what the schedule says is due, sleeps until the next is, until `end_ns` or `stop`.
#[allow(clippy::too_many_arguments)]
fn send_loop(
    sock: &UdpSocket,
    token: Token,
    spec: &UdpLoadSpec,
    mut schedule: Schedule,
    end_ns: u64,
    key: Option<&[u8]>,
    log: &Mutex<SendLog>,
    stop: &AtomicBool,
) {
    // Sleeps end on time, not up to 50 us late (the default timer slack): the timer pacing
    // depends on it at 100 Mbit/s (82 us between 1 KB packets).
    netio::udp::precise_sleeps();
    let mut buf = vec![0u8; usize::from(spec.size)];
    let flags = if key.is_some() { probe::FLAG_MAC } else { 0 };
    // Send times of one round, counted into the log after the sends (kept across rounds).
    let mut sends: Vec<u64> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = netio::mono_ns();
        if now >= end_ns {
            break;
        }
        let due = schedule.due(now);
        let (mut sent, mut refused) = (0u64, 0u64);
        sends.clear();
        for _ in 0..due {
            let t = netio::mono_ns();
            let p = Probe {
                kind: Kind::Load,
                stream: spec.id,
                token,
                seq: schedule.total_sent() as u32 + sent as u32,
                client_send_ns: t,
                server_recv_ns: 0,
                server_send_ns: 0,
                server_rx_count: 0,
                flags,
            };
            if p.encode(&mut buf).is_err() {
                break;
            }
            if let Some(k) = key {
                auth::sign_probe(k, &mut buf);
            }
            match sock.send(&buf) {
                Ok(_) => {
                    sent += 1;
                    sends.push(t);
                }
                Err(_) => {
                    // The device queue is full: this packet is lost on the host, and so would be
                    // the rest of this round's. Counted, and the round ends.
                    refused += 1;
                    break;
                }
            }
        }
        schedule.sent(sent);
        {
            let mut l = log.lock().unwrap();
            l.sent += sent;
            l.send_errors += refused;
            l.skipped = schedule.skipped;
            for &t in &sends {
                l.buckets.add(t, u32::from(spec.size));
            }
        }
        if refused > 0 {
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let next = schedule.next_ns().min(end_ns);
        let now = netio::mono_ns();
        if next > now {
            // At most 50 ms at a time, so that `stop` is noticed.
            std::thread::sleep(Duration::from_nanos((next - now).min(50_000_000)));
        }
    }
}
