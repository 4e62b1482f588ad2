//! Clock offset between client and server from echo timestamps (NTP's on-wire method). Each
//! probe bounds the offset within +/- half its round trip; the fastest probes bound it best.

use bloatlab_result::ClockOffset;

/// One echoed probe: client send, server receive, server send, client receive (ns, each side's
/// own monotonic clock).
#[derive(Clone, Copy, Debug)]
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
    if echoes.is_empty() {
        return None;
    }
    let mut v = echoes.to_vec();
    v.sort_by_key(Echo::rtt_ns);
    let n = v.len().div_ceil(3);
    let fastest = &v[..n];
    let mut offsets: Vec<i128> = fastest.iter().map(Echo::offset_ns).collect();
    offsets.sort();
    let worst_rtt = fastest.iter().map(Echo::rtt_ns).max().unwrap_or(0).max(0);
    Some(ClockOffset {
        offset_ms: offsets[offsets.len() / 2] as f64 / 1e6,
        uncertainty_ms: worst_rtt as f64 / 2e6,
        samples: n,
    })
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
        assert!((est.offset_ms - 5000.0).abs() <= est.uncertainty_ms, "{est:?}");
        assert!((est.uncertainty_ms - 1.0).abs() < 1e-9, "{est:?}");
        assert_eq!(est.samples, 30);
        assert!(estimate(&[]).is_none());
    }
}
