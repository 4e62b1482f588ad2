//! The control connection: handshake, then a watcher that notices the server leaving, then the
//! final report.

use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_proto::{self as proto, ClientMsg, RefuseReason, ServerMsg, TestRequest, Token};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The whole handshake (hello, test request, acceptance) must be done within this time, however
/// the server dribbles its answers.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);

/// The server's counts at the end of a test.
pub struct Report {
    pub streams: Vec<proto::StreamReport>,
    pub flows: Vec<proto::FlowReport>,
    pub udp: Vec<proto::UdpLoadReport>,
}

pub struct ServerInfo {
    pub version: String,
    /// `None` when the server keeps its host details to itself (unauthenticated clients).
    pub default_cc: Option<String>,
    pub kernel: Option<String>,
}

pub struct Control {
    pub addr: SocketAddr,
    pub token: Token,
    pub server: ServerInfo,
    stream: TcpStream,
    /// What the watcher read after the handshake: the report, or `None` when the server left.
    incoming: mpsc::Receiver<Option<ServerMsg>>,
}

/// Connects to the first address that answers.
pub fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, MeasureError> {
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) => {
                last = Some(MeasureError::Unreachable {
                    addr: *a,
                    source: e,
                })
            }
        }
    }
    Err(last.expect("at least one address"))
}

fn refusal(addr: SocketAddr, reason: RefuseReason, message: String) -> MeasureError {
    match reason {
        RefuseReason::Version | RefuseReason::BadRequest => MeasureError::Version { addr, message },
        RefuseReason::Busy => MeasureError::Busy(message),
        RefuseReason::Limit => MeasureError::Refused(message),
        RefuseReason::Token => MeasureError::Token(message),
        RefuseReason::Auth => MeasureError::Auth(message),
        RefuseReason::Forbidden => MeasureError::Refused(message),
    }
}

/// The next message, read by `deadline` (the socket's read timeout is what is left of it
/// before every read, so a trickle cannot stretch it).
fn read_msg(
    reader: &mut BufReader<TcpStream>,
    addr: SocketAddr,
    deadline: Instant,
) -> Result<ServerMsg, MeasureError> {
    let mut by_deadline = DeadlineReader {
        inner: reader,
        deadline,
    };
    match netio::read_line(&mut by_deadline, proto::MAX_LINE) {
        Ok(Some(line)) => proto::decode_line::<ServerMsg>(&line)
            .map(ServerMsg::printable)
            .map_err(|e| MeasureError::Version {
                addr,
                message: e.to_string(),
            }),
        Ok(None) => Err(MeasureError::HandshakeLost),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(MeasureError::Version {
                addr,
                message: format!(
                    "no complete answer within {} s",
                    HANDSHAKE_DEADLINE.as_secs()
                ),
            })
        }
        Err(e) => Err(MeasureError::io(format!("reading from {addr}"))(e)),
    }
}

/// A `BufRead` over the control connection whose every read ends by a deadline.
struct DeadlineReader<'a> {
    inner: &'a mut BufReader<TcpStream>,
    deadline: Instant,
}

impl std::io::Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.arm()?;
        self.inner.read(buf)
    }
}

impl std::io::BufRead for DeadlineReader<'_> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.inner.buffer().is_empty() {
            self.arm()?;
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.inner.consume(n)
    }
}

impl DeadlineReader<'_> {
    fn arm(&self) -> std::io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.inner.get_ref().set_read_timeout(Some(left))
    }
}

/// First line on any connection to the server, then its answer (within `deadline`).
pub fn hello(
    stream: &mut TcpStream,
    reader: &mut BufReader<TcpStream>,
    addr: SocketAddr,
    msg: &ClientMsg,
    deadline: Instant,
) -> Result<ServerMsg, MeasureError> {
    stream
        .write_all(&proto::encode_line(msg))
        .map_err(MeasureError::io(format!("writing to {addr}")))?;
    match read_msg(reader, addr, deadline)? {
        ServerMsg::Refused { reason, message } => Err(refusal(addr, reason, message)),
        other => Ok(other),
    }
}

impl Control {
    /// The handshake: hello (the server must speak this protocol version), the test request
    /// (answering the server's challenge with `key` when it has one), acceptance.
    pub fn open(
        addrs: &[SocketAddr],
        mut request: TestRequest,
        key: Option<&[u8]>,
    ) -> Result<Control, MeasureError> {
        let deadline = Instant::now() + HANDSHAKE_DEADLINE;
        let mut stream = connect(addrs)?;
        let addr = stream
            .peer_addr()
            .map_err(MeasureError::io("control connection"))?;
        let mut reader = BufReader::new(
            stream
                .try_clone()
                .map_err(MeasureError::io("control connection"))?,
        );
        let hello_msg = ClientMsg::Hello {
            magic: proto::MAGIC.into(),
            version: proto::PROTOCOL_VERSION,
            client_version: env!("CARGO_PKG_VERSION").into(),
        };
        let (version, challenge) =
            match hello(&mut stream, &mut reader, addr, &hello_msg, deadline)? {
                ServerMsg::HelloOk {
                    version,
                    server_version,
                    challenge,
                    ..
                } if version == proto::PROTOCOL_VERSION => (server_version, challenge),
                ServerMsg::HelloOk { version, .. } => {
                    let message = format!(
                        "it speaks protocol version {version}, this client {}: use \
                    the same bloatlab release on both ends",
                        proto::PROTOCOL_VERSION
                    );
                    return Err(MeasureError::Version { addr, message });
                }
                other => {
                    return Err(MeasureError::Version {
                        addr,
                        message: format!("unexpected answer {other:?}"),
                    })
                }
            };
        if let Some(c) = challenge {
            let Some(key) = key else {
                return Err(MeasureError::Auth(
                    "the server requires a key: --key FILE or BLOATLAB_KEY".into(),
                ));
            };
            let c = proto::auth::unhex(&c).ok_or_else(|| MeasureError::Version {
                addr,
                message: "malformed challenge".into(),
            })?;
            request.auth = Some(proto::auth::answer(key, &c));
        }
        let (token, host) = match hello(
            &mut stream,
            &mut reader,
            addr,
            &ClientMsg::Test(request),
            deadline,
        )? {
            ServerMsg::Accepted { token, host, .. } => (token, host),
            other => {
                return Err(MeasureError::Version {
                    addr,
                    message: format!("unexpected answer {other:?}"),
                })
            }
        };
        let server = ServerInfo {
            version,
            default_cc: host.as_ref().map(|h| h.default_cc.clone()),
            kernel: host.map(|h| h.kernel),
        };
        let _ = stream.set_read_timeout(None);
        let (tx, incoming) = mpsc::channel();
        std::thread::spawn(move || {
            // The only line after the handshake is the report, the longest the server sends.
            let msg = netio::read_line(&mut reader, proto::MAX_REPORT_LINE)
                .ok()
                .flatten()
                .and_then(|l| {
                    proto::decode_line_within::<ServerMsg>(&l, proto::MAX_REPORT_LINE).ok()
                })
                .map(ServerMsg::printable);
            let _ = tx.send(msg);
        });
        Ok(Control {
            addr,
            token,
            server,
            stream,
            incoming,
        })
    }

    /// True once the server closed the control connection (crashed, killed, or ended the test
    /// at its own limit).
    pub fn server_gone(&self) -> bool {
        matches!(
            self.incoming.try_recv(),
            Ok(None) | Err(mpsc::TryRecvError::Disconnected)
        )
    }

    /// Says `finish` and waits up to `patience` for the server's counts (a UDP load's arrival
    /// profile makes them long).
    pub fn finish(mut self, patience: Duration) -> Option<Report> {
        self.stream
            .write_all(&proto::encode_line(&ClientMsg::Finish))
            .ok()?;
        match self.incoming.recv_timeout(patience) {
            Ok(Some(ServerMsg::Report {
                streams,
                flows,
                udp,
            })) => Some(Report {
                streams,
                flows,
                udp,
            }),
            _ => None,
        }
    }
}
