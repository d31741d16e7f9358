//! L4–L7: merging items from sources into a ledger, without ever losing what people wrote.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Row, RowState, dedup_key, row_id};

/// One item from a source (pull) or a push.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Incoming {
    /// Empty in a machine's push: its own source (T11).
    #[serde(default)]
    pub source: String,
    pub task: String,
    #[serde(default)]
    pub content: String,
    #[serde(default)]
    pub evidence: String,
    #[serde(default)]
    pub due: String,
    #[serde(default)]
    pub assignee: String,
    #[serde(default)]
    pub function: String,
    /// Aggregate items: content and evidence overwrite the row's on every sync.
    #[serde(default)]
    pub refresh: bool,
}

impl crate::validate::Validate for Incoming {
    /// T6: one-line cells stay one line, and no cell carries NUL or a bidirectional override.
    fn validate(&self) -> Result<(), crate::validate::Invalid> {
        use crate::validate::{line, text};
        line("source", &self.source, 200)?;
        line("task", &self.task, 1000)?;
        text("content", &self.content)?;
        text("evidence", &self.evidence)?;
        line("due", &self.due, 100)?;
        line("assignee", &self.assignee, 200)?;
        if !self.function.is_empty() {
            crate::validate::name("function", &self.function)?;
        }
        Ok(())
    }
}

/// The cells a merge may write on an existing row. Instruction, result, failures, state and
/// runRequested are not here: a merge cannot express a write to them (L5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RowPatch {
    pub id: String,
    pub content: Option<String>,
    pub evidence: Option<String>,
    pub due: Option<String>,
    pub assignee: Option<String>,
    pub function: Option<String>,
}

impl RowPatch {
    fn is_empty(&self) -> bool {
        self.content.is_none()
            && self.evidence.is_none()
            && self.due.is_none()
            && self.assignee.is_none()
            && self.function.is_none()
    }

    /// What the patch writes, for the row's history: each field with its new text (cut).
    pub fn describe(&self) -> String {
        let fields = [
            ("content", &self.content),
            ("evidence", &self.evidence),
            ("due", &self.due),
            ("assignee", &self.assignee),
            ("function", &self.function),
        ];
        let changed: Vec<String> = fields
            .into_iter()
            .filter_map(|(name, v)| Some(format!("{name} = {:?}", crate::present::cut(v.as_deref()?, 200))))
            .collect();
        changed.join(", ")
    }

    /// Applies the patch to a row (the store's write, shared so adapters agree).
    pub fn apply(&self, row: &mut Row) {
        let set = |cell: &mut String, v: &Option<String>| {
            if let Some(v) = v {
                cell.clone_from(v);
            }
        };
        set(&mut row.content, &self.content);
        set(&mut row.evidence, &self.evidence);
        set(&mut row.due, &self.due);
        set(&mut row.assignee, &self.assignee);
        set(&mut row.function, &self.function);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergePlan {
    pub add: Vec<Row>,
    pub update: Vec<RowPatch>,
    pub skipped: usize,
    /// The project's next id number after this plan (L1: ids are never reused).
    pub next_seq: u32,
}

/// L5: never deletes; never touches done/dropped/needs-human rows; fills only empty cells of
/// open rows, except that refresh rows take new content and evidence; the first of duplicate
/// keys wins. Running it again on the same input adds and updates nothing.
pub fn merge_plan(project: &str, existing: &[Row], incoming: &[Incoming], next_seq: u32) -> MergePlan {
    let by_key: BTreeMap<&str, &Row> = existing.iter().map(|r| (r.key.as_str(), r)).collect();
    let mut plan = MergePlan { next_seq, ..MergePlan::default() };
    let mut seen = BTreeSet::new();
    for item in incoming {
        let key = dedup_key(&item.source, &item.task);
        if item.task.trim().is_empty() || !seen.insert(key.clone()) {
            plan.skipped += 1;
            continue;
        }
        let Some(row) = by_key.get(key.as_str()) else {
            plan.add.push(Row {
                project: project.to_string(),
                id: row_id(plan.next_seq),
                state: RowState::Todo,
                run_requested: false,
                task: item.task.clone(),
                content: item.content.clone(),
                source: item.source.clone(),
                evidence: item.evidence.clone(),
                due: item.due.clone(),
                assignee: item.assignee.clone(),
                function: item.function.clone(),
                result: String::new(),
                executed_at: None,
                instruction: String::new(),
                key,
                failures: 0,
                refresh: item.refresh,
            });
            plan.next_seq += 1;
            continue;
        };
        if row.state.is_closed() {
            plan.skipped += 1;
            continue;
        }
        let fill = |cell: &str, new: &str| (cell.is_empty() && !new.is_empty()).then(|| new.to_string());
        let overwrite = |cell: &str, new: &str| (cell != new).then(|| new.to_string());
        let refresh = row.refresh || item.refresh;
        let patch = RowPatch {
            id: row.id.clone(),
            content: if refresh { overwrite(&row.content, &item.content) } else { fill(&row.content, &item.content) },
            evidence: if refresh {
                overwrite(&row.evidence, &item.evidence)
            } else {
                fill(&row.evidence, &item.evidence)
            },
            due: fill(&row.due, &item.due),
            assignee: fill(&row.assignee, &item.assignee),
            function: fill(&row.function, &item.function),
        };
        if patch.is_empty() {
            plan.skipped += 1;
        } else {
            plan.update.push(patch);
        }
    }
    plan
}

/// L6: a noisy source becomes one row whose content carries the count, refreshed each sync.
pub fn aggregate(source: &str, title: &str, count: usize, evidence: &str) -> Incoming {
    Incoming {
        source: source.to_string(),
        task: title.to_string(),
        content: format!("{count} open item(s) in {source}"),
        evidence: evidence.to_string(),
        refresh: true,
        ..Incoming::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::row;
    use super::*;

    fn item(source: &str, task: &str, content: &str) -> Incoming {
        Incoming { source: source.into(), task: task.into(), content: content.into(), ..Default::default() }
    }

    /// Applies a plan the way a store does, for idempotency checks.
    fn apply(existing: &[Row], plan: &MergePlan) -> Vec<Row> {
        let mut rows = existing.to_vec();
        for p in &plan.update {
            if let Some(r) = rows.iter_mut().find(|r| r.id == p.id) {
                p.apply(r);
            }
        }
        rows.extend(plan.add.iter().cloned());
        rows
    }

    #[test]
    fn l5_the_second_identical_merge_adds_and_updates_nothing() {
        let incoming = vec![item("s", "a", "x"), item("s", "b", "")];
        let first = merge_plan("p", &[], &incoming, 1);
        assert_eq!((first.add.len(), first.next_seq), (2, 3));
        let rows = apply(&[], &first);
        let second = merge_plan("p", &rows, &incoming, first.next_seq);
        assert_eq!((second.add.len(), second.update.len(), second.skipped), (0, 0, 2));
    }

    #[test]
    fn l5_closed_rows_never_appear_in_a_patch() {
        let rows: Vec<Row> = [RowState::Done, RowState::Dropped, RowState::NeedsHuman]
            .iter()
            .enumerate()
            .map(|(i, s)| row(i as u32 + 1, "s", &format!("t{i}"), *s))
            .collect();
        let incoming: Vec<Incoming> = (0..3).map(|i| item("s", &format!("t{i}"), "new content")).collect();
        let plan = merge_plan("p", &rows, &incoming, 4);
        assert!(plan.update.is_empty() && plan.add.is_empty());
        assert_eq!(plan.skipped, 3);
    }

    #[test]
    fn l5_open_rows_get_only_empty_cells_filled() {
        let mut r = row(1, "s", "a", RowState::Todo);
        r.content = "written by a person".into();
        let incoming = vec![Incoming { due: "2026-12-01".into(), ..item("s", "a", "from the source") }];
        let plan = merge_plan("p", &[r], &incoming, 2);
        assert_eq!(
            plan.update,
            vec![RowPatch { id: "T-0001".into(), due: Some("2026-12-01".into()), ..Default::default() }]
        );
    }

    #[test]
    fn l5_instruction_result_and_failures_never_appear_in_a_patch() {
        let mut r = row(1, "s", "a", RowState::Review);
        r.instruction = "use the new template".into();
        r.result = "draft v1".into();
        r.failures = 2;
        let plan = merge_plan("p", std::slice::from_ref(&r), &[item("s", "a", "c")], 2);
        let mut after = r.clone();
        for p in &plan.update {
            p.apply(&mut after);
        }
        assert_eq!(
            (after.instruction, after.result, after.failures, after.state),
            (r.instruction, r.result, r.failures, r.state)
        );
    }

    #[test]
    fn l5_the_first_of_duplicate_keys_wins() {
        let plan = merge_plan("p", &[], &[item("s", "Task A", "first"), item("s", "task  a!", "second")], 1);
        assert_eq!(plan.add.len(), 1);
        assert_eq!((plan.add[0].content.as_str(), plan.skipped), ("first", 1));
    }

    #[test]
    fn l5_rows_are_never_deleted_when_a_source_drops_them() {
        let rows = vec![row(1, "s", "a", RowState::Todo), row(2, "s", "b", RowState::Todo)];
        let plan = merge_plan("p", &rows, &[item("s", "a", "")], 3);
        assert_eq!(apply(&rows, &plan).len(), 2);
    }

    #[test]
    fn l6_aggregate_rows_carry_the_count_and_refresh_content_and_evidence() {
        let first =
            merge_plan("p", &[], &[aggregate("questions", "Get the open questions answered", 376, "sheet!A1")], 1);
        assert!(first.add[0].refresh && first.add[0].content.contains("376"));
        let rows = first.add.clone();
        let second =
            merge_plan("p", &rows, &[aggregate("questions", "Get the open questions answered", 12, "sheet!A1")], 2);
        assert_eq!(second.update[0].content.as_deref(), Some("12 open item(s) in questions"));
        assert_eq!(second.update[0].evidence, None, "unchanged evidence is not rewritten");
    }

    #[test]
    fn l1_new_rows_count_up_from_the_stored_next_number() {
        let plan = merge_plan("p", &[], &[item("s", "a", ""), item("s", "b", "")], 41);
        assert_eq!(plan.add.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["T-0041", "T-0042"]);
        assert_eq!(plan.next_seq, 43);
    }
}
