//! `bloatlab compare TARGET TARGET...`: the same test against several paths (a tunnel and the
//! raw path, a LAN server and a WAN one, Wi-Fi and wired), one table, one overlaid report, and
//! each path's efficiency against the first: what a tunnel or a hop costs, in goodput and in
//! the host's CPU. The tests run here, one after another.

use crate::{stamp, test_label, write_report};
use bloatlab_measure::http_rpm::HttpOptions;
use bloatlab_measure::Params;
use bloatlab_report::table;
use bloatlab_result::Summary;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub struct TargetsOptions {
    /// The test each run makes (`tcp-down`, `rrul`, ...), with its own options; its length is
    /// `length`.
    pub test: Params,
    /// For URL targets (rpm over HTTP).
    pub http: HttpOptions,
    /// The servers' shared key, when they require one.
    pub key: Option<Vec<u8>>,
    /// Inside a lab (`lab exec`, `lab run`): its control socket, to keep its counters with
    /// each run.
    pub lab_socket: Option<PathBuf>,
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
    /// The host's CPU during the run (`None` where /proc/stat cannot be read).
    pub cpu: Option<CpuUse>,
    #[serde(skip)]
    pub file: PathBuf,
}

pub struct TargetComparison {
    pub runs: Vec<TargetRun>,
    pub report: Result<PathBuf, String>,
    pub interrupted: bool,
}

/// The host's CPU time from /proc/stat's first line, in its clock ticks: busy and in all.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuTicks {
    pub busy: u64,
    pub total: u64,
}

/// /proc/stat's `cpu` line: user nice system idle iowait irq softirq steal (guest time is
/// already inside user); idle and iowait are the time no task ran. Busy leaves out `nice`, the
/// time of tasks running below normal priority (a backup, a build at nice 19: CI's fuzz build
/// took a whole core beside a tunnel test and made the raw path look dearer than OpenVPN's):
/// what a path costs runs at normal priority, its daemons, the kernel's softirqs, an emulator.
pub fn parse_proc_stat(text: &str) -> Option<CpuTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    Some(CpuTicks {
        busy: total - v[1] - v[3] - v[4],
        total,
    })
}

fn host_cpu() -> Option<CpuTicks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// /proc/stat counts in USER_HZ, 100 per second on every Linux architecture that matters here.
const USER_HZ: f64 = 100.0;

/// What a run cost the host's processors: every process at normal priority counts, so a
/// tunnel's daemons (and a lab's emulator) are in it; the difference between two paths is what
/// one costs over the other.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CpuUse {
    /// Busy share of all cores over the run, %.
    pub busy_percent: f64,
    /// Busy CPU seconds, all cores together.
    pub cpu_s: f64,
    /// CPU seconds per gigabit of goodput in the load phase.
    pub cpu_s_per_gbit: Option<f64>,
}

/// The CPU between two readings for a run that delivered `goodput_mbps` for `load_s`.
pub fn cpu_use(
    before: CpuTicks,
    after: CpuTicks,
    goodput_mbps: Option<f64>,
    load_s: f64,
) -> Option<CpuUse> {
    let busy = after.busy.checked_sub(before.busy)?;
    let total = after.total.checked_sub(before.total).filter(|t| *t > 0)?;
    let cpu_s = busy as f64 / USER_HZ;
    let gbit = goodput_mbps.map(|g| g * load_s / 1e3).filter(|g| *g > 0.0);
    Some(CpuUse {
        busy_percent: 100.0 * busy as f64 / total as f64,
        cpu_s,
        cpu_s_per_gbit: gbit.map(|g| cpu_s / g),
    })
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
    let first = runs
        .first()
        .and_then(|r| goodput(&r.summary))
        .filter(|g| *g > 0.0);
    runs.iter()
        .map(|r| Some(goodput(&r.summary)? / first?))
        .collect()
}

/// The table of the runs with an efficiency row.
pub fn text(runs: &[TargetRun]) -> String {
    let labelled: Vec<(&str, &Summary)> = runs
        .iter()
        .map(|r| (r.target.as_str(), &r.summary))
        .collect();
    let mut t = table::table(&labelled);
    let width = runs
        .iter()
        .map(|r| r.target.len())
        .max()
        .unwrap_or(0)
        .max(12)
        + 2;
    t += &format!("{:<26}", "efficiency vs first");
    for e in efficiency(runs) {
        t += &format!(
            "{:>width$}",
            e.map_or("-".to_string(), |e| format!("{:.0}%", e * 100.0))
        );
    }
    let cpu_row = |name: &str, cell: &dyn Fn(&CpuUse) -> Option<String>| {
        let cells: String = runs
            .iter()
            .map(|r| {
                format!(
                    "{:>width$}",
                    r.cpu.as_ref().and_then(cell).unwrap_or_else(|| "-".into())
                )
            })
            .collect();
        format!("\n{name:<26}{cells}")
    };
    t += &cpu_row("host CPU busy, %", &|c| {
        Some(format!("{:.0}", c.busy_percent))
    });
    t += &cpu_row("CPU s per Gbit", &|c| {
        c.cpu_s_per_gbit.map(|v| format!("{v:.2}"))
    });
    t + "\n"
}

fn run_one(o: &TargetsOptions, target: &str, out: &Path) -> Result<Summary, String> {
    let mut params = o.test.clone();
    params.length = o.length;
    let opts = bloatlab_measure::RunOptions {
        key: o.key.clone(),
        ..crate::test_options(out, o.quiet, &o.stop)
    };
    let at_start = o
        .lab_socket
        .as_deref()
        .and_then(|s| bloatlab_lab::control::counters(s).ok());
    let tag = params.test.name();
    let mut outcome = bloatlab_measure::run_target(&params, target, &opts, &o.http)
        .map_err(|e| format!("the {tag} run against {target} failed: {e}"))?;
    if let Some(socket) = &o.lab_socket {
        let r = bloatlab_lab::control::attach_counters(socket, &mut outcome.result, out, at_start);
        if let Err(e) = r {
            eprintln!("bloatlab: {e}");
        }
    }
    crate::summary_of(outcome, &format!("{tag} run against {target}"))
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
            eprintln!(
                "{}/{}: {} against {target} ({} s load)",
                i + 1,
                targets.len(),
                test_label(&o.test),
                o.length
            );
        }
        let safe: String = target
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let file = o
            .out_dir
            .join(format!("bloatlab-compare-{i}-{safe}-{stamp}.json.gz"));
        let before = host_cpu();
        match run_one(o, target, &file) {
            Ok(summary) => {
                let cpu = before
                    .zip(host_cpu())
                    .and_then(|(b, a)| cpu_use(b, a, goodput(&summary), o.length));
                runs.push(TargetRun {
                    target: target.clone(),
                    summary,
                    cpu,
                    file,
                })
            }
            Err(e) if runs.is_empty() || !o.stop.load(Ordering::Relaxed) => return Err(e),
            Err(_) => break,
        }
    }
    let views: Vec<(&str, &Path)> = runs
        .iter()
        .map(|r| (r.target.as_str(), r.file.as_path()))
        .collect();
    let report = write_report(
        &views,
        &[],
        &o.out_dir.join(format!("bloatlab-compare-{stamp}.html")),
    );
    Ok(TargetComparison {
        runs,
        report,
        interrupted: o.stop.load(Ordering::Relaxed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(target: &str, down: Option<f64>, up: Option<f64>) -> TargetRun {
        let mut s = Summary::default();
        s.throughput_mbps.down = down;
        s.throughput_mbps.up = up;
        TargetRun {
            target: target.into(),
            summary: s,
            cpu: None,
            file: PathBuf::new(),
        }
    }

    /// Two readings of /proc/stat one second apart on a two-core host, one core busy: 50%, one
    /// CPU second, and over 0.5 Gbit (50 Mbit/s for 10 s) two seconds per gigabit. A niced
    /// background task's time (the second column) is not the run's.
    #[test]
    fn cpu_from_two_readings_of_proc_stat() {
        let before =
            parse_proc_stat("cpu  100 40 50 760 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
                .unwrap();
        assert_eq!(
            before,
            CpuTicks {
                busy: 150,
                total: 1000
            }
        );
        let after = parse_proc_stat("cpu  170 60 80 830 60 0 0 0 0 0\n").unwrap();
        let c = cpu_use(before, after, Some(50.0), 10.0).unwrap();
        assert_eq!((c.busy_percent, c.cpu_s), (50.0, 1.0));
        assert!((c.cpu_s_per_gbit.unwrap() - 2.0).abs() < 1e-12);
        assert_eq!(
            cpu_use(after, before, None, 1.0),
            None,
            "a counter that went back is no reading"
        );
        assert_eq!(
            parse_proc_stat("cpu0 1 2 3 4 5\n"),
            None,
            "only the all-cores line counts"
        );
        let mut runs = [
            run("raw", Some(50.0), None),
            run("tunnel", Some(45.0), None),
        ];
        runs[1].cpu = Some(c);
        let t = text(&runs);
        assert!(
            t.lines()
                .any(|l| l.starts_with("CPU s per Gbit") && l.trim_end().ends_with("2.00")),
            "{t}"
        );
    }

    /// The seed's tunnel: 930 Mbit/s through OpenVPN on a 940 Mbit/s path is 99%.
    #[test]
    fn efficiency_is_each_runs_goodput_over_the_first() {
        let runs = [
            run("raw", Some(940.0), None),
            run("tunnel", Some(930.0), None),
            run("wifi", None, None),
        ];
        let e = efficiency(&runs);
        assert!((e[1].unwrap() - 930.0 / 940.0).abs() < 1e-12);
        assert_eq!((e[0], e[2]), (Some(1.0), None));
        assert!(text(&runs)
            .lines()
            .any(|l| l.starts_with("efficiency vs first") && l.contains("99%")));
        assert_eq!(
            efficiency(&[run("down", None, None), run("x", Some(1.0), None)]),
            [None, None],
            "no first goodput, no shares"
        );
    }
}
