//! The benchmark's yardstick: the plainest forwarder between two namespaces, with no link model.
//! Two threads, each a blocking read -> write loop between two TUN devices, with or without
//! super-packets (`--offload`). `scripts/bench-lab.sh` runs iperf3 through it beside the lab.
//!
//!   tun_copy NS_A NS_B [--offload]     (namespaces made by the caller; addresses 10.78.0.1/.2)

use bloatlab_lab::ns::ip;
use bloatlab_lab::tun::{read_packet, wait_readable, write_packet, Tun, READ_BUF};
use bloatlab_lab_model::gso::Write;
use std::os::fd::RawFd;

fn copy(from: RawFd, to: RawFd, offload: bool) {
    let mut buf = Vec::with_capacity(READ_BUF);
    loop {
        match read_packet(from, offload, &mut buf) {
            Ok(Some(vnet)) => {
                let w = Write {
                    vnet,
                    head: std::mem::take(&mut buf),
                    payload: None,
                };
                let _ = write_packet(to, offload, &w);
                buf = w.head;
            }
            Ok(None) => wait_readable(from, 1_000_000_000),
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let offload = args.iter().any(|a| a == "--offload");
    let ns: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let [a, b] = ns[..] else {
        return Err("usage: tun_copy NS_A NS_B [--offload]".into());
    };
    let pid = std::process::id();
    let mut tuns = Vec::new();
    for (i, n) in [a, b].into_iter().enumerate() {
        let name = format!("blc{pid}{i}");
        let t = Tun::create(&name, offload).map_err(|e| format!("{name}: {e}"))?;
        ip(&["link", "set", "dev", &name, "netns", n])?;
        ip(&[
            "-n",
            n,
            "link",
            "set",
            "dev",
            &name,
            "txqueuelen",
            "256",
            "up",
        ])?;
        ip(&[
            "-n",
            n,
            "addr",
            "add",
            &format!("10.78.0.{}/24", i + 1),
            "dev",
            &name,
        ])?;
        tuns.push(t);
    }
    let (x, y) = (tuns[0].raw(), tuns[1].raw());
    let back = std::thread::spawn(move || copy(y, x, offload));
    println!("ready");
    copy(x, y, offload);
    back.join().map_err(|_| "copy thread panicked".to_string())
}
