//! R1: the trail's words as types. An [`Event`](crate::api::Event) names its object as an
//! [`ObjectRef`] and says why as a [`Reason`]; the text `kind/name` and `Sent` exist only in the
//! store's row and the API's JSON, and the store's SQL over the trail is written from them.
//!
//! Both read leniently: a PC or CLI talking to a newer server, or a store a newer build wrote
//! into, meets kinds and reasons this build never wrote, and must show the trail, not fail on it.

use serde::Deserialize as _;

use crate::mail::MailState;
use crate::manifest::Kind;

crate::wire_enum! {
    /// The tab or manifest kind an event's object lives in (the text before the first `/`).
    pub enum ObjectKind as "object kind" {
        Mail = "mail",
        /// A ledger row (`ledger/<project>/<id>`) and a Ledger manifest (`ledger/<name>`) alike.
        Ledger = "ledger",
        Machine = "machine",
        Roster = "roster",
        MailPolicy = "mailpolicy",
        IntentPolicy = "intentpolicy",
        WorkerPool = "workerpool",
        Function = "function",
        Schedule = "schedule",
        /// A kind this build does not know: the object's whole text is kept as its name.
        Other = "other",
    }
}

impl ObjectKind {
    /// The kind of a manifest object's events (`roster/office`).
    pub fn of_spec(kind: Kind) -> ObjectKind {
        match kind {
            Kind::Roster => ObjectKind::Roster,
            Kind::MailPolicy => ObjectKind::MailPolicy,
            Kind::IntentPolicy => ObjectKind::IntentPolicy,
            Kind::WorkerPool => ObjectKind::WorkerPool,
            Kind::Function => ObjectKind::Function,
            Kind::Ledger => ObjectKind::Ledger,
            Kind::Schedule => ObjectKind::Schedule,
        }
    }

    /// `object LIKE 'mail/%'`: the SQL test that an event's object is of this kind. The wire
    /// name is the enum's own literal, never input, so quoting it is safe.
    pub fn sql_like(self, column: &str) -> String {
        format!("{column} LIKE '{}/%'", self.as_str())
    }
}

/// What an event is about: `kind/name` on the wire (`mail/mail--0a1b`, `ledger/office/T-0001`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub name: String,
}

impl ObjectRef {
    pub fn new(kind: ObjectKind, name: impl Into<String>) -> ObjectRef {
        ObjectRef { kind, name: name.into() }
    }

    pub fn mail(id: &str) -> ObjectRef {
        ObjectRef::new(ObjectKind::Mail, id)
    }

    /// A ledger row: its name is `<project>/<id>`.
    pub fn ledger_row(project: &str, id: &str) -> ObjectRef {
        ObjectRef::new(ObjectKind::Ledger, format!("{project}/{id}"))
    }

    pub fn machine(name: &str) -> ObjectRef {
        ObjectRef::new(ObjectKind::Machine, name)
    }

    pub fn spec(kind: Kind, name: &str) -> ObjectRef {
        ObjectRef::new(ObjectKind::of_spec(kind), name)
    }

    /// Reads `kind/name` back; text of a kind this build does not know (or without a `/`) is
    /// [`ObjectKind::Other`] holding the whole text, so that it is shown as it was written.
    pub fn parse(text: &str) -> ObjectRef {
        match text.split_once('/').and_then(|(k, name)| Some((ObjectKind::from_name(k)?, name))) {
            Some((kind, name)) if kind != ObjectKind::Other => ObjectRef::new(kind, name),
            _ => ObjectRef::new(ObjectKind::Other, text),
        }
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.kind {
            ObjectKind::Other => f.write_str(&self.name),
            kind => write!(f, "{kind}/{}", self.name),
        }
    }
}

impl serde::Serialize for ObjectRef {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ObjectRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(ObjectRef::parse(&text))
    }
}

crate::wire_enum! {
    /// Why an event was recorded: every reason this build writes.
    pub enum Reason as "event reason" {
        // A mail's life (M1): sent, then each state it moves to (see `Reason::of_state`).
        Sent = "Sent",
        New = "New",
        Delivered = "Delivered",
        Seen = "Seen",
        Done = "Done",
        /// A mail that failed, and a ledger row's run that failed.
        Failed = "Failed",
        Expired = "Expired",
        IntentEdited = "IntentEdited",
        IntentConflict = "IntentConflict",
        // A ledger row's life (L5–L13).
        Added = "Added",
        Updated = "Updated",
        Enqueued = "Enqueued",
        Claimed = "Claimed",
        Succeeded = "Succeeded",
        TimedOut = "TimedOut",
        Skipped = "Skipped",
        Edited = "Edited",
        EditedInSheet = "EditedInSheet",
        Purged = "Purged",
        // A manifest object's.
        Created = "Created",
        Configured = "Configured",
        Deleted = "Deleted",
        /// T10: a PC reported a queued call the server refused.
        PendingRefused = "PendingRefused",
        /// A reason this build does not know (a newer server's, a newer build's row): its text
        /// is not kept.
        Other = "Other",
    }
}

impl Reason {
    /// The reason of a mail's move into `state`: its name capitalised (`seen` → `Seen`).
    pub fn of_state(state: MailState) -> Reason {
        match state {
            MailState::New => Reason::New,
            MailState::Delivered => Reason::Delivered,
            MailState::Seen => Reason::Seen,
            MailState::Done => Reason::Done,
            MailState::Failed => Reason::Failed,
            MailState::Expired => Reason::Expired,
        }
    }

    /// Reads a reason back; one this build does not know is [`Reason::Other`], never an error.
    pub fn lenient(text: &str) -> Reason {
        Reason::from_name(text).unwrap_or(Reason::Other)
    }

    /// `reason = 'Sent'` for SQL over the trail. The wire name is the enum's own literal.
    pub fn sql_eq(self, column: &str) -> String {
        format!("{column} = '{}'", self.as_str())
    }
}

/// serde's `deserialize_with` for an event's reason: [`Reason::lenient`].
pub fn lenient_reason<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Reason, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    Ok(Reason::lenient(&text))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Event;

    #[test]
    fn r1_object_refs_round_trip_as_kind_slash_name() {
        for (object, wire) in [
            (ObjectRef::mail("mail--0a1b"), "mail/mail--0a1b"),
            (ObjectRef::ledger_row("office", "T-0001"), "ledger/office/T-0001"),
            (ObjectRef::machine("pc1"), "machine/pc1"),
            (ObjectRef::spec(Kind::MailPolicy, "default"), "mailpolicy/default"),
        ] {
            assert_eq!(object.to_string(), wire);
            assert_eq!(ObjectRef::parse(wire), object);
        }
        for kind in Kind::ALL {
            assert_eq!(ObjectKind::of_spec(kind).as_str(), kind.cli_name(), "{kind:?}: the text older builds wrote");
        }
    }

    #[test]
    fn r1_an_object_of_a_kind_this_build_does_not_know_keeps_its_text() {
        for foreign in ["widget/w1", "no-slash", "other/x", ""] {
            let object = ObjectRef::parse(foreign);
            assert_eq!((object.kind, object.to_string()), (ObjectKind::Other, foreign.to_string()));
        }
    }

    #[test]
    fn r1_a_mails_reasons_are_its_states_capitalised_as_before() {
        for state in MailState::ALL {
            let name = state.as_str();
            let capitalised = format!("{}{}", name[..1].to_ascii_uppercase(), &name[1..]);
            assert_eq!(Reason::of_state(state).as_str(), capitalised);
        }
    }

    #[test]
    fn r1_an_event_with_a_reason_or_kind_of_a_newer_server_still_decodes() {
        let json =
            r#"{"at":"2026-01-01T00:00:00Z","object":"gadget/g1","reason":"Teleported","message":"m","actor":"a"}"#;
        let event: Event = serde_json::from_str(json).expect("lenient");
        assert_eq!((event.reason, event.object.to_string()), (Reason::Other, "gadget/g1".to_string()));
        let known = r#"{"at":"2026-01-01T00:00:00Z","object":"mail/m1","reason":"Sent","message":"m","actor":"a"}"#;
        let event: Event = serde_json::from_str(known).expect("known");
        assert_eq!((event.reason, event.object.clone()), (Reason::Sent, ObjectRef::mail("m1")));
        let again: serde_json::Value = serde_json::to_value(&event).expect("encode");
        assert_eq!((again["object"].as_str(), again["reason"].as_str()), (Some("mail/m1"), Some("Sent")));
    }

    #[test]
    fn r1_r3_the_trails_sql_is_written_from_the_enums() {
        assert_eq!(ObjectKind::Mail.sql_like("d.object"), "d.object LIKE 'mail/%'");
        assert_eq!(Reason::Delivered.sql_eq("reason"), "reason = 'Delivered'");
    }
}
