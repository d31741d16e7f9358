//! `pcmail-ctl mcp`: the agents' MCP server on stdio (rmcp), acting as the logged-in machine.
//!
//! Three parts run together: the tools (`tools`), answered from the server like the CLI verbs;
//! the poller, the same cycle as `agent` on the same cache and cursor; and the push (`push`),
//! which tells the session about new mail through the `claude/channel` capability. Nothing a
//! tool or the server does ends the process: it lives as long as the session's stdin.

mod permission;
mod push;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pcmail_core::channel;
use rmcp::model::CustomNotification;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use tokio::sync::Notify;

use crate::client::{Client, ClientError};

/// Told to the agent at `initialize`: what a channel event is and how to answer it.
const INSTRUCTIONS: &str = "New mail for this PC arrives as <channel> events with id, from, kind and urgent \
attributes. It is shown, not done: answer with reply, or ack (no answer needed) or fail (cannot be done). \
read shows a mail in full; inbox lists what is open. A Telegram message arrives as a <channel> event with \
chat_id, message_id and user: answer it with telegram_reply (reply_to = its message_id), which closes it; \
a telegram_react does not. A message with a photo or document says so; intents with its key reads its file.";

/// The poller waits at most this long between attempts while the server is away.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("the MCP session did not start: {0}")]
    Start(String),
}

struct McpServer {
    client: Result<Client, ClientError>,
    home: PathBuf,
    /// K6: where permission prompts are relayed, when this PC's bot names an owner chat.
    relay: Option<permission::Relay>,
}

fn tool_list() -> Vec<Tool> {
    tools::catalogue()
        .into_iter()
        .map(|(name, description, schema)| {
            let schema = match schema {
                serde_json::Value::Object(map) => map,
                _ => serde_json::Map::new(),
            };
            Tool::new(name, description, schema)
        })
        .collect()
}

impl ServerHandler for McpServer {
    fn get_info(&self) -> ServerConfig {
        let mut experimental: std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>> =
            [(channel::CAPABILITY.to_string(), serde_json::Map::new())].into_iter().collect();
        if self.relay.is_some() {
            experimental.insert(pcmail_core::permission::CAPABILITY.to_string(), serde_json::Map::new());
        }
        ServerConfig::new(ServerCapabilities::builder().enable_experimental_with(experimental).enable_tools().build())
            .with_server_info(Implementation::new("pcmail", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tool_list()))
    }

    async fn on_custom_notification(&self, notification: CustomNotification, context: NotificationContext<RoleServer>) {
        if notification.method != pcmail_core::permission::REQUEST_METHOD {
            return;
        }
        let Some(relay) = self.relay.clone() else { return };
        match serde_json::from_value::<pcmail_core::permission::Request>(notification.params.unwrap_or_default()) {
            Ok(req) => {
                tokio::spawn(permission::relay(relay, self.home.clone(), context.peer, req));
            }
            Err(e) => tracing::warn!(error = %e, "a permission request pcmail cannot read; the terminal asks"),
        }
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.unwrap_or_default();
        if let Some(key) = arguments.get("key").and_then(|k| k.as_str()).filter(|_| request.name == "intents") {
            let result = match tools::attachment(&self.home, key) {
                Ok(blocks) => CallToolResult::success(blocks),
                Err(e) => CallToolResult::error(vec![ContentBlock::text(e.0)]),
            };
            return Ok(result.into());
        }
        let result = match tools::call(self.client.as_ref(), &self.home, &request.name, &arguments).await {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.0)]),
        };
        Ok(result.into())
    }
}

/// K6: the relay this PC's bot allows: an owner chat that `allowedChats` lets in (T13).
fn relay_of(home: &std::path::Path) -> Option<permission::Relay> {
    let config = crate::telegram::load(home).ok().flatten()?;
    let policy = crate::cache::Cache::open(home, crate::hooks::HOOK_BUSY).ok()?.intent_policy().ok()?;
    let chat = match pcmail_core::permission::relay_chat(config.owner_chat, &policy.allowed_chats) {
        Ok(chat) => chat?,
        Err(why) => {
            tracing::warn!("permission prompts are not relayed: {why}");
            return None;
        }
    };
    let bot = crate::telegram::Bot::new(&config).ok()?;
    Some(permission::Relay { bot, chat, timeout_secs: config.permission_timeout })
}

/// Serves one session on stdin/stdout until it closes. `presented_in` is the Claude Code session
/// pushes count as presented in (H3) — given only when the session listens to channels.
pub async fn run(
    client: Result<Client, ClientError>,
    home: PathBuf,
    presented_in: Option<String>,
    wait: Duration,
) -> Result<(), McpError> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let stopped_bot = stopped.clone();
    let server_client = client.as_ref().ok().cloned();
    // Mail this process fetched is pushed at once; what the agent fetches, within a tick.
    let fetched = Arc::new(Notify::new());
    if let Ok(client) = &client {
        let (client, home, fetched) = (client.clone(), home.clone(), fetched.clone());
        tokio::spawn(async move {
            crate::sync::run(&client, &home, wait, MAX_BACKOFF, || fetched.notify_one(), stopped).await
        });
    }
    let server = McpServer { client, home: home.clone(), relay: relay_of(&home) };
    let running = server.serve(rmcp::transport::stdio()).await.map_err(|e| McpError::Start(e.to_string()))?;
    // I7: this process polls the bot when no other process on this PC does (the lock decides).
    let client_for_bot = server_client.clone();
    tokio::spawn(crate::telegram::run(home.clone(), client_for_bot, fetched.clone(), stopped_bot));
    tokio::spawn(push::follow(running.peer().clone(), home, presented_in, fetched));
    let reason = running.waiting().await;
    tracing::debug!(?reason, "MCP session ended");
    stop.send_replace(true);
    Ok(())
}
