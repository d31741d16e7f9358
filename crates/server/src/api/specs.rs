//! Spec routes (apply, diff, get, delete) and token issue: admin only (C3).

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use pcmail_core::alert::AlertState;
use pcmail_core::api::{ApplyRequest, ApplyResult, TokenRequest, TokenResponse};
use pcmail_core::ids::sha256_hex;
use pcmail_core::manifest::Kind;
use pcmail_core::page::{Listing, MAX_PAGE};
use pcmail_core::roster;
use pcmail_store::Store;
use serde::Deserialize;
use serde_json::Value;

use super::JsonBody;
use crate::app::App;
use crate::auth::{Caller, new_token};
use crate::error::ServiceError;

fn kind(s: &str) -> Result<Kind, ServiceError> {
    Kind::parse_cli(s).map_err(|e| ServiceError::not_found(e.to_string()))
}

pub async fn apply(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ApplyRequest>,
) -> Result<Json<Vec<ApplyResult>>, ServiceError> {
    caller.require_admin()?;
    Ok(Json(crate::specs::apply(&app, req.files, req.dry_run, crate::clock::now()).await?))
}

/// `apply` forced to a dry run: the diff path is the apply path.
pub async fn diff(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ApplyRequest>,
) -> Result<Json<Vec<ApplyResult>>, ServiceError> {
    apply(State(app), Extension(caller), JsonBody(ApplyRequest { dry_run: true, ..req })).await
}

/// Every object as Kubernetes-shaped JSON, with its recent events for `describe`.
pub async fn list(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<Value>>, ServiceError> {
    caller.require_admin()?;
    let specs = app.store().list_specs().await?;
    Ok(Json(specs.iter().map(|r| r.to_object()).collect()))
}

pub async fn get_one(
    State(app): State<App>,
    Path((k, name)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ServiceError> {
    caller.require_admin()?;
    let k = kind(&k)?;
    let specs = app.store().list_specs().await?;
    let record = specs
        .iter()
        .find(|r| r.kind == k && r.name == name)
        .ok_or_else(|| ServiceError::not_found(format!("{}/{name} not found", k.lower())))?;
    let events = app.store().events_for(&format!("{}/{name}", k.lower())).await?;
    let mut object = record.to_object();
    object["events"] = serde_json::to_value(events).unwrap_or_default();
    Ok(Json(object))
}

pub async fn delete(
    State(app): State<App>,
    Path((k, name)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ServiceError> {
    caller.require_admin()?;
    let k = kind(&k)?;
    crate::specs::delete(&app, k, &name, crate::clock::now()).await?;
    Ok(Json(serde_json::json!({"kind": k.lower(), "name": name, "outcome": "deleted"})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertQuery {
    #[serde(default)]
    state: Option<String>,
    /// Alerts whose labels name this machine.
    #[serde(default)]
    machine: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    /// U3: the cursor, `kind/subject` of the last alert of the page before.
    #[serde(default)]
    after: Option<String>,
}

/// V1: each machine's last poll and client version; any caller (labels and versions are no
/// secret between the machines of one roster).
pub async fn machines(State(app): State<App>) -> Result<Json<Vec<pcmail_core::api::MachineSeen>>, ServiceError> {
    Ok(Json(app.store().machines_seen().await?))
}

/// The alerts tab, most recently changed first (admin); how many more match is the
/// `x-pcmail-more` header.
pub async fn alerts(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<AlertQuery>, QueryRejection>,
) -> Result<impl axum::response::IntoResponse, ServiceError> {
    caller.require_admin()?;
    let q = q.map_err(|e| ServiceError::bad_request(e.body_text()))?.0;
    let mut listing = Listing { state: q.state, machine: q.machine, after: q.after, ..Default::default() }.normalized();
    listing.machine = listing.machine.map(|m| app.runtime().machine_label(&m));
    super::known_state::<AlertState>(listing.state.as_deref())?;
    let limit = super::page_size(q.limit, 500, MAX_PAGE)?;
    let (alerts, more) = app.store().alert_page(listing, limit).await?;
    Ok(super::with_more(alerts, more))
}

/// C2: a machine token is shown once and stored only as its hash; issuing again replaces it.
pub async fn issue_token(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<TokenRequest>,
) -> Result<Json<TokenResponse>, ServiceError> {
    caller.require_admin()?;
    let rt = app.runtime();
    let machine = roster::resolve(rt.roster.as_ref(), &req.machine).map_err(ServiceError::from_resolve)?;
    let token = new_token("pcm_").map_err(|e| ServiceError::internal(format!("no randomness: {e}")))?;
    app.store().put_token(&machine, &sha256_hex(&token), crate::clock::now()).await?;
    Ok(Json(TokenResponse { machine, token }))
}
