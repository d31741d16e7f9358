//! E15 as issue #30 found it: a full disk under `serve` (a small tmpfs the test mounts, filled
//! with a file) is a readiness reason, a metric and an alert, said in the log once, not once per
//! refused request; `serve` starts on the full disk and serves reads; freeing space clears it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::clock::{as_refs, faked, step_to};
use crate::faults::SmallDisk;
use crate::harness::*;

/// Fills the filesystem holding `dir` with one file (`fill`), to the last block.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("fill");
    let mut f = std::fs::File::create(&path).expect("fill file");
    for chunk in [1 << 20, 4096, 512] {
        let zeros = vec![0u8; chunk];
        while f.write_all(&zeros).and_then(|()| f.flush()).is_ok() {}
    }
    path
}

fn get(url: &str) -> (u16, String) {
    let r = reqwest::blocking::get(url).expect("get");
    (r.status().as_u16(), r.text().unwrap_or_default())
}

fn send(s: &Server, token: &str, subject: &str) -> (u16, String) {
    let r = reqwest::blocking::Client::new()
        .post(format!("{}/api/v1/mail", s.url))
        .bearer_auth(token)
        .json(&serde_json::json!({"to": "laptop", "subject": subject, "body": "b"}))
        .send()
        .expect("send");
    (r.status().as_u16(), r.text().unwrap_or_default())
}

/// `serve` started on `apply` with its data dir on a 16 MiB disk of its own, its log kept, and
/// `env` in its environment; the disk goes when the returned one is dropped.
fn start_on_small_disk(apply: &Path, extra: &[&str], env: &[(&str, &str)]) -> (Server, SmallDisk) {
    let mut disk = None;
    let mut s = Server::unstarted_logged_on(Some(apply.to_path_buf()), extra, |data| {
        disk = Some(SmallDisk::mount(data, "16m"));
    });
    s.set_env(env);
    s.spawn();
    (s, disk.expect("mounted before serve started"))
}

fn no_space(s: &Server) -> f64 {
    s.metric("pcmail_store_write_errors_total{reason=\"no_space\"}").unwrap_or(-1.0)
}

#[test]
fn e15_a_full_disk_is_a_readiness_reason_a_metric_and_a_log_line_and_serve_starts_on_it_serving_reads() {
    let (mut s, disk) = start_on_small_disk(&examples(), &["--resync", "300ms"], &[]);
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let before = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "before the disk filled", "--body", "b"]));
    assert_eq!(get(&format!("{}/readyz", s.url)).0, 200);
    assert_eq!(no_space(&s), 0.0, "the counter is there at 0");

    let filler = fill(&s.dir.path().join("data"));
    let (status, body) = send(&s, &desk, "on a full disk");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("disk is full"), "the refusal names the disk: {body}");
    // A burst of refused sends: each counted, the log says it once.
    let log_before = s.log().lines().count();
    for n in 0..300 {
        assert_eq!(send(&s, &desk, &format!("refused {n}")).0, 503);
    }
    let (ready, why) = get(&format!("{}/readyz", s.url));
    assert_eq!(ready, 503, "{why}");
    assert!(why.contains("disk is full (E15)"), "readiness names the disk: {why}");
    let counted = no_space(&s);
    assert!(counted >= 301.0, "every refused write counted: {counted}");
    assert_eq!(s.metric("pcmail_store_unwritable"), Some(1.0));
    let said: Vec<String> = s.log().lines().skip(log_before).map(String::from).collect();
    assert!(said.len() <= 10, "301 refused sends, {} log lines:\n{}", said.len(), said.join("\n"));
    assert!(s.log().contains("the store refuses writes: its disk is full (E15)"), "{}", s.log());

    // Reads still answer, and serve starts again on the full disk and serves them.
    let read = |s: &Server| {
        let inbox = ok(s.ctl(&laptop, &["inbox", "-o", "json"]));
        assert!(inbox.contains(&before), "{inbox}");
        let status = json(s.ctl(&desk, &["status", &before, "-o", "json"]));
        assert_eq!(status["mail"]["state"], "new");
    };
    read(&s);
    let (code, _) = s.terminate();
    assert_eq!(code, Some(0));
    s.spawn();
    read(&s);
    // A restarted server learns of the full disk from its first refused write (E13: a lease it
    // still sees held needs none at start).
    assert_eq!(send(&s, &desk, "refused after the restart").0, 503);
    let (ready, why) = eventually(10, "readiness to name the disk after the restart", || {
        Some(get(&format!("{}/readyz", s.url))).filter(|(status, _)| *status == 503)
    });
    assert!(why.contains("disk is full"), "{ready} {why}");
    eprintln!("E15: {counted} refused writes counted, {} log line(s) for 301 refused sends", said.len());

    // Space returns: readiness clears by itself and sends are taken again.
    std::fs::remove_file(filler).expect("free the disk");
    eventually(10, "readiness back", || (get(&format!("{}/readyz", s.url)).0 == 200).then_some(()));
    let (status, body) = send(&s, &desk, "after space returned");
    assert!(status < 300, "{status} {body}");
    assert_eq!(s.metric("pcmail_store_unwritable"), Some(0.0));
    s.kill9();
    drop(disk);
}

/// E15 with E13's clock: a Schedule entry that falls due on a full disk is tried again every
/// second (it runs when it can), and the health watch says the full disk once — the entry's
/// tries say nothing each at warn, only at debug. A step of serve's wall clock past the next
/// minute makes the examples' every-minute `mail-sweep` entry due while the disk is full.
#[test]
fn e15_a_schedule_entry_due_on_a_full_disk_is_tried_each_second_and_not_logged_at_each_try() {
    const TRY: &str = "cannot record a schedule's run";
    let clock = tempfile::tempdir().expect("tempdir");
    let offsets = clock.path().join("offset");
    step_to(&offsets, 0);
    let mut env = faked(&offsets);
    // The entry's tries are seen at debug; everything else at warn, as an operator's log has it.
    env.push(("PCMAIL_LOG".into(), "warn,pcmail_server::controller::schedules=debug".into()));
    let (mut s, disk) = start_on_small_disk(&examples(), &["--lease", "60s"], &as_refs(&env));
    eventually(10, "serve to lead", || s.is_leader().then_some(()));

    let log_before = s.log().lines().count();
    let filler = fill(&s.dir.path().join("data"));
    step_to(&offsets, 61);
    std::thread::sleep(Duration::from_secs(6));
    let said: Vec<String> = s.log().lines().skip(log_before).map(String::from).collect();
    let (tries, rest): (Vec<&String>, Vec<&String>) = said.iter().partition(|l| l.contains(TRY));
    assert!(tries.len() >= 3, "the due entry is tried every second:\n{}", said.join("\n"));
    assert!(tries.iter().all(|l| l.contains("DEBUG")), "a try is not a warning:\n{}", said.join("\n"));
    // The full disk said once (a reminder, "still:", may follow the clock's minute step).
    assert!(rest.len() <= 2, "{} lines besides the tries:\n{}", rest.len(), said.join("\n"));
    assert!(
        rest.iter().any(|l| l.contains("its disk is full (E15)")),
        "the health watch says it:\n{}",
        said.join("\n")
    );

    // Space returns: the entry is recorded at its next try, and readiness clears.
    std::fs::remove_file(filler).expect("free the disk");
    eventually(20, "readiness back", || (get(&format!("{}/readyz", s.url)).0 == 200).then_some(()));
    let tried = s.log().lines().filter(|l| l.contains(TRY)).count();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.log().lines().filter(|l| l.contains(TRY)).count(), tried, "recorded: no more tries");
    assert_eq!(s.metric("pcmail_store_unwritable"), Some(0.0));
    s.kill9();
    drop(disk);
}

/// E15's alert to a dead webhook (nothing listens at its port): tried again while the disk is
/// full, said once in the log, not once a try or a retry.
#[test]
fn e15_a_dead_webhook_for_the_store_unwritable_alert_is_said_once_not_at_every_try() {
    const TRY: &str = "store-unwritable not notified";
    let dead = std::net::TcpListener::bind("127.0.0.1:0").expect("a port");
    let webhook = format!("http://{}/hook", dead.local_addr().expect("address"));
    drop(dead);
    let m = crate::monitoring::manifests(&webhook);
    let debug = [("PCMAIL_LOG", "warn,pcmail_server::controller::notifier=debug")];
    let (mut s, disk) = start_on_small_disk(m.path(), &[], &debug);
    let desk = s.token("desk");
    let filler = fill(&s.dir.path().join("data"));
    assert_eq!(send(&s, &desk, "on a full disk").0, 503);
    let tries = || s.log().lines().filter(|l| l.contains(TRY)).map(String::from).collect::<Vec<_>>();
    // Each try is a post and its retries, a few seconds.
    eventually(30, "a second try of the post", || (tries().len() >= 2).then_some(()));
    let said = tries();
    let warned: Vec<&String> = said.iter().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warned.len(), 1, "said once:\n{}", said.join("\n"));
    assert!(warned[0].contains("trying again at each tick"), "{}", warned[0]);
    let retries = s.log().lines().filter(|l| l.contains("notification post failed")).count();
    assert!(retries >= 1, "the post's retries are there at debug");
    assert!(!s.log().lines().any(|l| l.contains("notification post failed") && l.contains("WARN")), "{}", s.log());

    // The episode ends unposted; the next full disk is news again, said once more.
    std::fs::remove_file(filler).expect("free the disk");
    eventually(20, "readiness back", || (get(&format!("{}/readyz", s.url)).0 == 200).then_some(()));
    // Past a try still under way (a post and its retries, at most about 6 s), so the alert
    // sees the episode's end.
    std::thread::sleep(Duration::from_secs(8));
    let filler = fill(&s.dir.path().join("data"));
    assert_eq!(send(&s, &desk, "on a full disk again").0, 503);
    let warnings = || tries().iter().filter(|l| l.contains("WARN")).count();
    eventually(30, "the second episode's warning", || (warnings() == 2).then_some(()));
    std::fs::remove_file(filler).expect("free the disk");
    s.kill9();
    drop(disk);
}

#[test]
fn e15_the_store_unwritable_rule_fires_while_the_disk_is_full_in_promtool() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/prometheus");
    let out = Command::new("promtool")
        .args(["test", "rules", "pcmail-rules.test.yaml"])
        .current_dir(&dir)
        .output()
        .expect("promtool must be installed (scripts/test installs prometheus)");
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("SUCCESS"), "{}", stdout(&out));
}

/// Runs `sql` on the PostgreSQL `url` names.
fn pg_run(url: &str, sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client.batch_execute(sql).await.expect(sql);
    });
}

fn count_mail(url: &str) -> i64 {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(conn);
        client.query_one("SELECT count(*) FROM mail", &[]).await.expect("count").get(0)
    })
}

/// E15 on PostgreSQL: the database's files on a small tmpfs of the test's own (a tablespace;
/// its write-ahead log stays on the large disk, as a full data volume meets it), filled under
/// sends. The server's refusals (SQLSTATE 53100) are 503s naming the disk, readiness and the
/// metric say so, and once space is freed sends are taken again with nothing acknowledged lost.
#[test]
fn e15_a_full_postgresql_disk_is_a_503_a_readiness_reason_and_a_metric_and_nothing_acknowledged_is_lost() {
    let pg = crate::outage::OwnPostgres::start();
    let small = pg.dir.path().join("small");
    let disk = SmallDisk::mount(&small, "32m");
    let spaces = small.join("tablespace");
    std::fs::create_dir(&spaces).expect("tablespace dir");
    let chown = Command::new("chown").args(["postgres:postgres"]).arg(&spaces).status().expect("chown");
    assert!(chown.success());
    pg_run(&pg.url(), &format!("CREATE TABLESPACE small LOCATION '{}'", spaces.display()));
    pg_run(&pg.url(), "CREATE DATABASE pcmail TABLESPACE small");
    let url = format!("{}/pcmail", pg.url().rsplit_once('/').map_or("", |(base, _)| base));
    let mut s = Server::start_logged_opts(Some(examples()), &["--store", &url]);
    let desk = s.token("desk");
    assert!(send(&s, &desk, "before the disk filled").0 < 300);

    let filler = fill(&small);
    // Pages with room left may take a few more; each one answered 2xx must survive.
    let mut acknowledged = 1;
    let (_, body) = (0..5000)
        .map(|n| send(&s, &desk, &format!("filling {n}")))
        .find(|(status, body)| {
            if *status < 300 {
                acknowledged += 1;
            }
            assert!(*status < 300 || *status == 503, "{status} {body}");
            *status == 503
        })
        .expect("a send refused once the disk is full");
    assert!(body.contains("disk is full"), "the refusal names the disk: {body}");
    for n in 0..50 {
        let (status, _) = send(&s, &desk, &format!("refused {n}"));
        if status < 300 {
            acknowledged += 1;
        }
    }
    let (ready, why) = get(&format!("{}/readyz", s.url));
    assert_eq!(ready, 503, "{why}");
    assert!(why.contains("disk is full (E15)"), "readiness names the disk: {why}");
    assert_eq!(s.metric("pcmail_store_unwritable"), Some(1.0));
    assert!(no_space(&s) >= 1.0, "the refusals counted as no_space");
    assert!(s.log().contains("disk is full"), "{}", s.log());
    eprintln!("E15 on PostgreSQL: {acknowledged} sends acknowledged, then refused; {} counted", no_space(&s));

    std::fs::remove_file(filler).expect("free the disk");
    let (status, body) = eventually(20, "a send taken again", || {
        Some(send(&s, &desk, "after space returned")).filter(|(status, _)| *status < 300)
    });
    assert!(status < 300, "{body}");
    acknowledged += 1;
    eventually(20, "readiness back", || (get(&format!("{}/readyz", s.url)).0 == 200).then_some(()));
    assert_eq!(s.metric("pcmail_store_unwritable"), Some(0.0));
    assert_eq!(count_mail(&url), acknowledged, "every acknowledged send is stored, no other");
    s.kill9();
    drop(pg);
    drop(disk);
}

/// E15's alert on the MailPolicy's webhook: posted from memory (the store cannot record it),
/// one firing for the episode however many writes it refuses, one resolution when it ends.
#[test]
fn e15_a_full_disk_posts_one_store_unwritable_firing_and_one_resolution_to_the_webhook() {
    let receiver = crate::webhook::Receiver::start(vec![]);
    let m = crate::monitoring::manifests(&receiver.url);
    let (mut s, disk) = start_on_small_disk(m.path(), &["--resync", "300ms"], &[]);
    let desk = s.token("desk");
    assert!(send(&s, &desk, "before the disk filled").0 < 300);
    let posted = || -> Vec<(String, String)> {
        let alerts = receiver.alerts().into_iter();
        alerts
            .filter(|(name, ..)| name == "PcmailStoreRefusingWrites")
            .map(|(_, subject, status)| (subject, status))
            .collect()
    };

    let filler = fill(&s.dir.path().join("data"));
    assert_eq!(send(&s, &desk, "on a full disk").0, 503);
    let fired = eventually(20, "the store-unwritable firing on the webhook", || {
        let p = posted();
        (!p.is_empty()).then_some(p)
    });
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0].1, "firing");
    assert!(!fired[0].0.is_empty(), "it names the replica");
    // The episode goes on: hundreds more refusals, over some seconds, post nothing more.
    for n in 0..300 {
        assert_eq!(send(&s, &desk, &format!("refused {n}")).0, 503);
    }
    assert_eq!(posted(), fired, "one firing for the episode");

    std::fs::remove_file(filler).expect("free the disk");
    let both = eventually(30, "the resolution on the webhook", || {
        let p = posted();
        (p.len() >= 2).then_some(p)
    });
    let states: Vec<&str> = both.iter().map(|(_, status)| status.as_str()).collect();
    assert_eq!(states, ["firing", "resolved"], "{both:?}");
    assert!(send(&s, &desk, "after space returned").0 < 300);
    assert_eq!(posted().len(), 2, "nothing more once resolved");
    s.kill9();
    drop(disk);
}
