//! Bytes per bucket of time since a first event: the burst profile of a UDP load, kept by its
//! sender and by the server alike. Pure: the caller gives every time.

/// Counts bytes into fixed-width time buckets, the first starting at the first event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets {
    bucket_ns: u64,
    first_ns: Option<u64>,
    bytes: Vec<u32>,
    /// Most buckets kept: memory is bounded whatever the times given.
    max: usize,
    /// Events past the last bucket kept (not counted in any bucket).
    pub beyond: u64,
}

impl Buckets {
    pub fn new(bucket_ns: u64, max: usize) -> Buckets {
        Buckets {
            bucket_ns: bucket_ns.max(1),
            first_ns: None,
            bytes: Vec::new(),
            max,
            beyond: 0,
        }
    }

    /// `bytes` at `t_ns`; a time before the first event counts in the first bucket.
    pub fn add(&mut self, t_ns: u64, bytes: u32) {
        let first = *self.first_ns.get_or_insert(t_ns);
        let i = (t_ns.saturating_sub(first) / self.bucket_ns) as usize;
        if i >= self.max {
            self.beyond += 1;
            return;
        }
        if i >= self.bytes.len() {
            self.bytes.resize(i + 1, 0);
        }
        self.bytes[i] = self.bytes[i].saturating_add(bytes);
    }

    pub fn first_ns(&self) -> Option<u64> {
        self.first_ns
    }

    pub fn bucket_ns(&self) -> u64 {
        self.bucket_ns
    }

    /// Bytes per bucket, from the first event's bucket to the last event's.
    pub fn bytes(&self) -> &[u32] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_land_in_the_bucket_of_their_time_from_the_first() {
        let mut b = Buckets::new(1_000_000, 4);
        b.add(5_000_000, 100);
        b.add(5_999_999, 50);
        b.add(7_000_000, 10);
        b.add(4_000_000, 1);
        assert_eq!(b.bytes(), [151, 0, 10]);
        assert_eq!(b.first_ns(), Some(5_000_000));
        b.add(9_000_000, 7);
        assert_eq!(
            (b.bytes().len(), b.beyond),
            (3, 1),
            "the fifth bucket is past the bound of four"
        );
    }
}
