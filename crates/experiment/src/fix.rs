//! The whole loop, on any line: measure it as it is, load each direction alone (locate's
//! phases) for its capacity and the place of its queue, advise from those runs, apply the
//! advice on the router, measure again, keep the change only if it helped
//! (`verify::judge`), and write one before/after report with the verdict, the advice and the
//! applied configuration. `bloatlab fix` runs it on a real interface (`HostLine`), `lab demo`
//! on the lab's router (`demo::LabLine`).

use crate::{verify, write_report, ExperimentOptions};
use bloatlab_locate::{Load, Verdict};
use bloatlab_report::Section;
use bloatlab_result::Summary;
use bloatlab_tune::advise::{self, Advice, RouterQdisc, Target};
use bloatlab_tune::apply::{self, Iface};
use bloatlab_tune::config::{self, ConfigKind, Shaping};
use bloatlab_tune::inputs;
use bloatlab_tune::link::LinkType;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// What the loop measures through and applies to.
pub trait Line {
    /// The line's name in file names and the report.
    fn name(&self) -> String;
    /// The experiment's test through the line, its result written to `out`.
    fn test(&self, o: &ExperimentOptions, out: &Path) -> Result<Summary, String>;
    /// Download, then upload, each loaded alone for `length` s while every hop is probed.
    fn locate(&self, o: &ExperimentOptions, length: f64) -> Result<Located, String>;
    /// The access technology, for the advice's overhead.
    fn link(&self) -> LinkType;
    /// The best shaper the router runs.
    fn qdisc(&self) -> RouterQdisc;
    /// Where the change goes, in words ("on `router`").
    fn place(&self) -> String;
    /// Applies the advised shaping; what was applied, as the user could run it.
    fn apply(&mut self, o: &ExperimentOptions, shaping: &Shaping) -> Result<String, String>;
    /// Undoes `apply`; nothing when nothing is applied.
    fn undo(&mut self) -> Result<(), String>;
    /// The change stays: it must outlive the loop (and the line).
    fn keep(&mut self);
    /// How the user undoes a kept change later, where it outlives the loop.
    fn undo_command(&self) -> Option<String>;
}

/// What the locate step found.
#[derive(Clone, Debug, Serialize)]
pub struct Located {
    pub verdict: Verdict,
    pub file: PathBuf,
    /// One result file per load phase (download alone, upload alone).
    pub phase_files: Vec<PathBuf>,
    /// Their summaries, for the advice.
    #[serde(skip)]
    pub phases: Vec<Summary>,
}

/// Locate's download and upload phases from where the tests run, `length` s each.
pub fn locate_phases(target: &str, o: &ExperimentOptions, length: f64) -> Result<Located, String> {
    let tests = bloatlab_locate::phase_tests(&[Load::Download, Load::Upload], length, 2.0, 4);
    let lo = bloatlab_locate::LocateOptions {
        out_dir: o.out_dir.clone(),
        test: bloatlab_measure::RunOptions {
            output: None,
            ..crate::test_options(&o.out_dir, o.quiet, &o.stop)
        },
        max_hops: 30,
        hop_interval: Duration::from_secs(1),
        icmp: false,
        verbose: !o.quiet,
    };
    let (l, file) = bloatlab_locate::locate(target, &tests, &lo)?;
    let phase_files: Vec<PathBuf> = l.phases.into_iter().map(|p| p.file).collect();
    let phases = phase_files
        .iter()
        .map(|f| {
            let r = bloatlab_result::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
            Ok(bloatlab_analyze::summary_of(&r))
        })
        .collect::<Result<_, String>>()?;
    Ok(Located {
        verdict: l.verdict,
        file,
        phase_files,
        phases,
    })
}

/// What the loop did.
#[derive(Debug, Serialize)]
pub struct Fixed {
    pub before: Summary,
    pub after: Option<Summary>,
    pub located: Option<Located>,
    pub advice: Option<Advice>,
    /// What was applied: `lab set` commands or a tc script.
    pub applied: Option<String>,
    pub kept: bool,
    pub reason: String,
    /// How to undo the kept change later.
    pub undo: Option<String>,
    /// Every result file the loop wrote, the report last.
    pub files: Vec<PathBuf>,
    #[serde(serialize_with = "report_ser")]
    pub report: Result<PathBuf, String>,
    /// Stopped early (Ctrl-C): the fields after the last finished step are empty and
    /// nothing stays applied.
    pub interrupted: bool,
}

fn report_ser<S: serde::Serializer>(r: &Result<PathBuf, String>, s: S) -> Result<S::Ok, S::Error> {
    match r {
        Ok(p) => s.serialize_some(p),
        Err(_) => s.serialize_none(),
    }
}

impl Fixed {
    /// The verdict, before and after side by side, whether the fix stays and how to undo it.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if let Some(l) = &self.located {
            out += &format!("{}\n", verdict_text(&l.verdict));
        }
        let mut cols = vec![("as it was", &self.before)];
        if let Some(a) = &self.after {
            let label = if self.kept {
                "advised fix"
            } else {
                "advised fix (rolled back)"
            };
            cols.push((label, a));
        }
        out += &bloatlab_report::table::table(&cols);
        if !self.reason.is_empty() {
            let kept = if self.kept { "kept" } else { "not kept" };
            out += &format!("\n{kept}: {}\n", self.reason);
        }
        if let Some(u) = self.undo.as_ref().filter(|_| self.kept) {
            out += &format!("to undo it: {u}\n");
        }
        out
    }
}

/// The verdict in words, with its caveats.
pub fn verdict_text(v: &Verdict) -> String {
    let mut t = v.text.clone();
    for c in &v.caveats {
        t += &format!("\nnote: {c}");
    }
    t
}

/// How far the loop goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Until {
    /// Measure, locate and advise; apply nothing.
    Advice,
    /// The whole loop.
    Verified,
}

/// The loop on `line` with the experiment's test (`o.test`, `o.length` s after 5 s idle).
pub fn fix(line: &mut dyn Line, o: &ExperimentOptions, until: Until) -> Result<Fixed, String> {
    std::fs::create_dir_all(&o.out_dir).map_err(|e| format!("{}: {e}", o.out_dir.display()))?;
    let name = line.name();
    let stamp = crate::stamp();
    let stopped = || o.stop.load(Ordering::Relaxed);
    let steps = if until == Until::Advice { 3 } else { 5 };

    // 1. The line as it is.
    let before_file = o
        .out_dir
        .join(format!("bloatlab-{name}-before-{stamp}.json.gz"));
    o.say(&format!(
        "1/{steps} measure: {} through `{name}` as it is ({} s load after 5 s idle)",
        crate::test_label(&o.test),
        o.length
    ));
    let before = line.test(o, &before_file)?;
    let mut d = Fixed {
        before,
        after: None,
        located: None,
        advice: None,
        applied: None,
        kept: false,
        reason: String::new(),
        undo: None,
        files: vec![before_file.clone()],
        report: Err("not written".into()),
        interrupted: false,
    };
    let mut sections = Vec::new();
    let finish = |mut d: Fixed, sections: Vec<Section>, after: Option<(String, PathBuf)>| {
        let mut runs = vec![("line as it was", before_file.as_path())];
        if let Some((label, file)) = &after {
            runs.push((label.as_str(), file.as_path()));
        }
        d.report = write_report(
            &runs,
            &sections,
            &o.out_dir.join(format!("bloatlab-{name}-fix-{stamp}.html")),
        );
        if let Ok(p) = &d.report {
            d.files.push(p.clone());
        }
        d.interrupted = o.stop.load(Ordering::Relaxed);
        d
    };
    if stopped() {
        return Ok(finish(d, sections, None));
    }

    // 2. Where the queue is; its load phases measure each direction alone for the advice
    // (a both-ways run's download can be the upload queue's, not the line's: advise::starved).
    let loc_len = (o.length / 2.0).clamp(6.0, 20.0);
    o.say(&format!(
        "2/{steps} locate: download, then upload, {loc_len} s each, while probing every hop"
    ));
    let located = line.locate(o, loc_len)?;
    let where_text = verdict_text(&located.verdict);
    o.say(&where_text);
    sections.push(Section {
        title: "Where the queue is (bloatlab locate)".into(),
        text: where_text,
    });
    d.files.push(located.file.clone());
    d.files.extend(located.phase_files.iter().cloned());
    let mut runs = vec![d.before.clone()];
    runs.extend(located.phases.iter().cloned());
    let on_host = located.verdict.hop == Some(0);
    d.located = Some(located);
    if stopped() {
        return Ok(finish(d, sections, None));
    }

    // 3. Advice, for what the router runs.
    let link = line.link();
    let target = Target {
        link,
        qdisc: line.qdisc(),
        queue_on_host: on_host,
    };
    let advice = advise::advise(&runs, &target);
    o.say(&format!("3/{steps} advise:\n{}", advice.text().trim_end()));
    sections.push(Section {
        title: "Advice (bloatlab advise)".into(),
        text: advice.text(),
    });
    let refusal = advice.refusal();
    d.advice = Some(advice.clone());
    if let Some(why) = refusal {
        d.reason = format!("nothing applied: {why}");
        return Ok(finish(d, sections, None));
    }
    if until == Until::Advice || stopped() {
        return Ok(finish(d, sections, None));
    }

    // 4. Apply on the router.
    let shaping = inputs::shaping(&advice, "", link);
    let applied = line.apply(o, &shaping)?;
    o.say(&format!("4/5 apply {}:\n{applied}", line.place()));
    sections.push(Section {
        title: format!("Applied {}", line.place()),
        text: applied.clone(),
    });
    d.applied = Some(applied);
    if stopped() {
        line.undo()?;
        d.reason = "interrupted before the change was measured; rolled back".into();
        return Ok(finish(d, sections, None));
    }

    // 5. Verify: the same test again, kept only if it helped.
    let after_file = o
        .out_dir
        .join(format!("bloatlab-{name}-after-{stamp}.json.gz"));
    o.say(&format!(
        "5/5 verify: {} again ({} s load after 5 s idle)",
        crate::test_label(&o.test),
        o.length
    ));
    let after = match line.test(o, &after_file) {
        Ok(a) => a,
        Err(e) => {
            line.undo()?;
            return Err(format!(
                "{e}; rolled back (results so far in {})",
                o.out_dir.display()
            ));
        }
    };
    d.files.push(after_file.clone());
    let (mut kept, mut reason) = verify::judge(&d.before, &after);
    if stopped() {
        // A test cut short by Ctrl-C is no verdict: nothing stays.
        kept = false;
        reason = "interrupted while the change was measured".into();
    }
    if kept {
        line.keep();
        d.undo = line.undo_command();
    } else {
        line.undo()?;
        reason += "; rolled back";
    }
    o.say(&format!(
        "{}: {reason}",
        if kept { "kept" } else { "not kept" }
    ));
    sections.insert(
        0,
        Section {
            title: if kept {
                "Verdict: kept"
            } else {
                "Verdict: rolled back"
            }
            .into(),
            text: match &d.undo {
                Some(u) => format!("{reason}\nTo undo it: {u}"),
                None => reason.clone(),
            },
        },
    );
    d.after = Some(after);
    d.kept = kept;
    d.reason = reason;
    let label = format!("advised fix {}", line.place());
    Ok(finish(d, sections, Some((label, after_file))))
}

/// The configuration of `kind` for the advised shaping on `dev`: what `--dry-run` prints.
pub fn configuration(advice: &Advice, dev: &str, link: LinkType, kind: ConfigKind) -> String {
    let shaping = inputs::shaping(advice, dev, link);
    let extras = config::Extras {
        sqm_cake: true,
        ..Default::default()
    };
    config::render(kind, &shaping, &extras).unwrap_or_else(|e| format!("# {e}\n"))
}

/// A real interface: this host's (or a namespace's) `iface`, the tests run from the same
/// place against a bloatlab server.
pub struct HostLine {
    pub server: String,
    pub iface: Iface,
    pub link: LinkType,
    pub qdisc: RouterQdisc,
    /// A change is applied and not yet kept: dropping the line rolls it back (an error, a
    /// panic, Ctrl-C between steps).
    applied: bool,
}

impl Drop for HostLine {
    fn drop(&mut self) {
        if let Err(e) = self.undo() {
            eprintln!("bloatlab: rolling back {}: {e}", self.iface.dev);
        }
    }
}

/// The best shaper this kernel runs.
pub fn best_qdisc(has: impl Fn(&str) -> bool) -> RouterQdisc {
    if has("cake") {
        RouterQdisc::Cake
    } else if has("fq_codel") {
        RouterQdisc::HtbFqCodel
    } else {
        RouterQdisc::HtbFifo
    }
}

impl HostLine {
    /// Checks before anything is measured: root, an interface in the kernel's default state,
    /// the qdisc asked for in this kernel.
    pub fn new(
        server: String,
        iface: Iface,
        link: LinkType,
        qdisc: Option<RouterQdisc>,
    ) -> Result<HostLine, String> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err("bloatlab fix changes qdiscs: run it as root (or with --dry-run)".into());
        }
        config::check_dev(&iface.dev)?;
        apply::check(&iface)?;
        let best = best_qdisc(apply::kernel_has);
        let qdisc = match qdisc {
            Some(q) if q != best && !kernel_has_qdisc(q) => {
                return Err(format!(
                    "--qdisc {}: this kernel does not have it (it has {})",
                    qdisc_name(q),
                    qdisc_name(best)
                ))
            }
            Some(q) => q,
            None => best,
        };
        Ok(HostLine {
            server,
            iface,
            link,
            qdisc,
            applied: false,
        })
    }

    /// For `--dry-run`: measures and advises for a router running `qdisc`, never applies, so
    /// it checks nothing.
    pub fn for_advice(
        server: String,
        iface: Iface,
        link: LinkType,
        qdisc: RouterQdisc,
    ) -> HostLine {
        HostLine {
            server,
            iface,
            link,
            qdisc,
            applied: false,
        }
    }

    fn in_place<T>(&self, f: impl FnOnce() -> T + Send) -> Result<T, String>
    where
        T: Send,
    {
        match &self.iface.netns {
            Some(ns) => bloatlab_lab::ns::in_netns(ns, f),
            None => Ok(f()),
        }
    }
}

fn qdisc_name(q: RouterQdisc) -> &'static str {
    match q {
        RouterQdisc::Cake => "cake",
        RouterQdisc::HtbFqCodel => "fq_codel",
        RouterQdisc::HtbFifo => "fifo",
    }
}

fn kernel_has_qdisc(q: RouterQdisc) -> bool {
    match q {
        RouterQdisc::Cake => apply::kernel_has("cake"),
        RouterQdisc::HtbFqCodel => apply::kernel_has("fq_codel"),
        RouterQdisc::HtbFifo => apply::kernel_has("htb"),
    }
}

/// The tc script for a shaper of `q`.
pub fn script_for(q: RouterQdisc, s: &Shaping) -> String {
    let kind = match q {
        RouterQdisc::Cake => ConfigKind::TcCake,
        RouterQdisc::HtbFqCodel => ConfigKind::TcHtbFqcodel,
        RouterQdisc::HtbFifo => ConfigKind::TcHtbFifo,
    };
    config::render(kind, s, &config::Extras::default()).expect("a shaper has a rate")
}

impl Line for HostLine {
    fn name(&self) -> String {
        self.iface.dev.clone()
    }

    fn test(&self, o: &ExperimentOptions, out: &Path) -> Result<Summary, String> {
        let mut params = o.test.clone();
        params.length = o.length;
        params.idle = 5.0;
        let opts = crate::test_options(out, o.quiet, &o.stop);
        let tag = params.test.name();
        let outcome = self
            .in_place(|| bloatlab_measure::run(&params, &self.server, &opts))?
            .map_err(|e| format!("the {tag} run failed: {e}"))?;
        crate::summary_of(outcome, tag)
    }

    fn locate(&self, o: &ExperimentOptions, length: f64) -> Result<Located, String> {
        self.in_place(|| locate_phases(&self.server, o, length))?
    }

    fn link(&self) -> LinkType {
        self.link
    }

    fn qdisc(&self) -> RouterQdisc {
        self.qdisc
    }

    fn place(&self) -> String {
        match &self.iface.netns {
            Some(ns) => format!("on {} (namespace {ns})", self.iface.dev),
            None => format!("on {}", self.iface.dev),
        }
    }

    fn apply(&mut self, o: &ExperimentOptions, shaping: &Shaping) -> Result<String, String> {
        let shaping = Shaping {
            dev: self.iface.dev.clone(),
            ..shaping.clone()
        };
        let script = script_for(self.qdisc, &shaping);
        for said in apply::apply(&self.iface, &script)? {
            o.say(&said);
        }
        self.applied = true;
        Ok(script)
    }

    fn undo(&mut self) -> Result<(), String> {
        if std::mem::take(&mut self.applied) {
            apply::rollback(&self.iface)?;
        }
        Ok(())
    }

    fn keep(&mut self) {
        self.applied = false;
    }

    fn undo_command(&self) -> Option<String> {
        Some(match &self.iface.netns {
            Some(ns) => format!(
                "bloatlab tune rollback --dev {} --netns {ns}",
                self.iface.dev
            ),
            None => format!("bloatlab tune rollback --dev {}", self.iface.dev),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_measure::{Params, TestKind};
    use bloatlab_result::Percentiles;
    use std::cell::Cell;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn run(test: &str, added: f64, down: Option<f64>, up: Option<f64>) -> Summary {
        let mut s = Summary {
            test: test.into(),
            added_latency_ms: Some(added),
            ..Default::default()
        };
        s.throughput_mbps.down = down;
        s.throughput_mbps.up = up;
        s
    }

    /// A line that answers from numbers: its first test is `before`, its second `after`.
    struct Fake {
        before: Summary,
        after: Result<Summary, String>,
        phases: Vec<Summary>,
        tests: Cell<u32>,
        applied: bool,
        undone: u32,
        kept: bool,
        /// Set on apply: Ctrl-C while the change goes on.
        stop_on_apply: Option<Arc<AtomicBool>>,
    }

    impl Fake {
        fn new(after: Result<Summary, String>) -> Fake {
            Fake {
                // 35/7 Mbit/s through 600-packet FIFOs under rrul: the upload's queue.
                before: run("rrul", 640.0, Some(30.1), Some(6.6)),
                after,
                phases: vec![
                    run("tcp-down", 120.0, Some(33.2), None),
                    run("tcp-up", 1260.0, None, Some(6.8)),
                ],
                tests: Cell::new(0),
                applied: false,
                undone: 0,
                kept: false,
                stop_on_apply: None,
            }
        }
    }

    impl Line for Fake {
        fn name(&self) -> String {
            "fake".into()
        }
        fn test(&self, _: &ExperimentOptions, _: &Path) -> Result<Summary, String> {
            self.tests.set(self.tests.get() + 1);
            match self.tests.get() {
                1 => Ok(self.before.clone()),
                _ => self.after.clone(),
            }
        }
        fn locate(&self, _: &ExperimentOptions, _: f64) -> Result<Located, String> {
            Ok(Located {
                verdict: Verdict::default(),
                file: PathBuf::from("locate.json"),
                phase_files: vec![],
                phases: self.phases.clone(),
            })
        }
        fn link(&self) -> LinkType {
            LinkType::Raw
        }
        fn qdisc(&self) -> RouterQdisc {
            RouterQdisc::HtbFifo
        }
        fn place(&self) -> String {
            "on fake0".into()
        }
        fn apply(&mut self, _: &ExperimentOptions, s: &Shaping) -> Result<String, String> {
            // 95% of what each direction moved alone.
            assert_eq!((s.down_kbit, s.up_kbit), (Some(31540), Some(6460)));
            self.applied = true;
            if let Some(stop) = &self.stop_on_apply {
                stop.store(true, Ordering::Relaxed);
            }
            Ok("tc ...".into())
        }
        fn undo(&mut self) -> Result<(), String> {
            if std::mem::take(&mut self.applied) {
                self.undone += 1;
            }
            Ok(())
        }
        fn keep(&mut self) {
            self.kept = true;
        }
        fn undo_command(&self) -> Option<String> {
            Some("bloatlab tune rollback --dev fake0".into())
        }
    }

    fn options(tag: &str) -> ExperimentOptions {
        ExperimentOptions {
            test: Params::new(TestKind::Rrul),
            length: 10.0,
            out_dir: std::env::temp_dir()
                .join(format!("bloatlab-fix-{tag}-{}", std::process::id())),
            lab_name: String::new(),
            quiet: true,
            stop: Arc::new(AtomicBool::new(false)),
            cake_autorate: None,
        }
    }

    fn fix_on(line: &mut Fake, o: &ExperimentOptions) -> Result<Fixed, String> {
        let r = fix(line, o, Until::Verified);
        let _ = std::fs::remove_dir_all(&o.out_dir);
        r
    }

    #[test]
    fn a_change_that_helps_is_kept_with_the_command_that_undoes_it() {
        let mut line = Fake::new(Ok(run("rrul", 9.5, Some(31.0), Some(6.1))));
        let d = fix_on(&mut line, &options("kept")).unwrap();
        assert!(d.kept && line.kept && line.undone == 0, "{}", d.reason);
        assert_eq!(
            d.undo.as_deref(),
            Some("bloatlab tune rollback --dev fake0")
        );
        assert!(
            d.text().contains("to undo it: bloatlab tune rollback"),
            "{}",
            d.text()
        );
    }

    #[test]
    fn a_change_that_makes_it_worse_is_rolled_back_with_the_reason() {
        let mut line = Fake::new(Ok(run("rrul", 700.0, Some(31.0), Some(6.1))));
        let d = fix_on(&mut line, &options("worse")).unwrap();
        assert!(!d.kept && !line.kept && line.undone == 1);
        assert!(
            d.reason.starts_with("latency under load got worse")
                && d.reason.ends_with("rolled back"),
            "{}",
            d.reason
        );
    }

    #[test]
    fn a_server_lost_before_the_verdict_rolls_back_and_fails() {
        let mut line = Fake::new(Err("the rrul run failed: connection refused".into()));
        let e = fix_on(&mut line, &options("lost")).unwrap_err();
        assert!(
            e.contains("connection refused") && e.contains("rolled back"),
            "{e}"
        );
        assert_eq!((line.undone, line.kept), (1, false));
    }

    #[test]
    fn ctrl_c_while_the_change_goes_on_leaves_nothing_applied() {
        let o = options("stop");
        let mut line = Fake::new(Ok(run("rrul", 9.5, Some(31.0), Some(6.1))));
        line.stop_on_apply = Some(o.stop.clone());
        let d = fix_on(&mut line, &o).unwrap();
        assert!(d.interrupted && !d.kept && line.undone == 1, "{}", d.reason);
        assert_eq!(line.tests.get(), 1, "no after-test once stopped");
    }

    #[test]
    fn a_starved_download_measured_only_both_ways_applies_nothing() {
        let mut line = Fake::new(Ok(run("rrul", 9.5, Some(31.0), Some(6.1))));
        // Locate measured only the upload alone; the rrul's download starved behind it.
        line.phases.remove(0);
        line.before.throughput_mbps.down = Some(6.4);
        line.before.added_owd_ms.down = Some(Percentiles::default());
        line.before.added_owd_ms.up = Some(Percentiles {
            p50: 640.0,
            ..Default::default()
        });
        let d = fix_on(&mut line, &options("starved")).unwrap();
        assert!(d.applied.is_none() && !line.applied && !d.kept);
        assert!(d.reason.contains("download: not advised"), "{}", d.reason);
    }
}
