//! The optional shared key (`bloatlab server --key FILE`), as irtt offers it: the server sends a
//! random challenge in `hello_ok`, the client proves it holds the key with an HMAC of it in its
//! test request, and every UDP probe (both ways) carries a truncated HMAC of itself. Pure.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the challenge the server sends.
pub const CHALLENGE_LEN: usize = 16;
/// Bytes of a probe's MAC: 128 bits of HMAC-SHA256, as TLS and irtt truncate.
pub const PROBE_MAC_LEN: usize = 16;
/// Shortest key accepted: 128 bits.
pub const MIN_KEY_LEN: usize = 16;

fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    m
}

/// The client's answer to a challenge, hex (what `TestRequest.auth` carries).
pub fn answer(key: &[u8], challenge: &[u8]) -> String {
    hex(&hmac(key, &[b"bloatlab control v2", challenge])
        .finalize()
        .into_bytes())
}

/// Whether `answer_hex` proves the key (compared in constant time).
pub fn verify_answer(key: &[u8], challenge: &[u8], answer_hex: &str) -> bool {
    match unhex(answer_hex) {
        Some(a) => hmac(key, &[b"bloatlab control v2", challenge])
            .verify_slice(&a)
            .is_ok(),
        None => false,
    }
}

/// The MAC of a probe packet `packet` whose last `PROBE_MAC_LEN` bytes will hold it: computed
/// over everything before them.
pub fn probe_mac(key: &[u8], packet: &[u8]) -> [u8; PROBE_MAC_LEN] {
    let body = &packet[..packet.len() - PROBE_MAC_LEN];
    let full = hmac(key, &[b"bloatlab probe v2", body])
        .finalize()
        .into_bytes();
    let mut out = [0u8; PROBE_MAC_LEN];
    out.copy_from_slice(&full[..PROBE_MAC_LEN]);
    out
}

/// Writes the MAC into the last `PROBE_MAC_LEN` bytes of `packet`.
pub fn sign_probe(key: &[u8], packet: &mut [u8]) {
    let mac = probe_mac(key, packet);
    let n = packet.len();
    packet[n - PROBE_MAC_LEN..].copy_from_slice(&mac);
}

/// Whether the packet's last `PROBE_MAC_LEN` bytes are its MAC (constant-time comparison).
pub fn probe_signed(key: &[u8], packet: &[u8]) -> bool {
    if packet.len() < PROBE_MAC_LEN {
        return false;
    }
    let body = &packet[..packet.len() - PROBE_MAC_LEN];
    hmac(key, &[b"bloatlab probe v2", body])
        .verify_truncated_left(&packet[packet.len() - PROBE_MAC_LEN..])
        .is_ok()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || s.len() > 256 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

/// A shared key as a file or BLOATLAB_KEY holds it: a trailing newline (or CRLF) dropped, at
/// least `MIN_KEY_LEN` bytes.
pub fn parse_key(raw: &[u8]) -> Result<Vec<u8>, String> {
    let key = raw.strip_suffix(b"\n").unwrap_or(raw);
    let key = key.strip_suffix(b"\r").unwrap_or(key);
    if key.len() < MIN_KEY_LEN {
        return Err(format!(
            "the key must be at least {MIN_KEY_LEN} bytes (got {})",
            key.len()
        ));
    }
    Ok(key.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_proves_the_key_and_nothing_else() {
        let (key, other) = (b"0123456789abcdef-secret", b"0123456789abcdef-guess!");
        let challenge = [7u8; CHALLENGE_LEN];
        let a = answer(key, &challenge);
        assert_eq!(a.len(), 64);
        assert!(verify_answer(key, &challenge, &a));
        assert!(!verify_answer(other, &challenge, &a));
        assert!(
            !verify_answer(key, &[8u8; CHALLENGE_LEN], &a),
            "bound to its challenge"
        );
        assert!(!verify_answer(key, &challenge, "zz"));
        assert!(!verify_answer(key, &challenge, &a[..62]));
    }

    #[test]
    fn a_signed_probe_verifies_and_any_changed_bit_does_not() {
        let key = b"0123456789abcdef";
        let mut p = vec![0x5a; 64];
        sign_probe(key, &mut p);
        assert!(probe_signed(key, &p));
        for i in [0, 20, 47, 63] {
            let mut q = p.clone();
            q[i] ^= 1;
            assert!(!probe_signed(key, &q), "bit flipped at {i}");
        }
        assert!(!probe_signed(b"another key 0123", &p));
        assert!(!probe_signed(key, &p[..8]));
    }
}
