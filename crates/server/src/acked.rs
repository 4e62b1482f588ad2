//! A download's acknowledged bytes on a fixed grid: the socket's cumulative count, read when the
//! sampler wakes (late by whatever the runtime was doing), spread onto buckets by straight
//! lines between readings, so a late wake-up moves no bytes into the wrong bucket.

use bloatlab_proto::AckedBytes;

/// Buckets of this length: the client's finest step (10 ms).
pub const BUCKET_NS: u64 = 10_000_000;

#[derive(Debug)]
pub struct AckedLog {
    report: AckedBytes,
    /// The last reading: when (ns) and the count then.
    last: Option<(u64, u64)>,
    /// The count at the end of the last full bucket.
    at_bucket_end: u64,
    max_buckets: usize,
}

impl AckedLog {
    /// A log that keeps at most `max_buckets` (the test's length): a longer flow stops growing it.
    pub fn new(max_buckets: usize) -> AckedLog {
        AckedLog {
            report: AckedBytes {
                bucket_us: (BUCKET_NS / 1000) as u32,
                ..AckedBytes::default()
            },
            last: None,
            at_bucket_end: 0,
            max_buckets,
        }
    }

    /// The count `acked` read at `t_ns`; counts never go back (a reading lower than the last
    /// one, which TCP_INFO's selective part can give, is taken as the last).
    pub fn record(&mut self, t_ns: u64, acked: u64) {
        let Some((t0, a0)) = self.last else {
            self.report.first_ns = t_ns;
            self.at_bucket_end = acked;
            self.last = Some((t_ns, acked));
            return;
        };
        let acked = acked.max(a0);
        if t_ns <= t0 {
            return;
        }
        let first = self.report.first_ns;
        loop {
            let end = first + (self.report.buckets.len() as u64 + 1) * BUCKET_NS;
            if end > t_ns || self.report.buckets.len() >= self.max_buckets {
                break;
            }
            // The count at the bucket's end, on the line between the two readings.
            let at_end =
                a0 + ((acked - a0) as u128 * (end - t0) as u128 / (t_ns - t0) as u128) as u64;
            let bytes = at_end.saturating_sub(self.at_bucket_end);
            self.report
                .buckets
                .push(bytes.min(u64::from(u32::MAX)) as u32);
            self.at_bucket_end = at_end;
        }
        self.last = Some((t_ns, acked));
    }

    pub fn report(&self) -> Option<AckedBytes> {
        (!self.report.buckets.is_empty()).then(|| self.report.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_readings_spread_their_bytes_over_the_buckets_they_span() {
        let mut log = AckedLog::new(100);
        // 25 000 bytes per 10 ms (20 Mbit/s), read at 0, 10, then late at 35 and 40 ms.
        log.record(1_000_000_000, 0);
        log.record(1_010_000_000, 25_000);
        assert_eq!(log.report().unwrap().buckets, [25_000]);
        log.record(1_035_000_000, 87_500);
        // Two full buckets from the straight line; the half bucket waits for the next reading.
        assert_eq!(log.report().unwrap().buckets, [25_000, 25_000, 25_000]);
        log.record(1_040_000_000, 100_000);
        let r = log.report().unwrap();
        assert_eq!(r.buckets, [25_000, 25_000, 25_000, 25_000]);
        assert_eq!((r.first_ns, r.bucket_us), (1_000_000_000, 10_000));
        // A reading that went back counts as no progress.
        log.record(1_050_000_000, 90_000);
        assert_eq!(log.report().unwrap().buckets[4], 0);
    }

    #[test]
    fn the_log_stops_at_its_bound_and_an_empty_one_reports_nothing() {
        let mut log = AckedLog::new(3);
        log.record(0, 0);
        assert_eq!(log.report(), None);
        log.record(100_000_000, 1_000);
        assert_eq!(log.report().unwrap().buckets.len(), 3);
    }
}
