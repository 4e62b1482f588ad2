//! The queue on this host's own way out (hop 0): the root qdisc's backlog of the interface
//! that routes to the target, sampled while the test loads the path. A Wi-Fi driver or a
//! sender's own qdisc can hold the standing queue before any router sees it.

use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

pub use bloatlab_result::locate::{LocalQueue, QueueSample};

/// The interface the kernel routes `target` through (`ip route get`).
pub fn route_interface(target: IpAddr) -> Option<String> {
    let out = Command::new("ip")
        .args(["route", "get", &target.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut words = text.split_whitespace();
    words.by_ref().find(|w| *w == "dev")?;
    words.next().map(str::to_string)
}

/// The root qdisc's backlog (bytes, packets) from `tc -s -j qdisc show dev IF`.
pub fn root_backlog(interface: &str) -> Option<(u64, u64)> {
    let out = Command::new("tc")
        .args(["-s", "-j", "qdisc", "show", "dev", interface])
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let root = v
        .as_array()?
        .iter()
        .find(|q| q["root"].as_bool() == Some(true))?;
    Some((
        root["backlog"].as_u64()?,
        root["qlen"].as_u64().unwrap_or(0),
    ))
}

fn sysfs_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

pub struct LocalQueueSampler {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<LocalQueue>,
}

impl LocalQueueSampler {
    /// Samples every `every` until finished; `None` when no interface or no `tc` answers.
    pub fn start(target: IpAddr, every: Duration) -> Option<LocalQueueSampler> {
        let interface = route_interface(target)?;
        root_backlog(&interface)?;
        let mut q = LocalQueue {
            txqueuelen: sysfs_u64(&format!("/sys/class/net/{interface}/tx_queue_len")),
            bql_limit: sysfs_u64(&format!(
                "/sys/class/net/{interface}/queues/tx-0/byte_queue_limits/limit"
            )),
            interface,
            samples: Vec::new(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if let Some((bytes, packets)) = root_backlog(&q.interface) {
                    let t = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                    q.samples.push(QueueSample {
                        t_unix: t,
                        backlog_bytes: bytes,
                        backlog_packets: packets,
                    });
                }
                std::thread::sleep(every);
            }
            q
        });
        Some(LocalQueueSampler { stop, thread })
    }

    pub fn finish(self) -> LocalQueue {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}
