//! The shapers autorate drives (shell): Linux CAKE's bandwidth and HTB class rates over
//! rtnetlink, one message per change, and the lab's emulated CAKE through its control socket.
//! Each also reads what the line carried, for the controller's load.

use crate::Direction;
use bloatlab_netio::rtnl::{self, Attrs, Rtnl, TcMsg, TcObject};
use bloatlab_netio::sysfs::DevCounter;
use std::path::PathBuf;

/// `linux/pkt_sched.h`: `TCA_CAKE_BASE_RATE64`, bytes per second.
const TCA_CAKE_BASE_RATE64: u16 = 2;
/// `TCA_HTB_PARMS` (`struct tc_htb_opt`), `TCA_HTB_RATE64`, `TCA_HTB_CEIL64`.
const TCA_HTB_PARMS: u16 = 1;
const TCA_HTB_RATE64: u16 = 6;
const TCA_HTB_CEIL64: u16 = 7;
/// `struct tc_htb_opt`: two `tc_ratespec`s (12 bytes, `rate` last), buffer, cbuffer,
/// quantum, level, prio.
const HTB_OPT_LEN: usize = 44;

#[derive(Debug, thiserror::Error)]
pub enum ShaperError {
    /// Someone removed or replaced the shaper: stop changing it.
    #[error("{0}")]
    Gone(String),
    #[error("{0}")]
    Failed(String),
}

pub trait Shaper: Send {
    /// As a user would recognise it: "CAKE on eth0 (up) and ifb4eth0 (down)".
    fn describe(&self) -> String;
    fn set(&mut self, dir: Direction, bps: u64) -> Result<(), ShaperError>;
    /// Bytes the line has carried (down, up) so far; differences give the load.
    fn carried(&mut self) -> Result<(u64, u64), String>;
    /// Whether the shaper is there as it was found (after it was gone: back again).
    fn present(&mut self) -> bool;
}

/// Which qdisc a kernel device's root has: CAKE or HTB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Cake,
    Htb,
}

/// One direction's shaper on one kernel device.
struct KernelSide {
    dev: String,
    ifindex: i32,
    kind: Kind,
    /// CAKE: the root qdisc's handle. HTB: the shaping class (its handle and parent) and its
    /// options as found, of which only the rates change.
    handle: u32,
    parent: u32,
    htb: Option<[u8; HTB_OPT_LEN]>,
}

/// CAKE or HTB on the WAN device (upload) and on its IFB (download, sqm-scripts' `ifb4DEV`).
pub struct Kernel {
    nl: Rtnl,
    up: Option<KernelSide>,
    down: Option<KernelSide>,
    /// The WAN device's received and sent bytes: the line's load.
    wan_rx: DevCounter,
    wan_tx: DevCounter,
}

impl Kernel {
    /// Finds the shapers on `dev` and `ifb` (`None`: `ifb4DEV` if it exists). `class` picks the
    /// HTB class (`None`: the root HTB's only top class, as sqm-scripts' 1:1).
    pub fn find(dev: &str, ifb: Option<&str>, class: Option<u32>) -> Result<Kernel, String> {
        let mut nl = Rtnl::open().map_err(|e| format!("netlink: {e}"))?;
        let up = Some(side(&mut nl, dev, class)?);
        let default_ifb = format!("ifb4{dev}");
        let down = match ifb {
            Some(i) => Some(side(&mut nl, i, class)?),
            None if rtnl::ifindex(&default_ifb).is_ok() => {
                Some(side(&mut nl, &default_ifb, class)?)
            }
            None => None,
        };
        Ok(Kernel {
            nl,
            up,
            down,
            wan_rx: DevCounter::new(dev, "rx_bytes"),
            wan_tx: DevCounter::new(dev, "tx_bytes"),
        })
    }
}

fn handle_text(h: u32) -> String {
    format!("{:x}:{:x}", h >> 16, h & 0xFFFF)
}

/// Parses a tc handle or class id ("1:1", "1:", "ffff:1a").
pub fn parse_handle(s: &str) -> Result<u32, String> {
    let (maj, min) = s
        .split_once(':')
        .ok_or_else(|| format!("`{s}`: want MAJOR:MINOR"))?;
    let hex = |x: &str| u32::from_str_radix(if x.is_empty() { "0" } else { x }, 16);
    match (hex(maj), hex(min)) {
        (Ok(a), Ok(b)) if a <= 0xFFFF && b <= 0xFFFF => Ok(a << 16 | b),
        _ => Err(format!(
            "`{s}`: want hexadecimal MAJOR:MINOR as tc writes it"
        )),
    }
}

fn side(nl: &mut Rtnl, dev: &str, class: Option<u32>) -> Result<KernelSide, String> {
    let ifindex = rtnl::ifindex(dev).map_err(|e| format!("device {dev}: {e}"))?;
    let qdiscs = nl
        .dump(rtnl::RTM_GETQDISC, ifindex)
        .map_err(|e| format!("{dev}: reading its qdiscs: {e}"))?;
    let root = qdiscs.iter().find(|q| q.msg.parent == rtnl::TC_H_ROOT);
    let kind = root.and_then(TcObject::kind).unwrap_or("none");
    match kind {
        "cake" => Ok(KernelSide {
            dev: dev.into(),
            ifindex,
            kind: Kind::Cake,
            handle: root.expect("has a kind").msg.handle,
            parent: rtnl::TC_H_ROOT,
            htb: None,
        }),
        "htb" => {
            let root_handle = root.expect("has a kind").msg.handle;
            let classes = nl
                .dump(rtnl::RTM_GETTCLASS, ifindex)
                .map_err(|e| format!("{dev}: reading its classes: {e}"))?;
            let ours: Vec<&TcObject> = classes
                .iter()
                .filter(|c| c.msg.handle >> 16 == root_handle >> 16)
                .filter(|c| match class {
                    Some(id) => c.msg.handle == id,
                    None => c.msg.parent == rtnl::TC_H_ROOT,
                })
                .collect();
            let [c] = ours[..] else {
                return Err(match class {
                    Some(id) => format!("{dev}: no HTB class {}", handle_text(id)),
                    None => format!(
                        "{dev}: the root HTB has {} top classes; name the shaping one with \
                         --htb-class",
                        ours.len()
                    ),
                });
            };
            let opt = c
                .attr(rtnl::TCA_OPTIONS)
                .and_then(|o| {
                    rtnl::parse_attrs(o)
                        .into_iter()
                        .find(|a| a.0 == TCA_HTB_PARMS)
                })
                .and_then(|a| <[u8; HTB_OPT_LEN]>::try_from(a.1).ok())
                .ok_or_else(|| {
                    format!(
                        "{dev}: class {} without HTB's options",
                        handle_text(c.msg.handle)
                    )
                })?;
            Ok(KernelSide {
                dev: dev.into(),
                ifindex,
                kind: Kind::Htb,
                handle: c.msg.handle,
                parent: c.msg.parent,
                htb: Some(opt),
            })
        }
        other => Err(format!(
            "{dev} has no CAKE or HTB at its root ({other}): set up the shaper first \
             (bloatlab config tc-cake, or sqm-scripts)"
        )),
    }
}

impl KernelSide {
    fn describe(&self) -> String {
        match self.kind {
            Kind::Cake => format!("CAKE on {}", self.dev),
            Kind::Htb => format!("HTB class {} on {}", handle_text(self.handle), self.dev),
        }
    }

    /// What it is and the direction it shapes, as the run's lines name it.
    fn named(&self, dir: &str) -> String {
        format!("{} ({dir})", self.describe())
    }

    fn set(&self, nl: &mut Rtnl, bps: u64, dir: &str) -> Result<(), ShaperError> {
        let bytes = bps / 8;
        let (kind, msg, attrs) = match self.kind {
            // `tc qdisc change dev DEV root cake bandwidth X`: cake_change reads only the
            // attributes present, so the rest of the user's options stay.
            Kind::Cake => (
                rtnl::RTM_NEWQDISC,
                TcMsg {
                    ifindex: self.ifindex,
                    handle: self.handle,
                    parent: rtnl::TC_H_ROOT,
                },
                Attrs::default().string(rtnl::TCA_KIND, "cake").nested(
                    rtnl::TCA_OPTIONS,
                    Attrs::default().u64(TCA_CAKE_BASE_RATE64, bytes),
                ),
            ),
            // htb_change_class takes the whole tc_htb_opt: the one read back, rate and ceil
            // replaced (overhead, mpu, buffers, quantum and prio kept); rates of 2^32 bytes/s
            // and more go in the 64-bit attributes.
            Kind::Htb => {
                let mut opt = self.htb.expect("an HTB side has its options");
                let r32 = bytes.min(u32::MAX as u64) as u32;
                opt[8..12].copy_from_slice(&r32.to_ne_bytes());
                opt[20..24].copy_from_slice(&r32.to_ne_bytes());
                let mut inner = Attrs::default().bytes(TCA_HTB_PARMS, &opt);
                if bytes >= u32::MAX as u64 {
                    inner = inner.u64(TCA_HTB_RATE64, bytes).u64(TCA_HTB_CEIL64, bytes);
                }
                (
                    rtnl::RTM_NEWTCLASS,
                    TcMsg {
                        ifindex: self.ifindex,
                        handle: self.handle,
                        parent: self.parent,
                    },
                    Attrs::default()
                        .string(rtnl::TCA_KIND, "htb")
                        .nested(rtnl::TCA_OPTIONS, inner),
                )
            }
        };
        nl.change(kind, msg, &attrs).map_err(|e| {
            match e.raw_os_error() {
                // Not found, another qdisc in its place, of another kind, or the device gone.
                Some(libc::ENOENT | libc::EEXIST | libc::EINVAL | libc::ENODEV) => {
                    ShaperError::Gone(format!(
                        "{} was removed or replaced ({e}): no longer changing it",
                        self.named(dir)
                    ))
                }
                _ => ShaperError::Failed(format!("{}: {e}", self.named(dir))),
            }
        })
    }
}

impl Shaper for Kernel {
    fn describe(&self) -> String {
        let side = |s: &Option<KernelSide>, d: &str| s.as_ref().map(|s| s.named(d));
        [side(&self.up, "up"), side(&self.down, "down")]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and ")
    }

    fn set(&mut self, dir: Direction, bps: u64) -> Result<(), ShaperError> {
        let (side, name) = match dir {
            Direction::Up => (&self.up, "up"),
            Direction::Down => (&self.down, "down"),
        };
        match side {
            Some(s) => s.set(&mut self.nl, bps, name),
            None => Ok(()),
        }
    }

    fn carried(&mut self) -> Result<(u64, u64), String> {
        let read = |c: &mut DevCounter| c.read().map_err(|e| format!("{}: {e}", c.path()));
        Ok((read(&mut self.wan_rx)?, read(&mut self.wan_tx)?))
    }

    /// The same qdisc (CAKE) or class (HTB) on each side, read again: a class put back with
    /// other options is driven with those.
    fn present(&mut self) -> bool {
        let nl = &mut self.nl;
        [&mut self.up, &mut self.down]
            .into_iter()
            .flatten()
            .all(|s| {
                let class = (s.kind == Kind::Htb).then_some(s.handle);
                match side(nl, &s.dev, class) {
                    Ok(now) if (now.kind, now.handle) == (s.kind, s.handle) => {
                        *s = now;
                        true
                    }
                    _ => false,
                }
            })
    }
}

/// The lab's emulated CAKE on one link (`lab set LINK --dir D bandwidth=...`), each way.
#[derive(Clone)]
pub struct Lab {
    pub socket: PathBuf,
    pub lab: String,
    pub link: String,
    /// The link's direction that carries the upload ("up" or "down"), the other the download.
    pub up_dir: &'static str,
}

impl Lab {
    fn down_dir(&self) -> &'static str {
        if self.up_dir == "up" {
            "down"
        } else {
            "up"
        }
    }

    fn request(&self, dir: &str, settings: Vec<(String, String)>) -> Result<(), String> {
        let req = bloatlab_lab::control::Request::Set {
            link: self.link.clone(),
            dir: dir.into(),
            settings,
        };
        match bloatlab_lab::control::request(&self.socket, &req)? {
            r if r.ok => Ok(()),
            r => Err(r.message.unwrap_or_else(|| "refused".into())),
        }
    }
}

impl Shaper for Lab {
    fn describe(&self) -> String {
        format!("lab {}'s CAKE on link {}", self.lab, self.link)
    }

    fn set(&mut self, dir: Direction, bps: u64) -> Result<(), ShaperError> {
        let d = match dir {
            Direction::Up => self.up_dir,
            Direction::Down => self.down_dir(),
        };
        let kbit = (bps as f64 / 1000.0).round().max(1.0);
        self.request(d, vec![("bandwidth".into(), format!("{kbit}kbit"))])
            .map_err(|e| {
                if e.contains("only a cake qdisc") {
                    ShaperError::Gone(format!(
                        "{}: the CAKE was removed ({e}): no longer changing it",
                        self.describe()
                    ))
                } else {
                    ShaperError::Failed(format!("{}: {e}", self.describe()))
                }
            })
    }

    fn carried(&mut self) -> Result<(u64, u64), String> {
        let s = bloatlab_lab::control::counters(&self.socket)?;
        let l = s
            .links
            .get(&self.link)
            .ok_or_else(|| format!("lab {} has no link {}", self.lab, self.link))?;
        let (up, down) = if self.up_dir == "up" {
            (&l.up, &l.down)
        } else {
            (&l.down, &l.up)
        };
        Ok((down.tx_bytes, up.tx_bytes))
    }

    fn present(&mut self) -> bool {
        bloatlab_lab::control::counters(&self.socket).is_ok_and(|s| {
            s.links
                .get(&self.link)
                .is_some_and(|l| l.up.cake.is_some() && l.down.cake.is_some())
        })
    }
}
