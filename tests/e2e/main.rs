//! End-to-end tests: a real `pcmail-ctl serve` process on 127.0.0.1:0, spoken to by the real
//! CLI and over raw HTTP. One test binary (link time dominates on small machines), one module
//! per area.

mod deploy;
mod harness;
mod jobs;
mod ledger;
mod mail;
mod monitoring;
mod pcside;
mod replicas;
mod security;
mod specs;
mod webhook;
