//! Seed 003: inbound chat messages (intents) that must never be lost. An intent is a mail of
//! kind `intent` whose `externalKey` is `<channel>-<chat>-<message>`: Telegram's message ids are
//! per chat, so the chat is part of the key, and only an explicit reply with exactly that key
//! closes it (I2).

use serde_json::Value;

use crate::Ts;
use crate::ids::sha256_hex;
use crate::mail::{Mail, MailKind};
use crate::manifest::spec::IntentPolicySpec;
use crate::present::cut;

/// I1: the key of one inbound message.
pub fn external_key(channel: &str, chat: &str, message: &str) -> String {
    format!("{channel}-{chat}-{message}")
}

/// An intent's mail id follows from its key, so recording it twice, on the PC or on the
/// server, is the same row.
pub fn intent_id(key: &str) -> String {
    format!("mail--{}", &sha256_hex(key)[..8])
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
        .filter(|m| m.kind == MailKind::Intent && !m.state.is_terminal())
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
        let (chat, message) = key
            .strip_prefix(&format!("{}-", policy.channel))
            .and_then(|rest| rest.rsplit_once('-'))
            .unwrap_or(("?", "?"));
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
        }
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
    fn i5_listing_names_chat_and_message_for_the_reply() {
        let m = intent_mail(&msg("-100123", "2604"), "desk", at(0), crate::duration::Dur::from_hours(72));
        let text = listing(&[&m], &policy(), at(600));
        assert!(text.contains("chat_id=-100123 reply_to=2604 from telegram:kim (10 min ago): 本番を止めて"), "{text}");
    }
}
