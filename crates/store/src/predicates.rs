//! R3: the state filters both SQL adapters query by, each derived from the core's rule (which
//! states are open, closed, finished, settled) instead of written out beside it. Dialect-neutral;
//! the migrations keep their own text, as history the fixture stores check (V5). A set of states
//! is an `OR` chain (`names::sql_any`), the form SQLite's partial indexes are written in since
//! its migration 12; PostgreSQL's, still `IN`, are proven from it by its planner.

use pcmail_core::alert::AlertState;
use pcmail_core::jobs::JobState;
use pcmail_core::ledger::RowState;
use pcmail_core::mail::{MailKind, MailState};

/// Mail still waiting on its recipient (M1: not terminal).
pub(crate) fn open_mail() -> String {
    MailState::sql_any("state", |s| !s.is_terminal())
}

/// Mail in a terminal state: what retention may prune (E-rules).
pub(crate) fn closed_mail() -> String {
    MailState::sql_any("state", MailState::is_terminal)
}

/// A row in exactly `state` (a mail, job, alert or ledger state).
pub(crate) fn state_is(state: impl std::fmt::Display) -> String {
    format!("state = '{state}'")
}

/// Open chat intents (I-rules): intent mail not yet terminal.
pub(crate) fn open_intents() -> String {
    format!("{} AND {}", MailKind::sql_is("kind", MailKind::is_intent), open_mail())
}

/// Ledger rows a sync may still touch (L5: not closed).
pub(crate) fn open_rows() -> String {
    RowState::sql_any("state", |s| !s.is_closed())
}

/// Jobs that have ended and hold no unique key by state (J6: not live).
pub(crate) fn finished_jobs() -> String {
    JobState::sql_any("state", |s| !s.is_live())
}

/// Alerts no longer firing: resolved ones and notices.
pub(crate) fn settled_alerts() -> String {
    AlertState::sql_any("state", |s| s != AlertState::Firing)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migrations' partial indexes are only used when a query's filter matches their
    /// predicate; these are the texts they were written with.
    #[test]
    fn r3_the_derived_filters_are_the_ones_the_indexes_were_written_for() {
        assert_eq!(open_mail(), "(state = 'new' OR state = 'delivered' OR state = 'seen')");
        assert_eq!(closed_mail(), "(state = 'done' OR state = 'failed' OR state = 'expired')");
        assert_eq!(state_is(MailState::New), "state = 'new'");
        assert_eq!(state_is(JobState::Running), "state = 'running'");
        assert_eq!(open_intents(), "kind = 'intent' AND (state = 'new' OR state = 'delivered' OR state = 'seen')");
        assert_eq!(open_rows(), "(state = 'todo' OR state = 'running' OR state = 'review')");
        assert_eq!(finished_jobs(), "(state = 'succeeded' OR state = 'dead' OR state = 'cancelled')");
        assert_eq!(settled_alerts(), "(state = 'resolved' OR state = 'notice')");
    }
}
