//! Control lines come from the network on both sides: decoding must never panic, and whatever
//! decodes must survive a re-encode.
#![no_main]
use bloatlab_proto::{decode_line, encode_line, ClientMsg, ServerMsg};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = decode_line::<ClientMsg>(data) {
        let again = encode_line(&m);
        assert!(decode_line::<ClientMsg>(&again).is_ok());
    }
    if let Ok(m) = decode_line::<ServerMsg>(data) {
        let again = encode_line(&m);
        assert!(decode_line::<ServerMsg>(&again).is_ok());
    }
});
