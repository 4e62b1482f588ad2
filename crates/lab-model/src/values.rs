//! Values of `key=value` settings (rates, times, fractions, switches) and the error every
//! setting's parser returns. Leaf of `config`, `rate` and `cake::params`.

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error(
        "unknown key `{0}` (keys: rate, delay, jitter, reorder, loss, ge, mtu, overhead, atm, \
        qdisc, limit, target, interval, ecn, flows, quantum, ring, bql, seed)"
    )]
    Key(String),
    #[error("{0}")]
    Value(String),
}

/// Bits per second: "60mbit", "500kbit", "1gbit" (`bloatlab_units`, tc's bit units).
pub fn parse_rate(s: &str) -> Result<u64, ConfigError> {
    bloatlab_units::parse_rate(s).map_err(ConfigError::Value)
}

/// Nanoseconds: "7.5ms", "100us", "2s", "0" (`bloatlab_units`).
pub fn parse_time_ns(s: &str) -> Result<u64, ConfigError> {
    bloatlab_units::parse_duration(s)
        .map(|d| d.as_nanos() as u64)
        .map_err(ConfigError::Value)
}

pub(crate) fn parse_fraction(s: &str) -> Result<f64, ConfigError> {
    let t = s.trim();
    let v = match t.strip_suffix('%') {
        Some(p) => p.trim().parse::<f64>().map(|v| v / 100.0),
        None => t.parse::<f64>(),
    };
    match v {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(ConfigError::Value(format!(
            "probability `{s}`: want e.g. 1% or 0.01"
        ))),
    }
}

pub(crate) fn parse_bool(s: &str) -> Result<bool, ConfigError> {
    match s.trim() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(ConfigError::Value(format!("`{s}`: want on or off"))),
    }
}

pub(crate) fn parse_usize(s: &str, what: &str) -> Result<usize, ConfigError> {
    s.trim()
        .parse()
        .map_err(|_| ConfigError::Value(format!("{what} `{s}`: want a whole number")))
}
