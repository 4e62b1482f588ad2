//! Test plans: which flows and probe streams a test runs, for how long. Pure.

use crate::engine::RpmRamp;
use crate::pacing::Pacing;
use bloatlab_proto::{dscp_name, Direction, FlowSpec, StreamSpec, UdpLoadSpec};
use serde::Serialize;
use std::time::Duration;

/// The tests; their documentation is `bloatlab test`'s help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum TestKind {
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
    /// What becomes of DSCP and ECN marks on the way to a bloatlab server and back: UDP probes
    /// sent with each code point (--dscps x --ecn, --rounds each), the server saying what each
    /// arrived with and marking its reply the same: kept, bleached, remapped or dropped, each
    /// way, and what that means for diffserv on ingress, ECN and L4S.
    Marks,
}

impl TestKind {
    pub fn name(self) -> &'static str {
        match self {
            TestKind::Ping => "ping",
            TestKind::TcpDown => "tcp-down",
            TestKind::TcpUp => "tcp-up",
            TestKind::TcpBidir => "tcp-bidir",
            TestKind::Rrul => "rrul",
            TestKind::RrulBe => "rrul-be",
            TestKind::Voip => "voip",
            TestKind::Rpm => "rpm",
            TestKind::Udp => "udp",
            TestKind::Writeback => "writeback",
            TestKind::Mtu => "mtu",
            TestKind::Marks => "marks",
        }
    }

    /// Default length of the measured (load) part, seconds.
    pub fn default_length(self) -> f64 {
        match self {
            TestKind::Ping
            | TestKind::Udp
            | TestKind::Writeback
            | TestKind::Mtu
            | TestKind::Marks => 10.0,
            TestKind::Rpm => 20.0,
            _ => 30.0,
        }
    }
}

/// Most flows per direction a test may open.
pub const MAX_FLOWS: u16 = 256;

/// What the user asked for.
#[derive(Clone, Debug, Serialize)]
pub struct Params {
    pub test: TestKind,
    /// Length of the load phase (the whole test for ping and plain voip), seconds.
    pub length: f64,
    /// Idle phase before the load, seconds (baseline latency).
    pub idle: f64,
    /// Probe interval and throughput sampling step, seconds.
    pub step: f64,
    /// Flows per direction for tcp-* tests.
    pub flows: u16,
    /// Congestion control for every flow, set by whichever side sends.
    pub cc: Option<String>,
    /// DSCP of the VoIP stream.
    pub dscp: u8,
    /// voip: run the call under 4+4 bulk flows.
    pub under_load: bool,
    /// UDP probe payload size, bytes.
    pub probe_size: u16,
    /// ECN code point of the probes, each way (`--ecn`; 0: Not-ECT): ECN-capable probes come
    /// back CE where a queue marks instead of dropping.
    pub ecn: u8,
    /// TCP flows ask for ECN (a host route to the server with `features ecn` for the test).
    pub tcp_ecn: bool,
    /// rpm: the draft's interval (ID), seconds: one more load connection per direction each.
    pub rpm_interval: f64,
    /// rpm: download, then upload, each with its own load and responsiveness (else both at once).
    pub rpm_sequential: bool,
    /// udp: the load's rate, size, pacing and profile bucket.
    pub udp: Option<UdpParams>,
}

impl Params {
    /// A test of `kind` as `bloatlab test KIND` runs it with no other flags.
    pub fn new(test: TestKind) -> Params {
        Params {
            test,
            length: test.default_length(),
            idle: 5.0,
            step: 0.01,
            flows: 4,
            cc: None,
            dscp: 46,
            under_load: false,
            probe_size: 64,
            ecn: 0,
            tcp_ecn: false,
            rpm_interval: 1.0,
            rpm_sequential: false,
            udp: None,
        }
    }

    /// The parameters a test can run with, or what is wrong with them in the words of the
    /// command line's flags.
    pub fn validate(&self) -> Result<(), String> {
        let (length, idle) = (self.length, self.idle);
        if !(length > 0.0 && length.is_finite() && idle >= 0.0 && idle.is_finite()) {
            return Err("--length must be positive and --idle not negative".into());
        }
        if !(0.001..=1.0).contains(&self.step) {
            return Err("--step must be between 0.001 and 1 second".into());
        }
        if self.flows == 0 || self.flows > MAX_FLOWS {
            return Err(format!("--flows must be between 1 and {MAX_FLOWS}"));
        }
        if let Some(u) = &self.udp {
            if !(1e-4..=1.0).contains(&u.bucket) {
                return Err("--bucket must be between 100us and 1s".into());
            }
        }
        Ok(())
    }
}

/// `test udp`: a constant-rate UDP stream to the server.
#[derive(Clone, Debug, Serialize)]
pub struct UdpParams {
    /// UDP payload bits per second (as iperf3's `-b`).
    pub rate_bps: u64,
    /// UDP payload bytes per packet.
    pub size: u16,
    pub pacing: Pacing,
    /// Burst-profile bucket, seconds.
    pub bucket: f64,
    pub dscp: u8,
    /// ECN code point of every packet (`--ecn`); the server counts those arriving CE.
    pub ecn: u8,
}

/// A probe stream of the plan, with the name its series carry.
#[derive(Clone, Debug, PartialEq)]
pub struct Stream {
    pub name: String,
    pub spec: StreamSpec,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    /// "tcp down 3 CS5"
    pub name: String,
    pub spec: FlowSpec,
    /// Seconds into the load phase at which the flow opens (RPM adds load gradually).
    pub start_after: f64,
    /// RPM load: small frames, and unsent data in the socket kept near 5 ms of the flow's rate,
    /// so that a probe on the connection waits behind little more than the network's queue.
    pub responsive: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub idle: f64,
    /// Load phase length (0 for tests without load).
    pub load: f64,
    /// After the load's end, the longest it runs on for the answers of the probes sent under it
    /// (0 when it carries none: only RPM's probes ride or follow the load).
    pub answers: f64,
    /// After the load: probes only, while queues drain, for a second clock estimate (drift).
    pub settle: f64,
    pub flows: Vec<Flow>,
    pub streams: Vec<Stream>,
    /// Interval of new-connection probes (TCP connect RTT, RPM foreign probes).
    pub connect_probe_interval: Option<Duration>,
    /// Interval of probes on loaded connections (RPM).
    pub loaded_probe_interval: Option<Duration>,
    /// udp: the load stream and the pacing asked for.
    pub udp_load: Option<(UdpLoadSpec, Pacing)>,
}

impl Plan {
    /// The longest the test can take.
    pub fn total(&self) -> f64 {
        self.idle + self.load + self.answers + self.settle
    }

    /// Seconds from the test start at which the load ends (and settling begins).
    pub fn load_end(&self) -> f64 {
        self.idle + self.load
    }
}

/// flent's rrul marks: one flow per class and direction.
pub const RRUL_DSCP: [u8; 4] = [0, 8, 40, 46];
pub const VOIP_INTERVAL_US: u32 = 20_000;
pub const VOIP_SIZE: u16 = 172;
/// Probes after the load, for the second clock estimate: long enough for the fastest third of
/// them to find drained queues (a 1000-packet FIFO at 20 Mbit/s drains in 0.6 s).
pub const SETTLE_S: f64 = 2.0;

pub fn plan(p: &Params) -> Plan {
    let step_us = (p.step * 1e6).round() as u32;
    let probe = |id: u16, name: &str, dscp: u8| Stream {
        name: name.into(),
        spec: StreamSpec {
            id,
            interval_us: step_us,
            size: p.probe_size,
            dscp,
            ecn: p.ecn,
        },
    };
    let mut flows = Vec::new();
    let responsive = p.test == TestKind::Rpm;
    let mut add = |direction: Direction, dscp: u8, start_after: f64| {
        let id = flows.len() as u16 + 1;
        let name = format!("tcp {} {} {}", direction.as_str(), id, dscp_name(dscp));
        flows.push(Flow {
            name,
            spec: FlowSpec {
                id,
                direction,
                dscp,
                cc: p.cc.clone(),
            },
            start_after,
            responsive,
        });
    };
    let mut streams = vec![probe(0, "udp-be", 0)];
    let (mut idle, mut load) = (p.idle, p.length);
    let (mut connect, mut loaded) = (None, None);
    let mut udp_load = None;
    match p.test {
        TestKind::Ping => {
            (idle, load) = (p.length, 0.0);
            connect = Some(Duration::from_secs_f64((p.step * 10.0).max(0.05)));
        }
        TestKind::TcpDown | TestKind::TcpUp | TestKind::TcpBidir => {
            for _ in 0..p.flows {
                if p.test != TestKind::TcpUp {
                    add(Direction::Down, 0, 0.0);
                }
                if p.test != TestKind::TcpDown {
                    add(Direction::Up, 0, 0.0);
                }
            }
        }
        TestKind::Rrul | TestKind::RrulBe => {
            let marks = if p.test == TestKind::Rrul {
                RRUL_DSCP
            } else {
                [0; 4]
            };
            for dir in [Direction::Down, Direction::Up] {
                for d in marks {
                    add(dir, d, 0.0);
                }
            }
            if p.test == TestKind::Rrul {
                streams.push(probe(1, "udp-ef", 46));
                streams.push(probe(2, "udp-bk", 8));
            }
        }
        TestKind::Voip => {
            streams = vec![Stream {
                name: "voip".into(),
                spec: StreamSpec {
                    id: 0,
                    interval_us: VOIP_INTERVAL_US,
                    size: VOIP_SIZE,
                    dscp: p.dscp,
                    ecn: p.ecn,
                },
            }];
            if p.under_load {
                for dir in [Direction::Down, Direction::Up] {
                    for _ in 0..4 {
                        add(dir, 0, 0.0);
                    }
                }
            } else {
                (idle, load) = (p.length, 0.0);
            }
        }
        // Run no flows or probes of their own (see `measure::writeback`, `measure::mtu`,
        // `measure::marks`).
        TestKind::Writeback | TestKind::Mtu | TestKind::Marks => {}
        TestKind::Udp => {
            // The probes under it show what the load's queue (or bursts) do to latency.
            if let Some(u) = &p.udp {
                let spec = UdpLoadSpec {
                    id: 0,
                    rate_bps: u.rate_bps,
                    size: u.size,
                    dscp: u.dscp,
                    ecn: u.ecn,
                    bucket_us: (u.bucket * 1e6).round() as u32,
                };
                udp_load = Some((spec, u.pacing));
            }
        }
        TestKind::Rpm => {
            // The draft's most connections per direction (both are tested at once, as Apple's
            // networkQuality does by default); the ramp (`engine::RpmRamp`) opens them.
            for _ in 0..RpmRamp::MAX_CONNECTIONS {
                add(Direction::Down, 0, 0.0);
                add(Direction::Up, 0, 0.0);
            }
            // The draft allows 100 probes per interval (MPS), as many foreign as self probes;
            // 10 pairs per second keep within it for any interval of 1 s or more.
            connect = Some(Duration::from_millis(100));
            loaded = Some(Duration::from_millis(100));
        }
    }
    let settle = if load > 0.0 { SETTLE_S } else { 0.0 };
    let answers = if load > 0.0 && (loaded.is_some() || connect.is_some()) {
        crate::connprobe::ConnProber::DEADLINE.as_secs_f64()
    } else {
        0.0
    };
    Plan {
        idle,
        load,
        answers,
        settle,
        flows,
        streams,
        connect_probe_interval: connect,
        loaded_probe_interval: loaded,
        udp_load,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(test: TestKind) -> Params {
        Params {
            length: 30.0,
            ..Params::new(test)
        }
    }

    #[test]
    fn rrul_has_four_marked_flows_each_way_and_three_probe_streams() {
        let p = plan(&params(TestKind::Rrul));
        assert_eq!(p.flows.len(), 8);
        let names: Vec<&str> = p.flows.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names[..4],
            [
                "tcp down 1 BE",
                "tcp down 2 BK",
                "tcp down 3 CS5",
                "tcp down 4 EF"
            ]
        );
        assert_eq!(names[4], "tcp up 5 BE");
        assert_eq!(
            p.streams.iter().map(|s| s.spec.dscp).collect::<Vec<_>>(),
            [0, 46, 8]
        );
        assert_eq!(
            (p.idle, p.load, p.settle, p.total()),
            (5.0, 30.0, 2.0, 37.0)
        );
        assert!(plan(&params(TestKind::RrulBe))
            .flows
            .iter()
            .all(|f| f.spec.dscp == 0));
    }

    #[test]
    fn voip_alone_is_one_idle_call_and_under_load_adds_flows() {
        let p = plan(&params(TestKind::Voip));
        assert_eq!((p.idle, p.load, p.flows.len()), (30.0, 0.0, 0));
        assert_eq!(
            p.streams[0].spec,
            StreamSpec {
                id: 0,
                interval_us: 20_000,
                size: 172,
                dscp: 46,
                ecn: 0
            }
        );
        let p = plan(&Params {
            under_load: true,
            ..params(TestKind::Voip)
        });
        assert_eq!((p.idle, p.load, p.flows.len()), (5.0, 30.0, 8));
    }

    #[test]
    fn tcp_tests_scale_with_flows_and_ping_has_no_load() {
        assert_eq!(plan(&params(TestKind::TcpBidir)).flows.len(), 8);
        assert!(plan(&params(TestKind::TcpUp))
            .flows
            .iter()
            .all(|f| f.spec.direction == Direction::Up));
        let p = plan(&params(TestKind::Ping));
        assert_eq!((p.idle, p.load, p.total()), (30.0, 0.0, 30.0));
        assert!(p.connect_probe_interval.is_some());
    }

    #[test]
    fn rpm_plans_sixteen_responsive_connections_each_way_for_its_ramp() {
        let p = plan(&params(TestKind::Rpm));
        assert_eq!(p.flows.len(), 32);
        // Down and up alternate, so a ramp that opens the first n of each opens them in pairs.
        assert_eq!(p.flows[2].spec.direction, Direction::Down);
        assert_eq!(p.flows[3].spec.direction, Direction::Up);
        assert!(p.flows.iter().all(|f| f.responsive));
        assert!(p.loaded_probe_interval.is_some());
        // The load may run on for its last probes' answers (a foreign probe's connect and
        // request deadlines), and the server is asked for that time too.
        assert_eq!(p.answers, 10.0);
        assert_eq!(p.total(), p.idle + p.load + 10.0 + p.settle);
        assert!(!plan(&params(TestKind::Rrul)).flows[0].responsive);
    }

    #[test]
    fn udp_is_one_load_stream_under_the_be_probes() {
        let udp = UdpParams {
            rate_bps: 50_000_000,
            size: 1024,
            pacing: Pacing::Timer,
            bucket: 0.001,
            dscp: 0,
            ecn: 0,
        };
        let p = plan(&Params {
            udp: Some(udp),
            length: 10.0,
            ..params(TestKind::Udp)
        });
        let (spec, pacing) = p.udp_load.clone().unwrap();
        assert_eq!(
            (spec.rate_bps, spec.size, spec.bucket_us, pacing),
            (50_000_000, 1024, 1000, Pacing::Timer)
        );
        assert_eq!(
            (p.idle, p.load, p.flows.len(), p.streams.len()),
            (5.0, 10.0, 0, 1)
        );
    }
}
