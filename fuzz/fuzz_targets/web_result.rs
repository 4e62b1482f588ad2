//! The browser test's result upload (`POST /web/result`): any bytes either fail to parse or
//! validate, or become a summarized result file whose only text from the page (the browser's
//! name) is in the safe alphabet. No input may panic.
#![no_main]
use bloatlab_server::web::results::{result_file, safe_browser, validate, Upload};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(upload) = serde_json::from_slice::<Upload>(data) else {
        return;
    };
    if validate(&upload).is_err() {
        return;
    }
    let browser = upload.browser.clone();
    let r = result_file(
        upload,
        "192.0.2.1".parse().unwrap(),
        Default::default(),
        String::new(),
    );
    assert_eq!(r.metadata.client.software, safe_browser(&browser));
    assert!(r
        .metadata
        .client
        .software
        .chars()
        .all(|c| c.is_ascii_alphanumeric()
            || " \
        ./;,()_:-"
                .contains(c)));
    assert!(r.summary.is_some());
    serde_json::to_string(&r).expect("a result file serializes");
});
