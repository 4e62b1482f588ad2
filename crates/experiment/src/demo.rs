//! `lab demo`: the whole loop (`fix::fix`) on an emulated line, the change on the lab's
//! router: emulated CAKE or fq_codel (`lab set`), or the router's kernel (`tc`, as `bloatlab
//! tune apply` runs it).

use crate::fix::{self, Fixed, Line, Located};
use crate::placement::{self, Fix, Shaper};
use crate::{ExperimentOptions, Session};
use bloatlab_lab::ns::in_netns;
use bloatlab_lab::Topology;
use bloatlab_result::Summary;
use bloatlab_tune::advise::RouterQdisc;
use bloatlab_tune::apply::{self, Iface};
use bloatlab_tune::config::{self, Shaping};
use bloatlab_tune::link::LinkType;

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
                f @ (Fix::CakeMax
                | Fix::Autorate
                | Fix::CakeAutorateLaw
                | Fix::CakeAutorateSh
                | Fix::CakeOracle) => Err(format!(
                    "--fix {}: for a line that moves, in `lab compare`; the demo wants cake, \
                     fq_codel or kernel",
                    f.name()
                )),
                f => Ok(Apply::Emulated(f)),
            },
        }
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
    let spec = &placement::slowest(topo)?.up;
    Ok(LinkType::from_overhead(spec.overhead as u32, spec.atm).unwrap_or(LinkType::Raw))
}

/// The lab's line: tests from host `client` to the lab's server, the change on the router in
/// front of the slowest link.
struct LabLine<'a> {
    session: &'a Session,
    topo: &'a Topology,
    how: Apply,
    link: LinkType,
    router: String,
    iface: Iface,
    /// What `apply` set: emulated settings to restore, or the router's kernel to roll back.
    emulated: Vec<placement::Setting>,
    kernel: Option<KernelApplied>,
}

impl Line for LabLine<'_> {
    fn name(&self) -> String {
        self.topo.name.clone()
    }

    fn test(&self, o: &ExperimentOptions, out: &std::path::Path) -> Result<Summary, String> {
        self.session.run_test(o, out)
    }

    fn locate(&self, o: &ExperimentOptions, length: f64) -> Result<Located, String> {
        let s = self.session;
        in_netns(s.namespace("client"), || {
            fix::locate_phases(&s.target, o, length)
        })?
    }

    fn link(&self) -> LinkType {
        self.link
    }

    fn qdisc(&self) -> RouterQdisc {
        match self.how {
            Apply::Emulated(Fix::Cake | Fix::CakeAckFilter) => RouterQdisc::Cake,
            Apply::Emulated(_) => RouterQdisc::HtbFqCodel,
            Apply::Kernel => fix::best_qdisc(apply::kernel_has),
        }
    }

    fn place(&self) -> String {
        format!("on `{}`", self.router)
    }

    fn apply(&mut self, o: &ExperimentOptions, shaping: &Shaping) -> Result<String, String> {
        let shaper = Shaper {
            up_kbit: shaping.up_kbit,
            down_kbit: shaping.down_kbit,
            ack_filter: shaping.ack_filter,
        };
        match self.how {
            Apply::Emulated(fix) => {
                self.emulated = placement::place_at(self.topo, fix, shaper)?;
                for s in &self.emulated {
                    self.session.lab.shared.set(&s.link, s.dir, &s.kv)?;
                }
                Ok(self
                    .emulated
                    .iter()
                    .map(|s| s.command())
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
            Apply::Kernel => {
                let shaping = Shaping {
                    dev: self.iface.dev.clone(),
                    ..shaping.clone()
                };
                let (script, said) = config::for_kernel(&shaping, apply::kernel_has);
                if let Some(said) = said {
                    o.say(&said);
                }
                apply::apply(&self.iface, &script)?;
                self.kernel = Some(KernelApplied(self.iface.clone()));
                Ok(format!(
                    "# on the router ({}), as bloatlab tune apply --dev {} runs it:\n{script}",
                    self.iface.netns.as_deref().unwrap_or(""),
                    self.iface.dev
                ))
            }
        }
    }

    fn undo(&mut self) -> Result<(), String> {
        for s in std::mem::take(&mut self.emulated) {
            self.session.lab.shared.restore(&s.link)?;
        }
        drop(self.kernel.take());
        Ok(())
    }

    // The lab goes with the demo: a kept change lives as long as the lab.
    fn keep(&mut self) {}

    fn undo_command(&self) -> Option<String> {
        None
    }
}

/// The demo on `topo` (hosts `client`, a router in front of the slowest link, `server`).
pub fn demo(topo: Topology, how: Apply, o: &ExperimentOptions) -> Result<Fixed, String> {
    let link = link_type(&topo)?;
    let router_dev = placement::slowest(&topo)?.name.clone();
    let router = placement::slowest(&topo)?.a.clone();
    if let Apply::Emulated(f) = how {
        // Checked before the lab goes up.
        placement::place(&topo, f)?;
    }
    let session = Session::up(topo.clone(), o)?;
    let iface = Iface {
        dev: router_dev,
        netns: Some(session.namespace(&router).to_string()),
    };
    let mut line = LabLine {
        session: &session,
        topo: &topo,
        how,
        link,
        router,
        iface,
        emulated: Vec::new(),
        kernel: None,
    };
    let fixed = fix::fix(&mut line, o, fix::Until::Verified);
    // The kernel's record goes before the lab does.
    drop(line);
    drop(session);
    fixed
}
