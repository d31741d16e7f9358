//! The HTTP API under `/api/v1/`, plus `/healthz` and `/readyz`. Handlers are thin: parse and
//! authenticate here, then call the shell modules (`mailbox`, `specs`).

mod error;
mod jobs;
mod ledger;
mod mail;
mod specs;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use pcmail_store::Store;
use serde::de::DeserializeOwned;

pub use error::ApiError;

use crate::App;

/// Requests are small JSON documents; manifests get more room on their own routes.
pub const BODY_LIMIT: usize = 256 * 1024;
pub const MANIFEST_BODY_LIMIT: usize = 4 * 1024 * 1024;

pub fn router(app: App) -> Router {
    let manifests = Router::new()
        .route("/api/v1/apply", post(specs::apply))
        .route("/api/v1/diff", post(specs::diff))
        .layer(DefaultBodyLimit::max(MANIFEST_BODY_LIMIT));
    let api = Router::new()
        .route("/api/v1/alerts", get(specs::alerts))
        .route("/api/v1/whoami", get(mail::whoami))
        .route("/api/v1/specs", get(specs::list))
        .route("/api/v1/specs/{kind}/{name}", get(specs::get_one).delete(specs::delete))
        .route("/api/v1/tokens", post(specs::issue_token))
        .route("/api/v1/mail", post(mail::send).get(mail::list))
        .route("/api/v1/mail/{id}", get(mail::status))
        .route("/api/v1/mail/{id}/{step}", post(mail::step))
        .route("/api/v1/poll", get(mail::poll))
        .route("/api/v1/intents", post(mail::record_intent))
        .route("/api/v1/policy", get(mail::policy))
        .route("/api/v1/jobs", post(jobs::enqueue).get(jobs::list))
        .route("/api/v1/jobs/claim", post(jobs::claim))
        .route("/api/v1/jobs/{id}/{action}", post(jobs::report))
        .route("/api/v1/ledger", get(ledger::list))
        .route("/api/v1/ledger/view", get(ledger::view))
        .route("/api/v1/ledger/push", post(ledger::push))
        .route("/api/v1/ledger/sync", post(ledger::sync))
        .route("/api/v1/ledger/purge", post(ledger::purge))
        .route("/api/v1/ledger/execute-checked", post(ledger::execute_checked))
        .route("/api/v1/ledger/rows/{id}", post(ledger::set_row))
        .route("/api/v1/ledger/rows/{id}/run", post(ledger::run))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .merge(manifests)
        // Every API route needs a valid token before its body is even read (an unknown caller
        // learns nothing from a 400 about its body); handlers get the `Caller` it found.
        .route_layer(axum::middleware::from_fn_with_state(app.clone(), require_token));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(api)
        .fallback(|| async { ApiError::not_found("no such route; the API lives under /api/v1/") })
        .with_state(app)
}

/// Authenticates once per request; handlers take the `Caller` from the request's extensions.
async fn require_token(
    State(app): State<App>,
    mut req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match crate::auth::authenticate(&app, req.headers()).await {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) => axum::response::IntoResponse::into_response(e),
    }
}

async fn readyz(State(app): State<App>) -> Result<&'static str, ApiError> {
    app.store().last_polls().await?;
    if let Some(problem) = app.store().problem() {
        return Err(pcmail_store::StoreError::Unavailable(problem).into());
    }
    Ok("ready")
}

/// Prometheus text format. Counts that live in the store are read here, at scrape time, from
/// the trigger-kept count table (never a scan of the mail tab).
async fn metrics(State(app): State<App>) -> Result<impl axum::response::IntoResponse, ApiError> {
    let counts = app.store().mail_counts().await?;
    let m = app.metrics();
    let by_state: Vec<_> = counts.iter().map(|c| (c.state, c.count)).collect();
    m.set_mail_counts(&by_state);
    let channel = app.runtime().intent_policy.channel.clone();
    let pending: u64 = counts
        .iter()
        .filter(|c| c.kind == "intent" && c.channel == channel && !c.state.is_terminal())
        .map(|c| c.count)
        .sum();
    m.intents_pending.with_label_values(&[&channel]).set(pending as i64);
    m.workqueue_depth.set(app.queue().depth() as i64);
    crate::ledger::refresh_metrics(&app).await?;
    crate::jobs::refresh_metrics(&app).await?;
    let body = m.encode().map_err(|e| ApiError::internal(format!("encoding metrics: {e}")))?;
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body))
}

/// Runs a mail change to completion even if the client goes away mid-request: its commit is
/// then always followed by its wake-ups and notices.
pub async fn detached<T: Send + 'static>(
    change: impl std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::spawn(change).await.map_err(|e| ApiError::internal(format!("request task failed: {e}")))?
}

/// A JSON body parsed strictly, with errors that name the problem: too large, not UTF-8,
/// malformed, or an unknown or missing field.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(format!("request body is larger than this route's limit ({e})"))
            } else {
                ApiError::bad_request(format!("cannot read request body: {e}"))
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ApiError::bad_request(format!("request body is not valid UTF-8 (first bad byte at offset {})", e.valid_up_to()))
    })?;
    serde_json::from_str(text).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}
