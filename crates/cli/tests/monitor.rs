//! `bloatlab monitor` end to end: its history through a silence and a SIGTERM mid-test, files it
//! must not touch, the service files in dist/, and the real Prometheus (Debian's 2.42) scraping
//! two lab sites and receiving the same series from an agent by remote write.

use crate::common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `bloatlab monitor` child with its stderr lines collected; killed on drop.
struct Monitor {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(prefix: &[&str], args: &[&str]) -> Monitor {
        let mut all = vec!["monitor"];
        all.extend_from_slice(args);
        let mut child = command(prefix, &all)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn monitor");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let keep = lines.clone();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("monitor: {l}");
                keep.lock().unwrap().push(l);
            }
        });
        Monitor { child, lines }
    }

    /// The first line containing `what`, waiting up to `secs`.
    fn wait_for(&self, what: &str, secs: u64) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| l.contains(what)) {
                return l.clone();
            }
            assert!(
                Instant::now() < end,
                "the monitor never said `{what}`; it said:\n{}",
                self.lines.lock().unwrap().join("\n")
            );
            wait_ms(100);
        }
    }

    fn count(&self, what: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(what))
            .count()
    }

    /// Its /metrics address, from the line it says at the start.
    fn metrics_addr(&self) -> String {
        let l = self.wait_for("metrics on http://", 10);
        l.split("http://")
            .nth(1)
            .and_then(|s| s.strip_suffix("/metrics"))
            .unwrap()
            .to_string()
    }

    /// SIGTERM, then its exit code within `secs`.
    fn term(&mut self, secs: u64) -> Option<i32> {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(Instant::now() < end, "the monitor did not end on SIGTERM");
            wait_ms(100);
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn history(db: &Path) -> serde_json::Value {
    let out = run(
        &[],
        &[
            "history",
            "--db",
            db.to_str().unwrap(),
            "--since",
            "1h",
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "history: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

/// The target goes away and comes back, a scheduled test is skipped meanwhile, and SIGTERM
/// arrives during the next one: every part of it is in the history, and the interrupted test's
/// result file is readable.
#[test]
fn the_history_keeps_tests_a_silence_and_a_test_cut_short_by_sigterm() {
    let _s = serial();
    // Paced to 200 Mbit/s: loopback's 25 Gbit/s would take both cores from the other worker's
    // timing tests.
    let limit = ["-q", "--max-rate", "200"];
    let mut server = ServerProc::start(&[], "127.0.0.1:0", &limit);
    let addr = server.addr.clone();
    let db = tmp_path("mon-history.db");
    let results = tmp_path("mon-results");
    let mut m = Monitor::start(
        &[],
        &[
            &addr,
            "--every",
            "10s",
            "--test",
            "rrul-be --idle 1",
            "-l",
            "2",
            "--probe-rate",
            "10",
            "--iface",
            "lo",
            "--db",
            db.to_str().unwrap(),
            "--out-dir",
            results.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
            "--site",
            "loop",
        ],
    );
    let metrics = m.metrics_addr();
    m.wait_for("rrul-be 2 s: grade", 20);
    let text = scrape(&metrics);
    assert!(
        text.contains(&format!(
            "bloatlab_tests_total{{site=\"loop\",target=\"{addr}\"}} 1"
        )),
        "{text}"
    );
    // The target goes away: said once, a gap, and the test due meanwhile is skipped.
    server.kill();
    m.wait_for("does not answer:", 10);
    m.wait_for("skipped:", 15);
    let mut server = ServerProc::start(&[], &addr, &limit);
    m.wait_for("answers again", 20);
    assert_eq!(
        m.count("does not answer:"),
        1,
        "the silence was said more than once"
    );
    // SIGTERM while the next test runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    while m.count(": starting") < 2 {
        assert!(Instant::now() < deadline, "no second test started");
        wait_ms(100);
    }
    wait_ms(1500);
    assert_eq!(m.term(15), Some(0));
    server.kill();

    let h = history(&db);
    assert_eq!(h["format"], "bloatlab-history");
    let tests = h["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 3, "{tests:#?}");
    assert_eq!(tests[0]["ended"], "complete");
    assert!(tests[0]["grade"].is_string());
    assert!(tests[1]["skipped"]
        .as_str()
        .unwrap()
        .contains("does not answer"));
    assert_eq!(tests[2]["ended"], "interrupted");
    let partial = tests[2]["result_path"].as_str().unwrap();
    let r = bloatlab_result::read(Path::new(partial)).expect("the cut-short result reads");
    assert!(r.partial);
    let gaps = h["gaps"].as_array().unwrap();
    assert_eq!(gaps.len(), 1, "{gaps:#?}");
    assert!(gaps[0]["ended"].as_i64().unwrap() > gaps[0]["started"].as_i64().unwrap());
    // Probes outside the tests: idle on loopback, and some lost while the server was gone.
    let hours = h["hours"].as_array().unwrap();
    let sent: u64 = hours.iter().map(|r| r["sent"].as_u64().unwrap()).sum();
    let lost: u64 = hours.iter().map(|r| r["lost"].as_u64().unwrap()).sum();
    assert!(sent > 100 && lost >= 1, "sent {sent}, lost {lost}");
    assert!(hours.iter().any(|r| r["load"] == "idle"));

    // The same history as a page, drawn by a real browser.
    let db = db.to_str().unwrap();
    let Some((dom, rendered)) = report_rendered(&["--db", db, "--since", "1h"], "history.html")
    else {
        return;
    };
    // Grades, round trip per hour, goodput; no CAKE on this lo.
    assert_eq!(rendered, 3, "{dom}");
    assert!(dom.contains("No CAKE on the watched interface"));
    assert!(dom.contains("skipped: "), "the skipped test is listed");
}

/// Another program's file, or a damaged history, is refused in one line and left as it was.
#[test]
fn a_foreign_or_damaged_history_is_refused_in_one_line() {
    let notes = tmp_path("notes.txt");
    std::fs::write(&notes, "not a database\n").unwrap();
    for args in [
        vec!["monitor", "127.0.0.1:1", "--db", notes.to_str().unwrap()],
        vec!["history", "--db", notes.to_str().unwrap()],
    ] {
        let out = run(&[], &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("not a bloatlab history"), "{err}");
    }
    assert_eq!(std::fs::read(&notes).unwrap(), b"not a database\n");
    let out = run(&[], &["monitor", "127.0.0.1:1", "--budget", "5 parsecs"]);
    assert_eq!(out.status.code(), Some(2));
}

/// dist/: the systemd units pass `systemd-analyze verify` (which does catch a wrong key), and
/// the OpenWrt init script, run with procd's functions recording what it asks for, builds
/// command lines this bloatlab accepts: the monitor alone, and with autorate riding on it (the
/// TOML it writes from UCI read as `--autorate` reads it).
#[test]
fn the_service_files_parse_and_the_procd_script_builds_a_command_bloatlab_accepts() {
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist");
    let unit = std::fs::read_to_string(dist.join("systemd/bloatlab-monitor.service")).unwrap();
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        missing("systemd-analyze (package systemd)");
        return;
    }
    // What it says of this file (it also loads, and may warn about, the machine's own units).
    let verify = |text: &str, name: &str| -> String {
        let p = tmp_path(name);
        std::fs::write(&p, text.replace("/usr/local/bin/bloatlab", BIN)).unwrap();
        let out = Command::new("systemd-analyze")
            .args(["verify", p.to_str().unwrap()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.contains(name))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let said = verify(&unit, "bloatlab-monitor.service");
    assert!(said.trim().is_empty(), "systemd-analyze: {said}");
    let autorate = std::fs::read_to_string(dist.join("systemd/bloatlab-autorate.service")).unwrap();
    let said = verify(&autorate, "bloatlab-autorate.service");
    assert!(said.trim().is_empty(), "systemd-analyze: {said}");
    let broken = verify(
        &unit.replace("ProtectHome=", "ProtectHoem="),
        "broken.service",
    );
    assert!(broken.contains("ProtectHoem"), "{broken}");

    let init = dist.join("openwrt/bloatlab.init");
    let st = Command::new("sh").arg("-n").arg(&init).status().unwrap();
    assert!(st.success(), "sh -n {}", init.display());
    // procd and UCI stand-ins: the options of dist/openwrt/bloatlab.config with a server and a
    // device set, autorate enabled or not; the command is printed one word a line.
    let db = tmp_path("procd/history.db");
    let toml = tmp_path("procd/autorate.toml");
    let stub = |autorate: bool| {
        format!(
            r#"
config_load() {{ :; }}
config_get() {{
  case "$3" in
    server) v=127.0.0.1:1 ;; iface) v=lo ;; budget) v=5GB/day ;; metrics) v=127.0.0.1:0 ;;
    site) v=home ;; db) v={db} ;; out_dir) v={out} ;; dev) v=lo ;;
    down) v=5mbit:40mbit:80mbit ;; up) v=2mbit:10mbit:20mbit ;; log) v={log} ;;
    reflectors) v=public ;; probe_rate) v=20 ;; *) v=$4 ;;
  esac
  eval "$1=\$v"
}}
config_get_bool() {{ if [ "$2" = autorate ]; then eval "$1={autorate}"; else eval "$1=1"; fi; }}
procd_open_instance() {{ :; }}
procd_close_instance() {{ :; }}
procd_set_param() {{ [ "$1" = command ] && {{ shift; CMD="$*"; printf '%s\n' "$@"; }}; :; }}
procd_append_param() {{ shift; printf '%s\n' "$@"; }}
procd_add_reload_trigger() {{ :; }}
. {init}
AUTORATE_TOML={toml}
start_service
"#,
            db = db.display(),
            out = tmp_path("procd/results").display(),
            log = tmp_path("procd/autorate.log").display(),
            toml = toml.display(),
            autorate = u8::from(autorate),
            init = init.display()
        )
    };
    // The script's first line runs it under /etc/rc.common; sourced here, that line is a comment.
    let words = |autorate: bool| -> Vec<String> {
        let out = Command::new("sh")
            .arg("-c")
            .arg(stub(autorate))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect()
    };
    let alone = words(false);
    assert_eq!(alone[0], "/usr/bin/bloatlab");
    for w in [
        "--iface", "lo", "--budget", "5GB/day", "--site", "home", "--every", "1h",
    ] {
        assert!(alone.iter().any(|x| x == w), "{w} missing from {alone:?}");
    }
    assert!(!alone.iter().any(|x| x == "--autorate"), "{alone:?}");
    // This bloatlab takes that command line: it runs (the target does not answer) until
    // SIGTERM, and then ends cleanly.
    let args: Vec<&str> = alone[1..].iter().map(String::as_str).collect();
    let mut m = Monitor::start(&[], &args[1..]);
    m.wait_for("does not answer", 10);
    assert_eq!(m.term(10), Some(0));

    // With autorate enabled it rides the monitor: its keys in a TOML file the monitor reads. lo
    // has no shaper, so the monitor stops there, after every key was taken.
    let riding = words(true);
    let at = riding
        .iter()
        .position(|x| x == "--autorate")
        .expect("--autorate");
    assert_eq!(riding[at + 1], toml.display().to_string());
    let written = std::fs::read_to_string(&toml).unwrap();
    for line in [
        "dev = \"lo\"",
        "down = \"5mbit:40mbit:80mbit\"",
        "reflectors = \"public\"",
        "probe_rate = 20",
    ] {
        assert!(
            written.lines().any(|l| l == line),
            "{line} not in {written}"
        );
    }
    let out = Command::new(BIN).args(&riding[1..]).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("lo has no CAKE or HTB"), "{said}");
}

/// A Prometheus process (Debian's), in a lab host's namespace; killed on drop.
struct Prometheus {
    child: Child,
    prefix: Vec<String>,
    port: u16,
}

impl Prometheus {
    fn start(prefix: &[String], config: &Path, port: u16, extra: &[&str]) -> Prometheus {
        let data = config.with_extension("data");
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..])
            .arg("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if extra.contains(&"--enable-feature=agent") {
            cmd.arg(format!("--storage.agent.path={}", data.display()));
        } else {
            cmd.arg(format!("--storage.tsdb.path={}", data.display()));
        }
        let child = cmd.spawn().expect("spawn prometheus");
        let p = Prometheus {
            child,
            prefix: prefix.to_vec(),
            port,
        };
        let end = Instant::now() + Duration::from_secs(20);
        while p.get("/-/ready").is_none() {
            assert!(
                Instant::now() < end,
                "prometheus on {port} never became ready"
            );
            wait_ms(200);
        }
        p
    }

    fn get(&self, path_and_query: &str) -> Option<String> {
        let out = Command::new(&self.prefix[0])
            .args(&self.prefix[1..])
            .args(["curl", "-sf", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{}{path_and_query}", self.port))
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }

    /// An instant query's result vector, evaluated now.
    fn query(&self, promql: &str) -> Vec<serde_json::Value> {
        self.query_at(promql, None)
    }

    /// An instant query's result vector, evaluated at Unix time `at` (now without it).
    fn query_at(&self, promql: &str, at: Option<f64>) -> Vec<serde_json::Value> {
        let mut q = String::new();
        for b in promql.bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                q.push(b as char);
            } else {
                q.push_str(&format!("%{b:02X}"));
            }
        }
        let body = self
            .get(&format!(
                "/api/v1/query?query={q}{}",
                at.map_or(String::new(), |t| format!("&time={t:.3}"))
            ))
            .unwrap_or_else(|| panic!("query failed: {promql}"));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{promql}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `promql` returns at least `n` series.
    fn wait_series(&self, promql: &str, n: usize, secs: u64) -> Vec<serde_json::Value> {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let r = self.query(promql);
            if r.len() >= n {
                return r;
            }
            assert!(
                Instant::now() < end,
                "{promql}: {} series, want {n}",
                r.len()
            );
            wait_ms(500);
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn value(series: &serde_json::Value) -> f64 {
    series["value"][1].as_str().unwrap().parse().unwrap()
}

fn by_site(r: &[serde_json::Value], site: &str) -> f64 {
    value(
        r.iter()
            .find(|s| s["metric"]["site"] == site)
            .unwrap_or_else(|| panic!("no series of site {site}: {r:?}")),
    )
}

/// Two sites behind different lines (home: a 300-packet FIFO at 10 Mbit/s up, which an upload
/// fills for 300 * 1514 * 8 / 10e6 = 363 ms; office: 12 packets, at most 7 ms each way), each
/// with its monitor; one Prometheus scrapes both with the shipped config and rules, an agent
/// scrapes them too and remote-writes to a central one. Both answer the same PromQL, home's
/// bloat shows, and every panel of the shipped dashboard has data.
#[test]
fn prometheus_scrapes_two_sites_and_a_central_one_gets_the_same_by_remote_write() {
    let _s = serial();
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        missing("prometheus (Debian's package)");
        return;
    }
    let Some(lab) = LabUp::up(
        "mon",
        r#"
name = "mon"
[[link]]
name = "home"
a = "home"
b = "srv"
both = { delay = "5ms" }
up = { rate = "10mbit", limit = 300 }
down = { rate = "40mbit", limit = 300 }
[[link]]
name = "office"
a = "office"
b = "srv"
both = { delay = "5ms", limit = 12 }
up = { rate = "20mbit" }
down = { rate = "20mbit" }
"#,
    ) else {
        return;
    };
    let _server = lab.server("srv");
    let dir = tmp_path("prom");
    std::fs::create_dir_all(&dir).unwrap();
    let mut monitors = Vec::new();
    for (site, server) in [("home", "10.77.0.2"), ("office", "10.77.1.2")] {
        let prefix = lab.exec(site);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let db = dir.join(format!("{site}.db"));
        monitors.push(Monitor::start(
            &prefix,
            &[
                server,
                "--site",
                site,
                "--iface",
                site,
                "--every",
                "1h",
                "--test",
                "rrul-be --idle 1",
                "-l",
                "4",
                "--probe-rate",
                "10",
                "--metrics",
                "0.0.0.0:9464",
                "--db",
                db.to_str().unwrap(),
                "--out-dir",
                dir.join(site).to_str().unwrap(),
            ],
        ));
    }
    // The shipped configs, pointed at the lab and sped up.
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist");
    let read = |f: &str| std::fs::read_to_string(dist.join(f)).unwrap();
    let fast = |s: String| {
        s.replace("scrape_interval: 30s", "scrape_interval: 1s")
            .replace("evaluation_interval: 30s", "evaluation_interval: 1s")
            .replace("home-router:9464", "10.77.0.1:9464")
            .replace("office-router:9464", "10.77.1.1:9464")
    };
    let scrape = dir.join("scrape.yml");
    std::fs::write(&scrape, fast(read("prometheus/scrape.yml"))).unwrap();
    std::fs::write(
        dir.join("bloatlab-rules.yml"),
        read("prometheus/bloatlab-rules.yml"),
    )
    .unwrap();
    let agent = dir.join("agent.yml");
    std::fs::write(
        &agent,
        fast(read("prometheus/agent.yml"))
            .replace(
                "          - localhost:9464",
                "          - 10.77.0.1:9464\n          - 10.77.1.1:9464",
            )
            .replace("central.example:9090", "127.0.0.1:9392"),
    )
    .unwrap();
    let srv = &lab.exec("srv");
    std::fs::write(dir.join("central.yml"), "global:\n  scrape_interval: 1s\n").unwrap();
    let scraper = Prometheus::start(srv, &scrape, 9391, &[]);
    let central = Prometheus::start(
        srv,
        &dir.join("central.yml"),
        9392,
        &["--web.enable-remote-write-receiver"],
    );
    let _agent = Prometheus::start(srv, &agent, 9393, &["--enable-feature=agent"]);

    for m in &monitors {
        m.wait_for("rrul-be 4 s: grade", 40);
    }
    // The probes' quantiles are compared over one window for both: the minute before 12 s
    // after the tests (their probes and the 10 s after them are tagged `test`), read once both
    // have every sample of it (the agent remote-writes in batches). Each evaluated at its own
    // "now", the central one's window once held fewer of office's probes than the scraper's, and
    // a few slow ones among them read p90 0.265 s against 0.025.
    let window_end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        + 12.0;
    wait_ms(20_000);
    let grade = r#"bloatlab_test_grade{site=~"home|office"}"#;
    let added = r#"bloatlab_test_added_latency_seconds{direction="both"}"#;
    let during_tests = r#"histogram_quantile(0.9, sum by (site, le) (rate(bloatlab_probe_rtt_seconds_bucket{load="test"}[1m])))"#;
    for (name, p) in [("scraper", &scraper), ("central", &central)] {
        let g = p.wait_series(grade, 2, 30);
        let (home_grade, office_grade) = (by_site(&g, "home"), by_site(&g, "office"));
        let a = p.wait_series(added, 2, 30);
        let (home, office) = (by_site(&a, "home"), by_site(&a, "office"));
        eprintln!(
            "{name}: home added {home:.3} s, grade {home_grade}; office {office:.3} s, grade \
             {office_grade}"
        );
        // The short FIFO's loss may cap office's grade (C from 5%), but not its latency.
        assert!(
            home > 0.1 && office < 0.03 && home_grade <= 3.0,
            "home's FIFO holds 363 ms, office's 7 ms: added {home} s (grade {home_grade}) and \
             {office} s"
        );
        let q = p.query_at(during_tests, Some(window_end));
        assert_eq!(q.len(), 2, "{during_tests}: {q:?}");
        let (home, office) = (by_site(&q, "home"), by_site(&q, "office"));
        eprintln!("{name}: probe p90 during the tests: home {home:.3} s, office {office:.3} s");
        assert!(
            home > 0.06 && office < 0.05,
            "home's upload fills 363 ms of FIFO, office's 7 ms: p90 {home} and {office}"
        );
    }
    // The shipped rules load and evaluate (recorded series appear) and promtool accepts them.
    scraper.wait_series("site_load:bloatlab_probe_rtt_seconds:p90_10m", 2, 20);
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(dist.join("prometheus/bloatlab-rules.yml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Every panel of the dashboard has a series, but CAKE's: this kernel has no sch_cake (the
    // kernel reference's test checks those series).
    let dash: serde_json::Value = serde_json::from_str(&read("grafana/bloatlab.json")).unwrap();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            if expr.contains("bloatlab_cake_") {
                continue;
            }
            let q = expr
                .replace("$site", "home|office")
                .replace("$__rate_interval", "1m");
            let r = scraper.wait_series(&q, 1, 20);
            assert!(!r.is_empty(), "panel {}: {q}", panel["title"]);
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} panel queries");
    for mut m in monitors {
        assert_eq!(m.term(15), Some(0));
    }
}
