//! Burst profiles and the summary of a UDP load (`test udp`). Pure.

use crate::stats::quantile_sorted;
use bloatlab_result::{BurstProfile, Loss, UdpLoad, UdpLoadInfo};

/// Per-bucket bytes against their mean over the active span (first to last non-empty bucket).
pub fn profile(bytes: &[u32], bucket_ms: f64) -> Option<BurstProfile> {
    let first = bytes.iter().position(|&b| b > 0)?;
    let last = bytes.iter().rposition(|&b| b > 0)?;
    let mut span: Vec<f64> = bytes[first..=last].iter().map(|&b| f64::from(b)).collect();
    let mean = span.iter().sum::<f64>() / span.len() as f64;
    span.sort_by(f64::total_cmp);
    Some(BurstProfile {
        bucket_ms,
        peak_over_mean: span[span.len() - 1] / mean,
        p99_over_mean: quantile_sorted(&span, 0.99) / mean,
    })
}

/// Payload Mbit/s sent over `seconds`, else over the active span of the per-bucket counts
/// (which overstates an on/off sender: its last burst stands for a period the span leaves out).
fn send_mbps(bytes: &[u32], bucket_ms: f64, seconds: Option<f64>) -> f64 {
    let (Some(first), Some(last)) = (
        bytes.iter().position(|&b| b > 0),
        bytes.iter().rposition(|&b| b > 0),
    ) else {
        return 0.0;
    };
    let total: u64 = bytes.iter().map(|&b| u64::from(b)).sum();
    let span = seconds
        .filter(|s| *s > 0.0)
        .unwrap_or((last - first + 1) as f64 * bucket_ms / 1e3);
    total as f64 * 8.0 / span / 1e6
}

/// The load's figures and its loss (what the server did not receive of what was sent; the
/// server's own drops and declines are part of it and reported beside it). `load_s`: how long
/// the sender ran (the load phase).
pub fn udp_summary(u: &UdpLoadInfo, load_s: Option<f64>) -> (UdpLoad, Loss) {
    let server = u.server.as_ref();
    let load = UdpLoad {
        pacing: u.pacing_used.clone(),
        send_mbps: send_mbps(&u.send_bytes, u.bucket_ms, load_s),
        sent: u.sent,
        received: server.map(|s| s.received),
        reordered: server.map(|s| s.reordered),
        duplicates: server.map(|s| s.duplicates),
        send_errors: u.send_errors,
        skipped: u.skipped,
        server_socket_drops: server.and_then(|s| s.socket_drops),
        server_limited: server.map(|s| s.server_limited),
        ce: server.filter(|_| u.ecn != 0).map(|s| s.ce),
    };
    let mut loss = Loss {
        sent: u.sent,
        ..Default::default()
    };
    if let Some(s) = server {
        loss.lost = u.sent.saturating_sub(s.received);
        loss.percent = if u.sent > 0 {
            100.0 * loss.lost as f64 / u.sent as f64
        } else {
            0.0
        };
        loss.up_percent = Some(loss.percent);
        loss.server_limited = s.server_limited;
    }
    (load, loss)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::UdpLoadServer;

    /// An on/off sender: 5 full buckets in every 100 (iperf3's 100 ms periods at a twentieth of
    /// the line rate) has a peak of 20 times its mean, and its p99 bucket is a full one too; an
    /// even stream is 1 everywhere.
    #[test]
    fn on_off_peaks_at_the_inverse_of_its_duty_cycle() {
        let mut bursty = Vec::new();
        for _ in 0..10 {
            bursty.extend([1000u32; 5]);
            bursty.extend([0u32; 95]);
        }
        // The span ends at the last burst: 9 periods and 5 buckets.
        let p = profile(&bursty, 1.0).unwrap();
        let mean = 50_000.0 / 905.0;
        assert!((p.peak_over_mean - 1000.0 / mean).abs() < 1e-9);
        assert!(
            (p.p99_over_mean - 1000.0 / mean).abs() < 1e-9,
            "5% of the buckets are full"
        );
        let even = profile(&[0, 0, 700, 700, 700, 700, 0], 1.0).unwrap();
        assert_eq!(
            (even.peak_over_mean, even.p99_over_mean),
            (1.0, 1.0),
            "empty buckets outside the span do not count"
        );
        assert!(profile(&[0, 0], 1.0).is_none());
    }

    #[test]
    fn loss_is_what_the_server_did_not_receive() {
        let mut u = UdpLoadInfo {
            sent: 1000,
            bucket_ms: 1.0,
            send_bytes: vec![1024; 100],
            ..Default::default()
        };
        let (load, loss) = udp_summary(&u, None);
        assert_eq!(
            (load.received, loss.lost, loss.up_percent),
            (None, 0, None),
            "no report: no loss claimed"
        );
        assert!(
            (load.send_mbps - 1024.0 * 8.0 / 1e-3 / 1e6).abs() < 1e-9,
            "over the 100 ms span"
        );
        assert!(
            (udp_summary(&u, Some(0.2)).0.send_mbps - 1024.0 * 8.0 / 2e-3 / 1e6).abs() < 1e-9,
            "over the load phase"
        );
        u.server = Some(UdpLoadServer {
            received: 800,
            server_limited: 5,
            ..Default::default()
        });
        let (_, loss) = udp_summary(&u, None);
        assert_eq!(
            (loss.lost, loss.percent, loss.server_limited),
            (200, 20.0, 5)
        );
    }
}
