//! Rates and durations as people write them: `57Mbit`, `57000kbit`, `1Gibit` (binary prefixes
//! Ki/Mi/Gi = 1024^n, SI k/M/G = 1000^n, case-insensitive as tc reads them), `250ms`, `1.5s`.

/// Bits per second.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix("bit").or_else(|| lower.strip_suffix("bps")).ok_or_else(|| format!("rate `{t}`: write it with a unit, e.g. 57Mbit, 900kbit, 1Gibit"))?;
    let (num, mult) = [("ki", 1024f64), ("mi", 1024f64.powi(2)), ("gi", 1024f64.powi(3)), ("k", 1e3), ("m", 1e6), ("g", 1e9)]
        .iter()
        .find_map(|(p, m)| body.strip_suffix(p).map(|n| (n, *m)))
        .unwrap_or((body, 1.0));
    let v: f64 = num.trim().parse().map_err(|_| format!("rate `{t}`: `{num}` is not a number"))?;
    let bps = v * mult;
    if !(bps.is_finite() && (1.0..=1e13).contains(&bps)) {
        return Err(format!("rate `{t}`: want 1 bit/s to 10 Tbit/s"));
    }
    Ok(bps.round() as u64)
}

/// Nanoseconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = [("ns", 1f64), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n, *m)))
        .ok_or_else(|| format!("duration `{t}`: write it with a unit, e.g. 250ms, 1.5s"))?;
    let v: f64 = num.trim().parse().map_err(|_| format!("duration `{t}`: `{num}` is not a number"))?;
    let ns = v * mult;
    if !(ns.is_finite() && (0.0..=3.6e12).contains(&ns)) {
        return Err(format!("duration `{t}`: want 0 to 1 hour"));
    }
    Ok(ns.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn si_and_binary_prefixes() {
        assert_eq!(parse_rate("1Gibit").unwrap(), 1 << 30);
        assert_eq!(parse_rate("57Mbit").unwrap(), 57_000_000);
        assert_eq!(parse_rate("57000kbit").unwrap(), 57_000_000);
        assert_eq!(parse_rate("3.8mbit").unwrap(), 3_800_000);
        assert_eq!(parse_rate("512Kibit").unwrap(), 524_288);
        assert!(parse_rate("60").unwrap_err().contains("unit"));
        assert!(parse_rate("fastMbit").is_err() && parse_rate("0bit").is_err());
        assert_eq!(parse_duration("250ms").unwrap(), 250_000_000);
        assert_eq!(parse_duration("1.5s").unwrap(), 1_500_000_000);
        assert!(parse_duration("1.5").is_err());
    }
}
