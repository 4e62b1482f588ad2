//! The client side of a measurement: turns a test plan into sockets, flows and probes and
//! produces timestamped samples in a result file. It knows nothing of grading or plotting
//! beyond calling `bloatlab-analyze` for the summary.

mod connprobe;
mod control;
pub mod display;
pub mod engine;
#[cfg(feature = "clap")]
pub mod flags;
mod flow;
pub mod hops;
pub mod http_rpm;
mod load;
pub mod localq;
pub mod marks;
pub mod mtu;
pub mod oneway;
pub mod pacing;
pub mod plan;
mod probe;
mod record;
mod run;
pub mod target;
mod udp_load;
pub mod watch;
pub mod writeback;

pub use plan::{Params, TestKind, UdpParams, MAX_FLOWS};
pub use run::{run, Ended, Outcome, RunOptions};

use std::net::SocketAddr;

/// Whether a target names a responsiveness config URL (the HTTP transport) rather than a
/// bloatlab server's HOST[:PORT].
pub fn is_url(target: &str) -> bool {
    target.starts_with("https://") || target.starts_with("http://")
}

/// Runs a network test against `target`: a bloatlab server's HOST[:PORT], or for `rpm` a
/// responsiveness config URL over `http`. The one entry the command line and the
/// experiments share.
pub fn run_target(
    params: &Params,
    target: &str,
    opts: &RunOptions,
    http: &http_rpm::HttpOptions,
) -> Result<Outcome, MeasureError> {
    if is_url(target) {
        http_rpm::run(params, target, opts, http)
    } else {
        run(params, target, opts)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("cannot resolve {host}: {why}")]
    Resolve { host: String, why: String },
    /// `test rpm URL`: the URL's server, its config or the transport failed (resolving too).
    #[error("{url}: {why}")]
    Http { url: String, why: String },
    #[error("cannot reach {addr}: {source}; is `bloatlab server` running there and TCP/UDP port \
        {port} open?", port = addr.port())]
    Unreachable {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{addr} does not speak this bloatlab protocol: {message}")]
    Version { addr: SocketAddr, message: String },
    #[error("server refused the test: {0}")]
    Busy(String),
    #[error("server refused the key: {0}")]
    Auth(String),
    #[error("server refused the test: {0}")]
    Refused(String),
    #[error("server refused the test token: {0}; the test may have outlived the server's limit")]
    Token(String),
    #[error("server closed the connection during the handshake")]
    HandshakeLost,
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Result(#[from] bloatlab_result::ResultError),
}

impl MeasureError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> MeasureError {
        let what = what.into();
        move |source| MeasureError::Io { what, source }
    }
}
