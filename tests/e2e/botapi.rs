//! A local stand-in for Telegram's Bot API (this machine cannot reach Telegram), speaking its
//! documented wire format: `POST /bot<token>/<method>` with a JSON body; every answer
//! `{ok, result}` or `{ok: false, error_code, description, parameters: {retry_after}}`.
//! `getUpdates` long-polls up to its `timeout` and forgets every update below the `offset`; a
//! new `getUpdates` ends the one still waiting with 409, as Telegram does when a second poller
//! (or a restarted one) asks;
//! `sendMessage` refuses a reply to a message it never delivered (400). Photos and documents
//! (K7) are served as Telegram serves them: the message names a `file_id`, `getFile` answers
//! its `file_path`, and `GET /file/bot<token>/<file_path>` its bytes. It can check, at each
//! `getUpdates`, that every update its offset confirms is already in a PC's cache (I7).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};

pub const TOKEN: &str = "7000001:AAE-test-secret-token-not-for-logs";

#[derive(Default)]
struct Inner {
    /// Every update ever queued, by id.
    updates: Vec<Value>,
    next_update: i64,
    next_message: HashMap<i64, i64>,
    /// Messages delivered, as (chat, message id): a reply may name only these.
    delivered: BTreeSet<(i64, i64)>,
    /// The lowest offset a `getUpdates` has confirmed.
    confirmed: i64,
    /// The latest `getUpdates`; an older one still waiting is ended with 409.
    generation: u64,
    conflicts: usize,
    sent: Vec<Value>,
    reactions: Vec<Value>,
    /// K7: files by file_id, and how often each was downloaded.
    files: HashMap<String, Vec<u8>>,
    downloads: usize,
    /// Answers to give the next calls instead of the real one: (status, body).
    /// Scripted answers by method, taken last first.
    script: std::collections::BTreeMap<String, Vec<(u16, Value)>>,
    /// A PC cache to check at each `getUpdates` (I7), and what the checks found wrong.
    cache: Option<PathBuf>,
    violations: Vec<String>,
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    arrived: tokio::sync::Notify,
}

pub struct BotApi {
    pub url: String,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

impl BotApi {
    pub fn start() -> BotApi {
        let shared = Arc::new(Shared::default());
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new()
            .route("/{bot}/{method}", axum::routing::post(call))
            .route("/file/{bot}/{*path}", axum::routing::get(download))
            .with_state(shared.clone());
        runtime.spawn(async move { axum::serve(listener, app).await });
        BotApi { url, shared, _runtime: runtime }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.shared.inner.lock().expect("lock"))
    }

    /// Someone writes `text` in `chat`: a new update; answers the message id (per chat, from 1).
    pub fn message(&self, chat: i64, user: &str, text: &str) -> i64 {
        self.post(chat, user, json!({"text": text}))
    }

    /// K7: someone sends a photo (`bytes`, in two sizes as Telegram makes them) with `caption`.
    pub fn photo(&self, chat: i64, user: &str, caption: &str, bytes: &[u8]) -> i64 {
        let n = self.with(|s| {
            let n = s.files.len();
            s.files.insert(format!("photo-{n}-small"), bytes[..bytes.len().min(8)].to_vec());
            s.files.insert(format!("photo-{n}"), bytes.to_vec());
            n
        });
        let sizes = json!([
            {"file_id": format!("photo-{n}-small"), "file_unique_id": format!("u{n}s"), "width": 90, "height": 90,
             "file_size": bytes.len().min(8)},
            {"file_id": format!("photo-{n}"), "file_unique_id": format!("u{n}"), "width": 800, "height": 600,
             "file_size": bytes.len()}
        ]);
        self.post(chat, user, json!({"photo": sizes, "caption": caption}))
    }

    /// K7: someone sends a file as a document.
    pub fn document(&self, chat: i64, user: &str, name: &str, caption: &str, bytes: &[u8]) -> i64 {
        let file_id = self.with(|s| {
            let id = format!("doc-{}", s.files.len());
            s.files.insert(id.clone(), bytes.to_vec());
            id
        });
        let doc = json!({"file_id": file_id, "file_unique_id": format!("u-{file_id}"), "file_name": name,
            "mime_type": "application/octet-stream", "file_size": bytes.len()});
        self.post(chat, user, json!({"document": doc, "caption": caption}))
    }

    /// How many files were downloaded.
    pub fn downloads(&self) -> usize {
        self.with(|s| s.downloads)
    }

    fn post(&self, chat: i64, user: &str, content: Value) -> i64 {
        let id = self.with(|s| {
            let id = {
                let n = s.next_message.entry(chat).or_insert(0);
                *n += 1;
                *n
            };
            s.next_update += 1;
            let mut update = json!({
                "update_id": 1000 + s.next_update,
                "message": {
                    "message_id": id, "date": 1_764_547_200,
                    "chat": {"id": chat, "type": if chat < 0 { "supergroup" } else { "private" }},
                    "from": {"id": 42, "is_bot": false, "first_name": user, "username": user},
                }
            });
            if let (Some(m), Value::Object(extra)) = (update["message"].as_object_mut(), content) {
                m.extend(extra);
            }
            s.updates.push(update);
            s.delivered.insert((chat, id));
            id
        });
        self.shared.arrived.notify_waiters();
        id
    }

    /// Someone edits their message `id` in `chat` to `text` (K8): an `edited_message` update.
    pub fn edit(&self, chat: i64, id: i64, text: &str) {
        self.with(|s| {
            s.next_update += 1;
            s.updates.push(json!({
                "update_id": 1000 + s.next_update,
                "edited_message": {
                    "message_id": id, "date": 1_764_547_200, "edit_date": 1_764_547_260,
                    "chat": {"id": chat, "type": if chat < 0 { "supergroup" } else { "private" }},
                    "from": {"id": 42, "is_bot": false, "first_name": "kim", "username": "kim"},
                    "text": text,
                }
            }));
        });
        self.shared.arrived.notify_waiters();
    }

    /// The next calls of `method` answer these instead (a poller's `getUpdates` running
    /// meanwhile never takes a `sendMessage`'s scripted answer).
    pub fn script(&self, method: &str, answers: Vec<(u16, Value)>) {
        self.with(|s| {
            s.script.insert(method.to_string(), answers);
        });
    }

    /// At each `getUpdates`, checks that every update its offset confirms is in this cache.
    pub fn check_cache(&self, db: PathBuf) {
        self.with(|s| s.cache = Some(db));
    }

    pub fn violations(&self) -> Vec<String> {
        self.with(|s| s.violations.clone())
    }

    pub fn sent(&self) -> Vec<Value> {
        self.with(|s| s.sent.clone())
    }

    pub fn reactions(&self) -> Vec<Value> {
        self.with(|s| s.reactions.clone())
    }

    pub fn conflicts(&self) -> usize {
        self.with(|s| s.conflicts)
    }
}

fn fail(status: u16, description: &str) -> (u16, Value) {
    (status, json!({"ok": false, "error_code": status, "description": description}))
}

fn answer((status, body): (u16, Value)) -> axum::response::Response {
    (StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), axum::Json(body)).into_response()
}

/// The keys of the intents in a PC's cache.
fn cached_keys(db: &PathBuf) -> BTreeSet<String> {
    let Ok(conn) = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return BTreeSet::new();
    };
    let Ok(mut stmt) = conn.prepare("SELECT external_key FROM inbox WHERE external_key IS NOT NULL") else {
        return BTreeSet::new();
    };
    stmt.query_map([], |r| r.get::<_, String>(0)).map(|rows| rows.flatten().collect()).unwrap_or_default()
}

async fn call(
    State(shared): State<Arc<Shared>>,
    Path((bot, method)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    if bot != format!("bot{TOKEN}") {
        return answer(fail(401, "Unauthorized"));
    }
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let scripted = shared.inner.lock().expect("lock").script.get_mut(&method).and_then(Vec::pop);
    if let Some(scripted) = scripted {
        return answer(scripted);
    }
    match method.as_str() {
        "getMe" => answer((
            200,
            json!({"ok": true, "result": {"id": 7_000_001, "is_bot": true, "username": "pcmail_test_bot"}}),
        )),
        "getUpdates" => get_updates(&shared, &body).await,
        "sendMessage" => {
            let mut s = shared.inner.lock().expect("lock");
            let chat = body["chat_id"].as_str().and_then(|c| c.parse().ok()).or(body["chat_id"].as_i64()).unwrap_or(0);
            let reply_to = body["reply_parameters"]["message_id"].as_i64();
            if reply_to.is_some_and(|m| !s.delivered.contains(&(chat, m))) {
                return answer(fail(400, "Bad Request: message to be replied not found"));
            }
            s.sent.push(body.clone());
            let id = 90_000 + s.sent.len() as i64;
            answer((200, json!({"ok": true, "result": {"message_id": id, "chat": {"id": chat}, "text": body["text"]}})))
        }
        "getFile" => {
            let s = shared.inner.lock().expect("lock");
            let id = body["file_id"].as_str().unwrap_or_default();
            match s.files.get(id) {
                Some(bytes) => answer((
                    200,
                    json!({"ok": true, "result": {"file_id": id, "file_unique_id": format!("u-{id}"),
                        "file_size": bytes.len(), "file_path": format!("files/{id}")}}),
                )),
                None => answer(fail(400, "Bad Request: invalid file_id")),
            }
        }
        "setMessageReaction" => {
            shared.inner.lock().expect("lock").reactions.push(body);
            answer((200, json!({"ok": true, "result": true})))
        }
        other => answer(fail(404, &format!("Not Found: method {other}"))),
    }
}

/// K7: a file's bytes, at the path `getFile` gave.
async fn download(
    State(shared): State<Arc<Shared>>,
    Path((bot, path)): Path<(String, String)>,
) -> axum::response::Response {
    let mut s = shared.inner.lock().expect("lock");
    let bytes = path.strip_prefix("files/").and_then(|id| s.files.get(id)).cloned();
    match bytes {
        Some(b) if bot == format!("bot{TOKEN}") => {
            s.downloads += 1;
            (StatusCode::OK, b).into_response()
        }
        Some(_) => StatusCode::UNAUTHORIZED.into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn get_updates(shared: &Arc<Shared>, body: &Value) -> axum::response::Response {
    let offset = body["offset"].as_i64();
    let timeout = Duration::from_secs(body["timeout"].as_u64().unwrap_or(0).min(50));
    // Which request this is, taken with the increment: two arriving at once are told apart.
    let me = {
        let mut s = shared.inner.lock().expect("lock");
        if let Some(o) = offset {
            s.confirmed = s.confirmed.max(o);
            if let Some(db) = s.cache.clone() {
                let keys = cached_keys(&db);
                let found: Vec<String> = s
                    .updates
                    .iter()
                    .filter(|u| u["update_id"].as_i64().unwrap_or(0) < o)
                    .filter_map(|u| {
                        let key = format!("telegram-{}-{}", u["message"]["chat"]["id"], u["message"]["message_id"]);
                        (!keys.contains(&key)).then(|| {
                            format!("offset {o} confirmed update {} before {key} was recorded", u["update_id"])
                        })
                    })
                    .collect();
                s.violations.extend(found);
            }
        }
        s.generation += 1;
        s.generation
    };
    shared.arrived.notify_waiters();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let waiting = shared.arrived.notified();
        let pending: Vec<Value> = {
            let mut s = shared.inner.lock().expect("lock");
            if s.generation != me {
                s.conflicts += 1;
                return answer(fail(
                    409,
                    "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                ));
            }
            s.updates
                .iter()
                .filter(|u| u["update_id"].as_i64().unwrap_or(0) >= s.confirmed)
                .take(100)
                .cloned()
                .collect()
        };
        if !pending.is_empty() || tokio::time::Instant::now() >= deadline {
            return answer((200, json!({"ok": true, "result": pending})));
        }
        let _ = tokio::time::timeout_at(deadline, waiting).await;
    }
}
