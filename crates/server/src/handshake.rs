//! How long a client may take to open a connection (a TLS handshake, a WebSocket upgrade, the
//! protocol's hello), the same rule on every face: a slow opening keeps its slot only while
//! nobody else wants it.

use std::time::Duration;
// tokio's clock: the same as std's, except in tests with paused time.
use tokio::time::Instant;

/// How often a waiting opening looks at its address's count.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// How long an opening may take while its address is not crowded. On a full, lossy uplink a
/// client's first flight can be lost twice, and after a retransmitted SYN Linux waits 3 s before
/// resending data (RFC 6298's fallback), then 6 s. Through a 30-packet 5 Mbit/s FIFO
/// filled by mach's upload, a 1.5 kB ClientHello finished its handshake after 6.3 s, which the
/// 5 s deadline would have cut (and mach then aborts its whole test).
pub const LOSSY_HANDSHAKE: Duration = Duration::from_secs(15);

/// Runs `handshake` to its end, unless it takes `LOSSY_HANDSHAKE`, or `first` while `crowded()`
/// (half the slots held): a slow handshake keeps its slot only while nobody else wants it.
pub async fn handshake_within<F: std::future::Future>(
    handshake: F,
    first: Duration,
    crowded: impl Fn() -> bool,
) -> Option<F::Output> {
    let give_up = async {
        tokio::time::sleep(first).await;
        let deadline = Instant::now() + LOSSY_HANDSHAKE.saturating_sub(first);
        while Instant::now() < deadline && !crowded() {
            tokio::time::sleep(LOOK_EVERY).await;
        }
    };
    tokio::select! {
        done = handshake => Some(done),
        _ = give_up => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_slow_handshake_keeps_its_slot_until_others_want_it() {
        let first = Duration::from_secs(5);
        let never = std::future::pending::<()>;
        // Not crowded: the lossy path's allowance.
        let t0 = Instant::now();
        assert_eq!(handshake_within(never(), first, || false).await, None);
        assert!(
            t0.elapsed() >= LOSSY_HANDSHAKE && t0.elapsed() <= LOSSY_HANDSHAKE + LOOK_EVERY,
            "{:?}",
            t0.elapsed()
        );
        // Crowded: the first deadline.
        let t0 = Instant::now();
        assert_eq!(handshake_within(never(), first, || true).await, None);
        assert_eq!(t0.elapsed(), first);
        // Crowded later on: from then.
        let t0 = Instant::now();
        let at = t0 + Duration::from_secs(8);
        assert_eq!(
            handshake_within(never(), first, move || Instant::now() >= at).await,
            None
        );
        assert!(
            t0.elapsed() >= Duration::from_secs(8)
                && t0.elapsed() <= Duration::from_secs(8) + LOOK_EVERY,
            "{:?}",
            t0.elapsed()
        );
        // A handshake that ends in time is what it returned, crowded or not.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(9)).await;
            7
        };
        assert_eq!(handshake_within(slow, first, || false).await, Some(7));
    }
}
