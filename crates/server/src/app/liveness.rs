//! E15/E18: what the server says about itself in the log once per change — its own uptime by
//! its ticks, and the store's trouble.

use std::sync::{Mutex, PoisonError};

use pcmail_core::Ts;
use pcmail_core::health::{Said, Say, Uptime};

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
