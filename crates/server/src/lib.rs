//! The measurement server, meant for the public Internet. One tokio runtime for TCP (the UDP echo
//! keeps a thread of its own, for timing); every connection a task under a total deadline (its
//! hello, then its test); every slot (connection, test, flow) a
//! guard that is given back however its task ends; the same limits in all and per client
//! address for every kind of connection.
//!
//! Safety rules: nothing is answered without a token from a completed handshake (and, with a
//! shared key, without proof of it); UDP replies are exactly as long as the request (no
//! amplification) and only go to the address that did the handshake; limits apply to what a
//! client actually does (connections per flow, probe rates, bytes per second), not to what it
//! declared; nothing queues without bound; a refusal names the limit.

mod acked;
mod conn;
mod data;
#[cfg(feature = "clap")]
pub mod flags;
mod handshake;
mod limits;
mod lines;
pub mod metrics;
pub mod session;
mod udp;
mod udpload;
pub mod web;

/// The request check, public for the fuzzer (fuzz/fuzz_targets/request.rs).
pub use conn::validate;

use bloatlab_proto as proto;
use limits::Slots;
use portable_atomic::AtomicU64;
use session::Sessions;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// Tests that may run at once; more are answered "busy".
    pub max_tests: usize,
    /// Tests one client address may run at once.
    pub max_tests_per_ip: usize,
    /// Longest test accepted (idle phase included).
    pub max_duration: Duration,
    /// Most bulk flows in one test.
    pub max_flows: usize,
    /// Most probe streams in one test.
    pub max_streams: usize,
    /// Most probe packets per second one test may announce, all streams together.
    pub max_probe_pps: u32,
    /// Shortest probe interval accepted.
    pub min_interval: Duration,
    /// Bytes per second one test may move, both directions together (`None`: no limit).
    pub max_rate_bytes: Option<f64>,
    /// UDP load one test may announce (`test udp`), bits per second of payload.
    pub max_udp_bps: u64,
    /// TCP connections open at once, of any kind, and per client address.
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// A connection must say who it is (and a test request follow) within this time.
    pub hello_timeout: Duration,
    /// Shared key: clients must prove it in the handshake and sign every probe.
    pub key: Option<Vec<u8>>,
    /// Client networks served; empty: all.
    pub allow: Vec<ipnet::IpNet>,
    /// DSCP marks clients may ask for; `None`: all.
    pub allow_dscp: Option<Vec<u8>>,
    /// Tell unauthenticated clients the kernel version and congestion control (kept from
    /// them by default).
    pub expose_host: bool,
    /// Log one line per test to stderr.
    pub verbose: bool,
    /// The HTTP face (responsiveness endpoints), off unless a port is given.
    pub web: web::WebConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(
                IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                proto::DEFAULT_PORT,
            ),
            max_tests: 4,
            max_tests_per_ip: 2,
            max_duration: Duration::from_secs(180),
            max_flows: 32,
            max_streams: 8,
            max_probe_pps: 2000,
            min_interval: Duration::from_millis(1),
            max_rate_bytes: None,
            max_udp_bps: 1_000_000_000,
            max_connections: 512,
            max_connections_per_ip: 64,
            hello_timeout: Duration::from_secs(5),
            key: None,
            allow: Vec::new(),
            allow_dscp: None,
            expose_host: false,
            verbose: true,
            web: web::WebConfig::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("the key must be at least {} bytes", proto::auth::MIN_KEY_LEN)]
    ShortKey,
    #[error("cannot start the server's runtime: {0}")]
    Runtime(std::io::Error),
    #[cfg(feature = "https")]
    #[error("TLS: {0}")]
    Tls(String),
}

/// How long after a test's announced end its flows and token stay valid: the client's last
/// probes may still be in flight through a bloated queue.
pub(crate) const GRACE: Duration = Duration::from_secs(10);
/// Refusals being written at once: past this, a connection the server has no room for is
/// closed without a word.
const MAX_REFUSING: usize = 64;

/// What the server counts of what it turned away, for its log.
#[derive(Default)]
pub struct Counters {
    /// UDP packets that were not a live test's (unknown token, wrong address, not a probe).
    pub udp_unknown: AtomicU64,
    /// UDP probes of a live test without a valid MAC under the server's key.
    pub udp_unauthenticated: AtomicU64,
    /// Packets and connections from addresses outside `--allow`.
    pub not_allowed: AtomicU64,
}

struct Shared {
    config: Config,
    sessions: Sessions,
    connections: Arc<Slots>,
    tests: Arc<Slots>,
    refusing: Arc<Slots>,
    counters: Counters,
    stop: watch::Receiver<bool>,
}

impl Shared {
    fn allowed(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.config.allow.is_empty() || self.config.allow.iter().any(|n| n.contains(&ip))
    }

    /// One line for the operator; whatever a client chose is escaped by the caller
    /// (`proto::printable`), so no client can forge log lines or send escape sequences.
    fn log(&self, line: std::fmt::Arguments<'_>) {
        if self.config.verbose {
            eprintln!("{line}");
        }
    }
}

pub struct Server {
    pub local_addr: SocketAddr,
    /// Where the HTTP face listens, plain and over TLS, when asked to.
    pub http_addr: Option<SocketAddr>,
    pub https_addr: Option<SocketAddr>,
    /// The browser test's WebSocket probe port.
    #[cfg(feature = "browser")]
    pub ws_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds TCP and UDP on the same port (port 0 picks one) and serves on a background runtime.
    pub fn start(config: Config) -> Result<Server, ServerError> {
        if config
            .key
            .as_ref()
            .is_some_and(|k| k.len() < proto::auth::MIN_KEY_LEN)
        {
            return Err(ServerError::ShortKey);
        }
        let (tcp, udp) = bind(config.listen)?;
        let local_addr = tcp
            .local_addr()
            .map_err(|source| ServerError::Bind {
                addr: config.listen,
                source,
            })?
            .as_socket()
            .ok_or(ServerError::Bind {
                addr: config.listen,
                source: std::io::ErrorKind::InvalidInput.into(),
            })?;
        tcp.set_nonblocking(true)
            .map_err(|source| ServerError::Bind {
                addr: config.listen,
                source,
            })?;
        #[cfg(not(feature = "https"))]
        let (tls, https): (Option<web::Cert>, Option<std::net::TcpListener>) = (None, None);
        #[cfg(feature = "https")]
        let tls = match (&config.web.https, &config.web.tls) {
            (Some(_), Some((cert, key))) => Some(Arc::new(
                web::tls::Tls::load(cert, key).map_err(ServerError::Tls)?,
            )),
            (Some(_), None) => {
                return Err(ServerError::Tls(
                    "--https needs --cert and --key, or --self-signed".into(),
                ))
            }
            (None, _) => None,
        };
        let http = config.web.http.map(listen_tcp).transpose()?;
        #[cfg(feature = "https")]
        let https = config.web.https.map(listen_tcp).transpose()?;
        let addr_of =
            |l: &Option<std::net::TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
        let (http_addr, https_addr) = (addr_of(&http), addr_of(&https));
        let connections = Slots::new(
            "connections",
            config.max_connections,
            config.max_connections_per_ip,
        );
        // The probe port: WebSockets over TCP, WebRTC's data channel over UDP on the same number.
        #[cfg(feature = "browser")]
        let (ws, rtc_udp) = match config.web.ws.map(listen_probes).transpose()? {
            Some((tcp, udp)) => (Some(tcp), Some(udp)),
            None => (None, None),
        };
        #[cfg(feature = "browser")]
        let ws_addr = addr_of(&ws);
        #[cfg(feature = "browser")]
        let mut rtc_socket = None;
        let web = match (&http, &https) {
            (None, None) => None,
            _ => {
                #[cfg(feature = "browser")]
                let page = {
                    let face = match rtc_udp {
                        Some(udp) => {
                            let (face, socket) = web::rtc::Face::new(
                                udp,
                                connections.clone(),
                                config.web.max_conn_time,
                            )
                            .map_err(ServerError::Runtime)?;
                            rtc_socket = Some(socket);
                            Some(face)
                        }
                        None => None,
                    };
                    web::Page::new(&config.web, ws_addr.map(|a| a.port()), face)
                        .map_err(ServerError::Runtime)?
                };
                let web = web::Web::new(
                    config.web.clone(),
                    #[cfg(feature = "browser")]
                    page,
                )
                .map_err(ServerError::Runtime)?;
                Some(Arc::new(web))
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            connections,
            tests: Slots::new("tests", config.max_tests, config.max_tests_per_ip),
            refusing: Slots::new("refusals", MAX_REFUSING, MAX_REFUSING / 8),
            config,
            sessions: Sessions::default(),
            counters: Counters::default(),
            stop: stop_rx,
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("bloatlab-server")
            .build()
            .map_err(ServerError::Runtime)?;
        let udp_shared = shared.clone();
        let udp_thread = std::thread::Builder::new()
            .name("udp-echo".into())
            .spawn(move || udp::serve(udp.into(), udp_shared))
            .map_err(ServerError::Runtime)?;
        let tcp_thread = std::thread::Builder::new()
            .name("bloatlab-server".into())
            .spawn(move || {
                rt.block_on(async move {
                    let tcp =
                        match tokio::net::TcpListener::from_std(std::net::TcpListener::from(tcp)) {
                            Ok(t) => t,
                            Err(e) => return eprintln!("bloatlab server: {e}"),
                        };
                    // The accept loops run as tasks on workers, like every connection.
                    let mut tasks = vec![tokio::spawn(conn::accept_loop(tcp, shared.clone()))];
                    if let Some(web) = web {
                        for (listener, tls) in [(http, None), (https, tls.clone())] {
                            let Some(l) =
                                listener.and_then(|l| tokio::net::TcpListener::from_std(l).ok())
                            else {
                                continue;
                            };
                            tasks.push(tokio::spawn(web::accept_loop(
                                l,
                                tls,
                                shared.clone(),
                                web.clone(),
                            )));
                        }
                        #[cfg(feature = "browser")]
                        if let Some(l) = ws.and_then(|l| tokio::net::TcpListener::from_std(l).ok())
                        {
                            tasks.push(tokio::spawn(web::ws::accept_loop(
                                l,
                                tls.clone(),
                                shared.clone(),
                                web.clone(),
                            )));
                        }
                        #[cfg(feature = "browser")]
                        if let Some(socket) = rtc_socket {
                            tasks.push(tokio::spawn(web::rtc::serve(socket, web.clone())));
                        }
                    }
                    #[cfg(feature = "https")]
                    if let Some(tls) = tls {
                        tasks.push(tokio::spawn(reload_on_hangup(tls)));
                    }
                    let mut stop = shared.stop.clone();
                    let _ = stop.wait_for(|s| *s).await;
                    tasks.iter().for_each(|t| t.abort());
                });
                rt.shutdown_timeout(Duration::from_secs(1));
            })
            .map_err(ServerError::Runtime)?;
        Ok(Server {
            local_addr,
            http_addr,
            https_addr,
            #[cfg(feature = "browser")]
            ws_addr,
            stop: stop_tx,
            threads: vec![udp_thread, tcp_thread],
        })
    }

    /// Stops accepting and ends every connection; returns once the runtime is down.
    /// Where it listens, one line a face, the first saying where the protocol is.
    pub fn banner(&self) -> String {
        let mut out = format!(
            "bloatlab server listening on {} (TCP and UDP); Ctrl-C to stop\n",
            self.local_addr
        );
        for (scheme, addr) in [("https", self.https_addr), ("http", self.http_addr)] {
            if let Some(a) = addr {
                out += &format!(
                    "bloatlab server: responsiveness endpoints on {scheme}://{a}/.well-known/nq\n"
                );
            }
        }
        #[cfg(feature = "browser")]
        match self.ws_addr {
            Some(ws) => {
                out += &format!(
                    "bloatlab server: browser test at the same addresses' / (latency probes on \
                    port {}: WebRTC over UDP, WebSockets over TCP)\n",
                    ws.port()
                )
            }
            None if self.http_addr.is_some() || self.https_addr.is_some() => {
                out += "bloatlab server: no --ws port: the browser test at / cannot probe latency\n"
            }
            None => {}
        }
        out
    }

    pub fn stop(&mut self) {
        let _ = self.stop.send(true);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(feature = "https")]
/// SIGHUP: the certificate files are read again (renewed certificates without a restart); new
/// connections get the new one, a broken file leaves the old one in use.
async fn reload_on_hangup(tls: Arc<web::tls::Tls>) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    while hup.recv().await.is_some() {
        match tls.reload() {
            Ok(fp) => eprintln!("bloatlab server: certificate reloaded, SHA-256 {fp}"),
            Err(e) => {
                eprintln!("bloatlab server: certificate not reloaded, the old one stays: {e}")
            }
        }
    }
}

/// A TCP listener for the HTTP face, dual-stack as `bind`, non-blocking for the runtime.
fn listen_tcp(addr: SocketAddr) -> Result<std::net::TcpListener, ServerError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let make = |addr: SocketAddr| -> std::io::Result<std::net::TcpListener> {
        let t = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        if addr.is_ipv6() {
            t.set_only_v6(false)?;
        }
        t.set_reuse_address(true)?;
        t.bind(&addr.into())?;
        t.listen(1024)?;
        t.set_nonblocking(true)?;
        Ok(t.into())
    };
    make(addr)
        .or_else(|e| match addr.ip() {
            IpAddr::V6(v6) if v6.is_unspecified() => make(SocketAddr::new(
                IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                addr.port(),
            ))
            .map_err(|_| e),
            _ => Err(e),
        })
        .map_err(|source| ServerError::Bind { addr, source })
}

/// The browser's probe port: a TCP listener and a UDP socket on one port number, non-blocking.
#[cfg(feature = "browser")]
fn listen_probes(
    addr: SocketAddr,
) -> Result<(std::net::TcpListener, std::net::UdpSocket), ServerError> {
    let (tcp, udp) = bind(addr)?;
    let nonblocking = |s: &socket2::Socket| {
        s.set_nonblocking(true)
            .map_err(|source| ServerError::Bind { addr, source })
    };
    nonblocking(&tcp)?;
    nonblocking(&udp)?;
    Ok((tcp.into(), udp.into()))
}

/// Binds dual-stack when given `[::]`, falling back to IPv4 where IPv6 is disabled.
fn bind(addr: SocketAddr) -> Result<(socket2::Socket, socket2::Socket), ServerError> {
    use socket2::{Domain, Protocol, Socket, Type};
    let make = |addr: SocketAddr| -> std::io::Result<(Socket, Socket)> {
        let domain = Domain::for_address(addr);
        let t = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
        let u = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            t.set_only_v6(false)?;
            u.set_only_v6(false)?;
        }
        t.set_reuse_address(true)?;
        t.bind(&addr.into())?;
        t.listen(1024)?;
        let port = t.local_addr()?.as_socket().map(|a| a.port()).unwrap_or(0);
        u.bind(&SocketAddr::new(addr.ip(), port).into())?;
        Ok((t, u))
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

fn random<const N: usize>() -> Option<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).ok()?;
    Some(b)
}
