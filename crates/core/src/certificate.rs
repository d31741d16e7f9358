//! T17: whether a certificate may be served now. A certificate past its `notAfter` (or before
//! its `notBefore`) is not loaded, since clients would refuse it and blame their CA; the one in
//! force keeps serving. Reads only the validity of an X.509 DER certificate (RFC 5280 §4.1):
//! `Certificate → tbsCertificate → [version], serialNumber, signature, issuer, validity`.

use chrono::{NaiveDate, NaiveDateTime, NaiveTime};

use crate::Ts;

/// Why a certificate is not served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unservable {
    #[error("the certificate expired at {0}")]
    Expired(Ts),
    #[error("the certificate is not valid before {0}")]
    NotYetValid(Ts),
    #[error("the certificate's validity cannot be read: {0}")]
    Malformed(&'static str),
}

/// `notBefore` and `notAfter` of a DER certificate.
pub fn validity(der: &[u8]) -> Result<(Ts, Ts), Unservable> {
    let (_, cert, _) = tlv(der)?;
    let (_, tbs, _) = tlv(cert)?;
    let mut rest = tbs;
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xa0 {
        rest = after; // the explicit [0] version
    }
    for _ in 0..3 {
        rest = tlv(rest)?.2; // serialNumber, signature, issuer
    }
    let (tag, validity, _) = tlv(rest)?;
    if tag != 0x30 {
        return Err(Unservable::Malformed("no validity sequence"));
    }
    let (t1, before, after) = tlv(validity)?;
    let (t2, not_after, _) = tlv(after)?;
    Ok((time(t1, before)?, time(t2, not_after)?))
}

/// T17: a certificate is served only between its `notBefore` and `notAfter`.
pub fn check_validity((not_before, not_after): (Ts, Ts), now: Ts) -> Result<(), Unservable> {
    if now > not_after {
        return Err(Unservable::Expired(not_after));
    }
    if now < not_before {
        return Err(Unservable::NotYetValid(not_before));
    }
    Ok(())
}

/// One DER tag-length-value: (tag, value, what follows).
fn tlv(bytes: &[u8]) -> Result<(u8, &[u8], &[u8]), Unservable> {
    let short = Unservable::Malformed("truncated DER");
    let (&tag, rest) = bytes.split_first().ok_or(short.clone())?;
    let (&first, rest) = rest.split_first().ok_or(short.clone())?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(Unservable::Malformed("a DER length out of range"));
        }
        let len = rest[..n].iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(short);
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`).
fn time(tag: u8, value: &[u8]) -> Result<Ts, Unservable> {
    let bad = Unservable::Malformed("a validity time is not YYMMDDHHMMSSZ");
    let text = std::str::from_utf8(value).map_err(|_| bad.clone())?;
    let digits = text.strip_suffix('Z').filter(|d| d.bytes().all(|b| b.is_ascii_digit())).ok_or(bad.clone())?;
    let num = |s: &str| s.parse::<u32>().map_err(|_| bad.clone());
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy = num(&digits[..2])? as i32;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &digits[2..])
        }
        (0x18, 14) => (num(&digits[..4])? as i32, &digits[4..]),
        _ => return Err(bad),
    };
    let date = NaiveDate::from_ymd_opt(year, num(&rest[..2])?, num(&rest[2..4])?).ok_or(bad.clone())?;
    let clock = NaiveTime::from_hms_opt(num(&rest[4..6])?, num(&rest[6..8])?, num(&rest[8..10])?).ok_or(bad)?;
    Ok(NaiveDateTime::new(date, clock).and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Ts {
        chrono::DateTime::parse_from_rfc3339(s).expect("time").to_utc()
    }

    /// A certificate skeleton: version, serial, algorithm, issuer, then the validity.
    fn cert(not_before: &[u8], not_after: &[u8]) -> Vec<u8> {
        let seq = |tag: u8, body: Vec<u8>| [vec![tag, body.len() as u8], body].concat();
        let validity = seq(0x30, [not_before.to_vec(), not_after.to_vec()].concat());
        let tbs = [
            seq(0xa0, seq(0x02, vec![2])),
            seq(0x02, vec![1]),
            seq(0x30, vec![]),
            seq(0x30, vec![]),
            validity,
            seq(0x30, vec![]),
        ]
        .concat();
        seq(0x30, seq(0x30, tbs))
    }

    #[test]
    fn t17_an_expired_or_not_yet_valid_certificate_is_not_served() {
        let utc = |s: &str| [vec![0x17, s.len() as u8], s.as_bytes().to_vec()].concat();
        let general = |s: &str| [vec![0x18, s.len() as u8], s.as_bytes().to_vec()].concat();
        let der = cert(&utc("261201000000Z"), &general("20261215120000Z"));
        let window = validity(&der).expect("validity");
        assert_eq!(window, (at("2026-12-01T00:00:00Z"), at("2026-12-15T12:00:00Z")));
        assert_eq!(check_validity(window, at("2026-12-10T00:00:00Z")), Ok(()));
        assert_eq!(check_validity(window, at("2026-12-16T00:00:00Z")), Err(Unservable::Expired(window.1)));
        assert_eq!(check_validity(window, at("2026-11-30T00:00:00Z")), Err(Unservable::NotYetValid(window.0)));
        assert_eq!(
            validity(&cert(&utc("491231235959Z"), &utc("500101000000Z"))).map(|w| w.1),
            Ok(at("1950-01-01T00:00:00Z"))
        );
        assert!(validity(&der[..der.len() - 3]).is_err(), "truncated");
        assert!(validity(&cert(&utc("2612010000Z"), &utc("261201000000Z"))).is_err(), "short time");
    }
}
