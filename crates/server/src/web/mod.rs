//! The server's HTTP face: the responsiveness endpoints of draft-ietf-ippm-responsiveness over
//! HTTP/1.1 and HTTP/2, plain (`--http`, for LANs) and over TLS (`--https`, ALPN `h2` and
//! `http/1.1`). It runs in the runtime of bloatlab's own protocol and takes its connection slots
//! from the same limits, in all and per address: every connection a task under a total
//! deadline, its slot given back however it ends. A client without a slot is answered 429 with
//! `Retry-After` (a few at once, briefly), never left hanging.
//!
//! What one client address can take: `max_connections_per_ip` connections (64 by default, as
//! for the bloatlab protocol), each for at most `max_conn_time` (120 s), with at most
//! `max_streams` HTTP/2 streams each, and `max_bytes_per_ip` bytes through `/large` and
//! `/slurp` together per `budget_window` (20 GB per 10 minutes by default); then 429. Idle
//! connections give their slots back early (`idle`).
//!
//! The same face serves the browser test (`GET /`): a page whose load runs on `/large` and
//! `/slurp`, whose latency probes run on a WebSocket port of their own (`ws`), and whose
//! measurements come back to `/web/result` to be summarized as a CLI result (`results`).

mod ack;
mod budget;
/// Public for the fuzzer (fuzz/fuzz_targets/web_request.rs).
pub mod endpoints;
mod idle;
#[cfg(feature = "browser")]
pub mod results;
#[cfg(feature = "browser")]
pub mod rtc;
#[cfg(feature = "https")]
pub mod tls;
#[cfg(feature = "browser")]
mod views;
#[cfg(feature = "browser")]
pub mod ws;

#[cfg(feature = "browser")]
pub use views::LoadView;

#[cfg(feature = "https")]
use crate::handshake::handshake_within;
use crate::limits::Slot;
use crate::Shared;
#[cfg(feature = "https")]
use bloatlab_netio::sendbuf::BudgetedTls;
use bloatlab_netio::sendbuf::{self, SendBudget, UnsentLimited};
use budget::Budgets;
use endpoints::Route;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
#[cfg(feature = "http2")]
use hyper_util::rt::TokioExecutor;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
#[cfg(any(feature = "browser", feature = "https"))]
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

#[derive(Clone, Debug)]
pub struct WebConfig {
    /// Plain HTTP listener.
    pub http: Option<SocketAddr>,
    /// HTTPS listener; needs `tls`.
    #[cfg(feature = "https")]
    pub https: Option<SocketAddr>,
    /// Certificate chain and key (PEM), re-read on SIGHUP.
    #[cfg(feature = "https")]
    pub tls: Option<(PathBuf, PathBuf)>,
    /// `test_endpoint` for the config: where clients should connect instead.
    pub test_endpoint: Option<String>,
    pub max_bytes_per_ip: u64,
    pub budget_window: Duration,
    pub max_conn_time: Duration,
    pub max_streams: u32,
    /// The browser test's WebSocket probe port (plain and, with a certificate, TLS).
    #[cfg(feature = "browser")]
    pub ws: Option<SocketAddr>,
    /// Where browser results are kept, and how many at most.
    #[cfg(feature = "browser")]
    pub keep_results: Option<PathBuf>,
    #[cfg(feature = "browser")]
    pub keep_max: usize,
    /// The browser test's phase lengths, seconds: idle, then each load phase.
    #[cfg(feature = "browser")]
    pub page_idle: f64,
    #[cfg(feature = "browser")]
    pub page_length: f64,
}

impl Default for WebConfig {
    fn default() -> Self {
        WebConfig {
            http: None,
            #[cfg(feature = "https")]
            https: None,
            #[cfg(feature = "https")]
            tls: None,
            test_endpoint: None,
            max_bytes_per_ip: 20_000_000_000,
            budget_window: Duration::from_secs(600),
            max_conn_time: Duration::from_secs(120),
            max_streams: 100,
            #[cfg(feature = "browser")]
            ws: None,
            #[cfg(feature = "browser")]
            keep_results: None,
            #[cfg(feature = "browser")]
            keep_max: 1000,
            #[cfg(feature = "browser")]
            page_idle: 5.0,
            #[cfg(feature = "browser")]
            page_length: 30.0,
        }
    }
}

/// Bytes `/large` sends: at least 8 GB, as the draft asks; clients close it early.
const LARGE_BYTES: u64 = 8 << 30;
/// Incompressible data, sent again and again (each chunk is a slice of this buffer, at most
/// the largest send budget).
const CHUNK: usize = sendbuf::MAX;
/// Every this many bytes `/large` charges its address's byte budget, and `/large` and `/slurp`
/// note the server's view of the path. At least CHUNK.
const CHARGE_EVERY: u64 = 1 << 20;
/// How many bytes `/slurp` receives between updates of the address's upload count.
#[cfg(feature = "browser")]
const UPLOAD_COUNT_EVERY: u64 = 16 * 1024;
/// How long a connection refused for want of a slot may take to hear why.
const REFUSE_TIME: Duration = Duration::from_secs(5);

/// What a listener serves TLS with: its certificate; in a build without TLS there is none to
/// give, and `Option<Cert>` is always `None`.
#[cfg(feature = "https")]
pub(crate) type Cert = Arc<tls::Tls>;
#[cfg(not(feature = "https"))]
#[derive(Clone)]
pub(crate) enum Cert {}

/// What every HTTP connection shares.
pub(crate) struct Web {
    cfg: WebConfig,
    budgets: Budgets,
    chunk: Bytes,
    #[cfg(feature = "browser")]
    page: Page,
}

/// The browser test's side of the face.
#[cfg(feature = "browser")]
pub(crate) struct Page {
    /// The path as the server sees it under the page's load (/large, /slurp), for its probes.
    load_views: views::LoadViews,
    /// The probe port as bound (the page is told it).
    ws_port: Option<u16>,
    /// WebRTC probes on the probe port's number over UDP, where it could be bound.
    rtc: Option<rtc::Face>,
    keeper: Option<results::Keeper>,
}

#[cfg(feature = "browser")]
impl Page {
    pub(crate) fn new(
        cfg: &WebConfig,
        ws_port: Option<u16>,
        rtc: Option<rtc::Face>,
    ) -> std::io::Result<Page> {
        let keeper = cfg
            .keep_results
            .clone()
            .map(|d| results::Keeper::new(d, cfg.keep_max))
            .transpose()?;
        Ok(Page {
            load_views: Default::default(),
            ws_port,
            rtc,
            keeper,
        })
    }
}

impl Web {
    pub(crate) fn new(
        cfg: WebConfig,
        #[cfg(feature = "browser")] page: Page,
    ) -> std::io::Result<Web> {
        let mut chunk = vec![0u8; CHUNK];
        getrandom::fill(&mut chunk)
            .map_err(|_| std::io::Error::other("no randomness for /large"))?;
        Ok(Web {
            budgets: Budgets::new(cfg.max_bytes_per_ip, cfg.budget_window),
            cfg,
            chunk: Bytes::from(chunk),
            #[cfg(feature = "browser")]
            page,
        })
    }
}

/// A connection's standing: a slot, or (none free) a brief refusal.
enum Admit {
    Slot { _held: Slot },
    Refuse { _held: Slot, why: String },
}

/// The next connection from an address `--allow` admits; others are closed without a word (the
/// bloatlab protocol says why; HTTP would cost a TLS handshake first).
pub(crate) async fn accept_allowed(listener: &TcpListener, shared: &Shared) -> (TcpStream, IpAddr) {
    loop {
        let (stream, peer) = crate::conn::accept(listener).await;
        let ip = peer.ip().to_canonical();
        if shared.allowed(ip) {
            return (stream, ip);
        }
        shared.counters.not_allowed.fetch_add(1, Ordering::Relaxed);
    }
}

pub(crate) async fn accept_loop(
    listener: TcpListener,
    tls: Option<Cert>,
    shared: Arc<Shared>,
    web: Arc<Web>,
) {
    loop {
        let (stream, ip) = accept_allowed(&listener, &shared).await;
        let admit = match shared.connections.take(ip) {
            Ok(slot) => Admit::Slot { _held: slot },
            Err(full) => match shared.refusing.take(ip) {
                Ok(slot) => Admit::Refuse {
                    _held: slot,
                    why: full.to_string(),
                },
                Err(_) => continue,
            },
        };
        tokio::spawn(serve_conn(
            stream,
            ip,
            admit,
            tls.clone(),
            shared.clone(),
            web.clone(),
        ));
    }
}

/// Per connection: who it is, and what it may do.
struct Conn {
    ip: IpAddr,
    scheme: &'static str,
    local: String,
    /// The address the connection came in on: WebRTC's candidate.
    #[cfg(feature = "browser")]
    local_ip: Option<IpAddr>,
    refuse: Option<String>,
    /// A second handle on the socket, for TCP_NOTSENT_LOWAT while `/large` sends.
    socket: Option<Arc<OwnedFd>>,
    /// What `/large` may keep in the server's own buffers, from the connection's rate.
    send_budget: SendBudget,
    web: Arc<Web>,
}

async fn serve_conn(
    stream: TcpStream,
    ip: IpAddr,
    admit: Admit,
    tls: Option<Cert>,
    shared: Arc<Shared>,
    web: Arc<Web>,
) {
    let (limit, refuse) = match &admit {
        Admit::Slot { .. } => (web.cfg.max_conn_time, None),
        Admit::Refuse { why, .. } => (REFUSE_TIME, Some(why.clone())),
    };
    let _ = stream.set_nodelay(true);
    // The draft: the server adds no queue of its own. Set before TLS, re-set as the rate grows.
    let _ = bloatlab_netio::keep_unsent_small(&stream);
    let conn = Arc::new(Conn {
        ip,
        scheme: if tls.is_some() { "https" } else { "http" },
        local: stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default(),
        #[cfg(feature = "browser")]
        local_ip: stream.local_addr().ok().map(|a| a.ip().to_canonical()),
        refuse,
        socket: stream.as_fd().try_clone_to_owned().ok().map(Arc::new),
        send_budget: SendBudget::default(),
        web,
    });
    let handshake = shared.config.hello_timeout;
    let crowded = move || shared.connections.crowded(ip);
    let stream = ack::AckNow(UnsentLimited(stream));
    let _ = timeout(limit, async move {
        match tls {
            #[cfg(feature = "https")]
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
                if let Some(Ok(tls)) =
                    handshake_within(acceptor.accept(stream), handshake, &crowded).await
                {
                    let budget = conn.send_budget.clone();
                    serve_http(
                        TokioIo::new(BudgetedTls { tls, budget }),
                        conn,
                        handshake,
                        crowded,
                    )
                    .await;
                }
            }
            None => serve_http(TokioIo::new(stream), conn, handshake, crowded).await,
        }
    })
    .await;
    drop(admit);
}

/// Serves one connection until it ends, or until it is idle (`idle`; `crowded`: half the
/// connection slots are held, in all or by this address).
async fn serve_http<I>(io: I, conn: Arc<Conn>, header_time: Duration, crowded: impl Fn() -> bool)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    #[cfg(feature = "http2")]
    let max_streams = conn.web.cfg.max_streams;
    let rtt = {
        let socket = conn.socket.clone();
        move || {
            socket
                .as_ref()
                .and_then(|s| bloatlab_netio::tcp_info(s.as_ref()).ok())
                .map_or(Duration::ZERO, |i| Duration::from_micros(i.rtt_us.into()))
        }
    };
    let activity = idle::Activity::new(tokio::time::Instant::now());
    let svc = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req| {
            let (conn, busy) = (conn.clone(), activity.begin(tokio::time::Instant::now()));
            async move {
                Ok::<_, Infallible>(
                    answer(req, conn)
                        .await
                        .map(|body| idle::Tracked { body, _busy: busy }),
                )
            }
        })
    };
    #[cfg(feature = "http2")]
    let mut b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    #[cfg(feature = "http2")]
    let served = {
        // Headers within the handshake's deadline (no slowloris), and bounded.
        b.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_time)
            .max_buf_size(64 * 1024);
        // Hyper hands HTTP/2 a body's next chunk only when the stream's buffer is below its
        // send buffer size: 1 makes that one chunk at a time, sized by `/large` to the
        // connection's rate (netio's sendbuf).
        b.http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(max_streams)
            .max_header_list_size(16 * 1024)
            .adaptive_window(true)
            .max_send_buf_size(1);
        b.serve_connection(io, svc)
    };
    // A build without HTTP/2 (the router's) serves HTTP/1.1 alone, with the same bounds.
    #[cfg(not(feature = "http2"))]
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_time)
        .max_buf_size(64 * 1024)
        .serve_connection(io, svc);
    tokio::pin!(served);
    tokio::select! {
        _ = served.as_mut() => return,
        _ = idle::until_idle(&activity, header_time, crowded, rtt) => {
            // Mid-header (slowloris) hyper's graceful shutdown would wait for the rest.
            if !activity.answered() {
                return;
            }
            served.as_mut().graceful_shutdown();
        }
    }
    // HTTP/2's goodbye (GOAWAY, PING, GOAWAY) waits for the client's PING acknowledgement: a
    // client that never answers would hold its slot until the connection's deadline.
    let _ = timeout(idle::IDLE, served).await;
}

/// The body of a reply: a few bytes, or `/large`'s stream.
pub(crate) enum Reply {
    Bytes(Option<Bytes>),
    Large(Large),
}

impl Body for Reply {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(match self.get_mut() {
            Reply::Bytes(b) => b.take().map(|b| Ok(Frame::data(b))),
            Reply::Large(l) => l.next(),
        })
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Reply::Bytes(b) => b.is_none(),
            Reply::Large(l) => l.left == 0,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(match self {
            Reply::Bytes(b) => b.as_ref().map_or(0, |b| b.len() as u64),
            Reply::Large(l) => l.left,
        })
    }
}

/// `/large`: the shared random chunk until LARGE_BYTES are sent, the client closes, or its
/// address's budget runs out (then the stream ends early, an error to the client).
pub(crate) struct Large {
    left: u64,
    sent: u64,
    /// Bytes sent when the address's budget is next charged.
    charge_at: u64,
    conn: Arc<Conn>,
}

impl Large {
    fn next(&mut self) -> Option<Result<Frame<Bytes>, std::io::Error>> {
        if self.left == 0 {
            return None;
        }
        // Each chunk: the kernel's unsent limit follows the connection's current rate (5 ms of
        // it), and the chunk, all HTTP/2 holds of this stream, is as large (so is TLS's buffer,
        // both within sendbuf's bounds).
        let socket = self.conn.socket.as_ref();
        let info = socket.and_then(|s| bloatlab_netio::tcp_info(s.as_ref()).ok());
        let allowed = socket.map_or(sendbuf::MIN, |s| {
            self.conn.send_budget.follow(s.as_ref(), info.as_ref())
        });
        let n = self.left.min(allowed as u64);
        // Once per MiB: the address's byte budget is charged for the MiB ahead (an address may be
        // charged up
        // to 1 MiB per connection it did not take) and the server's view of the path is noted.
        if self.sent >= self.charge_at {
            self.charge_at += CHARGE_EVERY;
            if self
                .conn
                .web
                .budgets
                .charge(self.conn.ip, self.left.min(CHARGE_EVERY), Instant::now())
                .is_err()
            {
                self.left = 0;
                return Some(Err(std::io::Error::other(
                    "this address's byte budget is used up",
                )));
            }
            #[cfg(feature = "browser")]
            if let Some(info) = info {
                self.conn.web.page.load_views.record(
                    self.conn.ip,
                    views::Way::Down,
                    info.rtt_us,
                    Instant::now(),
                );
            }
        }
        (self.left, self.sent) = (self.left - n, self.sent + n);
        Some(Ok(Frame::data(self.conn.web.chunk.slice(..n as usize))))
    }
}

fn reply(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Reply> {
    let mut r = Response::new(Reply::Bytes(Some(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn too_many(why: &str, retry_after: Duration) -> Response<Reply> {
    let mut r = reply(
        StatusCode::TOO_MANY_REQUESTS,
        "text/plain; charset=utf-8",
        format!("{why}\n"),
    );
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry_after.as_secs().max(1)));
    r
}

fn budget_refusal(conn: &Conn, retry: Duration) -> Response<Reply> {
    let (max, window) = conn.web.budgets.limits();
    too_many(
        &format!(
            "your address has moved {:.1} GB through this server in the last {} minutes, its limit",
            max as f64 / 1e9,
            window.as_secs() / 60
        ),
        retry,
    )
}

async fn answer(req: Request<Incoming>, conn: Arc<Conn>) -> Response<Reply> {
    let mut r = match &conn.refuse {
        Some(why) => too_many(why, Duration::from_secs(60)),
        None => route(req, &conn).await,
    };
    // Measurements must never come from a cache.
    r.headers_mut().insert(
        CACHE_CONTROL,
        HeaderValue::from_static("no-store, must-revalidate, private, max-age=0"),
    );
    r
}

async fn route(req: Request<Incoming>, conn: &Arc<Conn>) -> Response<Reply> {
    let head = req.method() == hyper::Method::HEAD;
    let mut r = match endpoints::route(req.method().as_str(), req.uri().path()) {
        Route::Config => {
            let asked = req
                .uri()
                .authority()
                .map(|a| a.as_str())
                .or_else(|| req.headers().get(HOST).and_then(|h| h.to_str().ok()));
            let body = endpoints::config_json(
                conn.scheme,
                endpoints::authority(asked, &conn.local),
                conn.web.cfg.test_endpoint.as_deref(),
            );
            reply(StatusCode::OK, "application/json", body)
        }
        Route::Small => reply(
            StatusCode::OK,
            "application/octet-stream",
            Bytes::from_static(b"x"),
        ),
        Route::Large => match conn.web.budgets.charge(conn.ip, 0, Instant::now()) {
            Err(retry) => budget_refusal(conn, retry),
            Ok(()) => {
                let mut r = Response::new(Reply::Large(Large {
                    left: LARGE_BYTES,
                    sent: 0,
                    charge_at: 0,
                    conn: conn.clone(),
                }));
                r.headers_mut().insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                );
                r
            }
        },
        Route::Slurp => return slurp(req, conn).await,
        #[cfg(feature = "browser")]
        Route::Page => page(reply(
            StatusCode::OK,
            "text/html; charset=utf-8",
            Bytes::from_static(include_bytes!("page/index.html")),
        )),
        #[cfg(feature = "browser")]
        Route::PageScript => page(reply(
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            Bytes::from_static(include_bytes!("page/page.js")),
        )),
        #[cfg(feature = "browser")]
        Route::ProbeWorker => page(reply(
            StatusCode::OK,
            "text/javascript; charset=utf-8",
            Bytes::from_static(include_bytes!("page/probe-worker.js")),
        )),
        #[cfg(feature = "browser")]
        Route::PageConfig => reply(
            StatusCode::OK,
            "application/json",
            endpoints::page_config_json(
                conn.web.page.ws_port,
                conn.web.page.rtc.is_some(),
                conn.web.cfg.page_idle,
                conn.web.cfg.page_length,
            ),
        ),
        #[cfg(feature = "browser")]
        Route::PageResult => return page_result(req, conn).await,
        #[cfg(feature = "browser")]
        Route::RtcOffer => return rtc_offer(req, conn).await,
        #[cfg(not(feature = "browser"))]
        Route::Page
        | Route::PageScript
        | Route::ProbeWorker
        | Route::PageConfig
        | Route::PageResult
        | Route::RtcOffer => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "this server was built without the browser test\n",
        ),
        Route::MethodNotAllowed => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "method not allowed\n",
        ),
        Route::NotFound => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        ),
    };
    if head {
        *r.body_mut() = Reply::Bytes(None);
    }
    r
}

/// The page's own files: nothing but this server's scripts and its probe port may run or be
/// reached from them.
#[cfg(feature = "browser")]
fn page(mut r: Response<Reply>) -> Response<Reply> {
    let h = r.headers_mut();
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'self'; connect-src 'self' ws: wss:; style-src \
            'self' 'unsafe-inline'; img-src 'self' data:; worker-src 'self'; frame-ancestors \
            'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// `/slurp`: reads the whole upload and forgets it, counting it against the address's budget.
async fn slurp(req: Request<Incoming>, conn: &Conn) -> Response<Reply> {
    use http_body_util::BodyExt;
    let mut body = req.into_body();
    let mut got = 0u64;
    #[cfg(feature = "browser")]
    let mut uncounted = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return reply(
                StatusCode::BAD_REQUEST,
                "text/plain; charset=utf-8",
                "upload broken off\n",
            );
        };
        if let Some(d) = frame.data_ref() {
            // What arrived, for the browser test's upload goodput (in batches: one lock each).
            #[cfg(feature = "browser")]
            {
                uncounted += d.len() as u64;
                if uncounted >= UPLOAD_COUNT_EVERY {
                    conn.web.page.load_views.count_upload(
                        conn.ip,
                        std::mem::take(&mut uncounted),
                        Instant::now(),
                    );
                }
            }
            // The receiver's view of the upload's path, for the browser test's probes.
            #[cfg(feature = "browser")]
            if got % CHARGE_EVERY + d.len() as u64 >= CHARGE_EVERY {
                if let Some(info) = conn
                    .socket
                    .as_ref()
                    .and_then(|s| bloatlab_netio::tcp_info(s.as_ref()).ok())
                {
                    conn.web.page.load_views.record(
                        conn.ip,
                        views::Way::Up,
                        info.rcv_rtt_us,
                        Instant::now(),
                    );
                }
            }
            got += d.len() as u64;
            if let Err(retry) = conn
                .web
                .budgets
                .charge(conn.ip, d.len() as u64, Instant::now())
            {
                return budget_refusal(conn, retry);
            }
        }
    }
    #[cfg(feature = "browser")]
    conn.web
        .page
        .load_views
        .count_upload(conn.ip, uncounted, Instant::now());
    reply(
        StatusCode::OK,
        "text/plain; charset=utf-8",
        format!("{got}\n"),
    )
}

/// A request's body, counted as it arrives: at most `max` bytes of `what`.
#[cfg(feature = "browser")]
async fn read_body(
    req: Request<Incoming>,
    max: usize,
    what: &str,
) -> Result<Vec<u8>, Response<Reply>> {
    use http_body_util::BodyExt;
    let text = "text/plain; charset=utf-8";
    let mut body = req.into_body();
    let mut raw = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Err(reply(StatusCode::BAD_REQUEST, text, "upload broken off\n"));
        };
        if let Some(d) = frame.data_ref() {
            if raw.len() + d.len() > max {
                let why = format!("{what} is at most {} kB\n", max >> 10);
                return Err(reply(StatusCode::PAYLOAD_TOO_LARGE, text, why));
            }
            raw.extend_from_slice(d);
        }
    }
    Ok(raw)
}

/// Answers a WebRTC offer (`rtc`): the SDP answer, or why not.
#[cfg(feature = "browser")]
async fn rtc_offer(req: Request<Incoming>, conn: &Conn) -> Response<Reply> {
    let text = "text/plain; charset=utf-8";
    let (Some(face), Some(local)) = (&conn.web.page.rtc, conn.local_ip) else {
        return reply(
            StatusCode::NOT_FOUND,
            text,
            "this server has no WebRTC probes\n",
        );
    };
    let raw = match read_body(req, rtc::MAX_OFFER, "an offer").await {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    let Ok(offer) = std::str::from_utf8(&raw) else {
        return reply(StatusCode::BAD_REQUEST, text, "an offer is SDP text\n");
    };
    match face.offer(offer, local, conn.ip) {
        Ok(answer) => reply(StatusCode::OK, "application/sdp", answer),
        Err(rtc::Refused::Offer(why)) => reply(StatusCode::BAD_REQUEST, text, format!("{why}\n")),
        Err(rtc::Refused::Busy(why)) => too_many(&why, Duration::from_secs(5)),
    }
}

/// `/web/result`: the browser test's measurements, summarized into a result file (kept with
/// `--keep-web-results`) and sent back whole. The body is counted as it arrives.
#[cfg(feature = "browser")]
async fn page_result(req: Request<Incoming>, conn: &Conn) -> Response<Reply> {
    let bad = |why: String| {
        reply(
            StatusCode::BAD_REQUEST,
            "text/plain; charset=utf-8",
            format!("{why}\n"),
        )
    };
    let raw = match read_body(req, results::MAX_UPLOAD, "a result").await {
        Ok(raw) => raw,
        Err(r) => return r,
    };
    let upload: results::Upload = match serde_json::from_slice(&raw) {
        Ok(u) => u,
        // serde's message names the field and position, never echoes the input.
        Err(e) => return bad(format!("not a browser result: {e}")),
    };
    if let Err(why) = results::validate(&upload) {
        return bad(why);
    }
    let web = conn.web.clone();
    let ip = conn.ip;
    let done = tokio::task::spawn_blocking(move || {
        let now = std::time::SystemTime::now();
        let server = bloatlab_result::Host {
            name: bloatlab_netio::hostname(),
            address: None,
            software: format!("bloatlab {}", env!("CARGO_PKG_VERSION")),
            kernel: bloatlab_netio::kernel(),
            default_cc: bloatlab_netio::default_cc(),
        };
        let r = results::result_file(
            upload,
            ip,
            server,
            humantime::format_rfc3339_millis(now).to_string(),
        );
        if let Some(k) = &web.page.keeper {
            let ms = now
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            if let Err(e) = k.store(&r, ms) {
                eprintln!("bloatlab server: keeping a browser result: {e}");
            }
        }
        serde_json::to_vec(&r)
    })
    .await;
    match done {
        Ok(Ok(json)) => reply(StatusCode::OK, "application/json", json),
        _ => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain; charset=utf-8",
            "the result could not be made\n",
        ),
    }
}
