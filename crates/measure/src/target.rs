//! `HOST[:PORT]` as users write it: `example.net`, `10.0.0.1:9461`, `[2001:db8::1]:9461`, `::1`.

/// Splits into host and port (default port when absent). Brackets are removed from IPv6.
pub fn split_host_port(s: &str, default_port: u16) -> Result<(String, u16), String> {
    let bad_port = |p: &str| format!("bad port {p:?} in {s:?}");
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("missing ']' in {s:?}"))?;
        return match after {
            "" => Ok((host.into(), default_port)),
            p => Ok((
                host.into(),
                p.strip_prefix(':')
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| bad_port(p))?,
            )),
        };
    }
    match s.matches(':').count() {
        0 => Ok((s.into(), default_port)),
        1 => {
            let (h, p) = s.split_once(':').unwrap();
            Ok((h.into(), p.parse().map_err(|_| bad_port(p))?))
        }
        // Several colons and no brackets: a bare IPv6 address.
        _ => Ok((s.into(), default_port)),
    }
    .and_then(|(h, p): (String, u16)| {
        if h.is_empty() {
            Err(format!("no host in {s:?}"))
        } else {
            Ok((h, p))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms() {
        assert_eq!(split_host_port("srv", 9), Ok(("srv".into(), 9)));
        assert_eq!(
            split_host_port("10.0.0.1:80", 9),
            Ok(("10.0.0.1".into(), 80))
        );
        assert_eq!(split_host_port("[::1]:80", 9), Ok(("::1".into(), 80)));
        assert_eq!(split_host_port("[fe80::1]", 9), Ok(("fe80::1".into(), 9)));
        assert_eq!(
            split_host_port("2001:db8::1", 9),
            Ok(("2001:db8::1".into(), 9))
        );
        assert!(split_host_port("srv:http", 9).is_err());
        assert!(split_host_port("[::1", 9).is_err());
        assert!(split_host_port(":80", 9).is_err());
    }
}
