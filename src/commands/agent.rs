//! The PC-side verbs: `agent` (and `install`, `heal`), `hook EVENT`, `intent record`.

use std::io::{Read, Write};

use anyhow::Context;
use pcmail_agent::cache::Cache;
use pcmail_agent::client::{Client, ClientError, home};
use pcmail_agent::hooks::{self, HOOK_BUSY, HookEvent};
use pcmail_agent::install::{self, Os};
use pcmail_agent::sync::{self, POLLER_BUSY};
use pcmail_core::agent::QueuedCall;
use pcmail_core::agent::needs_reregister;
use pcmail_core::duration::Dur;
use pcmail_core::intent::{InboundMessage, intent_mail};

use crate::args::{AgentCommand, TelegramCommand};
use crate::logging::Logging;

fn os(name: Option<&str>) -> Os {
    name.and_then(Os::from_cli).unwrap_or_else(Os::current)
}

pub async fn run(client: &Client, command: Option<AgentCommand>, wait: Dur, logging: &Logging) -> anyhow::Result<i32> {
    match command {
        None => {
            logging.init("info");
            let (stop, stopped) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                stop.send_replace(true);
            });
            tracing::info!(server = client.base(), "agent polling");
            // I7: the bot's updates too, when this PC owns a Telegram bot.
            let bot = tokio::spawn(pcmail_agent::telegram::run(
                home(),
                Some(client.clone()),
                std::sync::Arc::default(),
                stopped.clone(),
            ));
            let polled =
                sync::run(client, &home(), wait.to_std(), std::time::Duration::from_secs(60), || {}, stopped).await;
            bot.abort();
            polled?;
            Ok(0)
        }
        Some(AgentCommand::Install { os: name, dir }) => {
            let os = os(name.as_deref());
            let dir = dir.unwrap_or_else(|| install::default_dir(os));
            let exe = std::env::current_exe().context("finding this executable")?;
            let (files, commands) = install::units(os, &exe, &home());
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for f in files {
                let path = dir.join(&f.name);
                std::fs::write(&path, f.contents).with_context(|| format!("writing {}", path.display()))?;
                println!("wrote {}", path.display());
            }
            println!("then run:");
            for c in commands {
                println!("  {c}");
            }
            Ok(0)
        }
        Some(AgentCommand::Heal { os: name }) => {
            let os = os(name.as_deref());
            let last_poll = Cache::open(&home(), POLLER_BUSY)?.state_ts("last_poll_at")?;
            let result = install::task_result(os);
            if !needs_reregister(result, last_poll, pcmail_agent::now()) {
                println!("agent healthy ({result:?}, last poll {last_poll:?})");
                return Ok(0);
            }
            println!("agent unhealthy ({result:?}, last poll {last_poll:?}): re-registering and polling once");
            install::reregister(os).context("re-registering the agent")?;
            sync::cycle(client, &home(), std::time::Duration::ZERO).await?;
            Ok(0)
        }
    }
}

/// `mcp`: serves the session on stdio. Without a usable login it still starts: every tool
/// then answers why, and mail the agent polls is still pushed. With `channels` (the session was
/// started with Claude Code's channels flag) a push counts as presented in the session
/// `CLAUDE_CODE_SESSION_ID` names, so its hooks do not show the mail again.
pub async fn mcp(client: Result<Client, ClientError>, wait: Dur, channels: bool) -> anyhow::Result<i32> {
    // Claude Code keeps a server's stderr in its logs: only what needs a look.
    Logging::default().init("warn");
    let session = std::env::var("CLAUDE_CODE_SESSION_ID").ok().filter(|s| !s.is_empty());
    if channels && session.is_none() {
        tracing::warn!("PCMAIL_CHANNELS is set but CLAUDE_CODE_SESSION_ID is not: pushes will not count as presented");
    }
    pcmail_agent::mcp::run(client, home(), session.filter(|_| channels), wait.to_std()).await?;
    Ok(0)
}

/// A hook must never break a Claude Code session: any failure is one line on stderr and exit
/// code 1, which Claude Code shows without stopping.
pub fn hook(event: &str) -> i32 {
    let Some(event) = HookEvent::from_cli(event) else {
        eprintln!("pcmail hook: unknown event {event:?}");
        return 1;
    };
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        eprintln!("pcmail hook: cannot read stdin: {e}");
        return 1;
    }
    match hooks::handle(event, &stdin, &home(), pcmail_agent::now()) {
        Ok(outcome) => {
            if let Some(out) = outcome.output {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "{out}");
            }
            if outcome.spawn_poll
                && let Err(e) = pcmail_agent::spawn::spawn_poll()
            {
                eprintln!("pcmail hook: cannot start a background poll: {e}");
            }
            0
        }
        Err(e) => {
            eprintln!("pcmail hook: {e}");
            1
        }
    }
}

/// I1: the message is in the local cache, durably, before anything else; then the server is
/// told (or the call waits in the queue for the agent).
pub async fn record_intent(
    client: Option<Client>,
    channel: String,
    chat: String,
    message: String,
    from: String,
    text: String,
) -> anyhow::Result<i32> {
    let text = if text == "-" {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes).context("reading the text from stdin")?;
        String::from_utf8(bytes).context("the text on stdin is not valid UTF-8")?
    } else {
        text
    };
    let msg = InboundMessage { channel, chat, message, from, text, edited: false };
    // The server's own checks, here first: a message the server would refuse is not recorded.
    pcmail_core::api::Validate::validate(&msg).map_err(|e| anyhow::anyhow!("--{}: {}", e.field, e.message))?;
    let home = home();
    let mut cache = Cache::open(&home, HOOK_BUSY)?;
    let me = cache.state("machine")?.unwrap_or_else(|| "this-pc".into());
    let now = pcmail_agent::now();
    let mail = intent_mail(&msg, &me, now, Dur::from_hours(72));
    let created = cache.record_intent(&mail, &serde_json::to_value(&msg)?, now)?;
    drop(cache);
    println!("{}", mail.id);
    if !created {
        eprintln!("already recorded: {}", mail.external_key.as_deref().unwrap_or_default());
    }
    // Best effort, briefly: the agent sends whatever is still queued.
    if let Some(client) = client.and_then(|c| c.with_timeout(std::time::Duration::from_secs(3)).ok())
        && let Err(e) = sync::flush(&client, &home).await
    {
        eprintln!("recorded locally; the server will be told later ({e})");
    }
    // T10: a refusal is never silent. The message stays in this PC's cache either way.
    let key = mail.external_key.unwrap_or_default();
    if let Some(why) = Cache::open(&home, HOOK_BUSY)?.refusal_of(QueuedCall::Intent, &key)? {
        eprintln!("the server refused to record {key}; it is kept on this PC and not sent again (T10): {why}");
        return Ok(1);
    }
    Ok(0)
}

/// `telegram login` and `status`: the bot's token is read from a file (or the environment),
/// checked with Telegram, and kept in a 0600 file; it is never printed.
pub async fn telegram(command: TelegramCommand) -> anyhow::Result<i32> {
    use pcmail_agent::telegram::{self, Bot, BotConfig};
    let home = home();
    match command {
        TelegramCommand::Login { token_file, api, owner_chat, permission_timeout, max_file_bytes } => {
            let token = match token_file {
                Some(path) => std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
                None => std::env::var("PCMAIL_TELEGRAM_TOKEN")
                    .context("pass --token-file FILE (or set PCMAIL_TELEGRAM_TOKEN)")?,
            };
            let config =
                BotConfig { token: token.trim().to_string(), api, owner_chat, permission_timeout, max_file_bytes };
            anyhow::ensure!(!config.token.is_empty(), "the bot token is empty");
            let me = Bot::new(&config)?.get_me().await.context("checking the token with Telegram")?;
            let path = telegram::save(&home, &config)?;
            let name = me["username"].as_str().unwrap_or("?");
            println!("bot @{name} saved to {} (0600); `pcmail-ctl agent` polls it", path.display());
            Ok(0)
        }
        TelegramCommand::Status => {
            for (what, value) in telegram::status(&home)? {
                println!("{what}: {value}");
            }
            Ok(0)
        }
    }
}
