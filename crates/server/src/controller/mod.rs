//! The reconcile loop: level-triggered, like kube-runtime's controllers.
//!
//! Keys name what to reconcile; every reconciler looks at the whole current state and makes it
//! right, so running one twice, or late, is harmless. Keys come from the periodic resync (always
//! on: the safety net for missed changes), from Schedule crons, and from the API when something
//! changed. One global token bucket paces the loop; per-key backoff paces failures.

pub mod indexer;
pub mod mail_sweep;
pub(crate) mod notifier;
pub mod pools;
mod prune;
pub mod schedules;

use std::num::NonZeroU32;
use std::time::Duration;

use governor::{Quota, RateLimiter};
use pcmail_core::ledger::Trigger;
use pcmail_core::manifest::spec::ScheduleRole;
use pcmail_store::Store;
use tokio::task::JoinSet;

use crate::app::{App, warn_unless_outage};
use crate::error::ReconcileError;
use crate::key::Key;

/// Reconciles per second across all keys, whatever asks for them.
const GLOBAL_RATE: u32 = 50;

/// Runs until shutdown: stops taking keys, lets running reconciles finish, then returns.
pub async fn run(app: App) {
    let queue = app.queue().clone();
    let mut shutdown = app.watch_shutdown();
    let limiter = RateLimiter::direct(Quota::per_second(NonZeroU32::new(GLOBAL_RATE).unwrap_or(NonZeroU32::MIN)));
    let resync = tokio::spawn(resync(app.clone()));
    let crons = tokio::spawn(schedules::run(app.clone()));
    let mut running = JoinSet::new();
    while let Some(key) = queue.next(&mut shutdown).await {
        limiter.until_ready().await;
        app.metrics().control.set_queue_depth(queue.depth());
        let app = app.clone();
        running.spawn(async move {
            // In a task of its own, so that a panic is a failed reconcile (backed off and
            // retried), never a key left marked running forever.
            let inner = app.clone();
            let ok = tokio::spawn(async move { reconcile(&inner, key).await }).await.unwrap_or(false);
            app.queue().done(&key, ok);
        });
        // Reap finished reconciles so the set does not grow.
        while running.try_join_next().is_some() {}
    }
    resync.abort();
    crons.abort();
    while running.join_next().await.is_some() {}
}

async fn reconcile(app: &App, key: Key) -> bool {
    let timer = app.metrics().control.reconcile_timer(&key);
    let mut shutdown = app.watch_shutdown();
    let result = tokio::select! {
        r = run_key(app, key) => r,
        // A notification still retrying is abandoned: its row stays unnotified for next start.
        _ = shutdown.wait_for(|stop| *stop) => Ok(()),
    };
    timer.observe_duration();
    match result {
        Ok(()) => true,
        Err(e) => {
            app.metrics().control.reconcile_failed(&key, e.reason());
            let outage = matches!(&e, ReconcileError::Store(s) if s.is_outage());
            warn_unless_outage!(outage, reconciler = key.name(), error = %e, "reconcile failed; backing off");
            false
        }
    }
}

async fn run_key(app: &App, key: Key) -> Result<(), ReconcileError> {
    if key.leader_only() && !app.leadership().is_leader() {
        return Ok(());
    }
    let now = crate::clock::now();
    match key {
        Key::MailSweep => mail_sweep::run(app, now).await.map(|_| ())?,
        Key::Notify => notifier::run(app, now).await?,
        Key::Specs => crate::specs::sync(app, now).await?,
        // E13: job leases are judged on the store's clock.
        Key::JobReaper => {
            crate::ledger::settle::rescue_expired(app, app.leadership().now()).await?;
            crate::ledger::settle::settle_waiting(app, now).await.map(|_| ())?
        }
        Key::Prune => prune::run(app, now).await.map(|_| ())?,
        Key::ExecuteChecked | Key::AutoExecute => {
            let (trigger, role) = match key {
                Key::ExecuteChecked => (Trigger::Manual, ScheduleRole::ExecuteChecked),
                _ => (Trigger::Auto, ScheduleRole::AutoExecute),
            };
            let limit = app.runtime().max_per_run(role).unwrap_or(usize::MAX);
            crate::ledger::execute_pass(app, trigger, limit, now).await.map(|_| ())?
        }
        Key::LedgerSync => {
            let cap = app.runtime().max_per_run(ScheduleRole::Sync);
            crate::ledger::sync_pass(app, cap, now).await.map(|_| ())?
        }
        Key::RebuildView => {
            let today = now.format("%Y-%m-%d").to_string();
            // Kept as lines, so a store that shows it (the spreadsheet's view tab) can draw it.
            let lines = crate::ledger::view(app, &today).await?;
            app.store()
                .kv_set(pcmail_store::LEDGER_VIEW_KEY, &serde_json::to_string(&lines).unwrap_or_default())
                .await?
        }
    }
    Ok(())
}

/// One pass of every reconciler, as a resync makes; answers the first error. For benchmarks
/// and tools; the loop itself runs keys one by one.
pub async fn pass(app: &App) -> Result<(), ReconcileError> {
    for key in Key::ALL {
        run_key(app, key).await?;
    }
    Ok(())
}

async fn resync(app: App) {
    let mut tick = tokio::time::interval(app.resync_period().max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for key in Key::ALL {
            app.queue().add(key);
        }
    }
}
