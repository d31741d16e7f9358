//! X5: `pcmail-ctl doctor`'s rules. What the shell observed on a PC (its login, what the server
//! answered, the files Claude Code reads, what a spawned MCP server said) comes in as values;
//! each check's verdict — ok, FAIL with the fix as a sentence, or skipped because an earlier
//! check failed — is decided here, with the time passed in.

use chrono::TimeDelta;
use serde::Serialize;

use crate::Ts;

/// The most the PC's clock may differ from the server's (tokens, leases and the unread SLA are
/// all read on the server's clock; a PC off by more misreads every age the server reports).
pub const MAX_SKEW: TimeDelta = TimeDelta::seconds(30);
/// A poll older than this means nothing polls: the agent long-polls for 30 s a cycle, and H1
/// starts a poll of its own past the same 3 minutes.
pub const MAX_POLL_AGE: TimeDelta = TimeDelta::minutes(3);
/// The hook events pcmail's hooks answer; a settings file wiring them names each one.
pub const HOOK_EVENTS: [&str; 4] = ["SessionStart", "UserPromptSubmit", "PostToolUse", "Stop"];

crate::wire_enum! {
    /// The checks, in the order they run and print.
    pub enum Check as "doctor check" {
        Config = "config",
        Server = "server",
        Tls = "tls",
        Token = "token",
        Clock = "clock",
        Agent = "agent",
        Hooks = "hooks",
        Mcp = "mcp",
        Telegram = "telegram",
    }
}

crate::wire_enum! {
    pub enum Status as "doctor status" {
        Ok = "ok",
        Fail = "fail",
        /// Not checked: an earlier check it needs failed (that one names the fix).
        Skip = "skip",
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: Check,
    pub status: Status,
    pub what: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn ok(check: Check, what: impl Into<String>) -> Finding {
        Finding { check, status: Status::Ok, what: what.into(), fix: None }
    }

    fn fail(check: Check, what: impl Into<String>, fix: impl Into<String>) -> Finding {
        Finding { check, status: Status::Fail, what: what.into(), fix: Some(fix.into()) }
    }

    fn skip(check: Check, what: impl Into<String>) -> Finding {
        Finding { check, status: Status::Skip, what: what.into(), fix: None }
    }

    /// `ok    token     …`, `FAIL  token     … Fix: ….`
    pub fn line(&self) -> String {
        let status = match self.status {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        let mut line = format!("{status:<5} {:<9} {}", self.check.as_str(), self.what);
        if let Some(fix) = &self.fix {
            line += &format!(". Fix: {fix}");
        }
        line
    }
}

/// 1 when any check failed, else 0 (a skip follows a failure, which already counts).
pub fn exit_code(findings: &[Finding]) -> i32 {
    i32::from(findings.iter().any(|f| f.status == Status::Fail))
}

/// `4m 2s`, `12s`, `1h 3m`: an age or a skew for people.
pub fn human(d: TimeDelta) -> String {
    let s = d.num_seconds().unsigned_abs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        _ => format!("{}h {}m", s / 3600, s % 3600 / 60),
    }
}

const LOGIN: &str = "run `pcmail-ctl login --server URL --token TOKEN` with this machine's token (from `pcmail-ctl token issue NAME` on the server)";

/// What `$PCMAIL_HOME/config.json` holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    Missing,
    Unreadable(String),
    Saved { server: String, token_empty: bool },
}

/// The login: a saved config with a server URL and a token. `overridden`: this run's flags or
/// environment name another server or token (the agent's service has neither).
pub fn config(home: &str, config_file: &str, login: &Login, overridden: bool) -> Finding {
    match login {
        Login::Missing => {
            Finding::fail(Check::Config, format!("no login in PCMAIL_HOME {home} ({config_file} is missing)"), LOGIN)
        }
        Login::Unreadable(why) => {
            Finding::fail(Check::Config, format!("{config_file}: {why}"), format!("{LOGIN} to write it again"))
        }
        Login::Saved { server, .. } if !(server.starts_with("http://") || server.starts_with("https://")) => {
            Finding::fail(Check::Config, format!("the saved server URL {server:?} is not http:// or https://"), LOGIN)
        }
        Login::Saved { token_empty: true, .. } => {
            Finding::fail(Check::Config, format!("{config_file} holds no token"), LOGIN)
        }
        Login::Saved { server, .. } => {
            let note =
                if overridden { "; this run's --server/--token or PCMAIL_SERVER/PCMAIL_TOKEN override it" } else { "" };
            Finding::ok(Check::Config, format!("logged in to {server} ({config_file}){note}"))
        }
    }
}

/// What asking the server's version route (which needs no token) met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contact {
    /// An HTTP answer; `date` is its `Date` header.
    Answered {
        date: Option<Ts>,
    },
    /// The TLS handshake met a certificate this PC does not trust: the server is there.
    Untrusted(String),
    Unreachable(String),
    /// No client could be made: no token, or a CA file that is not PEM.
    NoClient(String),
}

impl Contact {
    fn answered(&self) -> bool {
        matches!(self, Contact::Answered { .. })
    }
}

pub fn server(base: &str, contact: &Contact) -> Finding {
    match contact {
        Contact::Answered { .. } => Finding::ok(Check::Server, format!("{base} answers")),
        Contact::Untrusted(_) => Finding::ok(Check::Server, format!("{base} answers (its TLS certificate: below)")),
        Contact::Unreachable(why) => Finding::fail(
            Check::Server,
            format!("cannot reach {base}: {why}"),
            "start `pcmail-ctl serve` there, or check the URL (`pcmail-ctl login --server URL …`) and the network",
        ),
        Contact::NoClient(why) => Finding::fail(
            Check::Server,
            format!("not asked: {why}"),
            "log in (`pcmail-ctl login --server URL --token TOKEN`), and give --ca or PCMAIL_CA only a PEM file",
        ),
    }
}

pub fn tls(base: &str, contact: &Contact) -> Finding {
    match contact {
        _ if !base.starts_with("https://") && contact.answered() => {
            Finding::ok(Check::Tls, "not used (http://): fine on loopback or a trusted network")
        }
        Contact::Answered { .. } => Finding::ok(Check::Tls, "the server's certificate is trusted"),
        Contact::Untrusted(why) => Finding::fail(
            Check::Tls,
            format!("the server's certificate is not trusted by this PC ({why})"),
            "give the CA that signed it: `pcmail-ctl login --server URL --token TOKEN --ca FILE` saves it, or set PCMAIL_CA=FILE (or pass --ca FILE)",
        ),
        Contact::Unreachable(_) | Contact::NoClient(_) => {
            Finding::skip(Check::Tls, "not checked: the server did not answer")
        }
    }
}

/// What the machine-authenticated `whoami` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenAnswer {
    Machine(String),
    Admin,
    Rejected { status: u16, message: String },
    Failed(String),
}

pub fn token(answer: Option<&TokenAnswer>) -> Finding {
    match answer {
        None => Finding::skip(Check::Token, "not checked: the server did not answer"),
        Some(TokenAnswer::Machine(m)) => Finding::ok(Check::Token, format!("valid: this PC is {m}")),
        Some(TokenAnswer::Admin) => Finding::fail(
            Check::Token,
            "this PC's token is the admin token, not a machine's",
            format!("{LOGIN}; the admin token stays on the server"),
        ),
        Some(TokenAnswer::Rejected { status, message }) => {
            Finding::fail(Check::Token, format!("token rejected ({status}: {message})"), LOGIN)
        }
        Some(TokenAnswer::Failed(why)) => Finding::fail(
            Check::Token,
            format!("the token could not be checked: {why}"),
            "run `pcmail-ctl doctor` again; if it repeats, look at the server's log",
        ),
    }
}

/// `local`: this PC's clock when the answer arrived; the server's is its `Date` header (whole
/// seconds, so up to 1 s of the difference is the header's rounding).
pub fn clock(local: Ts, contact: &Contact) -> Finding {
    let server = match contact {
        Contact::Answered { date: Some(d) } => *d,
        Contact::Answered { date: None } => {
            return Finding::skip(Check::Clock, "not checked: the server's answer has no Date header");
        }
        _ => return Finding::skip(Check::Clock, "not checked: the server did not answer"),
    };
    let skew = local - server;
    let way = if skew >= TimeDelta::zero() { "ahead of" } else { "behind" };
    let what = format!("this PC's clock is {} {way} the server's", human(skew));
    if skew.abs() <= MAX_SKEW {
        return Finding::ok(Check::Clock, format!("{what} (at most {} allowed)", human(MAX_SKEW)));
    }
    Finding::fail(
        Check::Clock,
        format!("{what}, over the {} allowed", human(MAX_SKEW)),
        "set the clocks right with network time on this PC and the server (Linux: `timedatectl set-ntp true`; macOS, Windows: set the time automatically)",
    )
}

/// The agent's service file, where `agent install` writes it for this OS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Service {
    Installed(String),
    Missing(String),
}

/// The machine's last poll as the server keeps it (V1's machines list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Polls {
    /// `None`: the server has no poll from it at all.
    Seen(Option<Ts>),
    NotChecked,
}

/// Installed and polling: the service file exists and the server's last poll from `machine`
/// is at most [`MAX_POLL_AGE`] old on the server's clock (`server_now`), so a skewed PC clock
/// does not fail this check too. `start` is the OS's command that starts the service.
pub fn agent(service: &Service, polls: &Polls, machine: &str, server_now: Ts, start: &str) -> Finding {
    let installed = match service {
        Service::Missing(path) => {
            return Finding::fail(
                Check::Agent,
                format!("no agent service ({path} is missing)"),
                "run `pcmail-ctl agent install` and the commands it prints",
            );
        }
        Service::Installed(path) => path,
    };
    let start_it = format!("start the agent (`{start}`, or `pcmail-ctl agent` by hand) and read its log if it stops");
    match polls {
        Polls::NotChecked => Finding::skip(
            Check::Agent,
            format!("installed ({installed}); its polls not checked: the server did not answer"),
        ),
        Polls::Seen(None) => {
            Finding::fail(Check::Agent, format!("installed, but the server has no poll from {machine} yet"), start_it)
        }
        Polls::Seen(Some(at)) => {
            let age = (server_now - *at).max(TimeDelta::zero());
            if age <= MAX_POLL_AGE {
                Finding::ok(Check::Agent, format!("installed ({installed}); last poll {} ago", human(age)))
            } else {
                Finding::fail(
                    Check::Agent,
                    format!(
                        "not polling: the last poll from {machine} is {} old (over {})",
                        human(age),
                        human(MAX_POLL_AGE)
                    ),
                    start_it,
                )
            }
        }
    }
}

/// The hook events of one Claude Code settings file whose commands run `pcmail-ctl hook …`
/// (directly, or through a launcher whose path ends in `pcmail-ctl`).
pub fn hooked_events(settings: &serde_json::Value) -> Vec<&'static str> {
    let names_pcmail = |group: &serde_json::Value| {
        group["hooks"].as_array().is_some_and(|hooks| {
            hooks
                .iter()
                .any(|h| h["command"].as_str().is_some_and(|c| c.contains("pcmail-ctl") && c.contains(" hook ")))
        })
    };
    HOOK_EVENTS
        .into_iter()
        .filter(|event| settings["hooks"][*event].as_array().is_some_and(|groups| groups.iter().any(names_pcmail)))
        .collect()
}

/// The pcmail plugin as Claude Code keeps it: its id (`pcmail@MARKETPLACE`) and install path
/// from `plugins/installed_plugins.json`, if installed.
pub fn installed_plugin(installed: &serde_json::Value) -> Option<(String, String)> {
    let plugins = installed["plugins"].as_object()?;
    plugins.iter().filter(|(id, _)| id.split('@').next() == Some("pcmail")).find_map(|(id, entries)| {
        let path = entries.as_array()?.iter().find_map(|e| e["installPath"].as_str())?;
        Some((id.clone(), path.to_string()))
    })
}

/// Whether `id` is enabled: the last settings file (in Claude Code's precedence, lowest first)
/// that says so decides; none saying means not enabled.
pub fn plugin_enabled(settings: &[serde_json::Value], id: &str) -> bool {
    settings.iter().rev().find_map(|s| s["enabledPlugins"][id].as_bool()).unwrap_or(false)
}

/// What was found of pcmail in Claude Code's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HooksSeen {
    /// The plugin: id, whether enabled, whether its install path is still there.
    pub plugin: Option<(String, bool, bool)>,
    /// The settings file with the most pcmail hook events, and those events.
    pub wired: Option<(String, Vec<&'static str>)>,
    /// Where the user's settings live (named in the fix).
    pub user_settings: String,
}

const INSTALL_PLUGIN: &str = "install the plugin (in Claude Code: `/plugin marketplace add /path/to/pcmail`, then `/plugin install pcmail@pcmail`)";

pub fn hooks(seen: &HooksSeen) -> Finding {
    match &seen.plugin {
        Some((id, true, true)) => {
            return Finding::ok(Check::Hooks, format!("the plugin {id} is installed and enabled"));
        }
        Some((id, true, false)) => {
            return Finding::fail(
                Check::Hooks,
                format!("the plugin {id} is enabled but its files are gone"),
                format!("reinstall it (`claude plugin install {id}`)"),
            );
        }
        _ => {}
    }
    match (&seen.wired, &seen.plugin) {
        (Some((file, events)), _) if events.len() == HOOK_EVENTS.len() => {
            Finding::ok(Check::Hooks, format!("{file} runs pcmail-ctl's hooks ({})", events.join(", ")))
        }
        (Some((file, events)), _) => {
            let missing: Vec<&str> = HOOK_EVENTS.into_iter().filter(|e| !events.contains(e)).collect();
            Finding::fail(
                Check::Hooks,
                format!("{file} runs pcmail-ctl's hooks for {} but not {}", events.join(", "), missing.join(", ")),
                format!("add the missing events as README's \"On each PC\" shows them, or {INSTALL_PLUGIN}"),
            )
        }
        (None, Some((id, false, _))) => Finding::fail(
            Check::Hooks,
            format!("the plugin {id} is installed but not enabled"),
            format!("enable it (`claude plugin enable {id}`, or `/plugin` in Claude Code)"),
        ),
        (None, _) => Finding::fail(
            Check::Hooks,
            "no pcmail hooks or plugin in Claude Code's settings",
            format!("{INSTALL_PLUGIN}, or wire the hooks of README's \"On each PC\" in {}", seen.user_settings),
        ),
    }
}

/// What starting `pcmail-ctl mcp` and its `initialize` met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpStart {
    Answered { name: String, version: String },
    Failed(String),
    TimedOut { secs: u64 },
}

/// `command`: what was started (the plugin's launcher, or this pcmail-ctl).
pub fn mcp(command: &str, start: &McpStart) -> Finding {
    let run_it = format!("run `{command} mcp` in a terminal to see why, and fix what it says");
    match start {
        McpStart::Answered { name, version } => {
            Finding::ok(Check::Mcp, format!("`{command} mcp` starts and answers initialize ({name} {version})"))
        }
        McpStart::Failed(why) => Finding::fail(Check::Mcp, format!("`{command} mcp` did not start: {why}"), run_it),
        McpStart::TimedOut { secs } => {
            Finding::fail(Check::Mcp, format!("`{command} mcp` did not answer initialize within {secs}s"), run_it)
        }
    }
}

/// The Telegram poller's lock (`telegram.lock`, an advisory lock the kernel drops with its
/// holder, so a held lock is always a live process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poller {
    NotConfigured,
    Held,
    Free,
    Unknown(String),
}

pub fn telegram(poller: &Poller) -> Finding {
    match poller {
        Poller::NotConfigured => Finding::ok(Check::Telegram, "no bot configured on this PC (nothing to poll)"),
        Poller::Held => {
            Finding::ok(Check::Telegram, "the bot is polled by a process on this PC (it holds telegram.lock)")
        }
        Poller::Free => Finding::fail(
            Check::Telegram,
            "a bot is configured but no process on this PC polls it (telegram.lock is free)",
            "start the agent (`pcmail-ctl agent`, or its service): it polls the bot",
        ),
        Poller::Unknown(why) => Finding::fail(
            Check::Telegram,
            format!("the poller's lock cannot be read: {why}"),
            "make PCMAIL_HOME writable by this user (`pcmail-ctl telegram status` says more)",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: i64) -> Ts {
        chrono::DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn x5_clock_skew_fails_past_30_seconds_either_way_and_names_the_direction() {
        let answered = |s| Contact::Answered { date: Some(at(s)) };
        assert_eq!(clock(at(30), &answered(0)).status, Status::Ok);
        assert_eq!(clock(at(-30), &answered(0)).status, Status::Ok);
        let ahead = clock(at(600), &answered(0));
        assert_eq!(ahead.status, Status::Fail);
        assert!(ahead.what.contains("10m 0s ahead of"), "{}", ahead.what);
        assert!(ahead.fix.as_deref().unwrap().contains("network time"));
        let behind = clock(at(0), &answered(31));
        assert!(behind.status == Status::Fail && behind.what.contains("31s behind"), "{}", behind.what);
        assert_eq!(clock(at(0), &Contact::Unreachable("refused".into())).status, Status::Skip);
        assert_eq!(clock(at(0), &Contact::Answered { date: None }).status, Status::Skip);
    }

    #[test]
    fn x5_agent_polling_fails_past_3_minutes_on_the_servers_clock_and_without_a_service() {
        let installed = Service::Installed("/h/.config/systemd/user/pcmail-agent.service".into());
        let start = "systemctl --user enable --now pcmail-agent.service";
        let seen = |s| Polls::Seen(Some(at(s)));
        assert_eq!(agent(&installed, &seen(0), "laptop", at(180), start).status, Status::Ok);
        let old = agent(&installed, &seen(0), "laptop", at(181), start);
        assert_eq!(old.status, Status::Fail);
        assert!(old.what.contains("3m 1s old") && old.fix.as_deref().unwrap().contains(start), "{old:?}");
        assert_eq!(agent(&installed, &Polls::Seen(None), "laptop", at(0), start).status, Status::Fail);
        assert_eq!(agent(&installed, &Polls::NotChecked, "laptop", at(0), start).status, Status::Skip);
        let missing = agent(&Service::Missing("/x".into()), &seen(0), "laptop", at(0), start);
        assert!(missing.status == Status::Fail && missing.fix.unwrap().contains("agent install"));
        // A poll "after" the server's clock (rounding of the Date header) is a fresh one.
        assert_eq!(agent(&installed, &seen(2), "laptop", at(0), start).status, Status::Ok);
    }

    #[test]
    fn x5_tls_trouble_is_told_apart_from_an_unreachable_server() {
        let https = "https://box:7420";
        let untrusted = Contact::Untrusted("UnknownIssuer".into());
        assert_eq!(server(https, &untrusted).status, Status::Ok);
        let t = tls(https, &untrusted);
        assert!(t.status == Status::Fail && t.fix.as_deref().unwrap().contains("PCMAIL_CA"), "{t:?}");
        let down = Contact::Unreachable("connection refused".into());
        assert_eq!(server(https, &down).status, Status::Fail);
        assert_eq!(tls(https, &down).status, Status::Skip);
        assert_eq!(tls("http://127.0.0.1:7420", &Contact::Answered { date: None }).status, Status::Ok);
    }

    #[test]
    fn x5_a_rejected_token_says_run_login_and_the_admin_token_is_not_a_pcs() {
        let r = token(Some(&TokenAnswer::Rejected { status: 401, message: "unknown token".into() }));
        assert!(r.status == Status::Fail && r.what.starts_with("token rejected"));
        assert!(r.line().contains("Fix: run `pcmail-ctl login"), "{}", r.line());
        assert_eq!(token(Some(&TokenAnswer::Admin)).status, Status::Fail);
        assert_eq!(token(Some(&TokenAnswer::Machine("laptop".into()))).status, Status::Ok);
        assert_eq!(token(None).status, Status::Skip);
    }

    #[test]
    fn x5_config_needs_a_saved_login_with_an_http_url_and_a_token() {
        let saved = |server: &str, token_empty| Login::Saved { server: server.into(), token_empty };
        assert_eq!(config("/h", "/h/config.json", &saved("https://box", false), false).status, Status::Ok);
        assert_eq!(config("/h", "/h/config.json", &saved("box:7420", false), false).status, Status::Fail);
        assert_eq!(config("/h", "/h/config.json", &saved("https://box", true), false).status, Status::Fail);
        let missing = config("/h", "/h/config.json", &Login::Missing, true);
        assert!(missing.status == Status::Fail && missing.fix.unwrap().contains("pcmail-ctl login"));
    }

    #[test]
    fn x5_hooks_pass_with_every_event_wired_or_the_plugin_enabled() {
        let wired = json!({"hooks": {
            "SessionStart": [{"hooks": [{"type": "command", "command": "pcmail-ctl hook session-start"}]}],
            "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "/opt/pcmail-ctl hook user-prompt-submit"}]}],
            "PostToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "pcmail-ctl hook post-tool-use"}]}],
            "Stop": [{"hooks": [{"type": "command", "command": "other-tool stop"}]}]
        }});
        assert_eq!(hooked_events(&wired), ["SessionStart", "UserPromptSubmit", "PostToolUse"]);
        let seen = |plugin, wired| HooksSeen { plugin, wired, user_settings: "~/.claude/settings.json".into() };
        let partial = hooks(&seen(None, Some(("s.json".into(), hooked_events(&wired)))));
        assert!(partial.status == Status::Fail && partial.what.contains("not Stop"), "{partial:?}");
        assert_eq!(hooks(&seen(None, Some(("s.json".into(), HOOK_EVENTS.to_vec())))).status, Status::Ok);
        let none = hooks(&seen(None, None));
        assert!(none.status == Status::Fail && none.fix.as_deref().unwrap().contains("/plugin install pcmail@pcmail"));

        // As Claude Code 2.1.197 writes an installed plugin.
        let installed = json!({"version": 2, "plugins": {"pcmail@pcmail": [
            {"scope": "user", "installPath": "/h/.claude/plugins/cache/pcmail/pcmail/0.2.0", "version": "0.2.0"}]}});
        let (id, path) = installed_plugin(&installed).unwrap();
        assert_eq!((id.as_str(), path.as_str()), ("pcmail@pcmail", "/h/.claude/plugins/cache/pcmail/pcmail/0.2.0"));
        assert_eq!(installed_plugin(&json!({"plugins": {"telegram@official": [{"installPath": "/x"}]}})), None);
        let user = json!({"enabledPlugins": {"pcmail@pcmail": true}});
        let project = json!({"enabledPlugins": {"pcmail@pcmail": false}});
        assert!(plugin_enabled(std::slice::from_ref(&user), &id));
        assert!(!plugin_enabled(&[user, project], &id), "the project's settings come after the user's");
        assert_eq!(hooks(&seen(Some((id.clone(), true, true)), None)).status, Status::Ok);
        let disabled = hooks(&seen(Some((id.clone(), false, true)), None));
        assert!(disabled.status == Status::Fail && disabled.fix.unwrap().contains("claude plugin enable"));
        assert_eq!(hooks(&seen(Some((id, true, false)), None)).status, Status::Fail);
    }

    #[test]
    fn x5_telegram_fails_only_when_a_configured_bot_has_no_poller() {
        assert_eq!(telegram(&Poller::NotConfigured).status, Status::Ok);
        assert_eq!(telegram(&Poller::Held).status, Status::Ok);
        let free = telegram(&Poller::Free);
        assert!(free.status == Status::Fail && free.fix.unwrap().contains("agent"));
    }

    #[test]
    fn x5_exit_1_on_any_failure_and_each_line_names_its_check_and_fix() {
        let good = vec![telegram(&Poller::Held), token(None)];
        assert_eq!(exit_code(&good), 0, "a skip alone does not fail");
        let bad = [good, vec![mcp("pcmail-ctl", &McpStart::TimedOut { secs: 10 })]].concat();
        assert_eq!(exit_code(&bad), 1);
        let line = bad[2].line();
        assert!(line.starts_with("FAIL  mcp ") && line.contains(". Fix: run `pcmail-ctl mcp`"), "{line}");
        assert_eq!(human(TimeDelta::seconds(3725)), "1h 2m");
    }
}
