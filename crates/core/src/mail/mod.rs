//! Mail (seed 000): the row, its state machine (M1, M2), sending and replying (M3–M7),
//! expiry (M8), and who may see or move which mail (C3).

mod access;
mod send;
mod state;
mod sweep;

use serde::{Deserialize, Serialize};

use crate::Ts;
pub use access::{Principal, can_move, can_view};
pub use send::{
    MAX_BODY_BYTES, MAX_SUBJECT_CHARS, SendContext, SendError, SendObserved, SendOutcome, SendPlan, SendRequest,
    plan_send, reply_refusal, send_ids,
};
pub use state::{Step, apply_step};
pub use sweep::{deliver_or_expire, plan_expiry, poll_start};

/// One row of the `mail` tab. Field names are the tab's column names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mail {
    /// Delivery order, assigned by the store on insert; the per-recipient cursor of M11.
    #[serde(default)]
    pub seq: i64,
    pub id: String,
    pub from: String,
    pub to: String,
    pub kind: MailKind,
    pub subject: String,
    pub body: String,
    pub urgent: bool,
    pub auto: bool,
    pub hop: u32,
    pub reply_to: Option<String>,
    pub channel: String,
    pub external_key: Option<String>,
    pub state: MailState,
    pub created_at: Ts,
    pub expires_at: Ts,
    pub delivered_at: Option<Ts>,
    pub delivered_by: Option<String>,
    pub seen_at: Option<Ts>,
    pub seen_by: Option<String>,
    pub done_at: Option<Ts>,
    pub result: Option<String>,
    pub fail_reason: Option<String>,
    pub presented_at: Option<Ts>,
    pub presented_session: Option<String>,
    pub last_reminded_at: Option<Ts>,
}

impl Mail {
    /// The bytes of the mail's free texts (what makes one mail large): what a listing's byte
    /// budget (T15, [`crate::page::MAX_PAGE_BYTES`]) counts while a store reads a page.
    pub fn text_bytes(&self) -> usize {
        let optional = |t: &Option<String>| t.as_ref().map_or(0, String::len);
        self.subject.len() + self.body.len() + optional(&self.result) + optional(&self.fail_reason)
    }

    /// A fresh `new` note on channel `pc`: hop 0, nothing stamped. Callers set the rest with
    /// struct update syntax.
    pub fn new(id: String, from: String, to: String, created_at: Ts, expires_at: Ts) -> Mail {
        Mail {
            seq: 0,
            id,
            from,
            to,
            kind: MailKind::Note,
            subject: String::new(),
            body: String::new(),
            urgent: false,
            auto: false,
            hop: 0,
            reply_to: None,
            channel: "pc".into(),
            external_key: None,
            state: MailState::New,
            created_at,
            expires_at,
            delivered_at: None,
            delivered_by: None,
            seen_at: None,
            seen_by: None,
            done_at: None,
            result: None,
            fail_reason: None,
            presented_at: None,
            presented_session: None,
            last_reminded_at: None,
        }
    }
}

crate::wire_enum! {
    pub enum MailState as "mail state" {
        New = "new",
        Delivered = "delivered",
        Seen = "seen",
        Done = "done",
        Failed = "failed",
        Expired = "expired",
    }
}

impl MailState {
    /// M1's forward-only order; the three terminal states share the last rank.
    pub fn rank(self) -> u8 {
        match self {
            MailState::New => 0,
            MailState::Delivered => 1,
            MailState::Seen => 2,
            MailState::Done | MailState::Failed | MailState::Expired => 3,
        }
    }

    pub fn is_terminal(self) -> bool {
        self.rank() == 3
    }

    /// The states still waiting on their recipient, as a SQL `IN` list: the store's and the PC
    /// cache's "open mail" predicates (R3).
    pub fn open_sql() -> String {
        MailState::sql_in(|s| !s.is_terminal())
    }

    /// The terminal states, as a SQL `IN` list (retention's closed mail).
    pub fn closed_sql() -> String {
        MailState::sql_in(MailState::is_terminal)
    }
}

crate::wire_enum! {
    #[derive(Default)]
    pub enum MailKind as "mail kind" {
        #[default]
        Note = "note",
        Request = "request",
        Decision = "decision",
        Work = "work",
        Answer = "answer",
        Intent = "intent",
    }
}

impl MailKind {
    /// Whether a send may carry this kind: intents are recorded from a chat, never sent (I-rules).
    pub fn can_be_sent(self) -> bool {
        self != MailKind::Intent
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn at(secs: i64) -> Ts {
        Ts::from_timestamp(secs, 0).unwrap_or_default()
    }

    pub fn mail(id: &str, from: &str, to: &str) -> Mail {
        Mail { subject: "s".into(), body: "b".into(), ..Mail::new(id.into(), from.into(), to.into(), at(0), at(1000)) }
    }
}
