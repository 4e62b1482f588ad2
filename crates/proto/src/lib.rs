//! The bloatlab wire protocol, shared by client and server. Pure data and (de)serialization:
//! no sockets here, so every parser can be unit-tested and fuzzed directly.
//!
//! One TCP port carries every connection; each begins with one JSON line ([`ClientMsg`]) that
//! says what it is: a control connection (`hello`), a bulk data flow (`data_hello`, followed by
//! [`frame`]s) or a new-connection responsiveness probe (`probe_hello`). The UDP port of the same
//! number echoes [`probe`] packets for tests that completed the control handshake.

pub mod auth;
pub mod buckets;
pub mod control;
pub mod frame;
pub mod probe;

pub use control::*;

/// Version of the control protocol, the frame format and the probe format together. 2: host
/// details moved from `hello_ok` to `accepted`, the optional shared-key handshake, probe MACs.
pub const PROTOCOL_VERSION: u32 = 2;
/// Sent in every hello so that a stray client of another protocol is told apart from an old
/// bloatlab.
pub const MAGIC: &str = "bloatlab";
/// Default TCP and UDP port of `bloatlab server`.
pub const DEFAULT_PORT: u16 = 9461;
/// Longest control line accepted; a peer that sends more is not speaking this protocol.
pub const MAX_LINE: usize = 64 * 1024;
/// Longest final report accepted: it carries a UDP load's arrival profile (a number per
/// millisecond bucket; a 180 s test at 1 ms is about 1.3 MB).
pub const MAX_REPORT_LINE: usize = 4 * 1024 * 1024;

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

#[cfg(test)]
mod dscp_tests {
    use super::*;

    #[test]
    fn names_round_trip() {
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
}
