//! `bloatlab autorate`: arguments (and the same keys from a TOML file) and wiring.

use crate::{fail, load_key, usage};
use bloatlab_autorate::run::{AutorateConfig, OnExit};
use bloatlab_autorate::shaper::{self, Shaper};
use bloatlab_autorate::{Bounds, Config, Law};
use clap::{Args, ValueEnum};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LawArg {
    /// Ours: 10 ms over the baseline, cuts bounded by what the line delivers and by the
    /// rates that were safe, gentle probing above them.
    Bloatlab,
    /// cake-autorate's law and defaults (30 ms; re-implemented, for comparison).
    CakeAutorate,
}

#[derive(Clone, Copy, Debug, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnExitArg {
    /// Leave the last rate autorate set.
    Last,
    /// Put BASE back each way.
    Base,
}

/// The flags; a `--config` TOML file has the same keys (snake_case), less `config` and
/// `duration`.
#[derive(Args, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutorateArgs {
    /// A bloatlab server's HOST[:PORT], beyond the line: its UDP probes give one-way delay per
    /// direction (no ICMP, which routers may deprioritise or filter; works through NAT).
    /// Several, separated by commas, are probed in turn (the probes a second shared): each
    /// one's delays over its own baselines, and the rates follow the least of their latest, so
    /// a queue on one server's path beyond the line cuts nothing, and one server gone leaves
    /// the others. Optional with --reflectors.
    #[arg(value_name = "HOST[,HOST...]")]
    pub host: Option<String>,
    /// ICMP echo reflectors (comma-separated addresses, or `public`: anycast DNS resolvers of
    /// seven operators), followed while HOST does not answer, or alone. Six are pinged at a
    /// time; one that stops answering, or sits over 20 ms further or 10 ms noisier than the
    /// best, is replaced by a spare. A weaker signal: a round trip has no direction (the busier
    /// direction is cut), and routers may queue or rate-limit ICMP apart from other traffic.
    #[arg(long, value_name = "ADDR,ADDR,...|public")]
    pub reflectors: Option<String>,
    /// The WAN device with CAKE or HTB at its root: the upload's shaper; the download's is on
    /// --ifb (default ifb4DEV, as sqm-scripts names it, when it exists). `lab:NAME` (or
    /// `lab:NAME/LINK`): the emulated CAKE on a running lab's link.
    #[arg(long)]
    pub dev: Option<String>,
    /// The download's shaper device (an IFB redirecting the WAN's ingress).
    #[arg(long)]
    pub ifb: Option<String>,
    /// With HTB: the class whose rate and ceil move (default: the root HTB's only top class,
    /// as sqm-scripts' 1:1).
    #[arg(long, value_name = "MAJOR:MINOR")]
    pub htb_class: Option<String>,
    /// Download MIN:BASE:MAX (e.g. 10mbit:50mbit:80mbit): never below MIN or above MAX; BASE
    /// is where it starts and where it returns when the line is idle.
    #[arg(long, value_name = "MIN:BASE:MAX")]
    pub down: Option<String>,
    /// Upload MIN:BASE:MAX.
    #[arg(long, value_name = "MIN:BASE:MAX")]
    pub up: Option<String>,
    /// Probes (or, to reflectors, pings) per second (10-50; 20 by default).
    #[arg(long)]
    pub probe_rate: Option<f64>,
    #[arg(long, value_enum)]
    pub law: Option<LawArg>,
    /// No answers this long: both directions at MIN (default: hold the last rates that had no
    /// bloat until answers return).
    #[arg(long, value_parser = crate::monitor_cmd::duration)]
    #[serde(deserialize_with = "duration_key")]
    pub stall_to_min: Option<Duration>,
    /// What SIGTERM or Ctrl-C leaves the shaper at.
    #[arg(long, value_enum)]
    pub on_exit: Option<OnExitArg>,
    /// Run inside this network namespace (probes, counters and shaper alike).
    #[arg(long)]
    pub netns: Option<String>,
    /// A log of JSON lines (format "bloatlab-autorate-log"): every rate change, once a second
    /// the rates, load and delays.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// The log's size cap (default 4MB: five hours of an idle line, less under load; 0: none):
    /// at it the log moves to FILE.1, the one before dropped, and starts again (a router's
    /// tmpfs is RAM).
    #[arg(long, value_name = "SIZE")]
    pub log_max: Option<String>,
    /// Serve Prometheus gauges at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// The server's shared key (else BLOATLAB_KEY).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Stop after this long (default: until SIGTERM or Ctrl-C).
    #[arg(long, value_parser = crate::monitor_cmd::duration)]
    #[serde(skip)]
    pub duration: Option<Duration>,
    /// A TOML file with the same keys (host, reflectors, dev, ifb, htb_class, down, up,
    /// probe_rate, law, stall_to_min, on_exit, netns, log, log_max, metrics, key); flags win
    /// over it.
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
}

/// A file's `stall_to_min = "2m"`, read as the flag is.
fn duration_key<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    crate::monitor_cmd::duration(&s)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("stall_to_min {e}")))
}

/// Anycast DNS resolvers that answer ICMP echo, interleaved by operator so the six pinged at
/// a time belong to six operators (Cloudflare, Google, Quad9, OpenDNS, AdGuard, CleanBrowsing,
/// Neustar), the rest spares.
const PUBLIC_REFLECTORS: &[&str] = &[
    "1.1.1.1",
    "8.8.8.8",
    "9.9.9.9",
    "208.67.222.222",
    "94.140.14.14",
    "185.228.168.9",
    "1.0.0.1",
    "8.8.4.4",
    "149.112.112.112",
    "208.67.220.220",
    "94.140.15.15",
    "185.228.169.9",
    "64.6.64.6",
    "64.6.65.6",
];

/// `public`, or addresses separated by commas (no names: a name that resolves elsewhere later
/// would change the baseline under the controller).
pub fn reflectors(s: &str) -> Result<Vec<std::net::IpAddr>, String> {
    let list: Vec<&str> = match s.trim() {
        "public" => PUBLIC_REFLECTORS.to_vec(),
        s => s
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect(),
    };
    let mut out = Vec::new();
    for a in list {
        let ip = a.parse().map_err(|_| {
            format!(
                "--reflectors: `{}` is not an IP address (addresses separated by commas, \
                or `public`)",
                a.escape_debug()
            )
        })?;
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    if out.is_empty() {
        return Err("--reflectors: no address given".into());
    }
    Ok(out)
}

/// HOST[:PORT] of each bloatlab server, separated by commas (each at most once).
fn servers(s: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for h in s.split(',').map(str::trim) {
        if h.is_empty() {
            return Err(format!(
                "HOST `{}`: an empty name between commas",
                s.escape_debug()
            ));
        }
        if bloatlab_measure::is_url(h) {
            return Err(format!(
                "HOST `{}` is a URL: autorate probes bloatlab servers (HOST[:PORT])",
                h.escape_debug()
            ));
        }
        if !out.iter().any(|o| o == h) {
            out.push(h.to_string());
        }
    }
    Ok(out)
}

/// MIN:BASE:MAX, each with its unit.
pub fn bounds(s: &str) -> Result<Bounds, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let [min, base, max] = parts[..] else {
        return Err(format!(
            "`{s}`: want MIN:BASE:MAX, e.g. 10mbit:50mbit:80mbit"
        ));
    };
    let r = |x: &str| bloatlab_units::parse_rate(x).map(|v| v as f64);
    Bounds::new(r(min)?, r(base)?, r(max)?).map_err(|e| format!("`{s}`: {e}"))
}

/// The flags over the file's keys.
fn merged(mut a: AutorateArgs) -> Result<AutorateArgs, String> {
    let Some(path) = a.config.clone() else {
        return Ok(a);
    };
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("config {}: {e}", path.display()))?;
    let f: AutorateArgs = toml::from_str(&text).map_err(|e| {
        format!(
            "config {}: {}",
            path.display(),
            e.message().lines().next().unwrap_or("")
        )
    })?;
    // Every key named, so a new flag cannot be forgotten here (the destructuring is exhaustive).
    macro_rules! flag_or_file {
        ($($k:ident),*; skipped $($s:ident),*) => {
            let AutorateArgs { $($k,)* $($s: _,)* } = f;
            $(a.$k = a.$k.or($k);)*
        };
    }
    flag_or_file!(
        host, reflectors, dev, ifb, htb_class, down, up, probe_rate, law, stall_to_min, on_exit,
        netns, log, log_max, metrics, key; skipped config, duration
    );
    Ok(a)
}

/// `lab:NAME[/LINK]`: the running lab's control socket and the link whose CAKE autorate
/// moves (the one with CAKE both ways, unless named), its upload the direction CAKE does not
/// shape in ingress mode; and the namespace of the lab's router, where autorate runs.
fn lab_shaper(spec: &str) -> Result<(shaper::Lab, Option<String>), String> {
    let (name, link) = spec.split_once('/').unwrap_or((spec, ""));
    let info = bloatlab_lab::instance::running()
        .into_iter()
        .map(|(i, _)| i)
        .find(|i| i.name == name)
        .ok_or_else(|| format!("no running lab `{name}` (bloatlab lab list)"))?;
    let stats = bloatlab_lab::control::counters(&info.socket)?;
    let (link, l) = stats
        .links
        .iter()
        .find(|(n, l)| {
            if link.is_empty() {
                l.up.cake.is_some() && l.down.cake.is_some()
            } else {
                *n == link
            }
        })
        .ok_or_else(|| match link {
            "" => format!("lab `{name}` has no link with CAKE both ways: set one first"),
            _ => format!("lab `{name}` has no link `{link}`"),
        })?;
    let up_dir = if l.up.config.contains("ingress") {
        "down"
    } else {
        "up"
    };
    let ns = info.hosts.get("router").map(|h| h.namespace.clone());
    Ok((
        shaper::Lab {
            socket: info.socket.clone(),
            lab: name.into(),
            link: link.clone(),
            up_dir,
        },
        ns,
    ))
}

/// Why the arguments cannot run: nonsense (usage, exit 2) or a failure (exit 1).
enum Refusal {
    Usage(String),
    Fail(String),
}

/// What the arguments ask for, ready to run: the configuration, how to find the shaper, and
/// the namespace to run in.
struct Prepared {
    cfg: AutorateConfig,
    dev: String,
    ifb: Option<String>,
    class: Option<u32>,
    lab: Option<shaper::Lab>,
    netns: Option<String>,
}

impl Prepared {
    /// Finds the shaper (in the namespace it runs in).
    fn shaper(&self) -> Result<Box<dyn Shaper>, String> {
        Ok(match &self.lab {
            Some(l) => Box::new(l.clone()),
            None => Box::new(shaper::Kernel::find(
                &self.dev,
                self.ifb.as_deref(),
                self.class,
            )?),
        })
    }
}

fn say_line() -> bloatlab_autorate::run::Say {
    Arc::new(|line: &str| {
        let stamp = humantime::format_rfc3339_seconds(SystemTime::now());
        eprintln!("autorate: {stamp} {line}");
    })
}

/// The flags over the file's keys, checked; `host` when neither names one (the monitor's).
fn prepare(
    a: AutorateArgs,
    host: Option<&str>,
    stop: Arc<AtomicBool>,
) -> Result<Prepared, Refusal> {
    let mut a = merged(a).map_err(Refusal::Usage)?;
    a.host = a.host.or(host.map(Into::into));
    let need = |v: &Option<String>, what: &str| {
        v.clone()
            .ok_or_else(|| format!("autorate needs {what} (a flag, or the key in --config)"))
    };
    let parsed = (|| -> Result<_, String> {
        let reflectors = a.reflectors.as_deref().map(reflectors).transpose()?;
        let hosts = match (&a.host, &reflectors) {
            (None, None) => servers(&need(&a.host, "HOST or --reflectors")?)?,
            (Some(h), _) => servers(h)?,
            (None, Some(_)) => Vec::new(),
        };
        let dev = need(&a.dev, "--dev")?;
        let down =
            bounds(&need(&a.down, "--down MIN:BASE:MAX")?).map_err(|e| format!("--down {e}"))?;
        let up = bounds(&need(&a.up, "--up MIN:BASE:MAX")?).map_err(|e| format!("--up {e}"))?;
        let rate = a.probe_rate.unwrap_or(20.0);
        if !(10.0..=50.0).contains(&rate) {
            return Err(format!(
                "--probe-rate {rate}: want 10 to 50 probes per second"
            ));
        }
        let class = a
            .htb_class
            .as_deref()
            .map(shaper::parse_handle)
            .transpose()?;
        let log_max = bloatlab_units::parse_bytes(a.log_max.as_deref().unwrap_or("4MB"))
            .map_err(|e| format!("--log-max {e}"))?;
        let reflectors = reflectors.unwrap_or_default();
        Ok((hosts, reflectors, dev, down, up, rate, class, log_max))
    })();
    let (hosts, reflectors, dev, down, up, rate, class, log_max) =
        parsed.map_err(Refusal::Usage)?;
    let key = load_key(a.key.as_deref()).map_err(Refusal::Fail)?;
    let law = match a.law.unwrap_or(LawArg::Bloatlab) {
        LawArg::Bloatlab => Law::Bloatlab,
        LawArg::CakeAutorate => Law::CakeAutorate,
    };
    let mut controller = Config::new(law, down, up);
    controller.stall_to_min_ns = a.stall_to_min.map(|d| d.as_nanos() as u64);
    let (lab, lab_netns) = match dev.strip_prefix("lab:").map(lab_shaper).transpose() {
        Ok(Some((l, ns))) => (Some(l), ns),
        Ok(None) => (None, None),
        Err(e) => return Err(Refusal::Fail(e)),
    };
    let cfg = AutorateConfig {
        targets: hosts,
        reflectors,
        probe_rate: rate,
        key,
        controller,
        on_exit: match a.on_exit.unwrap_or(OnExitArg::Last) {
            OnExitArg::Last => OnExit::Last,
            OnExitArg::Base => OnExit::Base,
        },
        log: a.log,
        log_max,
        metrics: a.metrics,
        stop,
    };
    Ok(Prepared {
        cfg,
        dev,
        ifb: a.ifb,
        class,
        lab,
        netns: a.netns.or(lab_netns),
    })
}

/// `bloatlab monitor --autorate FILE`: autorate riding on the monitor's probes to `host`
/// (FILE's keys as `--config`'s; the monitor's target, face and process are its own).
pub fn rider(
    file: &std::path::Path,
    host: &str,
    stop: Arc<AtomicBool>,
) -> Result<Box<dyn bloatlab_measure::watch::Rider>, String> {
    let a = AutorateArgs {
        config: Some(file.to_path_buf()),
        ..AutorateArgs::default()
    };
    let p = match prepare(a, Some(host), stop) {
        Ok(p) => p,
        Err(Refusal::Usage(e) | Refusal::Fail(e)) => return Err(format!("--autorate: {e}")),
    };
    let refuse = |key: &str| format!("--autorate {}: `{key}` is the monitor's", file.display());
    if p.cfg.targets != [host] {
        return Err(refuse("host"));
    }
    if p.cfg.metrics.is_some() {
        return Err(refuse("metrics"));
    }
    if p.netns.is_some() {
        return Err(refuse("netns"));
    }
    let shaper = p.shaper().map_err(|e| format!("--autorate: {e}"))?;
    let a = bloatlab_autorate::run::Autorate::start(p.cfg, shaper, say_line())
        .map_err(|e| format!("--autorate: {e}"))?;
    Ok(Box::new(a))
}

pub fn autorate(a: AutorateArgs, stop: Arc<AtomicBool>) -> ExitCode {
    crate::ignore_sigpipe();
    let stop_at = a.duration;
    let p = match prepare(a, None, stop.clone()) {
        Ok(p) => p,
        Err(Refusal::Usage(e)) => return usage(e),
        Err(Refusal::Fail(e)) => return fail(e),
    };
    if let Some(limit) = stop_at {
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
    }
    let netns = p.netns.clone();
    let work = move || -> Result<(), String> {
        let shaper = p.shaper()?;
        bloatlab_autorate::run::run(p.cfg, shaper, say_line())
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let outcome = match netns {
        Some(ns) => bloatlab_lab::ns::in_netns(&ns, work).and_then(|r| r),
        None => work(),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}
