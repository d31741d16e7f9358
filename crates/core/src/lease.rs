//! C1: with several controller replicas on one store, exactly one holds the leader lease and runs
//! the sweeps, the schedules and the reaper; every replica serves the API and runs workers.
//!
//! The lease is one row (holder, renewed at, expires at) that a replica takes when it is free or
//! expired and renews while it holds it. `now` is the store's clock, not the replica's, so two
//! replicas whose clocks disagree still agree on when a lease ran out.
//!
//! E13: a store with no clock of its own (SQLite: the process's wall clock, which an NTP step or
//! a VM restore moves) judges a lease by [`Sighting`]s instead: a lease lasts its length from
//! the moment this process first saw it as it is, on the monotonic clock, so a wall-clock step
//! can neither hold a dead holder's lease nor break a live one.

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

/// E13: the store's clock now, from one reading of it (`read`) carried forward by the time the
/// monotonic clock measured since (`since_read`): job leases are stamped on it, so a step of
/// this replica's wall clock moves none of them, and a replica whose clock is off stamps what
/// the others would. At the stores' millisecond.
pub fn on_store_clock(read: Ts, since_read: std::time::Duration) -> Ts {
    let now = read + chrono::TimeDelta::from_std(since_read).unwrap_or(chrono::TimeDelta::MAX);
    chrono::SubsecRound::trunc_subsecs(now, 3)
}

/// E13: something with a lease (a lease row, a job's lease) as this process last saw it, and
/// when it first saw it so, as the monotonic time since any fixed origin of the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting<K> {
    pub seen: K,
    pub since: std::time::Duration,
}

/// E13: the sighting to keep after looking at `seen` at monotonic time `mono`: the old one while
/// nothing changed, a new one from `mono` when anything did.
pub fn sight<K: PartialEq>(last: Option<Sighting<K>>, seen: K, mono: std::time::Duration) -> Sighting<K> {
    match last {
        Some(s) if s.seen == seen && s.since <= mono => s,
        _ => Sighting { seen, since: mono },
    }
}

/// E13: what is left of a lease of `length` that has stood unchanged since `since` (never
/// negative; a lease with no length — a release — has nothing left).
pub fn left(length: chrono::TimeDelta, since: std::time::Duration, mono: std::time::Duration) -> chrono::TimeDelta {
    let elapsed = chrono::TimeDelta::from_std(mono.saturating_sub(since)).unwrap_or(chrono::TimeDelta::MAX);
    (length - elapsed).max(chrono::TimeDelta::zero())
}

/// E13 (a store without a clock of its own): the lease as [`plan_acquire`] should judge it at
/// wall time `now` — its expiry re-timed to `now` plus what is left of its length (renewal to
/// expiry, as its holder wrote it) since this process first saw it unchanged — and the sighting
/// to keep. A row stamped hours ahead by a stepped clock lasts its length, no more; a row
/// stamped behind lasts its length too, so a step forward breaks no live lease.
pub fn as_seen(
    current: Option<Lease>,
    last: Option<Sighting<Lease>>,
    now: Ts,
    mono: std::time::Duration,
) -> (Option<Lease>, Option<Sighting<Lease>>) {
    let Some(lease) = current else { return (None, None) };
    let sighting = sight(last, lease.clone(), mono);
    let length = (lease.expires_at - lease.renewed_at).max(chrono::TimeDelta::zero());
    let judged = Lease { expires_at: now + left(length, sighting.since, mono), ..lease };
    (Some(judged), Some(sighting))
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

    fn mono(s: u64) -> std::time::Duration {
        std::time::Duration::from_secs(s)
    }

    #[test]
    fn e13_a_lease_stamped_hours_ahead_lasts_its_length_from_when_it_was_first_seen() {
        // Written by a holder whose clock ran 3 h ahead, then killed; the clock is back.
        let ahead = held_by("a", 3 * 3600, 3 * 3600 + 15);
        let (seen, sighting) = as_seen(Some(ahead.clone()), None, t(0), mono(100));
        let (write, _) = plan_acquire(seen.as_ref(), CONTROLLER, "b", t(0), D);
        assert_eq!(write, None, "first seen now: it has its whole length left");
        let (seen, sighting) = as_seen(Some(ahead.clone()), sighting, t(14), mono(114));
        assert_eq!(plan_acquire(seen.as_ref(), CONTROLLER, "b", t(14), D).0, None);
        let (seen, _) = as_seen(Some(ahead), sighting, t(15), mono(115));
        let (write, who) = plan_acquire(seen.as_ref(), CONTROLLER, "b", t(15), D);
        assert_eq!(write.map(|l| l.holder), Some("b".to_string()), "taken one length after it was first seen");
        assert!(matches!(who, Leadership::Leading { .. }));
    }

    #[test]
    fn e13_a_wall_step_forward_breaks_no_lease_that_keeps_changing() {
        let live = held_by("a", 0, 15);
        let (_, sighting) = as_seen(Some(live.clone()), None, t(0), mono(0));
        // The wall clock jumps 3 h ahead 5 s later: judged by the monotonic clock, 10 s are left.
        let (seen, sighting) = as_seen(Some(live), sighting, t(5 + 3 * 3600), mono(5));
        assert_eq!(seen.as_ref().map(|l| l.expires_at), Some(t(15 + 3 * 3600)));
        assert_eq!(plan_acquire(seen.as_ref(), CONTROLLER, "b", t(5 + 3 * 3600), D).0, None);
        // Renewed (stamped on the stepped clock): a change, so a new sighting with its full length.
        let renewed = held_by("a", 8 + 3 * 3600, 8 + 3 * 3600 + 15);
        let (_, sighting) = as_seen(Some(renewed.clone()), sighting, t(8 + 3 * 3600), mono(8));
        assert_eq!(sighting.map(|s| s.since), Some(mono(8)));
    }

    #[test]
    fn e13_a_step_back_neither_holds_nor_shortens_a_lease() {
        let live = held_by("a", 0, 15);
        let (_, sighting) = as_seen(Some(live.clone()), None, t(0), mono(50));
        // The wall clock steps 70 s back; 16 monotonic seconds later the lease has run out.
        let (seen, _) = as_seen(Some(live), sighting, t(16 - 70), mono(66));
        assert_eq!(seen.map(|l| l.expires_at), Some(t(16 - 70)), "expired, measured on the monotonic clock");
    }

    #[test]
    fn e13_the_store_clock_runs_on_from_its_last_reading_on_the_monotonic_clock() {
        assert_eq!(on_store_clock(t(100), mono(5)), t(105));
        let ms = std::time::Duration::from_micros(1_500);
        assert_eq!(on_store_clock(t(100), ms), t(100) + chrono::TimeDelta::milliseconds(1), "kept to the ms");
    }

    #[test]
    fn e13_a_released_lease_has_nothing_left() {
        let released = Lease { expires_at: t(3), renewed_at: t(3), ..held_by("a", 0, 15) };
        let (seen, _) = as_seen(Some(released), None, t(4), mono(0));
        let (write, _) = plan_acquire(seen.as_ref(), CONTROLLER, "b", t(4), D);
        assert_eq!(write.map(|l| l.holder), Some("b".into()));
        assert_eq!(as_seen(None, None, t(4), mono(0)), (None, None));
    }

    #[test]
    fn c1_attempts_come_three_times_per_duration() {
        assert_eq!(attempt_every(std::time::Duration::from_secs(15)), std::time::Duration::from_secs(5));
    }
}
