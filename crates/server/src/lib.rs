//! `pcmail-ctl serve`: the controller, its HTTP API and its authorization.
//!
//! This crate is the imperative shell around pcmail-core: handlers authenticate, load what a
//! planner needs through the store, call the planner and apply its writes. No rule of
//! DESIGN.md is decided here; look in pcmail-core for those.

mod api;
mod app;
mod auth;
mod conns;
mod console;
pub mod controller;
pub mod exec;
mod jobs;
mod leader;
mod ledger;
mod mailbox;
pub mod manifests;
mod metrics;
mod runtime;
mod specs;
mod tls;
mod wakeups;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use app::App;

/// The controller's clock, at the millisecond precision every store keeps, so that a value
/// answered now equals the same value read back later.
pub(crate) fn now() -> pcmail_core::Ts {
    chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 3)
}

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    /// `sqlite:PATH`; defaults to `sqlite:<data_dir>/pcmail.db`.
    pub store_url: Option<String>,
    pub listen: SocketAddr,
    /// Manifests applied at start, through the same path as `apply -f`.
    pub apply: Option<PathBuf>,
    /// Accept plain HTTP on a non-loopback address (C2).
    pub insecure_listen: bool,
    /// O1: serve HTTPS with this certificate chain and key (PEM), reloaded when they change.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// How often every reconciler runs even when nothing asked for it.
    pub resync: std::time::Duration,
    /// C1: the leader lease's duration; renewed three times within it.
    pub lease: std::time::Duration,
    /// E1: connections served at once (never more than the file limit allows).
    pub max_connections: usize,
    /// E1: how long a request's head may take, and an idle connection may stay.
    pub header_timeout: std::time::Duration,
    pub idle_timeout: std::time::Duration,
}

impl ServeConfig {
    /// `serve`'s defaults on `data_dir`, loopback on an ephemeral port: tests and tools set
    /// what differs with struct update syntax.
    pub fn on(data_dir: PathBuf) -> ServeConfig {
        ServeConfig {
            data_dir,
            store_url: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            apply: None,
            insecure_listen: false,
            tls: None,
            resync: std::time::Duration::from_secs(10),
            lease: std::time::Duration::from_secs(15),
            max_connections: 2048,
            header_timeout: std::time::Duration::from_secs(10),
            idle_timeout: std::time::Duration::from_secs(60),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0} without TLS: plain HTTP is allowed on loopback only; pass --tls-cert and --tls-key (or --insecure-listen behind a TLS proxy)"
    )]
    InsecureListen(SocketAddr),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
    #[error("data dir {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Store(#[from] pcmail_store::StoreError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("--apply {path}: {message}")]
    Apply { path: PathBuf, message: String },
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// Runs until `shutdown` resolves, then stops taking requests, wakes every long-poll and
/// returns once in-flight requests are answered.
pub async fn serve(
    config: ServeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if !config.listen.ip().is_loopback() && !config.insecure_listen && config.tls.is_none() {
        return Err(ServeError::InsecureListen(config.listen));
    }
    let certificate = match &config.tls {
        Some((cert, key)) => Some(tls::Certificate::load(cert, key)?),
        None => None,
    };
    let app = App::start(&config).await?;
    if let Some(path) = &config.apply {
        let files =
            manifests::read_path(path).map_err(|e| ServeError::Apply { path: path.clone(), message: e.to_string() })?;
        specs::apply(&app, files, false, crate::now())
            .await
            .map_err(|e| ServeError::Apply { path: path.clone(), message: e.to_string() })?;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen { addr: config.listen, source })?;
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let connections = conns::Settings {
        limit: pcmail_core::conns::limit(config.max_connections, conns::file_limit()),
        timeouts: pcmail_core::conns::Timeouts {
            header_ms: ms(config.header_timeout),
            idle_ms: ms(config.idle_timeout),
        },
    };
    let local = listener.local_addr()?;
    app.set_listen_addr(local);
    // Tests and scripts read this line to find a port chosen with :0.
    let scheme = if certificate.is_some() { "https" } else { "http" };
    println!("pcmail-ctl serve listening on {scheme}://{local}");
    tracing::info!(%local, data_dir = %config.data_dir.display(), connections = connections.limit, "serving");

    let controller = tokio::spawn(controller::run(app.clone()));
    let leader = tokio::spawn(leader::run(app.clone()));
    let stopping = app.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopping.begin_shutdown();
    });
    let acceptor = certificate.map(|c| {
        tokio::spawn(c.clone().watch(std::time::Duration::from_secs(2)));
        c.acceptor()
    });
    conns::serve(listener, api::router(app.clone()), connections, acceptor, app.watch_shutdown()).await;
    // The loop saw the same shutdown: it stops taking keys and finishes what it runs.
    for (task, name) in [(controller, "controller"), (leader, "leader lease")] {
        if let Err(e) = task.await {
            tracing::error!(error = %e, "{name} task failed");
        }
    }
    tracing::info!("stopped");
    Ok(())
}
