//! The lab against Linux's own qdiscs on the same line with the same endpoints (Debian's
//! kernel under qemu as the router, `scripts/kernel-ref.sh`): its FQ-CoDel, and its CAKE per
//! probe class. Both take the machine (CI's first phase): beside other labs the guest's
//! qdiscs read what its starved vCPU adds.

use crate::common::kernel_ref::*;
use crate::common::*;
use crate::kernel_ref::guest_ready;

/// Added p50 of one probe class (`be`, `ef`, `bk`) from a summary.
fn class_added(v: &serde_json::Value, class: &str) -> f64 {
    f(v, &format!("added_latency_ms_by_class.{class}"))
}

/// rrul through Linux's CAKE (diffserv3, 20/20 Mbit/s, egress on the router, 4 ms base RTT)
/// and through the lab's, same endpoints: each probe class's added latency agrees, best
/// effort below EF below CS1 in both, goodput too. The lab counts 14 bytes per packet on top
/// of the IP packet, as CAKE's `raw` mode counts the Ethernet header.
#[test]
fn lab_cake_agrees_with_the_kernels_cake_per_probe_class() {
    // Beside the labs of a CI run's other workers (their forwarders above the guest's
    // priority) the guest's CAKE added +55 ms to every class and carried 13.6 of its 19
    // Mbit/s: it takes the machine (CI's first phase).
    let _s = quiet();
    if !guest_ready() {
        return;
    }
    let args = [
        "-l",
        "10",
        "--idle",
        "3",
        "--cc",
        "cubic",
        "-q",
        "--json",
        "-o",
        "/dev/null",
    ];
    let rrul = |prefix: &[String], host: &str| -> serde_json::Value {
        let mut a = vec!["test", "rrul", host];
        a.extend_from_slice(&args);
        let p: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let out = crate::common::run(&p, &a);
        assert!(
            out.status.success(),
            "rrul: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        json(&out)
    };
    // The tag names TAP devices (15 characters with the pid): keep it short.
    let kernel_pass = || -> serde_json::Value {
        let kernel = KernelRouter::start(
            "ck",
            &[
                "--down",
                "cake 20mbit diffserv3",
                "--up",
                "cake 20mbit diffserv3",
                "--delay-down",
                "delay 2ms",
                "--delay-up",
                "delay 2ms",
            ],
        );
        let srv = kernel.server("0.0.0.0:9461");
        let k = rrul(&kernel.exec(&kernel.cli), ROUTER_SRV_ADDR);
        drop(srv);
        kernel.stop_with("cake");
        k
    };
    let mut k = kernel_pass();

    let topo = "name='cakeref'\n[[link]]\nname='wan'\na='client'\nb='server'\n\
                both={delay='2ms', overhead=14, qdisc='cake bandwidth 20mbit diffserv3'}\n";
    let Some(lab) = LabUp::up("cakeref", topo) else {
        return;
    };
    let srv = lab.server("server");
    let mut l = rrul(&lab.exec("client"), "10.77.0.2");

    // The bulk tin beyond best effort, and how far below the kernel's the lab may read (below).
    let bk_beyond = |v: &serde_json::Value| class_added(v, "bk") - class_added(v, "be");
    let bk_below = |k: &serde_json::Value| (0.25 * bk_beyond(k).abs()).max(1.0);
    // How far above the kernel's a class's wait beyond best effort may read (see the asserts).
    let above_of = |kernel_beyond: f64| (0.1 * kernel_beyond.abs()).max(1.0) + 0.4;
    // The guest's late timers only ever add delay (as in the fq_codel test): a guest far above
    // the lab is measured once more and the lower of its two runs is the reference; a lab
    // model that waits too little still fails, as the guest is above it both times.
    if bk_beyond(&k) - bk_beyond(&l) > bk_below(&k) {
        eprintln!(
            "the guest's bulk tin waited {:.2} ms beyond best effort, the lab's {:.2}: \
            measuring the guest again",
            bk_beyond(&k),
            bk_beyond(&l)
        );
        let again = kernel_pass();
        if bk_beyond(&again) < bk_beyond(&k) {
            k = again;
        }
    }
    // The other way round, the same rule: the bulk tin's wait moves with its cubic flow's
    // sawtooth (lab 8.2-11.0 ms beyond best effort over five runs, BENCHMARKS.md), so a lab far
    // above the guest is measured once more and the lower run counts; a model that waits too
    // long is above the guest both times and still fails.
    if bk_beyond(&l) - bk_beyond(&k) > above_of(bk_beyond(&k)) {
        eprintln!(
            "the lab's bulk tin waited {:.2} ms beyond best effort, the guest's {:.2}: \
            measuring the lab again",
            bk_beyond(&l),
            bk_beyond(&k)
        );
        let again = rrul(&lab.exec("client"), "10.77.0.2");
        if bk_beyond(&again) < bk_beyond(&l) {
            l = again;
        }
    }
    drop(srv);
    let s = &k["latency_ms"]["per_stream"][0];
    let noise = f(s, "idle.p90") - f(s, "idle.p50");
    for class in ["be", "ef", "bk"] {
        let (ka, la) = (class_added(&k, class), class_added(&l, class));
        eprintln!(
            "cake {class}: added p50 kernel {ka:.2} lab {la:.2} ms (guest idle spread {noise:.2})"
        );
    }
    for dir in ["down", "up"] {
        let (kg, lg) = (
            f(&k, &format!("throughput_mbps.{dir}")),
            f(&l, &format!("throughput_mbps.{dir}")),
        );
        eprintln!("cake goodput {dir}: kernel {kg:.2} lab {lg:.2} Mbit/s");
    }
    // The guest's CAKE releases packets from watchdog timers that fire late under TCG (#15),
    // so best effort itself is not compared; each class's delay beyond best effort is CAKE's
    // own doing: within max(1 ms, 10%) plus 0.4 ms of run-to-run movement, and best effort in
    // the lab never above the kernel's. The bulk tin may fall short of the guest's by
    // max(25%, 1 ms) (BENCHMARKS.md, "Lab notes": the runs behind these bounds).
    let (kb, lb) = (class_added(&k, "be"), class_added(&l, "be"));
    assert!(
        lb <= kb + (0.1 * kb).max(1.0),
        "best effort: lab {lb} above kernel {kb} ms"
    );
    for class in ["ef", "bk"] {
        let (kd, ld) = (class_added(&k, class) - kb, class_added(&l, class) - lb);
        let above = above_of(kd);
        let below = if class == "bk" { bk_below(&k) } else { above };
        assert!(
            ld - kd <= above && kd - ld <= below,
            "{class} beyond best effort: lab {ld:.2} vs \
            kernel {kd:.2} ms (bounds +{above:.2} / -{below:.2})"
        );
    }
    // Each direction carries its data and the other direction's ACKs (one 80-byte frame per
    // two 1514-byte segments): at most 20 x 1448 / (1514 + 40) = 18.64 Mbit/s of payload. As
    // in the fq_codel test, the emulated guest loses rate to its late timers (measured: kernel
    // 16.96/17.06, lab 18.34/18.28; on a busy host 14.67 against 17.64): a lab above the
    // kernel and within that ceiling is the reference's shortfall; otherwise within 5%.
    let ceiling = 20.0 * 1448.0 / 1554.0;
    for dir in ["down", "up"] {
        let (kg, lg) = (
            f(&k, &format!("throughput_mbps.{dir}")),
            f(&l, &format!("throughput_mbps.{dir}")),
        );
        let agrees = (lg / kg - 1.0).abs() < 0.05;
        let reference_short = kg < lg && lg <= ceiling * 1.01;
        assert!(
            agrees || reference_short,
            "goodput {dir}: lab {lg} vs kernel {kg} Mbit/s (ceiling {ceiling:.2})"
        );
    }
    // DiffServ ordering in both: the bulk tin waits longest.
    for v in [&k, &l] {
        assert!(
            class_added(v, "bk") > class_added(v, "be"),
            "CS1 {} vs BE {}",
            class_added(v, "bk"),
            class_added(v, "be")
        );
    }
}

fn be_added(v: &serde_json::Value) -> f64 {
    let s = &v["latency_ms"]["per_stream"][0];
    f(s, "loaded.p50") - f(s, "idle.p50")
}

/// The same endpoints (this machine's TCP, cubic) through Linux's HTB + fq_codel in the guest
/// and through the lab's FQ-CoDel: 20/20 Mbit/s, 4 ms base RTT. The lab counts 14 bytes per
/// packet on top of the IP packet, as HTB counts the Ethernet header.
#[test]
fn lab_agrees_with_the_kernels_fq_codel_on_a_short_line() {
    // Beside other binaries' tests on a slow host the guest's fq_codel added 2.8-5.7 ms to
    // best-effort probes (the lab 0.4) until qemu ran at real-time priority (kernel_ref_sh):
    // beside a busy loop, 0.03-0.28 ms (BENCHMARKS.md). Beside CI's other workers it still
    // read high, and its passes measured again took 136-184 s of the guest's turns for 61 of
    // their own: it takes the machine (CI's first phase).
    let _s = quiet();
    if !guest_ready() {
        return;
    }
    let tests: [&[&str]; 2] = [&["tcp-down", "--flows", "4"], &["tcp-up", "--flows", "4"]];
    // 6 s of load: at 20 Mbit/s and 4 ms, slow start is over within the first 100 ms, and the
    // medians compared below are of 6 s of probes on either side.
    let common_args = [
        "-l",
        "6",
        "--idle",
        "3",
        "--cc",
        "cubic",
        "-q",
        "--json",
        "-o",
        "/dev/null",
    ];
    let run_in = |prefix: &[String], t: &[&str]| -> serde_json::Value {
        let mut args = vec!["test", t[0], ""];
        args.extend_from_slice(&t[1..]);
        args.extend_from_slice(&common_args);
        let p: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let host = if p.contains(&"--lab") {
            "10.77.0.2"
        } else {
            ROUTER_SRV_ADDR
        };
        args[2] = host;
        let out = crate::common::run(&p, &args);
        assert!(
            out.status.success(),
            "{t:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        json(&out)
    };

    // HTB's burst of 5 ms of rate rather than sqm's 1 ms: the emulated guest's timers fire late,
    // and a 1 ms burst then loses rate that real hardware would not (measured: 49 instead of
    // 52.7 Mbit/s at 57 Mbit/s).
    let kernel_pass = || -> Vec<serde_json::Value> {
        let kernel = KernelRouter::start(
            "agree",
            &[
                "--down",
                "fq_codel 20mbit",
                "--up",
                "fq_codel 20mbit",
                "--delay-down",
                "delay 2ms",
                "--delay-up",
                "delay 2ms",
                "--burst-us",
                "5000",
            ],
        );
        let srv = kernel.server("0.0.0.0:9461");
        let k: Vec<serde_json::Value> = tests
            .iter()
            .map(|t| run_in(&kernel.exec(&kernel.cli), t))
            .collect();
        drop(srv);
        kernel.stop_with("fq_codel");
        k
    };
    let mut k = kernel_pass();

    let topo = "name='agree'\n[[link]]\nname='wan'\na='client'\nb='server'\n\
                both={rate='20mbit', delay='2ms', overhead=14, qdisc='fq_codel'}\n";
    let Some(lab) = LabUp::up("agree", topo) else {
        return;
    };
    let srv = lab.server("server");
    let mut l: Vec<serde_json::Value> = tests
        .iter()
        .map(|t| run_in(&lab.exec("client"), t))
        .collect();

    // max(1 ms, 10%), widened by the reference's own noise measured in the same run: the
    // emulated guest's idle round trips spread by 1.5-3 ms (p90 - p50), and its loaded p50
    // moved by 1.3 ms between two otherwise identical runs.
    let bound = |k: &serde_json::Value| {
        let s = &k["latency_ms"]["per_stream"][0];
        (0.1 * be_added(k).abs()).max(1.0) + f(s, "idle.p90") - f(s, "idle.p50")
    };
    // The emulated guest's timers run late by 1-2 ms (the reference's known error), which
    // only ever holds packets longer: the guest may be above the lab by that much more. Under
    // CI's load it read +2.3 to +2.8 ms in three passes running, the lab +0.4 (the guest +0.5
    // to +0.7 alone).
    const GUEST_LATE_MS: f64 = 2.0;
    // The guest's fq_codel added -0.1 to 0.5 ms in these tests, but once in CI 12.4 ms
    // (tcp-down; the lab 0.3): an emulated guest starved of CPU holds packets outside its
    // qdisc, which only ever adds delay. So a guest far above the lab is measured once more
    // and the lower of its two runs is the reference; a lab model that queues too little
    // still fails, as the guest is above it every time. Twice: on a slow host in CI the guest
    // read +2.3 and then +2.6 ms against the lab's +0.4 (+0.47 alone right after).
    for _ in 0..2 {
        if !k
            .iter()
            .zip(&l)
            .any(|(k, l)| be_added(k) - be_added(l) > bound(k) + GUEST_LATE_MS)
        {
            break;
        }
        eprintln!(
            "the guest added more delay than the lab beyond the bound: measuring the guest again"
        );
        for (k, again) in k.iter_mut().zip(kernel_pass()) {
            if be_added(&again) < be_added(k) {
                *k = again;
            }
        }
    }
    // The same the other way: the lab is a process too, and starved of CPU beside another
    // test binary it holds packets past its model (once in CI: tcp-down lab 11.88 ms, the
    // guest 0.18). A lab far above the guest is measured again, up to twice, and the lowest
    // run counts; a model that queues too much is above every time and still fails.
    for (i, t) in tests.iter().enumerate() {
        for _ in 0..2 {
            if be_added(&l[i]) - be_added(&k[i]) <= bound(&k[i]) {
                break;
            }
            eprintln!(
                "{}: the lab added more delay than the guest beyond the bound: again",
                t[0]
            );
            let again = run_in(&lab.exec("client"), t);
            if be_added(&again) < be_added(&l[i]) {
                l[i] = again;
            }
        }
    }
    drop(srv);
    drop(lab);

    for ((t, k), l) in tests.iter().zip(&k).zip(&l) {
        let dir = if t[0] == "tcp-down" {
            "throughput_mbps.down"
        } else {
            "throughput_mbps.up"
        };
        let (kg, lg) = (f(k, dir), f(l, dir));
        eprintln!(
            "{}: goodput kernel {kg:.2} lab {lg:.2} Mbit/s; BE added p50 kernel {:.2} lab {:.2} ms",
            t[0],
            be_added(k),
            be_added(l)
        );
        // Issue #15's bounds: goodput within 3% in single-direction tests, added p50 within
        // max(1 ms, 10%) (p90 is not checked: the guest's own tails are wider than its bound).
        // The emulated guest sometimes loses rate to its late timers (tcp-up once 18.40 Mbit/s
        // where the lab reached 19.01 of the 19.13 physically possible): a lab at the physical
        // ceiling, above a kernel below it, is the reference's shortfall, not the model's.
        let ceiling = 20.0 * 1448.0 / 1514.0;
        let agrees = (lg / kg - 1.0).abs() < 0.03;
        // On a busy host the lab loses a little too (one CI run: lab 18.11, kernel 17.16, the
        // guest's idle spread 24 ms): what must hold is that the lab never beats physics and
        // never falls short of the reference.
        let reference_short = kg < lg && lg <= ceiling * 1.005;
        assert!(
            agrees || reference_short,
            "{}: lab {lg} vs kernel {kg} Mbit/s (ceiling {ceiling:.2})",
            t[0]
        );
        let (ka, la, bound) = (be_added(k), be_added(l), bound(k));
        assert!(
            la - ka <= bound && ka - la <= bound + GUEST_LATE_MS,
            "{}: added p50 lab {la} vs kernel {ka} ms (bound {bound} ms, the guest's {} ms \
            more)",
            t[0],
            bound + GUEST_LATE_MS
        );
    }
}
