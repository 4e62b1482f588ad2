//! A test request from anyone, through the server's validation and then the session it opens,
//! driven by the rest of the input: nothing may panic, and each flow gets one data connection.
#![no_main]
use bloatlab_proto::{decode_line, ClientMsg};
use bloatlab_server::{session::Session, validate, Config};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
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
});
