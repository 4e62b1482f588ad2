//! Control lines reach the client through its line reader in whatever pieces TCP delivers:
//! reading must never panic, never hold more than the limit, and the pieces must not change
//! what is read.
#![no_main]
use bloatlab_netio::read_line;
use libfuzzer_sys::fuzz_target;
use std::io::{BufReader, Read};

/// Hands out `data` in pieces whose sizes cycle through `sizes` (at least 1 byte).
struct Pieces<'a> {
    data: &'a [u8],
    sizes: &'a [u8],
    i: usize,
}

impl Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = self
            .sizes
            .get(self.i % self.sizes.len().max(1))
            .map_or(usize::MAX, |&s| usize::from(s).max(1));
        self.i += 1;
        let n = want.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

const MAX: usize = 256;

fn lines(data: &[u8], sizes: &[u8]) -> Vec<Result<Vec<u8>, std::io::ErrorKind>> {
    let mut r = BufReader::with_capacity(64, Pieces { data, sizes, i: 0 });
    let mut out = Vec::new();
    loop {
        match read_line(&mut r, MAX) {
            Ok(Some(l)) => {
                assert!(l.len() <= MAX, "a line of {} bytes got through", l.len());
                out.push(Ok(l));
            }
            Ok(None) => return out,
            Err(e) => {
                out.push(Err(e.kind()));
                return out;
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (sizes, body) = rest.split_at(usize::from(n).min(rest.len()).min(8));
    let whole = lines(body, &[]);
    let pieces = lines(body, sizes);
    // Over-long lines may be detected at different points, but only as errors.
    let ok = |v: &Vec<Result<Vec<u8>, std::io::ErrorKind>>| {
        v.iter()
            .take_while(|l| l.is_ok())
            .cloned()
            .collect::<Vec<_>>()
    };
    if whole.iter().all(|l| l.is_ok()) && pieces.iter().all(|l| l.is_ok()) {
        assert_eq!(whole, pieces);
    } else {
        let (a, b) = (ok(&whole), ok(&pieces));
        let common = a.len().min(b.len());
        assert_eq!(a[..common], b[..common]);
    }
});
