//! `pcmail-ctl hook EVENT`: Claude Code hook JSON in on stdin, JSON out (H1). A hook reads and
//! writes only the local cache: it never talks to the server, so it answers in milliseconds
//! whether or not the server is up. When the last poll is older than 3 minutes it starts a
//! detached poll and returns without waiting for it.

use std::path::Path;
use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::intent::{ToolEffect, due_reminders, listing, tool_effect};
use pcmail_core::mail::{MailKind, Step};
use pcmail_core::manifest::spec::IntentPolicySpec;
use pcmail_core::present::{LIMITS, present};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cache::{Cache, CacheError};

/// A hook's cache writes wait at most this long for the poller's (which last microseconds).
pub const HOOK_BUSY: Duration = Duration::from_millis(250);
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
    let policy: IntentPolicySpec =
        cache.state("intent_policy")?.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default();
    let session = input.session_id.clone().unwrap_or_default();

    let output = match event {
        HookEvent::SessionStart | HookEvent::UserPromptSubmit => {
            let mut parts = Vec::new();
            if event == HookEvent::SessionStart {
                // I5: every pending intent at the start of a session.
                let intents = cache.open_intents()?;
                parts.push(listing(&intents.iter().collect::<Vec<_>>(), &policy, now));
            }
            let inbox = cache.open_mail()?;
            let p = present(&inbox, &session, now, LIMITS);
            cache.mark_presented(&p.shown, &p.acked, &session, &me, now)?;
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

/// H4: an idle agent is stopped once per urgent decision request still unanswered, never
/// while Claude Code is already continuing because of a stop hook.
fn stop(cache: &mut Cache, active: bool, now: Ts) -> Result<Option<Value>, CacheError> {
    if active {
        return Ok(None);
    }
    let Some(m) =
        cache.stop_candidates()?.into_iter().filter(|m| m.kind == MailKind::Decision).max_by_key(|m| m.created_at)
    else {
        return Ok(None);
    };
    cache.mark_stop_blocked(&m.id, now)?;
    let reason = format!(
        "An urgent decision request is waiting: {} from {}: {}. Read it with `pcmail-ctl read {}` and answer with `pcmail-ctl reply {} --body ...` before stopping.",
        m.id, m.from, m.subject, m.id, m.id
    );
    Ok(Some(json!({"decision": "block", "reason": reason})))
}
