//! Issue 11's bound, measured: a mail sent → its `notifications/claude/channel` line on the stdout
//! of a running `pcmail-ctl mcp` (its own poller long-polling, the push following the cache).
//! Not a DESIGN §11 target; the acceptance test holds the 1 s bound, this prints the figures.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::pcside::{Serve, bin, ms};
use crate::table::{Row, percentile as pct};

const MAILS: usize = 100;

pub async fn run() -> Vec<Row> {
    let serve = Serve::start(&["desk".to_string(), "pc".to_string()]);
    let (desk, pc) = (serve.token("desk").await, serve.token("pc").await);
    let home = serve.dir.path().join("pc-home");
    let ctl = |args: &[&str]| {
        let out = Command::new(bin()).args(args).env("PCMAIL_HOME", &home).output().expect("pcmail-ctl");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ctl(&["login", "--server", &serve.url, "--token", &pc]);
    ctl(&["poll"]);
    let mut mcp = Command::new(bin())
        .arg("mcp")
        .env("PCMAIL_HOME", &home)
        .env("PCMAIL_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("mcp");
    let mut stdin = mcp.stdin.take().expect("stdin");
    let (tx, pushes) = mpsc::channel();
    let stdout = mcp.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["method"] == pcmail_core::channel::METHOD && tx.send((Instant::now(), v)).is_err() {
                return;
            }
        }
    });
    for message in [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    ] {
        writeln!(stdin, "{message}").expect("write");
    }
    // Let the session's first poll set its starting point.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let http = reqwest::Client::new();
    let mut latencies = Vec::new();
    for n in 0..MAILS {
        let body = serde_json::json!({"to": "pc", "subject": "bench", "body": format!("push {n}")});
        let started = Instant::now();
        let r =
            http.post(format!("{}/api/v1/mail", serve.url)).bearer_auth(&desk).json(&body).send().await.expect("send");
        assert!(r.status().is_success(), "send failed: {}", r.status());
        let (at, push) = pushes.recv_timeout(Duration::from_secs(10)).expect("a push within 10 s");
        assert_eq!(push["params"]["content"], format!("bench\n\npush {n}"), "pushed in order, once");
        latencies.push(at - started);
    }
    let _ = mcp.kill();
    let _ = mcp.wait();
    vec![
        Row::time(
            "MCP",
            format!("send → channel push into the session, {MAILS} mails, p99"),
            pct(&mut latencies, 0.99),
            Duration::from_secs(1),
        ),
        Row::note(
            "",
            "p50 and max of the same mails",
            format!("{}, {}", ms(pct(&mut latencies, 0.5)), ms(pct(&mut latencies, 1.0))),
        ),
    ]
}
