//! The control socket of a running lab: JSON lines over a Unix socket, for `lab set`,
//! `lab stats`, `lab down` and for bloatlab tests that record the emulator's counters.

use crate::instance::Shared;
use bloatlab_result::lab::{LabCounters, LabStats};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Stats,
    Set {
        link: String,
        dir: String,
        settings: Vec<(String, String)>,
    },
    Down,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<LabStats>,
}

/// Serves requests until `stop` is set; a `down` request sets `down`.
pub fn serve(
    shared: Arc<Shared>,
    path: &Path,
    stop: Arc<AtomicBool>,
    down: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("lab-control".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                        handle(s, &shared, &down);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        })
}

fn handle(s: UnixStream, shared: &Shared, down: &AtomicBool) {
    let mut line = String::new();
    let Ok(mut w) = s.try_clone() else { return };
    if BufReader::new(s)
        .take(1 << 20)
        .read_line(&mut line)
        .is_err()
    {
        return;
    }
    let resp = match serde_json::from_str::<Request>(&line) {
        Err(e) => Response {
            ok: false,
            message: Some(format!("bad request: {e}")),
            stats: None,
        },
        Ok(Request::Stats) => Response {
            ok: true,
            message: None,
            stats: Some(shared.stats()),
        },
        Ok(Request::Set {
            link,
            dir,
            settings,
        }) => match shared.set(&link, &dir, &settings) {
            Ok(m) => Response {
                ok: true,
                message: Some(m),
                stats: None,
            },
            Err(m) => Response {
                ok: false,
                message: Some(m),
                stats: None,
            },
        },
        Ok(Request::Down) => {
            down.store(true, Ordering::Relaxed);
            Response {
                ok: true,
                message: Some("going down".into()),
                stats: None,
            }
        }
    };
    let mut out = serde_json::to_vec(&resp).expect("plain data");
    out.push(b'\n');
    let _ = w.write_all(&out);
}

use std::io::Read;

/// Sends one request to the lab listening at `path`.
pub fn request(path: &Path, req: &Request) -> Result<Response, String> {
    let mut s = UnixStream::connect(path)
        .map_err(|e| format!("cannot reach the lab at {}: {e}", path.display()))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = serde_json::to_vec(req).expect("plain data");
    line.push(b'\n');
    s.write_all(&line).map_err(|e| e.to_string())?;
    let mut resp = String::new();
    BufReader::new(s)
        .read_line(&mut resp)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&resp).map_err(|e| format!("bad answer from the lab: {e}"))
}

/// The counters of the lab listening at `socket`, for a result file.
pub fn counters(socket: &Path) -> Result<LabStats, String> {
    match request(socket, &Request::Stats)? {
        Response {
            ok: true,
            stats: Some(s),
            ..
        } => Ok(s),
        r => Err(r
            .message
            .unwrap_or_else(|| "no counters in the answer".into())),
    }
}

/// Inside a lab, the emulator's counters go into the test's result file: ground truth next to
/// the measurement. They count from the lab's start, so both ends of the test are kept (the
/// difference is what this test saw). `at_start` was read before the test; the file at `path`
/// is rewritten with both.
pub fn attach_counters(
    socket: &Path,
    result: &mut bloatlab_result::ResultFile,
    path: &Path,
    at_start: Option<LabStats>,
) -> Result<(), String> {
    let at_end = counters(socket).map_err(|e| format!("lab counters unavailable: {e}"))?;
    let lab = LabCounters { at_start, at_end };
    // A lab that could not forward what the test sent emulated a slower link: the file says so.
    let end = result
        .metadata
        .phases
        .iter()
        .map(|p| p.end)
        .fold(0.0, f64::max);
    for why in lab.fell_behind() {
        result
            .events
            .push(bloatlab_result::Event { t: end, what: why });
    }
    result.metadata.lab = Some(lab);
    bloatlab_result::write_atomic(path, result)
        .map_err(|e| format!("could not add the lab counters to {}: {e}", path.display()))
}
