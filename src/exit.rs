//! DESIGN §10's exit codes, and the one error type every command returns.

use std::fmt;

use pcmail_core::api::ErrorCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Error = 1,
    Loop = 3,
    Unresolved = 4,
    Timeout = 5,
    Unauthorized = 6,
}

impl Exit {
    pub fn for_code(code: ErrorCode) -> Exit {
        match code {
            ErrorCode::Unauthorized | ErrorCode::Forbidden => Exit::Unauthorized,
            ErrorCode::RecipientUnresolved => Exit::Unresolved,
            ErrorCode::LoopRefused => Exit::Loop,
            _ => Exit::Error,
        }
    }
}

/// One clear line for stderr, optional detail lines after it, and the exit code.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    /// The server's error code, when the error came from the server.
    pub code: Option<ErrorCode>,
    pub message: String,
    pub details: Vec<String>,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        CliError { exit, code: None, message: message.into(), details: vec![] }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// The binary's edge: anything not already a CliError is a plain error (exit 1).
pub fn exit_code(err: &anyhow::Error) -> i32 {
    err.downcast_ref::<CliError>().map_or(Exit::Error, |e| e.exit) as i32
}

pub fn print(err: &anyhow::Error) {
    match err.downcast_ref::<CliError>() {
        Some(e) => {
            eprintln!("error: {}", e.message);
            for d in &e.details {
                eprintln!("  {d}");
            }
        }
        None => eprintln!("error: {err:#}"),
    }
}
