//! C1 end to end: two `serve` replicas on one PostgreSQL database. One leads at a time; a
//! killed leader is replaced within two lease durations; a stopped one hands over at once;
//! notifications are posted once whichever replica took the mail or leads.

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
