//! Live tests, keyed by token: what each may still do, and what it did.

use crate::udpload::UdpSink;
use bloatlab_proto::{FlowReport, ServerMsg, StreamReport, TestRequest, Token};
use portable_atomic::AtomicU64;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

use crate::acked::{self, AckedLog};
use crate::limits::Bucket;

#[derive(Debug)]
pub struct StreamState {
    pub dscp: u8,
    /// The ECN code point of the replies (the request's, as the stream was announced).
    pub ecn: u8,
    /// The mark the replies carried, read back from the socket when it was set.
    pub dscp_applied: Option<u8>,
    pub received: u64,
    /// The TOS bytes the accepted requests arrived with (`proto::tally_tos`).
    pub arrived: Vec<(u8, u64)>,
    pub limited: u64,
    pub bucket: Bucket,
}

/// One bulk flow of the test: its one data connection, once claimed, and what it carried.
#[derive(Debug, Default)]
pub struct FlowState {
    claimed: bool,
    pub bytes: Arc<AtomicU64>,
    pub cc: Option<String>,
    /// Downloads: what the client acknowledged, on a grid.
    pub acked: Option<Arc<Mutex<AckedLog>>>,
}

/// A claimed flow's counters: bytes moved, and for a download its acknowledged bytes.
#[derive(Debug)]
pub struct FlowCounters {
    pub bytes: Arc<AtomicU64>,
    pub acked: Option<Arc<Mutex<AckedLog>>>,
}

pub struct Session {
    pub client_ip: IpAddr,
    pub deadline: Instant,
    pub request: TestRequest,
    pub streams: Mutex<HashMap<u16, StreamState>>,
    /// UDP load streams (`test udp`): what arrived of each.
    pub udp_loads: Mutex<HashMap<u16, UdpSink>>,
    /// The namespace's UDP receive-buffer drops when the test began (tests with UDP loads).
    rcvbuf_errors_at_start: Option<u64>,
    flows: Mutex<HashMap<u16, FlowState>>,
    /// New-connection probes: only for tests that asked, at a bounded rate.
    conn_probes: Option<Mutex<Bucket>>,
    /// Bytes per second the whole test may move (`--max-rate`), both directions together.
    rate: Option<Mutex<Bucket>>,
    /// Pings a client sent faster than it read their pongs: dropped, not queued.
    pub pings_dropped: AtomicU64,
    /// Probes of this test whose MAC did not verify under the server's key.
    pub probes_unauthenticated: AtomicU64,
    ended: watch::Sender<bool>,
}

/// New-connection probes per second a test may open: the client sends 10 (RPM); twice that
/// leaves room for a bunch delayed by a queue.
const CONN_PROBES_PER_S: f64 = 20.0;

impl Session {
    pub fn new(
        client_ip: IpAddr,
        deadline: Instant,
        request: TestRequest,
        max_rate_bytes: Option<f64>,
    ) -> Self {
        let now = Instant::now();
        let streams = request
            .streams
            .iter()
            .map(|s| {
                (
                    s.id,
                    StreamState {
                        dscp: s.dscp,
                        ecn: s.ecn & 3,
                        dscp_applied: None,
                        received: 0,
                        arrived: Vec::new(),
                        limited: 0,
                        bucket: Bucket::for_stream(s.interval_us, now),
                    },
                )
            })
            .collect();
        // A load may still arrive through a bloated queue after the announced end.
        let load_span = Duration::from_millis(request.duration_ms) + crate::GRACE;
        let udp_loads = request
            .udp_loads
            .iter()
            .map(|l| (l.id, UdpSink::new(l, load_span, now)))
            .collect();
        let rcvbuf_errors_at_start = if request.udp_loads.is_empty() {
            None
        } else {
            bloatlab_netio::udp::udp_rcvbuf_errors()
        };
        // A download's acknowledged bytes, one bucket per 10 ms of the test at most.
        let buckets = (load_span.as_nanos() / u128::from(acked::BUCKET_NS)) as usize + 1;
        let flows = request
            .flows
            .iter()
            .map(|f| {
                let acked = (f.direction == bloatlab_proto::Direction::Down)
                    .then(|| Arc::new(Mutex::new(AckedLog::new(buckets))));
                (
                    f.id,
                    FlowState {
                        acked,
                        ..FlowState::default()
                    },
                )
            })
            .collect();
        let conn_probes = request
            .connection_probes
            .then(|| Mutex::new(Bucket::new(CONN_PROBES_PER_S, 2.0 * CONN_PROBES_PER_S, now)));
        // A quarter second of burst: enough for one frame at any sane rate.
        let rate =
            max_rate_bytes.map(|r| Mutex::new(Bucket::new(r, (r / 4.0).max(256.0 * 1024.0), now)));
        Session {
            client_ip,
            deadline,
            request,
            streams: Mutex::new(streams),
            udp_loads: Mutex::new(udp_loads),
            rcvbuf_errors_at_start,
            flows: Mutex::new(flows),
            conn_probes,
            rate,
            pings_dropped: AtomicU64::new(0),
            probes_unauthenticated: AtomicU64::new(0),
            ended: watch::channel(false).0,
        }
    }

    /// True until the client finished or left, or the deadline passed.
    pub fn live(&self) -> bool {
        !*self.ended.borrow() && Instant::now() < self.deadline
    }

    pub fn end(&self) {
        self.ended.send_replace(true);
    }

    /// Completes when the test has ended (its control connection finished or closed).
    pub async fn ended(&self) {
        let mut rx = self.ended.subscribe();
        let _ = rx.wait_for(|e| *e).await;
    }

    /// Claims flow `id`'s data connection: each flow gets one, once. Returns its byte counter.
    pub fn claim_flow(&self, id: u16, cc: Option<String>) -> Result<FlowCounters, String> {
        let mut flows = self.flows.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = flows.get_mut(&id) else {
            return Err(format!("no flow {id} in this test"));
        };
        if f.claimed {
            return Err(format!(
                "flow {id} already has its data connection (one per flow)"
            ));
        }
        f.claimed = true;
        f.cc = cc;
        Ok(FlowCounters {
            bytes: f.bytes.clone(),
            acked: f.acked.clone(),
        })
    }

    /// Whether a new-connection probe may be answered now.
    pub fn admit_conn_probe(&self) -> Result<(), &'static str> {
        match &self.conn_probes {
            None => Err("this test did not ask for connection probes"),
            Some(b)
                if b.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .take(Instant::now()) =>
            {
                Ok(())
            }
            Some(_) => Err("connection probes faster than 20 per second"),
        }
    }

    /// How long to wait before moving `bytes` more, to keep the test within `--max-rate`.
    pub fn pace(&self, bytes: usize) -> Duration {
        match &self.rate {
            None => Duration::ZERO,
            Some(b) => b
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pay(bytes as f64, Instant::now()),
        }
    }

    pub fn report(&self) -> ServerMsg {
        let streams = self
            .streams
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, s)| StreamReport {
                id: *id,
                received: s.received,
                server_limited: s.limited,
                dscp_applied: s.dscp_applied,
                arrived: s.arrived.clone(),
            })
            .collect();
        let flows = self
            .flows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, f)| f.claimed)
            .map(|(id, f)| FlowReport {
                id: *id,
                bytes: f.bytes.load(Ordering::Relaxed),
                cc: f.cc.clone(),
                acked: f
                    .acked
                    .as_ref()
                    .and_then(|a| a.lock().unwrap_or_else(|e| e.into_inner()).report()),
            })
            .collect();
        let socket_drops = self
            .rcvbuf_errors_at_start
            .and_then(|a| Some(bloatlab_netio::udp::udp_rcvbuf_errors()?.saturating_sub(a)));
        let udp = self
            .udp_loads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(id, l)| l.report(*id, socket_drops))
            .collect();
        ServerMsg::Report {
            streams,
            flows,
            udp,
        }
    }
}

#[derive(Default)]
pub struct Sessions(Mutex<HashMap<Token, Arc<Session>>>);

impl Sessions {
    pub fn insert(&self, token: Token, s: Arc<Session>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| s.live());
        map.insert(token, s);
    }

    /// The live session of `token`, if `from` is the address that opened it (any port of it: a
    /// NAT may give each of the client's sockets its own, and the token is the secret).
    pub fn get(&self, token: &Token, from: IpAddr) -> Option<Arc<Session>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(token)
            .filter(|s| s.client_ip == from && s.live())
            .cloned()
    }

    pub fn remove(&self, token: &Token) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_proto::{Direction, FlowSpec};

    #[test]
    fn bucket_absorbs_a_bunch_but_not_a_flood() {
        let t0 = Instant::now();
        // 10 ms stream: 200/s refill, 1000 burst.
        let mut b = Bucket::for_stream(10_000, t0);
        let bunch = (0..1000).filter(|_| b.take(t0)).count();
        assert_eq!(bunch, 1000, "a 5 s bunch of delayed probes is answered");
        assert!(!b.take(t0), "but not one more at the same instant");
        assert!(
            b.take(t0 + Duration::from_millis(5)),
            "refills at twice the announced rate"
        );
    }

    #[test]
    fn pacing_holds_a_sender_to_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1_000_000.0, 250_000.0, t0);
        assert_eq!(
            b.pay(250_000.0, t0),
            Duration::ZERO,
            "the burst goes at once"
        );
        // 500 kB more at 1 MB/s: wait 0.5 s.
        assert_eq!(b.pay(500_000.0, t0), Duration::from_millis(500));
    }

    fn request(flows: u16, connection_probes: bool) -> TestRequest {
        TestRequest {
            test: "t".into(),
            duration_ms: 1000,
            flows: (1..=flows)
                .map(|id| FlowSpec {
                    id,
                    direction: Direction::Down,
                    dscp: 0,
                    cc: None,
                })
                .collect(),
            streams: Vec::new(),
            udp_loads: Vec::new(),
            connection_probes,
            auth: None,
        }
    }

    #[test]
    fn each_flow_gets_one_data_connection() {
        let s = Session::new(
            IpAddr::from([127, 0, 0, 1]),
            Instant::now() + Duration::from_secs(5),
            request(1, false),
            None,
        );
        assert!(s.claim_flow(1, None).is_ok());
        assert_eq!(
            s.claim_flow(1, None).unwrap_err(),
            "flow 1 already has its data connection (one per flow)"
        );
        assert_eq!(s.claim_flow(2, None).unwrap_err(), "no flow 2 in this test");
    }

    #[test]
    fn connection_probes_only_when_asked_and_at_a_bounded_rate() {
        let deadline = Instant::now() + Duration::from_secs(5);
        let no = Session::new(
            IpAddr::from([127, 0, 0, 1]),
            deadline,
            request(0, false),
            None,
        );
        assert_eq!(
            no.admit_conn_probe(),
            Err("this test did not ask for connection probes")
        );
        let yes = Session::new(
            IpAddr::from([127, 0, 0, 1]),
            deadline,
            request(0, true),
            None,
        );
        let admitted = (0..100).filter(|_| yes.admit_conn_probe().is_ok()).count();
        assert_eq!(admitted, 40, "a burst of 2 s worth, then 20 per second");
    }
}
