//! Letter grade for latency added under load (loaded p50 minus idle p50 round trip). The bands
//! are those of the widely used bufferbloat web tests, so users can compare.

/// Upper bounds (exclusive, ms) of each grade; anything above the last is F.
pub const BANDS: [(f64, &str); 5] = [
    (5.0, "A+"),
    (30.0, "A"),
    (60.0, "B"),
    (200.0, "C"),
    (400.0, "D"),
];

pub fn grade(added_latency_ms: f64) -> &'static str {
    BANDS
        .iter()
        .find(|(limit, _)| added_latency_ms < *limit)
        .map_or("F", |(_, g)| g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands() {
        assert_eq!(grade(-1.0), "A+");
        assert_eq!(grade(4.99), "A+");
        assert_eq!(grade(5.0), "A");
        assert_eq!(grade(59.0), "B");
        assert_eq!(grade(199.0), "C");
        assert_eq!(grade(399.0), "D");
        assert_eq!(grade(400.0), "F");
        assert_eq!(grade(2400.0), "F");
    }
}
