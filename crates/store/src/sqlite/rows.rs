//! Row ↔ struct mapping. Times are stored as integer milliseconds since the epoch.

use pcmail_core::Ts;
use pcmail_core::alert::Alert;
use pcmail_core::jobs::Job;
use pcmail_core::ledger::Row as LedgerRow;
use pcmail_core::mail::Mail;
use pcmail_core::manifest::{Kind, SpecRecord};
use rusqlite::Row;
use rusqlite::types::ToSql;

use crate::StoreError;

pub const MAIL_COLUMNS: &str = "seq, id, \"from\", \"to\", kind, subject, body, urgent, auto, hop, reply_to, channel, \
    external_key, state, created_at, expires_at, delivered_at, delivered_by, seen_at, seen_by, done_at, result, \
    fail_reason, presented_at, presented_session, last_reminded_at";

pub fn ms(t: Ts) -> i64 {
    t.timestamp_millis()
}

pub fn from_ms(v: i64) -> Ts {
    Ts::from_timestamp_millis(v).unwrap_or_default()
}

fn opt_ts(v: Option<i64>) -> Option<Ts> {
    v.map(from_ms)
}

/// The outer error is SQLite's; the inner one is a value that no longer parses.
pub fn mail_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Mail, StoreError>> {
    let id: String = r.get(1)?;
    let kind: String = r.get(4)?;
    let state: String = r.get(13)?;
    let (kind, state) = match (kind.parse(), state.parse()) {
        (Ok(k), Ok(s)) => (k, s),
        (Err(e), _) | (_, Err(e)) => {
            return Ok(Err(StoreError::Corrupt(format!("mail {id}: {e}"))));
        }
    };
    Ok(Ok(Mail {
        seq: r.get(0)?,
        id,
        from: r.get(2)?,
        to: r.get(3)?,
        kind,
        subject: r.get(5)?,
        body: r.get(6)?,
        urgent: r.get(7)?,
        auto: r.get(8)?,
        hop: r.get(9)?,
        reply_to: r.get(10)?,
        channel: r.get(11)?,
        external_key: r.get(12)?,
        state,
        created_at: from_ms(r.get(14)?),
        expires_at: from_ms(r.get(15)?),
        delivered_at: opt_ts(r.get(16)?),
        delivered_by: r.get(17)?,
        seen_at: opt_ts(r.get(18)?),
        seen_by: r.get(19)?,
        done_at: opt_ts(r.get(20)?),
        result: r.get(21)?,
        fail_reason: r.get(22)?,
        presented_at: opt_ts(r.get(23)?),
        presented_session: r.get(24)?,
        last_reminded_at: opt_ts(r.get(25)?),
    }))
}

/// Columns of an insert: the lifecycle ones ([`lifecycle_params`]) then the identity ones
/// ([`identity_params`]).
pub const INSERT_COLUMNS: &str = "id, state, expires_at, delivered_at, delivered_by, seen_at, seen_by, done_at, result, \
    fail_reason, presented_at, presented_session, last_reminded_at, \"from\", \"to\", kind, subject, body, urgent, auto, \
    hop, reply_to, channel, external_key, created_at";

/// The columns fixed at insert, in INSERT_COLUMNS order after the lifecycle ones.
pub fn identity_params(m: &Mail) -> Vec<Box<dyn ToSql + '_>> {
    vec![
        Box::new(&m.from),
        Box::new(&m.to),
        Box::new(m.kind.as_str()),
        Box::new(&m.subject),
        Box::new(&m.body),
        Box::new(m.urgent),
        Box::new(m.auto),
        Box::new(m.hop),
        Box::new(&m.reply_to),
        Box::new(&m.channel),
        Box::new(&m.external_key),
        Box::new(ms(m.created_at)),
    ]
}

/// Parameters ?1..?13 of the lifecycle update: the id, then the columns a mail's life changes.
pub fn lifecycle_params(m: &Mail) -> Vec<Box<dyn ToSql + '_>> {
    let t = |v: Option<Ts>| v.map(ms);
    vec![
        Box::new(&m.id),
        Box::new(m.state.as_str()),
        Box::new(ms(m.expires_at)),
        Box::new(t(m.delivered_at)),
        Box::new(&m.delivered_by),
        Box::new(t(m.seen_at)),
        Box::new(&m.seen_by),
        Box::new(t(m.done_at)),
        Box::new(&m.result),
        Box::new(&m.fail_reason),
        Box::new(t(m.presented_at)),
        Box::new(&m.presented_session),
        Box::new(t(m.last_reminded_at)),
    ]
}

pub fn spec_from_row(r: &Row<'_>) -> rusqlite::Result<Result<SpecRecord, StoreError>> {
    let kind_name: String = r.get(0)?;
    let name: String = r.get(1)?;
    let corrupt = |what: &str| StoreError::Corrupt(format!("spec {kind_name}/{name}: {what}"));
    let Some(kind) = Kind::ALL.into_iter().find(|k| k.as_str() == kind_name) else {
        return Ok(Err(corrupt("unknown kind")));
    };
    let labels: String = r.get(2)?;
    let spec: String = r.get(4)?;
    let status: String = r.get(5)?;
    let parsed = (serde_json::from_str(&labels), serde_json::from_str(&spec), serde_json::from_str(&status));
    let (Ok(labels), Ok(spec), Ok(status)) = parsed else {
        return Ok(Err(corrupt("labels, spec or status is not valid JSON")));
    };
    Ok(Ok(SpecRecord {
        kind,
        name: name.clone(),
        labels,
        generation: r.get::<_, i64>(3)? as u64,
        spec,
        status,
        created_at: from_ms(r.get(6)?),
        updated_at: from_ms(r.get(7)?),
    }))
}

pub const ALERT_COLUMNS: &str =
    "kind, subject, state, summary, labels, firing_since, resolved_at, notified, last_sent_at, updated_at";

pub fn alert_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Alert, StoreError>> {
    let kind: String = r.get(0)?;
    let subject: String = r.get(1)?;
    let state: String = r.get(2)?;
    let labels: String = r.get(4)?;
    let notified: Option<String> = r.get(7)?;
    let corrupt = |what: String| Ok(Err(StoreError::Corrupt(format!("alert {kind}/{subject}: {what}"))));
    let (kind_v, state_v) = match (kind.parse(), state.parse()) {
        (Ok(k), Ok(s)) => (k, s),
        (Err(e), _) | (_, Err(e)) => return corrupt(e),
    };
    let notified = match notified.map(|n| n.parse()).transpose() {
        Ok(n) => n,
        Err(e) => return corrupt(e),
    };
    let Ok(labels) = serde_json::from_str(&labels) else {
        return corrupt("labels are not valid JSON".into());
    };
    Ok(Ok(Alert {
        kind: kind_v,
        subject: subject.clone(),
        state: state_v,
        summary: r.get(3)?,
        labels,
        firing_since: from_ms(r.get(5)?),
        resolved_at: opt_ts(r.get(6)?),
        notified,
        last_sent_at: opt_ts(r.get(8)?),
        updated_at: from_ms(r.get(9)?),
    }))
}

pub const LEDGER_COLUMNS: &str = "project, id, state, run_requested, task, content, source, evidence, due, assignee, \
    function, result, executed_at, instruction, key, failures, refresh, seq";

pub fn ledger_from_row(r: &Row<'_>) -> rusqlite::Result<Result<LedgerRow, StoreError>> {
    let state: String = r.get(2)?;
    let id: String = r.get(1)?;
    let state = match state.parse() {
        Ok(s) => s,
        Err(e) => return Ok(Err(StoreError::Corrupt(format!("ledger row {id}: {e}")))),
    };
    Ok(Ok(LedgerRow {
        project: r.get(0)?,
        id,
        state,
        run_requested: r.get(3)?,
        task: r.get(4)?,
        content: r.get(5)?,
        source: r.get(6)?,
        evidence: r.get(7)?,
        due: r.get(8)?,
        assignee: r.get(9)?,
        function: r.get(10)?,
        result: r.get(11)?,
        executed_at: opt_ts(r.get(12)?),
        instruction: r.get(13)?,
        key: r.get(14)?,
        failures: r.get(15)?,
        refresh: r.get(16)?,
    }))
}

/// Parameters ?1..?18 in LEDGER_COLUMNS order; `seq` is the number in the id.
pub fn ledger_params(row: &LedgerRow) -> Vec<Box<dyn ToSql + '_>> {
    let seq: i64 = row.id.trim_start_matches("T-").parse().unwrap_or(0);
    vec![
        Box::new(&row.project),
        Box::new(&row.id),
        Box::new(row.state.as_str()),
        Box::new(row.run_requested),
        Box::new(&row.task),
        Box::new(&row.content),
        Box::new(&row.source),
        Box::new(&row.evidence),
        Box::new(&row.due),
        Box::new(&row.assignee),
        Box::new(&row.function),
        Box::new(&row.result),
        Box::new(row.executed_at.map(ms)),
        Box::new(&row.instruction),
        Box::new(&row.key),
        Box::new(row.failures),
        Box::new(row.refresh),
        Box::new(seq),
    ]
}

pub const JOB_COLUMNS: &str = "id, queue, function, payload, state, priority, attempts, max_attempts, run_after, \
    lease_owner, lease_token, lease_expires_at, heartbeat_at, rescues, last_error, result, unique_key, ledger_ref, \
    created_at, finished_at";

pub fn job_from_row(r: &Row<'_>) -> rusqlite::Result<Result<Job, StoreError>> {
    let id: String = r.get(0)?;
    let state: String = r.get(4)?;
    let state = match state.parse() {
        Ok(s) => s,
        Err(e) => return Ok(Err(StoreError::Corrupt(format!("job {id}: {e}")))),
    };
    Ok(Ok(Job {
        id,
        queue: r.get(1)?,
        function: r.get(2)?,
        payload: r.get(3)?,
        state,
        priority: r.get(5)?,
        attempts: r.get(6)?,
        max_attempts: r.get(7)?,
        run_after: from_ms(r.get(8)?),
        lease_owner: r.get(9)?,
        lease_token: r.get(10)?,
        lease_expires_at: opt_ts(r.get(11)?),
        heartbeat_at: opt_ts(r.get(12)?),
        rescues: r.get(13)?,
        last_error: r.get(14)?,
        result: r.get(15)?,
        unique_key: r.get(16)?,
        ledger_ref: r.get(17)?,
        created_at: from_ms(r.get(18)?),
        finished_at: opt_ts(r.get(19)?),
    }))
}

/// Parameters ?1..?20 in JOB_COLUMNS order.
pub fn job_params(j: &Job) -> Vec<Box<dyn ToSql + '_>> {
    let t = |v: Option<Ts>| v.map(ms);
    vec![
        Box::new(&j.id),
        Box::new(&j.queue),
        Box::new(&j.function),
        Box::new(&j.payload),
        Box::new(j.state.as_str()),
        Box::new(j.priority),
        Box::new(j.attempts),
        Box::new(j.max_attempts),
        Box::new(ms(j.run_after)),
        Box::new(&j.lease_owner),
        Box::new(&j.lease_token),
        Box::new(t(j.lease_expires_at)),
        Box::new(t(j.heartbeat_at)),
        Box::new(j.rescues),
        Box::new(&j.last_error),
        Box::new(&j.result),
        Box::new(&j.unique_key),
        Box::new(&j.ledger_ref),
        Box::new(ms(j.created_at)),
        Box::new(t(j.finished_at)),
    ]
}
