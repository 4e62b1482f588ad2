//! Clock offset between client and server from echo timestamps (NTP's on-wire method). Each
//! probe bounds the offset within +/- half its round trip; the fastest probes bound it best.

use bloatlab_result::ClockOffset;

/// One echoed probe: client send, server receive, server send, client receive (ns, each side's
/// own monotonic clock).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Echo {
    pub t1: u64,
    pub t2: u64,
    pub t3: u64,
    pub t4: u64,
}

impl Echo {
    /// Network round trip, server hold time excluded, ns.
    pub fn rtt_ns(&self) -> i128 {
        (self.t4 as i128 - self.t1 as i128) - (self.t3 as i128 - self.t2 as i128)
    }

    /// Server clock minus client clock, assuming symmetric paths, ns.
    pub fn offset_ns(&self) -> i128 {
        ((self.t2 as i128 - self.t1 as i128) + (self.t3 as i128 - self.t4 as i128)) / 2
    }
}

/// Median offset of the fastest third of the echoes; uncertainty is half the largest round trip
/// among them. `None` without echoes.
pub fn estimate(echoes: &[Echo]) -> Option<ClockOffset> {
    estimate_fastest(echoes, 3)
}

/// The same from the fastest 1/`part` of the echoes.
fn estimate_fastest(echoes: &[Echo], part: usize) -> Option<ClockOffset> {
    if echoes.is_empty() {
        return None;
    }
    let mut v = echoes.to_vec();
    v.sort_by_key(Echo::rtt_ns);
    let n = v.len().div_ceil(part);
    let fastest = &v[..n];
    let mut offsets: Vec<i128> = fastest.iter().map(Echo::offset_ns).collect();
    offsets.sort();
    let worst_rtt = fastest.iter().map(Echo::rtt_ns).max().unwrap_or(0).max(0);
    let mean_t1 = fastest.iter().map(|e| e.t1 as f64).sum::<f64>() / n as f64;
    Some(ClockOffset {
        offset_ms: offsets[offsets.len() / 2] as f64 / 1e6,
        uncertainty_ms: worst_rtt as f64 / 2e6,
        samples: n,
        reference_s: mean_t1 / 1e9,
        drift_ppm: None,
    })
}

/// The offset from the echoes `before` the load, with linear drift from a second estimate from
/// those `after` it (as crusader synchronises before and after). Each estimate carries the
/// same unknown path asymmetry, so their difference measures drift far better than either
/// measures the offset. `after` uses its fastest tenth (its first probes still wait in the
/// draining queues) and counts only when those saw queues as empty as `before` did (round trips
/// at most 0.5 ms or 50 % longer). `reference_s` counts from the client
/// time `origin_ns`.
pub fn estimate_with_drift(before: &[Echo], after: &[Echo], origin_ns: u64) -> Option<ClockOffset> {
    let origin_s = origin_ns as f64 / 1e9;
    let mut b = estimate(before)?;
    b.reference_s -= origin_s;
    if let Some(a) = estimate_fastest(after, 10) {
        let drained = a.uncertainty_ms <= (b.uncertainty_ms * 1.5).max(b.uncertainty_ms + 0.5);
        let span_s = a.reference_s - origin_s - b.reference_s;
        if drained && span_s > 1.0 {
            b.drift_ppm = Some((a.offset_ms - b.offset_ms) / 1e3 / span_s * 1e6);
        }
    }
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_a_known_offset_within_its_bound() {
        // Server clock runs 5 s ahead. Up path 1 ms, down path 1 ms, hold 0.1 ms; half the
        // probes are delayed 40 ms upstream by a queue.
        let off = 5_000_000_000u64;
        let echoes: Vec<Echo> = (0..90u64)
            .map(|i| {
                let t1 = i * 10_000_000;
                let up = if i % 2 == 0 { 1_000_000 } else { 41_000_000 };
                let t2 = t1 + up + off;
                let t3 = t2 + 100_000;
                let t4 = t3 - off + 1_000_000;
                Echo { t1, t2, t3, t4 }
            })
            .collect();
        let est = estimate(&echoes).unwrap();
        assert!(
            (est.offset_ms - 5000.0).abs() <= est.uncertainty_ms,
            "{est:?}"
        );
        assert!((est.uncertainty_ms - 1.0).abs() < 1e-9, "{est:?}");
        assert_eq!(est.samples, 30);
        assert!(estimate(&[]).is_none());
    }

    /// Server clock 100 ppm fast, an asymmetric path (3 ms up, 1 ms down: every estimate is 1 ms
    /// off, the same way): the drift comes out at 100 ppm all the same, and the offset at any
    /// time within its uncertainty. After-load probes that still sit in a queue give no drift.
    #[test]
    fn drift_from_before_and_after_the_load() {
        let echo = |t1: u64, queue_ns: u64| {
            let server = |t: u64| t + t / 10_000 + 2_000_000_000; // +100 ppm, 2 s ahead
            let t2 = server(t1 + 3_000_000 + queue_ns);
            let t3 = t2 + 50_000;
            let t4 = t1 + 3_000_000 + queue_ns + 50_000 + 1_000_000;
            Echo { t1, t2, t3, t4 }
        };
        let origin = 1_000_000_000;
        let before: Vec<Echo> = (0..100).map(|i| echo(origin + i * 50_000_000, 0)).collect();
        let after: Vec<Echo> = (0..40)
            .map(|i| echo(origin + 35_000_000_000 + i * 50_000_000, 0))
            .collect();
        let est = estimate_with_drift(&before, &after, origin).unwrap();
        let drift = est.drift_ppm.unwrap();
        assert!((drift - 100.0).abs() < 0.5, "{drift} ppm");
        assert!(
            est.reference_s > 0.0 && est.reference_s < 5.0,
            "within the before window: {est:?}"
        );
        // True offset at 30 s after the origin: 2 s + 100 ppm of (origin + 30 s).
        let truth_ms = 2000.0 + (origin as f64 + 30e9) * 1e-4 / 1e6;
        assert!(
            (est.at(30.0) - truth_ms).abs() <= est.uncertainty_ms,
            "{} vs {truth_ms}",
            est.at(30.0)
        );
        let queued: Vec<Echo> = (0..40)
            .map(|i| echo(origin + 35_000_000_000 + i * 50_000_000, 200_000_000))
            .collect();
        assert_eq!(
            estimate_with_drift(&before, &queued, origin)
                .unwrap()
                .drift_ppm,
            None
        );
    }
}
