//! Five-field cron expressions (`minute hour day-of-month month day-of-week`) and the next time
//! one fires in a given time zone (L14: Schedules are local-time, e.g. "night" in Tokyo).
//!
//! Supported: `*`, numbers, ranges `a-b`, steps `*/n` and `a-b/n`, lists `a,b,c`, and Sunday as
//! 0 or 7. As in Vixie cron, when both day fields are restricted a day matches either of them.

use chrono::{Datelike, NaiveDate, NaiveDateTime, TimeZone, Timelike};
use chrono_tz::Tz;

use crate::Ts;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    days_restricted: bool,
    weekdays_restricted: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cron {expr:?}: {reason}")]
pub struct CronError {
    expr: String,
    reason: CronReason,
}

/// What is wrong with a cron expression: its shape, or one field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CronReason {
    #[error("expected 5 fields (minute hour day-of-month month day-of-week), found {0}")]
    FieldCount(usize),
    #[error("{name} field {field:?}: {error}")]
    Field { name: &'static str, field: String, error: FieldError },
}

impl std::str::FromStr for Cron {
    type Err = CronError;

    fn from_str(expr: &str) -> Result<Cron, CronError> {
        let err = |reason: CronReason| CronError { expr: expr.to_string(), reason };
        let fields: Vec<&str> = expr.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(err(CronReason::FieldCount(fields.len())));
        }
        let names = ["minute", "hour", "day-of-month", "month", "day-of-week"];
        let bounds = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)];
        let mut sets = [0u64; 5];
        for (i, field) in fields.iter().enumerate() {
            sets[i] = parse_field(field, bounds[i])
                .map_err(|error| err(CronReason::Field { name: names[i], field: field.to_string(), error }))?;
        }
        // Sunday is both 0 and 7.
        if sets[4] & (1 << 7) != 0 {
            sets[4] |= 1;
        }
        Ok(Cron {
            minutes: sets[0],
            hours: sets[1],
            days: sets[2],
            months: sets[3],
            weekdays: sets[4] & 0x7f,
            days_restricted: fields[2] != "*",
            weekdays_restricted: fields[4] != "*",
        })
    }
}

/// Why one field of a cron expression was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("bad step {0:?}")]
    BadStep(String),
    #[error("step must be at least 1")]
    ZeroStep,
    #[error("{0:?} is not a number")]
    NotANumber(String),
    #[error("{a}-{b} is outside {lo}-{hi}")]
    OutOfRange { a: u32, b: u32, lo: u32, hi: u32 },
}

fn parse_field(field: &str, (lo, hi): (u32, u32)) -> Result<u64, FieldError> {
    let mut set = 0u64;
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().map_err(|_| FieldError::BadStep(s.to_string()))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(FieldError::ZeroStep);
        }
        let num = |s: &str| s.parse::<u32>().map_err(|_| FieldError::NotANumber(s.to_string()));
        let (a, b) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None if part.contains('/') => (num(r)?, hi),
                None => (num(r)?, num(r)?),
            },
        };
        if a < lo || b > hi || a > b {
            return Err(FieldError::OutOfRange { a, b, lo, hi });
        }
        for v in (a..=b).step_by(step as usize) {
            set |= 1 << v;
        }
    }
    Ok(set)
}

impl Cron {
    fn day_matches(&self, d: NaiveDate) -> bool {
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().num_days_from_sunday()) != 0;
        match (self.days_restricted, self.weekdays_restricted) {
            (true, true) => dom || dow,
            (true, false) => dom,
            (false, true) => dow,
            (false, false) => true,
        }
    }

    /// The first firing strictly after `after`, in `tz`'s local time. Local times that do not
    /// exist (spring-forward gaps) are skipped; ambiguous ones (fall-back) fire at the earlier.
    pub fn next_after(&self, after: Ts, tz: Tz) -> Option<Ts> {
        let local = after.with_timezone(&tz).naive_local();
        let mut t = local.date().and_hms_opt(local.hour(), local.minute(), 0)? + chrono::TimeDelta::minutes(1);
        // Four years of days bounds the search, covering 29 February.
        let limit = t + chrono::TimeDelta::days(366 * 4);
        while t < limit {
            if self.months & (1 << t.month()) == 0 || !self.day_matches(t.date()) {
                t = next_day(t)?;
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t.date().and_hms_opt(t.hour(), 0, 0)? + chrono::TimeDelta::hours(1);
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t += chrono::TimeDelta::minutes(1);
                continue;
            }
            if let Some(fire) = tz.from_local_datetime(&t).earliest() {
                let fire = fire.with_timezone(&chrono::Utc);
                if fire > after {
                    return Some(fire);
                }
            }
            t += chrono::TimeDelta::minutes(1);
        }
        None
    }
}

fn next_day(t: NaiveDateTime) -> Option<NaiveDateTime> {
    t.date().succ_opt()?.and_hms_opt(0, 0, 0)
}

/// E13: what one cron entry does at wall time `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// Run the entry's role now.
    pub fire: bool,
    /// The last run to remember (and, when it fired, to store): scheduled times up to it are done.
    pub last: Ts,
}

/// E13: whether an entry runs at `now`, given when it last ran (`None`: never, as far as the
/// store knows — it starts counting from `now`, nothing missed is made up). It runs when a
/// scheduled time lies after its last run and at or before `now`: once, however many such times
/// a clock step forward jumped over (late, not skipped). A step back never repeats one: times up
/// to the last run are done, whatever the clock says now (so a step back of an hour holds the
/// entry for that hour).
pub fn plan_due(cron: &Cron, tz: Tz, last: Option<Ts>, now: Ts) -> Due {
    let Some(last) = last else { return Due { fire: false, last: now } };
    match cron.next_after(last, tz) {
        Some(next) if next <= now => Due { fire: true, last: now },
        _ => Due { fire: false, last },
    }
}

/// A time zone name that is not in the IANA database.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown time zone {0:?}; use an IANA name such as Asia/Tokyo or UTC")]
pub struct UnknownTimeZone(pub String);

/// Parses an IANA time zone name such as `Asia/Tokyo` or `UTC`.
pub fn parse_tz(name: &str) -> Result<Tz, UnknownTimeZone> {
    name.parse::<Tz>().map_err(|_| UnknownTimeZone(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> Ts {
        s.parse().expect("rfc3339")
    }

    fn next(expr: &str, tz: &str, after: &str) -> Option<Ts> {
        expr.parse::<Cron>().expect("valid").next_after(utc(after), parse_tz(tz).expect("tz"))
    }

    #[test]
    fn l14_every_ten_minutes_fires_on_the_next_multiple() {
        assert_eq!(next("*/10 * * * *", "UTC", "2026-11-30T02:03:00Z"), Some(utc("2026-11-30T02:10:00Z")));
        assert_eq!(next("*/10 * * * *", "UTC", "2026-11-30T02:10:00Z"), Some(utc("2026-11-30T02:20:00Z")));
    }

    #[test]
    fn l14_night_schedule_fires_in_its_own_time_zone() {
        // 02:00 in Tokyo is 17:00 UTC the day before.
        assert_eq!(next("0 2 * * *", "Asia/Tokyo", "2026-11-30T03:00:00Z"), Some(utc("2026-11-30T17:00:00Z")));
    }

    #[test]
    fn dst_gap_is_skipped_and_overlap_fires_once_at_the_earlier() {
        // New York springs forward on 2026-03-08: 02:30 local does not exist that day.
        assert_eq!(next("30 2 * * *", "America/New_York", "2026-03-08T00:00:00Z"), Some(utc("2026-03-09T06:30:00Z")));
        // It falls back on 2026-11-01: 01:30 local happens twice; the first is 05:30 UTC.
        assert_eq!(next("30 1 * * *", "America/New_York", "2026-11-01T00:00:00Z"), Some(utc("2026-11-01T05:30:00Z")));
    }

    #[test]
    fn lists_ranges_weekdays_and_sunday_as_7() {
        // 2026-11-30 is a Monday.
        assert_eq!(next("0 9 * * 1-5", "UTC", "2026-11-28T00:00:00Z"), Some(utc("2026-11-30T09:00:00Z")));
        assert_eq!(next("0 9 * * 7", "UTC", "2026-11-30T00:00:00Z"), Some(utc("2026-12-06T09:00:00Z")));
        assert_eq!(next("15,45 * * * *", "UTC", "2026-11-30T02:20:00Z"), Some(utc("2026-11-30T02:45:00Z")));
        assert_eq!(next("0 0 29 2 *", "UTC", "2026-03-01T00:00:00Z"), Some(utc("2028-02-29T00:00:00Z")));
    }

    #[test]
    fn invalid_crons_name_the_field() {
        for (bad, needle) in [
            ("* * * *", "expected 5 fields"),
            ("60 * * * *", "minute field"),
            ("* 24 * * *", "hour field"),
            ("*/0 * * * *", "step"),
            ("a * * * *", "not a number"),
        ] {
            let e = bad.parse::<Cron>().expect_err(bad).to_string();
            assert!(e.contains(needle), "{bad}: {e}");
        }
    }

    /// Drives one entry through wall times (a clock that steps), ticking like the schedule task,
    /// and answers the times it fired at.
    fn fired(expr: &str, start: &str, ticks: &[i64]) -> Vec<i64> {
        let cron: Cron = expr.parse().expect("valid");
        let (tz, start) = (parse_tz("UTC").expect("tz"), utc(start));
        let mut last = None;
        let mut fired = vec![];
        for &at in ticks {
            let due = plan_due(&cron, tz, last, start + chrono::TimeDelta::seconds(at));
            if due.fire {
                fired.push(at);
            }
            last = Some(due.last);
        }
        fired
    }

    /// One tick a second from `from` to `to` (seconds from the start), both included.
    fn ticks(from: i64, to: i64) -> Vec<i64> {
        (from..=to).collect()
    }

    #[test]
    fn e13_a_step_back_never_repeats_an_entry() {
        // Entries run at 03:00 (and 03:01), then the clock steps back 70 s and runs on over both.
        let clock = [ticks(-5, 70), ticks(0, 200)].concat();
        assert_eq!(fired("0 3 * * *", "2026-11-30T03:00:00Z", &clock), vec![0], "the daily one once");
        // The minutely one: 03:00 and 03:01 are not run again; 03:02 and 03:03 are, once each.
        assert_eq!(fired("* * * * *", "2026-11-30T03:00:00Z", &clock), vec![0, 60, 120, 180]);
    }

    #[test]
    fn e13_a_step_forward_over_an_entry_runs_it_once_late() {
        // The clock jumps 5 minutes ahead from 02:58:00 over the daily 03:00, and over five
        // minutely times: each entry runs once for them, at the first tick after the jump.
        let clock = [ticks(-130, -120), ticks(180, 200)].concat();
        assert_eq!(fired("0 3 * * *", "2026-11-30T03:00:00Z", &clock), vec![180]);
        assert_eq!(fired("* * * * *", "2026-11-30T03:00:00Z", &clock), vec![-120, 180]);
        // Stepping back over the same time afterwards does not run it again.
        let back = [clock.clone(), ticks(-10, 10)].concat();
        assert_eq!(fired("0 3 * * *", "2026-11-30T03:00:00Z", &back), vec![180]);
    }

    #[test]
    fn e13_an_entry_never_run_counts_from_now_and_makes_nothing_up() {
        let cron: Cron = "0 3 * * *".parse().expect("valid");
        let tz = parse_tz("UTC").expect("tz");
        let now = utc("2026-11-30T05:00:00Z");
        assert_eq!(plan_due(&cron, tz, None, now), Due { fire: false, last: now });
        // Down over its time (last run yesterday): it runs once when the controller is back.
        let yesterday = utc("2026-11-29T03:00:00Z");
        assert_eq!(plan_due(&cron, tz, Some(yesterday), now), Due { fire: true, last: now });
        assert_eq!(plan_due(&cron, tz, Some(now), now), Due { fire: false, last: now });
    }

    #[test]
    fn unknown_time_zone_is_refused() {
        assert!(parse_tz("Mars/Olympus").is_err());
        assert!(parse_tz("Asia/Tokyo").is_ok());
    }
}
