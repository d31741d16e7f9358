//! Mail (seed 000): the row, its state machine (M1, M2), sending and replying (M3–M7),
//! expiry (M8), and who may see or move which mail (C3).

mod access;
mod send;
mod state;
mod sweep;

use serde::{Deserialize, Serialize};

use crate::Ts;
use crate::duration::Dur;
pub use access::{Principal, can_move, can_view};
pub use send::{
    MAX_BODY_BYTES, MAX_SUBJECT_CHARS, SendContext, SendError, SendObserved, SendOutcome, SendPlan, SendRequest,
    plan_send, reply_refusal, send_ids,
};
pub use state::{Action, Step, apply_step};
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

    /// M12: the mail's timeline in order, each line with its stamp (None: not reached yet) and
    /// who stamped it where the row keeps that. The closing line is the terminal state the mail
    /// ended in: `failed`, else `done` (the expiry has its own line).
    pub fn timeline(&self) -> [TimelineEntry<'_>; 5] {
        let closing = if self.state == MailState::Failed { MailState::Failed } else { MailState::Done };
        fn entry(milestone: Milestone, at: Option<Ts>, by: Option<&String>) -> TimelineEntry<'_> {
            TimelineEntry { milestone, at, by: by.map(String::as_str) }
        }
        [
            entry(Milestone::Created, Some(self.created_at), Some(&self.from)),
            entry(Milestone::Reached(MailState::Delivered), self.delivered_at, self.delivered_by.as_ref()),
            entry(Milestone::Reached(MailState::Seen), self.seen_at, self.seen_by.as_ref()),
            entry(Milestone::Reached(closing), self.done_at, None),
            entry(Milestone::Expires, Some(self.expires_at), None),
        ]
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

    /// The states still waiting on their recipient, as a SQL `IN` list: the PC cache's "open
    /// mail" predicates (R3). The store writes the set as an `OR` chain (`predicates`).
    pub fn open_sql() -> String {
        MailState::sql_in(|s| !s.is_terminal())
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

impl MailState {
    /// M12: the states a caller may wait for a mail to reach (a terminal one ends the wait too).
    pub const AWAITABLE: [MailState; 2] = [MailState::Seen, MailState::Done];
}

/// What one line of M12's timeline marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Milestone {
    Created,
    /// A state the mail moves through, labelled by its wire name.
    Reached(MailState),
    Expires,
}

impl Milestone {
    pub fn label(self) -> &'static str {
        match self {
            Milestone::Created => "created",
            Milestone::Reached(state) => state.as_str(),
            Milestone::Expires => "expires",
        }
    }
}

/// One line of M12's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEntry<'a> {
    pub milestone: Milestone,
    pub at: Option<Ts>,
    pub by: Option<&'a str>,
}

/// R2/R3: every rule that depends on a mail's kind is one of these methods, each an exhaustive
/// match, so a new kind does not compile until each is decided for it; the SQL, tool schemas and
/// OpenAPI enums that depend on a kind are derived from them.
impl MailKind {
    /// Whether a send may carry this kind: intents are recorded from a chat, never sent (I-rules).
    pub fn can_be_sent(self) -> bool {
        match self {
            MailKind::Note | MailKind::Request | MailKind::Decision | MailKind::Work | MailKind::Answer => true,
            MailKind::Intent => false,
        }
    }

    /// The kind a reply carries unless told otherwise (M7): acked once shown (H2), and not one a
    /// new thread starts with, so the MCP `send` tool does not offer it.
    pub fn is_answer(self) -> bool {
        match self {
            MailKind::Answer => true,
            MailKind::Note | MailKind::Request | MailKind::Decision | MailKind::Work | MailKind::Intent => false,
        }
    }

    /// Whether a reply by mail may answer it (M7): an intent is answered in its chat.
    pub fn can_be_answered_by_mail(self) -> bool {
        match self {
            MailKind::Note | MailKind::Request | MailKind::Decision | MailKind::Work | MailKind::Answer => true,
            MailKind::Intent => false,
        }
    }

    /// A chat message recorded as mail (seed 003): listed, reminded and escalated as an intent
    /// (I3–I5), kept apart from the mail a hook presents.
    pub fn is_intent(self) -> bool {
        match self {
            MailKind::Intent => true,
            MailKind::Note | MailKind::Request | MailKind::Decision | MailKind::Work | MailKind::Answer => false,
        }
    }

    /// H2's group of open mail of this kind before urgency lifts it ([`PresentationGroup::URGENT`]);
    /// None: never presented (an intent has its own listing).
    pub fn group(self) -> Option<PresentationGroup> {
        match self {
            MailKind::Decision => Some(PresentationGroup::Decisions),
            MailKind::Work => Some(PresentationGroup::Work),
            MailKind::Answer => Some(PresentationGroup::Answers),
            MailKind::Note | MailKind::Request => Some(PresentationGroup::Others),
            MailKind::Intent => None,
        }
    }

    /// M10: whether mail of this kind notifies people on arrival (urgent mail of any kind does).
    pub fn notifies_on_arrival(self) -> bool {
        match self {
            MailKind::Decision | MailKind::Work => true,
            MailKind::Note | MailKind::Request | MailKind::Answer | MailKind::Intent => false,
        }
    }

    /// M9: how soon mail of this kind must be read, when that is sooner than the MailPolicy's
    /// unread SLA; None: the policy's SLA alone.
    pub fn read_within(self) -> Option<Dur> {
        match self {
            MailKind::Note
            | MailKind::Request
            | MailKind::Decision
            | MailKind::Work
            | MailKind::Answer
            | MailKind::Intent => None,
        }
    }

    /// H4: whether open urgent mail of this kind keeps a session from stopping.
    pub fn blocks_stop(self) -> bool {
        match self {
            MailKind::Decision => true,
            MailKind::Note | MailKind::Request | MailKind::Work | MailKind::Answer | MailKind::Intent => false,
        }
    }
}

/// H2's groups, in the order a hook shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PresentationGroup {
    Decisions,
    Work,
    Answers,
    Others,
}

impl PresentationGroup {
    pub const ALL: [PresentationGroup; 4] =
        [PresentationGroup::Decisions, PresentationGroup::Work, PresentationGroup::Answers, PresentationGroup::Others];
    /// The group urgent mail is lifted to, unless its kind's group comes before it.
    pub const URGENT: PresentationGroup = PresentationGroup::Work;

    /// The group of open mail of `kind`, urgent or not (H2).
    pub fn of(kind: MailKind, urgent: bool) -> Option<PresentationGroup> {
        kind.group().map(|g| if urgent { g.min(PresentationGroup::URGENT) } else { g })
    }

    /// Its place in [`PresentationGroup::ALL`] (0 = shown first).
    pub fn index(self) -> usize {
        self as usize
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A kind no send may carry is a chat's intent, and only that: never answered by mail, never
    /// in H2's groups, never an answer, an arrival notice or a stop's reason.
    #[test]
    fn r2_a_kind_no_send_may_carry_is_a_chat_intent_and_nothing_else() {
        for k in MailKind::ALL {
            assert_eq!(!k.can_be_sent(), k.is_intent(), "{k}");
            assert_eq!(!k.can_be_answered_by_mail(), k.is_intent(), "{k}");
            assert_eq!(k.group().is_none(), k.is_intent(), "{k}");
            assert!(!(k.is_intent() && (k.is_answer() || k.notifies_on_arrival() || k.blocks_stop())), "{k}");
        }
        assert_eq!(MailKind::ALL.into_iter().filter(|k| k.is_intent()).collect::<Vec<_>>(), [MailKind::Intent]);
    }

    #[test]
    fn h2_urgency_lifts_mail_to_the_work_group_and_never_lowers_it() {
        for k in MailKind::ALL {
            let (calm, urgent) = (PresentationGroup::of(k, false), PresentationGroup::of(k, true));
            assert_eq!(calm, k.group(), "{k}");
            assert_eq!(urgent, calm.map(|g| g.min(PresentationGroup::Work)), "{k}");
        }
        assert_eq!(PresentationGroup::of(MailKind::Decision, true), Some(PresentationGroup::Decisions));
        assert_eq!(PresentationGroup::of(MailKind::Answer, true), Some(PresentationGroup::Work));
        assert_eq!(PresentationGroup::ALL.map(PresentationGroup::index), [0, 1, 2, 3]);
    }

    #[test]
    fn m12_the_timeline_stamps_each_state_reached_and_closes_with_the_one_it_ended_in() {
        use fixtures::{at, mail};
        let seen = Mail {
            state: MailState::Seen,
            delivered_at: Some(at(5)),
            delivered_by: Some("pc2".into()),
            seen_at: Some(at(7)),
            seen_by: Some("pc2".into()),
            ..mail("mail--00000001", "pc1", "pc2")
        };
        let lines: Vec<_> = seen.timeline().into_iter().map(|e| (e.milestone.label(), e.at, e.by)).collect();
        assert_eq!(
            lines,
            [
                ("created", Some(at(0)), Some("pc1")),
                ("delivered", Some(at(5)), Some("pc2")),
                ("seen", Some(at(7)), Some("pc2")),
                ("done", None, None),
                ("expires", Some(at(1000)), None),
            ]
        );
        let failed = Mail { state: MailState::Failed, done_at: Some(at(9)), ..seen };
        let closing = &failed.timeline()[3];
        assert_eq!((closing.milestone, closing.at), (Milestone::Reached(MailState::Failed), Some(at(9))));
    }
}
