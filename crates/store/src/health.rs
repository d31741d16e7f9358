//! E15: what the store's writes have met, kept in memory so it answers while the store does
//! not. Every write failure is counted by [`WriteReason`]; a write refused for want of space
//! marks the store *refusing* until a write succeeds again (a while after the last refusal); an unreachable store (a database
//! down, a connection lost) is *unreachable* until a call succeeds: a write, when a write was
//! what failed (a read-only file system or standby answers reads while it takes no write).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::StoreError;

pcmail_core::wire_enum! {
    /// Why a store write failed: the `reason` of `pcmail_store_write_errors_total` (a closed set).
    pub enum WriteReason as "write failure reason" {
        /// Refused for space: SQLite's `SQLITE_FULL`, PostgreSQL's `53100 disk_full`, `ENOSPC`.
        NoSpace = "no_space",
        /// The store could not be reached or is read-only, shutting down or failing (a 503).
        Unavailable = "unavailable",
        /// Anything else (a constraint, a corrupt row, a bug).
        Other = "other",
    }
}

impl WriteReason {
    pub fn of(e: &StoreError) -> WriteReason {
        match e {
            StoreError::NoSpace(_) => WriteReason::NoSpace,
            StoreError::Unavailable(_) => WriteReason::Unavailable,
            _ => WriteReason::Other,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The in-memory record of one store's health, shared by every clone of the store.
#[derive(Debug, Default)]
pub struct WriteHealth {
    failed: [AtomicU64; 3],
    /// The last refusal for space and when it came, until a write succeeds
    /// [`pcmail_core::health::ROOM_BACK_AFTER`] later.
    refusing: Mutex<Option<(String, Instant)>>,
    /// The last failure to reach the store, and whether a write met it (then only a write
    /// that succeeds ends it), until a call succeeds.
    unreachable: Mutex<Option<(String, bool)>>,
}

impl WriteHealth {
    /// Records how a call ended; `write` says whether it was one that writes.
    pub fn observe<T>(&self, result: &Result<T, StoreError>, write: bool) {
        self.observe_at(result, write, Instant::now());
    }

    fn observe_at<T>(&self, result: &Result<T, StoreError>, write: bool, now: Instant) {
        match result {
            Ok(_) => {
                if write {
                    let mut refusing = self.refusing.lock().unwrap_or_else(PoisonError::into_inner);
                    let back = refusing
                        .as_ref()
                        .is_some_and(|(_, at)| pcmail_core::health::room_is_back(now.saturating_duration_since(*at)));
                    if back {
                        *refusing = None;
                    }
                }
                let mut unreachable = self.unreachable.lock().unwrap_or_else(PoisonError::into_inner);
                if write || unreachable.as_ref().is_some_and(|(_, by_write)| !by_write) {
                    *unreachable = None;
                }
            }
            Err(e) => {
                let reason = WriteReason::of(e);
                if write {
                    self.failed[reason.index()].fetch_add(1, Ordering::Relaxed);
                }
                match e {
                    StoreError::NoSpace(why) => {
                        *self.refusing.lock().unwrap_or_else(PoisonError::into_inner) = Some((why.clone(), now));
                    }
                    StoreError::Unavailable(why) => {
                        let mut unreachable = self.unreachable.lock().unwrap_or_else(PoisonError::into_inner);
                        let by_write = write || unreachable.as_ref().is_some_and(|(_, by_write)| *by_write);
                        *unreachable = Some((why.clone(), by_write));
                    }
                    _ => {}
                }
            }
        }
    }

    /// Write failures counted for `reason` since the store was opened.
    pub fn failed(&self, reason: WriteReason) -> u64 {
        self.failed[reason.index()].load(Ordering::Relaxed)
    }

    /// Why the store refuses writes for want of space right now, if it does.
    pub fn refusing(&self) -> Option<String> {
        self.refusing.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|(why, _)| why.clone())
    }

    /// Why the store could not be reached, if it still cannot (as far as its calls since say).
    pub fn unreachable(&self) -> Option<String> {
        self.unreachable.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|(why, _)| why.clone())
    }
}

/// An I/O error as a store error: `ENOSPC` is a refusal for space (E15), anything else an
/// outage.
pub fn io_error(context: &str, e: &std::io::Error) -> StoreError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        StoreError::NoSpace(format!("{context}: {e}"))
    } else {
        StoreError::Unavailable(format!("{context}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e15_a_write_that_could_not_reach_the_store_is_over_when_a_write_succeeds_not_a_read() {
        let h = WriteHealth::default();
        let now = Instant::now();
        let away = || Err::<(), _>(StoreError::Unavailable("attempt to write a readonly database".into()));
        h.observe_at(&away(), true, now);
        h.observe_at(&Ok(()), false, now);
        assert!(h.unreachable().is_some(), "reads answer while writes cannot: still unreachable");
        h.observe_at(&away(), false, now);
        h.observe_at(&Ok(()), false, now);
        assert!(h.unreachable().is_some(), "a failed read meanwhile does not forget the write");
        h.observe_at(&Ok(()), true, now);
        assert_eq!(h.unreachable(), None);
        // Met by a read only, any call that succeeds ends it.
        h.observe_at(&away(), false, now);
        h.observe_at(&Ok(()), false, now);
        assert_eq!(h.unreachable(), None);
    }

    #[test]
    fn e15_a_refusal_for_space_lasts_until_a_write_succeeds_and_is_counted_by_reason() {
        let h = WriteHealth::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        let full: Result<(), _> = Err(StoreError::NoSpace("database or disk is full".into()));
        h.observe_at(&full, true, at(0));
        h.observe_at(&full, true, at(1));
        assert_eq!(h.failed(WriteReason::NoSpace), 2);
        assert!(h.refusing().is_some_and(|m| m.contains("full")));
        h.observe_at(&Ok(()), false, at(10));
        assert!(h.refusing().is_some(), "a read that succeeds says nothing about space");
        h.observe_at(&Ok(()), true, at(2));
        assert!(h.refusing().is_some(), "a small write just after a refusal may fit where a send did not");
        h.observe_at(&Err::<(), _>(StoreError::Unavailable("connection refused".into())), true, at(3));
        assert_eq!((h.failed(WriteReason::Unavailable), h.failed(WriteReason::Other)), (1, 0));
        assert!(h.unreachable().is_some());
        h.observe_at(&Ok(()), true, at(6));
        assert_eq!((h.refusing(), h.unreachable()), (None, None));
    }

    #[test]
    fn e15_enospc_is_a_refusal_for_space() {
        let e = std::io::Error::from_raw_os_error(28);
        assert!(matches!(io_error("writing", &e), StoreError::NoSpace(_)), "{e:?}");
        let other = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(matches!(io_error("writing", &other), StoreError::Unavailable(_)));
    }
}
