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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;

use pcmail_core::Ts;
use pcmail_core::alert::Alert;
use pcmail_core::api::Event;
use pcmail_core::jobs::Job;
use pcmail_core::lease::Lease;
use pcmail_core::ledger::{Row as LedgerRow, ViewLine, ViewMark};
use pcmail_core::mail::Mail;
use pcmail_core::manifest::{Kind, SpecRecord, Status};
use pcmail_core::sheet::cell::{CellKind, a1_row_range, normalize, quote_title, read_date, to_wire};
use pcmail_core::sheet::layout::{
    ALERTS, JOBS, LEDGER, Lang, LayoutError, MAIL, SHARED_LEDGER_TITLE, Tab, header_row, ledger_project, ledger_title,
    locate, view_title,
};
use pcmail_core::sheet::plan::{Fields, SyncPlan, plan_sync, row_after_deletes, row_key};

use super::client::{Client, SheetsConfig};
use super::render::{FieldRow, fields, names};
use super::wire::{
    ValueRange, add_sheet, background, checkboxes, date_column, delete_rows, freeze_header, grow, hide_column,
    rename_sheet,
};
use crate::cells::Batch;
use crate::codec::{self, ALERT_COLUMNS, JOB_COLUMNS, LEDGER_COLUMNS, MAIL_COLUMNS, MAIL_INSERT_COLUMNS, json};
use crate::{
    Change, Claim, JobQuery, JobSelect, LEDGER_VIEW_KEY, LedgerSelect, LedgerState, LedgerWrites, MachineSeen,
    MailCount, MailQuery, MailSelect, MailWrites, Prune, Result, SpecWrites, SqliteStore, Store, StoreError,
};

/// The tabs every spreadsheet has besides a ledger tab per project.
const SHARED_TABS: [&Tab; 3] = [&MAIL, &JOBS, &ALERTS];
/// How often a cycle runs with nothing written, to take in people's edits.
const IDLE_CYCLE: std::time::Duration = std::time::Duration::from_secs(5);
/// Rows a tab the adapter adds starts with (Google's default).
const NEW_TAB_ROWS: usize = 1000;
/// The view tab's background for overdue rows and for rows waiting for review (seed 001 §7).
const OVERDUE: (f64, f64, f64) = (0.96, 0.8, 0.8);
const REVIEW: (f64, f64, f64) = (1.0, 0.95, 0.7);
const PLAIN: (f64, f64, f64) = (1.0, 1.0, 1.0);

/// Where the working copy of the spreadsheet a `sheets://` URL names lives in `data_dir`.
pub fn working_copy(url: &str, data_dir: &Path) -> Result<std::path::PathBuf> {
    SheetsConfig::from_url(url).map(|c| working_copy_of(&c, data_dir))
}

fn working_copy_of(config: &SheetsConfig, data_dir: &Path) -> std::path::PathBuf {
    data_dir.join(format!("sheets-{}.db", config.spreadsheet_id))
}

/// What the adapter knows of one tab's grid: its numeric id and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grid {
    id: i64,
    rows: usize,
    columns: usize,
}

/// A tab the adapter keeps true to the store: its layout and its title; a ledger tab holds one
/// project's rows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept {
    layout: &'static Tab,
    title: String,
    project: Option<String>,
}

/// What one cycle sends: one structural `batchUpdate` (tabs added and grown, headers frozen,
/// columns hidden and formatted, rows deleted, checkboxes on the rows about to be appended),
/// then one values write (addressing rows as they are after the deletes), then an append per tab.
#[derive(Default)]
struct Cycle {
    structure: Vec<serde_json::Value>,
    values: Vec<ValueRange>,
    /// Rows to append, each batch with the range it is anchored at (`'tab'!A<first row>`).
    appends: Vec<(String, Vec<Vec<serde_json::Value>>)>,
    bases: Vec<(String, BTreeMap<String, Fields>)>,
    /// Tabs (by sheet id: a tab a person deleted comes back with a new one) dressed this cycle.
    dressed: Vec<i64>,
    /// Tabs this cycle adds.
    added: Vec<i64>,
    /// The view tab's rows once this cycle's writes land.
    view_rows: Option<usize>,
}

#[derive(Clone)]
pub struct SheetsStore {
    inner: Arc<Inner>,
}

struct Inner {
    local: SqliteStore,
    client: Client,
    lang: Lang,
    grids: Mutex<BTreeMap<String, Grid>>,
    /// A cycle failed: the grids are read again before the next one (a person may have resized
    /// or removed a tab).
    grids_stale: AtomicBool,
    /// `rebuild-view` built a new view: the view tab is rewritten next cycle.
    view_dirty: AtomicBool,
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
    /// Opens the spreadsheet a `sheets://` URL names, with its working copy in `data_dir`: fills
    /// a new working copy from the sheet, and runs a first cycle (which adds the tabs the
    /// spreadsheet lacks) before answering.
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
                grids: Mutex::new(BTreeMap::new()),
                grids_stale: AtomicBool::new(false),
                view_dirty: AtomicBool::new(false),
                cycle: tokio::sync::Mutex::new(()),
                wake: tokio::sync::Notify::new(),
                last_error: Mutex::new(None),
                syncer: Mutex::new(None),
            }),
        };
        store.learn_grids().await?;
        if fresh {
            store.import().await?;
        }
        // The last view `rebuild-view` built is drawn again: a restart may have cut its cycle.
        let stored_view = store.inner.local.kv_get(LEDGER_VIEW_KEY).await?;
        store.inner.view_dirty.store(stored_view.is_some(), Ordering::SeqCst);
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

    fn grids(&self) -> BTreeMap<String, Grid> {
        self.inner.grids.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Every tab's id and grid size, as the spreadsheet has them now (one `spreadsheets.get`).
    async fn learn_grids(&self) -> Result<()> {
        let sheet = self.inner.client.spreadsheet().await?;
        let grids = sheet
            .sheets
            .iter()
            .map(|s| {
                let size = s.properties.grid_properties.clone().unwrap_or_default();
                let grid = Grid {
                    id: s.properties.sheet_id,
                    rows: size.row_count as usize,
                    columns: size.column_count as usize,
                };
                (s.properties.title.clone(), grid)
            })
            .collect();
        *self.inner.grids.lock().unwrap_or_else(PoisonError::into_inner) = grids;
        Ok(())
    }

    /// The tabs the store's rows belong on: a ledger tab per project (X7: an applied Ledger's
    /// too, rows or not), then mail, jobs, alerts.
    async fn kept(&self) -> Result<Vec<Kept>> {
        let lang = self.inner.lang;
        let specs = self.inner.local.list_specs().await?;
        let projects =
            pcmail_core::sheet::layout::ledger_tab_projects(self.inner.local.ledger_projects().await?, &specs);
        let ledgers =
            projects.into_iter().map(|p| Kept { layout: &LEDGER, title: ledger_title(lang, &p), project: Some(p) });
        let shared = SHARED_TABS.into_iter().map(|t| Kept { layout: t, title: t.title.into(), project: None });
        Ok(ledgers.chain(shared).collect())
    }

    /// The layout of a tab the spreadsheet holds, by its title (ledger tabs in either preset, and
    /// the one every project shared before).
    fn layout_of(title: &str) -> Option<&'static Tab> {
        if ledger_project(title).is_some_and(pcmail_core::text::is_name) || title == SHARED_LEDGER_TITLE {
            return Some(&LEDGER);
        }
        SHARED_TABS.into_iter().find(|t| t.title == title)
    }

    /// Each titled tab as read now (one `values:batchGet`): a normalized header row (empty for
    /// a new tab) and the data rows as Sheets typed them (a date column's number is a date).
    async fn read_tabs(&self, titles: &[String]) -> Result<Vec<TabRead>> {
        if titles.is_empty() {
            return Ok(vec![]);
        }
        let ranges: Vec<String> = titles.iter().map(|t| quote_title(t)).collect();
        let read = self.inner.client.batch_get(&ranges).await?;
        Ok((0..titles.len())
            .map(|i| {
                let mut rows = read.get(i).map(|r| r.values.clone()).unwrap_or_default().into_iter();
                let header = rows.next().unwrap_or_default().iter().map(normalize).collect();
                (header, rows.collect())
            })
            .collect())
    }

    /// A new working copy starts as the spreadsheet holds it.
    async fn import(&self) -> Result<()> {
        let local = &self.inner.local;
        let titles: Vec<String> = self.grids().into_keys().filter(|t| Self::layout_of(t).is_some()).collect();
        for (title, (header, rows)) in titles.iter().zip(self.read_tabs(&titles).await?) {
            let Some(tab) = Self::layout_of(title) else { continue };
            if header.is_empty() {
                continue;
            }
            let columns = columns_of(tab, title, &header)?;
            let rows: Vec<Fields> = rows
                .iter()
                .map(|cells| read_fields(tab, cells, &columns))
                .filter(|f| row_key(tab, f).is_some())
                .collect();
            let decode = |list: &str, f: &Fields| FieldRow::new(tab, &names(list), f);
            match tab.title {
                "ledger" => {
                    let mut by_project: BTreeMap<String, Vec<LedgerRow>> = BTreeMap::new();
                    for f in &rows {
                        let row = codec::ledger_row(&decode(LEDGER_COLUMNS, f))?;
                        // A project's tab holds its own rows; one copied in from elsewhere is a
                        // person's, and left on the sheet.
                        if ledger_project(title).is_none_or(|p| p == row.project) {
                            by_project.entry(row.project.clone()).or_default().push(row);
                        }
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
            self.save_base(title, &base).await?;
        }
        Ok(())
    }

    /// Each row a tab keeps as the working copy holds it, rendered as the tab's fields, oldest
    /// first.
    async fn ours(&self, kept: &Kept) -> Result<Vec<(String, Fields)>> {
        let (local, lang, tab) = (&self.inner.local, self.inner.lang, kept.layout);
        let rendered: Vec<Fields> = match tab.title {
            "ledger" => {
                let n = names(LEDGER_COLUMNS);
                let rows = local.ledger_rows(Some(kept.project.as_deref().unwrap_or_default())).await?;
                rows.iter().map(|r| fields(tab, lang, &n, &codec::ledger_params(r))).collect()
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

    async fn base(&self, title: &str) -> Result<BTreeMap<String, Fields>> {
        let stored = self.inner.local.kv_get(&format!("sheets/base/{title}")).await?;
        Ok(stored.and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default())
    }

    async fn save_base(&self, title: &str, base: &BTreeMap<String, Fields>) -> Result<()> {
        self.inner.local.kv_set(&format!("sheets/base/{title}"), &json(base)).await
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
                        object: pcmail_core::trail::ObjectRef::ledger_row(&row.project, &row.id),
                        reason: pcmail_core::trail::Reason::EditedInSheet,
                        message: format!("a person changed {} in the spreadsheet", changed.join(", ")),
                        actor: "sheet".into(),
                    };
                    (LedgerWrites { replace: vec![row], events: vec![event], ..Default::default() }, ())
                })
                .await?;
        }
        Ok(())
    }

    /// One cycle: one read of every kept tab, people's edits taken in, then at most one
    /// structural `batchUpdate`, one values write and an append per tab (P8).
    pub async fn sync_now(&self) -> Result<()> {
        let _one_at_a_time = self.inner.cycle.lock().await;
        if self.inner.grids_stale.load(Ordering::SeqCst) {
            self.learn_grids().await?;
            self.inner.grids_stale.store(false, Ordering::SeqCst);
        }
        let outcome = self.cycle().await;
        if outcome.is_err() {
            self.inner.grids_stale.store(true, Ordering::SeqCst);
        }
        outcome
    }

    async fn cycle(&self) -> Result<()> {
        let mut grids = self.grids();
        let kept = self.kept().await?;
        // The tab every project shared before is read once more, then migrated.
        let shared = grids.get(SHARED_LEDGER_TITLE).copied();
        let mut titles: Vec<String> =
            kept.iter().filter(|k| grids.contains_key(&k.title)).map(|k| k.title.clone()).collect();
        titles.extend(shared.map(|_| SHARED_LEDGER_TITLE.to_string()));
        let mut read: BTreeMap<String, TabRead> = titles.iter().cloned().zip(self.read_tabs(&titles).await?).collect();
        let mut cycle = Cycle::default();
        if let Some(grid) = shared {
            let last_read = read.remove(SHARED_LEDGER_TITLE).unwrap_or_default();
            self.migrate_shared_tab(grid, last_read, &mut grids, &mut cycle).await?;
        }
        for tab in &kept {
            let (header, rows) = read.remove(&tab.title).unwrap_or_default();
            self.plan_tab(tab, header, rows, &mut grids, &mut cycle).await?;
        }
        let view = self.inner.view_dirty.swap(false, Ordering::SeqCst);
        if view && let Err(e) = self.plan_view(&mut grids, &mut cycle).await {
            self.inner.view_dirty.store(true, Ordering::SeqCst);
            return Err(e);
        }
        let client = &self.inner.client;
        let sent = async {
            if !cycle.structure.is_empty() {
                client.batch_update(std::mem::take(&mut cycle.structure)).await?;
            }
            if !cycle.values.is_empty() {
                client.update_values(std::mem::take(&mut cycle.values)).await?;
            }
            for (range, rows) in std::mem::take(&mut cycle.appends) {
                client.append(&range, rows).await?;
            }
            Ok::<(), StoreError>(())
        }
        .await;
        if let Err(e) = sent {
            self.inner.view_dirty.fetch_or(view, Ordering::SeqCst);
            return Err(e);
        }
        *self.inner.grids.lock().unwrap_or_else(PoisonError::into_inner) = grids;
        for (title, base) in cycle.bases {
            self.save_base(&title, &base).await?;
        }
        for id in cycle.dressed {
            self.inner.local.kv_set(&format!("sheets/dressed/{id}"), "1").await?;
        }
        if let Some(rows) = cycle.view_rows {
            self.inner.local.kv_set("sheets/view_rows", &rows.to_string()).await?;
        }
        Ok(())
    }

    /// The tab every project shared before a tab per project: people's last edits on it taken
    /// in, then renamed (to a free title) so no cycle reads it again; its rows are appended to
    /// their projects' tabs by the same cycle.
    async fn migrate_shared_tab(
        &self,
        grid: Grid,
        (header, rows): TabRead,
        grids: &mut BTreeMap<String, Grid>,
        cycle: &mut Cycle,
    ) -> Result<()> {
        if !header.is_empty() {
            let columns = columns_of(&LEDGER, SHARED_LEDGER_TITLE, &header)?;
            let rows: Vec<Vec<String>> = rows.iter().map(|r| read_cells(&LEDGER, r, &columns)).collect();
            let base = self.base(SHARED_LEDGER_TITLE).await?;
            let n = names(LEDGER_COLUMNS);
            let ours: Vec<(String, Fields)> = self
                .inner
                .local
                .ledger_rows(None)
                .await?
                .iter()
                .map(|r| fields(&LEDGER, self.inner.lang, &n, &codec::ledger_params(r)))
                .filter_map(|f| Some((row_key(&LEDGER, &f)?, f)))
                .collect();
            self.adopt(plan_sync(&LEDGER, &columns, &rows, &base, &ours).adopt).await?;
        }
        let renamed = (1..)
            .map(|n| match n {
                1 => format!("{SHARED_LEDGER_TITLE} (migrated)"),
                n => format!("{SHARED_LEDGER_TITLE} (migrated {n})"),
            })
            .find(|t| !grids.contains_key(t))
            .unwrap_or_default();
        cycle.structure.push(rename_sheet(grid.id, &renamed));
        grids.remove(SHARED_LEDGER_TITLE);
        grids.insert(renamed, grid);
        Ok(())
    }

    /// One tab's part of a cycle: its header and structure, the three-way plan of its rows,
    /// people's edits taken in, and the writes.
    async fn plan_tab(
        &self,
        kept: &Kept,
        header: Vec<String>,
        rows: Vec<Vec<serde_json::Value>>,
        grids: &mut BTreeMap<String, Grid>,
        cycle: &mut Cycle,
    ) -> Result<()> {
        let (tab, title) = (kept.layout, kept.title.as_str());
        let columns = header_columns(tab, title, self.inner.lang, &header, cycle)?;
        let width = columns.iter().max().map_or(0, |m| m + 1).max(header.len());
        let grid = self.ensure_grid(title, width, grids, cycle);
        if !self.dressed(grid, cycle).await? {
            cycle.structure.extend(dress(tab, &columns, grid));
            cycle.dressed.push(grid.id);
        }
        let rows: Vec<Vec<String>> = rows.iter().map(|r| read_cells(tab, r, &columns)).collect();
        let base = self.base(title).await?;
        let plan = plan_sync(tab, &columns, &rows, &base, &self.ours(kept).await?);
        if tab.title == "ledger" && !plan.adopt.is_empty() {
            self.adopt(plan.adopt.clone()).await?;
        }
        let writes = TabWrites { tab, title, columns: &columns, grid };
        writes.deletes_and_updates(&plan, cycle);
        // The grid as it is once the deletes are gone.
        let deleted: usize = plan.deletes.iter().map(|(first, last)| last - first + 1).sum();
        let have = grid.rows.saturating_sub(deleted);
        // Appends are written from the row after the last one read (deleted rows above taken off).
        let grown = writes.appends(&plan.appends, rows.len() + 2 - deleted, have, cycle);
        if let Some(g) = grids.get_mut(title) {
            g.rows = grown.unwrap_or(have);
        }
        if plan.synced != base {
            cycle.bases.push((title.to_string(), plan.synced));
        }
        Ok(())
    }

    /// Whether the tab got its frozen header, hidden columns and date formats (once a tab).
    async fn dressed(&self, grid: Grid, cycle: &Cycle) -> Result<bool> {
        if cycle.added.contains(&grid.id) {
            return Ok(false);
        }
        Ok(self.inner.local.kv_get(&format!("sheets/dressed/{}", grid.id)).await?.is_some())
    }

    /// The tab's grid, added (sized to `width` columns, its header frozen) when the spreadsheet
    /// lacks it, or grown before a write would pass its last column.
    fn ensure_grid(&self, title: &str, width: usize, grids: &mut BTreeMap<String, Grid>, cycle: &mut Cycle) -> Grid {
        match grids.get_mut(title) {
            Some(grid) => {
                if grid.columns < width {
                    cycle.structure.push(grow(grid.id, "COLUMNS", width - grid.columns));
                    grid.columns = width;
                }
                *grid
            }
            None => {
                let id = grids.values().map(|g| g.id).max().map_or(1, |m| m + 1);
                let grid = Grid { id, rows: NEW_TAB_ROWS, columns: width };
                cycle.structure.push(add_sheet(id, title, grid.rows, grid.columns));
                // A new tab is dressed whatever a tab that once had its id was.
                cycle.added.push(id);
                grids.insert(title.to_string(), grid);
                grid
            }
        }
    }

    /// The view tab rewritten from the lines `rebuild-view` stored: every line's cells, blanks
    /// over what a longer view left, and backgrounds for overdue and review rows.
    async fn plan_view(&self, grids: &mut BTreeMap<String, Grid>, cycle: &mut Cycle) -> Result<()> {
        let stored = self.inner.local.kv_get(LEDGER_VIEW_KEY).await?.unwrap_or_default();
        let lines: Vec<ViewLine> = serde_json::from_str(&stored).unwrap_or_default();
        let lang = self.inner.lang;
        let title = view_title(lang);
        let mut cells = vec![view_header(lang)];
        cells.extend(lines.iter().map(|l| view_cells(lang, l)));
        let before: usize =
            self.inner.local.kv_get("sheets/view_rows").await?.and_then(|n| n.parse().ok()).unwrap_or_default();
        let written = cells.len().max(before);
        cells.resize(written, vec![String::new(); VIEW_WIDTH]);
        let grid = self.ensure_grid(title, VIEW_WIDTH, grids, cycle);
        if grid.rows < written {
            cycle.structure.push(grow(grid.id, "ROWS", written - grid.rows));
            if let Some(g) = grids.get_mut(title) {
                g.rows = written;
            }
        }
        if written > 1 {
            cycle.structure.push(background(grid.id, 2, written, PLAIN));
        }
        for (i, line) in lines.iter().enumerate() {
            let colour = match line {
                ViewLine::Row { mark: Some(ViewMark::Overdue), .. } => OVERDUE,
                ViewLine::Row { mark: Some(ViewMark::Review), .. } => REVIEW,
                _ => continue,
            };
            cycle.structure.push(background(grid.id, i + 2, i + 2, colour));
        }
        if !self.dressed(grid, cycle).await? {
            cycle.structure.push(freeze_header(grid.id));
            cycle.dressed.push(grid.id);
        }
        if written > 1 {
            cycle.structure.push(date_column(grid.id, VIEW_DUE, 2, written));
        }
        let values = cells
            .into_iter()
            .map(|row| {
                row.iter()
                    .enumerate()
                    .map(|(c, v)| to_wire(v, if c == VIEW_DUE { CellKind::Date } else { CellKind::Text }))
                    .collect()
            })
            .collect();
        cycle.values.push(ValueRange {
            range: format!("{}!A1:F{written}", quote_title(title)),
            major_dimension: None,
            values,
        });
        cycle.view_rows = Some(lines.len() + 1);
        Ok(())
    }
}

/// The view tab's columns: project, task id, due, task, state, assignee.
const VIEW_WIDTH: usize = 6;
const VIEW_DUE: usize = 2;

fn view_header(lang: Lang) -> Vec<String> {
    let ja = ["案件", "タスクID", "期限", "タスク", "状態", "担当"];
    let en = ["Project", "Task ID", "Due", "Task", "State", "Assignee"];
    match lang {
        Lang::Ja => ja,
        Lang::En => en,
    }
    .map(String::from)
    .to_vec()
}

/// One view line as the tab's cells; the line past a project's cap says how many rows it left
/// out and where they are (seed 001 §7: never cut silently).
fn view_cells(lang: Lang, line: &ViewLine) -> Vec<String> {
    let mut cells = vec![String::new(); VIEW_WIDTH];
    match line {
        ViewLine::Project { project } => cells[0] = project.clone(),
        ViewLine::Row { row, .. } => {
            let state = match lang {
                Lang::Ja => row.state.ja(),
                Lang::En => row.state.as_str(),
            };
            cells = vec![
                row.project.clone(),
                row.id.clone(),
                row.due.clone(),
                row.task.clone(),
                state.into(),
                row.assignee.clone(),
            ];
        }
        ViewLine::More { project, count } => {
            cells[1] = match lang {
                Lang::Ja => format!("… 他 {count} 件は案件の台帳で"),
                Lang::En => format!("… {count} more in {project}'s ledger"),
            }
        }
        ViewLine::Count { source, count } => {
            cells[1] = match lang {
                Lang::Ja => format!("{source}: 未完了 {count} 件（専用の一覧で）"),
                Lang::En => format!("{source}: {count} open (see its own dashboard)"),
            }
        }
    }
    cells
}

/// A tab's columns by field, from the header read; an empty tab gets the whole header row,
/// and an older tab the headers of the late fields it lacks, after its last column.
fn header_columns(tab: &Tab, title: &str, lang: Lang, header: &[String], cycle: &mut Cycle) -> Result<Vec<usize>> {
    if header.is_empty() {
        let row = header_row(tab, lang);
        cycle.values.push(ValueRange {
            range: a1_row_range(title, 1, 0, row.len() - 1),
            major_dimension: None,
            values: vec![row.into_iter().map(serde_json::Value::String).collect()],
        });
        return Ok((0..tab.fields.len()).collect());
    }
    let columns = columns_of(tab, title, header)?;
    for (f, &column) in columns.iter().enumerate().filter(|(_, c)| **c >= header.len()) {
        cycle.values.push(ValueRange {
            range: a1_row_range(title, 1, column, column),
            major_dimension: None,
            values: vec![vec![serde_json::Value::String(lang.header(&tab.fields[f]).into())]],
        });
    }
    Ok(columns)
}

/// Where one tab's planned writes go: its layout, title, columns by field and grid.
struct TabWrites<'a> {
    tab: &'a Tab,
    title: &'a str,
    columns: &'a [usize],
    grid: Grid,
}

impl TabWrites<'_> {
    /// How the cell of a sheet column goes over the wire (people's own columns are text).
    fn kind(&self, column: usize) -> CellKind {
        self.columns.iter().position(|c| *c == column).map_or(CellKind::Text, |f| CellKind::of(&self.tab.fields[f]))
    }

    /// The plan's row deletes (bottom-up) and its changed cells, at their rows after the deletes.
    fn deletes_and_updates(&self, plan: &SyncPlan, cycle: &mut Cycle) {
        cycle.structure.extend(plan.deletes.iter().map(|&(first, last)| delete_rows(self.grid.id, first, last)));
        for run in &plan.updates {
            let last = run.first_column + run.values.len() - 1;
            let row = row_after_deletes(run.row, &plan.deletes);
            let values =
                run.values.iter().enumerate().map(|(i, v)| to_wire(v, self.kind(run.first_column + i))).collect();
            cycle.values.push(ValueRange {
                range: a1_row_range(self.title, row, run.first_column, last),
                major_dimension: None,
                values: vec![values],
            });
        }
    }

    /// New rows from sheet row `first`, the append anchored there, on a grid of `have` rows:
    /// the rows get checkboxes, and only they (seed 001 §10). Answers the grid's rows when it
    /// had to grow.
    fn appends(&self, appends: &[Vec<String>], first: usize, have: usize, cycle: &mut Cycle) -> Option<usize> {
        if appends.is_empty() {
            return None;
        }
        let (tab, id) = (self.tab, self.grid.id);
        let last = first + appends.len() - 1;
        let grown = (have < last).then(|| {
            cycle.structure.extend(grow_rows(tab, self.columns, id, have, last));
            last
        });
        for (f, field) in tab.fields.iter().enumerate() {
            if field.boolean && field.editable {
                cycle.structure.push(checkboxes(id, self.columns[f], first, last));
            }
        }
        let rows = appends
            .iter()
            .map(|cells| cells.iter().enumerate().map(|(c, v)| to_wire(v, self.kind(c))).collect())
            .collect();
        cycle.appends.push((format!("{}!A{first}", quote_title(self.title)), rows));
        grown
    }
}

/// Rows `have + 1 ..= last` added to a tab's grid, its date columns formatted on them too (a row
/// `appendDimension` adds carries no format).
fn grow_rows(tab: &Tab, columns: &[usize], id: i64, have: usize, last: usize) -> Vec<serde_json::Value> {
    let mut requests = vec![grow(id, "ROWS", last - have)];
    for (f, _) in tab.fields.iter().enumerate().filter(|(_, f)| f.date) {
        requests.push(date_column(id, columns[f], have.max(1) + 1, last));
    }
    requests
}

/// The structure a tab gets once: its header row frozen, the controller's bookkeeping columns
/// hidden, date columns shown as dates (formats write no values, so they span the grid's rows).
fn dress(tab: &Tab, columns: &[usize], grid: Grid) -> Vec<serde_json::Value> {
    let mut requests = vec![freeze_header(grid.id)];
    for (f, field) in tab.fields.iter().enumerate() {
        if field.hidden {
            requests.push(hide_column(grid.id, columns[f]));
        }
        if field.date && grid.rows >= 2 {
            requests.push(date_column(grid.id, columns[f], 2, grid.rows));
        }
    }
    requests
}

/// Where `title`'s fields are, found by header; an error names the tab as people see it.
fn columns_of(tab: &Tab, title: &str, header: &[String]) -> Result<Vec<usize>> {
    locate(tab, header).map_err(|mut e| {
        let (LayoutError::MissingColumn { tab, .. } | LayoutError::DuplicateColumn { tab, .. }) = &mut e;
        *tab = title.to_string();
        StoreError::Schema(e.to_string())
    })
}

/// A tab as one read answers it: its normalized header and its rows as Sheets typed them.
type TabRead = (Vec<String>, Vec<Vec<serde_json::Value>>);

/// A sheet row's cells in the normal form, its date columns' numbers read as dates (a typed date
/// comes as its serial).
fn read_cells(tab: &Tab, cells: &[serde_json::Value], columns: &[usize]) -> Vec<String> {
    let dates: Vec<usize> = tab.fields.iter().enumerate().filter(|(_, f)| f.date).map(|(f, _)| columns[f]).collect();
    cells.iter().enumerate().map(|(c, v)| if dates.contains(&c) { read_date(v) } else { normalize(v) }).collect()
}

/// A sheet row's fields, its dates read as dates.
fn read_fields(tab: &Tab, cells: &[serde_json::Value], columns: &[usize]) -> Fields {
    pcmail_core::sheet::plan::fields_of(&read_cells(tab, cells, columns), columns)
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

    async fn machines_seen(&self) -> Result<Vec<MachineSeen>> {
        self.inner.local.machines_seen().await
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

    async fn ledger_counts(&self) -> Result<Vec<crate::StateCount<pcmail_core::ledger::RowState>>> {
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
        self.inner.local.kv_set(key, value).await?;
        if key == LEDGER_VIEW_KEY {
            self.inner.view_dirty.store(true, Ordering::SeqCst);
            self.changed();
        }
        Ok(())
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

    async fn job_counts(&self) -> Result<Vec<crate::StateCount<pcmail_core::jobs::JobState>>> {
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

    async fn index_search(&self, batch: i64) -> Result<crate::IndexBehind> {
        // The working copy answers searches, so it holds the index.
        self.inner.local.index_search(batch).await
    }

    async fn export_tabs(&self, out: mpsc::Sender<Batch>) -> Result<()> {
        // The working copy holds every acknowledged write, whether or not it reached the sheet.
        self.inner.local.export_tabs(out).await
    }

    async fn import_rows(&self, batch: Batch) -> Result<()> {
        self.inner.local.import_rows(batch).await
    }

    async fn import_stream(&self, rows: mpsc::Receiver<crate::cells::Incoming>) -> Result<()> {
        // The working copy's own stream: its writer's triggers off once for all the batches.
        self.inner.local.import_stream(rows).await
    }

    async fn import_started(&self) -> Result<()> {
        self.inner.local.import_started().await
    }

    async fn import_finished(&self) -> Result<()> {
        self.inner.local.import_finished().await?;
        // The copy is done once the spreadsheet shows it, not when the process may exit first.
        self.sync_now().await
    }

    async fn occupied_tabs(&self) -> Result<Vec<&'static str>> {
        self.inner.local.occupied_tabs().await
    }

    async fn replace_tabs(&self, rows: mpsc::Receiver<crate::Incoming>) -> Result<()> {
        // The working copy in one transaction, its `sheets/` record of the last cycle kept: the
        // cycle then sees the store changed, not the sheet, and rewrites the tabs to match.
        self.inner.local.replace_tabs(rows).await?;
        self.sync_now().await.map_err(|e| {
            StoreError::Unavailable(format!(
                "the restore is in the working copy, but the spreadsheet did not take it yet ({e}); serve writes it \
                 at its first cycle"
            ))
        })
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

    /// Project `p`'s ledger tab.
    const P_TAB: &str = "台帳-p";

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
        let kept = store.kept().await.expect("tabs");
        assert_eq!(kept, again.kept().await.expect("tabs"), "the same tabs");
        for tab in kept {
            let (mut a, mut b) = (store.ours(&tab).await.expect("ours"), again.ours(&tab).await.expect("theirs"));
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
    async fn t1_t19_no_lease_token_reaches_the_jobs_tab() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        let job = Job::new("job-0001".into(), "q".into(), "f".into(), "{}".into(), pcmail_store_now());
        store.jobs_transaction(JobSelect::Ids(vec![]), move |_| (vec![job], ())).await.expect("enqueue");
        let claim = Claim {
            queue: "q".into(),
            limit: 1,
            owner: pcmail_core::jobs::LeaseOwner::of(pcmail_core::jobs::Actor::Machine("laptop"), "w1"),
            token_prefix: "secret-".into(),
            now: pcmail_store_now(),
            lease_until: pcmail_store_now() + chrono::TimeDelta::minutes(1),
        };
        let claimed = store.claim_jobs(claim).await.expect("claim");
        let token = claimed[0].lease_token.clone().expect("the claimer's token");
        store.sync_now().await.expect("sync");
        let cells = standin.cells("jobs");
        assert!(cells.len() == 2 && cells[1].iter().any(|c| normalize(c) == "laptop/w1"), "{cells:?}");
        assert!(!cells.iter().flatten().any(|c| normalize(c).contains(&token)), "the token is on the sheet: {cells:?}");
        assert_eq!(store.get_job("job-0001").await.expect("job").and_then(|j| j.lease_token), Some(token), "kept");
    }

    fn pcmail_store_now() -> Ts {
        chrono::DateTime::from_timestamp_millis(1_800_000_000_000).expect("a time")
    }

    #[tokio::test]
    async fn p8_a_pass_changing_1_100_or_10000_ledger_rows_makes_one_read_and_one_write() {
        for n in [1, 100, 10_000] {
            let ((standin, _dir), store) = fresh().await;
            store.stop_background();
            add_rows(&store, n).await;
            store.sync_now().await.expect("sync");
            assert_eq!(sheet_rows(&standin, P_TAB).len(), n as usize);
            standin.reset_calls();
            set_results(&store, "ok").await;
            store.sync_now().await.expect("sync");
            assert_eq!(standin.calls(), ["batchGet", "values.batchUpdate"], "{n} rows changed");
            let result = LEDGER.fields.iter().position(|f| f.key == "result").expect("result");
            assert!(sheet_rows(&standin, P_TAB).iter().all(|r| r[result] == "ok"));
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
        let rows = sheet_rows(&standin, P_TAB);
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
        let stored = standin.cells(P_TAB);
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
        standin.edit(P_TAB, 2, col("state"), json!("不要"));
        standin.edit(P_TAB, 2, col("instruction"), json!("もっと短く"));
        standin.edit(P_TAB, 2, col("run_requested"), json!(true));
        store.sync_now().await.expect("sync");
        let sheet = &sheet_rows(&standin, P_TAB)[0];
        assert_eq!((sheet[col("state")].as_str(), sheet[col("instruction")].as_str()), ("不要", "もっと短く"));
        assert_eq!(sheet[col("result")], "working", "the controller's own cell is written");
        let local = store.ledger_rows(Some("p")).await.expect("rows");
        assert_eq!(
            (local[0].state, local[0].instruction.as_str(), local[0].run_requested),
            (RowState::Dropped, "もっと短く", true)
        );
        let events = store.events_for("ledger/p/T-0001").await.expect("events");
        assert!(events.iter().any(|e| e.reason == pcmail_core::trail::Reason::EditedInSheet), "{events:?}");
    }

    #[tokio::test]
    async fn an_edit_made_between_a_cycles_read_and_its_write_is_kept() {
        let ((standin, _dir), store) = fresh().await;
        store.stop_background();
        add_rows(&store, 1).await;
        store.sync_now().await.expect("sync");
        let col = |key: &str| LEDGER.fields.iter().position(|f| f.key == key).expect("field");
        set_results(&store, "draft ready").await;
        standin.edit_after_next_read(P_TAB, 2, col("state"), json!("完了"));
        standin.edit_after_next_read(P_TAB, 2, col("instruction"), json!("表にして"));
        store.sync_now().await.expect("sync");
        let sheet = &sheet_rows(&standin, P_TAB)[0];
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
        standin.edit(P_TAB, 10, run, json!(false));
        standin.delete_row(P_TAB, 2);
        store.sync_now().await.expect("sync");
        let ids: Vec<String> = sheet_rows(&standin, P_TAB)
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
        add_rows(&store, 1).await;
        store.sync_now().await.expect("sync");
        let col = LEDGER.fields.iter().position(|f| f.key == "instruction").expect("field");
        standin.edit(P_TAB, 1, col, json!("メモ"));
        let err = store.sync_now().await.expect_err("refused").to_string();
        assert!(err.contains("修正指示"), "{err}");
    }
}

/// Issue 23: the spreadsheet looks and behaves like seed 001's ledger.
#[cfg(test)]
mod seed_001_tests {
    use super::super::standin::Standin;
    use super::*;
    use pcmail_core::ledger::{RowState, ViewProject, view_lines};
    use serde_json::json;

    fn col(key: &str) -> usize {
        LEDGER.fields.iter().position(|f| f.key == key).expect("field")
    }

    fn row(project: &str, n: u32, due: &str) -> LedgerRow {
        LedgerRow {
            project: project.into(),
            id: pcmail_core::ledger::row_id(n),
            state: RowState::Todo,
            run_requested: false,
            task: format!("task {n}"),
            content: String::new(),
            source: "csv".into(),
            evidence: String::new(),
            due: due.into(),
            assignee: String::new(),
            function: "f".into(),
            result: String::new(),
            executed_at: None,
            instruction: String::new(),
            key: format!("csv|task{n}"),
            failures: 0,
            refresh: false,
        }
    }

    async fn add(store: &SheetsStore, project: &str, rows: Vec<LedgerRow>) {
        let next = rows.len() as u32 + 1;
        let writes = LedgerWrites { add: rows, next_seq: Some(next), ..Default::default() };
        store.ledger_transaction(project, LedgerSelect::Ids(vec![]), move |_| (writes, ())).await.expect("add");
    }

    async fn open(standin: &Standin, dir: &Path) -> SheetsStore {
        let store = SheetsStore::open(&standin.store_url(""), dir).await.expect("open");
        store.stop_background();
        store
    }

    /// Calls of each kind: seed 000's quota budget is per cycle.
    fn count(calls: &[String], kind: &str) -> usize {
        calls.iter().filter(|c| *c == kind).count()
    }

    #[tokio::test]
    async fn seed_001_appended_rows_get_checkboxes_the_header_is_frozen_and_the_bookkeeping_hidden() {
        let standin = Standin::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        add(&store, "p", (1..=3).map(|n| row("p", n, "")).collect()).await;
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        let calls = standin.calls();
        assert_eq!(
            (count(&calls, "batchUpdate"), count(&calls, "values.batchUpdate"), count(&calls, "append")),
            (1, 1, 1),
            "P8: the new tab, its header and its rows in one call each: {calls:?}"
        );
        let tab = "台帳-p";
        assert_eq!(standin.checkbox_rows(tab, col("run_requested")), [2, 3, 4], "the three appended rows only");
        let (_, columns, frozen) = standin.grid(tab);
        assert_eq!((columns, frozen), (LEDGER.fields.len(), 1), "sized to its columns, the header frozen");
        assert_eq!(standin.hidden_columns(tab), [col("key"), col("failures")], "キー and 失敗回数 hidden");
        assert_eq!(standin.number_format(tab, col("due")), Some(json!({"type": "DATE", "pattern": "yyyy-mm-dd"})));
        add(&store, "p", vec![row("p", 4, "")]).await;
        store.sync_now().await.expect("sync");
        assert_eq!(standin.checkbox_rows(tab, col("run_requested")), [2, 3, 4, 5], "one more appended row");
        // A person ticks the checkbox: the row is asked to run.
        standin.edit(tab, 5, col("run_requested"), json!(true));
        store.sync_now().await.expect("sync");
        let rows = store.ledger_rows(Some("p")).await.expect("rows");
        assert!(rows.iter().find(|r| r.id == "T-0004").is_some_and(|r| r.run_requested), "{rows:?}");
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        assert_eq!(standin.calls(), ["batchGet"], "dressing and checkboxes happen once");
    }

    #[tokio::test]
    async fn seed_001_a_date_typed_as_a_date_or_as_text_reads_as_that_date_and_dates_are_written_as_dates() {
        let standin = Standin::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        add(&store, "p", vec![row("p", 1, ""), row("p", 2, ""), row("p", 3, "2027-01-15")]).await;
        store.sync_now().await.expect("sync");
        let tab = "台帳-p";
        assert_eq!(standin.cells(tab)[3][col("due")], json!(46402), "a due date is written as a date Sheets sorts by");
        standin.type_date(tab, 2, col("due"), "2026-12-24");
        standin.edit(tab, 3, col("due"), json!("2026-12-24"));
        store.sync_now().await.expect("sync");
        let dues: Vec<String> = store.ledger_rows(Some("p")).await.expect("rows").into_iter().map(|r| r.due).collect();
        assert_eq!(dues, ["2026-12-24", "2026-12-24", "2027-01-15"], "never the serial 46380");
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        assert_eq!(standin.calls(), ["batchGet"], "a date read back as a serial is no change to write");
    }

    #[tokio::test]
    async fn seed_001_a_column_added_to_the_layout_grows_the_tab_before_its_header_is_written() {
        let standin = Standin::start().await;
        // An older jobs tab: no `enqueued_by` column, its grid exactly as wide as its header.
        let mut header: Vec<serde_json::Value> =
            header_row(&JOBS, Lang::Ja).into_iter().map(serde_json::Value::String).collect();
        header.pop();
        let width = header.len();
        standin.add_tab("jobs", width, vec![header]);
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        let (_, columns, _) = standin.grid("jobs");
        assert_eq!(columns, width + 1, "grown by the one column the layout added");
        assert_eq!(standin.cells("jobs")[0].get(width), Some(&json!("enqueued_by")));
        let calls = standin.calls();
        let grown = calls.iter().position(|c| c == "batchUpdate").expect("a structural call");
        let written = calls.iter().position(|c| c == "values.batchUpdate").expect("a values write");
        assert!(grown < written, "the grid grows before the write that needs it: {calls:?}");
        drop(store);
    }

    #[tokio::test]
    async fn seed_001_two_projects_get_two_tabs_and_the_shared_tab_is_migrated_once() {
        let standin = Standin::start().await;
        let header: Vec<serde_json::Value> =
            header_row(&LEDGER, Lang::Ja).into_iter().map(serde_json::Value::String).collect();
        let n = names(LEDGER_COLUMNS);
        let cells = |r: &LedgerRow| -> Vec<serde_json::Value> {
            fields(&LEDGER, Lang::Ja, &n, &codec::ledger_params(r)).into_iter().map(serde_json::Value::String).collect()
        };
        let rows = [row("a", 1, ""), row("b", 1, ""), row("a", 2, "")];
        standin.add_tab(SHARED_LEDGER_TITLE, 26, std::iter::once(header).chain(rows.iter().map(cells)).collect());
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        let titles = standin.titles();
        for t in ["台帳-a", "台帳-b", "ledger (migrated)"] {
            assert!(titles.iter().any(|x| x == t), "{t} in {titles:?}");
        }
        assert!(!titles.iter().any(|t| t == SHARED_LEDGER_TITLE), "the shared tab is renamed: {titles:?}");
        let ids = |tab: &str| -> Vec<String> {
            standin.cells(tab).iter().skip(1).map(|r| normalize(&r[col("id")])).collect()
        };
        assert_eq!(
            (ids("台帳-a"), ids("台帳-b")),
            (vec!["T-0001".to_string(), "T-0002".into()], vec!["T-0001".to_string()])
        );
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        assert_eq!(standin.calls(), ["batchGet"], "migrated once: nothing more to write");
        // Reopened from the sheet alone, the rows come from the projects' tabs.
        let again_dir = tempfile::tempdir().expect("tempdir");
        let again = open(&standin, again_dir.path()).await;
        assert_eq!(again.ledger_rows(None).await.expect("rows").len(), 3);
    }

    #[tokio::test]
    async fn seed_001_a_full_grid_grows_for_a_purge_and_an_append_in_one_cycle_and_notes_below_stay() {
        let standin = Standin::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        add(&store, "p", (1..=998).map(|n| row("p", n, "")).collect()).await;
        store.sync_now().await.expect("sync");
        let tab = "台帳-p";
        assert_eq!(standin.grid(tab).0, 1000, "998 rows and the header in a 1000-row tab, one row free");
        // The store purges T-0001 and adds two rows: 999 rows after the delete, 1001 needed.
        store
            .ledger_transaction("p", LedgerSelect::Ids(vec![]), |_| {
                let writes = LedgerWrites {
                    add: vec![row("p", 999, ""), row("p", 1000, "")],
                    delete: vec!["T-0001".into()],
                    next_seq: Some(1001),
                    ..Default::default()
                };
                (writes, ())
            })
            .await
            .expect("purge and add");
        store.sync_now().await.expect("the grid grows after the delete, before the checkboxes");
        let ids: Vec<String> = standin.cells(tab).iter().skip(1).map(|r| normalize(&r[col("id")])).collect();
        assert_eq!(
            (ids.len(), ids.first().map(String::as_str), ids.last().map(String::as_str)),
            (999, Some("T-0002"), Some("T-1000"))
        );
        let boxes = standin.checkbox_rows(tab, col("run_requested"));
        assert_eq!((boxes.len(), boxes.last()), (999, Some(&1000)), "the appended rows 999 and 1000 have theirs");
        // A person's note two rows below the table: new rows go after everything read, never
        // over it (an append into the first blank row would overwrite it once rows outnumber
        // the blank ones).
        standin.edit(tab, 1003, 0, json!("メモ: 来週まとめて確認"));
        add(&store, "p", vec![row("p", 1001, ""), row("p", 1002, ""), row("p", 1003, "")]).await;
        store.sync_now().await.expect("sync");
        let cells = standin.cells(tab);
        assert_eq!(cells[1002][0], json!("メモ: 来週まとめて確認"), "the note stands");
        let ids: Vec<String> = cells[1003..].iter().map(|r| normalize(&r[col("id")])).collect();
        assert_eq!(ids, ["T-1001", "T-1002", "T-1003"]);
        assert_eq!(standin.checkbox_rows(tab, col("run_requested")).last(), Some(&1006));
    }

    #[tokio::test]
    async fn seed_001_text_in_the_date_column_stays_text_and_a_deleted_tab_comes_back_dressed() {
        let standin = Standin::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        add(&store, "p", vec![row("p", 1, "20261224"), row("p", 2, "2026-1-5")]).await;
        store.sync_now().await.expect("sync");
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        assert_eq!(standin.calls(), ["batchGet"], "text read back as written: no edit to adopt, nothing to write");
        let dues: Vec<String> = store.ledger_rows(Some("p")).await.expect("rows").into_iter().map(|r| r.due).collect();
        assert_eq!(dues, ["20261224", "2026-1-5"]);
        // A person deletes the tab: the next cycles find it gone, add it back and dress it again.
        standin.delete_tab("台帳-p");
        let _ = store.sync_now().await;
        store.sync_now().await.expect("the grids are read again after a failed cycle");
        assert_eq!(standin.hidden_columns("台帳-p"), [col("key"), col("failures")]);
        assert_eq!(standin.cells("台帳-p").len(), 3, "the header and both rows");
    }

    #[tokio::test]
    async fn seed_001_migration_picks_a_free_title_and_import_takes_only_a_projects_own_rows() {
        let standin = Standin::start().await;
        let header: Vec<serde_json::Value> =
            header_row(&LEDGER, Lang::Ja).into_iter().map(serde_json::Value::String).collect();
        let n = names(LEDGER_COLUMNS);
        let cells = |r: &LedgerRow| -> Vec<serde_json::Value> {
            fields(&LEDGER, Lang::Ja, &n, &codec::ledger_params(r)).into_iter().map(serde_json::Value::String).collect()
        };
        standin.add_tab("ledger (migrated)", 26, vec![vec![json!("an older migration, kept")]]);
        standin.add_tab(SHARED_LEDGER_TITLE, 26, vec![header.clone(), cells(&row("a", 1, ""))]);
        // A person's copy of project a's rows on another project's tab, and a tab of notes.
        standin.add_tab("台帳-b", 26, vec![header, cells(&row("a", 7, ""))]);
        standin.add_tab("台帳-メモ", 26, vec![vec![json!("自由なメモ")]]);
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        assert!(standin.titles().iter().any(|t| t == "ledger (migrated 2)"), "{:?}", standin.titles());
        let ids: Vec<String> = store
            .ledger_rows(None)
            .await
            .expect("rows")
            .into_iter()
            .map(|r| format!("{}/{}", r.project, r.id))
            .collect();
        assert_eq!(ids, ["a/T-0001"], "a row on another project's tab is a person's, not imported");
    }

    #[tokio::test]
    async fn seed_001_the_view_tab_shows_each_projects_cap_the_more_line_and_colours_overdue_and_review() {
        let standin = Standin::start().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(&standin, dir.path()).await;
        let mut rows: Vec<LedgerRow> = (1..=5).map(|n| row("p", n, &format!("2026-12-{:02}", 10 + n))).collect();
        rows[0].due = "2026-11-01".into();
        rows[1].state = RowState::Review;
        let count_only: Vec<String> = vec![];
        let lines =
            view_lines(&[ViewProject { project: "p", rows: &rows, count_only: &count_only, cap: 3 }], "2026-12-01");
        store.kv_set(LEDGER_VIEW_KEY, &serde_json::to_string(&lines).expect("json")).await.expect("kv");
        standin.reset_calls();
        store.sync_now().await.expect("sync");
        let calls = standin.calls();
        assert!(count(&calls, "batchUpdate") <= 1 && count(&calls, "values.batchUpdate") <= 1, "P8: {calls:?}");
        let view: Vec<Vec<String>> =
            standin.cells("横断ビュー").iter().map(|r| r.iter().map(normalize).collect()).collect();
        assert_eq!(view[0][..3], ["案件", "タスクID", "期限"]);
        assert_eq!(view[1][0], "p");
        assert_eq!((view[2][1].as_str(), view[3][1].as_str(), view[4][1].as_str()), ("T-0001", "T-0002", "T-0003"));
        assert_eq!(view[5][1], "… 他 2 件は案件の台帳で", "the cap says what it left out");
        assert_eq!(view[2][2], "46327", "due as a date serial, the column formatted as dates");
        let colour = |row: usize| standin.background("横断ビュー", row);
        assert_eq!(colour(3), Some(json!({"red": 0.96, "green": 0.8, "blue": 0.8})), "T-0001 is overdue");
        assert_eq!(colour(4), Some(json!({"red": 1.0, "green": 0.95, "blue": 0.7})), "T-0002 waits for review");
        assert_eq!(colour(5), Some(json!({"red": 1.0, "green": 1.0, "blue": 1.0})), "T-0003 plain");
        // A shorter view next morning: what the longer one left is blanked, its colours reset.
        let lines = view_lines(
            &[ViewProject { project: "p", rows: &rows[2..3], count_only: &count_only, cap: 3 }],
            "2026-12-01",
        );
        store.kv_set(LEDGER_VIEW_KEY, &serde_json::to_string(&lines).expect("json")).await.expect("kv");
        store.sync_now().await.expect("sync");
        let view: Vec<Vec<String>> =
            standin.cells("横断ビュー").iter().map(|r| r.iter().map(normalize).collect()).collect();
        let shown: Vec<&Vec<String>> = view.iter().filter(|r| r.iter().any(|c| !c.is_empty())).collect();
        assert_eq!(shown.len(), 3, "header, project, one row: {view:?}");
        assert_eq!(colour(3), Some(json!({"red": 1.0, "green": 1.0, "blue": 1.0})));
    }
}
