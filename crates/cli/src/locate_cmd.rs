//! `bloatlab locate`: arguments to the locate library and its output.

use bloatlab_locate::table;
use bloatlab_measure::display::ProgressMode;
use bloatlab_measure::Params;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(clap::Args)]
pub struct LocateArgs {
    /// Server as HOST, HOST:PORT, [IPV6]:PORT or a bare IPv6 address (default port 9461).
    host: String,
    /// Length of each load phase (download, upload, both), in seconds. Each hop answers about
    /// once a second (routers' ICMP rate limit), so 20 s gives some 18 loaded round trips a hop.
    #[arg(short, long, default_value_t = 20.0)]
    length: f64,
    /// Idle phase before each load phase, in seconds (the first gets 2 s more).
    #[arg(long, default_value_t = 3.0)]
    idle: f64,
    /// TCP flows per direction in each load phase.
    #[arg(long, default_value_t = 4)]
    flows: u16,
    /// Highest TTL (hop limit) probed until the destination answers.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u8).range(1..=64))]
    max_hops: u8,
    /// Seconds between two probes of the same hop. Linux routers answer one per second per
    /// host (bursts of 6); probing faster buys unanswered probes, not samples.
    #[arg(long, default_value_t = 1.0)]
    hop_interval: f64,
    /// Probe with ICMP echo requests (an unprivileged ping socket) instead of UDP, for paths
    /// that drop UDP to high ports. Needs sysctl net.ipv4.ping_group_range to admit your group.
    #[arg(long)]
    icmp: bool,
    /// Only the phases named (comma-separated: download,upload,both).
    #[arg(long, value_delimiter = ',', default_value = "download,upload,both")]
    phases: Vec<String>,
    /// The server's shared key, when it requires one (a file; or the key in BLOATLAB_KEY).
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Where the locate file (bloatlab-locate-TIMESTAMP.json) and each phase's result go.
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// Print the hops and the verdict as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// No progress output.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(
    a: LocateArgs,
    progress: ProgressMode,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> ExitCode {
    if let Err(e) = bloatlab_locate::validate(a.length, a.idle, a.hop_interval, a.flows) {
        return crate::usage(e);
    }
    let loads = match bloatlab_locate::loads(&a.phases) {
        Ok(l) => l,
        Err(e) => return crate::usage(e),
    };
    let tests = bloatlab_locate::phase_tests(&loads, a.length, a.idle, a.flows);
    let key = match crate::load_key(a.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return crate::fail(e),
    };
    let o = bloatlab_locate::LocateOptions {
        out_dir: a.out_dir,
        test: bloatlab_measure::RunOptions {
            output: None,
            progress: if a.quiet {
                ProgressMode::Quiet
            } else {
                progress
            },
            stop: stop.clone(),
            key,
        },
        max_hops: a.max_hops,
        hop_interval: Duration::from_secs_f64(a.hop_interval),
        icmp: a.icmp,
        verbose: !a.quiet,
    };
    let (located, path) = match bloatlab_locate::locate(&a.host, &tests, &o) {
        Ok(x) => x,
        Err(e) => return crate::fail(e),
    };
    if a.json {
        let out = serde_json::json!({
            "hops": located.hops,
            "verdict": located.verdict,
            "phases": located.phases,
            "file": path,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serializes")
        );
    } else {
        print!("{}", table::text(&located));
    }
    if !a.quiet {
        eprintln!("locate result written to {}", path.display());
    }
    if stop.load(Ordering::Relaxed) {
        eprintln!("bloatlab: interrupted; the verdict uses the phases that finished");
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}

/// `bloatlab test KIND --locate`: one test with hop probing; its summary, then the hops and
/// the verdict (direction from the load the test applies, or from its one-way delays).
pub fn with_test(
    host: &str,
    params: Params,
    out_dir: PathBuf,
    json: bool,
    test: bloatlab_measure::RunOptions,
) -> ExitCode {
    let load = match bloatlab_locate::load_of(params.test) {
        Ok(l) => l,
        Err(e) => return crate::usage(e),
    };
    let quiet = matches!(test.progress, ProgressMode::Quiet);
    let stop = test.stop.clone();
    let o = bloatlab_locate::LocateOptions {
        out_dir,
        test,
        max_hops: 30,
        hop_interval: Duration::from_secs(1),
        icmp: false,
        verbose: false,
    };
    let (located, path) = match bloatlab_locate::locate(host, &[(load, params)], &o) {
        Ok(x) => x,
        Err(e) => return crate::fail(e),
    };
    let result = located
        .phases
        .first()
        .and_then(|p| bloatlab_result::read(&p.file).ok());
    let summary = result
        .as_ref()
        .map(bloatlab_analyze::summary_of)
        .unwrap_or_default();
    if json {
        let out = serde_json::json!({
            "summary": summary,
            "hops": located.hops,
            "verdict": located.verdict,
            "file": path,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serializes")
        );
    } else {
        if let Some(r) = &result {
            print!(
                "{}",
                bloatlab_report::text::summary_text(&summary, &r.metadata)
            );
        }
        print!("\n{}", table::text(&located));
    }
    if !quiet {
        if let Some(p) = located.phases.first() {
            eprintln!("result written to {}", p.file.display());
        }
        eprintln!("locate result written to {}", path.display());
    }
    if stop.load(Ordering::Relaxed) {
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}
