//! Closing connections that hold a slot and do nothing. Responsiveness clients open a new
//! connection for every foreign probe, and some never close them (goresponsiveness leaves each
//! open: 500 from one address after a 20 s test, at 70 a second), so a connection that has
//! answered its requests gives its slot back: after `IDLE` with nothing in flight, or after
//! `FIRST_GRACE` while half the connection slots are held, in all or by its address. The
//! shutdown is graceful (HTTP/2 GOAWAY, HTTP/1.1 close after the last response): a client that
//! wanted the connection again opens a new one. A connection that never began a request (a
//! half-sent header, a preface that never came) is closed outright; until then it has its
//! handshake's deadline, or while crowded `REQUEST_GRACE` and four of its round trips (the same
//! client opens connections it never sends a request on: 60 at once from one address, each
//! idle for up to 5 s). A busy connection (a `/large` or `/slurp` stream, whose self probes
//! share it) is never idle. The TLS handshake before all that follows `crate::handshake`'s rule.

use hyper::body::{Body, Frame, SizeHint};
use portable_atomic::AtomicU64;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
// tokio's clock: the same as std's, except in tests with paused time.
use tokio::time::Instant;

/// How long a connection that has answered a request may sit with nothing in flight.
pub const IDLE: Duration = Duration::from_secs(2);
/// How often an idle connection looks at its address's count.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Requests in flight on one connection, and when the count last fell to zero.
pub struct Activity {
    base: Instant,
    in_flight: AtomicUsize,
    /// Requests begun on this connection.
    begun: AtomicUsize,
    /// Nanoseconds after `base` when the connection last had work (begin or end of a request).
    last_ns: AtomicU64,
}

impl Activity {
    pub fn new(now: Instant) -> Arc<Activity> {
        Arc::new(Activity {
            base: now,
            in_flight: AtomicUsize::new(0),
            begun: AtomicUsize::new(0),
            last_ns: AtomicU64::new(0),
        })
    }

    fn touch(&self, now: Instant) {
        self.last_ns.store(
            now.saturating_duration_since(self.base).as_nanos() as u64,
            Ordering::Relaxed,
        );
    }

    /// A request starts; it is in flight until the guard (moved into its response body) drops.
    pub fn begin(self: &Arc<Self>, now: Instant) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.begun.fetch_add(1, Ordering::Relaxed);
        self.touch(now);
        Busy(self.clone())
    }

    /// Whether a request has begun on this connection.
    pub fn answered(&self) -> bool {
        self.begun.load(Ordering::Relaxed) > 0
    }

    /// How long the connection has had nothing in flight, if nothing is.
    pub fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        Some(now.saturating_duration_since(
            self.base + Duration::from_nanos(self.last_ns.load(Ordering::Relaxed)),
        ))
    }
}

/// One request in flight.
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        // Touch first: a watcher that sees zero in flight must also see the new time.
        self.0.touch(Instant::now());
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A response body that keeps its request in flight until hyper has sent it or dropped it.
pub struct Tracked<B> {
    pub body: B,
    pub _busy: Busy,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The least idle time a connection keeps, crowded or not.
const FIRST_GRACE: Duration = Duration::from_millis(200);
/// What a connection that has sent no request keeps while crowded, besides four round trips: a
/// lost first request waits out a retransmission timeout (200 ms to 1 s) on a lossy path.
const REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Waits until the connection should give its slot back. Answered: idle for `IDLE`, or for
/// `FIRST_GRACE` while `crowded()` (half the slots held). Never answered: idle for `first` (the
/// handshake's deadline), or while crowded for `REQUEST_GRACE` plus four round trips (`rtt()`, the
/// kernel's smoothed RTT: a request is due one round trip after the handshake, later on a
/// bloated path).
pub async fn until_idle(
    activity: &Activity,
    first: Duration,
    crowded: impl Fn() -> bool,
    rtt: impl Fn() -> Duration,
) {
    loop {
        let answered = activity.answered();
        if let Some(idle) = activity.idle_for(Instant::now()) {
            let limit = if answered { IDLE } else { first };
            if idle >= limit {
                return;
            }
            if idle >= FIRST_GRACE.min(limit)
                && crowded()
                && (answered || idle >= REQUEST_GRACE + 4 * rtt())
            {
                return;
            }
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_counts_from_the_last_request_and_never_while_one_is_in_flight() {
        let t0 = Instant::now();
        let a = Activity::new(t0);
        assert_eq!(
            a.idle_for(t0 + Duration::from_millis(300)),
            Some(Duration::from_millis(300)),
            "a new connection is idle from its start"
        );
        let first = a.begin(t0 + Duration::from_millis(500));
        let second = a.begin(t0 + Duration::from_millis(600));
        assert_eq!(a.idle_for(t0 + Duration::from_secs(5)), None);
        drop(first);
        assert_eq!(
            a.idle_for(t0 + Duration::from_secs(5)),
            None,
            "one of two still in flight"
        );
        drop(second);
        let idle = a
            .idle_for(Instant::now() + Duration::from_millis(200))
            .unwrap();
        assert!(
            idle >= Duration::from_millis(200) && idle < Duration::from_millis(400),
            "idle counts from the end of the last request: {idle:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answered_connection_goes_after_an_idle_period_or_at_once_when_crowded() {
        let first = Duration::from_secs(10);
        let a = Activity::new(Instant::now());
        let crowded = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let waiter = {
            let (a, crowded) = (a.clone(), crowded.clone());
            tokio::spawn(async move {
                until_idle(
                    &a,
                    first,
                    move || crowded.load(Ordering::Relaxed),
                    || Duration::ZERO,
                )
                .await
            })
        };
        tokio::time::sleep(first / 2).await;
        assert!(
            !waiter.is_finished(),
            "before its first request a connection has the handshake's time"
        );
        let busy = a.begin(Instant::now());
        crowded.store(true, Ordering::Relaxed);
        tokio::time::sleep(3 * IDLE).await;
        assert!(
            !waiter.is_finished(),
            "a request in flight keeps the connection, crowded or not"
        );
        crowded.store(false, Ordering::Relaxed);
        drop(busy);
        tokio::time::sleep(IDLE / 2).await;
        assert!(
            !waiter.is_finished(),
            "answered, idle for less than IDLE, not crowded"
        );
        tokio::time::sleep(IDLE).await;
        assert!(
            waiter.is_finished(),
            "gone within an idle period and a half after its last request"
        );

        // Crowded: an answered connection goes as soon as it is idle.
        let a = Activity::new(Instant::now());
        drop(a.begin(Instant::now()));
        let t0 = Instant::now();
        until_idle(&a, first, || true, || Duration::from_secs(1)).await;
        assert!(
            t0.elapsed() <= FIRST_GRACE + LOOK_EVERY,
            "crowded: {:?}",
            t0.elapsed()
        );
        // Never answered and crowded: a grace of four round trips for the first request.
        let rtt = Duration::from_millis(300);
        let a = Activity::new(Instant::now());
        let t0 = Instant::now();
        until_idle(&a, first, || true, || rtt).await;
        let waited = t0.elapsed();
        assert!(
            waited >= REQUEST_GRACE + 4 * rtt && waited <= REQUEST_GRACE + 4 * rtt + LOOK_EVERY,
            "{waited:?}"
        );
        // Never answered, not crowded: the handshake's deadline.
        let a = Activity::new(Instant::now());
        let t0 = Instant::now();
        until_idle(&a, first, || false, || rtt).await;
        assert!(t0.elapsed() >= first && t0.elapsed() <= first + LOOK_EVERY);
    }
}
