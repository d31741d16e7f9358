//! `pcmail-ctl mcp` end to end: a test MCP client speaking JSON-RPC over the process's stdio,
//! the process started exactly as the plugin's `.mcp.json` starts it, against a real `serve`.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::*;

const CHANNEL: &str = "notifications/claude/channel";

fn plugin_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("plugin")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()))
}

/// A command line of the plugin's, `${CLAUDE_PLUGIN_ROOT}` filled in, pointed at this build
/// (through the launcher's `PCMAIL_CTL`, and first on `PATH` for a bare `pcmail-ctl`).
fn plugin_command(command: &str, args: &[&str]) -> Command {
    let program = command.replace("${CLAUDE_PLUGIN_ROOT}", &plugin_root().to_string_lossy());
    let bin_dir = Path::new(BIN).parent().expect("bin dir");
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut c = Command::new(program);
    c.args(args).env("PCMAIL_CTL", BIN).env("CLAUDE_PLUGIN_ROOT", plugin_root()).env("PATH", path);
    c
}

pub(crate) struct McpClient {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    next_id: u64,
    /// Channel notifications received so far, in order.
    pub(crate) pushes: Vec<(Instant, Value)>,
}

impl McpClient {
    /// Starts `mcp` as the plugin's `.mcp.json` says, as the PC whose home is `home`, in a
    /// session started with Claude Code's channels flag or without, and initializes it.
    pub(crate) fn start(home: &Path, session: &str, channels: bool) -> McpClient {
        let config = read_json(&plugin_root().join(".mcp.json"));
        let server = &config["mcpServers"]["pcmail"];
        let args: Vec<&str> = server["args"].as_array().expect("args").iter().filter_map(Value::as_str).collect();
        let mut child = plugin_command(server["command"].as_str().expect("command"), &args)
            .env("PCMAIL_HOME", home)
            .env("CLAUDE_CODE_SESSION_ID", session)
            .env("PCMAIL_LOG", "warn")
            .env("PCMAIL_CHANNELS", channels.to_string())
            // Not the repository, whose ./pcmail-data a local `serve` may have left.
            .current_dir(if home.is_dir() { home } else { Path::new("/") })
            .env_remove("PCMAIL_SERVER")
            .env_remove("PCMAIL_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn mcp");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON-RPC: {line}: {e}"));
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut c = McpClient { child, stdin, lines, next_id: 1, pushes: Vec::new() };
        let init = c.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "e2e", "version": "1"}}),
        );
        assert!(init["capabilities"]["experimental"]["claude/channel"].is_object(), "channel capability: {init}");
        assert!(init["capabilities"]["tools"].is_object(), "{init}");
        assert!(init["instructions"].as_str().is_some_and(|i| i.contains("reply")), "{init}");
        c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        c
    }

    fn send(&mut self, message: Value) {
        writeln!(self.stdin, "{message}").expect("write to mcp");
        self.stdin.flush().expect("flush");
    }

    /// Takes whatever arrives within `wait`, keeping channel notifications; answers the
    /// response with `id` if it came.
    pub(crate) fn pump(&mut self, wait: Duration, id: Option<u64>) -> Option<Value> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if v["method"] == CHANNEL => self.pushes.push((Instant::now(), v)),
                Ok(v) if id.is_some() && v["id"] == json!(id) => return Some(v),
                Ok(v) => assert!(v.get("method").is_some(), "an answer nobody asked for: {v}"),
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => panic!("the MCP process closed its stdout"),
            }
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let answer = self.pump(Duration::from_secs(60), Some(id)).unwrap_or_else(|| panic!("no answer to {method}"));
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// Calls a tool; answers (text, is_error).
    pub(crate) fn call(&mut self, tool: &str, arguments: Value) -> (String, bool) {
        let r = self.request("tools/call", json!({"name": tool, "arguments": arguments}));
        let text = r["content"][0]["text"].as_str().unwrap_or_else(|| panic!("{tool}: no text: {r}")).to_string();
        (text, r["isError"] == true)
    }

    #[track_caller]
    pub(crate) fn ok(&mut self, tool: &str, arguments: Value) -> String {
        let (text, error) = self.call(tool, arguments);
        assert!(!error, "{tool} failed: {text}");
        text
    }

    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }
}

impl Drop for McpClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn state(s: &Server, token: &str, id: &str) -> Value {
    json(s.ctl(token, &["status", id, "-o", "json"]))["mail"].clone()
}

/// A PC logged in as `machine`, its cursor set by a first poll: what is in the cache before the
/// session starts is backlog for the hooks, not pushes.
fn pc(s: &Server, machine: &str) -> (String, PathBuf) {
    let token = s.token(machine);
    ok(s.ctl(&token, &["login", "--server", &s.url, "--token", &token]));
    ok(s.ctl(&token, &["poll"]));
    let home = s.home_of(&token);
    (token, home)
}

fn mail_id(text: &str) -> String {
    text.split_whitespace().find(|w| w.starts_with("mail--")).expect("a mail id").trim_end_matches(';').to_string()
}

#[test]
fn mcp_tools_list_fits_2500_tokens_and_every_tool_moves_the_mail_at_the_server() {
    let s = Server::start();
    let desk = s.token("desk");
    let (laptop, home) = pc(&s, "laptop");
    let mut mcp = McpClient::start(&home, "session-tools", false);

    // A token is at least one byte, so the answer's size in bytes bounds its size in tokens.
    let list = mcp.request("tools/list", json!({}));
    let bytes = list.to_string().len();
    assert!(bytes < 2500, "tools/list is {bytes} bytes");
    let names: Vec<&str> = list["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "send",
            "inbox",
            "read",
            "reply",
            "ack",
            "fail",
            "status",
            "search",
            "intents",
            "telegram_reply",
            "telegram_react"
        ]
    );
    println!("tools/list: {bytes} bytes");

    let sent = mcp.ok("send", json!({"to": "desk", "subject": "build", "body": "green?", "kind": "request"}));
    let request = mail_id(&sent);
    let m = state(&s, &desk, &request);
    assert_eq!(
        (m["from"].as_str(), m["to"].as_str(), m["kind"].as_str()),
        (Some("laptop"), Some("desk"), Some("request"))
    );

    let note =
        ok(s.ctl(&desk, &["send", "--to", "laptop", "--kind", "work", "--subject", "deploy", "--body", "please"]));
    let listed = mcp.ok("inbox", json!({}));
    assert!(listed.contains(&note) && listed.contains("deploy"), "{listed}");
    assert_ne!(state(&s, &desk, &note)["state"], "seen", "the inbox is a peek");
    let found = mcp.ok("search", json!({"text": "eplo"}));
    assert!(found.contains(&note) && found.contains("deploy"), "U5: the search tool finds part of a word: {found}");
    assert_eq!(mcp.ok("search", json!({"text": "eplo", "in": "ledger"})), "nothing found");

    let read = mcp.ok("read", json!({"id": note}));
    assert!(read.contains("please") && read.contains("from desk"), "{read}");
    assert_eq!(state(&s, &desk, &note)["state"], "seen");

    let replied = mcp.ok("reply", json!({"id": note, "body": "deployed"}));
    let answer = mail_id(&replied);
    let m = state(&s, &desk, &note);
    assert_eq!((m["state"].as_str(), m["result"].as_str()), (Some("done"), Some("deployed")));
    assert_eq!(state(&s, &desk, &answer)["replyTo"], json!(note));

    let acked = ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", "fyi"]));
    mcp.ok("ack", json!({"id": acked}));
    assert_eq!(state(&s, &desk, &acked)["state"], "done");

    let failed = ok(s.ctl(&desk, &["send", "--to", "laptop", "--kind", "work", "--body", "rewrite it in COBOL"]));
    mcp.ok("fail", json!({"id": failed, "reason": "no COBOL compiler here"}));
    let m = state(&s, &desk, &failed);
    assert_eq!((m["state"].as_str(), m["failReason"].as_str()), (Some("failed"), Some("no COBOL compiler here")));

    let waited = mcp.ok("status", json!({"id": request, "wait_for": "seen", "timeout": 1}));
    assert!(waited.contains("still not seen after 1s"), "{waited}");
    ok(s.ctl(&desk, &["read", &request]));
    let seen = mcp.ok("status", json!({"id": request, "wait_for": "seen", "timeout": 30}));
    assert!(
        seen.contains(&format!("{request} to desk: seen")) && seen.contains("seen") && !seen.contains("still"),
        "{seen}"
    );
    assert_eq!(state(&s, &desk, &request)["state"], "seen", "status only looks");

    assert_eq!(mcp.ok("intents", json!({})), "no pending intents");
    // The laptop is no recorder: the server refuses it and says so (T10), and the message
    // stays on this PC, where its session answers it.
    let recorded = s.ctl_stdin(
        &laptop,
        &["intent", "record", "--chat", "-100", "--message", "7", "--from", "kim", "--text", "-"],
        Some(b"are you there?"),
    );
    assert_eq!(code(&recorded), 1, "{}", stderr(&recorded));
    assert!(stderr(&recorded).contains("refused"), "{}", stderr(&recorded));
    let intents = mcp.ok("intents", json!({}));
    assert!(intents.contains("chat_id=-100 reply_to=7") && intents.contains("are you there?"), "{intents}");

    // Errors an agent can act on: one sentence each, as tool errors.
    let (text, error) = mcp.call("send", json!({"to": "desk-pc", "body": "x"}));
    assert!(error && text.contains("nothing was sent") && text.contains("Did you mean desk"), "{text}");
    let (text, error) = mcp.call("reply", json!({"id": answer, "body": "thanks"}));
    assert!(error && text.starts_with("Refused as a loop"), "M5: a reply to a reply: {text}");
    let (text, error) = mcp.call("read", json!({}));
    assert!(error && text == "`id` is required.", "{text}");
    let (text, error) = mcp.call("archive", json!({"id": note}));
    assert!(error && text.contains("no tool `archive`"), "{text}");
    assert!(mcp.running());
}

#[test]
fn mcp_pushes_a_new_mail_once_within_a_second_never_again_after_a_restart_and_hooks_stay_the_fallback() {
    let s = Server::start();
    let desk = s.token("desk");
    let (laptop, home) = pc(&s, "laptop");
    // Mail already in the cache when the session starts is the hooks' (session-start shows it).
    let backlog = ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", "polled before the session"]));
    ok(s.ctl(&laptop, &["poll"]));
    let mut mcp = McpClient::start(&home, "session-push", true);
    mcp.pump(Duration::from_millis(1500), None);

    let id = ok(s.ctl(
        &desk,
        &["send", "--to", "laptop", "--kind", "decision", "--urgent", "--subject", "ship it?", "--body", "yes or no"],
    ));
    let sent = Instant::now();
    mcp.pump(Duration::from_secs(3), None);
    let pushes: Vec<&(Instant, Value)> = mcp.pushes.iter().collect();
    assert_eq!(pushes.len(), 1, "exactly one push, none for the backlog {backlog}: {pushes:?}");
    let (at, push) = pushes[0];
    eprintln!("send → push: {:?}", at.duration_since(sent));
    assert!(at.duration_since(sent) <= Duration::from_secs(1), "pushed after {:?}", at.duration_since(sent));
    assert_eq!(
        push["params"]["meta"],
        json!({"id": id, "from": "desk", "kind": "decision", "urgent": "true"}),
        "{push}"
    );
    assert_eq!(push["params"]["content"], "ship it?\n\nyes or no");

    // Presented in the session, not read: the peek and the push leave it unseen.
    let listed = mcp.ok("inbox", json!({}));
    assert!(listed.contains(&id), "{listed}");
    assert_eq!(state(&s, &desk, &id)["state"], "delivered");
    // The session listens to channels: its hooks count the push instead of showing it again (H3).
    let hook = s.hook(&laptop, "user-prompt-submit", json!({"session_id": "session-push"}));
    assert!(stdout(&hook).contains("more") && !stdout(&hook).contains("ship it?"), "{}", stdout(&hook));

    // Restarted, now in a session started without channels (Claude Code drops its pushes).
    drop(mcp);
    let mut again = McpClient::start(&home, "session-plain", false);
    again.pump(Duration::from_secs(2), None);
    assert!(again.pushes.is_empty(), "a restart pushed again: {:?}", again.pushes);
    let next = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "restarted", "--body", "after the restart"]));
    again.pump(Duration::from_secs(2), None);
    let ids: Vec<&Value> = again.pushes.iter().map(|(_, p)| &p["params"]["meta"]["id"]).collect();
    assert_eq!(ids, [&json!(next)]);
    for pushed in [&id, &next] {
        assert_eq!(state(&s, &desk, pushed)["state"], "delivered", "pushes never mark seen or done");
    }
    // The hooks stay the fallback: the pushed mail is still shown to the session.
    let hook = s.hook(&laptop, "user-prompt-submit", json!({"session_id": "session-plain"}));
    assert!(stdout(&hook).contains(&next) && stdout(&hook).contains("restarted"), "{}", stdout(&hook));
}

#[test]
fn e8_the_first_session_on_a_fresh_pc_pushes_mail_that_arrives_while_its_first_poll_runs() {
    let s = Server::start();
    let desk = s.token("desk");
    let laptop = s.token("laptop");
    // Logged in, never polled: no cursor yet.
    ok(s.ctl(&laptop, &["login", "--server", &s.url, "--token", &laptop]));
    let home = s.home_of(&laptop);
    let mut mcp = McpClient::start(&home, "session-fresh", true);
    let fresh = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "sent at once", "--body", "now"]));
    mcp.pump(Duration::from_secs(3), None);
    let pushed: Vec<String> =
        mcp.pushes.iter().filter_map(|(_, p)| p["params"]["meta"]["id"].as_str().map(String::from)).collect();
    assert_eq!(pushed, vec![fresh.clone()], "E8: the mail sent after the session began, once");
}

#[test]
fn mcp_with_serve_stopped_tools_say_so_and_pushes_resume_with_nothing_missed() {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut s = Server::start_opts(Some(examples()), &listen, &[]);
    let desk = s.token("desk");
    let (_laptop, home) = pc(&s, "laptop");
    let mut mcp = McpClient::start(&home, "session-outage", false);
    mcp.pump(Duration::from_millis(500), None);

    s.kill9();
    for (tool, args) in [
        ("inbox", json!({})),
        ("send", json!({"to": "desk", "body": "anyone?"})),
        ("status", json!({"id": "mail--00000000"})),
    ] {
        let (text, error) = mcp.call(tool, args);
        assert!(error, "{tool}: {text}");
        assert!(text.contains("cannot be reached") && text.contains(&s.url), "{tool}: {text}");
    }
    mcp.pump(Duration::from_secs(2), None);
    assert!(mcp.running(), "the MCP process must outlive the server");

    s.spawn();
    let sent: Vec<String> = (0..3)
        .map(|n| ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", &format!("after the outage {n}")])))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while mcp.pushes.len() < sent.len() && Instant::now() < deadline {
        mcp.pump(Duration::from_millis(200), None);
    }
    mcp.pump(Duration::from_secs(1), None);
    let ids: Vec<String> =
        mcp.pushes.iter().map(|(_, p)| p["params"]["meta"]["id"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(ids, sent, "each mail pushed once, in order");
    assert!(!mcp.ok("inbox", json!({})).is_empty());
}

#[test]
fn mcp_without_a_login_pushes_what_the_agent_fetches_into_the_one_cache_and_tools_say_why_not() {
    let s = Server::start();
    let desk = s.token("desk");
    // The PC's own poller (`poll`, as `agent` runs it) with the token in its environment only:
    // the MCP server finds no login and polls nothing itself.
    let laptop = s.token("laptop");
    ok(s.ctl(&laptop, &["poll"]));
    let home = s.home_of(&laptop);
    let mut mcp = McpClient::start(&home, "session-agent", false);
    let (text, error) = mcp.call("inbox", json!({}));
    assert!(error && text.contains("pcmail-ctl login"), "{text}");

    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "via the agent", "--body", "b"]));
    ok(s.ctl(&laptop, &["poll"]));
    let polled = Instant::now();
    mcp.pump(Duration::from_secs(2), None);
    let ids: Vec<&Value> = mcp.pushes.iter().map(|(_, p)| &p["params"]["meta"]["id"]).collect();
    assert_eq!(ids, [&json!(id)], "pushed once from the cache the agent filled");
    let after = mcp.pushes[0].0.duration_since(polled);
    assert!(after <= Duration::from_secs(1), "pushed {after:?} after the agent's poll");
}

#[test]
fn mcp_with_an_unusable_home_or_garbled_input_answers_clearly_and_keeps_running() {
    let file = tempfile::NamedTempFile::new().expect("file");
    let home = file.path().join("pcmail");
    let mut mcp = McpClient::start(&home, "session-broken", false);
    let (text, error) = mcp.call("intents", json!({}));
    assert!(error && text.contains(&home.display().to_string()), "{text}");
    let (text, error) = mcp.call("send", json!({"to": "desk", "body": "x"}));
    assert!(error && text.contains(&home.join("config.json").display().to_string()), "{text}");
    // Lines that are not JSON-RPC, or not UTF-8, are skipped, not fatal.
    mcp.stdin.write_all(b"not json at all\n\xff\xfe\n").expect("write");
    mcp.pump(Duration::from_secs(1), None);
    assert!(mcp.running(), "a broken cache or a garbled line never ends the session's server");
    assert_eq!(mcp.request("tools/list", json!({}))["tools"].as_array().map(Vec::len), Some(11));
}

#[test]
fn plugin_json_files_parse_and_name_only_commands_that_exist() {
    let root = plugin_root();
    let manifest = read_json(&root.join(".claude-plugin/plugin.json"));
    assert_eq!(manifest["name"], "pcmail");
    assert_eq!(manifest["version"], env!("CARGO_PKG_VERSION"));
    let market = read_json(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".claude-plugin/marketplace.json"));
    let source = market["plugins"][0]["source"].as_str().expect("source");
    assert_eq!(Path::new(env!("CARGO_MANIFEST_DIR")).join(source).canonicalize().ok(), root.canonicalize().ok());

    let hooks = read_json(&root.join("hooks/hooks.json"));
    let events = hooks["hooks"].as_object().expect("hooks");
    let names: Vec<&str> = events.keys().map(String::as_str).collect();
    assert_eq!(names, ["PostToolUse", "SessionStart", "Stop", "UserPromptSubmit"]);
    let policy = pcmail_core::manifest::spec::IntentPolicySpec::default();
    let home = tempfile::tempdir().expect("home");
    let mut commands = 0;
    for (event, groups) in events {
        for group in groups.as_array().expect("groups") {
            if event == "PostToolUse" {
                // I2 closes on the reply tool, the react tool marks seen, I3 reminds after Bash.
                let matcher = group["matcher"].as_str().expect("matcher");
                let tools: Vec<&str> = matcher.split('|').collect();
                // The example policy's tools (pcmail's own, K5), the official plugin's for
                // those who keep it, and Bash.
                for tool in [policy.reply_tool.as_str(), policy.react_tool.as_str(), "Bash"] {
                    assert!(tools.contains(&tool), "{tool} missing from {matcher}");
                }
                for own in ["mcp__plugin_pcmail_pcmail__telegram_reply", "mcp__plugin_pcmail_pcmail__telegram_react"] {
                    assert!(tools.contains(&own), "{own} missing from {matcher}");
                }
                let examples = std::fs::read_to_string(
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/examples/policies.yaml"),
                )
                .expect("examples");
                assert!(examples.contains("replyTool: mcp__plugin_pcmail_pcmail__telegram_reply"), "K5: the examples");
            }
            for hook in group["hooks"].as_array().expect("hooks") {
                let line = hook["command"].as_str().expect("command");
                let words: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(words[0], "${CLAUDE_PLUGIN_ROOT}/bin/pcmail-ctl", "{line}");
                assert_eq!(words[1], "hook", "{line}");
                let out = plugin_command(words[0], &words[1..])
                    .env("PCMAIL_HOME", home.path())
                    .stdin(Stdio::null())
                    .output()
                    .expect("run the hook");
                assert!(out.status.success(), "{line}: {}", stderr(&out));
                commands += 1;
            }
        }
    }
    assert_eq!(commands, 4, "one command per event");

    // K1: the MCP server starts through the launcher too, so a pcmail-ctl found only by
    // PCMAIL_CTL or in ~/.cargo/bin serves it (Claude Code puts no plugin bin/ on PATH).
    let mcp = read_json(&root.join(".mcp.json"));
    let server = &mcp["mcpServers"]["pcmail"];
    assert_eq!(server["command"], "${CLAUDE_PLUGIN_ROOT}/bin/pcmail-ctl");
    assert_eq!(server["args"], json!(["mcp"]));
    let help = plugin_command("${CLAUDE_PLUGIN_ROOT}/bin/pcmail-ctl", &["mcp", "--help"])
        .env("PATH", "/usr/bin:/bin")
        .output()
        .expect("mcp --help");
    assert!(help.status.success() && stdout(&help).contains("MCP server"), "{}", stderr(&help));
}

#[test]
fn o7_claude_plugin_validate_strict_passes_on_the_plugin_and_the_marketplace() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for path in [plugin_root(), repo.to_path_buf()] {
        let out =
            Command::new("claude").args(["plugin", "validate", "--strict"]).arg(&path).output().unwrap_or_else(|e| {
                panic!("Claude Code's `claude` ({e}): run the tests with scripts/test, which installs it")
            });
        assert!(
            out.status.success() && stdout(&out).contains("Validation passed"),
            "{}: {}{}",
            path.display(),
            stdout(&out),
            stderr(&out)
        );
    }
}

#[test]
fn k3_pcmail_channels_takes_the_usual_spellings() {
    let home = tempfile::tempdir().expect("home");
    for (value, accepted) in [
        ("1", true),
        ("0", true),
        ("yes", true),
        ("no", true),
        ("on", true),
        ("off", true),
        ("true", true),
        ("maybe", false),
    ] {
        let out = plugin_command("${CLAUDE_PLUGIN_ROOT}/bin/pcmail-ctl", &["mcp"])
            .env("PCMAIL_HOME", home.path())
            .env("PCMAIL_CHANNELS", value)
            .env_remove("PCMAIL_SERVER")
            .env_remove("PCMAIL_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("mcp");
        let usage_error = out.status.code() == Some(2);
        assert_eq!(!usage_error, accepted, "PCMAIL_CHANNELS={value}: {}", stderr(&out));
        if !accepted {
            assert!(stderr(&out).contains("'maybe'"), "names the value: {}", stderr(&out));
        }
    }
}
