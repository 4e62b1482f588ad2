//! From a result file's series to its summary. Windows: the idle phase whole; the load phase
//! from when its flows really started (the last handshake to finish; the first for RPM, whose
//! load ramps up on purpose), after a ramp-up of min(2 s, 20%) of what remains, as crusader
//! leaves out, so that slow start and the filling of queues do not dilute the steady state.
//! Goodput is bytes over time: each sample covers the time since the flow's previous sample.

use crate::{emodel, grade, rpm, stats};
use bloatlab_result::*;

/// Packetization delay of the assumed 20 ms VoIP frames, added to the mouth-to-ear delay.
const VOIP_PACKETIZATION_MS: f64 = 20.0;
/// Absolute one-way delays are reported only when the clock offset is known within this.
pub const OWD_UNCERTAINTY_BOUND_MS: f64 = 1.0;
/// A direction is bloated when its added one-way delay p50 under load is at least this and at
/// least `BLOAT_SHARE` of both directions' added delay together.
pub const BLOAT_MIN_MS: f64 = 5.0;
pub const BLOAT_SHARE: f64 = 0.25;

#[derive(Clone, Copy, Debug, PartialEq)]
struct Window {
    start: f64,
    end: f64,
}

impl Window {
    fn contains(&self, t: f64) -> bool {
        t >= self.start && t <= self.end
    }
}

fn phase_window(result: &ResultFile, name: &str) -> Option<Window> {
    let p = result.metadata.phases.iter().find(|p| p.name == name)?;
    Some(Window {
        start: p.start,
        end: p.end,
    })
}

/// Start of the load phase left out of its statistics, seconds.
pub fn ramp_up(load_len: f64) -> f64 {
    (0.2 * load_len).min(2.0)
}

fn values<'a>(s: &'a Series, w: Window) -> impl Iterator<Item = f64> + 'a {
    s.samples
        .iter()
        .filter(move |(t, _)| w.contains(*t))
        .filter_map(|(_, v)| *v)
}

fn named<'a>(result: &'a ResultFile, prefix: &'a str) -> impl Iterator<Item = &'a Series> + 'a {
    result
        .series
        .iter()
        .filter(move |s| s.name.starts_with(prefix))
}

fn pct_of(result: &ResultFile, prefix: &str, w: Option<Window>) -> Option<Percentiles> {
    let w = w?;
    stats::percentiles(
        named(result, prefix)
            .flat_map(|s| values(s, w))
            .collect::<Vec<_>>(),
    )
}

/// One-way delay above each series' own minimum in `base` (offset-free: a constant offset
/// cancels), pooled over the series whose names start with `prefix`, over `w`.
fn added_owd(result: &ResultFile, prefix: &str, base: Window, w: Window) -> Option<Percentiles> {
    let mut all = Vec::new();
    for series in named(result, prefix) {
        let Some(min) = values(series, base).reduce(f64::min) else {
            continue;
        };
        all.extend(values(series, w).map(|v| v - min));
    }
    stats::percentiles(all)
}

/// "up", "down", "both" or "none" from the added one-way delays' medians.
fn bloat_direction(up: Option<f64>, down: Option<f64>) -> Option<&'static str> {
    let (up, down) = (up?, down?);
    let total = up.max(0.0) + down.max(0.0);
    let bloated = |d: f64| d >= BLOAT_MIN_MS && d >= BLOAT_SHARE * total;
    Some(match (bloated(up), bloated(down)) {
        (true, true) => "both",
        (true, false) => "up",
        (false, true) => "down",
        (false, false) => "none",
    })
}

fn stream_name(series_name: &str) -> &str {
    series_name.rsplit(' ').next().unwrap_or(series_name)
}

/// When the load really began: the latest flow start (RPM: the earliest), not before the phase.
fn flows_started(result: &ResultFile, phase: Window) -> f64 {
    let starts = result.metadata.flows.iter().filter_map(|f| f.start);
    let real = if result.metadata.test == "rpm" {
        starts.reduce(f64::min)
    } else {
        starts.reduce(f64::max)
    };
    real.map_or(phase.start, |t| t.clamp(phase.start, phase.end))
}

/// Mean goodput over `w`, Mbit/s: the bits a flow's samples carry inside the window over its
/// length. Sample i covers the time since sample i-1; the first, since the flow's `start` (else
/// one `step` before it).
fn mean_rate(s: &Series, w: Window, start: Option<f64>, step: f64) -> f64 {
    let Some(first) = s.samples.first() else {
        return 0.0;
    };
    stats::rate_over(&s.samples, start.unwrap_or(first.0 - step), w.start, w.end)
}

/// A result's summary: the one in its file, else computed now (a killed run's file has none).
pub fn summary_of(result: &ResultFile) -> Summary {
    result.summary.clone().unwrap_or_else(|| summarize(result))
}

/// Tests whose load is TCP flows.
const TCP_LOAD_TESTS: [&str; 6] = ["tcp-down", "tcp-up", "tcp-bidir", "rrul", "rrul-be", "rpm"];

/// Why a test whose load is TCP flows had none: no flow started and no goodput sample carried
/// a byte (every flow failed to open, or none was recorded).
pub fn load_missing(result: &ResultFile) -> Option<String> {
    if !TCP_LOAD_TESTS.contains(&result.metadata.test.as_str())
        || phase_window(result, "load").is_none()
    {
        return None;
    }
    let flows = &result.metadata.flows;
    // A flow's start first: the samples are looked through only when no flow started.
    let moved = || {
        result.series.iter().any(|s| {
            s.kind == SeriesKind::Throughput
                && s.samples.iter().any(|(_, v)| v.is_some_and(|v| v > 0.0))
        })
    };
    if flows.iter().any(|f| f.start.is_some()) || moved() {
        return None;
    }
    Some(
        match flows
            .iter()
            .find_map(|f| f.error.as_deref().map(|e| (f, e)))
        {
            Some((f, why)) => format!(
                "none of its {} load flows opened ({}: {why})",
                flows.len(),
                f.name
            ),
            None => "no load flow ran".into(),
        },
    )
}

/// The idle window and the load window after its ramp-up, as the summary takes them.
fn windows(result: &ResultFile) -> (Option<Window>, Option<Window>) {
    windows_given(result, load_missing(result).is_none())
}

/// [`windows`] once [`load_missing`] has been asked: a load phase without its load has no
/// window (its probes saw an idle path).
fn windows_given(result: &ResultFile, load_ran: bool) -> (Option<Window>, Option<Window>) {
    let idle = phase_window(result, "idle");
    let load = phase_window(result, "load").filter(|_| load_ran);
    let load = load.map(|w| {
        let began = flows_started(result, w);
        Window {
            start: began + ramp_up(w.end - began),
            end: w.end,
        }
    });
    (idle, load)
}

/// Round trips of one probe class ("be", "ef", "bk"), ms: (idle, under load), each window as
/// the summary takes it; for figures the summary has no room for (a p95).
pub fn class_rtts(result: &ResultFile, class: &str) -> (Vec<f64>, Vec<f64>) {
    let (idle, load) = class_rtt_samples(result, class);
    let values = |v: Timed| v.into_iter().map(|s| s.1).collect();
    (values(idle), values(load))
}

/// Round trips with their time in the test: (seconds, ms).
pub type Timed = Vec<(f64, f64)>;

/// [`class_rtts`] with each round trip's time in the test, idle and under load.
pub fn class_rtt_samples(result: &ResultFile, class: &str) -> (Timed, Timed) {
    let (idle, load) = windows(result);
    let of = |w: Option<Window>| -> Timed {
        w.map_or_else(Vec::new, |w| {
            named(result, "rtt ")
                .filter(|x| probe_class(x.dscp.unwrap_or(0)) == class)
                .flat_map(|x| x.samples.iter())
                .filter(|(t, _)| w.contains(*t))
                .filter_map(|(t, v)| v.map(|v| (*t, v)))
                .collect()
        })
    };
    (of(idle), of(load))
}

pub fn summarize(result: &ResultFile) -> Summary {
    let load_missing = load_missing(result);
    let (idle, load) = windows_given(result, load_missing.is_none());
    // Where the test's own figures (jitter, loss, VoIP) come from: under load if there was load.
    let main = load.or(idle);

    let mut s = Summary {
        test: result.metadata.test.clone(),
        load_missing,
        partial: result.partial,
        ..Default::default()
    };

    if let Some(w) = main {
        s.throughput_mbps = throughput(result, |_| Some(w));
    }

    let lat = &mut s.latency_ms;
    lat.idle = pct_of(result, "rtt ", idle);
    lat.loaded = pct_of(result, "rtt ", load);
    let owd_known = match result.metadata.clock_offset {
        Some(o) if o.uncertainty_ms <= OWD_UNCERTAINTY_BOUND_MS => Ok(()),
        Some(o) => {
            // Added one-way delays need no offset, only a load to add them.
            let see = if load.is_some() {
                "; see added one-way delays"
            } else {
                ""
            };
            Err(format!(
                "the clock offset is known only to +/-{:.1} ms (bound \
                {OWD_UNCERTAINTY_BOUND_MS} ms){see}",
                o.uncertainty_ms
            ))
        }
        None => Err("no clock offset estimate (no echoed probes)".to_string()),
    };
    match &owd_known {
        Ok(()) => {
            lat.idle_owd = DirectionLatency {
                up: pct_of(result, "owd up ", idle),
                down: pct_of(result, "owd down ", idle),
            };
            lat.loaded_owd = DirectionLatency {
                up: pct_of(result, "owd up ", load),
                down: pct_of(result, "owd down ", load),
            };
        }
        Err(why) => lat.owd_unavailable = Some(why.clone()),
    }
    lat.tcp_connect = pct_of(result, "tcp-connect", main);
    for series in named(result, "rtt ") {
        lat.per_stream.push(StreamLatency {
            name: stream_name(&series.name).to_string(),
            dscp: series.dscp.unwrap_or(0),
            idle: idle.and_then(|w| stats::percentiles(values(series, w).collect::<Vec<_>>())),
            loaded: load.and_then(|w| stats::percentiles(values(series, w).collect::<Vec<_>>())),
        });
    }
    // Added latency per probe class; the headline from best effort when there is any.
    let class_added = |class: &str| -> Option<f64> {
        let series: Vec<&Series> = named(result, "rtt ")
            .filter(|x| probe_class(x.dscp.unwrap_or(0)) == class)
            .collect();
        let p50 = |w: Option<Window>| {
            w.and_then(|w| {
                stats::percentiles(series.iter().flat_map(|x| values(x, w)).collect::<Vec<_>>())
            })
            .map(|p| p.p50)
        };
        Some(p50(load)? - p50(idle)?)
    };
    s.added_latency_ms_by_class = ByClass {
        be: class_added("be"),
        ef: class_added("ef"),
        bk: class_added("bk"),
    };
    let pooled = match (&lat.idle, &lat.loaded) {
        (Some(i), Some(l)) => Some(l.p50 - i.p50),
        _ => None,
    };
    s.loss = loss(&result.metadata.streams);
    s.loss.idle_percent = probe_loss_in(result, idle);
    s.loss.load_percent = probe_loss_in(
        result,
        phase_window(result, "load").filter(|_| load.is_some()),
    );
    if let Some(added) = s.added_latency_ms_by_class.be.or(pooled) {
        s.added_latency_ms = Some(added);
        let (letter, cap) = grade::capped(added, s.loss.load_percent);
        (s.grade, s.grade_loss_cap) = (Some(letter), cap);
    }

    if let (Some(base), Some(w)) = (idle, main) {
        s.added_owd_ms = DirectionLatency {
            up: added_owd(result, "owd up ", base, w),
            down: added_owd(result, "owd down ", base, w),
        };
        if load.is_some() {
            s.bloat_direction = bloat_direction(
                s.added_owd_ms.up.map(|p| p.p50),
                s.added_owd_ms.down.map(|p| p.p50),
            )
            .map(Into::into);
        }
    }

    // Jitter and VoIP quality come from the call stream when there is one, else the first probe
    // stream.
    let primary = result
        .metadata
        .streams
        .iter()
        .find(|c| c.name == "voip")
        .or_else(|| result.metadata.streams.first())
        .map(|c| c.name.clone());
    if let (Some(name), Some(w)) = (primary, main) {
        let owd = |dir: &str| result.series(&format!("owd {dir} {name}"));
        let jitter = |dir: &str| owd(dir).and_then(|x| stats::rfc3550_jitter(values(x, w)));
        s.jitter_ms = Jitter {
            up: jitter("up"),
            down: jitter("down"),
        };
        if name == "voip" {
            let counts = result.metadata.streams.iter().find(|c| c.name == "voip");
            let (up_loss, down_loss) = counts.map(direction_loss).unwrap_or((None, None));
            let total_loss = counts.map(|c| stream_loss(c).2).unwrap_or(0.0);
            // Each direction's share of the call's network loss, from the server's counts.
            let share = |dir_loss: Option<f64>| match (up_loss, down_loss) {
                (Some(u), Some(d)) if u + d > 0.0 => dir_loss.unwrap_or(0.0) / (u + d),
                _ => {
                    if total_loss > 0.0 {
                        1.0
                    } else {
                        0.0
                    }
                }
            };
            // The network delay is the jitter buffer's depth, the one-way p99, when the offset is
            // known; else half the idle round trip plus that direction's added one-way p99 (the
            // p99 above the direction's idle minimum).
            let half_rtt = s.latency_ms.idle.map(|p| p.p50 / 2.0);
            let heard = |dir: &str, dir_loss| {
                let x = owd(dir)?;
                let call = call_as_heard(x, w, share(dir_loss))?;
                let delay = match owd_known {
                    Ok(()) => call.buffer,
                    Err(_) => half_rtt? + call.buffer - values(x, idle?).reduce(f64::min)?,
                };
                Some((delay, call.loss, call.burst_r))
            };
            let delay_basis = if owd_known.is_ok() {
                "one-way p99"
            } else {
                "idle rtt/2 + added one-way p99"
            };
            if let (Some((u, loss_u, burst_u)), Some((d, loss_d, burst_d))) =
                (heard("up", up_loss), heard("down", down_loss))
            {
                let (mu, md) = (u + VOIP_PACKETIZATION_MS, d + VOIP_PACKETIZATION_MS);
                let r_up = emodel::r_factor(mu, loss_u, burst_u);
                let r_down = emodel::r_factor(md, loss_d, burst_d);
                let (mos_up, mos_down) = (emodel::mos(r_up), emodel::mos(r_down));
                s.voip = Some(Voip {
                    r_up,
                    r_down,
                    mos_up,
                    mos_down,
                    mos: mos_up.min(mos_down),
                    mouth_to_ear_up_ms: mu,
                    mouth_to_ear_down_ms: md,
                    delay_basis: delay_basis.into(),
                    loss_up_percent: loss_u,
                    loss_down_percent: loss_d,
                    burst_r_up: burst_u,
                    burst_r_down: burst_d,
                });
            }
        }
    }

    s.rpm = match &result.metadata.rpm_by_direction {
        Some(runs) => {
            let down = rpm_summary(result, "download", Some(&runs.down), idle, None);
            let up = rpm_summary(result, "upload", Some(&runs.up), idle, None);
            // The worse direction stands for the test, as with grades: never averaged away.
            let worse = [&down, &up]
                .into_iter()
                .flatten()
                .min_by(|a, b| a.rpm.total_cmp(&b.rpm))
                .cloned();
            s.rpm_by_direction = Some(RpmByDirection { down, up });
            worse
        }
        // Without its load connections an RPM is an idle path's responsiveness.
        None if s.load_missing.is_some() => None,
        None => rpm_summary(result, "load", result.metadata.rpm.as_ref(), idle, load),
    };
    by_phase(result, idle, &mut s);
    if let Some(u) = &result.metadata.udp {
        let load_s = phase_window(result, "load").map(|w| w.end - w.start);
        let (load, loss) = crate::burst::udp_summary(u, load_s);
        s.udp = Some(load);
        s.loss = loss;
        let recv = u
            .server
            .as_ref()
            .and_then(|x| crate::burst::profile(&x.recv_bytes, u.bucket_ms));
        s.burst = Some(Burst {
            send: crate::burst::profile(&u.send_bytes, u.bucket_ms),
            recv,
        });
    }
    if result.metadata.test == "writeback" {
        crate::writeback::summarize(result, &mut s);
    }
    if let Some(r) = &s.rpm {
        let bits = |mbps: Option<f64>| mbps.map(|m| (m * 1e6).round() as u64);
        let whole = |r: Option<&Rpm>| r.map(|r| r.rpm.round() as u64);
        let by_dir = s.rpm_by_direction.as_ref();
        s.network_quality = NetworkQuality {
            dl_throughput: bits(s.throughput_mbps.down),
            ul_throughput: bits(s.throughput_mbps.up),
            responsiveness: whole(Some(r)),
            dl_responsiveness: whole(by_dir.and_then(|d| d.down.as_ref())),
            ul_responsiveness: whole(by_dir.and_then(|d| d.up.as_ref())),
            // The idle probes' p50; the HTTP transport has only the idle RPM's probe time.
            base_rtt: s
                .latency_ms
                .idle
                .map(|p| p.p50)
                .or(r.idle.filter(|i| *i > 0.0).map(|i| 60_000.0 / i)),
        };
    }
    // What the path did to the probes' marks, each way (from the server's report).
    s.marks = crate::marks::from_streams(&result.metadata.streams);
    s
}

/// Goodput per flow and per direction, each direction over its own window. The samples end up
/// to a step before a phase does: bytes over the time they cover.
fn throughput(result: &ResultFile, window_of: impl Fn(&str) -> Option<Window>) -> Throughput {
    let sampled_until = result
        .series
        .iter()
        .filter(|x| x.kind == SeriesKind::Throughput)
        .filter_map(|x| x.samples.last())
        .map(|s| s.0)
        .reduce(f64::max);
    let mut t = Throughput::default();
    let (mut down, mut up) = (Vec::new(), Vec::new());
    let (mut down_starts, mut up_starts) = (Vec::new(), Vec::new());
    for series in result
        .series
        .iter()
        .filter(|x| x.kind == SeriesKind::Throughput)
    {
        let dir = series.direction.clone().unwrap_or_default();
        let Some(w) = window_of(&dir) else { continue };
        let w = Window {
            end: sampled_until.map_or(w.end, |t| t.clamp(w.start, w.end)),
            ..w
        };
        let start = result
            .metadata
            .flows
            .iter()
            .find(|f| f.name == series.name)
            .and_then(|f| f.start);
        let mbps = mean_rate(series, w, start, result.metadata.step);
        if dir == "up" {
            up.push(mbps);
            up_starts.extend(start);
        } else {
            down.push(mbps);
            down_starts.extend(start);
        }
        t.per_flow.push(FlowThroughput {
            name: series.name.clone(),
            direction: dir,
            dscp: series.dscp.unwrap_or(0),
            mbps,
        });
    }
    let sum = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>());
    t.down = sum(&down);
    t.up = sum(&up);
    t.total = sum(&[down.clone(), up.clone()].concat());
    // Jain's index compares flows that shared the window. Flows opened one a second (RPM's
    // ramp) did not: the first ran alone, the last for a moment, and the index read 0.39 on a
    // line that shared fairly.
    let together = |starts: &[f64]| {
        starts.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b))
            - starts.iter().fold(f64::INFINITY, |a, &b| a.min(b))
            <= FLOWS_TOGETHER_S
    };
    t.fairness_down = stats::jain(&down).filter(|_| together(&down_starts));
    t.fairness_up = stats::jain(&up).filter(|_| together(&up_starts));
    t
}

/// Flows whose data began within this many seconds of each other are compared for fairness.
const FLOWS_TOGETHER_S: f64 = 1.0;

/// A load phase without its ramp-up (as the load phase's statistics leave it out).
fn steady_phase(result: &ResultFile, name: &str) -> Option<Window> {
    phase_window(result, name).map(|w| Window {
        start: w.start + ramp_up(w.end - w.start),
        end: w.end,
    })
}

/// Goodput of one direction's flows together over `w`, Mbit/s.
fn direction_rate(result: &ResultFile, dir: &str, w: Window) -> f64 {
    let flows = result.series.iter().filter(|x| {
        x.kind == SeriesKind::Throughput && x.direction.as_deref().unwrap_or("down") == dir
    });
    flows
        .map(|x| {
            stats::rate_over(
                &x.samples,
                x.samples
                    .first()
                    .map_or(w.start, |f| f.0 - result.metadata.step),
                w.start,
                w.end,
            )
        })
        .sum()
}

/// The load had filled the path when goodput stopped growing: the second half of the steady
/// window within 25% of the first (a load still in slow start or still opening streams grows by
/// more; a full path's goodput wobbles by less).
fn filled(result: &ResultFile, dir: &str, w: Window) -> Option<bool> {
    let mid = (w.start + w.end) / 2.0;
    let first = direction_rate(result, dir, Window { end: mid, ..w });
    let second = direction_rate(result, dir, Window { start: mid, ..w });
    (first > 0.0).then_some(second <= 1.25 * first)
}

/// Per load phase: its added latency, each direction's grade, and (one-way phases) whether the
/// load filled the path. With a download and an upload phase (the browser test), each
/// direction's goodput comes from its own phase and the worse direction sets the headline.
fn by_phase(result: &ResultFile, idle: Option<Window>, s: &mut Summary) {
    let (down, up, both) = (
        steady_phase(result, "download"),
        steady_phase(result, "upload"),
        steady_phase(result, "both"),
    );
    if down.is_none() && up.is_none() && both.is_none() {
        // A CLI test has one load phase; name it by the way its load goes.
        let a = s.added_latency_ms;
        let g = &mut s.grade_by_direction;
        match s.test.as_str() {
            "tcp-down" => {
                s.phase_added_latency_ms.download = a;
                (g.down, g.down_loss_cap) = (s.grade.clone(), s.grade_loss_cap.clone());
            }
            "tcp-up" => {
                s.phase_added_latency_ms.upload = a;
                (g.up, g.up_loss_cap) = (s.grade.clone(), s.grade_loss_cap.clone());
            }
            "tcp-bidir" | "rrul" | "rrul-be" => s.phase_added_latency_ms.both = a,
            _ => {}
        }
        return;
    }
    let idle_p50 = pct_of(result, "rtt ", idle).map(|p| p.p50);
    let added = |w: Option<Window>| Some(pct_of(result, "rtt ", w)?.p50 - idle_p50?);
    s.phase_added_latency_ms = ByPhase {
        download: added(down),
        upload: added(up),
        both: added(both),
    };
    // Each direction capped by the loss of its own phase's probes.
    let graded = |a: Option<f64>, phase: &str| {
        a.map(|a| grade::capped(a, probe_loss_in(result, phase_window(result, phase))))
    };
    let down_grade = graded(s.phase_added_latency_ms.download, "download");
    let up_grade = graded(s.phase_added_latency_ms.upload, "upload");
    s.grade_by_direction = GradeByDirection {
        down: down_grade.as_ref().map(|g| g.0.clone()),
        up: up_grade.as_ref().map(|g| g.0.clone()),
        down_loss_cap: down_grade.as_ref().and_then(|g| g.1.clone()),
        up_loss_cap: up_grade.as_ref().and_then(|g| g.1.clone()),
    };
    s.throughput_mbps = throughput(result, |dir| if dir == "up" { up } else { down });
    s.saturated = Some(Saturated {
        down: down.and_then(|w| filled(result, "down", w)),
        up: up.and_then(|w| filled(result, "up", w)),
    });
    let worse = [
        s.phase_added_latency_ms.download,
        s.phase_added_latency_ms.upload,
    ]
    .into_iter()
    .flatten()
    .reduce(f64::max);
    // The worse direction sets the headline: the larger added latency, and the worse grade
    // with the cap that made it so.
    let worst_grade = [down_grade, up_grade].into_iter().flatten().reduce(|a, b| {
        if grade::worse(&a.0, &b.0) == b.0 {
            b
        } else {
            a
        }
    });
    if let (Some(_), Some((letter, cap))) = (worse, worst_grade) {
        s.added_latency_ms = worse;
        (s.grade, s.grade_loss_cap) = (Some(letter), cap);
    }
}

/// One direction of the call as its listener hears it over `w`.
struct HeardCall {
    /// The jitter buffer's depth: the p99 of the one-way delays (the mouth-to-ear rule).
    buffer: f64,
    /// Percent of packets lost or later than the buffer allows.
    loss: f64,
    burst_r: f64,
}

/// A packet is lost when its round trip was (counted at `share`, this direction's part of the
/// call's network loss) or when it came later than the jitter buffer allows; BurstR comes from
/// that sequence of losses. `None` when no packet of the window arrived.
fn call_as_heard(owd: &Series, w: Window, share: f64) -> Option<HeardCall> {
    let in_window: Vec<Option<f64>> = owd
        .samples
        .iter()
        .filter(|(t, _)| w.contains(*t))
        .map(|(_, v)| *v)
        .collect();
    let buffer = stats::percentiles(in_window.iter().flatten().copied())?.p99;
    let n = in_window.len() as f64;
    let network = in_window.iter().filter(|v| v.is_none()).count() as f64;
    let late = in_window.iter().flatten().filter(|&&v| v > buffer).count() as f64;
    let sequence: Vec<bool> = in_window
        .iter()
        .map(|v| v.is_none_or(|v| v > buffer))
        .collect();
    Some(HeardCall {
        buffer,
        loss: 100.0 * (network * share + late) / n,
        burst_r: emodel::burst_r(&sequence),
    })
}

/// Round-trip loss of the probes sent in `w`, percent.
fn probe_loss_in(result: &ResultFile, w: Option<Window>) -> Option<f64> {
    let w = w?;
    let (mut sent, mut lost) = (0u64, 0u64);
    for series in named(result, "rtt ") {
        for (_, v) in series.samples.iter().filter(|(t, _)| w.contains(*t)) {
            sent += 1;
            lost += u64::from(v.is_none());
        }
    }
    (sent > 0).then(|| 100.0 * lost as f64 / sent as f64)
}

/// (sent that the server did not decline, lost, percent) of one stream.
fn stream_loss(c: &StreamCounts) -> (u64, u64, f64) {
    let eligible = c.sent.saturating_sub(c.server_limited);
    let lost = eligible.saturating_sub(c.received);
    let pct = if eligible == 0 {
        0.0
    } else {
        100.0 * lost as f64 / eligible as f64
    };
    (eligible, lost, pct)
}

/// Loss up and down in percent, when the server said how many requests it received.
fn direction_loss(c: &StreamCounts) -> (Option<f64>, Option<f64>) {
    let Some(srv) = c.server_received else {
        return (None, None);
    };
    let eligible = c.sent.saturating_sub(c.server_limited);
    let up = if eligible == 0 {
        0.0
    } else {
        100.0 * eligible.saturating_sub(srv) as f64 / eligible as f64
    };
    let down = if srv == 0 {
        0.0
    } else {
        100.0 * srv.saturating_sub(c.received) as f64 / srv as f64
    };
    (Some(up), Some(down))
}

fn loss(streams: &[StreamCounts]) -> Loss {
    let mut l = Loss::default();
    let (mut up_lost, mut up_sent, mut down_lost, mut down_sent, mut split) =
        (0u64, 0u64, 0u64, 0u64, true);
    for c in streams {
        let (eligible, lost, _) = stream_loss(c);
        l.sent += eligible;
        l.lost += lost;
        l.server_limited += c.server_limited;
        match c.server_received {
            Some(srv) => {
                up_sent += eligible;
                up_lost += eligible.saturating_sub(srv);
                down_sent += srv;
                down_lost += srv.saturating_sub(c.received);
            }
            None => split = false,
        }
    }
    let pct = |lost: u64, sent: u64| {
        if sent == 0 {
            0.0
        } else {
            100.0 * lost as f64 / sent as f64
        }
    };
    l.percent = pct(l.lost, l.sent);
    if split && !streams.is_empty() {
        l.up_percent = Some(pct(up_lost, up_sent));
        l.down_percent = Some(pct(down_lost, down_sent));
    }
    l
}

/// RPM from the completed probes of the last MAD intervals of a load phase (the draft's
/// window; older result files without the run's intervals: the loaded window), with the probes
/// of the whole phase that never completed counted. `run` is that phase's run of the algorithm.
fn rpm_summary(
    result: &ResultFile,
    phase_name: &str,
    run: Option<&RpmRun>,
    idle: Option<Window>,
    load: Option<Window>,
) -> Option<Rpm> {
    let phase = phase_window(result, phase_name)?;
    let w = match run {
        Some(r) => Window {
            start: (phase.end - f64::from(r.mad) * r.interval_s).max(phase.start),
            end: phase.end,
        },
        None => load?,
    };
    let get = |name: &str, w: Window| {
        result
            .series(name)
            .map(|x| values(x, w).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let connect = get("rpm foreign-connect", w);
    let request = get("rpm foreign-request", w);
    // No "rpm loaded" series: a transport without self probes (HTTP/1.1).
    let loaded = result.series("rpm loaded").map(|_| get("rpm loaded", w));
    // Over TLS (the HTTP transport) the handshake is a third foreign term.
    let tls = get("rpm foreign-tls", w);
    let foreign_terms: Vec<&[f64]> = if result.series("rpm foreign-tls").is_some() {
        vec![connect.as_slice(), tls.as_slice(), request.as_slice()]
    } else {
        vec![connect.as_slice(), request.as_slice()]
    };
    let (value, foreign, loaded_rpm) = rpm::rpm(&foreign_terms, loaded.as_deref())?;
    let idle_rpm = idle.and_then(|iw| {
        let both: Vec<f64> = get("rpm foreign-connect", iw)
            .into_iter()
            .chain(get("rpm foreign-request", iw))
            .collect();
        stats::trimmed_mean(&both, rpm::KEEP).map(|tm| 60_000.0 / tm)
    });
    // A foreign probe failed when its connect or its request did not complete.
    let unanswered = |name: &str| {
        result.series(name).map_or(0, |x| {
            x.samples
                .iter()
                .filter(|(t, v)| phase.contains(*t) && v.is_none())
                .count()
        })
    };
    let foreign_failed = match (
        result.series("rpm foreign-connect"),
        result.series("rpm foreign-request"),
    ) {
        (Some(c), Some(r)) => c
            .samples
            .iter()
            .zip(&r.samples)
            .filter(|((t, a), (_, b))| phase.contains(*t) && (a.is_none() || b.is_none()))
            .count(),
        _ => 0,
    };
    Some(Rpm {
        rpm: value,
        foreign,
        loaded: loaded_rpm,
        idle: idle_rpm,
        band: rpm::band(value).to_string(),
        load_connections: match phase_name {
            // A one-way phase: its own direction's connections.
            "download" | "upload" => result
                .series
                .iter()
                .filter(|x| {
                    x.kind == SeriesKind::Throughput
                        && x.direction.as_deref()
                            == Some(if phase_name == "upload" { "up" } else { "down" })
                })
                .count(),
            _ => result
                .metadata
                .params
                .get("load_connections")
                .and_then(|v| v.as_u64())
                .unwrap_or(0) as usize,
        },
        probes: request.len() + loaded.as_ref().map_or(0, Vec::len),
        probe_timeouts: foreign_failed + unanswered("rpm loaded"),
        // A one-way phase: its own direction's connections.
        failed_connections: result
            .metadata
            .flows
            .iter()
            .filter(|f| f.error.is_some())
            .filter(|f| match phase_name {
                "download" => f.name.starts_with("down"),
                "upload" => f.name.starts_with("up"),
                _ => true,
            })
            .count(),
        confidence: run
            .map_or("medium", |r| rpm::confidence(r).name())
            .to_string(),
        window_s: w.end - w.start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(phases: Vec<Phase>, streams: Vec<StreamCounts>) -> Metadata {
        Metadata {
            tool: "bloatlab".into(),
            tool_version: "test".into(),
            test: "rrul".into(),
            params: serde_json::Value::Null,
            client: Host::default(),
            server: Host::default(),
            cc: None,
            start_time: String::new(),
            step: 0.01,
            phases,
            clock_offset: None,
            flows: vec![],
            streams,
            lab: None,
            rpm: None,
            rpm_by_direction: None,
            udp: None,
        }
    }

    fn series(
        name: &str,
        kind: SeriesKind,
        dir: Option<&str>,
        samples: Vec<(f64, Option<f64>)>,
    ) -> Series {
        Series {
            name: name.into(),
            kind,
            direction: dir.map(Into::into),
            dscp: Some(0),
            unit: "x".into(),
            samples,
        }
    }

    /// A synthetic bloated run: 5 s idle at 1 ms RTT, 10 s load at 600 ms RTT with two download
    /// flows (12 + 8 Mbit/s) and one upload flow (4.5 Mbit/s).
    fn bloated() -> ResultFile {
        let mut r = ResultFile::new(meta(
            vec![
                Phase {
                    name: "idle".into(),
                    start: 0.0,
                    end: 5.0,
                },
                Phase {
                    name: "load".into(),
                    start: 5.0,
                    end: 15.0,
                },
            ],
            vec![StreamCounts {
                name: "udp-be".into(),
                sent: 1500,
                received: 1470,
                server_received: Some(1485),
                server_limited: 0,
                ..Default::default()
            }],
        ));
        let grid = |from: f64, to: f64| {
            (0..)
                .map(move |i| from + i as f64 * 0.01)
                .take_while(move |t| *t < to)
        };
        let rtt = grid(0.0, 15.0)
            .map(|t| (t, Some(if t < 5.0 { 1.0 } else { 600.0 })))
            .collect();
        r.series
            .push(series("rtt udp-be", SeriesKind::Latency, None, rtt));
        // Slow start during the first second of load must not count.
        let flow = |mbps: f64| {
            grid(5.0, 15.0)
                .map(|t| (t, Some(if t < 6.0 { 0.5 } else { mbps })))
                .collect()
        };
        r.series.push(series(
            "tcp down 1 BE",
            SeriesKind::Throughput,
            Some("down"),
            flow(12.0),
        ));
        r.series.push(series(
            "tcp down 2 BK",
            SeriesKind::Throughput,
            Some("down"),
            flow(8.0),
        ));
        r.series.push(series(
            "tcp up 3 BE",
            SeriesKind::Throughput,
            Some("up"),
            flow(4.5),
        ));
        r.partial = false;
        r
    }

    /// A sequential RPM run (`networkQuality -s`): 1 s idle at 10 ms, the download stage (1-9 s)
    /// at 20 ms, the upload stage (9-17 s) at 200 ms, on every probe kind. Each direction's RPM
    /// comes from its own stage's last MAD intervals (60000 / 20 = 3000, 60000 / 200 = 300),
    /// the worse is the test's, and the networkQuality names carry both.
    #[test]
    fn sequential_rpm_gives_each_direction_its_own_rpm_and_the_worse_as_the_tests() {
        let stages = [
            ("idle", 0.0, 1.0, 10.0),
            ("download", 1.0, 9.0, 20.0),
            ("upload", 9.0, 17.0, 200.0),
        ];
        let mut phases: Vec<Phase> = stages
            .iter()
            .map(|(n, a, b, _)| Phase {
                name: (*n).into(),
                start: *a,
                end: *b,
            })
            .collect();
        phases.push(Phase {
            name: "load".into(),
            start: 1.0,
            end: 17.0,
        });
        let mut r = ResultFile::new(meta(phases, vec![]));
        r.metadata.test = "rpm".into();
        r.metadata.step = 0.1;
        let run = |from: f64| RpmRun {
            interval_s: 1.0,
            mad: 4,
            sdt: 0.05,
            intervals: (1..=8)
                .map(|i| RpmInterval {
                    t: from + i as f64,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        r.metadata.rpm_by_direction = Some(RpmRunByDirection {
            down: run(1.0),
            up: run(9.0),
        });
        let grid = |from: f64, to: f64| {
            (0..)
                .map(move |i| from + i as f64 * 0.1)
                .take_while(move |t| *t < to)
        };
        let ms = |t: f64| {
            stages
                .iter()
                .find(|(_, a, b, _)| t >= *a && t < *b)
                .map(|s| s.3)
        };
        for name in ["rpm foreign-connect", "rpm foreign-request"] {
            r.series.push(series(
                name,
                SeriesKind::Latency,
                None,
                grid(0.0, 17.0).map(|t| (t, ms(t))).collect(),
            ));
        }
        r.series.push(series(
            "rpm loaded",
            SeriesKind::Latency,
            None,
            grid(1.0, 17.0).map(|t| (t, ms(t))).collect(),
        ));
        // Each sample covers the step before it; a stage's last one comes at its end.
        r.series.push(series(
            "down-1",
            SeriesKind::Throughput,
            Some("down"),
            grid(1.1, 9.05).map(|t| (t, Some(50.0))).collect(),
        ));
        r.series.push(series(
            "up-1",
            SeriesKind::Throughput,
            Some("up"),
            grid(9.1, 17.05).map(|t| (t, Some(10.0))).collect(),
        ));
        let s = summarize(&r);
        let by_dir = s.rpm_by_direction.clone().expect("each direction's RPM");
        let (down, up) = (by_dir.down.unwrap(), by_dir.up.unwrap());
        assert!(
            (down.rpm - 3000.0).abs() < 1e-6 && (up.rpm - 300.0).abs() < 1e-6,
            "{} / {}",
            down.rpm,
            up.rpm
        );
        assert_eq!((down.load_connections, up.load_connections), (1, 1));
        assert_eq!(s.rpm.as_ref().map(|r| r.rpm), Some(up.rpm));
        let nq = s.network_quality;
        assert_eq!(
            (
                nq.responsiveness,
                nq.dl_responsiveness,
                nq.ul_responsiveness
            ),
            (Some(300), Some(3000), Some(300))
        );
        // Each direction's goodput over its own stage, not diluted by the other's.
        assert_eq!(
            (nq.dl_throughput, nq.ul_throughput),
            (Some(50_000_000), Some(10_000_000))
        );
    }

    /// The run whose flows never opened (the router build's rrul-be under a starved qemu): its
    /// probes went on through the load phase on an idle path. Graded, they read "A".
    #[test]
    fn a_load_whose_flows_never_opened_has_no_loaded_figures_and_no_grade() {
        let mut r = bloated();
        r.series.retain(|x| x.kind != SeriesKind::Throughput);
        r.series.retain(|x| x.kind != SeriesKind::Latency);
        let rtt = (0..1500)
            .map(|i| {
                (
                    f64::from(i) * 0.01,
                    Some(if i % 7 == 0 { 3.0 } else { 1.0 }),
                )
            })
            .collect();
        r.series
            .push(series("rtt udp-be", SeriesKind::Latency, None, rtt));
        r.metadata.flows = (1..=2)
            .map(|i| FlowInfo {
                name: format!("tcp down {i} BE"),
                error: Some("still opening when the load ended".into()),
                ..Default::default()
            })
            .collect();
        let s = summarize(&r);
        assert_eq!(
            s.load_missing.as_deref(),
            Some(
                "none of its 2 load flows opened (tcp down 1 BE: still opening when the load \
                ended)"
            )
        );
        assert_eq!((s.grade, s.added_latency_ms), (None, None));
        assert_eq!(s.latency_ms.loaded, None);
        assert_eq!(s.loss.load_percent, None);
        assert!(s.latency_ms.idle.is_some());
        // None recorded at all (a file from before flows that failed to open were): the same.
        r.metadata.flows.clear();
        let s = summarize(&r);
        assert_eq!(s.load_missing.as_deref(), Some("no load flow ran"));
        assert_eq!(s.grade, None);
        // One flow that started, or one goodput sample with a byte, is a load.
        r.metadata.flows.push(FlowInfo {
            start: Some(5.2),
            ..Default::default()
        });
        assert_eq!(summarize(&r).load_missing, None);
        assert!(summarize(&r).grade.is_some());
        assert_eq!(summarize(&bloated()).load_missing, None);
        // A test without TCP flows has nothing of the kind to miss.
        r.metadata.flows.clear();
        r.metadata.test = "ping".into();
        assert_eq!(summarize(&r).load_missing, None);
    }

    /// A 10-packet FIFO at 6 Mbit/s under an upload: +16 ms, but 23% of the probes lost under
    /// load (issue #38). The latency alone grades A; the loss caps it at D, and says so.
    #[test]
    fn loss_under_load_caps_the_grade_of_a_short_fifo() {
        let mut r = bloated();
        r.metadata.test = "tcp-up".into();
        r.series.retain(|x| x.kind != SeriesKind::Latency);
        let rtt = (0..1500)
            .map(|i| {
                let t = f64::from(i) * 0.01;
                // Idle: 20 ms, nothing lost; loaded: 36 ms, 23 of every 100 lost.
                let lost = t >= 5.0 && i % 100 < 23;
                (t, (!lost).then_some(if t < 5.0 { 20.0 } else { 36.0 }))
            })
            .collect();
        r.series
            .push(series("rtt udp-be", SeriesKind::Latency, None, rtt));
        let s = summarize(&r);
        assert_eq!(s.added_latency_ms, Some(16.0));
        assert_eq!(s.loss.load_percent, Some(23.0));
        let cap = LossCap {
            loss_percent: 23.0,
            latency_grade: "A".into(),
            at_most: "D".into(),
        };
        assert_eq!(s.grade.as_deref(), Some("D"));
        assert_eq!(s.grade_loss_cap.as_ref(), Some(&cap));
        // The one-way test's direction carries the same grade and cap.
        assert_eq!(s.grade_by_direction.up.as_deref(), Some("D"));
        assert_eq!(s.grade_by_direction.up_loss_cap, Some(cap));
    }

    /// The browser's phases: the download adds 100 ms (C), the upload 10 ms with 16% of its
    /// probes lost (A by latency, D by its loss). Each direction is graded on its own phase;
    /// the headline takes the worse grade, D with its cap, and the larger added latency.
    #[test]
    fn each_phase_is_capped_by_its_own_loss_and_the_worse_grade_leads() {
        let phases = [
            ("idle", 0.0, 5.0, 20.0, 0),
            ("download", 5.0, 15.0, 120.0, 0),
            ("upload", 15.0, 25.0, 30.0, 16),
        ];
        let mut r = ResultFile::new(meta(
            phases
                .iter()
                .map(|p| Phase {
                    name: p.0.into(),
                    start: p.1,
                    end: p.2,
                })
                .collect(),
            vec![],
        ));
        r.metadata.test = "browser".into();
        let rtt = (0..2500)
            .map(|i| {
                let t = f64::from(i) * 0.01;
                let p = phases.iter().find(|p| t >= p.1 && t < p.2).unwrap();
                (t, (i % 100 >= p.4).then_some(p.3))
            })
            .collect();
        r.series
            .push(series("rtt ws", SeriesKind::Latency, None, rtt));
        let s = summarize(&r);
        let g = &s.grade_by_direction;
        assert_eq!((g.down.as_deref(), g.up.as_deref()), (Some("C"), Some("D")));
        assert_eq!(g.down_loss_cap, None);
        let cap = g.up_loss_cap.clone().expect("the upload's loss capped it");
        assert_eq!((cap.latency_grade.as_str(), cap.loss_percent), ("A", 16.0));
        assert_eq!(s.grade.as_deref(), Some("D"));
        assert_eq!(s.grade_loss_cap, Some(cap));
        assert_eq!(s.added_latency_ms, Some(100.0));
    }

    /// What CAKE's diffserv3 does on the cable line (kernel, #16): best effort +4 ms, EF +9,
    /// CS1 +150. The headline and grade follow best effort; each class is reported.
    #[test]
    fn added_latency_comes_from_best_effort_probes_with_each_class_beside_it() {
        let mut r = bloated();
        r.series.retain(|x| x.kind != SeriesKind::Latency);
        let grid = |from: f64, to: f64| {
            (0..)
                .map(move |i| from + i as f64 * 0.01)
                .take_while(move |t| *t < to)
        };
        for (name, dscp, added) in [
            ("udp-be", 0u8, 4.0),
            ("udp-ef", 46, 9.0),
            ("udp-bk", 8, 150.0),
        ] {
            let mut x = series(
                &format!("rtt {name}"),
                SeriesKind::Latency,
                None,
                grid(0.0, 15.0)
                    .map(|t| (t, Some(if t < 5.0 { 15.0 } else { 15.0 + added })))
                    .collect(),
            );
            x.dscp = Some(dscp);
            r.series.push(x);
        }
        let s = summarize(&r);
        assert_eq!(s.added_latency_ms, Some(4.0));
        assert_eq!(
            s.added_latency_ms_by_class,
            ByClass {
                be: Some(4.0),
                ef: Some(9.0),
                bk: Some(150.0)
            }
        );
        assert_eq!(s.grade.as_deref(), Some(grade::grade(4.0)));
        assert_eq!(
            s.latency_ms.loaded.unwrap().p50,
            24.0,
            "the pooled percentiles stay pooled"
        );
    }

    #[test]
    fn fairness_compares_only_flows_that_began_together() {
        let mut r = bloated();
        let start = |name: &str, t: f64| FlowInfo {
            name: name.into(),
            start: Some(t),
            ..Default::default()
        };
        r.metadata.flows = vec![start("tcp down 1 BE", 5.0), start("tcp down 2 BK", 5.8)];
        assert!(
            summarize(&r).throughput_mbps.fairness_down.is_some(),
            "0.8 s apart: together"
        );
        // RPM's ramp: the second opened 3 s after the first.
        r.metadata.flows[1].start = Some(8.0);
        let s = summarize(&r);
        assert_eq!(s.throughput_mbps.fairness_down, None);
        assert!(
            (s.throughput_mbps.down.unwrap() - 20.0).abs() < 1e-9,
            "the direction's total stands"
        );
    }

    #[test]
    fn bloated_run_gets_its_numbers_and_an_f() {
        let s = summarize(&bloated());
        assert!((s.throughput_mbps.down.unwrap() - 20.0).abs() < 1e-9);
        assert!((s.throughput_mbps.up.unwrap() - 4.5).abs() < 1e-9);
        let j = s.throughput_mbps.fairness_down.unwrap();
        assert!((j - 400.0 / (2.0 * 208.0)).abs() < 1e-9, "{j}");
        assert_eq!(s.latency_ms.idle.unwrap().p50, 1.0);
        assert_eq!(s.latency_ms.loaded.unwrap().p99, 600.0);
        assert_eq!(s.added_latency_ms, Some(599.0));
        assert_eq!(s.grade.as_deref(), Some("F"));
        // rrul loads both ways at once: its one load phase is the "both" phase.
        assert_eq!(
            (
                s.phase_added_latency_ms.both,
                s.phase_added_latency_ms.download
            ),
            (Some(599.0), None)
        );
        assert!(s.saturated.is_none() && s.grade_by_direction.down.is_none());
        assert_eq!((s.loss.sent, s.loss.lost), (1500, 30));
        assert!((s.loss.up_percent.unwrap() - 1.0).abs() < 1e-9);
        assert!((s.loss.down_percent.unwrap() - 100.0 * 15.0 / 1485.0).abs() < 1e-9);
        assert!(!s.partial);
    }

    /// Samples taken late (a stalled loop, a slow disk) cover more time: goodput weighs them by
    /// it. The plain mean of these samples would say 13.3 Mbit/s.
    #[test]
    fn goodput_is_bytes_over_time_when_samples_are_uneven() {
        let s = series(
            "tcp down 1 BE",
            SeriesKind::Throughput,
            Some("down"),
            vec![(6.0, Some(10.0)), (9.0, Some(20.0)), (10.0, Some(10.0))],
        );
        let w = Window {
            start: 5.0,
            end: 10.0,
        };
        assert!((mean_rate(&s, w, Some(5.0), 0.01) - 16.0).abs() < 1e-9);
        // Half of the first sample's time lies before the window.
        assert!(
            (mean_rate(
                &s,
                Window {
                    start: 5.5,
                    end: 10.0
                },
                Some(5.0),
                0.01
            ) - 75.0 / 4.5)
                .abs()
                < 1e-9
        );
    }

    /// The steady-state window starts from when the flows really started, not from the phase.
    #[test]
    fn the_loaded_window_starts_after_the_last_flow_started() {
        let mut r = bloated();
        let start = |name: &str, t: f64| FlowInfo {
            name: name.into(),
            start: Some(t),
            ..Default::default()
        };
        r.metadata.flows = vec![
            start("tcp down 1 BE", 5.0),
            start("tcp down 2 BK", 5.0),
            start("tcp up 3 BE", 8.0),
        ];
        // The upload flow only started at 8 s: its samples before that carry nothing.
        for (t, v) in r.series[3].samples.iter_mut() {
            if *t < 8.0 {
                *v = None;
            }
        }
        let w = phase_window(&r, "load").unwrap();
        assert_eq!(flows_started(&r, w), 8.0);
        let s = summarize(&r);
        // Window 9.4-15 s (ramp-up 20 % of the 7 s left): the flows' steady rates.
        assert!(
            (s.throughput_mbps.up.unwrap() - 4.5).abs() < 1e-9,
            "{:?}",
            s.throughput_mbps.up
        );
        assert!((s.throughput_mbps.down.unwrap() - 20.0).abs() < 1e-9);
        r.metadata.test = "rpm".into();
        assert_eq!(
            flows_started(&r, w),
            5.0,
            "RPM's load ramps on purpose: from its first flow"
        );
    }

    /// A path whose upload queue fills: one-way delays carry an unknown clock offset (+3 ms here,
    /// known only to +/-7.8 ms), which the added delay does not need.
    #[test]
    fn added_one_way_delay_finds_the_bloated_direction_without_the_offset() {
        let mut r = bloated();
        r.metadata.clock_offset = Some(ClockOffset {
            offset_ms: 0.0,
            uncertainty_ms: 7.8,
            samples: 10,
            reference_s: 0.0,
            drift_ppm: None,
        });
        let grid = |f: fn(f64) -> f64| {
            (0..1500)
                .map(|i| i as f64 * 0.01)
                .map(|t| (t, Some(f(t))))
                .collect::<Vec<_>>()
        };
        r.series.push(series(
            "owd up udp-be",
            SeriesKind::Owd,
            Some("up"),
            grid(|t| if t < 5.0 { 10.8 } else { 410.8 }),
        ));
        r.series.push(series(
            "owd down udp-be",
            SeriesKind::Owd,
            Some("down"),
            grid(|t| if t < 5.0 { 4.8 } else { 6.8 }),
        ));
        let s = summarize(&r);
        assert!((s.added_owd_ms.up.unwrap().p50 - 400.0).abs() < 1e-9);
        assert!((s.added_owd_ms.down.unwrap().p50 - 2.0).abs() < 1e-9);
        assert_eq!(s.bloat_direction.as_deref(), Some("up"));
        assert!(
            s.latency_ms.loaded_owd.up.is_none()
                && s.latency_ms
                    .owd_unavailable
                    .as_deref()
                    .unwrap()
                    .contains("7.8")
        );
        // Known well enough: the absolute one-way delays are shown.
        r.metadata.clock_offset.as_mut().unwrap().uncertainty_ms = 0.2;
        let s = summarize(&r);
        assert_eq!(s.latency_ms.loaded_owd.up.unwrap().p50, 410.8);
        assert!(s.latency_ms.owd_unavailable.is_none());
    }

    /// The call as heard: losses outside the evaluated window do not count, a burst inside it
    /// raises BurstR, and the 1 % of packets beyond the p99 jitter buffer count as lost.
    #[test]
    fn voip_loss_is_the_calls_own_in_its_window_with_late_packets_and_bursts() {
        let owd: Series = series(
            "owd up voip",
            SeriesKind::Owd,
            Some("up"),
            (0..1000)
                .map(|i| {
                    let t = i as f64 * 0.02; // 20 s call, window 10-20 s
                    let lost = (100..150).contains(&i) || (700..720).contains(&i);
                    (t, (!lost).then_some(10.0 + (i % 100) as f64 * 0.1))
                })
                .collect(),
        );
        let w = Window {
            start: 10.0,
            end: 20.0,
        };
        let call = call_as_heard(&owd, w, 1.0).unwrap();
        let (loss, burst) = (call.loss, call.burst_r);
        // 20 of 500 lost in the window (the 50 lost before it do not count), plus the 1 % late.
        let late = 100.0 * 5.0 / 500.0;
        assert!((loss - (4.0 + late)).abs() < 0.5, "{loss} %");
        assert!(
            burst > 5.0,
            "one run of 20 losses is bursty: BurstR {burst}"
        );
        assert!(emodel::ie_eff(loss, burst) > emodel::ie_eff(loss, 1.0));
    }

    #[test]
    fn loss_is_reported_per_phase() {
        let mut r = bloated();
        for (t, v) in r.series[0].samples.iter_mut() {
            if *t >= 10.0 && *t < 11.0 {
                *v = None; // 100 of the load phase's 1000 probes
            }
        }
        let s = summarize(&r);
        assert_eq!(s.loss.idle_percent, Some(0.0));
        assert!(
            (s.loss.load_percent.unwrap() - 10.0).abs() < 0.2,
            "{:?}",
            s.loss.load_percent
        );
    }

    #[test]
    fn bloat_direction_rule() {
        assert_eq!(bloat_direction(Some(290.0), Some(3.0)), Some("up"));
        assert_eq!(bloat_direction(Some(60.0), Some(40.0)), Some("both"));
        assert_eq!(
            bloat_direction(Some(60.0), Some(10.0)),
            Some("up"),
            "10 ms is below a quarter of 70"
        );
        assert_eq!(
            bloat_direction(Some(4.0), Some(4.0)),
            Some("none"),
            "under 5 ms is no bloat"
        );
        assert_eq!(bloat_direction(None, Some(4.0)), None);
    }

    #[test]
    fn server_limited_probes_are_not_loss() {
        let c = StreamCounts {
            sent: 100,
            received: 90,
            server_received: Some(90),
            server_limited: 10,
            ..Default::default()
        };
        let l = loss(&[c]);
        assert_eq!(
            (l.sent, l.lost, l.percent, l.server_limited),
            (90, 0, 0.0, 10)
        );
        assert_eq!((l.up_percent, l.down_percent), (Some(0.0), Some(0.0)));
    }

    #[test]
    fn idle_voip_call_scores_above_4() {
        let mut r = ResultFile::new(meta(
            vec![Phase {
                name: "idle".into(),
                start: 0.0,
                end: 10.0,
            }],
            vec![StreamCounts {
                name: "voip".into(),
                sent: 500,
                received: 500,
                server_received: Some(500),
                ..Default::default()
            }],
        ));
        let owd: Vec<(f64, Option<f64>)> = (0..500)
            .map(|i| (i as f64 * 0.02, Some(0.2 + (i % 3) as f64 * 0.05)))
            .collect();
        r.series.push(series(
            "owd up voip",
            SeriesKind::Owd,
            Some("up"),
            owd.clone(),
        ));
        r.series.push(series(
            "owd down voip",
            SeriesKind::Owd,
            Some("down"),
            owd.clone(),
        ));
        r.metadata.clock_offset = Some(ClockOffset {
            offset_ms: 0.0,
            uncertainty_ms: 0.2,
            samples: 100,
            reference_s: 0.0,
            drift_ppm: None,
        });
        let s = summarize(&r);
        let v = s.voip.clone().unwrap();
        assert!(v.mos > 4.0 && v.mos <= 4.5, "{v:?}");
        assert_eq!(v.delay_basis, "one-way p99");
        // Offset too uncertain: half the idle round trip plus the added one-way delay.
        r.metadata.clock_offset.as_mut().unwrap().uncertainty_ms = 20.0;
        let rtt: Vec<(f64, Option<f64>)> = owd.iter().map(|(t, _)| (*t, Some(30.0))).collect();
        r.series
            .push(series("rtt voip", SeriesKind::Latency, None, rtt));
        let v2 = summarize(&r).voip.unwrap();
        assert_eq!(v2.delay_basis, "idle rtt/2 + added one-way p99");
        assert!(
            (v2.mouth_to_ear_up_ms - (15.0 + 0.1 + VOIP_PACKETIZATION_MS)).abs() < 1e-9,
            "{v2:?}"
        );
        assert!(s.jitter_ms.up.unwrap() > 0.0 && s.jitter_ms.up.unwrap() < 0.1);
        assert!(s.added_latency_ms.is_none() && s.grade.is_none());
    }
}
