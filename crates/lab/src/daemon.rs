//! A lab's life as a background process: `lab up` starts one (forked, in its own process
//! group, errors to a log), `lab down` ends it, `lab run` keeps one for the length of a
//! command, and every other command finds the lab it means.

use crate::control::{self, Request};
use crate::instance::{self, LabInfo};
use crate::{presets, Lab, Topology, SOCKET_ENV};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A preset's name or a TOML file, as a topology.
pub fn load(arg: &str) -> Result<Topology, String> {
    let text = match presets::get(arg) {
        Some(t) => t.to_string(),
        None => std::fs::read_to_string(arg).map_err(|e| {
            let names: Vec<&str> = presets::PRESETS.iter().map(|p| p.0).collect();
            format!(
                "`{arg}` is neither a preset ({}) nor a readable file: {e}",
                names.join(", ")
            )
        })?,
    };
    Topology::from_toml(&text, &presets::read_file).map_err(|e| e.to_string())
}

/// The lab meant by `name`; else the one whose socket BLOATLAB_LAB_SOCKET names (inside `lab
/// run`, with other labs up beside it); else the only one running.
pub fn find(name: Option<&str>) -> Result<LabInfo, String> {
    let live: Vec<LabInfo> = instance::running()
        .into_iter()
        .filter(|(_, alive)| *alive)
        .map(|(i, _)| i)
        .collect();
    match (name, std::env::var_os(SOCKET_ENV).map(PathBuf::from)) {
        (Some(n), _) => live
            .into_iter()
            .find(|i| i.name == n)
            .ok_or_else(|| format!("no running lab named {n}")),
        (None, Some(socket)) => live
            .into_iter()
            .find(|i| i.socket == socket)
            .ok_or_else(|| {
                format!(
                    "{SOCKET_ENV} names {}, the socket of no running lab",
                    socket.display()
                )
            }),
        (None, None) => match live.len() {
            0 => Err("no lab is running; start one with `bloatlab lab up cable`".into()),
            1 => Ok(live.into_iter().next().expect("one")),
            _ => Err(format!(
                "several labs are up ({}); choose one with --lab",
                live.iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }
}

/// Where a background lab writes its errors; removed when it ends cleanly.
pub fn log_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("bloatlab-lab-{name}.log"))
}

/// Builds the lab and serves its control socket until `lab down` or `stop`.
pub fn serve(topo: Topology, name: &str, stop: &AtomicBool) -> Result<(), String> {
    let lab = Lab::up(topo, name).map_err(|e| e.to_string())?;
    let down = Arc::new(AtomicBool::new(false));
    let socket = lab.info().socket.clone();
    let ctl = control::serve(lab.shared.clone(), &socket, lab.stop_flag(), down.clone())
        .map_err(|e| format!("control socket: {e}"))?;
    while !stop.load(Ordering::Relaxed) && !down.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(lab);
    let _ = ctl.join();
    Ok(())
}

/// Starts the lab as a background process and returns once its control socket answers (or
/// with the error it died of). Forks, so it must be called before this process starts
/// threads; the child gets a process group of its own (Ctrl-C in this terminal is not for
/// it), stdin and stdout on /dev/null, stderr in `log_path(name)`, and `stop()` as its stop
/// flag (the caller's signal handling).
pub fn start(
    topo: Topology,
    name: &str,
    stop: impl FnOnce() -> Arc<AtomicBool>,
) -> Result<LabInfo, String> {
    let log = log_path(name);
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
    // SAFETY: fork in a process with one thread (documented above); the child only runs this
    // crate's code and leaves through `exit`.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!(
            "cannot start the lab process: {}",
            std::io::Error::last_os_error()
        ));
    }
    if pid == 0 {
        use std::os::fd::AsRawFd;
        // SAFETY: plain calls on descriptors this child owns.
        unsafe {
            libc::setpgid(0, 0);
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
            libc::dup2(log_file.as_raw_fd(), 2);
            // A peer resetting a connection mid-write costs that connection, not the lab.
            libc::signal(libc::SIGPIPE, libc::SIG_IGN);
        }
        let code = match serve(topo, name, &stop()) {
            Ok(()) => {
                let _ = std::fs::remove_file(&log);
                0
            }
            Err(e) => {
                eprintln!("bloatlab lab: {e}");
                1
            }
        };
        std::process::exit(code);
    }
    for _ in 0..300 {
        let mut status = 0;
        // SAFETY: non-blocking wait for our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            let why = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(why.trim().trim_start_matches("bloatlab lab: ").to_string());
        }
        if let Some((info, true)) = instance::running()
            .into_iter()
            .find(|(i, _)| i.name == name)
        {
            if info.socket.exists() {
                return Ok(info);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: signal to the child forked above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    Err(format!(
        "the lab did not come up in 15 s; see {}",
        log.display()
    ))
}

/// Asks a lab to stop and waits (10 s at most) for its process to finish the teardown.
pub fn down(info: &LabInfo) -> Result<(), String> {
    control::request(&info.socket, &Request::Down)?;
    for _ in 0..100 {
        if !instance::running()
            .iter()
            .any(|(i, alive)| i.name == info.name && *alive)
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "lab {} did not stop; try `bloatlab lab down --all`",
        info.name
    ))
}

/// Every lab's remains: processes, namespaces, devices, state and logs (also after a
/// SIGKILL). What was removed, one item a line.
pub fn down_all() -> Vec<String> {
    let names: Vec<String> = instance::running()
        .into_iter()
        .map(|(i, _)| i.name)
        .collect();
    let mut removed = instance::down_all();
    // A killed lab's log outlives it; once its remains are gone, so is the log.
    for log in names.iter().map(|n| log_path(n)) {
        if std::fs::remove_file(&log).is_ok() {
            removed.push(format!("log {}", log.display()));
        }
    }
    removed
}

/// Builds the lab, tells `on_up`, runs `cmd` (in this namespace, with BLOATLAB_LAB_SOCKET set
/// so `lab exec` finds the lab) and tears the lab down when it ends.
pub fn run(
    topo: Topology,
    name: &str,
    cmd: &[String],
    on_up: impl FnOnce(&LabInfo),
) -> Result<ExitStatus, String> {
    let (prog, args) = cmd.split_first().ok_or("no command to run")?;
    let lab = Lab::up(topo, name).map_err(|e| e.to_string())?;
    let down = Arc::new(AtomicBool::new(false));
    let socket = lab.info().socket.clone();
    control::serve(lab.shared.clone(), &socket, lab.stop_flag(), down)
        .map_err(|e| format!("control socket: {e}"))?;
    on_up(lab.info());
    let status = Command::new(prog)
        .args(args)
        .env(SOCKET_ENV, &socket)
        .status()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    drop(lab);
    Ok(status)
}

/// Replaces this process with `cmd` inside lab host `host`; returns only on failure.
pub fn exec(info: &LabInfo, host: &str, cmd: &[String]) -> String {
    let Some(h) = info.hosts.get(host) else {
        return format!(
            "lab {} has no host {host} (hosts: {})",
            info.name,
            info.hosts.keys().cloned().collect::<Vec<_>>().join(", ")
        );
    };
    let err = Command::new("ip")
        .args(["netns", "exec", &h.namespace])
        .args(cmd)
        .env(SOCKET_ENV, &info.socket)
        .exec();
    format!(
        "cannot run {}: {err}",
        cmd.first().map_or("", String::as_str)
    )
}

/// `KEY=VALUE` words as pairs.
pub fn parse_settings(settings: &[String]) -> Result<Vec<(String, String)>, String> {
    settings
        .iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => Err(format!("`{s}` is not key=value")),
        })
        .collect()
}

/// Changes a link of a running lab; the lab's answer.
pub fn set(
    socket: &Path,
    link: String,
    dir: String,
    kv: Vec<(String, String)>,
) -> Result<String, String> {
    let req = Request::Set {
        link,
        dir,
        settings: kv,
    };
    match control::request(socket, &req)? {
        r if r.ok => Ok(r.message.unwrap_or_default()),
        r => Err(r.message.unwrap_or_default()),
    }
}
