//! When a failed HTTP call to another service (a webhook, the Sheets API) is worth repeating,
//! and how long the service asked us to wait.

use std::time::Duration;

/// 408, 429 and 5xx are the service's trouble, not our request's: try again later.
pub fn retryable(status: u16) -> bool {
    status == 408 || status == 429 || (500..600).contains(&status)
}

/// A `Retry-After` header in seconds, capped; an HTTP date or garbage is ignored (our own
/// backoff applies).
pub fn retry_after(header: Option<&str>, cap: Duration) -> Option<Duration> {
    header.and_then(|v| v.trim().parse::<u64>().ok()).map(|s| Duration::from_secs(s).min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m10_p8_rate_limits_and_server_errors_are_retried_bad_requests_are_not() {
        for s in [408, 429, 500, 502, 503] {
            assert!(retryable(s), "{s}");
        }
        for s in [400, 401, 403, 404, 409] {
            assert!(!retryable(s), "{s}");
        }
    }

    #[test]
    fn retry_after_is_honoured_up_to_the_cap() {
        let cap = Duration::from_secs(300);
        assert_eq!(retry_after(Some(" 7 "), cap), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(Some("99999"), cap), Some(cap));
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), cap), None);
        assert_eq!(retry_after(None, cap), None);
    }
}
