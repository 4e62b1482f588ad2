//! Byte queue limits: Linux's dynamic queue limits (lib/dynamic_queue_limits.c), which a
//! driver uses to keep its transmit ring just full enough not to run dry between completions.
//! Pure: the caller says what was queued and what completed, and when.

use serde::Serialize;

/// The limit's learning state, in bytes, as `struct dql`.
#[derive(Clone, Debug)]
pub struct Dql {
    /// Bytes ever queued and ever completed.
    num_queued: u64,
    num_completed: u64,
    /// The current limit and `limit + num_completed`: the queue stops beyond it.
    limit: u64,
    adj_limit: u64,
    last_obj_cnt: u64,
    prev_ovlimit: u64,
    prev_num_queued: u64,
    prev_last_obj_cnt: u64,
    lowest_slack: u64,
    slack_start_ns: u64,
    /// How long slack must persist before the limit shrinks (Linux: HZ, one second).
    slack_hold_ns: u64,
    max_limit: u64,
}

/// DQL_MAX_LIMIT: UINT_MAX / 2 less DQL_MAX_OBJECT (UINT_MAX / 16).
const MAX_LIMIT: u64 = u32::MAX as u64 / 2 - u32::MAX as u64 / 16;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DqlStats {
    pub limit_bytes: u64,
    pub inflight_bytes: u64,
}

impl Dql {
    pub fn new(now: u64) -> Dql {
        Dql {
            num_queued: 0,
            num_completed: 0,
            limit: 0,
            adj_limit: 0,
            last_obj_cnt: 0,
            prev_ovlimit: 0,
            prev_num_queued: 0,
            prev_last_obj_cnt: 0,
            lowest_slack: u64::MAX,
            slack_start_ns: now,
            slack_hold_ns: 1_000_000_000,
            max_limit: MAX_LIMIT,
        }
    }

    /// `dql_queued`: `bytes` went into the ring.
    pub fn queued(&mut self, bytes: u64) {
        self.last_obj_cnt = bytes;
        self.num_queued += bytes;
    }

    /// Whether the driver has stopped the queue (`dql_avail` < 0): no more until completions.
    pub fn stopped(&self) -> bool {
        self.num_queued > self.adj_limit
    }

    pub fn stats(&self) -> DqlStats {
        DqlStats {
            limit_bytes: self.limit,
            inflight_bytes: self.num_queued - self.num_completed,
        }
    }

    /// `dql_completed`: `bytes` left the ring at `now`; the limit grows when the ring ran dry
    /// while over its limit, and shrinks by the least slack seen over `slack_hold_ns`.
    pub fn completed(&mut self, bytes: u64, now: u64) {
        let completed = self.num_completed + bytes;
        let mut limit = self.limit;
        let mut ovlimit = (self.num_queued - self.num_completed).saturating_sub(limit);
        let inprogress = self.num_queued - completed;
        let prev_inprogress = self.prev_num_queued.saturating_sub(self.num_completed);
        let all_prev_completed = completed >= self.prev_num_queued;
        if (ovlimit > 0 && inprogress == 0) || (self.prev_ovlimit > 0 && all_prev_completed) {
            // Starved: grow by what was both sent and completed in the interval, plus the
            // previous over-limit.
            limit += completed.saturating_sub(self.prev_num_queued) + self.prev_ovlimit;
            self.slack_start_ns = now;
            self.lowest_slack = u64::MAX;
        } else if inprogress > 0 && prev_inprogress > 0 && !all_prev_completed {
            // Busy the whole interval: the excess over twice what completed is slack.
            let slack =
                (limit + self.prev_ovlimit).saturating_sub(2 * (completed - self.num_completed));
            let slack_last_objs = if self.prev_ovlimit > 0 {
                self.prev_last_obj_cnt.saturating_sub(self.prev_ovlimit)
            } else {
                0
            };
            self.lowest_slack = self.lowest_slack.min(slack.max(slack_last_objs));
            if now > self.slack_start_ns + self.slack_hold_ns {
                limit = limit.saturating_sub(self.lowest_slack);
                self.slack_start_ns = now;
                self.lowest_slack = u64::MAX;
            }
        }
        limit = limit.min(self.max_limit);
        if limit != self.limit {
            self.limit = limit;
            ovlimit = 0;
        }
        self.adj_limit = limit + completed;
        self.prev_ovlimit = ovlimit;
        self.prev_last_obj_cnt = self.last_obj_cnt;
        self.num_completed = completed;
        self.prev_num_queued = self.num_queued;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One packet at a time into an idle ring, completed before the next: the first completion
    /// finds the ring starved over its zero limit and grows the limit by what completed.
    #[test]
    fn a_starved_ring_grows_its_limit_by_what_completed() {
        let mut d = Dql::new(0);
        assert!(!d.stopped());
        d.queued(1500);
        assert!(d.stopped(), "over a zero limit after one packet");
        d.completed(1500, 1_000);
        assert_eq!(
            d.stats(),
            DqlStats {
                limit_bytes: 1500,
                inflight_bytes: 0
            }
        );
        assert!(!d.stopped());
    }

    /// A ring kept full, completed one packet at a time: the limit settles at a few packets
    /// (what covers one completion), never at the thousands of bytes a fixed ring would hold.
    #[test]
    fn a_busy_ring_settles_at_a_few_packets() {
        let mut d = Dql::new(0);
        let mut ring = std::collections::VecDeque::new();
        let mut now = 0;
        let mut max_inflight = 0;
        for _ in 0..20_000 {
            while !d.stopped() {
                d.queued(1500);
                ring.push_back(1500);
            }
            max_inflight = max_inflight.max(d.stats().inflight_bytes);
            now += 1_200_000; // 1500 B at 10 Mbit/s
            d.completed(ring.pop_front().unwrap(), now);
        }
        let s = d.stats();
        assert!(s.limit_bytes <= 3 * 1500, "{s:?}");
        assert!(max_inflight <= 6 * 1500, "{max_inflight}");
    }
}
