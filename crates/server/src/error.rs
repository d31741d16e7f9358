//! How services and reconcilers fail, without HTTP: the edge (`api/error.rs`) answers a
//! [`Failure`] with its status and code; the loop labels its error metric with a
//! [`ReconcileError`]'s reason.

use pcmail_core::mail::SendError;
use pcmail_core::manifest::ManifestError;
use pcmail_core::roster::ResolveError;
use pcmail_store::StoreError;

/// What kind of refusal a [`ServiceError`] is: what a client does next depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    TooLarge,
    /// Well-formed but refused for what it says (T2, T3, T5, T6), naming the field.
    Unprocessable,
    Unavailable,
    /// 429: over a budget of the caller's; the same call later goes through.
    TooMany,
    Internal,
    InvalidManifest,
    RecipientUnresolved,
    LoopRefused,
    DuplicateId,
}

/// A service's refusal: its kind, the one sentence the client is told, and the lines that
/// detail it (a manifest's errors, an address's candidates).
#[derive(Debug, thiserror::Error)]
#[error("{}", render(.message, .details))]
pub struct ServiceError {
    failure: Failure,
    message: String,
    details: Vec<String>,
}

fn render(message: &str, details: &[String]) -> String {
    details.iter().fold(message.to_string(), |out, d| format!("{out}\n  {d}"))
}

impl ServiceError {
    pub fn new(failure: Failure, message: impl Into<String>) -> Self {
        ServiceError { failure, message: message.into(), details: vec![] }
    }
    pub fn failure(&self) -> Failure {
        self.failure
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    pub fn into_parts(self) -> (Failure, String, Vec<String>) {
        (self.failure, self.message, self.details)
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(Failure::BadRequest, m)
    }
    pub fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(Failure::Unauthorized, m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(Failure::Forbidden, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(Failure::NotFound, m)
    }
    /// T16: the one answer for a mail that is not there and for one that is not the caller's.
    pub fn mail_not_found(id: &str) -> Self {
        Self::not_found(format!("mail {id} not found"))
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(Failure::Conflict, m)
    }
    pub fn too_large(m: impl Into<String>) -> Self {
        Self::new(Failure::TooLarge, m)
    }
    pub fn unprocessable(m: impl Into<String>) -> Self {
        Self::new(Failure::Unprocessable, m)
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(Failure::Unavailable, m)
    }
    pub fn too_many(m: impl Into<String>) -> Self {
        Self::new(Failure::TooMany, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(Failure::Internal, m)
    }
    pub fn invalid_manifest(errors: Vec<ManifestError>) -> Self {
        let n = errors.len();
        ServiceError {
            details: errors.iter().map(ToString::to_string).collect(),
            ..Self::new(
                Failure::InvalidManifest,
                format!("{n} error{} in manifests; nothing was applied", if n == 1 { "" } else { "s" }),
            )
        }
    }
    pub fn from_resolve(e: ResolveError) -> Self {
        ServiceError {
            details: e.candidates().iter().map(|c| format!("candidate: {c}")).collect(),
            ..Self::new(Failure::RecipientUnresolved, e.to_string())
        }
    }
}

impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> Self {
        match e {
            // E15: an outage is said in the log once per change by the health watch
            // (`serve::watch_health`), not once per request it refuses.
            StoreError::Unavailable(_) | StoreError::NoSpace(_) => {
                tracing::debug!(error = %e, "store unavailable");
                Self::unavailable(e.to_string())
            }
            _ => {
                tracing::error!(error = %e, "store error");
                Self::internal(e.to_string())
            }
        }
    }
}

impl From<pcmail_core::api::Invalid> for ServiceError {
    fn from(e: pcmail_core::api::Invalid) -> Self {
        Self::unprocessable(e.message)
    }
}

impl From<pcmail_core::bounds::OutOfRange> for ServiceError {
    fn from(e: pcmail_core::bounds::OutOfRange) -> Self {
        Self::unprocessable(e.to_string())
    }
}

impl From<SendError> for ServiceError {
    fn from(e: SendError) -> Self {
        let message = e.to_string();
        match e {
            SendError::Unresolved(r) => Self::from_resolve(r),
            SendError::Loop(_) => Self::new(Failure::LoopRefused, message),
            SendError::DuplicateId(_) => Self::new(Failure::DuplicateId, message),
            SendError::ParentNotFound(id) => Self::mail_not_found(&id),
            SendError::NotRecipient(_) => Self::forbidden(message),
            SendError::Invalid(_) => Self::unprocessable(message),
        }
    }
}

/// Why a reconcile failed. `reason` labels `pcmail_reconcile_errors_total`, so a dashboard
/// tells a full disk from a dead webhook.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("posting {count} notification(s) to {url}: {message}")]
    Webhook { count: usize, url: String, message: String },
}

impl ReconcileError {
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Store(e) => e.kind(),
            ReconcileError::Webhook { .. } => "webhook",
        }
    }

    /// Every value [`ReconcileError::reason`] answers, for the metric's zero series.
    pub fn reasons() -> impl Iterator<Item = &'static str> {
        StoreError::KINDS.into_iter().chain(["webhook"])
    }
}
