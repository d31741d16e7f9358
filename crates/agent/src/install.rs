//! `agent install` and `agent heal` (A5): the agent as a service on Linux (systemd user units),
//! macOS (launchd) and Windows (Task Scheduler), each with a heal task every 5 minutes that
//! re-registers the agent when its last result is a failure or its last poll is over 10 min old.

use std::path::{Path, PathBuf};

use pcmail_core::agent::TaskResult;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    Linux,
    MacOs,
    Windows,
}

impl Os {
    pub fn current() -> Os {
        if cfg!(target_os = "macos") {
            Os::MacOs
        } else if cfg!(windows) {
            Os::Windows
        } else {
            Os::Linux
        }
    }

    pub fn from_cli(s: &str) -> Option<Os> {
        match s {
            "linux" => Some(Os::Linux),
            "macos" => Some(Os::MacOs),
            "windows" => Some(Os::Windows),
            _ => None,
        }
    }
}

pub const LAUNCHD_LABEL: &str = "com.pcmail.agent";
pub const TASK_NAME: &str = "pcmail-agent";

/// One file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitFile {
    pub name: String,
    pub contents: String,
}

/// The files that run `exe agent` as a service with `home` as PCMAIL_HOME, and the commands
/// that enable them.
pub fn units(os: Os, exe: &Path, home: &Path) -> (Vec<UnitFile>, Vec<String>) {
    let exe = exe.display();
    let home = home.display();
    match os {
        Os::Linux => (
            vec![
                UnitFile {
                    name: "pcmail-agent.service".into(),
                    contents: format!(
                        "[Unit]\nDescription=pcmail agent: polls mail for this PC\nAfter=network-online.target\n\n\
                         [Service]\nEnvironment=PCMAIL_HOME={home}\nExecStart={exe} agent\nRestart=always\nRestartSec=10\n\n\
                         [Install]\nWantedBy=default.target\n"
                    ),
                },
                UnitFile {
                    name: "pcmail-agent-heal.service".into(),
                    contents: format!(
                        "[Unit]\nDescription=pcmail agent self-heal\n\n[Service]\nType=oneshot\nEnvironment=PCMAIL_HOME={home}\nExecStart={exe} agent heal\n"
                    ),
                },
                UnitFile {
                    name: "pcmail-agent-heal.timer".into(),
                    contents: "[Unit]\nDescription=pcmail agent self-heal every 5 minutes\n\n[Timer]\nOnBootSec=5min\nOnUnitActiveSec=5min\n\n[Install]\nWantedBy=timers.target\n".into(),
                },
            ],
            vec!["systemctl --user daemon-reload".into(), "systemctl --user enable --now pcmail-agent.service pcmail-agent-heal.timer".into()],
        ),
        Os::MacOs => {
            let plist = |label: &str, args: &[&str], extra: &str| {
                let args: String = args.iter().map(|a| format!("    <string>{a}</string>\n")).collect();
                format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
                     <plist version=\"1.0\">\n<dict>\n  <key>Label</key><string>{label}</string>\n  <key>ProgramArguments</key>\n  <array>\n    <string>{exe}</string>\n{args}  </array>\n  \
                     <key>EnvironmentVariables</key><dict><key>PCMAIL_HOME</key><string>{home}</string></dict>\n  <key>RunAtLoad</key><true/>\n{extra}</dict>\n</plist>\n"
                )
            };
            (
                vec![
                    UnitFile { name: format!("{LAUNCHD_LABEL}.plist"), contents: plist(LAUNCHD_LABEL, &["agent"], "  <key>KeepAlive</key><true/>\n") },
                    UnitFile {
                        name: format!("{LAUNCHD_LABEL}.heal.plist"),
                        contents: plist(&format!("{LAUNCHD_LABEL}.heal"), &["agent", "heal"], "  <key>StartInterval</key><integer>300</integer>\n"),
                    },
                ],
                vec![
                    format!("launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/{LAUNCHD_LABEL}.plist"),
                    format!("launchctl bootstrap gui/$(id -u) ~/Library/LaunchAgents/{LAUNCHD_LABEL}.heal.plist"),
                ],
            )
        }
        Os::Windows => {
            let task = |args: &str, trigger: &str| {
                format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-16\"?>\n<Task version=\"1.2\" xmlns=\"http://schemas.microsoft.com/windows/2004/02/mit/task\">\n  \
                     <Triggers>\n{trigger}  </Triggers>\n  <Settings>\n    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>\n    \
                     <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>\n    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>\n    \
                     <ExecutionTimeLimit>PT0S</ExecutionTimeLimit>\n    <RestartOnFailure><Interval>PT1M</Interval><Count>999</Count></RestartOnFailure>\n  </Settings>\n  \
                     <Actions>\n    <Exec>\n      <Command>{exe}</Command>\n      <Arguments>{args}</Arguments>\n    </Exec>\n  </Actions>\n</Task>\n"
                )
            };
            let logon = "    <LogonTrigger><Enabled>true</Enabled></LogonTrigger>\n";
            let every5 = "    <TimeTrigger><StartBoundary>2026-01-01T00:00:00</StartBoundary><Repetition><Interval>PT5M</Interval></Repetition><Enabled>true</Enabled></TimeTrigger>\n";
            (
                vec![
                    UnitFile { name: format!("{TASK_NAME}.xml"), contents: task("agent", logon) },
                    UnitFile { name: format!("{TASK_NAME}-heal.xml"), contents: task("agent heal", every5) },
                ],
                vec![
                    format!("setx PCMAIL_HOME \"{home}\""),
                    format!("schtasks /Create /TN {TASK_NAME} /XML {TASK_NAME}.xml /F"),
                    format!("schtasks /Create /TN {TASK_NAME}-heal /XML {TASK_NAME}-heal.xml /F"),
                    format!("schtasks /Run /TN {TASK_NAME}"),
                ],
            )
        }
    }
}

/// Where the OS looks for the files of [`units`].
pub fn default_dir(os: Os) -> PathBuf {
    let home =
        std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE")).map(PathBuf::from).unwrap_or_default();
    match os {
        Os::Linux => home.join(".config/systemd/user"),
        Os::MacOs => home.join("Library/LaunchAgents"),
        Os::Windows => crate::client::home(),
    }
}

/// Reads "Last Result" from `schtasks /Query /V /FO LIST` output.
pub fn parse_schtasks_last_result(output: &str) -> Option<TaskResult> {
    let value = output.lines().find_map(|l| l.trim().strip_prefix("Last Result:"))?.trim();
    let code = match value.strip_prefix("0x") {
        Some(hex) => i64::from_str_radix(hex, 16).ok()?,
        None => value.parse().ok()?,
    };
    Some(TaskResult::from_windows(code))
}

/// The installed agent's last result, as the OS reports it.
pub fn task_result(os: Os) -> TaskResult {
    let run = |cmd: &str, args: &[&str]| std::process::Command::new(cmd).args(args).output().ok();
    match os {
        Os::Linux => match run("systemctl", &["--user", "is-failed", "pcmail-agent.service"]) {
            Some(out) if String::from_utf8_lossy(&out.stdout).trim() == "failed" => TaskResult::Failed(1),
            Some(_) => TaskResult::Running,
            None => TaskResult::NotYetRun,
        },
        Os::MacOs => match run("launchctl", &["list", LAUNCHD_LABEL]) {
            Some(out) if out.status.success() => {
                let text = String::from_utf8_lossy(&out.stdout);
                let status = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("\"LastExitStatus\" = "))
                    .map(|v| v.trim_end_matches(';').trim().to_string());
                match status.and_then(|s| s.parse::<i64>().ok()) {
                    Some(0) | None => TaskResult::Running,
                    Some(code) => TaskResult::Failed(code),
                }
            }
            _ => TaskResult::NotYetRun,
        },
        Os::Windows => run("schtasks", &["/Query", "/TN", TASK_NAME, "/V", "/FO", "LIST"])
            .and_then(|o| parse_schtasks_last_result(&String::from_utf8_lossy(&o.stdout)))
            .unwrap_or(TaskResult::NotYetRun),
    }
}

/// Re-registers (restarts) the installed agent.
pub fn reregister(os: Os) -> std::io::Result<()> {
    let (cmd, args): (&str, Vec<String>) = match os {
        Os::Linux => ("systemctl", vec!["--user".into(), "restart".into(), "pcmail-agent.service".into()]),
        Os::MacOs => ("launchctl", vec!["kickstart".into(), "-k".into(), format!("gui/{}/{LAUNCHD_LABEL}", uid())]),
        Os::Windows => ("schtasks", vec!["/Run".into(), "/TN".into(), TASK_NAME.into()]),
    };
    let status = std::process::Command::new(cmd).args(&args).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("{cmd} {} failed: {status}", args.join(" "))))
    }
}

fn uid() -> String {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "501".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a5_units_run_the_agent_and_a_heal_every_5_minutes_on_each_os() {
        let exe = Path::new("/opt/pcmail/pcmail-ctl");
        let home = Path::new("/home/kim/.pcmail");
        let (linux, enable) = units(Os::Linux, exe, home);
        assert!(linux[0].contents.contains("ExecStart=/opt/pcmail/pcmail-ctl agent\nRestart=always"));
        assert!(linux[0].contents.contains("Environment=PCMAIL_HOME=/home/kim/.pcmail"));
        assert!(linux[1].contents.contains("ExecStart=/opt/pcmail/pcmail-ctl agent heal"));
        assert!(linux[2].contents.contains("OnUnitActiveSec=5min"));
        assert!(enable[1].contains("enable --now"));
        let (mac, _) = units(Os::MacOs, exe, home);
        assert!(mac[0].contents.contains("<key>KeepAlive</key><true/>"));
        assert!(
            mac[1].contents.contains("<integer>300</integer>") && mac[1].contents.contains("<string>heal</string>")
        );
        let (win, cmds) = units(Os::Windows, exe, home);
        assert!(win[0].contents.contains("<LogonTrigger>") && win[0].contents.contains("<Arguments>agent</Arguments>"));
        assert!(
            win[1].contents.contains("<Interval>PT5M</Interval>")
                && win[1].contents.contains("<Arguments>agent heal</Arguments>")
        );
        assert!(cmds.iter().any(|c| c.contains("schtasks /Create /TN pcmail-agent /XML")));
    }

    #[test]
    fn a5_schtasks_last_result_running_and_not_yet_run_are_not_failures() {
        let out = |v: &str| format!("HostName: PC\nTaskName: \\pcmail-agent\nLast Result: {v}\nAuthor: kim\n");
        assert_eq!(parse_schtasks_last_result(&out("267009")), Some(TaskResult::Running));
        assert_eq!(parse_schtasks_last_result(&out("0x41303")), Some(TaskResult::NotYetRun));
        assert_eq!(parse_schtasks_last_result(&out("1")), Some(TaskResult::Failed(1)));
        assert_eq!(parse_schtasks_last_result("nothing"), None);
    }
}
