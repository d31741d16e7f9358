//! P6: merge_plan over 100k existing rows × 100k incoming items. Half the items match existing
//! rows (some fill cells, some change nothing), half are new.

use std::time::{Duration, Instant};

use pcmail_core::ledger::{Incoming, Row, RowState, dedup_key, merge_plan, row_id};

use crate::table::{Row as TableRow, percentile};

pub fn run() -> Vec<TableRow> {
    let n = 100_000u32;
    let existing: Vec<Row> = (1..=n)
        .map(|i| {
            let task = format!("タスク　{i}（案件Ａ）");
            Row {
                project: "p".into(),
                id: row_id(i),
                state: [RowState::Todo, RowState::Review, RowState::Done][i as usize % 3],
                run_requested: false,
                task: task.clone(),
                content: if i % 2 == 0 { String::new() } else { "内容".into() },
                source: format!("source{}", i % 10),
                evidence: String::new(),
                due: String::new(),
                assignee: String::new(),
                function: String::new(),
                result: String::new(),
                executed_at: None,
                instruction: String::new(),
                key: dedup_key(&format!("source{}", i % 10), &task),
                failures: 0,
                refresh: false,
            }
        })
        .collect();
    let incoming: Vec<Incoming> = (n / 2..n + n / 2)
        .map(|i| Incoming {
            source: format!("source{}", i % 10),
            task: format!("タスク {i}(案件A)"),
            content: "同期された内容".into(),
            due: "2026-12-31".into(),
            ..Incoming::default()
        })
        .collect();
    let mut times = Vec::new();
    let mut plan = None;
    for _ in 0..5 {
        let t = Instant::now();
        plan = Some(merge_plan("p", &existing, &incoming, n + 1));
        times.push(t.elapsed());
    }
    let plan = plan.unwrap_or_default();
    eprintln!("P6 plan: {} added, {} updated, {} skipped", plan.add.len(), plan.update.len(), plan.skipped);
    vec![TableRow::time(
        "P6",
        "merge_plan 100k existing × 100k incoming, median of 5",
        percentile(&mut times, 0.5),
        Duration::from_secs(1),
    )]
}
