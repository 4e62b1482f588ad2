//! The `bloatlab` binary's tests, one module per subject, in one test binary: fourteen binaries
//! each compiled and linked `common` and the workspace again, about 50 CPU seconds of every
//! clean build. `cargo test --release --test cli lab::` runs one module; CI runs each module as
//! its own process (`.ci/timing.sh`), as it ran each binary.

mod common;

mod autorate;
mod bottleneck;
mod browser;
mod hostile;
mod kernel_ref;
mod kernel_ref_agree;
mod lab;
mod locate;
mod loopback;
mod monitor;
mod report;
mod tune;
mod tunnel;
mod web;
mod writeback;
