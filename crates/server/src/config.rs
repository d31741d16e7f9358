//! What `serve` is started with, and how start-up fails.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::tls;

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
    /// T15: how long a request's body may take (and it must keep 1 KiB/s after its first
    /// second), and how long a client may take to take an answer.
    pub body_timeout: std::time::Duration,
    pub write_timeout: std::time::Duration,
    /// E17: how long running pool jobs get to finish on SIGTERM before they are killed and
    /// handed back without spending an attempt.
    pub shutdown_grace: std::time::Duration,
    /// P13: fill the search index behind the writes, and on PostgreSQL build the search
    /// indexes a copy left out (off only for the benchmarks' baseline).
    pub search_index: bool,
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
            body_timeout: std::time::Duration::from_secs(30),
            write_timeout: std::time::Duration::from_secs(30),
            shutdown_grace: std::time::Duration::from_secs(30),
            search_index: true,
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
