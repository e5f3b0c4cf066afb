//! Durations as users write them in custom resources and config: Go-style
//! `5m`, `168h`, `1h30m`, `90s`, `500ms`. The CRD schema carries the same
//! pattern, so the apiserver rejects most typos before we ever see them.

use std::time::Duration;

/// The schema pattern matching what [`parse`] accepts.
pub const PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (expected e.g. 90s, 5m, 1h30m, 168h)")]
pub struct DurationError {
    pub input: String,
    pub reason: &'static str,
}

pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    if input.is_empty() {
        return Err(err("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = input;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err("a number must precede each unit"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let (unit, tail) = rest.split_at(unit_len);
        let part = match unit {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(
                value
                    .checked_mul(60)
                    .ok_or_else(|| err("number too large"))?,
            ),
            "h" => Duration::from_secs(
                value
                    .checked_mul(3600)
                    .ok_or_else(|| err("number too large"))?,
            ),
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit (use ms, s, m or h)")),
        };
        total = total
            .checked_add(part)
            .ok_or_else(|| err("number too large"))?;
        rest = tail;
    }
    Ok(total)
}

/// Formats a duration the way [`parse`] reads it (for status and defaults).
pub fn format(d: Duration) -> String {
    let mut secs = d.as_secs();
    let millis = d.subsec_millis();
    if secs == 0 {
        return format!("{millis}ms");
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    if millis > 0 {
        out.push_str(&format!("{millis}ms"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_go_style_durations() {
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("168h"), Ok(Duration::from_secs(168 * 3600)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn rejects_malformed_durations_with_reason() {
        for bad in [
            "",
            "5",
            "m",
            "5 m",
            "-5m",
            "5d",
            "1.5h",
            "99999999999999999999h",
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.input, bad);
        }
        assert_eq!(
            parse("5d").unwrap_err().reason,
            "unknown unit (use ms, s, m or h)"
        );
    }

    /// The schema's `PATTERN` (the apiserver enforces it) and the parser
    /// agree: what the pattern admits parses (but for a number too large,
    /// which the parser refuses), and what it refuses does not parse.
    fn agree(pattern: &regex::Regex, s: &str) -> Result<(), String> {
        match (pattern.is_match(s), parse(s)) {
            (true, Ok(_)) | (false, Err(_)) => Ok(()),
            (true, Err(e)) if e.reason == "number too large" => Ok(()),
            (matched, parsed) => Err(format!("{s:?}: pattern {matched}, parser {parsed:?}")),
        }
    }

    #[test]
    fn schema_pattern_agrees_with_parser_on_examples() {
        let pattern = regex::Regex::new(PATTERN).expect("PATTERN is a regex");
        let examples = [
            "1s",
            "5m",
            "1h30m",
            "250ms",
            "0s",
            "",
            "m",
            "5 m",
            "-5m",
            "5d",
            "1.5h",
            "5M",
            "1h 30m",
            "99999999999999999999h",
        ];
        for s in examples {
            agree(&pattern, s).unwrap_or_else(|e| panic!("{e}"));
        }
        // Both ways were seen: a check that saw one side checked half.
        assert!(examples.iter().any(|s| pattern.is_match(s)));
        assert!(examples.iter().any(|s| !pattern.is_match(s)));
    }

    proptest::proptest! {
        #[test]
        fn schema_pattern_agrees_with_parser_on_any_string(s in "[0-9mshd. -]{0,12}") {
            let pattern = regex::Regex::new(PATTERN).expect("PATTERN is a regex");
            proptest::prop_assert!(agree(&pattern, &s).is_ok(), "{:?}", agree(&pattern, &s));
        }
    }

    /// Why this parser and not `kube::core::Duration` (docs/design.md): kube's
    /// panics on an overflowing duration, which would crash-loop the manager
    /// on one typo in a custom resource; ours refuses it. If kube stops
    /// panicking, this fails: look again at using it.
    #[test]
    fn an_overflowing_duration_is_refused_where_kube_core_panics() {
        let input = "99999999999999999999h";
        assert_eq!(parse(input).unwrap_err().reason, "number too large");
        let kube = std::panic::catch_unwind(|| input.parse::<kube::core::Duration>());
        assert!(
            kube.is_err(),
            "kube::core::Duration no longer panics on {input}: reconsider it (docs/design.md)"
        );
    }

    proptest! {
        #[test]
        fn format_round_trips(secs in 0u64..10_000_000, millis in 0u32..1000) {
            let d = Duration::from_secs(secs) + Duration::from_millis(millis as u64);
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
