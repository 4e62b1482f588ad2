//! `bloatlab lab ...`: wiring between the command line and `bloatlab-lab`.

use bloatlab_experiment::table::table;
use bloatlab_experiment::{Comparison, Fix, Options};
use bloatlab_lab::control::{self, Request};
use bloatlab_lab::lab::{self, LabInfo};
use bloatlab_lab::{presets, Lab, Topology, SOCKET_ENV};
use bloatlab_result::Summary;
use clap::Subcommand;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Subcommand)]
pub enum LabCommand {
    /// List the built-in topologies and their parameters.
    Presets,
    /// Build a topology (preset name or TOML file) and keep it running in the background.
    Up {
        /// Preset name (see `lab presets`) or path to a TOML topology file.
        topology: String,
        /// Name of this lab instance (default: the topology's name).
        #[arg(long)]
        name: Option<String>,
    },
    /// Run a command inside a host of a running lab (with the lab's environment).
    Exec {
        /// Host name, e.g. client, router, server.
        host: String,
        /// Which lab, when several are up.
        #[arg(long)]
        lab: Option<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Change a link while it runs: `lab set wan rate=20mbit qdisc=fq_codel --dir down`.
    /// Keys: rate (60mbit | trace:FILE | schedule:FILE | unlimited), delay, jitter, reorder,
    /// loss (1%), ge (p,r,1-h,1-k), mtu, overhead (bytes), atm, qdisc (fifo | fifo-headdrop |
    /// codel | fq_codel | "cake OPTIONS" as tc takes them), limit (packets 1000 | bytes 64kb | time
    /// 100ms), target, interval,
    /// ecn, flows, quantum, ring (packets a driver holds below the qdisc; 0: none), bql (on: the
    /// ring limited in bytes
    /// as Linux's byte queue limits do), seed.
    Set {
        link: String,
        /// key=value settings.
        #[arg(required = true)]
        settings: Vec<String>,
        /// Direction: up (a -> b), down (b -> a) or both.
        #[arg(long, default_value = "both")]
        dir: String,
        #[arg(long)]
        lab: Option<String>,
    },
    /// Per-link counters: packets, bytes, drops by reason, ECN marks, queue, sojourn times.
    Stats {
        #[arg(long)]
        lab: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a lab, or with --all remove every lab namespace, device and state (also after a
    /// SIGKILL).
    Down {
        name: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Build a topology, run a command (in the root namespace, with BLOATLAB_LAB_SOCKET set
    /// so `lab exec` finds the lab), tear down when it ends, on Ctrl-C or on error.
    Run {
        topology: String,
        #[arg(long)]
        name: Option<String>,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// The whole loop on the `cable` line (60/4 Mbit/s, 1000-packet modem FIFO): rrul through
    /// the line as it is; locate the queue (download and upload loads alone, which also measure
    /// each direction's rate); advise; apply the advice on the router; rrul again, kept only if
    /// latency fell and goodput held (else rolled back); one before/after HTML report with the
    /// verdict, the advice and the applied configuration. Keeps every result file.
    Demo {
        /// Load phase of each rrul run, seconds.
        #[arg(short, long, default_value_t = 20.0)]
        length: f64,
        /// Print {"before", "after" (summaries), "located", "advice", "applied", "kept",
        /// "reason", "files", "report"} as JSON.
        #[arg(long)]
        json: bool,
        /// Directory for the two result files.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        /// No progress output.
        #[arg(short, long)]
        quiet: bool,
        /// Where the advice is applied: `cake` (the emulator's CAKE on the router's LAN link,
        /// `docsis` framing, ingress mode downstream, `ack-filter` upstream where the advice
        /// says so; `cake+ack-filter` always), `fq_codel` (the emulator's HTB-style
        /// shaper with FQ-CoDel, quantum 300, as sqm-scripts' simple.qos), or `kernel` (tc on
        /// the router's WAN interface as `bloatlab tune apply` does it: the best qdisc this
        /// kernel has, HTB with short FIFOs when it has neither cake nor fq_codel).
        #[arg(long, default_value = "cake", value_parser = [
            "cake", "cake+ack-filter", "fq_codel", "htb-fq_codel", "kernel"
        ])]
        fix: String,
    },
    /// The same test through each fix on the same emulated line: `lab compare cable --fix
    /// fifo,htb-fq_codel,cake`. The fix goes in front of the slowest link on the client's side
    /// (the router), at 95% of that link's rate each way with its overhead; CAKE runs in
    /// ingress mode downstream. One table, one HTML report with every run, result files kept.
    Compare {
        /// Preset name or TOML topology file (hosts `client` and `server`).
        topology: String,
        /// Comma-separated fixes: fifo (the line as is), htb-fq_codel, cake, cake+ack-filter
        /// (CAKE filtering the upload's redundant ACKs).
        #[arg(long, default_value = "fifo,htb-fq_codel,cake")]
        fix: String,
        /// The test each run makes, with its options: rrul, tcp-bidir, rpm, "voip --under-load".
        #[arg(long, default_value = "rrul")]
        test: String,
        /// Load phase of each run, seconds (after 5 s idle).
        #[arg(short, long, default_value_t = 20.0)]
        length: f64,
        /// Print {"runs": [{"fix", "file", "summary"}, ...]} as JSON.
        #[arg(long)]
        json: bool,
        /// Directory for the result files and the report.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        #[arg(short, long)]
        quiet: bool,
    },
    /// (internal) The background process of `lab up`.
    #[command(hide = true)]
    Serve { topology: String, name: String },
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("bloatlab lab: {msg}");
    ExitCode::from(1)
}

fn load_topology(arg: &str) -> Result<Topology, String> {
    let text = match presets::get(arg) {
        Some(t) => t.to_string(),
        None => std::fs::read_to_string(arg).map_err(|e| {
            let names: Vec<&str> = presets::PRESETS.iter().map(|p| p.0).collect();
            format!(
                "`{arg}` is neither a preset ({}) nor a readable file: {e}",
                names.join(", ")
            )
        })?,
    };
    Topology::from_toml(&text, &presets::read_file).map_err(|e| e.to_string())
}

/// The lab meant by `--lab`; else the one whose socket BLOATLAB_LAB_SOCKET names (inside `lab
/// run`, with other labs up beside it); else the only one running.
fn find_lab(name: Option<&str>) -> Result<LabInfo, String> {
    let live: Vec<LabInfo> = lab::running()
        .into_iter()
        .filter(|(_, alive)| *alive)
        .map(|(i, _)| i)
        .collect();
    match (
        name,
        std::env::var_os(SOCKET_ENV).map(std::path::PathBuf::from),
    ) {
        (Some(n), _) => live
            .into_iter()
            .find(|i| i.name == n)
            .ok_or_else(|| format!("no running lab named {n}")),
        (None, Some(socket)) => live
            .into_iter()
            .find(|i| i.socket == socket)
            .ok_or_else(|| {
                format!(
                    "{SOCKET_ENV} names {}, the socket of no running lab",
                    socket.display()
                )
            }),
        (None, None) => match live.len() {
            0 => Err("no lab is running; start one with `bloatlab lab up cable`".into()),
            1 => Ok(live.into_iter().next().unwrap()),
            _ => Err(format!(
                "several labs are up ({}); choose one with --lab",
                live.iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }
}

fn print_hosts(info: &LabInfo) {
    for (h, hi) in &info.hosts {
        eprintln!(
            "  {h:<10} {}  {}  tcp {}",
            hi.ipv4.join(" "),
            hi.ipv6.join(" "),
            hi.cc
        );
    }
}

pub fn run(cmd: LabCommand, stop: impl Fn() -> Arc<AtomicBool>) -> ExitCode {
    match cmd {
        LabCommand::Presets => {
            for (name, text) in presets::PRESETS {
                let t = Topology::from_toml(text, &presets::read_file).expect("presets are tested");
                println!("{name}: {}", t.description);
                for l in &t.links {
                    println!("  link {} ({} <-> {})", l.name, l.a, l.b);
                    println!("    up   {}", l.up.describe());
                    println!("    down {}", l.down.describe());
                }
            }
            ExitCode::SUCCESS
        }
        LabCommand::Up { topology, name } => up(&topology, name),
        LabCommand::Serve { topology, name } => serve(&topology, &name, stop()),
        LabCommand::Exec { host, lab, cmd } => {
            let info = match find_lab(lab.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            let Some(h) = info.hosts.get(&host) else {
                return fail(format!(
                    "lab {} has no host {host} (hosts: {})",
                    info.name,
                    info.hosts.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
            };
            let err = Command::new("ip")
                .args(["netns", "exec", &h.namespace])
                .args(&cmd)
                .env(SOCKET_ENV, &info.socket)
                .exec();
            fail(format!("cannot run {}: {err}", cmd[0]))
        }
        LabCommand::Set {
            link,
            settings,
            dir,
            lab,
        } => {
            let info = match find_lab(lab.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            let mut kv = Vec::new();
            for s in settings {
                match s.split_once('=') {
                    Some((k, v)) => kv.push((k.to_string(), v.to_string())),
                    None => return ExitCode::from(usage(format!("`{s}` is not key=value"))),
                }
            }
            match control::request(
                &info.socket,
                &Request::Set {
                    link,
                    dir,
                    settings: kv,
                },
            ) {
                Ok(r) if r.ok => {
                    println!("{}", r.message.unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Ok(r) => fail(r.message.unwrap_or_default()),
                Err(e) => fail(e),
            }
        }
        LabCommand::Stats { lab, json } => {
            let info = match find_lab(lab.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            match control::request(&info.socket, &Request::Stats) {
                Ok(r) if r.ok => {
                    let stats = r.stats.unwrap_or_default();
                    if json {
                        println!("{}", serde_json::to_string_pretty(&stats).expect("json"));
                    } else {
                        print!("{}", stats_text(&stats));
                    }
                    ExitCode::SUCCESS
                }
                Ok(r) => fail(r.message.unwrap_or_default()),
                Err(e) => fail(e),
            }
        }
        LabCommand::Down { name, all } => {
            if all {
                let names: Vec<String> = lab::running().into_iter().map(|(i, _)| i.name).collect();
                let mut removed = lab::down_all();
                // A killed lab's log outlives it; once its remains are gone, so is the log.
                for log in names.iter().map(|n| serve_log(n)) {
                    if std::fs::remove_file(&log).is_ok() {
                        removed.push(format!("log {}", log.display()));
                    }
                }
                for r in &removed {
                    eprintln!("removed {r}");
                }
                if removed.is_empty() {
                    eprintln!("nothing to remove");
                }
                return ExitCode::SUCCESS;
            }
            let info = match find_lab(name.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            if let Err(e) = control::request(&info.socket, &Request::Down) {
                return fail(e);
            }
            // Wait for the background process to finish its teardown.
            for _ in 0..100 {
                if !lab::running()
                    .iter()
                    .any(|(i, alive)| i.name == info.name && *alive)
                {
                    eprintln!("lab {} is down", info.name);
                    return ExitCode::SUCCESS;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            fail(format!(
                "lab {} did not stop; try `bloatlab lab down --all`",
                info.name
            ))
        }
        LabCommand::Run {
            topology,
            name,
            cmd,
        } => run_cmd(&topology, name, &cmd, stop()),
        LabCommand::Demo {
            length,
            json,
            out_dir,
            quiet,
            fix,
        } => demo(length, json, &out_dir, quiet, &fix, stop()),
        LabCommand::Compare {
            topology,
            fix,
            test,
            length,
            json,
            out_dir,
            quiet,
        } => {
            let test = match crate::test_spec(&test) {
                Ok((params, _)) => params,
                Err(e) => return crate::fail(e),
            };
            compare(
                &topology,
                &fix,
                json,
                experiment_options(length, test, &out_dir, "compare", quiet, stop()),
            )
        }
    }
}

fn usage(msg: String) -> u8 {
    eprintln!("bloatlab lab: {msg}");
    2
}

fn up(topology: &str, name: Option<String>) -> ExitCode {
    let topo = match load_topology(topology) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let name = name.unwrap_or(topo.name.clone());
    let log = serve_log(&name);
    let log_file = match std::fs::File::create(&log) {
        Ok(f) => f,
        Err(e) => return fail(format!("{}: {e}", log.display())),
    };
    let exe = std::env::current_exe().expect("own path");
    let mut child = match Command::new(exe)
        .args(["lab", "serve", topology, &name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file)
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start the lab process: {e}")),
    };
    for _ in 0..300 {
        if let Ok(Some(_)) = child.try_wait() {
            let why = std::fs::read_to_string(&log).unwrap_or_default();
            return fail(why.trim().trim_start_matches("bloatlab lab: "));
        }
        if let Some((info, true)) = lab::running().into_iter().find(|(i, _)| i.name == name) {
            if info.socket.exists() {
                eprintln!("lab {name} is up ({} topology); hosts:", info.topology);
                print_hosts(&info);
                eprintln!(
                    "run commands with `bloatlab lab exec HOST -- CMD`; stop with `bloatlab \
                    lab down {name}`"
                );
                return ExitCode::SUCCESS;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    fail(format!(
        "the lab did not come up in 15 s; see {}",
        log.display()
    ))
}

/// Where the background lab process writes its errors; removed when it ends cleanly.
fn serve_log(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("bloatlab-lab-{name}.log"))
}

/// Builds the lab and serves its control socket until `down` or a signal.
fn serve(topology: &str, name: &str, stop: Arc<AtomicBool>) -> ExitCode {
    crate::ignore_sigpipe();
    let lab =
        match load_topology(topology).and_then(|t| Lab::up(t, name).map_err(|e| e.to_string())) {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
    let down = Arc::new(AtomicBool::new(false));
    let ctl_stop = lab.stop_flag();
    let ctl = match control::serve(
        lab.shared.clone(),
        &lab.info().socket.clone(),
        ctl_stop,
        down.clone(),
    ) {
        Ok(t) => t,
        Err(e) => return fail(format!("control socket: {e}")),
    };
    while !stop.load(Ordering::Relaxed) && !down.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(lab);
    let _ = ctl.join();
    let _ = std::fs::remove_file(serve_log(name));
    ExitCode::SUCCESS
}

fn run_cmd(
    topology: &str,
    name: Option<String>,
    cmd: &[String],
    stop: Arc<AtomicBool>,
) -> ExitCode {
    let topo = match load_topology(topology) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let name = name.unwrap_or(topo.name.clone());
    let lab = match Lab::up(topo, &name) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let down = Arc::new(AtomicBool::new(false));
    let ctl = control::serve(
        lab.shared.clone(),
        &lab.info().socket.clone(),
        lab.stop_flag(),
        down,
    );
    if let Err(e) = ctl {
        return fail(format!("control socket: {e}"));
    }
    eprintln!("lab {name} is up; hosts:");
    print_hosts(lab.info());
    let status = Command::new(&cmd[0])
        .args(&cmd[1..])
        .env(SOCKET_ENV, &lab.info().socket)
        .status();
    drop(lab);
    match status {
        Ok(s) if stop.load(Ordering::Relaxed) => ExitCode::from(s.code().unwrap_or(130) as u8),
        Ok(s) => ExitCode::from(s.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => fail(format!("cannot run {}: {e}", cmd[0])),
    }
}

fn stats_text(stats: &serde_json::Value) -> String {
    let mut out = String::new();
    let Some(links) = stats["links"].as_object() else {
        return out;
    };
    for (name, dirs) in links {
        for dir in ["up", "down"] {
            let d = &dirs[dir];
            let n = |k: &str| d[k].as_u64().unwrap_or(0);
            let drops = &d["drops"];
            let dn = |k: &str| drops[k].as_u64().unwrap_or(0);
            let hist: bloatlab_lab_model::stats::SojournHistogram =
                serde_json::from_value(d["sojourn"].clone()).unwrap_or_default();
            let q = |p: f64| {
                hist.quantile_us(p)
                    .map_or("-".to_string(), |us| format!("{:.2}ms", us as f64 / 1000.0))
            };
            out +=
                &format!(
                "{name} {dir:<4} {}\n  {} pkts in, {} out ({:.1} MB); drops: queue {}, aqm {}, \
                    {}loss {}, mtu {}, tun {}; ecn marks {}\n  queue now {} pkts (max {}); sojourn \
                    p50 {} p90 {} p99 {}\n  before the model, in the TUN device ({} pkts): waited \
                    at most {} us (p99 {} us), {} pkts at once (p99 {})\n",
                d["config"].as_str().unwrap_or(""),
                n("rx_packets"),
                n("tx_packets"),
                n("tx_bytes") as f64 / 1e6,
                dn("overflow"),
                dn("aqm"),
                // CAKE's filtered ACKs are drops too (tc counts them in "dropped").
                if dn("ack_filter") > 0 { format!("ack filter {}, \
                    ", dn("ack_filter")) } else { String::new() },
                dn("loss"),
                dn("mtu"),
                d["tun"]["dropped"].as_u64().map_or("?".into(), |v| v.to_string()),
                n("ecn_marks"),
                n("queue_packets"),
                n("max_queue_packets"),
                q(0.5),
                q(0.9),
                q(0.99),
                d["tun"]["txqueuelen"],
                d["tun"]["wait_us"]["max"],
                d["tun"]["wait_us"]["p99"],
                d["tun"]["waiting_packets"]["max"],
                d["tun"]["waiting_packets"]["p99"],
            );
            if n("max_ring_packets") > 0 {
                let ring: bloatlab_lab_model::stats::SojournHistogram =
                    serde_json::from_value(d["ring_sojourn"].clone()).unwrap_or_default();
                let r = |p: f64| {
                    ring.quantile_us(p)
                        .map_or("-".to_string(), |us| format!("{:.2}ms", us as f64 / 1000.0))
                };
                let bql = d["bql_limit_bytes"]
                    .as_u64()
                    .map_or(String::new(), |b| format!(", BQL limit {b} B"));
                out += &format!(
                    "  below the qdisc, in the transmit ring: {} pkts now (max \
                    {}{bql}); waited p50 {} p90 {} p99 \
                    {}\n",
                    n("ring_packets"),
                    n("max_ring_packets"),
                    r(0.5),
                    r(0.9),
                    r(0.99)
                );
            }
            if let Some(c) = d.get("cake").filter(|c| !c.is_null()) {
                out += &cake_text(c, dn("ack_filter"));
            }
        }
    }
    out
}

/// CAKE's tins as `tc -s qdisc show` lays them out: one column per tin.
fn cake_text(c: &serde_json::Value, ack_drops: u64) -> String {
    let Some(tins) = c["tins"].as_array() else {
        return String::new();
    };
    let mut out = format!(
        "  cake: rate {:.2} Mbit/s, memory {} of {} B, ack drops {ack_drops}\n",
        c["rate_bps"].as_f64().unwrap_or(0.0) / 1e6,
        c["memory_used"],
        c["memory_limit"]
    );
    out += &format!("  {:<12}", "");
    for t in tins {
        out += &format!("{:>14}", t["name"].as_str().unwrap_or(""));
    }
    out += "\n";
    let rows: [(&str, &str, f64); 12] = [
        ("thresh Mbit", "thresh_bps", 1e6),
        ("target ms", "target_us", 1e3),
        ("interval ms", "interval_us", 1e3),
        ("pk_delay ms", "pk_delay_us", 1e3),
        ("av_delay ms", "av_delay_us", 1e3),
        ("sp_delay ms", "sp_delay_us", 1e3),
        ("pkts", "packets", 1.0),
        ("drops", "drops", 1.0),
        ("marks", "marks", 1.0),
        ("ack_drop", "ack_drops", 1.0),
        ("sp_flows", "sparse_flows", 1.0),
        ("bk_flows", "bulk_flows", 1.0),
    ];
    for (label, key, scale) in rows {
        out += &format!("  {label:<12}");
        for t in tins {
            let v = t[key].as_f64().unwrap_or(0.0) / scale;
            out += &if scale == 1.0 {
                format!("{v:>14.0}")
            } else {
                format!("{v:>14.2}")
            };
        }
        out += "\n";
    }
    out
}

fn experiment_options(
    length: f64,
    test: bloatlab_measure::Params,
    out_dir: &std::path::Path,
    lab_name: &str,
    quiet: bool,
    stop: Arc<AtomicBool>,
) -> Options {
    Options {
        test,
        length,
        out_dir: out_dir.to_path_buf(),
        lab_name: lab_name.into(),
        quiet,
        stop,
    }
}

/// Prints where the files went and how the experiment ended.
fn finish(c: &Comparison) -> ExitCode {
    for r in &c.runs {
        eprintln!("result: {}", r.file.display());
    }
    match &c.report {
        Ok(p) => eprintln!("report: {}", p.display()),
        Err(e) => eprintln!("bloatlab lab: no report: {e}"),
    }
    if c.interrupted {
        eprintln!("bloatlab lab: interrupted; the lab is torn down, finished runs are kept");
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}

fn demo(
    length: f64,
    json: bool,
    out_dir: &std::path::Path,
    quiet: bool,
    fix: &str,
    stop: Arc<AtomicBool>,
) -> ExitCode {
    let how = match bloatlab_experiment::demo::Apply::parse(fix) {
        Ok(f) => f,
        Err(e) => return ExitCode::from(usage(e)),
    };
    if !quiet {
        eprintln!(
            "building the `cable` lab: client - router - [60/4 Mbit/s, 15 ms, 1000-packet \
            FIFO] - server"
        );
    }
    let topo = load_topology("cable").expect("preset");
    let rrul = bloatlab_measure::Params::new(bloatlab_measure::TestKind::Rrul);
    let o = experiment_options(length, rrul, out_dir, "demo", quiet, stop);
    let d = match bloatlab_experiment::demo::demo(topo, how, &o) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&d).expect("json"));
    } else {
        if let Some(l) = &d.located {
            println!("{}", bloatlab_experiment::demo::verdict_text(&l.verdict));
        }
        let mut cols = vec![("modem FIFO", &d.before)];
        if let Some(a) = &d.after {
            cols.push((
                if d.kept {
                    "advised fix"
                } else {
                    "advised fix (rolled back)"
                },
                a,
            ));
        }
        print!("{}", table(&cols));
        if !d.reason.is_empty() {
            println!(
                "\n{}: {}",
                if d.kept { "kept" } else { "not kept" },
                d.reason
            );
        }
    }
    for f in &d.files {
        eprintln!("written: {}", f.display());
    }
    if let Err(e) = &d.report {
        eprintln!("bloatlab lab: no report: {e}");
    }
    if d.interrupted {
        eprintln!("bloatlab lab: interrupted; the lab is torn down, finished steps are kept");
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}

fn compare(topology: &str, fixes: &str, json: bool, o: Options) -> ExitCode {
    let topo = match load_topology(topology) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let fixes = match fixes
        .split(',')
        .map(Fix::parse)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(f) => f,
        Err(e) => return ExitCode::from(usage(e)),
    };
    let c = match bloatlab_experiment::compare(topo, &fixes, &o) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if json {
        let runs: Vec<serde_json::Value> = c
            .runs
            .iter()
            .map(|r| {
                serde_json::json!({
                    "fix": r.fix.name(),
                    "file": r.file,
                    "summary": r.summary,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "runs": runs })).expect("json")
        );
    } else {
        let cols: Vec<(&str, &Summary)> =
            c.runs.iter().map(|r| (r.fix.label(), &r.summary)).collect();
        print!("{}", table(&cols));
    }
    finish(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cake_stats_print_one_column_per_tin_in_tcs_order() {
        use bloatlab_lab_model::cake::{Cake, CakeParams};
        let c = Cake::new(
            CakeParams::parse("bandwidth 20mbit diffserv3").unwrap(),
            1500,
            1,
        );
        let text = cake_text(&serde_json::to_value(c.stats()).unwrap(), 0);
        let header: Vec<&str> = text
            .lines()
            .nth(1)
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        assert_eq!(header, ["Bulk", "Best Effort", "Voice"], "{text}");
        let thresh = text
            .lines()
            .find(|l| l.trim_start().starts_with("thresh"))
            .unwrap();
        assert_eq!(
            thresh.split_whitespace().skip(2).collect::<Vec<_>>(),
            ["1.25", "20.00", "5.00"],
            "{text}"
        );
    }

    #[test]
    fn a_links_drops_line_counts_filtered_acks_only_where_there_are_some() {
        let link = |ack: u64| {
            serde_json::json!({
                "links": {"wan": {"up": {"drops": {
                    "overflow": 1, "aqm": 2, "ack_filter": ack, "loss": 0, "mtu": 0
                }}}},
            })
        };
        let drops = |ack: u64| stats_text(&link(ack)).lines().nth(1).unwrap().to_string();
        assert!(
            drops(7486).contains("drops: queue 1, aqm 2, ack filter 7486, loss 0"),
            "{}",
            drops(7486)
        );
        assert!(
            drops(0).contains("drops: queue 1, aqm 2, loss 0"),
            "{}",
            drops(0)
        );
    }
}
