//! Where a fix goes in a topology and what it sets, as a user would set up their router: in
//! front of the slowest link, on the client's side, at 95 % of that link's rate in each
//! direction, counting its per-packet overhead. Pure: a topology in, settings out.

use bloatlab_lab::topology::LinkSpec;
use bloatlab_lab::Topology;
use bloatlab_lab_model::rate::Rate;

/// Share of the line rate the shaper runs at: below the line so the queue forms in the
/// shaper, the usual sqm advice.
pub const SHAPER_SHARE: f64 = 0.95;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fix {
    /// The line as it is: its own (bloated) buffers.
    Fifo,
    /// Rate shaping with FQ-CoDel behind it (sqm-scripts' simple.qos: HTB + fq_codel).
    HtbFqCodel,
    /// CAKE with its own shaper, ingress mode downstream (sqm's piece_of_cake / layer_cake).
    Cake,
    /// The same with `ack-filter` on the upload, as tc-cake(8) suggests for asymmetric links.
    CakeAckFilter,
    /// CAKE at 95% of the line's highest rate (a line that moves: set for its good times).
    CakeMax,
    /// CAKE from 95% of the line's mean rate, moved by `bloatlab autorate` (ours) running on
    /// the router through the whole run.
    Autorate,
    /// The same with cake-autorate's law and defaults, as our controller re-implements them.
    CakeAutorateLaw,
    /// CAKE moved to 95% of what the line will carry over the next 100 ms, from the lab's own
    /// schedule or trace: no controller can know that, so it is the bound a controller is
    /// measured against on a line that moves.
    CakeOracle,
    /// CAKE from 95% of the line's mean rate, moved by cake-autorate itself (its bash script
    /// and fping at its defaults) on the router: `cake_autorate_sh`.
    CakeAutorateSh,
}

impl Fix {
    pub fn parse(s: &str) -> Result<Fix, String> {
        match s.trim() {
            "fifo" | "none" => Ok(Fix::Fifo),
            "htb-fq_codel" | "fq_codel" | "htb+fq_codel" => Ok(Fix::HtbFqCodel),
            "cake" => Ok(Fix::Cake),
            "cake+ack-filter" | "cake-ack-filter" => Ok(Fix::CakeAckFilter),
            "cake-max" => Ok(Fix::CakeMax),
            "autorate" => Ok(Fix::Autorate),
            "cake-autorate" | "cake-autorate-law" => Ok(Fix::CakeAutorateLaw),
            "cake-oracle" | "oracle" => Ok(Fix::CakeOracle),
            "cake-autorate-sh" | "cake-autorate.sh" => Ok(Fix::CakeAutorateSh),
            other => Err(format!(
                "fix `{other}`: want fifo, htb-fq_codel, cake, cake+ack-filter, cake-max, \
                 autorate, cake-autorate, cake-autorate-sh or cake-oracle"
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Fix::Fifo => "fifo",
            Fix::HtbFqCodel => "htb-fq_codel",
            Fix::Cake => "cake",
            Fix::CakeAckFilter => "cake+ack-filter",
            Fix::CakeMax => "cake-max",
            Fix::Autorate => "autorate",
            Fix::CakeAutorateLaw => "cake-autorate",
            Fix::CakeOracle => "cake-oracle",
            Fix::CakeAutorateSh => "cake-autorate-sh",
        }
    }

    /// Column heading: what the run measured.
    pub fn label(self) -> &'static str {
        match self {
            Fix::Fifo => "line as is",
            Fix::HtbFqCodel => "HTB+fq_codel 95%",
            Fix::Cake => "CAKE 95%",
            Fix::CakeAckFilter => "CAKE+ACK filter 95%",
            Fix::CakeMax => "CAKE at MAX",
            Fix::Autorate => "CAKE + autorate",
            Fix::CakeAutorateLaw => "cake-autorate law (re-impl.)",
            Fix::CakeOracle => "oracle: CAKE 95% of line",
            Fix::CakeAutorateSh => "cake-autorate.sh itself",
        }
    }

    /// The controller's law when autorate moves the shaper.
    pub fn autorate_law(self) -> Option<bloatlab_autorate::Law> {
        match self {
            Fix::Autorate => Some(bloatlab_autorate::Law::Bloatlab),
            Fix::CakeAutorateLaw => Some(bloatlab_autorate::Law::CakeAutorate),
            _ => None,
        }
    }
}

/// What the oracle (`Fix::CakeOracle`) sets a direction's CAKE to `since_ns` into the line's
/// schedule or trace: `SHAPER_SHARE` of what the line will carry over the next 100 ms.
pub fn oracle_bps(rate: &Rate, since_ns: u64) -> Option<u64> {
    let next = rate.mean_between(since_ns, since_ns + 100_000_000)?;
    Some((next as f64 * SHAPER_SHARE) as u64)
}

/// One link direction's settings, as `lab set LINK --dir DIR k=v ...` takes them.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub link: String,
    pub dir: &'static str,
    pub kv: Vec<(String, String)>,
}

/// The shaper for the slowest link: kbit/s each way (a direction without a rate is left
/// alone), and whether CAKE filters the upload's redundant ACKs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shaper {
    pub up_kbit: Option<u64>,
    pub down_kbit: Option<u64>,
    pub ack_filter: bool,
}

impl Setting {
    /// The same as a `bloatlab lab set` command line.
    pub fn command(&self) -> String {
        let kv: Vec<String> = self
            .kv
            .iter()
            .map(|(k, v)| {
                if v.contains(' ') {
                    format!("{k}='{v}'")
                } else {
                    format!("{k}={v}")
                }
            })
            .collect();
        format!(
            "bloatlab lab set {} --dir {} {}",
            self.link,
            self.dir,
            kv.join(" ")
        )
    }
}

/// The link with the lowest rate in either direction (trace and schedule rates count at
/// their mean): the bottleneck a fix goes in front of.
pub fn slowest(topo: &Topology) -> Result<&LinkSpec, String> {
    let rate = |r: &Rate| r.mean_bps().unwrap_or(u64::MAX);
    topo.links
        .iter()
        .min_by_key(|l| rate(&l.up.rate).min(rate(&l.down.rate)))
        .filter(|l| rate(&l.up.rate).min(rate(&l.down.rate)) < u64::MAX)
        .ok_or_else(|| "no link has a rate: there is no bottleneck to fix".to_string())
}

/// The settings that put `fix` in front of the slowest link at `SHAPER_SHARE` of its rate
/// each way.
pub fn place(topo: &Topology, fix: Fix) -> Result<Vec<Setting>, String> {
    let spec = slowest(topo)?;
    let kbit = |r: &Rate| {
        let bps = if fix == Fix::CakeMax {
            r.max_bps()
        } else {
            r.mean_bps()
        };
        bps.map(|bps| (bps as f64 * SHAPER_SHARE / 1000.0).round() as u64)
    };
    place_at(
        topo,
        fix,
        Shaper {
            up_kbit: kbit(&spec.up.rate),
            down_kbit: kbit(&spec.down.rate),
            ack_filter: false,
        },
    )
}

/// The settings that put `fix` in front of the slowest link as `shaper` says, counting that
/// link's per-packet overhead. CAKE filters the upload's ACKs where either asks for it.
pub fn place_at(topo: &Topology, fix: Fix, shaper: Shaper) -> Result<Vec<Setting>, String> {
    let spec = slowest(topo)?;
    if fix == Fix::Fifo {
        return Ok(Vec::new());
    }
    let (front, toward_router) = front(topo)?;
    let away_from_router = if toward_router == "up" { "down" } else { "up" };
    let mut out = Vec::new();
    for (dir, kbit, ingress, line) in [
        (toward_router, shaper.up_kbit, false, &spec.up),
        (away_from_router, shaper.down_kbit, true, &spec.down),
    ] {
        let Some(kbit) = kbit else { continue };
        let kv: Vec<(&str, String)> = match fix {
            Fix::HtbFqCodel => {
                // Quantum 300 as simple.qos: with 1514 a round through 8 bulk flows at a few
                // Mbit/s outlasts a 10 ms probe interval, and probes lose their sparse priority.
                let mut kv = vec![
                    ("rate", format!("{kbit}kbit")),
                    ("qdisc", "fq_codel".into()),
                    ("quantum", "300".into()),
                ];
                kv.push(("overhead", line.overhead.to_string()));
                if line.atm {
                    kv.push(("atm", "on".into()));
                }
                kv
            }
            _ => {
                let mut words = format!("cake bandwidth {kbit}kbit");
                match (line.overhead, line.atm) {
                    // A cable line: the keyword a cable user sets (18 bytes, mpu 64).
                    (18, false) => words += " docsis",
                    (0, false) => {}
                    (o, atm) => words += &format!(" overhead {o}{}", if atm { " atm" } else { "" }),
                }
                if ingress {
                    words += " ingress";
                } else if shaper.ack_filter || fix == Fix::CakeAckFilter {
                    words += " ack-filter";
                }
                vec![("qdisc", words)]
            }
        };
        out.push(Setting {
            link: front.name.clone(),
            dir,
            kv: kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        });
    }
    Ok(out)
}

/// The link the shaper sits on, in front of the slowest one at its router (the slowest link's
/// end nearer the user, `a`), and that link's direction toward the router (the upload's).
pub fn front(topo: &Topology) -> Result<(&LinkSpec, &'static str), String> {
    let spec = slowest(topo)?;
    let router = &spec.a;
    topo.links
        .iter()
        .filter(|l| l.name != spec.name)
        .find_map(|l| {
            if &l.b == router {
                Some((l, "up"))
            } else if &l.a == router {
                Some((l, "down"))
            } else {
                None
            }
        })
        .ok_or_else(|| {
            format!(
                "the slowest link `{}` starts at `{router}`, which has no other \
            link: add a router hop in front of it to hold the shaper",
                spec.name
            )
        })
}

/// autorate's MIN:BASE:MAX for each way (down, up) of the slowest link: BASE the fixed
/// shaper's 95% of the mean rate, MAX 95% of its busiest second, MIN a fifth of BASE.
pub fn autorate_bounds(
    topo: &Topology,
) -> Result<(bloatlab_autorate::Bounds, bloatlab_autorate::Bounds), String> {
    let spec = slowest(topo)?;
    let bounds = |r: &Rate, way: &str| {
        let (Some(mean), Some(max)) = (r.mean_bps(), r.max_bps()) else {
            return Err(format!("the slowest link's {way} has no rate to move"));
        };
        let base = mean as f64 * SHAPER_SHARE;
        bloatlab_autorate::Bounds::new(base / 5.0, base, max as f64 * SHAPER_SHARE)
    };
    Ok((
        bounds(&spec.down.rate, "down")?,
        bounds(&spec.up.rate, "up")?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloatlab_lab::presets;

    fn topo(name: &str) -> Topology {
        Topology::from_toml(presets::get(name).unwrap(), &presets::read_file).unwrap()
    }

    fn kv(s: &Setting) -> Vec<(&str, &str)> {
        s.kv.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    /// The oracle follows the lte preset's trace (one-second steps of 20, 12, ... Mbit/s, 1500
    /// bytes an opportunity) 100 ms ahead: 95% of a second's rate inside it, of the mean of
    /// two seconds across their boundary, and the trace again on its next lap (10 s).
    #[test]
    fn the_oracle_sets_95_percent_of_the_next_100_ms() {
        let lte = slowest(&topo("lte")).unwrap().down.rate.clone();
        let ms = 1_000_000;
        let at = |t_ms: u64| oracle_bps(&lte, t_ms * ms).unwrap() as f64 / 1e6;
        // 20 Mbit/s is 1666 opportunities a second: 166 or 167 in a tenth of it.
        assert!((at(200) - 0.95 * 20.0).abs() < 0.95 * 0.12, "{}", at(200));
        // 5.95-6.05 s: half at 5 Mbit/s, half at 10.
        assert!((at(5950) - 0.95 * 7.5).abs() < 0.95 * 0.12, "{}", at(5950));
        assert!((at(10_200) - at(200)).abs() < 0.2);
        let cable = topo("cable");
        let fixed = &slowest(&cable).unwrap().up.rate;
        assert_eq!(oracle_bps(fixed, 123 * ms), Some(3_800_000));
    }

    #[test]
    fn on_the_cable_line_the_router_shapes_at_95_percent() {
        let t = topo("cable");
        let cake = place(&t, Fix::Cake).unwrap();
        assert_eq!(cake.len(), 2);
        assert_eq!((cake[0].link.as_str(), cake[0].dir), ("lan", "up"));
        assert_eq!(kv(&cake[0]), [("qdisc", "cake bandwidth 3800kbit docsis")]);
        assert_eq!(
            kv(&cake[1]),
            [("qdisc", "cake bandwidth 57000kbit docsis ingress")]
        );
        let htb = place(&t, Fix::HtbFqCodel).unwrap();
        assert_eq!(
            kv(&htb[1]),
            [
                ("rate", "57000kbit"),
                ("qdisc", "fq_codel"),
                ("quantum", "300"),
                ("overhead", "18")
            ]
        );
        assert!(place(&t, Fix::Fifo).unwrap().is_empty());
        // Advised rates instead of the line's, one direction only.
        let adv = place_at(
            &t,
            Fix::Cake,
            Shaper {
                up_kbit: Some(3325),
                down_kbit: None,
                ack_filter: false,
            },
        )
        .unwrap();
        assert_eq!(adv.len(), 1);
        assert_eq!(
            adv[0].command(),
            "bloatlab lab set lan --dir up qdisc='cake bandwidth 3325kbit docsis'"
        );
        // The ACK filter goes on the upload only.
        let acks = place_at(
            &t,
            Fix::Cake,
            Shaper {
                up_kbit: Some(3325),
                down_kbit: Some(54_000),
                ack_filter: true,
            },
        )
        .unwrap();
        assert_eq!(
            kv(&acks[0]),
            [("qdisc", "cake bandwidth 3325kbit docsis ack-filter")]
        );
        assert_eq!(
            kv(&acks[1]),
            [("qdisc", "cake bandwidth 54000kbit docsis ingress")]
        );
        let fix = place(&t, Fix::parse("cake+ack-filter").unwrap()).unwrap();
        assert_eq!(
            kv(&fix[0]),
            [("qdisc", "cake bandwidth 3800kbit docsis ack-filter")]
        );
        assert_eq!(
            kv(&fix[1]),
            [("qdisc", "cake bandwidth 57000kbit docsis ingress")]
        );
    }

    #[test]
    fn atm_lines_keep_their_framing_and_the_lte_trace_counts_at_its_mean() {
        let dsl = place(&topo("dsl"), Fix::Cake).unwrap();
        assert_eq!(
            kv(&dsl[0]),
            [("qdisc", "cake bandwidth 950kbit overhead 40 atm")]
        );
        let t = topo("lte");
        let mean = t.links[1].down.rate.mean_bps().unwrap();
        assert!((mean as f64 / 1e6 - 15.2).abs() < 0.2, "{mean}");
        let lte = place(&t, Fix::HtbFqCodel).unwrap();
        let want = format!("{}kbit", (mean as f64 * SHAPER_SHARE / 1000.0).round());
        assert_eq!(
            kv(&lte[1])[0],
            ("rate", want.as_str()),
            "95% of the trace's mean"
        );
    }

    #[test]
    fn a_slowest_link_at_the_client_has_nowhere_to_put_a_shaper() {
        // wifi-slow: the 6 Mbit/s Wi-Fi hop joins the client to the router directly.
        let e = place(&topo("wifi-slow"), Fix::Cake).unwrap_err();
        assert!(e.contains("`wifi`") && e.contains("router hop"), "{e}");
        let flipped = Topology::from_toml(
            "[[link]]\nname='wan'\na='router'\nb='server'\nboth={rate='10mbit'}\n\
             [[link]]\nname='lan'\na='router'\nb='client'\n",
            &presets::read_file,
        )
        .unwrap();
        let s = place(&flipped, Fix::Cake).unwrap();
        assert_eq!(
            (s[0].link.as_str(), s[0].dir, s[1].dir),
            ("lan", "down", "up"),
            "router->client is the lan's up"
        );
    }
}
