//! Experiments that chain the lab, the measurement and the report: `lab demo` and
//! `lab compare`. The command line only parses arguments and calls these; tests call them too.
//! The measurement runs on a thread inside the lab's client namespace, the server on threads
//! inside its server namespace (`bloatlab_lab::ns::in_netns`): library calls, no processes.

pub mod cake_autorate_sh;
pub mod demo;
pub mod fix;
pub mod placement;
pub mod targets;
pub mod verify;
pub mod writeback_verify;

use bloatlab_lab::control;
use bloatlab_lab::instance::{LabError, LabInfo};
use bloatlab_lab::ns::in_netns;
use bloatlab_lab::{Lab, Topology};
use bloatlab_lab_model::config::DirConfig;
use bloatlab_lab_model::rate::Rate;
use bloatlab_measure::display::ProgressMode;
use bloatlab_measure::{Ended, Outcome, Params};
use bloatlab_report::{RunView, Section};
use bloatlab_result::{ResultFile, Summary};
pub use placement::{place, Fix, Setting};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct ExperimentOptions {
    /// The test each run makes (rrul, tcp-bidir, rpm, voip under load, ...); its length and
    /// idle phase are the experiment's.
    pub test: Params,
    /// Load phase of each run, seconds (after 5 s idle).
    pub length: f64,
    /// Where result files and the report go.
    pub out_dir: PathBuf,
    /// Name of the lab instance the experiment brings up.
    pub lab_name: String,
    pub quiet: bool,
    /// Set by Ctrl-C: the experiment stops after the run under way, tears the lab down and
    /// keeps what it measured.
    pub stop: Arc<AtomicBool>,
    /// A checkout of lynxthecat/cake-autorate, for `Fix::CakeAutorateSh`.
    pub cake_autorate: Option<PathBuf>,
}

/// One run of a comparison.
pub struct Run {
    pub fix: Fix,
    pub summary: Summary,
    pub file: PathBuf,
    /// Best-effort probes' round trip under load, p95, minus its idle median, ms.
    pub added_p95_ms: Option<f64>,
    /// With autorate: its log and how many changes it made.
    pub autorate: Option<(PathBuf, u64)>,
    /// The slowest link's mean rate over the load phase (down, up), bits per second: what the
    /// run could deliver at most (each run meets the line's trace or schedule from its start).
    pub capacity_bps: (f64, f64),
    /// What that link carried over the load phase (down, up) as a share of `capacity_bps`: every
    /// byte on its wire (goodput, the other way's ACKs, probes, headers), from the lab's
    /// counters.
    pub line_carried: (Option<f64>, Option<f64>),
    /// When this run's line started its trace or schedule again (Unix s).
    pub line_started_unix: f64,
}

pub struct Comparison {
    pub runs: Vec<Run>,
    /// The HTML report with every run overlaid, or why it could not be written.
    pub report: Result<PathBuf, String>,
    /// The experiment stopped early (Ctrl-C): `runs` holds what finished.
    pub interrupted: bool,
}

impl Comparison {
    /// The runs side by side, one column a fix.
    pub fn text(&self) -> String {
        let cols: Vec<(&str, &Summary)> = self
            .runs
            .iter()
            .map(|r| (r.fix.label(), &r.summary))
            .collect();
        let mut out = bloatlab_report::table::table(&cols);
        for r in &self.runs {
            let (cd, cu) = r.capacity_bps;
            let t = &r.summary.throughput_mbps;
            let share = |mbps: Option<f64>, cap: f64| {
                mbps.filter(|_| cap > 0.0)
                    .map_or("-".into(), |m| format!("{:.0}%", m * 1e6 / cap * 100.0))
            };
            let carried = |v: Option<f64>| v.map_or("-".into(), |v| format!("{:.0}%", v * 100.0));
            out += &format!(
                "{:<26} added p95 {:>7} ms; delivered {} down, {} up of the line's \
                 {:.1} / {:.1} Mbit/s (it carried {} / {}){}\n",
                r.fix.label(),
                r.added_p95_ms.map_or("-".into(), |v| format!("{v:.1}")),
                share(t.down, cd),
                share(t.up, cu),
                cd / 1e6,
                cu / 1e6,
                carried(r.line_carried.0),
                carried(r.line_carried.1),
                r.autorate
                    .as_ref()
                    .map_or(String::new(), |(_, n)| format!("; {n} rate changes"))
            );
        }
        out
    }

    /// `{"runs": [{"fix", "file", "summary", ...}, ...], "report": PATH or null}`.
    pub fn json(&self) -> String {
        let runs: Vec<serde_json::Value> = self
            .runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "fix": r.fix.name(),
                    "file": r.file,
                    "summary": r.summary,
                    "added_p95_ms": r.added_p95_ms,
                    "autorate_log": r.autorate.as_ref().map(|a| &a.0),
                    "rate_changes": r.autorate.as_ref().map(|a| a.1),
                    "capacity_bps": { "down": r.capacity_bps.0, "up": r.capacity_bps.1 },
                    "line_carried": { "down": r.line_carried.0, "up": r.line_carried.1 },
                })
            })
            .collect();
        let report = self.report.as_ref().ok();
        serde_json::to_string_pretty(&serde_json::json!({ "runs": runs, "report": report }))
            .expect("plain data")
    }
}

impl ExperimentOptions {
    fn say(&self, m: &str) {
        if !self.quiet {
            eprintln!("{m}");
        }
    }
}

/// Runs the test once per fix on the same emulated line, each fix placed as `place` says,
/// and writes one report with every run. Stops between runs on `stop`.
pub fn compare(topo: Topology, fixes: &[Fix], o: &ExperimentOptions) -> Result<Comparison, String> {
    for host in ["client", "server"] {
        if !topo.hosts.iter().any(|h| h == host) {
            return Err(format!(
                "topology `{}` has no host named `{host}`: the experiment tests \
                from `client` to `server`",
                topo.name
            ));
        }
    }
    // Every placement is checked before the lab goes up.
    let placements = fixes
        .iter()
        .map(|f| place(&topo, *f).map(|s| (*f, s)))
        .collect::<Result<Vec<_>, _>>()?;
    let topo_name = topo.name.clone();
    let line = placement::slowest(&topo)?;
    // The load phase after 5 s idle, as `run_test` makes it.
    let (from, to) = (5_000_000_000, ((5.0 + o.length) * 1e9) as u64);
    let rate = |r: &bloatlab_lab_model::rate::Rate| r.mean_between(from, to).unwrap_or(0) as f64;
    let capacity_bps = (rate(&line.down.rate), rate(&line.up.rate));
    let line_rates = (line.down.rate.clone(), line.up.rate.clone());
    let line_delays = (line.up.clone(), line.down.clone());
    let (router, line_name) = (line.a.clone(), line.name.clone());
    let moving_link = if fixes
        .iter()
        .any(|f| f.autorate_law().is_some() || matches!(f, Fix::CakeOracle | Fix::CakeAutorateSh))
    {
        let (front, up_dir) = placement::front(&topo)?;
        Some((
            front.name.clone(),
            up_dir,
            placement::autorate_bounds(&topo)?,
        ))
    } else {
        None
    };
    let peer_checkout = if fixes.contains(&Fix::CakeAutorateSh) {
        let dir = o.cake_autorate.as_deref().ok_or(
            "--fix cake-autorate-sh runs cake-autorate itself: give a checkout of \
             lynxthecat/cake-autorate with --cake-autorate DIR",
        )?;
        cake_autorate_sh::check(dir)?;
        Some(dir)
    } else {
        None
    };
    let (framing, far_host) = ((line.up.overhead, line.up.atm), line.b.clone());
    let session = Session::up(topo, o)?;
    if peer_checkout.is_some() {
        session.add_reflectors(&router, &far_host, &line_name)?;
    }
    let stamp = stamp();
    let mut runs = Vec::new();
    let mut failure = None;
    let touched = topo_links_touched(&placements);
    for (i, (fix, settings)) in placements.iter().enumerate() {
        if o.stop.load(Ordering::Relaxed) {
            break;
        }
        // Back to the line as the topology defines it, then this fix.
        let applied = (|| -> Result<(), String> {
            for l in &touched {
                session.lab.shared.restore(l)?;
            }
            for s in settings {
                session.lab.shared.set(&s.link, s.dir, &s.kv)?;
            }
            session.lab.shared.restart_rates(&line_name)
        })();
        let line_started_unix = bloatlab_netio::unix_now();
        if let Err(e) = applied {
            failure = Some(e);
            break;
        }
        let file = o.out_dir.join(format!(
            "bloatlab-{topo_name}-{}-{stamp}.json.gz",
            fix.name()
        ));
        o.say(&format!(
            "{}/{}: {} through `{topo_name}` with {} ({} s load after 5 s idle)",
            i + 1,
            placements.len(),
            test_label(&o.test),
            fix.label(),
            o.length
        ));
        // The lab's CAKE in front of the line, as autorate and the oracle move it.
        let lab_shaper =
            |(link, up_dir, _): &(String, &'static str, _)| bloatlab_autorate::shaper::Lab {
                socket: session.info.socket.clone(),
                lab: session.info.name.clone(),
                link: link.clone(),
                up_dir,
            };
        // Where the rate changes of whatever moves the shaper are logged.
        let changes_log = o.out_dir.join(format!(
            "bloatlab-{topo_name}-{}-{stamp}.autorate.jsonl",
            fix.name()
        ));
        let mover = match (fix.autorate_law(), &moving_link) {
            (Some(law), Some(front @ (_, _, (down, up)))) => {
                let cfg = bloatlab_autorate::Config::new(law, *down, *up);
                let log = changes_log.clone();
                Some(session.start_autorate(&router, lab_shaper(front), cfg, log, o.quiet))
            }
            _ => None,
        };
        let oracle = (*fix == Fix::CakeOracle).then(|| {
            let front = moving_link.as_ref().expect("placed in front of the line");
            oracle(lab_shaper(front), line_rates.clone(), line_started_unix)
        });
        let peer = match (*fix, &moving_link, peer_checkout) {
            (Fix::CakeAutorateSh, Some(front @ (lan, _, (down, up))), Some(checkout)) => {
                let launch = cake_autorate_sh::Launch {
                    checkout,
                    namespace: session.namespace(&router),
                    interfaces: cake_autorate_sh::Interfaces {
                        lan: lan.clone(),
                        wan: line_name.clone(),
                    },
                    down: *down,
                    up: *up,
                    overhead: framing.0,
                    atm: framing.1,
                    log: changes_log.clone(),
                    own_log: o.out_dir.join(format!(
                        "bloatlab-{topo_name}-{}-{stamp}.cake-autorate.log",
                        fix.name()
                    )),
                };
                match cake_autorate_sh::CakeAutorateSh::start(launch, lab_shaper(front)) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            _ => None,
        };
        let sampler = sample_line(session.info.socket.clone(), line_name.clone());
        let outcome = session.run_test(o, &file);
        let line_samples = sampler.finish("the line's sampler").unwrap_or_default();
        let oracle_ended = oracle
            .map(|t| t.finish("the oracle").and_then(|r| r))
            .transpose();
        let moved = match peer {
            Some(p) => p.finish().map(Some),
            None => mover.map(AutorateRun::finish).transpose(),
        };
        match (outcome, moved, oracle_ended) {
            (Ok(summary), Ok(autorate), Ok(_)) => {
                let result = bloatlab_result::read(&file).ok();
                let added_p95_ms = result
                    .as_ref()
                    .and_then(|r| added_p95(r, &line_delays, line_started_unix));
                let line_carried = result.as_ref().map_or((None, None), |r| {
                    line_carried(r, &line_samples, capacity_bps)
                });
                runs.push(Run {
                    fix: *fix,
                    summary,
                    file,
                    added_p95_ms,
                    autorate,
                    capacity_bps,
                    line_carried,
                    line_started_unix,
                })
            }
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                failure = Some(e);
                break;
            }
        }
    }
    drop(session);
    if let Some(e) = failure {
        if runs.is_empty() || !o.stop.load(Ordering::Relaxed) {
            return Err(e);
        }
    }
    let report = read_views(
        &runs
            .iter()
            .map(|r| (r.fix.label(), r.file.as_path()))
            .collect::<Vec<_>>(),
    )
    .and_then(|mut views| {
        for (v, r) in views.iter_mut().zip(&runs) {
            if let Some((log, _)) = &r.autorate {
                v.shaper = shaper_chart(v, r, log, &line_rates.0, &line_rates.1)?;
            }
        }
        let out = o
            .out_dir
            .join(format!("bloatlab-{topo_name}-compare-{stamp}.html"));
        write_views(&views, &[], &out)
    });
    Ok(Comparison {
        runs,
        report,
        interrupted: o.stop.load(Ordering::Relaxed),
    })
}

/// The lab under `name`, or, while another experiment's lab holds it, the first free of
/// `name-2` .. `name-9`: two `lab compare` (or `lab demo`) runs side by side each get a lab.
fn up_by_a_free_name(topo: Topology, name: &str) -> Result<Lab, String> {
    let mut n = 1;
    loop {
        let tried = if n == 1 {
            name.to_string()
        } else {
            format!("{name}-{n}")
        };
        match Lab::up(topo.clone(), &tried) {
            Err(LabError::Exists(_)) if n < 9 => n += 1,
            up => return up.map_err(|e| e.to_string()),
        }
    }
}

/// A lab that is up, with its control socket and a bloatlab server in host `server`; the
/// server is stopped and the lab torn down when this is dropped.
struct Session {
    lab: Lab,
    server: bloatlab_server::Server,
    info: LabInfo,
    /// The server's first IPv4 address.
    target: String,
}

impl Session {
    fn up(topo: Topology, o: &ExperimentOptions) -> Result<Session, String> {
        std::fs::create_dir_all(&o.out_dir).map_err(|e| format!("{}: {e}", o.out_dir.display()))?;
        let lab = up_by_a_free_name(topo, &o.lab_name)?;
        control::serve(
            lab.shared.clone(),
            &lab.info().socket.clone(),
            lab.stop_flag(),
            Arc::new(AtomicBool::new(false)),
        )
        .map_err(|e| format!("control socket: {e}"))?;
        let info = lab.info().clone();
        // Its tests are the experiment's own, however long (the 12 minutes of cable-evening's
        // cycle): the server's limit (180 s by default) follows them.
        let longest = Duration::from_secs_f64(o.length.max(0.0) + 60.0);
        let server = start_server(&info, "server", longest)?;
        let target = info.hosts["server"].ipv4[0].clone();
        Ok(Session {
            lab,
            server,
            info,
            target,
        })
    }

    /// The test (`o.test`) from the client host; its summary.
    fn run_test(&self, o: &ExperimentOptions, out: &Path) -> Result<Summary, String> {
        let mut params = o.test.clone();
        params.length = o.length;
        params.idle = 5.0;
        let opts = test_options(out, o.quiet, &o.stop);
        let socket = &self.info.socket;
        let tag = params.test.name();
        let outcome = in_netns(self.namespace("client"), || {
            let at_start = control::counters(socket).ok();
            let mut outcome = bloatlab_measure::run(&params, &self.target, &opts)
                .map_err(|e| format!("the {tag} run failed: {e}"))?;
            if let Err(e) = control::attach_counters(socket, &mut outcome.result, out, at_start) {
                eprintln!("bloatlab: {e}");
            }
            Ok::<_, String>(outcome)
        })??;
        summary_of(outcome, tag)
    }

    fn namespace(&self, host: &str) -> &str {
        &self.info.hosts[host].namespace
    }

    /// cake-autorate's reflectors: addresses on the line's far host `far`, which `router`
    /// reaches through the line (device `line`, named after it on both).
    fn add_reflectors(&self, router: &str, far: &str, line: &str) -> Result<(), String> {
        use bloatlab_lab::ns::ip;
        for a in cake_autorate_sh::reflector_addrs() {
            ip(&[
                "-n",
                self.namespace(far),
                "addr",
                "add",
                &format!("{a}/32"),
                "dev",
                line,
            ])?;
            ip(&[
                "-n",
                self.namespace(router),
                "route",
                "add",
                &format!("{a}/32"),
                "dev",
                line,
            ])?;
        }
        Ok(())
    }

    /// autorate on lab host `host` (the router), probing this session's server and moving
    /// the emulated CAKE, until the returned run is finished.
    fn start_autorate(
        &self,
        host: &str,
        shaper: bloatlab_autorate::shaper::Lab,
        controller: bloatlab_autorate::Config,
        log: PathBuf,
        quiet: bool,
    ) -> AutorateRun {
        let target = self.target.clone();
        let ns = self.namespace(host).to_string();
        let say: bloatlab_autorate::run::Say = Arc::new(move |m: &str| {
            if !quiet {
                eprintln!("autorate: {m}");
            }
        });
        let log_path = log.clone();
        let thread = Beside::spawn(move |stop| {
            let cfg = bloatlab_autorate::run::AutorateConfig {
                targets: vec![target],
                reflectors: Vec::new(),
                probe_rate: 20.0,
                key: None,
                controller,
                on_exit: bloatlab_autorate::run::OnExit::Last,
                log: Some(log_path),
                log_max: 0,
                metrics: None,
                stop,
            };
            in_netns(&ns, || {
                bloatlab_autorate::run::run(cfg, Box::new(shaper), say).map_err(|e| e.to_string())
            })?
        });
        AutorateRun { thread, log }
    }
}

/// A thread beside a run, handed the flag that stops it; stopped and waited for when finished
/// or dropped.
pub(crate) struct Beside<T> {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<T>>,
}

impl<T: Send + 'static> Beside<T> {
    pub(crate) fn spawn(work: impl FnOnce(Arc<AtomicBool>) -> T + Send + 'static) -> Beside<T> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        Beside {
            stop,
            thread: Some(std::thread::spawn(move || work(flag))),
        }
    }

    /// What it returned once stopped; `what` names it if it panicked.
    pub(crate) fn finish(mut self, what: &str) -> Result<T, String> {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.thread.take().expect("finished once");
        t.join().map_err(|_| format!("{what} panicked"))
    }
}

impl<T> Drop for Beside<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// autorate beside a run, and its log.
struct AutorateRun {
    thread: Beside<Result<bloatlab_autorate::run::Summary, String>>,
    log: PathBuf,
}

impl AutorateRun {
    /// Its log and the number of rate changes.
    fn finish(self) -> Result<(PathBuf, u64), String> {
        let s = self.thread.finish("autorate")??;
        Ok((self.log, s.changes))
    }
}

/// The best-effort probes' p95 round trip under load minus their idle median, ms. Where the
/// line's delay moves on a schedule (the slowest link's two directions, from the time the line
/// started), each round trip is taken over the line's delay at its time, so the figure is the
/// queues' and not the path's length changing.
fn added_p95(
    r: &ResultFile,
    (up, down): &(DirConfig, DirConfig),
    line_started_unix: f64,
) -> Option<f64> {
    let (idle, loaded) = bloatlab_analyze::summarize::class_rtt_samples(r, "be");
    let start = start_unix(r)?;
    // A fixed delay comes off idle and loaded alike, and cancels.
    let over_base = |v: Vec<(f64, f64)>| -> Vec<f64> {
        v.into_iter()
            .map(|(t, ms)| {
                let since = ((start + t - line_started_unix).max(0.0) * 1e9) as u64;
                ms - (up.delay_at(since) + down.delay_at(since)) as f64 / 1e6
            })
            .collect()
    };
    let (mut idle, mut loaded) = (over_base(idle), over_base(loaded));
    idle.sort_by(f64::total_cmp);
    loaded.sort_by(f64::total_cmp);
    if idle.is_empty() || loaded.is_empty() {
        return None;
    }
    let q = bloatlab_analyze::stats::quantile_sorted;
    Some(q(&loaded, 0.95) - q(&idle, 0.5))
}

/// The test's start (its metadata's RFC 3339 time), Unix seconds.
fn start_unix(r: &ResultFile) -> Option<f64> {
    let t = humantime::parse_rfc3339(&r.metadata.start_time).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// The oracle beside a run (`Fix::CakeOracle`): every 50 ms, CAKE each way at 95% of what the
/// line will carry over the next 100 ms by its schedule or trace (as it runs since
/// `started_unix`), changed when that moves by over 0.5%.
fn oracle(
    mut shaper: bloatlab_autorate::shaper::Lab,
    (down, up): (Rate, Rate),
    started_unix: f64,
) -> Beside<Result<(), String>> {
    use bloatlab_autorate::shaper::Shaper;
    use bloatlab_autorate::Direction;
    Beside::spawn(move |stop| {
        let mut set: [Option<u64>; 2] = [None, None];
        while !stop.load(Ordering::Relaxed) {
            let since = ((bloatlab_netio::unix_now() - started_unix).max(0.0) * 1e9) as u64;
            for (i, (dir, rate)) in [(Direction::Down, &down), (Direction::Up, &up)]
                .into_iter()
                .enumerate()
            {
                let Some(want) = placement::oracle_bps(rate, since) else {
                    continue;
                };
                if set[i].is_none_or(|was| was.abs_diff(want) * 200 > was) {
                    shaper.set(dir, want).map_err(|e| e.to_string())?;
                    set[i] = Some(want);
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    })
}

/// The lab's wire-byte counters of one link (down, up), read every 100 ms with the time (Unix
/// s) beside a run: what the line carried over exactly the load phase, which the counters in
/// the result file (read around the whole test) cannot give, as the senders' buffers drain
/// onto the line after the load has stopped.
fn sample_line(socket: PathBuf, line: String) -> Beside<Vec<(f64, u64, u64)>> {
    Beside::spawn(move |stop| {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if let Some(l) = control::counters(&socket)
                .ok()
                .and_then(|s| s.links.get(&line).cloned())
            {
                let now = bloatlab_netio::unix_now();
                samples.push((now, l.down.tx_wire_bytes, l.up.tx_wire_bytes));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        samples
    })
}

/// What the line carried each way (down, up) over the load phase of test `r`, as a share of
/// its `capacity_bps`: the sampled wire bytes at the phase's two ends (each between the two
/// readings around it, 100 ms apart), over the phase's length. None without a load phase
/// inside the samples.
fn line_carried(
    r: &ResultFile,
    samples: &[(f64, u64, u64)],
    capacity_bps: (f64, f64),
) -> (Option<f64>, Option<f64>) {
    let load = r.metadata.phases.iter().find(|p| p.name == "load");
    let Some((from, to)) = start_unix(r)
        .zip(load)
        .map(|(start, load)| (start + load.start, start + load.end))
    else {
        return (None, None);
    };
    let at = |t: f64, bytes: fn(&(f64, u64, u64)) -> u64| {
        let i = samples.iter().position(|s| s.0 >= t).filter(|&i| i > 0)?;
        let (a, b) = (&samples[i - 1], &samples[i]);
        let w = if b.0 > a.0 {
            (t - a.0) / (b.0 - a.0)
        } else {
            1.0
        };
        Some(bytes(a) as f64 + w * (bytes(b) as f64 - bytes(a) as f64))
    };
    let share = |bytes: fn(&(f64, u64, u64)) -> u64, cap: f64| {
        let carried = at(to, bytes)? - at(from, bytes)?;
        (cap > 0.0 && to > from).then(|| carried * 8.0 / (cap * (to - from)))
    };
    (
        share(|s| s.1, capacity_bps.0),
        share(|s| s.2, capacity_bps.1),
    )
}

impl Drop for Session {
    fn drop(&mut self) {
        self.server.stop();
    }
}

/// How a test the experiment runs writes and reports: to `out`, progress as lines on stderr
/// (or none), stopped by the experiment's Ctrl-C.
fn test_options(out: &Path, quiet: bool, stop: &Arc<AtomicBool>) -> bloatlab_measure::RunOptions {
    bloatlab_measure::RunOptions {
        output: Some(out.to_path_buf()),
        progress: if quiet {
            ProgressMode::Quiet
        } else {
            ProgressMode::Lines
        },
        stop: stop.clone(),
        key: None,
    }
}

/// A test's name as the progress lines say it (`voip under load`).
fn test_label(p: &Params) -> String {
    let name = p.test.name();
    if p.under_load {
        format!("{name} under load")
    } else {
        name.to_string()
    }
}

/// The links some fix changes: restored before each run so that runs do not inherit.
fn topo_links_touched(placements: &[(Fix, Vec<Setting>)]) -> Vec<String> {
    let mut links: Vec<String> = placements
        .iter()
        .flat_map(|(_, s)| s.iter().map(|s| s.link.clone()))
        .collect();
    links.sort();
    links.dedup();
    links
}

/// One HTML report of the labelled result files, with `sections` under the summary.
fn write_report(
    runs: &[(&str, &Path)],
    sections: &[Section],
    out: &Path,
) -> Result<PathBuf, String> {
    write_views(&read_views(runs)?, sections, out)
}

/// Each (label, result file)'s charts.
fn read_views(runs: &[(&str, &Path)]) -> Result<Vec<RunView>, String> {
    if runs.is_empty() {
        return Err("no run finished".into());
    }
    runs.iter()
        .map(|(label, file)| {
            bloatlab_result::read(file)
                .map(|f| RunView::new(&f, label))
                .map_err(|e| e.to_string())
        })
        .collect()
}

#[cfg(feature = "html")]
fn write_views(views: &[RunView], sections: &[Section], out: &Path) -> Result<PathBuf, String> {
    std::fs::write(out, bloatlab_report::html::render_with(views, sections))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out.to_path_buf())
}

/// A build without the HTML report (the router's) keeps the result files; a full build draws
/// them (`bloatlab report FILE...`).
#[cfg(not(feature = "html"))]
fn write_views(_: &[RunView], _: &[Section], _: &Path) -> Result<PathBuf, String> {
    Err(
        "this build has no HTML report: `bloatlab report` of the result files on a full build \
         draws it"
            .into(),
    )
}

/// A run with autorate: its shaper's rates over the line's capacity (per second of the trace
/// or schedule, as this run met it) and what the line carried, on the test's clock.
fn shaper_chart(
    view: &RunView,
    run: &Run,
    log: &Path,
    down: &bloatlab_lab_model::rate::Rate,
    up: &bloatlab_lab_model::rate::Rate,
) -> Result<Vec<bloatlab_report::view::Line>, String> {
    let (header, lines) = bloatlab_result::autorate::read(log)?
        .ok_or_else(|| format!("{}: not an autorate log", log.display()))?;
    let test_start = view
        .start_unix()
        .ok_or_else(|| format!("{}: no start time", run.file.display()))?;
    let end = view.phases.iter().map(|p| p.end).fold(0.0, f64::max);
    let since_line = test_start - run.line_started_unix;
    let capacity: Vec<(f64, f64, f64)> = (0..end.ceil() as u64)
        .map(|s| {
            let from = ((s as f64 + since_line).max(0.0) * 1e9) as u64;
            let at = |r: &bloatlab_lab_model::rate::Rate| {
                r.mean_between(from, from + 1_000_000_000).unwrap_or(0) as f64
            };
            (s as f64 + 0.5, at(down), at(up))
        })
        .collect();
    Ok(bloatlab_report::view::shaper_lines(
        &lines,
        header.started_unix - test_start,
        &capacity,
        end,
    ))
}

/// The summary of a test that ran to its end or to Ctrl-C; a test cut short by a failure
/// is an error naming the run by `tag`.
fn summary_of(outcome: Outcome, tag: &str) -> Result<Summary, String> {
    match outcome.ended {
        Ended::Complete | Ended::Interrupted => Ok(bloatlab_analyze::summary_of(&outcome.result)),
        Ended::ServerLost(why) | Ended::Failed(why) => Err(format!("the {tag} test failed: {why}")),
    }
}

fn stamp() -> String {
    let s = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    s.replace([':', '-'], "").trim_end_matches('Z').to_string()
}

/// Starts a bloatlab server in a lab host (port 9461, every address), serving on threads
/// inside its namespace.
fn start_server(
    info: &LabInfo,
    host: &str,
    longest: Duration,
) -> Result<bloatlab_server::Server, String> {
    let defaults = bloatlab_server::Config::default();
    let config = bloatlab_server::Config {
        listen: "[::]:9461".parse().expect("an address"),
        verbose: false,
        max_duration: defaults.max_duration.max(longest),
        ..defaults
    };
    in_netns(&info.hosts[host].namespace, || {
        bloatlab_server::Server::start(config)
    })?
    .map_err(|e| format!("the lab server did not start: {e}"))
}
