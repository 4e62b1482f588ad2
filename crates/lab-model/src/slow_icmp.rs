//! A host that is slow to originate ICMP errors while it is busy forwarding: many routers
//! build Time Exceeded and Unreachable messages on a slow path (their CPU) that the forwarding
//! fast path starves under load, so their own answers come late while the traffic they forward
//! does not. A traceroute-like prober then sees that hop's round trip rise under load although
//! no queue is there, and hops behind it unaffected (`bloatlab locate` must not blame it).

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How long a window counts as "busy", and how many packets sent in it make it so (500/s).
pub const BUSY_WINDOW_NS: u64 = 100_000_000;
pub const BUSY_PACKETS: usize = 50;

/// The source address of an ICMP or ICMPv6 error message (destination unreachable, time
/// exceeded, parameter problem; ICMPv6 also packet too big), `None` for any other packet.
pub fn icmp_error_source(data: &[u8]) -> Option<IpAddr> {
    match data.first()? >> 4 {
        4 if data.len() >= 20 => {
            let ihl = usize::from(data[0] & 0x0f) * 4;
            let ty = *data.get(ihl)?;
            (data[9] == 1 && matches!(ty, 3 | 11 | 12))
                .then(|| IpAddr::V4(Ipv4Addr::new(data[12], data[13], data[14], data[15])))
        }
        // Extension headers are not followed: an ICMPv6 error from a router carries none.
        6 if data.len() >= 41 => {
            let ty = data[40];
            (data[6] == 58 && (1..=4).contains(&ty)).then(|| {
                IpAddr::V6(Ipv6Addr::from(
                    <[u8; 16]>::try_from(&data[8..24]).expect("16 bytes"),
                ))
            })
        }
        _ => None,
    }
}

pub struct SlowIcmp {
    /// The host's own addresses: an error from one of them is its own, not forwarded.
    addrs: Vec<IpAddr>,
    delay_ns: u64,
    /// Send times of the packets in the current busy window.
    recent: VecDeque<u64>,
}

impl SlowIcmp {
    pub fn new(addrs: Vec<IpAddr>, delay_ns: u64) -> SlowIcmp {
        SlowIcmp {
            addrs,
            delay_ns,
            recent: VecDeque::new(),
        }
    }

    /// Notes a packet the host sends at `now`; how long to hold it before it enters the link:
    /// the delay for the host's own ICMP errors while it is busy, else 0.
    pub fn hold(&mut self, data: &[u8], now: u64) -> u64 {
        while self
            .recent
            .front()
            .is_some_and(|&t| now.saturating_sub(t) > BUSY_WINDOW_NS)
        {
            self.recent.pop_front();
        }
        let busy = self.recent.len() >= BUSY_PACKETS;
        self.recent.push_back(now);
        if self.recent.len() > BUSY_PACKETS {
            self.recent.pop_front();
        }
        match icmp_error_source(data) {
            Some(src) if busy && self.addrs.contains(&src) => self.delay_ns,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MS;

    fn icmp4(src: [u8; 4], ty: u8) -> Vec<u8> {
        let mut p = vec![0u8; 56];
        p[0] = 0x45;
        p[9] = 1;
        p[12..16].copy_from_slice(&src);
        p[20] = ty;
        p
    }

    fn icmp6(src: Ipv6Addr, ty: u8) -> Vec<u8> {
        let mut p = vec![0u8; 88];
        p[0] = 0x60;
        p[6] = 58;
        p[8..24].copy_from_slice(&src.octets());
        p[40] = ty;
        p
    }

    #[test]
    fn errors_are_told_from_echoes_and_other_traffic() {
        assert_eq!(
            icmp_error_source(&icmp4([10, 77, 0, 2], 11)),
            Some("10.77.0.2".parse().unwrap())
        );
        assert_eq!(
            icmp_error_source(&icmp4([10, 77, 0, 2], 3)),
            Some("10.77.0.2".parse().unwrap())
        );
        assert_eq!(
            icmp_error_source(&icmp4([10, 77, 0, 2], 0)),
            None,
            "echo reply"
        );
        let v6: Ipv6Addr = "fd77::2".parse().unwrap();
        assert_eq!(icmp_error_source(&icmp6(v6, 3)), Some(IpAddr::V6(v6)));
        assert_eq!(icmp_error_source(&icmp6(v6, 129)), None, "echo reply");
        assert_eq!(
            icmp_error_source(&crate::packet::udp4(100, 1, 2, 0).data),
            None
        );
        assert_eq!(icmp_error_source(&[0x45, 0, 0]), None, "truncated");
    }

    #[test]
    fn own_errors_wait_only_while_busy_and_forwarded_ones_never() {
        let mut s = SlowIcmp::new(vec!["10.77.0.2".parse().unwrap()], 300 * MS);
        let own = icmp4([10, 77, 0, 2], 11);
        let forwarded = icmp4([10, 77, 1, 2], 11);
        let data = crate::packet::udp4(1000, 1, 2, 0).data;
        assert_eq!(s.hold(&own, 0), 0, "idle: answered at once");
        // 1000 packets a second for 200 ms: busy.
        for i in 0..200 {
            s.hold(&data, MS + i * MS);
        }
        assert_eq!(s.hold(&own, 201 * MS), 300 * MS);
        assert_eq!(
            s.hold(&forwarded, 202 * MS),
            0,
            "another router's answer passes"
        );
        // Quiet for longer than the window: idle again.
        assert_eq!(s.hold(&own, 400 * MS), 0);
    }
}
