//! E2: who to wake when mail moves. A status wait listens to its own mail, a long-poll to its
//! own machine: a commit wakes those waiters and nobody else, so 500 parked waits cost a send
//! nothing. Each key has a generation counter (a `watch` channel): a waiter subscribes before
//! it looks at the store, so a change between its look and its wait is never missed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

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
