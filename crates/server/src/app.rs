//! The state every handler and background task shares.

use std::sync::{Arc, RwLock};

use pcmail_store::SqliteStore;
use tokio::sync::watch;

use crate::runtime::Runtime;
use crate::{ServeConfig, ServeError, auth};

#[derive(Clone)]
pub struct App {
    inner: Arc<Inner>,
}

struct Inner {
    store: SqliteStore,
    admin_token_hash: String,
    /// What the applied specs mean right now; swapped whole on every spec change.
    runtime: RwLock<Arc<Runtime>>,
    /// Bumped after every committed mail change: long-polls wait on it instead of sleeping.
    mail_changed: watch::Sender<u64>,
    shutting_down: watch::Sender<bool>,
    /// Serializes apply/delete so that two admins' changes are each validated against the other's.
    spec_lock: tokio::sync::Mutex<()>,
}

impl App {
    pub async fn start(config: &ServeConfig) -> Result<App, ServeError> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir).map_err(|source| ServeError::DataDir {
            path: dir.clone(),
            source,
        })?;
        let admin_token_hash = auth::ensure_admin_token(dir)?;
        let url = match &config.store_url {
            Some(u) => u.clone(),
            None => format!("sqlite:{}", dir.join("pcmail.db").display()),
        };
        let store = pcmail_store::open(&url).await?;
        let app = App {
            inner: Arc::new(Inner {
                store,
                admin_token_hash,
                runtime: RwLock::new(Arc::new(Runtime::default())),
                mail_changed: watch::channel(0).0,
                shutting_down: watch::channel(false).0,
                spec_lock: tokio::sync::Mutex::new(()),
            }),
        };
        crate::specs::sync(&app, crate::now()).await?;
        Ok(app)
    }

    pub fn store(&self) -> &SqliteStore {
        &self.inner.store
    }

    pub fn admin_token_hash(&self) -> &str {
        &self.inner.admin_token_hash
    }

    pub fn runtime(&self) -> Arc<Runtime> {
        self.inner
            .runtime
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn set_runtime(&self, runtime: Runtime) {
        *self
            .inner
            .runtime
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(runtime);
    }

    pub async fn lock_specs(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.spec_lock.lock().await
    }

    pub fn mail_changed(&self) {
        self.inner
            .mail_changed
            .send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn watch_mail(&self) -> watch::Receiver<u64> {
        self.inner.mail_changed.subscribe()
    }

    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.send_replace(true);
    }

    pub fn watch_shutdown(&self) -> watch::Receiver<bool> {
        self.inner.shutting_down.subscribe()
    }
}
