//! From measured runs to shaping advice, each number with its reason. Pure.

use crate::link::LinkType;
use bloatlab_result::Summary;
use serde::Serialize;

/// Share of the lowest measured goodput to shape at: the queue must form in the shaper, not
/// in the modem behind it (85-95% is the usual rule; 95% keeps most of the rate).
pub const SHARE: f64 = 0.95;
/// Added latency above which a direction counts as bloated (grade A's bound).
pub const BLOAT_MS: f64 = 30.0;
/// A FIFO, when nothing smarter is available, holds this much time at the shaped rate.
pub const FIFO_MS: f64 = 20.0;
const MTU: f64 = 1500.0;
/// Share of the upload the download's ACKs may take before CAKE's `ack-filter` is advised
/// there: tc-cake(8) recommends it for asymmetric links, and CAKE's submission measured about
/// 20% more upload goodput at 16:1 under RRUL (the ACKs took some 40% of that upload).
pub const ACK_FILTER_SHARE: f64 = 0.10;
/// A pure ACK with timestamps: IPv4 20 + TCP 20 + 12 bytes of options.
const ACK_IP_BYTES: u32 = 52;
/// Payload of a full segment behind a 1500-byte MTU with timestamps.
const MSS: f64 = 1448.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RouterQdisc {
    Cake,
    HtbFqCodel,
    HtbFifo,
}

impl RouterQdisc {
    pub fn parse(s: &str) -> Result<RouterQdisc, String> {
        match s {
            "cake" => Ok(RouterQdisc::Cake),
            "fq_codel" | "htb-fq_codel" | "fq-codel" => Ok(RouterQdisc::HtbFqCodel),
            "fifo" | "htb-fifo" => Ok(RouterQdisc::HtbFifo),
            o => Err(format!("qdisc `{o}`: cake, fq_codel or fifo")),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DirAdvice {
    pub rate_kbit: u64,
    pub overhead: u32,
    pub mpu: u32,
    pub link: LinkType,
    pub qdisc: RouterQdisc,
    /// Length (packets) of each hashed FIFO for `htb-fifo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fifo_packets: Option<u64>,
    /// The goodput of each run, Mbit/s, that the rate came from.
    pub measured_mbps: Vec<f64>,
    /// Delay this direction's queue added under load (worst run's median), ms.
    pub bloat_ms: Option<f64>,
    /// The same at the 90th percentile, where one-way delays measured it, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bloat_p90_ms: Option<f64>,
    /// Probes lost under load in a run that loaded this direction alone (worst run), percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_under_load_percent: Option<f64>,
    /// The smallest buffer that delay implies at the measured rate (from the 90th percentile
    /// where known: a queue still filling, or cubic's saw-tooth, sits below it at the median):
    /// bytes and full packets.
    pub buffer_bytes: Option<u64>,
    pub buffer_packets: Option<u64>,
    /// What to expect under load once shaped, ms added.
    pub expected_added_ms: f64,
    /// Upload only: CAKE's `ack-filter`, where the download's ACKs would take at least
    /// `ACK_FILTER_SHARE` of the shaped upload.
    pub ack_filter: bool,
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Advice {
    pub down: Option<DirAdvice>,
    pub up: Option<DirAdvice>,
    /// Directions measured only where the other direction's queue starved them: no rate.
    pub refused: Vec<Refusal>,
    pub notes: Vec<String>,
}

/// A direction the runs cannot give a rate for, and what to run instead.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusal {
    /// `download` or `upload`.
    pub direction: String,
    pub reason: String,
}

impl Advice {
    /// Whether the upload's CAKE should filter ACKs.
    pub fn upload_ack_filter(&self) -> bool {
        self.up.as_ref().is_some_and(|u| u.ack_filter)
    }

    /// Why a shaper cannot be built from this advice: a direction it refused.
    pub fn refusal(&self) -> Option<String> {
        let r: Vec<&str> = self.refused.iter().map(|r| r.reason.as_str()).collect();
        (!r.is_empty()).then(|| r.join("\n"))
    }

    /// Refusals, each direction's reason, then the notes: what `bloatlab advise` prints.
    pub fn text(&self) -> String {
        let mut o = String::new();
        for r in &self.refused {
            o += &format!("{}\n\n", r.reason);
        }
        for d in [&self.down, &self.up].into_iter().flatten() {
            o += &format!("{}\n\n", d.reason);
        }
        for n in &self.notes {
            o += &format!("note: {n}\n");
        }
        o
    }
}

/// What the advice is for.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub link: LinkType,
    pub qdisc: RouterQdisc,
    /// A locate verdict put the queue on the measuring host itself (hop 0).
    pub queue_on_host: bool,
}

/// The `bloatlab config` command that turns this advice from `files` into a configuration.
pub fn next_command(t: &Target, files: &[std::path::PathBuf]) -> String {
    let kind = match t.qdisc {
        RouterQdisc::Cake => "tc-cake",
        RouterQdisc::HtbFqCodel => "tc-htb-fqcodel",
        RouterQdisc::HtbFifo => "tc-htb-fifo",
    };
    let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    format!(
        "bloatlab config {kind} --dev IFACE --link {} --from {}",
        t.link.cake_keyword(),
        files.join(" ")
    )
}

fn list(v: &[f64]) -> String {
    let s: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
    match s.len() {
        0 => String::new(),
        1 => s[0].clone(),
        n => format!("{} and {}", s[..n - 1].join(", "), s[n - 1]),
    }
}

/// Fewest packets a FIFO shaper holds: below some ten packets a few TCP flows lose packets
/// every round trip and stall in timeouts (measured: 6 packets at 3.5 Mbit/s under 4 upload
/// flows and a download's ACKs gave 0.1-0.8 Mbit/s of 3.5).
pub const FIFO_MIN_PACKETS: u64 = 10;

/// A FIFO holding `FIFO_MS` of full packets at this rate, at least `FIFO_MIN_PACKETS`.
pub fn fifo_packets(rate_kbit: u64) -> u64 {
    ((rate_kbit as f64 * 1000.0 * FIFO_MS / 1e3 / 8.0 / MTU).round() as u64).max(FIFO_MIN_PACKETS)
}

/// FIFOs the best-effort traffic is hashed onto (by port) when there is no fq_codel: HTB
/// serves them in turn, a stochastic fair queue from what every kernel has.
pub const FIFO_BUCKETS: u64 = 8;
/// Full packets a call's packet waits behind in the small-packet class: the one on the wire
/// and about one more.
const CALL_WAIT_PACKETS: f64 = 2.0;

/// Each hashed FIFO's length: the `FIFO_MS` FIFO shared out, at least `FIFO_MIN_PACKETS`.
pub fn bucket_packets(rate_kbit: u64) -> u64 {
    (fifo_packets(rate_kbit) / FIFO_BUCKETS).max(FIFO_MIN_PACKETS)
}

/// Share of an upload shaped at `up_kbit` that the ACKs of a download at `down_kbit` take on
/// `link`: one pure ACK per two full segments (delayed ACKs, RFC 5681 section 4.2), each
/// costing its wire size with the link's overhead and minimum.
pub fn ack_share(down_kbit: u64, up_kbit: u64, link: LinkType) -> f64 {
    let acks_per_s = down_kbit as f64 * 1000.0 / 8.0 / (2.0 * MSS);
    acks_per_s * f64::from(link.wire_bytes(ACK_IP_BYTES)) * 8.0 / (up_kbit as f64 * 1000.0)
}

/// Added delay a direction showed under load, ms: its median and, where one-way delays
/// measured it, its 90th percentile.
#[derive(Clone, Copy, Debug)]
struct Bloat {
    p50: f64,
    p90: Option<f64>,
}

/// Loss under load from which a direction that adds little delay has too short a buffer: the
/// loss that caps a grade at B (`bloatlab_analyze::grade::LOSS_CAPS`).
pub const SHORT_BUFFER_LOSS_PERCENT: f64 = 2.0;

/// One direction's advice from the goodputs, added delays and loss under load the runs
/// measured in it.
fn direction(
    name: &str,
    goodputs: &[f64],
    bloat: Option<Bloat>,
    loss: Option<f64>,
    t: &Target,
) -> DirAdvice {
    let lowest = goodputs.iter().copied().fold(f64::INFINITY, f64::min);
    // Whole kbit/s, down; the epsilon keeps 3.5 x 0.95 = 3324.9999... at 3325.
    let rate_kbit = (lowest * SHARE * 1000.0 + 1e-6).floor() as u64;
    let rate_bps = rate_kbit as f64 * 1000.0;
    let bloat_ms = bloat.map(|b| b.p50);
    // The queue reached at least its deepest steady reading: the buffer holds no less.
    let deepest_ms = bloat.map(|b| b.p90.unwrap_or(b.p50).max(b.p50));
    let buffer_bytes = deepest_ms.map(|ms| (ms / 1e3 * lowest * 1e6 / 8.0).round() as u64);
    let buffer_packets = buffer_bytes.map(|b| (b as f64 / MTU).round() as u64);
    // One full packet's serialisation at the shaped rate, on top of what the queue keeps.
    let packet_ms = f64::from(t.link.wire_bytes(1500)) * 8.0 / rate_bps * 1e3;
    let (fifo_packets, expected, how) = match t.qdisc {
        RouterQdisc::Cake | RouterQdisc::HtbFqCodel => (
            None,
            5.0 + packet_ms,
            "CoDel keeps each flow's queue near its 5 ms target".to_string(),
        ),
        RouterQdisc::HtbFifo => {
            let n = bucket_packets(rate_kbit);
            let how = format!(
                "small packets (calls, ACKs, DNS) first and the rest hashed onto {FIFO_BUCKETS} \
                    FIFOs of {n} packets served in turn, a call waits a packet or two (a bulk flow \
                    up to its own {n})"
            );
            (Some(n), CALL_WAIT_PACKETS * packet_ms, how)
        }
    };
    let runs = if goodputs.len() == 1 {
        "the run measured"
    } else {
        "runs measured"
    };
    let mut reason = format!(
        "{name}: {runs} {} Mbit/s of goodput; {:.0}% of the lowest ({lowest:.1}) keeps the \
            queue in your shaper, not in the line: {rate_kbit} \
            kbit/s.",
        list(goodputs),
        SHARE * 100.0
    );
    if let (Some(ms), Some(b), Some(p)) = (bloat_ms, buffer_bytes, buffer_packets) {
        if ms >= BLOAT_MS {
            let measured = match bloat.and_then(|b| b.p90) {
                Some(p90) => format!("+{ms:.0} ms (median) to +{p90:.0} ms (90th percentile)"),
                None => format!("+{ms:.0} ms"),
            };
            reason += &format!(
                " The {measured} measured under load means a buffer of at least {} \
                kB ({p} full packets) in front of the bottleneck.",
                b / 1000
            );
        } else if let Some(loss) = loss.filter(|l| *l >= SHORT_BUFFER_LOSS_PERCENT) {
            reason += &format!(
                " Only +{ms:.0} ms was measured under load, but {loss:.1}% of the probes were \
                lost there: the buffer in front of this bottleneck is too short rather than too \
                long. It keeps the delay low by dropping, which calls and games feel and which \
                costs TCP its rate where the bandwidth-delay product is large; shaped, the queue \
                forms in your shaper instead, which drops by its own rule and not at a few \
                packets."
            );
        } else {
            reason += &format!(
                " Only +{ms:.0} ms was measured under load: this direction is not \
                bloated, and shaping it costs 5% of its rate for little."
            );
        }
    }
    reason += &format!(" Shaped, {how}: expect about +{expected:.0} ms under load.");
    if t.link != LinkType::Raw {
        reason += &format!(
            " Overhead {} B{} per packet for {}.",
            t.link.overhead(),
            if t.link.mpu() > 0 {
                format!(", at least {} B", t.link.mpu())
            } else {
                String::new()
            },
            t.link.cake_keyword()
        );
    }
    DirAdvice {
        rate_kbit,
        overhead: t.link.overhead(),
        mpu: t.link.mpu(),
        link: t.link,
        qdisc: t.qdisc,
        fifo_packets,
        measured_mbps: goodputs.to_vec(),
        bloat_ms,
        bloat_p90_ms: bloat.and_then(|b| b.p90),
        loss_under_load_percent: loss,
        buffer_bytes,
        buffer_packets,
        expected_added_ms: (expected * 10.0).round() / 10.0,
        ack_filter: false,
        reason,
    }
}

/// The worst added delay a direction showed: its one-way added delay where measured, else
/// the round trip's of runs that loaded only this direction.
fn bloat(runs: &[&Summary], down: bool) -> Option<Bloat> {
    runs.iter()
        .filter_map(|s| {
            let owd = if down {
                &s.added_owd_ms.down
            } else {
                &s.added_owd_ms.up
            };
            owd.as_ref()
                .map(|p| Bloat {
                    p50: p.p50,
                    p90: Some(p.p90),
                })
                .or(s.added_latency_ms.map(|p50| Bloat { p50, p90: None }))
        })
        .reduce(|a, b| if b.p50 > a.p50 { b } else { a })
}

/// Why a run that loaded both directions did not measure this direction's line, if it shows
/// so: the other direction's queue held this one's ACKs, so its goodput is what they allowed.
/// With one-way delays: the other direction's queue added at least `BLOAT_MS` while this
/// one's stayed under it (a direction that fills its own line builds its own queue, or its
/// AQM's, and a download whose ACKs wait seconds cannot fill it). With round trips only: the
/// loaded round trip grew by `BLOAT_MS` or more and the download moved less than the upload
/// (access lines are faster down than up).
pub fn starved(s: &Summary, down: bool) -> Option<String> {
    let (mine, other) = if down {
        (&s.added_owd_ms.down, &s.added_owd_ms.up)
    } else {
        (&s.added_owd_ms.up, &s.added_owd_ms.down)
    };
    let (name, other_name) = if down {
        ("download", "upload")
    } else {
        ("upload", "download")
    };
    let goodput = if down {
        s.throughput_mbps.down
    } else {
        s.throughput_mbps.up
    }?;
    match (mine, other) {
        (Some(mine), Some(other)) => (other.p50 >= BLOAT_MS && mine.p50 < BLOAT_MS).then(|| {
            format!(
                "its own queue added only +{:.0} ms while the {other_name}'s added +{:.0} ms, \
                    and its ACKs waited there: its {goodput:.1} Mbit/s is what they allowed, \
                    not the {name}'s rate",
                mine.p50, other.p50
            )
        }),
        _ => {
            let added = s.added_latency_ms?;
            let up = s.throughput_mbps.up?;
            (down && added >= BLOAT_MS && goodput < up).then(|| {
                format!(
                    "the loaded round trip grew by +{added:.0} ms and the download moved less \
                        than the upload ({goodput:.1} against {up:.1} Mbit/s): its ACKs waited \
                        behind the upload's queue, so that is not the download's rate"
                )
            })
        }
    }
}

pub fn advise(runs: &[Summary], t: &Target) -> Advice {
    // Such a run has no goodput to size a shaper by; the user should hear why, not only that.
    let mut notes: Vec<String> = runs
        .iter()
        .filter_map(|s| {
            let why = s.load_missing.as_deref()?;
            Some(format!(
                "A {} run's load never ran ({why}): it measured nothing of the line. Measure \
                again.",
                s.test
            ))
        })
        .collect();
    let mut refused = Vec::new();
    let goodput = |s: &Summary, down: bool| {
        if down {
            s.throughput_mbps.down
        } else {
            s.throughput_mbps.up
        }
        .filter(|m| *m > 0.0)
    };
    let mut dir = |down: bool, name: &str| {
        let only = if down { "tcp-down" } else { "tcp-up" };
        let all: Vec<&Summary> = runs.iter().filter(|s| goodput(s, down).is_some()).collect();
        // A run loading both directions shares each with the other's ACKs: its goodput
        // understates the line, so runs loading this direction alone decide when there are any.
        let alone: Vec<&Summary> = all.iter().copied().filter(|s| s.test == only).collect();
        let with = if alone.is_empty() {
            // Never a rate from a run whose other direction starved this one.
            let fed: Vec<&Summary> = all
                .iter()
                .copied()
                .filter(|s| starved(s, down).is_none())
                .collect();
            if let (true, Some(why)) = (fed.is_empty(), all.first().and_then(|s| starved(s, down)))
            {
                refused.push(Refusal {
                    direction: name.into(),
                    reason: format!(
                        "{name}: not advised. In the run that loaded both directions {why}. \
                            Measure it alone: `bloatlab fix HOST --dev DEV` does, or `bloatlab \
                            test {only} HOST -o FILE` and advise from that file too."
                    ),
                });
                return None;
            }
            fed
        } else {
            alone
        };
        if with.is_empty() {
            notes.push(format!(
                "No run measured the {name}: run {only} or rrul to advise it."
            ));
            return None;
        }
        if with.iter().all(|s| s.test != only) {
            notes.push(format!(
                "Only runs loading both directions measured the {name}: the other \
                direction's ACKs took part of it, so its rate is on the low side; a {only} run \
                gives a better one."
            ));
        }
        let g: Vec<f64> = with.iter().filter_map(|s| goodput(s, down)).collect();
        // Loss under load belongs to this direction only where it was loaded alone (one-way
        // tests, or a browser test's phase, whose cap records it).
        let loss = with
            .iter()
            .filter_map(|s| {
                let cap = if down {
                    &s.grade_by_direction.down_loss_cap
                } else {
                    &s.grade_by_direction.up_loss_cap
                };
                match cap {
                    Some(c) => Some(c.loss_percent),
                    None => s.loss.load_percent.filter(|_| s.test == only),
                }
            })
            .reduce(f64::max);
        Some(direction(name, &g, bloat(&with, down), loss, t))
    };
    let down = dir(true, "download");
    let mut up = dir(false, "upload");
    if let (Some(d), Some(u), RouterQdisc::Cake) = (&down, &mut up, t.qdisc) {
        let share = ack_share(d.rate_kbit, u.rate_kbit, t.link);
        if share >= ACK_FILTER_SHARE {
            u.ack_filter = true;
            u.reason += &format!(
                " The download's ACKs would take about {:.0}% of it (one {}-byte ACK per two full \
                    segments at {} kbit/s): CAKE's ack-filter drops those a later ACK of the same \
                    flow makes redundant, which gives most of that back; the download's senders \
                    then send in larger bursts on fewer ACKs, a few ms more for its probes.",
                share * 100.0,
                t.link.wire_bytes(ACK_IP_BYTES),
                d.rate_kbit
            );
        }
    }
    if runs.iter().any(|s| s.partial) {
        notes.push(
            "Some runs ended early: their goodput may be low, and so the advised rate.".into(),
        );
    }
    match t.qdisc {
        RouterQdisc::Cake => notes.push(
            "Where the router has no CAKE (sch_cake), use HTB + fq_codel \
            (bloatlab config tc-htb-fqcodel); where it has neither, HTB with a short FIFO (--qdisc \
            fifo)."
                .into(),
        ),
        RouterQdisc::HtbFqCodel => notes.push(
            "CAKE, where available, does the same with link-layer \
            compensation and per-host fairness built in (bloatlab config tc-cake)."
                .into(),
        ),
        RouterQdisc::HtbFifo => notes.push(
            "FIFOs hashed by port isolate flows only roughly (two flows \
            may share one) and keep no queue short: each bulk flow still waits behind its own \
            FIFO. Prefer fq_codel or CAKE where the router has them."
                .into(),
        ),
    }
    if t.queue_on_host {
        notes.push(
            "The queue is on this host (locate: hop 0): lower the interface's transmit \
            queue (ip link set dev IFACE txqueuelen 100), cap BQL (echo 30000 > \
            /sys/class/net/IFACE/queues/tx-0/byte_queue_limits/limit_max) and, for Wi-Fi, prefer a \
            driver with airtime fairness (mt76, ath9k, ath10k with fq_codel in mac80211); a router \
            shaper cannot reach this queue."
                .into(),
        );
    }
    Advice {
        down,
        up,
        refused,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::Percentiles;

    fn run(down: Option<f64>, up: Option<f64>, added: f64) -> Summary {
        let mut s = Summary {
            test: "rrul".into(),
            ..Default::default()
        };
        s.throughput_mbps.down = down;
        s.throughput_mbps.up = up;
        s.added_latency_ms = Some(added);
        s
    }

    const CABLE: Target = Target {
        link: LinkType::Docsis,
        qdisc: RouterQdisc::Cake,
        queue_on_host: false,
    };

    #[test]
    fn three_runs_of_61_60_62_advise_57000_kbit() {
        // The example: 95% of the lowest, 60 Mbit/s.
        let a = advise(
            &[
                run(Some(61.0), None, 120.0),
                run(Some(60.0), None, 130.0),
                run(Some(62.0), None, 110.0),
            ],
            &CABLE,
        );
        let d = a.down.unwrap();
        assert_eq!(d.rate_kbit, 57_000);
        assert!(
            d.reason.starts_with(
                "download: runs measured 61.0, 60.0 and 62.0 Mbit/s of \
            goodput; 95% of the lowest (60.0)"
            ),
            "{}",
            d.reason
        );
        assert_eq!((d.overhead, d.mpu), (18, 64));
        assert!(
            a.up.is_none()
                && a.notes
                    .iter()
                    .any(|n| n.starts_with("No run measured the upload")),
            "{:?}",
            a.notes
        );
    }

    #[test]
    fn a_run_whose_load_never_ran_is_named_and_sizes_nothing() {
        let idle_only = Summary {
            test: "rrul-be".into(),
            load_missing: Some("none of its 8 load flows opened (tcp down 1 BE: refused)".into()),
            ..Default::default()
        };
        let a = advise(&[run(Some(60.0), None, 120.0), idle_only], &CABLE);
        assert_eq!(
            a.down.unwrap().rate_kbit,
            57_000,
            "from the run that loaded the line"
        );
        assert_eq!(
            a.notes[0],
            "A rrul-be run's load never ran (none of its 8 load flows opened (tcp down 1 BE: \
            refused)): it measured nothing of the line. Measure again."
        );
    }

    #[test]
    fn the_buffer_follows_from_delay_times_rate() {
        // 600 ms at 20 Mbit/s is 1.5 MB: the 1000-packet FIFO of the guide's example. The
        // queue reached 600 ms at p90, so the buffer holds at least that, whatever the median.
        let mut s = run(None, Some(20.0), 400.0);
        s.added_owd_ms.up = Some(Percentiles {
            p50: 400.0,
            p90: 600.0,
            ..Default::default()
        });
        let a = advise(
            &[s],
            &Target {
                link: LinkType::Raw,
                qdisc: RouterQdisc::HtbFifo,
                queue_on_host: false,
            },
        );
        let u = a.up.unwrap();
        assert_eq!(
            (u.buffer_bytes, u.buffer_packets),
            (Some(1_500_000), Some(1000))
        );
        assert_eq!(u.rate_kbit, 19_000);
        // 20 ms at 19 Mbit/s: 31.7 -> 32 packets of 1500 B, over 8 FIFOs: 4, so the minimum 10.
        assert_eq!(u.fifo_packets, Some(10));
        assert_eq!(
            bucket_packets(100_000),
            20,
            "20 ms at 100 Mbit/s is 167 packets, 20 a FIFO"
        );
        assert!(
            u.reason.contains(
                "The +400 ms (median) to +600 ms (90th percentile) measured \
            under load means a buffer of at least 1500 kB (1000 full packets)"
            ),
            "{}",
            u.reason
        );
        assert_eq!((u.bloat_ms, u.bloat_p90_ms), (Some(400.0), Some(600.0)));
        // Without one-way delays, the round trip's median is all there is.
        let u = advise(&[run(None, Some(20.0), 600.0)], &CABLE).up.unwrap();
        assert!(
            u.reason
                .contains("The +600 ms measured under load means a buffer of at least 1500 kB"),
            "{}",
            u.reason
        );
    }

    #[test]
    fn ack_shares_follow_the_wire_sizes() {
        // 57 Mbit/s down: 57e6 / 8 / 2896 = 2460 ACKs a second; on DOCSIS each costs
        // 52 + 18 = 70 bytes, 1.38 Mbit/s: 38% of a 3.61 Mbit/s upload.
        assert!(
            (ack_share(57_000, 3_610, LinkType::Docsis) - 0.3816).abs() < 0.001,
            "{}",
            ack_share(57_000, 3_610, LinkType::Docsis)
        );
        // PPPoE over ATM: 52 + 40 = 92 bytes, two cells, 106 bytes on the wire.
        let atm = ack_share(15_000, 900, LinkType::PppoeLlcsnap);
        assert!(
            (atm - 15e6 / 8.0 / 2896.0 * 106.0 * 8.0 / 900e3).abs() < 1e-9,
            "{atm}"
        );
    }

    #[test]
    fn cake_on_an_asymmetric_line_filters_the_uploads_acks() {
        // The cable line: 60 / 3.8 Mbit/s measured, shaped at 57 / 3.61.
        let a = advise(&[run(Some(60.0), Some(3.8), 500.0)], &CABLE);
        let u = a.up.unwrap();
        assert!(u.ack_filter && !a.down.unwrap().ack_filter);
        assert!(
            u.reason.contains(
                "ACKs would take about 38% of it (one 70-byte ACK per two full \
            segments at 57000 kbit/s): CAKE's ack-filter"
            ),
            "{}",
            u.reason
        );
        // 100 / 40: the ACKs take 6% of the upload, not worth filtering.
        assert!(
            !advise(&[run(Some(100.0), Some(40.0), 500.0)], &CABLE)
                .up
                .unwrap()
                .ack_filter
        );
        // Only CAKE has the filter.
        let fq = Target {
            qdisc: RouterQdisc::HtbFqCodel,
            ..CABLE
        };
        assert!(
            !advise(&[run(Some(60.0), Some(3.8), 500.0)], &fq)
                .up
                .unwrap()
                .ack_filter
        );
    }

    #[test]
    fn runs_loading_one_direction_alone_decide_its_rate() {
        let mut up_alone = run(None, Some(3.5), 300.0);
        up_alone.test = "tcp-up".into();
        let a = advise(&[run(Some(50.0), Some(2.2), 200.0), up_alone], &CABLE);
        assert_eq!(
            a.up.unwrap().rate_kbit,
            3325,
            "95% of the tcp-up run's 3.5, not of rrul's 2.2"
        );
        assert_eq!(a.down.unwrap().rate_kbit, 47_500);
        assert!(
            a.notes
                .iter()
                .any(|n| n.starts_with("Only runs loading both directions measured the download")),
            "{:?}",
            a.notes
        );
    }

    /// The 10-packet FIFO at 6 Mbit/s of issue #38: an upload alone adds 16 ms but loses 23% of
    /// the probes. That is a finding: the buffer is too short, and shaping is the cure.
    fn owd(p50: f64) -> Option<Percentiles> {
        Some(Percentiles {
            p50,
            p90: p50 * 1.2,
            ..Default::default()
        })
    }

    #[test]
    fn a_download_starved_by_the_uploads_queue_gets_no_rate() {
        // The rrul on a 35/7 Mbit/s line with 600-packet FIFOs: the upload's FIFO held
        // the download's ACKs, so the download moved 6.4 Mbit/s with its own queue empty.
        let mut rrul = run(Some(6.4), Some(6.9), 650.0);
        rrul.added_owd_ms.down = owd(0.4);
        rrul.added_owd_ms.up = owd(640.0);
        let a = advise(std::slice::from_ref(&rrul), &CABLE);
        assert_eq!(a.down, None, "no rate from a starved download");
        let r = &a.refused[0];
        assert_eq!(r.direction, "download");
        assert!(
            r.reason.contains("+0 ms while the upload's added +640 ms")
                && r.reason.contains("bloatlab fix")
                && r.reason.contains("test tcp-down"),
            "{}",
            r.reason
        );
        assert!(
            a.text().starts_with("download: not advised."),
            "{}",
            a.text()
        );
        assert!(a.refusal().is_some());
        // The upload filled its own queue: its rate stands.
        assert_eq!(a.up.as_ref().map(|u| u.rate_kbit), Some(6555));
        // Without one-way delays: a bloated round trip and less down than up says the same.
        rrul.added_owd_ms = Default::default();
        let a = advise(std::slice::from_ref(&rrul), &CABLE);
        assert!(a.down.is_none() && a.refused[0].reason.contains("6.4 against 6.9"));
        // A download measured alone decides, whatever the rrul said.
        let mut alone = run(Some(33.0), None, 400.0);
        alone.test = "tcp-down".into();
        let a = advise(&[rrul.clone(), alone], &CABLE);
        assert_eq!(
            (a.down.map(|d| d.rate_kbit), a.refused.len()),
            (Some(31350), 0)
        );
        // Both queues full: each direction filled its own line, nothing refused.
        rrul.added_owd_ms.down = owd(300.0);
        rrul.added_owd_ms.up = owd(600.0);
        assert!(advise(&[rrul], &CABLE).refused.is_empty());
    }

    #[test]
    fn a_direction_that_drops_instead_of_delaying_has_too_short_a_buffer() {
        let mut up = run(None, Some(5.8), 16.0);
        up.test = "tcp-up".into();
        up.loss.load_percent = Some(23.0);
        let a = advise(&[up.clone()], &CABLE);
        let u = a.up.unwrap();
        assert_eq!(u.loss_under_load_percent, Some(23.0));
        assert!(
            u.reason.contains("23.0% of the probes were lost there")
                && u.reason.contains("too short rather than too long"),
            "{}",
            u.reason
        );
        assert!(!u.reason.contains("not bloated"), "{}", u.reason);
        // Under the threshold it is what it was: not bloated.
        up.loss.load_percent = Some(1.0);
        let u = advise(&[up], &CABLE).up.unwrap();
        assert!(
            u.reason.contains("this direction is not bloated"),
            "{}",
            u.reason
        );
    }

    #[test]
    fn a_direction_without_bloat_says_so_and_a_host_queue_gets_host_advice() {
        let a = advise(
            &[run(Some(50.0), Some(10.0), 8.0)],
            &Target {
                link: LinkType::Ethernet,
                qdisc: RouterQdisc::Cake,
                queue_on_host: true,
            },
        );
        assert!(a
            .down
            .unwrap()
            .reason
            .contains("this direction is not bloated"));
        assert!(
            a.notes.iter().any(|n| n.contains("txqueuelen")),
            "{:?}",
            a.notes
        );
    }
}
