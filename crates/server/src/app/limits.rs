//! The token buckets that pace the server's own work: the notifier's posts, each pool's claims
//! and each Function's runs, each rebuilt when its spec's rate changes.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use pcmail_core::duration::Dur;
use pcmail_core::manifest::spec::RateLimit;

/// Whose pace a bucket keeps: a WorkerPool's claims or a Function's runs, by spec name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LimitKey {
    Pool(String),
    Function(String),
}

#[derive(Default)]
pub struct Limits {
    /// The notifier's pace, rebuilt when MailPolicy.notify.minInterval changes.
    notify: Mutex<Option<(Dur, Arc<DefaultDirectRateLimiter>)>>,
    buckets: Mutex<HashMap<LimitKey, (RateLimit, Arc<DefaultDirectRateLimiter>)>>,
}

impl Limits {
    /// One notification post every `min_interval`.
    pub fn notify(&self, min_interval: Dur) -> Arc<DefaultDirectRateLimiter> {
        let mut slot = self.notify.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Some((d, l)) if *d == min_interval => l.clone(),
            _ => {
                let period = min_interval.to_std().max(Duration::from_millis(1));
                let quota = Quota::with_period(period).unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN));
                let limiter = Arc::new(RateLimiter::direct(quota));
                *slot = Some((min_interval, limiter.clone()));
                limiter
            }
        }
    }

    /// The bucket of `key` at `rate`: `perMinute` with bursts of `burst`.
    pub fn bucket(&self, key: LimitKey, rate: RateLimit) -> Arc<DefaultDirectRateLimiter> {
        let mut map = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(&key) {
            Some((r, l)) if *r == rate => l.clone(),
            _ => {
                let per_minute = NonZeroU32::new(rate.per_minute).unwrap_or(NonZeroU32::MIN);
                let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
                let limiter = Arc::new(RateLimiter::direct(Quota::per_minute(per_minute).allow_burst(burst)));
                map.insert(key, (rate, limiter.clone()));
                limiter
            }
        }
    }
}
