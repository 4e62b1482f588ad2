//! The monitor's history in one SQLite file (WAL, one writer): probes per minute and load band,
//! scheduled tests, the target's silences, CAKE's statistics. A file that is not ours or is
//! damaged is refused and never written; a full disk costs the oldest minutes, not the newest.

use bloatlab_result::history::{
    Gap, History, HourRow, LoadBand, MinuteRow, Quantiles, ShaperRow, TestRow,
};
use rusqlite::{params, Connection, ErrorCode, OpenFlags, OptionalExtension};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `PRAGMA application_id` of a bloatlab history ("blat"): `file(1)` and this crate tell it from
/// any other SQLite file.
pub const APPLICATION_ID: i32 = 0x626c_6174;
/// `PRAGMA user_version`: the schema. Each step in `MIGRATIONS` takes a file one version on.
pub const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Schema steps, oldest first; a file at version N runs steps N.. in one transaction.
const MIGRATIONS: &[&str] = &[
    // 1: probes per minute, scheduled tests, silences (the first release's schema).
    "CREATE TABLE minutes (
        minute INTEGER NOT NULL, target TEXT NOT NULL, load TEXT NOT NULL,
        testing INTEGER NOT NULL, sent INTEGER NOT NULL, lost INTEGER NOT NULL,
        rtt TEXT, owd_up TEXT, owd_down TEXT,
        rx_mbps REAL NOT NULL, tx_mbps REAL NOT NULL, rtt_hist TEXT NOT NULL,
        PRIMARY KEY (minute, target, load, testing)) WITHOUT ROWID;
     CREATE TABLE tests (
        started INTEGER NOT NULL, target TEXT NOT NULL, test TEXT NOT NULL,
        length_s REAL NOT NULL, result_path TEXT, grade TEXT, added_ms REAL,
        added_down_ms REAL, added_up_ms REAL, idle_ms REAL, down_mbps REAL, up_mbps REAL,
        loss_percent REAL, bytes INTEGER NOT NULL, skipped TEXT, ended TEXT);
     CREATE INDEX tests_started ON tests (started);
     CREATE TABLE gaps (
        started INTEGER NOT NULL, ended INTEGER, target TEXT NOT NULL, why TEXT NOT NULL);
     CREATE INDEX gaps_started ON gaps (started);",
    // 2: CAKE's statistics per minute and tin.
    "CREATE TABLE shaper (
        minute INTEGER NOT NULL, iface TEXT NOT NULL, tin TEXT NOT NULL,
        rate_bps INTEGER NOT NULL, packets INTEGER NOT NULL, bytes INTEGER NOT NULL,
        drops INTEGER NOT NULL, marks INTEGER NOT NULL, ack_drops INTEGER NOT NULL,
        backlog_bytes INTEGER NOT NULL, pk_delay_us INTEGER NOT NULL,
        av_delay_us INTEGER NOT NULL, sp_delay_us INTEGER NOT NULL,
        PRIMARY KEY (minute, iface, tin)) WITHOUT ROWID;",
];

/// Freed when the disk fills, so that the oldest rows can be deleted (which itself writes) and
/// the newest still land.
const RESERVE_BYTES: usize = 256 * 1024;
/// Free space under which writes first delete the oldest minutes: a checkpoint's worth of log
/// (256 kB, `wal_autocheckpoint`) and a transaction's.
const HEADROOM_BYTES: u64 = 384 * 1024;
/// ... unless the file still has this much room of its own from rows deleted before.
const REUSE_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: not a bloatlab history ({why}); refusing to touch it")]
    Foreign { path: PathBuf, why: String },
    #[error("{path}: the history is damaged ({why}); it was left as it is")]
    Corrupt { path: PathBuf, why: String },
    #[error(
        "{path}: written by a newer bloatlab (schema {found}, this one knows {SCHEMA_VERSION})"
    )]
    TooNew { path: PathBuf, found: i32 },
    #[error("{path}: no history there (run `bloatlab monitor --db {path}` first)")]
    Missing { path: PathBuf },
    #[error("{path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

/// What a write cost, for the caller to say once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// The disk was full: this many of the oldest minutes were deleted to make room.
    pub made_room: usize,
    /// The disk stayed full: these rows were not kept.
    pub dropped: bool,
}

pub struct Store {
    conn: Connection,
    path: PathBuf,
}

const HEADER: &[u8; 16] = b"SQLite format 3\0";

impl Store {
    /// Opens the history for writing, creating it (and migrating an older one) as needed.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::check_foreign(path)?;
        let conn = Connection::open(path).map_err(|e| sqlite(path, e))?;
        let mut store = Store {
            conn,
            path: path.to_path_buf(),
        };
        store.check_ours()?;
        store.pragma("journal_mode", "WAL")?;
        store.pragma("synchronous", "NORMAL")?;
        // The log is folded back into the file every 256 kB (not SQLite's 4 MB): a router's
        // flash is small and a full disk must find the log short.
        store.pragma("wal_autocheckpoint", "64")?;
        store.pragma("journal_size_limit", "262144")?;
        // Pages kept in memory: 256 KiB, not SQLite's 2 MB. The history grows by the minute,
        // and each new page stayed cached until the 2 MB were reached (the monitor's RSS rose
        // by some 0.5 MB an hour for hours); its reads are a day's rows at most.
        store.pragma("cache_size", "-256")?;
        store.migrate()?;
        store.keep_reserve();
        Ok(store)
    }

    /// Opens an existing history read-only (`bloatlab history`, `report --db`).
    pub fn open_read(path: &Path) -> Result<Store, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        Store::check_foreign(path)?;
        let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| sqlite(path, e))?;
        let store = Store {
            conn,
            path: path.to_path_buf(),
        };
        store.check_ours()?;
        let v = store.version()?;
        if v > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: store.path,
                found: v,
            });
        }
        if v < SCHEMA_VERSION {
            return Err(StoreError::Corrupt {
                path: store.path.clone(),
                why: format!("schema {v}; `bloatlab monitor` upgrades it on its next start"),
            });
        }
        Ok(store)
    }

    fn check_foreign(path: &Path) -> Result<(), StoreError> {
        use std::io::Read;
        let Ok(mut f) = std::fs::File::open(path) else {
            return Ok(());
        };
        let mut head = [0u8; 16];
        let n = f.read(&mut head).unwrap_or(0);
        if n == 0 {
            return Ok(());
        }
        if n < 16 || &head != HEADER {
            return Err(StoreError::Foreign {
                path: path.to_path_buf(),
                why: "not an SQLite file".into(),
            });
        }
        Ok(())
    }

    fn check_ours(&self) -> Result<(), StoreError> {
        let check: String = self
            .conn
            .query_row("PRAGMA quick_check", [], |r| r.get(0))
            .map_err(|e| self.damaged(e))?;
        if check != "ok" {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                why: check.chars().take(200).collect(),
            });
        }
        let id: i32 = self
            .conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(|e| self.damaged(e))?;
        let tables: i64 = self
            .conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(|e| self.damaged(e))?;
        // A new file (no tables yet) becomes ours; anything else must already say it is.
        if id != APPLICATION_ID && tables > 0 {
            return Err(StoreError::Foreign {
                path: self.path.clone(),
                why: format!("an SQLite file of another program (application id {id:#x})"),
            });
        }
        Ok(())
    }

    fn damaged(&self, e: rusqlite::Error) -> StoreError {
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase) | Some(ErrorCode::DatabaseCorrupt) => {
                StoreError::Corrupt {
                    path: self.path.clone(),
                    why: e.to_string(),
                }
            }
            _ => sqlite(&self.path, e),
        }
    }

    fn pragma(&self, name: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .pragma_update(None, name, value)
            .map_err(|e| sqlite(&self.path, e))
    }

    pub fn version(&self) -> Result<i32, StoreError> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| sqlite(&self.path, e))
    }

    fn migrate(&mut self) -> Result<(), StoreError> {
        let v = self.version()?;
        if v > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: v,
            });
        }
        if v == SCHEMA_VERSION {
            return Ok(());
        }
        let path = self.path.clone();
        let tx = self.conn.transaction().map_err(|e| sqlite(&path, e))?;
        for step in &MIGRATIONS[v as usize..] {
            tx.execute_batch(step).map_err(|e| sqlite(&path, e))?;
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .and_then(|_| tx.pragma_update(None, "user_version", SCHEMA_VERSION))
            .and_then(|_| tx.commit())
            .map_err(|e| sqlite(&path, e))
    }

    fn reserve_path(&self) -> PathBuf {
        let mut p = self.path.as_os_str().to_owned();
        p.push("-reserve");
        PathBuf::from(p)
    }

    /// Best effort: a disk too full for the reserve goes without it.
    fn keep_reserve(&self) {
        let p = self.reserve_path();
        if std::fs::metadata(&p).is_ok_and(|m| m.len() == RESERVE_BYTES as u64) {
            return;
        }
        if std::fs::write(&p, vec![0u8; RESERVE_BYTES]).is_err() {
            let _ = std::fs::remove_file(&p);
        }
    }

    pub fn add_minutes(&mut self, rows: &[MinuteRow]) -> Result<Written, StoreError> {
        self.write(|tx| {
            let mut st = tx.prepare_cached(
                "INSERT OR REPLACE INTO minutes VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12)",
            )?;
            for r in rows {
                st.execute(params![
                    r.minute,
                    r.target,
                    r.load.name(),
                    r.testing,
                    r.sent,
                    r.lost,
                    json(&r.rtt_ms),
                    json(&r.owd_up_ms),
                    json(&r.owd_down_ms),
                    r.rx_mbps,
                    r.tx_mbps,
                    serde_json::to_string(&r.rtt_hist).expect("pairs serialize"),
                ])?;
            }
            Ok(())
        })
    }

    pub fn add_shaper(&mut self, rows: &[ShaperRow]) -> Result<Written, StoreError> {
        self.write(|tx| {
            let mut st = tx.prepare_cached(
                "INSERT OR REPLACE INTO shaper VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)",
            )?;
            for r in rows {
                let n = |v: u64| v.min(i64::MAX as u64) as i64;
                st.execute(params![
                    r.minute,
                    r.iface,
                    r.tin,
                    n(r.rate_bps),
                    n(r.packets),
                    n(r.bytes),
                    n(r.drops),
                    n(r.marks),
                    n(r.ack_drops),
                    n(r.backlog_bytes),
                    n(r.pk_delay_us),
                    n(r.av_delay_us),
                    n(r.sp_delay_us),
                ])?;
            }
            Ok(())
        })
    }

    /// CAKE per hour, interface and tin: counters summed, delays and backlog their largest.
    pub fn shaper_hours(&self, since: i64, until: i64) -> Result<Vec<ShaperRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT minute - minute % 3600 AS hour, iface, tin, max(rate_bps), sum(packets), \
                 sum(bytes), sum(drops), sum(marks), sum(ack_drops), max(backlog_bytes), \
                 max(pk_delay_us), max(av_delay_us), max(sp_delay_us) FROM shaper \
                 WHERE minute >= ?1 AND minute < ?2 GROUP BY hour, iface, tin \
                 ORDER BY hour, iface, tin",
            )
            .map_err(|e| sqlite(&self.path, e))?;
        let rows = st
            .query_map([since, until], |r| {
                let n = |i: usize| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
                Ok(ShaperRow {
                    minute: r.get(0)?,
                    iface: r.get(1)?,
                    tin: r.get(2)?,
                    rate_bps: n(3)?,
                    packets: n(4)?,
                    bytes: n(5)?,
                    drops: n(6)?,
                    marks: n(7)?,
                    ack_drops: n(8)?,
                    backlog_bytes: n(9)?,
                    pk_delay_us: n(10)?,
                    av_delay_us: n(11)?,
                    sp_delay_us: n(12)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| sqlite(&self.path, e))?;
        Ok(rows)
    }

    pub fn add_test(&mut self, t: &TestRow) -> Result<Written, StoreError> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO tests VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
                params![
                    t.started,
                    t.target,
                    t.test,
                    t.length_s,
                    t.result_path,
                    t.grade,
                    t.added_ms,
                    t.added_down_ms,
                    t.added_up_ms,
                    t.idle_ms,
                    t.down_mbps,
                    t.up_mbps,
                    t.loss_percent,
                    t.bytes as i64,
                    t.skipped,
                    t.ended,
                ],
            )?;
            Ok(())
        })
    }

    /// A silence of `target` began at `started` (Unix seconds), for the reason `why`.
    pub fn open_gap(
        &mut self,
        started: i64,
        target: &str,
        why: &str,
    ) -> Result<Written, StoreError> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO gaps VALUES (?1, NULL, ?2, ?3)",
                params![started, target, why],
            )?;
            Ok(())
        })
    }

    /// The open silence of `target` ended at `ended`.
    pub fn close_gap(&mut self, ended: i64, target: &str) -> Result<Written, StoreError> {
        self.write(|tx| {
            tx.execute(
                "UPDATE gaps SET ended = ?1 WHERE target = ?2 AND ended IS NULL",
                params![ended, target],
            )?;
            Ok(())
        })
    }

    /// Deletes minutes and gaps older than `keep_probes_s` and tests older than `keep_tests_s`
    /// before `now`.
    pub fn retain(
        &mut self,
        now: i64,
        keep_probes_s: i64,
        keep_tests_s: i64,
    ) -> Result<Written, StoreError> {
        self.write(|tx| {
            tx.execute(
                "DELETE FROM minutes WHERE minute < ?1",
                [now - keep_probes_s],
            )?;
            tx.execute("DELETE FROM gaps WHERE ended < ?1", [now - keep_probes_s])?;
            tx.execute("DELETE FROM tests WHERE started < ?1", [now - keep_tests_s])?;
            Ok(())
        })
    }

    /// One transaction; a full disk deletes the oldest tenth of the minutes and tries once more,
    /// and if it is still full the rows are not kept.
    fn write(
        &mut self,
        f: impl Fn(&rusqlite::Transaction) -> rusqlite::Result<()>,
    ) -> Result<Written, StoreError> {
        let attempt = |conn: &mut Connection| -> rusqlite::Result<()> {
            let tx = conn.transaction()?;
            f(&tx)?;
            tx.commit()
        };
        // Below the headroom the oldest minutes make room before the disk is full: SQLite then
        // reuses their pages and the file stops growing.
        let mut made_room = 0;
        if self.free_bytes().is_some_and(|b| b < HEADROOM_BYTES)
            && self.reusable_bytes() < REUSE_BYTES
        {
            made_room = self.make_room();
        }
        match attempt(&mut self.conn) {
            Ok(()) => Ok(Written {
                made_room,
                dropped: false,
            }),
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DiskFull) => {
                made_room += self.make_room();
                match attempt(&mut self.conn) {
                    Ok(()) => Ok(Written {
                        made_room,
                        dropped: false,
                    }),
                    Err(e) if e.sqlite_error_code() == Some(ErrorCode::DiskFull) => Ok(Written {
                        made_room,
                        dropped: true,
                    }),
                    Err(e) => Err(sqlite(&self.path, e)),
                }
            }
            Err(e) => Err(sqlite(&self.path, e)),
        }
    }

    /// Deletes the oldest tenth of the minutes (freeing the reserve first when even that cannot
    /// be written), folds the log back into the file, and puts the reserve back if it fits.
    fn make_room(&mut self) -> usize {
        let delete = |conn: &Connection| -> rusqlite::Result<usize> {
            let rows: i64 = conn.query_row("SELECT count(*) FROM minutes", [], |r| r.get(0))?;
            let cut: Option<i64> = conn
                .query_row(
                    "SELECT minute FROM minutes ORDER BY minute LIMIT 1 OFFSET ?1",
                    [(rows / 10).max(1) - 1],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(cut) = cut else { return Ok(0) };
            conn.execute("DELETE FROM shaper WHERE minute <= ?1", [cut])?;
            conn.execute("DELETE FROM minutes WHERE minute <= ?1", [cut])
        };
        let deleted = match delete(&self.conn) {
            Err(e) if e.sqlite_error_code() == Some(ErrorCode::DiskFull) => {
                let _ = std::fs::remove_file(self.reserve_path());
                delete(&self.conn)
            }
            other => other,
        }
        .unwrap_or(0);
        // The deleted pages are reused by the next writes.
        let _ = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        self.keep_reserve();
        deleted
    }

    /// Bytes of deleted rows' pages that SQLite will fill before it grows the file.
    fn reusable_bytes(&self) -> u64 {
        let pragma = |name: &str| -> u64 {
            self.conn
                .query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
                .map_or(0, |v| v.max(0) as u64)
        };
        pragma("freelist_count") * pragma("page_size")
    }

    /// Free bytes on the history's filesystem (`None` where it cannot be told).
    fn free_bytes(&self) -> Option<u64> {
        use std::os::unix::ffi::OsStrExt;
        let dir = self.path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir =
            std::ffi::CString::new(dir.unwrap_or(Path::new(".")).as_os_str().as_bytes()).ok()?;
        // SAFETY: statvfs fills the zeroed struct we own from a NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        (unsafe { libc::statvfs(dir.as_ptr(), &mut st) } == 0)
            .then(|| st.f_bavail as u64 * st.f_frsize as u64)
    }

    pub fn minutes(&self, since: i64, until: i64) -> Result<Vec<MinuteRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT minute, target, load, testing, sent, lost, rtt, owd_up, owd_down, \
                 rx_mbps, tx_mbps, rtt_hist FROM minutes WHERE minute >= ?1 AND minute < ?2 \
                 ORDER BY minute, target, load, testing",
            )
            .map_err(|e| sqlite(&self.path, e))?;
        let rows = st
            .query_map([since, until], |r| {
                let load: String = r.get(2)?;
                let hist: String = r.get(11)?;
                Ok(MinuteRow {
                    minute: r.get(0)?,
                    target: r.get(1)?,
                    load: LoadBand::parse(&load).unwrap_or(LoadBand::Unknown),
                    testing: r.get(3)?,
                    sent: r.get(4)?,
                    lost: r.get(5)?,
                    rtt_ms: unjson(r.get(6)?),
                    owd_up_ms: unjson(r.get(7)?),
                    owd_down_ms: unjson(r.get(8)?),
                    rx_mbps: r.get(9)?,
                    tx_mbps: r.get(10)?,
                    rtt_hist: serde_json::from_str(&hist).unwrap_or_default(),
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| sqlite(&self.path, e))?;
        Ok(rows)
    }

    pub fn tests(&self, since: i64, until: i64) -> Result<Vec<TestRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT started, target, test, length_s, result_path, grade, added_ms, \
                 added_down_ms, added_up_ms, idle_ms, down_mbps, up_mbps, loss_percent, bytes, \
                 skipped, ended FROM tests WHERE started >= ?1 AND started < ?2 ORDER BY started",
            )
            .map_err(|e| sqlite(&self.path, e))?;
        let rows = st
            .query_map([since, until], |r| {
                Ok(TestRow {
                    started: r.get(0)?,
                    target: r.get(1)?,
                    test: r.get(2)?,
                    length_s: r.get(3)?,
                    result_path: r.get(4)?,
                    grade: r.get(5)?,
                    added_ms: r.get(6)?,
                    added_down_ms: r.get(7)?,
                    added_up_ms: r.get(8)?,
                    idle_ms: r.get(9)?,
                    down_mbps: r.get(10)?,
                    up_mbps: r.get(11)?,
                    loss_percent: r.get(12)?,
                    bytes: r.get::<_, i64>(13)?.max(0) as u64,
                    skipped: r.get(14)?,
                    ended: r.get(15)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| sqlite(&self.path, e))?;
        Ok(rows)
    }

    /// Gaps that overlap the window (an open one included).
    pub fn gaps(&self, since: i64, until: i64) -> Result<Vec<Gap>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT started, ended, target, why FROM gaps \
                 WHERE started < ?2 AND (ended IS NULL OR ended >= ?1) ORDER BY started",
            )
            .map_err(|e| sqlite(&self.path, e))?;
        let rows = st
            .query_map([since, until], |r| {
                Ok(Gap {
                    started: r.get(0)?,
                    ended: r.get(1)?,
                    target: r.get(2)?,
                    why: r.get(3)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(|e| sqlite(&self.path, e))?;
        Ok(rows)
    }

    /// Bytes the tests that started at or after `since` moved (the day's budget spent so far).
    pub fn test_bytes_since(&self, since: i64) -> Result<u64, StoreError> {
        let b: Option<i64> = self
            .conn
            .query_row(
                "SELECT sum(bytes) FROM tests WHERE started >= ?1",
                [since],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| sqlite(&self.path, e))?
            .flatten();
        Ok(b.unwrap_or(0).max(0) as u64)
    }
}

impl Store {
    /// `bloatlab history`: the tests, hours, gaps and worst hours of a window.
    pub fn history(&self, since: i64, until: i64) -> Result<History, StoreError> {
        let minutes = self.minutes(since, until)?;
        let hours = hours(&minutes);
        let mut worst: Vec<HourRow> = hours
            .iter()
            .filter(|h| h.rtt_ms.is_some() && h.load != LoadBand::Idle)
            .cloned()
            .collect();
        // Busy hours before light ones, then by p90.
        worst.sort_by(|a, b| {
            let p90 = |h: &HourRow| h.rtt_ms.map_or(0.0, |q| q.p90);
            (b.load == LoadBand::Busy)
                .cmp(&(a.load == LoadBand::Busy))
                .then(p90(b).total_cmp(&p90(a)))
        });
        worst.truncate(5);
        Ok(History {
            format: bloatlab_result::history::FORMAT.into(),
            version: bloatlab_result::history::VERSION,
            since,
            until,
            tests: self.tests(since, until)?,
            hours,
            gaps: self.gaps(since, until)?,
            worst_hours: worst,
            hours_of_day: hours_of_day(&minutes),
            shaper: self.shaper_hours(since, until)?,
        })
    }
}

/// Minutes merged per hour and load band, the scheduled tests' own minutes left out.
pub fn hours(minutes: &[MinuteRow]) -> Vec<HourRow> {
    merge_by(minutes, |minute| minute - minute.rem_euclid(3600))
}

/// Minutes merged per hour of the (UTC) day, 0..23, over every day of the window: when in the
/// day the line bloats.
pub fn hours_of_day(minutes: &[MinuteRow]) -> Vec<HourRow> {
    merge_by(minutes, |minute| minute.rem_euclid(86_400) / 3600)
}

fn merge_by(minutes: &[MinuteRow], key: impl Fn(i64) -> i64) -> Vec<HourRow> {
    // (sent, lost, round trips in µs -> count) per (key, band)
    type Hour = (u64, u64, BTreeMap<u64, u64>);
    let mut by: BTreeMap<(i64, LoadBand), Hour> = BTreeMap::new();
    for m in minutes.iter().filter(|m| !m.testing) {
        let e = by.entry((key(m.minute), m.load));
        let (sent, lost, hist) = e.or_default();
        *sent += u64::from(m.sent);
        *lost += u64::from(m.lost);
        for &(us, n) in &m.rtt_hist {
            *hist.entry(us).or_default() += n;
        }
    }
    by.into_iter()
        .map(|((hour, load), (sent, lost, hist))| HourRow {
            hour,
            load,
            sent,
            lost,
            rtt_ms: quantiles(&hist),
        })
        .collect()
}

/// Quantiles of a histogram of microseconds, ms (nearest rank).
pub fn quantiles(hist: &BTreeMap<u64, u64>) -> Option<Quantiles> {
    let n: u64 = hist.values().sum();
    if n == 0 {
        return None;
    }
    let at = |q: f64| {
        let rank = ((q * n as f64).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (&us, &c) in hist {
            seen += c;
            if seen >= rank {
                return us as f64 / 1000.0;
            }
        }
        unreachable!("rank within the count")
    };
    Some(Quantiles {
        p50: at(0.5),
        p90: at(0.9),
        p99: at(0.99),
        max: at(1.0),
    })
}

fn json<T: serde::Serialize>(v: &Option<T>) -> Option<String> {
    v.as_ref()
        .map(|v| serde_json::to_string(v).expect("quantiles serialize"))
}

fn unjson<T: serde::de::DeserializeOwned>(s: Option<String>) -> Option<T> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

fn sqlite(path: &Path, source: rusqlite::Error) -> StoreError {
    StoreError::Sqlite {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests;
