//! `bloatlab autorate`'s loop (shell): bloatlab's UDP probes in (one-way delays per
//! direction, answered ones at once), ICMP reflectors' round trips while no server answers,
//! the line's load from counters, the controller's rates out to the shaper; said once when the
//! server, the reflectors or the shaper go and come back; a log of JSON lines and Prometheus
//! gauges.

use crate::log::Log;
use crate::oneway::OneWay;
use crate::pinger::Pinger;
use crate::reflectors::Fault;
use crate::shaper::{Shaper, ShaperError};
use crate::{Config, Controller, Direction, Event, Sample, Why};
use bloatlab_measure::watch::Watch;
use bloatlab_result::autorate::{LogHeader, LogLine, FORMAT, VERSION};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// What SIGTERM (the stop flag) leaves the shaper at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnExit {
    /// The last rate the controller set.
    Last,
    /// BASE each way.
    Base,
}

pub struct AutorateConfig {
    /// HOST[:PORT] of a bloatlab server; none: the reflectors alone.
    pub target: Option<String>,
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
type FGauge = Gauge<f64, AtomicU64>;

/// The registry and, per direction (down, up), handles to its series: the loop sets them
/// without looking a label set up.
struct Metrics {
    registry: Registry,
    rate: [FGauge; 2],
    load: [FGauge; 2],
    baseline: [FGauge; 2],
    delta: [FGauge; 2],
    changes: Family<Labels, Counter>,
    answered: Counter,
    lost: Counter,
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
    fn new() -> Metrics {
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
        let baseline = family(
            &mut r,
            "baseline_delay",
            "One-way delay's baseline (its clock offset's error included)",
            Unit::Seconds,
        );
        let delta = family(
            &mut r,
            "delay_delta",
            "The last one-way delay above its baseline",
            Unit::Seconds,
        );
        let changes = Family::<Labels, Counter>::default();
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
        let probes = Family::<Labels, Counter>::default();
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

/// Runs until `cfg.stop` is set, then leaves the shaper as `cfg.on_exit` says.
pub fn run(
    cfg: AutorateConfig,
    shaper: &mut dyn Shaper,
    say: Say,
) -> Result<Summary, AutorateError> {
    let c = &cfg.controller;
    let header = LogHeader {
        format: FORMAT.into(),
        version: VERSION,
        bloatlab_version: env!("CARGO_PKG_VERSION").into(),
        started_unix: bloatlab_netio::unix_now(),
        target: cfg.target.clone().unwrap_or_default(),
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
    let mut log =
        Log::open(cfg.log.as_deref(), cfg.log_max, &header, say.clone()).map_err(|source| {
            AutorateError::Log {
                path: cfg.log.clone().unwrap_or_default(),
                source,
            }
        })?;
    let metrics = Arc::new(Metrics::new());
    let _face = match cfg.metrics {
        Some(addr) => {
            let m = metrics.clone();
            let face = bloatlab_server::metrics::serve(
                addr,
                bloatlab_server::metrics::MetricsLimits::default(),
                Arc::new(move || m.render()),
            )
            .map_err(|source| AutorateError::Metrics { addr, source })?;
            say(&format!("metrics on http://{}/metrics", face.addr));
            Some(face)
        }
        None => None,
    };

    let mut ctl = Controller::new(cfg.controller.clone());
    for d in [Direction::Down, Direction::Up] {
        let bps = ctl.rate(d);
        shaper
            .set(d, bps.round() as u64)
            .map_err(|e| AutorateError::Shaper(e.to_string()))?;
        metrics.rate[index(d)].set(bps);
    }
    metrics.shaper_present.set(1.0);
    let signal = match (&cfg.target, cfg.reflectors.len()) {
        (Some(t), 0) => format!("probing {t}"),
        (Some(t), n) => format!("probing {t} ({n} ICMP reflectors while it does not answer)"),
        (None, n) => format!("pinging {} of {n} ICMP reflectors", n.min(6)),
    };
    say(&format!(
        "{}: {:.1} / {:.1} Mbit/s down/up to start; {signal} at {}/s",
        shaper.describe(),
        ctl.rate(Direction::Down) / 1e6,
        ctl.rate(Direction::Up) / 1e6,
        cfg.probe_rate
    ));

    let mut watch = match &cfg.target {
        Some(t) => Some(
            Watch::new(t, cfg.probe_rate, cfg.key.clone())?
                .prompt()
                .driven(),
        ),
        None => None,
    };
    let start_ns = bloatlab_netio::mono_ns();
    let mut pinger = match cfg.reflectors.is_empty() {
        true => None,
        false => {
            let p = Pinger::open(cfg.reflectors.clone(), cfg.probe_rate, start_ns)
                .map_err(AutorateError::Reflectors)?;
            // Round trips are timed by the kernel's arrival stamps, on only once some socket
            // asked (a driven UDP stream makes sure of it for itself).
            bloatlab_netio::udp::ensure_rx_stamping(Duration::from_millis(200));
            Some(p)
        }
    };
    let mut oneway = OneWay::default();
    let mut st = Now {
        start_ns,
        load: (0.0, 0.0),
        delta: (None, None),
        rtt_delta: None,
        answered: 0,
        lost: 0,
    };
    let mut last_server = start_ns;
    let mut following = false;
    let mut ping_failed = false;
    let mut summary = Summary::default();
    let mut last_count: Option<(u64, u64, u64)> = None;
    let mut next_load = 0;
    let mut next_line = start_ns + 1_000 * MS;
    let mut retry_at = 0;
    let mut backoff = Duration::from_secs(1);
    let mut unreachable = false;
    let mut gone = false;
    let mut next_presence = start_ns + PRESENCE_EVERY;
    let mut counters_failed = false;
    let mut last_error = String::new();
    while !cfg.stop.load(Ordering::Relaxed) {
        let now = bloatlab_netio::mono_ns();
        let mut events = Vec::new();
        if now >= next_load {
            next_load = now + LOAD_EVERY;
            match shaper.carried() {
                Ok((down, up)) => {
                    if let Some((t, d0, u0)) = last_count {
                        let dt = now.saturating_sub(t).max(1) as f64 / 1e9;
                        st.load = (
                            down.saturating_sub(d0) as f64 * 8.0 / dt,
                            up.saturating_sub(u0) as f64 * 8.0 / dt,
                        );
                        ctl.on_load(st.load.0, st.load.1);
                        metrics.load[0].set(st.load.0);
                        metrics.load[1].set(st.load.1);
                    }
                    last_count = Some((now, down, up));
                    counters_failed = false;
                }
                Err(e) if !counters_failed => {
                    counters_failed = true;
                    say(&format!(
                        "the line's counters: {e}; the load is unknown meanwhile"
                    ));
                }
                Err(_) => {}
            }
        }
        if let Some(watch) = watch.as_mut().filter(|_| now >= retry_at) {
            match watch.poll() {
                Ok(samples) => {
                    if unreachable && watch.connected() {
                        unreachable = false;
                        backoff = Duration::from_secs(1);
                        say(&format!(
                            "{} answers again",
                            cfg.target.as_deref().unwrap_or_default()
                        ));
                    }
                    for s in samples {
                        let Some(e) = s.echo else {
                            st.lost += 1;
                            summary.lost += 1;
                            metrics.lost.inc();
                            continue;
                        };
                        last_server = now;
                        st.answered += 1;
                        summary.answered += 1;
                        metrics.answered.inc();
                        let (up, down) = oneway.delays(e.t1, e.t2, e.t3, e.t4);
                        events.extend(ctl.on_sample(
                            now,
                            Sample {
                                down_ms: Some(down),
                                up_ms: Some(up),
                            },
                        ));
                        for (d, ms) in [(Direction::Down, down), (Direction::Up, up)] {
                            let base = ctl.baseline(d).unwrap_or(ms);
                            let delta = ms - base;
                            match d {
                                Direction::Down => st.delta.0 = Some(delta),
                                Direction::Up => st.delta.1 = Some(delta),
                            }
                            metrics.baseline[index(d)].set(base / 1e3);
                            metrics.delta[index(d)].set(delta / 1e3);
                        }
                    }
                }
                Err(e) => {
                    if !unreachable {
                        unreachable = true;
                        say(&format!(
                            "{} does not answer: {e}; retrying",
                            cfg.target.as_deref().unwrap_or_default()
                        ));
                    }
                    retry_at = now + backoff.as_nanos() as u64;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        if let Some(p) = pinger.as_mut() {
            let quiet = watch.is_none() || now.saturating_sub(last_server) >= SERVER_QUIET;
            if quiet != following {
                following = quiet;
                metrics
                    .following_reflectors
                    .set(f64::from(u8::from(following)));
                // The other signal's last delays would read as current in the log.
                (st.delta, st.rtt_delta) = ((None, None), None);
                let event = if following {
                    p.resume(now);
                    say(&match &cfg.target {
                        Some(t) => format!(
                            "{t} does not answer: following ICMP reflectors' round trips \
                            (no direction of their own: the busier direction is cut)"
                        ),
                        None => "following ICMP reflectors' round trips".into(),
                    });
                    "reflectors"
                } else {
                    say("the server answers: following its one-way delays again");
                    "server"
                };
                log.line(&st.line(&ctl, now, event));
            }
            if following {
                let (answers, lost) = p.answers().map_err(AutorateError::Reflectors)?;
                let high = st.load.0 >= ctl.cfg.high_load * ctl.rate(Direction::Down)
                    || st.load.1 >= ctl.cfg.high_load * ctl.rate(Direction::Up);
                for a in answers {
                    let Some(delta) = p.reflectors.on_reply(now, &a.from, a.rtt_ms, high) else {
                        continue;
                    };
                    st.rtt_delta = Some(delta);
                    st.answered += 1;
                    summary.answered += 1;
                    metrics.answered.inc();
                    events.extend(ctl.on_round_trip(now, delta));
                }
                st.lost += lost;
                summary.lost += lost;
                metrics.lost.inc_by(lost);
                for r in p.check(now) {
                    let why = match r.fault {
                        Fault::Silent => "stopped answering",
                        Fault::Far => "is over 20 ms further than the nearest",
                        Fault::Noisy => "adds over 10 ms of its own",
                    };
                    let detail = format!("{} {why}: {} instead", r.old, r.new);
                    say(&format!("reflector {detail}"));
                    let mut line = st.line(&ctl, now, "reflector replaced");
                    line.detail = Some(detail);
                    log.line(&line);
                }
                match p.send_due(now) {
                    Ok(()) => ping_failed = false,
                    Err(e) if !ping_failed => {
                        ping_failed = true;
                        say(&format!("pinging a reflector: {e}"));
                    }
                    Err(_) => {}
                }
            }
        }
        events.extend(ctl.on_tick(now));

        // Someone may remove or replace the shaper between our changes: looked at now and
        // then; once gone, left alone until it is back, then given the controller's rates.
        if now >= next_presence {
            next_presence = now + PRESENCE_EVERY;
            match (gone, shaper.present()) {
                (false, false) => {
                    gone = true;
                    metrics.shaper_present.set(0.0);
                    say(&format!(
                        "{} was removed or replaced: no longer changing it",
                        shaper.describe()
                    ));
                    log.line(&st.line(&ctl, now, "shaper gone"));
                }
                (true, true) => {
                    gone = false;
                    metrics.shaper_present.set(1.0);
                    say(&format!("{} is back: changing it again", shaper.describe()));
                    log.line(&st.line(&ctl, now, "shaper back"));
                    for d in [Direction::Down, Direction::Up] {
                        let _ = shaper.set(d, ctl.rate(d).round() as u64);
                    }
                }
                _ => {}
            }
        }
        for ev in events {
            let (name, dir, why) = match ev {
                Event::Rate { dir, bps, why } => {
                    metrics.rate[index(dir)].set(bps as f64);
                    metrics
                        .changes
                        .get_or_create(&vec![("direction", dir_name(dir)), ("why", why_name(why))])
                        .inc();
                    summary.changes += 1;
                    if !gone {
                        match shaper.set(dir, bps) {
                            Ok(()) => last_error.clear(),
                            Err(ShaperError::Gone(e)) => {
                                gone = true;
                                metrics.shaper_present.set(0.0);
                                say(&e);
                                log.line(&st.line(&ctl, now, "shaper gone"));
                            }
                            Err(ShaperError::Failed(e)) => {
                                if last_error != e {
                                    say(&e);
                                    last_error = e;
                                }
                            }
                        }
                    }
                    ("rate", Some(dir_name(dir)), Some(why_name(why)))
                }
                Event::Stalled => {
                    say("no probe answered for a second: holding the last rates without bloat");
                    ("stalled", None, None)
                }
                Event::StalledToMin => {
                    say("still no answers: both directions at MIN");
                    ("stalled to min", None, None)
                }
                Event::Recovered => {
                    say("probes answer again");
                    ("recovered", None, None)
                }
            };
            let mut line = st.line(&ctl, now, name);
            line.dir = dir.map(Into::into);
            line.why = why.map(Into::into);
            log.line(&line);
        }
        if now >= next_line {
            next_line += 1_000 * MS;
            log.line(&st.line(&ctl, now, "tick"));
        }
        // One wake-up per probe: it takes the answers that came meanwhile (timed by the kernel
        // as they arrived) and sends the next; the counters are read on the wake-up due.
        let mut wake = watch
            .as_ref()
            .and_then(Watch::next_due)
            .unwrap_or(now + STEP.as_nanos() as u64);
        if let Some(p) = pinger.as_ref().filter(|_| following) {
            wake = wake.min(p.next_due());
        }
        let left = wake.saturating_sub(bloatlab_netio::mono_ns());
        std::thread::sleep(Duration::from_nanos(left));
    }
    let now = bloatlab_netio::mono_ns();
    if cfg.on_exit == OnExit::Base && !gone {
        for (d, b) in [
            (Direction::Down, cfg.controller.down.base),
            (Direction::Up, cfg.controller.up.base),
        ] {
            let _ = shaper.set(d, b.round() as u64);
        }
    }
    let mut line = st.line(&ctl, now, "exit");
    if cfg.on_exit == OnExit::Base {
        (line.down_bps, line.up_bps) = (cfg.controller.down.base, cfg.controller.up.base);
    }
    log.line(&line);
    say(&format!(
        "stopped: {} rate changes; the shaper left at {:.1} / {:.1} Mbit/s down/up",
        summary.changes,
        line.down_bps / 1e6,
        line.up_bps / 1e6
    ));
    Ok(summary)
}
