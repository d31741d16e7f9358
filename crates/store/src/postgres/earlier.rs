//! V5: every earlier PostgreSQL schema — a database built by migrations 1..=k and filled by
//! SQL valid at k — is opened by today's build, migrated, and answers every read as a database
//! of today's schema holding the same rows.

use super::conn::Conn;
use super::tests::{connect, scratch_url};
use super::{PgStore, schema};
use crate::contract::{everything, fill_every_tab};
use crate::transfer::TABS;

/// Each tab's columns in the database (none: the tab did not exist yet).
async fn shape(c: &mut Conn) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for (tab, _) in TABS {
        let rows = c
            .query(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
                &[tab],
            )
            .await
            .expect("columns");
        out.push((*tab, rows.iter().map(|r| r.get::<_, String>(0)).collect()));
    }
    out
}

/// Every row of every tab as JSON; the store's own `store/` keys stay the store's.
async fn rows_of(c: &mut Conn) -> Vec<(&'static str, Vec<String>)> {
    let mut out = Vec::new();
    for (tab, _) in TABS {
        let only = if *tab == "kv" { " WHERE key NOT LIKE 'store/%'" } else { "" };
        let rows = c.query(&format!("SELECT row_to_json(t)::text FROM {tab} t{only}"), &[]).await.expect("rows");
        out.push((*tab, rows.iter().map(|r| r.get::<_, String>(0)).collect()));
    }
    out
}

/// `rows` into the database through only the columns of `at` (an INSERT valid at that
/// schema); the rows written per tab.
async fn fill_as_at(
    c: &mut Conn,
    rows: &[(&'static str, Vec<String>)],
    at: &[(&'static str, Vec<String>)],
) -> Vec<(&'static str, usize)> {
    let mut out = Vec::new();
    for ((tab, columns), (_, json)) in at.iter().zip(rows).filter(|((_, columns), _)| !columns.is_empty()) {
        let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
        let sql = format!(
            "INSERT INTO {tab} ({list}) OVERRIDING SYSTEM VALUE SELECT {list} FROM json_populate_record(NULL::{tab}, $1::text::json)"
        );
        for row in json {
            c.execute(&sql, &[row]).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        out.push((*tab, json.len()));
    }
    out
}

#[tokio::test]
async fn v5_every_earlier_postgres_schema_opens_migrates_and_reads_as_today() {
    let (_today, today_url) = scratch_url().await;
    let store = PgStore::open(&today_url).await.expect("today");
    fill_every_tab(&store).await;
    drop(store);
    let rows = rows_of(&mut connect(&today_url).await).await;
    for k in 1..schema::MIGRATIONS.len() {
        let (_old, old_url) = scratch_url().await;
        let mut old = connect(&old_url).await;
        schema::run_migrations(&mut old, &schema::MIGRATIONS[..k]).await.expect("an earlier schema");
        let at_k = shape(&mut old).await;
        let copied = fill_as_at(&mut old, &rows, &at_k).await;
        assert!(copied.contains(&("mail", 3)) && copied.iter().all(|(_, n)| *n > 0), "rows in every tab: {copied:?}");
        let (_fresh, fresh_url) = scratch_url().await;
        drop(PgStore::open(&fresh_url).await.expect("today's schema"));
        assert_eq!(fill_as_at(&mut connect(&fresh_url).await, &rows, &at_k).await, copied, "schema {k}");
        let migrated = PgStore::open(&old_url).await.unwrap_or_else(|e| panic!("schema {k} migrates: {e}"));
        let reference = PgStore::open(&fresh_url).await.expect("reopen");
        assert_eq!(everything(&migrated).await, everything(&reference).await, "schema {k}");
        let version: i64 = old.query("SELECT version FROM pcmail_schema", &[]).await.expect("version")[0].get(0);
        assert_eq!(version, schema::MIGRATIONS.len() as i64, "schema {k} was migrated to today's");
    }
}

/// V5: expand-only for one release (see [`crate::contracting`]).
#[test]
fn v5_no_migration_drops_or_renames_a_table_or_a_column() {
    for (i, sql) in schema::MIGRATIONS.iter().enumerate() {
        assert_eq!(crate::contracting(sql), None, "PostgreSQL migration {}", i + 1);
    }
}
