//! `bloatlab test rpm https://HOST/.well-known/nq`: responsiveness against any server of the
//! draft's endpoints (Apple's, Cloudflare's, an nginx set-up, `bloatlab server --https`). The
//! engine is the one the bloatlab protocol uses (`engine::RpmRamp`: intervals of ID seconds, one
//! more load connection per direction each, goodput and then responsiveness saturation;
//! `engine::RpmProbes`: the probes' times, trimmed means and series); only the transport
//! differs: HTTP/2 over TLS (or cleartext HTTP/2 for `http://`), downloads of
//! `large_download_url` and uploads to `upload_url` on connections of their own, foreign probes
//! on new connections with TCP, TLS and HTTP times kept apart, self probes (a GET of
//! `small_download_url`) on the load connections. With `--http1.1` each connection carries one
//! request at a time, so a load connection has no room for a self probe: the RPM is then the
//! foreign term alone (the summary's `rpm.loaded` is null). The result file is the same format;
//! its `params.transport` says which transport ran.

use crate::engine::{Drain, ForeignProbe, Pace, Period, RpmProbes, RpmRamp, Schedule, Timer};
use crate::plan::Params;
use crate::run::{Ended, Outcome, RunOptions};
use crate::MeasureError;
#[cfg(feature = "https")]
use bloatlab_netio::sendbuf::BudgetedTls;
use bloatlab_netio::sendbuf::{self, SendBudget, UnsentLimited};
use bloatlab_result::{self as result, Host, Metadata, Phase, ResultFile, Series, SeriesKind};
use hyper::body::Incoming;
use hyper::body::{Body, Bytes, Frame};
use hyper::client::conn::http1;
use hyper::{Request, Response, Uri};
#[cfg(feature = "http2")]
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::TokioIo;
use portable_atomic::AtomicU64;
#[cfg(feature = "https")]
use rustls::pki_types::{CertificateDer, ServerName};
use std::convert::Infallible;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::time::{timeout, Instant};

/// A probe pair (one foreign, one self) this often: 10 pairs a second, within the draft's 100.
const PROBE_EVERY: Duration = Duration::from_millis(100);
/// A probe not done by then counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an upload's acknowledged bytes are read (`TCP_INFO`).
const ACKED_EVERY: Duration = Duration::from_millis(5);
/// What an upload sends, again and again (each chunk a slice of it, as large as the
/// connection's send budget).
const UPLOAD_CHUNK: usize = sendbuf::MAX;

#[derive(Clone, Debug, Default)]
pub struct HttpOptions {
    /// Accept any certificate (self-signed test servers).
    pub insecure: bool,
    /// Trust this CA (PEM) besides the built-in roots.
    pub ca: Option<PathBuf>,
    /// HTTP/1.1 instead of HTTP/2 (`--http1.1`, as `networkQuality -f h1`).
    pub http1: bool,
}

/// Where one of the config's URLs leads.
#[derive(Clone)]
struct Target {
    uri: Uri,
    addr: SocketAddr,
    tls: bool,
    #[cfg(feature = "https")]
    name: ServerName<'static>,
}

impl Target {
    fn parse(url: &str) -> Result<Target, String> {
        let uri: Uri = url.parse().map_err(|e| format!("`{url}`: {e}"))?;
        let tls = match uri.scheme_str() {
            #[cfg(feature = "https")]
            Some("https") => true,
            #[cfg(not(feature = "https"))]
            Some("https") => {
                return Err(format!(
                    "`{url}`: this build has no TLS (the router's): an http:// URL, or a full build"
                ))
            }
            Some("http") => false,
            _ => return Err(format!("`{url}`: want an https:// or http:// URL")),
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("`{url}`: no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {host}: {e}"))?
            .next()
            .ok_or_else(|| format!("cannot resolve {host}: no address"))?;
        Ok(Target {
            uri,
            addr,
            tls,
            #[cfg(feature = "https")]
            name: ServerName::try_from(host.clone()).map_err(|e| format!("{host}: {e}"))?,
        })
    }
}

/// A request body: none, or an endless upload (until `stop`).
enum ReqBody {
    Empty,
    /// Sent in chunks of the connection's send budget, which follows its rate (`sendbuf`).
    Upload {
        stop: Arc<AtomicBool>,
        socket: Arc<OwnedFd>,
        budget: SendBudget,
    },
}

impl Body for ReqBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(match self.get_mut() {
            ReqBody::Empty => None,
            ReqBody::Upload { stop, .. } if stop.load(Ordering::Relaxed) => None,
            ReqBody::Upload { socket, budget, .. } => {
                let chunk = upload_chunk();
                let allowed = budget.follow(
                    socket.as_ref(),
                    bloatlab_netio::tcp_info(socket.as_ref()).ok().as_ref(),
                );
                Some(Ok(Frame::data(chunk.slice(..allowed.min(chunk.len())))))
            }
        })
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, ReqBody::Empty)
    }
}

/// The data uploads send: one buffer for the process, every chunk a slice of it.
fn upload_chunk() -> &'static Bytes {
    static CHUNK: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
    CHUNK.get_or_init(|| {
        Bytes::from(
            (0..UPLOAD_CHUNK)
                .map(|i| 0x5a ^ (i as u8).wrapping_mul(151))
                .collect::<Vec<u8>>(),
        )
    })
}

/// A connection's request sender: HTTP/2 (streams side by side, so self probes can share a
/// load connection) or HTTP/1.1 (one request at a time).
enum Sender {
    H1(http1::SendRequest<ReqBody>),
    #[cfg(feature = "http2")]
    H2(H2),
}

#[cfg(feature = "http2")]
type H2 = hyper::client::conn::http2::SendRequest<ReqBody>;
/// A build without HTTP/2 (the router's) has no HTTP/2 sender: no load connection is shared.
#[cfg(not(feature = "http2"))]
type H2 = Infallible;

impl Sender {
    async fn ready(&mut self) -> Result<(), String> {
        match self {
            Sender::H1(s) => s.ready().await,
            #[cfg(feature = "http2")]
            Sender::H2(s) => s.ready().await,
        }
        .map_err(|e| e.to_string())
    }

    /// An HTTP/2 connection's sender, for self probes beside its load.
    fn h2(&self) -> Option<H2> {
        match self {
            #[cfg(feature = "http2")]
            Sender::H2(s) => Some(s.clone()),
            _ => None,
        }
    }

    async fn send(&mut self, req: Request<ReqBody>) -> Result<Response<Incoming>, String> {
        match self {
            Sender::H1(s) => s.send_request(req).await,
            #[cfg(feature = "http2")]
            Sender::H2(s) => s.send_request(req).await,
        }
        .map_err(|e| e.to_string())
    }
}

trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// How this run connects: its TLS settings (roots, ALPN) and its HTTP version.
#[derive(Clone)]
struct Connector {
    #[cfg(feature = "https")]
    tls: tokio_rustls::TlsConnector,
    /// HTTP/1.1 instead of HTTP/2.
    http1: bool,
}

/// An open connection.
struct Opened {
    sender: Sender,
    /// TCP and TLS handshake times, ms.
    tcp_ms: f64,
    tls_ms: Option<f64>,
    /// Its own handle on the TCP socket (a duplicate, so `TCP_INFO` never reads another socket
    /// that took its number).
    socket: Arc<OwnedFd>,
    /// What an upload may keep in this end's buffers (TLS's among them).
    budget: SendBudget,
}

/// A new HTTP/2 (or with `http1`, HTTP/1.1) connection.
async fn open(t: &Target, c: &Connector) -> Result<Opened, String> {
    #[cfg(feature = "https")]
    let Connector { tls, http1 } = c;
    #[cfg(not(feature = "https"))]
    let Connector { http1 } = c;
    let t0 = Instant::now();
    let tcp = TcpStream::connect(t.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", t.addr))?;
    let tcp_ms = t0.elapsed().as_secs_f64() * 1e3;
    let _ = tcp.set_nodelay(true);
    // As the draft asks of both ends: little unsent data in the socket, so a self probe waits
    // behind the network's queue, not behind this client's own buffers.
    let _ = bloatlab_netio::keep_unsent_small(&tcp);
    let socket = Arc::new(
        tcp.as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("socket of {}: {e}", t.addr))?,
    );
    let budget = SendBudget::default();
    let tcp = UnsentLimited(tcp);
    #[cfg(not(feature = "https"))]
    let (io, tls_ms): (Box<dyn Io>, Option<f64>) = (Box::new(tcp), None);
    #[cfg(feature = "https")]
    let (io, tls_ms): (Box<dyn Io>, Option<f64>) = if t.tls {
        let t1 = Instant::now();
        let s = tls
            .connect(t.name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS with {}: {e}", t.addr))?;
        match (*http1, s.get_ref().1.alpn_protocol()) {
            (false, Some(b"h2")) | (true, Some(b"http/1.1") | None) => {}
            (false, _) => {
                return Err(format!(
                    "{} did not agree to HTTP/2 (ALPN); --http1.1 forces HTTP/1.1",
                    t.addr
                ))
            }
            (true, _) => return Err(format!("{} did not agree to HTTP/1.1 (ALPN)", t.addr)),
        }
        (
            Box::new(BudgetedTls {
                tls: s,
                budget: budget.clone(),
            }),
            Some(t1.elapsed().as_secs_f64() * 1e3),
        )
    } else {
        (Box::new(tcp), None)
    };
    let sender = if *http1 {
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("HTTP/1.1 with {}: {e}", t.addr))?;
        tokio::spawn(conn);
        Sender::H1(sender)
    } else {
        h2_handshake(io, t).await?
    };
    Ok(Opened {
        sender,
        tcp_ms,
        tls_ms,
        socket,
        budget,
    })
}

#[cfg(feature = "http2")]
async fn h2_handshake(io: Box<dyn Io>, t: &Target) -> Result<Sender, String> {
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .adaptive_window(true)
        .max_send_buf_size(1)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP/2 with {}: {e}", t.addr))?;
    tokio::spawn(conn);
    Ok(Sender::H2(sender))
}

#[cfg(not(feature = "http2"))]
async fn h2_handshake(_: Box<dyn Io>, _: &Target) -> Result<Sender, String> {
    Err("this build has no HTTP/2 (the router's): --http1.1 runs the test over HTTP/1.1".into())
}

fn request(t: &Target, body: ReqBody, post: bool) -> Request<ReqBody> {
    let b = if post {
        Request::post(t.uri.clone())
    } else {
        Request::get(t.uri.clone())
    };
    b.header(hyper::header::ACCEPT_ENCODING, "identity")
        .body(body)
        .expect("a valid request")
}

/// Sends a request and reads the whole answer; its time in ms and the bytes it brought.
async fn fetch(
    sender: &mut Sender,
    t: &Target,
    count: Option<&AtomicU64>,
    stop: Option<&AtomicBool>,
) -> Result<f64, String> {
    use http_body_util::BodyExt;
    sender.ready().await?;
    let t0 = Instant::now();
    let resp = sender.send(request(t, ReqBody::Empty, false)).await?;
    if !resp.status().is_success() {
        return Err(format!("{} answered {}", t.uri, resp.status()));
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let (Some(d), Some(c)) = (frame.data_ref(), count) {
            c.fetch_add(d.len() as u64, Ordering::Relaxed);
        }
        if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            break;
        }
    }
    Ok(t0.elapsed().as_secs_f64() * 1e3)
}

/// One load connection: its direction and stage, bytes so far, and its throughput samples.
struct Flow {
    name: String,
    down: bool,
    /// Index of the stage it loads.
    stage: usize,
    bytes: Arc<AtomicU64>,
    samples: Vec<(f64, Option<f64>)>,
    last: u64,
    /// Why the connection failed (refused, a non-2xx answer, broken), and when (s).
    error: Arc<Mutex<Option<(f64, String)>>>,
    /// Its connection once open.
    opened: Arc<Mutex<FlowOpened>>,
}

#[derive(Default)]
struct FlowOpened {
    /// When its data began (s since the test's start): its mean goodput is over its own life.
    start: Option<f64>,
    /// An upload's congestion control, read from its socket (a download's is the server's).
    cc: Option<String>,
}

struct Urls {
    small: Target,
    large: Target,
    upload: Target,
}

fn config_urls(config: &serde_json::Value) -> Result<Urls, String> {
    let url = |new: &str, old: &str| {
        config["urls"][new]
            .as_str()
            .or_else(|| config["urls"][old].as_str())
            .ok_or_else(|| format!("the config has neither `{new}` nor `{old}`"))
    };
    if config["version"] != 1 {
        return Err(format!(
            "config version {}: this client speaks version 1",
            config["version"]
        ));
    }
    Ok(Urls {
        small: Target::parse(url("small_download_url", "small_https_download_url")?)?,
        large: Target::parse(url("large_download_url", "large_https_download_url")?)?,
        upload: Target::parse(url("upload_url", "https_upload_url")?)?,
    })
}

/// A build without TLS connects to http:// URLs only (`Target::parse` refuses the others).
#[cfg(not(feature = "https"))]
fn connector(h: &HttpOptions) -> Result<Connector, String> {
    Ok(Connector { http1: h.http1 })
}

#[cfg(feature = "https")]
fn connector(h: &HttpOptions) -> Result<Connector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let mut cfg = if h.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(ca) = &h.ca {
            use rustls::pki_types::pem::PemObject;
            for c in
                CertificateDer::pem_file_iter(ca).map_err(|e| format!("{}: {e}", ca.display()))?
            {
                roots
                    .add(c.map_err(|e| format!("{}: {e}", ca.display()))?)
                    .map_err(|e| format!("{}: {e}", ca.display()))?;
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    cfg.alpn_protocols = vec![if h.http1 {
        b"http/1.1".to_vec()
    } else {
        b"h2".to_vec()
    }];
    Ok(Connector {
        tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
        http1: h.http1,
    })
}

/// `--insecure`: any certificate is taken (signatures are still checked, so the handshake is
/// real TLS), as `curl -k` and `networkQuality -k` do.
#[cfg(feature = "https")]
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

#[cfg(feature = "https")]
impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.0.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

pub fn run(
    params: &Params,
    config_url: &str,
    opts: &RunOptions,
    http: &HttpOptions,
) -> Result<Outcome, MeasureError> {
    let fail = |why: String| MeasureError::Http {
        url: config_url.into(),
        why,
    };
    // A server that closes a connection mid-write costs that connection, not the process: every
    // thread that writes to a socket, the runtime's and the one running the test, blocks SIGPIPE.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .on_thread_start(bloatlab_netio::block_sigpipe)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            bloatlab_netio::block_sigpipe();
            rt.block_on(run_async(params, config_url, opts, http))
        })
        .join()
    });
    outcome
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        .map_err(fail)
}

/// A load stage: both directions at once (the default, as networkQuality), or one direction of
/// a sequential test (download, then upload, as `networkQuality -s` and Cloudflare's mach).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Stage {
    Both,
    Down,
    Up,
}

impl Stage {
    fn loads(self, down: bool) -> bool {
        match self {
            Stage::Both => true,
            Stage::Down => down,
            Stage::Up => !down,
        }
    }

    /// The result file's phase name.
    fn phase(self) -> &'static str {
        match self {
            Stage::Both => "load",
            Stage::Down => "download",
            Stage::Up => "upload",
        }
    }
}

/// One stage as it ran: from `start` (s) until its load saturated or its length ran out.
struct StageRun {
    stage: Stage,
    start: f64,
    end: Option<f64>,
    ramp: RpmRamp,
    /// Load connections opened in this stage.
    flows: usize,
}

struct State {
    t0: Instant,
    flows: Vec<Flow>,
    probes: Arc<Mutex<RpmProbes>>,
    stages: Vec<StageRun>,
}

impl State {
    fn t(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// The goodput bytes of the stage under way's load connections so far, per direction
    /// (down, up), for the directions it loads.
    fn stage_bytes(&self, stage: Stage) -> [Option<u64>; 2] {
        let current = self.stages.len().checked_sub(1);
        [true, false].map(|down| {
            stage.loads(down).then(|| {
                self.flows
                    .iter()
                    .filter(|f| f.down == down && Some(f.stage) == current)
                    .map(|f| f.bytes.load(Ordering::Relaxed))
                    .sum()
            })
        })
    }

    /// The stage under way, if the load has begun and not all stages ended.
    fn current(&mut self) -> Option<&mut StageRun> {
        self.stages.last_mut().filter(|s| s.end.is_none())
    }
}

async fn run_async(
    params: &Params,
    config_url: &str,
    opts: &RunOptions,
    http: &HttpOptions,
) -> Result<Outcome, String> {
    let connector = connector(http)?;
    let config_target = Target::parse(config_url)?;
    let h1 = http.http1;
    let mut sender = open(&config_target, &connector).await?.sender;
    let config = {
        use http_body_util::BodyExt;
        sender.ready().await?;
        let resp = timeout(
            PROBE_TIMEOUT,
            sender.send(request(&config_target, ReqBody::Empty, false)),
        )
        .await
        .map_err(|_| "the config did not come within 10 s".to_string())??;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!("the config URL answered {status}"));
        }
        serde_json::from_slice::<serde_json::Value>(&body)
            .map_err(|e| format!("the config is not JSON: {e}"))?
    };
    let urls = Arc::new(config_urls(&config)?);
    let path = opts
        .output
        .clone()
        .unwrap_or_else(|| crate::run::default_output("rpm"));
    let meta = metadata(params, config_url, &config_target, h1);
    result::write_atomic(&path, &ResultFile::new(meta.clone())).map_err(|e| e.to_string())?;

    let plan = if params.rpm_sequential {
        vec![Stage::Down, Stage::Up]
    } else {
        vec![Stage::Both]
    };
    let mut st = State {
        t0: Instant::now(),
        flows: Vec::new(),
        probes: Arc::new(Mutex::new(RpmProbes {
            tls: urls.small.tls,
            self_probes: !h1,
            ..RpmProbes::default()
        })),
        stages: Vec::new(),
    };
    // The load of the stage under way: its connections (for self probes), its stop flag, its
    // tasks (aborted when the stage ends, so the next stage's direction runs alone).
    let senders: Arc<Mutex<Vec<H2>>> = Arc::default();
    let mut stop = Arc::new(AtomicBool::new(false));
    let mut load_tasks = tokio::task::JoinSet::new();
    let (idle, id, length) = (params.idle, params.rpm_interval, params.length);
    let mut tasks = tokio::task::JoinSet::new();
    // Probes sent so far; each records one answer or one timeout.
    let mut spawned = 0usize;
    let drain = Drain {
        answers: PROBE_TIMEOUT.as_secs_f64(),
        settle: 0.0,
    };
    let mut schedule = Schedule::new(idle, vec![length; plan.len()], drain);
    let mut probe = Timer::new(0.0, PROBE_EVERY.as_secs_f64(), Pace::Grid);
    let mut sample = Timer::new(params.step, params.step, Pace::Grid);
    let mut snapshot = Timer::new(2.0, 2.0, Pace::Grid);
    let mut status = Timer::new(0.0, 0.25, Pace::Grid);
    let mut progress = crate::display::Progress::new(opts.progress);
    let mut status_bytes = (0u64, 0u64);
    let ended = loop {
        let t = st.t();
        if opts.stop.load(Ordering::Relaxed) {
            break Ended::Interrupted;
        }
        // A stage ends when its load saturated (below) or its length ran out. Its load goes
        // on, without new probes, until the probes sent under it are answered (through a deep
        // buffer a foreign probe's three round trips outlast the last intervals) or time out:
        // none of them finishes against another stage's load. Then the next stage begins.
        let answered = schedule.awaits_answers(t) && {
            let p = st.probes.lock().unwrap();
            p.foreign.len() + p.loaded.len() >= spawned
        };
        let phase = schedule.advance(t, answered);
        for (run, times) in st.stages.iter_mut().zip(schedule.stages()) {
            run.end = times.end;
        }
        match phase {
            Period::Done => break Ended::Complete,
            Period::Loading(i) if i == st.stages.len() => {
                stop.store(true, Ordering::Relaxed);
                load_tasks.abort_all();
                senders.lock().unwrap().clear();
                stop = Arc::new(AtomicBool::new(false));
                let start = schedule.stages()[i].start;
                st.stages.push(StageRun {
                    stage: plan[i],
                    start,
                    end: None,
                    ramp: RpmRamp::new(start, id),
                    flows: 0,
                });
            }
            _ => {}
        }
        let stage = st.current().map(|c| c.stage);
        if probe.fire(t) {
            if !matches!(phase, Period::Answering(_)) {
                spawn_foreign(
                    &mut tasks,
                    urls.clone(),
                    connector.clone(),
                    st.probes.clone(),
                    t,
                );
                spawned += 1;
            }
            if stage.is_some() {
                let s = senders.lock().unwrap();
                if !s.is_empty() {
                    let pick = &s[(t * 10.0) as usize % s.len()];
                    spawn_self(&mut tasks, pick, urls.clone(), st.probes.clone(), t);
                    spawned += 1;
                }
            }
        }
        if let Some(stage) = stage {
            let directions = [true, false]
                .into_iter()
                .filter(|d| stage.loads(*d))
                .collect::<Vec<_>>();
            let cur = st.stages.last().expect("a stage under way");
            let per_dir = cur.flows / directions.len();
            if cur.ramp.is_due(t) {
                let bytes = st.stage_bytes(stage);
                let probes = st.probes.lock().unwrap();
                let cur = st.stages.last_mut().expect("a stage under way");
                if cur
                    .ramp
                    .end_interval(t, bytes, &probes, Some(per_dir as u32))
                {
                    cur.end = Some(t);
                    schedule.end_stage(t);
                }
            }
            // The ramp says how many load connections each direction has by now.
            let cur = st.stages.last_mut().expect("a stage under way");
            let wanted = cur.ramp.connections() as usize;
            if cur.end.is_none() && per_dir < wanted {
                cur.flows += directions.len() * (wanted - per_dir);
                for n in per_dir + 1..=wanted {
                    for &down in &directions {
                        let f = Flow {
                            name: format!("{}-{n}", if down { "down" } else { "up" }),
                            down,
                            stage: st.stages.len() - 1,
                            bytes: Arc::default(),
                            samples: Vec::new(),
                            last: 0,
                            error: Arc::default(),
                            opened: Arc::default(),
                        };
                        spawn_load(
                            &mut load_tasks,
                            &f,
                            urls.clone(),
                            connector.clone(),
                            senders.clone(),
                            stop.clone(),
                            st.t0,
                        );
                        st.flows.push(f);
                    }
                }
            }
        }
        if sample.fire(t) {
            // Only the stage under way samples: a finished stage's series end with its load.
            let running = st.stages.len().checked_sub(1).filter(|_| stage.is_some());
            for f in st.flows.iter_mut().filter(|f| Some(f.stage) == running) {
                let b = f.bytes.load(Ordering::Relaxed);
                f.samples
                    .push((t, Some((b - f.last) as f64 * 8.0 / 1e6 / params.step)));
                f.last = b;
            }
        }
        if status.fire(t) {
            let sum = |down: bool| {
                st.flows
                    .iter()
                    .filter(|f| f.down == down)
                    .map(|f| f.bytes.load(Ordering::Relaxed))
                    .sum::<u64>()
            };
            let now_bytes = (sum(true), sum(false));
            // A self probe's time; before any (idle), a foreign probe's TCP connect: one round
            // trip.
            let rtt = {
                let p = st.probes.lock().unwrap();
                p.loaded
                    .iter()
                    .rev()
                    .find_map(|l| l.1)
                    .or_else(|| p.foreign.iter().rev().find_map(|f| f.tcp))
            };
            // While a stage waits for its last probes, its load still shows.
            let shown = st.stages.last().filter(|_| t >= idle).map(|s| s.stage);
            let mbps = |b: u64, a: u64, down: bool| {
                shown
                    .is_some_and(|s| s.loads(down))
                    .then(|| b.saturating_sub(a) as f64 * 8.0 / 1e6 / 0.25)
            };
            let phase = shown.map_or("idle", Stage::phase);
            let total = idle + length * plan.len() as f64;
            progress.update(&crate::display::Status {
                test: "rpm",
                phase,
                elapsed: t,
                total,
                down_mbps: mbps(now_bytes.0, status_bytes.0, true),
                up_mbps: mbps(now_bytes.1, status_bytes.1, false),
                rtt_ms: rtt,
                opening: 0,
            });
            status_bytes = now_bytes;
        }
        if snapshot.fire(t) {
            let snap = build(&meta, &st, idle, t, false);
            let p = path.clone();
            tokio::task::spawn_blocking(move || result::write_atomic(&p, &snap));
        }
        let ramp_due = st.current().map_or(f64::MAX, |c| c.ramp.next());
        let due = [probe, sample, snapshot, status]
            .iter()
            .map(Timer::next)
            .fold(ramp_due, f64::min);
        tokio::time::sleep(Duration::from_secs_f64((due - st.t()).clamp(0.000_5, 0.01))).await;
    };
    let end_t = st.t();
    progress.finish();
    if let Some(cur) = st.current() {
        cur.end = Some(end_t);
    }
    stop.store(true, Ordering::Relaxed);
    load_tasks.abort_all();
    tasks.abort_all();
    let mut final_result = build(&meta, &st, idle, end_t, true);
    final_result.partial = ended != Ended::Complete;
    if let Some(s) = final_result.summary.as_mut() {
        s.partial = final_result.partial;
    }
    if ended == Ended::Interrupted {
        final_result.events.push(result::Event {
            t: end_t,
            what: "interrupted by the user".into(),
        });
    }
    result::write_atomic(&path, &final_result).map_err(|e| e.to_string())?;
    Ok(Outcome {
        result: final_result,
        path,
        ended,
    })
}

fn spawn_foreign(
    tasks: &mut tokio::task::JoinSet<()>,
    urls: Arc<Urls>,
    connector: Connector,
    probes: Arc<Mutex<RpmProbes>>,
    t: f64,
) {
    tasks.spawn(async move {
        let rec = timeout(PROBE_TIMEOUT, async {
            let mut c = open(&urls.small, &connector).await.ok()?;
            let req = fetch(&mut c.sender, &urls.small, None, None).await.ok();
            Some((c.tcp_ms, c.tls_ms, req))
        })
        .await
        .ok()
        .flatten();
        let (tcp, tls_ms, req) = rec.map_or((None, None, None), |(a, b, c)| (Some(a), b, c));
        probes.lock().unwrap().foreign.push(ForeignProbe {
            sent: t,
            tcp,
            tls: tls_ms,
            request: req,
        });
    });
}

#[cfg(feature = "http2")]
fn spawn_self(
    tasks: &mut tokio::task::JoinSet<()>,
    sender: &H2,
    urls: Arc<Urls>,
    probes: Arc<Mutex<RpmProbes>>,
    t: f64,
) {
    let mut sender = Sender::H2(sender.clone());
    tasks.spawn(async move {
        let ms = timeout(PROBE_TIMEOUT, fetch(&mut sender, &urls.small, None, None))
            .await
            .ok()
            .and_then(Result::ok);
        probes.lock().unwrap().loaded.push((t, ms));
    });
}

/// Without HTTP/2 there is no sender to share (`H2` has no values).
#[cfg(not(feature = "http2"))]
fn spawn_self(
    _: &mut tokio::task::JoinSet<()>,
    sender: &H2,
    _: Arc<Urls>,
    _: Arc<Mutex<RpmProbes>>,
    _: f64,
) {
    match *sender {}
}

fn spawn_load(
    tasks: &mut tokio::task::JoinSet<()>,
    f: &Flow,
    urls: Arc<Urls>,
    connector: Connector,
    senders: Arc<Mutex<Vec<H2>>>,
    stop: Arc<AtomicBool>,
    t0: Instant,
) {
    let (down, bytes, error, opened) = (f.down, f.bytes.clone(), f.error.clone(), f.opened.clone());
    tasks.spawn(async move {
        let target = if down { &urls.large } else { &urls.upload };
        let outcome = async {
            let Opened {
                sender: mut s,
                socket,
                budget,
                ..
            } = open(target, &connector).await?;
            {
                let mut o = opened.lock().unwrap();
                o.start = Some(t0.elapsed().as_secs_f64());
                o.cc = (!down)
                    .then(|| bloatlab_netio::cc(socket.as_ref()))
                    .flatten();
            }
            // Self probes share HTTP/2 connections; an HTTP/1.1 one is busy with its load.
            if let Some(h2) = s.h2() {
                senders.lock().unwrap().push(h2);
            }
            if down {
                fetch(&mut s, target, Some(&*bytes), Some(&*stop))
                    .await
                    .map(drop)
            } else {
                s.ready().await?;
                // Upload goodput is what the server's TCP acknowledged: bytes handed to HTTP/2
                // also fill its send buffers and the path's queue (counted so, a 5 Mbit/s line
                // with a 1.45 s FIFO read 6.6 Mbit/s). TLS records and HTTP/2 frames add 0.2%.
                let acked = || {
                    bloatlab_netio::tcp_info(socket.as_ref())
                        .map(|i| i.bytes_acked)
                        .unwrap_or(0)
                };
                let base = acked();
                let body = ReqBody::Upload {
                    stop: stop.clone(),
                    socket: socket.clone(),
                    budget,
                };
                let send = s.send(request(target, body, true));
                let count = async {
                    loop {
                        bytes.store(acked().saturating_sub(base), Ordering::Relaxed);
                        tokio::time::sleep(ACKED_EVERY).await;
                    }
                };
                tokio::select! {
                    r = send => r.map(drop),
                    _ = count => unreachable!("the count runs until the upload ends"),
                }
            }
        }
        .await;
        if let Err(e) = outcome {
            if !stop.load(Ordering::Relaxed) {
                *error.lock().unwrap() = Some((t0.elapsed().as_secs_f64(), e));
            }
        }
    });
}

fn metadata(params: &Params, config_url: &str, target: &Target, http1: bool) -> Metadata {
    let transport = match (http1, target.tls) {
        (false, true) => "HTTP/2 over TLS",
        (false, false) => "HTTP/2 (cleartext)",
        (true, true) => "HTTP/1.1 over TLS",
        (true, false) => "HTTP/1.1 (cleartext)",
    };
    let server = Host {
        name: target.uri.host().unwrap_or_default().into(),
        address: Some(target.addr.to_string()),
        software: "a responsiveness server (HTTP)".into(),
        kernel: "unknown".into(),
        default_cc: "unknown".into(),
    };
    let mut meta = crate::run::new_metadata(params, server);
    meta.set_param("transport", transport);
    meta.set_param("config_url", config_url);
    meta
}

/// The result file as it stands at `t`: throughput per load connection, the probes' times as
/// the series the summary reads, the saturation run, and the summary.
fn build(meta: &Metadata, st: &State, idle: f64, t: f64, finished: bool) -> ResultFile {
    let mut r = ResultFile::new(meta.clone());
    r.partial = !finished;
    r.metadata.phases = vec![Phase {
        name: "idle".into(),
        start: 0.0,
        end: idle.min(t),
    }];
    for s in &st.stages {
        r.metadata.phases.push(Phase {
            name: s.stage.phase().into(),
            start: s.start,
            end: s.end.unwrap_or(t),
        });
    }
    // A sequential test's "load" spans both stages (its probes and connections).
    if let (Some(first), Some(last)) = (st.stages.first(), st.stages.last()) {
        if first.stage != Stage::Both {
            r.metadata.phases.push(Phase {
                name: "load".into(),
                start: first.start,
                end: last.end.unwrap_or(t),
            });
        }
    }
    let run = |stage: Stage| {
        st.stages
            .iter()
            .find(|s| s.stage == stage)
            .map(|s| s.ramp.run().clone())
    };
    match run(Stage::Both) {
        Some(both) => r.metadata.rpm = Some(both),
        None if !st.stages.is_empty() => {
            r.metadata.rpm_by_direction = Some(result::RpmRunByDirection {
                down: run(Stage::Down).unwrap_or_default(),
                up: run(Stage::Up).unwrap_or_default(),
            })
        }
        None => {}
    }
    r.metadata.set_param("load_connections", st.flows.len());
    for f in &st.flows {
        r.series.push(Series {
            name: f.name.clone(),
            kind: SeriesKind::Throughput,
            direction: Some(if f.down { "down" } else { "up" }.into()),
            dscp: None,
            unit: "Mbit/s".into(),
            samples: f.samples.clone(),
        });
        let error = f.error.lock().unwrap().clone();
        if let Some((at, why)) = &error {
            r.events.push(result::Event {
                t: *at,
                what: format!("load connection {} failed: {why}", f.name),
            });
        }
        r.metadata.flows.push({
            let o = f.opened.lock().unwrap();
            result::FlowInfo {
                name: f.name.clone(),
                cc: o.cc.clone(),
                start: o.start,
                error: error.map(|e| e.1),
                ..Default::default()
            }
        });
    }
    // No "rpm loaded" series without self probes: the summary then takes the foreign term alone.
    r.series.extend(st.probes.lock().unwrap().series());
    r.summary = Some(bloatlab_analyze::summarize(&r));
    r
}
