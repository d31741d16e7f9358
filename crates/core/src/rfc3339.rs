//! A [`Ts`] on the wire: the RFC 3339 text chrono's own `Serialize` writes (UTC as `Z`, the
//! fraction in 0, 3, 6 or 9 digits as it needs), written into a buffer on the stack and handed
//! over as one string. P10: chrono writes it through `fmt` piece by piece, and serde_json
//! escapes each piece as it comes; that was a thirtieth of `serve`'s CPU per job enqueued.

use chrono::{Datelike, Timelike};
use serde::Serializer;

use crate::Ts;

/// `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`, the longest this writes.
const LONGEST: usize = 30;

/// Serializes `ts` as chrono does; for `#[serde(serialize_with)]`.
pub fn serialize<S: Serializer>(ts: &Ts, s: S) -> Result<S::Ok, S::Error> {
    let mut buf = [0u8; LONGEST];
    match write(ts, &mut buf) {
        Some(text) => s.serialize_str(text),
        // A year past 9999 or before 0, or a leap second: chrono's own, which knows them.
        None => serde::Serialize::serialize(ts, s),
    }
}

/// [`serialize`] for an optional time (`null` when there is none).
pub fn serialize_option<S: Serializer>(ts: &Option<Ts>, s: S) -> Result<S::Ok, S::Error> {
    match ts {
        Some(ts) => serialize(ts, s),
        None => s.serialize_none(),
    }
}

/// `ts` in `buf`; None where the simple form does not hold it.
fn write<'b>(ts: &Ts, buf: &'b mut [u8; LONGEST]) -> Option<&'b str> {
    let year = u32::try_from(ts.year()).ok().filter(|y| *y <= 9999)?;
    let nanos = ts.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    let (fraction, width) = match nanos {
        0 => (0, 0),
        n if n % 1_000_000 == 0 => (n / 1_000_000, 3),
        n if n % 1_000 == 0 => (n / 1_000, 6),
        n => (n, 9),
    };
    let mut out = Out { buf, at: 0 };
    out.digits(year, 4);
    out.byte(b'-');
    out.digits(ts.month(), 2);
    out.byte(b'-');
    out.digits(ts.day(), 2);
    out.byte(b'T');
    out.digits(ts.hour(), 2);
    out.byte(b':');
    out.digits(ts.minute(), 2);
    out.byte(b':');
    out.digits(ts.second(), 2);
    if width > 0 {
        out.byte(b'.');
        out.digits(fraction, width);
    }
    out.byte(b'Z');
    let at = out.at;
    std::str::from_utf8(&buf[..at]).ok()
}

/// Where [`write`] is in its buffer (never past [`LONGEST`]: the widest form fills it).
struct Out<'b> {
    buf: &'b mut [u8; LONGEST],
    at: usize,
}

impl Out<'_> {
    fn byte(&mut self, b: u8) {
        self.buf[self.at] = b;
        self.at += 1;
    }

    /// `value`'s last `width` decimal digits, zero-padded.
    fn digits(&mut self, value: u32, width: u32) {
        for place in (0..width).rev() {
            self.byte(b'0' + (value / 10u32.pow(place) % 10) as u8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[derive(serde::Serialize)]
    struct Ours(#[serde(serialize_with = "serialize")] Ts);

    #[test]
    fn p10_a_time_is_written_as_chronos_own_serialize_writes_it() {
        let mut times = vec![
            chrono::Utc.with_ymd_and_hms(2026, 12, 5, 16, 0, 0).single().expect("a time"),
            chrono::Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0).single().expect("a time"),
            chrono::Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).single().expect("a time"),
            chrono::Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).single().expect("past 9999"),
            chrono::Utc.with_ymd_and_hms(-5, 3, 1, 0, 0, 0).single().expect("before year 0"),
        ];
        // Every width of fraction, and a leap second.
        let base = times[0];
        for nanos in [1, 10, 999, 1_000, 120_000, 5_000_000, 123_456_789, 999_999_999, 1_500_000_000] {
            times.push(base.with_nanosecond(nanos).expect("a fraction"));
        }
        for ts in times {
            let chronos = serde_json::to_string(&ts).expect("chrono");
            assert_eq!(serde_json::to_string(&Ours(ts)).expect("ours"), chronos, "{ts:?}");
        }
        let none: Option<Ts> = None;
        let mut out = Vec::new();
        serialize_option(&none, &mut serde_json::Serializer::new(&mut out)).expect("null");
        assert_eq!(out, b"null");
    }
}
