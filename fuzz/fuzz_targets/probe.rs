//! UDP probes arrive from anyone: decoding must never panic, a decoded probe re-encodes to the
//! same header, its marks fields (signed or not) read and write back the same bytes, and
//! checking a MAC on any bytes must not panic either.
#![no_main]
use bloatlab_proto::auth;
use bloatlab_proto::probe::{Marks, Probe, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = auth::probe_signed(b"0123456789abcdef", data);
    if let Ok(p) = Probe::decode(data) {
        let mut buf = vec![0u8; data.len()];
        p.encode(&mut buf)
            .expect("a decoded probe fits its own length");
        assert_eq!(buf[..HEADER_LEN], data[..HEADER_LEN]);
        for signed in [false, true] {
            if let Some(m) = Marks::read(data, signed) {
                assert!(m.write(&mut buf, signed), "marks read from a packet fit it");
                // Written back canonically (an unread TOS as 0, the flags byte's two bits):
                // the same marks.
                assert_eq!(buf[HEADER_LEN], data[HEADER_LEN]);
                assert_eq!(Marks::read(&buf, signed), Some(m));
            }
        }
    }
});
