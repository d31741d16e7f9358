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

/// E6: what a poll does to a mail it hands out — a `new` one is delivered, unless it expired
/// (M8 at the moment of delivery: an expired mail is never delivered, whenever the sweep runs).
/// None: the poll leaves it as it is.
pub fn deliver_or_expire(m: &Mail, by: &str, now: Ts) -> Option<Mail> {
    if m.state != super::MailState::New {
        return None;
    }
    let step = if m.expires_at <= now { Step::Expire } else { Step::Deliver };
    apply_step(m, &step, by, now)
}

/// E5: where a poll starts — the client's cursor, unless it belongs to another store (the PC
/// logged in elsewhere, the server was rebuilt) or lies beyond this store's last seq (restored
/// from an older copy): then from 0, so no mail is skipped (merging again is idempotent, A1).
pub fn poll_start(cursor: i64, client_store: Option<&str>, store: &str, last_seq: i64) -> i64 {
    let foreign = client_store.is_some_and(|s| !s.is_empty() && s != store);
    if foreign || cursor > last_seq { 0 } else { cursor }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{at, mail};
    use super::super::{MailState, Step, apply_step};
    use super::*;

    #[test]
    fn e5_a_cursor_of_another_store_or_beyond_the_last_seq_starts_again_from_0() {
        assert_eq!(poll_start(7, Some("abc"), "abc", 9), 7);
        assert_eq!(poll_start(7, None, "abc", 9), 7, "an older client sends no identity");
        assert_eq!(poll_start(7, Some(""), "abc", 9), 7, "nor does a PC that never polled");
        assert_eq!(poll_start(7, Some("old"), "abc", 9), 0, "moved to another server");
        assert_eq!(poll_start(12, Some("abc"), "abc", 9), 0, "restored from an older copy");
        assert_eq!(poll_start(9, Some("abc"), "abc", 9), 9);
    }

    #[test]
    fn e6_a_poll_delivers_a_new_mail_but_expires_one_past_its_expiry() {
        let mut m = mail("mail--00000001", "pc1", "pc2");
        m.expires_at = at(100);
        let delivered = deliver_or_expire(&m, "pc2", at(99)).expect("delivered");
        assert_eq!((delivered.state, delivered.delivered_by.as_deref()), (MailState::Delivered, Some("pc2")));
        let expired = deliver_or_expire(&m, "pc2", at(100)).expect("expired");
        assert_eq!((expired.state, expired.delivered_at), (MailState::Expired, None), "never delivered");
        assert_eq!(deliver_or_expire(&delivered, "pc2", at(200)), None, "a poll moves only new mail");
    }

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
