//! Responsiveness (draft-ietf-ippm-responsiveness): round trips per minute from the trimmed
//! means of new-connection probes and of probes on loaded connections.

use crate::stats::trimmed_mean;

/// The draft's single-sided trim: keep the best 95%.
pub const KEEP: f64 = 0.95;

/// Returns (rpm, foreign, loaded). Without TLS, the foreign term averages the TCP handshake and
/// the request time on the new connection. All inputs in ms.
pub fn rpm(foreign_connect: &[f64], foreign_request: &[f64], loaded: &[f64]) -> Option<(f64, f64, f64)> {
    let tcp = trimmed_mean(foreign_connect, KEEP)?;
    let req = trimmed_mean(foreign_request, KEEP)?;
    let self_ = trimmed_mean(loaded, KEEP)?;
    let foreign = 60_000.0 / ((tcp + req) / 2.0);
    let loaded = 60_000.0 / self_;
    Some(((foreign + loaded) / 2.0, foreign, loaded))
}

/// The draft's bands: < 300 poor, 300..1000 fair, 1000..6000 good, above excellent.
pub fn band(rpm: f64) -> &'static str {
    match rpm {
        r if r < 300.0 => "poor",
        r if r < 1000.0 => "fair",
        r if r < 6000.0 => "good",
        _ => "excellent",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_second_of_bloat_is_60_rpm() {
        let (r, f, l) = rpm(&[1000.0; 20], &[1000.0; 20], &[1000.0; 20]).unwrap();
        assert_eq!((r, f, l), (60.0, 60.0, 60.0));
        assert_eq!(band(r), "poor");
    }

    #[test]
    fn foreign_and_loaded_are_averaged_after_inversion() {
        // 10 ms foreign (6000), 100 ms loaded (600): RPM = 3300.
        let (r, f, l) = rpm(&[10.0], &[10.0], &[100.0]).unwrap();
        assert_eq!((f, l), (6000.0, 600.0));
        assert_eq!(r, 3300.0);
        assert_eq!(band(r), "good");
        assert_eq!(band(7000.0), "excellent");
        assert!(rpm(&[], &[1.0], &[1.0]).is_none());
    }
}
