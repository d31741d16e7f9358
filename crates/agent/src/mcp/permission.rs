//! K6: Claude Code's permission prompts, relayed to the session owner's Telegram chat. Each
//! prompt is asked there and kept in the cache as waiting; whichever process polls the bot
//! (this one or the agent) files the owner's `yes <id>` / `no <id>` as its verdict
//! (`telegram::poll_once`), and this task tells Claude Code — or denies it when no answer
//! came within the timeout. Claude Code races the relay against its own dialog: the first
//! answer wins, a later one is ignored.

use std::path::PathBuf;
use std::time::Duration;

use pcmail_core::permission::{Behavior, Pending, Request, VERDICT_METHOD, expired, prompt};
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer};

use crate::cache::Cache;
use crate::hooks::HOOK_BUSY;
use crate::telegram::{Bot, PROMPT_PREFIX, VERDICT_PREFIX};

/// How often a waiting prompt looks for its verdict.
const TICK: Duration = Duration::from_millis(250);

/// Where prompts go: the bot, the owner's chat, how long an answer is waited for.
#[derive(Clone)]
pub struct Relay {
    pub bot: Bot,
    pub chat: i64,
    pub timeout_secs: u64,
}

/// Asks `req` in the owner's chat and answers Claude Code with the verdict, or a denial at
/// the deadline. A prompt that cannot be asked is left to the terminal's dialog.
pub async fn relay(relay: Relay, home: PathBuf, peer: Peer<RoleServer>, req: Request) {
    let id = req.request_id.to_ascii_lowercase();
    if !pcmail_core::permission::is_request_id(&id) {
        tracing::warn!(id, "a permission request with an id of another shape; left to the terminal");
        return;
    }
    let deadline = crate::now() + chrono::TimeDelta::seconds(relay.timeout_secs as i64);
    let pending = Pending { request_id: id.clone(), chat: relay.chat, deadline };
    let (prompt_key, verdict_key) = (format!("{PROMPT_PREFIX}{id}"), format!("{VERDICT_PREFIX}{id}"));
    let stored = Cache::open(&home, HOOK_BUSY)
        .and_then(|mut c| c.set_state(&[(&prompt_key, serde_json::to_string(&pending).unwrap_or_default())]));
    if let Err(e) = stored {
        tracing::warn!(error = %e, "a permission prompt not relayed; the terminal asks");
        return;
    }
    if let Err(e) = relay.bot.say(relay.chat, &prompt(&req, relay.timeout_secs)).await {
        tracing::warn!(error = %e, "a permission prompt not sent to Telegram; the terminal asks");
        let _ = Cache::open(&home, HOOK_BUSY).and_then(|mut c| c.clear_state(&[&prompt_key]));
        return;
    }
    let (behavior, answered) = loop {
        let verdict = Cache::open(&home, HOOK_BUSY).ok().and_then(|c| c.state(&verdict_key).ok().flatten());
        match verdict.as_deref() {
            Some("allow") => break (Behavior::Allow, true),
            Some(_) => break (Behavior::Deny, true),
            None if !expired(std::slice::from_ref(&pending), crate::now()).is_empty() => break (Behavior::Deny, false),
            None => tokio::time::sleep(TICK).await,
        }
    };
    let _ = Cache::open(&home, HOOK_BUSY).and_then(|mut c| c.clear_state(&[&prompt_key, &verdict_key]));
    let params = serde_json::json!({"request_id": id, "behavior": behavior.as_str()});
    let note = CustomNotification::new(VERDICT_METHOD, Some(params));
    if let Err(e) = peer.send_notification(ServerNotification::CustomNotification(note)).await {
        tracing::warn!(error = %e, "the permission verdict could not be told to the session");
    }
    let said = match (behavior, answered) {
        (Behavior::Allow, _) => format!("{id}: allowed"),
        (Behavior::Deny, true) => format!("{id}: denied"),
        (Behavior::Deny, false) => format!("{id}: denied, no answer within {} s", relay.timeout_secs),
    };
    if let Err(e) = relay.bot.say(relay.chat, &said).await {
        tracing::info!(error = %e, "the verdict's confirmation was not sent to Telegram");
    }
}
