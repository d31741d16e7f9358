//! J5: the in-process workers of each WorkerPool, as one runner per pool with `workers`
//! slots. The runner claims as many jobs as slots are free, in one claim, and claims again as
//! soon as a Function ends, while the others run (P9); completions wait for no one: whatever
//! ended while the last completion committed is committed together. A spec change moves the
//! slot count: more slots are filled at once, fewer drain (running jobs finish, no new claims
//! until under the count). Rate limits per pool (its queues) and per Function pace the claims
//! and runs.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use pcmail_core::duration::Dur;
use pcmail_core::jobs::{Actor, Job, Report, check_lease};
use pcmail_store::Store;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::app::App;
use crate::exec;
use crate::jobs;
use crate::ledger::settle;

struct Runner {
    /// `true` stops the runner; any send makes it read its spec again.
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct Pools {
    running: Mutex<BTreeMap<String, Runner>>,
}

impl Pools {
    /// Starts a runner for every pool that has none and stops those of deleted pools; answers
    /// how many workers (slots) each pool runs now.
    fn converge(&self, app: &App) -> BTreeMap<String, u32> {
        let rt = app.runtime();
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.retain(|name, runner| {
            let keep = rt.pools.iter().any(|(n, _)| n == name) && !runner.task.is_finished();
            if !keep {
                // Drain: its jobs finish and report, then the runner ends.
                runner.stop.send_replace(true);
            }
            keep
        });
        let mut ready = BTreeMap::new();
        for (name, spec) in &rt.pools {
            let runner = running.entry(name.clone()).or_insert_with(|| {
                let (stop, stopped) = watch::channel(false);
                Runner { stop, task: tokio::spawn(run_pool(app.clone(), name.clone(), stopped)) }
            });
            // A runner with no free slot waits for nothing else: more slots must wake it.
            runner.stop.send_replace(false);
            ready.insert(name.clone(), spec.workers);
            app.metrics().workers.with_label_values(&[name]).set(i64::from(spec.workers));
        }
        ready
    }
}

/// J5: keeps every pool's workers at its spec, from start-up and after every spec change.
pub async fn run(app: App) {
    let pools = Pools::default();
    let mut specs = app.watch_specs();
    loop {
        app.set_ready_workers(pools.converge(&app));
        if specs.changed().await.is_err() {
            return;
        }
    }
}

/// How long an idle runner waits before asking again, unless a new job rings first.
const IDLE_MIN: Duration = Duration::from_millis(200);
const IDLE_MAX: Duration = Duration::from_secs(2);

/// A job's end (or its claim handed back), waiting to be recorded.
type Ended = (String, String, Report);

/// The pool's slots: at most `limit` Functions run at once. A claimed job waits here for a
/// slot, its lease kept alive by heartbeats; when the pool shrinks to none or stops, waiting
/// jobs are handed back instead.
#[derive(Default)]
struct Slots {
    state: Mutex<SlotState>,
    freed: tokio::sync::Notify,
}

#[derive(Default)]
struct SlotState {
    limit: usize,
    busy: usize,
    closed: bool,
}

struct Slot<'a>(&'a Slots);

impl Slots {
    fn set_limit(&self, limit: usize) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).limit = limit;
        self.freed.notify_waiters();
    }

    fn close(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
        self.freed.notify_waiters();
    }

    /// A free slot, or None once no slot can ever come (no slots, or the pool stops).
    async fn take(&self) -> Option<Slot<'_>> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if s.closed || s.limit == 0 {
                    return None;
                }
                if s.busy < s.limit {
                    s.busy += 1;
                    return Some(Slot(self));
                }
            }
            freed.await;
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.busy = s.busy.saturating_sub(1);
        drop(s);
        self.0.freed.notify_waiters();
    }
}

async fn run_pool(app: App, pool: String, mut stop: watch::Receiver<bool>) {
    let mut shutdown = app.watch_shutdown();
    let (ended, reports) = mpsc::unbounded_channel::<Ended>();
    let recorder = tokio::spawn(record_ends(app.clone(), reports));
    let slots = std::sync::Arc::new(Slots::default());
    let mut claimed: JoinSet<()> = JoinSet::new();
    let mut idle = IDLE_MIN;
    loop {
        if *stop.borrow() || *shutdown.borrow() {
            break;
        }
        let rt = app.runtime();
        let Some((_, spec)) = rt.pools.iter().find(|(n, _)| *n == pool) else { break };
        let limit = spec.workers as usize;
        slots.set_limit(limit);
        // P9: up to one more job per slot is claimed ahead, so a slot that frees starts its next
        // job at once, and claims come in batches: a refill when that reserve is used up. A
        // rate-limited pool claims one job at a time, each paced, and nothing ahead.
        let in_flight = claimed.len();
        let (refill, want) = match spec.rate_limit {
            Some(_) => (in_flight < limit, 1),
            None => (in_flight <= limit && in_flight < 2 * limit, (2 * limit).saturating_sub(in_flight)),
        };
        let mut got = 0;
        if refill {
            if let Some(rate) = spec.rate_limit {
                app.limiter(&format!("pool/{pool}"), rate).until_ready().await;
            }
            for queue in &spec.queues {
                if got == want {
                    break;
                }
                let lease = spec.lease_duration;
                match jobs::claim(&app, queue, want - got, (Actor::Pool, &pool), lease, app.lease_now()).await {
                    Ok(jobs) => {
                        for job in jobs {
                            got += 1;
                            claimed.spawn(run_job(app.clone(), job, lease, slots.clone(), ended.clone()));
                        }
                    }
                    Err(e) => tracing::warn!(pool = %pool, error = %e, "claim failed"),
                }
            }
        }
        if got > 0 {
            idle = IDLE_MIN;
            continue;
        }
        tokio::select! {
            Some(_) = claimed.join_next(), if !claimed.is_empty() => {}
            _ = tokio::time::sleep(idle), if refill => idle = (idle * 2).min(IDLE_MAX),
            _ = app.job_enqueued(), if refill => {}
            _ = stop.changed() => {}
            _ = shutdown.changed() => {}
        }
    }
    // Drain: running jobs finish, waiting ones are handed back.
    slots.close();
    while claimed.join_next().await.is_some() {}
    drop(ended);
    let _ = recorder.await;
}

/// Records ended jobs: the first that arrives, with every other already waiting, in one
/// transaction.
async fn record_ends(app: App, mut reports: mpsc::UnboundedReceiver<Ended>) {
    let mut batch = Vec::new();
    while reports.recv_many(&mut batch, 1000).await > 0 {
        let sent: Vec<String> = batch.iter().map(|(id, _, _)| id.clone()).collect();
        match settle::report_many(&app, std::mem::take(&mut batch), Actor::Pool, app.lease_now()).await {
            Ok(outcomes) => {
                for (id, outcome) in sent.iter().zip(outcomes) {
                    if let Err(e) = outcome {
                        tracing::warn!(job = %id, error = %e, "result not recorded (the lease was rescued)");
                    }
                }
            }
            Err(e) => tracing::warn!(jobs = sent.len(), error = %e, "results not recorded; the leases will be rescued"),
        }
    }
}

/// Runs one claimed job when a slot is free, heartbeating from the claim on, and hands its end
/// to `ended` (J2 fences both); a job that gets no slot is handed back.
async fn run_job(app: App, job: Job, lease: Dur, slots: std::sync::Arc<Slots>, ended: mpsc::UnboundedSender<Ended>) {
    let token = job.lease_token.clone().unwrap_or_default();
    let beat = {
        let (app, id, token) = (app.clone(), job.id.clone(), token.clone());
        tokio::spawn(async move {
            let every = (lease.to_std() / 3).max(Duration::from_millis(100));
            loop {
                tokio::time::sleep(every).await;
                let beat = Report::Heartbeat { lease };
                if let Err(e) = settle::report(&app, &id, &token, Actor::Pool, beat, app.lease_now()).await {
                    tracing::warn!(job = %id, error = %e, "heartbeat refused: the lease is gone");
                    return;
                }
            }
        })
    };
    let Some(slot) = slots.take().await else {
        beat.abort();
        let _ = ended.send((job.id, token, Report::Release));
        return;
    };
    // A job claimed ahead may have been cancelled or rescued while it waited for its slot:
    // it starts only while the claim is still its own (J2), never next to its next run.
    match app.store().get_job(&job.id).await {
        Ok(Some(now)) if check_lease(&now, &token, Actor::Pool).is_ok() => {}
        outcome => {
            beat.abort();
            let why = outcome.map_or_else(|e| e.to_string(), |j| format!("{:?}", j.map(|j| j.state)));
            tracing::warn!(job = %job.id, state = %why, "not started: the claim is no longer this pool's");
            return;
        }
    }
    let rt = app.runtime();
    let outcome = match rt.functions.iter().find(|(n, _)| *n == job.function) {
        Some((name, function)) => {
            if let Some(rate) = function.rate_limit {
                app.limiter(&format!("function/{name}"), rate).until_ready().await;
            }
            let vars = [("PCMAIL_JOB_ID", job.id.clone()), ("PCMAIL_QUEUE", job.queue.clone())];
            exec::run(name, function, &vars, job.payload.clone()).await.map_err(|e| e.to_string())
        }
        None => Err(format!("function {:?} is not defined", job.function)),
    };
    beat.abort();
    drop(slot);
    let report = match outcome {
        Ok(stdout) => Report::Complete { result: stdout.trim().to_string() },
        Err(error) => Report::Fail { error },
    };
    let _ = ended.send((job.id, token, report));
}
