//! Live push into a running Claude Code session: the MCP server's `notifications/claude/channel`
//! (seed 003's mechanism). Which mail a session is told about, once, and what it is told.
//!
//! A push never moves a mail's state: it is seen when the agent reads it and done when the agent
//! answers, so the unread SLA (M9) still catches a push nobody acted on. In a session known to
//! listen it counts as presented (H3). Mail already waiting when the session's server started
//! is the hooks' to show: H2 orders and caps a backlog, where a push per mail would flood a
//! session.

use std::collections::{BTreeMap, BTreeSet};

use crate::Ts;
use crate::mail::Mail;
use crate::present::{cut, group};

/// The notification Claude Code injects into the session as a `<channel>` event.
pub const METHOD: &str = "notifications/claude/channel";

/// The experimental capability that makes Claude Code listen for [`METHOD`].
pub const CAPABILITY: &str = "claude/channel";

/// A pushed mail's text is cut here (H2's block size); the whole mail is one `read` away.
pub const MAX_CONTENT: usize = 1800;

/// Where a session's pushes begin: after this seq, and — on a PC that never polled — only for
/// mail created since this time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    pub after_seq: i64,
    pub created_since: Option<Ts>,
}

/// How far a PC's clock may run ahead of the server's before a fresh PC's first push is missed
/// (and shown by the hooks instead).
pub const CLOCK_SKEW_SECS: i64 = 10;

/// Where a session that started at `started` begins. A cache that has polled has a cursor: what
/// it holds up to there is backlog. A fresh cache has none, and its first poll may bring both
/// the backlog and mail sent after the session started (E8): the backlog is then what was
/// created before the session (less the clock skew allowed), and everything newer is pushed.
pub fn start(cursor: Option<i64>, started: Ts) -> Start {
    match cursor {
        Some(after_seq) => Start { after_seq, created_since: None },
        None => Start { after_seq: 0, created_since: Some(started - chrono::TimeDelta::seconds(CLOCK_SKEW_SECS)) },
    }
}

/// The mails to push now, oldest first: after `from` (moved past every mail pushed), never
/// presented anywhere, and still something H2 would show (open, not expired, not an intent —
/// inbound chat messages reach the session by their own channel).
pub fn to_push(inbox: &[Mail], from: Start, now: Ts) -> Vec<&Mail> {
    let mut out: Vec<&Mail> = inbox
        .iter()
        .filter(|m| m.seq > from.after_seq && from.created_since.is_none_or(|t| m.created_at >= t))
        .filter(|m| m.presented_at.is_none() && group(m, now).is_some())
        .collect();
    out.sort_by_key(|m| m.seq);
    out
}

/// What one push carries: `content` becomes the event's body, `meta` its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    pub content: String,
    /// Attribute values are strings: Claude Code renders them as tag attributes.
    pub meta: BTreeMap<&'static str, String>,
}

/// I8: an intent pushed into the session: its text, and where to answer it (`chat_id`,
/// `message_id`) and who wrote it (`user`), as the Telegram plugin's events carry them.
pub fn push_intent(m: &Mail) -> Push {
    let key = m.external_key.as_deref().unwrap_or_default();
    let (chat, message) = crate::intent::key_parts(key, &m.channel).unwrap_or(("", ""));
    let user = m.from.split_once(':').map_or(m.from.as_str(), |(_, u)| u).to_string();
    let content = if m.body.chars().count() > MAX_CONTENT { cut(&m.body, MAX_CONTENT) } else { m.body.clone() };
    let meta = BTreeMap::from([
        ("chat_id", chat.to_string()),
        ("message_id", message.to_string()),
        ("user", user),
        // Not `source`: Claude Code writes its own `source` first (`plugin:pcmail:pcmail`).
        ("channel", m.channel.clone()),
    ]);
    Push { content, meta }
}

/// K8: an intent whose message was edited, pushed again as an event on it: its text (the new
/// one first, the earlier below) and `edited="true"`.
pub fn push_edit(m: &Mail) -> Push {
    let mut p = push_intent(m);
    p.meta.insert("edited", "true".into());
    p
}

pub fn push(m: &Mail) -> Push {
    let text = if m.subject.is_empty() { m.body.clone() } else { format!("{}\n\n{}", m.subject, m.body) };
    let content = if text.chars().count() > MAX_CONTENT {
        let more = format!("\n(cut: `read` {} for the rest)", m.id);
        cut(&text, MAX_CONTENT - more.chars().count()) + &more
    } else {
        text
    };
    let meta = BTreeMap::from([
        ("id", m.id.clone()),
        ("from", m.from.clone()),
        ("kind", m.kind.to_string()),
        ("urgent", m.urgent.to_string()),
    ]);
    Push { content, meta }
}

/// K4: the mails Claude Code has already shown its model as pushed `<channel>` events, found in
/// `text` — a turn's prompt (a push while idle starts the turn as its prompt) or the session's
/// transcript (a push during a tool call is attached to the turn's next request). Claude Code
/// tells the MCP server nothing about whether the session listens, so what the model was given
/// is the only evidence: a hook leaves these out, and a push Claude Code dropped is still shown.
/// The transcript is JSON lines, so the tag's quotes may be escaped (`id=\"…\"`).
pub fn pushed_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("<channel ") {
        let tag = &rest[at..];
        let end = tag.find('>').unwrap_or(tag.len());
        let attrs = tag[..end].replace('\\', "");
        if let Some(id) =
            attrs.split_once(" id=\"").and_then(|(_, v)| v.split('"').next()).filter(|id| id.starts_with("mail--"))
        {
            ids.insert(id.to_string());
        }
        rest = &tag[end..];
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::{at, mail};
    use crate::mail::{MailKind, MailState};

    fn m(seq: i64, state: MailState) -> Mail {
        Mail { seq, state, ..mail(&format!("mail--{seq:08x}"), "desk", "me") }
    }

    fn seqs(v: &[&Mail]) -> Vec<i64> {
        v.iter().map(|m| m.seq).collect()
    }

    #[test]
    fn h3_each_new_open_mail_is_pushed_once_oldest_first() {
        let mut presented = m(7, MailState::Seen);
        presented.presented_at = Some(at(5));
        let inbox = [m(9, MailState::Delivered), m(8, MailState::New), presented, m(6, MailState::Delivered)];
        let from = start(Some(6), at(10));
        assert_eq!(seqs(&to_push(&inbox, from, at(10))), [8, 9], "after the cursor, never presented, oldest first");
    }

    #[test]
    fn e8_a_fresh_pc_pushes_what_was_created_since_its_session_began_and_not_its_backlog() {
        let created =
            |seq, secs| Mail { created_at: at(secs), expires_at: at(100_000), ..m(seq, MailState::Delivered) };
        // The first poll brings the backlog (seq 1, 2) and a mail sent after the session began (3).
        let inbox = [created(1, 100), created(2, 985), created(3, 1000)];
        let from = start(None, at(1000));
        assert_eq!(from, Start { after_seq: 0, created_since: Some(at(990)) });
        assert_eq!(seqs(&to_push(&inbox, from, at(1001))), [3]);
        assert_eq!(seqs(&to_push(&inbox, start(Some(2), at(1000)), at(1001))), [3], "a cache that polled: its cursor");
    }

    #[test]
    fn h3_terminal_expired_and_intent_mail_is_not_pushed() {
        let mut intent = m(3, MailState::New);
        intent.kind = MailKind::Intent;
        let mut expired = m(4, MailState::Delivered);
        expired.expires_at = at(10);
        let inbox = [m(1, MailState::Done), m(2, MailState::Failed), intent, expired, m(5, MailState::Seen)];
        assert_eq!(seqs(&to_push(&inbox, start(Some(0), at(0)), at(10))), [5]);
    }

    #[test]
    fn a_push_carries_the_text_and_id_from_kind_urgent_as_meta() {
        let mut mail = m(1, MailState::Delivered);
        (mail.subject, mail.body, mail.kind, mail.urgent) =
            ("ship?".into(), "yes or no".into(), MailKind::Decision, true);
        let p = push(&mail);
        assert_eq!(p.content, "ship?\n\nyes or no");
        let meta: Vec<(&str, &str)> = p.meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(meta, [("from", "desk"), ("id", "mail--00000001"), ("kind", "decision"), ("urgent", "true")]);
    }

    #[test]
    fn i8_an_intent_is_pushed_with_where_to_answer_it() {
        let msg = crate::intent::InboundMessage {
            channel: "telegram".into(),
            chat: "-100123".into(),
            message: "2604".into(),
            from: "@kim".into(),
            text: "本番を止めて".into(),
            edited: false,
        };
        let m = crate::intent::intent_mail(&msg, "desk", at(0), crate::duration::Dur::from_hours(1));
        let p = push_intent(&m);
        assert_eq!(p.content, "本番を止めて");
        let meta: Vec<(&str, &str)> = p.meta.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(meta, [("channel", "telegram"), ("chat_id", "-100123"), ("message_id", "2604"), ("user", "@kim")]);
    }

    #[test]
    fn a_long_mail_is_cut_by_characters_and_says_how_to_read_the_rest() {
        let mut mail = m(1, MailState::Delivered);
        mail.body = "長い本文".repeat(1000);
        let p = push(&mail);
        assert_eq!(p.content.chars().count(), MAX_CONTENT);
        assert!(
            p.content.ends_with("(cut: `read` mail--00000001 for the rest)"),
            "{}",
            &p.content[p.content.len() - 80..]
        );
    }

    #[test]
    fn k4_pushed_mail_is_found_in_a_prompt_and_in_a_transcripts_escaped_json() {
        let prompt = "<channel source=\"plugin:pcmail:pcmail\" from=\"desk\" id=\"mail--a6ecc242\" kind=\"note\">\nhi\n</channel>";
        assert_eq!(pushed_ids(prompt).into_iter().collect::<Vec<_>>(), ["mail--a6ecc242"]);
        let line = r#"{"content":"<channel source=\"plugin:pcmail:pcmail\" id=\"mail--00000001\" urgent=\"true\">x</channel> <channel source=\"plugin:pcmail:pcmail\" chat_id=\"-1\" id=\"7\">t</channel> [note] mail--00000002 from desk"}"#;
        assert_eq!(
            pushed_ids(line).into_iter().collect::<Vec<_>>(),
            ["mail--00000001"],
            "only a channel tag's mail id: not an intent's, not a hook's listing"
        );
        assert!(pushed_ids("<channel").is_empty() && pushed_ids("<channel id=\"mail--1").len() == 1);
    }
}
