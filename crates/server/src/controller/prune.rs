//! E7: the leader prunes what retention lets go — closed mail, finished jobs, events, settled
//! alerts — in short batches, so no transaction holds a tab for long, and a pass that cannot
//! finish leaves the rest to the next one.

use pcmail_core::Ts;
use pcmail_core::retention::cutoffs;
use pcmail_store::{Prune, Store, StoreError};

use crate::app::App;

/// Rows per transaction, and transactions per tab in one pass.
const BATCH: usize = 1000;
const BATCHES_PER_PASS: usize = 10;

/// One pass; answers how many rows went.
pub async fn run(app: &App, now: Ts) -> Result<usize, StoreError> {
    let rt = app.runtime();
    let cut = cutoffs(&rt.mail_policy, &rt.pools, now);
    let mut work = vec![
        Prune::ClosedMail { before: cut.closed_mail },
        Prune::Events { before: cut.history },
        Prune::SettledAlerts { before: cut.history },
    ];

    // Each declared queue by its pools' retention, then any queue past every retention: each an
    // index probe, so an idle pass costs the same however many jobs the tab holds.
    let queues = cut.jobs.iter().map(|(q, before)| Prune::FinishedJobs { queue: Some(q.clone()), before: *before });
    work.extend(queues);
    work.push(Prune::FinishedJobs { queue: None, before: cut.jobs_anywhere });
    let mut total = 0;
    for what in work {
        let tab = what.tab();
        for _ in 0..BATCHES_PER_PASS {
            let n = app.store().prune(what.clone(), BATCH).await?;
            if n > 0 {
                app.metrics().control.pruned(tab, n as u64);
                total += n;
            }
            if n < BATCH {
                break;
            }
        }
    }
    if total > 0 {
        tracing::info!(rows = total, "pruned past retention");
    }
    Ok(total)
}
