//! Namespaces, addresses and routes, through iproute2 (present wherever namespaces are used).

use std::process::Command;

pub fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

pub fn run(prog: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

pub fn list() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), String> {
    run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            &format!("{key}={value}"),
        ],
    )
}

/// Packets the kernel dropped in front of our reader: the TUN's own transmit queue.
pub fn tx_dropped(ns: &str, dev: &str) -> Option<u64> {
    let out = Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    v.get(0)?
        .get("stats64")?
        .get("tx")?
        .get("dropped")?
        .as_u64()
}

/// Ends every process still inside namespace `ns` (SIGTERM, then SIGKILL after 2 s) and
/// deletes it: a deleted namespace would otherwise live on around its processes.
pub fn delete(ns: &str) -> Result<(), String> {
    let pids = || -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", ns])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    for sig in [libc::SIGTERM, libc::SIGKILL] {
        let live = pids();
        if live.is_empty() {
            break;
        }
        for p in live {
            // SAFETY: plain signal to a process inside a namespace this lab created.
            unsafe { libc::kill(p, sig) };
        }
        for _ in 0..20 {
            if pids().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    ip(&["netns", "del", ns])
}
