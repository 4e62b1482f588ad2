//! Control messages: one JSON object per line.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Per-test secret handed out by the server after a completed handshake. UDP probes and data
/// connections must carry it; the server answers nothing that lacks a live token.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(pub [u8; 16]);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({self})")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Token {
    type Err = ProtoError;
    fn from_str(s: &str) -> Result<Self, ProtoError> {
        if s.len() != 32 || !s.is_ascii() {
            return Err(ProtoError::BadToken);
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| ProtoError::BadToken)?;
        }
        Ok(Token(out))
    }
}

impl Serialize for Token {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Direction of a flow or a one-way delay, seen from the client: `down` is server to client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Down,
    Up,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Down => "down",
            Direction::Up => "up",
        }
    }
}

/// One bulk TCP flow of a test.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowSpec {
    pub id: u16,
    pub direction: Direction,
    /// DSCP code point (0..=63) that the sender puts on its packets.
    pub dscp: u8,
    /// Congestion control the sender sets on its socket; `None` keeps the sender's default.
    pub cc: Option<String>,
}

/// One isochronous UDP echo stream (latency probes, VoIP-like calls).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamSpec {
    pub id: u16,
    /// Send interval in microseconds.
    pub interval_us: u32,
    /// UDP payload size in bytes; replies are never longer.
    pub size: u16,
    pub dscp: u8,
    /// The ECN code point of requests and replies alike (RFC 3168: 0 Not-ECT, 1 ECT(1),
    /// 2 ECT(0)), so each way says whether a queue marked them CE.
    #[serde(default)]
    pub ecn: u8,
}

/// A constant-rate UDP stream from the client to the server (`bloatlab test udp`). The server
/// counts its packets ([`crate::probe::Kind::Load`]) and their bytes per bucket of arrival time,
/// and sends nothing back until the report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpLoadSpec {
    pub id: u16,
    /// Average rate of UDP payload the client will send, bits per second.
    pub rate_bps: u64,
    /// UDP payload size, bytes (a probe header and padding).
    pub size: u16,
    pub dscp: u8,
    /// The ECN code point every packet carries (RFC 3168: 0 Not-ECT, 1 ECT(1), 2 ECT(0)): the
    /// server counts those that arrive CE, marked by a queue on the way.
    #[serde(default)]
    pub ecn: u8,
    /// Width of the arrival-profile buckets, microseconds.
    pub bucket_us: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestRequest {
    /// Test name, for the server's log only.
    pub test: String,
    /// Whole test length, idle phase included, in milliseconds.
    pub duration_ms: u64,
    pub flows: Vec<FlowSpec>,
    pub streams: Vec<StreamSpec>,
    /// Whether the client will open new-connection probes (RPM).
    #[serde(default)]
    pub connection_probes: bool,
    /// UDP load streams (client to server), for `test udp`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub udp_loads: Vec<UdpLoadSpec>,
    /// With a keyed server: the HMAC of its challenge ([`crate::auth::answer`]), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClientMsg {
    Hello {
        magic: String,
        version: u32,
        client_version: String,
    },
    Test(TestRequest),
    /// First line of a bulk data connection; frames follow in both directions.
    DataHello {
        token: Token,
        flow: u16,
    },
    /// First line of a new-connection probe; the server answers `probe_reply` at once.
    ProbeHello {
        token: Token,
    },
    /// The client is done; the server answers with a `report` and closes.
    Finish,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefuseReason {
    /// Not a bloatlab client, or a protocol version this server does not speak.
    Version,
    /// The server already runs its maximum number of tests.
    Busy,
    /// The request exceeds a server limit (duration, flows, probe rate, size).
    Limit,
    /// The token is unknown or expired, or the connection comes from another address.
    Token,
    /// The message could not be understood.
    BadRequest,
    /// The server requires its shared key and the client did not prove it holds it.
    Auth,
    /// The client's address is not among those the server serves.
    Forbidden,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamReport {
    pub id: u16,
    /// Requests accepted and echoed.
    pub received: u64,
    /// Requests the server itself declined (its rate limit); these are not network loss.
    pub server_limited: u64,
    /// The DSCP the server's replies carried, read back from its socket after setting it
    /// (absent from older servers, or when the mark could not be set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dscp_applied: Option<u8>,
    /// The TOS bytes the accepted requests arrived with, and how many of each (at most 256
    /// pairs; absent from servers before it, and where the socket could not read them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub arrived: Vec<(u8, u64)>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    pub id: u16,
    /// Payload bytes the server received (upload) or wrote to the socket (download).
    pub bytes: u64,
    /// Congestion control in effect on the server's socket.
    pub cc: Option<String>,
    /// Downloads: what the client acknowledged, as the server's socket saw it (absent from
    /// older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked: Option<AckedBytes>,
}

/// A download's bytes the client acknowledged (TCP_INFO `bytes_acked` plus what it holds
/// beyond a hole, selectively acknowledged), per bucket of `bucket_us` from `first_ns` (the
/// server's monotonic clock, as probe replies carry it). This is the rate the line delivered:
/// the receiver's reads jump when a lost segment fills a hole and releases what waited behind.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AckedBytes {
    pub bucket_us: u32,
    pub first_ns: u64,
    pub buckets: Vec<u32>,
}

/// What the server saw of one UDP load stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UdpLoadReport {
    pub id: u16,
    /// Distinct packets received (by sequence number) and their UDP payload bytes.
    pub received: u64,
    pub bytes: u64,
    /// Packets that arrived again (same sequence number): not counted above.
    pub duplicates: u64,
    /// Packets that arrived after one with a higher sequence number.
    pub reordered: u64,
    /// Packets beyond what the announced rate allows (twice it, with a second of burst):
    /// declined by the server, not network loss.
    pub server_limited: u64,
    /// Of the packets received, those that arrived CE (absent from servers before it).
    #[serde(default)]
    pub ce: u64,
    /// Datagrams the server's host dropped for a full socket buffer during the test (its
    /// network namespace's UDP RcvbufErrors, which other UDP traffic there shares), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_drops: Option<u64>,
    /// Bytes received per bucket of `bucket_us`, the first bucket starting at `first_recv_ns`
    /// (the server's monotonic clock, as probe replies carry it).
    pub bucket_us: u32,
    pub first_recv_ns: u64,
    pub buckets: Vec<u32>,
}

/// What a server tells of its host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    pub kernel: String,
    /// The system-wide TCP congestion control.
    pub default_cc: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerMsg {
    HelloOk {
        version: u32,
        server_version: String,
        max_duration_ms: u64,
        /// Present when the server requires its shared key: answer it in the test request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        challenge: Option<String>,
    },
    Accepted {
        token: Token,
        max_duration_ms: u64,
        /// The server's host, for the result's metadata; only to authenticated clients, or to
        /// all when the operator allows it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<HostInfo>,
    },
    /// Answer to `data_hello`: frames follow. `cc` is the server socket's congestion control,
    /// `dscp` the mark its socket carries, read back after setting it.
    DataOk {
        cc: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dscp: Option<u8>,
    },
    Refused {
        reason: RefuseReason,
        message: String,
    },
    /// Answer to `probe_hello`. `syn_tos`: the TOS byte (traffic class) the connection's SYN
    /// arrived with, as the server's kernel kept it (`test marks`: what TCP's marks became on
    /// the way in); absent from older servers and where the kernel gives none.
    ProbeReply {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        syn_tos: Option<u8>,
    },
    Report {
        streams: Vec<StreamReport>,
        flows: Vec<FlowReport>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        udp: Vec<UdpLoadReport>,
    },
}

/// Longest text from a peer that is shown as it came.
const PRINTABLE_MAX: usize = 200;

/// `text` from a peer made safe for a terminal or a log: control characters (escape sequences,
/// carriage returns, bidirectional overrides) shown escaped, and at most 200 characters kept.
pub fn printable(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == PRINTABLE_MAX {
            out.push_str("...");
            break;
        }
        let bidi = matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        );
        if c.is_control() || bidi {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

impl ServerMsg {
    /// The message with every text field passed through [`printable`]: what a client keeps of
    /// a server's words before they can reach a terminal.
    pub fn printable(self) -> ServerMsg {
        let opt = |o: Option<String>| o.map(|s| printable(&s));
        match self {
            ServerMsg::HelloOk {
                version,
                server_version,
                max_duration_ms,
                challenge,
            } => ServerMsg::HelloOk {
                version,
                server_version: printable(&server_version),
                max_duration_ms,
                challenge: opt(challenge),
            },
            ServerMsg::Accepted {
                token,
                max_duration_ms,
                host,
            } => ServerMsg::Accepted {
                token,
                max_duration_ms,
                host: host.map(|h| HostInfo {
                    kernel: printable(&h.kernel),
                    default_cc: printable(&h.default_cc),
                }),
            },
            ServerMsg::DataOk { cc, dscp } => ServerMsg::DataOk { cc: opt(cc), dscp },
            ServerMsg::Refused { reason, message } => ServerMsg::Refused {
                reason,
                message: printable(&message),
            },
            ServerMsg::Report {
                streams,
                flows,
                udp,
            } => ServerMsg::Report {
                streams,
                flows: flows
                    .into_iter()
                    .map(|f| FlowReport { cc: opt(f.cc), ..f })
                    .collect(),
                udp,
            },
            ServerMsg::ProbeReply { syn_tos } => ServerMsg::ProbeReply { syn_tos },
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("malformed token")]
    BadToken,
    #[error("line longer than {0} bytes")]
    LineTooLong(usize),
    #[error("malformed message: {0}")]
    Json(String),
}

/// Serializes a message as one line, newline included.
pub fn encode_line<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut v = serde_json::to_vec(msg).expect("protocol messages always serialize");
    v.push(b'\n');
    v
}

/// Parses one line (without or with its newline).
pub fn decode_line<'a, T: Deserialize<'a>>(line: &'a [u8]) -> Result<T, ProtoError> {
    decode_line_within(line, crate::MAX_LINE)
}

/// Parses one line of at most `max` bytes: the final report may be longer than other lines
/// ([`crate::MAX_REPORT_LINE`]).
pub fn decode_line_within<'a, T: Deserialize<'a>>(
    line: &'a [u8],
    max: usize,
) -> Result<T, ProtoError> {
    if line.len() > max {
        return Err(ProtoError::LineTooLong(max));
    }
    serde_json::from_slice(line).map_err(|e| ProtoError::Json(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client from before `syn_tos` (whose `probe_reply` had no fields) still reads a new
    /// server's answer, and a new client reads an old server's.
    #[test]
    fn probe_reply_with_and_without_syn_tos_reads_both_ways() {
        #[derive(Deserialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Before {
            ProbeReply,
        }
        let new = encode_line(&ServerMsg::ProbeReply { syn_tos: Some(184) });
        assert!(matches!(
            decode_line::<Before>(&new),
            Ok(Before::ProbeReply)
        ));
        let old = br#"{"type":"probe_reply"}"#;
        assert_eq!(
            decode_line::<ServerMsg>(old).unwrap(),
            ServerMsg::ProbeReply { syn_tos: None }
        );
    }

    #[test]
    fn token_round_trips_as_hex() {
        let t = Token([0xab; 16]);
        let s = t.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<Token>().unwrap(), t);
        assert!("zz".parse::<Token>().is_err());
        assert!("é".repeat(16).parse::<Token>().is_err());
    }

    #[test]
    fn messages_round_trip() {
        let m = ClientMsg::Test(TestRequest {
            test: "rrul".into(),
            duration_ms: 35_000,
            flows: vec![FlowSpec {
                id: 1,
                direction: Direction::Up,
                dscp: 46,
                cc: Some("cubic".into()),
            }],
            streams: vec![StreamSpec {
                id: 0,
                interval_us: 10_000,
                size: 64,
                dscp: 0,
                ecn: 0,
            }],
            connection_probes: false,
            udp_loads: vec![UdpLoadSpec {
                id: 3,
                rate_bps: 50_000_000,
                size: 1024,
                dscp: 0,
                ecn: 0,
                bucket_us: 1000,
            }],
            auth: None,
        });
        let line = encode_line(&m);
        assert_eq!(*line.last().unwrap(), b'\n');
        assert_eq!(decode_line::<ClientMsg>(&line).unwrap(), m);
        let r = ServerMsg::Refused {
            reason: RefuseReason::Busy,
            message: "2 tests running".into(),
        };
        assert_eq!(decode_line::<ServerMsg>(&encode_line(&r)).unwrap(), r);
    }

    #[test]
    fn a_servers_words_reach_the_terminal_escaped_and_bounded() {
        // A terminal escape that would clear the screen, a fake newline, a bidi override.
        let evil = "busy\u{1b}[2J\r\nok \u{202e}txt.exe";
        let m = ServerMsg::Refused {
            reason: RefuseReason::Busy,
            message: evil.into(),
        }
        .printable();
        let ServerMsg::Refused { message, .. } = m else {
            unreachable!()
        };
        assert_eq!(message, "busy\\u{1b}[2J\\r\\nok \\u{202e}txt.exe");
        assert!(!message.chars().any(|c| c.is_control()));
        let long = printable(&"é".repeat(10_000));
        assert_eq!(long.chars().count(), 203, "200 characters and an ellipsis");
        let hello = ServerMsg::HelloOk {
            version: 2,
            server_version: "1\u{7}".into(),
            max_duration_ms: 1,
            challenge: None,
        };
        let ServerMsg::HelloOk { server_version, .. } = hello.printable() else {
            unreachable!()
        };
        assert_eq!(server_version, "1\\u{7}");
        let host = Some(HostInfo {
            kernel: "6.1\u{1b}]0;x\u{7}".into(),
            default_cc: "bbr".into(),
        });
        let ServerMsg::Accepted { host, .. } = (ServerMsg::Accepted {
            token: Token([0; 16]),
            max_duration_ms: 1,
            host,
        })
        .printable() else {
            unreachable!()
        };
        assert_eq!(host.unwrap().kernel, "6.1\\u{1b}]0;x\\u{7}");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode_line::<ClientMsg>(b"GET / HTTP/1.1").is_err());
        assert!(decode_line::<ClientMsg>(&vec![b'{'; crate::MAX_LINE + 1]).is_err());
    }
}
