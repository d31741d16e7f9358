//! The shell of the job queue: enqueue with unique keys (J6), claims (J1), lease-checked
//! heartbeat, complete and fail (J2, J4), the reaper (J3), retry and cancel: each one store
//! transaction around a planner of `pcmail_core::jobs`.

use pcmail_core::Ts;
use pcmail_core::api::{EnqueueRequest, EnqueueResponse};
use pcmail_core::bounds;
use pcmail_core::duration::Dur;
use pcmail_core::ids::hex;
use pcmail_core::jobs::{
    Actor, ClaimRefusal, Job, JobState, KeyTerms, LeaseError, LeaseOwner, Report, ReportRefusal, claim_terms, declared,
    may_see, plan_admin_move, plan_enqueue, plan_report, plan_rescue,
};
use pcmail_store::{Claim, JobSelect, Store, StoreError};

use crate::app::App;
use crate::error::ServiceError;

fn random_hex(bytes: usize) -> Result<String, ServiceError> {
    let mut b = vec![0u8; bytes];
    crate::random::fill(&mut b).map_err(|e| ServiceError::internal(format!("no randomness: {e}")))?;
    Ok(hex(&b))
}

/// The random part of a claim's lease tokens, a secret: whoever holds a token may report for
/// its job (J2).
fn lease_secret() -> Result<String, ServiceError> {
    let mut b = [0u8; 8];
    crate::random::secret(&mut b).map_err(|e| ServiceError::internal(format!("no randomness: {e}")))?;
    Ok(hex(&b))
}

/// Jitter in [0, 1) for J4's backoff.
fn jitter() -> f64 {
    let mut b = [0u8; 4];
    let _ = crate::random::fill(&mut b);
    f64::from(u32::from_le_bytes(b)) / (f64::from(u32::MAX) + 1.0)
}

/// Who asks for a job: a caller of the API (a machine, or the admin as None), or a heavy
/// ledger row — the only origin that links a job to a row (T3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Caller(Option<String>),
    Ledger(String),
}

pub async fn enqueue(app: &App, req: EnqueueRequest, origin: Origin, now: Ts) -> Result<EnqueueResponse, ServiceError> {
    let mut answers = enqueue_many(app, vec![req], false, origin, now).await?;
    answers.pop().ok_or_else(|| ServiceError::internal("an enqueue of one job answered nothing"))
}

/// Enqueues `requests` in one transaction (P10), each unique key honoured in order (J6); the
/// answers come in the requests' order. One job the runtime refuses refuses the whole list,
/// naming its index when the request was a `list`, and nothing is written.
pub async fn enqueue_many(
    app: &App,
    requests: Vec<EnqueueRequest>,
    list: bool,
    origin: Origin,
    now: Ts,
) -> Result<Vec<EnqueueResponse>, ServiceError> {
    let rt = app.runtime();
    let (enqueued_by, ledger_ref) = match origin {
        Origin::Caller(machine) => (machine, None),
        Origin::Ledger(reference) => (None, Some(reference)),
    };
    let mut jobs = Vec::with_capacity(requests.len());
    let mut asked = std::collections::HashMap::new();
    for (i, req) in requests.into_iter().enumerate() {
        let refused =
            |message: String| ServiceError::unprocessable(if list { format!("jobs[{i}]: {message}") } else { message });
        if !declared(&rt.pools, &req.queue) {
            return Err(refused(format!(
                "queue {:?} is not declared by any WorkerPool; apply a WorkerPool whose queues name it",
                req.queue
            )));
        }
        if !rt.functions.iter().any(|(n, _)| *n == req.function) {
            return Err(refused(format!("function {:?} is not defined; apply a Function of that name", req.function)));
        }
        let max_attempts = req.max_attempts.unwrap_or_else(|| {
            rt.pools.iter().find(|(_, p)| p.queues.contains(&req.queue)).map_or(3, |(_, p)| p.max_attempts)
        });
        let run_after = now
            .checked_add_signed(req.run_after.unwrap_or_default().to_chrono())
            .ok_or_else(|| refused("runAfter is too far away".into()))?;
        let payload = req.payload.map_or_else(|| "null".into(), |p| p.to_string());
        let id = format!("job-{}", random_hex(6)?);
        // A heavy ledger row's job holds its key only while live: a re-run is a new job.
        let unique_for = if ledger_ref.is_some() { None } else { req.unique_for };
        asked.insert(id.clone(), unique_for);
        jobs.push(Job {
            priority: req.priority,
            max_attempts: max_attempts.max(1),
            run_after,
            unique_key: req.unique_key,
            ledger_ref: ledger_ref.clone(),
            enqueued_by: enqueued_by.clone(),
            ..Job::new(id, req.queue, req.function, payload, now)
        });
    }
    let keys: Vec<String> = jobs.iter().filter_map(|j| j.unique_key.clone()).collect();
    let select = if keys.is_empty() { JobSelect::Ids(vec![]) } else { JobSelect::Unique(keys) };
    // Stored holders are weighed by their own queue's terms, incoming jobs by what they asked.
    let terms_of = move |j: &Job| KeyTerms::of(&rt.pools, &j.queue, asked.get(&j.id).copied().flatten());
    let answers = app.store().jobs_transaction(select, move |stored| plan_enqueue(stored, jobs, terms_of, now)).await?;
    if answers.iter().any(|(_, created)| *created) {
        app.pools().ring();
    }
    Ok(answers.into_iter().map(|(job, created)| EnqueueResponse { job, created }).collect())
}

/// J1/T2/T5: up to `limit` due jobs of `queue`, leased to `worker` of `actor` for `lease`. A
/// machine claims only the queues of pools that name it in `externalWorkers`, and no longer than
/// their `maxLease`; the server's own pool workers claim their pool's queues.
pub async fn claim(
    app: &App,
    queue: &str,
    limit: usize,
    (actor, worker): (Actor<'_>, &str),
    lease: Dur,
    now: Ts,
) -> Result<Vec<Job>, ServiceError> {
    if actor != Actor::Pool {
        let max_lease = claim_terms(&app.runtime().pools, queue, actor).map_err(|e| match e {
            ClaimRefusal::Undeclared(_) => ServiceError::unprocessable(e.to_string()),
            ClaimRefusal::NotExternalWorker { .. } => ServiceError::forbidden(e.to_string()),
        })?;
        bounds::duration("lease", lease, bounds::MIN_LEASE, max_lease)
            .map_err(|e| ServiceError::unprocessable(format!("{e} (the WorkerPool's maxLease)")))?;
    }
    let prefix = lease_secret()?;
    Ok(claim_in_store(app, queue, limit, LeaseOwner::of(actor, worker), prefix, lease, now).await?)
}

/// J1/E17 for the server's own pools: claims under `pool:<pool> (claimed ahead)`, so that a
/// crash before a job gets its slot spends no attempt. A store that does not answer comes back
/// as it is, unlogged: the pool waits it out and says so once (E11).
pub async fn pool_claim(
    app: &App,
    pool: &str,
    queue: &str,
    limit: usize,
    lease: Dur,
    now: Ts,
) -> Result<Vec<Job>, StoreError> {
    let prefix = lease_secret().map_err(|e| StoreError::Backend(format!("claim: {}", e.message())))?;
    let owner = LeaseOwner::claimed_ahead(pool);
    claim_in_store(app, queue, limit, owner, prefix, lease, now).await
}

async fn claim_in_store(
    app: &App,
    queue: &str,
    limit: usize,
    owner: LeaseOwner,
    prefix: String,
    lease: Dur,
    now: Ts,
) -> Result<Vec<Job>, StoreError> {
    let claim = Claim {
        queue: queue.to_string(),
        limit: limit.clamp(1, bounds::MAX_CLAIM as usize),
        owner,
        token_prefix: format!("{prefix}-"),
        now,
        lease_until: now + lease.to_chrono(),
    };
    let jobs = app.store().claim_jobs(claim).await?;
    app.metrics().jobs.claimed(queue, jobs.len() as u64);
    Ok(jobs)
}

/// J2/T1: writes only if (id, token, running) still match and `actor` claimed the job; a
/// worker whose lease was taken from it gets 409, anyone else 403, and nothing changes.
/// Called through [`crate::ledger::settle`], which settles the row of a job that ended.
pub async fn report(
    app: &App,
    id: &str,
    token: &str,
    actor: Actor<'_>,
    report: Report,
    now: Ts,
) -> Result<Job, ServiceError> {
    let mut outcomes = record_many(app, vec![(id.to_string(), token.to_string(), report)], actor, now).await?;
    outcomes.pop().unwrap_or_else(|| Err(ServiceError::internal("a report of one job answered nothing")))
}

/// Reports of many jobs of one actor in one transaction, each checked and answered on its own,
/// in order; the store's failure as it is, unlogged: the pools retry their own reports through
/// an outage and say so once (E11). Called through [`crate::ledger::settle`], which settles the
/// rows of jobs that ended.
pub async fn record_many(
    app: &App,
    reports: Vec<(String, String, Report)>,
    actor: Actor<'_>,
    now: Ts,
) -> Result<Vec<Result<Job, ServiceError>>, StoreError> {
    let jitter = jitter();
    let rt = app.runtime();
    let reporter = match actor {
        Actor::Machine(m) => Reporter::Machine(m.to_string()),
        Actor::Pool => Reporter::Pool,
        Actor::Admin => Reporter::Admin,
    };
    // A pool's batch often holds a job's start and its end: its row is read once.
    let mut seen = std::collections::HashSet::with_capacity(reports.len());
    let ids = reports.iter().filter(|(id, _, _)| seen.insert(id.as_str())).map(|(id, _, _)| id.clone()).collect();
    let outcomes = app
        .store()
        .jobs_transaction(JobSelect::Ids(ids), move |found| {
            let mut current: std::collections::HashMap<String, Job> =
                found.into_iter().map(|j| (j.id.clone(), j)).collect();
            let mut writes: Vec<Job> = Vec::new();
            let outcomes: Vec<Result<Job, ServiceError>> = reports
                .into_iter()
                .map(|(id, token, report)| {
                    // T16: a job the caller may not list answers as one that is not there.
                    let job = current
                        .remove(&id)
                        .filter(|j| may_see(j, reporter.actor()))
                        .ok_or_else(|| ServiceError::not_found("job not found"))?;
                    let next =
                        plan_report(&job, &token, reporter.actor(), report, &rt.pools, now, jitter).map_err(refused);
                    let kept = next.as_ref().map_or(job, Clone::clone);
                    current.insert(id, kept);
                    if let Ok(next) = &next {
                        writes.retain(|w| w.id != next.id);
                        writes.push(next.clone());
                    }
                    next
                })
                .collect();
            (writes, outcomes)
        })
        .await?;
    for job in outcomes.iter().flatten() {
        if matches!(job.state, JobState::Failed | JobState::Dead) {
            app.metrics().jobs.failed(&job.queue);
        }
    }
    Ok(outcomes)
}

fn refused(e: ReportRefusal) -> ServiceError {
    match e {
        ReportRefusal::Lease(LeaseError::NotHolder(_)) => ServiceError::forbidden(e.to_string()),
        ReportRefusal::Lease(_) => ServiceError::conflict(e.to_string()),
        ReportRefusal::LeaseOutOfRange(_) => ServiceError::unprocessable(e.to_string()),
    }
}

/// `Actor` borrows; the store's transaction closure must own what it holds.
enum Reporter {
    Pool,
    Machine(String),
    Admin,
}

impl Reporter {
    fn actor(&self) -> Actor<'_> {
        match self {
            Reporter::Pool => Actor::Pool,
            Reporter::Machine(m) => Actor::Machine(m),
            Reporter::Admin => Actor::Admin,
        }
    }
}

/// J3: expired leases go back to the queue (the attempt counts) or die at maxAttempts.
/// Called through [`crate::ledger::settle`], which settles the rows of jobs that died.
pub async fn rescue_expired(app: &App, now: Ts) -> Result<Vec<Job>, StoreError> {
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
        app.metrics().jobs.rescued(&j.queue);
    }
    Ok(rescued)
}

/// A person's retry (a dead, failed or cancelled job runs again from zero attempts) or cancel.
pub async fn admin_move(app: &App, id: &str, retry: bool, now: Ts) -> Result<Job, ServiceError> {
    app.store()
        .jobs_transaction(JobSelect::Ids(vec![id.to_string()]), move |mut found| {
            let Some(job) = found.pop() else { return (vec![], Err(ServiceError::not_found("job not found"))) };
            let next = match plan_admin_move(&job, retry, now) {
                Ok(next) => next,
                Err(why) => return (vec![], Err(ServiceError::conflict(why.to_string()))),
            };
            (vec![next.clone()], Ok(next))
        })
        .await?
}

/// `pcmail_jobs{queue,state}` from the store's counts (0 for absent states of known queues).
pub async fn refresh_metrics(app: &App) -> Result<(), StoreError> {
    let counts = app.store().job_counts().await?;
    let rt = app.runtime();
    let mut queues: Vec<&str> = counts.iter().map(|c| c.group.as_str()).collect();
    queues.extend(rt.pools.iter().flat_map(|(_, p)| p.queues.iter().map(String::as_str)));
    queues.sort_unstable();
    queues.dedup();
    for queue in queues {
        for state in JobState::ALL {
            // A state that emptied must read 0, not its last count.
            let n = counts.iter().find(|c| c.group == queue && c.state == state).map_or(0, |c| c.count);
            app.metrics().jobs.set_count(queue, state, n);
        }
    }
    Ok(())
}
