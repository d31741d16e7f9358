//! P4 and P5, on real processes. P4: send → delivered through long-polls, 50 agents, loopback:
//! the latency from the start of a send to the moment the recipient's poll answers with it.
//! P5: `pcmail-ctl hook session-start` over a cache of 10k mails, the whole process, as Claude
//! Code runs it.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pcmail_agent::cache::Cache;
use pcmail_core::mail::{Mail, MailKind, MailState};

/// The binary measured: this build's, or another (`PCMAIL_BENCH_BIN`) to compare builds.
pub fn bin() -> String {
    std::env::var("PCMAIL_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_pcmail-ctl").to_string())
}
const AGENTS: usize = 50;
const MAILS: usize = 1000;

use crate::table::{Row, percentile as pct};

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A real `serve` on a scratch data dir with one Roster applied.
pub struct Serve {
    child: Child,
    pub url: String,
    admin: String,
    http: reqwest::Client,
    pub dir: tempfile::TempDir,
}

impl Serve {
    /// `machines` are the Roster's labels; the first is its owner.
    pub fn start(machines: &[String]) -> Serve {
        Serve::start_with(machines, "", &[])
    }

    /// As [`Serve::start`], with more manifests and `serve` flags.
    pub fn start_with(machines: &[String], manifests: &str, args: &[&str]) -> Serve {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut roster = format!(
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {{name: bench}}\nspec:\n  owner: {}\n  machines:\n",
            machines[0]
        );
        for (i, m) in machines.iter().enumerate() {
            roster += &format!("  - {{number: {}, label: {m}}}\n", i + 1);
        }
        if !manifests.is_empty() {
            roster = format!("{roster}---\n{manifests}");
        }
        std::fs::write(dir.path().join("roster.yaml"), roster).expect("roster");
        let mut child = Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .arg("--apply")
            .arg(dir.path().join("roster.yaml"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("PCMAIL_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("serve");
        let line = BufReader::new(child.stdout.take().expect("stdout")).lines().next().expect("line").expect("line");
        let url = line.rsplit(' ').next().expect("url").to_string();
        let admin = std::fs::read_to_string(dir.path().join("data/admin.token")).expect("admin").trim().to_string();
        Serve { child, url, admin, http: reqwest::Client::new(), dir }
    }

    pub async fn token(&self, machine: &str) -> String {
        let v: serde_json::Value = self
            .http
            .post(format!("{}/api/v1/tokens", self.url))
            .bearer_auth(&self.admin)
            .json(&serde_json::json!({"machine": machine}))
            .send()
            .await
            .expect("token")
            .json()
            .await
            .expect("json");
        v["token"].as_str().expect("token").to_string()
    }
}

impl Serve {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn admin(&self) -> &str {
        &self.admin
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn p4() -> Vec<Row> {
    let mut machines = vec!["sender".to_string()];
    machines.extend((0..AGENTS).map(|i| format!("agent{i:02}")));
    let serve = Serve::start(&machines);
    let (http, url) = (serve.http.clone(), serve.url.clone());
    let sender = serve.token("sender").await;
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let t = serve.token(&format!("agent{i:02}")).await;
        let (http, url, sent, latencies) = (http.clone(), url.clone(), sent.clone(), latencies.clone());
        agents.push(tokio::spawn(async move {
            let mut cursor = 0i64;
            let mut received = 0;
            while received < MAILS / AGENTS {
                let Ok(resp) =
                    http.get(format!("{url}/api/v1/poll?cursor={cursor}&wait=30s")).bearer_auth(&t).send().await
                else {
                    continue;
                };
                let now = Instant::now();
                let v: serde_json::Value = resp.json().await.expect("poll json");
                cursor = v["cursor"].as_i64().unwrap_or(cursor);
                for m in v["mail"].as_array().cloned().unwrap_or_default() {
                    let id = m["id"].as_str().unwrap_or_default().to_string();
                    if let Some(start) = sent.lock().expect("lock").get(&id) {
                        latencies.lock().expect("lock").push(now - *start);
                    }
                    received += 1;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for n in 0..MAILS {
        let id = format!("mail--{:08x}", 0x1000_0000 + n);
        sent.lock().expect("lock").insert(id.clone(), Instant::now());
        let body =
            serde_json::json!({"id": id, "to": format!("agent{:02}", n % AGENTS), "subject": "bench", "body": "ping"});
        let r = http.post(format!("{url}/api/v1/mail")).bearer_auth(&sender).json(&body).send().await.expect("send");
        assert!(r.status().is_success(), "send failed: {}", r.status());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for a in agents {
        let _ = tokio::time::timeout(Duration::from_secs(60), a).await;
    }
    drop(serve);
    let mut l = latencies.lock().expect("lock").clone();
    eprintln!("P4: {} of {MAILS} mails timed across {AGENTS} long-polling agents", l.len());
    vec![
        Row::time(
            "P4",
            format!("send → delivered via long-poll, {AGENTS} agents, p99"),
            pct(&mut l, 0.99),
            Duration::from_millis(50),
        ),
        Row::note("", "p50 and max of the same mails", format!("{}, {}", ms(pct(&mut l, 0.5)), ms(pct(&mut l, 1.0)))),
    ]
}

/// `hook session-start` over a cache of `mails` open mails: the median and p99 of 60 runs.
fn hook_times(mails: u32) -> (Duration, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let now = pcmail_agent::now();
    let mut cache = Cache::open(dir.path(), Duration::from_secs(5)).expect("cache");
    let kinds = [MailKind::Note, MailKind::Request, MailKind::Decision, MailKind::Work, MailKind::Answer];
    for chunk in (0..mails).collect::<Vec<_>>().chunks(10_000) {
        let batch: Vec<Mail> = chunk
            .iter()
            .map(|&n| Mail {
                seq: i64::from(n),
                kind: kinds[n as usize % kinds.len()],
                subject: format!("件名 {n}"),
                body: "本文のテキスト ".repeat(20),
                urgent: n % 13 == 0,
                state: MailState::Delivered,
                reply_to: (n % 5 == 4).then(|| "mail--ffffffff".to_string()),
                ..Mail::new(
                    format!("mail--{n:08x}"),
                    "desk".into(),
                    "me".into(),
                    now - chrono::TimeDelta::seconds(i64::from(n)),
                    now + chrono::TimeDelta::days(3),
                )
            })
            .collect();
        cache.merge_polled("me", batch, i64::from(mails), now).expect("fill");
    }
    cache.set_state(&[("machine", "me".into()), ("last_poll_at", now.timestamp_millis().to_string())]).expect("state");
    drop(cache);
    let mut times = Vec::new();
    for i in 0..60 {
        let started = Instant::now();
        let mut child = Command::new(bin())
            .args(["hook", "session-start"])
            .env("PCMAIL_HOME", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("hook");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(format!("{{\"session_id\": \"bench-{i}\"}}").as_bytes())
            .expect("stdin");
        let out = child.wait_with_output().expect("hook");
        times.push(started.elapsed());
        assert!(out.status.success() && (mails == 0 || !out.stdout.is_empty()), "the hook answered");
    }
    (pct(&mut times, 0.5), pct(&mut times, 0.99))
}

/// P5: the hook's whole process over 10k and 100k cached mails, each against the same hook on
/// an empty cache in the same run.
pub fn p5() -> Vec<Row> {
    let (empty, empty_p99) = hook_times(0);
    let mut rows = vec![Row::note(
        "P5",
        "hook session-start, empty cache, whole process: median, p99 of 60",
        format!("{}, {}", ms(empty), ms(empty_p99)),
    )];
    for mails in [10_000, 100_000] {
        let (median, p99) = hook_times(mails);
        rows.push(Row::note(
            "",
            format!("the same over {}k cached mails: median, p99", mails / 1000),
            format!("{}, {}", ms(median), ms(p99)),
        ));
        rows.push(Row::at_most(
            "",
            format!("{}k ÷ empty, medians", mails / 1000),
            median.as_secs_f64() / empty.as_secs_f64(),
            2.0,
            "×",
        ));
    }
    rows
}
