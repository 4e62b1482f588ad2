//! A real OpenVPN (2.6, from the package index) between two lab hosts (#18 item 4): `compare`
//! gives the tunnel's efficiency and CPU against the raw path, the classic recipe's
//! `txqueuelen 15000` bloats when OpenVPN is the bottleneck, the settings `config openvpn`
//! generates keep the throughput without the queue, and `test mtu` finds the tunnel's MTU.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The line under the tunnel: fast enough that OpenVPN's shaper (below) is the bottleneck when
/// it is set, with a short FIFO of its own.
const LINE: &str = "name='ovpn'\n[[link]]\nname='line'\na='client'\nb='server'\nboth={rate='50mbit', limit=100, delay='5ms'}\n";
const SERVER_LINE: &str = "10.77.0.2";
/// OpenVPN's `--shaper` in bytes per second: a slow router's OpenVPN (the seed's Wi-Fi router
/// peaked at 60 Mbit/s). OpenVPN waits only when a packet's turn is over 1 ms away, so the
/// tunnel carries somewhat more than these 8 Mbit/s: about 10 Mbit/s of goodput here.
const SHAPER: &str = "1000000";

/// A self-signed P-256 certificate for one end and its SHA-256 fingerprint, which the other
/// end pins (OpenVPN 2.6's peer-fingerprint mode: no CA).
fn certificate(dir: &Path, host: &str) -> String {
    let (key, crt) = (
        dir.join(format!("{host}.key")),
        dir.join(format!("{host}.crt")),
    );
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
        ])
        .arg(format!("/CN={host}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256", "-in"])
        .arg(&crt)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .split_once('=')
        .expect("sha256 Fingerprint=AA:BB:...")
        .1
        .to_string()
}

/// Both ends of a tunnel, killed on drop (they are not in the lab's namespaces' process list:
/// the lab going down would leave them running).
struct Tunnel(Vec<Child>);

impl Drop for Tunnel {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Ends {
    dir: PathBuf,
    fingerprints: [String; 2],
}

impl Ends {
    fn new() -> Ends {
        let dir = tmp_path("openvpn");
        std::fs::create_dir_all(&dir).unwrap();
        let fingerprints = [certificate(&dir, "server"), certificate(&dir, "client")];
        Ends { dir, fingerprints }
    }

    /// Starts tunnel `n` (device tun`n`, UDP port 1194 + `n`, addresses 10.(8 + `n`).0.1 on the
    /// server and .2 on the client) on both lab hosts, with `options` before the ends' own, and
    /// waits until both say it is up. `realtime`: both OpenVPNs at real-time priority 6.
    fn start(&self, lab: &LabUp, n: u8, realtime: bool, options: &[&str]) -> Tunnel {
        let mut tunnel = Tunnel(Vec::new());
        let mut logs = Vec::new();
        let (server, client, port) = (
            tunnel_server(n),
            format!("10.{}.0.2", 8 + n),
            (1194 + u16::from(n)).to_string(),
        );
        for (i, host) in ["server", "client"].into_iter().enumerate() {
            let log = self.dir.join(format!("{host}{n}.log"));
            let _ = std::fs::remove_file(&log);
            let mut cmd: Vec<String> = lab.exec(host);
            if realtime {
                cmd.extend(["chrt", "-r", "6"].map(String::from));
            }
            cmd.push("openvpn".into());
            cmd.extend(options.iter().map(|s| s.to_string()));
            let d = |f: &str| {
                self.dir
                    .join(format!("{host}.{f}"))
                    .to_str()
                    .unwrap()
                    .to_string()
            };
            let dev = format!("tun{n}");
            cmd.extend(
                [
                    "--dev",
                    &dev,
                    "--proto",
                    "udp",
                    "--disable-dco",
                    "--verb",
                    "3",
                    "--cert",
                    &d("crt"),
                    "--key",
                    &d("key"),
                ]
                .map(String::from),
            );
            cmd.extend([
                "--peer-fingerprint".to_string(),
                self.fingerprints[1 - i].clone(),
                "--log".into(),
                log.to_str().unwrap().into(),
            ]);
            let role: [&str; 8] = match host {
                "server" => [
                    "--tls-server",
                    "--dh",
                    "none",
                    "--ifconfig",
                    &server,
                    &client,
                    "--lport",
                    &port,
                ],
                _ => [
                    "--tls-client",
                    "--ifconfig",
                    &client,
                    &server,
                    "--remote",
                    SERVER_LINE,
                    &port,
                    "--nobind",
                ],
            };
            cmd.extend(role.iter().map(|s| s.to_string()));
            // What OpenVPN says before its log is open (a bad option) goes to its stdout.
            let early = std::fs::File::create(log.with_extension("early")).unwrap();
            let cmd = Command::new(&cmd[0])
                .args(&cmd[1..])
                .stdin(Stdio::null())
                .stdout(early.try_clone().unwrap())
                .stderr(early)
                .spawn();
            tunnel.0.push(cmd.unwrap());
            logs.push(log);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for (i, log) in logs.iter().enumerate() {
            loop {
                let text =
                    String::from_utf8_lossy(&std::fs::read(log).unwrap_or_default()).into_owned();
                if text.contains("Initialization Sequence Completed") {
                    break;
                }
                let exited = tunnel.0[i].try_wait().unwrap().is_some();
                if exited || Instant::now() > deadline {
                    let early =
                        std::fs::read_to_string(log.with_extension("early")).unwrap_or_default();
                    panic!(
                        "OpenVPN did not come up ({}):\n{early}{text}",
                        log.display()
                    );
                }
                wait_ms(100);
            }
        }
        tunnel
    }
}

/// The server's address inside tunnel `n`.
fn tunnel_server(n: u8) -> String {
    format!("10.{}.0.1", 8 + n)
}

fn compare(lab: &LabUp, targets: &[&str], test: &str, length: &str) -> serde_json::Value {
    let out_dir = tmp_path("compare");
    let mut args = vec!["compare"];
    args.extend_from_slice(targets);
    args.extend([
        "--test",
        test,
        "-l",
        length,
        "--json",
        "-q",
        "--out-dir",
        out_dir.to_str().unwrap(),
    ]);
    let p = lab.exec("client");
    let out = run(&p.iter().map(String::as_str).collect::<Vec<_>>(), &args);
    let _ = std::fs::remove_dir_all(&out_dir);
    assert!(
        out.status.success(),
        "compare: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

/// Both directions' goodput together (a one-way test has one).
fn goodput(s: &serde_json::Value) -> f64 {
    ["down", "up"]
        .iter()
        .filter_map(|d| s["throughput_mbps"][d].as_f64())
        .sum()
}

/// `bloatlab config KIND ARGS...` into a file in the test's directory.
fn config(args: &[&str], file: &Path) {
    let mut all = vec!["config"];
    all.extend_from_slice(args);
    let out = run(&[], &all);
    assert!(
        out.status.success(),
        "config {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(file, &out.stdout).unwrap();
}

/// The lab's line with its server, the two OpenVPN ends' certificates and the raw path's MTU
/// (`test mtu`); None where the test cannot run (it says why).
fn tunnel_lab() -> Option<(LabUp, ServerProc, Ends, u64)> {
    if !have("openvpn") || !have("openssl") {
        missing("the tunnel test needs openvpn and openssl (apt install openvpn openssl)");
        return None;
    }
    let lab = LabUp::up("ovpn", LINE)?;
    let server = lab.server("server");
    let raw_mtu = lab.test("client", &["mtu", SERVER_LINE])["path_mtu"]
        .as_u64()
        .unwrap();
    Some((lab, server, Ends::new(), raw_mtu))
}

#[test]
fn openvpn_through_the_lab_costs_cpu_and_keeps_most_of_the_goodput() {
    // CPU per gigabit is the whole machine's (compare's cpu block): another test binary beside
    // this one once made the tunnel read cheaper than the raw path (12.4 against 13.6 s/Gbit).
    let _g = quiet();
    let Some((lab, _server, ends, raw_mtu)) = tunnel_lab() else {
        return;
    };
    assert_eq!(raw_mtu, 1500);

    // The recipe's tunnel on a line that is the bottleneck: each tunnel packet carries about
    // 50 bytes of outer IPv4, UDP and OpenVPN's AEAD framing, and OpenVPN 2.6 (`mssfix 1492
    // mtu` by default) clamps inner TCP segments so the outer packet fits 1492 bytes:
    // (1492 - 52 - 52) / 1492 against 1448 / 1500 leaves about 96% of the raw path's goodput
    // (0.959-0.969 measured). The work of both OpenVPNs shows in the host's CPU per gigabit.
    // The raw path runs before and after the tunnel, and the cheaper of its two runs is the
    // reference: the host's CPU counts whatever else runs (in CI, a finished test's browser
    // still shutting down made one raw run read 9.3 s/Gbit against the tunnel's 8.1, where a
    // quiet host reads 3.4-5.2 against 9.3-9.5).
    let fast = ends.start(&lab, 0, false, &["--txqueuelen", "15000"]);
    let c = compare(
        &lab,
        &[SERVER_LINE, &tunnel_server(0), SERVER_LINE],
        "tcp-down",
        "5",
    );
    let runs = c["runs"].as_array().unwrap();
    let per_gbit = |r: &serde_json::Value| f(r, "cpu.cpu_s_per_gbit");
    let (raw, tun) = (
        if per_gbit(&runs[2]) < per_gbit(&runs[0]) {
            &runs[2]
        } else {
            &runs[0]
        },
        &runs[1],
    );
    let efficiency = goodput(&tun["summary"]) / goodput(&raw["summary"]);
    eprintln!(
        "efficiency {:.3} ({:.1} of {:.1} Mbit/s); CPU s per Gbit raw {:.2}, tunnel {:.2}; busy \
            {:.0}% / {:.0}%",
        efficiency,
        goodput(&tun["summary"]),
        goodput(&raw["summary"]),
        per_gbit(raw),
        per_gbit(tun),
        f(raw, "cpu.busy_percent"),
        f(tun, "cpu.busy_percent")
    );
    assert!(
        (0.85..0.99).contains(&efficiency),
        "efficiency {efficiency}"
    );
    assert!(
        per_gbit(tun) > per_gbit(raw),
        "encrypting costs CPU: {} vs {}",
        per_gbit(tun),
        per_gbit(raw)
    );
    drop(fast);
}

/// Goodput and delay, which other binaries' tests beside it leave alone (the CPU cost above
/// needs the machine to itself; together they were one test whose last 80 s shared it).
#[test]
fn openvpn_bloats_with_the_recipes_ring_and_not_with_the_generated_settings() {
    let _g = serial();
    // The raw path's MTU is for the generated settings below.
    let Some((lab, _server, ends, raw_mtu)) = tunnel_lab() else {
        return;
    };

    // OpenVPN as the bottleneck (a slow router's, through its own shaper) with the recipe's
    // 15000-packet ring; its goodput, as a user would measure it for the settings below.
    // Both tunnels' OpenVPNs above the kernel-reference guest's real-time priority (5), below
    // the lab's forwarders (10): beside CI's other workers (the guest and labs among them, all
    // real-time) OpenVPN at normal priority once stalled long enough to overflow the generated
    // 17-packet ring, and the tunnel carried half its rate (10.3 Mbit/s of rrul against 19.7
    // through the recipe's). Not in the test above: at real-time priority OpenVPN wakes for
    // every packet, and its CPU per gigabit rose (12.8 s against 8.3).
    let _recipe = ends.start(
        &lab,
        0,
        true,
        &["--txqueuelen", "15000", "--shaper", SHAPER],
    );
    let tunnel_mbps = f(
        &lab.test("client", &["tcp-down", &tunnel_server(0), "-l", "5"]),
        "throughput_mbps.down",
    );

    // The generated settings for that tunnel, on a second one beside it: the path's MTU from
    // test mtu, the tunnel's goodput from the run above.
    let (conf, up) = (
        ends.dir.join("bloatlab.conf"),
        ends.dir.join("bloatlab-up.sh"),
    );
    let rate = format!("{tunnel_mbps:.1}mbit");
    config(
        &["openvpn", "--mtu", &raw_mtu.to_string(), "--rate", &rate],
        &conf,
    );
    config(&["openvpn-up", "--rate", &rate], &up);
    std::fs::set_permissions(&up, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    // The script where the settings expect it: here the test's directory, not /etc/openvpn.
    let text = std::fs::read_to_string(&conf).unwrap().replace(
        "/etc/openvpn/bloatlab-tunnel-qdisc.sh",
        up.to_str().unwrap(),
    );
    std::fs::write(&conf, &text).unwrap();
    let ring: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("txqueuelen "))
        .expect("a txqueuelen line")
        .parse()
        .unwrap();
    let _generated = ends.start(
        &lab,
        1,
        true,
        &["--config", conf.to_str().unwrap(), "--shaper", SHAPER],
    );

    // RRUL through both in one compare. Loss-based TCP (CUBIC, the default of most hosts; BBR
    // keeps its own queue short) fills the recipe's ring for seconds.
    let c = compare(
        &lab,
        &[&tunnel_server(0), &tunnel_server(1)],
        "rrul --cc cubic",
        "10",
    );
    let runs = c["runs"].as_array().unwrap();
    let (bloated, fixed) = (&runs[0]["summary"], &runs[1]["summary"]);
    // A probe crosses both ends' rings, each at most `ring` packets of 1552 bytes on the wire
    // drained at the tunnel's rate.
    let ring_ms = ring * 1552.0 * 8.0 / (tunnel_mbps * 1e6) * 1e3;
    let (before, after) = (f(bloated, "added_latency_ms"), f(fixed, "added_latency_ms"));
    eprintln!(
        "tunnel {tunnel_mbps:.1} Mbit/s; txqueuelen 15000: +{before:.0} ms, {:.1} Mbit/s; \
            generated (txqueuelen {ring}, {ring_ms:.1} ms each end): +{after:.1} ms, {:.1} Mbit/s",
        goodput(bloated),
        goodput(fixed)
    );
    // 10 s of CUBIC filling an 18 s ring: +440 and +460 ms measured (+1061 ms over 15 s).
    assert!(
        before > 200.0,
        "a 15000-packet ring at {tunnel_mbps:.1} Mbit/s fills for seconds: +{before} ms"
    );
    assert!(
        after < 2.0 * ring_ms + 10.0 && after < before / 10.0,
        "+{after} ms through two {ring_ms:.1} ms rings"
    );
    assert!(
        goodput(fixed) > 0.9 * goodput(bloated),
        "no less throughput: {} vs {}",
        goodput(fixed),
        goodput(bloated)
    );

    // The tunnel's MTU: the generated tun-mtu, with the mssfix that follows for a tunnel inside it.
    let m = lab.test("client", &["mtu", &tunnel_server(1)]);
    assert_eq!(
        (m["path_mtu"].as_u64(), m["blackhole"].as_bool()),
        (Some(1500), Some(false)),
        "{m}"
    );
}
