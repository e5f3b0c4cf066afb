//! Checks of single config fields: durations and intervals, DNS names.

use super::ConfigError;
use crate::duration;
use std::time::Duration;

pub(super) fn parse_duration_field(
    field: &str,
    value: Option<String>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let raw = value.unwrap_or_else(|| default.to_string());
    duration::parse(&raw).map_err(|e| ConfigError::new(field, e.to_string()))
}

/// A period of the manager's own (a resync, an accounting): at least 1s.
pub(super) fn interval_field(
    field: &str,
    value: Option<String>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let interval = parse_duration_field(field, value, default)?;
    match interval < Duration::from_secs(1) {
        true => Err(ConfigError::new(field, "must be at least 1s")),
        false => Ok(interval),
    }
}

pub(super) fn check_dns_label(field: &str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("{value:?} is not a valid name (lowercase letters, digits, '-', at most 63)"),
        ))
    }
}

pub(super) fn check_dns_subdomain(field: &str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 253
        && value
            .split('.')
            .all(|part| check_dns_label(field, part).is_ok());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("{value:?} is not a valid object name"),
        ))
    }
}
