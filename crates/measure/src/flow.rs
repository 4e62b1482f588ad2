//! Bulk TCP flows. Download: the client reads and counts. Upload: the client writes, and
//! goodput is what the server's TCP acknowledged (TCP_INFO), sampled each step.

use crate::control::{connect, hello};
use crate::plan::Flow;
use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_proto::{frame, ClientMsg, Direction, ServerMsg, Token};
use portable_atomic::AtomicU64;
use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A goodput sample covers at least this long (s): over less, one burst reads as a rate no
/// line has.
const MIN_SAMPLE_S: f64 = 0.001;

/// Probes riding on loaded connections (RPM "self" probes): id -> send time, and results.
#[derive(Default)]
pub struct PingLog {
    pending: Mutex<HashMap<u64, u64>>,
    /// (send time ns, round trip ms)
    pub done: Mutex<Vec<(u64, f64)>>,
}

impl PingLog {
    /// How long a ping may wait for its pong before it counts as lost: a connect probe's
    /// deadline, and more than the round trip through the deepest queues this project
    /// measures (0.6 + 2.4 s through a 1000-packet FIFO at 20/5 Mbit/s).
    pub const DEADLINE_NS: u64 = crate::control::CONNECT_TIMEOUT.as_nanos() as u64;

    /// Send times of the pings still waiting for their pong.
    pub fn unanswered(&self) -> Vec<u64> {
        self.pending.lock().unwrap().values().copied().collect()
    }

    /// Whether every ping sent by `now` (ns) has its pong or is past its deadline.
    pub fn all_answered(&self, now: u64) -> bool {
        let pending = self.pending.lock().unwrap();
        pending
            .values()
            .all(|&sent| now.saturating_sub(sent) >= Self::DEADLINE_NS)
    }

    fn pong(&self, id: u64) {
        let now = netio::mono_ns();
        if let Some(sent) = self.pending.lock().unwrap().remove(&id) {
            self.done
                .lock()
                .unwrap()
                .push((sent, (now - sent) as f64 / 1e6));
        }
    }
}

enum PingPath {
    /// Download flows: the client's direction is idle; write the ping straight out.
    Direct(Mutex<TcpStream>),
    /// Upload flows: the ping joins the data the writer thread is queueing.
    Queued(mpsc::Sender<u64>),
    /// The flow has stopped (its socket copy is closed).
    Closed,
}

pub struct FlowConn {
    pub flow: Flow,
    /// Congestion control of the sending socket (ours for upload, the server's for download).
    pub cc: Option<String>,
    /// The DSCP the sending socket carries, read back after setting it.
    pub dscp_applied: Option<u8>,
    /// Why the sending socket does not carry the requested DSCP, when it does not.
    pub dscp_refused: Option<String>,
    /// Why an upload's goodput cannot be counted, when it cannot (it reads 0 then).
    pub uncounted: Option<String>,
    /// `None` once stopped: the socket is closed then, abortively.
    stream: Option<TcpStream>,
    /// Retransmissions counted when the flow stopped (upload).
    final_retransmits: Option<u32>,
    received: Arc<AtomicU64>,
    acked_base: u64,
    ping_path: PingPath,
    stop: Arc<AtomicBool>,
    /// Set when the connection broke before we stopped it.
    pub broken: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// (t seconds, Mbit/s) per step: the goodput since the previous sample, or since `started`.
    pub samples: Vec<(f64, Option<f64>)>,
    last_bytes: u64,
    /// Seconds since the test started at which the handshake ended and data began.
    pub started: f64,
    pub last_sample: f64,
    /// The connection broke and was reported; it is no longer sampled.
    pub failed: bool,
}

impl FlowConn {
    pub fn open(
        addr: SocketAddr,
        token: Token,
        flow: Flow,
        pings: Arc<PingLog>,
    ) -> Result<FlowConn, MeasureError> {
        let mut stream = connect(&[addr])?;
        let client_dscp = netio::apply_dscp(socket2::SockRef::from(&stream), flow.spec.dscp, &addr);
        let upload = flow.spec.direction == Direction::Up;
        if upload {
            if let Some(cc) = &flow.spec.cc {
                netio::set_cc(&stream, cc)
                    .map_err(MeasureError::io(format!("flow {}", flow.name)))?;
            }
        }
        let _ = stream.set_read_timeout(Some(crate::control::CONNECT_TIMEOUT));
        let mut reader = BufReader::new(
            stream
                .try_clone()
                .map_err(MeasureError::io("flow socket"))?,
        );
        let deadline = std::time::Instant::now() + crate::control::CONNECT_TIMEOUT;
        let (server_cc, server_dscp) = match hello(
            &mut stream,
            &mut reader,
            addr,
            &ClientMsg::DataHello {
                token,
                flow: flow.spec.id,
            },
            deadline,
        )? {
            ServerMsg::DataOk { cc, dscp } => (cc, dscp),
            other => {
                return Err(MeasureError::Version {
                    addr,
                    message: format!("unexpected answer {other:?}"),
                })
            }
        };
        let cc = if upload {
            netio::cc(&stream)
        } else {
            server_cc
        };
        // The mark that counts is the sender's: ours for an upload, the server's for a download.
        let (dscp_applied, dscp_refused) = if upload {
            (
                client_dscp.as_ref().ok().copied(),
                netio::dscp_refusal(flow.spec.dscp, &client_dscp),
            )
        } else {
            let refused = match server_dscp {
                Some(d) => netio::dscp_refusal(flow.spec.dscp, &Ok(d))
                    .map(|w| format!("on the server, {w}")),
                None => Some(format!(
                    "the server did not confirm DSCP {}",
                    flow.spec.dscp
                )),
            };
            (server_dscp, refused)
        };
        let (acked_base, uncounted) = match upload.then(|| netio::tcp_info(&stream)) {
            Some(Ok(i)) => (i.bytes_acked, None),
            Some(Err(e)) => (0, Some(format!("its goodput cannot be counted: {e}"))),
            None => (0, None),
        };
        // Periodic timeouts let the threads notice `stop`.
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let stop = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();

        // Reader: counts download data, and takes pongs in both directions.
        {
            let (stop, broken, received, pings) = (
                stop.clone(),
                broken.clone(),
                received.clone(),
                pings.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut decoder = frame::Decoder::new();
                let pending = reader.buffer().to_vec();
                let on_event = |e| match e {
                    frame::Event::Data(n) => {
                        received.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    frame::Event::Pong(id) => pings.pong(id),
                    frame::Event::Ping(_) => {}
                };
                let mut ok = decoder.feed(&pending, on_event).is_ok();
                let mut sock = reader.into_inner();
                let mut buf = vec![0u8; frame::READ_BUFFER];
                while ok && !stop.load(Ordering::Relaxed) {
                    match sock.read(&mut buf) {
                        Ok(0) => {
                            ok = false;
                        }
                        Ok(n) => ok = decoder.feed(&buf[..n], on_event).is_ok(),
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => ok = false,
                    }
                }
                if !ok && !stop.load(Ordering::Relaxed) {
                    broken.store(true, Ordering::Relaxed);
                }
            }));
        }
        let ping_path = if upload {
            let (tx, rx) = mpsc::channel::<u64>();
            let (stop, broken) = (stop.clone(), broken.clone());
            let mut w = stream
                .try_clone()
                .map_err(MeasureError::io("flow socket"))?;
            let responsive = flow.responsive;
            threads.push(std::thread::spawn(move || {
                let mut chunk = vec![0u8; frame::HEADER_LEN + frame::DATA_PAYLOAD];
                while !stop.load(Ordering::Relaxed) {
                    while let Ok(id) = rx.try_recv() {
                        if write_until_stopped(&mut w, &frame::ping(id), &stop).is_err() {
                            break;
                        }
                    }
                    let payload = match responsive {
                        true => frame::responsive_payload(
                            netio::keep_unsent_small(&w)
                                .unwrap_or(frame::RESPONSIVE_PAYLOAD as u32),
                        ),
                        false => frame::DATA_PAYLOAD,
                    };
                    // The kernel checks its unsent limit only when a write needs a new buffer
                    // (netio::sendbuf): asked first, it holds half the limit and a frame.
                    while responsive
                        && !stop.load(Ordering::Relaxed)
                        && !netio::sendbuf::unsent_room(w.as_fd(), Duration::from_millis(100))
                    {
                    }
                    chunk[..frame::HEADER_LEN].copy_from_slice(&frame::data_header(payload));
                    if write_until_stopped(&mut w, &chunk[..frame::HEADER_LEN + payload], &stop)
                        .is_err()
                    {
                        if !stop.load(Ordering::Relaxed) {
                            broken.store(true, Ordering::Relaxed);
                        }
                        break;
                    }
                }
            }));
            PingPath::Queued(tx)
        } else {
            PingPath::Direct(Mutex::new(
                stream
                    .try_clone()
                    .map_err(MeasureError::io("flow socket"))?,
            ))
        };
        Ok(FlowConn {
            flow,
            cc,
            dscp_applied,
            dscp_refused,
            uncounted,
            stream: Some(stream),
            final_retransmits: None,
            received,
            acked_base,
            ping_path,
            stop,
            broken,
            threads,
            samples: Vec::new(),
            last_bytes: 0,
            started: 0.0,
            last_sample: 0.0,
            failed: false,
        })
    }

    /// Goodput bytes so far: read by us (download) or delivered to the server (upload):
    /// acknowledged, plus what it holds beyond a hole. Without the latter, a loss behind a long
    /// queue stalls the count for a round trip and then credits a whole window at once (seen:
    /// 20.6 Mbit/s in one second of a 10 Mbit/s line behind a 300 ms driver ring).
    pub fn bytes(&self) -> u64 {
        match self.flow.spec.direction {
            Direction::Down => self.received.load(Ordering::Relaxed),
            Direction::Up => match &self.stream {
                // Never backwards: the SACKed estimate counts whole segments.
                Some(s) => netio::tcp_info(s)
                    .map(|i| {
                        (i.bytes_acked + i.sacked_bytes)
                            .saturating_sub(self.acked_base)
                            .max(self.last_bytes)
                    })
                    .unwrap_or(self.last_bytes),
                None => self.last_bytes,
            },
        }
    }

    /// Takes `t` as the moment the flow's data begins: what arrived since its handshake, while
    /// it waited to be taken in, is not credited to a first sample of no duration (which read
    /// 104 224 Mbit/s: 13 kB over the 1 us floor this replaces).
    pub fn begin(&mut self, t: f64) {
        self.started = t;
        self.last_sample = t;
        self.last_bytes = self.bytes();
    }

    /// Records the goodput since the previous sample (or the start) as a sample at `t`.
    pub fn sample(&mut self, t: f64) {
        let dt = t - self.last_sample;
        if dt < MIN_SAMPLE_S {
            // Taken in at this very step: its first sample comes with the next.
            return;
        }
        let b = self.bytes();
        let mbps = (b.saturating_sub(self.last_bytes)) as f64 * 8.0 / dt / 1e6;
        self.last_bytes = b;
        self.last_sample = t;
        self.samples.push((t, Some(mbps)));
    }

    /// Mean goodput over the `secs` seconds before `t` (samples weighted by the time they cover).
    pub fn recent_mbps(&self, t: f64, secs: f64) -> f64 {
        bloatlab_analyze::stats::rate_over(&self.samples, self.started, t - secs, t)
    }

    pub fn retransmits(&self) -> Option<u32> {
        match &self.stream {
            Some(s) => self.retransmits_of(s),
            None => self.final_retransmits,
        }
    }

    fn retransmits_of(&self, s: &TcpStream) -> Option<u32> {
        (self.flow.spec.direction == Direction::Up)
            .then(|| netio::tcp_info(s).ok().map(|i| i.total_retrans))
            .flatten()
    }

    pub fn ping(&self, id: u64, log: &PingLog) {
        log.pending.lock().unwrap().insert(id, netio::mono_ns());
        match &self.ping_path {
            PingPath::Direct(s) => {
                let _ = s.lock().unwrap().write_all(&frame::ping(id));
            }
            PingPath::Queued(tx) => {
                let _ = tx.send(id);
            }
            PingPath::Closed => {}
        }
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The load ends now: a graceful close would still send (or, for a download, make the
        // server send) what fills the socket buffers, megabytes that keep the queues full for
        // seconds after the load phase. Linger 0 makes the close a reset that discards them.
        let Some(stream) = self.stream.take() else {
            return;
        };
        self.final_retransmits = self.retransmits_of(&stream);
        let _ = socket2::SockRef::from(&stream).set_linger(Some(std::time::Duration::ZERO));
        let _ = stream.shutdown(std::net::Shutdown::Both);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The last copies of the socket: closing them sends the reset.
        self.ping_path = PingPath::Closed;
        drop(stream);
    }
}

impl Drop for FlowConn {
    fn drop(&mut self) {
        self.stop();
    }
}

fn write_until_stopped(
    w: &mut TcpStream,
    mut buf: &[u8],
    stop: &AtomicBool,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match w.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Err(std::io::ErrorKind::TimedOut.into());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
