//! The marks in an IP header's TOS / traffic-class byte, by the names people write: the DSCP
//! (its top six bits, RFC 2474) as tc, nftables and flent name the code points, and the ECN
//! field (its low two bits, RFC 3168).

/// Name of a DSCP code point as flent and tc use them ("BE", "BK" for CS1, "EF", "AF41", "CS5").
pub fn dscp_name(dscp: u8) -> String {
    match dscp {
        0 => "BE".into(),
        8 => "BK".into(),
        46 => "EF".into(),
        44 => "VA".into(),
        1 => "LE".into(),
        d if d % 8 == 0 => format!("CS{}", d / 8),
        d if (10..=38).contains(&d) && d % 2 == 0 && (d % 8) / 2 >= 1 => {
            format!("AF{}{}", d / 8, (d % 8) / 2)
        }
        d => d.to_string(),
    }
}

/// Parses a DSCP given as a name (case-insensitive: BE, BK, LE, EF, VA, CS0-CS7, AF11-AF43) or a
/// number 0..=63.
pub fn parse_dscp(s: &str) -> Result<u8, String> {
    if let Ok(n) = s.parse::<u8>() {
        return if n <= 63 {
            Ok(n)
        } else {
            Err(format!("DSCP {n} out of range 0..63"))
        };
    }
    let u = s.to_ascii_uppercase();
    (0..=63u8)
        .find(|&d| dscp_name(d) == u || (d == 8 && u == "CS1") || (d == 0 && u == "CS0"))
        .ok_or_else(|| {
            format!(
                "unknown DSCP {s:?}: use a number 0..63 or BE, BK, LE, EF, VA, \
            CS0..CS7, AF11..AF43"
            )
        })
}

/// The ECN field's code points (RFC 3168 §5), by their value in the byte's low two bits.
pub const NOT_ECT: u8 = 0;
pub const ECT1: u8 = 1;
pub const ECT0: u8 = 2;
pub const CE: u8 = 3;

/// "not-ect", "ect1", "ect0" or "ce" for the ECN field's value (its low two bits).
pub fn ecn_name(ecn: u8) -> &'static str {
    match ecn & 3 {
        NOT_ECT => "not-ect",
        ECT1 => "ect1",
        ECT0 => "ect0",
        _ => "ce",
    }
}

/// Parses an ECN code point: not-ect, ect0, ect1, ce (case-insensitive; "ect(0)" and "ect(1)"
/// as RFC 3168 writes them, "non-ect" too).
pub fn parse_ecn(s: &str) -> Result<u8, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "not-ect" | "non-ect" | "notect" => Ok(NOT_ECT),
        "ect1" | "ect(1)" => Ok(ECT1),
        "ect0" | "ect(0)" => Ok(ECT0),
        "ce" => Ok(CE),
        _ => Err(format!(
            "unknown ECN code point {s:?}: use not-ect, ect0, ect1 or ce"
        )),
    }
}

/// Counts one packet that arrived with TOS byte `tos` in `counts` (one pair per distinct byte:
/// at most 256).
pub fn tally_tos(counts: &mut Vec<(u8, u64)>, tos: u8) {
    match counts.iter_mut().find(|c| c.0 == tos) {
        Some(c) => c.1 += 1,
        None => counts.push((tos, 1)),
    }
}

/// The TOS / traffic-class byte of a DSCP and an ECN code point.
pub fn tos(dscp: u8, ecn: u8) -> u8 {
    (dscp << 2) | (ecn & 3)
}

/// "EF/ect1": the marks of a TOS byte, as the results and the terminal show them.
pub fn tos_name(tos: u8) -> String {
    format!("{}/{}", dscp_name(tos >> 2), ecn_name(tos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dscp_names_round_trip() {
        for (n, name) in [
            (0, "BE"),
            (8, "BK"),
            (40, "CS5"),
            (46, "EF"),
            (48, "CS6"),
            (34, "AF41"),
            (10, "AF11"),
            (38, "AF43"),
        ] {
            assert_eq!(dscp_name(n), name);
            assert_eq!(parse_dscp(name), Ok(n));
        }
        assert_eq!(parse_dscp("cs1"), Ok(8));
        assert_eq!(parse_dscp("48"), Ok(48));
        assert!(parse_dscp("64").is_err());
        assert!(parse_dscp("XX").is_err());
    }

    #[test]
    fn ecn_names_round_trip_and_tos_packs_both() {
        for e in 0..4 {
            assert_eq!(parse_ecn(ecn_name(e)), Ok(e));
        }
        assert_eq!(parse_ecn("ECT(1)"), Ok(ECT1));
        assert!(parse_ecn("ect2")
            .unwrap_err()
            .contains("not-ect, ect0, ect1 or ce"));
        // EF (46) with ECT(0): 0xb8 | 0b10, as tcpdump prints "tos 0xba".
        assert_eq!(tos(46, ECT0), 0xba);
        assert_eq!(tos_name(0xba), "EF/ect0");
    }
}
