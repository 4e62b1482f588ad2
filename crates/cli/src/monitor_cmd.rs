//! `bloatlab monitor` and `bloatlab history`: arguments and wiring.

use crate::{fail, load_key, show, usage};
use bloatlab_measure::flags::test_spec;
use bloatlab_monitor::MonitorConfig;
use bloatlab_result::history::History;
use bloatlab_store::{Store, StoreError};
use clap::Args;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}`: {e} (e.g. 30m, 1h, 90d)"))
}

#[derive(Args)]
pub struct MonitorArgs {
    /// A bloatlab server's HOST[:PORT]: the light probes' and the scheduled tests' target.
    pub host: String,
    /// Time between scheduled tests (e.g. 30m, 1h, 6h); 0 for probes only.
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub every: Duration,
    /// The scheduled test and its options, as one argument: "rrul-be", "rrul", "tcp-down".
    #[arg(long, default_value = "rrul-be")]
    pub test: String,
    /// Load phase of each scheduled test, seconds (shortened to fit --budget).
    #[arg(short, long, default_value_t = 10.0)]
    pub length: f64,
    /// Light probes per second, all the time.
    #[arg(long, default_value_t = 5.0)]
    pub probe_rate: f64,
    /// The interface whose byte counters tag each probe idle, light or busy: the router's WAN
    /// (run the monitor on the router), else this host's own. Busy is half the capacity the
    /// last scheduled test measured in either direction, idle under a twentieth in both
    /// (before any test: 10 and 1 Mbit/s).
    #[arg(long)]
    pub iface: Option<String>,
    /// The history (SQLite); created if absent, refused if it is another program's file.
    #[arg(long, default_value = "bloatlab-history.db")]
    pub db: PathBuf,
    /// Where the scheduled tests' result files go.
    #[arg(long, default_value = "bloatlab-results")]
    pub out_dir: PathBuf,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    pub metrics: Option<SocketAddr>,
    /// Data the scheduled tests may move per day (UTC), e.g. 5GB/day: a test shrinks, or is
    /// skipped, when it would spend more than its share (the log says which).
    #[arg(long, value_parser = bloatlab_units::parse_bytes)]
    pub budget: Option<u64>,
    /// A name for this line: a `site` label on every metric.
    #[arg(long)]
    pub site: Option<String>,
    /// Keep probe minutes and silences this long.
    #[arg(long, default_value = "90d", value_parser = duration)]
    pub keep: Duration,
    /// Keep scheduled tests this long.
    #[arg(long, default_value = "400d", value_parser = duration)]
    pub keep_tests: Duration,
    /// The server's shared key (else BLOATLAB_KEY).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Run autorate in this process on the same probes: a TOML file with `bloatlab
    /// autorate`'s keys (dev, down, up, reflectors, log, ...; host, metrics and netns are the
    /// monitor's). One probe stream at autorate's rate instead of two, one process, its gauges
    /// on --metrics beside the monitor's.
    #[arg(long, value_name = "FILE")]
    pub autorate: Option<PathBuf>,
}

pub fn monitor(a: MonitorArgs, stop: Arc<AtomicBool>) -> ExitCode {
    crate::ignore_sigpipe();
    one_malloc_arena();
    let (mut test, http) = match test_spec(&a.test) {
        Ok(t) => t,
        Err(e) => return usage(e),
    };
    if a.length.is_nan() || a.length <= 0.0 {
        return usage("--length: want a positive number of seconds");
    }
    if !(0.1..=50.0).contains(&a.probe_rate) {
        return usage("--probe-rate: want 0.1 to 50 probes per second");
    }
    if bloatlab_measure::is_url(&a.host) {
        return usage("monitor: HOST is a bloatlab server (HOST[:PORT]), not a URL");
    }
    test.length = a.length;
    let key = match load_key(a.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let rider = match &a.autorate {
        Some(file) => match crate::autorate_cmd::rider(file, &a.host, stop.clone()) {
            Ok(r) => Some(r),
            Err(e) => return usage(e),
        },
        None => None,
    };
    let cfg = MonitorConfig {
        rider,
        target: a.host,
        test,
        http,
        every: (!a.every.is_zero()).then_some(a.every),
        probe_rate: a.probe_rate,
        iface: a.iface,
        db: a.db,
        out_dir: a.out_dir,
        metrics: a.metrics,
        budget_per_day: a.budget,
        site: a.site,
        keep_probes: a.keep,
        keep_tests: a.keep_tests,
        key,
        stop,
    };
    let say = Box::new(|line: &str| {
        let stamp = humantime::format_rfc3339_seconds(SystemTime::now());
        eprintln!("{stamp} {line}");
    });
    match bloatlab_monitor::run(cfg, say) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// glibc gives each new thread's allocations an arena of their own, up to 8 per core, and every
/// scheduled test runs on fresh threads: over 1000 short tests the monitor's RSS crept from 12.4
/// to 14.9 MB, with one arena it stayed at 12.2-12.4 (BENCHMARKS.md). A few allocations a
/// second need no parallel arenas.
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only tunes the allocator, under its own lock.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[derive(Args)]
pub struct HistoryArgs {
    /// The monitor's history.
    #[arg(long, default_value = "bloatlab-history.db")]
    pub db: PathBuf,
    /// How far back (e.g. 24h, 7d).
    #[arg(long, default_value = "7d", value_parser = duration)]
    pub since: Duration,
    /// Print the history as JSON (format "bloatlab-history").
    #[arg(long)]
    pub json: bool,
}

fn read_history(db: &Path, since: Duration) -> Result<History, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    Store::open_read(db)
        .and_then(|s| s.history(now - since.as_secs() as i64, now + 60))
        .map_err(|e: StoreError| e.to_string())
}

pub fn history(a: HistoryArgs) -> ExitCode {
    show(
        read_history(&a.db, a.since),
        a.json,
        bloatlab_report::text::history_text,
    )
}

/// `bloatlab report --db`: the history as an HTML page.
#[cfg(feature = "report")]
pub fn history_report(db: &Path, since: Duration, out: &Path) -> ExitCode {
    let page = match read_history(db, since) {
        Ok(h) => bloatlab_report::html::render_history(&h),
        Err(e) => return fail(e),
    };
    match std::fs::write(out, page) {
        Ok(()) => {
            eprintln!(
                "history report written to {} (opens offline in any browser)",
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(format!("{}: {e}", out.display())),
    }
}
