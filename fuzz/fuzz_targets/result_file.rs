//! Result files are shared and opened by `report`, `plot` and `export`: parsing any bytes, and
//! summarising, exporting and rendering whatever parses, must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = bloatlab_result::parse(data) else {
        return;
    };
    let _ = bloatlab_analyze::summarize(&r);
    let _ = bloatlab_report::export::to_csv(&r);
    let _ = bloatlab_report::export::to_flent(&r);
    let view = bloatlab_report::view::RunView::new(&r, "fuzz");
    let _ = bloatlab_report::html::render(&[view]);
});
