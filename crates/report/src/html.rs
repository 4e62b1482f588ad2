//! One self-contained HTML file: ECharts (bundled, no CDN) draws the charts from the run data
//! embedded as JSON; the summary table and metadata are plain HTML.

use crate::view::RunView;
use crate::Section;
use bloatlab_result::Summary;

const ECHARTS: &str = include_str!("../assets/echarts.min.js");

/// JSON or JS inside a <script> element must not contain "</script".
fn script_safe(s: &str) -> String {
    s.replace("</", "<\\/")
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn num(v: Option<f64>) -> String {
    v.map_or("–".into(), |v| format!("{v:.1}"))
}

fn summary_row(label: &str, s: &Summary, rpm_column: bool) -> String {
    let p = |x: Option<bloatlab_result::Percentiles>,
             f: fn(&bloatlab_result::Percentiles) -> f64| num(x.as_ref().map(f));
    let loss = if s.loss.sent > 0 {
        format!("{:.2}", s.loss.percent)
    } else {
        "–".into()
    };
    // A grade lowered by loss under load says so under the letter.
    let mut grade = esc(s.grade.as_deref().unwrap_or("–"));
    if let Some(c) = &s.grade_loss_cap {
        grade += &format!(
            "<div class=cap>{} by latency; {:.1}% lost under load</div>",
            esc(&c.latency_grade),
            c.loss_percent
        );
    }
    if let Some(why) = &s.load_missing {
        grade += &format!(
            "<div class=cap>not graded: the load never ran: {}</div>",
            esc(why)
        );
    }
    let rpm = if rpm_column {
        format!("<td>{}</td>", esc(&rpm_cell(s)))
    } else {
        String::new()
    };
    format!(
        "<tr><td>{}</td><td class=grade>{grade}</td>{rpm}<td>{}</td><td>{}</td><td>{}</td>\
            <td>{}</td><td>{}</td><td>{} / {} / {}</td><td>{}</td><td>{}</td><td>{loss}</td></tr>",
        esc(label),
        p(s.latency_ms.idle, |x| x.p50),
        p(s.latency_ms.loaded, |x| x.p50),
        p(s.latency_ms.loaded, |x| x.p90),
        p(s.latency_ms.loaded, |x| x.p99),
        num(s.added_latency_ms),
        num(s.added_latency_ms_by_class.be),
        num(s.added_latency_ms_by_class.ef),
        num(s.added_latency_ms_by_class.bk),
        num(s.throughput_mbps.down),
        num(s.throughput_mbps.up),
    )
}

/// An RPM test's headline: its responsiveness and band, or each direction's when run one after
/// the other.
fn rpm_cell(s: &Summary) -> String {
    let whole = |r: &bloatlab_result::Rpm| format!("{:.0} ({})", r.rpm, r.band);
    match (&s.rpm, &s.rpm_by_direction) {
        (Some(r), _) => whole(r),
        (None, Some(d)) => {
            let one = |r: &Option<bloatlab_result::Rpm>| {
                r.as_ref().map_or("–".into(), |r| format!("{:.0}", r.rpm))
            };
            format!("down {} / up {}", one(&d.down), one(&d.up))
        }
        (None, None) => "–".into(),
    }
}

/// Page head shared by every report: styles, the error hook (tests read errors from the page)
/// and the bundled ECharts.
fn head(title: &str) -> String {
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222;
  padding: 0 1em; }}
h1 {{ font-size: 1.5em; }} h2 {{ font-size: 1.2em; margin-top: 2em; }}
table {{ border-collapse: collapse; }} td, th {{ padding: .3em .7em; border-bottom: 1px solid #ddd;
  text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} .grade {{ font-weight: bold;
  text-align: center; }} .cap {{ font-weight: normal; font-size: .75em; color: #b00; }}
.chart {{ width: 100%; height: 340px; }} pre {{ font-size: .8em; white-space: pre-wrap;
  overflow-wrap: anywhere; background: #f6f6f6; padding: .5em; }}
#errors {{ color: #b00; white-space: pre-wrap; }}
</style>
<script>
// Anything that goes wrong on the page is shown on it (and tests read it from there).
window.bloatlabErrors = [];
function bloatlabError(msg) {{
  window.bloatlabErrors.push(String(msg));
  var e = document.getElementById('errors');
  if (e) {{ e.textContent = window.bloatlabErrors.join('\n'); }}
  document.documentElement.setAttribute('data-errors', window.bloatlabErrors.length);
}}
window.addEventListener('error', function (ev) {{ bloatlabError(ev.message); }});
var origError = console.error;
console.error = function () {{ bloatlabError(Array.prototype.join.call(arguments, ' '));
  origError.apply(console, arguments); }};
</script>
<script>{echarts}</script>
</head>"#,
        title = esc(title),
        echarts = script_safe(ECHARTS),
    )
}

pub fn render(runs: &[RunView]) -> String {
    render_with(runs, &[])
}

/// The report with `sections` after the summary table.
pub fn render_with(runs: &[RunView], sections: &[Section]) -> String {
    let notes: String = sections
        .iter()
        .map(|s| format!("<h2>{}</h2>\n<pre>{}</pre>\n", esc(&s.title), esc(&s.text)))
        .collect();
    let data = script_safe(&serde_json::to_string(runs).expect("plain data"));
    // RPM tests' headline is their responsiveness: a column of its own where any run has one.
    let rpm_column = runs
        .iter()
        .any(|r| r.summary.rpm.is_some() || r.summary.rpm_by_direction.is_some());
    let rows: String = runs
        .iter()
        .map(|r| summary_row(&r.label, &r.summary, rpm_column))
        .collect();
    let rpm_head = if rpm_column {
        "<th title=\"round trips per minute under working conditions\">RPM</th>"
    } else {
        ""
    };
    let meta: String = runs
        .iter()
        .map(|r| {
            format!(
                "<details><summary>{}{}</summary><pre>{}</pre></details>",
                esc(&r.label),
                if r.partial { " (partial)" } else { "" },
                esc(&serde_json::to_string_pretty(&r.metadata).unwrap_or_default())
            )
        })
        .collect();
    format!(
        r#"{head}<body>
<h1>bloatlab report</h1>
<div id="errors"></div>
<h2>Summary</h2>
<table><tr><th>run</th><th>grade</th>{rpm_head}<th>idle p50 ms</th><th>loaded p50 ms</th>
  <th>p90</th><th>p99</th><th>added ms</th>
  <th title="added latency p50 of the best-effort / EF / CS1 probes">BE / EF / CS1 ms</th>
  <th>down Mbit/s</th><th>up Mbit/s</th><th>loss %</th></tr>
{rows}</table>
{notes}<div id="cdf-section"><h2>Latency under load: CDF of round trips</h2>
<div class="chart" id="cdf"></div></div>
<div id="runs"></div>
<h2>Metadata</h2>
{meta}
<script>
var RUNS = {data};
// SVG rendering: crisp at any zoom, and the drawn elements are part of the page.
function newChart(el) {{
  var chart = echarts.init(el, null, {{ renderer: 'svg' }});
  chart.on('finished', function () {{ el.setAttribute('data-rendered', '1'); }});
  return chart;
}}
function markPoints(el, points) {{
  el.setAttribute('data-points', points);
}}
function phaseAreas(run) {{
  return {{ silent: true, itemStyle: {{ color: 'rgba(120,120,120,0.08)' }},
    label: {{ position: 'insideTop', color: '#666' }},
    data: run.phases.map(function (p) {{ return [{{ name: p.name, xAxis: p.start }}, {{
      xAxis: p.end }}]; }}) }};
}}
// Every time chart of a run spans the same 0..end, so the eye can line up when the queue
// filled with when the throughput rose.
function runEnd(run) {{
  // To a tenth of a second: the axis prints its maximum.
  return run.phases.length ? Math.ceil(10 * Math.max.apply(null, run.phases.map(function (p) {{
    return p.end; }}))) / 10 : null;
}}
// ECharts' own palette, split: the totals take the first two colours and the flows cycle
// through the rest, so no flow wears a total's colour.
var PALETTE = ['#5470c6', '#ee6666', '#91cc75', '#fac858', '#73c0de', '#3ba272', '#fc8452',
  '#9a60b4', '#ea7ccc'];
function timeChart(el, run, lines, unit) {{
  var chart = newChart(el);
  var points = 0;
  var hasTotals = lines.some(function (l) {{ return l.name.indexOf('total') === 0; }});
  var totals = 0, flows = 0;
  var series = lines.map(function (l, i) {{
    points += l.points.length;
    var total = l.name.indexOf('total') === 0;
    var color = !hasTotals ? PALETTE[i % PALETTE.length]
      : total ? PALETTE[totals++ % 2] : PALETTE[2 + flows++ % (PALETTE.length - 2)];
    var s = {{ name: l.name, type: 'line', showSymbol: false, connectNulls: false, data: l.points,
      color: color,
      lineStyle: {{ width: total ? 2.5 : 1 }} }};
    if (i === 0) {{ s.markArea = phaseAreas(run); }}
    return s;
  }});
  chart.setOption({{
    animation: false,
    tooltip: {{ trigger: 'axis', valueFormatter: function (v) {{
      return v == null ? '–' : v.toFixed(2) + ' ' + unit; }} }},
    legend: {{ type: 'scroll', top: 0 }},
    grid: {{ left: 60, right: 30, top: 40, bottom: 70 }},
    xAxis: {{ type: 'value', name: 's', min: 0, max: runEnd(run) }},
    yAxis: {{ type: 'value', name: unit }},
    dataZoom: [{{ type: 'inside' }}, {{ type: 'slider' }}],
    series: series
  }});
  markPoints(el, points);
}}
// A UDP load's burst profile: one second at bucket resolution, its own time range.
function burstChart(el, lines) {{
  var chart = newChart(el);
  var points = 0;
  chart.setOption({{
    animation: false,
    title: {{ text: 'burst profile: Mbit/s per bucket, sent and received', left: 'center',
      bottom: 0, textStyle: {{ fontSize: 12, fontWeight: 'normal' }} }},
    tooltip: {{ trigger: 'axis', valueFormatter: function (v) {{
      return v == null ? '–' : v.toFixed(1) + ' Mbit/s'; }} }},
    legend: {{ top: 0 }},
    grid: {{ left: 60, right: 30, top: 40, bottom: 70 }},
    xAxis: {{ type: 'value', name: 's', scale: true }},
    yAxis: {{ type: 'value', name: 'Mbit/s' }},
    dataZoom: [{{ type: 'inside' }}, {{ type: 'slider', bottom: 25 }}],
    series: lines.map(function (l) {{ points += l.points.length; return {{ name: l.name,
      type: 'line', step: 'end', showSymbol: false, data: l.points, lineStyle: {{ width: 1 }} }};
      }})
  }});
  markPoints(el, points);
}}
function curveChart(el, lines) {{
  var chart = newChart(el);
  var points = 0;
  chart.setOption({{
    animation: false,
    title: {{ text: 'RPM as the ramp added load connections (compare clients at equal counts)',
      left: 'center', bottom: 0, textStyle: {{ fontSize: 12, fontWeight: 'normal' }} }},
    tooltip: {{ trigger: 'axis', valueFormatter: function (v) {{
      return v == null ? '–' : v.toFixed(0) + ' RPM'; }} }},
    legend: {{ top: 0 }},
    grid: {{ left: 60, right: 30, top: 40, bottom: 50 }},
    xAxis: {{ type: 'value', name: 'connections per direction', nameLocation: 'middle',
      nameGap: 25, minInterval: 1 }},
    yAxis: {{ type: 'value', name: 'RPM' }},
    series: lines.map(function (l) {{ points += l.points.length; return {{ name: l.name,
      type: 'line', data: l.points }}; }})
  }});
  markPoints(el, points);
}}
function boxChart(el, run) {{
  var chart = newChart(el);
  chart.setOption({{
    animation: false,
    tooltip: {{ trigger: 'item' }},
    grid: {{ left: 60, right: 30, top: 20, bottom: 60 }},
    xAxis: {{ type: 'category', data: run.boxes.map(function (b) {{ return b.label; }}),
      axisLabel: {{ interval: 0, rotate: 20 }} }},
    yAxis: {{ type: 'value', name: 'RTT ms' }},
    series: [{{ name: 'RTT ms', type: 'boxplot', data: run.boxes.map(function (b) {{ return b.five;
      }}) }}]
  }});
  markPoints(el, run.boxes.length);
}}
(function () {{
  // Tests without round trips (writeback) have no CDF to show.
  if (!RUNS.some(function (r) {{ return r.cdf.length; }})) {{
    document.getElementById('cdf-section').style.display = 'none'; }}
  var cdfEl = document.getElementById('cdf');
  var cdf = newChart(cdfEl);
  var cdfPoints = 0;
  cdf.setOption({{
    animation: false,
    tooltip: {{ trigger: 'axis' }},
    legend: {{ top: 0 }},
    grid: {{ left: 60, right: 30, top: 40, bottom: 70 }},
    xAxis: {{ type: 'value', name: 'RTT ms' }},
    yAxis: {{ type: 'value', name: 'fraction', min: 0, max: 1 }},
    dataZoom: [{{ type: 'inside' }}, {{ type: 'slider' }}],
    series: RUNS.map(function (r) {{ cdfPoints += r.cdf.length; return {{ name: r.label,
      type: 'line', step: 'end', showSymbol: false, data: r.cdf }}; }})
  }});
  markPoints(cdfEl, cdfPoints);
  var host = document.getElementById('runs');
  RUNS.forEach(function (run, i) {{
    var h = document.createElement('h2');
    h.textContent = run.label + ' (' + run.test + (run.partial ? ', partial' : '') + ')';
    host.appendChild(h);
    [['throughput', 'Mbit/s'], ['shaper', 'Mbit/s'], ['memory', 'MB'], ['latency', 'ms'],
      ['boxes', null], ['burst', null], ['rpm_curve', null]].forEach(function (k) {{
      if (!run[k[0]].length) {{ return; }}
      var el = document.createElement('div');
      el.className = 'chart';
      el.id = k[0] + '-' + i;
      host.appendChild(el);
      if (k[1]) {{ timeChart(el, run, run[k[0]], k[1]); }} else if (k[0] === 'burst') {{
        burstChart(el, run.burst); }} else if (k[0] === 'rpm_curve') {{
        curveChart(el, run.rpm_curve); }} else {{ boxChart(el, run); }}
    }});
  }});
  window.addEventListener('resize', function () {{
    document.querySelectorAll('.chart').forEach(function (el) {{
      var c = echarts.getInstanceByDom(el); if (c) {{ c.resize(); }} }});
  }});
}})();
</script>
</body></html>
"#,
        head = head("bloatlab report"),
    )
}

/// The report of a locate file: round trip per hop, idle and loaded (p50 bars, p90 marks),
/// then the verdict and its notes.
pub fn render_hops(h: &crate::hops::HopsView) -> String {
    let data = script_safe(&serde_json::to_string(h).expect("plain data"));
    let caveats: String = h
        .caveats
        .iter()
        .map(|c| format!("<li>{}</li>", esc(c)))
        .collect();
    let rows: String = h
        .hops
        .iter()
        .map(|b| {
            let pair = |i: usize| format!("{} / {}", num(b.p50[i]), num(b.p90[i]));
            format!(
                "<tr><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&b.label),
                b.answered,
                b.sent,
                num(b.idle_p50),
                pair(0),
                pair(1),
                pair(2)
            )
        })
        .collect();
    format!(
        r#"{head}<body>
<h1>Where the bloat is: path to {target}</h1>
<div id="errors"></div>
<p>{start}{partial}</p>
<p class="verdict"><b>{verdict}</b></p>
<ul>{caveats}</ul>
<h2>Round trip per hop, idle and under load (bars p50, marks p90)</h2>
<div class="chart" id="hops"></div>
<table><tr><th>hop</th><th>answers</th><th>idle p50 ms</th><th>download p50 / p90</th>
  <th>upload p50 / p90</th><th>both p50 / p90</th></tr>
{rows}</table>
<script>
var H = {data};
(function () {{
  var el = document.getElementById('hops');
  var chart = echarts.init(el, null, {{ renderer: 'svg' }});
  chart.on('finished', function () {{ el.setAttribute('data-rendered', '1'); }});
  var labels = H.hops.map(function (b) {{ return b.label; }});
  var loads = ['download', 'upload', 'both'];
  var series = [{{ name: 'idle p50', type: 'bar', data: H.hops.map(function (b) {{
    return b.idle_p50; }}) }}];
  var points = 0;
  loads.forEach(function (l, i) {{
    if (!H.hops.some(function (b) {{ return b.p50[i] != null; }})) {{ return; }}
    series.push({{ name: l + ' p50', type: 'bar', data: H.hops.map(function (b) {{
      if (b.p50[i] != null) {{ points++; }} return b.p50[i]; }}) }});
    series.push({{ name: l + ' p90', type: 'scatter', symbol: 'diamond',
      data: H.hops.map(function (b) {{ return b.p90[i]; }}) }});
  }});
  chart.setOption({{
    animation: false,
    tooltip: {{ trigger: 'axis', valueFormatter: function (v) {{
      return v == null ? '–' : v.toFixed(1) + ' ms'; }} }},
    legend: {{ top: 0 }},
    grid: {{ left: 60, right: 30, top: 40, bottom: 60 }},
    xAxis: {{ type: 'category', data: labels, name: 'hop' }},
    yAxis: {{ type: 'value', name: 'RTT ms' }},
    series: series
  }});
  el.setAttribute('data-points', points);
  window.addEventListener('resize', function () {{ chart.resize(); }});
}})();
</script>
</body></html>
"#,
        head = head("bloatlab locate report"),
        target = esc(&h.target),
        start = esc(&h.start_time),
        partial = if h.partial {
            " (partial: the run ended early)"
        } else {
            ""
        },
        verdict = esc(&h.verdict),
    )
}

/// An autorate log as a page: per direction the shaper's rate as autorate set it over what the
/// line carried, the one-way delay over its baseline, and the rate changes by why, the stalls
/// and the shaper's absences. Times are UTC.
pub fn render_autorate(
    h: &bloatlab_result::autorate::LogHeader,
    lines: &[bloatlab_result::autorate::LogLine],
) -> String {
    let data = script_safe(
        &serde_json::to_string(&serde_json::json!({ "header": h, "lines": lines }))
            .expect("plain data"),
    );
    // Any number a file holds: before 1970, after 9999 or not a number reads as a bound.
    let when = |t: f64| {
        let secs = t.clamp(0.0, 253_402_300_799.0);
        let st = std::time::UNIX_EPOCH
            + std::time::Duration::try_from_secs_f64(secs).unwrap_or_default();
        humantime::format_rfc3339_seconds(st).to_string()[..19].replace('T', " ")
    };
    let mut whys = std::collections::BTreeMap::new();
    for l in lines.iter().filter(|l| l.event == "rate") {
        let key = (
            l.dir.clone().unwrap_or_default(),
            l.why.clone().unwrap_or_default(),
        );
        *whys.entry(key).or_insert(0u64) += 1;
    }
    let changes: String = whys
        .iter()
        .map(|((d, w), n)| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{n}</td></tr>",
                esc(d),
                esc(w)
            )
        })
        .collect();
    let events: String = lines
        .iter()
        .filter(|l| l.event != "tick" && l.event != "rate")
        .map(|l| {
            let detail = l.detail.as_deref().map(|d| format!(": {}", esc(d)));
            format!(
                "<tr><td>{}</td><td>{}{}</td><td>{:.1} / {:.1}</td></tr>",
                when(h.started_unix + l.t),
                esc(&l.event),
                detail.unwrap_or_default(),
                l.down_bps / 1e6,
                l.up_bps / 1e6
            )
        })
        .collect();
    let mbit = |b: [f64; 3]| format!("{:.1} / {:.1} / {:.1}", b[0] / 1e6, b[1] / 1e6, b[2] / 1e6);
    let span = lines.last().map_or(0.0, |l| l.t);
    let target = match (h.target.as_str(), h.reflectors.len()) {
        (t, 0) => esc(t),
        ("", n) => format!("{n} ICMP reflectors"),
        (t, n) if t.contains(", ") => {
            format!("{} ({n} ICMP reflectors while none answered)", esc(t))
        }
        (t, n) => format!("{} ({n} ICMP reflectors while it did not answer)", esc(t)),
    };
    format!(
        r#"{head}<body>
<h1>autorate: {shaper}</h1>
<div id="errors"></div>
<p>From {start} UTC for {span:.0} s, probing {target} {rate} times a second, law
<b>{law}</b>. MIN / BASE / MAX: download {down} Mbit/s, upload {up} Mbit/s.</p>
<h2>Download: the shaper's rate over what the line carried</h2>
<div class="chart" id="down"></div>
<h2>Upload: the shaper's rate over what the line carried</h2>
<div class="chart" id="up"></div>
<h2>One-way delay over its baseline (each second's last probe)</h2>
<div class="chart" id="delay"></div>
<h2>Rate changes</h2>
<table><tr><th>direction</th><th>why</th><th>changes</th></tr>
{changes}</table>
<h2>Events</h2>
<table><tr><th>when</th><th>what</th><th>rates then, Mbit/s down / up</th></tr>
{events}</table>
<script>
var A = {data};
var T0 = A.header.started_unix * 1000;
function chart(id, unit, series) {{
  var el = document.getElementById(id);
  var c = echarts.init(el, null, {{ renderer: 'svg' }});
  c.on('finished', function () {{ el.setAttribute('data-rendered', '1'); }});
  var points = 0;
  series.forEach(function (s) {{ points += s.data.length; }});
  c.setOption({{
    animation: false,
    tooltip: {{ trigger: 'axis', valueFormatter: function (v) {{
      return v == null ? '–' : v.toFixed(2) + ' ' + unit; }} }},
    legend: {{ top: 0 }},
    grid: {{ left: 60, right: 30, top: 40, bottom: 70 }},
    xAxis: {{ type: 'time' }},
    yAxis: {{ type: 'value', name: unit }},
    dataZoom: [{{ type: 'inside' }}, {{ type: 'slider' }}],
    series: series.map(function (s) {{ return {{ name: s.name, type: 'line', step: s.step,
      showSymbol: false, data: s.data }}; }})
  }});
  el.setAttribute('data-points', points);
  window.addEventListener('resize', function () {{ c.resize(); }});
}}
var ticks = A.lines.filter(function (l) {{ return l.event == 'tick'; }});
function at(l) {{ return T0 + l.t * 1000; }}
['down', 'up'].forEach(function (d) {{
  chart(d, 'Mbit/s', [
    {{ name: 'shaper', step: 'end', data: A.lines.map(function (l) {{
      return [at(l), l[d + '_bps'] / 1e6]; }}) }},
    {{ name: 'carried', data: ticks.map(function (l) {{
      return [at(l), l[d + '_load_bps'] / 1e6]; }}) }}]);
}});
chart('delay', 'ms', ['down', 'up', 'rtt'].map(function (d) {{
  var name = {{ down: 'download', up: 'upload', rtt: 'round trip (reflectors)' }}[d];
  return {{ name: name, data: ticks.map(function (l) {{
    var v = l[d + '_delta_ms']; return [at(l), v == null ? null : v]; }}) }}; }}));
</script>
</body></html>
"#,
        head = head("bloatlab autorate"),
        shaper = esc(&h.shaper),
        start = when(h.started_unix),
        rate = h.probe_rate,
        law = esc(&h.law),
        down = mbit(h.down_bounds),
        up = mbit(h.up_bounds),
    )
}

/// The monitor's history as a page: the scheduled tests' grades and goodput over time, the
/// light probes' round trip per hour by the line's load, CAKE per hour, and the tables behind
/// them. Times are UTC.
pub fn render_history(h: &bloatlab_result::history::History) -> String {
    let data = script_safe(&serde_json::to_string(h).expect("plain data"));
    let when = |t: i64| {
        let st = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.max(0) as u64);
        humantime::format_rfc3339_seconds(st).to_string()[..16].replace('T', " ")
    };
    let tests: String = h
        .tests
        .iter()
        .rev()
        .map(|t| {
            let what = match &t.skipped {
                Some(why) => format!("<td colspan=5>skipped: {}</td>", esc(why)),
                None => format!(
                    "<td class=grade>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                    esc(t.grade.as_deref().unwrap_or("–")),
                    num(t.added_ms),
                    num(t.down_mbps),
                    num(t.up_mbps),
                    esc(t.ended.as_deref().unwrap_or("–"))
                ),
            };
            format!(
                "<tr><td>{}</td><td>{} {:.0} s</td>{what}</tr>",
                when(t.started),
                esc(&t.test),
                t.length_s
            )
        })
        .collect();
    let worst: String = h
        .worst_hours
        .iter()
        .map(|w| {
            let q = w.rtt_ms.unwrap_or_default();
            format!(
                "<tr><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
                when(w.hour),
                w.load.name(),
                q.p50,
                q.p90,
                w.lost as f64 * 100.0 / w.sent.max(1) as f64
            )
        })
        .collect();
    let gaps: String = h
        .gaps
        .iter()
        .map(|g| {
            format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                when(g.started),
                g.ended.map_or("now".into(), when),
                esc(&g.why)
            )
        })
        .collect();
    let shaper = if h.shaper.is_empty() {
        "<p>No CAKE on the watched interface in this window.</p>".to_string()
    } else {
        "<div class=\"chart\" id=\"shaper\"></div>".to_string()
    };
    format!(
        r#"{head}<body>
<h1>Line history, {since} to {until} UTC</h1>
<div id="errors"></div>
<p>{ntests} scheduled tests, {nhours} hours of light probes, {ngaps} silences of the target.
Load bands: how busy the watched interface was as each probe left (busy: half the capacity the
last test measured in either direction; idle: under a twentieth in both); the scheduled tests'
own minutes are left out.</p>
<h2>Grade of each scheduled test</h2>
<div class="chart" id="grades"></div>
<h2>Round trip per hour by the line's load (p50 solid, p90 dashed)</h2>
<div class="chart" id="hours"></div>
<h2>Goodput of each scheduled test</h2>
<div class="chart" id="goodput"></div>
<h2>CAKE per hour: drops and ECN marks per tin</h2>
{shaper}
<h2>Worst hours</h2>
<table><tr><th>hour</th><th>load</th><th>p50 ms</th><th>p90 ms</th><th>loss %</th></tr>
{worst}</table>
<h2>Scheduled tests</h2>
<table><tr><th>started</th><th>test</th><th>grade</th><th>added ms</th><th>down Mbit/s</th>
  <th>up Mbit/s</th><th>ended</th></tr>
{tests}</table>
<h2>Silences of the target</h2>
<table><tr><th>from</th><th>to</th><th>why</th></tr>
{gaps}</table>
<script>
var H = {data};
var GRADES = ['F', 'D', 'C', 'B', 'A', 'A+'];
function chart(id, option, points) {{
  var el = document.getElementById(id);
  if (!el) {{ return; }}
  var c = echarts.init(el, null, {{ renderer: 'svg' }});
  c.on('finished', function () {{ el.setAttribute('data-rendered', '1'); }});
  option.animation = false;
  option.tooltip = option.tooltip || {{ trigger: 'axis' }};
  option.legend = {{ top: 0 }};
  option.grid = {{ left: 60, right: 30, top: 40, bottom: 40 }};
  option.xAxis = {{ type: 'time' }};
  c.setOption(option);
  el.setAttribute('data-points', points);
  window.addEventListener('resize', function () {{ c.resize(); }});
}}
var ran = H.tests.filter(function (t) {{ return !t.skipped; }});
var graded = ran.filter(function (t) {{ return t.grade; }});
chart('grades', {{
  tooltip: {{ trigger: 'item', formatter: function (p) {{
    var t = p.data[2]; return t.test + ': ' + t.grade + ', added ' +
      (t.added_ms == null ? '–' : t.added_ms.toFixed(1) + ' ms'); }} }},
  yAxis: {{ type: 'value', min: 0, max: 5, interval: 1,
    axisLabel: {{ formatter: function (v) {{ return GRADES[v] || ''; }} }} }},
  series: [{{ name: 'grade', type: 'line', step: 'end', symbolSize: 9,
    data: graded.map(function (t) {{
      return [t.started * 1000, Math.max(0, GRADES.indexOf(t.grade)), t]; }}) }},
    {{ name: 'skipped', type: 'scatter', symbol: 'triangle', data: H.tests.filter(function (t) {{
      return t.skipped; }}).map(function (t) {{ return [t.started * 1000, 0, t]; }}) }}]
}}, graded.length);
var bands = ['idle', 'light', 'busy', 'unknown'], hourSeries = [], hourPoints = 0;
bands.forEach(function (b) {{
  var rows = H.hours.filter(function (r) {{ return r.load == b && r.rtt_ms; }});
  if (!rows.length) {{ return; }}
  hourPoints += rows.length;
  hourSeries.push({{ name: b + ' p50', type: 'line', data: rows.map(function (r) {{
    return [r.hour * 1000, r.rtt_ms.p50]; }}) }});
  hourSeries.push({{ name: b + ' p90', type: 'line', lineStyle: {{ type: 'dashed' }},
    data: rows.map(function (r) {{ return [r.hour * 1000, r.rtt_ms.p90]; }}) }});
}});
chart('hours', {{ yAxis: {{ type: 'value', name: 'RTT ms' }}, series: hourSeries }}, hourPoints);
chart('goodput', {{ yAxis: {{ type: 'value', name: 'Mbit/s' }}, series: [
  {{ name: 'download', type: 'line', data: ran.filter(function (t) {{
    return t.down_mbps != null; }}).map(function (t) {{
      return [t.started * 1000, t.down_mbps]; }}) }},
  {{ name: 'upload', type: 'line', data: ran.filter(function (t) {{
    return t.up_mbps != null; }}).map(function (t) {{
      return [t.started * 1000, t.up_mbps]; }}) }}]
}}, ran.filter(function (t) {{ return t.down_mbps != null || t.up_mbps != null; }}).length);
if (H.shaper.length) {{
  var keys = [];
  H.shaper.forEach(function (r) {{ var k = r.iface + ' ' + r.tin;
    if (keys.indexOf(k) < 0) {{ keys.push(k); }} }});
  var sh = [];
  keys.forEach(function (k) {{
    var rows = H.shaper.filter(function (r) {{ return r.iface + ' ' + r.tin == k; }});
    sh.push({{ name: k + ' drops', type: 'bar', data: rows.map(function (r) {{
      return [r.minute * 1000, r.drops]; }}) }});
    sh.push({{ name: k + ' marks', type: 'bar', data: rows.map(function (r) {{
      return [r.minute * 1000, r.marks]; }}) }});
  }});
  chart('shaper', {{ yAxis: {{ type: 'value', name: 'packets' }}, series: sh }},
    H.shaper.length);
}}
</script>
</body></html>
"#,
        head = head("bloatlab history"),
        since = when(h.since),
        until = when(h.until),
        ntests = h.tests.len(),
        nhours = h
            .hours
            .iter()
            .map(|r| r.hour)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        ngaps = h.gaps.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_script_and_data_cannot_close_their_script_element() {
        assert!(
            !ECHARTS.contains("</script"),
            "the bundled ECharts would end its <script> early"
        );
        assert_eq!(script_safe(r#"{"a":"</script>"}"#), r#"{"a":"<\/script>"}"#);
    }

    #[test]
    fn a_grade_lowered_by_loss_says_why_under_the_letter() {
        let row = summary_row("r", &crate::fixtures::capped_by_loss(), false);
        assert!(
            row.contains("<td class=grade>D<div class=cap>A by latency; 23.0% lost under load"),
            "{row}"
        );
    }

    #[test]
    fn a_run_whose_load_never_ran_says_so_where_its_grade_would_be() {
        let s = Summary {
            test: "rrul".into(),
            load_missing: Some("none of its 8 load flows opened (<x>: refused)".into()),
            ..Default::default()
        };
        let row = summary_row("r", &s, false);
        assert!(
            row.contains(
                "<td class=grade>–<div class=cap>not graded: the load never ran: none of its 8 \
                load flows opened (&lt;x&gt;: refused)</div>"
            ),
            "{row}"
        );
    }

    #[test]
    fn an_rpm_run_shows_its_rpm_and_no_loss_of_probes_it_never_sent() {
        let mut s = Summary {
            rpm: Some(bloatlab_result::Rpm {
                rpm: 76.4,
                band: "poor".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let row = summary_row("r", &s, true);
        assert!(row.contains("<td>76 (poor)</td>"), "{row}");
        assert!(row.ends_with("<td>–</td></tr>"), "loss of 0 probes: {row}");
        s.rpm = None;
        s.rpm_by_direction = Some(bloatlab_result::RpmByDirection {
            down: Some(bloatlab_result::Rpm {
                rpm: 480.0,
                ..Default::default()
            }),
            up: None,
        });
        assert_eq!(rpm_cell(&s), "down 480 / up –");
        assert!(!summary_row("r", &Summary::default(), false).contains("(poor)"));
    }
}
