//! How long a scheduled test may run within the day's data budget. Pure.

/// Shorter than this a test says little (its idle phase and ramp-up take 5 s and more).
pub const MIN_LENGTH_S: f64 = 3.0;

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Run {
        length_s: f64,
    },
    /// Shortened to fit: the log says why.
    Shortened {
        length_s: f64,
        why: String,
    },
    Skip {
        why: String,
    },
}

/// `per_day` bytes a day (`None`: no budget), `spent` so far today, `tests_left` the scheduled
/// tests still due today this one included, `rate_bps` the line's last measured goodput both
/// ways together (`None` before the first test: then 200 Mbit/s is assumed, a fast line's).
pub fn decide(
    per_day: Option<u64>,
    spent: u64,
    tests_left: u32,
    rate_bps: Option<f64>,
    wanted_s: f64,
) -> Decision {
    let Some(budget) = per_day else {
        return Decision::Run { length_s: wanted_s };
    };
    let left = budget.saturating_sub(spent);
    let share = left as f64 / f64::from(tests_left.max(1));
    let rate = rate_bps.unwrap_or(200e6).max(1.0);
    let fits_s = share * 8.0 / rate;
    let mb = |b: f64| b / 1e6;
    if fits_s >= wanted_s {
        Decision::Run { length_s: wanted_s }
    } else if fits_s >= MIN_LENGTH_S {
        Decision::Shortened {
            length_s: (fits_s * 10.0).floor() / 10.0,
            why: format!(
                "{:.0} MB of today's budget left for {tests_left} tests: {:.0} MB each, \
                 {:.1} s at {:.0} Mbit/s",
                mb(left as f64),
                mb(share),
                fits_s,
                rate / 1e6
            ),
        }
    } else {
        Decision::Skip {
            why: format!(
                "{:.0} MB of today's budget left for {tests_left} tests: {:.0} MB each is under \
                 {MIN_LENGTH_S} s at {:.0} Mbit/s",
                mb(left as f64),
                mb(share),
                rate / 1e6
            ),
        }
    }
}

/// Scheduled tests from `now_s` to the end of its UTC day, one every `every_s`.
pub fn tests_left_today(now_s: i64, every_s: i64) -> u32 {
    let left = 86_400 - now_s.rem_euclid(86_400);
    let every = every_s.max(1);
    ((left + every - 1) / every) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fast_line_shortens_then_skips_its_tests_within_the_budget() {
        assert_eq!(
            decide(None, 0, 24, Some(1e9), 10.0),
            Decision::Run { length_s: 10.0 }
        );
        // 5 GB/day, 24 tests, 100 Mbit/s both ways: 208 MB each holds 16.7 s.
        assert_eq!(
            decide(Some(5_000_000_000), 0, 24, Some(100e6), 10.0),
            Decision::Run { length_s: 10.0 }
        );
        // 1 Gbit/s: 10 s would be 1.25 GB; 208 MB is 1.6 s: skipped.
        let d = decide(Some(5_000_000_000), 0, 24, Some(1e9), 10.0);
        assert!(matches!(d, Decision::Skip { .. }), "{d:?}");
        // 500 Mbit/s: 3.3 s fits.
        match decide(Some(5_000_000_000), 0, 24, Some(500e6), 10.0) {
            Decision::Shortened { length_s, why } => {
                assert_eq!(length_s, 3.3);
                assert!(why.contains("208 MB each"), "{why}");
            }
            d => panic!("{d:?}"),
        }
        // Spent already: nothing left.
        let d = decide(Some(1_000_000), 2_000_000, 3, Some(1e6), 10.0);
        assert!(matches!(d, Decision::Skip { .. }), "{d:?}");
    }

    #[test]
    fn tests_left_count_to_the_end_of_the_day() {
        assert_eq!(tests_left_today(0, 3600), 24);
        assert_eq!(tests_left_today(86_400 - 1800, 3600), 1);
        assert_eq!(tests_left_today(86_400 * 3 + 23 * 3600, 3600), 1);
        assert_eq!(tests_left_today(86_400 * 3 + 22 * 3600 + 1, 3600), 2);
    }
}
