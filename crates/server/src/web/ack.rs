//! A TCP stream that acknowledges at once whatever it reads.
//!
//! HTTP/2 clients that keep Nagle's algorithm on (Cloudflare's mach sets `TCP_NODELAY` off on
//! purpose) send their WINDOW_UPDATE frames and their probe requests as small writes, and Nagle
//! holds each one until the previous one is acknowledged. When the server has nothing to send
//! until such a write arrives (its flow-control window is used up), the kernel delays that
//! acknowledgement by its delayed-ACK timer: on loopback mach then fetched `/large` at 1.1 Gbit/s
//! with both ends mostly idle, against 6.9 with Nagle off. An immediate ACK after each read
//! takes the server's timer out of the client's latency; pure ACKs cost little beside TLS.

use bloatlab_netio::sendbuf::UnsentLimited;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub(crate) struct AckNow(pub(crate) UnsentLimited);

impl AsyncRead for AckNow {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let _ = bloatlab_netio::ack_now(&self.0);
        }
        r
    }
}

impl AsyncWrite for AckNow {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::{AckNow, UnsentLimited};
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    /// Median time, over the last 10 of 30 rounds, from the arrival of a Nagle client's small
    /// write to the arrival of the small write it made right after it. Each round the server
    /// answers, as an HTTP/2 server does, which puts its kernel in interactive ("pingpong")
    /// mode: it then delays ACKs, hoping to send them with an answer. The first rounds are
    /// acknowledged at once anyway (a new connection starts in quick-ACK mode).
    async fn second_write_wait(ack_now: bool) -> Duration {
        trait Io: AsyncRead + AsyncWrite + Unpin {}
        impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.set_nodelay(false).unwrap();
            let mut answer = [0u8; 1];
            for _ in 0..30 {
                s.write_all(&[1; 10]).unwrap();
                s.write_all(&[2; 10]).unwrap();
                s.read_exact(&mut answer).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let (stream, _) = listener.accept().await.unwrap();
        let mut stream: Box<dyn Io> = if ack_now {
            Box::new(AckNow(UnsentLimited(stream)))
        } else {
            Box::new(stream)
        };
        let mut waits = Vec::new();
        let mut buf = [0u8; 64];
        for _ in 0..30 {
            let (mut got, mut first) = (0, None);
            while got < 20 {
                let n = stream.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed early");
                first.get_or_insert_with(Instant::now);
                got += n;
            }
            waits.push(first.unwrap().elapsed());
            stream.write_all(b"k").await.unwrap();
        }
        client.join().unwrap();
        let mut last: Vec<Duration> = waits[20..].to_vec();
        last.sort();
        last[5]
    }

    /// Nagle holds the client's second write until its first is acknowledged: the kernel's
    /// delayed-ACK timer (TCP_ATO_MIN, 40 ms) without `AckNow`, at once with it.
    #[tokio::test]
    async fn a_nagle_clients_next_write_does_not_wait_for_a_delayed_ack() {
        let plain = second_write_wait(false).await;
        let acked = second_write_wait(true).await;
        eprintln!("the second write waited {plain:?} without AckNow, {acked:?} with it");
        assert!(
            plain > Duration::from_millis(20),
            "the kernel delayed no ACK ({plain:?}): this test shows nothing here"
        );
        assert!(
            acked < Duration::from_millis(10),
            "the second write waited {acked:?} (without AckNow: {plain:?})"
        );
    }
}
