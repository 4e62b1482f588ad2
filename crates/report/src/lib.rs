//! What people look at: an interactive HTML report, static PNG/SVG plots, and exports for
//! other tools (flent, CSV). `view` turns result files into chart data (pure); the other
//! modules render it.

pub mod export;
pub mod hops;
#[cfg(feature = "html")]
pub mod html;
#[cfg(feature = "plots")]
pub mod plot;
pub mod table;
pub mod text;
pub mod view;

pub use view::RunView;

#[cfg(feature = "html")]
use std::path::Path;
use std::path::PathBuf;

/// Result files as chart data, each labelled by its file name.
pub fn load(paths: &[PathBuf]) -> Result<Vec<RunView>, String> {
    paths
        .iter()
        .map(|p| {
            bloatlab_result::read(p)
                .map(|r| RunView::new(&r, &view::label_for(p)))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Plain text shown with a report, under its own heading (an experiment's advice, the
/// configuration it applied, its verdict).
pub struct Section {
    pub title: String,
    pub text: String,
}

/// The HTML report of result files overlaid, or of one locate file or autorate log alone.
#[cfg(feature = "html")]
pub fn write_html(paths: &[PathBuf], out: &Path) -> Result<(), String> {
    // An autorate log (bloatlab autorate --log) makes a page of its own.
    if let [one] = paths {
        if let Some((header, lines)) = bloatlab_result::autorate::read(one)? {
            let page = html::render_autorate(&header, &lines);
            return std::fs::write(out, page).map_err(|e| format!("{}: {e}", out.display()));
        }
    }
    let mut locate = None;
    for p in paths {
        if let Some(l) = bloatlab_result::locate::read(p)? {
            locate = Some(l);
            break;
        }
    }
    let page = match (paths, locate) {
        ([_], Some(l)) => html::render_hops(&hops::from_locate(&l)),
        (_, Some(_)) => {
            return Err(
                "a locate file (bloatlab locate) makes a report of its own: give it alone".into(),
            )
        }
        (_, None) => html::render(&load(paths)?),
    };
    std::fs::write(out, page).map_err(|e| format!("{}: {e}", out.display()))
}

/// What the report's tests share.
#[cfg(test)]
mod fixtures {
    use bloatlab_result::{LossCap, Summary};

    /// The short FIFO of issue #38: +16 ms (A by latency), 23% of the probes lost under load,
    /// graded D.
    pub fn capped_by_loss() -> Summary {
        Summary {
            test: "tcp-up".into(),
            added_latency_ms: Some(16.0),
            grade: Some("D".into()),
            grade_loss_cap: Some(LossCap {
                loss_percent: 23.0,
                latency_grade: "A".into(),
                at_most: "D".into(),
            }),
            ..Default::default()
        }
    }
}
