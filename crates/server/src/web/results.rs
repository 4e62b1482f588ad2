//! The browser test's result: what the page measured, posted to `/web/result`, becomes a result
//! file of the CLI's format (test `web`), summarized by the same code as every other test and
//! answered whole, so the page shows the CLI's grades and can offer the file for download.
//! With `--keep-web-results DIR` the server also stores it, in a bounded number of files.
//!
//! The upload is hostile input: its size is counted as it arrives, its fields are fixed (no
//! unknown keys), every number must be finite and in range, and nothing the page wrote is kept
//! as text except the browser's name reduced to a small safe alphabet. Names, units and
//! metadata of the stored file are the server's own.

use bloatlab_result::{FlowInfo, Host, Metadata, Phase, ResultFile, Series, SeriesKind};
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Largest upload read: a 4-phase test of 30 s each at 20 probes and 10 samples a second is
/// about 300 kB of JSON.
pub const MAX_UPLOAD: usize = 4 << 20;
/// Samples accepted in all series together.
const MAX_SAMPLES: usize = 200_000;
/// Longest test, seconds (idle and load phases together).
const MAX_SECONDS: f64 = 3600.0;
/// The phases a browser test may have, each at most once.
const PHASES: [&str; 4] = ["idle", "download", "upload", "both"];
/// Longest browser name kept.
const MAX_BROWSER: usize = 160;
/// How much later than a probe sent after it a probe's answer may come and still count as
/// measured (see `split_recovered`): far above the few ms by which the server's threads or the
/// browser may swap two answers, far below what a TCP retransmission costs (Linux's tail-loss
/// probe for one segment in flight waits two round trips plus 200 ms, RFC 8985's WCDelAckT).
const OVERTAKEN_MS: f64 = 10.0;

type Samples = Vec<(f64, Option<f64>)>;

/// What the page posts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upload {
    pub version: u32,
    /// Seconds between throughput samples.
    pub step: f64,
    /// Seconds between latency probes.
    pub probe_interval: f64,
    /// Parallel load streams per direction.
    pub streams: u32,
    pub phases: Vec<UploadPhase>,
    /// The page's round trip of each WebSocket probe (`null`: never answered).
    pub rtt: Samples,
    /// The server's views sent back with each probe: the probe connection's kernel RTT, and
    /// the address's download and upload connections'.
    pub kernel_rtt: Samples,
    pub down_rtt: Samples,
    pub up_rtt: Samples,
    /// Goodput per step, Mbit/s, of all download and all upload streams.
    pub down: Samples,
    pub up: Samples,
    /// The page's `navigator.userAgent`.
    #[serde(default)]
    pub browser: String,
    /// What carried the probes; pages before WebRTC sent no such field.
    #[serde(default)]
    pub probe_transport: ProbeTransport,
}

/// What carried the page's probes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeTransport {
    /// A data channel, unordered, no retransmissions: a dropped probe is lost.
    Webrtc,
    /// TCP: a dropped probe is resent (see `split_recovered`).
    #[default]
    Websocket,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadPhase {
    pub name: String,
    pub start: f64,
    pub end: f64,
}

fn in_range(x: f64, lo: f64, hi: f64) -> bool {
    x.is_finite() && x >= lo && x <= hi
}

/// Checks an upload against the limits above; says what is wrong with it.
pub fn validate(u: &Upload) -> Result<(), String> {
    if u.version != 1 {
        return Err(format!(
            "version {}: this server reads version 1",
            u.version
        ));
    }
    if !in_range(u.step, 0.01, 10.0)
        || !in_range(u.probe_interval, 0.005, 10.0)
        || u.streams == 0
        || u.streams > 64
    {
        return Err("step, probe_interval or streams out of range".into());
    }
    let mut seen = Vec::new();
    for p in &u.phases {
        if !PHASES.contains(&p.name.as_str()) || seen.contains(&p.name.as_str()) {
            return Err("phases: each of idle, download, upload, both at most once".into());
        }
        seen.push(p.name.as_str());
        if !in_range(p.start, 0.0, MAX_SECONDS) || !in_range(p.end, p.start, MAX_SECONDS) {
            return Err("a phase's times are out of range".into());
        }
    }
    let all = [
        &u.rtt,
        &u.kernel_rtt,
        &u.down_rtt,
        &u.up_rtt,
        &u.down,
        &u.up,
    ];
    if all.iter().map(|s| s.len()).sum::<usize>() > MAX_SAMPLES {
        return Err(format!("more than {MAX_SAMPLES} samples"));
    }
    for s in all {
        if s.iter().any(|(t, v)| {
            !in_range(*t, 0.0, MAX_SECONDS) || v.is_some_and(|v| !in_range(v, 0.0, 1e6))
        }) {
            return Err("a sample's time or value is out of range".into());
        }
        if s.windows(2).any(|w| w[1].0 < w[0].0) {
            return Err("samples out of time order".into());
        }
    }
    Ok(())
}

/// The browser's name in letters, digits and a few separators only, so that it can be shown
/// anywhere unescaped.
pub fn safe_browser(ua: &str) -> String {
    ua.chars()
        .filter(|c| c.is_ascii_alphanumeric() || " ./;,()_:-".contains(*c))
        .take(MAX_BROWSER)
        .collect()
}

/// Splits the page's probes into those that measured the path and those TCP had to recover.
///
/// A WebSocket probe is TCP: when its request or answer is dropped (a full FIFO drops whatever
/// arrives), TCP resends it hundreds of ms later, and a later probe on the same connection
/// waits behind the hole. A UDP probe (the CLI's) is then simply lost, so the page would grade
/// loss as delay where the CLI does not: through a 20-packet FIFO filled by BBR senders a
/// fifth to a third of the probes waited so, enough to move the median by 40 ms in some runs.
/// They are recognised by order, with no clock shared with the page: the probes take turns
/// over several connections through the same path, a FIFO delivers in the order it received
/// and the server answers at once, so on a path that only queues a probe sent later is never
/// answered earlier. One that is (by more than `OVERTAKEN_MS`) was lost or held behind a loss.
/// Returns (measured, recovered): never-answered probes (`None`) stay with the measured ones,
/// where they count as lost.
pub fn split_recovered(rtt: Samples) -> (Samples, Samples) {
    // The earliest answer among the probes sent after each one (`rtt` is in sending order).
    let answered_ms: Vec<f64> = rtt
        .iter()
        .map(|(t, v)| v.map_or(f64::INFINITY, |v| t * 1e3 + v))
        .collect();
    let mut earliest_later = vec![f64::INFINITY; rtt.len()];
    for i in (0..rtt.len().saturating_sub(1)).rev() {
        earliest_later[i] = earliest_later[i + 1].min(answered_ms[i + 1]);
    }
    let (mut measured, mut recovered) = (Vec::with_capacity(rtt.len()), Vec::new());
    for (i, sample) in rtt.into_iter().enumerate() {
        if sample.1.is_some() && answered_ms[i] > earliest_later[i] + OVERTAKEN_MS {
            recovered.push(sample);
        } else {
            measured.push(sample);
        }
    }
    (measured, recovered)
}

/// The result file of a validated upload from `client`, summarized.
pub fn result_file(u: Upload, client: IpAddr, server: Host, start_time: String) -> ResultFile {
    let probes = match u.probe_transport {
        ProbeTransport::Webrtc => "WebRTC data channel, unordered, no retransmissions",
        ProbeTransport::Websocket => "WebSocket, timed in a Worker",
    };
    let params = serde_json::json!({
        "test": "web", "streams": u.streams, "step": u.step, "probe_interval": u.probe_interval,
        "probes": probes,
        "probe_transport": match u.probe_transport {
            ProbeTransport::Webrtc => "webrtc",
            ProbeTransport::Websocket => "websocket",
        },
    });
    let phases: Vec<Phase> = u
        .phases
        .iter()
        .map(|p| Phase {
            name: p.name.clone(),
            start: p.start,
            end: p.end,
        })
        .collect();
    // Each direction's load begins with its first phase: the download flow with "download".
    let starts = |names: [&str; 2]| {
        phases
            .iter()
            .filter(|p| names.contains(&p.name.as_str()))
            .map(|p| p.start)
            .reduce(f64::min)
    };
    let flows = vec![
        FlowInfo {
            name: "http down".into(),
            start: starts(["download", "both"]),
            ..Default::default()
        },
        FlowInfo {
            name: "http up".into(),
            start: starts(["upload", "both"]),
            ..Default::default()
        },
    ];
    let metadata = Metadata {
        tool: "bloatlab".into(),
        tool_version: env!("CARGO_PKG_VERSION").into(),
        test: "web".into(),
        params,
        client: Host {
            name: "browser".into(),
            address: Some(client.to_string()),
            software: safe_browser(&u.browser),
            kernel: String::new(),
            default_cc: String::new(),
        },
        server,
        cc: None,
        start_time,
        step: u.step,
        phases,
        clock_offset: None,
        flows,
        streams: Vec::new(),
        lab: None,
        rpm: None,
        rpm_by_direction: None,
        udp: None,
    };
    let mut r = ResultFile::new(metadata);
    let latency = Series::latency;
    let goodput = |name: &str, dir: &str, samples| Series {
        name: name.into(),
        kind: SeriesKind::Throughput,
        direction: Some(dir.into()),
        dscp: Some(0),
        unit: "Mbit/s".into(),
        samples,
    };
    // "rtt " series are the probes the summary grades; those TCP recovered and the server's
    // views are named apart. A WebRTC probe is never resent: unanswered, it is lost.
    r.series = match u.probe_transport {
        ProbeTransport::Webrtc => vec![latency("rtt webrtc", u.rtt)],
        ProbeTransport::Websocket => {
            let (measured, recovered) = split_recovered(u.rtt);
            vec![
                latency("rtt ws", measured),
                latency("recovered ws", recovered),
                latency("kernel-rtt ws", u.kernel_rtt),
            ]
        }
    };
    r.series.extend([
        latency("kernel-rtt large", u.down_rtt),
        latency("kernel-rtt slurp", u.up_rtt),
        goodput("http down", "down", u.down),
        goodput("http up", "up", u.up),
    ]);
    r.partial = false;
    r.summary = Some(bloatlab_analyze::summarize::summarize(&r));
    r
}

/// Where `--keep-web-results` stores results: at most `max_files`, the oldest removed first.
pub struct Keeper {
    dir: PathBuf,
    max_files: usize,
    /// One store at a time (names and the count stay consistent).
    lock: Mutex<u64>,
}

impl Keeper {
    pub fn new(dir: PathBuf, max_files: usize) -> std::io::Result<Keeper> {
        std::fs::create_dir_all(&dir)?;
        Ok(Keeper {
            dir,
            max_files: max_files.max(1),
            lock: Mutex::new(0),
        })
    }

    /// Stores one result as `web-<unix ms>-<n>.json.gz`; returns its path.
    pub fn store(&self, r: &ResultFile, unix_ms: u128) -> Result<PathBuf, String> {
        let mut n = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        *n += 1;
        let path = self
            .dir
            .join(format!("web-{unix_ms:015}-{:06}.json.gz", *n % 1_000_000));
        // The directory may have been removed or rotated away since the server started.
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        bloatlab_result::write_atomic(&path, r).map_err(|e| e.to_string())?;
        prune(&self.dir, self.max_files);
        Ok(path)
    }
}

/// Removes the oldest stored results (by name, which starts with the time) beyond `max`.
fn prune(dir: &Path, max: usize) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("web-") && n.ends_with(".json.gz"))
        })
        .collect();
    if names.len() <= max {
        return;
    }
    names.sort();
    for old in &names[..names.len() - max] {
        let _ = std::fs::remove_file(old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A browser run through a bloated downlink: idle 20 ms, download +300 ms, upload +10 ms.
    fn upload() -> Upload {
        let grid = |from: f64, to: f64, v: f64| {
            (0..)
                .map(move |i| from + i as f64 * 0.05)
                .take_while(move |t| *t < to)
                .map(move |t| (t, Some(v)))
        };
        let rtt = grid(0.0, 5.0, 20.0)
            .chain(grid(5.0, 15.0, 320.0))
            .chain(grid(15.0, 25.0, 30.0))
            .chain(grid(25.0, 35.0, 320.0))
            .collect();
        let down = grid(0.0, 5.0, 0.0)
            .chain(grid(5.0, 15.0, 50.0))
            .chain(grid(15.0, 25.0, 0.5))
            .chain(grid(25.0, 35.0, 45.0))
            .collect();
        let up = grid(0.0, 15.0, 0.0)
            .chain(grid(15.0, 25.0, 10.0))
            .chain(grid(25.0, 35.0, 8.0))
            .collect();
        let phase = |name: &str, start: f64, end: f64| UploadPhase {
            name: name.into(),
            start,
            end,
        };
        Upload {
            version: 1,
            step: 0.05,
            probe_interval: 0.05,
            streams: 4,
            phases: vec![
                phase("idle", 0.0, 5.0),
                phase("download", 5.0, 15.0),
                phase("upload", 15.0, 25.0),
                phase("both", 25.0, 35.0),
            ],
            rtt,
            kernel_rtt: vec![],
            down_rtt: vec![],
            up_rtt: vec![],
            down,
            up,
            browser: "Mozilla/5.0 <script>alert(1)</script> Chrome/120".into(),
            probe_transport: ProbeTransport::Websocket,
        }
    }

    #[test]
    fn a_browser_run_is_graded_per_direction_by_the_clis_rules() {
        let u = upload();
        validate(&u).unwrap();
        let r = result_file(
            u,
            "192.0.2.7".parse().unwrap(),
            Host::default(),
            "2026-11-25T00:00:00Z".into(),
        );
        let s = r.summary.as_ref().unwrap();
        let phase = s.phase_added_latency_ms;
        assert_eq!(
            (phase.download, phase.upload, phase.both),
            (Some(300.0), Some(10.0), Some(300.0))
        );
        // The worse direction sets the grade (300 ms: D), never an average.
        assert_eq!(
            (
                s.grade_by_direction.down.as_deref(),
                s.grade_by_direction.up.as_deref()
            ),
            (Some("D"), Some("A"))
        );
        assert_eq!(
            (s.grade.as_deref(), s.added_latency_ms),
            (Some("D"), Some(300.0))
        );
        // Each direction's goodput over its own phase.
        assert!(
            (s.throughput_mbps.down.unwrap() - 50.0).abs() < 0.5,
            "{:?}",
            s.throughput_mbps
        );
        assert!(
            (s.throughput_mbps.up.unwrap() - 10.0).abs() < 0.5,
            "{:?}",
            s.throughput_mbps
        );
        assert_eq!(
            s.saturated.map(|x| (x.down, x.up)),
            Some((Some(true), Some(true)))
        );
        assert_eq!(
            r.metadata.client.software,
            "Mozilla/5.0 scriptalert(1)/script Chrome/120"
        );
        // What is stored reads back as any result file does.
        let back = bloatlab_result::parse(serde_json::to_string(&r).unwrap().as_bytes()).unwrap();
        assert_eq!(back.metadata.test, "web");
    }

    /// Probes every 50 ms; `rtt(i)` is probe i's round trip.
    fn probes(n: usize, rtt: impl Fn(usize) -> Option<f64>) -> Samples {
        (0..n).map(|i| (i as f64 * 0.05, rtt(i))).collect()
    }

    #[test]
    fn probes_overtaken_by_later_ones_are_kept_apart_as_recovered() {
        // Probe 10's request was dropped and resent 300 ms later; probe 14 (next on its
        // connection of four) waited behind it: both answered after probes sent later.
        let lossy = probes(40, |i| {
            Some(match i {
                10 => 340.0,
                14 => 140.0,
                _ => 40.0,
            })
        });
        let (measured, recovered) = split_recovered(lossy);
        assert_eq!(
            recovered,
            vec![(0.5, Some(340.0)), (14.0 * 0.05, Some(140.0))]
        );
        assert_eq!(measured.len(), 38);
        // A queue that grows by 300 ms in a burst and drains at the line's pace (a FIFO empties
        // by at most 50 ms of delay in 50 ms) keeps its order: every probe measured it.
        let queue = |i: usize| {
            Some(if i < 10 {
                40.0
            } else {
                (340.0 - 45.0 * (i - 10) as f64).max(40.0)
            })
        };
        let (measured, recovered) = split_recovered(probes(40, queue));
        assert_eq!((measured.len(), recovered.len()), (40, 0));
        // Answers swapped by a few ms (two server threads) are not a recovery; a lost probe
        // stays a lost one.
        let (measured, recovered) =
            split_recovered(probes(4, |i| [Some(95.0), Some(40.0), None, Some(40.0)][i]));
        assert_eq!(
            (measured.len(), recovered.len(), measured[2].1),
            (4, 0, None)
        );
    }

    #[test]
    fn a_run_with_recovered_probes_grades_the_ones_that_measured_the_path() {
        let mut u = upload();
        // Two of every three probes of the upload phase held 500 ms by retransmissions (a loss
        // and the probe behind it): loss, not delay, though most of the phase's probes.
        for (i, s) in u
            .rtt
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| (15.0..25.0).contains(&s.0))
        {
            if i % 3 != 0 {
                s.1 = Some(530.0);
            }
        }
        let r = result_file(
            u,
            "192.0.2.7".parse().unwrap(),
            Host::default(),
            String::new(),
        );
        assert_eq!(
            r.summary.as_ref().unwrap().phase_added_latency_ms.upload,
            Some(10.0)
        );
        // (The fixture's download queue vanishes at once when its phase ends, faster than a
        // FIFO drains, so its last probes are overtaken too: not this phase's.)
        let recovered = r.series.iter().find(|s| s.name == "recovered ws").unwrap();
        let upload: Vec<_> = recovered
            .samples
            .iter()
            .filter(|s| (15.0..25.0).contains(&s.0))
            .collect();
        assert!(
            upload.len() >= 120 && upload.iter().all(|s| s.1 == Some(530.0)),
            "{upload:?}"
        );
    }

    #[test]
    fn webrtc_probes_the_line_dropped_are_loss_and_cap_the_grade() {
        let mut u = upload();
        u.probe_transport = ProbeTransport::Webrtc;
        // A quarter of the upload phase's probes never came back (a 10-packet FIFO); the rest
        // saw +10 ms. Over WebRTC nothing is resent, so they are loss, not a slow answer.
        for (i, s) in u.rtt.iter_mut().enumerate() {
            if (15.0..25.0).contains(&s.0) && i % 4 == 0 {
                s.1 = None;
            }
        }
        let r = result_file(
            u,
            "192.0.2.7".parse().unwrap(),
            Host::default(),
            String::new(),
        );
        assert_eq!(r.metadata.params["probe_transport"], "webrtc");
        let names: Vec<&str> = r.series.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"rtt webrtc") && !names.iter().any(|n| n.ends_with(" ws")));
        let s = r.summary.as_ref().unwrap();
        assert_eq!(s.phase_added_latency_ms.upload, Some(10.0));
        // 25% lost under the upload's load: at most D (analyze::grade's loss caps).
        let cap = s
            .grade_by_direction
            .up_loss_cap
            .as_ref()
            .expect("a loss cap");
        assert_eq!(
            (cap.latency_grade.as_str(), cap.at_most.as_str()),
            ("A", "D")
        );
        assert_eq!(s.grade_by_direction.up.as_deref(), Some("D"));
    }

    #[test]
    fn a_page_without_a_transport_field_probed_over_websockets() {
        let raw = serde_json::json!({
            "version": 1, "step": 0.1, "probe_interval": 0.05, "streams": 4, "phases": [],
            "rtt": [], "kernel_rtt": [], "down_rtt": [], "up_rtt": [], "down": [], "up": [],
        });
        let u: Upload = serde_json::from_value(raw.clone()).unwrap();
        assert_eq!(u.probe_transport, ProbeTransport::Websocket);
        let mut bad = raw;
        bad["probe_transport"] = "carrier-pigeon".into();
        assert!(serde_json::from_value::<Upload>(bad).is_err());
    }

    #[test]
    fn hostile_uploads_are_refused() {
        type Spoil = Box<dyn Fn(&mut Upload)>;
        let cases: Vec<(&str, Spoil)> = vec![
            ("version", Box::new(|u| u.version = 2)),
            ("phase name", Box::new(|u| u.phases[0].name = "<b>".into())),
            (
                "phase twice",
                Box::new(|u| u.phases[1].name = "idle".into()),
            ),
            ("phase backwards", Box::new(|u| u.phases[1].end = 1.0)),
            ("huge value", Box::new(|u| u.rtt[3].1 = Some(1e300))),
            ("negative time", Box::new(|u| u.down[0].0 = -1.0)),
            ("disorder", Box::new(|u| u.up.swap(1, 2))),
            ("streams", Box::new(|u| u.streams = 1000)),
            (
                "too many samples",
                Box::new(|u| u.kernel_rtt = vec![(1.0, None); MAX_SAMPLES]),
            ),
        ];
        for (what, spoil) in cases {
            let mut u = upload();
            spoil(&mut u);
            assert!(validate(&u).is_err(), "{what}");
        }
        let unknown = concat!(
            r#"{"version":1,"step":0.1,"probe_interval":0.05,"streams":1,"phases":[],"rtt":[],"#,
            r#""kernel_rtt":[],"down_rtt":[],"up_rtt":[],"down":[],"up":[],"x":1}"#
        );
        assert!(serde_json::from_str::<Upload>(unknown).is_err());
    }

    #[test]
    fn the_keeper_keeps_only_the_newest() {
        let dir = std::env::temp_dir().join(format!("bloatlab-keep-test-{}", std::process::id()));
        let _cleanup = scopeguard(dir.clone());
        let k = Keeper::new(dir.clone(), 3).unwrap();
        let r = result_file(
            upload(),
            "192.0.2.7".parse().unwrap(),
            Host::default(),
            String::new(),
        );
        let paths: Vec<PathBuf> = (0..5).map(|i| k.store(&r, 1_000 + i).unwrap()).collect();
        let mut left: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        left.sort();
        assert_eq!(left, paths[2..]);
    }

    /// Removes the test's directory however the test ends.
    struct Cleanup(PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn scopeguard(dir: PathBuf) -> Cleanup {
        Cleanup(dir)
    }
}
