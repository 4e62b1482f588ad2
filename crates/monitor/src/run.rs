//! The monitor's loop (shell): every 200 ms it reads the interface's counters and settles the
//! light probes; each minute it writes the finished rows; when a scheduled test is due it runs
//! one beside the probes, within the data budget. Faults are said once each: the target gone
//! (a gap in the history, retries backing off to a minute), a full disk, a test that failed.

use crate::budget::{self, Decision};
use crate::cake;
use crate::load::{Bands, LoadMeter};
use crate::metrics::Metrics;
use crate::minute::{Minutes, Tag};
use bloatlab_measure::display::ProgressMode;
use bloatlab_measure::http_rpm::HttpOptions;
use bloatlab_measure::watch::{Rider, Watch};
use bloatlab_measure::{Ended, Params, RunOptions};
use bloatlab_netio::sysfs::DevCounter;
use bloatlab_netio::unix_now;
use bloatlab_result::history::{LoadBand, ShaperRow, TestRow};
use bloatlab_result::lab::CakeStats;
use bloatlab_server::metrics::{MetricsFace, MetricsLimits};
use bloatlab_store::{Store, StoreError, Written};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, SystemTime};

/// The loop's longest sleep (counters, schedule, shutdown); a probe due wakes it sooner.
const TICK: Duration = Duration::from_millis(200);
/// Retries of an unreachable target back off from 2 s, doubling, to this.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

pub struct MonitorConfig {
    /// A bloatlab server's HOST[:PORT].
    pub target: String,
    pub test: Params,
    pub http: HttpOptions,
    /// Between scheduled tests; `None`: probes only.
    pub every: Option<Duration>,
    pub probe_rate: f64,
    /// The interface whose byte counters tag each probe's load; `None`: not tagged.
    pub iface: Option<String>,
    pub db: PathBuf,
    /// Where the scheduled tests' result files go.
    pub out_dir: PathBuf,
    pub metrics: Option<SocketAddr>,
    pub budget_per_day: Option<u64>,
    pub site: Option<String>,
    pub keep_probes: Duration,
    pub keep_tests: Duration,
    pub key: Option<Vec<u8>>,
    /// Set by SIGTERM/Ctrl-C: finish the minute and the test in hand, then return.
    pub stop: Arc<AtomicBool>,
    /// Autorate riding on the probes (then at its rate, and settled as they are answered), its
    /// gauges on the same face.
    pub rider: Option<Box<dyn Rider>>,
}

#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("--iface {iface}: {source}")]
    Iface {
        iface: String,
        source: std::io::Error,
    },
    #[error("--metrics {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--out-dir {dir}: {source}")]
    OutDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Target(#[from] bloatlab_measure::MeasureError),
}

/// What the loop says, one line each (the CLI prints them; tests collect them).
pub type Say = Box<dyn Fn(&str) + Send>;

/// CAKE on the watched interface and on its ingress twin (`ifb4IFACE`, as sqm-scripts and
/// `bloatlab fix` name it), read every `SHAPER_EVERY` with `tc -s -j` (once a minute while
/// there is none): each reading's growth goes to the metrics at once and into the minute's rows.
struct Shapers {
    devs: Vec<String>,
    last: std::collections::HashMap<String, CakeStats>,
    /// What was last said of each device: "cake", "none", so each change is said once.
    said: std::collections::HashMap<String, &'static str>,
    /// The minute so far, per (device, tin).
    minute: std::collections::BTreeMap<(String, String), ShaperRow>,
}

const SHAPER_EVERY: Duration = Duration::from_secs(5);

impl Shapers {
    fn new(iface: Option<&str>) -> Shapers {
        let devs = iface
            .map(|i| {
                let ifb = format!("ifb4{i}");
                let mut d = vec![i.to_string()];
                if std::path::Path::new("/sys/class/net").join(&ifb).exists() {
                    d.push(ifb);
                }
                d
            })
            .unwrap_or_default();
        Shapers {
            devs,
            last: Default::default(),
            said: Default::default(),
            minute: Default::default(),
        }
    }

    fn read(dev: &str) -> Result<Option<CakeStats>, String> {
        let out = std::process::Command::new("tc")
            .args(["-s", "-j", "qdisc", "show", "dev", dev])
            .output()
            .map_err(|e| format!("tc: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr)
                .trim()
                .chars()
                .take(200)
                .collect());
        }
        Ok(cake::parse_tc_json(&String::from_utf8_lossy(&out.stdout))?
            .into_iter()
            .next())
    }

    /// Reads every device: the growth since the last reading (for the metrics), added to the
    /// minute's rows; each device's change of state said once.
    fn poll(&mut self, say: &Say) -> Vec<ShaperRow> {
        let mut grown = Vec::new();
        for dev in &self.devs {
            let now = Shapers::read(dev).ok().flatten();
            let state = if now.is_some() { "cake" } else { "none" };
            let before = self.said.insert(dev.clone(), state);
            match (before, state) {
                (None, "cake") | (Some("none"), "cake") => say(&format!(
                    "{dev}: CAKE's statistics go into the history each minute"
                )),
                (Some("cake"), "none") => say(&format!("{dev}: its CAKE is gone")),
                _ => {}
            }
            let Some(now) = now else {
                self.last.remove(dev);
                continue;
            };
            if let Some(before) = self.last.get(dev) {
                match cake::minute_rows(0, dev, before, &now) {
                    Some(r) => grown.extend(r),
                    None => say(&format!(
                        "{dev}: its CAKE was replaced; its counters start over"
                    )),
                }
            }
            self.last.insert(dev.clone(), now);
        }
        for g in &grown {
            let m = self
                .minute
                .entry((g.iface.clone(), g.tin.clone()))
                .or_insert_with(|| ShaperRow {
                    iface: g.iface.clone(),
                    tin: g.tin.clone(),
                    ..ShaperRow::default()
                });
            m.rate_bps = g.rate_bps;
            m.packets += g.packets;
            m.bytes += g.bytes;
            m.drops += g.drops;
            m.marks += g.marks;
            m.ack_drops += g.ack_drops;
            m.backlog_bytes = m.backlog_bytes.max(g.backlog_bytes);
            m.pk_delay_us = m.pk_delay_us.max(g.pk_delay_us);
            m.av_delay_us = m.av_delay_us.max(g.av_delay_us);
            m.sp_delay_us = m.sp_delay_us.max(g.sp_delay_us);
        }
        grown
    }

    /// The rows of the minute so far, labelled `minute`, and a fresh one begun.
    fn take_minute(&mut self, minute: i64) -> Vec<ShaperRow> {
        std::mem::take(&mut self.minute)
            .into_values()
            .map(|r| ShaperRow { minute, ..r })
            .collect()
    }
}

/// A running scheduled test: its row once it has ended.
struct Running {
    started_ns: u64,
    done: mpsc::Receiver<TestRow>,
}

pub fn run(mut cfg: MonitorConfig, say: Say) -> Result<(), MonitorError> {
    let mut rider = cfg.rider.take();
    let mut store = Store::open(&cfg.db)?;
    std::fs::create_dir_all(&cfg.out_dir).map_err(|source| MonitorError::OutDir {
        dir: cfg.out_dir.clone(),
        source,
    })?;
    // The watched interface's byte counters, kept open (read at every wake-up).
    let mut counters = match &cfg.iface {
        Some(iface) => {
            let mut c = (
                DevCounter::new(iface, "rx_bytes"),
                DevCounter::new(iface, "tx_bytes"),
            );
            for c in [&mut c.0, &mut c.1] {
                c.read().map_err(|source| MonitorError::Iface {
                    iface: iface.clone(),
                    source,
                })?;
            }
            Some(c)
        }
        None => None,
    };
    let metrics = Arc::new(Metrics::new(&cfg.target, cfg.site.as_deref()));
    let _face: Option<MetricsFace> = match cfg.metrics {
        Some(addr) => {
            let m = metrics.clone();
            let riders = rider.as_ref().map(|r| r.metrics());
            // One exposition: the monitor's families, then the rider's (its own prefix), one
            // `# EOF` at the end.
            let render = move || match &riders {
                Some(r) => {
                    let mine = m.render();
                    mine.strip_suffix("# EOF\n").unwrap_or(&mine).to_string() + &r()
                }
                None => m.render(),
            };
            let face =
                bloatlab_server::metrics::serve(addr, MetricsLimits::default(), Arc::new(render))
                    .map_err(|source| MonitorError::Metrics { addr, source })?;
            say(&format!("metrics on http://{}/metrics", face.addr));
            Some(face)
        }
        None => None,
    };
    let mut watch = match &rider {
        Some(r) => Watch::new(
            &cfg.target,
            cfg.probe_rate.max(r.probe_rate()),
            cfg.key.clone(),
        )?
        .prompt(),
        None => Watch::new(&cfg.target, cfg.probe_rate, cfg.key.clone())?,
    }
    .driven();
    let mut minutes = Minutes::new(&cfg.target);
    let mut meter = LoadMeter::default();
    let mut bands = Bands {
        down_bps: None,
        up_bps: None,
    };
    if cfg.iface.is_none() {
        say("no --iface: probes are not tagged with the line's load");
    }
    let mut last_test: Option<TestRow> = None;
    let mut running: Option<Running> = None;
    // The first test soon after the start, then every `every`.
    let mut next_test = cfg.every.map(|_| unix_now() + 5.0);
    let mut retry_at = 0.0;
    let mut backoff = Duration::from_secs(2);
    let mut gap_open = false;
    let mut said_full = false;
    let mut last_store_error = String::new();
    let mut last_retain = 0.0;
    let mut shapers = Shapers::new(cfg.iface.as_deref());
    let mut shaper_minute = (unix_now() as i64).div_euclid(60) * 60;
    let mut next_shaper_ns = 0;
    // Test windows (monotonic ns): probes sent inside one are the test's, not the household's.
    let mut test_windows: Vec<(u64, u64)> = Vec::new();

    let mut store_written = |w: Result<Written, StoreError>, say: &Say| match w {
        Ok(w) if w.dropped && !said_full => {
            said_full = true;
            say(
                "the disk is full even after deleting old minutes: new rows are lost until \
                     there is room",
            );
        }
        Ok(w) if w.made_room > 0 && !said_full => {
            said_full = true;
            say(&format!(
                "the disk is full: deleted the {} oldest minutes of history to keep the \
                     newest",
                w.made_room
            ));
        }
        Ok(_) => last_store_error.clear(),
        // Said when it first happens or changes, not at every write.
        Err(e) => {
            let e = e.to_string();
            if e != last_store_error {
                say(&format!("history: {e}"));
                last_store_error = e;
            }
        }
    };

    loop {
        let stopping = cfg.stop.load(Ordering::Relaxed);
        let now_ns = bloatlab_netio::mono_ns();
        let now = unix_now();
        if let Some((rx, tx)) = &mut counters {
            if let (Ok(rx), Ok(tx)) = (rx.read(), tx.read()) {
                meter.add(now_ns, rx, tx);
            }
        }
        if now >= retry_at && !stopping {
            match watch.poll() {
                Ok(samples) => {
                    if gap_open && watch.connected() {
                        gap_open = false;
                        backoff = Duration::from_secs(2);
                        say(&format!("{} answers again", cfg.target));
                        store_written(store.close_gap(now as i64, &cfg.target), &say);
                    }
                    metrics.target_up(watch.connected());
                    if let Some(r) = rider.as_mut() {
                        r.samples(now_ns, &samples);
                    }
                    for s in samples {
                        let (load, rx, tx) = match (&cfg.iface, meter.rate_at(s.sent_ns)) {
                            (Some(_), Some((rx, tx))) => (bands.classify(rx, tx), rx, tx),
                            _ => (LoadBand::Unknown, 0.0, 0.0),
                        };
                        let testing = test_windows
                            .iter()
                            .any(|w| s.sent_ns >= w.0 && s.sent_ns <= w.1)
                            || running.as_ref().is_some_and(|r| s.sent_ns >= r.started_ns);
                        let sent_s = now - now_ns.saturating_sub(s.sent_ns) as f64 / 1e9;
                        let tag = Tag {
                            load,
                            testing,
                            rx_bps: rx,
                            tx_bps: tx,
                        };
                        minutes.add(sent_s, &s, tag);
                        metrics.probe(&s, if testing { None } else { Some(load) });
                    }
                }
                Err(e) => {
                    metrics.target_up(false);
                    if !gap_open {
                        gap_open = true;
                        let why = e.to_string();
                        say(&format!(
                            "{} does not answer: {why}; retrying, up to every {} s",
                            cfg.target,
                            MAX_BACKOFF.as_secs()
                        ));
                        store_written(store.open_gap(now as i64, &cfg.target, &why), &say);
                    }
                    retry_at = now + backoff.as_secs_f64();
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
        if let Some(r) = rider.as_mut() {
            r.step(now_ns);
        }
        test_windows.retain(|w| w.1 + 10_000_000_000 > now_ns);

        // A test that ended: its row, the line's capacity for the bands.
        if let Some(r) = &running {
            if let Ok(row) = r.done.try_recv() {
                test_windows.push((r.started_ns, bloatlab_netio::mono_ns()));
                running = None;
                if row.down_mbps.is_some() || row.up_mbps.is_some() {
                    bands = Bands {
                        down_bps: row.down_mbps.map(|m| m * 1e6).or(bands.down_bps),
                        up_bps: row.up_mbps.map(|m| m * 1e6).or(bands.up_bps),
                    };
                }
                say(&describe(&row));
                metrics.test(&row);
                store_written(store.add_test(&row), &say);
                last_test = Some(row);
            }
        }

        // A test that is due.
        if let (Some(every), Some(due)) = (cfg.every, next_test) {
            if now >= due && running.is_none() && !stopping {
                next_test = Some(due.max(now - every.as_secs_f64()) + every.as_secs_f64());
                let day_start = (now as i64).div_euclid(86_400) * 86_400;
                let spent = store.test_bytes_since(day_start).unwrap_or(0);
                let rate = last_test
                    .as_ref()
                    .map(|t| t.down_mbps.unwrap_or(0.0) + t.up_mbps.unwrap_or(0.0))
                    .filter(|m| *m > 0.0)
                    .map(|m| m * 1e6);
                let left = budget::tests_left_today(now as i64, every.as_secs() as i64);
                let decision =
                    budget::decide(cfg.budget_per_day, spent, left, rate, cfg.test.length);
                let skip = |why: String| TestRow {
                    started: now as i64,
                    target: cfg.target.clone(),
                    test: cfg.test.test.name().into(),
                    skipped: Some(why),
                    ..TestRow::default()
                };
                let length = match decision {
                    Decision::Run { length_s } => Some(length_s),
                    Decision::Shortened { length_s, why } => {
                        say(&format!("test shortened to {length_s} s: {why}"));
                        Some(length_s)
                    }
                    Decision::Skip { why } => {
                        say(&format!("test skipped: {why}"));
                        let row = skip(why);
                        metrics.test(&row);
                        store_written(store.add_test(&row), &say);
                        None
                    }
                };
                if let Some(length) = length {
                    if gap_open {
                        let row = skip(format!("{} does not answer", cfg.target));
                        say(&describe(&row));
                        metrics.test(&row);
                        store_written(store.add_test(&row), &say);
                    } else {
                        say(&format!("{} {length} s: starting", cfg.test.test.name()));
                        running = Some(start_test(&cfg, length, now));
                    }
                }
            }
        }

        // CAKE every few seconds for the metrics; its rows once a minute.
        if now_ns >= next_shaper_ns {
            let grown = shapers.poll(&say);
            metrics.shaper(&grown);
            // Without a CAKE, a look a minute is enough to notice one appear (a tc process
            // every 5 s on a small router is not free).
            let every = if shapers.last.is_empty() {
                Duration::from_secs(60)
            } else {
                SHAPER_EVERY
            };
            next_shaper_ns = now_ns + every.as_nanos() as u64;
        }
        let minute = (now as i64).div_euclid(60) * 60;
        if shaper_minute != minute {
            let rows = shapers.take_minute(shaper_minute);
            shaper_minute = minute;
            if !rows.is_empty() {
                store_written(store.add_shaper(&rows), &say);
            }
        }

        // Finished minutes, and once an hour what is past its keep.
        let rows = minutes.take(if stopping { i64::MAX } else { now as i64 - 5 });
        if !rows.is_empty() {
            store_written(store.add_minutes(&rows), &say);
        }
        if now - last_retain > 3600.0 {
            last_retain = now;
            store_written(
                store.retain(
                    now as i64,
                    cfg.keep_probes.as_secs() as i64,
                    cfg.keep_tests.as_secs() as i64,
                ),
                &say,
            );
        }
        if stopping {
            if let Some(r) = running.take() {
                // The test saw the same flag: it ends and writes its partial file.
                if let Ok(row) = r.done.recv_timeout(Duration::from_secs(15)) {
                    say(&describe(&row));
                    metrics.test(&row);
                    store_written(store.add_test(&row), &say);
                }
            }
            // CAKE's counters up to now: the minute in hand is not lost either.
            metrics.shaper(&shapers.poll(&say));
            let rows = shapers.take_minute(shaper_minute);
            if !rows.is_empty() {
                store_written(store.add_shaper(&rows), &say);
            }
            if gap_open {
                store_written(store.close_gap(now as i64, &cfg.target), &say);
            }
            if let Some(r) = rider.take() {
                r.finish();
            }
            return Ok(());
        }
        // Until the next probe is due (the watch has no threads of its own), at most a tick.
        let due = match (watch.next_due(), rider.as_ref().and_then(|r| r.next_due())) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let left = due.map_or(TICK, |due| {
            Duration::from_nanos(due.saturating_sub(bloatlab_netio::mono_ns())).min(TICK)
        });
        std::thread::sleep(left);
    }
}

fn start_test(cfg: &MonitorConfig, length: f64, now: f64) -> Running {
    let mut params = cfg.test.clone();
    params.length = length;
    let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let stamp: String = stamp.chars().filter(|c| c.is_ascii_digit()).collect();
    let path = cfg
        .out_dir
        .join(format!("bloatlab-{}-{stamp}.json.gz", params.test.name()));
    let opts = RunOptions {
        output: Some(path.clone()),
        progress: ProgressMode::Quiet,
        stop: cfg.stop.clone(),
        key: cfg.key.clone(),
    };
    let (target, http) = (cfg.target.clone(), cfg.http.clone());
    let (tx, done) = mpsc::channel();
    let started_ns = bloatlab_netio::mono_ns();
    std::thread::spawn(move || {
        let mut row = TestRow {
            started: now as i64,
            target: target.clone(),
            test: params.test.name().into(),
            length_s: length,
            ..TestRow::default()
        };
        match bloatlab_measure::run_target(&params, &target, &opts, &http) {
            Ok(out) => {
                row.result_path = Some(out.path.display().to_string());
                row.ended = Some(match &out.ended {
                    Ended::Complete => "complete".into(),
                    Ended::Interrupted => "interrupted".into(),
                    Ended::ServerLost(why) => format!("server lost: {why}"),
                    Ended::Failed(why) => format!("failed: {why}"),
                });
                if let Some(s) = &out.result.summary {
                    row.grade = s.grade.clone();
                    row.added_ms = s.added_latency_ms;
                    row.added_down_ms = s.added_owd_ms.down.map(|p| p.p50);
                    row.added_up_ms = s.added_owd_ms.up.map(|p| p.p50);
                    row.idle_ms = s.latency_ms.idle.map(|p| p.p50);
                    row.down_mbps = s.throughput_mbps.down;
                    row.up_mbps = s.throughput_mbps.up;
                    row.loss_percent = Some(s.loss.percent);
                    let mbps =
                        s.throughput_mbps.down.unwrap_or(0.0) + s.throughput_mbps.up.unwrap_or(0.0);
                    row.bytes = (mbps * 1e6 / 8.0 * length) as u64;
                }
            }
            Err(e) => row.ended = Some(format!("failed: {e}")),
        }
        let _ = tx.send(row);
    });
    Running { started_ns, done }
}

/// One line for a test's row.
pub fn describe(t: &TestRow) -> String {
    if let Some(why) = &t.skipped {
        return format!("{} skipped: {why}", t.test);
    }
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:+.1} ms"));
    let mbps = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    format!(
        "{} {:.0} s: grade {}, added {}, {} / {} Mbit/s down/up ({})",
        t.test,
        t.length_s,
        t.grade.as_deref().unwrap_or("-"),
        ms(t.added_ms),
        mbps(t.down_mbps),
        mbps(t.up_mbps),
        t.ended.as_deref().unwrap_or("?")
    )
}
