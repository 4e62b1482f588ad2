//! `bloatlab test`'s flags and the `Params` they make (with the `clap` feature): the binary
//! flattens `TestArgs` into its command line, the experiments read their `--test "rrul
//! --flows 8"` with `test_spec`.

use crate::http_rpm::HttpOptions;
use crate::{Params, TestKind, UdpParams};
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

/// TCP congestion control a test asks for.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Cc {
    Cubic,
    Bbr,
    Reno,
}

/// `bloatlab test`'s flags.
#[derive(clap::Args)]
pub struct TestArgs {
    #[arg(value_enum)]
    pub test: TestKind,
    /// Server as HOST, HOST:PORT, [IPV6]:PORT or a bare IPv6 address (default port 9461). For
    /// rpm also a responsiveness config URL (https://HOST/.well-known/nq, or http:// for
    /// cleartext HTTP/2): the test then runs over HTTP/2 against any such server.
    pub host: String,
    /// Length of the load phase in seconds (the whole test for ping and plain voip). Default:
    /// 10 for ping, 20 for rpm, 30 otherwise.
    #[arg(short, long)]
    pub length: Option<f64>,
    /// Idle phase before the load, in seconds: the baseline latency.
    #[arg(long, default_value_t = 5.0)]
    pub idle: f64,
    /// Probe interval and throughput sampling step, in seconds.
    #[arg(long, default_value_t = 0.01)]
    pub step: f64,
    /// TCP flows per direction for tcp-down, tcp-up and tcp-bidir (at most 256; a public
    /// server allows 32 a test unless its --max-flows says more).
    #[arg(long, default_value_t = 4)]
    pub flows: u16,
    /// TCP congestion control of the test flows, set by whichever side sends (default: each
    /// host's system default, which is recorded).
    #[arg(long, value_enum)]
    pub cc: Option<Cc>,
    /// DSCP of the voip stream: a number 0..63 or a name (EF, CS6, AF41, ...). EF (46) lands in
    /// the Wi-Fi VI queue on older Linux kernels; CS6 (48) in VO.
    #[arg(long, default_value = "EF", value_parser = bloatlab_proto::parse_dscp)]
    pub dscp: u8,
    /// marks: the DSCPs to send, each with every --ecn code point (names or numbers, comma
    /// separated).
    #[arg(long, default_value = crate::marks::DEFAULT_DSCPS, value_name = "LIST")]
    pub dscps: String,
    /// marks: the ECN code points to send: not-ect, ect0, ect1, ce (comma separated; default
    /// all four). Other tests: the one their UDP probes (both ways) and udp's load carry
    /// (default not-ect); what arrives CE was marked by a queue instead of dropped.
    #[arg(long, value_name = "LIST")]
    pub ecn: Option<String>,
    /// The test's TCP flows ask for ECN, whatever net.ipv4.tcp_ecn says: a host route to the
    /// server with `features ecn` (ip-route(8)) for the test's length, removed after (root;
    /// a kill -9 leaves it: `ip route del SERVER/32`).
    #[arg(long)]
    pub tcp_ecn: bool,
    /// marks: probes of each code point (1..100), one every 10 ms in turn.
    #[arg(long, default_value_t = 5)]
    pub rounds: u32,
    /// voip: make the call under 4 download + 4 upload TCP flows.
    #[arg(long)]
    pub under_load: bool,
    /// UDP latency probe size in bytes (56..1472).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(56..=1472))]
    pub probe_size: u16,
    /// rpm: the responsiveness draft's interval (ID) in seconds: one more load connection per
    /// direction each interval; goodput, then responsiveness, count as saturated when the
    /// moving averages of 4 intervals stay within 5%, and the test then ends (else at --length,
    /// with lower confidence). Draft -09 proposes 5 s, which needs a --length of 60 or more; 1 s
    /// is draft -08's value and every deployed client's.
    #[arg(long, default_value_t = 1.0, value_parser = positive_seconds)]
    pub rpm_interval: f64,
    /// rpm against a URL: load the download direction, then the upload direction, each on its
    /// own connections until it saturates (up to --length each), as `networkQuality -s` and
    /// Cloudflare's mach do; prints each direction's RPM (dl_responsiveness, ul_responsiveness)
    /// and takes the worse as the test's. Default: both directions at once.
    #[arg(long)]
    pub sequential: bool,
    /// rpm against a URL: HTTP/1.1 instead of HTTP/2, as `networkQuality -f h1`. A connection
    /// then carries one request at a time, so no self probe can share a load connection: the
    /// RPM is the foreign probes' term alone (rpm.loaded is null). The router build has no
    /// HTTP/2 (nor TLS): there it needs this.
    #[arg(long = "http1.1")]
    pub http1: bool,
    /// udp: UDP payload rate, as iperf3's -b counts it (100mbit, 1gbit, 500kbit; Mibit and
    /// Gibit are binary; default 10mbit). writeback: write at this rate, as a network would
    /// deliver the data (default: as fast as the cache takes it).
    #[arg(long, value_parser = bloatlab_units::parse_rate)]
    pub rate: Option<u64>,
    /// writeback: `end` syncs once after the last write (dd conv=fdatasync); `every:SIZE`
    /// (every:64M) also after each SIZE written.
    #[arg(long, default_value = "end")]
    pub fsync: crate::writeback::Fsync,
    /// udp: UDP payload bytes per packet (56..1472, default 1024; 72 or more with a key).
    /// writeback: bytes to write, as dd counts them (default 1G = 1024^3; 1GB = 10^9).
    #[arg(long)]
    pub size: Option<String>,
    /// udp: how the sender spaces its packets. `timer`: one every size/rate (smooth);
    /// `timer:1ms`: each millisecond what is due, back to back; `burst:100ms`: a tenth of a
    /// second's data at once every 100 ms, as iperf3 -b does without kernel pacing (to show what
    /// that does to a shallow switch buffer); `fq`: the kernel paces (SO_MAX_PACING_RATE; only
    /// with the fq qdisc on the way out, else the timer is used and the result says so); `auto`:
    /// fq where it works, else timer.
    #[arg(long, default_value = "auto")]
    pub pacing: crate::pacing::Pacing,
    /// udp: width of the burst-profile buckets (bytes per bucket at the sender and at the
    /// server): 1ms, 500us, 0.01s.
    #[arg(long, default_value = "1ms", value_parser = bloatlab_units::parse_duration)]
    pub bucket: Duration,
    /// The server's shared key, when it requires one (a file; or the key itself in
    /// BLOATLAB_KEY).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// rpm against a URL: accept any certificate (a self-signed test server), as curl -k.
    // Hidden in a build without TLS (the router's), where an https:// URL is refused anyway.
    #[arg(long, short = 'k')]
    #[cfg_attr(not(feature = "https"), arg(hide = true))]
    pub insecure: bool,
    /// rpm against a URL: also trust this CA certificate (PEM).
    #[arg(long, value_name = "FILE")]
    #[cfg_attr(not(feature = "https"), arg(hide = true))]
    pub ca: Option<PathBuf>,
    /// Result file (versioned JSON, gzipped when the name ends in .gz). Default:
    /// bloatlab-TEST-TIMESTAMP.json.gz
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the summary as JSON on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also locate the bloat: probe every hop during the test (see `bloatlab locate`) and
    /// name the hop and direction; the locate file goes beside the result file. For tcp-down,
    /// tcp-up, tcp-bidir, rrul and rrul-be. For marks: walk the path with TTL-limited probes of
    /// the marks that changed on the way out and name the first hop that saw each changed
    /// (a raw ICMP socket: root).
    #[arg(long)]
    pub locate: bool,
    /// No progress output.
    #[arg(short, long)]
    pub quiet: bool,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=60.0).contains(&v) => Ok(v),
        _ => Err(format!("`{s}`: want seconds between 0.1 and 60")),
    }
}

impl TestArgs {
    /// The test's parameters from its flags, checked.
    pub fn params(&self) -> Result<Params, String> {
        let kind = self.test;
        let ecn = match (kind, self.ecn.as_deref()) {
            (TestKind::Marks, _) | (_, None) => 0,
            (TestKind::Writeback | TestKind::Mtu, Some(_)) => {
                return Err("--ecn is for tests with UDP probes or a UDP load".into())
            }
            (_, Some(e)) => bloatlab_units::marks::parse_ecn(e)?,
        };
        if self.tcp_ecn
            && matches!(
                kind,
                TestKind::Ping
                    | TestKind::Udp
                    | TestKind::Mtu
                    | TestKind::Writeback
                    | TestKind::Marks
            )
        {
            return Err("--tcp-ecn is for tests with TCP flows".into());
        }
        let size = match (kind, self.size.as_deref()) {
            (TestKind::Writeback, s) => crate::writeback::parse_size(s.unwrap_or("1G"))?,
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
            ecn,
            tcp_ecn: self.tcp_ecn,
            rpm_interval: self.rpm_interval,
            rpm_sequential: self.sequential,
            udp: (kind == TestKind::Udp).then_some(UdpParams {
                rate_bps: self.rate.unwrap_or(10_000_000),
                size: size as u16,
                pacing: self.pacing,
                bucket: self.bucket.as_secs_f64(),
                dscp: 0,
                ecn,
            }),
            ..Params::new(kind)
        };
        params.validate()?;
        Ok(params)
    }

    /// `test marks`'s parameters from its flags, checked.
    pub fn marks(&self) -> Result<crate::marks::MarksParams, String> {
        crate::marks::MarksParams::parse(
            &self.dscps,
            self.ecn.as_deref().unwrap_or(crate::marks::DEFAULT_ECNS),
            self.rounds,
            self.locate,
        )
    }

    pub fn http(&self) -> HttpOptions {
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

pub fn test_spec(spec: &str) -> Result<(Params, HttpOptions), String> {
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
