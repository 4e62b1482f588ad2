//! `bloatlab lab ...`: wiring between the command line and `bloatlab-lab`.

use crate::fail;
use bloatlab_experiment::{ExperimentOptions, Fix};
use bloatlab_lab::instance::LabInfo;
use bloatlab_lab::{control, daemon, presets, Topology};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    /// Keys: rate (60mbit | trace:FILE | schedule:FILE | unlimited), delay (20ms |
    /// schedule:FILE), jitter, reorder,
    /// loss (1%), ge (p,r,1-h,1-k), mtu, overhead (bytes), atm, qdisc (fifo | fifo-headdrop |
    /// codel | fq_codel | "cake OPTIONS" as tc takes them), limit (packets 1000 | bytes 64kb | time
    /// 100ms), target, interval,
    /// ecn, flows, quantum, ring (packets a driver holds below the qdisc; 0: none), bql (on: the
    /// ring limited in bytes
    /// as Linux's byte queue limits do), dscp and ecn_path (what a middlebox at the link's
    /// entry does to the marks: keep | bleach | FROM>TO pairs such as EF>AF41,CS1>CS0 or
    /// ect1>ect0), seed.
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
        /// (CAKE filtering the upload's redundant ACKs); on a line that moves (presets lte,
        /// starlink, cable-evening): cake-max (CAKE at 95% of the line's busiest second),
        /// autorate (CAKE moved by `bloatlab autorate` on the router, MIN:BASE:MAX a fifth of,
        /// 95% of the mean and 95% of the busiest second), cake-autorate (the same with
        /// cake-autorate's law and defaults, re-implemented by our controller), cake-oracle
        /// (CAKE moved every 50 ms to 95% of what the line will carry over the next 100 ms, read
        /// from its own schedule: the bound no controller can pass), cake-autorate-sh
        /// (cake-autorate itself, its bash script and fping at its defaults, on the router: needs
        /// --cake-autorate).
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
        /// A checkout of lynxthecat/cake-autorate, for --fix cake-autorate-sh (it runs with
        /// this machine's bash and fping; a `tc` of ours on its PATH hands its changes to the
        /// lab's CAKE).
        #[arg(long)]
        cake_autorate: Option<PathBuf>,
        #[arg(short, long)]
        quiet: bool,
    },
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
        LabCommand::Up { topology, name } => {
            let topo = match daemon::load(&topology) {
                Ok(t) => t,
                Err(e) => return fail(e),
            };
            let name = name.unwrap_or(topo.name.clone());
            match daemon::start(topo, &name, stop) {
                Ok(info) => {
                    eprintln!("lab {name} is up ({} topology); hosts:", info.topology);
                    print_hosts(&info);
                    eprintln!(
                        "run commands with `bloatlab lab exec HOST -- CMD`; stop with \
                        `bloatlab lab down {name}`"
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        LabCommand::Exec { host, lab, cmd } => match daemon::find(lab.as_deref()) {
            Ok(info) => fail(daemon::exec(&info, &host, &cmd)),
            Err(e) => fail(e),
        },
        LabCommand::Set {
            link,
            settings,
            dir,
            lab,
        } => {
            let info = match daemon::find(lab.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            let kv = match daemon::parse_settings(&settings) {
                Ok(kv) => kv,
                Err(e) => return crate::usage(e),
            };
            match daemon::set(&info.socket, link, dir, kv) {
                Ok(said) => {
                    println!("{said}");
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        LabCommand::Stats { lab, json } => {
            let info = match daemon::find(lab.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            let stats = control::counters(&info.socket);
            crate::show(stats, json, bloatlab_report::text::lab_stats)
        }
        LabCommand::Down { name, all } => {
            if all {
                let removed = daemon::down_all();
                for r in &removed {
                    eprintln!("removed {r}");
                }
                if removed.is_empty() {
                    eprintln!("nothing to remove");
                }
                return ExitCode::SUCCESS;
            }
            let info = match daemon::find(name.as_deref()) {
                Ok(i) => i,
                Err(e) => return fail(e),
            };
            match daemon::down(&info) {
                Ok(()) => {
                    eprintln!("lab {} is down", info.name);
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        LabCommand::Run {
            topology,
            name,
            cmd,
        } => {
            let topo = match daemon::load(&topology) {
                Ok(t) => t,
                Err(e) => return fail(e),
            };
            let name = name.unwrap_or(topo.name.clone());
            let stop = stop();
            let said_up = |info: &LabInfo| {
                eprintln!("lab {name} is up; hosts:");
                print_hosts(info);
            };
            match daemon::run(topo, &name, &cmd, said_up) {
                Ok(s) if stop.load(Ordering::Relaxed) => {
                    ExitCode::from(s.code().unwrap_or(130) as u8)
                }
                Ok(s) => ExitCode::from(s.code().unwrap_or(1).clamp(0, 255) as u8),
                Err(e) => fail(e),
            }
        }
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
            cake_autorate,
        } => {
            let test = match crate::test_spec(&test) {
                Ok((params, _)) => params,
                Err(e) => return crate::fail(e),
            };
            let o = ExperimentOptions {
                test,
                length,
                out_dir,
                lab_name: "compare".into(),
                quiet,
                stop: stop(),
                cake_autorate,
            };
            compare(&topology, &fix, json, o)
        }
    }
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
        Err(e) => return crate::usage(e),
    };
    if !quiet {
        eprintln!(
            "building the `cable` lab: client - router - [60/4 Mbit/s, 15 ms, 1000-packet \
            FIFO] - server"
        );
    }
    let topo = daemon::load("cable").expect("preset");
    let rrul = bloatlab_measure::Params::new(bloatlab_measure::TestKind::Rrul);
    let o = ExperimentOptions {
        test: rrul,
        length,
        out_dir: out_dir.to_path_buf(),
        lab_name: "demo".into(),
        quiet,
        stop,
        cake_autorate: None,
    };
    let d = match bloatlab_experiment::demo::demo(topo, how, &o) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&d).expect("json"));
    } else {
        print!("{}", d.text());
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

fn compare(topology: &str, fixes: &str, json: bool, o: ExperimentOptions) -> ExitCode {
    let topo = match daemon::load(topology) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let fixes = match fixes
        .split(',')
        .map(Fix::parse)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(f) => f,
        Err(e) => return crate::usage(e),
    };
    let c = match bloatlab_experiment::compare(topo, &fixes, &o) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if json {
        println!("{}", c.json());
    } else {
        print!("{}", c.text());
    }
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
