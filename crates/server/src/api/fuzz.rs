//! Every API JSON body under fuzzing, against the real router on loopback: whatever arrives,
//! the answer is a 2xx or a 4xx with the one error shape, never a 5xx, and the server keeps
//! answering.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{MANIFEST_ROUTES, ROUTES};
use crate::{App, ServeConfig};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
        Just(json!("30s")),
        Just(json!("desk")),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("to".to_string()),
                    Just("queue".to_string()),
                    Just("function".to_string()),
                    Just("machine".to_string()),
                    Just("files".to_string()),
                    Just("items".to_string()),
                    Just("source".to_string()),
                    Just("token".to_string()),
                    Just("state".to_string()),
                    Just("project".to_string()),
                    ".{0,8}",
                ],
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body: JSON of any shape, or bytes that are not JSON (or not UTF-8) at all.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => proptest::collection::vec(any::<u8>(), 0..64),
    ]
}

#[test]
fn fuzz_c4_every_api_body_gets_a_2xx_or_a_clear_4xx_never_a_5xx() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, token) = rt.block_on(async {
        let config = ServeConfig {
            data_dir: dir.path().to_path_buf(),
            store_url: None,
            listen: "127.0.0.1:0".parse().expect("addr"),
            apply: None,
            insecure_listen: false,
            resync: std::time::Duration::from_secs(3600),
            lease: std::time::Duration::from_secs(15),
        };
        let app = App::start(&config).await.expect("start");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, super::router(app)).await });
        let token = std::fs::read_to_string(dir.path().join("admin.token")).expect("token").trim().to_string();
        (base, token)
    });
    let client = reqwest::Client::new();
    let posts: Vec<String> = ROUTES
        .iter()
        .chain(MANIFEST_ROUTES)
        .filter(|(m, _)| *m == "post")
        .map(|(_, p)| p.replace("{id}", "x").replace("{step}", "seen").replace("{action}", "complete"))
        .collect();
    assert!(posts.len() >= 15, "{posts:?}");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    for path in &posts {
        let outcome = runner.run(&body(), |bytes| {
            let (status, answer) = rt.block_on(async {
                let resp = client
                    .post(format!("{base}{path}"))
                    .bearer_auth(&token)
                    .header("content-type", "application/json")
                    .body(bytes.clone())
                    .send()
                    .await
                    .map_err(|e| TestCaseError::fail(format!("{path}: the server stopped answering: {e}")))?;
                let status = resp.status().as_u16();
                Ok::<_, TestCaseError>((status, resp.bytes().await.unwrap_or_default()))
            })?;
            prop_assert!(status < 500, "{path} answered {status}: {}", String::from_utf8_lossy(&answer));
            if status >= 400 {
                let error: Value = serde_json::from_slice(&answer)
                    .map_err(|_| TestCaseError::fail(format!("{path}: a {status} that is not JSON")))?;
                prop_assert!(
                    error["error"]["code"].is_string()
                        && error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
                    "{path}: {error}"
                );
            }
            Ok(())
        });
        if let Err(e) = outcome {
            panic!("{path}: {e}");
        }
    }
}
