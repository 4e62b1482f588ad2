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

/// Runs `f` on a thread of its own inside network namespace `ns` (a name under /run/netns)
/// and returns what it returns: the library's `ip netns exec`. A network namespace belongs to
/// a thread (setns(2)), and threads `f` starts inherit it, so a server's runtime or a test's
/// flows stay inside. As iproute2 does, the thread also gets a mount table of its own with
/// /sys mounted afresh: sysfs shows the devices of the namespace that mounts it, and a test
/// reads its interface's queue there.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, String> {
    let file = std::fs::File::open(format!("/run/netns/{ns}"))
        .map_err(|e| format!("network namespace {ns}: {e}"))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            enter(&file).map_err(|e| format!("cannot enter network namespace {ns}: {e}"))?;
            Ok(f())
        })
        .join()
        .map_err(|_| format!("the work inside network namespace {ns} panicked"))?
    })
}

fn enter(netns: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let check = |r: libc::c_int| {
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let cstr = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (root, sys, none) = (cstr("/"), cstr("/sys"), cstr("none"));
    // SAFETY: plain system calls on this thread with valid, NUL-terminated arguments; the fd
    // is open for the whole call. unshare(CLONE_NEWNS) gives this thread its own mount table
    // (it implies CLONE_FS), so the remount below does not reach the rest of the process.
    unsafe {
        check(libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET))?;
        check(libc::unshare(libc::CLONE_NEWNS))?;
        // Mount events must not propagate back to the host's table.
        check(libc::mount(
            none.as_ptr(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_SLAVE | libc::MS_REC,
            std::ptr::null(),
        ))?;
        // No sysfs there to take down is fine (iproute2 says the same).
        libc::umount2(sys.as_ptr(), libc::MNT_DETACH);
        check(libc::mount(
            cstr("sysfs").as_ptr(),
            sys.as_ptr(),
            cstr("sysfs").as_ptr(),
            0,
            std::ptr::null(),
        ))
    }
}
