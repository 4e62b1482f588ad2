//! Text for terminals: the lab's counters as `bloatlab lab stats` prints them.

use bloatlab_result::lab::{CakeStats, DirStats, LabStats, Sojourn};

fn ms(s: &Sojourn, q: f64) -> String {
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
        ms(&d.sojourn, 0.5),
        ms(&d.sojourn, 0.9),
        ms(&d.sojourn, 0.99),
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
            ms(&d.ring_sojourn, 0.5),
            ms(&d.ring_sojourn, 0.9),
            ms(&d.ring_sojourn, 0.99)
        );
    }
    if let Some(c) = &d.cake {
        out += &cake(c, dr.ack_filter);
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
