//! Link-layer compensation: what each access technology adds to every IP packet on the wire
//! (tc-cake(8) keywords; sqm-scripts' `linklayer`/`overhead`).

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkType {
    /// No compensation (`raw`): the shaper counts what the kernel counts.
    Raw,
    Ethernet,
    Docsis,
    BridgedPtm,
    PppoePtm,
    /// ADSL with PPPoE over LLC/SNAP, the common ADSL encapsulation (40 B, ATM cells).
    PppoeLlcsnap,
    PppoaVcmux,
    BridgedLlcsnap,
}

const ALL: [LinkType; 8] = [
    LinkType::Raw,
    LinkType::Ethernet,
    LinkType::Docsis,
    LinkType::BridgedPtm,
    LinkType::PppoePtm,
    LinkType::PppoeLlcsnap,
    LinkType::PppoaVcmux,
    LinkType::BridgedLlcsnap,
];

pub const NAMES: &str = "raw, ethernet, docsis, bridged-ptm, pppoe-ptm, pppoe-llcsnap (ADSL), \
    pppoa-vcmux, bridged-llcsnap";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    None,
    Atm,
    Ptm,
}

impl LinkType {
    pub fn parse(s: &str) -> Result<LinkType, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "raw" | "none" => LinkType::Raw,
            "ethernet" => LinkType::Ethernet,
            "docsis" | "cable" => LinkType::Docsis,
            "bridged-ptm" | "vdsl" => LinkType::BridgedPtm,
            "pppoe-ptm" => LinkType::PppoePtm,
            "pppoe-llcsnap" | "atm" | "adsl" => LinkType::PppoeLlcsnap,
            "pppoa-vcmux" => LinkType::PppoaVcmux,
            "bridged-llcsnap" => LinkType::BridgedLlcsnap,
            other => return Err(format!("link type `{other}`: one of {NAMES}")),
        })
    }

    /// The tc-cake keyword (itself a set of overhead, mpu and framing).
    pub fn cake_keyword(self) -> &'static str {
        match self {
            LinkType::Raw => "raw",
            LinkType::Ethernet => "ethernet",
            LinkType::Docsis => "docsis",
            LinkType::BridgedPtm => "bridged-ptm",
            LinkType::PppoePtm => "pppoe-ptm",
            LinkType::PppoeLlcsnap => "pppoe-llcsnap",
            LinkType::PppoaVcmux => "pppoa-vcmux",
            LinkType::BridgedLlcsnap => "bridged-llcsnap",
        }
    }

    /// Bytes added to each IP packet (tc-cake(8)).
    pub fn overhead(self) -> u32 {
        match self {
            LinkType::Raw => 0,
            LinkType::Ethernet => 38,
            LinkType::Docsis => 18,
            LinkType::BridgedPtm => 22,
            LinkType::PppoePtm => 30,
            LinkType::PppoeLlcsnap => 40,
            LinkType::PppoaVcmux => 10,
            LinkType::BridgedLlcsnap => 32,
        }
    }

    /// Minimum packet unit: the shortest frame the link sends.
    pub fn mpu(self) -> u32 {
        match self {
            LinkType::Ethernet => 84,
            LinkType::Docsis => 64,
            _ => 0,
        }
    }

    pub fn framing(self) -> Framing {
        match self {
            LinkType::BridgedPtm | LinkType::PppoePtm => Framing::Ptm,
            LinkType::PppoeLlcsnap | LinkType::PppoaVcmux | LinkType::BridgedLlcsnap => {
                Framing::Atm
            }
            _ => Framing::None,
        }
    }

    /// sqm-scripts' `linklayer`: atm for ATM cells, else ethernet when there is overhead.
    pub fn sqm_linklayer(self) -> &'static str {
        match (self.framing(), self.overhead()) {
            (Framing::Atm, _) => "atm",
            (_, 0) => "none",
            _ => "ethernet",
        }
    }

    /// The technology whose overhead and framing a lab link describes (per-packet overhead
    /// and ATM cells; the lab has no PTM framing); none when no keyword matches.
    pub fn from_overhead(overhead: u32, atm: bool) -> Option<LinkType> {
        let framing = if atm { Framing::Atm } else { Framing::None };
        ALL.into_iter()
            .find(|l| l.overhead() == overhead && l.framing() == framing)
    }

    /// Bytes a full 1500-byte IP packet occupies on the wire.
    pub fn wire_bytes(self, ip_len: u32) -> u32 {
        let len = (ip_len + self.overhead()).max(self.mpu());
        match self.framing() {
            Framing::None => len,
            Framing::Atm => len.div_ceil(48) * 53,
            Framing::Ptm => len + len.div_ceil(64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_sizes_follow_tc_cake() {
        // tc-cake(8) and the reference's table: 1500 B over PPPoE/LLC-SNAP ADSL is 33 cells.
        assert_eq!(LinkType::PppoeLlcsnap.wire_bytes(1500), 1749);
        assert_eq!(LinkType::Docsis.wire_bytes(1500), 1518);
        assert_eq!(LinkType::Docsis.wire_bytes(40), 64, "mpu");
        assert_eq!(LinkType::Ethernet.wire_bytes(1500), 1538);
        assert_eq!(LinkType::PppoePtm.wire_bytes(1500), 1530 + 24);
        assert_eq!(LinkType::parse("cable").unwrap(), LinkType::Docsis);
        assert!(LinkType::parse("carrier-pigeon")
            .unwrap_err()
            .contains("docsis"));
    }

    #[test]
    fn a_lab_links_overhead_names_its_technology() {
        assert_eq!(LinkType::from_overhead(18, false), Some(LinkType::Docsis));
        assert_eq!(LinkType::from_overhead(0, false), Some(LinkType::Raw));
        assert_eq!(
            LinkType::from_overhead(40, true),
            Some(LinkType::PppoeLlcsnap)
        );
        assert_eq!(
            LinkType::from_overhead(40, false),
            None,
            "40 B without ATM cells is no keyword"
        );
    }
}
