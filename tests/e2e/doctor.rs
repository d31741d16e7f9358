//! X5 end to end: `pcmail-ctl doctor` on a PC set up as README says (a login over HTTPS with
//! the CA saved, the agent installed and polling, the hooks wired in `~/.claude/settings.json`),
//! then with one thing broken at a time: a wrong token, a CA it does not trust, its clock 10
//! minutes off (`faketime`), no hooks, and the agent stopped.
//!
//! The stopped agent: a poll older than 3 minutes is made without waiting 3 minutes by moving
//! time for everyone — `serve` restarted and `doctor` run under the same +4 min libfaketime —
//! so the clocks still agree and only the age of the agent's last poll (read on the server's
//! clock) is past the threshold. No flag or variable changes the threshold.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::harness::*;
use crate::operations::{ca, server_cert};

/// What README's "On each PC" wires in `settings.json`.
const HOOKS: &str = r#"{"hooks": {
  "SessionStart": [{"hooks": [{"type": "command", "command": "pcmail-ctl hook session-start"}]}],
  "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "pcmail-ctl hook user-prompt-submit"}]}],
  "PostToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "pcmail-ctl hook post-tool-use"}]}],
  "Stop": [{"hooks": [{"type": "command", "command": "pcmail-ctl hook stop"}]}]
}}"#;

/// One PC: its own HOME (Claude Code's settings, the service files) and PCMAIL_HOME, and no
/// server settings in the environment: what it knows is what `login` saved.
struct Pc {
    home: tempfile::TempDir,
    agent: Option<Child>,
}

impl Pc {
    fn pcmail_home(&self) -> PathBuf {
        self.home.path().join(".pcmail")
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("HOME", self.home.path())
            .env("PCMAIL_HOME", self.pcmail_home())
            .current_dir(self.home.path())
            .env("PCMAIL_LOG", "warn");
        for var in
            ["PCMAIL_SERVER", "PCMAIL_TOKEN", "PCMAIL_CA", "PCMAIL_AS", "CLAUDE_CONFIG_DIR", "PCMAIL_TELEGRAM_TOKEN"]
        {
            cmd.env_remove(var);
        }
        cmd
    }

    fn ctl(&self, args: &[&str]) -> Output {
        self.command(BIN).args(args).output().expect("pcmail-ctl")
    }

    /// `doctor`, optionally under `faketime -f OFFSET` (the wall clock only).
    fn doctor(&self, faked: Option<&str>) -> (i32, String) {
        let out = match faked {
            Some(offset) => self
                .command("faketime")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .args(["-f", offset, BIN, "doctor"])
                .output()
                .expect("faketime (apt-get install faketime; scripts/test does)"),
            None => self.ctl(&["doctor"]),
        };
        assert!(stderr(&out).is_empty(), "doctor wrote to stderr: {}", stderr(&out));
        (code(&out), stdout(&out))
    }

    fn start_agent(&mut self) {
        let child = self.command(BIN).args(["agent", "--wait", "5s"]).stdout(Stdio::null()).spawn().expect("agent");
        self.agent = Some(child);
    }

    fn stop_agent(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn config(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.pcmail_home().join("config.json")).expect("config.json");
        serde_json::from_str(&text).expect("config")
    }

    fn set_config(&self, config: &serde_json::Value) {
        std::fs::write(self.pcmail_home().join("config.json"), config.to_string()).expect("config.json");
    }
}

impl Drop for Pc {
    fn drop(&mut self) {
        self.stop_agent();
    }
}

/// The report's line for `check`, which must be there exactly once.
#[track_caller]
fn line<'a>(report: &'a str, check: &str) -> &'a str {
    let lines: Vec<&str> = report.lines().filter(|l| l.split_whitespace().nth(1) == Some(check)).collect();
    assert_eq!(lines.len(), 1, "one {check} line in:\n{report}");
    lines[0]
}

/// Exit 1, `check` failed with a fix naming `fix`, and every other check is ok or skipped.
#[track_caller]
fn fails_only(outcome: &(i32, String), check: &str, what: &str, fix: &str) {
    let (code, report) = outcome;
    assert_eq!(*code, 1, "{report}");
    let l = line(report, check);
    assert!(l.starts_with("FAIL ") && l.contains(what), "{check} should fail with {what:?}:\n{report}");
    let (_, sentence) = l.split_once(". Fix: ").unwrap_or_else(|| panic!("no fix on: {l}"));
    assert!(sentence.contains(fix), "{check}'s fix should name {fix:?}: {l}");
    let others: Vec<&str> =
        report.lines().filter(|l| l.starts_with("FAIL ") && !l.contains(&format!(" {check} "))).collect();
    assert!(others.is_empty(), "only {check} fails:\n{report}");
}

/// The machine's last poll, as the server's machines list says it (admin, over HTTPS).
fn last_poll(s: &Server, ca: &Path, machine: &str) -> Option<String> {
    let pem = std::fs::read(ca).expect("ca");
    let http = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
        .build()
        .expect("client");
    let seen: serde_json::Value =
        http.get(format!("{}/api/v1/machines", s.url)).bearer_auth(s.admin_token()).send().ok()?.json().ok()?;
    seen.as_array()?.iter().find(|m| m["name"] == machine).map(|m| m["lastPollAt"].to_string())
}

#[test]
fn x5_doctor_passes_a_healthy_pc_and_names_each_broken_check_and_its_fix_in_turn() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca_pem = ca(pki.path(), "doctor");
    let (cert, key) = (pki.path().join("server.pem"), pki.path().join("server.key"));
    server_cert(&ca_pem, &cert, &key);
    let mut s = Server::start_tls(&format!("127.0.0.2:{}", free_port()), &cert, &key, &ca_pem);
    let token = s.token("laptop");

    let mut pc = Pc { home: tempfile::tempdir().expect("home"), agent: None };
    let ca_arg = ca_pem.display().to_string();
    ok(pc.ctl(&["login", "--server", &s.url, "--token", &token, "--ca", &ca_arg]));
    ok(pc.ctl(&["agent", "install", "--os", "linux"]));
    std::fs::create_dir_all(pc.home.path().join(".claude")).expect(".claude");
    let settings = pc.home.path().join(".claude/settings.json");
    std::fs::write(&settings, HOOKS).expect("settings.json");
    pc.start_agent();
    eventually(30, "the agent's first poll", || last_poll(&s, &ca_pem, "laptop"));

    // Healthy: every check, in order, ok.
    let (exit, report) = pc.doctor(None);
    assert_eq!(exit, 0, "{report}");
    let checks: Vec<&str> = report.lines().filter_map(|l| l.split_whitespace().nth(1)).collect();
    assert_eq!(checks, ["config", "server", "tls", "token", "clock", "agent", "hooks", "mcp", "telegram"], "{report}");
    assert!(report.lines().all(|l| l.starts_with("ok ")), "{report}");
    assert!(line(&report, "tls").contains("trusted") && line(&report, "token").contains("laptop"), "{report}");
    let json = json(pc.ctl(&["doctor", "-o", "json"]));
    assert_eq!((json["kind"].as_str(), json["healthy"].as_bool()), (Some("Doctor"), Some(true)), "{json}");
    assert!(json["checks"].as_array().unwrap().iter().all(|c| c["status"] == "ok" && c["fix"].is_null()), "{json}");

    // A wrong token.
    let good = pc.config();
    let mut wrong = good.clone();
    wrong["token"] = "pcm_not_this_machines_token".into();
    pc.set_config(&wrong);
    fails_only(&pc.doctor(None), "token", "token rejected", "pcmail-ctl login");
    let out = pc.ctl(&["doctor", "-o", "json"]);
    assert_eq!(code(&out), 1);
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(json["healthy"], false);

    // A CA this PC does not trust: the server answers, its certificate is the trouble.
    let mut untrusting = good.clone();
    untrusting.as_object_mut().unwrap().remove("ca");
    pc.set_config(&untrusting);
    let outcome = pc.doctor(None);
    fails_only(&outcome, "tls", "not trusted", "PCMAIL_CA");
    assert!(line(&outcome.1, "server").starts_with("ok "), "{}", outcome.1);
    pc.set_config(&good);

    // This PC's clock 10 minutes ahead: the clock fails; the agent's poll is still fresh,
    // being judged on the server's clock.
    let outcome = pc.doctor(Some("+10m"));
    fails_only(&outcome, "clock", "10m 0s ahead of the server's", "network time");
    assert!(line(&outcome.1, "agent").starts_with("ok "), "{}", outcome.1);

    // No hooks in Claude Code.
    std::fs::remove_file(&settings).expect("rm settings.json");
    fails_only(&pc.doctor(None), "hooks", "no pcmail hooks or plugin", "/plugin install pcmail@pcmail");
    std::fs::write(&settings, HOOKS).expect("settings.json");
    assert_eq!(pc.doctor(None).0, 0, "healthy again");

    // The agent stopped, and 4 minutes pass for the server and the PC alike.
    pc.stop_agent();
    let preload = crate::clock::libfaketime().display().to_string();
    s.set_env(&[("LD_PRELOAD", &preload), ("FAKETIME", "+240"), ("FAKETIME_DONT_FAKE_MONOTONIC", "1")]);
    s.restart();
    let outcome = pc.doctor(Some("+4m"));
    // The server's clock reaches doctor as the Date header's whole seconds, so a last poll less
    // than a second before reads 3m 59s: the check is that it fails, past the 3 minutes.
    fails_only(
        &outcome,
        "agent",
        "not polling: the last poll from laptop is ",
        "systemctl --user enable --now pcmail-agent.service",
    );
}

/// The plugin as the real Claude Code installs it (skipped where `claude` is not installed):
/// found in `~/.claude/plugins`, its launcher started as the MCP server — so a launcher that
/// finds no pcmail-ctl fails the MCP check — and a disabled plugin fails the hooks check.
#[test]
fn x5_doctor_finds_the_plugin_claude_code_installed_and_starts_the_mcp_server_through_its_launcher() {
    use crate::claude::{Habitat, in_own_netns, present};
    if !present() {
        return;
    }
    in_own_netns(|| {
        let pcmail_home = tempfile::tempdir().expect("pcmail home");
        let h = Habitat::new(pcmail_home.path(), false);
        let doctor = |env: &[(&str, &str)]| {
            let out = Command::new(BIN)
                .arg("doctor")
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env("HOME", &h.home)
                .env("PCMAIL_HOME", pcmail_home.path())
                .envs(env.iter().copied())
                .current_dir(&h.home)
                .output()
                .expect("doctor");
            // A report, whatever it finds: exit 0 or 1, never a crash or an error of its own.
            assert!(matches!(out.status.code(), Some(0 | 1)), "doctor ended {}: {}", out.status, stderr(&out));
            stdout(&out)
        };
        let report = doctor(&[("PCMAIL_CTL", BIN)]);
        let hooks = line(&report, "hooks");
        assert!(hooks.starts_with("ok ") && hooks.contains("pcmail@pcmail is installed and enabled"), "{report}");
        let mcp = line(&report, "mcp");
        assert!(
            mcp.starts_with("ok ") && mcp.contains("/plugins/cache/pcmail/") && mcp.contains("pcmail "),
            "{report}"
        );

        let report = doctor(&[]);
        let mcp = line(&report, "mcp");
        assert!(mcp.starts_with("FAIL ") && mcp.contains("pcmail-ctl is not installed"), "{report}");
        assert!(mcp.contains(". Fix: run `"), "{report}");

        let out = h.command().args(["plugin", "disable", "pcmail@pcmail"]).output().expect("claude plugin disable");
        assert!(out.status.success(), "{}", stderr(&out));
        let report = doctor(&[("PCMAIL_CTL", BIN)]);
        let hooks = line(&report, "hooks");
        assert!(hooks.starts_with("FAIL ") && hooks.contains("not enabled"), "{report}");
        assert!(hooks.contains("Fix: enable it (`claude plugin enable pcmail@pcmail`"), "{report}");
    });
}
