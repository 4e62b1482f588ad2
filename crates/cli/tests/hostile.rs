//! The server as the public Internet will treat it, and the client against a hostile server:
//! each attack of issue #9, on loopback, with the limit it must meet.

use crate::common::*;
use bloatlab_proto::{self as proto, auth, frame};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// A raw protocol client: what an attacker writes by hand.
struct Raw {
    s: TcpStream,
    r: BufReader<TcpStream>,
}

impl Raw {
    fn connect(addr: &str) -> Raw {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let r = BufReader::new(s.try_clone().unwrap());
        Raw { s, r }
    }

    fn send(&mut self, line: &str) {
        self.s.write_all(line.as_bytes()).unwrap();
        self.s.write_all(b"\n").unwrap();
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        let _ = self.r.read_line(&mut l);
        l
    }

    /// Hello and a test request (JSON fields after "test"); returns the server's answer.
    fn test(addr: &str, request: &str, key: Option<&[u8]>) -> (Raw, serde_json::Value) {
        let mut c = Raw::connect(addr);
        c.send(&format!(
            r#"{{"type":"hello","magic":"bloatlab","version":{},"client_version":"t"}}"#,
            proto::PROTOCOL_VERSION
        ));
        let hello: serde_json::Value = serde_json::from_str(&c.line()).unwrap();
        let mut req: serde_json::Value = serde_json::from_str(request).unwrap();
        req["type"] = "test".into();
        if let (Some(k), Some(ch)) = (key, hello["challenge"].as_str()) {
            req["auth"] = auth::answer(k, &auth::unhex(ch).unwrap()).into();
        }
        c.send(&req.to_string());
        let answer = serde_json::from_str(&c.line()).unwrap_or(serde_json::Value::Null);
        (c, answer)
    }
}

const ONE_DOWNLOAD: &str = r#"{"test":"t","duration_ms":20000,"flows":[{"id":1,"direction":"down","dscp":0,"cc":null}],"streams":[{"id":0,"interval_us":10000,"size":80,"dscp":0}]}"#;

fn token(answer: &serde_json::Value) -> String {
    answer["token"]
        .as_str()
        .unwrap_or_else(|| panic!("not accepted: {answer}"))
        .to_string()
}

fn refused(line: &str) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|_| panic!("not a message: {line:?}"));
    assert_eq!(v["type"], "refused", "{line}");
    v
}

/// Sends a hello one byte every 300 ms (per-read timeouts would keep this forever) until the
/// server closes the connection; how long that took.
fn trickle_until_closed(addr: &str) -> Duration {
    let mut s = TcpStream::connect(addr).unwrap();
    let t0 = Instant::now();
    for b in br#"{"type":"hello","magic":"bloatlab","version":2,"client_version":"trickle......................"#.iter() {
        std::thread::sleep(Duration::from_millis(300));
        if s.write_all(&[*b]).is_err() {
            return t0.elapsed();
        }
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        if matches!(s.read(&mut [0u8; 64]), Ok(0)) {
            return t0.elapsed();
        }
    }
    panic!("still connected after {:?}", t0.elapsed());
}

#[test]
fn a_trickling_hello_keeps_its_slot_only_while_nobody_else_wants_it() {
    let _g = serial();
    // The hello deadline (5 s) once half the address's slots are held (here its only one of
    // two); while they are not, the lossy uplink's allowance, as for a TLS handshake (15 s).
    let crowded = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--max-connections-per-ip", "2"]);
    let roomy = ServerProc::start(&[], "127.0.0.1:0", &["-q"]);
    let crowded_took = std::thread::scope(|s| {
        let c = s.spawn(|| trickle_until_closed(&crowded.addr));
        let took = trickle_until_closed(&roomy.addr);
        assert!(
            took >= Duration::from_secs(15) && took < Duration::from_secs(17),
            "not crowded: closed after {took:?}, want 15 s"
        );
        c.join().unwrap()
    });
    assert!(
        crowded_took >= Duration::from_secs(5) && crowded_took < Duration::from_secs(7),
        "crowded: closed after {crowded_took:?}, want 5 s"
    );
}

#[test]
fn a_full_server_says_busy_and_names_the_limit() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--max-connections", "2"]);
    let _idle: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(&srv.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = Raw::connect(&srv.addr);
    let v = refused(&third.line());
    assert_eq!(v["reason"], "busy");
    assert!(
        v["message"].as_str().unwrap().contains("2 connections"),
        "{v}"
    );

    // Per address: the same rule with its own number.
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--max-connections-per-ip", "3"]);
    let _idle: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&srv.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut fourth = Raw::connect(&srv.addr);
    let v = refused(&fourth.line());
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("your address already has 3 connections"),
        "{v}"
    );
}

#[test]
fn each_flow_gets_one_data_connection_and_probes_need_a_test_that_asked() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--max-flows", "1"]);
    let (_control, answer) = Raw::test(&srv.addr, ONE_DOWNLOAD, None);
    let tok = token(&answer);
    let mut first = Raw::connect(&srv.addr);
    first.send(&format!(
        r#"{{"type":"data_hello","token":"{tok}","flow":1}}"#
    ));
    assert!(first.line().contains("data_ok"));
    for _ in 0..3 {
        let mut again = Raw::connect(&srv.addr);
        again.send(&format!(
            r#"{{"type":"data_hello","token":"{tok}","flow":1}}"#
        ));
        let v = refused(&again.line());
        assert_eq!(
            v["message"],
            "flow 1 already has its data connection (one per flow)"
        );
    }
    let mut probe = Raw::connect(&srv.addr);
    probe.send(&format!(r#"{{"type":"probe_hello","token":"{tok}"}}"#));
    assert_eq!(
        refused(&probe.line())["message"],
        "this test did not ask for connection probes"
    );
}

#[test]
fn a_client_that_never_reads_its_pongs_costs_the_server_no_memory() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q"]);
    let (_control, answer) = Raw::test(&srv.addr, ONE_DOWNLOAD, None);
    let tok = token(&answer);
    let mut data = Raw::connect(&srv.addr);
    data.send(&format!(
        r#"{{"type":"data_hello","token":"{tok}","flow":1}}"#
    ));
    assert!(data.line().contains("data_ok"));
    let before = srv.rss_kb();
    // 48 MiB of pings while never reading the download or its pongs.
    let pings: Vec<u8> = (0..8192u64).flat_map(frame::ping).collect();
    let t0 = Instant::now();
    let mut sent = 0usize;
    data.s
        .set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    while sent < 48 << 20 && t0.elapsed() < Duration::from_secs(20) {
        match data.s.write(&pings) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    let after = srv.rss_kb();
    eprintln!(
        "server RSS {before} kB -> {after} kB after {} MiB of pings in {:?}",
        sent >> 20,
        t0.elapsed()
    );
    assert!(
        sent >= 40 << 20,
        "the server stopped reading pings: {} MiB",
        sent >> 20
    );
    assert!(
        after < before + 8 * 1024,
        "RSS grew from {before} to {after} kB"
    );
}

#[test]
fn limits_apply_per_address_and_to_the_rate_a_test_moves() {
    let _g = serial();
    let srv = ServerProc::start(
        &[],
        "127.0.0.1:0",
        &["-q", "--max-tests-per-ip", "1", "--max-rate", "20"],
    );
    let first = command(
        &[],
        &[
            "test",
            "tcp-down",
            &srv.addr,
            "-l",
            "4",
            "--idle",
            "0.5",
            "--flows",
            "2",
            "-q",
            "--json",
            "-o",
            tmp_path("rate.json").to_str().unwrap(),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    wait_ms(1000);
    let second = run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "1",
            "-q",
            "-o",
            tmp_path("second.json").to_str().unwrap(),
        ],
    );
    assert_eq!(second.status.code(), Some(1));
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("your address already has 1 tests"), "{err}");
    let out = first.wait_with_output().unwrap();
    let mbps = f(&json(&out), "throughput_mbps.down");
    // --max-rate 20 Mbit/s paces the test's bytes (frames of 128 KiB, a quarter second of burst).
    assert!(
        mbps > 15.0 && mbps < 21.0,
        "goodput {mbps} Mbit/s under --max-rate 20"
    );
}

#[test]
fn with_a_key_only_key_holders_test_and_unsigned_probes_get_no_answer() {
    let _g = serial();
    let key_file = tmp_path("server.key");
    std::fs::write(&key_file, "correct horse battery staple\n").unwrap();
    let wrong = tmp_path("wrong.key");
    std::fs::write(&wrong, "incorrect horse battery staple").unwrap();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["--key", key_file.to_str().unwrap()]);
    let out_file = tmp_path("keyed.json");
    let none = run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "1",
            "-q",
            "-o",
            out_file.to_str().unwrap(),
        ],
    );
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("requires a key"),
        "{}",
        String::from_utf8_lossy(&none.stderr)
    );
    let bad = run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "1",
            "-q",
            "--key",
            wrong.to_str().unwrap(),
            "-o",
            out_file.to_str().unwrap(),
        ],
    );
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("wrong key"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let good = run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "2",
            "--idle",
            "0",
            "-q",
            "--json",
            "--key",
            key_file.to_str().unwrap(),
            "-o",
            out_file.to_str().unwrap(),
        ],
    );
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    let s = json(&good);
    assert_eq!(
        f(&s, "loss.lost"),
        0.0,
        "signed probes are answered: {}",
        s["loss"]
    );
    // A key holder learns the host's details.
    let r = bloatlab_result::read(&out_file).unwrap();
    assert_ne!(r.metadata.server.kernel, "not disclosed by the server");

    // An attacker who knows a live token but not the key gets nothing back, and is counted.
    let key = b"correct horse battery staple";
    let (_control, answer) = Raw::test(&srv.addr, ONE_DOWNLOAD, Some(key));
    let tok: proto::Token = token(&answer).parse().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = vec![0u8; 80];
    let p = proto::probe::Probe {
        kind: proto::probe::Kind::Request,
        stream: 0,
        token: tok,
        seq: 0,
        client_send_ns: 1,
        server_recv_ns: 0,
        server_send_ns: 0,
        server_rx_count: 0,
        flags: proto::probe::FLAG_MAC,
    };
    p.encode(&mut buf).unwrap();
    sock.send_to(&buf, &srv.addr).unwrap();
    assert!(
        sock.recv_from(&mut [0u8; 2048]).is_err(),
        "an unsigned probe was answered"
    );
    auth::sign_probe(key, &mut buf);
    sock.send_to(&buf, &srv.addr).unwrap();
    let (n, _) = sock
        .recv_from(&mut [0u8; 2048])
        .expect("a signed probe is answered");
    assert_eq!(n, 80, "never more bytes than the request");
    drop(_control);
    wait_ms(500);
    let log = srv.log.lock().unwrap().join("\n");
    assert!(log.contains("unauthenticated probes 1"), "{log}");
}

#[test]
fn host_details_allow_list_and_dscp_policy() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q"]);
    let out_file = tmp_path("hidden.json");
    assert!(run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "1",
            "--idle",
            "0",
            "-q",
            "-o",
            out_file.to_str().unwrap()
        ]
    )
    .status
    .success());
    assert_eq!(
        bloatlab_result::read(&out_file)
            .unwrap()
            .metadata
            .server
            .kernel,
        "not disclosed by the server"
    );
    let open = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--expose-host"]);
    assert!(run(
        &[],
        &[
            "test",
            "ping",
            &open.addr,
            "-l",
            "1",
            "--idle",
            "0",
            "-q",
            "-o",
            out_file.to_str().unwrap()
        ]
    )
    .status
    .success());
    assert_ne!(
        bloatlab_result::read(&out_file)
            .unwrap()
            .metadata
            .server
            .kernel,
        "not disclosed by the server"
    );

    let fenced = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--allow", "10.0.0.0/8"]);
    let out = run(&[], &["test", "ping", &fenced.addr, "-l", "1", "-q"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not among those this server serves"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let strict = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--allow-dscp", "BE,BK"]);
    let out = run(&[], &["test", "rrul", &strict.addr, "-l", "1", "-q"]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("is not allowed by this server (allowed: BE, BK)"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_clients_words_reach_the_operators_log_escaped() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &[]);
    let evil = r#"{"test":"ping\u001b[2J\ntest admin from 10.0.0.1: 0 flows","duration_ms":2000,"flows":[],"streams":[]}"#;
    let (control, answer) = Raw::test(&srv.addr, evil, None);
    token(&answer);
    drop(control);
    wait_ms(300);
    let log = srv.log.lock().unwrap();
    let line = log
        .iter()
        .find(|l| l.starts_with("test ping"))
        .expect("a log line for the test");
    assert!(line.contains(r"\u{1b}[2J\ntest admin"), "{line}");
    assert!(
        !log.iter()
            .any(|l| l.starts_with("test admin") || l.contains('\u{1b}')),
        "{log:?}"
    );
}

#[test]
fn udp_replies_are_never_larger_than_requests() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q"]);
    let (_control, answer) = Raw::test(&srv.addr, ONE_DOWNLOAD, None);
    let tok: proto::Token = token(&answer).parse().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let (mut bytes_in, mut bytes_out) = (0usize, 0usize);
    for (i, size) in [56usize, 80, 1472, 10, 1500, 200]
        .iter()
        .cycle()
        .take(60)
        .enumerate()
    {
        let mut buf = vec![0u8; *size];
        let p = proto::probe::Probe {
            kind: proto::probe::Kind::Request,
            stream: 0,
            token: tok,
            seq: i as u32,
            client_send_ns: 1,
            server_recv_ns: 0,
            server_send_ns: 0,
            server_rx_count: 0,
            flags: 0,
        };
        let _ = p.encode(&mut buf);
        sock.send_to(&buf, &srv.addr).unwrap();
        bytes_in += size;
        if let Ok((n, _)) = sock.recv_from(&mut [0u8; 4096]) {
            assert_eq!(n, *size, "a reply of {n} bytes to a request of {size}");
            bytes_out += n;
        }
    }
    eprintln!(
        "UDP: {bytes_out} bytes out for {bytes_in} in ({:.2})",
        bytes_out as f64 / bytes_in as f64
    );
    assert!(bytes_out < bytes_in && bytes_out > 0);
}

/// A fake server: answers each connection's first line with `answer`, byte by byte every
/// `trickle` when given.
fn fake_server(answer: &'static str, trickle: Option<Duration>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                match trickle {
                    None => {
                        let _ = s.write_all(answer.as_bytes());
                        wait_ms(2000);
                    }
                    Some(every) => {
                        for b in answer.bytes() {
                            if s.write_all(&[b]).is_err() {
                                return;
                            }
                            std::thread::sleep(every);
                        }
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn the_client_refuses_a_server_of_another_version_and_a_trickling_one() {
    let addr = fake_server("{\"type\":\"hello_ok\",\"version\":99,\"server_version\":\"9\",\"max_duration_ms\":1000000}\n", None);
    let out = run(&[], &["test", "ping", &addr, "-l", "1", "-q"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("protocol version 99") && err.trim().lines().count() == 1,
        "{err}"
    );

    let addr = fake_server("{\"type\":\"hello_ok\",\"version\":2,\"server_version\":\"2\",\"max_duration_ms\":1000000}\n", Some(Duration::from_millis(500)));
    let t0 = Instant::now();
    let out = run(&[], &["test", "ping", &addr, "-l", "1", "-q"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        t0.elapsed() < Duration::from_secs(13),
        "the handshake took {:?}",
        t0.elapsed()
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no complete answer within 10 s"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_hundred_clients_at_once_each_complete_or_are_told_no() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--max-tests-per-ip", "100"]);
    let t0 = Instant::now();
    let children: Vec<_> = (0..100)
        .map(|i| {
            command(
                &[],
                &[
                    "test",
                    "ping",
                    &srv.addr,
                    "-l",
                    "1",
                    "--idle",
                    "0",
                    "-q",
                    "-o",
                    tmp_path(&format!("soak{i}.json")).to_str().unwrap(),
                ],
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
        })
        .collect();
    let mut peak_rss = 0;
    let (mut done, mut busy) = (0, 0);
    for c in children {
        peak_rss = peak_rss.max(srv.rss_kb());
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => done += 1,
            Some(1) if err.contains("server is busy") && err.trim().lines().count() == 1 => {
                busy += 1
            }
            other => panic!("client ended {other:?}: {err}"),
        }
    }
    eprintln!(
        "100 clients in {:?}: {done} completed, {busy} told busy; server peak RSS {peak_rss} kB",
        t0.elapsed()
    );
    assert!(
        done >= 4,
        "at least the server's 4 test slots served someone"
    );
    assert_eq!(done + busy, 100);
    assert!(peak_rss < 64 * 1024, "server RSS {peak_rss} kB");
    // Every slot came back: a new test is accepted at once.
    assert!(run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "1",
            "--idle",
            "0",
            "-q",
            "-o",
            tmp_path("after.json").to_str().unwrap()
        ]
    )
    .status
    .success());
}

#[test]
fn a_killed_client_leaves_a_readable_partial_file_and_frees_its_slot() {
    let _g = serial();
    let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q", "--max-tests", "1"]);
    let file = tmp_path("killed.json");
    let mut c = command(
        &[],
        &[
            "test",
            "tcp-down",
            &srv.addr,
            "-l",
            "30",
            "--idle",
            "1",
            "-q",
            "-o",
            file.to_str().unwrap(),
        ],
    )
    .spawn()
    .unwrap();
    wait_ms(3500);
    unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
    let _ = c.wait();
    let r = bloatlab_result::read(&file).expect("the last snapshot is a readable result file");
    assert!(r.partial, "a killed run's file says it is partial");
    assert!(
        r.series
            .iter()
            .any(|s| s.name.starts_with("tcp down") && !s.samples.is_empty()),
        "it holds what was measured"
    );
    // The control connection closed with the process: the one test slot is free again.
    let t0 = Instant::now();
    let next = run(
        &[],
        &[
            "test",
            "ping",
            &srv.addr,
            "-l",
            "1",
            "--idle",
            "0",
            "-q",
            "-o",
            tmp_path("next.json").to_str().unwrap(),
        ],
    );
    assert!(
        next.status.success(),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn bad_files_and_values_get_one_line_naming_the_problem() {
    let bad_result = tmp_path("bad-result.json");
    std::fs::write(
        &bad_result,
        r#"{"format":"bloatlab-result","version":1,"metadata":"#,
    )
    .unwrap();
    let bad_topo = tmp_path("bad.toml");
    std::fs::write(&bad_topo, "name = 'x'\n[[link]\na = 'c'\n").unwrap();
    let bad_key = tmp_path("short.key");
    std::fs::write(&bad_key, "short").unwrap();
    let html = tmp_path("r.html");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "report",
                bad_result.to_str().unwrap(),
                "-o",
                html.to_str().unwrap(),
            ],
            "is not a bloatlab result",
        ),
        (
            vec![
                "export",
                "/etc/hostname",
                "--format",
                "csv",
                "-o",
                html.to_str().unwrap(),
            ],
            "is not a bloatlab result",
        ),
        (
            vec!["lab", "up", bad_topo.to_str().unwrap()],
            "line 2, column",
        ),
        (vec!["test", "ping", "127.0.0.1", "--step=-1"], "--step"),
        (
            vec!["test", "rpm", "127.0.0.1", "--rpm-interval", "0"],
            "want seconds between 0.1 and 60",
        ),
        (
            vec![
                "test",
                "ping",
                "127.0.0.1",
                "--key",
                bad_key.to_str().unwrap(),
            ],
            "at least 16 bytes",
        ),
        (
            vec!["server", "--key", bad_key.to_str().unwrap()],
            "at least 16 bytes",
        ),
        (vec!["server", "--allow", "10.0.0.0/33"], "--allow"),
        (vec!["server", "--max-rate=-3"], "--max-rate"),
    ];
    for (args, says) in cases {
        let out = run(&[], &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(1) | Some(2)),
            "{args:?}: exit {:?}",
            out.status.code()
        );
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
            "{args:?}: {err}"
        );
        // One line for errors of ours; clap's usage errors add their usage block.
        if out.status.code() == Some(1) {
            assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        }
    }
}

#[test]
fn hundreds_of_trickling_connections_cost_little_and_end_at_their_deadline() {
    let _g = serial();
    // 400 half-hellos fill the server's 400 slots: crowded, so they are cut at the hello
    // deadline until fewer than half the slots are held; those left keep the lossy uplink's
    // allowance (15 s), as slow TLS handshakes do.
    let srv = ServerProc::start(
        &[],
        "127.0.0.1:0",
        &[
            "-q",
            "--max-connections",
            "400",
            "--max-connections-per-ip",
            "400",
        ],
    );
    let before = srv.rss_kb();
    let mut conns: Vec<TcpStream> = (0..400)
        .map(|_| TcpStream::connect(&srv.addr).unwrap())
        .collect();
    for c in conns.iter_mut() {
        c.write_all(b"{").unwrap();
    }
    wait_ms(1000);
    let held = srv.rss_kb();
    wait_ms(5500);
    let open_at_6s = conns.iter().filter(|c| still_open(c)).count();
    wait_ms(10_000);
    let open_at_16s = conns.iter().filter(|c| still_open(c)).count();
    eprintln!(
        "400 trickling connections: server RSS {before} kB -> {held} kB while held; \
        {open_at_6s} open at 6.5 s, {open_at_16s} at 16.5 s"
    );
    assert!(
        open_at_6s < 200,
        "cut at the hello deadline while half the slots are held: {open_at_6s} open"
    );
    assert_eq!(
        open_at_16s, 0,
        "every half-hello was cut off by the lossy allowance"
    );
    assert!(
        held < before + 16 * 1024,
        "RSS {before} -> {held} kB for 400 idle connections"
    );
}
