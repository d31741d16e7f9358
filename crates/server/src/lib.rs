//! `pcmail-ctl serve`: the controller, its HTTP API and its authorization.
//!
//! This crate is the imperative shell around pcmail-core: handlers authenticate, load what a
//! planner needs through the store, call the planner and apply its writes. No rule of
//! DESIGN.md is decided here; look in pcmail-core for those.
//!
//! The modules are layers, each using only those declared above it (`tests/e2e/house.rs`
//! fails on a cycle): leaves, the shared state, services, the controller, the HTTP edge, and
//! `serve` at the top.

// Leaves: no other module of this crate below them but leaves.
mod clock;
mod config;
mod credentials;
mod error;
pub mod exec;
mod key;
pub mod manifests;
mod metrics;
mod random;
mod runtime;
#[cfg(target_os = "linux")]
mod spawner;
mod tls;
mod wakeups;
mod workqueue;

// The state every handler and task shares.
mod app;

// Services: each a use case over the store (ledger above jobs, whose ends it settles).
mod auth;
mod jobs;
mod leader;
mod ledger;
mod mailbox;
mod specs;

// The reconcile loop and the pools' workers.
pub mod controller;

// The HTTP edge.
mod api;
mod conns;
mod console;

mod serve;

pub use app::App;
pub use config::{ServeConfig, ServeError};
pub use serve::{serve, start};
