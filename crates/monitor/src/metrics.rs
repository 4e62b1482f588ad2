//! The monitor's Prometheus metrics (names and units per Prometheus' naming rules; `site` as a
//! label on every series when given).

use bloatlab_measure::watch::Sample;
use bloatlab_result::history::{grade_number, LoadBand, ShaperRow, TestRow};
use bloatlab_server::metrics::{FGauge, UCounter};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::borrow::Cow;

type Labels = Vec<(&'static str, String)>;

pub struct Metrics {
    registry: Registry,
    target: String,
    rtt: Family<Labels, Histogram, fn() -> Histogram>,
    sent: Family<Labels, UCounter>,
    lost: Family<Labels, UCounter>,
    added: Family<Labels, FGauge>,
    goodput: Family<Labels, FGauge>,
    grade: Family<Labels, FGauge>,
    tests: Family<Labels, UCounter>,
    skipped: Family<Labels, UCounter>,
    up: Family<Labels, FGauge>,
    cake_rate: Family<Labels, FGauge>,
    cake_counters: [Family<Labels, UCounter>; 4],
    cake_gauges: [Family<Labels, FGauge>; 4],
}

/// Round trips from 0.5 ms to 16 s, doubling (smokeping_prober's are 50 µs to 26 s).
fn rtt_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    pub fn new(target: &str, site: Option<&str>) -> Metrics {
        let consts: Vec<(Cow<'static, str>, Cow<'static, str>)> = site
            .map(|s| (Cow::Borrowed("site"), Cow::Owned(s.to_string())))
            .into_iter()
            .collect();
        let mut registry = Registry::with_prefix_and_labels("bloatlab", consts.into_iter());
        let m = Metrics {
            registry: Registry::default(),
            target: target.into(),
            rtt: Family::new_with_constructor(rtt_histogram as fn() -> Histogram),
            sent: Family::default(),
            lost: Family::default(),
            added: Family::default(),
            goodput: Family::default(),
            grade: Family::default(),
            tests: Family::default(),
            skipped: Family::default(),
            up: Family::default(),
            cake_rate: Family::default(),
            cake_counters: Default::default(),
            cake_gauges: Default::default(),
        };
        registry.register_with_unit(
            "probe_rtt",
            "Round trips of the light UDP probes, by the load on the watched interface (test: a \
             scheduled test of this monitor ran)",
            Unit::Seconds,
            m.rtt.clone(),
        );
        registry.register("probes_sent", "Light probes sent", m.sent.clone());
        registry.register(
            "probes_lost",
            "Light probes with no answer within 4 s",
            m.lost.clone(),
        );
        registry.register_with_unit(
            "test_added_latency",
            "Latency the last scheduled test's load added: round trip (both) and one way",
            Unit::Seconds,
            m.added.clone(),
        );
        // Registered without the unit helper: OpenMetrics units are single words.
        registry.register(
            "test_goodput_bits_per_second",
            "Goodput of the last scheduled test per direction",
            m.goodput.clone(),
        );
        registry.register(
            "test_grade",
            "Grade of the last scheduled test, A+ = 6 down to F = 0",
            m.grade.clone(),
        );
        registry.register("tests", "Scheduled tests run", m.tests.clone());
        registry.register(
            "tests_skipped",
            "Scheduled tests skipped (data budget, target unreachable)",
            m.skipped.clone(),
        );
        registry.register(
            "target_up",
            "1 while the target answers the light probes' handshake, else 0",
            m.up.clone(),
        );
        registry.register(
            "cake_rate_bits_per_second",
            "The CAKE shaper's rate on the watched interface (ifb4IFACE: its download)",
            m.cake_rate.clone(),
        );
        for (name, help, f) in [
            ("cake_tin_sent_packets", "Packets CAKE sent, per tin", 0),
            ("cake_tin_drops", "Packets CAKE dropped, per tin", 1),
            (
                "cake_tin_ecn_marks",
                "Packets CAKE marked CE instead of dropping",
                2,
            ),
            ("cake_tin_ack_drops", "ACKs CAKE's ACK filter dropped", 3),
        ] {
            registry.register(name, help, m.cake_counters[f].clone());
        }
        for (name, help, f, unit) in [
            (
                "cake_tin_peak_delay",
                "CAKE's peak delay (tc pk_delay)",
                0,
                Unit::Seconds,
            ),
            (
                "cake_tin_avg_delay",
                "CAKE's average delay (tc av_delay)",
                1,
                Unit::Seconds,
            ),
            (
                "cake_tin_base_delay",
                "CAKE's sparse delay (tc sp_delay)",
                2,
                Unit::Seconds,
            ),
            (
                "cake_tin_backlog",
                "Bytes queued in the tin",
                3,
                Unit::Bytes,
            ),
        ] {
            registry.register_with_unit(name, help, unit, m.cake_gauges[f].clone());
        }
        // Counters exist from the start at 0, so rates and ratios over them have a series
        // before the first probe is lost or test skipped.
        let l = m.labels(&[]);
        for f in [&m.sent, &m.lost, &m.tests, &m.skipped] {
            let _ = f.get_or_create(&l);
        }
        Metrics { registry, ..m }
    }

    /// CAKE's growth since its last reading (counters) and its state now (gauges).
    pub fn shaper(&self, rows: &[ShaperRow]) {
        for r in rows {
            let iface = [("iface", r.iface.as_str())];
            self.cake_rate
                .get_or_create(&self.labels(&iface))
                .set(r.rate_bps as f64);
            let l = self.labels(&[("iface", r.iface.as_str()), ("tin", r.tin.as_str())]);
            for (f, v) in self
                .cake_counters
                .iter()
                .zip([r.packets, r.drops, r.marks, r.ack_drops])
            {
                f.get_or_create(&l).inc_by(v);
            }
            for (f, v) in self.cake_gauges.iter().zip([
                r.pk_delay_us as f64 / 1e6,
                r.av_delay_us as f64 / 1e6,
                r.sp_delay_us as f64 / 1e6,
                r.backlog_bytes as f64,
            ]) {
                f.get_or_create(&l).set(v);
            }
        }
    }

    fn labels(&self, more: &[(&'static str, &str)]) -> Labels {
        let mut l = vec![("target", self.target.clone())];
        l.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
        l
    }

    /// A settled probe; `load` is `None` while a scheduled test of ours loads the line (the
    /// `load="test"` series, kept apart from the household's busy time).
    pub fn probe(&self, s: &Sample, load: Option<LoadBand>) {
        let l = self.labels(&[]);
        self.sent.get_or_create(&l).inc();
        match s.rtt_ms {
            Some(ms) => self
                .rtt
                .get_or_create(&self.labels(&[("load", load.map_or("test", LoadBand::name))]))
                .observe(ms / 1e3),
            None => {
                self.lost.get_or_create(&l).inc();
            }
        }
    }

    pub fn target_up(&self, up: bool) {
        self.up
            .get_or_create(&self.labels(&[]))
            .set(if up { 1.0 } else { 0.0 });
    }

    pub fn test(&self, t: &TestRow) {
        let l = self.labels(&[]);
        if t.skipped.is_some() {
            self.skipped.get_or_create(&l).inc();
            return;
        }
        self.tests.get_or_create(&l).inc();
        let set = |f: &Family<Labels, FGauge>, dir: &str, v: Option<f64>| {
            if let Some(v) = v {
                f.get_or_create(&self.labels(&[("direction", dir)])).set(v);
            }
        };
        set(&self.added, "both", t.added_ms.map(|ms| ms / 1e3));
        set(&self.added, "down", t.added_down_ms.map(|ms| ms / 1e3));
        set(&self.added, "up", t.added_up_ms.map(|ms| ms / 1e3));
        set(&self.goodput, "down", t.down_mbps.map(|m| m * 1e6));
        set(&self.goodput, "up", t.up_mbps.map(|m| m * 1e6));
        if let Some(g) = t.grade.as_deref().and_then(grade_number) {
            self.grade.get_or_create(&l).set(f64::from(g));
        }
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_units_and_labels_are_prometheus_conventional() {
        let m = Metrics::new("srv:4040", Some("home"));
        m.target_up(true);
        let s = |rtt| Sample {
            sent_ns: 0,
            rtt_ms: rtt,
            owd_up_ms: None,
            owd_down_ms: None,
            echo: None,
        };
        m.probe(&s(Some(12.0)), Some(LoadBand::Idle));
        m.probe(&s(Some(250.0)), Some(LoadBand::Busy));
        m.probe(&s(None), Some(LoadBand::Busy));
        m.probe(&s(Some(80.0)), None);
        m.test(&TestRow {
            grade: Some("B".into()),
            added_ms: Some(45.0),
            added_up_ms: Some(40.0),
            down_mbps: Some(90.0),
            up_mbps: Some(9.5),
            ..TestRow::default()
        });
        m.test(&TestRow {
            skipped: Some("budget".into()),
            ..TestRow::default()
        });
        m.shaper(&[ShaperRow {
            iface: "wan".into(),
            tin: "Best Effort".into(),
            rate_bps: 50_000_000,
            drops: 7,
            av_delay_us: 3620,
            ..ShaperRow::default()
        }]);
        let text = m.render();
        let (site, target) = (r#"site="home""#, r#"target="srv:4040""#);
        let l = format!("{site},{target}");
        let le = |le: &str| format!(r#"{site},le="{le}",{target},load="busy""#);
        for line in [
            "# TYPE bloatlab_probe_rtt_seconds histogram".to_string(),
            "# UNIT bloatlab_probe_rtt_seconds seconds".to_string(),
            format!("bloatlab_probe_rtt_seconds_bucket{{{}}} 1", le("0.256")),
            format!("bloatlab_probe_rtt_seconds_bucket{{{}}} 0", le("0.128")),
            format!(r#"bloatlab_probe_rtt_seconds_count{{{l},load="idle"}} 1"#),
            format!(r#"bloatlab_probe_rtt_seconds_count{{{l},load="test"}} 1"#),
            format!("bloatlab_probes_sent_total{{{l}}} 4"),
            format!("bloatlab_probes_lost_total{{{l}}} 1"),
            format!(r#"bloatlab_test_added_latency_seconds{{{l},direction="both"}} 0.045"#),
            format!(r#"bloatlab_test_goodput_bits_per_second{{{l},direction="up"}} 9500000.0"#),
            format!("bloatlab_test_grade{{{l}}} 3.0"),
            format!("bloatlab_tests_total{{{l}}} 1"),
            format!("bloatlab_tests_skipped_total{{{l}}} 1"),
            format!("bloatlab_target_up{{{l}}} 1.0"),
            format!(r#"bloatlab_cake_rate_bits_per_second{{{l},iface="wan"}} 50000000.0"#),
            format!(r#"bloatlab_cake_tin_drops_total{{{l},iface="wan",tin="Best Effort"}} 7"#),
            format!(
                r#"bloatlab_cake_tin_avg_delay_seconds{{{l},iface="wan",tin="Best Effort"}} 0.0036"#
            ),
            "# EOF".to_string(),
        ] {
            assert!(text.contains(&line), "missing {line:?} in\n{text}");
        }
    }
}
