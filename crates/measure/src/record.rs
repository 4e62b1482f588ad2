//! Turns the live state of a test into a result file (snapshot or final).

use crate::connprobe::ConnRec;
use crate::control::Report;
use crate::engine::{ForeignProbe, RpmProbes};
use crate::flow::{FlowConn, PingLog};
use crate::load::Failure;
use crate::probe::{Log as ProbeLog, ProbeStream, Rec};
use crate::udp_load::UdpLoad;
use bloatlab_analyze::clock::{self, Echo};
use bloatlab_result::*;
use std::sync::MutexGuard;

/// A probe not answered within this long is counted lost in a snapshot (the final file counts
/// every unanswered probe as lost, after the drain).
const SNAPSHOT_PATIENCE_NS: u64 = 5_000_000_000;

pub struct Live<'a> {
    pub t0: u64,
    pub now: u64,
    pub idle_end: f64,
    /// Seconds from the start at which the load phase ended (its probing; the settle phase
    /// begins), if the test has load.
    pub settle_start: Option<f64>,
    /// When the load itself stopped: after the answers of its last probes.
    pub load_stopped: Option<f64>,
    pub flows: &'a [FlowConn],
    pub failures: &'a [Failure],
    pub probes: &'a [ProbeStream],
    pub connect: Option<&'a [ConnRec]>,
    pub rpm: bool,
    pub pings: &'a PingLog,
    pub report: Option<&'a Report>,
    /// `test udp`: the load's sender.
    pub udp: Option<&'a UdpLoad>,
    pub finished: bool,
}

fn secs(t0: u64, t: u64) -> f64 {
    (t as i128 - t0 as i128) as f64 / 1e9
}

fn resolved<'r>(recs: &'r [Rec], live: &Live) -> impl Iterator<Item = &'r Rec> + 'r {
    let (finished, cutoff) = (live.finished, live.now.saturating_sub(SNAPSHOT_PATIENCE_NS));
    recs.iter()
        .filter(move |r| finished || r.reply.is_some() || r.t1 < cutoff)
}

/// The result file as the test stands: the clock, each part's series and records (flows,
/// probe streams, connect and RPM probes, the UDP load), then the summary.
pub fn build(meta: &Metadata, live: &Live) -> ResultFile {
    let mut result = ResultFile::new(meta.clone());
    result.partial = !live.finished;

    let logs: Vec<_> = live.probes.iter().map(|p| p.log.lock().unwrap()).collect();
    let offset = clock_offset(live, &logs);
    result.metadata.clock_offset = offset;
    let off_ns = |t: f64| offset.map_or(0.0, |o| o.at(t) * 1e6);

    result
        .series
        .extend(throughput_series(live, offset, meta.step));

    probe_streams(&mut result, live, &logs, &off_ns);
    drop(logs);

    connect_and_rpm_series(&mut result, live);
    flow_records(&mut result, live);
    if let Some(u) = live.udp {
        udp_record(&mut result, u, live, offset, meta.step);
    }
    let mut summary = bloatlab_analyze::summarize(&result);
    let retrans: Vec<u32> = live.flows.iter().filter_map(|f| f.retransmits()).collect();
    summary.tcp_retransmits =
        (!retrans.is_empty()).then(|| retrans.iter().map(|&r| u64::from(r)).sum());
    result.summary = Some(summary);
    result
}

/// The server's clock against ours: from the idle phase's echoes when there are enough, else
/// from all of them; drift from a second estimate over the settling after the load.
fn clock_offset(live: &Live, logs: &[MutexGuard<'_, ProbeLog>]) -> Option<ClockOffset> {
    let echoes = |keep: &dyn Fn(f64) -> bool| -> Vec<Echo> {
        logs.iter()
            .flat_map(|l| l.recs.iter())
            .filter(|r| keep(secs(live.t0, r.t1)))
            .filter_map(|r| {
                r.reply.map(|(t2, t3, t4)| Echo {
                    t1: r.t1,
                    t2,
                    t3,
                    t4,
                })
            })
            .collect()
    };
    let mut before = echoes(&|t| t <= live.idle_end);
    if before.len() < 10 {
        before = echoes(&|_| true);
    }
    // Once the load has stopped: its queues drain.
    let after = live
        .settle_start
        .map(|s| live.load_stopped.unwrap_or(s))
        .map(|s| echoes(&|t| t >= s))
        .unwrap_or_default();
    clock::estimate_with_drift(&before, &after, live.t0)
}

/// Each bulk flow's throughput. A download's is what the client acknowledged as the server's
/// socket saw it, once the server's report and the clock offset are in: the receiver's reads
/// jump when a lost segment fills a hole and releases what waited behind it, so at fine steps
/// its goodput reads 2-3x the line. That goodput stays beside it (`NAME received`).
fn throughput_series(live: &Live, offset: Option<ClockOffset>, step: f64) -> Vec<Series> {
    let mut out = Vec::new();
    for flow in live.flows {
        let series = |kind, name: String, samples| Series {
            name,
            kind,
            direction: Some(flow.flow.spec.direction.as_str().into()),
            dscp: Some(flow.flow.spec.dscp),
            unit: "Mbit/s".into(),
            samples,
        };
        let acked = live
            .report
            .and_then(|r| r.flows.iter().find(|f| f.id == flow.flow.spec.id))
            .and_then(|f| f.acked.as_ref())
            .zip(offset)
            .map(|(a, o)| {
                let server_s = secs(live.t0, a.first_ns);
                let start = server_s - o.at(server_s) / 1e3;
                let (from, to) = match (flow.samples.first(), flow.samples.last()) {
                    (Some(f), Some(l)) => (f.0 - step, l.0),
                    _ => (f64::MAX, f64::MIN),
                };
                spread_rates(start, f64::from(a.bucket_us) / 1e6, &a.buckets, step)
                    .into_iter()
                    .filter(|s| s.0 > from + 1e-9 && s.0 <= to + 1e-9)
                    .collect::<Vec<_>>()
            })
            .filter(|s| !s.is_empty());
        let name = flow.flow.name.clone();
        match acked {
            Some(samples) => {
                out.push(series(SeriesKind::Throughput, name.clone(), samples));
                let received = format!("{name} received");
                out.push(series(SeriesKind::Received, received, flow.samples.clone()));
            }
            None => out.push(series(SeriesKind::Throughput, name, flow.samples.clone())),
        }
    }
    out
}

/// Each UDP probe stream: round trips and one-way delays (on the server's clock moved by
/// `off_ns`), its counts at both ends, and what became of its DSCP.
fn probe_streams(
    result: &mut ResultFile,
    live: &Live,
    logs: &[MutexGuard<'_, ProbeLog>],
    off_ns: &dyn Fn(f64) -> f64,
) {
    for (p, log) in live.probes.iter().zip(logs) {
        let name = &p.stream.name;
        let dscp = Some(p.stream.spec.dscp);
        let mut rtt = Vec::new();
        let mut up = Vec::new();
        let mut down = Vec::new();
        let (mut sent, mut received) = (0u64, 0u64);
        for r in resolved(&log.recs, live) {
            let t = secs(live.t0, r.t1);
            sent += 1;
            match r.reply {
                Some((t2, t3, t4)) => {
                    received += 1;
                    let e = Echo {
                        t1: r.t1,
                        t2,
                        t3,
                        t4,
                    };
                    rtt.push((t, Some(e.rtt_ns() as f64 / 1e6)));
                    let off = off_ns(t);
                    up.push((t, Some((t2 as f64 - off - r.t1 as f64) / 1e6)));
                    down.push((t, Some((t4 as f64 - (t3 as f64 - off)) / 1e6)));
                }
                None => {
                    rtt.push((t, None));
                    up.push((t, None));
                    down.push((t, None));
                }
            }
        }
        let series = |kind, prefix: &str, dir: Option<&str>, samples| Series {
            name: format!("{prefix} {name}"),
            kind,
            direction: dir.map(Into::into),
            dscp,
            unit: "ms".into(),
            samples,
        };
        result
            .series
            .push(series(SeriesKind::Latency, "rtt", None, rtt));
        result
            .series
            .push(series(SeriesKind::Owd, "owd up", Some("up"), up));
        result
            .series
            .push(series(SeriesKind::Owd, "owd down", Some("down"), down));
        let server = live
            .report
            .and_then(|r| r.streams.iter().find(|s| s.id == p.stream.spec.id));
        result.metadata.streams.push(StreamCounts {
            name: name.clone(),
            dscp: p.stream.spec.dscp,
            ecn: p.stream.spec.ecn,
            interval_ms: f64::from(p.stream.spec.interval_us) / 1e3,
            size: p.stream.spec.size,
            sent,
            received,
            server_received: server.map(|s| s.received),
            server_limited: server.map_or(0, |s| s.server_limited),
            dscp_applied_up: p.dscp_applied,
            dscp_applied_down: server.and_then(|s| s.dscp_applied),
            tos_arrived_up: server.map(|s| s.arrived.clone()).unwrap_or_default(),
            tos_arrived_down: log.arrived.clone(),
        });
        if let Some(why) = &p.dscp_refused {
            result.events.push(Event {
                t: 0.0,
                what: format!("probe stream {name}: {why}"),
            });
        }
        if let Some(applied) = server
            .and_then(|s| s.dscp_applied)
            .filter(|&a| a != p.stream.spec.dscp)
        {
            let want = p.stream.spec.dscp;
            result.events.push(Event {
                t: 0.0,
                what: format!(
                    "probe stream {name}: DSCP {want} was \
                requested but the server's replies carried {applied}"
                ),
            });
        }
    }
}

/// TCP connect times (RPM: the foreign probes' connect and request times) and RPM's probes
/// on the load connections.
fn connect_and_rpm_series(result: &mut ResultFile, live: &Live) {
    if live.rpm {
        // At the end, a ping still without its pong is a timeout when the load ran on for its
        // whole deadline; one sent within its deadline of the load's stop (an interrupted
        // test) was cut off by closing the flow, and is left out.
        let lost_before = live
            .load_stopped
            .or(live.settle_start)
            .filter(|_| live.finished)
            .map(|stopped| {
                stopped.min(secs(live.t0, live.now)) - PingLog::DEADLINE_NS as f64 / 1e9
            });
        let connect = live.connect.unwrap_or_default();
        let probes = rpm_probes(live.t0, connect, live.pings, lost_before);
        result.series.extend(probes.series());
        return;
    }
    if let Some(conn) = live.connect {
        // Logged as they complete; kept in the order they were sent.
        let mut samples: Vec<(f64, Option<f64>)> =
            conn.iter().map(|r| (secs(live.t0, r.0), r.1)).collect();
        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
        result.series.push(Series::latency("tcp-connect", samples));
    }
}

/// RPM's probes over the bloatlab protocol as the engine takes them (seconds from the test's
/// start): new-connection probes (a handshake, then a request; no TLS) and pings on the load
/// connections; the pings still unanswered that were sent before `lost_before` count as lost.
pub(crate) fn rpm_probes(
    t0: u64,
    connect: &[ConnRec],
    pings: &PingLog,
    lost_before: Option<f64>,
) -> RpmProbes {
    let mut loaded: Vec<(f64, Option<f64>)> = pings
        .done
        .lock()
        .unwrap()
        .iter()
        .map(|(t, ms)| (secs(t0, *t), Some(*ms)))
        .collect();
    if let Some(cutoff) = lost_before {
        loaded.extend(
            pings
                .unanswered()
                .into_iter()
                .map(|t| (secs(t0, t), None))
                .filter(|s| s.0 < cutoff),
        );
    }
    RpmProbes {
        tls: false,
        self_probes: true,
        foreign: connect
            .iter()
            .map(|&(sent, tcp, request)| ForeignProbe {
                sent: secs(t0, sent),
                tcp,
                tls: None,
                request,
            })
            .collect(),
        loaded,
    }
}

/// Each flow's record (congestion control, bytes the server saw, start, error, DSCP) and an
/// event for each that failed.
fn flow_records(result: &mut ResultFile, live: &Live) {
    let failure = |name: &str| {
        live.failures
            .iter()
            .find(|f| f.flow == name)
            .map(|f| f.why.clone())
    };
    for flow in live.flows {
        let server = live
            .report
            .and_then(|r| r.flows.iter().find(|f| f.id == flow.flow.spec.id));
        result.metadata.flows.push(FlowInfo {
            name: flow.flow.name.clone(),
            cc: flow.cc.clone(),
            server_bytes: server.map(|f| f.bytes),
            start: Some(flow.started),
            error: failure(&flow.flow.name),
            dscp_applied: flow.dscp_applied,
        });
        for why in [&flow.dscp_refused, &flow.uncounted].into_iter().flatten() {
            result.events.push(Event {
                t: flow.started,
                what: format!("flow {}: {why}", flow.flow.name),
            });
        }
    }
    for f in live.failures {
        if !live.flows.iter().any(|c| c.flow.name == f.flow) {
            result.metadata.flows.push(FlowInfo {
                name: f.flow.clone(),
                error: Some(f.why.clone()),
                ..Default::default()
            });
        }
        result.events.push(Event {
            t: f.t,
            what: format!("flow {}: {}", f.flow, f.why),
        });
    }
}

/// `test udp`: the load's record, its goodput where it arrived, and what became of its DSCP
/// and pacing.
fn udp_record(
    result: &mut ResultFile,
    u: &UdpLoad,
    live: &Live,
    offset: Option<ClockOffset>,
    step: f64,
) {
    let info = udp_info(u, live, |server_ns| {
        offset.map(|o| secs(live.t0, server_ns) - o.at(secs(live.t0, server_ns)) / 1e3)
    });
    if let Some(server) = &info.server {
        let samples = step_rates(
            server.recv_start.unwrap_or(0.0),
            info.bucket_ms / 1e3,
            &server.recv_bytes,
            step,
        );
        result.series.push(Series {
            name: "udp up".into(),
            kind: SeriesKind::Throughput,
            direction: Some("up".into()),
            dscp: Some(info.dscp),
            unit: "Mbit/s".into(),
            samples,
        });
    }
    if let Some(why) = &u.dscp_refused {
        result.events.push(Event {
            t: 0.0,
            what: format!("UDP load: {why}"),
        });
    }
    if let Some(note) = &u.pacing_note {
        result.events.push(Event {
            t: 0.0,
            what: format!("UDP load pacing: {note}"),
        });
    }
    if info.server.is_none() && live.finished {
        result.events.push(Event {
            t: 0.0,
            what: "the server reported nothing of the UDP load \
            (an older server?): no loss or goodput"
                .into(),
        });
    }
    result.metadata.udp = Some(info);
}

/// The load's record: the sender's log and, once reported, the server's, its buckets placed on
/// the client's clock by `to_client` (server ns to seconds from the start; `None` without a
/// clock offset, when the server's first bucket is placed at the sender's).
fn udp_info(u: &UdpLoad, live: &Live, to_client: impl Fn(u64) -> Option<f64>) -> UdpLoadInfo {
    let log = u.log.lock().unwrap();
    let bucket_ms = f64::from(u.spec.bucket_us) / 1e3;
    let send_start = log.buckets.first_ns().map(|t| secs(live.t0, t));
    let server = live
        .report
        .and_then(|r| r.udp.iter().find(|x| x.id == u.spec.id))
        .map(|r| UdpLoadServer {
            received: r.received,
            bytes: r.bytes,
            duplicates: r.duplicates,
            reordered: r.reordered,
            server_limited: r.server_limited,
            ce: r.ce,
            socket_drops: r.socket_drops,
            recv_start: (r.received > 0)
                .then(|| to_client(r.first_recv_ns).or(send_start))
                .flatten(),
            recv_bytes: r.buckets.clone(),
        });
    UdpLoadInfo {
        rate_mbps: u.spec.rate_bps as f64 / 1e6,
        size: u.spec.size,
        dscp: u.spec.dscp,
        ecn: u.spec.ecn,
        pacing: u.asked.to_string(),
        pacing_used: u.pacing.to_string(),
        pacing_note: u.pacing_note.clone(),
        bucket_ms,
        sent: log.sent,
        send_errors: log.send_errors,
        skipped: log.skipped,
        send_start,
        send_bytes: log.buckets.bytes().to_vec(),
        server,
    }
}

/// Per-bucket byte counts starting at `start` (seconds) as Mbit/s per `step`, each bucket's
/// bytes shared between the steps it overlaps in proportion (a count read at one moment, as
/// acknowledged bytes are, spreads evenly over its bucket), each sample at the end of its step
/// on the test's grid.
fn spread_rates(start: f64, bucket_s: f64, bytes: &[u32], step: f64) -> Vec<(f64, Option<f64>)> {
    let mut bins: std::collections::BTreeMap<i64, f64> = std::collections::BTreeMap::new();
    for (i, &b) in bytes.iter().enumerate() {
        let (from, to) = (
            start + i as f64 * bucket_s,
            start + (i + 1) as f64 * bucket_s,
        );
        let mut k = (from / step).floor() as i64;
        while (k as f64) * step < to {
            let overlap = (to.min((k + 1) as f64 * step) - from.max(k as f64 * step)).max(0.0);
            *bins.entry(k).or_default() += f64::from(b) * overlap / bucket_s;
            k += 1;
        }
    }
    bins.into_iter()
        .map(|(k, b)| ((k + 1) as f64 * step, Some(b * 8.0 / step / 1e6)))
        .collect()
}

/// Per-bucket byte counts starting at `start` (seconds) as Mbit/s per `step`, each sample at the
/// end of its step on the test's grid, as throughput series are.
fn step_rates(start: f64, bucket_s: f64, bytes: &[u32], step: f64) -> Vec<(f64, Option<f64>)> {
    let mut bins: std::collections::BTreeMap<i64, u64> = std::collections::BTreeMap::new();
    for (i, &b) in bytes.iter().enumerate() {
        let mid = start + (i as f64 + 0.5) * bucket_s;
        *bins.entry((mid / step).floor() as i64).or_default() += u64::from(b);
    }
    let (Some(&first), Some(&last)) = (bins.keys().next(), bins.keys().next_back()) else {
        return Vec::new();
    };
    (first..=last)
        .map(|k| {
            (
                (k + 1) as f64 * step,
                Some(bins.get(&k).copied().unwrap_or(0) as f64 * 8.0 / step / 1e6),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acknowledged_buckets_off_the_grid_spread_evenly_over_the_steps() {
        // 25 000 bytes per 10 ms (20 Mbit/s) from 3 ms, into 10 ms steps: every step the
        // buckets cover fully reads 20 Mbit/s, the first 70% of it.
        let r = spread_rates(0.003, 0.01, &[25_000; 50], 0.01);
        assert_eq!(r.len(), 51);
        assert!((r[0].1.unwrap() - 14.0).abs() < 1e-6, "{:?}", r[0]);
        for s in &r[1..50] {
            assert!((s.1.unwrap() - 20.0).abs() < 1e-6, "{s:?}");
        }
        assert!((r[0].0 - 0.01).abs() < 1e-12 && (r[50].0 - 0.51).abs() < 1e-9);
        let total: f64 = r.iter().map(|s| s.1.unwrap() * 0.01 / 8.0 * 1e6).sum();
        assert!(
            (total - 1_250_000.0).abs() < 1e-3,
            "every byte lands once: {total}"
        );
    }

    #[test]
    fn buckets_become_step_rates_on_the_tests_grid() {
        // 1 ms buckets of 1250 bytes (10 Mbit/s) from 0.0025 s, into 10 ms steps.
        let r = step_rates(0.0025, 0.001, &[1250; 20], 0.01);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].0, 0.01);
        assert!(
            (r[0].1.unwrap() - 7.0).abs() < 1e-9,
            "7 buckets fall in the first step"
        );
        assert!((r[1].1.unwrap() - 10.0).abs() < 1e-9);
        assert!((r[2].1.unwrap() - 3.0).abs() < 1e-9);
        assert!(step_rates(0.0, 0.001, &[], 0.01).is_empty());
    }
}
