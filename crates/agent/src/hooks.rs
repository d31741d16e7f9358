//! `pcmail-ctl hook EVENT`: Claude Code hook JSON in on stdin, JSON out (H1). A hook reads and
//! writes only the local cache: it never talks to the server, so it answers in milliseconds
//! whether or not the server is up. When the last poll is older than 3 minutes it starts a
//! detached poll and returns without waiting for it.

use std::path::Path;
use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::intent::{ToolEffect, due_reminders, listing, tool_effect};
use pcmail_core::mail::Step;
use pcmail_core::present::{LIMITS, present_heads};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cache::{Cache, CacheError};

/// A hook's cache writes wait at most this long for the poller's (which last microseconds).
pub const HOOK_BUSY: Duration = Duration::from_millis(100);
pub const POLL_STALE: chrono::TimeDelta = chrono::TimeDelta::minutes(3);
const SPAWN_EVERY: chrono::TimeDelta = chrono::TimeDelta::minutes(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookEvent {
    SessionStart,
    UserPromptSubmit,
    PostToolUse,
    Stop,
}

impl HookEvent {
    pub fn from_cli(s: &str) -> Option<HookEvent> {
        match s {
            "session-start" => Some(HookEvent::SessionStart),
            "user-prompt-submit" => Some(HookEvent::UserPromptSubmit),
            "post-tool-use" => Some(HookEvent::PostToolUse),
            "stop" => Some(HookEvent::Stop),
            _ => None,
        }
    }

    /// The `hookEventName` Claude Code expects back.
    pub fn name(self) -> &'static str {
        match self {
            HookEvent::SessionStart => "SessionStart",
            HookEvent::UserPromptSubmit => "UserPromptSubmit",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::Stop => "Stop",
        }
    }
}

/// The fields of Claude Code's hook input that pcmail reads; others are ignored.
#[derive(Debug, Default, Deserialize)]
struct HookInput {
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    tool_name: Option<String>,
    #[serde(default)]
    tool_input: Option<Value>,
    #[serde(default)]
    stop_hook_active: bool,
    /// UserPromptSubmit's prompt: a push while idle starts its turn as this prompt (K4).
    #[serde(default)]
    prompt: Option<String>,
    /// The session's transcript, where a push during a tool call was recorded (K4).
    #[serde(default)]
    transcript_path: Option<std::path::PathBuf>,
}

/// How much of a transcript's end a hook reads for pushes (K4): a push older than that is
/// shown once more — a repeat, never a loss — and a hook stays fast on a long session.
const TRANSCRIPT_TAIL: u64 = 4 << 20;

/// The end of the file at `path`, as text; nothing if it cannot be read (a hook never fails
/// for want of evidence: the mail is then shown, as without a push).
fn tail(path: &Path, max: u64) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if f.seek(SeekFrom::Start(len.saturating_sub(max))).is_err() {
        return String::new();
    }
    let mut bytes = Vec::new();
    let _ = f.take(max).read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("hook input is not valid JSON: {0}")]
    Input(String),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

#[derive(Debug, Default, PartialEq)]
pub struct HookOutcome {
    /// The JSON to print, if any.
    pub output: Option<Value>,
    /// Whether a detached poll should be started.
    pub spawn_poll: bool,
}

fn context(event: HookEvent, text: String) -> Option<Value> {
    (!text.is_empty())
        .then(|| json!({"hookSpecificOutput": {"hookEventName": event.name(), "additionalContext": text}}))
}

/// Handles one hook call against the cache in `home`.
pub fn handle(event: HookEvent, stdin: &[u8], home: &Path, now: Ts) -> Result<HookOutcome, HookError> {
    let input: HookInput = if stdin.iter().all(u8::is_ascii_whitespace) {
        HookInput::default()
    } else {
        serde_json::from_slice(stdin).map_err(|e| HookError::Input(e.to_string()))?
    };
    let mut cache = Cache::open(home, HOOK_BUSY)?;
    let me = cache.state("machine")?.unwrap_or_else(|| "this-pc".into());
    let policy = cache.intent_policy()?;
    let session = input.session_id.clone().unwrap_or_default();

    let output = match event {
        HookEvent::SessionStart | HookEvent::UserPromptSubmit => {
            let mut parts = Vec::new();
            if event == HookEvent::SessionStart {
                // I5: every pending intent at the start of a session.
                let intents = cache.open_intents()?;
                parts.push(listing(&intents.iter().collect::<Vec<_>>(), &policy, now));
            }
            // K4: what the model was already given as a push is presented, only counted here.
            let mut evidence = input.prompt.clone().unwrap_or_default();
            if let Some(path) = &input.transcript_path {
                evidence.push_str(&tail(path, TRANSCRIPT_TAIL));
            }
            let mut pushed = Vec::new();
            for id in pcmail_core::channel::pushed_ids(&evidence) {
                if cache.get(&id)?.is_some_and(|m| m.presented_session.as_deref() != Some(session.as_str())) {
                    pushed.push(id);
                }
            }
            if !pushed.is_empty()
                && let Err(e) = cache.mark_pushed(&pushed, &session, now)
            {
                eprintln!("pcmail hook: pushed mail not recorded as presented this time: {e}");
            }
            // P5: the few mails that can be shown, and counts of the rest.
            let mut heads = cache.group_heads(&session, now, LIMITS)?;
            heads.retain(|m| !pushed.contains(&m.id));
            let p = present_heads(&heads, cache.tally(now)?, now, LIMITS);
            // Show the mail even if the poller holds the write lock past HOOK_BUSY: the marks
            // are then made by the next hook, which presents the same mail again.
            if let Err(e) = cache.mark_presented(&p.shown, &p.acked, &session, &me, now) {
                eprintln!("pcmail hook: presented mail not recorded this time: {e}");
            }
            parts.push(p.text);
            context(event, parts.into_iter().filter(|p| !p.is_empty()).collect::<Vec<_>>().join("\n\n"))
        }
        HookEvent::PostToolUse => {
            let tool = input.tool_name.as_deref().unwrap_or_default();
            let args = input.tool_input.clone().unwrap_or(Value::Null);
            match tool_effect(tool, &args, &policy) {
                ToolEffect::Close(key) => {
                    close(&mut cache, &key, Step::Done { result: Some(format!("answered with {tool}")) }, &me, now)?
                }
                ToolEffect::See(key) => close(&mut cache, &key, Step::See, &me, now)?,
                ToolEffect::Remind => {}
            }
            // I3: pending intents past remindAfter, each at most once per remindEvery.
            let intents = cache.open_intents()?;
            let due = due_reminders(&intents, &policy, now);
            let ids: Vec<String> = due.iter().map(|m| m.id.clone()).collect();
            let text = listing(&due, &policy, now);
            cache.mark_reminded(&ids, now)?;
            context(event, text)
        }
        HookEvent::Stop => stop(&mut cache, input.stop_hook_active, now)?,
    };
    let stale = cache.state_ts("last_poll_at")?.is_none_or(|t| now - t > POLL_STALE);
    let spawned_recently = cache.state_ts("last_spawn_at")?.is_some_and(|t| now - t < SPAWN_EVERY);
    let spawn_poll = stale && !spawned_recently;
    if spawn_poll {
        cache.set_state(&[("last_spawn_at", now.timestamp_millis().to_string())])?;
    }
    Ok(HookOutcome { output, spawn_poll })
}

/// I2: only the intent with exactly this key moves; an unknown key changes nothing.
fn close(cache: &mut Cache, key: &str, step: Step, me: &str, now: Ts) -> Result<(), CacheError> {
    if let Some(intent) = cache.intent_by_key(key)? {
        cache.step(&intent.id, step, me, now)?;
    }
    Ok(())
}

/// The plugin's tools as a session names them (`mcp__plugin_<plugin>_<server>__<tool>`).
const READ_TOOL: &str = "mcp__plugin_pcmail_pcmail__read";
const REPLY_TOOL: &str = "mcp__plugin_pcmail_pcmail__reply";

/// H4: an idle agent is stopped once per urgent decision request still unanswered, never
/// while Claude Code is already continuing because of a stop hook.
fn stop(cache: &mut Cache, active: bool, now: Ts) -> Result<Option<Value>, CacheError> {
    if active {
        return Ok(None);
    }
    let Some(m) = cache.stop_candidates(now)?.into_iter().filter(|m| m.kind.blocks_stop()).max_by_key(|m| m.created_at)
    else {
        return Ok(None);
    };
    cache.mark_stop_blocked(&m.id, now)?;
    // K5: the session's own tools first (the plugin's MCP server), the CLI where there is none.
    let reason = format!(
        "An urgent decision request is waiting: {id} from {}: {}. Read it with the `{READ_TOOL}` tool (id {id}) and answer with `{REPLY_TOOL}` before stopping (without the plugin: `pcmail-ctl read {id}`, `pcmail-ctl reply {id} --body ...`).",
        m.from,
        m.subject,
        id = m.id
    );
    Ok(Some(json!({"decision": "block", "reason": reason})))
}

#[cfg(test)]
mod tests {
    use pcmail_core::mail::{Mail, MailKind, MailState};
    use serde_json::json;

    use super::*;
    use crate::cache::tests::{at, intent, mail};

    fn home() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = Cache::open(dir.path(), HOOK_BUSY).expect("cache");
        c.set_state(&[("machine", "me".into()), ("last_poll_at", at(0).timestamp_millis().to_string())])
            .expect("state");
        dir
    }

    fn run(dir: &Path, event: HookEvent, input: serde_json::Value, now: Ts) -> Option<Value> {
        handle(event, input.to_string().as_bytes(), dir, now).expect("hook").output
    }

    fn text(out: &Option<Value>) -> String {
        out.as_ref().and_then(|o| o["hookSpecificOutput"]["additionalContext"].as_str()).unwrap_or_default().to_string()
    }

    fn record(dir: &Path, chat: &str, message: &str, now: Ts) -> Mail {
        let m = intent(chat, message, now);
        Cache::open(dir, HOOK_BUSY).expect("cache").record_intent(&m, &json!({}), now).expect("record");
        m
    }

    fn state(dir: &Path, id: &str) -> MailState {
        Cache::open(dir, HOOK_BUSY).expect("cache").get(id).expect("get").expect("row").state
    }

    #[test]
    fn h1_answers_claude_code_hook_json_for_the_event() {
        let dir = home();
        Cache::open(dir.path(), HOOK_BUSY)
            .expect("c")
            .merge_polled("me", vec![mail(1, MailKind::Note)], 1, at(1))
            .expect("m");
        let out = run(dir.path(), HookEvent::UserPromptSubmit, json!({"session_id": "s1", "prompt": "hi"}), at(2));
        let out = out.expect("output");
        assert_eq!(out["hookSpecificOutput"]["hookEventName"], "UserPromptSubmit");
        assert!(text(&Some(out)).contains("mail--00000001"));
        assert_eq!(
            run(dir.path(), HookEvent::Stop, json!({"session_id": "s1"}), at(2)),
            None,
            "nothing to say: no output"
        );
    }

    #[test]
    fn h3_shown_mail_is_queued_seen_and_shown_again_only_as_a_count() {
        let dir = home();
        let mut c = Cache::open(dir.path(), HOOK_BUSY).expect("c");
        c.merge_polled("me", vec![mail(1, MailKind::Note), mail(2, MailKind::Answer)], 2, at(1)).expect("m");
        let first = text(&run(dir.path(), HookEvent::SessionStart, json!({"session_id": "s1"}), at(2)));
        assert!(first.contains("mail--00000001") && first.contains("mail--00000002"), "{first}");
        assert_eq!(state(dir.path(), "mail--00000001"), MailState::Seen);
        assert_eq!(state(dir.path(), "mail--00000002"), MailState::Done, "answers are acked once shown");
        let queued: Vec<&str> = c.due_pending(at(3)).expect("due").into_iter().map(|p| p.action.as_str()).collect();
        assert_eq!(queued, ["ack", "seen"], "the answer group comes before the others");
        let second = text(&run(dir.path(), HookEvent::UserPromptSubmit, json!({"session_id": "s1"}), at(3)));
        assert_eq!(second, "+1 more (0 expired not shown): pcmail-ctl inbox", "same session: count only");
    }

    #[test]
    fn h3_mail_pushed_into_a_session_is_only_counted_by_its_hooks_and_stays_unread() {
        let dir = home();
        let mut c = Cache::open(dir.path(), HOOK_BUSY).expect("c");
        c.merge_polled("me", vec![mail(1, MailKind::Note)], 1, at(1)).expect("m");
        c.mark_pushed(&["mail--00000001".to_string()], "s1", at(2)).expect("pushed");
        assert_eq!(state(dir.path(), "mail--00000001"), MailState::Delivered, "a push is not a read");
        assert!(c.due_pending(at(2)).expect("due").is_empty(), "nothing queued for the server");
        let same = text(&run(dir.path(), HookEvent::UserPromptSubmit, json!({"session_id": "s1"}), at(3)));
        assert_eq!(same, "+1 more (0 expired not shown): pcmail-ctl inbox");
        let other = text(&run(dir.path(), HookEvent::UserPromptSubmit, json!({"session_id": "s2"}), at(3)));
        assert!(other.contains("mail--00000001"), "another session was not told: {other}");
    }

    #[test]
    fn k4_mail_the_model_was_given_as_a_push_is_only_counted_whether_or_not_the_push_was_marked() {
        let dir = home();
        let mut c = Cache::open(dir.path(), HOOK_BUSY).expect("c");
        c.merge_polled("me", vec![mail(1, MailKind::Note), mail(2, MailKind::Note), mail(3, MailKind::Note)], 3, at(1))
            .expect("m");
        let tag = |id: &str| format!("<channel source=\"plugin:pcmail:pcmail\" from=\"desk\" id=\"{id}\">x</channel>");
        // A push while idle is the turn's prompt; one during a tool call is in the transcript.
        let transcript = dir.path().join("session.jsonl");
        std::fs::write(&transcript, format!("{}\n", json!({"content": tag("mail--00000002")}))).expect("transcript");
        let input = json!({"session_id": "s1", "prompt": tag("mail--00000001"), "transcript_path": transcript});
        let shown = text(&run(dir.path(), HookEvent::UserPromptSubmit, input, at(3)));
        assert!(shown.contains("mail--00000003"), "{shown}");
        assert!(!shown.contains("mail--00000001") && !shown.contains("mail--00000002"), "K4: {shown}");
        assert_eq!(state(dir.path(), "mail--00000001"), MailState::Delivered, "a push is not a read");
        let again = text(&run(dir.path(), HookEvent::UserPromptSubmit, json!({"session_id": "s1"}), at(4)));
        assert_eq!(again, "+3 more (0 expired not shown): pcmail-ctl inbox", "presented in s1 now");
        let missing = json!({"session_id": "s2", "transcript_path": dir.path().join("gone.jsonl")});
        let other = text(&run(dir.path(), HookEvent::UserPromptSubmit, missing, at(4)));
        assert!(other.contains("mail--00000003") && other.contains("mail--00000002"), "no evidence in s2: {other}");
    }

    #[test]
    fn i5_session_start_lists_every_pending_intent() {
        let dir = home();
        record(dir.path(), "100", "7", at(0));
        record(dir.path(), "200", "8", at(1));
        let out = text(&run(dir.path(), HookEvent::SessionStart, json!({"session_id": "s1"}), at(60)));
        assert!(out.contains("chat_id=100 reply_to=7") && out.contains("chat_id=200 reply_to=8"), "{out}");
    }

    #[test]
    fn i2_cross_chat_reply_closes_only_its_chat_react_and_reply_without_reply_to_close_nothing() {
        let dir = home();
        let a = record(dir.path(), "100", "7", at(0));
        let b = record(dir.path(), "200", "7", at(0));
        let reply = "mcp__plugin_telegram_telegram__reply";
        let react = "mcp__plugin_telegram_telegram__react";
        run(
            dir.path(),
            HookEvent::PostToolUse,
            json!({"tool_name": reply, "tool_input": {"chat_id": "100", "text": "hi"}}),
            at(1),
        );
        assert_eq!(
            (state(dir.path(), &a.id), state(dir.path(), &b.id)),
            (MailState::New, MailState::New),
            "no reply_to"
        );
        run(
            dir.path(),
            HookEvent::PostToolUse,
            json!({"tool_name": react, "tool_input": {"chat_id": "200", "message_id": "7", "emoji": "👀"}}),
            at(2),
        );
        assert_eq!(state(dir.path(), &b.id), MailState::Seen, "react is seen, never done");
        run(
            dir.path(),
            HookEvent::PostToolUse,
            json!({"tool_name": reply, "tool_input": {"chat_id": "100", "reply_to": "7", "text": "done"}}),
            at(3),
        );
        assert_eq!((state(dir.path(), &a.id), state(dir.path(), &b.id)), (MailState::Done, MailState::Seen));
    }

    #[test]
    fn i3_reminder_for_one_intent_appears_at_most_once_per_remind_every() {
        let dir = home();
        let m = record(dir.path(), "100", "7", at(0));
        let bash = json!({"tool_name": "Bash", "tool_input": {"command": "cargo build"}});
        assert_eq!(
            text(&run(dir.path(), HookEvent::PostToolUse, bash.clone(), at(100))),
            "",
            "before remindAfter (3m)"
        );
        let first = text(&run(dir.path(), HookEvent::PostToolUse, bash.clone(), at(200)));
        assert!(first.contains("chat_id=100 reply_to=7"), "{first}");
        for t in [201, 300, 499] {
            assert_eq!(
                text(&run(dir.path(), HookEvent::PostToolUse, bash.clone(), at(t))),
                "",
                "at {t}: within remindEvery (5m)"
            );
        }
        assert!(
            text(&run(dir.path(), HookEvent::PostToolUse, bash.clone(), at(500))).contains(&"reply_to=7".to_string())
        );
        run(
            dir.path(),
            HookEvent::PostToolUse,
            json!({"tool_name": "mcp__plugin_telegram_telegram__reply", "tool_input": {"chat_id": 100, "reply_to": 7}}),
            at(600),
        );
        assert_eq!(state(dir.path(), &m.id), MailState::Done);
        assert_eq!(text(&run(dir.path(), HookEvent::PostToolUse, bash, at(2000))), "", "answered: no more reminders");
    }

    #[test]
    fn h4_stop_blocks_once_for_an_urgent_decision_and_never_when_already_active() {
        let dir = home();
        let mut urgent = mail(1, MailKind::Decision);
        urgent.urgent = true;
        Cache::open(dir.path(), HOOK_BUSY).expect("c").merge_polled("me", vec![urgent], 1, at(1)).expect("m");
        assert_eq!(
            run(dir.path(), HookEvent::Stop, json!({"session_id": "s1", "stop_hook_active": true}), at(2)),
            None
        );
        let out = run(dir.path(), HookEvent::Stop, json!({"session_id": "s1", "stop_hook_active": false}), at(3))
            .expect("block");
        assert_eq!(out["decision"], "block");
        assert!(out["reason"].as_str().is_some_and(|r| r.contains("mail--00000001")));
        assert_eq!(run(dir.path(), HookEvent::Stop, json!({"session_id": "s1"}), at(4)), None, "once");
    }

    #[test]
    fn h1_a_stale_last_poll_asks_for_one_detached_poll_a_minute() {
        let dir = home();
        let stale = at(0) + POLL_STALE + chrono::TimeDelta::seconds(1);
        assert!(handle(HookEvent::UserPromptSubmit, b"{}", dir.path(), stale).expect("hook").spawn_poll);
        assert!(
            !handle(HookEvent::UserPromptSubmit, b"{}", dir.path(), stale + chrono::TimeDelta::seconds(10))
                .expect("hook")
                .spawn_poll
        );
        assert!(
            !handle(HookEvent::UserPromptSubmit, b"{}", dir.path(), at(10)).expect("hook").spawn_poll,
            "fresh poll"
        );
    }

    #[test]
    fn bad_hook_input_is_a_clear_error() {
        let dir = home();
        let err = handle(HookEvent::SessionStart, b"{not json", dir.path(), at(0)).expect_err("refused");
        assert!(err.to_string().contains("hook input is not valid JSON"), "{err}");
    }
}

/// The hook's stdin under fuzzing: whatever Claude Code (or anything else) writes there, the
/// hook answers with output or a clear input error, never a panic.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn event() -> impl Strategy<Value = HookEvent> {
        prop_oneof![
            Just(HookEvent::SessionStart),
            Just(HookEvent::UserPromptSubmit),
            Just(HookEvent::PostToolUse),
            Just(HookEvent::Stop)
        ]
    }

    /// JSON shaped like a hook's input, with fields of the wrong type now and then.
    fn hook_json() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            ".{0,40}".prop_map(Value::String),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(".{0,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        });
        let key = prop_oneof![
            Just("session_id".to_string()),
            Just("tool_name".to_string()),
            Just("tool_input".to_string()),
            Just("hook_event_name".to_string()),
            Just("prompt".to_string()),
            ".{0,8}",
        ];
        proptest::collection::btree_map(key, value, 0..5).prop_map(|m| serde_json::to_vec(&m).unwrap_or_default())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_h1_hook_stdin_bytes_get_an_answer_or_a_clear_error(event in event(), stdin in proptest::collection::vec(any::<u8>(), 0..256)) {
            let home = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            if let Err(e) = handle(event, &stdin, home.path(), chrono::Utc::now()) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn fuzz_h1_hook_json_of_any_shape_gets_an_answer_or_a_clear_error(event in event(), stdin in hook_json()) {
            let home = tempfile::tempdir().map_err(|e| TestCaseError::fail(e.to_string()))?;
            match handle(event, &stdin, home.path(), chrono::Utc::now()) {
                Ok(outcome) => prop_assert!(outcome.output.as_ref().is_none_or(|o| o.is_object())),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
