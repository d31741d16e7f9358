//! Background work of the controller. For now the M8 expiry sweep on a fixed period; the
//! level-triggered work queue, alerts and schedules build on this module.

use std::time::Duration;

use crate::{App, mailbox};

const SWEEP_EVERY: Duration = Duration::from_secs(10);

pub async fn run(app: App) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match mailbox::sweep_expired(&app, crate::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(expired = n, "mail sweep"),
            Err(e) => tracing::warn!(error = %e, "mail sweep failed; retrying next period"),
        }
    }
}
