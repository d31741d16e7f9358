//! Running a Function as a child process, for ledger rows (L12, L13) and jobs (§8): argv
//! without a shell, the input on stdin, a minimal environment plus the caller's `PCMAIL_*`
//! variables, and a timeout that kills the whole process group.

use std::process::Stdio;

use pcmail_core::manifest::spec::FunctionSpec;
use tokio::io::AsyncWriteExt;

const MAX_STDOUT: usize = 1 << 20;

/// Variables passed through from the server's environment; everything else is dropped.
const PASSED: [&str; 5] = ["PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT"];

/// Why a Function's run failed; the text is what a ledger row or a job records.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("function {0} has an empty command")]
    EmptyCommand(String),
    #[error("cannot start {program:?}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("timed out after {0}")]
    Timeout(pcmail_core::duration::Dur),
    #[error("waiting for {program:?}: {source}")]
    Wait { program: String, source: std::io::Error },
    /// It ran and failed: its exit status and the end of its stderr.
    #[error("{status}: {stderr_tail}")]
    Exit { status: std::process::ExitStatus, stderr_tail: String },
}

/// Runs `function` with `input` on stdin and `vars` (the `PCMAIL_*` of this one run) in its
/// environment. Ok is its stdout.
pub async fn run(
    name: &str,
    function: &FunctionSpec,
    vars: &[(&str, String)],
    input: String,
) -> Result<String, ExecError> {
    let Some((program, args)) = function.command.split_first() else {
        return Err(ExecError::EmptyCommand(name.to_string()));
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).env_clear();
    for key in PASSED {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    // Each run builds its own environment, so nothing set for one run (L12's instruction)
    // reaches another.
    cmd.envs(&function.env).env("PCMAIL_FUNCTION", name);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    #[cfg(unix)]
    {
        // Its own process group, so a timeout kills everything it started.
        cmd.process_group(0);
        #[cfg(target_os = "linux")]
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            // If serve dies (SIGKILL included), the function dies with it instead of running
            // on as an orphan next to the retry that L11 allows.
            // The function creates files with its user's usual permissions, not serve's 077 (T8).
            let umask = pcmail_store::private::inherited_umask();
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                if let Some(mask) = umask {
                    libc::umask(mask as libc::mode_t);
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|source| ExecError::Spawn { program: program.clone(), source })?;
    let pid = child.id();
    let stdin = child.stdin.take();
    // E4: the input is written inside the timeout, beside the wait: a function that never reads
    // a payload larger than the pipe holds is killed at its timeout like any other.
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A function that does not read its stdin is not an error.
            let _ = stdin.write_all(input.as_bytes()).await;
        }
    };
    let run = async { tokio::join!(feed, child.wait_with_output()).1 };
    match tokio::time::timeout(function.timeout.to_std(), run).await {
        Err(_) => {
            kill_group(pid);
            Err(ExecError::Timeout(function.timeout))
        }
        Ok(Err(source)) => Err(ExecError::Wait { program: program.clone(), source }),
        Ok(Ok(out)) if out.status.success() => {
            let stdout = &out.stdout[..out.stdout.len().min(MAX_STDOUT)];
            Ok(String::from_utf8_lossy(stdout).into_owned())
        }
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: String = stderr.trim().chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
            Err(ExecError::Exit { status: out.status, stderr_tail: tail })
        }
    }
}

fn kill_group(pid: Option<u32>) {
    #[cfg(unix)]
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a negative pid signals the process group we created.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use std::collections::BTreeMap;

    use pcmail_core::duration::Dur;
    use pcmail_core::manifest::spec::FunctionMode;

    use super::*;

    fn vars(instruction: &str) -> Vec<(&'static str, String)> {
        let mut v = vec![("PCMAIL_ROW_ID", "T-0001".to_string())];
        if !instruction.is_empty() {
            v.push(("PCMAIL_INSTRUCTION", instruction.to_string()));
        }
        v
    }

    fn function(script: &str, timeout: Dur) -> FunctionSpec {
        FunctionSpec {
            command: vec!["sh".into(), "-c".into(), script.into()],
            mode: FunctionMode::Generate,
            timeout,
            rate_limit: None,
            env: BTreeMap::from([("EXTRA".to_string(), "x".to_string())]),
        }
    }

    #[tokio::test]
    async fn l12_the_input_arrives_on_stdin_with_a_minimal_environment_for_this_run_only() {
        let f = function("cat; echo; env | sort", Dur::from_secs(10));
        let out = run("f", &f, &vars("be brief"), "PROMPT".into()).await.expect("runs");
        assert!(out.starts_with("PROMPT\n"), "{out}");
        assert!(
            out.contains("PCMAIL_INSTRUCTION=be brief")
                && out.contains("PCMAIL_ROW_ID=T-0001")
                && out.contains("EXTRA=x")
        );
        assert!(!out.contains("CARGO_"), "the server's environment does not leak: {out}");
        let without = run("f", &f, &vars(""), String::new()).await.expect("runs");
        assert!(!without.contains("PCMAIL_INSTRUCTION"), "{without}");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_timeout_kills_the_whole_process_group() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let err =
            run("f", &function(&script, Dur::from_millis(500)), &vars(""), String::new()).await.expect_err("times out");
        assert!(matches!(err, ExecError::Timeout(d) if d == Dur::from_millis(500)), "{err}");
        let pid = std::fs::read_to_string(&pidfile).expect("pid").trim().to_string();
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Gone, or a zombie waiting for whoever inherited it: either way no longer running.
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let running =
            state.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()).is_some_and(|s| s != "Z");
        assert!(!running, "the background grandchild {pid} outlived the timeout: {state}");
    }

    #[tokio::test]
    async fn e4_a_function_that_never_reads_a_256k_payload_is_killed_at_its_timeout() {
        let payload = "x".repeat(256 * 1024);
        let outcome = run("f", &function("sleep 30", Dur::from_millis(500)), &vars(""), payload).await;
        let err = outcome.expect_err("not left blocked on the full pipe");
        assert_eq!(err.to_string(), "timed out after 500ms");
    }

    #[tokio::test]
    async fn a_failing_function_reports_its_exit_status_and_stderr() {
        let err = run("f", &function("echo nope >&2; exit 3", Dur::from_secs(10)), &vars(""), String::new())
            .await
            .expect_err("fails");
        assert!(
            matches!(&err, ExecError::Exit { status, stderr_tail } if status.code() == Some(3) && stderr_tail == "nope"),
            "{err}"
        );
        assert_eq!(err.to_string(), "exit status: 3: nope");
    }
}
