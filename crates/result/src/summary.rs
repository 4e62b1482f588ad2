//! Summary of a run: the fields scripts depend on (see the README) plus detail. Computed by
//! `bloatlab-analyze` from the series; stored here because it is part of the file contract.

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub samples: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FlowThroughput {
    pub name: String,
    pub direction: String,
    pub dscp: u8,
    pub mbps: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Throughput {
    /// Sum of download flows' goodput over the measured part of the load phase, Mbit/s.
    pub down: Option<f64>,
    pub up: Option<f64>,
    pub total: Option<f64>,
    pub per_flow: Vec<FlowThroughput>,
    /// Jain's fairness index among the flows of one direction (1 = equal shares).
    pub fairness_down: Option<f64>,
    pub fairness_up: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DirectionLatency {
    pub up: Option<Percentiles>,
    pub down: Option<Percentiles>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamLatency {
    pub name: String,
    pub dscp: u8,
    pub idle: Option<Percentiles>,
    pub loaded: Option<Percentiles>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    /// Round-trip times of UDP probes during the idle phase.
    pub idle: Option<Percentiles>,
    /// Round-trip times of UDP probes during the load phase (after its ramp-up).
    pub loaded: Option<Percentiles>,
    /// One-way delays under load, per direction (clock-offset corrected); only when the offset
    /// is known within the README's bound, else `null` and `owd_unavailable` says why.
    pub loaded_owd: DirectionLatency,
    pub idle_owd: DirectionLatency,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owd_unavailable: Option<String>,
    /// Round trips of fresh TCP connections (connect time), as httping measures.
    pub tcp_connect: Option<Percentiles>,
    pub per_stream: Vec<StreamLatency>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Loss {
    pub sent: u64,
    pub lost: u64,
    pub percent: f64,
    /// Split by direction when the server reported what it received.
    pub up_percent: Option<f64>,
    pub down_percent: Option<f64>,
    /// Probes the server declined by its own rate limit: not counted as loss.
    pub server_limited: u64,
    /// Round-trip loss of the probes sent in each phase (whole phases), percent.
    #[serde(default)]
    pub idle_percent: Option<f64>,
    #[serde(default)]
    pub load_percent: Option<f64>,
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Jitter {
    /// RFC 3550 interarrival jitter, ms.
    pub up: Option<f64>,
    pub down: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Voip {
    /// ITU-T G.107 transmission rating R and the MOS it maps to, per direction.
    pub r_up: f64,
    pub r_down: f64,
    pub mos_up: f64,
    pub mos_down: f64,
    /// The worse of the two directions.
    pub mos: f64,
    /// Mouth-to-ear delay the E-model was given, ms.
    pub mouth_to_ear_up_ms: f64,
    pub mouth_to_ear_down_ms: f64,
    /// Where the network part of it came from: "one-way p99" or, when the clock offset is too
    /// uncertain, "idle rtt/2 + added one-way p99".
    #[serde(default)]
    pub delay_basis: String,
    /// Packet loss the E-model was given per direction, percent: the call's network loss in the
    /// evaluated window plus packets later than the jitter buffer (the 1 % beyond p99).
    #[serde(default)]
    pub loss_up_percent: f64,
    #[serde(default)]
    pub loss_down_percent: f64,
    /// G.107 BurstR of those losses per direction (1 = random).
    #[serde(default)]
    pub burst_r_up: f64,
    #[serde(default)]
    pub burst_r_down: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Rpm {
    /// Round trips per minute under working conditions (draft-ietf-ippm-responsiveness).
    pub rpm: f64,
    /// 60000 / trimmed mean of new-connection probe times.
    pub foreign: f64,
    /// 60000 / trimmed mean of probes on loaded connections; null where the transport carries
    /// none (HTTP/1.1: a load connection's one request at a time is its load), and then the
    /// RPM is the foreign term alone.
    pub loaded: Option<f64>,
    /// The same computation with the path idle.
    pub idle: Option<f64>,
    /// "poor" | "fair" | "good" | "excellent".
    pub band: String,
    pub load_connections: usize,
    /// Completed probes the result is computed from (foreign and self), those of the last MAD
    /// intervals of the load.
    pub probes: usize,
    /// Probes of the load phase that never completed (connection refused or timed out, no
    /// answer on a loaded connection by the end): not in the means, but counted here.
    #[serde(default)]
    pub probe_timeouts: usize,
    /// Load connections that failed (refused, answered with an error, broken): with any, the
    /// load was weaker than the draft's and the RPM reads too high.
    #[serde(default)]
    pub failed_connections: usize,
    /// The draft's confidence: "low" (fewer than MAD intervals), "medium" (no stability),
    /// "high" (goodput and responsiveness stable).
    #[serde(default)]
    pub confidence: String,
    /// Seconds of load over which the result's probes were taken (the last MAD intervals).
    #[serde(default)]
    pub window_s: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RpmByDirection {
    pub down: Option<Rpm>,
    pub up: Option<Rpm>,
}

/// `networkQuality -c` field names (rpm tests only; absent otherwise). bloatlab's RPM loads
/// both directions at once by default, as networkQuality does, so its one `responsiveness`
/// covers both; `--sequential` (as `networkQuality -s`) adds `dl_responsiveness` and
/// `ul_responsiveness`, and `responsiveness` is then the worse of the two.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct NetworkQuality {
    /// Download goodput, bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dl_throughput: Option<u64>,
    /// Upload goodput, bits per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ul_throughput: Option<u64>,
    /// RPM (`rpm.rpm`), whole round trips per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responsiveness: Option<u64>,
    /// Sequential tests: RPM under download load only (`rpm_by_direction.down.rpm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dl_responsiveness: Option<u64>,
    /// Sequential tests: RPM under upload load only (`rpm_by_direction.up.rpm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ul_responsiveness: Option<u64>,
    /// Idle round trip, ms: the idle probes' p50, or (HTTP transport) the idle probe time the
    /// idle RPM comes from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_rtt: Option<f64>,
}

/// How bursty a stream was at one end: per-bucket byte counts against their mean over the
/// stream's active span (first to last packet). 1 is perfectly smooth; an on/off sender that
/// sends 5 ms in every 100 has a peak of 20.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct BurstProfile {
    pub bucket_ms: f64,
    pub peak_over_mean: f64,
    pub p99_over_mean: f64,
}

/// The burst profile where the packets left (`send`) and where they arrived (`recv`).
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Burst {
    pub send: Option<BurstProfile>,
    pub recv: Option<BurstProfile>,
}

/// A UDP load test's stream (`test udp`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct UdpLoad {
    pub pacing: String,
    /// What the sender achieved: payload bits sent over its active span, Mbit/s.
    pub send_mbps: f64,
    pub sent: u64,
    pub received: Option<u64>,
    pub reordered: Option<u64>,
    pub duplicates: Option<u64>,
    /// Sends the sender's kernel refused (retried) and packets skipped after a stall.
    pub send_errors: u64,
    pub skipped: u64,
    /// The server's own drops (full socket buffer) and declines (beyond the announced rate):
    /// part of the loss, not the network's.
    pub server_socket_drops: Option<u64>,
    pub server_limited: Option<u64>,
    /// Sent ECN-capable (`--ecn`): how many arrived CE, marked by a queue instead of dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ce: Option<u64>,
}

/// When the kernel began writing a writeback test's data to the disk (`test writeback`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WritebackStart {
    /// Bytes the test had written, and ms since its first write, when pages began to go to the
    /// disk; both `null` when nothing went before the closing fsync forced it.
    pub started_after_bytes: Option<u64>,
    pub started_after_ms: Option<f64>,
    /// Bytes the test wrote.
    pub bytes: u64,
    /// The page cache at its fullest during the test: dirty, and under writeback, MB.
    pub dirty_peak_mb: f64,
    pub writeback_peak_mb: f64,
    /// Small write + fsync round trips before the big write began (the baseline), ms.
    pub small_sync_idle_ms: Option<Percentiles>,
    /// What else moved the machine-wide counters, when something did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disturbed: Option<String>,
}

/// What a path MTU means for TCP and for tunnels over the path (`test mtu`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MtuAdvice {
    pub tcp_mss: u32,
    /// OpenVPN 2.4's `mssfix` (the largest UDP payload it sends).
    pub openvpn_mssfix: u32,
    pub wireguard_mtu: u32,
    /// The advice in words.
    pub lines: Vec<String>,
}

/// A figure per load phase: download only, upload only, both ways at once.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ByPhase {
    pub download: Option<f64>,
    pub upload: Option<f64>,
    pub both: Option<f64>,
}

/// One letter grade per direction of load, and the loss cap that lowered each, if one did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GradeByDirection {
    pub down: Option<String>,
    pub up: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_loss_cap: Option<LossCap>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub up_loss_cap: Option<LossCap>,
}

/// Loss under load that lowered a grade: a path that drops a probe in twenty keeps its delay
/// low by losing what a call or a game needs (thresholds in the README).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LossCap {
    /// Probes lost under load, percent.
    pub loss_percent: f64,
    /// The grade the added latency alone gives.
    pub latency_grade: String,
    /// The best grade that loss allows.
    pub at_most: String,
}

/// Whether each direction's load filled the path: its goodput had stopped growing (the second
/// half of the phase's steady window within 25% of the first). `false` means the numbers
/// describe a path that was not full, so its queue may not have been reached.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Saturated {
    pub down: Option<bool>,
    pub up: Option<bool>,
}

/// A figure per DiffServ class of probes.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ByClass {
    pub be: Option<f64>,
    pub ef: Option<f64>,
    pub bk: Option<f64>,
}

/// The class a probe's DSCP falls in: "ef" (EF 46, VA 44), "bk" (CS1 8, LE 1), else "be".
pub fn probe_class(dscp: u8) -> &'static str {
    match dscp {
        46 | 44 => "ef",
        8 | 1 => "bk",
        _ => "be",
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub test: String,
    pub throughput_mbps: Throughput,
    pub latency_ms: Latency,
    /// Loaded p50 minus idle p50 round trip, ms: of the best-effort (unmarked) probes when the
    /// test has them, else of all probes. A DiffServ-aware queue (CAKE) delays bulk-marked
    /// probes on purpose; pooling them would grade it down for doing its job.
    pub added_latency_ms: Option<f64>,
    /// The same per probe class: `be` unmarked and other codepoints, `ef` EF/VA, `bk` CS1/LE.
    #[serde(default)]
    pub added_latency_ms_by_class: ByClass,
    /// Each load phase's p50 round trip minus the idle p50, ms: the browser test's download,
    /// upload and both-ways phases; a CLI test fills the one its load is (tcp-down: download,
    /// tcp-up: upload, tcp-bidir and rrul: both).
    #[serde(default)]
    pub phase_added_latency_ms: ByPhase,
    /// The grade of each one-way phase. When a test has both, the worse sets `grade` and
    /// `added_latency_ms` (never averaged away).
    #[serde(default)]
    pub grade_by_direction: GradeByDirection,
    /// Tests with one-way phases: whether each direction's load filled the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saturated: Option<Saturated>,
    /// One-way delay above that direction's idle minimum, over the loaded window (no clock
    /// offset needed, drift corrected when known).
    #[serde(default)]
    pub added_owd_ms: DirectionLatency,
    /// Which direction's queue adds the delay: "up", "down", "both" or "none" (rule in the README).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bloat_direction: Option<String>,
    /// A+ .. F for the added latency, at most what the loss under load allows (thresholds in
    /// the README).
    pub grade: Option<String>,
    /// Set when loss under load lowered `grade`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grade_loss_cap: Option<LossCap>,
    /// Set when a test whose load is TCP flows had none running: why (every flow failed to
    /// open). Its probes measured an idle path, so it has no loaded figures and no grade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_missing: Option<String>,
    pub loss: Loss,
    pub jitter_ms: Jitter,
    pub voip: Option<Voip>,
    /// RPM; in a sequential test the worse direction's, which `rpm_by_direction` shows apart.
    pub rpm: Option<Rpm>,
    /// Sequential RPM tests: each direction's responsiveness, measured under its own load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm_by_direction: Option<RpmByDirection>,
    /// The rpm test's figures under the names Apple's `networkQuality -c` prints, so that
    /// scripts written for it read bloatlab's JSON too.
    #[serde(flatten)]
    pub network_quality: NetworkQuality,
    /// TCP retransmissions of the client's sending sockets (upload flows).
    pub tcp_retransmits: Option<u64>,
    /// `test udp`: the load stream; `loss` then is its loss (the probes' is per stream in the
    /// metadata), `throughput_mbps.up` its goodput at the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UdpLoad>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<Burst>,
    /// `test writeback`: when writeback started, how long `write()` calls and the closing
    /// fsync took, the rate to stable storage and to the cache, and the latency of a small
    /// write + fsync on the same filesystem while the big one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writeback: Option<WritebackStart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_stall_ms: Option<Percentiles>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsync_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_mbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_mbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_sync_ms: Option<Percentiles>,
    /// `test mtu`: the largest IP packet that crosses the path, whether larger ones vanish
    /// without an ICMP error (a black hole), and what follows for TCP and tunnels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_mtu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blackhole: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice: Option<MtuAdvice>,
    /// `test marks`: what became of each DSCP and ECN code point, each way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub marks: Option<crate::marks::MarksReport>,
    pub partial: bool,
}
