//! `bloatlab locate`: which hop of a path holds the queue that bloats it, and in which
//! direction. Runs a test per load phase (download, upload, both) against a bloatlab server
//! while probing every hop with TTL-limited UDP (`bloatlab_measure::hops`) and sampling this
//! host's own interface queue, then gives the verdict (`verdict`, pure).

pub mod observe;
pub mod table;
pub mod verdict;

use bloatlab_measure::hops::{HopConfig, HopProber};
use bloatlab_measure::localq::LocalQueueSampler;
use bloatlab_measure::{Ended, Params, TestKind};
pub use bloatlab_result::locate::{
    HopReport, Loaded, LocateFile, LocateMetadata, PhaseRun, PhaseStats, FORMAT, VERSION,
};
use bloatlab_result::Summary;
use observe::Windows;
use std::net::{IpAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};
pub use verdict::{BloatDirection, Load, Verdict};

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

/// Checks a locate's plan: each phase's `length` and `idle` (s), the seconds between probes
/// of one hop, TCP flows per loaded direction.
pub fn validate(length: f64, idle: f64, hop_interval: f64, flows: u16) -> Result<(), String> {
    if !(length >= 4.0 && length.is_finite()) {
        return Err(
            "--length must be at least 4 seconds (2 s of it are the queues filling)".into(),
        );
    }
    if !(idle >= 1.0 && idle.is_finite()) {
        return Err("--idle must be at least 1 second".into());
    }
    if !(0.05..=10.0).contains(&hop_interval) {
        return Err("--hop-interval must be between 0.05 and 10 seconds".into());
    }
    if flows == 0 || flows > 16 {
        return Err("--flows must be between 1 and 16".into());
    }
    Ok(())
}

/// Load phases by the names `--phases` takes.
pub fn loads(names: &[String]) -> Result<Vec<Load>, String> {
    names
        .iter()
        .map(|n| {
            Load::parse(n).ok_or_else(|| format!("--phases: `{n}` is not download, upload or both"))
        })
        .collect()
}

/// The load a test applies, for `test --locate`: only load tests have one.
pub fn load_of(test: TestKind) -> Result<Load, String> {
    match test {
        TestKind::TcpDown => Ok(Load::Download),
        TestKind::TcpUp => Ok(Load::Upload),
        TestKind::TcpBidir | TestKind::Rrul | TestKind::RrulBe => Ok(Load::Both),
        other => Err(format!(
            "--locate needs a load test (tcp-down, tcp-up, tcp-bidir, rrul, rrul-be), not {}",
            other.name()
        )),
    }
}

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

pub struct LocateOptions {
    /// Where the locate file and each phase's result file go.
    pub out_dir: PathBuf,
    /// Passed to every phase's test (progress, Ctrl-C, key; its `output` names the result
    /// file when there is one phase).
    pub test: bloatlab_measure::RunOptions,
    pub max_hops: u8,
    /// Time between two probes of one hop.
    pub hop_interval: Duration,
    /// ICMP echo probes (ping socket) instead of UDP.
    pub icmp: bool,
    /// Say what runs on stderr.
    pub verbose: bool,
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

fn write(path: &Path, l: &LocateFile) -> Result<(), String> {
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
    o: &LocateOptions,
) -> Result<(LocateFile, PathBuf), String> {
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
    let meta = LocateMetadata {
        tool: "bloatlab".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        target: name,
        address: Some(ip),
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
        let topts = bloatlab_measure::RunOptions {
            output: Some(file.clone()),
            progress: o.test.progress,
            stop: o.test.stop.clone(),
            key: o.test.key.clone(),
        };
        match bloatlab_measure::run(params, host, &topts) {
            Ok(out) => {
                let s = out.result.summary.clone().unwrap_or_default();
                // Hops probed beside no load say nothing of where a queue is.
                if let Some(why) = &s.load_missing {
                    failure = Some(format!("the {} phase's load never ran: {why}", load.name()));
                    break;
                }
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
    let located = LocateFile {
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
        Some(e) if runs.is_empty() => Err(format!(
            "{e}; the hops' probes are kept in {}",
            path.display()
        )),
        Some(e) => {
            eprintln!("bloatlab: {e}; the verdict uses the phases that finished");
            Ok((located, path))
        }
        None => Ok((located, path)),
    }
}
