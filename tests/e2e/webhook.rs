//! A local webhook receiver that records every post and answers as scripted: the stand-in for
//! Alertmanager, Discord or Slack (this machine cannot reach them).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;

#[derive(Debug, Clone)]
pub enum Answer {
    Status(u16, Option<u64>),
    Slow(Duration),
}

#[derive(Default)]
struct Shared {
    posts: Mutex<Vec<serde_json::Value>>,
    attempts: Mutex<usize>,
    script: Mutex<VecDeque<Answer>>,
}

pub struct Receiver {
    pub url: String,
    shared: Arc<Shared>,
    _runtime: tokio::runtime::Runtime,
}

impl Receiver {
    /// Answers the scripted responses in order, then 200 to everything.
    pub fn start(script: Vec<Answer>) -> Receiver {
        let shared = Arc::new(Shared { script: Mutex::new(script.into()), ..Default::default() });
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
        let app = axum::Router::new().route("/hook", axum::routing::post(hook)).with_state(shared.clone());
        runtime.spawn(async move { axum::serve(listener, app).await });
        Receiver { url, shared, _runtime: runtime }
    }

    /// Bodies of the posts that were answered 200.
    pub fn posts(&self) -> Vec<serde_json::Value> {
        self.shared.posts.lock().expect("lock").clone()
    }

    pub fn attempts(&self) -> usize {
        *self.shared.attempts.lock().expect("lock")
    }

    /// (alertname, subject, status) of every alert in every accepted post, in order.
    pub fn alerts(&self) -> Vec<(String, String, String)> {
        self.posts()
            .iter()
            .flat_map(|p| p["alerts"].as_array().cloned().unwrap_or_default())
            .map(|a| {
                let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                (s(&a["labels"]["alertname"]), s(&a["labels"]["subject"]), s(&a["status"]))
            })
            .collect()
    }
}

async fn hook(State(shared): State<Arc<Shared>>, _h: HeaderMap, body: axum::body::Bytes) -> axum::response::Response {
    *shared.attempts.lock().expect("lock") += 1;
    let next = shared.script.lock().expect("lock").pop_front();
    match next {
        Some(Answer::Status(code, retry_after)) => {
            let mut headers = HeaderMap::new();
            if let Some(s) = retry_after {
                headers.insert("retry-after", s.to_string().parse().expect("header"));
            }
            (StatusCode::from_u16(code).expect("status"), headers, "scripted failure").into_response()
        }
        Some(Answer::Slow(d)) => {
            tokio::time::sleep(d).await;
            (StatusCode::OK, "too late").into_response()
        }
        None => {
            let value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            shared.posts.lock().expect("lock").push(value);
            (StatusCode::OK, "ok").into_response()
        }
    }
}
