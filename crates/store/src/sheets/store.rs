//! The sheets store: the spreadsheet's `ledger`, `mail`, `jobs` and `alerts` tabs kept true to
//! a local working copy (an embedded SQLite file in the data dir, so an acknowledged write
//! survives a crash before it reaches Google), and people's edits to the ledger taken back in.
//!
//! Every Store call is answered by the working copy at once. A sync cycle then reads every tab
//! in one `values:batchGet`, plans each tab three ways (`pcmail_core::sheet::plan`: the sheet
//! now, the sheet after the last cycle, the store now), takes people's edits in, and writes
//! the changed cells in one `values:batchUpdate`, deletions in one `spreadsheets:batchUpdate`
//! and new rows with one `values:append` per tab (P8: one read and at most one write per tab,
//! whatever the number of rows). Controller bookkeeping (specs, tokens, events, leases, cursors)
//! stays in the working copy only.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;

use pcmail_core::Ts;
use pcmail_core::alert::Alert;
use pcmail_core::api::Event;
use pcmail_core::jobs::Job;
use pcmail_core::lease::Lease;
use pcmail_core::ledger::Row as LedgerRow;
use pcmail_core::mail::Mail;
use pcmail_core::manifest::{Kind, SpecRecord, Status};
use pcmail_core::sheet::cell::{a1_row_range, normalize, quote_title, to_wire};
use pcmail_core::sheet::layout::{ALERTS, JOBS, LEDGER, Lang, MAIL, Tab, header_row, locate};
use pcmail_core::sheet::plan::{Fields, plan_sync, row_key};

use super::client::{Client, SheetsConfig};
use super::render::{FieldRow, fields, names};
use super::wire::{ValueRange, delete_rows};
use crate::cells::Batch;
use crate::codec::{self, ALERT_COLUMNS, JOB_COLUMNS, LEDGER_COLUMNS, MAIL_COLUMNS, MAIL_INSERT_COLUMNS, json};
use crate::{
    Change, Claim, JobQuery, JobSelect, LedgerSelect, LedgerState, LedgerWrites, MailCount, MailQuery, MailSelect,
    MailWrites, Prune, Result, SpecWrites, SqliteStore, Store, StoreError,
};

/// The tabs kept on the spreadsheet, in the order they are read.
const TABS: [&Tab; 4] = [&LEDGER, &MAIL, &JOBS, &ALERTS];
/// How often a cycle runs with nothing written, to take in people's edits.
const IDLE_CYCLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Where the working copy of the spreadsheet a `sheets://` URL names lives in `data_dir`.
pub fn working_copy(url: &str, data_dir: &Path) -> Result<std::path::PathBuf> {
    SheetsConfig::from_url(url).map(|c| working_copy_of(&c, data_dir))
}

fn working_copy_of(config: &SheetsConfig, data_dir: &Path) -> std::path::PathBuf {
    data_dir.join(format!("sheets-{}.db", config.spreadsheet_id))
}

#[derive(Clone)]
pub struct SheetsStore {
    inner: Arc<Inner>,
}

struct Inner {
    local: SqliteStore,
    client: Client,
    lang: Lang,
    sheet_ids: Mutex<BTreeMap<String, i64>>,
    cycle: tokio::sync::Mutex<()>,
    wake: tokio::sync::Notify,
    last_error: Mutex<Option<String>>,
    syncer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.syncer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }
}

impl SheetsStore {
    /// Opens the spreadsheet a `sheets://` URL names, with its working copy in `data_dir`:
    /// creates missing tabs with their header row, fills a new working copy from the sheet, and
    /// runs a first cycle before answering.
    pub async fn open(url: &str, data_dir: &Path) -> Result<SheetsStore> {
        let config = SheetsConfig::from_url(url)?;
        let lang = config.headers;
        let path = working_copy_of(&config, data_dir);
        let fresh = !path.exists();
        let local = SqliteStore::open(&path).await?;
        let client = Client::new(config)?;
        let store = SheetsStore {
            inner: Arc::new(Inner {
                local,
                client,
                lang,
                sheet_ids: Mutex::new(BTreeMap::new()),
                cycle: tokio::sync::Mutex::new(()),
                wake: tokio::sync::Notify::new(),
                last_error: Mutex::new(None),
                syncer: Mutex::new(None),
            }),
        };
        store.ensure_tabs().await?;
        if fresh {
            store.import().await?;
        }
        store.sync_now().await?;
        let weak = Arc::downgrade(&store.inner);
        let task = tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let store = SheetsStore { inner };
                tokio::select! {
                    _ = store.inner.wake.notified() => {}
                    _ = tokio::time::sleep(IDLE_CYCLE) => {}
                }
                let outcome = store.sync_now().await.err().map(|e| e.to_string());
                *store.inner.last_error.lock().unwrap_or_else(PoisonError::into_inner) = outcome;
            }
        });
        *store.inner.syncer.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
        Ok(store)
    }

    /// The last background cycle's error, if it failed.
    pub fn sync_error(&self) -> Option<String> {
        self.inner.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn changed(&self) {
        self.inner.wake.notify_one();
    }

    /// Stops background cycles, so a test counts only the calls of the cycles it runs.
    #[cfg(test)]
    fn stop_background(&self) {
        if let Some(task) = self.inner.syncer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            task.abort();
        }
    }

    /// Adds the tabs the spreadsheet lacks (one call) and learns every tab's numeric id.
    async fn ensure_tabs(&self) -> Result<()> {
        let sheet = self.inner.client.spreadsheet().await?;
        let mut ids: BTreeMap<String, i64> =
            sheet.sheets.iter().map(|s| (s.properties.title.clone(), s.properties.sheet_id)).collect();
        let missing: Vec<serde_json::Value> = TABS
            .iter()
            .filter(|t| !ids.contains_key(t.title))
            .map(|t| serde_json::json!({"addSheet": {"properties": {"title": t.title}}}))
            .collect();
        if !missing.is_empty() {
            let answer = self.inner.client.batch_update(missing).await?;
            for reply in answer.replies {
                let p = &reply["addSheet"]["properties"];
                if let (Some(title), Some(id)) = (p["title"].as_str(), p["sheetId"].as_i64()) {
                    ids.insert(title.to_string(), id);
                }
            }
        }
        *self.inner.sheet_ids.lock().unwrap_or_else(PoisonError::into_inner) = ids;
        Ok(())
    }

    /// Every tab as read now: a header row (empty for a new tab) and normalized data rows.
    async fn read_tabs(&self) -> Result<Vec<(Vec<String>, Vec<Vec<String>>)>> {
        let ranges: Vec<String> = TABS.iter().map(|t| quote_title(t.title)).collect();
        let read = self.inner.client.batch_get(&ranges).await?;
        Ok(TABS
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let rows: Vec<Vec<String>> = read
                    .get(i)
                    .map(|r| r.values.iter().map(|row| row.iter().map(normalize).collect()).collect())
                    .unwrap_or_default();
                let mut rows = rows.into_iter();
                (rows.next().unwrap_or_default(), rows.collect())
            })
            .collect())
    }

    /// A new working copy starts as the spreadsheet holds it.
    async fn import(&self) -> Result<()> {
        let local = &self.inner.local;
        for (tab, (header, rows)) in TABS.into_iter().zip(self.read_tabs().await?) {
            if header.is_empty() {
                continue;
            }
            let columns = locate(tab, &header).map_err(|e| StoreError::Schema(e.to_string()))?;
            let rows: Vec<Fields> = rows
                .iter()
                .map(|cells| pcmail_core::sheet::plan::fields_of(cells, &columns))
                .filter(|f| row_key(tab, f).is_some())
                .collect();
            let decode = |list: &str, f: &Fields| FieldRow::new(tab, &names(list), f);
            match tab.title {
                "ledger" => {
                    let mut by_project: BTreeMap<String, Vec<LedgerRow>> = BTreeMap::new();
                    for f in &rows {
                        let row = codec::ledger_row(&decode(LEDGER_COLUMNS, f))?;
                        by_project.entry(row.project.clone()).or_default().push(row);
                    }
                    for (project, add) in by_project {
                        let next = add.iter().filter_map(|r| r.id.trim_start_matches("T-").parse::<u32>().ok()).max();
                        let writes = LedgerWrites { add, next_seq: next.map(|n| n + 1), ..Default::default() };
                        local.ledger_transaction(&project, LedgerSelect::Ids(vec![]), move |_| (writes, ())).await?;
                    }
                }
                "mail" => {
                    let insert =
                        rows.iter().map(|f| codec::mail(&decode(MAIL_COLUMNS, f))).collect::<Result<Vec<_>>>()?;
                    let writes = MailWrites { insert, ..Default::default() };
                    local.mail_transaction(MailSelect::Ids(vec![]), move |_| (writes, ())).await?;
                }
                "jobs" => {
                    let jobs = rows.iter().map(|f| codec::job(&decode(JOB_COLUMNS, f))).collect::<Result<Vec<_>>>()?;
                    local.jobs_transaction(JobSelect::Ids(vec![]), move |_| (jobs, ())).await?;
                }
                _ => {
                    let alerts =
                        rows.iter().map(|f| codec::alert(&decode(ALERT_COLUMNS, f))).collect::<Result<Vec<_>>>()?;
                    local.write_alerts(alerts).await?;
                }
            }
            let base: BTreeMap<String, Fields> =
                rows.into_iter().filter_map(|f| Some((row_key(tab, &f)?, f))).collect();
            self.save_base(tab, &base).await?;
        }
        Ok(())
    }

    /// Each row of `tab` as the working copy holds it, rendered as the tab's fields, oldest first.
    async fn ours(&self, tab: &Tab) -> Result<Vec<(String, Fields)>> {
        let (local, lang) = (&self.inner.local, self.inner.lang);
        let rendered: Vec<Fields> = match tab.title {
            "ledger" => {
                let n = names(LEDGER_COLUMNS);
                local.ledger_rows(None).await?.iter().map(|r| fields(tab, lang, &n, &codec::ledger_params(r))).collect()
            }
            "mail" => {
                let n = names(MAIL_INSERT_COLUMNS);
                let mut mail = local.list_mail(MailQuery { limit: crate::EVERY, ..Default::default() }).await?;
                mail.reverse();
                mail.iter()
                    .map(|m| {
                        let values: Vec<_> =
                            codec::mail_lifecycle(m).into_iter().chain(codec::mail_identity(m)).collect();
                        fields(tab, lang, &n, &values)
                    })
                    .collect()
            }
            "jobs" => {
                let n = names(JOB_COLUMNS);
                let mut jobs = local.list_jobs(JobQuery { limit: crate::EVERY, ..Default::default() }).await?;
                jobs.reverse();
                jobs.iter().map(|j| fields(tab, lang, &n, &codec::job_params(j))).collect()
            }
            _ => {
                let n = names(ALERT_COLUMNS);
                let mut alerts = local.list_alerts(crate::EVERY).await?;
                alerts.reverse();
                alerts
                    .iter()
                    .map(|a| {
                        let labels = json(&a.labels);
                        fields(tab, lang, &n, &codec::alert_params(a, &labels))
                    })
                    .collect()
            }
        };
        Ok(rendered.into_iter().filter_map(|f| Some((row_key(tab, &f)?, f))).collect())
    }

    async fn base(&self, tab: &Tab) -> Result<BTreeMap<String, Fields>> {
        let stored = self.inner.local.kv_get(&format!("sheets/base/{}", tab.title)).await?;
        Ok(stored.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default())
    }

    async fn save_base(&self, tab: &Tab, base: &BTreeMap<String, Fields>) -> Result<()> {
        self.inner.local.kv_set(&format!("sheets/base/{}", tab.title), &json(base)).await
    }

    /// People's edits to ledger rows, taken into the working copy.
    async fn adopt(&self, edits: Vec<(String, usize, String)>) -> Result<()> {
        let mut by_row: BTreeMap<String, Vec<(usize, String)>> = BTreeMap::new();
        for (key, field, value) in edits {
            by_row.entry(key).or_default().push((field, value));
        }
        for (key, edits) in by_row {
            let Some((project, id)) = key.split_once('\u{1f}') else { continue };
            let id = id.to_string();
            self.inner
                .local
                .ledger_transaction(project, LedgerSelect::Ids(vec![id.clone()]), move |state| {
                    let Some(mut row) = state.rows.into_iter().next() else { return (LedgerWrites::default(), ()) };
                    let mut changed = Vec::new();
                    for (field, value) in edits {
                        let key = LEDGER.fields[field].key;
                        let applied = match key {
                            "state" => value.parse().map(|s| row.state = s).is_ok(),
                            "run_requested" => {
                                row.run_requested = matches!(value.as_str(), "true" | "TRUE" | "1");
                                true
                            }
                            "due" => {
                                row.due = value;
                                true
                            }
                            "assignee" => {
                                row.assignee = value;
                                true
                            }
                            "instruction" => {
                                row.instruction = value;
                                true
                            }
                            _ => false,
                        };
                        if applied {
                            changed.push(key);
                        }
                    }
                    let event = Event {
                        at: crate::store_clock(),
                        object: format!("ledger/{}/{}", row.project, row.id),
                        reason: "EditedInSheet".into(),
                        message: format!("a person changed {} in the spreadsheet", changed.join(", ")),
                        actor: "sheet".into(),
                    };
                    (LedgerWrites { replace: vec![row], events: vec![event], ..Default::default() }, ())
                })
                .await?;
        }
        Ok(())
    }

    /// One cycle: one read of every tab, people's edits taken in, then the writes.
    pub async fn sync_now(&self) -> Result<()> {
        let _one_at_a_time = self.inner.cycle.lock().await;
        let read = self.read_tabs().await?;
        let ids = self.inner.sheet_ids.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let (mut updates, mut deletes, mut appends, mut bases) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (tab, (header, rows)) in TABS.into_iter().zip(read) {
            let columns = if header.is_empty() {
                let row = header_row(tab, self.inner.lang);
                let last = row.len() - 1;
                updates.push(ValueRange {
                    range: a1_row_range(tab.title, 1, 0, last),
                    major_dimension: None,
                    values: vec![row.into_iter().map(serde_json::Value::String).collect()],
                });
                (0..tab.fields.len()).collect()
            } else {
                let columns = locate(tab, &header).map_err(|e| StoreError::Schema(e.to_string()))?;
                // Late fields an older tab lacks: their headers are written after its last column.
                for (f, &column) in columns.iter().enumerate().filter(|(_, c)| **c >= header.len()) {
                    updates.push(ValueRange {
                        range: a1_row_range(tab.title, 1, column, column),
                        major_dimension: None,
                        values: vec![vec![serde_json::Value::String(self.inner.lang.header(&tab.fields[f]).into())]],
                    });
                }
                columns
            };
            let base = self.base(tab).await?;
            let plan = plan_sync(tab, &columns, &rows, &base, &self.ours(tab).await?);
            if tab.title == "ledger" && !plan.adopt.is_empty() {
                self.adopt(plan.adopt.clone()).await?;
            }
            let boolean =
                |column: usize| columns.iter().position(|c| *c == column).is_some_and(|f| tab.fields[f].boolean);
            for run in &plan.updates {
                let last = run.first_column + run.values.len() - 1;
                let values =
                    run.values.iter().enumerate().map(|(i, v)| to_wire(v, boolean(run.first_column + i))).collect();
                updates.push(ValueRange {
                    range: a1_row_range(tab.title, run.row, run.first_column, last),
                    major_dimension: None,
                    values: vec![values],
                });
            }
            let sheet_id = ids.get(tab.title).copied().unwrap_or_default();
            deletes.extend(plan.deletes.iter().map(|&(first, last)| delete_rows(sheet_id, first, last)));
            if !plan.appends.is_empty() {
                let rows: Vec<Vec<serde_json::Value>> = plan
                    .appends
                    .iter()
                    .map(|cells| cells.iter().enumerate().map(|(c, v)| to_wire(v, boolean(c))).collect())
                    .collect();
                appends.push((tab.title, rows));
            }
            if plan.synced != base {
                bases.push((tab, plan.synced));
            }
        }
        let client = &self.inner.client;
        if !updates.is_empty() {
            client.update_values(updates).await?;
        }
        if !deletes.is_empty() {
            client.batch_update(deletes).await?;
        }
        for (title, rows) in appends {
            client.append(&quote_title(title), rows).await?;
        }
        for (tab, base) in bases {
            self.save_base(tab, &base).await?;
        }
        Ok(())
    }
}

/// Forwards a write to the working copy and wakes the syncer.
macro_rules! then_sync {
    ($self:ident, $call:expr) => {{
        let out = $call.await;
        if out.is_ok() {
            $self.changed();
        }
        out
    }};
}

impl Store for SheetsStore {
    async fn mail_transaction<R, F>(&self, select: MailSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Mail>) -> (MailWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        then_sync!(self, self.inner.local.mail_transaction(select, plan))
    }

    async fn select_mail(&self, select: MailSelect) -> Result<Vec<Mail>> {
        self.inner.local.select_mail(select).await
    }

    async fn get_mail(&self, id: &str) -> Result<Option<Mail>> {
        self.inner.local.get_mail(id).await
    }

    async fn mail_counts(&self) -> Result<Vec<MailCount>> {
        self.inner.local.mail_counts().await
    }

    async fn list_mail(&self, query: MailQuery) -> Result<Vec<Mail>> {
        self.inner.local.list_mail(query).await
    }

    async fn count_mail(&self, query: MailQuery) -> Result<u64> {
        self.inner.local.count_mail(query).await
    }

    async fn events_for(&self, object: &str) -> Result<Vec<Event>> {
        self.inner.local.events_for(object).await
    }

    async fn list_specs(&self) -> Result<Vec<SpecRecord>> {
        self.inner.local.list_specs().await
    }

    async fn write_specs(&self, writes: SpecWrites) -> Result<()> {
        self.inner.local.write_specs(writes).await
    }

    async fn set_spec_status(&self, kind: Kind, name: &str, status: Status) -> Result<()> {
        self.inner.local.set_spec_status(kind, name, status).await
    }

    async fn put_token(&self, machine: &str, hash: &str, now: Ts) -> Result<()> {
        self.inner.local.put_token(machine, hash, now).await
    }

    async fn machine_for_token(&self, hash: &str) -> Result<Option<String>> {
        self.inner.local.machine_for_token(hash).await
    }

    async fn last_polls(&self) -> Result<Vec<(String, Ts)>> {
        self.inner.local.last_polls().await
    }

    async fn ledger_transaction<R, F>(&self, project: &str, select: LedgerSelect, plan: F) -> Result<R>
    where
        F: FnOnce(LedgerState) -> (LedgerWrites, R) + Send + 'static,
        R: Send + 'static,
    {
        then_sync!(self, self.inner.local.ledger_transaction(project, select, plan))
    }

    async fn ledger_rows(&self, project: Option<&str>) -> Result<Vec<LedgerRow>> {
        self.inner.local.ledger_rows(project).await
    }

    async fn ledger_counts(&self) -> Result<Vec<(String, String, u64)>> {
        self.inner.local.ledger_counts().await
    }

    async fn activity(&self, since: Ts, step: chrono::TimeDelta) -> Result<Vec<crate::Activity>> {
        self.inner.local.activity(since, step).await
    }

    async fn deliveries(&self, since: Ts) -> Result<Vec<(Ts, i64)>> {
        self.inner.local.deliveries(since).await
    }

    async fn search(&self, search: crate::Search) -> Result<crate::Found> {
        self.inner.local.search(search).await
    }

    async fn ledger_projects(&self) -> Result<Vec<String>> {
        self.inner.local.ledger_projects().await
    }

    async fn mail_last_seq(&self) -> Result<i64> {
        self.inner.local.mail_last_seq().await
    }

    async fn kv_get(&self, key: &str) -> Result<Option<String>> {
        self.inner.local.kv_get(key).await
    }

    async fn kv_set(&self, key: &str, value: &str) -> Result<()> {
        self.inner.local.kv_set(key, value).await
    }

    async fn claim_jobs(&self, claim: Claim) -> Result<Vec<Job>> {
        let claimed = self.inner.local.claim_jobs(claim).await?;
        if !claimed.is_empty() {
            self.changed();
        }
        Ok(claimed)
    }

    async fn jobs_transaction<R, F>(&self, select: JobSelect, plan: F) -> Result<R>
    where
        F: FnOnce(Vec<Job>) -> (Vec<Job>, R) + Send + 'static,
        R: Send + 'static,
    {
        then_sync!(self, self.inner.local.jobs_transaction(select, plan))
    }

    async fn get_job(&self, id: &str) -> Result<Option<Job>> {
        self.inner.local.get_job(id).await
    }

    async fn list_jobs(&self, q: JobQuery) -> Result<Vec<Job>> {
        self.inner.local.list_jobs(q).await
    }

    async fn count_jobs(&self, q: JobQuery) -> Result<u64> {
        self.inner.local.count_jobs(q).await
    }

    async fn job_counts(&self) -> Result<Vec<(String, String, u64)>> {
        self.inner.local.job_counts().await
    }

    async fn prune(&self, what: Prune, limit: usize) -> Result<usize> {
        // The pruned rows leave the sheet in the next cycle, as its deletions (E7).
        let n = self.inner.local.prune(what, limit).await?;
        if n > 0 {
            self.changed();
        }
        Ok(n)
    }

    async fn export_tabs(&self, out: mpsc::Sender<Batch>) -> Result<()> {
        // The working copy holds every acknowledged write, whether or not it reached the sheet.
        self.inner.local.export_tabs(out).await
    }

    async fn import_rows(&self, batch: Batch) -> Result<()> {
        self.inner.local.import_rows(batch).await
    }

    async fn import_finished(&self) -> Result<()> {
        self.inner.local.import_finished().await?;
        // The copy is done once the spreadsheet shows it, not when the process may exit first.
        self.sync_now().await
    }

    async fn occupied_tabs(&self) -> Result<Vec<&'static str>> {
        self.inner.local.occupied_tabs().await
    }

    async fn firing_alerts(&self) -> Result<Vec<Alert>> {
        self.inner.local.firing_alerts().await
    }

    async fn alerts_to_notify(&self, limit: usize) -> Result<Vec<Alert>> {
        self.inner.local.alerts_to_notify(limit).await
    }

    async fn list_alerts(&self, limit: usize) -> Result<Vec<Alert>> {
        self.inner.local.list_alerts(limit).await
    }

    async fn write_alerts(&self, alerts: Vec<Alert>) -> Result<()> {
        then_sync!(self, self.inner.local.write_alerts(alerts))
    }

    async fn mark_notified(&self, sent: Vec<Alert>, at: Ts) -> Result<()> {
        then_sync!(self, self.inner.local.mark_notified(sent, at))
    }

    async fn lease_transaction<R, F>(&self, name: &str, plan: F) -> Result<R>
    where
        F: FnOnce(Option<Lease>, Ts) -> (Option<Lease>, R) + Send + 'static,
        R: Send + 'static,
    {
        self.inner.local.lease_transaction(name, plan).await
    }

    fn changes(&self) -> Option<tokio::sync::broadcast::Receiver<Change>> {
        None
    }

    /// One cycle now: people's last edits (a ticked ▶, a changed state) are in before a claim.
    async fn refresh(&self) -> Result<()> {
        self.sync_now().await
    }
}

#[cfg(test)]
mod tests {
    use super::super::standin::Standin;
    use super::*;
    use pcmail_core::ledger::RowState;
    use serde_json::json;

    type Guard = (Standin, tempfile::TempDir);

    async fn open(standin: &Standin, dir: &Path) -> SheetsStore {
        SheetsStore::open(&standin.store_url(""), dir).await.expect("open")
    }

    async fn fresh() -> (Guard, SheetsStore) {
        let standin = Standin::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        ((standin, dir), store)
    }

    /// After each contract check: everything reaches the sheet, and a new working copy made
    /// from the sheet alone holds the same ledger, mail, jobs and alerts.
    async fn same_after_reopening_from_the_sheet(guard: &Guard, store: &SheetsStore) {
        store.sync_now().await.expect("sync");
        let dir = tempfile::tempdir().expect("tempdir");
        let again = open(&guard.0, dir.path()).await;
        for tab in TABS {
            let (mut a, mut b) = (store.ours(tab).await.expect("ours"), again.ours(tab).await.expect("theirs"));
            a.sort();
            b.sort();
            assert_eq!(a, b, "tab {}", tab.title);
        }
    }

    crate::contract::contract_tests!(fresh, after: super::same_after_reopening_from_the_sheet);

    fn row(n: u32, task: &str) -> LedgerRow {
        LedgerRow {
            project: "p".into(),
            id: pcmail_core::ledger::row_id(n),
            state: RowState::Todo,
            run_requested: false,
            task: task.into(),
            content: String::new(),
            source: "csv".into(),
            evidence: String::new(),
            due: String::new(),
            assignee: String::new(),
            function: "f".into(),
            result: String::new(),
            executed_at: None,
            instruction: String::new(),
            key: format!("csv|{task}"),
            failures: 0,
            refresh: false,
        }
    }

    async fn add_rows(store: &SheetsStore, n: u32) {
        let add: Vec<LedgerRow> = (1..=n).map(|i| row(i, &format!("task {i}"))).collect();
        let writes = LedgerWrites { add, next_seq: Some(n + 1), ..Default::default() };
        store.ledger_transaction("p", LedgerSelect::Ids(vec![]), move |_| (writes, ())).await.expect("add");
    }

    async fn set_results(store: &SheetsStore, result: &'static str) {
        store
            .ledger_transaction("p", LedgerSelect::All, move |state| {
                let replace = state.rows.into_iter().map(|r| LedgerRow { result: result.into(), ..r }).collect();
                (LedgerWrites { replace, ..Default::default() }, ())
            })
            .await
            .expect("results");
    }

    /// Data rows of a tab on the sheet, as normalized text.
    fn sheet_rows(standin: &Standin, title: &str) -> Vec<Vec<String>> {
        standin.cells(title).iter().skip(1).map(|r| r.iter().map(normalize).collect()).collect()
    }

    #[tokio::test]
    async fn p8_a_pass_changing_1_100_or_10000_ledger_rows_makes_one_read_and_one_write() {
        for n in [1, 100, 10_000] {
            let ((standin, _dir), store) = fresh().await;
            store.stop_background();
            add_rows(&store, n).await;
            store.sync_now().await.expect("sync");
            assert_eq!(sheet_rows(&standin, "ledger").len(), n as usize);
            standin.reset_calls();
            set_results(&store, "ok").await;
            store.sync_now().await.expect("sync");
            assert_eq!(standin.calls(), ["batchGet", "values.batchUpdate"], "{n} rows changed");
            let result = LEDGER.fields.iter().position(|f| f.key == "result").expect("result");
            assert!(sheet_rows(&standin, "ledger").iter().all(|r| r[result] == "ok"));
        }
    }

    #[tokio::test]
    async fn p8_with_429s_injected_every_write_lands_exactly_once() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        add_rows(&store, 6).await;
        store.sync_now().await.expect("sync");
        // One cycle with all three kinds of write, each refused twice first.
        set_results(&store, "done").await;
        store
            .ledger_transaction("p", LedgerSelect::Ids(vec![]), |_| {
                let writes = LedgerWrites {
                    add: vec![row(7, "late")],
                    delete: vec!["T-0002".into(), "T-0003".into()],
                    next_seq: Some(8),
                    ..Default::default()
                };
                (writes, ())
            })
            .await
            .expect("add and delete");
        standin.reset_calls();
        standin.throttle_next(2);
        store.sync_now().await.expect("sync through the 429s");
        let calls = standin.calls();
        assert_eq!(calls.iter().filter(|c| c.ends_with(" 429")).count(), 2, "{calls:?}");
        let rows = sheet_rows(&standin, "ledger");
        let ids: Vec<&str> = rows.iter().map(|r| r[1].as_str()).collect();
        assert_eq!(ids, ["T-0001", "T-0004", "T-0005", "T-0006", "T-0007"], "each delete and append once");
        assert!(rows[..4].iter().all(|r| r.contains(&"done".to_string())));
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        assert_eq!(standin.calls(), ["batchGet"], "nothing left to write, nothing written twice");
    }

    #[tokio::test]
    async fn cells_read_back_as_another_type_make_no_write_fail_and_none_repeat() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        standin.coerce(true);
        add_rows(&store, 3).await;
        set_results(&store, "42").await;
        store.sync_now().await.expect("sync");
        let stored = standin.cells("ledger");
        assert!(
            stored.iter().flatten().any(|v| v == &json!(42.0)) && stored.iter().flatten().any(|v| v == &json!(false))
        );
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        store.sync_now().await.expect("sync");
        assert_eq!(standin.calls(), ["batchGet", "batchGet"], "numbers and booleans read back equal");
    }

    #[tokio::test]
    async fn a_persons_edit_between_the_read_and_the_write_is_kept_not_overwritten() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        add_rows(&store, 2).await;
        store.sync_now().await.expect("sync");
        let col = |key: &str| LEDGER.fields.iter().position(|f| f.key == key).expect("field");
        // The controller claims T-0001 while a person drops it and writes an instruction.
        store
            .ledger_transaction("p", LedgerSelect::Ids(vec!["T-0001".into()]), |state| {
                let r = state.rows[0].clone();
                (
                    LedgerWrites {
                        replace: vec![LedgerRow { state: RowState::Running, result: "working".into(), ..r }],
                        ..Default::default()
                    },
                    (),
                )
            })
            .await
            .expect("claim");
        standin.edit("ledger", 2, col("state"), json!("不要"));
        standin.edit("ledger", 2, col("instruction"), json!("もっと短く"));
        standin.edit("ledger", 2, col("run_requested"), json!(true));
        store.sync_now().await.expect("sync");
        let sheet = &sheet_rows(&standin, "ledger")[0];
        assert_eq!((sheet[col("state")].as_str(), sheet[col("instruction")].as_str()), ("不要", "もっと短く"));
        assert_eq!(sheet[col("result")], "working", "the controller's own cell is written");
        let local = store.ledger_rows(Some("p")).await.expect("rows");
        assert_eq!(
            (local[0].state, local[0].instruction.as_str(), local[0].run_requested),
            (RowState::Dropped, "もっと短く", true)
        );
        let events = store.events_for("ledger/p/T-0001").await.expect("events");
        assert!(events.iter().any(|e| e.reason == "EditedInSheet"), "{events:?}");
    }

    #[tokio::test]
    async fn an_edit_made_between_a_cycles_read_and_its_write_is_kept() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        add_rows(&store, 1).await;
        store.sync_now().await.expect("sync");
        let col = |key: &str| LEDGER.fields.iter().position(|f| f.key == key).expect("field");
        set_results(&store, "draft ready").await;
        standin.edit_after_next_read("ledger", 2, col("state"), json!("完了"));
        standin.edit_after_next_read("ledger", 2, col("instruction"), json!("表にして"));
        store.sync_now().await.expect("sync");
        let sheet = &sheet_rows(&standin, "ledger")[0];
        assert_eq!(
            (sheet[col("state")].as_str(), sheet[col("instruction")].as_str(), sheet[col("result")].as_str()),
            ("完了", "表にして", "draft ready"),
            "only the changed cell was written; the person's cells stand"
        );
        store.sync_now().await.expect("sync");
        let local = store.ledger_rows(Some("p")).await.expect("rows");
        assert_eq!(
            (local[0].state, local[0].instruction.as_str()),
            (RowState::Done, "表にして"),
            "and taken in next cycle"
        );
    }

    #[tokio::test]
    async fn l17_rows_without_an_id_are_ignored_and_a_row_deleted_by_hand_comes_back() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        add_rows(&store, 2).await;
        store.sync_now().await.expect("sync");
        let run = LEDGER.fields.iter().position(|f| f.key == "run_requested").expect("field");
        standin.edit("ledger", 10, run, json!(false));
        standin.delete_row("ledger", 2);
        store.sync_now().await.expect("sync");
        let ids: Vec<String> = sheet_rows(&standin, "ledger")
            .iter()
            .map(|r| r.get(1).cloned().unwrap_or_default())
            .filter(|id| !id.is_empty())
            .collect();
        assert_eq!(ids, ["T-0002", "T-0001"], "T-0001 appended again; the stray checkbox row left alone");
        assert_eq!(store.ledger_rows(Some("p")).await.expect("rows").len(), 2);
    }

    #[tokio::test]
    async fn a_missing_header_is_named() {
        let ((standin, _dir), store) = fresh().await;
        let col = LEDGER.fields.iter().position(|f| f.key == "instruction").expect("field");
        standin.edit("ledger", 1, col, json!("メモ"));
        let err = store.sync_now().await.expect_err("refused").to_string();
        assert!(err.contains("修正指示"), "{err}");
    }
}
