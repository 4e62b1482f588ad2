//! Order statistics and friends on plain slices.

use bloatlab_result::Percentiles;

/// Percentile by linear interpolation between closest ranks (as numpy's default), `q` in 0..=1.
/// `sorted` must be ascending and non-empty.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    assert!(!sorted.is_empty());
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Mean rate over `from..to` of rate samples `(t, rate)` sorted by time, each covering the time
/// since the previous sample (the first, since `first_from`); a missing rate counts as 0. Only
/// the samples reaching into the window are read.
pub fn rate_over(samples: &[(f64, Option<f64>)], first_from: f64, from: f64, to: f64) -> f64 {
    let len = to - from;
    if len <= 0.0 {
        return 0.0;
    }
    let first = samples.partition_point(|s| s.0 <= from);
    let mut prev = if first == 0 {
        first_from
    } else {
        samples[first - 1].0
    };
    let mut area = 0.0;
    for &(t, v) in &samples[first..] {
        if prev >= to {
            break;
        }
        area += v.unwrap_or(0.0) * (t.min(to) - prev.max(from)).max(0.0);
        prev = t;
    }
    area / len
}

/// p50/p90/p99, min, max and mean; `None` for no samples. NaNs are ignored.
pub fn percentiles(values: impl IntoIterator<Item = f64>) -> Option<Percentiles> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(Percentiles {
        p50: quantile_sorted(&v, 0.50),
        p90: quantile_sorted(&v, 0.90),
        p99: quantile_sorted(&v, 0.99),
        min: v[0],
        max: v[v.len() - 1],
        mean: v.iter().sum::<f64>() / v.len() as f64,
        samples: v.len(),
    })
}

/// Jain's fairness index: (sum x)^2 / (n * sum x^2); 1 when all equal, 1/n when one takes all.
pub fn jain(values: &[f64]) -> Option<f64> {
    let sq: f64 = values.iter().map(|x| x * x).sum();
    if values.is_empty() || sq == 0.0 {
        return None;
    }
    let s: f64 = values.iter().sum();
    Some(s * s / (values.len() as f64 * sq))
}

/// Mean after dropping the largest `(1 - keep)` fraction (single-sided, as the RPM draft's
/// trimmed mean at its 95th percentile: `keep = 0.95`).
pub fn trimmed_mean(values: &[f64], keep: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = ((v.len() as f64 * keep).ceil() as usize).clamp(1, v.len());
    Some(v[..n].iter().sum::<f64>() / n as f64)
}

/// RFC 3550 interarrival jitter from successive one-way transit times (any common offset
/// cancels out): J += (|D| - J) / 16 for each pair of consecutive received packets.
pub fn rfc3550_jitter(transits: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut it = transits.into_iter();
    let mut prev = it.next()?;
    let mut j = 0.0;
    let mut pairs = 0;
    for t in it {
        j += ((t - prev).abs() - j) / 16.0;
        prev = t;
        pairs += 1;
    }
    (pairs > 0).then_some(j)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_one_to_hundred() {
        let p = percentiles((1..=100).map(f64::from)).unwrap();
        assert_eq!(p.p50, 50.5);
        assert!((p.p90 - 90.1).abs() < 1e-9);
        assert!((p.p99 - 99.01).abs() < 1e-9);
        assert_eq!((p.min, p.max, p.mean, p.samples), (1.0, 100.0, 50.5, 100));
        assert!(percentiles(std::iter::empty()).is_none());
        assert_eq!(percentiles([7.0]).unwrap().p99, 7.0);
    }

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain(&[5.0, 5.0, 5.0, 5.0]), Some(1.0));
        assert_eq!(jain(&[8.0, 0.0, 0.0, 0.0]), Some(0.25));
        assert_eq!(jain(&[]), None);
    }

    #[test]
    fn trimmed_mean_drops_the_worst_tail() {
        let mut v: Vec<f64> = vec![10.0; 95];
        v.extend([1000.0; 5]);
        assert_eq!(trimmed_mean(&v, 0.95), Some(10.0));
        assert_eq!(trimmed_mean(&[3.0], 0.95), Some(3.0));
    }

    #[test]
    fn jitter_of_alternating_transits_converges_to_the_step() {
        // Transit alternates 10, 12, 10, 12 ms: |D| = 2 every time, so J -> 2.
        let t = (0..2000).map(|i| if i % 2 == 0 { 10.0 } else { 12.0 });
        let j = rfc3550_jitter(t).unwrap();
        assert!((j - 2.0).abs() < 1e-6, "{j}");
        // A constant offset (unsynchronised clocks) does not change jitter.
        assert_eq!(rfc3550_jitter([5.0, 5.0, 5.0]), Some(0.0));
        assert_eq!(rfc3550_jitter([1.0]), None);
    }
}
