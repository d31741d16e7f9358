//! The embedded default store: SQLite in WAL mode, one writer connection plus a pool of
//! readers. Every call runs on tokio's blocking pool so the async server never waits on disk.

mod bulk;
#[cfg(test)]
mod earlier;
pub mod rows;
pub mod schema;
mod search;

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use pcmail_core::Ts;
use pcmail_core::alert::{Alert, AlertState};
use pcmail_core::api::Event;
use pcmail_core::mail::{Mail, MailState};
use pcmail_core::manifest::{Kind, SpecRecord, Status};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use tokio::sync::mpsc;

use crate::cells::{Batch, Cell, Incoming};
use crate::codec::{
    self, ALERT_COLUMNS, EVENT_COLUMNS, JOB_COLUMNS, LEASE_COLUMNS, LEDGER_COLUMNS, MAIL_COLUMNS, MAIL_INSERT_COLUMNS,
    SPEC_COLUMNS, from_ms, json, ms,
};
use crate::predicates;
use crate::transfer;
use crate::{
    Claim, JobQuery, JobSelect, LedgerSelect, LedgerState, LedgerWrites, MachineSeen, MailCount, MailQuery, MailSelect,
    MailWrites, Prune, Result, SpecWrites, StateCount, Store, StoreError,
};
use pcmail_core::jobs::{Job, JobState, LeaseSeen, expired_by_sight};
use pcmail_core::lease::{Lease, Sighting, as_seen};
use pcmail_core::ledger::{Row as LedgerRow, RowState};
use rows::collect;

/// Readers kept open for reuse, and the most reads at once: a flood of concurrent requests
/// waits for a reader instead of opening one each (each fresh connection parses the schema and
/// fills a page cache of its own; 50 at once left ~130 MB in the allocator, issue #29).
const READER_POOL: usize = 8;

#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    // Dropped before the writer: the last connection to close checkpoints the write-ahead log
    // into the file and removes it only if it may write, so a closed store is one whole file.
    readers: Mutex<Vec<Connection>>,
    /// [`READER_POOL`] permits: one per read running.
    reading: Arc<tokio::sync::Semaphore>,
    writer: Mutex<Connection>,
    /// E13: leases as this process last saw them change, judged on the monotonic clock.
    seen: Mutex<Seen>,
}

/// E13: SQLite has no clock but the process's wall clock, which steps; a lease (the leader's,
/// a job's) is judged instead by how long it has stood unchanged as this process saw it.
#[derive(Default)]
struct Seen {
    leases: std::collections::HashMap<String, Sighting<Lease>>,
    jobs: std::collections::HashMap<String, Sighting<LeaseSeen>>,
}

/// The monotonic clock, as time since the first look of this process.
fn monotonic() -> std::time::Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

pub fn map_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    match e.sqlite_error_code() {
        Some(C::DiskFull) => StoreError::NoSpace(e.to_string()),
        Some(C::ReadOnly | C::SystemIoFailure | C::CannotOpen | C::DatabaseBusy | C::DatabaseLocked) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Backend(e.to_string()),
    }
}

fn open_connection(path: &Path, writer: bool) -> Result<Connection> {
    let flags = if writer {
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX
    } else {
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
    };
    let conn = Connection::open_with_flags(path, flags).map_err(map_err)?;
    conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(map_err)?;
    // Room for every statement a connection repeats, the per-change-set job updates included.
    conn.set_prepared_statement_cache_capacity(128);
    plan_once(&conn).map_err(map_err)?;
    if writer {
        conn.pragma_update(None, "journal_mode", "WAL").map_err(map_err)?;
        // FULL: a send that was acknowledged survives power loss too, not only a killed process.
        conn.pragma_update(None, "synchronous", "FULL").map_err(map_err)?;
    }
    Ok(conn)
}

/// P9: each statement of `conn` is planned when first prepared, never again for the values
/// bound to it. Otherwise a `LIMIT ?N` (in the bundled SQLite, 3.50) or a bound value weighed
/// against a partial index expires the statement at each binding, and every run of it parses
/// and plans it again. A query that needs a partial index names the index's state as a literal
/// (`predicates`), so no plan waits on a bound value.
pub fn plan_once(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true).map(drop)
}

/// Which rows one reader of a digest sums: every row, or one of two halves ([`Share::select`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Share {
    All,
    /// The mail up to `mail_upto` by seq and every other tab at an even place in
    /// [`transfer::TABS`] (`first`), or the rest: the two are the whole store, each row once.
    Half {
        first: bool,
        mail_upto: i64,
    },
}

impl Share {
    /// `tab`'s rows this share sums, as the SELECT that reads them: None if none of them.
    fn select(self, at: usize, tab: &str, order: &str) -> Option<String> {
        match self {
            Share::All => Some(transfer::select_sql(tab, order)),
            Share::Half { first, mail_upto } if tab == "mail" => {
                let side = if first { "<=" } else { ">" };
                Some(transfer::select_where_sql(tab, &format!("seq {side} {mail_upto}"), order))
            }
            Share::Half { first, .. } => (first == at.is_multiple_of(2)).then(|| transfer::select_sql(tab, order)),
        }
    }
}

/// The counts and sums of the rows `share` names, from one read transaction; `(tab, rows)`
/// told each batch.
fn digest_rows(
    conn: &Connection,
    share: Share,
    told: &mpsc::UnboundedSender<(&'static str, u64)>,
) -> Result<transfer::Sums> {
    let tx = conn.unchecked_transaction().map_err(map_err)?;
    let mut sums = transfer::Sums::default();
    for (at, (tab, order)) in transfer::TABS.iter().enumerate() {
        let Some(select) = share.select(at, tab, order) else { continue };
        let names = transfer::columns(tab);
        let mut stmt = tx.prepare(&select).map_err(map_err)?;
        let mut found = stmt.query([]).map_err(map_err)?;
        let mut batch = 0;
        'rows: while let Some(row) = found.next().map_err(map_err)? {
            let mut hash = transfer::RowHash::default();
            for (i, name) in names.iter().enumerate() {
                let cell = rows::cell_ref(row.get_ref(i).map_err(map_err)?, tab, name)?;
                if i == 0 && transfer::stays_behind(tab, cell) {
                    continue 'rows;
                }
                hash.add(cell);
            }
            sums.add_hash(tab, hash.finish());
            batch += 1;
            if batch == transfer::BATCH as u64 {
                let _ = told.send((tab, std::mem::take(&mut batch)));
            }
        }
        if batch > 0 {
            let _ = told.send((tab, batch));
        }
    }
    Ok(sums)
}

impl SqliteStore {
    /// Opens (creating if needed, readable by its owner only) and migrates the database at `path`.
    pub async fn open(path: impl AsRef<Path>) -> Result<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || {
            crate::private::open_private(&path)
                .map_err(|e| crate::health::io_error(&format!("cannot open {} for writing", path.display()), &e))?;
            let mut writer = open_connection(&path, true)?;
            schema::migrate(&mut writer)?;
            Ok(SqliteStore::over(path, writer))
        })
        .await
        .map_err(|e| StoreError::Backend(format!("open task failed: {e}")))?
    }

    /// O2/O3: opens an existing store only to read it (a backup, the source of a copy): never
    /// creates, migrates or writes the file, and refuses one that is not a current pcmail store.
    pub async fn open_read_only(path: impl AsRef<Path>) -> Result<SqliteStore> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || {
            if !path.is_file() {
                return Err(StoreError::Unavailable(format!("there is no store at {}", path.display())));
            }
            let reader = open_connection(&path, false)?;
            schema::check_current(&reader).map_err(|e| StoreError::Schema(format!("{}: {e}", path.display())))?;
            Ok(SqliteStore::over(path, reader))
        })
        .await
        .map_err(|e| StoreError::Backend(format!("open task failed: {e}")))?
    }

    /// E14: SQLite's own check of every page of the file (a flipped bit in an index or a page
    /// header, which no row checksum sees).
    pub async fn integrity(&self) -> Result<()> {
        let path = self.inner.path.display().to_string();
        self.read(move |conn| {
            let mut stmt = conn.prepare("PRAGMA integrity_check").map_err(map_err)?;
            let found: Vec<String> =
                stmt.query_map([], |r| r.get(0)).map_err(map_err)?.collect::<rusqlite::Result<_>>().map_err(map_err)?;
            match found.as_slice() {
                [ok] if ok == "ok" => Ok(()),
                problems => Err(StoreError::Corrupt(format!("{path} is damaged: {}", problems.join("; ")))),
            }
        })
        .await
    }

    fn over(path: PathBuf, writer: Connection) -> SqliteStore {
        let reading = Arc::new(tokio::sync::Semaphore::new(READER_POOL));
        SqliteStore {
            inner: Arc::new(Inner {
                path,
                readers: Mutex::new(Vec::new()),
                reading,
                writer: Mutex::new(writer),
                seen: Mutex::default(),
            }),
        }
    }

    /// P14/O2: writes this store's pages into the empty file `to` with SQLite's online backup,
    /// all of one snapshot while writers go on, and makes the copy a store of its own: this
    /// store's `store/` and `sheets/` keys go (its identity among them: E5, a PC merges a
    /// restored store from 0), a new identity is taken, and the copy is marked finished. Pages,
    /// not rows: a row copy runs every insert's triggers and index writes again, about nine
    /// times `sqlite3 .backup`'s time at 1M mails. The backup's checksums are the caller's.
    pub async fn back_up_pages(&self, to: PathBuf) -> Result<()> {
        self.read(move |conn| {
            let mut copy = Connection::open(&to).map_err(map_err)?;
            // -1: every page in one step, so all of them come from one snapshot.
            let step = rusqlite::backup::Backup::new(conn, &mut copy).and_then(|b| b.step(-1)).map_err(map_err)?;
            if step != rusqlite::backup::StepResult::Done {
                return Err(StoreError::Backend(format!("the page copy into {} stopped: {step:?}", to.display())));
            }
            let tx = copy.transaction().map_err(map_err)?;
            tx.execute(&format!("DELETE FROM kv WHERE {}", transfer::OWN_KEYS), []).map_err(map_err)?;
            tx.execute(
                "INSERT INTO kv (key, value) VALUES (?1, lower(hex(randomblob(16)))), (?2, 'finished')",
                [crate::IDENTITY_KEY, transfer::COPY_KEY],
            )
            .map_err(map_err)?;
            tx.commit().map_err(map_err)?;
            // The source's header says WAL; a backup is one file (`seal`).
            copy.pragma_update(None, "journal_mode", "DELETE").map_err(map_err)
        })
        .await
    }

    /// P14: [`transfer::digest_counted`] of this store, read in place from one snapshot: each
    /// value is hashed where SQLite holds it, none copied out into a row and handed over (a
    /// third of a digest's time at 1M mails). Tells `on_rows` of each batch's tab and rows.
    pub async fn digest_in_place(&self, on_rows: &mut transfer::OnRows<'_>) -> Result<Vec<transfer::TabDigest>> {
        self.digest_shares(&[Share::All], on_rows).await
    }

    /// P14: [`SqliteStore::digest_in_place`] of a file nothing writes while it is read (a
    /// backup's own copy, held by the backup): its two halves read at once, on two
    /// connections. Only because no write can come between their reads do the two see one
    /// store; a store `serve` may be writing is digested by one reader.
    pub async fn digest_unwritten(&self, on_rows: &mut transfer::OnRows<'_>) -> Result<Vec<transfer::TabDigest>> {
        let bounds =
            |c: &Connection| c.query_row("SELECT MIN(seq), MAX(seq) FROM mail", [], |r| Ok((r.get(0)?, r.get(1)?)));
        let (min, max): (Option<i64>, Option<i64>) = self.read(move |c| bounds(c).map_err(map_err)).await?;
        // Halfway, in i128: an i64 sum could overflow (SQLite would turn it into a REAL).
        let upto = match (min, max) {
            (Some(min), Some(max)) => i64::try_from((i128::from(min) + i128::from(max)).div_euclid(2)).unwrap_or(min),
            _ => 0,
        };
        let halves = [true, false].map(|first| Share::Half { first, mail_upto: upto });
        self.digest_shares(&halves, on_rows).await
    }

    /// Each share summed by a reader of its own, at once; their sums added.
    async fn digest_shares(
        &self,
        shares: &[Share],
        on_rows: &mut transfer::OnRows<'_>,
    ) -> Result<Vec<transfer::TabDigest>> {
        let (told, mut heard) = mpsc::unbounded_channel();
        let readings: Vec<_> = shares
            .iter()
            .map(|&share| {
                let (store, told) = (self.clone(), told.clone());
                tokio::spawn(async move { store.read(move |conn| digest_rows(conn, share, &told)).await })
            })
            .collect();
        drop(told);
        // The channel closes when every reading has ended, its senders dropped with them.
        while let Some((tab, rows)) = heard.recv().await {
            on_rows(tab, rows);
        }
        let mut sums = transfer::Sums::default();
        for reading in readings {
            sums.merge(reading.await.map_err(|e| StoreError::Backend(format!("the digest stopped: {e}")))??);
        }
        Ok(sums.finish())
    }

    /// O2: leaves the file whole and readable where nothing may be written (a backup kept on
    /// read-only media): the write-ahead log folded in, the rollback journal mode back.
    pub async fn seal(self) -> Result<()> {
        self.inner.readers.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.write(|conn| conn.pragma_update(None, "journal_mode", "DELETE").map_err(map_err)).await
    }

    async fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock cannot leave a half transaction: rusqlite rolls
            // back on drop, so the poisoned connection is still consistent.
            let mut conn = inner.writer.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .map_err(|e| StoreError::Backend(format!("write task failed: {e}")))?
    }

    /// P10: a write bounded by one request's jobs (a claim, a report batch, an enqueue of at
    /// most `MAX_ENQUEUE`) runs on the caller's thread when the writer is free: the hop to the
    /// blocking pool and back costs more than such a write. The writer busy, it waits its turn
    /// on the pool like any other; so at most one runtime thread is ever held by a write.
    async fn write_brief<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        match self.write_if_free(f) {
            Ok(done) => done,
            Err(f) => self.write(f).await,
        }
    }

    /// `f` run on the writer now, or handed back when another write holds it.
    fn write_if_free<R, F: FnOnce(&mut Connection) -> Result<R>>(&self, f: F) -> std::result::Result<Result<R>, F> {
        match self.inner.writer.try_lock() {
            Ok(mut conn) => Ok(f(&mut conn)),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Ok(f(&mut poisoned.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => Err(f),
        }
    }

    /// P9: a read of a few rows by key on the caller's thread (as [`SqliteStore::write_brief`]):
    /// on the writer when it is free, whose page cache its own commits keep current (each
    /// commit empties a pooled reader's, and a job's row read there fetched half a dozen pages
    /// again: a tenth of a pool's time a job); else on a free pooled reader; else on the pool.
    async fn read_brief<R: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        match self.inner.writer.try_lock() {
            Ok(conn) => return f(&conn),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => return f(&poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
        match self.read_if_free(f) {
            Ok(done) => done,
            Err(f) => self.read(f).await,
        }
    }

    /// `f` run on a pooled reader now, or handed back when none is free.
    fn read_if_free<R, F: FnOnce(&Connection) -> Result<R>>(&self, f: F) -> std::result::Result<Result<R>, F> {
        let inner = &self.inner;
        let Ok(_permit) = inner.reading.try_acquire() else { return Err(f) };
        let Some(conn) = inner.readers.lock().unwrap_or_else(PoisonError::into_inner).pop() else { return Err(f) };
        let out = f(&conn);
        inner.readers.lock().unwrap_or_else(PoisonError::into_inner).push(conn);
        Ok(out)
    }

    async fn read<R: Send + 'static>(&self, f: impl FnOnce(&Connection) -> Result<R> + Send + 'static) -> Result<R> {
        let inner = self.inner.clone();
        let permit = inner
            .reading
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| StoreError::Backend(format!("reader pool closed: {e}")))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let pooled = inner.readers.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let conn = match pooled {
                Some(c) => c,
                None => open_connection(&inner.path, false)?,
            };
            let out = f(&conn);
            let mut pool = inner.readers.lock().unwrap_or_else(PoisonError::into_inner);
            if pool.len() < READER_POOL {
                pool.push(conn);
            }
            out
        })
        .await
        .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
    }
}

/// P14: whether a copy writes `tab` with its rollback journal in memory and no syncs: every
/// tab after `kv`, whose rows, the copy's `unfinished` mark among them, are already in and
/// synced (a torn page cannot take the mark). The WAL would write every page twice. A copy
/// that stops is marked unfinished, which `serve` refuses and the operator deletes (a backup's
/// file is never named), so no page written then need survive a crash, and a failed statement
/// still rolls back in memory. Its file may be left damaged as well as unfinished.
fn unjournaled(tab: &str) -> bool {
    let at = |name: &str| transfer::TABS.iter().position(|(t, _)| *t == name);
    at(tab) > at("kv")
}

/// Out of WAL into a rollback journal in memory, with no syncs; left in WAL (its commits
/// unsynced, NORMAL) while another connection holds the file.
fn leave_wal(conn: &Connection) -> Result<()> {
    let mode: String = conn.pragma_query_value(None, "journal_mode", |r| r.get(0)).map_err(map_err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Ok(());
    }
    let held = |e: &rusqlite::Error| {
        matches!(e.sqlite_error_code(), Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked))
    };
    match conn.pragma_update_and_check(None, "journal_mode", "MEMORY", |r| r.get::<_, String>(0)) {
        Ok(mode) if mode.eq_ignore_ascii_case("memory") => {
            conn.pragma_update(None, "synchronous", "OFF").map_err(map_err)
        }
        Ok(_) => Ok(()),
        Err(e) if held(&e) => Ok(()),
        Err(e) => Err(map_err(e)),
    }
}

/// P14: one batch of a copy in a transaction of its own, on a writer whose triggers are off
/// (`bulk.rs` does their work).
fn import_batch(conn: &mut Connection, batch: &Batch) -> Result<()> {
    if unjournaled(batch.tab) {
        leave_wal(conn)?;
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
    bulk::insert(&tx, batch)?;
    tx.commit().map_err(map_err)
}

/// O3/E14: one batch of a copy or a restore, its rows as they are, in the caller's transaction.
fn insert_batch(tx: &Connection, batch: &Batch) -> Result<()> {
    for rows in batch.rows.chunks(ROWS_PER_INSERT) {
        let sql = match rows.len() {
            ROWS_PER_INSERT => full_insert(batch.tab),
            short => Cow::Owned(transfer::insert_many_sql(batch.tab, short, |i| format!("?{i}"))),
        };
        let mut insert = tx.prepare_cached(&sql).map_err(map_err)?;
        insert.execute(rusqlite::params_from_iter(rows.iter().flatten())).map_err(map_err)?;
    }
    Ok(())
}

/// P14: each tab's `INSERT` of a full chunk, written once a process, not once a batch (mail's
/// has 1,664 placeholders).
fn full_insert(tab: &str) -> Cow<'static, str> {
    static FULL: OnceLock<Vec<(&str, String)>> = OnceLock::new();
    let written = |tab: &str| transfer::insert_many_sql(tab, ROWS_PER_INSERT, |i| format!("?{i}"));
    let full = FULL.get_or_init(|| transfer::TABS.iter().map(|(t, _)| (*t, written(t))).collect());
    match full.iter().find(|(t, _)| *t == tab) {
        Some((_, sql)) => Cow::Borrowed(sql),
        None => Cow::Owned(written(tab)),
    }
}

/// P14: rows one `INSERT` of an import takes: a statement's own work (its cursors on the tab
/// and every index, its savepoint, which flushes the search index's pending terms) paid once
/// for these, within SQLite's 32,766 parameters at any tab's width.
const ROWS_PER_INSERT: usize = 64;

/// E14: a restore whose rows stopped coming before their end.
pub(crate) const INCOMPLETE: &str = "the rows to restore stopped before their end; the store was left as it was";

/// Sends the rows gathered so far; false once the export's reader has gone.
fn hand_over(out: &mpsc::Sender<Batch>, tab: &'static str, rows: &mut Vec<Vec<Cell>>) -> bool {
    let full = std::mem::replace(rows, Vec::with_capacity(transfer::BATCH));
    out.blocking_send(Batch { tab, rows: full }).is_ok()
}

fn select_mail(conn: &Connection, select: &MailSelect) -> Result<Vec<Mail>> {
    let mut out = Vec::new();
    let mut by_time = |filter: &str, order: &str, t: Ts, limit: usize| -> Result<()> {
        let sql = format!("SELECT {MAIL_COLUMNS} FROM mail WHERE {filter} ORDER BY {order} LIMIT ?2");
        let mut stmt = conn.prepare_cached(&sql).map_err(map_err)?;
        out.extend(collect(&mut stmt, params![ms(t), limit as i64], codec::mail)?);
        Ok(())
    };
    match select {
        MailSelect::Expiring { now, limit } => {
            by_time(&format!("{} AND expires_at <= ?1", predicates::open_mail()), "expires_at", *now, *limit)?;
        }
        MailSelect::Undelivered { created_before, limit } => {
            let filter = format!("{} AND created_at <= ?1", predicates::state_is(MailState::New));
            by_time(&filter, "created_at", *created_before, *limit)?;
        }
        MailSelect::OpenIntents { created_before, limit } => {
            by_time(
                &format!("{} AND created_at <= ?1", predicates::open_intents()),
                "created_at",
                *created_before,
                *limit,
            )?;
        }
        MailSelect::Unread { delivered_before, limit } => {
            let filter = format!("{} AND delivered_at <= ?1", predicates::state_is(MailState::Delivered));
            by_time(&filter, "delivered_at", *delivered_before, *limit)?;
        }
        MailSelect::Ids(ids) => {
            let mut stmt =
                conn.prepare_cached(&format!("SELECT {MAIL_COLUMNS} FROM mail WHERE id = ?1")).map_err(map_err)?;
            for id in ids {
                out.extend(collect(&mut stmt, [id], codec::mail)?);
            }
        }
        MailSelect::After { to, cursor, limit } => {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {MAIL_COLUMNS} FROM mail WHERE \"to\" = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
                ))
                .map_err(map_err)?;
            out.extend(collect(&mut stmt, params![to, cursor, *limit as i64], codec::mail)?);
        }
    }
    Ok(out)
}

fn apply_mail_writes(conn: &Connection, w: &MailWrites) -> Result<()> {
    let placeholders: Vec<String> = (1..=25).map(|i| format!("?{i}")).collect();
    let mut insert = conn
        .prepare_cached(&format!("INSERT INTO mail ({MAIL_INSERT_COLUMNS}) VALUES ({})", placeholders.join(", ")))
        .map_err(map_err)?;
    for m in &w.insert {
        let params = codec::mail_lifecycle(m).into_iter().chain(codec::mail_identity(m));
        insert.execute(rusqlite::params_from_iter(params)).map_err(map_err)?;
    }
    let mut update = conn
        .prepare_cached(
            "UPDATE mail SET state = ?2, expires_at = ?3, delivered_at = ?4, delivered_by = ?5, seen_at = ?6, \
             seen_by = ?7, done_at = ?8, result = ?9, fail_reason = ?10, presented_at = ?11, presented_session = ?12, \
             last_reminded_at = ?13 WHERE id = ?1",
        )
        .map_err(map_err)?;
    for m in &w.update {
        if update.execute(rusqlite::params_from_iter(codec::mail_lifecycle(m))).map_err(map_err)? != 1 {
            return Err(StoreError::Backend(format!("update of missing mail {}", m.id)));
        }
    }
    insert_events(conn, &w.events)?;
    upsert_alerts(conn, &w.alerts)?;
    if let Some(h) = &w.heartbeat {
        // The client of the latest poll wins, as its time does.
        conn.prepare_cached(
            "INSERT INTO machines (name, last_poll_at, client) VALUES (?1, ?2, ?3) \
             ON CONFLICT(name) DO UPDATE SET last_poll_at = MAX(last_poll_at, excluded.last_poll_at), \
             client = CASE WHEN excluded.last_poll_at >= last_poll_at THEN excluded.client ELSE client END",
        )
        .map_err(map_err)?
        .execute(params![h.machine, ms(h.at), h.client])
        .map_err(map_err)?;
    }
    Ok(())
}

fn upsert_alerts(conn: &Connection, alerts: &[Alert]) -> Result<()> {
    let mut stmt = conn
        .prepare_cached(&codec::upsert_sql("alerts", ALERT_COLUMNS, codec::ALERT_KEY, &[], &values(ALERT_COLUMNS)))
        .map_err(map_err)?;
    for a in alerts {
        let labels = json(&a.labels);
        stmt.execute(rusqlite::params_from_iter(codec::alert_params(a, &labels))).map_err(map_err)?;
    }
    Ok(())
}

fn select_ledger(conn: &Connection, project: &str, select: &LedgerSelect) -> Result<Vec<LedgerRow>> {
    let base = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE project = ?1");
    let collect = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Result<Vec<LedgerRow>> {
        collect(&mut conn.prepare_cached(sql).map_err(map_err)?, args, codec::ledger_row)
    };
    match select {
        LedgerSelect::All => collect(&format!("{base} ORDER BY seq"), &[&project]),
        LedgerSelect::Open => collect(&format!("{base} AND {} ORDER BY seq", predicates::open_rows()), &[&project]),
        LedgerSelect::RunRequested { limit } => {
            collect(&format!("{base} AND run_requested = 1 ORDER BY seq LIMIT ?2"), &[&project, &(*limit as i64)])
        }
        LedgerSelect::Ids(ids) => {
            let mut out = Vec::new();
            for id in ids {
                out.extend(collect(&format!("{base} AND id = ?2"), &[&project, id])?);
            }
            Ok(out)
        }
    }
}

fn apply_ledger_writes(conn: &Connection, project: &str, w: &LedgerWrites) -> Result<()> {
    let mut stmt = conn.prepare_cached(&LEDGER_UPSERT).map_err(map_err)?;
    for row in w.add.iter().chain(&w.replace) {
        stmt.execute(rusqlite::params_from_iter(codec::ledger_params(row))).map_err(map_err)?;
    }
    for p in &w.patch {
        let mut current = select_ledger(conn, project, &LedgerSelect::Ids(vec![p.id.clone()]))?;
        if let Some(row) = current.first_mut() {
            p.apply(row);
            stmt.execute(rusqlite::params_from_iter(codec::ledger_params(row))).map_err(map_err)?;
        }
    }
    for id in &w.delete {
        conn.execute("DELETE FROM ledger WHERE project = ?1 AND id = ?2", params![project, id]).map_err(map_err)?;
    }
    if let Some(next) = w.next_seq {
        conn.execute(
            "INSERT INTO ledger_projects (project, next_seq) VALUES (?1, ?2) \
             ON CONFLICT(project) DO UPDATE SET next_seq = MAX(next_seq, excluded.next_seq)",
            params![project, next],
        )
        .map_err(map_err)?;
    }
    insert_events(conn, &w.events)
}

fn select_jobs(conn: &Connection, select: &JobSelect) -> Result<Vec<Job>> {
    let collect = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Result<Vec<Job>> {
        collect(&mut conn.prepare_cached(sql).map_err(map_err)?, args, codec::job)
    };
    match select {
        // P10: an enqueue without unique keys asks for nothing, and its transaction reads nothing.
        JobSelect::Ids(ids) if ids.is_empty() => Ok(Vec::new()),
        JobSelect::Ids(ids) => {
            let mut stmt =
                conn.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1")).map_err(map_err)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                out.extend(rows::collect(&mut stmt, [id], codec::job)?);
            }
            Ok(out)
        }
        JobSelect::Unique(keys) => {
            let mut stmt = conn
                .prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE unique_key = ?1"))
                .map_err(map_err)?;
            let mut out = Vec::new();
            for key in keys {
                out.extend(rows::collect(&mut stmt, [key], codec::job)?);
            }
            Ok(out)
        }
        JobSelect::ExpiredLeases { now, limit } => collect(
            &format!(
                "SELECT {JOB_COLUMNS} FROM jobs WHERE {} AND lease_expires_at <= ?1 ORDER BY lease_expires_at LIMIT ?2",
                predicates::state_is(JobState::Running)
            ),
            &[&ms(*now), &(*limit as i64)],
        ),
    }
}

/// Columns a job keeps from its insert on: no plan changes them, and an upsert of a known id
/// leaves them alone.
/// A job listing's filters: queue `?1`, state `?2`, (T2) the machine `?3` that enqueued it or
/// holds its lease, and (U3) the cursor `?4`, older than that job; each when given. A cursor is
/// only a job the machine may see: any other answers an empty page, as an unknown one does.
const JOB_FILTER: &str = "(?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR state = ?2) \
    AND (?3 IS NULL OR enqueued_by = ?3 OR substr(lease_owner, 1, length(?3) + 1) = ?3 || '/') \
    AND (?4 IS NULL OR seq < (SELECT c.seq FROM jobs c WHERE c.id = ?4 \
        AND (?3 IS NULL OR c.enqueued_by = ?3 OR substr(c.lease_owner, 1, length(?3) + 1) = ?3 || '/'))) \
    AND (?5 IS NULL OR function = ?5)";

/// `VALUES (?1, …, ?n)` for a row of `columns`.
fn values(columns: &str) -> String {
    let placeholders: Vec<String> = (1..=codec::arity(columns)).map(|i| format!("?{i}")).collect();
    format!("VALUES ({})", placeholders.join(", "))
}

/// A job the transaction did not load: inserted, or (a row another path wrote meanwhile)
/// updated in every column but its identity.
static JOB_UPSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    codec::upsert_sql("jobs", JOB_COLUMNS, codec::JOB_KEY, codec::JOB_FIXED, &values(JOB_COLUMNS))
});

static LEDGER_UPSERT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    codec::upsert_sql("ledger", LEDGER_COLUMNS, codec::LEDGER_KEY, codec::LEDGER_FIXED, &values(LEDGER_COLUMNS))
});

/// Writes only the columns of `new` that differ from `old`, as loaded in this transaction: a
/// completion touches 4 columns and the indexes over them, not all 21 (P3).
fn update_changed(conn: &Connection, old: &Job, new: &Job) -> Result<()> {
    let (before, after) = (codec::job_params(old), codec::job_params(new));
    let changed: Vec<(&str, codec::Value)> = JOB_COLUMNS
        .split(", ")
        .zip(before.into_iter().zip(after))
        .filter(|(c, (b, a))| !codec::JOB_KEY.contains(c) && !codec::JOB_FIXED.contains(c) && b != a)
        .map(|(c, (_, a))| (c, a))
        .collect();
    if changed.is_empty() {
        return Ok(());
    }
    let sets: Vec<String> = changed.iter().enumerate().map(|(i, (c, _))| format!("{c} = ?{}", i + 1)).collect();
    let sql = format!("UPDATE jobs SET {} WHERE id = ?{}", sets.join(", "), changed.len() + 1);
    let mut params: Vec<codec::Value> = changed.into_iter().map(|(_, v)| v).collect();
    params.push(codec::Value::text(&new.id));
    conn.prepare_cached(&sql).and_then(|mut s| s.execute(rusqlite::params_from_iter(params))).map_err(map_err)?;
    Ok(())
}

fn query_alerts(conn: &Connection, filter: &str, order: &str, limit: usize) -> Result<Vec<Alert>> {
    let sql = format!("SELECT {ALERT_COLUMNS} FROM alerts WHERE {filter} ORDER BY {order} LIMIT ?1");
    collect(&mut conn.prepare_cached(&sql).map_err(map_err)?, [limit as i64], codec::alert)
}

fn insert_events(conn: &Connection, events: &[Event]) -> Result<()> {
    let mut stmt = conn
        .prepare_cached(&format!("INSERT INTO events ({EVENT_COLUMNS}) {}", values(EVENT_COLUMNS)))
        .map_err(map_err)?;
    for e in events {
        let object = e.object.to_string();
        stmt.execute(rusqlite::params_from_iter(codec::event_params(e, &object))).map_err(map_err)?;
    }
    Ok(())
}

impl Store for SqliteStore {
    async fn mail_transaction<R, F>(&self, select: MailSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Mail>) -> (MailWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let loaded = select_mail(&tx, &select)?;
            let (writes, out) = plan(loaded);
            if !writes.is_empty() {
                apply_mail_writes(&tx, &writes)?;
                tx.commit().map_err(map_err)?;
            }
            Ok(out)
        })
        .await
    }

    async fn select_mail(&self, select: MailSelect) -> Result<Vec<Mail>> {
        self.read(move |conn| select_mail(conn, &select)).await
    }

    async fn mail_counts(&self) -> Result<Vec<MailCount>> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT state, kind, channel, n FROM mail_counts WHERE n > 0 ORDER BY state, kind, channel",
                )
                .map_err(map_err)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get::<_, i64>(3)?)))
                .map_err(map_err)?;
            rows.map(|r| {
                let (state, kind, channel, n): (String, String, String, i64) = r.map_err(map_err)?;
                MailCount::from_row(&state, &kind, channel, n)
            })
            .collect()
        })
        .await
    }

    async fn get_mail(&self, id: &str) -> Result<Option<Mail>> {
        let id = id.to_string();
        self.read(move |conn| Ok(select_mail(conn, &MailSelect::Ids(vec![id]))?.pop())).await
    }

    async fn list_mail(&self, q: MailQuery) -> Result<Vec<Mail>> {
        self.read(move |conn| {
            let (filter, args) = crate::mail_where(&q, |n| format!("?{n}"), true);
            let sql =
                format!("SELECT {MAIL_COLUMNS} FROM mail WHERE {filter} ORDER BY seq DESC LIMIT {}", q.limit.max(1));
            let mut stmt = conn.prepare_cached(&sql).map_err(map_err)?;
            let Some(budget) = q.max_bytes else {
                return collect(&mut stmt, rusqlite::params_from_iter(args.iter()), codec::mail);
            };
            let mut rows = stmt.query(rusqlite::params_from_iter(args.iter())).map_err(map_err)?;
            let (mut page, mut used) = (Vec::new(), 0usize);
            while let Some(row) = rows.next().map_err(map_err)? {
                let mail = codec::mail(row)?;
                if !pcmail_core::page::fits(used, mail.text_bytes(), page.len(), budget) {
                    break;
                }
                used = used.saturating_add(mail.text_bytes());
                page.push(mail);
            }
            Ok(page)
        })
        .await
    }

    async fn count_mail(&self, q: MailQuery) -> Result<u64> {
        self.read(move |conn| {
            let (filter, args) = crate::mail_where(&q, |n| format!("?{n}"), false);
            let sql = format!("SELECT count(*) FROM mail WHERE {filter}");
            let n: i64 = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_row(rusqlite::params_from_iter(args.iter()), |r| r.get(0)))
                .map_err(map_err)?;
            Ok(n.max(0) as u64)
        })
        .await
    }

    async fn events_for(&self, object: &str) -> Result<Vec<Event>> {
        let object = object.to_string();
        self.read(move |conn| {
            let sql = format!("SELECT {EVENT_COLUMNS} FROM events WHERE object = ?1 ORDER BY id");
            collect(&mut conn.prepare_cached(&sql).map_err(map_err)?, [object], codec::event)
        })
        .await
    }

    async fn list_specs(&self) -> Result<Vec<SpecRecord>> {
        self.read(|conn| {
            let sql = format!("SELECT {SPEC_COLUMNS} FROM specs ORDER BY kind, name");
            collect(&mut conn.prepare_cached(&sql).map_err(map_err)?, [], codec::spec)
        })
        .await
    }

    async fn write_specs(&self, w: SpecWrites) -> Result<()> {
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            for r in &w.upsert {
                let (labels, spec, status) = codec::spec_params(r);
                tx.prepare_cached(&codec::upsert_sql(
                    "specs",
                    SPEC_COLUMNS,
                    codec::SPEC_KEY,
                    codec::SPEC_FIXED,
                    &values(SPEC_COLUMNS),
                ))
                .map_err(map_err)?
                .execute(params![
                    r.kind.as_str(),
                    r.name,
                    labels,
                    r.generation as i64,
                    spec,
                    status,
                    ms(r.created_at),
                    ms(r.updated_at)
                ])
                .map_err(map_err)?;
            }
            for (kind, name) in &w.delete {
                tx.execute("DELETE FROM specs WHERE kind = ?1 AND name = ?2", params![kind.as_str(), name])
                    .map_err(map_err)?;
            }
            insert_events(&tx, &w.events)?;
            tx.commit().map_err(map_err)
        })
        .await
    }

    async fn set_spec_status(&self, kind: Kind, name: &str, status: Status) -> Result<()> {
        let name = name.to_string();
        self.write(move |conn| {
            conn.execute(
                "UPDATE specs SET status = ?3 WHERE kind = ?1 AND name = ?2",
                params![kind.as_str(), name, json(&status)],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn put_token(&self, machine: &str, hash: &str, now: Ts) -> Result<()> {
        let (machine, hash) = (machine.to_string(), hash.to_string());
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO tokens (machine, hash, created_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT(machine) DO UPDATE SET hash = excluded.hash, created_at = excluded.created_at",
                params![machine, hash, ms(now)],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn machine_for_token(&self, hash: &str) -> Result<Option<String>> {
        let hash = hash.to_string();
        self.read(move |conn| {
            conn.prepare_cached("SELECT machine FROM tokens WHERE hash = ?1")
                .map_err(map_err)?
                .query_row([hash], |r| r.get(0))
                .optional()
                .map_err(map_err)
        })
        .await
    }

    async fn last_polls(&self) -> Result<Vec<(String, Ts)>> {
        self.read(|conn| {
            let mut stmt =
                conn.prepare_cached("SELECT name, last_poll_at FROM machines ORDER BY name").map_err(map_err)?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, from_ms(r.get(1)?)))).map_err(map_err)?;
            rows.map(|r| r.map_err(map_err)).collect()
        })
        .await
    }

    async fn machines_seen(&self) -> Result<Vec<MachineSeen>> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached("SELECT name, last_poll_at, client FROM machines ORDER BY name")
                .map_err(map_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok(MachineSeen { name: r.get(0)?, last_poll_at: from_ms(r.get(1)?), client: r.get(2)? })
                })
                .map_err(map_err)?;
            rows.map(|r| r.map_err(map_err)).collect()
        })
        .await
    }

    async fn ledger_transaction<R, F>(&self, project: &str, select: LedgerSelect, plan: F) -> Result<R>
    where
        F: FnOnce(LedgerState) -> (LedgerWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        let project = project.to_string();
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let rows = select_ledger(&tx, &project, &select)?;
            let next_seq: u32 = tx
                .query_row("SELECT next_seq FROM ledger_projects WHERE project = ?1", [&project], |r| r.get(0))
                .optional()
                .map_err(map_err)?
                .unwrap_or(1);
            let (writes, out) = plan(LedgerState { rows, next_seq });
            if writes != LedgerWrites::default() {
                apply_ledger_writes(&tx, &project, &writes)?;
                tx.commit().map_err(map_err)?;
            }
            Ok(out)
        })
        .await
    }

    async fn ledger_rows(&self, project: Option<&str>) -> Result<Vec<LedgerRow>> {
        let project = project.map(String::from);
        self.read(move |conn| {
            let sql = match project {
                Some(_) => format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE project = ?1 ORDER BY seq"),
                None => format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE ?1 IS NULL ORDER BY project, seq"),
            };
            collect(&mut conn.prepare_cached(&sql).map_err(map_err)?, [project], codec::ledger_row)
        })
        .await
    }

    async fn ledger_counts(&self) -> Result<Vec<StateCount<RowState>>> {
        self.group_counts("ledger", "SELECT project, state, count(*) FROM ledger GROUP BY project, state").await
    }

    async fn activity(&self, since: Ts, step: chrono::TimeDelta) -> Result<Vec<crate::Activity>> {
        self.read(move |conn| {
            let sql = crate::ACTIVITY_SQL
                .replace("{since}", "?1")
                .replace("{step}", "?2")
                .replace("{finished}", &crate::predicates::finished_jobs());
            let mut stmt = conn.prepare_cached(&sql).map_err(map_err)?;
            let step = step.num_milliseconds().max(1);
            let rows = stmt
                .query_map(params![ms(since), step], |r| {
                    Ok(crate::Activity {
                        series: r.get(0)?,
                        step: u32::try_from(r.get::<_, i64>(1)?).unwrap_or(u32::MAX),
                        count: r.get::<_, i64>(2)?.max(0) as u64,
                    })
                })
                .map_err(map_err)?;
            rows.map(|r| r.map_err(map_err)).collect()
        })
        .await
    }

    async fn ledger_projects(&self) -> Result<Vec<String>> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT project FROM ledger_projects UNION SELECT DISTINCT project FROM ledger ORDER BY 1",
                )
                .map_err(map_err)?;
            let rows = stmt.query_map([], |r| r.get(0)).map_err(map_err)?;
            rows.map(|r| r.map_err(map_err)).collect()
        })
        .await
    }

    async fn mail_last_seq(&self) -> Result<i64> {
        self.read(|conn| {
            conn.prepare_cached("SELECT coalesce(max(seq), 0) FROM mail")
                .map_err(map_err)?
                .query_row([], |r| r.get(0))
                .map_err(map_err)
        })
        .await
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.read(move |conn| {
            conn.query_row("SELECT value FROM kv WHERE key = ?1", [key], |r| r.get(0)).optional().map_err(map_err)
        })
        .await
    }

    async fn kv_set(&self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        self.write(move |conn| {
            conn.execute(
                "INSERT INTO kv (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map_err(map_err)?;
            Ok(())
        })
        .await
    }

    async fn claim_jobs(&self, claim: Claim) -> Result<Vec<Job>> {
        // Idle workers ask often: answer "nothing due" from a read, without a write transaction.
        let (queue, now) = (claim.queue.clone(), ms(claim.now));
        let due = self
            .read_brief(move |conn| {
                conn.prepare_cached(&format!(
                    "SELECT 1 FROM jobs WHERE {} AND queue = ?1 AND run_after <= ?2 LIMIT 1",
                    predicates::state_is(JobState::Queued)
                ))
                .map_err(map_err)?
                .exists(params![queue, now])
                .map_err(map_err)
            })
            .await?;
        if !due {
            return Ok(vec![]);
        }
        self.write_brief(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let jobs = {
                let mut stmt = tx
                    .prepare_cached(&format!(
                        "UPDATE jobs SET state = '{running}', attempts = attempts + 1, lease_owner = ?1, \
                         lease_token = ?2 || id, lease_expires_at = ?3, heartbeat_at = ?4 \
                         WHERE seq IN (SELECT seq FROM jobs WHERE state = '{queued}' AND queue = ?5 AND run_after <= ?4 \
                         ORDER BY priority DESC, run_after, seq LIMIT ?6) RETURNING {JOB_COLUMNS}",
                        running = JobState::Running,
                        queued = JobState::Queued,
                    ))
                    .map_err(map_err)?;
                let args = params![
                    claim.owner.to_string(),
                    claim.token_prefix,
                    ms(claim.lease_until),
                    ms(claim.now),
                    claim.queue,
                    claim.limit as i64
                ];
                collect(&mut stmt, args, codec::job)?
            };
            if !jobs.is_empty() {
                tx.commit().map_err(map_err)?;
            }
            Ok(jobs)
        })
        .await
    }

    async fn jobs_transaction<R, F>(&self, select: JobSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Job>) -> (Vec<Job>, R) + Send + 'static,
        R: Send + 'static,
    {
        let inner = self.inner.clone();
        // A rescue looks at every running job; any other selection is one request's jobs.
        let brief = !matches!(select, JobSelect::ExpiredLeases { .. });
        let work = move |conn: &mut Connection| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let loaded = match &select {
                // E13: every running job is looked at, and those whose lease stood unchanged for
                // its length on the monotonic clock are the expired ones (`now` is not asked).
                JobSelect::ExpiredLeases { limit, .. } => {
                    let running = collect(
                        &mut tx
                            .prepare_cached(&format!(
                                "SELECT {JOB_COLUMNS} FROM jobs WHERE {} ORDER BY lease_expires_at",
                                predicates::state_is(JobState::Running)
                            ))
                            .map_err(map_err)?,
                        [],
                        codec::job,
                    )?;
                    let mut seen = inner.seen.lock().unwrap_or_else(PoisonError::into_inner);
                    let (mut expired, kept) = expired_by_sight(running, std::mem::take(&mut seen.jobs), monotonic());
                    seen.jobs = kept;
                    expired.truncate(*limit);
                    expired
                }
                select => select_jobs(&tx, select)?,
            };
            let before: std::collections::HashMap<String, Job> =
                loaded.iter().map(|j| (j.id.clone(), j.clone())).collect();
            let (writes, out) = plan(loaded);
            if !writes.is_empty() {
                for j in &writes {
                    match before.get(&j.id) {
                        Some(old) => update_changed(&tx, old, j)?,
                        None => tx
                            .prepare_cached(&JOB_UPSERT)
                            .and_then(|mut s| s.execute(rusqlite::params_from_iter(codec::job_params(j))))
                            .map(drop)
                            .map_err(map_err)?,
                    }
                }
                tx.commit().map_err(map_err)?;
            }
            Ok(out)
        };
        if brief { self.write_brief(work).await } else { self.write(work).await }
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>> {
        let id = id.to_string();
        self.read_brief(move |conn| Ok(select_jobs(conn, &JobSelect::Ids(vec![id]))?.pop())).await
    }

    async fn list_jobs(&self, q: JobQuery) -> Result<Vec<Job>> {
        self.read(move |conn| {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT {JOB_COLUMNS} FROM jobs WHERE {JOB_FILTER} ORDER BY seq DESC LIMIT ?6"
                ))
                .map_err(map_err)?;
            let params = params![q.queue, q.state, q.machine, q.after, q.function, q.limit as i64];
            collect(&mut stmt, params, codec::job)
        })
        .await
    }

    async fn deliveries(&self, since: Ts) -> Result<Vec<(Ts, i64)>> {
        self.read(move |conn| {
            let sql = crate::DELIVERIES_SQL.replace("{since}", "?1");
            let mut stmt = conn.prepare_cached(&sql).map_err(map_err)?;
            let rows = stmt.query_map([ms(since)], |r| Ok((from_ms(r.get(0)?), r.get(1)?))).map_err(map_err)?;
            rows.map(|r| r.map_err(map_err)).collect()
        })
        .await
    }

    async fn search(&self, search: crate::Search) -> Result<crate::Found> {
        let started = std::time::Instant::now();
        let asker = Arc::new(search::Asker::default());
        let _hang_up = search::HangUp(asker.clone());
        self.read(move |conn| {
            asker.attach(conn);
            let found = search::run(conn, &search, &asker, started);
            asker.release();
            found
        })
        .await
    }

    async fn index_search(&self, batch: i64) -> Result<crate::IndexBehind> {
        self.write(move |conn| search::index_batch(conn, batch)).await
    }

    async fn count_jobs(&self, q: JobQuery) -> Result<u64> {
        self.read(move |conn| {
            let sql = format!("SELECT count(*) FROM jobs WHERE {JOB_FILTER}");
            let n: i64 = conn
                .prepare_cached(&sql)
                .and_then(|mut s| s.query_row(params![q.queue, q.state, q.machine, q.after, q.function], |r| r.get(0)))
                .map_err(map_err)?;
            Ok(n.max(0) as u64)
        })
        .await
    }

    async fn job_counts(&self) -> Result<Vec<StateCount<JobState>>> {
        self.group_counts("jobs", "SELECT queue, state, count(*) FROM jobs GROUP BY queue, state").await
    }

    async fn prune(&self, what: Prune, limit: usize) -> Result<usize> {
        self.write(move |conn| {
            let limit = limit as i64;
            let (sql, args): (String, Vec<rusqlite::types::Value>) = match what {
                Prune::ClosedMail { before } => (
                    format!(
                        "DELETE FROM mail WHERE seq IN (SELECT seq FROM mail WHERE {} \
                         AND coalesce(done_at, expires_at) < ?1 ORDER BY coalesce(done_at, expires_at) LIMIT ?2)",
                        predicates::closed_mail()
                    ),
                    vec![ms(before).into(), limit.into()],
                ),
                Prune::FinishedJobs { queue: Some(queue), before } => (
                    format!(
                        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE queue = ?1 \
                         AND {} AND finished_at < ?2 ORDER BY finished_at LIMIT ?3)",
                        predicates::finished_jobs()
                    ),
                    vec![queue.into(), ms(before).into(), limit.into()],
                ),
                Prune::FinishedJobs { queue: None, before } => (
                    format!(
                        "DELETE FROM jobs WHERE seq IN (SELECT seq FROM jobs WHERE {} \
                         AND finished_at < ?1 ORDER BY finished_at LIMIT ?2)",
                        predicates::finished_jobs()
                    ),
                    vec![ms(before).into(), limit.into()],
                ),
                Prune::Events { before } => (
                    "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE at < ?1 ORDER BY at LIMIT ?2)".into(),
                    vec![ms(before).into(), limit.into()],
                ),
                Prune::SettledAlerts { before } => (
                    format!(
                        "DELETE FROM alerts WHERE rowid IN (SELECT rowid FROM alerts WHERE {} \
                         AND notified = state AND updated_at < ?1 LIMIT ?2)",
                        predicates::settled_alerts()
                    ),
                    vec![ms(before).into(), limit.into()],
                ),
            };
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let n =
                tx.prepare_cached(&sql).map_err(map_err)?.execute(rusqlite::params_from_iter(args)).map_err(map_err)?;
            tx.commit().map_err(map_err)?;
            Ok(n)
        })
        .await
    }

    async fn export_tabs(&self, out: mpsc::Sender<Batch>) -> Result<()> {
        self.read(move |conn| {
            // One read transaction: every tab from the same WAL snapshot while writers go on.
            let tx = conn.unchecked_transaction().map_err(map_err)?;
            for (tab, order) in transfer::TABS {
                let names = transfer::columns(tab);
                let mut stmt = tx.prepare(&transfer::select_sql(tab, order)).map_err(map_err)?;
                let mut found = stmt.query([]).map_err(map_err)?;
                let mut batch = Vec::with_capacity(transfer::BATCH);
                while let Some(row) = found.next().map_err(map_err)? {
                    // P14: a plain loop; a `collect` into `Result<Vec<_>>` was a fifth of a
                    // copy's reading thread, which a copy into PostgreSQL waits on.
                    let mut cells = Vec::with_capacity(names.len());
                    for (i, name) in names.iter().enumerate() {
                        cells.push(rows::cell(row.get_ref(i).map_err(map_err)?, tab, name)?);
                    }
                    batch.push(cells);
                    if batch.len() == transfer::BATCH && !hand_over(&out, tab, &mut batch) {
                        return Ok(());
                    }
                }
                if !batch.is_empty() && !hand_over(&out, tab, &mut batch) {
                    return Ok(());
                }
            }
            Ok(())
        })
        .await
    }

    async fn import_rows(&self, batch: Batch) -> Result<()> {
        self.write(move |conn| bulk::without_triggers(conn, |conn| import_batch(conn, &batch))).await
    }

    async fn import_stream(&self, mut rows: mpsc::Receiver<Incoming>) -> Result<()> {
        // P14: the writer held for the whole stream, its triggers off once (`bulk.rs`); each
        // batch still commits on its own.
        self.write(move |conn| {
            bulk::without_triggers(conn, |conn| {
                loop {
                    match rows.blocking_recv() {
                        Some(Incoming::Rows(batch)) => import_batch(conn, &batch)?,
                        Some(Incoming::End) => return Ok(()),
                        None => return Err(StoreError::Backend(crate::cells::COPY_INCOMPLETE.into())),
                    }
                }
            })
        })
        .await
    }

    async fn import_started(&self) -> Result<()> {
        // P14: the commits skip their WAL syncs until `import_finished` (a checkpoint still
        // syncs the file before the WAL is reused), and statement journals (the pages one
        // multi-row INSERT changed, kept to undo it alone) stay in memory, not in a temporary
        // file a statement. No reader of ours may hold the file open when it leaves WAL.
        self.inner.readers.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.write(|conn| {
            conn.pragma_update(None, "temp_store", "MEMORY").map_err(map_err)?;
            conn.pragma_update(None, "synchronous", "NORMAL").map_err(map_err)
        })
        .await
    }

    async fn import_finished(&self) -> Result<()> {
        // FULL again. Out of WAL, the switch back commits page 1's version bytes under the
        // rollback journal, and that commit syncs the file (every page the import wrote with
        // it) before the copy's `finished` mark is written; still in WAL, the mark's own commit
        // syncs the log.
        self.write(|conn| {
            conn.pragma_update(None, "synchronous", "FULL").map_err(map_err)?;
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)).map_err(map_err)?;
            if !mode.eq_ignore_ascii_case("wal") {
                return Err(StoreError::Backend(format!("the copy's target stayed in journal mode {mode}, not WAL")));
            }
            conn.pragma_update(None, "temp_store", "DEFAULT").map_err(map_err)
        })
        .await
    }

    async fn replace_tabs(&self, mut rows: mpsc::Receiver<Incoming>) -> Result<()> {
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            for sql in transfer::clear_sql() {
                tx.execute(&sql, []).map_err(map_err)?;
            }
            tx.execute("UPDATE kv SET value = lower(hex(randomblob(16))) WHERE key = ?1", [crate::IDENTITY_KEY])
                .map_err(map_err)?;
            // Dropping `tx` without a commit rolls every change back.
            loop {
                match rows.blocking_recv() {
                    Some(Incoming::Rows(batch)) => insert_batch(&tx, &batch)?,
                    Some(Incoming::End) => return tx.commit().map_err(map_err),
                    None => return Err(StoreError::Backend(INCOMPLETE.into())),
                }
            }
        })
        .await
    }

    async fn occupied_tabs(&self) -> Result<Vec<&'static str>> {
        self.read(|conn| {
            let flags: Vec<bool> = conn
                .query_row(&transfer::occupied_sql(), [], |r| (0..transfer::TABS.len()).map(|i| r.get(i)).collect())
                .map_err(map_err)?;
            Ok(transfer::occupied(&flags))
        })
        .await
    }

    async fn firing_alerts(&self) -> Result<Vec<Alert>> {
        self.alerts(&predicates::state_is(AlertState::Firing), "kind, subject", usize::MAX >> 1).await
    }

    async fn alerts_to_notify(&self, limit: usize) -> Result<Vec<Alert>> {
        self.alerts("notified IS NOT state", "updated_at, kind, subject", limit).await
    }

    async fn list_alerts(&self, limit: usize) -> Result<Vec<Alert>> {
        self.alerts("1 = 1", "updated_at DESC, kind, subject", limit).await
    }

    async fn write_alerts(&self, alerts: Vec<Alert>) -> Result<()> {
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            upsert_alerts(&tx, &alerts)?;
            tx.commit().map_err(map_err)
        })
        .await
    }

    async fn lease_transaction<R, F>(&self, name: &str, plan: F) -> Result<R>
    where
        F: FnOnce(Option<Lease>, Ts) -> (Option<Lease>, R) + Send + 'static,
        R: Send + 'static,
    {
        let name = name.to_string();
        let inner = self.inner.clone();
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            let sql = format!("SELECT {LEASE_COLUMNS} FROM leases WHERE name = ?1");
            let current = collect(&mut tx.prepare_cached(&sql).map_err(map_err)?, [&name], codec::lease)?.pop();
            let now = crate::store_clock();
            // E13: the lease as the monotonic clock judges it, whatever the wall clock stamped.
            let current = {
                let mut seen = inner.seen.lock().unwrap_or_else(PoisonError::into_inner);
                let (judged, sighting) = as_seen(current, seen.leases.remove(&name), now, monotonic());
                if let Some(sighting) = sighting {
                    seen.leases.insert(name.clone(), sighting);
                }
                judged
            };
            let (write, out) = plan(current, now);
            if let Some(lease) = write {
                tx.prepare_cached(&codec::upsert_sql(
                    "leases",
                    LEASE_COLUMNS,
                    codec::LEASE_KEY,
                    &[],
                    &values(LEASE_COLUMNS),
                ))
                .map_err(map_err)?
                .execute(rusqlite::params_from_iter(codec::lease_params(&lease)))
                .map_err(map_err)?;
                tx.commit().map_err(map_err)?;
            }
            Ok(out)
        })
        .await
    }

    async fn mark_notified(&self, sent: Vec<Alert>, at: Ts) -> Result<()> {
        self.write(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
            {
                let mut stmt = tx
                    .prepare_cached(
                        "UPDATE alerts SET notified = state, last_sent_at = ?1 \
                         WHERE kind = ?2 AND subject = ?3 AND state = ?4 AND updated_at = ?5",
                    )
                    .map_err(map_err)?;
                for a in &sent {
                    stmt.execute(params![ms(at), a.kind.as_str(), a.subject, a.state.as_str(), ms(a.updated_at)])
                        .map_err(map_err)?;
                }
            }
            tx.commit().map_err(map_err)
        })
        .await
    }
}

impl SqliteStore {
    /// `(group, state, count)` rows of a `GROUP BY` query over `tab`, for the gauges.
    async fn group_counts<S>(&self, tab: &'static str, sql: &'static str) -> Result<Vec<StateCount<S>>>
    where
        S: std::str::FromStr<Err = pcmail_core::names::UnknownName> + Send + 'static,
    {
        self.read(move |conn| {
            let mut stmt = conn.prepare_cached(sql).map_err(map_err)?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?)))
                .map_err(map_err)?;
            rows.map(|r| {
                let (group, state, n) = r.map_err(map_err)?;
                StateCount::parse(tab, group, &state, n)
            })
            .collect()
        })
        .await
    }

    async fn alerts(&self, filter: &str, order: &'static str, limit: usize) -> Result<Vec<Alert>> {
        let filter = filter.to_string();
        self.read(move |conn| query_alerts(conn, &filter, order, limit)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn fresh() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(dir.path().join("pcmail.db")).await.expect("open");
        (dir, store)
    }

    crate::contract::contract_tests!(fresh);

    /// Every statement `conn` holds prepared, with how often SQLite prepared it again since (a
    /// bound value that the planner weighed expires a statement at each new binding).
    fn statements(conn: &Connection) -> Vec<(String, i32)> {
        let mut found = Vec::new();
        // SAFETY: the connection is held (its lock) for the whole walk; each statement is only
        // read, and sqlite3_sql's text is copied before the next call.
        unsafe {
            let db = conn.handle();
            let mut stmt = rusqlite::ffi::sqlite3_next_stmt(db, std::ptr::null_mut());
            while !stmt.is_null() {
                let again = rusqlite::ffi::sqlite3_stmt_status(stmt, rusqlite::ffi::SQLITE_STMTSTATUS_REPREPARE, 0);
                let sql = std::ffi::CStr::from_ptr(rusqlite::ffi::sqlite3_sql(stmt)).to_string_lossy().into_owned();
                found.push((sql, again));
                stmt = rusqlite::ffi::sqlite3_next_stmt(db, stmt);
            }
        }
        found
    }

    #[tokio::test]
    async fn p9_p2_the_job_path_and_the_mail_sweep_run_their_statements_as_first_prepared() {
        let (_dir, store) = fresh().await;
        let now = chrono::Utc::now();
        let jobs: Vec<Job> =
            (0..40).map(|i| Job::new(format!("job-{i}"), "q".into(), "f".into(), "{}".into(), now)).collect();
        store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await.expect("enqueue");
        for round in 0..8 {
            let claim = Claim {
                queue: "q".into(),
                limit: 3,
                owner: pcmail_core::jobs::LeaseOwner::Pool { worker: format!("w{round}"), ahead: true },
                token_prefix: format!("t{round}-"),
                now: now + chrono::Duration::milliseconds(round),
                lease_until: now + chrono::Duration::seconds(60 + round),
            };
            let claimed = store.claim_jobs(claim).await.expect("claim");
            assert_eq!(claimed.len(), 3, "round {round}");
            let ids: Vec<String> = claimed.iter().map(|j| j.id.clone()).collect();
            for id in &ids {
                assert!(store.get_job(id).await.expect("read").is_some());
            }
            let finished = now + chrono::Duration::seconds(round);
            store
                .jobs_transaction(JobSelect::Ids(ids), move |found| {
                    let done = found
                        .into_iter()
                        .map(|j| Job { state: JobState::Succeeded, finished_at: Some(finished), ..j })
                        .collect();
                    (done, ())
                })
                .await
                .expect("record");
        }
        // The sweep's selections and an inbox read, each with its own limit at every run: in
        // a writing transaction (the writer) and as the sweep's probes and a poll read them (a
        // reader); and a job listing's page.
        for limit in 1..4 {
            let at = now + chrono::Duration::seconds(limit as i64);
            for select in [
                MailSelect::Expiring { now: at, limit },
                MailSelect::Undelivered { created_before: at, limit },
                MailSelect::Unread { delivered_before: at, limit },
                MailSelect::OpenIntents { created_before: at, limit },
                MailSelect::After { to: "pc-1".into(), cursor: limit as i64, limit },
            ] {
                store.select_mail(select.clone()).await.expect("read");
                store.mail_transaction(select, |_| (MailWrites::default(), ())).await.expect("select");
            }
            store.list_jobs(JobQuery { limit, ..Default::default() }).await.expect("list");
        }
        let writer = statements(&store.inner.writer.lock().unwrap_or_else(PoisonError::into_inner));
        let readers: Vec<(String, i32)> =
            store.inner.readers.lock().unwrap_or_else(PoisonError::into_inner).iter().flat_map(statements).collect();
        // Nothing passes for want of statements: the claim and the limited reads are there.
        assert!(writer.iter().any(|(sql, _)| sql.contains("UPDATE jobs SET state = 'running'")), "{writer:?}");
        assert!(writer.iter().filter(|(sql, _)| sql.contains("FROM mail") && sql.contains("LIMIT ?")).count() >= 5);
        assert!(readers.iter().filter(|(sql, _)| sql.contains("LIMIT ?")).count() >= 6, "{readers:?}");
        let again =
            |all: &[(String, i32)]| -> Vec<(String, i32)> { all.iter().filter(|(_, n)| *n > 0).cloned().collect() };
        assert_eq!(again(&writer), vec![], "the writer's statements");
        assert_eq!(again(&readers), vec![], "the readers' statements");
    }

    /// The writes of each tab with a partial index (every column inserted; every column but the
    /// key updated) whose program builds a temporary b-tree, by tab and statement.
    fn writes_building_a_temporary_table(conn: &Connection) -> Vec<String> {
        let names = |sql: &str| -> Vec<String> {
            let mut stmt = conn.prepare(sql).expect("prepare");
            stmt.query_map([], |r| r.get(0)).expect("query").collect::<rusqlite::Result<_>>().expect("rows")
        };
        let tabs = names("SELECT DISTINCT tbl_name FROM sqlite_master WHERE type = 'index' AND sql LIKE '%WHERE%'");
        assert!(tabs.len() >= 3, "mail, jobs and ledger have partial indexes: {tabs:?}");
        let mut found = Vec::new();
        for tab in tabs {
            let columns = names(&format!("SELECT name FROM pragma_table_info('{tab}') WHERE pk = 0"));
            let quoted: Vec<String> = columns.iter().map(|c| format!("\"{c}\"")).collect();
            let values = vec!["?"; quoted.len()].join(", ");
            let sets: Vec<String> = quoted.iter().map(|c| format!("{c} = ?")).collect();
            for (write, sql) in [
                (format!("INSERT INTO {tab}"), format!("INSERT INTO {tab} ({}) VALUES ({values})", quoted.join(", "))),
                (format!("UPDATE {tab}"), format!("UPDATE {tab} SET {} WHERE rowid = ?", sets.join(", "))),
            ] {
                if explained(conn, &format!("EXPLAIN {sql}"), 1).iter().any(|op| op == "OpenEphemeral") {
                    found.push(write);
                }
            }
        }
        found
    }

    /// Column `column` of each row `explain` (an `EXPLAIN …` statement, unbound: it only lists
    /// the program or the plan) answers.
    fn explained(conn: &Connection, explain: &str, column: usize) -> Vec<String> {
        let mut stmt = conn.prepare(explain).expect("explain");
        let mut rows = stmt.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next().expect("row") {
            out.push(row.get::<_, String>(column).expect("text"));
        }
        out
    }

    #[tokio::test]
    async fn p2_no_write_of_a_tab_builds_a_temporary_table_to_test_a_partial_index() {
        let (_dir, store) = fresh().await;
        let writer = store.inner.writer.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(writes_building_a_temporary_table(&writer), Vec::<String>::new());
        drop(writer);
        // Before migration 12 the state sets were IN lists, each a temporary b-tree a statement.
        let dir = tempfile::tempdir().expect("tempdir");
        let earlier = dir.path().join("schema-11.db");
        schema::create_at(&earlier, 11).expect("schema 11");
        let built = writes_building_a_temporary_table(&Connection::open(&earlier).expect("open"));
        for write in [
            "INSERT INTO mail",
            "UPDATE mail",
            "INSERT INTO jobs",
            "UPDATE jobs",
            "INSERT INTO ledger",
            "UPDATE ledger",
        ] {
            assert!(built.iter().any(|w| w == write), "{write} in {built:?}");
        }
    }

    #[tokio::test]
    async fn p2_r3_the_sweeps_and_retentions_state_filters_are_found_through_their_partial_indexes() {
        let (_dir, store) = fresh().await;
        let now = chrono::Utc::now();
        for select in [
            MailSelect::Expiring { now, limit: 10 },
            MailSelect::Undelivered { created_before: now, limit: 10 },
            MailSelect::Unread { delivered_before: now, limit: 10 },
            MailSelect::OpenIntents { created_before: now, limit: 10 },
        ] {
            store.mail_transaction(select, |_| (MailWrites::default(), ())).await.expect("select");
        }
        for what in [
            Prune::ClosedMail { before: now },
            Prune::FinishedJobs { queue: Some("q".into()), before: now },
            Prune::FinishedJobs { queue: None, before: now },
        ] {
            store.prune(what, 10).await.expect("prune");
        }
        store.activity(now, chrono::TimeDelta::minutes(1)).await.expect("activity");
        let writer = store.inner.writer.lock().unwrap_or_else(PoisonError::into_inner);
        select_ledger(&writer, "p", &LedgerSelect::Open).expect("open rows");
        let mut ran = statements(&writer);
        ran.extend(store.inner.readers.lock().unwrap_or_else(PoisonError::into_inner).iter().flat_map(statements));
        // Each filter, by a piece of its text, and the index its plan must search.
        let expected = [
            ("WHERE (state = 'new' OR state = 'delivered' OR state = 'seen') AND expires_at", "mail_open_expiry"),
            ("WHERE state = 'new' AND created_at", "mail_new_created"),
            ("WHERE state = 'delivered' AND delivered_at", "mail_delivered_at"),
            ("WHERE kind = 'intent' AND (state = 'new'", "mail_open_intents"),
            ("FROM mail WHERE (state = 'done' OR", "mail_closed"),
            ("FROM jobs WHERE queue = ?1 AND (state = 'succeeded' OR", "jobs_finished"),
            ("FROM jobs WHERE (state = 'succeeded' OR", "jobs_finished_at"),
            ("FROM jobs WHERE finished_at >= ?1 AND (state = 'succeeded' OR", "jobs_finished_at"),
            ("FROM ledger WHERE project = ?1 AND (state = 'todo' OR", "ledger_open"),
        ];
        for (filter, index) in expected {
            let (sql, _) = ran.iter().find(|(sql, _)| sql.contains(filter)).unwrap_or_else(|| panic!("{filter} ran"));
            let plan = explained(&writer, &format!("EXPLAIN QUERY PLAN {sql}"), 3);
            assert!(plan.iter().any(|step| step.contains(&format!("INDEX {index} "))), "{index} for {sql}: {plan:?}");
        }
    }

    #[tokio::test]
    async fn p10_one_requests_jobs_are_written_on_the_callers_thread_when_the_writer_is_free_and_wait_their_turn_when_not()
     {
        let (_dir, store) = fresh().await;
        let job = |n: u32| Job::new(format!("job-{n}"), "q".into(), "f".into(), "null".into(), Ts::default());
        let written_on = |store: &SqliteStore, n: u32| {
            let store = store.clone();
            async move {
                let plan = move |_| (vec![job(n)], std::thread::current().id());
                store.jobs_transaction(JobSelect::Ids(vec![]), plan).await.expect("enqueue")
            }
        };
        let here = std::thread::current().id();
        assert_eq!(written_on(&store, 1).await, here, "a free writer takes the write at once");

        // Another write holds the writer: this one waits for it on the blocking pool.
        let (held, release) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let holder = {
            let store = store.clone();
            std::thread::spawn(move || {
                let _writer = store.inner.writer.lock().expect("writer");
                held.0.send(()).expect("told");
                let _ = release.1.recv();
            })
        };
        held.1.recv().expect("the writer is held");
        let waiting = tokio::spawn(written_on(&store, 2));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the write waits while the writer is held");
        release.0.send(()).expect("released");
        let on = waiting.await.expect("the waiting write");
        assert_ne!(on, here, "it ran on the pool, not on a runtime thread");
        holder.join().expect("holder");
        let stored =
            store.jobs_transaction(JobSelect::Ids(vec!["job-1".into(), "job-2".into()]), |found| (vec![], found));
        assert_eq!(stored.await.expect("read back").len(), 2, "both writes committed");
    }

    #[test]
    fn p14_the_two_halves_of_a_digest_read_every_tab_once_and_split_the_mail_by_seq() {
        for (at, (tab, order)) in transfer::TABS.iter().enumerate() {
            let [first, second] = [true, false].map(|first| Share::Half { first, mail_upto: 7 }.select(at, tab, order));
            if *tab == "mail" {
                assert!(first.expect("first half").contains("WHERE seq <= 7 ORDER BY seq"));
                assert!(second.expect("second half").contains("WHERE seq > 7 ORDER BY seq"));
            } else {
                assert!(first.is_some() != second.is_some(), "{tab} is read by one half");
            }
        }
    }

    #[tokio::test]
    async fn p14_a_digest_in_halves_sums_as_one_reader_with_no_mail_one_mail_and_seqs_at_the_ends() {
        let (dir, store) = fresh().await;
        let mut seen = Vec::new();
        for (n, seqs) in [vec![], vec![7], vec![i64::MAX - 1, i64::MAX], vec![-5, 0, i64::MAX]].into_iter().enumerate()
        {
            let mails: Vec<Mail> = (0..seqs.len())
                .map(|i| Mail::new(format!("mail-{n}-{i}"), "pc1".into(), "pc2".into(), Ts::default(), Ts::default()))
                .collect();
            let plan = move |_| (MailWrites { insert: mails, ..Default::default() }, ());
            store.mail_transaction(MailSelect::Ids(vec![]), plan).await.expect("insert");
            let path = dir.path().join(format!("copy-{n}.db"));
            store.back_up_pages(path.clone()).await.expect("page copy");
            // The copy's mail alone, at the seqs asked for.
            let raw = Connection::open(&path).expect("open the copy");
            raw.execute("DELETE FROM mail WHERE id NOT LIKE ?1", [format!("mail-{n}-%")])
                .expect("only this copy's mail");
            for (i, seq) in seqs.iter().enumerate() {
                raw.execute("UPDATE mail SET seq = ?1 WHERE id = ?2", rusqlite::params![seq, format!("mail-{n}-{i}")])
                    .expect("seq");
            }
            drop(raw);
            let copy = SqliteStore::open_read_only(&path).await.expect("open the copy");
            let (mut one, mut two) = (0, 0);
            let whole = copy.digest_in_place(&mut |_, rows| one += rows).await.expect("one reader");
            let halves = copy.digest_unwritten(&mut |_, rows| two += rows).await.expect("two halves");
            assert_eq!(halves, whole, "mail at {seqs:?}");
            assert_eq!((two, whole.iter().find(|d| d.tab == "mail").map(|d| d.rows)), (one, Some(seqs.len() as u64)));
            seen.push(whole);
        }
        assert_ne!(seen[1], seen[2], "the copies differ, so equal digests are not all alike");
    }

    #[tokio::test]
    async fn p14_e5_a_page_copy_holds_every_row_as_its_own_store_and_leaves_the_sources_keys() {
        let (dir, store) = fresh().await;
        let mails: Vec<Mail> = (1..=300)
            .map(|n| Mail {
                subject: format!("件名 {n} 番"),
                ..Mail::new(format!("mail--{n:08x}"), "pc1".into(), "pc2".into(), Ts::default(), Ts::default())
            })
            .collect();
        let plan = move |_| (MailWrites { insert: mails, ..Default::default() }, ());
        store.mail_transaction(MailSelect::Ids(vec![]), plan).await.expect("insert");
        for (key, value) in [("telegram/offset", "7"), ("Store/kept", "a key of the data"), ("sheets/rev", "9")] {
            store.kv_set(key, value).await.expect("kv");
        }
        store.kv_set(transfer::COPY_KEY, "unfinished").await.expect("a mark of the source's own");
        let path = dir.path().join("backup.db");
        store.back_up_pages(path.clone()).await.expect("page copy");

        assert!(!dir.path().join("backup.db-wal").exists() && !dir.path().join("backup.db-journal").exists());
        let copy = SqliteStore::open_read_only(&path).await.expect("the copy is a current store");
        let sums = transfer::digest(&store).await.expect("digest");
        assert_eq!(transfer::digest(&copy).await.expect("digest"), sums);
        let mut told = 0;
        let in_place = copy.digest_in_place(&mut |_, rows| told += rows).await.expect("digest in place");
        assert_eq!(in_place, sums, "read in place, the sums are the export's");
        assert_eq!(told, sums.iter().map(|d| d.rows).sum::<u64>(), "every row summed is told");
        let mut halves_told = 0;
        let halves = copy.digest_unwritten(&mut |_, rows| halves_told += rows).await.expect("digest in halves");
        assert_eq!(halves, sums, "read in two halves at once, the same sums");
        assert_eq!(halves_told, told, "every row summed once, and told");
        let identity = copy.kv_get(crate::IDENTITY_KEY).await.expect("kv").expect("an identity of its own");
        assert_ne!(Some(identity), store.kv_get(crate::IDENTITY_KEY).await.expect("kv"), "E5");
        assert_eq!(copy.kv_get(transfer::COPY_KEY).await.expect("kv").as_deref(), Some("finished"));
        assert_eq!(copy.kv_get("sheets/rev").await.expect("kv"), None);
        assert_eq!(copy.kv_get("Store/kept").await.expect("kv").as_deref(), Some("a key of the data"));
        let search = crate::Search { text: "件名 29 番".into(), mail: true, limit: 10, ..Default::default() };
        assert_eq!(copy.search(search).await.expect("search").mail.len(), 1, "its search index came along");
    }

    #[tokio::test]
    async fn r1_a_count_of_a_state_this_build_does_not_know_fails_naming_it() {
        let (dir, store) = fresh().await;
        let job = Job::new("job-1".into(), "q".into(), "f".into(), "{}".into(), chrono::Utc::now());
        store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (vec![job], ())).await.expect("enqueue");
        let raw = Connection::open(dir.path().join("pcmail.db")).expect("raw open");
        raw.execute_batch("UPDATE jobs SET state = 'paused'").expect("a newer build's state");
        drop(raw);
        let err = store.job_counts().await.expect_err("an unknown state is not counted away");
        assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
        assert!(err.to_string().contains(r#"jobs of "q": unknown job state "paused""#), "{err}");
    }

    #[tokio::test]
    async fn i6_missing_column_fails_closed_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pcmail.db");
        drop(SqliteStore::open(&path).await.expect("open"));
        let conn = Connection::open(&path).expect("raw open");
        conn.execute_batch("ALTER TABLE mail DROP COLUMN presented_session").expect("drop column");
        drop(conn);
        let err = SqliteStore::open(&path).await.err().expect("must refuse");
        assert!(err.to_string().contains("mail.presented_session is missing"), "{err}");
    }

    #[tokio::test]
    async fn i6_v5_a_newer_schema_that_only_adds_is_used_any_other_refused_naming_both_versions() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pcmail.db");
        drop(SqliteStore::open(&path).await.expect("open"));
        let known = schema::MIGRATIONS.len();
        let raw = Connection::open(&path).expect("raw");
        raw.pragma_update(None, "user_version", 99).expect("bump");
        // A next release's store whose migrations after this build's only add: used as it is.
        raw.execute("UPDATE pcmail_schema SET readable_by = ?1", [known as i64]).expect("readable");
        drop(SqliteStore::open(&path).await.expect("newer by migrations that add"));
        assert_eq!(schema::versions_at(&path).expect("versions"), (99, known), "never migrated back");
        // One whose migration 99 dropped or renamed something: refused.
        raw.execute("UPDATE pcmail_schema SET readable_by = 99", []).expect("contract");
        drop(raw);
        let err = SqliteStore::open(&path).await.err().expect("must refuse");
        let told = err.to_string();
        assert!(told.contains("schema is version 99") && told.contains(&format!("knows (version {known})")), "{told}");
    }

    #[tokio::test]
    async fn i6_reopening_migrates_nothing_twice() {
        let (dir, store) = fresh().await;
        drop(store);
        let again = SqliteStore::open(dir.path().join("pcmail.db")).await;
        assert!(again.is_ok());
    }

    /// The writer's journal mode and `synchronous` level (0 OFF, 1 NORMAL, 2 FULL).
    async fn journaling(store: &SqliteStore) -> (String, i64) {
        store
            .write(|c| {
                let mode: String = c.pragma_query_value(None, "journal_mode", |r| r.get(0)).map_err(map_err)?;
                Ok((mode, c.pragma_query_value(None, "synchronous", |r| r.get(0)).map_err(map_err)?))
            })
            .await
            .expect("pragmas")
    }

    fn machines(names: std::ops::Range<i64>) -> Batch {
        let row = |n: i64| vec![Cell::Text(format!("pc{n}")), Cell::Int(n), Cell::Text(String::new())];
        Batch { tab: "machines", rows: names.map(row).collect() }
    }

    fn leases(names: std::ops::Range<i64>) -> Batch {
        let row = |n: i64| {
            let mut row = vec![Cell::Text(format!("lease-{n}")), Cell::Text("pc1".into())];
            row.extend([Cell::Int(n), Cell::Int(n), Cell::Int(n)]);
            row
        };
        Batch { tab: "leases", rows: names.map(row).collect() }
    }

    /// P14: a copy's target takes the tabs after `kv` (whose rows hold its `unfinished` mark)
    /// with the rollback journal in memory and no syncs (the WAL would write each page twice),
    /// a failed batch still rolls back alone, and the store ends in WAL with FULL syncs.
    #[tokio::test]
    async fn p14_a_copy_into_sqlite_takes_its_rows_unjournaled_and_ends_in_wal_with_full_syncs() {
        let (dir, store) = fresh().await;
        assert_eq!(journaling(&store).await, ("wal".into(), 2));
        // The copy's emptiness check leaves a reader of ours open; it does not hold the file in WAL.
        assert_eq!(store.occupied_tabs().await.expect("read"), Vec::<String>::new());
        store.kv_set(crate::transfer::COPY_KEY, "unfinished").await.expect("marked");
        store.import_started().await.expect("started");
        store.import_rows(machines(0..500)).await.expect("rows before kv");
        let kv = Batch { tab: "kv", rows: vec![vec![Cell::Text("copied".into()), Cell::Text("1".into())]] };
        store.import_rows(kv).await.expect("kv");
        assert_eq!(journaling(&store).await, ("wal".into(), 1), "the mark's tab and those before it: in WAL");
        store.import_rows(leases(0..500)).await.expect("rows after kv");
        assert_eq!(journaling(&store).await, ("memory".into(), 0));
        let twice = leases(500..600).rows.into_iter().chain(leases(599..600).rows).collect();
        let err = store.import_rows(Batch { tab: "leases", rows: twice }).await.expect_err("a key twice");
        assert!(err.to_string().contains("UNIQUE"), "{err}");
        store.import_finished().await.expect("finished");
        assert_eq!(journaling(&store).await, ("wal".into(), 2));
        assert_eq!(store.kv_get(crate::transfer::COPY_KEY).await.expect("kv").as_deref(), Some("unfinished"));
        drop(store);
        let raw = Connection::open(dir.path().join("pcmail.db")).expect("raw");
        let kept: i64 = raw.query_row("SELECT count(*) FROM leases", [], |r| r.get(0)).expect("count");
        assert_eq!(kept, 500, "the failed batch rolled back, and only it");
        let mode: String = raw.query_row("PRAGMA journal_mode", [], |r| r.get(0)).expect("mode");
        assert_eq!(mode, "wal", "the file itself says WAL again");
    }

    /// P14: while another connection has the file open, it stays in WAL, its commits unsynced
    /// (NORMAL: a checkpoint still syncs the file before the log is reused); once that one has
    /// closed, the next batch leaves WAL.
    #[tokio::test]
    async fn p14_a_copy_into_sqlite_held_open_elsewhere_stays_in_wal() {
        let (dir, store) = fresh().await;
        let other = Connection::open(dir.path().join("pcmail.db")).expect("another process's");
        let _: i64 = other.query_row("SELECT count(*) FROM machines", [], |r| r.get(0)).expect("it has read");
        store.kv_set(crate::transfer::COPY_KEY, "unfinished").await.expect("marked");
        store.import_started().await.expect("started");
        store.import_rows(leases(0..10)).await.expect("rows");
        assert_eq!(journaling(&store).await, ("wal".into(), 1));
        drop(other);
        store.import_rows(leases(10..20)).await.expect("rows");
        assert_eq!(journaling(&store).await, ("memory".into(), 0));
        store.import_finished().await.expect("finished");
        assert_eq!(journaling(&store).await, ("wal".into(), 2));
    }
}
