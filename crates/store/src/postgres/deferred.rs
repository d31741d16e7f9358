//! P14: what a copy into PostgreSQL sets aside until its rows are in, the way `pg_restore`
//! loads data before it builds indexes. Kept up row by row, a million mails' secondary indexes
//! and per-row triggers cost five times the rows' own COPY; built once from the loaded table,
//! a b-tree is a sort.
//!
//! At the copy's start, in one transaction: the copied tabs' keys (primary and unique),
//! indexes (but mail's over its few open rows, [`KEPT_UP`]) and enabled triggers are written
//! down in the store's own `kv` and dropped or disabled (`mail_counts`, which mail's triggers
//! keep, is recounted at the end; nothing listens to a store being filled). At its end, in one
//! transaction: the keys and b-trees are built again and the triggers enabled from what was
//! written down, and the counts recounted. The search indexes (GIN over trigrams, ten seconds
//! for a million mails) are left to the indexer of the first `serve`, which builds them
//! `CONCURRENTLY` while the store serves: a search is the same `ILIKE` with or without them,
//! so it answers the same meanwhile, only slower (U5; a large one may reach its budget and say
//! it is truncated, T14).
//!
//! A copy stopped in between leaves a store marked unfinished, which `serve` refuses until it
//! is emptied — dropped and created, so the migrations build every index again.

use super::conn::{self, Conn, Pool};
use crate::{Result, StoreError, transfer};

/// The keys and b-tree indexes a copy dropped, until its end.
const DEFERRED_INDEXES_KEY: &str = "store/copy-deferred-indexes";

/// The search indexes a copy dropped, until the indexer has built them again.
const DEFERRED_SEARCH_KEY: &str = "store/copy-deferred-search";

/// Held (for the session) by the one replica building the deferred search indexes.
const SEARCH_BUILD_LOCK: i64 = 0x7063_6d61_696c_0002;

/// What a copy sets aside, in the order it is built again: each primary key and unique
/// constraint of a copied tab but `kv` (whose key the copy's own marks are written by), every
/// index of a copied tab that backs no constraint but [`KEPT_UP`], and each of their triggers
/// that is enabled (as it was: `ALWAYS` and `REPLICA` too). Each as its name, the statement
/// that drops or disables it, the one that builds or enables it, and whether it is a search
/// index (GIN).
const SET_ASIDE: &str = "SELECT name, drop_it, build_it, gin FROM ( \
     SELECT 0 AS step, c.conname::text AS name, \
       format('ALTER TABLE %I DROP CONSTRAINT %I', t.relname, c.conname) AS drop_it, \
       format('ALTER TABLE %I ADD CONSTRAINT %I %s', t.relname, c.conname, pg_get_constraintdef(c.oid)) AS build_it, \
       false AS gin \
     FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid \
     WHERE t.relnamespace = to_regnamespace(current_schema()) AND t.relname = ANY($1) \
       AND t.relname <> 'kv' AND c.contype IN ('p', 'u') \
     UNION ALL \
     SELECT 1, ix.oid::regclass::text, format('DROP INDEX %s', ix.oid::regclass), pg_get_indexdef(ix.oid), \
       am.amname = 'gin' \
     FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid JOIN pg_class ix ON ix.oid = i.indexrelid \
     JOIN pg_am am ON am.oid = ix.relam \
     WHERE t.relnamespace = to_regnamespace(current_schema()) AND t.relname = ANY($1) \
       AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) \
       AND NOT (t.relname = 'mail' AND ix.relname::text = ANY($2)) \
     UNION ALL \
     SELECT 2, g.tgname::text, format('ALTER TABLE %I DISABLE TRIGGER %I', t.relname, g.tgname), \
       format('ALTER TABLE %I ENABLE %s TRIGGER %I', t.relname, \
         CASE g.tgenabled WHEN 'A' THEN 'ALWAYS' WHEN 'R' THEN 'REPLICA' ELSE '' END, g.tgname), \
       false \
     FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid \
     WHERE t.relnamespace = to_regnamespace(current_schema()) AND t.relname = ANY($1) \
       AND NOT g.tgisinternal AND g.tgenabled <> 'D' \
   ) AS aside ORDER BY step, name";

/// Mail's indexes over its open rows, kept up row by row through a copy instead: open mail is
/// few by design (SLAs and expiry close it), so keeping them costs the load next to nothing,
/// while building one from the loaded table is a scan of all of it (0.1–0.2 s each for a
/// million mails). The external keys' index is not one of them: every intent keeps its key.
const KEPT_UP: &[&str] = &["mail_open_expiry", "mail_new_created", "mail_delivered_at", "mail_open_intents"];

/// `[name, statement that builds it]` pairs.
type Defs = Vec<(String, String)>;

/// At a copy's start, inside the caller's transaction. O3: a copy that finds another's list
/// (one under way, or one that stopped) goes no further; of two at once, the second to write
/// its list waits for the first's commit and fails on the key.
pub(super) async fn set_aside(c: &mut Conn) -> Result<()> {
    let tabs: Vec<&str> = transfer::TABS.iter().map(|(t, _)| *t).collect();
    let (mut btrees, mut search, mut drops) = (Defs::new(), Defs::new(), Vec::new());
    for row in c.query(SET_ASIDE, &[&tabs, &KEPT_UP]).await? {
        let (name, drop_it, build_it, gin): (String, String, String, bool) = (
            row.try_get(0).map_err(conn::map_err)?,
            row.try_get(1).map_err(conn::map_err)?,
            row.try_get(2).map_err(conn::map_err)?,
            row.try_get(3).map_err(conn::map_err)?,
        );
        drops.push(drop_it);
        if gin { &mut search } else { &mut btrees }.push((name, build_it));
    }
    let value = serde_json::to_string(&btrees).map_err(|e| StoreError::Backend(format!("the keys set aside: {e}")))?;
    let written = "INSERT INTO kv (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING";
    if c.execute(written, &[&DEFERRED_INDEXES_KEY, &value]).await? == 0 {
        return Err(StoreError::UnfinishedCopy);
    }
    write_down(c, DEFERRED_SEARCH_KEY, search).await?;
    // Triggers first, then indexes (none of them a constraint's), then the keys.
    for drop_it in drops.iter().rev() {
        c.batch(drop_it).await?;
    }
    Ok(())
}

/// At a copy's end, inside the caller's transaction: the keys and b-trees built again, the
/// triggers enabled, and the counts they keep recounted.
pub(super) async fn restore(c: &mut Conn) -> Result<()> {
    // A million keys sorted in memory rather than in runs on disk (the server's memory, for
    // this transaction only).
    c.batch("SET LOCAL maintenance_work_mem TO '256MB'; SET LOCAL statement_timeout TO 0").await?;
    for (_, build_it) in read(c, DEFERRED_INDEXES_KEY).await? {
        c.batch(&build_it).await?;
    }
    c.execute("DELETE FROM kv WHERE key = $1", &[&DEFERRED_INDEXES_KEY]).await?;
    c.batch(
        "DELETE FROM mail_counts; \
         INSERT INTO mail_counts (state, kind, channel, n) \
         SELECT state, kind, channel, count(*) FROM mail GROUP BY state, kind, channel",
    )
    .await
}

/// The indexer's part: builds the search indexes a copy left out, `CONCURRENTLY`, on a
/// connection of its own (its session lock goes with it if the build is stopped). One replica
/// builds; the others find the lock held and look again later. An index a stopped build left
/// invalid is dropped and built again. Answers whether any were still to build.
pub(super) async fn build_search(pool: &Pool) -> Result<bool> {
    let defs = read(&mut *pool.get().await?, DEFERRED_SEARCH_KEY).await?;
    if defs.is_empty() {
        return Ok(false);
    }
    let mut own = pool.dedicated().await?;
    // A role's statement_timeout would end each build part-way, and the next try would start
    // it again from the first row (this session's own setting, closed with it).
    own.batch("SET statement_timeout TO 0").await?;
    let locked = own.query("SELECT pg_try_advisory_lock($1)", &[&SEARCH_BUILD_LOCK]).await?;
    if !locked.first().map(|r| r.try_get::<_, bool>(0)).transpose().map_err(conn::map_err)?.unwrap_or(false) {
        return Ok(true);
    }
    for (name, def) in &defs {
        let valid = own.query("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)", &[name]).await?;
        match valid.first().map(|r| r.try_get::<_, bool>(0)).transpose().map_err(conn::map_err)? {
            Some(true) => continue,
            Some(false) => own.batch(&format!("DROP INDEX CONCURRENTLY {name}")).await?,
            None => {}
        }
        own.batch(&concurrently(def)?).await?;
    }
    own.execute("DELETE FROM kv WHERE key = $1", &[&DEFERRED_SEARCH_KEY]).await?;
    Ok(true)
}

/// `CREATE INDEX …` as `CREATE INDEX CONCURRENTLY …`, which lets the store serve while it runs.
fn concurrently(def: &str) -> Result<String> {
    def.strip_prefix("CREATE INDEX ")
        .map(|rest| format!("CREATE INDEX CONCURRENTLY {rest}"))
        .ok_or_else(|| StoreError::Backend(format!("a deferred search index is not a plain CREATE INDEX: {def}")))
}

/// `defs` under `key`, with any a stopped copy of the store's (emptied since) left there and
/// not built yet.
async fn write_down(c: &mut Conn, key: &str, mut defs: Defs) -> Result<()> {
    for left in read(c, key).await? {
        if !defs.iter().any(|(name, _)| *name == left.0) {
            defs.push(left);
        }
    }
    if defs.is_empty() {
        return Ok(());
    }
    let value = serde_json::to_string(&defs).map_err(|e| StoreError::Backend(format!("{key}: {e}")))?;
    c.execute(
        "INSERT INTO kv (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        &[&key, &value],
    )
    .await
    .map(drop)
}

async fn read(c: &mut Conn, key: &str) -> Result<Defs> {
    let rows = c.query("SELECT value FROM kv WHERE key = $1", &[&key]).await?;
    let Some(row) = rows.first() else {
        return Ok(Defs::new());
    };
    let value: String = row.try_get(0).map_err(conn::map_err)?;
    serde_json::from_str(&value).map_err(|e| StoreError::Backend(format!("{key} is not a list of indexes: {e}")))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{connect, scratch_url};
    use super::*;

    #[tokio::test]
    async fn p14_a_copy_keeps_mails_open_row_indexes_up_and_sets_its_other_indexes_aside() {
        let (_scratch, url) = scratch_url().await;
        drop(super::super::PgStore::open(&url).await.expect("open"));
        let mut c = connect(&url).await;
        let indexes = "SELECT indexname::text FROM pg_indexes \
             WHERE schemaname = current_schema() AND tablename = 'mail' ORDER BY 1";
        let names = |rows: Vec<tokio_postgres::Row>| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>();
        let before = names(c.query(indexes, &[]).await.expect("indexes"));
        assert!(before.len() > KEPT_UP.len() + 2, "mail has keys and other indexes: {before:?}");
        c.begin().await.expect("begin");
        set_aside(&mut c).await.expect("set aside");
        let mut kept: Vec<String> = KEPT_UP.iter().map(|s| s.to_string()).collect();
        kept.sort();
        assert_eq!(names(c.query(indexes, &[]).await.expect("indexes")), kept, "the open rows' indexes, and only they");
        c.finish(Err::<(), _>(StoreError::Backend("rolled back".into()))).await.expect_err("rolled back");
    }

    #[test]
    fn p14_a_deferred_search_index_is_built_concurrently_or_not_at_all() {
        assert_eq!(
            concurrently("CREATE INDEX mail_search ON public.mail USING gin (x)").expect("plain"),
            "CREATE INDEX CONCURRENTLY mail_search ON public.mail USING gin (x)"
        );
        assert!(concurrently("CREATE UNIQUE INDEX k ON public.mail (x)").is_err());
    }
}
