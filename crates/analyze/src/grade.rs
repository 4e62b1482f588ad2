//! Letter grade for latency added under load (loaded p50 minus idle p50 round trip), capped by
//! the loss under load. The latency bands are those of the widely used bufferbloat web tests
//! (Waveform's, DSLReports'), so users can compare.

use bloatlab_result::LossCap;

/// Upper bounds (exclusive, ms) of each grade; anything above the last is F.
pub const BANDS: [(f64, &str); 5] = [
    (5.0, "A+"),
    (30.0, "A"),
    (60.0, "B"),
    (200.0, "C"),
    (400.0, "D"),
];

/// The grades from best to worst.
pub const ORDER: [&str; 6] = ["A+", "A", "B", "C", "D", "F"];

/// Loss under load (percent of probes, from) and the best grade it allows, strictest first.
/// A queue too short to delay anyone drops instead, and a call or a game feels the loss as
/// surely as delay. The E-model (ITU-T G.107; G.711 with loss concealment, Bpl 25.1, random
/// loss, no delay) rates a call R 86 (users satisfied) at 2% loss, R 77 (some dissatisfied) at
/// 5% and R 58 (nearly all dissatisfied) at 15%; DSLReports' quality grade also puts 5% at C
/// and F above 12%, and voice budgets (Cisco) allow 1%.
pub const LOSS_CAPS: [(f64, &str); 3] = [(15.0, "D"), (5.0, "C"), (2.0, "B")];

pub fn grade(added_latency_ms: f64) -> &'static str {
    BANDS
        .iter()
        .find(|(limit, _)| added_latency_ms < *limit)
        .map_or("F", |(_, g)| g)
}

fn rank(g: &str) -> usize {
    ORDER.iter().position(|o| *o == g).unwrap_or(ORDER.len())
}

/// The worse of two grades.
pub fn worse<'a>(a: &'a str, b: &'a str) -> &'a str {
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// The grade of `added_latency_ms` with `loss_percent` of the probes lost under load: the
/// latency's grade at most what the loss allows, and the cap when it lowered the grade.
pub fn capped(added_latency_ms: f64, loss_percent: Option<f64>) -> (String, Option<LossCap>) {
    let by_latency = grade(added_latency_ms);
    let cap = loss_percent.and_then(|loss| {
        let (_, at_most) = LOSS_CAPS.iter().find(|(from, _)| loss >= *from)?;
        (rank(at_most) > rank(by_latency)).then(|| LossCap {
            loss_percent: loss,
            latency_grade: by_latency.to_string(),
            at_most: at_most.to_string(),
        })
    });
    let letter = cap.as_ref().map_or(by_latency, |c| c.at_most.as_str());
    (letter.to_string(), cap)
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

    #[test]
    fn loss_under_load_caps_the_grade_and_says_so() {
        // The case: +16 ms through a 10-packet FIFO, 23% of the probes lost under load.
        let (g, cap) = capped(16.0, Some(23.0));
        assert_eq!(g, "D");
        assert_eq!(
            cap,
            Some(LossCap {
                loss_percent: 23.0,
                latency_grade: "A".into(),
                at_most: "D".into()
            })
        );
        assert_eq!(capped(16.0, Some(1.9)), ("A".into(), None));
        assert_eq!(capped(16.0, Some(2.0)).0, "B");
        assert_eq!(capped(3.0, Some(5.0)).0, "C");
        assert_eq!(capped(3.0, Some(14.9)).0, "C");
        // A cap never raises a grade, and says nothing where the latency was worse anyway.
        assert_eq!(capped(500.0, Some(30.0)), ("F".into(), None));
        assert_eq!(capped(100.0, Some(3.0)), ("C".into(), None));
        // Loss not measured: the latency alone.
        assert_eq!(capped(16.0, None), ("A".into(), None));
    }

    #[test]
    fn worse_orders_grades() {
        assert_eq!(worse("A+", "B"), "B");
        assert_eq!(worse("F", "A"), "F");
        assert_eq!(worse("C", "C"), "C");
    }
}
