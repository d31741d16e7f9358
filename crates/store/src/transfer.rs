//! O2/O3: moving a whole store — every tab, rows as they are (sequence numbers and token
//! hashes included) — from one adapter to another, and checking that two stores hold the same.
//! A backup is a copy into a new SQLite file, a restore a copy out of one, `store copy` the
//! general case. Each adapter exports one consistent snapshot and imports rows as they are;
//! what moves, in which order, and how two stores compare lives here, once.

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use crate::cells::{Batch, Cell};
use crate::codec::REQUIRED;
use crate::{Result, Store, StoreError};

/// Every tab a copy moves, in the order it moves them, with the columns that order an export
/// (unique, so an export read page by page neither skips nor repeats a row).
/// The kept mail counts are not among them: the target's own triggers count the mail it takes.
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
    ("ledger", "project, seq, id"),
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

/// `INSERT` of one row of `tab`, with the adapter's placeholders (`?1` or `$1`) and whatever the
/// adapter puts between the column list and `VALUES`.
pub fn insert_sql(tab: &str, placeholder: impl Fn(usize) -> String, between: &str) -> String {
    let columns = columns(tab);
    let values: Vec<String> = (1..=columns.len()).map(placeholder).collect();
    format!("INSERT INTO {tab} ({}) {between}VALUES ({})", quoted(columns), values.join(", "))
}

/// One row of flags, one per tab of [`TABS`] in order: whether it holds any row a copy could
/// collide with (in `kv`, the keys a store keeps about itself do not count).
pub fn occupied_sql() -> String {
    let any: Vec<String> = TABS
        .iter()
        .map(|(t, _)| match *t {
            "kv" => "EXISTS (SELECT 1 FROM kv WHERE key NOT LIKE 'store/%' AND key NOT LIKE 'sheets/%')".to_string(),
            t => format!("EXISTS (SELECT 1 FROM {t})"),
        })
        .collect();
    format!("SELECT {}", any.join(", "))
}

/// The tabs whose flag in [`occupied_sql`]'s row is set.
pub fn occupied(flags: &[bool]) -> Vec<&'static str> {
    TABS.iter().zip(flags).filter(|(_, held)| **held).map(|((t, _), _)| *t).collect()
}

fn quoted(columns: &[&str]) -> String {
    columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ")
}

/// Rows that belong to a store rather than to its data stay behind: its `store/` keys (its
/// identity — E5: PCs see a moved or restored store as another one and merge from 0, so no
/// mail is skipped — and the mark of a copy into it) and the sheets adapter's bookkeeping.
fn portable(tab: &str, row: &[Cell]) -> bool {
    match (tab, row.first()) {
        ("kv", Some(Cell::Text(key))) => !key.starts_with("store/") && !key.starts_with("sheets/"),
        _ => true,
    }
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
    let held = to.occupied_tabs().await?;
    if !held.is_empty() {
        return Err(StoreError::NotEmpty(held.join(", ")));
    }
    to.kv_set(COPY_KEY, "unfinished").await?;
    let mut sums = Sums::new();
    each_batch(from, async |batch: Batch| {
        sums.add(&batch);
        to.import_rows(batch).await
    })
    .await?;
    to.import_finished().await?;
    to.kv_set(COPY_KEY, "finished").await?;
    Ok(sums.finish())
}

/// The rows of each tab a digest or copy has seen, counted and summed.
struct Sums(Vec<(&'static str, u64, u128)>);

impl Sums {
    fn new() -> Sums {
        Sums(TABS.iter().map(|(t, _)| (*t, 0, 0)).collect())
    }

    fn add(&mut self, batch: &Batch) {
        if let Some((_, rows, sum)) = self.0.iter_mut().find(|(t, ..)| *t == batch.tab) {
            for row in &batch.rows {
                *rows += 1;
                *sum = sum.wrapping_add(row_hash(row));
            }
        }
    }

    fn finish(self) -> Vec<TabDigest> {
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
/// it carried any. A tab that differs is named in the error.
pub async fn verify_sealed(store: &(impl Store + Clone)) -> Result<bool> {
    let Some(sealed) = store.kv_get(BACKUP_DIGEST_KEY).await? else { return Ok(false) };
    let now = digest(store).await?;
    check_sealed(&sealed, &now).map_err(|tabs| {
        StoreError::Corrupt(format!(
            "the backup does not match its checksums in: {} (it was changed after it was written; \
             nothing was restored)",
            tabs.join(", ")
        ))
    })?;
    Ok(true)
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
    let mut sums = Sums::new();
    each_batch(store, async |batch: Batch| {
        sums.add(&batch);
        Ok(())
    })
    .await?;
    Ok(sums.finish())
}

fn row_hash(row: &[Cell]) -> u128 {
    let mut h = Sha256::new();
    for cell in row {
        match cell {
            Cell::Null => h.update(b"N;"),
            Cell::Int(i) => h.update(format!("I{i};")),
            Cell::Bool(b) => h.update(format!("I{};", i64::from(*b))),
            Cell::Text(t) => {
                h.update(format!("T{}:", t.len()));
                h.update(t.as_bytes());
            }
        }
    }
    let bytes = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&bytes[..16]);
    u128::from_be_bytes(first)
}

/// The tabs whose counts or checksums differ.
pub fn differences(a: &[TabDigest], b: &[TabDigest]) -> Vec<&'static str> {
    a.iter().zip(b).filter(|(x, y)| x != y).map(|(x, _)| x.tab).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let insert = insert_sql("tokens", |i| format!("${i}"), "OVERRIDING SYSTEM VALUE ");
        assert_eq!(
            insert,
            "INSERT INTO tokens (\"machine\", \"hash\", \"created_at\") OVERRIDING SYSTEM VALUE VALUES ($1, $2, $3)"
        );
        assert!(select_sql("mail", "seq").contains("\"from\", \"to\""));
        let flags = occupied_sql();
        assert_eq!(flags.matches("EXISTS").count(), TABS.len());
        assert!(flags.contains("key NOT LIKE 'store/%'"));
        assert_eq!(occupied(&[true, false, false, true]), ["specs", "kv"]);
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
