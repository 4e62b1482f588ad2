//! A running lab: namespaces, TUN devices, forwarder threads. Dropping it tears everything
//! down, also on error paths and panics.

use crate::forward::{self, TunQueue};
use crate::ns::{self, ip};
use crate::topology::{Topology, DEFAULT_CC};
use crate::tun::Tun;
use crate::{NS_PREFIX, STATE_DIR};
use bloatlab_lab_model::slow_icmp::SlowIcmp;
use bloatlab_lab_model::LinkDirection;
use bloatlab_netio::mono_ns;
use bloatlab_result::lab::{DirStats, LabStats, LinkStats, P99Max, TunStats};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{0}")]
    Setup(String),
    #[error("lab `{0}` is already up (`bloatlab lab down {0}` first, or `lab down --all`)")]
    Exists(String),
}

/// What other processes need to find a running lab: written to STATE_DIR/NAME/info.json.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LabInfo {
    pub name: String,
    pub topology: String,
    pub pid: u32,
    pub socket: PathBuf,
    /// host -> (namespace, IPv4 addresses, IPv6 addresses)
    pub hosts: BTreeMap<String, HostInfo>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostInfo {
    pub namespace: String,
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
    /// Its TCP senders' congestion control (on every route it has).
    #[serde(default)]
    pub cc: String,
}

pub struct LinkRuntime {
    pub up: Arc<Mutex<LinkDirection>>,
    pub down: Arc<Mutex<LinkDirection>>,
    pub up_tun: Arc<Mutex<TunQueue>>,
    pub down_tun: Arc<Mutex<TunQueue>>,
}

/// Packets a TUN device holds before the forwarder reads them: a queue outside the model, so
/// short. The forwarder reads within microseconds when a link is shaped below its ~270 kpps,
/// so this fills only when the emulator itself is the bottleneck (unshaped multi-Gbit/s); 256
/// packets are then about 1 ms of its forwarding, and overflow is counted as `tun.dropped`.
const TUN_TXQUEUELEN: u32 = 256;

/// The part of a lab the control socket shares.
pub struct Shared {
    pub topo: Topology,
    pub info: LabInfo,
    pub links: Vec<LinkRuntime>,
}

pub struct Lab {
    pub shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    tuns: Vec<Tun>,
    namespaces: Vec<String>,
    state_dir: PathBuf,
}

pub fn state_dir(name: &str) -> PathBuf {
    PathBuf::from(STATE_DIR).join(name)
}

pub fn namespace(lab: &str, host: &str) -> String {
    format!("{NS_PREFIX}{lab}-{host}")
}

/// Routes link `subnet`'s IPv4 and IPv6 prefixes (`Topology::addrs`) out of `dev` in namespace
/// `ns`, its TCP senders using congestion control `cc` (`congctl`).
fn route_to_subnet(ns: &str, subnet: usize, dev: &str, cc: &str) -> Result<(), String> {
    ip(&[
        "-n",
        ns,
        "route",
        "add",
        &format!("10.77.{subnet}.0/24"),
        "dev",
        dev,
        "congctl",
        cc,
    ])?;
    ip(&[
        "-n",
        ns,
        "-6",
        "route",
        "add",
        &format!("fd77:0:0:{subnet:x}::/64"),
        "dev",
        dev,
        "congctl",
        cc,
    ])
}

fn pid_alive(pid: u32) -> bool {
    // A killed lab process whose parent has not reaped it yet is a zombie: signal 0 still
    // finds it, but it holds nothing. /proc says so (state `Z` after the command's `)`).
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    // SAFETY: signal 0 only checks existence.
    !zombie && unsafe { libc::kill(pid as i32, 0) == 0 }
}

/// Labs whose state is present, with whether their process still runs.
pub fn running() -> Vec<(LabInfo, bool)> {
    let Ok(dir) = std::fs::read_dir(STATE_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let text = std::fs::read_to_string(e.ok()?.path().join("info.json")).ok()?;
        let info: LabInfo = serde_json::from_str(&text).ok()?;
        let alive = pid_alive(info.pid);
        Some((info, alive))
    })
    .collect()
}

impl Lab {
    pub fn up(topo: Topology, name: &str) -> Result<Lab, LabError> {
        let setup = |e: String| LabError::Setup(e);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(setup(
                "the lab needs root (network namespaces and TUN devices)".into(),
            ));
        }
        if !std::path::Path::new("/dev/net/tun").exists() {
            return Err(setup(
                "/dev/net/tun is missing: this kernel or container has no TUN support".into(),
            ));
        }
        if name.is_empty()
            || name.len() > 12
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(setup(format!(
                "lab name `{name}`: use up to 12 letters, digits or '-'"
            )));
        }
        let dir = state_dir(name);
        if let Some((info, alive)) = running().into_iter().find(|(i, _)| i.name == name) {
            if alive {
                return Err(LabError::Exists(info.name));
            }
            // Its process was killed (SIGKILL, a reboot of the sandbox): namespaces outlive it
            // and would block this name forever, so clear what its state file says it owned.
            remove_remains(&info);
        }
        let taken: Vec<String> = ns::list();
        if topo
            .hosts
            .iter()
            .any(|h| taken.contains(&namespace(name, h)))
        {
            return Err(LabError::Exists(name.to_string()));
        }
        std::fs::create_dir_all(&dir).map_err(|e| setup(format!("{}: {e}", dir.display())))?;
        let now = mono_ns();
        let links = topo
            .links
            .iter()
            .map(|l| LinkRuntime {
                up: Arc::new(Mutex::new(LinkDirection::new(l.up.clone(), now))),
                down: Arc::new(Mutex::new(LinkDirection::new(l.down.clone(), now))),
                up_tun: Arc::default(),
                down_tun: Arc::default(),
            })
            .collect();
        let info = LabInfo {
            name: name.into(),
            topology: topo.name.clone(),
            pid: std::process::id(),
            socket: dir.join("control.sock"),
            hosts: BTreeMap::new(),
        };
        let mut lab = Lab {
            shared: Arc::new(Shared { topo, info, links }),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            tuns: Vec::new(),
            namespaces: Vec::new(),
            state_dir: dir,
        };
        // On any error below, dropping `lab` removes what was built so far.
        lab.build().map_err(setup)?;
        Ok(lab)
    }

    fn build(&mut self) -> Result<(), String> {
        let topo = self.shared.topo.clone();
        let name = self.shared.info.name.clone();
        let mut hosts = BTreeMap::new();
        for h in &topo.hosts {
            let n = namespace(&name, h);
            ip(&["netns", "add", &n])?;
            self.namespaces.push(n.clone());
            ip(&["-n", &n, "link", "set", "lo", "up"])?;
            // Unprivileged ICMP echo sockets (`test mtu`, `locate --icmp`) for every group, as
            // desktop distributions set it; a fresh namespace admits none.
            ns::sysctl(&n, "net.ipv4.ping_group_range", "0 2147483647")?;
            let degree = topo.links.iter().filter(|l| &l.a == h || &l.b == h).count();
            if degree > 1 {
                ns::sysctl(&n, "net.ipv4.ip_forward", "1")?;
                ns::sysctl(&n, "net.ipv6.conf.all.forwarding", "1")?;
            }
            if let Some(ms) = topo.host_settings.get(h).and_then(|s| s.icmp_ratelimit_ms) {
                ns::sysctl(&n, "net.ipv4.icmp_ratelimit", &ms.to_string())?;
                ns::sysctl(&n, "net.ipv6.icmp.ratelimit", &ms.to_string())?;
            }
            if let Some(ecn) = topo.host_settings.get(h).and_then(|s| s.ecn) {
                // For IPv6's TCP too: Linux has one switch for both.
                ns::sysctl(&n, "net.ipv4.tcp_ecn", if ecn { "1" } else { "0" })?;
            }
            let cc = topo
                .host_settings
                .get(h)
                .and_then(|s| s.cc.clone())
                .unwrap_or_else(|| DEFAULT_CC.to_string());
            hosts.insert(
                h.clone(),
                HostInfo {
                    namespace: n,
                    ipv4: Vec::new(),
                    ipv6: Vec::new(),
                    cc,
                },
            );
        }
        let tag = std::process::id() % 100_000;
        for (i, l) in topo.links.iter().enumerate() {
            for (side, host) in [("a", &l.a), ("b", &l.b)] {
                // Created in our namespace under a unique name, then moved and renamed: the
                // descriptor stays attached across the move.
                let tmp = format!("blt{tag}{side}{i}");
                let tun = Tun::create(&tmp, topo.offload).map_err(|e| format!("TUN {tmp}: {e}"))?;
                self.tuns.push(tun);
                let n = namespace(&name, host);
                ip(&["link", "set", "dev", &tmp, "netns", &n])?;
                ip(&["-n", &n, "link", "set", "dev", &tmp, "name", &l.name])?;
                let mtu = if side == "a" { l.up.mtu } else { l.down.mtu };
                ip(&[
                    "-n",
                    &n,
                    "link",
                    "set",
                    "dev",
                    &l.name,
                    "mtu",
                    &mtu.to_string(),
                    "txqueuelen",
                    &TUN_TXQUEUELEN.to_string(),
                    "up",
                ])?;
                let (v4, v6) = topo.addrs(i, host);
                let hi = hosts.get_mut(host.as_str()).expect("host listed");
                // The link's own subnet is routed by us, not by the kernel, to carry the host's
                // congestion control (`congctl`, below).
                ip(&[
                    "-n",
                    &n,
                    "addr",
                    "add",
                    &format!("{v4}/24"),
                    "dev",
                    &l.name,
                    "noprefixroute",
                ])?;
                ip(&[
                    "-n",
                    &n,
                    "-6",
                    "addr",
                    "add",
                    &format!("{v6}/64"),
                    "dev",
                    &l.name,
                    "nodad",
                    "noprefixroute",
                ])?;
                route_to_subnet(&n, i, &l.name, &hi.cc)?;
                hi.ipv4.push(v4);
                hi.ipv6.push(v6);
            }
        }
        // Every route a host has carries its congestion control: a namespace's default would
        // be the machine's (net.ipv4.tcp_congestion_control is inherited, and outside the first
        // namespace it may be set only to what tcp_allowed_congestion_control lists), a route's
        // `congctl` is any loaded one. A socket's own TCP_CONGESTION (a test's --cc) still wins.
        for (host, routes) in topo.routes() {
            let n = namespace(&name, &host);
            let cc = &hosts[&host].cc;
            for (subnet, via) in routes {
                route_to_subnet(&n, subnet, &topo.links[via].name, cc)?;
            }
        }
        // A host slow to send its own ICMP errors holds them on every link it sends into.
        let slow_icmp = |host: &str| {
            let delay = topo.host_settings.get(host).and_then(|s| s.icmp_delay_ns)?;
            let h = &hosts[host];
            let addrs = h
                .ipv4
                .iter()
                .chain(&h.ipv6)
                .filter_map(|a| a.parse().ok())
                .collect();
            Some(SlowIcmp::new(addrs, delay))
        };
        for (i, l) in topo.links.iter().enumerate() {
            let (a, b) = (self.tuns[2 * i].raw(), self.tuns[2 * i + 1].raw());
            let rt = &self.shared.links[i];
            let up = forward::Ends {
                from: a,
                to: b,
                offload: topo.offload,
                rx_batch_ns: topo.rx_usecs * 1000,
                slow_icmp: slow_icmp(&l.a),
            };
            let t1 = forward::spawn(
                format!("{}-up", l.name),
                up,
                TUN_TXQUEUELEN as usize,
                rt.up.clone(),
                rt.up_tun.clone(),
                self.stop.clone(),
            )
            .map_err(|e| e.to_string())?;
            self.threads.push(t1);
            let down = forward::Ends {
                from: b,
                to: a,
                offload: topo.offload,
                rx_batch_ns: topo.rx_usecs * 1000,
                slow_icmp: slow_icmp(&l.b),
            };
            let t2 = forward::spawn(
                format!("{}-down", l.name),
                down,
                TUN_TXQUEUELEN as usize,
                rt.down.clone(),
                rt.down_tun.clone(),
                self.stop.clone(),
            )
            .map_err(|e| e.to_string())?;
            self.threads.push(t2);
        }
        let shared = Arc::get_mut(&mut self.shared).expect("not shared yet");
        shared.info.hosts = hosts;
        let info = serde_json::to_string_pretty(&shared.info).expect("plain data");
        std::fs::write(self.state_dir.join("info.json"), info).map_err(|e| e.to_string())?;
        Ok(())
    }

    pub fn info(&self) -> &LabInfo {
        &self.shared.info
    }

    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }
}

impl Shared {
    /// `lab set LINK key=value...` on `dir` ("up", "down" or "both").
    pub fn set(
        &self,
        link: &str,
        dir: &str,
        settings: &[(String, String)],
    ) -> Result<String, String> {
        let i = self.topo.link(link).ok_or_else(|| {
            format!(
                "no link `{link}` (links: {})",
                self.topo
                    .links
                    .iter()
                    .map(|l| l.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        let rt = &self.links[i];
        let targets: Vec<&Arc<Mutex<LinkDirection>>> = match dir {
            "up" => vec![&rt.up],
            "down" => vec![&rt.down],
            "both" => vec![&rt.up, &rt.down],
            other => return Err(format!("direction `{other}`: want up, down or both")),
        };
        // Validate everything before changing anything.
        let mut updated = Vec::new();
        for d in &targets {
            let mut cfg = d.lock().unwrap_or_else(|e| e.into_inner()).config().clone();
            for (k, v) in settings {
                cfg.set(k, v, &crate::presets::read_file)
                    .map_err(|e| e.to_string())?;
            }
            updated.push(cfg);
        }
        let mut out = Vec::new();
        for (d, cfg) in targets.iter().zip(updated) {
            out.push(cfg.describe());
            d.lock()
                .unwrap_or_else(|e| e.into_inner())
                .reconfigure(cfg, mono_ns());
        }
        Ok(format!("{link} {dir}: {}", out.join(" | ")))
    }

    /// Starts both directions' trace or schedule of `link` again from their beginning.
    pub fn restart_rates(&self, link: &str) -> Result<(), String> {
        let i = self
            .topo
            .link(link)
            .ok_or_else(|| format!("no link `{link}`"))?;
        for d in [&self.links[i].up, &self.links[i].down] {
            d.lock()
                .unwrap_or_else(|e| e.into_inner())
                .restart_rate(mono_ns());
        }
        Ok(())
    }

    /// Puts both directions of a link back as the topology defined them.
    pub fn restore(&self, link: &str) -> Result<(), String> {
        let i = self
            .topo
            .link(link)
            .ok_or_else(|| format!("no link `{link}`"))?;
        let spec = &self.topo.links[i];
        for (d, cfg) in [
            (&self.links[i].up, &spec.up),
            (&self.links[i].down, &spec.down),
        ] {
            d.lock()
                .unwrap_or_else(|e| e.into_inner())
                .reconfigure(cfg.clone(), mono_ns());
        }
        Ok(())
    }

    /// Counters of every link direction, with the TUN transmit queue in front of it.
    pub fn stats(&self) -> LabStats {
        let mut links = BTreeMap::new();
        for (l, rt) in self.topo.links.iter().zip(&self.links) {
            let dir = |d: &Mutex<LinkDirection>, tun: &Mutex<TunQueue>, sender: &str| {
                let mut out = {
                    let g = d.lock().unwrap_or_else(|e| e.into_inner());
                    let s = &g.stats;
                    DirStats {
                        rx_packets: s.rx_packets,
                        rx_bytes: s.rx_bytes,
                        tx_packets: s.tx_packets,
                        tx_bytes: s.tx_bytes,
                        tx_wire_bytes: s.tx_wire_bytes,
                        drops: s.drops.clone(),
                        ecn_marks: s.ecn_marks,
                        queue_packets: s.queue_packets as u64,
                        queue_bytes: s.queue_bytes as u64,
                        max_queue_packets: s.max_queue_packets as u64,
                        sojourn: s.sojourn.to_sojourn(),
                        ring_packets: s.ring_packets as u64,
                        max_ring_packets: s.max_ring_packets as u64,
                        ring_sojourn: s.ring_sojourn.to_sojourn(),
                        bql_limit_bytes: s.bql_limit_bytes,
                        config: g.config().describe(),
                        qdisc: g.qdisc_name().to_string(),
                        cake: g.cake_stats(),
                        tun: TunStats::default(),
                    }
                };
                let t = tun.lock().unwrap_or_else(|e| e.into_inner());
                let ((packets_p99, packets_max), (wait_p99, wait_max)) = (t.packets(), t.wait_us());
                out.tun = TunStats {
                    txqueuelen: TUN_TXQUEUELEN.into(),
                    dropped: ns::tx_dropped(&namespace(&self.info.name, sender), &l.name),
                    waiting_packets: P99Max {
                        p99: packets_p99,
                        max: packets_max,
                    },
                    wait_us: P99Max {
                        p99: wait_p99,
                        max: wait_max,
                    },
                    offload: self.topo.offload,
                    reads: t.reads,
                    super_packets_in: t.super_in,
                    writes: t.writes,
                    super_packets_out: t.super_out,
                };
                out
            };
            let link = LinkStats {
                up: dir(&rt.up, &rt.up_tun, &l.a),
                down: dir(&rt.down, &rt.down_tun, &l.b),
            };
            links.insert(l.name.clone(), link);
        }
        LabStats {
            lab: self.info.name.clone(),
            topology: self.topo.name.clone(),
            links,
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.tuns.clear();
        for n in self.namespaces.drain(..) {
            let _ = ns::delete(&n);
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// What this process started beside its labs and removes when its owner drops: a process
/// group running in a lab's namespace (cake-autorate's bash and fping), a directory.
#[derive(Clone, Debug, PartialEq)]
pub enum Remain {
    Group(i32),
    Dir(PathBuf),
}

static REMAINS: std::sync::Mutex<Vec<Remain>> = std::sync::Mutex::new(Vec::new());

/// `r` is removed by [`remove_own_remains`] unless [`disown`]ed first (by its owner, once it
/// removed it: a process group's number may be reused).
pub fn own(r: Remain) {
    REMAINS.lock().unwrap_or_else(|e| e.into_inner()).push(r);
}

pub fn disown(r: &Remain) {
    REMAINS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|x| x != r);
}

/// Deletes the namespaces and state directories of this process's own labs, and what it
/// [`own`]s beside them, for an exit that skips their teardown (a second Ctrl-C): their TUN
/// devices and threads end with the process, and nothing would be left for `lab down --all`
/// (a process group in a deleted namespace would run on in it unseen).
pub fn remove_own_remains() {
    for r in REMAINS.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        match r {
            // SAFETY: a signal to a process group this process started and still owns.
            Remain::Group(g) => unsafe {
                libc::kill(-g, libc::SIGKILL);
            },
            Remain::Dir(d) => {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
    let me = std::process::id();
    for (info, _) in running() {
        if info.pid == me {
            remove_remains(&info);
        }
    }
}

/// Deletes a dead lab's namespaces and state directory (its TUN devices died with it).
fn remove_remains(info: &LabInfo) {
    for h in info.hosts.values() {
        let _ = ns::delete(&h.namespace);
    }
    let _ = std::fs::remove_dir_all(state_dir(&info.name));
}

/// Removes every lab namespace, state directory and stray TUN device, also of labs whose
/// process was killed. Returns what it removed.
pub fn down_all() -> Vec<String> {
    let mut removed = Vec::new();
    for (info, alive) in running() {
        if alive && info.pid != std::process::id() {
            // SAFETY: plain signal to a process we started (its pid is in our state file).
            unsafe { libc::kill(info.pid as i32, libc::SIGTERM) };
            for _ in 0..50 {
                if !pid_alive(info.pid) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
    for n in ns::list() {
        if n.starts_with(NS_PREFIX) && ns::delete(&n).is_ok() {
            removed.push(format!("namespace {n}"));
        }
    }
    if let Ok(out) = std::process::Command::new("ip")
        .args(["-o", "link", "show", "type", "tun"])
        .output()
    {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let dev = line
                .split(':')
                .nth(1)
                .map(|s| s.trim().split('@').next().unwrap_or("").to_string())
                .unwrap_or_default();
            if dev.starts_with("blt") && ip(&["link", "del", &dev]).is_ok() {
                removed.push(format!("device {dev}"));
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(STATE_DIR) {
        for e in dir.flatten() {
            if std::fs::remove_dir_all(e.path()).is_ok() {
                removed.push(format!("state {}", e.path().display()));
            }
        }
    }
    removed
}
