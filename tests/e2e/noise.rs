//! E18 as issue #30 found it: one cause, one alert. A paused or restarted `serve` blames no
//! receiver; a stalled machine's undelivered mail is one alert listing it; losing leadership is
//! logged; `/metrics` answers from memory while the store is down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::harness::*;
use crate::webhook::Receiver;

/// The example Roster with a MailPolicy of seconds (`spec` as YAML flow), in a folder for
/// `serve --apply`.
fn policy(spec: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(examples().join("roster.yaml"), dir.path().join("roster.yaml")).expect("roster");
    let text = format!("apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {{name: default}}\nspec: {spec}\n");
    std::fs::write(dir.path().join("policy.yaml"), text).expect("policy");
    dir
}

/// Polls as `token` every 300 ms (no long-poll) until dropped, as a live agent would.
struct Poller(Arc<AtomicBool>);

impl Poller {
    fn start(url: &str, token: &str) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, token, until) = (url.to_string(), token.to_string(), stop.clone());
        std::thread::spawn(move || {
            let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(2)).build().expect("client");
            while !until.load(Ordering::Relaxed) {
                let _ = http.get(format!("{url}/api/v1/poll?cursor=0")).bearer_auth(&token).send();
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Poller(stop)
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The receiver-down alerts of `machine`, as the alerts tab holds them (state of each row).
fn receiver_down(s: &Server, machine: &str) -> Vec<String> {
    let alerts = json(s.admin(&["alerts", "--all", "-o", "json"]));
    alerts["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["kind"] == "receiver-down" && a["subject"] == machine)
        .map(|a| a["state"].as_str().unwrap_or_default().to_string())
        .collect()
}

fn signal(s: &Server, sig: &str) {
    let sent = std::process::Command::new("kill").args([sig, &s.pid().to_string()]).status().expect("kill");
    assert!(sent.success(), "kill {sig}");
}

#[test]
fn e18_a_pause_or_restart_of_serve_longer_than_receiver_down_after_blames_no_receiver() {
    let m = policy("{receiverDownAfter: 4s}");
    let listen = format!("127.0.0.1:{}", free_port());
    let mut s = Server::start_opts(Some(m.path().to_path_buf()), &listen, &["--resync", "300ms"]);
    let (laptop, builder) = (s.token("laptop"), s.token("builder"));
    // builder polls once and falls silent: its alert shows the rule is live.
    ok(s.ctl(&builder, &["poll"]));
    let poller = Poller::start(&s.url, &laptop);
    eventually(20, "builder to be down", || (receiver_down(&s, "builder") == ["firing"]).then_some(()));

    // Paused twice as long as receiverDownAfter: nobody could poll it meanwhile.
    signal(&s, "-STOP");
    std::thread::sleep(Duration::from_secs(8));
    signal(&s, "-CONT");
    s.await_passes("mail-sweep", 3);
    std::thread::sleep(Duration::from_secs(5));
    s.await_passes("mail-sweep", 2);
    assert_eq!(receiver_down(&s, "laptop"), Vec::<String>::new(), "a paused server blamed laptop");

    // Down for as long, then started again.
    s.kill9();
    std::thread::sleep(Duration::from_secs(8));
    s.spawn();
    std::thread::sleep(Duration::from_secs(5));
    s.await_passes("mail-sweep", 2);
    assert_eq!(receiver_down(&s, "laptop"), Vec::<String>::new(), "a restarted server blamed laptop");
    assert_eq!(receiver_down(&s, "builder"), ["firing"], "builder stays down, fired once, through both");
    drop(poller);
}

#[test]
fn e18_a_stalled_machines_undelivered_mail_is_one_alert_listing_its_mails() {
    let receiver = Receiver::start(vec![]);
    let m = policy(&format!(
        "{{undeliveredAfter: 1s, receiverDownAfter: 1h, notify: {{webhook: \"{}\", format: alertmanager, minInterval: 100ms}}}}",
        receiver.url
    ));
    let s = Server::start_opts(Some(m.path().to_path_buf()), "127.0.0.1:0", &["--resync", "300ms"]);
    let (desk, builder) = (s.token("desk"), s.token("builder"));
    let ids: Vec<String> = (0..6)
        .map(|n| ok(s.ctl(&desk, &["send", "--to", "builder", "--subject", &format!("part {n}"), "--body", "b"])))
        .collect();
    let firing = eventually(20, "one undelivered alert listing all six", || {
        let alerts = json(s.admin(&["alerts", "--state", "firing", "-o", "json"]));
        let list = alerts["items"].as_array()?.clone();
        let all = list.len() == 1 && ids.iter().all(|id| list[0]["summary"].as_str().is_some_and(|t| t.contains(id)));
        all.then_some(list)
    });
    assert_eq!((firing[0]["kind"].as_str(), firing[0]["subject"].as_str()), (Some("undelivered"), Some("builder")));
    eventually(20, "the firing notification", || {
        let posted: Vec<_> =
            receiver.alerts().into_iter().filter(|(name, _, _)| name == "PcmailMailUndelivered").collect();
        (!posted.is_empty()).then_some(())
    });
    ok(s.ctl(&builder, &["poll"]));
    eventually(20, "the resolved notification", || {
        let posted: Vec<(String, String)> = receiver
            .alerts()
            .into_iter()
            .filter(|(name, _, _)| name == "PcmailMailUndelivered")
            .map(|(_, subject, state)| (subject, state))
            .collect();
        let want = [("builder".to_string(), "firing".to_string()), ("builder".to_string(), "resolved".to_string())];
        (posted == want).then_some(())
    });
    eprintln!("E18: 6 undelivered mails to one machine, 1 alert: {}", firing[0]["summary"]);
}

#[test]
fn e18_metrics_answer_from_memory_while_the_store_is_down_and_losing_leadership_is_logged() {
    let pg = PgScratch::new();
    let mut s = Server::start_logged_opts(
        Some(examples()),
        &["--resync", "300ms", "--lease", "2s", "--store", pg.url.as_str()],
    );
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "counted", "--body", "b"]));
    eventually(10, "a leader", || s.is_leader().then_some(()));
    assert_eq!(s.metric("pcmail_mail{state=\"new\"}"), Some(1.0));
    assert_eq!(s.metric("pcmail_store_read_failed"), Some(0.0));

    // The database goes away under serve.
    pg.drop_now();
    let body = eventually(20, "/metrics to say the store read failed", || {
        let r = reqwest::blocking::get(format!("{}/metrics", s.url)).ok()?;
        let status = r.status().as_u16();
        let body = r.text().ok()?;
        assert_eq!(status, 200, "/metrics answers while the store is down: {body}");
        body.contains("pcmail_store_read_failed 1").then_some(body)
    });
    assert!(body.contains("pcmail_mail{state=\"new\"} 1"), "the store-read gauge keeps its last value");
    eventually(20, "leadership lost in the log", || {
        let log = s.log();
        log.lines().find(|l| l.contains("leadership lost") && l.contains("replica")).map(String::from)
    });
    s.kill9();
}
