//! How much of a load a responsive sender (the server's `/large`, the RPM client's uploads)
//! holds in its own buffers: about as much as the kernel's unsent limit (5 ms of the
//! connection's delivery rate, `TCP_NOTSENT_LOWAT`), in each layer.
//!
//! TCP_NOTSENT_LOWAT alone only moved the queue up a layer: the server's HTTP/2 kept up to
//! 400 KiB per stream (hyper's default) and TLS 64 KiB (rustls's default) waiting for the
//! socket. Through a 30-packet FIFO at 20 Mbit/s shared by 12 load connections (1.5 Mbit/s
//! each), self probes then waited 520-550 ms on a path whose FIFO held 18 ms, and foreign
//! probes 120-140 ms. With one chunk in HTTP/2 and 4 KiB in TLS they took 126 ms against
//! foreign 136; but fixed 4 KiB buffers cut loopback downloads from 9-10 to 2 Gbit/s per core.
//! So every layer follows the rate: HTTP/2 is given one chunk at a time (hyper's
//! `max_send_buf_size(1)`), of `SendBudget::follow` bytes, and TLS buffers as much.
//!
//! And the kernel's limit holds only if the writer asks before each write (`UnsentLimited`):
//! Linux checks TCP_NOTSENT_LOWAT when a write needs a new buffer (`sk_stream_memory_free` in
//! `tcp_sendmsg_locked`), and appends to the last unsent one unchecked until it reaches the
//! segmentation-offload goal, up to 64 KB. Tokio writes again after every write that
//! succeeded, so each connection of `/large` held 30-65 KB unsent with a 4 KiB limit (through a
//! 20 Mbit/s line shared by 12: 150-300 ms at a connection's share).

use socket2::SockRef;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The least a layer may hold: below this, per-record and per-wakeup costs dominate.
pub const MIN: usize = 4 * 1024;
/// The most a layer may hold (5 ms at 420 Mbit/s): beyond, the kernel's own limit keeps a fast
/// connection busy, and a connection's memory stays bounded whatever rate the kernel reports.
pub const MAX: usize = 256 * 1024;

/// A connection's current allowance per layer, bytes: set before each chunk of the load from
/// the kernel's delivery rate, read by the TLS layer before each write.
#[derive(Clone)]
pub struct SendBudget(Arc<Budget>);

struct Budget {
    allowance: AtomicUsize,
    /// The unsent limit last set on the socket (0: none yet).
    lowat: AtomicU32,
}

impl Default for SendBudget {
    fn default() -> SendBudget {
        SendBudget(Arc::new(Budget {
            allowance: AtomicUsize::new(16 * 1024),
            lowat: AtomicU32::new(0),
        }))
    }
}

impl SendBudget {
    /// Before the next chunk: the socket's unsent limit set to 5 ms of its current delivery
    /// rate (at least MIN: at 1.5 Mbit/s a connection's 5 ms are 940 B, less than a segment,
    /// and downloads through a 1000-packet FIFO lost 4% of their goodput), and the allowance of
    /// the layers above as much, within MIN..=MAX. `info` is the socket's TCP_INFO, read by
    /// the caller (who may want it for more). Returns the allowance (MIN without TCP_INFO).
    pub fn follow(&self, socket: &impl AsRawFd, info: Option<&crate::TcpInfo>) -> usize {
        let Some(info) = info else { return MIN };
        let lowat = crate::unsent_budget(info.delivery_rate).max(MIN as u32);
        // The kernel's estimate moves with every ACK; the limit is set again (a system call)
        // only when it is off by more than an eighth: "about 5 ms", as the draft asks.
        let set = self.0.lowat.load(Ordering::Relaxed);
        if set.abs_diff(lowat) > set / 8 {
            let now = if crate::set_unsent_limit(socket, lowat).is_ok() {
                lowat
            } else {
                0
            };
            self.0.lowat.store(now, Ordering::Relaxed);
        }
        let b = (lowat as usize).min(MAX);
        self.0.allowance.store(b, Ordering::Relaxed);
        b
    }

    #[cfg(feature = "tls")]
    fn get(&self) -> usize {
        self.0.allowance.load(Ordering::Relaxed)
    }
}

/// A TCP stream that writes only while the kernel would wake a writer: while the socket holds
/// less than half its TCP_NOTSENT_LOWAT unsent (`tcp_poll`'s rule). So a socket holds at most
/// half its limit plus one write, which the layers above keep to their allowance.
pub struct UnsentLimited(pub TcpStream);

/// Whether the kernel takes a write on `fd` within `wait` (zero: now), by `tcp_poll`'s rule.
/// When it does not, `tcp_poll` has armed the socket's wakeup (SOCK_NOSPACE): the ACK that
/// brings the unsent data under half the limit raises the edge an event loop waits for. An
/// error or a closed socket counts as room: the write itself reports it.
pub fn unsent_room(fd: BorrowedFd<'_>, wait: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut p, 1, ms) };
    rc != 0
}

/// Ready once the kernel takes a write on `s` (`unsent_room`), for writers on a tokio socket.
pub fn poll_unsent_room(s: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
    loop {
        ready!(s.poll_write_ready(cx))?;
        // A WouldBlock from the closure clears tokio's readiness (unless an edge came since),
        // so the next poll_write_ready waits for the kernel's wakeup.
        let room = s.try_io(Interest::WRITABLE, || {
            match unsent_room(s.as_fd(), Duration::ZERO) {
                true => Ok(()),
                false => Err(io::ErrorKind::WouldBlock.into()),
            }
        });
        match room {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return Poll::Ready(r),
        }
    }
}

impl UnsentLimited {
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        send: impl Fn(&SockRef<'_>) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(poll_unsent_room(&self.0, cx))?;
            match self
                .0
                .try_io(Interest::WRITABLE, || send(&SockRef::from(&self.0)))
            {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

impl AsFd for UnsentLimited {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsyncRead for UnsentLimited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for UnsentLimited {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, |s| s.send_with_flags(buf, libc::MSG_NOSIGNAL))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_send(cx, |s| s.send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(feature = "tls")]
/// A TLS stream (client or server side) whose buffer of encrypted records is bounded.
pub trait TlsBuffer {
    fn limit_buffer(&mut self, bytes: usize);
}

#[cfg(feature = "tls")]
impl<S> TlsBuffer for tokio_rustls::server::TlsStream<S> {
    fn limit_buffer(&mut self, bytes: usize) {
        self.get_mut().1.set_buffer_limit(Some(bytes));
    }
}

#[cfg(feature = "tls")]
impl<S> TlsBuffer for tokio_rustls::client::TlsStream<S> {
    fn limit_buffer(&mut self, bytes: usize) {
        self.get_mut().1.set_buffer_limit(Some(bytes));
    }
}

#[cfg(feature = "tls")]
/// A TLS stream whose buffer of encrypted, unsent records is held to the connection's budget.
pub struct BudgetedTls<T> {
    pub tls: T,
    pub budget: SendBudget,
}

#[cfg(feature = "tls")]
impl<T: TlsBuffer + AsyncRead + AsyncWrite + Unpin> BudgetedTls<T> {
    fn limited(&mut self) -> Pin<&mut T> {
        self.tls.limit_buffer(self.budget.get());
        Pin::new(&mut self.tls)
    }
}

#[cfg(feature = "tls")]
impl<T: TlsBuffer + AsyncRead + AsyncWrite + Unpin> AsyncRead for BudgetedTls<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

#[cfg(feature = "tls")]
impl<T: TlsBuffer + AsyncRead + AsyncWrite + Unpin> AsyncWrite for BudgetedTls<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.limited().poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.limited().poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use tokio::io::AsyncWriteExt;

    /// Unsent bytes a socket holds once a writer of 4 KiB chunks must wait, its receiver reading
    /// nothing, with a 16 KiB limit: written as tokio writes, or through `UnsentLimited`.
    async fn unsent_when_writes_wait(limited: bool) -> u32 {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let _rx = l.accept().await.unwrap();
        crate::set_unsent_limit(&tx, 16 * 1024).unwrap();
        let fd = tx.as_fd().try_clone_to_owned().unwrap();
        let mut w: Box<dyn AsyncWrite + Unpin> = if limited {
            Box::new(UnsentLimited(tx))
        } else {
            Box::new(tx)
        };
        // The receiver's window fills first (data sent, not unsent), then the socket's queue.
        for _ in 0..10_000 {
            match tokio::time::timeout(std::time::Duration::from_millis(300), w.write(&[7u8; 4096]))
                .await
            {
                Ok(written) => assert!(written.unwrap() > 0),
                Err(_) => return crate::tcp_info(&fd).unwrap().notsent_bytes,
            }
        }
        panic!("40 MB taken by a socket whose receiver reads nothing");
    }

    /// The kernel alone lets writes run on into its last buffer (here past 16 KiB + a write);
    /// asked first, it holds at most half its limit plus one write (`tcp_poll`'s rule).
    #[tokio::test]
    async fn a_limited_stream_writes_only_under_the_kernels_unsent_limit() {
        let (plain, limited) = (
            unsent_when_writes_wait(false).await,
            unsent_when_writes_wait(true).await,
        );
        eprintln!("unsent when writes wait: {plain} B plainly, {limited} B limited");
        assert!(limited <= 8 * 1024 + 4096, "limited: {limited} B unsent");
        assert!(
            plain > 16 * 1024 + 4096,
            "plain writes: {plain} B unsent (the kernel checks its limit before each write now?)"
        );
    }

    fn unsent_limit(s: &std::net::TcpStream) -> u32 {
        let (mut v, mut len) = (0u32, std::mem::size_of::<u32>() as libc::socklen_t);
        // SAFETY: a u32 out-value of the right size for TCP_NOTSENT_LOWAT.
        let rc = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                &mut v as *mut u32 as *mut libc::c_void,
                &mut len,
            )
        };
        assert_eq!(rc, 0);
        v
    }

    /// The kernel's limit is 5 ms of the delivery rate but at least MIN; the layers above get
    /// as much, at most MAX. Loopback moves gigabits, so after 64 MiB the budget is MAX while
    /// the kernel's limit is larger.
    #[test]
    fn follow_sets_the_kernels_limit_and_bounds_the_layers_above() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        let budget = SendBudget::default();
        assert_eq!(budget.get(), 16 * 1024, "before any rate");
        let sink =
            std::thread::spawn(move || std::io::copy(&mut rx, &mut std::io::sink()).unwrap());
        let chunk = vec![7u8; 1 << 20];
        for _ in 0..64 {
            tx.write_all(&chunk).unwrap();
        }
        let info = crate::tcp_info(&tx).unwrap();
        let rate = info.delivery_rate;
        let b = budget.follow(&tx, Some(&info));
        let lowat = unsent_limit(&tx);
        assert!(
            lowat >= MIN as u32 && lowat as u64 >= rate / 200 / 2,
            "limit {lowat} B at {rate} B/s"
        );
        assert_eq!(b, (lowat as usize).min(MAX));
        assert_eq!(budget.get(), b);
        assert_eq!(b, MAX, "loopback at {rate} B/s");
        // The limit is set again only when the rate moves it by more than an eighth (one system
        // call less per chunk); the allowance follows every change.
        crate::set_unsent_limit(&tx, 12345).unwrap();
        budget.follow(&tx, Some(&info));
        assert_eq!(unsent_limit(&tx), 12345, "the same rate: not set again");
        let slower = crate::TcpInfo {
            delivery_rate: 1_000_000,
            ..info
        };
        assert_eq!(budget.follow(&tx, Some(&slower)), 5000, "5 ms of 8 Mbit/s");
        assert_eq!(unsent_limit(&tx), 5000);
        let a_little_faster = crate::TcpInfo {
            delivery_rate: 1_100_000,
            ..info
        };
        assert_eq!(budget.follow(&tx, Some(&a_little_faster)), 5500);
        assert_eq!(unsent_limit(&tx), 5000, "10% off: left as it is");
        let faster = crate::TcpInfo {
            delivery_rate: 1_200_000,
            ..info
        };
        budget.follow(&tx, Some(&faster));
        assert_eq!(unsent_limit(&tx), 6000, "20% off: set again");
        assert_eq!(budget.follow(&tx, None), MIN, "no TCP_INFO: the least");
        drop(tx);
        assert_eq!(sink.join().unwrap(), 64 << 20);
    }
}
