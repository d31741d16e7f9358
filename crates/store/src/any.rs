//! The store a URL names, as one type the server can hold whichever adapter it is.

use pcmail_core::Ts;
use pcmail_core::alert::Alert;
use pcmail_core::api::Event;
use pcmail_core::jobs::Job;
use pcmail_core::lease::Lease;
use pcmail_core::ledger::Row as LedgerRow;
use pcmail_core::mail::Mail;
use pcmail_core::manifest::{Kind, SpecRecord, Status};

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::cells::Batch;
use crate::health::WriteHealth;
use crate::transfer;
use crate::{
    Change, Claim, JobQuery, JobSelect, LedgerSelect, LedgerState, LedgerWrites, MailCount, MailQuery, MailSelect,
    MailWrites, PgStore, Prune, Result, SheetsStore, SpecWrites, SqliteStore, Store, StoreError, redact_url, sheets,
};

/// Opens a store to copy or compare it while a server may be serving it. A spreadsheet is read
/// from the server's working copy when there is one, which holds every acknowledged write and
/// keeps a second process from syncing the same sheet.
pub async fn open_to_read(url: &str, data_dir: &std::path::Path) -> Result<AnyStore> {
    if let Some(path) = url.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
        return SqliteStore::open_read_only(path).await.map(AnyStore::over(Adapter::Sqlite));
    }
    if url.starts_with("sheets://") {
        let copy = sheets::working_copy(url, data_dir)?;
        if copy.exists() {
            return SqliteStore::open_read_only(copy).await.map(AnyStore::over(Adapter::Sqlite));
        }
    }
    open(url, data_dir).await
}

/// Opens the store a URL names: `sqlite:PATH`, `postgres://…` (`postgresql://` too) or
/// `sheets://SPREADSHEET_ID?credentials=PATH` (its working copy in `data_dir`).
pub async fn open(url: &str, data_dir: &std::path::Path) -> Result<AnyStore> {
    if let Some(path) = url.strip_prefix("sqlite:") {
        if path.is_empty() {
            return Err(StoreError::BadUrl { url: url.into(), reason: "sqlite: needs a file path".into() });
        }
        return SqliteStore::open(path).await.map(AnyStore::over(Adapter::Sqlite));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return PgStore::open(url).await.map(AnyStore::over(Adapter::Postgres));
    }
    if url.starts_with("sheets://") {
        return SheetsStore::open(url, data_dir).await.map(AnyStore::over(Adapter::Sheets));
    }
    let reason = "expected sqlite:PATH, postgres://USER@HOST/DB or sheets://SPREADSHEET_ID?credentials=PATH";
    Err(StoreError::BadUrl { url: redact_url(url), reason: reason.into() })
}

/// One adapter, and what its calls met (E15), kept in memory for every clone.
#[derive(Clone)]
pub struct AnyStore {
    adapter: Adapter,
    health: Arc<WriteHealth>,
}

#[derive(Clone)]
enum Adapter {
    Sqlite(SqliteStore),
    Postgres(PgStore),
    Sheets(SheetsStore),
}

impl AnyStore {
    fn over<S>(adapter: impl Fn(S) -> Adapter) -> impl Fn(S) -> AnyStore {
        move |s| AnyStore { adapter: adapter(s), health: Arc::default() }
    }

    /// Why the store cannot keep its promises right now, though it answers: a spreadsheet the
    /// last sync cycle could not reach or read.
    pub fn problem(&self) -> Option<String> {
        match &self.adapter {
            Adapter::Sheets(s) => s.sync_error().map(|e| format!("spreadsheet sync: {e}")),
            _ => None,
        }
    }

    /// The SQLite file this store reads, when it is one (a spreadsheet's working copy opened to
    /// read is): P14's backup copies its pages.
    pub fn sqlite(&self) -> Option<&SqliteStore> {
        match &self.adapter {
            Adapter::Sqlite(s) => Some(s),
            Adapter::Postgres(_) | Adapter::Sheets(_) => None,
        }
    }

    /// [`transfer::digest_counted`], which a SQLite store reads in place (P14).
    pub async fn digest(&self, on_rows: &mut transfer::OnRows<'_>) -> Result<Vec<transfer::TabDigest>> {
        match &self.adapter {
            Adapter::Sqlite(s) => s.digest_in_place(on_rows).await,
            Adapter::Postgres(_) | Adapter::Sheets(_) => transfer::digest_counted(self, on_rows).await,
        }
    }

    /// E15: how this store's calls have ended lately, from memory (it answers while the store
    /// does not).
    pub fn health(&self) -> &WriteHealth {
        &self.health
    }

    fn read<T>(&self, result: Result<T>) -> Result<T> {
        self.health.observe(&result, false);
        result
    }

    fn wrote<T>(&self, result: Result<T>) -> Result<T> {
        self.health.observe(&result, true);
        result
    }
}

/// Forwards one call to whichever adapter this is; a read's or a write's outcome is recorded
/// on the store's health.
macro_rules! forward {
    (@ $self:ident, $s:ident => $call:expr) => {
        match &$self.adapter {
            Adapter::Sqlite($s) => $call,
            Adapter::Postgres($s) => $call,
            Adapter::Sheets($s) => $call,
        }
    };
    (write $self:ident, $s:ident => $call:expr) => {{
        let result = forward!(@ $self, $s => $call);
        $self.wrote(result)
    }};
    // A transaction may write nothing (a claim of no job): its failure is a write's, its
    // success a read's, so it never says space is back.
    (transaction $self:ident, $s:ident => $call:expr) => {{
        let result = forward!(@ $self, $s => $call);
        if result.is_err() { $self.wrote(result) } else { $self.read(result) }
    }};
    ($self:ident, $s:ident => $call:expr) => {{
        let result = forward!(@ $self, $s => $call);
        $self.read(result)
    }};
}

impl Store for AnyStore {
    async fn mail_transaction<R, F>(&self, select: MailSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Mail>) -> (MailWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        forward!(transaction self, s => s.mail_transaction(select, plan).await)
    }

    async fn select_mail(&self, select: MailSelect) -> Result<Vec<Mail>> {
        forward!(self, s => s.select_mail(select).await)
    }

    async fn get_mail(&self, id: &str) -> Result<Option<Mail>> {
        forward!(self, s => s.get_mail(id).await)
    }

    async fn mail_counts(&self) -> Result<Vec<MailCount>> {
        forward!(self, s => s.mail_counts().await)
    }

    async fn list_mail(&self, query: MailQuery) -> Result<Vec<Mail>> {
        forward!(self, s => s.list_mail(query).await)
    }

    async fn count_mail(&self, query: MailQuery) -> Result<u64> {
        forward!(self, s => s.count_mail(query).await)
    }

    async fn events_for(&self, object: &str) -> Result<Vec<Event>> {
        forward!(self, s => s.events_for(object).await)
    }

    async fn list_specs(&self) -> Result<Vec<SpecRecord>> {
        forward!(self, s => s.list_specs().await)
    }

    async fn write_specs(&self, writes: SpecWrites) -> Result<()> {
        forward!(write self, s => s.write_specs(writes).await)
    }

    async fn set_spec_status(&self, kind: Kind, name: &str, status: Status) -> Result<()> {
        forward!(write self, s => s.set_spec_status(kind, name, status).await)
    }

    async fn put_token(&self, machine: &str, hash: &str, now: Ts) -> Result<()> {
        forward!(write self, s => s.put_token(machine, hash, now).await)
    }

    async fn machine_for_token(&self, hash: &str) -> Result<Option<String>> {
        forward!(self, s => s.machine_for_token(hash).await)
    }

    async fn last_polls(&self) -> Result<Vec<(String, Ts)>> {
        forward!(self, s => s.last_polls().await)
    }

    async fn machines_seen(&self) -> Result<Vec<crate::MachineSeen>> {
        forward!(self, s => s.machines_seen().await)
    }

    async fn ledger_transaction<R, F>(&self, project: &str, select: LedgerSelect, plan: F) -> Result<R>
    where
        F: FnOnce(LedgerState) -> (LedgerWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        forward!(transaction self, s => s.ledger_transaction(project, select, plan).await)
    }

    async fn ledger_rows(&self, project: Option<&str>) -> Result<Vec<LedgerRow>> {
        forward!(self, s => s.ledger_rows(project).await)
    }

    async fn activity(&self, since: Ts, step: chrono::TimeDelta) -> Result<Vec<crate::Activity>> {
        forward!(self, s => s.activity(since, step).await)
    }

    async fn deliveries(&self, since: Ts) -> Result<Vec<(Ts, i64)>> {
        forward!(self, s => s.deliveries(since).await)
    }

    async fn search(&self, search: crate::Search) -> Result<crate::Found> {
        forward!(self, s => s.search(search).await)
    }

    async fn ledger_counts(&self) -> Result<Vec<crate::StateCount<pcmail_core::ledger::RowState>>> {
        forward!(self, s => s.ledger_counts().await)
    }

    async fn ledger_projects(&self) -> Result<Vec<String>> {
        forward!(self, s => s.ledger_projects().await)
    }

    async fn mail_last_seq(&self) -> Result<i64> {
        forward!(self, s => s.mail_last_seq().await)
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>> {
        forward!(self, s => s.kv_get(key).await)
    }

    async fn kv_set(&self, key: &str, value: &str) -> Result<()> {
        forward!(write self, s => s.kv_set(key, value).await)
    }

    async fn claim_jobs(&self, claim: Claim) -> Result<Vec<Job>> {
        forward!(transaction self, s => s.claim_jobs(claim).await)
    }

    async fn jobs_transaction<R, F>(&self, select: JobSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Job>) -> (Vec<Job>, R) + Send + 'static,
        R: Send + 'static,
    {
        forward!(transaction self, s => s.jobs_transaction(select, plan).await)
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>> {
        forward!(self, s => s.get_job(id).await)
    }

    async fn list_jobs(&self, q: JobQuery) -> Result<Vec<Job>> {
        forward!(self, s => s.list_jobs(q).await)
    }

    async fn count_jobs(&self, q: JobQuery) -> Result<u64> {
        forward!(self, s => s.count_jobs(q).await)
    }

    async fn job_counts(&self) -> Result<Vec<crate::StateCount<pcmail_core::jobs::JobState>>> {
        forward!(self, s => s.job_counts().await)
    }

    async fn prune(&self, what: Prune, limit: usize) -> Result<usize> {
        forward!(transaction self, s => s.prune(what, limit).await)
    }

    async fn index_search(&self, batch: i64) -> Result<crate::IndexBehind> {
        forward!(transaction self, s => s.index_search(batch).await)
    }

    async fn export_tabs(&self, out: mpsc::Sender<Batch>) -> Result<()> {
        forward!(self, s => s.export_tabs(out).await)
    }

    async fn import_rows(&self, batch: Batch) -> Result<()> {
        forward!(write self, s => s.import_rows(batch).await)
    }

    async fn import_stream(&self, rows: mpsc::Receiver<crate::cells::Incoming>) -> Result<()> {
        forward!(write self, s => s.import_stream(rows).await)
    }

    async fn import_started(&self) -> Result<()> {
        forward!(write self, s => s.import_started().await)
    }

    async fn import_finished(&self) -> Result<()> {
        forward!(write self, s => s.import_finished().await)
    }

    async fn occupied_tabs(&self) -> Result<Vec<&'static str>> {
        forward!(self, s => s.occupied_tabs().await)
    }

    async fn replace_tabs(&self, rows: mpsc::Receiver<crate::Incoming>) -> Result<()> {
        forward!(write self, s => s.replace_tabs(rows).await)
    }

    async fn firing_alerts(&self) -> Result<Vec<Alert>> {
        forward!(self, s => s.firing_alerts().await)
    }

    async fn alerts_to_notify(&self, limit: usize) -> Result<Vec<Alert>> {
        forward!(self, s => s.alerts_to_notify(limit).await)
    }

    async fn list_alerts(&self, limit: usize) -> Result<Vec<Alert>> {
        forward!(self, s => s.list_alerts(limit).await)
    }

    async fn write_alerts(&self, alerts: Vec<Alert>) -> Result<()> {
        forward!(write self, s => s.write_alerts(alerts).await)
    }

    async fn mark_notified(&self, sent: Vec<Alert>, at: Ts) -> Result<()> {
        forward!(write self, s => s.mark_notified(sent, at).await)
    }

    async fn lease_transaction<R, F>(&self, name: &str, plan: F) -> Result<R>
    where
        F: FnOnce(Option<Lease>, Ts) -> (Option<Lease>, R) + Send + 'static,
        R: Send + 'static,
    {
        forward!(transaction self, s => s.lease_transaction(name, plan).await)
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        forward!(@ self, s => s.changes())
    }

    async fn refresh(&self) -> Result<()> {
        forward!(self, s => s.refresh().await)
    }
}
