//! cake-autorate itself (lynxthecat/cake-autorate: its bash script, fping, its defaults)
//! moving the lab's CAKE beside a `lab compare` run (`Fix::CakeAutorateSh`): the peer our
//! controller is measured against, not a re-implementation of its law.
//!
//! It runs on the lab's router as on an OpenWrt router: in the router's namespace (through
//! `ip netns exec`, so that /sys shows the router's devices), pinging reflector addresses on
//! the far side of the line, reading the router's interface counters. The lab's CAKE has no
//! `tc`: a shim named `tc` first on the script's PATH writes each `qdisc change ... cake
//! bandwidth N` it is given into a FIFO, and a thread here sets the lab's CAKE from it through
//! the lab's control socket (one fork and a pipe write a change, where the real tc forks and
//! sends one netlink message).

use crate::Beside;
use bloatlab_autorate::shaper::Shaper;
use bloatlab_autorate::{Bounds, Direction};
use bloatlab_lab::instance::{disown, own, Remain};
use bloatlab_result::autorate::{LogHeader, LogLine, FORMAT, VERSION};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The interface names cake-autorate is told: the router's LAN device carries the download's
/// CAKE (as an ifb would) and the line's device the upload's.
pub struct Interfaces {
    /// The router's device towards the client (the front link).
    pub lan: String,
    /// The router's device towards the line.
    pub wan: String,
}

/// Reflectors it pings: this many addresses on the line's far host (cake-autorate's default
/// keeps 6 pingers; two more let it replace one it judges bad).
pub const REFLECTORS: usize = 8;

/// The reflector addresses (RFC 2544's benchmarking range), added to the far host's line
/// device and routed through the line by the router.
pub fn reflector_addrs() -> Vec<String> {
    (1..=REFLECTORS).map(|i| format!("198.18.0.{i}")).collect()
}

/// One `tc` command as cake-autorate gives it (`qdisc change root dev IF cake bandwidth
/// NKbit`, alone or as a line of `tc -batch`): the interface and the rate in bits per second.
pub fn parse_change(line: &str) -> Option<(&str, u64)> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let ["qdisc", "change", "root", "dev", dev, "cake", "bandwidth", rate] = w.as_slice() else {
        return None;
    };
    let lower = rate.to_ascii_lowercase();
    let (num, scale) = [("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9), ("bit", 1.0)]
        .iter()
        .find_map(|(unit, scale)| lower.strip_suffix(unit).map(|n| (n, *scale)))?;
    let v: f64 = num.parse().ok()?;
    (v.is_finite() && v > 0.0).then_some((*dev, (v * scale).round() as u64))
}

/// What the shim answers to `tc qdisc show dev IF`: cake-autorate reads only `(atm|noatm)
/// overhead N` from it, to size its delay threshold to one packet's time on the wire.
fn qdisc_show(overhead: usize, atm: bool) -> String {
    let framing = if atm { "atm" } else { "noatm" };
    format!("qdisc cake 1: root refcnt 2 bandwidth unlimited {framing} overhead {overhead}")
}

/// The shim: cake-autorate ignores tc's status and output but for `qdisc show`.
const SHIM: &str = r#"#!/bin/sh
# tc for cake-autorate inside bloatlab's lab: its CAKE changes go to the lab (lab compare).
case "$1 $2" in
  "qdisc show") printf '%s\n' "$BLOATLAB_QDISC_SHOW" ;;
  "qdisc change") printf '%s\n' "$*" > "$BLOATLAB_TC_FIFO" ;;
  "-force -batch") cat > "$BLOATLAB_TC_FIFO" ;;
  *) echo "tc in bloatlab's lab: not handled: $*" >&2; exit 1 ;;
esac
"#;

/// The line the reader takes as its end (nothing cake-autorate writes looks like it).
const STOP: &str = "bloatlab: stop";

/// cake-autorate running beside a run; stopped (SIGTERM, as its service would be) when
/// finished or dropped.
pub struct CakeAutorateSh {
    child: Option<Child>,
    reader: Option<Beside<Result<u64, String>>>,
    fifo: PathBuf,
    tmp: PathBuf,
    instance: String,
    log: PathBuf,
    own_log: PathBuf,
}

/// Where to find it and how to run it.
pub struct Launch<'a> {
    /// A checkout of cake-autorate (cake-autorate.sh, defaults.sh, lib.sh).
    pub checkout: &'a Path,
    /// The router's namespace.
    pub namespace: &'a str,
    pub interfaces: Interfaces,
    pub down: Bounds,
    pub up: Bounds,
    /// The line's per-packet overhead and ATM framing, as its CAKE has them.
    pub overhead: usize,
    pub atm: bool,
    /// Our log of its changes (the autorate log format, law `cake-autorate.sh`).
    pub log: PathBuf,
    /// Where its own log is kept once it has stopped.
    pub own_log: PathBuf,
}

/// Whether `checkout` holds cake-autorate and bash and fping are there: why not, in one line.
pub fn check(checkout: &Path) -> Result<(), String> {
    for f in ["cake-autorate.sh", "defaults.sh", "lib.sh"] {
        if !checkout.join(f).is_file() {
            return Err(format!(
                "{}: no {f}: --cake-autorate wants a checkout of lynxthecat/cake-autorate",
                checkout.display()
            ));
        }
    }
    for tool in ["bash", "fping"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
        if !found {
            return Err(format!(
                "cake-autorate needs {tool} (apt-get install {tool})"
            ));
        }
    }
    Ok(())
}

impl CakeAutorateSh {
    /// Starts it, its changes applied to `shaper` until finished.
    pub fn start(
        l: Launch,
        mut shaper: bloatlab_autorate::shaper::Lab,
    ) -> Result<CakeAutorateSh, String> {
        let instance = format!("bloatlab{}", std::process::id());
        let tmp = std::env::temp_dir().join(format!("bloatlab-cake-autorate-{instance}"));
        let io = |what: &str, e: std::io::Error| format!("cake-autorate: {what}: {e}");
        let _ = std::fs::remove_dir_all(&tmp);
        // Removed by our drop, or on an exit that skips it (a second Ctrl-C).
        own(Remain::Dir(tmp.clone()));
        own(Remain::Dir(run_dir(&instance)));
        std::fs::create_dir_all(tmp.join("bin")).map_err(|e| io("temporary directory", e))?;
        let mut me = CakeAutorateSh {
            child: None,
            reader: None,
            fifo: tmp.join("tc.fifo"),
            tmp,
            instance,
            log: l.log.clone(),
            own_log: l.own_log.clone(),
        };
        // Its own files beside its config, as its launcher keeps them.
        for f in ["cake-autorate.sh", "defaults.sh", "lib.sh"] {
            std::fs::copy(l.checkout.join(f), me.tmp.join(f)).map_err(|e| io(f, e))?;
        }
        let shim = me.tmp.join("bin/tc");
        std::fs::write(&shim, SHIM).map_err(|e| io("tc shim", e))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| io("tc shim", e))?;
        let c = std::ffi::CString::new(me.fifo.as_os_str().as_encoded_bytes()).expect("no NUL");
        // SAFETY: a valid C string; mkfifo only creates the file.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(io("FIFO", std::io::Error::last_os_error()));
        }
        let config = me.tmp.join(format!("config.{}.sh", me.instance));
        std::fs::write(&config, config_text(&l, &me.tmp)).map_err(|e| io("config", e))?;

        // Read-write: the reader never sees an end of file between two shim runs.
        let fifo = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&me.fifo)
            .map_err(|e| io("FIFO", e))?;
        let header = LogHeader {
            format: FORMAT.into(),
            version: VERSION,
            bloatlab_version: env!("CARGO_PKG_VERSION").into(),
            started_unix: bloatlab_netio::unix_now(),
            target: String::new(),
            reflectors: reflector_addrs(),
            shaper: shaper.describe(),
            law: "cake-autorate.sh".into(),
            down_bounds: [l.down.min, l.down.base, l.down.max],
            up_bounds: [l.up.min, l.up.base, l.up.max],
            probe_rate: 20.0,
        };
        let mut log = std::fs::File::create(&l.log).map_err(|e| io("log", e))?;
        writeln!(
            log,
            "{}",
            serde_json::to_string(&header).expect("plain data")
        )
        .map_err(|e| io("log", e))?;
        let (lan, wan) = (l.interfaces.lan.clone(), l.interfaces.wan.clone());
        let started = Instant::now();
        me.reader = Some(Beside::spawn(move |_stop| {
            let mut input = BufReader::new(fifo);
            let mut rates = [header.down_bounds[1], header.up_bounds[1]];
            let mut changes = 0;
            loop {
                let mut line = Vec::new();
                // A line is a few dozen bytes; a longer one is cut, never held whole.
                let n = (&mut input)
                    .take(4096)
                    .read_until(b'\n', &mut line)
                    .map_err(|e| format!("cake-autorate's tc FIFO: {e}"))?;
                let line = String::from_utf8_lossy(&line[..n]);
                if n == 0 || line.trim() == STOP {
                    return Ok(changes);
                }
                let Some((dev, bps)) = parse_change(&line) else {
                    continue;
                };
                let (dir, i, name) = if dev == lan {
                    (Direction::Down, 0, "down")
                } else if dev == wan {
                    (Direction::Up, 1, "up")
                } else {
                    continue;
                };
                shaper.set(dir, bps).map_err(|e| e.to_string())?;
                rates[i] = bps as f64;
                changes += 1;
                let entry = LogLine {
                    t: started.elapsed().as_secs_f64(),
                    event: "rate".into(),
                    dir: Some(name.into()),
                    down_bps: rates[0],
                    up_bps: rates[1],
                    ..LogLine::default()
                };
                let text = serde_json::to_string(&entry).expect("plain data");
                writeln!(log, "{text}").map_err(|e| format!("cake-autorate's log: {e}"))?;
            }
        }));

        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![me.tmp.join("bin")];
        dirs.extend(std::env::split_paths(&path));
        let output =
            std::fs::File::create(me.tmp.join("output.txt")).map_err(|e| io("output", e))?;
        let child = Command::new("ip")
            .args(["netns", "exec", l.namespace, "bash"])
            .arg(me.tmp.join("cake-autorate.sh"))
            .arg(&config)
            .env(
                "PATH",
                std::env::join_paths(dirs).map_err(|e| e.to_string())?,
            )
            .env("CAKE_AUTORATE_SCRIPT_PREFIX", &me.tmp)
            .env("BLOATLAB_TC_FIFO", &me.fifo)
            .env("BLOATLAB_QDISC_SHOW", qdisc_show(l.overhead, l.atm))
            // Which counters give the load: not config keys, but read from the environment
            // when set. The download after the line, as the router forwards it to the LAN
            // (before the LAN's CAKE: its drops count here, as an ifb's would not); the upload
            // as it leaves for the line.
            .env("rx_bytes_path", sys_counter(&l.interfaces.lan, "tx_bytes"))
            .env("tx_bytes_path", sys_counter(&l.interfaces.wan, "tx_bytes"))
            // Not under systemd: it logs to its file, as under OpenWrt's procd.
            .env_remove("INVOCATION_ID")
            .stdin(Stdio::null())
            .stdout(output.try_clone().map_err(|e| io("output", e))?)
            .stderr(output)
            // Its own process group: fping and its subshells are stopped with it.
            .process_group(0)
            .spawn()
            .map_err(|e| io("ip netns exec", e))?;
        own(Remain::Group(child.id() as i32));
        me.child = Some(child);
        Ok(me)
    }

    /// Stops it; its log and how many changes it made.
    pub fn finish(mut self) -> Result<(PathBuf, u64), String> {
        let ended = self.stop();
        let changes = self
            .reader
            .take()
            .expect("finished once")
            .finish("cake-autorate's tc reader")??;
        ended?;
        let own = self
            .tmp
            .join(format!("cake-autorate.{}.log", self.instance));
        std::fs::copy(&own, &self.own_log)
            .map_err(|e| format!("cake-autorate's log {}: {e}", own.display()))?;
        Ok((self.log.clone(), changes))
    }

    /// SIGTERM to its group, as its service would; SIGKILL to what is left after 10 s. Its
    /// changes on the way out still reach the lab; then the reader ends. An error when it had
    /// stopped by itself (a config it refused, a tool missing) or would not stop.
    fn stop(&mut self) -> Result<(), String> {
        let mut ended = Ok(());
        if let Some(mut child) = self.child.take() {
            if let Ok(Some(status)) = child.try_wait() {
                ended = Err(format!(
                    "cake-autorate ended by itself during the run ({status}): {}",
                    self.last_words()
                ));
            }
            let group = child.id() as i32;
            // SAFETY: signals to the process group this module started.
            unsafe { libc::kill(-group, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            let stopped = loop {
                match child.try_wait() {
                    Ok(Some(_)) => break true,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    _ => break false,
                }
            };
            // SAFETY: as above; whatever of its group outlived it.
            unsafe { libc::kill(-group, libc::SIGKILL) };
            let _ = child.wait();
            disown(&Remain::Group(group));
            if !stopped && ended.is_ok() {
                ended = Err("cake-autorate did not stop within 10 s of SIGTERM".into());
            }
        }
        // Non-blocking: with the reader gone (it failed) there is no one to wait for.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.fifo)
        {
            let _ = writeln!(f, "{STOP}");
        }
        ended
    }

    /// The end of what it printed and logged, escaped, for an error message.
    fn last_words(&self) -> String {
        let mut text = std::fs::read_to_string(self.tmp.join("output.txt")).unwrap_or_default();
        let log = self
            .tmp
            .join(format!("cake-autorate.{}.log", self.instance));
        text += &std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
        let from = tail.char_indices().rev().nth(600).map_or(0, |(i, _)| i);
        tail[from..].escape_debug().to_string()
    }
}

impl Drop for CakeAutorateSh {
    fn drop(&mut self) {
        let _ = self.stop();
        // The reader ends on the stop line; its thread is joined as `Beside` drops.
        self.reader.take();
        let _ = std::fs::remove_dir_all(&self.tmp);
        let _ = std::fs::remove_dir_all(run_dir(&self.instance));
        let _ = std::fs::remove_dir("/run/cake-autorate");
        disown(&Remain::Dir(self.tmp.clone()));
        disown(&Remain::Dir(run_dir(&self.instance)));
    }
}

/// Where it keeps its FIFOs and state while it runs.
fn run_dir(instance: &str) -> PathBuf {
    Path::new("/run/cake-autorate").join(instance)
}

fn sys_counter(dev: &str, counter: &str) -> String {
    format!("/sys/class/net/{dev}/statistics/{counter}")
}

/// Its config: only what running in the lab needs over its defaults.
fn config_text(l: &Launch, tmp: &Path) -> String {
    let kbit = |bps: f64| (bps / 1e3).round() as u64;
    let mut s = String::new();
    s += &format!("dl_if={}\nul_if={}\n", l.interfaces.lan, l.interfaces.wan);
    for (way, b) in [("dl", &l.down), ("ul", &l.up)] {
        s += &format!(
            "min_{way}_shaper_rate_kbps={}\nbase_{way}_shaper_rate_kbps={}\n\
             max_{way}_shaper_rate_kbps={}\n",
            kbit(b.min),
            kbit(b.base),
            kbit(b.max)
        );
    }
    s += "reflectors=(";
    for a in reflector_addrs() {
        s += &format!("\"{a}\" ");
    }
    s += ")\n";
    s += &format!("log_file_path_override={}\n", tmp.display());
    s += "output_cake_changes=1\n";
    // One log over the whole run, kept beside the results (it rotates every 10 minutes or 2 MB
    // by default, keeping one old file): its logging only, not its law.
    s += "log_file_max_time_mins=1440\nlog_file_max_size_KB=100000\n";
    // It refuses a MIN under its "active" threshold (2000 kbit/s): lowered to the lower MIN,
    // as a user of a slower upload has to.
    let active = kbit(l.down.min.min(l.up.min)).min(2000);
    s += &format!("connection_active_thr_kbps={active}\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_changes_are_read_as_tc_takes_them_and_nothing_else_is() {
        // As cake-autorate writes them (cake-autorate.sh, set_shaper_rates).
        let one = "qdisc change root dev lan cake bandwidth 18750Kbit";
        assert_eq!(parse_change(one), Some(("lan", 18_750_000)));
        assert_eq!(
            parse_change("qdisc change root dev radio cake bandwidth 4.5mbit\n"),
            Some(("radio", 4_500_000))
        );
        for not in [
            "qdisc show dev lan",
            "qdisc change root dev lan cake bandwidth 0Kbit",
            "qdisc change root dev lan cake bandwidth 12",
            "qdisc change root dev lan cake bandwidth NaNkbit",
            "qdisc change root dev lan cake bandwidth 1Kbit overhead 18",
        ] {
            assert_eq!(parse_change(not), None, "{not}");
        }
    }

    #[test]
    fn the_qdisc_it_is_shown_gives_its_packet_size_the_lines_overhead() {
        // cake-autorate's get_max_wire_packet_size_bits matches `(atm|noatm) overhead N`.
        assert!(qdisc_show(18, false).ends_with("noatm overhead 18"));
        assert!(qdisc_show(44, true).ends_with(" atm overhead 44"));
    }
}
