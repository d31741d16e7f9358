//! DESIGN §14 (O1–O8) end to end: HTTPS with a certificate that is renewed on disk, backups and
//! restores, moving a store between adapters.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

/// A CA of its own in `dir/<name>-ca.pem` (and key), with openssl.
pub(crate) fn ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (dir.join(format!("{name}-ca.pem")), dir.join(format!("{name}-ca.key")));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN=pcmail test CA {name}"),
        "-keyout",
        &key.display().to_string(),
        "-out",
        &pem.display().to_string(),
    ]);
    pem
}

/// A server certificate for 127.0.0.2 signed by `ca`, written to `cert` and `key` (replacing
/// them in one rename each, as a renewal does).
pub(crate) fn server_cert(ca: &Path, cert: &Path, key: &Path) {
    let dir = cert.parent().expect("dir");
    let ext = dir.join("san.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.2,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    let (new_key, csr, new_cert) = (dir.join("new.key"), dir.join("new.csr"), dir.join("new.pem"));
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=127.0.0.2",
        "-keyout",
        &new_key.display().to_string(),
        "-out",
        &csr.display().to_string(),
    ]);
    let ca_key = ca.with_extension("key");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr.display().to_string(),
        "-CA",
        &ca.display().to_string(),
        "-CAkey",
        &ca_key.display().to_string(),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &ext.display().to_string(),
        "-out",
        &new_cert.display().to_string(),
    ]);
    std::fs::rename(&new_key, key).expect("key");
    std::fs::rename(&new_cert, cert).expect("cert");
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CLI verb against `url` as `token`, trusting `ca` (or only the system's roots).
fn client(url: &str, token: &str, home: &Path, ca: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("PCMAIL_SERVER", url).env("PCMAIL_TOKEN", token).env("PCMAIL_HOME", home);
    match ca {
        Some(ca) => cmd.env("PCMAIL_CA", ca),
        None => cmd.env_remove("PCMAIL_CA"),
    };
    cmd.output().expect("pcmail-ctl")
}

#[test]
fn o1_serve_over_https_logins_with_ca_refuses_an_untrusting_client_and_serves_a_renewed_certificate() {
    let pki = tempfile::tempdir().expect("tempdir");
    let (ca_a, ca_b) = (ca(pki.path(), "a"), ca(pki.path(), "b"));
    let (cert, key) = (pki.path().join("server.pem"), pki.path().join("server.key"));
    server_cert(&ca_a, &cert, &key);
    let s = Server::start_tls(&format!("127.0.0.2:{}", free_port()), &cert, &key, &ca_a);
    assert!(s.url.starts_with("https://127.0.0.2:"), "{}", s.url);
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));

    // The laptop logs in with the CA once; afterwards it needs nothing else.
    ok(s.ctl(&laptop, &["login", "--server", &s.url, "--token", &laptop, "--ca", &ca_a.display().to_string()]));
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "over TLS", "--body", "b"]));
    let waiting = {
        let (url, desk, ca, home) = (s.url.clone(), desk.clone(), ca_a.clone(), s.home_of(&desk));
        let id = id.clone();
        std::thread::spawn(move || {
            client(&url, &desk, &home, Some(&ca), &["status", &id, "--wait-for", "seen", "--timeout", "20s"])
        })
    };
    let laptop_home = s.home_of(&laptop);
    let poll = Command::new(BIN)
        .args(["poll"])
        .env("PCMAIL_HOME", &laptop_home)
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .env_remove("PCMAIL_CA")
        .output()
        .expect("poll");
    assert!(poll.status.success(), "{}", stderr(&poll));
    let read = Command::new(BIN)
        .args(["read", &id])
        .env("PCMAIL_HOME", &laptop_home)
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .env_remove("PCMAIL_CA")
        .output()
        .expect("read");
    assert!(read.status.success() && stdout(&read).contains("over TLS"), "{}", stderr(&read));
    let waited = waiting.join().expect("wait");
    assert!(waited.status.success(), "status --wait-for seen over HTTPS: {}", stderr(&waited));

    // A client that does not trust the server's CA is refused, and told what to do.
    let stranger = tempfile::tempdir().expect("home");
    let refused = client(&s.url, &desk, stranger.path(), None, &["inbox"]);
    assert!(!refused.status.success());
    let why = stderr(&refused);
    assert!(why.contains("does not trust") && why.contains("--ca"), "{why}");

    // The certificate is renewed on disk (by another CA): served without a restart.
    server_cert(&ca_b, &cert, &key);
    let renewed = eventually(15, "the renewed certificate to be served", || {
        let out = client(&s.url, &desk, stranger.path(), Some(&ca_b), &["inbox", "-o", "json"]);
        out.status.success().then_some(out)
    });
    let listed: serde_json::Value = serde_json::from_str(&stdout(&renewed)).expect("inbox -o json");
    assert_eq!(listed["kind"], "MailList", "{listed}");
    let old = client(&s.url, &desk, stranger.path(), Some(&ca_a), &["inbox"]);
    assert!(!old.status.success() && stderr(&old).contains("does not trust"), "the old certificate is gone");
}

/// A self-signed certificate for 127.0.0.2 valid only in January 2020, written over `cert` and
/// `key` (openssl's `ca` is the one verb that takes explicit dates).
fn expired_cert(cert: &Path, key: &Path) {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(
        dir.path().join("ca.conf"),
        format!(
            "[ca]\ndefault_ca = d\n[d]\ndatabase = {}\nnew_certs_dir = {}\nserial = {}\ndefault_md = sha256\npolicy = p\n[p]\ncommonName = supplied\n",
            p("index.txt"),
            dir.path().display(),
            p("serial")
        ),
    )
    .expect("conf");
    std::fs::write(dir.path().join("index.txt"), "").expect("index");
    std::fs::write(dir.path().join("serial"), "01\n").expect("serial");
    let (k, csr, c) = (p("k.pem"), p("r.csr"), p("c.pem"));
    openssl(
        &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=127.0.0.2"]
            .into_iter()
            .chain(["-keyout", &k, "-out", &csr])
            .collect::<Vec<_>>(),
    );
    let conf = p("ca.conf");
    openssl(
        &["ca", "-batch", "-config", &conf, "-selfsign", "-keyfile", &k, "-in", &csr]
            .into_iter()
            .chain(["-startdate", "20200101000000Z", "-enddate", "20200102000000Z", "-out", &c])
            .collect::<Vec<_>>(),
    );
    std::fs::rename(&k, key).expect("key");
    std::fs::rename(&c, cert).expect("cert");
}

#[test]
fn t17_under_tls_cookies_are_secure_every_answer_has_hsts_and_an_expired_certificate_is_not_loaded() {
    let pki = tempfile::tempdir().expect("tempdir");
    let ca_a = ca(pki.path(), "a");
    let (cert, key) = (pki.path().join("server.pem"), pki.path().join("server.key"));
    server_cert(&ca_a, &cert, &key);
    let s = Server::start_tls(&format!("127.0.0.2:{}", free_port()), &cert, &key, &ca_a);
    let pem = std::fs::read(&ca_a).expect("ca");
    let http = reqwest::blocking::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    for path in ["/healthz", "/api/v1/whoami", "/ui/login", "/no/such/route"] {
        let r = http.get(format!("{}{path}", s.url)).send().expect("answers");
        let hsts = r.headers().get("strict-transport-security").and_then(|v| v.to_str().ok()).map(String::from);
        assert_eq!(hsts.as_deref(), Some("max-age=31536000"), "{path}");
    }
    // The edge's own refusal (HTTP/1.1 without Host) carries it too.
    let port = s.url.rsplit(':').next().expect("port");
    let mut raw = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &format!("127.0.0.2:{port}"), "-CAfile"])
        .arg(&ca_a)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client");
    use std::io::Write;
    raw.stdin.take().expect("stdin").write_all(b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n").expect("request");
    let answer = String::from_utf8_lossy(&raw.wait_with_output().expect("answer").stdout).to_lowercase();
    assert!(
        answer.starts_with("http/1.1 400") && answer.contains("strict-transport-security: max-age=31536000"),
        "{answer}"
    );
    let signed_in = http.post(format!("{}/ui/login", s.url)).form(&[("token", s.admin_token())]).send().expect("login");
    let cookie = signed_in.headers().get("set-cookie").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(cookie.starts_with("pcmail_session=") && cookie.ends_with("; Secure"), "{cookie}");
    let expiry = s.metric_over(&http, "pcmail_tls_cert_expiry_timestamp_seconds").expect("the expiry metric");
    let in_two_days = (chrono::Utc::now() + chrono::TimeDelta::days(2)).timestamp() as f64;
    assert!((expiry - in_two_days).abs() < 600.0, "notAfter is two days away: {expiry}");

    // An expired certificate on disk is refused, said once, and the one in force keeps serving.
    expired_cert(&cert, &key);
    eventually(10, "the refusal logged", || s.log().contains("the certificate expired at").then_some(()));
    std::thread::sleep(std::time::Duration::from_secs(5));
    assert_eq!(s.log().matches("the certificate expired at").count(), 1, "once per change, not every 2 s");
    let still = http.get(format!("{}/healthz", s.url)).send().expect("the old certificate still serves");
    assert_eq!(still.status().as_u16(), 200);
    assert_eq!(s.metric_over(&http, "pcmail_tls_cert_expiry_timestamp_seconds"), Some(expiry));
}

/// Runs `pcmail-ctl` with no server or token: the store verbs need neither.
fn offline(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).env_remove("PCMAIL_STORE").output().expect("pcmail-ctl")
}

#[test]
fn o2_a_backup_taken_under_load_restores_every_acknowledged_mail_and_tokens_keep_working() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    // The roster, and a queue `q` of a Function `work` that only external workers take.
    let (s, dir) = crate::jobs::setup();
    let tokens = [s.token("desk"), s.token("laptop")];
    let builder = s.token("builder");
    let admin = s.admin_token();
    let stop = Arc::new(AtomicBool::new(false));
    // Every send the server acknowledged, with the moment the sender learnt it.
    let acked: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let senders: Vec<_> = (0..8)
        .map(|n| {
            let (url, token, home) = (s.url.clone(), tokens[n % 2].clone(), s.home_of(&tokens[n % 2]));
            let (stop, acked) = (stop.clone(), acked.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let out = client(&url, &token, &home, None, &["send", "--to", "builder", "--body", "load"]);
                    if out.status.success() {
                        acked.lock().expect("acked").push((stdout(&out).trim().to_string(), Instant::now()));
                    }
                }
            })
        })
        .collect();
    let enqueuer = {
        let (url, admin, home, stop) = (s.url.clone(), admin.clone(), dir.path().join("enqueuer"), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                client(&url, &admin, &home, None, &["jobs", "enqueue", "--queue", "q", "--function", "work"]);
            }
        })
    };
    let mut workers: Vec<_> = (0..4)
        .map(|n| {
            Command::new(BIN)
                .args(["worker", "--queue", "q", "--lease", "10s"])
                .env("PCMAIL_SERVER", &s.url)
                .env("PCMAIL_TOKEN", &admin)
                .env("PCMAIL_HOME", dir.path().join(format!("worker-{n}")))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("worker")
        })
        .collect();
    eventually(30, "load to build up", || (acked.lock().expect("acked").len() >= 100).then_some(()));

    let backup = dir.path().join("backup.db");
    let data = s.dir.path().join("data").display().to_string();
    let moment = Instant::now();
    let out = offline(&["backup", &backup.display().to_string(), "--data-dir", &data]);
    assert!(out.status.success(), "backup under load: {}", stderr(&out));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    for t in senders {
        t.join().expect("sender");
    }
    enqueuer.join().expect("enqueuer");
    for w in &mut workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    let again = offline(&["backup", &backup.display().to_string(), "--data-dir", &data]);
    assert!(!again.status.success() && stderr(&again).contains("never overwrites"), "{}", stderr(&again));
    assert!(!dir.path().join("backup.db.partial").exists() && !dir.path().join("backup.db-wal").exists());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&backup).expect("backup").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "only its owner reads a backup");
        let ro =
            rusqlite::Connection::open_with_flags(&backup, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("ro");
        let journal: String = ro.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("journal mode");
        assert_eq!(journal, "delete", "one file, readable on read-only media");
    }

    let restored = dir.path().join("restored");
    let out = offline(&["restore", &backup.display().to_string(), "--data-dir", &restored.display().to_string()]);
    assert!(out.status.success(), "restore: {}", stderr(&out));
    let store = format!("sqlite:{}", restored.join("pcmail.db").display());
    let out = offline(&["store", "verify", "--from", &format!("sqlite:{}", backup.display()), "--to", &store]);
    assert!(out.status.success(), "store verify after restore:\n{}{}", stdout(&out), stderr(&out));
    let again = offline(&["restore", &backup.display().to_string(), "--data-dir", &restored.display().to_string()]);
    // E14: the same backup again replaces what it restored (nothing goes back in time), saying so.
    assert!(
        again.status.success() && stderr(&again).contains("holds, and the restore drops: specs"),
        "{}",
        stderr(&again)
    );

    // A damaged backup is refused before anything is written (E14)…
    let damaged = dir.path().join("damaged.db");
    std::fs::copy(&backup, &damaged).expect("copy");
    rusqlite::Connection::open(&damaged).expect("raw").execute("UPDATE jobs SET priority = 1.5", []).expect("damage");
    let partial = dir.path().join("partial");
    let out = offline(&["restore", &damaged.display().to_string(), "--data-dir", &partial.display().to_string()]);
    assert!(!out.status.success() && stderr(&out).contains("checking"), "{}", stderr(&out));
    assert!(!partial.join("pcmail.db").exists(), "nothing written");
    // …and a copy that stops midway (a value the export cannot read) leaves a store serve refuses.
    std::fs::create_dir(&partial).expect("dir");
    let to = format!("sqlite:{}", partial.join("pcmail.db").display());
    let out = offline(&["store", "copy", "--from", &format!("sqlite:{}", damaged.display()), "--to", &to]);
    assert!(!out.status.success() && stderr(&out).contains("marked unfinished"), "{}", stderr(&out));
    let serve = offline(&["serve", "--data-dir", &partial.display().to_string(), "--listen", "127.0.0.1:0"]);
    assert!(!serve.status.success() && stderr(&serve).contains("a copy that did not finish"), "{}", stderr(&serve));

    let before: Vec<String> =
        acked.lock().expect("acked").iter().filter(|(_, at)| *at < moment).map(|(id, _)| id.clone()).collect();
    let db = rusqlite::Connection::open(restored.join("pcmail.db")).expect("restored db");
    let kept: std::collections::HashSet<String> = db
        .prepare("SELECT id FROM mail")
        .expect("select")
        .query_map([], |r| r.get(0))
        .expect("ids")
        .collect::<Result<_, _>>()
        .expect("ids");
    let jobs: i64 = db.query_row("SELECT count(*) FROM jobs", [], |r| r.get(0)).expect("jobs");
    let lost: Vec<&String> = before.iter().filter(|id| !kept.contains(*id)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} mails acknowledged before the backup are missing: {lost:?}",
        lost.len(),
        before.len()
    );
    assert!(jobs > 0, "the jobs under way are in the backup");

    // The restored store serves: machine tokens issued before the backup still work.
    drop(s);
    let r = Server::start_opts(None, "127.0.0.1:0", &["--store", &store]);
    let inbox = json(r.ctl(&builder, &["inbox", "-o", "json"]));
    assert!(inbox["items"].as_array().is_some_and(|a| !a.is_empty()), "builder's mail: {inbox}");
    let first = &before[0];
    let status = json(r.ctl(&builder, &["status", first, "-o", "json"]));
    assert_eq!(status["mail"]["id"], first.as_str(), "{status}");
    ok(r.ctl(&tokens[0], &["send", "--to", "builder", "--body", "after the restore"]));
}

/// What a supervisor and the machines see, read through the API: the same after a move.
fn what_everyone_sees(s: &Server, desk: &str, laptop: &str) -> Vec<String> {
    let mut seen = Vec::new();
    // Specs as applied; their status is what the server running them observes now.
    for kind in ["roster", "mailpolicy", "ledger", "function", "workerpool"] {
        let mut objects = json(s.admin(&["get", kind, "-o", "json"]));
        for object in objects["items"].as_array_mut().into_iter().flatten() {
            object.as_object_mut().map(|o| o.remove("status"));
        }
        seen.push(objects.to_string());
    }
    for args in [&["ledger", "list", "-o", "json"][..], &["jobs", "list", "-o", "json"], &["alerts", "-o", "json"]] {
        seen.push(ok(s.admin(args)));
    }
    seen.push(ok(s.ctl(desk, &["inbox", "--all", "--sent", "-o", "json"])));
    seen.push(ok(s.ctl(laptop, &["inbox", "--all", "-o", "json"])));
    seen
}

#[test]
fn o3_store_copy_moves_a_sqlite_store_to_postgresql_whose_server_serves_the_same_with_old_tokens() {
    let pg = PgScratch::new();
    let setup = crate::ledger::setup_with("30m", &["--resync", "300ms"]);
    let s = &setup.s;
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let policy = setup._dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: default}\nspec: {undeliveredAfter: 1s}\n",
    )
    .expect("policy");
    ok(s.admin(&["apply", "-f", &policy.display().to_string()]));
    // Mail in every state a move must keep, a ledger row, a job run to its end, an alert.
    let read = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "読んで", "--body", "b"]));
    ok(s.ctl(&desk, &["send", "--to", "builder", "--urgent", "--body", "never polled"]));
    ok(s.ctl(&laptop, &["poll"]));
    ok(s.ctl(&laptop, &["reply", &read, "--body", "done"]));
    crate::ledger::push(s, "csv", "見積書を送る", "draft");
    let job = ok(s.admin(&["jobs", "enqueue", "--queue", "heavy", "--function", "render"]));
    // Settled: the job ended, and both mails nobody polls for (to builder, the reply to desk)
    // have their undelivered alerts, so nothing changes between this look and the stop.
    eventually(20, "the job to finish and both undelivered alerts to fire", || {
        let jobs = ok(s.admin(&["jobs", "list", "-o", "json"]));
        let alerts = ok(s.admin(&["alerts", "-o", "json"]));
        (jobs.contains(&job) && jobs.contains("succeeded") && alerts.matches("\"undelivered\"").count() == 2)
            .then_some(())
    });
    let before = what_everyone_sees(s, &desk, &laptop);
    let data = s.dir.path().join("data");
    let (mut s, dir) = (setup.s, setup._dir);
    s.terminate();

    let sqlite = format!("sqlite:{}", data.join("pcmail.db").display());
    let out = offline(&["store", "copy", "--from", &sqlite, "--to", &pg.url]);
    assert!(out.status.success(), "store copy: {}", stderr(&out));
    let said = stderr(&out);
    assert!(said.contains("mail 3") && said.contains("specs"), "{said}");
    let verify = offline(&["store", "verify", "--from", &sqlite, "--to", &pg.url]);
    assert!(verify.status.success(), "store verify:\n{}{}", stdout(&verify), stderr(&verify));
    assert!(stdout(&verify).lines().skip(1).all(|l| l.ends_with("equal")), "{}", stdout(&verify));
    let refused = offline(&["store", "copy", "--from", &sqlite, "--to", &pg.url]);
    assert!(!refused.status.success() && stderr(&refused).contains("already holds data"), "{}", stderr(&refused));
    let mail_rows = pg.query("SELECT count(*) FROM mail");
    assert_eq!(mail_rows, [["3"]], "the refused copy wrote nothing");

    let p = Server::start_opts(None, "127.0.0.1:0", &["--store", &pg.url]);
    let after = what_everyone_sees(&p, &desk, &laptop);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a, b, "the same after the move");
    }
    ok(p.ctl(&laptop, &["send", "--to", "desk", "--body", "on PostgreSQL now"]));
    let verify = offline(&["store", "verify", "--from", &sqlite, "--to", &pg.url]);
    assert_eq!(verify.status.code(), Some(1), "a store that moved on differs: {}", stdout(&verify));
    assert!(stderr(&verify).contains("mail"), "{}", stderr(&verify));
    drop(dir);
}

#[test]
fn o2_o3_bad_backups_and_urls_are_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("restored").display().to_string();
    let missing = offline(&["restore", &dir.path().join("nope.db").display().to_string(), "--data-dir", &target]);
    assert!(!missing.status.success() && stderr(&missing).contains("there is no store at"), "{}", stderr(&missing));
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, b"not a database, just bytes\n".repeat(200)).expect("garbage");
    let out = offline(&["restore", &garbage.display().to_string(), "--data-dir", &target]);
    assert!(!out.status.success() && stderr(&out).contains("not a database"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&garbage).expect("kept"), b"not a database, just bytes\n".repeat(200), "left as it was");
    assert!(!dir.path().join("restored/pcmail.db").exists());
    let out = offline(&["store", "copy", "--from", "mysql://x", "--to", "sqlite:/tmp/x.db"]);
    assert!(!out.status.success() && stderr(&out).contains("expected sqlite:PATH"), "{}", stderr(&out));
    for url in [
        "postgres://u:secret@127.0.0.1:1/x",
        "postgres://127.0.0.1:1/x?user=u&password=secret",
        "postgress://u:secret@h/x",
    ] {
        let out = offline(&["store", "verify", "--from", url, "--to", "sqlite:/tmp/x.db"]);
        assert!(out.status.code() == Some(2) && !stderr(&out).contains("secret"), "{url}: {}", stderr(&out));
    }
    // Sources are only read: a wrong data dir is refused, not made into an empty store.
    let wrong = dir.path().join("wrong-dir");
    std::fs::create_dir(&wrong).expect("dir");
    let out = offline(&[
        "backup",
        &dir.path().join("b.db").display().to_string(),
        "--data-dir",
        &wrong.display().to_string(),
    ]);
    assert!(!out.status.success() && stderr(&out).contains("there is no store at"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&wrong).expect("dir").count(), 0, "nothing created in the wrong dir");
    let unrelated = dir.path().join("customers.db");
    rusqlite::Connection::open(&unrelated)
        .expect("raw")
        .execute("CREATE TABLE customers (name TEXT)", [])
        .expect("table");
    let before = std::fs::read(&unrelated).expect("read");
    let out = offline(&["restore", &unrelated.display().to_string(), "--data-dir", &target]);
    assert!(!out.status.success() && stderr(&out).contains("not a pcmail store"), "{}", stderr(&out));
    assert_eq!(std::fs::read(&unrelated).expect("read"), before, "the file restored from is never changed");
    let out = offline(&["backup", &dir.path().join("b.db").display().to_string(), "--store", "sqlite:"]);
    assert!(!out.status.success() && stderr(&out).contains("needs a file path"), "{}", stderr(&out));
    assert!(!dir.path().join("b.db").exists() && !dir.path().join("b.db.partial").exists());
}

#[test]
fn e14_a_changed_byte_in_a_backup_fails_restore_and_verify_naming_the_tab_and_a_planted_link_is_refused() {
    let s = Server::start();
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "pay", "--body", "wire 100 EUR to ZEBRA-0042"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let data = s.dir.path().join("data").display().to_string();
    // A link planted where the backup is written is refused; what it points at is untouched.
    let elsewhere = dir.path().join("elsewhere.txt");
    std::fs::write(&elsewhere, "mine").expect("write");
    let backup = dir.path().join("b.db");
    std::os::unix::fs::symlink(&elsewhere, dir.path().join("b.db.partial")).expect("link");
    let out = offline(&["backup", &backup.display().to_string(), "--data-dir", &data]);
    assert!(!out.status.success() && stderr(&out).contains("never written through"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&elsewhere).expect("read"), "mine");
    std::fs::remove_file(dir.path().join("b.db.partial")).expect("unlink");
    ok(offline(&["backup", &backup.display().to_string(), "--data-dir", &data]));

    // Untouched, it restores and verifies against the store it came from.
    let url = format!("sqlite:{}", backup.display());
    let source = format!("sqlite:{data}/pcmail.db");
    let verified = offline(&["store", "verify", "--from", &url, "--to", &source]);
    assert_eq!(verified.status.code(), Some(0), "{}", stderr(&verified));
    assert!(stderr(&verified).contains("matches the checksums it was written with"), "{}", stderr(&verified));

    // One byte of the mail's body changed in the file: restore and verify refuse, naming mail.
    let mut bytes = std::fs::read(&backup).expect("read");
    let at = bytes.windows(10).position(|w| w == b"ZEBRA-0042").expect("the body is in the file");
    bytes[at + 9] = b'3';
    std::fs::write(&backup, &bytes).expect("tamper");
    let target = dir.path().join("restored");
    let out = offline(&["restore", &backup.display().to_string(), "--data-dir", &target.display().to_string()]);
    let why = stderr(&out);
    assert!(!out.status.success() && why.contains("does not match its checksums in: mail"), "{why}");
    assert!(!target.join("pcmail.db").exists(), "checked before anything is written");
    let out = offline(&["store", "verify", "--from", &url, "--to", &source]);
    assert!(
        out.status.code().is_some_and(|c| c >= 2) && stderr(&out).contains("checksums in: mail"),
        "{}",
        stderr(&out)
    );
}
