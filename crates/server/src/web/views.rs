//! The server's own view of each address's load: the kernel's round trip of its latest `/large`
//! connection (the sender's smoothed RTT, which includes the queue downstream) and `/slurp`
//! connection (the receiver's estimate, upstream), and the upload bytes it has received, for the
//! browser test's probes to report. A browser counts an upload when it hands bytes to its
//! socket, so its own count runs ahead of the line; the server's is what arrived.
//! Pure: driven by the times it is given.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A view older than this is no longer reported (that load has ended).
const FRESH: Duration = Duration::from_secs(2);
/// Addresses remembered at most; stale ones are forgotten first, then new ones are not kept.
const MAX_ADDRESSES: usize = 65_536;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadView {
    pub down_us: Option<u32>,
    pub up_us: Option<u32>,
    /// Bytes received through `/slurp` from this address since the server started.
    pub up_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Down,
    Up,
}

#[derive(Default)]
struct Seen {
    down: Option<(u32, Instant)>,
    up: Option<(u32, Instant)>,
    up_bytes: u64,
}

#[derive(Default)]
pub(crate) struct LoadViews(Mutex<HashMap<IpAddr, Seen>>);

fn fresh(v: Option<(u32, Instant)>, now: Instant) -> Option<u32> {
    v.filter(|(us, at)| *us > 0 && now.saturating_duration_since(*at) <= FRESH)
        .map(|(us, _)| us)
}

impl LoadViews {
    /// Applies `f` to the address's entry, making room for it if need be (stale addresses go).
    fn with(&self, ip: IpAddr, now: Instant, f: impl FnOnce(&mut Seen)) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&ip) {
            map.retain(|_, s| fresh(s.down, now).is_some() || fresh(s.up, now).is_some());
            if map.len() >= MAX_ADDRESSES {
                return;
            }
        }
        f(map.entry(ip).or_default());
    }

    pub(crate) fn record(&self, ip: IpAddr, way: Way, rtt_us: u32, now: Instant) {
        self.with(ip, now, |seen| match way {
            Way::Down => seen.down = Some((rtt_us, now)),
            Way::Up => seen.up = Some((rtt_us, now)),
        });
    }

    pub(crate) fn count_upload(&self, ip: IpAddr, bytes: u64, now: Instant) {
        self.with(ip, now, |seen| seen.up_bytes += bytes);
    }

    pub(crate) fn get(&self, ip: IpAddr, now: Instant) -> LoadView {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&ip).map_or_else(LoadView::default, |s| LoadView {
            down_us: fresh(s.down, now),
            up_us: fresh(s.up, now),
            up_bytes: s.up_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_per_address_and_expire() {
        let v = LoadViews::default();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let t0 = Instant::now();
        v.record(a, Way::Down, 230_000, t0);
        v.record(a, Way::Up, 40_000, t0 + Duration::from_secs(1));
        v.count_upload(a, 1000, t0);
        v.count_upload(a, 500, t0);
        assert_eq!(
            v.get(a, t0 + Duration::from_secs(1)),
            LoadView {
                down_us: Some(230_000),
                up_us: Some(40_000),
                up_bytes: 1500
            }
        );
        assert_eq!(v.get(b, t0), LoadView::default());
        assert_eq!(
            v.get(a, t0 + Duration::from_millis(2500)),
            LoadView {
                down_us: None,
                up_us: Some(40_000),
                up_bytes: 1500
            }
        );
    }

    #[test]
    fn the_map_stays_bounded() {
        let v = LoadViews::default();
        let t0 = Instant::now();
        for i in 0..MAX_ADDRESSES as u32 + 10 {
            v.record(IpAddr::from(i.to_be_bytes()), Way::Down, 1, t0);
        }
        assert_eq!(v.0.lock().unwrap().len(), MAX_ADDRESSES);
        // Once the old ones are stale, a new address gets in.
        let later = t0 + Duration::from_secs(3);
        v.record("198.51.100.1".parse().unwrap(), Way::Down, 1, later);
        assert_eq!(v.0.lock().unwrap().len(), 1);
    }
}
