//! `bloatlab server`'s flags and the `Config` they make (with the `clap` feature): the
//! binary flattens `ServerArgs` into its command line.

#[cfg(feature = "https")]
use crate::web::tls;
use crate::web::WebConfig;
use crate::{proto, Config};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Address and port to listen on (TCP and UDP); `[::]` also accepts IPv4.
    #[arg(long, default_value_t = SocketAddr::from(([0u16; 8], proto::DEFAULT_PORT)))]
    pub listen: SocketAddr,
    /// Tests that may run at once; further clients are told the server is busy.
    #[arg(long, default_value_t = 4)]
    pub max_tests: usize,
    /// Longest test accepted, in seconds (idle phase included).
    #[arg(long, default_value_t = 180)]
    pub max_duration: u64,
    /// Tests one client address may run at once.
    #[arg(long, default_value_t = 2)]
    pub max_tests_per_ip: usize,
    /// Most bulk TCP flows in one test.
    #[arg(long, default_value_t = 32)]
    pub max_flows: usize,
    /// Most UDP probe streams in one test.
    #[arg(long, default_value_t = 8)]
    pub max_streams: usize,
    /// Most probe packets per second one test may announce, all its streams together.
    #[arg(long, default_value_t = 2000)]
    pub max_probe_pps: u32,
    /// Mbit/s one test may move, both directions together (bulk flows are paced to it).
    /// Default: no limit.
    #[arg(long)]
    pub max_rate: Option<f64>,
    /// Mbit/s of UDP load one test may announce (`test udp`); the server counts what arrives
    /// and holds each load to twice its announced rate.
    #[arg(long, default_value_t = 1000.0)]
    pub max_udp_rate: f64,
    /// TCP connections open at once, of every kind; further ones are told the server is busy.
    #[arg(long, default_value_t = 512)]
    pub max_connections: usize,
    /// TCP connections one client address may have open at once.
    #[arg(long, default_value_t = 64)]
    pub max_connections_per_ip: usize,
    /// Require this shared key (a file of at least 16 bytes; or the key itself in
    /// BLOATLAB_KEY): clients prove it in the handshake (bloatlab test --key) and sign every
    /// UDP probe; unsigned probes are dropped and counted.
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Serve only clients in these networks (CIDR, repeatable: --allow 192.0.2.0/24 --allow
    /// 2001:db8::/32). Default: everyone.
    #[arg(long, value_name = "CIDR")]
    pub allow: Vec<ipnet::IpNet>,
    /// DSCP marks clients may ask for (comma-separated numbers or names: BE,BK,EF,CS5).
    /// Default: all.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = proto::parse_dscp
    )]
    pub allow_dscp: Option<Vec<u8>>,
    /// Tell clients without the key this host's kernel version and TCP congestion control
    /// (recorded in their results); by default only clients with the key learn them.
    #[arg(long)]
    pub expose_host: bool,
    /// Do not log each test to stderr (the one "listening on" line is still printed: with
    /// port 0 it is the only way to learn the port).
    #[arg(long, short)]
    pub quiet: bool,
    /// Also serve the responsiveness endpoints (draft-ietf-ippm-responsiveness: config at
    /// /.well-known/nq and /config, /small, /large, /slurp) over HTTPS on this port (or
    /// ADDR:PORT): HTTP/2 and HTTP/1.1 by ALPN, TLS 1.2 and 1.3. Needs --cert and --cert-key,
    /// or --self-signed. Other RPM clients (networkQuality, mach, goresponsiveness) can then
    /// test against this server.
    #[cfg(feature = "https")]
    #[arg(long, value_name = "PORT", value_parser = parse_listen)]
    pub https: Option<SocketAddr>,
    /// The same endpoints over plain HTTP (for LANs and clients without TLS).
    #[arg(long, value_name = "PORT", value_parser = parse_listen)]
    pub http: Option<SocketAddr>,
    /// The browser test's latency probe port: WebRTC over UDP (lost probes count as lost), and
    /// WebSockets over TCP as the fallback (TLS too when --https has a certificate). Any
    /// browser then runs the test at http(s)://THIS-HOST:PORT/ (with ?autostart=1 it starts at
    /// once; ?length=S&idle=S shorten it; ?probes=websocket skips WebRTC).
    #[cfg(feature = "browser")]
    #[arg(long, value_name = "PORT", value_parser = parse_listen)]
    pub ws: Option<SocketAddr>,
    /// Keep every browser test's result file here (the newest --keep-max; `bloatlab report`
    /// reads them like any other).
    #[cfg(feature = "browser")]
    #[arg(long, value_name = "DIR")]
    pub keep_web_results: Option<PathBuf>,
    /// How many browser results --keep-web-results keeps at most (the oldest go first).
    #[cfg(feature = "browser")]
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub keep_max: usize,
    /// Certificate chain for --https (PEM); re-read on SIGHUP.
    #[cfg(feature = "https")]
    #[arg(
        long,
        value_name = "FILE",
        requires = "cert_key",
        conflicts_with = "self_signed"
    )]
    pub cert: Option<PathBuf>,
    /// The certificate's private key (PEM). (--key is the bloatlab protocol's shared key.)
    #[cfg(feature = "https")]
    #[arg(long, value_name = "FILE", requires = "cert")]
    pub cert_key: Option<PathBuf>,
    /// Make (once, then reuse) an ECDSA P-256 certificate for the --name values, valid 825
    /// days (the most Apple's clients accept), kept in --tls-dir with its key readable by its
    /// owner only; its SHA-256 fingerprint is printed. Clients need --insecure (or -k) or to
    /// trust it.
    #[cfg(feature = "https")]
    #[arg(long)]
    pub self_signed: bool,
    /// Names (host names or addresses) the self-signed certificate is for; repeatable.
    /// Default: localhost, 127.0.0.1, ::1 and this host's name.
    #[cfg(feature = "https")]
    #[arg(long, value_name = "NAME")]
    pub name: Vec<String>,
    /// Where --self-signed keeps its files. Default: /var/lib/bloatlab/tls as root, else
    /// ~/.local/state/bloatlab/tls.
    #[cfg(feature = "https")]
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// `test_endpoint` in the config: the host clients should run the test against.
    #[arg(long, value_name = "HOST")]
    pub test_endpoint: Option<String>,
    /// Gigabytes one client address may move through /large and /slurp per 10 minutes (past
    /// it: 429 with Retry-After), so the 8 GB download is no free amplifier.
    #[arg(long, value_name = "GB", default_value_t = 20.0)]
    pub web_max_gb: f64,
}

impl ServerArgs {
    /// The server's configuration from its flags, `key` read by the caller (a file or
    /// BLOATLAB_KEY). Makes or finds a self-signed certificate when asked to, and says so.
    pub fn config(self, key: Option<Vec<u8>>) -> Result<Config, String> {
        if let Some(r) = self.max_rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
            return Err(format!("--max-rate {r}: want a positive number of Mbit/s"));
        }
        if !(self.max_udp_rate.is_finite() && self.max_udp_rate >= 0.0) {
            return Err(format!(
                "--max-udp-rate {}: want Mbit/s, 0 or more",
                self.max_udp_rate
            ));
        }
        let web = web_config(&self)?;
        Ok(Config {
            web,
            listen: self.listen,
            max_tests: self.max_tests,
            max_tests_per_ip: self.max_tests_per_ip,
            max_duration: Duration::from_secs(self.max_duration),
            max_flows: self.max_flows,
            max_streams: self.max_streams,
            max_probe_pps: self.max_probe_pps,
            max_rate_bytes: self.max_rate.map(|m| m * 1e6 / 8.0),
            max_udp_bps: (self.max_udp_rate * 1e6) as u64,
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            key,
            allow: self.allow,
            allow_dscp: self.allow_dscp,
            expose_host: self.expose_host,
            verbose: !self.quiet,
            ..Default::default()
        })
    }
}

/// A port number alone means every address (`[::]:PORT`); or a full ADDR:PORT.
fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    match s.parse::<u16>() {
        Ok(port) => Ok(SocketAddr::from(([0u16; 8], port))),
        Err(_) => s
            .parse()
            .map_err(|_| format!("`{s}`: want a port or ADDR:PORT")),
    }
}

/// The web face's settings from the command line; --self-signed makes or finds its files here.
fn web_config(a: &ServerArgs) -> Result<WebConfig, String> {
    if !(a.web_max_gb.is_finite() && a.web_max_gb > 0.0) {
        return Err(format!(
            "--web-max-gb {}: want a positive number",
            a.web_max_gb
        ));
    }
    // The browser test is served on the HTTP face.
    #[cfg(feature = "browser")]
    {
        #[cfg(feature = "https")]
        let faces = a.http.is_some() || a.https.is_some();
        #[cfg(not(feature = "https"))]
        let faces = a.http.is_some();
        if !faces && (a.ws.is_some() || a.keep_web_results.is_some()) {
            return Err(
                "--ws and --keep-web-results serve the browser test, which needs --http or --https"
                    .into(),
            );
        }
    }
    #[cfg(feature = "https")]
    let tls = match (&a.cert, &a.cert_key, a.self_signed) {
        (Some(c), Some(k), _) => Some((c.clone(), k.clone())),
        (_, _, true) => {
            let dir = a.tls_dir.clone().unwrap_or_else(tls::default_dir);
            let names = if a.name.is_empty() {
                tls::default_names()
            } else {
                a.name.clone()
            };
            let (cert, key) = tls::self_signed(&dir, &names, std::time::SystemTime::now())?;
            eprintln!(
                "bloatlab server: self-signed certificate for {} in {}",
                names.join(", "),
                dir.display()
            );
            Some((cert, key))
        }
        _ => None,
    };
    #[cfg(feature = "https")]
    if let Some((cert, _)) = &tls {
        eprintln!(
            "bloatlab server: certificate SHA-256 {}",
            tls::fingerprint_of(cert)?
        );
    }
    Ok(WebConfig {
        http: a.http,
        #[cfg(feature = "https")]
        https: a.https,
        #[cfg(feature = "https")]
        tls,
        test_endpoint: a.test_endpoint.clone(),
        max_bytes_per_ip: (a.web_max_gb * 1e9) as u64,
        #[cfg(feature = "browser")]
        ws: a.ws,
        #[cfg(feature = "browser")]
        keep_results: a.keep_web_results.clone(),
        #[cfg(feature = "browser")]
        keep_max: a.keep_max,
        ..Default::default()
    })
}
