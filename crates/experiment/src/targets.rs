//! `bloatlab compare TARGET TARGET...`: the same test against several paths (a tunnel and the
//! raw path, a LAN server and a WAN one, Wi-Fi and wired), one table, one overlaid report, and
//! each path's efficiency against the first: what a tunnel or a hop costs. The tests run as
//! `bloatlab test` processes.

use crate::{stamp, table, write_report};
use bloatlab_result::Summary;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct TargetsOptions {
    pub exe: PathBuf,
    /// The test each run makes (`tcp-down`, `rrul`, ...), with its own options.
    pub test: Vec<String>,
    /// Load phase of each run, seconds.
    pub length: f64,
    pub out_dir: PathBuf,
    pub quiet: bool,
    /// Set by Ctrl-C: stops after the run under way, keeping what finished.
    pub stop: Arc<AtomicBool>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TargetRun {
    pub target: String,
    pub summary: Summary,
    #[serde(skip)]
    pub file: PathBuf,
}

pub struct TargetComparison {
    pub runs: Vec<TargetRun>,
    pub report: Result<PathBuf, String>,
    pub interrupted: bool,
}

/// Goodput of a run, both directions together, Mbit/s.
fn goodput(s: &Summary) -> Option<f64> {
    match (s.throughput_mbps.down, s.throughput_mbps.up) {
        (None, None) => None,
        (d, u) => Some(d.unwrap_or(0.0) + u.unwrap_or(0.0)),
    }
}

/// Each run's goodput as a share of the first run's.
pub fn efficiency(runs: &[TargetRun]) -> Vec<Option<f64>> {
    let first = runs.first().and_then(|r| goodput(&r.summary)).filter(|g| *g > 0.0);
    runs.iter().map(|r| Some(goodput(&r.summary)? / first?)).collect()
}

/// The table of the runs with an efficiency row.
pub fn text(runs: &[TargetRun]) -> String {
    let labelled: Vec<(&str, &Summary)> = runs.iter().map(|r| (r.target.as_str(), &r.summary)).collect();
    let mut t = table::table(&labelled);
    let width = runs.iter().map(|r| r.target.len()).max().unwrap_or(0).max(12) + 2;
    t += &format!("{:<26}", "efficiency vs first");
    for e in efficiency(runs) {
        t += &format!("{:>width$}", e.map_or("-".to_string(), |e| format!("{:.0}%", e * 100.0)));
    }
    t + "\n"
}

fn run_one(o: &TargetsOptions, target: &str, out: &Path) -> Result<Summary, String> {
    let (kind, extra) = o.test.split_first().ok_or("no test named")?;
    let mut cmd = Command::new(&o.exe);
    cmd.args(["test", kind, target]).args(extra).args(["-l", &o.length.to_string(), "--json", "-o"]).arg(out).stdout(Stdio::piped());
    if o.quiet {
        cmd.arg("-q");
    }
    let out = cmd.output().map_err(|e| format!("cannot run the test: {e}"))?;
    serde_json::from_slice(&out.stdout).map_err(|_| format!("the {kind} run against {target} failed (exit {:?})", out.status.code()))
}

/// Runs the test against each target in turn and writes one report of them all.
pub fn compare_targets(targets: &[String], o: &TargetsOptions) -> Result<TargetComparison, String> {
    std::fs::create_dir_all(&o.out_dir).map_err(|e| format!("{}: {e}", o.out_dir.display()))?;
    let stamp = stamp();
    let mut runs = Vec::new();
    for (i, target) in targets.iter().enumerate() {
        if o.stop.load(Ordering::Relaxed) {
            break;
        }
        if !o.quiet {
            eprintln!("{}/{}: {} against {target} ({} s load)", i + 1, targets.len(), o.test.join(" "), o.length);
        }
        let safe: String = target.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '_' }).collect();
        let file = o.out_dir.join(format!("bloatlab-compare-{i}-{safe}-{stamp}.json.gz"));
        match run_one(o, target, &file) {
            Ok(summary) => runs.push(TargetRun { target: target.clone(), summary, file }),
            Err(e) if runs.is_empty() || !o.stop.load(Ordering::Relaxed) => return Err(e),
            Err(_) => break,
        }
    }
    let views: Vec<(&str, &Path)> = runs.iter().map(|r| (r.target.as_str(), r.file.as_path())).collect();
    let report = write_report(&views, &[], &o.out_dir.join(format!("bloatlab-compare-{stamp}.html")));
    Ok(TargetComparison { runs, report, interrupted: o.stop.load(Ordering::Relaxed) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(target: &str, down: Option<f64>, up: Option<f64>) -> TargetRun {
        let mut s = Summary::default();
        s.throughput_mbps.down = down;
        s.throughput_mbps.up = up;
        TargetRun { target: target.into(), summary: s, file: PathBuf::new() }
    }

    /// The seed's tunnel: 930 Mbit/s through OpenVPN on a 940 Mbit/s path is 99%.
    #[test]
    fn efficiency_is_each_runs_goodput_over_the_first() {
        let runs = [run("raw", Some(940.0), None), run("tunnel", Some(930.0), None), run("wifi", None, None)];
        let e = efficiency(&runs);
        assert!((e[1].unwrap() - 930.0 / 940.0).abs() < 1e-12);
        assert_eq!((e[0], e[2]), (Some(1.0), None));
        assert!(text(&runs).lines().any(|l| l.starts_with("efficiency vs first") && l.contains("99%")));
        assert_eq!(efficiency(&[run("down", None, None), run("x", Some(1.0), None)]), [None, None], "no first goodput, no shares");
    }
}
