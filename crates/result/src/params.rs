//! Typed views of what some tests keep in `metadata.params` besides their settings: the
//! machine facts a writeback test records, the route an MTU test started from.

use crate::Metadata;
use serde::{Deserialize, Serialize};

/// The kernel's page-cache writeback settings (/proc/sys/vm), as a writeback test found them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct VmSettings {
    pub dirty_background_ratio: Option<u64>,
    pub dirty_ratio: Option<u64>,
    pub dirty_background_bytes: Option<u64>,
    pub dirty_bytes: Option<u64>,
    pub dirty_expire_centisecs: Option<u64>,
    pub dirty_writeback_centisecs: Option<u64>,
}

/// A writeback test's record of the machine and of the rate it wrote at.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WritebackMachine {
    pub vm: VmSettings,
    pub mem_total_kb: Option<u64>,
    pub page_size: Option<u64>,
    /// `--rate`: the test fed the cache at this many bit/s (else as fast as it took them).
    pub rate_bps: Option<u64>,
}

/// An MTU test's starting point.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct MtuRoute {
    /// The MTU of the route to the target on this host.
    pub route_mtu: Option<u32>,
}

impl Metadata {
    /// What a writeback test recorded of the machine (empty for other tests).
    pub fn writeback_machine(&self) -> WritebackMachine {
        WritebackMachine::deserialize(&self.params).unwrap_or_default()
    }

    /// The route an MTU test started from (empty for other tests).
    pub fn mtu_route(&self) -> MtuRoute {
        MtuRoute::deserialize(&self.params).unwrap_or_default()
    }
}

impl Metadata {
    /// Adds `key` to the params (an object; anything else is replaced by one).
    pub fn set_param(&mut self, key: &str, value: impl Serialize) {
        let value = serde_json::to_value(value).unwrap_or_default();
        match self.params.as_object_mut() {
            Some(m) => {
                m.insert(key.into(), value);
            }
            None => self.params = serde_json::json!({ key: value }),
        }
    }
}
