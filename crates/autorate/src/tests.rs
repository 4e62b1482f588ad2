//! The controller against a line on virtual time: per direction a bottleneck of capacity C
//! behind the shaper at rate R, saturated both ways (rrul-like). While R > C the bottleneck's
//! queue grows at (R - C) / C seconds per second, up to its buffer; while R < C it drains at
//! the same rate. The line delivers min(R, C); each probe sees the base delay plus the queue.
//! The counters the controller reads are the shaper's: the download's (ingress, after the
//! bottleneck) count what the line delivered, the upload's (egress, before it) what the shaper
//! sent, R while saturated.

use super::*;

const MBIT: f64 = 1e6;
const STEP: u64 = 50 * MS; // 20 probes a second

struct Line {
    /// Capacity per direction at a time (ns), bit/s.
    down: Box<dyn Fn(u64) -> f64>,
    up: Box<dyn Fn(u64) -> f64>,
    /// Delay added outside the bottleneck at a time (a queue elsewhere) to the download's
    /// probes, on the path to server 0 only, ms.
    elsewhere_ms: Box<dyn Fn(u64) -> f64>,
    /// The path's own one-way delay added at a time, both directions, every server (a
    /// satellite's reroute), ms.
    path_ms: Box<dyn Fn(u64) -> f64>,
    /// Servers probed in turn (the probes a second shared among them).
    servers: usize,
    base_ms: f64,
    buffer_s: f64,
    /// Each counter reading off by up to this share either way (a busy host reads them late).
    counter_noise: f64,
    /// The share of the shaper's rate the flows send for 300 ms after it was cut (1: all of
    /// it; TCP's flows in the lab, halving their windows at the drops a cut brings, left up to
    /// a quarter of a CAKE unused then).
    fill_after_cut: f64,
}

#[derive(Default)]
struct Run {
    /// Queue delay of every probe after the warm-up, ms (both directions).
    queue_ms: Vec<f64>,
    /// Delivered over capacity, summed per step after the warm-up.
    delivered: f64,
    capacity: f64,
    /// The download's and the upload's queues at each step, ms.
    queue_down: Vec<f64>,
    queue_up: Vec<f64>,
    events: Vec<(u64, Event)>,
    /// (t, rate down) at each step.
    rates: Vec<(u64, f64)>,
    /// The upload's rate at each step.
    rates_up: Vec<f64>,
}

impl Run {
    /// Seconds from `from` to the first step at or after it whose download rate meets `want`.
    fn first_rate_after(&self, from: u64, want: impl Fn(f64) -> bool) -> Option<f64> {
        self.rates
            .iter()
            .find(|(t, rate)| *t >= from && want(*rate))
            .map(|(t, _)| (t - from) as f64 / 1e9)
    }
}

fn bounds() -> (Bounds, Bounds) {
    (
        Bounds::new(5.0 * MBIT, 20.0 * MBIT, 80.0 * MBIT).unwrap(),
        Bounds::new(2.0 * MBIT, 5.0 * MBIT, 20.0 * MBIT).unwrap(),
    )
}

fn simulate(law: Law, line: &Line, secs: u64, warmup: u64, cfg: impl Fn(&mut Config)) -> Run {
    let (down, up) = bounds();
    let mut c = Config::new(law, down, up);
    cfg(&mut c);
    simulate_cfg(c, line, secs, warmup)
}

fn simulate_cfg(c: Config, line: &Line, secs: u64, warmup: u64) -> Run {
    let mut ctl = Controller::new(c);
    let (mut qd, mut qu) = (0.0f64, 0.0f64);
    let mut run = Run::default();
    let mut t = 0;
    let mut counted = (0.0, 0.0);
    let (mut shaped, mut cut_at) = ([0.0; 2], [0u64; 2]);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut noisy = |v: f64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v * (1.0 + line.counter_noise * ((x % 2001) as f64 / 1000.0 - 1.0))
    };
    while t < secs * S {
        let (cd, cu) = ((line.down)(t), (line.up)(t));
        let mut sending = [0.0; 2];
        for (i, dir) in [Direction::Down, Direction::Up].into_iter().enumerate() {
            let rate = ctl.rate(dir);
            if rate < shaped[i] {
                cut_at[i] = t;
            }
            shaped[i] = rate;
            let cut_lately = t < cut_at[i] + 300 * MS && cut_at[i] > 0;
            sending[i] = rate * if cut_lately { line.fill_after_cut } else { 1.0 };
        }
        let [rd, ru] = sending;
        let dt = STEP as f64 / 1e9;
        qd = (qd + (rd - cd) / cd * dt).clamp(0.0, line.buffer_s);
        qu = (qu + (ru - cu) / cu * dt).clamp(0.0, line.buffer_s);
        let (dd, du) = (
            if qd > 0.0 { cd } else { rd.min(cd) },
            if qu > 0.0 { cu } else { ru.min(cu) },
        );
        // The upload's shaper sends its rate until the bottleneck's buffer is full; then TCP,
        // losing what overflows, sends what the line carries. The counters are read every
        // 200 ms, as the shell does.
        let sent_up = if qu >= line.buffer_s { ru.min(cu) } else { ru };
        counted = (counted.0 + dd / 4.0, counted.1 + sent_up / 4.0);
        if t % (200 * MS) == 150 * MS {
            ctl.on_load(noisy(counted.0), noisy(counted.1));
            counted = (0.0, 0.0);
        }
        let source = (t / STEP) as usize % line.servers;
        let extra = if source == 0 {
            (line.elsewhere_ms)(t)
        } else {
            0.0
        };
        let path = line.base_ms / 2.0 + (line.path_ms)(t);
        let sample = Sample {
            down_ms: Some(path + qd * 1e3 + extra),
            up_ms: Some(path + qu * 1e3),
        };
        let mut ev = ctl.on_sample(t, source, sample);
        ev.extend(ctl.on_tick(t));
        if t >= warmup * S {
            run.queue_ms.extend([qd * 1e3, qu * 1e3]);
            run.delivered += dd.min(cd) + du.min(cu);
            run.capacity += cd + cu;
        }
        run.rates.push((t, ctl.rate(Direction::Down)));
        run.rates_up.push(ctl.rate(Direction::Up));
        run.queue_down.push(qd * 1e3);
        run.queue_up.push(qu * 1e3);
        run.events.extend(ev.into_iter().map(|e| (t, e)));
        t += STEP;
    }
    run
}

fn p95(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[(v.len() * 95 / 100).min(v.len() - 1)]
}

fn steady(c_down: f64, c_up: f64) -> Line {
    Line {
        down: Box::new(move |_| c_down),
        up: Box::new(move |_| c_up),
        elsewhere_ms: Box::new(|_| 0.0),
        path_ms: Box::new(|_| 0.0),
        servers: 1,
        base_ms: 20.0,
        buffer_s: 0.5,
        counter_noise: 0.0,
        fill_after_cut: 1.0,
    }
}

#[test]
fn both_laws_fill_a_steady_line_and_ours_keeps_its_queue_shorter() {
    let line = steady(50.0 * MBIT, 10.0 * MBIT);
    let mut seen = Vec::new();
    for law in [Law::CakeAutorate, Law::Bloatlab] {
        let r = simulate(law, &line, 180, 60, |_| {});
        let (q, share) = (p95(&r.queue_ms), r.delivered / r.capacity);
        eprintln!(
            "{law:?}: queue p95 {q:.1} ms, {:.1}% of capacity",
            share * 100.0
        );
        assert!(share >= 0.85, "{law:?} delivered {share:.3} of the line");
        seen.push(q);
    }
    // cake-autorate acts from 30 ms of added delay and climbs 4% a sample up to a third above
    // the line; ours acts from 10 ms, climbs gently above what the line carried and cuts to
    // 90% of it: the queues they keep. Three delayed samples of six at 20 a second, and the
    // queue growing 5% a second above the line, put ours' p95 near 17 ms here.
    assert!(seen[1] <= 20.0, "ours: p95 queue {} ms", seen[1]);
    assert!(
        seen[1] < seen[0] / 2.0,
        "ours {} ms, cake-autorate's law {} ms",
        seen[1],
        seen[0]
    );
}

/// A slow upload (ADSL's 1 Mbit/s, a cable line's 2 at 21:00) never carries cake-autorate's
/// 2 Mbit/s of "active" load: ours still cuts below what it delivers when the delay rises, as
/// on a fast one, and keeps its queue as close to its threshold (10 ms plus a 1514-byte
/// packet's serialisation: 22.1 ms at 1 Mbit/s, 16.7 at 1.8) as the 10 Mbit/s upload above
/// (p95 under 20 ms, 8.8 over its 11.2). Before, the memory of safe rates alone stopped the
/// cuts: 40.9 and 31.8 ms.
#[test]
fn a_slow_upload_keeps_its_queue_as_short_as_a_fast_one() {
    for up in [1.0, 1.8] {
        let line = steady(20.0 * MBIT, up * MBIT);
        let r = simulate(Law::Bloatlab, &line, 180, 60, |c| {
            c.up = Bounds::new(0.2 * up * MBIT, 1.1 * up * MBIT, 1.9 * up * MBIT).unwrap();
        });
        let q_up: Vec<f64> = r.queue_ms.iter().skip(1).step_by(2).copied().collect();
        let delivered_cuts = r
            .events
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    Event::Rate {
                        dir: Direction::Up,
                        why: Why::Delivered,
                        ..
                    }
                )
            })
            .count();
        let share = r.delivered / r.capacity;
        eprintln!(
            "{up} Mbit/s up: queue p95 {:.1} ms, {delivered_cuts} cuts below what it delivered, \
             {:.1}% of capacity",
            p95(&q_up),
            share * 100.0
        );
        assert!(share >= 0.85, "{up} Mbit/s: {share:.3} of the line");
        let thr = 10.0 + 1514.0 * 8.0 / (up * MBIT) * 1e3;
        assert!(
            p95(&q_up) <= thr + 8.8,
            "{up} Mbit/s: p95 {} ms",
            p95(&q_up)
        );
        assert!(delivered_cuts > 0);
    }
}

/// The line's capacity falls to 40% (a cable segment at 21:00, a cell's load): ours goes to
/// 90% of what the line now delivers as soon as the counters (read every 200 ms) show it, in
/// at most two cuts (one may come first, from the delay alone); cake-autorate's law in steps
/// of at most x0.75 per 300 ms while the queue grows.
#[test]
fn when_the_capacity_falls_ours_is_below_it_in_two_cuts_at_most() {
    let line = Line {
        down: Box::new(|t| if t < 60 * S { 50.0 * MBIT } else { 20.0 * MBIT }),
        ..steady(50.0 * MBIT, 10.0 * MBIT)
    };
    let mut after = Vec::new();
    for law in [Law::CakeAutorate, Law::Bloatlab] {
        let r = simulate(law, &line, 90, 0, |_| {});
        let below = 1e3
            * r.first_rate_after(60 * S, |rate| rate <= 20.0 * MBIT)
                .expect("the rate fell below the new capacity");
        let cuts = r
            .events
            .iter()
            .filter(|(t, e)| {
                *t >= 60 * S
                    && *t <= 60 * S + (below * 1e6) as u64
                    && matches!(
                        e,
                        Event::Rate {
                            dir: Direction::Down,
                            why: Why::Bloat | Why::Delivered | Why::SafeFloor,
                            ..
                        }
                    )
            })
            .count();
        eprintln!("{law:?}: below the new capacity {below:.0} ms after the drop, {cuts} cuts");
        after.push((below, cuts));
    }
    assert!(after[1].1 <= 2, "ours: {} cuts", after[1].1);
    assert!(
        after[1].0 < after[0].0,
        "ours {} ms, cake-autorate's {} ms",
        after[1].0,
        after[0].0
    );
}

/// The line falls to under a quarter (30 to 7 Mbit/s; lte's trace falls from 15 to 5 in a
/// step) in front of a deep buffer (2 s), its counters read 2% off: the queue grows 3.3 s a
/// second until the rate is below 7. The first cut comes from the delay alone, sized by a
/// reading from before the fall; ours cuts again with the first reading that shows the fall
/// (read every 200 ms), not a refractory period later, and cuts on to the rate that drains the
/// queue the fall left (down to half the capacity: a queue of q seconds drains in 2q), where
/// 90% of the capacity would drain it in 10q.
#[test]
fn after_a_deep_fall_ours_cuts_with_the_first_reading_and_drains_the_queue() {
    let line = Line {
        down: Box::new(|t| if t < 60 * S { 30.0 * MBIT } else { 7.0 * MBIT }),
        buffer_s: 2.0,
        counter_noise: 0.02,
        ..steady(30.0 * MBIT, 10.0 * MBIT)
    };
    let (_, up) = bounds();
    let down = Bounds::new(MBIT, 20.0 * MBIT, 80.0 * MBIT).unwrap();
    let mut seen = Vec::new();
    for law in [Law::CakeAutorate, Law::Bloatlab] {
        let r = simulate_cfg(Config::new(law, down, up), &line, 70, 0);
        let fall = (60 * S / STEP) as usize;
        let after = &r.queue_down[fall..];
        let peak = after.iter().copied().fold(0.0, f64::max);
        let over = after.iter().position(|q| *q >= 10.0).expect("a queue grew");
        let drained = after[over..]
            .iter()
            .position(|q| *q < 10.0)
            .map(|i| (over + i) as f64 * STEP as f64 / 1e9)
            .expect("the queue drained");
        let below = r
            .first_rate_after(60 * S, |rate| rate <= 7.0 * MBIT)
            .expect("the rate fell below the new capacity");
        eprintln!("{law:?}: below in {below:.2} s, peak {peak:.0} ms, drained in {drained:.2} s");
        seen.push((below, peak, drained));
    }
    let (ca, ours) = (seen[0], seen[1]);
    // The reading at 60.35 s counts only the slower line.
    assert!(ours.0 <= 0.35, "ours below the capacity after {} s", ours.0);
    assert!(
        ours.1 < ca.1,
        "peaks: ours {} ms, cake-autorate's {} ms",
        ours.1,
        ca.1
    );
    // The drain rule: a queue of q seconds at a rate of d of the capacity (90% down to half
    // from 100 to 500 ms of queue) drains in q / (1 - d), after half a second to cut.
    let q = ours.1 / 1e3;
    let d = (0.9 - (q - 0.1).max(0.0)).max(0.5);
    assert!(
        ours.2 <= q / (1.0 - d) + 0.5,
        "ours drained a {} ms queue in {} s",
        ours.1,
        ours.2
    );
}

/// The download's line halves (80 to 40 Mbit/s, as starlink's fifth step) 150 ms before a
/// reading, in front of a buffer that holds 100 ms (the lab's TCP flows, window-limited, held
/// its queue at about that, not growing): the first cut is sized by a reading that is a
/// quarter from before the fall (50 Mbit/s). The counter is after the bottleneck and reads its
/// rate while the queue stands, so the next readings say 40: the cuts follow them below the
/// line, where a floor at the first reading's capacity held the shaper above it, the queue
/// full, until the floor's test 1.5 s later (the queue drained 2.5 s after the fall).
#[test]
fn a_fall_read_half_before_it_is_followed_down_by_the_next_readings() {
    let line = Line {
        down: Box::new(|t| {
            if t < 60_050 * MS {
                80.0 * MBIT
            } else {
                40.0 * MBIT
            }
        }),
        buffer_s: 0.1,
        ..steady(80.0 * MBIT, 10.0 * MBIT)
    };
    let (_, up) = bounds();
    let down = Bounds::new(10.0 * MBIT, 60.0 * MBIT, 150.0 * MBIT).unwrap();
    let r = simulate_cfg(Config::new(Law::Bloatlab, down, up), &line, 64, 0);
    let fall = (60_050 * MS / STEP) as usize;
    let drained = r.queue_down[fall..]
        .iter()
        .position(|q| *q < 10.0)
        .map(|i| i as f64 * STEP as f64 / 1e9);
    let below = r.first_rate_after(60_050 * MS, |rate| rate <= 40.0 * MBIT);
    eprintln!("below the line after {below:?} s, the queue under 10 ms after {drained:?} s");
    // Cut with the delay (60.15 s, at 90% of the mixed reading), again with the reading that
    // counts only the slower line (60.35 s) once the refractory period is over (60.45 s), to
    // 90% of it: the full queue (100 ms) then drains in 1 s (the drain rule's q / (1 - d)).
    assert!(below.is_some_and(|b| b <= 0.45), "{below:?}");
    assert!(drained.is_some_and(|d| d <= 0.4 + 1.0 + 0.1), "{drained:?}");
}

/// The upload halves (10 to 5 Mbit/s, as starlink's fifth step) in front of a 500 ms buffer,
/// its flows sending three quarters of the rate for 300 ms after each cut: the second cut, sized
/// by the queue's growth, leaves the shaper below the line, and the queue drains. Ours does not
/// cut again while the delay falls by its threshold in 400 ms: cake-autorate's law would, with
/// the window still holding the samples of the queue, and took the shaper to 2.7 Mbit/s, where
/// the drain asked for 90% of the line or less.
#[test]
fn while_the_queue_drains_ours_does_not_cut_again() {
    for at in [60_000, 60_050] {
        let line = Line {
            up: Box::new(move |t| if t < at * MS { 10.0 * MBIT } else { 5.0 * MBIT }),
            fill_after_cut: 0.75,
            ..steady(80.0 * MBIT, 10.0 * MBIT)
        };
        let r = simulate(Law::Bloatlab, &line, 64, 0, |_| {});
        let fall = (at * MS / STEP) as usize;
        let (queue, rates) = (&r.queue_up[fall..], &r.rates_up[fall..]);
        let least = rates.iter().copied().fold(f64::MAX, f64::min) / MBIT;
        let peak = queue.iter().copied().fold(0.0, f64::max);
        let over = queue.iter().filter(|q| **q > 20.0).count() as f64 * STEP as f64 / 1e9;
        eprintln!(
            "fall at {at} ms: least {least:.2} Mbit/s, peak {peak:.0} ms, {over:.2} s over 20"
        );
        assert!(least >= 0.75 * 5.0, "the upload cut to {least} Mbit/s");
        assert!(over <= 0.8, "{over} s over 20 ms");
    }
}

/// Flows that start: the first reading (15 Mbit/s of a shaper at 80) comes as their slow
/// start's bursts put the delay 30 ms up. That reading is the flows', not the line's: ours cuts
/// as cake-autorate's law does (the lab's starlink had its download cut to 17 and 21 Mbit/s of
/// 100 by it, and climbed back for 10 s). The same reading after readings at high load (the
/// line was busy, and slowed) says what the line carries: ours cuts below it.
#[test]
fn a_low_reading_says_what_the_line_carries_only_after_a_busy_one() {
    for busy_before in [false, true] {
        let (_, up) = bounds();
        let down = Bounds::new(5.0 * MBIT, 80.0 * MBIT, 150.0 * MBIT).unwrap();
        let mut ctl = Controller::new(Config::new(Law::Bloatlab, down, up));
        let mut t = 0;
        // Until the first cut.
        while t < 2 * S && ctl.rate(Direction::Down) >= 80.0 * MBIT {
            if t % (200 * MS) == 150 * MS {
                let before = if busy_before { 78.0 * MBIT } else { 0.1 * MBIT };
                ctl.on_load(if t >= S { 15.0 * MBIT } else { before }, 0.1 * MBIT);
            }
            let q = if t >= S + 200 * MS { 30.0 } else { 0.0 };
            let sample = Sample {
                down_ms: Some(10.0 + q),
                up_ms: Some(10.0),
            };
            ctl.on_sample(t, 0, sample);
            ctl.on_tick(t);
            t += STEP;
        }
        let rate = ctl.rate(Direction::Down) / MBIT;
        eprintln!(
            "busy before: {busy_before}; 30 ms over a reading of 15 Mbit/s: cut to {rate:.1}"
        );
        if busy_before {
            assert!(rate < 15.0, "{rate} Mbit/s after the line slowed");
        } else {
            // cake-autorate's deepest cut.
            assert!(rate >= 0.75 * 80.0, "{rate} Mbit/s for flows that start");
        }
    }
}

/// The upload halves (10 to 5 Mbit/s) under flows that keep 130 ms in the queue (window-limited:
/// then they send what the line carries) and send three quarters of the rate for 300 ms after
/// each cut. The cut the queue's growth sized leaves the shaper above the line (the flows sent
/// less than the shaper's rate as it grew); while the queue then holds still, what they send is
/// what the line carries, and the cuts follow it below the line. Before, the floor at the
/// capacity the growth had measured held the shaper at 5.76 Mbit/s with the queue full for 2.7
/// s (the lab's starlink: 5.05 Mbit/s for 1.6 s, TCP keeping 130 ms).
#[test]
fn a_queue_that_holds_still_says_what_the_upload_carries() {
    let line = Line {
        up: Box::new(|t| if t < 60 * S { 10.0 * MBIT } else { 5.0 * MBIT }),
        buffer_s: 0.13,
        fill_after_cut: 0.75,
        ..steady(80.0 * MBIT, 10.0 * MBIT)
    };
    let r = simulate(Law::Bloatlab, &line, 64, 0, |_| {});
    let fall = (60 * S / STEP) as usize;
    let over = r.queue_up[fall..].iter().filter(|q| **q > 50.0).count() as f64 * STEP as f64 / 1e9;
    let least = r.rates_up[fall..].iter().copied().fold(f64::MAX, f64::min) / MBIT;
    eprintln!("{over:.2} s over 50 ms after the fall, the upload at least {least:.2} Mbit/s");
    // Below the line 0.9 s after the fall, at 90% of it; the full queue (130 ms) drains in
    // about a second more.
    assert!(over <= 1.5, "{over} s over 50 ms");
    assert!(least >= 0.75 * 5.0, "the upload cut to {least} Mbit/s");
}

/// Delay from a queue that is not the shaper's (Wi-Fi, the far end) while the line delivers
/// the shaper's rate: cake-autorate's law cuts again and again, towards MIN; ours stops at 90%
/// of the highest rate that carried the load without bloat (a second's mean of the counters:
/// within 10% of the 50 Mbit/s line, as ours probes just above it and cuts to 90%), and tests
/// that floor once in 30 s at 85% of it for 600 ms.
#[test]
fn a_queue_elsewhere_does_not_drive_ours_to_the_minimum() {
    let line = Line {
        elsewhere_ms: Box::new(|t| {
            if (60 * S..75 * S).contains(&t) {
                60.0
            } else {
                0.0
            }
        }),
        ..steady(50.0 * MBIT, 10.0 * MBIT)
    };
    let mut lowest = Vec::new();
    for law in [Law::CakeAutorate, Law::Bloatlab] {
        let r = simulate(law, &line, 75, 0, |_| {});
        let before = r
            .rates
            .iter()
            .filter(|(t, _)| *t < 60 * S)
            .map(|x| x.1)
            .fold(0.0, f64::max);
        let low = r
            .rates
            .iter()
            .filter(|(t, _)| *t >= 60 * S)
            .map(|x| x.1)
            .fold(f64::MAX, f64::min);
        eprintln!(
            "{law:?}: {:.1} Mbit/s before, down to {:.1}",
            before / MBIT,
            low / MBIT
        );
        lowest.push((before, low));
    }
    assert!(
        lowest[0].1 <= 10.0 * MBIT,
        "cake-autorate's law kept {}",
        lowest[0].1
    );
    assert!(
        lowest[1].1 >= 0.85 * 0.9 * 0.9 * 50.0 * MBIT,
        "ours fell from {} to {}",
        lowest[1].0,
        lowest[1].1
    );
}

/// Starlink's steps (the lab's preset at 45 s): the capacity falls (here 60 to 40 Mbit/s down,
/// 15 to 10 up) as the path lengthens (by 15 ms each way). No cut drains that delay. Cut after
/// cut for it, each sized by what TCP's flows carried as they backed off from the last, took
/// this model's shapers to their minimum and the lab's to a quarter and under half of the line
/// (80 / 10 Mbit/s: 20.6 / 4.5) for the rest of the step. Ours cuts below the fall, sees the
/// delay stand still under a rate well below what the line carried, takes it as the path's, and
/// is back at the line within seconds, without keeping a queue of its own.
///
/// At every timing of the fall within a second (20 of them, 50 ms apart): while a rate held
/// still for 300 ms was asked for, and the download was cut again with each reading that the
/// flows backing off from the last cut read low, it went to its MIN at 16 of them and ended 15 s
/// later under 85% of the line at 11. It now goes no lower than 38% of the line (15.1 Mbit/s),
/// and ends at 90% or more. The upload goes to 43-54% of its line at 3 of them, as before.
#[test]
fn a_path_that_lengthens_as_the_line_falls_is_not_cut_for() {
    for k in 0..20 {
        let fall = 20 * S + k * 50 * MS;
        let line = Line {
            down: Box::new(move |t| if t < fall { 60.0 } else { 40.0 } * MBIT),
            up: Box::new(move |t| if t < fall { 15.0 } else { 10.0 } * MBIT),
            path_ms: Box::new(move |t| if t < fall { 0.0 } else { 15.0 }),
            fill_after_cut: 0.75,
            ..steady(0.0, 0.0)
        };
        let r = simulate(Law::Bloatlab, &line, 35, 0, |_| {});
        let from = (fall / STEP) as usize;
        let down: Vec<f64> = r.rates[from..].iter().map(|x| x.1).collect();
        // The first timing as this test began; at the others the floors are lower (above).
        let (least_down, least_up) = if k == 0 { (0.6, 0.6) } else { (0.35, 0.4) };
        for (dir, rates, capacity, least_share) in [
            ("down", &down[..], 40.0, least_down),
            ("up", &r.rates_up[from..], 10.0, least_up),
        ] {
            let least = rates.iter().copied().fold(f64::MAX, f64::min);
            let last = rates[rates.len() - 1];
            eprintln!(
                "fall at +{} ms, {dir} to {capacity} Mbit/s: least {:.1}, at the end {:.1}",
                k * 50,
                least / MBIT,
                last / MBIT
            );
            assert!(
                least >= least_share * capacity * MBIT,
                "fall at +{} ms: {dir} cut for the path to {least}",
                k * 50
            );
            assert!(last >= 0.85 * capacity * MBIT, "{dir} ended at {last}");
        }
        let queue = p95(&r.queue_ms[2 * from..]);
        eprintln!("the queues' p95 after the fall {queue:.1} ms");
        assert!(queue <= 20.0, "the queue's p95 {queue} ms");
    }
}

/// Two servers probed in turn (10 a second each): a queue on the path to one of them beyond
/// the line (its own uplink busy: 60 ms for 15 s) is not the line's, and ours cuts nothing for
/// it, where with that server alone it cuts to its memory of safe rates, tests that floor, and
/// takes the delay that stood through the test as the path's (49.0 Mbit/s before, 47.8 during;
/// 42.2 while such a floor held for the rest of the queue; 49.1 with both). The line's own fall
/// (50 to 20 Mbit/s, on both paths) is still below the new capacity within a sample of the
/// time one server takes: the least of the two servers' latest delays lags by one probe.
#[test]
fn with_two_servers_a_queue_on_one_servers_path_cuts_nothing_and_the_lines_fall_still_does() {
    let line = |servers| Line {
        down: Box::new(|t| if t < 80 * S { 50.0 * MBIT } else { 20.0 * MBIT }),
        elsewhere_ms: Box::new(|t| {
            if (60 * S..75 * S).contains(&t) {
                60.0
            } else {
                0.0
            }
        }),
        servers,
        ..steady(50.0 * MBIT, 10.0 * MBIT)
    };
    let mut seen = Vec::new();
    for servers in [1, 2] {
        let r = simulate(Law::Bloatlab, &line(servers), 90, 0, |_| {});
        let cuts = r
            .events
            .iter()
            .filter(|(t, e)| {
                (60 * S..76 * S).contains(t)
                    && matches!(
                        e,
                        Event::Rate {
                            dir: Direction::Down,
                            why: Why::Bloat | Why::SafeFloor | Why::FloorTest,
                            ..
                        }
                    )
            })
            .count();
        let below = r
            .first_rate_after(80 * S, |rate| rate <= 20.0 * MBIT)
            .expect("the rate fell below the new capacity");
        let mean = |from: u64, to: u64| {
            let v: Vec<f64> = r
                .rates
                .iter()
                .filter(|x| (from..to).contains(&x.0))
                .map(|x| x.1)
                .collect();
            v.iter().sum::<f64>() / v.len() as f64
        };
        let (before, during) = (mean(45 * S, 60 * S), mean(60 * S, 75 * S));
        eprintln!(
            "{servers} server(s): {cuts} cuts for the far queue, {:.1} Mbit/s before it, \
             {:.1} during it, below the fall in {below:.2} s",
            before / MBIT,
            during / MBIT
        );
        seen.push((cuts, below, during / before));
    }
    assert!(
        seen[0].0 > 0,
        "one server: its queue not read as the line's"
    );
    assert!(
        seen[0].2 >= 0.95,
        "one server: {} of the rate after the floor's test",
        seen[0].2
    );
    assert_eq!(seen[1].0, 0, "two servers: cut for one server's path");
    assert!(seen[1].2 >= 0.97, "two servers: {} of the rate", seen[1].2);
    assert!(
        seen[1].1 <= seen[0].1 + 0.1,
        "two servers below the fall in {} s, one in {} s",
        seen[1].1,
        seen[0].1
    );
}

/// The upload's capacity falls by a tenth, to where the memory of safe rates would hold the
/// shaper: the queue that keeps growing says the memory is out of date, and ours cuts below
/// the new capacity; the queue is gone within seconds.
#[test]
fn a_queue_that_keeps_growing_overrides_the_memory_of_safe_rates() {
    let line = Line {
        up: Box::new(|t| if t < 60 * S { 10.0 * MBIT } else { 9.0 * MBIT }),
        ..steady(50.0 * MBIT, 10.0 * MBIT)
    };
    let r = simulate(Law::Bloatlab, &line, 120, 65, |_| {});
    // Probes alternate down and up: the upload's are the odd ones.
    let up: Vec<f64> = r.queue_ms.iter().skip(1).step_by(2).copied().collect();
    let q = p95(&up);
    eprintln!("upload queue p95 {q:.1} ms from 5 s after the fall");
    assert!(q <= 20.0, "upload queue p95 {q} ms");
}

/// The kernel HTB test's line, on virtual time: a saturated upload's capacity falls from 18
/// to 8 Mbit/s behind a 1.5 s buffer, and the shaper's counters read up to 15% off (a busy
/// host reads them late). A memory of safe rates pushed up by such a reading must not hold the
/// shaper just above the line while the queue it feeds stands: from 3 s after the fall (the
/// queue the fall left drained) it stays short.
#[test]
fn noisy_counters_do_not_hold_a_standing_queue_after_the_line_slows() {
    let line = Line {
        up: Box::new(|t| if t < 60 * S { 18.0 * MBIT } else { 8.0 * MBIT }),
        buffer_s: 1.5,
        counter_noise: 0.15,
        ..steady(50.0 * MBIT, 18.0 * MBIT)
    };
    let r = simulate(Law::Bloatlab, &line, 90, 63, |_| {});
    let up: Vec<f64> = r.queue_ms.iter().skip(1).step_by(2).copied().collect();
    let (q, last) = (p95(&up), up[up.len() - 20..].iter().sum::<f64>() / 20.0);
    eprintln!("upload queue p95 {q:.1} ms from 3 s after the fall, {last:.1} ms at the end");
    assert!(
        q <= 30.0 && last <= 15.0,
        "upload queue p95 {q} ms, {last} ms at the end"
    );
}

/// The kernel HTB test's failure in CI, by hand: the shaper held at a floor from the memory of
/// safe rates (9.2 Mbit/s carried before), 0.8% above a line of 8 Mbit/s, with a standing
/// queue of 150 ms that grows slowly. A test of the floor drains 90 ms of it and does not reach
/// the threshold: the fall says the queue is ours (it was trusted for 30 s, and grew); and if
/// a floor is trusted, a queue that grows by the threshold under it is tested again.
#[test]
fn a_standing_queue_under_a_floor_just_above_the_line_is_drained() {
    let (down, up) = bounds();
    let mut ctl = Controller::new(Config::new(Law::Bloatlab, down, up));
    let cu = 8.0 * MBIT;
    ctl.up.rate = 1.008 * cu;
    ctl.up.safe.push_back((0, 9.2 * MBIT));
    // The line's base delay is known (from before the queue).
    ctl.up.sources = vec![Source {
        baseline: Some(10.0),
        latest: None,
    }];
    let (mut qu, mut t) = (0.150f64, 0);
    let mut queue = Vec::new();
    while t < 20 * S {
        let ru = ctl.rate(Direction::Up);
        qu = (qu + (ru - cu) / cu * (STEP as f64 / 1e9)).clamp(0.0, 1.5);
        if t % (200 * MS) == 0 {
            ctl.on_load(0.0, ru);
        }
        ctl.on_sample(
            t,
            0,
            Sample {
                down_ms: Some(10.0),
                up_ms: Some(10.0 + qu * 1e3),
            },
        );
        ctl.on_tick(t);
        queue.push(qu * 1e3);
        t += STEP;
    }
    let last = queue[queue.len() - 20..].iter().sum::<f64>() / 20.0;
    eprintln!("upload queue {last:.1} ms after 19 s");
    assert!(last <= 15.0, "the queue still {last} ms");
}

/// The upload's line falls from 10 to 5 Mbit/s and its TCP, the round trip growing, sends a
/// third less than the shaper passes (the lab's starlink: 6.4 Mbit/s read with the shaper at
/// 9.7). The upload's counter is before the bottleneck: that reading is what entered the queue,
/// not what the line carries, so it is no floor for the cuts that follow; and a queue that grows
/// by twice the threshold after a cut cuts again before the refractory period ends, sized by
/// that growth. Ours is below the line 0.40 s after the fall, the queue's peak 97 ms (with what
/// TCP sent as a floor 1.00 s and 199 ms; without the second rule 0.70 s and 172 ms).
#[test]
fn after_an_upload_falls_ours_is_below_the_line_in_two_cuts() {
    let (down, up) = bounds();
    let mut ctl = Controller::new(Config::new(Law::Bloatlab, down, up));
    let cu = 5.0 * MBIT;
    ctl.up.rate = 9.7 * MBIT;
    ctl.up.sources = vec![Source {
        baseline: Some(10.0),
        latest: None,
    }];
    ctl.on_load(20.0 * MBIT, 9.7 * MBIT);
    let (mut qu, mut t, mut peak) = (0.0f64, 0, 0.0f64);
    let mut below = None;
    while t < 3 * S {
        // TCP sends at most 6.4 Mbit/s for these seconds; the queue grows by what it sends
        // over the line's 5.
        let sent = ctl.rate(Direction::Up).min(6.4 * MBIT);
        qu = (qu + (sent - cu) / cu * (STEP as f64 / 1e9)).max(0.0);
        if t % (200 * MS) == 150 * MS {
            ctl.on_load(20.0 * MBIT, sent);
        }
        let sample = Sample {
            down_ms: Some(10.0),
            up_ms: Some(10.0 + qu * 1e3),
        };
        ctl.on_sample(t, 0, sample);
        ctl.on_tick(t);
        peak = peak.max(qu * 1e3);
        if below.is_none() && ctl.rate(Direction::Up) < cu {
            below = Some(t as f64 / 1e9);
        }
        t += STEP;
    }
    eprintln!("upload below the line {below:?} s after the fall, the queue's peak {peak:.0} ms");
    assert!(below.is_some_and(|b| b <= 0.5), "{below:?}");
    assert!(peak < 130.0, "the queue's peak {peak} ms");
}

/// The line's capacity grows (20 to 50 Mbit/s after a minute): above what it carried before,
/// ours probes gently at first and doubles its step each second the line takes it all without
/// bloat, up to cake-autorate's 4% a sample.
#[test]
fn a_capacity_that_grows_is_found_within_seconds() {
    let line = Line {
        down: Box::new(|t| if t < 60 * S { 20.0 * MBIT } else { 50.0 * MBIT }),
        ..steady(20.0 * MBIT, 10.0 * MBIT)
    };
    for law in [Law::CakeAutorate, Law::Bloatlab] {
        let r = simulate(law, &line, 90, 0, |_| {});
        let found = r
            .first_rate_after(60 * S, |rate| rate >= 0.85 * 50.0 * MBIT)
            .expect("the rate reached 85% of the new capacity");
        eprintln!("{law:?}: 85% of the new capacity after {found:.2} s");
        assert!(found <= 5.0, "{law:?}: {found} s");
    }
}

/// No probe comes back (a radio silence, the server gone): no cut, the rates hold at the last
/// ones without bloat, said once; at MIN only after the time the user set; said again when
/// samples return.
#[test]
fn a_silence_holds_the_rates_and_min_comes_only_when_asked() {
    for to_min in [None, Some(2 * S)] {
        let (down, up) = bounds();
        let mut c = Config::new(Law::Bloatlab, down, up);
        c.stall_to_min_ns = to_min;
        let mut ctl = Controller::new(c);
        ctl.on_load(30.0 * MBIT, 3.0 * MBIT);
        let calm = Sample {
            down_ms: Some(10.0),
            up_ms: Some(10.0),
        };
        let mut t = 0;
        while t < 5 * S {
            ctl.on_sample(t, 0, calm);
            ctl.on_tick(t);
            t += STEP;
        }
        let (held_down, held_up) = (ctl.rate(Direction::Down), ctl.rate(Direction::Up));
        let mut events = Vec::new();
        while t < 10 * S {
            events.extend(ctl.on_tick(t));
            t += STEP;
        }
        let stalls = events.iter().filter(|e| **e == Event::Stalled).count();
        assert_eq!(stalls, 1, "{events:?}");
        match to_min {
            None => {
                // Held: at most one decay step (x0.99, once a second) before the stall is
                // declared, and never put back up.
                for (d, held) in [(Direction::Down, held_down), (Direction::Up, held_up)] {
                    let r = ctl.rate(d);
                    assert!(r <= held && r >= 0.99 * held, "{d:?} {r} from {held}");
                }
            }
            Some(_) => {
                assert!(events.contains(&Event::StalledToMin));
                assert_eq!(ctl.rate(Direction::Down), 5.0 * MBIT);
                assert_eq!(ctl.rate(Direction::Up), 2.0 * MBIT);
            }
        }
        assert_eq!(ctl.on_sample(t, 0, calm)[0], Event::Recovered);
    }
}

/// A queue that grows past a second delays every answer that long: the silence that follows
/// cuts must not put back the rate from before them.
#[test]
fn a_silence_after_cuts_holds_the_cut_rate_not_the_one_before() {
    let (down, up) = bounds();
    let mut ctl = Controller::new(Config::new(Law::Bloatlab, down, up));
    let mut t = 0;
    let sample = |ctl: &mut Controller, t: u64, ms: f64| {
        ctl.on_load(ctl.rate(Direction::Down), ctl.rate(Direction::Up));
        ctl.on_sample(
            t,
            0,
            Sample {
                down_ms: Some(ms),
                up_ms: Some(10.0),
            },
        );
        ctl.on_tick(t);
    };
    while t < 5 * S {
        sample(&mut ctl, t, 10.0);
        t += STEP;
    }
    let before = ctl.rate(Direction::Down);
    while t < 5 * S + 600 * MS {
        sample(&mut ctl, t, 10.0 + (t - 5 * S) as f64 / 2e6);
        t += STEP;
    }
    let cut = ctl.rate(Direction::Down);
    assert!(cut < before, "the growing queue cut: {before} -> {cut}");
    let mut events = Vec::new();
    while t < 8 * S {
        events.extend(ctl.on_tick(t));
        t += STEP;
    }
    assert!(events.contains(&Event::Stalled), "{events:?}");
    assert_eq!(ctl.rate(Direction::Down), cut, "{events:?}");
}

/// Whatever comes in, no rate leaves [MIN, MAX].
#[test]
fn rates_never_leave_their_bounds() {
    for law in [Law::CakeAutorate, Law::Bloatlab] {
        let (down, up) = bounds();
        let mut ctl = Controller::new(Config::new(law, down, up));
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..100_000u64 {
            let t = i * 10 * MS;
            let r = next();
            ctl.on_load((r % 100) as f64 * MBIT, (r / 100 % 30) as f64 * MBIT);
            let ms = |v: u64| match v % 4 {
                0 => None,
                1 => Some(0.0),
                _ => Some((v % 3000) as f64 / 10.0),
            };
            let mut ev = ctl.on_sample(
                t,
                0,
                Sample {
                    down_ms: ms(r >> 8),
                    up_ms: ms(r >> 20),
                },
            );
            if i % 7 == 0 {
                ev.extend(ctl.on_tick(t + (r % 5) * S));
            }
            for e in ev {
                if let Event::Rate { dir, bps, .. } = e {
                    let b = if dir == Direction::Down { down } else { up };
                    assert!((b.min..=b.max).contains(&(bps as f64)), "{law:?} {e:?}");
                }
            }
        }
    }
}

#[test]
fn without_load_the_rate_decays_towards_base_and_nonsense_bounds_are_refused() {
    let (down, up) = bounds();
    let mut ctl = Controller::new(Config::new(Law::CakeAutorate, down, up));
    ctl.down.rate = 80.0 * MBIT;
    ctl.on_load(0.0, 0.0);
    let calm = Sample {
        down_ms: Some(10.0),
        up_ms: Some(10.0),
    };
    for i in 0..=60 {
        ctl.on_sample(i * S, 0, calm);
        ctl.on_tick(i * S);
    }
    // x0.99 a second for 60 s: 80 * 0.99^60 = 43.8 Mbit/s.
    let r = ctl.rate(Direction::Down) / MBIT;
    assert!((r - 80.0 * 0.99f64.powi(60)).abs() < 0.5, "{r}");
    assert!(Bounds::new(30.0, 20.0, 10.0)
        .unwrap_err()
        .contains("MIN <= BASE <= MAX"));
    assert!(Bounds::new(0.0, 20.0, 30.0).is_err());
}

/// An upload saturates a 10 Mbit/s uplink while the download carries 3 Mbit/s (low load);
/// the only signal is the round trip to a reflector (base 20 ms plus the upload's queue).
/// Returns the run's (upload queue p95 ms, download cuts, upload share of capacity).
fn upload_by_round_trip(law: Law) -> (f64, usize, f64) {
    let (down, up) = bounds();
    let mut ctl = Controller::new(Config::new(law, down, up));
    let (cu, demand_down) = (10.0 * MBIT, 3.0 * MBIT);
    let (mut qu, mut queue, mut delivered, mut cuts) = (0.0f64, Vec::new(), 0.0, 0);
    let mut t = 0;
    let mut steps = 0;
    while t < 120 * S {
        let ru = ctl.rate(Direction::Up);
        qu = (qu + (ru - cu) / cu * (STEP as f64 / 1e9)).clamp(0.0, 0.5);
        let du = if qu > 0.0 { cu } else { ru.min(cu) };
        ctl.on_load(demand_down.min(ctl.rate(Direction::Down)), ru);
        // The reflector's baseline is the round trip's least (20 ms): the delta is the queue.
        let mut ev = ctl.on_round_trip(t, qu * 1e3);
        ev.extend(ctl.on_tick(t));
        cuts += ev
            .iter()
            .filter(|e| {
                matches!(e, Event::Rate { dir: Direction::Down, why, .. }
                    if !matches!(why, Why::Decay | Why::Increase))
            })
            .count();
        if t >= 30 * S {
            queue.push(qu * 1e3);
            delivered += du;
            steps += 1;
        }
        t += STEP;
    }
    (p95(&queue), cuts, delivered / (cu * steps as f64))
}

#[test]
fn a_round_trip_cuts_only_the_busiest_direction_where_cake_autorate_cuts_both() {
    let (q, cuts, share) = upload_by_round_trip(Law::Bloatlab);
    eprintln!("ours: upload queue p95 {q:.1} ms, {share:.3} of it, {cuts} download cuts");
    // The upload's queue is found from the round trip alone and kept short; the download,
    // at low load, is never cut for it.
    assert_eq!(cuts, 0);
    assert!(q < 30.0 && share > 0.85, "queue {q} ms, share {share}");
    // cake-autorate halves the round trip into both directions: the download pays too.
    let (q, cuts, _) = upload_by_round_trip(Law::CakeAutorate);
    eprintln!("cake-autorate: upload queue p95 {q:.1} ms, {cuts} download cuts");
    assert!(cuts > 10, "{cuts}");
}

#[test]
fn a_round_trip_while_both_directions_idle_cuts_nothing_and_stops_no_stall() {
    let (down, up) = bounds();
    let mut ctl = Controller::new(Config::new(Law::Bloatlab, down, up));
    ctl.on_load(0.5 * MBIT, 0.1 * MBIT);
    let mut t = 0;
    let mut events = Vec::new();
    // A queue elsewhere (or a reflector busy with other work): 80 ms over its baseline.
    while t < 10 * S {
        events.extend(ctl.on_round_trip(t, if t < S { 0.0 } else { 80.0 }));
        events.extend(ctl.on_tick(t));
        t += STEP;
    }
    assert!(events.is_empty(), "{events:?}");
    // Round trips alone keep the controller out of a stall, and end one.
    let ev = ctl.on_tick(t + 2 * S);
    assert!(ev.contains(&Event::Stalled), "{ev:?}");
    assert_eq!(ctl.on_round_trip(t + 2 * S, 0.0), vec![Event::Recovered]);
}

/// Probes late by 45 ms in every other sample (a busy host's) on a line that carries 12.6
/// kbit/s each way: no rate at MIN or above holds a queue of that, and ours cuts nothing;
/// cake-autorate's law cuts at any load. With the upload at half its MIN, ours cuts it.
#[test]
fn late_probes_on_an_idle_line_cut_nothing_in_ours() {
    let cuts = |law: Law, up_bps: f64| {
        let (down, up) = bounds();
        let mut ctl = Controller::new(Config::new(law, down, up));
        ctl.on_load(12_600.0, up_bps);
        let mut cut = Vec::new();
        for i in 0..200u64 {
            let t = i * STEP;
            let ms = Some(if i >= 20 && i % 2 == 0 { 55.0 } else { 10.0 });
            let mut ev = ctl.on_sample(
                t,
                0,
                Sample {
                    down_ms: ms,
                    up_ms: ms,
                },
            );
            ev.extend(ctl.on_tick(t));
            cut.extend(ev.into_iter().filter_map(|e| match e {
                Event::Rate { dir, why, .. } if why != Why::Decay => Some(dir),
                _ => None,
            }));
        }
        cut
    };
    assert_eq!(cuts(Law::Bloatlab, 12_600.0), []);
    let theirs = cuts(Law::CakeAutorate, 12_600.0);
    assert!(
        theirs.contains(&Direction::Down) && theirs.contains(&Direction::Up),
        "{theirs:?}"
    );
    assert_eq!(
        cuts(Law::Bloatlab, 1.0 * MBIT).first(),
        Some(&Direction::Up)
    );
}
