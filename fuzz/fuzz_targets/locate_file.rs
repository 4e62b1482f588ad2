//! Locate files are shared and opened by `report`: parsing any bytes, and rendering whatever
//! reads as a locate file, must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Some(Ok(view)) = bloatlab_report::hops::from_json(&v) {
        let _ = bloatlab_report::html::render_hops(&view);
    }
});
