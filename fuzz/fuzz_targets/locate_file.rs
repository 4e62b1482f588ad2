//! Locate files are shared and opened by `report`: parsing any bytes, and rendering whatever
//! reads as a locate file, must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(Ok(l)) = bloatlab_result::locate::parse(data) {
        let _ = bloatlab_report::html::render_hops(&bloatlab_report::hops::from_locate(&l));
    }
});
