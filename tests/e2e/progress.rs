//! X4 end to end: the long verbs redraw their progress in place on a terminal (a
//! pseudo-terminal made by util-linux `script`), draw nothing when piped, and end with one
//! summary line of counts and rate on stderr either way; stdout stays what it was.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::harness::{BIN, stderr, stdout};

/// What a terminal is told before a progress line is redrawn: a carriage return, erase the line.
const ERASE: &str = "\r\x1b[K";

/// A data dir whose store holds `n` mails: the store made as serve makes it, the mail written
/// into it with one SQL statement (the CLI's send would take minutes for 100k).
fn data_with_mails(dir: &Path, n: u64) -> PathBuf {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let url = pcmail_store::default_url(&data);
    let path = url.strip_prefix("sqlite:").expect("a sqlite url").to_string();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async { drop(pcmail_store::SqliteStore::open(&path).await.expect("open the store")) });
    let db = rusqlite::Connection::open(&path).expect("open");
    db.execute_batch(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) \
         INSERT INTO mail (id, \"from\", \"to\", kind, subject, body, urgent, auto, hop, channel, state, \
         created_at, expires_at) \
         SELECT printf('mail--%08x', i), 'pc1', 'pc2', 'note', 'subject ' || i, 'the body of mail ' || i, \
         0, 0, 0, 'pc', 'done', 1764000000000 + i, 1764086400000 + i FROM n"
    ))
    .expect("fill the mail");
    data
}

fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// `pcmail-ctl ARGS` on a pseudo-terminal (stdout and stderr both on it): what the terminal
/// was shown, and the exit code.
fn on_terminal(args: &[&str], env: &[(&str, String)]) -> (String, Option<i32>) {
    let line: Vec<String> = std::iter::once(BIN).chain(args.iter().copied()).map(quote).collect();
    let out = Command::new("script")
        .args(["-qfec", &line.join(" "), "/dev/null"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env_remove("PCMAIL_STORE")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux) gives the verb a pseudo-terminal");
    (String::from_utf8_lossy(&out.stdout).into_owned(), out.status.code())
}

/// `pcmail-ctl ARGS` with stdout and stderr piped, and no store or server from the environment.
fn piped(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("PCMAIL_STORE").stdin(Stdio::null()).output().expect("pcmail-ctl")
}

/// The counts of `unit` the progress lines drawn after `head` showed, in the order drawn.
fn redraws(shown: &str, head: &str, unit: &str) -> Vec<u64> {
    let marker = format!(" {unit} · ");
    shown
        .split(ERASE)
        .filter_map(|drawn| {
            let drawn = drawn.split(['\r', '\n']).next()?.strip_prefix(head)?;
            let (before, _) = drawn.split_once(&marker)?;
            let done = before.rsplit(' ').next()?.split('/').next()?;
            done.replace(',', "").parse().ok()
        })
        .collect()
}

/// The summary lines of `verb` (`verb: … — N unit in … (… unit/s)`), as the last thing written
/// on their line.
fn summaries(text: &str, verb: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.rsplit(ERASE).next().unwrap_or(l).trim_end_matches('\r'))
        .filter(|l| l.starts_with(&format!("{verb}: ")) && l.contains(" — ") && l.contains("/s)"))
        .map(String::from)
        .collect()
}

fn assert_redrawn(shown: &str, head: &str, unit: &str, last: u64) {
    let counts = redraws(shown, head, unit);
    assert!(counts.len() >= 2, "{head} redrawn in place at least twice: {counts:?}\n{shown:?}");
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{head} counts only go up: {counts:?}");
    assert!(counts[0] < last && counts.last() == Some(&last), "{head} ends at {last}: {counts:?}");
}

fn assert_no_progress(out: &Output) {
    let said = stderr(out);
    assert!(!said.contains('\r') && !said.contains('\x1b'), "no progress bytes when piped: {said:?}");
    assert!(!stdout(out).contains('\r') && !stdout(out).contains('\x1b'), "{:?}", stdout(out));
}

#[test]
fn x4_backup_of_100k_mails_on_a_terminal_redraws_its_progress_in_place_and_ends_with_the_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data_with_mails(dir.path(), 100_000).display().to_string();
    let file = dir.path().join("backup.db").display().to_string();
    let (shown, code) = on_terminal(&["backup", &file, "--data-dir", &data], &[]);
    assert_eq!(code, Some(0), "{shown}");
    assert_redrawn(&shown, "backup:", "rows", 100_000);
    let summary = summaries(&shown, "backup");
    assert_eq!(summary.len(), 1, "{shown:?}");
    assert!(summary[0].starts_with("backup: mail 100,000 — 100,000 rows in "), "{}", summary[0]);
    assert!(summary[0].ends_with(&format!(" rows/s) → {file}")), "{}", summary[0]);
}

#[test]
fn x4_backup_of_100k_mails_piped_draws_no_progress_and_ends_with_the_summary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data_with_mails(dir.path(), 100_000).display().to_string();
    let file = dir.path().join("backup.db").display().to_string();
    let out = piped(&["backup", &file, "--data-dir", &data]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_no_progress(&out);
    assert_eq!(stdout(&out), "", "a backup prints nothing on stdout");
    let summary = summaries(&stderr(&out), "backup");
    assert_eq!(summary.len(), 1, "{}", stderr(&out));
    assert!(summary[0].contains("mail 100,000 — 100,000 rows in ") && summary[0].ends_with(&format!("→ {file}")));
}

#[test]
fn x4_restore_and_store_copy_redraw_on_a_terminal_draw_nothing_piped_and_always_sum_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = data_with_mails(dir.path(), 5000).display().to_string();
    let file = dir.path().join("backup.db").display().to_string();
    assert!(piped(&["backup", &file, "--data-dir", &data]).status.success());

    // On a terminal: the check of the backup and the restore, each redrawn as it goes.
    let into = dir.path().join("restored").display().to_string();
    let (shown, code) = on_terminal(&["restore", &file, "--data-dir", &into], &[]);
    assert_eq!(code, Some(0), "{shown}");
    assert_redrawn(&shown, "restore, checking:", "rows", 5000);
    assert_redrawn(&shown, "restore, restoring:", "rows", 5000);
    let summary = summaries(&shown, "restore");
    assert_eq!(summary.len(), 1, "{shown:?}");
    assert!(summary[0].starts_with("restore: mail 5,000 — 5,000 rows in ") && summary[0].contains("→ sqlite:"));

    // Piped: the same words about the restore, and no progress.
    let again = dir.path().join("again").display().to_string();
    let out = piped(&["restore", &file, "--data-dir", &again]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_no_progress(&out);
    assert!(stderr(&out).contains("the backup brings back:"), "{}", stderr(&out));
    assert_eq!(summaries(&stderr(&out), "restore").len(), 1, "{}", stderr(&out));

    // store copy, on a terminal and piped; store verify's table stays alone on stdout.
    let (to, copied) = (dir.path().join("to.db"), dir.path().join("copied.db"));
    let (to, copied) = (format!("sqlite:{}", to.display()), format!("sqlite:{}", copied.display()));
    let from = format!("sqlite:{file}");
    let (shown, code) = on_terminal(&["store", "copy", "--from", &from, "--to", &to], &[]);
    assert_eq!(code, Some(0), "{shown}");
    assert_redrawn(&shown, "store copy:", "rows", 5000);
    assert!(summaries(&shown, "store copy")[0].ends_with(&format!("→ {to}")), "{shown:?}");
    let out = piped(&["store", "copy", "--from", &from, "--to", &copied]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_no_progress(&out);
    let summary = summaries(&stderr(&out), "store copy");
    assert!(summary.len() == 1 && summary[0].starts_with("store copy: mail 5,000 — 5,000 rows in "), "{summary:?}");
    let out = piped(&["store", "verify", "--from", &to, "--to", &copied]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_no_progress(&out);
    let summary = summaries(&stderr(&out), "store verify");
    assert!(summary.len() == 1 && summary[0].starts_with("store verify: --from 5,000, --to 5,000 — 10,000 rows"));
    assert!(stdout(&out).lines().all(|l| l.starts_with("TAB ") || l.ends_with("equal")), "{}", stdout(&out));
}

#[test]
fn x4_jobs_enqueue_from_a_file_sums_up_piped_and_redraws_on_a_terminal_with_ids_alone_on_stdout() {
    let (s, dir) = crate::jobs::setup();
    let jobs = |from: usize| {
        (from..from + 2500)
            .map(|i| format!("{{\"queue\": \"q\", \"function\": \"work\", \"payload\": {{\"n\": {i}}}}}\n"))
    };
    let file = dir.path().join("jobs.jsonl");
    std::fs::write(&file, jobs(0).collect::<String>()).expect("jsonl");
    let file = file.display().to_string();
    let out = s.admin(&["jobs", "enqueue", "-f", &file]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_no_progress(&out);
    assert_eq!(stdout(&out).lines().filter(|l| !l.is_empty()).count(), 2500, "the ids, one a line, and nothing else");
    let summary = summaries(&stderr(&out), "jobs enqueue");
    assert_eq!(summary.len(), 1, "{}", stderr(&out));
    assert!(summary[0].starts_with("jobs enqueue: 2500 job(s) enqueued, 0 answered"), "{}", summary[0]);
    assert!(summary[0].contains(" — 2,500 jobs in ") && summary[0].ends_with(" jobs/s)"), "{}", summary[0]);

    let more = dir.path().join("more.jsonl");
    std::fs::write(&more, jobs(2500).collect::<String>()).expect("jsonl");
    let token = s.admin_token();
    let env = [
        ("PCMAIL_SERVER", s.url.clone()),
        ("PCMAIL_TOKEN", token.clone()),
        ("PCMAIL_HOME", s.home_of(&token).display().to_string()),
    ];
    let (shown, code) = on_terminal(&["jobs", "enqueue", "-f", &more.display().to_string()], &env);
    assert_eq!(code, Some(0), "{shown}");
    assert_redrawn(&shown, "jobs enqueue:", "jobs", 2500);
    assert!(shown.contains("/2,500 jobs · "), "the line says how many of how many: {shown:?}");
    assert_eq!(summaries(&shown, "jobs enqueue").len(), 1, "{shown:?}");
}

#[test]
fn x4_ledger_sync_keeps_its_report_alone_on_stdout_and_sums_up_on_stderr() {
    let crate::ledger::Setup { s, _dir, .. } = crate::ledger::setup_with("30m", &[]);
    let out = s.admin(&["ledger", "sync"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_no_progress(&out);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("stdout is the report alone");
    assert_eq!(report["counts"]["added"], 2, "{report}");
    let summary = summaries(&stderr(&out), "ledger sync");
    assert_eq!(summary.len(), 1, "{}", stderr(&out));
    assert!(
        summary[0].starts_with("ledger sync: office: 2 added, 0 updated, 0 skipped — 2 items in "),
        "{}",
        summary[0]
    );
}
