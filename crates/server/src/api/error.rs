//! Every failure of the API is one JSON shape with a stable code (DESIGN §10 maps codes to
//! exit codes in the CLI) and a message that names the problem.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use pcmail_core::api::{ErrorBody, ErrorCode, ErrorDetail};

use crate::error::{Failure, ServiceError};

fn status_and_code(failure: Failure) -> (StatusCode, ErrorCode) {
    match failure {
        Failure::BadRequest => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest),
        Failure::Unauthorized => (StatusCode::UNAUTHORIZED, ErrorCode::Unauthorized),
        Failure::Forbidden => (StatusCode::FORBIDDEN, ErrorCode::Forbidden),
        Failure::NotFound => (StatusCode::NOT_FOUND, ErrorCode::NotFound),
        Failure::Conflict => (StatusCode::CONFLICT, ErrorCode::Conflict),
        Failure::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge),
        Failure::Unprocessable => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::BadRequest),
        Failure::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable),
        // No code of its own: clients of every version already take `unavailable` as "later".
        Failure::TooMany => (StatusCode::TOO_MANY_REQUESTS, ErrorCode::Unavailable),
        Failure::Internal => (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal),
        Failure::InvalidManifest => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::InvalidManifest),
        Failure::RecipientUnresolved => (StatusCode::UNPROCESSABLE_ENTITY, ErrorCode::RecipientUnresolved),
        Failure::LoopRefused => (StatusCode::CONFLICT, ErrorCode::LoopRefused),
        Failure::DuplicateId => (StatusCode::CONFLICT, ErrorCode::DuplicateId),
    }
}

impl IntoResponse for ServiceError {
    fn into_response(self) -> Response {
        let (failure, message, details) = self.into_parts();
        let (status, code) = status_and_code(failure);
        (status, axum::Json(ErrorBody { error: ErrorDetail { code, message, details } })).into_response()
    }
}
