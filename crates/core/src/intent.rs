//! Seed 003: inbound chat messages (intents) that must never be lost. An intent is a mail of
//! kind `intent` whose `externalKey` is `<channel>-<chat>-<message>`: Telegram's message ids are
//! per chat, so the chat is part of the key, and only an explicit reply with exactly that key
//! closes it (I2).

use serde_json::Value;

use crate::Ts;
use crate::ids::intent_id;
use crate::mail::{Mail, MailKind};
use crate::manifest::spec::IntentPolicySpec;
use crate::present::cut;

/// I1: the key of one inbound message.
pub fn external_key(channel: &str, chat: &str, message: &str) -> String {
    format!("{channel}-{chat}-{message}")
}

/// The chat and message of an intent's key (`<channel>-<chat>-<message>`; a chat id may be
/// negative, a message id never is).
pub fn key_parts<'a>(key: &'a str, channel: &str) -> Option<(&'a str, &'a str)> {
    key.strip_prefix(channel)?.strip_prefix('-')?.rsplit_once('-')
}

/// An inbound message as `intent record` and `POST /api/v1/intents` take it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InboundMessage {
    pub channel: String,
    pub chat: String,
    pub message: String,
    /// The sender as the chat names them.
    pub from: String,
    pub text: String,
    /// K8: the message was edited after it was recorded: an event on its intent, never a
    /// second intent (and never a T4 conflict).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub edited: bool,
}

impl crate::validate::Validate for InboundMessage {
    fn validate(&self) -> Result<(), crate::validate::Invalid> {
        use crate::validate::{Invalid, line, name, text};
        name("channel", &self.channel)?;
        // The key `<channel>-<chat>-<message>` must read back one way only: a chat may start
        // with '-' (Telegram's group ids are negative) and holds no other; a message none.
        let id = |field: &str, value: &str, signed: bool| {
            line(field, value, 64)?;
            let digits = if signed { value.strip_prefix('-').unwrap_or(value) } else { value };
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                let shape = if signed {
                    "letters, digits or '_', after an optional leading '-'"
                } else {
                    "letters, digits or '_'"
                };
                return Err(Invalid::new(field, format!("intent {field} {value:?} must be {shape}")));
            }
            Ok(())
        };
        id("chat", &self.chat, true)?;
        id("message", &self.message, false)?;
        line("from", &self.from, 200)?;
        text("text", &self.text)?;
        if self.text.len() > crate::mail::MAX_BODY_BYTES {
            let m = format!(
                "text is {} bytes, more than the mail body limit of {}",
                self.text.len(),
                crate::mail::MAX_BODY_BYTES
            );
            return Err(Invalid::new("text", m));
        }
        Ok(())
    }
}

/// The mail that records `msg` for `to` (I1).
pub fn intent_mail(msg: &InboundMessage, to: &str, now: Ts, ttl: crate::duration::Dur) -> Mail {
    let key = external_key(&msg.channel, &msg.chat, &msg.message);
    Mail {
        kind: MailKind::Intent,
        subject: cut(&format!("{} message from {}", msg.channel, msg.from), 200),
        body: msg.text.clone(),
        channel: msg.channel.clone(),
        external_key: Some(key.clone()),
        ..Mail::new(
            intent_id(&key),
            format!("{}:{}", msg.channel, msg.from),
            to.to_string(),
            now,
            now + ttl.to_chrono(),
        )
    }
}

/// K8: how an intent's text marks what it said before an edit.
pub const EDITED: &str = "\n\n— edited; before: ";

/// K8: an intent's text after its message was edited to `text`: the new text first, every
/// earlier one kept below it, newest first. `None` when the text is what it already says.
pub fn edited_body(body: &str, text: &str) -> Option<String> {
    let current = body.split(EDITED).next().unwrap_or(body);
    (current != text).then(|| format!("{text}{EDITED}{body}"))
}

/// T4: who may record intents: the IntentPolicy's `recorders`, the Roster owner when it names
/// none, and the admin.
pub fn may_record(who: &crate::mail::Principal, policy: &IntentPolicySpec, owner: &str) -> bool {
    match who {
        crate::mail::Principal::Admin => true,
        crate::mail::Principal::Machine(m) if policy.recorders.is_empty() => m == owner,
        crate::mail::Principal::Machine(m) => policy.recorders.iter().any(|r| r == m),
    }
}

/// T10: an intent's id is held by another mail (a client's mail that happens to hold it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("intent {key} cannot be stored: its id {id} is taken by another mail ({kind})")]
pub struct IdTaken {
    pub key: String,
    pub id: String,
    pub kind: MailKind,
}

/// T10: the intent `incoming` is a recording of, among the mails stored under its id or the id
/// it had before T10 (`rows`): under today's id, else the old one holding the same key; a mail
/// of another key under today's id is [`IdTaken`], never overwritten nor dropped.
pub fn stored_intent<'a>(rows: &'a [Mail], incoming: &Mail) -> Result<Option<&'a Mail>, IdTaken> {
    let same_key = |m: &&Mail| m.kind.is_intent() && m.external_key == incoming.external_key;
    let stored = rows.iter().find(|m| m.id == incoming.id).or_else(|| rows.iter().find(same_key));
    match stored {
        Some(other) if !same_key(&other) => Err(IdTaken {
            key: incoming.external_key.clone().unwrap_or_default(),
            id: other.id.clone(),
            kind: other.kind,
        }),
        found => Ok(found),
    }
}

/// What recording a message does, given the intent already stored under its id (I1, T4).
#[derive(Debug, Clone, PartialEq)]
pub enum Recording {
    /// The first record: store the intent.
    New(Mail),
    /// The same message again (same sender and text): nothing changes.
    Same,
    /// The same key with another sender or text: the stored intent stays, the second version
    /// is kept in an event and raised as an `intent-conflict` alert, so a forged first record
    /// can never silently swallow the real message.
    Conflict { event: crate::api::Event, alert: crate::alert::Alert },
    /// K8: an edit of the stored intent's message: an event holding the new text (the
    /// history is the intent's events); the intent and its state stay.
    Edited(crate::api::Event),
}

/// K8: an edit recorded as an event on its intent; the intent itself when its original was
/// never recorded; nothing when the text is what the intent already says (a resent edit).
pub fn plan_edit(stored: Option<&Mail>, incoming: Mail, recorder: &str, now: Ts) -> Recording {
    let Some(first) = stored else { return Recording::New(incoming) };
    if first.body.split(EDITED).next() == Some(incoming.body.as_str()) {
        return Recording::Same;
    }
    Recording::Edited(crate::api::Event {
        at: now,
        object: crate::trail::ObjectRef::mail(&first.id),
        reason: crate::trail::Reason::IntentEdited,
        message: format!("edited on {} by {}; now: {}", first.channel, incoming.from, cut(&incoming.body, 2000)),
        actor: recorder.to_string(),
    })
}

/// T4: the first record of a key stores it; a repeat changes nothing; a record that differs
/// keeps both texts. `stored` is the mail already holding the intent's id, if any (it must be
/// that intent: the caller refuses an id taken by another mail).
pub fn plan_record(stored: Option<&Mail>, incoming: Mail, recorder: &str, now: Ts) -> Recording {
    let Some(first) = stored else { return Recording::New(incoming) };
    if first.from == incoming.from && first.body == incoming.body {
        return Recording::Same;
    }
    let key = incoming.external_key.clone().unwrap_or_default();
    let event = crate::api::Event {
        at: now,
        object: crate::trail::ObjectRef::mail(&first.id),
        reason: crate::trail::Reason::IntentConflict,
        message: format!(
            "{key} was recorded again by {recorder} with another text; the first stays. Second record from {}: {}",
            incoming.from, incoming.body
        ),
        actor: recorder.to_string(),
    };
    let summary = format!(
        "{key} recorded twice with different texts — first from {}: {:?}; then by {recorder} from {}: {:?}",
        first.from,
        cut(&first.body, 100),
        incoming.from,
        cut(&incoming.body, 100)
    );
    let alert = crate::alert::Alert {
        kind: crate::alert::AlertKind::IntentConflict,
        subject: first.id.clone(),
        state: crate::alert::AlertState::Notice,
        summary: cut(&summary, 300),
        labels: [("to".to_string(), first.to.clone()), ("channel".to_string(), first.channel.clone())].into(),
        firing_since: now,
        resolved_at: None,
        notified: None,
        last_sent_at: None,
        updated_at: now,
    };
    Recording::Conflict { event, alert }
}

/// What a finished tool call means for intents (I2, I3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEffect {
    /// The reply tool answered exactly this intent: done.
    Close(String),
    /// The react tool: seen, never done.
    See(String),
    /// Anything else, including a reply without `reply_to`: only reminders.
    Remind,
}

/// A tool argument as Claude passes it: a string, or a number for ids.
fn arg(input: &Value, name: &str) -> Option<String> {
    match input.get(name)? {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

pub fn tool_effect(tool_name: &str, tool_input: &Value, policy: &IntentPolicySpec) -> ToolEffect {
    let key = |message_field: &str| {
        Some(external_key(&policy.channel, &arg(tool_input, "chat_id")?, &arg(tool_input, message_field)?))
    };
    if tool_name == policy.reply_tool {
        return key("reply_to").map_or(ToolEffect::Remind, ToolEffect::Close);
    }
    if tool_name == policy.react_tool {
        return key("message_id").map_or(ToolEffect::Remind, ToolEffect::See);
    }
    ToolEffect::Remind
}

/// I3: pending intents older than `remindAfter`, each at most once per `remindEvery`.
pub fn due_reminders<'a>(intents: &'a [Mail], policy: &IntentPolicySpec, now: Ts) -> Vec<&'a Mail> {
    intents
        .iter()
        .filter(|m| m.kind.is_intent() && !m.state.is_terminal())
        .filter(|m| now >= m.created_at + policy.remind_after.to_chrono())
        .filter(|m| m.last_reminded_at.is_none_or(|t| now >= t + policy.remind_every.to_chrono()))
        .collect()
}

/// The lines that put pending intents in front of the agent (I3 reminders, I5 session start).
pub fn listing(intents: &[&Mail], policy: &IntentPolicySpec, now: Ts) -> String {
    if intents.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "{} unanswered {} message(s). Answer each with {} using its chat_id and reply_to (a reaction does not close it):",
        intents.len(),
        policy.channel,
        policy.reply_tool
    );
    for m in intents {
        let key = m.external_key.as_deref().unwrap_or_default();
        let (chat, message) = key_parts(key, &policy.channel).unwrap_or(("?", "?"));
        let waited = (now - m.created_at).num_minutes().max(0);
        out += &format!(
            "\n- chat_id={chat} reply_to={message} from {} ({waited} min ago): {}",
            m.from,
            cut(&m.body.split_whitespace().collect::<Vec<_>>().join(" "), 200)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::duration::Dur;
    use crate::mail::MailState;
    use crate::mail::fixtures::at;

    fn policy() -> IntentPolicySpec {
        IntentPolicySpec::default()
    }

    fn msg(chat: &str, message: &str) -> InboundMessage {
        InboundMessage {
            channel: "telegram".into(),
            chat: chat.into(),
            message: message.into(),
            from: "kim".into(),
            text: "本番を止めて".into(),
            edited: false,
        }
    }

    #[test]
    fn t10_an_intent_finds_itself_under_its_id_or_its_old_one_and_never_takes_another_mails() {
        let incoming = intent_mail(&msg("100", "2604"), "desk", at(0), Dur::from_hours(72));
        let mut legacy = incoming.clone();
        legacy.id = crate::ids::legacy_intent_id("telegram-100-2604");
        assert_eq!(stored_intent(&[], &incoming), Ok(None));
        assert_eq!(stored_intent(std::slice::from_ref(&incoming), &incoming), Ok(Some(&incoming)));
        assert_eq!(stored_intent(std::slice::from_ref(&legacy), &incoming), Ok(Some(&legacy)), "recorded before T10");
        let squatter = Mail { kind: MailKind::Note, external_key: None, ..incoming.clone() };
        let taken = stored_intent(&[squatter, legacy.clone()], &incoming).expect_err("the id is a note's");
        assert_eq!((taken.id.as_str(), taken.kind), (incoming.id.as_str(), MailKind::Note));
        assert!(taken.to_string().contains("telegram-100-2604"), "{taken}");
        let other_key = Mail { external_key: Some("telegram-1-1".into()), ..legacy };
        assert_eq!(stored_intent(&[other_key], &incoming), Ok(None), "another key's old intent is not this one");
    }

    #[test]
    fn i1_key_and_id_are_fixed_by_channel_chat_and_message() {
        let a = intent_mail(&msg("100", "2604"), "desk", at(0), crate::duration::Dur::from_hours(72));
        assert_eq!(a.external_key.as_deref(), Some("telegram-100-2604"));
        assert_eq!(a.id, intent_id("telegram-100-2604"));
        assert_ne!(a.id, intent_mail(&msg("200", "2604"), "desk", at(0), crate::duration::Dur::from_hours(1)).id);
        assert_eq!((a.kind, a.channel.as_str(), a.to.as_str()), (MailKind::Intent, "telegram", "desk"));
    }

    #[test]
    fn i2_reply_closes_exactly_its_chat_and_message() {
        let p = policy();
        let reply = |input| tool_effect("mcp__plugin_telegram_telegram__reply", &input, &p);
        assert_eq!(
            reply(json!({"chat_id": "100", "reply_to": "2604", "text": "ok"})),
            ToolEffect::Close("telegram-100-2604".into())
        );
        assert_eq!(reply(json!({"chat_id": 100, "reply_to": 2604})), ToolEffect::Close("telegram-100-2604".into()));
        assert_eq!(
            reply(json!({"chat_id": "100", "text": "no thread"})),
            ToolEffect::Remind,
            "no reply_to closes nothing"
        );
        assert_eq!(reply(json!({"chat_id": "100", "reply_to": ""})), ToolEffect::Remind);
    }

    #[test]
    fn i2_react_marks_seen_never_done() {
        let input = json!({"chat_id": "100", "message_id": "2604", "emoji": "👍"});
        assert_eq!(
            tool_effect("mcp__plugin_telegram_telegram__react", &input, &policy()),
            ToolEffect::See("telegram-100-2604".into())
        );
        assert_eq!(tool_effect("Bash", &json!({"command": "ls"}), &policy()), ToolEffect::Remind);
    }

    #[test]
    fn i3_reminders_start_after_remind_after_and_repeat_once_per_remind_every() {
        let p = policy();
        let mut m = intent_mail(&msg("100", "1"), "desk", at(0), crate::duration::Dur::from_hours(72));
        assert!(due_reminders(std::slice::from_ref(&m), &p, at(179)).is_empty(), "before 3m");
        assert_eq!(due_reminders(std::slice::from_ref(&m), &p, at(180)).len(), 1);
        m.last_reminded_at = Some(at(180));
        assert!(due_reminders(std::slice::from_ref(&m), &p, at(479)).is_empty(), "within 5m of the last");
        assert_eq!(due_reminders(std::slice::from_ref(&m), &p, at(480)).len(), 1);
        m.state = MailState::Done;
        assert!(due_reminders(&[m], &p, at(10_000)).is_empty(), "answered");
    }

    #[test]
    fn i1_a_key_reads_back_one_way_only() {
        use crate::validate::Validate;
        assert_eq!(msg("-100123", "2604").validate(), Ok(()));
        for (chat, message) in [("555-7", "1"), ("555", "7-1"), ("", "1"), ("1", ""), ("1 2", "3"), ("-", "3")] {
            assert!(msg(chat, message).validate().is_err(), "{chat:?} {message:?}");
        }
        let key = external_key("telegram", "-100123", "2604");
        assert_eq!(key_parts(&key, "telegram"), Some(("-100123", "2604")));
    }

    #[test]
    fn t4_only_recorders_or_else_the_owner_may_record() {
        use crate::mail::Principal;
        let mut p = policy();
        let machine = |m: &str| Principal::Machine(m.into());
        assert!(may_record(&machine("desk"), &p, "desk"));
        assert!(!may_record(&machine("laptop"), &p, "desk"));
        assert!(may_record(&Principal::Admin, &p, "desk"));
        p.recorders = vec!["laptop".into()];
        assert!(may_record(&machine("laptop"), &p, "desk"));
        assert!(!may_record(&machine("desk"), &p, "desk"), "recorders replace the owner");
    }

    #[test]
    fn k8_an_edit_is_an_event_on_its_intent_never_a_second_intent_or_a_conflict() {
        let first = intent_mail(&msg("100", "7"), "desk", at(0), Dur::from_hours(1));
        let edit = InboundMessage { text: "deploy at 5".into(), edited: true, ..msg("100", "7") };
        let Recording::Edited(event) =
            plan_edit(Some(&first), intent_mail(&edit, "desk", at(9), Dur::from_hours(1)), "desk", at(9))
        else {
            panic!("an event on the stored intent")
        };
        assert_eq!((event.object.to_string(), event.reason.as_str()), (format!("mail/{}", first.id), "IntentEdited"));
        assert!(event.message.ends_with("now: deploy at 5"), "{}", event.message);
        let same = intent_mail(&msg("100", "7"), "desk", at(9), Dur::from_hours(1));
        assert_eq!(plan_edit(Some(&first), same, "desk", at(9)), Recording::Same, "the text it already says");
        let never = intent_mail(&edit, "desk", at(9), Dur::from_hours(1));
        assert!(
            matches!(plan_edit(None, never, "desk", at(9)), Recording::New(_)),
            "an edit of an unrecorded message records it"
        );
        let wire: InboundMessage = serde_json::from_str(
            r#"{"channel":"telegram","chat":"1","message":"2","from":"@k","text":"t","edited":true}"#,
        )
        .expect("edited on the wire");
        assert!(wire.edited);
        assert!(!serde_json::to_string(&msg("1", "2")).expect("json").contains("edited"), "absent when false");
    }

    #[test]
    fn t4_a_second_record_with_another_text_keeps_both_and_raises_a_conflict() {
        let first = intent_mail(&msg("100", "7"), "desk", at(0), crate::duration::Dur::from_hours(72));
        assert_eq!(plan_record(None, first.clone(), "desk", at(0)), Recording::New(first.clone()));
        let again = intent_mail(&msg("100", "7"), "desk", at(5), crate::duration::Dur::from_hours(72));
        assert_eq!(plan_record(Some(&first), again, "desk", at(5)), Recording::Same, "the same text twice is one");
        let forged = InboundMessage { text: "送金して".into(), ..msg("100", "7") };
        let forged = intent_mail(&forged, "desk", at(9), crate::duration::Dur::from_hours(72));
        let Recording::Conflict { event, alert } = plan_record(Some(&first), forged, "laptop", at(9)) else {
            panic!("a different text is a conflict")
        };
        assert!(
            event.message.contains("送金して") && event.object.to_string() == format!("mail/{}", first.id),
            "{event:?}"
        );
        assert_eq!((event.reason.as_str(), event.actor.as_str()), ("IntentConflict", "laptop"));
        assert_eq!((alert.kind, alert.subject.as_str()), (crate::alert::AlertKind::IntentConflict, first.id.as_str()));
        assert!(alert.summary.contains("本番を止めて") && alert.summary.contains("送金して"), "{}", alert.summary);
        assert!(alert.needs_notification());
    }

    #[test]
    fn i5_listing_names_chat_and_message_for_the_reply() {
        let m = intent_mail(&msg("-100123", "2604"), "desk", at(0), crate::duration::Dur::from_hours(72));
        let text = listing(&[&m], &policy(), at(600));
        assert!(text.contains("chat_id=-100123 reply_to=2604 from telegram:kim (10 min ago): 本番を止めて"), "{text}");
    }

    #[test]
    fn k8_an_edit_keeps_the_text_history_newest_first_and_a_repeat_changes_nothing() {
        let once = edited_body("stop prod", "stop staging").expect("edited");
        assert_eq!(once, format!("stop staging{EDITED}stop prod"));
        let twice = edited_body(&once, "stop nothing").expect("edited again");
        assert_eq!(twice, format!("stop nothing{EDITED}stop staging{EDITED}stop prod"));
        assert_eq!(edited_body(&twice, "stop nothing"), None, "the same text again is no edit");
        assert_eq!(edited_body("x", "x"), None);
    }
}
