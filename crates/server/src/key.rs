//! What the reconcile loop reconciles: every part of the server asks for a key by name.

use pcmail_core::manifest::spec::ScheduleRole;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    /// M8 expiry and M9 alerts, and the gauges they feed.
    MailSweep,
    /// M10: post what is not yet notified.
    Notify,
    /// Rebuild the runtime from the specs and write each object's status.
    Specs,
    /// J3: rescue jobs whose lease expired.
    JobReaper,
    /// L14: run the rows people ticked (1 a pass by default).
    ExecuteChecked,
    /// L14: run todo rows of generate functions (2 a pass by default).
    AutoExecute,
    /// L14: pull every Ledger's sources, round-robin.
    LedgerSync,
    /// L14/L15: store a fresh cross-project view.
    RebuildView,
    /// E7: prune what retention lets go.
    Prune,
}

impl Key {
    /// The keys the resync runs. The ledger roles run on their Schedule only: executing rows
    /// or pulling sources every few seconds is not what anyone scheduled.
    pub const ALL: [Key; 5] = [Key::MailSweep, Key::Notify, Key::Specs, Key::JobReaper, Key::Prune];

    /// Every key, for the metrics' zero series.
    pub const EVERY: [Key; 9] = [
        Key::MailSweep,
        Key::Notify,
        Key::Specs,
        Key::JobReaper,
        Key::ExecuteChecked,
        Key::AutoExecute,
        Key::LedgerSync,
        Key::RebuildView,
        Key::Prune,
    ];

    /// C1: only the lease holder runs these; every replica rebuilds its own runtime.
    pub fn leader_only(self) -> bool {
        self != Key::Specs
    }

    /// Also the `reconciler` label of the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Key::MailSweep => "mail-sweep",
            Key::Notify => "notify",
            Key::Specs => "specs",
            Key::JobReaper => "job-reaper",
            Key::ExecuteChecked => "execute-checked",
            Key::AutoExecute => "auto-execute",
            Key::LedgerSync => "ledger-sync",
            Key::RebuildView => "rebuild-view",
            Key::Prune => "prune",
        }
    }
}

/// The key a role runs.
pub fn key_for(role: ScheduleRole) -> Key {
    match role {
        ScheduleRole::MailSweep => Key::MailSweep,
        ScheduleRole::ExecuteChecked => Key::ExecuteChecked,
        ScheduleRole::Sync => Key::LedgerSync,
        ScheduleRole::AutoExecute => Key::AutoExecute,
        ScheduleRole::RebuildView => Key::RebuildView,
    }
}
