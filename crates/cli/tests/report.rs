//! Reports, plots and exports of real result files (measured on loopback here), checked in a
//! real browser, by real flent, and against the result data.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Runs measured once for all tests here: an rrul, a ping and an rpm (whose ramp gives the
/// report its RPM curve).
fn results() -> &'static (PathBuf, PathBuf, PathBuf) {
    static R: OnceLock<(PathBuf, PathBuf, PathBuf)> = OnceLock::new();
    R.get_or_init(|| {
        let _g = serial();
        let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q"]);
        let rrul = tmp_path("rrul.json.gz");
        let ping = tmp_path("ping.json");
        let rpm = tmp_path("rpm.json");
        for (args, out) in [
            (vec!["rrul", "-l", "3", "--idle", "1"], &rrul),
            (vec!["ping", "-l", "2", "--idle", "0"], &ping),
            (vec!["rpm", "-l", "4", "--idle", "1"], &rpm),
        ] {
            let mut all = vec!["test", args[0], &srv.addr];
            all.extend_from_slice(&args[1..]);
            all.extend_from_slice(&["-q", "-o", out.to_str().unwrap()]);
            let o = run(&[], &all);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        (rrul, ping, rpm)
    })
}

fn ok(args: &[&str]) {
    let o = run(&[], args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn html_report_renders_every_chart_in_headless_chromium() {
    let (rrul, ping, rpm) = results();
    let html = tmp_path("report.html");
    ok(&[
        "report",
        rrul.to_str().unwrap(),
        ping.to_str().unwrap(),
        rpm.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(
        !text.contains("src=\"http") && !text.contains("cdn."),
        "the report must open offline"
    );
    let Some((dom, rendered)) = rendered_page(&html) else {
        return;
    };
    // The CDF, then per run throughput + latency + boxes (rrul), latency + boxes (ping), and
    // throughput + latency + boxes + the RPM curve (rpm).
    assert_eq!(rendered, 10, "charts rendered");
    assert!(
        dom.contains("RPM as the ramp added load connections"),
        "the RPM curve is drawn"
    );
    let url = format!("file://{}", html.display());
    let common = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--virtual-time-budget=10000",
    ];
    assert!(dom.matches("<path").count() > 50, "charts drew little");
    let shot = tmp_path("report.png");
    let s = Command::new("chromium")
        .args(common)
        .arg("--window-size=1280,2600")
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(s.status.success());
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 50_000,
        "screenshot {} bytes",
        png.len()
    );
    eprintln!("screenshot: {}", shot.display());
}

#[test]
fn locate_on_loopback_writes_a_locate_file_whose_report_renders_in_headless_chromium() {
    let dir = tmp_path("locate");
    let v = {
        let _g = serial();
        let srv = ServerProc::start(&[], "127.0.0.1:0", &["-q"]);
        let o = run(
            &[],
            &[
                "locate",
                &srv.addr,
                "-l",
                "4",
                "--idle",
                "1",
                "--phases",
                "download",
                "--hop-interval",
                "0.2",
                "--json",
                "-q",
                "--out-dir",
                dir.to_str().unwrap(),
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        json(&o)
    };
    // Loopback is one hop, the destination itself, which answers every probe (no ICMP rate
    // limit on loopback) and adds nothing under load worth a verdict.
    let hops = v["hops"].as_array().unwrap();
    assert_eq!(hops.len(), 1, "{hops:?}");
    assert_eq!(
        (
            hops[0]["ttl"].as_u64(),
            hops[0]["address"].as_str(),
            hops[0]["destination"].as_bool()
        ),
        (Some(1), Some("127.0.0.1"), Some(true))
    );
    assert_eq!(hops[0]["answered"], hops[0]["sent"]);
    assert_eq!(
        hops[0]["name"], "localhost",
        "/etc/hosts answers the reverse lookup"
    );
    // Five probes a second over the 2 s of load after the queues' 2 s to fill.
    assert!(
        hops[0]["phases"]["download"]["answered"].as_u64().unwrap() >= 5,
        "{}",
        hops[0]
    );
    assert!(v["verdict"]["hop"].is_null(), "{}", v["verdict"]);
    let file = PathBuf::from(v["file"].as_str().unwrap());
    let raw: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(
        (
            raw["format"].as_str(),
            raw["version"].as_u64(),
            raw["partial"].as_bool()
        ),
        (Some("bloatlab-locate"), Some(1), Some(false))
    );
    assert!(raw["probes"].as_array().unwrap().len() as u64 >= hops[0]["sent"].as_u64().unwrap());
    let Some((dom, rendered)) = report_rendered(&[file.to_str().unwrap()], "locate.html") else {
        return;
    };
    assert_eq!(rendered, 1, "the hop chart rendered");
    assert!(
        dom.contains("data-points=\"1\""),
        "one hop with download samples"
    );
    assert!(dom.contains("No hop bloats"), "the verdict is on the page");
}

fn view(p: &Path) -> bloatlab_report::RunView {
    bloatlab_report::RunView::new(&bloatlab_result::read(p).unwrap(), "x")
}

#[test]
fn plots_are_non_empty_images_carrying_the_data() {
    let (rrul, ping, _) = results();
    for kind in ["timeseries", "cdf", "box"] {
        for ext in ["png", "svg"] {
            let out = tmp_path(&format!("plot-{kind}.{ext}"));
            ok(&[
                "plot",
                rrul.to_str().unwrap(),
                ping.to_str().unwrap(),
                "--kind",
                kind,
                "-o",
                out.to_str().unwrap(),
            ]);
            let bytes = std::fs::read(&out).unwrap();
            assert!(bytes.len() > 5_000, "{kind}.{ext}: {} bytes", bytes.len());
            if ext == "png" {
                assert!(bytes.starts_with(b"\x89PNG"));
            }
        }
    }
    // The CDF lines hold exactly the result's distribution: one polyline per run with as many
    // points as its CDF.
    let svg = std::fs::read_to_string(tmp_path("plot-cdf.svg")).unwrap();
    let counts: Vec<usize> = svg
        .split("<polyline")
        .skip(1)
        .map(|p| {
            p.split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap()
                .split_whitespace()
                .count()
        })
        .collect();
    for p in [rrul, ping] {
        let n = view(p).cdf.len();
        assert!(
            n > 10 && counts.contains(&n),
            "a CDF of {n} points is not drawn: {counts:?}"
        );
    }
    // A box per stream and phase: 3 streams x 2 phases for rrul, 1 x 1 for ping.
    assert_eq!(view(rrul).boxes.len() + view(ping).boxes.len(), 7);
    let o = run(
        &[],
        &[
            "plot",
            ping.to_str().unwrap(),
            "-o",
            tmp_path("x.jpg").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains(".png or .svg"));
}

#[test]
fn flent_reads_our_export_and_agrees_on_the_numbers() {
    let (rrul, _, _) = results();
    let out = tmp_path("rrul.flent.gz");
    ok(&[
        "export",
        rrul.to_str().unwrap(),
        "--format",
        "flent",
        "-o",
        out.to_str().unwrap(),
    ]);
    let csv = tmp_path("rrul.csv");
    ok(&[
        "export",
        rrul.to_str().unwrap(),
        "--format",
        "csv",
        "-o",
        csv.to_str().unwrap(),
    ]);
    let r = bloatlab_result::read(rrul).unwrap();
    let samples: usize = r.series.iter().map(|s| s.samples.len()).sum();
    assert_eq!(
        std::fs::read_to_string(&csv).unwrap().lines().count(),
        samples + 1
    );
    if !have("flent") {
        return missing("flent is not installed (apt-get install flent)");
    }
    let o = Command::new("flent")
        .args(["-i", out.to_str().unwrap(), "-f", "summary"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "flent failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // flent's statistics over the whole run, against the same statistics of our raw samples.
    let values = |name: &str| -> Vec<f64> {
        let mut v: Vec<f64> = r
            .series(name)
            .unwrap()
            .samples
            .iter()
            .filter_map(|s| s.1)
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let line = |series: &str| -> Vec<f64> {
        let l = text
            .lines()
            .find(|l| l.trim_start().starts_with(series))
            .unwrap_or_else(|| panic!("flent summary lacks {series}:\n{text}"));
        l.split(':')
            .nth(1)
            .unwrap()
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let ping = values("rtt udp-be");
    let flent_ping = line("Ping (ms) UDP BE");
    let median = ping[ping.len() / 2].min(ping[(ping.len() - 1) / 2]) / 2.0
        + ping[ping.len() / 2].max(ping[(ping.len() - 1) / 2]) / 2.0;
    let mean = ping.iter().sum::<f64>() / ping.len() as f64;
    assert!(
        (flent_ping[0] - mean).abs() < 0.01 + mean * 1e-3,
        "flent mean {} vs ours {mean}",
        flent_ping[0]
    );
    assert!(
        (flent_ping[1] - median).abs() < 0.01 + median * 1e-3,
        "flent median {} vs ours {median}",
        flent_ping[1]
    );
    let down = values("tcp down 1 BE");
    let mean = down.iter().sum::<f64>() / down.len() as f64;
    let flent_down = line("TCP download BE");
    assert!(
        (flent_down[0] - mean).abs() < 0.01 + mean * 1e-3,
        "flent mean {} vs ours {mean}",
        flent_down[0]
    );
}
