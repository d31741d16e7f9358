//! DESIGN §12's T10–T19 end to end, as the hostile machine of issue #29 tried them: what one
//! machine sends can neither take another's ids, keys and rows nor hide a refusal.

use pcmail_core::ids;
use serde_json::{Value, json};

use crate::harness::*;

/// `method path` as `token`: the status and the JSON answer (Null when it is not JSON).
fn call(s: &Server, method: &str, path: &str, token: &str, body: Value) -> (u16, Value) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = s.http();
        let url = format!("{}{path}", s.url);
        let req = match method {
            "GET" => c.get(url),
            _ => c.post(url).json(&body),
        };
        let r = req.bearer_auth(token).send().await.expect("the server answers");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or_default())
    })
}

#[test]
fn t10_a_sender_cannot_take_the_id_of_a_future_chat_message() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let key = "telegram--100123-557";
    // The id such a message had before T10 is a client's id now, and taking it changes nothing.
    let squat = json!({"id": ids::legacy_intent_id(key), "to": "desk", "subject": "squat", "body": "x"});
    assert_eq!(call(&s, "POST", "/api/v1/mail", &laptop, squat).0, 201);
    let forged = json!({"id": ids::intent_id(key), "to": "desk", "subject": "squat", "body": "x"});
    let (status, answer) = call(&s, "POST", "/api/v1/mail", &laptop, forged);
    assert_eq!(status, 422, "an intent's id is not a client's to choose: {answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|e| e.contains("8 to 32 lowercase hex")), "{answer}");

    let record = ["intent", "record", "--channel", "telegram", "--chat", "-100123", "--message", "557"];
    let out = s.ctl(&desk, &[&record[..], &["--from", "kim", "--text", "本番を止めて"]].concat());
    assert_eq!(code(&out), 0, "the recorder records the real message: {}", stderr(&out));
    assert_eq!(stdout(&out).trim(), ids::intent_id(key));
    let status = json(s.ctl(&desk, &["status", &ids::intent_id(key), "-o", "json"]));
    assert_eq!(
        (status["mail"]["kind"].as_str(), status["mail"]["body"].as_str()),
        (Some("intent"), Some("本番を止めて"))
    );
}

#[test]
fn t10_a_refused_queued_call_exits_non_zero_is_kept_and_is_reported() {
    let s = Server::start();
    let laptop = s.token("laptop");
    let args = ["intent", "record", "--channel", "telegram", "--chat", "-1001", "--message", "9", "--from", "kim"];
    // Only the Roster owner (desk) records: the server refuses the laptop for good.
    let out = s.ctl(&laptop, &[&args[..], &["--text", "hello"]].concat());
    assert_eq!(code(&out), 1, "a refusal is not silent: {}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("refused") && err.contains("T10") && err.contains("403"), "{err}");
    assert!(err.contains("telegram--1001-9"), "names the message: {err}");
    // Reported once: counted on the server; the PC keeps the message and does not retry.
    eventually(10, "the refusal counted", || {
        (s.metric("pcmail_pending_refused_total{action=\"intent\"}") == Some(1.0)).then_some(())
    });
    let poll = s.ctl(&laptop, &["poll"]);
    assert_eq!(code(&poll), 0, "{}", stderr(&poll));
    assert_eq!(s.metric("pcmail_pending_refused_total{action=\"intent\"}"), Some(1.0), "reported once");
    let again = s.ctl(&laptop, &[&args[..], &["--text", "hello"]].concat());
    assert_eq!(code(&again), 1, "still says so: {}", stderr(&again));
    assert!(stderr(&again).contains("already recorded"), "{}", stderr(&again));
}

#[test]
fn t10_refusal_reports_are_recorded_once_and_cannot_flood_the_events() {
    let s = Server::start();
    let laptop = s.token("laptop");
    let report = |target: &str| json!({"action": "ack", "target": target, "reason": "403: not yours"});
    assert_eq!(call(&s, "POST", "/api/v1/refusals", &laptop, report("mail--00000001")).0, 200);
    assert_eq!(call(&s, "POST", "/api/v1/refusals", &laptop, report("mail--00000001")).0, 200, "a repeat is fine");
    assert_eq!(s.metric("pcmail_pending_refused_total{action=\"ack\"}"), Some(1.0), "but counted once");
    for i in 2..=60 {
        assert_eq!(call(&s, "POST", "/api/v1/refusals", &laptop, report(&format!("mail--{i:08x}"))).0, 200);
    }
    let (status, answer) = call(&s, "POST", "/api/v1/refusals", &laptop, report("mail--ffffffff"));
    assert_eq!(status, 429, "the 61st report of the hour waits: {answer}");
    assert!(
        answer["error"]["message"].as_str().is_some_and(|m| m.contains("kept on the PC") && m.contains("T10")),
        "{answer}"
    );
    assert_eq!(s.metric("pcmail_pending_refused_total{action=\"ack\"}"), Some(60.0), "one record per distinct refusal");
}

#[test]
fn t19_a_roster_cannot_drop_or_delete_machines_that_specs_still_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(examples().join("roster.yaml"), dir.path().join("roster.yaml")).expect("roster");
    std::fs::write(
        dir.path().join("pool.yaml"),
        "apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: builds}\nspec:\n  workers: 0\n  queues: [builds]\n  externalWorkers: [laptop]\n",
    )
    .expect("pool");
    let s = Server::start_with(Some(dir.path().to_path_buf()));
    let roster = std::fs::read_to_string(examples().join("roster.yaml")).expect("roster");
    let name = roster.lines().find_map(|l| l.trim().strip_prefix("name: ")).expect("roster name").to_string();
    let laptop_at = roster.find("label: laptop").expect("the example roster has laptop");
    // The example roster lists machines as `- number: N` blocks: drop laptop's block.
    let start = roster[..laptop_at].rfind("- ").expect("block start");
    let end = roster[laptop_at..].find("- number:").map_or(roster.len(), |e| laptop_at + e);
    let without = format!("{}{}", &roster[..start], &roster[end..]);
    assert!(!without.contains("label: laptop"), "{without}");
    let file = dir.path().join("without.yaml");
    std::fs::write(&file, &without).expect("write");
    let out = s.admin(&["apply", "-f", file.to_str().expect("utf-8")]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("no machine \"laptop\", which workerpool/builds names in externalWorkers (T19)"), "{err}");
    let out = s.admin(&["delete", "roster", &name]);
    assert_ne!(code(&out), 0, "{}", stdout(&out));
    assert!(stderr(&out).contains("workerpool/builds names its machine \"laptop\""), "{}", stderr(&out));
    assert_eq!(code(&s.admin(&["get", "roster", &name])), 0, "the roster is still there");
    ok(s.admin(&["delete", "workerpool", "builds"]));
    ok(s.admin(&["delete", "roster", &name]));
}

#[test]
fn t16_a_taken_id_answers_the_same_whoever_holds_it() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let send = |token: &str, id: &str, body: &str| {
        call(&s, "POST", "/api/v1/mail", token, json!({"id": id, "to": "builder", "subject": "s", "body": body}))
    };
    assert_eq!(send(&desk, "mail--0000aaaa", "desk's").0, 201);
    assert_eq!(send(&laptop, "mail--0000bbbb", "laptop's").0, 201);
    // laptop tries desk's id and its own with another body: one answer, naming no holder.
    let theirs = send(&laptop, "mail--0000aaaa", "other");
    let mine = send(&laptop, "mail--0000bbbb", "other");
    assert_eq!(theirs.0, 409);
    let strip =
        |v: &Value| v["error"]["message"].as_str().map(|m| m.replace("0000aaaa", "ID").replace("0000bbbb", "ID"));
    assert_eq!(strip(&theirs.1), strip(&mine.1), "{} vs {}", theirs.1, mine.1);
    assert_eq!(theirs.1["error"]["code"], mine.1["error"]["code"]);
    assert!(!theirs.1.to_string().contains("desk"), "the holder is not named: {}", theirs.1);
}

/// The office roster with a pool per way of keying jobs: `q` keeps each machine's unique keys
/// its own, `shared` shares them (T12); and a ledger whose `ci` source the builder may push.
fn setup() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    std::fs::write(
        m.join("work.yaml"),
        "apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: ext}\nspec:\n  workers: 0\n  queues: [q]\n  externalWorkers: [laptop, desk]\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: together}\nspec:\n  workers: 0\n  queues: [shared]\n  sharedUniqueKeys: true\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: fast}\nspec:\n  workers: 1\n  queues: [fast]\n  uniqueFor: 1h\n---\n\
         apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: work}\nspec: {command: [echo, worked], mode: generate}\n---\n\
         apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {name: office}\nspec:\n  project: office\n  pushers:\n    - {machine: builder, sources: [ci]}\n",
    )
    .expect("manifests");
    (Server::start_with(Some(m)), dir)
}

#[test]
fn t12_a_machine_is_never_answered_with_another_machines_job_for_its_key() {
    let (s, _dir) = setup();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let enqueue = |token: &str, queue: &str, payload: &str| {
        let body = json!({"queue": queue, "function": "work", "uniqueKey": "invoice-78", "runAfter": "300d", "payload": payload});
        let (status, answer) = call(&s, "POST", "/api/v1/jobs", token, body);
        assert!(status == 200 || status == 201, "{status} {answer}");
        (answer["job"]["id"].as_str().expect("id").to_string(), answer["created"].as_bool())
    };
    let (squat, created) = enqueue(&laptop, "q", "laptop's");
    assert_eq!(created, Some(true));
    let (mine, created) = enqueue(&desk, "q", "desk's");
    assert_ne!(mine, squat, "desk gets a job of its own");
    assert_eq!(created, Some(true));
    assert_eq!(enqueue(&desk, "q", "desk's").0, mine, "J6 within desk's own keys");
    let out = s.ctl(&desk, &["jobs", "enqueue", "--queue", "q", "--function", "work", "--unique-key", "invoice-78"]);
    assert_eq!(stdout(&out).trim(), mine, "the CLI prints desk's job: {}", stderr(&out));
    // A pool that declares sharedUniqueKeys answers every machine with the one holder — of a
    // shared queue: desk's key of the queue that shares nothing is never reached from it.
    let shared = |token: &str, key: &str| {
        let body = json!({"queue": "shared", "function": "work", "uniqueKey": key, "runAfter": "300d"});
        let answer = call(&s, "POST", "/api/v1/jobs", token, body).1;
        (answer["job"]["id"].as_str().expect("id").to_string(), answer["created"].as_bool())
    };
    let (first, _) = shared(&laptop, "invoice-79");
    assert_eq!(shared(&desk, "invoice-79"), (first, Some(false)));
    assert_eq!(shared(&s.token("builder"), "invoice-78").1, Some(true), "laptop's and desk's invoice-78 are on q");
}

#[test]
fn t11_a_machine_writes_only_the_ledger_rows_of_its_own_sources() {
    let (s, _dir) = setup();
    let (admin, builder) = (s.admin_token(), s.token("builder"));
    let push = |token: &str, items: Value| call(&s, "POST", "/api/v1/ledger/push", token, json!({"items": items}));
    let first = json!([{"source": "admin-file", "task": "請求書を送る", "content": "the admin's text"}]);
    assert_eq!(push(&admin, first).0, 200);
    // The attack: a refresh push under the admin's source, and a fill of its empty cells.
    let forged = json!([{"source": "admin-file", "task": "請求書を送る", "content": "wire the money to X", "refresh": true, "function": "send-mail"}]);
    let (status, answer) = push(&builder, forged);
    assert_eq!(status, 403, "{answer}");
    let why = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("T11") && why.contains("push:builder or ci"), "{why}");
    let rows = json(s.admin(&["ledger", "list", "-o", "json"]));
    let row = rows["items"].as_array().and_then(|r| r.first()).cloned().expect("the admin's row");
    assert_eq!((row["content"].as_str(), row["function"].as_str()), (Some("the admin's text"), Some("")), "{row}");
    // Its own source, named or not, and the one the Ledger grants it.
    let out = s.ctl(&builder, &["ledger", "push", "--task", "ビルド確認"]);
    assert_eq!(code(&out), 0, "{}", stdout(&out));
    let out = s.ctl(&builder, &["ledger", "push", "--source", "ci", "--task", "nightly"]);
    assert!(stdout(&out).contains("\"added\":1"), "{}", stdout(&out));
    let refused = s.ctl(&builder, &["ledger", "push", "--source", "admin-file", "--task", "請求書を送る"]);
    assert_eq!(code(&refused), 6, "a refused push says so: {}", stdout(&refused));
    assert!(stdout(&refused).contains("T11"), "{}", stdout(&refused));
    let rows = json(s.admin(&["ledger", "list", "-o", "json"]));
    let sources: Vec<&str> =
        rows["items"].as_array().expect("rows").iter().filter_map(|r| r["source"].as_str()).collect();
    assert_eq!(sources, ["admin-file", "push:builder", "ci"]);
    // Every row change names its actor: a refresh of the builder's own row is in its history.
    let own = json!([{"source": "ci", "task": "nightly", "content": "green", "refresh": true}]);
    assert_eq!(push(&builder, own).0, 200);
    let db = s.dir.path().join("data/pcmail.db");
    let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("db");
    let history: Vec<(String, String, String)> = conn
        .prepare("SELECT reason, actor, message FROM events WHERE object = 'ledger/office/T-0003' ORDER BY at, rowid")
        .expect("query")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    assert_eq!(history.len(), 2, "{history:?}");
    assert_eq!((history[1].0.as_str(), history[1].1.as_str()), ("Updated", "builder"));
    assert!(history[1].2.contains("content = \"green\""), "{history:?}");
}

/// `GET path` with `token` from 127.0.0.1: the status and the `Retry-After` header.
fn get_status(s: &Server, path: &str, token: &str) -> (u16, Option<String>) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let r = s.http().get(format!("{}{path}", s.url)).bearer_auth(token).send().await.expect("answers");
        let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(String::from);
        (r.status().as_u16(), retry)
    })
}

#[test]
fn t18_wrong_tokens_are_counted_logged_and_slowed_per_address() {
    let s = Server::start_logged(None);
    let answers: Vec<u16> = (0..40).map(|i| get_status(&s, "/api/v1/whoami", &format!("pcm_guess_{i}")).0).collect();
    let refused = answers.iter().filter(|&&a| a == 401).count();
    let slowed = answers.iter().filter(|&&a| a == 429).count();
    assert_eq!((refused, slowed), (10, 30), "5 free failures, then 5 tries a minute: {answers:?}");
    let (status, retry) = get_status(&s, "/api/v1/whoami", "pcm_guess_x");
    assert_eq!(status, 429);
    assert!(retry.and_then(|r| r.parse::<u64>().ok()).is_some_and(|r| (1..=60).contains(&r)), "Retry-After");
    assert_eq!(s.metric("pcmail_auth_failures_total{surface=\"api\"}"), Some(41.0), "every one counted");
    let logged = s.log().lines().filter(|l| l.contains("token that is not recognized")).count();
    assert_eq!(logged, 10, "logged while not slowed, never 41 times");
    // The machines behind the same address (a NAT, a proxy) are not locked out by it.
    assert_eq!(get_status(&s, "/api/v1/specs", &s.admin_token()).0, 200, "a valid token always passes");
}

#[test]
fn t18_a_rewritten_admin_token_and_a_reissued_machine_token_hold_from_the_next_request() {
    let s = Server::start();
    let old_admin = s.admin_token();
    assert_eq!(get_status(&s, "/api/v1/specs", &old_admin).0, 200);
    let console =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let signed = console.post(format!("{}/ui/login", s.url)).form(&[("token", &old_admin)]).send().expect("login");
    let cookie = signed.headers().get("set-cookie").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let cookie = cookie.split(';').next().unwrap_or_default().to_string();
    let overview = || console.get(format!("{}/ui/overview", s.url)).header("cookie", &cookie).send().expect("page");
    assert_eq!(overview().status().as_u16(), 200, "signed in");
    std::fs::write(s.dir.path().join("data/admin.token"), "pcm_admin_rotated_by_the_operator\n").expect("rotate");
    assert_eq!(overview().status().as_u16(), 303, "a session of the old admin token ends with it");
    assert_eq!(get_status(&s, "/api/v1/specs", "pcm_admin_rotated_by_the_operator").0, 200, "no restart");
    assert_eq!(get_status(&s, "/api/v1/specs", &old_admin).0, 401, "the old one is gone");

    // A long-poll opened before its token was reissued delivers nothing.
    let desk = s.token("desk");
    let laptop = s.token("laptop");
    let url = format!("{}/api/v1/poll?cursor=0&wait=20s", s.url);
    let waiting = std::thread::spawn(move || {
        let r = reqwest::blocking::Client::new().get(url).bearer_auth(laptop).send().expect("answers");
        (r.status().as_u16(), r.text().unwrap_or_default())
    });
    s.await_parked("poll", 1);
    let _reissued = s.token("laptop");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "for the new token only", "--body", "b"]));
    let (status, body) = waiting.join().expect("poll");
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("for the new token only"), "{body}");
}

/// `method path` with `token` (None: no token): the status and the body as text.
fn raw(s: &Server, method: &str, path: &str, token: Option<&str>, body: Value) -> (u16, String) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let c = s.http();
        let url = format!("{}{path}", s.url);
        let mut req = if method == "GET" { c.get(url) } else { c.post(url).json(&body) };
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.expect("answers");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    })
}

#[test]
fn t16_every_route_since_the_last_matrix_answers_owner_other_machine_admin_and_none_as_t16_says() {
    let (s, _dir) = setup();
    let (desk, laptop, builder, admin) = (s.token("desk"), s.token("laptop"), s.token("builder"), s.admin_token());
    let who: [(&str, Option<&str>); 4] =
        [("desk", Some(&desk)), ("laptop", Some(&laptop)), ("builder", Some(&builder)), ("admin", Some(&admin))];
    let mail = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "s", "--body", "the passphrase is ZEBRA-42"]));
    let job = call(
        &s,
        "POST",
        "/api/v1/jobs",
        &desk,
        json!({"queue": "q", "function": "work", "runAfter": "1d", "payload": "desk's"}),
    );
    let job = job.1["job"]["id"].as_str().expect("job").to_string();

    // Search and listings by cursor: the owner and the admin find it; another machine, nothing.
    for (name, token) in who {
        let expected = if name == "builder" { 0 } else { 1 };
        let (status, found) = raw(&s, "GET", "/api/v1/search?q=ZEBRA-42", token, json!(null));
        let hits = serde_json::from_str::<Value>(&found).ok().and_then(|v| v["mail"].as_array().map(Vec::len));
        assert_eq!((status, hits), (200, Some(expected)), "search by {name}: {found}");
        let (status, page) = raw(&s, "GET", &format!("/api/v1/mail?after={mail}&limit=5"), token, json!(null));
        // The admin lists a mailbox only as a machine (--as); a machine's cursor into another's
        // mail pages nothing.
        let listed = if name == "admin" { status == 400 } else { status == 200 && !page.contains("ZEBRA") };
        assert!(listed, "a cursor pages nothing into {name}'s view: {page}");
        let (status, jobs) = raw(&s, "GET", &format!("/api/v1/jobs?after={job}"), token, json!(null));
        assert!(status == 200 && !jobs.contains("desk's"), "{name}: {jobs}");
    }
    for path in ["/api/v1/search?q=ZEBRA-42", "/api/v1/mail?after=x", "/api/v1/jobs?after=x"] {
        assert_eq!(raw(&s, "GET", path, None, json!(null)).0, 401, "{path} without a token");
    }

    // T16: not yours and not there are one answer, on every mail and job route.
    let missing_mail = "mail--0000beef";
    for (route, body) in
        [("", json!(null)), ("/seen", json!({})), ("/ack", json!({})), ("/fail", json!({"reason": "x"}))]
    {
        let method = if route.is_empty() { "GET" } else { "POST" };
        let theirs = raw(&s, method, &format!("/api/v1/mail/{mail}{route}"), Some(&builder), body.clone());
        let none = raw(&s, method, &format!("/api/v1/mail/{missing_mail}{route}"), Some(&builder), body);
        assert_eq!(theirs.0, 404, "{route}: {}", theirs.1);
        assert_eq!(theirs.1.replace(&mail, "ID"), none.1.replace(missing_mail, "ID"), "{route}: the same body");
    }
    let reply = |parent: &str| raw(&s, "POST", "/api/v1/mail", Some(&builder), json!({"replyTo": parent, "body": "x"}));
    let (theirs, none) = (reply(&mail), reply(missing_mail));
    assert_eq!((theirs.0, theirs.1.replace(&mail, "ID")), (none.0, none.1.replace(missing_mail, "ID")), "{}", theirs.1);
    for action in ["heartbeat", "complete", "fail"] {
        let body = json!({"token": "t", "result": "x", "error": "x"});
        let theirs = raw(&s, "POST", &format!("/api/v1/jobs/{job}/{action}"), Some(&laptop), body.clone());
        let none = raw(&s, "POST", &format!("/api/v1/jobs/job-000000000000/{action}"), Some(&laptop), body);
        assert_eq!(theirs, none, "{action}: another machine's job is not there to it");
        assert_eq!(theirs.0, 404);
    }

    // Bulk enqueue: each machine's key its own (T12); no token, nothing.
    let bulk = json!([{"queue": "q", "function": "work", "uniqueKey": "bulk-1", "runAfter": "1d"}]);
    let mut ids = Vec::new();
    for (name, token) in who {
        let (status, answer) = raw(&s, "POST", "/api/v1/jobs", token, bulk.clone());
        assert_eq!(status, 200, "{name}: {answer}");
        let answer: Value = serde_json::from_str(&answer).expect("json");
        assert_eq!(answer[0]["created"], true, "{name} gets a job of its own: {answer}");
        ids.push(answer[0]["job"]["id"].as_str().expect("id").to_string());
    }
    ids.dedup();
    assert_eq!(ids.len(), 4);
    assert_eq!(raw(&s, "POST", "/api/v1/jobs", None, bulk).0, 401);

    // The intents poller's report: recorders (desk, the owner) and the admin; refusals: machines.
    let report = json!({"channel": "telegram", "dropped": 1});
    let expected = [("desk", 200), ("laptop", 403), ("builder", 403), ("admin", 200)];
    for ((name, token), (_, status)) in who.iter().zip(expected) {
        assert_eq!(raw(&s, "POST", "/api/v1/intents/poller", *token, report.clone()).0, status, "poller by {name}");
    }
    let refusal = json!({"action": "seen", "target": mail, "reason": "403: not yours"});
    let expected = [("desk", 200), ("laptop", 200), ("builder", 200), ("admin", 400)];
    for ((name, token), (_, status)) in who.iter().zip(expected) {
        assert_eq!(raw(&s, "POST", "/api/v1/refusals", *token, refusal.clone()).0, status, "refusal by {name}");
    }
    for path in ["/api/v1/intents/poller", "/api/v1/refusals"] {
        assert_eq!(raw(&s, "POST", path, None, json!({})).0, 401, "{path} without a token");
    }

    // The console's job actions: a person signed in with the admin token, and a form of its own.
    let client =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let cancel = format!("{}/ui/jobs/{job}/cancel", s.url);
    let r = client.post(&cancel).form(&[("csrf", "x")]).send().expect("answers");
    assert_eq!(
        (r.status().as_u16(), r.headers().get("location").and_then(|l| l.to_str().ok())),
        (303, Some("/ui/login"))
    );
    let r = client.post(&cancel).bearer_auth(&desk).form(&[("csrf", "x")]).send().expect("answers");
    assert_eq!(r.status().as_u16(), 303, "a machine token is no console session");
    let signed = client.post(format!("{}/ui/login", s.url)).form(&[("token", &admin)]).send().expect("login");
    let cookie = signed.headers().get("set-cookie").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let cookie = cookie.split(';').next().unwrap_or_default().to_string();
    let page =
        client.get(format!("{}/ui/jobs", s.url)).header("cookie", &cookie).send().expect("jobs").text().expect("html");
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).and_then(|r| r.split('"').next()).expect("a csrf token");
    let r = client.post(&cancel).header("cookie", &cookie).form(&[("csrf", "guess")]).send().expect("answers");
    assert_eq!(r.status().as_u16(), 403, "a forged form");
    assert_eq!(call(&s, "GET", &format!("/api/v1/mail/{mail}"), &desk, json!(null)).0, 200);
    let r = client.post(&cancel).header("cookie", &cookie).form(&[("csrf", csrf)]).send().expect("answers");
    assert_eq!(r.status().as_u16(), 303);
    let jobs = call(&s, "GET", "/api/v1/jobs?limit=100", &admin, json!(null)).1;
    let cancelled = jobs["jobs"].as_array().and_then(|a| a.iter().find(|j| j["id"] == job.as_str())).cloned();
    assert_eq!(cancelled.map(|j| j["state"].clone()), Some(json!("cancelled")));
}

#[test]
fn v1_version_names_client_and_server_and_every_request_carries_a_user_agent() {
    let s = Server::start();
    let desk = s.token("desk");
    let answer = json(s.ctl(&desk, &["version", "-o", "json"]));
    let ours = env!("CARGO_PKG_VERSION");
    assert_eq!(answer["client"]["version"], ours);
    assert_eq!(answer["server"]["version"], ours);
    assert_eq!(answer["server"]["apiLevel"], pcmail_core::api::API_LEVEL);
    let (status, body) = raw(&s, "GET", "/api/v1/version", None, json!(null));
    assert_eq!(status, 200, "asked without a token: {body}");

    // A server that does not know the route (an older one), spoken to by hand: the request
    // says who sent it, and the answer says what is missing.
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let old_server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
        let mut head = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).expect("read") == 0 || line == "\r\n" {
                break;
            }
            head.push(line.trim_end().to_string());
        }
        let mut stream = stream;
        stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").expect("write");
        head
    });
    let out = std::process::Command::new(BIN)
        .args(["version"])
        .env("PCMAIL_SERVER", &url)
        .env("PCMAIL_TOKEN", "pcm_any")
        .env("PCMAIL_HOME", s.dir.path().join("old-server-home"))
        .output()
        .expect("version");
    let head = old_server.join().expect("the old server");
    let agent = format!("user-agent: pcmail-ctl/{ours} ({})", std::env::consts::OS);
    assert!(head.iter().any(|l| l.eq_ignore_ascii_case(&agent)), "{head:?}");
    assert!(stdout(&out).contains("older than the version route"), "{}", stdout(&out));
    assert!(stdout(&out).contains(&format!("client: pcmail-ctl {ours}")), "{}", stdout(&out));
}

#[test]
fn v1_the_server_keeps_each_machines_client_version_for_the_roster_and_metrics() {
    let s = Server::start();
    let desk = s.token("desk");
    let ours = env!("CARGO_PKG_VERSION");
    ok(s.ctl(&desk, &["poll"]));
    let wide = ok(s.admin(&["get", "roster", "-o", "wide"]));
    let line = |label: &str| wide.lines().find(|l| l.split_whitespace().nth(1) == Some(label)).map(str::to_string);
    let desk_line = line("desk").unwrap_or_else(|| panic!("desk in {wide}"));
    assert!(desk_line.trim_end().ends_with(ours), "{wide}");
    assert!(line("laptop").is_some_and(|l| l.contains("never") && l.trim_end().ends_with('-')), "{wide}");
    let series = format!("pcmail_client_info{{machine=\"desk\",version=\"{ours}\"}}");
    assert_eq!(s.metric(&series), Some(1.0));
    let console =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let login = console.post(format!("{}/ui/login", s.url)).form(&[("token", s.admin_token())]).send().expect("login");
    let cookie = login.headers().get("set-cookie").and_then(|v| v.to_str().ok()).expect("cookie").to_string();
    let cookie = cookie.split(';').next().expect("pair").to_string();
    let overview = console.get(format!("{}/ui/overview", s.url)).header("cookie", &cookie).send().expect("overview");
    let page = overview.text().expect("page");
    assert!(page.contains(&format!("<span data-client=\"desk\">{ours}</span>")), "the console shows it: {page}");
    // A client that does not say (one older than V1) is kept as such, and its old series goes.
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let status = rt.block_on(async {
        let r = reqwest::Client::builder().user_agent("curl/8").build().expect("client");
        r.get(format!("{}/api/v1/poll", s.url)).bearer_auth(&desk).send().await.expect("poll").status().as_u16()
    });
    assert_eq!(status, 200);
    let (_, machines) = call(&s, "GET", "/api/v1/machines", &desk, json!(null));
    let desk_seen = machines.as_array().and_then(|a| a.iter().find(|m| m["name"] == "desk")).cloned();
    assert_eq!(desk_seen.map(|m| m["client"].clone()), Some(json!("")), "{machines}");
    assert_eq!(s.metric(&series), None, "the old version's series is gone");
    assert_eq!(s.metric("pcmail_client_info{machine=\"desk\",version=\"\"}"), Some(1.0));
}

#[test]
fn v3_a_verb_whose_route_the_server_lacks_says_the_server_is_older() {
    let s = Server::start();
    let desk = s.token("desk");
    // The real server's answer to routes it does not have: everything under a prefix it does
    // not serve is what an older server answers to a route added since.
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env("PCMAIL_SERVER", format!("{}/older", s.url))
            .env("PCMAIL_TOKEN", &desk)
            .env("PCMAIL_HOME", s.dir.path().join("older-home"))
            .output()
            .expect("run pcmail-ctl")
    };
    for verb in [&["search", "invoice"][..], &["jobs", "list"], &["inbox"]] {
        let out = run(verb);
        assert_ne!(code(&out), 0, "{verb:?}");
        let err = stderr(&out);
        assert!(
            err.contains("the server (before 0.2, API level 1) is older than this verb needs")
                && err.contains("upgrade the server"),
            "{verb:?}: {err}"
        );
        assert!(!err.contains("no such route"), "never a bare 404: {err}");
    }
    // A missing mail is still a missing mail.
    let out = s.ctl(&desk, &["status", "mail--0000dead"]);
    assert!(stderr(&out).contains("not found") && !stderr(&out).contains("older"), "{}", stderr(&out));
}

#[test]
fn t15_job_pages_and_search_answers_are_bounded_in_bytes_and_nothing_is_lost() {
    let (s, _dir) = setup();
    let (admin, desk) = (s.admin_token(), s.token("desk"));
    let payload = "P".repeat(60_000);
    for _ in 0..40 {
        let job = json!({"queue": "q", "function": "work", "runAfter": "1d", "payload": payload});
        assert_eq!(call(&s, "POST", "/api/v1/jobs", &admin, job).0, 200);
    }
    let (status, page) = call(&s, "GET", "/api/v1/jobs?limit=100", &admin, json!(null));
    let shown = page["jobs"].as_array().map_or(0, Vec::len);
    assert_eq!(status, 200);
    assert!((1..=5).contains(&shown), "a page of about 256 KiB: {shown}");
    assert_eq!(page["more"].as_u64(), Some(40 - shown as u64), "the rest is counted");
    let all = json(s.admin(&["jobs", "list", "--all", "-o", "json"]));
    let mut ids: Vec<&str> = all["items"].as_array().expect("jobs").iter().filter_map(|j| j["id"].as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 40, "--all reaches every job once");

    let body = format!("needle {}", "N".repeat(60_000));
    for _ in 0..20 {
        ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "big", "--body", &body]));
    }
    let (status, found) = call(&s, "GET", "/api/v1/search?q=needle&limit=100", &desk, json!(null));
    let hits = found["mail"].as_array().map_or(0, Vec::len);
    assert_eq!(status, 200);
    assert!((1..20).contains(&hits) && found["truncated"] == true, "{hits} hits, truncated: {}", found["truncated"]);
}

#[test]
fn e12_a_retried_enqueue_after_its_job_finished_makes_no_second_job_within_unique_for() {
    let (s, _dir) = setup();
    let desk = s.token("desk");
    let enqueue = |queue: &str| {
        let out =
            s.ctl(&desk, &["jobs", "enqueue", "--queue", queue, "--function", "work", "--unique-key", "invoice-80"]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let first = enqueue("fast");
    eventually(20, "the pool to finish it", || {
        let jobs = call(&s, "GET", "/api/v1/jobs?queue=fast", &desk, json!(null)).1;
        (jobs["jobs"][0]["state"] == "succeeded").then_some(())
    });
    assert_eq!(enqueue("fast"), first, "the pool's uniqueFor: 1h holds the key over the finished job");
    // Without uniqueFor a finished job holds nothing (J6 as before).
    let held = enqueue("q");
    ok(s.admin(&["jobs", "cancel", &held]));
    assert_ne!(enqueue("q"), held);
    let out = s.ctl(
        &desk,
        &["jobs", "enqueue", "--queue", "q", "--function", "work", "--unique-key", "k", "--unique-for", "4000d"],
    );
    assert!(code(&out) != 0 && stderr(&out).contains("uniqueFor"), "T5 names the field: {}", stderr(&out));
}

/// V2: a client two minor releases behind is refused in one sentence naming both versions,
/// while the previous release, a newer one and a caller that is not pcmail-ctl (curl) are
/// served; every answer names the server's release, and a client told of a server older than
/// it serves says so.
#[test]
fn v2_outside_the_window_both_sides_say_so_with_both_versions() {
    use pcmail_core::version::Release;
    let s = Server::start();
    let desk = s.token("desk");
    let ours = Release::this();
    let behind = |minors: u64| format!("{}.{}.0", ours.major, ours.minor.saturating_sub(minors));
    let http = reqwest::blocking::Client::new();
    let ask = |agent: Option<&str>| {
        let mut req = http.get(format!("{}/api/v1/whoami", s.url)).bearer_auth(&desk);
        if let Some(agent) = agent {
            req = req.header("user-agent", agent);
        }
        let r = req.send().expect("answers");
        let server = r.headers().get("server").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        (r.status().as_u16(), server, r.text().unwrap_or_default())
    };
    let (status, server, _) = ask(Some(&format!("pcmail-ctl/{} (linux)", behind(1))));
    assert_eq!((status, server.as_str()), (200, format!("pcmail/{ours}").as_str()), "the previous release");
    assert_eq!(ask(Some("pcmail-ctl/99.0.0 (linux)")).0, 200, "a newer client judges itself");
    assert_eq!(ask(Some("curl/8.5.0")).0, 200, "curl is served");
    assert_eq!(ask(None).0, 200, "no User-Agent is served");
    if ours.minor >= 2 {
        let old = behind(2);
        let (status, _, body) = ask(Some(&format!("pcmail-ctl/{old} (windows)")));
        let body: Value = serde_json::from_str(&body).expect("an error body");
        let told = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, 426, "{body}");
        assert!(told.contains(&format!("({old})")) && told.contains(&format!("({ours})")), "{told}");
    }

    // A server of a release this client no longer serves, spoken by hand.
    if ours.minor < 2 {
        return; // 0.1: every earlier release is 0.0, served
    }
    let old = behind(2);
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let from = old.clone();
    let old_server = std::thread::spawn(move || {
        let old = from;
        let (stream, _) = listener.accept().expect("accept");
        let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
        let mut line = String::new();
        while reader.read_line(&mut line).expect("read") > 0 && line != "\r\n" {
            line.clear();
        }
        let body = r#"{"machine":"desk"}"#;
        let answer = format!(
            "HTTP/1.1 200 OK\r\nserver: pcmail/{old}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut stream = stream;
        stream.write_all(answer.as_bytes()).expect("write");
    });
    let out = std::process::Command::new(BIN)
        .args(["inbox"])
        .env("PCMAIL_SERVER", &url)
        .env("PCMAIL_TOKEN", "pcm_any")
        .env("PCMAIL_HOME", s.dir.path().join("old-server-home"))
        .output()
        .expect("inbox");
    old_server.join().expect("the old server");
    let said = stderr(&out);
    assert_eq!(code(&out), 1, "{said}");
    let told = format!("the server ({old}) is older than this pcmail-ctl ({ours}) serves");
    assert!(said.contains(&told), "{said}");
}

#[test]
fn v1_version_against_the_previous_release_either_way_and_the_roster_names_each_pcs_client() {
    let previous = crate::previous::binary();
    let release = crate::previous::release();
    let release = release.as_str();
    let ours = env!("CARGO_PKG_VERSION");

    // An older server: the previous release serves, this build asks.
    let old = Server::start_bin(&previous, Some(examples()), &[]);
    let out = old.admin(&["version"]);
    assert_eq!(code(&out), 0, "the previous release is inside the window: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains(&format!("client: pcmail-ctl {ours}")), "{text}");
    assert!(text.contains(&format!("server: pcmail-ctl {release}")), "{text}");
    let answer = json(old.admin(&["version", "-o", "json"]));
    assert_eq!(
        (answer["client"]["version"].as_str(), answer["server"]["version"].as_str()),
        (Some(ours), Some(release))
    );

    // A newer server: this build serves, the previous release's client asks.
    let s = Server::start();
    let admin = s.admin_token();
    let answer = json(s.ctl_via(&previous, &s.url, &admin, &["version", "-o", "json"], None));
    assert_eq!(
        (answer["client"]["version"].as_str(), answer["server"]["version"].as_str()),
        (Some(release), Some(ours))
    );
    assert_eq!(answer["server"]["apiLevel"], pcmail_core::api::API_LEVEL);

    // Each PC's client as its polls said it: desk the previous release, laptop this one,
    // builder one that sends no User-Agent.
    let (desk, laptop, builder) = (s.token("desk"), s.token("laptop"), s.token("builder"));
    ok(s.ctl_via(&previous, &s.url, &desk, &["poll"], None));
    ok(s.ctl(&laptop, &["poll"]));
    let (status, _) = raw(&s, "GET", "/api/v1/poll", Some(&builder), json!(null));
    assert_eq!(status, 200);
    let wide = ok(s.admin(&["get", "roster", "-o", "wide"]));
    let client = |label: &str| {
        let line = wide.lines().find(|l| l.split_whitespace().nth(1) == Some(label));
        line.and_then(|l| l.split_whitespace().last()).map(str::to_string)
    };
    assert_eq!(client("desk").as_deref(), Some(release), "{wide}");
    assert_eq!(client("laptop").as_deref(), Some(ours), "{wide}");
    assert_eq!(client("builder").as_deref(), Some("-"), "a client that does not say: {wide}");
    assert_eq!(s.metric(&format!("pcmail_client_info{{machine=\"desk\",version=\"{release}\"}}")), Some(1.0));

    // The previous release's server keeps this build's version the same way.
    let desk_there = old.token("desk");
    ok(old.ctl(&desk_there, &["poll"]));
    let wide = ok(old.admin(&["get", "roster", "-o", "wide"]));
    let line = wide.lines().find(|l| l.split_whitespace().nth(1) == Some("desk")).unwrap_or_default();
    assert!(line.trim_end().ends_with(ours), "{wide}");
}
