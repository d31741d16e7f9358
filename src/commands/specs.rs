//! kubectl-style verbs over the spec objects: apply, diff, get, describe, delete.

use std::path::Path;

use pcmail_core::api::{ApplyRequest, ApplyResult, ManifestFile};
use pcmail_core::manifest::{ApplyOutcome, Kind};
use serde_json::Value;

use crate::args::Output;
use crate::exit::{CliError, Exit};
use crate::output;
use pcmail_agent::client::Client;

fn read(path: &Path) -> anyhow::Result<Vec<ManifestFile>> {
    pcmail_server::manifests::read_path(path).map_err(|e| CliError::new(Exit::Error, e.to_string()).into())
}

fn kind(s: &str) -> anyhow::Result<Kind> {
    Kind::parse_cli(s).map_err(|e| CliError::new(Exit::Error, e.to_string()).into())
}

pub async fn apply(client: &Client, path: &Path, dry_run: bool) -> anyhow::Result<i32> {
    let files = read(path)?;
    let results: Vec<ApplyResult> = client.post("/api/v1/apply", &ApplyRequest { files, dry_run }).await?;
    for r in results {
        println!("{}/{} {}{}", r.kind, r.name, r.outcome, if dry_run { " (dry run)" } else { "" });
    }
    Ok(0)
}

/// Exit 0: nothing would change; 1: something would; >1: error (kubectl's convention).
pub async fn diff(client: &Client, path: &Path) -> anyhow::Result<i32> {
    let outcome: anyhow::Result<Vec<ApplyResult>> = async {
        let files = read(path)?;
        Ok(client.post("/api/v1/diff", &ApplyRequest { files, dry_run: true }).await?)
    }
    .await;
    let results = match outcome {
        Ok(r) => r,
        Err(e) => {
            crate::exit::print(&e);
            return Ok(crate::exit::exit_code(&e).max(2));
        }
    };
    let mut changed = false;
    for r in results.iter().filter(|r| r.outcome != ApplyOutcome::Unchanged) {
        changed = true;
        println!("=== {}/{} (would be {})", r.kind, r.name, r.outcome);
        print!("{}", r.diff);
    }
    Ok(i32::from(changed))
}

pub async fn get(client: &Client, kind_name: &str, name: Option<&str>, out: Output) -> anyhow::Result<i32> {
    let k = kind(kind_name)?;
    if let Some(name) = name {
        let mut object: Value = client.get(&format!("/api/v1/specs/{}/{name}", k.lower()), &[]).await?;
        if let Some(map) = object.as_object_mut() {
            map.remove("events");
        }
        if !output::structured(out, &object)? {
            print_table(&[object]);
        }
        return Ok(0);
    }
    let all: Vec<Value> = client.get("/api/v1/specs", &[]).await?;
    let objects: Vec<Value> = all.into_iter().filter(|o| o["kind"] == k.as_str()).collect();
    // V4: every object of the kind is listed, so `more` is always 0.
    output::listing(&output::kinds::of_spec(k), &objects, 0, out, |objects| {
        if objects.is_empty() {
            eprintln!("no {} objects", k.lower());
        } else {
            print_table(objects);
        }
    })?;
    if matches!(out, Output::Wide) && k == Kind::Roster {
        print_machines(client, &objects).await?;
    }
    Ok(0)
}

/// V1: the Roster's machines with their last poll and client version.
async fn print_machines(client: &Client, rosters: &[Value]) -> anyhow::Result<()> {
    let seen: Vec<pcmail_core::api::MachineSeen> = client.get("/api/v1/machines", &[]).await?;
    let rows: Vec<Vec<String>> = rosters
        .iter()
        .flat_map(|r| r["spec"]["machines"].as_array().cloned().unwrap_or_default())
        .map(|m| {
            let label = m["label"].as_str().unwrap_or_default().to_string();
            let polled = seen.iter().find(|s| s.name == label);
            vec![
                m["number"].to_string(),
                label.clone(),
                m["hostname"].as_str().unwrap_or("").to_string(),
                polled.map_or_else(|| "never".into(), |s| s.last_poll_at.format("%Y-%m-%d %H:%M:%S").to_string()),
                polled.map(|s| s.client.clone()).filter(|c| !c.is_empty()).unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    println!();
    output::table(&["NUMBER", "MACHINE", "HOSTNAME", "LAST POLL", "CLIENT"], &rows);
    Ok(())
}

fn print_table(objects: &[Value]) {
    let rows: Vec<Vec<String>> = objects
        .iter()
        .map(|o| {
            let ready = o["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| {
                    (c["status"].as_str().unwrap_or("-").to_string(), c["reason"].as_str().unwrap_or("").to_string())
                })
                .unwrap_or(("Unknown".into(), String::new()));
            vec![
                o["metadata"]["name"].as_str().unwrap_or("").to_string(),
                o["metadata"]["generation"].to_string(),
                o["status"]["observedGeneration"].to_string(),
                ready.0,
                ready.1,
            ]
        })
        .collect();
    output::table(&["NAME", "GENERATION", "OBSERVED", "READY", "REASON"], &rows);
}

pub async fn describe(client: &Client, kind_name: &str, name: &str, out: Output) -> anyhow::Result<i32> {
    let k = kind(kind_name)?;
    let mut object: Value = client.get(&format!("/api/v1/specs/{}/{name}", k.lower()), &[]).await?;
    if output::structured(out, &object)? {
        return Ok(0);
    }
    let events = object.as_object_mut().and_then(|m| m.remove("events")).unwrap_or_default();
    print!("{}", serde_yaml_ng::to_string(&object)?);
    println!("events:");
    let rows: Vec<Vec<String>> = events
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| {
                    ["at", "reason", "actor", "message"]
                        .iter()
                        .map(|f| e[*f].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .collect()
        })
        .unwrap_or_default();
    if rows.is_empty() {
        println!("  (none)");
    } else {
        output::table(&["AT", "REASON", "BY", "MESSAGE"], &rows);
    }
    Ok(0)
}

pub async fn delete(client: &Client, kind_name: &str, name: &str) -> anyhow::Result<i32> {
    let k = kind(kind_name)?;
    let _: Value = client.delete(&format!("/api/v1/specs/{}/{name}", k.lower())).await?;
    println!("{}/{name} deleted", k.lower());
    Ok(0)
}
