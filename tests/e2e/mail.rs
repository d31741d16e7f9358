//! Seed 000's definition of done and the mail rules M1–M12, through the real CLI.

use crate::harness::*;

fn state(s: &Server, token: &str, id: &str) -> String {
    json(s.ctl(token, &["status", id, "-o", "json"]))["mail"]["state"].as_str().expect("state").to_string()
}

#[test]
fn m11_m12_m7_note_to_oneself_is_delivered_by_next_poll_then_seen_then_done() {
    let s = Server::start();
    let desk = s.token("desk");
    let id = ok(s.ctl(&desk, &["send", "--to", "desk", "--subject", "自分へのメモ", "--body", "remember"]));
    assert!(id.starts_with("mail--") && id.len() == 14, "send prints the id alone: {id:?}");
    assert_eq!(state(&s, &desk, &id), "new");

    let polled = json(s.ctl(&desk, &["poll", "-o", "json"]));
    assert_eq!(polled["mail"][0]["id"], id.as_str());
    assert_eq!(state(&s, &desk, &id), "delivered");

    let read = ok(s.ctl(&desk, &["read", &id]));
    assert!(read.contains("remember") && read.contains("自分へのメモ"), "{read}");
    let status = json(s.ctl(&desk, &["status", &id, "-o", "json"]));
    assert_eq!(status["mail"]["state"], "seen");
    assert_eq!(status["mail"]["seenBy"], "desk");

    ok(s.ctl(&desk, &["ack", &id]));
    let status = json(s.ctl(&desk, &["status", &id, "-o", "json"]));
    assert_eq!(status["mail"]["state"], "done");
    let reasons: Vec<_> = status["events"].as_array().expect("events").iter().map(|e| e["reason"].clone()).collect();
    assert_eq!(reasons, ["Sent", "Delivered", "Seen", "Done"]);
    // M1: a late seen after done answers ok and changes nothing.
    ok(s.ctl(&desk, &["read", &id]));
    assert_eq!(state(&s, &desk, &id), "done");
}

#[test]
fn m11_a_lost_poll_answer_is_redelivered_from_the_old_cursor() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "s", "--body", "b"]));
    let client = s.http();
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let poll = |cursor: i64| {
        rt.block_on(async {
            client
                .get(format!("{}/api/v1/poll?cursor={cursor}", s.url))
                .bearer_auth(&laptop)
                .send()
                .await
                .expect("poll")
                .json::<serde_json::Value>()
                .await
                .expect("json")
        })
    };
    let first = poll(0);
    let again = poll(0);
    assert_eq!(first["mail"][0]["id"], id.as_str());
    assert_eq!(again["mail"][0]["id"], id.as_str(), "re-polling the old cursor re-delivers");
    assert_eq!(again["mail"][0]["deliveredAt"], first["mail"][0]["deliveredAt"], "first stamp kept");
    let after = poll(first["cursor"].as_i64().expect("cursor"));
    assert_eq!(after["mail"].as_array().map(Vec::len), Some(0));
}

#[test]
fn m11_long_poll_returns_as_soon_as_mail_arrives() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let started = std::time::Instant::now();
    let waiter = {
        let (url, laptop) = (s.url.clone(), laptop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("rt");
            rt.block_on(async {
                reqwest::Client::new()
                    .get(format!("{url}/api/v1/poll?cursor=0&wait=30s"))
                    .bearer_auth(&laptop)
                    .send()
                    .await
                    .expect("poll")
                    .json::<serde_json::Value>()
                    .await
                    .expect("json")
            })
        })
    };
    s.await_parked("poll", 1);
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "s", "--body", "b"]));
    let got = waiter.join().expect("waiter");
    assert_eq!(got["mail"][0]["id"], id.as_str());
    assert_eq!(got["mail"][0]["state"], "delivered");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(25),
        "the long-poll woke on arrival, not at its timeout"
    );
}

#[test]
fn m3_partial_address_exits_4_lists_candidates_and_sends_nothing() {
    let s = Server::start();
    let desk = s.token("desk");
    let out = s.ctl(&desk, &["send", "--to", "lap", "--subject", "s", "--body", "b"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("candidate: laptop"), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    let laptop = s.token("laptop");
    let inbox = json(s.ctl(&laptop, &["inbox", "--all", "-o", "json"]));
    assert_eq!(inbox["items"].as_array().map(Vec::len), Some(0), "nothing was sent");
    // Exact hostname and alias resolve to the canonical label.
    let id = ok(s.ctl(&desk, &["send", "--to", "LAPTOP-KIM", "--subject", "s", "--body", "b"]));
    assert_eq!(json(s.ctl(&desk, &["status", &id, "-o", "json"]))["mail"]["to"], "laptop");
}

#[test]
fn m3_server_fails_closed_without_a_roster() {
    let s = Server::start_with(None);
    let out = s.ctl(&s.admin_token(), &["--as", "desk", "send", "--to", "desk", "--subject", "s", "--body", "b"]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("no Roster is applied"), "{}", stderr(&out));
}

#[test]
fn m5_auto_reply_to_auto_mail_exits_3_and_reply_to_a_reply_exits_3() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let auto = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "bot", "--body", "b", "--auto"]));
    let out = s.ctl(&laptop, &["reply", &auto, "--body", "bot answer", "--auto"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert_eq!(state(&s, &laptop, &auto), "new", "a refused reply moves nothing");

    let human = ok(s.ctl(&laptop, &["reply", &auto, "--body", "a person answers"]));
    let out = s.ctl(&desk, &["reply", &human, "--body", "thanks"]);
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("new thread"), "{}", stderr(&out));
}

#[test]
fn m6_m7_reply_sets_parent_done_and_same_body_gets_same_id_new_body_new_id() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let parent =
        ok(s.ctl(&desk, &["send", "--to", "laptop", "--kind", "request", "--subject", "review", "--body", "pls"]));
    let ack = ok(s.ctl(&laptop, &["reply", &parent, "--body", "received"]));
    let again = ok(s.ctl(&laptop, &["reply", &parent, "--body", "received"]));
    assert_eq!(ack, again, "the same reply is idempotent");
    let real = ok(s.ctl(&laptop, &["reply", &parent, "--body", "LGTM with two nits"]));
    assert_ne!(real, ack, "a different body is not swallowed by the receipt-ack");

    let status = json(s.ctl(&desk, &["status", &parent, "-o", "json"]));
    assert_eq!(status["mail"]["state"], "done");
    assert_eq!(status["mail"]["result"], "received");
    let answers = json(s.ctl(&desk, &["inbox", "-o", "json"]))["items"].clone();
    assert_eq!(answers.as_array().map(Vec::len), Some(2));
    assert_eq!(answers[0]["hop"], 1);
    assert_eq!(answers[0]["kind"], "answer");
}

#[test]
fn m12_status_wait_for_returns_when_seen_and_times_out_with_exit_5() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "s", "--body", "b"]));
    let out = s.ctl(&desk, &["status", &id, "--wait-for", "seen", "--timeout", "1s"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));

    let waiter = {
        let (url, dir) = (s.url.clone(), s.dir.path().to_path_buf());
        let (desk, id) = (desk.clone(), id.clone());
        std::thread::spawn(move || {
            std::process::Command::new(BIN)
                .args(["status", &id, "--wait-for", "seen", "--timeout", "30s", "-o", "json"])
                .env("PCMAIL_SERVER", url)
                .env("PCMAIL_TOKEN", desk)
                .env("PCMAIL_HOME", dir.join("waiter-home"))
                .output()
                .expect("status")
        })
    };
    let started = std::time::Instant::now();
    // The wait is parked before the mail is read: it is woken by the move, not answered at once.
    s.await_parked("status", 1);
    ok(s.ctl(&laptop, &["read", &id]));
    let out = waiter.join().expect("waiter");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(status["mail"]["state"], "seen");
}

#[test]
fn m7_fail_with_reason_and_body_from_stdin() {
    let s = Server::start();
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let id = ok(s.ctl_stdin(
        &desk,
        &["send", "--to", "laptop", "--subject", "s", "--body", "-"],
        Some("長い本文\n2行目".as_bytes()),
    ));
    let status = json(s.ctl(&desk, &["status", &id, "-o", "json"]));
    assert_eq!(status["mail"]["body"], "長い本文\n2行目");
    ok(s.ctl(&laptop, &["fail", &id, "--reason", "cannot build on this PC"]));
    let status = json(s.ctl(&desk, &["status", &id, "-o", "json"]));
    assert_eq!(
        (status["mail"]["state"].as_str(), status["mail"]["failReason"].as_str()),
        (Some("failed"), Some("cannot build on this PC"))
    );

    let bad =
        s.ctl_stdin(&desk, &["send", "--to", "laptop", "--subject", "s", "--body", "-"], Some(&[0x66, 0xff, 0xfe]));
    assert_eq!(code(&bad), 1);
    assert!(stderr(&bad).contains("not valid UTF-8"), "{}", stderr(&bad));
}

#[test]
fn acknowledged_send_survives_sigkill_of_serve() {
    let mut s = Server::start();
    let desk = s.token("desk");
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "durable", "--body", "b"]));
    s.kill9();
    s.restart();
    let status = json(s.ctl(&desk, &["status", &id, "-o", "json"]));
    assert_eq!(status["mail"]["subject"], "durable");
    assert_eq!(status["mail"]["state"], "new");
}

#[test]
fn sigterm_stops_serve_promptly_and_answers_long_polls_in_flight() {
    let mut s = Server::start();
    let laptop = s.token("laptop");
    let poller = {
        let (url, laptop) = (s.url.clone(), laptop.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("rt");
            rt.block_on(async {
                let r = reqwest::Client::new()
                    .get(format!("{url}/api/v1/poll?cursor=0&wait=60s"))
                    .bearer_auth(&laptop)
                    .send()
                    .await
                    .expect("poll");
                r.status().as_u16()
            })
        })
    };
    s.await_parked("poll", 1);
    let (code, took) = s.terminate();
    assert_eq!(code, Some(0), "a clean exit");
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
    assert_eq!(poller.join().expect("poller"), 200, "the long-poll was answered, not cut");
}

/// U3/U6 for mail: the API pages a machine's mail by cursor (a cursor to another machine's mail
/// pages nothing), filters by state and machine and says how many more in a header; `inbox`
/// shows 100 and the hint, `--all` every mail.
#[test]
fn u3_u6_mail_pages_by_cursor_within_its_mailbox_and_inbox_says_how_many_more() {
    let s = Server::start();
    let (desk, laptop, builder) = (s.token("desk"), s.token("laptop"), s.token("builder"));
    let http = reqwest::blocking::Client::new();
    let mut sent = Vec::new();
    for n in 0..120 {
        let from = if n % 2 == 0 { &desk } else { &builder };
        let r = http.post(format!("{}/api/v1/mail", s.url)).bearer_auth(from);
        let body = serde_json::json!({"to": "laptop", "subject": format!("件名 {n}"), "body": "b"});
        let answer: serde_json::Value = r.json(&body).send().expect("send").json().expect("json");
        sent.push(answer["id"].as_str().expect("id").to_string());
    }
    let newest: Vec<String> = sent.iter().rev().cloned().collect();
    let page = |token: &str, query: &str| -> (u16, Vec<String>, u64) {
        let r = http.get(format!("{}/api/v1/mail?{query}", s.url)).bearer_auth(token).send().expect("get");
        let status = r.status().as_u16();
        let more = r.headers().get("x-pcmail-more").and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(0);
        let mail: Vec<serde_json::Value> = r.json().unwrap_or_default();
        (status, mail.iter().filter_map(|m| m["id"].as_str().map(String::from)).collect(), more)
    };
    let (_, first, more) = page(&laptop, "limit=50");
    assert_eq!((first.as_slice(), more), (&newest[..50], 70));
    let (_, second, more) = page(&laptop, &format!("limit=50&after={}", first[49]));
    assert_eq!((second.as_slice(), more), (&newest[50..100], 20), "page 2 is the 51st to the 100th newest");
    let (_, from_desk, more) = page(&laptop, "machine=desk&limit=500");
    assert_eq!((from_desk.len(), more), (60, 0), "mail from or to the desk");
    let (_, by_alias, _) = page(&laptop, "machine=main&limit=500");
    assert_eq!(by_alias, from_desk, "a machine's alias filters as its label (M3's exact names)");
    let (_, through_another, more) = page(&desk, &format!("box=inbox&after={}", newest[0]));
    assert_eq!((through_another.len(), more), (0, 0), "T2: the laptop's mail is no cursor for the desk");
    let (_, delivered, _) = page(&laptop, "state=delivered");
    assert!(delivered.is_empty(), "nothing was polled yet");
    let (status, _, _) = page(&laptop, "state=lost");
    assert_eq!(status, 400, "an unknown state is named, not an empty page");

    let out = s.ctl(&laptop, &["inbox"]);
    assert_eq!(stdout(&out).lines().count(), 1 + 100, "a header and the newest 100");
    assert_eq!(stderr(&out).lines().last(), Some("20 more (use --limit or --all)"), "U6: {}", stderr(&out));
    let listed = json(s.ctl(&laptop, &["inbox", "--limit", "30", "--machine", "builder", "-o", "json"]));
    assert_eq!((listed["items"].as_array().map(Vec::len), listed["more"].as_u64()), (Some(30), Some(30)));
    let all = json(s.ctl(&laptop, &["inbox", "--all", "-o", "json"]));
    let ids: std::collections::BTreeSet<&str> =
        all["items"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!((ids.len(), all["more"].as_u64()), (120, Some(0)), "every mail once");
}

/// U3/U6 for alerts: filtered by state and by a machine their labels name, a page at a time,
/// and `alerts` says how many more.
#[test]
fn u3_u6_alerts_filter_by_machine_and_state_and_page_by_cursor() {
    let s = Server::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: default}\nspec: {undeliveredAfter: 1s}\n",
    )
    .expect("policy");
    ok(s.admin(&["apply", "-f", &policy.display().to_string()]));
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    // E18: one undelivered alert per machine — builder's two mails are one alert.
    for to in ["builder", "builder", "laptop"] {
        ok(s.ctl(&desk, &["send", "--to", to, "--body", "nobody polls"]));
    }
    ok(s.ctl(&laptop, &["send", "--to", "desk", "--body", "nobody polls"]));
    let firing = |args: &[&str]| {
        let mut all = vec!["alerts", "--state", "firing", "-o", "json"];
        all.extend_from_slice(args);
        json(s.admin(&all))
    };
    eventually(20, "three undelivered alerts", || (firing(&[])["items"].as_array()?.len() == 3).then_some(()));
    let builder = firing(&["--machine", "builder"]);
    let subjects = builder["items"].as_array().into_iter().flatten().filter(|a| a["labels"]["to"] == "builder");
    assert_eq!(subjects.count(), 1, "the builder's alert only: {builder}");
    assert!(builder["items"][0]["summary"].as_str().is_some_and(|t| t.starts_with("2 mails to builder")), "{builder}");
    let first = firing(&["--limit", "2"]);
    assert_eq!((first["items"].as_array().map(Vec::len), first["more"].as_u64()), (Some(2), Some(1)));
    let out = s.admin(&["alerts", "--state", "firing", "--limit", "1"]);
    assert_eq!(stderr(&out).lines().last(), Some("2 more (use --limit or --all)"), "U6: {}", stderr(&out));
    let http = reqwest::blocking::Client::new();
    let last = &first["items"][1];
    let changed =
        last["updatedAt"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).expect("updatedAt");
    let kind = last["kind"].as_str().unwrap_or("");
    let after = format!("{}/{kind}/{}", changed.timestamp_millis(), last["subject"].as_str().unwrap_or(""));
    let url = format!("{}/api/v1/alerts", s.url);
    let r = http.get(&url).query(&[("state", "firing"), ("after", after.as_str())]).bearer_auth(s.admin_token());
    let rest: Vec<serde_json::Value> = r.send().expect("get").json().expect("json");
    assert_eq!(rest.len(), 1, "the page after the cursor: {rest:?}");
    assert_ne!(rest[0]["subject"], last["subject"]);
    let bad = http.get(&url).query(&[("state", "burning")]).bearer_auth(s.admin_token()).send().expect("get");
    assert_eq!(bad.status(), 400);
}
