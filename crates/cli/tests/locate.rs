//! `bloatlab locate` through the lab's `home` preset: client - wifi - router - access - isp -
//! core - server, the routers with Linux's default ICMP rate limit (one error a second to a
//! host, bursts of 6). The bloat, a 1000-packet FIFO at 10 Mbit/s while every other link runs
//! at 100 Mbit/s with 30 packets, sits on each link in turn, in a direction drawn at random
//! (the seed is printed; BLOATLAB_LOCATE_SEED repeats a run).

use crate::common::*;

const LINKS: [&str; 3] = ["wifi", "access", "core"];

fn locate(lab: &LabUp, tag: &str) -> serde_json::Value {
    locate_phases(lab, tag, "download,upload")
}

fn locate_phases(lab: &LabUp, tag: &str, phases: &str) -> serde_json::Value {
    locate_args(lab, tag, &["--phases", phases])
}

fn locate_args(lab: &LabUp, tag: &str, extra: &[&str]) -> serde_json::Value {
    let dir = tmp_path(&format!("locate-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let p = lab.exec("client");
    let mut args = vec![
        "locate",
        "10.77.2.2",
        "-l",
        "8",
        "--idle",
        "3",
        "--json",
        "-q",
        "--out-dir",
        dir.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = run(&p.iter().map(String::as_str).collect::<Vec<_>>(), &args);
    assert!(
        out.status.success(),
        "{tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json(&out)
}

/// Every link fast with a short queue; then `bloated` (link, dir) slow with a deep FIFO.
fn shape(lab: &LabUp, bloated: Option<(&str, &str)>) {
    for l in LINKS {
        lab.set(l, &["rate=100mbit", "limit=30", "--dir", "both"]);
    }
    if let Some((l, dir)) = bloated {
        lab.set(l, &["rate=10mbit", "limit=1000", "--dir", dir]);
    }
}

fn seed() -> u64 {
    std::env::var("BLOATLAB_LOCATE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos() as u64
        })
}

#[test]
fn locate_names_the_bloated_hop_and_direction_on_every_link_of_the_home_preset() {
    let _g = serial();
    let Some(lab) = LabUp::preset("loc", "home") else {
        return;
    };
    let _srv = lab.server("server");
    let seed = seed();
    eprintln!("BLOATLAB_LOCATE_SEED={seed}");
    for (i, link) in LINKS.iter().enumerate() {
        // Bit i of the seed picks the direction of link i.
        let dir = if seed >> i & 1 == 1 { "up" } else { "down" };
        shape(&lab, Some((link, dir)));
        let v = locate(&lab, link);
        let verdict = &v["verdict"];
        eprintln!("{link} {dir}: {}", verdict["text"]);
        // The queue on link i+1 is in front of hop i+1 (TTL i+1 reaches its far end).
        assert_eq!(
            verdict["hop"],
            i as u64 + 1,
            "{link} {dir} (seed {seed}): {verdict}"
        );
        assert_eq!(
            verdict["direction"], dir,
            "{link} {dir} (seed {seed}): {verdict}"
        );
        // A full 1000-packet FIFO at 10 Mbit/s is 1.2 s (1000 x 1500 x 8 / 10e6): it can hold
        // no more. Four cubic flows keep part of it standing (77 ms measured upload on the
        // access line), and a verdict needs 30 ms (grade A's bound).
        let added = verdict["added_ms"].as_f64().unwrap();
        assert!(added > 30.0 && added < 1250.0, "{link} {dir}: {added} ms");
        // At one probe a second per hop the routers' default rate limit answers nearly all.
        for h in v["hops"].as_array().unwrap() {
            let (answered, sent) = (h["answered"].as_f64().unwrap(), h["sent"].as_f64().unwrap());
            assert!(
                answered >= 0.7 * sent,
                "{link} {dir}: hop {} answered {answered} of {sent}",
                h["ttl"]
            );
        }
        assert_eq!(v["hops"].as_array().unwrap().len(), 3, "{}", v["hops"]);
    }
    // ICMP echo probes find the same (the lab's hosts admit ping sockets).
    shape(&lab, Some(("access", "up")));
    let v = locate_args(&lab, "icmp", &["--phases", "upload", "--icmp"]);
    assert_eq!(
        (&v["verdict"]["hop"], &v["verdict"]["direction"]),
        (&serde_json::json!(2), &serde_json::json!("up")),
        "{}",
        v["verdict"]
    );
    let hops = v["hops"].as_array().unwrap();
    assert_eq!(hops.len(), 3, "{hops:?}");
    assert!(
        hops[2]["destination"].as_bool().unwrap(),
        "the server's echo reply ends the path"
    );
    // Short queues everywhere: the slowest link (the access line's upload, 20 packets at
    // 20 Mbit/s: 12 ms when full) is not to blame.
    shape(&lab, None);
    lab.set("access", &["rate=20mbit", "limit=20", "--dir", "up"]);
    let v = locate(&lab, "none");
    assert!(v["verdict"]["hop"].is_null(), "{}", v["verdict"]);
    assert_eq!(v["verdict"]["direction"], "none");
    assert!(
        v["verdict"]["text"]
            .as_str()
            .unwrap()
            .starts_with("No hop bloats"),
        "{}",
        v["verdict"]
    );
}

#[test]
fn a_router_slow_to_send_its_own_icmp_under_load_is_not_blamed() {
    let _g = serial();
    // The home line with its router answering 300 ms late while it forwards (icmp_delay), and
    // the real queue on the core link's download.
    let topo = r#"
name = "slowicmp"
[[link]]
name = "wifi"
a = "client"
b = "router"
both = { rate = "100mbit", delay = "1ms", limit = 30 }
[[link]]
name = "access"
a = "router"
b = "isp"
both = { rate = "100mbit", delay = "7ms", limit = 30 }
[[link]]
name = "core"
a = "isp"
b = "server"
both = { rate = "100mbit", delay = "2ms", limit = 30 }
down = { rate = "10mbit", limit = 1000 }
[host.router]
icmp_delay = "300ms"
"#;
    let Some(lab) = LabUp::up("slowicmp", topo) else {
        return;
    };
    let _srv = lab.server("server");
    let v = locate_phases(&lab, "slowicmp", "download");
    let verdict = &v["verdict"];
    eprintln!("{}\n{}", v["hops"], verdict);
    let hop1 = &v["hops"][0];
    // The router's own answers: idle at once, under load 300 ms late.
    let late = hop1["phases"]["download"]["p50_ms"].as_f64().unwrap()
        - hop1["idle_p50_ms"].as_f64().unwrap();
    assert!(late > 250.0 && late < 400.0, "hop 1 under load: +{late} ms");
    assert_eq!(
        (&verdict["hop"], &verdict["direction"]),
        (&serde_json::json!(3), &serde_json::json!("down")),
        "{verdict}"
    );
    let notes = verdict["caveats"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|c| c.as_str().unwrap().starts_with("hop 1 answers")
                && c.as_str().unwrap().contains("slow to send ICMP")),
        "{notes:?}"
    );
}

#[test]
fn a_routers_icmp_rate_limit_is_a_host_setting() {
    let _g = serial();
    let topo = "name='rl'\n[[link]]\nname='a'\na='c'\nb='r'\n[[link]]\nname='b'\na='r'\nb='s'\n[host.r]\nicmp_ratelimit = 0\n";
    let Some(lab) = LabUp::up("rl", topo) else {
        return;
    };
    let read = |host: &str, key: &str| {
        let p = lab.exec(host);
        let mut args: Vec<&str> = p.iter().map(String::as_str).collect();
        args.extend(["sysctl", "-n", key]);
        let out = std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(read("r", "net.ipv4.icmp_ratelimit"), "0");
    assert_eq!(read("r", "net.ipv6.icmp.ratelimit"), "0");
    // Hosts without the setting keep Linux's default.
    assert_eq!(read("c", "net.ipv4.icmp_ratelimit"), "1000");
}

#[test]
fn a_queue_on_the_measuring_host_itself_is_hop_zero() {
    let _g = serial();
    // The client's own interface shapes its upload to 3 Mbit/s behind a 1000-packet FIFO (a
    // sender's qdisc or Wi-Fi driver queue), below the 4 Mbit/s line: the queue is on the host.
    let Some(lab) = LabUp::preset("lochost", "cable") else {
        return;
    };
    let _srv = lab.server("server");
    let ns = "bl-lochost-client";
    for cmd in [
        "tc qdisc add dev lan root handle 1: htb default 1",
        "tc class add dev lan parent 1: classid 1:1 htb rate 3mbit ceil 3mbit",
        "tc qdisc add dev lan parent 1:1 handle 10: pfifo limit 1000",
    ] {
        let args: Vec<&str> = ["netns", "exec", ns]
            .into_iter()
            .chain(cmd.split(' '))
            .collect();
        assert!(
            std::process::Command::new("ip")
                .args(&args)
                .status()
                .unwrap()
                .success(),
            "{cmd}"
        );
    }
    let dir = tmp_path("locate-host");
    std::fs::create_dir_all(&dir).unwrap();
    let p = lab.exec("client");
    let v = run_json(
        &p.iter().map(String::as_str).collect::<Vec<_>>(),
        &[
            "locate",
            "10.77.1.2",
            "-l",
            "10",
            "--idle",
            "3",
            "--phases",
            "upload",
            "--json",
            "-q",
            "--out-dir",
            dir.to_str().unwrap(),
        ],
    );
    let verdict = &v["verdict"];
    eprintln!("{verdict}");
    assert_eq!(
        (&verdict["hop"], &verdict["direction"]),
        (&serde_json::json!(0), &serde_json::json!("up")),
        "{verdict}"
    );
    assert!(
        verdict["text"]
            .as_str()
            .unwrap()
            .contains("this host's own interface queue"),
        "{verdict}"
    );
    // The backlog, as delay at the measured upload rate, is most of the path's added delay
    // (44 ms of 43 measured: TCP small queues keep each flow's share of the local FIFO small,
    // so it never nears its 1000 packets).
    assert!(verdict["added_ms"].as_f64().unwrap() > 30.0, "{verdict}");
}
