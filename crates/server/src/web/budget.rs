//! Bytes per client address through the bulk endpoints (`/large`, `/slurp`): an 8 GB download
//! anyone can open must not make the server a free bandwidth amplifier. Each address may move
//! `max` bytes per `window` (a fixed window from its first byte); past that it is told when to
//! come back. Pure: the caller passes the time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Addresses tracked at once; past this (after pruning finished windows) a new address is
/// refused until windows end, so the table stays bounded whatever the number of clients.
const MAX_ADDRESSES: usize = 65_536;

pub struct Budgets {
    max: u64,
    window: Duration,
    used: Mutex<HashMap<IpAddr, (Instant, u64)>>,
}

impl Budgets {
    pub fn new(max: u64, window: Duration) -> Budgets {
        Budgets {
            max,
            window,
            used: Mutex::new(HashMap::new()),
        }
    }

    /// What one address may move per window, for refusals and the log.
    pub fn limits(&self) -> (u64, Duration) {
        (self.max, self.window)
    }

    /// Counts `bytes` for `ip` at `now`; Err(how long until its window ends) when it has used its
    /// budget (the bytes that crossed it are counted: they were sent).
    pub fn charge(&self, ip: IpAddr, bytes: u64, now: Instant) -> Result<(), Duration> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if !used.contains_key(&ip) && used.len() >= MAX_ADDRESSES {
            used.retain(|_, (start, _)| now.saturating_duration_since(*start) < self.window);
            if used.len() >= MAX_ADDRESSES {
                let soonest = used
                    .values()
                    .map(|(s, _)| *s + self.window)
                    .min()
                    .unwrap_or(now);
                return Err(soonest
                    .saturating_duration_since(now)
                    .max(Duration::from_secs(1)));
            }
        }
        let entry = used.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        if entry.1 >= self.max {
            return Err((entry.0 + self.window)
                .saturating_duration_since(now)
                .max(Duration::from_secs(1)));
        }
        entry.1 = entry.1.saturating_add(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_bytes_per_window_and_is_told_when_to_return() {
        let b = Budgets::new(1000, Duration::from_secs(600));
        let t0 = Instant::now();
        let (a, other) = (IpAddr::from([192, 0, 2, 1]), IpAddr::from([192, 0, 2, 2]));
        // 600 + 600 crosses 1000: the second chunk was sent and counts, the third is refused.
        assert!(b.charge(a, 600, t0).is_ok());
        assert!(b.charge(a, 600, t0 + Duration::from_secs(1)).is_ok());
        assert_eq!(
            b.charge(a, 1, t0 + Duration::from_secs(100)),
            Err(Duration::from_secs(500))
        );
        assert!(
            b.charge(other, 600, t0 + Duration::from_secs(100)).is_ok(),
            "budgets are per address"
        );
        assert!(
            b.charge(a, 600, t0 + Duration::from_secs(600)).is_ok(),
            "a new window"
        );
    }

    #[test]
    fn the_table_stays_bounded_and_makes_room_as_windows_end() {
        let b = Budgets::new(10, Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..MAX_ADDRESSES as u32 {
            assert!(b.charge(IpAddr::from(i.to_be_bytes()), 1, t0).is_ok());
        }
        let late = IpAddr::from([203, 0, 113, 9]);
        assert_eq!(
            b.charge(late, 1, t0 + Duration::from_secs(20)),
            Err(Duration::from_secs(40))
        );
        assert!(
            b.charge(late, 1, t0 + Duration::from_secs(60)).is_ok(),
            "finished windows are pruned"
        );
        assert!(b.used.lock().unwrap().len() <= MAX_ADDRESSES);
    }
}
