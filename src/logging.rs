//! X3: how `serve` and `agent` log — text for a person, JSON lines for a log shipper — always
//! to stderr, coloured only when stderr is a terminal and `NO_COLOR` is unset.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One readable line an event
    #[default]
    Text,
    /// One JSON object a line: timestamp, level, target, message and the event's fields
    Json,
}

/// The log flags of the long-running verbs.
#[derive(Debug, Clone, Default, Args)]
pub struct Logging {
    /// text, or json for a log shipper
    #[arg(long, value_enum, default_value_t)]
    pub log_format: LogFormat,
    /// error, warn, info, debug or trace [default: info; mcp: warn]. A filter in PCMAIL_LOG
    /// (else RUST_LOG), such as `info,pcmail_server=debug`, wins over it
    #[arg(long, value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: Option<String>,
}

impl Logging {
    /// Installs the process's subscriber once; a second call (a test, `mcp` after `agent`) is
    /// a no-op.
    pub fn init(&self, default_level: &str) {
        let filter = filter(
            std::env::var("PCMAIL_LOG").ok().or_else(|| std::env::var("RUST_LOG").ok()),
            self.log_level.as_deref().unwrap_or(default_level),
        );
        let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
        let _ = match self.log_format {
            LogFormat::Text => builder.with_ansi(colour(std::io::stderr().is_terminal(), no_color())).try_init(),
            LogFormat::Json => builder.json().flatten_event(true).with_ansi(false).try_init(),
        };
    }
}

fn no_color() -> Option<String> {
    std::env::var("NO_COLOR").ok()
}

/// The filter: the environment's when it is set and parses, else the level of the flag.
fn filter(env: Option<String>, level: &str) -> tracing_subscriber::EnvFilter {
    env.filter(|e| !e.trim().is_empty())
        .and_then(|e| tracing_subscriber::EnvFilter::try_new(e).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(level))
}

/// Colour only on a terminal, and never when `NO_COLOR` is set to anything but empty
/// (no-color.org).
fn colour(terminal: bool, no_color: Option<String>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x3_colour_only_on_a_terminal_and_never_with_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(String::new())), "an empty NO_COLOR is unset");
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None));
    }

    #[test]
    fn x3_the_environment_filter_wins_over_the_flag() {
        assert_eq!(filter(Some("debug".into()), "warn").to_string(), "debug");
        assert_eq!(filter(None, "warn").to_string(), "warn");
        assert_eq!(filter(Some(" ".into()), "error").to_string(), "error");
    }
}
