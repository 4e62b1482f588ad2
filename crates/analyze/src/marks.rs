//! `test marks`: from the probes as sent and as they arrived, the fate of each code point's
//! DSCP and ECN field each way, and what that means for the fixes bloatlab recommends
//! (diffserv classes on ingress, ECN marking, L4S).

use bloatlab_result::marks::{
    Arrival, Fate, MarkChange, MarkFate, MarkHop, MarkProbe, MarksReport, MarksVerdict,
};
use bloatlab_result::StreamCounts;
use bloatlab_units::marks::{dscp_name, ecn_name, tally_tos, tos_name, CE, ECT0, ECT1, NOT_ECT};

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Up,
    Down,
}

impl Way {
    fn words(self) -> &'static str {
        match self {
            Way::Up => "on the way out (you to the server)",
            Way::Down => "on the way in (the server to you)",
        }
    }

    fn code(self) -> &'static str {
        match self {
            Way::Up => "up",
            Way::Down => "down",
        }
    }
}

/// The fates and verdicts of a run's probes. `server_received`: the probes the server counted
/// (its report), which tells which way the unanswered ones were lost.
pub fn report(probes: &[MarkProbe], server_received: Option<u64>) -> MarksReport {
    let mut sent: Vec<u8> = Vec::new();
    for p in probes {
        if !sent.contains(&p.sent) {
            sent.push(p.sent);
        }
    }
    let answered = probes.iter().filter(|p| p.rtt_ms.is_some()).count() as u64;
    let lost_up = server_received.map(|r| (probes.len() as u64).saturating_sub(r));
    let lost_down = server_received.map(|r| r.saturating_sub(answered));
    let up_read = probes.iter().any(|p| p.request_arrived.is_some());
    // A reply the server says nothing of (an older server) went out unmarked, whatever asked.
    let down_read = probes
        .iter()
        .any(|p| p.reply_arrived.is_some() && p.reply_sent.is_some());
    let fates = |way: Way| -> Vec<MarkFate> {
        sent.iter()
            .map(|&tos| {
                let mine = probes.iter().filter(|p| p.sent == tos);
                // The TOS bytes they arrived with, and how many of each.
                let mut counts = Vec::new();
                for p in mine.clone() {
                    let arrived = match way {
                        Way::Up => p.request_arrived,
                        Way::Down => p.reply_sent.and(p.reply_arrived),
                    };
                    if let Some(a) = arrived {
                        tally_tos(&mut counts, a);
                    }
                }
                // What the server's socket carried, which a refusal there may have changed.
                let from = match way {
                    Way::Up => tos,
                    Way::Down => mine.clone().find_map(|p| p.reply_sent).unwrap_or(tos),
                };
                let any_answer = mine.clone().any(|p| p.rtt_ms.is_some());
                let readable = match way {
                    Way::Up => up_read,
                    Way::Down => down_read,
                };
                // No probe of this mark came back: it was dropped, on the way the losses
                // were on when the server's count tells, on one of the two ways else.
                let dropped_here = match way {
                    Way::Up => lost_up != Some(0),
                    Way::Down => lost_down != Some(0),
                };
                let mut f = fate(from, &counts, mine.count() as u64);
                if !readable {
                    (f.dscp, f.ecn) = (Fate::Unknown, Fate::Unknown);
                } else if counts.is_empty() && !any_answer && dropped_here {
                    (f.dscp, f.ecn) = (Fate::Dropped, Fate::Dropped);
                }
                f
            })
            .collect()
    };
    let (up, down) = (fates(Way::Up), fates(Way::Down));
    let verdicts = verdicts(&up, &down, up_read, down_read);
    MarksReport {
        up,
        down,
        up_read,
        server_received,
        verdicts,
        tcp_up: Vec::new(),
        hops: Vec::new(),
        changes: Vec::new(),
    }
}

/// Adds TCP's way out: `syns` are (TOS sent, TOS the server saw the SYN arrive with, `None`
/// when it did not say), and a verdict where TCP's DSCP fares otherwise than UDP's.
pub fn add_tcp(r: &mut MarksReport, syns: &[(u8, Option<u8>)]) {
    r.tcp_up = syns
        .iter()
        .map(|&(sent, arrived)| {
            let counts: Vec<(u8, u64)> = arrived.map(|a| (a, 1)).into_iter().collect();
            fate(sent, &counts, 1)
        })
        .collect();
    let differ: Vec<String> = r
        .tcp_up
        .iter()
        .filter(|t| t.dscp != Fate::Unknown)
        .filter_map(|t| {
            let udp =
                r.up.iter()
                    .find(|u| u.sent >> 2 == t.sent >> 2 && u.dscp != Fate::Unknown)?;
            (udp.dscp != t.dscp).then(|| {
                format!(
                    "{} {} on UDP, {} on TCP",
                    dscp_name(t.sent >> 2),
                    fate_words(&udp.dscp),
                    fate_words(&t.dscp)
                )
            })
        })
        .collect();
    if !differ.is_empty() {
        r.verdicts.push(MarksVerdict {
            code: "tcp_marks_differ_up".into(),
            text: format!(
                "On the way out TCP's marks fare otherwise than UDP's ({}): a middlebox treats \
                 the two apart.",
                differ.join("; ")
            ),
        });
    }
}

fn fate_words(f: &Fate) -> String {
    match f {
        Fate::Kept => "kept".into(),
        Fate::Bleached => "bleached".into(),
        Fate::Remapped { to } => format!("remapped to {to}"),
        Fate::Marked { ce } => format!("{ce} marked CE"),
        Fate::Mixed => "mixed".into(),
        Fate::Dropped => "dropped".into(),
        Fate::Unknown => "unknown".into(),
    }
}

/// Every protocol test's probe streams read as `test marks` reads its probes: each stream's
/// marks (its DSCP and `--ecn`) and what the requests arrived at the server with and the
/// replies here with. `None` when no stream says (a server before the report carried it).
pub fn from_streams(streams: &[StreamCounts]) -> Option<MarksReport> {
    let up_read = streams.iter().any(|s| !s.tos_arrived_up.is_empty());
    let down_read = streams.iter().any(|s| !s.tos_arrived_down.is_empty());
    if !up_read && !down_read {
        return None;
    }
    let up: Vec<MarkFate> = streams
        .iter()
        .map(|s| {
            let sent = s.dscp_applied_up.unwrap_or(s.dscp) << 2 | s.ecn;
            fate(sent, &s.tos_arrived_up, s.sent)
        })
        .collect();
    let down: Vec<MarkFate> = streams
        .iter()
        .map(|s| {
            let sent = s.dscp_applied_down.unwrap_or(s.dscp) << 2 | s.ecn;
            fate(sent, &s.tos_arrived_down, s.received)
        })
        .collect();
    let verdicts = verdicts(&up, &down, up_read, down_read);
    Some(MarksReport {
        up,
        down,
        up_read,
        server_received: None,
        verdicts,
        tcp_up: Vec::new(),
        hops: Vec::new(),
        changes: Vec::new(),
    })
}

/// The code points worth walking hop by hop: of those that changed on the way out, one per
/// DSCP that changed (sent without ECN where it was) and one per ECN code point that changed
/// (with CS0 where it was). Routers send an ICMP error a second, after a burst of a few, so
/// every probe counts.
pub fn to_locate(up: &[MarkFate]) -> Vec<u8> {
    let changed = |f: &Fate| !matches!(f, Fate::Kept | Fate::Unknown | Fate::Marked { .. });
    let mut pick: Vec<u8> = Vec::new();
    let mut add = |candidates: Vec<u8>, same: fn(u8, u8) -> bool, prefer: fn(u8) -> bool| {
        for &c in &candidates {
            if pick.iter().any(|p| same(*p, c)) {
                continue;
            }
            let best = candidates
                .iter()
                .copied()
                .find(|x| same(*x, c) && prefer(*x))
                .unwrap_or(c);
            pick.push(best);
        }
    };
    add(
        up.iter()
            .filter(|f| changed(&f.dscp))
            .map(|f| f.sent)
            .collect(),
        |a, b| a >> 2 == b >> 2,
        |x| x & 3 == NOT_ECT,
    );
    add(
        up.iter()
            .filter(|f| changed(&f.ecn))
            .map(|f| f.sent)
            .collect(),
        |a, b| a & 3 == b & 3,
        |x| x >> 2 == 0,
    );
    pick
}

/// Where each walked mark was first seen changed, and the verdicts that say so (one per field
/// and hop), added to `r`.
pub fn locate(r: &mut MarksReport, hops: Vec<MarkHop>) {
    let mut sent: Vec<u8> = Vec::new();
    for h in &hops {
        for s in &h.seen {
            if !sent.contains(&s.sent) {
                sent.push(s.sent);
            }
        }
    }
    let mut changes = Vec::new();
    for &cp in &sent {
        for (field, part, name) in [
            (
                "dscp",
                (|t: u8| t >> 2) as fn(u8) -> u8,
                (|v: u8| dscp_name(v)) as fn(u8) -> String,
            ),
            ("ecn", |t: u8| t & 3, |v: u8| ecn_name(v).to_string()),
        ] {
            let mut last_as_sent = 0;
            for h in &hops {
                let Some(seen) = h.seen.iter().find(|s| s.sent == cp) else {
                    continue;
                };
                if part(seen.arrived) == part(cp) {
                    last_as_sent = h.hop;
                    continue;
                }
                changes.push(MarkChange {
                    field: field.into(),
                    sent: name(part(cp)),
                    arrived: name(part(seen.arrived)),
                    hop: h.hop,
                    from: h.from.clone(),
                    last_as_sent,
                });
                break;
            }
        }
    }
    // One verdict per field and hop, naming the marks that change there.
    let mut said: Vec<(String, u8)> = Vec::new();
    for c in &changes {
        if said.contains(&(c.field.clone(), c.hop)) {
            continue;
        }
        said.push((c.field.clone(), c.hop));
        let here: Vec<String> = dedup(
            changes
                .iter()
                .filter(|x| x.field == c.field && x.hop == c.hop)
                .map(|x| format!("{}>{}", x.sent, x.arrived))
                .collect(),
        );
        let before = if c.last_as_sent == 0 {
            "the first hop already sees it".to_string()
        } else {
            format!("hop {} still saw them as sent", c.last_as_sent)
        };
        r.verdicts.push(MarksVerdict {
            code: format!("{}_changed_at_hop", c.field),
            text: format!(
                "On the way out, {} changes at hop {}{}: {}; {before}.",
                if c.field == "dscp" { "DSCP" } else { "ECN" },
                c.hop,
                c.from.as_ref().map_or(String::new(), |f| format!(" ({f})")),
                here.join(", ")
            ),
        });
    }
    r.hops = hops;
    r.changes = changes;
}

/// The fate of code point `sent` (a TOS byte) whose `probes` arrived with the TOS bytes
/// `counts` (byte, how many): `Unknown` when none arrived.
fn fate(sent: u8, counts: &[(u8, u64)], probes: u64) -> MarkFate {
    let (dscp, ecn) = if counts.is_empty() {
        (Fate::Unknown, Fate::Unknown)
    } else {
        (dscp_fate(sent, counts), ecn_fate(sent, counts))
    };
    MarkFate {
        sent,
        name: tos_name(sent),
        probes: probes as u32,
        arrived: counts.iter().map(|c| c.1).sum::<u64>() as u32,
        arrived_as: counts
            .iter()
            .map(|&(tos, count)| Arrival {
                tos,
                name: tos_name(tos),
                count: count as u32,
            })
            .collect(),
        dscp,
        ecn,
    }
}

fn one_value(values: impl Iterator<Item = u8>) -> Option<u8> {
    let mut it = values;
    let first = it.next()?;
    it.all(|v| v == first).then_some(first)
}

fn dscp_fate(sent: u8, arrived: &[(u8, u64)]) -> Fate {
    match one_value(arrived.iter().map(|a| a.0 >> 2)) {
        Some(d) if d == sent >> 2 => Fate::Kept,
        Some(0) => Fate::Bleached,
        Some(d) => Fate::Remapped { to: dscp_name(d) },
        None => Fate::Mixed,
    }
}

fn ecn_fate(sent: u8, arrived: &[(u8, u64)]) -> Fate {
    let sent = sent & 3;
    let ce: u64 = arrived.iter().filter(|a| a.0 & 3 == CE).map(|a| a.1).sum();
    // RFC 3168: a queue may set CE on an ECT packet; that is the field working, not rewritten.
    if matches!(sent, ECT0 | ECT1)
        && ce > 0
        && arrived.iter().all(|a| a.0 & 3 == CE || a.0 & 3 == sent)
    {
        return Fate::Marked { ce: ce as u32 };
    }
    match one_value(arrived.iter().map(|a| a.0 & 3)) {
        Some(e) if e == sent => Fate::Kept,
        Some(NOT_ECT) => Fate::Bleached,
        Some(e) => Fate::Remapped {
            to: ecn_name(e).into(),
        },
        None => Fate::Mixed,
    }
}

fn verdicts(
    up: &[MarkFate],
    down: &[MarkFate],
    up_read: bool,
    down_read: bool,
) -> Vec<MarksVerdict> {
    let mut v = Vec::new();
    let mut say = |code: String, text: String| v.push(MarksVerdict { code, text });
    if !up_read && !down_read && up.iter().any(|f| f.probes > 0) {
        say(
            "server_unmarked".into(),
            "The server said nothing of the marks (a bloatlab server older than `test marks`, \
             or no reply came back): neither way is known."
                .into(),
        );
    } else if !up_read {
        say(
            "up_unknown".into(),
            "The server did not say what its probes arrived with (a bloatlab server older than \
             `test marks`, or one that cannot read the TOS byte): only the way back is known."
                .into(),
        );
    }
    let mut all_dscp_kept = true;
    // The way in first: what arrives from the Internet is what an ingress shaper sorts.
    for (way, fates) in [(Way::Down, down), (Way::Up, up)] {
        // The DSCP of probes sent marked (CS0 cannot be bleached), by what became of it.
        let marked: Vec<&MarkFate> = fates
            .iter()
            .filter(|f| f.sent >> 2 != 0 && f.dscp != Fate::Unknown)
            .collect();
        let count = |fate: fn(&Fate) -> bool| marked.iter().filter(|f| fate(&f.dscp)).count();
        let bleached = count(|f| *f == Fate::Bleached);
        let kept = count(|f| *f == Fate::Kept);
        all_dscp_kept &= !marked.is_empty() && kept == marked.len();
        if !marked.is_empty() && bleached == marked.len() {
            let text = match way {
                Way::Down => {
                    "DSCP is bleached on the way in: every mark from the server arrives as CS0, so \
                     a diffserv shaper on your router's ingress (CAKE diffserv3/4, layer_cake) \
                     sorts nothing from the Internet into classes. Shape ingress best effort (as \
                     `bloatlab config tc-cake` does: besteffort wash) and classify on your router \
                     instead: by your own rules, or by the marks your LAN sent, restored from \
                     conntrack (tc act_ctinfo); `bloatlab config nft-dscp` marks voice there."
                }
                Way::Up => {
                    "DSCP is bleached on the way out: your marks count in your own router's \
                     upload queue and nowhere beyond it."
                }
            };
            say(format!("dscp_bleached_{}", way.code()), text.into());
        } else if bleached > 0 {
            let names: Vec<String> = marked
                .iter()
                .filter(|f| f.dscp == Fate::Bleached)
                .map(|f| dscp_name(f.sent >> 2))
                .collect();
            say(
                format!("dscp_partly_bleached_{}", way.code()),
                format!(
                    "DSCP is bleached {} for {} of {} marks ({}): those arrive as CS0.",
                    way.words(),
                    bleached,
                    marked.len(),
                    dedup(names).join(", ")
                ),
            );
        }
        let remaps: Vec<String> = dedup(
            marked
                .iter()
                .filter_map(|f| match &f.dscp {
                    Fate::Remapped { to } => Some(format!("{}>{to}", dscp_name(f.sent >> 2))),
                    _ => None,
                })
                .collect(),
        );
        if !remaps.is_empty() {
            say(
                format!("dscp_remapped_{}", way.code()),
                format!(
                    "DSCP is rewritten {}: {}. A shaper that sorts by these marks puts them in \
                     other classes than the sender meant.",
                    way.words(),
                    remaps.join(", ")
                ),
            );
        }
        // ECN, over every DSCP sent with the code point.
        let ecn = |sent_ecn: u8| -> Vec<&Fate> {
            fates
                .iter()
                .filter(|f| f.sent & 3 == sent_ecn && f.ecn != Fate::Unknown)
                .map(|f| &f.ecn)
                .collect()
        };
        let (ect0, ect1, ce) = (ecn(ECT0), ecn(ECT1), ecn(CE));
        let dropped = ect0
            .iter()
            .chain(&ect1)
            .chain(&ce)
            .filter(|f| ***f == Fate::Dropped)
            .count();
        let not_ect_arrived = fates.iter().any(|f| f.sent & 3 == NOT_ECT && f.arrived > 0);
        if dropped > 0 && not_ect_arrived {
            say(
                format!("ecn_dropped_{}", way.code()),
                format!(
                    "Packets with ECN set are dropped {}: ECN would cost connections on this path.",
                    way.words()
                ),
            );
        }
        if !ect0.is_empty() && ect0.iter().all(|f| **f == Fate::Bleached) {
            say(
                format!("ecn_bleached_{}", way.code()),
                format!(
                    "ECN is erased {}: ECT packets arrive Not-ECT, so every queue past that point \
                     must drop to say it is full.",
                    way.words()
                ),
            );
        }
        let l4s_broken: Vec<String> = dedup(
            ect1.iter()
                .filter_map(|f| match f {
                    Fate::Kept | Fate::Marked { .. } | Fate::Dropped => None,
                    Fate::Remapped { to } => Some(to.clone()),
                    Fate::Bleached => Some("not-ect".into()),
                    _ => Some("mixed values".into()),
                })
                .collect(),
        );
        if !l4s_broken.is_empty() {
            say(
                format!("ect1_rewritten_{}", way.code()),
                format!(
                    "ECT(1) is rewritten {} (to {}): L4S (TCP Prague, Apple's L4S) will not work \
                     on this path.",
                    way.words(),
                    l4s_broken.join(", ")
                ),
            );
        }
        // Where a queue marks instead of dropping: CE on ECN-capable probes, per class.
        let marked: Vec<String> = fates
            .iter()
            .filter_map(|f| match f.ecn {
                Fate::Marked { ce } => Some(format!("{} {ce} of {}", f.name, f.arrived)),
                _ => None,
            })
            .collect();
        if !marked.is_empty() {
            say(
                format!("ce_marked_{}", way.code()),
                format!(
                    "A queue marks instead of dropping {}: ECN-capable probes arrived CE ({}).",
                    way.words(),
                    marked.join(", ")
                ),
            );
        }
        if ce
            .iter()
            .any(|f| matches!(f, Fate::Bleached | Fate::Remapped { .. }))
        {
            say(
                format!("ce_erased_{}", way.code()),
                format!(
                    "CE marks are erased {}: a queue's congestion mark set before that point \
                     never reaches the sender, which then sees neither a drop nor a mark.",
                    way.words()
                ),
            );
        }
    }
    // Every probe sent with `ecn` arrived with it (or CE, set by a queue).
    let through = |fates: &[MarkFate], ecn: u8| {
        let e: Vec<&MarkFate> = fates.iter().filter(|f| f.sent & 3 == ecn).collect();
        !e.is_empty()
            && e.iter()
                .all(|f| matches!(f.ecn, Fate::Kept | Fate::Marked { .. }))
    };
    let mut v2 = Vec::new();
    if all_dscp_kept {
        v2.push(MarksVerdict {
            code: "dscp_kept".into(),
            text: "Every DSCP mark crossed the path unchanged both ways.".into(),
        });
    }
    if through(down, ECT0) && (through(up, ECT0) || !up_read) {
        v2.push(MarksVerdict {
            code: "ecn_through".into(),
            text: "ECN crosses the path: CAKE and fq_codel can mark instead of dropping (both do \
                   by default)."
                .into(),
        });
    }
    if through(down, ECT1) && (through(up, ECT1) || !up_read) {
        v2.push(MarksVerdict {
            code: "ect1_through".into(),
            text: "ECT(1) crosses the path unchanged: L4S can work here where the bottleneck has \
                   an L4S queue (DualPI2)."
                .into(),
        });
    }
    v.extend(v2);
    v
}

fn dedup(mut names: Vec<String>) -> Vec<String> {
    let mut seen = Vec::new();
    names.retain(|n| {
        let new = !seen.contains(n);
        seen.push(n.clone());
        new
    });
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_units::marks::tos;

    const DSCPS: [u8; 10] = [0, 8, 10, 18, 26, 34, 40, 46, 48, 44];

    /// Every code point, `n` probes each, through a path that rewrites the TOS byte with `up`
    /// on the way out and `down` on the way back; `lost(tos)`: dropped (on the way out).
    fn run(n: u32, up: impl Fn(u8) -> u8, down: impl Fn(u8) -> u8) -> Vec<MarkProbe> {
        let mut probes = Vec::new();
        for _ in 0..n {
            for d in DSCPS {
                for e in 0..4 {
                    let sent = tos(d, e);
                    probes.push(MarkProbe {
                        t: 0.0,
                        sent,
                        rtt_ms: Some(10.0),
                        request_arrived: Some(up(sent)),
                        reply_sent: Some(sent),
                        reply_arrived: Some(down(sent)),
                    });
                }
            }
        }
        probes
    }

    fn codes(r: &MarksReport) -> Vec<&str> {
        r.verdicts.iter().map(|v| v.code.as_str()).collect()
    }

    #[test]
    fn a_clean_path_keeps_every_mark_both_ways() {
        let p = run(3, |t| t, |t| t);
        let r = report(&p, Some(p.len() as u64));
        assert_eq!((r.up.len(), r.down.len()), (40, 40));
        assert!(r
            .up
            .iter()
            .chain(&r.down)
            .all(|f| f.dscp == Fate::Kept && f.ecn == Fate::Kept && f.arrived == 3));
        assert_eq!(codes(&r), ["dscp_kept", "ecn_through", "ect1_through"]);
    }

    #[test]
    fn an_isp_that_bleaches_dscp_inbound_is_told_apart_from_outbound() {
        // RFC 2474 bleaching: the DSCP zeroed, the ECN field (RFC 3168) left alone.
        let p = run(2, |t| t, |t| t & 3);
        let r = report(&p, None);
        let ef = r.down.iter().find(|f| f.sent == tos(46, NOT_ECT)).unwrap();
        assert_eq!((&ef.dscp, &ef.ecn), (&Fate::Bleached, &Fate::Kept));
        assert_eq!(ef.arrived_as[0].name, "BE/not-ect");
        assert!(r.up.iter().all(|f| f.dscp == Fate::Kept));
        assert_eq!(
            codes(&r),
            ["dscp_bleached_down", "ecn_through", "ect1_through"]
        );
    }

    #[test]
    fn remaps_ect1_rewrites_ce_erasure_and_ecn_drops_are_named() {
        // EF>AF41 on the way out; ECT(1)>ECT(0) and CE>ECT(0) on the way back.
        let p = run(
            2,
            |t| if t >> 2 == 46 { tos(34, t & 3) } else { t },
            |t| match t & 3 {
                ECT1 | CE => (t & !3) | ECT0,
                _ => t,
            },
        );
        let r = report(&p, None);
        let c = codes(&r);
        assert!(c.contains(&"dscp_remapped_up"), "{c:?}");
        let remap = r
            .verdicts
            .iter()
            .find(|v| v.code == "dscp_remapped_up")
            .unwrap();
        assert!(remap.text.contains("EF>AF41"), "{:?}", r.verdicts);
        assert!(c.contains(&"ect1_rewritten_down") && c.contains(&"ce_erased_down"));
        // ECT(0) still crosses: classic ECN works where L4S does not.
        assert!(!c.contains(&"dscp_kept") && c.contains(&"ecn_through"));
        // A middlebox that drops ECT packets outbound: the server counted only Not-ECT ones.
        let mut p = run(2, |t| t, |t| t);
        p.iter_mut()
            .filter(|x| x.sent & 3 != NOT_ECT)
            .for_each(|x| {
                x.rtt_ms = None;
                x.request_arrived = None;
                x.reply_arrived = None;
                x.reply_sent = None;
            });
        let received = p.iter().filter(|x| x.rtt_ms.is_some()).count() as u64;
        let r = report(&p, Some(received));
        let ect0 = r.up.iter().find(|f| f.sent == tos(0, ECT0)).unwrap();
        assert_eq!(ect0.ecn, Fate::Dropped);
        assert_eq!(
            r.down.iter().find(|f| f.sent == tos(0, ECT0)).unwrap().ecn,
            Fate::Unknown,
            "the server's count says the loss was on the way out"
        );
        assert!(codes(&r).contains(&"ecn_dropped_up"));
    }

    #[test]
    fn tcp_syns_that_fare_otherwise_than_udp_are_named() {
        let p = run(1, |t| t, |t| t);
        let mut r = report(&p, None);
        // A middlebox that bleaches TCP only; CS1's SYN got no answer (an older server).
        add_tcp(
            &mut r,
            &[
                (tos(46, 0), Some(0)),
                (tos(0, 0), Some(0)),
                (tos(8, 0), None),
            ],
        );
        assert_eq!(r.tcp_up[0].dscp, Fate::Bleached);
        assert_eq!(r.tcp_up[2].dscp, Fate::Unknown);
        let v = r.verdicts.last().unwrap();
        assert_eq!(v.code, "tcp_marks_differ_up");
        assert!(
            v.text.contains("EF kept on UDP, bleached on TCP"),
            "{}",
            v.text
        );
        let mut same = report(&p, None);
        add_tcp(&mut same, &[(tos(46, 0), Some(tos(46, 0)))]);
        assert!(same
            .verdicts
            .iter()
            .all(|v| v.code != "tcp_marks_differ_up"));
    }

    #[test]
    fn the_walk_names_the_first_hop_that_saw_a_mark_changed() {
        use bloatlab_result::marks::HopSeen;
        // Bleached on the way out somewhere: the walk takes one code point per DSCP.
        let p = run(1, |t| t & 3, |t| t);
        let mut r = report(&p, None);
        let walk = to_locate(&r.up);
        assert_eq!(walk.len(), 9, "one per DSCP but CS0: {walk:?}");
        assert!(walk.iter().all(|t| t & 3 == NOT_ECT));
        // Hop 1 sees the marks as sent, hop 2 and the destination bleached.
        let hop = |n: u8, bleached: bool| MarkHop {
            hop: n,
            from: Some(format!("10.77.{n}.2")),
            destination: n == 3,
            seen: walk
                .iter()
                .map(|&t| HopSeen {
                    sent: t,
                    arrived: if bleached { t & 3 } else { t },
                })
                .collect(),
        };
        locate(&mut r, vec![hop(1, false), hop(2, true), hop(3, true)]);
        assert_eq!(r.changes.len(), 9);
        assert!(r.changes.iter().all(|c| c.hop == 2 && c.last_as_sent == 1));
        let v = r.verdicts.last().unwrap();
        assert_eq!(v.code, "dscp_changed_at_hop");
        assert!(
            v.text.contains("at hop 2 (10.77.2.2)") && v.text.contains("EF>BE"),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_queue_setting_ce_is_the_field_working_and_an_unread_way_out_is_unknown() {
        let mut p = run(2, |t| t, |t| t);
        p[2].reply_arrived = Some(p[2].sent | CE); // ECT(0) probe of CS0, CE on the way back
        for x in p.iter_mut() {
            x.request_arrived = None;
        }
        let r = report(&p, None);
        let f = r.down.iter().find(|f| f.sent == tos(0, ECT0)).unwrap();
        assert_eq!(f.ecn, Fate::Marked { ce: 1 });
        assert!(r.up.iter().all(|f| f.dscp == Fate::Unknown));
        assert_eq!(
            codes(&r),
            [
                "up_unknown",
                "ce_marked_down",
                "ecn_through",
                "ect1_through"
            ]
        );
        assert!(
            r.verdicts[1].text.contains("BE/ect0 1 of 2"),
            "{:?}",
            r.verdicts
        );
    }
}
