//! A bounded load test on loopback: 200 agents long-polling and 50 senders for 60 s against
//! one `serve`. Every acknowledged send reaches its recipient exactly once, no request fails,
//! and the send → received latencies are printed (figures, not assertions).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::*;

const AGENTS: usize = 200;
const SENDERS: usize = 50;
const RUN: Duration = Duration::from_secs(60);
/// Each sender's pace: 50 senders × 4/s ≈ 200 mails a second.
const SEND_EVERY: Duration = Duration::from_millis(250);

fn roster(dir: &std::path::Path) -> std::path::PathBuf {
    let machines: String = (0..AGENTS).map(|i| format!("    - {{number: {}, label: m{i:03}}}\n", i + 1)).collect();
    let path = dir.join("roster.yaml");
    std::fs::write(
        &path,
        format!("apiVersion: pcmail/v1\nkind: Roster\nmetadata: {{name: load}}\nspec:\n  owner: m000\n  machines:\n{machines}"),
    )
    .expect("roster");
    path
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

#[test]
fn load_200_agents_50_senders_60s_lose_nothing_duplicate_nothing_and_fail_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start_opts(Some(roster(dir.path())), "127.0.0.1:0", &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    let admin = s.admin_token();
    let base = s.url.clone();
    let client = reqwest::Client::builder().pool_max_idle_per_host(512).build().expect("client");
    let tokens: Vec<String> = rt.block_on(async {
        let mut tokens = Vec::new();
        for i in 0..AGENTS {
            let r: serde_json::Value = client
                .post(format!("{base}/api/v1/tokens"))
                .bearer_auth(&admin)
                .json(&serde_json::json!({"machine": format!("m{i:03}")}))
                .send()
                .await
                .expect("issue")
                .json()
                .await
                .expect("json");
            tokens.push(r["token"].as_str().expect("token").to_string());
        }
        tokens
    });

    let started = Instant::now();
    let sent: Arc<Mutex<BTreeMap<String, (usize, Instant)>>> = Arc::default();
    let received: Arc<Mutex<Vec<(usize, String, Instant)>>> = Arc::default();
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for (me, token) in tokens.iter().enumerate() {
            let (client, base, token, received, errors) =
                (client.clone(), base.clone(), token.clone(), received.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut cursor = 0i64;
                // Poll until the run is over and a last short poll finds nothing more.
                while started.elapsed() < RUN + Duration::from_secs(5) {
                    let wait = if started.elapsed() < RUN { "10s" } else { "1s" };
                    let url = format!("{base}/api/v1/poll?cursor={cursor}&wait={wait}");
                    let answer = client.get(url).bearer_auth(&token).send().await;
                    let body: serde_json::Value = match answer {
                        Ok(r) if r.status().is_success() => r.json().await.unwrap_or_default(),
                        Ok(r) => {
                            errors.lock().expect("lock").push(format!("poll answered {}", r.status()));
                            continue;
                        }
                        Err(e) => {
                            errors.lock().expect("lock").push(format!("poll: {e}"));
                            continue;
                        }
                    };
                    let now = Instant::now();
                    for m in body["mail"].as_array().into_iter().flatten() {
                        received.lock().expect("lock").push((
                            me,
                            m["id"].as_str().unwrap_or_default().to_string(),
                            now,
                        ));
                    }
                    cursor = body["cursor"].as_i64().unwrap_or(cursor);
                }
            }));
        }
        for (sender, token) in tokens.iter().take(SENDERS).enumerate() {
            let (client, base, token, sent, errors) =
                (client.clone(), base.clone(), token.clone(), sent.clone(), errors.clone());
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(SEND_EVERY);
                let mut n = sender * 7919;
                while started.elapsed() < RUN {
                    tick.tick().await;
                    n = n.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    let to = (n >> 8) % AGENTS;
                    let at = Instant::now();
                    let answer = client
                        .post(format!("{base}/api/v1/mail"))
                        .bearer_auth(&token)
                        .json(&serde_json::json!({"to": format!("m{to:03}"), "subject": "load", "body": "b"}))
                        .send()
                        .await;
                    match answer {
                        Ok(r) if r.status().is_success() => {
                            let v: serde_json::Value = r.json().await.unwrap_or_default();
                            let id = v["id"].as_str().unwrap_or_default().to_string();
                            sent.lock().expect("lock").insert(id, (to, at));
                        }
                        Ok(r) => errors.lock().expect("lock").push(format!("send answered {}", r.status())),
                        Err(e) => errors.lock().expect("lock").push(format!("send: {e}")),
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
    });

    let errors = errors.lock().expect("lock").clone();
    assert!(errors.is_empty(), "{} requests failed, first: {:?}", errors.len(), errors.first());
    let sent = sent.lock().expect("lock").clone();
    let received = received.lock().expect("lock").clone();
    let by_id: BTreeMap<&str, (usize, Instant)> =
        received.iter().map(|(who, id, when)| (id.as_str(), (*who, *when))).collect();
    assert_eq!(by_id.len(), received.len(), "a mail was delivered twice");
    let mut latencies = Vec::new();
    for (id, (to, at)) in &sent {
        let (who, when) = by_id.get(id.as_str()).unwrap_or_else(|| panic!("{id} was acknowledged but never delivered"));
        assert_eq!(who, to, "{id} reached the wrong agent");
        latencies.push(when.duration_since(*at));
    }
    assert_eq!(received.len(), sent.len(), "nothing arrives that was not sent");
    latencies.sort();
    eprintln!(
        "load: {AGENTS} agents, {SENDERS} senders, {:?}: {} mails, send → received p50 {:?}, p99 {:?}, max {:?}",
        RUN,
        sent.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default()
    );
    assert!(sent.len() > 1000, "the senders sent ({})", sent.len());
}
