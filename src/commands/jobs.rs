//! `jobs …` and `worker` (J7): the job queue from the command line, and an external worker
//! that claims, runs, heartbeats and completes over the API.

use anyhow::Context;
use pcmail_agent::client::{Client, ClientError};
use pcmail_core::api::Validate;
use pcmail_core::api::{ClaimRequest, ClaimResponse, EnqueueRequest, EnqueueResponse, JobList, LeaseReport};
use pcmail_core::duration::Dur;
use pcmail_core::jobs::Job;
use pcmail_core::page::MAX_PAGE;
use pcmail_core::text::sanitize;
use serde_json::Value;

use crate::args::JobsCommand;
use crate::output::{self, cut};

pub async fn run(client: &Client, command: JobsCommand) -> anyhow::Result<i32> {
    match command {
        JobsCommand::Enqueue { file: Some(file), .. } => enqueue_file(client, &file).await?,
        JobsCommand::Enqueue {
            queue,
            function,
            payload,
            priority,
            unique_key,
            unique_for,
            run_after,
            max_attempts,
            file: None,
        } => {
            let payload: Option<Value> = payload
                .map(|p| serde_json::from_str(&p).map_err(|e| anyhow::anyhow!("--payload is not JSON: {e}")))
                .transpose()?;
            let body = EnqueueRequest {
                queue: queue.unwrap_or_default(),
                function: function.unwrap_or_default(),
                payload,
                priority,
                unique_key,
                run_after,
                max_attempts,
                unique_for,
                ledger_ref: None,
            };
            let answer: EnqueueResponse = client.post("/api/v1/jobs", &body).await?;
            println!("{}", answer.job.id);
        }
        JobsCommand::List { queue, state, function, paging, output } => {
            let filters = [("queue", queue), ("state", state), ("function", function)];
            let (jobs, more) = super::pages(
                paging,
                MAX_PAGE,
                |j: &Job| j.id.clone(),
                |after, limit| {
                    let query = super::page_query(&filters, limit, after);
                    async move { client.get::<JobList>("/api/v1/jobs", &query).await.map(|l| (l.jobs, l.more)) }
                },
            )
            .await?;
            output::listing(output::kinds::JOB, &jobs, more, output, |jobs| {
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
            })?;
        }
        JobsCommand::Retry { id } => {
            let job: Job = client.post(&format!("/api/v1/jobs/{id}/retry"), &LeaseReport::default()).await?;
            println!("{} {}", job.id, job.state);
        }
        JobsCommand::Cancel { id } => {
            let job: Job = client.post(&format!("/api/v1/jobs/{id}/cancel"), &LeaseReport::default()).await?;
            println!("{} {}", job.id, job.state);
        }
    }
    Ok(0)
}

/// Requests stay well under the server's body limit whatever the payloads.
const BULK_BYTES: usize = 192 * 1024;

/// `jobs enqueue -f`: every line is parsed and checked before the first request, so a line
/// that is not a valid job (named `FILE:LINE`) sends nothing. Then the jobs go in requests of at
/// most MAX_ENQUEUE jobs, each one transaction; a request the server refuses (a queue no pool
/// declares) stops the command, naming the line, after the requests before it went in.
async fn enqueue_file(client: &Client, file: &str) -> anyhow::Result<()> {
    let bytes = if file == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes).context("reading jobs from stdin")?;
        bytes
    } else {
        std::fs::read(file).with_context(|| format!("reading {file}"))?
    };
    let text = String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{file} is not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()))?;
    // Windows tools start a UTF-8 file with a byte-order mark.
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // (job, its line number, its size as sent)
    let mut requests: Vec<(EnqueueRequest, usize, usize)> = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let job: EnqueueRequest =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!("{file}:{}: not a job: {e}", n + 1))?;
        job.validate().map_err(|e| anyhow::anyhow!("{file}:{}: {e}", n + 1))?;
        let size = serde_json::to_vec(&job)?.len();
        requests.push((job, n + 1, size));
    }
    let (mut created, mut answered) = (0, 0);
    let mut meter = crate::progress::Meter::new("jobs enqueue", "jobs").of(requests.len() as u64);
    let mut rest = requests.as_slice();
    while !rest.is_empty() {
        let mut size = 0;
        let take = rest
            .iter()
            .take(pcmail_core::bounds::MAX_ENQUEUE as usize)
            .take_while(|(_, _, len)| {
                size += len + 1;
                size <= BULK_BYTES
            })
            .count()
            .max(1);
        let (batch, later) = rest.split_at(take);
        rest = later;
        let body: Vec<&EnqueueRequest> = batch.iter().map(|(r, _, _)| r).collect();
        let answers: Vec<EnqueueResponse> = client.post("/api/v1/jobs", &body).await.map_err(|e| {
            let message = e.to_string();
            // `jobs[i]` of this request is a line of the file.
            let line = message
                .split_once("jobs[")
                .and_then(|(_, r)| r.split_once(']'))
                .and_then(|(i, _)| i.parse::<usize>().ok())
                .and_then(|i| batch.get(i))
                .map_or_else(|| format!("lines {}–{}", batch[0].1, batch[batch.len() - 1].1), |j| j.1.to_string());
            anyhow::anyhow!(
                "{file}:{line}: {message} (nothing from line {} on was enqueued; the {} job(s) before it were, \
                 their ids printed above)",
                batch[0].1,
                created + answered
            )
        })?;
        let mut ids = Vec::with_capacity(answers.len());
        for a in answers {
            if a.created {
                created += 1
            } else {
                answered += 1
            }
            ids.push(a.job.id);
        }
        meter.add("sent", ids.len() as u64);
        meter.println(ids);
    }
    let what = format!("{created} job(s) enqueued, {answered} answered by a live job holding the same unique key");
    meter.finish(&what, created + answered, None);
    Ok(())
}

/// J7: claim one job at a time, heartbeat while it runs, report its end. E3: the server going
/// away (a restart, a network cut) is waited out with backoff — claims, heartbeats and reports
/// are repeated — and only a usage or authorization error ends the worker. A report the server
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
        let claimed: ClaimResponse =
            match persist("claim", stopped.clone(), || client.post("/api/v1/jobs/claim", &claim)).await {
                Some(answer) => answer?,
                None => break,
            };
        let Some(job) = claimed.jobs.into_iter().next() else {
            if once {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            continue;
        };
        let token = job.lease_token.clone().unwrap_or_default();
        let beat = {
            let (client, id, token, stopped) = (client.clone(), job.id.clone(), token.clone(), stopped.clone());
            tokio::spawn(async move {
                let every = (lease.to_std() / 3).max(std::time::Duration::from_millis(200));
                let beat = LeaseReport { token, lease: Some(lease), ..Default::default() };
                loop {
                    tokio::time::sleep(every).await;
                    let path = format!("/api/v1/jobs/{id}/heartbeat");
                    match persist("heartbeat", stopped.clone(), || client.post::<_, Job>(&path, &beat)).await {
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            eprintln!("{id}: heartbeat refused ({e}); the job will be rescued");
                            break;
                        }
                        None => break,
                    }
                }
            })
        };
        let outcome = match claimed.functions.get(&job.function) {
            Some(spec) => {
                let vars = [("PCMAIL_JOB_ID", job.id.clone()), ("PCMAIL_QUEUE", job.queue.clone())];
                pcmail_server::exec::run(&job.function, spec, &vars, job.payload.clone())
                    .await
                    .map_err(|e| e.to_string())
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
        let path = format!("/api/v1/jobs/{}/{action}", job.id);
        match persist(action, stopped.clone(), || client.post::<_, Job>(&path, &body)).await {
            Some(Ok(j)) => println!("{} {}", j.id, j.state),
            Some(Err(e)) => eprintln!("{}: {action} not recorded: {e}", job.id),
            None => eprintln!("{}: {action} not recorded: stopped while the server was away", job.id),
        }
        done += 1;
    }
    eprintln!("worker {owner}: {done} job(s) handled");
    Ok(0)
}

/// E3: repeats `call` while it fails the way a server that went away fails (unreachable, 408,
/// 429, 5xx), backing off from 250 ms to 10 s; any other answer is returned as it is. None once
/// the worker is told to stop.
async fn persist<T, F>(
    what: &str,
    mut stopped: tokio::sync::watch::Receiver<bool>,
    mut call: impl FnMut() -> F,
) -> Option<Result<T, ClientError>>
where
    F: std::future::Future<Output = Result<T, ClientError>>,
{
    let mut backoff = std::time::Duration::from_millis(250);
    loop {
        match call().await {
            Err(e) if e.is_transient() => {
                eprintln!("{what}: {e}; trying again in {backoff:?}");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped.changed() => return None,
                }
                backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
            }
            answer => return Some(answer),
        }
        if *stopped.borrow() {
            return None;
        }
    }
}
