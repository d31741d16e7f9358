//! U5 and T14 on SQLite: candidates in the order of the answer, each tested by the core's
//! `Needle` until the limit, the budget or the asker's going away. A machine's candidates are
//! only its own mail, walked down the `from`/`to` indexes, so mail it may not read is never
//! read at all: it costs the search nothing and tells it nothing. Everyone's mail and the
//! ledger are narrowed by the FTS5 trigram tables first. Measured against the alternatives
//! (300 mails of 65,000 `Z` in another machine's box, 200 `Z` searched): the phrase MATCH then
//! a filter took 42 s; a parties column ANDed inside the MATCH still ran FTS5's phrase test on
//! foreign rows whenever its own rows lacked the trigrams (14.5 s); a rowid-bound MATCH per own
//! row tests the first foreign match on every probe (63 s). The own-index walk took 1 ms.
//! P13: the mail index is filled off the send path (`index_batch`, run by serve's indexer);
//! everyone's mail is searched above the index's mark row by row, below it through the index.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use pcmail_core::search::{self, Needle};
use rusqlite::{Connection, InterruptHandle, TransactionBehavior, params_from_iter};

use super::map_err;
use crate::codec::{self, LEDGER_COLUMNS, MAIL_COLUMNS};
use crate::{Found, IndexBehind, Result, Search};

/// A machine's own mail, newest first: the two parties' indexes, never another row.
const OWN_MAIL: &str = "SELECT seq, subject, body FROM mail WHERE seq IN \
    (SELECT seq FROM mail WHERE \"from\" = ?1 UNION ALL SELECT seq FROM mail WHERE \"to\" = ?1) ORDER BY seq DESC";
const INDEXED_MAIL: &str =
    "SELECT rowid, subject, body FROM mail_search WHERE mail_search MATCH ?1 ORDER BY rowid DESC";
/// P13: the index's mark — it holds exactly the mail at or below it (migration 11).
pub(super) const MARK: &str = "SELECT through FROM search_indexed WHERE tab = 'mail'";
/// P13: the mail stored since the index's last batch, newest first: every number above the mark.
const UNINDEXED_MAIL: &str = "SELECT seq, subject, body FROM mail \
    WHERE seq > (SELECT through FROM search_indexed WHERE tab = 'mail') ORDER BY seq DESC";
const NEWEST_MAIL: &str = "SELECT coalesce(max(seq), 0) FROM mail";
const ALL_MAIL: &str = "SELECT seq, subject, body FROM mail ORDER BY seq DESC";
const INDEXED_ROWS: &str = "SELECT rowid, task, content FROM ledger WHERE rowid IN \
    (SELECT rowid FROM ledger_search WHERE ledger_search MATCH ?1) ORDER BY project, seq";
const ALL_ROWS: &str = "SELECT rowid, task, content FROM ledger ORDER BY project, seq";

/// The asker of a search, as its blocking work sees it: gone once its future is dropped, and
/// then the connection's running statement is interrupted.
#[derive(Default)]
pub(super) struct Asker {
    gone: AtomicBool,
    running: Mutex<Option<InterruptHandle>>,
}

impl Asker {
    /// The connection a search runs on, until `release`.
    pub(super) fn attach(&self, conn: &Connection) {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) = Some(conn.get_interrupt_handle());
    }

    /// Before the connection goes back to the pool: a later hang-up must not interrupt its next user.
    pub(super) fn release(&self) {
        self.running.lock().unwrap_or_else(PoisonError::into_inner).take();
    }

    fn gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }
}

/// Held by the search's future: dropping it (a client that hung up) stops the blocking work.
pub(super) struct HangUp(pub(super) Arc<Asker>);

impl Drop for HangUp {
    fn drop(&mut self) {
        self.0.gone.store(true, Ordering::Relaxed);
        if let Some(handle) = self.0.running.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            handle.interrupt();
        }
    }
}

pub(super) fn run(conn: &Connection, s: &Search, asker: &Asker, started: Instant) -> Result<Found> {
    // One snapshot: the indexer moving its mark between the tail and the index would show a
    // mail twice.
    let snapshot = conn.unchecked_transaction().map_err(map_err)?;
    let needle = Needle::new(&s.text);
    let terms = search::trigrams(&s.text);
    let index = (!terms.is_empty()).then(|| fts_query(&terms));
    let mut stop = || asker.gone() || s.budget.left(started.elapsed()).is_none();
    let mut found = Found::default();
    if s.mail {
        let scan = match (&s.machine, &index) {
            (Some(machine), _) => candidates(&snapshot, OWN_MAIL, Some(machine.clone()), &needle, s.limit, &mut stop)?,
            (None, Some(q)) => {
                let (scan, behind) = indexed_mail(&snapshot, q, &needle, s.limit, &mut stop)?;
                found.behind = behind;
                scan
            }
            (None, None) => candidates(&snapshot, ALL_MAIL, None, &needle, s.limit, &mut stop)?,
        };
        found.truncated |= scan.truncated;
        let cols = format!("SELECT {MAIL_COLUMNS} FROM mail WHERE seq IN ({{keys}}) ORDER BY seq DESC");
        found.mail = by_keys(&snapshot, &cols, &scan.found, codec::mail)?;
    }
    if s.ledger {
        let sql = if index.is_some() { INDEXED_ROWS } else { ALL_ROWS };
        let scan = candidates(&snapshot, sql, index, &needle, s.limit, &mut stop)?;
        found.truncated |= scan.truncated;
        let cols = format!("SELECT {LEDGER_COLUMNS} FROM ledger WHERE rowid IN ({{keys}}) ORDER BY project, seq");
        found.rows = by_keys(&snapshot, &cols, &scan.found, codec::ledger_row)?;
    }
    Ok(found)
}

/// P13: everyone's mail holding the text — first the mail above the index's mark, read row by
/// row (all newer than anything indexed, so the order stays newest first), then the index's
/// candidates; answers the scan and how many mails the index did not hold yet.
fn indexed_mail(
    conn: &Connection,
    query: &str,
    needle: &Needle,
    limit: usize,
    mut stop: impl FnMut() -> bool,
) -> Result<(search::Scan<i64>, u64)> {
    let behind = unindexed(conn)?;
    let mut tail = candidates(conn, UNINDEXED_MAIL, None, needle, limit, &mut stop)?;
    if tail.truncated || tail.found.len() >= limit {
        return Ok((tail, behind));
    }
    let rest = candidates(conn, INDEXED_MAIL, Some(query.to_string()), needle, limit - tail.found.len(), stop)?;
    tail.found.extend(rest.found);
    tail.truncated = rest.truncated;
    Ok((tail, behind))
}

fn unindexed(conn: &Connection) -> Result<u64> {
    let sql = format!("SELECT count(*) FROM ({UNINDEXED_MAIL})");
    let n: i64 = conn.prepare_cached(&sql).and_then(|mut st| st.query_row([], |r| r.get(0))).map_err(map_err)?;
    Ok(n.max(0) as u64)
}

/// P13: the indexer's one batch (see [`pcmail_core::search::index_due`]): the mail after the
/// mark into the index and the mark moved past it, in one transaction; nothing is written when
/// nothing is due. Answers the sequence numbers still above the mark.
pub(super) fn index_batch(conn: &mut Connection, batch: i64) -> Result<IndexBehind> {
    let marks = |c: &Connection| -> Result<(i64, i64)> {
        let through: i64 = c.prepare_cached(MARK).and_then(|mut st| st.query_row([], |r| r.get(0))).map_err(map_err)?;
        let newest: i64 =
            c.prepare_cached(NEWEST_MAIL).and_then(|mut st| st.query_row([], |r| r.get(0))).map_err(map_err)?;
        Ok((through, newest))
    };
    let (through, newest) = marks(conn)?;
    if search::index_due(through, newest, batch).is_none() {
        return Ok(IndexBehind::default());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(map_err)?;
    let (through, newest) = marks(&tx)?;
    let Some((after, upto)) = search::index_due(through, newest, batch) else {
        return Ok(IndexBehind::default());
    };
    tx.prepare_cached(
        "INSERT INTO mail_search (rowid, subject, body) SELECT seq, subject, body FROM mail WHERE seq > ?1 AND seq <= ?2",
    )
    .and_then(|mut st| st.execute([after, upto]))
    .map_err(map_err)?;
    tx.prepare_cached("UPDATE search_indexed SET through = ?1 WHERE tab = 'mail'")
        .and_then(|mut st| st.execute([upto]))
        .map_err(map_err)?;
    tx.commit().map_err(map_err)?;
    Ok(IndexBehind { seqs: u64::try_from(newest - upto).unwrap_or(0), building: false })
}

/// An FTS5 query for rows holding every trigram, by rowid alone: no phrase is tested inside
/// FTS5, whose position matching is quadratic in a run of one letter; the needle tests the text.
fn fts_query(terms: &[String]) -> String {
    terms.iter().map(|t| format!("\"{}\"", t.replace('"', "\"\""))).collect::<Vec<_>>().join(" AND ")
}

fn candidates(
    conn: &Connection,
    sql: &str,
    arg: Option<String>,
    needle: &Needle,
    limit: usize,
    stop: impl FnMut() -> bool,
) -> Result<search::Scan<i64>> {
    let mut stmt = conn.prepare_cached(sql).map_err(map_err)?;
    let rows = stmt
        .query_map(params_from_iter(arg), |r| Ok((r.get::<_, i64>(0)?, vec![r.get::<_, String>(1)?, r.get(2)?])))
        .map_err(map_err)?;
    search::scan(rows.map(|r| r.map_err(map_err)), needle, limit, stop)
}

/// The rows of `keys` (integers the store itself numbered), read whole by `sql`'s `{keys}`.
fn by_keys<T>(
    conn: &Connection,
    sql: &str,
    keys: &[i64],
    decode: fn(&dyn codec::Columns) -> Result<T>,
) -> Result<Vec<T>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = keys.iter().map(i64::to_string).collect();
    // Not cached: its text differs with every answer.
    let mut stmt = conn.prepare(&sql.replace("{keys}", &list.join(","))).map_err(map_err)?;
    let mut rows = stmt.query([]).map_err(map_err)?;
    let mut out = Vec::with_capacity(keys.len());
    while let Some(row) = rows.next().map_err(map_err)? {
        out.push(decode(row)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn p13_the_index_holds_exactly_the_mail_at_or_below_its_mark() {
        use crate::Store;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = super::super::SqliteStore::open(dir.path().join("pcmail.db")).await.expect("open");
        let mail = |n: u32| pcmail_core::mail::Mail {
            subject: format!("subject {n}"),
            ..pcmail_core::mail::Mail::new(
                format!("mail--{n:08x}"),
                "a".into(),
                "b".into(),
                Default::default(),
                Default::default(),
            )
        };
        let insert = |ns: Vec<u32>| {
            let mails: Vec<_> = ns.into_iter().map(mail).collect();
            store.mail_transaction(crate::MailSelect::Ids(vec![]), move |_| {
                (crate::MailWrites { insert: mails, ..Default::default() }, ())
            })
        };
        insert(vec![1, 2, 3]).await.expect("insert");
        let held = || {
            store.read(|conn| {
                let sql = "SELECT rowid FROM mail_search WHERE mail_search MATCH '\"subj\"' ORDER BY rowid";
                let mut stmt = conn.prepare(sql).map_err(map_err)?;
                let rows = stmt.query_map([], |r| r.get::<_, i64>(0)).map_err(map_err)?;
                rows.map(|r| r.map_err(map_err)).collect::<Result<Vec<i64>>>()
            })
        };
        assert_eq!(held().await.expect("held"), Vec::<i64>::new(), "a send writes no index");
        assert_eq!(store.index_search(2).await.expect("batch").seqs, 1);
        assert_eq!(held().await.expect("held"), vec![1, 2]);
        store
            .write(|conn| conn.execute("DELETE FROM mail WHERE seq IN (2, 3)", []).map_err(map_err))
            .await
            .expect("delete");
        assert_eq!(held().await.expect("held"), vec![1], "an indexed mail leaves with its row");
        assert_eq!(store.index_search(2).await.expect("batch").seqs, 0, "nothing left above the mark");
        insert(vec![4]).await.expect("insert");
        assert_eq!(store.index_search(10).await.expect("batch").seqs, 0);
        assert_eq!(held().await.expect("held"), vec![1, 4]);
    }

    #[tokio::test]
    async fn t14_search_a_machines_scope_is_its_own_indexes_never_a_scan_of_mail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = super::super::SqliteStore::open(dir.path().join("pcmail.db")).await.expect("open");
        let plan = store
            .read(|conn| {
                let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {OWN_MAIL}")).map_err(map_err)?;
                let rows = stmt.query_map(["desk"], |r| r.get::<_, String>(3)).map_err(map_err)?;
                rows.map(|r| r.map_err(map_err)).collect::<Result<Vec<String>>>()
            })
            .await
            .expect("plan");
        let plan = plan.join("\n");
        assert!(plan.contains("mail_from_seq (from=?)") && plan.contains("mail_to_seq (to=?)"), "{plan}");
        assert!(!plan.contains("SCAN mail") && !plan.contains("TEMP B-TREE"), "no other row, no sort: {plan}");
    }
}
