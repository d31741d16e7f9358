//! The contract every adapter passes. Each check is an async fn over `&impl Store`;
//! `contract_tests!(make)` turns them into tests for one adapter, given a fn that makes a fresh,
//! empty store (and a guard that keeps its resources alive).

use pcmail_core::Ts;
use pcmail_core::alert::{Alert, AlertKind, AlertState};
use pcmail_core::api::Event;
use pcmail_core::mail::{Mail, MailKind, MailState};
use pcmail_core::manifest::{Kind, SpecRecord, Status};
use pcmail_core::trail::{ObjectRef, Reason};

use pcmail_core::jobs::{Actor, Job, JobState, LeaseOwner, check_lease, plan_rescue};

use crate::{
    Claim, Heartbeat, JobQuery, JobSelect, LedgerSelect, LedgerWrites, MachineSeen, MailCount, MailQuery, MailSelect,
    MailWrites, Prune, Search, SpecWrites, Store,
};
use pcmail_core::ledger::{Incoming, RowState, merge_plan};

pub fn at(secs: i64) -> Ts {
    Ts::from_timestamp(secs, 0).unwrap_or_default()
}

fn mail(n: u32, to: &str) -> Mail {
    Mail {
        subject: format!("subject {n} — 日本語"),
        body: "body".into(),
        urgent: n.is_multiple_of(2),
        ..Mail::new(format!("mail--{n:08x}"), "pc1".into(), to.into(), at(i64::from(n)), at(1000 + i64::from(n)))
    }
}

async fn insert(store: &impl Store, mails: Vec<Mail>) {
    store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| (MailWrites { insert: mails, ..Default::default() }, ()))
        .await
        .expect("insert");
}

pub async fn mail_round_trips_every_field(store: &impl Store) {
    let mut m = mail(1, "pc2");
    m.reply_to = Some("mail--00000009".into());
    m.external_key = Some("telegram-1-2".into());
    m.delivered_at = Some(at(5));
    m.delivered_by = Some("pc2".into());
    m.result = Some("ok".into());
    m.hop = 2;
    m.auto = true;
    insert(store, vec![m.clone()]).await;
    let got = store.get_mail(&m.id).await.expect("get").expect("present");
    assert!(got.seq > 0);
    assert_eq!(Mail { seq: 0, ..got }, m);
    assert_eq!(store.get_mail("mail--ffffffff").await.expect("get"), None);
}

pub async fn e5_a_store_has_an_identity_from_its_schema_and_knows_its_last_seq(store: &impl Store) {
    let identity = store.kv_get(crate::IDENTITY_KEY).await.expect("kv").expect("an identity");
    assert!(identity.len() == 32 && identity.bytes().all(|b| b.is_ascii_hexdigit()), "{identity}");
    assert_eq!(store.mail_last_seq().await.expect("last seq"), 0);
    insert(store, vec![mail(1, "pc2"), mail(2, "pc3")]).await;
    let last = store.get_mail("mail--00000002").await.expect("get").expect("present").seq;
    assert_eq!(store.mail_last_seq().await.expect("last seq"), last);
}

pub async fn e7_prune_takes_settled_rows_older_than_their_cutoff_and_nothing_live(store: &impl Store) {
    use pcmail_core::mail::{Step, apply_step};
    let closed = |n: u32, step: Step, at_: i64| apply_step(&mail(n, "pc2"), &step, "pc2", at(at_)).expect("moves");
    let mut expired_old = mail(3, "pc2");
    expired_old.state = MailState::Expired;
    expired_old.expires_at = at(50);
    let mut open_old = mail(5, "pc2");
    open_old.expires_at = at(10);
    let rows = vec![
        closed(1, Step::Done { result: None }, 50),
        closed(2, Step::Fail { reason: "no".into() }, 60),
        expired_old,
        closed(4, Step::Done { result: None }, 500),
        open_old,
    ];
    let event = |n: i64| Event {
        at: at(n),
        object: ObjectRef::mail("x"),
        reason: Reason::Seen,
        message: String::new(),
        actor: "a".into(),
    };
    let events = vec![event(10), event(20), event(500)];
    store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { insert: rows, events, ..Default::default() }, ())
        })
        .await
        .expect("insert");
    let posted = |subject: &str, state, updated| Alert { notified: Some(state), ..alert(subject, state, updated) };
    store
        .write_alerts(vec![
            posted("resolved-old", AlertState::Resolved, 10),
            alert("resolved-unposted", AlertState::Resolved, 10),
            posted("firing-old", AlertState::Firing, 10),
            posted("notice-old", AlertState::Notice, 10),
            posted("resolved-new", AlertState::Resolved, 500),
        ])
        .await
        .expect("alerts");
    let done = |n: u32, state: JobState, finished: i64| Job { state, finished_at: Some(at(finished)), ..job(n, 0, 0) };
    let mut other = done(5, JobState::Succeeded, 10);
    other.queue = "other".into();
    let jobs = vec![
        done(1, JobState::Succeeded, 10),
        done(2, JobState::Dead, 20),
        done(3, JobState::Succeeded, 500),
        job(4, 0, 0),
        other,
    ];
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");

    let before = at(100);
    assert_eq!(store.prune(Prune::ClosedMail { before }, 2).await.expect("prune"), 2, "a batch is at most the limit");
    assert_eq!(store.prune(Prune::ClosedMail { before }, 100).await.expect("prune"), 1);
    assert_eq!(store.prune(Prune::ClosedMail { before }, 100).await.expect("prune"), 0);
    let left: Vec<String> = store
        .list_mail(MailQuery { limit: 10, ..Default::default() })
        .await
        .expect("list")
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(left, ["mail--00000005", "mail--00000004"], "open mail and recently closed mail stay");
    let counts = store.mail_counts().await.expect("counts");
    assert_eq!(counts.iter().map(|c| c.count).sum::<u64>(), 2, "the kept counts follow deletions");
    assert_eq!(store.prune(Prune::Events { before }, 100).await.expect("prune"), 2);
    assert_eq!(store.events_for("mail/x").await.expect("events").len(), 1);
    assert_eq!(store.prune(Prune::SettledAlerts { before }, 100).await.expect("prune"), 2);
    let mut subjects: Vec<String> =
        store.list_alerts(10).await.expect("alerts").into_iter().map(|a| a.subject).collect();
    subjects.sort();
    assert_eq!(subjects, ["firing-old", "resolved-new", "resolved-unposted"]);
    let q = |queue: Option<&str>| Prune::FinishedJobs { queue: queue.map(String::from), before };
    assert_eq!(store.prune(q(Some("q")), 100).await.expect("prune"), 2);
    let ids = || async {
        let jobs = store.list_jobs(JobQuery { limit: 10, ..Default::default() }).await.expect("jobs");
        let mut ids: Vec<String> = jobs.into_iter().map(|j| j.id).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids().await, ["job-0003", "job-0004", "job-0005"], "queued jobs, new ones and other queues stay");
    assert_eq!(store.prune(q(None), 100).await.expect("prune"), 1, "any queue");
    assert_eq!(ids().await, ["job-0003", "job-0004"]);
}

pub async fn m11_after_cursor_returns_only_the_recipients_mail_in_order(store: &impl Store) {
    insert(store, vec![mail(1, "pc2"), mail(2, "pc3"), mail(3, "pc2"), mail(4, "pc2")]).await;
    let sel = |cursor, limit| MailSelect::After { to: "pc2".into(), cursor, limit };
    let all = store.mail_transaction(sel(0, 10), |m| (MailWrites::default(), m)).await.expect("select");
    let ids: Vec<_> = all.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["mail--00000001", "mail--00000003", "mail--00000004"]);
    let page = store.mail_transaction(sel(all[0].seq, 1), |m| (MailWrites::default(), m)).await.expect("select");
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, "mail--00000003");
}

pub async fn transaction_writes_are_all_or_nothing(store: &impl Store) {
    let ghost = mail(99, "pc2");
    let res = store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { insert: vec![mail(1, "pc2")], update: vec![ghost], ..Default::default() }, ())
        })
        .await;
    assert!(res.is_err(), "updating a missing row must fail the transaction");
    assert_eq!(store.get_mail("mail--00000001").await.expect("get"), None, "the insert must be rolled back");
}

pub async fn duplicate_id_insert_fails_and_keeps_the_original(store: &impl Store) {
    insert(store, vec![mail(1, "pc2")]).await;
    let mut other = mail(1, "pc3");
    other.body = "other".into();
    let res = store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { insert: vec![other], ..Default::default() }, ())
        })
        .await;
    assert!(res.is_err());
    let kept = store.get_mail("mail--00000001").await.expect("get").expect("present");
    assert_eq!((kept.to.as_str(), kept.body.as_str()), ("pc2", "body"));
}

pub async fn updates_replace_the_row_and_record_events(store: &impl Store) {
    insert(store, vec![mail(1, "pc2")]).await;
    store
        .mail_transaction(MailSelect::Ids(vec!["mail--00000001".into()]), |mut loaded| {
            let mut m = loaded.remove(0);
            m.state = MailState::Seen;
            m.seen_at = Some(at(7));
            m.subject = "rewritten".into();
            let event = Event {
                at: at(7),
                object: ObjectRef::mail(&m.id),
                reason: Reason::Seen,
                message: "new → seen".into(),
                actor: "pc2".into(),
            };
            (MailWrites { update: vec![m], events: vec![event], ..Default::default() }, ())
        })
        .await
        .expect("update");
    let m = store.get_mail("mail--00000001").await.expect("get").expect("present");
    assert_eq!((m.state, m.seen_at), (MailState::Seen, Some(at(7))));
    assert_eq!(m.subject, "subject 1 — 日本語", "identity columns are fixed at insert");
    let events = store.events_for("mail/mail--00000001").await.expect("events");
    assert_eq!(events.len(), 1);
    assert_eq!((events[0].reason, events[0].actor.as_str()), (Reason::Seen, "pc2"));
}

pub async fn concurrent_transactions_never_lose_an_update(store: &(impl Store + Clone)) {
    insert(store, vec![mail(1, "pc2")]).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let s = store.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                s.mail_transaction(MailSelect::Ids(vec!["mail--00000001".into()]), |mut l| {
                    let mut m = l.remove(0);
                    let n: u32 = m.result.as_deref().unwrap_or("0").parse().unwrap_or(0);
                    m.result = Some((n + 1).to_string());
                    (MailWrites { update: vec![m], ..Default::default() }, ())
                })
                .await
                .expect("increment");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let result = store.get_mail("mail--00000001").await.expect("get").and_then(|m| m.result);
    assert_eq!(result.as_deref(), Some("100"));
}

pub async fn m8_expiring_selects_only_open_mail_due_by_now(store: &impl Store) {
    let mut done = mail(2, "pc2");
    done.state = MailState::Done;
    insert(store, vec![mail(1, "pc2"), done, mail(3, "pc2")]).await;
    let due = store
        .mail_transaction(MailSelect::Expiring { now: at(1002), limit: 100 }, |m| (MailWrites::default(), m))
        .await
        .expect("select");
    let ids: Vec<_> = due.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["mail--00000001"]);
}

pub async fn list_mail_filters_newest_first(store: &impl Store) {
    let mut seen = mail(3, "pc2");
    seen.state = MailState::Seen;
    insert(store, vec![mail(1, "pc2"), mail(2, "pc3"), seen, mail(4, "pc2")]).await;
    let q = MailQuery { to: Some("pc2".into()), states: vec![MailState::New], limit: 10, ..Default::default() };
    let ids: Vec<_> = store.list_mail(q).await.expect("list").into_iter().map(|m| m.id).collect();
    assert_eq!(ids, ["mail--00000004", "mail--00000001"]);
    let q = MailQuery { from: Some("pc1".into()), limit: 2, ..Default::default() };
    assert_eq!(store.list_mail(q).await.expect("list").len(), 2);
}

pub async fn u3_mail_is_listed_a_page_at_a_time_within_its_scope(store: &impl Store) {
    // 120 mails from pc1, to pc2 (odd) or pc3 (even); every third one seen.
    let mails = (1..=120)
        .map(|n| {
            let mut m = mail(n, if n % 2 == 1 { "pc2" } else { "pc3" });
            if n % 3 == 0 {
                m.state = MailState::Seen;
            }
            m
        })
        .collect();
    insert(store, mails).await;
    let ids = |mail: Vec<Mail>| mail.into_iter().map(|m| m.id).collect::<Vec<_>>();
    let query = |after: Option<String>| MailQuery { after, limit: 50, ..Default::default() };
    let (first, more) = store.mail_page(query(None)).await.expect("page 1");
    assert_eq!(more, 70);
    let (second, more) = store.mail_page(query(first.last().map(|m| m.id.clone()))).await.expect("page 2");
    let want: Vec<String> = (21..=70).rev().map(|n| format!("mail--{n:08x}")).collect();
    assert_eq!((ids(second), more), (want, 20), "page 2, newest first: the 51st to the 100th");
    let to_pc2 = MailQuery { machine: Some("pc2".into()), limit: 0, ..Default::default() };
    assert_eq!(store.mail_page(to_pc2.clone()).await.expect("count").1, 60, "a page of none counts every match");
    let seen_pc2 = MailQuery { states: vec![MailState::Seen], limit: 100, ..to_pc2.clone() };
    assert_eq!(store.count_mail(seen_pc2).await.expect("count"), 20, "the filters narrow together");
    let from_pc1 = MailQuery { machine: Some("pc1".into()), limit: 0, ..Default::default() };
    assert_eq!(store.count_mail(from_pc1).await.expect("count"), 120, "a machine's mail is from or to it");
    // A cursor naming mail outside the scope pages nothing: pc3 learns nothing of pc2's mail.
    let through_another =
        MailQuery { to: Some("pc3".into()), after: Some(format!("mail--{:08x}", 99)), limit: 50, ..Default::default() };
    assert_eq!(store.mail_page(through_another).await.expect("page"), (vec![], 0));
    let own =
        MailQuery { to: Some("pc3".into()), after: Some(format!("mail--{:08x}", 100)), limit: 5, ..Default::default() };
    let (page, more) = store.mail_page(own).await.expect("page");
    assert_eq!((page.first().map(|m| m.id.clone()), more), (Some(format!("mail--{:08x}", 98)), 44));
}

pub async fn heartbeat_keeps_the_latest_poll(store: &impl Store) {
    for (t, client) in [(10, "0.1.0"), (30, "0.2.0"), (20, "")] {
        store
            .mail_transaction(MailSelect::Ids(vec![]), move |_| {
                let heartbeat = Heartbeat { machine: "pc2".into(), at: at(t), client: client.into() };
                (MailWrites { heartbeat: Some(heartbeat), ..Default::default() }, ())
            })
            .await
            .expect("heartbeat");
    }
    assert_eq!(store.last_polls().await.expect("polls"), vec![("pc2".to_string(), at(30))]);
    // V1: the client of the latest poll, not of the last one written.
    let seen = MachineSeen { name: "pc2".into(), last_poll_at: at(30), client: "0.2.0".into() };
    assert_eq!(store.machines_seen().await.expect("machines"), vec![seen]);
}

fn record(kind: Kind, name: &str, generation: u64) -> SpecRecord {
    SpecRecord {
        kind,
        name: name.into(),
        labels: [("team".to_string(), "a".to_string())].into(),
        generation,
        spec: serde_json::json!({"ttl": "1h"}),
        status: Status::default(),
        created_at: at(1),
        updated_at: at(2),
    }
}

pub async fn specs_upsert_delete_and_status(store: &impl Store) {
    let writes = SpecWrites {
        upsert: vec![record(Kind::MailPolicy, "default", 1), record(Kind::Function, "f", 1)],
        ..Default::default()
    };
    store.write_specs(writes).await.expect("write");
    store
        .write_specs(SpecWrites { upsert: vec![record(Kind::MailPolicy, "default", 2)], ..Default::default() })
        .await
        .expect("update");
    let mut status = Status { observed_generation: 2, ..Status::default() };
    status.set_condition("Ready", true, "Applied", "ok", at(3));
    store.set_spec_status(Kind::MailPolicy, "default", status.clone()).await.expect("status");
    store.set_spec_status(Kind::MailPolicy, "gone", status.clone()).await.expect("missing is fine");
    let specs = store.list_specs().await.expect("list");
    assert_eq!(specs.len(), 2);
    let mp = specs.iter().find(|r| r.kind == Kind::MailPolicy).expect("present");
    assert_eq!((mp.generation, &mp.status, mp.labels.get("team").map(String::as_str)), (2, &status, Some("a")));

    store
        .write_specs(SpecWrites { delete: vec![(Kind::Function, "f".into())], ..Default::default() })
        .await
        .expect("delete");
    assert_eq!(store.list_specs().await.expect("list").len(), 1);
}

pub async fn c2_tokens_are_found_by_hash_and_reissue_replaces(store: &impl Store) {
    store.put_token("pc1", "hash-a", at(1)).await.expect("put");
    assert_eq!(store.machine_for_token("hash-a").await.expect("find"), Some("pc1".into()));
    store.put_token("pc1", "hash-b", at(2)).await.expect("reissue");
    assert_eq!(store.machine_for_token("hash-a").await.expect("find"), None);
    assert_eq!(store.machine_for_token("hash-b").await.expect("find"), Some("pc1".into()));
}

pub async fn mail_counts_follow_inserts_and_state_changes(store: &impl Store) {
    insert(store, vec![mail(1, "pc2"), mail(2, "pc2"), mail(3, "pc3")]).await;
    store
        .mail_transaction(MailSelect::Ids(vec!["mail--00000001".into()]), |mut l| {
            let mut m = l.remove(0);
            m.state = MailState::Done;
            (MailWrites { update: vec![m], ..Default::default() }, ())
        })
        .await
        .expect("update");
    let counts = store.mail_counts().await.expect("counts");
    let count = |state| counts.iter().filter(|c: &&MailCount| c.state == state).map(|c| c.count).sum::<u64>();
    assert_eq!((count(MailState::New), count(MailState::Done)), (2, 1));
    assert!(counts.iter().all(|c| c.kind == MailKind::Note && c.channel == "pc"));
}

/// P14: the counts stay exact when one transaction writes many rows of a count at once (as a
/// copy's batch does): an insert of 300, a move of some and a touch of others that keeps their
/// state, and a prune of the closed.
pub async fn p14_counts_stay_exact_for_many_rows_written_together(store: &impl Store) {
    insert(store, (1..=300).map(|n| mail(n, if n % 3 == 0 { "pc3" } else { "pc2" })).collect()).await;
    let ids: Vec<String> = (1..=120).map(|n| format!("mail--{n:08x}")).collect();
    store
        .mail_transaction(MailSelect::Ids(ids), |moved| {
            let update = moved
                .into_iter()
                .map(|mut m| {
                    if m.seq % 2 == 0 {
                        m.state = MailState::Done;
                        m.done_at = Some(at(5));
                    } else {
                        m.last_reminded_at = Some(at(6));
                    }
                    m
                })
                .collect();
            (MailWrites { update, ..Default::default() }, ())
        })
        .await
        .expect("update");
    let count = |counts: &[MailCount], state| counts.iter().filter(|c| c.state == state).map(|c| c.count).sum::<u64>();
    let counts = store.mail_counts().await.expect("counts");
    assert_eq!((count(&counts, MailState::New), count(&counts, MailState::Done)), (240, 60));
    assert_eq!(store.prune(Prune::ClosedMail { before: at(10) }, 1000).await.expect("prune"), 60);
    let counts = store.mail_counts().await.expect("counts");
    assert_eq!((count(&counts, MailState::New), count(&counts, MailState::Done)), (240, 0));
}

pub async fn m9_selections_find_new_and_delivered_mail_by_age(store: &impl Store) {
    let mut delivered = mail(2, "pc2");
    delivered.state = MailState::Delivered;
    delivered.delivered_at = Some(at(50));
    let mut seen = mail(3, "pc2");
    seen.state = MailState::Seen;
    seen.delivered_at = Some(at(10));
    insert(store, vec![mail(1, "pc2"), delivered, seen, mail(40, "pc2")]).await;
    let undelivered =
        store.select_mail(MailSelect::Undelivered { created_before: at(10), limit: 10 }).await.expect("select");
    assert_eq!(undelivered.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["mail--00000001"]);
    let unread = store.select_mail(MailSelect::Unread { delivered_before: at(50), limit: 10 }).await.expect("select");
    assert_eq!(unread.iter().map(|m| m.id.as_str()).collect::<Vec<_>>(), ["mail--00000002"]);
    assert!(
        store.select_mail(MailSelect::Unread { delivered_before: at(49), limit: 10 }).await.expect("select").is_empty()
    );
}

fn alert(subject: &str, state: AlertState, updated: i64) -> Alert {
    Alert {
        kind: AlertKind::Undelivered,
        subject: subject.into(),
        state,
        summary: "s".into(),
        labels: [("to".to_string(), "pc2".to_string())].into(),
        firing_since: at(1),
        resolved_at: None,
        notified: None,
        last_sent_at: None,
        updated_at: at(updated),
    }
}

pub async fn m10_alerts_upsert_and_notified_marks_only_the_state_that_was_sent(store: &impl Store) {
    store
        .write_alerts(vec![alert("a", AlertState::Firing, 1), alert("b", AlertState::Firing, 1)])
        .await
        .expect("write");
    assert_eq!(store.firing_alerts().await.expect("firing").len(), 2);
    let pending = store.alerts_to_notify(10).await.expect("pending");
    assert_eq!(pending.len(), 2);
    // "b" resolves between loading and marking: its resolution must still be notified.
    store.write_alerts(vec![alert("b", AlertState::Resolved, 2)]).await.expect("resolve");
    store.mark_notified(pending, at(3)).await.expect("mark");
    let left = store.alerts_to_notify(10).await.expect("pending");
    assert_eq!(left.iter().map(|a| (a.subject.as_str(), a.state)).collect::<Vec<_>>(), [("b", AlertState::Resolved)]);
    let all = store.list_alerts(10).await.expect("all");
    let a = all.iter().find(|x| x.subject == "a").expect("a");
    assert_eq!(
        (a.notified, a.last_sent_at, a.labels.get("to").map(String::as_str)),
        (Some(AlertState::Firing), Some(at(3)), Some("pc2"))
    );
    assert_eq!(store.firing_alerts().await.expect("firing").len(), 1);
}

pub async fn m10_alert_rows_commit_with_the_mail_they_announce(store: &impl Store) {
    let notice =
        Alert { kind: AlertKind::Arrival, state: AlertState::Notice, ..alert("mail--00000001", AlertState::Notice, 1) };
    let ghost = mail(99, "pc2");
    let failed = store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (
                MailWrites {
                    insert: vec![mail(1, "pc2")],
                    update: vec![ghost],
                    alerts: vec![notice],
                    ..Default::default()
                },
                (),
            )
        })
        .await;
    assert!(failed.is_err());
    assert!(store.list_alerts(10).await.expect("alerts").is_empty(), "rolled back with the mail");
    // A plan that only raises an alert (T4's intent conflict) is written too.
    let alone = Alert { kind: AlertKind::IntentConflict, ..alert("mail--00000002", AlertState::Notice, 2) };
    store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { alerts: vec![alone], ..Default::default() }, ())
        })
        .await
        .expect("alerts alone");
    let stored = store.list_alerts(10).await.expect("alerts");
    assert_eq!(stored.iter().map(|a| a.kind).collect::<Vec<_>>(), vec![AlertKind::IntentConflict]);
}

fn incoming(task: &str) -> Incoming {
    Incoming { source: "s".into(), task: task.into(), content: "c".into(), ..Default::default() }
}

async fn merge(store: &impl Store, tasks: &[&str]) -> (usize, usize) {
    let items: Vec<Incoming> = tasks.iter().map(|t| incoming(t)).collect();
    store
        .ledger_transaction("p", LedgerSelect::All, move |state| {
            let plan = merge_plan("p", &state.rows, &items, state.next_seq);
            let counts = (plan.add.len(), plan.update.len());
            (
                LedgerWrites { add: plan.add, patch: plan.update, next_seq: Some(plan.next_seq), ..Default::default() },
                counts,
            )
        })
        .await
        .expect("merge")
}

pub async fn l1_l5_ledger_merges_are_idempotent_and_ids_are_never_reused(store: &impl Store) {
    assert_eq!(merge(store, &["a", "b"]).await, (2, 0));
    assert_eq!(merge(store, &["a", "b"]).await, (0, 0), "the second identical merge changes nothing");
    store
        .ledger_transaction("p", LedgerSelect::Ids(vec!["T-0002".into()]), |_| {
            (LedgerWrites { delete: vec!["T-0002".into()], ..Default::default() }, ())
        })
        .await
        .expect("delete");
    merge(store, &["c"]).await;
    let ids: Vec<String> = store.ledger_rows(Some("p")).await.expect("rows").into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["T-0001", "T-0003"], "T-0002 is not reused");
    assert_eq!(store.ledger_projects().await.expect("projects"), ["p"]);
}

/// R1: the gauges' counts come per group and state as the core's enums, never as text.
pub async fn r1_counts_come_per_group_and_state_as_the_cores_enums(store: &impl Store) {
    merge(store, &["a", "b"]).await;
    let ledger = store.ledger_counts().await.expect("ledger counts");
    assert_eq!(ledger, vec![crate::StateCount { group: "p".to_string(), state: RowState::Todo, count: 2 }]);
    let in_queue = |n, queue: &str, state| Job { queue: queue.into(), state, ..job(n, 0, 0) };
    let jobs = vec![
        in_queue(1, "q", JobState::Queued),
        in_queue(2, "q", JobState::Dead),
        in_queue(3, "q", JobState::Dead),
        in_queue(4, "r", JobState::Queued),
    ];
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");
    let mut counts: Vec<(String, JobState, u64)> =
        store.job_counts().await.expect("job counts").into_iter().map(|c| (c.group, c.state, c.count)).collect();
    counts.sort_by(|a, b| (&a.0, a.1.as_str()).cmp(&(&b.0, b.1.as_str())));
    assert_eq!(
        counts,
        [("q", JobState::Dead, 2), ("q", JobState::Queued, 1), ("r", JobState::Queued, 1)].map(|(g, s, n)| (
            g.to_string(),
            s,
            n
        ))
    );
}

pub async fn ledger_selections_and_whole_row_writes(store: &impl Store) {
    merge(store, &["a", "b", "c"]).await;
    let mut rows = store.ledger_rows(Some("p")).await.expect("rows");
    rows[1].run_requested = true;
    rows[2].state = RowState::Done;
    let replace = vec![rows[1].clone(), rows[2].clone()];
    store
        .ledger_transaction("p", LedgerSelect::All, move |_| (LedgerWrites { replace, ..Default::default() }, ()))
        .await
        .expect("replace");
    let requested = store
        .ledger_transaction("p", LedgerSelect::RunRequested { limit: 5 }, |s| (LedgerWrites::default(), s.rows))
        .await
        .expect("select");
    assert_eq!(requested.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["T-0002"]);
    let open =
        store.ledger_transaction("p", LedgerSelect::Open, |s| (LedgerWrites::default(), s.rows)).await.expect("open");
    assert_eq!(open.len(), 2);
    store.kv_set("cursor", "p").await.expect("kv");
    assert_eq!(store.kv_get("cursor").await.expect("kv").as_deref(), Some("p"));
}

fn job(n: u32, priority: i64, run_after: i64) -> Job {
    Job {
        priority,
        run_after: at(run_after),
        ..Job::new(format!("job-{n:04}"), "q".into(), "f".into(), "{}".into(), at(0))
    }
}

/// A claim by the server pool's `worker`.
fn claim(worker: &str, limit: usize, now: i64) -> Claim {
    Claim {
        queue: "q".into(),
        limit,
        owner: LeaseOwner::of(Actor::Pool, worker),
        token_prefix: format!("{worker}-"),
        now: at(now),
        lease_until: at(now + 60),
    }
}

pub async fn j1_claims_take_due_jobs_in_priority_run_after_id_order_with_fresh_tokens(store: &impl Store) {
    let jobs = vec![job(1, 0, 5), job(2, 10, 5), job(3, 0, 1), job(4, 0, 100), job(5, 0, 1)];
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("enqueue");
    let first = store.claim_jobs(claim("w1", 3, 10)).await.expect("claim");
    let ids: Vec<&str> = first.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(ids, ["job-0002", "job-0003", "job-0005"]);
    assert!(
        first
            .iter()
            .all(|j| j.state == JobState::Running && j.attempts == 1 && j.lease_owner.as_deref() == Some("pool:w1"))
    );
    assert_eq!(first[0].lease_token.as_deref(), Some("w1-job-0002"));
    let second = store.claim_jobs(claim("w2", 10, 10)).await.expect("claim");
    assert_eq!(second.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), ["job-0001"], "job-0004 is not due yet");
}

pub async fn j2_j3_a_rescued_lease_can_no_longer_write(store: &impl Store) {
    store.jobs_transaction(JobSelect::Ids(vec![]), |_| (vec![job(1, 0, 0)], ())).await.expect("enqueue");
    // A lease of no length: expired on every clock (E13: SQLite judges it on the monotonic one).
    let claimed = store.claim_jobs(Claim { lease_until: at(10), ..claim("w1", 1, 10) }).await.expect("claim").remove(0);
    let rescued = store
        .jobs_transaction(JobSelect::ExpiredLeases { now: at(100), limit: 10 }, |expired| {
            let out: Vec<Job> = expired.iter().map(|j| plan_rescue(j, at(100), 0.0)).collect();
            (out.clone(), out)
        })
        .await
        .expect("rescue");
    assert_eq!((rescued.len(), rescued[0].rescues, rescued[0].state), (1, 1, JobState::Queued));
    let token = claimed.lease_token.clone().unwrap_or_default();
    let verdict = store
        .jobs_transaction(JobSelect::Ids(vec![claimed.id.clone()]), move |mut j| {
            let current = j.remove(0);
            (vec![], check_lease(&current, &token, Actor::Pool))
        })
        .await
        .expect("check");
    assert!(verdict.is_err(), "the zombie worker cannot complete");
}

pub async fn t2_a_machine_lists_the_jobs_it_enqueued_or_claimed(store: &impl Store) {
    let by =
        |n: u32, machine: Option<&str>, priority| Job { enqueued_by: machine.map(String::from), ..job(n, priority, 0) };
    let jobs = vec![by(1, Some("desk"), 0), by(2, Some("builder"), 0), by(3, None, 10), by(4, None, 5)];
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("enqueue");
    // job-0003 to the laptop, job-0004 to a machine whose name starts with the laptop's.
    let claimed = store
        .claim_jobs(Claim { owner: LeaseOwner::of(Actor::Machine("laptop"), "w1"), ..claim("w1", 1, 10) })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    let other = store
        .claim_jobs(Claim { owner: LeaseOwner::of(Actor::Machine("laptops"), "w1"), ..claim("w1", 1, 10) })
        .await
        .expect("claim");
    assert_eq!(other.len(), 1);
    let list = |machine: Option<&str>| {
        let q = JobQuery { machine: machine.map(String::from), limit: 100, ..Default::default() };
        async move {
            let mut ids: Vec<String> = store.list_jobs(q).await.expect("list").into_iter().map(|j| j.id).collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(claimed[0].id, "job-0003");
    assert_eq!(list(Some("laptop")).await, vec!["job-0003".to_string()], "only what the laptop claimed");
    assert_eq!(list(Some("desk")).await, vec!["job-0001".to_string()]);
    assert_eq!(list(None).await.len(), 4, "the admin's listing");
    let cursor = |machine: &str, after: &str| JobQuery {
        machine: Some(machine.into()),
        after: Some(after.into()),
        limit: 100,
        ..Default::default()
    };
    let through_another = store.list_jobs(cursor("desk", "job-0002")).await.expect("list");
    assert_eq!(through_another, vec![], "U3/T2: another machine's job is no cursor: nothing learnt from it");
    assert_eq!(store.count_jobs(cursor("desk", "job-0002")).await.expect("count"), 0);
    let stored = store.jobs_transaction(JobSelect::Ids(vec!["job-0001".into()]), |j| (vec![], j)).await.expect("load");
    assert_eq!(stored[0].enqueued_by.as_deref(), Some("desk"), "enqueuedBy round-trips");
}

pub async fn u3_jobs_are_listed_a_page_at_a_time_and_counted_whatever_the_page(store: &impl Store) {
    let jobs: Vec<Job> =
        (1..=120).map(|n| Job { queue: if n % 2 == 0 { "even" } else { "odd" }.into(), ..job(n, 0, 0) }).collect();
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("enqueue");
    let query = |after: Option<&str>, queue: Option<&str>| JobQuery {
        queue: queue.map(String::from),
        after: after.map(String::from),
        limit: 50,
        ..Default::default()
    };
    let page = |after: Option<String>, queue: Option<&str>| {
        let q = query(after.as_deref(), queue);
        async move { store.list_jobs(q).await.expect("list").into_iter().map(|j| j.id).collect::<Vec<_>>() }
    };
    let first = page(None, None).await;
    let second = page(first.last().cloned(), None).await;
    let want: Vec<String> = (21..=70).rev().map(|n| format!("job-{n:04}")).collect();
    assert_eq!(second, want, "page 2, newest first: the 51st to the 100th");
    assert_eq!(page(second.last().cloned(), None).await.len(), 20, "the last page holds the rest");
    let even = page(None, Some("even")).await;
    assert_eq!(page(even.last().cloned(), Some("even")).await.len(), 10, "a filter narrows before the page");
    let count = |after: Option<String>, queue: Option<&str>, state: Option<&str>| {
        let q = JobQuery { state: state.map(String::from), limit: 1, ..query(after.as_deref(), queue) };
        async move { store.count_jobs(q).await.expect("count") }
    };
    assert_eq!(count(None, None, None).await, 120);
    assert_eq!(count(second.last().cloned(), None, None).await, 20, "what is left after page 2");
    assert_eq!(count(None, Some("odd"), None).await, 60);
    assert_eq!(count(None, Some("odd"), Some("running")).await, 0);
    let render = JobQuery { function: Some("render".into()), limit: 0, ..Default::default() };
    assert_eq!(store.job_page(render).await.expect("count").1, 0, "no job runs `render`");
    let (page, more) = store.job_page(query(None, Some("odd"))).await.expect("page");
    assert_eq!((page.len(), more), (50, 10));
    let function = JobQuery { function: Some(page[0].function.clone()), limit: 0, ..Default::default() };
    assert_eq!(store.job_page(function).await.expect("count").1, 120, "every job runs the same function");
}

pub async fn u2_activity_counts_mail_and_ledger_moves_and_job_ends_per_step(store: &impl Store) {
    let event = |object: &str, reason: &str, secs: i64| Event {
        at: at(secs),
        object: ObjectRef::parse(object),
        reason: Reason::lenient(reason),
        message: String::new(),
        actor: "t".into(),
    };
    let events = vec![
        event("mail/a", "Sent", 5),
        event("mail/b", "Sent", 3_599),
        event("mail/a", "Seen", 3_700),
        event("ledger/office/T-0001", "Succeeded", 7_300),
        event("mail/old", "Sent", 1),
        event("spec/x", "Created", 3_700),
    ];
    store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| (MailWrites { events, ..Default::default() }, ()))
        .await
        .expect("events");
    let ended = |n, state, secs| Job { state, finished_at: Some(at(secs)), ..job(n, 0, 0) };
    let jobs = vec![ended(1, JobState::Succeeded, 10), ended(2, JobState::Dead, 3_650), job(3, 0, 0)];
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");
    let mut got: Vec<(String, u32, u64)> = store
        .activity(at(2), chrono::TimeDelta::hours(1))
        .await
        .expect("activity")
        .into_iter()
        .map(|a| (a.series, a.step, a.count))
        .collect();
    got.sort();
    let want = [
        ("job:dead", 1, 1),
        ("job:succeeded", 0, 1),
        ("ledger:Succeeded", 2, 1),
        ("mail:Seen", 1, 1),
        ("mail:Sent", 0, 2),
    ];
    assert_eq!(
        got,
        want.map(|(s, b, n)| (s.to_string(), b, n)).to_vec(),
        "per hour from the window's start, nothing before it"
    );
    let delivered =
        vec![event("mail/a", "Delivered", 3_605), event("mail/old", "Delivered", 9), event("mail/b", "Seen", 3_700)];
    store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { events: delivered, ..Default::default() }, ())
        })
        .await
        .expect("events");
    let since = store.deliveries(at(10)).await.expect("deliveries");
    assert_eq!(since, vec![(at(3_605), 3_600_000)], "delivered since 10 s, each timed from its send");
}

pub async fn u5_search_finds_partial_japanese_and_english_in_mail_and_rows_and_a_machine_only_its_own(
    store: &impl Store,
) {
    let with = |n, from: &str, to: &str, subject: &str, body: &str| Mail {
        from: from.into(),
        subject: subject.into(),
        body: body.into(),
        ..mail(n, to)
    };
    insert(
        store,
        vec![
            with(1, "desk", "laptop", "請求書の件", "先週の分です"),
            with(2, "builder", "desk", "Invoice for March", "100% paid_now"),
            with(3, "builder", "builder", "weekly build", "nothing about money"),
        ],
    )
    .await;
    merge(store, &["請求書を作る", "見積書を送る"]).await;
    let search = |text: &str, machine: Option<&str>| Search {
        text: text.into(),
        machine: machine.map(String::from),
        mail: true,
        ledger: true,
        limit: 10,
        ..Search::default()
    };
    let find = |s: Search| async move {
        let found = store.search(s).await.expect("search");
        let mail: Vec<String> = found.mail.into_iter().map(|m| m.subject).collect();
        let rows: Vec<String> = found.rows.into_iter().map(|r| r.task).collect();
        (mail, rows)
    };
    assert_eq!(
        find(search("請求", None)).await,
        (vec!["請求書の件".into()], vec!["請求書を作る".into()]),
        "2 characters"
    );
    assert_eq!(
        find(search("請求書", None)).await,
        (vec!["請求書の件".into()], vec!["請求書を作る".into()]),
        "3, indexed"
    );
    assert_eq!(find(search("INVOIC", None)).await.0, vec!["Invoice for March".to_string()], "any case, part of a word");
    assert_eq!(find(search("先週", None)).await.0, vec!["請求書の件".to_string()], "the body too");
    assert_eq!(find(search("0% p", None)).await.0, vec!["Invoice for March".to_string()], "% is text");
    assert_eq!(find(search("d_n", None)).await.0, vec!["Invoice for March".to_string()], "_ is text");
    assert_eq!(find(search("x_x", None)).await.0, Vec::<String>::new());
    assert_eq!(find(search("請求", Some("laptop"))).await.0, vec!["請求書の件".to_string()], "to it");
    assert_eq!(find(search("invoice", Some("laptop"))).await.0, Vec::<String>::new(), "another machine's mail");
    assert_eq!(
        find(search("invoice", Some("desk"))).await.0,
        vec!["Invoice for March".to_string()],
        "to it, from another"
    );
    let only_rows = Search { mail: false, ..search("書を", None) };
    assert_eq!(find(only_rows).await, (vec![], vec!["請求書を作る".into(), "見積書を送る".into()]));
}

/// T14: the attack of issue #29, scaled to a test — another machine's box full of one letter
/// (45,000 a mail: a spreadsheet cell holds at most 50,000 characters).
async fn fill_with_zs(store: &impl Store, from: &str, count: u32) {
    let zs = "Z".repeat(45_000);
    let mails = (0..count)
        .map(|n| Mail { from: from.into(), subject: "z".into(), body: zs.clone(), ..mail(100 + n, "server") })
        .collect();
    insert(store, mails).await;
}

pub async fn t14_search_a_machine_never_sees_nor_pays_for_foreign_mail(store: &impl Store) {
    fill_with_zs(store, "laptop", 12).await;
    let own =
        Mail { from: "desk".into(), subject: "a few ZZZZ".into(), body: "of its own".into(), ..mail(1, "server") };
    insert(store, vec![own]).await;
    let search = |text: String, machine: &str| Search {
        text,
        machine: Some(machine.into()),
        mail: true,
        ledger: false,
        limit: 10,
        ..Search::default()
    };
    let started = std::time::Instant::now();
    let found = store.search(search("Z".repeat(200), "desk")).await.expect("search");
    let took = started.elapsed();
    assert_eq!((found.mail.len(), found.truncated), (0, false), "only in foreign mail: nothing, and all of it");
    // The rule's bound, generous: the scoped search reads none of the 540 KB it may not see.
    assert!(took < pcmail_core::search::BUDGET, "{took:?}");
    let found = store.search(search("zzzz".into(), "desk")).await.expect("search");
    let froms: Vec<&str> = found.mail.iter().map(|m| m.from.as_str()).collect();
    assert_eq!(froms, vec!["desk"], "its own, never laptop's");
    let theirs = store.search(search("Z".repeat(200), "laptop")).await.expect("search");
    assert!(theirs.mail.len() == 10 || theirs.truncated, "the owner finds its own: {}", theirs.mail.len());
    assert!(theirs.mail.iter().all(|m| m.from == "laptop"));
}

pub async fn t14_search_a_spent_budget_answers_truncated_with_what_it_has(store: &impl Store) {
    fill_with_zs(store, "laptop", 3).await;
    let search = |total: std::time::Duration| Search {
        text: "Z".repeat(200),
        machine: None,
        mail: true,
        ledger: true,
        limit: 10,
        budget: pcmail_core::search::Budget { total },
    };
    let spent = store.search(search(std::time::Duration::ZERO)).await.expect("search");
    assert!(spent.truncated, "no time at all: cut before looking");
    assert!(spent.mail.len() <= 3 && spent.rows.is_empty());
    let whole = store.search(search(pcmail_core::search::BUDGET)).await.expect("search");
    assert_eq!((whole.mail.len(), whole.truncated), (3, false), "within the budget: everything, not cut");
}

/// P13: a search answers the same whatever the index holds yet — mail above its mark read row
/// by row, below it through the index — and pruned mail is never found, indexed or not.
pub async fn p13_search_is_whole_while_the_index_catches_up_and_never_finds_pruned_mail(store: &impl Store) {
    let invoice = |n: u32, done: i64| Mail {
        subject: format!("invoice {n}"),
        state: pcmail_core::mail::MailState::Done,
        done_at: Some(at(done)),
        ..mail(n, "pc2")
    };
    insert(store, (1..=5).map(|n| invoice(n, i64::from(n) * 10)).collect()).await;
    let find = || async {
        let s = Search { text: "nvoic".into(), mail: true, limit: 10, ..Search::default() };
        let found = store.search(s).await.expect("search");
        (found.mail.into_iter().map(|m| m.subject).collect::<Vec<_>>(), found.behind)
    };
    let all = |ns: &[u32]| ns.iter().map(|n| format!("invoice {n}")).collect::<Vec<_>>();
    assert_eq!(find().await.0, all(&[5, 4, 3, 2, 1]), "before any batch: every mail, newest first");
    store.index_search(2).await.expect("a batch");
    assert_eq!(find().await.0, all(&[5, 4, 3, 2, 1]), "part indexed, part not: the same answer");
    while store.index_search(2).await.expect("a batch").seqs > 0 {}
    assert_eq!(find().await, (all(&[5, 4, 3, 2, 1]), 0), "all indexed: the same, nothing behind");
    insert(store, vec![invoice(6, 15), invoice(7, 500)]).await;
    assert_eq!(find().await.0, all(&[7, 6, 5, 4, 3, 2, 1]), "sent after the last batch: found at once");
    // Indexed (1, 2) and not yet indexed (6) mail pruned alike.
    assert_eq!(store.prune(Prune::ClosedMail { before: at(25) }, 100).await.expect("prune"), 3);
    assert_eq!(find().await.0, all(&[7, 5, 4, 3]), "pruned mail is never found");
    while store.index_search(1).await.expect("a batch").seqs > 0 {}
    assert_eq!(find().await, (all(&[7, 5, 4, 3]), 0), "nor once the index caught up");
}

pub async fn j5_a_job_is_read_back_by_id_as_committed(store: &impl Store) {
    let j = job(7, 0, 0);
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (vec![j], ())).await.expect("enqueue");
    let got = store.get_job("job-0007").await.expect("read").expect("found");
    assert_eq!((got.id.as_str(), got.state), ("job-0007", pcmail_core::jobs::JobState::Queued));
    assert_eq!(store.get_job("job-9999").await.expect("read"), None);
}

pub async fn j6_t12_live_holders_of_a_unique_key_are_found_in_every_scope(store: &impl Store) {
    let mut j = job(1, 0, 0);
    j.unique_key = Some("nightly".into());
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (vec![j], ())).await.expect("enqueue");
    let live = store
        .jobs_transaction(JobSelect::Unique(vec!["nightly".into(), "other".into()]), |found| (vec![], found))
        .await
        .expect("find");
    assert_eq!(live.len(), 1);
    // T12: another machine's job under the same key is stored beside it (the planner decided
    // it may be), and both are found as holders.
    let mut other = job(2, 0, 0);
    other.unique_key = Some("nightly".into());
    other.enqueued_by = Some("desk".into());
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (vec![other], ())).await.expect("enqueue");
    let live =
        store.jobs_transaction(JobSelect::Unique(vec!["nightly".into()]), |found| (vec![], found)).await.expect("find");
    let mut by: Vec<Option<String>> = live.into_iter().map(|j| j.enqueued_by).collect();
    by.sort();
    assert_eq!(by, [None, Some("desk".to_string())]);
}

pub async fn c1_exactly_one_replica_holds_the_lease(store: &(impl Store + Clone)) {
    use pcmail_core::lease::{CONTROLLER, Leadership, plan_acquire, plan_release};
    let minute = chrono::TimeDelta::seconds(60);
    let attempt = |me: &'static str| {
        let s = store.clone();
        async move {
            s.lease_transaction(CONTROLLER, move |current, now| {
                plan_acquire(current.as_ref(), CONTROLLER, me, now, minute)
            })
            .await
            .expect("attempt")
        }
    };
    let racers: Vec<_> = ["a", "b", "c", "d", "e", "f"].into_iter().map(|me| tokio::spawn(attempt(me))).collect();
    let mut leaders = Vec::new();
    for (me, racer) in ["a", "b", "c", "d", "e", "f"].into_iter().zip(racers) {
        if let Leadership::Leading { .. } = racer.await.expect("task") {
            leaders.push(me);
        }
    }
    assert_eq!(leaders.len(), 1, "racing replicas: {leaders:?} lead");
    let leader = leaders[0];
    let other = if leader == "a" { "b" } else { "a" };
    assert!(matches!(attempt(other).await, Leadership::Following { holder, .. } if holder == leader));
    assert!(matches!(attempt(leader).await, Leadership::Leading { .. }), "the holder renews");
    store
        .lease_transaction(CONTROLLER, move |current, now| (plan_release(current.as_ref(), leader, now), ()))
        .await
        .expect("release");
    assert!(matches!(attempt(other).await, Leadership::Leading { .. }), "a released lease is taken at once");
}

pub async fn j1_concurrent_claims_never_hand_one_job_to_two_workers(store: &(impl Store + Clone)) {
    let jobs: Vec<Job> = (0..200).map(|n| job(n, 0, 0)).collect();
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("enqueue");
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let s = store.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let got = s.claim_jobs(claim(&format!("w{w}"), 7, 10)).await.expect("claim");
                    if got.is_empty() {
                        return mine;
                    }
                    mine.extend(got.into_iter().map(|j| j.id));
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.expect("worker"));
    }
    let claimed = all.len();
    all.sort();
    all.dedup();
    assert_eq!((claimed, all.len()), (200, 200), "every job claimed exactly once");
}

/// What an adapter checks after each contract check when it has nothing to add.
/// A row in every tab a copy moves: specs, tokens, machines, kv, leases, mail (with events and
/// an alert), the ledger, jobs.
pub(crate) async fn fill_every_tab(store: &impl Store) {
    use pcmail_core::lease::{CONTROLLER, plan_acquire};
    store
        .write_specs(SpecWrites { upsert: vec![record(Kind::MailPolicy, "default", 1)], ..Default::default() })
        .await
        .expect("specs");
    store.put_token("pc2", "hash-pc2", at(1)).await.expect("token");
    store.kv_set("telegram/offset", "42").await.expect("kv");
    let minute = chrono::TimeDelta::seconds(60);
    store
        .lease_transaction(CONTROLLER, move |l, now| plan_acquire(l.as_ref(), CONTROLLER, "old-server", now, minute))
        .await
        .expect("lease");
    let mut seen = mail(2, "pc3");
    seen.state = MailState::Seen;
    seen.seen_at = Some(at(3));
    seen.external_key = Some("telegram-1-2".into());
    let event = Event {
        at: at(3),
        object: ObjectRef::mail("mail--00000002"),
        reason: Reason::Seen,
        message: "new → seen".into(),
        actor: "pc3".into(),
    };
    let notice =
        Alert { kind: AlertKind::Arrival, state: AlertState::Notice, ..alert("mail--00000001", AlertState::Notice, 1) };
    store
        .mail_transaction(MailSelect::Ids(vec![]), move |_| {
            let writes = MailWrites {
                insert: vec![mail(1, "pc2"), seen, mail(3, "pc2")],
                events: vec![event],
                alerts: vec![notice],
                heartbeat: Some(Heartbeat { machine: "pc2".into(), at: at(4), client: "0.2.0".into() }),
                ..Default::default()
            };
            (writes, ())
        })
        .await
        .expect("mail");
    merge(store, &["a", "b"]).await;
    let mut rows = store.ledger_rows(Some("p")).await.expect("rows");
    rows[1].run_requested = true;
    let replace = vec![rows[1].clone()];
    store
        .ledger_transaction("p", LedgerSelect::All, move |_| (LedgerWrites { replace, ..Default::default() }, ()))
        .await
        .expect("ledger");
    let jobs = vec![job(1, 0, 0), Job { state: JobState::Succeeded, finished_at: Some(at(9)), ..job(2, 5, 0) }];
    store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");
}

/// A scratch SQLite store, the other end of a copy.
async fn sqlite_scratch() -> (tempfile::TempDir, crate::SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = crate::SqliteStore::open(dir.path().join("other.db")).await.expect("open");
    (dir, store)
}

/// What a store holds, read through the Store API: the copy must answer the same.
pub(crate) async fn everything(store: &impl Store) -> String {
    let mut specs = store.list_specs().await.expect("specs");
    specs.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    let mail = store.list_mail(MailQuery { limit: 100, ..Default::default() }).await.expect("mail");
    let events = store.events_for("mail/mail--00000002").await.expect("events");
    let ledger = store.ledger_rows(None).await.expect("ledger");
    let mut jobs = store.list_jobs(JobQuery { limit: 100, ..Default::default() }).await.expect("jobs");
    jobs.sort_by(|a, b| a.id.cmp(&b.id));
    let alerts = store.list_alerts(100).await.expect("alerts");
    let token = store.machine_for_token("hash-pc2").await.expect("token");
    let kv = store.kv_get("telegram/offset").await.expect("kv");
    let polls = store.last_polls().await.expect("polls");
    let mut counts = store.mail_counts().await.expect("counts");
    counts.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    format!("{specs:?}\n{mail:?}\n{events:?}\n{ledger:?}\n{jobs:?}\n{alerts:?}\n{token:?} {kv:?} {polls:?}\n{counts:?}")
}

/// O2 (backup): a store exports every tab, and a copy of it answers every read the same.
pub async fn o2_a_backup_holds_every_tab_as_it_was(store: &(impl Store + Clone)) {
    fill_every_tab(store).await;
    let (_dir, backup) = sqlite_scratch().await;
    let copied = crate::transfer::copy(store, &backup).await.expect("backup");
    crate::transfer::check_finished(&backup).await.expect("a finished copy serves");
    let moved = crate::transfer::moved(&copied);
    let count = |tab: &str| moved.iter().find(|(t, _)| *t == tab).map(|m| m.1);
    assert_eq!(
        (count("mail"), count("ledger"), count("jobs"), count("tokens"), count("leases")),
        (Some(3), Some(2), Some(2), Some(1), Some(1))
    );
    assert_eq!(everything(&backup).await, everything(store).await);
    let identity = |s: &crate::SqliteStore| {
        let s = s.clone();
        async move { s.kv_get(crate::IDENTITY_KEY).await.expect("kv") }
    };
    assert_ne!(
        identity(&backup).await,
        store.kv_get(crate::IDENTITY_KEY).await.expect("kv"),
        "E5: a copy is another store"
    );
}

/// E14: a backup sealed with the checksums its copy counted checks out as it was written, and
/// a row changed afterwards is named by its tab; a store never sealed carries none.
pub async fn e14_a_sealed_backup_checks_out_and_a_changed_row_names_its_tab(store: &(impl Store + Clone)) {
    use crate::transfer::{BACKUP_DIGEST_KEY, FileSum, copy, seal_digest, verify_sealed};
    fill_every_tab(store).await;
    let (_dir, backup) = sqlite_scratch().await;
    let copied = copy(store, &backup).await.expect("backup");
    assert_eq!(copied, crate::transfer::digest(store).await.expect("digest"), "the copy counts what it wrote");
    backup.kv_set(BACKUP_DIGEST_KEY, &seal_digest(&copied)).await.expect("seal");
    assert!(verify_sealed(&backup, FileSum::Absent).await.expect("checks out"));
    assert!(!verify_sealed(store, FileSum::Absent).await.expect("no seal"));
    insert(&backup, vec![mail(9, "pc2")]).await;
    let err = verify_sealed(&backup, FileSum::Absent).await.expect_err("a changed row").to_string();
    assert!(err.contains("checksums in: mail") && !err.contains("ledger"), "{err}");
    backup.kv_set(BACKUP_DIGEST_KEY, "{\"tabs\": [], \"whole\": \"0\"}").await.expect("forge");
    let err = verify_sealed(&backup, FileSum::Absent).await.expect_err("a forged record").to_string();
    assert!(err.contains("its checksum record"), "{err}");
}

/// O2 (restore): rows come back with their sequence numbers, and new rows number after them;
/// the restore counts every row it wrote (P14: without checksumming them).
pub async fn o2_a_restore_brings_rows_back_and_numbers_new_rows_after_them(store: &(impl Store + Clone)) {
    let (_dir, backup) = sqlite_scratch().await;
    fill_every_tab(&backup).await;
    let moved = crate::transfer::copy_moved(&backup, store, &mut |_, _| {}).await.expect("restore");
    let held = crate::transfer::moved(&crate::transfer::digest(&backup).await.expect("digest"));
    assert_eq!(moved, held, "counts what it wrote");
    assert_eq!(everything(store).await, everything(&backup).await);
    let last = store.mail_last_seq().await.expect("last");
    assert_eq!(last, backup.mail_last_seq().await.expect("last"));
    insert(store, vec![mail(4, "pc2")]).await;
    let new = store.get_mail("mail--00000004").await.expect("get").expect("present");
    assert!(new.seq > last, "a new mail numbers after the restored ones: {} ≤ {last}", new.seq);
    let job5 = job(5, 0, 0);
    store
        .jobs_transaction(JobSelect::Ids(vec![]), move |_| (vec![job5], ()))
        .await
        .expect("a new job after the restored ones");
    assert_eq!(store.list_jobs(JobQuery { limit: 10, ..Default::default() }).await.expect("jobs").len(), 3);
}

/// O3: a target holding data is refused before anything is written to it.
pub async fn o3_a_copy_refuses_a_target_that_holds_data(store: &(impl Store + Clone)) {
    insert(store, vec![mail(7, "pc2")]).await;
    let before = everything(store).await;
    let (_dir, source) = sqlite_scratch().await;
    fill_every_tab(&source).await;
    let err = crate::transfer::copy(&source, store).await.expect_err("must refuse");
    assert!(matches!(&err, crate::StoreError::NotEmpty(tabs) if tabs == "mail"), "{err}");
    assert_eq!(everything(store).await, before, "nothing was written");
}

/// O3: a copy stopped midway (here by a row its source cannot export) leaves its target marked,
/// so that `serve` refuses it and a second copy is refused with the tabs it holds named.
pub async fn o3_a_copy_that_stops_midway_leaves_its_target_marked_unfinished(store: &(impl Store + Clone)) {
    let (dir, source) = sqlite_scratch().await;
    fill_every_tab(&source).await;
    drop(source);
    let raw = rusqlite::Connection::open(dir.path().join("other.db")).expect("raw");
    raw.execute("UPDATE jobs SET priority = 1.5", []).expect("a value pcmail never writes");
    drop(raw);
    let source = crate::SqliteStore::open_read_only(dir.path().join("other.db")).await.expect("open");
    let err = crate::transfer::copy(&source, store).await.expect_err("the export stops at jobs");
    assert!(err.to_string().contains("jobs.priority"), "{err}");
    assert!(matches!(crate::transfer::check_finished(store).await, Err(crate::StoreError::UnfinishedCopy)));
    let again = crate::transfer::copy(&source, store).await.expect_err("refused");
    assert!(again.to_string().contains("specs, tokens, machines, kv, leases, mail"), "{again}");
}

/// O3 (`store verify`): equal stores agree on every tab; a changed row names its tab.
pub async fn o3_verify_agrees_on_a_copy_and_names_the_tab_that_differs(store: &(impl Store + Clone)) {
    fill_every_tab(store).await;
    let (_dir, copy) = sqlite_scratch().await;
    crate::transfer::copy(store, &copy).await.expect("copy");
    let (ours, theirs) =
        (crate::transfer::digest(store).await.expect("digest"), crate::transfer::digest(&copy).await.expect("digest"));
    assert_eq!(crate::transfer::differences(&ours, &theirs), Vec::<&str>::new());
    assert_eq!(ours.iter().find(|d| d.tab == "mail").map(|d| d.rows), Some(3));
    copy.put_token("pc2", "hash-new", at(5)).await.expect("reissue");
    let theirs = crate::transfer::digest(&copy).await.expect("digest");
    assert_eq!(crate::transfer::differences(&ours, &theirs), ["tokens"]);
}

/// What a store a forced restore goes into held: mail, a token, a kept key, all to be dropped.
async fn hold_other_rows(store: &impl Store) {
    insert(store, (5..9).map(|n| mail(n, "pc9")).collect()).await;
    store.put_token("pc9", "hash-pc9", at(2)).await.expect("token");
    store.kv_set("telegram/offset", "99").await.expect("kv");
}

/// E14 (`restore --force`): a store holding rows takes the backup's in their place, every row
/// and nothing of what it held, numbers new rows after the backup's, and is another store (E5).
pub async fn e14_a_forced_restore_replaces_every_row_and_renews_the_identity(store: &(impl Store + Clone)) {
    hold_other_rows(store).await;
    let identity = store.kv_get(crate::IDENTITY_KEY).await.expect("kv");
    let (_dir, backup) = sqlite_scratch().await;
    fill_every_tab(&backup).await;
    let replaced = crate::transfer::replace(&backup, store).await.expect("restore --force");
    let held = crate::transfer::moved(&crate::transfer::digest(&backup).await.expect("digest"));
    assert_eq!(replaced, held, "counts what it wrote");
    assert_eq!(everything(store).await, everything(&backup).await);
    assert_eq!(store.machine_for_token("hash-pc9").await.expect("token"), None, "the held token is gone");
    assert_eq!(store.mail_last_seq().await.expect("last"), backup.mail_last_seq().await.expect("last"));
    let renewed = store.kv_get(crate::IDENTITY_KEY).await.expect("kv");
    assert!(renewed.is_some() && renewed != identity, "E5: a restored store is another one");
    insert(store, vec![mail(4, "pc2")]).await;
    let new = store.get_mail("mail--00000004").await.expect("get").expect("present");
    assert!(new.seq > backup.mail_last_seq().await.expect("last"), "numbered after the restored mail");
}

/// E14: a forced restore whose rows stop coming midway (here a row its backup cannot export)
/// leaves the store all it was: rows, tokens and identity.
pub async fn e14_a_forced_restore_that_stops_midway_changes_nothing(store: &(impl Store + Clone)) {
    hold_other_rows(store).await;
    let before = (everything(store).await, store.kv_get(crate::IDENTITY_KEY).await.expect("kv"));
    let (dir, source) = sqlite_scratch().await;
    fill_every_tab(&source).await;
    drop(source);
    let raw = rusqlite::Connection::open(dir.path().join("other.db")).expect("raw");
    raw.execute("UPDATE jobs SET priority = 1.5", []).expect("a value pcmail never writes");
    drop(raw);
    let source = crate::SqliteStore::open_read_only(dir.path().join("other.db")).await.expect("open");
    let err = crate::transfer::replace(&source, store).await.expect_err("the export stops at jobs");
    assert!(err.to_string().contains("jobs.priority"), "the export's error is the one told: {err}");
    let after = (everything(store).await, store.kv_get(crate::IDENTITY_KEY).await.expect("kv"));
    assert_eq!(after, before, "nothing was changed");
}

pub async fn nothing_more<G, S>(_guard: &G, _store: &S) {}

/// Expands to one `#[tokio::test]` per contract check for the adapter `make` creates.
macro_rules! contract_tests {
    ($make:ident) => {
        crate::contract::contract_tests!($make, after: crate::contract::nothing_more);
    };
    ($make:ident, after: $after:path) => {
        crate::contract::contract_tests!(@each $make, $after;
            mail_round_trips_every_field,
            e5_a_store_has_an_identity_from_its_schema_and_knows_its_last_seq,
            e7_prune_takes_settled_rows_older_than_their_cutoff_and_nothing_live,
            m11_after_cursor_returns_only_the_recipients_mail_in_order,
            transaction_writes_are_all_or_nothing,
            duplicate_id_insert_fails_and_keeps_the_original,
            updates_replace_the_row_and_record_events,
            concurrent_transactions_never_lose_an_update,
            m8_expiring_selects_only_open_mail_due_by_now,
            list_mail_filters_newest_first,
            heartbeat_keeps_the_latest_poll,
            specs_upsert_delete_and_status,
            c2_tokens_are_found_by_hash_and_reissue_replaces,
            mail_counts_follow_inserts_and_state_changes,
            p14_counts_stay_exact_for_many_rows_written_together,
            m9_selections_find_new_and_delivered_mail_by_age,
            t2_a_machine_lists_the_jobs_it_enqueued_or_claimed,
            u3_jobs_are_listed_a_page_at_a_time_and_counted_whatever_the_page,
            u3_mail_is_listed_a_page_at_a_time_within_its_scope,
            u2_activity_counts_mail_and_ledger_moves_and_job_ends_per_step,
            u5_search_finds_partial_japanese_and_english_in_mail_and_rows_and_a_machine_only_its_own,
            t14_search_a_machine_never_sees_nor_pays_for_foreign_mail,
            t14_search_a_spent_budget_answers_truncated_with_what_it_has,
            p13_search_is_whole_while_the_index_catches_up_and_never_finds_pruned_mail,
            m10_alerts_upsert_and_notified_marks_only_the_state_that_was_sent,
            m10_alert_rows_commit_with_the_mail_they_announce,
            l1_l5_ledger_merges_are_idempotent_and_ids_are_never_reused,
            ledger_selections_and_whole_row_writes,
            r1_counts_come_per_group_and_state_as_the_cores_enums,
            j1_claims_take_due_jobs_in_priority_run_after_id_order_with_fresh_tokens,
            j2_j3_a_rescued_lease_can_no_longer_write,
            j5_a_job_is_read_back_by_id_as_committed,
            j6_t12_live_holders_of_a_unique_key_are_found_in_every_scope,
            e14_a_sealed_backup_checks_out_and_a_changed_row_names_its_tab,
            j1_concurrent_claims_never_hand_one_job_to_two_workers,
            c1_exactly_one_replica_holds_the_lease,
            o2_a_backup_holds_every_tab_as_it_was,
            o2_a_restore_brings_rows_back_and_numbers_new_rows_after_them,
            o3_a_copy_refuses_a_target_that_holds_data,
            o3_a_copy_that_stops_midway_leaves_its_target_marked_unfinished,
            o3_verify_agrees_on_a_copy_and_names_the_tab_that_differs,
            e14_a_forced_restore_replaces_every_row_and_renews_the_identity,
            e14_a_forced_restore_that_stops_midway_changes_nothing
        );
    };
    (@each $make:ident, $after:path; $($check:ident),*) => {
        mod contract {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $check() {
                    let (guard, store) = super::$make().await;
                    crate::contract::$check(&store).await;
                    $after(&guard, &store).await;
                }
            )*
        }
    };
}
pub(crate) use contract_tests;
