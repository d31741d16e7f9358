//! C1: with several controller replicas on one store, exactly one holds the leader lease and runs
//! the sweeps, the schedules and the reaper; every replica serves the API and runs workers.
//!
//! The lease is one row (holder, renewed at, expires at) that a replica takes when it is free or
//! expired and renews while it holds it. `now` is the store's clock, not the replica's, so two
//! replicas whose clocks disagree still agree on when a lease ran out.

use serde::{Deserialize, Serialize};

use crate::Ts;

/// The one lease the controller replicas compete for.
pub const CONTROLLER: &str = "controller";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    pub name: String,
    pub holder: String,
    /// When the current holder took it; unchanged by renewals.
    pub acquired_at: Ts,
    pub renewed_at: Ts,
    pub expires_at: Ts,
}

/// What a replica learned from one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// This replica holds the lease until `until` (store time).
    Leading { until: Ts, since: Ts },
    /// Another replica holds it until `until`; try again before then.
    Following { holder: String, until: Ts },
}

/// The lease to write (if any) and what it means for `me`: take a free or expired lease, renew
/// our own, leave a live one of another replica alone.
pub fn plan_acquire(
    current: Option<&Lease>,
    name: &str,
    me: &str,
    now: Ts,
    duration: chrono::TimeDelta,
) -> (Option<Lease>, Leadership) {
    match current {
        Some(l) if l.holder != me && l.expires_at > now => {
            (None, Leadership::Following { holder: l.holder.clone(), until: l.expires_at })
        }
        _ => {
            let acquired_at = match current {
                Some(l) if l.holder == me && l.expires_at > now => l.acquired_at,
                _ => now,
            };
            let lease = Lease {
                name: name.to_string(),
                holder: me.to_string(),
                acquired_at,
                renewed_at: now,
                expires_at: now + duration,
            };
            let leading = Leadership::Leading { until: lease.expires_at, since: acquired_at };
            (Some(lease), leading)
        }
    }
}

/// On a graceful stop the holder expires its own lease, so another replica takes over at its
/// next attempt instead of waiting out the duration. Someone else's lease is left alone.
pub fn plan_release(current: Option<&Lease>, me: &str, now: Ts) -> Option<Lease> {
    current.filter(|l| l.holder == me && l.expires_at > now).map(|l| Lease {
        expires_at: now,
        renewed_at: now,
        ..l.clone()
    })
}

/// How often a replica tries: a holder renews three times per duration, so one lost renewal
/// never costs the lease, and a follower notices an expired lease within a third of one.
pub fn attempt_every(duration: std::time::Duration) -> std::time::Duration {
    duration / 3
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Ts {
        chrono::DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    const D: chrono::TimeDelta = chrono::TimeDelta::seconds(15);

    fn held_by(holder: &str, acquired: i64, expires: i64) -> Lease {
        Lease {
            name: CONTROLLER.into(),
            holder: holder.into(),
            acquired_at: t(acquired),
            renewed_at: t(acquired),
            expires_at: t(expires),
        }
    }

    #[test]
    fn c1_a_free_lease_is_taken() {
        let (write, leadership) = plan_acquire(None, CONTROLLER, "a", t(0), D);
        let lease = write.expect("takes it");
        assert_eq!((lease.holder.as_str(), lease.expires_at), ("a", t(15)));
        assert_eq!(leadership, Leadership::Leading { until: t(15), since: t(0) });
    }

    #[test]
    fn c1_a_live_lease_of_another_replica_is_left_alone() {
        let current = held_by("a", 0, 15);
        let (write, leadership) = plan_acquire(Some(&current), CONTROLLER, "b", t(14), D);
        assert_eq!(write, None);
        assert_eq!(leadership, Leadership::Following { holder: "a".into(), until: t(15) });
    }

    #[test]
    fn c1_an_expired_lease_is_taken_over_at_its_expiry() {
        let current = held_by("a", 0, 15);
        let (write, leadership) = plan_acquire(Some(&current), CONTROLLER, "b", t(15), D);
        assert_eq!(write.map(|l| l.holder), Some("b".to_string()));
        assert_eq!(leadership, Leadership::Leading { until: t(30), since: t(15) });
    }

    #[test]
    fn c1_renewal_keeps_the_acquisition_time_and_extends_expiry() {
        let current = held_by("a", 0, 15);
        let (write, leadership) = plan_acquire(Some(&current), CONTROLLER, "a", t(5), D);
        let lease = write.expect("renews");
        assert_eq!((lease.acquired_at, lease.renewed_at, lease.expires_at), (t(0), t(5), t(20)));
        assert_eq!(leadership, Leadership::Leading { until: t(20), since: t(0) });
    }

    #[test]
    fn c1_a_holder_that_lapsed_starts_a_new_term() {
        // It lost the lease (expired) and nobody took it: taking it again is a new term.
        let current = held_by("a", 0, 15);
        let (write, _) = plan_acquire(Some(&current), CONTROLLER, "a", t(40), D);
        assert_eq!(write.map(|l| l.acquired_at), Some(t(40)));
    }

    #[test]
    fn c1_release_expires_only_our_own_live_lease() {
        let current = held_by("a", 0, 15);
        assert_eq!(plan_release(Some(&current), "a", t(3)).map(|l| l.expires_at), Some(t(3)));
        assert_eq!(plan_release(Some(&current), "b", t(3)), None);
        assert_eq!(plan_release(Some(&current), "a", t(16)), None);
        assert_eq!(plan_release(None, "a", t(3)), None);
    }

    #[test]
    fn c1_attempts_come_three_times_per_duration() {
        assert_eq!(attempt_every(std::time::Duration::from_secs(15)), std::time::Duration::from_secs(5));
    }
}
