//! DESIGN §10's exit codes, and how errors reach stderr.

use pcmail_agent::client::ClientError;
use pcmail_agent::mail::MailError;
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

    fn for_client(e: &ClientError) -> Exit {
        match e {
            ClientError::NoToken | ClientError::Api { status: 401 | 403, .. } => Exit::Unauthorized,
            ClientError::Api { code: Some(code), .. } => Exit::for_code(*code),
            _ => Exit::Error,
        }
    }
}

/// An error the CLI itself raises: one clear line, optional details, and its exit code.
#[derive(Debug)]
pub struct CliError {
    pub exit: Exit,
    pub message: String,
    pub details: Vec<String>,
}

impl CliError {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        CliError { exit, message: message.into(), details: vec![] }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// (exit code, first line, detail lines) for any error that reaches `main`.
fn describe(err: &anyhow::Error) -> (Exit, String, Vec<String>) {
    if let Some(e) = err.downcast_ref::<CliError>() {
        return (e.exit, e.message.clone(), e.details.clone());
    }
    let client = match err.downcast_ref::<MailError>() {
        Some(MailError::Client(e)) => Some(e),
        Some(e @ MailError::Loop(_)) => return (Exit::Loop, e.to_string(), vec![]),
        Some(e @ MailError::Random(_)) => return (Exit::Error, e.to_string(), vec![]),
        None => err.downcast_ref::<ClientError>(),
    };
    if let Some(e) = client {
        let details = match e {
            ClientError::Api { details, .. } => details.clone(),
            _ => vec![],
        };
        return (Exit::for_client(e), e.to_string(), details);
    }
    (Exit::Error, format!("{err:#}"), vec![])
}

pub fn exit_code(err: &anyhow::Error) -> i32 {
    describe(err).0 as i32
}

pub fn print(err: &anyhow::Error) {
    let (_, message, details) = describe(err);
    eprintln!("error: {message}");
    for d in details {
        eprintln!("  {d}");
    }
}
