//! The lab: hosts are network namespaces, links are pairs of TUN devices joined by forwarder
//! threads that push every packet through the pure link model of `bloatlab-lab-model`.

pub mod control;
pub mod daemon;
pub mod forward;
pub mod instance;
pub mod ns;
pub mod presets;
pub mod topology;
pub mod tun;

pub use instance::{Lab, LabError};
pub use topology::Topology;

/// Where running labs keep their control socket and description.
pub const STATE_DIR: &str = "/run/bloatlab/labs";
/// Every namespace the lab creates starts with this, so `lab down --all` can find leftovers.
pub const NS_PREFIX: &str = "bl-";
/// Environment variable naming the control socket of the lab a program runs in: a bloatlab
/// test finding it stores the emulator's counters in its result file.
pub const SOCKET_ENV: &str = "BLOATLAB_LAB_SOCKET";
