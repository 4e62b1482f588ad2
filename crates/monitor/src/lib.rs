//! `bloatlab monitor`: a line watched around the clock. Light UDP probes to a bloatlab server
//! all the time, each tagged with the load the watched interface carried as it left (the
//! latency the household feels while busy, without adding load); scheduled tests within a data
//! budget, each a result file as `bloatlab test` writes; the history in SQLite (`store`);
//! Prometheus metrics on `/metrics`.
//!
//! Pure parts (`load`, `minute`, `budget`, `metrics`) take the times they are given; `run` is
//! the shell that owns the clock, the sockets, the files and the threads.

pub mod budget;
pub mod cake;
pub mod load;
pub mod metrics;
pub mod minute;
mod run;

pub use run::{describe, run, MonitorConfig, MonitorError, Say};
