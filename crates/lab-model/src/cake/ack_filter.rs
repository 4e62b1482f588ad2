//! CAKE's ACK filter (sch_cake.c `cake_ack_filter`): when a TCP ACK joins a flow's queue, an
//! older pure ACK of the same connection that the new one makes redundant is dropped.

use crate::packet::Packet;
use std::collections::VecDeque;

const SYN: u32 = 0x0002_0000;
const ACK: u32 = 0x0010_0000;
const ECE_CWR: u32 = 0x00C0_0000;
/// Every flag but ECE/CWR, with the reserved bits (`0x0F3F0000`).
const FLAGS_BUT_ECN: u32 = 0x0F3F_0000;

const OPT_EOL: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_SACK: u8 = 5;
const OPT_TIMESTAMP: u8 = 8;
const OPT_MD5SIG: u8 = 19;

/// The parts of an IPv4/IPv6 TCP segment the filter compares.
struct Segment<'a> {
    version: u8,
    src: &'a [u8],
    dst: &'a [u8],
    ports: &'a [u8],
    /// The 32-bit word holding data offset, flags and window (`tcp_flag_word`).
    flag_word: u32,
    ack_seq: u32,
    /// Option bytes.
    options: &'a [u8],
    payload: usize,
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn segment(d: &[u8]) -> Option<Segment<'_>> {
    let (version, src, dst, l4, ip_payload) = match d.first()? >> 4 {
        4 if d.len() >= 20 && d[9] == 6 => {
            let ihl = ((d[0] & 0x0f) as usize) * 4;
            let total = u16::from_be_bytes([d[2], d[3]]) as usize;
            (4, &d[12..16], &d[16..20], ihl, total.checked_sub(ihl)?)
        }
        6 if d.len() >= 40 && d[6] == 6 => (
            6,
            &d[8..24],
            &d[24..40],
            40,
            u16::from_be_bytes([d[4], d[5]]) as usize,
        ),
        _ => return None,
    };
    let t = d.get(l4..)?;
    if t.len() < 20 {
        return None;
    }
    let hdr = ((t[12] >> 4) as usize) * 4;
    if hdr < 20 || t.len() < hdr {
        return None;
    }
    Some(Segment {
        version,
        src,
        dst,
        ports: &t[0..4],
        flag_word: be32(&t[12..16]),
        ack_seq: be32(&t[8..12]),
        options: &t[20..hdr],
        payload: ip_payload.checked_sub(hdr)?,
    })
}

/// Walks TCP options: (kind, body) pairs until EOL or a malformed length.
fn options(mut o: &[u8]) -> impl Iterator<Item = (u8, &[u8])> + '_ {
    std::iter::from_fn(move || loop {
        let (&kind, rest) = o.split_first()?;
        match kind {
            OPT_EOL => return None,
            OPT_NOP => o = rest,
            _ => {
                let &len = rest.first()?;
                let len = len as usize;
                if len < 2 || len > o.len() {
                    return None;
                }
                let body = &o[2..len];
                o = &o[len..];
                return Some((kind, body));
            }
        }
    })
}

fn option<'a>(seg: &Segment<'a>, kind: u8) -> Option<&'a [u8]> {
    options(seg.options)
        .find(|(k, _)| *k == kind)
        .map(|(_, b)| b)
}

/// Sequence-space comparison (`after`).
fn after(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) < 0
}

fn timestamps(seg: &Segment) -> (u32, u32) {
    match option(seg, OPT_TIMESTAMP) {
        Some(b) if b.len() == 8 => (be32(&b[0..4]), be32(&b[4..8])),
        _ => (0, 0),
    }
}

/// `cake_tcph_may_drop`: only ACK set (ECE/CWR aside), and only options that carry no state a
/// later ACK would not repeat.
fn may_drop(seg: &Segment, ts_new: u32, ecr_new: u32) -> bool {
    if seg.flag_word & FLAGS_BUT_ECN != ACK {
        return false;
    }
    options(seg.options).all(|(kind, body)| match kind {
        OPT_MD5SIG => true,
        OPT_SACK => (body.len() + 2) % 8 == 2,
        OPT_TIMESTAMP => {
            body.len() == 8
                && !after(be32(&body[0..4]), ts_new)
                && !after(be32(&body[4..8]), ecr_new)
        }
        _ => false,
    })
}

fn sack_blocks(seg: &Segment) -> Option<Vec<(u32, u32)>> {
    let b = option(seg, OPT_SACK)?;
    let blocks: Vec<(u32, u32)> = b
        .chunks_exact(8)
        .map(|c| (be32(&c[0..4]), be32(&c[4..8])))
        .collect();
    (!blocks.is_empty()).then_some(blocks)
}

/// `cake_tcph_sack_compare`: -1 when A (older) SACKs something B (newer) does not, or carries
/// a DSACK; 1 when B covers all of A and more; 0 when they cover the same.
fn sack_compare(a: &Segment, b: &Segment) -> i32 {
    match (sack_blocks(a), sack_blocks(b)) {
        (Some(_), None) => -1,
        (None, Some(_)) => 1,
        (None, None) => 0,
        (Some(sa), Some(sb)) => {
            let bytes_b: u32 = sb
                .iter()
                .map(|(s, e)| e.wrapping_sub(*s))
                .fold(0, u32::wrapping_add);
            let mut bytes_a = 0u32;
            for (start_a, end_a) in sa {
                // A DSACK (below the cumulative ACK) is information B may lack.
                if after(a.ack_seq, start_a) {
                    return -1;
                }
                bytes_a = bytes_a.wrapping_add(end_a.wrapping_sub(start_a));
                if !sb
                    .iter()
                    .any(|(sb_s, sb_e)| !after(*sb_s, start_a) && !after(end_a, *sb_e))
                {
                    return -1;
                }
            }
            if bytes_b > bytes_a {
                1
            } else {
                0
            }
        }
    }
}

/// With the newest packet at the back of `queue`, the index of the ACK to drop, if any.
pub fn redundant_ack(queue: &VecDeque<Packet>, aggressive: bool) -> Option<usize> {
    if queue.len() < 2 {
        return None;
    }
    let trigger = segment(&queue.back()?.data)?;
    if trigger.flag_word & (ACK | SYN) != ACK {
        return None;
    }
    let (ts, ecr) = timestamps(&trigger);
    let mut eligible: Option<(usize, u32)> = None;
    let mut found = 0;
    for (i, p) in queue.iter().enumerate().take(queue.len() - 1) {
        let Some(c) = segment(&p.data) else { continue };
        if c.version != trigger.version
            || c.ports != trigger.ports
            || c.src != trigger.src
            || c.dst != trigger.dst
        {
            continue;
        }
        // ECN feedback changed since the eligible one: dropping it would lose that signal.
        if let Some((_, flags)) = eligible {
            if c.flag_word & ECE_CWR != flags {
                eligible = None;
                found -= 1;
            }
        }
        if !may_drop(&c, ts, ecr) || c.payload != 0 || after(c.ack_seq, trigger.ack_seq) {
            continue;
        }
        let sack = sack_compare(&c, &trigger);
        if sack < 0 || (c.ack_seq == trigger.ack_seq && sack == 0) {
            continue;
        }
        if eligible.is_none() {
            eligible = Some((i, c.flag_word & ECE_CWR));
        }
        found += 1;
        if found > 1 {
            return eligible.map(|(i, _)| i);
        }
    }
    // Aggressive: a lone eligible ACK right ahead of the trigger, with the same ECN flags.
    match eligible {
        Some((i, flags))
            if aggressive && i + 2 == queue.len() && flags == trigger.flag_word & ECE_CWR =>
        {
            Some(i)
        }
        _ => None,
    }
}

/// Test helper: an IPv4 TCP segment with the given flags, ack number, options and payload.
#[cfg(test)]
pub fn tcp4(sport: u16, ack_seq: u32, flags: u32, opts: &[u8], payload: usize) -> Packet {
    let hdr = 20 + opts.len().div_ceil(4) * 4;
    let total = 20 + hdr + payload;
    let mut d = vec![0u8; total];
    d[0] = 0x45;
    d[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    d[8] = 64;
    d[9] = 6;
    d[12..16].copy_from_slice(&[10, 0, 0, 1]);
    d[16..20].copy_from_slice(&[10, 0, 0, 2]);
    let t = &mut d[20..];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&80u16.to_be_bytes());
    t[8..12].copy_from_slice(&ack_seq.to_be_bytes());
    let word = ((hdr as u32 / 4) << 28) | flags | 0xffff;
    t[12..16].copy_from_slice(&word.to_be_bytes());
    t[20..20 + opts.len()].copy_from_slice(opts);
    Packet::new(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pkts: Vec<Packet>) -> VecDeque<Packet> {
        pkts.into_iter().collect()
    }

    fn ts(val: u32) -> Vec<u8> {
        let mut o = vec![OPT_NOP, OPT_NOP, OPT_TIMESTAMP, 10];
        o.extend_from_slice(&val.to_be_bytes());
        o.extend_from_slice(&0u32.to_be_bytes());
        o
    }

    fn sack(blocks: &[(u32, u32)]) -> Vec<u8> {
        let mut o = vec![OPT_NOP, OPT_NOP, OPT_SACK, 2 + 8 * blocks.len() as u8];
        for (s, e) in blocks {
            o.extend_from_slice(&s.to_be_bytes());
            o.extend_from_slice(&e.to_be_bytes());
        }
        o
    }

    /// The kernel's rules, case by case: (queue ahead of the trigger, trigger, conservative
    /// drop, aggressive drop).
    #[test]
    fn drops_only_acks_a_later_one_makes_redundant() {
        let a = |ack| tcp4(1000, ack, ACK, &[], 0);
        // (what, queue ahead of the trigger, trigger, conservative drop, aggressive drop)
        type Case = (
            &'static str,
            Vec<Packet>,
            Packet,
            Option<usize>,
            Option<usize>,
        );
        let cases: Vec<Case> = vec![
            (
                "two older pure ACKs: the one nearest the head goes",
                vec![a(100), a(200)],
                a(300),
                Some(0),
                Some(0),
            ),
            (
                "one older ACK: only aggressive drops it",
                vec![a(100)],
                a(200),
                None,
                Some(0),
            ),
            (
                "a lone ACK not directly ahead is kept even when aggressive",
                vec![a(100), tcp4(2000, 5, ACK, &[], 0)],
                a(200),
                None,
                None,
            ),
            (
                "data segments are never dropped",
                vec![
                    tcp4(1000, 100, ACK, &[], 500),
                    tcp4(1000, 150, ACK, &[], 500),
                ],
                a(200),
                None,
                None,
            ),
            (
                "an older ACK with a higher ack number is kept",
                vec![a(300), a(400)],
                a(200),
                None,
                None,
            ),
            (
                "PSH/FIN/RST keep an ACK",
                vec![
                    tcp4(1000, 100, ACK | 0x0001_0000, &[], 0),
                    tcp4(1000, 150, ACK | 0x0008_0000, &[], 0),
                ],
                a(200),
                None,
                None,
            ),
            (
                "a SYN trigger filters nothing",
                vec![a(100), a(150)],
                tcp4(1000, 200, ACK | SYN, &[], 0),
                None,
                None,
            ),
            (
                "other connections are left alone",
                vec![tcp4(7, 100, ACK, &[], 0), tcp4(7, 150, ACK, &[], 0)],
                a(200),
                None,
                None,
            ),
            (
                "a newer timestamp keeps the older ACK",
                vec![
                    tcp4(1000, 100, ACK, &ts(9), 0),
                    tcp4(1000, 150, ACK, &ts(9), 0),
                ],
                tcp4(1000, 200, ACK, &ts(5), 0),
                None,
                None,
            ),
            (
                "older timestamps may go",
                vec![
                    tcp4(1000, 100, ACK, &ts(4), 0),
                    tcp4(1000, 150, ACK, &ts(5), 0),
                ],
                tcp4(1000, 200, ACK, &ts(5), 0),
                Some(0),
                Some(0),
            ),
            (
                "unknown options keep an ACK",
                vec![
                    tcp4(1000, 100, ACK, &[3, 3, 7, 0], 0),
                    tcp4(1000, 150, ACK, &[3, 3, 7, 0], 0),
                ],
                a(200),
                None,
                None,
            ),
            (
                "a SACK the trigger covers and extends may go",
                vec![
                    tcp4(1000, 100, ACK, &sack(&[(300, 400)]), 0),
                    tcp4(1000, 100, ACK, &sack(&[(300, 500)]), 0),
                ],
                tcp4(1000, 100, ACK, &sack(&[(300, 600)]), 0),
                Some(0),
                Some(0),
            ),
            (
                "a SACK block the trigger lacks keeps the ACK",
                vec![
                    tcp4(1000, 100, ACK, &sack(&[(700, 800)]), 0),
                    tcp4(1000, 100, ACK, &sack(&[(700, 800)]), 0),
                ],
                tcp4(1000, 100, ACK, &sack(&[(300, 600)]), 0),
                None,
                None,
            ),
            (
                "a DSACK is kept, though the trigger covers its block",
                vec![
                    tcp4(1000, 500, ACK, &sack(&[(100, 200)]), 0),
                    tcp4(1000, 500, ACK, &sack(&[(100, 200)]), 0),
                ],
                tcp4(1000, 600, ACK, &sack(&[(100, 200), (700, 800)]), 0),
                None,
                None,
            ),
            (
                "the same ack number without more SACK is no progress",
                vec![a(200), a(200)],
                a(200),
                None,
                None,
            ),
            (
                "ECE changed after the first eligible one: that one is kept",
                vec![a(100), tcp4(1000, 150, ACK | 0x0040_0000, &[], 0)],
                a(200),
                None,
                None,
            ),
        ];
        for (what, ahead, trigger, conservative, aggressive) in cases {
            let mut queue = q(ahead);
            queue.push_back(trigger);
            assert_eq!(
                redundant_ack(&queue, false),
                conservative,
                "{what} (conservative)"
            );
            assert_eq!(
                redundant_ack(&queue, true),
                aggressive,
                "{what} (aggressive)"
            );
        }
    }
}
