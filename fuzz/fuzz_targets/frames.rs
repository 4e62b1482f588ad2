//! The frame decoder sees arbitrary bytes split at arbitrary points: it must never panic, and
//! the split must not change what it reports.
#![no_main]
use bloatlab_proto::frame::{Decoder, Event};
use libfuzzer_sys::fuzz_target;

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

/// Data events merged, so that only the byte count matters, not where reads split it.
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

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let split = data[0] as usize % data.len();
    let body = &data[1..];
    let split = split.min(body.len());
    let (whole, ok_whole) = decode(&[body]);
    let (parts, ok_parts) = decode(&[&body[..split], &body[split..]]);
    assert_eq!(ok_whole, ok_parts);
    if ok_whole {
        assert_eq!(normalized(whole), normalized(parts));
    }
});
