//! `bloatlab fix`: the whole loop on a real interface (bloatlab_experiment::fix).

use crate::{fail, usage};
use bloatlab_experiment::fix::{self, HostLine, Until};
use bloatlab_experiment::ExperimentOptions;
use bloatlab_measure::{Params, TestKind};
use bloatlab_tune::advise::RouterQdisc;
use bloatlab_tune::apply::Iface;
use bloatlab_tune::config::ConfigKind;
use bloatlab_tune::link::LinkType;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct FixArgs {
    /// The bloatlab server to measure against (HOST or HOST:PORT), beyond the line.
    host: String,
    /// The interface towards the line (the modem, the WAN): its upload is shaped on it, its
    /// download on ifb4DEV. It must be in the kernel's default state (no qdisc set up).
    #[arg(long)]
    dev: String,
    /// DEV is in this network namespace, and the tests run from there.
    #[arg(long, value_name = "NS")]
    netns: Option<String>,
    /// The access link's technology, for link-layer compensation: raw, ethernet, docsis,
    /// bridged-ptm, pppoe-ptm, pppoe-llcsnap (ADSL), pppoa-vcmux, bridged-llcsnap.
    #[arg(long, default_value = "raw", value_parser = LinkType::parse)]
    link: LinkType,
    /// The shaper: cake, fq_codel (HTB + fq_codel) or fifo (HTB + FIFOs hashed by port).
    /// Default: the best this kernel has.
    #[arg(long, value_parser = RouterQdisc::parse)]
    qdisc: Option<RouterQdisc>,
    /// Load phase of the before and after rrul, seconds (each direction alone gets half,
    /// 6 to 20 s).
    #[arg(short, long, default_value_t = 20.0)]
    length: f64,
    /// Where the result files and the report go.
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
    /// Measure and advise only, change nothing (no root needed), and print the configuration
    /// for the router named by --config.
    #[arg(long)]
    dry_run: bool,
    /// --dry-run: the configuration to print (tc-cake, tc-htb-fqcodel, tc-htb-fifo,
    /// openwrt-sqm, fireqos, ...).
    #[arg(long, value_enum, default_value = "tc-cake", requires = "dry_run")]
    config: ConfigKind,
    /// Print what was done as JSON.
    #[arg(long)]
    json: bool,
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: FixArgs, stop: Arc<AtomicBool>) -> ExitCode {
    if !(1.0..=300.0).contains(&a.length) {
        return usage("--length: 1 to 300 s");
    }
    if let Err(e) = bloatlab_tune::config::check_dev(&a.dev) {
        return usage(e);
    }
    let o = ExperimentOptions {
        test: Params::new(TestKind::Rrul),
        length: a.length,
        out_dir: a.out_dir.clone(),
        lab_name: String::new(),
        quiet: a.quiet,
        stop,
        cake_autorate: None,
    };
    let iface = Iface {
        dev: a.dev.clone(),
        netns: a.netns.clone(),
    };
    let line = if a.dry_run {
        // The router is the one --config names: CAKE unless --qdisc says otherwise.
        Ok(HostLine::for_advice(
            a.host.clone(),
            iface,
            a.link,
            a.qdisc.unwrap_or(RouterQdisc::Cake),
        ))
    } else {
        HostLine::new(a.host.clone(), iface, a.link, a.qdisc)
    };
    let mut line = match line {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let until = if a.dry_run {
        Until::Advice
    } else {
        Until::Verified
    };
    let fixed = fix::fix(&mut line, &o, until);
    drop(line);
    let fixed = match fixed {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&fixed).expect("json"));
    } else {
        print!("{}", fixed.text());
        if let (true, Some(advice)) = (a.dry_run, &fixed.advice) {
            if advice.refused.is_empty() {
                println!("\nthe configuration:");
                print!("{}", fix::configuration(advice, &a.dev, a.link, a.config));
            }
        }
    }
    for f in &fixed.files {
        eprintln!("written: {}", f.display());
    }
    if let Err(e) = &fixed.report {
        eprintln!("bloatlab fix: no report: {e}");
    }
    if fixed.interrupted {
        eprintln!("bloatlab fix: interrupted; nothing stays applied, finished steps are kept");
        return ExitCode::from(130);
    }
    if !a.dry_run && !fixed.kept {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}
