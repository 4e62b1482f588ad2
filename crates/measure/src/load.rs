//! The load of a test: bulk flows opened in the background when their time comes, so that a
//! handshake stuck behind a full queue delays only its own flow, never the sampling of the
//! others; each flow is sampled from the moment its data started.

use crate::flow::{FlowConn, PingLog};
use crate::plan;
use bloatlab_proto::{Direction, Token};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

/// A flow that could not be opened or whose connection broke: reported, not fatal.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub flow: String,
    /// Seconds since the test started.
    pub t: f64,
    pub why: String,
}

/// A flow's name and how its opening went.
type Opened = (String, Result<FlowConn, String>);

pub struct BulkLoad {
    addr: SocketAddr,
    token: Token,
    pings: Arc<PingLog>,
    /// Not yet due, earliest first.
    pending: Vec<plan::Flow>,
    /// Flows taken from the plan so far per direction (down, up).
    asked: [u32; 2],
    /// Flows in their handshake, by name.
    opening: Vec<String>,
    opened_tx: mpsc::Sender<Opened>,
    opened_rx: mpsc::Receiver<Opened>,
    pub flows: Vec<FlowConn>,
    pub failures: Vec<Failure>,
    /// The load has ended: flows still in their handshake are closed when they arrive.
    stopped: bool,
}

impl BulkLoad {
    pub fn new(
        addr: SocketAddr,
        token: Token,
        mut flows: Vec<plan::Flow>,
        pings: Arc<PingLog>,
    ) -> BulkLoad {
        flows.sort_by(|a, b| a.start_after.total_cmp(&b.start_after));
        let (opened_tx, opened_rx) = mpsc::channel();
        BulkLoad {
            addr,
            token,
            pings,
            pending: flows,
            asked: [0, 0],
            opening: Vec::new(),
            opened_tx,
            opened_rx,
            flows: Vec::new(),
            failures: Vec::new(),
            stopped: false,
        }
    }

    /// Seconds into the load phase at which the next planned flow is due, if any.
    pub fn next_due(&self) -> Option<f64> {
        if self.stopped {
            return None;
        }
        self.pending.first().map(|f| f.start_after)
    }

    /// Starts opening, each on its own thread, the flows due by `load_t` seconds into the load.
    /// `t` is seconds since the test started, for failure reports.
    pub fn open_due(&mut self, load_t: f64, t: f64) {
        let due = self
            .pending
            .iter()
            .take_while(|f| f.start_after <= load_t)
            .count();
        if due == 0 || self.stopped {
            return;
        }
        for flow in self.pending.drain(..due).collect::<Vec<_>>() {
            self.open(flow, t);
        }
    }

    /// Starts opening planned flows, in the plan's order, until each direction the plan loads
    /// has asked for `per_direction` of them (RPM's ramp decides how many).
    pub fn open_up_to(&mut self, per_direction: u32, t: f64) {
        if self.stopped {
            return;
        }
        for (d, dir) in [Direction::Down, Direction::Up].into_iter().enumerate() {
            while self.asked[d] < per_direction {
                let Some(i) = self.pending.iter().position(|f| f.spec.direction == dir) else {
                    break;
                };
                let flow = self.pending.remove(i);
                self.open(flow, t);
            }
        }
    }

    fn open(&mut self, flow: plan::Flow, t: f64) {
        let d = usize::from(flow.spec.direction == Direction::Up);
        self.asked[d] += 1;
        let (addr, token, pings, tx) = (
            self.addr,
            self.token,
            self.pings.clone(),
            self.opened_tx.clone(),
        );
        let name = flow.name.clone();
        let reply_name = name.clone();
        let opener = move || {
            let r = FlowConn::open(addr, token, flow, pings).map_err(|e| e.to_string());
            // The test may have ended meanwhile: the flow is then dropped (and closed).
            let _ = tx.send((reply_name, r));
        };
        match std::thread::Builder::new()
            .name(format!("open {name}"))
            .spawn(opener)
        {
            Ok(_) => self.opening.push(name),
            Err(e) => self.failures.push(Failure {
                flow: name,
                t,
                why: format!("cannot start a thread: {e}"),
            }),
        }
    }

    /// Takes in the flows whose handshake has finished; their data starts at `t`.
    pub fn take_opened(&mut self, t: f64) {
        while let Ok((name, r)) = self.opened_rx.try_recv() {
            self.opening.retain(|n| *n != name);
            match r {
                // Dropping it closes it; `stop` said why it came too late.
                _ if self.stopped => {}
                Ok(mut c) => {
                    c.begin(t);
                    self.flows.push(c);
                }
                Err(why) => self.failures.push(Failure {
                    flow: name,
                    t,
                    why: format!("could not be opened: {why}"),
                }),
            }
        }
    }

    /// Flows still in their handshake.
    pub fn opening(&self) -> usize {
        self.opening.len()
    }

    /// Records a throughput sample at `t` for every running flow, and reports flows whose
    /// connection broke since the last call (they keep the samples they had).
    pub fn sample(&mut self, t: f64) {
        if self.stopped {
            return;
        }
        for f in self.flows.iter_mut() {
            if f.failed {
                continue;
            }
            if f.broken.load(Ordering::Relaxed) {
                f.failed = true;
                self.failures.push(Failure {
                    flow: f.flow.name.clone(),
                    t,
                    why: "connection broke".into(),
                });
                continue;
            }
            f.sample(t);
        }
    }

    /// Mean goodput of one direction over the last `secs` seconds before `t`, if it has flows.
    pub fn recent_mbps(&self, dir: Direction, t: f64, secs: f64) -> Option<f64> {
        let flows: Vec<&FlowConn> = self
            .flows
            .iter()
            .filter(|f| f.flow.spec.direction == dir)
            .collect();
        (!flows.is_empty()).then(|| flows.iter().map(|f| f.recent_mbps(t, secs)).sum())
    }

    /// The goodput bytes one direction's flows have moved so far, if it has flows.
    pub fn bytes(&self, dir: Direction) -> Option<u64> {
        let mut flows = self
            .flows
            .iter()
            .filter(|f| f.flow.spec.direction == dir)
            .peekable();
        flows
            .peek()
            .is_some()
            .then(|| flows.map(FlowConn::bytes).sum())
    }

    /// A running flow for a probe on a loaded connection, chosen round-robin by `n`.
    pub fn running(&self, n: u64) -> Option<&FlowConn> {
        let live: Vec<&FlowConn> = self.flows.iter().filter(|f| !f.failed).collect();
        (!live.is_empty()).then(|| live[(n % live.len() as u64) as usize])
    }

    /// Ends the load at `t`: closes every flow; nothing opens or is sampled after this. A flow
    /// still in its handshake never loaded the path, and is a failure, not a silence.
    pub fn stop(&mut self, t: f64) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        for flow in self.opening.drain(..) {
            self.failures.push(Failure {
                flow,
                t,
                why: "still opening when the load ended".into(),
            });
        }
        self.pending.clear();
        for f in self.flows.iter_mut() {
            f.stop();
        }
    }
}
