//! ICMP errors come from any router on the path (or anyone who forges one): parsing the packet
//! a raw socket reads, either family, must never panic, and what it finds must lie within it.
#![no_main]
use bloatlab_netio::icmp::parse_quoted_error;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for v6 in [false, true] {
        if let Some((_, _, _, _)) = parse_quoted_error(v6, data) {
            assert!(data.len() >= 8 + if v6 { 44 } else { 24 });
        }
    }
});
