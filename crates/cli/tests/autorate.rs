//! `bloatlab autorate` against the kernel's HTB (its class rate changed over netlink while a
//! real TCP upload runs and the line under it slows), with the monitor, and its refusals;
//! cake-autorate itself through its `tc` on the lab's CAKE (`lab compare`); ours on the lab's
//! own shaper on a line that slows, a test that takes the machine (CI's first phase).

use crate::common::*;
use bloatlab_result::autorate::{read_log, LogLine};
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The rate of HTB class 1:1 on `dev`.
fn class_rate(ns: &str, dev: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "tc", "class", "show", "dev", dev])
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&out.stdout).to_string();
    let text = all
        .lines()
        .find(|l| l.contains("htb 1:1 "))
        .unwrap_or_else(|| panic!("no class 1:1 in `{all}`"));
    text.split_whitespace()
        .skip_while(|w| *w != "rate")
        .nth(1)
        .unwrap_or_else(|| panic!("no rate in `{text}`"))
        .to_string()
}

/// `bloatlab autorate` in the client's namespace, moving the HTB on its c0 (the upload as
/// `up` says), probing `hosts`; its stderr piped.
fn on_the_client(t: &Topo, hosts: &str, up: &str, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["autorate", hosts, "--netns", &t.cli, "--dev", "c0"];
    args.extend(["--down", "5mbit:40mbit:50mbit", "--up", up]);
    args.extend(extra);
    command(&[], &args).stderr(Stdio::piped()).spawn().unwrap()
}

/// SIGTERM to `child`, which must end within 10 s: its exit status and stderr (printed).
fn sigterm(mut child: std::process::Child) -> (std::process::ExitStatus, String) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "it did not end on SIGTERM");
        wait_ms(100);
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    eprintln!("{stderr}");
    (status, stderr)
}

/// The tick lines of `lines` from `from` to `to` seconds after a load that started 1.5 s
/// after autorate (the log's clock).
fn ticks(lines: &[LogLine], from: f64, to: f64) -> Vec<&LogLine> {
    lines
        .iter()
        .filter(|l| l.event == "tick" && (from + 1.5..to + 1.5).contains(&l.t))
        .collect()
}

/// The client namespace's view of a /metrics page on `port`.
fn scrape(t: &Topo, port: u16) -> String {
    let url = format!("127.0.0.1:{port}/metrics");
    let out = Command::new("ip")
        .args(["netns", "exec", &t.cli, "curl", "-s", &url])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// autorate's log lines after the header, read with the result crate's reader
/// (a line cut by a kill left out, the header checked).
fn log_lines(path: &std::path::Path) -> Vec<LogLine> {
    let text = std::fs::read_to_string(path).unwrap();
    read_log(&text).unwrap().1
}

/// An HTB class on the client's egress (c0): the upload's shaper, at 18 Mbit/s until autorate
/// moves it, overhead 18. Under it a short FIFO for the bulk and a class of its own for the
/// probes (ICMP, and UDP to the probed server's port 9462), as fq_codel or CAKE would give a
/// sparse flow its own queue (this kernel has neither): a probe behind a TCP upload's packets
/// in one FIFO waits longer the lower the shaper's rate (8 packets at 2 Mbit/s: 48 ms), which
/// autorate cannot tell from the line's bloat.
fn htb_upload_shaper(t: &Topo) {
    let tc = |args: &[&str]| {
        let mut a = vec!["ip", "netns", "exec", &t.cli, "tc"];
        a.extend_from_slice(args);
        sh(&a).unwrap();
    };
    tc(&[
        "qdisc", "add", "dev", "c0", "root", "handle", "1:", "htb", "default", "10",
    ]);
    tc(&[
        "class", "add", "dev", "c0", "parent", "1:", "classid", "1:1", "htb", "rate", "18mbit",
        "overhead", "18",
    ]);
    for (class, prio) in [("1:10", "1"), ("1:20", "0")] {
        tc(&[
            "class", "add", "dev", "c0", "parent", "1:1", "classid", class, "htb", "rate", "1mbit",
            "ceil", "1000mbit", "prio", prio,
        ]);
    }
    tc(&[
        "qdisc", "add", "dev", "c0", "parent", "1:10", "pfifo", "limit", "50",
    ]);
    for m in [["protocol", "1", "0xff"], ["dport", "9462", "0xffff"]] {
        let mut a = vec![
            "filter", "add", "dev", "c0", "parent", "1:", "protocol", "ip",
        ];
        a.extend(["prio", "1", "u32", "match", "ip"]);
        a.extend(m);
        a.extend(["flowid", "1:20"]);
        tc(&a);
    }
}

/// The topology (the router's line 50/20 Mbit/s with `limit` packets of FIFO), the client's
/// HTB upload shaper and the server on port 9461.
fn shaped_client(tag: &str, limit: u32) -> Result<(Topo, ServerProc), String> {
    let t = Topo::up(tag, limit, "50mbit", "20mbit")?;
    htb_upload_shaper(&t);
    let server = t.server();
    Ok((t, server))
}

/// A TCP upload of `secs` seconds from the client to the topology's server, in the background.
fn upload(t: &Topo, secs: &str, name: &str) -> std::process::Child {
    let result = tmp_path(name);
    command(
        &t.exec(&t.cli),
        &[
            "test",
            "tcp-up",
            &format!("{SRV_ADDR}:9461"),
            "-l",
            secs,
            "-q",
            "-o",
            result.to_str().unwrap(),
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

/// Slows the router's line to the server (its HTB class) to `rate`.
fn slow_the_line(t: &Topo, rate: &str) {
    sh(&[
        "ip", "netns", "exec", &t.rtr, "tc", "class", "change", "dev", "rs", "parent", "1:",
        "classid", "1:1", "htb", "rate", rate,
    ])
    .unwrap();
}

/// The client's own egress (c0) carries an HTB class, the upload's shaper, and the router's
/// HTB is the line: 20 Mbit/s with a 1000-packet FIFO. Under a TCP upload the line slows to 8
/// Mbit/s; autorate, probing the server, must move the shaper down to the new rate (else that
/// FIFO fills: 1000 x 1514 B at 8 Mbit/s is 1.5 s). Then the server it probes goes: ICMP
/// reflectors (the server's host, behind the same line) take over, and their round trips alone
/// bring the shaper down to a line that slows again, to 5 Mbit/s, while the download, carrying
/// only ACKs, is never cut for them; the server back, its one-way delays drive again. SIGTERM
/// leaves BASE as asked.
#[test]
fn an_htb_class_follows_a_line_that_slows_under_a_real_upload_by_server_then_reflectors() {
    let _s = serial();
    let (t, _server) = match shaped_client("ar", 1000) {
        Ok(up) => up,
        Err(e) => return missing(&e),
    };
    // autorate probes a server of its own, which can go while the load's stays.
    let probed = || ServerProc::start(&t.exec(&t.srv), "0.0.0.0:9462", &["-q"]);
    let probe_server = probed();
    let log = tmp_path("htb.autorate.jsonl");
    let probe_addr = format!("{SRV_ADDR}:9462");
    let mut extra = ["--reflectors", SRV_ADDR, "--on-exit", "base", "--log"].to_vec();
    extra.push(log.to_str().unwrap());
    let ar = on_the_client(&t, &probe_addr, "2mbit:16mbit:20mbit", &extra);
    wait_ms(1500);
    // BASE on start: the class as the user left it, but the rate.
    assert_eq!(class_rate(&t.cli, "c0"), "16Mbit");
    let mut load = upload(&t, "22", "htb-upload.json.gz");
    let start = Instant::now();
    let now = || start.elapsed().as_secs_f64();
    wait_ms(6000);
    let slowed_at = now();
    slow_the_line(&t, "8mbit");
    wait_ms(7000);
    drop(probe_server);
    let gone_at = now();
    wait_ms(1000);
    let slowed_again_at = now();
    slow_the_line(&t, "5mbit");
    let _ = load.wait();
    let _back = probed();
    // Its sessions are retried at most 5 s apart.
    let deadline = Instant::now() + Duration::from_secs(8);
    while !log_lines(&log).iter().any(|l| l.event == "server") && Instant::now() < deadline {
        wait_ms(200);
    }
    let (status, stderr) = sigterm(ar);
    assert!(status.success(), "{stderr}");
    assert_eq!(class_rate(&t.cli, "c0"), "16Mbit", "{stderr}");
    // Overhead, quantum and the rest as they were: only the rates moved.
    let shown = Command::new("ip")
        .args(["netns", "exec", &t.cli, "tc", "class", "show", "dev", "c0"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&shown.stdout).contains("overhead 18"));

    let lines = log_lines(&log);
    let ticks = |from, to| ticks(&lines, from, to);
    let before: Vec<f64> = ticks(slowed_at - 4.0, slowed_at)
        .iter()
        .map(|l| l.up_bps)
        .collect();
    assert!(
        before.iter().any(|bps| *bps >= 12e6),
        "the shaper held about the line's 20 Mbit/s before: {before:?}"
    );
    // At the slower line from 3 s after it slowed, and its FIFO near empty. The line's rate
    // is 1532/1514 of it as the shaper counts (its overhead 18 on 1514 B frames); autorate
    // probes above what the line carried and cuts when the queue answers: on average within 5%
    // of the line (8.10 Mbit/s on 8 in one run), a second now and then up to a fifth above it
    // (8.98 on 8, 6.01 on 5: the queue it builds is the bound that matters, below).
    let follows = |what: &str, ticks: Vec<&LogLine>, mbit: f64, delay: fn(&LogLine) -> _| {
        let line = mbit * 1e6 * (1514.0 + 18.0) / 1514.0;
        let ups: Vec<f64> = ticks.iter().map(|l| l.up_bps).collect();
        let delays: Vec<Option<f64>> = ticks.iter().map(|l| delay(l)).collect();
        eprintln!("{what}: upload shaper {ups:?}, delay over baseline {delays:?}");
        let mean = ups.iter().sum::<f64>() / ups.len().max(1) as f64;
        assert!(
            !ups.is_empty() && mean <= 1.05 * line,
            "{what}: the shaper stayed above the {mbit} Mbit/s line: {ups:?}"
        );
        let last = delays.last().copied().flatten();
        assert!(
            last.is_some_and(|d| d < 30.0),
            "{what}: the line's queue still {last:?} ms over its base"
        );
    };
    follows(
        "the server's one-way delays",
        ticks(slowed_at + 3.0, gone_at),
        8.0,
        |l| l.up_delta_ms,
    );
    follows(
        "the reflectors' round trips",
        ticks(slowed_again_at + 3.0, slowed_again_at + 8.0),
        5.0,
        |l| l.rtt_delta_ms,
    );
    // Reflectors from within a second of the server's going, until it was back.
    let at = |event: &str| lines.iter().find(|l| l.event == event).map(|l| l.t - 1.5);
    let (follow, back) = (at("reflectors"), at("server"));
    assert!(
        follow.is_some_and(|f| f > gone_at && f < gone_at + 1.5),
        "reflectors took over at {follow:?}, the server gone at {gone_at:.1} s"
    );
    assert!(back.is_some_and(|b| b > slowed_again_at + 8.0), "{back:?}");
    // Which direction to cut came from the load: the download was never cut.
    let cut_down = lines.iter().filter(|l| {
        l.event == "rate"
            && l.dir.as_deref() == Some("down")
            && !matches!(l.why.as_deref(), Some("increase" | "decay"))
    });
    assert_eq!(cut_down.count(), 0, "{stderr}");
    // The log as a page: each direction's shaper over what the line carried, and the delays;
    // which signal drove when.
    let Some((dom, rendered)) = report_rendered(&[log.to_str().unwrap()], "htb.html") else {
        return;
    };
    assert_eq!(rendered, 3, "download, upload and delay charts");
    assert!(dom.contains("HTB class 1:1 on c0"), "the shaper is named");
    assert!(dom.contains("(1 ICMP reflectors while it did not answer)"));
    assert!(dom.contains("<td>reflectors</td>") && dom.contains("<td>server</td>"));
}

/// Two servers, probed in turn: both answer (each has its own baselines on /metrics) at 20
/// probes a second in all while the line slows under a real upload, which the shaper follows.
/// Then one server goes: said once, the other carries on (no reflectors, no stall, its 10 a
/// second); back, it is said and probed again.
#[test]
fn with_two_servers_one_gone_leaves_the_other_driving() {
    let _s = serial();
    let (t, _server) = match shaped_client("a2", 1000) {
        Ok(up) => up,
        Err(e) => return missing(&e),
    };
    // The second server's probes get the upload shaper's probe class too.
    sh(&[
        "ip", "netns", "exec", &t.cli, "tc", "filter", "add", "dev", "c0", "parent", "1:",
        "protocol", "ip", "prio", "1", "u32", "match", "ip", "dport", "9463", "0xffff", "flowid",
        "1:20",
    ])
    .unwrap();
    let probed =
        |port: &str| ServerProc::start(&t.exec(&t.srv), &format!("0.0.0.0:{port}"), &["-q"]);
    let (_a, mut b) = (probed("9462"), probed("9463"));
    let log = tmp_path("two.autorate.jsonl");
    let (a_addr, b_addr) = (format!("{SRV_ADDR}:9462"), format!("{SRV_ADDR}:9463"));
    let both = format!("{a_addr},{b_addr}");
    let extra = [
        "--metrics",
        "127.0.0.1:9468",
        "--log",
        log.to_str().unwrap(),
    ];
    let ar = on_the_client(&t, &both, "2mbit:16mbit:20mbit", &extra);
    wait_ms(1500);
    let mut load = upload(&t, "17", "two-upload.json.gz");
    let start = Instant::now();
    let now = || start.elapsed().as_secs_f64();
    wait_ms(3000);
    let slowed_at = now();
    slow_the_line(&t, "8mbit");
    wait_ms(6000);
    let metrics = scrape(&t, 9468);
    b.child.kill().unwrap();
    let _ = b.child.wait();
    let gone_at = now();
    wait_ms(6000);
    let _b_back = probed("9463");
    let back_at = now();
    let _ = load.wait();
    // Its sessions are retried 1, 2, 4 s apart: the one 7 s after it went finds it back, a
    // second before the load ends.
    wait_ms(2000);
    let (status, stderr) = sigterm(ar);
    assert!(status.success(), "{stderr}");

    // The line's fall is a queue that cuts drain, not a longer path.
    for d in ["down", "up"] {
        let none = format!("bloatlab_autorate_path_changes_total{{direction=\"{d}\"}} 0\n");
        assert!(metrics.contains(&none), "{metrics}");
    }
    for server in [&a_addr, &b_addr] {
        let baseline = metrics.lines().find(|l| {
            l.starts_with("bloatlab_autorate_baseline_delay_seconds{")
                && l.contains(&format!("server=\"{server}\""))
                && l.contains("direction=\"up\"")
        });
        let value = baseline.and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        assert!(
            value.is_some_and(|v| v != 0.0),
            "{server}'s baseline: {baseline:?}\n{metrics}"
        );
    }
    assert!(stderr.contains("probing 10.99.3.1:9462, 10.99.3.1:9463 in turn"));
    let said = |what: &str| stderr.matches(&format!("{b_addr} {what}")).count();
    assert_eq!(said("does not answer"), 1, "{stderr}");
    assert_eq!(said("answers again"), 1, "{stderr}");
    assert!(
        !stderr.contains(&format!("{a_addr} does not answer")),
        "{stderr}"
    );

    let lines = log_lines(&log);
    let ticks = |from, to| ticks(&lines, from, to);
    // Probes answered a second: the median of the tick lines' (a loop held up by CI's other
    // tests for a second answers fewer in it and no fewer after).
    let per_second = |ticks: Vec<&LogLine>| {
        let mut v: Vec<u64> = ticks.iter().map(|l| l.answered).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let with_both = per_second(ticks(0.0, gone_at));
    let with_one = per_second(ticks(gone_at + 1.0, back_at));
    eprintln!("answered a second: {with_both} with both, {with_one} with one");
    assert!((17..=23).contains(&with_both), "{with_both}");
    assert!((8..=12).contains(&with_one), "{with_one}");
    // The upload's shaper at the slower line from 3 s after it slowed, as with one server
    // (the line's rate is 1532/1514 of it as the shaper counts: overhead 18 on 1514 B).
    let ups: Vec<f64> = ticks(slowed_at + 3.0, back_at)
        .iter()
        .map(|l| l.up_bps)
        .collect();
    let mean = ups.iter().sum::<f64>() / ups.len().max(1) as f64;
    eprintln!("upload shaper {ups:?}");
    assert!(
        !ups.is_empty() && mean <= 1.05 * 8e6 * 1532.0 / 1514.0,
        "the shaper stayed above the 8 Mbit/s line: {ups:?}"
    );
    let events: Vec<&str> = lines.iter().map(|l| l.event.as_str()).collect();
    assert!(
        !events.contains(&"reflectors") && !events.contains(&"stalled"),
        "{events:?}"
    );
}

/// A server that takes the connection and never answers (stopped: the kernel still completes
/// TCP's handshake) holds a session's opening for its 10 s deadline: autorate's loop goes on
/// meanwhile, and the reflectors drive from half a second after the start, every second.
#[test]
fn a_server_that_never_answers_its_handshake_does_not_hold_up_the_reflectors() {
    let _s = serial();
    let (t, _server) = match shaped_client("ah", 100) {
        Ok(up) => up,
        Err(e) => return missing(&e),
    };
    let stopped = ServerProc::start(&t.exec(&t.srv), "0.0.0.0:9462", &["-q"]);
    // SAFETY: signalling our own child (`ip netns exec` execs the server).
    unsafe { libc::kill(stopped.child.id() as i32, libc::SIGSTOP) };
    let log = tmp_path("stopped.autorate.jsonl");
    let log_arg = log.to_str().unwrap();
    let extra = [
        "--reflectors",
        SRV_ADDR,
        "--log",
        log_arg,
        "--duration",
        "6s",
    ];
    let host = format!("{SRV_ADDR}:9462");
    let ar = on_the_client(&t, &host, "2mbit:16mbit:20mbit", &extra);
    let started = Instant::now();
    let out = ar.wait_with_output().unwrap();
    let took = started.elapsed().as_secs_f64();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(took < 8.0, "--duration 6s took {took:.1} s: {stderr}");
    let lines = log_lines(&log);
    let took_over = lines.iter().find(|l| l.event == "reflectors").map(|l| l.t);
    assert!(
        took_over.is_some_and(|t| t < 1.0),
        "{took_over:?}: {stderr}"
    );
    // The reflector's 20 pings a second, answered in every second's tick line after the first.
    let answered: Vec<u64> = lines
        .iter()
        .filter(|l| l.event == "tick" && l.t > 1.5)
        .map(|l| l.answered)
        .collect();
    assert!(
        answered.len() >= 4 && answered.iter().all(|a| *a >= 10),
        "{answered:?}: {stderr}"
    );
}

/// `monitor --autorate FILE`: autorate rides on the monitor's probes in one process: the
/// probes at autorate's rate (20 a second, not the monitor's 5), the HTB class at BASE, one
/// /metrics page with both (one `# EOF`, and promtool reads it), and SIGTERM ends both.
#[test]
fn autorate_rides_on_the_monitors_probes_in_one_process() {
    let _s = serial();
    let (t, _server) = match shaped_client("am", 100) {
        Ok(up) => up,
        Err(e) => return missing(&e),
    };
    let (conf, log, db) = (
        tmp_path("ride.toml"),
        tmp_path("ride.jsonl"),
        tmp_path("ride.db"),
    );
    std::fs::write(
        &conf,
        format!(
            "dev = \"c0\"\ndown = \"5mbit:40mbit:50mbit\"\nup = \"2mbit:12mbit:20mbit\"\n\
             log = \"{}\"\n",
            log.display()
        ),
    )
    .unwrap();
    let server = format!("{SRV_ADDR}:9461");
    let out_dir = tmp_path("ride-results");
    let args = [
        "monitor",
        &server,
        "--every",
        "0",
        "--db",
        db.to_str().unwrap(),
        "--out-dir",
        out_dir.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:9467",
        "--autorate",
        conf.to_str().unwrap(),
    ];
    let m = command(&t.exec(&t.cli), &args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ms(4000);
    assert_eq!(class_rate(&t.cli, "c0"), "12Mbit");
    let text = scrape(&t, 9467);
    assert!(
        text.contains("bloatlab_autorate_rate_bits_per_second{direction=\"up\"} 12000000")
            && text.contains("bloatlab_probe_rtt_seconds"),
        "{text}"
    );
    assert!(
        text.matches("# EOF").count() == 1 && text.ends_with("# EOF\n"),
        "{text}"
    );
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    // It parses the page whole; what it says is its linter's style remarks on named families
    // (OpenMetrics counters' HELP sits on the name without `_total`; bits, not bytes), which
    // the monitor's page alone draws too. A page it cannot parse is an error line instead.
    let said = String::from_utf8_lossy(&checked.stdout).to_string()
        + &String::from_utf8_lossy(&checked.stderr);
    assert!(
        said.lines()
            .all(|l| l.starts_with("bloatlab_") && !l.contains("error")),
        "promtool: {said}"
    );
    let (status, stderr) = sigterm(m);
    assert!(status.success(), "{stderr}");
    let lines = log_lines(&log);
    assert_eq!(
        lines.last().map(|l| l.event.as_str()),
        Some("exit"),
        "{stderr}"
    );
    // The monitor's probes at autorate's rate: about 20 answered a second (its own rate is 5),
    // each tick line counting since the one before. The median, as a loop held up by CI's
    // other tests for a second answers fewer in it and no fewer after.
    let ticks: Vec<&LogLine> = lines.iter().filter(|l| l.event == "tick").collect();
    let mut per_second: Vec<f64> = ticks
        .windows(2)
        .filter(|w| w[0].t > 0.5)
        .map(|w| w[1].answered as f64 / (w[1].t - w[0].t))
        .collect();
    per_second.sort_by(f64::total_cmp);
    assert!(
        per_second.len() >= 2 && (15.0..=25.0).contains(&per_second[per_second.len() / 2]),
        "{per_second:?}"
    );
}

/// Someone removes the shaper while autorate runs: said once, left alone, and put back it is
/// driven again; the Prometheus gauges follow.
#[test]
fn a_shaper_removed_under_it_is_left_alone_and_found_again() {
    let _s = serial();
    let t = match Topo::up("arg", 100, "50mbit", "20mbit") {
        Ok(t) => t,
        Err(e) => return missing(&e),
    };
    let add = || {
        for args in [
            vec![
                "qdisc", "add", "dev", "c0", "root", "handle", "1:", "htb", "default", "1",
            ],
            vec![
                "class", "add", "dev", "c0", "parent", "1:", "classid", "1:1", "htb", "rate",
                "30mbit",
            ],
        ] {
            let mut a = vec!["ip", "netns", "exec", &t.cli, "tc"];
            a.extend(args);
            sh(&a).unwrap();
        }
    };
    add();
    let _server = t.server();
    let ar = on_the_client(
        &t,
        &format!("{SRV_ADDR}:9461"),
        "2mbit:12mbit:20mbit",
        &["--metrics", "127.0.0.1:9466", "--duration", "12s"],
    );
    let scrape = || scrape(&t, 9466);
    wait_ms(1500);
    let m = scrape();
    assert!(m.contains("bloatlab_autorate_shaper_present 1"), "{m}");
    assert!(
        m.contains("bloatlab_autorate_rate_bits_per_second{direction=\"up\"} 12000000"),
        "{m}"
    );
    sh(&[
        "ip", "netns", "exec", &t.cli, "tc", "qdisc", "del", "dev", "c0", "root",
    ])
    .unwrap();
    wait_ms(6000);
    assert!(scrape().contains("bloatlab_autorate_shaper_present 0"));
    add();
    let out = ar.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("was removed or replaced").count(),
        1,
        "{stderr}"
    );
    assert!(stderr.contains("is back: changing it again"), "{stderr}");
    // Driven again: BASE, not the 30 Mbit/s it was put back with.
    assert_eq!(class_rate(&t.cli, "c0"), "12Mbit", "{stderr}");
}

/// Nonsense is refused in one line, before anything is touched.
#[test]
fn nonsense_bounds_files_and_devices_are_refused_in_one_line() {
    let _s = serial();
    let conf = tmp_path("autorate.toml");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--down".into(), "50:10:5".into()],
            "write it with a unit",
        ),
        (
            vec!["--down".into(), "50mbit:10mbit:80mbit".into()],
            "0 < MIN <= BASE <= MAX",
        ),
        (
            vec!["--config".into(), conf.to_str().unwrap().into()],
            "unknown field `bandwith`",
        ),
        (
            vec!["--log-max".into(), "5".into()],
            "--log-max size `5`: write it with a unit",
        ),
        (
            vec!["--reflectors".into(), "1.1.1.1,dns.example\u{1b}[2J".into()],
            "`dns.example\\u{1b}[2J` is not an IP address",
        ),
    ];
    std::fs::write(&conf, "dev = \"lo\"\nbandwith = \"10mbit\"\n").unwrap();
    for (extra, want) in cases {
        let mut args = vec!["autorate", "127.0.0.1:9", "--up", "1mbit:2mbit:3mbit"];
        if !extra.iter().any(|a| a == "--config") {
            args.extend(["--dev", "lo"]);
        }
        if !extra.iter().any(|a| a == "--down") {
            args.extend(["--down", "1mbit:2mbit:3mbit"]);
        }
        args.extend(extra.iter().map(String::as_str));
        let out = run(&[], &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = run(
        &[],
        &[
            "autorate",
            "127.0.0.1:9",
            "--dev",
            "nosuch0",
            "--down",
            "1mbit:2mbit:3mbit",
            "--up",
            "1mbit:2mbit:3mbit",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("device nosuch0"), "{err}");
    for (hosts, want) in [
        ("127.0.0.1:9,,127.0.0.1:10", "an empty name between commas"),
        (
            "127.0.0.1:9,https://b.example/",
            "HOST `https://b.example/` is a URL",
        ),
    ] {
        let bounds = ["--down", "1mbit:2mbit:3mbit", "--up", "1mbit:2mbit:3mbit"];
        let mut args = vec!["autorate", hosts, "--dev", "lo"];
        args.extend(bounds);
        let out = run(&[], &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `lab compare` with rrul-be for `secs` s through `fix` (its arguments) on client - router -
/// line - server, the line's settings `line` (TOML); its files in `dir`.
fn compare_on_a_line(dir: &std::path::Path, line: &str, fix: &[&str], secs: &str) -> Output {
    let topo = dir.join("line.toml");
    let text = format!(
        "name = 'line'\n[[link]]\nname = 'lan'\na = 'client'\nb = 'router'\n\
         [[link]]\nname = 'line'\na = 'router'\nb = 'server'\n{line}"
    );
    std::fs::write(&topo, text).unwrap();
    let mut args = vec!["lab", "compare", topo.to_str().unwrap()];
    args.extend(fix);
    args.extend(["--test", "rrul-be", "-l", secs, "--json", "-q"]);
    args.extend(["--out-dir", dir.to_str().unwrap()]);
    run(&[], &args)
}

/// Stands in for cake-autorate.sh in the harness test below: what `lab compare --fix
/// cake-autorate-sh` promises the real script. Its config sourced as the script does; the load
/// counters readable; `tc qdisc show` gives the line's overhead; every reflector answers fping
/// through the line; one change alone and one through `tc -batch`, as it makes them; SIGTERM
/// stops it, its log written where the real one writes it.
const STAND_IN: &str = r#"#!/bin/bash
. "$1"
set -e
inst=${1##*/config.}; inst=${inst%.sh}
log="$log_file_path_override/cake-autorate.$inst.log"
read -r rx0 < "$rx_bytes_path"; read -r tx0 < "$tx_bytes_path"
[[ $(tc qdisc show dev "$dl_if") =~ (atm|noatm)[[:space:]]overhead[[:space:]]([0-9]+) ]]
echo "overhead ${BASH_REMATCH[2]}" > "$log"
fping -q -c 3 -p 100 "${reflectors[@]}"
echo "reflectors ${#reflectors[@]}" >> "$log"
tc qdisc change root dev "$dl_if" cake bandwidth 5000Kbit
printf 'qdisc change root dev %s cake bandwidth 1000Kbit\n' "$ul_if" | tc -force -batch -
stop() {
  read -r rx1 < "$rx_bytes_path"; read -r tx1 < "$tx_bytes_path"
  echo "down $((rx1 - rx0)) up $((tx1 - tx0))" >> "$log"
  exit 0
}
trap stop TERM
while :; do sleep 0.1; done
"#;

/// `lab compare --fix cake-autorate-sh` runs cake-autorate itself on the lab's router (its
/// numbers on the moving presets are in BENCHMARKS.md: this machine cannot fetch it, nor can
/// CI). The harness around it is held to its side with a stand-in script in its place: its
/// changes reach the lab's CAKE (goodput under the 5 / 1 Mbit/s it sets, on a 20 / 4 Mbit/s
/// line), both are logged as autorate's changes are, its counters count the download and the
/// upload the right way round, its reflectors answer through the line, and nothing of it is
/// left behind.
#[test]
fn cake_autorates_changes_reach_the_labs_cake_through_its_tc() {
    let _s = serial();
    if !have("fping") {
        return missing("fping (apt-get install fping)");
    }
    let dir = tmp_path("ar-peer");
    let checkout = dir.join("cake-autorate");
    std::fs::create_dir_all(&checkout).unwrap();
    std::fs::write(checkout.join("cake-autorate.sh"), STAND_IN).unwrap();
    std::fs::write(checkout.join("defaults.sh"), "").unwrap();
    std::fs::write(checkout.join("lib.sh"), "").unwrap();
    let line = "both = { delay = '10ms', limit = 1000, overhead = 18 }\n\
                down = { rate = '20mbit' }\nup = { rate = '4mbit' }\n";
    let fix = ["--fix", "cake-autorate-sh", "--cake-autorate"];
    let fix = [&fix[..], &[checkout.to_str().unwrap()]].concat();
    let out = compare_on_a_line(&dir, line, &fix, "8");
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("root") {
        return missing("lab compare needs root");
    }
    assert!(out.status.success(), "{err}");
    let v = json(&out);
    let r = &v["runs"][0];
    // CAKE at 5 / 1 Mbit/s counting 18 bytes a packet more than IP: goodput at most 1448 of
    // every 1532 bytes (94.5%), less the other way's ACKs: the download's (about 0.12 Mbit/s)
    // take an eighth of the 1 Mbit/s up. Measured 4.45 / 0.73 Mbit/s over the 8 s; 3.35 and
    // 2.42 down on a slow CI host busy with builds and other labs. Under 4.75 is the change
    // applied (the line carries 18); over 2 tells it from a shaper at the upload's 1 Mbit/s.
    let (down, up) = (
        f(r, "summary.throughput_mbps.down"),
        f(r, "summary.throughput_mbps.up"),
    );
    eprintln!("through the stand-in's CAKE: {down} / {up} Mbit/s");
    assert!((2.0..4.75).contains(&down), "down {down} Mbit/s");
    assert!((0.5..0.95).contains(&up), "up {up} Mbit/s");
    assert_eq!(r["rate_changes"], 2);
    let log = log_lines(std::path::Path::new(r["autorate_log"].as_str().unwrap()));
    let last = log.last().unwrap();
    assert_eq!((last.down_bps, last.up_bps), (5e6, 1e6), "{log:?}");
    let own = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".cake-autorate.log"))
        .expect("its own log kept");
    let own = std::fs::read_to_string(own).unwrap();
    assert!(own.contains("overhead 18\nreflectors 8\n"), "{own}");
    // What its counters read over the run: the download's path the download (5 Mbit/s), the
    // upload's the upload (1 Mbit/s) and not the other way round.
    let bytes = |way: &str| -> f64 {
        let w: Vec<&str> = own.split_whitespace().collect();
        let i = w
            .iter()
            .position(|x| *x == way)
            .expect("counters at SIGTERM");
        w[i + 1].parse().unwrap()
    };
    assert!(bytes("down") > 3.0 * bytes("up"), "{own}");
    let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("bloatlab-cake-autorate-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A line that slows for good 10 s into the load (30 -> 10 Mbit/s down, 6 -> 2 up; 1000-packet
/// buffers): BASE, 95% of its steps' mean (19 / 3.8 Mbit/s), is above the slow line, where a
/// fixed shaper would fill the buffer (1000 x 1500 B at 10 Mbit/s: 1.2 s; at 2: 6 s).
/// autorate, on the lab's router, must come down to the line and keep the added delay a fraction
/// of that, at most of the line's rate. The fall itself costs what the law allows: both queues
/// grow 2 s a second until the cut (three delayed probes, then 400 ms of growth: up to a
/// second of queue), which the cut drains at half the line's rate within about a second; a
/// second over 100 ms is 5% of the 20 s run, so its p95 is bounded by 300 ms (a quarter of the
/// fixed shaper's 1.2 s; quiet runs read +60 to +105, a busy CI host +155). Once drained, the
/// queues stay short: most of the last ticks' probes see under 30 ms. As it slows, its path
/// lengthens by 15 ms each way (a satellite's new route, as the `starlink` preset's steps do):
/// a delay that no cut drains, taken as the path's own (a `path` line in the log) rather than
/// cut for until the shapers are far below the line. (BENCHMARKS.md has the
/// fixed shapers beside it, and cake-autorate's law, on the moving presets.)
#[test]
fn on_a_line_that_slows_autorate_comes_down_to_it_and_keeps_the_delay_short() {
    // The machine to itself (CI's first phase): the share of the line it carried fell to 64%
    // beside two other labs (76% alone), and beside a build or a guest its delay rose (+376 ms
    // where +77 alone); holding every lab and no guest beside it in CI's shared phase, it
    // waited up to 90 s for a moment with no other lab up, for 28 s of its own.
    let _s = quiet();
    let dir = tmp_path("ar-slows");
    std::fs::create_dir_all(&dir).unwrap();
    let (down, up, path) = (
        dir.join("down.txt"),
        dir.join("up.txt"),
        dir.join("path.txt"),
    );
    std::fs::write(&down, "0 30mbit\n15 10mbit\n").unwrap();
    std::fs::write(&up, "0 6mbit\n15 2mbit\n").unwrap();
    std::fs::write(&path, "0 10ms\n15 25ms\n").unwrap();
    let line = format!(
        "both = {{ delay = 'schedule:{}', limit = 1000 }}\n\
         down = {{ rate = 'schedule:{}' }}\nup = {{ rate = 'schedule:{}' }}\n",
        path.display(),
        down.display(),
        up.display()
    );
    let out = compare_on_a_line(&dir, &line, &["--fix", "autorate"], "20");
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("root") {
        return missing("lab compare needs root");
    }
    let share_of = |r: &serde_json::Value| {
        f(r, "summary.throughput_mbps.down") * 1e6 / f(r, "capacity_bps.down")
    };
    // What one run must show.
    let verdict = |v: &serde_json::Value| -> Result<(), String> {
        let r = &v["runs"][0];
        let p95 = r["added_p95_ms"].as_f64().unwrap();
        let share = share_of(r);
        eprintln!(
            "autorate: p95 +{p95:.1} ms, {:.0}% down, {} changes",
            share * 100.0,
            r["rate_changes"]
        );
        // The reason is formatted only when a bound is missed (it may hold the whole log).
        let check = |ok: bool, why: &dyn Fn() -> String| if ok { Ok(()) } else { Err(why()) };
        check(p95 < 300.0, &|| format!("autorate: p95 +{p95} ms"))?;
        check(share > 0.6, &|| format!("autorate delivered {share}"))?;
        let log = log_lines(std::path::Path::new(r["autorate_log"].as_str().unwrap()));
        // At the slow line each way over the load's last 5 s, not at BASE (19 / 3.8 Mbit/s):
        // it probes a little above what the line carried and cuts when the queue answers, so
        // the mean (the log's clock starts with the run, the line slows 15 s after it; once
        // the load ends the rates decay back towards BASE).
        let loaded: Vec<&LogLine> = log
            .iter()
            .filter(|l| l.event == "tick" && l.down_load_bps > 2e6)
            .collect();
        let tail = &loaded[loaded.len().saturating_sub(5)..];
        check(tail[0].t > 18.0, &|| format!("{tail:?}"))?;
        let mean =
            |k: fn(&LogLine) -> f64| tail.iter().map(|l| k(l)).sum::<f64>() / tail.len() as f64;
        let (d, u) = (mean(|l| l.down_bps), mean(|l| l.up_bps));
        check(d < 1.1 * 10e6 && u < 1.1 * 2e6, &|| {
            format!("{d} / {u} bit/s: {tail:?}")
        })?;
        // The path's 15 ms more joined the baseline; cut after cut for it would have taken
        // the shapers far below the line.
        check(log.iter().any(|l| l.event == "path"), &|| {
            format!("{log:?}")
        })?;
        check(d > 0.6 * 10e6 && u > 0.6 * 2e6, &|| {
            format!("{d} / {u} bit/s: {tail:?}")
        })?;
        let short = |d: Option<f64>| d.is_some_and(|d| d < 30.0);
        let drained = tail
            .iter()
            .filter(|l| short(l.down_delta_ms) && short(l.up_delta_ms))
            .count();
        check(drained >= 3, &|| {
            format!("the queues stay long at the end: {tail:?}")
        })?;
        check(
            log.iter()
                .any(|l| l.event == "rate" && l.why.as_deref() == Some("delivered")),
            &|| "no cut to what the line delivered".into(),
        )
    };
    // Beside CI's other workers on a busy host the download once carried 59.4% of the line
    // (79-80% alone), and once the shaper ended at 5.5 Mbit/s (the line 10) while the flows
    // filled under 60% of it. Load only takes rate away and adds delay, so a run that misses
    // a bound is measured once more, and the test asks one of the two to meet them all; a
    // controller that misses them misses them both times.
    let mut v = json(&out);
    if let Err(why) = verdict(&v) {
        eprintln!("{why}: measuring it again");
        v = json(&compare_on_a_line(
            &dir,
            &line,
            &["--fix", "autorate"],
            "20",
        ));
        if let Err(why) = verdict(&v) {
            panic!("{why}");
        }
    }
    // The report draws the shaper over the line: the capacity steps from 30 to 10 Mbit/s,
    // and the shaper's rate ends near the slow line.
    let html = std::fs::read_to_string(v["report"].as_str().unwrap()).unwrap();
    let data = html
        .split("var RUNS = ")
        .nth(1)
        .unwrap()
        .split(";\n")
        .next()
        .unwrap();
    let views: serde_json::Value = serde_json::from_str(data).unwrap();
    let line = |name: &str| -> Vec<(f64, f64)> {
        let l = views[0]["shaper"].as_array().unwrap().iter();
        let points = l.clone().find(|l| l["name"] == name).unwrap()["points"].clone();
        let points = points.as_array().unwrap().iter();
        let xy = |p: &serde_json::Value| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap());
        points.map(xy).collect()
    };
    let capacity = line("capacity down");
    let first_and_last = (capacity[0].1, capacity.last().unwrap().1);
    assert_eq!(first_and_last, (30.0, 10.0), "{capacity:?}");
    let shaper = line("shaper down");
    assert!(shaper.last().unwrap().1 < 11.0, "{shaper:?}");
}
