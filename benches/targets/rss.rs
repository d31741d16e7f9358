//! P7: the resident memory of a real `pcmail-ctl serve` on the data dir P1 filled (1M mails,
//! 100k ledger rows, 100k jobs), after it has started, answered /metrics and run its
//! reconcilers a few times. Read from /proc (Linux).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::table::Row;

const BIN: &str = env!("CARGO_BIN_EXE_pcmail-ctl");

/// `VmRSS` and `VmHWM` (peak) of a process, in MiB.
pub fn memory(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

pub async fn run(data: &tempfile::TempDir, mails: u64) -> Vec<Row> {
    let mut serve = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--resync", "1s", "--data-dir"])
        .arg(data.path())
        .env("PCMAIL_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("serve");
    let mut line = String::new();
    BufReader::new(serve.stdout.take().expect("stdout")).read_line(&mut line).expect("address");
    let url = line.trim().rsplit(' ').next().unwrap_or_default().to_string();
    for _ in 0..5 {
        let _ = reqwest::get(format!("{url}/metrics")).await.and_then(|r| r.error_for_status());
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let measured = memory(serve.id());
    let _ = serve.kill();
    let _ = serve.wait();
    let Some((rss, peak)) = measured else {
        return vec![Row::note("P7", "serve RSS: not measured (no /proc)", "")];
    };
    vec![
        Row::at_most(
            "P7",
            format!("serve RSS with {mails} mails, after 5 resyncs and /metrics scrapes"),
            rss,
            150.0,
            "MiB",
        ),
        Row::note("", "peak RSS (VmHWM) of the same process", format!("{peak:.1} MiB")),
    ]
}
