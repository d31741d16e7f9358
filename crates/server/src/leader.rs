//! C1: this replica's side of the leader lease. Every replica attempts a few times per lease
//! duration; the one that holds it runs the leader's keys (sweeps, notifications, schedules,
//! the reaper), the others serve the API and run workers. With SQLite the one process leads.
//!
//! Leadership is believed locally until the time the attempt *started* plus the duration: the
//! store's expiry is measured from a later instant, so this replica stops leading before
//! anyone else can start.

use std::time::Duration;

use pcmail_core::lease::{CONTROLLER, Leadership, attempt_every, plan_acquire, plan_release};
use pcmail_store::Store;
use tokio::time::Instant;

use pcmail_core::health::Leading;

use crate::app::{App, warn_unless_outage};
use crate::key::Key;

/// One attempt to take or renew the lease; records the outcome on the app.
pub async fn attempt(app: &App) -> Result<Leadership, pcmail_store::StoreError> {
    let started = Instant::now();
    let (me, duration) = (app.leadership().replica().to_string(), app.leadership().duration());
    let delta = chrono::TimeDelta::from_std(duration).unwrap_or(chrono::TimeDelta::MAX);
    let (leadership, store_now) = app
        .store()
        .lease_transaction(CONTROLLER, move |current, now| {
            let (write, leadership) = plan_acquire(current.as_ref(), CONTROLLER, &me, now, delta);
            (write, (leadership, now))
        })
        .await?;
    // E13: job leases are stamped on the store's clock as read here; carried on from the answer,
    // it runs behind by at most the round trip, so no lease is judged expired early.
    app.leadership().read_store_clock(store_now, Instant::now());
    let until = match &leadership {
        Leadership::Leading { .. } => Some(started + duration),
        Leadership::Following { .. } => None,
    };
    let holder = match &leadership {
        Leadership::Following { holder, .. } => Some(holder.as_str()),
        Leadership::Leading { .. } => None,
    };
    if lead_until(app, until) {
        say_leadership(app, holder);
        if until.is_some() {
            // A new leader looks at everything at once instead of waiting for the resync.
            for key in Key::ALL {
                app.queue().add(key);
            }
        }
    }
    Ok(leadership)
}

/// Runs until shutdown, then hands the lease back so another replica takes over at once.
pub async fn run(app: App) {
    let mut shutdown = app.watch_shutdown();
    let every = attempt_every(app.leadership().duration()).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.wait_for(|stop| *stop) => break,
        }
        if let Err(e) = attempt(&app).await {
            // Leadership lapses on its own when renewals fail (said by `say_leadership` when
            // it does).
            warn_unless_outage!(e.is_outage(), error = %e, "leader lease attempt failed");
            say_leadership(&app, None);
        }
    }
    release(&app).await;
}

async fn release(app: &App) {
    if !app.leadership().is_leader() {
        return;
    }
    lead_until(app, None);
    say_leadership(app, None);
    let me = app.leadership().replica().to_string();
    let released = app
        .store()
        .lease_transaction(CONTROLLER, move |current, now| (plan_release(current.as_ref(), &me, now), ()))
        .await;
    if let Err(e) = released {
        tracing::warn!(error = %e, "could not release the leader lease; it expires on its own");
    }
}

/// Records a lease attempt's outcome and `pcmail_leader` with it; answers whether leadership
/// changed.
fn lead_until(app: &App, until: Option<Instant>) -> bool {
    let changed = app.leadership().set_leading_until(until);
    app.metrics().control.set_leader(app.leadership().is_leader());
    changed
}

/// E18: logs a change of this replica's leadership once, whether an attempt or the lapse of
/// its belief (renewals that failed) changed it; `holder` names who leads instead, if known.
pub fn say_leadership(app: &App, holder: Option<&str>) {
    app.metrics().control.set_leader(app.leadership().is_leader());
    match app.leadership().change_to_say() {
        Some(Leading::Gained) => {
            tracing::info!(replica = app.leadership().replica(), "leadership gained: this replica leads (C1)")
        }
        Some(Leading::Lost) => tracing::warn!(
            replica = app.leadership().replica(),
            holder = holder.unwrap_or("unknown"),
            "leadership lost: this replica no longer leads (C1)"
        ),
        None => {}
    }
}

/// A name for this replica that no other process shares: the host (the pod's name under
/// Kubernetes), the process id and a random suffix.
pub fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .unwrap_or_else(|| "pcmail".into());
    let mut suffix = [0u8; 3];
    let suffix = crate::random::fill(&mut suffix).map(|()| pcmail_core::ids::hex(&suffix)).unwrap_or_default();
    format!("{host}-{}-{suffix}", std::process::id())
}
