//! autorate's log file (shell): JSON lines, each written whole; at its size cap it moves to
//! FILE.1 (the one before is dropped) and starts again with the header, as a router's tmpfs
//! needs (cake-autorate rotates at 2000 KB). A write that fails (a full disk) is said once and
//! undone to the last whole line; the loop goes on, and so does the log once it can write.

use crate::run::Say;
use bloatlab_result::autorate::LogHeader;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub struct Log {
    file: Option<LogFile>,
    say: Say,
}

struct LogFile {
    path: PathBuf,
    f: File,
    /// Bytes of whole lines in the file.
    len: u64,
    /// Its size cap (0: none).
    max: u64,
    header: String,
    failing: bool,
}

/// `path` with `.1` after its name.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

impl Log {
    /// Creates the file (an error here is the caller's to report: a path that cannot be
    /// written) and writes the header.
    pub fn open(
        path: Option<&Path>,
        max: u64,
        header: &LogHeader,
        say: Say,
    ) -> std::io::Result<Log> {
        let file = match path {
            Some(p) => Some(LogFile {
                path: p.to_path_buf(),
                f: File::create(p)?,
                len: 0,
                max,
                header: serde_json::to_string(header).expect("the header serialises") + "\n",
                failing: false,
            }),
            None => None,
        };
        let mut log = Log { file, say };
        if let Some(h) = log.file.as_ref().map(|l| l.header.clone()) {
            log.write(&h);
        }
        Ok(log)
    }

    pub fn line(&mut self, value: &impl serde::Serialize) {
        if self.file.is_some() {
            let text = serde_json::to_string(value).expect("log lines serialise") + "\n";
            self.write(&text);
        }
    }

    fn write(&mut self, text: &str) {
        let Some(l) = self.file.as_mut() else {
            return;
        };
        if l.max > 0 && l.len > 0 && l.len + text.len() as u64 > l.max {
            if let Err(e) = l.rotate() {
                if !l.failing {
                    (self.say)(&format!("log {}: cannot rotate: {e}", l.path.display()));
                }
            }
        }
        match l.f.write_all(text.as_bytes()) {
            Ok(()) => {
                l.len += text.len() as u64;
                if l.failing {
                    l.failing = false;
                    (self.say)(&format!("log {}: writing again", l.path.display()));
                }
            }
            Err(e) => {
                // A line cut short in the middle of the file would stop a reader there.
                let _ = l.f.set_len(l.len);
                let _ = l.f.seek(SeekFrom::Start(l.len));
                if !l.failing {
                    l.failing = true;
                    (self.say)(&format!(
                        "log {}: {e}; lines are lost until it can write again",
                        l.path.display()
                    ));
                }
            }
        }
    }
}

impl LogFile {
    fn rotate(&mut self) -> std::io::Result<()> {
        std::fs::rename(&self.path, rotated(&self.path))?;
        self.f = File::create(&self.path)?;
        self.len = 0;
        self.f.write_all(self.header.as_bytes())?;
        self.len = self.header.len() as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_result::autorate::{read_log, LogLine, FORMAT, VERSION};
    use std::sync::{Arc, Mutex};

    fn header() -> LogHeader {
        LogHeader {
            format: FORMAT.into(),
            version: VERSION,
            bloatlab_version: "0".into(),
            started_unix: 1.8e9,
            target: "server.example".into(),
            reflectors: Vec::new(),
            shaper: "CAKE on wan (up)".into(),
            law: "bloatlab".into(),
            down_bounds: [1e6, 2e6, 3e6],
            up_bounds: [1e6, 2e6, 3e6],
            probe_rate: 20.0,
        }
    }

    fn tick(t: f64) -> LogLine {
        LogLine {
            t,
            event: "tick".into(),
            dir: None,
            why: None,
            down_bps: 2e6,
            up_bps: 2e6,
            down_load_bps: 0.0,
            up_load_bps: 0.0,
            down_delta_ms: Some(1.0),
            up_delta_ms: Some(1.0),
            rtt_delta_ms: None,
            detail: None,
            answered: 20,
            lost: 0,
        }
    }

    fn said() -> (Say, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        (
            Arc::new(move |s: &str| l.lock().unwrap().push(s.to_string())),
            lines,
        )
    }

    #[test]
    fn at_its_cap_the_log_moves_to_dot_one_and_both_files_read_whole() {
        let dir = std::env::temp_dir().join(format!("bloatlab-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("autorate.jsonl");
        let (say, _) = said();
        let mut log = Log::open(Some(&path), 4000, &header(), say).unwrap();
        for i in 0..60 {
            log.line(&tick(f64::from(i)));
        }
        let read = |p: &Path| read_log(&std::fs::read_to_string(p).unwrap()).unwrap();
        let (now, old) = (read(&path), read(&rotated(&path)));
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        assert!(size(&path) <= 4000 && size(&rotated(&path)) <= 4000);
        // The newest lines in the file, those before them in .1, in order and none lost
        // between the two (older rotations are dropped).
        let (first_now, last_old) = (now.1[0].t, old.1.last().unwrap().t);
        assert_eq!(first_now, last_old + 1.0);
        assert_eq!(now.1.last().unwrap().t, 59.0);
        assert_eq!(now.0.started_unix, 1.8e9, "the header starts each file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_disk_is_said_once_and_the_run_goes_on() {
        let (say, lines) = said();
        let mut log = Log::open(Some(Path::new("/dev/full")), 0, &header(), say).unwrap();
        for i in 0..10 {
            log.line(&tick(f64::from(i)));
        }
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("No space left on device"), "{lines:?}");
    }
}
