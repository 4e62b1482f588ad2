//! `test marks`: what became of each DSCP and ECN code point on the way to the server and
//! back. A summary's `marks`.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MarksReport {
    /// Client to server: what the server saw each code point arrive as.
    pub up: Vec<MarkFate>,
    /// Server to client: what each code point the server sent arrived as here.
    pub down: Vec<MarkFate>,
    /// Whether the server said what its requests arrived with (a server older than `test
    /// marks`, or one whose socket cannot read the TOS byte, does not: `up` is then unknown).
    pub up_read: bool,
    /// Probes the server received (its report), when it sent one: with the replies, which way
    /// the lost probes were lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_received: Option<u64>,
    /// What the fates mean for the user, most important first.
    pub verdicts: Vec<MarksVerdict>,
    /// TCP: each DSCP on a connection's SYN, as the server's kernel saw it arrive (the way out
    /// only: Linux gives the connecting side nothing of the way in to read).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp_up: Vec<MarkFate>,
    /// With `--locate`: what each hop's ICMP error quoted of the probes that reached it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hops: Vec<MarkHop>,
    /// With `--locate`: where each mark that changed on the way out was first seen changed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<MarkChange>,
}

/// One hop of a TTL-limited walk towards the server: the TOS bytes its Time Exceeded (or, at
/// the destination, Port Unreachable) quoted, as that host received the probes.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MarkHop {
    pub hop: u8,
    /// Who answered (the first answer's source).
    pub from: Option<String>,
    /// The destination itself answered.
    pub destination: bool,
    pub seen: Vec<HopSeen>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HopSeen {
    pub sent: u8,
    pub arrived: u8,
}

/// A mark first seen changed at `hop`: it left this host as `sent` and arrived there as
/// `arrived`, while every hop before it that answered (up to `last_as_sent`; 0: this host)
/// saw it as sent.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MarkChange {
    /// "dscp" or "ecn".
    pub field: String,
    pub sent: String,
    pub arrived: String,
    pub hop: u8,
    pub from: Option<String>,
    pub last_as_sent: u8,
}

/// One code point, one direction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MarkFate {
    /// The TOS byte sent (DSCP << 2 | ECN), and its name ("EF/ect0").
    pub sent: u8,
    pub name: String,
    pub probes: u32,
    /// Probes whose arrival this direction saw.
    pub arrived: u32,
    /// The TOS bytes they arrived with.
    pub arrived_as: Vec<Arrival>,
    pub dscp: Fate,
    pub ecn: Fate,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Arrival {
    pub tos: u8,
    pub name: String,
    pub count: u32,
}

/// What became of a mark (the DSCP or the ECN field of a code point) in one direction.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "fate", rename_all = "snake_case")]
pub enum Fate {
    /// Every probe arrived with the mark it was sent with.
    Kept,
    /// Every probe arrived with the field zeroed (CS0, Not-ECT).
    Bleached,
    /// Every probe arrived with one other value.
    Remapped { to: String },
    /// ECN only: ECT probes arrived CE, some or all (a queue on the way marked them).
    Marked { ce: u32 },
    /// The probes arrived with different values.
    Mixed,
    /// None arrived while probes of other marks did.
    Dropped,
    /// This direction could not be read (an older server), or no probe of any mark arrived.
    Unknown,
}

/// One finding: a stable code for programs, a sentence for people.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MarksVerdict {
    pub code: String,
    pub text: String,
}

/// One probe of `test marks`, as sent and as it came back: the raw samples of the run (its
/// metadata's `params.probes`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MarkProbe {
    /// Seconds from the start.
    pub t: f64,
    /// The TOS byte the request left with, which its reply asked for too.
    pub sent: u8,
    /// Round trip, ms; `None` when no reply came.
    pub rtt_ms: Option<f64>,
    /// The TOS the request arrived at the server with (when the server said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_arrived: Option<u8>,
    /// The TOS the server's socket sent the reply with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_sent: Option<u8>,
    /// The TOS the reply arrived here with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_arrived: Option<u8>,
}
