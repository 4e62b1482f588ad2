//! What a middlebox or an ISP's edge does to the marks of the packets that cross it: the DSCP
//! bleached to CS0 or remapped (RFC 2474 lets a domain rewrite it at its boundary), the ECN
//! field erased or rewritten (RFC 3168 forbids it; some do it anyway). A link direction's
//! `dscp` and `ecn_path` settings, applied as each packet enters the link.

use crate::config::ConfigError;
use crate::packet::Packet;
use bloatlab_units::marks::{dscp_name, ecn_name, parse_dscp, parse_ecn};

/// One field's fate at this link.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Rewrite {
    #[default]
    Keep,
    /// Zeroed: CS0, Not-ECT.
    Bleach,
    /// Each `from` value becomes `to`; the others pass as they are.
    Map(Vec<(u8, u8)>),
}

impl Rewrite {
    fn apply(&self, v: u8) -> u8 {
        match self {
            Rewrite::Keep => v,
            Rewrite::Bleach => 0,
            Rewrite::Map(m) => m.iter().find(|(f, _)| *f == v).map_or(v, |(_, t)| *t),
        }
    }

    /// "keep", "bleach" or "FROM>TO,..." with `parse` reading a code point.
    fn parse(
        key: &str,
        v: &str,
        parse: fn(&str) -> Result<u8, String>,
    ) -> Result<Rewrite, ConfigError> {
        match v.trim() {
            "keep" => Ok(Rewrite::Keep),
            "bleach" => Ok(Rewrite::Bleach),
            v => {
                let mut map = Vec::new();
                for pair in v.split(',').map(str::trim) {
                    let (from, to) = pair.split_once('>').ok_or_else(|| {
                        ConfigError::Value(format!(
                            "{key} `{pair}`: want keep, bleach or FROM>TO pairs (EF>AF41,CS1>CS0)"
                        ))
                    })?;
                    let code = |s: &str| {
                        parse(s.trim()).map_err(|e| ConfigError::Value(format!("{key}: {e}")))
                    };
                    map.push((code(from)?, code(to)?));
                }
                Ok(Rewrite::Map(map))
            }
        }
    }

    fn describe(&self, name: fn(u8) -> String) -> String {
        match self {
            Rewrite::Keep => "keep".into(),
            Rewrite::Bleach => "bleach".into(),
            Rewrite::Map(m) => m
                .iter()
                .map(|(f, t)| format!("{}>{}", name(*f), name(*t)))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// The DSCP and ECN rewriting of one link direction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MarkRewrite {
    pub dscp: Rewrite,
    pub ecn: Rewrite,
}

impl MarkRewrite {
    pub fn set_dscp(&mut self, v: &str) -> Result<(), ConfigError> {
        self.dscp = Rewrite::parse("dscp", v, parse_dscp)?;
        Ok(())
    }

    pub fn set_ecn(&mut self, v: &str) -> Result<(), ConfigError> {
        self.ecn = Rewrite::parse("ecn_path", v, parse_ecn)?;
        Ok(())
    }

    pub fn is_keep(&self) -> bool {
        *self == MarkRewrite::default()
    }

    /// Rewrites the packet's marks (its IPv4 checksum follows); true when they changed.
    pub fn apply(&self, pkt: &mut Packet) -> bool {
        if self.is_keep() {
            return false;
        }
        let (d, e) = (pkt.dscp(), pkt.ecn());
        let (d2, e2) = (self.dscp.apply(d), self.ecn.apply(e));
        if (d2, e2) == (d, e) {
            return false;
        }
        pkt.set_tos(d2 << 2 | e2);
        true
    }

    /// "dscp bleach, ecn_path ect1>ect0", or "" when both are kept.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.dscp != Rewrite::Keep {
            parts.push(format!("dscp {}", self.dscp.describe(dscp_name)));
        }
        if self.ecn != Rewrite::Keep {
            parts.push(format!(
                "ecn_path {}",
                self.ecn.describe(|e| ecn_name(e).to_string())
            ));
        }
        parts.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{ipv4_checksum, udp4};

    fn marked(dscp: u8, ecn: u8) -> Packet {
        let mut p = udp4(100, 1, 2, ecn);
        p.set_tos(dscp << 2 | ecn);
        p
    }

    #[test]
    fn bleach_and_remap_each_field_alone_and_keep_the_checksum() {
        let mut m = MarkRewrite::default();
        m.set_dscp("bleach").unwrap();
        let mut p = marked(46, 1);
        assert!(m.apply(&mut p));
        assert_eq!(
            (p.dscp(), p.ecn()),
            (0, 1),
            "RFC 2474 bleaching leaves ECN alone"
        );
        assert_eq!(
            u16::from_be_bytes([p.data[10], p.data[11]]),
            ipv4_checksum(&p.data[..20])
        );
        let mut m = MarkRewrite::default();
        m.set_dscp("EF>AF41, cs1>cs0").unwrap();
        m.set_ecn("ect1>ect0,ce>not-ect").unwrap();
        let mut p = marked(46, 1);
        m.apply(&mut p);
        assert_eq!((p.dscp(), p.ecn()), (34, 2));
        let mut p = marked(8, 3);
        m.apply(&mut p);
        assert_eq!((p.dscp(), p.ecn()), (0, 0));
        let mut p = marked(26, 2);
        assert!(!m.apply(&mut p), "AF31/ECT(0) is in neither map");
        assert_eq!(
            m.describe(),
            "dscp EF>AF41,BK>BE, ecn_path ect1>ect0,ce>not-ect"
        );
    }

    #[test]
    fn a_code_point_that_does_not_exist_is_one_line() {
        let mut m = MarkRewrite::default();
        let e = m.set_dscp("EF>XX").unwrap_err().to_string();
        assert!(
            e.contains("unknown DSCP \"XX\"") && !e.contains('\n'),
            "{e}"
        );
        let e = m.set_ecn("ect2>ce").unwrap_err().to_string();
        assert!(
            e.contains("ecn_path") && e.contains("not-ect, ect0, ect1 or ce"),
            "{e}"
        );
        assert!(m.set_ecn("sometimes").is_err());
    }
}
