//! What an HTTP client chooses that the server's own code reads: the method and path it routes
//! on, and the Host (or :authority) it puts into the config's URLs. No input may panic, and no
//! input may make the config anything but JSON whose URLs are on a plain host name. The same
//! text as a WebSocket probe message is parsed as the probe port does, and as a WebRTC offer
//! as `/rtc` answers it (str0m's SDP parser, behind the server's own checks).
#![no_main]
use bloatlab_server::web::endpoints::{authority, config_json, route};
use bloatlab_server::web::rtc::Answerer;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static ANSWERER: OnceLock<Answerer> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (method, rest) = text.split_once(' ').unwrap_or(("GET", text));
    let (path, host) = rest.split_once(' ').unwrap_or((rest, ""));
    let _ = route(method, path);
    // A WebSocket probe's text is a sequence number or nothing.
    if let Some(n) = bloatlab_server::web::ws::parse_seq(text) {
        assert!(n.to_string().len() <= text.len());
    }
    let answerer = ANSWERER.get_or_init(|| Answerer::new().expect("a DTLS certificate"));
    let local = "192.0.2.1:8081".parse().expect("an address");
    if let Ok((_, answer)) = answerer.accept(text, local, std::time::Instant::now()) {
        assert!(answer.contains("a=ice-lite"), "{answer}");
    }
    let host = authority(Some(host), "192.0.2.1:443");
    let config: serde_json::Value =
        serde_json::from_str(&config_json("https", host, Some(host))).expect("the config is JSON");
    for url in config["urls"].as_object().expect("urls").values() {
        let url = url.as_str().expect("a string");
        let h = url
            .strip_prefix("https://")
            .and_then(|u| u.split('/').next())
            .expect("https://HOST/");
        assert!(
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)),
            "{url}"
        );
    }
});
