//! Slots: how many of something (connections, tests) may exist at once, in all and per client
//! address. A slot is a guard: dropping it (at the end of its task, on an error path or when the
//! task panics) gives it back, so no path can lose one.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Slots {
    /// What is counted, for refusals ("connections", "tests").
    what: &'static str,
    max: usize,
    max_per_ip: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

/// One slot, given back on drop.
pub struct Slot {
    slots: Arc<Slots>,
    ip: IpAddr,
}

/// Why no slot was free, in words that name the limit.
#[derive(Debug, PartialEq, Eq)]
pub enum Full {
    All { what: &'static str, max: usize },
    ThisAddress { what: &'static str, max: usize },
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Full::All { what, max } => write!(
                f,
                "the server is busy: {max} {what} at once is its limit; try again in a minute"
            ),
            Full::ThisAddress { what, max } => write!(
                f,
                "your address already has {max} {what} open, this server's limit per address"
            ),
        }
    }
}

impl Slots {
    pub fn new(what: &'static str, max: usize, max_per_ip: usize) -> Arc<Slots> {
        Arc::new(Slots {
            what,
            max,
            max_per_ip,
            held: Mutex::new(Held::default()),
        })
    }

    pub fn take(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Full> {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.total >= self.max {
            return Err(Full::All {
                what: self.what,
                max: self.max,
            });
        }
        let mine = h.per_ip.entry(ip).or_default();
        if *mine >= self.max_per_ip {
            return Err(Full::ThisAddress {
                what: self.what,
                max: self.max_per_ip,
            });
        }
        *mine += 1;
        h.total += 1;
        Ok(Slot {
            slots: self.clone(),
            ip,
        })
    }

    /// Whether half the slots, in all or of `ip`'s, are held: time for idle holders to go.
    pub fn crowded(&self, ip: IpAddr) -> bool {
        let (total, mine) = self.held(ip);
        total * 2 >= self.max || mine * 2 >= self.max_per_ip
    }

    /// Slots held now: (in all, by `ip`).
    pub fn held(&self, ip: IpAddr) -> (usize, usize) {
        let h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        (h.total, h.per_ip.get(&ip).copied().unwrap_or(0))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = self.slots.held.lock().unwrap_or_else(|e| e.into_inner());
        h.total -= 1;
        if let Some(n) = h.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                h.per_ip.remove(&self.ip);
            }
        }
    }
}

/// Token bucket: refills at `per_sec` and holds `cap`.
#[derive(Debug)]
pub struct Bucket {
    tokens: f64,
    per_sec: f64,
    cap: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(per_sec: f64, cap: f64, now: Instant) -> Self {
        Bucket {
            tokens: cap,
            per_sec,
            cap,
            last: now,
        }
    }

    /// For one probe stream: refills at twice the announced rate and holds 5 s worth (at least
    /// 50), so requests that a bloated queue delivers in a bunch are all answered, while a client
    /// that sends far more than it announced is held to its word.
    pub fn for_stream(interval_us: u32, now: Instant) -> Self {
        let per_sec = 2e6 / f64::from(interval_us.max(1));
        Bucket::new(per_sec, (per_sec * 5.0).max(50.0), now)
    }

    pub fn take(&mut self, now: Instant) -> bool {
        self.take_n(1.0, now)
    }

    pub(crate) fn take_n(&mut self, n: f64, now: Instant) -> bool {
        self.refill(now);
        if self.tokens >= n {
            self.tokens -= n;
            true
        } else {
            false
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_sec).min(self.cap);
    }

    /// Takes `n` tokens, going into debt if need be; returns how long to wait until the debt is
    /// paid: a sender that waits that long keeps to `per_sec` on average.
    pub fn pay(&mut self, n: f64, now: Instant) -> Duration {
        self.refill(now);
        self.tokens -= n;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_sec)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn slots_are_capped_in_all_and_per_address_and_come_back_on_drop() {
        let s = Slots::new("tests", 3, 2);
        let a1 = s.take(ip(1)).unwrap();
        let _a2 = s.take(ip(1)).unwrap();
        assert_eq!(
            s.take(ip(1)).err(),
            Some(Full::ThisAddress {
                what: "tests",
                max: 2
            })
        );
        let _b1 = s.take(ip(2)).unwrap();
        assert_eq!(
            s.take(ip(3)).err(),
            Some(Full::All {
                what: "tests",
                max: 3
            })
        );
        drop(a1);
        assert_eq!(s.held(ip(1)), (2, 1));
        assert!(s.take(ip(3)).is_ok(), "a dropped slot is free again");
    }

    #[test]
    fn crowded_from_half_the_slots_in_all_or_of_one_address() {
        let s = Slots::new("connections", 10, 4);
        let _a = s.take(ip(1)).unwrap();
        assert!(!s.crowded(ip(1)));
        let _b = s.take(ip(1)).unwrap();
        assert!(s.crowded(ip(1)), "2 of this address's 4");
        assert!(!s.crowded(ip(2)), "2 of 10 in all, none of this address's");
        let _more: Vec<Slot> = (3..6).map(|i| s.take(ip(i)).unwrap()).collect();
        assert!(s.crowded(ip(9)), "5 of 10 in all");
    }

    #[test]
    fn a_panicking_holder_gives_its_slot_back() {
        let s = Slots::new("connections", 1, 1);
        let s2 = s.clone();
        let r = std::thread::spawn(move || {
            let _slot = s2.take(ip(1)).unwrap();
            panic!("handler bug");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(s.held(ip(1)), (0, 0));
        assert!(s.take(ip(1)).is_ok());
    }

    #[test]
    fn refusals_name_the_limit() {
        assert_eq!(
            Full::All {
                what: "tests",
                max: 4
            }
            .to_string(),
            "the server is busy: 4 tests at once is its limit; try again in a minute"
        );
        assert_eq!(
            Full::ThisAddress {
                what: "connections",
                max: 64
            }
            .to_string(),
            "your address already has 64 connections open, this server's limit per address"
        );
    }
}
