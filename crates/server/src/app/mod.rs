//! The state every handler and background task shares.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use pcmail_store::AnyStore;
use tokio::sync::watch;

use crate::config::{ServeConfig, ServeError};
use crate::credentials::AdminToken;
use crate::key::Key;
use crate::metrics::Metrics;
use crate::runtime::{Health, Runtime};
use crate::wakeups::Wakeups;
use crate::workqueue::WorkQueue;

mod access;
mod leadership;
mod limits;
mod liveness;
mod pools;

pub use access::Access;
pub use leadership::Leadership;
pub use limits::{LimitKey, Limits};
pub use liveness::Liveness;
pub(crate) use liveness::warn_unless_outage;
pub use pools::Pools;

#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

/// Shared state, with each service that keeps state of its own behind one accessor
/// (`access()`, `leadership()`, `limits()`, `pools()`, `liveness()`), so a handler names the
/// part it uses and a service's fields are read only through its methods.
struct Inner {
    store: AnyStore,
    /// E5: the store's identity, answered with every poll.
    identity: String,
    access: Access,
    leadership: Leadership,
    limits: Limits,
    pools: Pools,
    liveness: Liveness,
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
    http: reqwest::Client,
    listen: OnceLock<SocketAddr>,
    /// Other processes write to the store (PostgreSQL): follow their announcements.
    shared_store: bool,
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
                access: Access::new(admin_token),
                leadership: Leadership::new(replica, config.lease.max(Duration::from_millis(300))),
                limits: Limits::default(),
                pools: Pools::default(),
                liveness: Liveness::new(crate::clock::now()),
                runtime: RwLock::new(Arc::new(Runtime::default())),
                wakeups: Arc::default(),
                specs_changed: watch::channel(0).0,
                shutting_down: watch::channel(false).0,
                spec_lock: tokio::sync::Mutex::new(()),
                metrics: Metrics::new().map_err(|e| ServeError::Io(std::io::Error::other(e.to_string())))?,
                queue: WorkQueue::new(Duration::from_millis(500), Duration::from_secs(60)),
                resync: config.resync,
                health: Mutex::new(Health::default()),
                http,
                listen: OnceLock::new(),
                shared_store,
            }),
        })
    }

    pub fn store(&self) -> &AnyStore {
        &self.inner.store
    }

    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// T9/T10/T18: the admin token, failed attempts, PCs' refusal reports.
    pub fn access(&self) -> &Access {
        &self.inner.access
    }

    /// C1/E13: this replica's name, whether it leads, the clock leases are stamped on.
    pub fn leadership(&self) -> &Leadership {
        &self.inner.leadership
    }

    /// The notifier's, pools' and Functions' paces.
    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    /// The pools' task and the bell an enqueue rings.
    pub fn pools(&self) -> &Pools {
        &self.inner.pools
    }

    /// E15/E18: the server's uptime and the store trouble last said.
    pub fn liveness(&self) -> &Liveness {
        &self.inner.liveness
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

    /// J5: records how many workers each pool runs; a change shows on the pools' conditions.
    pub fn set_ready_workers(&self, ready: std::collections::BTreeMap<String, u32>) {
        let mut h = self.inner.health.lock().unwrap_or_else(PoisonError::into_inner);
        if h.ready_workers != ready {
            h.ready_workers = ready;
            self.queue().add(Key::Specs);
        }
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
