//! One thread per link direction: read packets from the sending host's TUN, run them through
//! the link model, write them into the receiving host's TUN when the model says they arrive.
//! With offloads a read may be a super-packet: the model gets its wire segments, and segments
//! that leave together unchanged are written back as one (`gso`).

use crate::tun::{read_packet, wait_readable, write_packet, READ_BUF};
use bloatlab_lab_model::gso;
use bloatlab_lab_model::slow_icmp::SlowIcmp;
use bloatlab_lab_model::vnet::VnetHdr;
use bloatlab_lab_model::{LinkDirection, Packet};
use bloatlab_netio::mono_ns;
use hdrhistogram::Histogram;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What waited in the sending TUN device's own transmit queue, outside the link model (which
/// only sees a packet once this thread has read it). Two upper bounds: the packets read since
/// the device was last found empty (a burst the sender wrote at once counts, although it waits
/// only microseconds), and per packet the time it may have waited: it entered after the device
/// was last known empty (found empty, or when the sleeping thread woke), and after the packet
/// `txqueuelen` reads before it had been read (no more fit ahead of it). Only the kernel's
/// wake-up latency escapes both.
/// With offloads, each read or write may carry many wire segments: `reads` and `writes` count
/// system calls, `super_in` and `super_out` those that carried a super-packet.
pub struct TunQueue {
    packets: Histogram<u64>,
    wait_us: Histogram<u64>,
    pub reads: u64,
    pub super_in: u64,
    pub writes: u64,
    pub super_out: u64,
}

impl Default for TunQueue {
    fn default() -> Self {
        let h = || Histogram::new_with_max(1 << 30, 2).expect("valid HDR bounds");
        TunQueue {
            packets: h(),
            wait_us: h(),
            reads: 0,
            super_in: 0,
            writes: 0,
            super_out: 0,
        }
    }
}

/// The 99th percentile and the maximum of a histogram (0, 0 when empty).
fn p99_max(h: &Histogram<u64>) -> (u64, u64) {
    if h.is_empty() {
        return (0, 0);
    }
    (h.value_at_quantile(0.99), h.max())
}

impl TunQueue {
    /// (p99, max) of the packets found waiting each time the device was emptied.
    pub fn packets(&self) -> (u64, u64) {
        p99_max(&self.packets)
    }

    /// (p99, max) of the time a packet may have waited in the device, microseconds.
    pub fn wait_us(&self) -> (u64, u64) {
        p99_max(&self.wait_us)
    }
}

/// Reads per wake-up before the thread turns to its due packets, so a flood cannot starve
/// the output side.
const READ_BATCH: usize = 64;
/// Longest sleep while idle: how soon a stop request is noticed.
const IDLE_WAIT_NS: u64 = 50_000_000;

/// The devices a direction reads from and writes to (with virtio headers and offloads when
/// `offload`), the least time between two deliveries to the receiving host, and the sending
/// host's slowness at originating ICMP errors, if it has any.
pub struct Ends {
    pub from: RawFd,
    pub to: RawFd,
    pub offload: bool,
    pub rx_batch_ns: u64,
    pub slow_icmp: Option<SlowIcmp>,
}

/// Syscall counts since they were last added to the shared `TunQueue`.
#[derive(Default)]
struct Calls {
    reads: u64,
    super_in: u64,
    writes: u64,
    super_out: u64,
}

/// Hands what one read brought to the model: a super-packet's wire segments (the buffer moves
/// into them, `buf` gets a fresh one), else the packet, held first if its host is slow to send
/// its own ICMP errors.
fn arrive(
    dir: &mut LinkDirection,
    buf: &mut Vec<u8>,
    vnet: VnetHdr,
    train: u64,
    slow_icmp: Option<&mut SlowIcmp>,
    now: u64,
) -> bool {
    if vnet.is_tcp_gso() {
        let whole = std::sync::Arc::new(std::mem::replace(buf, Vec::with_capacity(READ_BUF)));
        match gso::split(&vnet, whole.clone(), train) {
            Some(segments) => segments.into_iter().for_each(|s| dir.arrive(s, now)),
            // Not a TCP super-packet as the kernel builds them: one oversized packet, which the
            // link drops as too big for its MTU.
            None => dir.arrive(Packet::with_vnet(whole.to_vec(), vnet), now),
        }
        return true;
    }
    let p = Packet::with_vnet(buf.to_vec(), vnet);
    match slow_icmp.map_or(0, |s| s.hold(&p.data, now)) {
        0 => dir.arrive(p, now),
        hold => dir.arrive_held(p, now, hold),
    }
    false
}

pub fn spawn(
    name: String,
    ends: Ends,
    txqueuelen: usize,
    model: Arc<Mutex<LinkDirection>>,
    tun_queue: Arc<Mutex<TunQueue>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<JoinHandle<()>> {
    let Ends {
        from,
        to,
        offload,
        rx_batch_ns,
        mut slow_icmp,
    } = ends;
    std::thread::Builder::new().name(name).spawn(move || {
        // Without this nanosleep-style waits wake ~50 us late (see the TUN reference notes).
        // SAFETY: prctl with plain integer arguments.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
        // Real-time priority: a link must release packets when they are due, not when the
        // scheduler gets round to it behind the TCP stacks it carries. A late wake-up sends a
        // burst, and a burst into a link only 5% faster lingers there for hundreds of ms: a
        // queue the emulator made up. (Without the privilege the thread stays as it is.)
        // musl's sched_param has more fields than the priority: the rest stay zero.
        // SAFETY: sched_param is plain integers; all zeros is a valid value.
        let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
        param.sched_priority = 10;
        // SAFETY: this thread's own scheduling policy, valid parameters.
        unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
        let mut buf = Vec::with_capacity(READ_BUF);
        let (mut calls, mut trains, mut due) = (Calls::default(), 0u64, Vec::new());
        // Packets read, and their longest possible wait, since the device was last empty.
        let (mut since_empty, mut empty_at, mut longest_wait) = (0u64, mono_ns(), 0u64);
        // When the last `txqueuelen` packets were read.
        let mut read_times: VecDeque<u64> = VecDeque::with_capacity(txqueuelen + 1);
        while !stop.load(Ordering::Relaxed) {
            let mut reads = 0;
            let mut dir = model.lock().unwrap_or_else(|e| e.into_inner());
            while reads < READ_BATCH {
                match read_packet(from, offload, &mut buf) {
                    Ok(Some(vnet)) => {
                        let now = mono_ns();
                        trains += 1;
                        calls.super_in +=
                            arrive(&mut dir, &mut buf, vnet, trains, slow_icmp.as_mut(), now)
                                as u64;
                        calls.reads += 1;
                        reads += 1;
                        since_empty += 1;
                        let entered_after = if read_times.len() == txqueuelen {
                            empty_at.max(read_times[0])
                        } else {
                            empty_at
                        };
                        longest_wait = longest_wait.max(now - entered_after);
                        read_times.push_back(now);
                        if read_times.len() > txqueuelen {
                            read_times.pop_front();
                        }
                    }
                    Ok(None) => {
                        empty_at = mono_ns();
                        if since_empty > 0 {
                            let mut q = tun_queue.lock().unwrap_or_else(|e| e.into_inner());
                            q.packets.saturating_record(since_empty);
                            q.wait_us.saturating_record(longest_wait / 1000);
                            (since_empty, longest_wait) = (0, 0);
                        }
                        break;
                    }
                    // The device went away (namespace deleted): the lab is shutting down.
                    Err(_) => return,
                }
            }
            let now = mono_ns();
            due.extend(std::iter::from_fn(|| dir.poll(now)));
            for w in gso::coalesce(due.drain(..)) {
                // A write fails only when the receiving device is gone or down; the packet is
                // then lost as on a real unplugged link.
                let _ = write_packet(to, offload, &w);
                calls.writes += 1;
                calls.super_out += (w.segments() > 1) as u64;
            }
            if calls.reads + calls.writes > 0 {
                let mut q = tun_queue.lock().unwrap_or_else(|e| e.into_inner());
                let c = std::mem::take(&mut calls);
                (q.reads, q.super_in, q.writes, q.super_out) = (
                    q.reads + c.reads,
                    q.super_in + c.super_in,
                    q.writes + c.writes,
                    q.super_out + c.super_out,
                );
            }
            // Deliveries due within `rx_batch_ns` of a wake-up wait for the next, as a NIC's
            // interrupt moderation holds them: the model's times stay exact (it catches up).
            let wait = dir.next_wakeup().map_or(IDLE_WAIT_NS, |t| {
                t.saturating_sub(mono_ns())
                    .max(rx_batch_ns)
                    .min(IDLE_WAIT_NS)
            });
            drop(dir);
            // Asleep, the thread wakes as soon as a packet comes: the device was empty until it
            // woke (by a packet or by its timeout, when ppoll found nothing readable).
            if reads < READ_BATCH && wait > 0 {
                wait_readable(from, wait);
                empty_at = mono_ns();
            }
        }
    })
}
