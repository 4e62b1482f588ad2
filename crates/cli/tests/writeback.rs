//! `test writeback` on this machine's disk: when the kernel starts writing a file's pages
//! follows the dirty thresholds. The thresholds are global (not per namespace): the test sets
//! them through a guard that restores the machine's values whatever happens.

use crate::common::*;
use std::path::PathBuf;

const VM: [&str; 4] = [
    "dirty_background_ratio",
    "dirty_background_bytes",
    "dirty_ratio",
    "dirty_bytes",
];

fn vm_path(k: &str) -> PathBuf {
    PathBuf::from("/proc/sys/vm").join(k)
}

fn read_vm(k: &str) -> u64 {
    std::fs::read_to_string(vm_path(k))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The machine's dirty thresholds as they were, written back on drop. Writing a `_bytes`
/// setting zeroes its `_ratio` twin and the other way round, so the non-zero one of each pair
/// is written last.
struct VmGuard(Vec<(&'static str, u64)>);

impl VmGuard {
    fn save() -> VmGuard {
        VmGuard(VM.iter().map(|k| (*k, read_vm(k))).collect())
    }

    fn set(background_bytes: u64, bytes: u64) -> VmGuard {
        let saved = VmGuard::save();
        std::fs::write(vm_path("dirty_bytes"), bytes.to_string()).unwrap();
        std::fs::write(
            vm_path("dirty_background_bytes"),
            background_bytes.to_string(),
        )
        .unwrap();
        saved
    }
}

impl Drop for VmGuard {
    fn drop(&mut self) {
        for (k, v) in self
            .0
            .iter()
            .filter(|(_, v)| *v == 0)
            .chain(self.0.iter().filter(|(_, v)| *v != 0))
        {
            if *v != 0 {
                let _ = std::fs::write(vm_path(k), v.to_string());
            }
        }
    }
}

fn meminfo_mb(key: &str) -> f64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: f64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    kb * 1024.0 / 1e6
}

/// The value of a result file's MB series at the last sample at or before `t`.
fn series_at(r: &serde_json::Value, name: &str, t: f64) -> f64 {
    let s = r["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap();
    s["samples"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x[0].as_f64().unwrap() <= t)
        .filter_map(|x| x[1].as_f64())
        .next_back()
        .unwrap_or(0.0)
}

fn writeback(dir: &std::path::Path, tag: &str) -> (serde_json::Value, serde_json::Value) {
    let out_file = tmp_path(&format!("wb-{tag}.json"));
    let out = run(
        &[],
        &[
            "test",
            "writeback",
            dir.to_str().unwrap(),
            "--size",
            "128M",
            "--rate",
            "800mbit",
            "--idle",
            "0.5",
            "--json",
            "-q",
            "-o",
            out_file.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    (json(&out), file)
}

/// 128 MiB at 100 MB/s (a gigabit network's delivery), twice. With the thresholds sized from
/// bandwidth x delay (32 MiB background, 192 MiB foreground), writeback begins once the
/// machine's dirty pages pass 32 MiB: the test's bytes at that moment plus what was already
/// dirty come to about 33.5 MB (measured: 4.2 MB written + 31 MB dirty). With the default
/// ratios (10% of available memory) on a machine where that is far above 128 MiB, nothing is
/// written before the closing fsync forces it.
#[test]
fn writeback_starts_at_the_background_threshold_and_not_before() {
    // vm.dirty_* and the dirty pages are the whole machine's: no other test may write meanwhile.
    let _g = quiet();
    if unsafe { libc::geteuid() } != 0 {
        missing("writeback test sets vm.dirty_* (root)");
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("writeback-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _rm = RemoveDir(dir.clone());
    {
        let _vm = VmGuard::set(32 << 20, 192 << 20);
        // Let the flusher bring what others left dirty under the new threshold first.
        for _ in 0..50 {
            if meminfo_mb("Dirty") < 24.0 {
                break;
            }
            wait_ms(100);
        }
        let (s, file) = writeback(&dir, "sized");
        eprintln!(
            "sized: {} stall {} fsync {} small {}",
            s["writeback"], s["write_stall_ms"], s["fsync_ms"], s["small_sync_ms"]
        );
        let w0 = file["metadata"]["phases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "write")
            .unwrap()["start"]
            .as_f64()
            .unwrap();
        let dirty_before = series_at(&file, "dirty", w0);
        let started = f(&s, "writeback.started_after_bytes") / 1e6;
        let total = started + dirty_before;
        assert!(
            (28.0..=44.0).contains(&total),
            "writeback began with {started:.1} MB written and \
            {dirty_before:.1} MB dirty before: {total:.1} MB against a 33.5 MB threshold"
        );
        assert!(
            f(&s, "writeback.dirty_peak_mb") < 80.0,
            "{}",
            s["writeback"]
        );
        assert!(
            file["series"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == "file on disk"),
            "cachestat on this kernel"
        );
    }
    assert_eq!(read_vm("dirty_bytes"), 0, "the guard restored the ratios");
    let available = meminfo_mb("MemAvailable");
    let background = read_vm("dirty_background_ratio") as f64 / 100.0 * available;
    let (s, _) = writeback(&dir, "default");
    eprintln!(
        "default (background {background:.0} MB): {}",
        s["writeback"]
    );
    if background > 2.0 * (134.0 + meminfo_mb("Dirty")) {
        assert!(
            s["writeback"]["started_after_bytes"].is_null(),
            "{}",
            s["writeback"]
        );
    }
    assert_eq!(s["write_stall_ms"]["samples"], 128);
    assert!(f(&s, "fsync_ms") > 0.0 && s["small_sync_ms"]["samples"].as_u64().unwrap() >= 5);
}

/// `tune apply --sysctl`: applied over a record, restored by `tune rollback --sysctl`; with
/// --verify, two writeback tests at 100 MB/s, and the thresholds kept only if the cache held
/// less (it must: 128 MiB against a 33.5 MB background threshold), restored otherwise.
#[test]
fn tune_apply_sysctl_records_verifies_and_rolls_back() {
    // vm.dirty_* and the dirty pages are the whole machine's: no other test may write meanwhile.
    let _g = quiet();
    if unsafe { libc::geteuid() } != 0 {
        missing("tune apply --sysctl needs root");
        return;
    }
    let _vm = VmGuard::save();
    let ratios = (read_vm("dirty_background_ratio"), read_vm("dirty_ratio"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("tune-sysctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _rm = RemoveDir(dir.clone());
    let conf = dir.join("wb.conf");
    let out = run(&[], &["config", "sysctl-writeback", "--rate", "1Gibit"]);
    std::fs::write(&conf, &out.stdout).unwrap();
    let ok = |args: &[&str]| {
        let out = run(&[], args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    ok(&[
        "tune",
        "apply",
        "--sysctl",
        "--config",
        conf.to_str().unwrap(),
    ]);
    assert_eq!(
        (read_vm("dirty_background_bytes"), read_vm("dirty_bytes")),
        (33_554_432, 201_326_592)
    );
    assert!(
        String::from_utf8_lossy(&ok(&["tune", "status", "--sysctl"]).stdout)
            .contains("applied by bloatlab")
    );
    let again = run(
        &[],
        &[
            "tune",
            "apply",
            "--sysctl",
            "--config",
            conf.to_str().unwrap(),
        ],
    );
    assert!(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("tune rollback --sysctl first")
    );
    ok(&["tune", "rollback", "--sysctl"]);
    assert_eq!(
        (
            read_vm("dirty_background_ratio"),
            read_vm("dirty_ratio"),
            read_vm("dirty_bytes")
        ),
        (ratios.0, ratios.1, 0),
        "restored as they were"
    );

    let out = ok(&[
        "tune",
        "apply",
        "--sysctl",
        "--config",
        conf.to_str().unwrap(),
        "--verify",
        dir.to_str().unwrap(),
        "--size",
        "128M",
        "--rate",
        "800mbit",
        "--out-dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    let v = json(&out);
    eprintln!(
        "kept {} ({}): before {} after {}",
        v["kept"],
        v["reason"],
        v["before"]["writeback"]["dirty_peak_mb"],
        v["after"]["writeback"]["dirty_peak_mb"]
    );
    assert!(
        f(&v, "after.writeback.dirty_peak_mb") < 80.0
            && f(&v, "after.writeback.dirty_peak_mb") < f(&v, "before.writeback.dirty_peak_mb")
    );
    if v["kept"] == true {
        assert_eq!(read_vm("dirty_bytes"), 201_326_592);
        assert!(
            String::from_utf8_lossy(&ok(&["tune", "status", "--sysctl"]).stdout)
                .contains("nothing recorded"),
            "kept for good: no record left"
        );
    } else {
        assert_eq!(
            (read_vm("dirty_background_ratio"), read_vm("dirty_bytes")),
            (ratios.0, 0),
            "not kept: restored"
        );
    }
}

/// Removes a directory on drop, also when the test fails.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Bad places to write give one clear line on stderr and a failing exit: a directory that does
/// not exist, one this user may not write (root without CAP_DAC_OVERRIDE on a directory of
/// `nobody`), and a filesystem that fills up mid-test (a 4 MiB tmpfs in a mount namespace of
/// its own, gone with the process), which also keeps the partial result file.
#[test]
fn writeback_to_bad_places_fails_with_one_line() {
    let _g = serial();
    let one_line = |out: &std::process::Output, want: &str| {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.trim().lines().count() == 1 && err.contains(want),
            "{:?}, want {want:?}: {err}",
            out.status
        );
        assert!(
            out.stdout.is_empty(),
            "no summary of a failed run: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    one_line(
        &run(&[], &["test", "writeback", "/nonexistent/bloatlab", "-q"]),
        "not a directory",
    );
    if unsafe { libc::geteuid() } != 0 {
        missing("root, to drop a capability and mount a small tmpfs");
        return;
    }
    let dir = tmp_path("wb-bad");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    let out_file = tmp_path("wb-bad.json");
    let args = [
        "test",
        "writeback",
        dir.to_str().unwrap(),
        "--size",
        "16M",
        "-q",
        "-o",
        out_file.to_str().unwrap(),
    ];
    one_line(
        &run(
            &["setpriv", "--bounding-set=-dac_override,-dac_read_search"],
            &args,
        ),
        "Permission denied",
    );

    let mount = "mount -t tmpfs -o size=4m bloatlab-full \"$0\" && exec \"$@\"";
    one_line(
        &run(
            &[
                "unshare",
                "--mount",
                "sh",
                "-c",
                mount,
                dir.to_str().unwrap(),
            ],
            &args,
        ),
        "No space left on device",
    );
    let partial: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
    assert_eq!(
        partial["partial"], true,
        "the file of a run cut short says so"
    );
    assert!(
        std::fs::read_dir(&dir).unwrap().next().is_none(),
        "the tmpfs went with its mount namespace"
    );
}
