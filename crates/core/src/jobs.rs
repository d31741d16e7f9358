//! The job queue (DESIGN §8): leases with tokens (J1, J2), rescue of expired leases (J3),
//! retries with exponential backoff and jitter (J4), unique keys (J6). Pure: the store runs
//! the claim as one statement; these decide what a failure, a rescue or an enqueue writes.

use serde::{Deserialize, Serialize};

use crate::Ts;
use crate::bounds;
use crate::duration::Dur;
use crate::manifest::spec::WorkerPoolSpec;
use crate::text::sanitize;

crate::wire_enum! {
    pub enum JobState as "job state" {
        Queued = "queued",
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        Dead = "dead",
        Cancelled = "cancelled",
    }
}

impl JobState {
    /// A job in one of these states holds its uniqueKey (J6).
    pub fn is_live(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running | JobState::Failed)
    }
}

/// One row of the `jobs` tab. Its times are written by [`crate::rfc3339`] (P10: one in every
/// enqueue's answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    pub id: String,
    pub queue: String,
    pub function: String,
    pub payload: String,
    pub state: JobState,
    pub priority: i64,
    pub attempts: u32,
    pub max_attempts: u32,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub run_after: Ts,
    pub lease_owner: Option<String>,
    pub lease_token: Option<String>,
    #[serde(serialize_with = "crate::rfc3339::serialize_option")]
    pub lease_expires_at: Option<Ts>,
    #[serde(serialize_with = "crate::rfc3339::serialize_option")]
    pub heartbeat_at: Option<Ts>,
    pub rescues: u32,
    pub last_error: Option<String>,
    pub result: Option<String>,
    pub unique_key: Option<String>,
    pub ledger_ref: Option<String>,
    #[serde(serialize_with = "crate::rfc3339::serialize")]
    pub created_at: Ts,
    #[serde(serialize_with = "crate::rfc3339::serialize_option")]
    pub finished_at: Option<Ts>,
    /// The machine that enqueued the job (T2); None for the server's own (heavy ledger rows).
    pub enqueued_by: Option<String>,
}

impl Job {
    /// A queued job due now: no lease, no attempts yet, 3 attempts allowed. Callers set the rest
    /// with struct update syntax.
    pub fn new(id: String, queue: String, function: String, payload: String, now: Ts) -> Job {
        Job {
            id,
            queue,
            function,
            payload,
            state: JobState::Queued,
            priority: 0,
            attempts: 0,
            max_attempts: 3,
            run_after: now,
            lease_owner: None,
            lease_token: None,
            lease_expires_at: None,
            heartbeat_at: None,
            rescues: 0,
            last_error: None,
            result: None,
            unique_key: None,
            ledger_ref: None,
            created_at: now,
            finished_at: None,
            enqueued_by: None,
        }
    }
}

/// Who acts on the queue: the server's own WorkerPool workers, a machine (its token), or the
/// admin (the admin token acting as no machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor<'a> {
    Pool,
    Machine(&'a str),
    Admin,
}

/// T1: who holds a lease, as the server writes it at a claim. `leaseOwner` is its text
/// ([`Display`](std::fmt::Display)) only in the store's row and the API's JSON, so that it tells
/// who holds the lease: `pool:<worker>` for the server's own pools, `<machine>/<worker>` for a
/// machine, `admin:<worker>` for the admin. `:` and `/` never occur in a machine's name (T6), so
/// no machine can be mistaken for the pool or the admin. The text is the wire format older
/// servers and PCs read: it does not change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseOwner {
    /// A worker of the server's own pools; `ahead` while it claimed the job ahead of a free
    /// slot and its run has not begun (E17, written as the [`CLAIMED_AHEAD`] mark).
    Pool {
        worker: String,
        ahead: bool,
    },
    Admin {
        worker: String,
    },
    Machine {
        machine: String,
        worker: String,
    },
}

/// E17: a pool claims jobs ahead of its free slots (P9) under `pool:<pool> (claimed ahead)`;
/// the lease-checked write that starts a run ([`Report::Start`]) drops the mark. A rescued
/// lease whose owner still carries it never ran, so its attempt is given back. The mark is
/// written by the claim itself, so a crash right after the claim still leaves it.
pub const CLAIMED_AHEAD: &str = " (claimed ahead)";

const POOL: &str = "pool:";
const ADMIN: &str = "admin:";
/// What follows a machine's name in its owners. The store's T2 listing filter matches
/// `<machine>/` as a prefix in SQL (held by the contract suite's job visibility tests).
pub const MACHINE_SEPARATOR: char = '/';

impl LeaseOwner {
    /// The owner `worker` of `actor` claims under (a pool's claims are not ahead).
    pub fn of(actor: Actor<'_>, worker: &str) -> LeaseOwner {
        let worker = worker.to_string();
        match actor {
            Actor::Pool => LeaseOwner::Pool { worker, ahead: false },
            Actor::Machine(m) => LeaseOwner::Machine { machine: m.to_string(), worker },
            Actor::Admin => LeaseOwner::Admin { worker },
        }
    }

    /// E17: the owner a pool claims ahead under.
    pub fn claimed_ahead(pool: &str) -> LeaseOwner {
        LeaseOwner::Pool { worker: pool.to_string(), ahead: true }
    }

    /// Reads `leaseOwner` back; None for text this build did not write (an older build's
    /// worker name, a hand-edited row): such a lease is nobody's, and only the reaper ends it.
    pub fn parse(text: &str) -> Option<LeaseOwner> {
        if let Some(worker) = text.strip_prefix(POOL) {
            let (worker, ahead) = worker.strip_suffix(CLAIMED_AHEAD).map_or((worker, false), |w| (w, true));
            return Some(LeaseOwner::Pool { worker: worker.to_string(), ahead });
        }
        if let Some(worker) = text.strip_prefix(ADMIN) {
            return Some(LeaseOwner::Admin { worker: worker.to_string() });
        }
        let (machine, worker) = text.split_once(MACHINE_SEPARATOR)?;
        crate::text::is_name(machine)
            .then(|| LeaseOwner::Machine { machine: machine.to_string(), worker: worker.to_string() })
    }

    /// Who holds the lease.
    pub fn actor(&self) -> Actor<'_> {
        match self {
            LeaseOwner::Pool { .. } => Actor::Pool,
            LeaseOwner::Admin { .. } => Actor::Admin,
            LeaseOwner::Machine { machine, .. } => Actor::Machine(machine),
        }
    }

    /// E17: the owner once its run began: a pool's claim ahead loses its mark.
    pub fn started(self) -> LeaseOwner {
        match self {
            LeaseOwner::Pool { worker, .. } => LeaseOwner::Pool { worker, ahead: false },
            other => other,
        }
    }
}

impl std::fmt::Display for LeaseOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseOwner::Pool { worker, ahead } => {
                write!(f, "{POOL}{worker}{}", if *ahead { CLAIMED_AHEAD } else { "" })
            }
            LeaseOwner::Admin { worker } => write!(f, "{ADMIN}{worker}"),
            LeaseOwner::Machine { machine, worker } => write!(f, "{machine}{MACHINE_SEPARATOR}{worker}"),
        }
    }
}

impl Job {
    /// Who holds the job's lease; None when free or held under text this build did not write.
    pub fn owner(&self) -> Option<LeaseOwner> {
        self.lease_owner.as_deref().and_then(LeaseOwner::parse)
    }

    fn held_by(&self, actor: Actor<'_>) -> bool {
        self.owner().is_some_and(|o| o.actor() == actor)
    }
}

/// E17: whether a job's run began: a pool's job once its start was written, any other
/// holder's from its claim (an external worker claims what it runs).
pub fn began(job: &Job) -> bool {
    !matches!(job.owner(), Some(LeaseOwner::Pool { ahead: true, .. }))
}

/// A claim's `owner` that cannot be shown in `leaseOwner`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("owner {0:?} must be 1-100 characters on one line, without '/'")]
pub struct BadWorkerName(pub String);

/// The name a worker gives itself in a claim (`owner`): shown in `leaseOwner`, so one short line.
pub fn check_worker_name(worker: &str) -> Result<(), BadWorkerName> {
    let ok = !worker.is_empty()
        && worker.chars().count() <= 100
        && !worker.contains('/')
        && crate::text::check_line(worker).is_ok();
    if ok { Ok(()) } else { Err(BadWorkerName(worker.to_string())) }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("job {0} not found")]
    NotFound(String),
    #[error("job {id} is {state}, not running: its lease is over")]
    NotRunning { id: String, state: JobState },
    #[error("job {0}'s lease was taken from this worker (rescued or reclaimed); its result is not recorded")]
    WrongToken(String),
    #[error("job {0} is not leased to you: only the worker that claimed it may report on it")]
    NotHolder(String),
}

/// J2/T1: heartbeat, complete and fail must match (id, leaseToken, running) and come from the
/// one who claimed: the token alone is not enough, a machine's is useless to another.
pub fn check_lease(job: &Job, token: &str, actor: Actor<'_>) -> Result<(), LeaseError> {
    if job.state != JobState::Running {
        return Err(LeaseError::NotRunning { id: job.id.clone(), state: job.state });
    }
    if !job.held_by(actor) {
        return Err(LeaseError::NotHolder(job.id.clone()));
    }
    if job.lease_token.as_deref() != Some(token) {
        return Err(LeaseError::WrongToken(job.id.clone()));
    }
    Ok(())
}

/// T2: whether `actor` may see a job's payload, result and error: the admin and the pool
/// always; a machine only for the jobs it enqueued or claimed.
pub fn may_see(job: &Job, actor: Actor<'_>) -> bool {
    match actor {
        Actor::Pool | Actor::Admin => true,
        Actor::Machine(m) => job.enqueued_by.as_deref() == Some(m) || job.held_by(Actor::Machine(m)),
    }
}

/// T1/T2: a job as any answer but the claim's shows it to `actor`: never its lease token, and
/// another's payload, result and error blanked.
pub fn redact(job: Job, actor: Actor<'_>) -> Job {
    let visible = may_see(&job, actor);
    let job = Job { lease_token: None, ..job };
    if visible { job } else { Job { payload: String::new(), result: None, last_error: None, ..job } }
}

/// A job as a bulk enqueue answers it when a live job already held the key: who and where,
/// without payload, result or error. A list of a thousand references to one job must not
/// answer with its payload a thousand times (the holder can be listed whole).
pub fn slim(job: Job) -> Job {
    Job { payload: String::new(), result: None, last_error: None, lease_token: None, ..job }
}

/// Unique keys of this prefix belong to the server's heavy ledger rows (T3): a request that
/// takes one could hold a row's job hostage.
pub const LEDGER_UNIQUE_PREFIX: &str = "ledger:";

/// T2: a queue some WorkerPool declares (only those take jobs, so metric labels stay bounded).
pub fn declared(pools: &[(String, WorkerPoolSpec)], queue: &str) -> bool {
    pools.iter().any(|(_, p)| p.queues.iter().any(|q| q == queue))
}

/// Why a queue cannot be claimed from (T2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimRefusal {
    #[error("queue {0:?} is not declared by any WorkerPool; apply a WorkerPool whose queues name it")]
    Undeclared(String),
    #[error(
        "{machine} may not claim from queue {queue:?}: add {machine} to externalWorkers of WorkerPool {}",
        pools.join(" or ")
    )]
    NotExternalWorker { machine: String, queue: String, pools: Vec<String> },
}

/// T2/T5: whether `actor` may claim from `queue`, and the longest lease it may take there
/// (the largest `maxLease` of the WorkerPools that let it in).
pub fn claim_terms(pools: &[(String, WorkerPoolSpec)], queue: &str, actor: Actor<'_>) -> Result<Dur, ClaimRefusal> {
    let declaring: Vec<&(String, WorkerPoolSpec)> =
        pools.iter().filter(|(_, p)| p.queues.iter().any(|q| q == queue)).collect();
    if declaring.is_empty() {
        return Err(ClaimRefusal::Undeclared(queue.to_string()));
    }
    let allowed = declaring.iter().filter(|(_, p)| match actor {
        Actor::Pool | Actor::Admin => true,
        Actor::Machine(m) => p.external_workers.iter().any(|w| w == m),
    });
    match allowed.map(|(_, p)| p.max_lease.unwrap_or(bounds::DEFAULT_MAX_LEASE)).max() {
        Some(max) => Ok(max),
        None => Err(ClaimRefusal::NotExternalWorker {
            machine: match actor {
                Actor::Machine(m) => m.to_string(),
                _ => String::new(),
            },
            queue: queue.to_string(),
            pools: declaring.iter().map(|(n, _)| n.clone()).collect(),
        }),
    }
}

/// J4: exponential backoff from `base`, capped at `max`, with `jitter` in [0, 1) spreading each
/// delay over its upper half so that failed jobs do not all come back at once.
pub fn retry_delay(attempts: u32, base: Dur, max: Dur, jitter: f64) -> Dur {
    let exp = base.as_millis().saturating_mul(1u64 << attempts.saturating_sub(1).min(30));
    let capped = exp.min(max.as_millis());
    let spread = (capped as f64 * (0.5 + 0.5 * jitter.clamp(0.0, 1.0))) as u64;
    Dur::from_millis(spread.max(1))
}

pub const RETRY_BASE: Dur = Dur::from_secs(1);
pub const RETRY_MAX: Dur = Dur::from_hours(1);

/// J4: a failed attempt goes back to the queue after its backoff, or is dead once it has used
/// `maxAttempts`. The lease is released either way; `leaseOwner` keeps who held it last.
pub fn plan_failure(job: &Job, error: &str, now: Ts, jitter: f64) -> Job {
    let dead = job.attempts >= job.max_attempts;
    let delay = retry_delay(job.attempts, RETRY_BASE, RETRY_MAX, jitter);
    Job {
        state: if dead { JobState::Dead } else { JobState::Queued },
        run_after: if dead { job.run_after } else { now + delay.to_chrono() },
        lease_token: None,
        lease_expires_at: None,
        last_error: Some(error.chars().take(2000).collect()),
        finished_at: dead.then_some(now),
        ..job.clone()
    }
}

/// J3: an expired lease counts as a failed attempt (so a poison job cannot loop forever) and
/// is counted as a rescue.
///
/// E17: a job whose run never began (claimed ahead by a pool that crashed before giving it a
/// slot) keeps its attempt: it goes back to the queue as if never claimed, due now.
pub fn plan_rescue(job: &Job, now: Ts, jitter: f64) -> Job {
    let owner = job.lease_owner.clone().unwrap_or_default();
    let expired = job.lease_expires_at.map_or_else(|| "an unknown time".into(), |t| t.to_rfc3339());
    if !began(job) {
        let why = format!("lease of {owner} expired at {expired} before its run began; the attempt is not spent");
        return Job { rescues: job.rescues + 1, last_error: Some(why), run_after: now, ..plan_release(job) };
    }
    let failed = plan_failure(job, &format!("lease of {owner} expired at {expired}"), now, jitter);
    Job { rescues: job.rescues + 1, ..failed }
}

/// J1 (shell side): the row a claim writes. `attempts` counts claims, so a crash mid-run
/// still used an attempt.
pub fn plan_claim(job: &Job, owner: &LeaseOwner, token: &str, lease: Dur, now: Ts) -> Job {
    Job {
        state: JobState::Running,
        attempts: job.attempts + 1,
        lease_owner: Some(owner.to_string()),
        lease_token: Some(token.to_string()),
        lease_expires_at: Some(now + lease.to_chrono()),
        heartbeat_at: Some(now),
        ..job.clone()
    }
}

/// T12: whose unique keys a job's key is weighed against — its enqueuer's own (the admin and
/// the server's ledger share one scope), or, between two queues whose pools both declare
/// `sharedUniqueKeys`, everyone's (a shared queue never reaches into one that is not).
pub fn shares_unique_key(holder: &Job, job: &Job, both_shared: bool) -> bool {
    holder.unique_key.is_some()
        && holder.unique_key == job.unique_key
        && (both_shared || holder.enqueued_by == job.enqueued_by)
}

/// Whether the pool serving `queue` shares its unique keys across machines (T12).
pub fn shared_unique_keys(pools: &[(String, WorkerPoolSpec)], queue: &str) -> bool {
    pools.iter().any(|(_, p)| p.shared_unique_keys && p.queues.iter().any(|q| q == queue))
}

/// How one incoming job weighs the holders of its key: whether its queue shares keys across
/// machines (T12) and how long a finished holder still holds it (E12).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyTerms {
    pub shared: bool,
    pub unique_for: Option<Dur>,
}

impl KeyTerms {
    /// The terms of a job for `queue` that asked for `unique_for` (its pool's when it did not).
    pub fn of(pools: &[(String, WorkerPoolSpec)], queue: &str, unique_for: Option<Dur>) -> KeyTerms {
        let pool = pools.iter().find(|(_, p)| p.queues.iter().any(|q| q == queue)).map(|(_, p)| p);
        KeyTerms {
            shared: shared_unique_keys(pools, queue),
            unique_for: unique_for.or_else(|| pool.and_then(|p| p.unique_for)),
        }
    }
}

/// E12: a job holds its key while live, and once finished for `unique_for` after it finished.
pub fn still_holds(holder: &Job, unique_for: Option<Dur>, now: Ts) -> bool {
    holder.state.is_live() || unique_for.zip(holder.finished_at).is_some_and(|(d, at)| now <= at + d.to_chrono())
}

/// J6/T12/E12 for a batch, in order: a job whose unique key a job of its scope still holds
/// (one already stored, or an earlier job of the same batch) is answered with that holder and
/// not written; the rest are written. `terms` says how each incoming job weighs holders.
/// Answers `(writes, [(job, created)])`, the answers in the batch's order.
pub fn plan_enqueue(
    stored: Vec<Job>,
    incoming: Vec<Job>,
    terms: impl Fn(&Job) -> KeyTerms,
    now: Ts,
) -> (Vec<Job>, Vec<(Job, bool)>) {
    let mut holders: Vec<Job> = stored.into_iter().filter(|j| j.unique_key.is_some()).collect();
    let mut writes = Vec::with_capacity(incoming.len());
    let mut answers = Vec::with_capacity(incoming.len());
    for job in incoming {
        let t = terms(&job);
        let holds =
            |h: &&Job| shares_unique_key(h, &job, t.shared && terms(h).shared) && still_holds(h, t.unique_for, now);
        match holders.iter().find(holds) {
            Some(holder) => answers.push((holder.clone(), false)),
            None => {
                if job.unique_key.is_some() {
                    holders.push(job.clone());
                }
                writes.push(job.clone());
                answers.push((job, true));
            }
        }
    }
    (writes, answers)
}

/// A claim handed back unstarted (a pool that shrank or stops): queued again as if never
/// claimed, so the attempt it counted is returned.
pub fn plan_release(job: &Job) -> Job {
    Job {
        state: JobState::Queued,
        attempts: job.attempts.saturating_sub(1),
        lease_owner: None,
        lease_token: None,
        lease_expires_at: None,
        heartbeat_at: None,
        ..job.clone()
    }
}

/// What a lease holder reports about its job.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Heartbeat {
        lease: Dur,
    },
    Complete {
        result: String,
    },
    Fail {
        error: String,
    },
    /// A pool hands back a claim it did not start (J5: it shrank or stops), or a run cut by
    /// `serve`'s shutdown (E17): either way without spending the attempt.
    Release,
    /// E17: a pool's run of a job claimed ahead begins: from now on a rescue spends its attempt.
    Start,
}

/// A job's result is kept to this many characters.
pub const MAX_RESULT_CHARS: usize = 20_000;

/// Why a report changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportRefusal {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("{0} (the WorkerPool's maxLease)")]
    LeaseOutOfRange(bounds::OutOfRange),
}

/// J2–J5: the job after `report` from `actor` holding `token`: the lease check (T1), then its
/// move. A heartbeat extends the lease by what the worker asks, within the `maxLease` of the
/// pools that let it claim (the server's own pool keeps the lease it claimed with); a
/// completion keeps a result cleaned of refused characters (T6), cut to [`MAX_RESULT_CHARS`].
pub fn plan_report(
    job: &Job,
    token: &str,
    actor: Actor<'_>,
    report: Report,
    pools: &[(String, WorkerPoolSpec)],
    now: Ts,
    jitter: f64,
) -> Result<Job, ReportRefusal> {
    check_lease(job, token, actor)?;
    Ok(match report {
        Report::Heartbeat { lease } => {
            if actor != Actor::Pool {
                let max = claim_terms(pools, &job.queue, actor).unwrap_or(bounds::MIN_LEASE);
                bounds::duration("lease", lease, bounds::MIN_LEASE, max).map_err(ReportRefusal::LeaseOutOfRange)?;
            }
            Job { heartbeat_at: Some(now), lease_expires_at: Some(now + lease.to_chrono()), ..job.clone() }
        }
        Report::Complete { result } => Job {
            state: JobState::Succeeded,
            result: Some(sanitize(&result).chars().take(MAX_RESULT_CHARS).collect()),
            finished_at: Some(now),
            lease_token: None,
            lease_expires_at: None,
            ..job.clone()
        },
        Report::Fail { error } => plan_failure(job, &sanitize(&error), now, jitter),
        Report::Release => plan_release(job),
        Report::Start => Job {
            // An owner this build did not write is kept as it is: check_lease refused it anyway.
            lease_owner: job.owner().map(|o| o.started().to_string()).or_else(|| job.lease_owner.clone()),
            heartbeat_at: Some(now),
            ..job.clone()
        },
    })
}

/// A person's retry (a dead, failed or cancelled job runs again from zero attempts, now) or
/// cancel (of a job not yet ended; a running one loses its lease, so its worker's answer is
/// refused). Anything else is refused, saying why.
pub fn plan_admin_move(job: &Job, retry: bool, now: Ts) -> Result<Job, RefusedMove> {
    match (retry, job.state) {
        (true, JobState::Dead | JobState::Failed | JobState::Cancelled) => {
            Ok(Job { state: JobState::Queued, attempts: 0, run_after: now, finished_at: None, ..job.clone() })
        }
        (false, JobState::Queued | JobState::Failed | JobState::Running) => Ok(Job {
            state: JobState::Cancelled,
            lease_token: None,
            lease_expires_at: None,
            finished_at: Some(now),
            ..job.clone()
        }),
        (_, state) => Err(RefusedMove { state, retry }),
    }
}

/// A retry or cancel the job's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {state} job cannot be {}", if *.retry { "retried" } else { "cancelled" })]
pub struct RefusedMove {
    pub state: JobState,
    pub retry: bool,
}

/// E13: what a job's lease is seen by on a store without a clock of its own: its token and the
/// two stamps a claim or heartbeat writes. Any of them changing is the lease changing.
pub type LeaseSeen = (Option<String>, Option<Ts>, Option<Ts>);

/// E13 (SQLite): which of the `running` jobs' leases have run out, each judged by how long it
/// has stood unchanged on the monotonic clock against its length (last heartbeat or claim to
/// expiry, as its holder wrote them), never by the wall clock that stamped it. Answers them and
/// the sightings to keep, one per running job (jobs no longer running are forgotten). A job
/// first seen now has its whole length left, so after a restart a lease stamped hours ahead
/// runs out one length later, not hours later.
pub fn expired_by_sight(
    running: Vec<Job>,
    mut last: std::collections::HashMap<String, crate::lease::Sighting<LeaseSeen>>,
    mono: std::time::Duration,
) -> (Vec<Job>, std::collections::HashMap<String, crate::lease::Sighting<LeaseSeen>>) {
    let mut kept = std::collections::HashMap::with_capacity(running.len());
    let mut expired = Vec::new();
    for job in running.into_iter().filter(|j| j.state == JobState::Running) {
        let seen = (job.lease_token.clone(), job.heartbeat_at, job.lease_expires_at);
        let sighting = crate::lease::sight(last.remove(&job.id), seen, mono);
        let length = match (job.heartbeat_at, job.lease_expires_at) {
            (Some(beat), Some(until)) => (until - beat).max(chrono::TimeDelta::zero()),
            _ => chrono::TimeDelta::zero(),
        };
        if crate::lease::left(length, sighting.since, mono) <= chrono::TimeDelta::zero() {
            expired.push(job.clone());
        }
        kept.insert(job.id, sighting);
    }
    (expired, kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    #[test]
    fn e13_a_job_lease_runs_out_by_the_monotonic_clock_whatever_the_wall_clock_stamped() {
        let mono = std::time::Duration::from_secs;
        // Claimed by a serve whose clock ran 3 h ahead: a 60 s lease stamped 3 h from now.
        let ahead =
            Job { heartbeat_at: Some(at(3 * 3600)), lease_expires_at: Some(at(3 * 3600 + 60)), ..running(Actor::Pool) };
        let (expired, seen) = expired_by_sight(vec![ahead.clone()], Default::default(), mono(10));
        assert!(expired.is_empty(), "first seen: its whole length is left");
        let (expired, seen) = expired_by_sight(vec![ahead.clone()], seen, mono(69));
        assert!(expired.is_empty());
        let (expired, seen) = expired_by_sight(vec![ahead.clone()], seen, mono(70));
        assert_eq!(expired.len(), 1, "rescued one length after it was first seen, not 3 h later");
        // A heartbeat (stamped on any clock) is a change: the lease lives on.
        let beat = Job { heartbeat_at: Some(at(-50)), lease_expires_at: Some(at(10)), ..ahead };
        let (expired, seen) = expired_by_sight(vec![beat.clone()], seen, mono(71));
        assert!(expired.is_empty());
        let (_, seen) = expired_by_sight(vec![], seen, mono(72));
        assert!(seen.is_empty(), "a job no longer running is forgotten");
    }

    fn pool_p() -> LeaseOwner {
        LeaseOwner::of(Actor::Pool, "p")
    }

    fn pc_w() -> LeaseOwner {
        LeaseOwner::of(Actor::Machine("pc"), "w")
    }

    pub fn job() -> Job {
        Job::new("job-1".into(), "default".into(), "f".into(), "{}".into(), at(0))
    }

    fn running(holder: Actor<'_>) -> Job {
        Job {
            state: JobState::Running,
            attempts: 1,
            lease_owner: Some(LeaseOwner::of(holder, "w").to_string()),
            lease_token: Some("tok".into()),
            lease_expires_at: Some(at(60)),
            ..job()
        }
    }

    #[test]
    fn j2_t1_only_the_holder_with_its_token_reports_and_a_stranger_is_told_apart_from_a_late_worker() {
        let job = running(Actor::Machine("pc1"));
        let done = Report::Complete { result: "ok".into() };
        let pc1 = Actor::Machine("pc1");
        let pools = [("p".to_string(), pool(&["default"], &["pc1"], None))];
        let ok = plan_report(&job, "tok", pc1, done.clone(), &pools, at(10), 0.5).expect("holder");
        assert_eq!((ok.state, ok.result.as_deref(), ok.lease_token), (JobState::Succeeded, Some("ok"), None));
        let stranger = plan_report(&job, "tok", Actor::Machine("pc2"), done.clone(), &pools, at(10), 0.5);
        assert_eq!(stranger, Err(ReportRefusal::Lease(LeaseError::NotHolder("job-1".into()))));
        let late = plan_report(&job, "old", pc1, done.clone(), &pools, at(10), 0.5);
        assert_eq!(late, Err(ReportRefusal::Lease(LeaseError::WrongToken("job-1".into()))));
        let ended = Job { state: JobState::Succeeded, ..job };
        assert!(matches!(
            plan_report(&ended, "tok", pc1, done, &pools, at(10), 0.5),
            Err(ReportRefusal::Lease(LeaseError::NotRunning { .. }))
        ));
    }

    #[test]
    fn j2_t5_a_heartbeat_extends_the_lease_within_the_pools_max_lease_and_the_own_pool_keeps_its_own() {
        let job = running(Actor::Machine("pc1"));
        let pools = [("p".to_string(), pool(&["default"], &["pc1"], Some(Dur::from_mins(5))))];
        let beat = |lease| Report::Heartbeat { lease };
        let ok = plan_report(&job, "tok", Actor::Machine("pc1"), beat(Dur::from_mins(5)), &pools, at(10), 0.0)
            .expect("within");
        assert_eq!((ok.heartbeat_at, ok.lease_expires_at), (Some(at(10)), Some(at(10 + 300))));
        let long = plan_report(&job, "tok", Actor::Machine("pc1"), beat(Dur::from_mins(6)), &pools, at(10), 0.0);
        assert!(matches!(&long, Err(ReportRefusal::LeaseOutOfRange(_))), "{long:?}");
        assert!(long.map_err(|e| e.to_string()).unwrap_err().ends_with("(the WorkerPool's maxLease)"));
        let own = running(Actor::Pool);
        let ok = plan_report(&own, "tok", Actor::Pool, beat(Dur::from_hours(2)), &pools, at(10), 0.0).expect("pool");
        assert_eq!(ok.lease_expires_at, Some(at(10 + 7200)));
    }

    #[test]
    fn t6_j4_j5_a_result_is_cleaned_and_cut_a_failure_retries_and_a_release_returns_the_attempt() {
        let job = running(Actor::Pool);
        let long = format!("a\u{202E}{}", "x".repeat(MAX_RESULT_CHARS));
        let done = plan_report(&job, "tok", Actor::Pool, Report::Complete { result: long }, &[], at(1), 0.0)
            .expect("complete");
        let result = done.result.unwrap_or_default();
        assert_eq!(result.chars().count(), MAX_RESULT_CHARS);
        assert!(result.starts_with("a\u{FFFD}"), "{result:?}");
        let failed = plan_report(&job, "tok", Actor::Pool, Report::Fail { error: "boom".into() }, &[], at(1), 0.0)
            .expect("fail");
        assert_eq!((failed.state, failed.last_error.as_deref()), (JobState::Queued, Some("boom")));
        let released = plan_report(&job, "tok", Actor::Pool, Report::Release, &[], at(1), 0.0).expect("release");
        assert_eq!((released.state, released.attempts, released.lease_owner), (JobState::Queued, 0, None));
    }

    #[test]
    fn j4_a_person_retries_an_ended_job_from_zero_and_cancels_only_one_not_yet_ended() {
        let dead = Job { state: JobState::Dead, attempts: 3, finished_at: Some(at(5)), ..job() };
        let again = plan_admin_move(&dead, true, at(9)).expect("retry");
        assert_eq!(
            (again.state, again.attempts, again.run_after, again.finished_at),
            (JobState::Queued, 0, at(9), None)
        );
        let cancelled = plan_admin_move(&running(Actor::Pool), false, at(9)).expect("cancel");
        assert_eq!(
            (cancelled.state, cancelled.lease_token, cancelled.finished_at),
            (JobState::Cancelled, None, Some(at(9)))
        );
        assert_eq!(
            plan_admin_move(&running(Actor::Pool), true, at(9)).map_err(|e| e.to_string()),
            Err("a running job cannot be retried".into())
        );
        let done = Job { state: JobState::Succeeded, ..job() };
        assert_eq!(
            plan_admin_move(&done, false, at(9)).map_err(|e| e.to_string()),
            Err("a succeeded job cannot be cancelled".into())
        );
    }

    #[test]
    fn j6_a_batch_answers_live_holders_and_its_own_earlier_jobs_and_writes_the_rest_once() {
        let keyed = |id: &str, key: Option<&str>| Job {
            unique_key: key.map(String::from),
            ..Job::new(id.into(), "q".into(), "f".into(), "{}".into(), at(0))
        };
        let stored = keyed("job-old", Some("nightly"));
        let batch = vec![
            keyed("job-a", Some("nightly")),
            keyed("job-b", Some("daily")),
            keyed("job-c", None),
            keyed("job-d", Some("daily")),
            keyed("job-e", None),
        ];
        let (writes, answers) = plan_enqueue(vec![stored], batch, |_| KeyTerms::default(), at(0));
        let ids = |jobs: Vec<&Job>| jobs.into_iter().map(|j| j.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(writes.iter().collect()), ["job-b", "job-c", "job-e"]);
        let answered: Vec<(String, bool)> = answers.iter().map(|(j, c)| (j.id.clone(), *c)).collect();
        assert_eq!(
            answered,
            [
                ("job-old".into(), false),
                ("job-b".into(), true),
                ("job-c".into(), true),
                ("job-b".into(), false),
                ("job-e".into(), true)
            ]
        );
    }

    #[test]
    fn t12_a_unique_key_is_scoped_to_its_enqueuer_unless_the_pool_shares_keys() {
        let keyed = |id: &str, by: Option<&str>, queue: &str| Job {
            unique_key: Some("invoice-78".into()),
            enqueued_by: by.map(String::from),
            ..Job::new(id.into(), queue.into(), "f".into(), "{}".into(), at(0))
        };
        let squat = keyed("job-laptop", Some("laptop"), "q");
        let batch = vec![keyed("job-desk", Some("desk"), "q"), keyed("job-desk2", Some("desk"), "q")];
        let own = |_: &Job| KeyTerms::default();
        let (writes, answers) = plan_enqueue(vec![squat.clone()], batch.clone(), own, at(0));
        assert_eq!(writes.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["job-desk"], "desk's own job");
        let answered: Vec<(&str, bool)> = answers.iter().map(|(j, c)| (j.id.as_str(), *c)).collect();
        assert_eq!(answered, [("job-desk", true), ("job-desk", false)], "never laptop's job");
        // The admin and the ledger (no enqueuer) share one scope, apart from every machine.
        let (writes, _) = plan_enqueue(vec![squat.clone()], vec![keyed("job-admin", None, "q")], own, at(0));
        assert_eq!(writes.len(), 1);
        // A pool that shares keys answers desk with laptop's job.
        let shared = |j: &Job| KeyTerms { shared: j.queue != "own", unique_for: None };
        let (writes, answers) = plan_enqueue(vec![squat.clone()], batch, shared, at(0));
        assert!(writes.is_empty());
        assert!(answers.iter().all(|(j, created)| j.id == "job-laptop" && !created));
        // A shared queue never reaches into a queue that does not share (found by a review).
        let private = Job { queue: "own".into(), ..squat };
        let (writes, _) = plan_enqueue(vec![private], vec![keyed("job-desk3", Some("desk"), "q")], shared, at(0));
        assert_eq!(writes.len(), 1, "desk's job on the shared queue is its own");
        let pools = vec![(
            "p".to_string(),
            WorkerPoolSpec { queues: vec!["q".into()], shared_unique_keys: true, ..WorkerPoolSpec::default() },
        )];
        assert!(shared_unique_keys(&pools, "q") && !shared_unique_keys(&pools, "other"));
    }

    #[test]
    fn e12_a_finished_job_holds_its_key_for_unique_for_and_no_longer() {
        let keyed = |id: &str| Job {
            unique_key: Some("invoice-78".into()),
            ..Job::new(id.into(), "q".into(), "f".into(), "{}".into(), at(0))
        };
        let done = Job { state: JobState::Succeeded, finished_at: Some(at(100)), ..keyed("job-done") };
        let hour = |_: &Job| KeyTerms { shared: false, unique_for: Some(Dur::from_hours(1)) };
        let (writes, answers) = plan_enqueue(vec![done.clone()], vec![keyed("job-retry")], hour, at(133));
        assert!(writes.is_empty() && answers[0] == (done.clone(), false), "a retry 33 s later makes no second job");
        let (writes, _) = plan_enqueue(vec![done.clone()], vec![keyed("job-next")], hour, at(100 + 3601));
        assert_eq!(writes.len(), 1, "after uniqueFor the key is free");
        let (writes, _) = plan_enqueue(vec![done], vec![keyed("job-plain")], |_| KeyTerms::default(), at(133));
        assert_eq!(writes.len(), 1, "without uniqueFor only live jobs hold a key (J6)");
    }

    #[test]
    fn j3_a_rescue_says_whose_lease_expired_and_when() {
        let claimed = plan_claim(&job(), &pool_p(), "tok", Dur::from_secs(60), at(1));
        let rescued = plan_rescue(&claimed, at(100), 0.5);
        let expected = format!("lease of pool:p expired at {}", at(61).to_rfc3339());
        assert_eq!(rescued.last_error.as_deref(), Some(expected.as_str()));
        assert_eq!(rescued.rescues, 1);
    }

    #[test]
    fn e17_a_rescued_lease_whose_run_never_began_keeps_its_attempt() {
        let once = Job { max_attempts: 1, ..job() };
        let ahead = plan_claim(&once, &LeaseOwner::claimed_ahead("p"), "tok", Dur::from_secs(60), at(1));
        assert_eq!(ahead.lease_owner.as_deref(), Some("pool:p (claimed ahead)"));
        assert!(!began(&ahead) && check_lease(&ahead, "tok", Actor::Pool).is_ok());
        let rescued = plan_rescue(&ahead, at(100), 0.5);
        assert_eq!(
            (rescued.state, rescued.attempts, rescued.rescues),
            (JobState::Queued, 0, 1),
            "a crash spends nothing"
        );
        assert_eq!((rescued.run_after, rescued.lease_token.as_deref()), (at(100), None));
        assert!(rescued.last_error.as_deref().is_some_and(|e| e.contains("before its run began")), "{rescued:?}");
        // Once started, a rescue spends the attempt: maxAttempts 1 is dead.
        let started = plan_report(&ahead, "tok", Actor::Pool, Report::Start, &[], at(5), 0.5).expect("start");
        assert_eq!((started.lease_owner.as_deref(), started.heartbeat_at), (Some("pool:p"), Some(at(5))));
        assert!(began(&started));
        assert_eq!(plan_rescue(&started, at(100), 0.5).state, JobState::Dead);
        // A machine's claim is its run: it began.
        assert!(began(&plan_claim(
            &once,
            &LeaseOwner::of(Actor::Machine("pc"), "w (claimed ahead)"),
            "t",
            Dur::from_secs(9),
            at(1)
        )));
        let start = plan_report(&ahead, "old", Actor::Pool, Report::Start, &[], at(5), 0.5);
        assert!(matches!(start, Err(ReportRefusal::Lease(LeaseError::WrongToken(_)))), "J2 fences the start");
    }

    #[test]
    fn e17_a_run_cut_by_a_shutdown_is_handed_back_with_its_attempt() {
        let once = Job { max_attempts: 1, ..job() };
        let claimed = plan_claim(&once, &LeaseOwner::claimed_ahead("p"), "tok", Dur::from_secs(60), at(1));
        let running = plan_report(&claimed, "tok", Actor::Pool, Report::Start, &[], at(2), 0.5).expect("start");
        let back = plan_report(&running, "tok", Actor::Pool, Report::Release, &[], at(9), 0.5).expect("release");
        assert_eq!((back.state, back.attempts, back.lease_token.as_deref()), (JobState::Queued, 0, None));
        let again = plan_claim(&back, &pool_p(), "tok2", Dur::from_secs(60), at(20));
        assert_eq!((again.attempts, again.max_attempts), (1, 1), "the next start may still run it");
    }

    #[test]
    fn j5_a_released_claim_is_queued_as_if_never_claimed() {
        let claimed = plan_claim(&job(), &pool_p(), "tok", Dur::from_secs(60), at(1));
        let released = plan_release(&claimed);
        assert_eq!(released, job(), "state, attempts and lease as before the claim");
    }

    #[test]
    fn j2_only_the_current_lease_holder_may_write() {
        let owner = LeaseOwner::of(Actor::Machine("laptop"), "w1");
        let running = plan_claim(&job(), &owner, "tok-a", Dur::from_secs(60), at(1));
        let laptop = Actor::Machine("laptop");
        assert_eq!(check_lease(&running, "tok-a", laptop), Ok(()));
        assert_eq!(check_lease(&running, "tok-b", laptop), Err(LeaseError::WrongToken("job-1".into())));
        let rescued = plan_rescue(&running, at(100), 0.5);
        assert!(matches!(check_lease(&rescued, "tok-a", laptop), Err(LeaseError::NotRunning { .. })));
    }

    #[test]
    fn t1_the_token_is_useless_to_anyone_but_the_claimer() {
        let by_laptop =
            plan_claim(&job(), &LeaseOwner::of(Actor::Machine("laptop"), "w"), "t", Dur::from_secs(9), at(1));
        let by_pool = plan_claim(&job(), &LeaseOwner::of(Actor::Pool, "default#1"), "t", Dur::from_secs(9), at(1));
        let by_admin = plan_claim(&job(), &LeaseOwner::of(Actor::Admin, "w"), "t", Dur::from_secs(9), at(1));
        let not_holder = Err(LeaseError::NotHolder("job-1".into()));
        for actor in [Actor::Machine("desk"), Actor::Admin, Actor::Pool] {
            assert_eq!(check_lease(&by_laptop, "t", actor), not_holder, "{actor:?}");
        }
        for actor in [Actor::Machine("laptop"), Actor::Admin] {
            assert_eq!(check_lease(&by_pool, "t", actor), not_holder, "{actor:?}");
        }
        assert_eq!(check_lease(&by_pool, "t", Actor::Pool), Ok(()));
        assert_eq!(check_lease(&by_admin, "t", Actor::Machine("laptop")), not_holder);
        assert_eq!(check_lease(&by_admin, "t", Actor::Admin), Ok(()));
        // An owner written by an older build is nobody's: only the reaper ends that lease.
        let legacy = Job { lease_owner: Some("worker-pc-123".into()), ..by_admin.clone() };
        for actor in [Actor::Machine("worker-pc-123"), Actor::Admin, Actor::Pool] {
            assert_eq!(check_lease(&legacy, "t", actor), not_holder);
        }
    }

    #[test]
    fn t1_lease_owners_round_trip_and_machines_cannot_pose_as_the_pool_or_the_admin() {
        let owners = [
            (LeaseOwner::of(Actor::Machine("pc-1"), "w/x"), "pc-1/w/x", Actor::Machine("pc-1")),
            (LeaseOwner::of(Actor::Pool, "default#2"), "pool:default#2", Actor::Pool),
            (LeaseOwner::claimed_ahead("default"), "pool:default (claimed ahead)", Actor::Pool),
            (LeaseOwner::of(Actor::Admin, "cli"), "admin:cli", Actor::Admin),
        ];
        for (owner, wire, actor) in owners {
            assert_eq!(owner.to_string(), wire, "the wire text older builds read");
            assert_eq!(LeaseOwner::parse(wire).as_ref(), Some(&owner));
            assert_eq!(owner.actor(), actor);
        }
        assert_eq!(LeaseOwner::claimed_ahead("p").started(), LeaseOwner::of(Actor::Pool, "p"));
        assert!(check_worker_name("worker-host-42").is_ok());
        for bad in ["", "a/b", "a\nb", &"w".repeat(101)] {
            assert!(check_worker_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn t1_an_owner_this_build_did_not_write_is_nobodys() {
        for foreign in ["Desk/w", "nobody", "", "/w", "Pool:p", "ADMIN:x", "desk:w"] {
            assert_eq!(LeaseOwner::parse(foreign), None, "{foreign:?}");
            let job = Job { lease_owner: Some(foreign.into()), ..running(Actor::Admin) };
            assert_eq!(job.owner(), None);
            assert!(began(&job), "a foreign owner's rescue spends its attempt, as before");
        }
    }

    #[test]
    fn t2_a_machine_sees_the_details_of_its_own_jobs_only_and_nobody_sees_a_token_outside_the_claim() {
        let mine = Job { enqueued_by: Some("desk".into()), payload: "secret".into(), ..job() };
        let claimed =
            plan_claim(&mine, &LeaseOwner::of(Actor::Machine("laptop"), "w"), "tok", Dur::from_secs(9), at(1));
        let done = Job { result: Some("r".into()), ..claimed };
        for (actor, sees) in [
            (Actor::Machine("desk"), true),
            (Actor::Machine("laptop"), true),
            (Actor::Machine("builder"), false),
            (Actor::Admin, true),
        ] {
            assert_eq!(may_see(&done, actor), sees, "{actor:?}");
            let shown = redact(done.clone(), actor);
            assert_eq!(shown.lease_token, None, "{actor:?}");
            assert_eq!((shown.payload == "secret", shown.result.is_some()), (sees, sees), "{actor:?}");
            assert_eq!(shown.id, done.id);
        }
    }

    fn pool(queues: &[&str], external: &[&str], max_lease: Option<Dur>) -> WorkerPoolSpec {
        WorkerPoolSpec {
            workers: 0,
            queues: queues.iter().map(|q| q.to_string()).collect(),
            external_workers: external.iter().map(|q| q.to_string()).collect(),
            max_lease,
            ..WorkerPoolSpec::default()
        }
    }

    #[test]
    fn t2_only_a_pools_external_workers_and_the_admin_claim_its_queues() {
        let pools = vec![
            ("a".to_string(), pool(&["q"], &["laptop"], None)),
            ("b".to_string(), pool(&["q", "r"], &["desk"], Some(Dur::from_hours(3)))),
        ];
        assert_eq!(claim_terms(&pools, "q", Actor::Machine("laptop")), Ok(bounds::DEFAULT_MAX_LEASE));
        assert_eq!(claim_terms(&pools, "q", Actor::Machine("desk")), Ok(Dur::from_hours(3)));
        assert_eq!(claim_terms(&pools, "q", Actor::Admin), Ok(Dur::from_hours(3)));
        let refused = claim_terms(&pools, "r", Actor::Machine("laptop")).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "laptop may not claim from queue \"r\": add laptop to externalWorkers of WorkerPool b"
        );
        assert_eq!(claim_terms(&pools, "nope", Actor::Admin), Err(ClaimRefusal::Undeclared("nope".into())));
    }

    #[test]
    fn j3_a_rescue_counts_the_attempt_and_the_rescue_then_dead_after_max_attempts() {
        let mut j = job();
        for n in 1..=3 {
            j = plan_rescue(&plan_claim(&j, &pc_w(), "t", Dur::from_secs(60), at(n)), at(n + 100), 0.0);
            assert_eq!((j.attempts, j.rescues), (n as u32, n as u32));
        }
        assert_eq!(j.state, JobState::Dead);
        assert!(j.lease_token.is_none() && j.finished_at.is_some());
    }

    #[test]
    fn j4_failures_back_off_exponentially_with_jitter_until_dead() {
        assert_eq!(retry_delay(1, Dur::from_secs(1), Dur::from_hours(1), 1.0), Dur::from_secs(1));
        assert_eq!(retry_delay(3, Dur::from_secs(1), Dur::from_hours(1), 1.0), Dur::from_secs(4));
        assert_eq!(
            retry_delay(3, Dur::from_secs(1), Dur::from_hours(1), 0.0),
            Dur::from_secs(2),
            "jitter spreads over the upper half"
        );
        assert_eq!(retry_delay(40, Dur::from_secs(1), Dur::from_hours(1), 1.0), Dur::from_hours(1), "capped");
        let first = plan_failure(&plan_claim(&job(), &pc_w(), "t", Dur::from_secs(60), at(0)), "boom", at(10), 1.0);
        assert_eq!(
            (first.state, first.run_after, first.last_error.as_deref()),
            (JobState::Queued, at(11), Some("boom"))
        );
        let mut j = first;
        for n in 0..2 {
            j = plan_failure(&plan_claim(&j, &pc_w(), "t", Dur::from_secs(60), at(20 + n)), "boom", at(30 + n), 1.0);
        }
        assert_eq!((j.state, j.attempts), (JobState::Dead, 3));
    }

    #[test]
    fn j6_live_states_hold_the_unique_key() {
        assert!(JobState::Queued.is_live() && JobState::Running.is_live());
        assert!(!JobState::Succeeded.is_live() && !JobState::Dead.is_live() && !JobState::Cancelled.is_live());
    }
}
