//! T9/T10/T18: who may call, as this server remembers it — the admin token in force, failed
//! attempts per client address, and the refused calls PCs reported.

use std::sync::{Mutex, PoisonError};

use pcmail_core::Ts;
use pcmail_core::agent::{QueuedCall, RefusalReports, Report};

use crate::credentials::{AdminToken, AuthFailures};

pub struct Access {
    /// T18: the admin token as `admin.token` holds it now.
    admin_token: AdminToken,
    /// T9/T18: failed authentication per client address, every surface.
    failures: AuthFailures,
    /// T10: the refused calls PCs reported within the hour, per machine.
    refusals: Mutex<RefusalReports>,
}

impl Access {
    pub(super) fn new(admin_token: AdminToken) -> Access {
        Access { admin_token, failures: AuthFailures::default(), refusals: Mutex::default() }
    }

    /// The hash of the admin token in force (re-read when the file changes, T18).
    pub fn admin_token_hash(&self) -> String {
        self.admin_token.hash()
    }

    pub fn failures(&self) -> &AuthFailures {
        &self.failures
    }

    /// T10: whether a PC's report of a refused call is recorded (see `RefusalReports`).
    pub fn refusal_report(&self, machine: &str, call: QueuedCall, target: &str, now: Ts) -> Report {
        self.refusals.lock().unwrap_or_else(PoisonError::into_inner).report(machine, call, target, now)
    }
}
