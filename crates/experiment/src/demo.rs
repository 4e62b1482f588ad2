//! `lab demo`: the whole loop on an emulated line. Measure it as it is, locate the queue,
//! advise from what was measured, apply the advice on the lab's router, measure again, keep
//! the change only if it helped (`verify::judge`), and write one before/after report with the
//! verdict, the advice and the applied configuration in it.

use crate::placement::{self, Fix, Shaper};
use crate::{stamp, write_report, ExperimentOptions, Session};
use bloatlab_lab::ns::in_netns;
use bloatlab_lab::Topology;
use bloatlab_locate::{Load, Verdict};
use bloatlab_report::html::Section;
use bloatlab_result::Summary;
use bloatlab_tune::advise::{self, Advice, RouterQdisc, Target};
use bloatlab_tune::apply::{self, Iface};
use bloatlab_tune::config;
use bloatlab_tune::inputs;
use bloatlab_tune::link::LinkType;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Where the advice goes on the lab's router.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Apply {
    /// The emulator's own qdisc on the router's LAN link (CAKE or HTB+fq_codel, `lab set`).
    Emulated(Fix),
    /// The router's kernel, with `tc` on its WAN interface as `bloatlab tune apply` does: the
    /// best shaper the kernel has (here HTB with FIFOs: no cake or fq_codel module).
    Kernel,
}

impl Apply {
    pub fn parse(s: &str) -> Result<Apply, String> {
        match s {
            "kernel" | "tc" | "htb" => Ok(Apply::Kernel),
            other => match Fix::parse(other)? {
                Fix::Fifo => {
                    Err("--fix fifo changes nothing: want cake, fq_codel or kernel".into())
                }
                f => Ok(Apply::Emulated(f)),
            },
        }
    }

    fn label(self) -> String {
        match self {
            Apply::Emulated(f) => format!("{} (advised)", f.label().trim_end_matches(" 95%")),
            Apply::Kernel => "router kernel tc (advised)".into(),
        }
    }
}

/// What the locate step found.
#[derive(Clone, Debug, Serialize)]
pub struct Located {
    pub verdict: Verdict,
    pub file: PathBuf,
    /// One result file per load phase (download alone, upload alone).
    pub phase_files: Vec<PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct Demo {
    pub before: Summary,
    pub after: Option<Summary>,
    pub located: Option<Located>,
    pub advice: Option<Advice>,
    /// What was applied to the router: `lab set` commands or a tc script.
    pub applied: Option<String>,
    pub kept: bool,
    pub reason: String,
    /// Every result file the demo wrote, the report last.
    pub files: Vec<PathBuf>,
    #[serde(serialize_with = "report_ser")]
    pub report: Result<PathBuf, String>,
    /// Stopped early (Ctrl-C): the fields after the last finished step are empty.
    pub interrupted: bool,
}

fn report_ser<S: serde::Serializer>(r: &Result<PathBuf, String>, s: S) -> Result<S::Ok, S::Error> {
    match r {
        Ok(p) => s.serialize_some(p),
        Err(_) => s.serialize_none(),
    }
}

/// Rolls the router's kernel back to its prior state when dropped: the lab's namespaces go
/// with the lab, but `tune`'s record of them would stay.
struct KernelApplied(Iface);

impl Drop for KernelApplied {
    fn drop(&mut self) {
        if let Err(e) = apply::rollback(&self.0) {
            eprintln!("bloatlab: rolling back the router's tc: {e}");
        }
    }
}

/// The technology of the slowest link, for the advice's overhead.
fn link_type(topo: &Topology) -> Result<LinkType, String> {
    let spec = placement::slowest(topo)?;
    Ok(LinkType::from_overhead(spec.up.overhead as u32, spec.up.atm).unwrap_or(LinkType::Raw))
}

/// Locate from the client: download and upload loads alone, each `length` s.
fn locate(s: &Session, o: &ExperimentOptions, length: f64) -> Result<Located, String> {
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
    let (located, file) = in_netns(s.namespace("client"), || {
        bloatlab_locate::locate(&s.target, &tests, &lo)
    })??;
    Ok(Located {
        verdict: located.verdict,
        file,
        phase_files: located.phases.into_iter().map(|p| p.file).collect(),
    })
}

impl Demo {
    /// The verdict, before and after side by side, and whether the fix stays.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if let Some(l) = &self.located {
            out += &format!("{}\n", verdict_text(&l.verdict));
        }
        let mut cols = vec![("modem FIFO", &self.before)];
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

/// The demo on `topo` (hosts `client`, a router in front of the slowest link, `server`).
pub fn demo(topo: Topology, how: Apply, o: &ExperimentOptions) -> Result<Demo, String> {
    let link = link_type(&topo)?;
    let router_dev = placement::slowest(&topo)?.name.clone();
    let router = placement::slowest(&topo)?.a.clone();
    if let Apply::Emulated(f) = how {
        // Checked before the lab goes up.
        placement::place(&topo, f)?;
    }
    let name = topo.name.clone();
    let session = Session::up(topo.clone(), o)?;
    let stamp = stamp();
    let stopped = || o.stop.load(Ordering::Relaxed);
    let mut files = Vec::new();

    // 1. The line as it is.
    let before_file = o
        .out_dir
        .join(format!("bloatlab-{name}-before-{stamp}.json.gz"));
    o.say(&format!(
        "1/5 measure: {} through `{name}` as it is ({} s load after 5 s idle)",
        crate::test_label(&o.test),
        o.length
    ));
    let before = session.run_test(o, &before_file)?;
    files.push(before_file.clone());
    let mut d = Demo {
        before,
        after: None,
        located: None,
        advice: None,
        applied: None,
        kept: false,
        reason: String::new(),
        files,
        report: Err("not written".into()),
        interrupted: false,
    };
    let mut sections = Vec::new();
    let finish = |mut d: Demo, sections: Vec<Section>, after: Option<(String, PathBuf)>| {
        let mut runs = vec![("line as it is", before_file.as_path())];
        if let Some((label, file)) = &after {
            runs.push((label.as_str(), file.as_path()));
        }
        d.report = write_report(
            &runs,
            &sections,
            &o.out_dir.join(format!("bloatlab-{name}-demo-{stamp}.html")),
        );
        if let Ok(p) = &d.report {
            d.files.push(p.clone());
        }
        d.interrupted = o.stop.load(Ordering::Relaxed);
        Ok(d)
    };
    if stopped() {
        return finish(d, sections, None);
    }

    // 2. Where the queue is; its load phases measure each direction alone for the advice.
    let loc_len = (o.length / 2.0).clamp(6.0, 20.0);
    o.say(&format!(
        "2/5 locate: download, then upload, {loc_len} s each, while probing every hop"
    ));
    let located = locate(&session, o, loc_len)?;
    let where_text = verdict_text(&located.verdict);
    o.say(&where_text);
    sections.push(Section {
        title: "Where the queue is (bloatlab locate)".into(),
        text: where_text,
    });
    d.files.push(located.file.clone());
    d.files.extend(located.phase_files.iter().cloned());
    let mut runs = vec![d.before.clone()];
    for f in &located.phase_files {
        let r = bloatlab_result::read(f).map_err(|e| e.to_string())?;
        runs.push(bloatlab_analyze::summary_of(&r));
    }
    let on_host = located.verdict.hop == Some(0);
    d.located = Some(located);
    if stopped() {
        return finish(d, sections, None);
    }

    // 3. Advice, for what the router can run.
    let iface = Iface {
        dev: router_dev.clone(),
        netns: Some(session.namespace(&router).to_string()),
    };
    let qdisc = match how {
        Apply::Emulated(Fix::Cake | Fix::CakeAckFilter) => RouterQdisc::Cake,
        Apply::Emulated(_) => RouterQdisc::HtbFqCodel,
        Apply::Kernel if apply::kernel_has("cake") => RouterQdisc::Cake,
        Apply::Kernel if apply::kernel_has("fq_codel") => RouterQdisc::HtbFqCodel,
        Apply::Kernel => RouterQdisc::HtbFifo,
    };
    let advice = advise::advise(
        &runs,
        &Target {
            link,
            qdisc,
            queue_on_host: on_host,
        },
    );
    o.say(&format!("3/5 advise:\n{}", advice.text().trim_end()));
    sections.push(Section {
        title: "Advice (bloatlab advise)".into(),
        text: advice.text(),
    });
    let shaping = inputs::shaping(&advice, &router_dev, link);
    let shaper = Shaper {
        up_kbit: shaping.up_kbit,
        down_kbit: shaping.down_kbit,
        ack_filter: shaping.ack_filter,
    };
    d.advice = Some(advice);

    // 4. Apply on the router.
    let mut kernel_guard = None;
    let mut emulated = Vec::new();
    let applied = match how {
        Apply::Emulated(fix) => {
            emulated = placement::place_at(&topo, fix, shaper)?;
            for s in &emulated {
                session.lab.shared.set(&s.link, s.dir, &s.kv)?;
            }
            emulated
                .iter()
                .map(|s| s.command())
                .collect::<Vec<_>>()
                .join("\n")
        }
        Apply::Kernel => {
            let (script, said) = config::for_kernel(&shaping, apply::kernel_has);
            if let Some(said) = said {
                o.say(&said);
            }
            apply::apply(&iface, &script)?;
            kernel_guard = Some(KernelApplied(iface.clone()));
            format!(
                "# on the router ({}), as bloatlab tune apply --dev {router_dev} runs \
                it:\n{script}",
                iface.netns.as_deref().unwrap_or("")
            )
        }
    };
    o.say(&format!("4/5 apply on `{router}`:\n{applied}"));
    sections.push(Section {
        title: format!("Applied on `{router}`"),
        text: applied.clone(),
    });
    d.applied = Some(applied);
    if stopped() {
        return finish(d, sections, None);
    }

    // 5. Verify: the same test again, kept only if it helped.
    let after_label = how.label();
    let after_file = o
        .out_dir
        .join(format!("bloatlab-{name}-after-{stamp}.json.gz"));
    o.say(&format!(
        "5/5 verify: {} again ({} s load after 5 s idle)",
        crate::test_label(&o.test),
        o.length
    ));
    let after = session.run_test(o, &after_file)?;
    d.files.push(after_file.clone());
    let (kept, mut reason) = crate::verify::judge(&d.before, &after);
    if !kept {
        for s in &emulated {
            session.lab.shared.restore(&s.link)?;
        }
        drop(kernel_guard.take());
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
            text: reason.clone(),
        },
    );
    d.after = Some(after);
    d.kept = kept;
    d.reason = reason;
    drop(kernel_guard);
    drop(session);
    finish(d, sections, Some((after_label, after_file)))
}
