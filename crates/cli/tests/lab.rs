//! The lab emulator end to end: real kernel TCP in namespaces, through TUN devices and the
//! userspace link model. Expected values are the configured link physics.

use crate::common::*;
use std::process::Command;

/// The namespaces of lab `lab` (`bl-LAB-HOST`) and this namespace's links. Tests of other
/// binaries run beside these in CI: their namespaces are not looked at, nor the devices that
/// pass through this namespace on their way into one (a lab's TUNs, `blt...`; a kernel-ref
/// guest's taps, `kr...`).
fn netns_and_links(lab: &str) -> (String, String) {
    let all = String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let prefix = format!("{}{lab}-", bloatlab_lab::NS_PREFIX);
    let ns: String = all
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| format!("{l}\n"))
        .collect();
    let links = String::from_utf8(
        Command::new("ip")
            .args(["-o", "link", "show"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    // Link lines carry counters-free state only; drop the per-line flags that can change.
    let names: Vec<&str> = links
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(str::trim)
        .filter(|n| !n.starts_with("blt") && !n.starts_with("kr"))
        .collect();
    (ns, names.join(" "))
}

const ONE_LINK: &str = r#"
name = "one"
[[link]]
name = "l"
a = "c"
b = "s"
both = { rate = "10mbit", limit = 1000 }
"#;

/// The congestion control each bulk flow's sending socket had.
fn flows_cc(result: &serde_json::Value) -> Vec<&str> {
    result["metadata"]["flows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["cc"].as_str().unwrap_or("?"))
        .collect()
}

#[test]
fn goodput_follows_the_set_rate_and_lab_set_changes_it_live() {
    let _g = serial();
    let before = netns_and_links("rate");
    {
        let Some(lab) = LabUp::up("rate", ONE_LINK) else {
            return;
        };
        let _srv = lab.server("s");
        for mbps in [10.0, 50.0, 200.0] {
            lab.set("l", &[&format!("rate={mbps}mbit"), "--dir", "down"]);
            let (s, result) = lab.test_and_result(
                "c",
                &[
                    "tcp-down",
                    "10.77.0.2",
                    "--flows",
                    "4",
                    "-l",
                    "6",
                    "--idle",
                    "0.5",
                ],
            );
            let got = f(&s, "throughput_mbps.down");
            // cubic unless a host's settings say otherwise, whatever this machine's default.
            assert_eq!(flows_cc(&result), ["cubic"; 4]);
            // The rate is of IP packets; TCP carries 1448 payload bytes in each 1500.
            let want = mbps * 1448.0 / 1500.0;
            assert!(
                (got - want).abs() <= 0.02 * want,
                "at {mbps} Mbit/s: goodput {got}, want {want} +/- 2%"
            );
        }
        let st = lab.stats();
        assert!(st["links"]["l"]["down"]["tx_packets"].as_u64().unwrap() > 10_000);
        assert_eq!(
            st["links"]["l"]["down"]["tun"]["dropped"], 0,
            "the TUN queue must not drop: {}",
            st["links"]["l"]["down"]
        );
    }
    assert_eq!(
        netns_and_links("rate"),
        before,
        "teardown must leave namespaces and links as they were"
    );
}

#[test]
fn idle_rtt_adds_the_configured_delay() {
    // No other test beside it (CI's first phase, one test at a time): beside a busy guest (its
    // vCPU holds a core at real-time priority, kernel_ref_sh) it waited out the guest's tests,
    // 45 s of CI's tail, for 10 s of its own. CI's idle-priority build goes on: the lab's
    // forwarders run above it.
    let _g = alone();
    let Some(lab) = LabUp::up(
        "delay",
        "name='d'\n[[link]]\nname='l'\na='c'\nb='s'\nboth={delay='10ms'}\n[host.s]\ncc='reno'\n",
    ) else {
        return;
    };
    let _srv = lab.server("s");
    // A host's congestion control is what its settings say (the server's, sending here).
    let (_, result) = lab.test_and_result(
        "c",
        &[
            "tcp-down",
            "10.77.0.2",
            "--flows",
            "2",
            "-l",
            "1",
            "--idle",
            "0",
        ],
    );
    assert_eq!(flows_cc(&result), ["reno", "reno"]);
    // Never below the configured 2 x 10 ms; above it only by the emulator's own forwarding
    // (two TUN hops each way through a user process: 0.17-0.35 ms measured on this machine,
    // with the code of before and after issue #15; 0.44-0.65 on a noisier day, with the code
    // before and after issue #9 alike). The pinging and answering processes are this
    // machine's too, and beside CI's other workers on a slow host they woke late (p50 21.5 ms
    // once): a p50 above the bound is measured again, up to twice, and the lowest counts,
    // as load only ever adds delay. Every run must stay at or above 20 ms.
    let p50 = |addr: &str, secs: &str| {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let s = lab.test("c", &["ping", addr, "-l", secs, "--idle", "0"]);
            let p50 = f(&s, "latency_ms.idle.p50");
            assert!(p50 >= 20.0, "{addr}: RTT p50 {p50} ms for 2 x 10 ms");
            best = best.min(p50);
            if best <= 21.0 {
                break;
            }
            eprintln!("{addr}: RTT p50 {p50} ms: measuring again");
        }
        best
    };
    let p = p50("10.77.0.2", "3");
    assert!(p <= 21.0, "RTT p50 {p} ms for 2 x 10 ms");
    // IPv6 takes the same path.
    let p = p50("[fd77:0:0:0::2]", "2");
    assert!(p <= 21.0, "IPv6 RTT p50 {p} ms for 2 x 10 ms");
}

#[test]
fn a_saturated_link_keeps_its_standing_queue_in_the_model_not_in_the_tun_device() {
    let _g = serial();
    // 200 packets at 20 Mbit/s: a full FIFO is 200 x 1500 B x 8 / 20e6 = 120 ms, which cubic
    // keeps nearly full. Every millisecond of it must be in the model's queue (where sojourn
    // statistics and AQMs see it), none in the TUN device's transmit queue before the model.
    let topo = "name='sat'\n[[link]]\nname='l'\na='c'\nb='s'\nboth={rate='20mbit', limit=200}\n";
    let Some(lab) = LabUp::up("sat", topo) else {
        return;
    };
    let _srv = lab.server("s");
    let s = lab.test(
        "c",
        &[
            "tcp-down",
            "10.77.0.2",
            "--flows",
            "4",
            "--cc",
            "cubic",
            "-l",
            "8",
            "--idle",
            "1",
        ],
    );
    let added = f(&s, "latency_ms.loaded.p50") - f(&s, "latency_ms.idle.p50");
    assert!(
        added > 60.0 && added <= 121.0,
        "a 120 ms FIFO under cubic added {added} ms"
    );
    let down = &lab.stats()["links"]["l"]["down"];
    // The model's sojourn p90 covers the probes' added delay (the ACK direction has no queue):
    // the queueing the probes saw is the model's.
    let sojourn_us: Vec<(f64, f64)> = down["sojourn"]["us"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (b[0].as_f64().unwrap(), b[1].as_f64().unwrap()))
        .collect();
    let total: f64 = sojourn_us.iter().map(|b| b.1).sum();
    let mut seen = 0.0;
    let p90_ms = sojourn_us
        .iter()
        .find(|b| {
            seen += b.1;
            seen >= 0.9 * total
        })
        .unwrap()
        .0
        / 1000.0;
    assert!(
        p90_ms >= added - 2.0 && p90_ms <= 121.0,
        "model sojourn p90 {p90_ms} ms, probes added {added} ms"
    );
    // What waited in the TUN device: the sender's bursts, read within tens of microseconds (a
    // packet takes 0.6 ms on this link), never a queue, and nothing dropped there. Measured p99
    // 38-80 us alone, 1.5 ms once after the demo test; the maximum (2.7-14.7 ms) is a stall of
    // this shared host, which delays the model's departures alike.
    let tun = &down["tun"];
    eprintln!("added {added:.1} ms, model sojourn p90 {p90_ms:.1} ms, TUN {tun}");
    assert_eq!(tun["dropped"], 0, "{tun}");
    assert!(tun["wait_us"]["p99"].as_u64().unwrap() <= 2_000, "{tun}");
}

/// Gettys' driver ring (the `wifi-ring` preset: 6 Mbit/s, 256 entries) below FQ-CoDel, kept
/// full by 8 Mbit/s of unresponsive UDP in 1500-byte packets. FQ-CoDel sends the sparse probes
/// next, but into the ring, which drains FIFO at the link rate: a probe takes the slot the
/// packet leaving frees, with 255 packets of 2 ms ahead (the probes' own packets hold 2% of
/// the slots: 10 a second against 490), after on average half a packet's wait for it: 501 ms
/// that no qdisc can see or remove. A 10-entry ring leaves 18.6 ms; BQL its byte limit / rate
/// plus half a packet. Same goodput each time: 6 x 1472 / 1500. (TCP keeps the ring less full:
/// a 10 Mbit/s upload's probes waited +63-70 ms in 307 ms of ring, as cubic refills it slowly
/// after each drop.)
#[test]
fn a_driver_ring_below_fq_codel_holds_its_drain_time_and_bql_or_a_short_ring_cures_it() {
    // A paced sender that falls behind lets fq_codel run dry and the ring fill less: beside
    // three other CI workers a 10-entry ring held 11.7 and 12.7 of its 18.6 ms (twice), with
    // no guest beside it the second time. Beside CI's idle-priority build it is alone: the
    // build takes only what the sender and the lab's forwarders leave.
    let _g = alone();
    let Some(lab) = LabUp::preset("ring", "wifi-ring") else {
        return;
    };
    let _srv = lab.server("server");
    lab.set("wifi", &["--dir", "up", "qdisc=fq_codel"]);
    let flood = |setting: &str| {
        lab.set("wifi", &["--dir", "up", setting]);
        let s = lab.test(
            "client",
            &[
                "udp",
                "10.77.1.2",
                "--rate",
                "8mbit",
                "--size",
                "1472",
                "--pacing",
                "timer",
                "-l",
                "6",
                "--idle",
                "2",
                "--step",
                "0.1",
            ],
        );
        let goodput = f(&s, "throughput_mbps.up");
        assert!(
            goodput > 0.97 * 5.888 && goodput < 5.9,
            "{setting}: {goodput} Mbit/s"
        );
        f(&s, "added_latency_ms")
    };
    let check = |setting: &str, added: f64, physics: f64, within: f64| {
        eprintln!("{setting}: +{added:.1} ms, physics {physics:.1} ms");
        assert!(
            (added / physics - 1.0).abs() <= within,
            "{setting}: +{added} ms, physics {physics} ms (within {within})"
        );
    };
    let ring_ms = |n: f64| (n - 1.0) * 0.98 * 2.0 + 1.0;
    check("ring=256", flood("ring=256"), ring_ms(256.0), 0.05);
    check("ring=10", flood("ring=10"), ring_ms(10.0), 0.1);
    lab.set("wifi", &["--dir", "up", "ring=256"]);
    let added = flood("bql=on");
    // The limit the ring settled at under this load (two to three packets), read after the run.
    let limit = lab.stats()["links"]["wifi"]["up"]["bql_limit_bytes"]
        .as_f64()
        .expect("BQL reports its limit");
    assert!((1500.0..=4500.0).contains(&limit), "BQL limit {limit} B");
    // BQL moves its limit a packet at a time as it adapts (2 ms of wait at 6 Mbit/s), so the
    // probes' mean lies between the waits behind the run's smallest and largest limits, not at
    // the one read after it (one CI run: +5.75 ms against 5.0 at a final 3000 B): between one
    // packet's and a packet above the final limit's, 15% either side.
    let wait = |bytes: f64| bytes * 8.0 / 6e6 * 1e3 + 1.0;
    eprintln!(
        "bql=on: +{added:.2} ms, physics {:.1} ms at the final limit of {limit} B",
        wait(limit)
    );
    assert!(
        added >= 0.85 * wait(1500.0) && added <= 1.15 * wait(limit + 1500.0),
        "bql=on: +{added} ms, a limit of 1500 to {} B waits {:.1} to {:.1} ms",
        limit + 1500.0,
        wait(1500.0),
        wait(limit + 1500.0)
    );
}

/// The `switch` preset: a gigabit host, a switch with a 64 KB buffer on its 100 Mbit/s uplink,
/// a 50 Mbit/s line. 20 Mbit/s of 1 KB datagrams sent as old iperf3 -b did without pacing (244
/// packets, 257 KB of IP, back to back every 100 ms) arrive at the switch at up to 1 Gbit/s for
/// at least 2.1 ms; the port drains 100 Mbit/s meanwhile and holds 64 KB, so at most
/// (65536 + 257 KB x 0.1) / 257 KB = 35.5% of each burst gets through if the host sends at line
/// rate (more if it sends slower): 64.5% lost at most. The same rate paced by a timer never
/// fills the buffer. A burst must also fit the host's own TUN queue (256 packets), where a
/// stalled emulator would otherwise drop it outside the model: at 30 Mbit/s (366 packets, 70%
/// and 72% lost against a 73% bound) one CI run lost 59 there; at 45 Mbit/s, 77.8% of 79%.
#[test]
fn unpaced_bursts_overflow_a_shallow_switch_and_a_paced_sender_loses_nothing() {
    // The loss's upper bound is the host sending at line rate. It sends slower where the
    // emulator reads the burst off its TUN slower: a burst read at R bit/s loses
    // 1 - 65536 / 256.7 KB - 100 Mbit/s / R, 40% at R = 290 Mbit/s, the lower bound. Measured:
    // 47.6% beside the guest and a build (R = 370), 44.7% in CI's quiet phase (R = 340), 51.8%
    // alone on the same host that day (R = 440). So no other test beside it, but CI's
    // idle-priority build may go on.
    let _g = alone();
    let Some(lab) = LabUp::preset("switch", "switch") else {
        return;
    };
    let _srv = lab.server("server");
    let udp = |pacing: &str| {
        let before = lab.stats()["links"]["uplink"]["up"]["drops"]["overflow"]
            .as_u64()
            .unwrap();
        let s = lab.test(
            "client",
            &[
                "udp",
                "10.77.2.2",
                "--rate",
                "20mbit",
                "--pacing",
                pacing,
                "-l",
                "5",
                "--idle",
                "1",
            ],
        );
        let st = lab.stats();
        let overflow = st["links"]["uplink"]["up"]["drops"]["overflow"]
            .as_u64()
            .unwrap()
            - before;
        eprintln!(
            "{pacing}: loss {:.1}% of {}, goodput {:.2} Mbit/s, switch overflow {overflow}, burst \
                send {} recv {}, lan TUN {}",
            f(&s, "loss.percent"),
            s["loss"]["sent"],
            f(&s, "throughput_mbps.up"),
            s["burst"]["send"],
            s["burst"]["recv"],
            st["links"]["lan"]["up"]["tun"]
        );
        // The host's own TUN queue must not be where packets go. A burst fills 245 of its 256
        // places (the emulator reads none while the sender writes it, even on a quiet host),
        // so a host busier than that can drop a few there (one CI run: 2 of ~7700 lost): let
        // a trace pass, under 1% of the loss (the switch's overflow is 95% of it, below).
        let tun_dropped = st["links"]["lan"]["up"]["tun"]["dropped"].as_u64().unwrap();
        let lost = s["loss"]["lost"].as_u64().unwrap();
        assert!(
            tun_dropped * 100 <= lost,
            "the host's TUN dropped {tun_dropped} of the {lost} packets lost"
        );
        (s, overflow)
    };
    let (mut bursty, mut overflow) = udp("burst:100ms");
    // A busier host only ever lowers the loss, so a run under the bound is measured once more
    // and the one that lost more counts; a switch that holds what it should drop loses too
    // little both times.
    if f(&bursty, "loss.percent") < 40.0 {
        eprintln!("bursts lost {}%: again", f(&bursty, "loss.percent"));
        let again = udp("burst:100ms");
        if f(&again.0, "loss.percent") > f(&bursty, "loss.percent") {
            (bursty, overflow) = again;
        }
    }
    let loss = f(&bursty, "loss.percent");
    assert!(
        (40.0..=66.0).contains(&loss),
        "bursts lost {loss}% at the switch (physics: 64.5% at \
        line rate, less if the host is slower)"
    );
    let lost = bursty["loss"]["lost"].as_u64().unwrap();
    assert!(
        overflow as f64 >= 0.95 * lost as f64,
        "the switch dropped {overflow} of the {lost} lost packets"
    );
    assert!(
        f(&bursty, "burst.send.peak_over_mean") > 8.0,
        "{}",
        bursty["burst"]
    );
    let (paced, _) = udp("timer");
    assert!(f(&paced, "loss.percent") < 0.5, "{}", paced["loss"]);
    let goodput = f(&paced, "throughput_mbps.up");
    assert!(
        (goodput - 20.0).abs() < 0.03 * 20.0,
        "paced goodput {goodput} Mbit/s of 20"
    );
    assert!(
        f(&paced, "burst.send.p99_over_mean") < 3.0,
        "{}",
        paced["burst"]
    );
}

/// `test mtu` through a router whose next link has a 1400-byte MTU: the router's kernel answers
/// "fragmentation needed" (ICMPv6 "packet too big") naming 1400, and the search ends there with
/// no black hole. Then the link model alone (not the router's interface) drops packets over
/// 1300 without a word: a black hole at 1300, found by bisection over IPv4 and IPv6.
#[test]
fn test_mtu_finds_the_narrow_link_and_a_silent_black_hole() {
    let _g = serial();
    let topo = "name='mtu'\n[[link]]\nname='lan'\na='client'\nb='router'\n[[link]]\nname='line'\na='router'\nb='server'\nboth={mtu=1400}\n[host.router]\nicmp_ratelimit = 0\n";
    let Some(lab) = LabUp::up("mtu", topo) else {
        return;
    };
    // Echo sockets without privilege: the lab's hosts admit every group (lab up sets it).
    let p = lab.exec("client");
    let s = lab.test("client", &["mtu", "10.77.1.2"]);
    assert_eq!(
        (s["path_mtu"].as_u64(), s["blackhole"].as_bool()),
        (Some(1400), Some(false)),
        "{s}"
    );
    assert_eq!(s["advice"]["openvpn_mssfix"], 1372);
    let s6 = lab.test("client", &["mtu", "fd77:0:0:1::2"]);
    assert_eq!(
        (s6["path_mtu"].as_u64(), s6["blackhole"].as_bool()),
        (Some(1400), Some(false)),
        "{s6}"
    );
    lab.set("line", &["mtu=1300"]);
    for host in ["10.77.1.2", "fd77:0:0:1::2"] {
        let s = lab.test("client", &["mtu", host]);
        assert_eq!(
            (s["path_mtu"].as_u64(), s["blackhole"].as_bool()),
            (Some(1300), Some(true)),
            "{host}: {s}"
        );
    }
    assert!(
        lab.stats()["links"]["line"]["up"]["drops"]["mtu"]
            .as_u64()
            .unwrap()
            > 0,
        "the model dropped the large probes"
    );
    // A path that drops everything: no size to search from, one line and a failing exit.
    lab.set("line", &["loss=100%"]);
    let out = run(
        &p.iter().map(String::as_str).collect::<Vec<_>>(),
        &["test", "mtu", "10.77.1.2", "-q"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.trim().lines().count() == 1 && err.contains("no echo reply"),
        "{:?}: {err}",
        out.status
    );
}

/// The value below which `q` of a histogram's samples lie, from `lab stats`' [[value, count]].
fn quantile(pairs: &serde_json::Value, q: f64) -> f64 {
    let pairs: Vec<(f64, f64)> = pairs
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    let total: f64 = pairs.iter().map(|p| p.1).sum();
    let mut seen = 0.0;
    pairs
        .iter()
        .find(|p| {
            seen += p.1;
            seen >= q * total
        })
        .map_or(0.0, |p| p.0)
}

/// Super-packets (offload, the default) change how hosts hand packets to the lab, not the link:
/// the model serialises, queues and drops each wire segment. At 20 Mbit/s behind a 50-packet
/// FIFO (50 x 1500 x 8 / 20e6 = 30 ms) two cubic flows keep it full with and without them:
/// the same goodput, the same sojourn, the same overflow, while the server really sent 64 KB
/// super-packets in one run and single packets in the other. (Had the model counted a
/// super-packet as one packet, the FIFO would have held 50 x 44 segments: 1.3 s.)
#[test]
fn super_packets_queue_and_drop_per_wire_segment() {
    let _g = serial();
    let run = |offload: bool| {
        let topo = format!(
            "name = \"gso\"\noffload = {offload}\n[[link]]\nname = \"line\"\na = \
            \"c\"\nb = \"s\"\nboth = {{ rate = \"20mbit\", limit = 50 }}\n"
        );
        let lab = LabUp::up(if offload { "gso-on" } else { "gso-off" }, &topo)?;
        let _srv = lab.server("s");
        let s = lab.test(
            "c",
            &[
                "tcp-down",
                "10.77.0.2",
                "--flows",
                "2",
                "-l",
                "6",
                "--idle",
                "1",
            ],
        );
        let down = lab.stats()["links"]["line"]["down"].clone();
        let (mbps, sojourn_ms) = (
            f(&s, "throughput_mbps.down"),
            quantile(&down["sojourn"]["us"], 0.5) / 1000.0,
        );
        eprintln!(
            "offload {offload}: {mbps:.2} Mbit/s, sojourn p50 {sojourn_ms:.1} ms, queue max \
            {}, overflow {}, TUN \
            {}",
            down["max_queue_packets"], down["drops"]["overflow"], down["tun"]
        );
        Some((mbps, sojourn_ms, down))
    };
    let Some((on_mbps, on_ms, on)) = run(true) else {
        return;
    };
    let Some((off_mbps, off_ms, off)) = run(false) else {
        return;
    };
    // The server's kernel handed over super-packets only with offload: fewer reads for the
    // same data. Cubic sizes them to about 1 ms of its rate, at least 2 segments (Linux's
    // tcp_tso_autosize): 6246 reads against 10 959 measured (BBR gave 4132 against 11 003).
    // They leave one segment per write all the same: at 20 Mbit/s segments are 0.6 ms apart,
    // more than the 100 us a delivery may wait.
    let reads = |d: &serde_json::Value| d["tun"]["reads"].as_u64().unwrap();
    assert!(
        on["tun"]["super_packets_in"].as_u64().unwrap() > 100,
        "{}",
        on["tun"]
    );
    assert!(
        reads(&on) * 4 < reads(&off) * 3,
        "{} reads with super-packets, {} without",
        reads(&on),
        reads(&off)
    );
    assert_eq!(off["tun"]["super_packets_in"].as_u64(), Some(0));
    for (d, mbps, ms) in [(&on, on_mbps, on_ms), (&off, off_mbps, off_ms)] {
        // The FIFO's limit is in wire packets: never more than 50, and full enough to drop.
        assert!(
            d["max_queue_packets"].as_u64().unwrap() <= 50,
            "{}",
            d["max_queue_packets"]
        );
        assert!(d["drops"]["overflow"].as_u64().unwrap() > 0);
        // 1448 of every 1500 bytes are payload: 19.3 Mbit/s at most.
        assert!(mbps > 18.0 && mbps < 19.35, "{mbps} Mbit/s");
        assert!(
            ms > 10.0 && ms <= 30.5,
            "sojourn p50 {ms} ms in a 30 ms FIFO"
        );
    }
    assert!(
        (on_mbps - off_mbps).abs() < 0.03 * off_mbps,
        "goodput {on_mbps} with super-packets, {off_mbps} without"
    );
    assert!(
        (on_ms - off_ms).abs() < 0.2 * off_ms,
        "sojourn p50 {on_ms} ms with super-packets, {off_ms} without"
    );
}

#[test]
fn three_hops_forward_end_to_end_with_counters_per_hop() {
    let _g = serial();
    let topo = r#"
name = "chain"
[[link]]
name = "wifi"
a = "laptop"
b = "router"
both = { rate = "30mbit", delay = "1ms" }
[[link]]
name = "wan"
a = "router"
b = "isp"
both = { rate = "20mbit", delay = "5ms" }
[[link]]
name = "core"
a = "isp"
b = "server"
both = { delay = "10ms" }
"#;
    let Some(lab) = LabUp::up("chain", topo) else {
        return;
    };
    let _srv = lab.server("server");
    let s = lab.test(
        "laptop",
        &[
            "tcp-down",
            "10.77.2.2",
            "--flows",
            "2",
            "-l",
            "5",
            "--idle",
            "1",
        ],
    );
    let mut idle = f(&s, "latency_ms.idle.p50");
    // Six TUN traversals each way add 1-1.5 ms here (33.1-33.5 measured with the code before
    // and after issue #9 alike); 35.2 once while CI had just run the emulated kernel, 36.6
    // once in CI on a host twice as slow to build as usual. Load only adds delay, so a p50
    // over the bound is measured once more and the lower counts; none may be under 32.
    if idle >= 36.0 {
        eprintln!("idle p50 {idle} ms: measuring it again");
        let again = lab.test("laptop", &["ping", "10.77.2.2", "-l", "3", "--idle", "0"]);
        let p50 = f(&again, "latency_ms.idle.p50");
        assert!(p50 > 32.0, "2 x (1 + 5 + 10) ms plus serialisation: {p50}");
        idle = idle.min(p50);
    }
    assert!(
        idle > 32.0 && idle < 36.0,
        "2 x (1 + 5 + 10) ms plus serialisation: {idle}"
    );
    // The 20 Mbit/s hop is the bottleneck.
    let down = f(&s, "throughput_mbps.down");
    assert!(down > 17.5 && down < 20.0, "{down}");
    let st = lab.stats();
    for link in ["wifi", "wan", "core"] {
        let n = st["links"][link]["down"]["tx_packets"].as_u64().unwrap();
        assert!(n > 5000, "{link} forwarded {n} packets");
    }
    // The result file holds the emulator's counters (ground truth beside the measurement).
    let files: Vec<_> = std::fs::read_dir(tmp_path(""))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("chain-laptop-tcp-down")
        })
        .collect();
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(files[0].path()).unwrap()).unwrap();
    let lab = &r["metadata"]["lab"];
    let sent = |at: &str| {
        lab[at]["links"]["wan"]["down"]["tx_packets"]
            .as_u64()
            .unwrap()
    };
    assert!(sent("at_end") - sent("at_start") > 5000, "{lab}");
}

/// The processes whose command line starts with `argv0` (a name given with `exec -a`).
fn running(argv0: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).next() == Some(argv0.as_bytes()))
        })
        .collect()
}

/// SIGKILLs a lab's background process, as a reboot or the OOM killer would.
fn kill_lab_process(name: &str) {
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(format!("/run/bloatlab/labs/{name}/info.json")).unwrap(),
    )
    .unwrap();
    unsafe { libc::kill(info["pid"].as_i64().unwrap() as i32, libc::SIGKILL) };
    wait_ms(300);
}

/// A second Ctrl-C stops `lab compare` at once, and its lab with it: no namespace or state is
/// left for `lab down --all` (the exit skips the lab's teardown; the handler removes them), and
/// no process started in it. The run is cake-autorate's, by a stand-in with a child to look for
/// that ignores SIGTERM (the first Ctrl-C's orderly stop waits 10 s for it, and the second
/// comes meanwhile): in its own process group, it gets no Ctrl-C from a terminal, and a deleted
/// namespace does not end it.
#[test]
fn compare_stopped_by_a_second_ctrl_c_leaves_no_namespaces_or_processes_behind() {
    let _g = serial();
    if unsafe { libc::geteuid() } != 0 {
        return missing("the lab needs root");
    }
    if !have("fping") {
        return missing("fping (apt-get install fping)");
    }
    let dir = tmp_path("compare-interrupted");
    let checkout = dir.join("cake-autorate");
    std::fs::create_dir_all(&checkout).unwrap();
    let marker = format!("bloatlab-stand-in-{}", std::process::id());
    let stand_in = format!(
        "#!/bin/bash\ntrap '' TERM\n(exec -a {marker} sleep 600) &\nwhile :; do sleep 0.1; done\n"
    );
    std::fs::write(checkout.join("cake-autorate.sh"), stand_in).unwrap();
    std::fs::write(checkout.join("defaults.sh"), "").unwrap();
    std::fs::write(checkout.join("lib.sh"), "").unwrap();
    let state = std::path::Path::new(bloatlab_lab::STATE_DIR).join("compare");
    // Whatever happens below, nothing of this run outlives the test.
    struct Remains(std::path::PathBuf, String, std::path::PathBuf);
    impl Drop for Remains {
        fn drop(&mut self) {
            let (ns, _) = netns_and_links("compare");
            // `ip netns list` says "NAME (id: N)".
            for n in ns.lines().filter_map(|l| l.split_whitespace().next()) {
                let _ = Command::new("ip").args(["netns", "del", n]).output();
            }
            let _ = std::fs::remove_dir_all(&self.0);
            for pid in running(&self.1) {
                // SAFETY: a signal to the stand-in's child this test started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let _ = std::fs::remove_dir_all(&self.2);
        }
    }
    let mut child = Command::new(BIN)
        .args(["lab", "compare", "cable", "-l", "20", "-q"])
        .args(["--fix", "cake-autorate-sh", "--cake-autorate"])
        .arg(&checkout)
        .args(["--out-dir", dir.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // Where it keeps cake-autorate's files (cake_autorate_sh::start).
    let peer_tmp = std::env::temp_dir().join(format!("bloatlab-cake-autorate-bloatlab{pid}"));
    let _remains = Remains(state.clone(), marker.clone(), peer_tmp.clone());
    let t0 = std::time::Instant::now();
    while running(&marker).is_empty() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(30),
            "cake-autorate's stand-in came not up"
        );
        assert!(child.try_wait().unwrap().is_none(), "lab compare ended");
        wait_ms(100);
    }
    // The test under way, then Ctrl-C twice.
    wait_ms(2000);
    assert!(
        !netns_and_links("compare").0.is_empty(),
        "the lab's namespaces"
    );
    assert!(peer_tmp.is_dir(), "{}", peer_tmp.display());
    // SAFETY: signals to our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    wait_ms(300);
    unsafe { libc::kill(pid, libc::SIGINT) };
    let t1 = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t1.elapsed() < std::time::Duration::from_secs(10),
            "still running 10 s after the second Ctrl-C"
        );
        wait_ms(50);
    };
    assert_eq!(status.code(), Some(130));
    let (ns, _) = netns_and_links("compare");
    assert!(ns.is_empty(), "namespaces left: {ns}");
    assert!(!state.exists(), "{} left", state.display());
    // SIGKILL is delivered at once; the kernel's reaping may take a moment.
    wait_ms(200);
    let left = running(&marker);
    assert!(left.is_empty(), "cake-autorate's processes left: {left:?}");
    assert!(!peer_tmp.exists(), "{} left", peer_tmp.display());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_killed_lab_neither_blocks_its_name_nor_outlives_down_all() {
    let _g = serial();
    // `lab down --all` below takes down other binaries' labs too: none may be up meanwhile.
    let _all = AllLabs::take();
    let before = netns_and_links("killed");
    let Some(lab) = LabUp::up("killed", ONE_LINK) else {
        return;
    };
    kill_lab_process("killed");
    std::mem::forget(lab);
    // `lab up` clears what the dead process left (its namespaces survive it) and comes up.
    let again = LabUp::up("killed", ONE_LINK).expect("root was there a moment ago");
    kill_lab_process("killed");
    std::mem::forget(again);
    let out = run(&[], &["lab", "down", "--all"]);
    assert!(out.status.success());
    // `--all` also takes down any lab that was up before this test (CI once ran beside a
    // benchmark's lab), so nothing may be left that was not there before, and nothing of ours.
    let (ns, links) = netns_and_links("killed");
    assert!(
        ns.lines().all(|l| before.0.lines().any(|b| b == l)),
        "namespaces left: {ns}"
    );
    assert!(!ns.contains("bl-killed-"), "{ns}");
    assert!(
        links
            .split(' ')
            .all(|l| before.1.split(' ').any(|b| b == l)),
        "links left: {links}"
    );
    assert!(!std::path::Path::new("/run/bloatlab/labs/killed").exists());
    assert!(
        !std::env::temp_dir()
            .join("bloatlab-lab-killed.log")
            .exists(),
        "the killed lab's log is removed with it"
    );
}

/// The whole loop on the cable line: measure, locate, advise, apply (the emulator's CAKE on the
/// router), verify, report.
#[test]
fn demo_measures_locates_advises_applies_and_verifies() {
    let _g = serial();
    if unsafe { libc::geteuid() } != 0 {
        return missing("the demo needs root");
    }
    let before = netns_and_links("demo");
    let dir = tmp_path("demo");
    std::fs::create_dir_all(&dir).unwrap();
    let v = run_json(
        &[],
        &[
            "lab",
            "demo",
            "--json",
            "-q",
            "-l",
            "15",
            "--out-dir",
            dir.to_str().unwrap(),
        ],
    );
    let fifo_added = f(&v, "before.added_latency_ms");
    let cake_added = f(&v, "after.added_latency_ms");
    eprintln!(
        "demo: +{fifo_added:.1} -> +{cake_added:.1} ms; before {} after {}; {}",
        v["before"]["throughput_mbps"], v["after"]["throughput_mbps"], v["reason"]
    );
    // A 1000-packet FIFO at 4 Mbit/s holds 3 s; the upload alone keeps hundreds of ms in it.
    assert!(fifo_added > 100.0, "modem FIFO added only {fifo_added} ms");
    // The locate step names the modem: the link into hop 2 (the server), both ways, as cubic
    // (the lab hosts' congestion control) fills the downstream 0.2 s as well as the upstream 3 s.
    let verdict = &v["located"]["verdict"];
    assert_eq!(
        (verdict["hop"].as_u64(), verdict["direction"].as_str()),
        (Some(2), Some("both")),
        "{verdict}"
    );
    // Advice: 95% of what the download and upload alone measured (57 and 3.7 Mbit/s through
    // the 60/4 Mbit/s line with its DOCSIS framing), not of rrul's starved download.
    let (down_kbit, up_kbit) = (f(&v, "advice.down.rate_kbit"), f(&v, "advice.up.rate_kbit"));
    assert!(
        (50_000.0..57_000.0).contains(&down_kbit) && (3_300.0..3_800.0).contains(&up_kbit),
        "{down_kbit} / {up_kbit}"
    );
    // The download's ACKs would take 37% of that upload: CAKE filters the redundant ones there.
    assert_eq!(
        v["advice"]["up"]["ack_filter"], true,
        "{}",
        v["advice"]["up"]["reason"]
    );
    assert!(
        v["applied"]
            .as_str()
            .unwrap()
            .contains(&format!("cake bandwidth {up_kbit}kbit docsis ack-filter'")),
        "{}",
        v["applied"]
    );
    // Shaped below the line, the standing queue is gone: measured +6.0 ms against +680 (113x).
    assert!(
        cake_added * 10.0 < fifo_added,
        "CAKE at the advised rates added {cake_added} ms"
    );
    assert_eq!(v["kept"], true, "{}", v["reason"]);
    // The shaper's ceiling for payload is 1448/1518 of its rate (DOCSIS-framed full packets):
    // 51.8 Mbit/s at 54.3; measured 47.8, the rest going to CAKE's ingress-mode drops.
    let ceiling = down_kbit / 1000.0 * 1448.0 / 1518.0;
    assert!(
        f(&v, "after.throughput_mbps.down") > 0.85 * ceiling,
        "{} of a {ceiling:.1} Mbit/s ceiling",
        v["after"]["throughput_mbps"]
    );
    // Upload goodput: below the 4 Mbit/s line, yet moving in both runs. Measured 3.5 through
    // the FIFO (whose seconds of upload starve the download's ACKs: 4.7 Mbit/s down).
    for run in ["before", "after"] {
        let up = f(&v, &format!("{run}.throughput_mbps.up"));
        assert!(
            up > 1.0 && up < 4.0,
            "{run}: upload {up} Mbit/s on a 4 Mbit/s line"
        );
    }
    // Behind the shaper every download ACK the filter leaves costs 70 bytes of the upload's
    // rate (DOCSIS: 52 + 18; `ack_share`). Unfiltered, at one ACK per two segments, the upload's
    // payload
    // could have at most what they leave; the filter lets it have more (measured 2.5 Mbit/s
    // where that ceiling was 2.2; without the filter 1.6-1.9).
    let acks = bloatlab_tune::advise::ack_share(
        (f(&v, "after.throughput_mbps.down") * 1000.0) as u64,
        up_kbit as u64,
        bloatlab_tune::link::LinkType::Docsis,
    );
    let unfiltered = up_kbit / 1000.0 * (1.0 - acks) * 1448.0 / 1518.0;
    let up_after = f(&v, "after.throughput_mbps.up");
    assert!(
        up_after > unfiltered,
        "upload {up_after:.2} Mbit/s after: no more than unfiltered \
        ACKs would leave it ({unfiltered:.2})"
    );
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        names.iter().filter(|n| n.ends_with(".json.gz")).count(),
        4,
        "before, after and locate's two phases: {names:?}"
    );
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("bloatlab-locate-") && n.ends_with(".json"))
            .count(),
        1,
        "{names:?}"
    );
    let html: Vec<&String> = names.iter().filter(|n| n.ends_with(".html")).collect();
    assert_eq!(html.len(), 1, "the before/after report: {names:?}");
    let page = std::fs::read_to_string(dir.join(html[0])).unwrap();
    for heading in [
        "Verdict: kept",
        "Where the queue is",
        "Advice (bloatlab advise)",
        "Applied on `router`",
    ] {
        assert!(
            page.contains(&format!("<h2>{heading}")),
            "report lacks {heading}"
        );
    }
    assert_eq!(netns_and_links("demo"), before);
}

/// `lab compare` on the cable line: the modem's FIFO adds hundreds of ms; HTB+fq_codel and
/// CAKE at 95% on the router each bring best effort down to tens of ms at most. fq_codel
/// treats every probe class alike; CAKE's diffserv3 makes the CS1 probes wait behind the bulk
/// tin, whose threshold is 1/16 of the rate (one 1518-byte packet per 51 ms at 3.8/16 Mbit/s
/// upstream).
#[test]
fn compare_moves_the_queue_with_either_fix_and_cake_keeps_the_bulk_class_waiting() {
    let _g = serial();
    let _guest = without_guest();
    if unsafe { libc::geteuid() } != 0 {
        return missing("the lab needs root");
    }
    let before = netns_and_links("compare");
    let dir = tmp_path("compare");
    std::fs::create_dir_all(&dir).unwrap();
    let compare = |fixes: &str, dir: &std::path::Path| {
        run_json(
            &[],
            &[
                "lab",
                "compare",
                "cable",
                "--fix",
                fixes,
                "-l",
                "10",
                "--json",
                "-q",
                "--out-dir",
                dir.to_str().unwrap(),
            ],
        )
    };
    // Another experiment's lab under the name `lab compare` takes first: this one takes the
    // next free name, and leaves that lab up.
    let Some(first) = LabUp::up(
        "compare",
        "name='first'\n[[link]]\nname='l'\na='a'\nb='b'\n",
    ) else {
        return;
    };
    let v = compare("fifo,htb-fq_codel,cake", &dir);
    let (ns, _) = netns_and_links("compare");
    let first_host = format!("{}compare-a", bloatlab_lab::NS_PREFIX);
    assert!(ns.lines().any(|l| l.starts_with(&first_host)), "{ns}");
    drop(first);
    let runs = v["runs"].as_array().unwrap();
    let names: Vec<&str> = runs.iter().map(|r| r["fix"].as_str().unwrap()).collect();
    assert_eq!(names, ["fifo", "htb-fq_codel", "cake"]);
    let class_of = |run: &serde_json::Value, c: &str| {
        f(&run["summary"], &format!("added_latency_ms_by_class.{c}"))
    };
    let class = |i: usize, c: &str| class_of(&runs[i], c);
    // The probe classes' added delays, least first.
    let sorted = |run: &serde_json::Value| {
        let mut v = [
            class_of(run, "be"),
            class_of(run, "ef"),
            class_of(run, "bk"),
        ];
        v.sort_by(f64::total_cmp);
        v
    };
    eprintln!(
        "compare: {}",
        runs.iter()
            .map(|r| {
                let rate = |dir: &str| &r["summary"]["throughput_mbps"][dir];
                format!(
                    "{} {}, {} / {} Mbit/s",
                    r["fix"],
                    r["summary"]["added_latency_ms_by_class"],
                    rate("down"),
                    rate("up")
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    );
    // A 1000-packet FIFO at 4 Mbit/s holds 3 s; the upload keeps hundreds of ms in it.
    assert!(
        class(0, "be") > 100.0,
        "the line as is added only {} ms",
        class(0, "be")
    );
    // FQ-CoDel hashes flows into 1024 queues (RFC 8290): with 8 bulk flows each way a probe
    // flow shares a queue with one of them about once in 60 runs, and then waits in that flow's
    // CoDel queue (CI, 2026-11-27: best effort +44 ms, EF and CS1 +7.8). FQ-CoDel treats every
    // probe flow alike, so the middle one of the three stands for them; CAKE's set-associative
    // hash keeps them apart.
    let fq_probes = sorted(&runs[1]);
    // The endpoints and their TCP are this machine's, on the two cores CI's other workers use:
    // the probes' added delay grows with the machine's load (fq_codel's: +12.3 ms alone, +17.6
    // beside two busy loops, +20.6 and +22.3 in CI on a slow host; CAKE's +11.5, +21.7 and
    // +24.8). The bound is what tells a fix from none: a queue left in the modem's FIFO at
    // 4 Mbit/s is 3 ms a packet, hundreds of ms under the upload's 8 flows (the line as is:
    // +900). Load only ever adds delay, so a fix above the bound is measured once more and the
    // lower of its two runs counts; a fix that does not move the queue is above it both times.
    const BOUND_MS: f64 = 35.0;
    // Fix i alone, once at most (CAKE's may be wanted for its delay and for its share).
    let reruns: [std::cell::OnceCell<serde_json::Value>; 3] = Default::default();
    let rerun = |i: usize| {
        reruns[i].get_or_init(|| {
            let retry = tmp_path(&format!("compare-again-{i}"));
            std::fs::create_dir_all(&retry).unwrap();
            let v = compare(names[i], &retry);
            let _ = std::fs::remove_dir_all(&retry);
            v["runs"][0].clone()
        })
    };
    let again = |i: usize, added: f64| {
        if added < BOUND_MS {
            return added;
        }
        eprintln!("{}: best effort +{added} ms: measuring it again", names[i]);
        let run = rerun(i);
        let second = if i == 1 {
            sorted(run)[1]
        } else {
            class_of(run, "be")
        };
        eprintln!("{}: again +{second} ms", names[i]);
        added.min(second)
    };
    for i in [1, 2] {
        // Measured 9.8 (fq_codel) and 11.7 ms (CAKE) with 10 s loads.
        let added = again(i, if i == 1 { fq_probes[1] } else { class(i, "be") });
        assert!(added < BOUND_MS, "{}: best effort +{added} ms", names[i]);
        // Either fix shapes the download at 95% of 60 Mbit/s: 53 Mbit/s of goodput (measured).
        // Load only ever takes goodput away: beside CI's other three workers fq_codel carried
        // 41.0, 39.5 and 47.6 Mbit/s, and 39.5 was short again when measured once more. So a
        // fix short of the bound is measured once more, the higher run counts, and the bound is
        // half the line: what tells a shaper near the line's rate from one off by a factor (the
        // upload's rate, bytes for bits, half of it), which is how a rate goes wrong.
        const HALF_THE_LINE_MBPS: f64 = 30.0;
        let down = |run: &serde_json::Value| f(&run["summary"], "throughput_mbps.down");
        let mut carried = down(&runs[i]);
        if carried <= HALF_THE_LINE_MBPS {
            eprintln!("{}: {carried} Mbit/s down: measuring it again", names[i]);
            carried = carried.max(down(rerun(i)));
        }
        assert!(
            carried > HALF_THE_LINE_MBPS,
            "{}: {carried} Mbit/s down; first run {}",
            names[i],
            runs[i]["summary"]["throughput_mbps"]
        );
    }
    assert!(
        fq_probes[1] - fq_probes[0] < 5.0 || fq_probes[2] - fq_probes[1] < 5.0,
        "fq_codel has no classes: its probe flows {fq_probes:?} ms"
    );
    // What the line carried over the 10 s of load, as a share of its 60 / 4 Mbit/s (IP bytes
    // and the preset's 18 of framing each, as its rate counts them). As is, the upload keeps
    // the line busy (no more than its rate: within the sampling's 100 ms) while the download's
    // ACKs wait seconds behind it. CAKE shapes at 95% of the rate counting the same framing
    // (`docsis`), less TCP's start. Measured: as is 10% / 100%, CAKE 94% / 95%; goodput 90% /
    // 52% of it (the upload's share of the line holds the download's ACKs).
    let carried = |i: usize, dir: &str| f(&runs[i], &format!("line_carried.{dir}"));
    eprintln!(
        "line carried: as is {:.3} / {:.3}; cake {:.3} / {:.3}",
        carried(0, "down"),
        carried(0, "up"),
        carried(2, "down"),
        carried(2, "up")
    );
    assert!((0.95..=1.02).contains(&carried(0, "up")));
    // Load only takes rate away: beside CI's other workers on a slow hour the flows filled
    // 84.6% of the line through CAKE, on a slower host 83.6% and then 82.5% (92-94% alone). A
    // run under 85% either way is measured once more, the run whose lesser direction carried
    // more counts, and it may read down to 80%: what tells CAKE at 95% of the line from a
    // shaper at four fifths of it or below.
    let least =
        |run: &serde_json::Value| f(run, "line_carried.down").min(f(run, "line_carried.up"));
    let mut cake = runs[2].clone();
    if least(&cake) < 0.85 {
        eprintln!(
            "cake carried {:.3} at least: measuring it again",
            least(&cake)
        );
        let again = rerun(2);
        eprintln!("cake: again {:.3}", least(again));
        if least(again) > least(&cake) {
            cake = again.clone();
        }
    }
    for dir in ["down", "up"] {
        let carried = f(&cake, &format!("line_carried.{dir}"));
        assert!((0.80..=0.97).contains(&carried), "cake {dir}: {carried}");
        let goodput = f(&cake["summary"], &format!("throughput_mbps.{dir}")) * 1e6
            / f(&cake, &format!("capacity_bps.{dir}"));
        assert!(goodput < carried, "{dir}: goodput {goodput}");
    }
    // Measured +75 ms for CS1 against +11.7 for best effort.
    assert!(
        class(2, "bk") > class(2, "be") + 20.0,
        "CAKE's bulk tin: {} vs {}",
        class(2, "bk"),
        class(2, "be")
    );
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(
        files.iter().filter(|n| n.ends_with(".json.gz")).count(),
        3,
        "{files:?}"
    );
    assert_eq!(
        files.iter().filter(|n| n.ends_with(".html")).count(),
        1,
        "{files:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(netns_and_links("compare"), before);
}

#[test]
fn lab_run_passes_the_exit_code_and_tears_down() {
    let _g = serial();
    if unsafe { libc::geteuid() } != 0 {
        return missing("lab tests need root");
    }
    let before = netns_and_links("runlab");
    // Another lab up beside it (as CI's other test binaries have theirs): `lab exec` without
    // --lab must still take the lab it runs in, not say that several are up.
    let Some(_other) = LabUp::up("runother", ONE_LINK) else {
        return;
    };
    let file = tmp_path("run.toml");
    std::fs::write(&file, ONE_LINK.replace("\"one\"", "\"runlab\"")).unwrap();
    // The command finds the lab through BLOATLAB_LAB_SOCKET and runs inside one of its hosts.
    let script = format!("{BIN} lab exec c -- ip -o addr show dev l | grep -q 10.77.0.1 && exit 3");
    let out = run(
        &[],
        &[
            "lab",
            "run",
            file.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(netns_and_links("runlab"), before);
}

/// `test marks` through a lab whose second link is an ISP edge that bleaches DSCP on the way in
/// and rewrites ECT(1) to ECT(0) on the way out (as `dscp` and `ecn_path` make it): the test
/// names both and nothing else; with the link's marks kept again, every mark is kept.
#[test]
fn test_marks_names_a_bleaching_isp_and_an_ect1_rewrite_and_a_clean_path() {
    let _g = serial();
    let topo = "name='marks'\n\
        [[link]]\nname='lan'\na='client'\nb='router'\n\
        [[link]]\nname='wan'\na='router'\nb='isp'\n\
        down={dscp='bleach'}\nup={ecn_path='ect1>ect0'}\n\
        [[link]]\nname='core'\na='isp'\nb='server'\n\
        [host.router]\nicmp_ratelimit=0\n[host.isp]\nicmp_ratelimit=0\n\
        [host.server]\nicmp_ratelimit=0\n";
    let Some(lab) = LabUp::up("marks", topo) else {
        return;
    };
    let _srv = lab.server("server");
    let codes = |s: &serde_json::Value| -> Vec<String> {
        s["marks"]["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["code"].as_str().unwrap().to_string())
            .collect()
    };
    for host in ["10.77.2.2", "fd77:0:0:2::2"] {
        let s = lab.test("client", &["marks", host, "--rounds", "2"]);
        let m = &s["marks"];
        for f in m["down"].as_array().unwrap() {
            let want = if f["sent"].as_u64().unwrap() >> 2 == 0 {
                "kept"
            } else {
                "bleached"
            };
            assert_eq!(f["dscp"]["fate"], want, "{host} down: {f}");
            assert_eq!(f["ecn"]["fate"], "kept", "{host} down: {f}");
        }
        for f in m["up"].as_array().unwrap() {
            assert_eq!(f["dscp"]["fate"], "kept", "{host} up: {f}");
            let ecn = f["sent"].as_u64().unwrap() & 3;
            if ecn == 1 {
                assert_eq!(
                    (&f["ecn"]["fate"], &f["ecn"]["to"]),
                    (&"remapped".into(), &"ect0".into()),
                    "{host} up: {f}"
                );
            } else {
                assert_eq!(f["ecn"]["fate"], "kept", "{host} up: {f}");
            }
        }
        assert_eq!(
            codes(&s),
            ["dscp_bleached_down", "ect1_rewritten_up", "ecn_through"],
            "{host}: {}",
            m["verdicts"]
        );
    }
    // Every test's probes tell the same: rrul's EF and BK probes come back as CS0.
    let s = lab.test("client", &["rrul", "10.77.2.2", "-l", "2", "--idle", "1"]);
    assert_eq!(codes(&s)[0], "dscp_bleached_down", "{}", s["marks"]);
    lab.set("wan", &["dscp=keep", "ecn_path=keep", "--dir", "both"]);
    let s = lab.test("client", &["marks", "10.77.2.2", "--rounds", "1"]);
    assert_eq!(
        codes(&s),
        ["dscp_kept", "ecn_through", "ect1_through"],
        "{}",
        s["marks"]
    );
    // Bleached on the way out at the ISP's edge: hop 1 (the router) quotes the marks as sent,
    // hop 2 (the ISP) and the server bleached. One TTL-limited walk per DSCP names hop 2.
    lab.set("wan", &["dscp=bleach", "--dir", "up"]);
    for host in ["10.77.2.2", "fd77:0:0:2::2"] {
        let s = lab.test("client", &["marks", host, "--rounds", "1", "--locate"]);
        let m = &s["marks"];
        let changes = m["changes"].as_array().unwrap();
        assert_eq!(
            changes.len(),
            9,
            "{host}: one per DSCP but CS0: {}",
            m["changes"]
        );
        for c in changes {
            assert_eq!(
                (&c["field"], &c["arrived"], &c["hop"], &c["last_as_sent"]),
                (&"dscp".into(), &"BE".into(), &2.into(), &1.into()),
                "{host}: {c}"
            );
        }
        let hops = m["hops"].as_array().unwrap();
        assert_eq!(hops.len(), 3, "{host}: router, ISP, server: {}", m["hops"]);
        // TCP's SYNs cross the same edge: bleached too, but CS0.
        for f in m["tcp_up"].as_array().unwrap() {
            let want = if f["sent"] == 0 { "kept" } else { "bleached" };
            assert_eq!(f["dscp"]["fate"], want, "{host}: {f}");
        }
        assert_eq!(hops[2]["destination"], true);
        let said = codes(&s);
        assert!(said.contains(&"dscp_bleached_up".to_string()), "{said:?}");
        assert!(
            said.contains(&"dscp_changed_at_hop".to_string()),
            "{said:?}"
        );
    }
}

/// The `l4s` preset: a TCP download without ECN and one with ECN share DualPI2's classic queue,
/// whose PI holds it near its 15 ms target by dropping the one and marking the other (p'^2
/// each); meanwhile `test marks` sees its ECT(1) probes take the L queue and come back CE far
/// more often than its ECT(0) ones (the coupling: k p' = 2p' against p'^2).
#[test]
fn l4s_preset_dualpi2_drops_classic_marks_ecn_and_couples_the_l_queue() {
    let _g = serial();
    let Some(lab) = LabUp::preset("l4s", "l4s") else {
        return;
    };
    let _srv = lab.server("server");
    // Four flows each: enough for p' of several percent, so 100 ECT(1) probes see its coupled
    // marks (two flows held p' near 2%: two CE in 50).
    let down = [
        "tcp-down",
        "10.77.2.2",
        "-l",
        "12",
        "--idle",
        "1",
        "--flows",
        "4",
    ];
    let (classic, ecn, marks) = std::thread::scope(|s| {
        let a = s.spawn(|| lab.test("classic", &down));
        let b = s.spawn(|| lab.test("ecn", &down));
        std::thread::sleep(std::time::Duration::from_secs(5));
        let m = lab.test(
            "classic",
            &[
                "marks",
                "10.77.2.2",
                "--dscps",
                "CS0",
                "--ecn",
                "ect1,ect0",
                "--rounds",
                "100",
            ],
        );
        (a.join().unwrap(), b.join().unwrap(), m)
    });
    let (c, e) = (
        f(&classic, "throughput_mbps.down"),
        f(&ecn, "throughput_mbps.down"),
    );
    assert!(c + e > 16.0 && c > 4.0 && e > 4.0, "{c} + {e} Mbit/s of 20");
    let line = &lab.stats()["links"]["line"]["down"];
    assert!(
        line["ecn_marks"].as_u64().unwrap() > 0 && line["drops"]["aqm"].as_u64().unwrap() > 0,
        "the ECN flow marked, the other dropped: {line}"
    );
    let ce = |ecn_sent: u64| -> u64 {
        let f = marks["marks"]["down"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["sent"].as_u64() == Some(ecn_sent))
            .unwrap()
            .clone();
        f["ecn"]["ce"].as_u64().unwrap_or(0)
    };
    let (l, classic_ce) = (ce(1), ce(2));
    eprintln!("CE on 100 ECT(1) probes {l}, on 100 ECT(0) {classic_ce}; {c} + {e} Mbit/s");
    assert!(
        l >= 5 && l > 3 * classic_ce,
        "CE on 100 ECT(1) probes {l}, on ECT(0) {classic_ce}"
    );
}

/// A UDP load (and its probes) sent ECT(0) at 1.5 times a 10 Mbit/s link into FQ-CoDel with
/// ECN: CoDel marks instead of dropping, and the CE marks the server counted are the lab's own
/// mark count (within 5%: a packet marked and still in flight at the end is the only
/// difference).
#[test]
fn ce_marks_the_server_counts_are_the_ones_fq_codel_set() {
    let _g = serial();
    let topo = "name='ce'\n[[link]]\nname='l'\na='client'\nb='server'\n\
        up={rate='10mbit', qdisc='fq_codel'}\n";
    let Some(lab) = LabUp::up("ce", topo) else {
        return;
    };
    let _srv = lab.server("server");
    let s = lab.test(
        "client",
        &[
            "udp",
            "10.77.0.2",
            "--rate",
            "15mbit",
            "--ecn",
            "ect0",
            "-l",
            "3",
            "--idle",
            "0.5",
        ],
    );
    // The load's CE and its probes' (ECN-capable too, in a flow of their own), on the way up.
    let probes_ce: u64 = s["marks"]["up"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["ecn"]["ce"].as_u64())
        .sum();
    let ce = s["udp"]["ce"].as_u64().unwrap() + probes_ce;
    let up = &lab.stats()["links"]["l"]["up"];
    let marks = up["ecn_marks"].as_u64().unwrap();
    assert!(
        marks > 100 && (ce as f64 - marks as f64).abs() <= 0.05 * marks as f64,
        "server counted {ce} CE, the lab marked {marks}: {up}"
    );
    assert_eq!(
        up["drops"]["aqm"], 0,
        "ECT packets are marked, not dropped: {up}"
    );
}

/// `--tcp-ecn`: the client's TCP asks for ECN through a host route with `features ecn` (its
/// namespace keeps Linux's default, 2: accept, never ask), so FQ-CoDel with ECN marks the
/// download instead of dropping; without it, it drops. The route is gone after the test.
#[test]
fn tcp_ecn_route_makes_fq_codel_mark_instead_of_drop() {
    let _g = serial();
    let topo = "name='tcpecn'\n[[link]]\nname='l'\na='client'\nb='server'\n\
        down={rate='20mbit', qdisc='fq_codel'}\n";
    let Some(lab) = LabUp::up("tcpecn", topo) else {
        return;
    };
    let _srv = lab.server("server");
    let down = |extra: &[&str]| {
        let mut args = vec![
            "tcp-down",
            "10.77.0.2",
            "-l",
            "4",
            "--idle",
            "1",
            "--flows",
            "2",
        ];
        args.extend_from_slice(extra);
        lab.test("client", &args);
        let d = lab.stats()["links"]["l"]["down"].clone();
        (
            d["ecn_marks"].as_u64().unwrap(),
            d["drops"]["aqm"].as_u64().unwrap(),
        )
    };
    let (marks0, drops0) = down(&[]);
    assert!(
        marks0 == 0 && drops0 > 0,
        "without: {marks0} marks, {drops0} drops"
    );
    let (marks1, drops1) = down(&["--tcp-ecn"]);
    // Retransmissions leave Not-ECT (RFC 3168 6.1.5) and may still be dropped: a few.
    assert!(
        marks1 > 20 && (drops1 - drops0) * 10 <= marks1,
        "with --tcp-ecn: {} marks, {} drops more",
        marks1,
        drops1 - drops0
    );
    let p = lab.exec("client");
    let mut args: Vec<&str> = p.iter().map(String::as_str).collect();
    args.extend(["ip", "route", "show", "10.77.0.2/32"]);
    let out = std::process::Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap();
    assert!(out.stdout.is_empty(), "the route stayed: {:?}", out);
}
