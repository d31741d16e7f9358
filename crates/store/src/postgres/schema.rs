//! Forward-only migrations (I6) for PostgreSQL: the same tabs and columns as SQLite's, in
//! PostgreSQL's types, plus the triggers that announce changes to the other replicas.

use pcmail_core::version::{SchemaFit, newer_schema, schema_fit};

use super::conn::Conn;
use crate::codec::REQUIRED;
use crate::{Result, StoreError};

/// Taken for the duration of the migrations, so replicas starting together migrate once.
const MIGRATION_LOCK: i64 = 0x7063_6d61_696c_0001;

/// Applied in order; `pcmail_schema.version` counts how many ran. Never edit a shipped entry:
/// append a new one.
pub(super) const MIGRATIONS: &[&str] = &[
    // 1: every tab of SQLite's migrations 1-4, at once.
    r#"
    CREATE TABLE mail (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        "from" TEXT NOT NULL,
        "to" TEXT NOT NULL,
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        body TEXT NOT NULL,
        urgent BOOLEAN NOT NULL,
        auto BOOLEAN NOT NULL,
        hop BIGINT NOT NULL,
        reply_to TEXT,
        channel TEXT NOT NULL,
        external_key TEXT,
        state TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        delivered_at BIGINT,
        delivered_by TEXT,
        seen_at BIGINT,
        seen_by TEXT,
        done_at BIGINT,
        result TEXT,
        fail_reason TEXT,
        presented_at BIGINT,
        presented_session TEXT,
        last_reminded_at BIGINT
    );
    CREATE INDEX mail_to_seq ON mail("to", seq);
    CREATE INDEX mail_from_seq ON mail("from", seq);
    CREATE INDEX mail_open_expiry ON mail(expires_at) WHERE state IN ('new', 'delivered', 'seen');
    CREATE UNIQUE INDEX mail_external_key ON mail(external_key) WHERE external_key IS NOT NULL;
    CREATE INDEX mail_new_created ON mail(created_at) WHERE state = 'new';
    CREATE INDEX mail_delivered_at ON mail(delivered_at) WHERE state = 'delivered';
    CREATE INDEX mail_open_intents ON mail(created_at) WHERE kind = 'intent' AND state IN ('new', 'delivered', 'seen');

    CREATE TABLE specs (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        labels TEXT NOT NULL,
        generation BIGINT NOT NULL,
        spec TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (kind, name)
    );

    CREATE TABLE events (
        id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        at BIGINT NOT NULL,
        object TEXT NOT NULL,
        reason TEXT NOT NULL,
        message TEXT NOT NULL,
        actor TEXT NOT NULL
    );
    CREATE INDEX events_object ON events(object, id);

    -- Counts per (state, kind, channel), kept by a trigger so that /metrics never scans mail.
    CREATE TABLE mail_counts (
        state TEXT NOT NULL,
        kind TEXT NOT NULL,
        channel TEXT NOT NULL,
        n BIGINT NOT NULL,
        PRIMARY KEY (state, kind, channel)
    );
    CREATE FUNCTION pcmail_mail_counts() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP IN ('UPDATE', 'DELETE') THEN
            UPDATE mail_counts SET n = n - 1 WHERE state = OLD.state AND kind = OLD.kind AND channel = OLD.channel;
        END IF;
        IF TG_OP IN ('INSERT', 'UPDATE') THEN
            INSERT INTO mail_counts (state, kind, channel, n) VALUES (NEW.state, NEW.kind, NEW.channel, 1)
                ON CONFLICT (state, kind, channel) DO UPDATE SET n = mail_counts.n + 1;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER mail_counts_insert_delete AFTER INSERT OR DELETE ON mail
        FOR EACH ROW EXECUTE FUNCTION pcmail_mail_counts();
    CREATE TRIGGER mail_counts_update AFTER UPDATE OF state, kind, channel ON mail FOR EACH ROW
        WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.kind IS DISTINCT FROM NEW.kind
              OR OLD.channel IS DISTINCT FROM NEW.channel)
        EXECUTE FUNCTION pcmail_mail_counts();

    CREATE TABLE alerts (
        kind TEXT NOT NULL,
        subject TEXT NOT NULL,
        state TEXT NOT NULL,
        summary TEXT NOT NULL,
        labels TEXT NOT NULL,
        firing_since BIGINT NOT NULL,
        resolved_at BIGINT,
        notified TEXT,
        last_sent_at BIGINT,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (kind, subject)
    );
    CREATE INDEX alerts_firing ON alerts(kind) WHERE state = 'firing';
    CREATE INDEX alerts_unnotified ON alerts(updated_at) WHERE notified IS DISTINCT FROM state;

    CREATE TABLE machines (name TEXT PRIMARY KEY, last_poll_at BIGINT NOT NULL);
    CREATE TABLE tokens (machine TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, created_at BIGINT NOT NULL);

    CREATE TABLE ledger (
        project TEXT NOT NULL,
        id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        state TEXT NOT NULL,
        run_requested BOOLEAN NOT NULL,
        task TEXT NOT NULL,
        content TEXT NOT NULL,
        source TEXT NOT NULL,
        evidence TEXT NOT NULL,
        due TEXT NOT NULL,
        assignee TEXT NOT NULL,
        function TEXT NOT NULL,
        result TEXT NOT NULL,
        executed_at BIGINT,
        instruction TEXT NOT NULL,
        key TEXT NOT NULL,
        failures BIGINT NOT NULL,
        refresh BOOLEAN NOT NULL,
        PRIMARY KEY (project, id)
    );
    CREATE UNIQUE INDEX ledger_key ON ledger(project, key);
    CREATE INDEX ledger_requested ON ledger(project, seq) WHERE run_requested;
    CREATE INDEX ledger_open ON ledger(project, state, seq) WHERE state IN ('todo', 'running', 'review');
    CREATE TABLE ledger_projects (project TEXT PRIMARY KEY, next_seq BIGINT NOT NULL);
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);

    CREATE TABLE jobs (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        queue TEXT NOT NULL,
        function TEXT NOT NULL,
        payload TEXT NOT NULL,
        state TEXT NOT NULL,
        priority BIGINT NOT NULL,
        attempts BIGINT NOT NULL,
        max_attempts BIGINT NOT NULL,
        run_after BIGINT NOT NULL,
        lease_owner TEXT,
        lease_token TEXT,
        lease_expires_at BIGINT,
        heartbeat_at BIGINT,
        rescues BIGINT NOT NULL,
        last_error TEXT,
        result TEXT,
        unique_key TEXT,
        ledger_ref TEXT,
        created_at BIGINT NOT NULL,
        finished_at BIGINT
    );
    CREATE INDEX jobs_claim ON jobs(queue, priority DESC, run_after, seq) WHERE state = 'queued';
    CREATE INDEX jobs_leases ON jobs(lease_expires_at) WHERE state = 'running';
    CREATE UNIQUE INDEX jobs_unique ON jobs(unique_key)
        WHERE unique_key IS NOT NULL AND state IN ('queued', 'running', 'failed');

    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        acquired_at BIGINT NOT NULL,
        renewed_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL
    );

    -- Announcements to the other replicas (LISTEN pcmail), sent when the transaction commits.
    -- PostgreSQL folds equal payloads of one transaction into one.
    CREATE FUNCTION pcmail_announce() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_TABLE_NAME = 'mail' AND TG_OP = 'INSERT' THEN
            PERFORM pg_notify('pcmail', 'mail:' || NEW."to");
        ELSE
            PERFORM pg_notify('pcmail', TG_TABLE_NAME);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER mail_announce AFTER INSERT ON mail FOR EACH ROW EXECUTE FUNCTION pcmail_announce();
    CREATE TRIGGER mail_moves_announce AFTER UPDATE OF state ON mail
        FOR EACH STATEMENT EXECUTE FUNCTION pcmail_announce();
    CREATE TRIGGER jobs_announce AFTER INSERT OR UPDATE OF state ON jobs FOR EACH ROW
        WHEN (NEW.state = 'queued') EXECUTE FUNCTION pcmail_announce();
    -- Status writes are the controller's own bookkeeping and announce nothing.
    CREATE TRIGGER specs_announce AFTER INSERT OR DELETE OR UPDATE OF spec, generation, labels ON specs
        FOR EACH STATEMENT EXECUTE FUNCTION pcmail_announce();
    "#,
    // 2: who enqueued a job (T2), as SQLite's migration 5.
    r#"
    ALTER TABLE jobs ADD COLUMN enqueued_by TEXT;
    CREATE INDEX jobs_enqueued_by ON jobs(enqueued_by, seq) WHERE enqueued_by IS NOT NULL;
    "#,
    // 3: the store's identity (E5), as SQLite's migration 6.
    r#"
    INSERT INTO kv (key, value) VALUES ('store/identity', replace(gen_random_uuid()::text, '-', ''))
        ON CONFLICT (key) DO NOTHING;
    "#,
    // 4: retention's indexes (E7), as SQLite's migration 7.
    r#"
    CREATE INDEX mail_closed ON mail((coalesce(done_at, expires_at))) WHERE state IN ('done', 'failed', 'expired');
    CREATE INDEX jobs_finished ON jobs(queue, finished_at) WHERE state IN ('succeeded', 'dead', 'cancelled');
    CREATE INDEX jobs_finished_at ON jobs(finished_at) WHERE state IN ('succeeded', 'dead', 'cancelled');
    CREATE INDEX events_at ON events(at);
    "#,
    // 5: full-text search (U5), as SQLite's migration 8: trigram indexes (pg_trgm, a trusted
    // extension) that ILIKE uses, kept by PostgreSQL in the writing transaction.
    r#"
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    CREATE INDEX mail_search ON mail USING gin ((subject || ' ' || body) gin_trgm_ops);
    CREATE INDEX ledger_search ON ledger USING gin ((task || ' ' || content) gin_trgm_ops);
    "#,
    // 6: T14 — a machine's scope inside the mail index: its two parties are the index's first
    // column, so a machine's search reads and rechecks only the rows of its own mail.
    r#"
    DROP INDEX mail_search;
    CREATE INDEX mail_search ON mail USING gin ((ARRAY["from", "to"]), (subject || ' ' || body) gin_trgm_ops);
    "#,
    // 7: T12 and E12, as SQLite's migration 9: a unique key is scoped to its enqueuer unless its
    // pool shares keys, and held by a finished job for the asker's uniqueFor, which the planner
    // decides under the key's lock; the index only finds holders.
    r#"
    DROP INDEX jobs_unique;
    CREATE INDEX jobs_unique_key ON jobs(unique_key) WHERE unique_key IS NOT NULL;
    "#,
    // 8: V1, as SQLite's migration 10: each machine's last client version.
    r#"
    ALTER TABLE machines ADD COLUMN client TEXT NOT NULL DEFAULT '';
    "#,
];

pub async fn migrate(conn: &mut Conn) -> Result<()> {
    conn.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
    let outcome = run_migrations(conn, MIGRATIONS).await;
    let unlocked = conn.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await;
    outcome?;
    unlocked?;
    verify(conn).await
}

/// Runs the `migrations` not yet applied, each in its own transaction (V5's fixtures run
/// only the first k of [`MIGRATIONS`]), and records how many a build must know to use the
/// result. A store newer only by migrations that add is used as it is (V5).
pub(super) async fn run_migrations(conn: &mut Conn, migrations: &[&str]) -> Result<()> {
    conn.batch(
        "CREATE TABLE IF NOT EXISTS pcmail_schema (version BIGINT NOT NULL); \
         ALTER TABLE pcmail_schema ADD COLUMN IF NOT EXISTS readable_by BIGINT",
    )
    .await?;
    let rows = conn.query("SELECT version, readable_by FROM pcmail_schema", &[]).await?;
    let (version, readable_by) = match rows.first() {
        Some(r) => (
            r.try_get::<_, i64>(0).map_err(super::conn::map_err)?,
            r.try_get::<_, Option<i64>>(1).map_err(super::conn::map_err)?,
        ),
        None => {
            conn.execute("INSERT INTO pcmail_schema (version) VALUES (0)", &[]).await?;
            (0, None)
        }
    };
    let version = usize::try_from(version).unwrap_or(usize::MAX);
    let readable_by = readable_by.map(|r| usize::try_from(r).unwrap_or(usize::MAX));
    match schema_fit(version, migrations.len(), readable_by) {
        SchemaFit::Refused => return Err(StoreError::Schema(newer_schema(version, migrations.len()))),
        SchemaFit::Current | SchemaFit::Newer => return Ok(()),
        SchemaFit::Migrate => {}
    }
    let readable_by = i64::try_from(crate::readable_by(migrations)).unwrap_or(i64::MAX);
    for (i, sql) in migrations.iter().enumerate().skip(version) {
        conn.begin().await?;
        let step = async {
            conn.batch(sql).await?;
            conn.execute("UPDATE pcmail_schema SET version = $1, readable_by = $2", &[&((i + 1) as i64), &readable_by])
                .await
                .map(|_| ())
        }
        .await;
        conn.finish(step).await?;
    }
    Ok(())
}

/// I6: every column this build reads exists, or start fails naming the missing one.
async fn verify(conn: &mut Conn) -> Result<()> {
    let rows = conn
        .query(
            "SELECT table_name::text, column_name::text FROM information_schema.columns \
             WHERE table_schema = current_schema()",
            &[],
        )
        .await?;
    let present: Vec<(String, String)> =
        rows.iter().filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?))).collect();
    for (table, columns) in REQUIRED {
        if !present.iter().any(|(t, _)| t == table) {
            return Err(StoreError::Schema(format!("table {table} is missing")));
        }
        if let Some(missing) = columns.iter().find(|c| !present.iter().any(|(t, p)| t == table && p == *c)) {
            return Err(StoreError::Schema(format!(
                "column {table}.{missing} is missing; the database was changed outside pcmail"
            )));
        }
    }
    Ok(())
}
