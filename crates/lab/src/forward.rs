//! One thread per link direction: read packets from the sending host's TUN, run them through
//! the link model, write them into the receiving host's TUN when the model says they arrive.

use crate::tun::{read_packet, wait_readable, write_packet};
use bloatlab_lab_model::Direction;
use bloatlab_netio::mono_ns;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Reads per wake-up before the thread turns to its due packets, so a flood cannot starve
/// the output side.
const READ_BATCH: usize = 64;
/// Longest sleep while idle: how soon a stop request is noticed.
const IDLE_WAIT_NS: u64 = 50_000_000;

pub fn spawn(name: String, from: RawFd, to: RawFd, model: Arc<Mutex<Direction>>, stop: Arc<AtomicBool>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name).spawn(move || {
        // Without this nanosleep-style waits wake ~50 us late (see the TUN reference notes).
        // SAFETY: prctl with plain integer arguments.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
        // Real-time priority: a link must release packets when they are due, not when the
        // scheduler gets round to it behind the TCP stacks it carries. A late wake-up sends a
        // burst, and a burst into a link only 5% faster lingers there for hundreds of ms: a
        // queue the emulator made up. (Without the privilege the thread stays as it is.)
        let param = libc::sched_param { sched_priority: 10 };
        // SAFETY: this thread's own scheduling policy, valid parameters.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let mut reads = 0;
            let mut dir = model.lock().unwrap_or_else(|e| e.into_inner());
            while reads < READ_BATCH {
                match read_packet(from, &mut buf) {
                    Ok(Some(n)) => {
                        dir.arrive(buf[..n].to_vec(), mono_ns());
                        reads += 1;
                    }
                    Ok(None) => break,
                    // The device went away (namespace deleted): the lab is shutting down.
                    Err(_) => return,
                }
            }
            let now = mono_ns();
            while let Some(p) = dir.poll(now) {
                // A write fails only when the receiving device is gone or down; the packet is
                // then lost as on a real unplugged link.
                let _ = write_packet(to, &p);
            }
            let wait = dir.next_wakeup().map_or(IDLE_WAIT_NS, |t| t.saturating_sub(mono_ns()).min(IDLE_WAIT_NS));
            drop(dir);
            if reads < READ_BATCH && wait > 0 {
                wait_readable(from, wait);
            }
        }
    })
}
