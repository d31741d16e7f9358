//! E2: who to wake when mail moves. A status wait listens to its own mail, a long-poll to its
//! own machine: a commit wakes those waiters and nobody else, so 500 parked waits cost a send
//! nothing. Each key has a generation counter (a `watch` channel): a waiter subscribes before
//! it looks at the store, so a change between its look and its wait is never missed.
//! T15: each caller holds at most `MAX_WAITS_PER_CALLER` waits; a newer one ends its oldest.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pcmail_core::conns::MAX_WAITS_PER_CALLER;
use tokio::sync::{Notify, watch};

/// What a waiter waits for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topic {
    /// New mail for this machine (long-polls).
    Inbox(String),
    /// Any move of this mail (status waits).
    Mail(String),
}

#[derive(Default)]
pub struct Wakeups {
    topics: Mutex<HashMap<Topic, watch::Sender<u64>>>,
    /// T15: each caller's parked waits, oldest first, with the bell that ends one early.
    holds: Mutex<HashMap<String, VecDeque<Place>>>,
    next_hold: AtomicU64,
}

/// One parked wait's number and the bell that ends it early.
type Place = (u64, Arc<Notify>);

/// A caller's place among its parked waits; `ended` fires when a newer wait of the same
/// caller took it (the wait then answers what is there now).
pub struct Hold {
    wakeups: Arc<Wakeups>,
    caller: String,
    id: u64,
    bell: Arc<Notify>,
}

impl Hold {
    pub async fn ended(&self) {
        self.bell.notified().await;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut holds = self.wakeups.holds.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waits) = holds.get_mut(&self.caller) {
            waits.retain(|(id, _)| *id != self.id);
            if waits.is_empty() {
                holds.remove(&self.caller);
            }
        }
    }
}

/// A waiter's hold on its topic; the topic is forgotten when its last waiter goes.
pub struct Subscription {
    wakeups: Arc<Wakeups>,
    topic: Topic,
    rx: Option<watch::Receiver<u64>>,
}

impl Wakeups {
    pub fn subscribe(self: &Arc<Self>, topic: Topic) -> Subscription {
        let mut topics = self.topics.lock().unwrap_or_else(PoisonError::into_inner);
        let rx = topics.entry(topic.clone()).or_insert_with(|| watch::channel(0).0).subscribe();
        Subscription { wakeups: self.clone(), topic, rx: Some(rx) }
    }

    /// T15: a place for one more parked wait of `caller`, ending its oldest past the cap.
    pub fn hold(self: &Arc<Self>, caller: &str) -> Hold {
        let id = self.next_hold.fetch_add(1, Ordering::Relaxed);
        let bell = Arc::new(Notify::new());
        let mut holds = self.holds.lock().unwrap_or_else(PoisonError::into_inner);
        let waits = holds.entry(caller.to_string()).or_default();
        waits.push_back((id, bell.clone()));
        while waits.len() > MAX_WAITS_PER_CALLER {
            if let Some((_, oldest)) = waits.pop_front() {
                // A stored permit: the wait ends even if it is between two looks.
                oldest.notify_one();
            }
        }
        Hold { wakeups: self.clone(), caller: caller.to_string(), id, bell }
    }

    /// Wakes the waiters of `topic`, if it has any.
    pub fn wake(&self, topic: &Topic) {
        if let Some(tx) = self.topics.lock().unwrap_or_else(PoisonError::into_inner).get(topic) {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// Wakes every waiter whose topic `matches` (another replica's change without details, or
    /// announcements that may have been missed).
    pub fn wake_all(&self, matches: impl Fn(&Topic) -> bool) {
        for (topic, tx) in self.topics.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            if matches(topic) {
                tx.send_modify(|g| *g = g.wrapping_add(1));
            }
        }
    }

    /// Topics with waiters now (for tests and the soak run).
    pub fn topics(&self) -> usize {
        self.topics.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Subscription {
    /// Until the topic is woken after the subscription (or the last `changed`) was made.
    pub async fn changed(&mut self) {
        if let Some(rx) = &mut self.rx {
            // The sender lives as long as a subscription to it: this only returns on a wake.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut topics = self.wakeups.topics.lock().unwrap_or_else(PoisonError::into_inner);
        if topics.get(&self.topic).is_some_and(|tx| tx.receiver_count() == 0) {
            topics.remove(&self.topic);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn woken(s: &mut Subscription) -> bool {
        tokio::time::timeout(Duration::from_millis(50), s.changed()).await.is_ok()
    }

    #[tokio::test]
    async fn e2_a_wake_reaches_its_own_topic_only_and_a_topic_is_forgotten_with_its_last_waiter() {
        let w = Arc::new(Wakeups::default());
        let mut mine = w.subscribe(Topic::Mail("mail--00000001".into()));
        let mut other = w.subscribe(Topic::Mail("mail--00000002".into()));
        let mut inbox = w.subscribe(Topic::Inbox("laptop".into()));
        w.wake(&Topic::Mail("mail--00000001".into()));
        assert!(woken(&mut mine).await);
        assert!(!woken(&mut other).await && !woken(&mut inbox).await, "nobody else woke");
        w.wake(&Topic::Mail("mail--00000001".into()));
        w.wake(&Topic::Mail("mail--00000001".into()));
        assert!(woken(&mut mine).await, "a wake before the wait is not missed");
        w.wake_all(|t| matches!(t, Topic::Inbox(_)));
        assert!(woken(&mut inbox).await && !woken(&mut other).await);
        let twice = w.subscribe(Topic::Mail("mail--00000002".into()));
        assert_eq!(w.topics(), 3);
        drop((mine, other));
        assert_eq!(w.topics(), 2, "mail--00000002 still has a waiter");
        drop((twice, inbox));
        assert_eq!(w.topics(), 0);
        w.wake(&Topic::Inbox("laptop".into()));
        assert_eq!(w.topics(), 0, "waking a topic nobody waits on keeps nothing");
    }
}
