//! Durations as manifests and flags write them: `30s`, `10m`, `2h`, `3d`, or sums like `1h30m`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative span of whole milliseconds, written in the manifest notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Dur(u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason} (write e.g. 30s, 10m, 2h, 3d or 1h30m)")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

impl Dur {
    pub const fn from_millis(ms: u64) -> Self {
        Dur(ms)
    }
    pub const fn from_secs(s: u64) -> Self {
        Dur(s * 1000)
    }
    pub const fn from_mins(m: u64) -> Self {
        Dur(m * 60_000)
    }
    pub const fn from_hours(h: u64) -> Self {
        Dur(h * 3_600_000)
    }
    pub const fn as_millis(self) -> u64 {
        self.0
    }
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_millis(self.0)
    }
    pub fn to_chrono(self) -> chrono::TimeDelta {
        chrono::TimeDelta::milliseconds(i64::try_from(self.0).unwrap_or(i64::MAX))
    }
}

impl FromStr for Dur {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |reason| DurationError { input: input.to_string(), reason };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let mut total: u64 = 0;
        let mut rest = s;
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            if digits == 0 {
                return Err(err("expected a number"));
            }
            let n: u64 = rest[..digits].parse().map_err(|_| err("number too large"))?;
            rest = &rest[digits..];
            let (unit_ms, unit_len) = if rest.starts_with("ms") {
                (1, 2)
            } else {
                match rest.chars().next() {
                    Some('s') => (1_000, 1),
                    Some('m') => (60_000, 1),
                    Some('h') => (3_600_000, 1),
                    Some('d') => (86_400_000, 1),
                    Some(_) => return Err(err("unknown unit; use ms, s, m, h or d")),
                    None => return Err(err("missing unit; use ms, s, m, h or d")),
                }
            };
            rest = &rest[unit_len..];
            total = n.checked_mul(unit_ms).and_then(|v| total.checked_add(v)).ok_or_else(|| err("too large"))?;
        }
        Ok(Dur(total))
    }
}

impl fmt::Display for Dur {
    /// The shortest exact notation, so that a parsed and re-printed spec is stable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let units = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s"), (1, "ms")];
        if self.0 == 0 {
            return f.write_str("0s");
        }
        let mut rest = self.0;
        for (size, name) in units {
            if rest >= size {
                write!(f, "{}{}", rest / size, name)?;
                rest %= size;
            }
        }
        Ok(())
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_durations_parse_in_every_unit() {
        assert_eq!("30s".parse::<Dur>(), Ok(Dur::from_secs(30)));
        assert_eq!("10m".parse::<Dur>(), Ok(Dur::from_mins(10)));
        assert_eq!("2h".parse::<Dur>(), Ok(Dur::from_hours(2)));
        assert_eq!("3d".parse::<Dur>(), Ok(Dur::from_hours(72)));
        assert_eq!("1h30m".parse::<Dur>(), Ok(Dur::from_mins(90)));
        assert_eq!("250ms".parse::<Dur>(), Ok(Dur::from_millis(250)));
    }

    #[test]
    fn bad_durations_name_the_problem() {
        for bad in ["", "10", "m", "10x", "-5s", "1.5h", "99999999999999999999d"] {
            let err = bad.parse::<Dur>().expect_err(bad).to_string();
            assert!(err.contains("invalid duration"), "{bad}: {err}");
        }
    }

    #[test]
    fn durations_print_back_in_their_shortest_form() {
        for s in ["30s", "10m", "2h", "3d", "1h30m", "250ms", "0s"] {
            assert_eq!(s.parse::<Dur>().map(|d| d.to_string()).as_deref(), Ok(s));
        }
        assert_eq!(Dur::from_mins(120).to_string(), "2h");
    }
}
