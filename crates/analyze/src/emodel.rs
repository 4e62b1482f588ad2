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
    25.0 * ((1.0 + x.powi(6)).powf(1.0 / 6.0) - 3.0 * (1.0 + (x / 3.0).powi(6)).powf(1.0 / 6.0) + 2.0)
}

/// Effective equipment impairment for random loss (BurstR = 1), `loss_percent` in 0..=100.
pub fn ie_eff(loss_percent: f64) -> f64 {
    let ppl = loss_percent.clamp(0.0, 100.0);
    IE + (95.0 - IE) * ppl / (ppl + BPL)
}

pub fn r_factor(mouth_to_ear_ms: f64, loss_percent: f64) -> f64 {
    R_DEFAULT - idd(mouth_to_ear_ms) - ie_eff(loss_percent)
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
        let r = r_factor(20.0, 0.0);
        assert_eq!(r, 93.2);
        assert!((mos(r) - 4.41).abs() < 0.01, "{}", mos(r));
    }

    #[test]
    fn delay_impairment_matches_g107_landmarks() {
        // X = log2(Ta/100); at Ta = 200 ms X = 1, Idd = 25((2)^(1/6) - 3(1+1/729)^(1/6) + 2).
        let want = 25.0 * (2f64.powf(1.0 / 6.0) - 3.0 * (1.0 + 1.0 / 729.0f64).powf(1.0 / 6.0) + 2.0);
        assert!((idd(200.0) - want).abs() < 1e-12);
        assert!((idd(200.0) - 3.04).abs() < 0.01, "{}", idd(200.0));
        // 400 ms one-way is well into "many users dissatisfied": R around 70 or below.
        assert!(r_factor(400.0, 0.0) < 75.0);
        assert!(idd(100.0) == 0.0);
    }

    #[test]
    fn loss_lowers_r_monotonically() {
        assert_eq!(ie_eff(0.0), 0.0);
        // 1% random loss with PLC: Ie,eff = 95 * 1 / 26.1 = 3.64.
        assert!((ie_eff(1.0) - 95.0 / 26.1).abs() < 1e-9);
        assert!(r_factor(50.0, 5.0) < r_factor(50.0, 1.0));
        assert!(mos(r_factor(50.0, 20.0)) < 3.0);
        assert_eq!(mos(-5.0), 1.0);
        assert_eq!(mos(120.0), 4.5);
    }
}
