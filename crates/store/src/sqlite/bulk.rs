//! P14: an import's rows go in with the writer's triggers off (`SQLITE_DBCONFIG_ENABLE_TRIGGER`:
//! this connection only, for the import's batches, so nothing is left dropped or disabled in the
//! file if the import stops). What the tabs' insert triggers keep — mail's counts, the search
//! indexes — is done here a batch at once, in the batch's own transaction, so every commit
//! leaves them exactly as the triggers would have. Row by row (an upsert and a subquery for
//! each mail), they cost a `store copy` of 1M mails, 100k ledger rows and 100k jobs from
//! PostgreSQL into SQLite 9.1 s against 7.5 s without them, run back to back.

use rusqlite::config::DbConfig;
use rusqlite::{Connection, OptionalExtension};

use super::map_err;
use crate::cells::{Batch, Cell};
use crate::transfer;
use crate::{Result, StoreError};

/// `f` run on `conn` with its triggers off; they are on again after, whatever `f` answered,
/// and before a panic in it goes on (the writer outlives a poisoned lock). Each switch expires
/// the connection's prepared statements (SQLite compiles a trigger into the statement that
/// fires it), so a whole import's batches go under one switch.
pub(super) fn without_triggers<R>(conn: &mut Connection, f: impl FnOnce(&mut Connection) -> Result<R>) -> Result<R> {
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false).map_err(map_err)?;
    let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *conn)));
    let back = conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, true).map_err(map_err);
    match done {
        Ok(done) => done.and_then(|r| back.map(|_| r)),
        Err(panicked) => std::panic::resume_unwind(panicked),
    }
}

/// `batch` into its tab inside the caller's transaction, on a connection whose triggers are
/// off, and what the tab's insert triggers would have done for its rows.
pub(super) fn insert(tx: &Connection, batch: &Batch) -> Result<()> {
    fits(batch)?;
    let ledger_before = match batch.tab {
        "ledger" => Some(largest_rowid(tx, "ledger")?),
        _ => None,
    };
    super::insert_batch(tx, batch)?;
    match (batch.tab, ledger_before) {
        ("mail", _) => {
            count_mail(tx, &batch.rows)?;
            index_mail(tx, &batch.rows)
        }
        ("ledger", Some(before)) => index_ledger(tx, before),
        _ => Ok(()),
    }
}

/// Each row as wide as its tab, and each mail numbered: the rows' own cells are what the
/// counts and the index are kept from, so a row that would go in shifted or numbered by SQLite
/// (which only a damaged source could send) is refused, naming its tab.
fn fits(batch: &Batch) -> Result<()> {
    let width = transfer::columns(batch.tab).len();
    let seq = transfer::columns(batch.tab).iter().position(|c| *c == "seq");
    for row in &batch.rows {
        if row.len() != width {
            return Err(StoreError::Corrupt(format!(
                "{}: a row of {} values for {width} columns",
                batch.tab,
                row.len()
            )));
        }
        if batch.tab == "mail" && !matches!(seq.and_then(|i| row.get(i)), Some(Cell::Int(_))) {
            return Err(StoreError::Corrupt("mail: a row whose seq is not a number".into()));
        }
    }
    Ok(())
}

fn largest_rowid(tx: &Connection, tab: &str) -> Result<i64> {
    tx.query_row(&format!("SELECT coalesce(max(rowid), 0) FROM {tab}"), [], |r| r.get(0)).map_err(map_err)
}

/// `mail_counts_insert`: one more mail of each row's state, kind and channel — an upsert for
/// each of the batch's few combinations instead of one a row.
fn count_mail(tx: &Connection, rows: &[Vec<Cell>]) -> Result<()> {
    let at = |name: &str| transfer::columns("mail").iter().position(|c| *c == name);
    let (Some(state), Some(kind), Some(channel)) = (at("state"), at("kind"), at("channel")) else {
        return Ok(());
    };
    let mut counts: Vec<([&Cell; 3], i64)> = Vec::new();
    for row in rows {
        let (Some(s), Some(k), Some(c)) = (row.get(state), row.get(kind), row.get(channel)) else { continue };
        match counts.iter_mut().find(|(key, _)| *key == [s, k, c]) {
            Some((_, n)) => *n += 1,
            None => counts.push(([s, k, c], 1)),
        }
    }
    let mut upsert = tx
        .prepare_cached(
            "INSERT INTO mail_counts (state, kind, channel, n) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT(state, kind, channel) DO UPDATE SET n = n + excluded.n",
        )
        .map_err(map_err)?;
    for ([s, k, c], n) in counts {
        upsert.execute(rusqlite::params![s, k, c, n]).map_err(map_err)?;
    }
    Ok(())
}

/// `mail_search_insert`: the rows at or below the search index's mark go into it now (those
/// above are the indexer's, `search.rs`). A fresh target's mark is 0, so usually none do.
fn index_mail(tx: &Connection, rows: &[Vec<Cell>]) -> Result<()> {
    let at = |name: &str| transfer::columns("mail").iter().position(|c| *c == name);
    let (Some(seq), Some(subject), Some(body)) = (at("seq"), at("subject"), at("body")) else {
        return Ok(());
    };
    let through: Option<i64> = tx.query_row(super::search::MARK, [], |r| r.get(0)).optional().map_err(map_err)?;
    let Some(through) = through else { return Ok(()) };
    let mut insert =
        tx.prepare_cached("INSERT INTO mail_search (rowid, subject, body) VALUES (?1, ?2, ?3)").map_err(map_err)?;
    for row in rows {
        if let (Some(Cell::Int(n)), Some(s), Some(b)) = (row.get(seq), row.get(subject), row.get(body))
            && *n <= through
        {
            insert.execute(rusqlite::params![n, s, b]).map_err(map_err)?;
        }
    }
    Ok(())
}

/// `ledger_search_insert`: the rows the batch added (a ledger row's rowid is SQLite's to give,
/// above every one before it) into the ledger's search index, in one statement.
fn index_ledger(tx: &Connection, before: i64) -> Result<()> {
    tx.execute(
        "INSERT INTO ledger_search (rowid, task, content) SELECT rowid, task, content FROM ledger WHERE rowid > ?1",
        [before],
    )
    .map(drop)
    .map_err(map_err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;
    use crate::cells::Incoming;
    use crate::sqlite::SqliteStore;

    /// The insert triggers whose work [`insert`] does: every trigger a row inserted into a
    /// copied tab fires, so a new one cannot be skipped by an import.
    const DONE_IN_BULK: &[&str] = &["ledger_search_insert", "mail_counts_insert", "mail_search_insert"];

    async fn fresh(dir: &tempfile::TempDir, name: &str) -> SqliteStore {
        SqliteStore::open(dir.path().join(name)).await.expect("open")
    }

    /// Row `n` of `tab`: its numbers `n`, a few states, kinds and channels, and texts to find.
    fn row(tab: &str, n: i64) -> Vec<Cell> {
        let pick = |of: &[&str]| Cell::Text(of[n as usize % of.len()].into());
        transfer::columns(tab)
            .iter()
            .map(|column| match *column {
                "seq" | "urgent" | "auto" | "hop" | "run_requested" | "failures" | "refresh" => Cell::Int(n),
                "created_at" | "expires_at" => Cell::Int(1_700_000_000_000 + n),
                "state" => pick(&["new", "done", "done", "delivered"]),
                "kind" => pick(&["note", "request", "intent"]),
                "channel" => pick(&["pc", "telegram"]),
                "project" => Cell::Text("p".into()),
                "subject" | "body" | "task" | "content" => Cell::Text(format!("{column} 請求書 {n}")),
                c if c.ends_with("_at") || matches!(c, "reply_to" | "external_key") => Cell::Null,
                c => Cell::Text(format!("{c}-{n}")),
            })
            .collect()
    }

    fn batch(tab: &'static str, ns: std::ops::RangeInclusive<i64>) -> Batch {
        Batch { tab, rows: ns.map(|n| row(tab, n)).collect() }
    }

    /// What the insert triggers keep: mail's counts, and the rows each search index holds.
    async fn kept(store: &SqliteStore) -> (Vec<(String, String, String, i64)>, Vec<i64>, Vec<i64>) {
        store
            .write(|c| {
                let all = |sql: &str| -> Vec<i64> {
                    let mut stmt = c.prepare(sql).expect("prepare");
                    stmt.query_map([], |r| r.get(0)).expect("query").map(|r| r.expect("row")).collect()
                };
                let mut stmt =
                    c.prepare("SELECT state, kind, channel, n FROM mail_counts ORDER BY 1, 2, 3").expect("q");
                let counts = stmt
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .expect("counts")
                    .map(|r| r.expect("row"))
                    .collect();
                // FTS5's own checks: each index whole, and the ledger's (which holds every row)
                // against its rows (mail's holds those at or below its mark only).
                for (check, against_rows) in [("mail_search", 0), ("ledger_search", 1)] {
                    let sql = format!("INSERT INTO {check} ({check}, rank) VALUES ('integrity-check', ?1)");
                    c.execute(&sql, [against_rows]).expect("the search index matches its rows");
                }
                Ok((
                    counts,
                    all("SELECT id FROM mail_search_docsize ORDER BY id"),
                    all("SELECT id FROM ledger_search_docsize ORDER BY id"),
                ))
            })
            .await
            .expect("read")
    }

    #[tokio::test]
    async fn p14_every_insert_trigger_of_a_copied_tab_is_one_an_import_does_in_bulk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = fresh(&dir, "pcmail.db").await;
        // The copied tabs, and those the bulk work itself writes (a trigger there would be
        // skipped as well).
        let mut tabs: Vec<&str> = transfer::TABS.iter().map(|(t, _)| *t).collect();
        tabs.extend(["mail_counts", "mail_search", "ledger_search"]);
        let triggers: Vec<(String, String, String)> = store
            .read(|c| {
                let mut stmt = c
                    .prepare("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
                    .map_err(map_err)?;
                let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))).map_err(map_err)?;
                rows.collect::<rusqlite::Result<_>>().map_err(map_err)
            })
            .await
            .expect("triggers");
        let on_insert: Vec<&str> = triggers
            .iter()
            .filter(|(_, tab, sql)| {
                let words = sql.to_uppercase().split_whitespace().collect::<Vec<_>>().join(" ");
                tabs.contains(&tab.as_str()) && words.contains(" INSERT ON ")
            })
            .map(|(name, ..)| name.as_str())
            .collect();
        assert_eq!(on_insert, DONE_IN_BULK, "a trigger an import would skip, or one it redoes that is gone");
    }

    /// A row its tab's columns cannot hold as they are is refused before anything is kept.
    #[tokio::test]
    async fn p14_an_import_refuses_a_row_of_another_width_or_an_unnumbered_mail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = fresh(&dir, "pcmail.db").await;
        let mut short = batch("mail", 1..=2);
        short.rows[1].pop();
        let err = store.import_rows(short).await.expect_err("a row one value short");
        assert!(err.to_string().contains("mail: a row of 25 values for 26 columns"), "{err}");
        let mut unnumbered = batch("mail", 1..=2);
        unnumbered.rows[0][0] = Cell::Null;
        let err = store.import_rows(unnumbered).await.expect_err("a mail without its seq");
        assert!(err.to_string().contains("mail: a row whose seq is not a number"), "{err}");
        assert_eq!(kept(&store).await, (vec![], vec![], vec![]), "nothing of either batch");
    }

    /// P14: the same rows imported with the triggers off (done in bulk) and inserted with
    /// them on leave the same counts and search indexes, below and above the mail index's mark.
    #[tokio::test]
    async fn p14_an_import_without_triggers_keeps_counts_and_search_as_the_triggers_would() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (bulk, triggered) = (fresh(&dir, "bulk.db").await, fresh(&dir, "triggered.db").await);
        let batches =
            [batch("mail", 1..=700), batch("mail", 701..=1000), batch("ledger", 1..=300), batch("ledger", 301..=420)];
        for store in [&bulk, &triggered] {
            // The mail index's mark inside the first batch: the rows up to it go into the index.
            store
                .write(|c| c.execute("UPDATE search_indexed SET through = 450 WHERE tab = 'mail'", []).map_err(map_err))
                .await
                .expect("mark");
        }
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let feed = async {
            for b in &batches {
                tx.send(Incoming::Rows(b.clone())).await.expect("send");
            }
            tx.send(Incoming::End).await.expect("end");
        };
        let (imported, ()) = tokio::join!(bulk.import_stream(rx), feed);
        imported.expect("imported");
        for b in batches.clone() {
            triggered
                .write(move |c| {
                    let tx = c.transaction().map_err(map_err)?;
                    super::super::insert_batch(&tx, &b)?;
                    tx.commit().map_err(map_err)
                })
                .await
                .expect("inserted with the triggers on");
        }
        let (counts, mail, ledger) = kept(&bulk).await;
        assert_eq!((counts.clone(), mail.clone(), ledger.clone()), kept(&triggered).await);
        assert_eq!(counts.iter().map(|c| c.3).sum::<i64>(), 1000, "{counts:?}");
        assert_eq!(mail, (1..=450).collect::<Vec<_>>(), "the mail at or below the mark, and only it");
        assert_eq!(ledger.len(), 420, "both ledger batches, the second after the first's rowids");
    }

    /// The writer's triggers are on again after an import, whether it ended or stopped, and
    /// fire from the statements it prepared while they were off (a restore reuses them).
    #[tokio::test]
    async fn p14_the_writer_has_its_triggers_again_after_an_import_ends_or_stops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = fresh(&dir, "pcmail.db").await;
        store
            .write(|c| {
                c.execute_batch(
                    "CREATE TABLE probe (seq INTEGER); \
                     CREATE TRIGGER probe_insert AFTER INSERT ON mail BEGIN INSERT INTO probe VALUES (new.seq); END;",
                )
                .map_err(map_err)
            })
            .await
            .expect("a probe trigger");
        let probed = |s: SqliteStore| async move {
            s.write(|c| {
                let on = c.db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER).map_err(map_err)?;
                Ok((on, c.query_row("SELECT count(*) FROM probe", [], |r| r.get::<_, i64>(0)).map_err(map_err)?))
            })
            .await
            .expect("probe")
        };
        store.import_rows(batch("mail", 1..=64)).await.expect("one batch");
        assert_eq!(probed(store.clone()).await, (true, 0), "on after one batch, which fired nothing");
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(Incoming::Rows(batch("mail", 65..=70))).await.expect("send");
        drop(tx);
        let stopped = store.import_stream(rx).await.expect_err("a stream without its end");
        assert!(stopped.to_string().contains("stopped"), "{stopped}");
        assert_eq!(probed(store.clone()).await, (true, 0), "after a stopped stream");
        let twice = store.import_rows(batch("mail", 70..=70)).await.expect_err("a key twice");
        assert!(twice.to_string().contains("UNIQUE"), "{twice}");
        assert_eq!(probed(store.clone()).await, (true, 0), "after a batch that failed");
        let (counts, ..) = kept(&store).await;
        assert_eq!(counts.iter().map(|c| c.3).sum::<i64>(), 70, "each committed batch counted once: {counts:?}");
        // The same full 64-row statement the import prepared, run as a restore runs it.
        let again = batch("mail", 101..=164);
        store.write(move |c| super::super::insert_batch(c, &again)).await.expect("rows inserted with the triggers on");
        assert_eq!(probed(store.clone()).await, (true, 64), "the import's statement fires them again");
    }
}
