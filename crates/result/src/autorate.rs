//! `bloatlab autorate --log FILE`: JSON lines, a header first, then one line a second and one
//! per rate change, each complete when written (a killed run leaves every line but the one it
//! was writing readable).

use serde::{Deserialize, Serialize};

pub const FORMAT: &str = "bloatlab-autorate-log";
pub const VERSION: u32 = 1;

/// The first line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogHeader {
    pub format: String,
    pub version: u32,
    pub bloatlab_version: String,
    /// Unix seconds at the start; `LogLine::t` counts from here.
    pub started_unix: f64,
    /// The bloatlab servers probed, separated by ", " ("" when only reflectors were given).
    #[serde(default)]
    pub target: String,
    /// ICMP echo reflectors, followed while no server answers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reflectors: Vec<String>,
    /// The shaper, as the user would recognise it ("CAKE on eth0 (up) and ifb4eth0 (down)").
    pub shaper: String,
    /// "bloatlab" or "cake-autorate".
    pub law: String,
    /// MIN, BASE, MAX, bits per second.
    pub down_bounds: [f64; 3],
    pub up_bounds: [f64; 3],
    pub probe_rate: f64,
}

/// Every other line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    /// Seconds since the start.
    pub t: f64,
    /// "tick" (the once-a-second line), "rate", "stalled", "stalled to min", "recovered",
    /// "shaper gone", "shaper back", "reflectors" (they drive the rates from here, the server
    /// silent), "server" (its one-way delays again), "reflector replaced", "path" (a delay
    /// that cuts did not drain taken as the path's own: `dir`, and by how much in `detail`),
    /// "exit".
    pub event: String,
    /// For a rate change: its direction and why (bloat, delivered, safe floor, floor test,
    /// increase, decay, stall).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The shaper's rates now, bits per second.
    pub down_bps: f64,
    pub up_bps: f64,
    /// What the line carried over the last reading of its counters, bits per second.
    pub down_load_bps: f64,
    pub up_load_bps: f64,
    /// One-way delay above its baseline, last sample (with several servers, the least of
    /// their latest: what the rates followed), ms.
    #[serde(default)]
    pub down_delta_ms: Option<f64>,
    #[serde(default)]
    pub up_delta_ms: Option<f64>,
    /// A reflector's round trip above its baseline, last answer, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_delta_ms: Option<f64>,
    /// What an event concerns, in words ("9.9.9.9 stopped answering: 1.1.1.1 instead").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Probes answered and lost since the last tick line.
    pub answered: u64,
    pub lost: u64,
}

/// The most of a log read ([`read`]): a day at five rate changes a second.
const MAX_BYTES: u64 = 256 << 20;

/// The log at `path`, or `None` when the file is not an autorate log (another format: only
/// its first line is read then).
pub fn read(path: &std::path::Path) -> Result<Option<(LogHeader, Vec<LogLine>)>, String> {
    use std::io::{BufRead, Read};
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let mut file = std::io::BufReader::new(std::fs::File::open(path).map_err(cannot)?);
    let mut first = Vec::new();
    file.by_ref()
        .take(64 << 10)
        .read_until(b'\n', &mut first)
        .map_err(cannot)?;
    let is_log = serde_json::from_slice::<serde_json::Value>(&first)
        .is_ok_and(|v| v.get("format").and_then(|f| f.as_str()) == Some(FORMAT));
    if !is_log {
        return Ok(None);
    }
    let mut rest = Vec::new();
    file.take(MAX_BYTES)
        .read_to_end(&mut rest)
        .map_err(cannot)?;
    first.extend(rest);
    let text = String::from_utf8_lossy(&first);
    read_log(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads a log, the header checked; a last line cut short by a kill is left out.
pub fn read_log(text: &str) -> Result<(LogHeader, Vec<LogLine>), String> {
    let mut lines = text.lines();
    let first = lines.next().ok_or("an empty file")?;
    let header: LogHeader =
        serde_json::from_str(first).map_err(|e| format!("not an autorate log: {e}"))?;
    if header.format != FORMAT || header.version > VERSION {
        return Err(format!(
            "format {} version {}: want {FORMAT} up to version {VERSION}",
            header.format, header.version
        ));
    }
    let all: Vec<&str> = lines.collect();
    let mut out = Vec::new();
    for (i, l) in all.iter().enumerate() {
        match serde_json::from_str(l) {
            Ok(line) => out.push(line),
            Err(_) if i + 1 == all.len() => break,
            Err(e) => return Err(format!("line {}: {e}", i + 2)),
        }
    }
    Ok((header, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> String {
        serde_json::to_string(&LogHeader {
            format: FORMAT.into(),
            version: VERSION,
            bloatlab_version: "0.1.0".into(),
            started_unix: 1.8e9,
            target: "server.example".into(),
            reflectors: vec!["192.0.2.1".into()],
            shaper: "CAKE on wan (up)".into(),
            law: "bloatlab".into(),
            down_bounds: [5e6, 40e6, 80e6],
            up_bounds: [1e6, 10e6, 20e6],
            probe_rate: 20.0,
        })
        .unwrap()
    }

    const TICK: &str = concat!(
        r#"{"t":1.0,"event":"tick","down_bps":4e7,"up_bps":1e7,"#,
        r#""down_load_bps":0,"up_load_bps":0,"answered":20,"lost":0}"#
    );

    #[test]
    fn a_log_cut_by_a_kill_reads_to_its_last_whole_line_and_other_files_are_not_logs() {
        let dir = std::env::temp_dir().join(format!("bloatlab-arlog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("a.jsonl");
        std::fs::write(
            &log,
            format!("{}\n{TICK}\n{TICK}\n{{\"t\":2.0,\"ev", header()),
        )
        .unwrap();
        let (h, lines) = read(&log).unwrap().expect("an autorate log");
        assert_eq!((h.target.as_str(), lines.len()), ("server.example", 2));
        // A broken line that is not the last is damage, not a kill.
        std::fs::write(&log, format!("{}\n{{\"t\":\n{TICK}\n", header())).unwrap();
        assert!(read(&log).unwrap_err().contains("line 2"));
        // A gzip'd result file, another format, a later version.
        let other = dir.join("b");
        std::fs::write(&other, b"\x1f\x8b\x08\x00binary").unwrap();
        assert!(read(&other).unwrap().is_none());
        std::fs::write(&other, r#"{"format":"bloatlab-locate","version":1}"#).unwrap();
        assert!(read(&other).unwrap().is_none());
        let later = header().replace("\"version\":1", "\"version\":9");
        std::fs::write(&other, later).unwrap();
        assert!(read(&other).unwrap_err().contains("version 9"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
