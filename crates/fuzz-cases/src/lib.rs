//! Every parser of untrusted input, and what must hold for whatever bytes reach it: one function
//! per fuzz target, which panics where the property fails. `fuzz/fuzz_targets/` hands them to
//! libFuzzer (`scripts/fuzz.sh`, the search); this crate's tests hand them their seeds
//! (`fuzz/seeds/TARGET/`) and a fixed sequence of mutations of those (CI's short check of the
//! same properties, on the stable toolchain in the workspace's one build).

use std::io::{BufReader, Read};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A case: panics where its property fails for `data`.
pub type Case = fn(data: &[u8]);

/// Each case by its fuzz target's name (`fuzz/fuzz_targets/NAME.rs`).
pub const CASES: &[(&str, Case)] = &[
    ("autorate_log", autorate_log),
    ("control_line", control_line),
    ("frames", frames),
    ("gso", gso),
    ("line_reader", line_reader),
    ("locate_file", locate_file),
    ("probe", probe),
    ("quoted_error", quoted_error),
    ("request", request),
    ("result_file", result_file),
    ("topology", topology),
    ("web_request", web_request),
    ("web_result", web_result),
];

/// autorate logs are opened by `report`: parsing any bytes, and rendering whatever reads as a
/// log, must never panic.
pub fn autorate_log(data: &[u8]) {
    if let Ok((header, lines)) = bloatlab_result::autorate::read_log(&String::from_utf8_lossy(data))
    {
        let _ = bloatlab_report::html::render_autorate(&header, &lines);
    }
}

/// Control lines come from the network on both sides: decoding must never panic, and whatever
/// decodes must survive a re-encode.
pub fn control_line(data: &[u8]) {
    use bloatlab_proto::{decode_line, encode_line, ClientMsg, ServerMsg};
    if let Ok(m) = decode_line::<ClientMsg>(data) {
        let again = encode_line(&m);
        assert!(decode_line::<ClientMsg>(&again).is_ok());
    }
    if let Ok(m) = decode_line::<ServerMsg>(data) {
        let again = encode_line(&m);
        assert!(decode_line::<ServerMsg>(&again).is_ok());
    }
}

/// The frame decoder sees arbitrary bytes split at arbitrary points (the first byte picks the
/// split): it must never panic, and the split must not change what it reports.
pub fn frames(data: &[u8]) {
    use bloatlab_proto::frame::{Decoder, Event};
    fn decode(chunks: &[&[u8]]) -> (Vec<Event>, bool) {
        let mut d = Decoder::new();
        let mut events = Vec::new();
        for c in chunks {
            if d.feed(c, |e| events.push(e)).is_err() {
                return (events, false);
            }
        }
        (events, true)
    }
    // Data events merged, so that only the byte count matters, not where reads split it.
    fn normalized(events: Vec<Event>) -> Vec<Event> {
        let mut out: Vec<Event> = Vec::new();
        for e in events {
            match (out.last_mut(), e) {
                (Some(Event::Data(a)), Event::Data(b)) => *a += b,
                (_, e) => out.push(e),
            }
        }
        out
    }
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let split = (first as usize % data.len()).min(body.len());
    let (whole, ok_whole) = decode(&[body]);
    let (parts, ok_parts) = decode(&[&body[..split], &body[split..]]);
    assert_eq!(ok_whole, ok_parts);
    if ok_whole {
        assert_eq!(normalized(whole), normalized(parts));
    }
}

/// What a TUN device hands the lab: a virtio-net header and a packet, shaped by the sending
/// namespace's kernel and by whatever its processes put in their packets. Splitting it into
/// wire segments and merging those back must never panic, and must keep every payload byte.
pub fn gso(data: &[u8]) {
    use bloatlab_lab_model::gso::{coalesce, split};
    use bloatlab_lab_model::vnet::{VnetHdr, VNET_HDR_LEN};
    let Some((hdr, packet)) = data.split_first_chunk::<VNET_HDR_LEN>() else {
        return;
    };
    let vnet = VnetHdr::from_bytes(hdr);
    let Some(segments) = split(&vnet, Arc::new(packet.to_vec()), 1) else {
        return;
    };
    let payload: usize = segments.iter().map(|p| p.len() - p.data.len()).sum();
    let written: usize = coalesce(segments)
        .iter()
        .map(|w| w.payload.as_ref().map_or(0, |(_, r)| r.len()))
        .sum();
    assert_eq!(payload, written);
}

/// Control lines reach the client through its line reader in whatever pieces TCP delivers
/// (the first byte and up to 8 after it pick the pieces' sizes): reading must never panic,
/// never hold more than the limit, and the pieces must not change what is read.
pub fn line_reader(data: &[u8]) {
    const MAX: usize = 256;
    // Hands out `data` in pieces whose sizes cycle through `sizes` (at least 1 byte).
    struct Pieces<'a> {
        data: &'a [u8],
        sizes: &'a [u8],
        i: usize,
    }
    impl Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let want = self
                .sizes
                .get(self.i % self.sizes.len().max(1))
                .map_or(usize::MAX, |&s| usize::from(s).max(1));
            self.i += 1;
            let n = want.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }
    type Lines = Vec<Result<Vec<u8>, std::io::ErrorKind>>;
    fn lines(data: &[u8], sizes: &[u8]) -> Lines {
        let mut r = BufReader::with_capacity(64, Pieces { data, sizes, i: 0 });
        let mut out = Vec::new();
        loop {
            match bloatlab_netio::read_line(&mut r, MAX) {
                Ok(Some(l)) => {
                    assert!(l.len() <= MAX, "a line of {} bytes got through", l.len());
                    out.push(Ok(l));
                }
                Ok(None) => return out,
                Err(e) => {
                    out.push(Err(e.kind()));
                    return out;
                }
            }
        }
    }
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (sizes, body) = rest.split_at(usize::from(n).min(rest.len()).min(8));
    let whole = lines(body, &[]);
    let pieces = lines(body, sizes);
    // Over-long lines may be detected at different points, but only as errors.
    let ok = |v: &Lines| {
        v.iter()
            .take_while(|l| l.is_ok())
            .cloned()
            .collect::<Vec<_>>()
    };
    if whole.iter().all(|l| l.is_ok()) && pieces.iter().all(|l| l.is_ok()) {
        assert_eq!(whole, pieces);
    } else {
        let (a, b) = (ok(&whole), ok(&pieces));
        let common = a.len().min(b.len());
        assert_eq!(a[..common], b[..common]);
    }
}

/// Locate files are shared and opened by `report`: parsing any bytes, and rendering whatever
/// reads as a locate file, must never panic.
pub fn locate_file(data: &[u8]) {
    if let Some(Ok(l)) = bloatlab_result::locate::parse(data) {
        let _ = bloatlab_report::html::render_hops(&bloatlab_report::hops::from_locate(&l));
    }
}

/// UDP probes arrive from anyone: decoding must never panic, a decoded probe re-encodes to the
/// same header, its marks fields (signed or not) read and write back the same bytes, and
/// checking a MAC on any bytes must not panic either.
pub fn probe(data: &[u8]) {
    use bloatlab_proto::auth;
    use bloatlab_proto::probe::{Marks, Probe, HEADER_LEN};
    let _ = auth::probe_signed(b"0123456789abcdef", data);
    if let Ok(p) = Probe::decode(data) {
        let mut buf = vec![0u8; data.len()];
        p.encode(&mut buf)
            .expect("a decoded probe fits its own length");
        assert_eq!(buf[..HEADER_LEN], data[..HEADER_LEN]);
        for signed in [false, true] {
            if let Some(m) = Marks::read(data, signed) {
                assert!(m.write(&mut buf, signed), "marks read from a packet fit it");
                // Written back canonically (an unread TOS as 0, the flags byte's two bits):
                // the same marks.
                assert_eq!(buf[HEADER_LEN], data[HEADER_LEN]);
                assert_eq!(Marks::read(&buf, signed), Some(m));
            }
        }
    }
}

/// ICMP errors come from any router on the path (or anyone who forges one): parsing the packet
/// a raw socket reads, either family, must never panic, and what it finds must lie within it.
pub fn quoted_error(data: &[u8]) {
    for v6 in [false, true] {
        if bloatlab_netio::icmp::parse_quoted_error(v6, data).is_some() {
            assert!(data.len() >= 8 + if v6 { 44 } else { 24 });
        }
    }
}

/// A test request from anyone (the first line), through the server's validation and then the
/// session it opens, driven by the rest of the input three bytes at a time: nothing may
/// panic, and each flow gets one data connection.
pub fn request(data: &[u8]) {
    use bloatlab_proto::{decode_line, ClientMsg};
    use bloatlab_server::{session::Session, validate, Config};
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(ClientMsg::Test(req)) = decode_line::<ClientMsg>(&data[..split]) else {
        return;
    };
    let cfg = Config {
        max_rate_bytes: Some(1e6),
        ..Config::default()
    };
    if validate(&req, &cfg).is_err() {
        return;
    }
    let s = Session::new(
        "127.0.0.1".parse().unwrap(),
        Instant::now() + Duration::from_secs(1),
        req,
        cfg.max_rate_bytes,
    );
    let mut claimed = std::collections::HashSet::new();
    for op in data[split..].chunks(3) {
        match op {
            [0, a, b] => {
                let id = u16::from_be_bytes([*a, *b]);
                if s.claim_flow(id, None).is_ok() {
                    assert!(claimed.insert(id), "flow {id} got a second data connection");
                }
            }
            [1, ..] => {
                let _ = s.admit_conn_probe();
            }
            [2, a, b] => {
                let _ = s.pace(usize::from(u16::from_be_bytes([*a, *b])) * 64);
            }
            _ => {
                let _ = s.report();
            }
        }
    }
}

/// Result files are shared and opened by `report`, `plot` and `export`: parsing any bytes, and
/// summarising, exporting and rendering whatever parses, must never panic.
pub fn result_file(data: &[u8]) {
    let Ok(r) = bloatlab_result::parse(data) else {
        return;
    };
    let _ = bloatlab_analyze::summarize(&r);
    let _ = bloatlab_report::export::to_csv(&r);
    let _ = bloatlab_report::export::to_flent(&r);
    let view = bloatlab_report::view::RunView::new(&r, "fuzz");
    let _ = bloatlab_report::html::render(&[view]);
}

/// Lab topology files (and `lab set` values) are user input: parsing any text, and computing
/// the routes of whatever parses, must never panic.
pub fn topology(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let no_files = |_: &str| -> Result<String, String> { Err("no files while fuzzing".into()) };
    if let Ok(t) = bloatlab_lab::topology::Topology::from_toml(text, &no_files) {
        let _ = t.routes();
        for (i, l) in t.links.iter().enumerate() {
            let _ = t.addrs(i, &l.a);
        }
    }
}

/// What an HTTP client chooses that the server's own code reads: the method and path it routes
/// on, and the Host (or :authority) it puts into the config's URLs. No input may panic, and no
/// input may make the config anything but JSON whose URLs are on a plain host name. The same
/// text as a WebSocket probe message is parsed as the probe port does, and as a WebRTC offer
/// as `/rtc` answers it (str0m's SDP parser, behind the server's own checks).
pub fn web_request(data: &[u8]) {
    use bloatlab_server::web::endpoints::{authority, config_json, route};
    use bloatlab_server::web::rtc::Answerer;
    static ANSWERER: OnceLock<Answerer> = OnceLock::new();
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
    if let Ok((_, answer)) = answerer.accept(text, local, Instant::now()) {
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
}

/// The browser test's result upload (`POST /web/result`): any bytes either fail to parse or
/// validate, or become a summarized result file whose only text from the page (the browser's
/// name) is in the safe alphabet. No input may panic.
pub fn web_result(data: &[u8]) {
    use bloatlab_server::web::results::{result_file, safe_browser, validate, Upload};
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
    let safe = |c: char| c.is_ascii_alphanumeric() || " ./;,()_:-".contains(c);
    assert!(r.metadata.client.software.chars().all(safe));
    assert!(r.summary.is_some());
    serde_json::to_string(&r).expect("a result file serializes");
}

#[cfg(test)]
mod tests;
