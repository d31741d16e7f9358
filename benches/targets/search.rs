//! P13: sends per second on one connection with the search index filled behind them, ÷ the
//! same build with the indexer off (`serve --no-search-index`), same run; and how long after
//! the last send the index holds every mail (a mail is found at once either way: a search
//! reads what the index lacks row by row).

use std::time::{Duration, Instant};

use serde_json::json;

use crate::pcside::Serve;
use crate::table::Row;

/// Sends `n` mails one after another on one connection; answers sends per second.
async fn send_rate(http: &reqwest::Client, serve: &Serve, token: &str, n: usize) -> f64 {
    let started = Instant::now();
    for i in 0..n {
        let body = json!({"to": "rcpt", "subject": format!("bench {i} 請求書"), "body": "ping ".repeat(40)});
        let r = http.post(format!("{}/api/v1/mail", serve.url)).bearer_auth(token).json(&body).send().await;
        assert!(r.expect("send").status().is_success(), "send failed");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// The best of three rounds of 2,000 sends on one serve.
async fn rate(args: &[&str]) -> (f64, Serve) {
    let serve = Serve::start_with(&["sender".to_string(), "rcpt".to_string()], "", args);
    let sender = serve.token("sender").await;
    let http = reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client");
    send_rate(&http, &serve, &sender, 300).await;
    let mut best = 0f64;
    for _ in 0..3 {
        best = best.max(send_rate(&http, &serve, &sender, 2000).await);
    }
    (best, serve)
}

/// How long until a search says the index holds every mail.
async fn caught_up(serve: &Serve) -> Duration {
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        let r = http.get(format!("{}/api/v1/search?q=bench&in=mail&limit=1", serve.url)).bearer_auth(serve.admin());
        let v: serde_json::Value = r.send().await.expect("search").json().await.expect("json");
        if v["behind"].as_u64() == Some(0) || started.elapsed() > Duration::from_secs(30) {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub async fn p13() -> Vec<Row> {
    let (off, _off) = rate(&["--no-search-index"]).await;
    let (on, serve) = rate(&[]).await;
    let lag = caught_up(&serve).await;
    vec![
        Row::at_least("P13", "sends/s on one connection, search index on ÷ off, best of 3 × 2,000", on / off, 0.9, "×"),
        Row::note("", "sends/s: index off / on", format!("{off:.0} / {on:.0}")),
        Row::time("", "after the last send, until the index holds every mail", lag, Duration::from_secs(1)),
    ]
}
