//! E15/E18: what the server says about itself in the log once per change — its own uptime by
//! its ticks, and the store's trouble.

use std::sync::{Mutex, PoisonError};

use pcmail_core::Ts;
use pcmail_core::health::{Said, Say, Uptime};

/// E15: a store outage or full disk is said once per change by the health watch
/// (`serve::watch_health`, through [`Liveness::observe_store`]); a loop that meets it on one of
/// its tries says it at debug, and any other error at warn. `$outage` is whether the watch
/// says this error (most often [`pcmail_store::StoreError::is_outage`]); the rest is a
/// `tracing` event's fields and message.
macro_rules! warn_unless_outage {
    ($outage:expr, $($event:tt)+) => {
        if $outage {
            tracing::debug!($($event)+)
        } else {
            tracing::warn!($($event)+)
        }
    };
}
pub(crate) use warn_unless_outage;

pub struct Liveness {
    /// E18: since when this server has been up without a break, by its own ticks.
    uptime: Mutex<Uptime>,
    /// E15: the store trouble last said in the log.
    said_store: Mutex<Said<String>>,
}

impl Liveness {
    pub(super) fn new(now: Ts) -> Liveness {
        Liveness { uptime: Mutex::new(Uptime::started(now)), said_store: Mutex::new(Said::default()) }
    }

    /// E18: records one of the server's own ticks at `now`; answers since when it has been up
    /// without a break.
    pub fn tick(&self, now: Ts) -> Ts {
        let mut up = self.uptime.lock().unwrap_or_else(PoisonError::into_inner);
        if up.tick(now) {
            tracing::info!(
                "the server was away (paused, stopped or its clock stepped); receivers' silence counts from now (E18)"
            );
        }
        up.since()
    }

    /// E15: the store's trouble as it is now; answers what to log about it, if anything.
    pub fn observe_store(&self, trouble: Option<String>, now: Ts) -> Option<Say<String>> {
        self.said_store.lock().unwrap_or_else(PoisonError::into_inner).observe(trouble, now)
    }
}
