//! What each path answers, decided from the request alone (pure): the responsiveness config with
//! URLs on the host the client asked for, and which endpoint a method and path reach.

/// The endpoints of draft-ietf-ippm-responsiveness, as goserver and nginx set-ups name them.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    Config,
    Small,
    Large,
    Slurp,
    /// The browser test: its page, script, probe worker, settings and result upload.
    Page,
    PageScript,
    ProbeWorker,
    PageConfig,
    PageResult,
    /// The page's WebRTC offer for its probes.
    RtcOffer,
    NotFound,
    MethodNotAllowed,
}

pub fn route(method: &str, path: &str) -> Route {
    let read = matches!(method, "GET" | "HEAD");
    match path {
        "/.well-known/nq" | "/config" if read => Route::Config,
        "/small" if read => Route::Small,
        "/large" if read => Route::Large,
        "/slurp" if matches!(method, "POST" | "PUT") => Route::Slurp,
        "/" | "/index.html" if read => Route::Page,
        "/page.js" if read => Route::PageScript,
        "/probe-worker.js" if read => Route::ProbeWorker,
        "/web/config" if read => Route::PageConfig,
        "/web/result" if method == "POST" => Route::PageResult,
        "/rtc" if method == "POST" => Route::RtcOffer,
        "/.well-known/nq" | "/config" | "/small" | "/large" | "/slurp" | "/" | "/index.html"
        | "/page.js" | "/probe-worker.js" | "/web/config" | "/web/result" | "/rtc" => {
            Route::MethodNotAllowed
        }
        _ => Route::NotFound,
    }
}

/// The host (and port) the client named, if it is a plain host name or address: it goes into
/// the URLs the config returns, so anything else (quotes, slashes, user info, control bytes)
/// is replaced by the address the connection came in on.
pub fn authority<'a>(asked: Option<&'a str>, local: &'a str) -> &'a str {
    match asked {
        Some(a)
            if !a.is_empty()
                && a.len() <= 255
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)) =>
        {
            a
        }
        _ => local,
    }
}

/// The config: the draft's URL keys and the older `*_https_*` keys every deployed client still
/// reads (Cloudflare's `mach` requires all six), and `test_endpoint` when the server has one.
pub fn config_json(scheme: &str, authority: &str, test_endpoint: Option<&str>) -> String {
    let url = |path: &str| format!("{scheme}://{authority}/{path}");
    let mut urls = serde_json::Map::new();
    for (keys, path) in [
        (["small_download_url", "small_https_download_url"], "small"),
        (["large_download_url", "large_https_download_url"], "large"),
        (["upload_url", "https_upload_url"], "slurp"),
    ] {
        for k in keys {
            urls.insert(k.into(), url(path).into());
        }
    }
    let mut c = serde_json::json!({ "version": 1, "urls": urls });
    if let Some(t) = test_endpoint {
        c["test_endpoint"] = t.into();
    }
    c.to_string()
}

/// What the page needs to run: the probe port, the phase lengths (the CLI's: 5 s idle, 30 s per
/// load phase; the page's URL may shorten them), streams per direction, sampling and probing,
/// and whether the probes may run over WebRTC (`rtc`).
pub fn page_config_json(ws_port: Option<u16>, rtc: bool, idle: f64, length: f64) -> String {
    serde_json::json!({
        "ws_port": ws_port,
        "rtc": rtc,
        "idle": idle,
        "length": length,
        "streams": 4,
        "step": 0.1,
        "probe_ms": 50,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_methods_reach_their_endpoints() {
        assert_eq!(route("GET", "/.well-known/nq"), Route::Config);
        assert_eq!(route("HEAD", "/config"), Route::Config);
        assert_eq!(route("GET", "/small"), Route::Small);
        assert_eq!(route("GET", "/large"), Route::Large);
        assert_eq!(route("POST", "/slurp"), Route::Slurp);
        assert_eq!(route("POST", "/large"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/slurp"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/etc/passwd"), Route::NotFound);
        assert_eq!(route("GET", "/"), Route::Page);
        assert_eq!(route("GET", "/web/config"), Route::PageConfig);
        assert_eq!(route("POST", "/web/result"), Route::PageResult);
        assert_eq!(route("POST", "/rtc"), Route::RtcOffer);
        assert_eq!(route("GET", "/rtc"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/web/result"), Route::MethodNotAllowed);
        assert_eq!(route("GET", "/page.js/../../x"), Route::NotFound);
    }

    #[test]
    fn the_config_has_both_key_sets_on_the_asked_host_and_nothing_hostile() {
        let c: serde_json::Value = serde_json::from_str(&config_json(
            "https",
            authority(Some("rpm.example:4043"), "192.0.2.1:4043"),
            None,
        ))
        .unwrap();
        assert_eq!(c["version"], 1);
        for (k, path) in [
            ("small_download_url", "small"),
            ("small_https_download_url", "small"),
            ("large_download_url", "large"),
            ("large_https_download_url", "large"),
            ("upload_url", "slurp"),
            ("https_upload_url", "slurp"),
        ] {
            assert_eq!(
                c["urls"][k],
                format!("https://rpm.example:4043/{path}"),
                "{k}"
            );
        }
        assert!(c.get("test_endpoint").is_none());
        for bad in [
            "evil.example/\"><script>",
            "user@host",
            "a b",
            "",
            "\u{1b}[31m",
        ] {
            assert_eq!(
                authority(Some(bad), "[2001:db8::1]:443"),
                "[2001:db8::1]:443",
                "{bad:?}"
            );
        }
        let c: serde_json::Value =
            serde_json::from_str(&config_json("http", "h", Some("10.0.0.9"))).unwrap();
        assert_eq!(
            (
                c["test_endpoint"].as_str(),
                c["urls"]["upload_url"].as_str()
            ),
            (Some("10.0.0.9"), Some("http://h/slurp"))
        );
    }
}
