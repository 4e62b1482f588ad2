//! One direction of a link, configured by `key=value` pairs: the same parser serves topology
//! files, presets and `bloatlab lab set`.

use crate::cake::{Cake, CakeParams};
use crate::codel::{Codel, CodelParams};
use crate::fifo::Fifo;
use crate::fq_codel::{FqCodel, FqCodelParams};
use crate::qdisc::{Limit, Qdisc};
use crate::rate::Rate;
use crate::values::{parse_bool, parse_fraction, parse_usize};
pub use crate::values::{parse_rate, parse_time_ns, ConfigError};
use crate::MS;

#[derive(Clone, Debug, PartialEq)]
pub enum Loss {
    None,
    Random(f64),
    /// Gilbert-Elliott: P(good->bad), P(bad->good), loss in bad (1-h), loss in good (1-k).
    GilbertElliott {
        p: f64,
        r: f64,
        bad_loss: f64,
        good_loss: f64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QdiscKind {
    Fifo,
    FifoHeadDrop,
    Codel,
    FqCodel,
    /// CAKE with its own shaper and options, in tc's words after `qdisc = "cake ..."`.
    Cake(CakeParams),
    /// DualPI2 (RFC 9332), options in tc's words after `qdisc = "dualpi2 ..."`.
    DualPi2(crate::dualpi2::DualPi2Params),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BufferLimit {
    Packets(usize),
    Bytes(usize),
    /// Bytes the link drains in this time at its (mean) rate.
    Time(u64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct QdiscConfig {
    pub kind: QdiscKind,
    /// None: the qdisc's own default (1000 packets for fifo and codel, 10240 for fq_codel).
    pub limit: Option<BufferLimit>,
    pub target_ns: u64,
    pub interval_ns: u64,
    /// None: codel off, fq_codel on (as Linux).
    pub ecn: Option<bool>,
    pub flows: usize,
    pub quantum: usize,
}

impl Default for QdiscConfig {
    fn default() -> Self {
        QdiscConfig {
            kind: QdiscKind::Fifo,
            limit: None,
            target_ns: 5 * MS,
            interval_ns: 100 * MS,
            ecn: None,
            flows: 1024,
            quantum: 1514,
        }
    }
}

/// A propagation delay that changes over time (`delay = "schedule:FILE"`, `SECONDS DELAY`
/// lines and an optional `repeat SECONDS`), as a satellite link's does at each handover; time
/// zero is the rate's.
#[derive(Clone, Debug, PartialEq)]
pub struct DelaySchedule {
    pub steps: Vec<(u64, u64)>,
    pub period_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DirConfig {
    pub rate: Rate,
    /// The delay (with a schedule, its first step's).
    pub delay_ns: u64,
    pub delay_schedule: Option<DelaySchedule>,
    /// Uniform +/- around `delay_ns`. May exceed it: a draw below zero sends at once, as netem's
    /// `time_to_send = now + delay` does with a negative delay.
    pub jitter_ns: u64,
    /// With jitter: let packets overtake each other (netem's tfifo) instead of keeping order.
    pub reorder: bool,
    pub loss: Loss,
    pub mtu: usize,
    /// Link-layer bytes added to each IP packet for serialisation.
    pub overhead: usize,
    /// ATM cell framing: ceil((IP + overhead) / 48) cells of 53 bytes.
    pub atm: bool,
    pub qdisc: QdiscConfig,
    /// A driver's transmit ring below the qdisc: packets it has taken from the qdisc but not
    /// yet sent, drained FIFO at the link rate and out of the qdisc's sight. 0: none, a packet
    /// leaves the qdisc only when the link is free.
    pub ring: usize,
    /// Byte queue limits on the ring (Linux's BQL): the ring takes packets only while the
    /// bytes in it are within a limit learnt from completions. A ring of `ring` entries, 256
    /// when none is set.
    pub bql: bool,
    /// What this direction does to the marks of the packets entering it, as a middlebox or an
    /// ISP's edge does (`dscp`, `ecn_path`).
    pub marks: crate::marks::MarkRewrite,
    pub seed: u64,
}

impl Default for DirConfig {
    fn default() -> Self {
        DirConfig {
            rate: Rate::Unlimited,
            delay_ns: 0,
            delay_schedule: None,
            jitter_ns: 0,
            reorder: false,
            loss: Loss::None,
            mtu: 1500,
            overhead: 0,
            atm: false,
            qdisc: QdiscConfig::default(),
            ring: 0,
            bql: false,
            marks: Default::default(),
            seed: 1,
        }
    }
}

/// "1000" or "1000p" packets, "64kb"/"1mb"/"3000b" bytes, "100ms" time. Sizes follow tc:
/// `k`/`kb` = 1024 bytes, `m`/`mb` = 1024 * 1024 (tc-qdisc "UNITS").
pub fn parse_limit(s: &str) -> Result<BufferLimit, ConfigError> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || {
        ConfigError::Value(format!(
            "limit `{s}`: want packets (1000), bytes (64kb) or time (100ms)"
        ))
    };
    if t.ends_with("ms") || t.ends_with("us") || (t.ends_with('s') && !t.ends_with("bs")) {
        return parse_time_ns(&t).map(BufferLimit::Time);
    }
    for (suf, m) in [
        ("kb", 1024usize),
        ("mb", 1 << 20),
        ("gb", 1 << 30),
        ("k", 1024),
        ("m", 1 << 20),
        ("g", 1 << 30),
        ("b", 1),
    ] {
        if let Some(n) = t.strip_suffix(suf) {
            return n
                .trim()
                .parse::<usize>()
                .map(|v| BufferLimit::Bytes(v * m))
                .map_err(|_| bad());
        }
    }
    t.trim_end_matches('p')
        .parse::<usize>()
        .ok()
        .filter(|&n| n > 0)
        .map(BufferLimit::Packets)
        .ok_or_else(bad)
}

impl DirConfig {
    /// The propagation delay at `since_ns` after the rate's time zero.
    pub fn delay_at(&self, since_ns: u64) -> u64 {
        match &self.delay_schedule {
            Some(d) => crate::rate::step_at(&d.steps, d.period_ns, since_ns),
            None => self.delay_ns,
        }
    }

    /// Applies one `key=value`. `read_file` loads trace and schedule files named by
    /// `rate=trace:PATH`, `rate=schedule:PATH` and `delay=schedule:PATH` (the only I/O,
    /// injected by the caller).
    pub fn set(
        &mut self,
        key: &str,
        value: &str,
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<(), ConfigError> {
        let v = value.trim();
        match key.trim() {
            "rate" => {
                self.rate = if let Some(path) = v.strip_prefix("trace:") {
                    Rate::parse_trace(&read_file(path).map_err(ConfigError::Value)?)?
                } else if let Some(path) = v.strip_prefix("schedule:") {
                    Rate::parse_schedule(&read_file(path).map_err(ConfigError::Value)?)?
                } else if v == "unlimited" {
                    Rate::Unlimited
                } else {
                    Rate::BitsPerSecond(parse_rate(v)?)
                }
            }
            "delay" => {
                self.delay_schedule = match v.strip_prefix("schedule:") {
                    Some(path) => {
                        let text = read_file(path).map_err(ConfigError::Value)?;
                        let (steps, period_ns) =
                            crate::rate::parse_steps(&text, "DELAY", parse_time_ns)?;
                        Some(DelaySchedule { steps, period_ns })
                    }
                    None => None,
                };
                self.delay_ns = match &self.delay_schedule {
                    Some(d) => d.steps[0].1,
                    None => parse_time_ns(v)?,
                };
            }
            "jitter" => self.jitter_ns = parse_time_ns(v)?,
            "reorder" => self.reorder = parse_bool(v)?,
            "loss" => {
                let p = parse_fraction(v)?;
                self.loss = if p == 0.0 {
                    Loss::None
                } else {
                    Loss::Random(p)
                };
            }
            "ge" => {
                // p[,r[,1-h[,1-k]]] as netem's gemodel, with its defaults.
                let parts: Vec<f64> = v.split(',').map(parse_fraction).collect::<Result<_, _>>()?;
                let p = *parts
                    .first()
                    .ok_or_else(|| ConfigError::Value("ge needs p".into()))?;
                self.loss = Loss::GilbertElliott {
                    p,
                    r: parts.get(1).copied().unwrap_or(1.0 - p),
                    bad_loss: parts.get(2).copied().unwrap_or(1.0),
                    good_loss: parts.get(3).copied().unwrap_or(0.0),
                };
            }
            "mtu" => {
                let m = parse_usize(v, "mtu")?;
                if !(576..=65535).contains(&m) {
                    return Err(ConfigError::Value(format!("mtu {m}: want 576..65535")));
                }
                self.mtu = m;
            }
            "overhead" => self.overhead = parse_usize(v, "overhead")?,
            "atm" => self.atm = parse_bool(v)?,
            "qdisc" => {
                let (kind, options) = v.split_once(char::is_whitespace).unwrap_or((v, ""));
                self.qdisc.kind = match kind {
                    "cake" => QdiscKind::Cake(CakeParams::parse(options)?),
                    "dualpi2" => QdiscKind::DualPi2(crate::dualpi2::DualPi2Params::parse(options)?),
                    _ if !options.trim().is_empty() => {
                        return Err(ConfigError::Value(format!(
                            "qdisc `{v}`: only cake and dualpi2 take options here; \
                             set the others with their own keys (limit, target, ...)"
                        )))
                    }
                    "fifo" | "pfifo" | "droptail" => QdiscKind::Fifo,
                    "fifo-headdrop" | "drophead" => QdiscKind::FifoHeadDrop,
                    "codel" => QdiscKind::Codel,
                    "fq_codel" | "fq-codel" => QdiscKind::FqCodel,
                    _ => {
                        return Err(ConfigError::Value(format!(
                            "qdisc `{v}`: want fifo, fifo-headdrop, codel, fq_codel, \
                             \"cake [options as tc takes them]\" or \"dualpi2 [options]\""
                        )))
                    }
                }
            }
            // `tc qdisc change ... cake bandwidth X`: CAKE's shaper rate alone, its queues and
            // their state kept (what autorate changes, many times a second).
            "bandwidth" => match &mut self.qdisc.kind {
                QdiscKind::Cake(p) => {
                    p.bandwidth_bps = if v == "unlimited" { 0 } else { parse_rate(v)? }
                }
                _ => {
                    return Err(ConfigError::Value(format!(
                        "bandwidth {v}: only a cake qdisc has one (set qdisc=\"cake ...\" first)"
                    )))
                }
            },
            "limit" => self.qdisc.limit = Some(parse_limit(v)?),
            "target" => self.qdisc.target_ns = parse_time_ns(v)?,
            "interval" => self.qdisc.interval_ns = parse_time_ns(v)?,
            "ecn" => self.qdisc.ecn = Some(parse_bool(v)?),
            "flows" => self.qdisc.flows = parse_usize(v, "flows")?.clamp(1, 65536),
            "quantum" => self.qdisc.quantum = parse_usize(v, "quantum")?.max(256),
            "ring" => {
                let n = parse_usize(v, "ring")?;
                if n > 65536 {
                    return Err(ConfigError::Value(format!(
                        "ring {n}: at most 65536 entries"
                    )));
                }
                self.ring = n;
            }
            "bql" => self.bql = parse_bool(v)?,
            // As a middlebox at this link's entry: keep, bleach, or FROM>TO pairs.
            "dscp" => self.marks.set_dscp(v)?,
            "ecn_path" => self.marks.set_ecn(v)?,
            "seed" => {
                self.seed = v
                    .parse()
                    .map_err(|_| ConfigError::Value(format!("seed `{v}`")))?
            }
            other => return Err(ConfigError::Key(other.to_string())),
        }
        Ok(())
    }

    /// Entries of the transmit ring below the qdisc; 0 for none.
    pub fn ring_entries(&self) -> usize {
        if self.bql && self.ring == 0 {
            256
        } else {
            self.ring
        }
    }

    /// Bytes on the link for an IP packet of `len` bytes.
    pub fn wire_bytes(&self, len: usize) -> usize {
        let framed = len + self.overhead;
        if self.atm {
            framed.div_ceil(48) * 53
        } else {
            framed
        }
    }

    fn limit(&self, default_packets: usize) -> Limit {
        match self.qdisc.limit {
            None => Limit::packets(default_packets),
            Some(BufferLimit::Packets(n)) => Limit::packets(n),
            Some(BufferLimit::Bytes(b)) => Limit {
                packets: None,
                bytes: Some(b),
            },
            Some(BufferLimit::Time(ns)) => match self.rate.mean_bps() {
                Some(bps) => Limit {
                    packets: None,
                    bytes: Some(((bps as u128 * ns as u128) / 8_000_000_000) as usize),
                },
                None => Limit::packets(default_packets),
            },
        }
    }

    pub fn build_qdisc(&self) -> Box<dyn Qdisc> {
        let q = &self.qdisc;
        let codel = CodelParams {
            target_ns: q.target_ns,
            interval_ns: q.interval_ns,
            mtu: self.mtu + 14,
            ecn: q.ecn.unwrap_or(false),
        };
        match q.kind {
            QdiscKind::Fifo => Box::new(Fifo::new(self.limit(1000), false)),
            QdiscKind::FifoHeadDrop => Box::new(Fifo::new(self.limit(1000), true)),
            QdiscKind::Codel => Box::new(Codel::new(self.limit(1000), codel)),
            QdiscKind::FqCodel => {
                let lim = self.limit(10_240);
                let d = FqCodelParams::default();
                Box::new(FqCodel::new(FqCodelParams {
                    flows: q.flows,
                    quantum: q.quantum,
                    limit: lim.packets.unwrap_or(d.limit),
                    memory_limit: lim.bytes.unwrap_or(d.memory_limit),
                    codel: CodelParams {
                        ecn: q.ecn.unwrap_or(true),
                        ..codel
                    },
                    seed: self.seed,
                    ..d
                }))
            }
            QdiscKind::Cake(p) => Box::new(Cake::new(p, self.mtu, self.seed)),
            QdiscKind::DualPi2(p) => {
                Box::new(crate::dualpi2::DualPi2::new(p, self.mtu + 14, self.seed))
            }
        }
    }

    /// A one-line description for `lab presets` and `lab stats`.
    pub fn describe(&self) -> String {
        let rate = match &self.rate {
            Rate::Unlimited => "unlimited".to_string(),
            Rate::BitsPerSecond(b) => format!("{} Mbit/s", *b as f64 / 1e6),
            Rate::Trace {
                opportunities_ms,
                period_ms,
            } => {
                format!(
                    "trace ({} opportunities / {} ms, mean {:.1} Mbit/s)",
                    opportunities_ms.len(),
                    period_ms,
                    self.rate.mean_bps().unwrap_or(0) as f64 / 1e6
                )
            }
            Rate::Schedule { steps, period_ns } => match period_ns {
                Some(p) => format!(
                    "schedule of {} rates repeating every {} s",
                    steps.len(),
                    p / 1_000_000_000
                ),
                None => format!("schedule of {} rates", steps.len()),
            },
        };
        let mut out = match &self.delay_schedule {
            None => format!("{rate}, delay {} ms", self.delay_ns as f64 / 1e6),
            Some(d) => {
                let ms = |f: fn(u64, u64) -> u64| {
                    d.steps.iter().map(|s| s.1).reduce(f).unwrap_or(0) as f64 / 1e6
                };
                format!(
                    "{rate}, delay {}-{} ms (a schedule of {} steps)",
                    ms(u64::min),
                    ms(u64::max),
                    d.steps.len()
                )
            }
        };
        if self.jitter_ns > 0 {
            out += &format!(
                " +/- {} ms{}",
                self.jitter_ns as f64 / 1e6,
                if self.reorder { " (reordering)" } else { "" }
            );
        }
        match self.loss {
            Loss::None => {}
            Loss::Random(p) => out += &format!(", loss {}%", p * 100.0),
            Loss::GilbertElliott { p, r, .. } => out += &format!(", GE loss p={p} r={r}"),
        }
        let limit = match self.qdisc.limit {
            None => "default".to_string(),
            Some(BufferLimit::Packets(n)) => format!("{n} packets"),
            Some(BufferLimit::Bytes(b)) => format!("{b} bytes"),
            Some(BufferLimit::Time(t)) => format!("{} ms", t as f64 / 1e6),
        };
        let qdisc = match self.qdisc.kind {
            QdiscKind::Fifo => format!("fifo limit {limit}"),
            QdiscKind::FifoHeadDrop => format!("fifo-headdrop limit {limit}"),
            QdiscKind::Codel => format!("codel limit {limit}"),
            QdiscKind::FqCodel => format!("fq_codel limit {limit}"),
            QdiscKind::Cake(p) => p.describe(),
            QdiscKind::DualPi2(p) => p.describe(),
        };
        out += &format!(", {qdisc}");
        if self.ring_entries() > 0 {
            out += &format!(
                ", ring {}{}",
                self.ring_entries(),
                if self.bql { " with BQL" } else { "" }
            );
        }
        if self.overhead > 0 || self.atm {
            out += &format!(
                ", overhead {} B{}",
                self.overhead,
                if self.atm { " ATM" } else { "" }
            );
        }
        if !self.marks.is_keep() {
            out += &format!(", {}", self.marks.describe());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_files(_: &str) -> Result<String, String> {
        Err("no files here".into())
    }

    #[test]
    fn parses_units() {
        assert_eq!(parse_rate("60mbit"), Ok(60_000_000));
        assert_eq!(parse_rate("1.5Mbit"), Ok(1_500_000));
        assert!(
            parse_rate("64000").is_err(),
            "a bare number: tc reads bit/s, people Mbit/s"
        );
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_time_ns("7.5ms"), Ok(7_500_000));
        assert_eq!(parse_time_ns("0"), Ok(0));
        assert!(parse_time_ns("7").is_err(), "a bare number is ambiguous");
        assert_eq!(parse_limit("1000"), Ok(BufferLimit::Packets(1000)));
        assert_eq!(
            parse_limit("64kb"),
            Ok(BufferLimit::Bytes(65_536)),
            "tc: kb = 1024 bytes"
        );
        assert_eq!(parse_limit("1m"), Ok(BufferLimit::Bytes(1 << 20)));
        assert_eq!(parse_limit("100ms"), Ok(BufferLimit::Time(100 * MS)));
    }

    #[test]
    fn set_rejects_unknown_keys_and_bad_values_with_their_names() {
        let mut c = DirConfig::default();
        assert!(matches!(c.set("speed", "1", &no_files), Err(ConfigError::Key(k)) if k == "speed"));
        assert!(c
            .set("qdisc", "red", &no_files)
            .unwrap_err()
            .to_string()
            .contains("fq_codel"));
        c.set(
            "qdisc",
            "cake bandwidth 57mbit docsis ack-filter",
            &no_files,
        )
        .unwrap();
        assert!(matches!(c.qdisc.kind, QdiscKind::Cake(p)
                if p.bandwidth_bps == 57_000_000 && p.overhead == Some(18)));
        assert!(c
            .set("qdisc", "cake bandwidth fast", &no_files)
            .unwrap_err()
            .to_string()
            .contains("fast"));
        assert!(c.set("qdisc", "fq_codel quantum 300", &no_files).is_err());
        c.set("ge", "0.01", &no_files).unwrap();
        assert_eq!(
            c.loss,
            Loss::GilbertElliott {
                p: 0.01,
                r: 0.99,
                bad_loss: 1.0,
                good_loss: 0.0
            }
        );
    }

    #[test]
    fn atm_framing_rounds_up_to_cells() {
        let c = DirConfig {
            overhead: 40,
            atm: true,
            ..Default::default()
        };
        // 1500 + 40 = 1540 -> 33 cells = 1749 bytes.
        assert_eq!(c.wire_bytes(1500), 1749);
    }

    #[test]
    fn time_limit_is_bytes_at_the_rate() {
        let mut c = DirConfig::default();
        c.set("rate", "8mbit", &no_files).unwrap();
        c.set("limit", "100ms", &no_files).unwrap();
        assert_eq!(
            c.limit(1000),
            Limit {
                packets: None,
                bytes: Some(100_000)
            }
        );
    }
}
