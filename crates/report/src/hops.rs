//! Chart data of a locate file (`bloatlab locate`): round trip per hop, idle and under each
//! load. Pure.

use bloatlab_result::locate::{Load, LocateFile};
use serde::Serialize;

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

/// The chart data of a locate file.
pub fn from_locate(l: &LocateFile) -> HopsView {
    let hops = l
        .hops
        .iter()
        .map(|h| HopBar {
            label: format!(
                "{} {}",
                h.ttl,
                h.address.map_or("*".into(), |a| a.to_string())
            ),
            idle_p50: h.idle_p50_ms,
            p50: Load::ALL.map(|k| h.phases.get(k).map(|p| p.p50_ms)),
            p90: Load::ALL.map(|k| h.phases.get(k).map(|p| p.p90_ms)),
            answered: h.answered.into(),
            sent: h.sent.into(),
        })
        .collect();
    HopsView {
        target: l.metadata.target.clone(),
        start_time: l.metadata.start_time.clone(),
        hops,
        verdict: l.verdict.text.clone(),
        caveats: l.verdict.caveats.clone(),
        partial: l.partial,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locate_file_becomes_bars_per_hop() {
        let v = br#"{
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
        }"#;
        let h = from_locate(&bloatlab_result::locate::parse(v).unwrap().unwrap());
        assert_eq!(h.hops[0].label, "1 10.77.0.2");
        assert_eq!(
            (h.hops[0].p50, h.hops[0].p90[1]),
            ([None, Some(94.0), None], Some(96.0))
        );
        assert_eq!(h.hops[1].label, "2 *");
        assert_eq!(h.caveats, vec!["hop 2 never answered"]);
    }
}
