//! X5: `pcmail-ctl doctor`'s IO. Each check looks at one thing on the PC or asks the server
//! once; what it saw goes to `pcmail_core::doctor`, which decides the verdict and the fix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::api::{MachineSeen, WhoAmI};
use pcmail_core::doctor::{self, Contact, Finding, HooksSeen, Login, McpStart, Poller, Polls, Service, TokenAnswer};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::client::{Client, ClientError, config_path, load_config};
use crate::install::{self, Os};

/// Each server call, and the MCP server's `initialize`, gets this long.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The server the spawned MCP server is pointed at: a closed port, so that its poller (which
/// starts with it) polls nothing and a doctor's own run never counts as this PC polling.
const NO_SERVER: &str = "http://127.0.0.1:9";

/// What the checks need to know of this run.
pub struct Setup {
    pub home: PathBuf,
    /// The client this run's flags, environment and login make (the same as every verb's).
    pub client: Result<Client, ClientError>,
    /// Flags or environment name a server or token of their own.
    pub overridden: bool,
    /// Claude Code's own directory (`$CLAUDE_CONFIG_DIR`, else `~/.claude`).
    pub claude: PathBuf,
    /// The project whose `.claude/settings*.json` also count (the working directory).
    pub project: PathBuf,
    /// This pcmail-ctl, started as the MCP server when no plugin launcher is installed.
    pub exe: PathBuf,
}

/// Every check, in [`doctor::Check::ALL`]'s order.
pub async fn run(setup: &Setup) -> Vec<Finding> {
    let config_file = config_path(&setup.home);
    let login = match load_config(&setup.home) {
        Ok(None) => Login::Missing,
        Ok(Some(c)) => Login::Saved { server: c.server, token_empty: c.token.trim().is_empty() },
        Err(e) => Login::Unreadable(e.to_string()),
    };
    let home = setup.home.display().to_string();
    let mut findings = vec![doctor::config(&home, &config_file.display().to_string(), &login, setup.overridden)];
    let client = setup
        .client
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|c| c.with_timeout(TIMEOUT).map_err(|e| e.to_string()));
    let base = client.as_ref().map_or_else(|_| "the server".to_string(), |c| c.base().to_string());
    let contact = match &client {
        Err(why) => Contact::NoClient(why.clone()),
        Ok(c) => match c.server_date().await {
            Ok(date) => Contact::Answered { date },
            Err(ClientError::Untrusted { message, .. }) => Contact::Untrusted(message),
            Err(ClientError::Unreachable { message, .. }) => Contact::Unreachable(message),
            Err(e) => Contact::Unreachable(e.to_string()),
        },
    };
    let local = crate::now();
    findings.push(doctor::server(&base, &contact));
    findings.push(doctor::tls(&base, &contact));
    let client = client.ok().filter(|_| matches!(contact, Contact::Answered { .. }));
    let answer = match &client {
        Some(c) => Some(whoami(c).await),
        None => None,
    };
    findings.push(doctor::token(answer.as_ref()));
    findings.push(doctor::clock(local, &contact));
    let server_now = match contact {
        Contact::Answered { date: Some(d) } => d,
        _ => local,
    };
    findings.push(agent(client.as_ref(), answer.as_ref(), server_now, setup).await);
    let (seen, launcher) = claude_settings(&setup.claude, &setup.project);
    findings.push(doctor::hooks(&seen));
    let command = launcher.unwrap_or_else(|| setup.exe.clone());
    findings.push(doctor::mcp(&command.display().to_string(), &start_mcp(&command, &setup.home).await));
    findings.push(doctor::telegram(&poller(&setup.home)));
    findings
}

/// The machine-authenticated call: who the server takes this token for.
async fn whoami(client: &Client) -> TokenAnswer {
    match client.get::<WhoAmI>("/api/v1/whoami", &[]).await {
        Ok(WhoAmI { machine: Some(m), .. }) => TokenAnswer::Machine(m),
        Ok(_) => TokenAnswer::Admin,
        Err(ClientError::Api { status: status @ (401 | 403 | 429), message, .. }) => {
            TokenAnswer::Rejected { status, message }
        }
        Err(e) => TokenAnswer::Failed(e.to_string()),
    }
}

/// The service file `agent install` writes for this OS, and the machine's last poll as the
/// server keeps it (V1's machines list, which any caller may read).
async fn agent(client: Option<&Client>, answer: Option<&TokenAnswer>, server_now: Ts, setup: &Setup) -> Finding {
    let os = Os::current();
    let (files, commands) = install::units(os, &setup.exe, &setup.home);
    let unit = files.first().map(|f| install::default_dir(os).join(&f.name)).unwrap_or_default();
    let path = unit.display().to_string();
    let service = if unit.is_file() { Service::Installed(path) } else { Service::Missing(path) };
    let (polls, machine) = match (client, answer) {
        (Some(c), Some(TokenAnswer::Machine(m))) => match c.get::<Vec<MachineSeen>>("/api/v1/machines", &[]).await {
            Ok(seen) => (Polls::Seen(seen.into_iter().find(|s| &s.name == m).map(|s| s.last_poll_at)), m.clone()),
            Err(_) => (Polls::NotChecked, m.clone()),
        },
        _ => (Polls::NotChecked, "this PC".to_string()),
    };
    let start = commands.last().cloned().unwrap_or_else(|| "pcmail-ctl agent".into());
    doctor::agent(&service, &polls, &machine, server_now, &start)
}

fn read_json(path: &Path) -> serde_json::Value {
    std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

/// pcmail in Claude Code's settings (the user's, then the project's and its local ones, in
/// Claude Code's precedence) and its installed plugins; the plugin's launcher when it is
/// installed and enabled, which is what Claude Code starts as the MCP server.
fn claude_settings(claude: &Path, project: &Path) -> (HooksSeen, Option<PathBuf>) {
    let user = claude.join("settings.json");
    let files = [user.clone(), project.join(".claude/settings.json"), project.join(".claude/settings.local.json")];
    let settings: Vec<serde_json::Value> = files.iter().map(|f| read_json(f)).collect();
    let wired = files
        .iter()
        .zip(&settings)
        .map(|(f, s)| (f.display().to_string(), doctor::hooked_events(s)))
        .filter(|(_, events)| !events.is_empty())
        .max_by_key(|(_, events)| events.len());
    let installed = read_json(&claude.join("plugins/installed_plugins.json"));
    let mut launcher = None;
    let plugin = doctor::installed_plugin(&installed).map(|(id, path)| {
        let enabled = doctor::plugin_enabled(&settings, &id);
        let root = Path::new(&path);
        let present = root.join("hooks/hooks.json").is_file();
        if enabled && present {
            launcher = Some(root.join("bin/pcmail-ctl")).filter(|l| l.is_file());
        }
        (id, enabled, present)
    });
    (HooksSeen { plugin, wired, user_settings: user.display().to_string() }, launcher)
}

/// Starts `command mcp` as Claude Code would and completes MCP's `initialize` over its stdio.
async fn start_mcp(command: &Path, home: &Path) -> McpStart {
    let spawned = tokio::process::Command::new(command)
        .arg("mcp")
        .env("PCMAIL_HOME", home)
        .env("PCMAIL_SERVER", NO_SERVER)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return McpStart::Failed(e.to_string()),
    };
    let answer = tokio::time::timeout(TIMEOUT, initialize(&mut child)).await;
    let _ = child.start_kill();
    let _ = child.wait().await;
    answer.unwrap_or(McpStart::TimedOut { secs: TIMEOUT.as_secs() })
}

/// Sends `initialize` and reads lines until its answer: the server's name and version, or why
/// there is none (an error answer, or the first line the process wrote to stderr as it ended).
async fn initialize(child: &mut tokio::process::Child) -> McpStart {
    let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "pcmail-ctl doctor", "version": env!("CARGO_PKG_VERSION")}}});
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return McpStart::Failed("its stdio could not be opened".into());
    };
    // A server that ended before reading (a plugin's launcher that found no pcmail-ctl) breaks
    // the pipe: what it said as it ended is still the answer.
    let written = stdin.write_all(format!("{request}\n").as_bytes()).await;
    let mut lines = BufReader::new(stdout).lines();
    while written.is_ok()
        && let Ok(Some(line)) = lines.next_line().await
    {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        if message["id"] != 1 {
            continue;
        }
        if let Some(error) = message["error"]["message"].as_str() {
            return McpStart::Failed(format!("initialize answered an error: {error}"));
        }
        let info = &message["result"]["serverInfo"];
        let text = |v: &serde_json::Value| v.as_str().unwrap_or("?").to_string();
        return McpStart::Answered { name: text(&info["name"]), version: text(&info["version"]) };
    }
    drop((stdin, lines));
    // The first thing it said is enough; a child that keeps running (or a grandchild holding
    // its stderr) is the caller's timeout's.
    if let Some(said) = first_said(child.stderr.take()).await {
        return McpStart::Failed(said);
    }
    match written {
        Err(e) => McpStart::Failed(format!("writing to it: {e}")),
        Ok(()) => {
            let status = child.wait().await.map(|s| s.to_string()).unwrap_or_default();
            McpStart::Failed(format!("it exited ({status})"))
        }
    }
}

/// The first line with something on it that a child wrote to `stderr`, read until it comes or
/// the stream ends.
async fn first_said(stderr: Option<tokio::process::ChildStderr>) -> Option<String> {
    let mut lines = BufReader::new(stderr?).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if !line.trim().is_empty() {
            return Some(line);
        }
    }
    None
}

/// The Telegram poller, when this PC has a bot.
fn poller(home: &Path) -> Poller {
    match crate::telegram::load(home) {
        Ok(None) => Poller::NotConfigured,
        Err(e) => Poller::Unknown(e.to_string()),
        Ok(Some(_)) => match crate::telegram::poller_running(home) {
            Ok(true) => Poller::Held,
            Ok(false) => Poller::Free,
            Err(e) => Poller::Unknown(e.to_string()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// X5: a server that closed its stdin before `initialize` came (the launcher of a plugin
    /// whose pcmail-ctl is missing) is reported by what it said, not by the broken pipe.
    #[cfg(unix)]
    #[tokio::test]
    async fn x5_an_mcp_server_gone_before_its_initialize_is_reported_by_what_it_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        let closed = dir.path().join("closed");
        let script =
            format!("exec 0<&-; : > '{}'; echo 'pcmail-ctl is not installed' >&2; sleep 0.2; exit 1", closed.display());
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let gone = async {
            while !closed.exists() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(TIMEOUT, gone).await.expect("the server closed its stdin");
        match initialize(&mut child).await {
            McpStart::Failed(why) => assert_eq!(why, "pcmail-ctl is not installed"),
            other => panic!("{other:?}"),
        }
    }
}
