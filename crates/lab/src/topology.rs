//! Topologies: hosts joined by links, each link with an `up` (a -> b) and a `down` (b -> a)
//! direction. Read from TOML:
//!
//! ```toml
//! name = "cable"
//! [[link]]
//! name = "wan"
//! a = "router"          # the side nearer the user: `up` leaves it
//! b = "server"
//! both = { delay = "7.5ms", limit = 1000 }
//! up = { rate = "4mbit" }
//! down = { rate = "60mbit" }
//! ```
//!
//! Hosts are the link ends. Addresses: link number i is 10.77.i.0/24 and fd77:0:0:i::/64,
//! `a` is .1 / ::1, `b` is .2 / ::2. A host may have settings of its own:
//!
//! ```toml
//! [host.isp]
//! icmp_ratelimit = 0      # ms between ICMP errors to one address; Linux's default 1000, 0 none
//! icmp_delay = "300ms"    # its own ICMP errors leave this late while it forwards 500+ pkt/s
//! ecn = true              # its TCP asks for ECN on every connection (net.ipv4.tcp_ecn = 1)
//! ```
//!
//! Two settings at the top concern how hosts meet the lab, not the links:
//! - `offload = false` makes the hosts send one wire packet per write, as through a NIC without
//!   segmentation offload; by default they hand the lab TCP super-packets of up to 64 KB, which
//!   it accounts per wire segment all the same (and forwards much faster);
//! - `rx_usecs = 100` (the default; as `ethtool -C rx-usecs`): packets reach a host at most this
//!   much after their time on the emulated wire, together, as a NIC's interrupt moderation
//!   delivers them; 0 wakes the host for every packet, at twice the emulator's CPU at 1 Gbit/s.
//!   The links' own timing (queues, serialisation, AQM) is exact either way.

use bloatlab_lab_model::config::ConfigError;
use bloatlab_lab_model::DirConfig;
use std::collections::{BTreeMap, VecDeque};

#[derive(Clone, Debug)]
pub struct LinkSpec {
    pub name: String,
    pub a: String,
    pub b: String,
    pub up: DirConfig,
    pub down: DirConfig,
}

/// Settings of one host's own kernel (its namespace's sysctls).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostSettings {
    /// net.ipv4.icmp_ratelimit and net.ipv6.icmp.ratelimit: least ms between two ICMP errors
    /// to one destination (bursts of 6 allowed); `None` leaves Linux's default of 1000.
    pub icmp_ratelimit_ms: Option<u32>,
    /// Its own ICMP errors leave this late while it is busy forwarding (`slow_icmp`).
    pub icmp_delay_ns: Option<u64>,
    /// Its TCP senders' congestion control (`congctl` on its routes); `None` gives `DEFAULT_CC`.
    pub cc: Option<String>,
    /// TCP ECN (`net.ipv4.tcp_ecn`): true asks for it on every connection (1), false neither
    /// asks nor accepts (0); `None` leaves Linux's default (2: accepts when asked).
    pub ecn: Option<bool>,
}

/// Every lab host's TCP congestion control unless its `[host.NAME]` says `cc`: Linux's default,
/// and what Windows, macOS and Android send with. Not the machine's own default (a namespace
/// inherits it: BBR here, which keeps a FIFO part-empty), so that a lab gives the same answer on
/// every machine.
pub const DEFAULT_CC: &str = "cubic";

#[derive(Clone, Debug)]
pub struct Topology {
    pub name: String,
    pub description: String,
    pub hosts: Vec<String>,
    pub links: Vec<LinkSpec>,
    pub host_settings: BTreeMap<String, HostSettings>,
    /// TCP segmentation and checksum offloads on the hosts' lab devices.
    pub offload: bool,
    /// Least time between two deliveries into one host's device, microseconds.
    pub rx_usecs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("topology: {0}")]
    Toml(String),
    #[error("link {link}, {dir}: {err}")]
    Setting {
        link: String,
        dir: &'static str,
        err: ConfigError,
    },
    #[error("topology: {0}")]
    Shape(String),
}

fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A TOML error on one line, with the line and column it points at.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().trim().replace('\n', "; ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {msg}")
        }
        None => msg,
    }
}

/// Deliveries at most 100 us late: 8 packets' time at 1 Gbit/s, a fifth of one at 25 Mbit/s. At
/// 1 Gbit/s with 4 FQ-CoDel flows the emulator then needs 0.8 CPU s per Gbit, against 1.05 at
/// 50 us and 1.7 when it wakes for every packet (BENCHMARKS.md).
const DEFAULT_RX_USECS: u64 = 100;

fn name_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 12 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

fn host_settings(
    doc: &toml::Table,
    hosts: &[String],
) -> Result<BTreeMap<String, HostSettings>, TopologyError> {
    let mut out = BTreeMap::new();
    let Some(table) = doc.get("host") else {
        return Ok(out);
    };
    let table = table.as_table().ok_or_else(|| {
        TopologyError::Shape("`host` must be a table of hosts: [host.NAME]".into())
    })?;
    for (h, kv) in table {
        if !hosts.contains(h) {
            return Err(TopologyError::Shape(format!(
                "[host.{h}]: no link has a host named `{h}`"
            )));
        }
        let kv = kv
            .as_table()
            .ok_or_else(|| TopologyError::Shape(format!("[host.{h}] must be a table")))?;
        let mut st = HostSettings::default();
        for (k, v) in kv {
            match k.as_str() {
                "icmp_ratelimit" => {
                    let ms = v
                        .as_integer()
                        .filter(|m| (0..=60_000).contains(m))
                        .ok_or_else(|| {
                            TopologyError::Shape(format!(
                                "[host.{h}] icmp_ratelimit: \
                            want milliseconds 0..60000 (0: no limit), got {v}"
                            ))
                        })?;
                    st.icmp_ratelimit_ms = Some(ms as u32);
                }
                "icmp_delay" => {
                    let text = value_text(v);
                    let ns = bloatlab_lab_model::config::parse_time_ns(&text)
                        .map_err(|e| TopologyError::Shape(format!("[host.{h}] icmp_delay: {e}")))?;
                    st.icmp_delay_ns = Some(ns);
                }
                "cc" => {
                    // TCP_CA_NAME_MAX is 16 with its NUL.
                    let name = v.as_str().filter(|s| {
                        !s.is_empty()
                            && s.len() < 16
                            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    });
                    let name = name.ok_or_else(|| {
                        TopologyError::Shape(format!(
                            "[host.{h}] cc: \
                        want a congestion control's name (cubic, bbr, reno), got {v}"
                        ))
                    })?;
                    st.cc = Some(name.to_string());
                }
                "ecn" => {
                    st.ecn = Some(v.as_bool().ok_or_else(|| {
                        TopologyError::Shape(format!(
                            "[host.{h}] ecn: want true (TCP asks for ECN) or false (none), got {v}"
                        ))
                    })?);
                }
                other => {
                    return Err(TopologyError::Shape(format!(
                        "[host.{h}]: unknown setting `{other}` \
                         (known: icmp_ratelimit, icmp_delay, cc, ecn)"
                    )))
                }
            }
        }
        out.insert(h.clone(), st);
    }
    Ok(out)
}

impl Topology {
    pub fn from_toml(
        text: &str,
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<Topology, TopologyError> {
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| TopologyError::Toml(toml_error(text, &e)))?;
        let name = doc
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or("lab")
            .to_string();
        let description = doc
            .get("description")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        let offload = match doc.get("offload") {
            None => true,
            Some(v) => v.as_bool().ok_or_else(|| {
                TopologyError::Shape(format!("offload: want true or false, got {v}"))
            })?,
        };
        let rx_usecs = match doc.get("rx_usecs") {
            None => DEFAULT_RX_USECS,
            Some(v) => v
                .as_integer()
                .filter(|u| (0..=10_000).contains(u))
                .ok_or_else(|| {
                    TopologyError::Shape(format!("rx_usecs: want microseconds 0..10000, got {v}"))
                })? as u64,
        };
        let links_v = doc
            .get("link")
            .and_then(|v| v.as_array())
            .ok_or_else(|| TopologyError::Shape("no [[link]] entries".into()))?;
        let mut hosts: Vec<String> = Vec::new();
        let mut links = Vec::new();
        for (i, l) in links_v.iter().enumerate() {
            let t = l
                .as_table()
                .ok_or_else(|| TopologyError::Shape(format!("link {i} is not a table")))?;
            let s = |k: &str| t.get(k).and_then(|v| v.as_str()).map(str::to_string);
            let lname = s("name").unwrap_or_else(|| format!("link{i}"));
            let (a, b) = match (s("a"), s("b")) {
                (Some(a), Some(b)) if a != b => (a, b),
                _ => {
                    return Err(TopologyError::Shape(format!(
                        "link {lname} needs two different hosts `a` and `b`"
                    )))
                }
            };
            for n in [&lname, &a, &b] {
                if !name_ok(n) {
                    return Err(TopologyError::Shape(format!(
                        "name `{n}`: use up to 12 letters, digits or '-'"
                    )));
                }
            }
            let mut up = DirConfig::default();
            let mut down = DirConfig::default();
            up.seed = 2 * i as u64 + 1;
            down.seed = 2 * i as u64 + 2;
            for (section, targets) in [("both", 3u8), ("up", 1), ("down", 2)] {
                let Some(kv) = t.get(section) else { continue };
                let kv = kv.as_table().ok_or_else(|| {
                    TopologyError::Shape(format!("link {lname}: `{section}` must be a table"))
                })?;
                for (k, v) in kv {
                    let v = value_text(v);
                    if targets & 1 != 0 {
                        up.set(k, &v, read_file)
                            .map_err(|err| TopologyError::Setting {
                                link: lname.clone(),
                                dir: "up",
                                err,
                            })?;
                    }
                    if targets & 2 != 0 {
                        down.set(k, &v, read_file)
                            .map_err(|err| TopologyError::Setting {
                                link: lname.clone(),
                                dir: "down",
                                err,
                            })?;
                    }
                }
            }
            for h in [&a, &b] {
                if !hosts.contains(h) {
                    hosts.push(h.clone());
                }
            }
            if links.iter().any(|x: &LinkSpec| x.name == lname) {
                return Err(TopologyError::Shape(format!("two links named {lname}")));
            }
            links.push(LinkSpec {
                name: lname,
                a,
                b,
                up,
                down,
            });
        }
        if links.len() > 250 {
            return Err(TopologyError::Shape("at most 250 links".into()));
        }
        let host_settings = host_settings(&doc, &hosts)?;
        Ok(Topology {
            name,
            description,
            hosts,
            links,
            host_settings,
            offload,
            rx_usecs,
        })
    }

    pub fn link(&self, name: &str) -> Option<usize> {
        self.links.iter().position(|l| l.name == name)
    }

    /// IPv4 and IPv6 address of `host` on link `i`.
    pub fn addrs(&self, i: usize, host: &str) -> (String, String) {
        let end = if self.links[i].a == host { 1 } else { 2 };
        (format!("10.77.{i}.{end}"), format!("fd77:0:0:{i:x}::{end}"))
    }

    /// For each host, the link to take towards each link subnet it is not on (shortest path).
    pub fn routes(&self) -> BTreeMap<String, Vec<(usize, usize)>> {
        let mut out = BTreeMap::new();
        for h in &self.hosts {
            // BFS over hosts: the first link used on the way to each host.
            let mut first: BTreeMap<&str, Option<usize>> = BTreeMap::new();
            first.insert(h, None);
            let mut q = VecDeque::from([h.as_str()]);
            while let Some(cur) = q.pop_front() {
                for (i, l) in self.links.iter().enumerate() {
                    let next = if l.a == cur {
                        &l.b
                    } else if l.b == cur {
                        &l.a
                    } else {
                        continue;
                    };
                    if !first.contains_key(next.as_str()) {
                        let via = first[cur].unwrap_or(i);
                        first.insert(next, Some(via));
                        q.push_back(next);
                    }
                }
            }
            let mut r = Vec::new();
            for (j, l) in self.links.iter().enumerate() {
                if l.a == *h || l.b == *h {
                    continue;
                }
                // Reach subnet j through whichever of its ends is reachable.
                if let Some(Some(via)) = first.get(l.a.as_str()).or(first.get(l.b.as_str())) {
                    r.push((j, *via));
                }
            }
            out.insert(h.clone(), r);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nofile(_: &str) -> Result<String, String> {
        Err("none".into())
    }

    #[test]
    fn three_hop_chain_routes_through_the_middle() {
        let t = Topology::from_toml(
            r#"
            [[link]]
            name = "wifi"
            a = "laptop"
            b = "router"
            both = { rate = "6mbit", delay = "1ms" }
            [[link]]
            name = "wan"
            a = "router"
            b = "isp"
            [[link]]
            name = "core"
            a = "isp"
            b = "server"
            up = { delay = "10ms" }
            "#,
            &nofile,
        )
        .unwrap();
        assert_eq!(t.hosts, vec!["laptop", "router", "isp", "server"]);
        let r = t.routes();
        assert_eq!(r["laptop"], vec![(1, 0), (2, 0)]);
        assert_eq!(r["router"], vec![(2, 1)]);
        assert_eq!(r["server"], vec![(0, 2), (1, 2)]);
        assert_eq!(
            t.addrs(2, "server"),
            ("10.77.2.2".into(), "fd77:0:0:2::2".into())
        );
        assert_eq!(t.links[2].up.delay_ns, 10_000_000);
        assert_eq!(t.links[2].down.delay_ns, 0);
    }

    #[test]
    fn host_settings_name_a_known_host_and_a_known_key() {
        let links = "[[link]]\nname='l'\na='c'\nb='r'\n";
        let t = Topology::from_toml(
            &format!("{links}[host.r]\nicmp_ratelimit = 0\nicmp_delay = '300ms'\n"),
            &nofile,
        )
        .unwrap();
        assert_eq!(t.host_settings["r"].icmp_ratelimit_ms, Some(0));
        assert_eq!(t.host_settings["r"].icmp_delay_ns, Some(300_000_000));
        let t = Topology::from_toml(&format!("{links}[host.c]\ncc = 'bbr'\n"), &nofile).unwrap();
        assert_eq!(t.host_settings["c"].cc.as_deref(), Some("bbr"));
        assert!(
            Topology::from_toml(&format!("{links}[host.c]\ncc = 'bbr; reboot'\n"), &nofile)
                .is_err()
        );
        let e = |extra: &str| {
            Topology::from_toml(&format!("{links}{extra}"), &nofile)
                .unwrap_err()
                .to_string()
        };
        assert!(e("[host.x]\nicmp_ratelimit = 0\n").contains("no link has a host named `x`"));
        assert!(e("[host.r]\nicmp_rate = 0\n").contains("unknown setting `icmp_rate`"));
        assert!(e("[host.r]\nicmp_ratelimit = -1\n").contains("want milliseconds"));
    }

    #[test]
    fn offload_and_rx_usecs_default_on_and_100_and_are_checked() {
        let links = "[[link]]\nname='l'\na='c'\nb='r'\n";
        let t = Topology::from_toml(links, &nofile).unwrap();
        assert_eq!((t.offload, t.rx_usecs), (true, 100));
        let t = Topology::from_toml(&format!("offload = false\nrx_usecs = 0\n{links}"), &nofile)
            .unwrap();
        assert_eq!((t.offload, t.rx_usecs), (false, 0));
        let e = |top: &str| {
            Topology::from_toml(&format!("{top}\n{links}"), &nofile)
                .unwrap_err()
                .to_string()
        };
        assert!(e("offload = 'yes'").contains("want true or false"));
        assert!(e("rx_usecs = 20000").contains("want microseconds 0..10000"));
    }

    #[test]
    fn a_toml_error_is_one_line_with_its_place() {
        let e = Topology::from_toml("name = 'x'\n[[link]\n", &nofile)
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2, column") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn errors_name_the_link_and_direction() {
        let e = Topology::from_toml(
            "[[link]]\nname='x'\na='p'\nb='q'\nup={rate='fast'}",
            &nofile,
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("link x, up: rate `fast`"), "{e}");
        assert!(Topology::from_toml("name='x'", &nofile).is_err());
    }
}
