//! Ledger routes: list, view, push (any machine); set-row, run, sync, purge, execute-checked
//! (admin).

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use pcmail_core::api::{
    Kept, LedgerView, MergeCounts, ProjectBody, PurgeReport, PurgeRequest, PushRequest, RowEdit, RunRequest, SyncReport,
};
use pcmail_core::ledger::{Row, Trigger};
use pcmail_core::manifest::spec::ScheduleRole;
use pcmail_store::Store;
use serde::Deserialize;

use super::{JsonBody, detached};
use crate::app::App;
use crate::auth::Caller;
use crate::error::ServiceError;
use crate::ledger::{self, resolve_project};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectQuery {
    #[serde(default)]
    project: Option<String>,
}

pub async fn list(
    State(app): State<App>,
    q: Result<Query<ProjectQuery>, QueryRejection>,
) -> Result<Json<Vec<Row>>, ServiceError> {
    let q = q.map_err(|e| ServiceError::bad_request(e.body_text()))?.0;
    let project = resolve_project(&app, q.project.as_deref())?;
    Ok(Json(app.store().ledger_rows(Some(&project)).await?))
}

pub async fn view(State(app): State<App>) -> Result<Json<LedgerView>, ServiceError> {
    let today = crate::clock::now().format("%Y-%m-%d").to_string();
    Ok(Json(LedgerView { view: ledger::view(&app, &today).await? }))
}

/// L7 push: any machine may add tasks; the answer is `{added, updated, skipped}`.
pub async fn push(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<PushRequest>,
) -> Result<Json<MergeCounts>, ServiceError> {
    let project = resolve_project(&app, req.project.as_deref())?;
    if let Some(bad) = req.items.iter().find(|i| i.source.trim().is_empty() || i.task.trim().is_empty()) {
        return Err(ServiceError::bad_request(format!("every item needs a source and a task (got {bad:?})")));
    }
    let actor = caller.machine().unwrap_or("admin").to_string();
    Ok(Json(
        detached(async move { Ok(ledger::merge(&app, &project, req.items, &actor, crate::clock::now()).await?) })
            .await?,
    ))
}

pub async fn set_row(
    State(app): State<App>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    JsonBody(edit): JsonBody<RowEdit>,
) -> Result<Json<Row>, ServiceError> {
    caller.require_admin()?;
    let project = resolve_project(&app, edit.project.as_deref())?;
    Ok(Json(detached(async move { ledger::set_row(&app, &project, &id, edit, crate::clock::now()).await }).await?))
}

pub async fn run(
    State(app): State<App>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<RunRequest>,
) -> Result<Json<Row>, ServiceError> {
    caller.require_admin()?;
    let project = resolve_project(&app, req.project.as_deref())?;
    if let Some(handed) = ledger::handoff_if_heavy(&app, &project, &id, Trigger::Manual, crate::clock::now()).await? {
        return Ok(Json(handed));
    }
    let claimed = ledger::claim_row(&app, &project, &id, Trigger::Manual, crate::clock::now()).await?;
    // The run belongs to the controller, not to this request: it finishes whatever the client does.
    let running = tokio::spawn({
        let (app, claimed) = (app.clone(), claimed.clone());
        async move { ledger::finish_row(&app, claimed).await }
    });
    if !req.wait {
        return Ok(Json(claimed));
    }
    Ok(Json(running.await.map_err(|e| ServiceError::internal(format!("run task failed: {e}")))??))
}

pub async fn sync(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(q): JsonBody<ProjectBody>,
) -> Result<Json<SyncReport>, ServiceError> {
    caller.require_admin()?;
    let project = resolve_project(&app, q.project.as_deref())?;
    let spec = app.runtime().ledgers.iter().find(|l| l.project == project).cloned();
    let spec = spec.ok_or_else(|| ServiceError::not_found(format!("no Ledger for {project}")))?;
    let report = detached(async move { Ok(ledger::sync_project(&app, &spec, crate::clock::now()).await?) }).await?;
    Ok(Json(report))
}

pub async fn purge(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<PurgeRequest>,
) -> Result<Json<PurgeReport>, ServiceError> {
    caller.require_admin()?;
    let project = resolve_project(&app, req.project.as_deref())?;
    let (source, yes) = (req.source.clone(), req.yes);
    let plan =
        detached(async move { Ok(ledger::purge(&app, &project, &source, yes, crate::clock::now()).await?) }).await?;
    let kept = plan.kept.into_iter().map(|(id, reason)| Kept { id, reason }).collect();
    Ok(Json(PurgeReport { dry_run: !req.yes, delete: plan.delete, kept }))
}

/// One execute-checked pass now, as its schedule would run it.
pub async fn execute_checked(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Vec<Row>>, ServiceError> {
    caller.require_admin()?;
    let limit = app.runtime().max_per_run(ScheduleRole::ExecuteChecked).unwrap_or(usize::MAX);
    let ran =
        detached(async move { Ok(ledger::execute_pass(&app, Trigger::Manual, limit, crate::clock::now()).await?) })
            .await?;
    Ok(Json(ran))
}
