//! V5: every earlier SQLite schema — a store built by migrations 1..=k and filled by SQL valid
//! at k — is opened by today's build, migrated, and answers every read as a store of today's
//! schema holding the same rows.

use rusqlite::Connection;

use super::{SqliteStore, schema};
use crate::contract::{everything, fill_every_tab};

#[tokio::test]
async fn v5_every_earlier_sqlite_schema_opens_migrates_and_reads_as_today() {
    let dir = tempfile::tempdir().expect("tempdir");
    let today = dir.path().join("today.db");
    let store = SqliteStore::open(&today).await.expect("today");
    fill_every_tab(&store).await;
    drop(store);
    for k in 1..schema::MIGRATIONS.len() {
        let (old, fresh) = (dir.path().join(format!("v{k}.db")), dir.path().join(format!("today-{k}.db")));
        schema::create_at(&old, k).expect("an earlier schema");
        let copied = schema::copy_rows_as_at(&old, &today, &old).expect("rows as at k");
        assert!(copied.contains(&("mail", 3)) && copied.iter().all(|(_, n)| *n > 0), "rows in every tab: {copied:?}");
        // Today's schema, the same rows through the same columns (the later ones at their defaults).
        drop(SqliteStore::open(&fresh).await.expect("today's schema"));
        assert_eq!(schema::copy_rows_as_at(&fresh, &today, &old).expect("rows"), copied, "schema {k}");
        let migrated = SqliteStore::open(&old).await.unwrap_or_else(|e| panic!("schema {k} migrates: {e}"));
        let reference = SqliteStore::open(&fresh).await.expect("reopen");
        assert_eq!(everything(&migrated).await, everything(&reference).await, "schema {k}");
        let (found, known) = schema::versions(&Connection::open(&old).expect("open")).expect("version");
        assert_eq!(found, known, "schema {k} was migrated to today's");
    }
}

/// V5: expand-only for one release — no migration drops or renames a table or a column, so
/// the previous release still finds every one it reads (an index may go: it holds no data).
#[test]
fn v5_no_migration_drops_or_renames_a_table_or_a_column() {
    for (i, sql) in schema::MIGRATIONS.iter().enumerate() {
        assert_eq!(crate::contracting(sql), None, "SQLite migration {}", i + 1);
    }
}
