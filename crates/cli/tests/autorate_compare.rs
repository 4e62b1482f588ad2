//! `bloatlab autorate` driving the lab's own shaper through `lab compare` on a line that
//! slows: a test that takes the machine (CI's first phase), in a module of its own apart from
//! the rest of autorate's tests, which need no such quiet.

use crate::autorate::{compare_on_a_line, log_lines};
use crate::common::*;
use bloatlab_result::autorate::LogLine;

/// A line that slows for good 10 s into the load (30 -> 10 Mbit/s down, 6 -> 2 up; 1000-packet
/// buffers): BASE, 95% of its steps' mean (19 / 3.8 Mbit/s), is above the slow line, where a
/// fixed shaper would fill the buffer (1000 x 1500 B at 10 Mbit/s: 1.2 s; at 2: 6 s).
/// autorate, on the lab's router, must come down to the line and keep the added delay a fraction
/// of that, at most of the line's rate. The fall itself costs what the law allows: both queues
/// grow 2 s a second until the cut (three delayed probes, then 400 ms of growth: up to a
/// second of queue), which the cut drains at half the line's rate within about a second; a
/// second over 100 ms is 5% of the 20 s run, so its p95 is bounded by 300 ms (a quarter of the
/// fixed shaper's 1.2 s; quiet runs read +60 to +105, a busy CI host +155). Once drained, the
/// queues stay short: most of the last ticks' probes see under 30 ms. As it slows, its path
/// lengthens by 15 ms each way (a satellite's new route, as the `starlink` preset's steps do):
/// a delay that no cut drains, taken as the path's own (a `path` line in the log) rather than
/// cut for until the shapers are far below the line. (BENCHMARKS.md has the
/// fixed shapers beside it, and cake-autorate's law, on the moving presets.)
#[test]
fn on_a_line_that_slows_autorate_comes_down_to_it_and_keeps_the_delay_short() {
    // The machine to itself (CI's first phase): the share of the line it carried fell to 64%
    // beside two other labs (76% alone), and beside a build or a guest its delay rose (+376 ms
    // where +77 alone); holding every lab and no guest beside it in CI's shared phase, it
    // waited up to 90 s for a moment with no other lab up, for 28 s of its own.
    let _s = quiet();
    let dir = tmp_path("ar-slows");
    std::fs::create_dir_all(&dir).unwrap();
    let (down, up, path) = (
        dir.join("down.txt"),
        dir.join("up.txt"),
        dir.join("path.txt"),
    );
    std::fs::write(&down, "0 30mbit\n15 10mbit\n").unwrap();
    std::fs::write(&up, "0 6mbit\n15 2mbit\n").unwrap();
    std::fs::write(&path, "0 10ms\n15 25ms\n").unwrap();
    let line = format!(
        "both = {{ delay = 'schedule:{}', limit = 1000 }}\n\
         down = {{ rate = 'schedule:{}' }}\nup = {{ rate = 'schedule:{}' }}\n",
        path.display(),
        down.display(),
        up.display()
    );
    let out = compare_on_a_line(&dir, &line, &["--fix", "autorate"], "20");
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("root") {
        return missing("lab compare needs root");
    }
    let share_of = |r: &serde_json::Value| {
        f(r, "summary.throughput_mbps.down") * 1e6 / f(r, "capacity_bps.down")
    };
    // What one run must show.
    let verdict = |v: &serde_json::Value| -> Result<(), String> {
        let r = &v["runs"][0];
        let p95 = r["added_p95_ms"].as_f64().unwrap();
        let share = share_of(r);
        eprintln!(
            "autorate: p95 +{p95:.1} ms, {:.0}% down, {} changes",
            share * 100.0,
            r["rate_changes"]
        );
        // The reason is formatted only when a bound is missed (it may hold the whole log).
        let check = |ok: bool, why: &dyn Fn() -> String| if ok { Ok(()) } else { Err(why()) };
        check(p95 < 300.0, &|| format!("autorate: p95 +{p95} ms"))?;
        check(share > 0.6, &|| format!("autorate delivered {share}"))?;
        let log = log_lines(std::path::Path::new(r["autorate_log"].as_str().unwrap()));
        // At the slow line each way over the load's last 5 s, not at BASE (19 / 3.8 Mbit/s):
        // it probes a little above what the line carried and cuts when the queue answers, so
        // the mean (the log's clock starts with the run, the line slows 15 s after it; once
        // the load ends the rates decay back towards BASE).
        let loaded: Vec<&LogLine> = log
            .iter()
            .filter(|l| l.event == "tick" && l.down_load_bps > 2e6)
            .collect();
        let tail = &loaded[loaded.len().saturating_sub(5)..];
        check(tail[0].t > 18.0, &|| format!("{tail:?}"))?;
        let mean =
            |k: fn(&LogLine) -> f64| tail.iter().map(|l| k(l)).sum::<f64>() / tail.len() as f64;
        let (d, u) = (mean(|l| l.down_bps), mean(|l| l.up_bps));
        check(d < 1.1 * 10e6 && u < 1.1 * 2e6, &|| {
            format!("{d} / {u} bit/s: {tail:?}")
        })?;
        // The path's 15 ms more joined the baseline; cut after cut for it would have taken
        // the shapers far below the line.
        check(log.iter().any(|l| l.event == "path"), &|| {
            format!("{log:?}")
        })?;
        check(d > 0.6 * 10e6 && u > 0.6 * 2e6, &|| {
            format!("{d} / {u} bit/s: {tail:?}")
        })?;
        let short = |d: Option<f64>| d.is_some_and(|d| d < 30.0);
        let drained = tail
            .iter()
            .filter(|l| short(l.down_delta_ms) && short(l.up_delta_ms))
            .count();
        check(drained >= 3, &|| {
            format!("the queues stay long at the end: {tail:?}")
        })?;
        check(
            log.iter()
                .any(|l| l.event == "rate" && l.why.as_deref() == Some("delivered")),
            &|| "no cut to what the line delivered".into(),
        )
    };
    // Beside CI's other workers on a busy host the download once carried 59.4% of the line
    // (79-80% alone), and once the shaper ended at 5.5 Mbit/s (the line 10) while the flows
    // filled under 60% of it. Load only takes rate away and adds delay, so a run that misses
    // a bound is measured once more, and the test asks one of the two to meet them all; a
    // controller that misses them misses them both times.
    let mut v = json(&out);
    if let Err(why) = verdict(&v) {
        eprintln!("{why}: measuring it again");
        v = json(&compare_on_a_line(
            &dir,
            &line,
            &["--fix", "autorate"],
            "20",
        ));
        if let Err(why) = verdict(&v) {
            panic!("{why}");
        }
    }
    // The report draws the shaper over the line: the capacity steps from 30 to 10 Mbit/s,
    // and the shaper's rate ends near the slow line.
    let html = std::fs::read_to_string(v["report"].as_str().unwrap()).unwrap();
    let data = html
        .split("var RUNS = ")
        .nth(1)
        .unwrap()
        .split(";\n")
        .next()
        .unwrap();
    let views: serde_json::Value = serde_json::from_str(data).unwrap();
    let line = |name: &str| -> Vec<(f64, f64)> {
        let l = views[0]["shaper"].as_array().unwrap().iter();
        let points = l.clone().find(|l| l["name"] == name).unwrap()["points"].clone();
        let points = points.as_array().unwrap().iter();
        let xy = |p: &serde_json::Value| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap());
        points.map(xy).collect()
    };
    let capacity = line("capacity down");
    let first_and_last = (capacity[0].1, capacity.last().unwrap().1);
    assert_eq!(first_and_last, (30.0, 10.0), "{capacity:?}");
    let shaper = line("shaper down");
    assert!(shaper.last().unwrap().1 < 11.0, "{shaper:?}");
}
