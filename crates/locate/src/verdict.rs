//! Which hop bloats, in which direction: pure logic over per-hop round-trip distributions.
//!
//! A probe to hop k crosses links 1..k outwards and its ICMP answer crosses them back, so a
//! queue on the link into hop k raises the round trip of hop k and of every hop after it, in
//! the load phase that fills it (download fills the inward direction, upload the outward).
//! The bloat is therefore on the link into the first hop whose added round trip explains most
//! of the path's, provided the hops after it agree: a router that is merely slow to generate
//! its ICMP answers under load is high on its own while later hops are not, and is not blamed.

pub use bloatlab_result::locate::{BloatDirection, Finding, Load, Verdict};
use std::net::IpAddr;

/// Added latency below which a path is not called bloated (ms): the upper bound of grade A
/// (`bloatlab_analyze::grade::BANDS`), what the bufferbloat web tests call fine.
pub const BLOAT_MS: f64 = 30.0;
/// Share of the path's added latency a hop must show to be the place (and every later hop too).
pub const EXPLAINS: f64 = 0.5;
/// Answers a hop needs in the idle phase and in a load phase for its numbers to count.
pub const MIN_ANSWERS: usize = 3;

/// Round trips of one hop (ms), idle and per load phase, with the answers it gave.
#[derive(Clone, Debug, Default)]
pub struct HopObs {
    pub ttl: u8,
    /// The address that answered (the last one seen if several did).
    pub address: Option<IpAddr>,
    /// This hop is the destination (it answered "port unreachable").
    pub destination: bool,
    pub sent: u32,
    pub answered: u32,
    pub idle: Vec<f64>,
    /// Download, upload, both.
    pub loaded: [Vec<f64>; 3],
}

/// The queue in front of this host's own interface (hop 0), as delay it implies, per phase.
#[derive(Clone, Debug, Default)]
pub struct LocalObs {
    pub interface: String,
    /// Median queueing delay of the interface's qdisc backlog (ms) per load phase.
    pub delay_ms: [Option<f64>; 3],
}

/// What the test's own probes said of the path (100 samples a second, better than the hops').
#[derive(Clone, Copy, Debug, Default)]
pub struct EndToEnd {
    /// Added round trip (loaded p50 minus idle p50) per load phase, ms.
    pub added_ms: [Option<f64>; 3],
    /// Added one-way delay (down, up) under both loads, ms: the direction when only `both` ran.
    pub owd_added_ms: Option<(f64, f64)>,
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    Some(bloatlab_analyze::stats::quantile_sorted(&s, 0.5))
}

impl HopObs {
    pub fn idle_p50(&self) -> Option<f64> {
        (self.idle.len() >= MIN_ANSWERS)
            .then(|| median(&self.idle))
            .flatten()
    }
    /// Loaded p50 minus idle p50, when both have enough answers.
    pub fn added(&self, load: Load) -> Option<f64> {
        let l = &self.loaded[load as usize];
        if l.len() < MIN_ANSWERS {
            return None;
        }
        Some(median(l)? - self.idle_p50()?)
    }
}

/// The path's added round trip under `load`: the test's own probes, else the last hop's.
fn path_added(hops: &[HopObs], e2e: &EndToEnd, load: Load) -> Option<f64> {
    e2e.added_ms[load as usize].or_else(|| hops.iter().rev().find_map(|h| h.added(load)))
}

/// Where the queue filled by `load` sits, if the path bloats under it.
fn locate(
    hops: &[HopObs],
    local: Option<&LocalObs>,
    e2e: &EndToEnd,
    load: Load,
) -> Option<Finding> {
    let path = path_added(hops, e2e, load)?;
    if path < BLOAT_MS {
        return None;
    }
    let need = EXPLAINS * path;
    let local_delay = local.and_then(|l| l.delay_ms[load as usize]);
    if let Some(d) = local_delay.filter(|d| *d >= need) {
        let confidence = (d / path).min(1.0);
        return Some(Finding {
            hop: 0,
            address: None,
            direction: BloatDirection::None,
            added_ms: d,
            path_added_ms: path,
            confidence: round2(confidence),
        });
    }
    let seen: Vec<(&HopObs, f64)> = hops
        .iter()
        .filter_map(|h| h.added(load).map(|a| (h, a)))
        .collect();
    for (i, &(h, a)) in seen.iter().enumerate() {
        if a < need {
            continue;
        }
        let later: Vec<f64> = seen[i + 1..].iter().map(|x| x.1).collect();
        let agreeing = later.iter().filter(|&&x| x >= need).count();
        // Later hops must carry the delay on; one odd hop among several may be its own
        // ICMP generation, not a queue, so most of them suffice.
        if !later.is_empty() && 2 * agreeing <= later.len() {
            continue;
        }
        let before = if i == 0 {
            local_delay.unwrap_or(0.0).max(0.0)
        } else {
            seen[i - 1].1.max(0.0)
        };
        let added = (a - before).max(0.0);
        let n = h.loaded[load as usize].len();
        let idle = h.idle_p50().unwrap_or(0.0);
        let above = h.loaded[load as usize]
            .iter()
            .filter(|&&x| x - idle >= need / 2.0)
            .count() as f64
            / n as f64;
        let consistency = if later.is_empty() {
            1.0
        } else {
            agreeing as f64 / later.len() as f64
        };
        let samples = (n as f64 / 8.0).min(1.0);
        let share = (added / path).clamp(0.0, 1.0);
        let confidence = samples * above * consistency * share.sqrt();
        return Some(Finding {
            hop: h.ttl,
            address: h.address,
            direction: BloatDirection::None,
            added_ms: added,
            path_added_ms: path,
            confidence: round2(confidence),
        });
    }
    None
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// What a place adds beside what the path adds. The two come from different probes (the
/// hop's ICMP answers, about one a second; the test's own, a hundred), so while a queue is
/// still filling the hop's median can exceed the path's: then the place holds all of it.
fn share_words(f: &Finding) -> String {
    if f.added_ms >= f.path_added_ms {
        format!(
            "it holds all of the {:.0} ms the path adds, its own answers +{:.0} ms",
            f.path_added_ms, f.added_ms
        )
    } else {
        format!(
            "it adds {:.0} ms of the path's {:.0} ms",
            f.added_ms, f.path_added_ms
        )
    }
}

fn hop_words(f: &Finding, hops: &[HopObs]) -> String {
    if f.hop == 0 {
        return "this host's own interface queue".into();
    }
    let addr = |h: &HopObs| h.address.map_or("?".to_string(), |a| a.to_string());
    let to = hops.iter().find(|h| h.ttl == f.hop);
    let from = hops
        .iter()
        .rev()
        .find(|h| h.ttl < f.hop && h.idle_p50().is_some());
    let to_words = to.map_or(format!("hop {}", f.hop), |h| {
        format!("hop {} ({})", h.ttl, addr(h))
    });
    match from {
        Some(p) if p.ttl + 1 == f.hop => {
            format!("the link from hop {} ({}) to {to_words}", p.ttl, addr(p))
        }
        Some(p) => format!(
            "the path from hop {} ({}) to {to_words} (hops between did not answer)",
            p.ttl,
            addr(p)
        ),
        None => format!("the link from this host to {to_words}"),
    }
}

/// The verdict: the worst bloated place and its direction, the other direction's place if it
/// differs, and what could not be seen.
pub fn verdict(hops: &[HopObs], local: Option<&LocalObs>, e2e: &EndToEnd) -> Verdict {
    let mut caveats = Vec::new();
    for h in hops {
        if h.sent > 0 && h.answered == 0 {
            caveats.push(format!(
                "hop {} never answered ({} probes): a silent router",
                h.ttl, h.sent
            ));
        } else if h.sent > 0 && (h.answered as f64) < 0.8 * h.sent as f64 {
            caveats.push(format!(
                "hop {} answered {} of {} probes (ICMP rate limit or loss)",
                h.ttl, h.answered, h.sent
            ));
        }
    }
    let down = locate(hops, local, e2e, Load::Download);
    let up = locate(hops, local, e2e, Load::Upload);
    let mut found: Vec<Finding> = Vec::new();
    // What one place adds in each direction, when it bloats both.
    let mut both = None;
    match (down, up) {
        (Some(d), Some(u)) if d.hop == u.hop => {
            let confidence = d.confidence.max(u.confidence);
            both = Some((share_words(&d), share_words(&u)));
            let mut f = if d.added_ms >= u.added_ms { d } else { u };
            f.direction = BloatDirection::Both;
            f.confidence = confidence;
            found.push(f);
        }
        (d, u) => {
            for (f, dir) in [(d, BloatDirection::Down), (u, BloatDirection::Up)] {
                if let Some(mut f) = f {
                    f.direction = dir;
                    found.push(f);
                }
            }
            found.sort_by(|a, b| b.added_ms.total_cmp(&a.added_ms));
        }
    }
    // Only both loads ran (`test rrul --locate`): the one-way delays tell the direction.
    if found.is_empty()
        && path_added(hops, e2e, Load::Download).is_none()
        && path_added(hops, e2e, Load::Upload).is_none()
    {
        if let Some(mut f) = locate(hops, local, e2e, Load::Both) {
            f.direction = match e2e.owd_added_ms {
                Some((d, u)) if d >= BLOAT_MS && u >= BLOAT_MS => BloatDirection::Both,
                Some((d, u)) if d >= u => BloatDirection::Down,
                Some(_) => BloatDirection::Up,
                None => BloatDirection::None,
            };
            found.push(f);
        }
    }
    for (i, h) in hops.iter().enumerate() {
        // A hop high under load while the next hop that answers is not: every probe to that
        // hop crosses the same links both ways and more, so a queue would have delayed it as
        // much. The lateness is the hop's own ICMP generation (whatever queue lies beyond).
        for load in Load::ALL {
            let Some(a) = h.added(load) else { continue };
            let next = hops[i + 1..]
                .iter()
                .find_map(|x| x.added(load).map(|n| (x.ttl, n)));
            if let Some((next_ttl, n)) = next.filter(|&(_, n)| a >= BLOAT_MS && n < a / 2.0) {
                caveats.push(format!(
                    "hop {} answers {:.0} ms late under {} load but hop \
                    {next_ttl} behind it only {:.0} ms: it is slow to send ICMP, not a \
                    queue",
                    h.ttl,
                    a,
                    load.name(),
                    n.max(0.0)
                ));
                break;
            }
        }
    }
    let Some(first) = found.first().cloned() else {
        let worst = Load::ALL
            .iter()
            .filter_map(|&l| path_added(hops, e2e, l))
            .fold(f64::NAN, f64::max);
        let text = if worst.is_nan() {
            "Not enough answers to judge: no hop and no end-to-end probe gave idle and loaded \
                round trips."
                .to_string()
        } else if worst >= BLOAT_MS {
            format!(
                "The path adds {worst:.0} ms under load, but no hop answered often enough to \
                place the queue ({MIN_ANSWERS} loaded and idle answers each): run longer phases \
                (-l)."
            )
        } else {
            format!(
                "No hop bloats: the path adds at most {worst:.0} ms under load (below \
                {BLOAT_MS:.0} ms)."
            )
        };
        return Verdict {
            hop: None,
            address: None,
            direction: BloatDirection::None,
            added_ms: worst.max(0.0),
            confidence: 0.0,
            text,
            also: vec![],
            caveats,
        };
    };
    let dir_words = |d: BloatDirection| match d {
        BloatDirection::Down => "download direction",
        BloatDirection::Up => "upload direction",
        BloatDirection::Both => "both directions",
        BloatDirection::None => "direction unknown",
    };
    let adds = match &both {
        Some((d, u)) => format!("under download load {d}; under upload load {u}"),
        None => format!("{} under load", share_words(&first)),
    };
    let mut text = format!(
        "The bloat is on {}, {}: {adds} (confidence {:.2}).",
        hop_words(&first, hops),
        dir_words(first.direction),
        first.confidence
    );
    for f in &found[1..] {
        text += &format!(
            " Also {}, {}: +{:.0} ms.",
            hop_words(f, hops),
            dir_words(f.direction),
            f.added_ms
        );
    }
    Verdict {
        hop: Some(first.hop),
        address: first.address,
        direction: first.direction,
        added_ms: round2(first.added_ms),
        confidence: first.confidence,
        text,
        also: found[1..].to_vec(),
        caveats,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hop with `n` idle answers at `idle` ms and `n` answers per load at idle + added.
    fn hop(ttl: u8, idle: f64, down: f64, up: f64, n: usize) -> HopObs {
        let jitter = |base: f64| {
            (0..n)
                .map(|i| base + (i % 5) as f64 * 0.3)
                .collect::<Vec<_>>()
        };
        HopObs {
            ttl,
            address: Some(format!("10.77.{}.2", ttl - 1).parse().unwrap()),
            destination: false,
            sent: 4 * n as u32,
            answered: 4 * n as u32,
            idle: jitter(idle),
            loaded: [
                jitter(idle + down),
                jitter(idle + up),
                jitter(idle + down.max(up)),
            ],
        }
    }

    fn path(added: [(f64, f64); 3]) -> Vec<HopObs> {
        added
            .iter()
            .enumerate()
            .map(|(i, &(d, u))| hop(i as u8 + 1, 2.0 + 10.0 * i as f64, d, u, 20))
            .collect()
    }

    #[test]
    fn a_download_queue_on_the_second_link_names_hop_two_and_download() {
        // Hop 2 and 3 carry the 400 ms the access line's download queue adds.
        let v = verdict(
            &path([(1.0, 0.5), (401.0, 2.0), (402.0, 2.5)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(
            (v.hop, v.direction),
            (Some(2), BloatDirection::Down),
            "{}",
            v.text
        );
        assert!((v.added_ms - 400.0).abs() < 1.0, "{}", v.added_ms);
        assert!(v.confidence > 0.9, "{}", v.confidence);
        assert!(
            v.text
                .contains("from hop 1 (10.77.0.2) to hop 2 (10.77.1.2)"),
            "{}",
            v.text
        );
    }

    #[test]
    fn an_upload_queue_on_the_first_link_names_hop_one_and_upload() {
        let v = verdict(
            &path([(0.5, 900.0), (1.0, 901.0), (1.5, 902.0)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(
            (v.hop, v.direction),
            (Some(1), BloatDirection::Up),
            "{}",
            v.text
        );
        assert!(v.text.contains("from this host to hop 1"), "{}", v.text);
    }

    #[test]
    fn the_same_hop_bloating_both_ways_is_both() {
        let v = verdict(
            &path([(1.0, 1.0), (200.0, 300.0), (201.0, 301.0)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(
            (v.hop, v.direction),
            (Some(2), BloatDirection::Both),
            "{}",
            v.text
        );
        assert!(
            (v.added_ms - 299.0).abs() < 1.0,
            "the worse direction's share: {}",
            v.added_ms
        );
        // Each direction's share in words; the last hop's answers are the path's here.
        assert!(
            v.text.contains(
                "both directions: under download load it adds 199 ms of the path's \
            201 ms; under upload load it adds 299 ms of the path's 301 ms \
            (confidence"
            ),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_hop_above_the_paths_own_probes_holds_all_of_it() {
        // A filling queue: the hop's few answers came later, when it was fuller, than the median
        // of the test's own probes.
        let e2e = EndToEnd {
            added_ms: [None, Some(1009.0), None],
            owd_added_ms: None,
        };
        let v = verdict(
            &path([(0.5, 1.0), (1.0, 1150.0), (1.5, 1151.0)]),
            None,
            &e2e,
        );
        assert_eq!(
            (v.hop, v.direction),
            (Some(2), BloatDirection::Up),
            "{}",
            v.text
        );
        assert!(
            v.text.contains(
                "upload direction: it holds all of the 1009 ms the path adds, its \
            own answers +1149 ms under load (confidence"
            ),
            "{}",
            v.text
        );
    }

    #[test]
    fn different_places_per_direction_are_both_reported_worst_first() {
        let v = verdict(
            &path([(150.0, 1.0), (151.0, 600.0), (152.0, 601.0)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(
            (v.hop, v.direction),
            (Some(2), BloatDirection::Up),
            "{}",
            v.text
        );
        assert_eq!(v.also.len(), 1);
        assert_eq!(
            (v.also[0].hop, v.also[0].direction),
            (1, BloatDirection::Down)
        );
    }

    #[test]
    fn short_queues_everywhere_blame_nobody() {
        // The slowest link still adds a little (its few packets of queue): below the bar.
        let v = verdict(
            &path([(1.0, 1.0), (12.0, 9.0), (12.5, 9.5)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(
            (v.hop, v.direction),
            (None, BloatDirection::None),
            "{}",
            v.text
        );
        assert!(v.text.starts_with("No hop bloats"), "{}", v.text);
    }

    #[test]
    fn a_router_slow_to_send_icmp_is_not_blamed() {
        // Hop 1 answers 300 ms late under download load, hops 2 and 3 (behind it) do not,
        // and the real queue is at hop 3.
        let hops = path([(300.0, 0.5), (2.0, 1.0), (120.0, 1.5)]);
        let v = verdict(&hops, None, &EndToEnd::default());
        assert_eq!(
            (v.hop, v.direction),
            (Some(3), BloatDirection::Down),
            "{}",
            v.text
        );
        assert!(
            v.caveats
                .iter()
                .any(|c| c.starts_with("hop 1 answers 300 ms late")),
            "{:?}",
            v.caveats
        );
        // The same with the real queue deeper than hop 1's lateness (cubic filling a 1.2 s FIFO
        // in the lab: +402 ms at hop 3): hop 2 still shows hop 1's lateness is not on the path.
        let v = verdict(
            &path([(300.0, 0.5), (2.0, 1.0), (402.0, 1.5)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(
            (v.hop, v.direction),
            (Some(3), BloatDirection::Down),
            "{}",
            v.text
        );
        assert!(
            v.caveats
                .iter()
                .any(|c| c.starts_with("hop 1 answers 300 ms late")
                    && c.contains("hop 2 behind it only")),
            "{:?}",
            v.caveats
        );
        // A queue into hop 1 delays every hop behind it as much: no caveat.
        let v = verdict(
            &path([(300.0, 0.5), (301.0, 1.0), (302.0, 1.5)]),
            None,
            &EndToEnd::default(),
        );
        assert_eq!(v.hop, Some(1), "{}", v.text);
        assert!(v.caveats.is_empty(), "{:?}", v.caveats);
    }

    #[test]
    fn silent_hops_are_skipped_and_said() {
        let mut hops = path([(1.0, 1.0), (300.0, 1.0), (301.0, 1.0)]);
        hops.insert(
            1,
            HopObs {
                ttl: 2,
                sent: 40,
                ..Default::default()
            },
        );
        hops[2].ttl = 3;
        hops[3].ttl = 4;
        let v = verdict(&hops, None, &EndToEnd::default());
        assert_eq!(v.hop, Some(3), "{}", v.text);
        assert!(v.text.contains("hops between did not answer"), "{}", v.text);
        assert!(
            v.caveats
                .iter()
                .any(|c| c == "hop 2 never answered (40 probes): a silent router"),
            "{:?}",
            v.caveats
        );
    }

    #[test]
    fn rate_limited_answers_are_counted_and_a_hop_with_too_few_is_skipped() {
        let mut hops = path([(1.0, 1.0), (300.0, 1.0), (301.0, 1.0)]);
        // Hop 2 answered only two probes under download load: not enough to place the queue.
        hops[1].loaded[0].truncate(2);
        hops[1].answered = 12;
        hops[1].sent = 60;
        let v = verdict(&hops, None, &EndToEnd::default());
        assert_eq!(v.hop, Some(3), "{}", v.text);
        assert!(
            v.caveats
                .contains(&"hop 2 answered 12 of 60 probes (ICMP rate limit or loss)".to_string()),
            "{:?}",
            v.caveats
        );
    }

    #[test]
    fn this_hosts_queue_is_hop_zero() {
        let hops = path([(1.0, 500.0), (1.0, 501.0), (1.0, 502.0)]);
        let local = LocalObs {
            interface: "wlan0".into(),
            delay_ms: [Some(0.2), Some(480.0), Some(480.0)],
        };
        let v = verdict(&hops, Some(&local), &EndToEnd::default());
        assert_eq!(
            (v.hop, v.direction),
            (Some(0), BloatDirection::Up),
            "{}",
            v.text
        );
        assert!(
            v.text.contains("this host's own interface queue"),
            "{}",
            v.text
        );
    }

    #[test]
    fn with_only_the_both_phase_the_one_way_delays_give_the_direction() {
        let mut hops = path([(1.0, 1.0), (300.0, 300.0), (301.0, 301.0)]);
        for h in &mut hops {
            h.loaded[0].clear();
            h.loaded[1].clear();
        }
        let e2e = EndToEnd {
            added_ms: [None, None, Some(305.0)],
            owd_added_ms: Some((4.0, 296.0)),
        };
        let v = verdict(&hops, None, &e2e);
        assert_eq!(
            (v.hop, v.direction),
            (Some(2), BloatDirection::Up),
            "{}",
            v.text
        );
    }

    #[test]
    fn a_bloated_path_with_too_few_hop_answers_is_not_called_fine() {
        let mut hops = path([(1.0, 1.0), (300.0, 1.0), (301.0, 1.0)]);
        for h in &mut hops {
            h.loaded[0].truncate(2);
            h.loaded[2].clear();
        }
        let e2e = EndToEnd {
            added_ms: [Some(290.0), Some(2.0), None],
            owd_added_ms: None,
        };
        let v = verdict(&hops, None, &e2e);
        assert_eq!(v.hop, None);
        assert!(
            v.text
                .starts_with("The path adds 290 ms under load, but no hop answered often enough"),
            "{}",
            v.text
        );
    }

    #[test]
    fn no_answers_at_all_say_so() {
        let v = verdict(
            &[HopObs {
                ttl: 1,
                sent: 10,
                ..Default::default()
            }],
            None,
            &EndToEnd::default(),
        );
        assert_eq!(v.hop, None);
        assert!(v.text.starts_with("Not enough answers"), "{}", v.text);
    }
}
