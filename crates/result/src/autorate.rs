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
    pub target: String,
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogLine {
    /// Seconds since the start.
    pub t: f64,
    /// "tick" (the once-a-second line), "rate", "stalled", "stalled to min", "recovered",
    /// "shaper gone", "shaper back", "exit".
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
    /// One-way delay above its baseline, last sample, ms.
    #[serde(default)]
    pub down_delta_ms: Option<f64>,
    #[serde(default)]
    pub up_delta_ms: Option<f64>,
    /// Probes answered and lost since the last tick line.
    pub answered: u64,
    pub lost: u64,
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
