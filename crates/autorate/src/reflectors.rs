//! ICMP echo reflectors, the fallback signal when no bloatlab server answers: which reflector
//! to ping when, each one's round-trip baseline, and its health (pure, on the caller's clock).
//!
//! cake-autorate's rules (`cake-autorate.sh`, v3.5): each reflector's baseline is an asymmetric
//! EWMA (0.001 up, 0.9 down) and its delta EWMA (0.095) moves only below high load; a reflector
//! that has not answered within the last second gets an offence, and 3 offences within the
//! last 60 checks replace it; once a minute a reflector whose baseline is over 20 ms above the
//! lowest, or whose delta EWMA is over 10 ms above the lowest, is replaced (a far reflector,
//! or one that queues ICMP behind other work). Replacements come from the spares in the order
//! given, and the replaced one goes to the back of them. Ours adds: while none of them answers
//! the line is down, and nobody gets an offence for it.

use std::collections::VecDeque;

const S: u64 = 1_000_000_000;

#[derive(Clone, Debug)]
pub struct ReflectorConfig {
    /// Reflectors pinged at a time (cake-autorate's 6).
    pub active: usize,
    /// Pings per second over all of them.
    pub rate: f64,
    /// A reflector silent this long at a check gets an offence.
    pub offence_after_ns: u64,
    /// This many offences within the last `offence_checks` checks replace it.
    pub offences: usize,
    pub offence_checks: usize,
    /// Offences are looked for this often.
    pub check_every_ns: u64,
    /// Baselines and delta EWMAs are compared this often.
    pub compare_every_ns: u64,
    pub baseline_excess_ms: f64,
    pub delta_excess_ms: f64,
}

impl ReflectorConfig {
    /// cake-autorate's defaults at `rate` pings a second.
    pub fn new(rate: f64) -> ReflectorConfig {
        ReflectorConfig {
            active: 6,
            rate,
            offence_after_ns: S,
            offences: 3,
            offence_checks: 60,
            check_every_ns: S,
            compare_every_ns: 60 * S,
            baseline_excess_ms: 20.0,
            delta_excess_ms: 10.0,
        }
    }
}

/// Why a reflector was replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// It stopped answering (offences).
    Silent,
    /// Its baseline is far above the lowest.
    Far,
    /// Its delay above baseline is far above the lowest (it queues ICMP behind other work).
    Noisy,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Replaced<A> {
    pub old: A,
    pub new: A,
    pub fault: Fault,
}

struct Slot<A> {
    addr: A,
    baseline: Option<f64>,
    delta_ewma: Option<f64>,
    /// The last answer, or when it joined (a newcomer has a second to answer).
    last_heard: u64,
    /// The last `offence_checks` checks, true where it had an offence.
    checks: VecDeque<bool>,
}

impl<A> Slot<A> {
    fn new(addr: A, now: u64) -> Slot<A> {
        Slot {
            addr,
            baseline: None,
            delta_ewma: None,
            last_heard: now,
            checks: VecDeque::new(),
        }
    }
}

pub struct Reflectors<A> {
    cfg: ReflectorConfig,
    active: Vec<Slot<A>>,
    spares: VecDeque<A>,
    next: usize,
    next_send: u64,
    next_check: u64,
    next_compare: u64,
}

impl<A: Clone + PartialEq> Reflectors<A> {
    /// The first `cfg.active` of `pool` start, the rest wait as spares. None when `pool` is
    /// empty.
    pub fn new(pool: Vec<A>, cfg: ReflectorConfig, now: u64) -> Option<Reflectors<A>> {
        if pool.is_empty() || cfg.active == 0 {
            return None;
        }
        let mut spares: VecDeque<A> = pool.into();
        let active = (0..cfg.active.min(spares.len()))
            .filter_map(|_| spares.pop_front())
            .map(|a| Slot::new(a, now))
            .collect();
        Some(Reflectors {
            active,
            spares,
            next: 0,
            next_send: now,
            next_check: now + cfg.check_every_ns,
            next_compare: now + cfg.compare_every_ns,
            cfg,
        })
    }

    pub fn active(&self) -> impl Iterator<Item = &A> {
        self.active.iter().map(|s| &s.addr)
    }

    /// When the next ping is due.
    pub fn next_due(&self) -> u64 {
        self.next_send
    }

    /// The reflector to ping now, if one is due (in turn, at `rate` a second over all).
    pub fn poll_send(&mut self, now: u64) -> Option<A> {
        if now < self.next_send {
            return None;
        }
        let gap = (1e9 / self.cfg.rate) as u64;
        // After a pause (the server answered meanwhile) the schedule starts again from now
        // rather than catching up.
        self.next_send = (self.next_send + gap).max(now + gap / 2);
        self.next = (self.next + 1) % self.active.len();
        Some(self.active[self.next].addr.clone())
    }

    /// Pinging starts again after a pause: nobody is blamed for the silence meanwhile.
    pub fn resume(&mut self, now: u64) {
        for s in &mut self.active {
            s.last_heard = now;
        }
        self.next_send = now;
        self.next_check = now + self.cfg.check_every_ns;
        self.next_compare = self.next_compare.max(now + self.cfg.compare_every_ns);
    }

    /// An answer from `from` after `rtt_ms`: its delay above that reflector's baseline, ms
    /// (None from an address not pinged now). `high_load`: the line is busy, so the delta
    /// EWMA (which judges the reflector, not the line) is left alone.
    pub fn on_reply(&mut self, now: u64, from: &A, rtt_ms: f64, high_load: bool) -> Option<f64> {
        let s = self.active.iter_mut().find(|s| s.addr == *from)?;
        s.last_heard = now;
        let base = match s.baseline {
            None => rtt_ms,
            Some(b) if rtt_ms > b => b + 0.001 * (rtt_ms - b),
            Some(b) => b + 0.9 * (rtt_ms - b),
        };
        s.baseline = Some(base);
        let delta = rtt_ms - base;
        if !high_load {
            s.delta_ewma = Some(match s.delta_ewma {
                None => delta,
                Some(e) => e + 0.095 * (delta - e),
            });
        }
        Some(delta)
    }

    /// Health checks that are due: the reflectors replaced (none while no spare is left).
    pub fn check(&mut self, now: u64) -> Vec<Replaced<A>> {
        let mut out = Vec::new();
        if now >= self.next_check {
            self.next_check = now + self.cfg.check_every_ns;
            // When none of them answers, the line is down (or the radio silent): that is
            // nobody's offence, and replacing them all would not help.
            let limit = self.cfg.offence_after_ns;
            let heard = move |s: &Slot<A>| now.saturating_sub(s.last_heard) <= limit;
            let line_up = self.active.iter().any(heard);
            for i in 0..self.active.len() {
                let s = &mut self.active[i];
                s.checks.push_back(line_up && !heard(s));
                while s.checks.len() > self.cfg.offence_checks {
                    s.checks.pop_front();
                }
                if s.checks.iter().filter(|o| **o).count() >= self.cfg.offences {
                    self.replace(i, Fault::Silent, now, &mut out);
                }
            }
        }
        if now >= self.next_compare {
            self.next_compare = now + self.cfg.compare_every_ns;
            let low = |f: fn(&Slot<A>) -> Option<f64>, v: &[Slot<A>]| {
                v.iter().filter_map(f).reduce(f64::min)
            };
            let (low_base, low_delta) = (
                low(|s| s.baseline, &self.active),
                low(|s| s.delta_ewma, &self.active),
            );
            for i in 0..self.active.len() {
                let s = &self.active[i];
                let far = s
                    .baseline
                    .zip(low_base)
                    .is_some_and(|(b, l)| b > l + self.cfg.baseline_excess_ms);
                let noisy = s
                    .delta_ewma
                    .zip(low_delta)
                    .is_some_and(|(d, l)| d > l + self.cfg.delta_excess_ms);
                if far {
                    self.replace(i, Fault::Far, now, &mut out);
                } else if noisy {
                    self.replace(i, Fault::Noisy, now, &mut out);
                }
            }
        }
        out
    }

    fn replace(&mut self, i: usize, fault: Fault, now: u64, out: &mut Vec<Replaced<A>>) {
        let Some(new) = self.spares.pop_front() else {
            return;
        };
        let old = std::mem::replace(&mut self.active[i], Slot::new(new.clone(), now));
        self.spares.push_back(old.addr.clone());
        out.push(Replaced {
            old: old.addr,
            new,
            fault,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn pool(n: u8) -> Vec<u8> {
        (0..n).collect()
    }

    /// Runs `secs` seconds of pings at 20 a second; `answer(reflector, t)` gives its round
    /// trip, or None for silence. Returns the replacements.
    fn drive(
        r: &mut Reflectors<u8>,
        from: u64,
        secs: u64,
        answer: impl Fn(u8, u64) -> Option<f64>,
    ) -> Vec<Replaced<u8>> {
        let mut out = Vec::new();
        let mut t = from;
        while t < from + secs * S {
            if let Some(a) = r.poll_send(t) {
                if let Some(rtt) = answer(a, t) {
                    r.on_reply(t + (rtt * 1e6) as u64, &a, rtt, false);
                }
            }
            out.extend(r.check(t));
            t += 10 * MS;
        }
        out
    }

    #[test]
    fn pings_each_active_reflector_in_turn_at_the_rate_over_all() {
        let mut r = Reflectors::new(pool(10), ReflectorConfig::new(20.0), 0).unwrap();
        let mut sent = Vec::new();
        let mut t = 0;
        while t < S {
            if let Some(a) = r.poll_send(t) {
                sent.push(a);
            }
            t += MS;
        }
        // 20 a second over the first 6: each 3 or 4 times, none of the spares.
        assert_eq!(sent.len(), 20);
        for a in 0..6u8 {
            let n = sent.iter().filter(|s| **s == a).count();
            assert!((3..=4).contains(&n), "{a} pinged {n} times");
        }
        assert!(sent.iter().all(|a| *a < 6));
    }

    #[test]
    fn a_silent_reflector_is_replaced_after_three_offences_and_goes_to_the_spares() {
        let mut r = Reflectors::new(pool(7), ReflectorConfig::new(20.0), 0).unwrap();
        let out = drive(&mut r, 0, 10, |a, _| (a != 2).then_some(20.0));
        // Silent from the start: offences at 2, 3 and 4 s (a newcomer has a second to answer).
        assert_eq!(
            out,
            vec![Replaced {
                old: 2,
                new: 6,
                fault: Fault::Silent
            }]
        );
        assert!(r.active().any(|a| *a == 6) && !r.active().any(|a| *a == 2));
        // With no spare left but 2, a second silent one is replaced by 2 again.
        let out = drive(&mut r, 10 * S, 10, |a, _| (a != 3).then_some(20.0));
        assert_eq!(
            out,
            vec![Replaced {
                old: 3,
                new: 2,
                fault: Fault::Silent
            }]
        );
    }

    #[test]
    fn when_none_answers_the_line_is_down_and_nobody_is_replaced() {
        let mut r = Reflectors::new(pool(9), ReflectorConfig::new(20.0), 0).unwrap();
        assert!(drive(&mut r, 0, 20, |_, _| None).is_empty());
    }

    #[test]
    fn a_reflector_that_answers_now_and_then_keeps_its_place() {
        let mut r = Reflectors::new(pool(7), ReflectorConfig::new(20.0), 0).unwrap();
        // Every other ping to 4 lost: it still answers within each second.
        let out = drive(&mut r, 0, 30, |a, t| {
            (a != 4 || (t / (300 * MS)).is_multiple_of(2)).then_some(20.0)
        });
        assert!(out.is_empty(), "{out:?}");
    }

    #[test]
    fn far_and_noisy_reflectors_are_rotated_out_at_the_minute() {
        let mut r = Reflectors::new(pool(8), ReflectorConfig::new(20.0), 0).unwrap();
        // 1 sits 25 ms further away; 5 adds 0-30 ms of its own to every other answer (a delta
        // EWMA near 15 ms against the others' 0).
        let out = drive(&mut r, 0, 61, |a, t| {
            Some(match a {
                1 => 45.0,
                5 if (t / (300 * MS)) % 2 == 1 => 50.0,
                _ => 20.0,
            })
        });
        assert_eq!(
            out,
            vec![
                Replaced {
                    old: 1,
                    new: 6,
                    fault: Fault::Far
                },
                Replaced {
                    old: 5,
                    new: 7,
                    fault: Fault::Noisy
                }
            ]
        );
    }

    #[test]
    fn the_delta_is_over_the_reflectors_own_baseline_and_the_baseline_rises_slowly() {
        let mut r = Reflectors::new(vec!['a', 'b'], ReflectorConfig::new(20.0), 0).unwrap();
        assert_eq!(r.on_reply(0, &'a', 10.0, false), Some(0.0));
        assert_eq!(r.on_reply(0, &'b', 40.0, false), Some(0.0));
        // 30 ms of queue on both: the same delta over different baselines.
        let (da, db) = (
            r.on_reply(S, &'a', 40.0, true).unwrap(),
            r.on_reply(S, &'b', 70.0, true).unwrap(),
        );
        assert!(
            (da - 29.97).abs() < 1e-9 && (db - 29.97).abs() < 1e-9,
            "{da} {db}"
        );
        assert_eq!(r.on_reply(S, &'z', 1.0, false), None);
    }

    #[test]
    fn after_a_pause_nobody_is_blamed_and_the_schedule_does_not_catch_up() {
        let mut r = Reflectors::new(pool(3), ReflectorConfig::new(20.0), 0).unwrap();
        assert!(drive(&mut r, 0, 2, |_, _| Some(5.0)).is_empty());
        // A minute not pinging (the server answered), then again.
        r.resume(62 * S);
        assert!(r.check(62 * S + 500 * MS).is_empty());
        let mut n = 0;
        let mut t = 62 * S;
        while t < 63 * S {
            n += usize::from(r.poll_send(t).is_some());
            t += MS;
        }
        assert_eq!(n, 20);
    }
}
