//! Forward-only migrations (I6) and the check that every column the code reads exists.

use pcmail_core::version::{SchemaFit, newer_schema, schema_fit};
use rusqlite::Connection;

use crate::codec::REQUIRED;
use crate::{Result, StoreError};

/// Applied in order; `PRAGMA user_version` counts how many ran. Never edit a shipped entry:
/// append a new one.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: the spine — mail, specs, events, alerts, machines, tokens.
    r#"
    CREATE TABLE mail (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        "from" TEXT NOT NULL,
        "to" TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        urgent INTEGER NOT NULL,
        auto INTEGER NOT NULL,
        hop INTEGER NOT NULL,
        reply_to TEXT,
        channel TEXT NOT NULL,
        external_key TEXT,
        state TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        delivered_at INTEGER,
        delivered_by TEXT,
        seen_at INTEGER,
        seen_by TEXT,
        done_at INTEGER,
        result TEXT,
        fail_reason TEXT,
        presented_at INTEGER,
        presented_session TEXT,
        last_reminded_at INTEGER
    );
    CREATE INDEX mail_to_seq ON mail("to", seq);
    CREATE INDEX mail_from_seq ON mail("from", seq);
    CREATE INDEX mail_open_expiry ON mail(expires_at) WHERE state IN ('new', 'delivered', 'seen');
    CREATE UNIQUE INDEX mail_external_key ON mail(external_key) WHERE external_key IS NOT NULL;

    CREATE TABLE specs (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        labels TEXT NOT NULL,
        generation INTEGER NOT NULL,
        spec TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (kind, name)
    );

    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at INTEGER NOT NULL,
        object TEXT NOT NULL,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        actor TEXT NOT NULL
    );
    CREATE INDEX events_object ON events(object, id);

    CREATE INDEX mail_new_created ON mail(created_at) WHERE state = 'new';
    CREATE INDEX mail_delivered_at ON mail(delivered_at) WHERE state = 'delivered';
    CREATE INDEX mail_open_intents ON mail(created_at) WHERE kind = 'intent' AND state IN ('new', 'delivered', 'seen');

    -- Counts per (state, kind, channel), kept by triggers so that /metrics and the idle sweep
    -- never scan the mail table.
    CREATE TABLE mail_counts (
        state TEXT NOT NULL,
        kind TEXT NOT NULL,
        channel TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (state, kind, channel)
    );
    CREATE TRIGGER mail_counts_insert AFTER INSERT ON mail BEGIN
        INSERT INTO mail_counts (state, kind, channel, n) VALUES (NEW.state, NEW.kind, NEW.channel, 1)
            ON CONFLICT(state, kind, channel) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER mail_counts_update AFTER UPDATE OF state, kind, channel ON mail
        WHEN OLD.state IS NOT NEW.state OR OLD.kind IS NOT NEW.kind OR OLD.channel IS NOT NEW.channel BEGIN
        UPDATE mail_counts SET n = n - 1 WHERE state = OLD.state AND kind = OLD.kind AND channel = OLD.channel;
        INSERT INTO mail_counts (state, kind, channel, n) VALUES (NEW.state, NEW.kind, NEW.channel, 1)
            ON CONFLICT(state, kind, channel) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER mail_counts_delete AFTER DELETE ON mail BEGIN
        UPDATE mail_counts SET n = n - 1 WHERE state = OLD.state AND kind = OLD.kind AND channel = OLD.channel;
    END;

    CREATE TABLE alerts (
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        state TEXT NOT NULL,
        summary TEXT NOT NULL,
        labels TEXT NOT NULL,
        firing_since INTEGER NOT NULL,
        resolved_at INTEGER,
        notified TEXT,
        last_sent_at INTEGER,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (kind, subject)
    );
    CREATE INDEX alerts_firing ON alerts(kind) WHERE state = 'firing';
    CREATE INDEX alerts_unnotified ON alerts(updated_at) WHERE notified IS NOT state;

    CREATE TABLE machines (
        name TEXT PRIMARY KEY,
        last_poll_at INTEGER NOT NULL
    );

    CREATE TABLE tokens (
        machine TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL
    );
    "#,
    // 2: the task ledger (seed 001) and a small key/value table for controller cursors.
    r#"
    CREATE TABLE ledger (
        project TEXT NOT NULL,
        id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        run_requested INTEGER NOT NULL,
        task TEXT NOT NULL,
        content TEXT NOT NULL,
        source TEXT NOT NULL,
        evidence TEXT NOT NULL,
        due TEXT NOT NULL,
        assignee TEXT NOT NULL,
        function TEXT NOT NULL,
        result TEXT NOT NULL,
        executed_at INTEGER,
        instruction TEXT NOT NULL,
        key TEXT NOT NULL,
        failures INTEGER NOT NULL,
        refresh INTEGER NOT NULL,
        PRIMARY KEY (project, id)
    );
    CREATE UNIQUE INDEX ledger_key ON ledger(project, key);
    CREATE INDEX ledger_requested ON ledger(project, seq) WHERE run_requested = 1;
    CREATE INDEX ledger_open ON ledger(project, state, seq) WHERE state IN ('todo', 'running', 'review');
    CREATE TABLE ledger_projects (project TEXT PRIMARY KEY, next_seq INTEGER NOT NULL);
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    "#,
    // 3: the job queue. `seq` is insertion order, the tie-breaker of the claim order.
    r#"
    CREATE TABLE jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        queue TEXT NOT NULL,
        function TEXT NOT NULL,
        payload TEXT NOT NULL,
        state TEXT NOT NULL,
        priority INTEGER NOT NULL,
        attempts INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        run_after INTEGER NOT NULL,
        lease_owner TEXT,
        lease_token TEXT,
        lease_expires_at INTEGER,
        heartbeat_at INTEGER,
        rescues INTEGER NOT NULL,
        last_error TEXT,
        result TEXT,
        unique_key TEXT,
        ledger_ref TEXT,
        created_at INTEGER NOT NULL,
        finished_at INTEGER
    );
    CREATE INDEX jobs_claim ON jobs(queue, priority DESC, run_after, seq) WHERE state = 'queued';
    CREATE INDEX jobs_leases ON jobs(lease_expires_at) WHERE state = 'running';
    CREATE UNIQUE INDEX jobs_unique ON jobs(unique_key)
        WHERE unique_key IS NOT NULL AND state IN ('queued', 'running', 'failed');
    "#,
    // 4: the leader lease (C1). One process per SQLite file leads at once, as on PostgreSQL.
    r#"
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        acquired_at INTEGER NOT NULL,
        renewed_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    );
    "#,
    // 5: who enqueued a job (T2: a machine lists the jobs it enqueued or claimed).
    r#"
    ALTER TABLE jobs ADD COLUMN enqueued_by TEXT;
    CREATE INDEX jobs_enqueued_by ON jobs(enqueued_by, seq) WHERE enqueued_by IS NOT NULL;
    "#,
    // 6: the store's identity (E5), drawn once with its schema: a PC whose cursor belongs to
    // another store starts again from 0.
    r#"
    INSERT OR IGNORE INTO kv (key, value) VALUES ('store/identity', lower(hex(randomblob(16))));
    "#,
    // 7: retention (E7) finds what to prune through an index, however large the tabs.
    r#"
    CREATE INDEX mail_closed ON mail(coalesce(done_at, expires_at)) WHERE state IN ('done', 'failed', 'expired');
    CREATE INDEX jobs_finished ON jobs(queue, finished_at) WHERE state IN ('succeeded', 'dead', 'cancelled');
    CREATE INDEX jobs_finished_at ON jobs(finished_at) WHERE state IN ('succeeded', 'dead', 'cancelled');
    CREATE INDEX events_at ON events(at);
    "#,
    // 8: full-text search (U5) over mail subject and body and ledger task and content, Japanese
    // included: FTS5 trigram indexes over the tabs, kept by triggers in the writing transaction.
    r#"
    CREATE VIRTUAL TABLE mail_search USING fts5(subject, body, content='mail', content_rowid='seq', tokenize='trigram');
    CREATE TRIGGER mail_search_insert AFTER INSERT ON mail BEGIN
        INSERT INTO mail_search (rowid, subject, body) VALUES (new.seq, new.subject, new.body);
    END;
    CREATE TRIGGER mail_search_delete AFTER DELETE ON mail BEGIN
        INSERT INTO mail_search (mail_search, rowid, subject, body) VALUES ('delete', old.seq, old.subject, old.body);
    END;
    CREATE TRIGGER mail_search_update AFTER UPDATE OF subject, body ON mail BEGIN
        INSERT INTO mail_search (mail_search, rowid, subject, body) VALUES ('delete', old.seq, old.subject, old.body);
        INSERT INTO mail_search (rowid, subject, body) VALUES (new.seq, new.subject, new.body);
    END;
    INSERT INTO mail_search (mail_search) VALUES ('rebuild');
    CREATE VIRTUAL TABLE ledger_search USING fts5(task, content, content='ledger', tokenize='trigram');
    CREATE TRIGGER ledger_search_insert AFTER INSERT ON ledger BEGIN
        INSERT INTO ledger_search (rowid, task, content) VALUES (new.rowid, new.task, new.content);
    END;
    CREATE TRIGGER ledger_search_delete AFTER DELETE ON ledger BEGIN
        INSERT INTO ledger_search (ledger_search, rowid, task, content) VALUES ('delete', old.rowid, old.task, old.content);
    END;
    CREATE TRIGGER ledger_search_update AFTER UPDATE OF task, content ON ledger BEGIN
        INSERT INTO ledger_search (ledger_search, rowid, task, content) VALUES ('delete', old.rowid, old.task, old.content);
        INSERT INTO ledger_search (rowid, task, content) VALUES (new.rowid, new.task, new.content);
    END;
    INSERT INTO ledger_search (ledger_search) VALUES ('rebuild');
    "#,
    // 9: T12 and E12 — a unique key is scoped to its enqueuer unless its pool shares keys, so
    // two machines may each hold one, and a finished job holds it for the asker's uniqueFor; the
    // planner decides in the writing transaction (one writer), the index only finds the holders.
    r#"
    DROP INDEX jobs_unique;
    CREATE INDEX jobs_unique_key ON jobs(unique_key) WHERE unique_key IS NOT NULL;
    "#,
    // 10: V1 — each machine's last client version, from its polls' User-Agent.
    r#"
    ALTER TABLE machines ADD COLUMN client TEXT NOT NULL DEFAULT '';
    "#,
    // 11: P13 — the mail index off the send path. It holds exactly the mail at or below its
    // mark (`search_indexed`), taken in batches by the indexer of serve; a search reads the
    // mail above it directly. Mail at or below the mark (a reused number) joins at once, and
    // leaves with its row; mail above it is never in the index. The mark belongs to this file:
    // no copy carries it (a copied store's index is rebuilt by its own indexer).
    r#"
    CREATE TABLE search_indexed (tab TEXT PRIMARY KEY, through INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO search_indexed (tab, through) VALUES ('mail', coalesce((SELECT max(seq) FROM mail), 0));
    DROP TRIGGER mail_search_insert;
    DROP TRIGGER mail_search_delete;
    DROP TRIGGER mail_search_update;
    CREATE TRIGGER mail_search_insert AFTER INSERT ON mail
        WHEN new.seq <= (SELECT through FROM search_indexed WHERE tab = 'mail') BEGIN
        INSERT INTO mail_search (rowid, subject, body) VALUES (new.seq, new.subject, new.body);
    END;
    CREATE TRIGGER mail_search_delete AFTER DELETE ON mail
        WHEN old.seq <= (SELECT through FROM search_indexed WHERE tab = 'mail') BEGIN
        INSERT INTO mail_search (mail_search, rowid, subject, body) VALUES ('delete', old.seq, old.subject, old.body);
    END;
    CREATE TRIGGER mail_search_update AFTER UPDATE OF subject, body ON mail
        WHEN old.seq <= (SELECT through FROM search_indexed WHERE tab = 'mail') BEGIN
        INSERT INTO mail_search (mail_search, rowid, subject, body) VALUES ('delete', old.seq, old.subject, old.body);
        INSERT INTO mail_search (rowid, subject, body) VALUES (new.seq, new.subject, new.body);
    END;
    "#,
    // 12: P2 — a partial index over a set of states says it as an OR chain (`names::sql_any`).
    // SQLite evaluates an index's predicate on every row a statement writes, and a constant IN
    // list of three builds a temporary b-tree each time the statement runs: an expiry's UPDATE
    // built six a mail (each index's old and new row), a job's update four and its insert two.
    r#"
    DROP INDEX mail_open_expiry;
    CREATE INDEX mail_open_expiry ON mail(expires_at) WHERE (state = 'new' OR state = 'delivered' OR state = 'seen');
    DROP INDEX mail_open_intents;
    CREATE INDEX mail_open_intents ON mail(created_at)
        WHERE kind = 'intent' AND (state = 'new' OR state = 'delivered' OR state = 'seen');
    DROP INDEX mail_closed;
    CREATE INDEX mail_closed ON mail(coalesce(done_at, expires_at))
        WHERE (state = 'done' OR state = 'failed' OR state = 'expired');
    DROP INDEX ledger_open;
    CREATE INDEX ledger_open ON ledger(project, state, seq) WHERE (state = 'todo' OR state = 'running' OR state = 'review');
    DROP INDEX jobs_finished;
    CREATE INDEX jobs_finished ON jobs(queue, finished_at) WHERE (state = 'succeeded' OR state = 'dead' OR state = 'cancelled');
    DROP INDEX jobs_finished_at;
    CREATE INDEX jobs_finished_at ON jobs(finished_at) WHERE (state = 'succeeded' OR state = 'dead' OR state = 'cancelled');
    "#,
];

pub fn migrate(conn: &mut Connection) -> Result<()> {
    migrate_with(conn, MIGRATIONS, REQUIRED)
}

/// V5: the schema version of the store at `conn` and this build's: a backup of an earlier
/// schema is migrated (on a copy) before it is read.
pub fn versions(conn: &Connection) -> Result<(usize, usize)> {
    let found: usize = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(super::map_err)?;
    Ok((found, MIGRATIONS.len()))
}

/// [`versions`] of the store file at `path`, opened read-only.
pub fn versions_at(path: &std::path::Path) -> Result<(usize, usize)> {
    versions(&super::open_connection(path, false)?)
}

/// V5, for tests and fixtures: a store at `path` built by this build's migrations 1..=`k` only
/// (an earlier schema, as an earlier release left it).
#[doc(hidden)]
pub fn create_at(path: &std::path::Path, k: usize) -> Result<()> {
    let mut conn = Connection::open(path).map_err(super::map_err)?;
    migrate_with(&mut conn, &MIGRATIONS[..k.min(MIGRATIONS.len())], &[])
}

/// V5, for tests and fixtures: every tab's rows of the store `from` into the store `into`
/// through only the columns the schema of `at` has — the INSERTs a release of that schema
/// could have made (`at` may be `into`). The rows copied per tab that exists at `at`; `from`'s
/// own `store/` keys stay behind.
#[doc(hidden)]
pub fn copy_rows_as_at(
    into: &std::path::Path,
    from: &std::path::Path,
    at: &std::path::Path,
) -> Result<Vec<(&'static str, usize)>> {
    let conn = Connection::open(into).map_err(super::map_err)?;
    conn.execute("ATTACH DATABASE ?1 AS source", [from.display().to_string()]).map_err(super::map_err)?;
    conn.execute("ATTACH DATABASE ?1 AS at", [at.display().to_string()]).map_err(super::map_err)?;
    let mut copied = Vec::new();
    for (tab, _) in crate::transfer::TABS {
        let mut stmt = conn.prepare(&format!("PRAGMA at.table_info(\"{tab}\")")).map_err(super::map_err)?;
        let columns: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(1))
            .map_err(super::map_err)?
            .collect::<std::result::Result<_, _>>()
            .map_err(super::map_err)?;
        if columns.is_empty() {
            continue;
        }
        let list = columns.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", ");
        let only = if *tab == "kv" { " WHERE key NOT LIKE 'store/%'" } else { "" };
        let sql = format!("INSERT INTO main.{tab} ({list}) SELECT {list} FROM source.{tab}{only}");
        copied.push((*tab, conn.execute(&sql, []).map_err(super::map_err)?));
    }
    Ok(copied)
}

/// Runs the `migrations` not yet applied (counted by `PRAGMA user_version`) in one transaction,
/// then checks that every `required` column exists (I6: fail closed, naming it). A store newer
/// only by migrations that add is used as it is (V5).
pub fn migrate_with(conn: &mut Connection, migrations: &[&str], required: &[(&str, &[&str])]) -> Result<()> {
    let fit = |c: &Connection| -> Result<(usize, SchemaFit)> {
        let v: usize = c.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(super::map_err)?;
        match schema_fit(v, migrations.len(), recorded_readable_by(c)?) {
            SchemaFit::Refused => Err(StoreError::Schema(newer_schema(v, migrations.len()))),
            fit => Ok((v, fit)),
        }
    };
    if fit(conn)?.1 == SchemaFit::Migrate {
        // Another process may be migrating the same file right now (a hook and the poller on a
        // fresh cache): the write lock comes first, then the version is read again under it.
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(super::map_err)?;
        let (version, fit) = fit(&tx)?;
        if fit == SchemaFit::Migrate {
            for sql in migrations.iter().skip(version) {
                tx.execute_batch(sql).map_err(super::map_err)?;
            }
            tx.pragma_update(None, "user_version", migrations.len()).map_err(super::map_err)?;
            let readable_by = i64::try_from(crate::readable_by(migrations)).unwrap_or(i64::MAX);
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS pcmail_schema (readable_by INTEGER NOT NULL); DELETE FROM pcmail_schema;",
            )
            .map_err(super::map_err)?;
            tx.execute("INSERT INTO pcmail_schema (readable_by) VALUES (?1)", [readable_by]).map_err(super::map_err)?;
        }
        tx.commit().map_err(super::map_err)?;
    }
    verify(conn, required)
}

/// V5: how many migrations a build must know to use this store, as its newest build recorded
/// it ([`crate::readable_by`]); None for a store that recorded nothing.
fn recorded_readable_by(c: &Connection) -> Result<Option<usize>> {
    let recorded: bool = c
        .query_row("SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'pcmail_schema'", [], |r| {
            r.get(0)
        })
        .map_err(super::map_err)?;
    if !recorded {
        return Ok(None);
    }
    let n: Option<i64> =
        c.query_row("SELECT max(readable_by) FROM pcmail_schema", [], |r| r.get(0)).map_err(super::map_err)?;
    Ok(n.and_then(|n| usize::try_from(n).ok()))
}

/// A store opened only to be read must be of this build's schema: older ones are migrated by
/// opening them for writing (`serve`), never behind a reader's back.
pub fn check_current(conn: &Connection) -> Result<()> {
    let version: usize = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(super::map_err)?;
    let current = MIGRATIONS.len();
    if version == 0 {
        return Err(StoreError::Schema("not a pcmail store (it has no pcmail schema)".into()));
    }
    if version < current {
        return Err(StoreError::Schema(format!(
            "made by an older pcmail (schema {version}, this build's is {current}); run `pcmail-ctl serve` on it \
             (or on a copy of it) once to migrate it, then try again"
        )));
    }
    if schema_fit(version, current, recorded_readable_by(conn)?) == SchemaFit::Refused {
        return Err(StoreError::Schema(newer_schema(version, current)));
    }
    verify(conn, REQUIRED)
}

pub fn verify(conn: &Connection, required: &[(&str, &[&str])]) -> Result<()> {
    for (table, columns) in required {
        let mut stmt = conn.prepare(&format!("PRAGMA table_info(\"{table}\")")).map_err(super::map_err)?;
        let present: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(1))
            .map_err(super::map_err)?
            .collect::<Result<_, _>>()
            .map_err(super::map_err)?;
        if present.is_empty() {
            return Err(StoreError::Schema(format!("table {table} is missing")));
        }
        if let Some(missing) = columns.iter().find(|c| !present.iter().any(|p| p == *c)) {
            return Err(StoreError::Schema(format!(
                "column {table}.{missing} is missing; the database was changed outside pcmail"
            )));
        }
    }
    Ok(())
}
