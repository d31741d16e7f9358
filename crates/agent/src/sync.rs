//! The poller: the only part of the PC side that talks to the server. One cycle flushes the
//! queued calls (A4), refreshes the intent policy the hooks use, and long-polls for mail (M11)
//! into the cache. `agent` repeats cycles; `poll` runs one.

use std::path::Path;
use std::time::Duration;

use pcmail_core::agent::{CallOutcome, NextStep, QueuedCall, after_call, call_outcome};
use pcmail_core::api::{PollResponse, RefusedCall, WhoAmI};
use pcmail_core::mail::Mail;
use pcmail_core::manifest::spec::IntentPolicySpec;
use pcmail_core::present::cut;
use tokio::sync::watch;

use crate::cache::{Cache, CacheError, MergeReport, Pending};
use crate::client::{Client, ClientError};

/// The poller's writes wait this long at most for a hook's write.
pub const POLLER_BUSY: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Cache(#[from] CacheError),
}

#[derive(Debug, Default)]
pub struct CycleReport {
    pub machine: String,
    pub merged: MergeReport,
    pub mail: Vec<Mail>,
    pub sent: usize,
    pub waiting: usize,
}

fn outcome(action: QueuedCall, result: &Result<serde_json::Value, ClientError>) -> CallOutcome {
    let answer = match result {
        Ok(_) => Ok(()),
        Err(ClientError::Api { status, message, .. }) => Err((Some(*status), message.as_str())),
        Err(_) => Err((None, "")),
    };
    call_outcome(action, answer)
}

async fn call(client: &Client, p: &Pending) -> Result<serde_json::Value, ClientError> {
    match p.action {
        QueuedCall::Intent => client.post("/api/v1/intents", &p.body).await,
        step => client.post(&format!("/api/v1/mail/{}/{step}", p.target), &p.body).await,
    }
}

/// Sends every due queued call once, then tells the server of calls it refused (T10);
/// answers (sent, still waiting).
pub async fn flush(client: &Client, home: &Path) -> Result<(usize, usize), SyncError> {
    let due = Cache::open(home, POLLER_BUSY)?.due_pending(crate::now())?;
    let mut sent = 0;
    for p in &due {
        let result = call(client, p).await;
        let outcome = outcome(p.action, &result);
        let now = crate::now();
        let next = after_call(&outcome, p.unknown_tries, now);
        let unknown = p.unknown_tries + u32::from(outcome == CallOutcome::Unknown);
        let error = result.as_ref().err().map(ToString::to_string);
        Cache::open(home, POLLER_BUSY)?.settle(p, &next, unknown, error.as_deref(), now)?;
        sent += usize::from(next == NextStep::Done);
        if outcome == CallOutcome::Unreachable {
            // The server is down: the rest would fail the same way.
            break;
        }
    }
    report_refusals(client, home).await?;
    let waiting = Cache::open(home, POLLER_BUSY)?.pending_count()?;
    Ok((sent, waiting))
}

/// T10: each refused call is reported once. A server that does not know the report (older
/// than T10, 404) has nowhere to keep it: the refusal stays in the PC's log and cache.
async fn report_refusals(client: &Client, home: &Path) -> Result<(), SyncError> {
    for p in Cache::open(home, POLLER_BUSY)?.unreported_refusals()? {
        let reason = p.error.as_deref().unwrap_or("refused").lines().next().unwrap_or_default();
        let report = RefusedCall { action: p.action, target: p.target.clone(), reason: cut(reason, 1000) };
        match client.post::<_, serde_json::Value>("/api/v1/refusals", &report).await {
            Ok(_) => {}
            Err(e) if e.status() == Some(404) => {}
            Err(e) => {
                tracing::info!(error = %e, "a refused call's report waits for the next poll");
                return Ok(());
            }
        }
        Cache::open(home, POLLER_BUSY)?.mark_reported(p.id, crate::now())?;
    }
    Ok(())
}

/// One cycle: flush, refresh the policy, poll (long-polling up to `wait`), store, flush again.
pub async fn cycle(client: &Client, home: &Path, wait: Duration) -> Result<CycleReport, SyncError> {
    let result = cycle_inner(client, home, wait).await;
    let status = match &result {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
    };
    let mut values = vec![("last_poll_result", status)];
    if result.is_ok() {
        values.push(("last_poll_at", crate::now().timestamp_millis().to_string()));
    }
    Cache::open(home, POLLER_BUSY)?.set_state(&values)?;
    result
}

async fn cycle_inner(client: &Client, home: &Path, wait: Duration) -> Result<CycleReport, SyncError> {
    let who: WhoAmI = client.get("/api/v1/whoami", &[]).await?;
    let machine = who.machine.ok_or_else(|| ClientError::Api {
        status: 400,
        code: None,
        message: "the agent needs a machine token (or the admin token with --as MACHINE)".into(),
        details: vec![],
    })?;
    let (mut sent, _) = flush(client, home).await?;
    let policy: IntentPolicySpec = client.get("/api/v1/policy", &[]).await?;
    let cursor: (i64, String) = {
        let mut cache = Cache::open(home, POLLER_BUSY)?;
        cache.set_state(&[
            ("machine", machine.clone()),
            ("intent_policy", serde_json::to_string(&policy).unwrap_or_default()),
        ])?;
        let cursor = cache.state("cursor")?.and_then(|c| c.parse().ok()).unwrap_or(0);
        (cursor, cache.state("store")?.unwrap_or_default())
    };
    let (cursor, store) = cursor;
    // The server answers a long-poll within a minute at most (T5); a longer wait is many polls.
    let wait = wait.min(Duration::from_secs(60));
    let long = client.with_timeout(wait + Duration::from_secs(30))?;
    // E5: the cursor says which store it belongs to; the server starts a foreign one from 0.
    // (Sent once known: a server older than identities answers none, and would refuse it.)
    let mut query = vec![("cursor", cursor.to_string()), ("wait", format!("{}ms", wait.as_millis()))];
    if !store.is_empty() {
        query.push(("store", store.clone()));
    }
    let response: PollResponse = long.get("/api/v1/poll", &query).await?;
    let mut cache = Cache::open(home, POLLER_BUSY)?;
    let merged = cache.merge_polled(&machine, response.mail.clone(), response.cursor, crate::now())?;
    // After the cursor it goes with: a crash in between polls the same store from 0 once more.
    if response.store != store {
        cache.set_state(&[("store", response.store.clone())])?;
    }
    if !merged.quarantined.is_empty() {
        tracing::warn!(ids = ?merged.quarantined, "quarantined malformed mail");
    }
    let (more, waiting) = flush(client, home).await?;
    sent += more;
    Ok(CycleReport { machine, merged, mail: response.mail, sent, waiting })
}

/// `agent` (and `mcp`): cycles until `shutdown`, backing off from 1 s to `max_backoff` while
/// the server is away (E3), ending only on a token it refuses; `on_mail` hears of every poll
/// that answered with mail.
pub async fn run(
    client: &Client,
    home: &Path,
    wait: Duration,
    max_backoff: Duration,
    on_mail: impl Fn(),
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), SyncError> {
    let mut backoff = Duration::from_secs(1);
    while !*shutdown.borrow() {
        let pause = match cycle(client, home, wait).await {
            Ok(report) => {
                backoff = Duration::from_secs(1);
                if !report.merged.new.is_empty() {
                    tracing::info!(new = report.merged.new.len(), "mail received");
                }
                if !report.mail.is_empty() {
                    on_mail();
                }
                Duration::ZERO
            }
            // E3: a token the server no longer knows is not waited out; the agent says so and ends.
            Err(SyncError::Client(e)) if e.status() == Some(401) => return Err(SyncError::Client(e)),
            // A busy or failing cache is retried like an unreachable server: the work stays for
            // the next cycle (A2), and the log says what is wrong.
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "poll failed");
                let b = backoff;
                backoff = (backoff * 2).min(max_backoff);
                b
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => {}
        }
    }
    Ok(())
}
