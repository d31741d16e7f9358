//! M8: the controller's expiry sweep.

use super::{Mail, Step, apply_step};
use crate::Ts;

/// The mails to write back as expired, each with the row it replaces: non-terminal ones whose
/// `expiresAt` is at or before `now`. Done and failed mail is never touched (M1 keeps terminal
/// states).
pub fn plan_expiry(mails: &[Mail], now: Ts) -> Vec<(&Mail, Mail)> {
    mails
        .iter()
        .filter(|m| m.expires_at <= now)
        .filter_map(|m| Some((m, apply_step(m, &Step::Expire, "controller", now)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{at, mail};
    use super::super::{MailState, Step, apply_step};
    use super::*;

    #[test]
    fn m8_expiry_at_the_boundary_and_never_over_terminal_states() {
        let mut open = mail("mail--00000001", "pc1", "pc2");
        open.expires_at = at(100);
        let done = apply_step(&open, &Step::Done { result: None }, "pc2", at(50)).expect("moves");
        let mut later = open.clone();
        later.id = "mail--00000002".into();
        later.expires_at = at(101);

        assert!(plan_expiry(&[open.clone()], at(99)).is_empty());
        let all = [open, done, later];
        let expired = plan_expiry(&all, at(100));
        assert_eq!(expired.len(), 1);
        let (before, after) = &expired[0];
        assert_eq!(
            (after.id.as_str(), after.state, before.state),
            ("mail--00000001", MailState::Expired, MailState::New)
        );
    }
}
