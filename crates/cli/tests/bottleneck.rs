//! The measurements against a real kernel bottleneck: client - router - server namespaces with
//! HTB 20 Mbit/s down / 5 Mbit/s up and a pfifo on the router's egress. Expected values are the
//! physics of those queues, not snapshots of earlier runs.

use crate::common::*;

const DOWN_MBPS: f64 = 20.0;
const UP_MBPS: f64 = 5.0;
/// One full-size frame on the veth as the pfifo counts it (1500 B IP + 14 B Ethernet).
const FRAME_BITS: f64 = 1514.0 * 8.0;

/// Seconds a full pfifo of `limit` frames takes to drain at `mbps`.
fn fifo_delay_s(limit: u32, mbps: f64) -> f64 {
    limit as f64 * FRAME_BITS / (mbps * 1e6)
}

fn topo(tag: &str, limit: u32) -> Option<Topo> {
    match Topo::up(tag, limit, "20mbit", "5mbit") {
        Ok(t) => Some(t),
        Err(why) => {
            missing(&why);
            None
        }
    }
}

fn measure(t: &Topo, args: &[&str]) -> serde_json::Value {
    measure_file(t, args).0
}

/// The summary and the whole result file of one test.
fn measure_file(t: &Topo, args: &[&str]) -> (serde_json::Value, bloatlab_result::ResultFile) {
    let out_file = tmp_path(&format!("{}.json", args.join("_").replace(['/', ' '], "")));
    let mut all = vec!["test"];
    all.extend_from_slice(args);
    all.extend_from_slice(&[SRV_ADDR, "--json", "-q", "-o", out_file.to_str().unwrap()]);
    let out = run(&t.exec(&t.cli), &all);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = json(&out);
    eprintln!(
        "{args:?}: down {} up {} Mbit/s, idle p50 {} loaded p50 {} ms, grade {}, RPM {} (foreign {}, loaded {})",
        s["throughput_mbps"]["down"],
        s["throughput_mbps"]["up"],
        s["latency_ms"]["idle"]["p50"],
        s["latency_ms"]["loaded"]["p50"],
        s["grade"],
        s["rpm"]["rpm"],
        s["rpm"]["foreign"],
        s["rpm"]["loaded"]
    );
    let file = bloatlab_result::read(&out_file).unwrap();
    let _ = std::fs::remove_file(&out_file);
    (s, file)
}

#[test]
fn goodput_matches_the_htb_rate_in_each_direction() {
    let _g = serial();
    let Some(t) = topo("g", 1000) else { return };
    let _srv = t.server();
    let (down, down_file) =
        measure_file(&t, &["tcp-down", "--flows", "4", "-l", "12", "--idle", "1"]);
    let mbps = f(&down, "throughput_mbps.down");
    // Goodput is the TCP payload: 1448 of every 1514 bytes on the wire, 95.6% of the rate.
    assert!(
        (mbps - DOWN_MBPS).abs() <= 0.1 * DOWN_MBPS,
        "tcp-down {mbps} Mbit/s vs HTB 20"
    );
    // No fairness bound: flows sharing a deep FIFO split it unevenly (BBR very much so, cubic
    // too over 12 s); every flow must still have moved data.
    for flow in down["throughput_mbps"]["per_flow"].as_array().unwrap() {
        assert!(flow["mbps"].as_f64().unwrap() > 0.1, "{flow}");
    }

    // No sample reads a rate the line cannot carry in a step. Sampled the moment it was taken
    // in, a flow's first sample once credited what arrived since its handshake to 1 us:
    // 104 224 Mbit/s. The bound leaves room for a sampler that waited for a core (10 ms
    // samples of a kernel-shaped download reach 2-3x the rate at p99).
    for s in down_file
        .series
        .iter()
        .filter(|s| s.name.starts_with("tcp down"))
    {
        let top = s.samples.iter().filter_map(|x| x.1).fold(0.0, f64::max);
        assert!(
            top < 25.0 * DOWN_MBPS,
            "{}: a sample of {top} Mbit/s through {DOWN_MBPS} Mbit/s",
            s.name
        );
    }

    // The download's rate is what the client acknowledged (the server's TCP_INFO): summed over
    // the flows per 10 ms step its 99th percentile stays near the line's 19.1 Mbit/s of
    // payload, where the receiver's reads, bunched behind each filled hole, reach 2-3x it.
    let load = down_file
        .metadata
        .phases
        .iter()
        .find(|p| p.name == "load")
        .unwrap();
    let step = down_file.metadata.step;
    let p99_of_sum = |kind: bloatlab_result::SeriesKind| {
        let mut per_step = std::collections::BTreeMap::<i64, f64>::new();
        let series = down_file.series.iter().filter(|s| s.kind == kind);
        for s in series.filter(|s| s.direction.as_deref() == Some("down")) {
            for (t, v) in s
                .samples
                .iter()
                .filter(|x| x.0 > load.start + 2.0 && x.0 < load.end)
            {
                *per_step.entry((t / step).round() as i64).or_default() += v.unwrap_or(0.0);
            }
        }
        let mut v: Vec<f64> = per_step.into_values().collect();
        v.sort_by(f64::total_cmp);
        assert!(v.len() > 100, "{kind:?}: {} steps", v.len());
        v[v.len() * 99 / 100]
    };
    let acked = p99_of_sum(bloatlab_result::SeriesKind::Throughput);
    let received = p99_of_sum(bloatlab_result::SeriesKind::Received);
    eprintln!("download per 10 ms, p99: acknowledged {acked} Mbit/s, received {received}");
    assert!(
        acked <= 1.25 * DOWN_MBPS,
        "acknowledged download p99 {acked} Mbit/s through {DOWN_MBPS} (received: {received})"
    );

    let (up, up_file) = measure_file(&t, &["tcp-up", "--flows", "4", "-l", "12", "--idle", "1"]);
    let mbps = f(&up, "throughput_mbps.up");
    assert!(
        (mbps - UP_MBPS).abs() <= 0.1 * UP_MBPS,
        "tcp-up {mbps} Mbit/s vs HTB 5"
    );

    // The loaded direction's queue is the whole added round trip: its added one-way delay
    // matches the added RTT (measured 23.4 vs 23.4 ms down, 265.1 vs 265.0 up with BBR; cubic fills
    // them further), is no
    // more than its FIFO can hold (0.6 s down, 2.4 s up), and the other direction, carrying only
    // ACKs, adds nothing. No clock offset is involved.
    for (s, dir, other, limit_s) in [
        (&down, "down", "up", fifo_delay_s(1000, DOWN_MBPS)),
        (&up, "up", "down", fifo_delay_s(1000, UP_MBPS)),
    ] {
        let added = f(s, &format!("added_owd_ms.{dir}.p50"));
        let rtt_added = f(s, "added_latency_ms");
        assert!(
            (added - rtt_added).abs() <= (0.05 * rtt_added).max(2.0),
            "{dir}: added one-way {added} ms, added RTT {rtt_added} ms"
        );
        assert!(
            added > 5.0 && added <= 1000.0 * limit_s + 20.0,
            "{dir}: added one-way {added} ms, FIFO holds {limit_s} s"
        );
        assert!(
            f(s, &format!("added_owd_ms.{other}.p50")) < 5.0,
            "{}",
            s["added_owd_ms"]
        );
        assert_eq!(s["bloat_direction"], dir, "{}", s["added_owd_ms"]);
    }
    // Client and server read this machine's one monotonic clock (from different origins): the
    // drift between them is 0, and the veths' round trips bound the offset to well under 1 ms.
    // A drift is estimated only from probes that found the queues drained while settling. The
    // flows close with a reset, so the download's FIFO (0.6 s) drains within the settling time
    // (a graceful close kept the socket buffers sending into it). The upload's holds 2.4 s,
    // more than the settling: filled by cubic, it may still hold probes at the end.
    for (file, limit_s) in [
        (&down_file, fifo_delay_s(1000, DOWN_MBPS)),
        (&up_file, fifo_delay_s(1000, UP_MBPS)),
    ] {
        let o = file.metadata.clock_offset.expect("a clock offset");
        assert!(o.uncertainty_ms < 1.0, "{o:?}");
        if limit_s < bloatlab_measure::plan::SETTLE_S {
            assert!(
                o.drift_ppm.is_some(),
                "the queues drained while settling: a drift estimate"
            );
        }
        if let Some(drift) = o.drift_ppm {
            assert!(drift.abs() < 5.0, "one clock, yet a drift of {drift} ppm");
        }
    }
}

#[test]
fn rrul_shows_the_bloat_a_deep_fifo_implies_and_a_short_one_avoids() {
    let _g = serial();
    let Some(t) = topo("r", 1000) else { return };
    let _srv = t.server();
    let deep = measure(&t, &["rrul", "--cc", "cubic", "-l", "20", "--idle", "2"]);
    let idle = f(&deep, "latency_ms.idle.p50");
    let loaded = f(&deep, "latency_ms.loaded.p50");
    // Both FIFOs fill under rrul: a round trip waits in at most both of them (0.6 s + 2.4 s);
    // the download FIFO alone is 0.6 s, and loss-based cubic keeps it mostly full.
    let most = (fifo_delay_s(1000, DOWN_MBPS) + fifo_delay_s(1000, UP_MBPS)) * 1e3;
    assert!(idle < 5.0, "idle RTT through veths {idle} ms");
    assert!(
        loaded > 300.0 && loaded <= most + 50.0,
        "rrul loaded p50 {loaded} ms, buffers allow at most {most} ms"
    );
    assert!(f(&deep, "added_latency_ms") > 250.0);
    assert!(
        matches!(deep["grade"].as_str(), Some("F" | "D")),
        "grade {}",
        deep["grade"]
    );
    // Download ACKs wait in the bloated upload queue: the download slows, but it still runs.
    assert!(
        f(&deep, "throughput_mbps.down") > 5.0 && f(&deep, "throughput_mbps.up") > 3.0,
        "{}",
        deep["throughput_mbps"]
    );

    t.reshape(30, "20mbit", "5mbit").unwrap();
    // 30-packet FIFOs are full within the first second: 10 s of load show what 20 s would.
    let short = measure(&t, &["rrul", "--cc", "cubic", "-l", "10", "--idle", "2"]);
    let loaded_short = f(&short, "latency_ms.loaded.p50");
    let bound = (fifo_delay_s(30, DOWN_MBPS) + fifo_delay_s(30, UP_MBPS)) * 1e3;
    assert!(
        loaded_short < bound + 5.0,
        "pfifo 30: loaded p50 {loaded_short} ms, buffers hold {bound} ms"
    );
    assert!(
        loaded_short * 10.0 <= loaded,
        "pfifo 30 {loaded_short} ms is not 10x below pfifo 1000 {loaded} ms"
    );
}

/// Sixteen flows through deep FIFOs: once the first upload flows fill the 2.4 s upload queue,
/// every later handshake waits behind it. Opening the flows one after another inside the
/// sampling loop once took the whole load phase and reported 0.0 Mbit/s both ways; the flows
/// now open concurrently while sampling goes on.
#[test]
fn tcp_bidir_through_deep_fifos_samples_throughout_and_moves_data_both_ways() {
    let _g = serial();
    let Some(t) = topo("b", 1000) else { return };
    let _srv = t.server();
    let (s, file) = measure_file(
        &t,
        &[
            "tcp-bidir",
            "--flows",
            "8",
            "--cc",
            "cubic",
            "-l",
            "10",
            "--idle",
            "1",
        ],
    );
    let load = file
        .metadata
        .phases
        .iter()
        .find(|p| p.name == "load")
        .expect("a load phase");
    // Every flow started, inside the load phase.
    assert_eq!(file.metadata.flows.len(), 16);
    for flow in &file.metadata.flows {
        let start = flow
            .start
            .unwrap_or_else(|| panic!("{} never started: {:?}", flow.name, flow.error));
        assert!(
            start >= load.start && start < load.end,
            "{} started at {start} s, load {}-{} s",
            flow.name,
            load.start,
            load.end
        );
    }
    // No gap in sampling longer than a few steps (10 ms) during the load.
    let mut times: Vec<f64> = file
        .series
        .iter()
        .filter(|x| x.name.starts_with("tcp "))
        .flat_map(|x| x.samples.iter().map(|s| s.0))
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    assert!(
        times.first().is_some_and(|t| *t < load.start + 0.5),
        "first sample at {:?}, load from {}",
        times.first(),
        load.start
    );
    let gap = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    assert!(gap < 0.1, "the sampler stalled for {gap} s");
    // Goodput is payload: at most the HTB rates. Each direction's ACKs wait in the other's
    // full FIFO (0.6 s and 2.4 s), so neither runs at its rate: measured 8.3-8.9 down and
    // 3.4-3.5 up (the old sampler: 0.0 both ways).
    let (down, up) = (f(&s, "throughput_mbps.down"), f(&s, "throughput_mbps.up"));
    assert!(
        down > 0.25 * DOWN_MBPS && down <= DOWN_MBPS,
        "down {down} Mbit/s through HTB 20"
    );
    assert!(
        up > 0.5 * UP_MBPS && up <= UP_MBPS,
        "up {up} Mbit/s through HTB 5"
    );
}

#[test]
fn voip_over_an_idle_path_is_clean() {
    let _g = serial();
    let Some(t) = topo("v", 1000) else { return };
    let _srv = t.server();
    let s = measure(&t, &["voip", "-l", "8", "--idle", "0"]);
    let mos = f(&s, "voip.mos");
    assert!(mos > 4.0, "MOS {mos}: {}", s["voip"]);
    assert!(f(&s, "loss.percent") < 1.0, "{}", s["loss"]);
}

/// RPM through the same line with deep and with short FIFOs. A round trip under load waits in
/// both queues: up to 0.6 + 2.4 s with 1000 packets, 18 + 73 ms with 30. Probes ride with the
/// draft's load (one more connection each way per second, up to 16), so responsiveness is far
/// below idle through the deep FIFOs and near the short FIFOs' bound through the short ones.
#[test]
fn rpm_through_deep_fifos_is_far_below_idle_and_through_short_ones_near_their_bound() {
    let _g = serial();
    let Some(t) = topo("p", 1000) else { return };
    let _srv = t.server();
    let (deep, deep_file) = measure_file(&t, &["rpm", "--cc", "cubic", "-l", "15", "--idle", "2"]);
    let rpm_deep = f(&deep, "rpm.rpm");
    let idle_rpm = f(&deep, "rpm.idle");
    // Idle: a handshake and a request through veths, well under 2 ms each.
    assert!(idle_rpm > 30_000.0, "idle RPM {idle_rpm}");
    // Deep FIFOs: every probe waits hundreds of ms; 60000 / 200 ms = 300 RPM ("poor").
    assert!(
        rpm_deep < 300.0 && rpm_deep * 50.0 < idle_rpm,
        "deep FIFOs: {} RPM, idle {idle_rpm}",
        rpm_deep
    );
    let deep_run = deep_file
        .metadata
        .rpm
        .as_ref()
        .expect("the draft's run is recorded");
    assert!(
        deep_run.intervals.len() >= 10,
        "the draft's intervals are recorded"
    );
    // With the connections each had: the ramp opens one more per direction each interval.
    let counts: Vec<u32> = deep_run
        .intervals
        .iter()
        .map(|i| i.load_connections.expect("load connections recorded"))
        .collect();
    assert!(
        counts.windows(2).all(|w| w[1] >= w[0]) && counts[counts.len() - 1] >= counts[0] + 5,
        "load connections per interval {counts:?}"
    );

    t.reshape(30, "20mbit", "5mbit").unwrap();
    let (short, short_file) =
        measure_file(&t, &["rpm", "--cc", "cubic", "-l", "15", "--idle", "2"]);
    let rpm_short = f(&short, "rpm.rpm");
    // A handshake waits at most in both full short FIFOs: 18 + 73 = 91 ms. The means also carry
    // the tail drops of 30-packet FIFOs under 32 cubic flows (a lost SYN costs 1 s: measured
    // foreign 390 RPM, a mean of 154 ms), so the bound holds for the median.
    let bound_ms = (fifo_delay_s(30, DOWN_MBPS) + fifo_delay_s(30, UP_MBPS)) * 1e3;
    let median = median_handshake_under_load(&short_file);
    assert!(
        median <= bound_ms + 10.0,
        "short FIFOs: median handshake {median} ms, both queues hold {bound_ms} ms"
    );
    // Through the deep FIFOs a handshake waits in queues up to 33 times longer.
    let deep_median = median_handshake_under_load(&deep_file);
    assert!(
        deep_median > 4.0 * median,
        "median handshake: deep FIFOs {deep_median} ms, short ones {median} ms"
    );
    // The means carry those losses too: short-FIFO RPM measured 185-408 against 51-60 deep
    // (once the load ran on for its last probes' answers).
    assert!(
        rpm_short > 2.0 * rpm_deep,
        "short FIFOs {rpm_short} RPM, deep {rpm_deep} RPM"
    );
    for s in [&deep, &short] {
        assert!(
            s["rpm"]["probe_timeouts"].as_u64().is_some(),
            "{}",
            s["rpm"]
        );
        assert!(
            matches!(
                s["rpm"]["confidence"].as_str(),
                Some("low" | "medium" | "high")
            ),
            "{}",
            s["rpm"]
        );
    }
}

/// The median TCP handshake of the foreign probes sent from 5 s into the load (the ramp has
/// filled the queues) to its end.
fn median_handshake_under_load(file: &bloatlab_result::ResultFile) -> f64 {
    let load = file
        .metadata
        .phases
        .iter()
        .find(|p| p.name == "load")
        .unwrap();
    let mut connects: Vec<f64> = file
        .series("rpm foreign-connect")
        .unwrap()
        .samples
        .iter()
        .filter(|s| s.0 > load.start + 5.0 && s.0 < load.end)
        .filter_map(|s| s.1)
        .collect();
    connects.sort_by(f64::total_cmp);
    eprintln!(
        "median handshake under load {} ms",
        connects[connects.len() / 2]
    );
    connects[connects.len() / 2]
}

/// A call under 4 + 4 bulk flows: through 1000-packet FIFOs its packets wait up to 0.6 s down
/// and 2.4 s up, which the E-model's delay impairment punishes; through 30-packet FIFOs the
/// mouth-to-ear delay stays near 100 ms and the call is fine despite some tail drops.
#[test]
fn voip_under_load_is_worse_through_deep_fifos_than_through_short_ones() {
    let _g = serial();
    let Some(t) = topo("w", 1000) else { return };
    let _srv = t.server();
    let deep = measure(
        &t,
        &[
            "voip",
            "--under-load",
            "--cc",
            "cubic",
            "-l",
            "12",
            "--idle",
            "2",
        ],
    );
    t.reshape(30, "20mbit", "5mbit").unwrap();
    // The short FIFOs fill at once: 8 s of the call under load suffice there.
    let short = measure(
        &t,
        &[
            "voip",
            "--under-load",
            "--cc",
            "cubic",
            "-l",
            "8",
            "--idle",
            "2",
        ],
    );
    let (mos_deep, mos_short) = (f(&deep, "voip.mos"), f(&short, "voip.mos"));
    assert!(
        mos_deep < 3.0,
        "deep FIFOs: MOS {mos_deep} ({})",
        deep["voip"]
    );
    assert!(
        mos_short > mos_deep + 0.8,
        "short FIFOs: MOS {mos_short}, deep {mos_deep} ({})",
        short["voip"]
    );
    // The deep case's worse direction is the one whose FIFO drains slowest: up (2.4 s).
    assert!(
        f(&deep, "voip.mouth_to_ear_up_ms") > f(&short, "voip.mouth_to_ear_up_ms") + 200.0,
        "{} vs {}",
        deep["voip"],
        short["voip"]
    );
}

/// `tc -j qdisc show` of every device in a namespace.
fn qdiscs(ns: &str) -> String {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns, "tc", "-j", "qdisc", "show"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The issue's line: 35 / 7 Mbit/s behind 600-packet FIFOs, where rrul's download starves
/// behind the upload's queue. `bloatlab fix` on the client's interface towards the line keeps
/// a change that cuts rrul's added latency 10x or more with 80% of the line's download, and
/// `tune rollback` restores the qdiscs exactly. Bad input is refused before any load.
#[test]
fn fix_on_a_kernel_bottleneck_keeps_a_tenfold_cut_and_rollback_restores_tc() {
    let _g = serial();
    let t = match Topo::up("fix", 600, "35mbit", "7mbit") {
        Ok(t) => t,
        Err(why) => return missing(&why),
    };
    let _srv = t.server();
    let dir = tmp_path("fix");
    let dir_s = dir.to_str().unwrap();
    let fix = |extra: &[&str]| {
        let mut args = vec!["fix", SRV_ADDR, "--netns", &t.cli, "-q", "--out-dir", dir_s];
        args.extend_from_slice(extra);
        run(&[], &args)
    };
    // Refused before anything is measured: no such device, one someone configured, not root.
    let start = std::time::Instant::now();
    let o = fix(&["--dev", "nosuch0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no interface nosuch0"));
    sh(&[
        "ip", "netns", "exec", &t.cli, "tc", "qdisc", "add", "dev", "c0", "root", "pfifo",
    ])
    .unwrap();
    let o = fix(&["--dev", "c0"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("already has a qdisc configuration"));
    sh(&[
        "ip", "netns", "exec", &t.cli, "tc", "qdisc", "del", "dev", "c0", "root",
    ])
    .unwrap();
    let mut nobody = vec![
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
    ];
    nobody.extend(["--inh-caps=-all"]);
    let o = run(&nobody, &["fix", SRV_ADDR, "--dev", "c0", "-q"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("run it as root"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(start.elapsed().as_secs() < 5, "refusals measure nothing");
    let before = qdiscs(&t.cli);
    let o = fix(&["--dev", "c0", "-l", "6", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    let rates = |w: &str| {
        let t = &v[w]["throughput_mbps"];
        format!("{} / {} Mbit/s", t["down"], t["up"])
    };
    eprintln!(
        "fix: kept {} ({}); before {}, after {}",
        v["kept"],
        v["reason"],
        rates("before"),
        rates("after")
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(v["kept"], true);
    let (b, a) = (
        f(&v, "before.added_latency_ms"),
        f(&v, "after.added_latency_ms"),
    );
    assert!(a * 10.0 <= b, "+{b} ms before, +{a} ms after");
    // The line's download: 35 Mbit/s of 1514-byte frames carry 1448-byte payloads.
    let line_down = 35.0 * 1448.0 / 1514.0;
    assert!(
        f(&v, "after.throughput_mbps.down") >= 0.8 * line_down,
        "{} of {line_down:.1}",
        v["after"]["throughput_mbps"]
    );
    // Both directions' rates came from runs that loaded each alone.
    assert!(v["advice"]["refused"].as_array().unwrap().is_empty());
    assert_eq!(
        v["undo"],
        format!("bloatlab tune rollback --dev c0 --netns {}", t.cli)
    );
    let report = v["report"].as_str().unwrap();
    assert!(std::fs::read_to_string(report)
        .unwrap()
        .contains("Verdict: kept"));
    let o = run(&[], &["tune", "rollback", "--dev", "c0", "--netns", &t.cli]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(qdiscs(&t.cli), before, "rollback restores every qdisc");
    let _ = std::fs::remove_dir_all(&dir);
}
