//! `jobs …` and `worker` (J7): the job queue from the command line, and an external worker
//! that claims, runs, heartbeats and completes over the API.

use pcmail_agent::client::Client;
use pcmail_core::api::{ClaimRequest, ClaimResponse, EnqueueRequest, EnqueueResponse, LeaseReport};
use pcmail_core::duration::Dur;
use pcmail_core::jobs::Job;
use pcmail_core::text::sanitize;
use serde_json::{Value, json};

use crate::args::JobsCommand;
use crate::output::{self, cut};

pub async fn run(client: &Client, command: JobsCommand) -> anyhow::Result<i32> {
    match command {
        JobsCommand::Enqueue { queue, function, payload, priority, unique_key, run_after, max_attempts } => {
            let payload: Option<Value> = payload
                .map(|p| serde_json::from_str(&p).map_err(|e| anyhow::anyhow!("--payload is not JSON: {e}")))
                .transpose()?;
            let body = EnqueueRequest {
                queue,
                function,
                payload,
                priority,
                unique_key,
                run_after,
                max_attempts,
                ledger_ref: None,
            };
            let answer: EnqueueResponse = client.post("/api/v1/jobs", &body).await?;
            println!("{}", answer.job.id);
        }
        JobsCommand::List { queue, state, output } => {
            let mut query = Vec::new();
            query.extend(queue.map(|q| ("queue", q)));
            query.extend(state.map(|s| ("state", s)));
            let jobs: Vec<Job> = client.get("/api/v1/jobs", &query).await?;
            if !output::structured(output, &jobs)? {
                let rows: Vec<Vec<String>> = jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.id.clone(),
                            j.queue.clone(),
                            j.function.clone(),
                            j.state.to_string(),
                            format!("{}/{}", j.attempts, j.max_attempts),
                            j.rescues.to_string(),
                            cut(j.last_error.as_deref().or(j.result.as_deref()).unwrap_or(""), 50),
                        ]
                    })
                    .collect();
                output::table(&["ID", "QUEUE", "FUNCTION", "STATE", "ATTEMPTS", "RESCUES", "LAST"], &rows);
            }
        }
        JobsCommand::Retry { id } => {
            let job: Job = client.post(&format!("/api/v1/jobs/{id}/retry"), &json!({})).await?;
            println!("{} {}", job.id, job.state);
        }
        JobsCommand::Cancel { id } => {
            let job: Job = client.post(&format!("/api/v1/jobs/{id}/cancel"), &json!({})).await?;
            println!("{} {}", job.id, job.state);
        }
    }
    Ok(0)
}

/// J7: claim one job at a time, heartbeat while it runs, report its end. A report the server
/// refuses (the lease was rescued meanwhile) is printed and the worker goes on.
pub async fn worker(client: &Client, queue: &str, lease: Dur, once: bool) -> anyhow::Result<i32> {
    let owner = format!("worker-{}-{}", std::env::var("HOSTNAME").unwrap_or_else(|_| "pc".into()), std::process::id());
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        stop.send_replace(true);
    });
    let mut done = 0usize;
    while !*stopped.borrow() {
        let claim = ClaimRequest { queue: queue.to_string(), limit: 1, owner: owner.clone(), lease };
        let claimed: ClaimResponse = client.post("/api/v1/jobs/claim", &claim).await?;
        let Some(job) = claimed.jobs.into_iter().next() else {
            if once {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            continue;
        };
        let token = job.lease_token.clone().unwrap_or_default();
        let beat = {
            let (client, id, token) = (client.clone(), job.id.clone(), token.clone());
            tokio::spawn(async move {
                let every = (lease.to_std() / 3).max(std::time::Duration::from_millis(200));
                loop {
                    tokio::time::sleep(every).await;
                    let beat = LeaseReport { token: token.clone(), lease: Some(lease), ..Default::default() };
                    let r: Result<Job, _> = client.post(&format!("/api/v1/jobs/{id}/heartbeat"), &beat).await;
                    if let Err(e) = r {
                        eprintln!("{id}: heartbeat refused ({e}); the job will be rescued");
                        break;
                    }
                }
            })
        };
        let outcome = match claimed.functions.get(&job.function) {
            Some(spec) => {
                let vars = [("PCMAIL_JOB_ID", job.id.clone()), ("PCMAIL_QUEUE", job.queue.clone())];
                pcmail_server::exec::run(&job.function, spec, &vars, job.payload.clone()).await
            }
            None => Err(format!("function {:?} is not defined on the server", job.function)),
        };
        beat.abort();
        // What the function printed is stored as it is, but for what T6 refuses in any text.
        let (action, body) = match &outcome {
            Ok(stdout) => {
                ("complete", LeaseReport { token, result: Some(sanitize(stdout.trim())), ..Default::default() })
            }
            Err(e) => ("fail", LeaseReport { token, error: Some(sanitize(e)), ..Default::default() }),
        };
        match client.post::<_, Job>(&format!("/api/v1/jobs/{}/{action}", job.id), &body).await {
            Ok(j) => println!("{} {}", j.id, j.state),
            Err(e) => eprintln!("{}: {action} not recorded: {e}", job.id),
        }
        done += 1;
    }
    eprintln!("worker {owner}: {done} job(s) handled");
    Ok(0)
}
