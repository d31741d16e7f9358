//! Seed 003's Layer 1 by construction (I7–I9): pcmail reads the bot's updates itself, so every
//! message is recorded before any session hears of it — no patched plugin to forget. This is
//! the Bot API's wire format as pcmail reads it, and the rules: what an update becomes (an
//! intent, a drop for a chat not allowed, or nothing), which offset confirms what was recorded,
//! and how long to wait after each kind of failure.

use std::time::Duration;

use serde::Deserialize;

use crate::intent::InboundMessage;
use crate::manifest::spec::IntentPolicySpec;

/// The channel name pcmail's own poller records under.
pub const CHANNEL: &str = "telegram";

/// One entry of `getUpdates`' answer (only what pcmail reads; unknown fields are ignored, as
/// the Bot API adds them over time).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Update {
    pub update_id: i64,
    #[serde(default)]
    pub message: Option<Message>,
    #[serde(default)]
    pub edited_message: Option<Message>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Message {
    pub message_id: i64,
    pub chat: Chat,
    #[serde(default)]
    pub from: Option<User>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub caption: Option<String>,
    /// K7: a photo, in every size Telegram made of it (the largest last).
    #[serde(default)]
    pub photo: Vec<PhotoSize>,
    /// K7: a file sent as a document.
    #[serde(default)]
    pub document: Option<Document>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PhotoSize {
    pub file_id: String,
    #[serde(default)]
    pub file_size: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Document {
    pub file_id: String,
    #[serde(default)]
    pub file_name: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
    #[serde(default)]
    pub file_size: Option<u64>,
}

/// `getFile`'s answer: where the file is to be downloaded from (`<api>/file/bot<token>/<path>`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct File {
    pub file_id: String,
    #[serde(default)]
    pub file_size: Option<u64>,
    #[serde(default)]
    pub file_path: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Chat {
    pub id: i64,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct User {
    pub id: i64,
    #[serde(default)]
    pub first_name: String,
    #[serde(default)]
    pub last_name: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
}

/// Every Bot API answer: `ok` with a `result`, or an `error_code` and `description`, with
/// `parameters.retry_after` on a 429.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Answer<T> {
    pub ok: bool,
    #[serde(default = "Option::default")]
    pub result: Option<T>,
    #[serde(default)]
    pub error_code: Option<u16>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Parameters>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Parameters {
    #[serde(default)]
    pub retry_after: Option<u64>,
}

/// What one update is to pcmail.
#[derive(Debug, Clone, PartialEq)]
pub enum Intake {
    /// A message to record as an intent (I1).
    Record(InboundMessage),
    /// A message from a chat `allowedChats` leaves out: not recorded, counted (I9).
    Dropped { chat: i64 },
    /// K8: an edit of a message — an event on its intent (its text history kept), never a
    /// second intent; recorded as the intent itself if its original never was.
    Edit(InboundMessage),
    /// Not a message (a reaction, a member change): nothing to answer.
    Skip,
}

/// I7/I9/K8: what `update` becomes. An edit is not a new message to answer: it is an event on
/// the intent its original was recorded as.
pub fn intake(update: &Update, policy: &IntentPolicySpec) -> Intake {
    let (m, edit) = match (&update.message, &update.edited_message) {
        (Some(m), _) => (m, false),
        (None, Some(m)) => (m, true),
        (None, None) => return Intake::Skip,
    };
    if !policy.allowed_chats.is_empty() && !policy.allowed_chats.contains(&m.chat.id) {
        return Intake::Dropped { chat: m.chat.id };
    }
    let bare = match attachment_of(m) {
        Some(a) => format!("[{}]", a.what()),
        None => "[a message without text]".into(),
    };
    let text = m.text.clone().or_else(|| m.caption.clone()).unwrap_or(bare);
    let msg = InboundMessage {
        channel: CHANNEL.into(),
        chat: m.chat.id.to_string(),
        message: m.message_id.to_string(),
        from: m.from.as_ref().map_or_else(|| format!("chat {}", m.chat.id), sender),
        text: crate::text::sanitize(&text),
        edited: edit,
    };
    if edit { Intake::Edit(msg) } else { Intake::Record(msg) }
}

/// K7: the most a photo or document may weigh to be downloaded into the PC's cache (10 MiB;
/// Telegram's own `getFile` serves at most 20 MB). A heavier one is recorded with a note.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachmentKind {
    Photo,
    Document,
}

/// K7: the file a message carries, as pcmail keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub kind: AttachmentKind,
    pub file_id: String,
    /// A name safe as the last part of a path: the document's own, cleaned, or `photo.jpg`.
    pub name: String,
    /// The size Telegram declared, if it did.
    pub size: Option<u64>,
}

impl Attachment {
    fn what(&self) -> String {
        match self.kind {
            AttachmentKind::Photo => "a photo".into(),
            AttachmentKind::Document => format!("a document {}", self.name),
        }
    }
}

/// K7: the photo (its largest size) or document of an update's message, if it has one.
pub fn attachment(update: &Update) -> Option<Attachment> {
    attachment_of(update.message.as_ref().or(update.edited_message.as_ref())?)
}

fn attachment_of(m: &Message) -> Option<Attachment> {
    if let Some(p) = m.photo.iter().max_by_key(|p| p.file_size.unwrap_or(0)).or(m.photo.last()) {
        return Some(Attachment {
            kind: AttachmentKind::Photo,
            file_id: p.file_id.clone(),
            name: "photo.jpg".into(),
            size: p.file_size,
        });
    }
    let d = m.document.as_ref()?;
    Some(Attachment {
        kind: AttachmentKind::Document,
        file_id: d.file_id.clone(),
        name: safe_name(d.file_name.as_deref().unwrap_or("document")),
        size: d.file_size,
    })
}

/// A file name that stays one path segment: letters, digits, `.`, `-`, `_` (others become
/// `_`), no leading dot, at most 100 characters.
pub fn safe_name(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_alphanumeric() || matches!(c, '.' | '-' | '_') { c } else { '_' })
        .take(100)
        .collect();
    let clean = clean.trim_start_matches('.');
    if clean.is_empty() { "document".into() } else { clean.to_string() }
}

/// K7: the name a message's file has in the PC's cache; [`cached_prefix`] finds it again.
pub fn cached_name(chat: i64, message: i64, a: &Attachment) -> String {
    format!("{}{}", cached_prefix(chat, message), a.name)
}

pub fn cached_prefix(chat: i64, message: i64) -> String {
    format!("{chat}_{message}_")
}

/// K7: what became of a message's file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// Downloaded into the cache, this many bytes.
    Saved(u64),
    /// Over the bound: recorded, not downloaded.
    TooLarge { size: u64, bound: u64 },
    /// Telegram refused it (gone, too big for `getFile`): recorded with why.
    Failed(String),
}

/// K7: whether a file of `size` (as declared, when Telegram declared it) is downloaded.
pub fn within_bound(size: Option<u64>, bound: u64) -> Result<(), Kept> {
    match size {
        Some(size) if size > bound => Err(Kept::TooLarge { size, bound }),
        _ => Ok(()),
    }
}

/// K7: the line an intent's text gets about its file, saying how the session reads it.
pub fn file_note(a: &Attachment, chat: i64, message: i64, kept: &Kept) -> String {
    let what = a.what();
    match kept {
        Kept::Saved(bytes) => format!(
            "[{what}, {bytes} bytes, kept on this PC: the intents tool with key {} reads it]",
            crate::intent::external_key(CHANNEL, &chat.to_string(), &message.to_string())
        ),
        Kept::TooLarge { size, bound } => {
            format!("[{what} of {size} bytes, over the {bound}-byte bound: not downloaded]")
        }
        Kept::Failed(why) => format!("[{what}, not downloaded: {}]", crate::present::cut(why, 200)),
    }
}

/// The media type of an image by its first bytes (what the session's model can be shown).
pub fn image_type(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0xFF, 0xD8, 0xFF, ..] => Some("image/jpeg"),
        [0x89, b'P', b'N', b'G', ..] => Some("image/png"),
        [b'G', b'I', b'F', b'8', ..] => Some("image/gif"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("image/webp"),
        _ => None,
    }
}

/// A sender as people read them: `@username`, else the name, else the id.
fn sender(u: &User) -> String {
    if let Some(name) = u.username.as_deref().filter(|n| !n.is_empty()) {
        return format!("@{name}");
    }
    let full = format!("{} {}", u.first_name, u.last_name.as_deref().unwrap_or_default());
    let full = full.trim();
    if full.is_empty() { format!("user {}", u.id) } else { crate::text::sanitize(full).replace(['\n', '\r'], " ") }
}

/// T13: an outbound call's chat and message, as the Bot API's integers (so `011` is message
/// 11, the one its intent was recorded under).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outbound {
    pub chat: i64,
    pub message: i64,
}

impl Outbound {
    /// The key of the intent this call answers (I1).
    pub fn key(&self) -> String {
        crate::intent::external_key(CHANNEL, &self.chat.to_string(), &self.message.to_string())
    }
}

/// T13: a reply or reaction goes only to a chat `allowedChats` lets in (any chat when it is
/// empty, as for intake), and only about a message recorded as an intent of that chat —
/// `recorded` answers whether a key is. Anything else is refused with the reason.
pub fn outbound(
    policy: &IntentPolicySpec,
    chat: &str,
    message: &str,
    mut recorded: impl FnMut(&str) -> bool,
) -> Result<Outbound, OutboundRefused> {
    let int = |field: &'static str, v: &str| {
        v.trim().parse::<i64>().map_err(|_| OutboundRefused::NotAnId { field, given: v.to_string() })
    };
    let target = Outbound { chat: int("chat_id", chat)?, message: int("message", message)? };
    if !policy.allowed_chats.is_empty() && !policy.allowed_chats.contains(&target.chat) {
        return Err(OutboundRefused::ChatNotAllowed(target.chat));
    }
    if !recorded(&target.key()) {
        return Err(OutboundRefused::NotRecorded { chat: target.chat, message: target.message });
    }
    Ok(target)
}

/// T13: why a reply or reaction may not go where it was asked to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundRefused {
    #[error("`{field}` must be a Telegram id (an integer), not {given:?}")]
    NotAnId { field: &'static str, given: String },
    #[error("chat {0} is not in the IntentPolicy's allowedChats (T13)")]
    ChatNotAllowed(i64),
    #[error("message {message} of chat {chat} was never recorded here; answer only messages that arrived (T13)")]
    NotRecorded { chat: i64, message: i64 },
}

/// I7: the offset that confirms `update` once it is recorded (or dropped, or skipped): Telegram
/// forgets every update below the offset of the next `getUpdates`.
pub fn confirm(update: &Update) -> i64 {
    update.update_id.saturating_add(1)
}

/// Why a Bot API call failed, as the poller and the tools act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BotError {
    /// 409: another `getUpdates` reads this bot (a second agent, the official plugin).
    #[error(
        "another poller reads this bot's updates (409: {0}); stop the other one (a second pcmail agent or the official Telegram plugin): one poller per bot"
    )]
    Conflict(String),
    /// 429: Telegram asks to wait this many seconds.
    #[error("Telegram asks to wait {0} s (429)")]
    RetryAfter(u64),
    /// 401/404 on the bot's URL: the token is wrong or was revoked.
    #[error("Telegram refused the bot token ({0}); run `pcmail-ctl telegram login` with the token BotFather gave")]
    Unauthorized(String),
    /// Any other refusal of this request (a reply to a message that is gone, a blocked bot).
    #[error("Telegram refused it: {0}")]
    Refused(String),
    /// No answer, or a 5xx: Telegram or the network is away for now.
    #[error("Telegram cannot be reached now: {0}")]
    Unreachable(String),
}

/// What an HTTP answer from the Bot API means; None when it is a success.
pub fn failure<T>(status: u16, answer: Option<&Answer<T>>) -> Option<BotError> {
    let description =
        answer.and_then(|a| a.description.clone()).unwrap_or_else(|| format!("HTTP {status} without a description"));
    let code = answer.and_then(|a| a.error_code).unwrap_or(status);
    if answer.is_some_and(|a| a.ok) && (200..300).contains(&status) {
        return None;
    }
    Some(match code {
        409 => BotError::Conflict(description),
        429 => BotError::RetryAfter(answer.and_then(|a| a.parameters.as_ref()?.retry_after).unwrap_or(5)),
        401 | 404 => BotError::Unauthorized(description),
        c if c >= 500 || answer.is_none() => BotError::Unreachable(description),
        _ => BotError::Refused(description),
    })
}

/// I9: how long the poller waits after `error`, the `attempt`th in a row: Telegram's own
/// `retry_after`; half a minute after a conflict (the other poller is told once, the log and an
/// alert say it once, and nothing spins); doubling from one second up to a minute otherwise.
pub fn wait_after(error: &BotError, attempt: u32) -> Duration {
    match error {
        BotError::RetryAfter(s) => Duration::from_secs((*s).clamp(1, 3600)),
        BotError::Conflict(_) => Duration::from_secs(30),
        BotError::Unauthorized(_) => Duration::from_secs(300),
        BotError::Refused(_) | BotError::Unreachable(_) => {
            Duration::from_secs(1u64 << attempt.saturating_sub(1).min(6)).min(Duration::from_secs(60))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(json: &str) -> Update {
        serde_json::from_str(json).expect("an update")
    }

    #[test]
    fn i7_a_message_becomes_an_intent_keyed_by_its_chat_and_message() {
        let u = update(
            r#"{"update_id": 7, "message": {"message_id": 2604, "date": 1, "chat": {"id": -100123, "type": "group"},
                "from": {"id": 5, "is_bot": false, "first_name": "Kim", "username": "kim"}, "text": "本番を止めて",
                "entities": []}}"#,
        );
        let Intake::Record(msg) = intake(&u, &IntentPolicySpec::default()) else { panic!("recorded") };
        assert_eq!(
            (msg.channel.as_str(), msg.chat.as_str(), msg.message.as_str(), msg.from.as_str(), msg.text.as_str()),
            ("telegram", "-100123", "2604", "@kim", "本番を止めて")
        );
        assert_eq!(confirm(&u), 8, "the offset confirms this update and no later one");
    }

    #[test]
    fn t13_outbound_chat_goes_only_to_allowed_chats_about_recorded_messages() {
        let policy = IntentPolicySpec { allowed_chats: vec![-1001], ..IntentPolicySpec::default() };
        let recorded = |key: &str| key == "telegram--1001-11";
        assert_eq!(outbound(&policy, "-1001", "011", recorded), Ok(Outbound { chat: -1001, message: 11 }));
        assert_eq!(outbound(&policy, " -1001", "11", recorded).map(|o| o.key()), Ok("telegram--1001-11".into()));
        let outside = outbound(&policy, "-100777", "11", |_| true).expect_err("outside allowedChats").to_string();
        assert!(outside.contains("allowedChats (T13)"), "{outside}");
        let unknown = outbound(&policy, "-1001", "12", recorded).expect_err("never recorded").to_string();
        assert!(unknown.contains("never recorded"), "{unknown}");
        assert!(outbound(&policy, "-1001", "11; DROP", recorded).is_err());
        assert!(outbound(&policy, "x", "11", recorded).is_err());
        let open = IntentPolicySpec::default();
        assert!(outbound(&open, "-5", "3", |k| k == "telegram--5-3").is_ok(), "no allowedChats: any recorded chat");
    }

    #[test]
    fn i9_a_chat_outside_allowed_chats_is_dropped_and_edits_are_skipped() {
        let policy = IntentPolicySpec { allowed_chats: vec![1], ..IntentPolicySpec::default() };
        let from = |chat: i64| {
            update(&format!(
                r#"{{"update_id": 1, "message": {{"message_id": 1, "chat": {{"id": {chat}}}, "text": "x"}}}}"#
            ))
        };
        assert!(matches!(intake(&from(1), &policy), Intake::Record(_)));
        assert_eq!(intake(&from(2), &policy), Intake::Dropped { chat: 2 });
        let edit = |chat: i64| {
            update(&format!(
                r#"{{"update_id": 2, "edited_message": {{"message_id": 1, "chat": {{"id": {chat}}}, "text": "y"}}}}"#
            ))
        };
        let Intake::Edit(e) = intake(&edit(1), &policy) else { panic!("K8: an edit is an Edit") };
        assert_eq!((e.chat.as_str(), e.message.as_str(), e.text.as_str()), ("1", "1", "y"));
        assert_eq!(intake(&edit(2), &policy), Intake::Dropped { chat: 2 }, "an edit outside allowedChats too");
        assert_eq!(intake(&update(r#"{"update_id": 3}"#), &policy), Intake::Skip);
    }

    #[test]
    fn i7_a_photo_keeps_its_caption_and_a_sender_without_username_its_name() {
        let u = update(
            r#"{"update_id": 3, "message": {"message_id": 9, "chat": {"id": 4}, "caption": "見積\u202e書",
                "from": {"id": 5, "first_name": "Kim", "last_name": "Lee"}, "photo": [{"file_id": "x"}]}}"#,
        );
        let Intake::Record(msg) = intake(&u, &IntentPolicySpec::default()) else { panic!("recorded") };
        assert_eq!((msg.from.as_str(), msg.text.as_str()), ("Kim Lee", "見積\u{FFFD}書"), "T6 holds for chat text too");
        let bare = update(r#"{"update_id": 4, "message": {"message_id": 9, "chat": {"id": 4}}}"#);
        let Intake::Record(msg) = intake(&bare, &IntentPolicySpec::default()) else { panic!("recorded") };
        assert_eq!((msg.from.as_str(), msg.text.as_str()), ("chat 4", "[a message without text]"));
    }

    #[test]
    fn k7_a_photo_or_document_is_found_named_safely_and_bounded() {
        let photo = update(
            r#"{"update_id": 5, "message": {"message_id": 3, "chat": {"id": -7}, "caption": "receipt",
                "photo": [{"file_id": "small", "file_size": 10}, {"file_id": "big", "file_size": 900}]}}"#,
        );
        let a = attachment(&photo).expect("a photo");
        assert_eq!(
            (a.kind, a.file_id.as_str(), a.name.as_str(), a.size),
            (AttachmentKind::Photo, "big", "photo.jpg", Some(900))
        );
        assert_eq!(cached_name(-7, 3, &a), "-7_3_photo.jpg");
        let Intake::Record(msg) = intake(&photo, &IntentPolicySpec::default()) else { panic!("recorded") };
        assert_eq!(msg.text, "receipt", "the caption is its text");
        let doc = update(
            r#"{"update_id": 6, "message": {"message_id": 4, "chat": {"id": 1},
                "document": {"file_id": "d", "file_name": "../../etc/passwd", "mime_type": "text/plain", "file_size": 30}}}"#,
        );
        let d = attachment(&doc).expect("a document");
        assert_eq!(d.name, "_.._etc_passwd", "one path segment, no leading dot");
        let Intake::Record(msg) = intake(&doc, &IntentPolicySpec::default()) else { panic!("recorded") };
        assert_eq!(msg.text, "[a document _.._etc_passwd]");
        assert_eq!(
            attachment(&update(r#"{"update_id": 7, "message": {"message_id": 1, "chat": {"id": 1}, "text": "x"}}"#)),
            None
        );
        assert_eq!(safe_name("..."), "document");
        assert_eq!(within_bound(Some(10), 10), Ok(()));
        assert_eq!(within_bound(None, 10), Ok(()), "undeclared: the download itself is bounded");
        let over = within_bound(Some(11), 10).expect_err("over the bound");
        assert_eq!(over, Kept::TooLarge { size: 11, bound: 10 });
        assert_eq!(
            file_note(&d, 1, 4, &over),
            "[a document _.._etc_passwd of 11 bytes, over the 10-byte bound: not downloaded]"
        );
        assert!(file_note(&a, -7, 3, &Kept::Saved(900)).contains("intents tool with key telegram--7-3 reads it"));
        assert_eq!(image_type(&[0x89, b'P', b'N', b'G', 13]), Some("image/png"));
        assert_eq!(image_type(b"hello"), None);
    }

    #[test]
    fn i9_each_failure_is_named_and_waited_out_never_spun_on() {
        let answer = |json: &str| serde_json::from_str::<Answer<serde_json::Value>>(json).expect("answer");
        let conflict = answer(
            r#"{"ok": false, "error_code": 409, "description": "Conflict: terminated by other getUpdates request"}"#,
        );
        assert!(matches!(failure(409, Some(&conflict)), Some(BotError::Conflict(d)) if d.contains("terminated")));
        let slow = answer(
            r#"{"ok": false, "error_code": 429, "description": "Too Many Requests", "parameters": {"retry_after": 17}}"#,
        );
        assert_eq!(failure(429, Some(&slow)), Some(BotError::RetryAfter(17)));
        let gone = answer(
            r#"{"ok": false, "error_code": 400, "description": "Bad Request: message to be replied not found"}"#,
        );
        assert!(matches!(failure(400, Some(&gone)), Some(BotError::Refused(_))));
        assert!(matches!(failure::<()>(401, None), Some(BotError::Unauthorized(_))));
        assert!(matches!(failure::<()>(502, None), Some(BotError::Unreachable(_))));
        assert_eq!(failure(200, Some(&answer(r#"{"ok": true, "result": []}"#))), None);
        assert_eq!(wait_after(&BotError::RetryAfter(17), 1), Duration::from_secs(17));
        assert_eq!(wait_after(&BotError::Conflict(String::new()), 9), Duration::from_secs(30));
        let down = BotError::Unreachable(String::new());
        assert_eq!(
            (wait_after(&down, 1), wait_after(&down, 3), wait_after(&down, 30)),
            (Duration::from_secs(1), Duration::from_secs(4), Duration::from_secs(60))
        );
        assert!(BotError::Conflict("x".into()).to_string().contains("one poller per bot"));
    }
}
