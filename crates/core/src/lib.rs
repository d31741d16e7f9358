//! pcmail's functional core: the model and every rule of DESIGN.md as pure functions.
//!
//! Nothing in this crate does IO, reads the clock or draws random numbers: time, ids and
//! randomness come in as arguments, so every rule is testable without a server, a clock or a
//! disk. The store adapters, the server and the CLI are the imperative shell around it.

pub mod agent;
pub mod alert;
pub mod api;
pub mod bounds;
pub mod certificate;
pub mod channel;
#[cfg(test)]
mod clock_jumps;
pub mod conns;
pub mod cron;
pub mod doctor;
pub mod duration;
pub mod exec;
pub mod health;
pub mod holding;
pub mod ids;
pub mod intent;
pub mod jobs;
pub mod lease;
pub mod ledger;
pub mod mail;
pub mod manifest;
pub mod names;
pub mod page;
pub mod permission;
pub mod present;
pub mod progress;
pub mod restore;
pub mod retention;
pub mod retry;
pub mod rfc3339;
pub mod roster;
pub mod search;
pub mod sheet;
pub mod telegram;
pub mod text;
pub mod throttle;
pub mod trail;
pub mod validate;
pub mod version;

/// Every timestamp in pcmail is UTC; RFC 3339 at the boundaries.
pub type Ts = chrono::DateTime<chrono::Utc>;
