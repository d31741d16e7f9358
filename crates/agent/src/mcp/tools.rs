//! The MCP tools: their catalogue (kept small — the whole `tools/list` answer is context every
//! session pays for), their arguments, and the text each answers. Every failure is a tool
//! error of one sentence the agent can act on; nothing here ends the process.

use std::path::Path;
use std::time::Duration;

use pcmail_core::api::{ErrorCode, MailStatus, SearchResults, SendRequest, StepRequest};
use pcmail_core::ids;
use pcmail_core::intent::listing;
use pcmail_core::mail::{Mail, MailKind, MailState, Milestone, Step};
use pcmail_core::present;
use serde_json::{Map, Value, json};

use crate::cache::{Cache, CacheError};
use crate::client::{Client, ClientError};
use crate::mail::{self, Action, MailError};

/// `status` waits this long unless told otherwise, and never longer than [`MAX_WAIT`].
const DEFAULT_WAIT: Duration = Duration::from_secs(60);
const MAX_WAIT: Duration = Duration::from_secs(600);

/// What `send` may start: every kind a send may carry but an answer, which is a reply's (R3:
/// derived from the kind's rules, so a new kind is offered once it may be sent).
fn sendable() -> impl Iterator<Item = MailKind> {
    MailKind::ALL.into_iter().filter(|k| k.can_be_sent() && !k.is_answer())
}

/// Every tool: name, description, input schema. Descriptions say what a call does to the mail,
/// because that is what an agent must not get wrong (a peek vs. a read).
pub fn catalogue() -> Vec<(&'static str, &'static str, Value)> {
    let id = json!({"type": "string"});
    let chat = json!({"type": ["string", "integer"]});
    let object = |props: Value, required: &[&str]| {
        let mut schema = json!({"type": "object", "properties": props});
        if !required.is_empty() {
            schema["required"] = json!(required);
        }
        schema
    };
    vec![
        (
            "send",
            "Send mail to a roster machine (label, number, hostname or alias). Answers its id.",
            object(
                json!({
                    "to": {"type": "string"},
                    "subject": {"type": "string"},
                    "body": {"type": "string"},
                    "kind": {"enum": sendable().map(MailKind::as_str).collect::<Vec<_>>()},
                    "urgent": {"type": "boolean"}
                }),
                &["to", "body"],
            ),
        ),
        (
            "inbox",
            "List open mail to this PC (all: closed too), newest first. Marks nothing seen.",
            object(json!({"all": {"type": "boolean"}}), &[]),
        ),
        ("read", "Show one mail in full and mark it seen.", object(json!({"id": id}), &["id"])),
        (
            "reply",
            "Reply to a mail; it becomes done with your reply as its result.",
            object(json!({"id": id, "body": {"type": "string"}}), &["id", "body"]),
        ),
        ("ack", "Mark a mail done without replying.", object(json!({"id": id}), &["id"])),
        (
            "fail",
            "Mark a mail failed; the sender sees the reason.",
            object(json!({"id": id, "reason": {"type": "string"}}), &["id", "reason"]),
        ),
        (
            "status",
            "How far a mail got, with times; wait_for waits up to timeout s (60).",
            object(
                json!({"id": id, "wait_for": {"enum": MailState::AWAITABLE}, "timeout": {"type": "integer"}}),
                &["id"],
            ),
        ),
        (
            "search",
            "Mail of this PC and ledger rows holding a text.",
            object(json!({"text": {"type": "string"}, "in": {"enum": pcmail_core::search::Scope::NAMES}}), &["text"]),
        ),
        (
            "intents",
            "Telegram messages still waiting for a reply; key: one, with its file.",
            object(json!({"key": {"type": "string"}}), &[]),
        ),
        (
            "telegram_reply",
            "Reply on Telegram to one message; closes it.",
            object(
                json!({"chat_id": chat, "reply_to": chat, "text": {"type": "string"}}),
                &["chat_id", "reply_to", "text"],
            ),
        ),
        (
            "telegram_react",
            "React to a Telegram message: marks it seen, never answered.",
            object(
                json!({"chat_id": chat, "message_id": chat, "emoji": {"type": "string"}}),
                &["chat_id", "message_id", "emoji"],
            ),
        ),
    ]
}

/// What a search found, a line each: mail first (newest first), then ledger rows, and T14's
/// line when the answer was cut.
fn search_text(found: &SearchResults) -> String {
    let mail = found.mail.iter().map(|m| format!("{} from {} to {} [{}] {}", m.id, m.from, m.to, m.state, m.subject));
    let rows = found.rows.iter().map(|r| format!("{}/{} [{}] {}", r.project, r.id, r.state, r.task));
    let mut lines: Vec<String> = mail.chain(rows).collect();
    if found.truncated {
        lines.push(pcmail_core::search::TRUNCATED.into());
    }
    if lines.is_empty() { "nothing found".into() } else { lines.join("\n") }
}

/// A tool call's failure: one sentence, shown to the agent as a tool error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError(pub String);

impl From<MailError> for ToolError {
    fn from(e: MailError) -> Self {
        ToolError(sentence(&e))
    }
}

impl From<CacheError> for ToolError {
    fn from(e: CacheError) -> Self {
        ToolError(e.to_string())
    }
}

/// The one sentence for an error of the server, the network or a refusal.
pub fn sentence(e: &MailError) -> String {
    match e {
        MailError::Client(ClientError::Unreachable { base, .. }) => {
            format!(
                "The pcmail server at {base} cannot be reached (is `pcmail-ctl serve` running?); nothing was changed."
            )
        }
        MailError::Client(ClientError::Api {
            code: Some(ErrorCode::RecipientUnresolved), message, details, ..
        }) => {
            let candidates: Vec<&str> = details.iter().filter_map(|d| d.strip_prefix("candidate: ")).collect();
            match candidates.as_slice() {
                [] => format!("{message}; nothing was sent."),
                c => format!("{message}; nothing was sent. Did you mean {}?", c.join(", ")),
            }
        }
        MailError::Client(ClientError::Api { code: Some(ErrorCode::LoopRefused), message, .. }) => {
            format!("Refused as a loop: {message}; nothing was sent.")
        }
        MailError::Loop(why) => format!("Refused as a loop: {why}; start a new thread with send instead."),
        other => other.to_string(),
    }
}

struct Args<'a>(&'a Map<String, Value>);

impl Args<'_> {
    fn opt_str(&self, name: &str) -> Result<Option<String>, ToolError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ToolError(format!("`{name}` must be a string."))),
        }
    }

    fn str(&self, name: &str) -> Result<String, ToolError> {
        self.opt_str(name)?.ok_or_else(|| ToolError(format!("`{name}` is required.")))
    }

    /// A mail id (M4's form), checked before it becomes part of a URL.
    fn id(&self) -> Result<String, ToolError> {
        let id = self.str("id")?;
        if ids::is_stored_id(&id) {
            Ok(id)
        } else {
            Err(ToolError(format!("`id` must be a mail id like mail--0a1b2c3d, not {id:?}.")))
        }
    }

    /// A Telegram chat or message id: a number, as a string or not.
    fn chat_id(&self, name: &str) -> Result<String, ToolError> {
        let id = match self.0.get(name) {
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::String(s)) => s.trim().to_string(),
            None | Some(Value::Null) => return Err(ToolError(format!("`{name}` is required."))),
            Some(_) => String::new(),
        };
        if id.parse::<i64>().is_ok() {
            Ok(id)
        } else {
            Err(ToolError(format!("`{name}` must be a Telegram id (a whole number), not {id:?}.")))
        }
    }

    fn flag(&self, name: &str) -> Result<bool, ToolError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ToolError(format!("`{name}` must be true or false."))),
        }
    }

    fn seconds(&self, name: &str) -> Result<Option<Duration>, ToolError> {
        match self.0.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|s| Some(Duration::from_secs(s)))
                .ok_or_else(|| ToolError(format!("`{name}` must be a whole number of seconds."))),
        }
    }
}

/// Runs one tool; `client` is the logged-in machine's, or why there is none.
pub async fn call(
    client: Result<&Client, &ClientError>,
    home: &Path,
    name: &str,
    arguments: &Map<String, Value>,
) -> Result<String, ToolError> {
    let args = Args(arguments);
    let tools = catalogue();
    if !tools.iter().any(|(n, ..)| *n == name) {
        let names: Vec<&str> = tools.iter().map(|(n, ..)| *n).collect();
        return Err(ToolError(format!("There is no tool `{name}`; the tools are {}.", names.join(", "))));
    }
    match name {
        "intents" => return intents(home),
        "telegram_reply" | "telegram_react" => return telegram(client.ok(), home, name, &args).await,
        _ => {}
    }
    let client = client.map_err(|e| ToolError(e.to_string()))?;
    match name {
        "send" => {
            let kind = match args.opt_str("kind")?.as_deref() {
                None => MailKind::Note,
                Some(k) => sendable().find(|s| s.as_str() == k).ok_or_else(|| {
                    let names: Vec<&str> = sendable().map(MailKind::as_str).collect();
                    ToolError(format!("`kind` must be one of {}, not {k:?}.", names.join(", ")))
                })?,
            };
            let req = SendRequest {
                to: args.str("to")?,
                kind: Some(kind),
                subject: args.opt_str("subject")?.unwrap_or_default(),
                body: args.str("body")?,
                urgent: args.flag("urgent")?,
                ..Default::default()
            };
            let to = req.to.clone();
            let sent = mail::send(client, req).await?;
            Ok(format!("sent {} to {to}", sent.id))
        }
        "inbox" => Ok(inbox_text(&mail::list(client, false, args.flag("all")?).await?)),
        "search" => {
            let mut query = vec![("q", args.str("text")?.to_string())];
            query.extend(args.opt_str("in")?.map(|w| ("in", w)));
            let found: SearchResults = client.get("/api/v1/search", &query).await.map_err(MailError::from)?;
            Ok(search_text(&found))
        }
        "read" => Ok(read_text(&mail::step(client, &args.id()?, Action::Seen, &StepRequest::default()).await?)),
        "reply" => {
            let id = args.id()?;
            let sent = mail::reply(client, &id, args.str("body")?, false, None).await?;
            Ok(format!("replied {}; {id} is done", sent.id))
        }
        "ack" => Ok(step_text(&mail::step(client, &args.id()?, Action::Ack, &StepRequest::default()).await?)),
        "fail" => {
            let body = StepRequest { reason: Some(args.str("reason")?.to_string()), ..Default::default() };
            Ok(step_text(&mail::step(client, &args.id()?, Action::Fail, &body).await?))
        }
        "status" => {
            let wait_for = match args.opt_str("wait_for")?.as_deref() {
                None => None,
                Some(w) => match MailState::from_name(w).filter(|s| MailState::AWAITABLE.contains(s)) {
                    Some(state) => Some(state),
                    None => {
                        let names = MailState::AWAITABLE.map(MailState::as_str).join(" or ");
                        return Err(ToolError(format!("`wait_for` must be {names}, not {w:?}.")));
                    }
                },
            };
            let timeout = args.seconds("timeout")?.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT);
            let (status, reached) = mail::status(client, &args.id()?, wait_for, timeout).await?;
            Ok(status_text(&status, wait_for.filter(|_| !reached), timeout))
        }
        other => Err(ToolError(format!("internal: tool `{other}` is listed but not run"))),
    }
}

/// I8: answers a Telegram message through this PC's bot and moves exactly its intent: a reply
/// Telegram accepted closes it, a reaction marks it seen; a refusal moves nothing and says why.
async fn telegram(client: Option<&Client>, home: &Path, name: &str, args: &Args<'_>) -> Result<String, ToolError> {
    let config = crate::telegram::load(home).map_err(|e| ToolError(e.to_string()))?.ok_or_else(|| {
        ToolError("This PC has no Telegram bot; run `pcmail-ctl telegram login --token-file F`.".into())
    })?;
    let bot = crate::telegram::Bot::new(&config).map_err(|e| ToolError(e.to_string()))?;
    let reply = name == "telegram_reply";
    let (chat, message) = (args.chat_id("chat_id")?, args.chat_id(if reply { "reply_to" } else { "message_id" })?);
    // T13: only to an allowed chat, about a message recorded there; else nothing is sent.
    let target = {
        let cache = Cache::open(home, crate::hooks::HOOK_BUSY)?;
        let policy = cache.intent_policy()?;
        let mut lookup_error = None;
        let recorded = |key: &str| match cache.intent_by_key(key) {
            Ok(found) => found.is_some(),
            Err(e) => {
                lookup_error.get_or_insert(e.to_string());
                false
            }
        };
        let target = pcmail_core::telegram::outbound(&policy, &chat, &message, recorded);
        if let Some(e) = lookup_error {
            return Err(ToolError(format!("{e}; nothing was sent.")));
        }
        target.map_err(|why| ToolError(format!("Refused: {why}; nothing was sent.")))?
    };
    let (chat, message) = (target.chat.to_string(), target.message.to_string());
    let step = if reply {
        let text = args.str("text")?;
        bot.reply(&chat, &message, &text).await.map_err(|e| ToolError(format!("{e}; nothing was sent or closed.")))?;
        Step::Done { result: Some(present::cut(&format!("answered on Telegram: {text}"), 2000)) }
    } else {
        bot.react(&chat, &message, &args.str("emoji")?)
            .await
            .map_err(|e| ToolError(format!("{e}; nothing was marked.")))?;
        Step::See
    };
    let key = target.key();
    let mut cache = Cache::open(home, crate::hooks::HOOK_BUSY)?;
    let closed = match cache.intent_by_key(&key)? {
        Some(intent) => {
            let me = cache.state("machine")?.unwrap_or_else(|| "this-pc".into());
            cache.step(&intent.id, step, &me, crate::now())?.map(|m| m.state)
        }
        None => None,
    };
    drop(cache);
    // The server hears of it now, not at the poller's next cycle (which may be a minute away).
    if let Some(client) = client
        && closed.is_some()
        && let Err(e) = crate::sync::flush(client, home).await
    {
        tracing::info!(error = %e, "the intent's move waits in the queue for the next poll");
    }
    let verb = if name == "telegram_reply" { "replied to" } else { "reacted to" };
    Ok(match closed {
        Some(state) => format!("{verb} chat {chat} message {message}; its intent is {state}"),
        None => format!("{verb} chat {chat} message {message}; no pending intent had that key"),
    })
}

/// K7: a text file up to this size is handed over as text; larger, by its path only.
const MAX_TEXT_FILE: usize = 100 * 1024;

/// K7: `intents {key}`: the file the message recorded under `key` carried, from the PC's
/// cache: where it is, and its content
/// — an image as an image, text as text. Only messages recorded as intents of an allowed chat
/// (T13's rule, as for answers).
pub fn attachment(home: &Path, key: &str) -> Result<Vec<rmcp::model::ContentBlock>, ToolError> {
    use base64::Engine;
    use rmcp::model::ContentBlock;
    let (chat, message) =
        pcmail_core::intent::key_parts(key.trim(), pcmail_core::telegram::CHANNEL).ok_or_else(|| {
            ToolError(format!("`key` must be a Telegram intent's key like telegram--1001-5, not {key:?}."))
        })?;
    let target = {
        let cache = Cache::open(home, crate::hooks::HOOK_BUSY)?;
        let policy = cache.intent_policy()?;
        let recorded = |key: &str| cache.intent_by_key(key).ok().flatten().is_some();
        pcmail_core::telegram::outbound(&policy, chat, message, recorded)
            .map_err(|why| ToolError(format!("Refused: {why}.")))?
    };
    let dir = crate::telegram::files_dir(home);
    let prefix = pcmail_core::telegram::cached_prefix(target.chat, target.message);
    let found = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)));
    let Some(path) = found else {
        return Err(ToolError(format!(
            "No file is kept for chat {} message {}: it had none, or it was over the bound (its text says).",
            target.chat, target.message
        )));
    };
    let bytes = std::fs::read(&path).map_err(|e| ToolError(format!("{}: {e}", path.display())))?;
    let mut blocks = vec![ContentBlock::text(format!("{key}: {} bytes, kept at {}", bytes.len(), path.display()))];
    if let Some(media) = pcmail_core::telegram::image_type(&bytes) {
        blocks.push(ContentBlock::image(base64::engine::general_purpose::STANDARD.encode(&bytes), media));
    } else if let Ok(text) = std::str::from_utf8(&bytes).map(str::to_string)
        && bytes.len() <= MAX_TEXT_FILE
    {
        blocks.push(ContentBlock::text(text));
    } else {
        blocks.push(ContentBlock::text("Not text or an image, or too long to show: read it at the path."));
    }
    Ok(blocks)
}

/// I5's listing, from the local cache: intents are recorded on this PC first (I1).
fn intents(home: &Path) -> Result<String, ToolError> {
    let cache = Cache::open(home, crate::hooks::HOOK_BUSY)?;
    let open = cache.open_intents()?;
    let text = listing(&open.iter().collect::<Vec<_>>(), &cache.intent_policy()?, crate::now());
    Ok(if text.is_empty() { "no pending intents".into() } else { text })
}

fn when(t: pcmail_core::Ts) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

fn tag(m: &Mail) -> String {
    format!("{}{}", m.kind, if m.urgent { ", urgent" } else { "" })
}

pub fn inbox_text(mails: &[Mail]) -> String {
    if mails.is_empty() {
        return "no open mail".into();
    }
    let mut sorted: Vec<&Mail> = mails.iter().collect();
    sorted.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.seq.cmp(&a.seq)));
    sorted
        .iter()
        .map(|m| format!("{} [{}] {} from {} at {}: {}", m.id, tag(m), m.state, m.from, when(m.created_at), m.subject))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn read_text(m: &Mail) -> String {
    let reply = m.reply_to.as_ref().map(|p| format!(" in reply to {p}")).unwrap_or_default();
    format!(
        "{} [{}] from {} to {}{reply}, {}\nsubject: {}\n\n{}",
        m.id,
        tag(m),
        m.from,
        m.to,
        m.state,
        m.subject,
        m.body
    )
}

fn step_text(m: &Mail) -> String {
    format!("{} is {}", m.id, m.state)
}

/// M12's timeline in a line or two; `missed` is the state waited for in vain.
pub fn status_text(status: &MailStatus, missed: Option<MailState>, waited: Duration) -> String {
    let m = &status.mail;
    let steps: Vec<String> = m
        .timeline()
        .into_iter()
        .filter(|e| e.milestone != Milestone::Expires)
        .filter_map(|e| {
            // The creator is the sender, named at the line's start.
            let by = match e.milestone {
                Milestone::Reached(_) => e.by.map(|b| format!(" by {b}")).unwrap_or_default(),
                Milestone::Created | Milestone::Expires => String::new(),
            };
            Some(format!("{} {}{by}", e.milestone.label(), when(e.at?)))
        })
        .collect();
    let mut out = format!("{} to {}: {} ({})", m.id, m.to, m.state, steps.join(", "));
    if let Some(r) = &m.result {
        out += &format!("\nresult: {r}");
    }
    if let Some(r) = &m.fail_reason {
        out += &format!("\nfail reason: {r}");
    }
    if let Some(target) = missed {
        out += &format!("\nstill not {target} after {}s", waited.as_secs());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t14_search_a_cut_answer_says_so_in_one_line() {
        assert_eq!(search_text(&SearchResults::default()), "nothing found");
        let cut = SearchResults { truncated: true, ..Default::default() };
        assert_eq!(search_text(&cut), pcmail_core::search::TRUNCATED);
    }

    #[test]
    fn r3_send_offers_every_kind_a_send_may_carry_but_the_answer_a_reply_is() {
        let tools = catalogue();
        let schema = tools.iter().find(|(n, ..)| *n == "send").map(|(.., s)| s.clone()).unwrap_or_default();
        let offered: Vec<MailKind> = schema["properties"]["kind"]["enum"]
            .as_array()
            .map(|names| names.iter().filter_map(|n| n.as_str()?.parse().ok()).collect())
            .unwrap_or_default();
        let expected: Vec<MailKind> = MailKind::ALL.into_iter().filter(|k| k.can_be_sent() && !k.is_answer()).collect();
        assert_eq!(offered, expected);
        assert!(offered.contains(&MailKind::Decision) && !offered.contains(&MailKind::Answer), "{offered:?}");
        assert!(!offered.contains(&MailKind::Intent), "{offered:?}");
    }

    #[test]
    fn every_tool_has_an_object_schema_whose_required_fields_are_its_properties() {
        for (name, description, schema) in catalogue() {
            assert!(description.len() <= 100, "{name}: keep descriptions short");
            assert_eq!(schema["type"], "object", "{name}");
            let props = schema["properties"].as_object().expect("properties");
            for r in schema["required"].as_array().into_iter().flatten() {
                assert!(props.contains_key(r.as_str().unwrap_or_default()), "{name}: {r} is not a property");
            }
        }
    }

    #[test]
    fn m3_an_unknown_recipient_is_one_sentence_naming_the_candidates() {
        let e = MailError::Client(ClientError::Api {
            status: 422,
            code: Some(ErrorCode::RecipientUnresolved),
            message: "recipient \"lap\" does not exactly match any machine in the Roster".into(),
            details: vec!["candidate: laptop".into(), "candidate: lab".into()],
        });
        assert_eq!(
            sentence(&e),
            "recipient \"lap\" does not exactly match any machine in the Roster; nothing was sent. Did you mean laptop, lab?"
        );
    }

    #[test]
    fn m5_a_loop_refusal_says_what_to_do_instead() {
        let s = sentence(&MailError::Loop("mail--00000001 is itself a reply".into()));
        assert!(s.starts_with("Refused as a loop: mail--00000001 is itself a reply") && s.contains("send"), "{s}");
    }

    #[test]
    fn an_unreachable_server_is_named_with_nothing_changed() {
        let e = MailError::Client(ClientError::Unreachable {
            base: "http://127.0.0.1:7420".into(),
            message: "error sending request: connection refused".into(),
        });
        let s = sentence(&e);
        assert!(s.contains("http://127.0.0.1:7420") && s.contains("nothing was changed"), "{s}");
        assert!(!s.contains("error sending request"), "the transport's wording stays out: {s}");
    }

    #[test]
    fn bad_arguments_are_named() {
        let args = json!({"id": 7, "all": "yes", "timeout": -1});
        let args = Args(args.as_object().expect("object"));
        assert_eq!(args.str("id"), Err(ToolError("`id` must be a string.".into())));
        assert_eq!(args.str("body"), Err(ToolError("`body` is required.".into())));
        assert_eq!(args.flag("all"), Err(ToolError("`all` must be true or false.".into())));
        assert_eq!(args.seconds("timeout"), Err(ToolError("`timeout` must be a whole number of seconds.".into())));
        let path = json!({"id": "mail--0a1b2c3d/ack"});
        assert_eq!(
            Args(path.as_object().expect("object")).id(),
            Err(ToolError("`id` must be a mail id like mail--0a1b2c3d, not \"mail--0a1b2c3d/ack\".".into())),
            "an id never reaches a URL unchecked"
        );
    }

    #[test]
    fn m12_status_names_each_step_reached_and_the_state_waited_for_in_vain() {
        let mut m = Mail::new("mail--00000001".into(), "desk".into(), "laptop".into(), at(0), at(100));
        m.state = MailState::Delivered;
        (m.delivered_at, m.delivered_by) = (Some(at(5)), Some("laptop".into()));
        let text = status_text(&MailStatus { mail: m, events: vec![] }, Some(MailState::Seen), Duration::from_secs(3));
        assert_eq!(
            text,
            "mail--00000001 to laptop: delivered (created 2023-11-14 22:13:20, delivered 2023-11-14 22:13:25 by laptop)\nstill not seen after 3s"
        );
    }

    fn at(secs: i64) -> pcmail_core::Ts {
        pcmail_core::Ts::from_timestamp(1_700_000_000 + secs, 0).unwrap_or_default()
    }
}
