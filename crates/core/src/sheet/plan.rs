//! One sync cycle of one tab: what the controller writes, appends and deletes, and which of
//! people's edits it takes in, from three views of every row:
//!
//! - `sheet`: the tab as read at the start of this cycle (normalized cells by sheet column);
//! - `base`: each row's fields as they were on the sheet after the last cycle;
//! - `ours`: each row's fields as the store holds them now, in the order new rows are appended.
//!
//! A field that changed on the sheet since `base` was changed by a person: in a field people
//! edit, their value is kept and taken into the store; the controller writes only fields that
//! differ from the sheet and that nobody touched. Writes are only the changed cells, grouped in
//! contiguous runs, so a cell someone edits between this read and the write is never written
//! over with a stale value of ours (P8, seed 001 §6).

use std::collections::{BTreeMap, BTreeSet};

use super::layout::Tab;

/// A row's fields in `Tab::fields` order, normalized.
pub type Fields = Vec<String>;

/// Consecutive cells of one sheet row written in one range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellRun {
    /// 1-based sheet row.
    pub row: usize,
    /// 0-based sheet column of the first cell.
    pub first_column: usize,
    pub values: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncPlan {
    pub updates: Vec<CellRun>,
    /// New rows, each as cells by sheet column (empty where the tab has people's own columns).
    pub appends: Vec<Vec<String>>,
    /// 1-based inclusive spans of sheet rows to delete, bottom-up.
    pub deletes: Vec<(usize, usize)>,
    /// People's edits to take into the store: (row key, field index, value).
    pub adopt: Vec<(String, usize, String)>,
    /// `base` after this plan is applied: every row the controller keeps on the sheet.
    pub synced: BTreeMap<String, Fields>,
}

impl SyncPlan {
    pub fn writes_nothing(&self) -> bool {
        self.updates.is_empty() && self.appends.is_empty() && self.deletes.is_empty()
    }
}

/// The key of a row from its fields (the `Tab::key` fields joined), `None` for a row without
/// one (L17: a sheet's empty lines are not rows).
pub fn row_key(tab: &Tab, fields: &[String]) -> Option<String> {
    let parts: Vec<&str> = tab
        .key
        .iter()
        .filter_map(|k| tab.fields.iter().position(|f| f.key == *k))
        .map(|i| fields.get(i).map_or("", |s| s.trim()))
        .collect();
    if parts.iter().any(|p| p.is_empty()) { None } else { Some(parts.join("\u{1f}")) }
}

/// The fields of a sheet row, read through `columns` (the field → sheet column map).
pub fn fields_of(cells: &[String], columns: &[usize]) -> Fields {
    columns.iter().map(|&c| cells.get(c).cloned().unwrap_or_default()).collect()
}

pub fn plan_sync(
    tab: &Tab,
    columns: &[usize],
    sheet: &[Vec<String>],
    base: &BTreeMap<String, Fields>,
    ours: &[(String, Fields)],
) -> SyncPlan {
    let mut plan = SyncPlan::default();
    let by_key: std::collections::HashMap<&str, &Fields> = ours.iter().map(|(k, f)| (k.as_str(), f)).collect();
    let mut on_sheet: BTreeSet<String> = BTreeSet::new();
    let mut changed: BTreeMap<usize, BTreeMap<usize, String>> = BTreeMap::new();
    let mut gone: Vec<usize> = Vec::new();
    for (i, cells) in sheet.iter().enumerate() {
        let row = i + 2; // row 1 is the header
        let theirs = fields_of(cells, columns);
        let Some(key) = row_key(tab, &theirs) else { continue };
        // A duplicated key: the first row is the row; later copies are left alone.
        if !on_sheet.insert(key.clone()) {
            continue;
        }
        match by_key.get(key.as_str()) {
            Some(mine) => {
                let before = base.get(&key).unwrap_or(&theirs);
                let mut synced = theirs.clone();
                for (f, field) in tab.fields.iter().enumerate() {
                    let (t, b, o) =
                        (&theirs[f], before.get(f).unwrap_or(&theirs[f]), mine.get(f).cloned().unwrap_or_default());
                    if *t == o {
                        continue;
                    }
                    if t != b && field.editable {
                        plan.adopt.push((key.clone(), f, t.clone()));
                    } else {
                        changed.entry(row).or_default().insert(columns[f], o.clone());
                        synced[f] = o;
                    }
                }
                plan.synced.insert(key, synced);
            }
            // The store deleted it (purge): the sheet row goes too. A row the controller
            // never wrote is a person's own and is left alone.
            None if base.contains_key(&key) => gone.push(row),
            None => {}
        }
    }
    let width = columns.iter().max().map_or(0, |m| m + 1);
    for (key, mine) in ours {
        if on_sheet.contains(key.as_str()) {
            continue;
        }
        // New, or deleted from the sheet by hand: appended, so nothing the store holds is lost.
        let mut cells = vec![String::new(); width];
        for (f, &c) in columns.iter().enumerate() {
            cells[c] = mine.get(f).cloned().unwrap_or_default();
        }
        plan.appends.push(cells);
        plan.synced.insert(key.clone(), mine.clone());
    }
    for (row, cells) in changed {
        let mut run: Option<CellRun> = None;
        for (column, value) in cells {
            match &mut run {
                Some(r) if r.first_column + r.values.len() == column => r.values.push(value),
                _ => {
                    plan.updates.extend(run.take());
                    run = Some(CellRun { row, first_column: column, values: vec![value] });
                }
            }
        }
        plan.updates.extend(run);
    }
    gone.sort_unstable_by(|a, b| b.cmp(a));
    for row in gone {
        match plan.deletes.last_mut() {
            Some((start, _)) if *start == row + 1 => *start = row,
            _ => plan.deletes.push((row, row)),
        }
    }
    plan
}

/// Where sheet row `row` (1-based) is once the `deletes` (1-based inclusive spans, any order) are
/// gone: the structural changes of a cycle go first, so its value writes address rows after them.
pub fn row_after_deletes(row: usize, deletes: &[(usize, usize)]) -> usize {
    let above: usize = deletes.iter().filter(|(_, last)| *last < row).map(|(first, last)| last - first + 1).sum();
    row - above
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sheet::layout::{LEDGER, Lang, header_row, locate};

    fn columns() -> Vec<usize> {
        locate(&LEDGER, &header_row(&LEDGER, Lang::Ja)).expect("layout")
    }

    fn f(name: &str) -> usize {
        LEDGER.fields.iter().position(|x| x.key == name).expect("field")
    }

    /// A ledger row's fields with `id`, state 未着手 and task `task`.
    fn row(id: &str, task: &str) -> Fields {
        let mut v = vec![String::new(); LEDGER.fields.len()];
        v[f("project")] = "p".into();
        v[f("id")] = id.into();
        v[f("state")] = "未着手".into();
        v[f("run_requested")] = "false".into();
        v[f("task")] = task.into();
        v
    }

    #[test]
    fn p8_rows_below_deleted_spans_move_up_by_the_rows_deleted_above_them() {
        let deletes = [(9, 10), (4, 4)];
        assert_eq!(row_after_deletes(3, &deletes), 3);
        assert_eq!(row_after_deletes(5, &deletes), 4);
        assert_eq!(row_after_deletes(11, &deletes), 8);
    }

    fn key(id: &str) -> String {
        format!("p\u{1f}{id}")
    }

    fn by_key(rows: &[Fields]) -> BTreeMap<String, Fields> {
        rows.iter().map(|r| (row_key(&LEDGER, r).expect("key"), r.clone())).collect()
    }

    fn ordered(rows: &BTreeMap<String, Fields>) -> Vec<(String, Fields)> {
        rows.iter().map(|(k, f)| (k.clone(), f.clone())).collect()
    }

    #[test]
    fn p8_writes_only_changed_cells_in_contiguous_runs() {
        let sheet = vec![row("T-0001", "a"), row("T-0002", "b"), row("T-0003", "c")];
        let base = by_key(&sheet);
        let mut ours = base.clone();
        let two = ours.get_mut(&key("T-0002")).expect("row");
        two[f("result")] = "done".into();
        two[f("executed_at")] = "2026-11-30T00:00:00Z".into();
        two[f("failures")] = "1".into();
        let plan = plan_sync(&LEDGER, &columns(), &sheet, &base, &ordered(&ours));
        assert_eq!(
            plan.updates,
            vec![
                CellRun {
                    row: 3,
                    first_column: f("result"),
                    values: vec!["done".into(), "2026-11-30T00:00:00Z".into()]
                },
                CellRun { row: 3, first_column: f("failures"), values: vec!["1".into()] },
            ],
            "instruction and key, between them, untouched"
        );
        assert!(plan.appends.is_empty() && plan.deletes.is_empty() && plan.adopt.is_empty());
        assert_eq!(plan.synced, ours);
    }

    #[test]
    fn a_persons_edit_between_read_and_write_is_kept_and_taken_in() {
        let before = vec![row("T-0001", "a")];
        let base = by_key(&before);
        // The controller claimed the row (running) while a person set 不要 and wrote an instruction.
        let mut ours = base.clone();
        ours.get_mut(&key("T-0001")).expect("row")[f("state")] = "実行中".into();
        let mut sheet = before.clone();
        sheet[0][f("state")] = "不要".into();
        sheet[0][f("instruction")] = "もっと短く".into();
        let plan = plan_sync(&LEDGER, &columns(), &sheet, &base, &ordered(&ours));
        assert!(plan.updates.is_empty(), "nothing of theirs is overwritten: {:?}", plan.updates);
        assert_eq!(
            plan.adopt,
            vec![(key("T-0001"), f("state"), "不要".into()), (key("T-0001"), f("instruction"), "もっと短く".into())]
        );
        assert_eq!(plan.synced[&key("T-0001")][f("state")], "不要");
    }

    #[test]
    fn a_persons_edit_to_a_controller_field_is_overwritten() {
        let before = vec![row("T-0001", "a")];
        let base = by_key(&before);
        let mut sheet = before.clone();
        sheet[0][f("failures")] = "0 (reset by hand)".into();
        let plan = plan_sync(&LEDGER, &columns(), &sheet, &base, &ordered(&base));
        assert_eq!(plan.updates, vec![CellRun { row: 2, first_column: f("failures"), values: vec![String::new()] }]);
    }

    #[test]
    fn l17_rows_without_an_id_and_peoples_own_rows_are_left_alone() {
        let mut blank = row("", "");
        blank[f("run_requested")] = "false".into();
        let theirs = row("T-0099", "a row a person typed");
        let sheet = vec![row("T-0001", "a"), blank, theirs];
        let base = by_key(&sheet[..1]);
        let plan = plan_sync(&LEDGER, &columns(), &sheet, &base, &ordered(&base));
        assert!(plan.writes_nothing(), "{plan:?}");
        assert!(!plan.synced.contains_key(&key("T-0099")));
    }

    #[test]
    fn new_rows_are_appended_and_purged_rows_deleted_bottom_up_in_spans() {
        let sheet: Vec<Fields> = (1..=6).map(|n| row(&format!("T-{n:04}"), "t")).collect();
        let base = by_key(&sheet);
        let mut ours = base.clone();
        for gone in ["T-0002", "T-0003", "T-0005"] {
            ours.remove(&key(gone));
        }
        ours.insert(key("T-0007"), row("T-0007", "new"));
        let plan = plan_sync(&LEDGER, &columns(), &sheet, &base, &ordered(&ours));
        assert_eq!(plan.deletes, vec![(6, 6), (3, 4)], "sheet rows of T-0005, then T-0002..T-0003");
        assert_eq!(plan.appends.len(), 1);
        assert_eq!(plan.appends[0][columns()[f("task")]], "new");
        assert!(plan.updates.is_empty());
        assert_eq!(plan.synced.len(), 4);
    }

    #[test]
    fn a_row_deleted_by_hand_is_appended_again_so_nothing_is_lost() {
        let sheet = vec![row("T-0001", "a"), row("T-0002", "b")];
        let base = by_key(&sheet);
        let plan = plan_sync(&LEDGER, &columns(), &sheet[..1], &base, &ordered(&base));
        assert_eq!(plan.appends.len(), 1);
        assert_eq!(plan.appends[0][columns()[f("id")]], "T-0002");
    }

    #[test]
    fn p8_the_plan_is_one_shape_whatever_the_number_of_changed_rows() {
        for n in [1usize, 100, 10_000] {
            let sheet: Vec<Fields> = (1..=n).map(|i| row(&format!("T-{i:05}"), "t")).collect();
            let base = by_key(&sheet);
            let mut ours = base.clone();
            for r in ours.values_mut() {
                r[f("result")] = "ok".into();
            }
            let plan = plan_sync(&LEDGER, &columns(), &sheet, &base, &ordered(&ours));
            assert_eq!(plan.updates.len(), n, "one run per changed row, all in one batch");
            assert!(plan.updates.iter().all(|u| u.values == ["ok"]));
        }
    }
}
