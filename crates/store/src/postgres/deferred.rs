//! P14: what a copy into PostgreSQL sets aside until its rows are in, the way `pg_restore`
//! loads data before it builds indexes. Kept up row by row, a million mails' secondary indexes
//! and per-row triggers cost five times the rows' own COPY; built once from the loaded table,
//! a b-tree is a sort.
//!
//! At the copy's start, in one transaction: the copied tabs' keys (primary and unique),
//! indexes (but mail's over its few open rows, [`KEPT_UP`]) and enabled triggers are written
//! down in the store's own `kv` and dropped or disabled (`mail_counts`, which mail's triggers
//! keep, is recounted at the end; nothing listens to a store being filled). At its end, every
//! index (a key's own too) is built again and `mail_counts` recounted in two
//! transactions side by side, largest tab first, each statement taken by the first lane free:
//! one index's sort and another's scan of the table overlap, where one after another they
//! left a core idle. Then, in one transaction, the keys are made constraints again over their
//! indexes (`USING INDEX`: no second build), the triggers enabled as they were, and the list
//! deleted. The search indexes (GIN over trigrams, ten seconds for a million mails) are left
//! to the indexer of the first `serve`, which builds them `CONCURRENTLY` while the store
//! serves: a search is the same `ILIKE` with or without them, so it answers the same
//! meanwhile, only slower (U5; a large one may reach its budget and say it is truncated, T14).
//!
//! A copy stopped in between leaves a store marked unfinished, which `serve` refuses until it
//! is emptied — dropped and created, so the migrations build every index again.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use super::conn::{self, Conn, Pool};
use crate::{Result, StoreError, transfer};

/// The keys and b-tree indexes a copy dropped, until its end.
const DEFERRED_INDEXES_KEY: &str = "store/copy-deferred-indexes";

/// The search indexes a copy dropped, until the indexer has built them again.
const DEFERRED_SEARCH_KEY: &str = "store/copy-deferred-search";

/// Held (for the session) by the one replica building the deferred search indexes.
const SEARCH_BUILD_LOCK: i64 = 0x7063_6d61_696c_0002;

/// What a copy sets aside: each primary key and unique constraint of a copied tab but `kv`
/// (whose key the copy's own marks are written by), every index of a copied tab that backs no
/// constraint but [`KEPT_UP`], and each of their triggers that is enabled (as it was: `ALWAYS`
/// and `REPLICA` too). Each as its name, its tab, the statement that drops or disables it, the
/// index that builds it again (a key's own index; none for a trigger), what then makes it
/// whole (the key's constraint over that index; the trigger enabled), and whether it is a
/// search index (GIN).
const SET_ASIDE: &str = "SELECT name, tab, drop_it, build_it, then_it, gin FROM ( \
     SELECT 0 AS step, c.conname::text AS name, t.relname::text AS tab, \
       format('ALTER TABLE %I DROP CONSTRAINT %I', t.relname, c.conname) AS drop_it, \
       pg_get_indexdef(c.conindid) AS build_it, \
       format('ALTER TABLE %I ADD CONSTRAINT %I %s USING INDEX %I%s%s', t.relname, c.conname, \
         CASE c.contype WHEN 'p' THEN 'PRIMARY KEY' ELSE 'UNIQUE' END, ix.relname, \
         CASE WHEN c.condeferrable THEN ' DEFERRABLE' ELSE '' END, \
         CASE WHEN c.condeferred THEN ' INITIALLY DEFERRED' ELSE '' END) AS then_it, \
       false AS gin \
     FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_class ix ON ix.oid = c.conindid \
     WHERE t.relnamespace = to_regnamespace(current_schema()) AND t.relname = ANY($1) \
       AND t.relname <> 'kv' AND c.contype IN ('p', 'u') \
     UNION ALL \
     SELECT 1, ix.oid::regclass::text, t.relname::text, format('DROP INDEX %s', ix.oid::regclass), \
       pg_get_indexdef(ix.oid), NULL, am.amname = 'gin' \
     FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid JOIN pg_class ix ON ix.oid = i.indexrelid \
     JOIN pg_am am ON am.oid = ix.relam \
     WHERE t.relnamespace = to_regnamespace(current_schema()) AND t.relname = ANY($1) \
       AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) \
       AND NOT (t.relname = 'mail' AND ix.relname::text = ANY($2)) \
     UNION ALL \
     SELECT 2, g.tgname::text, t.relname::text, format('ALTER TABLE %I DISABLE TRIGGER %I', t.relname, g.tgname), \
       NULL, format('ALTER TABLE %I ENABLE %s TRIGGER %I', t.relname, \
         CASE g.tgenabled WHEN 'A' THEN 'ALWAYS' WHEN 'R' THEN 'REPLICA' ELSE '' END, g.tgname), \
       false \
     FROM pg_trigger g JOIN pg_class t ON t.oid = g.tgrelid \
     WHERE t.relnamespace = to_regnamespace(current_schema()) AND t.relname = ANY($1) \
       AND NOT g.tgisinternal AND g.tgenabled <> 'D' \
   ) AS aside ORDER BY step, name";

/// `mail_counts` made again from the loaded table: one more statement of the lanes'.
const RECOUNT: &str = "DELETE FROM mail_counts; \
     INSERT INTO mail_counts (state, kind, channel, n) \
     SELECT state, kind, channel, count(*) FROM mail GROUP BY state, kind, channel";

/// Mail's indexes over its open rows, kept up row by row through a copy instead: open mail is
/// few by design (SLAs and expiry close it), so keeping them costs the load next to nothing,
/// while building one from the loaded table is a scan of all of it (0.1–0.2 s each for a
/// million mails). The external keys' index is not one of them: every intent keeps its key.
const KEPT_UP: &[&str] = &["mail_open_expiry", "mail_new_created", "mail_delivered_at", "mail_open_intents"];

/// `[name, statement that builds it]` pairs: the search indexes the indexer builds.
type Defs = Vec<(String, String)>;

/// One key, index or trigger a copy set aside, as written down in `kv` until the copy's end.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct SetAside {
    name: String,
    tab: String,
    /// The index that builds it again, in a lane ([`build_indexes`]).
    build: Option<String>,
    /// What makes it whole once every index is built ([`restore`]).
    then: Option<String>,
}

/// At a copy's start, inside the caller's transaction. O3: a copy that finds another's list
/// (one under way, or one that stopped) goes no further; of two at once, the second to write
/// its list waits for the first's commit and fails on the key.
pub(super) async fn set_aside(c: &mut Conn) -> Result<()> {
    let tabs: Vec<&str> = transfer::TABS.iter().map(|(t, _)| *t).collect();
    let (mut aside, mut search, mut drops) = (Vec::new(), Defs::new(), Vec::new());
    for row in c.query(SET_ASIDE, &[&tabs, &KEPT_UP]).await? {
        let (name, tab, drop_it, build, then, gin): (String, String, String, Option<String>, Option<String>, bool) = (
            row.try_get(0).map_err(conn::map_err)?,
            row.try_get(1).map_err(conn::map_err)?,
            row.try_get(2).map_err(conn::map_err)?,
            row.try_get(3).map_err(conn::map_err)?,
            row.try_get(4).map_err(conn::map_err)?,
            row.try_get(5).map_err(conn::map_err)?,
        );
        drops.push(drop_it);
        match (gin, build) {
            (true, Some(def)) => search.push((name, def)),
            (true, None) => return Err(StoreError::Backend(format!("the search index {name} has no definition"))),
            (false, build) => aside.push(SetAside { name, tab, build, then }),
        }
    }
    let value = serde_json::to_string(&aside).map_err(|e| StoreError::Backend(format!("the keys set aside: {e}")))?;
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

/// At a copy's end, before [`restore`]: the indexes set aside built again and `mail_counts`
/// recounted, in two transactions side by side ([`lane_work`]'s order, each statement taken by
/// the first lane free). Two keep two cores busy: a million mails' b-trees took 2.7 s one
/// after another and 2.2 s in two lanes; PostgreSQL's own parallel workers still help each
/// build where the server has more. A lane that fails ends the other, its running statement
/// cancelled and its transaction rolled back; what a lane committed before stays, in a store
/// still marked unfinished.
pub(super) async fn build_indexes(pool: &Pool) -> Result<()> {
    let mut c = pool.get().await?;
    let aside: Vec<SetAside> = read(&mut c, DEFERRED_INDEXES_KEY).await?;
    let tabs: Vec<&str> = transfer::TABS.iter().map(|(t, _)| *t).collect();
    // A tab's name is its table's alone in the schema (no index or view can share it).
    let largest_first = "SELECT relname::text FROM pg_class \
         WHERE relnamespace = to_regnamespace(current_schema()) AND relname = ANY($1) \
         ORDER BY pg_relation_size(oid) DESC, relname";
    let by_size = c.query(largest_first, &[&tabs]).await?;
    let by_size = by_size.iter().map(|r| r.try_get(0)).collect::<Result<Vec<String>, _>>().map_err(conn::map_err)?;
    drop(c);
    let work = Mutex::new(lane_work(&aside, &by_size));
    tokio::try_join!(lane(pool, &work), lane(pool, &work)).map(drop)
}

/// The statements of [`build_indexes`]' lanes: each index set aside, the largest tab's first
/// (its few large builds are then spread over the lanes, the many small ones fill in after),
/// and mail's recount with mail's builds.
fn lane_work(aside: &[SetAside], tabs_largest_first: &[String]) -> VecDeque<String> {
    let rank = |tab: &str| tabs_largest_first.iter().position(|t| t == tab).unwrap_or(usize::MAX);
    let mut work: Vec<(usize, &str)> =
        aside.iter().filter_map(|a| a.build.as_deref().map(|build| (rank(&a.tab), build))).collect();
    work.push((rank("mail"), RECOUNT));
    // Stable: a tab's statements keep the list's order.
    work.sort_by_key(|(rank, _)| *rank);
    work.into_iter().map(|(_, sql)| sql.to_string()).collect()
}

/// One lane: statements taken from `work` until none is left, in one transaction. Dropped
/// (the other lane failed), it cancels the statement it is running.
async fn lane(pool: &Pool, work: &Mutex<VecDeque<String>>) -> Result<()> {
    let mut c = pool.get().await?;
    let cancel = c.cancel_on_drop();
    c.begin().await?;
    let outcome = async {
        // A million keys sorted in memory rather than in runs on disk (the server's memory, up
        // to 256 MB a lane, for these transactions only).
        c.batch("SET LOCAL maintenance_work_mem TO '256MB'; SET LOCAL statement_timeout TO 0").await?;
        loop {
            let next = work.lock().unwrap_or_else(PoisonError::into_inner).pop_front();
            let Some(sql) = next else { return Ok(()) };
            c.batch(&sql).await?;
        }
    }
    .await;
    let built = c.finish(outcome).await;
    cancel.disarm();
    built
}

/// At a copy's end, after [`build_indexes`], inside the caller's transaction: the keys made
/// constraints again over the indexes built for them, the triggers enabled as they were, and
/// the list deleted.
pub(super) async fn restore(c: &mut Conn) -> Result<()> {
    let aside: Vec<SetAside> = read(c, DEFERRED_INDEXES_KEY).await?;
    for then in aside.iter().filter_map(|a| a.then.as_deref()) {
        c.batch(then).await?;
    }
    c.execute("DELETE FROM kv WHERE key = $1", &[&DEFERRED_INDEXES_KEY]).await.map(drop)
}

/// The indexer's part: builds the search indexes a copy left out, `CONCURRENTLY`, on a
/// connection of its own (its session lock goes with it if the build is stopped). One replica
/// builds; the others find the lock held and look again later. An index a stopped build left
/// invalid is dropped and built again. Answers whether any were still to build.
pub(super) async fn build_search(pool: &Pool) -> Result<bool> {
    let defs: Defs = read(&mut *pool.get().await?, DEFERRED_SEARCH_KEY).await?;
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
    for left in read::<(String, String)>(c, key).await? {
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

/// The list written down under `key`; none if there is no such key.
async fn read<T: serde::de::DeserializeOwned>(c: &mut Conn, key: &str) -> Result<Vec<T>> {
    let rows = c.query("SELECT value FROM kv WHERE key = $1", &[&key]).await?;
    let Some(row) = rows.first() else {
        return Ok(Vec::new());
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
    fn p14_a_copys_indexes_are_built_largest_tab_first_with_mails_recount_and_no_trigger() {
        let aside = |name: &str, tab: &str, build: Option<&str>| SetAside {
            name: name.into(),
            tab: tab.into(),
            build: build.map(String::from),
            then: Some(format!("then {name}")),
        };
        let list = [
            aside("jobs_pkey", "jobs", Some("build jobs_pkey")),
            aside("mail_pkey", "mail", Some("build mail_pkey")),
            aside("odd", "not_sized", Some("build odd")),
            aside("jobs_announce", "jobs", None),
            aside("mail_to_seq", "mail", Some("build mail_to_seq")),
            aside("ledger_key", "ledger", Some("build ledger_key")),
        ];
        let sizes = ["mail", "ledger", "jobs"].map(String::from);
        let work: Vec<String> = lane_work(&list, &sizes).into();
        assert_eq!(
            work,
            ["build mail_pkey", "build mail_to_seq", RECOUNT, "build ledger_key", "build jobs_pkey", "build odd"]
        );
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
