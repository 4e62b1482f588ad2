//! `bloatlab autorate`'s loop (shell): bloatlab's UDP probes in (one-way delays per
//! direction, answered ones at once), ICMP reflectors' round trips while no server answers,
//! the line's load from counters, the controller's rates out to the shaper; said once when the
//! server, the reflectors or the shaper go and come back; a log of JSON lines and Prometheus
//! gauges.

use crate::log::Log;
use crate::pinger::Pinger;
use crate::reflectors::Fault;
use crate::shaper::{Shaper, ShaperError};
use crate::{Config, Controller, Direction, Event, Sample, Why};
use bloatlab_measure::watch::{Rider, Sample as WatchSample, Watch};
use bloatlab_result::autorate::{LogHeader, LogLine, FORMAT, VERSION};
use bloatlab_server::metrics::{FGauge, UCounter};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Registry, Unit};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const MS: u64 = 1_000_000;
/// The loop wakes when a probe is due (samples reach the controller within one probe interval
/// of their answer), or this often while no session is open.
const STEP: Duration = Duration::from_millis(50);
/// The line's counters are read this often.
const LOAD_EVERY: u64 = 200 * MS;
/// Whether the shaper is still there is looked at this often.
const PRESENCE_EVERY: u64 = 5_000 * MS;
/// No answer from the server this long: the reflectors take over (before the controller's
/// stall, at a second, so a server gone does not hold the rates).
const SERVER_QUIET: u64 = 500 * MS;

pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// When the log's next tick line is due, after the one due at `due` was written at `now`: a
/// second on, or, for a loop held up past that, a whole second from `now` rather than a
/// catch-up line counting the few probes of the moment after.
fn next_line(due: u64, now: u64) -> u64 {
    let next = due + 1_000 * MS;
    if next <= now {
        now + 1_000 * MS
    } else {
        next
    }
}

/// What SIGTERM (the stop flag) leaves the shaper at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnExit {
    /// The last rate the controller set.
    Last,
    /// BASE each way.
    Base,
}

pub struct AutorateConfig {
    /// HOST[:PORT] of each bloatlab server probed (the probes a second shared among them);
    /// none: the reflectors alone.
    pub targets: Vec<String>,
    /// ICMP echo reflectors, followed while no server answers (in the order given: the first
    /// six at a time, the rest as spares).
    pub reflectors: Vec<IpAddr>,
    pub probe_rate: f64,
    pub key: Option<Vec<u8>>,
    pub controller: Config,
    pub on_exit: OnExit,
    pub log: Option<PathBuf>,
    /// The log's size cap, bytes (0: none): at it, the log moves to FILE.1.
    pub log_max: u64,
    pub metrics: Option<SocketAddr>,
    pub stop: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
pub enum AutorateError {
    #[error("{0}")]
    Shaper(String),
    #[error("{0}")]
    Measure(#[from] bloatlab_measure::MeasureError),
    #[error("reflectors: {0}")]
    Reflectors(std::io::Error),
    #[error("log {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub changes: u64,
    pub answered: u64,
    pub lost: u64,
}

type Labels = Vec<(&'static str, &'static str)>;

/// The registry and, per direction (down, up), handles to its series: the loop sets them
/// without looking a label set up.
struct Metrics {
    registry: Registry,
    rate: [FGauge; 2],
    load: [FGauge; 2],
    /// Per server (as in `targets`), each direction's.
    baseline: Vec<[FGauge; 2]>,
    delta: [FGauge; 2],
    changes: Family<Labels, UCounter>,
    /// Per direction, delays that cuts did not drain taken as the path's own.
    path_changes: [UCounter; 2],
    answered: UCounter,
    lost: UCounter,
    shaper_present: FGauge,
    following_reflectors: FGauge,
}

fn index(d: Direction) -> usize {
    match d {
        Direction::Down => 0,
        Direction::Up => 1,
    }
}

impl Metrics {
    /// `servers`: the bloatlab servers probed, each a label of its baselines.
    fn new(servers: &[String]) -> Metrics {
        let mut r = Registry::with_prefix("bloatlab_autorate");
        let family = |r: &mut Registry, name: &str, help: &str, unit: Unit| {
            let f = Family::<Labels, FGauge>::default();
            r.register_with_unit(name, help, unit, f.clone());
            let get = |d: &'static str| f.get_or_create(&vec![("direction", d)]).clone();
            [get("down"), get("up")]
        };
        let bps = || Unit::Other("bits_per_second".into());
        let rate = family(&mut r, "rate", "The shaper's rate autorate set", bps());
        let load = family(
            &mut r,
            "load",
            "What the line carried, from its counters",
            bps(),
        );
        let baselines = Family::<Vec<(&'static str, String)>, FGauge>::default();
        r.register_with_unit(
            "baseline_delay",
            "One-way delay's baseline to each server (its clock offset's error included)",
            Unit::Seconds,
            baselines.clone(),
        );
        let baseline = servers
            .iter()
            .map(|server| {
                let get = |d: &'static str| {
                    let labels = vec![("direction", d.to_string()), ("server", server.clone())];
                    baselines.get_or_create(&labels).clone()
                };
                [get("down"), get("up")]
            })
            .collect();
        let delta = family(
            &mut r,
            "delay_delta",
            "The last one-way delay above its baseline the rates followed (with several \
            servers, the least of theirs)",
            Unit::Seconds,
        );
        let changes = Family::<Labels, UCounter>::default();
        r.register(
            "rate_changes",
            "Rate changes by direction and why",
            changes.clone(),
        );
        for d in ["down", "up"] {
            for w in WHYS {
                changes
                    .get_or_create(&vec![("direction", d), ("why", w)])
                    .inc_by(0);
            }
        }
        let paths = Family::<Labels, UCounter>::default();
        r.register(
            "path_changes",
            "Delays that cuts below what the line carried did not drain, taken as the path's own \
            (its baseline moved)",
            paths.clone(),
        );
        let path = |d: &'static str| paths.get_or_create(&vec![("direction", d)]).clone();
        let path_changes = [path("down"), path("up")];
        let probes = Family::<Labels, UCounter>::default();
        r.register("probes", "Probes answered and lost", probes.clone());
        let answered = probes.get_or_create(&vec![("result", "answered")]).clone();
        let lost = probes.get_or_create(&vec![("result", "lost")]).clone();
        let shaper_present = FGauge::default();
        r.register(
            "shaper_present",
            "1 while the shaper is there to change, 0 once someone removed it",
            shaper_present.clone(),
        );
        let following_reflectors = FGauge::default();
        r.register(
            "following_reflectors",
            "1 while ICMP reflectors' round trips drive the rates (no bloatlab server answers)",
            following_reflectors.clone(),
        );
        Metrics {
            following_reflectors,
            registry: r,
            rate,
            load,
            baseline,
            delta,
            changes,
            path_changes,
            answered,
            lost,
            shaper_present,
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

const WHYS: [&str; 7] = [
    "bloat",
    "delivered",
    "safe floor",
    "floor test",
    "increase",
    "decay",
    "stall",
];

fn why_name(w: Why) -> &'static str {
    match w {
        Why::Bloat => WHYS[0],
        Why::Delivered => WHYS[1],
        Why::SafeFloor => WHYS[2],
        Why::FloorTest => WHYS[3],
        Why::Increase => WHYS[4],
        Why::Decay => WHYS[5],
        Why::Stall => WHYS[6],
    }
}

fn dir_name(d: Direction) -> &'static str {
    match d {
        Direction::Down => "down",
        Direction::Up => "up",
    }
}

/// The state the loop reports from.
struct Now {
    start_ns: u64,
    load: (f64, f64),
    delta: (Option<f64>, Option<f64>),
    rtt_delta: Option<f64>,
    answered: u64,
    lost: u64,
}

impl Now {
    /// A line at `now`; the tick line also restarts the probe counts.
    fn line(&mut self, ctl: &Controller, now: u64, event: &str) -> LogLine {
        let l = LogLine {
            t: now.saturating_sub(self.start_ns) as f64 / 1e9,
            event: event.into(),
            dir: None,
            why: None,
            down_bps: ctl.rate(Direction::Down),
            up_bps: ctl.rate(Direction::Up),
            down_load_bps: self.load.0,
            up_load_bps: self.load.1,
            down_delta_ms: self.delta.0,
            up_delta_ms: self.delta.1,
            rtt_delta_ms: self.rtt_delta,
            detail: None,
            answered: self.answered,
            lost: self.lost,
        };
        if event == "tick" {
            (self.answered, self.lost) = (0, 0);
        }
        l
    }
}

/// A server probed by [`run`]'s loop, with its own retries.
struct Server {
    watch: Watch,
    retry_at: u64,
    backoff: Duration,
    unreachable: bool,
}

/// Runs until `cfg.stop` is set, then leaves the shaper as `cfg.on_exit` says: its own probes
/// to `cfg.targets` drive an [`Autorate`].
pub fn run(
    cfg: AutorateConfig,
    shaper: Box<dyn Shaper>,
    say: Say,
) -> Result<Summary, AutorateError> {
    // The probes a second shared among the servers, each's a fraction of an interval after
    // the one before: one probe a wake-up, evenly spaced.
    let per_server = cfg.probe_rate / cfg.targets.len().max(1) as f64;
    let interval = (1e9 / cfg.probe_rate) as u64;
    let start = bloatlab_netio::mono_ns();
    let mut servers = Vec::new();
    for (i, t) in (0..).zip(&cfg.targets) {
        servers.push(Server {
            watch: Watch::new(t, per_server, cfg.key.clone())?
                .prompt()
                .driven()
                .first_probe_at(start + i * interval),
            retry_at: 0,
            backoff: Duration::from_secs(1),
            unreachable: false,
        });
    }
    let stop = cfg.stop.clone();
    let metrics_addr = cfg.metrics;
    let mut a = Autorate::start(cfg, shaper, say.clone())?;
    let _face = match metrics_addr {
        Some(addr) => {
            let face = bloatlab_server::metrics::serve(
                addr,
                bloatlab_server::metrics::MetricsLimits::default(),
                a.metrics(),
            )
            .map_err(|source| AutorateError::Metrics { addr, source })?;
            say(&format!("metrics on http://{}/metrics", face.addr));
            Some(face)
        }
        None => None,
    };
    while !stop.load(Ordering::Relaxed) {
        let now = bloatlab_netio::mono_ns();
        for (i, s) in servers.iter_mut().enumerate() {
            if now < s.retry_at {
                continue;
            }
            let name = &a.cfg.targets[i];
            match s.watch.poll() {
                Ok(samples) => {
                    if s.unreachable && s.watch.connected() {
                        s.unreachable = false;
                        s.backoff = Duration::from_secs(1);
                        say(&format!("{name} answers again"));
                    }
                    a.samples_from(now, i, &samples);
                }
                Err(e) => {
                    if !s.unreachable {
                        s.unreachable = true;
                        say(&format!("{name} does not answer: {e}; retrying"));
                    }
                    s.retry_at = now + s.backoff.as_nanos() as u64;
                    s.backoff = (s.backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        a.step(now);
        // One wake-up per probe: it takes the answers that came meanwhile (timed by the kernel
        // as they arrived) and sends the next; the counters are read on the wake-up due.
        let mut wake = servers
            .iter()
            .filter_map(|s| s.watch.next_due())
            .min()
            .unwrap_or(now + STEP.as_nanos() as u64);
        if let Some(due) = a.next_due() {
            wake = wake.min(due);
        }
        let left = wake.saturating_sub(bloatlab_netio::mono_ns());
        std::thread::sleep(Duration::from_nanos(left));
    }
    Ok(a.finish())
}

/// The controller at work on a shaper, fed the server's probes by whoever owns them (its own
/// loop in [`run`], or the monitor's, which then probes at autorate's rate for both), pinging
/// the reflectors itself while the server is quiet; applies the rates, logs, keeps the gauges.
pub struct Autorate {
    cfg: AutorateConfig,
    shaper: Box<dyn Shaper>,
    say: Say,
    log: Log,
    metrics: Arc<Metrics>,
    ctl: Controller,
    pinger: Option<Pinger>,
    st: Now,
    summary: Summary,
    /// The controller's events not yet applied.
    events: Vec<Event>,
    last_count: Option<(u64, u64, u64)>,
    next_load: u64,
    next_line: u64,
    gone: bool,
    next_presence: u64,
    counters_failed: bool,
    last_error: String,
    last_server: u64,
    following: bool,
    ping_failed: bool,
}

impl Autorate {
    /// Opens the log, sets BASE each way (an error here ends it: the shaper cannot be driven)
    /// and the reflectors' sockets.
    pub fn start(
        cfg: AutorateConfig,
        mut shaper: Box<dyn Shaper>,
        say: Say,
    ) -> Result<Autorate, AutorateError> {
        let c = &cfg.controller;
        let header = LogHeader {
            format: FORMAT.into(),
            version: VERSION,
            bloatlab_version: env!("CARGO_PKG_VERSION").into(),
            started_unix: bloatlab_netio::unix_now(),
            target: cfg.targets.join(", "),
            reflectors: cfg.reflectors.iter().map(ToString::to_string).collect(),
            shaper: shaper.describe(),
            law: match c.law {
                crate::Law::Bloatlab => "bloatlab",
                crate::Law::CakeAutorate => "cake-autorate",
            }
            .into(),
            down_bounds: [c.down.min, c.down.base, c.down.max],
            up_bounds: [c.up.min, c.up.base, c.up.max],
            probe_rate: cfg.probe_rate,
        };
        let log =
            Log::open(cfg.log.as_deref(), cfg.log_max, &header, say.clone()).map_err(|source| {
                AutorateError::Log {
                    path: cfg.log.clone().unwrap_or_default(),
                    source,
                }
            })?;
        let metrics = Arc::new(Metrics::new(&cfg.targets));
        let ctl = Controller::new(cfg.controller.clone());
        for d in [Direction::Down, Direction::Up] {
            let bps = ctl.rate(d);
            shaper
                .set(d, bps.round() as u64)
                .map_err(|e| AutorateError::Shaper(e.to_string()))?;
            metrics.rate[index(d)].set(bps);
        }
        metrics.shaper_present.set(1.0);
        let servers = cfg.targets.join(", ");
        let signal = match (cfg.targets.len(), cfg.reflectors.len()) {
            (0, n) => format!("pinging {} of {n} ICMP reflectors", n.min(6)),
            (1, 0) => format!("probing {servers}"),
            (_, 0) => format!("probing {servers} in turn"),
            (1, n) => format!("probing {servers} ({n} ICMP reflectors while it does not answer)"),
            (_, n) => format!("probing {servers} in turn ({n} ICMP reflectors while none answers)"),
        };
        say(&format!(
            "{}: {:.1} / {:.1} Mbit/s down/up to start; {signal} at {}/s",
            shaper.describe(),
            ctl.rate(Direction::Down) / 1e6,
            ctl.rate(Direction::Up) / 1e6,
            cfg.probe_rate
        ));
        let start_ns = bloatlab_netio::mono_ns();
        let pinger = match cfg.reflectors.is_empty() {
            true => None,
            false => {
                let p = Pinger::open(cfg.reflectors.clone(), cfg.probe_rate, start_ns)
                    .map_err(AutorateError::Reflectors)?;
                // Round trips are timed by the kernel's arrival stamps, on only once some
                // socket asked (a driven UDP stream makes sure of it for itself).
                bloatlab_netio::udp::ensure_rx_stamping(Duration::from_millis(200));
                Some(p)
            }
        };
        Ok(Autorate {
            shaper,
            say,
            log,
            metrics,
            ctl,
            pinger,
            st: Now {
                start_ns,
                load: (0.0, 0.0),
                delta: (None, None),
                rtt_delta: None,
                answered: 0,
                lost: 0,
            },
            summary: Summary::default(),
            events: Vec::new(),
            last_count: None,
            next_load: 0,
            next_line: start_ns + 1_000 * MS,
            gone: false,
            next_presence: start_ns + PRESENCE_EVERY,
            counters_failed: false,
            last_error: String::new(),
            last_server: start_ns,
            following: false,
            ping_failed: false,
            cfg,
        })
    }

    fn read_load(&mut self, now: u64) {
        match self.shaper.carried() {
            Ok((down, up)) => {
                if let Some((t, d0, u0)) = self.last_count {
                    let dt = now.saturating_sub(t).max(1) as f64 / 1e9;
                    self.st.load = (
                        down.saturating_sub(d0) as f64 * 8.0 / dt,
                        up.saturating_sub(u0) as f64 * 8.0 / dt,
                    );
                    self.ctl.on_load(self.st.load.0, self.st.load.1);
                    self.metrics.load[0].set(self.st.load.0);
                    self.metrics.load[1].set(self.st.load.1);
                }
                self.last_count = Some((now, down, up));
                self.counters_failed = false;
            }
            Err(e) if !self.counters_failed => {
                self.counters_failed = true;
                (self.say)(&format!(
                    "the line's counters: {e}; the load is unknown meanwhile"
                ));
            }
            Err(_) => {}
        }
    }

    /// While the server is quiet (or there is none): the reflectors' round trips.
    fn reflectors(&mut self, now: u64) {
        let Some(p) = self.pinger.as_mut() else {
            return;
        };
        let quiet =
            self.cfg.targets.is_empty() || now.saturating_sub(self.last_server) >= SERVER_QUIET;
        if quiet != self.following {
            self.following = quiet;
            self.metrics
                .following_reflectors
                .set(f64::from(u8::from(quiet)));
            // The other signal's last delays would read as current in the log.
            (self.st.delta, self.st.rtt_delta) = ((None, None), None);
            let event = if quiet {
                p.resume(now);
                let silent = match self.cfg.targets.len() {
                    0 => String::new(),
                    1 => format!("{} does not answer: ", self.cfg.targets[0]),
                    _ => format!("{} do not answer: ", self.cfg.targets.join(", ")),
                };
                let how = match silent.is_empty() {
                    true => "",
                    false => " (no direction of their own: the busier direction is cut)",
                };
                (self.say)(&format!(
                    "{silent}following ICMP reflectors' round trips{how}"
                ));
                "reflectors"
            } else {
                (self.say)("the server answers: following its one-way delays again");
                "server"
            };
            self.log.line(&self.st.line(&self.ctl, now, event));
        }
        if !self.following {
            return;
        }
        let (answers, lost) = match p.answers() {
            Ok(a) => a,
            Err(e) => {
                if !self.ping_failed {
                    self.ping_failed = true;
                    (self.say)(&format!("reading the reflectors' answers: {e}"));
                }
                (Vec::new(), 0)
            }
        };
        let cfg = &self.ctl.cfg;
        let high = self.st.load.0 >= cfg.high_load * self.ctl.rate(Direction::Down)
            || self.st.load.1 >= cfg.high_load * self.ctl.rate(Direction::Up);
        for a in answers {
            let Some(delta) = p.reflectors.on_reply(now, &a.from, a.rtt_ms, high) else {
                continue;
            };
            self.st.rtt_delta = Some(delta);
            self.st.answered += 1;
            self.summary.answered += 1;
            self.metrics.answered.inc();
            self.events.extend(self.ctl.on_round_trip(now, delta));
        }
        self.st.lost += lost;
        self.summary.lost += lost;
        self.metrics.lost.inc_by(lost);
        for r in p.check(now) {
            let why = match r.fault {
                Fault::Silent => "stopped answering",
                Fault::Far => "is over 20 ms further than the nearest",
                Fault::Noisy => "adds over 10 ms of its own",
            };
            let detail = format!("{} {why}: {} instead", r.old, r.new);
            (self.say)(&format!("reflector {detail}"));
            let mut line = self.st.line(&self.ctl, now, "reflector replaced");
            line.detail = Some(detail);
            self.log.line(&line);
        }
        match p.send_due(now) {
            Ok(()) => self.ping_failed = false,
            Err(e) if !self.ping_failed => {
                self.ping_failed = true;
                (self.say)(&format!("pinging a reflector: {e}"));
            }
            Err(_) => {}
        }
    }

    /// Someone may remove or replace the shaper between our changes: looked at now and then;
    /// once gone, left alone until it is back, then given the controller's rates.
    fn presence(&mut self, now: u64) {
        if now < self.next_presence {
            return;
        }
        self.next_presence = now + PRESENCE_EVERY;
        match (self.gone, self.shaper.present()) {
            (false, false) => {
                let why = format!(
                    "{} was removed or replaced: no longer changing it",
                    self.shaper.describe()
                );
                self.shaper_gone(now, &why);
            }
            (true, true) => {
                self.gone = false;
                self.metrics.shaper_present.set(1.0);
                (self.say)(&format!(
                    "{} is back: changing it again",
                    self.shaper.describe()
                ));
                self.log.line(&self.st.line(&self.ctl, now, "shaper back"));
                for d in [Direction::Down, Direction::Up] {
                    let _ = self.shaper.set(d, self.ctl.rate(d).round() as u64);
                }
            }
            _ => {}
        }
    }

    /// Someone else took the shaper: said once, left alone until it is back.
    fn shaper_gone(&mut self, now: u64, why: &str) {
        self.gone = true;
        self.metrics.shaper_present.set(0.0);
        (self.say)(why);
        self.log.line(&self.st.line(&self.ctl, now, "shaper gone"));
    }

    fn apply(&mut self, now: u64, ev: Event) {
        let (name, dir, why) = match ev {
            Event::Rate { dir, bps, why } => {
                self.metrics.rate[index(dir)].set(bps as f64);
                self.metrics
                    .changes
                    .get_or_create(&vec![("direction", dir_name(dir)), ("why", why_name(why))])
                    .inc();
                self.summary.changes += 1;
                if !self.gone {
                    match self.shaper.set(dir, bps) {
                        Ok(()) => self.last_error.clear(),
                        Err(ShaperError::Gone(e)) => self.shaper_gone(now, &e),
                        Err(ShaperError::Failed(e)) => {
                            if self.last_error != e {
                                (self.say)(&e);
                                self.last_error = e;
                            }
                        }
                    }
                }
                ("rate", Some(dir_name(dir)), Some(why_name(why)))
            }
            Event::PathLonger { dir, ms } => {
                self.metrics.path_changes[index(dir)].inc();
                let mut line = self.st.line(&self.ctl, now, "path");
                line.dir = Some(dir_name(dir).into());
                line.detail = Some(format!(
                    "{}: {ms:.1} ms that cuts below what the line carried did not drain taken as \
                     the path's own (the baseline rose by it)",
                    dir_name(dir)
                ));
                self.log.line(&line);
                return;
            }
            Event::Stalled => {
                (self.say)("no probe answered for a second: holding the last rates without bloat");
                ("stalled", None, None)
            }
            Event::StalledToMin => {
                (self.say)("still no answers: both directions at MIN");
                ("stalled to min", None, None)
            }
            Event::Recovered => {
                (self.say)("probes answer again");
                ("recovered", None, None)
            }
        };
        let mut line = self.st.line(&self.ctl, now, name);
        line.dir = dir.map(Into::into);
        line.why = why.map(Into::into);
        self.log.line(&line);
    }

    /// Server `source`'s probes (its index in `targets`) settled since the last call, at `now`
    /// (monotonic ns).
    pub fn samples_from(&mut self, now: u64, source: usize, samples: &[WatchSample]) {
        for s in samples {
            // A prompt watch's one-way delays (its offset kept across sessions).
            let (Some(up), Some(down)) = (s.owd_up_ms, s.owd_down_ms) else {
                self.st.lost += 1;
                self.summary.lost += 1;
                self.metrics.lost.inc();
                continue;
            };
            self.last_server = now;
            self.st.answered += 1;
            self.summary.answered += 1;
            self.metrics.answered.inc();
            let sample = Sample {
                down_ms: Some(down),
                up_ms: Some(up),
            };
            self.events.extend(self.ctl.on_sample(now, source, sample));
            for d in [Direction::Down, Direction::Up] {
                let i = index(d);
                // The delay the controller took (with several servers, the least of theirs).
                let delta = self.ctl.delta(d);
                match d {
                    Direction::Down => self.st.delta.0 = delta,
                    Direction::Up => self.st.delta.1 = delta,
                }
                if let Some(delta) = delta {
                    self.metrics.delta[i].set(delta / 1e3);
                }
                if let (Some(base), Some(gauges)) = (
                    self.ctl.baseline(d, source),
                    self.metrics.baseline.get(source),
                ) {
                    gauges[i].set(base / 1e3);
                }
            }
        }
    }

    /// Leaves the shaper as `on_exit` says, with the log's last line.
    pub fn finish(mut self) -> Summary {
        let now = bloatlab_netio::mono_ns();
        let base = (self.cfg.controller.down.base, self.cfg.controller.up.base);
        if self.cfg.on_exit == OnExit::Base && !self.gone {
            for (d, b) in [(Direction::Down, base.0), (Direction::Up, base.1)] {
                let _ = self.shaper.set(d, b.round() as u64);
            }
        }
        let mut line = self.st.line(&self.ctl, now, "exit");
        if self.cfg.on_exit == OnExit::Base {
            (line.down_bps, line.up_bps) = base;
        }
        self.log.line(&line);
        (self.say)(&format!(
            "stopped: {} rate changes; the shaper left at {:.1} / {:.1} Mbit/s down/up",
            self.summary.changes,
            line.down_bps / 1e6,
            line.up_bps / 1e6
        ));
        self.summary
    }
}

/// Fed by its own loop ([`run`]) or, inside `bloatlab monitor`, by the monitor's: its gauges
/// then join the monitor's.
impl Rider for Autorate {
    fn probe_rate(&self) -> f64 {
        self.cfg.probe_rate
    }

    /// The server's probes settled since the last call, at `now` (monotonic ns).
    fn samples(&mut self, now: u64, samples: &[WatchSample]) {
        self.samples_from(now, 0, samples);
    }

    /// Everything else due at `now`: the line's counters, the reflectors while the server is
    /// quiet, the controller's clock, whether the shaper is still there, the rates applied,
    /// the log's line a second.
    fn step(&mut self, now: u64) {
        if now >= self.next_load {
            self.next_load = now + LOAD_EVERY;
            self.read_load(now);
        }
        self.reflectors(now);
        let ticked = self.ctl.on_tick(now);
        self.events.extend(ticked);
        self.presence(now);
        for ev in std::mem::take(&mut self.events) {
            self.apply(now, ev);
        }
        if now >= self.next_line {
            self.next_line = next_line(self.next_line, now);
            self.log.line(&self.st.line(&self.ctl, now, "tick"));
        }
    }

    /// When it next needs a wake-up (its next ping, while it follows reflectors).
    fn next_due(&self) -> Option<u64> {
        self.pinger
            .as_ref()
            .filter(|_| self.following)
            .map(Pinger::next_due)
    }

    /// Its gauges as Prometheus text, for whichever face serves them.
    fn metrics(&self) -> Arc<dyn Fn() -> String + Send + Sync> {
        let m = self.metrics.clone();
        Arc::new(move || m.render())
    }

    fn finish(self: Box<Self>) {
        Autorate::finish(*self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_lines_keep_their_second_and_a_held_up_loop_does_not_catch_up() {
        // Written 20 ms late (a wake-up's lateness): the next keeps the grid.
        assert_eq!(next_line(1_000 * MS, 1_020 * MS), 2_000 * MS);
        // Held up 1.3 s: the next is a whole second after this one, not due at once.
        assert_eq!(next_line(1_000 * MS, 2_300 * MS), 3_300 * MS);
        assert_eq!(next_line(1_000 * MS, 2_000 * MS), 3_000 * MS);
    }
}
