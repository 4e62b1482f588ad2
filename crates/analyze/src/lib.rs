//! Pure analysis: samples in, statistics out. No clocks, no I/O; every function is driven only
//! by its arguments so it can be checked on known inputs.

pub mod burst;
pub mod clock;
pub mod emodel;
pub mod grade;
pub mod marks;
pub mod rpm;
pub mod stats;
pub mod summarize;
pub mod writeback;

pub use summarize::{summarize, summary_of};
