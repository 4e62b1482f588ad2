//! Tuning: from measured runs to advice (`advise`), from shaping settings to the
//! configurations people paste into their routers (`config`), and from a configuration to its
//! steps (`batch`): all pure. `apply` is the thin shell that runs them on an interface.

pub mod advise;
pub mod apply;
pub mod batch;
pub mod config;
pub mod inputs;
pub mod link;
pub mod sysctl;
pub mod writeback;
