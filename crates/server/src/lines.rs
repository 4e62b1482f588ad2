//! Control lines from a peer: one JSON message per line, bounded in length.

use bloatlab_proto::{self as proto, ServerMsg};
use std::io;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;
use tokio::time::timeout;

/// A connection's read half as the faces read it: buffered, for lines and frames.
pub(crate) type Reader = BufReader<OwnedReadHalf>;

/// Reads one `\n`-terminated line of at most `max` bytes: `Ok(None)` at a clean end of stream,
/// an error for an over-long line (the peer does not speak the protocol). Memory is bounded by
/// `max` whatever the peer sends; the time it may take is the caller's deadline.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return if line.is_empty() {
                Ok(None)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-line",
                ))
            };
        }
        let (chunk, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], Some(i + 1)),
            None => (buf, None),
        };
        // Checked before copying: memory stays within `max` whatever the peer sends.
        if line.len() + chunk.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        line.extend_from_slice(chunk);
        let used = end.unwrap_or(chunk.len());
        r.consume(used);
        if end.is_some() {
            return Ok(Some(line));
        }
    }
}

pub async fn send<W: AsyncWrite + Unpin>(w: &mut W, msg: &ServerMsg) -> io::Result<()> {
    w.write_all(&proto::encode_line(msg)).await
}

/// Sends `msg` for as long as the peer keeps taking it: each 16 kB within `stall`, all within
/// `total`. A 10-minute test's report is a megabyte or two, seconds on a slow download; a peer
/// that stops reading is let go after `stall`.
pub async fn send_while_taken<W: AsyncWrite + Unpin>(
    w: &mut W,
    msg: &ServerMsg,
    stall: Duration,
    total: Duration,
) -> io::Result<()> {
    let line = proto::encode_line(msg);
    let all = async {
        for chunk in line.chunks(16 * 1024) {
            timeout(stall, w.write_all(chunk)).await??;
        }
        w.flush().await
    };
    timeout(total, all).await?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn lines_are_read_whole_across_chunks_and_bounded() {
        // The peer's bytes arrive one at a time.
        let (mut a, b) = tokio::io::duplex(1);
        tokio::spawn(async move {
            for c in b"{\"x\":1}\nrest".iter() {
                let _ = a.write_all(&[*c]).await;
            }
        });
        let mut r = tokio::io::BufReader::new(b);
        assert_eq!(read_line(&mut r, 100).await.unwrap().unwrap(), b"{\"x\":1}");
        assert!(read_line(&mut r, 100).await.is_err(), "closed mid-line");
        let long = vec![b'a'; 5000];
        let mut r = tokio::io::BufReader::new(&long[..]);
        assert_eq!(
            read_line(&mut r, 1000).await.unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        let mut r = tokio::io::BufReader::new(&b""[..]);
        assert!(read_line(&mut r, 10).await.unwrap().is_none());
    }

    /// A 200 kB message to a client that takes 4 kB every 30 ms (1.5 s in all) with a stall
    /// limit of 300 ms: sent whole, where one deadline of that length would have cut it; to a
    /// client that stops reading half-way, given up a stall limit later.
    #[tokio::test]
    async fn a_long_message_is_sent_while_taken_and_dropped_when_not() {
        let msg = ServerMsg::Refused {
            reason: proto::RefuseReason::Limit,
            message: "x".repeat(200 * 1024),
        };
        let want = proto::encode_line(&msg).len();
        for stop_after in [usize::MAX, want / 2] {
            let (mut a, mut b) = tokio::io::duplex(4096);
            let reader = tokio::spawn(async move {
                let mut got = 0;
                let mut buf = vec![0; 4096];
                while got < stop_after {
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    match b.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                if got >= stop_after {
                    // Held open: a client that stops reading has not left.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
                got
            });
            let t = std::time::Instant::now();
            let stall = Duration::from_millis(300);
            let sent = send_while_taken(&mut a, &msg, stall, Duration::from_secs(10)).await;
            let took = t.elapsed();
            if stop_after == usize::MAX {
                sent.expect("sent whole");
                assert!(took >= Duration::from_millis(1200), "{took:?}");
                drop(a);
                assert_eq!(reader.await.unwrap(), want);
            } else {
                assert_eq!(sent.unwrap_err().kind(), io::ErrorKind::TimedOut);
                assert!(took < Duration::from_secs(3), "{took:?}");
            }
        }
    }
}
