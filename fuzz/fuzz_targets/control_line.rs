//! libFuzzer's entry for `bloatlab_fuzz_cases::control_line`, where the property and its reasons are.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| bloatlab_fuzz_cases::control_line(data));
