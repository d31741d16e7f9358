//! The habitat (DESIGN §16): the real Claude Code CLI, offline. A Messages API stand-in of our
//! own answers scripted turns and logs every request, so a test asserts over every message
//! (hook context and channel events come as `role: "system"` messages) what the model was
//! shown. Each test runs in a network namespace of its own with only loopback up: `serve`,
//! the stand-in and `claude` share it, and nothing reaches outside hosts. The plugin is
//! installed from the repository's marketplace into a fresh `HOME`, and pcmail-ctl is reachable
//! only through `PCMAIL_CTL` (K1) — there a shim that times each hook call.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::harness::BIN;

/// The pinned Claude Code (scripts/test installs it).
pub const VERSION: &str = "2.1.197";

/// The plugin's tools as a session names them.
pub const TOOL_PREFIX: &str = "mcp__plugin_pcmail_pcmail__";

/// Whether `claude` is installed; when it is not, the habitat tests say so and skip.
pub fn present() -> bool {
    match Command::new("claude").arg("--version").output() {
        Ok(o) if o.status.success() => {
            let v = String::from_utf8_lossy(&o.stdout).to_string();
            if !v.starts_with(VERSION) {
                eprintln!("habitat: Claude Code {} found, the tests pin {VERSION}", v.trim());
            }
            true
        }
        _ => {
            eprintln!("habitat: skipped — no `claude` binary (scripts/test installs Claude Code {VERSION})");
            false
        }
    }
}

/// Runs `body` on a thread of its own inside a fresh network namespace with loopback up: every
/// process it starts and every socket it opens is in that namespace.
pub fn in_own_netns(body: impl FnOnce() + Send + 'static) {
    let joined = std::thread::spawn(move || {
        // SAFETY: unshare affects only this thread (and what it starts later).
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): {} (the habitat runs as root)", std::io::Error::last_os_error());
        let up = Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("ip (iproute2)");
        assert!(up.success(), "ip link set lo up");
        body();
    })
    .join();
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
}

/// One scripted answer of the model.
#[derive(Clone, Debug)]
pub enum Turn {
    Text(String),
    /// A `tool_use` of `name` with `input`; the next answer goes to the request carrying its
    /// `tool_result`.
    Tool(String, Value),
}

pub fn text(t: &str) -> Turn {
    Turn::Text(t.to_string())
}

pub fn tool(name: &str, input: Value) -> Turn {
    Turn::Tool(name.to_string(), input)
}

#[derive(Default)]
struct Shared {
    script: Mutex<VecDeque<Turn>>,
    /// Every request of the session's own (title requests, which carry no tools, left out).
    requests: Mutex<Vec<Value>>,
    next_id: Mutex<u64>,
}

/// The Messages API stand-in: `HEAD /` and `POST /v1/messages` (streamed), scripted.
pub struct Model {
    pub url: String,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

fn sse(events: &[Value]) -> String {
    events.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or_default())).collect()
}

fn answer(turn: &Turn, n: u64) -> String {
    let (block, delta, stop) = match turn {
        Turn::Text(t) => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": t}), "end_turn"),
        Turn::Tool(name, input) => (
            json!({"type": "tool_use", "id": format!("toolu_{n:04}"), "name": name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            "tool_use",
        ),
    };
    sse(&[
        json!({"type": "message_start", "message": {"id": format!("msg_{n:04}"), "type": "message", "role": "assistant",
            "model": "claude-standin", "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": block}),
        json!({"type": "content_block_delta", "index": 0, "delta": delta}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 1}}),
        json!({"type": "message_stop"}),
    ])
}

async fn messages(State(shared): State<Arc<Shared>>, body: axum::Json<Value>) -> impl IntoResponse {
    let body = body.0;
    let n = {
        let mut id = shared.next_id.lock().expect("lock");
        *id += 1;
        *id
    };
    let has_tools = body["tools"].as_array().is_some_and(|t| !t.is_empty());
    let turn = if has_tools {
        shared.requests.lock().expect("lock").push(body);
        shared.script.lock().expect("lock").pop_front().unwrap_or_else(|| text("ok"))
    } else {
        text("A title")
    };
    ([("content-type", "text/event-stream")], answer(&turn, n))
}

impl Model {
    /// Listens on loopback of the calling thread's namespace.
    pub fn start() -> Model {
        let shared = Arc::new(Shared::default());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("rt");
        let app = axum::Router::new()
            .route("/", axum::routing::get(|| async { "" }))
            .route("/v1/messages", axum::routing::post(messages))
            .with_state(shared.clone());
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            axum::serve(listener, app).await
        });
        Model { url, shared, _runtime: runtime }
    }

    /// The next answers, in order; past them the model says "ok".
    pub fn script(&self, turns: Vec<Turn>) {
        self.shared.script.lock().expect("lock").extend(turns);
    }

    pub fn requests(&self) -> Vec<Value> {
        self.shared.requests.lock().expect("lock").clone()
    }

    /// Until the session has made `n` requests.
    pub fn await_requests(&self, n: usize) {
        crate::harness::eventually(60, &format!("{n} requests to the model"), || {
            (self.shared.requests.lock().expect("lock").len() >= n).then_some(())
        });
    }
}

/// Everything the model was shown in `request`: every message's text (every role), tool
/// results included, one block a line.
pub fn shown(request: &Value) -> String {
    let mut out = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.push(s.clone()),
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            Value::Object(o) => {
                for (k, x) in o {
                    if matches!(k.as_str(), "text" | "content" | "input") || x.is_array() || x.is_object() {
                        walk(x, out)
                    }
                }
            }
            _ => {}
        }
    }
    walk(&request["messages"], &mut out);
    out.join("\n")
}

/// How many times `needle` occurs in what `request` showed the model.
pub fn times(request: &Value, needle: &str) -> usize {
    shown(request).matches(needle).count()
}

/// The tools `request` offered the model, by name.
pub fn tools(request: &Value) -> Vec<String> {
    request["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str().map(String::from)).collect()
}

/// One hook call as the shim saw it.
#[derive(Debug)]
pub struct HookCall {
    pub event: String,
    pub took: Duration,
    pub code: i32,
}

/// A fresh `HOME` with the plugin installed from the repository's marketplace.
pub struct Habitat {
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    /// pcmail's client home on this PC (`PCMAIL_HOME`).
    pub pcmail_home: PathBuf,
}

impl Habitat {
    /// `channels`: seed what 2.1.197 needs to allow the plugin's channel offline
    /// (`cachedGrowthBookFeatures.tengu_harbor` and a ledger entry naming pcmail@pcmail).
    pub fn new(pcmail_home: &Path, channels: bool) -> Habitat {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(dir.path().join("project")).expect("project");
        if channels {
            let seeded = json!({"cachedGrowthBookFeatures": {"tengu_harbor": true,
                "tengu_harbor_ledger": [{"marketplace": "pcmail", "plugin": "pcmail"}]}});
            std::fs::write(home.join(".claude.json"), seeded.to_string()).expect(".claude.json");
        }
        // Times each hook call, then runs this build's pcmail-ctl; the MCP server is exec'd.
        let shim = dir.path().join("pcmail-ctl-timed");
        let log = dir.path().join("hooks.log");
        std::fs::write(
            &shim,
            format!(
                "#!/bin/sh\nif [ \"$1\" != hook ]; then exec '{BIN}' \"$@\"; fi\nstart=$(date +%s%N)\n'{BIN}' \"$@\"\nrc=$?\n\
                 echo \"$2 $start $(date +%s%N) $rc\" >> '{}'\nexit $rc\n",
                log.display()
            ),
        )
        .expect("shim");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let h = Habitat { dir, home, pcmail_home: pcmail_home.to_path_buf() };
        let repo = env!("CARGO_MANIFEST_DIR");
        for args in [vec!["plugin", "marketplace", "add", repo], vec!["plugin", "install", "pcmail@pcmail"]] {
            let out = h.command().args(&args).output().expect("claude plugin");
            assert!(out.status.success(), "claude {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        h
    }

    pub(crate) fn command(&self) -> Command {
        let mut c = Command::new("claude");
        c.env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL", "1")
            .env("PCMAIL_CTL", self.dir.path().join("pcmail-ctl-timed"))
            .env("PCMAIL_HOME", &self.pcmail_home)
            .env("PCMAIL_LOG", "warn")
            .current_dir(self.dir.path().join("project"));
        c
    }

    pub fn debug_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("debug.log")).unwrap_or_default()
    }

    /// Starts a print-mode session (stream-json both ways) against `model`; `channels` adds
    /// `--channels plugin:pcmail@pcmail`; `env` more variables (`PCMAIL_CHANNELS`).
    pub fn session(&self, model: &Model, channels: bool, env: &[(&str, &str)]) -> Session {
        let mut c = self.command();
        c.args(["-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"])
            .arg("--debug-file")
            .arg(self.dir.path().join("debug.log"))
            .args(["--allowedTools", "mcp__plugin_pcmail_pcmail", "Bash"])
            .env("ANTHROPIC_BASE_URL", &model.url)
            .env("ANTHROPIC_API_KEY", "sk-ant-standin")
            .envs(env.iter().copied());
        if channels {
            c.args(["--channels", "plugin:pcmail@pcmail"]);
        }
        let mut child =
            c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn claude");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, events) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        Session { child, stdin, events, results: 0 }
    }

    /// Every hook call so far (the shim's log).
    pub fn hook_calls(&self) -> Vec<HookCall> {
        let log = std::fs::read_to_string(self.dir.path().join("hooks.log")).unwrap_or_default();
        log.lines()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let (start, end): (u64, u64) = (w.get(1)?.parse().ok()?, w.get(2)?.parse().ok()?);
                Some(HookCall {
                    event: w.first()?.to_string(),
                    took: Duration::from_nanos(end.saturating_sub(start)),
                    code: w.get(3)?.parse().ok()?,
                })
            })
            .collect()
    }

    /// K2: every hook call succeeded and Claude Code's debug log has no hook error or
    /// timeout; prints the slowest call.
    #[track_caller]
    pub fn assert_hooks_clean(&self) {
        let calls = self.hook_calls();
        assert!(!calls.is_empty(), "no hook ran");
        for c in &calls {
            assert_eq!(c.code, 0, "hook {} exited {}", c.event, c.code);
        }
        let log = self.debug_log();
        let bad: Vec<&str> = log
            .lines()
            .filter(|l| {
                let l = l.to_lowercase();
                l.contains("hook")
                    && ["error", "timed out", "timeout", "failed", "invalid", "non-blocking status"]
                        .iter()
                        .any(|w| l.contains(w))
                    && !l.contains("3p telemetry")
            })
            .collect();
        assert!(bad.is_empty(), "K2: hook trouble in Claude Code's debug log:\n{}", bad.join("\n"));
        assert!(log.contains("Successfully parsed and validated hook JSON output"), "no hook JSON was accepted");
        let slowest = calls.iter().max_by_key(|c| c.took).expect("calls");
        eprintln!("habitat: {} hook calls, the slowest {} in {:?}", calls.len(), slowest.event, slowest.took);
    }
}

/// A running print-mode session.
pub struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Value>,
    results: usize,
}

impl Session {
    /// Sends a user prompt (a new turn).
    pub fn say(&mut self, prompt: &str) {
        let line = json!({"type": "user", "message": {"role": "user", "content": prompt}});
        let stdin = self.stdin.as_mut().expect("session open");
        writeln!(stdin, "{line}").expect("write to claude");
        stdin.flush().expect("flush");
    }

    /// Until the next turn ends (its `result` event); answers it.
    pub fn await_turn(&mut self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(v) if v["type"] == "result" => {
                    self.results += 1;
                    return v;
                }
                Ok(_) => {}
                Err(e) => panic!("no end of turn {} from claude: {e}", self.results + 1),
            }
        }
    }

    /// Closes the session's input and waits for it to end.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("try_wait").is_none() {
            assert!(Instant::now() < deadline, "claude did not end after its input closed");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An interactive session in tmux (its own server socket, started inside the test's network
/// namespace), driven by keys and read from the screen.
pub struct Tmux {
    socket: PathBuf,
}

impl Habitat {
    /// Merges `extra` into `$HOME/.claude.json` (after the plugin's install wrote it).
    pub fn seed(&self, extra: Value) {
        let path = self.home.join(".claude.json");
        let mut seeded: Value =
            std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(json!({}));
        fn merge(into: &mut Value, from: Value) {
            match (into, from) {
                (Value::Object(a), Value::Object(b)) => {
                    for (k, v) in b {
                        merge(a.entry(k).or_insert(Value::Null), v);
                    }
                }
                (slot, v) => *slot = v,
            }
        }
        merge(&mut seeded, extra);
        std::fs::write(&path, seeded.to_string()).expect(".claude.json");
    }

    /// Starts `claude` interactively with `args` against `model`: onboarding done, the project
    /// trusted, the key approved (what a person's first run would have answered).
    pub fn interactive(&self, model: &Model, args: &[&str]) -> Tmux {
        let project = self.dir.path().join("project");
        let project = project.canonicalize().unwrap_or(project);
        self.seed(json!({
            "hasCompletedOnboarding": true, "theme": "dark", "numStartups": 3,
            "customApiKeyResponses": {"approved": ["sk-ant-standin"], "rejected": []},
            "projects": {project.display().to_string(): {"hasTrustDialogAccepted": true,
                "hasCompletedProjectOnboarding": true, "allowedTools": []}},
        }));
        let q = |v: &dyn std::fmt::Display| format!("'{}'", v.to_string().replace('\'', "'\\''"));
        let mut script = String::from("#!/bin/sh\n");
        for (k, v) in [
            ("PATH", "/usr/local/bin:/usr/bin:/bin".to_string()),
            ("HOME", self.home.display().to_string()),
            ("TERM", "xterm-256color".into()),
            ("DISABLE_AUTOUPDATER", "1".into()),
            ("DISABLE_ERROR_REPORTING", "1".into()),
            ("CLAUDE_CODE_DISABLE_OFFICIAL_MARKETPLACE_AUTOINSTALL", "1".into()),
            ("PCMAIL_CTL", self.dir.path().join("pcmail-ctl-timed").display().to_string()),
            ("PCMAIL_HOME", self.pcmail_home.display().to_string()),
            ("PCMAIL_LOG", "warn".into()),
            ("ANTHROPIC_BASE_URL", model.url.clone()),
            ("ANTHROPIC_API_KEY", "sk-ant-standin".into()),
        ] {
            script += &format!("export {k}={}\n", q(&v));
        }
        script += &format!(
            "cd {}\nexec claude --debug-file {}",
            q(&project.display()),
            q(&self.dir.path().join("debug.log").display())
        );
        for a in args {
            script += &format!(" {}", q(a));
        }
        let run = self.dir.path().join("run-claude.sh");
        std::fs::write(&run, script + "\n").expect("script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let t = Tmux { socket: self.dir.path().join("tmux.sock") };
        let out = t.tmux(&["new-session", "-d", "-s", "k", "-x", "160", "-y", "50", &run.display().to_string()]);
        assert!(out.status.success(), "tmux: {}", String::from_utf8_lossy(&out.stderr));
        t
    }
}

impl Tmux {
    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("TERM", "xterm-256color")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("tmux (installed)")
    }

    /// What the terminal shows now.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", "k"]).stdout).to_string()
    }

    /// Types `text` literally, then Enter.
    pub fn type_line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "k", "-l", text]);
        self.tmux(&["send-keys", "-t", "k", "Enter"]);
    }

    /// Until the screen shows `needle`.
    pub fn await_screen(&self, needle: &str) {
        crate::harness::eventually(60, &format!("the screen shows {needle:?}"), || {
            self.screen().contains(needle).then_some(())
        });
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}
