//! O2/O3: moving a whole store — every tab, rows as they are (sequence numbers and token
//! hashes included) — from one adapter to another, and checking that two stores hold the same.
//! A backup is a copy into a new SQLite file, a restore a copy out of one, `store copy` the
//! general case. Each adapter exports one consistent snapshot and imports rows as they are;
//! what moves, in which order, and how two stores compare lives here, once.

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::cells::{Batch, Cell, CellRef, Incoming};
use crate::codec::REQUIRED;
use crate::{Result, Store, StoreError};

/// Every tab a copy moves, in the order it moves them, with the columns that order an export:
/// the tab's primary key on both SQL adapters (unique, so an export read page by page neither
/// skips nor repeats a row; P14: each page starts where the last ended, down the key's index).
/// The kept mail counts are not among them: the target counts the mail it takes (SQLite's
/// triggers; PostgreSQL's recount at the copy's end).
pub const TABS: &[(&str, &str)] = &[
    ("specs", "kind, name"),
    ("tokens", "machine"),
    ("machines", "name"),
    ("kv", "key"),
    ("leases", "name"),
    ("mail", "seq"),
    ("events", "id"),
    ("alerts", "kind, subject"),
    ("ledger_projects", "project"),
    ("ledger", "project, id"),
    ("jobs", "seq"),
];

/// Rows per batch of an export.
pub const BATCH: usize = 1000;

/// A tab's columns, as this build reads them (the codec's `REQUIRED`).
pub fn columns(tab: &str) -> &'static [&'static str] {
    REQUIRED.iter().find(|(t, _)| *t == tab).map_or(&[], |(_, c)| c)
}

/// `SELECT` of every column of `tab` in key order, in SQL both SQL adapters speak.
pub fn select_sql(tab: &str, order: &str) -> String {
    format!("SELECT {} FROM {tab} ORDER BY {order}", quoted(columns(tab)))
}

/// [`select_sql`] of the rows `filter`, an SQL condition, holds.
pub fn select_where_sql(tab: &str, filter: &str, order: &str) -> String {
    format!("SELECT {} FROM {tab} WHERE {filter} ORDER BY {order}", quoted(columns(tab)))
}

/// P14: the next page of `tab` after a row whose key columns (`order`'s) are bound to the
/// adapter's placeholders, in key order: one range down the key's index, so an export reads
/// each row once however deep it is (an OFFSET reads every row before it again).
pub fn select_after_sql(tab: &str, order: &str, placeholder: impl Fn(usize) -> String, limit: usize) -> String {
    let keys: Vec<&str> = order.split(',').map(str::trim).collect();
    let params: Vec<String> = (1..=keys.len()).map(placeholder).collect();
    format!(
        "SELECT {} FROM {tab} WHERE ({}) > ({}) ORDER BY {order} LIMIT {limit}",
        quoted(columns(tab)),
        quoted(&keys),
        params.join(", ")
    )
}

/// P14: where `order`'s key columns sit among `tab`'s columns: what of a page's last row the
/// next page starts after.
pub fn key_positions(tab: &str, order: &str) -> Vec<usize> {
    let columns = columns(tab);
    order.split(',').filter_map(|k| columns.iter().position(|c| *c == k.trim())).collect()
}

/// P14: `INSERT` of `rows` rows of `tab` in one statement (one statement's work — its
/// cursors, its savepoint, its triggers' set-up — for many rows), numbered row after row with
/// the adapter's placeholders (`?1` or `$1`).
pub fn insert_many_sql(tab: &str, rows: usize, placeholder: impl Fn(usize) -> String) -> String {
    let columns = columns(tab);
    let n = columns.len();
    let tuples: Vec<String> = (0..rows)
        .map(|r| format!("({})", (1..=n).map(|c| placeholder(r * n + c)).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("INSERT INTO {tab} ({}) VALUES {}", quoted(columns), tuples.join(", "))
}

/// `tab`'s columns, quoted, in the order [`columns`] gives them: a column list of SQL.
pub fn column_list(tab: &str) -> String {
    quoted(columns(tab))
}

/// One row of flags, one per tab of [`TABS`] in order: whether it holds any row a copy could
/// collide with (in `kv`, the keys a store keeps about itself do not count).
pub fn occupied_sql() -> String {
    let any: Vec<String> = TABS
        .iter()
        .map(|(t, _)| match *t {
            "kv" => format!("EXISTS (SELECT 1 FROM kv WHERE NOT ({OWN_KEYS}))"),
            t => format!("EXISTS (SELECT 1 FROM {t})"),
        })
        .collect();
    format!("SELECT {}", any.join(", "))
}

/// The tabs whose flag in [`occupied_sql`]'s row is set.
pub fn occupied(flags: &[bool]) -> Vec<&'static str> {
    TABS.iter().zip(flags).filter(|(_, held)| **held).map(|((t, _), _)| *t).collect()
}

/// E14: the `DELETE`s that empty a store's data before a restore replaces it, last tab first;
/// the store's own `store/` and `sheets/` keys stay (its identity is renewed apart).
pub fn clear_sql() -> Vec<String> {
    TABS.iter()
        .rev()
        .map(|(t, _)| match *t {
            "kv" => format!("DELETE FROM kv WHERE NOT ({OWN_KEYS})"),
            t => format!("DELETE FROM {t}"),
        })
        .collect()
}

fn quoted(columns: &[&str]) -> String {
    columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ")
}

/// [`portable`]'s keys that stay behind, as a SQL condition on `kv`'s rows: prefixes compared
/// exactly, as `starts_with` does (SQLite's `LIKE` ignores ASCII case).
pub const OWN_KEYS: &str = "substr(key, 1, 6) = 'store/' OR substr(key, 1, 7) = 'sheets/'";

/// Rows that belong to a store rather than to its data stay behind: its `store/` keys (its
/// identity — E5: PCs see a moved or restored store as another one and merge from 0, so no
/// mail is skipped — and the mark of a copy into it) and the sheets adapter's bookkeeping.
fn portable(tab: &str, row: &[Cell]) -> bool {
    !row.first().is_some_and(|first| stays_behind(tab, first.as_ref()))
}

/// Whether a row of `tab` whose first value is `first` stays behind (see [`portable`]).
pub fn stays_behind(tab: &str, first: CellRef<'_>) -> bool {
    matches!((tab, first), ("kv", CellRef::Text(key)) if key.starts_with("store/") || key.starts_with("sheets/"))
}

/// Where a copy marks its target: `unfinished` from before its first row until after its
/// last, then `finished`. `serve` refuses a store marked unfinished.
pub const COPY_KEY: &str = "store/copy";

/// Refuses a store a copy into which stopped before its end.
pub async fn check_finished(store: &impl Store) -> Result<()> {
    match store.kv_get(COPY_KEY).await?.as_deref() {
        Some("unfinished") => Err(StoreError::UnfinishedCopy),
        _ => Ok(()),
    }
}

/// Runs `from`'s export and hands each batch, without the rows that stay behind, to `take`.
async fn each_batch(from: &(impl Store + Clone), mut take: impl AsyncFnMut(Batch) -> Result<()>) -> Result<()> {
    let (tx, mut rx) = mpsc::channel::<Batch>(4);
    let source = from.clone();
    let export = tokio::spawn(async move { source.export_tabs(tx).await });
    let mut taken = Ok(());
    while let Some(mut batch) = rx.recv().await {
        batch.rows.retain(|row| portable(batch.tab, row));
        taken = take(batch).await;
        if taken.is_err() {
            break;
        }
    }
    // Dropping the receiver ends an export whose batches are no longer wanted.
    drop(rx);
    let exported = export.await.map_err(|e| StoreError::Backend(format!("the export stopped: {e}")))?;
    taken.and(exported)
}

/// How many rows a copy moved, per tab.
pub type Moved = Vec<(&'static str, u64)>;

/// Copies every row of `from` into `to`, which must hold no data yet (nothing stored is ever
/// overwritten). `from` is read as one snapshot while it keeps serving. Answers what moved,
/// counted and checksummed as [`digest`] would count the rows it wrote.
pub async fn copy(from: &(impl Store + Clone), to: &impl Store) -> Result<Vec<TabDigest>> {
    copy_counted(from, to, &mut |_, _| {}).await
}

/// X4: what a copy, digest or check is told after each batch: its tab and how many rows it
/// held — once a batch, never a row, so the export's loop stays as cheap as it was.
pub type OnRows<'a> = dyn FnMut(&'static str, u64) + Send + 'a;

/// [`copy`], telling `on_rows` of each batch once the target has taken it (it may still be
/// writing it; the keys and indexes it set aside are built after the last).
pub async fn copy_counted(
    from: &(impl Store + Clone),
    to: &impl Store,
    on_rows: &mut OnRows<'_>,
) -> Result<Vec<TabDigest>> {
    copy_tallied(from, to, on_rows, Tally::Checksums).await.map(Sums::finish)
}

/// [`copy_counted`] without the checksums, for a copy that keeps only its counts (`store
/// copy`, `restore`): P14, hashing every row was a tenth of the copying process's work.
pub async fn copy_moved(from: &(impl Store + Clone), to: &impl Store, on_rows: &mut OnRows<'_>) -> Result<Moved> {
    copy_tallied(from, to, on_rows, Tally::Counts).await.map(|sums| moved(&sums.finish()))
}

/// What a copy keeps of the rows it fed.
#[derive(Clone, Copy)]
enum Tally {
    Checksums,
    Counts,
}

async fn copy_tallied(
    from: &(impl Store + Clone),
    to: &impl Store,
    on_rows: &mut OnRows<'_>,
    tally: Tally,
) -> Result<Sums> {
    let held = to.occupied_tabs().await?;
    if !held.is_empty() {
        return Err(StoreError::NotEmpty(held.join(", ")));
    }
    to.kv_set(COPY_KEY, "unfinished").await?;
    to.import_started().await?;
    let (tx, rx) = mpsc::channel::<Incoming>(4);
    let sums = either_cause(tokio::join!(feed(from, tx, on_rows, tally), to.import_stream(rx)))?;
    to.import_finished().await?;
    to.kv_set(COPY_KEY, "finished").await?;
    Ok(sums)
}

/// `from`'s export into `tx`, each batch told to `on_rows` once the store has taken it; `End`
/// only after the last row, so a store taking them tells a whole export from a broken one.
/// Answers what it fed, counted (and checksummed, as `tally` asks).
async fn feed(
    from: &(impl Store + Clone),
    tx: mpsc::Sender<Incoming>,
    on_rows: &mut OnRows<'_>,
    tally: Tally,
) -> Result<Sums> {
    let taking = |_| StoreError::Backend(STOPPED_TAKING.into());
    let mut sums = Sums::default();
    each_batch(from, async |batch: Batch| {
        match tally {
            Tally::Checksums => sums.add(&batch),
            Tally::Counts => sums.count(&batch),
        }
        let (tab, rows) = (batch.tab, batch.rows.len() as u64);
        tx.send(Incoming::Rows(batch)).await.map_err(taking)?;
        on_rows(tab, rows);
        Ok(())
    })
    .await?;
    tx.send(Incoming::End).await.map_err(taking)?;
    Ok(sums)
}

/// A feed of rows and the store taking them, ended together: the store's error when the feed
/// stopped because the store did, the feed's otherwise.
fn either_cause<T>(ended: (Result<T>, Result<()>)) -> Result<T> {
    match ended {
        (Ok(fed), Ok(())) => Ok(fed),
        (Err(StoreError::Backend(m)), Err(e)) if m == STOPPED_TAKING => Err(e),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// E14: replaces every row of `to` (a store holding data, which `restore --force` empties) by
/// `from`'s, in one transaction of `to`'s: it holds either what it held or all of `from`.
/// Answers what moved, counted as [`copy_moved`] counts it.
pub async fn replace(from: &(impl Store + Clone), to: &impl Store) -> Result<Moved> {
    let (tx, rx) = mpsc::channel::<Incoming>(4);
    let mut untold = |_, _| {};
    either_cause(tokio::join!(feed(from, tx, &mut untold, Tally::Counts), to.replace_tabs(rx)))
        .map(|sums| moved(&sums.finish()))
}

const STOPPED_TAKING: &str = "the store being written stopped taking rows";

/// The rows of each tab a digest or copy has seen, counted and summed.
pub struct Sums(Vec<(&'static str, u64, u128)>);

impl Default for Sums {
    fn default() -> Sums {
        Sums(TABS.iter().map(|(t, _)| (*t, 0, 0)).collect())
    }
}

impl Sums {
    fn add(&mut self, batch: &Batch) {
        for row in &batch.rows {
            self.add_hash(batch.tab, row_hash(row));
        }
    }

    /// `batch`'s rows counted, their sum left as it is.
    fn count(&mut self, batch: &Batch) {
        if let Some((_, rows, _)) = self.0.iter_mut().find(|(t, ..)| *t == batch.tab) {
            *rows += batch.rows.len() as u64;
        }
    }

    /// One row of `tab`, by its [`RowHash`]; a tab [`TABS`] does not name is not summed.
    pub fn add_hash(&mut self, tab: &str, hash: u128) {
        if let Some((_, rows, sum)) = self.0.iter_mut().find(|(t, ..)| *t == tab) {
            *rows += 1;
            *sum = sum.wrapping_add(hash);
        }
    }

    /// `other`'s rows counted and summed in too (a digest read in shares, P14).
    pub fn merge(&mut self, other: Sums) {
        for ((_, rows, sum), (_, more, their)) in self.0.iter_mut().zip(other.0) {
            *rows += more;
            *sum = sum.wrapping_add(their);
        }
    }

    pub fn finish(self) -> Vec<TabDigest> {
        self.0.into_iter().map(|(tab, rows, sum)| TabDigest { tab, rows, checksum: format!("{sum:032x}") }).collect()
    }
}

/// How many rows each tab of a digest holds.
pub fn moved(digest: &[TabDigest]) -> Moved {
    digest.iter().map(|d| (d.tab, d.rows)).collect()
}

/// E14: where a backup keeps the checksums of what it holds (a key of the store's own, so no
/// copy or restore carries it on).
pub const BACKUP_DIGEST_KEY: &str = "store/backup-digest";

/// E14: a backup's checksums as it keeps them — each tab's, and one of them all.
pub fn seal_digest(digest: &[TabDigest]) -> String {
    let tabs: Vec<serde_json::Value> =
        digest.iter().map(|d| serde_json::json!({"tab": d.tab, "rows": d.rows, "checksum": d.checksum})).collect();
    serde_json::json!({"tabs": tabs, "whole": whole(digest)}).to_string()
}

fn whole(digest: &[TabDigest]) -> String {
    let mut h = Sha256::new();
    for d in digest {
        h.update(format!("{}:{}:{};", d.tab, d.rows, d.checksum));
    }
    pcmail_core::ids::hex(&h.finalize())
}

/// E14: a backup's rows against the checksums it was sealed with: the tabs that differ (the
/// whole checksum is checked too, so a tampered record of the tabs is caught).
pub fn check_sealed(sealed: &str, now: &[TabDigest]) -> std::result::Result<(), Vec<String>> {
    let parsed: serde_json::Value =
        serde_json::from_str(sealed).map_err(|e| vec![format!("its checksum record ({e})")])?;
    let recorded: Vec<TabDigest> = parsed["tabs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let tab = TABS.iter().map(|(n, _)| *n).find(|n| Some(*n) == t["tab"].as_str())?;
            Some(TabDigest { tab, rows: t["rows"].as_u64()?, checksum: t["checksum"].as_str()?.to_string() })
        })
        .collect();
    if parsed["whole"].as_str() != Some(whole(&recorded).as_str()) || recorded.len() != now.len() {
        return Err(vec!["its checksum record".to_string()]);
    }
    let differ: Vec<String> = differences(&recorded, now).into_iter().map(String::from).collect();
    if differ.is_empty() { Ok(()) } else { Err(differ) }
}

/// E14: checks a store against the checksums it was sealed with, if it was; answers whether
/// it carried any. A tab that differs is named in the error; `file` is the verdict of the
/// backup file's own checksum ([`check_file`]), and "the file" is named when only it differs.
pub async fn verify_sealed(store: &(impl Store + Clone), file: FileSum) -> Result<bool> {
    verify_sealed_counted(store, file, &mut |_, _| {}).await
}

/// [`verify_sealed`], telling `on_rows` of each batch it reads.
pub async fn verify_sealed_counted(
    store: &(impl Store + Clone),
    file: FileSum,
    on_rows: &mut OnRows<'_>,
) -> Result<bool> {
    let Some(sealed) = store.kv_get(BACKUP_DIGEST_KEY).await? else {
        return match file {
            FileSum::Differs => Err(damaged(&["the file".to_string()])),
            _ => Ok(false),
        };
    };
    let now = match digest_counted(store, on_rows).await {
        Ok(now) => now,
        // Rows that cannot even be read are a damaged file, when its checksum says so.
        Err(_) if file == FileSum::Differs => return Err(damaged(&["the file".to_string()])),
        Err(e) => return Err(e),
    };
    check_sealed(&sealed, &now).map_err(|tabs| damaged(&tabs))?;
    if file == FileSum::Differs {
        return Err(damaged(&["the file".to_string()]));
    }
    Ok(true)
}

fn damaged(what: &[String]) -> StoreError {
    StoreError::Corrupt(format!(
        "the backup does not match its checksums in: {} (it was changed after it was written; \
         nothing was restored)",
        what.join(", ")
    ))
}

/// E14: where a sealed backup keeps the checksum of the whole file: the SQLite header's
/// application id (4 bytes at offset 68, which SQLite stores and never reads), so the backup
/// stays a plain SQLite file that any tool opens. It catches what no row checksum sees: the
/// header, the page structure, an index, free space.
const FILE_SUM_AT: std::ops::Range<usize> = 68..72;

/// What a backup file's own checksum says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileSum {
    Matches,
    Differs,
    /// Written before backups carried one, or not a backup.
    Absent,
}

/// E14: the checksum of a whole backup file: the first 4 bytes of the SHA-256 of every byte,
/// the 4 bytes that hold it counted as zero; never 0, which means "none".
pub fn file_sum(mut read: impl std::io::Read) -> std::io::Result<u32> {
    let mut h = Sha256::new();
    let mut at = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = read.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = &mut buf[..n];
        for i in FILE_SUM_AT {
            if (at..at + n).contains(&i) {
                chunk[i - at] = 0;
            }
        }
        h.update(&*chunk);
        at += n;
    }
    let d = h.finalize();
    Ok(u32::from_be_bytes([d[0], d[1], d[2], d[3]]).max(1))
}

/// E14: writes the whole-file checksum into a closed backup file, and makes it durable.
pub fn seal_file(mut file: &std::fs::File) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom, Write};
    file.seek(SeekFrom::Start(0))?;
    let sum = file_sum(file)?;
    file.seek(SeekFrom::Start(FILE_SUM_AT.start as u64))?;
    file.write_all(&sum.to_be_bytes())?;
    file.sync_all()
}

/// E14: a backup file against the checksum it carries. A file that is no SQLite file carries
/// none — its header has neither SQLite's magic string nor the payload fractions (64, 32, 32)
/// every SQLite file has, so one damaged byte in either still reads as a damaged backup.
pub fn check_file(path: &std::path::Path) -> std::io::Result<FileSum> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    let mut header = [0u8; 100];
    if file.read_exact(&mut header).is_err() {
        return Ok(FileSum::Absent);
    }
    let sqlite = header.starts_with(b"SQLite format 3\0") || header[21..24] == [64, 32, 32];
    let held = u32::from_be_bytes([header[68], header[69], header[70], header[71]]);
    if !sqlite || held == 0 {
        return Ok(FileSum::Absent);
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(if file_sum(file)? == held { FileSum::Matches } else { FileSum::Differs })
}

/// E14: a store as a restore weighs it (`pcmail_core::restore`): rows per tab, the last mail's
/// seq and time, each machine's token hash — read from one snapshot, as a copy reads it.
pub async fn survey(store: &(impl Store + Clone)) -> Result<pcmail_core::restore::Holdings> {
    let mut held = pcmail_core::restore::Holdings {
        rows: TABS.iter().map(|(t, _)| (t.to_string(), 0)).collect(),
        ..Default::default()
    };
    let at = |tab: &str, column: &str| columns(tab).iter().position(|c| *c == column);
    let (seq, created) = (at("mail", "seq"), at("mail", "created_at"));
    let (machine, hash) = (at("tokens", "machine"), at("tokens", "hash"));
    each_batch(store, async |batch: Batch| {
        if let Some((_, n)) = held.rows.iter_mut().find(|(t, _)| t == batch.tab) {
            *n += batch.rows.len() as u64;
        }
        for row in &batch.rows {
            let cell = |i: Option<usize>| i.and_then(|i| row.get(i));
            match batch.tab {
                "mail" => {
                    if let Some(Cell::Int(s)) = cell(seq) {
                        held.last_seq = held.last_seq.max(*s);
                    }
                    if let Some(Cell::Int(ms)) = cell(created) {
                        let t = chrono::DateTime::from_timestamp_millis(*ms);
                        held.newest_mail = held.newest_mail.max(t);
                    }
                }
                "tokens" => {
                    if let (Some(Cell::Text(m)), Some(Cell::Text(h))) = (cell(machine), cell(hash)) {
                        held.tokens.insert(m.clone(), h.clone());
                    }
                }
                _ => {}
            }
        }
        Ok(())
    })
    .await?;
    Ok(held)
}

/// One tab as `store verify` compares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TabDigest {
    pub tab: &'static str,
    pub rows: u64,
    /// The wrapping sum of every row's SHA-256 (its first 128 bits), each value in one
    /// canonical form: a sum, so adapters need not agree on how they sort text.
    pub checksum: String,
}

/// Counts and checksums every tab of `store`, from one snapshot.
pub async fn digest(store: &(impl Store + Clone)) -> Result<Vec<TabDigest>> {
    digest_counted(store, &mut |_, _| {}).await
}

/// [`digest`], telling `on_rows` of each batch it reads.
pub async fn digest_counted(store: &(impl Store + Clone), on_rows: &mut OnRows<'_>) -> Result<Vec<TabDigest>> {
    let mut sums = Sums::default();
    each_batch(store, async |batch: Batch| {
        sums.add(&batch);
        on_rows(batch.tab, batch.rows.len() as u64);
        Ok(())
    })
    .await?;
    Ok(sums.finish())
}

fn row_hash(row: &[Cell]) -> u128 {
    let mut hash = RowHash::default();
    row.iter().for_each(|cell| hash.add(cell.as_ref()));
    hash.finish()
}

/// One row's checksum, fed a value at a time so an adapter can hash the values it reads in
/// place (P14): the first 128 bits of the SHA-256 of each value's canonical form — `N;`,
/// `I<decimal>;` (a flag is the integer it is stored as), `T<bytes>:<text>` — in column order.
/// Backups keep sums of it: the form never changes.
#[derive(Default)]
pub struct RowHash(Sha256);

impl RowHash {
    pub fn add(&mut self, cell: CellRef<'_>) {
        let mut digits = [0u8; 20];
        match cell {
            CellRef::Null => self.0.update(b"N;"),
            CellRef::Int(i) => {
                self.0.update(b"I");
                self.0.update(decimal(i, &mut digits));
                self.0.update(b";");
            }
            CellRef::Text(t) => {
                self.0.update(b"T");
                self.0.update(decimal(i64::try_from(t.len()).unwrap_or(i64::MAX), &mut digits));
                self.0.update(b":");
                self.0.update(t.as_bytes());
            }
        }
    }

    pub fn finish(self) -> u128 {
        let bytes = self.0.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&bytes[..16]);
        u128::from_be_bytes(first)
    }
}

/// `i` in decimal, written into the end of `buf` (an i64 has at most 19 digits and a sign).
fn decimal(i: i64, buf: &mut [u8; 20]) -> &[u8] {
    let mut n = i.unsigned_abs();
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if i < 0 {
        at -= 1;
        buf[at] = b'-';
    }
    &buf[at..]
}

/// The tabs whose counts or checksums differ.
pub fn differences(a: &[TabDigest], b: &[TabDigest]) -> Vec<&'static str> {
    a.iter().zip(b).filter(|(x, y)| x != y).map(|(x, _)| x.tab).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E14: the form a row is hashed in is the one every earlier backup was sealed with.
    #[test]
    fn e14_a_row_hashes_as_backups_were_always_sealed() {
        let sealed_form = |row: &[Cell]| {
            let mut h = Sha256::new();
            for cell in row {
                match cell {
                    Cell::Null => h.update(b"N;"),
                    Cell::Int(i) => h.update(format!("I{i};")),
                    Cell::Bool(b) => h.update(format!("I{};", i64::from(*b))),
                    Cell::Text(t) => h.update(format!("T{}:{t}", t.len())),
                }
            }
            u128::from_be_bytes(h.finalize()[..16].try_into().expect("16 bytes"))
        };
        let row = [
            Cell::Int(i64::MIN),
            Cell::Int(-1),
            Cell::Int(0),
            Cell::Int(i64::MAX),
            Cell::Bool(true),
            Cell::Null,
            Cell::Text(String::new()),
            Cell::Text("件名 — 1".into()),
        ];
        assert_eq!(row_hash(&row), sealed_form(&row));
        assert_ne!(row_hash(&row[..1]), row_hash(&row[1..2]));
    }

    #[test]
    fn p14_a_batch_is_inserted_by_one_statement_numbering_row_after_row() {
        let sql = insert_many_sql("leases", 2, |i| format!("${i}"));
        let n = columns("leases").len();
        assert!(sql.starts_with(&format!("INSERT INTO leases ({}) VALUES ($1, ", quoted(columns("leases")))), "{sql}");
        assert!(sql.ends_with(&format!("${})", 2 * n)) && sql.contains(&format!("${n}), (${}", n + 1)), "{sql}");
    }

    #[test]
    fn p14_every_tab_pages_by_a_key_of_columns_it_has() {
        for (tab, order) in TABS {
            assert_eq!(key_positions(tab, order).len(), order.split(',').count(), "{tab}: {order}");
        }
        assert_eq!(
            select_after_sql("leases", "name", |i| format!("${i}"), 10),
            format!("SELECT {} FROM leases WHERE (\"name\") > ($1) ORDER BY name LIMIT 10", quoted(columns("leases")))
        );
        assert!(
            select_after_sql("ledger", "project, id", |i| format!("?{i}"), 5)
                .contains("WHERE (\"project\", \"id\") > (?1, ?2) ORDER BY project, id LIMIT 5")
        );
    }

    #[test]
    fn e14_the_file_sum_changes_with_any_bit_but_not_with_where_it_is_kept() {
        let bytes: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let sum = file_sum(&bytes[..]).expect("sum");
        let mut kept = bytes.clone();
        kept[68..72].copy_from_slice(&sum.to_be_bytes());
        assert_eq!(file_sum(&kept[..]).expect("sum"), sum, "the bytes that hold it count as zero");
        for at in [0, 67, 72, 1000, 65_535, 65_536, 199_999] {
            let mut flipped = kept.clone();
            flipped[at] ^= 0x10;
            assert_ne!(file_sum(&flipped[..]).expect("sum"), sum, "a bit flipped at {at}");
        }
    }

    #[test]
    fn o3_every_tab_moved_has_its_columns_and_the_counts_stay_behind() {
        for (tab, _) in TABS {
            assert!(!columns(tab).is_empty(), "{tab} has no columns in REQUIRED");
        }
        assert!(!TABS.iter().any(|(t, _)| *t == "mail_counts"));
        assert_eq!(TABS.len() + 1, REQUIRED.len(), "a tab of REQUIRED is neither moved nor left out on purpose");
    }

    #[test]
    fn o3_sql_quotes_columns_and_uses_the_adapters_placeholders() {
        let insert = insert_many_sql("tokens", 1, |i| format!("?{i}"));
        assert_eq!(insert, "INSERT INTO tokens (\"machine\", \"hash\", \"created_at\") VALUES (?1, ?2, ?3)");
        assert_eq!(column_list("tokens"), "\"machine\", \"hash\", \"created_at\"");
        assert!(select_sql("mail", "seq").contains("\"from\", \"to\""));
        let flags = occupied_sql();
        assert_eq!(flags.matches("EXISTS").count(), TABS.len());
        assert!(flags.contains(&format!("FROM kv WHERE NOT ({OWN_KEYS})")), "{flags}");
        assert_eq!(occupied(&[true, false, false, true]), ["specs", "kv"]);
    }

    #[tokio::test]
    async fn x4_a_counted_copy_and_digest_are_told_once_a_batch_and_answer_what_the_plain_ones_do() {
        let dir = tempfile::tempdir().expect("tempdir");
        let from = crate::SqliteStore::open(dir.path().join("from.db")).await.expect("open");
        let rows = (0..2500).map(|i| vec![Cell::Text(format!("k/{i:05}")), Cell::Text("v".into())]).collect();
        from.import_rows(Batch { tab: "kv", rows }).await.expect("fill");
        let (plain, counted) = (
            crate::SqliteStore::open(dir.path().join("plain.db")).await.expect("open"),
            crate::SqliteStore::open(dir.path().join("counted.db")).await.expect("open"),
        );
        let mut told: Vec<(&str, u64)> = Vec::new();
        let copied = copy_counted(&from, &counted, &mut |tab, n| told.push((tab, n))).await.expect("copy");
        assert_eq!(copied, copy(&from, &plain).await.expect("copy"), "the callback changes nothing copied");
        let told_kv: u64 = told.iter().filter(|(t, _)| *t == "kv").map(|(_, n)| n).sum();
        assert_eq!(told_kv, 2500, "every row moved is told, the store's own keys left behind are not");
        assert!((3..=TABS.len() + 3).contains(&told.len()), "once a batch, never a row: {}", told.len());
        let mut read = 0;
        let digest_told = digest_counted(&counted, &mut |_, n| read += n).await.expect("digest");
        assert_eq!(digest_told, digest(&counted).await.expect("digest"));
        assert_eq!(read, 2500);
    }

    #[test]
    fn e5_a_copy_leaves_the_identity_and_sheet_bookkeeping_behind() {
        let kv = |k: &str| vec![Cell::Text(k.into()), Cell::Text("v".into())];
        assert!(!portable("kv", &kv(crate::IDENTITY_KEY)));
        assert!(!portable("kv", &kv(COPY_KEY)));
        assert!(!portable("kv", &kv("sheets/base/ledger")));
        assert!(portable("kv", &kv("telegram/offset")));
        assert!(portable("mail", &[Cell::Text(crate::IDENTITY_KEY.into())]));
    }

    #[test]
    fn o3_checksums_ignore_row_order_and_bool_spelling_but_not_values() {
        let a = vec![Cell::Int(1), Cell::Text("x".into()), Cell::Bool(true)];
        let b = vec![Cell::Int(2), Cell::Null, Cell::Int(0)];
        let sum = |rows: &[&Vec<Cell>]| rows.iter().fold(0u128, |s, r| s.wrapping_add(row_hash(r)));
        assert_eq!(sum(&[&a, &b]), sum(&[&b, &a]));
        let a_as_int = vec![Cell::Int(1), Cell::Text("x".into()), Cell::Int(1)];
        assert_eq!(row_hash(&a), row_hash(&a_as_int));
        assert_ne!(row_hash(&[Cell::Null]), row_hash(&[Cell::Text(String::new())]));
        assert_ne!(
            row_hash(&[Cell::Text("ab".into()), Cell::Text("c".into())]),
            row_hash(&[Cell::Text("a".into()), Cell::Text("bc".into())])
        );
    }
}
