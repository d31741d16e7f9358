//! Row ↔ struct mapping shared by the SQL adapters: one column order and one decoding per tab,
//! whatever the database. Times are integer milliseconds since the epoch everywhere.
//!
//! An adapter implements [`Columns`] for its row type and binds [`Value`]s as parameters; the
//! SQL text (placeholders, upsert spelling) stays with the adapter.

use pcmail_core::Ts;
use pcmail_core::alert::Alert;
use pcmail_core::api::Event;
use pcmail_core::jobs::Job;
use pcmail_core::lease::Lease;
use pcmail_core::ledger::Row as LedgerRow;
use pcmail_core::mail::Mail;
use pcmail_core::manifest::{Kind, SpecRecord};
use pcmail_core::trail::{ObjectRef, Reason};

use crate::{Result, StoreError};

pub fn ms(t: Ts) -> i64 {
    t.timestamp_millis()
}

pub fn from_ms(v: i64) -> Ts {
    Ts::from_timestamp_millis(v).unwrap_or_default()
}

/// One bound parameter, borrowed from the struct being written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Text(Option<&'a str>),
    Int(Option<i64>),
    Bool(bool),
}

impl<'a> Value<'a> {
    pub fn text(s: &'a str) -> Value<'a> {
        Value::Text(Some(s))
    }

    pub fn opt_text(s: &'a Option<String>) -> Value<'a> {
        Value::Text(s.as_deref())
    }

    pub fn int(i: impl Into<i64>) -> Value<'a> {
        Value::Int(Some(i.into()))
    }

    pub fn ts(t: Ts) -> Value<'a> {
        Value::Int(Some(ms(t)))
    }

    pub fn opt_ts(t: Option<Ts>) -> Value<'a> {
        Value::Int(t.map(ms))
    }
}

/// Reading one result row by column index; column errors name the column.
pub trait Columns {
    fn text(&self, i: usize) -> Result<String>;
    fn opt_text(&self, i: usize) -> Result<Option<String>>;
    fn int(&self, i: usize) -> Result<i64>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>>;
    fn flag(&self, i: usize) -> Result<bool>;

    fn ts(&self, i: usize) -> Result<Ts> {
        self.int(i).map(from_ms)
    }

    fn opt_ts(&self, i: usize) -> Result<Option<Ts>> {
        Ok(self.opt_int(i)?.map(from_ms))
    }

    /// A count or attempt number: non-negative and small.
    fn count(&self, i: usize) -> Result<u32> {
        let v = self.int(i)?;
        u32::try_from(v).map_err(|_| StoreError::Corrupt(format!("column {i} holds {v}, not a count")))
    }
}

fn parsed<T: std::str::FromStr<Err = pcmail_core::names::UnknownName>>(what: &str, id: &str, v: &str) -> Result<T> {
    v.parse().map_err(|e| StoreError::Corrupt(format!("{what} {id}: {e}")))
}

pub const MAIL_COLUMNS: &str = "seq, id, \"from\", \"to\", kind, subject, body, urgent, auto, hop, reply_to, channel, \
    external_key, state, created_at, expires_at, delivered_at, delivered_by, seen_at, seen_by, done_at, result, \
    fail_reason, presented_at, presented_session, last_reminded_at";

pub fn mail(r: &dyn Columns) -> Result<Mail> {
    let id = r.text(1)?;
    Ok(Mail {
        seq: r.int(0)?,
        from: r.text(2)?,
        to: r.text(3)?,
        kind: parsed("mail", &id, &r.text(4)?)?,
        subject: r.text(5)?,
        body: r.text(6)?,
        urgent: r.flag(7)?,
        auto: r.flag(8)?,
        hop: r.count(9)?,
        reply_to: r.opt_text(10)?,
        channel: r.text(11)?,
        external_key: r.opt_text(12)?,
        state: parsed("mail", &id, &r.text(13)?)?,
        created_at: r.ts(14)?,
        expires_at: r.ts(15)?,
        delivered_at: r.opt_ts(16)?,
        delivered_by: r.opt_text(17)?,
        seen_at: r.opt_ts(18)?,
        seen_by: r.opt_text(19)?,
        done_at: r.opt_ts(20)?,
        result: r.opt_text(21)?,
        fail_reason: r.opt_text(22)?,
        presented_at: r.opt_ts(23)?,
        presented_session: r.opt_text(24)?,
        last_reminded_at: r.opt_ts(25)?,
        id,
    })
}

/// Columns of a mail insert: the lifecycle ones ([`mail_lifecycle`]) then the identity ones
/// ([`mail_identity`]).
pub const MAIL_INSERT_COLUMNS: &str = "id, state, expires_at, delivered_at, delivered_by, seen_at, seen_by, done_at, \
    result, fail_reason, presented_at, presented_session, last_reminded_at, \"from\", \"to\", kind, subject, body, \
    urgent, auto, hop, reply_to, channel, external_key, created_at";

/// The id, then the 12 columns a mail's life changes (parameters 1..=13 of an update).
pub fn mail_lifecycle(m: &Mail) -> Vec<Value<'_>> {
    vec![
        Value::text(&m.id),
        Value::text(m.state.as_str()),
        Value::ts(m.expires_at),
        Value::opt_ts(m.delivered_at),
        Value::opt_text(&m.delivered_by),
        Value::opt_ts(m.seen_at),
        Value::opt_text(&m.seen_by),
        Value::opt_ts(m.done_at),
        Value::opt_text(&m.result),
        Value::opt_text(&m.fail_reason),
        Value::opt_ts(m.presented_at),
        Value::opt_text(&m.presented_session),
        Value::opt_ts(m.last_reminded_at),
    ]
}

/// The columns fixed at insert, in MAIL_INSERT_COLUMNS order after the lifecycle ones.
pub fn mail_identity(m: &Mail) -> Vec<Value<'_>> {
    vec![
        Value::text(&m.from),
        Value::text(&m.to),
        Value::text(m.kind.as_str()),
        Value::text(&m.subject),
        Value::text(&m.body),
        Value::Bool(m.urgent),
        Value::Bool(m.auto),
        Value::int(m.hop),
        Value::opt_text(&m.reply_to),
        Value::text(&m.channel),
        Value::opt_text(&m.external_key),
        Value::ts(m.created_at),
    ]
}

pub const SPEC_COLUMNS: &str = "kind, name, labels, generation, spec, status, created_at, updated_at";

/// A spec object is found by (kind, name); its creation time is fixed.
pub const SPEC_KEY: &[&str] = &["kind", "name"];
pub const SPEC_FIXED: &[&str] = &["created_at"];

pub fn spec(r: &dyn Columns) -> Result<SpecRecord> {
    let (kind_name, name) = (r.text(0)?, r.text(1)?);
    let corrupt = |what: &str| StoreError::Corrupt(format!("spec {kind_name}/{name}: {what}"));
    let kind = Kind::from_name(&kind_name).ok_or_else(|| corrupt("unknown kind"))?;
    let parsed =
        (serde_json::from_str(&r.text(2)?), serde_json::from_str(&r.text(4)?), serde_json::from_str(&r.text(5)?));
    let (Ok(labels), Ok(spec), Ok(status)) = parsed else {
        return Err(corrupt("labels, spec or status is not valid JSON"));
    };
    Ok(SpecRecord {
        kind,
        generation: r.int(3)?.max(0) as u64,
        spec,
        labels,
        status,
        created_at: r.ts(6)?,
        updated_at: r.ts(7)?,
        name: name.clone(),
    })
}

/// Parameters 1..=8 in SPEC_COLUMNS order; JSON cells are serialized here, once.
pub fn spec_params(r: &SpecRecord) -> (String, String, String) {
    (json(&r.labels), r.spec.to_string(), json(&r.status))
}

pub const ALERT_COLUMNS: &str =
    "kind, subject, state, summary, labels, firing_since, resolved_at, notified, last_sent_at, updated_at";

/// An alert is found by (kind, subject); everything else follows its latest state.
pub const ALERT_KEY: &[&str] = &["kind", "subject"];

pub fn alert(r: &dyn Columns) -> Result<Alert> {
    let (kind, subject) = (r.text(0)?, r.text(1)?);
    let what = format!("{kind}/{subject}");
    let labels = serde_json::from_str(&r.text(4)?)
        .map_err(|_| StoreError::Corrupt(format!("alert {what}: labels are not valid JSON")))?;
    Ok(Alert {
        kind: parsed("alert", &what, &kind)?,
        state: parsed("alert", &what, &r.text(2)?)?,
        summary: r.text(3)?,
        labels,
        firing_since: r.ts(5)?,
        resolved_at: r.opt_ts(6)?,
        notified: r.opt_text(7)?.map(|n| parsed("alert", &what, &n)).transpose()?,
        last_sent_at: r.opt_ts(8)?,
        updated_at: r.ts(9)?,
        subject,
    })
}

/// Parameters 1..=10 in ALERT_COLUMNS order, with the labels serialized by the caller.
pub fn alert_params<'a>(a: &'a Alert, labels: &'a str) -> Vec<Value<'a>> {
    vec![
        Value::text(a.kind.as_str()),
        Value::text(&a.subject),
        Value::text(a.state.as_str()),
        Value::text(&a.summary),
        Value::text(labels),
        Value::ts(a.firing_since),
        Value::opt_ts(a.resolved_at),
        Value::Text(a.notified.map(|n| n.as_str())),
        Value::opt_ts(a.last_sent_at),
        Value::ts(a.updated_at),
    ]
}

pub const LEDGER_COLUMNS: &str = "project, id, state, run_requested, task, content, source, evidence, due, assignee, \
    function, result, executed_at, instruction, key, failures, refresh, seq";

/// A ledger row is found by (project, id); its `seq` is fixed when it is added.
pub const LEDGER_KEY: &[&str] = &["project", "id"];
pub const LEDGER_FIXED: &[&str] = &["seq"];

pub fn ledger_row(r: &dyn Columns) -> Result<LedgerRow> {
    let id = r.text(1)?;
    Ok(LedgerRow {
        project: r.text(0)?,
        state: parsed("ledger row", &id, &r.text(2)?)?,
        run_requested: r.flag(3)?,
        task: r.text(4)?,
        content: r.text(5)?,
        source: r.text(6)?,
        evidence: r.text(7)?,
        due: r.text(8)?,
        assignee: r.text(9)?,
        function: r.text(10)?,
        result: r.text(11)?,
        executed_at: r.opt_ts(12)?,
        instruction: r.text(13)?,
        key: r.text(14)?,
        failures: r.count(15)?,
        refresh: r.flag(16)?,
        id,
    })
}

/// Parameters 1..=18 in LEDGER_COLUMNS order; `seq` is the number in the id.
pub fn ledger_params(row: &LedgerRow) -> Vec<Value<'_>> {
    let seq: i64 = row.id.trim_start_matches("T-").parse().unwrap_or(0);
    vec![
        Value::text(&row.project),
        Value::text(&row.id),
        Value::text(row.state.as_str()),
        Value::Bool(row.run_requested),
        Value::text(&row.task),
        Value::text(&row.content),
        Value::text(&row.source),
        Value::text(&row.evidence),
        Value::text(&row.due),
        Value::text(&row.assignee),
        Value::text(&row.function),
        Value::text(&row.result),
        Value::opt_ts(row.executed_at),
        Value::text(&row.instruction),
        Value::text(&row.key),
        Value::int(row.failures),
        Value::Bool(row.refresh),
        Value::int(seq),
    ]
}

pub const JOB_COLUMNS: &str = "id, queue, function, payload, state, priority, attempts, max_attempts, run_after, \
    lease_owner, lease_token, lease_expires_at, heartbeat_at, rescues, last_error, result, unique_key, ledger_ref, \
    created_at, finished_at, enqueued_by";

/// A job is found by its id; what it is (queue, function, payload, keys, origin, creation)
/// never changes after it is enqueued.
pub const JOB_KEY: &[&str] = &["id"];
pub const JOB_FIXED: &[&str] =
    &["queue", "function", "payload", "unique_key", "ledger_ref", "created_at", "enqueued_by"];

/// An upsert into `table` of rows in `columns` order, taken from `rows` (`VALUES (?1, …)` in
/// SQLite, `VALUES ($1, …)` or `SELECT * FROM unnest(…)` in PostgreSQL): a row whose `key`
/// exists takes every new value but the key's and the `fixed` columns'. Both dialects spell it
/// alike, so it is written once, from the codec's column list.
pub fn upsert_sql(table: &str, columns: &str, key: &[&str], fixed: &[&str], rows: &str) -> String {
    let updates: Vec<String> = columns
        .split(", ")
        .filter(|c| !key.contains(c) && !fixed.contains(c))
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO {table} ({columns}) {rows} ON CONFLICT ({}) DO UPDATE SET {}",
        key.join(", "),
        updates.join(", ")
    )
}

/// The number of columns in a codec column list.
pub fn arity(columns: &str) -> usize {
    columns.split(", ").count()
}

pub fn job(r: &dyn Columns) -> Result<Job> {
    let id = r.text(0)?;
    Ok(Job {
        queue: r.text(1)?,
        function: r.text(2)?,
        payload: r.text(3)?,
        state: parsed("job", &id, &r.text(4)?)?,
        priority: r.int(5)?,
        attempts: r.count(6)?,
        max_attempts: r.count(7)?,
        run_after: r.ts(8)?,
        lease_owner: r.opt_text(9)?,
        lease_token: r.opt_text(10)?,
        lease_expires_at: r.opt_ts(11)?,
        heartbeat_at: r.opt_ts(12)?,
        rescues: r.count(13)?,
        last_error: r.opt_text(14)?,
        result: r.opt_text(15)?,
        unique_key: r.opt_text(16)?,
        ledger_ref: r.opt_text(17)?,
        created_at: r.ts(18)?,
        finished_at: r.opt_ts(19)?,
        enqueued_by: r.opt_text(20)?,
        id,
    })
}

/// Parameters 1..=21 in JOB_COLUMNS order.
pub fn job_params(j: &Job) -> Vec<Value<'_>> {
    vec![
        Value::text(&j.id),
        Value::text(&j.queue),
        Value::text(&j.function),
        Value::text(&j.payload),
        Value::text(j.state.as_str()),
        Value::int(j.priority),
        Value::int(j.attempts),
        Value::int(j.max_attempts),
        Value::ts(j.run_after),
        Value::opt_text(&j.lease_owner),
        Value::opt_text(&j.lease_token),
        Value::opt_ts(j.lease_expires_at),
        Value::opt_ts(j.heartbeat_at),
        Value::int(j.rescues),
        Value::opt_text(&j.last_error),
        Value::opt_text(&j.result),
        Value::opt_text(&j.unique_key),
        Value::opt_text(&j.ledger_ref),
        Value::ts(j.created_at),
        Value::opt_ts(j.finished_at),
        Value::opt_text(&j.enqueued_by),
    ]
}

pub const EVENT_COLUMNS: &str = "at, object, reason, message, actor";

/// R1: read leniently, as the API's JSON is: a row a newer build wrote keeps its object's text
/// and reads an unknown reason as `Other`.
pub fn event(r: &dyn Columns) -> Result<Event> {
    Ok(Event {
        at: r.ts(0)?,
        object: ObjectRef::parse(&r.text(1)?),
        reason: Reason::lenient(&r.text(2)?),
        message: r.text(3)?,
        actor: r.text(4)?,
    })
}

/// `object` is `e.object`'s text, made by the caller (a parameter borrows it).
pub fn event_params<'a>(e: &'a Event, object: &'a str) -> Vec<Value<'a>> {
    vec![
        Value::ts(e.at),
        Value::text(object),
        Value::text(e.reason.as_str()),
        Value::text(&e.message),
        Value::text(&e.actor),
    ]
}

pub const LEASE_COLUMNS: &str = "name, holder, acquired_at, renewed_at, expires_at";

/// A lease is found by its name.
pub const LEASE_KEY: &[&str] = &["name"];

pub fn lease(r: &dyn Columns) -> Result<Lease> {
    Ok(Lease {
        name: r.text(0)?,
        holder: r.text(1)?,
        acquired_at: r.ts(2)?,
        renewed_at: r.ts(3)?,
        expires_at: r.ts(4)?,
    })
}

pub fn lease_params(l: &Lease) -> Vec<Value<'_>> {
    vec![
        Value::text(&l.name),
        Value::text(&l.holder),
        Value::ts(l.acquired_at),
        Value::ts(l.renewed_at),
        Value::ts(l.expires_at),
    ]
}

/// The columns this build reads, per table, in every SQL adapter. Checked at open so that a hand-edited or
/// half-migrated database fails at start with the missing column named, not mid-request.
pub const REQUIRED: &[(&str, &[&str])] = &[
    ("mail", MAIL_TABLE_COLUMNS),
    ("specs", &["kind", "name", "labels", "generation", "spec", "status", "created_at", "updated_at"]),
    ("events", &["id", "at", "object", "reason", "message", "actor"]),
    ("machines", &["name", "last_poll_at", "client"]),
    (
        "alerts",
        &[
            "kind",
            "subject",
            "state",
            "summary",
            "labels",
            "firing_since",
            "resolved_at",
            "notified",
            "last_sent_at",
            "updated_at",
        ],
    ),
    ("mail_counts", &["state", "kind", "channel", "n"]),
    ("tokens", &["machine", "hash", "created_at"]),
    (
        "ledger",
        &[
            "project",
            "id",
            "seq",
            "state",
            "run_requested",
            "task",
            "content",
            "source",
            "evidence",
            "due",
            "assignee",
            "function",
            "result",
            "executed_at",
            "instruction",
            "key",
            "failures",
            "refresh",
        ],
    ),
    ("ledger_projects", &["project", "next_seq"]),
    ("kv", &["key", "value"]),
    ("leases", &["name", "holder", "acquired_at", "renewed_at", "expires_at"]),
    (
        "jobs",
        &[
            "seq",
            "id",
            "queue",
            "function",
            "payload",
            "state",
            "priority",
            "attempts",
            "max_attempts",
            "run_after",
            "lease_owner",
            "lease_token",
            "lease_expires_at",
            "heartbeat_at",
            "rescues",
            "last_error",
            "result",
            "unique_key",
            "ledger_ref",
            "created_at",
            "finished_at",
            "enqueued_by",
        ],
    ),
];

/// The column list every mail-shaped table carries (the store's `mail`, the PC cache's `inbox`).
pub const MAIL_TABLE_COLUMNS: &[&str] = &[
    "seq",
    "id",
    "from",
    "to",
    "kind",
    "subject",
    "body",
    "urgent",
    "auto",
    "hop",
    "reply_to",
    "channel",
    "external_key",
    "state",
    "created_at",
    "expires_at",
    "delivered_at",
    "delivered_by",
    "seen_at",
    "seen_by",
    "done_at",
    "result",
    "fail_reason",
    "presented_at",
    "presented_session",
    "last_reminded_at",
];

pub fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "null".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l7_j1_an_upsert_updates_every_column_but_its_key_and_fixed_ones_named_from_the_codec() {
        for (columns, key, fixed) in [
            (LEDGER_COLUMNS, LEDGER_KEY, LEDGER_FIXED),
            (JOB_COLUMNS, JOB_KEY, JOB_FIXED),
            (SPEC_COLUMNS, SPEC_KEY, SPEC_FIXED),
            (ALERT_COLUMNS, ALERT_KEY, &[]),
            (LEASE_COLUMNS, LEASE_KEY, &[]),
        ] {
            let all: Vec<&str> = columns.split(", ").collect();
            for c in key.iter().chain(fixed) {
                assert!(all.contains(c), "{c} is not a column of {columns}");
            }
            let sql = upsert_sql("t", columns, key, fixed, "VALUES (?1)");
            let (_, set) = sql.split_once("DO UPDATE SET ").expect("an update clause");
            let updated: Vec<&str> = set.split(", ").map(|a| a.split(" = ").next().unwrap_or_default()).collect();
            assert_eq!(updated.len() + key.len() + fixed.len(), all.len(), "{sql}");
            assert!(updated.iter().all(|c| !key.contains(c) && !fixed.contains(c)), "{sql}");
            assert!(sql.contains(&format!("ON CONFLICT ({})", key.join(", "))), "{sql}");
        }
        assert_eq!(arity(LEDGER_COLUMNS), 18);
    }
}
