//! DESIGN I7–I9 end to end: pcmail owns the Telegram channel. A local stand-in for the Bot API
//! (`botapi.rs`) plays Telegram; the agent or the MCP server polls it, records every message
//! before confirming it, pushes it into the session, and answers it with the two tools.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::botapi::{BotApi, TOKEN};
use crate::harness::*;
use crate::mcp::McpClient;

/// The office roster with an IntentPolicy that reminds and escalates within seconds, whose
/// recorders are the desk and the laptop, and (when given) chats outside which are dropped.
#[test]
fn t13_replies_and_reactions_go_only_to_allowed_chats_about_recorded_messages() {
    let api = BotApi::start();
    let (s, _dir) = server("  allowedChats: [-1001]\n");
    let (_desk, home) = bot_pc(&s, "desk", &api);
    let mut mcp = McpClient::start(&home, "secretary", true);
    for n in 0..11 {
        api.message(-1001, "kim", &format!("A {n}"));
    }
    eventually(20, "11 intents", || (intents(&home).len() == 11).then_some(()));
    // The intent policy reaches the PC with its first poll.
    eventually(20, "the policy in the PC's cache", || {
        let db = rusqlite::Connection::open(home.join("cache.db")).ok()?;
        let policy: String =
            db.query_row("SELECT value FROM state WHERE key = 'intent_policy'", [], |r| r.get(0)).ok()?;
        policy.contains("-1001").then_some(())
    });
    for (tool, args) in [
        ("telegram_reply", json!({"chat_id": -100777, "reply_to": 1, "text": "x"})),
        ("telegram_react", json!({"chat_id": "-100777", "message_id": 1, "emoji": "👀"})),
    ] {
        let (text, is_error) = mcp.call(tool, args);
        assert!(is_error && text.contains("allowedChats (T13)") && text.contains("nothing was sent"), "{tool}: {text}");
    }
    let (text, is_error) = mcp.call("telegram_react", json!({"chat_id": -1001, "message_id": 500, "emoji": "👀"}));
    assert!(is_error && text.contains("never recorded"), "{text}");
    assert!(api.sent().is_empty() && api.reactions().is_empty(), "nothing went out");
    // Ids compare as integers: "011" is message 11, and its intent is the one closed.
    let done = mcp.ok("telegram_reply", json!({"chat_id": "-1001", "reply_to": "011", "text": "了解"}));
    assert!(done.contains("message 11; its intent is done"), "{done}");
    assert_eq!(state_of(&home, "telegram--1001-11"), "done");
    assert_eq!(api.sent()[0]["reply_parameters"]["message_id"].as_i64(), Some(11));
}

pub(crate) fn server(allowed: &str) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    std::fs::write(
        m.join("intents.yaml"),
        format!(
            "apiVersion: pcmail/v1\nkind: IntentPolicy\nmetadata: {{name: telegram}}\nspec:\n  remindAfter: 1s\n  remindEvery: 1s\n  escalateAfter: 2s\n  recorders: [desk, laptop]\n{allowed}"
        ),
    )
    .expect("manifests");
    (Server::start_logged_opts(Some(m), &["--resync", "300ms"]), dir)
}

/// A PC logged in as `machine` that owns the stand-in's bot; answers its token and home.
pub(crate) fn bot_pc(s: &Server, machine: &str, api: &BotApi) -> (String, PathBuf) {
    let token = s.token(machine);
    ok(s.ctl(&token, &["login", "--server", &s.url, "--token", &token]));
    let home = s.home_of(&token);
    let file = s.dir.path().join(format!("{machine}.bot"));
    std::fs::write(&file, format!("{TOKEN}\n")).expect("token file");
    let out = pc(&home, &["telegram", "login", "--token-file", &file.display().to_string(), "--api", &api.url]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("@pcmail_test_bot") && !stdout(&out).contains(TOKEN), "{}", stdout(&out));
    (token, home)
}

/// A CLI verb on the PC whose home is `home`, with only its own config.
pub(crate) fn pc(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("PCMAIL_HOME", home)
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .env_remove("PCMAIL_TELEGRAM_TOKEN")
        .output()
        .expect("pcmail-ctl")
}

/// `pcmail-ctl agent` on that PC, its log in `home/agent.log`.
pub(crate) fn agent(home: &Path) -> Child {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(home.join("agent.log")).expect("log");
    Command::new(BIN)
        .args(["agent", "--wait", "2s"])
        .env("PCMAIL_HOME", home)
        .env("PCMAIL_LOG", "info")
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("agent")
}

/// (key, state) of every intent in a PC's cache, as stored.
pub(crate) fn intents(home: &Path) -> Vec<(String, String)> {
    let Ok(db) = rusqlite::Connection::open(home.join("cache.db")) else { return vec![] };
    let Ok(mut stmt) = db.prepare("SELECT external_key, state FROM inbox WHERE kind = 'intent' ORDER BY external_key")
    else {
        return vec![];
    };
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).map(|rows| rows.flatten().collect()).unwrap_or_default()
}

fn on_server(s: &Server, desk: &str) -> Vec<Value> {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let inbox: Value = rt.block_on(async {
        let url = format!("{}/api/v1/mail?box=inbox&all=true&limit=500", s.url);
        reqwest::Client::new().get(url).bearer_auth(desk).send().await.expect("inbox").json().await.expect("json")
    });
    inbox.as_array().into_iter().flatten().filter(|m| m["kind"] == "intent").cloned().collect()
}

pub(crate) fn state_of(home: &Path, key: &str) -> String {
    intents(home).into_iter().find(|(k, _)| k == key).map(|(_, s)| s).unwrap_or_default()
}

#[test]
fn i7_i8_50_messages_in_3_chats_are_each_an_intent_once_and_pushed_once_with_chat_and_message() {
    let api = BotApi::start();
    let (s, _dir) = server("");
    let (desk, home) = bot_pc(&s, "desk", &api);
    // Telegram first asks to slow down: the poller waits its retry_after and goes on.
    let slow_down = json!({"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 1",
        "parameters": {"retry_after": 1}});
    api.script("getUpdates", vec![(429, slow_down)]);
    // No agent: the MCP server polls the bot itself (it holds the PC's poller lock).
    let mut mcp = McpClient::start(&home, "secretary", true);
    let chats = [-1_001_234, 2002, 3003];
    let mut sent = BTreeSet::new();
    for n in 0..50 {
        let chat = chats[n % 3];
        let id = api.message(chat, "kim", &format!("お願い {n}"));
        sent.insert((chat.to_string(), id.to_string()));
    }
    assert!(sent.iter().filter(|(_, m)| m == "1").count() == 3, "message ids repeat across chats");
    let recorded = eventually(20, "50 intents in the cache", || {
        let i = intents(&home);
        (i.len() == 50).then_some(i)
    });
    let keys: BTreeSet<String> = recorded.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), 50, "each message once");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while mcp.pushes.len() < 50 && std::time::Instant::now() < deadline {
        mcp.pump(Duration::from_millis(200), None);
    }
    mcp.pump(Duration::from_millis(500), None);
    let pushed: Vec<(String, String)> = mcp
        .pushes
        .iter()
        .map(|(_, p)| {
            let meta = &p["params"]["meta"];
            (
                meta["chat_id"].as_str().unwrap_or_default().to_string(),
                meta["message_id"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(pushed.len(), 50, "each pushed once: {pushed:?}");
    assert_eq!(pushed.into_iter().collect::<BTreeSet<_>>(), sent);
    let first = &mcp.pushes[0].1["params"];
    assert_eq!(first["meta"]["user"], "@kim");
    assert!(first["content"].as_str().is_some_and(|c| c.starts_with("お願い")), "{first}");
    eventually(20, "50 intents on the server", || (on_server(&s, &desk).len() == 50).then_some(()));
}

#[test]
fn i7_the_agent_killed_5_times_while_200_messages_arrive_records_each_exactly_once() {
    let api = BotApi::start();
    let (s, _dir) = server("");
    let (desk, home) = bot_pc(&s, "desk", &api);
    api.check_cache(home.join("cache.db"));
    // Sent while no agent runs: Telegram keeps them, and the agent records them when it starts.
    for n in 0..20 {
        api.message(-100, "kim", &format!("before {n}"));
    }
    let mut running = agent(&home);
    let seed = std::process::id() as u64;
    println!("kill schedule seed {seed}");
    let mut rng = seed;
    let mut next = || {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        rng >> 33
    };
    let kill_at: BTreeSet<u64> = (0..5).map(|_| 20 + next() % 170).collect();
    for n in 20..200u64 {
        api.message(if n % 2 == 0 { -100 } else { 4242 }, "kim", &format!("during {n}"));
        std::thread::sleep(Duration::from_millis(15));
        if kill_at.contains(&n) {
            let _ = running.kill();
            let _ = running.wait();
            std::thread::sleep(Duration::from_millis(10 + next() % 200));
            running = agent(&home);
        }
    }
    let recorded = eventually(30, "every message recorded", || {
        let i = intents(&home);
        (i.len() == 200).then_some(i)
    });
    let keys: BTreeSet<&str> = recorded.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 200, "each exactly once");
    assert_eq!(api.violations(), Vec::<String>::new(), "the offset never passed an unrecorded update");
    eventually(30, "200 intents on the server", || (on_server(&s, &desk).len() == 200).then_some(()));
    let _ = running.kill();
    let _ = running.wait();
}

#[test]
fn i8_a_reply_closes_exactly_its_chat_and_message_a_refused_one_nothing_and_a_reaction_only_sees() {
    let api = BotApi::start();
    let (s, _dir) = server("");
    let (desk, home) = bot_pc(&s, "desk", &api);
    let mut mcp = McpClient::start(&home, "secretary", true);
    let (a, b) = (-1_001_111, 2222);
    for n in 0..7 {
        api.message(a, "kim", &format!("A {n}"));
        api.message(b, "lee", &format!("B {n}"));
    }
    eventually(20, "14 intents", || (intents(&home).len() == 14).then_some(()));
    let key = |chat: i64, m: i64| format!("telegram-{chat}-{m}");

    let done = mcp.ok("telegram_reply", json!({"chat_id": a.to_string(), "reply_to": 7, "text": "了解しました"}));
    assert!(done.contains("its intent is done"), "{done}");
    assert_eq!((state_of(&home, &key(a, 7)), state_of(&home, &key(b, 7)).as_str() != "done"), ("done".into(), true));
    let sent = api.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0]["chat_id"].as_str(), sent[0]["reply_parameters"]["message_id"].as_i64()),
        (Some(&*a.to_string()), Some(7))
    );

    api.script(
        "sendMessage",
        vec![(403, json!({"ok": false, "error_code": 403, "description": "Forbidden: bot was blocked by the user"}))],
    );
    let (refused, is_error) = mcp.call("telegram_reply", json!({"chat_id": b, "reply_to": "7", "text": "x"}));
    assert!(
        is_error && refused.contains("bot was blocked") && refused.contains("nothing was sent or closed"),
        "{refused}"
    );
    assert_ne!(state_of(&home, &key(b, 7)), "done", "a refused reply closes nothing");
    let (unknown, is_error) = mcp.call("telegram_reply", json!({"chat_id": b, "reply_to": 99, "text": "x"}));
    assert!(is_error && unknown.contains("never recorded") && unknown.contains("nothing was sent"), "T13: {unknown}");
    assert_eq!(api.sent().len(), 1, "nothing more went out");

    let seen = mcp.ok("telegram_react", json!({"chat_id": b, "message_id": 7, "emoji": "👀"}));
    assert!(seen.contains("its intent is seen"), "{seen}");
    assert_eq!(state_of(&home, &key(b, 7)), "seen", "a reaction never closes");
    assert_eq!(api.reactions()[0]["reaction"][0]["emoji"], "👀");

    // I3: the ones left are reminded after a tool call; I4: escalated on the server.
    let reminded = eventually(10, "a reminder after remindAfter", || {
        let input = json!({"session_id": "secretary", "tool_name": "Bash", "tool_input": {}});
        let text = stdout(&s.hook(&desk, "post-tool-use", input));
        text.contains(&format!("chat_id={b} reply_to=7")).then_some(text)
    });
    assert!(!reminded.contains(&format!("chat_id={a} reply_to=7 ")), "the answered one is not reminded: {reminded}");
    let server_done = eventually(20, "the answered intent done on the server", || {
        on_server(&s, &desk).into_iter().find(|m| m["externalKey"] == key(a, 7)).filter(|m| m["state"] == "done")
    });
    let escalated = eventually(20, "the others escalated", || {
        let alerts = json(s.admin(&["alerts", "-o", "json"]));
        let unanswered: Vec<Value> = alerts["items"]
            .as_array()?
            .iter()
            .filter(|x| x["kind"] == "intent-unanswered" && x["state"] == "firing")
            .cloned()
            .collect();
        (unanswered.len() == 13).then_some(unanswered)
    });
    assert!(escalated.iter().all(|x| x["subject"] != server_done["id"]), "the answered one is not escalated");
}

#[test]
fn i9_a_second_poller_gets_409_said_and_alerted_once_a_foreign_chat_is_dropped_and_counted_the_token_kept_secret() {
    let api = BotApi::start();
    let (s, _dir) = server("  allowedChats: [-100]\n");
    let (_, desk_home) = bot_pc(&s, "desk", &api);
    let (_, laptop_home) = bot_pc(&s, "laptop", &api);
    let mut desk_agent = agent(&desk_home);
    std::thread::sleep(Duration::from_millis(500));
    let mut laptop_agent = agent(&laptop_home);
    let logs = || {
        let read = |h: &PathBuf| std::fs::read_to_string(h.join("agent.log")).unwrap_or_default();
        format!("desk:\n{}\nlaptop:\n{}", read(&desk_home), read(&laptop_home))
    };
    let started = std::time::Instant::now();
    let alert = loop {
        let alerts = json(s.admin(&["alerts", "-o", "json"]));
        let found = alerts["items"]
            .as_array()
            .and_then(|a| a.iter().find(|a| a["kind"] == "channel-conflict" && a["state"] == "firing").cloned());
        if let Some(a) = found {
            break a;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no channel-conflict alert: {alerts}\n{}", logs());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(alert["summary"].as_str().is_some_and(|t| t.contains("not the only one reading the bot")), "{alert}");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        laptop_agent.try_wait().expect("wait").is_none() && desk_agent.try_wait().expect("wait").is_none(),
        "no crash"
    );
    assert!(api.conflicts() <= 3, "waited out, not spun on: {} conflicts", api.conflicts());
    let logs = logs();
    assert!(logs.contains("another poller reads this bot's updates"), "a clear error: {logs}");

    api.message(-100, "kim", "allowed");
    api.message(555, "stranger", "not allowed");
    eventually(40, "the allowed message recorded", || {
        let recorded: Vec<_> = [&desk_home, &laptop_home].iter().flat_map(|h| intents(h)).collect();
        recorded.iter().any(|(k, _)| k == "telegram--100-1").then_some(())
    });
    let dropped = eventually(40, "the drop counted on the server", || {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        let body = rt.block_on(async { reqwest::get(format!("{}/metrics", s.url)).await.ok()?.text().await.ok() })?;
        let line =
            body.lines().find(|l| l.starts_with("pcmail_intents_dropped_total{channel=\"telegram\"}"))?.to_string();
        (line.ends_with(" 1")).then_some(body)
    });
    let recorded: Vec<_> = [&desk_home, &laptop_home].iter().flat_map(|h| intents(h)).collect();
    assert!(recorded.iter().all(|(k, _)| !k.starts_with("telegram-555-")), "a foreign chat is not recorded");

    // The token is in its 0600 file and nowhere else.
    for home in [&desk_home, &laptop_home] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(home.join("telegram.json")).expect("config").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        for f in ["cache.db", "cache.db-wal", "agent.log", "config.json"] {
            let bytes = std::fs::read(home.join(f)).unwrap_or_default();
            assert!(!String::from_utf8_lossy(&bytes).contains(TOKEN), "the token leaked into {f}");
        }
    }
    assert!(!dropped.contains(TOKEN) && !s.log().contains(TOKEN), "not in /metrics, not in serve's log");
    for f in ["pcmail.db", "pcmail.db-wal"] {
        let bytes = std::fs::read(s.dir.path().join("data").join(f)).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains(TOKEN), "the token reached the server's {f}");
    }
    let status = pc(&desk_home, &["telegram", "status"]);
    assert!(stdout(&status).contains("next offset") && !stdout(&status).contains(TOKEN), "{}", stdout(&status));
    for mut a in [desk_agent, laptop_agent] {
        let _ = a.kill();
        let _ = a.wait();
    }
}

#[test]
fn k8_on_the_server_an_edit_is_an_event_on_its_intent_never_a_second_intent_nor_a_conflict() {
    let api = BotApi::start();
    let (s, _dir) = server("");
    let (desk, home) = bot_pc(&s, "desk", &api);
    let mut poller = agent(&home);
    let id = api.message(-1001, "kim", "stop prod");
    let first = eventually(20, "the intent on the server", || on_server(&s, &desk).into_iter().next());
    let mail = first["id"].as_str().expect("id").to_string();
    api.edit(-1001, id, "stop staging");
    let events = eventually(20, "the edit as an event on the intent", || {
        let status = json(s.ctl(&desk, &["status", &mail, "-o", "json"]));
        let events = status["events"].as_array().cloned().unwrap_or_default();
        events.iter().any(|e| e["reason"] == "IntentEdited").then_some(events)
    });
    let edit = events.iter().find(|e| e["reason"] == "IntentEdited").expect("the edit");
    assert!(edit["message"].as_str().is_some_and(|m| m.ends_with("now: stop staging")), "{edit}");
    assert!(!events.iter().any(|e| e["reason"] == "IntentConflict"), "K8: an edit is no T4 conflict: {events:?}");
    let on = on_server(&s, &desk);
    assert_eq!(on.len(), 1, "K8: never a second intent: {on:?}");
    assert_eq!(on[0]["body"], "stop prod", "the intent keeps the text it was recorded with; the edit is its event");
    let _ = poller.kill();
    let _ = poller.wait();
}
