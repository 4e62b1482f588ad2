//! Built-in topologies modelled on real home links. Each is the TOML a user could write.

pub const PRESETS: &[(&str, &str)] = &[
    (
        "cable",
        r#"
name = "cable"
description = """DOCSIS cable 60/4 Mbit/s, 15 ms base RTT, 1000-packet modem FIFO; a home router \
on a gigabit LAN"""
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "wan"
a = "router"
b = "server"
both = { delay = "7.5ms", limit = 1000, overhead = 18 }
up = { rate = "4mbit" }
down = { rate = "60mbit" }
"#,
    ),
    (
        "fiber",
        r#"
name = "fiber"
description = "FTTH 900/900 Mbit/s, 5 ms base RTT, 1000-packet ONT FIFO"
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "wan"
a = "router"
b = "server"
both = { rate = "900mbit", delay = "2.5ms", limit = 1000 }
"#,
    ),
    (
        "dsl",
        r#"
name = "dsl"
description = """ADSL2+ 16/1 Mbit/s with ATM framing (PPPoE LLC, 40 B), 30 ms base RTT, \
300-packet modem FIFO"""
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "wan"
a = "router"
b = "server"
both = { delay = "15ms", limit = 300, overhead = 40, atm = true }
up = { rate = "1mbit" }
down = { rate = "16mbit" }
"#,
    ),
    (
        "wifi-slow",
        r#"
name = "wifi-slow"
description = """A 6 Mbit/s Wi-Fi hop with a deep 1000-packet driver queue, behind a 100/20 \
Mbit/s WAN with 20 ms base RTT"""
[[link]]
name = "wifi"
a = "client"
b = "router"
both = { rate = "6mbit", delay = "1ms", jitter = "0.5ms", limit = 1000 }
[[link]]
name = "wan"
a = "router"
b = "server"
both = { delay = "9ms", limit = 1000 }
up = { rate = "20mbit" }
down = { rate = "100mbit" }
"#,
    ),
    (
        "wifi-ring",
        r#"
name = "wifi-ring"
description = """Gettys' 802.11g experiments: a 6 Mbit/s Wi-Fi hop with a 1000-packet transmit \
queue above a 256-entry driver ring (up to 2.5 s full; the ring alone 0.5 s, out of any qdisc's \
reach: try qdisc=fq_codel, then ring=10 or bql=on), behind a 100/20 Mbit/s WAN with 20 ms base \
RTT"""
[[link]]
name = "wifi"
a = "client"
b = "router"
both = { rate = "6mbit", delay = "1ms", limit = 1000, ring = 256 }
[[link]]
name = "wan"
a = "router"
b = "server"
both = { delay = "9ms", limit = 1000 }
up = { rate = "20mbit" }
down = { rate = "100mbit" }
"#,
    ),
    (
        "lte",
        r#"
name = "lte"
description = """LTE: download follows a 10 s looping trace (5..30 Mbit/s), 5 Mbit/s up, 50 ms \
base RTT, deep buffers"""
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "radio"
a = "router"
b = "server"
both = { delay = "25ms", limit = 1500 }
up = { rate = "5mbit" }
down = { rate = "trace:builtin:lte" }
"#,
    ),
    (
        "wifi",
        r#"
name = "wifi"
description = """A Wi-Fi backhaul: download in 4 ms aggregates at 40 Mbit/s that drops to 10 \
Mbit/s for 10 s of every 20 (looping trace), 8 Mbit/s up, 20 ms base RTT, 1000-packet driver \
queue; a router on a gigabit LAN"""
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "wifi"
a = "router"
b = "server"
both = { delay = "10ms", limit = 1000 }
up = { rate = "8mbit" }
down = { rate = "trace:builtin:wifi" }
"#,
    ),
    (
        "starlink",
        r#"
name = "starlink"
description = """Starlink-like: capacity and base delay re-drawn every 15 s as the dish \
changes satellite (40..150 Mbit/s down, 5..15 up, 24..50 ms base RTT, repeating every 2 min), \
1000-packet buffers"""
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "sky"
a = "router"
b = "server"
both = { delay = "schedule:builtin:starlink-delay", limit = 1000 }
up = { rate = "schedule:builtin:starlink-up" }
down = { rate = "schedule:builtin:starlink-down" }
"#,
    ),
    (
        "cable-evening",
        r#"
name = "cable-evening"
description = """DOCSIS cable 60/4 Mbit/s whose segment fills at 21:00: a minute at full \
rate, then half (30/2) for 10 minutes, then full again (repeating every 12 min); 15 ms base \
RTT, 1000-packet modem FIFO"""
[[link]]
name = "lan"
a = "client"
b = "router"
[[link]]
name = "wan"
a = "router"
b = "server"
both = { delay = "7.5ms", limit = 1000, overhead = 18 }
up = { rate = "schedule:builtin:cable-evening-up" }
down = { rate = "schedule:builtin:cable-evening-down" }
"#,
    ),
    (
        "home",
        r#"
name = "home"
description = """A laptop on Wi-Fi (40 Mbit/s, 1000-packet driver queue) to a home router, a \
50/10 Mbit/s access line with a 1000-packet modem FIFO to the ISP's router, its core at 1 Gbit/s \
to the server; 20 ms base RTT. Three hops to locate bloat on (bloatlab locate)"""
[[link]]
name = "wifi"
a = "client"
b = "router"
both = { rate = "40mbit", delay = "1ms", limit = 1000 }
[[link]]
name = "access"
a = "router"
b = "isp"
both = { delay = "7ms", limit = 1000, overhead = 18 }
up = { rate = "10mbit" }
down = { rate = "50mbit" }
[[link]]
name = "core"
a = "isp"
b = "server"
both = { rate = "1gbit", delay = "2ms", limit = 1000 }
"#,
    ),
    (
        "switch",
        r#"
name = "switch"
description = """A host on gigabit Ethernet into a switch whose 100 Mbit/s uplink port buffers \
64 KB, then a 50 Mbit/s line with 20 ms base RTT and a 1000-packet FIFO: a sender's unpaced \
bursts overflow the switch (test udp --rate 45mbit --pacing burst:100ms loses most of its \
packets there; --pacing timer none)"""
[[link]]
name = "lan"
a = "client"
b = "switch"
both = { rate = "1gbit", limit = 1000 }
[[link]]
name = "uplink"
a = "switch"
b = "router"
both = { rate = "100mbit", limit = "64kb" }
[[link]]
name = "line"
a = "router"
b = "server"
both = { rate = "50mbit", delay = "10ms", limit = 1000 }
"#,
    ),
    (
        "l4s",
        r#"
name = "l4s"
description = """A 20 Mbit/s line with DualPI2 (RFC 9332: L4S and classic queues, coupled) both \
ways and 20 ms base RTT; two clients share it: `classic` (TCP without ECN: dropped) and `ecn` \
(TCP with ECN, ECT(0): the classic queue marks it instead); ECT(1) and CE packets (test marks) \
take the L queue"""
[[link]]
name = "lan-classic"
a = "classic"
b = "router"
[[link]]
name = "lan-ecn"
a = "ecn"
b = "router"
[[link]]
name = "line"
a = "router"
b = "server"
both = { rate = "20mbit", delay = "10ms", qdisc = "dualpi2" }
[host.classic]
ecn = false
[host.ecn]
ecn = true
"#,
    ),
];

pub fn get(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The built-in LTE trace in mahimahi format: 10 one-second steps of these Mbit/s, each
/// second's 1500-byte opportunities spread evenly.
pub fn lte_trace() -> String {
    const MBPS: [u64; 10] = [20, 12, 8, 25, 15, 5, 10, 30, 18, 9];
    let mut out = String::new();
    for (s, mbps) in MBPS.iter().enumerate() {
        let per_second = mbps * 1_000_000 / 12_000;
        for k in 0..per_second {
            out += &format!("{}\n", s as u64 * 1000 + (k * 1000) / per_second + 1);
        }
    }
    out
}

/// The built-in Wi-Fi trace: 40 Mbit/s for 10 s, then 10 Mbit/s for 10 s, delivered as one
/// aggregate every 4 ms (an A-MPDU per TXOP), so that a receiver sees bursts and gaps.
pub fn wifi_trace() -> String {
    // Opportunities (1500 bytes) delivered by millisecond t: 40 Mbit/s is 10/3 per ms.
    let by = |t: u64| {
        if t <= 10_000 {
            t * 10 / 3
        } else {
            100_000 / 3 + (t - 10_000) * 5 / 6
        }
    };
    let mut out = String::new();
    for t in (4..=20_000u64).step_by(4) {
        for _ in by(t - 4)..by(t) {
            out += &format!("{t}\n");
        }
    }
    out
}

/// A repeating schedule of these Mbit/s, 15 s each (Starlink reallocates every 15 s).
/// A schedule of `values` (with `unit`), one each 15 s, repeating.
fn every_15s(values: &[u64], unit: &str) -> String {
    let mut out: String = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{} {v}{unit}\n", i * 15))
        .collect();
    out += &format!("repeat {}\n", values.len() * 15);
    out
}

/// A minute at `mbps`, ten at half, repeating every 12 minutes.
fn halving(mbps: u64) -> String {
    format!(
        "0 {mbps}mbit\n60 {}kbit\n660 {mbps}mbit\nrepeat 720\n",
        mbps * 500
    )
}

/// File reader for topology settings: `builtin:` names, else the file system.
pub fn read_file(path: &str) -> Result<String, String> {
    match path {
        "builtin:lte" => Ok(lte_trace()),
        "builtin:wifi" => Ok(wifi_trace()),
        "builtin:starlink-down" => Ok(every_15s(&[100, 60, 150, 80, 40, 120, 90, 70], "mbit")),
        "builtin:starlink-up" => Ok(every_15s(&[12, 8, 15, 10, 5, 14, 9, 7], "mbit")),
        // One way, each 15 s: a round trip of 24 to 50 ms.
        "builtin:starlink-delay" => Ok(every_15s(&[15, 20, 12, 25, 18, 14, 22, 16], "ms")),
        "builtin:cable-evening-down" => Ok(halving(60)),
        "builtin:cable-evening-up" => Ok(halving(4)),
        p => std::fs::read_to_string(p).map_err(|e| format!("{p}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Topology;

    #[test]
    fn moving_lines_have_the_mean_and_the_peak_their_descriptions_give() {
        let line = |preset: &str, link: &str| {
            let t = Topology::from_toml(get(preset).unwrap(), &read_file).unwrap();
            let l = t.links.iter().find(|l| l.name == link).unwrap().clone();
            (
                l.down.rate.mean_bps(),
                l.down.rate.max_bps(),
                l.up.rate.max_bps(),
            )
        };
        // (100 + 60 + 150 + 80 + 40 + 120 + 90 + 70) / 8 Mbit/s, 15 s each.
        assert_eq!(
            line("starlink", "sky"),
            (Some(88_750_000), Some(150_000_000), Some(15_000_000))
        );
        // 60 for 1 minute, 30 for 10, 60 for 1: 35 Mbit/s over the 12.
        assert_eq!(
            line("cable-evening", "wan"),
            (Some(35_000_000), Some(60_000_000), Some(4_000_000))
        );
    }

    #[test]
    fn every_preset_parses() {
        for (name, text) in PRESETS {
            let t = Topology::from_toml(text, &read_file).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(t.name, *name);
            assert!(!t.description.is_empty());
        }
    }

    /// The ring holds 256 x 1500 B at 6 Mbit/s = 512 ms below the qdisc's 1000 x 2 ms = 2 s.
    #[test]
    fn wifi_ring_puts_a_256_entry_ring_below_the_wifi_queue() {
        let t = Topology::from_toml(get("wifi-ring").unwrap(), &read_file).unwrap();
        let wifi = &t.links[0];
        assert_eq!((wifi.up.ring, wifi.down.ring), (256, 256));
        let ring_ms = 256.0 * 1500.0 * 8.0 / wifi.up.rate.mean_bps().unwrap() as f64 * 1e3;
        assert_eq!(ring_ms, 512.0);
    }

    #[test]
    fn wifi_trace_steps_from_40_to_10_mbit_in_4_ms_aggregates() {
        let text = wifi_trace();
        let ts: Vec<u64> = text.lines().map(|l| l.parse().unwrap()).collect();
        let mbit = |from: u64, to: u64| {
            ts.iter().filter(|&&t| t > from && t <= to).count() as f64 * 12_000.0
                / ((to - from) as f64 * 1e3)
        };
        assert!((mbit(0, 10_000) - 40.0).abs() < 0.1, "{}", mbit(0, 10_000));
        assert!(
            (mbit(10_000, 20_000) - 10.0).abs() < 0.1,
            "{}",
            mbit(10_000, 20_000)
        );
        assert!(
            ts.iter().all(|t| t % 4 == 0),
            "deliveries only at aggregate times"
        );
        assert_eq!(*ts.last().unwrap(), 20_000, "the trace's period is 20 s");
    }

    #[test]
    fn lte_trace_mean_is_the_mean_of_its_steps() {
        let r = bloatlab_lab_model::rate::Rate::parse_trace(&lte_trace()).unwrap();
        let mean = r.mean_bps().unwrap() as f64 / 1e6;
        assert!((mean - 15.2).abs() < 0.2, "{mean}");
    }
}
