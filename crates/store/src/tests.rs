use super::*;

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("bloatlab-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn minute(minute: i64, load: LoadBand, rtts_us: &[u64]) -> MinuteRow {
    let mut hist = BTreeMap::new();
    for &us in rtts_us {
        *hist.entry(us).or_insert(0u64) += 1;
    }
    MinuteRow {
        minute,
        target: "server.example:4040".into(),
        load,
        testing: false,
        sent: rtts_us.len() as u32 + 1,
        lost: 1,
        rtt_ms: quantiles(&hist),
        owd_up_ms: None,
        owd_down_ms: Some(Quantiles {
            p50: 1.0,
            p90: 2.0,
            p99: 3.0,
            max: 4.0,
        }),
        rx_mbps: 12.5,
        tx_mbps: 0.25,
        rtt_hist: hist.into_iter().collect(),
    }
}

#[test]
fn what_is_written_reads_back_and_a_new_file_is_marked_ours() {
    let d = TempDir::new("roundtrip");
    let path = d.0.join("h.db");
    let mut s = Store::open(&path).unwrap();
    // In the order they read back: by minute, target, then band by name.
    let rows = vec![
        minute(600, LoadBand::Busy, &[90_000]),
        minute(600, LoadBand::Idle, &[10_000, 11_000]),
    ];
    assert_eq!(s.add_minutes(&rows).unwrap(), Written::default());
    let t = TestRow {
        started: 630,
        target: "server.example:4040".into(),
        test: "rrul-be".into(),
        length_s: 10.0,
        grade: Some("C".into()),
        added_ms: Some(120.0),
        bytes: 25_000_000,
        ..TestRow::default()
    };
    s.add_test(&t).unwrap();
    s.open_gap(700, &t.target, "no answer").unwrap();
    s.close_gap(760, &t.target).unwrap();
    drop(s);
    let r = Store::open_read(&path).unwrap();
    assert_eq!(r.minutes(0, 10_000).unwrap(), rows);
    assert_eq!(r.tests(0, 10_000).unwrap(), vec![t]);
    assert_eq!(r.test_bytes_since(600).unwrap(), 25_000_000);
    assert_eq!(r.test_bytes_since(631).unwrap(), 0);
    let g = r.gaps(0, 10_000).unwrap();
    assert_eq!((g.len(), g[0].ended), (1, Some(760)));
    let id: i32 = r
        .conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    assert_eq!((id, r.version().unwrap()), (APPLICATION_ID, SCHEMA_VERSION));
}

#[test]
fn foreign_and_damaged_files_are_refused_and_left_as_they_were() {
    let d = TempDir::new("foreign");
    let text = d.0.join("notes.txt");
    std::fs::write(&text, "my shopping list\n").unwrap();
    assert!(matches!(
        Store::open(&text),
        Err(StoreError::Foreign { .. })
    ));
    assert_eq!(std::fs::read(&text).unwrap(), b"my shopping list\n");

    let other = d.0.join("other.db");
    {
        let c = Connection::open(&other).unwrap();
        c.execute_batch("CREATE TABLE contacts (name TEXT); INSERT INTO contacts VALUES ('x');")
            .unwrap();
    }
    let before = std::fs::read(&other).unwrap();
    let e = Store::open(&other)
        .err()
        .expect("another program's database");
    assert!(e.to_string().contains("not a bloatlab history"), "{e}");
    assert_eq!(std::fs::read(&other).unwrap(), before);

    // Our header, then garbage: SQLite's own checks find it.
    let broken = d.0.join("broken.db");
    {
        Store::open(&broken)
            .unwrap()
            .add_minutes(&[minute(60, LoadBand::Idle, &[1000])])
            .unwrap();
    }
    let mut bytes = std::fs::read(&broken).unwrap();
    for b in bytes[100..].iter_mut() {
        *b = 0xA5;
    }
    std::fs::write(&broken, &bytes).unwrap();
    let _ = std::fs::remove_file(d.0.join("broken.db-wal"));
    let e = Store::open(&broken).err().expect("a damaged file");
    assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
    assert_eq!(std::fs::read(&broken).unwrap(), bytes);
}

#[test]
fn a_newer_schema_is_refused_and_an_older_one_migrated() {
    let d = TempDir::new("schema");
    let newer = d.0.join("newer.db");
    {
        let c = Connection::open(&newer).unwrap();
        c.execute_batch(MIGRATIONS[0]).unwrap();
        c.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    assert!(matches!(
        Store::open(&newer),
        Err(StoreError::TooNew { .. })
    ));
    // Every version from the first on: a file made by the first steps only is taken the rest of
    // the way, keeping its rows.
    for from in 1..=SCHEMA_VERSION {
        let p = d.0.join(format!("v{from}.db"));
        {
            let c = Connection::open(&p).unwrap();
            for step in &MIGRATIONS[..from as usize] {
                c.execute_batch(step).unwrap();
            }
            c.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            c.pragma_update(None, "user_version", from).unwrap();
            c.execute(
                "INSERT INTO tests (started, target, test, length_s, bytes) \
                 VALUES (1, 't', 'rrul-be', 10, 5)",
                [],
            )
            .unwrap();
        }
        let s = Store::open(&p).unwrap();
        assert_eq!(s.version().unwrap(), SCHEMA_VERSION);
        assert_eq!(s.test_bytes_since(0).unwrap(), 5);
    }
    assert!(matches!(
        Store::open_read(&d.0.join("absent.db")),
        Err(StoreError::Missing { .. })
    ));
}

#[test]
fn shaper_minutes_sum_into_hours_per_interface_and_tin() {
    let d = TempDir::new("shaper");
    let mut s = Store::open(&d.0.join("h.db")).unwrap();
    let row = |minute: i64, tin: &str, drops: u64, pk: u64| ShaperRow {
        minute,
        iface: "wan".into(),
        tin: tin.into(),
        rate_bps: 50_000_000,
        packets: 1000,
        bytes: 1_500_000,
        drops,
        marks: 1,
        pk_delay_us: pk,
        ..ShaperRow::default()
    };
    s.add_shaper(&[
        row(3600, "Best Effort", 3, 9000),
        row(3660, "Best Effort", 4, 12000),
        row(3660, "Voice", 0, 800),
        row(7200, "Best Effort", 1, 500),
    ])
    .unwrap();
    let h = s.shaper_hours(0, 10_000).unwrap();
    assert_eq!(h.len(), 3);
    assert_eq!(
        (
            h[0].minute,
            h[0].tin.as_str(),
            h[0].packets,
            h[0].drops,
            h[0].marks
        ),
        (3600, "Best Effort", 2000, 7, 2)
    );
    assert_eq!(h[0].pk_delay_us, 12000);
    assert_eq!((h[1].tin.as_str(), h[2].minute), ("Voice", 7200));
    assert_eq!(s.history(0, 10_000).unwrap().shaper, h);
}

#[test]
fn retention_deletes_by_age_per_table() {
    let d = TempDir::new("retain");
    let mut s = Store::open(&d.0.join("h.db")).unwrap();
    let day = 86_400;
    s.add_minutes(&[
        minute(0, LoadBand::Idle, &[1000]),
        minute(10 * day, LoadBand::Idle, &[1000]),
    ])
    .unwrap();
    for started in [0, 10 * day] {
        s.add_test(&TestRow {
            started,
            ..TestRow::default()
        })
        .unwrap();
    }
    s.retain(11 * day, 5 * day, 30 * day).unwrap();
    assert_eq!(s.minutes(0, 20 * day).unwrap().len(), 1);
    assert_eq!(s.tests(0, 20 * day).unwrap().len(), 2);
    s.retain(11 * day, 5 * day, 5 * day).unwrap();
    assert_eq!(s.tests(0, 20 * day).unwrap().len(), 1);
}

#[test]
fn hours_merge_histograms_not_percentiles_and_leave_out_test_minutes() {
    // 59 minutes of 10 ms and one of ten 100 ms probes: the hour's p90 is 10 ms; averaging the
    // minutes' p90s would not be.
    let mut rows: Vec<MinuteRow> = (0..59)
        .map(|i| minute(3600 + i * 60, LoadBand::Idle, &[10_000; 5]))
        .collect();
    rows.push(minute(3600 + 59 * 60, LoadBand::Idle, &[100_000; 10]));
    let mut during_test = minute(3600, LoadBand::Busy, &[500_000]);
    during_test.testing = true;
    rows.push(during_test);
    let h = hours(&rows);
    assert_eq!(h.len(), 1);
    assert_eq!(
        (h[0].hour, h[0].load, h[0].sent, h[0].lost),
        (3600, LoadBand::Idle, 60 * 6 + 5, 60)
    );
    let q = h[0].rtt_ms.unwrap();
    assert_eq!((q.p50, q.p90, q.max), (10.0, 10.0, 100.0));
    assert_eq!(q.p99, 100.0);
    // A day later at the same hour: the hour of the day merges both days.
    let next_day: Vec<MinuteRow> = rows
        .iter()
        .map(|r| MinuteRow {
            minute: r.minute + 86_400,
            ..r.clone()
        })
        .collect();
    let both: Vec<MinuteRow> = rows.into_iter().chain(next_day).collect();
    let d = hours_of_day(&both);
    assert_eq!((d.len(), d[0].hour, d[0].sent), (1, 1, 2 * (60 * 6 + 5)));
}

/// A tmpfs of a few hundred kB, unmounted on drop (also when the test fails).
struct SmallDisk(TempDir);

impl SmallDisk {
    fn mount(name: &str, kib: u32) -> Option<SmallDisk> {
        let d = TempDir::new(name);
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={kib}k"),
                "bloatlab-test",
            ])
            .arg(&d.0)
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(SmallDisk(d));
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs (run as root)"
        );
        eprintln!("skipped: cannot mount a tmpfs (not root?)");
        None
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.0 .0)
            .status();
    }
}

#[test]
fn a_full_disk_costs_the_oldest_minutes_and_the_newest_are_kept() {
    let Some(disk) = SmallDisk::mount("full", 2048) else {
        return;
    };
    let path = disk.0 .0.join("h.db");
    let mut s = Store::open(&path).unwrap();
    let busy: Vec<u64> = (0..300).map(|i| 10_000 + i * 137).collect();
    let mut made_room = 0;
    let mut last = 0;
    // Far more minutes than 2 MB hold (each ~4 kB with its histogram).
    for m in 0..1500 {
        let w = s
            .add_minutes(&[minute(m * 60, LoadBand::Busy, &busy)])
            .unwrap();
        assert!(
            !w.dropped,
            "minute {m} was dropped although old ones could go"
        );
        made_room += w.made_room;
        last = m;
    }
    assert!(made_room > 0, "the disk never filled");
    let kept = s.minutes(0, i64::MAX).unwrap();
    assert_eq!(
        kept.last().map(|r| r.minute),
        Some(last * 60),
        "the newest is kept"
    );
    assert!(kept[0].minute > 0, "the oldest went");
    // Deleted rows' pages are reused: the steady state keeps about what fits (~1.1 MB of 2 MB
    // after the reserve, the headroom and the log), not a shrinking remnant.
    assert!(kept.len() >= 150, "only {} minutes kept", kept.len());
    eprintln!(
        "kept {} of 1500 minutes, {made_room} deleted to make room",
        kept.len()
    );
}
