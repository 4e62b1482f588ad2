//! The locate result for people: a table per hop, then the verdict in plain words.

use crate::{Loaded, LocateFile};
use std::fmt::Write;

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

fn pair(l: Option<Loaded>) -> String {
    l.map_or("-".into(), |l| format!("{:.0}/{:.0}", l.p50_ms, l.p90_ms))
}

pub fn text(l: &LocateFile) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "Path to {} ({}), round trip per hop, ms (loaded: p50/p90):",
        l.metadata.target,
        l.metadata
            .address
            .map_or("no address".into(), |a| a.to_string())
    );
    let _ = writeln!(
        o,
        "{:>3}  {:<40} {:>9} {:>8} {:>11} {:>11} {:>11}",
        "hop", "address", "answers", "idle p50", "download", "upload", "both"
    );
    for h in &l.hops {
        let named = |a: std::net::IpAddr| {
            h.name
                .as_ref()
                .map_or(a.to_string(), |n| format!("{n} ({a})"))
        };
        let addr = match (h.address, h.destination) {
            (Some(a), true) => format!("{} (destination)", named(a)),
            (Some(a), false) => named(a),
            (None, _) => "*".into(),
        };
        let _ = writeln!(
            o,
            "{:>3}  {:<40} {:>9} {:>8} {:>11} {:>11} {:>11}",
            h.ttl,
            addr,
            format!("{}/{}", h.answered, h.sent),
            ms(h.idle_p50_ms),
            pair(h.phases.download),
            pair(h.phases.upload),
            pair(h.phases.both)
        );
    }
    for p in &l.phases {
        let _ = writeln!(
            o,
            "{} load ({}): path adds {} ms; {} / {} Mbit/s down / up",
            p.load.name(),
            p.test,
            ms(p.added_latency_ms),
            ms(p.throughput_down_mbps),
            ms(p.throughput_up_mbps)
        );
    }
    if let Some(q) = &l.local {
        let max = q
            .samples
            .iter()
            .map(|s| s.backlog_packets)
            .max()
            .unwrap_or(0);
        let _ = writeln!(
            o,
            "this host's queue on {}: at most {max} packets (txqueuelen {})",
            q.interface,
            q.txqueuelen.map_or("?".into(), |t| t.to_string())
        );
    }
    let _ = writeln!(o, "\n{}", l.verdict.text);
    for c in &l.verdict.caveats {
        let _ = writeln!(o, "  note: {c}");
    }
    if l.partial {
        let _ = writeln!(
            o,
            "  note: the run ended early; the verdict uses the phases that finished"
        );
    }
    o
}
