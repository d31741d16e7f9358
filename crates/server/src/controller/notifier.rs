//! M10: posts alerts and arrival notices that are written but not yet notified.
//!
//! Rows are written before anything is posted; a row is marked notified only after its post
//! succeeded, and only in the state that was posted. So a crash or a dead webhook delays
//! notifications but loses none, and a state already posted is not posted again.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use pcmail_core::Ts;
use pcmail_core::alert::{Alert, AlertState, alertmanager_api_body, webhook_body};
use pcmail_core::manifest::spec::{Notify, NotifyFormat};
use pcmail_store::Store;

use crate::app::App;
use crate::error::ReconcileError;
use crate::key::Key;
use crate::metrics::Notified;

/// Alerts per post; more are posted by the next run, which is queued at once.
const BATCH: usize = 100;
/// `alertmanager-api`: firing alerts are re-sent this often, with `endsAt` three periods ahead,
/// so Alertmanager keeps them active while they fire and lets them lapse if we stop.
const RESEND: chrono::TimeDelta = chrono::TimeDelta::seconds(60);
const RETRY_AFTER_CAP: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct PostError {
    message: String,
    retryable: bool,
    retry_after: Option<Duration>,
}

pub async fn run(app: &App, now: Ts) -> Result<(), ReconcileError> {
    let store = app.store();
    let rt = app.runtime();
    let mut batch = store.alerts_to_notify(BATCH).await?;
    let more = batch.len() == BATCH;
    let Some(notify) = rt.mail_policy.notify.clone() else {
        // No webhook: the alerts tab and metrics are the record (DESIGN M10).
        if !batch.is_empty() {
            app.metrics().mail.notified(Notified::Skipped, batch.len() as u64);
            store.mark_notified(batch, now).await?;
        }
        return requeue_if(app, more);
    };
    let api = notify.format == NotifyFormat::AlertmanagerApi;
    if api {
        let due = store
            .firing_alerts()
            .await?
            .into_iter()
            .filter(|a| !a.needs_notification() && a.last_sent_at.is_none_or(|t| now - t >= RESEND));
        batch.extend(due.take(BATCH.saturating_sub(batch.len())));
    }
    if batch.is_empty() {
        return Ok(());
    }
    let (url, body) = body_for(app, &notify, &batch, now);
    app.limits().notify(notify.min_interval).until_ready().await;
    match post(app, &url, &body).await {
        Ok(()) => {
            app.metrics().mail.notified(Notified::Sent, batch.len() as u64);
            app.set_notify_error(None);
            let sent_states: Vec<AlertState> = batch.iter().map(|a| a.state).collect();
            tracing::info!(count = batch.len(), ?sent_states, "notified");
            store.mark_notified(batch, crate::clock::now()).await?;
            requeue_if(app, more)
        }
        Err(e) => {
            app.set_notify_error(Some(format!("{url}: {}", e.message)));
            Err(ReconcileError::Webhook { count: batch.len(), url, message: e.message })
        }
    }
}

/// Where `alerts` are posted for `notify`, and the body in its format.
fn body_for(app: &App, notify: &Notify, alerts: &[Alert], now: Ts) -> (String, serde_json::Value) {
    let external = format!("http://{}", app.listen_addr());
    if notify.format == NotifyFormat::AlertmanagerApi {
        let base = notify.webhook.trim_end_matches('/');
        let url = if base.ends_with("/api/v2/alerts") { base.to_string() } else { format!("{base}/api/v2/alerts") };
        (url, alertmanager_api_body(alerts, &external, now, RESEND * 3))
    } else {
        (notify.webhook.clone(), webhook_body(notify.format, alerts, &external))
    }
}

/// E15: posts the `store-unwritable` alert of each episode of refusals for space to the
/// MailPolicy's webhook, from memory (`core::alert::Unwritable`): the store that would record
/// it is the one refusing. One task, so a post is never made twice at once; a failed post is
/// tried again at the next tick. The alert names this replica.
pub async fn watch_unwritable(app: App) {
    let mut alert = pcmail_core::alert::Unwritable::default();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut shutdown = app.watch_shutdown();
    // A post that fails is tried again at the next tick: a dead webhook is said once, then at
    // debug until a post gets through or there is nothing left to post.
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        let now = crate::clock::now();
        alert.observe(app.store().health().refusing().as_deref(), now);
        let due = app.runtime().mail_policy.notify.clone().and_then(|notify| {
            let resend = (notify.format == NotifyFormat::AlertmanagerApi).then_some(RESEND);
            alert.due(app.leadership().replica(), resend, now).map(|due| (notify, due))
        });
        // Nothing to post (no webhook, or no episode to tell): the next failure is news again.
        let Some((notify, due)) = due else {
            failing = false;
            continue;
        };
        let (url, body) = body_for(&app, &notify, std::slice::from_ref(&due), now);
        app.limits().notify(notify.min_interval).until_ready().await;
        match post(&app, &url, &body).await {
            Ok(()) => {
                app.metrics().mail.notified(Notified::Sent, 1);
                tracing::info!(state = due.state.as_str(), "store-unwritable notified");
                alert.posted(&due, now);
                failing = false;
            }
            Err(e) if failing => {
                tracing::debug!(error = %e.message, url, "store-unwritable not notified; trying again")
            }
            Err(e) => {
                tracing::warn!(error = %e.message, url, "store-unwritable not notified; trying again at each tick");
                failing = true;
            }
        }
    }
}

fn requeue_if(app: &App, more: bool) -> Result<(), ReconcileError> {
    if more {
        app.queue().add(Key::Notify);
    }
    Ok(())
}

/// One post with retries: exponential backoff with jitter, honouring Retry-After on 429/503.
/// 4xx other than 408/429 are not retried here (the queue's backoff retries them later).
async fn post(app: &App, url: &str, body: &serde_json::Value) -> Result<(), PostError> {
    let attempt = || async {
        let resp = app.http().post(url).json(body).send().await.map_err(|e| PostError {
            message: e.to_string(),
            retryable: true,
            retry_after: None,
        })?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let header = resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok());
        let retry_after = pcmail_core::retry::retry_after(header, RETRY_AFTER_CAP);
        let retryable = pcmail_core::retry::retryable(status.as_u16());
        Err(PostError { message: format!("answered {status}"), retryable, retry_after })
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(30))
        .with_max_times(4)
        .with_jitter();
    attempt
        .retry(backoff)
        .when(|e: &PostError| e.retryable)
        .adjust(|e: &PostError, d| e.retry_after.or(d))
        .notify(|e: &PostError, d| {
            app.metrics().mail.notified(Notified::Failed, 1);
            // The caller says how the post ended: a dead webhook is not a warning a retry.
            tracing::debug!(error = %e.message, retry_in = ?d, "notification post failed");
        })
        .await
        .inspect_err(|_| app.metrics().mail.notified(Notified::Failed, 1))
}
