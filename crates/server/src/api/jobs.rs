//! Job routes: enqueue and list (any machine, its own jobs), claim/heartbeat/complete/fail
//! (the machines a WorkerPool names in `externalWorkers`, J7, T1, T2), retry and cancel (admin).

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use pcmail_core::api::{
    ClaimRequest, ClaimResponse, EnqueueAnswer, EnqueueBody, EnqueueResponse, JobList, LeaseReport,
};
use pcmail_core::duration::Dur;
use pcmail_core::jobs::{Job, Report, redact, slim};
use pcmail_core::page::MAX_PAGE;
use pcmail_store::{JobQuery, Store};
use serde::Deserialize;

use super::{JsonBody, detached};
use crate::app::App;
use crate::auth::Caller;
use crate::error::ServiceError;
use crate::jobs::{self, Origin};
use crate::ledger::settle;

/// One job or a list (P10): the answer has the body's shape.
pub async fn enqueue(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<EnqueueBody>,
) -> Result<Json<EnqueueAnswer>, ServiceError> {
    let origin = Origin::Caller(caller.machine().map(String::from));
    let one = matches!(body, EnqueueBody::One(_));
    let answers =
        detached(async move { jobs::enqueue_many(&app, body.into_jobs(), !one, origin, app.leadership().now()).await })
            .await?;
    // J6 may answer another machine's job: as that machine's, never its details (T2); in a
    // list, a holder comes slim whoever it belongs to.
    let mut answers: Vec<EnqueueResponse> = answers
        .into_iter()
        .map(|a| {
            let job = if one || a.created { redact(a.job, caller.actor()) } else { slim(a.job) };
            EnqueueResponse { job, ..a }
        })
        .collect();
    Ok(Json(match answers.pop() {
        Some(only) if one => EnqueueAnswer::One(Box::new(only)),
        last => EnqueueAnswer::Many(answers.into_iter().chain(last).collect()),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    queue: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    function: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    /// U3: the cursor, the last job of the page before.
    #[serde(default)]
    after: Option<String>,
}

/// T2: a machine lists the jobs it enqueued or claimed; the admin lists all.
pub async fn list(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<JobList>, ServiceError> {
    let q = q.map_err(|e| ServiceError::bad_request(e.body_text()))?.0;
    // Blank filters are "any", as on every listing.
    let given = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let (queue, state, function) = (given(q.queue), given(q.state), given(q.function));
    super::known_state::<pcmail_core::jobs::JobState>(state.as_deref())?;
    let query = JobQuery {
        queue,
        state,
        function,
        machine: caller.machine().map(String::from),
        limit: super::page_size(q.limit, 100, MAX_PAGE)?,
        after: q.after.filter(|a| !a.is_empty()),
    };
    let (jobs, more) = app.store().job_page(query).await?;
    let jobs: Vec<_> = jobs.into_iter().map(|j| redact(j, caller.actor())).collect();
    // T15: a page a slow reader holds is bounded; what it cuts is counted in `more` and the
    // cursor (the last job shown) reaches it.
    let (jobs, cut) = pcmail_core::page::within_bytes(jobs, pcmail_core::page::MAX_PAGE_BYTES, super::json_len);
    Ok(Json(JobList { jobs, more: more.saturating_add(cut) }))
}

/// The one answer that carries lease tokens (T1).
pub async fn claim(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ServiceError> {
    let claimed = {
        let app = app.clone();
        let caller = caller.clone();
        detached(async move {
            let who = (caller.actor(), req.owner.as_str());
            jobs::claim(&app, &req.queue, req.limit as usize, who, req.lease, app.leadership().now()).await
        })
        .await?
    };
    let rt = app.runtime();
    let functions = rt.functions.iter().filter(|(n, _)| claimed.iter().any(|j| j.function == *n)).cloned().collect();
    Ok(Json(ClaimResponse { jobs: claimed, functions }))
}

pub async fn report(
    State(app): State<App>,
    Path((id, action)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<LeaseReport>,
) -> Result<Json<Job>, ServiceError> {
    let report = match action.as_str() {
        "heartbeat" => Report::Heartbeat { lease: req.lease.unwrap_or(Dur::from_secs(60)) },
        "complete" => Report::Complete { result: req.result.unwrap_or_default() },
        "fail" => Report::Fail { error: req.error.unwrap_or_else(|| "the worker gave no error".into()) },
        "retry" | "cancel" => {
            caller.require_admin()?;
            let retry = action == "retry";
            let job = detached(async move { jobs::admin_move(&app, &id, retry, app.leadership().now()).await }).await?;
            return Ok(Json(redact(job, caller.actor())));
        }
        other => return Err(ServiceError::not_found(format!("no job action {other:?}"))),
    };
    let token = req.token;
    if token.is_empty() {
        return Err(ServiceError::bad_request("heartbeat, complete and fail need the lease token of the claim"));
    }
    let job = {
        let caller = caller.clone();
        detached(async move { settle::report(&app, &id, &token, caller.actor(), report, app.leadership().now()).await })
            .await?
    };
    Ok(Json(redact(job, caller.actor())))
}
