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

/// A Kubernetes label selector's shape (`key`, `!key`, `key=value`,
/// `key!=value`, `key in (a,b)`, `key notin (a,b)`, comma-separated), so a
/// typo is said at start rather than at the first master decision.
pub(super) fn check_label_selector(selector: &str) -> Result<(), String> {
    let key_ok = |k: &str| {
        !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
    };
    let value_ok = |v: &str| {
        v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    };
    let mut terms = vec![];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    for term in terms.iter().map(|t| t.trim()) {
        let ok = if let Some(key) = term.strip_prefix('!') {
            key_ok(key.trim())
        } else if let Some((key, rest)) = term.split_once(" in ").or(term.split_once(" notin ")) {
            let rest = rest.trim();
            key_ok(key.trim())
                && rest.starts_with('(')
                && rest.ends_with(')')
                && rest[1..rest.len() - 1]
                    .split(',')
                    .all(|v| value_ok(v.trim()))
        } else if let Some((key, value)) =
            ["!=", "==", "="].iter().find_map(|op| term.split_once(op))
        {
            key_ok(key.trim()) && value_ok(value.trim())
        } else {
            key_ok(term)
        };
        if !ok {
            return Err(format!(
                "{term:?} in {selector:?} is not a label selector term (key, !key, key=value, key!=value, key in (a,b))"
            ));
        }
    }
    Ok(())
}
