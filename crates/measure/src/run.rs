//! Runs one test: handshake, idle phase, load phase, drain, report, result file.

use crate::connprobe::ConnProber;
use crate::control::Control;
use crate::control::Report;
use crate::display::{ProgressMode, Status};
use crate::engine::{Drain, Pace, Period, RpmRamp, Schedule, Timer};
use crate::flow::PingLog;
use crate::load::BulkLoad;
use crate::plan::{self, Params, TestKind};
use crate::probe::ProbeStream;
use crate::record::{self, Live};
use crate::udp_load::UdpLoad;
use crate::{target, MeasureError};
use bloatlab_netio as netio;
use bloatlab_proto::{Direction, TestRequest};
use bloatlab_result::{self as result, Host, Metadata, Phase, ResultFile};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

pub struct RunOptions {
    /// Result file; `None` picks `bloatlab-TEST-TIMESTAMP.json.gz` in the current directory.
    pub output: Option<PathBuf>,
    pub progress: ProgressMode,
    /// Set by Ctrl-C: end the test early, keep what was measured.
    pub stop: Arc<AtomicBool>,
    /// The server's shared key, when it requires one (`--key FILE`, `BLOATLAB_KEY`).
    pub key: Option<Vec<u8>>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    Complete,
    Interrupted,
    ServerLost(String),
    /// This host could not go on (a local write failed): the reason, said once.
    Failed(String),
}

pub struct Outcome {
    pub result: ResultFile,
    pub path: PathBuf,
    pub ended: Ended,
}

/// What the metadata says of host details a server keeps from unauthenticated clients.
const HIDDEN: &str = "not disclosed by the server";

/// How often a snapshot of the result file is written during a test.
const SNAPSHOT_EVERY: f64 = 2.0;

pub(crate) fn resolve(host_port: &str) -> Result<Vec<SocketAddr>, MeasureError> {
    let (host, port) =
        target::split_host_port(host_port, bloatlab_proto::DEFAULT_PORT).map_err(|why| {
            MeasureError::Resolve {
                host: host_port.into(),
                why,
            }
        })?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| MeasureError::Resolve {
            host: host.clone(),
            why: e.to_string(),
        })?
        .collect();
    if addrs.is_empty() {
        return Err(MeasureError::Resolve {
            host,
            why: "no addresses".into(),
        });
    }
    Ok(addrs)
}

pub(crate) fn default_output(test: &str) -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = stamp
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == 'T')
        .collect();
    PathBuf::from(format!(
        "bloatlab-{test}-{}.json.gz",
        stamp.replace('T', "-")
    ))
}

pub fn run(params: &Params, host: &str, opts: &RunOptions) -> Result<Outcome, MeasureError> {
    let addrs = resolve(host)?;
    // Removed when the test ends, however it ends (but for a kill -9).
    let _ecn_route = if params.tcp_ecn {
        let dest = addrs[0].ip().to_canonical();
        Some(netio::EcnRoute::add(dest).map_err(|why| MeasureError::Io {
            what: "--tcp-ecn".into(),
            source: std::io::Error::other(why),
        })?)
    } else {
        None
    };
    let mut plan = plan::plan(params);
    if opts.key.is_some() {
        // A signed probe carries its 16-byte MAC at its end.
        for s in plan.streams.iter_mut() {
            s.spec.size = s
                .spec
                .size
                .max(bloatlab_proto::probe::MIN_SIGNED_LEN as u16);
        }
    }
    let request = TestRequest {
        test: params.test.name().into(),
        duration_ms: (plan.total() * 1000.0).ceil() as u64,
        flows: plan.flows.iter().map(|f| f.spec.clone()).collect(),
        streams: plan.streams.iter().map(|s| s.spec.clone()).collect(),
        connection_probes: plan.connect_probe_interval.is_some(),
        udp_loads: plan.udp_load.iter().map(|(spec, _)| spec.clone()).collect(),
        auth: None,
    };
    let control = Control::open(&addrs, request, opts.key.as_deref())?;
    let path = opts
        .output
        .clone()
        .unwrap_or_else(|| default_output(params.test.name()));
    let meta = metadata(params, host, &control);
    // The file exists from the first moment, so even an immediate kill leaves something readable.
    result::write_atomic(&path, &ResultFile::new(meta.clone()))?;
    let snapshots = Snapshots::start(path.clone());

    let t0 = netio::mono_ns();
    let pings = Arc::new(PingLog::default());
    let mut probes = Vec::new();
    let key: Option<Arc<[u8]>> = opts.key.as_deref().map(Arc::from);
    for s in &plan.streams {
        probes.push(ProbeStream::start(
            control.addr,
            control.token,
            s.clone(),
            key.clone(),
            false,
        )?);
    }
    let conn = plan
        .connect_probe_interval
        .map(|i| ConnProber::start(control.addr, control.token, i));
    let udp = match &plan.udp_load {
        Some((spec, pacing)) => {
            let (start, end) = (
                t0 + (plan.idle * 1e9) as u64,
                t0 + (plan.load_end() * 1e9) as u64,
            );
            Some(UdpLoad::start(
                control.addr,
                control.token,
                spec.clone(),
                *pacing,
                start,
                end,
                key.clone(),
            )?)
        }
        None => None,
    };
    let load = BulkLoad::new(
        control.addr,
        control.token,
        plan.flows.clone(),
        pings.clone(),
    );
    let progress = crate::display::Progress::new(opts.progress);
    let drain = Drain {
        answers: plan.answers,
        settle: plan.settle,
    };
    let schedule = Schedule::new(plan.idle, vec![plan.load], drain);
    let rpm = (params.test == TestKind::Rpm).then(|| RpmRamp::new(plan.idle, params.rpm_interval));
    let mut test = Test {
        params,
        plan,
        schedule,
        rpm,
        t0,
        meta,
        pings,
        probes,
        conn,
        udp,
        load,
        snapshots,
        progress,
    };
    let ended = test.drive(&control, opts);
    let end_t = test.elapsed();
    test.stop_and_drain(&ended, opts);
    let patience = Duration::from_secs(if test.udp.is_some() { 11 } else { 3 });
    let report = if matches!(ended, Ended::ServerLost(_)) {
        None
    } else {
        control.finish(patience)
    };
    test.finish(path, ended, end_t, report)
}

fn metadata(params: &Params, host: &str, control: &Control) -> Metadata {
    let server = Host {
        name: host.into(),
        address: Some(control.addr.to_string()),
        software: format!("bloatlab {}", control.server.version),
        kernel: control
            .server
            .kernel
            .clone()
            .unwrap_or_else(|| HIDDEN.into()),
        default_cc: control
            .server
            .default_cc
            .clone()
            .unwrap_or_else(|| HIDDEN.into()),
    };
    new_metadata(params, server)
}

/// This host as the client of a test.
pub(crate) fn this_host() -> Host {
    Host {
        name: netio::hostname(),
        address: None,
        software: format!("bloatlab {}", env!("CARGO_PKG_VERSION")),
        kernel: netio::kernel(),
        default_cc: netio::default_cc(),
    }
}

/// The metadata of a test that is not a bloatlab-protocol run (writeback, mtu): this host,
/// what it measured against, the parameters, the start time.
pub(crate) fn local_metadata(test: &str, params: serde_json::Value, server: Host) -> Metadata {
    Metadata {
        tool: "bloatlab".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        test: test.into(),
        params,
        client: this_host(),
        server,
        start_time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        ..Default::default()
    }
}

/// A test's metadata before it runs: this client, the given server and parameters.
pub(crate) fn new_metadata(params: &Params, server: Host) -> Metadata {
    Metadata {
        tool: "bloatlab".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        test: params.test.name().into(),
        params: serde_json::to_value(params).unwrap_or_default(),
        client: this_host(),
        server,
        cc: params.cc.clone(),
        start_time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        step: params.step,
        phases: Vec::new(),
        clock_offset: None,
        flows: Vec::new(),
        streams: Vec::new(),
        lab: None,
        rpm: None,
        rpm_by_direction: None,
        udp: None,
    }
}

/// Writes result snapshots on its own thread, so a slow disk never delays a sample.
struct Snapshots {
    tx: mpsc::Sender<ResultFile>,
    writer: std::thread::JoinHandle<()>,
}

impl Snapshots {
    fn start(path: PathBuf) -> Snapshots {
        let (tx, rx) = mpsc::channel::<ResultFile>();
        let writer = std::thread::spawn(move || {
            while let Ok(mut r) = rx.recv() {
                // Only the newest snapshot matters.
                while let Ok(newer) = rx.try_recv() {
                    r = newer;
                }
                let _ = result::write_atomic(&path, &r);
            }
        });
        Snapshots { tx, writer }
    }

    fn send(&self, r: ResultFile) {
        let _ = self.tx.send(r);
    }

    /// Waits until the last snapshot is on disk.
    fn finish(self) {
        drop(self.tx);
        let _ = self.writer.join();
    }
}

/// One running test: what it has opened and measured so far.
struct Test<'a> {
    params: &'a Params,
    plan: plan::Plan,
    /// Its phases: the plan's idle, load and settle, the load ending early when an RPM test
    /// has its answer and running on for the answers of its last probes.
    schedule: Schedule,
    rpm: Option<RpmRamp>,
    t0: u64,
    meta: Metadata,
    pings: Arc<PingLog>,
    probes: Vec<ProbeStream>,
    conn: Option<ConnProber>,
    udp: Option<UdpLoad>,
    load: BulkLoad,
    snapshots: Snapshots,
    progress: crate::display::Progress,
}

impl Test<'_> {
    fn elapsed(&self) -> f64 {
        (netio::mono_ns() - self.t0) as f64 / 1e9
    }

    /// When the load ends: the plan's, or earlier when an RPM test has its answer.
    fn load_end(&self) -> f64 {
        self.schedule.load_end()
    }

    /// When the test ends, as far as is known.
    fn total(&self) -> f64 {
        self.schedule.end()
    }

    /// Whether every probe sent under the load (RPM's pings and foreign probes) has its answer
    /// or is past its deadline.
    fn answered(&self) -> bool {
        self.pings.all_answered(netio::mono_ns())
            && self.conn.as_ref().is_none_or(|c| c.all_answered())
    }

    /// RPM: at the end of each of the draft's intervals, the goodput of that interval per
    /// direction and the responsiveness of the last MAD intervals' probes go to the ramp; once
    /// it has its answer, the load ends here.
    fn rpm_interval(&mut self, t: f64) {
        let Some(r) = self.rpm.as_ref() else { return };
        if !r.is_due(t) || t >= self.schedule.load_end() {
            return;
        }
        let bytes = [Direction::Down, Direction::Up].map(|d| self.load.bytes(d));
        let connect = self.conn.as_ref().map(|c| c.log.lock().unwrap());
        let probes = record::rpm_probes(
            self.t0,
            connect.as_deref().map_or(&[], Vec::as_slice),
            &self.pings,
            None,
        );
        drop(connect);
        let directions = bytes.iter().flatten().count();
        let open = self.load.flows.iter().filter(|f| !f.failed).count();
        let per_dir = (directions > 0).then(|| (open / directions) as u32);
        let r = self.rpm.as_mut().expect("an RPM test");
        if r.end_interval(t, bytes, &probes, per_dir) {
            self.schedule.end_stage(t);
        }
    }

    /// The main loop: opens flows as they fall due, samples every step, sends probes on loaded
    /// connections, shows progress and writes snapshots, until the plan ends or something stops it.
    fn drive(&mut self, control: &Control, opts: &RunOptions) -> Ended {
        let mut sample = Timer::new(self.params.step, self.params.step, Pace::GridSkip);
        let mut status = Timer::new(0.0, 0.25, Pace::FromNow);
        let mut snapshot = Timer::new(SNAPSHOT_EVERY, SNAPSHOT_EVERY, Pace::FromNow);
        let mut ping = self
            .plan
            .loaded_probe_interval
            .map(|iv| Timer::new(0.0, iv.as_secs_f64(), Pace::FromNow));
        let mut ping_id = 0u64;
        loop {
            let t = self.elapsed();
            let answered = self.schedule.awaits_answers(t) && self.answered();
            let phase = self.schedule.advance(t, answered);
            if phase == Period::Done {
                return Ended::Complete;
            }
            if opts.stop.load(Ordering::Relaxed) {
                return Ended::Interrupted;
            }
            if control.server_gone() {
                return Ended::ServerLost("the server closed the control connection".into());
            }
            let loading = phase == Period::Loading(0);
            match phase {
                Period::Loading(_) => match &self.rpm {
                    Some(r) => self.load.open_up_to(r.connections(), t),
                    None => self.load.open_due(t - self.plan.idle, t),
                },
                // The load runs on for the last answers; no probe is sent against it now.
                Period::Answering(_) => {
                    if let Some(c) = &self.conn {
                        c.stop_sending();
                    }
                }
                // Settling: the queues drain while the probe streams go on (second clock
                // estimate).
                Period::Settling(_) if self.plan.load > 0.0 => self.load.stop(t),
                _ => {}
            }
            let was_opening = self.load.opening() > 0;
            self.load.take_opened(t);
            // A fixed load's length runs from when its last flow came up (RPM's ramps on
            // purpose), within a connect's allowance: after that, a flow still opening failed.
            if loading
                && self.rpm.is_none()
                && was_opening
                && t < self.plan.idle + crate::control::CONNECT_TIMEOUT.as_secs_f64()
            {
                self.schedule.hold(t);
            }
            if sample.fire(t) {
                self.load.sample(t);
                self.rpm_interval(t);
            }
            if let Some(ping) = ping.as_mut().filter(|p| loading && p.is_due(t)) {
                if let Some(f) = self.load.running(ping_id + 1) {
                    ping_id += 1;
                    f.ping(ping_id, &self.pings);
                    ping.fire(t);
                }
            }
            if status.fire(t) {
                let st = self.status(t);
                self.progress.update(&st);
            }
            if snapshot.fire(t) {
                self.snapshots.send(self.snapshot(t, false, None));
            }
            // Sleep until the next thing is due (at most 5 ms): waking more often only takes CPU
            // from the flows, which on loopback is the bottleneck.
            let mut due = sample.next().min(snapshot.next()).min(status.next());
            if let Some(p) = &ping {
                due = due.min(p.next());
            }
            match &self.rpm {
                Some(r) => due = due.min(r.next()),
                None => {
                    if let Some(first) = self.load.next_due() {
                        due = due.min(self.plan.idle + first);
                    }
                }
            }
            std::thread::sleep(Duration::from_secs_f64(
                (due - self.elapsed()).clamp(0.000_2, 0.005),
            ));
        }
    }

    fn status(&self, t: f64) -> Status<'static> {
        let rtt = self.probes.first().and_then(|p| {
            let l = p.log.lock().unwrap();
            l.recs.iter().rev().find_map(|r| {
                r.reply
                    .map(|(t2, t3, t4)| ((t4 - r.t1) - (t3 - t2)) as f64 / 1e6)
            })
        });
        let stopped = self.schedule.stages().first().and_then(|s| s.stopped);
        let phase = if t < self.plan.idle || self.plan.load == 0.0 {
            "idle"
        } else if t < self.load_end() {
            "load"
        } else if stopped.is_none() {
            "last answers"
        } else {
            "settle"
        };
        Status {
            test: self.params.test.name(),
            phase,
            elapsed: t,
            total: self.total(),
            down_mbps: self.load.recent_mbps(Direction::Down, t, 0.5),
            up_mbps: match &self.udp {
                Some(u) => Some(u.recent_mbps(netio::mono_ns(), 0.5)),
                None => self.load.recent_mbps(Direction::Up, t, 0.5),
            },
            rtt_ms: rtt,
            opening: self.load.opening(),
        }
    }

    /// The result file as it stands at `t` seconds.
    fn snapshot(&self, t: f64, finished: bool, report: Option<&Report>) -> ResultFile {
        let mut meta = self.meta.clone();
        let mut phases = vec![Phase {
            name: "idle".into(),
            start: 0.0,
            end: self.plan.idle,
        }];
        if self.plan.load > 0.0 {
            phases.push(Phase {
                name: "load".into(),
                start: self.plan.idle,
                end: self.load_end(),
            });
            phases.push(Phase {
                name: "settle".into(),
                start: self.load_end(),
                end: self.total(),
            });
        }
        meta.phases = cut_phases(&phases, t);
        meta.set_param("load_connections", self.load.flows.len());
        meta.rpm = self.rpm.as_ref().map(|r| r.run().clone());
        let conn_log = self.conn.as_ref().map(|c| c.log.lock().unwrap().clone());
        record::build(
            &meta,
            &Live {
                t0: self.t0,
                now: netio::mono_ns(),
                idle_end: self.plan.idle,
                settle_start: (self.plan.settle > 0.0).then_some(self.load_end()),
                load_stopped: self.schedule.stages().first().and_then(|s| s.stopped),
                flows: &self.load.flows,
                failures: &self.load.failures,
                probes: &self.probes,
                connect: conn_log.as_deref(),
                rpm: self.params.test == TestKind::Rpm,
                pings: &self.pings,
                report,
                udp: self.udp.as_ref(),
                finished,
            },
        )
    }

    /// Stops the load, then gives the probes still in flight time to come back through the
    /// queues (twice the longest round trip seen, 1-6 s; 1 s when the test did not complete).
    fn stop_and_drain(&mut self, ended: &Ended, opts: &RunOptions) {
        self.load.stop(self.elapsed());
        if let Some(u) = self.udp.as_mut() {
            u.stop();
        }
        for p in &self.probes {
            p.stop_sending();
        }
        if let Some(c) = self.conn.as_mut() {
            c.stop();
        }
        let max_rtt = self
            .probes
            .iter()
            .flat_map(|p| {
                p.log
                    .lock()
                    .unwrap()
                    .recs
                    .iter()
                    .filter_map(|r| {
                        r.reply
                            .map(|(t2, t3, t4)| ((t4 - r.t1) - (t3 - t2)) as f64 / 1e9)
                    })
                    .collect::<Vec<_>>()
            })
            .fold(0.0, f64::max);
        let patience = if *ended == Ended::Complete {
            (2.0 * max_rtt + 0.5).clamp(1.0, 6.0)
        } else {
            1.0
        };
        let drain_end = self.elapsed() + patience;
        while self.elapsed() < drain_end
            && self.probes.iter().any(|p| p.outstanding() > 0)
            && !opts.stop.load(Ordering::Relaxed)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for p in self.probes.iter_mut() {
            p.stop();
        }
    }

    /// Writes the final result file (phases cut at `end_t`) and says how the test ended.
    fn finish(
        mut self,
        path: PathBuf,
        mut ended: Ended,
        end_t: f64,
        report: Option<Report>,
    ) -> Result<Outcome, MeasureError> {
        if ended == Ended::Complete && report.is_none() {
            ended = Ended::ServerLost("the server sent no final report".into());
        }
        let mut final_result = self.snapshot(end_t, true, report.as_ref());
        final_result.partial = ended != Ended::Complete;
        if let Some(s) = final_result.summary.as_mut() {
            s.partial = final_result.partial;
        }
        match &ended {
            Ended::Complete => {}
            Ended::Interrupted => final_result.events.push(result::Event {
                t: end_t,
                what: "interrupted by the user".into(),
            }),
            Ended::ServerLost(why) => final_result.events.push(result::Event {
                t: end_t,
                what: format!("server lost: {why}"),
            }),
            Ended::Failed(why) => final_result.events.push(result::Event {
                t: end_t,
                what: why.clone(),
            }),
        }
        self.progress.finish();
        self.snapshots.finish();
        result::write_atomic(&path, &final_result)?;
        Ok(Outcome {
            result: final_result,
            path,
            ended,
        })
    }
}

/// The phases as far as they happened by `t`.
fn cut_phases(phases: &[Phase], t: f64) -> Vec<Phase> {
    phases
        .iter()
        .filter(|p| p.start < t)
        .map(|p| Phase {
            end: p.end.min(t),
            ..p.clone()
        })
        .collect()
}
