//! The PC side of pcmail: the API client, the local inbox cache, the poller (`agent`, `poll`),
//! Claude Code hooks, intents and pcmail's own Telegram channel, the MCP server, and installing
//! the agent as a service.
//!
//! Hooks read only the cache and never talk to the server (H1); the poller is the only part
//! that moves mail between the server and the cache. Rules live in pcmail-core (`present`,
//! `intent`, `agent`); this crate is their shell on the PC.

pub mod cache;
pub mod client;
pub mod doctor;
pub mod hooks;
pub mod install;
pub mod mail;
pub mod mcp;
pub mod spawn;
pub mod sync;
pub mod telegram;

/// The PC's clock, at the millisecond precision the cache keeps.
pub fn now() -> pcmail_core::Ts {
    chrono::SubsecRound::trunc_subsecs(chrono::Utc::now(), 3)
}
