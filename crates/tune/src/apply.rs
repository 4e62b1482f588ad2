//! `tune apply | rollback | status`: the thin shell that runs `ip` and `tc` on a real
//! interface (or one in a network namespace). Before it changes anything it records the
//! interface's state and marks the change as under way, so that a failed batch is undone at
//! once and a killed apply is undone by the next `tune` call; it only ever restores the
//! kernel's default, so it refuses interfaces someone else has configured.

use crate::batch::{self, Steps};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

pub const STATE_DIR: &str = "/run/bloatlab/tune";

/// Whether this kernel can run a qdisc: built in, loaded, or a module modprobe would find.
pub fn kernel_has(qdisc: &str) -> bool {
    let module = format!("sch_{qdisc}");
    std::path::Path::new(&format!("/sys/module/{module}")).exists()
        || Command::new("modprobe")
            .args(["-n", "-q", &module])
            .status()
            .is_ok_and(|s| s.success())
}

#[derive(Clone, Debug, PartialEq)]
pub struct Iface {
    pub dev: String,
    pub netns: Option<String>,
}

/// What is recorded while a change is under way and once it is applied.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Record {
    pub dev: String,
    pub netns: Option<String>,
    /// "applying" until the batch went through, then "applied".
    pub status: String,
    pub before: Value,
    pub creates: Vec<String>,
    pub script: String,
    pub applied_at: String,
}

impl Iface {
    fn command(&self, prog: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, prog]);
                c
            }
            None => Command::new(prog),
        }
    }

    fn run(&self, prog: &str, args: &[&str]) -> Result<String, String> {
        let out = self
            .command(prog)
            .args(args)
            .output()
            .map_err(|e| format!("cannot run {prog}: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "`{prog} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .replace('\n', "; ")
            ))
        }
    }

    fn state_file(&self) -> PathBuf {
        PathBuf::from(STATE_DIR).join(format!(
            "{}-{}.json",
            self.netns.as_deref().unwrap_or("host"),
            self.dev
        ))
    }

    fn exists(&self, dev: &str) -> bool {
        self.run("ip", &["link", "show", "dev", dev]).is_ok()
    }

    /// The qdiscs of the interface, as `tc -j -d qdisc show` gives them (classes and filters
    /// hang off these and go with them).
    pub fn snapshot(&self) -> Result<Value, String> {
        let text = self.run("tc", &["-j", "-d", "qdisc", "show", "dev", &self.dev])?;
        serde_json::from_str(&text).map_err(|e| format!("tc -j output: {e}"))
    }
}

/// The kernel's own state: a root qdisc tc did not set up (handle 0:, or mq's children) and
/// no ingress qdisc.
pub fn is_default(qdiscs: &Value) -> bool {
    qdiscs.as_array().is_some_and(|a| {
        a.iter().all(|q| {
            let handle = q["handle"].as_str().unwrap_or("");
            q["kind"] != "ingress"
                && q["kind"] != "clsact"
                && (handle == "0:"
                    || q["parent"]
                        .as_str()
                        .is_some_and(|p| p.starts_with(&handle_of_mq(a))))
        })
    })
}

fn handle_of_mq(a: &[Value]) -> String {
    a.iter()
        .find(|q| q["kind"] == "mq" && q["root"] == true)
        .and_then(|q| q["handle"].as_str())
        .unwrap_or("0:")
        .to_string()
}

fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

fn write_record(path: &PathBuf, r: &Record) -> Result<(), String> {
    std::fs::create_dir_all(STATE_DIR).map_err(|e| format!("{STATE_DIR}: {e}"))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(r).expect("serializes"))
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn read_record(path: &PathBuf) -> Option<Record> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// Back to the kernel's default: root and ingress qdiscs removed, the devices the change
/// created deleted; then checks that the interface is as recorded before.
fn restore(i: &Iface, creates: &[String], before: &Value) -> Result<(), String> {
    // "No such file" errors: that part was never applied.
    let _ = i.run("tc", &["qdisc", "del", "dev", &i.dev, "root"]);
    let _ = i.run("tc", &["qdisc", "del", "dev", &i.dev, "ingress"]);
    for d in creates {
        if i.exists(d) {
            i.run("ip", &["link", "del", d])?;
        }
    }
    let after = i.snapshot()?;
    if &after != before {
        return Err(format!(
            "{} is not as it was before: now {after}, before {before}",
            i.dev
        ));
    }
    Ok(())
}

/// A change left half-done by a killed apply is undone first.
fn recover(i: &Iface) -> Result<Option<String>, String> {
    let path = i.state_file();
    match read_record(&path) {
        Some(r) if r.status == "applying" => {
            restore(i, &r.creates, &r.before)?;
            let _ = std::fs::remove_file(&path);
            Ok(Some(format!(
                "an earlier apply on {} was interrupted ({}); undone",
                i.dev, r.applied_at
            )))
        }
        _ => Ok(None),
    }
}

/// Where a test may stop the process between steps (`BLOATLAB_TUNE_FAULT=after-ip`), as a
/// kill would: the recovery path must then restore the interface.
fn fault_point(step: &str) {
    if std::env::var("BLOATLAB_TUNE_FAULT").is_ok_and(|v| v == step) {
        std::process::abort();
    }
}

/// Whether `apply` would take the interface: it exists, bloatlab has not shaped it already,
/// and it is in the kernel's default state (an apply a kill left half-done is undone first;
/// what that said is returned).
pub fn check(i: &Iface) -> Result<Vec<String>, String> {
    if !i.exists(&i.dev) {
        return Err(format!(
            "no interface {}{}",
            i.dev,
            i.netns
                .as_ref()
                .map_or(String::new(), |n| format!(" in namespace {n}"))
        ));
    }
    let said: Vec<String> = recover(i)?.into_iter().collect();
    let path = i.state_file();
    if read_record(&path).is_some_and(|r| r.status == "applied") {
        return Err(format!(
            "bloatlab already shaped {}: `bloatlab tune rollback --dev {}` first",
            i.dev, i.dev
        ));
    }
    let before = i.snapshot()?;
    if !is_default(&before) {
        return Err(format!(
            "{} already has a qdisc configuration that bloatlab did not make ({}): rollback could \
                not restore it exactly. Remove it first (tc qdisc del dev {0} root; tc qdisc del \
                dev {0} ingress)",
            i.dev,
            before
                .as_array()
                .map(|a| a
                    .iter()
                    .filter_map(|q| q["kind"].as_str())
                    .collect::<Vec<_>>()
                    .join(", "))
                .unwrap_or_default()
        ));
    }
    Ok(said)
}

/// Applies `script` (a `bloatlab config` tc script) to the interface: all of it, or none.
pub fn apply(i: &Iface, script: &str) -> Result<Vec<String>, String> {
    let steps: Steps = batch::steps(script)?;
    let mut said = check(i)?;
    let path = i.state_file();
    let before = i.snapshot()?;
    let mut rec = Record {
        dev: i.dev.clone(),
        netns: i.netns.clone(),
        status: "applying".into(),
        before: before.clone(),
        creates: steps.creates.clone(),
        script: script.into(),
        applied_at: now(),
    };
    write_record(&path, &rec)?;
    let result = (|| -> Result<(), String> {
        for args in &steps.ip {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            // Creating a device that exists is fine (the generators say `|| true`).
            if let Err(e) = i.run("ip", &a) {
                if !(a.starts_with(&["link", "add"]) && e.contains("File exists")) {
                    return Err(e);
                }
            }
        }
        fault_point("after-ip");
        let file = std::env::temp_dir().join(format!("bloatlab-tune-{}.batch", std::process::id()));
        std::fs::write(&file, &steps.tc_batch).map_err(|e| format!("{}: {e}", file.display()))?;
        let r = i.run("tc", &["-batch", file.to_str().unwrap()]);
        let _ = std::fs::remove_file(&file);
        r.map(|_| ())
    })();
    match result {
        Ok(()) => {
            rec.status = "applied".into();
            write_record(&path, &rec)?;
            said.push(format!(
                "applied to {} ({} tc commands)",
                i.dev,
                steps.tc_batch.lines().count()
            ));
            Ok(said)
        }
        Err(e) => {
            let undone = restore(i, &steps.creates, &before);
            let _ = std::fs::remove_file(&path);
            match undone {
                Ok(()) => Err(format!("{e}; {} is back as it was", i.dev)),
                Err(u) => Err(format!("{e}; and restoring failed: {u}")),
            }
        }
    }
}

/// Undoes what `apply` did (or what an interrupted apply left).
pub fn rollback(i: &Iface) -> Result<String, String> {
    let path = i.state_file();
    let r = read_record(&path)
        .ok_or_else(|| format!("bloatlab has not shaped {} (no {})", i.dev, path.display()))?;
    restore(i, &r.creates, &r.before)?;
    std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "{} is back to its state of before {}",
        i.dev, r.applied_at
    ))
}

/// What bloatlab applied where, and the qdiscs now on the interface.
pub fn status(i: &Iface) -> Result<String, String> {
    let now = i.snapshot()?;
    let kinds = now
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|q| q["kind"].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    Ok(match read_record(&i.state_file()) {
        Some(r) if r.status == "applying" => format!(
            "{}: an apply of {} was interrupted; \
            `bloatlab tune rollback` (or the next apply) undoes it (qdiscs now: \
            {kinds})",
            i.dev, r.applied_at
        ),
        Some(r) => format!(
            "{}: shaped by bloatlab at {} (qdiscs now: \
            {kinds})",
            i.dev, r.applied_at
        ),
        None => format!("{}: not shaped by bloatlab (qdiscs now: {kinds})", i.dev),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_states_are_told_from_configured_ones() {
        let j = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert!(is_default(&j(
            r#"[{"kind":"noqueue","handle":"0:","root":true}]"#
        )));
        assert!(is_default(&j(r#"[{"kind":"mq","handle":"0:","root":true},
                {"kind":"fq_codel","handle":"0:","parent":":1"}]"#)));
        assert!(!is_default(&j(
            r#"[{"kind":"htb","handle":"1:","root":true}]"#
        )));
        assert!(!is_default(&j(
            r#"[{"kind":"noqueue","handle":"0:","root":true},
                {"kind":"ingress","handle":"ffff:","parent":"ffff:fff1"}]"#
        )));
    }
}
