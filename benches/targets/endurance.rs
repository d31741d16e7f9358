//! P11, P12 and the soak run (DESIGN §13), on a real release `serve` over loopback.
//!
//! P11: sends per second on one connection, with no status wait parked and then with 500
//! parked (each on a mail of its own): a parked wait must cost a send nothing (E2).
//! P12: 1,000 agents long-polling and 50 senders: send → delivered latency, and serve's RSS.
//! SOAK (only when asked, `cargo bench -- SOAK`; `PCMAIL_SOAK_MINUTES`, 10 by default): agents,
//! senders, a worker pool and the pruner at short retention; each minute serve's RSS, open
//! files, database size and row counts, and at the end whether they stayed bounded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::pcside::Serve;
use crate::table::{Row, percentile as pct};

/// Lets this process hold the sockets a benchmark opens.
fn raise_file_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: reads and writes only the struct passed.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max.min(65_536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client")
}

async fn send(http: &reqwest::Client, url: &str, token: &str, to: &str) -> String {
    let body = json!({"to": to, "subject": "bench", "body": "ping"});
    let r = http.post(format!("{url}/api/v1/mail")).bearer_auth(token).json(&body).send().await.expect("send");
    assert!(r.status().is_success(), "send failed: {}", r.status());
    let v: serde_json::Value = r.json().await.expect("json");
    v["id"].as_str().unwrap_or_default().to_string()
}

/// Sends `n` mails one after another on one connection; answers sends per second.
async fn send_rate(http: &reqwest::Client, url: &str, token: &str, n: usize) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        send(http, url, token, "rcpt").await;
    }
    n as f64 / started.elapsed().as_secs_f64()
}

pub async fn p11() -> Vec<Row> {
    raise_file_limit();
    let serve = Serve::start(&["sender".to_string(), "rcpt".to_string()]);
    let sender = serve.token("sender").await;
    let rcpt = serve.token("rcpt").await;
    let http = client();
    // Warm up, then the rate with nothing parked, then with 500 waits parked, then without again.
    send_rate(&http, &serve.url, &sender, 300).await;
    let alone = send_rate(&http, &serve.url, &sender, 2000).await;
    let mut waits = Vec::new();
    for _ in 0..500 {
        let id = send(&http, &serve.url, &sender, "rcpt").await;
        let (url, rcpt) = (serve.url.clone(), rcpt.clone());
        waits.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            let _ = c.get(format!("{url}/api/v1/mail/{id}?waitFor=seen&timeout=60s")).bearer_auth(rcpt).send().await;
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let parked = send_rate(&http, &serve.url, &sender, 2000).await;
    let parked_still = waits.iter().filter(|w| !w.is_finished()).count();
    for w in waits {
        w.abort();
    }
    eprintln!("P11: {parked_still} of 500 waits still parked after the measured sends");
    vec![
        Row::at_least(
            "P11",
            "sends/s on one connection with 500 status waits parked ÷ with none",
            parked / alone,
            0.8,
            "×",
        ),
        Row::note("", "sends/s: none parked / 500 parked", format!("{alone:.0} / {parked:.0}")),
    ]
}

const P12_AGENTS: usize = 1000;
const P12_SENDERS: usize = 50;
const P12_MAILS_PER_SENDER: usize = 40;

pub async fn p12() -> Vec<Row> {
    raise_file_limit();
    let mut machines: Vec<String> = (0..P12_SENDERS).map(|i| format!("sender{i:02}")).collect();
    machines.extend((0..P12_AGENTS).map(|i| format!("agent{i:04}")));
    let serve = Serve::start(&machines);
    let url = serve.url.clone();
    let sent: Arc<Mutex<std::collections::HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let received = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut agents = Vec::new();
    for i in 0..P12_AGENTS {
        let token = serve.token(&format!("agent{i:04}")).await;
        let (url, sent, latencies, received, stop) =
            (url.clone(), sent.clone(), latencies.clone(), received.clone(), stop.clone());
        agents.push(tokio::spawn(async move {
            let http = client();
            let mut cursor = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(resp) =
                    http.get(format!("{url}/api/v1/poll?cursor={cursor}&wait=20s")).bearer_auth(&token).send().await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let now = Instant::now();
                let Ok(v) = resp.json::<serde_json::Value>().await else { continue };
                cursor = v["cursor"].as_i64().unwrap_or(cursor);
                for m in v["mail"].as_array().cloned().unwrap_or_default() {
                    let id = m["id"].as_str().unwrap_or_default().to_string();
                    if let Some(start) = sent.lock().expect("lock").get(&id) {
                        latencies.lock().expect("lock").push(now - *start);
                    }
                    received.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut senders = Vec::new();
    for s in 0..P12_SENDERS {
        let token = serve.token(&format!("sender{s:02}")).await;
        let (url, sent) = (url.clone(), sent.clone());
        senders.push(tokio::spawn(async move {
            let http = client();
            for n in 0..P12_MAILS_PER_SENDER {
                let to = format!("agent{:04}", (s * P12_MAILS_PER_SENDER + n * 7) % P12_AGENTS);
                let id = format!("mail--{:08x}", 0x2000_0000 + s * 10_000 + n);
                sent.lock().expect("lock").insert(id.clone(), Instant::now());
                let body = json!({"id": id, "to": to, "subject": "bench", "body": "ping"});
                let _ = http.post(format!("{url}/api/v1/mail")).bearer_auth(&token).json(&body).send().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
    }
    for s in senders {
        let _ = s.await;
    }
    let total = (P12_SENDERS * P12_MAILS_PER_SENDER) as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss = crate::rss::memory(serve.pid());
    stop.store(true, Ordering::Relaxed);
    for a in agents {
        a.abort();
    }
    let mut l = latencies.lock().expect("lock").clone();
    eprintln!("P12: {} of {total} mails timed across {P12_AGENTS} long-polling agents", l.len());
    let (rss, peak) = rss.unwrap_or_default();
    vec![
        Row::time(
            "P12",
            format!("send → delivered, {P12_AGENTS} long-polling agents + {P12_SENDERS} senders, p99"),
            pct(&mut l, 0.99),
            Duration::from_millis(20),
        ),
        Row::note(
            "",
            "p50 and max of the same mails",
            format!("{}, {}", crate::pcside::ms(pct(&mut l, 0.5)), crate::pcside::ms(pct(&mut l, 1.0))),
        ),
        Row::at_most("P12", "serve RSS with the 1,000 agents connected (peak)", rss, 200.0, "MiB"),
        Row::note("", "serve peak RSS (VmHWM)", format!("{peak:.1} MiB")),
    ]
}

/// One minute's reading of a running serve.
struct Reading {
    rss: f64,
    fds: usize,
    db_bytes: u64,
    rows: [u64; 4],
}

fn read(serve: &Serve) -> Reading {
    let rss = crate::rss::memory(serve.pid()).map_or(0.0, |m| m.0);
    let fds = std::fs::read_dir(format!("/proc/{}/fd", serve.pid())).map_or(0, |d| d.count());
    let data = serve.dir.path().join("data");
    let db_bytes = ["pcmail.db", "pcmail.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(data.join(f)).ok())
        .map(|m| m.len())
        .sum();
    let mut rows = [0u64; 4];
    if let Ok(db) =
        rusqlite::Connection::open_with_flags(data.join("pcmail.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
    {
        for (i, tab) in ["mail", "jobs", "events", "alerts"].iter().enumerate() {
            rows[i] = db.query_row(&format!("SELECT count(*) FROM {tab}"), [], |r| r.get(0)).unwrap_or(0);
        }
    }
    Reading { rss, fds, db_bytes, rows }
}

pub async fn soak() -> Vec<Row> {
    raise_file_limit();
    let minutes: u64 = std::env::var("PCMAIL_SOAK_MINUTES").ok().and_then(|m| m.parse().ok()).unwrap_or(10);
    const AGENTS: usize = 200;
    const SENDERS: usize = 50;
    let mut machines: Vec<String> = (0..SENDERS).map(|i| format!("sender{i:02}")).collect();
    machines.extend((0..AGENTS).map(|i| format!("agent{i:03}")));
    let manifests = "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: soak}\nspec: {retention: 30s, eventRetention: 30s}\n---\n\
         apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: noop}\nspec: {command: [\"true\"], mode: heavy}\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: soak}\nspec: {workers: 4, queues: [soak], retention: 30s}\n";
    let serve = Serve::start_with(&machines, manifests, &["--resync", "2s"]);
    let url = serve.url.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, acked, jobs) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for i in 0..AGENTS {
        let token = serve.token(&format!("agent{i:03}")).await;
        let (url, stop, acked) = (url.clone(), stop.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let http = client();
            let mut cursor = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let Ok(r) =
                    http.get(format!("{url}/api/v1/poll?cursor={cursor}&wait=20s")).bearer_auth(&token).send().await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let Ok(v) = r.json::<serde_json::Value>().await else { continue };
                cursor = v["cursor"].as_i64().unwrap_or(cursor);
                for m in v["mail"].as_array().cloned().unwrap_or_default() {
                    let id = m["id"].as_str().unwrap_or_default();
                    let _ = http.post(format!("{url}/api/v1/mail/{id}/ack")).bearer_auth(&token).send().await;
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for s in 0..SENDERS {
        let token = serve.token(&format!("sender{s:02}")).await;
        let (url, stop, sent) = (url.clone(), stop.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let http = client();
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let to = format!("agent{:03}", (s * 31 + n * 7) % AGENTS);
                if http
                    .post(format!("{url}/api/v1/mail"))
                    .bearer_auth(&token)
                    .json(&json!({"to": to, "body": "soak"}))
                    .send()
                    .await
                    .is_ok()
                {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }));
    }
    {
        let (url, stop, jobs, admin) = (url.clone(), stop.clone(), jobs.clone(), serve.admin().to_string());
        tasks.push(tokio::spawn(async move {
            let http = client();
            while !stop.load(Ordering::Relaxed) {
                let body = json!({"queue": "soak", "function": "noop"});
                if http.post(format!("{url}/api/v1/jobs")).bearer_auth(&admin).json(&body).send().await.is_ok() {
                    jobs.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    let mut readings = Vec::new();
    eprintln!("SOAK: {AGENTS} agents, {SENDERS} senders (2 mails/s each), 20 jobs/s, retention 30s, {minutes} min");
    eprintln!("| minute | RSS MiB | open files | db bytes | mail | jobs | events | alerts | sent | acked | jobs |");
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|");
    for minute in 1..=minutes {
        tokio::time::sleep(Duration::from_secs(60)).await;
        let r = read(&serve);
        eprintln!(
            "| {minute} | {:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.rss,
            r.fds,
            r.db_bytes,
            r.rows[0],
            r.rows[1],
            r.rows[2],
            r.rows[3],
            sent.load(Ordering::Relaxed),
            acked.load(Ordering::Relaxed),
            jobs.load(Ordering::Relaxed)
        );
        readings.push(r);
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.abort();
    }
    // Bounded: the second half's highest reading stays within 25% of the first half's (after
    // the first minute, which fills the retention window).
    let half = readings.len() / 2;
    let bounded = |f: &dyn Fn(&Reading) -> f64| {
        let max = |rs: &[Reading]| rs.iter().map(f).fold(0.0, f64::max);
        readings.len() < 3 || max(&readings[half..]) <= 1.25 * max(&readings[1..half.max(2)]).max(1.0)
    };
    let verdicts = [
        ("RSS", bounded(&|r| r.rss)),
        ("open files", bounded(&|r| r.fds as f64)),
        ("database bytes", bounded(&|r| r.db_bytes as f64)),
        ("rows", bounded(&|r| r.rows.iter().sum::<u64>() as f64)),
    ];
    let summary: Vec<String> =
        verdicts.iter().map(|(what, ok)| format!("{what} {}", if *ok { "bounded" } else { "GREW" })).collect();
    eprintln!("SOAK: {}", summary.join(", "));
    vec![Row::note("SOAK", format!("{minutes} min: 200 agents, 50 senders, a pool, retention 30s"), summary.join(", "))]
}
