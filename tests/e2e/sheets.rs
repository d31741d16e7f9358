//! DESIGN §2 `sheets` end to end: `serve` on a spreadsheet (the local stand-in for Google's
//! API), with a person working in the sheet the way seed 001's users do.

use serde_json::json;

use crate::harness::*;
use crate::ledger::{push, row, runs_of, setup_with};
use crate::standin::Standin;

/// The office project's ledger tab.
const TAB: &str = "台帳-office";

fn column(key: &str) -> usize {
    pcmail_core::sheet::layout::LEDGER.fields.iter().position(|f| f.key == key).expect("ledger field")
}

/// The ledger tab's rows (below the header) as text, in sheet order.
fn sheet_rows(standin: &Standin) -> Vec<Vec<String>> {
    standin.cells(TAB).iter().skip(1).map(|r| r.iter().map(pcmail_core::sheet::cell::normalize).collect()).collect()
}

fn cell(rows: &[Vec<String>], id: &str, key: &str) -> Option<String> {
    rows.iter()
        .find(|r| r.get(column("id")).is_some_and(|v| v == id))
        .map(|r| r.get(column(key)).cloned().unwrap_or_default())
}

#[test]
fn sheets_a_person_ticks_run_and_writes_an_instruction_in_the_sheet_and_sees_the_result_there() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let standin = rt.block_on(Standin::start());
    let url = standin.store_url("");
    let setup = setup_with("30m", &["--store", &url]);
    let s = &setup.s;
    assert_eq!(push(s, "manual", "見積書を送る", "draft")["added"], 1);
    assert_eq!(push(s, "manual", "請求書を作る", "draft")["added"], 1);
    eventually(20, "both rows on the project's tab", || (sheet_rows(&standin).len() == 2).then_some(()));
    let header = standin.cells(TAB).first().cloned().unwrap_or_default();
    assert!(header.contains(&json!("▶AI実行")) && header.contains(&json!("修正指示")), "the ja preset: {header:?}");
    assert_eq!(standin.checkbox_rows(TAB, column("run_requested")), [2, 3], "each pushed row has a checkbox");
    assert_eq!(cell(&sheet_rows(&standin), "T-0001", "state").as_deref(), Some("未着手"));

    // In the spreadsheet: tick ▶AI実行 on T-0002 and write a correction instruction.
    let second = sheet_rows(&standin).iter().position(|r| r[column("id")] == "T-0002").expect("T-0002") + 2;
    standin.edit(TAB, second, column("run_requested"), json!(true));
    standin.edit(TAB, second, column("instruction"), json!("敬語で短く"));
    ok(s.admin(&["ledger", "execute-checked"]));
    assert_eq!(runs_of(&setup.log, "T-0002"), 1, "the ticked row ran, re-read just before its claim");
    assert_eq!(runs_of(&setup.log, "T-0001"), 0);
    let log = std::fs::read_to_string(&setup.log).expect("log");
    assert!(log.contains("=== T-0002 instruction=[敬語で短く]"), "{log}");
    assert_eq!(row(s, "T-0002")["state"], "review");

    eventually(20, "the result on the sheet", || {
        let rows = sheet_rows(&standin);
        (cell(&rows, "T-0002", "state").as_deref() == Some("AI実行済(要確認)")
            && cell(&rows, "T-0002", "result").is_some_and(|r| r.contains("done T-0002")))
        .then_some(())
    });
    let rows = sheet_rows(&standin);
    assert_eq!(cell(&rows, "T-0002", "instruction").as_deref(), Some("敬語で短く"), "a person's cell is theirs");
    assert_eq!(cell(&rows, "T-0002", "run_requested").as_deref(), Some("false"), "the claim unticked it");

    // The rebuild-view role (each minute here) draws the cross-project view on its own tab.
    let schedule = setup._dir.path().join("schedule.yaml");
    std::fs::write(
        &schedule,
        "apiVersion: pcmail/v1\nkind: Schedule\nmetadata: {name: morning}\nspec:\n  timezone: UTC\n  entries:\n  - {role: rebuild-view, cron: \"* * * * *\"}\n",
    )
    .expect("schedule");
    ok(s.admin(&["apply", "-f", &schedule.display().to_string()]));
    let view = eventually(90, "the view tab", || {
        let view: Vec<Vec<String>> = standin
            .cells("横断ビュー")
            .iter()
            .map(|r| r.iter().map(pcmail_core::sheet::cell::normalize).collect())
            .collect();
        (view.len() >= 4).then_some(view)
    });
    assert_eq!(
        (view[1][0].as_str(), view[2][1].as_str(), view[3][1].as_str()),
        ("office", "T-0001", "T-0002"),
        "{view:?}"
    );
    assert_eq!(
        standin.background("横断ビュー", 4),
        Some(json!({"red": 1.0, "green": 0.95, "blue": 0.7})),
        "T-0002 waits for review"
    );

    // Someone renames a column the controller needs: it says so on /readyz, naming it.
    standin.edit(TAB, 1, column("instruction"), json!("メモ"));
    let ready = || {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        rt.block_on(async {
            let r = reqwest::get(format!("{}/readyz", s.url)).await.expect("readyz");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    };
    let (status, body) = eventually(30, "readyz to fail", || Some(ready()).filter(|(code, _)| *code == 503));
    assert_eq!(status, 503);
    assert!(body.contains("修正指示"), "{body}");
}

#[test]
fn x7_a_ledger_applied_with_no_rows_gets_its_tab_with_headers_within_a_cycle() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let standin = rt.block_on(Standin::start());
    let url = standin.store_url("");
    let setup = setup_with("30m", &["--store", &url]);
    let s = &setup.s;
    let ledger = setup._dir.path().join("handwork.yaml");
    std::fs::write(
        &ledger,
        "apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {name: handwork}\nspec:\n  project: handwork\n",
    )
    .expect("ledger");
    ok(s.admin(&["apply", "-f", &ledger.display().to_string()]));
    let header = eventually(30, "the handwork tab with its header", || {
        standin.cells("台帳-handwork").first().cloned().filter(|h| !h.is_empty())
    });
    assert!(header.contains(&json!("▶AI実行")) && header.contains(&json!("修正指示")), "{header:?}");
    assert_eq!(standin.cells("台帳-handwork").len(), 1, "a header and no rows");
}
