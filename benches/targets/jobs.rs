//! P3: jobs claimed and completed per second through the Store (no-op function), against a
//! raw-SQL baseline doing the same statements by hand in the same run, on SQLite and then on
//! PostgreSQL (`PCMAIL_TEST_POSTGRES`, in a scratch database).

use std::time::Instant;

use pcmail_core::Ts;
use pcmail_core::jobs::{Actor, Job, JobState, LeaseOwner, check_lease};
use pcmail_store::{Claim, JobSelect, PgStore, SqliteStore, Store};

use crate::table::Row;

const JOBS: usize = 50_000;
const BATCH: usize = 100;

fn job(n: usize, now: Ts) -> Job {
    Job::new(format!("job-{n:08}"), "bench".into(), "noop".into(), "{}".into(), now)
}

async fn fill(store: &impl Store, now: Ts) {
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(10_000) {
        let jobs: Vec<Job> = chunk.iter().map(|n| job(*n, now)).collect();
        store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("fill");
    }
}

async fn through_store(store: &impl Store) -> f64 {
    let started = Instant::now();
    let mut done = 0;
    loop {
        let now = chrono::Utc::now();
        let claim = Claim {
            queue: "bench".into(),
            limit: BATCH,
            owner: LeaseOwner::of(Actor::Pool, "w"),
            token_prefix: "w-".into(),
            now,
            lease_until: now + chrono::TimeDelta::seconds(60),
        };
        let claimed = store.claim_jobs(claim).await.expect("claim");
        if claimed.is_empty() {
            break;
        }
        // The no-op function ran; complete the batch, each job checked against its lease (J2).
        let tokens: Vec<(String, String)> =
            claimed.iter().map(|j| (j.id.clone(), j.lease_token.clone().unwrap_or_default())).collect();
        let ids = tokens.iter().map(|(id, _)| id.clone()).collect();
        done += store
            .jobs_transaction(JobSelect::Ids(ids), move |jobs| {
                let finished: Vec<Job> = jobs
                    .into_iter()
                    .zip(&tokens)
                    .filter(|(j, (_, token))| check_lease(j, token, Actor::Pool).is_ok())
                    .map(|(j, _)| Job { state: JobState::Succeeded, finished_at: Some(now), lease_token: None, ..j })
                    .collect();
                let n = finished.len();
                (finished, n)
            })
            .await
            .expect("complete");
    }
    done as f64 / started.elapsed().as_secs_f64()
}

fn raw_sql(path: &std::path::Path) -> f64 {
    let mut conn = rusqlite::Connection::open(path).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
    conn.pragma_update(None, "synchronous", "FULL").expect("sync");
    let started = Instant::now();
    let mut done = 0;
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).expect("tx");
        let claimed: Vec<(String, String)> = {
            let mut stmt = tx
                .prepare_cached(
                    "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = 'w', lease_token = 'w-' || id, \
                     lease_expires_at = ?1, heartbeat_at = ?2 WHERE seq IN (SELECT seq FROM jobs WHERE state = 'queued' \
                     AND queue = 'bench' AND run_after <= ?2 ORDER BY priority DESC, run_after, seq LIMIT ?3) \
                     RETURNING id, lease_token",
                )
                .expect("prepare");
            stmt.query_map(rusqlite::params![now + 60_000, now, BATCH as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                .expect("claim")
                .collect::<Result<_, _>>()
                .expect("rows")
        };
        tx.commit().expect("commit");
        if claimed.is_empty() {
            break;
        }
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).expect("tx");
        {
            let mut stmt = tx
                .prepare_cached(
                    "UPDATE jobs SET state = 'succeeded', finished_at = ?1, lease_token = NULL \
                     WHERE id = ?2 AND lease_token = ?3 AND state = 'running'",
                )
                .expect("prepare");
            for (id, token) in &claimed {
                done += stmt.execute(rusqlite::params![now, id, token]).expect("complete");
            }
        }
        tx.commit().expect("commit");
    }
    done as f64 / started.elapsed().as_secs_f64()
}

/// The Postgres adapter's claim statement and a lease-checked complete, by hand.
async fn raw_postgres(client: &mut tokio_postgres::Client) -> f64 {
    let claim = client
        .prepare(
            "WITH picked AS MATERIALIZED (SELECT seq FROM jobs WHERE state = 'queued' AND queue = 'bench' \
             AND run_after <= $2 ORDER BY priority DESC, run_after, seq LIMIT $3 FOR UPDATE SKIP LOCKED) \
             UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_owner = 'w', lease_token = 'w-' || id, \
             lease_expires_at = $1, heartbeat_at = $2 FROM picked WHERE jobs.seq = picked.seq RETURNING id, lease_token",
        )
        .await
        .expect("prepare");
    // The whole batch in one statement, as a hand-tuned queue would complete it.
    let complete = client
        .prepare(
            "UPDATE jobs SET state = 'succeeded', finished_at = $1, lease_token = NULL \
             FROM unnest($2::text[], $3::text[]) AS done(id, token) \
             WHERE jobs.id = done.id AND jobs.lease_token = done.token AND jobs.state = 'running'",
        )
        .await
        .expect("prepare");
    let started = Instant::now();
    let mut done = 0;
    loop {
        let now = chrono::Utc::now().timestamp_millis();
        let claimed: Vec<(String, String)> = client
            .query(&claim, &[&(now + 60_000), &now, &(BATCH as i64)])
            .await
            .expect("claim")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        if claimed.is_empty() {
            break;
        }
        let (ids, tokens): (Vec<String>, Vec<String>) = claimed.into_iter().unzip();
        done += client.execute(&complete, &[&now, &ids, &tokens]).await.expect("complete");
    }
    done as f64 / started.elapsed().as_secs_f64()
}

/// A database of its own on the bench PostgreSQL; `None` when it cannot be reached.
pub async fn scratch_postgres(name: &str) -> Option<(tokio_postgres::Client, String)> {
    let admin = crate::postgres_admin();
    let (client, conn) = tokio_postgres::connect(&admin, tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(conn);
    // Two statements: CREATE DATABASE cannot run inside the implicit transaction of a batch.
    client.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await.ok()?;
    client.batch_execute(&format!("CREATE DATABASE {name}")).await.ok()?;
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b).to_string();
    Some((client, format!("{base}/{name}")))
}

/// The three P3 rows of one adapter: throughput, its baseline, and the ratio between them.
fn rows(adapter: &str, ours: f64, raw: f64) -> Vec<Row> {
    vec![
        Row::at_least(
            "P3",
            format!("jobs claim+complete through the Store, batches of {BATCH}, {adapter}"),
            ours,
            20_000.0,
            "/s",
        ),
        Row::note("", format!("raw-SQL baseline, same statements, same run, {adapter}"), format!("{raw:.0} /s")),
        Row::at_least("", format!("Store ÷ baseline, {adapter}"), ours / raw, 0.8, "×"),
    ]
}

async fn postgres(now: Ts) -> Vec<Row> {
    let Some((admin, url)) = scratch_postgres("pcmail_bench_p3").await else {
        return vec![Row::note("P3", "postgres: not run, PCMAIL_TEST_POSTGRES unreachable", "")];
    };
    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let store = PgStore::open(&url).await.expect("store");
    fill(&store, now).await;
    // Both runs start from a freshly analyzed table, as autovacuum keeps a live one.
    client.batch_execute("ANALYZE jobs").await.expect("analyze");
    let ours = through_store(&store).await;
    client.batch_execute("TRUNCATE jobs").await.expect("truncate");
    fill(&store, now).await;
    client.batch_execute("ANALYZE jobs").await.expect("analyze");
    drop(store);
    let raw = raw_postgres(&mut client).await;
    drop(client);
    let _ = admin.batch_execute("DROP DATABASE IF EXISTS pcmail_bench_p3 WITH (FORCE)").await;
    rows("postgres", ours, raw)
}

pub async fn run() -> Vec<Row> {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = chrono::Utc::now();
    let store = SqliteStore::open(dir.path().join("store.db")).await.expect("store");
    fill(&store, now).await;
    let ours = through_store(&store).await;
    let base_path = dir.path().join("baseline.db");
    let baseline = SqliteStore::open(&base_path).await.expect("baseline");
    fill(&baseline, now).await;
    drop(baseline);
    let raw = raw_sql(&base_path);
    let mut out = rows("sqlite", ours, raw);
    out.extend(postgres(now).await);
    out
}
