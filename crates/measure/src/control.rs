//! The control connection: handshake, then a watcher that notices the server leaving, then the
//! final report.

use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_proto::{self as proto, ClientMsg, RefuseReason, ServerMsg, TestRequest, Token};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
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
    /// Bytes read from the server so far: a report still arriving is not a server gone.
    received: Arc<AtomicU64>,
}

/// A line reader that counts what it took.
struct Counted<R> {
    inner: R,
    taken: Arc<AtomicU64>,
}

impl<R: BufRead> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.taken.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.taken.fetch_add(n as u64, Ordering::Relaxed);
        self.inner.consume(n)
    }
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

/// The watcher of the control connection after the handshake: what it read (the report, or
/// `None` when the server left), and how many bytes of it so far.
fn watch(reader: BufReader<TcpStream>) -> (mpsc::Receiver<Option<ServerMsg>>, Arc<AtomicU64>) {
    let (tx, incoming) = mpsc::channel();
    let received = Arc::new(AtomicU64::new(0));
    let mut reader = Counted {
        inner: reader,
        taken: received.clone(),
    };
    std::thread::spawn(move || {
        // The only line after the handshake is the report, the longest the server sends.
        let msg = netio::read_line(&mut reader, proto::MAX_REPORT_LINE)
            .ok()
            .flatten()
            .and_then(|l| proto::decode_line_within::<ServerMsg>(&l, proto::MAX_REPORT_LINE).ok())
            .map(ServerMsg::printable);
        let _ = tx.send(msg);
    });
    (incoming, received)
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
        let (incoming, received) = watch(reader);
        Ok(Control {
            addr,
            token,
            server,
            stream,
            incoming,
            received,
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

    /// Says `finish` and waits for the server's counts: up to `patience` for them to start or
    /// to go on arriving, at most `proto::REPORT_DEADLINE` in all. A 10-minute test's report is a
    /// megabyte or two (each download flow's acknowledged bytes every 10 ms; a UDP load's
    /// arrival profile): seconds on a slow download.
    pub fn finish(mut self, patience: Duration) -> Option<Report> {
        self.stream
            .write_all(&proto::encode_line(&ClientMsg::Finish))
            .ok()?;
        let end = Instant::now() + proto::REPORT_DEADLINE;
        let (mut taken, mut moved) = (self.received.load(Ordering::Relaxed), Instant::now());
        loop {
            let give_up = (moved + patience).min(end);
            let wait = give_up.saturating_duration_since(Instant::now());
            match self
                .incoming
                .recv_timeout(wait.min(Duration::from_millis(200)))
            {
                Ok(Some(ServerMsg::Report {
                    streams,
                    flows,
                    udp,
                })) => {
                    return Some(Report {
                        streams,
                        flows,
                        udp,
                    })
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let n = self.received.load(Ordering::Relaxed);
                    if n != taken {
                        (taken, moved) = (n, Instant::now());
                    }
                    if Instant::now() >= (moved + patience).min(end) {
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A report of `kb` kB: one download's acknowledged bytes.
    fn report(kb: usize) -> Vec<u8> {
        let flow = proto::FlowReport {
            id: 1,
            bytes: 1,
            cc: None,
            acked: Some(proto::AckedBytes {
                bucket_us: 10_000,
                first_ns: 0,
                buckets: vec![99_999; kb * 1024 / 6],
            }),
        };
        proto::encode_line(&ServerMsg::Report {
            streams: Vec::new(),
            flows: vec![flow],
            udp: Vec::new(),
        })
    }

    /// A control connection past its handshake, and the server's end of it.
    fn connected() -> (Control, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stream = TcpStream::connect(addr).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (incoming, received) = watch(BufReader::new(stream.try_clone().unwrap()));
        let control = Control {
            addr,
            token: Token([0; 16]),
            server: ServerInfo {
                version: String::new(),
                default_cc: None,
                kernel: None,
            },
            stream,
            incoming,
            received,
        };
        (control, server)
    }

    /// The server sends `line` in 4 kB pieces every `every`, or only its first `upto` bytes.
    fn serve(mut server: TcpStream, line: Vec<u8>, every: Duration, upto: usize) {
        std::thread::spawn(move || {
            let mut finish = String::new();
            BufReader::new(server.try_clone().unwrap())
                .read_line(&mut finish)
                .unwrap();
            assert!(finish.contains("finish"), "{finish}");
            for piece in line[..upto.min(line.len())].chunks(4096) {
                std::thread::sleep(every);
                if server.write_all(piece).is_err() {
                    return;
                }
            }
            // Held open: a server that stops sending mid-report has not left.
            std::thread::sleep(Duration::from_secs(5));
        });
    }

    /// A 200 kB report that takes 1.5 s to arrive (a 10-minute test's over a slow download is
    /// ten times that) with a patience of 300 ms: it arrives, as it keeps coming; one that
    /// stops half-way is given up a patience after its last byte, not at the total deadline.
    #[test]
    fn a_report_that_keeps_arriving_is_waited_for_and_one_that_stops_is_not() {
        let line = report(200);
        let pieces = line.len().div_ceil(4096);
        let every = Duration::from_millis(1500 / pieces as u64);
        let (control, server) = connected();
        serve(server, line.clone(), every, usize::MAX);
        let t = Instant::now();
        let got = control.finish(Duration::from_millis(300));
        assert!(
            t.elapsed() >= Duration::from_millis(1200),
            "{:?}",
            t.elapsed()
        );
        let flows = got.expect("the whole report").flows;
        assert_eq!(
            flows[0].acked.as_ref().unwrap().buckets.len(),
            200 * 1024 / 6
        );

        let (control, server) = connected();
        serve(server, line.clone(), every, line.len() / 2);
        let t = Instant::now();
        assert!(control.finish(Duration::from_millis(300)).is_none());
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(750) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
    }
}
