//! The control connection: handshake, then a watcher that notices the server leaving, then the
//! final report.

use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_proto::{self as proto, ClientMsg, RefuseReason, ServerMsg, TestRequest, Token};
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub struct ServerInfo {
    pub version: String,
    pub default_cc: String,
    pub kernel: String,
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
            Err(e) => last = Some(MeasureError::Unreachable { addr: *a, source: e }),
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
    }
}

fn read_msg(reader: &mut BufReader<TcpStream>, addr: SocketAddr) -> Result<ServerMsg, MeasureError> {
    match netio::read_line(reader, proto::MAX_LINE) {
        Ok(Some(line)) => proto::decode_line::<ServerMsg>(&line).map(ServerMsg::printable).map_err(|e| MeasureError::Version { addr, message: e.to_string() }),
        Ok(None) => Err(MeasureError::HandshakeLost),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            Err(MeasureError::Version { addr, message: "no answer to hello within 5 s".into() })
        }
        Err(e) => Err(MeasureError::io(format!("reading from {addr}"))(e)),
    }
}

/// First line on any connection to the server, then its answer.
pub fn hello(stream: &mut TcpStream, reader: &mut BufReader<TcpStream>, addr: SocketAddr, msg: &ClientMsg) -> Result<ServerMsg, MeasureError> {
    stream.write_all(&proto::encode_line(msg)).map_err(MeasureError::io(format!("writing to {addr}")))?;
    match read_msg(reader, addr)? {
        ServerMsg::Refused { reason, message } => Err(refusal(addr, reason, message)),
        other => Ok(other),
    }
}

impl Control {
    pub fn open(addrs: &[SocketAddr], request: TestRequest) -> Result<Control, MeasureError> {
        let mut stream = connect(addrs)?;
        let addr = stream.peer_addr().map_err(MeasureError::io("control connection"))?;
        let _ = stream.set_read_timeout(Some(CONNECT_TIMEOUT));
        let mut reader = BufReader::new(stream.try_clone().map_err(MeasureError::io("control connection"))?);
        let hello_msg = ClientMsg::Hello {
            magic: proto::MAGIC.into(),
            version: proto::PROTOCOL_VERSION,
            client_version: env!("CARGO_PKG_VERSION").into(),
        };
        let server = match hello(&mut stream, &mut reader, addr, &hello_msg)? {
            ServerMsg::HelloOk { server_version, default_cc, kernel, .. } => ServerInfo { version: server_version, default_cc, kernel },
            other => return Err(MeasureError::Version { addr, message: format!("unexpected answer {other:?}") }),
        };
        let token = match hello(&mut stream, &mut reader, addr, &ClientMsg::Test(request))? {
            ServerMsg::Accepted { token, .. } => token,
            other => return Err(MeasureError::Version { addr, message: format!("unexpected answer {other:?}") }),
        };
        let _ = stream.set_read_timeout(None);
        let (tx, incoming) = mpsc::channel();
        std::thread::spawn(move || {
            let msg = netio::read_line(&mut reader, proto::MAX_LINE)
                .ok()
                .flatten()
                .and_then(|l| proto::decode_line::<ServerMsg>(&l).ok())
                .map(ServerMsg::printable);
            let _ = tx.send(msg);
        });
        Ok(Control { addr, token, server, stream, incoming })
    }

    /// True once the server closed the control connection (crashed, killed, or ended the test
    /// at its own limit).
    pub fn server_gone(&self) -> bool {
        matches!(self.incoming.try_recv(), Ok(None) | Err(mpsc::TryRecvError::Disconnected))
    }

    /// Says `finish` and waits briefly for the server's counts.
    pub fn finish(mut self) -> Option<(Vec<proto::StreamReport>, Vec<proto::FlowReport>)> {
        self.stream.write_all(&proto::encode_line(&ClientMsg::Finish)).ok()?;
        match self.incoming.recv_timeout(Duration::from_secs(3)) {
            Ok(Some(ServerMsg::Report { streams, flows })) => Some((streams, flows)),
            _ => None,
        }
    }
}
