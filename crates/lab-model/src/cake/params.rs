//! CAKE's settings, read from the words `tc qdisc ... cake` takes (iproute2 `q_cake.c`, man
//! tc-cake(8)), and the per-tin figures the kernel derives from them (`cake_set_rate`,
//! `cake_config_*`, `cake_reconfigure` in `net/sched/sch_cake.c`).

use crate::values::{parse_rate, parse_time_ns, ConfigError};
use crate::MS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TinMode {
    BestEffort,
    Precedence,
    Diffserv8,
    Diffserv4,
    Diffserv3,
}

/// Host and flow isolation, with the kernel's bit values (`CAKE_FLOW_*`): bit 0 source host,
/// bit 1 destination host, bit 2 flows; the dual and triple modes combine them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowMode {
    Flowblind = 0,
    SrcHost = 1,
    DstHost = 2,
    Hosts = 3,
    Flows = 4,
    DualSrcHost = 5,
    DualDstHost = 6,
    TripleIsolate = 7,
}

impl FlowMode {
    fn bits(self) -> u8 {
        self as u8
    }
    pub fn hashes_flows(self) -> bool {
        self.bits() & 4 != 0
    }
    pub fn hashes_hosts(self) -> bool {
        self.bits() & 3 != 0
    }
    /// Fairness across source hosts (`cake_dsrc`: dual-srchost and triple-isolate).
    pub fn dual_src(self) -> bool {
        self.bits() & 5 == 5
    }
    /// Fairness across destination hosts (`cake_ddst`: dual-dsthost and triple-isolate).
    pub fn dual_dst(self) -> bool {
        self.bits() & 6 == 6
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckFilter {
    Off,
    On,
    Aggressive,
}

/// Link-layer cell framing the shaper accounts for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    None,
    /// ATM: 48-byte payload cells of 53 bytes.
    Atm,
    /// PTM (VDSL2): one byte per 64 or part thereof.
    Ptm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CakeParams {
    /// Shaper rate in bits/s; 0 = `unlimited` (no shaping, tins share by weight).
    pub bandwidth_bps: u64,
    pub autorate_ingress: bool,
    pub tin_mode: TinMode,
    pub flow_mode: FlowMode,
    /// Accepted for fidelity to tc; the lab routes without NAT, so every host already shows
    /// its own address and `nat` changes nothing (see `cake_update_flowkeys`).
    pub nat: bool,
    pub wash: bool,
    pub ack_filter: AckFilter,
    /// Bytes added per packet; None is `raw`: the length the link accounts as is.
    pub overhead: Option<i32>,
    pub mpu: u32,
    pub framing: Framing,
    /// `rtt`: CoDel's interval before per-tin tuning.
    pub interval_ns: u64,
    pub target_ns: u64,
    /// `memlimit` in bytes of packet memory (skb truesize); None: the kernel's default.
    pub memlimit: Option<u64>,
    pub ingress: bool,
    /// Accepted and ignored: the lab's packets are never GSO aggregates.
    pub split_gso: bool,
}

impl Default for CakeParams {
    /// tc-cake(8) defaults: unlimited, diffserv3, triple-isolate, nonat, nowash, no-ack-filter,
    /// raw, rtt 100ms (target 5ms), egress, split-gso.
    fn default() -> Self {
        CakeParams {
            bandwidth_bps: 0,
            autorate_ingress: false,
            tin_mode: TinMode::Diffserv3,
            flow_mode: FlowMode::TripleIsolate,
            nat: false,
            wash: false,
            ack_filter: AckFilter::Off,
            overhead: None,
            mpu: 0,
            framing: Framing::None,
            interval_ns: 100 * MS,
            target_ns: 5 * MS,
            memlimit: None,
            ingress: false,
            split_gso: true,
        }
    }
}

fn bad(msg: String) -> ConfigError {
    ConfigError::Value(format!("cake: {msg}"))
}

/// Sizes as tc reads them (`get_size`): bytes, or with k/m/g (1024-based) and an optional b.
fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let t = s.to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .filter(|&n| n > 0)
        .map(|n| n * mult)
        .ok_or_else(|| bad(format!("memlimit `{s}`: want bytes, e.g. 4mb")))
}

impl CakeParams {
    /// Reads tc's words, e.g. `bandwidth 57mbit diffserv4 docsis ack-filter`.
    pub fn parse(words: &str) -> Result<CakeParams, ConfigError> {
        let mut p = CakeParams::default();
        let mut overhead: i32 = 0;
        let mut overhead_set = false;
        let mut raw = false;
        let mut it = words.split_whitespace();
        fn arg<'a>(
            it: &mut std::str::SplitWhitespace<'a>,
            key: &str,
        ) -> Result<&'a str, ConfigError> {
            it.next()
                .ok_or_else(|| bad(format!("`{key}` needs a value")))
        }
        while let Some(w) = it.next() {
            match w {
                "bandwidth" => p.bandwidth_bps = parse_rate(arg(&mut it, w)?)?,
                "unlimited" => p.bandwidth_bps = 0,
                "autorate-ingress" => p.autorate_ingress = true,
                "besteffort" => p.tin_mode = TinMode::BestEffort,
                "precedence" => p.tin_mode = TinMode::Precedence,
                "diffserv8" => p.tin_mode = TinMode::Diffserv8,
                "diffserv4" => p.tin_mode = TinMode::Diffserv4,
                "diffserv3" => p.tin_mode = TinMode::Diffserv3,
                "flowblind" => p.flow_mode = FlowMode::Flowblind,
                "srchost" => p.flow_mode = FlowMode::SrcHost,
                "dsthost" => p.flow_mode = FlowMode::DstHost,
                "hosts" => p.flow_mode = FlowMode::Hosts,
                "flows" => p.flow_mode = FlowMode::Flows,
                "dual-srchost" => p.flow_mode = FlowMode::DualSrcHost,
                "dual-dsthost" => p.flow_mode = FlowMode::DualDstHost,
                "triple-isolate" => p.flow_mode = FlowMode::TripleIsolate,
                "nat" => p.nat = true,
                "nonat" => p.nat = false,
                "wash" => p.wash = true,
                "nowash" => p.wash = false,
                "ack-filter" => p.ack_filter = AckFilter::On,
                "ack-filter-aggressive" => p.ack_filter = AckFilter::Aggressive,
                "no-ack-filter" => p.ack_filter = AckFilter::Off,
                "split-gso" => p.split_gso = true,
                "no-split-gso" => p.split_gso = false,
                "ingress" => p.ingress = true,
                "egress" => p.ingress = false,
                "memlimit" => p.memlimit = Some(parse_size(arg(&mut it, w)?)?),
                "rtt" => {
                    let t = parse_time_ns(arg(&mut it, w)?)?.max(1000);
                    p.interval_ns = t;
                    // q_cake.c: target = interval / 20, at least 1 us.
                    p.target_ns = (t / 20).max(1000);
                }
                "target" => p.target_ns = parse_time_ns(arg(&mut it, w)?)?.max(1000),
                "overhead" => {
                    let v = arg(&mut it, w)?;
                    overhead = v
                        .parse::<i32>()
                        .ok()
                        .filter(|o| (-64..=256).contains(o))
                        .ok_or_else(|| bad(format!("overhead `{v}`: want -64..256")))?;
                    overhead_set = true;
                }
                "mpu" => {
                    let v = arg(&mut it, w)?;
                    p.mpu = v
                        .parse::<u32>()
                        .ok()
                        .filter(|m| *m <= 256)
                        .ok_or_else(|| bad(format!("mpu `{v}`: want 0..256")))?;
                }
                "atm" => p.framing = Framing::Atm,
                "ptm" => p.framing = Framing::Ptm,
                "noatm" => p.framing = Framing::None,
                "raw" => {
                    raw = true;
                    p.framing = Framing::None;
                    overhead = 0;
                    overhead_set = true;
                }
                "ether-vlan" => {
                    overhead += 4;
                    overhead_set = true;
                }
                "fwmark" => {
                    return Err(bad(
                        "fwmark: the lab's packets carry no firewall marks".into()
                    ))
                }
                other => {
                    if let Some((interval, target)) = rtt_preset(other) {
                        p.interval_ns = interval;
                        p.target_ns = target;
                    } else if let Some((framing, o, mpu)) = overhead_keyword(other) {
                        p.framing = framing;
                        overhead = o;
                        overhead_set = true;
                        if let Some(m) = mpu {
                            p.mpu = m;
                        }
                    } else {
                        return Err(bad(format!(
                            "unknown word `{other}` (see tc-cake(8): bandwidth, \
                            diffserv3, triple-isolate, docsis, ack-filter, rtt, ...)"
                        )));
                    }
                }
            }
        }
        // The kernel: TCA_CAKE_OVERHEAD sets the flag, TCA_CAKE_RAW (sent by `raw`) clears it.
        p.overhead = (overhead_set && !raw).then_some(overhead);
        Ok(p)
    }

    /// The words back, canonical, as `tc qdisc show` prints them (for `lab stats`).
    pub fn describe(&self) -> String {
        let mut w = vec![if self.bandwidth_bps == 0 {
            "unlimited".to_string()
        } else {
            format!("bandwidth {}kbit", self.bandwidth_bps / 1000)
        }];
        if self.autorate_ingress {
            w.push("autorate-ingress".into());
        }
        w.push(
            match self.tin_mode {
                TinMode::BestEffort => "besteffort",
                TinMode::Precedence => "precedence",
                TinMode::Diffserv8 => "diffserv8",
                TinMode::Diffserv4 => "diffserv4",
                TinMode::Diffserv3 => "diffserv3",
            }
            .into(),
        );
        w.push(
            match self.flow_mode {
                FlowMode::Flowblind => "flowblind",
                FlowMode::SrcHost => "srchost",
                FlowMode::DstHost => "dsthost",
                FlowMode::Hosts => "hosts",
                FlowMode::Flows => "flows",
                FlowMode::DualSrcHost => "dual-srchost",
                FlowMode::DualDstHost => "dual-dsthost",
                FlowMode::TripleIsolate => "triple-isolate",
            }
            .into(),
        );
        w.push(if self.nat { "nat" } else { "nonat" }.into());
        w.push(if self.wash { "wash" } else { "nowash" }.into());
        w.push(
            match self.ack_filter {
                AckFilter::Off => "no-ack-filter",
                AckFilter::On => "ack-filter",
                AckFilter::Aggressive => "ack-filter-aggressive",
            }
            .into(),
        );
        w.push(format!("rtt {}ms", self.interval_ns as f64 / 1e6));
        match self.overhead {
            None => w.push("raw".into()),
            Some(o) => w.push(format!("overhead {o}")),
        }
        match self.framing {
            Framing::Atm => w.push("atm".into()),
            Framing::Ptm => w.push("ptm".into()),
            Framing::None => {}
        }
        if self.mpu > 0 {
            w.push(format!("mpu {}", self.mpu));
        }
        if self.ingress {
            w.push("ingress".into());
        }
        if let Some(m) = self.memlimit {
            w.push(format!("memlimit {m}b"));
        }
        format!("cake {}", w.join(" "))
    }

    /// The bytes the shaper charges for a packet (`cake_calc_overhead`): with an overhead set,
    /// from the IP length (`ip_len`); raw, what the link accounts (`link_len`).
    pub fn adjusted_len(&self, ip_len: usize, link_len: usize) -> u32 {
        let mut len = match self.overhead {
            Some(o) => (ip_len as i64 + o as i64).max(0) as u32,
            None => link_len as u32,
        };
        len = len.max(self.mpu);
        match self.framing {
            Framing::Atm => len.div_ceil(48) * 53,
            Framing::Ptm => len + len.div_ceil(64),
            Framing::None => len,
        }
    }
}

/// `rtt` presets of q_cake.c: (interval, target).
fn rtt_preset(w: &str) -> Option<(u64, u64)> {
    const US: u64 = 1000;
    Some(match w {
        "datacentre" => (100 * US, 5 * US),
        "lan" => (1000 * US, 50 * US),
        "metro" => (10_000 * US, 500 * US),
        "regional" => (30_000 * US, 1500 * US),
        "internet" => (100_000 * US, 5000 * US),
        "oceanic" => (300_000 * US, 15_000 * US),
        "satellite" => (1_000_000 * US, 50_000 * US),
        "interplanetary" => (1_000_000_000 * US, 50_000_000 * US),
        _ => return None,
    })
}

/// Overhead keywords of q_cake.c: (framing, overhead, mpu if the keyword sets one).
fn overhead_keyword(w: &str) -> Option<(Framing, i32, Option<u32>)> {
    let (framing, overhead, mpu) = match w {
        "conservative" => (Framing::Atm, 48, 0),
        "ethernet" => (Framing::None, 38, 84),
        "docsis" => (Framing::None, 18, 64),
        "pppoa-vcmux" => (Framing::Atm, 10, 0),
        "pppoa-llc" => (Framing::Atm, 14, 0),
        "pppoe-vcmux" => (Framing::Atm, 32, 0),
        "pppoe-llcsnap" => (Framing::Atm, 40, 0),
        "bridged-vcmux" => (Framing::Atm, 24, 0),
        "bridged-llcsnap" => (Framing::Atm, 32, 0),
        "ipoa-vcmux" => (Framing::Atm, 8, 0),
        "ipoa-llcsnap" => (Framing::Atm, 16, 0),
        "pppoe-ptm" => (Framing::Ptm, 30, 0),
        "bridged-ptm" => (Framing::Ptm, 22, 0),
        _ => return None,
    };
    Some((framing, overhead, (mpu > 0).then_some(mpu)))
}

/// DSCP -> tin tables of sch_cake.c (index = DSCP, value = tin).
pub(crate) const DIFFSERV3: [u8; 64] = [
    0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, //
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 2, 0, 2, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,
];
pub(crate) const DIFFSERV4: [u8; 64] = [
    0, 1, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2, 0, 2,
    0, //
    3, 0, 2, 0, 2, 0, 2, 0, 3, 0, 0, 0, 3, 0, 3, 0, 3, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0,
];
pub(crate) const DIFFSERV8: [u8; 64] = [
    2, 0, 1, 2, 4, 2, 2, 2, 1, 2, 1, 2, 1, 2, 1, 2, 5, 2, 4, 2, 4, 2, 4, 2, 3, 2, 3, 2, 3, 2, 3,
    2, //
    6, 2, 3, 2, 3, 2, 3, 2, 6, 2, 2, 2, 6, 2, 6, 2, 7, 2, 2, 2, 2, 2, 2, 2, 7, 2, 2, 2, 2, 2, 2, 2,
];

impl TinMode {
    pub fn tin_count(self) -> usize {
        match self {
            TinMode::BestEffort => 1,
            TinMode::Diffserv3 => 3,
            TinMode::Diffserv4 => 4,
            TinMode::Precedence | TinMode::Diffserv8 => 8,
        }
    }

    pub fn tin_of(self, dscp: u8) -> usize {
        let d = (dscp & 63) as usize;
        match self {
            TinMode::BestEffort => 0,
            TinMode::Precedence => d >> 3,
            TinMode::Diffserv8 => DIFFSERV8[d] as usize,
            TinMode::Diffserv4 => DIFFSERV4[d] as usize,
            TinMode::Diffserv3 => DIFFSERV3[d] as usize,
        }
    }

    /// Each tin's threshold rate (bytes/s) and DRR weight from the base rate.
    pub fn tin_rates(self, rate: u64) -> Vec<(u64, u32)> {
        match self {
            TinMode::BestEffort => vec![(rate, 65535)],
            TinMode::Diffserv3 => vec![(rate, 1024), (rate >> 4, 64), (rate >> 2, 256)],
            TinMode::Diffserv4 => vec![
                (rate, 1024),
                (rate >> 4, 64),
                (rate >> 1, 512),
                (rate >> 2, 256),
            ],
            TinMode::Precedence | TinMode::Diffserv8 => {
                let (mut r, mut q) = (rate, 256u32);
                (0..8)
                    .map(|_| {
                        let t = (r, q.max(1));
                        r = (r * 7) >> 3;
                        q = (q * 7) >> 3;
                        t
                    })
                    .collect()
            }
        }
    }

    /// Tin names, by tin index.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            TinMode::BestEffort => &["Tin 0"],
            TinMode::Diffserv3 => &["Best Effort", "Bulk", "Voice"],
            TinMode::Diffserv4 => &["Best Effort", "Bulk", "Video", "Voice"],
            TinMode::Precedence | TinMode::Diffserv8 => &[
                "Tin 0", "Tin 1", "Tin 2", "Tin 3", "Tin 4", "Tin 5", "Tin 6", "Tin 7",
            ],
        }
    }
}

impl TinMode {
    /// Tins in the order `tc -s qdisc` prints them (`tin_order`: bulk first for diffserv3/4).
    pub fn stats_order(self) -> Vec<usize> {
        match self {
            TinMode::Diffserv3 => vec![1, 0, 2],
            TinMode::Diffserv4 => vec![1, 0, 2, 3],
            m => (0..m.tin_count()).collect(),
        }
    }
}

/// What `cake_set_rate` derives for one tin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TinTuning {
    /// Threshold rate, bytes/s (0: unlimited).
    pub rate: u64,
    pub flow_quantum: u32,
    pub target_ns: u64,
    pub interval_ns: u64,
    /// Serialisation time of one MTU-sized frame at the tin's rate.
    pub mtu_time_ns: u64,
}

/// Nanoseconds to send `len` bytes at `rate` bytes/s (0 = unlimited: no time).
pub fn duration_ns(len: u64, rate: u64) -> u64 {
    if rate == 0 {
        0
    } else {
        (len as u128 * 1_000_000_000 / rate.max(64) as u128) as u64
    }
}

pub fn tune_tin(rate: u64, mtu: u32, target_ns: u64, interval_ns: u64) -> TinTuning {
    let flow_quantum = if rate == 0 {
        1514
    } else {
        (rate >> 12).clamp(300, 1514) as u32
    };
    let mtu_time_ns = duration_ns(mtu as u64, rate);
    let target = (mtu_time_ns * 3 / 2).max(target_ns);
    let interval = (interval_ns + target - target_ns).max(2 * target);
    TinTuning {
        rate,
        flow_quantum,
        target_ns: target,
        interval_ns: interval,
        mtu_time_ns,
    }
}

/// The memory limit (`cake_reconfigure`): memlimit if set, else four intervals at the rate but
/// at least 4 MiB, never above `limit` (10240) MTU-sized packets unless memlimit says so.
pub fn buffer_limit(p: &CakeParams, rate: u64, mtu: u32) -> u64 {
    let base = match (p.memlimit, rate) {
        (Some(m), _) => m,
        (None, 0) => u32::MAX as u64,
        (None, r) => (r * (p.interval_ns / 1000) / 250_000).max(4 << 20),
    };
    base.min((10_240 * mtu as u64).max(p.memlimit.unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_as_tc_reads_them() {
        let p = CakeParams::parse(
            "bandwidth 57mbit diffserv4 docsis ack-filter dual-dsthost ingress rtt 50ms",
        )
        .unwrap();
        assert_eq!(p.bandwidth_bps, 57_000_000);
        assert_eq!(
            (p.tin_mode, p.flow_mode, p.ack_filter, p.ingress),
            (
                TinMode::Diffserv4,
                FlowMode::DualDstHost,
                AckFilter::On,
                true
            )
        );
        assert_eq!(
            (p.overhead, p.mpu, p.framing),
            (Some(18), 64, Framing::None)
        );
        assert_eq!((p.interval_ns, p.target_ns), (50 * MS, 2_500_000));
        let raw = CakeParams::parse("docsis raw").unwrap();
        assert_eq!(
            raw.overhead, None,
            "raw clears the overhead flag, as TCA_CAKE_RAW does"
        );
        let vlan = CakeParams::parse("ethernet ether-vlan ether-vlan").unwrap();
        assert_eq!((vlan.overhead, vlan.mpu), (Some(46), 84));
        assert!(CakeParams::parse("bandwidth")
            .unwrap_err()
            .to_string()
            .contains("needs a value"));
        assert!(CakeParams::parse("diffserv5")
            .unwrap_err()
            .to_string()
            .contains("diffserv5"));
        assert_eq!(CakeParams::parse("satellite").unwrap().target_ns, 50 * MS);
    }

    /// tc-cake(8): ATM cells carry 48 bytes each in 53; PTM adds one byte per 64.
    #[test]
    fn framing_costs() {
        let atm = CakeParams::parse("pppoe-llcsnap").unwrap();
        for ip in [40usize, 52, 100, 1452, 1500] {
            assert_eq!(
                atm.adjusted_len(ip, 0),
                ((ip as u32 + 40).div_ceil(48)) * 53,
                "ATM {ip}"
            );
        }
        assert_eq!(atm.adjusted_len(1500, 0), 33 * 53);
        let ptm = CakeParams::parse("bridged-ptm").unwrap();
        assert_eq!(ptm.adjusted_len(1500, 0), 1522 + 24);
        let docsis = CakeParams::parse("docsis").unwrap();
        assert_eq!(
            docsis.adjusted_len(40, 54),
            64,
            "mpu 64 lifts a 58-byte frame"
        );
        assert_eq!(
            CakeParams::default().adjusted_len(1500, 1514),
            1514,
            "raw: the link's length"
        );
    }

    /// The figures of the reference (queues-and-shapers.md 3.1): quantum and per-tin tuning.
    #[test]
    fn per_tin_tuning_follows_the_rate() {
        for (mbit, quantum) in [(10u64, 305u32), (25, 762), (50, 1514), (1, 300)] {
            assert_eq!(
                tune_tin(mbit * 125_000, 1514, 5 * MS, 100 * MS).flow_quantum,
                quantum,
                "{mbit} Mbit/s"
            );
        }
        // 1 Mbit/s: one 1514-byte frame takes 12.1 ms, so target 18.2 ms and interval 113.2 ms.
        let t = tune_tin(125_000, 1514, 5 * MS, 100 * MS);
        assert_eq!(t.mtu_time_ns, 12_112_000);
        assert_eq!(t.target_ns, 18_168_000);
        assert_eq!(t.interval_ns, 113_168_000);
        // diffserv3 thresholds: bulk 1/16, voice 1/4.
        assert_eq!(
            TinMode::Diffserv3.tin_rates(16_000),
            vec![(16_000, 1024), (1000, 64), (4000, 256)]
        );
        assert_eq!(TinMode::Diffserv3.tin_of(46), 2, "EF is voice");
        assert_eq!(TinMode::Diffserv3.tin_of(8), 1, "CS1 is bulk");
        assert_eq!(
            TinMode::Diffserv3.tin_of(34),
            0,
            "AF41 is best effort in diffserv3"
        );
        assert_eq!(TinMode::Diffserv4.tin_of(34), 2, "and video in diffserv4");
        // 100 Mbit/s, rtt 100 ms: 4 x BDP = 5 MB.
        assert_eq!(
            buffer_limit(&CakeParams::default(), 12_500_000, 1514),
            5_000_000
        );
        assert_eq!(buffer_limit(&CakeParams::default(), 125_000, 1514), 4 << 20);
    }
}
