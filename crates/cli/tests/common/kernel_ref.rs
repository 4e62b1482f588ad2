//! Linux's own qdiscs as a reference: jobs in Debian's kernel under qemu through
//! `scripts/kernel-ref.sh`, either with the endpoints inside the guest or with the guest as the
//! router between two namespaces of this machine (`scripts/kernel-ref-topo.sh --nics`).

use super::ServerProc;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts")
        .join(name)
        .canonicalize()
        .expect("scripts/ beside the crates")
}

/// A directory removed on drop, also when the test fails.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("bloatlab-kref-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Why this machine cannot run guest jobs, if it cannot (the caller skips, or fails under CI).
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("kernel-reference tests need root (qemu tap devices, namespaces)".into());
    }
    let out = Command::new(script("kernel-ref.sh"))
        .arg("--prepare")
        .output()
        .expect("run kernel-ref.sh");
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
}

/// `kernel-ref.sh` as the tests start it, and the machine's guest lock, to hold while the guest
/// runs: one guest at a time (a second one's boot, beside the first, once failed its timer
/// check). A router (`router`: the endpoints on this machine) runs at real-time priority
/// (SCHED_RR 5, under the lab's forwarders at FIFO 10) with one vCPU: beside a busy process of
/// normal priority its CAKE split two hosts 1.30-1.39:1 at normal priority (the lab 1.04),
/// 1.15:1 so; with two vCPUs at that priority it took both cores from the tests beside it (the
/// host kernel's HTB carried 17.4 of 20 Mbit/s to a test in another binary). A job with its
/// endpoints in the guest needs both vCPUs (with one, rrul's load through the guest's CAKE
/// added +50.9 ms and a 4 Mbit/s modem carried 3.19 of 3.82), so it keeps kernel-ref.sh's
/// defaults (two vCPUs, normal priority), and tests that time it take the machine.
pub fn kernel_ref_sh(router: bool) -> (Command, std::fs::File) {
    let lock = super::without_guest();
    let mut c = Command::new(script("kernel-ref.sh"));
    if router {
        c.env("KERNEL_REF_RT", "5").env("KERNEL_REF_SMP", "1");
    }
    (c, lock)
}

/// Runs `cmd` in the guest with `out` as its writable directory: a job with its load's
/// endpoints in the guest (two vCPUs at normal priority, `kernel_ref_sh(false)`).
pub fn guest_run(cmd: &str, out: &Path, timeout_s: u64) -> Output {
    guest_run_on(kernel_ref_sh(false), cmd, out, timeout_s).0
}

/// As [`guest_run`], for a job whose timing no test reads (tc, counters, exit codes): one vCPU
/// at real-time priority, as a router's (`kernel_ref_sh(true)`). Beside three busy processes
/// it booted and halted in 5.7 s, where two vCPUs at normal priority took 15.3 (8 on an idle
/// machine): CI's guest tests take turns, and each one's boot is every other's wait. Also
/// returns how long the guest took from when the guest lock was this test's (another test's
/// guest may run first: a wait of minutes in CI).
pub fn guest_job(cmd: &str, out: &Path, timeout_s: u64) -> (Output, Duration) {
    guest_run_on(kernel_ref_sh(true), cmd, out, timeout_s)
}

fn guest_run_on(
    (mut c, _lock): (Command, std::fs::File),
    cmd: &str,
    out: &Path,
    timeout_s: u64,
) -> (Output, Duration) {
    let start = Instant::now();
    let output = c
        .args([
            "--out",
            out.to_str().unwrap(),
            "--timeout",
            &timeout_s.to_string(),
            "--",
            cmd,
        ])
        .output()
        .expect("run kernel-ref.sh");
    (output, start.elapsed())
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Debian's kernel as the router between namespaces `cli` (10.99.2.1) and `srv` (10.99.3.1)
/// of this machine, with the shapers `kernel-ref-topo.sh` is given. Stopped on drop.
pub struct KernelRouter {
    guest: Option<Child>,
    /// Held until the guest has ended (`kernel_ref_sh`); dropped after `guest` is halted.
    _guest_lock: std::fs::File,
    dir: TempDir,
    pub cli: String,
    pub srv: String,
    /// Further client hosts on the router's LAN (`start_lan`): 10.99.2.2, 10.99.2.3, ...
    pub more_clients: Vec<String>,
    srv_dev: String,
}

pub const ROUTER_SRV_ADDR: &str = "10.99.3.1";

impl KernelRouter {
    pub fn start(tag: &str, topo_args: &[&str]) -> KernelRouter {
        Self::start_lan(tag, topo_args, 1)
    }

    /// As `start`, with `clients` hosts on the router's LAN, as behind a home router: `cli`
    /// bridges the guest's NIC to veths of the others, so each host has an address of its own
    /// (CAKE's host isolation tells hosts apart by address).
    pub fn start_lan(tag: &str, topo_args: &[&str], clients: usize) -> KernelRouter {
        let prefix = format!("kr{}{tag}", std::process::id() % 100_000);
        let (cli, srv) = (format!("{prefix}c"), format!("{prefix}s"));
        let dir = TempDir::new(tag);
        let (mut kernel_ref, guest_lock) = kernel_ref_sh(true);
        ip(&["netns", "add", &cli]);
        let mut r = KernelRouter {
            guest: None,
            _guest_lock: guest_lock,
            dir,
            cli,
            srv,
            more_clients: Vec::new(),
            srv_dev: String::new(),
        };
        ip(&["netns", "add", &r.srv]);
        let quoted: Vec<String> = topo_args
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect();
        let job = format!(
            "{} --nics {}",
            script("kernel-ref-topo.sh").display(),
            quoted.join(" ")
        );
        let (tc, ts) = (format!("{prefix}tc"), format!("{prefix}ts"));
        r.guest = Some(
            kernel_ref
                .args(["--out", r.dir.0.to_str().unwrap(), "--timeout", "600"])
                .args([
                    "--tap",
                    &format!("{tc}@{}", r.cli),
                    "--tap",
                    &format!("{ts}@{}", r.srv),
                    "--",
                    &job,
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn kernel-ref.sh"),
        );
        r.wait_for("ready", "it was ready", 90);
        let mut cli_dev = tc.clone();
        if clients > 1 {
            ip(&["-n", &r.cli, "link", "add", "name", "br0", "type", "bridge"]);
            ip(&["-n", &r.cli, "link", "set", &tc, "master", "br0"]);
            cli_dev = "br0".into();
        }
        for i in 2..=clients {
            let ns = format!("{prefix}c{i}");
            ip(&["netns", "add", &ns]);
            r.more_clients.push(ns.clone());
            let port = format!("v{i}");
            ip(&[
                "link", "add", "v0", "netns", &ns, "type", "veth", "peer", "name", &port, "netns",
                &r.cli,
            ]);
            ip(&["-n", &r.cli, "link", "set", &port, "master", "br0", "up"]);
            // One wire packet per skb, as from the tap: the guest's NICs take no offloads.
            ip(&[
                "-n",
                &ns,
                "link",
                "set",
                "v0",
                "gso_max_size",
                "1514",
                "gso_max_segs",
                "1",
                "up",
            ]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("10.99.2.{i}/24"),
                "dev",
                "v0",
            ]);
            ip(&["-n", &ns, "route", "add", "default", "via", "10.99.2.254"]);
        }
        if clients > 1 {
            ip(&[
                "-n",
                &r.cli,
                "link",
                "set",
                "br0",
                "gso_max_size",
                "1514",
                "gso_max_segs",
                "1",
                "up",
            ]);
        }
        ip(&["-n", &r.cli, "addr", "add", "10.99.2.1/24", "dev", &cli_dev]);
        ip(&[
            "-n",
            &r.cli,
            "route",
            "add",
            "default",
            "via",
            "10.99.2.254",
        ]);
        ip(&["-n", &r.srv, "addr", "add", "10.99.3.1/24", "dev", &ts]);
        ip(&[
            "-n",
            &r.srv,
            "route",
            "add",
            "default",
            "via",
            "10.99.3.254",
        ]);
        r.srv_dev = ts;
        r
    }

    /// One more address (10.99.3.N/24) for the server's namespace: a second server host, as
    /// the router's qdiscs see it.
    pub fn add_server_address(&self, addr: &str) {
        ip(&[
            "-n",
            &self.srv,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            &self.srv_dev,
        ]);
    }

    /// Waits up to `limit_s` for the guest's job to write `file` in its directory; a guest
    /// that ends first fails the test with what the harness said.
    fn wait_for(&mut self, file: &str, what: &str, limit_s: u64) {
        let (path, t0) = (self.dir.0.join(file), Instant::now());
        while !path.exists() {
            let guest = self.guest.as_mut().unwrap();
            if let Some(status) = guest.try_wait().unwrap() {
                let mut err = String::new();
                use std::io::Read;
                let _ = guest.stderr.take().unwrap().read_to_string(&mut err);
                panic!("kernel router ended ({status}) before {what}: {err}");
            }
            assert!(
                t0.elapsed() < Duration::from_secs(limit_s),
                "kernel router: not {what} after {limit_s} s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Replaces the router's shaper of one direction (`up` or `down`) with `shaper` (as
    /// `--up`/`--down` take it) in the running guest: a boot costs more than a case.
    pub fn reshape(&mut self, dir: &str, shaper: &str) {
        let _ = std::fs::remove_file(self.dir.0.join("reshaped"));
        // Renamed into place: the guest never reads half a line.
        let part = self.dir.0.join("reshape.part");
        std::fs::write(&part, format!("{dir} {shaper}\n")).unwrap();
        std::fs::rename(&part, self.dir.0.join("reshape")).unwrap();
        self.wait_for("reshaped", &format!("it reshaped {dir} to {shaper}"), 60);
    }

    /// `bloatlab server` in the server's namespace, listening on `listen`.
    pub fn server(&self, listen: &str) -> ServerProc {
        let prefix = self.exec(&self.srv);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        ServerProc::start(&prefix, listen, &["-q"])
    }

    pub fn exec(&self, ns: &str) -> Vec<String> {
        ["ip", "netns", "exec", ns]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Ends the guest and returns the counters of its qdiscs (`tc -s -j qdisc` per namespace).
    pub fn stop(mut self) -> serde_json::Value {
        self.halt();
        let text = std::fs::read_to_string(self.dir.0.join("tc-stats.json")).unwrap_or_default();
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
    }

    /// As `stop`, and a qdisc of `kind` was among the router's: the shaper the test asked for.
    pub fn stop_with(self, kind: &str) -> serde_json::Value {
        let stats = self.stop();
        assert!(
            stats["rtr"]
                .as_array()
                .is_some_and(|q| q.iter().any(|q| q["kind"] == kind)),
            "{kind} was the kernel's qdisc: {stats}"
        );
        stats
    }

    fn halt(&mut self) {
        let Some(mut g) = self.guest.take() else {
            return;
        };
        let _ = std::fs::write(self.dir.0.join("stop"), b"");
        let t0 = Instant::now();
        while g.try_wait().ok().flatten().is_none() {
            if t0.elapsed() > Duration::from_secs(30) {
                // SIGTERM lets the harness stop qemu and remove its own files.
                // SAFETY: a signal to our own child.
                unsafe { libc::kill(g.id() as i32, libc::SIGTERM) };
                let _ = g.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for KernelRouter {
    fn drop(&mut self) {
        self.halt();
        for n in [&self.cli, &self.srv].into_iter().chain(&self.more_clients) {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
