//! `ledger …`: the task ledger from the command line (L7, L15, L16).

use pcmail_agent::client::Client;
use pcmail_core::ledger::{Incoming, Row};
use serde_json::{Value, json};

use crate::args::{LedgerCommand, Output};
use crate::output::{self, cut};

fn with_project(mut body: Value, project: &Option<String>) -> Value {
    if let (Some(p), Some(map)) = (project, body.as_object_mut()) {
        map.insert("project".into(), json!(p));
    }
    body
}

fn print_rows(rows: &[Row], out: Output) -> anyhow::Result<()> {
    if output::structured(out, &rows)? {
        return Ok(());
    }
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
    Ok(())
}

pub async fn run(client: &Client, project: Option<String>, command: LedgerCommand) -> anyhow::Result<i32> {
    match command {
        LedgerCommand::List { output } => {
            let query: Vec<(&str, String)> = project.iter().map(|p| ("project", p.clone())).collect();
            let rows: Vec<Row> = client.get("/api/v1/ledger", &query).await?;
            print_rows(&rows, output)?;
        }
        LedgerCommand::View => {
            let v: Value = client.get("/api/v1/ledger/view", &[]).await?;
            print!("{}", v["view"].as_str().unwrap_or_default());
        }
        LedgerCommand::SetRow { id, state, instruction, run, due, assignee, output } => {
            let mut body = json!({"state": state, "instruction": instruction, "due": due, "assignee": assignee});
            if run {
                body["run"] = json!(true);
            }
            let body = with_project(strip_nulls(body), &project);
            // L16: what the store holds after the write, read back.
            let row: Row = client.post(&format!("/api/v1/ledger/rows/{id}"), &body).await?;
            print_rows(&[row], output)?;
        }
        LedgerCommand::Run { id, no_wait, output } => {
            let body = with_project(json!({"wait": !no_wait}), &project);
            let row: Row = client.post(&format!("/api/v1/ledger/rows/{id}/run"), &body).await?;
            print_rows(&[row], output)?;
        }
        LedgerCommand::Push { source, task, content, evidence, due, assignee, function } => {
            let item = Incoming { source, task, content, evidence, due, assignee, function, refresh: false };
            let body = with_project(json!({"items": [item]}), &project);
            // L7: a push never breaks its caller: the answer is always one JSON line, exit 0.
            let answer = match client.post::<_, Value>("/api/v1/ledger/push", &body).await {
                Ok(v) => v,
                Err(e) => json!({"error": e.to_string()}),
            };
            println!("{answer}");
        }
        LedgerCommand::Sync => {
            let report: Value = client.post("/api/v1/ledger/sync", &with_project(json!({}), &project)).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        LedgerCommand::PurgeSource { source, yes } => {
            let body = with_project(json!({"source": source, "yes": yes}), &project);
            let report: Value = client.post("/api/v1/ledger/purge", &body).await?;
            let ids: Vec<&str> = report["delete"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
            if yes {
                println!("deleted {} row(s): {}", ids.len(), ids.join(" "));
            } else {
                println!("would delete {} row(s): {} (dry run; pass --yes to delete)", ids.len(), ids.join(" "));
            }
            for k in report["kept"].as_array().into_iter().flatten() {
                println!("kept {}: {}", k["id"].as_str().unwrap_or_default(), k["reason"].as_str().unwrap_or_default());
            }
        }
        LedgerCommand::ExecuteChecked => {
            let rows: Vec<Row> = client.post("/api/v1/ledger/execute-checked", &json!({})).await?;
            print_rows(&rows, Output::Table)?;
        }
    }
    Ok(0)
}

fn strip_nulls(mut v: Value) -> Value {
    if let Some(map) = v.as_object_mut() {
        map.retain(|_, x| !x.is_null());
    }
    v
}
