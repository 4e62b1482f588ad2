//! Configurations people paste: each generator is a pure function of the shaping settings and
//! returns commented text. Shell scripts end in a state that `tc -s qdisc show` confirms.

use crate::link::{Framing, LinkType};
use std::fmt::Write;

/// What every shaper generator needs.
#[derive(Clone, Debug)]
pub struct Shaping {
    /// The WAN interface.
    pub dev: String,
    /// Download (ingress, shaped on an IFB device) and upload (egress) rates, kbit/s.
    pub down_kbit: Option<u64>,
    pub up_kbit: Option<u64>,
    pub link: LinkType,
    /// CAKE's `ack-filter` on the upload (`advise` says when; HTB leaves have none).
    pub ack_filter: bool,
}

impl Shaping {
    fn ifb(&self) -> String {
        // Interface names are at most 15 bytes (IFNAMSIZ - 1).
        let mut n = format!("ifb4{}", self.dev);
        n.truncate(15);
        n
    }

    fn describe(&self) -> String {
        let r = |k: Option<u64>| k.map_or("not shaped".to_string(), |k| format!("{k} kbit/s"));
        format!(
            "upload {}, download {}; link {} (overhead {} B, mpu {}{})",
            r(self.up_kbit),
            r(self.down_kbit),
            self.link.cake_keyword(),
            self.link.overhead(),
            self.link.mpu(),
            match self.link.framing() {
                Framing::Atm => ", ATM cells",
                Framing::Ptm => ", PTM 64/65",
                Framing::None => "",
            }
        )
    }

    /// tc's size table for HTB: the link layer it cannot know (PTM has no stab form: its
    /// 64/65 is folded into the rate by the caller's margin).
    fn stab(&self) -> String {
        match (self.link.framing(), self.link.overhead()) {
            (Framing::Atm, o) => format!("stab overhead {o} linklayer atm "),
            (_, 0) => String::new(),
            (_, o) => format!(
                "stab overhead {o} mpu {} linklayer ethernet ",
                self.link.mpu()
            ),
        }
    }
}

fn header(o: &mut String, kind: &str, what: &str, s: &Shaping) {
    let _ = writeln!(
        o,
        "#!/bin/sh\n# bloatlab config {kind}: {what}\n# {}\n# Run as root; undo \
        with the lines at the end.\nset -e",
        s.describe()
    );
}

/// The lines that redirect DEV's ingress to its IFB device, where the download is shaped.
fn ingress_redirect(o: &mut String, s: &Shaping) {
    let (dev, ifb) = (&s.dev, s.ifb());
    let _ = writeln!(
        o,
        "# Download: what arrives on {dev} is redirected to {ifb} and shaped on its way out there."
    );
    let _ = writeln!(
        o,
        "ip link add name {ifb} type ifb 2>/dev/null || true\nip link set dev {ifb} up"
    );
    let _ = writeln!(o, "tc qdisc replace dev {dev} handle ffff: ingress");
    let _ = writeln!(
        o,
        "tc filter replace dev {dev} parent ffff: protocol all prio 10 u32 match \
        u32 0 0 action mirred egress redirect dev {ifb}"
    );
}

fn undo(o: &mut String, s: &Shaping) {
    let _ = writeln!(
        o,
        "# Undo:\n#   tc qdisc del dev {0} root; tc qdisc del dev {0} ingress; ip link del {1}",
        s.dev,
        s.ifb()
    );
}

/// The configurations `bloatlab config` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum ConfigKind {
    /// CAKE on egress and, through an IFB device, on ingress (a shell script).
    TcCake,
    /// HTB with fq_codel leaves in three priority classes, as sqm-scripts' simple.qos.
    TcHtbFqcodel,
    /// The same with short FIFO leaves, for kernels without fq_codel.
    TcHtbFifo,
    /// HTB classes: voice, SIP, network control, SSH, default (a FireQOS home layout).
    TcHtbClasses,
    /// An /etc/config/sqm section for OpenWrt.
    OpenwrtSqm,
    /// The classes in FireQOS's language.
    Fireqos,
    /// nftables: wash DSCP from the Internet, mark voice CS6 for the Wi-Fi VO queue.
    NftDscp,
    /// vm.dirty_background_bytes and vm.dirty_bytes from --rate x --background-delay / --delay.
    SysctlWriteback,
    /// OpenVPN settings for throughput without a 15000-packet queue on the tunnel (--mtu: the
    /// path's, from bloatlab test mtu; --rate: the tunnel's goodput, from bloatlab compare).
    Openvpn,
    /// OpenVPN's `up` script: a shaper at 95% of --rate into CAKE or fq_codel on the tunnel.
    OpenvpnUp,
    /// The WireGuard MTU for a path MTU (--mtu, from bloatlab test mtu).
    WireguardMtu,
    /// OpenWrt wireless settings for calls over Wi-Fi, as commented advice.
    WifiOpenwrt,
}

impl ConfigKind {
    /// Whether it shapes, and so needs a rate for at least one direction.
    pub fn needs_rates(self) -> bool {
        !matches!(
            self,
            ConfigKind::NftDscp
                | ConfigKind::SysctlWriteback
                | ConfigKind::WifiOpenwrt
                | ConfigKind::Openvpn
                | ConfigKind::OpenvpnUp
                | ConfigKind::WireguardMtu
        )
    }
}

/// What some configurations take besides the shaper.
#[derive(Clone, Debug, Default)]
pub struct Extras {
    /// tc-htb-classes: FIFO leaves instead of fq_codel.
    pub fifo_leaves: bool,
    /// openwrt-sqm: CAKE (layer_cake.qos) rather than fq_codel (simple.qos).
    pub sqm_cake: bool,
    /// openvpn, wireguard-mtu: the path MTU.
    pub mtu: Option<u32>,
    /// sysctl-writeback: the link the writes come from; openvpn, openvpn-up: the tunnel's
    /// goodput. Bit/s.
    pub rate: Option<u64>,
    /// sysctl-writeback: the link's time that may be dirty before writeback starts, and
    /// before writers are throttled, ns.
    pub background_delay_ns: u64,
    pub delay_ns: u64,
}

/// An interface name as the kernel takes it: at most 15 letters, digits, '-', '_', '.', '@'.
pub fn check_dev(dev: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "-_.@".contains(c);
    if dev.is_empty() || dev.len() > 15 || !dev.chars().all(ok) {
        return Err(format!(
            "--dev `{dev}`: an interface name (at most 15 letters, digits, '-', '_', '.')"
        ));
    }
    Ok(())
}

/// The configuration of `kind` for `s`, or what it still needs (in the flags' words).
pub fn render(kind: ConfigKind, s: &Shaping, x: &Extras) -> Result<String, String> {
    Ok(match kind {
        ConfigKind::TcCake => tc_cake(s),
        ConfigKind::TcHtbFqcodel => tc_htb(s, Leaf::FqCodel),
        ConfigKind::TcHtbFifo => tc_htb(s, Leaf::Fifo),
        ConfigKind::TcHtbClasses => tc_htb_classes(
            s,
            if x.fifo_leaves {
                Leaf::Fifo
            } else {
                Leaf::FqCodel
            },
        ),
        ConfigKind::OpenwrtSqm => openwrt_sqm(s, x.sqm_cake),
        ConfigKind::Fireqos => fireqos(s),
        ConfigKind::NftDscp => nft_dscp(s),
        ConfigKind::SysctlWriteback => match x.rate {
            Some(r) => sysctl_writeback(r, x.background_delay_ns, x.delay_ns),
            None => {
                return Err("sysctl-writeback needs --rate (the link the writes go to: \
                    1Gibit, 100Mbit, ...)"
                    .into())
            }
        },
        ConfigKind::WifiOpenwrt => wifi_openwrt(),
        ConfigKind::Openvpn => openvpn(x.mtu, x.rate),
        ConfigKind::OpenvpnUp => match x.rate {
            Some(r) => openvpn_up(r),
            None => {
                return Err(
                    "openvpn-up needs --rate, the tunnel's goodput (bloatlab compare \
                    RAW TUNNEL measures it)"
                        .into(),
                )
            }
        },
        ConfigKind::WireguardMtu => match x.mtu {
            Some(m) if (576..=65_535).contains(&m) => wireguard_mtu(m),
            _ => {
                return Err(
                    "wireguard-mtu needs --mtu, the path MTU (576..65535; bloatlab \
                    test mtu HOST measures it)"
                        .into(),
                )
            }
        },
    })
}

/// The best shaper script the kernel can run (`has("cake")`, `has("fq_codel")`): CAKE, else
/// HTB with fq_codel, else HTB with short FIFOs; and what was given up, when anything was.
pub fn for_kernel(s: &Shaping, has: impl Fn(&str) -> bool) -> (String, Option<String>) {
    if has("cake") {
        (tc_cake(s), None)
    } else if has("fq_codel") {
        (
            tc_htb(s, Leaf::FqCodel),
            Some("this kernel has no CAKE (sch_cake): HTB with fq_codel instead".into()),
        )
    } else {
        (
            tc_htb(s, Leaf::Fifo),
            Some(format!(
                "this kernel has neither CAKE nor fq_codel: HTB with FIFOs hashed by port instead \
                    ({} per direction: they move the queue and roughly isolate flows, with no AQM)",
                crate::advise::FIFO_BUCKETS
            )),
        )
    }
}

/// CAKE on egress and, through an IFB, on ingress (tc-cake(8); sqm's piece_of_cake).
pub fn tc_cake(s: &Shaping) -> String {
    let mut o = String::new();
    header(&mut o, "tc-cake", &format!("CAKE shaping on {}", s.dev), s);
    let kw = s.link.cake_keyword();
    if let Some(up) = s.up_kbit {
        let _ = writeln!(
            o,
            "# Upload: diffserv3 honours EF and CS1 marks; dual-srchost shares by \
            LAN host (nat reads\n# the addresses behind this router's NAT)."
        );
        let ack = if s.ack_filter {
            let _ = writeln!(
                o,
                "# ack-filter: of a flow's queued pure ACKs, those a later one \
                makes redundant are dropped, so\n# the download's ACKs take less of this slow \
                upload (tc-cake(8))."
            );
            " ack-filter"
        } else {
            ""
        };
        let _ = writeln!(
            o,
            "tc qdisc replace dev {} root cake bandwidth {up}kbit {kw} nat \
            dual-srchost diffserv3{ack}",
            s.dev
        );
    }
    if let Some(down) = s.down_kbit {
        ingress_redirect(&mut o, s);
        let _ = writeln!(
            o,
            "# ingress: drop rather than only mark early, as the queue is after \
            the bottleneck; wash and\n# besteffort: DSCP from the Internet is not to be trusted \
            (tc-cake(8))."
        );
        let _ = writeln!(
            o,
            "tc qdisc replace dev {} root cake bandwidth {down}kbit {kw} nat \
            dual-dsthost ingress wash besteffort",
            s.ifb()
        );
    }
    undo(&mut o, s);
    o
}

/// The leaf qdisc under HTB: fq_codel as sqm sets it, or a FIFO of 20 ms at the class's rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Leaf {
    FqCodel,
    Fifo,
}

fn leaf(l: Leaf, kbit: u64) -> String {
    match l {
        // sqm-scripts: limit 1001, quantum 300, ECN; target grows on slow links so one
        // ATM-sized packet fits (max(5 ms, 13992 us per Mbit)), interval = 95 ms + target.
        Leaf::FqCodel => {
            let target_us = (5000u64).max(13_992_000 / kbit.max(1));
            format!(
                "fq_codel limit 1001 quantum 300 target {target_us}us interval {}us ecn",
                95_000 + target_us
            )
        }
        Leaf::Fifo => format!("pfifo limit {}", crate::advise::fifo_packets(kbit)),
    }
}

/// HTB's burst and quantum: 1000 us of the rate (sqm-scripts), at least 1749 B. Left to
/// HTB, the quantum is rate / r2q: above 200000 B from 16 Mbit/s on, which it warns about.
fn burst(kbit: u64) -> u64 {
    (kbit / 8).max(1749)
}

/// Which port tells a direction's flows apart: the LAN host's (after NAT, the router's).
#[derive(Clone, Copy, PartialEq)]
enum Port {
    Source,
    Destination,
}

/// Splits HTB class 1:`id` into `FIFO_BUCKETS` leaves 1:`id`0 .. 1:`id`7, each with its own FIFO,
/// and hashes flows onto them by bits 1-3 of one port (not bit 0: Linux gives connect()ing
/// sockets even ports, so the lowest bit would leave half the buckets empty; u32 hashes one
/// masked word, shifted down to its lowest set bit; the
/// ports follow a 20-byte IPv4 or 40-byte IPv6 header, so packets with options or extension
/// headers land in some bucket, not always their flow's). HTB serves backlogged leaves of one
/// priority in turn, a quantum each: a stochastic fair queue built from what every kernel
/// has, so one flow's FIFO no longer holds up the others. Each bucket gets the class's FIFO
/// length shared out, at least `FIFO_MIN_PACKETS`. The buckets take the class's priority
/// (in HTB a leaf's priority counts across the tree).
fn hashed_fifos(
    o: &mut String,
    dev: &str,
    id: u32,
    (rate, ceil, prio): (u64, u64, u32),
    fifo_kbit: u64,
    port: Port,
) {
    let b = burst(ceil);
    let (buckets, packets) = (
        crate::advise::FIFO_BUCKETS,
        crate::advise::bucket_packets(fifo_kbit),
    );
    let _ = writeln!(
        o,
        "# 1:{id} is {buckets} FIFOs of {packets} packets served in turn; a flow's \
        {} port picks its FIFO.",
        if port == Port::Source {
            "source"
        } else {
            "destination"
        }
    );
    for i in 0..buckets {
        let _ = writeln!(
            o,
            "tc class replace dev {dev} parent 1:{id} classid 1:{id}{i} htb rate \
            {}kbit ceil {ceil}kbit burst {b} cburst {b} quantum 1749 prio \
            {prio}",
            (rate / buckets).max(1)
        );
        let _ = writeln!(
            o,
            "tc qdisc replace dev {dev} parent 1:{id}{i} handle {id}{i}: pfifo limit {packets}"
        );
    }
    // The port word: source port in its upper half, destination in its lower.
    let mask = if port == Port::Source {
        (buckets - 1) << 17
    } else {
        (buckets - 1) << 1
    };
    for (prio, proto, table, at) in [(1, "ip", 2, 20), (2, "ipv6", 3, 40)] {
        let _ = writeln!(
            o,
            "tc filter add dev {dev} parent 1:{id} prio {prio} handle {table}: \
            protocol {proto} u32 divisor {buckets}"
        );
        for i in 0..buckets {
            let _ = writeln!(
                o,
                "tc filter add dev {dev} parent 1:{id} prio {prio} protocol \
                {proto} u32 ht {table}:{i:x}: match u32 0 0 flowid 1:{id}{i}"
            );
        }
        let _ = writeln!(
            o,
            "tc filter add dev {dev} parent 1:{id} prio {prio} protocol {proto} \
            u32 match u32 0 0 hashkey mask {mask:#010x} at {at} link {table}:"
        );
    }
}

/// HTB + fq_codel in three priority classes per direction, as sqm-scripts' simple.qos (marks by
/// DSCP with u32 instead of iptables: EF and CS6 to the first class, CS1 to the last).
pub fn tc_htb(s: &Shaping, l: Leaf) -> String {
    let mut o = String::new();
    let what = match l {
        Leaf::FqCodel => "HTB shaper with fq_codel leaves (sqm-scripts' simple.qos)".to_string(),
        Leaf::Fifo => format!(
            "HTB shaper with FIFO leaves, best effort hashed onto {} FIFOs (for \
            kernels without fq_codel)",
            crate::advise::FIFO_BUCKETS
        ),
    };
    header(
        &mut o,
        if l == Leaf::FqCodel {
            "tc-htb-fqcodel"
        } else {
            "tc-htb-fifo"
        },
        &what,
        s,
    );
    if let Some(up) = s.up_kbit {
        let dev = &s.dev;
        let b = burst(up);
        let _ = writeln!(
            o,
            "# Upload: 1:11 voice and control (EF, CS6), 1:12 everything else, 1:13 bulk (CS1)."
        );
        // With FIFO leaves 1:12 is split into hashed buckets, and HTB's default must be a leaf.
        let default = if l == Leaf::Fifo { 120 } else { 12 };
        let _ = writeln!(
            o,
            "tc qdisc replace dev {dev} root handle 1: {}htb default {default}",
            s.stab()
        );
        let _ = writeln!(
            o,
            "tc class replace dev {dev} parent 1: classid 1:1 htb rate {up}kbit \
            ceil {up}kbit burst {b} cburst {b} quantum {b}"
        );
        let sub = up.saturating_sub(16).max(1);
        // With FIFO leaves the first class also carries every small packet, the download's
        // ACKs among them (1.2 Mbit/s of them at 51 Mbit/s down): two thirds, not one, or
        // they fill its FIFO and a call's packets wait and drop behind them.
        let first_ceil = if l == Leaf::Fifo { up * 2 / 3 } else { up / 3 };
        for (id, rate, ceil, prio) in [
            (11, 128.min(up / 3).max(1), first_ceil.max(1), 1),
            (12, (up / 6).max(1), sub, 2),
            (13, (up / 6).max(1), sub, 3),
        ] {
            let _ = writeln!(
                o,
                "tc class replace dev {dev} parent 1:1 classid 1:{id} htb rate \
                {rate}kbit ceil {ceil}kbit burst {b} cburst {b} quantum {b} prio {prio}"
            );
            if id == 12 && l == Leaf::Fifo {
                hashed_fifos(&mut o, dev, 12, (rate, ceil, prio), up, Port::Source);
            } else {
                let _ = writeln!(
                    o,
                    "tc qdisc replace dev {dev} parent 1:{id} handle {id}0: {}",
                    leaf(l, up)
                );
            }
        }
        // The TOS byte carries DSCP in its upper six bits: EF 46 -> 0xb8, CS6 48 -> 0xc0, CS1 8 ->
        // 0x20.
        for (prio, tos, class) in [(1, "0xb8", 11), (2, "0xc0", 11), (3, "0x20", 13)] {
            let _ = writeln!(
                o,
                "tc filter replace dev {dev} parent 1: protocol ip prio {prio} u32 \
                match ip tos {tos} 0xfc flowid 1:{class}"
            );
        }
        for (prio, tos, class) in [(4, "0xb8", 11), (5, "0xc0", 11), (6, "0x20", 13)] {
            let _ = writeln!(
                o,
                "tc filter replace dev {dev} parent 1: protocol ipv6 prio {prio} \
                u32 match ip6 priority {tos} 0xfc flowid 1:{class}"
            );
        }
        if l == Leaf::Fifo {
            // Small packets first, as wondershaper did with ACKs and packets under 64 bytes:
            // without AQM a FIFO bucket shared with a bulk flow holds a call's packet behind up
            // to its length (measured +65 ms when the probes' bucket met an upload's), and a
            // download's pure ACKs (over 1 Mbit/s up at 50 Mbit/s down) must not wait behind
            // the upload's data. Every packet under 128 bytes (ACKs with SACK blocks, VoIP,
            // DNS, game updates) goes to the first class, whose ceiling keeps a flood of them
            // to a third of the rate. IPv4: total length; IPv6: payload length.
            let _ = writeln!(
                o,
                "tc filter replace dev {dev} parent 1: protocol ip prio 7 u32 \
                match u16 0x0000 0xff80 at 2 flowid 1:11"
            );
            let _ = writeln!(
                o,
                "tc filter replace dev {dev} parent 1: protocol ipv6 prio 8 u32 \
                match u16 0x0000 0xff80 at 4 flowid 1:11"
            );
            // The rest to 1:12, whose own filters pick a bucket.
            for (prio, proto) in [(9, "ip"), (10, "ipv6")] {
                let _ = writeln!(
                    o,
                    "tc filter replace dev {dev} parent 1: protocol {proto} prio \
                    {prio} u32 match u32 0 0 flowid 1:12"
                );
            }
        }
    }
    if let Some(down) = s.down_kbit {
        ingress_redirect(&mut o, s);
        let (ifb, b) = (s.ifb(), burst(down));
        if l == Leaf::Fifo {
            // No classes by mark (marks from the Internet are not trusted), but small packets
            // first here too: a reply in a bucket shared with a download waits behind its FIFO.
            let _ = writeln!(
                o,
                "# Small packets first (a third of the rate at most), the rest \
                hashed onto FIFOs by port."
            );
            let _ = writeln!(
                o,
                "tc qdisc replace dev {ifb} root handle 1: {}htb default 100",
                s.stab()
            );
            let _ = writeln!(
                o,
                "tc class replace dev {ifb} parent 1: classid 1:1 htb rate \
                {down}kbit ceil {down}kbit burst {b} cburst {b} quantum {b}"
            );
            let _ = writeln!(
                o,
                "tc class replace dev {ifb} parent 1:1 classid 1:11 htb rate \
                {}kbit ceil {}kbit burst {b} cburst {b} quantum {b} prio \
                1",
                128.min(down / 3).max(1),
                (down / 3).max(1)
            );
            let _ = writeln!(
                o,
                "tc qdisc replace dev {ifb} parent 1:11 handle 110: {}",
                leaf(l, down / 3)
            );
            let _ = writeln!(
                o,
                "tc class replace dev {ifb} parent 1:1 classid 1:10 htb rate \
                {}kbit ceil {down}kbit burst {b} cburst {b} quantum {b} prio 2",
                (down / 2).max(1)
            );
            let _ = writeln!(
                o,
                "tc filter replace dev {ifb} parent 1: protocol ip prio 1 u32 \
                match u16 0x0000 0xff80 at 2 flowid 1:11"
            );
            let _ = writeln!(
                o,
                "tc filter replace dev {ifb} parent 1: protocol ipv6 prio 2 u32 \
                match u16 0x0000 0xff80 at 4 flowid 1:11"
            );
            let _ = writeln!(
                o,
                "tc filter replace dev {ifb} parent 1: protocol all prio 3 u32 \
                match u32 0 0 flowid 1:10"
            );
            hashed_fifos(
                &mut o,
                &ifb,
                10,
                ((down / 2).max(1), down, 2),
                down,
                Port::Destination,
            );
        } else {
            let _ = writeln!(
                o,
                "# One class: marks from the Internet are not trusted (sqm's \
                default: ignore ingress DSCP)."
            );
            let _ = writeln!(
                o,
                "tc qdisc replace dev {ifb} root handle 1: {}htb default 10",
                s.stab()
            );
            let _ = writeln!(
                o,
                "tc class replace dev {ifb} parent 1: classid 1:10 htb rate \
                {down}kbit ceil {down}kbit burst {b} cburst {b} quantum {b}"
            );
            let _ = writeln!(
                o,
                "tc qdisc replace dev {ifb} parent 1:10 handle 100: {}",
                leaf(l, down)
            );
        }
    }
    undo(&mut o, s);
    o
}

/// A class of the FireQOS-style home layout: what it carries and how it is matched.
struct Class {
    id: u32,
    name: &'static str,
    /// Guaranteed share of the rate, percent.
    commit: u64,
    why: &'static str,
}

const CLASSES: [Class; 5] = [
    Class {
        id: 10,
        name: "voice",
        commit: 20,
        why: "EF and CS6 marks, RTP (UDP 16384-32767)",
    },
    Class {
        id: 20,
        name: "sip",
        commit: 5,
        why: "SIP signalling, 5060/5061",
    },
    Class {
        id: 30,
        name: "netctl",
        commit: 5,
        why: "ICMP and DNS",
    },
    Class {
        id: 40,
        name: "interactive",
        commit: 10,
        why: "SSH, fair-queued so an rsync over SSH does not starve keystrokes",
    },
    Class {
        id: 50,
        name: "default",
        commit: 60,
        why: "everything else",
    },
];

/// u32 matches per class, IPv4 then IPv6 (fixed offsets: no IP options or extension headers).
fn class_matches(id: u32) -> Vec<(&'static str, String)> {
    let ports = |proto: u8, port: u16| {
        vec![
            (
                "ip",
                format!("match ip protocol {proto} 0xff match ip dport {port} 0xffff"),
            ),
            (
                "ip",
                format!("match ip protocol {proto} 0xff match ip sport {port} 0xffff"),
            ),
            (
                "ipv6",
                format!("match ip6 protocol {proto} 0xff match ip6 dport {port} 0xffff"),
            ),
            (
                "ipv6",
                format!("match ip6 protocol {proto} 0xff match ip6 sport {port} 0xffff"),
            ),
        ]
    };
    match id {
        10 => vec![
            ("ip", "match ip tos 0xb8 0xfc".into()),
            ("ip", "match ip tos 0xc0 0xfc".into()),
            ("ipv6", "match ip6 priority 0xb8 0xfc".into()),
            ("ipv6", "match ip6 priority 0xc0 0xfc".into()),
            // 16384-32767 is exactly the ports with the top bits 01.
            (
                "ip",
                "match ip protocol 17 0xff match ip dport 0x4000 0xc000".into(),
            ),
            (
                "ipv6",
                "match ip6 protocol 17 0xff match ip6 dport 0x4000 0xc000".into(),
            ),
        ],
        20 => [ports(17, 5060), ports(6, 5060), ports(6, 5061)].concat(),
        30 => [
            vec![
                ("ip", "match ip protocol 1 0xff".to_string()),
                ("ipv6", "match ip6 protocol 58 0xff".to_string()),
            ],
            ports(17, 53),
            ports(6, 53),
        ]
        .concat(),
        40 => ports(6, 22),
        _ => Vec::new(),
    }
}

fn htb_classes_on(o: &mut String, dev: &str, kbit: u64, l: Leaf, s: &Shaping) {
    let b = burst(kbit);
    let _ = writeln!(
        o,
        "tc qdisc replace dev {dev} root handle 1: {}htb default 50",
        s.stab()
    );
    let _ = writeln!(
        o,
        "tc class replace dev {dev} parent 1: classid 1:1 htb rate {kbit}kbit ceil \
        {kbit}kbit burst {b} cburst {b} quantum {b}"
    );
    for (prio, c) in CLASSES.iter().enumerate() {
        let _ = writeln!(o, "# 1:{} {}: {}", c.id, c.name, c.why);
        let rate = (kbit * c.commit / 100).max(1);
        let _ = writeln!(
            o,
            "tc class replace dev {dev} parent 1:1 classid 1:{} htb rate \
            {rate}kbit ceil {kbit}kbit burst {b} cburst {b} quantum {b} prio {prio}",
            c.id
        );
        let _ = writeln!(
            o,
            "tc qdisc replace dev {dev} parent 1:{0} handle {0}: {1}",
            c.id,
            leaf(l, kbit)
        );
    }
    let mut prio = 1;
    for c in &CLASSES {
        for (proto, m) in class_matches(c.id) {
            let _ = writeln!(
                o,
                "tc filter replace dev {dev} parent 1: protocol {proto} prio \
                {prio} u32 {m} flowid 1:{}",
                c.id
            );
            prio += 1;
        }
    }
}

/// HTB classes with priority for voice, SIP, network control and interactive SSH: the layout
/// of a FireQOS home setup, in plain tc.
pub fn tc_htb_classes(s: &Shaping, l: Leaf) -> String {
    let mut o = String::new();
    header(
        &mut o,
        "tc-htb-classes",
        "HTB classes: voice, SIP, network control, SSH, default (a FireQOS home layout)",
        s,
    );
    if let Some(up) = s.up_kbit {
        let _ = writeln!(o, "# Upload on {}.", s.dev);
        htb_classes_on(&mut o, &s.dev, up, l, s);
    }
    if let Some(down) = s.down_kbit {
        ingress_redirect(&mut o, s);
        htb_classes_on(&mut o, &s.ifb(), down, l, s);
    }
    undo(&mut o, s);
    o
}

/// An /etc/config/sqm section for OpenWrt's sqm-scripts.
pub fn openwrt_sqm(s: &Shaping, cake: bool) -> String {
    let mut o = format!(
        "# bloatlab config openwrt-sqm: paste into /etc/config/sqm, then \
        /etc/init.d/sqm restart\n# {}\n",
        s.describe()
    );
    let _ = writeln!(o, "config queue '{}'", s.dev.replace(['\'', '.'], "_"));
    let _ = writeln!(o, "\toption enabled '1'\n\toption interface '{}'", s.dev);
    let _ = writeln!(
        o,
        "\t# kbit/s; 0 leaves a direction unshaped\n\toption download '{}'\n\toption upload '{}'",
        s.down_kbit.unwrap_or(0),
        s.up_kbit.unwrap_or(0)
    );
    if cake {
        let _ = writeln!(
            o,
            "\t# layer_cake: CAKE with diffserv3 tins, so voice marked EF goes \
            first\n\toption qdisc 'cake'\n\toption script 'layer_cake.qos'"
        );
        if s.ack_filter {
            // sqm appends eqdisc_opts to the upload's CAKE only with both advanced switches on;
            // its other defaults stay as they were.
            let _ = writeln!(
                o,
                "\t# ack-filter on the upload: fewer redundant ACKs on a slow upstream\n\toption \
                    qdisc_advanced '1'\n\toption qdisc_really_really_advanced '1'\n\toption \
                    eqdisc_opts 'ack-filter'"
            );
        }
    } else {
        let _ = writeln!(
            o,
            "\t# simple.qos: HTB with three priority classes and fq_codel \
            leaves\n\toption qdisc 'fq_codel'\n\toption script 'simple.qos'"
        );
    }
    let _ = writeln!(
        o,
        "\toption linklayer '{}'\n\toption overhead '{}'",
        s.link.sqm_linklayer(),
        s.link.overhead()
    );
    if s.link.mpu() > 0 {
        let _ = writeln!(
            o,
            "\toption linklayer_advanced '1'\n\toption tcMPU '{}'",
            s.link.mpu()
        );
    }
    o
}

/// The same classes in FireQOS's language (/etc/firehol/fireqos.conf).
pub fn fireqos(s: &Shaping) -> String {
    let mut o = format!(
        "# bloatlab config fireqos: /etc/firehol/fireqos.conf, then fireqos start\n# {}\n",
        s.describe()
    );
    let linklayer = match s.link.framing() {
        Framing::Atm => format!(" atm overhead {}", s.link.overhead()),
        _ if s.link.overhead() > 0 => format!(
            " ethernet overhead {} mpu {}",
            s.link.overhead(),
            s.link.mpu()
        ),
        _ => String::new(),
    };
    for (name, dir, kbit) in [
        ("world-in", "input", s.down_kbit),
        ("world-out", "output", s.up_kbit),
    ] {
        let Some(kbit) = kbit else { continue };
        let _ = writeln!(
            o,
            "interface46 {} {name} {dir} rate {kbit}kbit{linklayer}",
            s.dev
        );
        let _ = writeln!(
            o,
            "   class voice commit 20%\n      match dscp EF\n      match dscp \
            CS6\n      match udp dports 16384:32767"
        );
        let _ = writeln!(
            o,
            "   class sip commit 5%\n      match tcp,udp port 5060,5061"
        );
        let _ = writeln!(
            o,
            "   class netctl commit 5%\n      match icmp\n      match tcp,udp port 53"
        );
        let _ = writeln!(
            o,
            "   class interactive commit 10%\n      match tcp port 22"
        );
        let _ = writeln!(
            o,
            "   # everything else goes to FireQOS's own default class"
        );
    }
    o
}

/// nftables: wash DSCP on what comes from the Internet, mark voice CS6 (Linux Wi-Fi maps DSCP
/// 48 to the VO access category; EF, 46, lands in VI on kernels before the RFC 8325 mapping).
pub fn nft_dscp(s: &Shaping) -> String {
    let dev = &s.dev;
    format!(
        r#"#!/usr/sbin/nft -f
{head}
table inet bloatlab_dscp {{
	chain wash_from_internet {{
		type filter hook prerouting priority mangle; policy accept;
		# Marks set outside the LAN are not ours to honour: best effort.
		iifname "{dev}" ip dscp != cs0 ip dscp set cs0
		iifname "{dev}" ip6 dscp != cs0 ip6 dscp set cs0
	}}
	chain mark_voice {{
		type filter hook postrouting priority mangle; policy accept;
		# RTP from the LAN, and anything already marked EF: CS6 (48), the Wi-Fi VO queue.
		oifname != "{dev}" udp dport 16384-32767 ip dscp set cs6
		oifname != "{dev}" udp dport 16384-32767 ip6 dscp set cs6
		ip dscp ef ip dscp set cs6
		ip6 dscp ef ip6 dscp set cs6
	}}
}}
"#,
        head = "# bloatlab config nft-dscp: DSCP washing and voice marking \
            (nft -f FILE; undo: nft delete table inet bloatlab_dscp)",
    )
}

/// Page-cache writeback limits from a link's rate: background writeback starts once
/// `background_ns` of the link's worth is dirty, writers are throttled beyond `delay_ns`.
pub fn writeback_bytes(rate_bps: u64, ns: u64) -> u64 {
    (u128::from(rate_bps) * u128::from(ns) / 8 / 1_000_000_000) as u64
}

pub fn sysctl_writeback(rate_bps: u64, background_ns: u64, delay_ns: u64) -> String {
    let (bg, fg) = (
        writeback_bytes(rate_bps, background_ns),
        writeback_bytes(rate_bps, delay_ns),
    );
    format!(
        "# bloatlab config sysctl-writeback: the page cache in front of a {rate_bps} bit/s link \
            ({} B/s)\n\
         # holds at most {} ms of it before writeback starts, and {} ms before writers wait, so a\n\
         # large write (NFS, a USB disk) does not queue seconds of data. Apply: sysctl -p FILE\n\
         # (setting the *_bytes values sets vm.dirty_background_ratio and vm.dirty_ratio to 0).\n\
         vm.dirty_background_bytes = {bg}\n\
         vm.dirty_bytes = {fg}\n",
        rate_bps / 8,
        background_ns / 1_000_000,
        delay_ns / 1_000_000
    )
}

/// How long a packet may wait in the tunnel device's ring, ms: a short FIFO's worth.
const TUNNEL_QUEUE_MS: f64 = 20.0;

/// The tunnel device's ring in packets: TUNNEL_QUEUE_MS at the tunnel's rate in its own
/// packets, at least 10 (a few packets of slack for a sender's bursts).
fn tunnel_ring_packets(rate_bps: u64, packet_bytes: u32) -> u64 {
    ((rate_bps as f64 / 8.0 * TUNNEL_QUEUE_MS / 1e3) / f64::from(packet_bytes))
        .ceil()
        .max(10.0) as u64
}

/// Where OpenVPN's `up` script goes (`bloatlab config openvpn-up` prints it).
const TUNNEL_UP_SCRIPT: &str = "/etc/openvpn/bloatlab-tunnel-qdisc.sh";

/// OpenVPN settings that keep the throughput of the classic recipe (AEAD cipher, large tunnel
/// packets on a LAN, no Nagle, kernel-sized socket buffers) without its 15000-packet queue.
/// A tun device never stops its transmit queue (Linux 6.18, measured): whatever OpenVPN has not
/// read waits in the device's own ring of `txqueuelen` packets, which no qdisc sees, so that
/// ring is the tunnel's queue and is sized here to 20 ms of the tunnel's rate. `path_mtu`: the
/// path's MTU from `test mtu` (an Internet path: standard tunnel packets clamped to it); absent,
/// a LAN both ends control. `rate_bps`: the tunnel's goodput (from `compare`); with it, an `up`
/// script shapes just below it into a smart queue where the kernel has one.
pub fn openvpn(path_mtu: Option<u32>, rate_bps: Option<u64>) -> String {
    let (tun_mtu, mtu_lines) = match path_mtu {
        Some(p) => (
            1500,
            format!(
                "tun-mtu 1500\n\
                 # The path carries {p}-byte packets (bloatlab test mtu): TCP inside the tunnel is \
                     told\n\
                 # to keep each encapsulated UDP payload within {m} bytes, so nothing is \
                     fragmented\n\
                 # or lost in a black hole ({p} less 28 bytes of IPv4 and UDP; OpenVPN 2.6 also \
                     takes\n\
                 # `mssfix {p} mtu`).\n\
                 mssfix {m}\n",
                m = p.saturating_sub(28)
            ),
        ),
        None => (
            9000,
            "# A LAN both ends control: large tunnel packets halve the per-packet work (the seed \
                measured\n\
             # 630 -> 930 Mbit/s on GbE with mssfix 0; 65k packets halved the CPU in VMs). Only \
                 where\n\
             # no router between the ends has a smaller MTU: else run bloatlab test mtu and give \
                 --mtu.\n\
             tun-mtu 9000\n\
             mssfix 0\n"
                .to_string(),
        ),
    };
    let rate = rate_bps.unwrap_or(1_000_000_000);
    let ring = tunnel_ring_packets(rate, tun_mtu);
    let rate_said = match rate_bps {
        Some(_) => String::new(),
        None => " (no --rate given: 1 Gbit/s assumed; a slower tunnel waits longer in\n# the same \
            ring, so give --rate with the tunnel's goodput from bloatlab compare)"
            .to_string(),
    };
    let up = match rate_bps {
        Some(_) => format!(
            "# Below a shaper just under the tunnel's rate the queue moves from that ring into \
                CAKE or\n\
             # fq_codel, where a call no longer waits behind a bulk flow at all. The script:\n\
             # bloatlab config openvpn-up --rate {mbit}mbit > {TUNNEL_UP_SCRIPT}; chmod +x it.\n\
             script-security 2\n\
             up {TUNNEL_UP_SCRIPT}\n",
            mbit = rate as f64 / 1e6
        ),
        None => "# With --rate this also sets an `up` script that shapes just under the tunnel's \
            rate into\n\
                 # CAKE or fq_codel: a qdisc on a tun device holds nothing without a shaper.\n"
            .to_string(),
    };
    format!(
        "# bloatlab config openvpn: throughput settings for OpenVPN 2.4+ (both ends unless said)\n\
         # without the bufferbloat of the usual recipe. Its `txqueuelen 15000` is the queue in \
             front\n\
         # of every tunnel packet once OpenVPN is the bottleneck (its CPU, or a shaper): a tun \
             device\n\
         # never pushes back on its qdisc, so each packet OpenVPN has not read yet waits in the\n\
         # device's own ring of txqueuelen packets, where no qdisc sees it. 15000 packets of 9000\n\
         # bytes at 930 Mbit/s are 15000 x 9000 x 8 / 930e6 = 1.16 s; of 1500 bytes at 10 Mbit/s,\n\
         # 18 s (OpenVPN's own manual warns that without QoS latency gets worse).\n\
         \n\
         # An AEAD cipher: encryption and authentication in one pass, with AES-NI in hardware.\n\
         cipher AES-256-GCM\n\
         data-ciphers AES-256-GCM:AES-128-GCM:CHACHA20-POLY1305\n\
         {mtu_lines}\
         # No Nagle delay for small packets (calls, keystrokes) on the tunnel's sockets: a server\n\
         # setting, pushed to clients (a client warns and sets only its own side).\n\
         tcp-nodelay\n\
         # Socket buffers sized by the kernel's autotuning, not fixed small ones.\n\
         sndbuf 0\n\
         rcvbuf 0\n\
         # The tunnel's queue: {ring} packets of {tun_mtu} bytes, {ms} ms at {mbit} \
             Mbit/s{rate_said}.\n\
         # With data channel offload (DCO) packets stay in the kernel and skip this ring.\n\
         txqueuelen {ring}\n\
         # With proto tcp (a LAN recipe), at most this many packets wait in OpenVPN's own TCP \
             queue.\n\
         tcp-queue-limit 64\n\
         {up}",
        ms = TUNNEL_QUEUE_MS,
        mbit = rate as f64 / 1e6,
    )
}

/// OpenVPN's `up` script for a tunnel of `rate_bps`: a shaper at 95% of it into CAKE, else HTB
/// with fq_codel, else nothing (the short ring of `config openvpn` alone).
pub fn openvpn_up(rate_bps: u64) -> String {
    let kbit = rate_bps * 95 / 100 / 1000;
    format!(
        "#!/bin/sh\n\
         # bloatlab config openvpn-up: OpenVPN's `up` script for a {mbit} Mbit/s tunnel (OpenVPN \
             passes\n\
         # the device as $1; {TUNNEL_UP_SCRIPT}, chmod +x). A tun device never pushes back\n\
         # on its qdisc, so a qdisc there holds packets only below a shaper slower than the \
             tunnel:\n\
         # {kbit} kbit/s, 95% of its rate. CAKE where the kernel has it, else HTB into fq_codel.\n\
         # A kernel with neither keeps the short ring (txqueuelen) alone: a shaper into a FIFO \
             would\n\
         # cost 5% of the rate and isolate no flow from another.\n\
         dev=\"$1\"\n\
         tc qdisc replace dev \"$dev\" root cake bandwidth {kbit}kbit 2>/dev/null && exit 0\n\
         if tc qdisc replace dev \"$dev\" root handle 1: htb default 1 2>/dev/null &&\n\
         \x20  tc class replace dev \"$dev\" parent 1: classid 1:1 htb rate {kbit}kbit 2>/dev/null \
             &&\n\
         \x20  tc qdisc replace dev \"$dev\" parent 1:1 fq_codel 2>/dev/null; then\n\
         \x20 exit 0\n\
         fi\n\
         tc qdisc del dev \"$dev\" root 2>/dev/null\n\
         # OpenVPN stops if this script fails: the tunnel without a shaper is still a working \
             one.\n\
         exit 0\n",
        mbit = rate_bps as f64 / 1e6,
    )
}

/// The WireGuard MTU for a path (from `test mtu`): the inner packet less WireGuard's 32 bytes
/// and the outer UDP and IP headers, for IPv4 and IPv6 outer paths.
pub fn wireguard_mtu(path_mtu: u32) -> String {
    let v4 = path_mtu.saturating_sub(20 + 8 + 32);
    let v6 = path_mtu.saturating_sub(40 + 8 + 32);
    format!(
        "# bloatlab config wireguard-mtu: the tunnel MTU for a {path_mtu}-byte path (bloatlab test \
            mtu).\n\
         # Each tunnel packet gains 32 bytes of WireGuard (header 16, tag 16), 8 of UDP and 20 of\n\
         # IPv4 (40 of IPv6) on the way out: {path_mtu} - 60 = {v4} over IPv4, {path_mtu} - 80 = \
             {v6}\n\
         # over IPv6 (WireGuard's default 1420 is the IPv6 figure for a 1500-byte path).\n\
         # A smart queue on the tunnel device too: tc qdisc replace dev wg0 root fq_codel\n\
         [Interface]\n\
         MTU = {mtu}\n",
        mtu = v6.min(v4)
    )
}

/// Wireless settings for calls over Wi-Fi on OpenWrt, as commented advice.
pub fn wifi_openwrt() -> String {
    concat!(
        "# bloatlab config wifi-openwrt: /etc/config/wireless advice for VoIP over Wi-Fi \
            (then: wifi reload)\n",
        r#"config wifi-device 'radio0'
	# 2.4 GHz: only channels 1, 6 and 11 do not overlap; pick the least used (iw dev wlan0 scan).
	option channel '6'
	# Lower transmit power: smaller cells, fewer hidden stations, less airtime lost to retries.
	# Start 3-6 dB below the maximum and check the far rooms still get a good rate.
	option txpower '15'
	# No 802.11b rates: a frame at 1 Mbit/s takes 50x the airtime of one at 54.
	option legacy_rates '0'

config wifi-iface 'default_radio0'
	# Basic (beacon and management) rates from 12 Mbit/s: slow beacons eat airtime every 100 ms.
	option basic_rate '12000 18000 24000 36000 48000 54000'
	# A shorter beacon interval (in TU, 1.024 ms) wakes power-saving phones sooner for queued
	# voice frames, at some airtime cost: 50 rather than the default 100.
	option beacon_int '50'
	# WMM on (the default): voice needs the VO access category. Mark calls CS6, not EF
	# (bloatlab config nft-dscp): Linux maps EF to VI on older kernels.
	option wmm '1'
"#
    )
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cable() -> Shaping {
        Shaping {
            dev: "eth0".into(),
            down_kbit: Some(57_000),
            up_kbit: Some(3_610),
            link: LinkType::Docsis,
            ack_filter: false,
        }
    }

    /// The reference's OpenVPN numbers: 15000 x 9000 B at 930 Mbit/s is over a second of
    /// queue; the generated settings keep the cipher, large LAN packets and tcp-nodelay but
    /// size the tunnel's ring to 20 ms and shape into a smart queue where the kernel has one.
    #[test]
    fn openvpn_keeps_the_throughput_lines_and_drops_the_long_fifo() {
        let lan = openvpn(None, Some(930_000_000));
        for line in [
            "cipher AES-256-GCM\n",
            "tun-mtu 9000\n",
            "mssfix 0\n",
            "tcp-nodelay\n",
            "up /etc/openvpn/bloatlab-tunnel-qdisc.sh\n",
        ] {
            assert!(lan.contains(line), "{line:?} missing:\n{lan}");
        }
        assert!(lan.contains("15000 x 9000 x 8 / 930e6 = 1.16 s"));
        // 930 Mbit/s for 20 ms in 9000-byte packets: 2.325 MB / 9000 B = 258.3, so 259.
        assert!(lan.contains("txqueuelen 259\n"), "{lan}");
        let wan = openvpn(Some(1400), Some(10_000_000));
        assert!(
            wan.contains("tun-mtu 1500\n")
                && wan.contains("mssfix 1372\n")
                && !wan.contains("tun-mtu 9000"),
            "{wan}"
        );
        // 10 Mbit/s for 20 ms in 1500-byte packets: 25 000 B / 1500 B = 16.7, so 17.
        assert!(
            wan.contains("txqueuelen 17\n") && wan.contains("openvpn-up --rate 10mbit"),
            "{wan}"
        );
        // Slower than 10 packets in 20 ms, the ring keeps 10.
        assert_eq!(tunnel_ring_packets(1_000_000, 1500), 10);
        let unknown = openvpn(None, None);
        assert!(
            unknown.contains("1 Gbit/s assumed") && !unknown.contains("\nup "),
            "no rate, no script to shape at it:\n{unknown}"
        );
        let up = openvpn_up(10_000_000);
        assert!(
            up.contains("cake bandwidth 9500kbit")
                && up.contains("htb rate 9500kbit")
                && up.ends_with("exit 0\n"),
            "{up}"
        );
        assert!(wireguard_mtu(1500).contains("MTU = 1420\n"));
        assert!(wireguard_mtu(1400).contains("1400 - 60 = 1340"));
    }

    #[test]
    fn the_script_follows_what_the_kernel_has() {
        let s = cable();
        let (cake, said) = for_kernel(&s, |_| true);
        assert!(
            cake.contains("cake bandwidth 3610kbit") && said.is_none(),
            "{cake}"
        );
        let (fq, said) = for_kernel(&s, |q| q == "fq_codel");
        assert!(
            fq.contains(": fq_codel")
                && !fq.contains(" cake ")
                && said.unwrap().contains("no CAKE"),
            "{fq}"
        );
        let (fifo, said) = for_kernel(&s, |_| false);
        assert!(
            fifo.contains("pfifo limit")
                && !fifo.contains(": fq_codel")
                && said.unwrap().contains("neither"),
            "{fifo}"
        );
    }

    /// Every generator's whole output for the cable line, against the files in
    /// tests/golden (BLOATLAB_BLESS=1 rewrites them after a deliberate change; review the diff).
    #[test]
    fn every_generator_matches_its_golden_file() {
        let s = cable();
        let adsl = Shaping {
            dev: "pppoe-wan".into(),
            down_kbit: Some(15_000),
            up_kbit: Some(900),
            link: LinkType::PppoeLlcsnap,
            ack_filter: false,
        };
        let cases = [
            ("tc-cake", tc_cake(&s)),
            ("tc-htb-fqcodel", tc_htb(&s, Leaf::FqCodel)),
            ("tc-htb-fifo", tc_htb(&s, Leaf::Fifo)),
            ("tc-htb-classes", tc_htb_classes(&s, Leaf::FqCodel)),
            (
                "tc-htb-classes-adsl-fifo",
                tc_htb_classes(&adsl, Leaf::Fifo),
            ),
            ("openwrt-sqm", openwrt_sqm(&s, true)),
            ("openwrt-sqm-adsl-simple", openwrt_sqm(&adsl, false)),
            ("fireqos", fireqos(&s)),
            ("nft-dscp", nft_dscp(&s)),
            (
                "sysctl-writeback",
                sysctl_writeback(1 << 30, 250_000_000, 1_500_000_000),
            ),
            ("wifi-openwrt", wifi_openwrt()),
        ];
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
        let bless = std::env::var_os("BLOATLAB_BLESS").is_some();
        for (name, text) in cases {
            let file = dir.join(format!("{name}.txt"));
            if bless {
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(&file, &text).unwrap();
            }
            let want = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert_eq!(text, want, "{name} differs from {}", file.display());
        }
    }

    #[test]
    fn writeback_numbers_of_the_issue() {
        // bloatlab config sysctl-writeback --rate 1Gibit --background-delay 250ms --delay 1.5s
        let rate = bloatlab_units::parse_rate("1Gibit").unwrap();
        assert_eq!(writeback_bytes(rate, 250_000_000), 33_554_432);
        assert_eq!(writeback_bytes(rate, 1_500_000_000), 201_326_592);
        let t = sysctl_writeback(rate, 250_000_000, 1_500_000_000);
        assert!(
            t.contains("vm.dirty_background_bytes = 33554432\nvm.dirty_bytes = 201326592\n"),
            "{t}"
        );
    }

    #[test]
    fn tc_cake_golden() {
        let want = "#!/bin/sh
# bloatlab config tc-cake: CAKE shaping on eth0
# upload 3610 kbit/s, download 57000 kbit/s; link docsis (overhead 18 B, mpu 64)
# Run as root; undo with the lines at the end.
set -e
# Upload: diffserv3 honours EF and CS1 marks; dual-srchost shares by LAN host (nat reads
# the addresses behind this router's NAT).
tc qdisc replace dev eth0 root cake bandwidth 3610kbit docsis nat dual-srchost diffserv3
# Download: what arrives on eth0 is redirected to ifb4eth0 and shaped on its way out there.
ip link add name ifb4eth0 type ifb 2>/dev/null || true
ip link set dev ifb4eth0 up
tc qdisc replace dev eth0 handle ffff: ingress
tc filter replace dev eth0 parent ffff: protocol all prio 10 u32 match u32 0 0 action mirred \
    egress redirect dev ifb4eth0
# ingress: drop rather than only mark early, as the queue is after the bottleneck; wash and
# besteffort: DSCP from the Internet is not to be trusted (tc-cake(8)).
tc qdisc replace dev ifb4eth0 root cake bandwidth 57000kbit docsis nat dual-dsthost ingress wash \
    besteffort
# Undo:
#   tc qdisc del dev eth0 root; tc qdisc del dev eth0 ingress; ip link del ifb4eth0
";
        assert_eq!(tc_cake(&cable()), want);
        let acks = tc_cake(&Shaping {
            ack_filter: true,
            ..cable()
        });
        assert!(
            acks.contains(
                "tc qdisc replace dev eth0 root cake bandwidth 3610kbit docsis nat \
            dual-srchost diffserv3 ack-filter\n"
            ),
            "{acks}"
        );
        assert_eq!(
            acks.matches("ack-filter").count(),
            2,
            "the upload's line and its comment: {acks}"
        );
    }

    #[test]
    fn htb_fq_codel_follows_simple_qos() {
        let t = tc_htb(&cable(), Leaf::FqCodel);
        // simple.qos: 1:11 at 128 kbit with ceil a third, 1:12 and 1:13 a sixth with ceil rate-16.
        assert!(
            t.contains(
                "tc qdisc replace dev eth0 root handle 1: stab overhead 18 mpu 64 \
            linklayer ethernet htb default 12\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "classid 1:11 htb rate 128kbit ceil 1203kbit burst 1749 cburst 1749 \
            quantum 1749 prio 1\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "classid 1:13 htb rate 601kbit ceil 3594kbit burst 1749 cburst 1749 \
            quantum 1749 prio 3\n"
            ),
            "{t}"
        );
        // sqm's auto target on the 3.61 Mbit/s upload: 13992000 / 3610 = 3875 us < 5 ms.
        assert!(
            t.contains("fq_codel limit 1001 quantum 300 target 5000us interval 100000us ecn"),
            "{t}"
        );
        assert!(t.contains("u32 match ip tos 0xb8 0xfc flowid 1:11"), "{t}");
        assert!(
            t.contains(
                "tc class replace dev ifb4eth0 parent 1: classid 1:10 htb rate \
            57000kbit ceil 57000kbit burst 7125 cburst 7125 quantum 7125\n"
            ),
            "{t}"
        );
        let slow = Shaping {
            up_kbit: Some(700),
            ..cable()
        };
        assert!(
            tc_htb(&slow, Leaf::FqCodel).contains("target 19988us interval 114988us"),
            "a 700 kbit/s uplink gets sqm's longer target"
        );
    }

    #[test]
    fn openwrt_sqm_and_fireqos_carry_rates_and_overhead() {
        let t = openwrt_sqm(&cable(), true);
        for line in [
            "\toption download '57000'",
            "\toption upload '3610'",
            "\toption script 'layer_cake.qos'",
            "\toption linklayer 'ethernet'",
            "\toption overhead '18'",
            "\toption tcMPU '64'",
        ] {
            assert!(t.contains(line), "{line} in {t}");
        }
        assert!(!t.contains("ack-filter"), "{t}");
        let acks = openwrt_sqm(
            &Shaping {
                ack_filter: true,
                ..cable()
            },
            true,
        );
        assert!(
            acks.contains(
                "\toption qdisc_really_really_advanced '1'\n\toption eqdisc_opts 'ack-filter'\n"
            ),
            "{acks}"
        );
        let adsl = Shaping {
            link: LinkType::PppoeLlcsnap,
            ..cable()
        };
        assert!(openwrt_sqm(&adsl, false)
            .contains("\toption linklayer 'atm'\n\toption overhead '40'\n"));
        let f = fireqos(&cable());
        assert!(
            f.contains(
                "interface46 eth0 world-in input rate 57000kbit ethernet overhead 18 mpu 64\n"
            ),
            "{f}"
        );
        assert!(
            f.contains("interface46 eth0 world-out output rate 3610kbit"),
            "{f}"
        );
        assert_eq!(f.matches("class voice commit 20%").count(), 2);
    }

    #[test]
    fn nft_marks_voice_cs6_and_washes_the_internets_marks() {
        let t = nft_dscp(&cable());
        assert!(t.contains("iifname \"eth0\" ip dscp != cs0 ip dscp set cs0"));
        assert!(t.contains("ip dscp ef ip dscp set cs6"));
    }

    #[test]
    fn class_layout_matches_every_class_but_the_default() {
        let t = tc_htb_classes(&cable(), Leaf::Fifo);
        for c in &CLASSES[..4] {
            assert!(t.contains(&format!("flowid 1:{}\n", c.id)), "{}", c.name);
        }
        assert!(
            !t.contains("flowid 1:50"),
            "the default class takes what nothing matched"
        );
        assert!(t.contains("u32 match ip protocol 6 0xff match ip dport 22 0xffff flowid 1:40"));
    }
}
