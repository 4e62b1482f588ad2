//! The lab's link model, pure: packets and a clock (nanoseconds) go in, packets come out at the
//! times the model says. No sockets, no `Instant::now()`: everything is tested on virtual time
//! and driven by the TUN forwarder in `bloatlab-lab`.

pub mod cake;
pub mod codel;
pub mod config;
pub mod dql;
pub mod dualpi2;
pub mod fifo;
pub mod fq_codel;
pub mod gso;
pub mod link;
pub mod marks;
pub mod packet;
pub mod qdisc;
pub mod rate;
pub mod slow_icmp;
pub mod stats;
pub mod values;
pub mod vnet;

pub use config::{DirConfig, QdiscConfig};
pub use link::LinkDirection;
pub use packet::Packet;
pub use qdisc::Qdisc;
pub use stats::DirCounters;

pub const MS: u64 = 1_000_000;
