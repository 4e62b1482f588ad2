//! CAKE's statistics as `tc -s -j qdisc show dev DEV` gives them (iproute2's JSON from the
//! kernel's TCA_CAKE_STATS), and their growth per minute. Pure: the shell runs tc.

use bloatlab_result::history::ShaperRow;
use bloatlab_result::lab::{CakeStats, TinStats};
use serde_json::Value;

/// The CAKE qdiscs in tc's JSON (usually one: the root), in order.
pub fn parse_tc_json(text: &str) -> Result<Vec<CakeStats>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("tc's JSON: {e}"))?;
    let qdiscs = v.as_array().ok_or("tc's JSON: not a list of qdiscs")?;
    Ok(qdiscs
        .iter()
        .filter(|q| q["kind"] == "cake")
        .map(parse_one)
        .collect())
}

fn parse_one(q: &Value) -> CakeStats {
    let u = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let o = &q["options"];
    let tins: Vec<&Value> = q["tins"]
        .as_array()
        .map(|t| t.iter().collect())
        .unwrap_or_default();
    // iproute2's q_cake.c names three and four tins (diffserv3, diffserv4) and numbers the
    // rest; the kernel lists them lowest priority first.
    let names: Vec<String> = match tins.len() {
        3 => ["Bulk", "Best Effort", "Voice"].map(String::from).to_vec(),
        4 => ["Bulk", "Best Effort", "Video", "Voice"]
            .map(String::from)
            .to_vec(),
        n => (0..n).map(|i| format!("Tin {i}")).collect(),
    };
    let settings = ["diffserv", "flowmode"]
        .iter()
        .filter_map(|k| o[*k].as_str())
        .collect::<Vec<_>>()
        .join(" ");
    CakeStats {
        settings,
        // tc gives rates in bytes per second.
        rate_bps: u(o, "bandwidth") * 8,
        capacity_estimate_bps: u(q, "capacity_estimate") * 8,
        memory_limit: u(q, "memory_limit"),
        memory_used: u(q, "memory_used"),
        overlimits: u(q, "overlimits"),
        tins: tins
            .iter()
            .zip(names)
            .map(|(t, name)| TinStats {
                name,
                thresh_bps: u(t, "threshold_rate") * 8,
                target_us: u(t, "target_us"),
                interval_us: u(t, "interval_us"),
                pk_delay_us: u(t, "peak_delay_us"),
                av_delay_us: u(t, "avg_delay_us"),
                sp_delay_us: u(t, "base_delay_us"),
                backlog_bytes: u(t, "backlog_bytes"),
                packets: u(t, "sent_packets"),
                bytes: u(t, "sent_bytes"),
                way_inds: u(t, "way_indirect_hits"),
                way_miss: u(t, "way_misses"),
                way_cols: u(t, "way_collisions"),
                drops: u(t, "drops"),
                marks: u(t, "ecn_mark"),
                ack_drops: u(t, "ack_drops"),
                overlimit_drops: 0,
                sparse_flows: u(t, "sparse_flows"),
                bulk_flows: u(t, "bulk_flows"),
                unresponsive_flows: u(t, "unresponsive_flows"),
                max_len: u(t, "max_pkt_len"),
                quantum: u(t, "flow_quantum"),
            })
            .collect(),
    }
}

/// The rows of one minute: each tin's counters' growth since `before`. `None` when the two are
/// not the same CAKE (other tins, or a counter went back: it was replaced in between).
pub fn minute_rows(
    minute: i64,
    iface: &str,
    before: &CakeStats,
    now: &CakeStats,
) -> Option<Vec<ShaperRow>> {
    if before.tins.len() != now.tins.len() {
        return None;
    }
    before
        .tins
        .iter()
        .zip(&now.tins)
        .map(|(b, n)| {
            Some(ShaperRow {
                minute,
                iface: iface.into(),
                tin: n.name.clone(),
                rate_bps: now.rate_bps,
                packets: n.packets.checked_sub(b.packets)?,
                bytes: n.bytes.checked_sub(b.bytes)?,
                drops: n.drops.checked_sub(b.drops)?,
                marks: n.marks.checked_sub(b.marks)?,
                ack_drops: n.ack_drops.checked_sub(b.ack_drops)?,
                backlog_bytes: n.backlog_bytes,
                pk_delay_us: n.pk_delay_us,
                av_delay_us: n.av_delay_us,
                sp_delay_us: n.sp_delay_us,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux 6.1's CAKE (Debian's kernel under qemu) after a 3 s rrul through 50 Mbit/s,
    /// diffserv4, on lo: `tc -s -j qdisc show dev lo`.
    const DIFFSERV4: &str = include_str!("fixtures/tc-cake-diffserv4.json");

    #[test]
    fn the_kernels_json_reads_as_tc_prints_it() {
        let c = parse_tc_json(DIFFSERV4).unwrap();
        assert_eq!(c.len(), 1);
        let c = &c[0];
        assert_eq!(c.settings, "diffserv4 triple-isolate");
        assert_eq!(c.rate_bps, 50_000_000);
        let names: Vec<&str> = c.tins.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Bulk", "Best Effort", "Video", "Voice"]);
        // The text form of the same reading: thresh 3125Kbit / 50Mbit, pk_delay 11.5ms,
        // pkts 1748, drops 25 in Best Effort.
        let be = &c.tins[1];
        assert_eq!(
            (be.thresh_bps, be.pk_delay_us, be.packets, be.drops),
            (50_000_000, 11538, 1748, 25)
        );
        assert_eq!(c.tins[0].thresh_bps, 3_125_000);
        // The tins' drops add up to the qdisc's.
        assert_eq!(c.tins.iter().map(|t| t.drops).sum::<u64>(), 46);
        assert!(parse_tc_json("[{\"kind\":\"fq_codel\"}]")
            .unwrap()
            .is_empty());
        assert!(parse_tc_json("not json").is_err());
    }

    #[test]
    fn a_minute_is_the_counters_growth_and_a_replaced_cake_gives_none() {
        let before = parse_tc_json(DIFFSERV4).unwrap().remove(0);
        let mut now = before.clone();
        now.tins[1].packets += 500;
        now.tins[1].drops += 7;
        now.tins[3].marks += 2;
        now.tins[1].pk_delay_us = 40_000;
        let rows = minute_rows(60, "wan", &before, &now).unwrap();
        assert_eq!(rows.len(), 4);
        assert_eq!(
            (rows[1].packets, rows[1].drops, rows[1].pk_delay_us),
            (500, 7, 40_000)
        );
        assert_eq!((rows[3].tin.as_str(), rows[3].marks), ("Voice", 2));
        assert_eq!(rows[0].packets, 0);
        let mut replaced = before.clone();
        replaced.tins[1].packets = 3;
        assert_eq!(minute_rows(60, "wan", &before, &replaced), None);
        replaced.tins.pop();
        assert_eq!(minute_rows(60, "wan", &before, &replaced), None);
    }
}
