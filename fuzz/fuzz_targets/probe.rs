//! UDP probes arrive from anyone: decoding must never panic, and a decoded probe re-encodes to
//! the same header (byte 5 is reserved: ignored on decode, written as zero).
#![no_main]
use bloatlab_proto::probe::{Probe, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Probe::decode(data) {
        let mut buf = vec![0u8; data.len()];
        p.encode(&mut buf).expect("a decoded probe fits its own length");
        assert_eq!(buf[..5], data[..5]);
        assert_eq!(buf[6..HEADER_LEN], data[6..HEADER_LEN]);
    }
});
