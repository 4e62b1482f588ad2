//! The monitor's history (an SQLite file, `bloatlab monitor --db`): the rows it keeps and what
//! `bloatlab history --json` prints from them.

use serde::{Deserialize, Serialize};

/// What `history --json` prints: `format` names it, `version` is bumped on any change an older
/// reader would misread.
pub const FORMAT: &str = "bloatlab-history";
pub const VERSION: u32 = 1;

/// How busy this host's interface was when a probe left: by its rate in the busier direction
/// against the capacity the last scheduled test measured (thresholds in `bloatlab monitor
/// --help`). `Unknown` when no interface is watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadBand {
    Idle,
    Light,
    Busy,
    Unknown,
}

impl LoadBand {
    pub const ALL: [LoadBand; 4] = [
        LoadBand::Idle,
        LoadBand::Light,
        LoadBand::Busy,
        LoadBand::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LoadBand::Idle => "idle",
            LoadBand::Light => "light",
            LoadBand::Busy => "busy",
            LoadBand::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<LoadBand> {
        LoadBand::ALL.into_iter().find(|b| b.name() == s)
    }
}

/// Quantiles of one set of delays, ms.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

/// One minute of light probes to one target in one load band.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MinuteRow {
    /// Start of the minute, Unix seconds (a multiple of 60).
    pub minute: i64,
    pub target: String,
    pub load: LoadBand,
    /// A scheduled test of this monitor ran during the minute (its own load, not the household's).
    pub testing: bool,
    pub sent: u32,
    /// Probes with no answer within the loss timeout.
    pub lost: u32,
    pub rtt_ms: Option<Quantiles>,
    /// One-way delays (clock offset from the fastest echoes of the last minutes).
    pub owd_up_ms: Option<Quantiles>,
    pub owd_down_ms: Option<Quantiles>,
    /// The interface's mean rate while these probes left, Mbit/s.
    pub rx_mbps: f64,
    pub tx_mbps: f64,
    /// The round trips as (microseconds, count) at 2 significant digits (an HDR histogram's
    /// buckets), so hours and days merge exactly rather than averaging percentiles.
    pub rtt_hist: Vec<(u64, u64)>,
}

/// One scheduled test: run (with its result file and summary) or skipped (and why).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TestRow {
    /// Unix seconds when it started (or would have).
    pub started: i64,
    pub target: String,
    pub test: String,
    pub length_s: f64,
    /// The result file, as `bloatlab test` writes it.
    pub result_path: Option<String>,
    pub grade: Option<String>,
    /// Loaded minus idle p50 round trip, ms (what the grade is from).
    pub added_ms: Option<f64>,
    /// Added one-way delay p50 per direction, ms.
    pub added_down_ms: Option<f64>,
    pub added_up_ms: Option<f64>,
    pub idle_ms: Option<f64>,
    pub down_mbps: Option<f64>,
    pub up_mbps: Option<f64>,
    pub loss_percent: Option<f64>,
    /// Bytes the test moved (goodput times length), counted against the day's budget.
    pub bytes: u64,
    /// Why it did not run, when it did not.
    pub skipped: Option<String>,
    /// "complete", "interrupted", "server lost: ...", "failed: ...".
    pub ended: Option<String>,
}

/// A time the target did not answer at all.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Gap {
    pub started: i64,
    /// `None` while it lasts.
    pub ended: Option<i64>,
    pub target: String,
    pub why: String,
}

/// One minute (or, in `History`, one hour) of a CAKE tin on the watched interface or its
/// ingress twin (`ifb4IFACE`): the counters' growth over it, the delays as tc last showed them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ShaperRow {
    pub minute: i64,
    pub iface: String,
    /// As `tc -s qdisc show` names it: "Bulk", "Best Effort", "Video", "Voice", "Tin 0" ...
    pub tin: String,
    /// The shaper's rate then, bits per second (0: unlimited).
    pub rate_bps: u64,
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
    /// ECN CE marks (CAKE marked instead of dropping).
    pub marks: u64,
    pub ack_drops: u64,
    pub backlog_bytes: u64,
    /// tc's pk_delay, av_delay and sp_delay (CAKE's own decaying estimates), µs; an hour
    /// keeps the largest of each.
    pub pk_delay_us: u64,
    pub av_delay_us: u64,
    pub sp_delay_us: u64,
}

/// One hour of probes in one load band (minutes merged, scheduled tests' minutes left out).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HourRow {
    /// Start of the hour, Unix seconds.
    pub hour: i64,
    pub load: LoadBand,
    pub sent: u64,
    pub lost: u64,
    pub rtt_ms: Option<Quantiles>,
}

/// `bloatlab history --json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct History {
    pub format: String,
    pub version: u32,
    /// The window, Unix seconds.
    pub since: i64,
    pub until: i64,
    pub tests: Vec<TestRow>,
    pub hours: Vec<HourRow>,
    pub gaps: Vec<Gap>,
    /// Hours whose busy (else light) p90 round trip was worst, worst first, at most 5.
    pub worst_hours: Vec<HourRow>,
    /// The same per hour of the UTC day (`hour` 0..23), over all the window's days.
    #[serde(default)]
    pub hours_of_day: Vec<HourRow>,
    /// CAKE per hour, interface and tin (`minute` is the hour's start).
    #[serde(default)]
    pub shaper: Vec<ShaperRow>,
}

/// Prometheus' and the history's number for a grade: A+ = 6 down to F = 0.
pub fn grade_number(grade: &str) -> Option<u8> {
    ["F", "D", "C", "B", "A", "A+"]
        .iter()
        .position(|g| *g == grade)
        .map(|i| i as u8)
}
