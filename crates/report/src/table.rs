//! The comparison as text: one column per run, one row per figure a user weighs.

use bloatlab_result::Summary;

type Row = (&'static str, fn(&Summary) -> Option<f64>, usize);

const ROWS: [Row; 12] = [
    (
        "idle latency p50, ms",
        |s| s.latency_ms.idle.map(|p| p.p50),
        1,
    ),
    (
        "loaded latency p50, ms",
        |s| s.latency_ms.loaded.map(|p| p.p50),
        1,
    ),
    (
        "loaded latency p99, ms",
        |s| s.latency_ms.loaded.map(|p| p.p99),
        1,
    ),
    ("added latency, ms", |s| s.added_latency_ms, 1),
    ("  best effort, ms", |s| s.added_latency_ms_by_class.be, 1),
    ("  voice (EF), ms", |s| s.added_latency_ms_by_class.ef, 1),
    ("  bulk (CS1), ms", |s| s.added_latency_ms_by_class.bk, 1),
    ("download, Mbit/s", |s| s.throughput_mbps.down, 1),
    ("upload, Mbit/s", |s| s.throughput_mbps.up, 1),
    ("probe loss, %", |s| Some(s.loss.percent), 1),
    ("  under load, %", |s| s.loss.load_percent, 1),
    (
        "TCP retransmits (up)",
        |s| s.tcp_retransmits.map(|v| v as f64),
        0,
    ),
];

/// Runs side by side under their labels; rows no run has are left out, counts print whole.
pub fn table(runs: &[(&str, &Summary)]) -> String {
    let width = runs.iter().map(|(l, _)| l.len()).max().unwrap_or(0).max(12) + 2;
    let mut out = format!("\n{:<26}", "");
    for (label, _) in runs {
        out += &format!("{label:>width$}");
    }
    out += "\n";
    for (name, f, decimals) in ROWS {
        if runs.iter().all(|(_, s)| f(s).is_none()) {
            continue;
        }
        out += &format!("{name:<26}");
        for (_, s) in runs {
            out += &format!(
                "{:>width$}",
                f(s).map_or("-".to_string(), |v| format!("{v:.decimals$}"))
            );
        }
        out += "\n";
    }
    out += &format!("{:<26}", "grade");
    for (_, s) in runs {
        out += &format!("{:>width$}", s.grade.as_deref().unwrap_or("-"));
    }
    out += "\n";
    // Where loss under load capped a grade, what the latency alone gave.
    if runs.iter().any(|(_, s)| s.grade_loss_cap.is_some()) {
        out += &format!("{:<26}", "  by latency alone");
        for (_, s) in runs {
            let alone = match &s.grade_loss_cap {
                Some(c) => c.latency_grade.as_str(),
                None => s.grade.as_deref().unwrap_or("-"),
            };
            out += &format!("{alone:>width$}");
        }
        out += "\n";
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_print_whole_and_missing_rows_are_left_out() {
        let s = Summary {
            tcp_retransmits: Some(393),
            added_latency_ms: Some(12.345),
            ..Default::default()
        };
        let t = table(&[("line as is", &s), ("CAKE 95%", &s)]);
        let row = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(name))
                .map(|l| l.split_whitespace().last().unwrap().to_string())
        };
        assert_eq!(row("TCP retransmits").as_deref(), Some("393"));
        assert_eq!(row("added latency").as_deref(), Some("12.3"));
        assert_eq!(row("  voice"), None, "no run had EF probes");
        assert!(t.lines().nth(1).unwrap().contains("CAKE 95%"));
        assert_eq!(row("  by latency"), None, "no grade was capped");
    }

    #[test]
    fn a_grade_capped_by_loss_shows_what_the_latency_alone_gave() {
        let short = crate::fixtures::capped_by_loss();
        let shaped = Summary {
            grade: Some("A".into()),
            ..Default::default()
        };
        let t = table(&[("short FIFO", &short), ("shaped", &shaped)]);
        let cells = |name: &str| -> Vec<String> {
            let l = t.lines().find(|l| l.starts_with(name)).unwrap();
            l[26..].split_whitespace().map(String::from).collect()
        };
        assert_eq!(cells("grade"), ["D", "A"]);
        assert_eq!(cells("  by latency alone"), ["A", "A"]);
    }
}
