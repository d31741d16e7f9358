//! The job queue (DESIGN §8): leases with tokens (J1, J2), rescue of expired leases (J3),
//! retries with exponential backoff and jitter (J4), unique keys (J6). Pure: the store runs
//! the claim as one statement; these decide what a failure, a rescue or an enqueue writes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Ts;
use crate::duration::Dur;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Dead,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Dead,
        JobState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// A job in one of these states holds its uniqueKey (J6).
    pub fn is_live(self) -> bool {
        matches!(self, JobState::Queued | JobState::Running | JobState::Failed)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        JobState::ALL.into_iter().find(|k| k.as_str() == s).ok_or_else(|| {
            format!("unknown job state {s:?}; one of queued, running, succeeded, failed, dead, cancelled")
        })
    }
}

/// One row of the `jobs` tab.
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
    pub run_after: Ts,
    pub lease_owner: Option<String>,
    pub lease_token: Option<String>,
    pub lease_expires_at: Option<Ts>,
    pub heartbeat_at: Option<Ts>,
    pub rescues: u32,
    pub last_error: Option<String>,
    pub result: Option<String>,
    pub unique_key: Option<String>,
    pub ledger_ref: Option<String>,
    pub created_at: Ts,
    pub finished_at: Option<Ts>,
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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("job {0} not found")]
    NotFound(String),
    #[error("job {id} is {state}, not running: its lease is over")]
    NotRunning { id: String, state: JobState },
    #[error("job {0}'s lease was taken from this worker (rescued or reclaimed); its result is not recorded")]
    WrongToken(String),
}

/// J2: heartbeat, complete and fail must match (id, leaseToken, running).
pub fn check_lease(job: &Job, token: &str) -> Result<(), LeaseError> {
    if job.state != JobState::Running {
        return Err(LeaseError::NotRunning { id: job.id.clone(), state: job.state });
    }
    if job.lease_token.as_deref() != Some(token) {
        return Err(LeaseError::WrongToken(job.id.clone()));
    }
    Ok(())
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
/// `maxAttempts`. The lease is released either way.
pub fn plan_failure(job: &Job, error: &str, now: Ts, jitter: f64) -> Job {
    let dead = job.attempts >= job.max_attempts;
    let delay = retry_delay(job.attempts, RETRY_BASE, RETRY_MAX, jitter);
    Job {
        state: if dead { JobState::Dead } else { JobState::Queued },
        run_after: if dead { job.run_after } else { now + delay.to_chrono() },
        lease_owner: None,
        lease_token: None,
        lease_expires_at: None,
        last_error: Some(error.chars().take(2000).collect()),
        finished_at: dead.then_some(now),
        ..job.clone()
    }
}

/// J3: an expired lease counts as a failed attempt (so a poison job cannot loop forever) and
/// is counted as a rescue.
pub fn plan_rescue(job: &Job, now: Ts, jitter: f64) -> Job {
    let owner = job.lease_owner.clone().unwrap_or_default();
    let failed = plan_failure(job, &format!("lease of {owner} expired at {:?}", job.lease_expires_at), now, jitter);
    Job { rescues: job.rescues + 1, ..failed }
}

/// J1 (shell side): the row a claim writes. `attempts` counts claims, so a crash mid-run
/// still used an attempt.
pub fn plan_claim(job: &Job, owner: &str, token: &str, lease: Dur, now: Ts) -> Job {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    pub fn job() -> Job {
        Job::new("job-1".into(), "default".into(), "f".into(), "{}".into(), at(0))
    }

    #[test]
    fn j2_only_the_current_lease_holder_may_write() {
        let running = plan_claim(&job(), "w1", "tok-a", Dur::from_secs(60), at(1));
        assert_eq!(check_lease(&running, "tok-a"), Ok(()));
        assert_eq!(check_lease(&running, "tok-b"), Err(LeaseError::WrongToken("job-1".into())));
        let rescued = plan_rescue(&running, at(100), 0.5);
        assert!(matches!(check_lease(&rescued, "tok-a"), Err(LeaseError::NotRunning { .. })));
    }

    #[test]
    fn j3_a_rescue_counts_the_attempt_and_the_rescue_then_dead_after_max_attempts() {
        let mut j = job();
        for n in 1..=3 {
            j = plan_rescue(&plan_claim(&j, "w", "t", Dur::from_secs(60), at(n)), at(n + 100), 0.0);
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
        let first = plan_failure(&plan_claim(&job(), "w", "t", Dur::from_secs(60), at(0)), "boom", at(10), 1.0);
        assert_eq!(
            (first.state, first.run_after, first.last_error.as_deref()),
            (JobState::Queued, at(11), Some("boom"))
        );
        let mut j = first;
        for n in 0..2 {
            j = plan_failure(&plan_claim(&j, "w", "t", Dur::from_secs(60), at(20 + n)), "boom", at(30 + n), 1.0);
        }
        assert_eq!((j.state, j.attempts), (JobState::Dead, 3));
    }

    #[test]
    fn j6_live_states_hold_the_unique_key() {
        assert!(JobState::Queued.is_live() && JobState::Running.is_live());
        assert!(!JobState::Succeeded.is_live() && !JobState::Dead.is_live() && !JobState::Cancelled.is_live());
    }
}
