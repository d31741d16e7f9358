//! The controller's work queue (client-go's workqueue, kube-runtime's scheduler): keys are
//! deduplicated (the earliest requested run wins), one key never runs twice at once (a key
//! added while it runs is run again after), and failures back off per key, exponentially,
//! until a success forgets them.
//!
//! `QueueState` is the pure part and takes the time as an argument; `WorkQueue` wraps it for
//! tasks that wait.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

#[derive(Debug)]
pub struct QueueState<K> {
    waiting: BTreeMap<K, Instant>,
    processing: BTreeSet<K>,
    /// Added while processing: run again when done, no earlier than this.
    again: BTreeMap<K, Instant>,
    failures: BTreeMap<K, u32>,
    base: Duration,
    max: Duration,
}

impl<K: Ord + Clone> QueueState<K> {
    pub fn new(base: Duration, max: Duration) -> Self {
        QueueState {
            waiting: BTreeMap::new(),
            processing: BTreeSet::new(),
            again: BTreeMap::new(),
            failures: BTreeMap::new(),
            base,
            max,
        }
    }

    /// Requests a run of `key` at `due`; an earlier pending request wins.
    pub fn add(&mut self, key: K, due: Instant) {
        let slot = if self.processing.contains(&key) { &mut self.again } else { &mut self.waiting };
        slot.entry(key).and_modify(|t| *t = (*t).min(due)).or_insert(due);
    }

    /// Takes the key due soonest if it is due at `now`.
    pub fn pop(&mut self, now: Instant) -> Option<K> {
        let (key, _) = self.waiting.iter().filter(|(_, due)| **due <= now).min_by_key(|(_, due)| **due)?;
        let key = key.clone();
        self.waiting.remove(&key);
        self.processing.insert(key.clone());
        Some(key)
    }

    pub fn next_due(&self) -> Option<Instant> {
        self.waiting.values().min().copied()
    }

    /// Ends a run: success forgets the key's failures; failure re-adds it after its backoff.
    pub fn done(&mut self, key: &K, ok: bool, now: Instant) {
        self.processing.remove(key);
        if ok {
            self.failures.remove(key);
        } else {
            let n = self.failures.entry(key.clone()).or_default();
            *n += 1;
            let delay = self.base.saturating_mul(1 << (*n - 1).min(20)).min(self.max);
            self.add(key.clone(), now + delay);
        }
        if let Some(due) = self.again.remove(key) {
            self.add(key.clone(), due);
        }
    }

    #[cfg(test)]
    pub fn failures(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }

    /// Keys waiting to run (not those running).
    pub fn depth(&self) -> usize {
        self.waiting.len()
    }
}

#[derive(Clone)]
pub struct WorkQueue<K> {
    state: Arc<Mutex<QueueState<K>>>,
    wake: Arc<Notify>,
}

impl<K: Ord + Clone> WorkQueue<K> {
    pub fn new(base: Duration, max: Duration) -> Self {
        WorkQueue { state: Arc::new(Mutex::new(QueueState::new(base, max))), wake: Arc::new(Notify::new()) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut QueueState<K>) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn add(&self, key: K) {
        self.add_after(key, Duration::ZERO);
    }

    pub fn add_after(&self, key: K, delay: Duration) {
        self.with(|s| s.add(key, Instant::now() + delay));
        self.wake.notify_one();
    }

    pub fn done(&self, key: &K, ok: bool) {
        self.with(|s| s.done(key, ok, Instant::now()));
        self.wake.notify_one();
    }

    pub fn depth(&self) -> usize {
        self.with(|s| s.depth())
    }

    /// Waits for the next due key; None once `shutdown` turns true.
    pub async fn next(&self, shutdown: &mut watch::Receiver<bool>) -> Option<K> {
        loop {
            if *shutdown.borrow() {
                return None;
            }
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let (key, due) = self.with(|s| (s.pop(Instant::now()), s.next_due()));
            if key.is_some() {
                return key;
            }
            let sleep = async {
                match due {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = woken => {}
                _ = sleep => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> QueueState<&'static str> {
        QueueState::new(Duration::from_secs(1), Duration::from_secs(60))
    }

    #[test]
    fn dedup_keeps_the_earlier_request() {
        let t = Instant::now();
        let mut q = q();
        q.add("a", t + Duration::from_secs(10));
        q.add("a", t + Duration::from_secs(2));
        q.add("a", t + Duration::from_secs(5));
        assert_eq!(q.depth(), 1);
        assert_eq!(q.next_due(), Some(t + Duration::from_secs(2)));
        assert_eq!(q.pop(t + Duration::from_secs(1)), None);
        assert_eq!(q.pop(t + Duration::from_secs(2)), Some("a"));
    }

    #[test]
    fn a_key_never_runs_twice_at_once_and_reruns_after_if_added_meanwhile() {
        let t = Instant::now();
        let mut q = q();
        q.add("a", t);
        assert_eq!(q.pop(t), Some("a"));
        q.add("a", t);
        assert_eq!(q.pop(t), None, "still running");
        q.done(&"a", true, t);
        assert_eq!(q.pop(t), Some("a"), "the add made while running runs after");
        q.done(&"a", true, t);
        assert_eq!(q.pop(t), None);
    }

    #[test]
    fn failures_back_off_exponentially_and_success_resets() {
        let t = Instant::now();
        let mut q = q();
        q.add("a", t);
        for (n, expect) in [(1, 1), (2, 2), (3, 4), (4, 8)] {
            let k = q.pop(t + Duration::from_secs(100 * n)).expect("due");
            q.done(&k, false, t + Duration::from_secs(100 * n));
            assert_eq!(q.next_due(), Some(t + Duration::from_secs(100 * n + expect)), "failure {n}");
        }
        assert_eq!(q.failures(&"a"), 4);
        let k = q.pop(t + Duration::from_secs(1000)).expect("due");
        q.done(&k, true, t + Duration::from_secs(1000));
        assert_eq!(q.failures(&"a"), 0);
        assert_eq!(q.depth(), 0);
    }

    #[test]
    fn backoff_is_capped() {
        let t = Instant::now();
        let mut q = q();
        for _ in 0..30 {
            q.add("a", t);
            let k = q.pop(t + Duration::from_secs(10_000)).expect("due");
            q.done(&k, false, t);
        }
        assert_eq!(q.next_due(), Some(t + Duration::from_secs(60)));
    }

    #[tokio::test(start_paused = true)]
    async fn next_waits_for_the_due_time_and_stops_on_shutdown() {
        let wq: WorkQueue<&str> = WorkQueue::new(Duration::from_secs(1), Duration::from_secs(60));
        let (stop, mut rx) = watch::channel(false);
        wq.add_after("later", Duration::from_secs(30));
        let started = Instant::now();
        assert_eq!(wq.next(&mut rx).await, Some("later"));
        assert!(started.elapsed() >= Duration::from_secs(30));
        let waiter = {
            let wq = wq.clone();
            tokio::spawn(async move { wq.next(&mut rx).await })
        };
        tokio::task::yield_now().await;
        stop.send_replace(true);
        assert_eq!(waiter.await.expect("join"), None);
    }
}
