//! What people look at: an interactive HTML report, static PNG/SVG plots, and exports for
//! other tools (flent, CSV). `view` turns result files into chart data (pure); the other
//! modules render it.

pub mod export;
pub mod hops;
pub mod html;
pub mod plot;
pub mod view;

pub use view::RunView;
