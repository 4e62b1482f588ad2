//! `test writeback`: bufferbloat in the page cache. Writes a file as `dd conv=fdatasync` does
//! (or at a given rate, as a network would deliver it) while sampling the kernel's dirty and
//! writeback counters every 10 ms and timing a small write + fsync on the same filesystem every
//! 100 ms, like RRUL's probes for a disk. The counters are machine-wide: the summary says when
//! other activity moved them.

use crate::run::{Ended, Outcome, RunOptions};
use crate::MeasureError;
use bloatlab_netio as netio;
use bloatlab_result::params::{VmSettings, WritebackMachine};
use bloatlab_result::{
    self as result, Event, Host, Metadata, Phase, ResultFile, Series, SeriesKind,
};
use portable_atomic::AtomicU64;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// When the test's file is synced to the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// Once, after the last write (`dd conv=fdatasync`).
    End,
    /// After every this many bytes, and at the end.
    Every(u64),
}

impl Serialize for Fsync {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Fsync::End => s.serialize_str("end"),
            Fsync::Every(n) => s.collect_str(&format_args!("every:{n}")),
        }
    }
}

impl std::str::FromStr for Fsync {
    type Err = String;
    fn from_str(s: &str) -> Result<Fsync, String> {
        match s.trim().to_ascii_lowercase().split_once(':') {
            None if s.trim().eq_ignore_ascii_case("end") => Ok(Fsync::End),
            Some(("every", n)) => Ok(Fsync::Every(parse_size(n)?)),
            _ => Err(format!("`{s}`: want end or every:SIZE (every:64M)")),
        }
    }
}

/// A size as dd reads it: `1G` = 1024^3 bytes, `512M`, `64K`, or plain bytes; `1GB` = 10^9.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_uppercase();
    let (num, scale) = match t.as_str() {
        x if x.ends_with("KB") => (&x[..x.len() - 2], 1e3),
        x if x.ends_with("MB") => (&x[..x.len() - 2], 1e6),
        x if x.ends_with("GB") => (&x[..x.len() - 2], 1e9),
        x if x.ends_with('K') => (&x[..x.len() - 1], 1024.0),
        x if x.ends_with('M') => (&x[..x.len() - 1], 1024.0 * 1024.0),
        x if x.ends_with('G') => (&x[..x.len() - 1], 1024.0 * 1024.0 * 1024.0),
        x => (x, 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v * scale >= 1.0 && v * scale <= 1e15 => {
            Ok((v * scale).round() as u64)
        }
        _ => Err(format!("`{s}`: want a size such as 1G, 512M, 64K or bytes")),
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct WritebackParams {
    pub dir: PathBuf,
    /// Bytes to write.
    pub size: u64,
    /// Pace the writes to this many bits per second (as a network delivers them); full speed
    /// when absent.
    pub rate_bps: Option<u64>,
    pub fsync: Fsync,
    /// Seconds of small-sync baseline before the big write.
    pub idle: f64,
}

/// Bytes per write() call, as dd bs=1M.
const CHUNK: usize = 1 << 20;
const SAMPLE_EVERY: Duration = Duration::from_millis(10);
const SMALL_EVERY: Duration = Duration::from_millis(100);
const SMALL_SIZE: usize = 4096;
const SNAPSHOT_EVERY_NS: u64 = 2_000_000_000;

/// The value (kB) of `key` in /proc/meminfo's text.
fn meminfo_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        l.strip_prefix(key)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The value of `key` in /proc/vmstat's text.
fn vmstat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// The mount (device and filesystem type) holding `path`: the longest mount point that is a
/// prefix of it, from /proc/mounts' text.
fn mount_of(mounts: &str, path: &Path) -> Option<(String, String)> {
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && path.starts_with(f[1]))
                .then(|| (f[1].len(), f[0].to_string(), f[2].to_string()))
        })
        .max_by_key(|m| m.0)
        .map(|m| (m.1, m.2))
}

/// One sample of the page cache: Dirty and Writeback (kB), nr_dirtied and nr_written (pages,
/// cumulative), the bytes the test had written, and its own file's pages (`cachestat`, where
/// the kernel has it: exact, whatever else writes).
#[derive(Clone, Copy, Debug)]
struct Sample {
    t: u64,
    dirty_kb: u64,
    writeback_kb: u64,
    nr_dirtied: u64,
    nr_written: u64,
    test_written: u64,
    file: Option<netio::CacheStat>,
}

/// `test_written` is read before the file's pages are: a write landing in between then shows
/// as more dirty pages, never as pages gone to the disk.
fn sample(t: u64, test_written: u64, file: &File) -> Option<Sample> {
    let stat = netio::cachestat(file).ok();
    let mem = std::fs::read_to_string("/proc/meminfo").ok()?;
    let vm = std::fs::read_to_string("/proc/vmstat").ok()?;
    Some(Sample {
        t,
        dirty_kb: meminfo_kb(&mem, "Dirty")?,
        writeback_kb: meminfo_kb(&mem, "Writeback")?,
        nr_dirtied: vmstat(&vm, "nr_dirtied")?,
        nr_written: vmstat(&vm, "nr_written")?,
        test_written,
        file: stat,
    })
}

/// The test's files, removed whatever happens.
struct Files {
    big: PathBuf,
    small: PathBuf,
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.big);
        let _ = std::fs::remove_file(&self.small);
    }
}

/// The big write's calls: when each began and how long it took (ms).
#[derive(Default)]
struct Logs {
    writes: Vec<(u64, f64)>,
    fsyncs: Vec<(u64, f64)>,
}

fn vm_settings() -> VmSettings {
    let read = |k: &str| {
        std::fs::read_to_string(format!("/proc/sys/vm/{k}"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    VmSettings {
        dirty_background_ratio: read("dirty_background_ratio"),
        dirty_ratio: read("dirty_ratio"),
        dirty_background_bytes: read("dirty_background_bytes"),
        dirty_bytes: read("dirty_bytes"),
        dirty_expire_centisecs: read("dirty_expire_centisecs"),
        dirty_writeback_centisecs: read("dirty_writeback_centisecs"),
    }
}

/// Fills a buffer with bytes no filesystem can compress (xorshift).
fn incompressible(buf: &mut [u8], mut x: u64) {
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

pub fn run(p: &WritebackParams, opts: &RunOptions) -> Result<Outcome, MeasureError> {
    if !p.dir.is_dir() {
        return Err(MeasureError::Io {
            what: format!("{}", p.dir.display()),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
        });
    }
    let dir = p
        .dir
        .canonicalize()
        .map_err(MeasureError::io(p.dir.display().to_string()))?;
    let files = Files {
        big: dir.join(format!(".bloatlab-writeback-{}.tmp", std::process::id())),
        small: dir.join(format!(".bloatlab-small-{}.tmp", std::process::id())),
    };
    let open = |path: &Path| {
        OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .map_err(MeasureError::io(format!("creating {}", path.display())))
    };
    let mut big = open(&files.big)?;
    let small = open(&files.small)?;
    // The small file exists on the disk before the baseline: each probe then rewrites a block.
    small
        .write_all_at(&[0u8; SMALL_SIZE], 0)
        .and_then(|_| small.sync_all())
        .map_err(MeasureError::io("small file"))?;

    let path = opts
        .output
        .clone()
        .unwrap_or_else(|| crate::run::default_output("writeback"));
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let (device, fstype) = mount_of(&mounts, &dir).unwrap_or_else(|| ("?".into(), "?".into()));
    let machine = WritebackMachine {
        vm: vm_settings(),
        mem_total_kb: std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| meminfo_kb(&m, "MemTotal")),
        page_size: Some(netio::page_size()),
        rate_bps: p.rate_bps,
    };
    let mut params = serde_json::to_value(p).unwrap_or_default();
    if let (Some(o), serde_json::Value::Object(m)) = (
        params.as_object_mut(),
        serde_json::to_value(machine).unwrap_or_default(),
    ) {
        o.extend(m);
    }
    let server = Host {
        name: dir.display().to_string(),
        address: None,
        software: format!("{fstype} on {device}"),
        kernel: netio::kernel(),
        default_cc: String::new(),
    };
    let meta = Metadata {
        step: SAMPLE_EVERY.as_secs_f64(),
        ..crate::run::local_metadata("writeback", params, server)
    };
    result::write_atomic(&path, &ResultFile::new(meta.clone()))?;

    let t0 = netio::mono_ns();
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut l = Logs::default();
    let shared_samples = Arc::new(Mutex::new(Vec::new()));
    let shared_small = Arc::new(Mutex::new(Vec::new()));
    let watched = File::open(&files.big)
        .map_err(MeasureError::io(format!("opening {}", files.big.display())))?;
    let sampler = {
        let (written, stop, out) = (written.clone(), stop.clone(), shared_samples.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (t, w) = (netio::mono_ns(), written.load(Ordering::Relaxed));
                if let Some(s) = sample(t, w, &watched) {
                    out.lock().unwrap().push(s);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        })
    };
    let prober = {
        let (stop, out) = (stop.clone(), shared_small.clone());
        std::thread::spawn(move || {
            let block = [0x5au8; SMALL_SIZE];
            while !stop.load(Ordering::Relaxed) {
                let t = netio::mono_ns();
                if small
                    .write_all_at(&block, 0)
                    .and_then(|_| small.sync_data())
                    .is_ok()
                {
                    out.lock()
                        .unwrap()
                        .push((t, (netio::mono_ns() - t) as f64 / 1e6));
                }
                let next = t + SMALL_EVERY.as_nanos() as u64;
                std::thread::sleep(Duration::from_nanos(next.saturating_sub(netio::mono_ns())));
            }
        })
    };
    let secs = |t: u64| (t.saturating_sub(t0)) as f64 / 1e9;
    let mut phases = vec![Phase {
        name: "idle".into(),
        start: 0.0,
        end: p.idle,
    }];
    let snapshot = |phases: &[Phase], logs: &Logs, finished: bool| -> ResultFile {
        let samples = shared_samples.lock().unwrap().clone();
        let small = shared_small.lock().unwrap().clone();
        build(&meta, phases, &samples, &small, logs, t0, finished)
    };
    let idle_end = t0 + (p.idle * 1e9) as u64;
    while netio::mono_ns() < idle_end && !opts.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(10));
    }

    // The big write, as dd bs=1M: timed per call, paced when a rate is given.
    let mut buf = vec![0u8; CHUNK];
    incompressible(&mut buf, 0x9e37_79b9_7f4a_7c15 ^ t0);
    let w0 = netio::mono_ns();
    let mut next_snapshot = w0 + SNAPSHOT_EVERY_NS;
    // A progress line on stderr every second of writing (none with -q).
    let mut quiet_until = w0 + 1_000_000_000;
    let (mut done, mut since_sync) = (0u64, 0u64);
    let mut ended = Ended::Complete;
    let mut write_error = None;
    while done < p.size {
        if opts.stop.load(Ordering::Relaxed) {
            ended = Ended::Interrupted;
            break;
        }
        if let Some(rate) = p.rate_bps {
            let due = w0 + (done as f64 * 8.0 / rate as f64 * 1e9) as u64;
            let now = netio::mono_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
        }
        let n = (p.size - done).min(CHUNK as u64) as usize;
        let t = netio::mono_ns();
        if let Err(e) = big.write_all(&buf[..n]) {
            write_error = Some(e);
            break;
        }
        l.writes.push((t, (netio::mono_ns() - t) as f64 / 1e6));
        done += n as u64;
        since_sync += n as u64;
        written.store(done, Ordering::Relaxed);
        if let Fsync::Every(every) = p.fsync {
            if since_sync >= every && done < p.size {
                let t = netio::mono_ns();
                let _ = big.sync_data();
                l.fsyncs.push((t, (netio::mono_ns() - t) as f64 / 1e6));
                since_sync = 0;
            }
        }
        if quiet_until < netio::mono_ns() && opts.progress != crate::display::ProgressMode::Quiet {
            quiet_until = netio::mono_ns() + 1_000_000_000;
            let last = shared_samples.lock().unwrap().last().copied();
            let cache = last.map_or(String::new(), |x| {
                format!(
                    "; page cache {:.0} MB dirty, {:.0} MB under writeback",
                    x.dirty_kb as f64 * 1024.0 / 1e6,
                    x.writeback_kb as f64 * 1024.0 / 1e6
                )
            });
            eprintln!(
                "writeback: {:.0} of {:.0} MB written in {:.1} s{cache}",
                done as f64 / 1e6,
                p.size as f64 / 1e6,
                secs(netio::mono_ns()) - secs(w0)
            );
        }
        if netio::mono_ns() >= next_snapshot {
            next_snapshot += SNAPSHOT_EVERY_NS;
            let mut ph = phases.clone();
            ph.push(Phase {
                name: "write".into(),
                start: secs(w0),
                end: secs(netio::mono_ns()),
            });
            let _ = result::write_atomic(&path, &snapshot(&ph, &l, false));
        }
    }
    let w1 = netio::mono_ns();
    phases.push(Phase {
        name: "write".into(),
        start: secs(w0),
        end: secs(w1),
    });
    if ended == Ended::Complete && write_error.is_none() {
        if opts.progress != crate::display::ProgressMode::Quiet {
            eprintln!(
                "writeback: {:.0} MB written in {:.1} s; fdatasync...",
                done as f64 / 1e6,
                secs(w1) - secs(w0)
            );
        }
        let t = netio::mono_ns();
        let synced = big.sync_data();
        let f1 = netio::mono_ns();
        l.fsyncs.push((t, (f1 - t) as f64 / 1e6));
        phases.push(Phase {
            name: "fsync".into(),
            start: secs(w1),
            end: secs(f1),
        });
        if let Err(e) = synced {
            write_error = Some(e);
        }
        // Half a second more of counters: the cache as the fsync left it.
        std::thread::sleep(Duration::from_millis(500));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let _ = prober.join();
    drop(files);
    let mut r = snapshot(&phases, &l, true);
    if let Some(e) = &write_error {
        let why = format!("writing to {} failed: {e}", dir.display());
        r.events.push(Event {
            t: secs(netio::mono_ns()),
            what: why.clone(),
        });
        ended = Ended::Failed(why);
    }
    r.partial = ended != Ended::Complete;
    if let Some(s) = r.summary.as_mut() {
        s.partial = r.partial;
    }
    if ended == Ended::Interrupted {
        r.events.push(Event {
            t: secs(netio::mono_ns()),
            what: "interrupted by the user".into(),
        });
    }
    result::write_atomic(&path, &r)?;
    Ok(Outcome {
        result: r,
        path,
        ended,
    })
}

/// The result file from what was measured: page-cache counters as MB series (the cumulative
/// ones from their value at the start), and write, fsync and small-sync times as ms series.
fn build(
    meta: &Metadata,
    phases: &[Phase],
    samples: &[Sample],
    small: &[(u64, f64)],
    logs: &Logs,
    t0: u64,
    finished: bool,
) -> ResultFile {
    let mut r = ResultFile::new(Metadata {
        phases: phases.to_vec(),
        ..meta.clone()
    });
    r.partial = !finished;
    let secs = |t: u64| (t.saturating_sub(t0)) as f64 / 1e9;
    let page = netio::page_size() as f64;
    let first = samples.first().copied();
    let mb = |name: &str, f: &dyn Fn(&Sample) -> f64| Series {
        name: name.into(),
        kind: SeriesKind::Bytes,
        direction: None,
        dscp: None,
        unit: "MB".into(),
        samples: samples.iter().map(|s| (secs(s.t), Some(f(s)))).collect(),
    };
    if let Some(f0) = first {
        r.series
            .push(mb("dirty", &|s| s.dirty_kb as f64 * 1024.0 / 1e6));
        r.series
            .push(mb("writeback", &|s| s.writeback_kb as f64 * 1024.0 / 1e6));
        r.series.push(mb("dirtied", &|s| {
            s.nr_dirtied.saturating_sub(f0.nr_dirtied) as f64 * page / 1e6
        }));
        r.series.push(mb("disk written", &|s| {
            s.nr_written.saturating_sub(f0.nr_written) as f64 * page / 1e6
        }));
        r.series
            .push(mb("test written", &|s| s.test_written as f64 / 1e6));
        if samples.iter().all(|s| s.file.is_some()) {
            let file = |s: &Sample| s.file.unwrap_or_default();
            r.series
                .push(mb("file dirty", &|s| file(s).dirty as f64 * page / 1e6));
            r.series.push(mb("file writeback", &|s| {
                file(s).writeback as f64 * page / 1e6
            }));
            // Pages the test wrote that are neither dirty nor under writeback: on the disk.
            r.series.push(mb("file on disk", &|s| {
                ((s.test_written as f64 / page).floor()
                    - (file(s).dirty + file(s).writeback) as f64)
                    .max(0.0)
                    * page
                    / 1e6
            }));
        }
    }
    let ms = |name: &str, v: &[(u64, f64)]| Series {
        name: name.into(),
        kind: SeriesKind::Latency,
        direction: None,
        dscp: None,
        unit: "ms".into(),
        samples: v.iter().map(|&(t, m)| (secs(t), Some(m))).collect(),
    };
    r.series.push(ms("write", &logs.writes));
    r.series.push(ms("fsync", &logs.fsyncs));
    r.series.push(ms("small sync", small));
    r.summary = Some(bloatlab_analyze::summarize(&r));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_texts_and_sizes_parse() {
        let mem = "MemTotal:       24684084 kB\nDirty:               388 \
            kB\nWriteback:             0 kB\nWritebackTmp:          7 kB\n";
        assert_eq!(meminfo_kb(mem, "Dirty"), Some(388));
        assert_eq!(meminfo_kb(mem, "Writeback"), Some(0), "not WritebackTmp");
        assert_eq!(
            vmstat("nr_dirtied 11780276\nnr_written 7584022\n", "nr_written"),
            Some(7_584_022)
        );
        let mounts =
            "/dev/vda / ext4 rw 0 0\ntmpfs /tmp tmpfs rw 0 0\n/dev/vdb /srv/data xfs rw 0 0\n";
        assert_eq!(
            mount_of(mounts, Path::new("/srv/data/x")),
            Some(("/dev/vdb".into(), "xfs".into()))
        );
        assert_eq!(
            mount_of(mounts, Path::new("/tmp")),
            Some(("tmpfs".into(), "tmpfs".into()))
        );
        assert_eq!(
            mount_of(mounts, Path::new("/srv/other")),
            Some(("/dev/vda".into(), "ext4".into()))
        );
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert!(parse_size("x").is_err());
        assert_eq!("every:64M".parse::<Fsync>(), Ok(Fsync::Every(64 << 20)));
        assert_eq!("end".parse::<Fsync>(), Ok(Fsync::End));
        assert!("sometimes".parse::<Fsync>().is_err());
    }
}
