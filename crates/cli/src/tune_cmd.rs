//! `bloatlab advise` and `bloatlab config`: result files and options in, advice and
//! configurations out (the logic is in bloatlab-tune).

use crate::{fail, usage};
use bloatlab_tune::advise::{self, RouterQdisc, Target};
use bloatlab_tune::config::{self, ConfigKind, Shaping};
use bloatlab_tune::inputs;
use bloatlab_tune::link::LinkType;
use bloatlab_units as units;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct AdviseArgs {
    /// Result files of the same path (bloatlab test ... -o FILE), and optionally a locate file
    /// (bloatlab locate), whose verdict says whether the queue is on this host. With a
    /// writeback result (bloatlab test writeback): the dirty thresholds instead, sized by the
    /// rate of the network results given beside it (or --rate).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Writeback: the rate of the link that feeds the disk (1Gibit, 100Mbit); default: the
    /// best goodput of the network results given, else the test's own --rate, else the disk's.
    #[arg(long, value_parser = units::parse_rate)]
    rate: Option<u64>,
    /// Writeback: the NFS write size (wsize) for the sync-export arithmetic.
    #[arg(long, default_value = "1M", value_parser = bloatlab_measure::writeback::parse_size)]
    nfs_block: u64,
    /// Writeback: the disk's rotation speed, for the sync-export arithmetic (a spinning disk
    /// syncs in half a rotation); the disk's measured sync time is used either way.
    #[arg(long)]
    rpm: Option<u32>,
    /// The access link's technology, for link-layer compensation: raw, ethernet, docsis,
    /// bridged-ptm, pppoe-ptm, pppoe-llcsnap (ADSL), pppoa-vcmux, bridged-llcsnap.
    #[arg(long, default_value = "raw", value_parser = LinkType::parse)]
    link: LinkType,
    /// What the router can run: cake, fq_codel (HTB + fq_codel) or fifo (HTB + short FIFO).
    #[arg(long, default_value = "cake", value_parser = RouterQdisc::parse)]
    qdisc: RouterQdisc,
    /// Print the advice as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct ConfigArgs {
    #[arg(value_enum)]
    kind: ConfigKind,
    /// The WAN interface (its ingress is shaped on ifb4DEV).
    #[arg(long, default_value = "eth0")]
    dev: String,
    /// Download shaping rate (57Mbit, 57000kbit, ...); or take it from --from.
    #[arg(long, value_parser = units::parse_rate)]
    down: Option<u64>,
    /// Upload shaping rate.
    #[arg(long, value_parser = units::parse_rate)]
    up: Option<u64>,
    /// Result files to take both rates from (as bloatlab advise computes them).
    #[arg(long, num_args = 1..)]
    from: Vec<PathBuf>,
    /// The access link's technology (see bloatlab advise --help).
    #[arg(long, default_value = "raw", value_parser = LinkType::parse)]
    link: LinkType,
    /// tc-htb-classes leaves: fq_codel, or fifo for kernels without it.
    #[arg(long, default_value = "fq_codel", value_parser = ["fq_codel", "fifo"])]
    leaf: String,
    /// openwrt-sqm: cake (layer_cake.qos) or fq_codel (simple.qos).
    #[arg(long, default_value = "cake", value_parser = ["cake", "fq_codel"])]
    qdisc: String,
    /// tc-cake, openwrt-sqm with cake: filter the upload's redundant ACKs (CAKE's ack-filter),
    /// for asymmetric lines. With --from it is on where the advice says so: where the
    /// download's ACKs would take 10% or more of the upload.
    #[arg(long)]
    ack_filter: bool,
    /// openvpn, wireguard-mtu: the path MTU (bloatlab test mtu reports it).
    #[arg(long)]
    mtu: Option<u32>,
    /// sysctl-writeback: the rate of the link the writes go to (1Gibit, 100Mbit, ...); openvpn,
    /// openvpn-up: the tunnel's goodput.
    #[arg(long, value_parser = units::parse_rate)]
    rate: Option<u64>,
    /// sysctl-writeback: how much of the link's time may be dirty before writeback starts.
    #[arg(long, default_value = "250ms", value_parser = units::parse_duration)]
    background_delay: Duration,
    /// sysctl-writeback: how much before writers are throttled.
    #[arg(long, default_value = "1.5s", value_parser = units::parse_duration)]
    delay: Duration,
}

pub fn advise_cmd(a: AdviseArgs) -> ExitCode {
    let results = inputs::read_results(&a.files);
    if let Some(wb) = inputs::writeback_of(&results) {
        let feed = inputs::feed_from(a.rate, &results);
        return match bloatlab_tune::writeback::advise(wb, feed, a.nfs_block, a.rpm) {
            Ok(adv) if a.json => {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&adv).expect("serializes")
                );
                ExitCode::SUCCESS
            }
            Ok(adv) => {
                print!("{}", adv.text);
                let bps = adv.feed.bps;
                println!("\nnext: bloatlab config sysctl-writeback --rate {bps}bit");
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        };
    }
    let (runs, on_host) = match inputs::read_runs(&a.files) {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    let target = Target {
        link: a.link,
        qdisc: a.qdisc,
        queue_on_host: on_host,
    };
    let advice = advise::advise(&runs, &target);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&advice).expect("serializes")
        );
    } else {
        print!("{}", advice.text());
        if advice.refused.is_empty() {
            println!("\nnext: {}", advise::next_command(&target, &a.files));
        }
    }
    ExitCode::SUCCESS
}

pub fn config_cmd(a: ConfigArgs) -> ExitCode {
    let kbit = |bps: u64| bps / 1000;
    let (mut down, mut up) = (a.down.map(kbit), a.up.map(kbit));
    let mut ack_filter = a.ack_filter;
    if !a.from.is_empty() {
        let (runs, _) = match inputs::read_runs(&a.from) {
            Ok(x) => x,
            Err(e) => return fail(e),
        };
        let adv = inputs::advise_cake(&runs, a.link);
        // A refused direction is an error unless its rate was given by hand.
        let given = |r: &advise::Refusal| match r.direction.as_str() {
            "download" => down.is_some(),
            _ => up.is_some(),
        };
        if let Some(r) = adv.refused.iter().find(|r| !given(r)) {
            return fail(r.reason.clone());
        }
        down = down.or(adv.down.as_ref().map(|d| d.rate_kbit));
        up = up.or(adv.up.as_ref().map(|d| d.rate_kbit));
        ack_filter |= adv.upload_ack_filter();
    }
    if let Err(e) = config::check_dev(&a.dev) {
        return usage(e);
    }
    let s = Shaping {
        dev: a.dev.clone(),
        down_kbit: down,
        up_kbit: up,
        link: a.link,
        ack_filter,
    };
    if a.kind.needs_rates() && down.is_none() && up.is_none() {
        return usage(
            "give --down and/or --up (e.g. --down 57Mbit --up 3610kbit), or --from RESULT...",
        );
    }
    let extras = config::Extras {
        fifo_leaves: a.leaf == "fifo",
        sqm_cake: a.qdisc == "cake",
        mtu: a.mtu,
        rate: a.rate,
        background_delay_ns: a.background_delay.as_nanos() as u64,
        delay_ns: a.delay.as_nanos() as u64,
    };
    match config::render(a.kind, &s, &extras) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => usage(e),
    }
}

#[derive(clap::Subcommand)]
pub enum TuneCommand {
    /// Apply a shaper to an interface, all of it or none: its state is recorded first, a
    /// failed batch is undone at once, and an apply that was killed is undone by the next
    /// tune call. Only interfaces in the kernel's default state are taken.
    Apply {
        /// The interface (its download is shaped on ifb4DEV).
        #[arg(long, required_unless_present = "sysctl")]
        dev: Option<String>,
        /// Apply page-cache thresholds (vm.dirty_background_bytes, vm.dirty_bytes) instead of a
        /// shaper: from --config FILE (bloatlab config sysctl-writeback) or --from a writeback
        /// result (with network results or --rate for the feeding rate). The machine's values
        /// are recorded first; `tune rollback --sysctl` restores them. With --verify DIR: a
        /// writeback test on DIR's disk before and after (--size, at --rate), kept only if the
        /// cache held less, the disk kept 90% of its rate and synced writes (small probes' p99,
        /// the closing fsync) did not wait much longer; restored otherwise.
        #[arg(long, conflicts_with_all = ["dev", "netns", "verify_netns"])]
        sysctl: bool,
        /// --sysctl: the rate that feeds the disk, for the thresholds and the --verify writes.
        #[arg(long, value_parser = units::parse_rate, requires = "sysctl")]
        rate: Option<u64>,
        /// --sysctl --verify: bytes each writeback test writes.
        #[arg(long, default_value = "1G", value_parser = bloatlab_measure::writeback::parse_size)]
        size: u64,
        /// The network namespace the interface is in (a lab router: bl-LAB-HOST).
        #[arg(long)]
        netns: Option<String>,
        /// A tc script from `bloatlab config` (tc-cake, tc-htb-fqcodel, tc-htb-fifo,
        /// tc-htb-classes).
        #[arg(long, conflicts_with = "from")]
        config: Option<PathBuf>,
        /// Result files to advise from; the qdisc is CAKE where the kernel has it, else HTB
        /// with fq_codel, else HTB with short FIFOs (and it says which).
        #[arg(long, num_args = 1..)]
        from: Vec<PathBuf>,
        /// The access link's technology (see bloatlab advise --help).
        #[arg(long, default_value = "raw", value_parser = LinkType::parse)]
        link: LinkType,
        /// Measure against this bloatlab server (rrul-be) before and after, keep the change
        /// only if latency under load did not rise, the total goodput kept 85% and neither
        /// direction fell below a quarter of what it had; roll back otherwise. With --sysctl:
        /// a directory to run writeback tests in.
        #[arg(long, value_name = "HOST|DIR")]
        verify: Option<String>,
        /// Run the --verify tests inside this network namespace (a lab's client).
        #[arg(long, value_name = "NS", requires = "verify")]
        verify_netns: Option<String>,
        /// Load phase of each --verify test, seconds.
        #[arg(short, long, default_value_t = 15.0)]
        length: f64,
        /// Where the --verify tests' result files go.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        /// With --verify: print {"before", "after", "kept", "reason"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Undo what `tune apply` did on an interface, or (--sysctl) to the page-cache thresholds.
    Rollback {
        #[arg(long, required_unless_present = "sysctl")]
        dev: Option<String>,
        #[arg(long)]
        netns: Option<String>,
        #[arg(long, conflicts_with_all = ["dev", "netns"])]
        sysctl: bool,
    },
    /// What bloatlab applied on an interface and its qdiscs now, or (--sysctl) the page-cache
    /// thresholds.
    Status {
        #[arg(long, required_unless_present = "sysctl")]
        dev: Option<String>,
        #[arg(long)]
        netns: Option<String>,
        #[arg(long, conflicts_with_all = ["dev", "netns"])]
        sysctl: bool,
    },
}

pub fn tune_cmd(c: TuneCommand) -> ExitCode {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return fail("tune changes qdiscs and needs root (sudo bloatlab tune ...)");
    }
    let vm = std::path::Path::new(bloatlab_tune::sysctl::VM_DIR);
    let state = std::path::Path::new(bloatlab_tune::apply::STATE_DIR);
    match c {
        TuneCommand::Apply {
            sysctl: true,
            config: file,
            from,
            rate,
            verify,
            size,
            out_dir,
            json,
            ..
        } => apply_sysctl(vm, state, file, &from, rate, verify, size, out_dir, json),
        TuneCommand::Rollback { sysctl: true, .. } => {
            said(bloatlab_tune::sysctl::rollback(vm, state))
        }
        TuneCommand::Status { sysctl: true, .. } => {
            crate::show(bloatlab_tune::sysctl::status(vm, state), false, |s| {
                s.clone()
            })
        }
        TuneCommand::Apply {
            dev,
            netns,
            config: file,
            from,
            link,
            verify,
            verify_netns,
            length,
            out_dir,
            json,
            ..
        } => {
            let iface = iface(dev, netns);
            let dev = iface.dev.clone();
            let script = match (file, from.is_empty()) {
                (Some(f), _) => match std::fs::read_to_string(&f) {
                    Ok(s) => s,
                    Err(e) => return fail(format!("{}: {e}", f.display())),
                },
                (None, false) => {
                    let (runs, _) = match inputs::read_runs(&from) {
                        Ok(x) => x,
                        Err(e) => return fail(e),
                    };
                    let has = bloatlab_tune::apply::kernel_has;
                    let (script, said) = match inputs::kernel_script(&runs, &dev, link, has) {
                        Ok(x) => x,
                        Err(e) => return fail(format!("nothing applied: {e}")),
                    };
                    if let Some(said) = said {
                        eprintln!("{said}");
                    }
                    script
                }
                (None, true) => return usage("give --config FILE or --from RESULT..."),
            };
            if let Some(host) = verify {
                let v = bloatlab_experiment::verify::Verify {
                    host,
                    netns: verify_netns,
                    length,
                    out_dir,
                };
                let r = bloatlab_experiment::verify::apply_verified(&iface, &script, &v);
                return crate::show(r, json, |r| r.text());
            }
            match bloatlab_tune::apply::apply(&iface, &script) {
                Ok(said) => {
                    for s in said {
                        eprintln!("{s}");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        TuneCommand::Rollback { dev, netns, .. } => {
            said(bloatlab_tune::apply::rollback(&iface(dev, netns)))
        }
        TuneCommand::Status { dev, netns, .. } => {
            let s = bloatlab_tune::apply::status(&iface(dev, netns));
            crate::show(s, false, |s| s.clone())
        }
    }
}

fn iface(dev: Option<String>, netns: Option<String>) -> bloatlab_tune::apply::Iface {
    bloatlab_tune::apply::Iface {
        dev: dev.unwrap_or_default(),
        netns,
    }
}

/// A change's one-line report on stderr, or its failure.
fn said(r: Result<String, String>) -> ExitCode {
    match r {
        Ok(s) => {
            eprintln!("{s}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// `tune apply --sysctl`: the thresholds from a config file or a writeback result, applied
/// (recorded first), and with `--verify DIR` measured before and after and kept only if they
/// helped.
#[allow(clippy::too_many_arguments)]
fn apply_sysctl(
    vm: &std::path::Path,
    state: &std::path::Path,
    file: Option<PathBuf>,
    from: &[PathBuf],
    rate: Option<u64>,
    verify: Option<String>,
    size: u64,
    out_dir: PathBuf,
    json: bool,
) -> ExitCode {
    let (bg, fg) = match (file, from.is_empty()) {
        (Some(f), _) => match std::fs::read_to_string(&f)
            .map_err(|e| format!("{}: {e}", f.display()))
            .and_then(|t| bloatlab_tune::sysctl::parse_config(&t))
        {
            Ok(v) => v,
            Err(e) => return fail(e),
        },
        (None, false) => match inputs::writeback_thresholds(from, rate) {
            Ok(Some(t)) => t,
            Ok(None) => {
                return usage(
                    "--sysctl --from needs a writeback result (bloatlab test writeback \
                    DIR -o FILE)",
                )
            }
            Err(e) => return fail(e),
        },
        (None, true) => return usage(
            "give --config FILE (bloatlab config sysctl-writeback) or --from WRITEBACK-RESULT...",
        ),
    };
    let Some(dir) = verify else {
        return said(bloatlab_tune::sysctl::apply(vm, state, bg, fg).map(|r| {
            format!(
                "applied vm.dirty_background_bytes = {bg}, vm.dirty_bytes = {fg} \
                    over {} (tune rollback --sysctl restores it)",
                r.before.describe()
            )
        }));
    };
    let v = bloatlab_experiment::writeback_verify::WritebackVerify {
        dir: PathBuf::from(dir),
        size,
        rate_bps: rate,
        out_dir,
    };
    let r = bloatlab_experiment::writeback_verify::apply_verified(vm, state, bg, fg, &v);
    crate::show(r, json, |r| r.text())
}
