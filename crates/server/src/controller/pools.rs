//! J5: the in-process workers of each WorkerPool. Every spec change converges the running
//! workers to `workers`: new ones start, extra ones drain (they finish the job they hold, then
//! stop claiming). Rate limits per pool (its queues) and per Function pace the claims and runs.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use pcmail_core::duration::Dur;
use pcmail_core::jobs::{Actor, Job};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::jobs::{self, Report};
use crate::{App, exec};

struct Worker {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

#[derive(Default)]
pub struct Pools {
    running: Mutex<BTreeMap<String, Vec<Worker>>>,
}

impl Pools {
    /// Starts or drains workers so that each pool runs its spec's `workers`; answers how many
    /// run now per pool.
    pub fn converge(&self, app: &App) -> BTreeMap<String, u32> {
        let rt = app.runtime();
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.retain(|name, workers| {
            let keep = rt.pools.iter().any(|(n, _)| n == name);
            if !keep {
                for w in workers.drain(..) {
                    w.stop.send_replace(true);
                }
            }
            keep
        });
        let mut ready = BTreeMap::new();
        for (name, spec) in &rt.pools {
            let workers = running.entry(name.clone()).or_default();
            workers.retain(|w| !w.task.is_finished());
            while workers.len() < spec.workers as usize {
                let (stop, stopped) = watch::channel(false);
                let id = format!("{name}#{}", workers.len() + 1);
                let task = tokio::spawn(work(app.clone(), name.clone(), id, stopped));
                workers.push(Worker { stop, task });
            }
            while workers.len() > spec.workers as usize {
                if let Some(w) = workers.pop() {
                    // Drain: the worker finishes the job it holds, then exits.
                    w.stop.send_replace(true);
                }
            }
            ready.insert(name.clone(), workers.len() as u32);
            app.metrics().workers.with_label_values(&[name]).set(workers.len() as i64);
        }
        ready
    }
}

/// How long an idle worker waits before asking again, unless a new job rings first.
const IDLE_MIN: Duration = Duration::from_millis(200);
const IDLE_MAX: Duration = Duration::from_secs(2);

async fn work(app: App, pool: String, me: String, mut stop: watch::Receiver<bool>) {
    let mut shutdown = app.watch_shutdown();
    let mut idle = IDLE_MIN;
    loop {
        if *stop.borrow() || *shutdown.borrow() {
            return;
        }
        let rt = app.runtime();
        let Some((_, spec)) = rt.pools.iter().find(|(n, _)| *n == pool) else { return };
        if let Some(rate) = spec.rate_limit {
            app.limiter(&format!("pool/{pool}"), rate).until_ready().await;
        }
        let mut claimed: Option<Job> = None;
        for queue in &spec.queues {
            match jobs::claim(&app, queue, 1, (Actor::Pool, &me), spec.lease_duration, crate::now()).await {
                Ok(mut got) if !got.is_empty() => {
                    claimed = got.pop();
                    break;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(worker = %me, error = %e, "claim failed"),
            }
        }
        match claimed {
            Some(job) => {
                idle = IDLE_MIN;
                run_job(&app, job, spec.lease_duration).await;
            }
            None => {
                tokio::select! {
                    _ = tokio::time::sleep(idle) => {}
                    _ = app.job_enqueued() => {}
                    _ = stop.changed() => {}
                    _ = shutdown.changed() => {}
                }
                idle = (idle * 2).min(IDLE_MAX);
            }
        }
    }
}

/// Runs one claimed job, heartbeating while it runs, and reports its end (J2 fences both).
pub async fn run_job(app: &App, job: Job, lease: Dur) {
    let token = job.lease_token.clone().unwrap_or_default();
    let beat = {
        let (app, id, token) = (app.clone(), job.id.clone(), token.clone());
        tokio::spawn(async move {
            let every = (lease.to_std() / 3).max(Duration::from_millis(100));
            loop {
                tokio::time::sleep(every).await;
                let beat = Report::Heartbeat { lease };
                if let Err(e) = jobs::report(&app, &id, &token, Actor::Pool, beat, crate::now()).await {
                    tracing::warn!(job = %id, error = %e, "heartbeat refused: the lease is gone");
                    return;
                }
            }
        })
    };
    let rt = app.runtime();
    let outcome = match rt.functions.iter().find(|(n, _)| *n == job.function) {
        Some((name, function)) => {
            if let Some(rate) = function.rate_limit {
                app.limiter(&format!("function/{name}"), rate).until_ready().await;
            }
            let vars = [("PCMAIL_JOB_ID", job.id.clone()), ("PCMAIL_QUEUE", job.queue.clone())];
            exec::run(name, function, &vars, job.payload.clone()).await
        }
        None => Err(format!("function {:?} is not defined", job.function)),
    };
    beat.abort();
    let report = match outcome {
        Ok(stdout) => Report::Complete { result: stdout.trim().to_string() },
        Err(error) => Report::Fail { error },
    };
    if let Err(e) = jobs::report(app, &job.id, &token, Actor::Pool, report, crate::now()).await {
        tracing::warn!(job = %job.id, error = %e, "result not recorded (the lease was rescued)");
    }
}
