//! ITU-T G.107 E-model, reduced to what a network measurement determines: delay impairment Idd
//! from the mouth-to-ear delay and effective equipment impairment Ie,eff from packet loss, with
//! the recommendation's default values for everything else (R0 - Is = 93.2).

/// Codec assumed for the call: G.711 with packet loss concealment (G.113 Appendix I).
pub const IE: f64 = 0.0;
pub const BPL: f64 = 25.1;
/// R of a perfect G.711 call with G.107 defaults.
pub const R_DEFAULT: f64 = 93.2;

/// Delay impairment Idd (G.107 eq. 7-28): zero up to 100 ms mouth-to-ear.
pub fn idd(mouth_to_ear_ms: f64) -> f64 {
    if mouth_to_ear_ms <= 100.0 {
        return 0.0;
    }
    let x = (mouth_to_ear_ms / 100.0).log2();
    25.0 * ((1.0 + x.powi(6)).powf(1.0 / 6.0) - 3.0 * (1.0 + (x / 3.0).powi(6)).powf(1.0 / 6.0)
        + 2.0)
}

/// Effective equipment impairment (G.107 eq. 7-29), `loss_percent` (Ppl) in 0..=100;
/// `burst_r` 1 for random loss, above 1 when losses come in bursts.
pub fn ie_eff(loss_percent: f64, burst_r: f64) -> f64 {
    let ppl = loss_percent.clamp(0.0, 100.0);
    IE + (95.0 - IE) * ppl / (ppl / burst_r.max(f64::MIN_POSITIVE) + BPL)
}

pub fn r_factor(mouth_to_ear_ms: f64, loss_percent: f64, burst_r: f64) -> f64 {
    R_DEFAULT - idd(mouth_to_ear_ms) - ie_eff(loss_percent, burst_r)
}

/// BurstR of a loss sequence (true = lost) under G.107's two-state Markov model: 1/(p + q) with
/// p = P(lost | previous received) and q = P(received | previous lost). 1 without losses (or
/// without a transition to learn from).
pub fn burst_r(lost: &[bool]) -> f64 {
    let (mut from_ok, mut ok_to_lost, mut from_lost, mut lost_to_ok) = (0u64, 0u64, 0u64, 0u64);
    for w in lost.windows(2) {
        if w[0] {
            from_lost += 1;
            lost_to_ok += u64::from(!w[1]);
        } else {
            from_ok += 1;
            ok_to_lost += u64::from(w[1]);
        }
    }
    if from_ok == 0 || from_lost == 0 {
        return 1.0;
    }
    let (p, q) = (
        ok_to_lost as f64 / from_ok as f64,
        lost_to_ok as f64 / from_lost as f64,
    );
    if p + q > 0.0 {
        1.0 / (p + q)
    } else {
        1.0
    }
}

/// G.107 Annex B mapping from R to MOS (conversational quality, 1..4.5).
pub fn mos(r: f64) -> f64 {
    if r <= 0.0 {
        1.0
    } else if r >= 100.0 {
        4.5
    } else {
        1.0 + 0.035 * r + r * (r - 60.0) * (100.0 - r) * 7e-6
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_call_scores_4_41() {
        let r = r_factor(20.0, 0.0, 1.0);
        assert_eq!(r, 93.2);
        assert!((mos(r) - 4.41).abs() < 0.01, "{}", mos(r));
    }

    #[test]
    fn delay_impairment_matches_g107_landmarks() {
        // X = log2(Ta/100); at Ta = 200 ms X = 1, Idd = 25((2)^(1/6) - 3(1+1/729)^(1/6) + 2).
        let want =
            25.0 * (2f64.powf(1.0 / 6.0) - 3.0 * (1.0 + 1.0 / 729.0f64).powf(1.0 / 6.0) + 2.0);
        assert!((idd(200.0) - want).abs() < 1e-12);
        assert!((idd(200.0) - 3.04).abs() < 0.01, "{}", idd(200.0));
        // 400 ms one-way is well into "many users dissatisfied": R around 70 or below.
        assert!(r_factor(400.0, 0.0, 1.0) < 75.0);
        assert!(idd(100.0) == 0.0);
    }

    #[test]
    fn loss_lowers_r_monotonically() {
        assert_eq!(ie_eff(0.0, 1.0), 0.0);
        // 1% random loss with PLC: Ie,eff = 95 * 1 / 26.1 = 3.64.
        assert!((ie_eff(1.0, 1.0) - 95.0 / 26.1).abs() < 1e-9);
        assert!(r_factor(50.0, 5.0, 1.0) < r_factor(50.0, 1.0, 1.0));
        assert!(mos(r_factor(50.0, 20.0, 1.0)) < 3.0);
        // The same 5 % in bursts hurts more (G.107: Ppl/BurstR in the denominator).
        assert!(ie_eff(5.0, 4.0) > ie_eff(5.0, 1.0));
        assert_eq!(mos(-5.0), 1.0);
        assert_eq!(mos(120.0), 4.5);
    }

    /// Random loss has BurstR 1 (p + q = 1); losses in runs of 4 among runs of 96 received
    /// have p = 1/96, q = 1/4: BurstR = 1/(0.0104 + 0.25) = 3.84.
    #[test]
    fn burst_r_of_random_and_bursty_loss() {
        let bursty: Vec<bool> = (0..10_000).map(|i| i % 100 >= 96).collect();
        let want = 1.0 / (1.0 / 96.0 + 0.25);
        // (The sequence ends inside a run: 99 of 399 lost packets are followed by a received one.)
        assert!(
            (burst_r(&bursty) - want).abs() < 0.05,
            "{}",
            burst_r(&bursty)
        );
        // Every 20th lost: p = 1/19, q = 1, BurstR = 0.95 (smoother than random).
        let spread: Vec<bool> = (0..10_000).map(|i| i % 20 == 0).collect();
        assert!((burst_r(&spread) - 1.0 / (1.0 / 19.0 + 1.0)).abs() < 0.01);
        assert_eq!(burst_r(&[false; 100]), 1.0);
    }
}
