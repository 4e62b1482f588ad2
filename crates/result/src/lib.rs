//! The result file: everything a report or advice needs, so nothing is re-measured to draw it.
//! Writers replace the file atomically (temp file + rename), so a run killed at any moment
//! leaves the last complete snapshot, marked `partial`.

pub mod autorate;
pub mod history;
pub mod lab;
pub mod locate;
pub mod marks;
pub mod params;
mod summary;

pub use summary::*;

use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "bloatlab-result";
/// Bumped on any change that an older reader would misread.
pub const VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ResultFile {
    pub format: String,
    pub version: u32,
    pub metadata: Metadata,
    pub series: Vec<Series>,
    pub events: Vec<Event>,
    pub summary: Option<Summary>,
    /// True while the run is going on and when it ended early (Ctrl-C, kill, server lost).
    pub partial: bool,
}

impl ResultFile {
    pub fn new(metadata: Metadata) -> Self {
        ResultFile {
            format: FORMAT.into(),
            version: VERSION,
            metadata,
            series: Vec::new(),
            events: Vec::new(),
            summary: None,
            partial: true,
        }
    }

    pub fn series(&self, name: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.name == name)
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Host {
    pub name: String,
    pub address: Option<String>,
    pub software: String,
    pub kernel: String,
    /// System-wide default TCP congestion control of that host.
    pub default_cc: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Phase {
    pub name: String,
    /// Seconds from the test start.
    pub start: f64,
    pub end: f64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct ClockOffset {
    /// Server clock minus client clock, ms; one-way delays are corrected by it.
    pub offset_ms: f64,
    /// Half the round trip of the probes it came from: the true offset lies within +/- this.
    pub uncertainty_ms: f64,
    pub samples: usize,
    /// Seconds from the test start at which `offset_ms` holds.
    #[serde(default)]
    pub reference_s: f64,
    /// How fast the offset changes, parts per million (server clock rate minus client's), from a
    /// second estimate after the load; `None` when there was none or its queues had not drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_ppm: Option<f64>,
}

impl ClockOffset {
    /// The offset at `t` seconds from the test start, ms (drift applied when known).
    pub fn at(&self, t: f64) -> f64 {
        self.offset_ms + self.drift_ppm.unwrap_or(0.0) * 1e-6 * (t - self.reference_s) * 1e3
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Metadata {
    pub tool: String,
    pub tool_version: String,
    pub test: String,
    /// The test's parameters as given (flows, length, step, dscp, ...).
    pub params: serde_json::Value,
    pub client: Host,
    pub server: Host,
    /// Congestion control asked for with --cc; `None` means each sender's default.
    pub cc: Option<String>,
    /// RFC 3339, UTC.
    pub start_time: String,
    /// Sampling step of throughput series, seconds.
    pub step: f64,
    pub phases: Vec<Phase>,
    pub clock_offset: Option<ClockOffset>,
    /// Per bulk flow: the congestion control actually in effect on its sending socket.
    #[serde(default)]
    pub flows: Vec<FlowInfo>,
    /// Per UDP stream: what was sent, and what each side received (for loss by direction).
    pub streams: Vec<StreamCounts>,
    /// Ground truth from an emulated network (filled in by the lab), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lab: Option<lab::LabCounters>,
    /// RPM tests: the draft's algorithm interval by interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<RpmRun>,
    /// Sequential RPM tests (download, then upload): each direction's run; `rpm` is then absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm_by_direction: Option<RpmRunByDirection>,
    /// UDP load tests: what was sent, when, and what the server received, when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UdpLoadInfo>,
}

/// A UDP load (`test udp`): the sender's and the server's per-bucket byte counts are the raw
/// samples of its burst profile; each side's first bucket starts at its `*_start` (seconds from
/// the test start on the client's clock; the server's mapped through the clock offset).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct UdpLoadInfo {
    /// UDP payload rate asked for, Mbit/s, and payload bytes per packet.
    pub rate_mbps: f64,
    pub size: u16,
    pub dscp: u8,
    /// The ECN code point every packet carried (0 Not-ECT, 1 ECT(1), 2 ECT(0)).
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub ecn: u8,
    /// The pacing asked for (`auto`, `fq`, `timer`, `timer:1ms`, `burst:100ms`) and used.
    pub pacing: String,
    pub pacing_used: String,
    /// How `auto` chose, or why the pacing asked for could not be used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pacing_note: Option<String>,
    pub bucket_ms: f64,
    /// Packets handed to the kernel, sends it refused (retried), packets skipped after a stall.
    pub sent: u64,
    pub send_errors: u64,
    pub skipped: u64,
    pub send_start: Option<f64>,
    pub send_bytes: Vec<u32>,
    /// What the server reported; absent when it did not (an older server, a lost connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<UdpLoadServer>,
}

fn is_zero_u8(v: &u8) -> bool {
    *v == 0
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct UdpLoadServer {
    pub received: u64,
    pub bytes: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Beyond twice the announced rate: declined by the server, not network loss.
    pub server_limited: u64,
    /// Of the packets received, those that arrived CE: a queue on the way marked instead of
    /// dropping (0 unless the load was sent ECN-capable, `--ecn`).
    #[serde(default)]
    pub ce: u64,
    /// Datagrams the server's host dropped for a full receive buffer during the test.
    pub socket_drops: Option<u64>,
    pub recv_start: Option<f64>,
    pub recv_bytes: Vec<u32>,
}

/// A sequential RPM test's two runs of the draft's algorithm, each on its own connections.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RpmRunByDirection {
    pub down: RpmRun,
    pub up: RpmRun,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct FlowInfo {
    pub name: String,
    pub cc: Option<String>,
    /// Payload bytes the server counted (upload: received; download: written), if it reported.
    pub server_bytes: Option<u64>,
    /// Seconds since the test started at which the flow's handshake ended and its data began;
    /// its first throughput sample covers the time from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<f64>,
    /// Why the flow could not be opened, or that its connection broke (the test went on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The DSCP the sending socket (the client's for an upload, the server's for a download)
    /// carried, read back after setting it: the mark as applied, not as intended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp_applied: Option<u8>,
}

/// How an RPM test went, interval by interval (draft-ietf-ippm-responsiveness's algorithm).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RpmRun {
    /// ID: seconds per interval; one load connection per direction was added each interval.
    pub interval_s: f64,
    /// MAD: intervals per moving average, and moving averages per stability test.
    pub mad: u32,
    /// SDT: the stability tolerance (standard deviation over the current value).
    pub sdt: f64,
    pub intervals: Vec<RpmInterval>,
    /// Seconds into the test at which goodput (each loaded direction) became stable.
    pub goodput_saturated_at: Option<f64>,
    /// Seconds into the test at which responsiveness became stable after it: the test's end.
    pub responsiveness_saturated_at: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RpmInterval {
    /// Seconds into the test at which the interval ended.
    pub t: f64,
    pub down_mbps: Option<f64>,
    pub up_mbps: Option<f64>,
    /// RPM of the probes of the last MAD intervals, as it stood at the end of this one.
    pub responsiveness: Option<f64>,
    /// Load connections per loaded direction during the interval (the ramp adds one each
    /// interval): RPMs of clients that ramp differently compare at equal counts. Absent in
    /// files written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_connections: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StreamCounts {
    /// Stream name as in the series names ("udp-be", "voip", ...).
    pub name: String,
    pub dscp: u8,
    /// The ECN code point both ways (`--ecn`; 0 Not-ECT).
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub ecn: u8,
    pub interval_ms: f64,
    pub size: u16,
    pub sent: u64,
    /// Replies the client received.
    pub received: u64,
    /// Requests the server received, from its final report (absent if it never came).
    pub server_received: Option<u64>,
    /// Requests the server declined by its own rate limit: not network loss.
    pub server_limited: u64,
    /// The DSCP the client's requests carried, read back from its socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp_applied_up: Option<u8>,
    /// The DSCP the server's replies carried, read back from its socket (its report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp_applied_down: Option<u8>,
    /// The TOS bytes (DSCP and ECN) the requests arrived at the server with (its report), and
    /// the replies here with, each with its count: what the path did to the marks each way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tos_arrived_up: Vec<(u8, u64)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tos_arrived_down: Vec<(u8, u64)>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SeriesKind {
    /// Mbit/s of goodput per step, timestamped at the end of the step (a download's as the
    /// client acknowledged it, where the server reported that).
    Throughput,
    /// Mbit/s the receiver read per step, beside a download's acknowledged `Throughput`: the
    /// same bytes, bunched where a filled hole released what waited behind it.
    Received,
    /// Round-trip time in ms, timestamped at send; `null` for a probe that never came back.
    Latency,
    /// One-way delay in ms (clock-offset corrected), timestamped at send; `null` when lost.
    Owd,
    /// Cumulative count of lost packets, timestamped at send.
    Loss,
    /// Megabytes (10^6 bytes) at the sample's time: page-cache counters of a writeback test.
    Bytes,
}

/// Series names follow one convention so that readers find them:
/// `tcp down 3 CS5` (throughput of flow 3), `rtt udp-ef`, `owd up udp-ef`, `owd down voip`,
/// `tcp-connect` (new-connection round trips), `rpm foreign-connect`, `rpm foreign-request`,
/// `rpm loaded`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Series {
    pub name: String,
    pub kind: SeriesKind,
    /// "down", "up", or absent for round trips.
    pub direction: Option<String>,
    pub dscp: Option<u8>,
    pub unit: String,
    /// `[t_seconds, value]`; a `null` value marks a lost packet.
    pub samples: Vec<(f64, Option<f64>)>,
}

impl Series {
    /// Round trips in ms of unmarked (DSCP 0) packets, in neither direction.
    pub fn latency(name: &str, samples: Vec<(f64, Option<f64>)>) -> Series {
        Series {
            name: name.into(),
            kind: SeriesKind::Latency,
            direction: None,
            dscp: Some(0),
            unit: "ms".into(),
            samples,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Event {
    pub t: f64,
    pub what: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ResultError {
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a bloatlab result: {why}")]
    Format { path: PathBuf, why: String },
}

fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// Replaces `path` with `result` atomically: readers see the old or the new file, never half.
/// A device or pipe (`-o /dev/null`, `-o /dev/stdout`, a FIFO) is written in place instead:
/// renaming a temporary file over it would replace the device itself (as root, /dev/null).
pub fn write_atomic(path: &Path, result: &ResultFile) -> Result<(), ResultError> {
    let err = |source| ResultError::Write {
        path: path.to_path_buf(),
        source,
    };
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(err)?;
        return write_to(file, is_gz(path), result).map_err(err);
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = std::fs::File::create(&tmp).map_err(err)?;
    write_to(file, is_gz(path), result).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}

fn write_to(file: std::fs::File, gz: bool, result: &ResultFile) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(file);
    if gz {
        let mut gz = flate2::write::GzEncoder::new(&mut out, flate2::Compression::fast());
        // serde_json writes a few bytes at a time, and each write into the encoder runs the
        // compressor over its whole 32 KB output buffer (zeroed first): batch them.
        let mut batched = std::io::BufWriter::with_capacity(64 * 1024, &mut gz);
        serde_json::to_writer(&mut batched, result)?;
        batched.flush()?;
        drop(batched);
        gz.finish()?;
    } else {
        serde_json::to_writer(&mut out, result)?;
    }
    out.flush()
}

/// Reads a result file, gzipped or not (told apart by content, not name).
pub fn read(path: &Path) -> Result<ResultFile, ResultError> {
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut raw))
        .map_err(|source| ResultError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    parse(&raw).map_err(|why| ResultError::Format {
        path: path.to_path_buf(),
        why,
    })
}

/// Largest result accepted once decompressed: result files are shared, and a small gzip file
/// could otherwise unpack to all of memory. A 30 s test at a 1 ms step is some 20 MB.
const MAX_UNPACKED: u64 = 256 << 20;

/// A result file's bytes, gzipped or not, checked for format and version.
pub fn parse(raw: &[u8]) -> Result<ResultFile, String> {
    let unpacked;
    let json = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw)
            .take(MAX_UNPACKED + 1)
            .read_to_end(&mut out)
            .map_err(|e| e.to_string())?;
        if out.len() as u64 > MAX_UNPACKED {
            return Err(format!(
                "more than {} MiB once unpacked",
                MAX_UNPACKED >> 20
            ));
        }
        unpacked = out;
        &unpacked[..]
    } else {
        raw
    };
    let value: serde_json::Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    if value.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
        return Err(format!("no \"format\": \"{FORMAT}\""));
    }
    let version = value.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if version != VERSION as u64 {
        return Err(format!(
            "version {version}, this bloatlab reads version {VERSION}"
        ));
    }
    let r: ResultFile = serde_json::from_value(value).map_err(|e| e.to_string())?;
    check(&r)?;
    Ok(r)
}

/// What every reader relies on and a hand-edited or hostile file may break: times are finite,
/// phases end after they start, throughput samples (each covering the time since the one
/// before) lie in time order.
fn check(r: &ResultFile) -> Result<(), String> {
    let m = &r.metadata;
    if !(m.step.is_finite() && m.step > 0.0) {
        return Err(format!(
            "metadata.step {} is not a positive number of seconds",
            m.step
        ));
    }
    for p in &m.phases {
        if !(p.start.is_finite() && p.end.is_finite()) || p.end < p.start {
            return Err(format!(
                "phase `{}` runs from {} s to {} s",
                p.name, p.start, p.end
            ));
        }
    }
    for f in &m.flows {
        if f.start.is_some_and(|t| !t.is_finite()) {
            return Err(format!("flow `{}` starts at {:?} s", f.name, f.start));
        }
    }
    for s in &r.series {
        if let Some(w) = s.samples.windows(2).find(|w| {
            s.kind == SeriesKind::Throughput
                && w[0].0.partial_cmp(&w[1].0).is_none_or(|o| o.is_gt())
        }) {
            return Err(format!(
                "series `{}`: sample at {} s after one at {} s (times must be finite and in order)",
                s.name, w[1].0, w[0].0
            ));
        }
        if s.samples
            .iter()
            .any(|x| !x.0.is_finite() || x.1.is_some_and(|v| !v.is_finite()))
        {
            return Err(format!(
                "series `{}` has a sample that is not a finite number",
                s.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing (fuzz/fuzz_targets/result_file.rs): a load phase ending before it
    /// started made the summary's clamp panic. Such files are now refused with the reason.
    #[test]
    fn a_file_whose_phases_or_samples_make_no_sense_is_refused_with_the_reason() {
        let mut r = sample();
        r.metadata.phases = vec![Phase {
            name: "load".into(),
            start: 5.3,
            end: 1.3,
        }];
        let raw = serde_json::to_vec(&r).unwrap();
        assert_eq!(
            parse(&raw).unwrap_err(),
            "phase `load` runs from 5.3 s to 1.3 s"
        );
        let mut r = sample();
        r.series[0].kind = SeriesKind::Throughput;
        r.series[0].samples = vec![(2.0, Some(1.0)), (1.0, Some(1.0))];
        assert!(parse(&serde_json::to_vec(&r).unwrap())
            .unwrap_err()
            .contains("after one at 2 s"));
        assert!(parse(&serde_json::to_vec(&sample()).unwrap()).is_ok());
    }

    fn sample() -> ResultFile {
        let mut r = ResultFile::new(Metadata {
            tool: "bloatlab".into(),
            tool_version: "0.1.0".into(),
            test: "ping".into(),
            params: serde_json::json!({"length": 10}),
            client: Host::default(),
            server: Host::default(),
            cc: None,
            start_time: "2026-11-22T10:00:00Z".into(),
            step: 0.01,
            phases: vec![Phase {
                name: "idle".into(),
                start: 0.0,
                end: 10.0,
            }],
            clock_offset: None,
            flows: vec![],
            streams: vec![],
            lab: None,
            rpm: None,
            rpm_by_direction: None,
            udp: None,
        });
        r.series.push(Series {
            name: "rtt udp-be".into(),
            kind: SeriesKind::Latency,
            direction: None,
            dscp: Some(0),
            unit: "ms".into(),
            samples: vec![(0.0, Some(0.1)), (0.01, None)],
        });
        r
    }

    #[test]
    fn round_trips_plain_and_gzipped() {
        let dir = std::env::temp_dir().join(format!("bloatlab-result-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["r.json", "r.json.gz"] {
            let p = dir.join(name);
            write_atomic(&p, &sample()).unwrap();
            assert_eq!(read(&p).unwrap(), sample());
            assert!(!dir.join(format!("{name}.tmp")).exists());
        }
        let raw = std::fs::read(dir.join("r.json.gz")).unwrap();
        assert_eq!(&raw[..2], &[0x1f, 0x8b]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `-o /dev/null` once replaced /dev/null with a regular file (as root): a device or pipe
    /// is written in place. A FIFO stands in for the device here.
    #[test]
    fn a_pipe_is_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let dir = std::env::temp_dir().join(format!("bloatlab-result-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("pipe.json");
        assert!(std::process::Command::new("mkfifo")
            .arg(&p)
            .status()
            .unwrap()
            .success());
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || std::fs::read(&p).unwrap())
        };
        write_atomic(&p, &sample()).unwrap();
        // Checked before joining: had the pipe been replaced, its reader would wait forever.
        assert!(
            std::fs::metadata(&p).unwrap().file_type().is_fifo(),
            "the pipe is still a pipe"
        );
        let got: ResultFile = serde_json::from_slice(&reader.join().unwrap()).unwrap();
        assert_eq!(got, sample());
        assert!(!dir.join("pipe.json.tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_other_formats_and_versions() {
        let dir = std::env::temp_dir().join(format!("bloatlab-result-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.json");
        std::fs::write(&p, br#"{"format":"flent"}"#).unwrap();
        assert!(matches!(read(&p), Err(ResultError::Format { .. })));
        let mut v = serde_json::to_value(sample()).unwrap();
        v["version"] = 99.into();
        std::fs::write(&p, v.to_string()).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("version 99"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
