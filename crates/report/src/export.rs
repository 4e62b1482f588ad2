//! Exports for other tools: flent's data format (so `flent -i FILE` plots and summarises a
//! bloatlab run) and tidy CSV, one row per sample.

use crate::view::bin;
use bloatlab_result::{ResultFile, SeriesKind};
use serde_json::{json, Map, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// flent's step between x values (its default sampling step).
pub const FLENT_STEP: f64 = 0.2;
/// flent's file format version this writes.
pub const FLENT_FORMAT: u32 = 3;

/// flent's name for a bloatlab test.
fn flent_test(test: &str) -> &'static str {
    match test {
        "rrul" => "rrul",
        "rrul-be" => "rrul_be",
        "tcp-down" => "tcp_download",
        "tcp-up" => "tcp_upload",
        "tcp-bidir" => "tcp_bidirectional",
        "voip" => "voip",
        _ => "ping",
    }
}

/// flent's series name for a bloatlab series, e.g. "tcp down 3 CS5" -> "TCP download CS5",
/// "rtt udp-be" -> "Ping (ms) UDP BE".
pub fn flent_series_name(name: &str, rrul_like: bool) -> Option<String> {
    let parts: Vec<&str> = name.split(' ').collect();
    match parts.as_slice() {
        ["tcp", dir, n, dscp] => {
            let d = if *dir == "down" { "download" } else { "upload" };
            Some(if rrul_like {
                format!("TCP {d} {dscp}")
            } else {
                format!("TCP {d} {n}")
            })
        }
        ["rtt", stream] => Some(format!(
            "Ping (ms) {}",
            stream.replace('-', " ").to_uppercase()
        )),
        _ => None,
    }
}

fn iso_micros(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

pub fn to_flent(r: &ResultFile) -> Value {
    let start = humantime::parse_rfc3339(&r.metadata.start_time).unwrap_or(UNIX_EPOCH);
    let t0 = start
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let end = r.metadata.phases.iter().map(|p| p.end).fold(0.0, f64::max);
    let n = (end / FLENT_STEP).ceil() as usize;
    let x_values: Vec<f64> = (0..n).map(|i| (i as f64 + 0.5) * FLENT_STEP).collect();
    let rrul_like = r.metadata.test.starts_with("rrul");
    let mut results = Map::new();
    let mut raw = Map::new();
    let mut series_meta = Map::new();
    let mut sums: [Vec<Option<f64>>; 2] = [vec![None; n], vec![None; n]];
    for s in &r.series {
        let (Some(name), true) = (
            flent_series_name(&s.name, rrul_like),
            matches!(s.kind, SeriesKind::Throughput | SeriesKind::Latency),
        ) else {
            continue;
        };
        let binned = bin(&s.samples, FLENT_STEP);
        let mut aligned: Vec<Option<f64>> = vec![None; n];
        for (t, v) in binned {
            let i = (t / FLENT_STEP).floor() as usize;
            if i < n {
                aligned[i] = v;
            }
        }
        if s.kind == SeriesKind::Throughput {
            let sum = &mut sums[(s.direction.as_deref() == Some("up")) as usize];
            for (acc, v) in sum.iter_mut().zip(&aligned) {
                if let Some(v) = v {
                    *acc = Some(acc.unwrap_or(0.0) + v);
                }
            }
        }
        results.insert(name.clone(), json!(aligned));
        // Raw values carry every sample at its own time: flent's statistics use them.
        let rv: Vec<Value> = s
            .samples
            .iter()
            .enumerate()
            .filter_map(|(i, (t, v))| v.map(|v| json!({"t": t0 + t, "val": v, "seq": i})))
            .collect();
        raw.insert(name.clone(), Value::Array(rv));
        series_meta.insert(
            name,
            json!({"UNITS": if s.kind == SeriesKind::Throughput { "Mbits/s" } else { "ms" }}),
        );
    }
    for (i, name) in ["TCP download sum", "TCP upload sum"].iter().enumerate() {
        if sums[i].iter().any(Option::is_some) {
            results.insert(name.to_string(), json!(sums[i]));
            series_meta.insert(name.to_string(), json!({"UNITS": "Mbits/s"}));
        }
    }
    let time = iso_micros(start);
    json!({
        "version": FLENT_FORMAT,
        "x_values": x_values,
        "results": results,
        "raw_values": raw,
        "metadata": {
            "NAME": flent_test(&r.metadata.test),
            "TITLE": format!("bloatlab {}", r.metadata.test),
            "TIME": time,
            "T0": time,
            "HOST": r.metadata.server.address.clone().unwrap_or_default(),
            "HOSTS": [r.metadata.server.address.clone().unwrap_or_default()],
            "LOCAL_HOST": r.metadata.client.name,
            "LENGTH": end,
            "TOTAL_LENGTH": end,
            "STEP_SIZE": FLENT_STEP,
            "FLENT_VERSION": "2.1.1",
            "BLOATLAB_VERSION": r.metadata.tool_version,
            "SERIES_META": series_meta,
            "DATA_FILENAME": Value::Null,
        }
    })
}

/// Tidy CSV: `series,kind,direction,dscp,unit,t,value`; a lost probe has an empty value.
pub fn to_csv(r: &ResultFile) -> String {
    let mut out = String::from("series,kind,direction,dscp,unit,t,value\n");
    for s in &r.series {
        let kind = serde_json::to_value(s.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let head = format!(
            "{},{},{},{},{}",
            s.name,
            kind,
            s.direction.as_deref().unwrap_or(""),
            s.dscp.map_or(String::new(), |d| d.to_string()),
            s.unit
        );
        for (t, v) in &s.samples {
            out += &format!(
                "{head},{t},{}\n",
                v.map_or(String::new(), |v| v.to_string())
            );
        }
    }
    out
}

/// Writes `value` as flent does: gzipped JSON when the name ends in .gz.
pub fn write_json(path: &std::path::Path, value: &Value) -> std::io::Result<()> {
    let text = serde_json::to_vec(value).expect("plain data");
    let file = std::fs::File::create(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        gz.write_all(&text)?;
        gz.finish()?;
    } else {
        std::io::Write::write_all(&mut std::io::BufWriter::new(file), &text)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_flent() {
        assert_eq!(
            flent_series_name("tcp down 3 CS5", true).as_deref(),
            Some("TCP download CS5")
        );
        assert_eq!(
            flent_series_name("tcp up 2 BE", false).as_deref(),
            Some("TCP upload 2")
        );
        assert_eq!(
            flent_series_name("rtt udp-be", true).as_deref(),
            Some("Ping (ms) UDP BE")
        );
        assert_eq!(flent_series_name("owd up udp-be", true), None);
    }
}
