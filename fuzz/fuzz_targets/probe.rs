//! UDP probes arrive from anyone: decoding must never panic, a decoded probe re-encodes to the
//! same header, and checking a MAC on any bytes must not panic either.
#![no_main]
use bloatlab_proto::auth;
use bloatlab_proto::probe::{Probe, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = auth::probe_signed(b"0123456789abcdef", data);
    if let Ok(p) = Probe::decode(data) {
        let mut buf = vec![0u8; data.len()];
        p.encode(&mut buf)
            .expect("a decoded probe fits its own length");
        assert_eq!(buf[..HEADER_LEN], data[..HEADER_LEN]);
    }
});
