//! The local inbox cache under `$PCMAIL_HOME`: SQLite (WAL), written by the poller and read and
//! written by hooks at the same time (A3). Its rows are the single record of what this PC did
//! with each mail (A1); server calls that could not be made wait in its `pending` queue (A4).

use std::path::{Path, PathBuf};
use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::agent::{NextStep, QueuedCall, merge_polled, validate_polled};
use pcmail_core::api::StepRequest;
use pcmail_core::mail::{Mail, MailKind, MailState, PresentationGroup, Step, apply_step};
use pcmail_core::manifest::spec::IntentPolicySpec;
use pcmail_core::present::{Limits, Tally};
use pcmail_store::StoreError;
use pcmail_store::codec::{self, MAIL_COLUMNS, MAIL_INSERT_COLUMNS, MAIL_TABLE_COLUMNS, Value, from_ms, ms};
use pcmail_store::sqlite::{map_err, plan_once, schema};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

pub const CACHE_FILE: &str = "cache.db";

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache {path}: {source}")]
    Store { path: PathBuf, source: StoreError },
    #[error("cache {path}: {message}")]
    Io { path: PathBuf, message: String },
}

pub type Result<T, E = CacheError> = std::result::Result<T, E>;

const MIGRATIONS: &[&str] = &[
    // 1: the inbox (the mail columns plus what only this PC knows), the queue, and state.
    r#"
    CREATE TABLE inbox (
        id TEXT PRIMARY KEY,
        seq INTEGER NOT NULL,
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
        external_key TEXT UNIQUE,
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
        last_reminded_at INTEGER,
        received_at INTEGER NOT NULL,
        quarantine TEXT,
        stop_blocked_at INTEGER
    );
    CREATE INDEX inbox_open ON inbox(created_at) WHERE state IN ('new', 'delivered', 'seen', 'expired');
    CREATE TABLE pending (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        action TEXT NOT NULL,
        target TEXT NOT NULL,
        body TEXT NOT NULL,
        unknown_tries INTEGER NOT NULL DEFAULT 0,
        next_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        last_error TEXT
    );
    CREATE TABLE state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    "#,
    // 2: hooks read light rows from indexes only (P5), and intents and stop candidates from
    // partial indexes, whatever the size of the inbox.
    r#"
    CREATE INDEX inbox_heads ON inbox(state, quarantine, created_at, seq, id, kind, urgent, expires_at, presented_session, reply_to);
    CREATE INDEX inbox_intents ON inbox(created_at) WHERE kind = 'intent' AND state IN ('new', 'delivered', 'seen');
    CREATE INDEX inbox_stop ON inbox(created_at)
        WHERE kind = 'decision' AND urgent = 1 AND stop_blocked_at IS NULL AND state IN ('new', 'delivered', 'seen');
    "#,
    // 3: the MCP server looks for mail to push several times a second; only mail never
    // presented is in this index, so the look costs nothing however large the inbox grows.
    r#"
    CREATE INDEX inbox_unpresented ON inbox(seq) WHERE presented_at IS NULL AND quarantine IS NULL;
    "#,
    // 4: P5 — a hook reads only what it shows. Counts of open and expired mail are kept by
    // triggers as rows change; the heads of each presentation group come from an index in
    // group order, newest first; overdue open mail (expired by time, not yet by state) is
    // counted from an index of deadlines.
    r#"
    DROP INDEX inbox_heads;
    CREATE TABLE inbox_tally (bucket TEXT PRIMARY KEY, n INTEGER NOT NULL);
    INSERT INTO inbox_tally (bucket, n) VALUES
        ('open', (SELECT count(*) FROM inbox WHERE kind != 'intent' AND quarantine IS NULL
                  AND state IN ('new', 'delivered', 'seen'))),
        ('expired', (SELECT count(*) FROM inbox WHERE kind != 'intent' AND quarantine IS NULL AND state = 'expired'));
    CREATE TRIGGER inbox_tally_insert AFTER INSERT ON inbox BEGIN
        UPDATE inbox_tally SET n = n + 1 WHERE bucket = (CASE WHEN NEW.kind = 'intent' OR NEW.quarantine IS NOT NULL
            THEN NULL WHEN NEW.state IN ('new', 'delivered', 'seen') THEN 'open' WHEN NEW.state = 'expired' THEN 'expired' END);
    END;
    CREATE TRIGGER inbox_tally_delete AFTER DELETE ON inbox BEGIN
        UPDATE inbox_tally SET n = n - 1 WHERE bucket = (CASE WHEN OLD.kind = 'intent' OR OLD.quarantine IS NOT NULL
            THEN NULL WHEN OLD.state IN ('new', 'delivered', 'seen') THEN 'open' WHEN OLD.state = 'expired' THEN 'expired' END);
    END;
    CREATE TRIGGER inbox_tally_update AFTER UPDATE OF kind, state, quarantine ON inbox BEGIN
        UPDATE inbox_tally SET n = n - 1 WHERE bucket = (CASE WHEN OLD.kind = 'intent' OR OLD.quarantine IS NOT NULL
            THEN NULL WHEN OLD.state IN ('new', 'delivered', 'seen') THEN 'open' WHEN OLD.state = 'expired' THEN 'expired' END);
        UPDATE inbox_tally SET n = n + 1 WHERE bucket = (CASE WHEN NEW.kind = 'intent' OR NEW.quarantine IS NOT NULL
            THEN NULL WHEN NEW.state IN ('new', 'delivered', 'seen') THEN 'open' WHEN NEW.state = 'expired' THEN 'expired' END);
    END;
    CREATE INDEX inbox_overdue ON inbox(expires_at)
        WHERE kind != 'intent' AND quarantine IS NULL AND state IN ('new', 'delivered', 'seen');
    CREATE INDEX inbox_groups ON inbox((CASE WHEN kind = 'decision' THEN 0 WHEN kind = 'work' OR urgent = 1 THEN 1
            WHEN kind = 'answer' THEN 2 ELSE 3 END), created_at DESC, seq DESC)
        WHERE kind != 'intent' AND quarantine IS NULL AND state IN ('new', 'delivered', 'seen');
    "#,
    // 5: T10 — a call the server refused for good stays in the queue, marked, never sent
    // again, and is reported to the server once.
    r#"
    ALTER TABLE pending ADD COLUMN refused_at INTEGER;
    ALTER TABLE pending ADD COLUMN reported_at INTEGER;
    "#,
];

/// The presentation group of a row (`present::group` for open mail of a presented kind), built
/// from each kind's [`MailKind::group`] in group order, so urgency lifts a row as
/// [`PresentationGroup::of`] does. For today's kinds it is the text migration 4 built
/// `inbox_groups` with; a kind added or regrouped since rebuilds the index at open
/// ([`rebuild_derived_indexes`]). Its test holds it to `present::group` for every kind.
fn group_of_row() -> String {
    let Some((last, before)) = PresentationGroup::ALL.split_last() else {
        return "0".to_string();
    };
    let mut case = String::from("(CASE");
    for g in before {
        let mut terms = Vec::new();
        if MailKind::ALL.iter().any(|k| k.group() == Some(*g)) {
            terms.push(MailKind::sql_is("kind", |k| k.group() == Some(*g)));
        }
        if *g == PresentationGroup::URGENT {
            terms.push("urgent = 1".to_string());
        }
        if !terms.is_empty() {
            case.push_str(&format!(" WHEN {} THEN {}", terms.join(" OR "), g.index()));
        }
    }
    format!("{case} ELSE {} END)", last.index())
}

/// The rows the tally counts as open and the groups index holds: open mail of a presented kind.
fn open_rows() -> String {
    let unpresented = MailKind::sql_is_not("kind", |k| k.group().is_none());
    format!("{unpresented} AND quarantine IS NULL AND state IN ({})", MailState::open_sql())
}

/// Open intents.
fn open_intents() -> String {
    format!("{} AND state IN ({})", MailKind::sql_is("kind", MailKind::is_intent), MailState::open_sql())
}

/// H4: open urgent mail of a kind that blocks a stop, not yet used to block one.
fn stop_rows() -> String {
    let kinds = MailKind::sql_is("kind", MailKind::blocks_stop);
    format!("{kinds} AND urgent = 1 AND stop_blocked_at IS NULL AND state IN ({})", MailState::open_sql())
}

/// What [`Cache::group_heads`] asks of one group: `?1` the group, `?2` now, `?3` the session,
/// `?4` the cap.
fn heads_filter() -> String {
    format!(
        "{} = ?1 AND {} AND expires_at > ?2 \
         AND (presented_session IS NULL OR presented_session != ?3) ORDER BY created_at DESC, seq DESC LIMIT ?4",
        group_of_row(),
        open_rows()
    )
}

/// R3: the indexes whose expression or predicate is a kind rule, as this build derives them. A
/// query answers from such an index only while its text derives the same way, so they are built
/// from the same functions as the queries.
fn derived_indexes() -> [(&'static str, String); 4] {
    [
        ("inbox_groups", format!("ON inbox({}, created_at DESC, seq DESC) WHERE {}", group_of_row(), open_rows())),
        ("inbox_overdue", format!("ON inbox(expires_at) WHERE {}", open_rows())),
        ("inbox_intents", format!("ON inbox(created_at) WHERE {}", open_intents())),
        ("inbox_stop", format!("ON inbox(created_at) WHERE {}", stop_rows())),
    ]
    .map(|(name, on)| (name, format!("CREATE INDEX {name} {on}")))
}

/// The derived indexes whose stored text (whitespace aside) is not this build's.
fn stale_indexes(conn: &Connection) -> rusqlite::Result<Vec<(&'static str, String)>> {
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut stmt =
        conn.prepare_cached("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL")?;
    let stored: Vec<(String, String)> =
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<rusqlite::Result<_>>()?;
    let fits = |name: &str, sql: &str| stored.iter().any(|(n, s)| n == name && squeeze(s) == squeeze(sql));
    Ok(derived_indexes().into_iter().filter(|(name, sql)| !fits(name, sql)).collect())
}

/// Rebuilds each derived index a build with other kind rules left behind (a kind added or
/// regrouped), under the write lock, so the hook's queries keep answering from them (P5).
/// The tally's triggers are not rebuilt: they only tell presented kinds from the others, which
/// P5's test holds for every kind.
fn rebuild_derived_indexes(conn: &mut Connection) -> rusqlite::Result<()> {
    if stale_indexes(conn)?.is_empty() {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (name, sql) in stale_indexes(&tx)? {
        tx.execute_batch(&format!("DROP INDEX IF EXISTS {name}; {sql};"))?;
    }
    tx.commit()
}

const INBOX_EXTRA: &[&str] = &["received_at", "quarantine", "stop_blocked_at"];

/// A server call waiting in the queue.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    pub id: i64,
    /// A step (target: a mail id) or an intent (target: an external key).
    pub action: QueuedCall,
    pub target: String,
    pub body: serde_json::Value,
    pub unknown_tries: u32,
    /// The last failure, or (refused) the server's reason.
    pub error: Option<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct MergeReport {
    pub new: Vec<String>,
    pub quarantined: Vec<String>,
}

pub struct Cache {
    conn: Connection,
    path: PathBuf,
}

impl Cache {
    /// Opens (creating and migrating) `home/cache.db`. `busy` bounds how long a write waits for
    /// another process's write: the poller's and the hooks' transactions last microseconds.
    pub fn open(home: &Path, busy: Duration) -> Result<Cache> {
        let path = home.join(CACHE_FILE);
        let io = |message: String| CacheError::Io { path: path.clone(), message };
        pcmail_store::private::make_private(home).map_err(|e| io(format!("cannot create {}: {e}", home.display())))?;
        let wrap = |source| CacheError::Store { path: path.clone(), source };
        let mut conn = Connection::open(&path).map_err(|e| wrap(map_err(e)))?;
        conn.busy_timeout(busy).map_err(|e| wrap(map_err(e)))?;
        // A hook's group heads (`LIMIT ?`) are read once a group.
        plan_once(&conn).map_err(|e| wrap(map_err(e)))?;
        // Turning a fresh file to WAL takes it whole, and SQLite answers "locked" at once, without
        // its busy handler, while another process (a hook, the poller) opens it too: waited here.
        let started = std::time::Instant::now();
        while let Err(e) = conn.pragma_update(None, "journal_mode", "WAL") {
            let locked = e
                .sqlite_error_code()
                .is_some_and(|c| matches!(c, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked));
            if !locked || started.elapsed() >= busy {
                return Err(wrap(map_err(e)));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        // NORMAL: WAL commits survive a killed process; what a power loss could undo here (a
        // presented mark, a cursor) is redone from the server. Intents are written with FULL.
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(|e| wrap(map_err(e)))?;
        // Hooks read through the page cache instead of a syscall per page.
        conn.pragma_update(None, "mmap_size", 64i64 << 20).map_err(|e| wrap(map_err(e)))?;
        let inbox: Vec<&str> = MAIL_TABLE_COLUMNS.iter().chain(INBOX_EXTRA).copied().collect();
        let required: [(&str, &[&str]); 3] = [
            ("inbox", &inbox),
            (
                "pending",
                &[
                    "id",
                    "action",
                    "target",
                    "body",
                    "unknown_tries",
                    "next_at",
                    "created_at",
                    "last_error",
                    "refused_at",
                    "reported_at",
                ],
            ),
            ("state", &["key", "value"]),
        ];
        schema::migrate_with(&mut conn, MIGRATIONS, &required).map_err(wrap)?;
        rebuild_derived_indexes(&mut conn).map_err(|e| wrap(map_err(e)))?;
        Ok(Cache { conn, path })
    }

    fn wrap(&self, e: rusqlite::Error) -> CacheError {
        CacheError::Store { path: self.path.clone(), source: map_err(e) }
    }

    /// One IMMEDIATE transaction: the write lock is taken up front, so two writers never
    /// deadlock upgrading a read; a failure rolls everything back.
    fn write<R>(&mut self, f: impl FnOnce(&Transaction) -> rusqlite::Result<R>) -> Result<R> {
        let path = self.path.clone();
        let wrap = |e| CacheError::Store { path: path.clone(), source: map_err(e) };
        let tx = self.conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(wrap)?;
        let out = f(&tx).map_err(wrap)?;
        tx.commit().map_err(wrap)?;
        Ok(out)
    }

    pub fn state(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .query_row("SELECT value FROM state WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.wrap(e))
    }

    /// The IntentPolicy the poller last fetched (I2/I3 read it offline); DESIGN's defaults before
    /// the first poll.
    pub fn intent_policy(&self) -> Result<IntentPolicySpec> {
        Ok(self.state("intent_policy")?.and_then(|p| serde_json::from_str(&p).ok()).unwrap_or_default())
    }

    pub fn state_ts(&self, key: &str) -> Result<Option<Ts>> {
        Ok(self.state(key)?.and_then(|v| v.parse().ok()).map(from_ms))
    }

    pub fn set_state(&mut self, values: &[(&str, String)]) -> Result<()> {
        self.write(|tx| {
            for (k, v) in values {
                set_state(tx, k, v)?;
            }
            Ok(())
        })
    }

    /// Every state value whose key starts with `prefix` (K6's prompts waiting for an answer).
    pub fn states_with_prefix(&self, prefix: &str) -> Result<Vec<(String, String)>> {
        let run = || -> rusqlite::Result<Vec<(String, String)>> {
            let mut stmt = self.conn.prepare("SELECT key, value FROM state WHERE substr(key, 1, length(?1)) = ?1")?;
            let rows = stmt.query_map([prefix], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        };
        run().map_err(|e| self.wrap(e))
    }

    pub fn clear_state(&mut self, keys: &[&str]) -> Result<()> {
        self.write(|tx| {
            for k in keys {
                tx.execute("DELETE FROM state WHERE key = ?1", [k])?;
            }
            Ok(())
        })
    }

    /// K8: tells the server of an edit of the intent under `key` (an event on it there).
    pub fn queue_intent_edit(&mut self, key: &str, message: &serde_json::Value, now: Ts) -> Result<()> {
        self.write(|tx| queue(tx, QueuedCall::Intent, key, message, now))
    }

    fn select(&self, filter: &str, args: impl rusqlite::Params) -> Result<Vec<Mail>> {
        select_in(&self.conn, filter, args).map_err(|e| self.wrap(e))
    }

    pub fn get(&self, id: &str) -> Result<Option<Mail>> {
        Ok(self.select("id = ?1", [id])?.pop())
    }

    pub fn intent_by_key(&self, key: &str) -> Result<Option<Mail>> {
        Ok(self.select("external_key = ?1", [key])?.pop())
    }

    /// Everything a hook may present or count: open mail and expired mail, not quarantined.
    pub fn open_mail(&self) -> Result<Vec<Mail>> {
        let shown = MailState::sql_in(|s| !s.is_terminal() || s == MailState::Expired);
        self.select(&format!("state IN ({shown}) AND quarantine IS NULL"), [])
    }

    /// P5: of each presentation group, the newest open mails not shown in `session` and not
    /// expired, at most the group's cap — read from the groups index, never the whole inbox.
    pub fn group_heads(&self, session: &str, now: Ts, limits: Limits) -> Result<Vec<Mail>> {
        let filter = heads_filter();
        let mut out = Vec::new();
        for (group, cap) in limits.groups.iter().enumerate() {
            out.extend(self.select(&filter, params![group as i64, ms(now), session, *cap as i64])?);
        }
        Ok(out)
    }

    /// P5: the counts a hook shows but does not list, from the trigger-kept tally and the
    /// open mail overdue by `now` (few: the server expires it, E6).
    pub fn tally(&self, now: Ts) -> Result<Tally> {
        let count = |sql: &str, args: &[&dyn rusqlite::ToSql]| -> Result<usize> {
            let n: i64 = self
                .conn
                .prepare_cached(sql)
                .and_then(|mut s| s.query_row(args, |r| r.get(0)))
                .map_err(|e| self.wrap(e))?;
            Ok(usize::try_from(n).unwrap_or(0))
        };
        let open = count("SELECT n FROM inbox_tally WHERE bucket = 'open'", &[])?;
        // Migration 5's triggers name the bucket of expired mail by the state it counts.
        let expired = count(&format!("SELECT n FROM inbox_tally WHERE bucket = '{}'", MailState::Expired), &[])?;
        let overdue =
            count(&format!("SELECT count(*) FROM inbox WHERE {} AND expires_at <= ?1", open_rows()), &[&ms(now)])?;
        Ok(Tally { eligible: open.saturating_sub(overdue), expired: expired + overdue })
    }

    /// Open intents, oldest first.
    pub fn open_intents(&self) -> Result<Vec<Mail>> {
        self.select(&format!("{} ORDER BY created_at", open_intents()), [])
    }

    /// Mail never presented (nor quarantined) that arrived after `seq`: what a push may show.
    pub fn unpresented_after(&self, seq: i64) -> Result<Vec<Mail>> {
        self.select("seq > ?1 AND presented_at IS NULL AND quarantine IS NULL ORDER BY seq", [seq])
    }

    /// Open urgent mail of a kind that blocks a stop (decision requests) not yet used to block one (H4).
    pub fn stop_candidates(&self, now: Ts) -> Result<Vec<Mail>> {
        self.select(&format!("{} AND expires_at > ?1", stop_rows()), [ms(now)])
    }

    /// Stores a poll's answer in one transaction with the new cursor: a crash before the
    /// commit leaves the old cursor, so the next poll fetches the same mail again (M11).
    pub fn merge_polled(&mut self, me: &str, mails: Vec<Mail>, cursor: i64, now: Ts) -> Result<MergeReport> {
        self.write(|tx| {
            let mut report = MergeReport::default();
            for polled in mails {
                // Read inside the write transaction: a hook's write in between cannot be undone.
                let local = get_in(tx, &polled.id)?;
                if let Err(why) = validate_polled(&polled, me).map_err(|e| e.to_string()) {
                    if local.is_none() {
                        insert(tx, &polled, now, Some(&why))?;
                        queue(
                            tx,
                            QueuedCall::Fail,
                            &polled.id,
                            &StepRequest {
                                result: None,
                                reason: Some(format!("quarantined by the agent on {me}: {why}")),
                            },
                            now,
                        )?;
                        report.quarantined.push(polled.id);
                    }
                    continue;
                }
                match (local.is_some(), merge_polled(local.as_ref(), polled)) {
                    (false, Some(m)) => {
                        insert(tx, &m, now, None)?;
                        report.new.push(m.id);
                    }
                    (true, Some(m)) => update(tx, &m)?,
                    (_, None) => {}
                }
            }
            set_state(tx, "cursor", &cursor.to_string())?;
            Ok(report)
        })
    }

    /// Takes the server's copy of a mail this PC moved directly (the CLI verbs), forward only,
    /// so hooks do not present what was already handled.
    pub fn refresh(&mut self, server: &Mail) -> Result<()> {
        self.write(|tx| match get_in(tx, &server.id)?.and_then(|local| merge_polled(Some(&local), server.clone())) {
            Some(m) => update(tx, &m),
            None => Ok(()),
        })
    }

    /// Moves one mail forward locally (M1 rules) and queues the same move for the server.
    pub fn step(&mut self, id: &str, step: Step, me: &str, now: Ts) -> Result<Option<Mail>> {
        self.write(|tx| {
            let Some(mail) = get_in(tx, id)? else { return Ok(None) };
            let Some(next) = apply_step(&mail, &step, me, now) else { return Ok(Some(mail)) };
            let (action, body) = server_call(&step);
            update(tx, &next)?;
            queue(tx, action, id, &body, now)?;
            Ok(Some(next))
        })
    }

    /// H3: records what was shown, in which session; shown mail is queued `seen` and answers
    /// to me are acked (H2), all in one transaction.
    pub fn mark_presented(
        &mut self,
        shown: &[String],
        acked: &[String],
        session: &str,
        me: &str,
        now: Ts,
    ) -> Result<()> {
        self.write(|tx| {
            for id in shown {
                let Some(m) = get_in(tx, id)? else { continue };
                let step = if acked.contains(&m.id) { Step::Done { result: None } } else { Step::See };
                let mut next = apply_step(&m, &step, me, now).unwrap_or_else(|| m.clone());
                next.presented_at = Some(now);
                next.presented_session = Some(session.to_string());
                update(tx, &next)?;
                if next.state != m.state {
                    let (action, body) = server_call(&step);
                    queue(tx, action, &m.id, &body, now)?;
                }
            }
            Ok(())
        })
    }

    /// I1: records an inbound message before anything else; a second record of the same key
    /// changes nothing. Answers whether it was new.
    pub fn record_intent(&mut self, mail: &Mail, message: &serde_json::Value, now: Ts) -> Result<bool> {
        let key = mail.external_key.clone().unwrap_or_default();
        // This row may be the only copy of the message: survive a power loss too.
        self.conn.pragma_update(None, "synchronous", "FULL").map_err(|e| self.wrap(e))?;
        self.write(|tx| {
            if !select_in(tx, "external_key = ?1", [&key])?.is_empty() {
                return Ok(false);
            }
            insert(tx, mail, now, None)?;
            queue(tx, QueuedCall::Intent, &key, message, now)?;
            Ok(true)
        })
    }

    /// K8: an edit of the message recorded under `key`: its text history kept on the one
    /// intent. Answers the intent as it now is, `None` when no intent has that key (the caller
    /// records the edit as the intent), and the intent unchanged when the text is the same.
    pub fn edit_intent(&mut self, key: &str, text: &str) -> Result<Option<Mail>> {
        self.write(|tx| {
            let Some(mut m) = select_in(tx, "external_key = ?1", [key])?.into_iter().next() else { return Ok(None) };
            if let Some(body) = pcmail_core::intent::edited_body(&m.body, text) {
                tx.execute("UPDATE inbox SET body = ?2 WHERE id = ?1", params![m.id, body])?;
                m.body = body;
            }
            Ok(Some(m))
        })
    }

    /// A push into a session that listens (`mcp --channels`): presented there, so its hooks only
    /// count it (H3), but not stepped: the mail stays unread until the agent reads or closes it,
    /// and the unread SLA (M9) keeps watching a push the agent skimmed past.
    pub fn mark_pushed(&mut self, ids: &[String], session: &str, now: Ts) -> Result<()> {
        self.write(|tx| {
            for id in ids {
                tx.execute(
                    "UPDATE inbox SET presented_at = ?2, presented_session = ?3 WHERE id = ?1",
                    params![id, ms(now), session],
                )?;
            }
            Ok(())
        })
    }

    pub fn mark_reminded(&mut self, ids: &[String], now: Ts) -> Result<()> {
        self.write(|tx| {
            for id in ids {
                tx.execute("UPDATE inbox SET last_reminded_at = ?2 WHERE id = ?1", params![id, ms(now)])?;
            }
            Ok(())
        })
    }

    pub fn mark_stop_blocked(&mut self, id: &str, now: Ts) -> Result<()> {
        self.write(|tx| {
            tx.execute("UPDATE inbox SET stop_blocked_at = ?2 WHERE id = ?1", params![id, ms(now)]).map(|_| ())
        })
    }

    /// Queued calls that are due, oldest first; refused ones are never due again (T10).
    pub fn due_pending(&self, now: Ts) -> Result<Vec<Pending>> {
        self.pending_where("next_at <= ?1 AND refused_at IS NULL", [ms(now)])
    }

    /// T10: refused calls the server has not been told of yet (`error` holds why).
    pub fn unreported_refusals(&self) -> Result<Vec<Pending>> {
        self.pending_where("refused_at IS NOT NULL AND reported_at IS NULL", [])
    }

    /// T10: why the server refused the queued call for `target`, if it did.
    pub fn refusal_of(&self, action: QueuedCall, target: &str) -> Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT last_error FROM pending WHERE action = ?1 AND target = ?2 AND refused_at IS NOT NULL \
                 ORDER BY id DESC LIMIT 1",
                params![action.as_str(), target],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()
            .map(Option::flatten)
            .map_err(|e| self.wrap(e))
    }

    pub fn mark_reported(&mut self, id: i64, now: Ts) -> Result<()> {
        self.write(|tx| tx.execute("UPDATE pending SET reported_at = ?2 WHERE id = ?1", params![id, ms(now)]).map(drop))
    }

    fn pending_where(&self, filter: &str, args: impl rusqlite::Params) -> Result<Vec<Pending>> {
        let sql = format!(
            "SELECT id, action, target, body, unknown_tries, last_error FROM pending WHERE {filter} ORDER BY id"
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(|e| self.wrap(e))?;
        let rows = stmt
            .query_map(args, |r| {
                let (action, body): (String, String) = (r.get(1)?, r.get(3)?);
                let action = QueuedCall::from_name(&action).ok_or_else(|| {
                    let e = format!("unknown queued call {action:?}");
                    rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, e.into())
                })?;
                Ok(Pending {
                    id: r.get(0)?,
                    action,
                    target: r.get(2)?,
                    body: serde_json::from_str(&body).unwrap_or_default(),
                    unknown_tries: r.get(4)?,
                    error: r.get(5)?,
                })
            })
            .map_err(|e| self.wrap(e))?;
        rows.map(|r| r.map_err(|e| self.wrap(e))).collect()
    }

    /// Calls still to be sent (refused ones are kept apart, T10).
    pub fn pending_count(&self) -> Result<usize> {
        self.conn
            .query_row("SELECT count(*) FROM pending WHERE refused_at IS NULL", [], |r| r.get::<_, i64>(0))
            .map(|n| n as usize)
            .map_err(|e| self.wrap(e))
    }

    /// Applies the A4 decision for one queued call; `unknown_tries` is its new count.
    pub fn settle(
        &mut self,
        p: &Pending,
        next: &NextStep,
        unknown_tries: u32,
        error: Option<&str>,
        now: Ts,
    ) -> Result<()> {
        self.write(|tx| {
            match next {
                NextStep::Done => tx.execute("DELETE FROM pending WHERE id = ?1", [p.id])?,
                NextStep::Drop(why) => {
                    tracing::warn!(action = %p.action, target = %p.target, reason = %why, "dropping queued server call");
                    tx.execute("DELETE FROM pending WHERE id = ?1", [p.id])?
                }
                NextStep::Refused(why) => {
                    tracing::warn!(action = %p.action, target = %p.target, reason = %why, "the server refused a queued call; kept, not retried");
                    tx.execute(
                        "UPDATE pending SET refused_at = ?2, last_error = ?3 WHERE id = ?1",
                        params![p.id, ms(now), why],
                    )?
                }
                NextStep::RetryAt(at) => tx.execute(
                    "UPDATE pending SET next_at = ?2, unknown_tries = ?3, last_error = ?4 WHERE id = ?1",
                    params![p.id, ms(*at), unknown_tries, error],
                )?,
            };
            Ok(())
        })
    }
}

/// The server route for a local step.
fn server_call(step: &Step) -> (QueuedCall, StepRequest) {
    match step {
        Step::See | Step::Deliver | Step::Expire => (QueuedCall::Seen, StepRequest::default()),
        Step::Done { result } => (QueuedCall::Ack, StepRequest { result: result.clone(), reason: None }),
        Step::Fail { reason } => (QueuedCall::Fail, StepRequest { result: None, reason: Some(reason.clone()) }),
    }
}

/// Rows of `inbox` matching `filter`, on a plain connection or inside a transaction. A row
/// that no longer parses is an error naming it.
fn select_in(conn: &Connection, filter: &str, args: impl rusqlite::Params) -> rusqlite::Result<Vec<Mail>> {
    let sql = format!("SELECT {MAIL_COLUMNS} FROM inbox WHERE {filter}");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(args)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(
            codec::mail(row)
                .map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e)))?,
        );
    }
    Ok(out)
}

fn get_in(conn: &Connection, id: &str) -> rusqlite::Result<Option<Mail>> {
    Ok(select_in(conn, "id = ?1", [id])?.pop())
}

fn set_state(tx: &Transaction, key: &str, value: &str) -> rusqlite::Result<()> {
    tx.execute(
        "INSERT INTO state (key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
        params![key, value],
    )
    .map(|_| ())
}

fn insert(tx: &Transaction, m: &Mail, now: Ts, quarantine: Option<&str>) -> rusqlite::Result<()> {
    let placeholders: Vec<String> = (1..=28).map(|i| format!("?{i}")).collect();
    let sql = format!(
        "INSERT INTO inbox (seq, received_at, quarantine, {MAIL_INSERT_COLUMNS}) VALUES ({})",
        placeholders.join(", ")
    );
    let head = [Value::int(m.seq), Value::ts(now), Value::Text(quarantine)];
    let params = head.into_iter().chain(codec::mail_lifecycle(m)).chain(codec::mail_identity(m));
    tx.prepare_cached(&sql)?.execute(rusqlite::params_from_iter(params)).map(|_| ())
}

fn update(tx: &Transaction, m: &Mail) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE inbox SET state = ?2, expires_at = ?3, delivered_at = ?4, delivered_by = ?5, seen_at = ?6, seen_by = ?7, \
         done_at = ?8, result = ?9, fail_reason = ?10, presented_at = ?11, presented_session = ?12, last_reminded_at = ?13 \
         WHERE id = ?1",
    )?
    .execute(rusqlite::params_from_iter(codec::mail_lifecycle(m)))
    .map(|_| ())
}

fn queue(
    tx: &Transaction,
    action: QueuedCall,
    target: &str,
    body: &impl serde::Serialize,
    now: Ts,
) -> rusqlite::Result<()> {
    let body = serde_json::to_string(body).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    tx.prepare_cached("INSERT INTO pending (action, target, body, next_at, created_at) VALUES (?1, ?2, ?3, ?4, ?4)")?
        .execute(params![action.as_str(), target, body, ms(now)])
        .map(|_| ())
}

#[cfg(test)]
pub(crate) mod tests {
    use pcmail_core::intent::{InboundMessage, intent_mail};
    use pcmail_core::mail::{MailKind, MailState};

    use super::*;

    pub fn at(secs: i64) -> Ts {
        Ts::from_timestamp(1_700_000_000 + secs, 0).unwrap_or_default()
    }

    pub fn mail(n: u32, kind: MailKind) -> Mail {
        Mail {
            seq: i64::from(n),
            kind,
            subject: format!("subject {n}"),
            body: format!("body {n}"),
            state: MailState::Delivered,
            reply_to: (kind == MailKind::Answer).then(|| "mail--ffffffff".to_string()),
            ..Mail::new(format!("mail--{n:08x}"), "desk".into(), "me".into(), at(i64::from(n)), at(100_000))
        }
    }

    pub fn intent(chat: &str, message: &str, now: Ts) -> Mail {
        let msg = InboundMessage {
            channel: "telegram".into(),
            chat: chat.into(),
            message: message.into(),
            from: "kim".into(),
            text: format!("message {message} in {chat}"),
            edited: false,
        };
        intent_mail(&msg, "me", now, pcmail_core::duration::Dur::from_hours(72))
    }

    fn open(dir: &Path) -> Cache {
        Cache::open(dir, Duration::from_secs(5)).expect("open cache")
    }

    #[test]
    fn p5_group_heads_and_the_tally_agree_with_presenting_the_whole_inbox_after_every_change() {
        use pcmail_core::present::{LIMITS, heads};
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(dir.path());
        let now = at(50_000);
        let agree = |c: &Cache, session: &str| {
            let inbox = c.open_mail().expect("open");
            let ids = |mails: Vec<&Mail>| mails.into_iter().map(|m| m.id.clone()).collect::<Vec<_>>();
            let read = c.group_heads(session, now, LIMITS).expect("heads");
            assert_eq!(ids(read.iter().collect()), ids(heads(&inbox, session, now, LIMITS)), "heads in {session}");
            assert_eq!(c.tally(now).expect("tally"), Tally::of(&inbox, now), "tally");
        };
        // Every kind, urgent or not, some already past their expiry, one for another PC.
        let mut mails: Vec<Mail> = (0..60u32)
            .map(|n| {
                let mut m = mail(n, MailKind::ALL[n as usize % MailKind::ALL.len()]);
                m.urgent = n % 4 == 0;
                if n % 9 == 0 {
                    m.expires_at = at(40_000);
                }
                m
            })
            .collect();
        mails[7].to = "someone-else".into();
        c.merge_polled("me", mails.clone(), 60, at(10)).expect("merge");
        agree(&c, "s1");
        let shown: Vec<String> =
            c.group_heads("s1", now, LIMITS).expect("heads").iter().map(|m| m.id.clone()).collect();
        c.mark_presented(&shown, &[], "s1", "me", now).expect("presented");
        agree(&c, "s1");
        agree(&c, "s2");
        // The server moves some on: done, expired, seen.
        let moved: Vec<Mail> = mails
            .iter()
            .take(30)
            .map(|m| {
                let state = [MailState::Done, MailState::Expired, MailState::Seen][m.seq as usize % 3];
                Mail { state, ..m.clone() }
            })
            .collect();
        c.merge_polled("me", moved, 60, at(20)).expect("merge");
        agree(&c, "s1");
        agree(&c, "s2");
    }

    /// Evaluates `expr` over one row of the given kind and urgency, open and not quarantined.
    fn eval(conn: &Connection, expr: &str, kind: MailKind, urgent: bool) -> Option<i64> {
        let sql = format!(
            "SELECT {expr} FROM (SELECT ?1 AS kind, ?2 AS urgent, NULL AS quarantine, ?3 AS state, \
             NULL AS stop_blocked_at)"
        );
        conn.query_row(&sql, params![kind.as_str(), urgent, MailState::Delivered.as_str()], |r| r.get(0))
            .expect("evaluates")
    }

    #[test]
    fn r3_the_caches_kind_sql_places_every_kind_as_the_core_does() {
        let conn = Connection::open_in_memory().expect("memory");
        let placed = format!("CASE WHEN {} THEN {} END", open_rows(), group_of_row());
        for kind in MailKind::ALL {
            for urgent in [false, true] {
                let m = Mail { kind, urgent, ..mail(1, kind) };
                let core = pcmail_core::present::group(&m, at(0)).map(|g| g as i64);
                assert_eq!(eval(&conn, &placed, kind, urgent), core, "{kind} urgent={urgent}");
                let stops = eval(&conn, &stop_rows(), kind, urgent) == Some(1);
                assert_eq!(stops, kind.blocks_stop() && urgent, "{kind} urgent={urgent}");
                assert_eq!(eval(&conn, &open_intents(), kind, urgent) == Some(1), kind.is_intent(), "{kind}");
            }
        }
    }

    fn plan(conn: &Connection, filter: &str) -> String {
        let sql = format!("EXPLAIN QUERY PLAN SELECT {MAIL_COLUMNS} FROM inbox WHERE {filter}");
        let mut stmt = conn.prepare(&sql).expect("explain");
        let rows = stmt.query_map([], |r| r.get::<_, String>(3)).expect("plan");
        rows.collect::<rusqlite::Result<Vec<_>>>().expect("plan").join("; ")
    }

    #[test]
    fn r3_todays_kinds_derive_the_very_indexes_migration_4_built_and_the_hooks_queries_use_them() {
        // The migrations alone, as every cache of an earlier build has them: today's kinds
        // derive their text, so no cache rebuilds an index on upgrade. A kind that changes one
        // lists it here (and every cache rebuilds it once, at its next open).
        let mut migrated = Connection::open_in_memory().expect("memory");
        schema::migrate_with(&mut migrated, MIGRATIONS, &[]).expect("migrations");
        let rebuilt: Vec<&str> = stale_indexes(&migrated).expect("stale").into_iter().map(|(n, _)| n).collect();
        assert_eq!(rebuilt, [] as [&str; 0], "indexes whose derived text differs from the migrations'");
        let dir = tempfile::tempdir().expect("tempdir");
        drop(open(dir.path()));
        let conn = Connection::open(dir.path().join(CACHE_FILE)).expect("raw");
        assert_eq!(stale_indexes(&conn).expect("stale"), [], "an opened cache holds this build's indexes");
        let unbound = |f: String| f.replace("?1", "1").replace("?2", "0").replace("?3", "'s'").replace("?4", "3");
        for (filter, index) in [
            (unbound(heads_filter()), "inbox_groups"),
            (format!("{} AND expires_at <= 0", open_rows()), "inbox_overdue"),
            (format!("{} ORDER BY created_at", open_intents()), "inbox_intents"),
            (format!("{} AND expires_at > 0", stop_rows()), "inbox_stop"),
        ] {
            let plan = plan(&conn, &filter);
            assert!(plan.contains(&format!("INDEX {index}")), "{index}: {plan}");
        }
    }

    #[test]
    fn r3_an_index_another_builds_kinds_derived_is_rebuilt_at_open_and_used_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(open(dir.path()));
        let conn = Connection::open(dir.path().join(CACHE_FILE)).expect("raw");
        // As a build that grouped answers with the rest would have built it.
        let older = derived_indexes()[0].1.replace("WHEN kind = 'answer' THEN 2 ", "");
        assert_ne!(older, derived_indexes()[0].1);
        conn.execute_batch(&format!("DROP INDEX inbox_groups; {older};")).expect("older index");
        let heads = heads_filter().replace("?1", "1").replace("?2", "0").replace("?3", "'s'").replace("?4", "3");
        assert!(!plan(&conn, &heads).contains("INDEX inbox_groups"), "{}", plan(&conn, &heads));
        drop(conn);
        drop(open(dir.path()));
        let conn = Connection::open(dir.path().join(CACHE_FILE)).expect("raw");
        assert_eq!(stale_indexes(&conn).expect("stale"), []);
        assert!(plan(&conn, &heads).contains("INDEX inbox_groups"), "{}", plan(&conn, &heads));
    }

    #[test]
    fn m11_merge_stores_mail_and_cursor_together_and_repeats_are_harmless() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(dir.path());
        let report =
            c.merge_polled("me", vec![mail(1, MailKind::Note), mail(2, MailKind::Work)], 2, at(5)).expect("merge");
        assert_eq!(report.new.len(), 2);
        assert_eq!(c.state("cursor").expect("state").as_deref(), Some("2"));
        let again = c.merge_polled("me", vec![mail(1, MailKind::Note)], 2, at(6)).expect("merge");
        assert!(again.new.is_empty());
        assert_eq!(c.open_mail().expect("open").len(), 2);
    }

    #[test]
    fn a2_malformed_mail_is_quarantined_and_reported_failed_others_unaffected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(dir.path());
        let mut stray = mail(3, MailKind::Note);
        stray.to = "someone-else".into();
        let report = c.merge_polled("me", vec![mail(1, MailKind::Note), stray], 3, at(5)).expect("merge");
        assert_eq!((report.new.len(), report.quarantined.as_slice()), (1, ["mail--00000003".to_string()].as_slice()));
        assert_eq!(c.open_mail().expect("open").len(), 1, "the quarantined mail is never presented");
        let pending = c.due_pending(at(5)).expect("pending");
        assert_eq!((pending[0].action, pending[0].target.as_str()), (QueuedCall::Fail, "mail--00000003"));
        assert!(pending[0].body["reason"].as_str().is_some_and(|r| r.contains("someone-else")));
    }

    #[test]
    fn i1_recording_the_same_key_twice_is_a_no_op() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(dir.path());
        let m = intent("100", "7", at(0));
        assert!(c.record_intent(&m, &serde_json::json!({"k": 1}), at(0)).expect("record"));
        assert!(!c.record_intent(&m, &serde_json::json!({"k": 1}), at(1)).expect("again"));
        assert_eq!(c.open_intents().expect("intents").len(), 1);
        assert_eq!(c.due_pending(at(1)).expect("pending").len(), 1, "one server call queued");
    }

    #[test]
    fn a4_settled_calls_leave_the_queue_and_unknown_ones_wait() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(dir.path());
        c.merge_polled("me", vec![mail(1, MailKind::Note), mail(2, MailKind::Note)], 2, at(0)).expect("merge");
        c.step("mail--00000001", Step::See, "me", at(1)).expect("see");
        c.step("mail--00000002", Step::Done { result: None }, "me", at(1)).expect("ack");
        let due = c.due_pending(at(1)).expect("due");
        assert_eq!(due.iter().map(|p| p.action.as_str()).collect::<Vec<_>>(), ["seen", "ack"]);
        c.settle(&due[0], &NextStep::Done, 0, None, at(1)).expect("done");
        c.settle(&due[1], &NextStep::RetryAt(at(3601)), 1, Some("404"), at(1)).expect("later");
        assert!(c.due_pending(at(3600)).expect("due").is_empty());
        assert_eq!(c.due_pending(at(3601)).expect("due")[0].unknown_tries, 1);
    }

    #[test]
    fn t10_a_refused_call_is_kept_never_sent_again_and_reported_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut c = open(dir.path());
        let m = intent("-100123", "557", at(0));
        c.record_intent(&m, &serde_json::json!({}), at(0)).expect("record");
        let due = c.due_pending(at(1)).expect("due");
        assert_eq!(due[0].action, QueuedCall::Intent);
        let why = NextStep::Refused("409: its id is taken".into());
        c.settle(&due[0], &why, 0, Some("409"), at(1)).expect("refused");
        assert!(c.due_pending(at(1_000_000)).expect("due").is_empty(), "never sent again");
        assert_eq!(c.pending_count().expect("count"), 0, "not counted as waiting");
        let key = m.external_key.clone().expect("key");
        assert_eq!(c.refusal_of(QueuedCall::Intent, &key).expect("refusal").as_deref(), Some("409: its id is taken"));
        assert_eq!(c.refusal_of(QueuedCall::Seen, &key).expect("refusal"), None);
        let unreported = c.unreported_refusals().expect("unreported");
        assert_eq!(unreported.len(), 1);
        c.mark_reported(unreported[0].id, at(2)).expect("reported");
        assert!(c.unreported_refusals().expect("unreported").is_empty(), "reported once");
        assert!(c.intent_by_key(&key).expect("intent").is_some(), "the message itself stays (I1)");
    }

    /// A3: a hook and the poller, each with its own connection, writing at once.
    #[test]
    fn a3_hook_and_poller_writing_concurrently_lose_no_update() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(open(dir.path()));
        let home = dir.path().to_path_buf();
        let rounds = 200u32;
        let poller = {
            let home = home.clone();
            std::thread::spawn(move || {
                for n in 0..rounds {
                    let mut c = open(&home);
                    c.merge_polled("me", vec![mail(n, MailKind::Note)], i64::from(n), at(i64::from(n))).expect("merge");
                }
            })
        };
        let hook = {
            let home = home.clone();
            std::thread::spawn(move || {
                let mut marked = Vec::new();
                for n in 0..rounds {
                    // Both sides wait as long as it takes: this is about transactions not losing
                    // each other's writes; how long a real hook waits is HOOK_BUSY's business.
                    let mut c = open(&home);
                    c.record_intent(&intent("100", &n.to_string(), at(0)), &serde_json::json!({}), at(0))
                        .expect("intent");
                    let ids: Vec<String> = c.open_mail().expect("open").iter().map(|m| m.id.clone()).collect();
                    c.mark_presented(&ids, &[], &format!("s{n}"), "me", at(i64::from(n))).expect("present");
                    marked.extend(ids);
                }
                marked
            })
        };
        poller.join().expect("poller");
        let marked = hook.join().expect("hook");
        let c = open(&home);
        assert_eq!(c.state("cursor").expect("cursor").as_deref(), Some(&*(rounds - 1).to_string()));
        for n in 0..rounds {
            assert!(c.get(&format!("mail--{n:08x}")).expect("get").is_some(), "mail {n} lost");
        }
        assert_eq!(c.open_intents().expect("intents").len(), rounds as usize, "an intent was lost");
        for id in marked {
            let m = c.get(&id).expect("get").expect("present");
            assert!(m.presented_at.is_some() && m.state == MailState::Seen, "{id}: presentation lost");
        }
    }

    #[test]
    fn i6_processes_opening_a_fresh_cache_at_once_all_migrate_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().to_path_buf();
        let opens: Vec<_> = (0..6)
            .map(|_| {
                let home = home.clone();
                std::thread::spawn(move || Cache::open(&home, Duration::from_secs(5)).map(|_| ()))
            })
            .collect();
        for o in opens {
            assert_eq!(o.join().expect("thread").map_err(|e| e.to_string()), Ok(()));
        }
    }

    #[test]
    fn i6_old_cache_is_migrated_and_a_missing_column_fails_closed() {
        let dir = tempfile::tempdir().expect("tempdir");
        // An empty file at schema version 0 is the oldest cache there is.
        drop(Connection::open(dir.path().join(CACHE_FILE)).expect("raw"));
        drop(open(dir.path()));
        let conn = Connection::open(dir.path().join(CACHE_FILE)).expect("raw");
        conn.execute_batch("ALTER TABLE inbox DROP COLUMN last_reminded_at").expect("drop");
        drop(conn);
        let err = Cache::open(dir.path(), Duration::from_secs(1)).err().expect("must fail closed");
        assert!(err.to_string().contains("inbox.last_reminded_at is missing"), "{err}");
    }
}
