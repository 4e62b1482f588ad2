//! The locate file (`bloatlab locate`): hops, each phase's test, the verdict, and every raw
//! probe and queue sample. Written by the locate crate, read by `report` and `tune`.

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "bloatlab-locate";
pub const VERSION: u32 = 1;

/// Largest locate file read: some 30 hops probed once a second over three phases is well
/// under a megabyte.
const MAX_BYTES: u64 = 64 << 20;

/// One TTL-limited probe and its answer, if any.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HopProbe {
    pub ttl: u8,
    /// Wall-clock send time, seconds since the Unix epoch (to place it in a test's phases).
    pub sent_unix: f64,
    pub rtt_ms: Option<f64>,
    pub from: Option<IpAddr>,
    /// The answer came from the destination (Port Unreachable).
    pub reached: bool,
}

/// One sample of this host's own interface queue (the root qdisc's backlog).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueSample {
    pub t_unix: f64,
    pub backlog_bytes: u64,
    pub backlog_packets: u64,
}

/// The queue on this host's own way out (hop 0), sampled while the test loads the path.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LocalQueue {
    pub interface: String,
    /// The interface's transmit queue length (packets), from sysfs.
    pub txqueuelen: Option<u64>,
    /// Byte queue limit of its first transmit queue, when the driver uses BQL.
    pub bql_limit: Option<u64>,
    pub samples: Vec<QueueSample>,
}

/// A load phase: which directions carry bulk traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    #[default]
    Download,
    Upload,
    Both,
}

impl Load {
    pub const ALL: [Load; 3] = [Load::Download, Load::Upload, Load::Both];
    pub fn name(self) -> &'static str {
        match self {
            Load::Download => "download",
            Load::Upload => "upload",
            Load::Both => "both",
        }
    }
    /// A phase by the name the command line takes (`download` or `down`, `upload` or `up`,
    /// `both`).
    pub fn parse(name: &str) -> Option<Load> {
        match name {
            "download" | "down" => Some(Load::Download),
            "upload" | "up" => Some(Load::Upload),
            "both" => Some(Load::Both),
            _ => None,
        }
    }
}

/// Which way the bloated queue holds packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BloatDirection {
    Up,
    Down,
    Both,
    #[default]
    None,
}

/// One bloated place: the link into `hop` (0: this host's own interface queue).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Finding {
    pub hop: u8,
    pub address: Option<IpAddr>,
    pub direction: BloatDirection,
    /// What this place adds under load (its added round trip minus the previous hop's), ms.
    pub added_ms: f64,
    /// The path's added round trip in the same load, ms.
    pub path_added_ms: f64,
    pub confidence: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Verdict {
    /// TTL of the hop at the far end of the bloated link, 0 for this host, null for none.
    pub hop: Option<u8>,
    pub address: Option<IpAddr>,
    pub direction: BloatDirection,
    pub added_ms: f64,
    pub confidence: f64,
    pub text: String,
    /// Another place that bloats in the other direction.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<Finding>,
    /// What the verdict could not see or chose to discount.
    pub caveats: Vec<String>,
}

/// One hop as reported: answers, idle p50 and loaded p50/p90 per phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HopReport {
    pub ttl: u8,
    pub address: Option<IpAddr>,
    /// The address's reverse name, when a lookup answered in time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub destination: bool,
    pub answered: u32,
    pub sent: u32,
    pub idle_p50_ms: Option<f64>,
    pub phases: PhaseStats,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub download: Option<Loaded>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upload: Option<Loaded>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub both: Option<Loaded>,
}

impl PhaseStats {
    pub fn get(&self, load: Load) -> Option<Loaded> {
        match load {
            Load::Download => self.download,
            Load::Upload => self.upload,
            Load::Both => self.both,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Loaded {
    pub p50_ms: f64,
    pub p90_ms: f64,
    pub answered: usize,
}

/// One load phase's test.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseRun {
    pub load: Load,
    pub test: String,
    pub file: PathBuf,
    pub added_latency_ms: Option<f64>,
    pub throughput_down_mbps: Option<f64>,
    pub throughput_up_mbps: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LocateMetadata {
    pub tool: String,
    pub tool_version: String,
    pub target: String,
    pub address: Option<IpAddr>,
    pub start_time: String,
    pub hop_interval_s: f64,
    pub max_hops: u8,
    /// "udp" or "icmp".
    pub probes: String,
}

/// The locate file: versioned, with every raw probe and queue sample.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LocateFile {
    pub format: String,
    pub version: u32,
    pub metadata: LocateMetadata,
    pub phases: Vec<PhaseRun>,
    pub hops: Vec<HopReport>,
    pub local: Option<LocalQueue>,
    pub verdict: Verdict,
    /// True while running, and when a phase failed or Ctrl-C ended it early.
    pub partial: bool,
    pub probes: Vec<HopProbe>,
}

/// Only the fields that say what a JSON file is.
#[derive(Deserialize)]
struct Head {
    format: Option<String>,
    version: Option<serde_json::Value>,
}

/// `None` when the bytes are not a locate file (another format, or not JSON); else the file,
/// or why this version cannot read it.
pub fn parse(raw: &[u8]) -> Option<Result<LocateFile, String>> {
    let head: Head = serde_json::from_slice(raw).ok()?;
    if head.format.as_deref() != Some(FORMAT) {
        return None;
    }
    match head.version.as_ref().and_then(|v| v.as_u64()) {
        Some(v) if v == u64::from(VERSION) => {}
        _ => {
            let v = head.version.map_or("none".into(), |v| v.to_string());
            return Some(Err(format!(
                "locate file version {v} (this bloatlab reads version {VERSION})"
            )));
        }
    }
    Some(serde_json::from_slice(raw).map_err(|e| format!("locate file: {e}")))
}

/// The locate file at `path`: `Ok(None)` when it holds another format.
pub fn read(path: &Path) -> Result<Option<LocateFile>, String> {
    use std::io::Read;
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_BYTES).read_to_end(&mut raw))
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&raw)
        .transpose()
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_formats_are_not_locate_files_and_other_versions_say_so() {
        assert!(parse(b"not json").is_none());
        assert!(parse(br#"{"format":"bloatlab-result","version":1}"#).is_none());
        let v2 = parse(br#"{"format":"bloatlab-locate","version":2}"#).unwrap();
        assert!(v2.unwrap_err().contains("version 2"));
        let minimal = parse(br#"{"format":"bloatlab-locate","version":1}"#).unwrap();
        assert_eq!(minimal.unwrap().verdict.hop, None);
    }

    #[test]
    fn a_written_file_reads_back_field_for_field() {
        let f = LocateFile {
            format: FORMAT.into(),
            version: VERSION,
            verdict: Verdict {
                hop: Some(0),
                direction: BloatDirection::Up,
                text: "this host".into(),
                ..Default::default()
            },
            hops: vec![HopReport {
                ttl: 2,
                phases: PhaseStats {
                    upload: Some(Loaded {
                        p50_ms: 94.0,
                        p90_ms: 96.0,
                        answered: 8,
                    }),
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        let back = parse(&serde_json::to_vec(&f).unwrap()).unwrap().unwrap();
        assert_eq!(back.verdict, f.verdict);
        assert_eq!(back.hops[0].phases.get(Load::Upload).unwrap().p90_ms, 96.0);
    }
}
