//! Structured logging through tracing, as text or JSON.

use crate::config::LogFormat;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Colour codes only on a terminal (never in a file, a pipe or a
/// container's log), and never with `NO_COLOR` set (no-color.org).
fn colour() -> bool {
    use std::io::IsTerminal;
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber. `RUST_LOG` wins over the configured level.
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry
            .with(fmt::layer().json().with_current_span(true))
            .try_init(),
        LogFormat::Text => registry
            .with(fmt::layer().with_target(true).with_ansi(colour()))
            .try_init(),
    };
    // A second init (tests) is harmless: the first subscriber stays.
    let _ = result;
}
