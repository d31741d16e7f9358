//! DESIGN §18 X1–X4 end to end: the habits people bring to a CLI — shell completion,
//! `explain` and a JSON Schema for editors, logs for a shipper, progress on long verbs.

use std::process::{Command, Stdio};

use crate::harness::*;

/// What bash's completion offers for `words` (the last one is being typed), with the script
/// `pcmail-ctl completion bash` printed sourced into a real bash.
fn bash_completes(script: &std::path::Path, words: &[&str]) -> Vec<String> {
    let words: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD=$((${{#COMP_WORDS[@]}}-1))\nCOMP_LINE=\"${{COMP_WORDS[*]}}\"\nCOMP_POINT=${{#COMP_LINE}}\n\
         fn=$(complete -p pcmail-ctl | sed -E 's/.*-F ([^ ]+).*/\\1/')\n\
         \"$fn\" pcmail-ctl \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script.display(),
        words.join(" ")
    );
    let out = Command::new("bash").arg("-c").arg(program).output().expect("bash");
    assert!(out.status.success(), "bash: {}", stderr(&out));
    stdout(&out).lines().map(str::to_string).filter(|l| !l.is_empty()).collect()
}

#[test]
fn x1_bash_completion_completes_verbs_kinds_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("pcmail-ctl.bash");
    let out = Command::new(BIN).args(["completion", "bash"]).output().unwrap();
    std::fs::write(&script, ok(out)).unwrap();
    assert_eq!(bash_completes(&script, &["pcmail-ctl", "ge"]), ["get"]);
    assert_eq!(bash_completes(&script, &["pcmail-ctl", "get", "ro"]), ["roster"]);
    assert_eq!(bash_completes(&script, &["pcmail-ctl", "delete", "workerp"]), ["workerpool"]);
    assert_eq!(bash_completes(&script, &["pcmail-ctl", "backup", "--da"]), ["--data-dir"]);
    let formats = bash_completes(&script, &["pcmail-ctl", "serve", "--log-format", ""]);
    assert_eq!(formats, ["text", "json"]);
    let nested = bash_completes(&script, &["pcmail-ctl", "jobs", "enqueue", "--uni"]);
    assert_eq!(nested, ["--unique-key", "--unique-for"]);
}

#[test]
fn x1_zsh_fish_and_powershell_scripts_are_generated_and_zsh_and_fish_parse_them() {
    let dir = tempfile::tempdir().unwrap();
    for (shell, check) in [("zsh", Some("zsh")), ("fish", Some("fish")), ("powershell", None)] {
        let out = Command::new(BIN).args(["completion", shell]).output().unwrap();
        let script = ok(out);
        assert!(script.contains("pcmail-ctl") && script.contains("get"), "{shell}: the verbs are offered");
        let Some(program) = check else { continue };
        assert!(script.contains("roster"), "{shell}: the kinds are offered");
        let path = dir.path().join(format!("pcmail-ctl.{shell}"));
        std::fs::write(&path, script).unwrap();
        let parsed = Command::new(program).arg("-n").arg(&path).output().expect(program);
        assert!(parsed.status.success(), "{shell} -n: {}", stderr(&parsed));
    }
}

/// A serve of its own whose stderr goes to `log` in `dir`, at the level and format given (no
/// PCMAIL_LOG, so `--log-level` holds); stopped once it logged `lines` lines.
fn serve_logging(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)], lines: usize) -> String {
    let log = dir.join("serve.log");
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--apply")
        .arg(examples())
        .args(args)
        .env_remove("PCMAIL_LOG")
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let text = eventually(30, "serve logs", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.lines().count() >= lines).then_some(text)
    });
    let _ = child.kill();
    let _ = child.wait();
    text
}

#[test]
fn x3_json_logs_are_one_object_a_line_with_timestamp_level_target_and_message() {
    let dir = tempfile::tempdir().unwrap();
    let text = serve_logging(dir.path(), &["--log-format", "json", "--log-level", "info"], &[], 2);
    for line in text.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(event.get(key).is_some_and(|v| v.is_string()), "{key} missing: {line}");
        }
    }
    let serving = text.lines().find(|l| l.contains("\"serving\"")).expect("the serving event");
    let event: serde_json::Value = serde_json::from_str(serving).unwrap();
    assert_eq!(event["level"], "INFO");
    assert!(event.as_object().unwrap().len() > 4, "its fields sit beside the message: {serving}");
}

#[test]
fn x3_a_text_log_written_to_a_file_has_no_escape_byte() {
    let dir = tempfile::tempdir().unwrap();
    // Even with a terminal's TERM and colour asked for elsewhere: stderr is a file.
    let text = serve_logging(dir.path(), &["--log-level", "info"], &[("TERM", "xterm-256color")], 2);
    assert!(text.contains("INFO"), "{text}");
    assert!(!text.contains('\u{1b}'), "no ANSI escape in a file: {text:?}");
}
