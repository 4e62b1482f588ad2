//! Control lines from a peer: one JSON message per line, bounded in length.

use bloatlab_proto::{self as proto, ServerMsg};
use std::io;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedReadHalf;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
