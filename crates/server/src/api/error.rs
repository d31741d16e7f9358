//! Every failure of the API is one JSON shape with a stable code (DESIGN §10 maps codes to
//! exit codes in the CLI) and a message that names the problem.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pcmail_core::api::{ErrorBody, ErrorCode, ErrorDetail};
use pcmail_core::mail::SendError;
use pcmail_core::manifest::ManifestError;
use pcmail_core::roster::ResolveError;
use pcmail_store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    details: Vec<String>,
}

impl ApiError {
    /// The one sentence the client is told.
    pub fn message(&self) -> &str {
        &self.message
    }

    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into(), details: vec![] }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, m)
    }
    pub fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized, m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, ErrorCode::Forbidden, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, m)
    }
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, ErrorCode::Conflict, m)
    }
    pub fn too_large(m: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge, m)
    }
    /// Well-formed but refused for what it says (T2, T3, T5, T6): 422 naming the field.
    pub fn unprocessable(m: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::BadRequest, m)
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, m)
    }
    pub fn invalid_manifest(errors: Vec<ManifestError>) -> Self {
        let n = errors.len();
        ApiError {
            details: errors.iter().map(ToString::to_string).collect(),
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorCode::InvalidManifest,
                format!("{n} error{} in manifests; nothing was applied", if n == 1 { "" } else { "s" }),
            )
        }
    }
    pub fn from_resolve(e: ResolveError) -> Self {
        ApiError {
            details: e.candidates().iter().map(|c| format!("candidate: {c}")).collect(),
            ..Self::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::RecipientUnresolved, e.to_string())
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => {
                tracing::error!(error = %e, "store unavailable");
                Self::new(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, e.to_string())
            }
            _ => {
                tracing::error!(error = %e, "store error");
                Self::internal(e.to_string())
            }
        }
    }
}

impl From<pcmail_core::api::Invalid> for ApiError {
    fn from(e: pcmail_core::api::Invalid) -> Self {
        Self::unprocessable(e.message)
    }
}

impl From<pcmail_core::bounds::OutOfRange> for ApiError {
    fn from(e: pcmail_core::bounds::OutOfRange) -> Self {
        Self::unprocessable(e.to_string())
    }
}

impl From<SendError> for ApiError {
    fn from(e: SendError) -> Self {
        let message = e.to_string();
        match e {
            SendError::Unresolved(r) => Self::from_resolve(r),
            SendError::Loop(_) => Self::new(StatusCode::CONFLICT, ErrorCode::LoopRefused, message),
            SendError::DuplicateId(_) => Self::new(StatusCode::CONFLICT, ErrorCode::DuplicateId, message),
            SendError::ParentNotFound(_) => Self::not_found(message),
            SendError::NotRecipient(_) => Self::forbidden(message),
            SendError::Invalid(_) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::BadRequest, message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.code, message: self.message, details: self.details } };
        (self.status, axum::Json(body)).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        for d in &self.details {
            write!(f, "\n  {d}")?;
        }
        Ok(())
    }
}
