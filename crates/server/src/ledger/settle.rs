//! Every job report and lease rescue goes through here, so a job a heavy row was handed to
//! (L9/L13/L10) settles that row when it ends, whoever ended it: a pool, a machine, the reaper.

use pcmail_core::Ts;
use pcmail_core::jobs::{Actor, Job, JobState, Report};
use pcmail_core::ledger::{Row, awaited_job, awaits_job, plan_failure, plan_success};
use pcmail_core::trail::Reason;
use pcmail_store::{LedgerSelect, LedgerWrites, Store, StoreError};

use super::event;
use crate::app::App;
use crate::error::ServiceError;
use crate::jobs;

/// [`jobs::report`], then the row of a job that ended.
pub async fn report(
    app: &App,
    id: &str,
    token: &str,
    actor: Actor<'_>,
    report: Report,
    now: Ts,
) -> Result<Job, ServiceError> {
    let job = jobs::report(app, id, token, actor, report, now).await?;
    job_ended(app, &job, now).await?;
    Ok(job)
}

/// [`jobs::record_many`] (the store's failure unlogged, for the pools' retries, E11), then the
/// rows of the jobs that ended.
pub async fn record_many(
    app: &App,
    reports: Vec<(String, String, Report)>,
    actor: Actor<'_>,
    now: Ts,
) -> Result<Vec<Result<Job, ServiceError>>, StoreError> {
    let outcomes = jobs::record_many(app, reports, actor, now).await?;
    for job in outcomes.iter().flatten() {
        job_ended(app, job, now).await?;
    }
    Ok(outcomes)
}

/// [`jobs::rescue_expired`], then the rows of the jobs that died.
pub async fn rescue_expired(app: &App, now: Ts) -> Result<usize, StoreError> {
    let rescued = jobs::rescue_expired(app, now).await?;
    for job in &rescued {
        job_ended(app, job, now).await?;
    }
    Ok(rescued.len())
}

/// L9/E11: every ledger's rows still waiting for a job that has ended — the job's end
/// committed but the row's own write failed (the store went away between the two) — settled
/// from the job, as its end would have; answers how many. Run with the job reaper, so no row
/// waits longer than a resync, and none runs again for it.
pub async fn settle_waiting(app: &App, now: Ts) -> Result<usize, StoreError> {
    let mut settled = 0;
    for ledger in &app.runtime().ledgers {
        let waiting = app
            .store()
            .ledger_transaction(&ledger.project, LedgerSelect::Open, |s| {
                let jobs: Vec<String> = s.rows.iter().filter_map(awaited_job).map(String::from).collect();
                (LedgerWrites::default(), jobs)
            })
            .await?;
        settled += jobs_ended(app, &ledger.project, &waiting, now).await?;
    }
    Ok(settled)
}

/// L9/E11: settles the rows of `project` still waiting for `jobs` whose jobs have ended;
/// answers how many. A job still queued or running is left to end as usual.
async fn jobs_ended(app: &App, project: &str, jobs: &[String], now: Ts) -> Result<usize, StoreError> {
    let mut settled = 0;
    for id in jobs {
        let Some(job) = app.store().get_job(id).await? else { continue };
        let ours = job.ledger_ref.as_deref().and_then(|r| r.split_once('/')).is_some_and(|(p, _)| p == project);
        if ours && matches!(job.state, JobState::Succeeded | JobState::Dead) {
            job_ended(app, &job, now).await?;
            settled += 1;
        }
    }
    Ok(settled)
}

/// L9/L13/L10 for heavy rows: when a row's job ends, its result or its failure is written on
/// the row (a job that will retry leaves the row as it is).
async fn job_ended(app: &App, job: &Job, now: Ts) -> Result<(), StoreError> {
    let Some((project, id)) = job.ledger_ref.as_deref().and_then(|r| r.split_once('/')) else { return Ok(()) };
    let outcome = match job.state {
        JobState::Succeeded => Ok(job.result.clone().unwrap_or_default()),
        JobState::Dead => Err(job.last_error.clone().unwrap_or_else(|| "the job died".into())),
        _ => return Ok(()),
    };
    let (p, job_id) = (project.to_string(), job.id.clone());
    app.store()
        .ledger_transaction(project, LedgerSelect::Ids(vec![id.to_string()]), move |s| {
            // T3: only the job this row was handed to writes on it.
            let Some(row) = s.rows.first().filter(|r| awaits_job(r, &job_id)) else {
                return (LedgerWrites::default(), ());
            };
            let (next, reason) = match &outcome {
                Ok(stdout) => (Row { executed_at: Some(now), ..plan_success(row, stdout) }, Reason::Succeeded),
                Err(e) => (plan_failure(row, e), Reason::Failed),
            };
            let ev = event(&p, &next.id, reason, format!("job {job_id} ended"), "job-queue", now);
            (LedgerWrites { replace: vec![next], events: vec![ev], ..Default::default() }, ())
        })
        .await
}
