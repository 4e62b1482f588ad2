//! Text for terminals: a test's summary and events as `bloatlab test` prints them, and the
//! lab's counters as `bloatlab lab stats` prints them.

use bloatlab_result::lab::{CakeStats, DirStats, LabStats, Sojourn};
use bloatlab_result::{Event, Metadata, Percentiles, Summary};
use bloatlab_units::ms;
use std::fmt::Write as _;

fn sojourn_ms(s: &Sojourn, q: f64) -> String {
    s.quantile_us(q)
        .map_or("-".to_string(), |us| format!("{:.2}ms", us as f64 / 1000.0))
}

/// Every link direction: packets, drops by reason, the queue and its sojourn times, the TUN
/// device before the model, the ring below the qdisc and CAKE's tins where there are some.
pub fn lab_stats(stats: &LabStats) -> String {
    let mut out = String::new();
    for (name, link) in &stats.links {
        for (dir, d) in [("up", &link.up), ("down", &link.down)] {
            out += &direction(name, dir, d);
        }
    }
    out
}

fn direction(name: &str, dir: &str, d: &DirStats) -> String {
    let dr = &d.drops;
    // CAKE's filtered ACKs are drops too (tc counts them in "dropped").
    let ack = if dr.ack_filter > 0 {
        format!("ack filter {}, ", dr.ack_filter)
    } else {
        String::new()
    };
    let t = &d.tun;
    let mut out = format!(
        "{name} {dir:<4} {}\n  {} pkts in, {} out ({:.1} MB); drops: queue {}, aqm {}, \
        {ack}loss {}, mtu {}, tun {}; ecn marks {}\n  queue now {} pkts (max {}); sojourn \
        p50 {} p90 {} p99 {}\n  before the model, in the TUN device ({} pkts): waited \
        at most {} us (p99 {} us), {} pkts at once (p99 {})\n",
        d.config,
        d.rx_packets,
        d.tx_packets,
        d.tx_bytes as f64 / 1e6,
        dr.overflow,
        dr.aqm,
        dr.loss,
        dr.mtu,
        t.dropped.map_or("?".into(), |v| v.to_string()),
        d.ecn_marks,
        d.queue_packets,
        d.max_queue_packets,
        sojourn_ms(&d.sojourn, 0.5),
        sojourn_ms(&d.sojourn, 0.9),
        sojourn_ms(&d.sojourn, 0.99),
        t.txqueuelen,
        t.wait_us.max,
        t.wait_us.p99,
        t.waiting_packets.max,
        t.waiting_packets.p99,
    );
    if d.max_ring_packets > 0 {
        let bql = d
            .bql_limit_bytes
            .map_or(String::new(), |b| format!(", BQL limit {b} B"));
        out += &format!(
            "  below the qdisc, in the transmit ring: {} pkts now (max {}{bql}); waited p50 {} \
            p90 {} p99 {}\n",
            d.ring_packets,
            d.max_ring_packets,
            sojourn_ms(&d.ring_sojourn, 0.5),
            sojourn_ms(&d.ring_sojourn, 0.9),
            sojourn_ms(&d.ring_sojourn, 0.99)
        );
    }
    if let Some(c) = &d.cake {
        out += &cake(c, dr.ack_filter);
    }
    if let Some(why) = d.fell_behind() {
        out += &format!("  WARNING: {why}\n");
    }
    out
}

/// CAKE's tins as `tc -s qdisc show` lays them out: one column per tin.
pub fn cake(c: &CakeStats, ack_drops: u64) -> String {
    if c.tins.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "  cake: rate {:.2} Mbit/s, memory {} of {} B, ack drops {ack_drops}\n",
        c.rate_bps as f64 / 1e6,
        c.memory_used,
        c.memory_limit
    );
    out += &format!("  {:<12}", "");
    for t in &c.tins {
        out += &format!("{:>14}", t.name);
    }
    out += "\n";
    type Field = fn(&bloatlab_result::lab::TinStats) -> u64;
    let rows: [(&str, Field, f64); 12] = [
        ("thresh Mbit", |t| t.thresh_bps, 1e6),
        ("target ms", |t| t.target_us, 1e3),
        ("interval ms", |t| t.interval_us, 1e3),
        ("pk_delay ms", |t| t.pk_delay_us, 1e3),
        ("av_delay ms", |t| t.av_delay_us, 1e3),
        ("sp_delay ms", |t| t.sp_delay_us, 1e3),
        ("pkts", |t| t.packets, 1.0),
        ("drops", |t| t.drops, 1.0),
        ("marks", |t| t.marks, 1.0),
        ("ack_drop", |t| t.ack_drops, 1.0),
        ("sp_flows", |t| t.sparse_flows, 1.0),
        ("bk_flows", |t| t.bulk_flows, 1.0),
    ];
    for (label, field, scale) in rows {
        out += &format!("  {label:<12}");
        for t in &c.tins {
            let v = field(t) as f64 / scale;
            out += &if scale == 1.0 {
                format!("{v:>14.0}")
            } else {
                format!("{v:>14.2}")
            };
        }
        out += "\n";
    }
    out
}

/// The bloat direction in words: "the upload direction adds 290 ms".
fn bloat_words(s: &Summary) -> Option<String> {
    let p50 = |p: &Option<Percentiles>| p.map_or(0.0, |p| p.p50);
    let (up, down) = (p50(&s.added_owd_ms.up), p50(&s.added_owd_ms.down));
    Some(match s.bloat_direction.as_deref()? {
        "up" => format!("the upload direction adds {}", ms(up)),
        "down" => format!("the download direction adds {}", ms(down)),
        "both" => format!(
            "both directions add delay: upload {}, download {}",
            ms(up),
            ms(down)
        ),
        _ => "neither direction adds much delay".to_string(),
    })
}

fn pct_line(label: &str, p: &Option<Percentiles>) -> Option<String> {
    p.as_ref().map(|p| {
        format!(
            "  {label:<22} p50 {:>9}  p90 {:>9}  p99 {:>9}  ({} samples)",
            ms(p.p50),
            ms(p.p90),
            ms(p.p99),
            p.samples
        )
    })
}

/// More flows than this (an RPM test opens up to 32) are summed up in one line.
const MAX_FLOWS_LISTED: usize = 8;

/// The congestion control the flows sent with: the one asked for, or what their sending
/// sockets read where the test could read them. The hosts' sysctl default alone can mislead: a
/// route may set another (the lab's hosts send cubic on routes whose namespace default is bbr).
fn cc_words(meta: &Metadata) -> String {
    if let Some(cc) = &meta.cc {
        return cc.clone();
    }
    let sysctl = format!(
        "client {}, server {}",
        meta.client.default_cc, meta.server.default_cc
    );
    let mut read: Vec<&str> = meta.flows.iter().filter_map(|f| f.cc.as_deref()).collect();
    read.sort_unstable();
    read.dedup();
    if read.is_empty() {
        return format!("default ({sysctl})");
    }
    let all = meta.flows.iter().all(|f| f.cc.is_some());
    format!(
        "{}{} (not set by the test; sysctl default: {sysctl})",
        read.join(" and "),
        if all { "" } else { " where read" }
    )
}

/// A mark's fate in a table cell.
fn fate_word(f: &bloatlab_result::marks::Fate) -> String {
    use bloatlab_result::marks::Fate;
    match f {
        Fate::Kept => "kept".into(),
        Fate::Bleached => "bleached".into(),
        Fate::Remapped { to } => format!("> {to}"),
        Fate::Marked { ce } => format!("{ce} CE"),
        Fate::Mixed => "mixed".into(),
        Fate::Dropped => "dropped".into(),
        Fate::Unknown => "?".into(),
    }
}

/// `test marks`: each code point's DSCP and ECN fate both ways, then the verdicts.
fn marks_text(s: &Summary, m: &bloatlab_result::marks::MarksReport, meta: &Metadata) -> String {
    let mut out = format!(
        "marks to {} ({}){}\n",
        meta.server.name,
        meta.server.address.as_deref().unwrap_or("?"),
        if s.partial { "  [PARTIAL]" } else { "" }
    );
    let _ = writeln!(
        out,
        "{:<14} {:>7}  {:<10} {:<10}  {:<10} ECN",
        "sent", "back", "out: DSCP", "ECN", "in: DSCP"
    );
    for (u, d) in m.up.iter().zip(&m.down) {
        let _ = writeln!(
            out,
            "{:<14} {:>7}  {:<10} {:<10}  {:<10} {}",
            u.name,
            format!("{}/{}", d.arrived, u.probes),
            fate_word(&u.dscp),
            fate_word(&u.ecn),
            fate_word(&d.dscp),
            fate_word(&d.ecn)
        );
    }
    if !m.tcp_up.is_empty() {
        let syns: Vec<String> = m
            .tcp_up
            .iter()
            .map(|f| {
                format!(
                    "{} {}",
                    bloatlab_units::marks::dscp_name(f.sent >> 2),
                    fate_word(&f.dscp)
                )
            })
            .collect();
        let _ = writeln!(out, "TCP SYNs, out: DSCP   {}", syns.join(", "));
    }
    for v in &m.verdicts {
        let _ = writeln!(out, "- {}", v.text);
    }
    out
}

/// The human summary printed after a test.
pub fn summary_text(s: &Summary, meta: &Metadata) -> String {
    if let Some(w) = &s.writeback {
        return writeback_text(s, w, meta);
    }
    if let Some(m) = s.marks.as_ref().filter(|_| s.test == "marks") {
        return marks_text(s, m, meta);
    }
    if let (Some(mtu), Some(a)) = (s.path_mtu, &s.advice) {
        let mut out = format!(
            "mtu to {} ({}){}
",
            meta.server.name,
            meta.server.address.as_deref().unwrap_or("?"),
            if s.partial { "  [PARTIAL]" } else { "" }
        );
        let hole = if s.blackhole == Some(true) {
            "; larger packets vanish without an ICMP error (a black hole)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "Path MTU                {mtu} bytes (route MTU here {}){hole}",
            meta.mtu_route()
                .route_mtu
                .map_or("null".into(), |m| m.to_string())
        );
        for l in &a.lines {
            let _ = writeln!(out, "  {l}");
        }
        return out;
    }
    let mut out = String::new();
    // Tests without TCP flows (ping, voip) have no congestion control to name.
    let cc = if meta.flows.is_empty() && meta.cc.is_none() {
        String::new()
    } else {
        format!(", congestion control {}", cc_words(meta))
    };
    let _ = writeln!(
        out,
        "{} to {} ({}){cc}{}",
        s.test,
        meta.server.name,
        meta.server.address.as_deref().unwrap_or("?"),
        if s.partial { "  [PARTIAL]" } else { "" }
    );
    if let Some(why) = &s.load_missing {
        let _ = writeln!(
            out,
            "WARNING: the load never ran: {why}. Its probes saw an idle path: no loaded \
            figures, no grade"
        );
    }
    let t = &s.throughput_mbps;
    if t.down.is_some() || t.up.is_some() {
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let _ = writeln!(
            out,
            "Throughput (Mbit/s)     down {}  up {}  total {}",
            f(t.down),
            f(t.up),
            f(t.total)
        );
        let fair: Vec<String> = [("down", t.fairness_down), ("up", t.fairness_up)]
            .into_iter()
            .filter_map(|(d, j)| j.map(|j| format!("{d} {j:.3}")))
            .collect();
        if !fair.is_empty() {
            let _ = writeln!(out, "  fairness (Jain) {}", fair.join("  "));
        }
        if t.per_flow.len() <= MAX_FLOWS_LISTED {
            for fl in &t.per_flow {
                let _ = writeln!(out, "    {:<18} {:8.2}", fl.name, fl.mbps);
            }
        } else {
            let mut v: Vec<f64> = t.per_flow.iter().map(|f| f.mbps).collect();
            v.sort_by(f64::total_cmp);
            let _ = writeln!(
                out,
                "  {} flows, each: max {:.2}, median {:.2}, min {:.2} (every \
                flow in the result file)",
                v.len(),
                v[v.len() - 1],
                v[v.len() / 2],
                v[0]
            );
        }
    }
    let l = &s.latency_ms;
    let mut latency = String::new();
    for line in [
        pct_line("idle", &l.idle),
        pct_line("loaded", &l.loaded),
        pct_line("loaded one-way up", &l.loaded_owd.up),
        pct_line("loaded one-way down", &l.loaded_owd.down),
        pct_line(
            "idle one-way up",
            if l.loaded.is_none() {
                &l.idle_owd.up
            } else {
                &None
            },
        ),
        pct_line(
            "idle one-way down",
            if l.loaded.is_none() {
                &l.idle_owd.down
            } else {
                &None
            },
        ),
        pct_line("TCP connect", &l.tcp_connect),
    ]
    .into_iter()
    .flatten()
    {
        let _ = writeln!(latency, "{line}");
    }
    if l.per_stream.len() > 1 {
        for st in &l.per_stream {
            if let Some(line) = pct_line(&format!("loaded {}", st.name), &st.loaded) {
                let _ = writeln!(latency, "{line}");
            }
        }
    }
    // Without probes of its own (RPM over HTTP) there is nothing here, nor a reason to say
    // why one-way delays are missing.
    if !latency.is_empty() {
        out += "Latency (round trip)\n";
        out += &latency;
        if let Some(why) = &l.owd_unavailable {
            let _ = writeln!(out, "  one-way delays not shown: {why}");
        }
    }
    if let Some(o) = &meta.clock_offset {
        let drift = o
            .drift_ppm
            .map_or(String::new(), |d| format!(", drift {d:+.1} ppm"));
        // The offset itself is between two processes' own epochs (each side counts from its
        // start), so it means nothing to a reader; how well it is known does, said once.
        if l.owd_unavailable.is_none() {
            let _ = writeln!(
                out,
                "  server-client clock offset known to +/- {}{drift}",
                ms(o.uncertainty_ms)
            );
        } else if let Some(d) = o.drift_ppm {
            let _ = writeln!(out, "  server-client clock drift {d:+.1} ppm");
        }
    }
    let a = &s.added_owd_ms;
    if s.added_latency_ms.is_some() && (a.up.is_some() || a.down.is_some()) {
        let _ = writeln!(
            out,
            "Added one-way delay under load (above each direction's idle minimum)"
        );
        for line in [
            pct_line("upload direction", &a.up),
            pct_line("download direction", &a.down),
        ]
        .into_iter()
        .flatten()
        {
            let _ = writeln!(out, "{line}");
        }
        if let Some(verdict) = bloat_words(s) {
            let _ = writeln!(out, "  {verdict}");
        }
    }
    let j = &s.jitter_ms;
    if j.up.is_some() || j.down.is_some() {
        let f = |v: Option<f64>| v.map_or("-".into(), ms);
        let _ = writeln!(
            out,
            "Jitter (RFC 3550)       up {}  down {}",
            f(j.up),
            f(j.down)
        );
    }
    if let Some(u) = &s.udp {
        let _ = writeln!(out, "{}", udp_text(u, s.burst.as_ref(), meta));
    }
    let lo = &s.loss;
    let what = if s.udp.is_some() {
        "UDP load packets"
    } else {
        "probes"
    };
    // RPM over HTTP sends no probes of this kind: no line rather than "0% of 0".
    if lo.sent > 0 {
        let _ = write!(
            out,
            "Loss                    {:.2}% of {} {what}",
            lo.percent, lo.sent
        );
        if let (Some(u), Some(d)) = (lo.up_percent, lo.down_percent) {
            let _ = write!(out, " (up {u:.2}%, down {d:.2}%)");
        }
        if let (Some(i), Some(l)) = (lo.idle_percent, lo.load_percent) {
            let _ = write!(out, "; idle {i:.2}%, under load {l:.2}%");
        }
        if lo.server_limited > 0 {
            let _ = write!(
                out,
                "; {} declined by the server's rate limit, not counted",
                lo.server_limited
            );
        }
        out.push('\n');
    }
    if let Some(r) = s.tcp_retransmits {
        let _ = writeln!(out, "TCP retransmits (up)    {r}");
    }
    if let Some(v) = &s.voip {
        let _ = writeln!(
            out,
            "VoIP (G.107 E-model)    MOS {:.2}  (up {:.2}, R {:.1}; down {:.2}, R {:.1}; \
                mouth-to-ear {} / {}, {}; loss {:.2}% / {:.2}% with late packets, BurstR {:.2} / \
                {:.2})",
            v.mos,
            v.mos_up,
            v.r_up,
            v.mos_down,
            v.r_down,
            ms(v.mouth_to_ear_up_ms),
            ms(v.mouth_to_ear_down_ms),
            v.delay_basis,
            v.loss_up_percent,
            v.loss_down_percent,
            v.burst_r_up,
            v.burst_r_down
        );
    }
    if let Some(r) = &s.rpm {
        let idle = r.idle.map_or(String::new(), |i| format!(", idle {i:.0}"));
        // HTTP/1.1 carries no self probes: the RPM is the foreign term alone.
        let loaded = |l: Option<f64>| {
            l.map_or("none (HTTP/1.1: foreign probes only)".to_string(), |l| {
                format!("{l:.0}")
            })
        };
        let _ = writeln!(
            out,
            "Responsiveness          {:.0} RPM ({}, confidence {})  foreign {:.0}, loaded \
                {}{idle}; {} load connections, {} probes over the last {:.0} s, {} timed out",
            r.rpm,
            r.band,
            r.confidence,
            r.foreign,
            loaded(r.loaded),
            r.load_connections,
            r.probes,
            r.window_s,
            r.probe_timeouts
        );
        if r.failed_connections > 0 {
            let _ = writeln!(
                out,
                "  WARNING: {} load connections failed (see the notes): the load \
                was weaker than the draft asks, so this RPM reads too high",
                r.failed_connections
            );
        }
        // Sequential: the line above is the worse direction; each one's own figures follow.
        let by_dir = s.rpm_by_direction.as_ref();
        for (name, d) in [
            ("download", by_dir.and_then(|d| d.down.as_ref())),
            ("upload", by_dir.and_then(|d| d.up.as_ref())),
        ] {
            if let Some(d) = d {
                let _ = writeln!(
                    out,
                    "  under {name:<8} load   {:.0} RPM ({}, confidence {})  foreign {:.0}, loaded \
                        {}; {} connections",
                    d.rpm,
                    d.band,
                    d.confidence,
                    d.foreign,
                    loaded(d.loaded),
                    d.load_connections
                );
            }
        }
        // The draft's curve: RPM as each connection per direction was added.
        let runs = match &meta.rpm_by_direction {
            Some(d) => vec![("download", &d.down), ("upload", &d.up)],
            None => meta.rpm.iter().map(|r| ("both ways", r)).collect(),
        };
        for (name, run) in runs {
            let curve = bloatlab_analyze::rpm::by_connections(run);
            if curve.len() > 1 {
                let points: Vec<String> =
                    curve.iter().map(|(n, r)| format!("{n}: {r:.0}")).collect();
                let _ = writeln!(
                    out,
                    "  RPM by load connections per direction, {name}: {}",
                    points.join(", ")
                );
            }
        }
    }
    if let (Some(a), Some(g)) = (s.added_latency_ms, &s.grade) {
        let c = &s.added_latency_ms_by_class;
        let classes: Vec<String> = [
            ("best effort", c.be),
            ("voice (EF)", c.ef),
            ("bulk (CS1)", c.bk),
        ]
        .iter()
        .filter_map(|(n, v)| v.map(|v| format!("{n} {}", ms(v))))
        .collect();
        let by_class = if classes.len() > 1 {
            format!("  ({})", classes.join(", "))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "Added latency under load {}  grade {g}{by_class}",
            ms(a)
        );
        if let Some(c) = &s.grade_loss_cap {
            let _ = writeln!(out, "  {}", loss_cap_text(c));
        }
    }
    // The probes' marks each way, when something changed them (or all crossed: one line).
    if let Some(m) = &s.marks {
        for v in &m.verdicts {
            let _ = writeln!(out, "Marks                   {}", v.text);
        }
    }
    out
}

/// Why a grade is lower than its latency's: the loss under load that capped it.
pub fn loss_cap_text(c: &bloatlab_result::LossCap) -> String {
    format!(
        "{:.1}% of the probes were lost under load: at most {} (the latency alone gives {}); a \
            queue too short to delay drops instead, and calls and games feel the loss",
        c.loss_percent, c.at_most, c.latency_grade
    )
}

/// A writeback test's summary: when the kernel began writing, what writes and the fsync cost,
/// and what a small synced write waited meanwhile.
fn writeback_text(s: &Summary, w: &bloatlab_result::WritebackStart, meta: &Metadata) -> String {
    let mut out = String::new();
    let vm = meta.writeback_machine().vm;
    let _ = writeln!(
        out,
        "writeback to {} ({}){}",
        meta.server.name,
        meta.server.software,
        if s.partial { "  [PARTIAL]" } else { "" }
    );
    let setting = |bytes: Option<u64>, ratio: Option<u64>| match bytes {
        Some(b) if b > 0 => format!("{} MB", b / 1_000_000),
        _ => format!(
            "{}% of available memory",
            ratio.map_or("?".into(), |r| r.to_string())
        ),
    };
    let _ = writeln!(
        out,
        "Thresholds              background {}, foreground {}; expiry {} s",
        setting(vm.dirty_background_bytes, vm.dirty_background_ratio),
        setting(vm.dirty_bytes, vm.dirty_ratio),
        vm.dirty_expire_centisecs
            .map_or("?".into(), |c| format!("{}", c as f64 / 100.0))
    );
    let mb = w.bytes as f64 / 1e6;
    match (w.started_after_bytes, w.started_after_ms) {
        (Some(b), Some(t)) => {
            let _ = writeln!(
                out,
                "Writeback started       after {:.1} MB of {mb:.1} MB written, \
                {:.0} ms after the first write",
                b as f64 / 1e6,
                t
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "Writeback started       not before the closing fsync: all \
                {mb:.1} MB sat in the page cache until forced"
            );
        }
    }
    let _ = writeln!(
        out,
        "Page cache peak         {:.1} MB dirty, {:.1} MB under writeback",
        w.dirty_peak_mb, w.writeback_peak_mb
    );
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
    let _ = writeln!(
        out,
        "Rate                    to the cache {} Mbit/s ({} MB/s), to stable storage {} Mbit/s ({} \
            MB/s)",
        f(s.cache_mbps),
        f(s.cache_mbps.map(|m| m / 8.0)),
        f(s.stable_mbps),
        f(s.stable_mbps.map(|m| m / 8.0))
    );
    if let Some(fs) = s.fsync_ms {
        let _ = writeln!(out, "Closing fsync           {}", ms(fs));
    }
    for line in [
        pct_line("write() calls", &s.write_stall_ms),
        pct_line("small sync, idle", &w.small_sync_idle_ms),
        pct_line("small sync, loaded", &s.small_sync_ms),
    ]
    .into_iter()
    .flatten()
    {
        let _ = writeln!(out, "{line}");
    }
    if let Some(d) = &w.disturbed {
        let _ = writeln!(out, "  note: {d}");
    }
    out
}

/// The UDP load's lines: what was sent and received, and how bursty at each end.
fn udp_text(
    u: &bloatlab_result::UdpLoad,
    burst: Option<&bloatlab_result::Burst>,
    meta: &Metadata,
) -> String {
    let info = meta.udp.as_ref();
    let asked = info.map_or(String::new(), |i| {
        format!("{:.2} Mbit/s of {} B packets asked, ", i.rate_mbps, i.size)
    });
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    let mut out = format!(
        "UDP load                {asked}{:.2} Mbit/s sent ({} pacing): {} sent, {} received, {} \
            reordered, {} duplicated",
        u.send_mbps,
        u.pacing,
        u.sent,
        opt(u.received),
        opt(u.reordered),
        opt(u.duplicates)
    );
    if let (Some(ce), Some(received)) = (u.ce, u.received) {
        let _ = write!(
            out,
            "\n  sent {}: {ce} of the {received} received arrived CE ({:.1}%), marked by a queue \
             instead of dropped",
            info.map_or("ECN-capable", |i| bloatlab_units::marks::ecn_name(i.ecn)),
            100.0 * ce as f64 / received.max(1) as f64
        );
    }
    let mut host = Vec::new();
    if u.send_errors > 0 {
        host.push(format!(
            "{} sends refused by this host's kernel (retried)",
            u.send_errors
        ));
    }
    if u.skipped > 0 {
        host.push(format!(
            "{} packets skipped after the sender stalled",
            u.skipped
        ));
    }
    if let Some(d) = u.server_socket_drops.filter(|&d| d > 0) {
        host.push(format!("{d} dropped by the server's full socket buffer"));
    }
    if let Some(l) = u.server_limited.filter(|&l| l > 0) {
        host.push(format!(
            "{l} beyond the announced rate, declined by the server"
        ));
    }
    if !host.is_empty() {
        let _ = write!(out, "\n  not the network's doing: {}", host.join("; "));
    }
    if let Some(b) = burst {
        let f = |p: Option<bloatlab_result::BurstProfile>| {
            p.map_or("-".to_string(), |p| {
                format!("peak {:.1}x, p99 {:.1}x", p.peak_over_mean, p.p99_over_mean)
            })
        };
        let bucket = b.send.or(b.recv).map_or(0.0, |p| p.bucket_ms);
        let head = format!("Burst profile ({bucket} ms)");
        let _ = write!(
            out,
            "\n{head:<24}sender {}; receiver {} (of the mean rate; 1 is smooth)",
            f(b.send),
            f(b.recv)
        );
    }
    out
}

/// `bloatlab history`: the scheduled tests, the worst hours, and idle against busy latency per
/// hour (the scheduled tests' own minutes left out).
pub fn history_text(h: &bloatlab_result::history::History) -> String {
    use bloatlab_result::history::{HourRow, LoadBand};
    let when = |t: i64| {
        let st = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.max(0) as u64);
        let s = humantime::format_rfc3339_seconds(st).to_string();
        s[..16].replace('T', " ")
    };
    let opt_ms = |v: Option<f64>| v.map_or("-".to_string(), ms);
    let mut out = String::new();
    // Per UTC day: how many ran and were skipped, the grades, the largest added latency.
    let mut days: std::collections::BTreeMap<i64, Vec<&bloatlab_result::history::TestRow>> =
        Default::default();
    for t in &h.tests {
        days.entry(t.started.div_euclid(86_400))
            .or_default()
            .push(t);
    }
    if days.len() > 1 {
        let _ = writeln!(out, "Grades per day:");
        for (day, tests) in &days {
            let run: Vec<_> = tests.iter().filter(|t| t.skipped.is_none()).collect();
            let grades: String = ["A+", "A", "B", "C", "D", "F"]
                .iter()
                .filter_map(|g| {
                    let n = run.iter().filter(|t| t.grade.as_deref() == Some(g)).count();
                    (n > 0).then(|| format!(" {g}×{n}"))
                })
                .collect();
            let worst = run
                .iter()
                .filter_map(|t| t.added_ms)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            let _ = writeln!(
                out,
                "  {}  {:>3} run, {} skipped:{grades}; worst added {}",
                &when(day * 86_400)[..10],
                run.len(),
                tests.len() - run.len(),
                opt_ms(worst)
            );
        }
    }
    const LAST: usize = 24;
    let shown = &h.tests[h.tests.len().saturating_sub(LAST)..];
    if shown.len() < h.tests.len() {
        let _ = writeln!(
            out,
            "The last {LAST} of {} scheduled tests (all: --json or report --db):",
            h.tests.len()
        );
    } else {
        let _ = writeln!(out, "Scheduled tests ({}):", h.tests.len());
    }
    for t in shown {
        match &t.skipped {
            Some(why) => {
                let _ = writeln!(out, "  {}  {}  skipped: {why}", when(t.started), t.test);
            }
            None => {
                let mbps = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
                let _ = writeln!(
                    out,
                    "  {}  {} {:>4.0} s  grade {:<2}  added {:>9}  {:>7} / {:<7} Mbit/s",
                    when(t.started),
                    t.test,
                    t.length_s,
                    t.grade.as_deref().unwrap_or("-"),
                    opt_ms(t.added_ms),
                    mbps(t.down_mbps),
                    mbps(t.up_mbps),
                );
            }
        }
    }
    if !h.gaps.is_empty() {
        let _ = writeln!(out, "Target silent:");
        for g in &h.gaps {
            let end = g.ended.map_or("now".to_string(), when);
            let _ = writeln!(out, "  {} .. {}  {}", when(g.started), end, g.why);
        }
    }
    if !h.worst_hours.is_empty() {
        let _ = writeln!(
            out,
            "Worst hours (round trip p90 while the line was in use):"
        );
        for w in &h.worst_hours {
            let q = w.rtt_ms.unwrap_or_default();
            let _ = writeln!(
                out,
                "  {}  {:<5}  p50 {:>9}  p90 {:>9}  loss {:.1}%",
                when(w.hour),
                w.load.name(),
                ms(q.p50),
                ms(q.p90),
                w.lost as f64 * 100.0 / w.sent.max(1) as f64
            );
        }
    }
    // One day or less: each hour; more: each hour of the day over all of them.
    let of_day = h.until - h.since > 86_400 + 3600;
    let (rows, what): (&[HourRow], &str) = if of_day {
        (
            &h.hours_of_day,
            "per hour of the day (UTC), over the whole window",
        )
    } else {
        (&h.hours, "per hour")
    };
    let label = |t: i64| {
        if of_day {
            format!("{t:02}:00-{:02}:00", t + 1)
        } else {
            when(t)
        }
    };
    let _ = writeln!(out, "Round trip p50 / p90 {what}, by the line's load:");
    let _ = writeln!(
        out,
        "  {:<16}  {:>21}  {:>21}  {:>21}",
        "hour", "idle", "light", "busy"
    );
    let mut keys: Vec<i64> = rows.iter().map(|r| r.hour).collect();
    keys.dedup();
    for key in keys {
        let cell = |band: LoadBand| {
            rows.iter()
                .find(|r| r.hour == key && r.load == band)
                .and_then(|r| r.rtt_ms)
                .map_or("-".to_string(), |q| {
                    format!("{} / {}", ms(q.p50), ms(q.p90))
                })
        };
        let unknown = cell(LoadBand::Unknown);
        let _ = write!(
            out,
            "  {:<16}  {:>21}  {:>21}  {:>21}",
            label(key),
            cell(LoadBand::Idle),
            cell(LoadBand::Light),
            cell(LoadBand::Busy)
        );
        if unknown != "-" {
            let _ = write!(out, "  (untagged {unknown})");
        }
        out.push('\n');
    }
    // CAKE over the whole window, per interface and tin.
    let mut tins: Vec<(String, String, u64, u64, u64, u64)> = Vec::new();
    for r in &h.shaper {
        match tins.iter_mut().find(|t| t.0 == r.iface && t.1 == r.tin) {
            Some(t) => {
                t.2 += r.packets;
                t.3 += r.drops;
                t.4 += r.marks;
                t.5 = t.5.max(r.pk_delay_us);
            }
            None => tins.push((
                r.iface.clone(),
                r.tin.clone(),
                r.packets,
                r.drops,
                r.marks,
                r.pk_delay_us,
            )),
        }
    }
    if !tins.is_empty() {
        let _ = writeln!(
            out,
            "CAKE over the window (peak delay: the largest tc showed):"
        );
        for (iface, tin, packets, drops, marks, peak) in tins {
            let _ = writeln!(
                out,
                "  {iface:<8} {tin:<11}  {packets:>10} pkts  {drops:>7} drops ({:.2}%)  \
                 {marks:>7} marks  peak {}",
                drops as f64 * 100.0 / (packets + drops).max(1) as f64,
                ms(peak as f64 / 1e3)
            );
        }
    }
    out
}

/// The run's events (failed flows, refused DSCP marks, interruptions), one line each, so that
/// nothing that makes the numbers less than they seem goes unsaid.
pub fn events_text(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        let _ = writeln!(out, "note at {:.1} s: {}", e.t, e.what);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::lab::{Drops, LinkStats};

    #[test]
    fn cake_stats_print_one_column_per_tin_in_tcs_order() {
        use bloatlab_lab_model::cake::{Cake, CakeParams};
        let c = Cake::new(
            CakeParams::parse("bandwidth 20mbit diffserv3").unwrap(),
            1500,
            1,
        );
        let text = cake(&c.stats(), 0);
        let header: Vec<&str> = text
            .lines()
            .nth(1)
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        assert_eq!(header, ["Bulk", "Best Effort", "Voice"], "{text}");
        let thresh = text
            .lines()
            .find(|l| l.trim_start().starts_with("thresh"))
            .unwrap();
        assert_eq!(
            thresh.split_whitespace().skip(2).collect::<Vec<_>>(),
            ["1.25", "20.00", "5.00"],
            "{text}"
        );
    }

    #[test]
    fn a_links_drops_line_counts_filtered_acks_only_where_there_are_some() {
        let link = |ack: u64| {
            let up = DirStats {
                drops: Drops {
                    overflow: 1,
                    aqm: 2,
                    ack_filter: ack,
                    loss: 0,
                    mtu: 0,
                },
                ..Default::default()
            };
            LabStats {
                links: [(
                    "wan".to_string(),
                    LinkStats {
                        up,
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            }
        };
        let drops = |ack: u64| lab_stats(&link(ack)).lines().nth(1).unwrap().to_string();
        assert!(
            drops(7486).contains("drops: queue 1, aqm 2, ack filter 7486, loss 0"),
            "{}",
            drops(7486)
        );
        assert!(
            drops(0).contains("drops: queue 1, aqm 2, loss 0"),
            "{}",
            drops(0)
        );
    }
}

#[cfg(test)]
mod summary_tests {
    use super::*;
    use bloatlab_result::{FlowInfo, Host};

    #[test]
    fn an_rpm_run_prints_its_curve_by_load_connections() {
        let s = Summary {
            test: "rpm".into(),
            rpm: Some(bloatlab_result::Rpm {
                rpm: 463.0,
                band: "poor".into(),
                load_connections: 24,
                ..Default::default()
            }),
            ..Default::default()
        };
        let interval = |n: u32, r: f64| bloatlab_result::RpmInterval {
            load_connections: Some(n),
            responsiveness: Some(r),
            ..Default::default()
        };
        let meta = Metadata {
            rpm: Some(bloatlab_result::RpmRun {
                intervals: vec![
                    interval(2, 1548.0),
                    interval(3, 1596.0),
                    interval(12, 463.0),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = summary_text(&s, &meta);
        assert!(
            text.contains(
                "RPM by load connections per direction, both ways: 2: 1548, 3: 1596, 12: 463"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_grade_lowered_by_loss_under_load_is_explained_beneath_it() {
        let s = crate::fixtures::capped_by_loss();
        let text = summary_text(&s, &Metadata::default());
        let grade = text.find("grade D").expect(&text);
        let why = text
            .find("23.0% of the probes were lost under load: at most D (the latency alone gives A)")
            .expect(&text);
        assert!(why > grade, "{text}");
    }

    #[test]
    fn the_congestion_control_named_is_what_the_sockets_read_before_the_sysctl() {
        let flow = |cc: Option<&str>| FlowInfo {
            name: "f".into(),
            cc: cc.map(Into::into),
            ..Default::default()
        };
        let meta = |flows: Vec<FlowInfo>, cc: Option<&str>| Metadata {
            client: Host {
                default_cc: "bbr".into(),
                ..Default::default()
            },
            server: Host {
                default_cc: "unknown".into(),
                ..Default::default()
            },
            flows,
            cc: cc.map(Into::into),
            ..Default::default()
        };
        assert_eq!(
            cc_words(&meta(vec![flow(Some("cubic")), flow(Some("cubic"))], None)),
            "cubic (not set by the test; sysctl default: client bbr, server unknown)"
        );
        assert_eq!(
            cc_words(&meta(vec![flow(Some("cubic")), flow(None)], None)),
            "cubic where read (not set by the test; sysctl default: client bbr, server unknown)"
        );
        assert_eq!(
            cc_words(&meta(vec![flow(Some("reno")), flow(Some("cubic"))], None)),
            "cubic and reno (not set by the test; sysctl default: client bbr, server unknown)"
        );
        assert_eq!(
            cc_words(&meta(vec![flow(None)], None)),
            "default (client bbr, server unknown)"
        );
        assert_eq!(
            cc_words(&meta(vec![flow(Some("cubic"))], Some("bbr"))),
            "bbr"
        );
    }

    #[test]
    fn fairness_is_labelled_for_an_upload_alone_and_a_test_without_tcp_names_no_congestion_control()
    {
        let mut s = Summary {
            test: "tcp-up".into(),
            ..Default::default()
        };
        s.throughput_mbps.up = Some(3.7);
        s.throughput_mbps.fairness_up = Some(0.959);
        let meta = Metadata {
            flows: vec![FlowInfo {
                name: "tcp up 1 BE".into(),
                cc: Some("cubic".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        let text = summary_text(&s, &meta);
        assert!(text.contains("\n  fairness (Jain) up 0.959\n"), "{text}");
        assert!(
            text.lines()
                .next()
                .unwrap()
                .contains("congestion control cubic"),
            "{text}"
        );
        let voip = summary_text(
            &Summary {
                test: "voip".into(),
                ..Default::default()
            },
            &Metadata::default(),
        );
        assert!(
            !voip.lines().next().unwrap().contains("congestion"),
            "{voip}"
        );
    }

    /// RPM over HTTP: 16 load connections and no probes of the bloatlab protocol's kind.
    #[test]
    fn many_flows_are_summed_up_and_absent_probes_leave_no_empty_sections() {
        use bloatlab_result::FlowThroughput;
        let mut s = Summary {
            test: "rpm".into(),
            ..Default::default()
        };
        s.throughput_mbps.down = Some(4.0);
        s.throughput_mbps.per_flow = (0..16)
            .map(|i| FlowThroughput {
                name: format!("down-{i}"),
                direction: "down".into(),
                dscp: 0,
                mbps: i as f64 / 4.0,
            })
            .collect();
        s.latency_ms.owd_unavailable = Some("no clock offset estimate".into());
        let text = summary_text(&s, &Metadata::default());
        assert!(
            text.contains("16 flows, each: max 3.75, median 2.00, min 0.00"),
            "{text}"
        );
        assert!(!text.contains("down-3"), "{text}");
        assert!(
            !text.contains("Latency") && !text.contains("one-way") && !text.contains("Loss"),
            "{text}"
        );
    }
}
