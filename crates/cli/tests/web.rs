//! The server's HTTP face against curl, a real HTTP/2-over-TLS and HTTP/1.1 client: the
//! responsiveness endpoints as the draft and deployed clients want them, and the limits that
//! keep an 8 GB endpoint on the public Internet from being anyone's free bandwidth.

use crate::common::kernel_ref::TempDir;
use crate::common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `bloatlab server` with its HTTP face on loopback and a self-signed certificate.
struct Web {
    child: Child,
    https: String,
    http: String,
    /// The browser test's probe port, when started with --ws.
    ws: Option<u16>,
    fingerprint: String,
    dir: TempDir,
}

impl Drop for Web {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(tag: &str, extra: &[&str]) -> Option<Web> {
    for tool in ["curl", "openssl"] {
        if Command::new(tool).arg("--version").output().is_err()
            && Command::new(tool).arg("version").output().is_err()
        {
            missing(&format!("the web face is tested with {tool}"));
            return None;
        }
    }
    let dir = TempDir::new(tag);
    let tls_dir = dir.0.join("tls");
    let mut args = vec![
        "server",
        "--listen",
        "127.0.0.1:0",
        "--https",
        "127.0.0.1:0",
        "--http",
        "127.0.0.1:0",
        "--self-signed",
        "--name",
        "localhost",
        "--name",
        "127.0.0.1",
        "--tls-dir",
        tls_dir.to_str().unwrap(),
        "-q",
    ];
    args.extend_from_slice(extra);
    let mut child = Command::new(BIN)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut https, mut http, mut fingerprint) = (String::new(), String::new(), String::new());
    let (want_ws, mut ws) = (extra.contains(&"--ws"), None);
    for line in lines.by_ref() {
        let line = line.unwrap();
        let after = |p: &str| {
            line.split(p)
                .nth(1)
                .map(|s| s.split('/').next().unwrap().to_string())
        };
        if let Some(a) = after("endpoints on https://") {
            https = a;
        } else if let Some(a) = after("endpoints on http://") {
            http = a;
        } else if let Some(f) = line.split("certificate SHA-256 ").nth(1) {
            fingerprint = f.to_string();
        } else if let Some(p) = line.split("latency probes on port ").nth(1) {
            ws = p
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|d| d.parse().ok());
        }
        if !https.is_empty() && !http.is_empty() && (ws.is_some() || !want_ws) {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    assert!(
        !https.is_empty() && !fingerprint.is_empty(),
        "the server did not say where it listens"
    );
    Some(Web {
        child,
        https,
        http,
        ws,
        fingerprint,
        dir,
    })
}

fn curl(args: &[&str]) -> Output {
    Command::new("curl")
        .args(["-s", "--max-time", "20"])
        .args(args)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Days between two dates as openssl prints them ("Nov 23 00:00:00 2026 GMT"), by date(1).
fn epoch_days(date: &str) -> i64 {
    let o = Command::new("date")
        .args(["-u", "-d", date, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse::<i64>()
        .unwrap()
        / 86_400
}

#[test]
fn responsiveness_endpoints_over_http2_tls_and_plain_http() {
    let _g = serial();
    let Some(w) = start("endpoints", &[]) else {
        return;
    };
    let base = format!("https://{}", w.https);
    // The config over HTTP/2 (ALPN h2), with both generations of URL keys on the asked host.
    let o = curl(&[
        "-k",
        "--http2",
        "-w",
        "\n%{http_version}",
        &format!("{base}/.well-known/nq"),
    ]);
    let out = text(&o);
    let (json, version) = out.rsplit_once('\n').unwrap();
    assert_eq!(version, "2", "HTTP/2 negotiated by ALPN");
    let c: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(c["version"], 1);
    for (k, p) in [
        ("small_download_url", "small"),
        ("small_https_download_url", "small"),
        ("large_download_url", "large"),
        ("large_https_download_url", "large"),
        ("upload_url", "slurp"),
        ("https_upload_url", "slurp"),
    ] {
        assert_eq!(c["urls"][k], format!("{base}/{p}"), "{k}");
    }
    // /small: exactly one byte, never cached.
    let o = curl(&[
        "-k",
        "--http2",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download}",
        &format!("{base}/small"),
    ]);
    let out = text(&o);
    assert!(
        out.to_ascii_lowercase().contains("cache-control: no-store"),
        "{out}"
    );
    assert!(out.ends_with("\n1") || out.ends_with("\r\n1"), "{out}");
    // /large streams until the client stops, uncompressed even when compression is offered.
    let o = curl(&[
        "-k",
        "--http2",
        "--compressed",
        "--max-time",
        "2",
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download}",
        &format!("{base}/large"),
    ]);
    let out = text(&o);
    let got: f64 = out.lines().last().unwrap().parse().unwrap();
    assert!(got > 20e6, "/large gave {got} bytes in 2 s on loopback");
    assert!(
        !out.to_ascii_lowercase().contains("content-encoding"),
        "{out}"
    );
    assert!(
        out.to_ascii_lowercase()
            .contains("content-length: 8589934592"),
        "{out}"
    );
    // /slurp reads a 20 MB upload whole.
    let upload = w.dir.0.join("upload.bin");
    std::fs::write(&upload, vec![7u8; 20_000_000]).unwrap();
    let o = curl(&[
        "-k",
        "--http2",
        "--data-binary",
        &format!("@{}", upload.display()),
        "-w",
        "%{http_code}",
        &format!("{base}/slurp"),
    ]);
    assert_eq!(text(&o), "20000000\n200");
    // Plain HTTP/1.1: http URLs; a hostile Host header never reaches the config.
    let o = curl(&[
        "-H",
        "Host: evil.example/\"><script>",
        &format!("http://{}/config", w.http),
    ]);
    let c: serde_json::Value = serde_json::from_str(&text(&o)).unwrap();
    assert_eq!(c["urls"]["upload_url"], format!("http://{}/slurp", w.http));
    // The certificate: the fingerprint printed is the file's, valid 825 days at most.
    let cert = w.dir.0.join("tls/cert.pem");
    let o = Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-fingerprint",
            "-sha256",
            "-startdate",
            "-enddate",
            "-in",
        ])
        .arg(&cert)
        .output()
        .unwrap();
    let out = text(&o);
    assert!(out.contains(&w.fingerprint), "{out} vs {}", w.fingerprint);
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    let days = epoch_days(&field("notAfter=")) - epoch_days(&field("notBefore="));
    assert!(days > 800 && days <= 825, "valid {days} days");
    assert!(text(
        &Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(&cert)
            .output()
            .unwrap()
    )
    .contains("id-ecPublicKey"));
}

/// Reads until the server closes the connection; how long that took.
fn closed_within(mut s: TcpStream, limit: Duration) -> Duration {
    let t = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return t.elapsed(),
            Ok(_) => {}
        }
    }
}

#[test]
fn slow_clients_full_slots_and_greedy_addresses_are_bounded() {
    let _g = serial();
    let Some(w) = start(
        "limits",
        &["--max-connections-per-ip", "2", "--web-max-gb", "0.05"],
    ) else {
        return;
    };
    // TLS handshakes that never come hold this address's two slots until the 5 s deadline: both
    // slots held is crowded (a lone slow handshake would have 15 s, web::idle).
    let mute = [
        TcpStream::connect(&w.https).unwrap(),
        TcpStream::connect(&w.https).unwrap(),
    ];
    std::thread::sleep(Duration::from_millis(300));
    // A third connection from the same address is told why and when to come back.
    let o = curl(&["-D", "-", &format!("http://{}/small", w.http)]);
    let out = text(&o).to_ascii_lowercase();
    assert!(out.starts_with("http/1.1 429"), "{out}");
    assert!(
        out.contains("retry-after: 60") && out.contains("per address"),
        "{out}"
    );
    for m in mute {
        let t = closed_within(m, Duration::from_secs(10));
        assert!(
            t < Duration::from_secs(7),
            "a mute TLS client held on for {t:?}"
        );
    }
    // Slowloris on plain HTTP, half a request line, beside a mute TLS client: the address holds
    // its cap, so the connection that has sent no whole request goes after 1 s and four round
    // trips (web::idle), not at the 5 s deadline.
    let mut slow = TcpStream::connect(&w.http).unwrap();
    slow.write_all(b"GET /small HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let _mute = TcpStream::connect(&w.https).unwrap();
    let t = closed_within(slow, Duration::from_secs(10));
    assert!(
        t < Duration::from_secs(3),
        "a slow client held a crowded address's slot for {t:?}"
    );
    // With the slots free again: 50 MB per address, then 429 until the window ends.
    let base = format!("https://{}", w.https);
    let o = curl(&[
        "-k",
        "--http2",
        "-o",
        "/dev/null",
        "-w",
        "%{size_download}",
        &format!("{base}/large"),
    ]);
    let got: f64 = text(&o).parse().unwrap();
    // At most the budget and the MiB charged ahead; a little less may arrive, as the reset that
    // ends the stream discards frames still buffered (measured 49.5-50.1 MB).
    assert!(
        (45e6..50e6 + 1_048_577.0).contains(&got),
        "one address took {got} bytes of a 50 MB budget"
    );
    let o = curl(&[
        "-k",
        "--http2",
        "-D",
        "-",
        "-o",
        "/dev/null",
        &format!("{base}/large"),
    ]);
    let out = text(&o).to_ascii_lowercase();
    assert!(
        out.starts_with("http/2 429") && out.contains("retry-after: "),
        "{out}"
    );
    // The uploads count against the same budget.
    let o = curl(&[
        "-k",
        "--http2",
        "--data-binary",
        "x",
        "-w",
        "%{http_code}",
        &format!("{base}/slurp"),
    ]);
    assert!(text(&o).ends_with("429"), "{}", text(&o));
}

/// goresponsiveness opens connections it never sends a request on (60 at once, each left
/// open): a full address's idle connections give their slots back, so its next one is served.
#[test]
fn connections_that_send_no_request_give_their_slots_back_to_their_address() {
    let _g = serial();
    let Some(w) = start("idle", &[]) else { return };
    // The default cap per address: 64.
    let idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(&w.http).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let o = curl(&[
        "-s",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://{}/small", w.http),
    ]);
    assert_eq!(
        text(&o),
        "200",
        "the address's 65th connection, its 64 idle ones crowding it"
    );
    // The server closed idle ones (in 1 s and four round trips: web::idle) until the address
    // held under half its cap; the others keep the handshake's 5 s.
    let closed = idle
        .into_iter()
        .filter(|s| {
            closed_within(s.try_clone().unwrap(), Duration::from_millis(20))
                < Duration::from_millis(20)
        })
        .count();
    assert!(
        (32..=40).contains(&closed),
        "{closed} of 64 idle connections closed; half of the cap should go"
    );
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A server that refuses part of the load (here its 50 MB budget per address runs out within a
/// second on loopback: `/large` ends early, then 429) must not yield a quiet "excellent": the
/// failed load connections are counted in the summary, said in the text and noted each.
#[test]
fn rpm_with_refused_load_connections_says_so() {
    let _g = serial();
    let Some(w) = start("refused", &["--web-max-gb", "0.05"]) else {
        return;
    };
    let url = format!("https://{}/.well-known/nq", w.https);
    let out = tmp_path("rpm-refused.json");
    let o = Command::new(BIN)
        .args([
            "test",
            "rpm",
            url.as_str(),
            "-k",
            "-l",
            "3",
            "--idle",
            "1",
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (stdout, stderr) = (text(&o), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(
        stdout.contains("WARNING: ") && stdout.contains("load connections failed"),
        "{stdout}"
    );
    assert!(
        stderr.contains("failed: ") && stderr.contains("429"),
        "{stderr}"
    );
    let r: serde_json::Value = serde_json::from_reader(std::fs::File::open(&out).unwrap()).unwrap();
    assert!(
        r["summary"]["rpm"]["failed_connections"].as_u64().unwrap() >= 1,
        "{}",
        r["summary"]["rpm"]
    );
}

/// One HTTP/2 frame (RFC 9113 section 4.1): length, type, flags, stream.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Reads one HTTP/2 frame: its type, stream and payload.
fn h2_read(s: &mut TcpStream) -> std::io::Result<(u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    s.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload)?;
    Ok((
        head[3],
        u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
        payload,
    ))
}

/// An HTTP/2 connection by prior knowledge on the plain port (RFC 9113 section 3.3): the
/// preface and SETTINGS sent, the server's SETTINGS read and acknowledged before any stream
/// opens. Returns the connection and the server's settings.
fn h2_connect(addr: &str, read_timeout: Duration) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(read_timeout)).unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.write_all(&h2_frame(4, 0, 0, &[])).unwrap();
    let (kind, _, settings) = h2_read(&mut s).unwrap();
    assert_eq!(kind, 4, "the server's first frame is SETTINGS");
    s.write_all(&h2_frame(4, 1, 0, &[])).unwrap();
    (s, settings)
}

/// A GET's header block. HPACK (RFC 7541): :method GET and :scheme http from the static
/// table, :path and :authority as literals with indexed names.
fn h2_get(path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend(path.as_bytes());
    block.extend([0x01, 1, b'x']);
    block
}

/// The stream cap is enforced on what a client does, not on what it promised: a client that
/// opens more concurrent streams than the server's SETTINGS allow (100) gets the extra ones
/// refused (RST_STREAM, REFUSED_STREAM: RFC 9113 section 5.1.2) while the first 100 are
/// answered. Raw frames over the plain port (prior knowledge), as no well-behaved client
/// exceeds the setting. The client never opens its flow-control window past 64 KB, so every
/// `/large` stays open.
#[test]
fn streams_beyond_the_http2_cap_are_refused() {
    let _g = serial();
    let Some(w) = start("streams", &[]) else {
        return;
    };
    let (mut s, settings) = h2_connect(&w.http, Duration::from_secs(10));
    let cap = settings
        .chunks(6)
        .find(|p| p[..2] == [0, 3])
        .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
    assert_eq!(cap, Some(100), "SETTINGS_MAX_CONCURRENT_STREAMS");
    let block = h2_get("/large");
    let streams: Vec<u32> = (0..101).map(|i| 1 + 2 * i).collect();
    let mut all = Vec::new();
    for id in &streams {
        // END_STREAM | END_HEADERS: a complete GET.
        all.extend(h2_frame(1, 0x5, *id, &block));
    }
    s.write_all(&all).unwrap();
    let (mut answered, mut refused) = (std::collections::BTreeSet::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(10);
    while (answered.len() < 100 || refused.is_empty()) && Instant::now() < deadline {
        match h2_read(&mut s).unwrap() {
            (1, id, _) => {
                answered.insert(id);
            }
            (3, id, code) => refused.push((id, u32::from_be_bytes(code[..4].try_into().unwrap()))),
            (7, _, away) => panic!("GOAWAY {:?} after {} answers", &away[4..8], answered.len()),
            _ => {}
        }
    }
    assert_eq!(
        refused,
        [(201, 7)],
        "the 101st stream refused (REFUSED_STREAM = 7), no other reset"
    );
    assert_eq!(answered.len(), 100, "the first 100 answered");
    assert!(!answered.contains(&201));
}

/// An idle HTTP/2 connection is closed gracefully (GOAWAY, then a PING whose acknowledgement
/// tells the server the client saw it: RFC 9113 section 6.8), but a client that never
/// acknowledges must not keep its slot until the connection's deadline (120 s): the goodbye
/// has the idle period (2 s, web::idle) too.
#[test]
fn an_idle_http2_client_that_ignores_the_goodbye_is_closed() {
    let _g = serial();
    let Some(w) = start("goodbye", &[]) else {
        return;
    };
    let (mut s, _) = h2_connect(&w.http, Duration::from_secs(15));
    s.write_all(&h2_frame(1, 0x5, 1, &h2_get("/small")))
        .unwrap();
    let answered = Instant::now();
    // Every frame the server sends, until it closes; none is answered.
    let mut kinds = Vec::new();
    while let Ok((kind, _, _)) = h2_read(&mut s) {
        kinds.push(kind);
    }
    let t = answered.elapsed();
    assert!(
        kinds.contains(&0) && kinds.contains(&7),
        "the answer's DATA and a GOAWAY: frames {kinds:?}"
    );
    assert!(
        t < Duration::from_secs(6),
        "a client that ignored the goodbye kept its connection {t:?} (idle 2 s, goodbye 2 s)"
    );
    assert!(
        t >= Duration::from_millis(1900),
        "closed {t:?} after its answer: an idle connection has 2 s"
    );
}

/// One address opens /large 200 times at once, over 200 HTTP/1.1 connections: it gets its 64
/// connections (the per-address cap it shares with the bloatlab protocol), a few more are told
/// 429 (8 refusals at once per address), the rest are closed at once; none hangs, and the
/// server's memory stays flat. Then SIGHUP puts a renewed certificate in service
/// without a restart.
#[test]
fn two_hundred_large_downloads_from_one_address_and_a_certificate_reload() {
    let _g = serial();
    let Some(w) = start("flood", &[]) else { return };
    let before = rss_kb(w.child.id());
    let url = format!("http://{}/large", w.http);
    let mut args = vec![
        "--http1.1",
        "--parallel",
        "--parallel-immediate",
        "--parallel-max",
        "200",
        "--max-time",
        "3",
        "-w",
        "%{http_code} %{exitcode}\n",
    ];
    for _ in 0..200 {
        args.extend(["-o", "/dev/null", url.as_str()]);
    }
    let o = curl(&args);
    let codes = text(&o);
    let count = |code: &str| codes.lines().filter(|l| l.starts_with(code)).count();
    let (ok, busy) = (count("200 "), count("429 "));
    // Served ones run into curl's 3 s limit (exit 28): they were streaming. Anything else that
    // timed out waited for an answer it never got.
    let hung = codes
        .lines()
        .filter(|l| !l.starts_with("200 ") && l.ends_with(" 28"))
        .count();
    assert!((32..=64).contains(&ok), "{ok} downloads served: {codes}");
    assert!(
        busy >= 1 && hung == 0,
        "{busy} told 429, {hung} hung: {codes}"
    );
    assert_eq!(codes.lines().count(), 200);
    let after = rss_kb(w.child.id());
    assert!(after < before + 64 * 1024, "RSS {before} kB -> {after} kB");
    // A renewed certificate (other names, so a new one) is served after SIGHUP.
    let tls_dir = w.dir.0.join("tls");
    bloatlab_server::web::tls::self_signed(
        &tls_dir,
        &["renewed.example".to_string()],
        std::time::SystemTime::now(),
    )
    .unwrap();
    let served = || {
        let mut c = Command::new("openssl")
            .args(["s_client", "-connect", &w.https])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut pem = String::new();
        c.stdout.take().unwrap().read_to_string(&mut pem).unwrap();
        let _ = c.wait();
        let mut x = Command::new("openssl")
            .args(["x509", "-noout", "-fingerprint", "-sha256"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        x.stdin.take().unwrap().write_all(pem.as_bytes()).unwrap();
        String::from_utf8_lossy(&x.wait_with_output().unwrap().stdout)
            .trim()
            .split('=')
            .nth(1)
            .unwrap_or("")
            .to_string()
    };
    assert_eq!(
        served(),
        w.fingerprint,
        "before the reload, the first certificate"
    );
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(w.child.id() as i32, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(300));
    let renewed = served();
    assert!(
        !renewed.is_empty() && renewed != w.fingerprint,
        "after SIGHUP the server still serves {renewed}"
    );
}

/// `bloatlab test rpm URL` against the server's own HTTPS face on loopback: the draft's test
/// over HTTP/2, with TCP, TLS and HTTP times of the foreign probes kept apart; the summary is
/// the rpm summary every client of bloatlab reads, the result file names the transport. A
/// self-signed certificate is refused unless trusted (`--ca`) or waved through (`-k`).
#[test]
fn rpm_over_http2_against_the_https_face() {
    let _g = serial();
    // Three loopback runs move some 30 GB from one address: past the default 20 GB budget.
    let Some(w) = start("rpm", &["--web-max-gb", "1000"]) else {
        return;
    };
    let url = format!("https://{}/.well-known/nq", w.https);
    let out = tmp_path("rpm-http.json");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "test",
            "rpm",
            url.as_str(),
            "-l",
            "6",
            "--idle",
            "1",
            "--json",
            "-q",
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Command::new(BIN).args(&args).output().unwrap()
    };
    let refused = run(&[]);
    assert!(
        !refused.status.success(),
        "a self-signed certificate was trusted without being asked to"
    );
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .to_lowercase()
            .contains("certificate"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let cert = w.dir.0.join("tls/cert.pem");
    for extra in [vec!["--ca", cert.to_str().unwrap()], vec!["-k"]] {
        let o = run(&extra);
        assert!(
            o.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let s = json(&o);
        let (rpm, down, up) = (
            f(&s, "rpm.rpm"),
            f(&s, "throughput_mbps.down"),
            f(&s, "throughput_mbps.up"),
        );
        eprintln!(
            "{extra:?}: RPM {rpm:.0} ({}), {down:.0}/{up:.0} Mbit/s, {} connections",
            s["rpm"]["confidence"], s["rpm"]["load_connections"]
        );
        // Loopback: hundreds of Mbit/s at least each way, and an answer in round trips.
        assert!(down > 200.0 && up > 200.0, "{down} / {up} Mbit/s");
        assert!(
            rpm > 100.0 && s["rpm"]["probes"].as_u64().unwrap() > 20,
            "{}",
            s["rpm"]
        );
        // The same figures under the names networkQuality -c prints, for scripts written for it.
        assert_eq!(s["responsiveness"].as_f64(), Some(rpm.round()), "{s}");
        assert_eq!(s["dl_throughput"].as_f64(), Some((down * 1e6).round()));
        assert_eq!(s["ul_throughput"].as_f64(), Some((up * 1e6).round()));
        // The idle probes' time, recovered from the idle RPM (to rounding).
        let base = f(&s, "base_rtt");
        assert!(
            (base - 60_000.0 / f(&s, "rpm.idle")).abs() < 1e-9 * base,
            "base_rtt {base}"
        );
        let r: serde_json::Value =
            serde_json::from_reader(std::fs::File::open(&out).unwrap()).unwrap();
        assert_eq!(r["metadata"]["params"]["transport"], "HTTP/2 over TLS");
        let tls = r["series"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "rpm foreign-tls")
            .expect("TLS handshake times");
        assert!(
            tls["samples"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|x| x[1].as_f64().is_some())
                .count()
                > 20
        );
    }
    // Forced HTTP/1.1 (ALPN http/1.1): the same loads and foreign probes, no self probes (a load
    // connection carries its one request), so the RPM is the foreign term.
    let o = run(&["-k", "--http1.1"]);
    assert!(
        o.status.success(),
        "--http1.1: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s = json(&o);
    eprintln!("--http1.1: {}", s["rpm"]);
    assert!(
        s["rpm"]["loaded"].is_null()
            && f(&s, "rpm.rpm") == f(&s, "rpm.foreign")
            && f(&s, "rpm.rpm") > 100.0,
        "{}",
        s["rpm"]
    );
    assert!(
        f(&s, "throughput_mbps.down") > 200.0
            && f(&s, "throughput_mbps.up") > 200.0
            && s["rpm"]["probes"].as_u64().unwrap() > 20,
        "{s}"
    );
    let r: serde_json::Value = serde_json::from_reader(std::fs::File::open(&out).unwrap()).unwrap();
    assert_eq!(r["metadata"]["params"]["transport"], "HTTP/1.1 over TLS");
    assert!(r["series"]
        .as_array()
        .unwrap()
        .iter()
        .all(|x| x["name"] != "rpm loaded"));
    let misuse = Command::new(BIN)
        .args(["test", "tcp-down", "127.0.0.1", "--http1.1"])
        .output()
        .unwrap();
    assert!(
        !misuse.status.success()
            && String::from_utf8_lossy(&misuse.stderr).contains("--http1.1 is for"),
        "{misuse:?}"
    );
}

/// Through the lab's 20 Mbit/s line, HTTP/2 and bloatlab's protocol, one engine with two
/// transports, give the same order of RPM through a 30-packet FIFO (182 vs 181 in one run, 280
/// vs 145 in another before probes still in flight at the end were waited for; 77 vs 131, 99
/// vs 177 and, in a CI run, 74 vs 239 after: 48 load connections through 30 packets lose
/// segments and SYNs, and those waits, a second each for a lost SYN, are most of the probes'
/// time, so the two runs differ by which probes were unlucky; the protocol transport also still
/// leaves out probes cut off at the end), and the download direction alone (`--sequential`) sees a
/// 1000-packet FIFO (1000 x 1514 x 8 / 20e6 = 0.6 s) as far worse than 30 packets (18 ms). Both
/// ways at once, 1000 packets gave 55-77 against 77-99: the losses' waits hide the queue there.
/// Through 30 packets neither end's sockets nor buffers add a queue of their own, over either
/// transport.
#[test]
fn rpm_over_http2_agrees_with_the_protocol_sees_a_deep_fifo_and_neither_end_queues() {
    let _g = serial();
    let Some(lab) = LabUp::up(
        "rpmh",
        "name = \"rpmh\"\n[[link]]\nname = \"line\"\na = \"c\"\nb = \
        \"s\"\nboth = { rate = \"20mbit\", limit = 1000 }\n",
    ) else {
        return;
    };
    let dir = TempDir::new("rpmh");
    let mut srv = ServerProc::start(
        &lab.exec("s").iter().map(String::as_str).collect::<Vec<_>>(),
        "[::]:9461",
        &["-q", "--http", "4080"],
    );
    let rpm = |limit: &str, target: &str, extra: &[&str]| {
        lab.set("line", &[&format!("limit={limit}")]);
        let out = dir
            .0
            .join(format!("rpm-{limit}-{}-{}.json", target.len(), extra.len()));
        let p = lab.exec("c");
        let mut cmd = Command::new(&p[0]);
        cmd.args(&p[1..])
            .arg(BIN)
            .args([
                "test",
                "rpm",
                target,
                "-l",
                "10",
                "--idle",
                "1",
                "--json",
                "-q",
                "-o",
                out.to_str().unwrap(),
            ])
            .args(extra);
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let s = json(&o);
        eprintln!(
            "limit {limit}, {target} {extra:?}: RPM {:.0} (loaded {:.0}, foreign {:.0}), dl {}, \
                {:.1}/{:.1} Mbit/s",
            f(&s, "rpm.rpm"),
            f(&s, "rpm.loaded"),
            f(&s, "rpm.foreign"),
            s["dl_responsiveness"],
            f(&s, "throughput_mbps.down"),
            f(&s, "throughput_mbps.up")
        );
        (s, bloatlab_result::read(&out).unwrap())
    };
    let url = "http://10.77.0.2:4080/.well-known/nq";
    let short = f(&rpm("30", url, &[]).0, "rpm.rpm");
    // Meanwhile, in two runs, each end's unsent bytes per load connection as the kernel counts
    // them.
    let ((proto, _), proto_unsent) = with_unsent(&lab, 9461, || rpm("30", "10.77.0.2", &[]));
    let short_proto = f(&proto, "rpm.rpm");
    assert!(
        short < 4.0 * short_proto && short_proto < 4.0 * short,
        "RPM over HTTP/2 {short}, over bloatlab's protocol {short_proto}"
    );
    let ((short_seq, short_file), http_unsent) =
        with_unsent(&lab, 4080, || rpm("30", url, &["--sequential"]));
    let (deep_seq, deep_file) = rpm("1000", url, &["--sequential"]);
    let (deep_dl, short_dl) = (
        f(&deep_seq, "dl_responsiveness"),
        f(&short_seq, "dl_responsiveness"),
    );
    // A full 0.6 s FIFO allows at most 60000 / 600 = 100 RPM, but the senders keep it
    // part-empty: 104-123 measured with BBR, 124 with cubic (the lab hosts' default since), once
    // neither end queued data of its own. Under 150, the probes waited at least 2/3 of it on
    // average.
    assert!(
        deep_dl < 150.0,
        "download RPM {deep_dl} through 1000 packets, {short_dl} through 30"
    );
    // Through 30 packets the RPM is mostly lost SYNs and segments (132-225 measured, so no
    // ratio of RPMs separates the two reliably); the median self probe waits for the queue only:
    // 290 ms through 1000 packets (BBR) or 315 (cubic) against 76 or 48 through 30.
    let p50 = |file: &bloatlab_result::ResultFile, name: &str| {
        let v = file
            .series(name)
            .unwrap()
            .samples
            .iter()
            .filter_map(|s| s.1);
        bloatlab_analyze::stats::percentiles(v).unwrap().p50
    };
    let (deep_own, short_own) = (
        p50(&deep_file, "rpm loaded"),
        p50(&short_file, "rpm loaded"),
    );
    eprintln!("self probes p50: {deep_own:.0} ms through 1000 packets, {short_own:.0} through 30");
    assert!(
        deep_own > 2.0 * short_own,
        "self probes p50 {deep_own} ms through 1000 packets, {short_own} through 30"
    );
    // Neither end adds a queue of its own (the draft's TCP_NOTSENT_LOWAT, netio::sendbuf). Each
    // socket holds at most half its limit plus one write: the limit 5 ms of the connection's
    // rate (12.5 kB with the whole 20 Mbit/s), a write at most 16 KiB (the protocol's frames;
    // HTTP's chunks are 5 ms of the rate, 4 KiB at least): 22.6 kB. Writing on past the kernel's
    // check into its last buffer, both ends' sockets held 30-65 kB over either transport (p90
    // 59 kB), now 6.7-14.1 kB.
    for (run, ends) in [("protocol", &proto_unsent), ("HTTP/2", &http_unsent)] {
        for (end, unsent) in ["server", "client"].iter().zip(ends) {
            let p = bloatlab_analyze::stats::percentiles(unsent.iter().map(|&b| b as f64))
                .unwrap_or_else(|| panic!("{run}: no unsent bytes seen at the {end}"));
            eprintln!(
                "{run}, {end}'s load connections: unsent p50 {:.0} B, p90 {:.0} B ({} samples)",
                p.p50, p.p90, p.samples
            );
            assert!(
                p.p90 < 22_634.0,
                "{run}: the {end}'s sockets hold {:.0} B unsent at p90",
                p.p90
            );
        }
    }
    // And HTTP/2 above them holds a chunk of as much (hyper's default buffers, 400 + 64 KiB per
    // stream, 2.5 s at a connection's 1.5 Mbit/s share, gave self probes 520-550 ms against
    // foreign requests' 120-140): a self probe's answer waits behind little more than a foreign
    // probe's, which waits behind nothing of the server's; both wait for the same FIFO, and a
    // self probe also for its connection's lost segments (47-50 ms against 77-88 in three runs).
    let (own, foreign) = (short_own, p50(&short_file, "rpm foreign-request"));
    eprintln!(
        "through 30 packets: self probes p50 {own:.0} ms, foreign requests p50 {foreign:.0} ms"
    );
    assert!(
        own < 2.5 * foreign + 20.0,
        "self probes p50 {own} ms, foreign requests {foreign} ms: \
        an end queues on its load connections"
    );
    srv.kill();
}

/// `run`'s result, and meanwhile, every 200 ms, the unsent bytes (`ss`'s notsent) of each
/// connection to or from `port` that holds any, in host s's namespace and in host c's.
fn with_unsent<R>(lab: &LabUp, port: u16, run: impl FnOnce() -> R) -> (R, [Vec<u64>; 2]) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (server, client) = (
            sc.spawn(|| unsent_samples(lab, "s", port, &stop)),
            sc.spawn(|| unsent_samples(lab, "c", port, &stop)),
        );
        let r = run();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (r, [server.join().unwrap(), client.join().unwrap()])
    })
}

fn unsent_samples(
    lab: &LabUp,
    host: &str,
    port: u16,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<u64> {
    let p = lab.exec(host);
    let filter = format!("( sport = :{port} or dport = :{port} )");
    let mut seen = vec![];
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let o = Command::new(&p[0])
            .args(&p[1..])
            .args(["ss", "-tniH", "state", "established", &filter])
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "ss in {host}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        seen.extend(
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|w| w.strip_prefix("notsent:"))
                .map(|n| n.parse::<u64>().unwrap()),
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    seen
}

/// `--sequential` (as `networkQuality -s` and mach): the download direction, then the upload
/// direction, each on its own connections, each with its own RPM. Through a short download FIFO
/// (30 x 1514 x 8 / 20e6 = 18 ms) and a deep upload one (600 x 1514 x 8 / 5e6 = 1.45 s), the
/// upload's RPM is far below the download's and is the test's; while each stage runs the other
/// direction carries no load.
#[test]
fn rpm_sequential_measures_each_direction_under_its_own_load() {
    let _g = serial();
    let topo = "name = \"rpms\"\n[[link]]\nname = \"line\"\na = \"c\"\nb = \"s\"\nup = { rate = \
        \"5mbit\", limit = 600 }\ndown = { rate = \"20mbit\", limit = 30 }\n";
    let Some(lab) = LabUp::up("rpms", topo) else {
        return;
    };
    let dir = TempDir::new("rpms");
    let mut srv = ServerProc::start(
        &lab.exec("s").iter().map(String::as_str).collect::<Vec<_>>(),
        "[::]:9461",
        &["-q", "--http", "4080"],
    );
    let out = dir.0.join("rpm-seq.json");
    let p = lab.exec("c");
    let o = Command::new(&p[0])
        .args(&p[1..])
        .arg(BIN)
        .args([
            "test",
            "rpm",
            "http://10.77.0.2:4080/.well-known/nq",
            "--sequential",
            "-l",
            "8",
            "--idle",
            "1",
            "--json",
            "-q",
            "-o",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    srv.kill();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = json(&o);
    let (dl, ul) = (f(&s, "dl_responsiveness"), f(&s, "ul_responsiveness"));
    eprintln!(
        "sequential: dl {dl} RPM, ul {ul} RPM, responsiveness {}, {:.1}/{:.1} Mbit/s",
        s["responsiveness"],
        f(&s, "throughput_mbps.down"),
        f(&s, "throughput_mbps.up")
    );
    // A round trip behind a full 1.45 s upload FIFO is under 60000 / 1450 = 41 RPM; it fills
    // within the stage, not at once (300 packets gave 90 RPM in one run). The download's 18 ms
    // FIFO would leave thousands, but 16 connections through 30 packets lose SYNs and segments
    // and the retransmissions' waits are in the probes (241 RPM in that run, 189 both ways).
    assert!(
        ul < 100.0 && dl > 2.0 * ul,
        "download {dl}, upload {ul} RPM"
    );
    assert_eq!(
        s["responsiveness"].as_f64(),
        Some(ul),
        "the worse direction is the test's"
    );
    assert_eq!(f(&s, "rpm_by_direction.up.rpm").round(), ul);
    assert!(
        f(&s, "throughput_mbps.down") > 20.0 * 0.7 && f(&s, "throughput_mbps.up") > 5.0 * 0.7,
        "{}",
        s["throughput_mbps"]
    );
    // The result file: phases in order, each stage's connections loading only its direction.
    let r = bloatlab_result::read(&out).unwrap();
    let phase = |n: &str| {
        r.metadata
            .phases
            .iter()
            .find(|p| p.name == n)
            .unwrap_or_else(|| panic!("phase {n}"))
            .clone()
    };
    let (down, up) = (phase("download"), phase("upload"));
    assert!(
        down.end <= up.start + 1e-9 && down.start >= 1.0,
        "{:?}",
        r.metadata.phases
    );
    for x in r
        .series
        .iter()
        .filter(|x| x.kind == bloatlab_result::SeriesKind::Throughput)
    {
        let w = if x.direction.as_deref() == Some("up") {
            &up
        } else {
            &down
        };
        assert!(
            x.samples
                .iter()
                .all(|(t, _)| *t >= w.start && *t <= w.end + 0.05),
            "{} sampled outside its stage {w:?}",
            x.name
        );
    }
    let runs = r
        .metadata
        .rpm_by_direction
        .expect("each direction's run of the algorithm");
    assert!(!runs.down.intervals.is_empty() && !runs.up.intervals.is_empty());
    assert!(
        runs.down.intervals.iter().all(|i| i.up_mbps.is_none())
            && runs.up.intervals.iter().all(|i| i.down_mbps.is_none())
    );
    // The draft's ramp, as recorded: one more connection each interval, up to 16.
    for run in [&runs.down, &runs.up] {
        let counts: Vec<Option<u32>> = run.intervals.iter().map(|i| i.load_connections).collect();
        let want: Vec<Option<u32>> = (1..=counts.len() as u32).map(|n| Some(n.min(16))).collect();
        assert_eq!(counts, want, "load connections per interval");
    }
}

/// A WebSocket client by hand (RFC 6455): the upgrade on `/ws` from `local` (another loopback
/// address is another client to the server's per-address limits).
fn ws_connect(local: &str, port: u16) -> std::io::Result<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    sock.bind(
        &format!("{local}:0")
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )?;
    sock.connect(
        &format!("127.0.0.1:{port}")
            .parse::<std::net::SocketAddr>()
            .unwrap()
            .into(),
    )?;
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: \
        Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: \
        13\r\n\r\n",
    )?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    Ok(s)
}

/// One probe: a masked text frame with the number, and the server's answer.
fn ws_probe(s: &mut TcpStream, seq: u32) -> serde_json::Value {
    let text = seq.to_string();
    // FIN + text; masked, with a zero mask (the payload goes as is).
    let mut frame = vec![0x81, 0x80 | text.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(text.as_bytes());
    s.write_all(&frame).unwrap();
    let mut head = [0u8; 2];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x81, "a text frame");
    let mut body = vec![0u8; usize::from(head[1] & 0x7f)];
    s.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// The browser test's hostile cases: 1000 idle WebSockets from one address, result uploads
/// oversized, malformed and with a script tag in them. Each is refused or bounded, a real client
/// is still served, memory stays flat, and what is stored holds nothing the page did not earn.
#[test]
fn the_browser_tests_probes_and_result_uploads_are_bounded() {
    let _g = serial();
    let dir = TempDir::new("web-results");
    let kept = dir.0.join("kept");
    let Some(w) = start(
        "browser",
        &[
            "--ws",
            "127.0.0.1:0",
            "--keep-web-results",
            kept.to_str().unwrap(),
        ],
    ) else {
        return;
    };
    let port = w.ws.expect("the server names its probe port");
    let before = rss_kb(w.child.id());
    // The page and its parts are served, with a policy that runs only the server's scripts.
    let o = curl(&["-D", "-", &format!("http://{}/", w.http)]);
    let page = text(&o);
    assert!(
        page.to_ascii_lowercase()
            .contains("content-security-policy: default-src 'self'")
            && page.contains("<script src=\"/page.js\">"),
        "{page}"
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&text(&curl(&[&format!("http://{}/web/config", w.http)]))).unwrap();
    assert_eq!(cfg["ws_port"], port);
    // 1000 idle WebSockets from 127.0.0.1: at most its 64 slots are held, each until the
    // handshake deadline (5 s) while the address holds half of them, and up to 15 s
    // (LOSSY_HANDSHAKE, as a slow TLS handshake on the HTTPS face) once it holds fewer; a client
    // from 127.0.0.2 is served meanwhile.
    let t = Instant::now();
    let idle: Vec<TcpStream> = (0..1000)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    let mut real = ws_connect("127.0.0.2", port).expect("a real client gets in");
    let answer = ws_probe(&mut real, 41);
    assert_eq!(answer["seq"], 41);
    assert!(
        answer["rtt_ms"].as_f64().is_some_and(|ms| ms < 1000.0),
        "{answer}"
    );
    std::thread::sleep(Duration::from_secs(7).saturating_sub(t.elapsed()));
    let open: Vec<TcpStream> = idle.into_iter().filter(still_open).collect();
    eprintln!(
        "idle WebSockets still open after {:?}: {}",
        t.elapsed(),
        open.len()
    );
    assert!(
        open.len() <= 32,
        "{} idle WebSockets still open after {:?}",
        open.len(),
        t.elapsed()
    );
    let late = open
        .into_iter()
        .map(|s| closed_within(s, Duration::from_secs(10)))
        .filter(|_| t.elapsed() > Duration::from_secs(16))
        .count();
    assert_eq!(
        late,
        0,
        "idle WebSockets still open after {:?}",
        t.elapsed()
    );
    // A probe that is not a number ends its connection.
    let mut s = ws_connect("127.0.0.2", port).unwrap();
    s.write_all(&[
        0x81, 0x88, 0, 0, 0, 0, b'<', b's', b'c', b'r', b'i', b'p', b't', b'>',
    ])
    .unwrap();
    assert!(closed_within(s, Duration::from_secs(3)) < Duration::from_secs(3));
    // Result uploads: too big (counted as it arrives), malformed, or with a script tag.
    let post = |body: &std::path::Path| {
        post_file(
            &format!("http://{}/web/result", w.http),
            body,
            "application/json",
        )
    };
    let big = dir.0.join("big.json");
    std::fs::write(&big, vec![b' '; 5 << 20]).unwrap();
    assert!(post(&big).ends_with("\n413"));
    let bad = dir.0.join("bad.json");
    std::fs::write(&bad, b"{\"version\":1,\"step\":").unwrap();
    assert!(post(&bad).ends_with("\n400"));
    let evil = dir.0.join("evil.json");
    std::fs::write(&evil, r#"{"version":1,"step":0.1,"probe_interval":0.05,"streams":4,"phases":[{"name":"idle","start":0,"end":2},{"name":"download","start":2,"end":4}],"rtt":[[0.5,20.0],[1.0,21.0],[3.0,90.0],[3.5,95.0]],"kernel_rtt":[],"down_rtt":[],"up_rtt":[],"down":[[2.5,10.0],[3.0,10.0],[3.5,10.0]],"up":[],"browser":"<script>alert(1)</script>"}"#).unwrap();
    let reply = post(&evil);
    let (json, code) = reply.rsplit_once('\n').unwrap();
    assert_eq!(code, "200", "{reply}");
    let r: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(r["metadata"]["client"]["software"], "scriptalert(1)/script");
    // Download phase p50 92.5 ms against idle 20.5: +72 ms, a C by the CLI's bands.
    assert_eq!(
        r["summary"]["grade_by_direction"]["down"], "C",
        "{}",
        r["summary"]
    );
    let stored: Vec<_> = std::fs::read_dir(&kept).unwrap().flatten().collect();
    assert_eq!(stored.len(), 1, "only the valid upload is kept");
    let file = bloatlab_result::read(&stored[0].path()).unwrap();
    assert!(!serde_json::to_string(&file).unwrap().contains('<'));
    // WebRTC offers: refused unless a data channel's, answered ICE-lite on the probe port's
    // number over UDP; sessions hold the address's slots until they idle out (5 s).
    assert_eq!(cfg["rtc"], true);
    // (status, answer) for the offer in file `f`.
    let offer_file = |f: &std::path::Path| {
        let reply = post_file(&format!("http://{}/rtc", w.http), f, "application/sdp");
        let (body, code) = reply.rsplit_once('\n').unwrap();
        (code.to_string(), body.to_string())
    };
    let offer = |body: &[u8]| {
        let f = dir.0.join("offer.sdp");
        std::fs::write(&f, body).unwrap();
        offer_file(&f)
    };
    let sdp = chromium_offer();
    let media = sdp.replace(
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        "m=video 9 UDP/TLS/RTP/SAVPF 96",
    );
    assert_eq!(offer(b"<script>").0, "400");
    assert_eq!(offer(media.as_bytes()).0, "400");
    assert_eq!(offer(&vec![b'a'; 20_000]).0, "413");
    let get = text(&curl(&[
        "-w",
        "\n%{http_code}",
        &format!("http://{}/rtc", w.http),
    ]));
    assert!(get.ends_with("\n405"), "{get}");
    let (code, answer) = offer(sdp.as_bytes());
    assert_eq!(code, "200", "{answer}");
    assert!(
        answer.contains("a=ice-lite") && answer.contains(&format!("127.0.0.1 {port} typ host")),
        "{answer}"
    );
    // Offers never followed up: the address's 64 slots fill, then 429, until they idle out.
    // Ten at a time: one after another, a busy CI host's curls took over the 5 s a session
    // lives for 70 offers, and the first sessions gave their slots back before the last came.
    let t = Instant::now();
    let many = dir.0.join("many.sdp");
    std::fs::write(&many, &sdp).unwrap();
    let codes: Vec<String> = std::thread::scope(|s| {
        let senders: Vec<_> = (0..10)
            .map(|_| s.spawn(|| (0..7).map(|_| offer_file(&many).0).collect::<Vec<_>>()))
            .collect();
        senders
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let took = t.elapsed();
    eprintln!("70 offers in {took:?}");
    assert!(took < Duration::from_secs(5), "70 offers took {took:?}");
    let ok = codes.iter().filter(|c| *c == "200").count();
    assert!(
        ok <= 63 && codes.iter().filter(|c| *c == "429").count() == 70 - ok,
        "{codes:?}"
    );
    std::thread::sleep(Duration::from_secs(7).saturating_sub(t.elapsed()));
    assert_eq!(
        offer(sdp.as_bytes()).0,
        "200",
        "sessions gave their slots back"
    );
    let after = rss_kb(w.child.id());
    assert!(after < before + 64 * 1024, "RSS {before} kB -> {after} kB");
}

/// curl's POST of a file's bytes: the answer's body, a newline and its status code.
fn post_file(url: &str, body: &std::path::Path, content_type: &str) -> String {
    text(&curl(&[
        "--data-binary",
        &format!("@{}", body.display()),
        "-H",
        &format!("Content-Type: {content_type}"),
        "-w",
        "\n%{http_code}",
        url,
    ]))
}

/// A data-channel offer as Chromium makes it (no candidates: the server is ICE-lite).
fn chromium_offer() -> String {
    include_str!("../../server/src/web/chromium-offer.sdp").to_string()
}

/// nginx as a third-party responsiveness server, as the issue sets it up: its own TLS and
/// HTTP/2, a static config, `/small` and an 8 GiB sparse `/large` from files, uploads proxied to
/// bloatlab's plain-HTTP `/slurp` (nginx resets an HTTP/2 upload it answers without reading).
/// bloatlab's RPM client runs against it as against any server of the draft.
#[test]
fn rpm_over_http2_against_nginx() {
    let _g = serial();
    if Command::new("nginx").arg("-v").output().is_err() {
        return missing("the RPM client is tested against nginx (apt install nginx)");
    }
    let Some(w) = start("nginx", &[]) else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let root = w.dir.0.join("www");
    std::fs::create_dir_all(root.join(".well-known")).unwrap();
    let config = text(&curl(&[&format!("http://{}/config", w.http)]))
        .replace(&w.http, &format!("127.0.0.1:{port}"))
        .replace("http://", "https://");
    std::fs::write(root.join(".well-known/nq"), config).unwrap();
    std::fs::write(root.join("small"), "x").unwrap();
    std::fs::File::create(root.join("large"))
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    // nginx's worker reads the files as its own user.
    for d in [&w.dir.0, &root, &root.join(".well-known")] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let tls = w.dir.0.join("tls");
    let conf = w.dir.0.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "worker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx.err;\nevents {{ \
                worker_connections 1024; }}\nhttp {{\n  access_log off;\n  sendfile on;\n  server \
                {{\n    listen 127.0.0.1:{port} ssl http2;\n    ssl_certificate {t}/cert.pem;\n    \
                ssl_certificate_key {t}/key.pem;\n    root {r};\n    add_header Cache-Control \
                no-store;\n    client_max_body_size 0;\n    location /slurp {{ proxy_pass \
                http://{h}/slurp; proxy_request_buffering off; proxy_http_version 1.1; }}\n  \
                }}\n}}\n",
            d = w.dir.0.display(),
            t = tls.display(),
            r = root.display(),
            h = w.http
        ),
    )
    .unwrap();
    struct Nginx(Child);
    impl Drop for Nginx {
        fn drop(&mut self) {
            // SAFETY: a signal to our own child, the master, which stops its worker.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            let _ = self.0.wait();
        }
    }
    let _nginx = Nginx(
        Command::new("nginx")
            .arg("-c")
            .arg(&conf)
            .args(["-g", "daemon off;"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let up = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    assert!(
        up,
        "nginx did not listen: {}",
        std::fs::read_to_string(w.dir.0.join("nginx.err")).unwrap_or_default()
    );
    let url = format!("https://127.0.0.1:{port}/.well-known/nq");
    let file = tmp_path("rpm-nginx.json");
    let o = Command::new(BIN)
        .args([
            "test",
            "rpm",
            &url,
            "-k",
            "-l",
            "6",
            "--idle",
            "1",
            "--json",
            "-q",
            "-o",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = json(&o);
    let r = bloatlab_result::read(&file).unwrap();
    for flow in r.metadata.flows.iter().filter(|f| f.error.is_some()) {
        eprintln!("{}: {}", flow.name, flow.error.as_deref().unwrap_or(""));
    }
    let (rpm, down, up) = (
        f(&s, "rpm.rpm"),
        f(&s, "throughput_mbps.down"),
        f(&s, "throughput_mbps.up"),
    );
    eprintln!(
        "nginx: RPM {rpm:.0} ({}), {down:.0}/{up:.0} Mbit/s, {} connections, {} probes",
        s["rpm"]["confidence"], s["rpm"]["load_connections"], s["rpm"]["probes"]
    );
    // Uploads through nginx crawl here (29-53 Mbit/s) because nginx's one worker is busy
    // encrypting the downloads, which loopback does not limit: curl's own upload through the
    // same nginx drops from 3.5 Gbit/s alone to 8.6 Mbit/s beside 4 curl downloads of /large,
    // and is back at 5.7 Gbit/s when those are held to 20 MB/s each. On a real bottleneck
    // nginx has the CPU to spare (BENCHMARKS.md, "RPM against nginx through a bottleneck").
    assert!(
        down > 100.0 && up > 5.0,
        "{down} / {up} Mbit/s from nginx on loopback"
    );
    assert!(
        rpm > 100.0 && s["rpm"]["probes"].as_u64().unwrap() > 20 && s["rpm"]["probe_timeouts"] == 0,
        "{}",
        s["rpm"]
    );
}
