//! Replays a packet capture into the lab's CAKE and prints its autorate-ingress estimate, so the
//! model can be checked against Linux's on the very same arrivals (scripts/bench-kernel-ref.sh
//! captures them at the kernel router with `--capture`).
//!
//!   cargo run --release -p bloatlab-lab-model --example autorate_replay -- PCAP [OPTIONS]
//! [STEP_MS]
//!
//! PCAP: Ethernet frames as `tcpdump -w` writes them (microsecond or nanosecond stamps; headers
//! are enough, the original length is used). OPTIONS: CAKE's words as tc reads them, default
//! "bandwidth 38mbit besteffort autorate-ingress ingress". Every STEP_MS (default 250) of capture
//! time it prints: seconds since the first packet, the capture's clock, Mbit/s arrived in the
//! step, the estimate and the shaper's rate (Mbit/s), as `tc -s qdisc` would have shown them.

use bloatlab_lab_model::cake::{Cake, CakeParams};
use bloatlab_lab_model::{DirCounters, Packet, Qdisc};
use std::process::ExitCode;

/// One captured frame: its capture time (ns since the epoch) and original length (bytes).
struct Frame {
    at_ns: u64,
    len: usize,
}

/// The frames of a classic pcap file (not pcapng), in file order.
fn read_pcap(bytes: &[u8]) -> Result<Vec<Frame>, String> {
    let head = bytes.get(..24).ok_or("shorter than a pcap header")?;
    let magic = u32::from_le_bytes(head[..4].try_into().unwrap());
    let (big, nanos) = match magic {
        0xa1b2_c3d4 => (false, false),
        0xa1b2_3c4d => (false, true),
        0xd4c3_b2a1 => (true, false),
        0x4d3c_b2a1 => (true, true),
        _ => return Err(format!("not a pcap file (magic {magic:#x})")),
    };
    let word = |b: &[u8]| {
        let a: [u8; 4] = b.try_into().unwrap();
        if big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        }
    };
    if word(&head[20..24]) != 1 {
        return Err("link type is not Ethernet".into());
    }
    let mut frames = Vec::new();
    let mut at = 24;
    while let Some(rec) = bytes.get(at..at + 16) {
        let (secs, frac, caplen, len) = (
            word(&rec[..4]),
            word(&rec[4..8]),
            word(&rec[8..12]),
            word(&rec[12..16]),
        );
        let sub_ns = if nanos {
            frac as u64
        } else {
            frac as u64 * 1000
        };
        frames.push(Frame {
            at_ns: secs as u64 * 1_000_000_000 + sub_ns,
            len: len as usize,
        });
        at += 16 + caplen as usize;
    }
    Ok(frames)
}

/// A stand-in IPv4 packet of the frame's length: the estimate reads only times and lengths.
fn packet_of(frame: &Frame) -> Packet {
    let ip_len = frame.len.saturating_sub(14).max(20);
    let mut data = vec![0u8; ip_len];
    data[0] = 0x45;
    data[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
    data[9] = 6;
    let mut p = Packet::new(data);
    // The kernel's qdisc_pkt_len on an Ethernet device counts the header: the frame.
    p.frame_len = frame.len;
    p
}

fn mbit(bytes_per_s: u64) -> f64 {
    bytes_per_s as f64 / 1e6
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: autorate_replay PCAP [CAKE OPTIONS] [STEP_MS]");
        return ExitCode::from(2);
    };
    let words = args.get(1).map_or(
        "bandwidth 38mbit besteffort autorate-ingress ingress",
        |s| s.as_str(),
    );
    let run = || -> Result<(), String> {
        let step_ms = match args.get(2) {
            None => 250,
            Some(s) => s
                .parse::<u64>()
                .ok()
                .filter(|ms| (1..=60_000).contains(ms))
                .ok_or(format!(
                    "STEP_MS `{s}`: want whole milliseconds, 1 to 60000"
                ))?,
        };
        let step_ns = step_ms * 1_000_000;
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let frames = read_pcap(&bytes).map_err(|e| format!("{path}: {e}"))?;
        let first = frames.first().ok_or("no packets")?.at_ns;
        let params = CakeParams::parse(words).map_err(|e| e.to_string())?;
        let mut cake = Cake::new(params, 1500, 1);
        let mut stats = DirCounters::default();
        println!("t_s capture_clock_s arrived_mbit estimate_mbit shaper_mbit");
        // The model's clock starts where the capture does, plus a margin: the kernel's
        // estimate only moves the shaper once the clock is past 250 ms.
        let origin = 1_000_000_000u64;
        let mut next_print = step_ns;
        let mut arrived = 0u64;
        let mut clock = origin;
        let mut last = 0;
        for f in &frames {
            // Stamps that step back (a clock set during the capture) count as the last one.
            let t = f.at_ns.saturating_sub(first).max(last);
            last = t;
            while t >= next_print {
                let s = cake.stats();
                println!(
                    "{:.3} {:.3} {:.2} {:.2} {:.2}",
                    next_print as f64 / 1e9,
                    (first + next_print) as f64 / 1e9,
                    arrived as f64 * 8.0 / (step_ns as f64 / 1e9) / 1e6,
                    mbit(s.capacity_estimate_bps),
                    mbit(s.rate_bps)
                );
                arrived = 0;
                next_print += step_ns;
            }
            // Drain at the shaper's own pace up to this arrival, so the queue is as Linux's.
            let now = origin + t;
            while cake.packets() > 0 && cake.next_ready() <= now {
                clock = cake.next_ready().max(clock);
                if cake.dequeue(clock, &mut stats).is_none() {
                    break;
                }
            }
            clock = now;
            arrived += f.len as u64;
            cake.enqueue(packet_of(f), now, &mut stats);
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("autorate_replay: {e}");
            ExitCode::FAILURE
        }
    }
}
