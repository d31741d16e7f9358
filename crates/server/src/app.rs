//! The state every handler and background task shares.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use pcmail_core::Ts;
use pcmail_core::duration::Dur;
use pcmail_core::health::{Leading, Said, Say, Uptime};
use pcmail_core::manifest::spec::RateLimit;
use pcmail_store::AnyStore;
use tokio::sync::watch;

use crate::config::{ServeConfig, ServeError};
use crate::credentials::{AdminToken, AuthFailures};
use crate::key::Key;
use crate::metrics::Metrics;
use crate::runtime::{Health, Runtime};
use crate::wakeups::Wakeups;
use crate::workqueue::WorkQueue;

#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    store: AnyStore,
    /// E5: the store's identity, answered with every poll.
    identity: String,
    /// T18: the admin token as `admin.token` holds it now.
    admin_token: AdminToken,
    /// T9/T18: failed authentication per client address, every surface.
    auth_failures: AuthFailures,
    /// T10: the refused calls PCs reported within the hour, per machine.
    refusals: Mutex<pcmail_core::agent::RefusalReports>,
    /// What the applied specs mean right now; swapped whole on every spec change.
    runtime: RwLock<Arc<Runtime>>,
    /// E2: long-polls and status waits, woken per machine and per mail.
    wakeups: Arc<Wakeups>,
    /// Bumped after every runtime rebuild: the cron task recomputes its next fire.
    specs_changed: watch::Sender<u64>,
    shutting_down: watch::Sender<bool>,
    /// Serializes apply/delete so that two admins' changes are each validated against the other's.
    spec_lock: tokio::sync::Mutex<()>,
    metrics: Metrics,
    queue: WorkQueue<Key>,
    resync: Duration,
    health: Mutex<Health>,
    /// The notifier's pace, rebuilt when MailPolicy.notify.minInterval changes.
    notify_limiter: Mutex<Option<(Dur, Arc<DefaultDirectRateLimiter>)>>,
    http: reqwest::Client,
    listen: OnceLock<SocketAddr>,
    /// Rung on every enqueue: idle workers claim at once instead of at their next poll.
    job_bell: tokio::sync::Notify,
    /// C1: this replica's name in the lease, the lease's duration, and until when (local
    /// monotonic time) this replica leads.
    replica: String,
    lease: Duration,
    /// Other processes write to the store (PostgreSQL): follow their announcements.
    shared_store: bool,
    leading_until: Mutex<Option<tokio::time::Instant>>,
    /// E18: the leadership last said in the log.
    said_leading: Mutex<bool>,
    /// E18: since when this server has been up without a break, by its own ticks.
    uptime: Mutex<Uptime>,
    /// E15: the store trouble last said in the log.
    said_store: Mutex<Said<String>>,
    /// E13: the store's clock as last read (by a lease attempt), and when on the monotonic clock.
    store_clock: Mutex<Option<(pcmail_core::Ts, tokio::time::Instant)>>,
    /// The pools' task (E17): `serve` waits for it to hand back or record every job it holds.
    pools: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Token buckets by key (`pool/NAME`, `function/NAME`), rebuilt when their rate changes.
    limiters: Mutex<std::collections::HashMap<String, (RateLimit, Arc<DefaultDirectRateLimiter>)>>,
}

/// What start-up found before the state could be built.
pub struct Parts {
    pub store: AnyStore,
    /// E5: the store's identity.
    pub identity: String,
    pub admin_token: AdminToken,
    /// C1: this replica's name in the lease.
    pub replica: String,
    /// Other processes write to the store: their announcements are followed.
    pub shared_store: bool,
}

impl App {
    /// The state of a server over `store`; [`crate::serve::start`] wires the tasks around it.
    pub fn new(parts: Parts, config: &ServeConfig) -> Result<App, ServeError> {
        let Parts { store, identity, admin_token, replica, shared_store } = parts;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| ServeError::Io(std::io::Error::other(format!("HTTP client: {e}"))))?;
        Ok(App {
            inner: Arc::new(Inner {
                store,
                identity,
                admin_token,
                auth_failures: AuthFailures::default(),
                refusals: Mutex::default(),
                runtime: RwLock::new(Arc::new(Runtime::default())),
                wakeups: Arc::default(),
                specs_changed: watch::channel(0).0,
                shutting_down: watch::channel(false).0,
                spec_lock: tokio::sync::Mutex::new(()),
                metrics: Metrics::new().map_err(|e| ServeError::Io(std::io::Error::other(e.to_string())))?,
                queue: WorkQueue::new(Duration::from_millis(500), Duration::from_secs(60)),
                resync: config.resync,
                health: Mutex::new(Health::default()),
                notify_limiter: Mutex::new(None),
                http,
                listen: OnceLock::new(),
                job_bell: tokio::sync::Notify::new(),
                limiters: Mutex::new(Default::default()),
                replica,
                shared_store,
                lease: config.lease.max(Duration::from_millis(300)),
                leading_until: Mutex::new(None),
                said_leading: Mutex::new(false),
                uptime: Mutex::new(Uptime::started(crate::clock::now())),
                said_store: Mutex::new(Said::default()),
                store_clock: Mutex::new(None),
                pools: Mutex::new(None),
            }),
        })
    }

    pub fn store(&self) -> &AnyStore {
        &self.inner.store
    }

    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// The hash of the admin token in force (re-read when the file changes, T18).
    pub fn admin_token_hash(&self) -> String {
        self.inner.admin_token.hash()
    }

    pub fn auth_failures(&self) -> &AuthFailures {
        &self.inner.auth_failures
    }

    /// T10: whether a PC's report of a refused call is recorded (see `RefusalReports`).
    pub fn refusal_report(
        &self,
        machine: &str,
        call: pcmail_core::agent::QueuedCall,
        target: &str,
        now: Ts,
    ) -> pcmail_core::agent::Report {
        self.inner.refusals.lock().unwrap_or_else(PoisonError::into_inner).report(machine, call, target, now)
    }

    pub fn runtime(&self) -> Arc<Runtime> {
        self.inner.runtime.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn set_runtime(&self, runtime: Runtime) {
        *self.inner.runtime.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(runtime);
        self.inner.specs_changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn watch_specs(&self) -> watch::Receiver<u64> {
        self.inner.specs_changed.subscribe()
    }

    pub async fn lock_specs(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.spec_lock.lock().await
    }

    pub fn wakeups(&self) -> &Arc<Wakeups> {
        &self.inner.wakeups
    }

    /// How long a waiter trusts the wake-ups before it looks again anyway: announcements from
    /// other replicas travel over a connection that can drop, so polling is the fallback.
    pub fn recheck_every(&self) -> Duration {
        if self.inner.shared_store { Duration::from_secs(2) } else { Duration::from_secs(3600) }
    }

    pub fn set_pools_task(&self, task: tokio::task::JoinHandle<()>) {
        *self.inner.pools.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
    }

    pub fn take_pools_task(&self) -> Option<tokio::task::JoinHandle<()>> {
        self.inner.pools.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.send_replace(true);
    }

    pub fn watch_shutdown(&self) -> watch::Receiver<bool> {
        self.inner.shutting_down.subscribe()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    pub fn queue(&self) -> &WorkQueue<Key> {
        &self.inner.queue
    }

    pub fn resync_period(&self) -> Duration {
        self.inner.resync
    }

    pub fn health(&self) -> Health {
        self.inner.health.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Records the notifier's state; a change is reflected on the MailPolicy's conditions.
    pub fn set_notify_error(&self, error: Option<String>) {
        let mut h = self.inner.health.lock().unwrap_or_else(PoisonError::into_inner);
        if h.notify_error != error {
            h.notify_error = error;
            self.queue().add(Key::Specs);
        }
    }

    pub fn notify_limiter(&self, min_interval: Dur) -> Arc<DefaultDirectRateLimiter> {
        let mut slot = self.inner.notify_limiter.lock().unwrap_or_else(PoisonError::into_inner);
        match &*slot {
            Some((d, l)) if *d == min_interval => l.clone(),
            _ => {
                let period = min_interval.to_std().max(Duration::from_millis(1));
                let quota = Quota::with_period(period).unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN));
                let limiter = Arc::new(RateLimiter::direct(quota));
                *slot = Some((min_interval, limiter.clone()));
                limiter
            }
        }
    }

    pub fn ring_job_bell(&self) {
        self.inner.job_bell.notify_waiters();
    }

    pub async fn job_enqueued(&self) {
        self.inner.job_bell.notified().await;
    }

    /// J5: records how many workers each pool runs; a change shows on the pools' conditions.
    pub fn set_ready_workers(&self, ready: std::collections::BTreeMap<String, u32>) {
        let mut h = self.inner.health.lock().unwrap_or_else(PoisonError::into_inner);
        if h.ready_workers != ready {
            h.ready_workers = ready;
            self.queue().add(Key::Specs);
        }
    }

    /// The token bucket for `key` at `rate`: `perMinute` with bursts of `burst`.
    pub fn limiter(&self, key: &str, rate: RateLimit) -> Arc<DefaultDirectRateLimiter> {
        let mut map = self.inner.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(key) {
            Some((r, l)) if *r == rate => l.clone(),
            _ => {
                let per_minute = NonZeroU32::new(rate.per_minute).unwrap_or(NonZeroU32::MIN);
                let burst = NonZeroU32::new(rate.burst).unwrap_or(NonZeroU32::MIN);
                let limiter = Arc::new(RateLimiter::direct(Quota::per_minute(per_minute).allow_burst(burst)));
                map.insert(key.to_string(), (rate, limiter.clone()));
                limiter
            }
        }
    }

    pub fn replica(&self) -> &str {
        &self.inner.replica
    }

    pub fn lease_duration(&self) -> Duration {
        self.inner.lease
    }

    /// C1: whether this replica runs the leader's keys right now.
    pub fn is_leader(&self) -> bool {
        let until = *self.inner.leading_until.lock().unwrap_or_else(PoisonError::into_inner);
        until.is_some_and(|t| tokio::time::Instant::now() < t)
    }

    /// E13: the time job leases are stamped and judged on — the store's clock (PostgreSQL's
    /// `clock_timestamp()`) as the last lease attempt read it, carried on by the monotonic clock;
    /// this process's clock until a first attempt read it.
    pub fn lease_now(&self) -> pcmail_core::Ts {
        let read = *self.inner.store_clock.lock().unwrap_or_else(PoisonError::into_inner);
        match read {
            Some((read, at)) => pcmail_core::lease::on_store_clock(read, at.elapsed()),
            None => crate::clock::now(),
        }
    }

    /// E13: a reading of the store's clock, taken at `at`.
    pub fn read_store_clock(&self, read: pcmail_core::Ts, at: tokio::time::Instant) {
        *self.inner.store_clock.lock().unwrap_or_else(PoisonError::into_inner) = Some((read, at));
    }

    /// Records the outcome of a lease attempt; answers whether leadership changed.
    pub fn set_leading_until(&self, until: Option<tokio::time::Instant>) -> bool {
        let was = self.is_leader();
        *self.inner.leading_until.lock().unwrap_or_else(PoisonError::into_inner) = until;
        let is = self.is_leader();
        self.metrics().control.set_leader(is);
        was != is
    }

    /// E18: whether leadership changed since it was last said (and now it is said).
    pub fn leadership_change(&self) -> Option<Leading> {
        let leading = self.is_leader();
        self.metrics().control.set_leader(leading);
        let mut said = self.inner.said_leading.lock().unwrap_or_else(PoisonError::into_inner);
        let change = pcmail_core::health::leadership_change(*said, leading);
        *said = leading;
        change
    }

    /// E18: records one of the server's own ticks at `now`; answers since when it has been up
    /// without a break.
    pub fn tick_uptime(&self, now: pcmail_core::Ts) -> pcmail_core::Ts {
        let mut up = self.inner.uptime.lock().unwrap_or_else(PoisonError::into_inner);
        if up.tick(now) {
            tracing::info!(
                "the server was away (paused, stopped or its clock stepped); receivers' silence counts from now (E18)"
            );
        }
        up.since()
    }

    /// E15: the store's trouble as it is now; answers what to log about it, if anything.
    pub fn observe_store(&self, trouble: Option<String>, now: pcmail_core::Ts) -> Option<Say<String>> {
        self.inner.said_store.lock().unwrap_or_else(PoisonError::into_inner).observe(trouble, now)
    }

    pub fn http(&self) -> &reqwest::Client {
        &self.inner.http
    }

    pub fn set_listen_addr(&self, addr: SocketAddr) {
        let _ = self.inner.listen.set(addr);
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.inner.listen.get().copied().unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 7420)))
    }
}
