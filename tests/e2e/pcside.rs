//! DESIGN §5–6 end to end: the agent, the hooks and intents against a real `serve`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

fn context(out: &std::process::Output) -> String {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["hookSpecificOutput"]["additionalContext"].as_str().unwrap_or_default().to_string()
}

fn events(s: &Server, token: &str, id: &str, reason: &str) -> usize {
    let status = json(s.ctl(token, &["status", id, "-o", "json"]));
    status["events"].as_array().map_or(0, |es| es.iter().filter(|e| e["reason"] == reason).count())
}

#[test]
fn h1_every_hook_answers_from_the_cache_without_the_server() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let id = ok(s.ctl(
        &desk,
        &["send", "--to", "laptop", "--kind", "decision", "--urgent", "--subject", "ship it?", "--body", "yes/no"],
    ));
    ok(s.ctl(&laptop, &["login", "--server", &s.url, "--token", &laptop]));
    ok(s.ctl(&laptop, &["poll"]));
    // Point the PC at a server that accepts connections and never answers: a hook that called
    // it would hang instead of answering.
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let config = s.home_of(&laptop).join("config.json");
    let text = std::fs::read_to_string(&config)
        .expect("config")
        .replace(&s.url, &format!("http://{}", black_hole.local_addr().expect("addr")));
    std::fs::write(&config, text).expect("rewrite config");

    let input = serde_json::json!({"session_id": "s1", "tool_name": "Bash", "tool_input": {"command": "ls"}, "stop_hook_active": false});
    for event in ["session-start", "user-prompt-submit", "post-tool-use", "stop"] {
        let started = Instant::now();
        let out = s.hook(&laptop, event, input.clone());
        assert!(started.elapsed() < Duration::from_secs(5), "{event} waited on the network");
        assert_eq!(code(&out), 0, "{event}: {}", stderr(&out));
        if event == "session-start" {
            assert!(context(&out).contains(&id), "{event}: {}", stdout(&out));
        }
        if event == "stop" {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stop json");
            assert_eq!(v["decision"], "block", "H4: the urgent decision blocks the stop once");
        }
    }
}

#[test]
fn a4_queued_seen_and_ack_reach_the_server_once_it_is_back_once_each() {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut s = Server::start_opts(Some(examples()), &listen, &[]);
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let note = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "fyi", "--body", "b"]));
    let request = ok(s.ctl(&laptop, &["send", "--to", "desk", "--kind", "request", "--subject", "q", "--body", "?"]));
    let answer = ok(s.ctl(&desk, &["reply", &request, "--body", "42"]));
    ok(s.ctl(&laptop, &["login", "--server", &s.url, "--token", &laptop]));
    ok(s.ctl(&laptop, &["poll"]));

    s.kill9();
    let shown = context(&s.hook(&laptop, "session-start", serde_json::json!({"session_id": "s1"})));
    assert!(shown.contains(&note) && shown.contains(&answer), "{shown}");
    let mut agent = Command::new(BIN)
        .args(["agent", "--wait", "1s"])
        .env("PCMAIL_HOME", s.home_of(&laptop))
        .env("PCMAIL_LOG", "warn")
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent");
    std::thread::sleep(Duration::from_secs(2));
    s.spawn();
    eventually(40, "the queued calls to arrive", || {
        let seen = json(s.ctl(&desk, &["status", &note, "-o", "json"]))["mail"]["state"] == "seen";
        let done = json(s.ctl(&laptop, &["status", &answer, "-o", "json"]))["mail"]["state"] == "done";
        (seen && done).then_some(())
    });
    // Once its queue is empty the agent holds nothing it could send again.
    let queued = || {
        let db = rusqlite::Connection::open(s.home_of(&laptop).join("cache.db")).ok()?;
        db.query_row("SELECT count(*) FROM pending", [], |r| r.get::<_, i64>(0)).ok()
    };
    eventually(20, "the agent's queue to drain", || (queued() == Some(0)).then_some(()));
    let _ = agent.kill();
    let _ = agent.wait();
    assert_eq!(events(&s, &desk, &note, "Seen"), 1, "seen arrived once");
    assert_eq!(events(&s, &laptop, &answer, "Done"), 1, "ack arrived once");
}

#[test]
fn i1_i2_i4_intent_recorded_twice_once_escalated_then_closed_by_the_reply_tool() {
    let dir = tempfile::tempdir().expect("tempdir");
    for f in ["roster.yaml", "work.yaml", "policies.yaml"] {
        let text = std::fs::read_to_string(examples().join(f))
            .expect("example")
            .replace("escalateAfter: 10m", "escalateAfter: 1s")
            // A user who keeps the official Telegram plugin (I8: I2–I5 hold for them).
            .replace(
                "replyTool: mcp__plugin_pcmail_pcmail__telegram_reply",
                "replyTool: mcp__plugin_telegram_telegram__reply",
            )
            .replace(
                "reactTool: mcp__plugin_pcmail_pcmail__telegram_react",
                "reactTool: mcp__plugin_telegram_telegram__react",
            );
        std::fs::write(dir.path().join(f), text).expect("write");
    }
    let s = Server::start_opts(Some(dir.path().to_path_buf()), "127.0.0.1:0", &["--resync", "300ms"]);
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["login", "--server", &s.url, "--token", &desk]));
    ok(s.ctl(&desk, &["poll"]));
    let args =
        ["intent", "record", "--chat", "-100123", "--message", "2604", "--from", "kim", "--text", "本番を止めて"];
    let first = ok(s.ctl(&desk, &args));
    let second = ok(s.ctl(&desk, &args));
    assert_eq!(first, second, "the same key is the same intent");
    let other_chat = ok(
        s.ctl(&desk, &["intent", "record", "--chat", "555", "--message", "2604", "--from", "lee", "--text", "別件"])
    );
    assert_ne!(first, other_chat);

    let on_server = json(s.ctl(&desk, &["inbox", "-o", "json"]));
    let intents: Vec<_> =
        on_server["items"].as_array().expect("inbox").iter().filter(|m| m["kind"] == "intent").collect();
    assert_eq!(intents.len(), 2, "recorded once per key on the server too");
    eventually(20, "the escalation alert", || {
        let alerts = json(s.admin(&["alerts", "-o", "json"]));
        alerts["items"]
            .as_array()?
            .iter()
            .find(|a| a["kind"] == "intent-unanswered" && a["subject"] == first.as_str() && a["state"] == "firing")
            .map(|_| ())
    });

    let reply = serde_json::json!({
        "session_id": "s1",
        "tool_name": "mcp__plugin_telegram_telegram__reply",
        "tool_input": {"chat_id": "-100123", "reply_to": "2604", "text": "止めました"}
    });
    assert_eq!(code(&s.hook(&desk, "post-tool-use", reply)), 0);
    ok(s.ctl(&desk, &["poll"]));
    let status = json(s.ctl(&desk, &["status", &first, "-o", "json"]));
    assert_eq!(status["mail"]["state"], "done");
    assert_eq!(
        json(s.ctl(&desk, &["status", &other_chat, "-o", "json"]))["mail"]["state"],
        "delivered",
        "the other chat stays open"
    );
    eventually(20, "the escalation to resolve", || {
        let alerts = json(s.admin(&["alerts", "-o", "json"]));
        alerts["items"]
            .as_array()?
            .iter()
            .find(|a| a["subject"] == first.as_str() && a["state"] == "resolved")
            .map(|_| ())
    });
}

#[test]
fn a5_agent_install_writes_service_files_for_each_os() {
    let s = Server::start_with(None);
    for (os, file) in
        [("linux", "pcmail-agent.service"), ("macos", "com.pcmail.agent.plist"), ("windows", "pcmail-agent.xml")]
    {
        let dir = s.dir.path().join(os);
        let out = ok(s.ctl(&s.admin_token(), &["agent", "install", "--os", os, "--dir", &dir.display().to_string()]));
        assert!(out.contains(file), "{out}");
        let text = std::fs::read_to_string(dir.join(file)).expect("unit file");
        assert!(text.contains(BIN) && text.contains("agent"), "{text}");
    }
}
