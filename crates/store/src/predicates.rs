//! R3: the state filters both SQL adapters query by, each derived from the core's rule (which
//! states are open, closed, finished, settled) instead of written out beside it. Dialect-neutral;
//! the migrations keep their own text, as history the fixture stores check (V5).

use pcmail_core::alert::AlertState;
use pcmail_core::jobs::JobState;
use pcmail_core::ledger::RowState;
use pcmail_core::mail::{MailKind, MailState};

/// Mail still waiting on its recipient (M1: not terminal).
pub(crate) fn open_mail() -> String {
    format!("state IN ({})", MailState::open_sql())
}

/// Mail in a terminal state: what retention may prune (E-rules).
pub(crate) fn closed_mail() -> String {
    format!("state IN ({})", MailState::closed_sql())
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
    format!("state IN ({})", RowState::sql_in(|s| !s.is_closed()))
}

/// Jobs that have ended and hold no unique key by state (J6: not live).
pub(crate) fn finished_jobs() -> String {
    format!("state IN ({})", JobState::sql_in(|s| !s.is_live()))
}

/// Alerts no longer firing: resolved ones and notices.
pub(crate) fn settled_alerts() -> String {
    format!("state IN ({})", AlertState::sql_in(|s| s != AlertState::Firing))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migrations' partial indexes are only used when a query's filter matches their
    /// predicate; these are the texts they were written with.
    #[test]
    fn r3_the_derived_filters_are_the_ones_the_indexes_were_written_for() {
        assert_eq!(open_mail(), "state IN ('new', 'delivered', 'seen')");
        assert_eq!(closed_mail(), "state IN ('done', 'failed', 'expired')");
        assert_eq!(state_is(MailState::New), "state = 'new'");
        assert_eq!(state_is(JobState::Running), "state = 'running'");
        assert_eq!(open_intents(), "kind = 'intent' AND state IN ('new', 'delivered', 'seen')");
        assert_eq!(open_rows(), "state IN ('todo', 'running', 'review')");
        assert_eq!(finished_jobs(), "state IN ('succeeded', 'dead', 'cancelled')");
        assert_eq!(settled_alerts(), "state IN ('resolved', 'notice')");
    }
}
