//! The `bloatlab` binary: argument parsing and wiring only.

use bloatlab_measure::display::{events_text, summary_text, ProgressMode};
use bloatlab_measure::http_rpm::HttpOptions;
use bloatlab_measure::{Ended, Options, Params, TestKind, UdpParams};
mod lab_cmd;
mod locate_cmd;
mod report_cmd;
mod tune_cmd;

use bloatlab_server::web::tls;
use clap::{Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "bloatlab", version, about = "Measure latency under load (bufferbloat), locate it \
    and fix it", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve measurements: TCP control and data connections and UDP echo, all on one port;
    /// with --https/--http also the responsiveness endpoints other RPM clients use
    /// (networkQuality, mach, goresponsiveness) and a bufferbloat test page for any browser.
    Server(Box<ServerArgs>),
    /// Run a test against a `bloatlab server` (rpm also against any responsiveness server, by
    /// its config URL).
    Test(TestArgs),
    /// Which hop of the path to a `bloatlab server` holds the queue that bloats it, and in
    /// which direction: loads the path (download, upload, both) while probing every hop with
    /// TTL-limited UDP (no root needed), and watches this host's own interface queue.
    Locate(locate_cmd::LocateArgs),
    /// Shaping advice from result files: per direction the rate (95% of the lowest measured
    /// goodput), link-layer overhead, queue discipline, the buffer the bloat implies and what
    /// to expect after, each with its reason.
    Advise(tune_cmd::AdviseArgs),
    /// A configuration to paste, commented: tc (CAKE, HTB + fq_codel, HTB classes), OpenWrt
    /// sqm, FireQOS, nftables DSCP rules, writeback sysctls, OpenWrt Wi-Fi settings.
    Config(tune_cmd::ConfigArgs),
    /// Apply a shaper to an interface (all or nothing, recorded), roll it back, or show it.
    #[command(subcommand)]
    Tune(tune_cmd::TuneCommand),
    /// The same test against several paths (a tunnel and the raw path, a LAN server and a WAN
    /// one, Wi-Fi and wired): one table, one overlaid report, each path's efficiency (goodput)
    /// against the first. `bloatlab compare 10.8.0.1 192.0.2.1 --test rrul`.
    Compare {
        /// bloatlab servers, as `test` takes them; the first is the reference.
        #[arg(required = true, num_args = 2..)]
        targets: Vec<String>,
        /// The test and its options, as one argument: "tcp-down --flows 8", "rrul", "rpm".
        #[arg(long, default_value = "tcp-down")]
        test: String,
        /// Load phase of each run, seconds.
        #[arg(short, long, default_value_t = 20.0)]
        length: f64,
        /// Where the result files and the report go.
        #[arg(long, default_value = ".")]
        out_dir: PathBuf,
        /// Print {"runs": [{"target": ..., "summary": {...}}, ...]} instead of the table.
        #[arg(long)]
        json: bool,
        #[arg(short, long)]
        quiet: bool,
    },
    /// Emulated networks between network namespaces: build, run, change, inspect.
    #[command(subcommand)]
    Lab(lab_cmd::LabCommand),
    /// One self-contained HTML report of one or more result files: time series, latency CDFs
    /// overlaid (before/after), box plots, summary and metadata; zoom and hover, opens offline.
    /// Given one locate file (bloatlab locate): round trip per hop, idle and under each load.
    Report {
        #[arg(required = true)]
        results: Vec<PathBuf>,
        #[arg(short, long, default_value = "report.html")]
        output: PathBuf,
    },
    /// A static PNG or SVG plot of one or more result files.
    Plot {
        #[arg(required = true)]
        results: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "timeseries")]
        kind: report_cmd::PlotKind,
        /// Output file; .png or .svg.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Convert a result file for other tools.
    Export {
        result: PathBuf,
        #[arg(long, value_enum)]
        format: report_cmd::ExportFormat,
        /// Output file (default: the result's name with .flent.gz or .csv).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
}

#[derive(clap::Args)]
struct ServerArgs {
    /// Address and port to listen on (TCP and UDP); `[::]` also accepts IPv4.
    #[arg(long, default_value_t = SocketAddr::from(([0u16; 8], bloatlab_proto::DEFAULT_PORT)))]
    listen: SocketAddr,
    /// Tests that may run at once; further clients are told the server is busy.
    #[arg(long, default_value_t = 4)]
    max_tests: usize,
    /// Longest test accepted, in seconds (idle phase included).
    #[arg(long, default_value_t = 180)]
    max_duration: u64,
    /// Tests one client address may run at once.
    #[arg(long, default_value_t = 2)]
    max_tests_per_ip: usize,
    /// Most bulk TCP flows in one test.
    #[arg(long, default_value_t = 32)]
    max_flows: usize,
    /// Most UDP probe streams in one test.
    #[arg(long, default_value_t = 8)]
    max_streams: usize,
    /// Most probe packets per second one test may announce, all its streams together.
    #[arg(long, default_value_t = 2000)]
    max_probe_pps: u32,
    /// Mbit/s one test may move, both directions together (bulk flows are paced to it).
    /// Default: no limit.
    #[arg(long)]
    max_rate: Option<f64>,
    /// Mbit/s of UDP load one test may announce (`test udp`); the server counts what arrives
    /// and holds each load to twice its announced rate.
    #[arg(long, default_value_t = 1000.0)]
    max_udp_rate: f64,
    /// TCP connections open at once, of every kind; further ones are told the server is busy.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// TCP connections one client address may have open at once.
    #[arg(long, default_value_t = 64)]
    max_connections_per_ip: usize,
    /// Require this shared key (a file of at least 16 bytes; or the key itself in
    /// BLOATLAB_KEY): clients prove it in the handshake (bloatlab test --key) and sign every
    /// UDP probe; unsigned probes are dropped and counted.
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Serve only clients in these networks (CIDR, repeatable: --allow 192.0.2.0/24 --allow
    /// 2001:db8::/32). Default: everyone.
    #[arg(long, value_name = "CIDR")]
    allow: Vec<ipnet::IpNet>,
    /// DSCP marks clients may ask for (comma-separated numbers or names: BE,BK,EF,CS5).
    /// Default: all.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = bloatlab_proto::parse_dscp
    )]
    allow_dscp: Option<Vec<u8>>,
    /// Tell clients without the key this host's kernel version and TCP congestion control
    /// (recorded in their results); by default only clients with the key learn them.
    #[arg(long)]
    expose_host: bool,
    /// Do not log each test to stderr (the one "listening on" line is still printed: with
    /// port 0 it is the only way to learn the port).
    #[arg(long, short)]
    quiet: bool,
    /// Also serve the responsiveness endpoints (draft-ietf-ippm-responsiveness: config at
    /// /.well-known/nq and /config, /small, /large, /slurp) over HTTPS on this port (or
    /// ADDR:PORT): HTTP/2 and HTTP/1.1 by ALPN, TLS 1.2 and 1.3. Needs --cert and --cert-key,
    /// or --self-signed. Other RPM clients (networkQuality, mach, goresponsiveness) can then
    /// test against this server.
    #[arg(long, value_name = "PORT", value_parser = parse_listen)]
    https: Option<SocketAddr>,
    /// The same endpoints over plain HTTP (for LANs and clients without TLS).
    #[arg(long, value_name = "PORT", value_parser = parse_listen)]
    http: Option<SocketAddr>,
    /// The browser test's latency probe port (WebSocket; TLS too when --https has a
    /// certificate). Any browser then runs the test at http(s)://THIS-HOST:PORT/ (with
    /// ?autostart=1 it starts at once; ?length=S&idle=S shorten it).
    #[arg(long, value_name = "PORT", value_parser = parse_listen)]
    ws: Option<SocketAddr>,
    /// Keep every browser test's result file here (the newest --keep-max; `bloatlab report`
    /// reads them like any other).
    #[arg(long, value_name = "DIR")]
    keep_web_results: Option<PathBuf>,
    /// How many browser results --keep-web-results keeps at most (the oldest go first).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    keep_max: usize,
    /// Certificate chain for --https (PEM); re-read on SIGHUP.
    #[arg(
        long,
        value_name = "FILE",
        requires = "cert_key",
        conflicts_with = "self_signed"
    )]
    cert: Option<PathBuf>,
    /// The certificate's private key (PEM). (--key is the bloatlab protocol's shared key.)
    #[arg(long, value_name = "FILE", requires = "cert")]
    cert_key: Option<PathBuf>,
    /// Make (once, then reuse) an ECDSA P-256 certificate for the --name values, valid 825
    /// days (the most Apple's clients accept), kept in --tls-dir with its key readable by its
    /// owner only; its SHA-256 fingerprint is printed. Clients need --insecure (or -k) or to
    /// trust it.
    #[arg(long)]
    self_signed: bool,
    /// Names (host names or addresses) the self-signed certificate is for; repeatable.
    /// Default: localhost, 127.0.0.1, ::1 and this host's name.
    #[arg(long, value_name = "NAME")]
    name: Vec<String>,
    /// Where --self-signed keeps its files. Default: /var/lib/bloatlab/tls as root, else
    /// ~/.local/state/bloatlab/tls.
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// `test_endpoint` in the config: the host clients should run the test against.
    #[arg(long, value_name = "HOST")]
    test_endpoint: Option<String>,
    /// Gigabytes one client address may move through /large and /slurp per 10 minutes (past
    /// it: 429 with Retry-After), so the 8 GB download is no free amplifier.
    #[arg(long, value_name = "GB", default_value_t = 20.0)]
    web_max_gb: f64,
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
fn web_config(a: &ServerArgs) -> Result<bloatlab_server::web::WebConfig, String> {
    if !(a.web_max_gb.is_finite() && a.web_max_gb > 0.0) {
        return Err(format!(
            "--web-max-gb {}: want a positive number",
            a.web_max_gb
        ));
    }
    if a.http.is_none() && a.https.is_none() && (a.ws.is_some() || a.keep_web_results.is_some()) {
        return Err(
            "--ws and --keep-web-results serve the browser test, which needs --http or --https"
                .into(),
        );
    }
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
    if let Some((cert, _)) = &tls {
        eprintln!(
            "bloatlab server: certificate SHA-256 {}",
            tls::fingerprint_of(cert)?
        );
    }
    Ok(bloatlab_server::web::WebConfig {
        http: a.http,
        https: a.https,
        tls,
        test_endpoint: a.test_endpoint.clone(),
        max_bytes_per_ip: (a.web_max_gb * 1e9) as u64,
        ws: a.ws,
        keep_results: a.keep_web_results.clone(),
        keep_max: a.keep_max,
        ..Default::default()
    })
}

#[derive(Clone, Copy, ValueEnum)]
enum TestName {
    /// Idle latency: UDP probes and TCP connect times.
    Ping,
    /// Download: --flows TCP flows from the server.
    TcpDown,
    /// Upload: --flows TCP flows to the server.
    TcpUp,
    /// Both directions at once, --flows each way.
    TcpBidir,
    /// Realtime Response Under Load: 4 down + 4 up flows marked BE, BK, CS5, EF, with UDP probes
    /// marked EF, BK, BE.
    Rrul,
    /// rrul with every flow and probe unmarked (best effort).
    RrulBe,
    /// A call-like isochronous stream each way (20 ms, 172 B): one-way delay, jitter, loss, MOS.
    Voip,
    /// Responsiveness under working conditions, in round trips per minute (IETF ippm draft).
    Rpm,
    /// Constant-rate UDP upload (--rate, --size) with the chosen sender --pacing: goodput, loss,
    /// reordering and the burst profile where it left and where it arrived.
    Udp,
    /// Not the network: the page cache in front of a disk. HOST is a directory; writes --size
    /// as `dd conv=fdatasync` does (or at --rate), sampling the kernel's dirty and writeback
    /// counters and timing a small write + fsync every 100 ms meanwhile.
    Writeback,
    /// The path MTU to HOST (any host that answers ICMP echo) by Don't-Fragment probes, black
    /// holes (large packets lost with no "fragmentation needed"), and the TCP MSS, OpenVPN
    /// mssfix and WireGuard MTU that follow.
    Mtu,
}

impl From<TestName> for TestKind {
    fn from(t: TestName) -> TestKind {
        match t {
            TestName::Ping => TestKind::Ping,
            TestName::TcpDown => TestKind::TcpDown,
            TestName::TcpUp => TestKind::TcpUp,
            TestName::TcpBidir => TestKind::TcpBidir,
            TestName::Rrul => TestKind::Rrul,
            TestName::RrulBe => TestKind::RrulBe,
            TestName::Voip => TestKind::Voip,
            TestName::Rpm => TestKind::Rpm,
            TestName::Udp => TestKind::Udp,
            TestName::Writeback => TestKind::Writeback,
            TestName::Mtu => TestKind::Mtu,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Cc {
    Cubic,
    Bbr,
    Reno,
}

#[derive(clap::Args)]
struct TestArgs {
    #[arg(value_enum)]
    test: TestName,
    /// Server as HOST, HOST:PORT, [IPV6]:PORT or a bare IPv6 address (default port 9461). For
    /// rpm also a responsiveness config URL (https://HOST/.well-known/nq, or http:// for
    /// cleartext HTTP/2): the test then runs over HTTP/2 against any such server.
    host: String,
    /// Length of the load phase in seconds (the whole test for ping and plain voip). Default:
    /// 10 for ping, 20 for rpm, 30 otherwise.
    #[arg(short, long)]
    length: Option<f64>,
    /// Idle phase before the load, in seconds: the baseline latency.
    #[arg(long, default_value_t = 5.0)]
    idle: f64,
    /// Probe interval and throughput sampling step, in seconds.
    #[arg(long, default_value_t = 0.01)]
    step: f64,
    /// TCP flows per direction for tcp-down, tcp-up and tcp-bidir (at most 256; a public
    /// server allows 32 a test unless its --max-flows says more).
    #[arg(long, default_value_t = 4)]
    flows: u16,
    /// TCP congestion control of the test flows, set by whichever side sends (default: each
    /// host's system default, which is recorded).
    #[arg(long, value_enum)]
    cc: Option<Cc>,
    /// DSCP of the voip stream: a number 0..63 or a name (EF, CS6, AF41, ...). EF (46) lands in
    /// the Wi-Fi VI queue on older Linux kernels; CS6 (48) in VO.
    #[arg(long, default_value = "EF", value_parser = bloatlab_proto::parse_dscp)]
    dscp: u8,
    /// voip: make the call under 4 download + 4 upload TCP flows.
    #[arg(long)]
    under_load: bool,
    /// UDP latency probe size in bytes (56..1472).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(56..=1472))]
    probe_size: u16,
    /// rpm: the responsiveness draft's interval (ID) in seconds: one more load connection per
    /// direction each interval; goodput, then responsiveness, count as saturated when the
    /// moving averages of 4 intervals stay within 5%, and the test then ends (else at --length,
    /// with lower confidence). Draft -09 proposes 5 s, which needs a --length of 60 or more; 1 s
    /// is draft -08's value and every deployed client's.
    #[arg(long, default_value_t = 1.0, value_parser = positive_seconds)]
    rpm_interval: f64,
    /// rpm against a URL: load the download direction, then the upload direction, each on its
    /// own connections until it saturates (up to --length each), as `networkQuality -s` and
    /// Cloudflare's mach do; prints each direction's RPM (dl_responsiveness, ul_responsiveness)
    /// and takes the worse as the test's. Default: both directions at once.
    #[arg(long)]
    sequential: bool,
    /// rpm against a URL: HTTP/1.1 instead of HTTP/2, as `networkQuality -f h1`. A connection
    /// then carries one request at a time, so no self probe can share a load connection: the
    /// RPM is the foreign probes' term alone (rpm.loaded is null).
    #[arg(long = "http1.1")]
    http1: bool,
    /// udp: UDP payload rate, as iperf3's -b counts it (100mbit, 1gbit, 500kbit; Mibit and
    /// Gibit are binary; default 10mbit). writeback: write at this rate, as a network would
    /// deliver the data (default: as fast as the cache takes it).
    #[arg(long, value_parser = bloatlab_units::parse_rate)]
    rate: Option<u64>,
    /// writeback: `end` syncs once after the last write (dd conv=fdatasync); `every:SIZE`
    /// (every:64M) also after each SIZE written.
    #[arg(long, default_value = "end")]
    fsync: bloatlab_measure::writeback::Fsync,
    /// udp: UDP payload bytes per packet (56..1472, default 1024; 72 or more with a key).
    /// writeback: bytes to write, as dd counts them (default 1G = 1024^3; 1GB = 10^9).
    #[arg(long)]
    size: Option<String>,
    /// udp: how the sender spaces its packets. `timer`: one every size/rate (smooth);
    /// `timer:1ms`: each millisecond what is due, back to back; `burst:100ms`: a tenth of a
    /// second's data at once every 100 ms, as iperf3 -b does without kernel pacing (to show what
    /// that does to a shallow switch buffer); `fq`: the kernel paces (SO_MAX_PACING_RATE; only
    /// with the fq qdisc on the way out, else the timer is used and the result says so); `auto`:
    /// fq where it works, else timer.
    #[arg(long, default_value = "auto")]
    pacing: bloatlab_measure::pacing::Pacing,
    /// udp: width of the burst-profile buckets (bytes per bucket at the sender and at the
    /// server): 1ms, 500us, 0.01s.
    #[arg(long, default_value = "1ms", value_parser = bloatlab_units::parse_duration)]
    bucket: Duration,
    /// The server's shared key, when it requires one (a file; or the key itself in
    /// BLOATLAB_KEY).
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// rpm against a URL: accept any certificate (a self-signed test server), as curl -k.
    #[arg(long, short = 'k')]
    insecure: bool,
    /// rpm against a URL: also trust this CA certificate (PEM).
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Result file (versioned JSON, gzipped when the name ends in .gz). Default:
    /// bloatlab-TEST-TIMESTAMP.json.gz
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Print the summary as JSON on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Also locate the bloat: probe every hop during the test (see `bloatlab locate`) and
    /// name the hop and direction; the locate file goes beside the result file. For tcp-down,
    /// tcp-up, tcp-bidir, rrul and rrul-be.
    #[arg(long)]
    locate: bool,
    /// No progress output.
    #[arg(short, long)]
    quiet: bool,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=60.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}`: want seconds between 0.1 and 60")),
    }
}

fn main() -> ExitCode {
    // Output piped into `head` ends quietly, as for other command-line tools.
    // SAFETY: setting a signal disposition before any threads exist.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    match cli.command {
        Command::Server(a) => server(*a),
        Command::Test(a) => test(a),
        Command::Locate(a) => locate_cmd::run(a, progress_mode(false), stop_flag()),
        Command::Advise(a) => tune_cmd::advise_cmd(a),
        Command::Config(a) => tune_cmd::config_cmd(a),
        Command::Tune(c) => tune_cmd::tune_cmd(c),
        Command::Lab(c) => lab_cmd::run(c, stop_flag),
        Command::Compare {
            targets,
            test,
            length,
            out_dir,
            json,
            quiet,
        } => compare(targets, &test, length, out_dir, json, quiet),
        Command::Report { results, output } => report_cmd::report(&results, &output),
        Command::Plot {
            results,
            kind,
            output,
        } => report_cmd::plot(&results, kind, &output),
        Command::Export {
            result,
            format,
            output,
        } => report_cmd::export(&result, format, output),
    }
}

/// Ctrl-C (and SIGTERM) set the flag; a second one exits at once.
fn stop_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let _ = ctrlc::set_handler(move || {
        if s.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
    });
    stop
}

/// The control socket of the lab this test runs in (`lab exec`, `lab run`), if any: its
/// counters go into the result file.
fn lab_socket() -> Option<PathBuf> {
    std::env::var_os(bloatlab_lab::SOCKET_ENV).map(PathBuf::from)
}

fn progress_mode(quiet: bool) -> ProgressMode {
    if quiet {
        ProgressMode::Quiet
    } else if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
        // A live line only when a person watches; output going to a file or a pipe (stdout)
        // gets plain periodic lines on stderr instead.
        ProgressMode::Live
    } else {
        ProgressMode::Lines
    }
}

/// A failure: one line on stderr, exit code 1.
pub(crate) fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("bloatlab: {msg}");
    ExitCode::from(1)
}

/// A usage error: one line on stderr, exit code 2.
pub(crate) fn usage(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("bloatlab: {msg}");
    ExitCode::from(2)
}

/// The shared key: the file's bytes (a trailing newline dropped), else BLOATLAB_KEY's value.
fn load_key(file: Option<&std::path::Path>) -> Result<Option<Vec<u8>>, String> {
    let raw = match file {
        Some(f) => std::fs::read(f).map_err(|e| format!("key file {}: {e}", f.display()))?,
        None => match std::env::var_os("BLOATLAB_KEY") {
            Some(v) => v.into_encoded_bytes(),
            None => return Ok(None),
        },
    };
    bloatlab_proto::auth::parse_key(&raw).map(Some)
}

/// For the long-running processes (server, lab): a peer that resets a connection while a
/// vectored write (`writev`, which has no MSG_NOSIGNAL) is under way must cost an error on that
/// connection, not SIGPIPE for the whole process, which `main` left at its default for pipes.
pub(crate) fn ignore_sigpipe() {
    // SAFETY: changing a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

fn server(a: ServerArgs) -> ExitCode {
    ignore_sigpipe();
    let key = match load_key(a.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    if let Some(r) = a.max_rate.filter(|r| !(r.is_finite() && *r > 0.0)) {
        return fail(format!("--max-rate {r}: want a positive number of Mbit/s"));
    }
    if !(a.max_udp_rate.is_finite() && a.max_udp_rate >= 0.0) {
        return fail(format!(
            "--max-udp-rate {}: want Mbit/s, 0 or more",
            a.max_udp_rate
        ));
    }
    let web = match web_config(&a) {
        Ok(w) => w,
        Err(e) => return fail(e),
    };
    let config = bloatlab_server::Config {
        web,
        listen: a.listen,
        max_tests: a.max_tests,
        max_tests_per_ip: a.max_tests_per_ip,
        max_duration: Duration::from_secs(a.max_duration),
        max_flows: a.max_flows,
        max_streams: a.max_streams,
        max_probe_pps: a.max_probe_pps,
        max_rate_bytes: a.max_rate.map(|m| m * 1e6 / 8.0),
        max_udp_bps: (a.max_udp_rate * 1e6) as u64,
        max_connections: a.max_connections,
        max_connections_per_ip: a.max_connections_per_ip,
        key,
        allow: a.allow,
        allow_dscp: a.allow_dscp,
        expose_host: a.expose_host,
        verbose: !a.quiet,
        ..Default::default()
    };
    let stop = stop_flag();
    // SIGHUP re-reads the certificates (the runtime's handler); it must not also stop the
    // server, as the Ctrl-C handler just installed for INT, TERM and HUP would. Ignored here,
    // before the runtime adds its own handler, which then runs alone.
    // SAFETY: changing a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    let mut server = match bloatlab_server::Server::start(config) {
        Ok(s) => s,
        Err(e) => {
            return fail(format!(
                "{e}; is another server running there? choose another with --listen"
            ))
        }
    };
    eprint!("{}", server.banner());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    server.stop();
    ExitCode::from(130)
}

/// `bloatlab compare`: the runs, then the table (or JSON) and where the files went.
fn compare(
    targets: Vec<String>,
    test: &str,
    length: f64,
    out_dir: PathBuf,
    json: bool,
    quiet: bool,
) -> ExitCode {
    if !(length > 0.0 && length.is_finite()) {
        return fail("--length must be positive");
    }
    let ((test, http), key) = match (test_spec(test), load_key(None)) {
        (Ok(t), Ok(k)) => (t, k),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let o = bloatlab_experiment::targets::TargetsOptions {
        test,
        http,
        key,
        lab_socket: lab_socket(),
        length,
        out_dir,
        quiet,
        stop: stop_flag(),
    };
    let c = match bloatlab_experiment::targets::compare_targets(&targets, &o) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "runs": c.runs }))
                .expect("summaries serialize")
        );
    } else {
        print!("{}", bloatlab_experiment::targets::text(&c.runs));
    }
    match &c.report {
        Ok(p) if !quiet => eprintln!("report written to {}", p.display()),
        Ok(_) => {}
        Err(e) => eprintln!("bloatlab: no report: {e}"),
    }
    if c.interrupted {
        eprintln!("bloatlab: interrupted; the runs that finished are above");
        return ExitCode::from(130);
    }
    ExitCode::SUCCESS
}

impl TestArgs {
    /// The test's parameters from its flags, checked.
    fn params(&self) -> Result<Params, String> {
        let kind: TestKind = self.test.into();
        let size = match (kind, self.size.as_deref()) {
            (TestKind::Writeback, s) => bloatlab_measure::writeback::parse_size(s.unwrap_or("1G"))?,
            (_, None) => 1024,
            (_, Some(s)) => match s.parse::<u64>() {
                Ok(n) if (56..=1472).contains(&n) => n,
                _ => return Err(format!("--size {s}: want UDP payload bytes 56..1472")),
            },
        };
        let params = Params {
            length: self.length.unwrap_or(kind.default_length()),
            idle: self.idle,
            step: self.step,
            flows: self.flows,
            cc: self.cc.map(|c| {
                match c {
                    Cc::Cubic => "cubic",
                    Cc::Bbr => "bbr",
                    Cc::Reno => "reno",
                }
                .to_string()
            }),
            dscp: self.dscp,
            under_load: self.under_load,
            probe_size: self.probe_size,
            rpm_interval: self.rpm_interval,
            rpm_sequential: self.sequential,
            udp: (kind == TestKind::Udp).then_some(UdpParams {
                rate_bps: self.rate.unwrap_or(10_000_000),
                size: size as u16,
                pacing: self.pacing,
                bucket: self.bucket.as_secs_f64(),
                dscp: 0,
            }),
            ..Params::new(kind)
        };
        params.validate()?;
        Ok(params)
    }

    fn http(&self) -> HttpOptions {
        HttpOptions {
            insecure: self.insecure,
            ca: self.ca.clone(),
            http1: self.http1,
        }
    }
}

/// The experiments' `--test "voip --under-load"`: a test and its flags, read as `bloatlab
/// test` reads them (the experiment supplies the target, length and output).
#[derive(Parser)]
#[command(no_binary_name = true)]
struct TestSpec {
    #[command(flatten)]
    args: TestArgs,
}

fn test_spec(spec: &str) -> Result<(Params, HttpOptions), String> {
    let mut words: Vec<&str> = spec.split_whitespace().collect();
    if words.is_empty() {
        return Err("--test: name a test (rrul, tcp-down, ...)".into());
    }
    words.insert(1, "TARGET");
    let a = TestSpec::try_parse_from(words)
        .map_err(|e| {
            let e = e.to_string();
            format!("--test `{spec}`: {}", e.lines().next().unwrap_or_default())
        })?
        .args;
    Ok((a.params()?, a.http()))
}

fn test(a: TestArgs) -> ExitCode {
    let params = match a.params() {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    let kind = params.test;
    let progress = progress_mode(a.quiet);
    let opts = |key| Options {
        output: a.output.clone(),
        progress,
        stop: stop_flag(),
        key,
    };
    if kind == TestKind::Mtu {
        let outcome = bloatlab_measure::mtu::run(&a.host, None, &opts(None));
        return finish_test(outcome, a.json, a.quiet);
    }
    if kind == TestKind::Writeback {
        let wb = bloatlab_measure::writeback::WritebackParams {
            dir: PathBuf::from(&a.host),
            size: bloatlab_measure::writeback::parse_size(a.size.as_deref().unwrap_or("1G"))
                .expect("checked by params()"),
            rate_bps: a.rate,
            fsync: a.fsync,
            idle: a.idle,
        };
        let outcome = bloatlab_measure::writeback::run(&wb, &opts(None));
        return finish_test(outcome, a.json, a.quiet);
    }
    let key = match load_key(a.key.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    if a.locate {
        let out_dir = a
            .output
            .as_deref()
            .and_then(|p| p.parent())
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), PathBuf::from);
        return locate_cmd::with_test(&a.host, params, out_dir, a.json, opts(key));
    }
    let by_url = bloatlab_measure::is_url(&a.host);
    if by_url && !matches!(kind, TestKind::Rpm) {
        return usage(
            "a URL target is for `test rpm` (a responsiveness config URL); other tests \
            take HOST[:PORT] of a bloatlab server",
        );
    }
    if a.http1 && !(by_url && matches!(kind, TestKind::Rpm)) {
        return usage("--http1.1 is for `test rpm` against a URL (the HTTP transport)");
    }
    if a.sequential && !(by_url && matches!(kind, TestKind::Rpm)) {
        return usage(
            "--sequential is for `test rpm` against a URL (the HTTP transport); a \
            bloatlab server serves one too: its --https or --http port's /.well-known/nq",
        );
    }
    let lab = lab_socket();
    let at_start = lab
        .as_deref()
        .and_then(|s| bloatlab_lab::control::counters(s).ok());
    let opts = opts(key);
    let mut outcome = bloatlab_measure::run_target(&params, &a.host, &opts, &a.http());
    if let (Some(socket), Ok(o)) = (&lab, &mut outcome) {
        let r = bloatlab_lab::control::attach_counters(socket, &mut o.result, &o.path, at_start);
        if let Err(e) = r {
            eprintln!("bloatlab: {e}");
        }
    }
    finish_test(outcome, a.json, a.quiet)
}

/// Prints a finished test's summary (text or JSON) and events and says where its file is; the
/// exit code says how it ended.
fn finish_test(
    outcome: Result<bloatlab_measure::Outcome, bloatlab_measure::MeasureError>,
    json: bool,
    quiet: bool,
) -> ExitCode {
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    // A summary of a run cut short by this host's own failure would mislead: one line only.
    if !matches!(outcome.ended, Ended::Failed(_)) {
        let summary = outcome.result.summary.clone().unwrap_or_default();
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&summary).expect("summary serializes")
            );
        } else {
            print!("{}", summary_text(&summary, &outcome.result.metadata));
        }
        if !quiet {
            eprint!("{}", events_text(&outcome.result.events));
        }
    }
    let path = outcome.path.display();
    match outcome.ended {
        Ended::Complete => {
            if !quiet {
                eprintln!("result written to {path}");
            }
            ExitCode::SUCCESS
        }
        Ended::Interrupted => {
            eprintln!("bloatlab: interrupted; partial results kept in {path}");
            ExitCode::from(130)
        }
        Ended::ServerLost(why) => fail(format!(
            "{why} mid-test; partial results kept in {path}. \
            Check that the server is still running"
        )),
        Ended::Failed(why) => fail(format!("{why}; partial results kept in {path}")),
    }
}
