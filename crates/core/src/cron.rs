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
    reason: String,
}

impl std::str::FromStr for Cron {
    type Err = CronError;

    fn from_str(expr: &str) -> Result<Cron, CronError> {
        let err = |reason: String| CronError { expr: expr.to_string(), reason };
        let fields: Vec<&str> = expr.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(err(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            )));
        }
        let names = ["minute", "hour", "day-of-month", "month", "day-of-week"];
        let bounds = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)];
        let mut sets = [0u64; 5];
        for (i, field) in fields.iter().enumerate() {
            sets[i] = parse_field(field, bounds[i]).map_err(|r| err(format!("{} field {field:?}: {r}", names[i])))?;
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

fn parse_field(field: &str, (lo, hi): (u32, u32)) -> Result<u64, String> {
    let mut set = 0u64;
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().map_err(|_| format!("bad step {s:?}"))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err("step must be at least 1".into());
        }
        let num = |s: &str| s.parse::<u32>().map_err(|_| format!("{s:?} is not a number"));
        let (a, b) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None if part.contains('/') => (num(r)?, hi),
                None => (num(r)?, num(r)?),
            },
        };
        if a < lo || b > hi || a > b {
            return Err(format!("{a}-{b} is outside {lo}-{hi}"));
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

/// Parses an IANA time zone name such as `Asia/Tokyo` or `UTC`.
pub fn parse_tz(name: &str) -> Result<Tz, String> {
    name.parse::<Tz>().map_err(|_| format!("unknown time zone {name:?}; use an IANA name such as Asia/Tokyo or UTC"))
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

    #[test]
    fn unknown_time_zone_is_refused() {
        assert!(parse_tz("Mars/Olympus").is_err());
        assert!(parse_tz("Asia/Tokyo").is_ok());
    }
}
