//! Ledger routes: list, view, push (any machine); set-row, run, sync, purge, execute-checked
//! (admin).

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use pcmail_core::api::{
    Kept, LedgerView, MergeCounts, ProjectBody, PurgeReport, PurgeRequest, PushRequest, RowEdit, RunRequest, SyncReport,
};
use pcmail_core::ledger::{Row, RowState, Trigger, push};
use pcmail_core::manifest::spec::ScheduleRole;
use pcmail_core::page::{Listing, MAX_PAGE};
use pcmail_store::Store;
use serde::Deserialize;

use super::{JsonBody, detached};
use crate::app::App;
use crate::auth::Caller;
use crate::error::ServiceError;
use crate::ledger::{self, resolve_project};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(default)]
    project: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    function: Option<String>,
    /// The assignee.
    #[serde(default)]
    machine: Option<String>,
    /// Absent: every row (what this route always answered).
    #[serde(default)]
    limit: Option<usize>,
    /// U3: the cursor, the id of the last row of the page before.
    #[serde(default)]
    after: Option<String>,
}

/// One project's rows in id order, narrowed by U3's filters; how many more match is the
/// `x-pcmail-more` header.
pub async fn list(
    State(app): State<App>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<impl axum::response::IntoResponse, ServiceError> {
    let q = q.map_err(|e| ServiceError::bad_request(e.body_text()))?.0;
    let project = resolve_project(&app, q.project.as_deref().filter(|p| !p.trim().is_empty()))?;
    let mut listing =
        Listing { state: q.state, function: q.function, machine: q.machine, after: q.after, ..Default::default() }
            .normalized();
    super::known_state::<RowState>(listing.state.as_deref())?;
    let limit = match q.limit {
        Some(n) => super::page_size(Some(n), n, MAX_PAGE)?,
        None => usize::MAX,
    };
    // The API's cursor is the row's id: its project is the listing's.
    let after = listing.after.take().map(|id| format!("{project}/{id}"));
    let listing = Listing { project: Some(project), after, ..listing };
    let (rows, more) = app.store().ledger_page(listing, limit).await?;
    Ok(super::with_more(rows, more))
}

pub async fn view(State(app): State<App>) -> Result<Json<LedgerView>, ServiceError> {
    let today = crate::clock::now().format("%Y-%m-%d").to_string();
    let lines = ledger::view(&app, &today).await?;
    Ok(Json(LedgerView { view: pcmail_core::ledger::render_view(&lines) }))
}

/// L7 push: any machine may add tasks, to its own source or those granted to it (T11); the
/// answer is `{added, updated, skipped}`. A machine's item without a source is its own.
pub async fn push(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(mut req): JsonBody<PushRequest>,
) -> Result<Json<MergeCounts>, ServiceError> {
    let project = resolve_project(&app, req.project.as_deref())?;
    push::default_sources(&caller.principal, &mut req.items);
    if let Some(bad) = req.items.iter().find(|i| i.source.trim().is_empty() || i.task.trim().is_empty()) {
        return Err(ServiceError::bad_request(format!("every item needs a source and a task (got {bad:?})")));
    }
    let ledger = app.runtime().ledgers.iter().find(|l| l.project == project).cloned();
    for item in &req.items {
        push::may_push(&caller.principal, &item.source, ledger.as_ref())
            .map_err(|e| ServiceError::forbidden(e.to_string()))?;
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
