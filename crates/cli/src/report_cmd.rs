//! `bloatlab report|plot|export`: result files in, pictures and other formats out.

use crate::fail;
use bloatlab_report::export;
#[cfg(feature = "report")]
use bloatlab_report::plot::{self, Kind};
use bloatlab_report::view::label_for;
use clap::ValueEnum;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[cfg(feature = "report")]
#[derive(Clone, Copy, ValueEnum)]
pub enum PlotKind {
    /// Throughput per flow and total, and latency per probe stream, over time (phases shaded).
    Timeseries,
    /// Round-trip time under load as a CDF, several runs overlaid (before/after).
    Cdf,
    /// Box plots of round-trip time per phase and probe stream.
    Box,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    /// flent's .flent.gz (open with `flent -i FILE`).
    Flent,
    /// Tidy CSV, one row per sample.
    Csv,
}

#[cfg(feature = "report")]
pub fn report(paths: &[PathBuf], out: &Path) -> ExitCode {
    match bloatlab_report::write_html(paths, out) {
        Ok(()) => {
            eprintln!(
                "report written to {} (opens offline in any browser)",
                out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

#[cfg(feature = "report")]
pub fn plot(paths: &[PathBuf], kind: PlotKind, out: &Path) -> ExitCode {
    let runs = match bloatlab_report::load(paths) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let kind = match kind {
        PlotKind::Timeseries => Kind::Timeseries,
        PlotKind::Cdf => Kind::Cdf,
        PlotKind::Box => Kind::Box,
    };
    match plot::plot(&runs, kind, out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

pub fn export(path: &Path, format: ExportFormat, out: Option<PathBuf>) -> ExitCode {
    let r = match bloatlab_result::read(path) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let label = label_for(path);
    let res = match format {
        ExportFormat::Flent => {
            let out = out.unwrap_or_else(|| PathBuf::from(format!("{label}.flent.gz")));
            export::write_json(&out, &export::to_flent(&r)).map(|_| out)
        }
        ExportFormat::Csv => {
            let out = out.unwrap_or_else(|| PathBuf::from(format!("{label}.csv")));
            std::fs::write(&out, export::to_csv(&r)).map(|_| out)
        }
    };
    match res {
        Ok(out) => {
            eprintln!("written to {}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}
