//! The shell of the ledger rules: pull and push (L7), run one row (L8–L13), the schedule
//! passes (L14), set-row and purge (L16). Each change is one store transaction around a
//! planner of `pcmail_core::ledger`; a function runs between its claim and its result.

use pcmail_core::Ts;
use pcmail_core::api::{Event, MergeCounts, SyncReport};
use pcmail_core::jobs::LEDGER_UNIQUE_PREFIX;
use pcmail_core::ledger::source::{Item, SourceError, format_of, parse_items};
use pcmail_core::ledger::{
    Incoming, PurgePlan, Row, RowState, Trigger, ViewLine, ViewProject, aggregate, build_prompt, hands_off,
    heavy_queue, ledger_ref, merge_plan, plan_claim, plan_edit, plan_handoff, plan_purge, plan_result, plan_skip,
    plan_stale, runs_in_pass, sync_order, view_lines,
};
use pcmail_core::manifest::spec::{LedgerSource, LedgerSpec};
use pcmail_core::trail::{ObjectRef, Reason};
use pcmail_store::{LedgerSelect, LedgerWrites, Store, StoreError};

use crate::app::App;
use crate::error::ServiceError;
use crate::metrics::RunOutcome;

pub mod settle;

fn event(project: &str, id: &str, reason: Reason, message: String, actor: &str, now: Ts) -> Event {
    Event { at: now, object: ObjectRef::ledger_row(project, id), reason, message, actor: actor.into() }
}

/// The project a request means: the one named (it must have a Ledger), or the only one.
pub fn resolve_project(app: &App, project: Option<&str>) -> Result<String, ServiceError> {
    let rt = app.runtime();
    let known: Vec<&str> = rt.ledgers.iter().map(|l| l.project.as_str()).collect();
    match project {
        Some(p) if known.contains(&p) => Ok(p.to_string()),
        Some(p) => Err(ServiceError::not_found(format!("no Ledger for project {p:?}; known: {}", known.join(", ")))),
        None => match known.as_slice() {
            [only] => Ok(only.to_string()),
            [] => Err(ServiceError::bad_request("no Ledger is applied; apply one with `pcmail-ctl apply -f`")),
            many => Err(ServiceError::bad_request(format!("several projects: pass --project ({})", many.join(", ")))),
        },
    }
}

/// L5/L7: merges items into a project in one transaction.
pub async fn merge(
    app: &App,
    project: &str,
    items: Vec<Incoming>,
    actor: &str,
    now: Ts,
) -> Result<MergeCounts, StoreError> {
    let (project_owned, actor) = (project.to_string(), actor.to_string());
    app.store()
        .ledger_transaction(project, LedgerSelect::All, move |state| {
            let plan = merge_plan(&project_owned, &state.rows, &items, state.next_seq);
            let counts = MergeCounts { added: plan.add.len(), updated: plan.update.len(), skipped: plan.skipped };
            // T11: every row change is an event naming its actor, so a row's history shows who
            // changed what.
            let added = plan.add.iter().map(|r| {
                event(&project_owned, &r.id, Reason::Added, format!("from {}: {}", r.source, r.task), &actor, now)
            });
            let updated =
                plan.update.iter().map(|p| event(&project_owned, &p.id, Reason::Updated, p.describe(), &actor, now));
            let events = added.chain(updated).collect();
            let writes = LedgerWrites {
                add: plan.add,
                patch: plan.update,
                next_seq: Some(plan.next_seq),
                events,
                ..LedgerWrites::default()
            };
            (writes, counts)
        })
        .await
}

/// Why a source gave no items this sync; the report shows it after the source's name.
#[derive(Debug, thiserror::Error)]
enum PullError {
    #[error("{file}: {error}")]
    Read { file: String, error: std::io::Error },
    #[error(transparent)]
    Command(#[from] crate::exec::SourceCommandError),
    #[error("neither file nor command")]
    NoInput,
    #[error(transparent)]
    Parse(#[from] SourceError),
}

/// L7 pull: reads one source into items (a file, or a command's JSON lines).
async fn pull(source: &LedgerSource) -> Result<Vec<Incoming>, PullError> {
    let text = match (&source.file, &source.command) {
        (Some(file), _) => {
            tokio::fs::read_to_string(file).await.map_err(|error| PullError::Read { file: file.clone(), error })?
        }
        // E17: run as a Function is (cleared environment, its own session, output capped).
        (None, Some(argv)) => crate::exec::run_source(argv).await?,
        (None, None) => return Err(PullError::NoInput),
    };
    let items: Vec<Item> = parse_items(format_of(source), &text)?;
    Ok(match &source.aggregate {
        // L6: one row for the whole source, its count refreshed each sync.
        Some(agg) => vec![aggregate(&source.name, &agg.title, items.len(), source.file.as_deref().unwrap_or(""))],
        None => items.into_iter().map(|i| i.into_incoming(&source.name)).collect(),
    })
}

/// L7 pull for one project: every source read, all merged in one transaction.
pub async fn sync_project(app: &App, ledger: &LedgerSpec, now: Ts) -> Result<SyncReport, StoreError> {
    let mut items = Vec::new();
    let mut errors = Vec::new();
    for source in &ledger.sources {
        match pull(source).await {
            Ok(found) => items.extend(found),
            Err(e) => errors.push(format!("source {}: {e}", source.name)),
        }
    }
    let counts = merge(app, &ledger.project, items, "sync", now).await?;
    Ok(SyncReport { project: ledger.project.clone(), counts, errors })
}

/// L14 sync: projects round-robin from a stored cursor, at most `cap` a pass; how many were
/// left is reported, never dropped silently.
pub async fn sync_pass(app: &App, cap: Option<usize>, now: Ts) -> Result<(Vec<SyncReport>, usize), StoreError> {
    let ledgers = app.runtime().ledgers.clone();
    if ledgers.is_empty() {
        return Ok((vec![], 0));
    }
    let cursor = app.store().kv_get("ledger_sync_cursor").await?.unwrap_or_default();
    let projects: Vec<&str> = ledgers.iter().map(|l| l.project.as_str()).collect();
    let (now_due, truncated) = sync_order(&projects, &cursor, cap);
    let mut reports = Vec::new();
    for project in now_due {
        let Some(ledger) = ledgers.iter().find(|l| l.project == project) else { continue };
        reports.push(sync_project(app, ledger, now).await?);
        app.store().kv_set("ledger_sync_cursor", project).await?;
    }
    if truncated > 0 {
        tracing::info!(truncated, "ledger sync stopped at its cap; the rest go first next time");
    }
    Ok((reports, truncated))
}

/// L8–L13: claims a row, runs its function, writes the result; a heavy row goes to the job
/// queue instead (L9).
pub async fn run_row(app: &App, project: &str, id: &str, trigger: Trigger, now: Ts) -> Result<Row, ServiceError> {
    if let Some(row) = handoff_if_heavy(app, project, id, trigger, now).await? {
        return Ok(row);
    }
    let claimed = claim_row(app, project, id, trigger, now).await?;
    finish_row(app, claimed).await
}

/// L9: a person's run of a heavy row enqueues a job (one per row: its unique key is the row)
/// and records which job and queue on the row. None when the row is not heavy.
pub async fn handoff_if_heavy(
    app: &App,
    project: &str,
    id: &str,
    trigger: Trigger,
    now: Ts,
) -> Result<Option<Row>, ServiceError> {
    let rt = app.runtime();
    let rows = app
        .store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![id.to_string()]), |s| (LedgerWrites::default(), s.rows))
        .await?;
    let Some(row) = rows.into_iter().next() else { return Ok(None) };
    if !hands_off(&row, rt.function_mode(&row.function), trigger) {
        return Ok(None);
    }
    let served = rt.pools.iter().flat_map(|(_, p)| p.queues.iter().map(String::as_str));
    let Some(queue) = heavy_queue(served).map(String::from) else {
        return Err(ServiceError::conflict(format!(
            "{id}: {:?} is heavy and runs from the job queue, but no WorkerPool has a queue; apply one",
            row.function
        )));
    };
    let reference = ledger_ref(&row);
    let request = pcmail_core::api::EnqueueRequest {
        queue: queue.clone(),
        function: row.function.clone(),
        payload: Some(serde_json::Value::String(build_prompt(&row))),
        unique_key: Some(format!("{LEDGER_UNIQUE_PREFIX}{reference}")),
        ..Default::default()
    };
    let job = crate::jobs::enqueue(app, request, crate::jobs::Origin::Ledger(reference.clone()), now).await?.job;
    // A live job holding the row's key must be the row's own (T3): never adopt another's.
    if job.ledger_ref.as_deref() != Some(reference.as_str()) {
        return Err(ServiceError::conflict(format!(
            "{id}: the job queue key of this row is held by job {} that is not this row's; cancel it first",
            job.id
        )));
    }
    let (p, job_id) = (project.to_string(), job.id.clone());
    let handed = app
        .store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![id.to_string()]), move |s| {
            let Some(row) = s.rows.first() else { return (LedgerWrites::default(), None) };
            let next = plan_handoff(row, &job_id, &queue);
            let ev = event(&p, &next.id, Reason::Enqueued, next.result.clone(), "admin", now);
            (LedgerWrites { replace: vec![next.clone()], events: vec![ev], ..Default::default() }, Some(next))
        })
        .await?;
    Ok(handed)
}

/// L8: commits the claim (running, executedAt, runRequested cleared) before anything runs.
pub async fn claim_row(app: &App, project: &str, id: &str, trigger: Trigger, now: Ts) -> Result<Row, ServiceError> {
    let rt = app.runtime();
    let (p, actor) = (project.to_string(), if trigger == Trigger::Auto { "auto-execute" } else { "admin" });
    let id_owned = id.to_string();
    let claimed = app
        .store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![id.to_string()]), move |state| {
            let Some(row) = state.rows.first() else {
                return (LedgerWrites::default(), Err(ServiceError::not_found(format!("{p}/{id_owned} not found"))));
            };
            match plan_claim(row, rt.function_mode(&row.function), trigger, now) {
                Ok(claimed) => {
                    let ev =
                        event(&p, &claimed.id, Reason::Claimed, format!("running {}", claimed.function), actor, now);
                    (
                        LedgerWrites { replace: vec![claimed.clone()], events: vec![ev], ..Default::default() },
                        Ok(claimed),
                    )
                }
                Err(reason) => (LedgerWrites::default(), Err(ServiceError::conflict(reason))),
            }
        })
        .await??;
    Ok(claimed)
}

/// L12/L13/L10: runs a claimed row's function and writes its result, but only if the row is
/// still that claim (stale recovery or a person may have moved it meanwhile).
pub async fn finish_row(app: &App, claimed: Row) -> Result<Row, ServiceError> {
    let rt = app.runtime();
    let project = claimed.project.clone();
    let project = project.as_str();
    let Some((name, function)) = rt.functions.iter().find(|(n, _)| *n == claimed.function).cloned() else {
        return Err(ServiceError::internal("function vanished between claim and run"));
    };
    let mut vars = vec![
        ("PCMAIL_PROJECT", claimed.project.clone()),
        ("PCMAIL_ROW_ID", claimed.id.clone()),
        ("PCMAIL_TASK", claimed.task.clone()),
    ];
    // L12: the instruction goes to this run only.
    if !claimed.instruction.trim().is_empty() {
        vars.push(("PCMAIL_INSTRUCTION", claimed.instruction.trim().to_string()));
    }
    let outcome = crate::exec::run(&name, &function, &vars, build_prompt(&claimed)).await;
    let metrics = app.metrics();
    metrics.ledger.ran(
        project,
        &name,
        match &outcome {
            Ok(_) => RunOutcome::Ok,
            Err(crate::exec::ExecError::Timeout(_)) => RunOutcome::Timeout,
            Err(_) => RunOutcome::Failed,
        },
    );
    let (p, done_at) = (project.to_string(), crate::clock::now());
    let executed_at = claimed.executed_at;
    let row = app
        .store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![claimed.id.clone()]), move |state| {
            let Some(current) = state.rows.first() else { return (LedgerWrites::default(), None) };
            let (reason, message) = match &outcome {
                Ok(_) => (Reason::Succeeded, "result written; review it".to_string()),
                Err(e) => (Reason::Failed, e.to_string()),
            };
            let ran = outcome.as_deref().map_err(|_| message.as_str());
            let Some(next) = plan_result(current, executed_at, ran) else {
                return (LedgerWrites::default(), Some(current.clone()));
            };
            let ev = event(&p, &next.id, reason, message, "runner", done_at);
            (LedgerWrites { replace: vec![next.clone()], events: vec![ev], ..Default::default() }, Some(next))
        })
        .await?;
    row.ok_or_else(|| ServiceError::not_found("the row was deleted during its run"))
}

/// L11: rows left running past `staleAfter` count one timeout failure (any project).
pub async fn recover_stale(app: &App, now: Ts) -> Result<usize, StoreError> {
    let rt = app.runtime();
    let mut total = 0;
    for ledger in &rt.ledgers {
        let (p, stale_after) = (ledger.project.clone(), rt.stale_after);
        total += app
            .store()
            .ledger_transaction(&ledger.project, LedgerSelect::Open, move |state| {
                let recovered: Vec<Row> = state.rows.iter().filter_map(|r| plan_stale(r, stale_after, now)).collect();
                let events = recovered
                    .iter()
                    .map(|r| event(&p, &r.id, Reason::TimedOut, r.result.clone(), "controller", now))
                    .collect();
                let n = recovered.len();
                (LedgerWrites { replace: recovered, events, ..Default::default() }, n)
            })
            .await?;
    }
    Ok(total)
}

/// L14 execute-checked and auto-execute: up to `limit` rows run, one after another.
pub async fn execute_pass(app: &App, trigger: Trigger, limit: usize, now: Ts) -> Result<Vec<Row>, StoreError> {
    // A spreadsheet is re-read here, so a row a person just unticked or dropped is not claimed.
    app.store().refresh().await?;
    recover_stale(app, now).await?;
    let rt = app.runtime();
    let mut ran = Vec::new();
    for ledger in &rt.ledgers {
        if ran.len() >= limit {
            break;
        }
        let select = match trigger {
            Trigger::Manual => LedgerSelect::RunRequested { limit },
            Trigger::Auto => LedgerSelect::Open,
        };
        let rows =
            app.store().ledger_transaction(&ledger.project, select, |s| (LedgerWrites::default(), s.rows)).await?;
        let candidates = rows.into_iter().filter(|r| runs_in_pass(r, rt.function_mode(&r.function), trigger));
        for row in candidates {
            if ran.len() >= limit {
                break;
            }
            match run_row(app, &ledger.project, &row.id, trigger, crate::clock::now()).await {
                Ok(r) => ran.push(r),
                // Not claimable (already claimed by a concurrent pass, a send row for auto…):
                // say why on the row's trail and go on.
                Err(e) => {
                    tracing::info!(project = %ledger.project, row = %row.id, reason = %e, "ledger row skipped");
                    if trigger == Trigger::Manual {
                        let (p, id, why) = (ledger.project.clone(), row.id.clone(), e.to_string());
                        app.store()
                            .ledger_transaction(&ledger.project, LedgerSelect::Ids(vec![row.id.clone()]), move |s| {
                                let replace = s.rows.first().and_then(plan_skip).into_iter().collect();
                                let ev = event(&p, &id, Reason::Skipped, why, "controller", now);
                                (LedgerWrites { replace, events: vec![ev], ..Default::default() }, ())
                            })
                            .await?;
                    }
                }
            }
        }
    }
    Ok(ran)
}

/// L16 set-row: writes the fields a person may change, then reads the row back.
pub async fn set_row(
    app: &App,
    project: &str,
    id: &str,
    edit: pcmail_core::api::RowEdit,
    now: Ts,
) -> Result<Row, ServiceError> {
    let edit = edit.edit().map_err(|e| ServiceError::bad_request(e.to_string()))?;
    let (p, id_owned) = (project.to_string(), id.to_string());
    app.store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![id.to_string()]), move |s| {
            let Some(row) = s.rows.first().map(|r| plan_edit(r, edit)) else {
                return (LedgerWrites::default(), Err(ServiceError::not_found(format!("{p}/{id_owned} not found"))));
            };
            let ev = event(&p, &row.id, Reason::Edited, "set-row".into(), "admin", now);
            (LedgerWrites { replace: vec![row], events: vec![ev], ..Default::default() }, Ok(()))
        })
        .await??;
    app.store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![id.to_string()]), |s| (LedgerWrites::default(), s.rows))
        .await?
        .pop()
        .ok_or_else(|| ServiceError::not_found(format!("{project}/{id} not found after writing")))
}

/// L16 purge-source: a dry run unless `yes`; deletes only untouched rows, bottom-up.
pub async fn purge(app: &App, project: &str, source: &str, yes: bool, now: Ts) -> Result<PurgePlan, StoreError> {
    let (p, source) = (project.to_string(), source.to_string());
    app.store()
        .ledger_transaction(project, LedgerSelect::All, move |s| {
            let plan = plan_purge(&s.rows, &source);
            if !yes {
                return (LedgerWrites::default(), plan);
            }
            let events = plan
                .delete
                .iter()
                .map(|id| event(&p, id, Reason::Purged, format!("source {source}"), "admin", now))
                .collect();
            (LedgerWrites { delete: plan.delete.clone(), events, ..Default::default() }, plan)
        })
        .await
}

/// L15: the cross-project view, rendered from the store now.
/// L15: the cross-project view's lines, as of `today`.
pub async fn view(app: &App, today: &str) -> Result<Vec<ViewLine>, StoreError> {
    let rt = app.runtime();
    let mut rows_by_project = Vec::new();
    for l in &rt.ledgers {
        rows_by_project.push(app.store().ledger_rows(Some(&l.project)).await?);
    }
    let count_only: Vec<Vec<String>> = rt
        .ledgers
        .iter()
        .map(|l| l.sources.iter().filter(|s| s.count_only).map(|s| s.name.clone()).collect())
        .collect();
    let projects: Vec<ViewProject<'_>> = rt
        .ledgers
        .iter()
        .zip(&rows_by_project)
        .zip(&count_only)
        .map(|((l, rows), co)| ViewProject { project: &l.project, rows, count_only: co, cap: l.view_cap as usize })
        .collect();
    Ok(view_lines(&projects, today))
}

/// Ledger row counts by project and state for `pcmail_ledger_rows` (0 for absent states).
pub async fn refresh_metrics(app: &App) -> Result<(), StoreError> {
    let counts = app.store().ledger_counts().await?;
    for l in &app.runtime().ledgers {
        for s in RowState::ALL {
            let n = counts.iter().find(|c| c.group == l.project && c.state == s).map_or(0, |c| c.count);
            app.metrics().ledger.set_rows(&l.project, s, n);
        }
    }
    Ok(())
}
