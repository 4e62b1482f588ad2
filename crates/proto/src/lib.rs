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
/// Both ends give the final report this long in all while its bytes keep moving (4 MB takes
/// 34 s at 1 Mbit/s).
pub const REPORT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

pub use bloatlab_units::marks::{dscp_name, parse_dscp, tally_tos};
