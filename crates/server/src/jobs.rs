//! The shell of the job queue: enqueue with unique keys (J6), claims (J1), lease-checked
//! heartbeat, complete and fail (J2, J4), the reaper (J3), retry and cancel.

use pcmail_core::Ts;
use pcmail_core::duration::Dur;
use pcmail_core::ids::hex;
use pcmail_core::jobs::{Job, JobState, check_lease, plan_failure, plan_rescue};
use pcmail_store::{Claim, JobSelect, Store, StoreError};
use serde::{Deserialize, Serialize};

use crate::App;
use crate::api::ApiError;

fn random_hex(bytes: usize) -> Result<String, ApiError> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).map_err(|e| ApiError::internal(format!("no randomness: {e}")))?;
    Ok(hex(&b))
}

/// Jitter in [0, 1) for J4's backoff.
fn jitter() -> f64 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueueRequest {
    pub queue: String,
    pub function: String,
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default)]
    pub unique_key: Option<String>,
    #[serde(default)]
    pub run_after: Option<Dur>,
    #[serde(default)]
    pub max_attempts: Option<u32>,
    #[serde(default)]
    pub ledger_ref: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnqueueResponse {
    pub job: Job,
    /// False when a live job already held the unique key (J6): that job is answered.
    pub created: bool,
}

pub async fn enqueue(app: &App, req: EnqueueRequest, now: Ts) -> Result<EnqueueResponse, ApiError> {
    if req.queue.trim().is_empty() || req.function.trim().is_empty() {
        return Err(ApiError::bad_request("a job needs a queue and a function"));
    }
    let rt = app.runtime();
    if !rt.functions.iter().any(|(n, _)| *n == req.function) {
        return Err(ApiError::bad_request(format!(
            "function {:?} is not defined; apply a Function of that name",
            req.function
        )));
    }
    let max_attempts = req.max_attempts.unwrap_or_else(|| {
        rt.pools.iter().find(|(_, p)| p.queues.contains(&req.queue)).map_or(3, |(_, p)| p.max_attempts)
    });
    let run_after = now
        .checked_add_signed(req.run_after.unwrap_or_default().to_chrono())
        .ok_or_else(|| ApiError::bad_request("runAfter is too far away"))?;
    let payload = req.payload.map_or_else(|| "null".into(), |p| p.to_string());
    let job = Job {
        priority: req.priority,
        max_attempts: max_attempts.max(1),
        run_after,
        unique_key: req.unique_key.clone(),
        ledger_ref: req.ledger_ref,
        ..Job::new(format!("job-{}", random_hex(6)?), req.queue, req.function, payload, now)
    };
    let select = match &req.unique_key {
        Some(k) => JobSelect::LiveUnique(k.clone()),
        None => JobSelect::Ids(vec![]),
    };
    let response = app
        .store()
        .jobs_transaction(select, move |live| match live.into_iter().next() {
            Some(existing) => (vec![], EnqueueResponse { job: existing, created: false }),
            None => (vec![job.clone()], EnqueueResponse { job, created: true }),
        })
        .await?;
    if response.created {
        app.ring_job_bell();
    }
    Ok(response)
}

/// J1: up to `limit` due jobs of `queue`, leased to `owner` for `lease`.
pub async fn claim(
    app: &App,
    queue: &str,
    limit: usize,
    owner: &str,
    lease: Dur,
    now: Ts,
) -> Result<Vec<Job>, ApiError> {
    let claim = Claim {
        queue: queue.to_string(),
        limit: limit.clamp(1, 1000),
        owner: owner.to_string(),
        token_prefix: format!("{}-", random_hex(8)?),
        now,
        lease_until: now + lease.to_chrono(),
    };
    let jobs = app.store().claim_jobs(claim).await?;
    app.metrics().job_claims.with_label_values(&[queue]).inc_by(jobs.len() as u64);
    Ok(jobs)
}

/// What a lease holder reports about its job.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Heartbeat { lease: Dur },
    Complete { result: String },
    Fail { error: String },
}

/// J2: writes only if (id, token, running) still match; a worker whose lease was taken from it
/// gets 409 and changes nothing.
pub async fn report(app: &App, id: &str, token: &str, report: Report, now: Ts) -> Result<Job, ApiError> {
    let (token, jitter) = (token.to_string(), jitter());
    let failed = matches!(report, Report::Fail { .. });
    let job = app
        .store()
        .jobs_transaction(JobSelect::Ids(vec![id.to_string()]), move |mut found| {
            let Some(job) = found.pop() else { return (vec![], Err(ApiError::not_found("job not found"))) };
            if let Err(e) = check_lease(&job, &token) {
                return (vec![], Err(ApiError::conflict(e.to_string())));
            }
            let next = match report {
                Report::Heartbeat { lease } => {
                    Job { heartbeat_at: Some(now), lease_expires_at: Some(now + lease.to_chrono()), ..job }
                }
                Report::Complete { result } => Job {
                    state: JobState::Succeeded,
                    result: Some(result.chars().take(20_000).collect()),
                    finished_at: Some(now),
                    lease_token: None,
                    lease_expires_at: None,
                    ..job
                },
                Report::Fail { error } => plan_failure(&job, &error, now, jitter),
            };
            (vec![next.clone()], Ok(next))
        })
        .await??;
    if failed {
        app.metrics().job_failures.with_label_values(&[&job.queue]).inc();
    }
    crate::ledger::job_ended(app, &job, now).await?;
    Ok(job)
}

/// J3: expired leases go back to the queue (the attempt counts) or die at maxAttempts.
pub async fn rescue_expired(app: &App, now: Ts) -> Result<usize, StoreError> {
    let jitter = jitter();
    let rescued = app
        .store()
        .jobs_transaction(JobSelect::ExpiredLeases { now, limit: 1000 }, move |expired| {
            let rescued: Vec<Job> = expired.iter().map(|j| plan_rescue(j, now, jitter)).collect();
            (rescued.clone(), rescued)
        })
        .await?;
    for j in &rescued {
        tracing::warn!(job = %j.id, queue = %j.queue, state = %j.state, "rescued an expired lease");
        app.metrics().job_rescues.with_label_values(&[&j.queue]).inc();
        crate::ledger::job_ended(app, j, now).await?;
    }
    Ok(rescued.len())
}

/// A person's retry (a dead, failed or cancelled job runs again from zero attempts) or cancel.
pub async fn admin_move(app: &App, id: &str, retry: bool, now: Ts) -> Result<Job, ApiError> {
    app.store()
        .jobs_transaction(JobSelect::Ids(vec![id.to_string()]), move |mut found| {
            let Some(job) = found.pop() else { return (vec![], Err(ApiError::not_found("job not found"))) };
            let next = match (retry, job.state) {
                (true, JobState::Dead | JobState::Failed | JobState::Cancelled) => {
                    Job { state: JobState::Queued, attempts: 0, run_after: now, finished_at: None, ..job }
                }
                (false, JobState::Queued | JobState::Failed | JobState::Running) => Job {
                    state: JobState::Cancelled,
                    lease_token: None,
                    lease_expires_at: None,
                    finished_at: Some(now),
                    ..job
                },
                (_, s) => {
                    let verb = if retry { "retried" } else { "cancelled" };
                    return (vec![], Err(ApiError::conflict(format!("a {s} job cannot be {verb}"))));
                }
            };
            (vec![next.clone()], Ok(next))
        })
        .await?
}

/// `pcmail_jobs{queue,state}` from the store's counts (0 for absent states of known queues).
pub async fn refresh_metrics(app: &App) -> Result<(), StoreError> {
    let counts = app.store().job_counts().await?;
    let rt = app.runtime();
    let mut queues: Vec<&str> = counts.iter().map(|(q, _, _)| q.as_str()).collect();
    queues.extend(rt.pools.iter().flat_map(|(_, p)| p.queues.iter().map(String::as_str)));
    queues.sort_unstable();
    queues.dedup();
    for queue in queues {
        for state in JobState::ALL {
            // A state that emptied must read 0, not its last count.
            let n = counts.iter().find(|(q, s, _)| q == queue && s == state.as_str()).map_or(0, |c| c.2);
            app.metrics().jobs.with_label_values(&[queue, state.as_str()]).set(n as i64);
        }
    }
    Ok(())
}
