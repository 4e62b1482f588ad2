//! Rates and durations as people write them for `tc`, read one way everywhere: command-line
//! flags, topology files, `lab set`, CAKE's words and rate schedules.
//!
//! Rates follow iproute2's `get_rate` suffixes (`bit`, `kbit`, `mbit`, `gbit`, `tbit`, and the
//! binary `kibit` ... `tibit`), case-insensitive. Two of tc's readings are refused instead of
//! followed, because people mean something else by them and a shaper set 8x off bloats silently:
//! a bare number (tc: bit/s; people write `--down 60` meaning Mbit/s) and the `bps` family
//! (tc: *bytes* per second; people write `100Mbps` meaning megabits).
//!
//! Durations follow `get_time`'s units (`s`/`sec`/`secs`, `ms`/`msec`/`msecs`, `us`/`usec`/
//! `usecs`) plus `ns`; a unit is required (tc reads a bare number as microseconds, people as
//! seconds or milliseconds) except for `0`.
//!
//! And back to text: `ms` writes milliseconds with a precision that suits their size.

pub mod marks;

use std::time::Duration;

/// The largest rate read: 10 Tbit/s.
pub const MAX_RATE_BPS: f64 = 1e13;
/// The longest duration read: one hour (CAKE's `interplanetary` round trip).
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// Splits `12.5mbit` into its number and its (lower-case) suffix; `what` and `example` name the
/// quantity when there is no number.
fn number_and_suffix<'a>(
    t: &'a str,
    what: &str,
    example: &str,
) -> Result<(&'a str, String), String> {
    let at = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    match &t[..at] {
        "" => Err(format!(
            "{what} `{t}`: want a number and a unit, e.g. {example}"
        )),
        num => Ok((num, t[at..].trim().to_ascii_lowercase())),
    }
}

/// Bits per second, e.g. `57mbit`, `57000kbit`, `1.5Gbit`, `512kibit`.
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, suffix) = number_and_suffix(t, "rate", "57mbit")?;
    let mult = match suffix.as_str() {
        "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "kibit" => 1024.0,
        "mibit" => 1024f64.powi(2),
        "gibit" => 1024f64.powi(3),
        "tibit" => 1024f64.powi(4),
        "" => {
            return Err(format!(
                "rate `{t}`: write it with a unit, e.g. 57mbit, 900kbit, 1gbit"
            ))
        }
        x if x.ends_with("bps") => {
            let prefix = &x[..x.len() - 3];
            let bytes_as_bits = num
                .parse::<f64>()
                .map(|v| format!(", {}{prefix}bit if you mean bytes", v * 8.0))
                .unwrap_or_default();
            return Err(format!(
                "rate `{t}`: tc reads `{x}` as bytes per second, people often as \
                bits; write {num}{prefix}bit if you mean bits{bytes_as_bits}"
            ));
        }
        x => {
            return Err(format!(
            "rate `{t}`: unknown unit `{x}`; want bit, kbit, mbit, gbit (or kibit, mibit, gibit)"
        ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("rate `{t}`: `{num}` is not a number"))?;
    let bps = v * mult;
    if !(1.0..=MAX_RATE_BPS).contains(&bps) {
        return Err(format!("rate `{t}`: want 1 bit/s to 10 Tbit/s"));
    }
    Ok(bps.round() as u64)
}

/// A size in bytes, e.g. `5GB`, `500MB`, `1.5GiB`, `0` (SI units are powers of 1000, as disks
/// and data plans count them). A `/day` after it is allowed and ignored (`--budget 5GB/day`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let body = t.strip_suffix("/day").unwrap_or(t);
    let (num, suffix) = number_and_suffix(body, "size", "5GB")?;
    let mult = match suffix.as_str() {
        "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "" if num.parse::<f64>() == Ok(0.0) => 0.0,
        "" => return Err(format!("size `{t}`: write it with a unit, e.g. 5GB, 500MB")),
        x => {
            return Err(format!(
                "size `{t}`: unknown unit `{x}`; want B, kB, MB, GB, TB, KiB, MiB or GiB"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("size `{t}`: `{num}` is not a number"))?;
    Ok((v * mult).round() as u64)
}

/// A duration, e.g. `250ms`, `1.5s`, `100us`, `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, suffix) = number_and_suffix(t, "duration", "250ms")?;
    let scale = match suffix.as_str() {
        "s" | "sec" | "secs" => 1.0,
        "ms" | "msec" | "msecs" => 1e-3,
        "us" | "usec" | "usecs" => 1e-6,
        "ns" => 1e-9,
        "" if num.parse::<f64>() == Ok(0.0) => 0.0,
        "" => {
            return Err(format!(
                "duration `{t}`: write it with a unit, e.g. 250ms, 1.5s, 100us"
            ))
        }
        x => {
            return Err(format!(
                "duration `{t}`: unknown unit `{x}`; want s, ms, us or ns"
            ))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("duration `{t}`: `{num}` is not a number"))?;
    let secs = v * scale;
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!("duration `{t}`: want at most an hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Milliseconds with a precision that suits their size.
pub fn ms(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("{v:.3} ms")
    } else if v.abs() < 100.0 {
        format!("{v:.1} ms")
    } else {
        format!("{v:.0} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_tc_reads_its_bit_units() {
        assert_eq!(parse_bytes("5GB/day"), Ok(5_000_000_000));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1_610_612_736));
        assert_eq!(parse_bytes("0"), Ok(0));
        assert!(parse_bytes("5").unwrap_err().contains("with a unit"));
        assert!(parse_bytes("5 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert_eq!(parse_rate("57mbit"), Ok(57_000_000));
        assert_eq!(parse_rate("57Mbit"), Ok(57_000_000));
        assert_eq!(parse_rate("57000kbit"), Ok(57_000_000));
        assert_eq!(parse_rate("1.5Gbit"), Ok(1_500_000_000));
        assert_eq!(parse_rate("3.8mbit"), Ok(3_800_000));
        assert_eq!(parse_rate(" 64000bit "), Ok(64_000));
        assert_eq!(parse_rate("2tbit"), Ok(2_000_000_000_000));
        // tc's binary prefixes: Ki = 1024.
        assert_eq!(parse_rate("512Kibit"), Ok(524_288));
        assert_eq!(parse_rate("1Gibit"), Ok(1 << 30));
    }

    #[test]
    fn rates_tc_and_people_read_differently_are_refused() {
        assert!(
            parse_rate("60").unwrap_err().contains("unit"),
            "a bare number: tc says bit/s, people mean Mbit/s"
        );
        let e = parse_rate("100Mbps").unwrap_err();
        assert!(
            e.contains("bytes per second")
                && e.contains("100mbit if you mean bits")
                && e.contains("800mbit if you mean bytes"),
            "{e}"
        );
        assert!(parse_rate("fastmbit")
            .unwrap_err()
            .contains("a number and a unit"));
        assert!(parse_rate("10mbits").unwrap_err().contains("unknown unit"));
        assert!(
            parse_rate("0bit").is_err()
                && parse_rate("20tbit").is_err()
                && parse_rate("-1mbit").is_err()
        );
        assert!(parse_rate("1.2.3mbit").is_err() && parse_rate("").is_err());
    }

    #[test]
    fn durations_need_a_unit_except_zero() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("7.5ms"), Ok(Duration::from_micros(7500)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(
            parse_duration("100usec"),
            Ok(Duration::from_micros(100)),
            "tc's spelling"
        );
        assert_eq!(parse_duration("5msecs"), Ok(Duration::from_millis(5)));
        assert_eq!(parse_duration("20ns"), Ok(Duration::from_nanos(20)));
        assert_eq!(parse_duration("3600s"), Ok(MAX_DURATION));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(
            parse_duration("7").unwrap_err().contains("unit"),
            "tc: microseconds; people: seconds or ms"
        );
        assert!(parse_duration("0.001").is_err());
        assert!(
            parse_duration("3601s").is_err()
                && parse_duration("-1ms").is_err()
                && parse_duration("1min").is_err()
        );
        assert!(parse_duration("ms").is_err());
    }
}
