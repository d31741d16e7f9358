//! DESIGN §11's targets P1–P14 in one run, printed as one table: figure, target, ratio.
//! Benchmarks print; they assert nothing (speed is never a test's assertion). P8 (Sheets API
//! calls per pass) is a count, held by the sheets adapter's tests. `MCP` is issue 11's push
//! latency (send → channel notification), beside them.
//!
//! `cargo bench` runs all but the soak run; `cargo bench -- P3 P7` runs some, `cargo bench --
//! SOAK` the soak run (`PCMAIL_SOAK_MINUTES`, 10 by default). `PCMAIL_BENCH_MAILS` shrinks P1,
//! P2, U3 and P7's 1M-mail data set (and its ledger rows and jobs, a tenth of it) and P14's for
//! a quick look (CI runs the suite with 100k); `PCMAIL_TEST_POSTGRES` is where P3 and P14's
//! PostgreSQL runs go, and what each target's flush checkpoints.

// A benchmark binary: a failed step ends the run with its message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod endurance;
mod jobs;
mod merge;
mod pcside;
mod push;
mod queue;
mod reconcile;
mod rss;
mod search;
mod table;
mod transfer;

use std::process::{Command, Stdio};

use table::Row;

/// The shipped binary's allocator, so the controller this process runs itself (P1, P2, P7's
/// and P14's data sets) runs as it ships; the other targets run the real `pcmail-ctl`.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The server `PCMAIL_TEST_POSTGRES` names (the local one by default).
pub fn postgres_admin() -> String {
    std::env::var("PCMAIL_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Flushes what earlier steps wrote, so that no step pays for another's writeback: PostgreSQL's
/// buffers and WAL by a `CHECKPOINT` (one an earlier step's WAL started runs on into the next
/// step), then the files by `sync`: P1 and P14 leave gigabytes dirty, and a writeback under
/// way shares the disk with the next step's fsyncs, by which P10, P11 and P13 are bound.
/// Answers whether the checkpoint ran (false when that server is unreachable).
pub fn flush_writes() -> bool {
    // Never a password prompt, and a server that does not answer is given up on (P3 and P14
    // say so in their rows).
    let checkpoint = Command::new("psql")
        .args([postgres_admin().as_str(), "-qXwc", "CHECKPOINT"])
        .env("PGCONNECT_TIMEOUT", "5")
        .stderr(Stdio::null())
        .status();
    assert!(Command::new("sync").status().expect("sync").success(), "sync");
    checkpoint.is_ok_and(|s| s.success())
}

#[tokio::main]
async fn main() {
    let asked: Vec<String> =
        std::env::args().skip(1).filter(|a| a.starts_with('P') || a == "MCP" || a == "SOAK").collect();
    let wants = |ids: &[&str]| asked.is_empty() || ids.iter().any(|id| asked.iter().any(|a| a == id));
    let mut rows: Vec<Row> = Vec::new();
    if wants(&["P1", "P2", "P7"]) {
        flush_writes();
        let (data, mut measured) = reconcile::run().await;
        if wants(&["P1", "P2"]) {
            rows.append(&mut measured);
        }
        if wants(&["P7"]) {
            rows.extend(rss::run(&data, reconcile::mails()).await);
        }
    }
    if wants(&["P3"]) {
        flush_writes();
        rows.extend(jobs::run().await);
    }
    if wants(&["P4"]) {
        flush_writes();
        rows.extend(pcside::p4().await);
    }
    if wants(&["P5"]) {
        flush_writes();
        rows.extend(pcside::p5());
    }
    if wants(&["P6"]) {
        flush_writes();
        rows.extend(merge::run());
    }
    if wants(&["MCP"]) {
        flush_writes();
        rows.extend(push::run().await);
    }
    if wants(&["P9"]) {
        flush_writes();
        rows.extend(queue::p9().await);
    }
    if wants(&["P10"]) {
        flush_writes();
        rows.extend(queue::p10().await);
    }
    if wants(&["P13"]) {
        flush_writes();
        rows.extend(search::p13().await);
    }
    if wants(&["P14"]) {
        flush_writes();
        rows.extend(transfer::p14().await);
    }
    if wants(&["P11"]) {
        flush_writes();
        rows.extend(endurance::p11().await);
    }
    if wants(&["P12"]) {
        flush_writes();
        rows.extend(endurance::p12().await);
    }
    // Minutes long: only when asked for by name.
    if asked.iter().any(|a| a == "SOAK") {
        rows.extend(endurance::soak().await);
    }
    table::print(&rows);
}
