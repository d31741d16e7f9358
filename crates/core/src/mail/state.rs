//! M1/M2: the forward-only, idempotent mail state machine.

use super::{Mail, MailState};
use crate::Ts;

crate::wire_enum! {
    /// A step a machine asks for by name, `POST /api/v1/mail/{id}/{action}` (M7): named for
    /// what the caller does, so only `seen` is spelled as the state it moves to.
    pub enum Action as "mail action" {
        Seen = "seen",
        Ack = "ack",
        Fail = "fail",
    }
}

/// A requested move of one mail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Deliver,
    See,
    Done { result: Option<String> },
    Fail { reason: String },
    Expire,
}

impl Step {
    pub fn target(&self) -> MailState {
        match self {
            Step::Deliver => MailState::Delivered,
            Step::See => MailState::Seen,
            Step::Done { .. } => MailState::Done,
            Step::Fail { .. } => MailState::Failed,
            Step::Expire => MailState::Expired,
        }
    }
}

/// Applies `step` by `actor` at `now`. `None` means the mail is unchanged: asking for an equal
/// or earlier state, or for anything after a terminal state, is answered ok with the current
/// state (M1). Each step stamps its time and actor, and skipping a step stamps the skipped ones,
/// so a mail that is seen was also delivered (M2). Stamps already set are never overwritten.
pub fn apply_step(mail: &Mail, step: &Step, actor: &str, now: Ts) -> Option<Mail> {
    let target = step.target();
    if mail.state.is_terminal() || target.rank() <= mail.state.rank() {
        return None;
    }
    let mut next = mail.clone();
    next.state = target;
    let stamp = |at: &mut Option<Ts>, by: &mut Option<String>| {
        if at.is_none() {
            *at = Some(now);
            *by = Some(actor.to_string());
        }
    };
    if target != MailState::Expired {
        stamp(&mut next.delivered_at, &mut next.delivered_by);
    }
    match step {
        Step::Deliver | Step::Expire => {}
        Step::See => stamp(&mut next.seen_at, &mut next.seen_by),
        Step::Done { result } => {
            // Answering or acking a mail means it was handled, so it was seen.
            stamp(&mut next.seen_at, &mut next.seen_by);
            next.done_at = Some(now);
            next.result = result.clone();
        }
        Step::Fail { reason } => {
            next.done_at = Some(now);
            next.fail_reason = Some(reason.clone());
        }
    }
    Some(next)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::fixtures::{at, mail};
    use super::*;

    fn m() -> Mail {
        mail("mail--00000001", "pc1", "pc2")
    }

    #[test]
    fn m1_forward_steps_move_and_stamp() {
        let d = apply_step(&m(), &Step::Deliver, "pc2", at(1)).expect("moves");
        assert_eq!(
            (d.state, d.delivered_at, d.delivered_by.as_deref()),
            (MailState::Delivered, Some(at(1)), Some("pc2"))
        );
        let s = apply_step(&d, &Step::See, "pc2", at(2)).expect("moves");
        assert_eq!((s.state, s.seen_at, s.delivered_at), (MailState::Seen, Some(at(2)), Some(at(1))));
        let done = apply_step(&s, &Step::Done { result: Some("ok".into()) }, "pc2", at(3)).expect("moves");
        assert_eq!((done.state, done.done_at, done.result.as_deref()), (MailState::Done, Some(at(3)), Some("ok")));
    }

    #[test]
    fn m1_seen_after_done_stays_done() {
        let done = apply_step(&m(), &Step::Done { result: None }, "pc2", at(1)).expect("moves");
        assert_eq!(apply_step(&done, &Step::See, "pc2", at(2)), None);
        assert_eq!(apply_step(&done, &Step::Fail { reason: "x".into() }, "pc2", at(2)), None);
    }

    #[test]
    fn m1_expiry_never_overwrites_done_or_failed() {
        let done = apply_step(&m(), &Step::Done { result: None }, "pc2", at(1)).expect("moves");
        let failed = apply_step(&m(), &Step::Fail { reason: "no".into() }, "pc2", at(1)).expect("moves");
        assert_eq!(apply_step(&done, &Step::Expire, "controller", at(9)), None);
        assert_eq!(apply_step(&failed, &Step::Expire, "controller", at(9)), None);
    }

    #[test]
    fn m1_equal_or_earlier_state_changes_nothing() {
        let s = apply_step(&m(), &Step::See, "pc2", at(1)).expect("moves");
        assert_eq!(apply_step(&s, &Step::See, "pc2", at(2)), None);
        assert_eq!(apply_step(&s, &Step::Deliver, "pc2", at(2)), None);
    }

    #[test]
    fn m2_new_to_seen_directly_also_stamps_delivered() {
        let s = apply_step(&m(), &Step::See, "pc2", at(5)).expect("moves");
        assert_eq!((s.delivered_at, s.delivered_by.as_deref()), (Some(at(5)), Some("pc2")));
        assert_eq!((s.seen_at, s.seen_by.as_deref()), (Some(at(5)), Some("pc2")));
    }

    #[test]
    fn m2_expired_mail_was_never_delivered() {
        let e = apply_step(&m(), &Step::Expire, "controller", at(5)).expect("moves");
        assert_eq!((e.state, e.delivered_at), (MailState::Expired, None));
    }

    fn any_step() -> impl Strategy<Value = Step> {
        prop_oneof![
            Just(Step::Deliver),
            Just(Step::See),
            Just(Step::Done { result: Some("r".into()) }),
            Just(Step::Fail { reason: "f".into() }),
            Just(Step::Expire),
        ]
    }

    proptest! {
        /// M1, M2: whatever order and repetition, the state is the first terminal step reached,
        /// else the highest rank asked; every stamp is the time of the first step that set it.
        #[test]
        fn m1_m2_any_sequence_is_forward_only_and_keeps_first_stamps(
            steps in proptest::collection::vec(any_step(), 0..24)
        ) {
            let mut mail = m();
            let mut expected = MailState::New;
            let (mut first_delivered, mut first_seen) = (None, None);
            for (i, step) in steps.iter().enumerate() {
                let now = at(i as i64 + 1);
                let target = step.target();
                if !expected.is_terminal() && target.rank() > expected.rank() {
                    if target != MailState::Expired && first_delivered.is_none() {
                        first_delivered = Some(now);
                    }
                    if matches!(target, MailState::Seen | MailState::Done) && first_seen.is_none() {
                        first_seen = Some(now);
                    }
                    expected = target;
                }
                let before = mail.clone();
                if let Some(next) = apply_step(&mail, step, "pc2", now) {
                    prop_assert!(next.state.rank() > before.state.rank());
                    mail = next;
                }
            }
            prop_assert_eq!(mail.state, expected);
            prop_assert_eq!(mail.delivered_at, first_delivered);
            prop_assert_eq!(mail.seen_at, first_seen);
        }
    }
}
