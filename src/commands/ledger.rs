//! `ledger …`: the task ledger from the command line (L7, L15, L16).

use pcmail_agent::client::Client;
use pcmail_core::api::{
    LedgerView, MergeCounts, ProjectBody, PurgeReport, PurgeRequest, PushRequest, RowEdit, RunRequest, SyncReport,
};
use pcmail_core::ledger::{Incoming, Row, RowState};
use pcmail_core::page::MAX_PAGE;
use serde_json::json;

use crate::args::{LedgerCommand, Output};
use crate::exit::Exit;
use crate::output::{self, cut};

/// One row (set-row, run): `-o json|yaml` is the row itself (V4), a one-line table otherwise.
fn print_row(row: &Row, out: Output) -> anyhow::Result<()> {
    if !output::structured(out, row)? {
        rows_table(std::slice::from_ref(row));
    }
    Ok(())
}

fn rows_table(rows: &[Row]) {
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                format!("{} {}", r.state, r.state.ja()),
                if r.run_requested { "▶".into() } else { String::new() },
                cut(&r.task, 40),
                r.due.clone(),
                r.function.clone(),
                r.failures.to_string(),
                cut(&r.result, 40),
            ]
        })
        .collect();
    output::table(&["ID", "STATE", "RUN", "TASK", "DUE", "FUNCTION", "FAILURES", "RESULT"], &table);
}

pub async fn run(client: &Client, project: Option<String>, command: LedgerCommand) -> anyhow::Result<i32> {
    match command {
        LedgerCommand::List { state, function, assignee, paging, output } => {
            let filters = [("project", project), ("state", state), ("function", function), ("machine", assignee)];
            let (rows, more) = super::pages(
                paging,
                MAX_PAGE,
                |r: &Row| r.id.clone(),
                |after, limit| {
                    let query = super::page_query(&filters, limit, after);
                    async move { client.get_page::<Row>("/api/v1/ledger", &query).await }
                },
            )
            .await?;
            output::listing(output::kinds::LEDGER_ROW, &rows, more, output, rows_table)?;
        }
        LedgerCommand::View => {
            let v: LedgerView = client.get("/api/v1/ledger/view", &[]).await?;
            print!("{}", v.view);
        }
        LedgerCommand::SetRow { id, state, instruction, run, due, assignee, output } => {
            let body = RowEdit { project, state, instruction, run: run.then_some(true), due, assignee };
            // L16: what the store holds after the write, read back.
            let row: Row = client.post(&format!("/api/v1/ledger/rows/{id}"), &body).await?;
            print_row(&row, output)?;
        }
        LedgerCommand::Run { id, no_wait, output } => {
            let body = RunRequest { project, wait: !no_wait };
            let row: Row = client.post(&format!("/api/v1/ledger/rows/{id}/run"), &body).await?;
            print_row(&row, output)?;
            // A run that was waited for and failed went back to todo (or to a person) with its
            // failure counted: the command fails too, so a script notices.
            if !no_wait && matches!(row.state, RowState::Todo | RowState::NeedsHuman) && row.failures > 0 {
                eprintln!("{id}: the run failed: {}", row.result);
                return Ok(Exit::Error as i32);
            }
        }
        LedgerCommand::Push { source, task, content, evidence, due, assignee, function } => {
            let item = Incoming { source, task, content, evidence, due, assignee, function, refresh: false };
            let body = PushRequest { project, items: vec![item] };
            // L7: a push never breaks its caller: the answer is always one JSON line, exit 0 —
            // but a push refused for good (T11, not this machine's source) exits 6, so the one
            // who set it up notices.
            let (answer, exit) = match client.post::<_, MergeCounts>("/api/v1/ledger/push", &body).await {
                Ok(counts) => (serde_json::to_value(counts)?, 0),
                Err(e) if e.status() == Some(403) => (json!({"error": e.to_string()}), Exit::Unauthorized as i32),
                Err(e) => (json!({"error": e.to_string()}), 0),
            };
            println!("{answer}");
            return Ok(exit);
        }
        LedgerCommand::Sync => sync(client, project).await?,
        LedgerCommand::PurgeSource { source, yes } => {
            let report: PurgeReport =
                client.post("/api/v1/ledger/purge", &PurgeRequest { project, source, yes }).await?;
            let ids = report.delete.join(" ");
            if yes {
                println!("deleted {} row(s): {ids}", report.delete.len());
            } else {
                println!("would delete {} row(s): {ids} (dry run; pass --yes to delete)", report.delete.len());
            }
            for k in report.kept {
                println!("kept {}: {}", k.id, k.reason);
            }
        }
        LedgerCommand::ExecuteChecked => {
            let rows: Vec<Row> = client.post("/api/v1/ledger/execute-checked", &json!({})).await?;
            rows_table(&rows);
        }
    }
    Ok(0)
}

/// `ledger sync`: the report alone on stdout (JSON); on stderr the wait on a terminal and the
/// summary line (X4).
async fn sync(client: &Client, project: Option<String>) -> anyhow::Result<()> {
    let mut meter = crate::progress::Meter::new("ledger sync", "items");
    let body = ProjectBody { project };
    let report: SyncReport = meter.wait("merging the sources", client.post("/api/v1/ledger/sync", &body)).await?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    let c = &report.counts;
    let unread = match report.errors.len() {
        0 => String::new(),
        n => format!(", {n} source(s) not read"),
    };
    let what = format!("{}: {} added, {} updated, {} skipped{unread}", report.project, c.added, c.updated, c.skipped);
    meter.finish(&what, (c.added + c.updated + c.skipped) as u64, None);
    Ok(())
}
