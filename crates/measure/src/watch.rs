//! Light probing without end (`bloatlab monitor`): one UDP probe stream to a bloatlab server,
//! renewed as a series of `ping` sessions the server's test-length limit allows, each probe
//! settled once it is answered or its answer is overdue.

use crate::control::Control;
use crate::oneway::OneWay;
use crate::plan::Stream;
use crate::probe::ProbeStream;
use crate::MeasureError;
use bloatlab_analyze::clock::{self, Echo};
use bloatlab_netio as netio;
use bloatlab_proto::{StreamSpec, TestRequest};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

/// One session's length: under the server's default limit of 180 s, with room for its grace.
const SESSION: Duration = Duration::from_secs(120);
/// A probe not answered this long after it left is lost (answers 1-3 s late are what a bloated
/// line gives, so this is longer).
pub const LOSS_AFTER: Duration = Duration::from_secs(4);

/// One settled probe; times are this host's monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub sent_ns: u64,
    /// `None`: lost.
    pub rtt_ms: Option<f64>,
    /// One-way delays with the clock offset of the session's fastest echoes so far.
    pub owd_up_ms: Option<f64>,
    pub owd_down_ms: Option<f64>,
    /// The four timestamps (each side's own clock), for a caller that keeps its own offset.
    pub echo: Option<Echo>,
}

/// Another user of a watch's probes, stepped by the loop that owns the watch: one probe stream
/// and one process for two jobs (the monitor with autorate riding along).
pub trait Rider {
    /// Probes per second it needs (the owner probes at the higher of this and its own rate).
    fn probe_rate(&self) -> f64;
    /// The probes settled since the last call, at `now_ns` (monotonic).
    fn samples(&mut self, now_ns: u64, samples: &[Sample]);
    /// Its own work at `now_ns`, at every wake-up of the owner's loop.
    fn step(&mut self, now_ns: u64);
    /// When it next needs a wake-up, if it does (monotonic ns).
    fn next_due(&self) -> Option<u64>;
    /// Its Prometheus text, for the owner's /metrics face.
    fn metrics(&self) -> Arc<dyn Fn() -> String + Send + Sync>;
    /// The owner stops: leave what it drives as it should be left.
    fn finish(self: Box<Self>);
}

pub struct Watch {
    addrs: Vec<std::net::SocketAddr>,
    interval_us: u32,
    size: u16,
    key: Option<Arc<[u8]>>,
    session: Option<Session>,
    prompt: bool,
    /// A prompt watch's clock offset, kept across sessions (a session's own would move as each
    /// learns it again, and every move reads as delay one way).
    oneway: OneWay,
    driven: bool,
    /// A session being opened in a thread of its own: a handshake with a server that does not
    /// answer takes seconds, and the owner's loop (other servers, reflectors, the shaper) goes
    /// on meanwhile.
    opening: Option<Receiver<Result<Session, MeasureError>>>,
    /// A driven watch's probe schedule: a new session's first probe keeps to its grid, so
    /// watches started apart stay apart.
    grid: Option<u64>,
}

struct Session {
    control: Control,
    probes: ProbeStream,
    opened_ns: u64,
    /// Probes before this index are settled.
    settled: usize,
    /// Probes at or after `settled` already settled out of order (prompt mode).
    early: std::collections::HashSet<usize>,
    echoes: Vec<Echo>,
    /// A driven session's next probe (monotonic ns).
    next_due: u64,
}

impl Watch {
    /// `rate` probes per second to `host` (HOST[:PORT] of a bloatlab server).
    pub fn new(host: &str, rate: f64, key: Option<Vec<u8>>) -> Result<Watch, MeasureError> {
        let size = if key.is_some() {
            64.max(bloatlab_proto::probe::MIN_SIGNED_LEN as u16)
        } else {
            64
        };
        Ok(Watch {
            addrs: crate::run::resolve(host)?,
            interval_us: (1e6 / rate.clamp(0.1, 1000.0)) as u32,
            size,
            key: key.map(Arc::from),
            session: None,
            prompt: false,
            oneway: OneWay::default(),
            driven: false,
            opening: None,
            grid: None,
        })
    }

    /// A driven watch's first probe at `at` (monotonic ns) or a whole number of intervals
    /// after it: watches of several servers started a fraction of an interval apart keep
    /// their probes apart.
    pub fn first_probe_at(mut self, at: u64) -> Watch {
        self.grid = Some(at);
        self
    }

    /// Settles each answered probe at once, before earlier ones still waiting for theirs (a
    /// controller wants every delay now; in order, one lost probe holds the rest back for
    /// [`LOSS_AFTER`]). The one-way delays then come from an offset kept across sessions
    /// ([`OneWay`]) instead of each session's fastest echoes.
    pub fn prompt(mut self) -> Watch {
        self.prompt = true;
        self
    }

    /// No threads of its own: each [`Watch::poll`] sends the probe due and takes the answers
    /// that came meanwhile, timed by the kernel as they arrived, so the caller polls when
    /// [`Watch::next_due`] says (one wake-up per probe, where threads took three).
    pub fn driven(mut self) -> Watch {
        self.driven = true;
        self
    }

    /// When a driven watch's next probe is due (monotonic ns); `None` with no session open
    /// (or not driven).
    pub fn next_due(&self) -> Option<u64> {
        self.session
            .as_ref()
            .filter(|_| self.driven)
            .map(|s| s.next_due)
    }

    /// Whether a session is open (the server answered its handshake).
    pub fn connected(&self) -> bool {
        self.session.is_some()
    }

    /// Opens a session when none is open (in a thread: a later call finds it open), renews one
    /// at its end, and returns the probes settled since the last call. An error means no
    /// session could be opened (the caller backs off); probes of a session the server dropped
    /// are settled as lost.
    pub fn poll(&mut self) -> Result<Vec<Sample>, MeasureError> {
        let now = netio::mono_ns();
        let mut out = Vec::new();
        if let Some(s) = &mut self.session {
            if self.driven {
                s.next_due = s.probes.drive();
                self.grid = Some(s.next_due);
            }
            let ending = now.saturating_sub(s.opened_ns) >= SESSION.as_nanos() as u64;
            let gone = s.control.server_gone();
            if ending || gone {
                s.probes.stop_sending();
            }
            let oneway = self.prompt.then_some(&mut self.oneway);
            s.settle(now, gone, oneway, &mut out);
            let done = (ending && s.probes.outstanding() == 0) || gone || {
                let last = s.probes.log.lock().unwrap().recs.last().map(|r| r.t1);
                ending && last.is_some_and(|t| now - t > LOSS_AFTER.as_nanos() as u64)
            };
            if done {
                let mut s = self.session.take().expect("just seen");
                s.settle(
                    u64::MAX,
                    true,
                    self.prompt.then_some(&mut self.oneway),
                    &mut out,
                );
                s.probes.stop();
                if !gone {
                    // The server's final report is not ours to wait for in the owner's loop.
                    std::thread::spawn(move || s.control.finish(Duration::from_millis(500)));
                }
            }
        }
        if self.session.is_none() && out.is_empty() {
            match self.opening.take() {
                None => {
                    let (tx, rx) = std::sync::mpsc::channel();
                    let how = Opening {
                        addrs: self.addrs.clone(),
                        interval_us: self.interval_us,
                        size: self.size,
                        key: self.key.clone(),
                        driven: self.driven,
                    };
                    // A watch dropped meanwhile takes no answer: the session is dropped too.
                    std::thread::spawn(move || {
                        let _ = tx.send(how.open());
                    });
                    self.opening = Some(rx);
                }
                Some(rx) => match rx.try_recv() {
                    Ok(opened) => {
                        let mut s = opened?;
                        if let (true, Some(grid)) = (self.driven, self.grid) {
                            let step = u64::from(self.interval_us) * 1_000;
                            let now = netio::mono_ns();
                            let first = grid + now.saturating_sub(grid).div_ceil(step) * step;
                            s.probes.first_at(first);
                            s.next_due = first;
                        }
                        self.session = Some(s);
                    }
                    Err(TryRecvError::Empty) => self.opening = Some(rx),
                    Err(TryRecvError::Disconnected) => {
                        return Err(MeasureError::Io {
                            what: "opening a session".into(),
                            source: std::io::Error::other("its thread ended without a word"),
                        })
                    }
                },
            }
        }
        Ok(out)
    }
}

/// What a session is opened with, moved into the thread that opens it.
struct Opening {
    addrs: Vec<std::net::SocketAddr>,
    interval_us: u32,
    size: u16,
    key: Option<Arc<[u8]>>,
    driven: bool,
}

impl Opening {
    fn open(self) -> Result<Session, MeasureError> {
        let spec = StreamSpec {
            id: 0,
            interval_us: self.interval_us,
            size: self.size,
            dscp: 0,
            ecn: 0,
        };
        let request = TestRequest {
            test: "ping".into(),
            duration_ms: SESSION.as_millis() as u64,
            flows: Vec::new(),
            streams: vec![spec.clone()],
            connection_probes: false,
            udp_loads: Vec::new(),
            auth: None,
        };
        let control = Control::open(&self.addrs, request, self.key.as_deref())?;
        let stream = Stream {
            name: "udp watch".into(),
            spec,
        };
        let (addr, token, key) = (control.addr, control.token, self.key.clone());
        let probes = ProbeStream::start(addr, token, stream, key, self.driven)?;
        Ok(Session {
            control,
            probes,
            opened_ns: netio::mono_ns(),
            settled: 0,
            early: Default::default(),
            echoes: Vec::new(),
            next_due: netio::mono_ns(),
        })
    }
}

impl Session {
    /// Settles, in order, every probe answered or overdue at `now` (all of them when `all`);
    /// when prompt (`oneway` given, for the one-way delays), answered ones also past an earlier
    /// probe still waiting.
    fn settle(
        &mut self,
        now: u64,
        all: bool,
        mut oneway: Option<&mut OneWay>,
        out: &mut Vec<Sample>,
    ) {
        let prompt = oneway.is_some();
        let log = self.probes.log.lock().unwrap();
        let mut settled = Vec::new();
        let mut in_order = true;
        for (i, r) in log.recs.iter().enumerate().skip(self.settled) {
            let overdue = now.saturating_sub(r.t1) > LOSS_AFTER.as_nanos() as u64;
            let done = r.reply.is_some() || overdue || all;
            if !done && !prompt {
                break;
            }
            in_order &= done;
            let early = self.early.contains(&i);
            if done && !early {
                settled.push(*r);
            }
            if in_order {
                self.settled = i + 1;
                if early {
                    self.early.remove(&i);
                }
            } else if done && !early {
                self.early.insert(i);
            }
        }
        drop(log);
        // The session's offset from its fastest echoes, for the one-way delays in order; a
        // prompt watch keeps its own across sessions (and sorting every echo so far at each
        // poll would cost it more than the rest of its loop).
        let offset = if prompt {
            None
        } else {
            for r in &settled {
                if let Some((t2, t3, t4)) = r.reply {
                    self.echoes.push(Echo {
                        t1: r.t1,
                        t2,
                        t3,
                        t4,
                    });
                }
            }
            clock::estimate(&self.echoes).map(|c| c.offset_ms)
        };
        out.extend(settled.iter().map(|r| {
            let Some((t2, t3, t4)) = r.reply else {
                return Sample {
                    sent_ns: r.t1,
                    rtt_ms: None,
                    owd_up_ms: None,
                    owd_down_ms: None,
                    echo: None,
                };
            };
            let e = Echo {
                t1: r.t1,
                t2,
                t3,
                t4,
            };
            let (up, down) = match oneway.as_deref_mut() {
                Some(o) => {
                    let (up, down) = o.delays(r.t1, t2, t3, t4);
                    (Some(up), Some(down))
                }
                None => {
                    let (up, down) = (
                        (t2 as f64 - r.t1 as f64) / 1e6,
                        (t4 as f64 - t3 as f64) / 1e6,
                    );
                    (
                        offset.map(|o| (up - o).max(0.0)),
                        offset.map(|o| (down + o).max(0.0)),
                    )
                }
            };
            Sample {
                sent_ns: r.t1,
                rtt_ms: Some(e.rtt_ns() as f64 / 1e6),
                owd_up_ms: up,
                owd_down_ms: down,
                echo: Some(e),
            }
        }));
    }
}
