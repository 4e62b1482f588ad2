//! A `/metrics` face for Prometheus (`bloatlab monitor --metrics`): plain HTTP/1.1 on a tokio
//! runtime of its own thread, bounded as the server's other faces are: connection slots in all
//! and per address (RAII), headers within a deadline and at most 16 kB, each connection a task
//! under a total deadline, GET and HEAD of `/metrics` only.

use crate::limits::Slots;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What a scrape answers: the exposition text, rendered per request.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// OpenMetrics text, which Prometheus 2.x and 3.x both read (and which carries units).
pub const CONTENT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug)]
pub struct MetricsLimits {
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// Request line and headers within this, and the whole connection within `conn_time`.
    pub header_time: Duration,
    pub conn_time: Duration,
}

impl Default for MetricsLimits {
    fn default() -> Self {
        MetricsLimits {
            max_connections: 64,
            max_connections_per_ip: 8,
            header_time: Duration::from_secs(5),
            conn_time: Duration::from_secs(30),
        }
    }
}

/// The running face; dropping it stops it.
pub struct MetricsFace {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for MetricsFace {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Binds `listen` now (so a port in use is an error here, not later) and serves on a thread.
pub fn serve(
    listen: SocketAddr,
    limits: MetricsLimits,
    render: Render,
) -> std::io::Result<MetricsFace> {
    let std_listener = std::net::TcpListener::bind(listen)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                    return;
                };
                let slots = Slots::new(
                    "connections",
                    limits.max_connections,
                    limits.max_connections_per_ip,
                );
                tokio::select! {
                    _ = stop_rx => {}
                    _ = accept_loop(listener, slots, limits, render) => {}
                }
            })
        })?;
    Ok(MetricsFace {
        addr,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    slots: Arc<Slots>,
    limits: MetricsLimits,
    render: Render,
) {
    loop {
        let (stream, peer) = crate::conn::accept(&listener).await;
        // No slot: closed at once (a scraper retries at its next interval).
        let Ok(slot) = slots.take(peer.ip().to_canonical()) else {
            continue;
        };
        let (render, limits) = (render.clone(), limits.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let svc = hyper::service::service_fn(move |req| {
                let render = render.clone();
                async move { Ok::<_, Infallible>(answer(&req, &render)) }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(limits.header_time)
                .max_buf_size(16 * 1024);
            let conn = b.serve_connection(TokioIo::new(stream), svc);
            let _ = tokio::time::timeout(limits.conn_time, conn).await;
        });
    }
}

fn answer<B>(req: &Request<B>, render: &Render) -> Response<Full<Bytes>> {
    let status = |code: StatusCode, text: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = code;
        r
    };
    if req.uri().path() != "/metrics" {
        return status(StatusCode::NOT_FOUND, "bloatlab monitor: see /metrics\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return status(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
    }
    let mut r = Response::new(Full::new(Bytes::from(render())));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_metrics_and_bounds_what_a_client_can_hold() {
        let limits = MetricsLimits {
            max_connections: 4,
            max_connections_per_ip: 2,
            header_time: Duration::from_millis(300),
            conn_time: Duration::from_secs(2),
        };
        let face = serve(
            "127.0.0.1:0".parse().unwrap(),
            limits,
            Arc::new(|| "x_total 1\n# EOF\n".to_string()),
        )
        .unwrap();
        let ok = get(
            face.addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("application/openmetrics-text"), "{ok}");
        assert!(ok.ends_with("x_total 1\n# EOF\n"), "{ok}");
        let other = get(
            face.addr,
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        let post = get(
            face.addr,
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        // Huge headers: refused, not buffered.
        let mut huge = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
        huge.extend(b"\r\n\r\n");
        let r = get(face.addr, &huge);
        assert!(!r.contains("x_total"), "{r}");
        // Two silent connections hold this address's slots; they are let go at the header
        // deadline, and a third meanwhile is closed without an answer.
        let slow: Vec<_> = (0..2)
            .map(|_| std::net::TcpStream::connect(face.addr).unwrap())
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let third = get(
            face.addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(third, "", "a third connection from the address was served");
        std::thread::sleep(Duration::from_millis(600));
        let after = get(
            face.addr,
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(after.starts_with("HTTP/1.1 200"), "{after}");
        drop(slow);
    }
}

/// A gauge's f64 on a portable 64-bit atomic: prometheus-client's own (`Gauge<f64, AtomicU64>`)
/// exists only where the CPU has 64-bit atomics, and 32-bit MIPS routers have none.
#[derive(Debug, Default)]
pub struct F64(portable_atomic::AtomicU64);

impl F64 {
    /// Applies `f` to the value; returns the value before.
    fn update(&self, f: impl Fn(f64) -> f64) -> f64 {
        let bits = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(f(f64::from_bits(b)).to_bits())
            });
        f64::from_bits(bits.unwrap_or_else(|b| b))
    }
}

impl prometheus_client::metrics::gauge::Atomic<f64> for F64 {
    fn inc(&self) -> f64 {
        self.update(|v| v + 1.0)
    }
    fn inc_by(&self, by: f64) -> f64 {
        self.update(|v| v + by)
    }
    fn dec(&self) -> f64 {
        self.update(|v| v - 1.0)
    }
    fn dec_by(&self, by: f64) -> f64 {
        self.update(|v| v - by)
    }
    fn set(&self, v: f64) -> f64 {
        f64::from_bits(self.0.swap(v.to_bits(), Ordering::Relaxed))
    }
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A counter's u64 on a portable 64-bit atomic (prometheus-client counts in u32 where the CPU
/// has no 64-bit atomics: bytes would wrap at 4 GB).
#[derive(Debug, Default)]
pub struct U64(portable_atomic::AtomicU64);

impl prometheus_client::metrics::counter::Atomic<u64> for U64 {
    fn inc(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
    fn inc_by(&self, by: u64) -> u64 {
        self.0.fetch_add(by, Ordering::Relaxed)
    }
    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The metrics' types, on those values.
pub type FGauge = prometheus_client::metrics::gauge::Gauge<f64, F64>;
pub type UCounter = prometheus_client::metrics::counter::Counter<u64, U64>;
