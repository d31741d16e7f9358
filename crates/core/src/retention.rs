//! E7: how long history is kept. Closed mail (`MailPolicy.retention`, 90 days), finished jobs
//! (their WorkerPool's `retention`, 7 days), events and settled alerts
//! (`MailPolicy.eventRetention`, 30 days) are pruned once older than their cutoff, so a store
//! under steady load stays bounded. Live things are never pruned: open mail, queued or running
//! jobs, firing alerts, and an alert whose latest state was not posted yet.

use std::collections::BTreeMap;

use crate::Ts;
use crate::duration::Dur;
use crate::manifest::spec::{MailPolicySpec, WorkerPoolSpec};

/// Finished jobs of a queue no WorkerPool declares are kept this long, or as long as the
/// longest retention a pool names.
pub const DEFAULT_JOB_RETENTION: Dur = Dur::from_hours(24 * 7);

/// What is old enough to go, as of one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cutoffs {
    /// Done, failed and expired mail closed before this.
    pub closed_mail: Ts,
    /// Events, and alerts resolved (or notices posted) before this.
    pub history: Ts,
    /// Finished jobs of each declared queue; a queue two pools declare keeps its jobs as long as
    /// the longer retention says.
    pub jobs: BTreeMap<String, Ts>,
    /// Finished jobs of any queue, declared or not, that finished before this: past every
    /// retention (the longest, and at least the default).
    pub jobs_anywhere: Ts,
}

pub fn cutoffs(policy: &MailPolicySpec, pools: &[(String, WorkerPoolSpec)], now: Ts) -> Cutoffs {
    let before = |d: Dur| now - d.to_chrono();
    let mut jobs: BTreeMap<String, Ts> = BTreeMap::new();
    for (_, pool) in pools {
        for queue in &pool.queues {
            let cut = before(pool.retention);
            jobs.entry(queue.clone()).and_modify(|t| *t = (*t).min(cut)).or_insert(cut);
        }
    }
    let jobs_anywhere = jobs.values().copied().fold(before(DEFAULT_JOB_RETENTION), Ts::min);
    Cutoffs { closed_mail: before(policy.retention), history: before(policy.event_retention), jobs, jobs_anywhere }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    #[test]
    fn e7_each_tab_is_cut_at_its_own_retention_and_a_shared_queue_keeps_the_longer() {
        let policy = MailPolicySpec::default();
        let pool = |queues: &[&str], days: u64| WorkerPoolSpec {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            retention: Dur::from_hours(24 * days),
            ..WorkerPoolSpec::default()
        };
        let pools = vec![("a".to_string(), pool(&["q", "shared"], 1)), ("b".to_string(), pool(&["shared"], 3))];
        let now = at(100 * 86_400);
        let c = cutoffs(&policy, &pools, now);
        assert_eq!(c.closed_mail, at(10 * 86_400), "90 days of closed mail");
        assert_eq!(c.history, at(70 * 86_400), "30 days of events and settled alerts");
        assert_eq!(c.jobs.get("q"), Some(&at(99 * 86_400)));
        assert_eq!(c.jobs.get("shared"), Some(&at(97 * 86_400)), "the longer retention wins");
        assert_eq!(c.jobs_anywhere, at(93 * 86_400), "7 days for a queue nobody declares");
        let long = vec![("c".to_string(), pool(&["archive"], 30))];
        assert_eq!(cutoffs(&policy, &long, now).jobs_anywhere, at(70 * 86_400), "past the longest retention");
    }
}
