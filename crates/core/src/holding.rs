//! E11/E17: what a pool worker of `serve` does with a lease it holds. Its heartbeats, its
//! run's start and its end are retried through a store outage for as long as the lease lives —
//! judged by the lease's own expiry as the worker last extended it — and given up only once it
//! ended; what ends a run when `serve` stops is handed back without spending an attempt.
//!
//! Time here is the worker's monotonic clock, as a `Duration` since an origin the shell picks:
//! a wall-clock step can neither stretch nor cut a lease the worker believes it holds.

use std::time::Duration;

use crate::duration::Dur;
use crate::jobs::Report;

/// A lease as its holder last extended it: it lives until `until` on the worker's monotonic
/// clock. `until` is counted from the moment the worker *asked* (a claim, a heartbeat), so it
/// is never later than the expiry the store wrote: the worker gives up no later than the
/// reaper may rescue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnLease {
    pub until: Duration,
}

impl OwnLease {
    /// The lease a claim or heartbeat asked for at `asked_at`, for `lease`.
    pub fn extended(asked_at: Duration, lease: Dur) -> OwnLease {
        OwnLease { until: asked_at + lease.to_std() }
    }

    /// Whether the lease is still ours at `now`.
    pub fn lives(&self, now: Duration) -> bool {
        now < self.until
    }

    /// The later of two views (a heartbeat that extended it while an end waited).
    pub fn max(self, other: OwnLease) -> OwnLease {
        if other.until > self.until { other } else { self }
    }
}

/// How one try of a lease-checked write went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Written.
    Recorded,
    /// The store answered and refused it (J2: the lease was taken, the job is not running):
    /// repeating cannot change that.
    Refused,
    /// The store did not answer (down, restarting, unreachable): the write may succeed later.
    StoreFailed,
}

/// What to do after a try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing more: written.
    Done,
    /// Try again after this long (never past the lease's end).
    RetryIn(Duration),
    /// The lease is gone — refused by the store, or past its end while the store was away:
    /// the worker stops its run and writes nothing more; the reaper ends the job (J3).
    LeaseEnded,
}

/// The first wait after a failed try; it doubles to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_millis(250);
pub const RETRY_MAX: Duration = Duration::from_secs(5);

/// E11: after the `failures`-th failure in a row (1 for the first), retry while the lease
/// lives — at 250 ms doubling to 5 s, the last try at the lease's very end — and give up only
/// once it ended or the store refused.
pub fn after(attempt: Attempt, failures: u32, lease: OwnLease, now: Duration) -> Next {
    match attempt {
        Attempt::Recorded => Next::Done,
        Attempt::Refused => Next::LeaseEnded,
        Attempt::StoreFailed if !lease.lives(now) => Next::LeaseEnded,
        Attempt::StoreFailed => {
            let backoff = RETRY_FIRST.saturating_mul(1 << failures.saturating_sub(1).min(8)).min(RETRY_MAX);
            Next::RetryIn(backoff.min(lease.until - now))
        }
    }
}

/// E11: of the ends waiting to be written while the store is away, those whose lease still
/// lives are kept; the others are dropped (their jobs are the reaper's now).
pub fn still_held<T>(waiting: Vec<(T, OwnLease)>, now: Duration) -> (Vec<(T, OwnLease)>, Vec<T>) {
    let (kept, ended): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|(_, l)| l.lives(now));
    (kept, ended.into_iter().map(|(t, _)| t).collect())
}

/// How a pool's run of a job came to an end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// The Function succeeded: its stdout.
    Succeeded(String),
    /// The Function failed (or could not start): why, as the job records it.
    Failed(String),
    /// Claimed ahead, it never got a slot: the pool shrank to none or `serve` stops.
    NoSlot,
    /// Still running when `serve`'s shutdown grace ran out: its processes were killed.
    CutByShutdown,
    /// Its lease ended under it (taken, or run out while the store was away): it was killed.
    LeaseLost,
}

/// E17/J5: the report a run's end makes. What never started or was cut by a shutdown is
/// handed back unspent (a plain restart never costs an attempt); a lost lease writes nothing.
pub fn report_for(end: RunEnd) -> Option<Report> {
    match end {
        RunEnd::Succeeded(stdout) => Some(Report::Complete { result: stdout.trim().to_string() }),
        RunEnd::Failed(error) => Some(Report::Fail { error }),
        RunEnd::NoSlot | RunEnd::CutByShutdown => Some(Report::Release),
        RunEnd::LeaseLost => None,
    }
}

/// P9: a pool holds at least this many jobs a slot, its running one included, so that a freed
/// slot starts its next at once and claims come in batches.
pub const AHEAD: usize = 3;
/// ... and at most this many, however short its runs.
pub const AHEAD_MOST: usize = 16;
/// Short runs fill a slot's reserve up to what the slot starts within this time.
pub const HORIZON: Duration = Duration::from_millis(20);

/// P9: how many jobs a pool of `slots` holds at once, its running ones included: [`AHEAD`] a
/// slot, or for runs as short as `typical` what a slot starts within [`HORIZON`], up to
/// [`AHEAD_MOST`]. A claim and its commit then serve dozens of short runs, while a job claimed
/// ahead of long runs waits no longer than it did (two runs), and no job waits claimed much
/// longer than the horizon behind short ones.
pub fn jobs_to_hold(slots: usize, typical: Option<Duration>) -> usize {
    let per_slot = match typical {
        Some(run) if !run.is_zero() => usize::try_from(HORIZON.as_nanos() / run.as_nanos()).unwrap_or(usize::MAX),
        _ => AHEAD,
    };
    slots.saturating_mul(per_slot.clamp(AHEAD, AHEAD_MOST))
}

/// P9: how many jobs a pool of `slots` holding `in_flight` (running and waiting) claims now,
/// to hold `hold` ([`jobs_to_hold`]): none until its reserve ahead of the slots is down to
/// half, then back up to `hold`. The claim, and its commit, then run while jobs still wait for
/// the slots, not while slots wait for the claim (a refill at an empty reserve left the
/// machine idle a tenth of a drain).
pub fn to_claim(slots: usize, in_flight: usize, hold: usize) -> usize {
    let low = slots.saturating_add(hold.saturating_sub(slots) / 2);
    if in_flight <= low { hold.saturating_sub(in_flight) } else { 0 }
}

/// J2/E17: how long a job claimed ahead may wait for its slot and still start on its claim
/// alone. Past it, its row is read again first: cancelled or rescued meanwhile, it never
/// starts. Within it no rescue can come (a lease is at least [`crate::bounds::MIN_LEASE`]),
/// and it starts as a job given its slot at its claim does: a cancel that lands
/// meanwhile finds it running, and it is stopped at its next heartbeat (its lease gone) as any
/// running job is. P9: a pool of short runs holds what it starts within [`HORIZON`], so its
/// jobs start without a read a job (a tenth of its time).
pub const FRESH: Duration = Duration::from_millis(50);

/// Whether a job claimed at `claimed` (when the claim was asked) is read again before it
/// starts at `now` ([`FRESH`]).
pub fn read_again_before_start(claimed: Duration, now: Duration) -> bool {
    now.saturating_sub(claimed) > FRESH
}

/// A pool's typical run: the mean of its recent runs' wall times, the latest weighing an
/// eighth, so one slow run moves it little and a change of Function is followed in a few dozen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypicalRun(Option<Duration>);

impl TypicalRun {
    pub fn note(&mut self, run: Duration) {
        self.0 = Some(match self.0 {
            None => run,
            Some(typical) => (typical * 7 + run) / 8,
        });
    }

    pub fn get(self) -> Option<Duration> {
        self.0
    }
}

/// Whether a store outage is news: said once when it begins and once when it ends, never per
/// retry. Answers the line to log, if any, and the new state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outage {
    pub down_since: Option<Duration>,
}

/// What an [`Outage`] says on a try's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageNews {
    Began,
    /// The store answered again after this long.
    Ended(Duration),
}

impl Outage {
    pub fn note(&mut self, store_answered: bool, now: Duration) -> Option<OutageNews> {
        match (self.down_since, store_answered) {
            (None, false) => {
                self.down_since = Some(now);
                Some(OutageNews::Began)
            }
            (Some(since), true) => {
                self.down_since = None;
                Some(OutageNews::Ended(now.saturating_sub(since)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn e11_a_report_is_retried_through_an_outage_while_the_lease_lives() {
        let lease = OwnLease::extended(s(100), Dur::from_secs(60));
        assert_eq!(lease.until, s(160));
        let waits: Vec<Next> = (1..=6).map(|n| after(Attempt::StoreFailed, n, lease, s(110))).collect();
        let ms = |m| Next::RetryIn(Duration::from_millis(m));
        assert_eq!(waits, [ms(250), ms(500), ms(1000), ms(2000), ms(4000), ms(5000)], "doubling to 5 s");
        assert_eq!(after(Attempt::StoreFailed, 40, lease, s(110)), ms(5000), "no overflow");
        // The last try lands at the lease's very end, not after it.
        assert_eq!(after(Attempt::StoreFailed, 9, lease, s(158)), Next::RetryIn(s(2)));
        assert_eq!(after(Attempt::Recorded, 9, lease, s(158)), Next::Done);
    }

    #[test]
    fn e11_a_report_is_given_up_only_once_the_lease_ended_or_the_store_refused_it() {
        let lease = OwnLease::extended(s(100), Dur::from_secs(60));
        assert_eq!(after(Attempt::StoreFailed, 1, lease, s(160)), Next::LeaseEnded, "ended at its expiry");
        assert_eq!(after(Attempt::StoreFailed, 1, lease, s(999)), Next::LeaseEnded);
        assert_eq!(after(Attempt::Refused, 1, lease, s(101)), Next::LeaseEnded, "J2: taken while it lived");
        assert!(lease.lives(s(159)) && !lease.lives(s(160)));
        let later = OwnLease::extended(s(120), Dur::from_secs(60));
        assert_eq!(lease.max(later), later);
        assert_eq!(later.max(lease), later);
    }

    #[test]
    fn e11_a_6s_outage_inside_a_60s_lease_loses_no_heartbeat_and_a_30s_one_loses_no_result() {
        // Heartbeats every 20 s: an outage starts at most 20 s after the last one, so 40 s of
        // the lease are left — more than either outage.
        let lease = OwnLease::extended(s(0), Dur::from_secs(60));
        for (start, length) in [(s(20), s(6)), (s(20), s(30))] {
            let mut now = start;
            let mut failures = 0;
            while now < start + length {
                failures += 1;
                match after(Attempt::StoreFailed, failures, lease, now) {
                    Next::RetryIn(d) => now += d,
                    other => panic!("gave up at {now:?} in a {length:?} outage: {other:?}"),
                }
            }
            assert!(lease.lives(now), "the try after the outage is still within the lease");
        }
    }

    #[test]
    fn e11_ends_whose_lease_ended_are_dropped_the_rest_kept() {
        let waiting =
            vec![("a", OwnLease { until: s(10) }), ("b", OwnLease { until: s(30) }), ("c", OwnLease { until: s(20) })];
        let (kept, dropped) = still_held(waiting, s(20));
        assert_eq!(kept, [("b", OwnLease { until: s(30) })]);
        assert_eq!(dropped, ["a", "c"]);
    }

    #[test]
    fn e17_what_never_started_or_was_cut_by_a_shutdown_is_handed_back_unspent() {
        assert_eq!(report_for(RunEnd::NoSlot), Some(Report::Release));
        assert_eq!(report_for(RunEnd::CutByShutdown), Some(Report::Release));
        assert_eq!(report_for(RunEnd::LeaseLost), None, "a lost lease writes nothing");
        assert_eq!(report_for(RunEnd::Succeeded(" done\n".into())), Some(Report::Complete { result: "done".into() }));
        assert_eq!(report_for(RunEnd::Failed("boom".into())), Some(Report::Fail { error: "boom".into() }));
    }

    #[test]
    fn e11_an_outage_is_news_once_when_it_begins_and_once_when_it_ends() {
        let mut outage = Outage::default();
        assert_eq!(outage.note(true, s(1)), None);
        assert_eq!(outage.note(false, s(2)), Some(OutageNews::Began));
        for t in 3..9 {
            assert_eq!(outage.note(false, s(t)), None, "not per retry");
        }
        assert_eq!(outage.note(true, s(8)), Some(OutageNews::Ended(s(6))));
        assert_eq!(outage.note(true, s(9)), None);
    }

    #[test]
    fn p9_a_pool_holds_three_jobs_a_slot_and_for_short_runs_what_it_starts_within_the_horizon() {
        let ms = Duration::from_millis;
        assert_eq!(jobs_to_hold(4, None), 12, "no run seen yet: three a slot");
        assert_eq!(jobs_to_hold(4, Some(Duration::from_secs(30))), 12, "long runs: three a slot, as ever");
        assert_eq!(jobs_to_hold(4, Some(ms(10))), 12, "two runs within the horizon: still three");
        assert_eq!(jobs_to_hold(4, Some(ms(4))), 20, "five runs a slot within 20 ms");
        assert_eq!(jobs_to_hold(4, Some(Duration::from_micros(1600))), 48, "P9's runs of `true`: twelve");
        assert_eq!(jobs_to_hold(4, Some(Duration::from_micros(10))), 64, "at most sixteen a slot");
        assert_eq!(jobs_to_hold(4, Some(Duration::ZERO)), 12, "a run of no length is not believed");
        assert_eq!(jobs_to_hold(0, Some(ms(1))), 0, "no slots, nothing held");
        assert_eq!(jobs_to_hold(usize::MAX, Some(ms(1))), usize::MAX, "saturates, never wraps");
    }

    #[test]
    fn p9_the_typical_run_starts_at_the_first_and_moves_an_eighth_of_the_way_to_each_next() {
        let mut typical = TypicalRun::default();
        assert_eq!(typical.get(), None);
        typical.note(Duration::from_millis(8));
        assert_eq!(typical.get(), Some(Duration::from_millis(8)));
        typical.note(Duration::from_millis(16));
        assert_eq!(typical.get(), Some(Duration::from_millis(9)));
        for _ in 0..60 {
            typical.note(Duration::from_secs(1));
        }
        assert!(typical.get().is_some_and(|t| t > Duration::from_millis(990)), "{typical:?}");
    }

    #[test]
    fn j2_e17_a_job_that_waited_past_fresh_for_its_slot_is_read_again_before_it_starts() {
        let at = Duration::from_secs(100);
        assert!(!read_again_before_start(at, at), "given its slot at its claim");
        assert!(!read_again_before_start(at, at + FRESH), "at the bound: still fresh");
        assert!(read_again_before_start(at, at + FRESH + Duration::from_millis(1)));
        assert!(read_again_before_start(at, at + Duration::from_secs(2)), "behind a long run");
        assert!(!read_again_before_start(at, at - Duration::from_secs(1)), "a clock read before the claim");
        assert!(FRESH > HORIZON * 2, "a pool's reserve of short runs starts within it");
        assert!(FRESH < crate::bounds::MIN_LEASE.to_std(), "no lease can expire within it");
    }

    #[test]
    fn p9_a_pool_claims_back_up_to_what_it_holds_once_its_reserve_is_down_to_half() {
        // 4 slots holding 48: 44 ahead, refilled at 22 ahead or fewer.
        assert_eq!(to_claim(4, 0, 48), 48, "nothing held: all of it");
        assert_eq!(to_claim(4, 26, 48), 22, "half the reserve left");
        assert_eq!(to_claim(4, 27, 48), 0, "more than half left: no claim yet");
        assert_eq!(to_claim(4, 48, 48), 0);
        assert_eq!(to_claim(4, 60, 48), 0, "more than held (the pool shrank): none");
        // Long runs: 3 a slot, 8 ahead, refilled at 4 ahead.
        assert_eq!((to_claim(4, 9, 12), to_claim(4, 8, 12)), (0, 4));
        assert_eq!(to_claim(0, 0, 0), 0, "no slots, no claims");
    }
}
