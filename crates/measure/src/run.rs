//! Runs one test: handshake, idle phase, load phase, drain, report, result file.

use crate::connprobe::ConnProber;
use crate::control::Control;
use crate::display::{ProgressMode, Status};
use crate::flow::{FlowConn, PingLog};
use crate::plan::{self, Params, TestKind};
use crate::probe::ProbeStream;
use crate::record::{self, Live};
use crate::{target, MeasureError};
use bloatlab_netio as netio;
use bloatlab_proto::{Direction, TestRequest};
use bloatlab_result::{self as result, Host, Metadata, Phase, ResultFile};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

pub struct Options {
    /// Result file; `None` picks `bloatlab-TEST-TIMESTAMP.json.gz` in the current directory.
    pub output: Option<PathBuf>,
    pub progress: ProgressMode,
    /// Set by Ctrl-C: end the test early, keep what was measured.
    pub stop: Arc<AtomicBool>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    Complete,
    Interrupted,
    ServerLost(String),
}

pub struct Outcome {
    pub result: ResultFile,
    pub path: PathBuf,
    pub ended: Ended,
}

/// How often a snapshot of the result file is written during a test.
const SNAPSHOT_EVERY: f64 = 2.0;
/// RPM: a new load connection is only added while goodput still grows by this much per step.
const RPM_GROWTH: f64 = 1.05;

fn resolve(host_port: &str) -> Result<Vec<SocketAddr>, MeasureError> {
    let (host, port) = target::split_host_port(host_port, bloatlab_proto::DEFAULT_PORT)
        .map_err(|why| MeasureError::Resolve { host: host_port.into(), why })?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| MeasureError::Resolve { host: host.clone(), why: e.to_string() })?
        .collect();
    if addrs.is_empty() {
        return Err(MeasureError::Resolve { host, why: "no addresses".into() });
    }
    Ok(addrs)
}

fn default_output(test: &str) -> PathBuf {
    let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit() || *c == 'T').collect();
    PathBuf::from(format!("bloatlab-{test}-{}.json.gz", stamp.replace('T', "-")))
}

pub fn run(params: &Params, host: &str, opts: &Options) -> Result<Outcome, MeasureError> {
    let addrs = resolve(host)?;
    let plan = plan::plan(params);
    let request = TestRequest {
        test: params.test.name().into(),
        duration_ms: (plan.total() * 1000.0).ceil() as u64,
        flows: plan.flows.iter().map(|f| f.spec.clone()).collect(),
        streams: plan.streams.iter().map(|s| s.spec.clone()).collect(),
        connection_probes: plan.connect_probe_interval.is_some(),
    };
    let control = Control::open(&addrs, request)?;
    let addr = control.addr;
    let path = opts.output.clone().unwrap_or_else(|| default_output(params.test.name()));

    let mut meta = Metadata {
        tool: "bloatlab".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        test: params.test.name().into(),
        params: serde_json::to_value(params).unwrap_or_default(),
        client: Host {
            name: netio::hostname(),
            address: None,
            software: format!("bloatlab {}", env!("CARGO_PKG_VERSION")),
            kernel: netio::kernel(),
            default_cc: netio::default_cc(),
        },
        server: Host {
            name: host.into(),
            address: Some(addr.to_string()),
            software: format!("bloatlab {}", control.server.version),
            kernel: control.server.kernel.clone(),
            default_cc: control.server.default_cc.clone(),
        },
        cc: params.cc.clone(),
        start_time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        step: params.step,
        phases: Vec::new(),
        clock_offset: None,
        flows: Vec::new(),
        streams: Vec::new(),
        lab: None,
    };
    // The file exists from the first moment, so even an immediate kill leaves something readable.
    result::write_atomic(&path, &ResultFile::new(meta.clone()))?;

    let (snap_tx, snap_rx) = mpsc::channel::<ResultFile>();
    let snap_path = path.clone();
    let writer = std::thread::spawn(move || {
        while let Ok(mut r) = snap_rx.recv() {
            // Only the newest snapshot matters.
            while let Ok(newer) = snap_rx.try_recv() {
                r = newer;
            }
            let _ = result::write_atomic(&snap_path, &r);
        }
    });

    let mut progress = crate::display::Progress::new(opts.progress);
    let t0 = netio::mono_ns();
    let elapsed = || (netio::mono_ns() - t0) as f64 / 1e9;
    let pings = Arc::new(PingLog::default());
    let mut probes = Vec::new();
    for s in &plan.streams {
        probes.push(ProbeStream::start(addr, control.token, s.clone())?);
    }
    let mut conn = plan.connect_probe_interval.map(|i| ConnProber::start(addr, control.token, i));
    let mut flows: Vec<FlowConn> = Vec::new();
    let mut pending: Vec<plan::Flow> = plan.flows.clone();
    let is_rpm = params.test == TestKind::Rpm;
    let mut ramp_open = true;
    let mut last_ramp_goodput = 0.0;
    let mut next_ping = 0.0;
    let mut ping_id = 0u64;
    let mut next_sample = params.step;
    let mut last_sample_t = 0.0;
    let mut next_snapshot = SNAPSHOT_EVERY;
    let mut next_status = 0.0;
    let mut ended = Ended::Complete;
    let mut phases = vec![Phase { name: "idle".into(), start: 0.0, end: plan.idle }];
    if plan.load > 0.0 {
        phases.push(Phase { name: "load".into(), start: plan.idle, end: plan.total() });
    }

    let snapshot = |meta: &Metadata, flows: &[FlowConn], probes: &[ProbeStream], conn: &Option<ConnProber>, now: u64, finished: bool, report| {
        let conn_log = conn.as_ref().map(|c| c.log.lock().unwrap().clone());
        record::build(
            meta,
            &Live { t0, now, idle_end: plan.idle, flows, probes, connect: conn_log.as_deref(), rpm: is_rpm, pings: &pings, report, finished },
        )
    };

    loop {
        let t = elapsed();
        if t >= plan.total() {
            break;
        }
        if opts.stop.load(Ordering::Relaxed) {
            ended = Ended::Interrupted;
            break;
        }
        if control.server_gone() {
            ended = Ended::ServerLost("the server closed the control connection".into());
            break;
        }
        if flows.iter().any(|f| f.broken.load(Ordering::Relaxed)) {
            ended = Ended::ServerLost("a data connection was reset".into());
            break;
        }
        // Open flows whose time has come.
        let load_t = t - plan.idle;
        if load_t >= 0.0 && ramp_open {
            let due: Vec<plan::Flow> = pending.iter().filter(|f| f.start_after <= load_t).cloned().collect();
            if !due.is_empty() && is_rpm && !flows.is_empty() {
                // The draft adds load until goodput stops growing.
                let now_goodput: f64 = flows.iter().filter_map(|f| f.samples.last().and_then(|s| s.1)).sum();
                if now_goodput < last_ramp_goodput * RPM_GROWTH {
                    ramp_open = false;
                }
                last_ramp_goodput = now_goodput;
            }
            if ramp_open {
                pending.retain(|f| f.start_after > load_t);
                for f in due {
                    match FlowConn::open(addr, control.token, f, pings.clone()) {
                        Ok(c) => flows.push(c),
                        Err(e) => {
                            ended = Ended::ServerLost(format!("opening a flow failed: {e}"));
                            break;
                        }
                    }
                }
                if ended != Ended::Complete {
                    break;
                }
            }
        }
        // Opening flows can take long on a bloated path (each handshake waits in the queue):
        // sample with the time after it, or the bytes of that wait land in one short step.
        let t = elapsed();
        if t >= next_sample {
            let dt = (t - last_sample_t).max(1e-6);
            for f in flows.iter_mut() {
                f.sample(t, dt);
            }
            last_sample_t = t;
            next_sample += params.step;
            if next_sample < t {
                next_sample = t + params.step;
            }
        }
        if let Some(iv) = plan.loaded_probe_interval {
            if load_t >= 0.0 && t >= next_ping && !flows.is_empty() {
                ping_id += 1;
                flows[(ping_id as usize) % flows.len()].ping(ping_id, &pings);
                next_ping = t + iv.as_secs_f64();
            }
        }
        if t >= next_status {
            next_status = t + 0.25;
            let recent = |dir: Direction| -> Option<f64> {
                let v: Vec<f64> = flows
                    .iter()
                    .filter(|f| f.flow.spec.direction == dir)
                    .map(|f| {
                        let tail: Vec<f64> = f.samples.iter().rev().take_while(|s| s.0 > t - 0.5).filter_map(|s| s.1).collect();
                        if tail.is_empty() { 0.0 } else { tail.iter().sum::<f64>() / tail.len() as f64 }
                    })
                    .collect();
                (!v.is_empty()).then(|| v.iter().sum())
            };
            let rtt = probes.first().and_then(|p| {
                let l = p.log.lock().unwrap();
                l.recs.iter().rev().find_map(|r| r.reply.map(|(t2, t3, t4)| ((t4 - r.t1) - (t3 - t2)) as f64 / 1e6))
            });
            progress.update(&Status {
                test: params.test.name(),
                phase: if load_t >= 0.0 && plan.load > 0.0 { "load" } else { "idle" },
                elapsed: t,
                total: plan.total(),
                down_mbps: recent(Direction::Down),
                up_mbps: recent(Direction::Up),
                rtt_ms: rtt,
            });
        }
        if t >= next_snapshot {
            next_snapshot = t + SNAPSHOT_EVERY;
            meta.phases = cut_phases(&phases, t);
            meta.params["load_connections"] = flows.len().into();
            let _ = snap_tx.send(snapshot(&meta, &flows, &probes, &conn, netio::mono_ns(), false, None));
        }
        // Sleep until the next thing is due (at most 5 ms): waking more often only takes CPU
        // from the flows, which on loopback is the bottleneck.
        let mut due = next_sample.min(next_snapshot).min(next_status);
        if plan.loaded_probe_interval.is_some() {
            due = due.min(next_ping);
        }
        if let Some(first) = pending.iter().map(|f| f.start_after).reduce(f64::min).filter(|_| ramp_open) {
            due = due.min(plan.idle + first);
        }
        std::thread::sleep(Duration::from_secs_f64((due - elapsed()).clamp(0.000_2, 0.005)));
    }
    let end_t = elapsed();
    meta.phases = cut_phases(&phases, end_t);
    meta.params["load_connections"] = flows.len().into();

    // Stop the load, then give the probes still in flight time to come back through the queues.
    for f in flows.iter_mut() {
        f.stop();
    }
    for p in &probes {
        p.stop_sending();
    }
    if let Some(c) = conn.as_mut() {
        c.stop();
    }
    let max_rtt = probes
        .iter()
        .flat_map(|p| p.log.lock().unwrap().recs.iter().filter_map(|r| r.reply.map(|(t2, t3, t4)| ((t4 - r.t1) - (t3 - t2)) as f64 / 1e9)).collect::<Vec<_>>())
        .fold(0.0, f64::max);
    let patience = if ended == Ended::Complete { (2.0 * max_rtt + 0.5).clamp(1.0, 6.0) } else { 1.0 };
    let drain_end = elapsed() + patience;
    while elapsed() < drain_end && probes.iter().any(|p| p.outstanding() > 0) && !opts.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }
    for p in probes.iter_mut() {
        p.stop();
    }
    let lost = matches!(ended, Ended::ServerLost(_));
    let report = if lost { None } else { control.finish() };
    if ended == Ended::Complete && report.is_none() {
        ended = Ended::ServerLost("the server sent no final report".into());
    }
    let mut final_result = snapshot(&meta, &flows, &probes, &conn, netio::mono_ns(), true, report.as_ref());
    final_result.partial = ended != Ended::Complete;
    if let Some(s) = final_result.summary.as_mut() {
        s.partial = final_result.partial;
    }
    match &ended {
        Ended::Complete => {}
        Ended::Interrupted => final_result.events.push(result::Event { t: end_t, what: "interrupted by the user".into() }),
        Ended::ServerLost(why) => final_result.events.push(result::Event { t: end_t, what: format!("server lost: {why}") }),
    }
    drop(snap_tx);
    let _ = writer.join();
    result::write_atomic(&path, &final_result)?;
    progress.finish();
    Ok(Outcome { result: final_result, path, ended })
}

/// The phases as far as they happened by `t`.
fn cut_phases(phases: &[Phase], t: f64) -> Vec<Phase> {
    phases.iter().filter(|p| p.start < t).map(|p| Phase { end: p.end.min(t), ..p.clone() }).collect()
}
