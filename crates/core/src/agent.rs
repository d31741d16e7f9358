//! Rules of the PC side: retrying queued server calls (A4) and when the installed agent task
//! must be re-registered (A5).

use crate::Ts;
use crate::ids::is_stored_id;
use crate::mail::{MAX_BODY_BYTES, Mail};

crate::wire_enum! {
    /// A server call the PC queues (A4): a step of one mail (target: its id) or an intent to
    /// record (target: its external key). Stored and sent by its wire name.
    pub enum QueuedCall as "queued call" {
        Seen = "seen",
        Ack = "ack",
        Fail = "fail",
        Intent = "intent",
    }
}

/// A4/T10: what the server's answer to one queued call means. `status` is the HTTP status
/// of an answer that was an error, None for a call that never got one.
pub fn call_outcome(call: QueuedCall, answer: Result<(), (Option<u16>, &str)>) -> CallOutcome {
    match answer {
        Ok(()) => CallOutcome::Ok,
        // An intent the server cannot place yet (no Roster, owner unresolved) must wait, never
        // be dropped: it may be the only record of the message (I1).
        Err((Some(422), _)) if call == QueuedCall::Intent => CallOutcome::Unreachable,
        Err((Some(404), _)) => CallOutcome::Unknown,
        // V2: this client is too old for the server; the call waits for the PC's upgrade.
        Err((Some(426), _)) => CallOutcome::Unreachable,
        // 401 (a token being replaced), 408 and 429 are worth another try.
        Err((Some(status), message)) if (400..500).contains(&status) && ![401, 408, 429].contains(&status) => {
            CallOutcome::Refused(format!("{status}: {message}"))
        }
        Err(_) => CallOutcome::Unreachable,
    }
}

/// How one attempt at a queued server call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    Ok,
    /// Network error or 5xx: try again at the next poll.
    Unreachable,
    /// The server does not know the action or its target (404), e.g. an older server.
    Unknown,
    /// The server refused it for good (another 4xx): retrying cannot help.
    Refused(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    Done,
    RetryAt(Ts),
    Drop(String),
    /// T10: refused for good. Kept, never sent again, and reported to the server once.
    Refused(String),
}

pub const UNKNOWN_BACKOFF: chrono::TimeDelta = chrono::TimeDelta::hours(1);
pub const UNKNOWN_MAX_TRIES: u32 = 5;

/// A4: unknown actions back off for 1h and are dropped after 5 tries; unreachable ones wait for
/// the next poll; refusals are kept with the server's reason and not retried (T10).
pub fn after_call(outcome: &CallOutcome, unknown_tries_before: u32, now: Ts) -> NextStep {
    match outcome {
        CallOutcome::Ok => NextStep::Done,
        CallOutcome::Unreachable => NextStep::RetryAt(now),
        CallOutcome::Unknown if unknown_tries_before + 1 >= UNKNOWN_MAX_TRIES => {
            NextStep::Drop(format!("the server did not know this action after {UNKNOWN_MAX_TRIES} tries"))
        }
        CallOutcome::Unknown => NextStep::RetryAt(now + UNKNOWN_BACKOFF),
        CallOutcome::Refused(why) => NextStep::Refused(why.clone()),
    }
}

/// T10 on the server: a refused call a PC reports is recorded (an event and a count) once.
/// A PC reports each call once; the same call again, or more than `REFUSALS_PER_HOUR` of one
/// machine, is a PC gone wrong or a machine flooding the event log, and is not recorded again.
/// Pure state: the caller passes the time and keeps the value (one entry per machine).
#[derive(Debug, Default, Clone)]
pub struct RefusalReports {
    machines: std::collections::HashMap<String, std::collections::VecDeque<(Ts, QueuedCall, String)>>,
}

pub const REFUSALS_PER_HOUR: usize = 60;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    Record,
    /// Already recorded within the hour: answered ok, not recorded twice.
    Repeat,
    /// Over the hourly budget: refused with 429; the PC keeps it and tries later.
    TooMany,
}

impl RefusalReports {
    pub fn report(&mut self, machine: &str, call: QueuedCall, target: &str, now: Ts) -> Report {
        let recent = self.machines.entry(machine.to_string()).or_default();
        while recent.front().is_some_and(|(t, _, _)| (now - *t).num_seconds() >= 3600) {
            recent.pop_front();
        }
        if recent.iter().any(|(_, c, t)| *c == call && t == target) {
            return Report::Repeat;
        }
        if recent.len() >= REFUSALS_PER_HOUR {
            return Report::TooMany;
        }
        recent.push_back((now, call, target.to_string()));
        Report::Record
    }
}

/// The installed task's last result as the OS reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskResult {
    Succeeded,
    Running,
    NotYetRun,
    Failed(i64),
}

impl TaskResult {
    /// Windows Task Scheduler's LastTaskResult: 0x41301 running and 0x41303 not yet run are
    /// not failures (seed 000).
    pub fn from_windows(code: i64) -> TaskResult {
        match code {
            0 => TaskResult::Succeeded,
            0x41301 => TaskResult::Running,
            0x41303 => TaskResult::NotYetRun,
            other => TaskResult::Failed(other),
        }
    }
}

pub const STALE_POLL: chrono::TimeDelta = chrono::TimeDelta::minutes(10);

/// A5: re-register when the last result is a failure, or the last poll is older than 10m.
/// A task that has never polled and never failed was just installed: leave it.
pub fn needs_reregister(last: TaskResult, last_poll: Option<Ts>, now: Ts) -> bool {
    matches!(last, TaskResult::Failed(_)) || last_poll.is_some_and(|t| now - t > STALE_POLL)
}

/// A2: a polled mail that fails these checks is quarantined (kept aside, reported `fail`),
/// never presented; the others are unaffected.
pub fn validate_polled(m: &Mail, me: &str) -> Result<(), Quarantined> {
    if !is_stored_id(&m.id) {
        return Err(Quarantined::MalformedId(m.id.clone()));
    }
    if m.to != me {
        return Err(Quarantined::NotForMe { to: m.to.clone(), me: me.to_string() });
    }
    if m.body.len() > MAX_BODY_BYTES || m.subject.contains(['\n', '\r']) {
        return Err(Quarantined::OutsideLimits);
    }
    Ok(())
}

/// A2: why a polled mail was kept aside; the text is stored with it and sent as the `fail`'s reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Quarantined {
    #[error("malformed id {0:?}")]
    MalformedId(String),
    #[error("addressed to {to:?}, not to this machine ({me})")]
    NotForMe { to: String, me: String },
    #[error("subject or body outside the mail limits")]
    OutsideLimits,
}

/// A1: the local row is the record of what was processed here. A polled copy only moves it
/// forward (a state further along), and never takes back what this PC recorded: when and in
/// which session it was shown, and when it was reminded.
pub fn merge_polled(local: Option<&Mail>, polled: Mail) -> Option<Mail> {
    let Some(local) = local else { return Some(polled) };
    if local.state.is_terminal() || polled.state.rank() <= local.state.rank() {
        return None;
    }
    Some(Mail {
        presented_at: local.presented_at,
        presented_session: local.presented_session.clone(),
        last_reminded_at: local.last_reminded_at,
        ..polled
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t10_a_refused_call_is_recorded_once_and_a_machine_at_most_sixty_an_hour() {
        use crate::mail::fixtures::at;
        let mut r = RefusalReports::default();
        assert_eq!(r.report("desk", QueuedCall::Intent, "telegram:1:2", at(0)), Report::Record);
        assert_eq!(r.report("desk", QueuedCall::Intent, "telegram:1:2", at(5)), Report::Repeat);
        assert_eq!(r.report("desk", QueuedCall::Seen, "telegram:1:2", at(5)), Report::Record, "another action");
        assert_eq!(r.report("laptop", QueuedCall::Intent, "telegram:1:2", at(5)), Report::Record, "another machine");
        for i in 2..REFUSALS_PER_HOUR {
            assert_eq!(r.report("desk", QueuedCall::Ack, &format!("mail--{i:08x}"), at(10)), Report::Record);
        }
        assert_eq!(r.report("desk", QueuedCall::Ack, "mail--ffffffff", at(10)), Report::TooMany);
        assert_eq!(r.report("laptop", QueuedCall::Ack, "mail--ffffffff", at(10)), Report::Record);
        assert_eq!(r.report("desk", QueuedCall::Ack, "mail--ffffffff", at(3600)), Report::Record, "the first aged out");
        assert_eq!(
            r.report("desk", QueuedCall::Intent, "telegram:1:2", at(3605)),
            Report::Record,
            "recorded again after an hour"
        );
    }
    use crate::mail::MailState;
    use crate::mail::fixtures::{at, mail};

    #[test]
    fn a1_a_polled_copy_moves_the_local_row_only_forward() {
        let mut local = mail("mail--00000001", "desk", "me");
        local.state = MailState::Seen;
        local.presented_session = Some("s1".into());
        let mut polled = local.clone();
        polled.presented_session = None;
        polled.state = MailState::Delivered;
        assert_eq!(merge_polled(Some(&local), polled.clone()), None, "an older copy changes nothing");
        polled.state = MailState::Done;
        let merged = merge_polled(Some(&local), polled).expect("moves");
        assert_eq!((merged.state, merged.presented_session.as_deref()), (MailState::Done, Some("s1")));
    }

    #[test]
    fn a2_a_mail_for_another_machine_or_malformed_is_quarantined() {
        assert_eq!(validate_polled(&mail("mail--00000001", "desk", "me"), "me"), Ok(()));
        assert!(validate_polled(&mail("mail--00000001", "desk", "other"), "me").is_err());
        assert!(validate_polled(&mail("bad", "desk", "me"), "me").is_err());
    }

    #[test]
    fn a4_unknown_action_backs_off_1h_and_is_dropped_after_5_tries() {
        assert_eq!(after_call(&CallOutcome::Unknown, 0, at(0)), NextStep::RetryAt(at(3600)));
        assert_eq!(after_call(&CallOutcome::Unknown, 3, at(0)), NextStep::RetryAt(at(3600)));
        assert!(matches!(after_call(&CallOutcome::Unknown, 4, at(0)), NextStep::Drop(_)));
    }

    #[test]
    fn a4_t10_unreachable_retries_at_the_next_poll_and_refusals_are_kept_not_retried() {
        assert_eq!(after_call(&CallOutcome::Unreachable, 9, at(5)), NextStep::RetryAt(at(5)));
        assert_eq!(after_call(&CallOutcome::Refused("403".into()), 0, at(5)), NextStep::Refused("403".into()));
        assert_eq!(after_call(&CallOutcome::Ok, 0, at(5)), NextStep::Done);
    }

    #[test]
    fn t10_a_conflict_refuses_a_queued_intent_while_a_missing_roster_waits() {
        use QueuedCall::*;
        let conflict = call_outcome(Intent, Err((Some(409), "taken")));
        assert_eq!(conflict, CallOutcome::Refused("409: taken".into()));
        assert_eq!(call_outcome(Intent, Err((Some(422), "no roster"))), CallOutcome::Unreachable);
        assert_eq!(call_outcome(Seen, Err((Some(422), "bad"))), CallOutcome::Refused("422: bad".into()));
        assert_eq!(call_outcome(Ack, Err((Some(404), "?"))), CallOutcome::Unknown);
        assert_eq!(call_outcome(Ack, Err((Some(426), "upgrade"))), CallOutcome::Unreachable, "V2: waits");
        for retried in [401, 408, 429, 500, 503] {
            assert_eq!(call_outcome(Fail, Err((Some(retried), ""))), CallOutcome::Unreachable, "{retried}");
        }
        assert_eq!(call_outcome(Seen, Err((None, "connection refused"))), CallOutcome::Unreachable);
        assert!(QueuedCall::ALL.iter().all(|c| QueuedCall::from_name(c.as_str()) == Some(*c)));
    }

    #[test]
    fn a5_running_and_not_yet_run_are_not_failures() {
        let now = at(10_000);
        assert!(!needs_reregister(TaskResult::from_windows(0x41301), Some(now), now));
        assert!(!needs_reregister(TaskResult::from_windows(0x41303), None, now));
        assert!(needs_reregister(TaskResult::from_windows(1), Some(now), now));
    }

    #[test]
    fn a5_a_poll_older_than_10m_reregisters() {
        let now = at(10_000);
        assert!(!needs_reregister(TaskResult::Succeeded, Some(now - STALE_POLL), now));
        assert!(needs_reregister(TaskResult::Succeeded, Some(now - STALE_POLL - chrono::TimeDelta::seconds(1)), now));
    }
}
