//! P1 and P2 on the embedded SQLite store. P1: an idle reconcile pass (every reconciler once)
//! over 1M mails, 100k ledger rows and 100k jobs. P2: a mail sweep that expires 10k mails in
//! one transaction. The data dir is handed on to P7.

use std::time::{Duration, Instant};

use pcmail_core::Ts;
use pcmail_core::jobs::{Job, JobState};
use pcmail_core::ledger::{Incoming, merge_plan};
use pcmail_core::mail::{Mail, MailKind, MailState};
use pcmail_server::controller::{mail_sweep, pass};
use pcmail_server::{App, ServeConfig};
use pcmail_store::{JobSelect, LedgerSelect, LedgerWrites, MailQuery, MailWrites, Store};

use crate::table::{Row, percentile};

fn mail(n: u64, now: Ts, state: MailState, age: chrono::TimeDelta, expires_in: chrono::TimeDelta) -> Mail {
    let created = now - age;
    let delivered = (state != MailState::New).then_some(created);
    Mail {
        kind: if n.is_multiple_of(5) { MailKind::Request } else { MailKind::Note },
        subject: format!("bench subject {n}"),
        body: "x".repeat(200),
        urgent: n.is_multiple_of(11),
        state,
        delivered_at: delivered,
        delivered_by: delivered.map(|_| "pc1".into()),
        done_at: (state == MailState::Done).then_some(created),
        ..Mail::new(
            format!("mail--{n:08x}"),
            format!("pc{}", n % 7),
            format!("pc{}", (n + 3) % 7),
            created,
            now + expires_in,
        )
    }
}

async fn insert(app: &App, mails: Vec<Mail>) {
    for chunk in mails.chunks(50_000) {
        let chunk = chunk.to_vec();
        app.store()
            .mail_transaction(pcmail_store::MailSelect::Ids(vec![]), move |_| {
                (MailWrites { insert: chunk, ..Default::default() }, ())
            })
            .await
            .expect("insert");
    }
}

/// P1's data set on `app`'s store: `total` mails (99% done and long past, the rest open and
/// young: a busy but healthy installation), a tenth as many ledger rows and as many jobs. P14
/// moves the same set.
pub async fn fill(app: &App, total: u64, now: Ts) {
    let hour = chrono::TimeDelta::hours(1);
    let started = Instant::now();
    let open = total / 100;
    let mut mails = Vec::with_capacity(total as usize);
    for n in 0..total {
        let (state, age) = match n {
            n if n < open / 2 => (MailState::New, chrono::TimeDelta::minutes(1)),
            n if n < open => (MailState::Delivered, chrono::TimeDelta::minutes(5)),
            _ => (MailState::Done, hour * 24),
        };
        mails.push(mail(n, now, state, age, hour * 48));
    }
    insert(app, mails).await;
    // P1 also names 100k ledger rows: an idle pass must not be slowed by them either.
    let items: Vec<Incoming> = (0..total / 10)
        .map(|n| Incoming { source: format!("s{}", n % 7), task: format!("task {n}"), ..Incoming::default() })
        .collect();
    app.store()
        .ledger_transaction("bench", LedgerSelect::All, move |state| {
            let plan = merge_plan("bench", &state.rows, &items, state.next_seq);
            (LedgerWrites { add: plan.add, next_seq: Some(plan.next_seq), ..Default::default() }, ())
        })
        .await
        .expect("ledger");
    // And 100k jobs: nine in ten finished, the rest queued for later.
    for chunk in (0..total / 10).collect::<Vec<_>>().chunks(20_000) {
        let jobs: Vec<Job> = chunk
            .iter()
            .map(|n| {
                let job = Job::new(format!("job-{n:012x}"), "bench".into(), "noop".into(), "{}".into(), now - hour);
                if n % 10 == 0 {
                    Job { run_after: now + hour * 24, ..job }
                } else {
                    Job { state: JobState::Succeeded, finished_at: Some(now - hour), ..job }
                }
            })
            .collect();
        app.store().jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");
    }
    eprintln!(
        "P1: loaded {total} mails, {} ledger rows and {} jobs in {:.1} s",
        total / 10,
        total / 10,
        started.elapsed().as_secs_f64()
    );
}

/// How many mails P1, P2, U3, P7 and P14 run over: 1M, or `PCMAIL_BENCH_MAILS`.
pub fn mails() -> u64 {
    std::env::var("PCMAIL_BENCH_MAILS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

/// Runs P1 and P2; answers the data dir (1M mails and the rest) with their rows.
pub async fn run() -> (tempfile::TempDir, Vec<Row>) {
    let total = mails();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = ServeConfig {
        // No lease task runs here: a lease longer than the run keeps this App the leader, so
        // the passes measured run every leader key (a lapsed lease would skip them).
        lease: Duration::from_secs(24 * 3600),
        ..ServeConfig::on(dir.path().to_path_buf())
    };
    let app = pcmail_server::start(&config).await.expect("start");
    let now = chrono::Utc::now();

    fill(&app, total, now).await;

    // P13: the indexer of `start` fills the search index behind the load; P1 measures an idle
    // pass, so it waits for the index to hold everything first.
    catch_up(&app).await;
    assert!(app.leadership().is_leader(), "P1 measures the leader's pass, every key included");
    pass(&app).await.expect("warm-up pass");
    let mut idle = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        pass(&app).await.expect("pass");
        idle.push(t.elapsed());
    }

    let mut sweeps = Vec::new();
    for round in 0..5u64 {
        let base = total + round * 10_000;
        let due: Vec<Mail> = (base..base + 10_000)
            .map(|n| mail(n, now, MailState::Delivered, chrono::TimeDelta::minutes(1), -chrono::TimeDelta::seconds(1)))
            .collect();
        insert(&app, due).await;
        // A mail due to expire was sent long before (its expiry), so the index holds it by
        // then: the sweep is measured with the index on and caught up, as it runs in service.
        catch_up(&app).await;
        let t = Instant::now();
        let expired = mail_sweep::expire(&app, chrono::Utc::now()).await.expect("expire");
        sweeps.push(t.elapsed());
        assert_eq!(expired, 10_000, "the sweep moves exactly the due mails");
    }

    let listing = listing_costs(&app, total).await;
    drop(app);
    let what = format!("idle reconcile pass, {total} mails + {0} ledger rows + {0} jobs, median of 200", total / 10);
    let rows = vec![
        Row::time("P1", what, percentile(&mut idle, 0.5), Duration::from_millis(5)),
        Row::note(
            "",
            "p99 of the same 200 passes",
            format!("{:.3} ms", percentile(&mut idle, 0.99).as_secs_f64() * 1e3),
        ),
        Row::time(
            "P2",
            "mail sweep expiring 10k mails, one transaction, median of 5",
            percentile(&mut sweeps, 0.5),
            Duration::from_millis(250),
        ),
    ];
    (dir, rows.into_iter().chain(listing).collect())
}

/// P13: until the search index holds every mail (the batches of serve's indexer, run here too).
pub async fn catch_up(app: &App) {
    let t = Instant::now();
    while app.store().index_search(pcmail_core::search::INDEX_BATCH).await.expect("index").seqs > 0 {}
    if t.elapsed() > Duration::from_millis(100) {
        eprintln!("P13: the search index caught up in {:.1} s", t.elapsed().as_secs_f64());
    }
}

/// U3 over the same store: what a console mail page costs (a page of 50 and the total the
/// heading shows), first, deep and filtered, against the one read the console made before it
/// paged (the newest 500, no count). Medians of 20.
async fn listing_costs(app: &App, total: u64) -> Vec<Row> {
    let store = app.store();
    let median = |mut times: Vec<Duration>| percentile(&mut times, 0.5);
    let timed = |query: MailQuery| {
        let store = store.clone();
        async move {
            let mut times = Vec::new();
            for _ in 0..20 {
                let t = Instant::now();
                let (page, _) = store.mail_page(MailQuery { limit: 50, ..query.clone() }).await.expect("page");
                store.mail_page(MailQuery { limit: 0, after: None, ..query.clone() }).await.expect("count");
                times.push(t.elapsed());
                assert!(!page.is_empty(), "a page of mail");
            }
            times
        }
    };
    let first = median(timed(MailQuery::default()).await);
    let deep = median(timed(MailQuery { after: Some(format!("mail--{:08x}", total / 2)), ..Default::default() }).await);
    let filtered = median(timed(MailQuery { machine: Some("pc3".into()), ..Default::default() }).await);
    let mut before = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        store.list_mail(MailQuery { limit: 500, ..Default::default() }).await.expect("list");
        before.push(t.elapsed());
    }
    let before = median(before);
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    let ratio = |d: Duration| d.as_secs_f64() / before.as_secs_f64().max(1e-9);
    vec![
        Row::note("U3", format!("console mail page over {total} mails: 50 + the total, first page"), ms(first)),
        Row::note("", format!("the same, after the {}th mail (deep)", total / 2), ms(deep)),
        Row::note("", "the same, one machine's mail (from or to)", ms(filtered)),
        Row::note(
            "",
            "baseline: the newest 500, no count (the console's read before U3)",
            format!("{} (first page ÷ baseline {:.2} ×)", ms(before), ratio(first)),
        ),
    ]
}
