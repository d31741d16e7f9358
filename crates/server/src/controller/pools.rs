//! J5: the in-process workers of each WorkerPool, as one runner per pool with `workers`
//! slots. The runner holds jobs ahead of its slots ([`holding::jobs_to_hold`]: more for
//! shorter runs) and claims the next batch when half that reserve is used up, while the slots run
//! (P9); starts and results are committed in
//! batches, [`GATHER`] after the first of each arrives, so one commit (and its fsync) carries
//! dozens. A spec change moves the slot count: more slots are filled at once, fewer drain
//! (running jobs finish, no new claims until under the count). Rate limits per pool (its queues) and per Function pace the claims
//! and runs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use pcmail_core::duration::Dur;
use pcmail_core::holding::{self, Attempt, Next, Outage, OutageNews, OwnLease, RunEnd, TypicalRun};
use pcmail_core::jobs::{Actor, Job, Report, began, check_lease};
use pcmail_core::manifest::spec::WorkerPoolSpec;
use pcmail_store::{Store, StoreError};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::app::{App, LimitKey};
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
    fn converge(&self, app: &App, grace: Duration) -> BTreeMap<String, u32> {
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
                Runner { stop, task: tokio::spawn(run_pool(app.clone(), name.clone(), stopped, grace)) }
            });
            // A runner with no free slot waits for nothing else: more slots must wake it.
            runner.stop.send_replace(false);
            ready.insert(name.clone(), spec.workers);
            app.metrics().jobs.set_workers(name, spec.workers);
        }
        ready
    }
}

/// J5: keeps every pool's workers at its spec, from start-up and after every spec change.
/// E17: on shutdown every runner gets `grace` for its running jobs, hands back the rest and
/// records what ended; this returns once all of them have.
pub async fn run(app: App, grace: Duration) {
    let pools = Pools::default();
    let mut specs = app.watch_specs();
    let mut shutdown = app.watch_shutdown();
    loop {
        app.set_ready_workers(pools.converge(&app, grace));
        tokio::select! {
            changed = specs.changed() => if changed.is_err() { break },
            _ = shutdown.wait_for(|stopping| *stopping) => break,
        }
    }
    let runners = std::mem::take(&mut *pools.running.lock().unwrap_or_else(PoisonError::into_inner));
    for (name, runner) in runners {
        runner.stop.send_replace(true);
        if let Err(e) = runner.task.await {
            tracing::error!(pool = %name, error = %e, "pool runner failed");
        }
    }
}

/// How long an idle runner waits before asking again, unless a new job rings first.
const IDLE_MIN: Duration = Duration::from_millis(200);
const IDLE_MAX: Duration = Duration::from_secs(2);

/// How long the recorder gathers reports after the first before it commits them. P9: a
/// commit, its fsync above all, costs about what the rest of a short job's handling does, so
/// a batch holds a few dozen reports, not four. A crash loses the uncommitted batch: those
/// runs the reaper gives back, a lost start with no attempt spent (J3 counts the attempts a
/// store saw begin). A result is stored this much, plus a commit under way, after its end.
const GATHER: Duration = Duration::from_millis(10);
/// A batch this large when its first report arrives is committed without gathering more.
const GATHER_ENOUGH: usize = 64;

/// A job's start, end or claim handed back, waiting to be recorded while its lease lives.
type Ended = (String, String, Report, OwnLease);

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
    /// The runner sets it at each pass; only a change wakes the waiters (each pass follows a
    /// job's end, and waking the whole reserve at each undid a freed slot's one wake-up).
    fn set_limit(&self, limit: usize) {
        let was = std::mem::replace(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner).limit, limit);
        if was != limit {
            self.freed.notify_waiters();
        }
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
        // One slot, one waiter: all of a reserve of dozens woken for it cost a pool a tenth
        // of its time a job (P9). A woken waiter dropped before it looks passes the wake on.
        self.0.freed.notify_one();
    }
}

/// What a pool's runner, its jobs and its recorder share: the pool's monotonic clock (E11) and
/// how the store has been answering (an outage is logged once). The way to the recorder is
/// held only by the runner and its jobs, so the recorder ends once they all did.
struct Shared {
    app: App,
    pool: String,
    origin: Instant,
    outage: Mutex<Outage>,
    /// How long this pool's runs take, for how many jobs it holds ahead (P9).
    typical: Mutex<TypicalRun>,
}

impl Shared {
    /// The pool's monotonic clock: a wall-clock step neither stretches nor cuts a lease.
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Notes whether the store answered; the first failure and the first answer after it
    /// are logged, never each retry.
    fn store_answered(&self, answered: Result<(), &StoreError>) {
        let news = self.outage.lock().unwrap_or_else(PoisonError::into_inner).note(answered.is_ok(), self.now());
        match (news, answered) {
            (Some(OutageNews::Began), Err(e)) => tracing::warn!(
                pool = %self.pool, error = %e,
                "the store is unavailable: claims wait, heartbeats, starts and results are retried until each job's lease ends (E11)"
            ),
            (Some(OutageNews::Ended(after)), _) => {
                tracing::warn!(pool = %self.pool, after = ?after, "the store answers again")
            }
            _ => {}
        }
    }

    /// One try of a lease-checked write of one job.
    async fn write(&self, id: &str, token: &str, report: Report) -> Attempt {
        let reports = vec![(id.to_string(), token.to_string(), report)];
        match settle::record_many(&self.app, reports, Actor::Pool, self.app.leadership().now()).await {
            Err(e) => {
                self.store_answered(Err(&e));
                Attempt::StoreFailed
            }
            Ok(mut outcomes) => {
                self.store_answered(Ok(()));
                match outcomes.pop() {
                    Some(Ok(_)) => Attempt::Recorded,
                    Some(Err(e)) => {
                        tracing::warn!(pool = %self.pool, job = %id, error = %e, "the lease is gone");
                        Attempt::Refused
                    }
                    None => Attempt::Refused,
                }
            }
        }
    }
}

async fn run_pool(app: App, pool: String, mut stop: watch::Receiver<bool>, grace: Duration) {
    let mut shutdown = app.watch_shutdown();
    let (ended, reports) = mpsc::unbounded_channel::<Ended>();
    let shared = Arc::new(Shared {
        app,
        pool,
        origin: Instant::now(),
        outage: Mutex::new(Outage::default()),
        typical: Mutex::new(TypicalRun::default()),
    });
    let recorder = tokio::spawn(record_ends(shared.clone(), reports));
    // E17: set once the shutdown grace is over: runs still going are killed and handed back.
    let (abandon, abandoned) = watch::channel(false);
    let mut run =
        PoolRun { shared, ended, slots: Arc::new(Slots::default()), abandon, abandoned, claimed: JoinSet::new() };
    run.claim_until_stopped(&mut stop, &mut shutdown).await;
    run.drain(&mut shutdown, grace).await;
    // The last sender of ends goes: the recorder commits what is left and ends.
    drop(run);
    let _ = recorder.await;
}

/// One pool's runner while it runs: what its claims and its drain share.
struct PoolRun {
    shared: Arc<Shared>,
    ended: mpsc::UnboundedSender<Ended>,
    slots: Arc<Slots>,
    abandon: watch::Sender<bool>,
    abandoned: watch::Receiver<bool>,
    /// The jobs claimed and not yet ended, waiting for a slot or running.
    claimed: JoinSet<()>,
}

impl PoolRun {
    /// Claims and starts jobs until the pool is stopped or deleted or `serve` shuts down; idle,
    /// it waits for a slot, a new job or a backoff that doubles up to `IDLE_MAX`.
    async fn claim_until_stopped(&mut self, stop: &mut watch::Receiver<bool>, shutdown: &mut watch::Receiver<bool>) {
        let app = self.shared.app.clone();
        let mut idle = IDLE_MIN;
        loop {
            if *stop.borrow() || *shutdown.borrow() {
                break;
            }
            let rt = app.runtime();
            let Some((_, spec)) = rt.pools.iter().find(|(n, _)| *n == self.shared.pool) else { break };
            let limit = spec.workers as usize;
            self.slots.set_limit(limit);
            // P9: jobs are held ahead of the slots, so a slot that frees starts its next job at
            // once, and claimed in batches: a refill when half that reserve is used up. A
            // rate-limited pool claims one job at a time, each paced, and nothing ahead.
            let in_flight = self.claimed.len();
            let want = match spec.rate_limit {
                Some(_) => usize::from(in_flight < limit),
                None => {
                    let typical = self.shared.typical.lock().unwrap_or_else(PoisonError::into_inner).get();
                    holding::to_claim(limit, in_flight, holding::jobs_to_hold(limit, typical))
                }
            };
            let refill = want > 0;
            let (got, store_down) = if refill { self.claim(spec, want).await } else { (0, false) };
            if got > 0 {
                idle = IDLE_MIN;
                continue;
            }
            if store_down {
                idle = IDLE_MAX;
            }
            tokio::select! {
                Some(_) = self.claimed.join_next(), if !self.claimed.is_empty() => {}
                _ = tokio::time::sleep(idle), if refill => idle = (idle * 2).min(IDLE_MAX),
                _ = app.pools().rung(), if refill => {}
                _ = stop.changed() => {}
                _ = shutdown.changed() => {}
            }
        }
    }

    /// One claim of up to `want` jobs across the pool's queues in order, each started as it
    /// comes; answers how many came and whether the store failed to answer.
    async fn claim(&mut self, spec: &WorkerPoolSpec, want: usize) -> (usize, bool) {
        let (app, pool) = (&self.shared.app, &self.shared.pool);
        if let Some(rate) = spec.rate_limit {
            app.limits().bucket(LimitKey::Pool(pool.to_string()), rate).until_ready().await;
        }
        let (mut got, mut store_down) = (0, false);
        for queue in &spec.queues {
            if got == want {
                break;
            }
            let lease = spec.lease_duration;
            let asked = self.shared.now();
            match jobs::pool_claim(app, pool, queue, want - got, lease, app.leadership().now()).await {
                Ok(jobs) => {
                    self.shared.store_answered(Ok(()));
                    for job in jobs {
                        got += 1;
                        let (shared, slots, abandoned) =
                            (self.shared.clone(), self.slots.clone(), self.abandoned.clone());
                        self.claimed.spawn(run_job(shared, self.ended.clone(), job, (lease, asked), slots, abandoned));
                    }
                }
                Err(e) => {
                    self.shared.store_answered(Err(&e));
                    store_down = true;
                }
            }
        }
        (got, store_down)
    }

    /// Drain: jobs waiting for a slot are handed back; running ones finish — on shutdown within
    /// the grace, after which they are killed and handed back (E17).
    async fn drain(&mut self, shutdown: &mut watch::Receiver<bool>, grace: Duration) {
        self.slots.close();
        let stopping = *shutdown.borrow();
        let mut deadline = stopping.then(|| tokio::time::Instant::now() + grace);
        loop {
            let abandon = &self.abandon;
            let grace_over = async {
                match deadline {
                    Some(at) if !*abandon.borrow() => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            tokio::select! {
                joined = self.claimed.join_next() => if joined.is_none() { break },
                _ = shutdown.changed(), if deadline.is_none() => {
                    if *shutdown.borrow() {
                        deadline = Some(tokio::time::Instant::now() + grace);
                    }
                }
                _ = grace_over => {
                    let (pool, jobs) = (&self.shared.pool, self.claimed.len());
                    tracing::warn!(pool = %pool, jobs, ?grace, "shutdown grace over: handing running jobs back");
                    self.abandon.send_replace(true);
                }
            }
        }
    }
}

/// Records what jobs report: the first that arrives, with every other already waiting, in
/// one transaction. E11: while the store is away the batch is tried again, with what arrives
/// meanwhile, for as long as each lease lives; an end is dropped only once its lease ended.
async fn record_ends(shared: Arc<Shared>, mut reports: mpsc::UnboundedReceiver<Ended>) {
    let app = shared.app.clone();
    let mut waiting: Vec<Ended> = Vec::new();
    let mut failures = 0;
    loop {
        if waiting.is_empty() {
            if reports.recv_many(&mut waiting, 1000).await == 0 {
                return;
            }
            if waiting.len() < GATHER_ENOUGH {
                tokio::time::sleep(GATHER).await;
            }
        }
        while let Ok(more) = reports.try_recv() {
            waiting.push(more);
        }
        let batch: Vec<(String, String, Report)> =
            waiting.iter().map(|(id, token, report, _)| (id.clone(), token.clone(), report.clone())).collect();
        match settle::record_many(&app, batch, Actor::Pool, app.leadership().now()).await {
            Ok(outcomes) => {
                shared.store_answered(Ok(()));
                failures = 0;
                for ((id, _, _, _), outcome) in waiting.drain(..).zip(outcomes) {
                    if let Err(e) = outcome {
                        tracing::warn!(job = %id, error = %e, "not recorded: the lease was taken (J2)");
                    }
                }
            }
            Err(e) => {
                shared.store_answered(Err(&e));
                failures += 1;
                let now = shared.now();
                let held = waiting.drain(..).map(|(id, token, report, lease)| ((id, token, report), lease)).collect();
                let (kept, dropped) = holding::still_held(held, now);
                for (id, _, report) in dropped {
                    tracing::warn!(
                        job = %id, report = ?std::mem::discriminant(&report),
                        "not recorded: the store stayed away until the lease ended; the job is the reaper's (J3)"
                    );
                }
                let wait = kept
                    .iter()
                    .filter_map(|(_, lease)| match holding::after(Attempt::StoreFailed, failures, *lease, now) {
                        Next::RetryIn(d) => Some(d),
                        _ => None,
                    })
                    .min();
                waiting = kept.into_iter().map(|((id, token, report), lease)| (id, token, report, lease)).collect();
                if let Some(wait) = wait {
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }
}

/// E11: keeps a job's lease from its claim on: a heartbeat every third of the lease, retried
/// through a store outage while the lease lives. Returns once the lease is gone (refused, or
/// ended while the store was away); `held` is the lease as last extended.
async fn hold(shared: &Shared, id: &str, token: &str, lease: Dur, held: &Mutex<OwnLease>) {
    let every = (lease.to_std() / 3).max(Duration::from_millis(100));
    loop {
        tokio::time::sleep(every).await;
        let mut failures = 0;
        loop {
            let asked = shared.now();
            let attempt = shared.write(id, token, Report::Heartbeat { lease }).await;
            if attempt == Attempt::StoreFailed {
                failures += 1;
            }
            let next = {
                let mut own = held.lock().unwrap_or_else(PoisonError::into_inner);
                if attempt == Attempt::Recorded {
                    *own = own.max(OwnLease::extended(asked, lease));
                }
                holding::after(attempt, failures, *own, shared.now())
            };
            match next {
                Next::Done => break,
                Next::RetryIn(wait) => tokio::time::sleep(wait).await,
                Next::LeaseEnded => return,
            }
        }
    }
}

/// A claimed job: it waits for a slot, its lease kept by [`hold`] from the claim on (`asked`
/// then), is checked to be still this pool's if it waited long ([`holding::FRESH`]), marked
/// started (E17) and run; whatever ends it makes the report
/// [`holding::report_for`] says. A lost lease kills the run: a job never runs next to its
/// next run (E11). The heartbeats are polled in this job's own task (P9: one task a job).
async fn run_job(
    shared: Arc<Shared>,
    ended: mpsc::UnboundedSender<Ended>,
    job: Job,
    (lease, asked): (Dur, Duration),
    slots: Arc<Slots>,
    mut abandoned: watch::Receiver<bool>,
) {
    let token = job.lease_token.clone().unwrap_or_default();
    let held = Arc::new(Mutex::new(OwnLease::extended(asked, lease)));
    let running = std::sync::atomic::AtomicBool::new(false);
    let work = async {
        let Some(_slot) = slots.take().await else { return RunEnd::NoSlot };
        // The slot's whole hold, a Function's rate-limit wait included: what the pool's next
        // jobs would wait behind (`TypicalRun`).
        let took = Instant::now();
        if holding::read_again_before_start(asked, shared.now()) && !still_ours(&shared, &job, &token, &held).await {
            return RunEnd::LeaseLost;
        }
        if !began(&job) {
            // Recorded with the next batch, not waited for: a crash within that commit gives
            // the attempt back though the run began.
            let lease_now = *held.lock().unwrap_or_else(PoisonError::into_inner);
            let _ = ended.send((job.id.clone(), token.clone(), Report::Start, lease_now));
        }
        running.store(true, std::sync::atomic::Ordering::Relaxed);
        let rt = shared.app.runtime();
        let run = async {
            match rt.functions.iter().find(|(n, _)| *n == job.function) {
                Some((name, function)) => {
                    if let Some(rate) = function.rate_limit {
                        shared.app.limits().bucket(LimitKey::Function(name.to_string()), rate).until_ready().await;
                    }
                    let vars = [("PCMAIL_JOB_ID", job.id.clone()), ("PCMAIL_QUEUE", job.queue.clone())];
                    let outcome = exec::run(name, function, &vars, job.payload.clone()).await;
                    shared.typical.lock().unwrap_or_else(PoisonError::into_inner).note(took.elapsed());
                    outcome.map_err(|e| e.to_string())
                }
                None => Err(format!("function {:?} is not defined", job.function)),
            }
        };
        tokio::select! {
            outcome = run => outcome.map_or_else(RunEnd::Failed, RunEnd::Succeeded),
            _ = abandoned.wait_for(|a| *a) => RunEnd::CutByShutdown,
        }
    };
    // Dropping `work` kills the Function's whole session (E16).
    let end = tokio::select! {
        end = work => end,
        () = hold(&shared, &job.id, &token, lease, &held) => {
            if running.load(std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(job = %job.id, "run killed: its lease ended");
            }
            RunEnd::LeaseLost
        }
    };
    let lease_now = *held.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(report) = holding::report_for(end) {
        let _ = ended.send((job.id, token, report, lease_now));
    }
}

/// A job claimed ahead that waited long for its slot may have been cancelled or rescued
/// meanwhile: it starts only while the claim is still its own (J2), never next to its next
/// run. The read is retried through an outage while the lease lives.
async fn still_ours(shared: &Shared, job: &Job, token: &str, held: &Mutex<OwnLease>) -> bool {
    let mut failures = 0;
    loop {
        match shared.app.store().get_job(&job.id).await {
            Ok(found) => {
                shared.store_answered(Ok(()));
                return match found {
                    Some(now) if check_lease(&now, token, Actor::Pool).is_ok() => true,
                    other => {
                        let state = other.map(|j| j.state.to_string()).unwrap_or_else(|| "gone".into());
                        tracing::warn!(job = %job.id, %state, "not started: the claim is no longer this pool's");
                        false
                    }
                };
            }
            Err(e) => {
                shared.store_answered(Err(&e));
                failures += 1;
                let own = *held.lock().unwrap_or_else(PoisonError::into_inner);
                match holding::after(Attempt::StoreFailed, failures, own, shared.now()) {
                    // A lease that ends meanwhile ends this wait with it (`run_job`).
                    Next::RetryIn(wait) => tokio::time::sleep(wait).await,
                    _ => return false,
                }
            }
        }
    }
}
