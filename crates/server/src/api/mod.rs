//! The HTTP API under `/api/v1/`, plus `/healthz` and `/readyz`. Handlers are thin: parse and
//! authenticate here, then call the shell modules (`mailbox`, `specs`).

mod error;
#[cfg(test)]
mod fuzz;
mod jobs;
mod ledger;
mod mail;
mod openapi;
mod search;
mod specs;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::StatusCode;
use axum::routing::get;
use pcmail_core::api::Validate;
use pcmail_store::Store;
use serde::de::DeserializeOwned;

use crate::error::ServiceError;

use crate::app::App;

/// Requests are small JSON documents; manifests get more room on their own routes.
pub const BODY_LIMIT: usize = 256 * 1024;
pub const MANIFEST_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Declares API routes once: the router is built from the list and `ROUTES` names every
/// (method, path) of it, which the OpenAPI description is checked against.
macro_rules! routes {
    ($table:ident, $build:ident: $( $path:literal => $( $method:ident $handler:path ),+ ; )*) => {
        #[cfg(test)]
        const $table: &[(&str, &str)] = &[ $( $( (stringify!($method), $path), )+ )* ];
        fn $build() -> Router<App> {
            Router::new() $( .route($path, axum::routing::MethodRouter::new() $( .$method($handler) )+ ) )*
        }
    };
}

routes!(MANIFEST_ROUTES, manifest_routes:
    "/api/v1/apply" => post specs::apply;
    "/api/v1/diff" => post specs::diff;
);

routes!(ROUTES, api_routes:
    "/api/v1/alerts" => get specs::alerts;
    "/api/v1/whoami" => get mail::whoami;
    "/api/v1/machines" => get specs::machines;
    "/api/v1/specs" => get specs::list;
    "/api/v1/specs/{kind}/{name}" => get specs::get_one, delete specs::delete;
    "/api/v1/tokens" => post specs::issue_token;
    "/api/v1/mail" => post mail::send, get mail::list;
    "/api/v1/mail/{id}" => get mail::status;
    "/api/v1/mail/{id}/{step}" => post mail::step;
    "/api/v1/poll" => get mail::poll;
    "/api/v1/intents" => post mail::record_intent;
    "/api/v1/intents/poller" => post mail::poller_report;
    "/api/v1/policy" => get mail::policy;
    "/api/v1/refusals" => post mail::refused;
    "/api/v1/jobs" => post jobs::enqueue, get jobs::list;
    "/api/v1/jobs/claim" => post jobs::claim;
    "/api/v1/jobs/{id}/{action}" => post jobs::report;
    "/api/v1/search" => get search::search;
    "/api/v1/ledger" => get ledger::list;
    "/api/v1/ledger/view" => get ledger::view;
    "/api/v1/ledger/push" => post ledger::push;
    "/api/v1/ledger/sync" => post ledger::sync;
    "/api/v1/ledger/purge" => post ledger::purge;
    "/api/v1/ledger/execute-checked" => post ledger::execute_checked;
    "/api/v1/ledger/rows/{id}" => post ledger::set_row;
    "/api/v1/ledger/rows/{id}/run" => post ledger::run;
);

/// Every route of the API, behind the token check where it needs one.
pub fn routes(app: App) -> Router<App> {
    let manifests = manifest_routes().layer(DefaultBodyLimit::max(MANIFEST_BODY_LIMIT));
    let api = api_routes()
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .merge(manifests)
        // V2, then the token: one layer, as each costs every request a clone of the routes
        // behind it (P10).
        .route_layer(axum::middleware::from_fn_with_state(app, gate));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        // V1: asked before a client knows whether its token is good, so it needs none.
        .route(
            "/api/v1/version",
            get(|| async {
                axum::Json(pcmail_core::api::VersionInfo {
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    api_level: pcmail_core::api::API_LEVEL,
                })
            }),
        )
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([(axum::http::header::CONTENT_TYPE, "application/json")], openapi::document()) }),
        )
        .merge(api)
}

/// What every API route asks first: a client outside the window hears so before anything else,
/// its token included (V2); then every route needs a valid token before its body is even read
/// (an unknown caller learns nothing from a 400 about its body), and handlers get the `Caller`
/// it found.
async fn gate(app: State<App>, req: Request, next: axum::middleware::Next) -> axum::response::Response {
    match outside_window(&req) {
        Some(refused) => refused,
        None => require_token(app, req, next).await,
    }
}

/// V2: a pcmail-ctl older than the previous minor release is refused (426, one sentence with
/// both versions, code `bad_request` so that clients of every release print it). A request
/// without our User-Agent (curl, a script) is served: only a client that says what it is can be
/// judged.
fn outside_window(req: &Request) -> Option<axum::response::Response> {
    use axum::response::IntoResponse;
    use pcmail_core::version::{Release, client_release, client_too_old, serves};
    let client = req.headers().get(axum::http::header::USER_AGENT).and_then(|v| client_release(v.to_str().ok()?))?;
    if serves(Release::this(), client) {
        return None;
    }
    let mut answer = ServiceError::bad_request(client_too_old(Release::this(), client)).into_response();
    *answer.status_mut() = StatusCode::UPGRADE_REQUIRED;
    Some(answer)
}

/// Authenticates once per request; handlers take the `Caller` from the request's extensions.
/// T18: every wrong token is counted; an address that keeps presenting them is slowed like a
/// console sign-in (429 with `Retry-After` in place of 401) and logged only while it is not,
/// so the log grows by a few lines a minute per address. A valid token always passes: five
/// wrong ones from an address that many machines share (a NAT, a proxy) must not throttle
/// them all.
async fn require_token(
    State(app): State<App>,
    mut req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let presented = req.headers().contains_key(axum::http::header::AUTHORIZATION);
    match crate::auth::authenticate(&app, req.headers()).await {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(e) if presented && e.failure() == crate::error::Failure::Unauthorized => {
            let client = req
                .extensions()
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map_or_else(|| "unknown".to_string(), |a| a.0.ip().to_string());
            let now = crate::clock::now();
            app.metrics().surface.auth_failed(crate::metrics::Surface::Api);
            if let Err(wait) = app.access().failures().attempt(&client, now) {
                let e = ServiceError::unauthorized(format!(
                    "too many wrong tokens from this address; try again in {wait} s (T18)"
                ));
                let mut answer = e.into_response();
                *answer.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                if let Ok(v) = axum::http::HeaderValue::from_str(&wait.to_string()) {
                    answer.headers_mut().insert(axum::http::header::RETRY_AFTER, v);
                }
                return answer;
            }
            app.access().failures().failed(&client, now);
            tracing::warn!(%client, path = %req.uri().path(), "API request with a token that is not recognized");
            e.into_response()
        }
        Err(e) => e.into_response(),
    }
}

/// Ready when the store answers reads and takes writes. E15: a store refusing writes for
/// space is named from memory (the read would succeed).
async fn readyz(State(app): State<App>) -> Result<&'static str, ServiceError> {
    if let Some(refusal) = app.store().health().refusing() {
        return Err(ServiceError::unavailable(pcmail_core::health::unwritable(&refusal)));
    }
    app.store().last_polls().await?;
    if let Some(problem) = app.store().problem() {
        return Err(pcmail_store::StoreError::Unavailable(problem).into());
    }
    Ok("ready")
}

/// Prometheus text format. Counts that live in the store are read here, at scrape time, from
/// the trigger-kept count table (never a scan of the mail tab).
/// E18: answered from memory when the store is down — the store-read gauges keep their last
/// value and `pcmail_store_read_failed` says so — so a scrape never turns an outage into a
/// missing target.
async fn metrics(State(app): State<App>) -> Result<impl axum::response::IntoResponse, ServiceError> {
    let m = app.metrics();
    let read = refresh_store_metrics(&app).await;
    if let Err(e) = &read {
        tracing::debug!(error = %e, "/metrics answers from memory: the store could not be read");
    }
    m.store.set_read_failed(read.is_err());
    m.store.set_health(app.store().health());
    m.control.set_queue_depth(app.queue().depth());
    let body = m.encode().map_err(|e| ServiceError::internal(format!("encoding metrics: {e}")))?;
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], body))
}

/// The gauges read from the store at scrape time, from the trigger-kept counts.
async fn refresh_store_metrics(app: &App) -> Result<(), ServiceError> {
    let counts = app.store().mail_counts().await?;
    let m = app.metrics();
    let by_state: Vec<_> = counts.iter().map(|c| (c.state, c.count)).collect();
    m.mail.set_counts(&by_state);
    let channel = app.runtime().intent_policy.channel.clone();
    let pending: u64 = counts
        .iter()
        .filter(|c| c.kind.is_intent() && c.channel == channel && !c.state.is_terminal())
        .map(|c| c.count)
        .sum();
    m.machines.set_intents_pending(&channel, pending);
    crate::ledger::refresh_metrics(app).await?;
    crate::jobs::refresh_metrics(app).await?;
    Ok(())
}

/// U3/T5: a listing's page size, 1 to `max`, `default` when absent.
pub fn page_size(n: Option<usize>, default: usize, max: usize) -> Result<usize, ServiceError> {
    Ok(pcmail_core::bounds::count("limit", n.unwrap_or(default) as u64, 1, max as u64)? as usize)
}

/// A page of a listing that answers a JSON array (the shape older clients parse); how many
/// items follow it goes in [`MORE_HEADER`](pcmail_core::page::MORE_HEADER). T15: the array
/// is cut before the item that would pass [`MAX_PAGE_BYTES`](pcmail_core::page::MAX_PAGE_BYTES)
/// and the items cut are counted in `more`, so the client's cursor (the last item it got)
/// reaches them on the next page, and an answer a client never reads holds little.
/// What one item of a listing costs on the wire (T15's page budget), with its comma.
pub(crate) fn json_len<T: serde::Serialize>(item: &T) -> usize {
    serde_json::to_vec(item).map_or(0, |v| v.len() + 1)
}

pub fn with_more<T: serde::Serialize>(items: Vec<T>, more: u64) -> axum::response::Response {
    use axum::response::IntoResponse;
    let budget = pcmail_core::page::MAX_PAGE_BYTES;
    let mut body = Vec::with_capacity(budget.min(64 * 1024));
    body.push(b'[');
    let mut shown = 0;
    for item in &items {
        let json = match serde_json::to_vec(item) {
            Ok(json) => json,
            Err(e) => return ServiceError::internal(format!("cannot write a listing: {e}")).into_response(),
        };
        if !pcmail_core::page::fits(body.len(), json.len() + 2, shown, budget) {
            break;
        }
        if shown > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&json);
        shown += 1;
    }
    body.push(b']');
    let more = more.saturating_add((items.len() - shown) as u64);
    let headers = [
        (axum::http::header::CONTENT_TYPE, "application/json".to_string()),
        (axum::http::HeaderName::from_static(pcmail_core::page::MORE_HEADER), more.to_string()),
    ];
    (headers, body).into_response()
}

/// A listing's filters must name values that exist: a state that is not one is a 400 naming it,
/// never an empty page that looks like "nothing there".
pub fn known_state<S: std::str::FromStr<Err = pcmail_core::names::UnknownName>>(
    state: Option<&str>,
) -> Result<(), ServiceError> {
    match state {
        Some(s) => s.parse::<S>().map(drop).map_err(|e| ServiceError::bad_request(e.to_string())),
        None => Ok(()),
    }
}

/// Runs a change to completion even if the client goes away mid-request: its commit is then
/// always followed by its wake-ups and notices. It is first polled here, and a change that is
/// done at once (a brief write on a free writer) needs no task of its own (P10); one that
/// waits is moved, as it is, into a task before this request could be dropped.
pub async fn detached<T: Send + 'static>(
    change: impl std::future::Future<Output = Result<T, ServiceError>> + Send + 'static,
) -> Result<T, ServiceError> {
    let mut change = Box::pin(change);
    if let std::task::Poll::Ready(done) =
        std::future::poll_fn(|cx| std::task::Poll::Ready(change.as_mut().poll(cx))).await
    {
        return done;
    }
    tokio::spawn(change).await.map_err(|e| ServiceError::internal(format!("request task failed: {e}")))?
}

/// A JSON body parsed strictly, with errors that name the problem: too large, not UTF-8,
/// malformed, an unknown or missing field, or a value out of its range (T5, T6): every body
/// passes here, so no route can forget a check its body type declares.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Validate, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ServiceError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ServiceError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ServiceError::too_large(format!("request body is larger than this route's limit ({e})"))
            } else {
                ServiceError::bad_request(format!("cannot read request body: {e}"))
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

pub fn parse_json<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ServiceError> {
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ServiceError::bad_request(format!(
            "request body is not valid UTF-8 (first bad byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    // P10: a body is parsed once, without tracking its path; only a refused one is parsed
    // again to say where it failed.
    let value: T = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(_) => return Err(refusal_at::<T>(text)),
    };
    value.validate()?;
    Ok(value)
}

/// Why `text` is not a `T`, naming the field where it failed (T5).
fn refusal_at<T: DeserializeOwned>(text: &str) -> ServiceError {
    let mut json = serde_json::Deserializer::from_str(text);
    if let Err(e) = serde_path_to_error::deserialize::<_, T>(&mut json) {
        let at = e.path().to_string();
        let inner = e.into_inner();
        // T5: a number too large for its field is a syntax error to serde_json, but the path
        // still says which field it was.
        let out_of_range = inner.to_string().starts_with("number out of range");
        return if at == "." || inner.is_eof() || (inner.is_syntax() && !out_of_range) {
            ServiceError::bad_request(format!("invalid JSON body: {inner}"))
        } else {
            ServiceError::bad_request(format!("invalid JSON body at {at}: {inner}"))
        };
    }
    // One JSON value per body: what follows it (a second job of a JSON-lines file) would be
    // dropped without a word.
    match json.end() {
        Err(e) => ServiceError::bad_request(format!("invalid JSON body: {e} after the first JSON value")),
        Ok(()) => ServiceError::bad_request("invalid JSON body"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn described() -> serde_json::Value {
        serde_json::from_str(openapi::document()).expect("openapi.json is JSON")
    }

    #[tokio::test]
    async fn p10_a_change_done_at_once_is_answered_in_its_request_and_one_that_waits_finishes_though_the_request_is_dropped()
     {
        // The test's own body is no task: a change moved into one would see an id.
        let ran_in = detached(async { Ok(tokio::task::try_id()) }).await.expect("answered");
        assert_eq!(ran_in, None, "a change done at its first poll needs no task of its own");

        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let (finished, heard) = tokio::sync::oneshot::channel();
        let mut request = Box::pin(detached(async move {
            let _ = wait.await;
            let _ = finished.send(tokio::task::try_id());
            Ok(())
        }));
        let pending = std::future::poll_fn(|cx| std::task::Poll::Ready(request.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "the change waits for its go");
        drop(request);
        go.send(()).expect("the change is still there to hear it");
        let task = heard.await.expect("the change finished after its request was dropped");
        assert!(task.is_some(), "it finished in a task of its own");
    }

    #[test]
    fn t5_a_number_too_large_for_its_field_names_the_field() {
        let huge = "9".repeat(5000);
        let claim = format!(r#"{{"queue": "q", "owner": "w", "limit": {huge}}}"#);
        let e = parse_json::<pcmail_core::api::ClaimRequest>(claim.as_bytes()).expect_err("refused");
        assert!(e.to_string().contains("at limit: number out of range"), "{e}");
        let job = format!(r#"{{"queue": "q", "function": "f", "maxAttempts": {huge}}}"#);
        let e = parse_json::<pcmail_core::api::EnqueueRequest>(job.as_bytes()).expect_err("refused");
        assert!(e.to_string().contains("at maxAttempts:"), "{e}");
        let broken = parse_json::<pcmail_core::api::EnqueueRequest>(br#"{"queue": "q",,}"#).expect_err("refused");
        assert!(broken.to_string().starts_with("invalid JSON body: "), "{broken}");
    }

    #[test]
    fn c4_openapi_describes_exactly_the_routes_the_router_serves() {
        let doc = described();
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
        let served: BTreeSet<(String, String)> =
            ROUTES.iter().chain(MANIFEST_ROUTES).map(|(m, p)| (m.to_uppercase(), p.to_string())).collect();
        assert_eq!(documented, served, "openapi.json and the router disagree");
    }

    #[test]
    fn c4_openapi_names_every_path_parameter_and_resolves_every_schema() {
        let doc = described();
        assert_eq!(doc["openapi"], "3.1.0");
        for (path, item) in doc["paths"].as_object().expect("paths") {
            let in_path: BTreeSet<&str> =
                path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}')).collect();
            for (method, op) in item.as_object().expect("item") {
                let declared: BTreeSet<&str> = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["in"] == "path")
                    .filter_map(|p| p["name"].as_str())
                    .collect();
                assert_eq!(declared, in_path, "{method} {path}");
                assert!(op["operationId"].is_string() && op["responses"]["default"].is_object(), "{method} {path}");
            }
        }
        let references: Vec<&str> = openapi::document()
            .split("\"$ref\": \"#/components/schemas/")
            .skip(1)
            .map(|r| r.split('"').next().unwrap_or_default())
            .collect();
        assert!(references.len() >= 20, "the request and response bodies are described");
        for name in references {
            assert!(doc["components"]["schemas"][name].is_object(), "schema {name} is referenced but missing");
        }
    }
}
