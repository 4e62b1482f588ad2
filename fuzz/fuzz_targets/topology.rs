//! Lab topology files (and `lab set` values) are user input: parsing any text, and computing
//! the routes of whatever parses, must never panic.
#![no_main]
use bloatlab_lab::topology::Topology;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let no_files = |_: &str| -> Result<String, String> { Err("no files while fuzzing".into()) };
    if let Ok(t) = Topology::from_toml(text, &no_files) {
        let _ = t.routes();
        for (i, l) in t.links.iter().enumerate() {
            let _ = t.addrs(i, &l.a);
        }
    }
});
