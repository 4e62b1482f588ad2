//! autorate logs are opened by `report`: parsing any bytes, and rendering whatever reads as a
//! log, must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((header, lines)) = bloatlab_result::autorate::read_log(&String::from_utf8_lossy(data))
    {
        let _ = bloatlab_report::html::render_autorate(&header, &lines);
    }
});
