//! DESIGN §12 (T1–T9) end to end: a machine can do only what is its own — jobs, ledger rows
//! and chat messages included — tried the way a hostile machine would.

use serde_json::{Value, json};

use crate::harness::*;

/// The office roster; a pool `ext` whose queue `q` the laptop and the desk may claim; a pool
/// `heavy` for heavy ledger rows (the laptop works it); an in-process pool on `slow`; a ledger.
fn setup() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    std::fs::write(
        m.join("work.yaml"),
        "apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: ext}\nspec:\n  workers: 0\n  queues: [q]\n  externalWorkers: [laptop, desk]\n  maxLease: 10m\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: heavy}\nspec:\n  workers: 0\n  queues: [heavy]\n  externalWorkers: [laptop]\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: inproc}\nspec:\n  workers: 1\n  queues: [slow]\n---\n\
         apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: work}\nspec: {command: [echo, worked], mode: generate}\n---\n\
         apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: slow}\nspec: {command: [sh, -c, 'sleep 2; echo slept'], mode: generate}\n---\n\
         apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: crunch}\nspec: {command: [echo, crunched], mode: heavy}\n---\n\
         apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {name: office}\nspec: {project: office}\n",
    )
    .expect("manifests");
    (Server::start_with(Some(m)), dir)
}

/// `method path` as `token` (None: no token at all): the status, the JSON answer and its text.
fn call(s: &Server, method: &str, path: &str, token: Option<&str>, body: Value) -> (u16, Value, String) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = s.http();
        let url = format!("{}{path}", s.url);
        let mut req = match method {
            "GET" => c.get(url),
            _ => c.post(url).json(&body),
        };
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("the server answers");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or_default(), text)
    })
}

fn enqueue(s: &Server, token: &str, body: Value) -> String {
    let (status, answer, text) = call(s, "POST", "/api/v1/jobs", Some(token), body);
    assert_eq!(status, 200, "{text}");
    answer["job"]["id"].as_str().expect("id").to_string()
}

fn job_as_admin(s: &Server, id: &str) -> Value {
    let (_, jobs, _) = call(s, "GET", "/api/v1/jobs", Some(&s.admin_token()), json!(null));
    jobs["jobs"].as_array().and_then(|a| a.iter().find(|j| j["id"] == id).cloned()).unwrap_or_default()
}

fn ids(jobs: &Value) -> Vec<String> {
    let mut ids: Vec<String> =
        jobs["jobs"].as_array().into_iter().flatten().filter_map(|j| j["id"].as_str().map(String::from)).collect();
    ids.sort();
    ids
}

#[test]
fn t1_t2_every_job_route_by_every_identity_only_the_claimer_moves_a_claimed_job() {
    let (s, _dir) = setup();
    let (laptop, desk, builder, admin) = (s.token("laptop"), s.token("desk"), s.token("builder"), s.admin_token());
    let a = enqueue(&s, &laptop, json!({"queue": "q", "function": "work", "payload": "secret-a", "uniqueKey": "k"}));
    let b = enqueue(&s, &desk, json!({"queue": "q", "function": "work", "payload": "secret-b", "priority": -1}));

    // T2: only a pool's external workers (and the admin) claim its queues.
    let (status, _, text) = call(&s, "POST", "/api/v1/jobs/claim", Some(&builder), json!({"queue": "q", "owner": "w"}));
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("add builder to externalWorkers of WorkerPool ext"), "{text}");
    let (status, _, text) =
        call(&s, "POST", "/api/v1/jobs/claim", Some(&laptop), json!({"queue": "nope", "owner": "w"}));
    assert_eq!(status, 422, "{text}");

    // T1: the claim's answer is the only one that carries the lease token.
    let (status, claimed, text) =
        call(&s, "POST", "/api/v1/jobs/claim", Some(&laptop), json!({"queue": "q", "owner": "w1", "lease": "5m"}));
    assert_eq!(status, 200, "{text}");
    assert_eq!(claimed["jobs"][0]["id"], a.as_str());
    let token = claimed["jobs"][0]["leaseToken"].as_str().expect("the claimer gets its token").to_string();
    assert_eq!(claimed["jobs"][0]["leaseOwner"], "laptop/w1");
    for (who, t, sees) in [
        ("laptop", &laptop, vec![a.clone()]),
        ("desk", &desk, vec![b.clone()]),
        ("builder", &builder, vec![]),
        ("admin", &admin, {
            let mut both = vec![a.clone(), b.clone()];
            both.sort();
            both
        }),
    ] {
        let (status, jobs, text) = call(&s, "GET", "/api/v1/jobs", Some(t), json!(null));
        assert_eq!(status, 200);
        assert_eq!(ids(&jobs), sees, "T2: {who} lists the jobs it enqueued or claimed");
        assert!(!text.contains(&token), "T1: {who}'s listing shows no lease token: {text}");
    }
    // T12: a key another machine holds is not desk's: desk's job is its own, and nothing of
    // the other machine's job (payload, token) reaches it.
    let (status, held, text) =
        call(&s, "POST", "/api/v1/jobs", Some(&desk), json!({"queue": "q", "function": "work", "uniqueKey": "k"}));
    assert_eq!((status, held["created"].as_bool()), (200, Some(true)), "{text}");
    assert_ne!(held["job"]["id"].as_str(), Some(a.as_str()));
    assert!(!text.contains("secret-a") && !text.contains(&token), "{text}");

    // Every report route with the right token, by everyone but the claimer: refused, unchanged
    // — 403 to whom may list the job (T1), 404 to machines that may not (T16).
    let before = job_as_admin(&s, &a);
    for action in ["heartbeat", "complete", "fail"] {
        for (who, t, expected) in [
            ("desk", Some(&desk), 404),
            ("builder", Some(&builder), 404),
            ("admin", Some(&admin), 403),
            ("none", None, 401),
        ] {
            let body = json!({"token": token, "result": "forged", "error": "forged", "lease": "5m"});
            let path = format!("/api/v1/jobs/{a}/{action}");
            let (status, _, text) = call(&s, "POST", &path, t.map(String::as_str), body);
            assert_eq!(status, expected, "{action} by {who}: {text}");
        }
    }
    for action in ["retry", "cancel"] {
        for (who, t) in [("laptop", &laptop), ("desk", &desk)] {
            let (status, _, _) = call(&s, "POST", &format!("/api/v1/jobs/{a}/{action}"), Some(t), json!({}));
            assert_eq!(status, 403, "{action} by {who} needs the admin");
        }
    }
    assert_eq!(job_as_admin(&s, &a), before, "nothing changed on a refusal");

    // The claimer reports; its answers carry no token either.
    let beat = call(&s, "POST", &format!("/api/v1/jobs/{a}/heartbeat"), Some(&laptop), json!({"token": token}));
    assert_eq!(beat.0, 200, "{}", beat.2);
    assert!(!beat.2.contains(&token), "{}", beat.2);
    let done =
        call(&s, "POST", &format!("/api/v1/jobs/{a}/complete"), Some(&laptop), json!({"token": token, "result": "ok"}));
    assert_eq!((done.0, done.1["state"].as_str(), done.1["result"].as_str()), (200, Some("succeeded"), Some("ok")));

    // A job the server's own pool runs: no machine, nor the admin, can report on it.
    let slow = enqueue(&s, &admin, json!({"queue": "slow", "function": "slow"}));
    eventually(10, "the pool to claim it", || (job_as_admin(&s, &slow)["state"] == "running").then_some(()));
    for (t, expected) in [(&laptop, 404), (&desk, 404), (&builder, 404), (&admin, 403)] {
        let forged = call(&s, "POST", &format!("/api/v1/jobs/{slow}/complete"), Some(t), json!({"token": "guess"}));
        assert_eq!(forged.0, expected, "{}", forged.2);
    }
    let ended = eventually(15, "the pool to finish it", || {
        let j = job_as_admin(&s, &slow);
        (j["state"] == "succeeded").then_some(j)
    });
    assert_eq!(ended["result"], "slept", "the pool's own result is the one recorded");
    assert!(ended["leaseOwner"].as_str().is_some_and(|o| o.starts_with("pool:")), "{ended}");
}

#[test]
fn t3_ledger_ref_is_refused_and_a_ledger_row_changes_only_through_its_own_paths() {
    let (s, _dir) = setup();
    let (laptop, builder, admin) = (s.token("laptop"), s.token("builder"), s.admin_token());
    let item = json!({"task": "月次集計", "function": "crunch"});
    let (status, _, text) = call(&s, "POST", "/api/v1/ledger/push", Some(&builder), json!({"items": [item]}));
    assert_eq!(status, 200, "L7/T11: any machine may push a task to its own source: {text}");
    let row = || {
        let (_, rows, _) = call(&s, "GET", "/api/v1/ledger?project=office", Some(&admin), json!(null));
        rows[0].clone()
    };
    let pushed = row();
    assert_eq!((pushed["id"].as_str(), pushed["state"].as_str()), (Some("T-0001"), Some("todo")));

    for body in [
        json!({"queue": "q", "function": "work", "ledgerRef": "office/T-0001"}),
        json!({"queue": "heavy", "function": "crunch", "uniqueKey": "ledger:office/T-0001"}),
    ] {
        let (status, _, text) = call(&s, "POST", "/api/v1/jobs", Some(&builder), body);
        assert_eq!(status, 422, "{text}");
        assert!(text.contains("ledgerRef") || text.contains("reserved"), "{text}");
    }
    let (_, jobs, _) = call(&s, "GET", "/api/v1/jobs", Some(&admin), json!(null));
    assert_eq!(ids(&jobs), Vec::<String>::new(), "nothing was enqueued");
    for (path, body) in [
        ("/api/v1/ledger/rows/T-0001", json!({"state": "done", "instruction": "x"})),
        ("/api/v1/ledger/rows/T-0001/run", json!({})),
        ("/api/v1/ledger/purge", json!({"source": "push:builder", "yes": true})),
        ("/api/v1/ledger/execute-checked", json!({})),
        ("/api/v1/ledger/sync", json!({})),
    ] {
        let (status, _, text) = call(&s, "POST", path, Some(&builder), body);
        assert_eq!(status, 403, "{path}: {text}");
    }
    assert_eq!(row(), pushed, "no route a machine may call moved the row");

    // L9: a person runs the heavy row; it is handed to a job the server links to the row.
    let (status, handed, text) = call(&s, "POST", "/api/v1/ledger/rows/T-0001/run", Some(&admin), json!({}));
    assert_eq!(status, 200, "{text}");
    let job = handed["result"].as_str().and_then(|r| r.split_whitespace().nth(4)).expect("job id").to_string();
    assert!(job.starts_with("job-"), "{handed}");
    // A machine that is not the heavy pool's worker can neither claim nor end it.
    let (status, _, _) =
        call(&s, "POST", "/api/v1/jobs/claim", Some(&builder), json!({"queue": "heavy", "owner": "w"}));
    assert_eq!(status, 403);
    for action in ["complete", "fail"] {
        let (status, _, text) = call(
            &s,
            "POST",
            &format!("/api/v1/jobs/{job}/{action}"),
            Some(&builder),
            json!({"token": "x", "result": "forged"}),
        );
        assert_eq!(status, 404, "T16: a job it may not list is not there to it: {action}: {text}");
    }
    assert_eq!(row()["state"], "todo");
    // The pool's worker runs it: that is the row's own path, and its result lands.
    let (_, claimed, text) =
        call(&s, "POST", "/api/v1/jobs/claim", Some(&laptop), json!({"queue": "heavy", "owner": "w"}));
    let token = claimed["jobs"][0]["leaseToken"].as_str().unwrap_or_else(|| panic!("claimed: {text}")).to_string();
    let done = call(
        &s,
        "POST",
        &format!("/api/v1/jobs/{job}/complete"),
        Some(&laptop),
        json!({"token": token, "result": "crunched"}),
    );
    assert_eq!(done.0, 200, "{}", done.2);
    let finished = row();
    assert_eq!((finished["state"].as_str(), finished["result"].as_str()), (Some("review"), Some("crunched")));
}

#[test]
fn t4_only_recorders_record_intents_and_a_second_text_is_kept_as_a_conflict() {
    let s = Server::start();
    let (desk, laptop, admin) = (s.token("desk"), s.token("laptop"), s.admin_token());
    let record = |token: &str, message: &str, text: &str| {
        let body = json!({"channel": "telegram", "chat": "-100", "message": message, "from": "kim", "text": text});
        call(&s, "POST", "/api/v1/intents", Some(token), body)
    };
    let (status, _, text) = record(&laptop, "7", "forged first");
    assert_eq!(status, 403, "the Roster owner alone records by default: {text}");
    assert!(text.contains("recorders (desk)"), "{text}");
    let (status, first, _) = record(&desk, "7", "本番を止めて");
    assert_eq!((status, first["created"].as_bool()), (201, Some(true)));
    let (status, again, _) = record(&desk, "7", "本番を止めて");
    assert_eq!((status, again["created"].as_bool(), again.get("conflict")), (200, Some(false), None), "one intent");
    let (status, clash, _) = record(&desk, "7", "送金して");
    assert_eq!((status, clash["created"].as_bool(), clash["conflict"].as_bool()), (200, Some(false), Some(true)));
    let id = first["id"].as_str().expect("id");
    assert_eq!(clash["id"], id);
    let status_of = json(s.ctl(&desk, &["status", id, "-o", "json"]));
    assert_eq!(status_of["mail"]["body"], "本番を止めて", "the first text stays");
    let events = status_of["events"].as_array().expect("events");
    assert!(
        events
            .iter()
            .any(|e| e["reason"] == "IntentConflict" && e["message"].as_str().is_some_and(|m| m.contains("送金して"))),
        "the second text is kept: {status_of}"
    );
    let (_, alerts, _) = call(&s, "GET", "/api/v1/alerts", Some(&admin), json!(null));
    let conflict = alerts.as_array().and_then(|a| a.iter().find(|a| a["kind"] == "intent-conflict")).cloned();
    let conflict = conflict.unwrap_or_else(|| panic!("an intent-conflict alert: {alerts}"));
    assert!(
        conflict["summary"].as_str().is_some_and(|t| t.contains("本番を止めて") && t.contains("送金して")),
        "{conflict}"
    );
    let inbox = json(s.ctl(&desk, &["inbox", "--all", "-o", "json"]));
    let intents = inbox["items"].as_array().expect("inbox").iter().filter(|m| m["kind"] == "intent").count();
    assert_eq!(intents, 1, "the same key is one intent");
}

#[test]
fn t6_t7_an_invalid_name_or_schedule_or_function_field_applies_nothing() {
    let s = Server::start_with(None);
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("Schedule", "  timezone: Mars/Olympus\n  entries: [{role: sync, cron: \"0 2 * * *\"}]\n", "Mars/Olympus"),
        ("Schedule", "  entries: [{role: sync, cron: \"99 99 99 99 99\"}]\n", "minute field \"99\""),
        ("Schedule", "  entries: [{role: sync, cron: \"0 2 * *\"}]\n", "expected 5 fields"),
        ("Schedule", "  entries: [{role: sync, cron: \"0 2 * * *\", maxPerRun: 0}]\n", "maxPerRun 0"),
        ("Function", "  command: [\"ec\\0ho\"]\n  mode: generate\n", "command[0] contains NUL"),
        ("Function", "  command: [echo]\n  mode: generate\n  env: {\"A=B\": x}\n", "env \"A=B\""),
        ("Function", "  command: [echo]\n  mode: generate\n  timeout: 0s\n", "timeout must be longer"),
        ("Function", "  command: [echo]\n  mode: generate\n  timeout: 99999d\n", "timeout 99999d is out of range"),
        (
            "Roster",
            "  owner: a\n  machines:\n  - {number: 1, label: \"a\\u202E\"}\n",
            "label: \"a\\u{202e}\" is not a valid name",
        ),
        ("WorkerPool", "  workers: 1\n  queues: [\"Q/1\"]\n", "queues: \"Q/1\""),
    ];
    for (i, (kind, spec, needle)) in cases.iter().enumerate() {
        // Each invalid object rides with a valid one: one invalid field stores nothing at all.
        let file = dir.path().join(format!("m{i}.yaml"));
        std::fs::write(
            &file,
            format!(
                "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {{name: p}}\nspec: {{}}\n---\napiVersion: pcmail/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec:\n{spec}"
            ),
        )
        .expect("manifest");
        let out = s.admin(&["apply", "-f", &file.display().to_string()]);
        assert_eq!(code(&out), 1, "{kind} {spec}: {}", stdout(&out));
        assert!(stderr(&out).contains(needle), "{kind}: {}", stderr(&out));
        assert!(stderr(&out).contains(&format!("m{i}.yaml:")), "the file and line are named: {}", stderr(&out));
    }
    let stored = json(s.admin(&["get", "mailpolicy", "-o", "json"]));
    assert_eq!(stored["items"].as_array().map(Vec::len), Some(0), "nothing was stored: {stored}");
}

#[cfg(unix)]
#[test]
fn t8_the_data_dir_and_every_file_in_it_stay_private_after_start_and_after_use() {
    use std::os::unix::fs::PermissionsExt;
    let mut s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "private", "--body", "b"]));
    ok(s.ctl(&laptop, &["login", "--server", &s.url, "--token", &laptop]));
    ok(s.ctl(&laptop, &["poll"]));
    ok(s.ctl(&laptop, &["read", &id]));
    ok(s.ctl(&desk, &["ledger", "push", "--project", "office", "--task", "t"]));
    s.restart();
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "after restart", "--body", "b"]));
    ok(s.ctl(&laptop, &["poll"]));
    let mut checked = Vec::new();
    for root in [s.dir.path().join("data"), s.home_of(&laptop)] {
        let mut pending = vec![root.clone()];
        while let Some(dir) = pending.pop() {
            let mode = std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
            for entry in std::fs::read_dir(&dir).expect("read dir") {
                let entry = entry.expect("entry");
                if entry.file_type().expect("type").is_dir() {
                    pending.push(entry.path());
                } else {
                    let mode = entry.metadata().expect("meta").permissions().mode() & 0o777;
                    assert_eq!(mode, 0o600, "{}", entry.path().display());
                    checked.push(entry.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    // The WAL and SHM were made anew by the restarted serve: files created later are private too.
    for name in ["admin.token", "pcmail.db", "pcmail.db-wal", "pcmail.db-shm", "cache.db"] {
        assert!(checked.iter().any(|c| c == name), "{name} was checked: {checked:?}");
    }
}

#[test]
fn t9_console_answers_carry_the_guard_headers_and_failed_sign_ins_are_logged_and_slowed() {
    let s = Server::start_logged(Some(examples()));
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let sign_in = |token: &str| {
        rt.block_on(async {
            let r = client.post(format!("{}/ui/login", s.url)).form(&[("token", token)]).send().await.expect("login");
            let cookie = r.headers().get("set-cookie").and_then(|v| v.to_str().ok()).map(String::from);
            let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(String::from);
            (r.status().as_u16(), cookie, retry)
        })
    };
    // Signed in, every console answer is guarded.
    let (status, cookie, _) = sign_in(&s.admin_token());
    assert_eq!(status, 303, "signed in");
    let cookie = cookie.unwrap_or_default().split(';').next().unwrap_or_default().to_string();
    for page in [
        "/ui/login",
        "/ui/ledger",
        "/ui/mail",
        "/ui/alerts",
        "/ui/jobs",
        "/ui/specs",
        "/ui/ledger/office/T-0404",
        "/ui/style.css",
        "/ui/nosuch",
    ] {
        let headers = rt.block_on(async {
            client.get(format!("{}{page}", s.url)).header("cookie", &cookie).send().await.expect(page).headers().clone()
        });
        for (name, value) in [
            ("content-security-policy", "default-src 'self'"),
            ("x-frame-options", "DENY"),
            ("cache-control", "no-store"),
            ("referrer-policy", "no-referrer"),
        ] {
            let got = headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default();
            assert!(got.starts_with(value), "{page}: {name} is {got:?}");
        }
    }

    // Failed sign-ins: five free, then five a minute, then a wait; each one logged.
    for n in 0..10 {
        assert_eq!(sign_in("pcm_wrong").0, 401, "failure {n}");
    }
    let (status, cookie, retry) = sign_in("pcm_wrong");
    assert_eq!(status, 429, "the eleventh try within a minute waits");
    assert!(retry.is_some_and(|r| r.parse::<u64>().is_ok_and(|s| (1..=60).contains(&s))));
    assert!(cookie.is_none());
    assert_eq!(sign_in(&s.admin_token()).0, 429, "even the right token waits: the address is slowed, not the token");
    let log = s.log();
    assert!(log.matches("console sign-in failed").count() >= 10, "failed sign-ins are logged: {log}");
    assert!(log.contains("127.0.0.1"), "with the client's address: {log}");
}
