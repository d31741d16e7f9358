//! The store: where the sheet's tabs live. One trait, several adapters, one contract suite.
//!
//! The trait is deliberately coarse: the shell loads what a planner needs, the planner (a pure
//! function of pcmail-core) decides, and the adapter applies the result in one transaction.
//! Adapters hold no rules of DESIGN.md; they only store, select and keep writes atomic.

#[cfg(all(feature = "postgres", feature = "sheets"))]
mod any;
mod cells;
pub mod codec;
#[cfg(test)]
#[cfg(all(feature = "postgres", feature = "sheets"))]
mod contract;
pub mod health;
#[cfg(feature = "postgres")]
pub mod postgres;
mod predicates;
pub mod private;
#[cfg(feature = "sheets")]
pub mod sheets;
pub mod sqlite;
pub mod transfer;

use std::future::Future;

use pcmail_core::Ts;
use pcmail_core::alert::Alert;
use pcmail_core::api::Event;
use pcmail_core::jobs::{Job, JobState};
use pcmail_core::lease::Lease;
use pcmail_core::ledger::{Row, RowPatch, RowState};
use pcmail_core::mail::{Mail, MailState};
use pcmail_core::manifest::{Kind, SpecRecord, Status};
use pcmail_core::page::{self, Listing};
use pcmail_core::trail::{ObjectKind, Reason};
use tokio::sync::mpsc;

#[cfg(all(feature = "postgres", feature = "sheets"))]
pub use any::{AnyStore, open, open_to_read};
pub use cells::{Batch, Cell, Incoming};
#[cfg(feature = "postgres")]
pub use postgres::PgStore;
#[cfg(feature = "sheets")]
pub use sheets::SheetsStore;
pub use sqlite::SqliteStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk is full, read-only or failing: the API answers 503 and nothing is half-written.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// E15: a write refused for want of space (SQLite `SQLITE_FULL`, PostgreSQL `53100`,
    /// `ENOSPC`). An outage like [`StoreError::Unavailable`]: a 503, retried, nothing
    /// half-written; it also makes `/readyz` name the disk until a write succeeds again.
    #[error("store refuses writes, the disk is full: {0}")]
    NoSpace(String),
    /// The schema is older or newer than this build understands (I6: fail closed).
    #[error("store schema problem: {0}")]
    Schema(String),
    /// A stored value no longer parses; names the row and the column.
    #[error("corrupt row in store: {0}")]
    Corrupt(String),
    #[error("invalid store URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// The credentials a store signs in with (a service-account key) are unreadable or wrong.
    #[error("store credentials {whose}: {reason}")]
    Credentials { whose: String, reason: String },
    #[error("store error: {0}")]
    Backend(String),
    /// O3: a copy's target already holds rows in these tabs; nothing was written to it.
    #[error("the target store already holds data ({0}); copy into an empty store (nothing was written)")]
    NotEmpty(String),
    /// O3: a copy into this store stopped before its end; serving it would serve part of it.
    #[error(
        "this store holds a copy that did not finish (a restore or store copy was stopped): \
         empty it (delete the SQLite file, or drop and create the database) and copy again"
    )]
    UnfinishedCopy,
}

impl StoreError {
    /// The kind of failure, for a metric label: one of a fixed set.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::Unavailable(_) => "store_unavailable",
            StoreError::NoSpace(_) => "store_no_space",
            StoreError::Schema(_) => "store_schema",
            StoreError::Corrupt(_) => "store_corrupt",
            StoreError::BadUrl { .. } => "store_bad_url",
            StoreError::Credentials { .. } => "store_credentials",
            StoreError::Backend(_) => "store_backend",
            StoreError::NotEmpty(_) => "store_not_empty",
            StoreError::UnfinishedCopy => "store_unfinished_copy",
        }
    }

    /// Every value [`StoreError::kind`] answers.
    pub const KINDS: [&'static str; 9] = [
        "store_unavailable",
        "store_no_space",
        "store_schema",
        "store_corrupt",
        "store_bad_url",
        "store_credentials",
        "store_backend",
        "store_not_empty",
        "store_unfinished_copy",
    ];

    /// Whether this is an outage that passes by itself (unreachable, read-only, full): worth
    /// a retry, answered 503, never a sign of bad input.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Unavailable(_) | StoreError::NoSpace(_))
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which mail rows a [`Store::mail_transaction`] loads for its planner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MailSelect {
    /// These ids; missing ones are simply absent from the loaded rows.
    Ids(Vec<String>),
    /// M11: a recipient's mail after its cursor, in delivery order.
    After { to: String, cursor: i64, limit: usize },
    /// M8: mail not yet terminal whose expiry is at or before `now`.
    Expiring { now: Ts, limit: usize },
    /// M9: mail still `new` that was created at or before `created_before`.
    Undelivered { created_before: Ts, limit: usize },
    /// M9: mail `delivered` (not seen) at or before `delivered_before`.
    Unread { delivered_before: Ts, limit: usize },
    /// I4: intents not yet terminal, created at or before `created_before`.
    OpenIntents { created_before: Ts, limit: usize },
}

/// What a planner decided, applied atomically by the adapter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MailWrites {
    /// New rows; the adapter assigns `seq`.
    pub insert: Vec<Mail>,
    /// Rows whose lifecycle replaces the stored one with the same id: state, expiry and every
    /// stamp. A mail's identity (from, to, kind, subject, body, urgent, auto, hop, replyTo,
    /// channel, externalKey, createdAt) is fixed at insert and never rewritten.
    pub update: Vec<Mail>,
    pub events: Vec<Event>,
    /// M11/A5: every poll is a heartbeat of the polling machine.
    pub heartbeat: Option<Heartbeat>,
    /// Alert rows upserted in the same transaction (M10's arrival notices are written with
    /// the mail they announce, so a crash cannot separate them).
    pub alerts: Vec<Alert>,
}

impl MailWrites {
    pub fn is_empty(&self) -> bool {
        self.insert.is_empty()
            && self.update.is_empty()
            && self.events.is_empty()
            && self.heartbeat.is_none()
            && self.alerts.is_empty()
    }
}

/// One poll of a machine: when, and with which client version (V1; empty when the client did
/// not say, as clients before V1 do not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    pub machine: String,
    pub at: Ts,
    pub client: String,
}

pub use pcmail_core::api::MachineSeen;

/// How many rows of one group (a ledger's project, a job's queue) are in one state, for the
/// gauges and the console (R1: the state is the core's enum, parsed where the row is read).
///
/// A state this build does not know fails the read as [`StoreError::Corrupt`] naming it and
/// its group, as reading such a row does: counting it under a fallback would show totals that
/// no listing of this build can open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount<S> {
    pub group: String,
    pub state: S,
    pub count: u64,
}

impl<S: std::str::FromStr<Err = pcmail_core::names::UnknownName>> StateCount<S> {
    /// One `GROUP BY` row of `tab` as the adapters read it.
    fn parse(tab: &str, group: String, state: &str, count: i64) -> Result<StateCount<S>> {
        let state = state.parse::<S>().map_err(|e| StoreError::Corrupt(format!("{tab} of {group:?}: {e}")))?;
        Ok(StateCount { group, state, count: count.max(0) as u64 })
    }
}

/// How many mails are in one (state, kind, channel), kept without scanning the mail tab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailCount {
    pub state: MailState,
    pub kind: pcmail_core::mail::MailKind,
    pub channel: String,
    pub count: u64,
}

impl MailCount {
    /// A row of the `mail_counts` table as either adapter reads it; a state or kind this build
    /// does not have is a corrupt row, named.
    pub(crate) fn from_row(state: &str, kind: &str, channel: String, n: i64) -> Result<MailCount> {
        let corrupt = |e: pcmail_core::names::UnknownName| StoreError::Corrupt(format!("mail_counts: {e}"));
        Ok(MailCount {
            state: state.parse().map_err(corrupt)?,
            kind: kind.parse().map_err(corrupt)?,
            channel,
            count: n.max(0) as u64,
        })
    }
}

/// U2: how many moves of one series fell in one step of time, for the overview's charts.
/// Series are `mail:Sent` (and every state a mail moves to), `ledger:Succeeded` (and every
/// reason a row's trail records) and `job:succeeded` (and every state a job ends in).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Activity {
    pub series: String,
    /// Steps since the window's start.
    pub step: u32,
    pub count: u64,
}

/// The activity query, alike in both SQL dialects but for its placeholders (`{since}`,
/// `{step}`, and `{finished}` for [`predicates::finished_jobs`]): mail and ledger moves from their
/// trail, job ends from the jobs themselves. The object kinds are the core's (R1, R3).
pub(crate) static ACTIVITY_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let (mail, ledger) = (ObjectKind::Mail.sql_like("object"), ObjectKind::Ledger.sql_like("object"));
    format!(
        "SELECT CASE WHEN {mail} THEN 'mail:' ELSE 'ledger:' END || reason, \
         (at - {{since}}) / {{step}}, count(*) FROM events \
         WHERE at >= {{since}} AND ({mail} OR {ledger}) GROUP BY 1, 2 \
         UNION ALL SELECT 'job:' || state, (finished_at - {{since}}) / {{step}}, count(*) FROM jobs \
         WHERE finished_at >= {{since}} AND {{finished}} GROUP BY 1, 2"
    )
});

/// U5: what a search looks for and where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Search {
    /// Found anywhere in a mail's subject or body, or a row's task or content, whatever its case.
    pub text: String,
    /// T2: only mail from or to this machine.
    pub machine: Option<String>,
    pub mail: bool,
    pub ledger: bool,
    /// At most this many of each, newest mail first, rows in project and id order.
    pub limit: usize,
    /// T14: how long it may look before it answers what it has, `truncated`.
    pub budget: pcmail_core::search::Budget,
}

/// What a search found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub mail: Vec<Mail>,
    pub rows: Vec<Row>,
    /// T14: the budget ran out before the search had looked everywhere (see
    /// [`pcmail_core::search::Scan::truncated`]).
    pub truncated: bool,
    /// P13: mail stored since the index's last batch, which this search read directly.
    pub behind: u64,
}

/// P13: how far the search index runs behind the mail, after one batch of the indexer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexBehind {
    /// Sequence numbers stored after the last the index holds (mail pruned since counts too).
    pub seqs: u64,
    /// P14: search indexes a copy left out are still to be built (by this process or another).
    pub building: bool,
}

/// `text` as a LIKE pattern that finds it anywhere (`\` escapes `%` and `_`).
pub(crate) fn like_anywhere(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
    format!("%{escaped}%")
}

/// Mail delivered since `{since}` with how long each took from its send, from the trail: each
/// delivery found by the index on `at`, its send by the index on the mail's object. The
/// reasons and the object kind are the core's (R1, R3).
pub(crate) static DELIVERIES_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT d.at, d.at - s.at FROM events d \
         JOIN events s ON s.object = d.object AND {sent} \
         WHERE d.at >= {{since}} AND {delivered} AND {mail}",
        sent = Reason::Sent.sql_eq("s.reason"),
        delivered = Reason::Delivered.sql_eq("d.reason"),
        mail = ObjectKind::Mail.sql_like("d.object"),
    )
});

/// Where `rebuild-view` keeps the cross-project view it built (its lines as JSON, L14/L15).
pub const LEDGER_VIEW_KEY: &str = "ledger_view";

/// A limit that lets every row through (SQL's LIMIT takes an i64).
pub const EVERY: usize = i64::MAX as usize;

/// A read-only listing of mail, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MailQuery {
    pub to: Option<String>,
    pub from: Option<String>,
    /// Only these states; empty means all.
    pub states: Vec<MailState>,
    /// U3: mail from or to this machine.
    pub machine: Option<String>,
    pub limit: usize,
    /// U3: the cursor of a page: only mail older than this one, which must itself be in the
    /// query's scope (`to`, `from`, `machine`), else the page is empty.
    pub after: Option<String>,
    /// T15: a page may stop short once its mails' texts ([`Mail::text_bytes`]) pass this many
    /// bytes (always one mail): SQLite stops reading there, so 500 large mails are never held
    /// for a page that will be answered short. Other adapters read the page whole; the HTTP
    /// edge cuts the answer to its bytes either way, and `more` counts from the last mail shown.
    pub max_bytes: Option<usize>,
}

/// The WHERE clause of a [`MailQuery`] (its limit aside) and its text arguments, for both SQL
/// dialects (`mark(n)` is the n-th placeholder). The cursor's mail must pass the same scope, so a
/// machine cannot page relative to (and so learn of) mail it may not see.
///
/// `by_seq`: SQLite listing a page. Its planner would answer a machine filter (`to` OR `from`)
/// through both indexes and then sort every match for the page (0.4 s at 1M mails); with the
/// two columns of that filter written `+"to"` it walks `seq` down and stops at the page
/// (0.3 ms). Counts, and the mailbox scopes (`to`, `from`), keep their indexes.
pub(crate) fn mail_where(q: &MailQuery, mark: impl Fn(usize) -> String, by_seq: bool) -> (String, Vec<String>) {
    let mut args: Vec<String> = Vec::new();
    let mut arg = |value: &str| {
        args.push(value.to_string());
        mark(args.len())
    };
    // `{t}` is the table's alias: none for the listed mail, `c.` for the cursor's.
    let mut scope: Vec<String> = Vec::new();
    if let Some(to) = &q.to {
        scope.push(format!("{{t}}\"to\" = {}", arg(to)));
    }
    if let Some(from) = &q.from {
        scope.push(format!("{{t}}\"from\" = {}", arg(from)));
    }
    if let Some(machine) = &q.machine {
        let p = arg(machine);
        scope.push(format!("({{t}}{{or}}\"to\" = {p} OR {{t}}{{or}}\"from\" = {p})"));
    }
    let or = if by_seq { "+" } else { "" };
    let mut clauses: Vec<String> = scope.iter().map(|c| c.replace("{t}", "").replace("{or}", or)).collect();
    if !q.states.is_empty() {
        let list: Vec<String> = q.states.iter().map(|s| format!("'{}'", s.as_str())).collect();
        clauses.push(format!("state IN ({})", list.join(", ")));
    }
    if let Some(after) = &q.after {
        let p = arg(after);
        let cursor_scope: String =
            scope.iter().map(|c| format!(" AND {}", c.replace("{t}", "c.").replace("{or}", ""))).collect();
        clauses.push(format!("seq < (SELECT c.seq FROM mail c WHERE c.id = {p}{cursor_scope})"));
    }
    if clauses.is_empty() {
        clauses.push("1 = 1".into());
    }
    (clauses.join(" AND "), args)
}

/// A batch of spec changes written in one transaction: `apply` is all-or-nothing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecWrites {
    pub upsert: Vec<SpecRecord>,
    pub delete: Vec<(Kind, String)>,
    pub events: Vec<Event>,
}

/// Which ledger rows of one project a [`Store::ledger_transaction`] loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerSelect {
    All,
    Ids(Vec<String>),
    /// Rows a person ticked ▶AI実行, in id order.
    RunRequested {
        limit: usize,
    },
    /// Rows in todo, running or review, in id order.
    Open,
}

/// What a ledger planner sees: the selected rows and the project's next id number (L1).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerState {
    pub rows: Vec<Row>,
    pub next_seq: u32,
}

/// What a ledger planner decided, applied atomically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LedgerWrites {
    pub add: Vec<Row>,
    /// Merge patches: only the cells a sync may fill.
    pub patch: Vec<RowPatch>,
    /// Whole rows written by runs, people and recovery.
    pub replace: Vec<Row>,
    pub delete: Vec<String>,
    pub next_seq: Option<u32>,
    pub events: Vec<Event>,
}

/// Which jobs a [`Store::jobs_transaction`] loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobSelect {
    Ids(Vec<String>),
    /// J6/E12: every job, live or finished, holding any of these unique keys (finished ones
    /// hold a key for the `uniqueFor` of whoever asks again; retention bounds how many).
    Unique(Vec<String>),
    /// J3: running jobs whose lease expired at or before `now` (E13: on the store's clock —
    /// SQLite, whose only clock is the wall clock that steps, judges each lease instead by how
    /// long it stood unchanged on the monotonic clock, and leaves `now` aside).
    ExpiredLeases {
        now: Ts,
        limit: usize,
    },
}

/// A read-only listing of jobs, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobQuery {
    pub queue: Option<String>,
    pub state: Option<String>,
    /// T2: only the jobs this machine enqueued or holds (or last held) the lease of.
    pub machine: Option<String>,
    /// U3: only jobs running this function.
    pub function: Option<String>,
    pub limit: usize,
    /// U3: the cursor of a page: only jobs older than this one (the last of the page before).
    pub after: Option<String>,
}

/// E7: one batch of what retention lets go, oldest first. Only settled rows ever match: closed
/// mail, finished jobs, events, and alerts whose latest state (resolved, or a notice) was posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prune {
    /// Done or failed mail closed (`doneAt`) before, and expired mail whose `expiresAt` is before.
    ClosedMail {
        before: Ts,
    },
    /// Succeeded, dead and cancelled jobs finished before, of one queue or of any.
    FinishedJobs {
        queue: Option<String>,
        before: Ts,
    },
    Events {
        before: Ts,
    },
    /// Resolved alerts and notices, posted, last changed before.
    SettledAlerts {
        before: Ts,
    },
}

impl Prune {
    /// Every tab a prune may name, for the metric's zero series.
    pub const TABS: [&str; 4] = ["mail", "jobs", "events", "alerts"];

    /// The tab it prunes, for `pcmail_pruned_total{tab}`; one of [`Prune::TABS`].
    pub fn tab(&self) -> &'static str {
        match self {
            Prune::ClosedMail { .. } => "mail",
            Prune::FinishedJobs { .. } => "jobs",
            Prune::Events { .. } => "events",
            Prune::SettledAlerts { .. } => "alerts",
        }
    }
}

/// A claim request (J1): up to `limit` due jobs of `queue`, leased to `owner` until
/// `lease_until`; each lease token is `token_prefix` plus the job's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub queue: String,
    pub limit: usize,
    /// Written to `lease_owner` as its wire text (T1).
    pub owner: pcmail_core::jobs::LeaseOwner,
    pub token_prefix: String,
    pub now: Ts,
    pub lease_until: Ts,
}

/// The `kv` key of the store's identity (E5), written with its schema.
pub const IDENTITY_KEY: &str = "store/identity";

pub trait Store: Send + Sync + 'static {
    /// Loads the selected rows, hands them to `plan`, and applies the writes it returns, all in
    /// one transaction with no other writer in between.
    fn mail_transaction<R, F>(&self, select: MailSelect, plan: F) -> impl Future<Output = Result<R>> + Send
    where
        F: FnOnce(Vec<Mail>) -> (MailWrites, R) + Send + 'static,
        R: Send + 'static;

    /// The same selections as a transaction, read-only and without taking the writer.
    fn select_mail(&self, select: MailSelect) -> impl Future<Output = Result<Vec<Mail>>> + Send;
    fn get_mail(&self, id: &str) -> impl Future<Output = Result<Option<Mail>>> + Send;
    fn mail_counts(&self) -> impl Future<Output = Result<Vec<MailCount>>> + Send;
    fn list_mail(&self, query: MailQuery) -> impl Future<Output = Result<Vec<Mail>>> + Send;
    /// How many mails the query matches, its limit aside.
    fn count_mail(&self, query: MailQuery) -> impl Future<Output = Result<u64>> + Send;
    /// U3: one page of mail after the query's cursor, and how many match after it (a page of
    /// none counts every match after the cursor).
    ///
    /// A listing narrowed by state alone (the admin's) is counted from the trigger-kept
    /// `mail_counts`, so its first page costs one page read whatever the mail stored; other
    /// counts scan what they match.
    fn mail_page(&self, query: MailQuery) -> impl Future<Output = Result<(Vec<Mail>, u64)>> + Send {
        async move {
            let by_state_alone = query.to.is_none() && query.from.is_none() && query.machine.is_none();
            let kept_count = || async {
                let counts = self.mail_counts().await?;
                let wanted = |c: &MailCount| query.states.is_empty() || query.states.contains(&c.state);
                Ok::<u64, StoreError>(counts.iter().filter(|c| wanted(c)).map(|c| c.count).sum())
            };
            if query.limit == 0 {
                let total = match (by_state_alone, &query.after) {
                    (true, None) => kept_count().await?,
                    _ => self.count_mail(query.clone()).await?,
                };
                return Ok((vec![], total));
            }
            let mail = self.list_mail(query.clone()).await?;
            let more = match mail.last() {
                None => 0,
                Some(_) if by_state_alone && query.after.is_none() => {
                    kept_count().await?.saturating_sub(mail.len() as u64)
                }
                Some(last) => self.count_mail(MailQuery { after: Some(last.id.clone()), ..query }).await?,
            };
            Ok((mail, more))
        }
    }
    /// The highest `seq` ever given to a mail (0 for none): a poll cursor beyond it belongs to
    /// another store or an older copy of this one (E5).
    fn mail_last_seq(&self) -> impl Future<Output = Result<i64>> + Send;
    /// Events about one object (`mail/<id>`, `roster/<name>`), oldest first.
    fn events_for(&self, object: &str) -> impl Future<Output = Result<Vec<Event>>> + Send;

    fn list_specs(&self) -> impl Future<Output = Result<Vec<SpecRecord>>> + Send;
    fn write_specs(&self, writes: SpecWrites) -> impl Future<Output = Result<()>> + Send;
    /// Writes only the status of one object; a missing object is not an error (it was deleted).
    fn set_spec_status(&self, kind: Kind, name: &str, status: Status) -> impl Future<Output = Result<()>> + Send;

    /// Stores the hash of `machine`'s token, replacing its previous one.
    fn put_token(&self, machine: &str, hash: &str, now: Ts) -> impl Future<Output = Result<()>> + Send;
    fn machine_for_token(&self, hash: &str) -> impl Future<Output = Result<Option<String>>> + Send;
    /// Each machine's last poll (A5, M9 receiver-down).
    fn last_polls(&self) -> impl Future<Output = Result<Vec<(String, Ts)>>> + Send;
    /// Each machine's last poll and client version (V1).
    fn machines_seen(&self) -> impl Future<Output = Result<Vec<MachineSeen>>> + Send;

    /// Loads the selected rows of `project` with its next id number, hands them to `plan`, and
    /// applies the writes it returns in one transaction.
    fn ledger_transaction<R, F>(
        &self,
        project: &str,
        select: LedgerSelect,
        plan: F,
    ) -> impl Future<Output = Result<R>> + Send
    where
        F: FnOnce(LedgerState) -> (LedgerWrites, R) + Send + 'static,
        R: Send + 'static;
    /// Every row of `project` (or of all projects), in project and id order.
    fn ledger_rows(&self, project: Option<&str>) -> impl Future<Output = Result<Vec<Row>>> + Send;
    /// U3: a page of ledger rows (the listing's project's, or every project's in project and id
    /// order) narrowed by the listing, after a [`page::row_cursor`]. Read whole and paged in memory: a
    /// ledger is kept by people.
    fn ledger_page(&self, listing: Listing, limit: usize) -> impl Future<Output = Result<(Vec<Row>, u64)>> + Send {
        async move {
            let rows = self.ledger_rows(listing.project.as_deref()).await?;
            let rows = rows.into_iter().filter(|r| listing.row_matches(r)).collect();
            Ok(page::rows_page(rows, listing.after.as_deref(), limit))
        }
    }
    /// Row counts by (project, state), for the gauges.
    fn ledger_counts(&self) -> impl Future<Output = Result<Vec<StateCount<RowState>>>> + Send;
    /// U2: what moved since `since`, counted per `step` (see [`Activity`]).
    fn activity(&self, since: Ts, step: chrono::TimeDelta) -> impl Future<Output = Result<Vec<Activity>>> + Send;
    /// U5: mail and rows holding `search.text` (an index finds them: FTS5 trigrams on SQLite,
    /// `pg_trgm` on PostgreSQL). P13: SQLite's mail index is kept off the send path by
    /// [`Store::index_search`], and a search reads the mail stored since its last batch
    /// directly, so its answers are whole however far behind the index is. T14: a machine's
    /// scope is applied before any text is compared, the search stops at its budget, and it
    /// stops working when its future is dropped.
    fn search(&self, search: Search) -> impl Future<Output = Result<Found>> + Send;
    /// P13: one batch of the mail the search index does not hold yet into it (at most `batch`
    /// sequence numbers, as [`pcmail_core::search::index_due`] picks them), in one transaction;
    /// answers how far behind it still is. Stores whose index is kept by the writing
    /// transaction itself (PostgreSQL's GIN, whose pending list already makes a write an
    /// append) are never behind; PostgreSQL's builds here the indexes a copy left out (P14).
    fn index_search(&self, batch: i64) -> impl Future<Output = Result<IndexBehind>> + Send {
        let _ = batch;
        std::future::ready(Ok(IndexBehind::default()))
    }
    /// U2: every mail delivered since `since`, as (when, milliseconds since its send).
    fn deliveries(&self, since: Ts) -> impl Future<Output = Result<Vec<(Ts, i64)>>> + Send;
    /// Projects that have rows or have had ids issued.
    fn ledger_projects(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Small controller state (cursors, the rebuilt view) that must survive restarts.
    fn kv_get(&self, key: &str) -> impl Future<Output = Result<Option<String>>> + Send;
    fn kv_set(&self, key: &str, value: &str) -> impl Future<Output = Result<()>> + Send;

    /// J1: takes up to `limit` due queued jobs, in (priority desc, runAfter, insertion) order,
    /// in one statement: each gets a fresh lease token, attempts + 1, and is running.
    fn claim_jobs(&self, claim: Claim) -> impl Future<Output = Result<Vec<Job>>> + Send;
    /// Loads the selected jobs, hands them to `plan`, and upserts the jobs it returns (new ids
    /// are inserted) in one transaction.
    fn jobs_transaction<R, F>(&self, select: JobSelect, plan: F) -> impl Future<Output = Result<R>> + Send
    where
        F: FnOnce(Vec<Job>) -> (Vec<Job>, R) + Send + 'static,
        R: Send + 'static;
    /// One job as committed now, read without taking the writer (a pool's check that a job it
    /// claimed ahead is still its own before starting it).
    fn get_job(&self, id: &str) -> impl Future<Output = Result<Option<Job>>> + Send;
    /// Jobs newest first, as the query narrows them.
    fn list_jobs(&self, query: JobQuery) -> impl Future<Output = Result<Vec<Job>>> + Send;
    /// U3: one page of jobs after the query's cursor, and how many match after it (a page of
    /// none counts every match after the cursor).
    fn job_page(&self, query: JobQuery) -> impl Future<Output = Result<(Vec<Job>, u64)>> + Send {
        async move {
            if query.limit == 0 {
                return Ok((vec![], self.count_jobs(query).await?));
            }
            let jobs = self.list_jobs(query.clone()).await?;
            let more = match jobs.last() {
                Some(last) => self.count_jobs(JobQuery { after: Some(last.id.clone()), ..query }).await?,
                None => 0,
            };
            Ok((jobs, more))
        }
    }
    /// How many jobs the query's filters match, whatever its limit and offset.
    fn count_jobs(&self, query: JobQuery) -> impl Future<Output = Result<u64>> + Send;
    /// Job counts by (queue, state), for the gauges.
    fn job_counts(&self) -> impl Future<Output = Result<Vec<StateCount<JobState>>>> + Send;

    /// E7: deletes at most `limit` rows that `what` selects, in one short transaction; answers
    /// how many went.
    fn prune(&self, what: Prune, limit: usize) -> impl Future<Output = Result<usize>> + Send;

    /// Alerts in state `firing`.
    fn firing_alerts(&self) -> impl Future<Output = Result<Vec<Alert>>> + Send;
    /// Alerts whose current state has not been notified yet, oldest change first.
    fn alerts_to_notify(&self, limit: usize) -> impl Future<Output = Result<Vec<Alert>>> + Send;
    /// Every alert, most recently changed first (the `alerts` tab).
    fn list_alerts(&self, limit: usize) -> impl Future<Output = Result<Vec<Alert>>> + Send;
    /// U3: a page of alerts, most recently changed first, narrowed by the listing and keyed by
    /// after a [`page::alert_cursor`]; read whole and paged in memory (E7 prunes the settled ones).
    fn alert_page(&self, listing: Listing, limit: usize) -> impl Future<Output = Result<(Vec<Alert>, u64)>> + Send {
        async move {
            let alerts = self.list_alerts(EVERY).await?;
            let alerts = alerts.into_iter().filter(|a| listing.alert_matches(a)).collect();
            Ok(page::alerts_page(alerts, listing.after.as_deref(), limit))
        }
    }
    fn write_alerts(&self, alerts: Vec<Alert>) -> impl Future<Output = Result<()>> + Send;
    /// Records that these alerts were posted in the state they carry. A row that changed since
    /// it was loaded (another state, a newer `updatedAt`) is left alone, so its new state is
    /// still notified.
    fn mark_notified(&self, sent: Vec<Alert>, at: Ts) -> impl Future<Output = Result<()>> + Send;

    /// C1: loads the lease `name`, hands it to `plan` with the store's clock (one clock for every
    /// replica), and writes the lease it returns, in one transaction. E13: PostgreSQL's clock is
    /// the database's; SQLite hands over the lease re-timed by `lease::as_seen` (how long it
    /// stood unchanged on this process's monotonic clock), so a wall-clock step neither holds
    /// nor breaks it.
    fn lease_transaction<R, F>(&self, name: &str, plan: F) -> impl Future<Output = Result<R>> + Send
    where
        F: FnOnce(Option<Lease>, Ts) -> (Option<Lease>, R) + Send + 'static,
        R: Send + 'static;

    /// O2/O3: every row of every tab in [`transfer::TABS`], from one consistent snapshot taken
    /// while the store keeps serving, in batches of at most [`transfer::BATCH`] rows. Stops
    /// early, without error, when `out` is closed.
    fn export_tabs(&self, out: mpsc::Sender<Batch>) -> impl Future<Output = Result<()>> + Send;
    /// Rows of one tab as they are, sequence numbers included, into a store
    /// [`transfer::copy`] found empty; all of the batch or none of it.
    fn import_rows(&self, batch: Batch) -> impl Future<Output = Result<()>> + Send;
    /// Every batch `rows` brings until [`Incoming::End`], as [`import_rows`](Store::import_rows)
    /// takes them, which a store may group (P14: PostgreSQL streams a tab's batches as one
    /// `COPY`). Rows that stop before `End` fail it; a group they were part of is not kept.
    fn import_stream(&self, mut rows: mpsc::Receiver<Incoming>) -> impl Future<Output = Result<()>> + Send {
        async move {
            loop {
                match rows.recv().await {
                    Some(Incoming::Rows(batch)) => self.import_rows(batch).await?,
                    Some(Incoming::End) => return Ok(()),
                    None => return Err(StoreError::Backend(crate::cells::COPY_INCOMPLETE.into())),
                }
            }
        }
    }
    /// P14: before the first batch, once the target is marked unfinished: the import's commits
    /// need not each wait for a sync, since [`import_finished`](Store::import_finished) makes all
    /// of them durable before the copy is marked finished (a crash before that leaves a store
    /// marked unfinished, which serve refuses, or a backup never named).
    fn import_started(&self) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Ok(()))
    }
    /// After the last batch: sequences moved past the imported rows, the copy made durable.
    /// PostgreSQL's `import_started` sets aside the tabs' keys, indexes and triggers, built
    /// again here (`postgres/deferred.rs`); a copy stopped between the two, or within this,
    /// leaves a store without some or all of them, marked unfinished, which must be emptied.
    fn import_finished(&self) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Ok(()))
    }
    /// The tabs holding rows a copy could collide with (the store's own `store/` and `sheets/`
    /// keys aside), as [`transfer::occupied`] names them from [`transfer::occupied_sql`].
    fn occupied_tabs(&self) -> impl Future<Output = Result<Vec<&'static str>>> + Send;
    /// E14 `restore --force`: every row of every tab in [`transfer::TABS`] (the store's own
    /// `store/` and `sheets/` keys aside) replaced by what `rows` brings, in one transaction
    /// committed only once [`Incoming::End`] comes, sequences moved past the rows; the store
    /// takes a new identity (E5: PCs merge again from 0, so no mail is skipped).
    fn replace_tabs(&self, rows: mpsc::Receiver<cells::Incoming>) -> impl Future<Output = Result<()>> + Send;

    /// Changes other processes commit, when the store can announce them (PostgreSQL's
    /// LISTEN/NOTIFY). `None`: this process is the only writer, and announces its own changes.
    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        None
    }

    /// Brings in what people changed outside pcmail before a decision that depends on it (the
    /// sheets adapter re-reads the spreadsheet before a ledger row is claimed). Other stores
    /// are always current.
    fn refresh(&self) -> impl Future<Output = Result<()>> + Send {
        std::future::ready(Ok(()))
    }
}

/// A change committed by some replica, as the store announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// New mail for this recipient.
    Mail { to: String },
    /// Some mail changed state.
    MailMoved,
    /// A job became due (enqueued, retried, released).
    Jobs,
    /// A spec was applied or deleted.
    Specs,
    /// The announcements were interrupted: anything may have changed meanwhile.
    Missed,
}

/// The store's clock at the millisecond precision every adapter keeps. The SQLite adapter runs
/// in one process, so the process clock is the store's clock.
pub(crate) fn store_clock() -> Ts {
    chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 3)
}

/// The URL without its password (in the user info or a `password=` parameter), for messages.
pub fn redact_url(url: &str) -> String {
    let mut out = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme && url[scheme + 3..at].contains(':') => {
            let user = url[scheme + 3..at].split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    };
    let mut from = 0;
    while let Some(found) = out[from..].find("password=") {
        let start = from + found + "password=".len();
        let end = out[start..].find('&').map_or(out.len(), |e| start + e);
        out.replace_range(start..end, "***");
        from = start;
    }
    out
}

/// The store `serve` keeps when given no URL: the embedded default in its data dir.
pub fn default_url(data_dir: &std::path::Path) -> String {
    format!("sqlite:{}", data_dir.join("pcmail.db").display())
}

/// V5: what in a migration's SQL would contract the schema — drop or rename a table or a
/// column, or change a column's type — when anything does. Migrations are expand-only for one
/// release, so replicas of two adjacent releases share one PostgreSQL; an index may be dropped
/// (it holds no data a release reads). Comments (`-- …`) are not SQL.
pub fn contracting(sql: &str) -> Option<&'static str> {
    let code: Vec<&str> = sql.lines().map(|l| l.split("--").next().unwrap_or("")).collect();
    let words = code.join(" ").to_uppercase();
    let words = words.split_whitespace().collect::<Vec<_>>().join(" ");
    ["DROP TABLE", "DROP COLUMN", "RENAME", "ALTER COLUMN"].into_iter().find(|phrase| words.contains(phrase))
}

/// V5: how many of `migrations` a build must know to use a store they built: up to the last
/// one that contracts (every later one only adds, so a build that lacks them still finds all it
/// reads). Recorded in the store by the build that migrates it, since only that build has them.
pub fn readable_by(migrations: &[&str]) -> usize {
    migrations.iter().rposition(|sql| contracting(sql).is_some()).map_or(0, |i| i + 1)
}

#[cfg(test)]
mod expand_only_tests {
    #[test]
    fn v5_a_migration_that_drops_or_renames_is_named() {
        assert_eq!(super::contracting("ALTER TABLE machines ADD COLUMN client TEXT NOT NULL DEFAULT '';"), None);
        assert_eq!(super::contracting("DROP INDEX jobs_unique;\nCREATE INDEX x ON jobs(k);"), None);
        assert_eq!(super::contracting("-- never DROP TABLE here\nCREATE TABLE t (a INT);"), None);
        assert_eq!(super::contracting("drop  table\n mail;"), Some("DROP TABLE"));
        assert_eq!(super::contracting("ALTER TABLE jobs RENAME COLUMN a TO b;"), Some("RENAME"));
        assert_eq!(super::contracting("ALTER TABLE jobs DROP COLUMN a;"), Some("DROP COLUMN"));
        assert_eq!(super::contracting("ALTER TABLE jobs ALTER COLUMN a TYPE TEXT;"), Some("ALTER COLUMN"));
    }

    #[test]
    fn v5_a_build_must_know_the_migrations_up_to_the_last_that_contracts() {
        let add = "ALTER TABLE t ADD COLUMN c TEXT";
        assert_eq!(super::readable_by(&[add, add]), 0);
        assert_eq!(super::readable_by(&[add, "DROP TABLE t", add, add]), 2);
        assert_eq!(super::readable_by(&[]), 0);
    }
}
