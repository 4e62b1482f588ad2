//! New-connection probes: TCP handshake time (as httping measures) and, for RPM, the time of a
//! request on the fresh connection. Each probe runs on its own thread so that a slow one under
//! bloat does not hold back the schedule.

use crate::control::CONNECT_TIMEOUT;
use bloatlab_netio as netio;
use bloatlab_proto::{self as proto, ClientMsg, ServerMsg, Token};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// (send time ns, connect ms, request ms); `None` for a probe that failed or timed out.
pub type ConnRec = (u64, Option<f64>, Option<f64>);

const MAX_IN_FLIGHT: usize = 32;

pub struct ConnProber {
    pub log: Arc<Mutex<Vec<ConnRec>>>,
    stop: Arc<AtomicBool>,
    /// Probes sent and not yet logged.
    in_flight: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

fn one(addr: SocketAddr, token: Token) -> (Option<f64>, Option<f64>) {
    let t0 = netio::mono_ns();
    let Ok(s) = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) else {
        return (None, None);
    };
    let t1 = netio::mono_ns();
    let connect = Some((t1 - t0) as f64 / 1e6);
    let _ = s.set_nodelay(true);
    let ok = probe_hello(s, token).is_some();
    (connect, ok.then(|| (netio::mono_ns() - t1) as f64 / 1e6))
}

/// A new-connection probe's request on a connected stream: `probe_hello`, then the server's
/// `probe_reply` (within the connect timeout) and what it said of the SYN's marks; `None` when
/// no such answer came.
pub(crate) fn probe_hello(mut s: TcpStream, token: Token) -> Option<Option<u8>> {
    s.set_read_timeout(Some(CONNECT_TIMEOUT)).ok()?;
    let mut r = BufReader::new(s.try_clone().ok()?);
    s.write_all(&proto::encode_line(&ClientMsg::ProbeHello { token }))
        .ok()?;
    let line = netio::read_line(&mut r, proto::MAX_LINE).ok()??;
    match proto::decode_line::<ServerMsg>(&line).ok()? {
        ServerMsg::ProbeReply { syn_tos } => Some(syn_tos),
        _ => None,
    }
}

impl ConnProber {
    pub fn start(addr: SocketAddr, token: Token, interval: Duration) -> ConnProber {
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let (l, st, out) = (log.clone(), stop.clone(), in_flight.clone());
        let thread = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !st.load(Ordering::Relaxed) {
                if out.load(Ordering::Relaxed) < MAX_IN_FLIGHT {
                    let (l, n) = (l.clone(), out.clone());
                    n.fetch_add(1, Ordering::Relaxed);
                    workers.push(std::thread::spawn(move || {
                        let sent = netio::mono_ns();
                        let (c, r) = one(addr, token);
                        l.lock().unwrap().push((sent, c, r));
                        n.fetch_sub(1, Ordering::Relaxed);
                    }));
                }
                std::thread::sleep(interval);
                workers.retain(|w| !w.is_finished());
            }
            for w in workers {
                let _ = w.join();
            }
        });
        ConnProber {
            log,
            stop,
            in_flight,
            thread: Some(thread),
        }
    }

    /// Sends no more probes; those under way finish on their own deadlines.
    pub fn stop_sending(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether every probe sent has its answer or gave up.
    pub fn all_answered(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) == 0
    }

    /// The longest a probe takes to answer or give up: its connect, then its request.
    pub const DEADLINE: Duration = Duration::from_secs(2 * CONNECT_TIMEOUT.as_secs());

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ConnProber {
    fn drop(&mut self) {
        self.stop();
    }
}
