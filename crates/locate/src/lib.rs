//! `bloatlab locate`: which hop of a path holds the queue that bloats it, and in which
//! direction. Runs a test per load phase (download, upload, both) against a bloatlab server
//! while probing every hop with TTL-limited UDP (`bloatlab_measure::hops`) and sampling this
//! host's own interface queue, then gives the verdict (`verdict`, pure).

pub mod observe;
pub mod table;
pub mod verdict;

use bloatlab_measure::hops::{HopConfig, HopProbe, HopProber};
use bloatlab_measure::localq::{LocalQueue, LocalQueueSampler};
use bloatlab_measure::{Ended, Params, TestKind};
use bloatlab_result::Summary;
use observe::Windows;
use serde::Serialize;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};
pub use verdict::{Direction, Load, Verdict};

pub const FORMAT: &str = "bloatlab-locate";
pub const VERSION: u32 = 1;

/// How long reverse lookups of the hops may take, all together.
const NAME_DEADLINE: Duration = Duration::from_secs(1);

/// Reverse names of the hops' addresses, looked up in parallel; those not back by the
/// deadline are left out (their threads finish on their own).
fn names(addrs: &[IpAddr]) -> std::collections::HashMap<IpAddr, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    for &a in addrs {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let _ = tx.send((a, bloatlab_netio::icmp::reverse_name(a)));
        });
    }
    drop(tx);
    let until = std::time::Instant::now() + NAME_DEADLINE;
    let mut out = std::collections::HashMap::new();
    while let Ok((a, n)) =
        rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now()))
    {
        if let Some(n) = n {
            out.insert(a, n);
        }
    }
    out
}

/// Seconds of each load phase skipped while the queues fill (as the test summaries do).
const RAMP: f64 = 2.0;

/// One test per load phase: `flows` TCP flows per loaded direction for `length` s after
/// `idle` s (the first phase idles 2 s more, while the hops' first answers come in), probes
/// marked EF.
pub fn phase_tests(loads: &[Load], length: f64, idle: f64, flows: u16) -> Vec<(Load, Params)> {
    loads
        .iter()
        .enumerate()
        .map(|(i, &load)| {
            let test = match load {
                Load::Download => TestKind::TcpDown,
                Load::Upload => TestKind::TcpUp,
                Load::Both => TestKind::TcpBidir,
            };
            let params = Params {
                length,
                idle: if i == 0 { idle + 2.0 } else { idle },
                flows,
                ..Params::new(test)
            };
            (load, params)
        })
        .collect()
}

pub struct Options {
    /// Where the locate file and each phase's result file go.
    pub out_dir: PathBuf,
    /// Passed to every phase's test (progress, Ctrl-C, key; its `output` names the result
    /// file when there is one phase).
    pub test: bloatlab_measure::Options,
    pub max_hops: u8,
    /// Time between two probes of one hop.
    pub hop_interval: Duration,
    /// ICMP echo probes (ping socket) instead of UDP.
    pub icmp: bool,
    /// Say what runs on stderr.
    pub verbose: bool,
}

/// One hop as reported: answers, idle p50 and loaded p50/p90 per phase.
#[derive(Clone, Debug, Serialize)]
pub struct HopReport {
    pub ttl: u8,
    pub address: Option<IpAddr>,
    /// The address's reverse name, when a lookup answered within `NAME_DEADLINE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub destination: bool,
    pub answered: u32,
    pub sent: u32,
    pub idle_p50_ms: Option<f64>,
    pub phases: PhaseStats,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download: Option<Loaded>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<Loaded>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub both: Option<Loaded>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Loaded {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub answered: usize,
}

/// One load phase's test.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseRun {
    pub load: Load,
    pub test: String,
    pub file: PathBuf,
    pub added_latency_ms: Option<f64>,
    pub throughput_down_mbps: Option<f64>,
    pub throughput_up_mbps: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Meta {
    pub tool: String,
    pub tool_version: String,
    pub target: String,
    pub address: IpAddr,
    pub start_time: String,
    pub hop_interval_s: f64,
    pub max_hops: u8,
    /// "udp" or "icmp".
    pub probes: String,
}

/// The locate file: versioned, with every raw probe and queue sample.
#[derive(Clone, Debug, Serialize)]
pub struct Located {
    pub format: String,
    pub version: u32,
    pub metadata: Meta,
    pub phases: Vec<PhaseRun>,
    pub hops: Vec<HopReport>,
    pub local: Option<LocalQueue>,
    pub verdict: Verdict,
    /// True while running, and when a phase failed or Ctrl-C ended it early.
    pub partial: bool,
    pub probes: Vec<HopProbe>,
}

fn loaded(v: &[f64]) -> Option<Loaded> {
    let p = bloatlab_analyze::stats::percentiles(v.iter().copied())?;
    Some(Loaded {
        p50_ms: p.p50,
        p90_ms: p.p90,
        answered: p.samples,
    })
}

fn hop_reports(hops: &[verdict::HopObs]) -> Vec<HopReport> {
    let names = names(&hops.iter().filter_map(|h| h.address).collect::<Vec<_>>());
    hops.iter()
        .map(|h| HopReport {
            ttl: h.ttl,
            address: h.address,
            name: h.address.and_then(|a| names.get(&a).cloned()),
            destination: h.destination,
            answered: h.answered,
            sent: h.sent,
            idle_p50_ms: bloatlab_analyze::stats::percentiles(h.idle.iter().copied())
                .map(|p| p.p50),
            phases: PhaseStats {
                download: loaded(&h.loaded[0]),
                upload: loaded(&h.loaded[1]),
                both: loaded(&h.loaded[2]),
            },
        })
        .collect()
}

/// Idle and loaded windows of a finished test, in wall-clock seconds.
fn windows(r: &bloatlab_result::ResultFile, load: Load) -> Option<Windows> {
    let start = humantime::parse_rfc3339(&r.metadata.start_time)
        .ok()?
        .duration_since(SystemTime::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    let phase = |n: &str| r.metadata.phases.iter().find(|p| p.name == n);
    let idle = phase("idle")?;
    let l = phase("load")?;
    let ramp = RAMP.min((l.end - l.start) / 2.0);
    Some(Windows {
        load,
        idle: (
            start + idle.start + 0.5_f64.min(idle.end / 2.0),
            start + idle.end,
        ),
        loaded: (start + l.start + ramp, start + l.end),
        up_mbps: r.summary.as_ref().and_then(|s| s.throughput_mbps.up),
    })
}

/// The end-to-end numbers the verdict uses, from the tests' summaries.
fn end_to_end(runs: &[(Load, Summary)]) -> verdict::EndToEnd {
    let mut e = verdict::EndToEnd::default();
    for (load, s) in runs {
        e.added_ms[*load as usize] = s.added_latency_ms;
        if *load == Load::Both {
            if let (Some(d), Some(u)) = (&s.added_owd_ms.down, &s.added_owd_ms.up) {
                e.owd_added_ms = Some((d.p50, u.p50));
            }
        }
    }
    e
}

fn resolve(host: &str) -> Result<(String, IpAddr), String> {
    let (h, port) = bloatlab_measure::target::split_host_port(host, bloatlab_proto::DEFAULT_PORT)?;
    let addr = (h.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {h}: {e}"))?
        .next()
        .ok_or_else(|| format!("cannot resolve {h}: no addresses"))?;
    Ok((h, addr.ip()))
}

fn write(path: &Path, l: &Located) -> Result<(), String> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(l).expect("serializes"))
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `tests` (one per load phase, in order) against `host` while probing its hops, then
/// writes the locate file. Each phase's test writes its own result file as it runs, so a
/// killed locate keeps those. Ctrl-C (`o.test.stop`) or a failed phase ends it early with
/// the verdict of what was measured (`partial`).
pub fn locate(
    host: &str,
    tests: &[(Load, Params)],
    o: &Options,
) -> Result<(Located, PathBuf), String> {
    let (name, ip) = resolve(host)?;
    std::fs::create_dir_all(&o.out_dir).map_err(|e| format!("{}: {e}", o.out_dir.display()))?;
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now())
        .to_string()
        .replace([':', '-'], "")
        .trim_end_matches('Z')
        .to_string();
    let path = o.out_dir.join(format!("bloatlab-locate-{stamp}.json"));
    let mut cfg = HopConfig::new(ip);
    cfg.max_hops = o.max_hops;
    cfg.interval = o.hop_interval;
    cfg.icmp = o.icmp;
    let meta = Meta {
        tool: "bloatlab".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        target: name,
        address: ip,
        start_time: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        hop_interval_s: o.hop_interval.as_secs_f64(),
        max_hops: o.max_hops,
        probes: if o.icmp { "icmp" } else { "udp" }.into(),
    };
    let prober =
        HopProber::start(cfg).map_err(|e| format!("cannot probe the hops to {ip}: {e}"))?;
    let sampler = LocalQueueSampler::start(ip, Duration::from_millis(200));
    let mut runs: Vec<(Load, Summary)> = Vec::new();
    let mut phases = Vec::new();
    let mut wins = Vec::new();
    let mut failure = None;
    for (i, (load, params)) in tests.iter().enumerate() {
        if o.test.stop.load(Ordering::Relaxed) {
            break;
        }
        if o.verbose {
            eprintln!(
                "locate {}/{}: {} load ({}, {} s after {} s idle)",
                i + 1,
                tests.len(),
                load.name(),
                params.test.name(),
                params.length,
                params.idle
            );
        }
        // One phase (`test --locate`) keeps the result file the user named.
        let file = match (&o.test.output, tests.len()) {
            (Some(named), 1) => named.clone(),
            _ => o
                .out_dir
                .join(format!("bloatlab-locate-{stamp}-{}.json.gz", load.name())),
        };
        let topts = bloatlab_measure::Options {
            output: Some(file.clone()),
            progress: o.test.progress,
            stop: o.test.stop.clone(),
            key: o.test.key.clone(),
        };
        match bloatlab_measure::run(params, host, &topts) {
            Ok(out) => {
                let s = out.result.summary.clone().unwrap_or_default();
                phases.push(PhaseRun {
                    load: *load,
                    test: params.test.name().into(),
                    file: out.path.clone(),
                    added_latency_ms: s.added_latency_ms,
                    throughput_down_mbps: s.throughput_mbps.down,
                    throughput_up_mbps: s.throughput_mbps.up,
                });
                wins.extend(windows(&out.result, *load));
                runs.push((*load, s));
                if let Ended::ServerLost(why) = out.ended {
                    failure = Some(format!("{why} during the {} phase", load.name()));
                    break;
                }
            }
            Err(e) => {
                failure = Some(format!("{} phase: {e}", load.name()));
                break;
            }
        }
    }
    let probes = prober
        .finish()
        .map_err(|e| format!("hop probing failed: {e}"))?;
    let local_q = sampler.map(|s| s.finish());
    let obs = observe::hops(&probes, &wins);
    let local_obs = local_q.as_ref().map(|q| observe::local(q, &wins));
    let v = verdict::verdict(&obs, local_obs.as_ref(), &end_to_end(&runs));
    let partial = failure.is_some() || runs.len() < tests.len();
    let located = Located {
        format: FORMAT.into(),
        version: VERSION,
        metadata: meta,
        phases,
        hops: hop_reports(&obs),
        local: local_q,
        verdict: v,
        partial,
        probes,
    };
    write(&path, &located)?;
    match failure {
        Some(e) if runs.is_empty() => Err(e),
        Some(e) => {
            eprintln!("bloatlab: {e}; the verdict uses the phases that finished");
            Ok((located, path))
        }
        None => Ok((located, path)),
    }
}
