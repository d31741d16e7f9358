//! DESIGN §7 end to end: a real `serve`, a test function script, and the `ledger` verbs.

use std::path::{Path, PathBuf};

use crate::harness::*;

/// A project with a CSV source, a `draft` function (a shell script that logs every prompt and
/// fails or hangs on demand), and a `mail` send function.
pub struct Setup {
    pub s: Server,
    pub log: PathBuf,
    pub _dir: tempfile::TempDir,
}

fn setup(stale_after: &str) -> Setup {
    setup_with(stale_after, &[])
}

/// [`setup`] with more `serve` arguments (another store).
pub fn setup_with(stale_after: &str, extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("draft.sh");
    let log = dir.path().join("runs.log");
    std::fs::write(
        &script,
        "#!/bin/sh\nprompt=$(cat)\n{ echo \"=== $PCMAIL_ROW_ID instruction=[$PCMAIL_INSTRUCTION]\"; echo \"$prompt\"; } >> \"$LOG\"\n\
         case \"$PCMAIL_TASK\" in *fail*) echo boom >&2; exit 1;; *slow*) sleep 30;; *pause*) sleep 6;; esac\n\
         echo '{\"result\": \"done '$PCMAIL_ROW_ID'\", \"link\": \"https://example.invalid/x\"}'\n",
    )
    .expect("script");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::write(dir.path().join("tasks.csv"), "task,content,due\n見積書を送る,A社,2026-12-01\n請求書を作る,B社,\n")
        .expect("csv");
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), manifests.join("roster.yaml")).expect("roster");
    std::fs::write(
        manifests.join("ledger.yaml"),
        format!(
            "apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {{name: office}}\nspec:\n  project: office\n  sources:\n  - {{name: csv, file: {}}}\n---\n\
             apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: draft}}\nspec:\n  command: [{}]\n  mode: generate\n  timeout: 20s\n  env: {{LOG: {}}}\n---\n\
             apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: mail}}\nspec:\n  command: [{}]\n  mode: send\n  env: {{LOG: {}}}\n---\n\
             apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: render}}\nspec:\n  command: [{}]\n  mode: heavy\n  env: {{LOG: {}}}\n---\n\
             apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {{name: default}}\nspec:\n  workers: 1\n  queues: [heavy]\n  staleAfter: {stale_after}\n",
            dir.path().join("tasks.csv").display(),
            script.display(),
            log.display(),
            script.display(),
            log.display(),
            script.display(),
            log.display()
        ),
    )
    .expect("manifests");
    let s = Server::start_opts(Some(manifests), "127.0.0.1:0", extra);
    Setup { s, log, _dir: dir }
}

pub fn push(s: &Server, source: &str, task: &str, function: &str) -> serde_json::Value {
    let out = s.admin(&["ledger", "push", "--source", source, "--task", task, "--function", function]);
    json(out)
}

fn rows(s: &Server) -> Vec<serde_json::Value> {
    json(s.admin(&["ledger", "list", "--all", "-o", "json"]))["items"].as_array().cloned().unwrap_or_default()
}

pub fn row(s: &Server, id: &str) -> serde_json::Value {
    rows(s).into_iter().find(|r| r["id"] == id).unwrap_or_default()
}

pub fn runs_of(log: &Path, id: &str) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter(|l| l.starts_with(&format!("=== {id} "))).count()
}

#[test]
fn l7_l10_l12_l13_runs_write_results_count_failures_and_keep_instructions_to_their_row() {
    let Setup { s, log, _dir } = setup("30m");
    assert_eq!(push(&s, "manual", "write the estimate", "draft")["added"], 1);
    assert_eq!(push(&s, "manual", "this will fail", "draft")["added"], 1);
    assert_eq!(push(&s, "manual", "write the invoice", "draft")["added"], 1);
    assert_eq!(push(&s, "manual", "write the estimate!", "draft")["skipped"], 1, "L4: the same key");

    ok(s.admin(&["ledger", "set-row", "T-0002", "--instruction", "最優先: 箇条書きにする"]));
    let out = s.admin(&["ledger", "run", "T-0002", "-o", "json"]);
    assert_eq!(code(&out), 1, "a failed run fails the command: {}", stderr(&out));
    assert!(stderr(&out).contains("T-0002: the run failed: failed (1/3)"), "{}", stderr(&out));
    let failed: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("the row is printed all the same");
    assert_eq!((failed["state"].as_str(), failed["failures"].as_u64()), (Some("todo"), Some(1)), "{failed}");
    assert!(failed["result"].as_str().is_some_and(|r| r.contains("failed (1/3)") && r.contains("boom")));
    let text = std::fs::read_to_string(&log).expect("log");
    assert!(
        text.contains("=== T-0002 instruction=[最優先: 箇条書きにする]") && text.contains("highest priority"),
        "{text}"
    );

    let next = json(s.admin(&["ledger", "run", "T-0003", "-o", "json"]));
    assert_eq!(next["state"], "review");
    let text = std::fs::read_to_string(&log).expect("log");
    let t3 = text.split("=== T-0003").nth(1).expect("T-0003 ran");
    assert!(t3.starts_with(" instruction=[]") && !t3.contains("箇条書き"), "the instruction leaked: {t3}");

    for n in [2, 3] {
        let out = s.admin(&["ledger", "run", "T-0002", "-o", "json"]);
        assert_eq!(code(&out), 1);
        let r: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("row");
        assert_eq!(r["failures"].as_u64(), Some(n));
    }
    assert_eq!(row(&s, "T-0002")["state"], "needs-human", "L10: the third failure hands it to a person");
    let out = s.admin(&["ledger", "run", "T-0002"]);
    assert_eq!(code(&out), 1, "a needs-human row does not run");

    let done = json(s.admin(&["ledger", "run", "T-0001", "-o", "json"]));
    assert_eq!(done["result"], "done T-0001\nhttps://example.invalid/x");
    let executed = done["executedAt"].as_str().expect("executedAt");
    assert!(!executed.is_empty() && done["runRequested"] == false);
}

#[test]
fn l8_l14_a_checked_row_runs_exactly_once_when_two_passes_fire_together() {
    let Setup { s, log, _dir } = setup("30m");
    push(&s, "manual", "write the estimate", "draft");
    push(&s, "manual", "send the estimate", "mail");
    ok(s.admin(&["ledger", "set-row", "T-0001", "--run"]));
    let passes: Vec<_> = (0..2)
        .map(|_| {
            let (url, token, home) = (s.url.clone(), s.admin_token(), s.dir.path().join("home-passes"));
            std::thread::spawn(move || {
                std::process::Command::new(BIN)
                    .args(["ledger", "execute-checked"])
                    .env("PCMAIL_SERVER", url)
                    .env("PCMAIL_TOKEN", token)
                    .env("PCMAIL_HOME", home)
                    .output()
                    .expect("pass")
            })
        })
        .collect();
    for p in passes {
        assert!(p.join().expect("join").status.success());
    }
    assert_eq!(runs_of(&log, "T-0001"), 1, "one run, however many passes");
    let r = row(&s, "T-0001");
    assert_eq!((r["state"].as_str(), r["runRequested"].as_bool()), (Some("review"), Some(false)));

    // L9: a send function runs only from a person's tick, never from auto-execute.
    assert_eq!(runs_of(&log, "T-0002"), 0);
    ok(s.admin(&["ledger", "set-row", "T-0002", "--run"]));
    ok(s.admin(&["ledger", "execute-checked"]));
    assert_eq!(runs_of(&log, "T-0002"), 1);
}

#[test]
fn l11_sigkill_during_a_run_counts_one_timeout_failure_and_never_runs_twice() {
    let Setup { mut s, log, _dir } = setup("2s");
    push(&s, "manual", "a slow draft", "draft");
    let claimed = json(s.admin(&["ledger", "run", "T-0001", "--no-wait", "-o", "json"]));
    assert_eq!(claimed["state"], "running");
    eventually(10, "the function to start", || (runs_of(&log, "T-0001") == 1).then_some(()));
    s.kill9();
    s.spawn();
    assert_eq!(row(&s, "T-0001")["state"], "running", "the claim survived the crash");
    std::thread::sleep(std::time::Duration::from_secs(2));
    ok(s.admin(&["ledger", "execute-checked"]));
    let r = row(&s, "T-0001");
    assert_eq!((r["state"].as_str(), r["failures"].as_u64()), (Some("todo"), Some(1)), "{r}");
    assert!(r["result"].as_str().is_some_and(|t| t.contains("timed out")));
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert_eq!(runs_of(&log, "T-0001"), 1, "never run again by itself, never twice at once");
}

#[test]
fn l16_purge_source_lists_untouched_rows_in_a_dry_run_and_deletes_only_them() {
    let Setup { s, _dir, .. } = setup("30m");
    for t in ["one", "two", "three"] {
        push(&s, "old", t, "");
    }
    push(&s, "keep", "other source", "");
    ok(s.admin(&["ledger", "set-row", "T-0002", "--instruction", "keep this"]));
    let dry = ok(s.admin(&["ledger", "purge-source", "old"]));
    assert!(dry.starts_with("would delete 2 row(s): T-0003 T-0001"), "{dry}");
    assert!(dry.contains("kept T-0002: it has a correction instruction"), "{dry}");
    assert_eq!(rows(&s).len(), 4, "a dry run deletes nothing");
    let done = ok(s.admin(&["ledger", "purge-source", "old", "--yes"]));
    assert!(done.starts_with("deleted 2 row(s): T-0003 T-0001"), "{done}");
    let left: Vec<String> = rows(&s).iter().map(|r| r["id"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(left, ["T-0002", "T-0004"]);
    assert_eq!(push(&s, "new", "after the purge", "")["added"], 1);
    assert!(rows(&s).iter().any(|r| r["id"] == "T-0005"), "L1: ids are never reused");
}

#[test]
fn l7_sync_pulls_the_csv_source_once_and_push_failures_never_break_the_caller() {
    let Setup { s, _dir, .. } = setup("30m");
    let first = json(s.admin(&["ledger", "sync"]));
    assert_eq!(first["counts"]["added"], 2, "{first}");
    let second = json(s.admin(&["ledger", "sync"]));
    assert_eq!((second["counts"]["added"].as_u64(), second["counts"]["updated"].as_u64()), (Some(0), Some(0)));
    let view = ok(s.admin(&["ledger", "view"]));
    assert!(view.contains("## office") && view.contains("見積書を送る"), "{view}");
    let out = s.admin(&["ledger", "--project", "nope", "push", "--source", "s", "--task", "t"]);
    assert_eq!(code(&out), 0);
    assert!(stdout(&out).contains("\"error\"") && stdout(&out).contains("no Ledger for project"), "{}", stdout(&out));
}

#[test]
fn l9_a_heavy_row_goes_to_the_job_queue_and_gets_its_result_when_the_job_ends() {
    let Setup { s, _dir, .. } = setup("30m");
    push(&s, "manual", "render the big PDF", "render");
    let handed = json(s.admin(&["ledger", "run", "T-0001", "-o", "json"]));
    let result = handed["result"].as_str().unwrap_or_default().to_string();
    assert!(result.contains("runs as job job-") && result.contains("on queue heavy"), "{handed}");
    assert_eq!(handed["state"], "todo", "the ledger itself never runs it");
    eventually(20, "the job to run and write the row", || {
        let r = row(&s, "T-0001");
        (r["state"] == "review").then_some(r)
    });
    let r = row(&s, "T-0001");
    assert!(r["result"].as_str().is_some_and(|t| t.starts_with("done ")), "{r}");
    let jobs = json(s.admin(&["jobs", "list", "--queue", "heavy", "-o", "json"]));
    assert_eq!(jobs["items"][0]["ledgerRef"], "office/T-0001");
    assert_eq!(jobs["items"][0]["state"], "succeeded");
}

/// A heavy row whose job's end committed while the row's own write did not (the store failed
/// between the two): the next pass settles the row from the ended job, and nothing runs again.
#[test]
fn l9_a_heavy_row_whose_write_after_its_jobs_end_failed_is_settled_from_the_job_and_never_runs_again() {
    let Setup { mut s, log, _dir } = setup_with("30m", &["--resync", "300ms"]);
    push(&s, "manual", "render the big PDF", "render");
    let handed = json(s.admin(&["ledger", "run", "T-0001", "-o", "json"]));
    let waiting = handed["result"].as_str().unwrap_or_default().to_string();
    let done = eventually(20, "the job to run and write the row", || {
        let r = row(&s, "T-0001");
        (r["state"] == "review").then_some(r)
    });
    s.terminate();
    // The row as the failed write left it: still waiting for its (succeeded) job.
    let db = rusqlite::Connection::open(s.dir.path().join("data/pcmail.db")).expect("db");
    let changed = db
        .execute("UPDATE ledger SET state = 'todo', result = ?1 WHERE id = 'T-0001'", [&waiting])
        .expect("the row as the failed write left it");
    assert_eq!(changed, 1);
    drop(db);
    s.spawn();
    let settled = eventually(20, "the row settled from its ended job", || {
        let r = row(&s, "T-0001");
        (r["state"] == "review").then_some(r)
    });
    assert_eq!(settled["result"], done["result"], "the job's result, as first written");
    let runs = std::fs::read_to_string(&log).unwrap_or_default().lines().filter(|l| l.starts_with("=== ")).count();
    assert_eq!(runs, 1, "the row's Function never ran again");
    let jobs = json(s.admin(&["jobs", "list", "--queue", "heavy", "-o", "json"]));
    assert_eq!(jobs["items"].as_array().map(Vec::len), Some(1), "no second job: {jobs}");
}

#[test]
fn u_ledger_list_aligns_japanese_rows_by_display_width() {
    use unicode_width::UnicodeWidthChar;
    let Setup { s, .. } = setup("30m");
    push(&s, "manual", "請求書を作って送る", "draft");
    push(&s, "manual", "write the estimate", "draft");
    ok(s.admin(&["ledger", "set-row", "T-0001", "--state", "needs-human"]));
    let text = ok(s.admin(&["ledger", "list"]));
    // Each character with the display column it starts at (a Japanese character takes two).
    let columns = |line: &str| {
        let mut col = 0;
        line.chars()
            .map(|c| {
                let at = col;
                col += c.width().unwrap_or(0);
                (at, c)
            })
            .collect::<Vec<_>>()
    };
    let lines: Vec<&str> = text.lines().collect();
    let header = columns(lines[0]);
    // Where each header word starts: after a space, at a letter.
    let starts: Vec<usize> = header.windows(2).filter(|w| w[0].1 == ' ' && w[1].1 != ' ').map(|w| w[1].0).collect();
    assert_eq!(starts.len(), 7, "ID STATE RUN TASK DUE FUNCTION FAILURES RESULT:\n{text}");
    for line in &lines[1..] {
        let cells = columns(line);
        for &h in &starts {
            // At each column's start the row has a cell starting there or blank space, never
            // the middle of a wider cell, and a space just before it.
            let covering = cells.iter().find(|(at, c)| *at <= h && h < at + c.width().unwrap_or(0).max(1));
            if let Some((at, c)) = covering {
                assert!(*at == h || *c == ' ', "a cell straddles column {h}:\n{text}");
            }
            let before = cells.iter().find(|(at, c)| *at < h && h - 1 < at + c.width().unwrap_or(0).max(1));
            assert!(before.is_none_or(|(_, c)| *c == ' '), "no gap before column {h}:\n{text}");
        }
    }
    // The TASK column starts at the same place in both rows, Japanese state and task or not.
    let task = starts[2];
    for line in &lines[1..] {
        assert!(columns(line).iter().any(|(at, c)| *at == task && *c != ' '), "TASK at {task}:\n{text}");
    }
}

/// U3/U6 for the ledger: the API pages one project's rows by id and filters them; `ledger list`
/// shows 100, says how many more, and `--all` shows every row.
#[test]
fn u3_u6_ledger_rows_page_by_cursor_filter_by_state_and_function_and_the_cli_says_how_many_more() {
    let Setup { s, .. } = setup("30m");
    let items: Vec<serde_json::Value> = (1..=120)
        .map(|n| {
            let function = if n % 2 == 0 { "mail" } else { "render" };
            serde_json::json!({"source": "bulk", "task": format!("仕事 {n}"), "function": function, "assignee": if n % 3 == 0 { "laptop" } else { "" }})
        })
        .collect();
    let admin = s.admin_token();
    let http = reqwest::blocking::Client::new();
    let push = http.post(format!("{}/api/v1/ledger/push", s.url)).bearer_auth(&admin);
    let pushed: serde_json::Value =
        push.json(&serde_json::json!({"items": items})).send().expect("push").json().expect("json");
    assert_eq!(pushed["added"], 120, "{pushed}");
    assert_eq!(rows(&s).len(), 120);
    let page = |query: &str| -> (Vec<String>, u64) {
        let r = http.get(format!("{}/api/v1/ledger?{query}", s.url)).bearer_auth(&admin).send().expect("get");
        assert_eq!(r.status(), 200, "{query}");
        let more = r.headers().get("x-pcmail-more").and_then(|v| v.to_str().ok()?.parse().ok()).expect("x-pcmail-more");
        let rows: Vec<serde_json::Value> = r.json().expect("rows");
        (rows.iter().filter_map(|r| r["id"].as_str().map(String::from)).collect(), more)
    };
    let (first, more) = page("limit=50");
    assert_eq!((first.first().map(String::as_str), first.len(), more), (Some("T-0001"), 50, 70));
    let (second, more) = page(&format!("limit=50&after={}", first[49]));
    assert_eq!(
        (second.first().map(String::as_str), second.last().map(String::as_str), more),
        (Some("T-0051"), Some("T-0100"), 20)
    );
    let (mails, more) = page("function=mail&limit=1000");
    assert_eq!((mails.len(), more), (60, 0), "a filter narrows before the page");
    let (laptop, _) = page("machine=laptop&state=todo");
    assert_eq!(laptop.len(), 40, "the assignee's open rows");
    let (none, more) = page("after=T-9999");
    assert_eq!((none.len(), more), (0, 0), "nothing after the last row");
    // The cursor is a place in the listing: its row leaving the filter loses no row after it.
    let (todo, _) = page("state=todo&limit=5");
    ok(s.admin(&["ledger", "set-row", &todo[4], "--state", "dropped"]));
    let (next, more) = page(&format!("state=todo&limit=5&after={}", todo[4]));
    assert_eq!((next.first().map(String::as_str), more), (Some("T-0006"), 110), "{next:?}");
    let bad = http.get(format!("{}/api/v1/ledger?state=finished", s.url)).bearer_auth(&admin).send().expect("get");
    assert_eq!(bad.status(), 400);
    assert!(bad.text().unwrap_or_default().contains("finished"), "the error names the bad state");

    let out = s.admin(&["ledger", "list"]);
    assert_eq!(stdout(&out).lines().count(), 1 + 100, "a header and the first 100 rows");
    assert_eq!(stderr(&out).lines().last(), Some("20 more (use --limit or --all)"), "U6: {}", stderr(&out));
    let listed = json(s.admin(&["ledger", "list", "--limit", "30", "--function", "mail", "-o", "json"]));
    assert_eq!((listed["items"].as_array().map(Vec::len), listed["more"].as_u64()), (Some(30), Some(30)));
    let all = json(s.admin(&["ledger", "list", "--all", "-o", "json"]));
    assert_eq!((all["items"].as_array().map(Vec::len), all["more"].as_u64()), (Some(120), Some(0)));
}

/// U5: one search over mail and ledger rows, Japanese and English, parts of words included; a
/// machine finds only the mail it sent or received, the admin all of it.
#[test]
fn u5_search_finds_parts_of_japanese_and_english_words_and_a_machine_only_its_own_mail() {
    let Setup { s, _dir, .. } = setup("30m");
    push(&s, "manual", "請求書を作る", "");
    let (desk, laptop, builder) = (s.token("desk"), s.token("laptop"), s.token("builder"));
    let mine = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "先週の請求書", "--body", "invoice attached"]));
    ok(s.ctl(&builder, &["send", "--to", "desk", "--subject", "Invoice for March", "--body", "b"]));
    let subjects = |v: &serde_json::Value| -> Vec<String> {
        v["mail"].as_array().into_iter().flatten().filter_map(|m| m["subject"].as_str().map(String::from)).collect()
    };
    let found = json(s.ctl(&laptop, &["search", "請求", "-o", "json"]));
    assert_eq!(subjects(&found), ["先週の請求書"], "請求 finds 請求書");
    assert_eq!(found["rows"][0]["task"], "請求書を作る");
    let theirs = json(s.ctl(&laptop, &["search", "INVOICE", "--in", "mail", "-o", "json"]));
    assert_eq!(subjects(&theirs), ["先週の請求書"], "only the laptop's own mail, whatever the case");
    assert_eq!(theirs["rows"], serde_json::json!([]), "--in mail looks at mail only");
    let all = json(s.admin(&["search", "nvoic", "--in", "mail", "-o", "json"]));
    assert_eq!(subjects(&all), ["Invoice for March", "先週の請求書"], "the admin finds all, newest first");
    let table = ok(s.ctl(&laptop, &["search", "請求"]));
    assert!(table.contains(&mine) && table.contains("office/T-0001"), "{table}");
    let empty = s.ctl(&laptop, &["search", "  "]);
    assert_ne!(code(&empty), 0);
    assert!(stderr(&empty).contains("q is empty"), "{}", stderr(&empty));
}
