//! libFuzzer's entry for `bloatlab_fuzz_cases::autorate_log`, where the property and its reasons are.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| bloatlab_fuzz_cases::autorate_log(data));
