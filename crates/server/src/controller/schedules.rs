//! Schedule crons (L14): each entry fires in its Schedule's time zone and enqueues the key of
//! its role. E13: once per scheduled time across clock steps (`cron::plan_due`): the leader
//! looks every second at the wall clock — a tokio timer runs on the monotonic clock and would
//! sleep through a step — and stores each entry's last run before queuing it, so neither a step
//! back nor a new leader runs a time twice.

use std::collections::HashMap;
use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::cron::plan_due;
use pcmail_store::Store;

use crate::app::{App, warn_unless_outage};
use crate::runtime::CronEntry;

/// How often the leader looks at the clock: a step over an entry's time runs it this late.
const TICK: Duration = Duration::from_secs(1);

/// The `kv` key of an entry's last run: its role, zone and expression, so an entry keeps its
/// record across spec changes that leave it as it is.
pub fn last_run_key(entry: &CronEntry) -> String {
    format!("schedule/last-run/{}/{}/{}", entry.key.name(), entry.tz.name(), entry.cron_text)
}

pub async fn run(app: App) {
    // Each entry's last run as this leader knows it; read from the store when first needed
    // after leadership is (re)gained, since another replica may have run entries meanwhile.
    let mut last: HashMap<String, Option<Ts>> = HashMap::new();
    let mut shutdown = app.watch_shutdown();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
        if !app.leadership().is_leader() {
            last.clear();
            continue;
        }
        for entry in &app.runtime().crons {
            let key = last_run_key(entry);
            let known = match last.get(&key) {
                Some(known) => *known,
                None => match app.store().kv_get(&key).await {
                    Ok(stored) => stored.and_then(|s| s.parse::<Ts>().ok()),
                    Err(e) => {
                        warn_unless_outage!(e.is_outage(), error = %e, entry = %key, "cannot read a schedule's last run; trying again");
                        continue;
                    }
                },
            };
            let due = plan_due(&entry.cron, entry.tz, known, crate::clock::now());
            if due.fire {
                // Stored before it is queued: a crash in between skips this run, never repeats it.
                if let Err(e) = app.store().kv_set(&key, &due.last.to_rfc3339()).await {
                    // Tried again every tick: a full disk is said once, by the health watch.
                    warn_unless_outage!(e.is_outage(), error = %e, entry = %key, "cannot record a schedule's run; it runs when it can");
                    last.insert(key, known);
                    continue;
                }
                app.queue().add(entry.key);
            }
            last.insert(key, Some(due.last));
        }
    }
}
