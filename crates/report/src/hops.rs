//! Chart data of a locate file (`bloatlab locate`): round trip per hop, idle and under each
//! load. Pure; read from the file's JSON so that any version-1 locate file renders.

use serde::Serialize;
use serde_json::Value;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HopBar {
    /// "2 10.77.1.2"
    pub label: String,
    pub idle_p50: Option<f64>,
    /// p50 and p90 per load: download, upload, both.
    pub p50: [Option<f64>; 3],
    pub p90: [Option<f64>; 3],
    pub answered: u64,
    pub sent: u64,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct HopsView {
    pub target: String,
    pub start_time: String,
    pub hops: Vec<HopBar>,
    pub verdict: String,
    pub caveats: Vec<String>,
    pub partial: bool,
}

pub const LOADS: [&str; 3] = ["download", "upload", "both"];

/// `None` when the JSON is not a locate file.
pub fn from_json(v: &Value) -> Option<Result<HopsView, String>> {
    if v["format"] != "bloatlab-locate" {
        return None;
    }
    if v["version"] != 1 {
        return Some(Err(format!(
            "locate file version {} (this bloatlab reads version 1)",
            v["version"]
        )));
    }
    let text = |x: &Value| x.as_str().unwrap_or("").to_string();
    let hops = v["hops"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let hops = hops
        .iter()
        .map(|h| {
            let phase = |k: &str, q: &str| h["phases"][k][q].as_f64();
            HopBar {
                label: format!("{} {}", h["ttl"], h["address"].as_str().unwrap_or("*")),
                idle_p50: h["idle_p50_ms"].as_f64(),
                p50: LOADS.map(|k| phase(k, "p50_ms")),
                p90: LOADS.map(|k| phase(k, "p90_ms")),
                answered: h["answered"].as_u64().unwrap_or(0),
                sent: h["sent"].as_u64().unwrap_or(0),
            }
        })
        .collect();
    Some(Ok(HopsView {
        target: text(&v["metadata"]["target"]),
        start_time: text(&v["metadata"]["start_time"]),
        hops,
        verdict: text(&v["verdict"]["text"]),
        caveats: v["verdict"]["caveats"]
            .as_array()
            .map(|c| c.iter().map(text).collect())
            .unwrap_or_default(),
        partial: v["partial"].as_bool().unwrap_or(false),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locate_file_becomes_bars_per_hop_and_other_files_are_not_taken() {
        let v = serde_json::json!({
            "format": "bloatlab-locate", "version": 1,
            "metadata": {"target": "10.77.2.2", "start_time": "2026-11-24T07:00:00.000Z"},
            "hops": [
                {"ttl": 1, "address": "10.77.0.2", "answered": 30, "sent": 34, "idle_p50_ms": 2.2,
                 "phases": {"upload": {"p50_ms": 94.0, "p90_ms": 96.0, "answered": 8}}},
                {"ttl": 2, "address": null, "answered": 0, "sent": 34, "idle_p50_ms": null,
                 "phases": {}}
            ],
            "verdict": {"text": "The bloat is on ...", "caveats": ["hop 2 never answered"]},
            "partial": false
        });
        let h = from_json(&v).unwrap().unwrap();
        assert_eq!(h.hops[0].label, "1 10.77.0.2");
        assert_eq!(
            (h.hops[0].p50, h.hops[0].p90[1]),
            ([None, Some(94.0), None], Some(96.0))
        );
        assert_eq!(h.hops[1].label, "2 *");
        assert_eq!(h.caveats, vec!["hop 2 never answered"]);
        assert!(from_json(&serde_json::json!({"format": "bloatlab-result"})).is_none());
        assert!(
            from_json(&serde_json::json!({"format": "bloatlab-locate", "version": 2}))
                .unwrap()
                .is_err()
        );
    }
}
