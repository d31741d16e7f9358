//! C1 end to end: two `serve` replicas on one PostgreSQL database. One leads at a time; a
//! killed leader is replaced within two lease durations; a stopped one hands over at once;
//! notifications are posted once whichever replica took the mail or leads.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::monitoring::{manifests, undelivered};
use crate::webhook::Receiver;

const LEASE: Duration = Duration::from_secs(2);

fn leaders(servers: &[Server]) -> Vec<usize> {
    (0..servers.len()).filter(|&i| servers[i].is_leader()).collect()
}

/// The one leader, after checking for a while that there is never more than one.
fn sole_leader(servers: &[Server]) -> usize {
    let leader = eventually(10, "a leader", || match leaders(servers)[..] {
        [one] => Some(one),
        _ => None,
    });
    for _ in 0..10 {
        let now = leaders(servers);
        assert!(now.len() <= 1, "replicas {now:?} lead at once");
        std::thread::sleep(Duration::from_millis(100));
    }
    leader
}

#[test]
fn c1_one_leader_takes_over_within_two_lease_durations_and_notifications_are_never_duplicated() {
    let receiver = Receiver::start(vec![]);
    let pg = PgScratch::new();
    let m = manifests(&receiver.url);
    let extra = ["--resync", "300ms", "--lease", "2s", "--store", pg.url.as_str()];
    let first = Server::start_opts(Some(m.path().to_path_buf()), "127.0.0.1:0", &extra);
    let second = Server::replica_of(&first);
    let mut servers = vec![first, second];
    let leader = sole_leader(&servers);
    let (desk, builder) = (servers[0].token("desk"), servers[1].token("builder"));

    // Mail taken by either replica; the leader's sweep raises builder's undelivered alert (one
    // for all four, E18) once.
    let ids: Vec<String> = (0..4)
        .map(|n| {
            ok(servers[n % 2].ctl(&desk, &["send", "--to", "builder", "--subject", &format!("m{n}"), "--body", "b"]))
        })
        .collect();
    eventually(20, "the firing notification listing every mail", || {
        let alerts = ok(servers[0].admin(&["alerts", "--state", "firing", "-o", "json"]));
        (undelivered(&receiver, "builder") == ["firing"] && ids.iter().all(|id| alerts.contains(id.as_str())))
            .then_some(())
    });

    // SIGKILL the leader: the other takes over once the lease runs out.
    let killed_at = Instant::now();
    servers[leader].kill9();
    let survivor = 1 - leader;
    eventually(20, "the survivor to lead", || servers[survivor].is_leader().then_some(()));
    let took = killed_at.elapsed();
    assert!(took <= 2 * LEASE, "takeover took {took:?}, more than two lease durations");
    eprintln!("C1: takeover after SIGKILL in {took:?} (lease {LEASE:?})");

    // The new leader resolves what the old one fired, each state posted exactly once.
    ok(servers[survivor].ctl(&builder, &["poll"]));
    eventually(20, "the resolved notification", || {
        (undelivered(&receiver, "builder") == ["firing", "resolved"]).then_some(())
    });

    // The killed replica comes back as a follower; a SIGTERMed leader hands over at once.
    servers[leader].spawn();
    assert_eq!(sole_leader(&servers), survivor, "a returning replica does not take a live lease");
    let stopped_at = Instant::now();
    let (code, _) = servers[survivor].terminate();
    assert_eq!(code, Some(0));
    eventually(20, "the other replica to lead", || servers[leader].is_leader().then_some(()));
    let handover = stopped_at.elapsed();
    assert!(handover < LEASE, "a released lease is taken at the next attempt, not after expiry ({handover:?})");
    eprintln!("C1: handover after SIGTERM in {handover:?}");

    servers[leader].await_passes("notify", 2);
    assert_eq!(undelivered(&receiver, "builder"), ["firing", "resolved"], "each state posted exactly once");
}

#[test]
fn c1_mail_sent_through_one_replica_wakes_a_long_poll_on_the_other() {
    let pg = PgScratch::new();
    let extra = ["--lease", "2s", "--store", pg.url.as_str()];
    let first = Server::start_opts(Some(examples()), "127.0.0.1:0", &extra);
    let second = Server::replica_of(&first);
    let (desk, laptop) = (first.token("desk"), first.token("laptop"));
    ok(second.ctl(&laptop, &["poll"]));
    let waiting = std::thread::spawn({
        let url = second.url.clone();
        move || {
            let started = Instant::now();
            let rt = tokio::runtime::Runtime::new().expect("rt");
            let body: serde_json::Value = rt.block_on(async {
                reqwest::Client::new()
                    .get(format!("{url}/api/v1/poll"))
                    .query(&[("wait", "20s")])
                    .bearer_auth(laptop)
                    .send()
                    .await
                    .expect("poll")
                    .json()
                    .await
                    .expect("json")
            });
            (started.elapsed(), body)
        }
    });
    second.await_parked("poll", 1);
    let id = ok(first.ctl(&desk, &["send", "--to", "laptop", "--subject", "across", "--body", "b"]));
    let (waited, body) = waiting.join().expect("poller");
    let got: Vec<&str> = body["mail"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(got, [id.as_str()], "{body}");
    assert!(waited < Duration::from_secs(10), "woken by the announcement, not the 20 s timeout ({waited:?})");
    eprintln!("C1: a long-poll on the other replica answered after {waited:?}");
}

/// A rolling upgrade's manifests: a heavy function that logs each job and takes a second (so a
/// SIGKILL finds some running), a pool of two workers on short leases (a killed replica's jobs
/// are rescued within seconds), and a ledger whose rows run as that function.
fn upgrade_manifests() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("runs.log");
    let script = dir.path().join("work.sh");
    std::fs::write(&script, format!("#!/bin/sh\necho \"$PCMAIL_JOB_ID\" >> {}\nsleep 1\necho ok\n", log.display()))
        .expect("script");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let m = dir.path().join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    std::fs::write(
        m.join("work.yaml"),
        format!(
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: work}}\nspec:\n  command: [{}]\n  mode: heavy\n  timeout: 30s\n---\n\
             apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {{name: default}}\nspec:\n  workers: 2\n  queues: [heavy]\n  leaseDuration: 3s\n  maxAttempts: 10\n---\n\
             apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {{name: office}}\nspec:\n  project: office\n",
            script.display()
        ),
    )
    .expect("manifests");
    (dir, m)
}

/// Mail, jobs and ledger runs sent through `servers[n % 2]`, by the previous release's client
/// (`desk`, and the admin on odd rounds) and this one's (`builder`, the admin on even rounds):
/// every one accepted. Answers the mail ids and job ids, and the rows pushed.
fn in_flight(servers: &[Server], clients: &[&Path; 2], tokens: &[String; 3], round: usize) -> [Vec<String>; 3] {
    let [desk, builder, admin] = tokens;
    let (mut mail, mut jobs, mut rows) = (vec![], vec![], vec![]);
    for n in 0..4 {
        let s = &servers[n % 2];
        let (bin, sender) = if n / 2 == 0 { (clients[0], desk) } else { (clients[1], builder) };
        let subject = format!("r{round} m{n}");
        mail.push(ok(s.ctl_via(
            bin,
            &s.url,
            sender,
            &["send", "--to", "laptop", "--subject", &subject, "--body", "b"],
            None,
        )));
        let bin = clients[(n + round) % 2];
        let enqueue = ["jobs", "enqueue", "--queue", "heavy", "--function", "work"];
        jobs.push(ok(s.ctl_via(bin, &s.url, admin, &enqueue, None)));
        let task = format!("task r{round} n{n}");
        let push = ["ledger", "push", "--source", "manual", "--task", &task, "--function", "work"];
        let pushed: serde_json::Value =
            serde_json::from_str(&ok(s.ctl_via(bin, &s.url, admin, &push, None))).expect("push");
        assert_eq!(pushed["added"], 1, "{pushed}");
        let list = json(s.ctl_via(clients[1], &s.url, admin, &["ledger", "list", "-o", "json"], None));
        let row = list["items"].as_array().and_then(|r| r.iter().find(|r| r["task"] == task.as_str())).cloned();
        let id = row.and_then(|r| r["id"].as_str().map(String::from)).unwrap_or_else(|| panic!("{task} in {list}"));
        ok(s.ctl_via(bin, &s.url, admin, &["ledger", "run", &id, "--no-wait"], None));
        rows.push(id);
    }
    [mail, jobs, rows]
}

/// Until every job in `jobs` has succeeded and every row in `rows` has its run's result.
fn all_done(s: &Server, jobs: &[String], rows: &[String]) {
    eventually(60, "every job to succeed and every row's run to finish", || {
        let listed = json(s.admin(&["jobs", "list", "-o", "json"]));
        let state = |id: &String| {
            listed["items"].as_array()?.iter().find(|j| j["id"] == id.as_str())?["state"].as_str().map(String::from)
        };
        let ledger = json(s.admin(&["ledger", "list", "-o", "json"]));
        let ran = |id: &String| {
            let row = ledger["items"].as_array()?.iter().find(|r| r["id"] == id.as_str())?.clone();
            (row["state"] != "todo" && row["state"] != "running" && row["runRequested"] != true).then_some(())
        };
        (jobs.iter().all(|j| state(j).as_deref() == Some("succeeded")) && rows.iter().all(|r| ran(r).is_some()))
            .then_some(())
    });
}

#[test]
fn v5_replicas_of_the_previous_and_this_release_share_one_postgres_through_leader_handovers() {
    let previous = crate::previous::binary();
    let this = Path::new(BIN);
    let clients = [previous.as_path(), this];
    let (_dir, m) = upgrade_manifests();
    let pg = PgScratch::new();
    let extra = ["--resync", "300ms", "--lease", "2s", "--store", pg.url.as_str()];

    // The upgrade starts from the previous release alone, which made the store; then one
    // replica runs this build, which migrates what it adds (expand-only) while the other serves.
    let old = Server::start_bin(&previous, Some(m.clone()), &extra);
    let theirs = pg.query("SELECT version FROM pcmail_schema");
    let new = Server::replica_on(&old, this);
    let ours = pg.query("SELECT version FROM pcmail_schema");
    eprintln!("V5: schema {theirs:?} from {}, {ours:?} once this build joined", crate::previous::release());
    let mut servers = vec![old, new];
    let tokens = [servers[0].token("desk"), servers[1].token("builder"), servers[0].admin_token()];
    let laptop = servers[1].token("laptop");
    let mut sent = vec![];
    let (mut jobs, mut rows) = (vec![], vec![]);

    // Two handovers, each with mail, jobs and ledger runs in flight: the previous release's
    // leader killed (this build's replica takes over), then, the killed one back on the store
    // this build migrated, this build's leader killed in turn.
    for round in 0..2 {
        let leader = sole_leader(&servers);
        let [m, j, r] = in_flight(&servers, &clients, &tokens, round);
        servers[leader].kill9();
        let survivor = 1 - leader;
        eventually(20, "the other replica to lead", || servers[survivor].is_leader().then_some(()));
        eprintln!("V5: round {round}: replica {leader} ({}) killed, {survivor} leads", ["previous", "this"][leader]);
        servers[leader].spawn();
        assert_eq!(sole_leader(&servers), survivor, "the restarted replica follows");
        sent.extend(m);
        jobs.extend(j);
        rows.extend(r);
        all_done(&servers[survivor], &jobs, &rows);
    }

    // Nothing lost: every mail reaches laptop, read through either replica.
    for s in &servers {
        ok(s.ctl(&laptop, &["poll"]));
        let inbox = json(s.ctl_via(this, &s.url, &laptop, &["inbox", "--all", "-o", "json"], None));
        let got: Vec<&str> = inbox["items"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
        for id in &sent {
            assert!(got.contains(&id.as_str()), "{id} lost: {inbox}");
        }
    }
    assert_eq!(sent.len(), 8);
}
