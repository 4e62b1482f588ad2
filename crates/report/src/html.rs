//! One self-contained HTML file: ECharts (bundled, no CDN) draws the charts from the run data
//! embedded as JSON; the summary table and metadata are plain HTML.

use crate::view::RunView;
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

/// Plain text shown with a report, under its own heading (an experiment's advice, the
/// configuration it applied, its verdict).
pub struct Section {
    pub title: String,
    pub text: String,
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
    [['throughput', 'Mbit/s'], ['memory', 'MB'], ['latency', 'ms'], ['boxes', null], ['burst',
      null], ['rpm_curve', null]].forEach(function (k) {{
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
