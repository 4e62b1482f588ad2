//! The `bloatlab` binary: argument parsing and wiring only.

use bloatlab_measure::display::ProgressMode;
use bloatlab_measure::flags::{test_spec, TestArgs};
use bloatlab_measure::{Ended, RunOptions, TestKind};
use bloatlab_report::text::{events_text, summary_text};
mod autorate_cmd;
mod fix_cmd;
#[cfg(feature = "lab")]
mod lab_cmd;
mod locate_cmd;
mod monitor_cmd;
mod report_cmd;
mod tune_cmd;

use bloatlab_server::flags::ServerArgs;
use clap::{Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "bloatlab", version, about = "Measure latency under load (bufferbloat), locate it \
    and fix it", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve measurements: TCP control and data connections and UDP echo, all on one port;
    /// with --http (or --https) also the responsiveness endpoints other RPM clients use
    /// (networkQuality, mach, goresponsiveness) and, in the full build, a bufferbloat test
    /// page for any browser.
    Server(Box<ServerArgs>),
    /// Run a test against a `bloatlab server` (rpm also against any responsiveness server, by
    /// its config URL).
    Test(TestArgs),
    /// Which hop of the path to a `bloatlab server` holds the queue that bloats it, and in
    /// which direction: loads the path (download, upload, both) while probing every hop with
    /// TTL-limited UDP (no root needed), and watches this host's own interface queue.
    Locate(locate_cmd::LocateArgs),
    /// Shaping advice from result files: per direction the rate (95% of the lowest measured
    /// goodput), link-layer overhead, queue discipline, the buffer the bloat implies and what
    /// to expect after, each with its reason.
    Advise(tune_cmd::AdviseArgs),
    /// A configuration to paste, commented: tc (CAKE, HTB + fq_codel, HTB classes), OpenWrt
    /// sqm, FireQOS, nftables DSCP rules, writeback sysctls, OpenWrt Wi-Fi settings.
    Config(tune_cmd::ConfigArgs),
    /// The whole loop on a Linux router (or a host wired to the modem), as root: rrul through
    /// the line as it is, each direction loaded alone for its rate and the place of its queue,
    /// the advice, the best shaper this kernel has applied on DEV (upload) and ifb4DEV
    /// (download), rrul again; kept only if latency under load fell and goodput held, rolled
    /// back otherwise (and on any failure or Ctrl-C). One before/after HTML report, and the
    /// command that undoes a kept change. `bloatlab fix server.example --dev eth1`.
    Fix(fix_cmd::FixArgs),
    /// Watch a line around the clock: light UDP probes to a bloatlab server all the time, each
    /// tagged idle, light or busy by the interface's load as it left (the latency the household
    /// feels while it uses the line); a scheduled test every --every within a --budget; the
    /// history in SQLite (`bloatlab history`); Prometheus metrics with --metrics. SIGTERM ends
    /// it cleanly. `bloatlab monitor server.example --iface wan --metrics [::]:9464`.
    Monitor(monitor_cmd::MonitorArgs),
    /// Keep the shaper right on a line whose rate moves (LTE, Starlink, Wi-Fi backhaul, cable
    /// at 21:00): bloatlab's UDP probes to a server give one-way delay each way, the WAN's
    /// counters the load; CAKE's bandwidth or an HTB class's rate follows, within
    /// MIN:BASE:MAX, over netlink. Holds its rates when the server goes silent, stops when
    /// the shaper is removed under it, SIGTERM leaves --on-exit. `bloatlab autorate
    /// server.example --dev wan --down 10mbit:50mbit:90mbit --up 2mbit:10mbit:20mbit`.
    Autorate(Box<autorate_cmd::AutorateArgs>),
    /// What the monitor recorded: scheduled tests and grades, silences, the worst hours, idle
    /// against busy latency per hour.
    History(monitor_cmd::HistoryArgs),
    /// Apply a shaper to an interface (all or nothing, recorded), roll it back, or show it.
    #[command(subcommand)]
    Tune(tune_cmd::TuneCommand),
    /// The same test against several paths (a tunnel and the raw path, a LAN server and a WAN
    /// one, Wi-Fi and wired): one table, one overlaid report, each path's efficiency (goodput)
    /// against the first. `bloatlab compare 10.8.0.1 192.0.2.1 --test rrul`.
    Compare {
        /// bloatlab servers, as `test` takes them; the first is the reference.
        #[arg(required = true, num_args = 2..)]
        targets: Vec<String>,
        /// The test and its options, as one argument: "tcp-down --flows 8", "rrul", "rpm".
        #[arg(long, default_value = "tcp-down")]
        test: String,
        /// Load phase of each run, seconds.
        #[arg(short, long, default_value_t = 20.0)]
        length: f64,
        /// Where the result files and the report go.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        /// Print {"runs": [{"target": ..., "summary": {...}}, ...]} instead of the table.
        #[arg(long)]
        json: bool,
        #[arg(short, long)]
        quiet: bool,
    },
    /// Emulated networks between network namespaces: build, run, change, inspect.
    #[cfg(feature = "lab")]
    #[command(subcommand)]
    Lab(lab_cmd::LabCommand),
    /// One self-contained HTML report of one or more result files: time series, latency CDFs
    /// overlaid (before/after), box plots, summary and metadata; zoom and hover, opens offline.
    /// Given one locate file (bloatlab locate): round trip per hop, idle and under each load.
    /// Given one autorate log (bloatlab autorate --log): the shaper's rate each way over what the
    /// line carried, the delay over its baseline, the rate changes and events.
    /// With --db: the monitor's history (grades, latency per hour by load, goodput, CAKE).
    #[cfg(feature = "report")]
    Report {
        #[arg(required_unless_present = "db")]
        results: Vec<PathBuf>,
        #[arg(short, long, default_value = "report.html")]
        output: PathBuf,
        /// A monitor's history instead of result files.
        #[arg(long, conflicts_with = "results")]
        db: Option<PathBuf>,
        /// With --db: how far back (e.g. 24h, 7d).
        #[arg(long, default_value = "7d", requires = "db", value_parser = monitor_cmd::duration)]
        since: std::time::Duration,
    },
    /// A static PNG or SVG plot of one or more result files.
    #[cfg(feature = "report")]
    Plot {
        #[arg(required = true)]
        results: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "timeseries")]
        kind: report_cmd::PlotKind,
        /// Output file; .png or .svg.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Convert a result file for other tools.
    Export {
        result: PathBuf,
        #[arg(long, value_enum)]
        format: report_cmd::ExportFormat,
        /// Output file (default: the result's name with .flent.gz or .csv).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    // Output piped into `head` ends quietly, as for other command-line tools.
    // SAFETY: setting a signal disposition before any threads exist.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match cli.command {
        Command::Server(a) => server(*a),
        Command::Test(a) => test(a),
        Command::Locate(a) => locate_cmd::run(a, progress_mode(false), stop_flag()),
        Command::Advise(a) => tune_cmd::advise_cmd(a),
        Command::Config(a) => tune_cmd::config_cmd(a),
        Command::Tune(c) => tune_cmd::tune_cmd(c),
        Command::Fix(a) => fix_cmd::run(a, stop_flag()),
        Command::Monitor(a) => monitor_cmd::monitor(a, stop_flag()),
        Command::History(a) => monitor_cmd::history(a),
        Command::Autorate(a) => autorate_cmd::autorate(*a, stop_flag()),
        #[cfg(feature = "lab")]
        Command::Lab(c) => lab_cmd::run(c, stop_flag),
        Command::Compare {
            targets,
            test,
            length,
            out_dir,
            json,
            quiet,
        } => compare(targets, &test, length, out_dir, json, quiet),
        #[cfg(feature = "report")]
        Command::Report {
            db: Some(db),
            since,
            output,
            ..
        } => monitor_cmd::history_report(&db, since, &output),
        #[cfg(feature = "report")]
        Command::Report {
            results, output, ..
        } => report_cmd::report(&results, &output),
        #[cfg(feature = "report")]
        Command::Plot {
            results,
            kind,
            output,
        } => report_cmd::plot(&results, kind, &output),
        Command::Export {
            result,
            format,
            output,
        } => report_cmd::export(&result, format, output),
    }
}

/// Ctrl-C (and SIGTERM) set the flag; a second one exits at once, taking down the namespaces
/// of the labs this process runs (`lab compare`, `lab demo`), whose teardown the exit skips.
fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let _ = ctrlc::set_handler(move || {
        if s.swap(true, Ordering::Relaxed) {
            bloatlab_lab::instance::remove_own_remains();
            std::process::exit(130);
        }
    });
    stop
}

/// The control socket of the lab this test runs in (`lab exec`, `lab run`), if any: its
/// counters go into the result file.
fn lab_socket() -> Option<PathBuf> {
    std::env::var_os(bloatlab_lab::SOCKET_ENV).map(PathBuf::from)
}

fn progress_mode(quiet: bool) -> ProgressMode {
    if quiet {
        ProgressMode::Quiet
    } else if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        // A live line only when a person watches; output going to a file or a pipe (stdout)
        // gets plain periodic lines on stderr instead.
        ProgressMode::Live
    } else {
        ProgressMode::Lines
    }
}

/// A failure: one line on stderr, exit code 1.
pub(crate) fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("bloatlab: {msg}");
    ExitCode::from(1)
}

/// What a command found, on stdout: as JSON, or as `text` says it; or the failure.
pub(crate) fn show<T: serde::Serialize>(
    r: Result<T, String>,
    json: bool,
    text: impl Fn(&T) -> String,
) -> ExitCode {
    match r {
        Ok(v) if json => {
            println!("{}", serde_json::to_string_pretty(&v).expect("plain data"));
            ExitCode::SUCCESS
        }
        Ok(v) => {
            let t = text(&v);
            print!("{t}");
            if !t.is_empty() && !t.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// A usage error: one line on stderr, exit code 2.
pub(crate) fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("bloatlab: {msg}");
    ExitCode::from(2)
}

/// The shared key: the file's bytes (a trailing newline dropped), else BLOATLAB_KEY's value.
fn load_key(file: Option<&std::path::Path>) -> Result<Option<Vec<u8>>, String> {
    let raw = match file {
        Some(f) => std::fs::read(f).map_err(|e| format!("key file {}: {e}", f.display()))?,
        None => match std::env::var_os("BLOATLAB_KEY") {
            Some(v) => v.into_encoded_bytes(),
            None => return Ok(None),
        },
    };
    bloatlab_proto::auth::parse_key(&raw).map(Some)
}

/// For the long-running processes (server, lab): a peer that resets a connection while a
/// vectored write (`writev`, which has no MSG_NOSIGNAL) is under way must cost an error on that
/// connection, not SIGPIPE for the whole process, which `main` left at its default for pipes.
pub(crate) fn ignore_sigpipe() {
    // SAFETY: changing a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

fn server(a: ServerArgs) -> ExitCode {
    ignore_sigpipe();
    let key = match load_key(a.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let config = match a.config(key) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let stop = stop_flag();
    // SIGHUP re-reads the certificates (the runtime's handler); it must not also stop the
    // server, as the Ctrl-C handler just installed for INT, TERM and HUP would. Ignored here,
    // before the runtime adds its own handler, which then runs alone.
    // SAFETY: changing a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    let mut server = match bloatlab_server::Server::start(config) {
        Ok(s) => s,
        Err(e) => {
            return fail(format!(
                "{e}; is another server running there? choose another with --listen"
            ))
        }
    };
    eprint!("{}", server.banner());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    server.stop();
    ExitCode::from(130)
}

/// `bloatlab compare`: the runs, then the table (or JSON) and where the files went.
fn compare(
    targets: Vec<String>,
    test: &str,
    length: f64,
    out_dir: PathBuf,
    json: bool,
    quiet: bool,
) -> ExitCode {
    if !(length > 0.0 && length.is_finite()) {
        return fail("--length must be positive");
    }
    let ((test, http), key) = match (test_spec(test), load_key(None)) {
        (Ok(t), Ok(k)) => (t, k),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let o = bloatlab_experiment::targets::TargetsOptions {
        test,
        http,
        key,
        lab_socket: lab_socket(),
        length,
        out_dir,
        quiet,
        stop: stop_flag(),
    };
    let c = match bloatlab_experiment::targets::compare_targets(&targets, &o) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "runs": c.runs }))
                .expect("summaries serialize")
        );
    } else {
        print!("{}", bloatlab_experiment::targets::text(&c.runs));
    }
    match &c.report {
        Ok(p) if !quiet => eprintln!("report written to {}", p.display()),
        Ok(_) => {}
        Err(e) => eprintln!("bloatlab: no report: {e}"),
    }
    if c.interrupted {
        eprintln!("bloatlab: interrupted; the runs that finished are above");
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}

fn test(a: TestArgs) -> ExitCode {
    let params = match a.params() {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    let kind = params.test;
    let progress = progress_mode(a.quiet);
    let opts = |key| RunOptions {
        output: a.output.clone(),
        progress,
        stop: stop_flag(),
        key,
    };
    if kind == TestKind::Mtu {
        let outcome = bloatlab_measure::mtu::run(&a.host, None, &opts(None));
        return finish_test(outcome, a.json, a.quiet);
    }
    if kind == TestKind::Marks {
        let marks = match a.marks() {
            Ok(m) => m,
            Err(e) => return usage(e),
        };
        let key = match load_key(a.key.as_deref()) {
            Ok(k) => k,
            Err(e) => return fail(e),
        };
        let outcome = bloatlab_measure::marks::run(&a.host, &marks, &opts(key));
        return finish_test(outcome, a.json, a.quiet);
    }
    if kind == TestKind::Writeback {
        let wb = bloatlab_measure::writeback::WritebackParams {
            dir: PathBuf::from(&a.host),
            size: bloatlab_measure::writeback::parse_size(a.size.as_deref().unwrap_or("1G"))
                .expect("checked by params()"),
            rate_bps: a.rate,
            fsync: a.fsync,
            idle: a.idle,
        };
        let outcome = bloatlab_measure::writeback::run(&wb, &opts(None));
        return finish_test(outcome, a.json, a.quiet);
    }
    let key = match load_key(a.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    if a.locate {
        let out_dir = a
            .output
            .as_deref()
            .and_then(|p| p.parent())
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        return locate_cmd::with_test(&a.host, params, out_dir, a.json, opts(key));
    }
    let by_url = bloatlab_measure::is_url(&a.host);
    if by_url && !matches!(kind, TestKind::Rpm) {
        return usage(
            "a URL target is for `test rpm` (a responsiveness config URL); other tests \
            take HOST[:PORT] of a bloatlab server",
        );
    }
    if a.tcp_ecn && by_url {
        return usage("--tcp-ecn is for tests against a bloatlab server");
    }
    if a.http1 && !(by_url && matches!(kind, TestKind::Rpm)) {
        return usage("--http1.1 is for `test rpm` against a URL (the HTTP transport)");
    }
    if a.sequential && !(by_url && matches!(kind, TestKind::Rpm)) {
        return usage(
            "--sequential is for `test rpm` against a URL (the HTTP transport); a \
            bloatlab server serves one too: its --https or --http port's /.well-known/nq",
        );
    }
    let lab = lab_socket();
    let at_start = lab
        .as_deref()
        .and_then(|s| bloatlab_lab::control::counters(s).ok());
    let opts = opts(key);
    let mut outcome = bloatlab_measure::run_target(&params, &a.host, &opts, &a.http());
    if let (Some(socket), Ok(o)) = (&lab, &mut outcome) {
        let r = bloatlab_lab::control::attach_counters(socket, &mut o.result, &o.path, at_start);
        if let Err(e) = r {
            eprintln!("bloatlab: {e}");
        }
    }
    finish_test(outcome, a.json, a.quiet)
}

/// Prints a finished test's summary (text or JSON) and events and says where its file is; the
/// exit code says how it ended.
fn finish_test(
    outcome: Result<bloatlab_measure::Outcome, bloatlab_measure::MeasureError>,
    json: bool,
    quiet: bool,
) -> ExitCode {
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    // A summary of a run cut short by this host's own failure would mislead: one line only.
    if !matches!(outcome.ended, Ended::Failed(_)) {
        let summary = outcome.result.summary.clone().unwrap_or_default();
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&summary).expect("summary serializes")
            );
        } else {
            print!("{}", summary_text(&summary, &outcome.result.metadata));
        }
        if !quiet {
            eprint!("{}", events_text(&outcome.result.events));
        }
    }
    let path = outcome.path.display();
    // A test that measured an idle path for a loaded one failed, whatever its probes say.
    let load_missing = outcome
        .result
        .summary
        .as_ref()
        .and_then(|s| s.load_missing.as_ref());
    if let (Ended::Complete, Some(why)) = (&outcome.ended, load_missing) {
        return fail(format!(
            "the load never ran ({why}); the idle figures are kept in {path}"
        ));
    }
    match outcome.ended {
        Ended::Complete => {
            if !quiet {
                eprintln!("result written to {path}");
            }
            ExitCode::SUCCESS
        }
        Ended::Interrupted => {
            eprintln!("bloatlab: interrupted; partial results kept in {path}");
            ExitCode::from(130)
        }
        Ended::ServerLost(why) => fail(format!(
            "{why} mid-test; partial results kept in {path}. \
            Check that the server is still running"
        )),
        Ended::Failed(why) => fail(format!("{why}; partial results kept in {path}")),
    }
}
