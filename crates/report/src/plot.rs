//! Static plots (PNG or SVG by file name) drawn with plotters from the same chart data as the
//! HTML report.

use crate::view::{Line, RunView};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Timeseries,
    Cdf,
    Box,
}

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Both names plotters asks for map to the bundled font.
        for family in ["sans-serif", "serif"] {
            let _ = plotters::style::register_font(family, FontStyle::Normal, FONT);
        }
    });
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("{0}: the file name must end in .png or .svg")]
    Format(String),
    #[error("nothing to plot: {0}")]
    Empty(String),
    #[error("{0}: {1}")]
    Write(String, std::io::Error),
    #[error("drawing failed: {0}")]
    Draw(String),
}

fn d<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

pub fn plot(runs: &[RunView], kind: Kind, path: &Path) -> Result<(), PlotError> {
    register_font();
    let rows = if kind == Kind::Timeseries {
        2 * runs.len()
    } else {
        1
    };
    let size = (1200u32, 420 * rows as u32);
    match path.extension().and_then(|e| e.to_str()) {
        Some("png") => {
            // Drawn into memory and encoded here: plotters' own PNG writer brings the whole
            // `image` crate (JPEG and BMP codecs too: 23 s of a clean build on a slow host).
            let mut rgb = vec![0u8; size.0 as usize * size.1 as usize * 3];
            draw(
                BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area(),
                runs,
                kind,
            )?;
            write_png(path, size, &rgb)
        }
        Some("svg") => draw(SVGBackend::new(path, size).into_drawing_area(), runs, kind),
        _ => Err(PlotError::Format(path.display().to_string())),
    }
}

fn write_png(path: &Path, (width, height): (u32, u32), rgb: &[u8]) -> Result<(), PlotError> {
    let io = |e: std::io::Error| PlotError::Write(path.display().to_string(), e);
    let file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    let mut png = png::Encoder::new(file, width, height);
    png.set_color(png::ColorType::Rgb);
    png.set_depth(png::BitDepth::Eight);
    let mut w = png.write_header().map_err(d)?;
    w.write_image_data(rgb).map_err(d)?;
    w.finish().map_err(d)
}

fn color(i: usize) -> RGBColor {
    const P: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    P[i % P.len()]
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    runs: &[RunView],
    kind: Kind,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(d)?;
    match kind {
        Kind::Timeseries => {
            let areas = root.split_evenly((2 * runs.len(), 1));
            for (i, r) in runs.iter().enumerate() {
                lines(
                    &areas[2 * i],
                    &format!("{}: throughput", r.label),
                    "Mbit/s",
                    &r.throughput,
                    r,
                )?;
                lines(
                    &areas[2 * i + 1],
                    &format!("{}: round-trip time", r.label),
                    "ms",
                    &r.latency,
                    r,
                )?;
            }
        }
        Kind::Cdf => {
            let xmax = runs
                .iter()
                .flat_map(|r| r.cdf.iter().map(|p| p.0))
                .fold(0.0, f64::max);
            if xmax <= 0.0 {
                return Err(PlotError::Empty("no round trips".into()));
            }
            let mut chart = ChartBuilder::on(&root)
                .caption("Round-trip time under load (CDF)", ("sans-serif", 22))
                .margin(15)
                .x_label_area_size(40)
                .y_label_area_size(55)
                .build_cartesian_2d(0.0..xmax * 1.05, 0.0..1.0)
                .map_err(d)?;
            chart
                .configure_mesh()
                .x_desc("RTT, ms")
                .y_desc("fraction")
                .draw()
                .map_err(d)?;
            for (i, r) in runs.iter().enumerate() {
                let c = color(i);
                chart
                    .draw_series(LineSeries::new(r.cdf.iter().copied(), c.stroke_width(2)))
                    .map_err(d)?
                    .label(r.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                    });
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(d)?;
        }
        Kind::Box => {
            let boxes: Vec<(String, [f64; 5], usize)> = runs
                .iter()
                .enumerate()
                .flat_map(|(i, r)| {
                    r.boxes
                        .iter()
                        .map(move |b| (format!("{}: {}", r.label, b.label), b.five, i))
                })
                .collect();
            if boxes.is_empty() {
                return Err(PlotError::Empty("no round trips".into()));
            }
            let ymax = boxes.iter().map(|b| b.1[4]).fold(0.0, f64::max) * 1.05;
            let labels: Vec<String> = boxes.iter().map(|b| b.0.clone()).collect();
            let mut chart = ChartBuilder::on(&root)
                .caption("Round-trip time per phase and stream", ("sans-serif", 22))
                .margin(15)
                .x_label_area_size(60)
                .y_label_area_size(55)
                .build_cartesian_2d(-0.5..boxes.len() as f64 - 0.5, 0.0..ymax.max(1e-3))
                .map_err(d)?;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(boxes.len())
                .x_label_formatter(&|x| {
                    labels
                        .get(x.round() as usize)
                        .filter(|_| (x - x.round()).abs() < 1e-6)
                        .cloned()
                        .unwrap_or_default()
                })
                .y_desc("RTT, ms")
                .draw()
                .map_err(d)?;
            for (k, (_, f, run)) in boxes.iter().enumerate() {
                let x = k as f64;
                let c = color(*run);
                // Box from the quartiles, whiskers to min and max, a bar at the median.
                chart
                    .draw_series([Rectangle::new(
                        [(x - 0.3, f[1]), (x + 0.3, f[3])],
                        c.mix(0.3).filled(),
                    )])
                    .map_err(d)?;
                chart
                    .draw_series([Rectangle::new(
                        [(x - 0.3, f[1]), (x + 0.3, f[3])],
                        c.stroke_width(1),
                    )])
                    .map_err(d)?;
                for seg in [
                    [(x - 0.3, f[2]), (x + 0.3, f[2])],
                    [(x, f[0]), (x, f[1])],
                    [(x, f[3]), (x, f[4])],
                    [(x - 0.1, f[0]), (x + 0.1, f[0])],
                    [(x - 0.1, f[4]), (x + 0.1, f[4])],
                ] {
                    chart
                        .draw_series([PathElement::new(seg.to_vec(), c.stroke_width(2))])
                        .map_err(d)?;
                }
            }
        }
    }
    root.present().map_err(d)
}

fn lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    unit: &str,
    lines: &[Line],
    run: &RunView,
) -> Result<(), PlotError>
where
    DB::ErrorType: 'static,
{
    let xmax = run
        .phases
        .iter()
        .map(|p| p.end)
        .fold(0.0, f64::max)
        .max(1e-3);
    let ymax = lines
        .iter()
        .flat_map(|l| l.points.iter().filter_map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..xmax, 0.0..ymax)
        .map_err(d)?;
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc(unit)
        .draw()
        .map_err(d)?;
    for p in run.phases.iter().filter(|p| p.name != "load") {
        chart
            .draw_series([Rectangle::new(
                [(p.start, 0.0), (p.end, ymax)],
                BLACK.mix(0.05).filled(),
            )])
            .map_err(d)?;
    }
    // Each phase named at its start, as the HTML report does ("load" spans the load phases of a
    // sequential test and would overprint them).
    let sequential = run
        .phases
        .iter()
        .any(|p| !["idle", "load", "settle"].contains(&p.name.as_str()));
    chart
        .draw_series(
            run.phases
                .iter()
                .filter(|p| p.name != "load" || !sequential)
                .map(|p| {
                    Text::new(
                        p.name.clone(),
                        (p.start + xmax * 0.005, ymax * 0.985),
                        ("sans-serif", 13).into_font().color(&BLACK.mix(0.55)),
                    )
                }),
        )
        .map_err(d)?;
    // Totals take the first two colours and the flows the other six, so that no flow wears a
    // total's colour (with 8 flows one palette of 8 gave "total up" and one flow the same blue).
    let has_totals = lines.iter().any(|l| l.name.starts_with("total"));
    let (mut totals, mut flows) = (0, 0);
    for (i, l) in lines.iter().enumerate() {
        let c = match (has_totals, l.name.starts_with("total")) {
            (false, _) => color(i),
            (true, true) => {
                totals += 1;
                color(totals - 1)
            }
            (true, false) => {
                flows += 1;
                color(2 + (flows - 1) % 6)
            }
        };
        let width = if l.name.starts_with("total") { 2 } else { 1 };
        // Gaps (lost probes, no data) break the line instead of being drawn as zero.
        let mut segment: Vec<(f64, f64)> = Vec::new();
        let mut first = true;
        for p in l.points.iter().chain(std::iter::once(&(f64::NAN, None))) {
            match p.1 {
                Some(v) => segment.push((p.0, v)),
                None if !segment.is_empty() => {
                    let s = chart
                        .draw_series(LineSeries::new(
                            std::mem::take(&mut segment),
                            c.stroke_width(width),
                        ))
                        .map_err(d)?;
                    if first {
                        s.label(l.name.clone()).legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2))
                        });
                        first = false;
                    }
                }
                None => {}
            }
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(d)?;
    Ok(())
}
