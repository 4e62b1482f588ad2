//! Live tests, keyed by token.

use bloatlab_proto::{FlowReport, ServerMsg, StreamReport, TestRequest, Token};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Token bucket for one probe stream: refills at twice the announced rate and holds 10 s worth,
/// so requests that a bloated queue delivers in a bunch are all answered, while a client that
/// sends far more than it announced is held to its word.
#[derive(Debug)]
pub struct Bucket {
    tokens: f64,
    per_sec: f64,
    cap: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(interval_us: u32, now: Instant) -> Self {
        let per_sec = 2e6 / f64::from(interval_us.max(1));
        let cap = (per_sec * 5.0).max(50.0);
        Bucket { tokens: cap, per_sec, cap, last: now }
    }

    pub fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_sec).min(self.cap);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
pub struct StreamState {
    pub dscp: u8,
    /// The mark the replies carried, read back from the socket when it was set.
    pub dscp_applied: Option<u8>,
    pub received: u64,
    pub limited: u64,
    pub bucket: Bucket,
}

pub struct Session {
    pub client_ip: IpAddr,
    pub deadline: Instant,
    pub request: TestRequest,
    pub streams: Mutex<HashMap<u16, StreamState>>,
    flows: Mutex<Vec<(u16, Arc<AtomicU64>, Option<String>)>>,
    ended: AtomicBool,
}

impl Session {
    pub fn new(client_ip: IpAddr, deadline: Instant, request: TestRequest) -> Self {
        let now = Instant::now();
        let streams = request
            .streams
            .iter()
            .map(|s| (s.id, StreamState { dscp: s.dscp, dscp_applied: None, received: 0, limited: 0, bucket: Bucket::new(s.interval_us, now) }))
            .collect();
        Session { client_ip, deadline, request, streams: Mutex::new(streams), flows: Mutex::new(Vec::new()), ended: AtomicBool::new(false) }
    }

    /// True until the client finished or left, or the deadline passed.
    pub fn live(&self) -> bool {
        !self.ended.load(Ordering::Relaxed) && Instant::now() < self.deadline
    }

    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// The byte counter of a data connection (a reconnect of the same flow adds to it).
    pub fn flow_counter(&self, id: u16, cc: Option<String>) -> Arc<AtomicU64> {
        let mut flows = self.flows.lock().unwrap();
        if let Some((_, c, _)) = flows.iter().find(|(i, _, _)| *i == id) {
            return c.clone();
        }
        let c = Arc::new(AtomicU64::new(0));
        flows.push((id, c.clone(), cc));
        c
    }

    pub fn report(&self) -> ServerMsg {
        let streams = self
            .streams
            .lock()
            .unwrap()
            .iter()
            .map(|(id, s)| StreamReport { id: *id, received: s.received, server_limited: s.limited, dscp_applied: s.dscp_applied })
            .collect();
        let flows = self
            .flows
            .lock()
            .unwrap()
            .iter()
            .map(|(id, c, cc)| FlowReport { id: *id, bytes: c.load(Ordering::Relaxed), cc: cc.clone() })
            .collect();
        ServerMsg::Report { streams, flows }
    }
}

#[derive(Default)]
pub struct Sessions(Mutex<HashMap<Token, Arc<Session>>>);

impl Sessions {
    /// Adds a session unless `max` are live; the error is the number running.
    pub fn insert(&self, token: Token, s: Arc<Session>, max: usize) -> Result<(), usize> {
        let mut map = self.0.lock().unwrap();
        map.retain(|_, s| s.live());
        if map.len() >= max {
            return Err(map.len());
        }
        map.insert(token, s);
        Ok(())
    }

    /// The live session of `token`, if `from` is the address that opened it.
    pub fn get(&self, token: &Token, from: IpAddr) -> Option<Arc<Session>> {
        let map = self.0.lock().unwrap();
        map.get(token).filter(|s| s.client_ip == from && s.live()).cloned()
    }

    pub fn remove(&self, token: &Token) {
        self.0.lock().unwrap().remove(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn bucket_absorbs_a_bunch_but_not_a_flood() {
        let t0 = Instant::now();
        // 10 ms stream: 200/s refill, 1000 burst.
        let mut b = Bucket::new(10_000, t0);
        let bunch = (0..1000).filter(|_| b.take(t0)).count();
        assert_eq!(bunch, 1000, "a 10 s bunch of delayed probes is answered");
        assert!(!b.take(t0), "but not one more at the same instant");
        assert!(b.take(t0 + Duration::from_millis(5)), "refills at twice the announced rate");
    }
}
