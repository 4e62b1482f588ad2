//! The measurement server. Blocking sockets on threads: a test is at most a few dozen sockets,
//! each flow wants its own core-time anyway, and blocking writes give the kernel's own
//! backpressure with no runtime in between.
//!
//! Safety rules: nothing is answered without a token from a completed handshake; UDP replies
//! are exactly as long as the request (no amplification) and only go to the address that did
//! the handshake; tests are capped in number, length, flows and probe rate, and a refusal is
//! said on the control channel.

mod session;
mod udp;

use bloatlab_netio as netio;
use bloatlab_proto::{self as proto, frame, ClientMsg, RefuseReason, ServerMsg, Token};
use session::{Session, Sessions};
use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Tests that may run at once; more are answered "busy".
    pub max_tests: usize,
    /// Longest test accepted (idle phase included).
    pub max_duration: Duration,
    /// Most bulk flows in one test.
    pub max_flows: usize,
    /// Shortest probe interval accepted.
    pub min_interval: Duration,
    /// Log one line per test to stderr.
    pub verbose: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), proto::DEFAULT_PORT),
            max_tests: 4,
            max_duration: Duration::from_secs(180),
            max_flows: 32,
            min_interval: Duration::from_millis(1),
            verbose: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// How long after a test's announced end its flows and token stay valid: the client's last
/// probes may still be in flight through a bloated queue.
const GRACE: Duration = Duration::from_secs(10);
/// An unauthenticated connection must say who it is within this time.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections open at once, authenticated or not.
const MAX_CONNECTIONS: usize = 512;

pub struct Server {
    pub local_addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Server {
    /// Binds TCP and UDP on the same port (port 0 picks one) and serves on background threads.
    pub fn start(config: Config) -> Result<Server, ServerError> {
        let (tcp, udp) = bind(config.listen)?;
        let local_addr = tcp.local_addr().map_err(|source| ServerError::Bind { addr: config.listen, source })?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared { config, sessions: Sessions::default(), connections: AtomicUsize::new(0), stop: stop.clone() });
        let udp_shared = shared.clone();
        thread::Builder::new().name("udp-echo".into()).spawn(move || udp::serve(udp, &udp_shared)).expect("spawn");
        thread::Builder::new().name("accept".into()).spawn(move || accept_loop(tcp, shared)).expect("spawn");
        Ok(Server { local_addr, stop })
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds dual-stack when given `[::]`, falling back to IPv4 where IPv6 is disabled.
fn bind(addr: SocketAddr) -> Result<(TcpListener, UdpSocket), ServerError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let make = |addr: SocketAddr| -> std::io::Result<(TcpListener, UdpSocket)> {
        let domain = Domain::for_address(addr);
        let t = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
        let u = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            t.set_only_v6(false)?;
            u.set_only_v6(false)?;
        }
        t.set_reuse_address(true)?;
        t.bind(&addr.into())?;
        t.listen(128)?;
        let port = t.local_addr()?.as_socket().map(|a| a.port()).unwrap_or(0);
        u.bind(&SocketAddr::new(addr.ip(), port).into())?;
        Ok((t.into(), u.into()))
    };
    match make(addr) {
        Ok(pair) => Ok(pair),
        Err(e) if addr.ip() == IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) => {
            let v4 = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), addr.port());
            make(v4).map_err(|_| ServerError::Bind { addr, source: e })
        }
        Err(source) => Err(ServerError::Bind { addr, source }),
    }
}

struct Shared {
    config: Config,
    sessions: Sessions,
    connections: AtomicUsize,
    stop: Arc<AtomicBool>,
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // Non-blocking accept, woken by the next connection or after 200 ms to notice stop(): a
    // connection must never wait for a polling interval (it would add to every RPM probe).
    listener.set_nonblocking(true).expect("nonblocking listener");
    while !shared.stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if shared.connections.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    continue; // dropped: closes the connection
                }
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let s = shared.clone();
                let spawned = thread::Builder::new().name("conn".into()).spawn(move || {
                    let _ = stream.set_nonblocking(false);
                    handle_connection(stream, peer, &s);
                    s.connections.fetch_sub(1, Ordering::Relaxed);
                });
                if spawned.is_err() {
                    shared.connections.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                netio::wait_readable(&listener, Duration::from_millis(200));
            }
            // Out of descriptors or memory: back off instead of spinning.
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn send(stream: &mut TcpStream, msg: &ServerMsg) -> std::io::Result<()> {
    stream.write_all(&proto::encode_line(msg))
}

fn refuse(stream: &mut TcpStream, reason: RefuseReason, message: String) {
    let _ = send(stream, &ServerMsg::Refused { reason, message });
}

fn handle_connection(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let mut reader = BufReader::new(match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    });
    let first = match netio::read_line(&mut reader, proto::MAX_LINE) {
        Ok(Some(line)) => line,
        _ => return,
    };
    let peer_ip = peer.ip().to_canonical();
    match proto::decode_line::<ClientMsg>(&first) {
        Ok(ClientMsg::Hello { magic, version, .. }) if magic == proto::MAGIC && version == proto::PROTOCOL_VERSION => {
            control(stream, reader, peer_ip, shared)
        }
        Ok(ClientMsg::Hello { version, .. }) => refuse(
            &mut stream,
            RefuseReason::Version,
            format!("this server speaks protocol version {}, the client {version}: use the same bloatlab release on both ends", proto::PROTOCOL_VERSION),
        ),
        Ok(ClientMsg::DataHello { token, flow }) => data(stream, reader, peer, token, flow, shared),
        Ok(ClientMsg::ProbeHello { token }) => match shared.sessions.get(&token, peer_ip) {
            Some(_) => {
                if send(&mut stream, &ServerMsg::ProbeReply).is_ok() {
                    // Wait for the client to close so that the close costs it nothing.
                    let mut sink = [0u8; 64];
                    let _ = reader.read(&mut sink);
                }
            }
            None => refuse(&mut stream, RefuseReason::Token, "unknown or expired token".into()),
        },
        Ok(_) => refuse(&mut stream, RefuseReason::BadRequest, "expected hello".into()),
        Err(e) => refuse(&mut stream, RefuseReason::Version, format!("not a bloatlab client ({e})")),
    }
}

fn control(mut stream: TcpStream, mut reader: BufReader<TcpStream>, peer_ip: IpAddr, shared: &Shared) {
    let cfg = &shared.config;
    let hello = ServerMsg::HelloOk {
        version: proto::PROTOCOL_VERSION,
        server_version: env!("CARGO_PKG_VERSION").into(),
        default_cc: netio::default_cc(),
        kernel: netio::kernel(),
        max_duration_ms: cfg.max_duration.as_millis() as u64,
    };
    if send(&mut stream, &hello).is_err() {
        return;
    }
    let req = match netio::read_line(&mut reader, proto::MAX_LINE).map(|l| l.map(|l| proto::decode_line::<ClientMsg>(&l))) {
        Ok(Some(Ok(ClientMsg::Test(req)))) => req,
        Ok(Some(Ok(_))) | Ok(Some(Err(_))) => return refuse(&mut stream, RefuseReason::BadRequest, "expected a test request".into()),
        _ => return,
    };
    if let Err(why) = validate(&req, cfg) {
        return refuse(&mut stream, RefuseReason::Limit, why);
    }
    let duration = Duration::from_millis(req.duration_ms);
    let deadline = Instant::now() + duration + GRACE;
    let token = match Token::random() {
        Some(t) => t,
        None => return refuse(&mut stream, RefuseReason::Busy, "server has no randomness for a token".into()),
    };
    let session = Arc::new(Session::new(peer_ip, deadline, req.clone()));
    if let Err(running) = shared.sessions.insert(token, session.clone(), cfg.max_tests) {
        return refuse(
            &mut stream,
            RefuseReason::Busy,
            format!("{running} tests already running (limit {}); try again in a minute", cfg.max_tests),
        );
    }
    if cfg.verbose {
        eprintln!(
            "test {} from {peer_ip}: {} flows, {} probe streams, {:.1} s",
            req.test,
            req.flows.len(),
            req.streams.len(),
            duration.as_secs_f64()
        );
    }
    if send(&mut stream, &ServerMsg::Accepted { token, max_duration_ms: cfg.max_duration.as_millis() as u64 }).is_ok() {
        // Wait for `finish` (or the client's end) until the deadline.
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let _ = stream.set_read_timeout(Some(left));
        if let Ok(Some(line)) = netio::read_line(&mut reader, proto::MAX_LINE) {
            if let Ok(ClientMsg::Finish) = proto::decode_line::<ClientMsg>(&line) {
                let _ = send(&mut stream, &session.report());
            }
        }
    }
    session.end();
    shared.sessions.remove(&token);
    if cfg.verbose {
        eprintln!("test {} from {peer_ip} ended", req.test);
    }
}

fn validate(req: &proto::TestRequest, cfg: &Config) -> Result<(), String> {
    if Duration::from_millis(req.duration_ms) > cfg.max_duration {
        return Err(format!("test of {} s exceeds this server's limit of {} s", req.duration_ms / 1000, cfg.max_duration.as_secs()));
    }
    if req.flows.len() > cfg.max_flows {
        return Err(format!("{} flows exceed this server's limit of {}", req.flows.len(), cfg.max_flows));
    }
    let available = netio::available_cc();
    for f in &req.flows {
        if f.dscp > 63 {
            return Err(format!("DSCP {} out of range 0..63", f.dscp));
        }
        if let Some(cc) = &f.cc {
            if !available.split_whitespace().any(|a| a == cc) {
                return Err(format!("congestion control {cc:?} not available on the server (it has: {available})"));
            }
        }
    }
    for s in &req.streams {
        if Duration::from_micros(s.interval_us.into()) < cfg.min_interval {
            return Err(format!("probe interval {} us below this server's minimum of {} us", s.interval_us, cfg.min_interval.as_micros()));
        }
        if (s.size as usize) < proto::probe::HEADER_LEN || s.size as usize > proto::probe::MAX_LEN || s.dscp > 63 {
            return Err(format!("probe stream {}: size {} or DSCP {} out of range", s.id, s.size, s.dscp));
        }
    }
    Ok(())
}

/// A bulk data connection: the server sends (download) or sinks (upload) frames until the test
/// ends, answering pings in order with its data.
fn data(mut stream: TcpStream, reader: BufReader<TcpStream>, peer: SocketAddr, token: Token, flow_id: u16, shared: &Shared) {
    let Some(session) = shared.sessions.get(&token, peer.ip().to_canonical()) else {
        return refuse(&mut stream, RefuseReason::Token, "unknown or expired token".into());
    };
    let Some(spec) = session.request.flows.iter().find(|f| f.id == flow_id).cloned() else {
        return refuse(&mut stream, RefuseReason::BadRequest, format!("no flow {flow_id} in this test"));
    };
    let dscp = netio::apply_dscp(socket2::SockRef::from(&stream), spec.dscp, &peer).ok();
    if spec.direction == proto::Direction::Down {
        if let Some(cc) = &spec.cc {
            if let Err(e) = netio::set_cc(&stream, cc) {
                return refuse(&mut stream, RefuseReason::BadRequest, e.to_string());
            }
        }
    }
    let cc = netio::cc(&stream);
    let counter = session.flow_counter(flow_id, cc.clone());
    if send(&mut stream, &ServerMsg::DataOk { cc, dscp }).is_err() {
        return;
    }
    // Periodic timeouts let blocked reads and writes notice the end of the test.
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
    let (pong_tx, pong_rx) = mpsc::channel::<u64>();
    let reader_session = session.clone();
    let is_down = spec.direction == proto::Direction::Down;
    let writer = match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    };
    let reader_counter = counter.clone();
    let rx_thread = thread::spawn(move || {
        // Upload: the reverse path is idle, so pongs go out at once. Download: a pong waits in
        // line behind the data already queued, as an HTTP/2 response would.
        let mut pong_writer = (!is_down).then_some(writer);
        sink_frames(reader, &reader_session, |ev| match ev {
            frame::Event::Data(n) => {
                if !is_down {
                    reader_counter.fetch_add(n as u64, Ordering::Relaxed);
                }
                true
            }
            frame::Event::Ping(id) => match pong_writer.as_mut() {
                Some(w) => w.write_all(&frame::pong(id)).is_ok(),
                None => pong_tx.send(id).is_ok(),
            },
            frame::Event::Pong(_) => true,
        });
    });
    if is_down {
        send_frames(&mut stream, &session, &counter, &pong_rx);
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
    let _ = rx_thread.join();
}

fn sink_frames(mut reader: BufReader<TcpStream>, session: &Session, mut on_event: impl FnMut(frame::Event) -> bool) {
    let mut decoder = frame::Decoder::new();
    let mut buf = vec![0u8; frame::READ_BUFFER];
    let mut alive = true;
    // Bytes read along with the hello line already belong to the frame stream.
    let pending = reader.buffer().to_vec();
    let mut ok = decoder.feed(&pending, |e| alive &= on_event(e));
    while ok.is_ok() && alive && session.live() {
        match reader.get_mut().read(&mut buf) {
            Ok(0) => break,
            Ok(n) => ok = decoder.feed(&buf[..n], |e| alive &= on_event(e)),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
}

/// Download data, with pongs between frames. An RPM test's flows are responsive, as the draft
/// asks of its servers: unsent data in the socket kept near 5 ms of the connection's rate, and
/// frames of about that size (at most HTTP/2's 16 KiB), so a pong waits behind the network's
/// queue, not behind ours.
fn send_frames(stream: &mut TcpStream, session: &Session, counter: &std::sync::atomic::AtomicU64, pongs: &mpsc::Receiver<u64>) {
    let responsive = session.request.test == "rpm";
    let mut chunk = vec![0u8; frame::HEADER_LEN + frame::DATA_PAYLOAD];
    while session.live() {
        while let Ok(id) = pongs.try_recv() {
            if write_fully(stream, &frame::pong(id), session).is_err() {
                return;
            }
        }
        let payload = match responsive {
            true => frame::responsive_payload(netio::keep_unsent_small(stream).unwrap_or(frame::RESPONSIVE_PAYLOAD as u32)),
            false => frame::DATA_PAYLOAD,
        };
        chunk[..frame::HEADER_LEN].copy_from_slice(&frame::data_header(payload));
        if write_fully(stream, &chunk[..frame::HEADER_LEN + payload], session).is_err() {
            return;
        }
        counter.fetch_add(payload as u64, Ordering::Relaxed);
    }
}

/// write_all that survives the periodic write timeouts while the test is live.
fn write_fully(stream: &mut TcpStream, mut buf: &[u8], session: &Session) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if !session.live() {
                    return Err(e);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

trait RandomToken: Sized {
    fn random() -> Option<Self>;
}

impl RandomToken for Token {
    fn random() -> Option<Token> {
        let mut t = [0u8; 16];
        getrandom::fill(&mut t).ok()?;
        Some(Token(t))
    }
}
