//! Test fixtures: the real `bloatlab` binary, a server on loopback, and a three-namespace
//! topology (client - router - server) with a kernel HTB bottleneck on the router.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

pub mod kernel_ref;

pub const BIN: &str = env!("CARGO_BIN_EXE_bloatlab");

/// Timing tests share two cores: run them one at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

/// One test of this process at a time ([`SERIAL`]). CI runs test processes side by side; this
/// test may run beside the others', unless one asked for [`quiet`] or [`alone`].
pub fn serial() -> Serial {
    take_turn(false)
}

/// As [`serial`], and no test of another binary runs meanwhile: for a test whose physics are
/// the whole machine's (CPU per gigabit, vm.dirty_* and the dirty pages). It waits for the test running beside it to end, and none starts until it has.
pub fn quiet() -> Serial {
    take_turn(true)
}

/// As [`quiet`] for other tests, but CI's idle-priority router build goes on meanwhile (it holds
/// `bloatlab-tests-alone.lock`, which CI's pause loop reads as "leave the build running"):
/// for a test that needs the CPU other tests would take (a browser's timers) and not the
/// whole machine's quiet (SCHED_IDLE work yields to it).
pub fn alone() -> Serial {
    let marker = locked("bloatlab-tests-alone.lock", true);
    Serial {
        _marker: Some(marker),
        ..take_turn(true)
    }
}

/// The machine's guest lock, held until dropped: no kernel-reference guest runs meanwhile
/// (`kernel_ref::kernel_ref_sh` takes it for each guest). For a test that a busy guest starves:
/// its qemu runs at real-time priority, and beside it in CI the lab's fq_codel added +23 ms to
/// the cable preset's probes (9.8 alone) and autorate carried 40% of a line that slows. Taken
/// after the test's turn (`serial()`), as the guest's tests take it.
pub fn without_guest() -> std::fs::File {
    locked("bloatlab-tests-guest.lock", true)
}

fn take_turn(exclusive: bool) -> Serial {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    Serial {
        _machine: machine_lock(exclusive),
        _marker: None,
        _guard: guard,
    }
}

pub struct Serial {
    // Dropped before the guard: the machine's lock goes first (fields drop in order).
    _machine: std::fs::File,
    // alone()'s marker for CI's pause loop.
    _marker: Option<std::fs::File>,
    _guard: std::sync::MutexGuard<'static, ()>,
}

fn flock(file: &std::fs::File, op: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor we own; the lock goes with the file.
    assert_eq!(
        unsafe { libc::flock(file.as_raw_fd(), op) },
        0,
        "flock: {}",
        std::io::Error::last_os_error()
    );
}

fn lock_file(name: &str) -> std::fs::File {
    // /run/lock: where lock files live (a tmpfs), as they are not temporary files to clean up.
    let dir = Some(std::path::Path::new("/run/lock"))
        .filter(|d| d.is_dir())
        .map_or_else(std::env::temp_dir, |d| d.to_path_buf());
    let path = dir.join(name);
    // flock needs no write access: a user's run opens read-only the file a root run created.
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .or_else(|_| std::fs::File::open(&path))
        .unwrap_or_else(|e| panic!("lock file {}: {e}", path.display()))
}

/// Tests hold the machine's lock shared, a quiet one exclusively. flock(2) prefers no one, so
/// a turnstile: whoever waits for the lock holds the gate meanwhile, and a quiet test waiting
/// for the others to end keeps new ones from starting.
fn machine_lock(exclusive: bool) -> std::fs::File {
    let _gate = locked("bloatlab-tests-gate.lock", true);
    locked("bloatlab-tests-machine.lock", exclusive)
}

/// Lock file `name`, flocked shared or exclusively until it is dropped.
fn locked(name: &str, exclusive: bool) -> std::fs::File {
    let file = lock_file(name);
    flock(
        &file,
        if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        },
    );
    file
}

fn tmp_dir() -> PathBuf {
    std::env::temp_dir().join(format!("bloatlab-it-{}", std::process::id()))
}

/// A path in this test process's own temporary directory, which is removed when the process
/// exits, whether its tests passed or failed (the harness ends with `exit`, which runs atexit
/// handlers).
pub fn tmp_path(name: &str) -> PathBuf {
    static REGISTER: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_tmp_dir() {
        let _ = std::fs::remove_dir_all(tmp_dir());
    }
    // SAFETY: registers a plain function without captured state.
    REGISTER.call_once(|| unsafe {
        libc::atexit(remove_tmp_dir);
    });
    let dir = tmp_dir();
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A `bloatlab server` child, killed on drop.
pub struct ServerProc {
    pub child: Child,
    pub addr: String,
    /// Its log lines (stderr) so far.
    pub log: std::sync::Arc<Mutex<Vec<String>>>,
}

impl ServerProc {
    /// Starts `prefix... bloatlab server --listen LISTEN extra...` and waits for its
    /// "listening on ADDR" line.
    pub fn start(prefix: &[&str], listen: &str, extra: &[&str]) -> ServerProc {
        let mut cmd = command(prefix, &["server", "--listen", listen]);
        cmd.args(extra).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn server");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        // With --self-signed, the certificate's lines come first.
        let first = lines
            .by_ref()
            .map(|l| l.expect("server's stderr"))
            .take(5)
            .find(|l| l.contains("listening on "))
            .expect("the server never said where it listens");
        let addr = first
            .split("listening on ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .unwrap()
            .to_string();
        // Keep draining its log so it never blocks on a full pipe.
        let log = std::sync::Arc::new(Mutex::new(Vec::new()));
        let keep = log.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                keep.lock().unwrap().push(line);
            }
        });
        ServerProc { child, addr, log }
    }

    /// Resident memory of the server process, kB.
    pub fn rss_kb(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn command(prefix: &[&str], args: &[&str]) -> Command {
    let mut cmd = if prefix.is_empty() {
        Command::new(BIN)
    } else {
        let mut c = Command::new(prefix[0]);
        c.args(&prefix[1..]).arg(BIN);
        c
    };
    cmd.args(args);
    cmd
}

pub fn run(prefix: &[&str], args: &[&str]) -> Output {
    command(prefix, args).output().expect("run bloatlab")
}

/// `bloatlab` with `args`, which must succeed (else its stderr is the failure), and the JSON it
/// printed.
pub fn run_json(prefix: &[&str], args: &[&str]) -> serde_json::Value {
    let out = run(prefix, args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

pub fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON on stdout ({e}); exit {:?}\nstdout: {}\nstderr: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn f(v: &serde_json::Value, path: &str) -> f64 {
    let mut cur = v;
    for k in path.split('.') {
        cur = &cur[k];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// client - router - server in three network namespaces, HTB + pfifo on the router's egress
/// (a shaper on a sending host's own interface would hide bloat: TCP small queues). All
/// namespaces are deleted on drop, also when the test fails.
pub struct Topo {
    pub cli: String,
    pub rtr: String,
    pub srv: String,
}

pub const SRV_ADDR: &str = "10.99.3.1";

impl Topo {
    /// `Err` with the reason when this machine cannot build it (not root, no netns, no htb):
    /// the caller skips with that message.
    pub fn up(tag: &str, limit: u32, down: &str, up: &str) -> Result<Topo, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root for network namespaces".into());
        }
        let prefix = format!("bl{}{tag}", std::process::id() % 100_000);
        let t = Topo {
            cli: format!("{prefix}c"),
            rtr: format!("{prefix}r"),
            srv: format!("{prefix}s"),
        };
        for n in [&t.cli, &t.rtr, &t.srv] {
            sh(&["ip", "netns", "add", n])?;
            sh(&["ip", "-n", n, "link", "set", "lo", "up"])?;
        }
        sh(&[
            "ip", "link", "add", "c0", "netns", &t.cli, "type", "veth", "peer", "name", "rc",
            "netns", &t.rtr,
        ])?;
        sh(&[
            "ip", "link", "add", "s0", "netns", &t.srv, "type", "veth", "peer", "name", "rs",
            "netns", &t.rtr,
        ])?;
        sh(&[
            "ip",
            "-n",
            &t.cli,
            "addr",
            "add",
            "10.99.2.1/24",
            "dev",
            "c0",
        ])?;
        sh(&[
            "ip",
            "-n",
            &t.rtr,
            "addr",
            "add",
            "10.99.2.254/24",
            "dev",
            "rc",
        ])?;
        sh(&[
            "ip",
            "-n",
            &t.srv,
            "addr",
            "add",
            "10.99.3.1/24",
            "dev",
            "s0",
        ])?;
        sh(&[
            "ip",
            "-n",
            &t.rtr,
            "addr",
            "add",
            "10.99.3.254/24",
            "dev",
            "rs",
        ])?;
        for (ns, dev) in [
            (&t.cli, "c0"),
            (&t.rtr, "rc"),
            (&t.rtr, "rs"),
            (&t.srv, "s0"),
        ] {
            // Linux TCP builds 64 KB software-GSO packets even with offloads off; a pfifo would
            // count each as one packet.
            sh(&[
                "ip",
                "-n",
                ns,
                "link",
                "set",
                "dev",
                dev,
                "gso_max_size",
                "1514",
                "gso_max_segs",
                "1",
                "up",
            ])?;
            let _ = sh(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro",
                "off",
            ]);
        }
        // Cubic, as the lab's hosts (`DEFAULT_CC`), not whatever this machine defaults to; by
        // route, as the lab does it (a namespace's default may only be an allowed one).
        sh(&[
            "ip",
            "-n",
            &t.cli,
            "route",
            "add",
            "default",
            "via",
            "10.99.2.254",
            "congctl",
            "cubic",
        ])?;
        sh(&[
            "ip",
            "-n",
            &t.srv,
            "route",
            "add",
            "default",
            "via",
            "10.99.3.254",
            "congctl",
            "cubic",
        ])?;
        sh(&[
            "ip",
            "netns",
            "exec",
            &t.rtr,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ])?;
        t.reshape(limit, down, up)?;
        Ok(t)
    }

    /// Download bottleneck on the router's egress towards the client, upload towards the server.
    pub fn reshape(&self, limit: u32, down: &str, up: &str) -> Result<(), String> {
        for (dev, rate) in [("rc", down), ("rs", up)] {
            let _ = sh(&[
                "ip", "netns", "exec", &self.rtr, "tc", "qdisc", "del", "dev", dev, "root",
            ]);
            sh(&[
                "ip", "netns", "exec", &self.rtr, "tc", "qdisc", "add", "dev", dev, "root",
                "handle", "1:", "htb", "default", "1",
            ])
            .map_err(|e| format!("kernel htb unavailable: {e}"))?;
            sh(&[
                "ip", "netns", "exec", &self.rtr, "tc", "class", "add", "dev", dev, "parent", "1:",
                "classid", "1:1", "htb", "rate", rate,
            ])?;
            sh(&[
                "ip",
                "netns",
                "exec",
                &self.rtr,
                "tc",
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "handle",
                "10:",
                "pfifo",
                "limit",
                &limit.to_string(),
            ])
            .map_err(|e| format!("kernel pfifo unavailable: {e}"))?;
        }
        Ok(())
    }

    pub fn exec<'a>(&self, ns: &'a str) -> [&'a str; 4] {
        ["ip", "netns", "exec", ns]
    }

    pub fn server(&self) -> ServerProc {
        ServerProc::start(&self.exec(&self.srv), "0.0.0.0:9461", &["-q"])
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for n in [&self.cli, &self.rtr, &self.srv] {
            let _ = sh(&["ip", "netns", "del", n]);
        }
    }
}

pub fn skip(why: &str) {
    eprintln!("SKIP: {why}");
}

/// A missing precondition: skip on a laptop, but fail under CI, where a skip that passes would
/// hide a broken install step.
pub fn missing(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "precondition missing under CI: {why}"
    );
    skip(why);
}

/// An HTML report as headless Chromium leaves it once its scripts ran (`None`, said, without
/// Chromium): the page's error hook found nothing, and every chart it drew has data points.
/// The DOM and how many charts rendered.
pub fn rendered_page(page: &Path) -> Option<(String, usize)> {
    if Command::new("chromium").arg("--version").output().is_err() {
        missing("chromium is not installed (apt-get install chromium)");
        return None;
    }
    let dom = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args(["--virtual-time-budget=10000", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout).to_string();
    // The page's error hook sets this attribute (on <html>) and lists the messages in #errors.
    assert!(
        !dom.contains("data-errors=\""),
        "the page reported errors: {}",
        dom.split("id=\"errors\"")
            .nth(1)
            .unwrap_or("")
            .chars()
            .take(500)
            .collect::<String>()
    );
    for part in dom.split("data-points=\"").skip(1) {
        let n: usize = part.split('"').next().unwrap().parse().unwrap();
        assert!(n > 0, "a chart without data points");
    }
    let rendered = dom.matches("data-rendered=\"1\"").count();
    Some((dom, rendered))
}

/// `bloatlab report INPUTS -o NAME` (in this process's temporary directory), the page as
/// [`rendered_page`] leaves it.
pub fn report_rendered(inputs: &[&str], name: &str) -> Option<(String, usize)> {
    let page = tmp_path(name);
    let mut args = vec!["report"];
    args.extend_from_slice(inputs);
    args.extend(["-o", page.to_str().unwrap()]);
    let out = run(&[], &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    rendered_page(&page)
}

pub fn wait_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

/// Whether the server has not closed `s` (nothing to read yet, no end, no error).
pub fn still_open(s: &std::net::TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let open =
        matches!(s.peek(&mut [0u8; 1]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).unwrap();
    open
}

/// Whether this process holds [`AllLabs`]: its own labs then need no shared lock.
static ALL_LABS_HELD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A lock on the labs of every test process on this machine (CI runs test binaries side by
/// side): each [`LabUp`] holds it shared; a test that takes down every lab (`lab down --all`)
/// holds it exclusively through [`AllLabs`], so it waits for other binaries' labs to go down
/// and none comes up meanwhile.
fn labs_lock(exclusive: bool) -> std::fs::File {
    locked("bloatlab-tests-labs.lock", exclusive)
}

/// Every lab on this machine is this test's while it lives (see [`labs_lock`]).
pub struct AllLabs {
    _lock: std::fs::File,
}

impl AllLabs {
    pub fn take() -> AllLabs {
        let lock = AllLabs {
            _lock: labs_lock(true),
        };
        ALL_LABS_HELD.store(true, std::sync::atomic::Ordering::SeqCst);
        lock
    }
}

impl Drop for AllLabs {
    fn drop(&mut self) {
        ALL_LABS_HELD.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A lab brought up with `bloatlab lab up`, brought down on drop (also when a test fails).
pub struct LabUp {
    pub name: String,
    /// The labs' lock, shared, until the lab is down (none while this process holds `AllLabs`).
    _shared: Option<std::fs::File>,
}

fn shared_labs_lock() -> Option<std::fs::File> {
    (!ALL_LABS_HELD.load(std::sync::atomic::Ordering::SeqCst)).then(|| labs_lock(false))
}

impl LabUp {
    pub fn up(name: &str, toml: &str) -> Option<LabUp> {
        if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
            missing("lab tests need root and /dev/net/tun");
            return None;
        }
        let shared = shared_labs_lock();
        let file = tmp_path(&format!("{name}.toml"));
        std::fs::write(&file, toml).unwrap();
        let out = run(&[], &["lab", "up", file.to_str().unwrap(), "--name", name]);
        // The lab has read its topology: nothing of the test's stays in the temp directory.
        let _ = std::fs::remove_file(&file);
        let _ = std::fs::remove_dir(file.parent().unwrap());
        assert!(
            out.status.success(),
            "lab up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(LabUp {
            name: name.into(),
            _shared: shared,
        })
    }

    /// A built-in topology (`bloatlab lab up PRESET`).
    pub fn preset(name: &str, preset: &str) -> Option<LabUp> {
        if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/dev/net/tun").exists() {
            missing("lab tests need root and /dev/net/tun");
            return None;
        }
        let shared = shared_labs_lock();
        let out = run(&[], &["lab", "up", preset, "--name", name]);
        assert!(
            out.status.success(),
            "lab up {preset}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(LabUp {
            name: name.into(),
            _shared: shared,
        })
    }

    pub fn exec(&self, host: &str) -> Vec<String> {
        [BIN, "lab", "exec", "--lab", &self.name, host, "--"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    pub fn server(&self, host: &str) -> ServerProc {
        let p = self.exec(host);
        ServerProc::start(
            &p.iter().map(String::as_str).collect::<Vec<_>>(),
            "[::]:9461",
            &["-q"],
        )
    }

    pub fn test(&self, host: &str, args: &[&str]) -> serde_json::Value {
        self.test_and_result(host, args).0
    }

    /// The test's JSON summary and its result file (read).
    pub fn test_and_result(
        &self,
        host: &str,
        args: &[&str],
    ) -> (serde_json::Value, serde_json::Value) {
        let p = self.exec(host);
        // The host in the name too: two hosts may run the same test at once (lab.rs's l4s test:
        // one file for both made one's write fail and the other's read half a file).
        let out_file = tmp_path(&format!(
            "{}-{host}-{}.json",
            self.name,
            args.join("_").replace(['/', ' ', ':'], "")
        ));
        let mut all = vec!["test"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--json", "-q", "-o", out_file.to_str().unwrap()]);
        let out = run(&p.iter().map(String::as_str).collect::<Vec<_>>(), &all);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (
            json(&out),
            serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap(),
        )
    }

    pub fn set(&self, link: &str, kv: &[&str]) {
        let mut args = vec!["lab", "set", "--lab", &self.name, link];
        args.extend_from_slice(kv);
        let out = run(&[], &args);
        assert!(
            out.status.success(),
            "lab set: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn stats(&self) -> serde_json::Value {
        let out = run(&[], &["lab", "stats", "--json", "--lab", &self.name]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json(&out)
    }
}

impl Drop for LabUp {
    fn drop(&mut self) {
        let _ = run(&[], &["lab", "down", &self.name]);
    }
}
