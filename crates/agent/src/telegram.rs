//! pcmail's own Telegram channel (I7–I9): the bot's token in the PC's config, a Bot API client
//! that never lets the token into an error or a log line, and the poller. The poller records
//! every message into the cache (I1, durably) *before* it confirms the update's offset, so a
//! crash between the two reads and records the message again — idempotently — and loses none.
//! One poller per bot: on a PC a lock file picks the one process (the agent or an MCP server)
//! that polls; across PCs Telegram's 409 is said once, alerted, and waited out.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pcmail_core::duration::Dur;
use pcmail_core::intent::intent_mail;
use pcmail_core::telegram::{
    Answer, BotError, File, Intake, Kept, Update, attachment, cached_name, confirm, failure, file_note, intake,
    wait_after, within_bound,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::{Notify, watch};

use crate::cache::{Cache, CacheError};
use crate::client::{Client, write_private};
use crate::sync::POLLER_BUSY;

pub const DEFAULT_API: &str = "https://api.telegram.org";
/// How long one `getUpdates` waits on Telegram's side.
const LONG_POLL_SECS: u64 = 25;
const CONFIG_FILE: &str = "telegram.json";
const LOCK_FILE: &str = "telegram.lock";
/// Cache state: the next offset to confirm, drops not yet reported, the last failure said.
const OFFSET: &str = "telegram_offset";
const DROPPED: &str = "telegram_dropped";
const TROUBLE: &str = "telegram_trouble";

/// The bot this PC reads, as `telegram login` saved it (0600) or the environment gives it.
#[derive(Clone, Serialize, Deserialize)]
pub struct BotConfig {
    pub token: String,
    #[serde(default = "default_api")]
    pub api: String,
    /// K6: the chat Claude Code's permission prompts are asked in (the session owner's), and
    /// the only one whose answer counts; none: no relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_chat: Option<i64>,
    /// K6: seconds a relayed prompt waits before it is denied.
    #[serde(default = "default_permission_timeout")]
    pub permission_timeout: u64,
    /// K7: the largest photo or document downloaded into the cache, in bytes.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
}

fn default_api() -> String {
    DEFAULT_API.into()
}

fn default_permission_timeout() -> u64 {
    pcmail_core::permission::DEFAULT_TIMEOUT_SECS
}

fn default_max_file_bytes() -> u64 {
    pcmail_core::telegram::DEFAULT_MAX_FILE_BYTES
}

/// Where downloaded photos and documents are kept (K7), 0700 like the rest of the home.
pub fn files_dir(home: &Path) -> PathBuf {
    home.join("telegram-files")
}

impl std::fmt::Debug for BotConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BotConfig")
            .field("token", &"<hidden>")
            .field("api", &self.api)
            .field("owner_chat", &self.owner_chat)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TelegramError {
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Bot(#[from] BotError),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

/// The bot: `PCMAIL_TELEGRAM_TOKEN` (and `PCMAIL_TELEGRAM_API`), else `$PCMAIL_HOME/telegram.json`;
/// `PCMAIL_TELEGRAM_OWNER_CHAT`, `PCMAIL_TELEGRAM_PERMISSION_TIMEOUT` (seconds) and
/// `PCMAIL_TELEGRAM_MAX_FILE_BYTES` override what either says.
pub fn load(home: &Path) -> Result<Option<BotConfig>, TelegramError> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let mut config = if let Some(token) = env("PCMAIL_TELEGRAM_TOKEN") {
        BotConfig {
            token: token.trim().into(),
            api: env("PCMAIL_TELEGRAM_API").unwrap_or_else(default_api),
            owner_chat: None,
            permission_timeout: default_permission_timeout(),
            max_file_bytes: default_max_file_bytes(),
        }
    } else {
        let path = home.join(CONFIG_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map_err(|e| TelegramError::Config { path, message: format!("not a valid Telegram config: {e}") })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(TelegramError::Config { path, message: e.to_string() }),
        }
    };
    let number = |name: &str| -> Result<Option<i64>, TelegramError> {
        env(name)
            .map(|v| {
                v.trim().parse::<i64>().map_err(|_| TelegramError::Config {
                    path: PathBuf::from(format!("${name}")),
                    message: format!("{v:?} is not a whole number; set it to a Telegram chat id or a count"),
                })
            })
            .transpose()
    };
    if let Some(chat) = number("PCMAIL_TELEGRAM_OWNER_CHAT")? {
        config.owner_chat = Some(chat);
    }
    if let Some(secs) = number("PCMAIL_TELEGRAM_PERMISSION_TIMEOUT")? {
        config.permission_timeout = secs.clamp(1, 86_400) as u64;
    }
    if let Some(bytes) = number("PCMAIL_TELEGRAM_MAX_FILE_BYTES")? {
        config.max_file_bytes = bytes.max(0) as u64;
    }
    Ok(Some(config))
}

/// Saves the bot's config, private to this user (0600).
pub fn save(home: &Path, config: &BotConfig) -> Result<PathBuf, TelegramError> {
    let path = home.join(CONFIG_FILE);
    let text = serde_json::to_string_pretty(config).unwrap_or_default();
    write_private(&path, &text).map_err(|e| TelegramError::Config { path: path.clone(), message: e.to_string() })?;
    Ok(path)
}

/// The Bot API, on one bot. Errors name the method and Telegram's description, never the URL
/// (which holds the token).
#[derive(Clone)]
pub struct Bot {
    http: reqwest::Client,
    base: String,
    /// Where files are downloaded from: `<api>/file/bot<token>`.
    files: String,
    /// K7: the largest file downloaded.
    pub max_file_bytes: u64,
}

impl Bot {
    pub fn new(config: &BotConfig) -> Result<Bot, BotError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(LONG_POLL_SECS + 15))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BotError::Unreachable(e.without_url().to_string()))?;
        let api = config.api.trim_end_matches('/');
        Ok(Bot {
            http,
            base: format!("{api}/bot{}", config.token),
            files: format!("{api}/file/bot{}", config.token),
            max_file_bytes: config.max_file_bytes,
        })
    }

    async fn call<T: DeserializeOwned>(&self, method: &str, body: serde_json::Value) -> Result<T, BotError> {
        let unreachable = |e: reqwest::Error| BotError::Unreachable(format!("{method}: {}", e.without_url()));
        let response =
            self.http.post(format!("{}/{method}", self.base)).json(&body).send().await.map_err(unreachable)?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(unreachable)?;
        let answer: Option<Answer<T>> = serde_json::from_slice(&bytes).ok();
        if let Some(e) = failure(status, answer.as_ref()) {
            return Err(e);
        }
        answer
            .and_then(|a| a.result)
            .ok_or_else(|| BotError::Unreachable(format!("{method}: an answer without a result")))
    }

    /// Who the bot is (`telegram login` checks the token with it).
    pub async fn get_me(&self) -> Result<serde_json::Value, BotError> {
        self.call("getMe", json!({})).await
    }

    /// I7: updates from `offset` on, waiting up to the long-poll time for one to come. The
    /// offset confirms every update below it.
    pub async fn get_updates(&self, offset: Option<i64>) -> Result<Vec<Update>, BotError> {
        let mut body = json!({"timeout": LONG_POLL_SECS, "allowed_updates": ["message", "edited_message"]});
        if let Some(o) = offset {
            body["offset"] = json!(o);
        }
        self.call("getUpdates", body).await
    }

    /// I8: a reply to exactly one message; answers the sent message's id.
    pub async fn reply(&self, chat: &str, reply_to: &str, text: &str) -> Result<i64, BotError> {
        let body = json!({
            "chat_id": chat,
            "text": text,
            "reply_parameters": {"message_id": numeric(reply_to)?, "allow_sending_without_reply": false},
        });
        let sent: serde_json::Value = self.call("sendMessage", body).await?;
        Ok(sent["message_id"].as_i64().unwrap_or_default())
    }

    /// K6: a message of pcmail's own to `chat` (a permission prompt, its outcome).
    pub async fn say(&self, chat: i64, text: &str) -> Result<i64, BotError> {
        let sent: serde_json::Value = self.call("sendMessage", json!({"chat_id": chat, "text": text})).await?;
        Ok(sent["message_id"].as_i64().unwrap_or_default())
    }

    /// K7: a message's file, at most `bound` bytes: `getFile`, then the download, stopped as
    /// soon as it passes the bound.
    pub async fn download(&self, file_id: &str, bound: u64) -> Result<Result<Vec<u8>, Kept>, BotError> {
        let file: File = self.call("getFile", json!({"file_id": file_id})).await?;
        if let Err(over) = within_bound(file.file_size, bound) {
            return Ok(Err(over));
        }
        let Some(path) = file.file_path.filter(|p| !p.is_empty()) else {
            return Ok(Err(Kept::Failed("Telegram gave no file_path for it".into())));
        };
        let unreachable = |e: reqwest::Error| BotError::Unreachable(format!("file download: {}", e.without_url()));
        let mut response = self.http.get(format!("{}/{path}", self.files)).send().await.map_err(unreachable)?;
        let status = response.status().as_u16();
        if status >= 500 {
            return Err(BotError::Unreachable(format!("file download: HTTP {status}")));
        }
        if status >= 400 {
            return Ok(Err(Kept::Failed(format!("the file download answered HTTP {status}"))));
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > bound {
                return Ok(Err(Kept::TooLarge { size: bytes.len() as u64, bound }));
            }
        }
        Ok(Ok(bytes))
    }

    /// I8: a reaction on one message (it says "seen", never "answered").
    pub async fn react(&self, chat: &str, message: &str, emoji: &str) -> Result<(), BotError> {
        let body =
            json!({"chat_id": chat, "message_id": numeric(message)?, "reaction": [{"type": "emoji", "emoji": emoji}]});
        self.call::<bool>("setMessageReaction", body).await.map(|_| ())
    }
}

fn numeric(id: &str) -> Result<i64, BotError> {
    id.parse().map_err(|_| BotError::Refused(format!("{id:?} is not a Telegram message id")))
}

/// Runs the bot's poller until `shutdown`, when this PC has a bot and this process wins the
/// lock; `recorded` hears of every message recorded (the MCP server pushes it at once).
pub async fn run(
    home: PathBuf,
    client: Option<Client>,
    recorded: std::sync::Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = match load(&home) {
        Ok(Some(c)) => c,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(error = %e, "the Telegram poller does not start");
            return;
        }
    };
    let bot = match Bot::new(&config) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "the Telegram poller does not start");
            return;
        }
    };
    // One poller per bot on this PC: whoever holds the lock (the agent, or an MCP server).
    let lock = loop {
        match try_lock(&home) {
            Ok(Some(file)) => break file,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "cannot take the Telegram poller lock"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = shutdown.changed() => return,
        }
    };
    let mut attempt = 0u32;
    while !*shutdown.borrow() {
        let pause = match poll_once(&home, &bot, client.as_ref()).await {
            Ok(n) => {
                attempt = 0;
                if n > 0 {
                    recorded.notify_one();
                }
                Duration::ZERO
            }
            Err(TelegramError::Bot(e)) => {
                attempt += 1;
                let wait = wait_after(&e, attempt);
                trouble(&home, client.as_ref(), Some(&e)).await;
                tracing::warn!(error = %e, retry_in = ?wait, "Telegram poll failed");
                wait
            }
            Err(e) => {
                attempt += 1;
                tracing::warn!(error = %e, "Telegram poll failed");
                Duration::from_secs(1 << attempt.min(6))
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => {}
        }
    }
    drop(lock);
}

/// One `getUpdates` and what it brought: each message recorded, then its offset confirmed;
/// answers how many were recorded.
pub async fn poll_once(home: &Path, bot: &Bot, client: Option<&Client>) -> Result<usize, TelegramError> {
    let offset: Option<i64> = Cache::open(home, POLLER_BUSY)?.state(OFFSET)?.and_then(|o| o.parse().ok());
    let updates = bot.get_updates(offset).await?;
    let mut cache = Cache::open(home, POLLER_BUSY)?;
    let policy = cache.intent_policy()?;
    let me = cache.state("machine")?.unwrap_or_else(|| "this-pc".into());
    let (mut recorded, mut dropped) = (0, 0u64);
    for update in &updates {
        match intake(update, &policy) {
            // K6: the owner's answer to a prompt is a verdict, not a message to answer.
            Intake::Record(msg) if answer_prompt(&mut cache, &msg)? => {}
            Intake::Record(mut msg) => {
                let now = crate::now();
                let key = pcmail_core::intent::external_key(&msg.channel, &msg.chat, &msg.message);
                if cache.intent_by_key(&key)?.is_none()
                    && let Some(note) = keep_file(home, bot, update, &msg).await?
                {
                    msg.text = if msg.text.starts_with('[') { note } else { format!("{}\n{note}", msg.text) };
                }
                let mail = intent_mail(&msg, &me, now, Dur::from_hours(72));
                let message = serde_json::to_value(&msg).unwrap_or_default();
                // Recorded (FULL sync) before the offset below moves past it (I7).
                if cache.record_intent(&mail, &message, now)? {
                    recorded += 1;
                }
            }
            Intake::Edit(msg) => recorded += record_edit(&mut cache, &msg, &me)?,
            Intake::Dropped { chat } => {
                tracing::info!(chat, "Telegram message from a chat outside allowedChats dropped");
                dropped += 1;
            }
            Intake::Skip => {}
        }
        cache.set_state(&[(OFFSET, confirm(update).to_string())])?;
    }
    if dropped > 0 {
        let before: u64 = cache.state(DROPPED)?.and_then(|d| d.parse().ok()).unwrap_or(0);
        cache.set_state(&[(DROPPED, (before + dropped).to_string())])?;
    }
    drop(cache);
    trouble(home, client, None).await;
    if let Some(client) = client
        && recorded > 0
        && let Err(e) = crate::sync::flush(client, home).await
    {
        tracing::info!(error = %e, "recorded; the server will be told at the next poll");
    }
    Ok(recorded)
}

/// K8: an event on its intent (here its text history; on the server an event, told through the
/// queue); the intent itself if the original was never recorded. Answers 1 when the session
/// has something new to hear.
fn record_edit(cache: &mut Cache, msg: &pcmail_core::intent::InboundMessage, me: &str) -> Result<usize, TelegramError> {
    let now = crate::now();
    let mail = intent_mail(msg, me, now, Dur::from_hours(72));
    let key = mail.external_key.clone().unwrap_or_default();
    let before = cache.get(&mail.id)?.map(|m| m.body);
    let message = serde_json::to_value(msg).unwrap_or_default();
    Ok(match cache.edit_intent(&key, &msg.text)? {
        Some(m) if before.as_deref() != Some(m.body.as_str()) => {
            cache.queue_intent_edit(&key, &message, now)?;
            1
        }
        Some(_) => 0,
        None => usize::from(cache.record_intent(&mail, &message, now)?),
    })
}

/// K6: the cache key of a prompt waiting for its answer, and of the verdict given.
pub const PROMPT_PREFIX: &str = "permission:";
pub const VERDICT_PREFIX: &str = "permission-verdict:";

/// K6/T13: when `msg` is the answer to a prompt asked in its chat, keeps the verdict for the
/// session that asked (which tells Claude Code) and answers true; an answer from any other
/// chat, or to no prompt, is an ordinary message.
fn answer_prompt(cache: &mut Cache, msg: &pcmail_core::intent::InboundMessage) -> Result<bool, TelegramError> {
    use pcmail_core::permission::{Pending, parse_answer, verdict};
    if parse_answer(&msg.text).is_none() {
        return Ok(false);
    }
    let pending: Vec<Pending> = cache
        .states_with_prefix(PROMPT_PREFIX)?
        .into_iter()
        .filter_map(|(_, v)| serde_json::from_str::<Pending>(&v).ok())
        // A prompt past its deadline (its session gone before it could deny) takes no answer.
        .filter(|p| p.deadline > crate::now())
        .collect();
    let Ok(chat) = msg.chat.parse::<i64>() else { return Ok(false) };
    let Some((p, behavior)) = verdict(&pending, chat, &msg.text) else { return Ok(false) };
    cache.set_state(&[(&format!("{VERDICT_PREFIX}{}", p.request_id), behavior.as_str().to_string())])?;
    Ok(true)
}

/// K7: downloads the file `update`'s message carries into the cache's files (0600), within
/// the bot's bound; answers the note its intent's text gets. A Telegram that cannot be
/// reached is an error (the update is read again); a refusal is said in the note.
async fn keep_file(
    home: &Path,
    bot: &Bot,
    update: &Update,
    msg: &pcmail_core::intent::InboundMessage,
) -> Result<Option<String>, TelegramError> {
    let Some(a) = attachment(update) else { return Ok(None) };
    let (chat, message) = (msg.chat.parse::<i64>().unwrap_or_default(), msg.message.parse::<i64>().unwrap_or_default());
    let kept = match within_bound(a.size, bot.max_file_bytes) {
        Err(over) => over,
        Ok(()) => match bot.download(&a.file_id, bot.max_file_bytes).await {
            Ok(Ok(bytes)) => {
                let path = files_dir(home).join(cached_name(chat, message, &a));
                write_private(&path, &bytes).map_err(|e| TelegramError::Config { path, message: e.to_string() })?;
                Kept::Saved(bytes.len() as u64)
            }
            Ok(Err(kept)) => kept,
            Err(e @ BotError::Refused(_)) => Kept::Failed(e.to_string()),
            Err(e) => return Err(e.into()),
        },
    };
    Ok(Some(file_note(&a, chat, message, &kept)))
}

/// Tells the server how the poller is (I9): a conflict raises the `channel-conflict` alert, the
/// next good poll resolves it, and drops are counted there. Said on a change only, and kept for
/// later when the server is away.
async fn trouble(home: &Path, client: Option<&Client>, error: Option<&BotError>) {
    let Ok(mut cache) = Cache::open(home, POLLER_BUSY) else { return };
    let conflict = match error {
        Some(BotError::Conflict(d)) => Some(d.clone()),
        Some(_) => return,
        None => None,
    };
    let said = cache.state(TROUBLE).ok().flatten().unwrap_or_default();
    let now_state = conflict.clone().unwrap_or_default();
    let dropped: u64 = cache.state(DROPPED).ok().flatten().and_then(|d| d.parse().ok()).unwrap_or(0);
    if said == now_state && dropped == 0 {
        return;
    }
    if let Some(e) = &conflict {
        tracing::error!("{}", BotError::Conflict(e.clone()));
    }
    let Some(client) = client else { return };
    let report = pcmail_core::api::PollerReport { channel: pcmail_core::telegram::CHANNEL.into(), conflict, dropped };
    match client.post::<_, serde_json::Value>("/api/v1/intents/poller", &report).await {
        Ok(_) => {
            let _ = cache.set_state(&[(TROUBLE, now_state), (DROPPED, "0".into())]);
        }
        Err(e) => tracing::info!(error = %e, "the poller's state will be told to the server later"),
    }
}

fn try_lock(home: &Path) -> std::io::Result<Option<std::fs::File>> {
    pcmail_store::private::make_private(home)?;
    let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(home.join(LOCK_FILE))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

/// X5: whether a process on this PC polls the bot now (it holds the lock; the kernel drops a
/// dead holder's lock). Taking the lock to look releases it at once.
pub fn poller_running(home: &Path) -> std::io::Result<bool> {
    Ok(try_lock(home)?.is_none())
}

/// What `telegram status` shows (never the token).
pub fn status(home: &Path) -> Result<Vec<(&'static str, String)>, TelegramError> {
    let config = load(home)?;
    let cache = Cache::open(home, POLLER_BUSY)?;
    let polling = match try_lock(home) {
        Ok(Some(_)) => "no process polls now",
        Ok(None) => "a process on this PC polls",
        Err(_) => "unknown",
    };
    Ok(vec![
        (
            "bot",
            config.map_or_else(
                || "none (run `pcmail-ctl telegram login`)".into(),
                |c| format!("configured, API {}", c.api),
            ),
        ),
        ("poller", polling.into()),
        ("next offset", cache.state(OFFSET)?.unwrap_or_else(|| "none yet".into())),
        ("conflict", cache.state(TROUBLE)?.filter(|t| !t.is_empty()).unwrap_or_else(|| "none".into())),
        ("dropped, not yet reported", cache.state(DROPPED)?.unwrap_or_else(|| "0".into())),
        ("open intents", cache.open_intents()?.len().to_string()),
    ])
}
