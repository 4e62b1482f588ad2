//! `tune apply --sysctl`: the page-cache thresholds (vm.dirty_*). They are global, not per
//! network namespace, so every change is recorded before it is made and undone from that
//! record: by `tune rollback --sysctl`, or at once when a verified change did not help. The
//! directory is a parameter (`/proc/sys/vm` in use) so tests can run on a copy.

use serde::{Deserialize, Serialize};
use std::path::Path;

pub const VM_DIR: &str = "/proc/sys/vm";
const RECORD: &str = "sysctl.json";

/// The four thresholds: each `_bytes` setting and its `_ratio` twin, one of which is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dirty {
    pub background_ratio: u64,
    pub background_bytes: u64,
    pub ratio: u64,
    pub bytes: u64,
}

fn read_one(dir: &Path, name: &str) -> Result<u64, String> {
    let p = dir.join(name);
    std::fs::read_to_string(&p)
        .map_err(|e| format!("{}: {e}", p.display()))?
        .trim()
        .parse()
        .map_err(|e| format!("{}: {e}", p.display()))
}

fn write_one(dir: &Path, name: &str, v: u64) -> Result<(), String> {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).map_err(|e| format!("writing {} to {}: {e}", v, p.display()))
}

impl Dirty {
    pub fn read(dir: &Path) -> Result<Dirty, String> {
        Ok(Dirty {
            background_ratio: read_one(dir, "dirty_background_ratio")?,
            background_bytes: read_one(dir, "dirty_background_bytes")?,
            ratio: read_one(dir, "dirty_ratio")?,
            bytes: read_one(dir, "dirty_bytes")?,
        })
    }

    /// Writes the settings back. The kernel zeroes a `_ratio` when its `_bytes` twin is
    /// written and the other way round, so of each pair only the non-zero one is written.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let pair = |ratio: (&str, u64), bytes: (&str, u64)| {
            if bytes.1 > 0 {
                write_one(dir, bytes.0, bytes.1)
            } else {
                write_one(dir, ratio.0, ratio.1)
            }
        };
        pair(
            ("dirty_background_ratio", self.background_ratio),
            ("dirty_background_bytes", self.background_bytes),
        )?;
        pair(("dirty_ratio", self.ratio), ("dirty_bytes", self.bytes))
    }

    pub fn describe(&self) -> String {
        let one = |ratio: u64, bytes: u64| {
            if bytes > 0 {
                format!("{bytes} B")
            } else {
                format!("{ratio}%")
            }
        };
        format!(
            "background {}, throttle {}",
            one(self.background_ratio, self.background_bytes),
            one(self.ratio, self.bytes)
        )
    }
}

/// The two byte thresholds from a `bloatlab config sysctl-writeback` file (or any file of
/// `vm.dirty_background_bytes = N` and `vm.dirty_bytes = N` lines; `#` comments).
pub fn parse_config(text: &str) -> Result<(u64, u64), String> {
    let (mut bg, mut fg) = (None, None);
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(format!("line {}: want `key = value`", i + 1));
        };
        let v: u64 = v
            .trim()
            .parse()
            .map_err(|_| format!("line {}: `{}` is not a number of bytes", i + 1, v.trim()))?;
        match k.trim() {
            "vm.dirty_background_bytes" => bg = Some(v),
            "vm.dirty_bytes" => fg = Some(v),
            other => {
                return Err(format!(
                    "line {}: `{other}`: only vm.dirty_background_bytes and \
                vm.dirty_bytes are applied here",
                    i + 1
                ))
            }
        }
    }
    match (bg, fg) {
        (Some(b), Some(f)) if b > 0 && f > b => Ok((b, f)),
        (Some(_), Some(_)) => Err("want 0 < vm.dirty_background_bytes < vm.dirty_bytes".into()),
        _ => Err("the file must set both vm.dirty_background_bytes and vm.dirty_bytes".into()),
    }
}

/// What was there before a change, kept until it is rolled back or kept for good.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub before: Dirty,
    pub applied: Dirty,
}

/// Records the current settings in `state_dir`, then sets the two byte thresholds. Refuses
/// while an earlier change is recorded (roll that back first).
pub fn apply(
    vm: &Path,
    state_dir: &Path,
    background_bytes: u64,
    bytes: u64,
) -> Result<Record, String> {
    let rec_path = state_dir.join(RECORD);
    if rec_path.exists() {
        return Err(format!(
            "an earlier tune apply --sysctl is recorded in {}: tune rollback --sysctl first",
            rec_path.display()
        ));
    }
    let before = Dirty::read(vm)?;
    let applied = Dirty {
        background_ratio: 0,
        background_bytes,
        ratio: 0,
        bytes,
    };
    let rec = Record { before, applied };
    std::fs::create_dir_all(state_dir).map_err(|e| format!("{}: {e}", state_dir.display()))?;
    std::fs::write(
        &rec_path,
        serde_json::to_vec_pretty(&rec).expect("plain data"),
    )
    .map_err(|e| format!("{}: {e}", rec_path.display()))?;
    if let Err(e) = applied.write(vm) {
        let _ = before.write(vm);
        let _ = std::fs::remove_file(&rec_path);
        return Err(e);
    }
    Ok(rec)
}

/// Puts back what the record says was there, and forgets the record.
pub fn rollback(vm: &Path, state_dir: &Path) -> Result<String, String> {
    let rec_path = state_dir.join(RECORD);
    let text = std::fs::read(&rec_path)
        .map_err(|_| "nothing to roll back: no tune apply --sysctl is recorded".to_string())?;
    let rec: Record =
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", rec_path.display()))?;
    rec.before.write(vm)?;
    std::fs::remove_file(&rec_path).map_err(|e| format!("{}: {e}", rec_path.display()))?;
    Ok(format!("restored {}", rec.before.describe()))
}

/// Keeps the applied settings: the record goes, so no rollback will undo them.
pub fn keep(state_dir: &Path) -> Result<(), String> {
    std::fs::remove_file(state_dir.join(RECORD))
        .map_err(|e| format!("{}: {e}", state_dir.display()))
}

pub fn status(vm: &Path, state_dir: &Path) -> Result<String, String> {
    let now = Dirty::read(vm)?.describe();
    Ok(
        match std::fs::read(state_dir.join(RECORD))
            .ok()
            .and_then(|t| serde_json::from_slice::<Record>(&t).ok())
        {
            Some(r) => format!(
                "now {now}; applied by bloatlab over {} (tune rollback --sysctl restores it)",
                r.before.describe()
            ),
            None => format!("now {now}; nothing recorded by bloatlab"),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain directory standing in for /proc/sys/vm (it does not zero twins as the kernel
    /// does; the writeback test checks that on the real one).
    fn fake_vm(tag: &str, d: Dirty) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("bloatlab-vm-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (k, v) in [
            ("dirty_background_ratio", d.background_ratio),
            ("dirty_background_bytes", d.background_bytes),
            ("dirty_ratio", d.ratio),
            ("dirty_bytes", d.bytes),
        ] {
            std::fs::write(dir.join(k), format!("{v}\n")).unwrap();
        }
        dir
    }

    #[test]
    fn apply_records_refuses_twice_and_rollback_restores() {
        let defaults = Dirty {
            background_ratio: 10,
            background_bytes: 0,
            ratio: 20,
            bytes: 0,
        };
        let vm = fake_vm("apply", defaults);
        let state = vm.join("state");
        let rec = apply(&vm, &state, 33_554_432, 201_326_592).unwrap();
        assert_eq!(rec.before, defaults);
        assert_eq!(read_one(&vm, "dirty_background_bytes").unwrap(), 33_554_432);
        assert_eq!(read_one(&vm, "dirty_bytes").unwrap(), 201_326_592);
        assert!(apply(&vm, &state, 1, 2)
            .unwrap_err()
            .contains("tune rollback --sysctl first"));
        assert!(status(&vm, &state)
            .unwrap()
            .contains("over background 10%, throttle 20%"));
        assert_eq!(
            rollback(&vm, &state).unwrap(),
            "restored background 10%, throttle 20%"
        );
        assert_eq!(
            (
                read_one(&vm, "dirty_background_ratio").unwrap(),
                read_one(&vm, "dirty_ratio").unwrap()
            ),
            (10, 20)
        );
        assert!(rollback(&vm, &state)
            .unwrap_err()
            .contains("nothing to roll back"));
        let _ = std::fs::remove_dir_all(&vm);
    }

    #[test]
    fn config_files_give_both_thresholds_or_an_error() {
        let text = crate::config::sysctl_writeback(1 << 30, 250_000_000, 1_500_000_000);
        assert_eq!(parse_config(&text), Ok((33_554_432, 201_326_592)));
        assert!(parse_config("vm.dirty_bytes = 5\n")
            .unwrap_err()
            .contains("both"));
        assert!(parse_config("vm.swappiness = 10\n")
            .unwrap_err()
            .contains("only vm.dirty_background_bytes"));
        assert!(parse_config("vm.dirty_background_bytes = 9\nvm.dirty_bytes = 5\n").is_err());
    }
}
