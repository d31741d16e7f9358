//! T5: every duration and count a request or a manifest brings has a range. Out of range is
//! an error that names the field — never an overflow in time arithmetic, never a lease that
//! locks a pool's jobs for ten years, never a claim that takes the whole queue.

use std::fmt;

use crate::duration::Dur;

/// A claim takes at most this many jobs.
pub const MAX_CLAIM: u64 = 100;
/// One enqueue request brings at most this many jobs (P10's bulk size); a longer list is
/// sent as several requests, each its own transaction.
pub const MAX_ENQUEUE: u64 = 1000;
/// A job's attempts, and a WorkerPool's `maxAttempts`.
pub const MAX_ATTEMPTS: u64 = 100;
/// A mail's `ttl`, and how far ahead a job's `runAfter` may be.
pub const MAX_TTL: Dur = Dur::from_hours(24 * 365);
pub const MAX_RUN_AFTER: Dur = MAX_TTL;
/// A lease shorter than this would expire before its first heartbeat.
pub const MIN_LEASE: Dur = Dur::from_secs(1);
/// A WorkerPool's `maxLease` when it names none, and the longest it may name.
pub const DEFAULT_MAX_LEASE: Dur = Dur::from_hours(1);
pub const MAX_MAX_LEASE: Dur = Dur::from_hours(24);
/// Any other duration of a manifest: past ten years it is a typo.
pub const MAX_DURATION: Dur = Dur::from_hours(24 * 3650);
/// Any other count of a manifest (`maxPerRun`, `viewCap`, rates).
pub const MAX_COUNT: u64 = 100_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value} is out of range: it must be {range}")]
pub struct OutOfRange {
    pub field: String,
    pub value: String,
    pub range: String,
}

fn check<T: PartialOrd + fmt::Display>(field: &str, value: T, min: T, max: T) -> Result<T, OutOfRange> {
    if value >= min && value <= max {
        return Ok(value);
    }
    let range = if value < min { format!("at least {min}") } else { format!("at most {max}") };
    Err(OutOfRange { field: field.to_string(), value: value.to_string(), range })
}

pub fn count(field: &str, value: u64, min: u64, max: u64) -> Result<u64, OutOfRange> {
    check(field, value, min, max)
}

pub fn duration(field: &str, value: Dur, min: Dur, max: Dur) -> Result<Dur, OutOfRange> {
    check(field, value, min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t5_in_range_passes_and_out_of_range_names_the_field_and_the_bound() {
        assert_eq!(count("limit", 100, 1, MAX_CLAIM), Ok(100));
        let e = count("limit", 0, 1, MAX_CLAIM).unwrap_err();
        assert_eq!(e.to_string(), "limit 0 is out of range: it must be at least 1");
        let e = count("limit", u64::MAX, 1, MAX_CLAIM).unwrap_err();
        assert_eq!(e.to_string(), format!("limit {} is out of range: it must be at most 100", u64::MAX));
        let e = duration("lease", Dur::from_hours(24 * 3650), MIN_LEASE, DEFAULT_MAX_LEASE).unwrap_err();
        assert_eq!(e.to_string(), "lease 3650d is out of range: it must be at most 1h");
        assert_eq!(e.field, "lease");
        assert!(duration("lease", Dur::from_millis(999), MIN_LEASE, DEFAULT_MAX_LEASE).is_err());
        assert_eq!(duration("ttl", Dur::default(), Dur::default(), MAX_TTL), Ok(Dur::default()));
    }

    #[test]
    fn t5_the_largest_duration_any_bound_allows_still_fits_time_arithmetic() {
        let now: crate::Ts = "9999-12-31T23:59:59Z".parse().expect("a far-future instant");
        for d in [MAX_TTL, MAX_RUN_AFTER, MAX_MAX_LEASE, MAX_DURATION] {
            assert!(now.checked_add_signed(d.to_chrono()).is_some(), "{d}");
        }
    }
}
