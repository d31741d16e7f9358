//! End-to-end tests: a real `pcmail-ctl serve` process on 127.0.0.1:0, spoken to by the real
//! CLI and over raw HTTP. One test binary (link time dominates on small machines), one module
//! per area.

// A test binary throughout: its helpers state expectations as the tests do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backup;
mod botapi;
mod boundaries;
mod claude;
mod cli;
mod clock;
mod console;
mod corpus;
mod deploy;
mod disk;
mod doctor;
mod edge;
mod endurance;
mod faults;
mod golden;
mod habitat;
mod harness;
mod house;
mod jobs;
mod ledger;
mod load;
mod mail;
mod mcp;
mod monitoring;
mod noise;
mod operations;
mod outage;
mod pcside;
mod previous;
mod process;
mod progress;
mod replicas;
mod schema;
mod search;
mod security;
mod sheets;
/// The local stand-in for Google's Sheets API, shared with the store crate's tests.
#[path = "../../crates/store/tests/standin/sheets.rs"]
#[allow(dead_code)] // each includer uses part of it
mod standin;
use pcmail_store::sheets::auth as jwt;
mod specs;
mod telegram;
mod trust;
mod webhook;
