//! The scale-out store: PostgreSQL, shared by several controller replicas (C1).
//!
//! Writers of one tab are serialized the way SQLite's single writer serializes them, with
//! transaction-scoped advisory locks: all mail (so `seq` order is commit order and a cursor
//! never skips a row committed late), one lock per ledger project, one per job unique key.
//! Claims take rows with `FOR UPDATE SKIP LOCKED` and need no lock; other job writes lock
//! their rows. Committed mail, due jobs and spec changes are announced with NOTIFY.

mod conn;
mod copy;
mod deferred;
#[cfg(test)]
mod earlier;
mod listen;
mod schema;

use std::sync::Arc;

use pcmail_core::Ts;
use pcmail_core::alert::{Alert, AlertState};
use pcmail_core::api::Event;
use pcmail_core::jobs::{Job, JobState};
use pcmail_core::lease::Lease;
use pcmail_core::ledger::{Row as LedgerRow, RowState};
use pcmail_core::mail::{Mail, MailState};
use pcmail_core::manifest::{Kind, SpecRecord, Status};
use tokio::sync::{broadcast, mpsc};

use crate::cells::{Batch, Cell, Incoming};
use crate::codec::{
    self, ALERT_COLUMNS, EVENT_COLUMNS, JOB_COLUMNS, LEASE_COLUMNS, LEDGER_COLUMNS, MAIL_COLUMNS, MAIL_INSERT_COLUMNS,
    SPEC_COLUMNS, Value, from_ms, json, ms,
};
use crate::predicates;
use crate::transfer;
use crate::{
    Change, Claim, JobQuery, JobSelect, LedgerSelect, LedgerState, LedgerWrites, MachineSeen, MailCount, MailQuery,
    MailSelect, MailWrites, Prune, Result, SpecWrites, StateCount, Store, StoreError,
};
use conn::{Conn, Param, Pool, column_params, params, transpose, unnest};

/// Advisory lock keys: one namespace per tab, `hashtext` of the name inside it.
const MAIL_LOCK: &str = "SELECT pg_advisory_xact_lock(1, 0)";
const LEDGER_LOCK: &str = "SELECT pg_advisory_xact_lock(2, hashtext($1))";
const UNIQUE_JOB_LOCKS: &str = "SELECT pg_advisory_xact_lock(3, hashtext(k)) \
     FROM (SELECT DISTINCT k FROM unnest($1::text[]) AS k ORDER BY k) AS keys";
const LEASE_LOCK: &str = "SELECT pg_advisory_xact_lock(4, hashtext($1))";
const SPECS_LOCK: &str = "SELECT pg_advisory_xact_lock(5, 0)";

#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    changes: broadcast::Sender<Change>,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

impl PgStore {
    /// Connects, migrates (once, whichever replica comes first) and starts listening.
    pub async fn open(url: &str) -> Result<PgStore> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| StoreError::BadUrl {
            url: crate::redact_url(url),
            reason: format!("not a PostgreSQL URL: {e}"),
        })?;
        let pool = Pool::new(config.clone());
        schema::migrate(&mut *pool.get().await?).await?;
        let changes = broadcast::channel(4096).0;
        let listener = tokio::spawn(listen::run(config, changes.clone()));
        Ok(PgStore { inner: Arc::new(Inner { pool, changes, listener }) })
    }

    async fn conn(&self) -> Result<conn::Pooled<'_>> {
        self.inner.pool.get().await
    }
}

async fn select_mail(c: &mut Conn, select: &MailSelect) -> Result<Vec<Mail>> {
    let by_time =
        |filter: &str, order: &str| format!("SELECT {MAIL_COLUMNS} FROM mail WHERE {filter} ORDER BY {order} LIMIT $2");
    let (sql, t, limit) = match select {
        MailSelect::Expiring { now, limit } => {
            (by_time(&format!("{} AND expires_at <= $1", predicates::open_mail()), "expires_at"), *now, *limit)
        }
        MailSelect::Undelivered { created_before, limit } => {
            let filter = format!("{} AND created_at <= $1", predicates::state_is(MailState::New));
            (by_time(&filter, "created_at"), *created_before, *limit)
        }
        MailSelect::OpenIntents { created_before, limit } => (
            by_time(&format!("{} AND created_at <= $1", predicates::open_intents()), "created_at"),
            *created_before,
            *limit,
        ),
        MailSelect::Unread { delivered_before, limit } => {
            let filter = format!("{} AND delivered_at <= $1", predicates::state_is(MailState::Delivered));
            (by_time(&filter, "delivered_at"), *delivered_before, *limit)
        }
        MailSelect::Ids(ids) => {
            let sql = format!("SELECT {MAIL_COLUMNS} FROM mail WHERE id = ANY($1)");
            let found = c.decode(&sql, &[ids], codec::mail).await?;
            return Ok(in_order(found, ids, |m| &m.id));
        }
        MailSelect::After { to, cursor, limit } => {
            let sql = format!("SELECT {MAIL_COLUMNS} FROM mail WHERE \"to\" = $1 AND seq > $2 ORDER BY seq LIMIT $3");
            return c.decode(&sql, &[to, cursor, &(*limit as i64)], codec::mail).await;
        }
    };
    c.decode(&sql, &[&ms(t), &(limit as i64)], codec::mail).await
}

/// Columns PostgreSQL numbers itself; a copy writes the source's numbers and then moves each
/// sequence past them.
const IDENTITY_COLUMNS: &[(&str, &str)] = &[("mail", "seq"), ("events", "id"), ("jobs", "seq")];

/// Every tab, page by page, inside the snapshot the caller began. P14: each page starts after
/// the last row of the one before, by the tab's key (never an OFFSET, which reads again every
/// row before it): linear in rows, a page in memory at a time.
async fn export(c: &mut Conn, out: &mpsc::Sender<Batch>) -> Result<()> {
    for (tab, order) in transfer::TABS {
        let first = format!("{} LIMIT {}", transfer::select_sql(tab, order), transfer::BATCH);
        let next = transfer::select_after_sql(tab, order, |i| format!("${i}"), transfer::BATCH);
        let keys = transfer::key_positions(tab, order);
        let mut after: Option<Vec<Cell>> = None;
        loop {
            let page = match &after {
                None => c.query(&first, &[]).await?,
                Some(key) => c.query(&next, &key.iter().map(|v| v as Param<'_>).collect::<Vec<_>>()).await?,
            };
            // Plain loops: nested `collect`s into `Result<Vec<_>>` cost SQLite's export a fifth
            // of its time.
            let mut rows = Vec::with_capacity(page.len());
            for row in &page {
                let mut cells = Vec::with_capacity(row.len());
                for i in 0..row.len() {
                    cells.push(conn::cell(row, i, tab)?);
                }
                rows.push(cells);
            }
            let last = rows.len() < transfer::BATCH;
            after = rows.last().map(|row| keys.iter().filter_map(|&i| row.get(i).cloned()).collect());
            if !rows.is_empty() && out.send(Batch { tab, rows }).await.is_err() {
                return Ok(());
            }
            if last {
                break;
            }
        }
    }
    Ok(())
}

/// O3/E14: one batch of a copy or a restore, its rows as they are (sequence numbers included:
/// COPY writes an identity column's given values), in the caller's transaction. P14: one
/// `COPY … FROM STDIN (FORMAT binary)` a batch, PostgreSQL's bulk path — no statement to parse
/// or plan, and no 65,535-parameter limit.
async fn insert_batch(c: &mut Conn, batch: &Batch) -> Result<()> {
    c.copy_in(batch.tab, &batch.rows).await
}

/// After the rows of a copy or a restore: each sequence moved past the numbers it brought.
async fn move_sequences(c: &mut Conn) -> Result<()> {
    for (tab, column) in IDENTITY_COLUMNS {
        let sql = format!(
            "SELECT setval(pg_get_serial_sequence('{tab}', '{column}'), \
             (SELECT coalesce(max({column}), 0) + 1 FROM {tab}), false)"
        );
        c.query(&sql, &[]).await?;
    }
    Ok(())
}

/// E14: inside the caller's transaction, every tab emptied and filled with what `rows` brings,
/// under locks that hold off other writers (a serve still running) until the commit; readers
/// go on reading what was there. Fails, for a rollback, unless the rows end with `End`.
async fn replace_all(c: &mut Conn, mut rows: mpsc::Receiver<Incoming>) -> Result<()> {
    let tabs: Vec<&str> = transfer::TABS.iter().map(|(t, _)| *t).collect();
    c.batch(&format!("LOCK TABLE {} IN EXCLUSIVE MODE", tabs.join(", "))).await?;
    for sql in transfer::clear_sql() {
        c.execute(&sql, &[]).await?;
    }
    c.execute(
        "UPDATE kv SET value = replace(gen_random_uuid()::text, '-', '') WHERE key = $1",
        &[&crate::IDENTITY_KEY],
    )
    .await?;
    loop {
        match rows.recv().await {
            Some(Incoming::Rows(batch)) => insert_batch(c, &batch).await?,
            Some(Incoming::End) => return move_sequences(c).await,
            None => return Err(StoreError::Backend(crate::sqlite::INCOMPLETE.into())),
        }
    }
}

/// Rows loaded by id, in the order the ids were asked for (as SQLite's one-by-one loads give).
fn in_order<T>(mut found: Vec<T>, ids: &[String], id: impl Fn(&T) -> &String) -> Vec<T> {
    found.sort_by_key(|row| ids.iter().position(|i| i == id(row)).unwrap_or(usize::MAX));
    found
}

async fn apply_mail_writes(c: &mut Conn, w: &MailWrites) -> Result<()> {
    let insert = format!("INSERT INTO mail ({MAIL_INSERT_COLUMNS}) {}", values(MAIL_INSERT_COLUMNS));
    for m in &w.insert {
        let values: Vec<Value> = codec::mail_lifecycle(m).into_iter().chain(codec::mail_identity(m)).collect();
        c.execute(&insert, &params(&values)).await?;
    }
    let update = "UPDATE mail SET state = $2, expires_at = $3, delivered_at = $4, delivered_by = $5, seen_at = $6, \
                  seen_by = $7, done_at = $8, result = $9, fail_reason = $10, presented_at = $11, presented_session = $12, \
                  last_reminded_at = $13 WHERE id = $1";
    for m in &w.update {
        if c.execute(update, &params(&codec::mail_lifecycle(m))).await? != 1 {
            return Err(StoreError::Backend(format!("update of missing mail {}", m.id)));
        }
    }
    insert_events(c, &w.events).await?;
    upsert_alerts(c, &w.alerts).await?;
    if let Some(h) = &w.heartbeat {
        // The client of the latest poll wins, as its time does.
        c.execute(
            "INSERT INTO machines (name, last_poll_at, client) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET last_poll_at = GREATEST(machines.last_poll_at, excluded.last_poll_at), \
             client = CASE WHEN excluded.last_poll_at >= machines.last_poll_at THEN excluded.client ELSE machines.client END",
            &[&h.machine, &ms(h.at), &h.client],
        )
        .await?;
    }
    Ok(())
}

/// The last write of each key, as a one-by-one upsert would leave it: one statement may not
/// upsert a row twice.
fn last_per_key<T>(rows: &[T], key: impl Fn(&T) -> &String) -> impl Iterator<Item = &T> {
    let mut seen = std::collections::HashSet::new();
    let mut keep: Vec<&T> = rows.iter().rev().filter(|r| seen.insert(key(r).clone())).collect();
    keep.reverse();
    keep.into_iter()
}

fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// `VALUES ($1, …, $n)` for a row of `columns`.
fn values(columns: &str) -> String {
    format!("VALUES ({})", placeholders(codec::arity(columns)))
}

async fn upsert_alerts(c: &mut Conn, alerts: &[Alert]) -> Result<()> {
    let sql = codec::upsert_sql("alerts", ALERT_COLUMNS, codec::ALERT_KEY, &[], &values(ALERT_COLUMNS));
    for a in alerts {
        let labels = json(&a.labels);
        c.execute(&sql, &params(&codec::alert_params(a, &labels))).await?;
    }
    Ok(())
}

async fn insert_events(c: &mut Conn, events: &[Event]) -> Result<()> {
    let sql = format!("INSERT INTO events ({EVENT_COLUMNS}) {}", values(EVENT_COLUMNS));
    for e in events {
        let object = e.object.to_string();
        c.execute(&sql, &params(&codec::event_params(e, &object))).await?;
    }
    Ok(())
}

async fn select_ledger(c: &mut Conn, project: &str, select: &LedgerSelect) -> Result<Vec<LedgerRow>> {
    let base = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE project = $1");
    match select {
        LedgerSelect::All => c.decode(&format!("{base} ORDER BY seq"), &[&project], codec::ledger_row).await,
        LedgerSelect::Open => {
            let sql = format!("{base} AND {} ORDER BY seq", predicates::open_rows());
            c.decode(&sql, &[&project], codec::ledger_row).await
        }
        LedgerSelect::RunRequested { limit } => {
            let sql = format!("{base} AND run_requested ORDER BY seq LIMIT $2");
            c.decode(&sql, &[&project, &(*limit as i64)], codec::ledger_row).await
        }
        LedgerSelect::Ids(ids) => {
            let found = c.decode(&format!("{base} AND id = ANY($2)"), &[&project, ids], codec::ledger_row).await?;
            Ok(in_order(found, ids, |r| &r.id))
        }
    }
}

/// A job listing's filters: queue `$1`, state `$2`, (T2) the machine `$3` that enqueued it or
/// holds its lease, and (U3) the cursor `$4`, older than that job; each when given. A cursor is
/// only a job the machine may see: any other answers an empty page, as an unknown one does.
const JOB_FILTER: &str = "($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR state = $2) \
    AND ($3::text IS NULL OR enqueued_by = $3 OR substr(lease_owner, 1, length($3) + 1) = $3 || '/') \
    AND ($4::text IS NULL OR seq < (SELECT c.seq FROM jobs c WHERE c.id = $4 \
        AND ($3::text IS NULL OR c.enqueued_by = $3 OR substr(c.lease_owner, 1, length($3) + 1) = $3 || '/'))) \
    AND ($5::text IS NULL OR function = $5)";

async fn apply_ledger_writes(c: &mut Conn, project: &str, w: &LedgerWrites) -> Result<()> {
    let ledger_upsert =
        |rows: &str| codec::upsert_sql("ledger", LEDGER_COLUMNS, codec::LEDGER_KEY, codec::LEDGER_FIXED, rows);
    let whole: Vec<LedgerRow> = w.add.iter().chain(&w.replace).cloned().collect();
    if !whole.is_empty() {
        let rows: Vec<Vec<Value>> = last_per_key(&whole, |r| &r.id).map(codec::ledger_params).collect();
        let columns = transpose(&rows);
        let bulk = ledger_upsert(&format!("SELECT * FROM {}", unnest(&columns)));
        c.execute(&bulk, &column_params(&columns)).await?;
    }
    let upsert = ledger_upsert(&values(LEDGER_COLUMNS));
    for p in &w.patch {
        let mut current = select_ledger(c, project, &LedgerSelect::Ids(vec![p.id.clone()])).await?;
        if let Some(row) = current.first_mut() {
            p.apply(row);
            c.execute(&upsert, &params(&codec::ledger_params(row))).await?;
        }
    }
    for id in &w.delete {
        c.execute("DELETE FROM ledger WHERE project = $1 AND id = $2", &[&project, id]).await?;
    }
    if let Some(next) = w.next_seq {
        c.execute(
            "INSERT INTO ledger_projects (project, next_seq) VALUES ($1, $2) \
             ON CONFLICT (project) DO UPDATE SET next_seq = GREATEST(ledger_projects.next_seq, excluded.next_seq)",
            &[&project, &i64::from(next)],
        )
        .await?;
    }
    insert_events(c, &w.events).await
}

async fn select_jobs(c: &mut Conn, select: &JobSelect) -> Result<Vec<Job>> {
    match select {
        // P10: an enqueue without unique keys asks for nothing: no round trip.
        JobSelect::Ids(ids) if ids.is_empty() => Ok(Vec::new()),
        JobSelect::Ids(ids) => {
            let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ANY($1) FOR UPDATE");
            let found = c.decode(&sql, &[ids], codec::job).await?;
            Ok(in_order(found, ids, |j| &j.id))
        }
        JobSelect::Unique(keys) => {
            // One lock per key, taken in one order in one round trip, so two batches sharing
            // keys cannot deadlock.
            c.execute(UNIQUE_JOB_LOCKS, &[keys]).await?;
            let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE unique_key = ANY($1) FOR UPDATE");
            c.decode(&sql, &[keys], codec::job).await
        }
        JobSelect::ExpiredLeases { now, limit } => {
            let sql = format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE {} AND lease_expires_at <= $1 \
                 ORDER BY lease_expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
                predicates::state_is(JobState::Running)
            );
            c.decode(&sql, &[&ms(*now), &(*limit as i64)], codec::job).await
        }
    }
}

impl Store for PgStore {
    async fn mail_transaction<R, F>(&self, select: MailSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Mail>) -> (MailWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            c.execute(MAIL_LOCK, &[]).await?;
            let loaded = select_mail(&mut c, &select).await?;
            let (writes, out) = plan(loaded);
            if !writes.is_empty() {
                apply_mail_writes(&mut c, &writes).await?;
            }
            Ok(out)
        }
        .await;
        c.finish(outcome).await
    }

    async fn select_mail(&self, select: MailSelect) -> Result<Vec<Mail>> {
        select_mail(&mut *self.conn().await?, &select).await
    }

    async fn get_mail(&self, id: &str) -> Result<Option<Mail>> {
        Ok(select_mail(&mut *self.conn().await?, &MailSelect::Ids(vec![id.to_string()])).await?.pop())
    }

    async fn mail_counts(&self) -> Result<Vec<MailCount>> {
        let rows = self
            .conn()
            .await?
            .query("SELECT state, kind, channel, n FROM mail_counts WHERE n > 0 ORDER BY state, kind, channel", &[])
            .await?;
        rows.iter()
            .map(|r| {
                use codec::Columns;
                MailCount::from_row(&r.text(0)?, &r.text(1)?, r.text(2)?, r.int(3)?)
            })
            .collect()
    }

    async fn list_mail(&self, q: MailQuery) -> Result<Vec<Mail>> {
        let (filter, args) = crate::mail_where(&q, |n| format!("${n}"), false);
        let sql = format!("SELECT {MAIL_COLUMNS} FROM mail WHERE {filter} ORDER BY seq DESC LIMIT {}", q.limit.max(1));
        let args: Vec<Param> = args.iter().map(|a| a as Param).collect();
        self.conn().await?.decode(&sql, &args, codec::mail).await
    }

    async fn count_mail(&self, q: MailQuery) -> Result<u64> {
        let (filter, args) = crate::mail_where(&q, |n| format!("${n}"), false);
        let args: Vec<Param> = args.iter().map(|a| a as Param).collect();
        let count = |r: &dyn codec::Columns| r.int(0);
        let sql = format!("SELECT count(*) FROM mail WHERE {filter}");
        let n = self.conn().await?.decode(&sql, &args, count).await?.pop().unwrap_or(0);
        Ok(n.max(0) as u64)
    }

    async fn events_for(&self, object: &str) -> Result<Vec<Event>> {
        let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE object = $1 ORDER BY id");
        self.conn().await?.decode(&sql, &[&object], codec::event).await
    }

    async fn list_specs(&self) -> Result<Vec<SpecRecord>> {
        let sql = format!("SELECT {SPEC_COLUMNS} FROM specs ORDER BY kind, name");
        self.conn().await?.decode(&sql, &[], codec::spec).await
    }

    async fn write_specs(&self, w: SpecWrites) -> Result<()> {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            c.execute(SPECS_LOCK, &[]).await?;
            for r in &w.upsert {
                let (labels, spec, status) = codec::spec_params(r);
                c.execute(
                    &codec::upsert_sql(
                        "specs",
                        SPEC_COLUMNS,
                        codec::SPEC_KEY,
                        codec::SPEC_FIXED,
                        &values(SPEC_COLUMNS),
                    ),
                    &[
                        &r.kind.as_str(),
                        &r.name,
                        &labels,
                        &(r.generation as i64),
                        &spec,
                        &status,
                        &ms(r.created_at),
                        &ms(r.updated_at),
                    ],
                )
                .await?;
            }
            for (kind, name) in &w.delete {
                c.execute("DELETE FROM specs WHERE kind = $1 AND name = $2", &[&kind.as_str(), name]).await?;
            }
            insert_events(&mut c, &w.events).await
        }
        .await;
        c.finish(outcome).await
    }

    async fn set_spec_status(&self, kind: Kind, name: &str, status: Status) -> Result<()> {
        self.conn()
            .await?
            .execute(
                "UPDATE specs SET status = $3 WHERE kind = $1 AND name = $2",
                &[&kind.as_str(), &name, &json(&status)],
            )
            .await
            .map(|_| ())
    }

    async fn put_token(&self, machine: &str, hash: &str, now: Ts) -> Result<()> {
        self.conn()
            .await?
            .execute(
                "INSERT INTO tokens (machine, hash, created_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (machine) DO UPDATE SET hash = excluded.hash, created_at = excluded.created_at",
                &[&machine, &hash, &ms(now)],
            )
            .await
            .map(|_| ())
    }

    async fn machine_for_token(&self, hash: &str) -> Result<Option<String>> {
        let rows = self.conn().await?.query("SELECT machine FROM tokens WHERE hash = $1", &[&hash]).await?;
        rows.first().map(|r| codec::Columns::text(r, 0)).transpose()
    }

    async fn last_polls(&self) -> Result<Vec<(String, Ts)>> {
        let rows = self.conn().await?.query("SELECT name, last_poll_at FROM machines ORDER BY name", &[]).await?;
        rows.iter().map(|r| Ok((codec::Columns::text(r, 0)?, codec::Columns::ts(r, 1)?))).collect()
    }

    async fn machines_seen(&self) -> Result<Vec<MachineSeen>> {
        let rows =
            self.conn().await?.query("SELECT name, last_poll_at, client FROM machines ORDER BY name", &[]).await?;
        rows.iter()
            .map(|r| {
                Ok(MachineSeen {
                    name: codec::Columns::text(r, 0)?,
                    last_poll_at: codec::Columns::ts(r, 1)?,
                    client: codec::Columns::text(r, 2)?,
                })
            })
            .collect()
    }

    async fn ledger_transaction<R, F>(&self, project: &str, select: LedgerSelect, plan: F) -> Result<R>
    where
        F: FnOnce(LedgerState) -> (LedgerWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            c.execute(LEDGER_LOCK, &[&project]).await?;
            let rows = select_ledger(&mut c, project, &select).await?;
            let next = c.query("SELECT next_seq FROM ledger_projects WHERE project = $1", &[&project]).await?;
            let next_seq = match next.first() {
                Some(r) => u32::try_from(codec::Columns::int(r, 0)?).unwrap_or(u32::MAX),
                None => 1,
            };
            let (writes, out) = plan(LedgerState { rows, next_seq });
            if writes != LedgerWrites::default() {
                apply_ledger_writes(&mut c, project, &writes).await?;
            }
            Ok(out)
        }
        .await;
        c.finish(outcome).await
    }

    async fn ledger_rows(&self, project: Option<&str>) -> Result<Vec<LedgerRow>> {
        let mut c = self.conn().await?;
        match project {
            Some(p) => {
                let sql = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE project = $1 ORDER BY seq");
                c.decode(&sql, &[&p], codec::ledger_row).await
            }
            None => {
                let sql = format!("SELECT {LEDGER_COLUMNS} FROM ledger ORDER BY project, seq");
                c.decode(&sql, &[], codec::ledger_row).await
            }
        }
    }

    async fn ledger_counts(&self) -> Result<Vec<StateCount<RowState>>> {
        self.group_counts("ledger", "SELECT project, state, count(*) FROM ledger GROUP BY project, state").await
    }

    async fn activity(&self, since: Ts, step: chrono::TimeDelta) -> Result<Vec<crate::Activity>> {
        let sql = crate::ACTIVITY_SQL
            .replace("{since}", "$1::bigint")
            .replace("{step}", "$2::bigint")
            .replace("{finished}", &crate::predicates::finished_jobs());
        let (since, step) = (ms(since), step.num_milliseconds().max(1));
        let rows = self.conn().await?.query(&sql, &[&since, &step]).await?;
        rows.iter()
            .map(|r| {
                use codec::Columns;
                Ok(crate::Activity {
                    series: r.text(0)?,
                    step: u32::try_from(r.int(1)?).unwrap_or(u32::MAX),
                    count: r.int(2)?.max(0) as u64,
                })
            })
            .collect()
    }

    async fn ledger_projects(&self) -> Result<Vec<String>> {
        let rows = self
            .conn()
            .await?
            .query("SELECT project FROM ledger_projects UNION SELECT DISTINCT project FROM ledger ORDER BY 1", &[])
            .await?;
        rows.iter().map(|r| codec::Columns::text(r, 0)).collect()
    }

    async fn mail_last_seq(&self) -> Result<i64> {
        let rows = self.conn().await?.query("SELECT coalesce(max(seq), 0)::bigint FROM mail", &[]).await?;
        rows.first().map_or(Ok(0), |r| codec::Columns::int(r, 0))
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>> {
        let rows = self.conn().await?.query("SELECT value FROM kv WHERE key = $1", &[&key]).await?;
        rows.first().map(|r| codec::Columns::text(r, 0)).transpose()
    }

    async fn kv_set(&self, key: &str, value: &str) -> Result<()> {
        self.conn()
            .await?
            .execute(
                "INSERT INTO kv (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&key, &value],
            )
            .await
            .map(|_| ())
    }

    async fn claim_jobs(&self, claim: Claim) -> Result<Vec<Job>> {
        // MATERIALIZED: the LIMIT and SKIP LOCKED are applied once, before the update, rather
        // than re-evaluated per joined row. Answered in claim order.
        let sql = format!(
            "WITH picked AS MATERIALIZED (SELECT seq FROM jobs WHERE state = '{queued}' AND queue = $5 AND run_after <= $4 \
             ORDER BY priority DESC, run_after, seq LIMIT $6 FOR UPDATE SKIP LOCKED), \
             claimed AS (UPDATE jobs SET state = '{running}', attempts = attempts + 1, lease_owner = $1, \
             lease_token = $2 || id, lease_expires_at = $3, heartbeat_at = $4 FROM picked WHERE jobs.seq = picked.seq \
             RETURNING jobs.seq AS claim_seq, {JOB_COLUMNS}) \
             SELECT {JOB_COLUMNS} FROM claimed ORDER BY priority DESC, run_after, claim_seq",
            running = JobState::Running,
            queued = JobState::Queued,
        );
        let owner = claim.owner.to_string();
        self.conn()
            .await?
            .decode(
                &sql,
                &[
                    &owner,
                    &claim.token_prefix,
                    &ms(claim.lease_until),
                    &ms(claim.now),
                    &claim.queue,
                    &(claim.limit as i64),
                ],
                codec::job,
            )
            .await
    }

    async fn jobs_transaction<R, F>(&self, select: JobSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Job>) -> (Vec<Job>, R) + Send + 'static,
        R: Send + 'static,
    {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            let loaded = select_jobs(&mut c, &select).await?;
            let (writes, out) = plan(loaded);
            if writes.is_empty() {
                return Ok(out);
            }
            let rows: Vec<Vec<Value>> = last_per_key(&writes, |j| &j.id).map(codec::job_params).collect();
            let columns = transpose(&rows);
            let rows_from = format!("SELECT * FROM {}", unnest(&columns));
            let sql = codec::upsert_sql("jobs", JOB_COLUMNS, codec::JOB_KEY, codec::JOB_FIXED, &rows_from);
            c.execute(&sql, &column_params(&columns)).await?;
            Ok(out)
        }
        .await;
        c.finish(outcome).await
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1");
        Ok(self.conn().await?.decode(&sql, &[&id], codec::job).await?.pop())
    }

    async fn list_jobs(&self, q: JobQuery) -> Result<Vec<Job>> {
        let sql = format!("SELECT {JOB_COLUMNS} FROM jobs WHERE {JOB_FILTER} ORDER BY seq DESC LIMIT $6");
        let limit = q.limit as i64;
        let params: [Param; 6] = [&q.queue, &q.state, &q.machine, &q.after, &q.function, &limit];
        self.conn().await?.decode(&sql, &params, codec::job).await
    }

    async fn deliveries(&self, since: Ts) -> Result<Vec<(Ts, i64)>> {
        let sql = crate::DELIVERIES_SQL.replace("{since}", "$1::bigint");
        let rows = self.conn().await?.query(&sql, &[&ms(since)]).await?;
        rows.iter()
            .map(|r| {
                use codec::Columns;
                Ok((from_ms(r.int(0)?), r.int(1)?))
            })
            .collect()
    }

    async fn search(&self, search: crate::Search) -> Result<crate::Found> {
        let started = std::time::Instant::now();
        let mut c = self.conn().await?;
        let cancel = c.cancel_on_drop();
        c.begin_as("BEGIN READ ONLY").await?;
        let outcome = search_within(&mut c, &search, started).await;
        let found = c.finish(outcome).await?;
        cancel.disarm();
        Ok(found)
    }

    async fn count_jobs(&self, q: JobQuery) -> Result<u64> {
        let sql = format!("SELECT count(*) FROM jobs WHERE {JOB_FILTER}");
        let count = |r: &dyn codec::Columns| r.int(0);
        let n = self
            .conn()
            .await?
            .decode(&sql, &[&q.queue, &q.state, &q.machine, &q.after, &q.function], count)
            .await?
            .pop()
            .unwrap_or(0);
        Ok(n.max(0) as u64)
    }

    async fn job_counts(&self) -> Result<Vec<StateCount<JobState>>> {
        self.group_counts("jobs", "SELECT queue, state, count(*) FROM jobs GROUP BY queue, state").await
    }

    async fn prune(&self, what: Prune, limit: usize) -> Result<usize> {
        let limit = limit as i64;
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            let n = match &what {
                Prune::ClosedMail { before } => {
                    // Mail writes are serialized (the seq order a cursor relies on); this one too.
                    c.execute(MAIL_LOCK, &[]).await?;
                    let sql = format!(
                        "DELETE FROM mail WHERE seq IN (SELECT seq FROM mail WHERE {} \
                         AND coalesce(done_at, expires_at) < $1 ORDER BY coalesce(done_at, expires_at) LIMIT $2)",
                        predicates::closed_mail()
                    );
                    c.execute(&sql, &[&ms(*before), &limit]).await?
                }
                Prune::FinishedJobs { queue, before } => {
                    let sql = format!(
                        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE ($1::text IS NULL OR queue = $1) \
                         AND {} AND finished_at < $2 ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED)",
                        predicates::finished_jobs()
                    );
                    c.execute(&sql, &[queue, &ms(*before), &limit]).await?
                }
                Prune::Events { before } => {
                    c.execute(
                        "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE at < $1 ORDER BY at LIMIT $2)",
                        &[&ms(*before), &limit],
                    )
                    .await?
                }
                Prune::SettledAlerts { before } => {
                    let sql = format!(
                        "DELETE FROM alerts WHERE ctid IN (SELECT ctid FROM alerts WHERE {} \
                         AND notified = state AND updated_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)",
                        predicates::settled_alerts()
                    );
                    c.execute(&sql, &[&ms(*before), &limit]).await?
                }
            };
            Ok(n as usize)
        }
        .await;
        c.finish(outcome).await
    }

    async fn export_tabs(&self, out: mpsc::Sender<Batch>) -> Result<()> {
        let mut c = self.conn().await?;
        // One snapshot for every tab, while other transactions go on writing.
        c.begin_as("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY").await?;
        let outcome = export(&mut c, &out).await;
        c.finish(outcome).await
    }

    async fn import_rows(&self, batch: Batch) -> Result<()> {
        let mut c = self.conn().await?;
        c.begin().await?;
        // P14: the batch's commit need not wait for its WAL flush: the copy's `finished` mark
        // does, and a flush covers every commit before it.
        let outcome = match c.batch("SET LOCAL synchronous_commit TO OFF").await {
            Ok(()) => insert_batch(&mut c, &batch).await,
            Err(e) => Err(e),
        };
        c.finish(outcome).await
    }

    async fn import_stream(&self, mut rows: mpsc::Receiver<Incoming>) -> Result<()> {
        let mut c = self.conn().await?;
        let mut next = rows.recv().await.ok_or_else(|| StoreError::Backend(crate::cells::COPY_INCOMPLETE.into()))?;
        loop {
            let first = match next {
                Incoming::Rows(first) => first,
                Incoming::End => return Ok(()),
            };
            c.begin().await?;
            // P14: as `import_rows`: the `finished` mark's commit waits for the WAL flush.
            let outcome = match c.batch("SET LOCAL synchronous_commit TO OFF").await {
                Ok(()) => c.copy_in_run(first, &mut rows).await,
                Err(e) => Err(e),
            };
            next = c.finish(outcome).await?;
        }
    }

    async fn import_started(&self) -> Result<()> {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = deferred::set_aside(&mut c).await;
        c.finish(outcome).await
    }

    async fn import_finished(&self) -> Result<()> {
        deferred::build_indexes(&self.inner.pool).await?;
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = match deferred::restore(&mut c).await {
            Ok(()) => move_sequences(&mut c).await,
            Err(e) => Err(e),
        };
        c.finish(outcome).await
    }

    async fn index_search(&self, _batch: i64) -> Result<crate::IndexBehind> {
        // P14: the search indexes a copy deferred, built here by one replica.
        let building = deferred::build_search(&self.inner.pool).await?;
        Ok(crate::IndexBehind { seqs: 0, building })
    }

    async fn replace_tabs(&self, rows: mpsc::Receiver<Incoming>) -> Result<()> {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = replace_all(&mut c, rows).await;
        c.finish(outcome).await
    }

    async fn occupied_tabs(&self) -> Result<Vec<&'static str>> {
        let rows = self.conn().await?.query(&transfer::occupied_sql(), &[]).await?;
        let flags = match rows.first() {
            Some(row) => {
                (0..row.len()).map(|i| row.try_get(i)).collect::<Result<Vec<bool>, _>>().map_err(conn::map_err)?
            }
            None => Vec::new(),
        };
        Ok(transfer::occupied(&flags))
    }

    async fn firing_alerts(&self) -> Result<Vec<Alert>> {
        self.alerts(&predicates::state_is(AlertState::Firing), "kind, subject", i64::MAX).await
    }

    async fn alerts_to_notify(&self, limit: usize) -> Result<Vec<Alert>> {
        self.alerts(
            "notified IS DISTINCT FROM state",
            "updated_at, kind COLLATE \"C\", subject COLLATE \"C\"",
            limit as i64,
        )
        .await
    }

    async fn list_alerts(&self, limit: usize) -> Result<Vec<Alert>> {
        self.alerts("TRUE", "updated_at DESC, kind COLLATE \"C\", subject COLLATE \"C\"", limit as i64).await
    }

    async fn write_alerts(&self, alerts: Vec<Alert>) -> Result<()> {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = upsert_alerts(&mut c, &alerts).await;
        c.finish(outcome).await
    }

    async fn mark_notified(&self, sent: Vec<Alert>, at: Ts) -> Result<()> {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            for a in &sent {
                c.execute(
                    "UPDATE alerts SET notified = state, last_sent_at = $1 \
                     WHERE kind = $2 AND subject = $3 AND state = $4 AND updated_at = $5",
                    &[&ms(at), &a.kind.as_str(), &a.subject, &a.state.as_str(), &ms(a.updated_at)],
                )
                .await?;
            }
            Ok(())
        }
        .await;
        c.finish(outcome).await
    }

    async fn lease_transaction<R, F>(&self, name: &str, plan: F) -> Result<R>
    where
        F: FnOnce(Option<Lease>, Ts) -> (Option<Lease>, R) + Send + 'static,
        R: Send + 'static,
    {
        let mut c = self.conn().await?;
        c.begin().await?;
        let outcome = async {
            c.execute(LEASE_LOCK, &[&name]).await?;
            let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE name = $1");
            let current = c.decode(&sql, &[&name], codec::lease).await?.pop();
            // The database's clock: every replica measures the lease against the same one.
            let now = c.query("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint", &[]).await?;
            let now = from_ms(now.first().map(|r| codec::Columns::int(r, 0)).transpose()?.unwrap_or_default());
            let (write, out) = plan(current, now);
            if let Some(lease) = write {
                c.execute(
                    &codec::upsert_sql("leases", LEASE_COLUMNS, codec::LEASE_KEY, &[], &values(LEASE_COLUMNS)),
                    &params(&codec::lease_params(&lease)),
                )
                .await?;
            }
            Ok(out)
        }
        .await;
        c.finish(outcome).await
    }

    fn changes(&self) -> Option<broadcast::Receiver<Change>> {
        Some(self.inner.changes.subscribe())
    }
}

impl PgStore {
    /// `(group, state, count)` rows of a `GROUP BY` query over `tab`, for the gauges.
    async fn group_counts<S>(&self, tab: &str, sql: &str) -> Result<Vec<StateCount<S>>>
    where
        S: std::str::FromStr<Err = pcmail_core::names::UnknownName>,
    {
        let rows = self.conn().await?.query(sql, &[]).await?;
        rows.iter()
            .map(|r| {
                use codec::Columns;
                StateCount::parse(tab, r.text(0)?, &r.text(1)?, r.int(2)?)
            })
            .collect()
    }

    async fn alerts(&self, filter: &str, order: &str, limit: i64) -> Result<Vec<Alert>> {
        let sql = format!("SELECT {ALERT_COLUMNS} FROM alerts WHERE {filter} ORDER BY {order} LIMIT $1");
        self.conn().await?.decode(&sql, &[&limit], codec::alert).await
    }
}

/// U5 and T14: each part of a search under what is left of its budget as `statement_timeout`;
/// one that runs out ends the search, `truncated`, with the parts answered before it. A
/// machine's scope is the first column of the mail index (migration 6), and the cheaper of the
/// two tests, so only its own rows are ever compared with the text.
async fn search_within(c: &mut conn::Conn, s: &crate::Search, started: std::time::Instant) -> Result<crate::Found> {
    let pattern = crate::like_anywhere(&s.text);
    let limit = s.limit as i64;
    let mut found = crate::Found::default();
    if s.mail {
        let Some(ms) = s.budget.timeout_ms(started.elapsed()) else {
            return Ok(crate::Found { truncated: true, ..found });
        };
        c.batch(&format!("SET LOCAL statement_timeout = {ms}")).await?;
        let mail = match &s.machine {
            Some(machine) => {
                let sql = format!(
                    "SELECT {MAIL_COLUMNS} FROM mail WHERE ARRAY[\"from\", \"to\"] @> ARRAY[$2::text] \
                     AND (subject || ' ' || body) ILIKE $1 ORDER BY seq DESC LIMIT $3"
                );
                c.decode_unless_cancelled(&sql, &[&pattern, machine, &limit], codec::mail).await?
            }
            None => {
                let sql = format!(
                    "SELECT {MAIL_COLUMNS} FROM mail WHERE (subject || ' ' || body) ILIKE $1 ORDER BY seq DESC LIMIT $2"
                );
                c.decode_unless_cancelled(&sql, &[&pattern, &limit], codec::mail).await?
            }
        };
        let Some(mail) = mail else {
            return Ok(crate::Found { truncated: true, ..found });
        };
        found.mail = mail;
    }
    if s.ledger {
        let Some(ms) = s.budget.timeout_ms(started.elapsed()) else {
            return Ok(crate::Found { truncated: true, ..found });
        };
        c.batch(&format!("SET LOCAL statement_timeout = {ms}")).await?;
        let sql = format!(
            "SELECT {LEDGER_COLUMNS} FROM ledger WHERE (task || ' ' || content) ILIKE $1 ORDER BY project, seq LIMIT $2"
        );
        match c.decode_unless_cancelled(&sql, &[&pattern, &limit], codec::ledger_row).await? {
            Some(rows) => found.rows = rows,
            None => found.truncated = true,
        }
    }
    Ok(found)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The server the tests use; `.ci/run` starts it. Each test gets a database of its own.
    pub fn admin_url() -> String {
        std::env::var("PCMAIL_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
    }

    /// Drops its database when the test ends.
    pub struct Scratch(String);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let name = self.0.clone();
            // Its own thread and runtime: Drop cannot await, and the test's runtime is ending.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async {
                    if let Ok(mut c) = Conn::open(&admin_url().parse().expect("url")).await {
                        let _ = c.batch(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")).await;
                    }
                });
            })
            .join();
        }
    }

    /// A connection of the test's own to the database at `url`.
    pub async fn connect(url: &str) -> Conn {
        Conn::open(&url.parse().expect("url")).await.expect("connect")
    }

    pub async fn scratch_url() -> (Scratch, String) {
        let mut bytes = [0u8; 6];
        getrandom::fill(&mut bytes).expect("random");
        let name = format!("pcmail_test_{}", pcmail_core::ids::hex(&bytes));
        let admin: tokio_postgres::Config = admin_url().parse().expect("PCMAIL_TEST_POSTGRES is a URL");
        let mut c = Conn::open(&admin).await.expect("PostgreSQL at PCMAIL_TEST_POSTGRES (.ci/run starts it)");
        c.batch(&format!("CREATE DATABASE {name}")).await.expect("create database");
        let url = admin_url();
        let base = url.rsplit_once('/').map_or(url.as_str(), |(b, _)| b);
        (Scratch(name.clone()), format!("{base}/{name}"))
    }

    async fn fresh() -> (Scratch, PgStore) {
        let (scratch, url) = scratch_url().await;
        let store = PgStore::open(&url).await.expect("open");
        (scratch, store)
    }

    crate::contract::contract_tests!(fresh);

    #[tokio::test]
    async fn i6_missing_column_fails_closed_naming_it() {
        let (scratch, url) = scratch_url().await;
        drop(PgStore::open(&url).await.expect("open"));
        let mut c = connect(&url).await;
        c.batch("ALTER TABLE mail DROP COLUMN presented_session").await.expect("drop column");
        let err = PgStore::open(&url).await.err().expect("must refuse");
        assert!(err.to_string().contains("mail.presented_session is missing"), "{err}");
        drop(scratch);
    }

    #[tokio::test]
    async fn i6_v5_a_newer_schema_that_only_adds_is_used_any_other_refused_naming_both_versions() {
        let (_scratch, url) = scratch_url().await;
        drop(PgStore::open(&url).await.expect("open"));
        drop(PgStore::open(&url).await.expect("reopen"));
        let mut c = connect(&url).await;
        let known = schema::MIGRATIONS.len();
        // A next release's store whose migrations after this build's only add: used as it is.
        c.batch(&format!("UPDATE pcmail_schema SET version = 99, readable_by = {known}")).await.expect("bump");
        drop(PgStore::open(&url).await.expect("newer by migrations that add"));
        let version: i64 = c.query("SELECT version FROM pcmail_schema", &[]).await.expect("v")[0].get(0);
        assert_eq!(version, 99, "never migrated back");
        // One whose migration 99 dropped or renamed something: refused.
        c.batch("UPDATE pcmail_schema SET readable_by = 99").await.expect("contract");
        let err = PgStore::open(&url).await.err().expect("must refuse");
        let told = err.to_string();
        assert!(told.contains("schema is version 99") && told.contains(&format!("knows (version {known})")), "{told}");
    }

    #[tokio::test]
    async fn replicas_migrating_at_once_migrate_once() {
        let (_scratch, url) = scratch_url().await;
        let opens: Vec<_> = (0..3)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move { PgStore::open(&url).await.map(drop) })
            })
            .collect();
        for o in opens {
            o.await.expect("task").expect("every replica opens");
        }
        // Once: one version row at the last migration, and one store identity that every
        // replica reads (a second run of migration 1 would have made another or failed).
        let mut c = connect(&url).await;
        let versions: Vec<i64> = c
            .query("SELECT version FROM pcmail_schema", &[])
            .await
            .expect("versions")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(versions, [schema::MIGRATIONS.len() as i64]);
        let identities = c.query("SELECT value FROM kv WHERE key = 'store/identity'", &[]).await.expect("identity");
        assert_eq!(identities.len(), 1);
        let identity: String = identities[0].get(0);
        let again = PgStore::open(&url).await.expect("a fourth opens");
        assert_eq!(again.kv_get(crate::IDENTITY_KEY).await.expect("kv"), Some(identity));
    }

    #[tokio::test]
    async fn c1_a_commit_is_announced_to_other_replicas() {
        let (_scratch, url) = scratch_url().await;
        let (a, b) = (PgStore::open(&url).await.expect("a"), PgStore::open(&url).await.expect("b"));
        let mut changes = b.changes().expect("postgres announces");
        // The listener's first word is Missed (it just connected); wait for it so LISTEN is on.
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), changes.recv()).await;
        assert_eq!(first.expect("listening").expect("change"), Change::Missed);
        let m = Mail::new("mail--00000001".into(), "pc1".into(), "pc2".into(), from_ms(0), from_ms(1000));
        a.mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { insert: vec![m], ..Default::default() }, ())
        })
        .await
        .expect("insert");
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), changes.recv()).await;
        assert_eq!(got.expect("announced within 5 s").expect("change"), Change::Mail { to: "pc2".into() });
    }

    /// P14: 300k rows a tab (mail, ledger, jobs), written through the store's own API.
    async fn fill_300k(store: &impl Store) {
        use pcmail_core::ledger::{Incoming, merge_plan};
        const ROWS: u32 = 300_000;
        let at = |n: u32| from_ms(i64::from(n) * 1000);
        for chunk in (0..ROWS).collect::<Vec<_>>().chunks(50_000) {
            let mails: Vec<Mail> = chunk
                .iter()
                .map(|n| Mail {
                    subject: format!("subject {n} 請求書"),
                    body: "b".repeat(100),
                    ..Mail::new(format!("mail--{n:08x}"), format!("pc{}", n % 7), "pc1".into(), at(*n), at(n + 99))
                })
                .collect();
            let jobs: Vec<pcmail_core::jobs::Job> = chunk
                .iter()
                .map(|n| {
                    pcmail_core::jobs::Job::new(format!("job-{n:08x}"), "q".into(), "f".into(), "{}".into(), at(*n))
                })
                .collect();
            store
                .mail_transaction(MailSelect::Ids(vec![]), move |_| {
                    (MailWrites { insert: mails, ..Default::default() }, ())
                })
                .await
                .expect("mail");
            store.jobs_transaction(crate::JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");
        }
        for project in ["alpha", "beta", "gamma"] {
            let items: Vec<Incoming> = (0..ROWS / 3)
                .map(|n| Incoming { source: format!("s{}", n % 5), task: format!("task {n}"), ..Incoming::default() })
                .collect();
            store
                .ledger_transaction(project, crate::LedgerSelect::All, move |state| {
                    let plan = merge_plan(project, &state.rows, &items, state.next_seq);
                    (crate::LedgerWrites { add: plan.add, next_seq: Some(plan.next_seq), ..Default::default() }, ())
                })
                .await
                .expect("ledger");
        }
    }

    #[tokio::test]
    async fn p14_300k_rows_a_tab_copy_sqlite_to_postgres_and_back_equal() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = crate::sqlite::SqliteStore::open(dir.path().join("source.db")).await.expect("source");
        let t = std::time::Instant::now();
        fill_300k(&source).await;
        eprintln!("P14: 300k rows a tab written in {:?}", t.elapsed());
        let (_scratch, pg) = fresh().await;
        let back = crate::sqlite::SqliteStore::open(dir.path().join("back.db")).await.expect("back");
        let t = std::time::Instant::now();
        let there = crate::transfer::copy(&source, &pg).await.expect("sqlite → postgres");
        eprintln!("P14: copied to PostgreSQL in {:?}", t.elapsed());
        let t = std::time::Instant::now();
        let again = crate::transfer::copy(&pg, &back).await.expect("postgres → sqlite");
        eprintln!("P14: copied back in {:?}", t.elapsed());
        let rows = |d: &[crate::transfer::TabDigest], tab: &str| d.iter().find(|x| x.tab == tab).map(|x| x.rows);
        for tab in ["mail", "ledger", "jobs"] {
            assert_eq!(rows(&there, tab), Some(300_000), "{tab}");
        }
        let t = std::time::Instant::now();
        let (ours, theirs, back) = (
            crate::transfer::digest(&source).await.expect("source"),
            crate::transfer::digest(&pg).await.expect("postgres"),
            crate::transfer::digest(&back).await.expect("back"),
        );
        eprintln!("P14: three verifies in {:?}", t.elapsed());
        assert_eq!(crate::transfer::differences(&ours, &theirs), Vec::<&str>::new(), "postgres holds the same");
        assert_eq!(crate::transfer::differences(&ours, &back), Vec::<&str>::new(), "and so does the way back");
        assert_eq!((there, again), (ours.clone(), ours), "each copy counted what it wrote");
    }

    /// Every index, trigger and key of the store's schema, as PostgreSQL would build it again.
    async fn schema_of(url: &str) -> Vec<String> {
        let mut c = connect(url).await;
        let indexes = "SELECT indexdef || CASE WHEN indisvalid THEN '' ELSE ' INVALID' END \
             FROM pg_indexes JOIN pg_index ON indexrelid = format('%I.%I', schemaname, indexname)::regclass \
             WHERE schemaname = current_schema()";
        let triggers = "SELECT pg_get_triggerdef(oid) || ' ' || tgenabled::text FROM pg_trigger WHERE NOT tgisinternal";
        let constraints = "SELECT conrelid::regclass::text || ' ' || conname || ' ' || pg_get_constraintdef(oid) \
             || ' over ' || conindid::regclass::text FROM pg_constraint \
             WHERE connamespace = to_regnamespace(current_schema()) AND contype IN ('p', 'u')";
        let mut all: Vec<String> = Vec::new();
        for sql in [indexes, triggers, constraints] {
            all.extend(c.query(sql, &[]).await.expect("catalog").iter().map(|r| r.get::<_, String>(0)));
        }
        all.sort();
        all
    }

    #[tokio::test]
    async fn p14_a_copy_into_postgres_ends_with_every_key_index_trigger_and_count_and_the_indexer_builds_search() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = crate::sqlite::SqliteStore::open(dir.path().join("source.db")).await.expect("source");
        let mails: Vec<Mail> = (0..40u32)
            .map(|n| Mail {
                subject: format!("請求書 invoice {n}"),
                state: if n % 3 == 0 { MailState::Done } else { MailState::New },
                ..Mail::new(format!("mail--{n:08x}"), "pc1".into(), format!("pc{}", n % 4), from_ms(0), from_ms(9))
            })
            .collect();
        source
            .mail_transaction(MailSelect::Ids(vec![]), move |_| {
                (MailWrites { insert: mails, ..Default::default() }, ())
            })
            .await
            .expect("mail");
        let jobs = (0..5).map(|n| Job::new(format!("job-{n}"), "q".into(), "f".into(), "{}".into(), from_ms(0)));
        let jobs: Vec<Job> = jobs.collect();
        source.jobs_transaction(crate::JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("jobs");
        let ((_target, url), (_reference, reference)) = (scratch_url().await, scratch_url().await);
        let (pg, _) = (PgStore::open(&url).await.expect("target"), PgStore::open(&reference).await.expect("ref"));
        // A trigger an operator disabled stays so, and one set to fire ALWAYS stays so.
        for u in [&url, &reference] {
            let mut c = connect(u).await;
            c.batch("ALTER TABLE jobs DISABLE TRIGGER jobs_announce; ALTER TABLE specs ENABLE ALWAYS TRIGGER specs_announce")
                .await
                .expect("operator's triggers");
        }
        let (fresh_schema, before_copy) = (schema_of(&reference).await, schema_of(&url).await);
        assert_eq!(before_copy, fresh_schema);

        crate::transfer::copy(&source, &pg).await.expect("copy");
        let is_search = |def: &String| def.contains("gin_trgm_ops");
        let without_search: Vec<String> = fresh_schema.iter().filter(|d| !is_search(d)).cloned().collect();
        assert!(without_search.len() < fresh_schema.len(), "the schema has search indexes");
        assert_eq!(schema_of(&url).await, without_search, "every key, b-tree and trigger back, enabled");
        let counts = |s: Vec<MailCount>| {
            let mut v: Vec<_> = s
                .into_iter()
                .filter(|c| c.count > 0)
                .map(|c| format!("{:?} {:?} {}", c.state, c.kind, c.count))
                .collect();
            v.sort();
            v
        };
        assert_eq!(counts(pg.mail_counts().await.expect("pg")), counts(source.mail_counts().await.expect("src")));
        // U5: whole before the search indexes are built (the same ILIKE, read from the table).
        let find = || async {
            let s = crate::Search { text: "請求".into(), mail: true, limit: 100, ..crate::Search::default() };
            pg.search(s).await.expect("search").mail.len()
        };
        assert_eq!(find().await, 40);

        assert!(pg.index_search(1).await.expect("the indexer builds them").building);
        assert_eq!(schema_of(&url).await, fresh_schema, "the search indexes too, valid");
        assert_eq!(find().await, 40);
        let kept: Vec<String> = pg.kv_get("store/copy-deferred-search").await.expect("kv").into_iter().collect();
        assert_eq!(kept, Vec::<String>::new(), "nothing is left to build");
        assert!(!pg.index_search(1).await.expect("looked again").building);
        // The triggers run again: a mail sent after the copy is counted.
        let late = Mail::new("mail--late".into(), "pc1".into(), "pc2".into(), from_ms(0), from_ms(9));
        pg.mail_transaction(MailSelect::Ids(vec![]), move |_| {
            (MailWrites { insert: vec![late], ..Default::default() }, ())
        })
        .await
        .expect("a mail after the copy");
        let total: u64 = pg.mail_counts().await.expect("counts").iter().map(|c| c.count).sum();
        assert_eq!(total, 41);
    }

    #[tokio::test]
    async fn p14_o3_rows_that_stop_before_their_end_fail_the_import_and_keep_none_of_their_run() {
        let (_scratch, pg) = fresh().await;
        // Names of 100 bytes: `rows` of them are more than two chunks of the COPY stream, so
        // part of the run has gone to the connection when it breaks.
        let rows = (2 * copy::CHUNK / 100) as i64 + 1;
        let machine = |n: i64| vec![Cell::Text(format!("pc{n:0>98}")), Cell::Int(n), Cell::Text(String::new())];
        let batch =
            |ns: std::ops::Range<i64>| Incoming::Rows(Batch { tab: "machines", rows: ns.map(machine).collect() });
        let (tx, rx) = mpsc::channel(4);
        let import = pg.import_stream(rx);
        let fed = async move {
            tx.send(batch(0..rows / 2)).await.expect("taken");
            tx.send(batch(rows / 2..rows)).await.expect("taken");
            // The feed breaks here: no `End`.
        };
        let (imported, ()) = tokio::join!(import, fed);
        let err = imported.expect_err("a stream without its end fails");
        assert!(err.to_string().contains("stopped before their end"), "{err}");
        assert_eq!(pg.occupied_tabs().await.expect("occupied"), Vec::<&str>::new(), "the run is not kept");

        // A row that fits no column, after the first chunks went: refused by name, none kept.
        let (tx, rx) = mpsc::channel(4);
        let fed = async move {
            tx.send(batch(0..rows)).await.expect("taken");
            let short = Batch { tab: "machines", rows: vec![vec![Cell::Text("pc-short".into())]] };
            let _ = tx.send(Incoming::Rows(short)).await;
        };
        let (imported, ()) = tokio::join!(pg.import_stream(rx), fed);
        let err = imported.expect_err("a row of one value for three columns");
        assert!(err.to_string().contains("machines: a row of 1 values for 3 columns"), "{err}");
        assert_eq!(pg.occupied_tabs().await.expect("the pool's connections still answer"), Vec::<&str>::new());

        let (tx, rx) = mpsc::channel(4);
        let fed = async move {
            tx.send(batch(0..3)).await.expect("taken");
            tx.send(Incoming::End).await.expect("taken");
        };
        let (imported, ()) = tokio::join!(pg.import_stream(rx), fed);
        imported.expect("a whole stream is kept");
        assert_eq!(pg.occupied_tabs().await.expect("occupied"), vec!["machines"]);
    }

    #[tokio::test]
    async fn p14_o3_a_key_that_cannot_be_built_again_fails_the_copys_end_and_leaves_it_unfinished() {
        let (_scratch, url) = scratch_url().await;
        let pg = PgStore::open(&url).await.expect("open");
        pg.import_started().await.expect("the keys set aside");
        // Two machines of one name: taken while the key is aside, then no key builds over them.
        let machine = |n: i64| vec![Cell::Text("pc-twice".into()), Cell::Int(n), Cell::Text(String::new())];
        pg.import_rows(Batch { tab: "machines", rows: vec![machine(1), machine(2)] }).await.expect("rows");
        let err = pg.import_finished().await.expect_err("a key over a name twice");
        assert!(err.to_string().contains("machines_pkey"), "{err}");
        let again = pg.import_started().await.expect_err("still marked unfinished");
        assert!(matches!(again, StoreError::UnfinishedCopy), "{again}");
        assert_eq!(pg.occupied_tabs().await.expect("the pool's connections still answer"), vec!["machines"]);
    }

    #[tokio::test]
    async fn p14_o3_a_second_copy_into_a_store_another_is_filling_stops_at_its_start() {
        let (_scratch, url) = scratch_url().await;
        let (first, second) = (PgStore::open(&url).await.expect("one"), PgStore::open(&url).await.expect("two"));
        first.import_started().await.expect("the first sets its keys aside");
        let err = second.import_started().await.expect_err("the second finds them set aside");
        assert!(matches!(err, StoreError::UnfinishedCopy), "{err}");
        first.import_finished().await.expect("the first ends");
        let fresh = PgStore::open(&url).await.expect("three");
        fresh.import_started().await.expect("after the first ended, a copy starts again");
    }

    #[test]
    fn bad_urls_are_named_without_their_password() {
        assert_eq!(crate::redact_url("postgres://u:secret@h/db"), "postgres://u:***@h/db");
        assert_eq!(crate::redact_url("postgres://h/db"), "postgres://h/db");
        assert_eq!(crate::redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            crate::redact_url("postgres://h/db?user=u&password=secret&sslmode=require&password=again"),
            "postgres://h/db?user=u&password=***&sslmode=require&password=***"
        );
    }
}
