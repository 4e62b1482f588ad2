//! Certificates for the HTTPS face: loaded from PEM files (and again on SIGHUP), or made once by
//! `--self-signed`: an ECDSA P-256 certificate for the names given, valid 825 days at most
//! (Apple's clients refuse longer), its key readable by its owner only.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Longest validity Apple's TLS clients accept for a server certificate.
pub const MAX_VALIDITY_DAYS: i64 = 825;

/// The PEM files the server serves from; re-read on `reload`.
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<ServerConfig>>,
}

impl Tls {
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, String> {
        let config = server_config(cert, key)?;
        Ok(Tls {
            cert: cert.into(),
            key: key.into(),
            current: RwLock::new(config),
        })
    }

    /// The configuration new connections get.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the files again; on an error the old certificate stays in use.
    pub fn reload(&self) -> Result<String, String> {
        let config = server_config(&self.cert, &self.key)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
        fingerprint_of(&self.cert)
    }
}

fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut c = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(c))
}

/// SHA-256 of the first certificate in a PEM file, as browsers show it (AB:CD:...).
pub fn fingerprint_of(cert: &Path) -> Result<String, String> {
    let der =
        CertificateDer::from_pem_file(cert).map_err(|e| format!("{}: {e}", cert.display()))?;
    Ok(fingerprint(&der))
}

fn fingerprint(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Civil date (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil(days: i64) -> (i32, u8, u8) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    ((yoe + era * 400 + (m <= 2) as i64) as i32, m as u8, d as u8)
}

/// Makes `cert.pem` and `key.pem` in `dir` for `names` (host names or addresses), valid from
/// yesterday for MAX_VALIDITY_DAYS - 1 days, unless that directory already holds a pair made
/// for the same names that is valid for another 30 days. Returns the two paths.
pub fn self_signed(
    dir: &Path,
    names: &[String],
    now: SystemTime,
) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key, about) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("self-signed.txt"),
    );
    let today = (now
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs()
        / 86_400) as i64;
    let wanted = names.join(",");
    // "NAMES\nLAST_DAY": what the pair in the directory was made for.
    if let Ok(text) = std::fs::read_to_string(&about) {
        let mut lines = text.lines();
        let (made_for, last_day) = (
            lines.next().unwrap_or(""),
            lines
                .next()
                .and_then(|d| d.parse::<i64>().ok())
                .unwrap_or(0),
        );
        if made_for == wanted && last_day > today + 30 && cert.exists() && key.exists() {
            return Ok((cert, key));
        }
    }
    let mut params =
        rcgen::CertificateParams::new(names.to_vec()).map_err(|e| format!("--name: {e}"))?;
    let (first, last) = (today - 1, today - 1 + MAX_VALIDITY_DAYS - 1);
    let date = |days: i64| {
        let (y, m, d) = civil(days);
        rcgen::date_time_ymd(y, m, d)
    };
    params.not_before = date(first);
    params.not_after = date(last);
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        names.first().cloned().unwrap_or_else(|| "bloatlab".into()),
    );
    let pair =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| e.to_string())?;
    let made = params.self_signed(&pair).map_err(|e| e.to_string())?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |path: &Path, text: &str| -> Result<(), String> {
        let _ = std::fs::remove_file(path);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    write(&key, &pair.serialize_pem())?;
    write(&cert, &made.pem())?;
    write(&about, &format!("{wanted}\n{last}\n"))?;
    Ok((cert, key))
}

use std::os::unix::fs::DirBuilderExt;

/// Where `--self-signed` keeps its files: /var/lib/bloatlab/tls as root, else under the
/// user's ~/.local/state.
pub fn default_dir() -> PathBuf {
    match std::env::var_os("HOME") {
        // SAFETY: geteuid has no preconditions.
        Some(home) if unsafe { libc::geteuid() } != 0 => {
            PathBuf::from(home).join(".local/state/bloatlab/tls")
        }
        _ => PathBuf::from("/var/lib/bloatlab/tls"),
    }
}

/// The self-signed certificate's names when none are given: localhost, its addresses and this
/// host's name (when it is one a certificate can carry).
pub fn default_names() -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".into(), "::1".into()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let h = h.trim();
        if !h.is_empty()
            && h != "localhost"
            && h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            names.push(h.to_string());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_follow_the_calendar() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(20_781), (2026, 11, 24));
    }

    #[test]
    fn a_self_signed_pair_loads_names_its_hosts_is_private_and_is_reused() {
        let dir = std::env::temp_dir().join(format!("bloatlab-tls-{}", std::process::id()));
        struct Gone(PathBuf);
        impl Drop for Gone {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _gone = Gone(dir.clone());
        let now = UNIX_EPOCH + std::time::Duration::from_secs(20_781 * 86_400);
        let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let (cert, key) = self_signed(&dir, &names, now).unwrap();
        let tls = Tls::load(&cert, &key).unwrap();
        assert_eq!(
            tls.current().alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let fp = fingerprint_of(&cert).unwrap();
        assert_eq!(fp.len(), 32 * 3 - 1);
        // The same names a day later: the same certificate; other names: a new one.
        self_signed(&dir, &names, now + std::time::Duration::from_secs(86_400)).unwrap();
        assert_eq!(fingerprint_of(&cert).unwrap(), fp);
        self_signed(&dir, &["rpm.example".to_string()], now).unwrap();
        assert_ne!(fingerprint_of(&cert).unwrap(), fp);
        assert_eq!(tls.reload().unwrap(), fingerprint_of(&cert).unwrap());
    }
}
