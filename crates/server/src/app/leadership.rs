//! C1/E13: this replica's part in the leader lease — its name, the lease's length, until when
//! it leads, and the store's clock job leases are stamped on.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::health::Leading;
use tokio::time::Instant;

pub struct Leadership {
    replica: String,
    lease: Duration,
    /// Until when (local monotonic time) this replica leads.
    leading_until: Mutex<Option<Instant>>,
    /// E18: the leadership last said in the log.
    said_leading: Mutex<bool>,
    /// E13: the store's clock as last read (by a lease attempt), and when on the monotonic clock.
    store_clock: Mutex<Option<(Ts, Instant)>>,
}

impl Leadership {
    pub(super) fn new(replica: String, lease: Duration) -> Leadership {
        Leadership {
            replica,
            lease,
            leading_until: Mutex::new(None),
            said_leading: Mutex::new(false),
            store_clock: Mutex::new(None),
        }
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    pub fn duration(&self) -> Duration {
        self.lease
    }

    /// Whether this replica runs the leader's keys right now.
    pub fn is_leader(&self) -> bool {
        let until = *self.leading_until.lock().unwrap_or_else(PoisonError::into_inner);
        until.is_some_and(|t| Instant::now() < t)
    }

    /// E13: the time job leases are stamped and judged on — the store's clock (PostgreSQL's
    /// `clock_timestamp()`) as the last lease attempt read it, carried on by the monotonic clock;
    /// this process's clock until a first attempt read it.
    pub fn now(&self) -> Ts {
        let read = *self.store_clock.lock().unwrap_or_else(PoisonError::into_inner);
        match read {
            Some((read, at)) => pcmail_core::lease::on_store_clock(read, at.elapsed()),
            None => crate::clock::now(),
        }
    }

    /// E13: a reading of the store's clock, taken at `at`.
    pub fn read_store_clock(&self, read: Ts, at: Instant) {
        *self.store_clock.lock().unwrap_or_else(PoisonError::into_inner) = Some((read, at));
    }

    /// Records the outcome of a lease attempt; answers whether leadership changed.
    pub fn set_leading_until(&self, until: Option<Instant>) -> bool {
        let was = self.is_leader();
        *self.leading_until.lock().unwrap_or_else(PoisonError::into_inner) = until;
        was != self.is_leader()
    }

    /// E18: whether leadership changed since it was last said (and now it is said).
    pub fn change_to_say(&self) -> Option<Leading> {
        let leading = self.is_leader();
        let mut said = self.said_leading.lock().unwrap_or_else(PoisonError::into_inner);
        let change = pcmail_core::health::leadership_change(*said, leading);
        *said = leading;
        change
    }
}
