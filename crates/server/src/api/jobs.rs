//! Job routes: enqueue and list (any machine), claim/heartbeat/complete/fail (external
//! workers, J7), retry and cancel (admin).

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use pcmail_core::duration::Dur;
use pcmail_core::jobs::Job;
use pcmail_core::manifest::spec::FunctionSpec;
use pcmail_store::Store;
use serde::{Deserialize, Serialize};

use super::{ApiError, JsonBody, detached};
use crate::App;
use crate::auth::Caller;
use crate::jobs::{self, EnqueueRequest, EnqueueResponse, Report};

pub async fn enqueue(
    State(app): State<App>,
    JsonBody(req): JsonBody<EnqueueRequest>,
) -> Result<Json<EnqueueResponse>, ApiError> {
    Ok(Json(detached(async move { jobs::enqueue(&app, req, crate::now()).await }).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

pub async fn list(
    State(app): State<App>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Vec<Job>>, ApiError> {
    let q = q.map_err(|e| ApiError::bad_request(e.body_text()))?.0;
    if let Some(s) = &q.state {
        s.parse::<pcmail_core::jobs::JobState>().map_err(ApiError::bad_request)?;
    }
    let limit = q.limit.unwrap_or(100).min(1000);
    Ok(Json(app.store().list_jobs(q.queue.as_deref(), q.state.as_deref(), limit).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRequest {
    queue: String,
    #[serde(default = "one")]
    limit: usize,
    owner: String,
    #[serde(default = "minute")]
    lease: Dur,
}

fn one() -> usize {
    1
}

fn minute() -> Dur {
    Dur::from_secs(60)
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimResponse {
    jobs: Vec<Job>,
    /// The Functions the claimed jobs name, so an external worker can run them.
    functions: std::collections::BTreeMap<String, FunctionSpec>,
}

pub async fn claim(
    State(app): State<App>,
    JsonBody(req): JsonBody<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    let claimed = {
        let app = app.clone();
        detached(async move { jobs::claim(&app, &req.queue, req.limit, &req.owner, req.lease, crate::now()).await })
            .await?
    };
    let rt = app.runtime();
    let functions = rt.functions.iter().filter(|(n, _)| claimed.iter().any(|j| j.function == *n)).cloned().collect();
    Ok(Json(ClaimResponse { jobs: claimed, functions }))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseReport {
    /// The lease token from the claim; required for heartbeat, complete and fail.
    #[serde(default)]
    token: String,
    #[serde(default)]
    lease: Option<Dur>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

pub async fn report(
    State(app): State<App>,
    Path((id, action)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<LeaseReport>,
) -> Result<Json<Job>, ApiError> {
    let report = match action.as_str() {
        "heartbeat" => Report::Heartbeat { lease: req.lease.unwrap_or_else(minute) },
        "complete" => Report::Complete { result: req.result.unwrap_or_default() },
        "fail" => Report::Fail { error: req.error.unwrap_or_else(|| "failed".into()) },
        "retry" | "cancel" => {
            caller.require_admin()?;
            let retry = action == "retry";
            return Ok(Json(detached(async move { jobs::admin_move(&app, &id, retry, crate::now()).await }).await?));
        }
        other => return Err(ApiError::not_found(format!("no job action {other:?}"))),
    };
    let token = req.token;
    if token.is_empty() {
        return Err(ApiError::bad_request("heartbeat, complete and fail need the lease token of the claim"));
    }
    Ok(Json(detached(async move { jobs::report(&app, &id, &token, report, crate::now()).await }).await?))
}
