//! Tuning, pure: from measured runs to advice (`advise`), and from shaping settings to the
//! configurations people paste into their routers (`config`). No I/O here: the command line
//! reads result files and prints.

pub mod advise;
pub mod config;
pub mod link;
pub mod units;
