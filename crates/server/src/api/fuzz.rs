//! Every API JSON body under fuzzing, against the real router on loopback: whatever arrives,
//! the answer is a 2xx or a 4xx with the one error shape, never a 5xx, and the server keeps
//! answering.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{MANIFEST_ROUTES, ROUTES};
use crate::config::ServeConfig;

/// The manifests the T5/T6 edge tests run against: a roster, a pool with an external worker,
/// a function and a ledger.
const OFFICE: &str = "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: desk\n  machines:\n  - {number: 1, label: desk}\n  - {number: 2, label: laptop}\n---\napiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: default}\nspec:\n  workers: 0\n  queues: [q]\n  externalWorkers: [laptop]\n  maxLease: 10m\n---\napiVersion: pcmail/v1\nkind: Function\nmetadata: {name: work}\nspec: {command: [\"true\"], mode: generate}\n---\napiVersion: pcmail/v1\nkind: Ledger\nmetadata: {name: office}\nspec: {project: office}\n";

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

/// A real router on loopback over a fresh data dir; answers its base URL and the admin token.
struct Served {
    rt: tokio::runtime::Runtime,
    base: String,
    admin: String,
    _dir: tempfile::TempDir,
}

fn serve() -> Served {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, admin) = rt.block_on(async {
        let config =
            ServeConfig { resync: std::time::Duration::from_secs(3600), ..ServeConfig::on(dir.path().to_path_buf()) };
        let app = crate::serve::start(&config).await.expect("start");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(async move { axum::serve(listener, crate::serve::router(app)).await });
        let token = std::fs::read_to_string(dir.path().join("admin.token")).expect("token").trim().to_string();
        (base, token)
    });
    Served { rt, base, admin, _dir: dir }
}

impl Served {
    /// `method path` with `body` as `token`: the status and the answer's text.
    fn call(&self, method: &str, path: &str, token: &str, body: Option<&Value>) -> (u16, String) {
        self.rt.block_on(async {
            let c = reqwest::Client::new();
            let url = format!("{}{path}", self.base);
            let mut req = match method {
                "GET" => c.get(url),
                "DELETE" => c.delete(url),
                _ => c.post(url),
            };
            if let Some(b) = body {
                req = req.json(b);
            }
            let resp = req.bearer_auth(token).send().await.expect("the server answers");
            let status = resp.status().as_u16();
            (status, resp.text().await.unwrap_or_default())
        })
    }

    fn post(&self, path: &str, token: &str, body: Value) -> (u16, String) {
        self.call("POST", path, token, Some(&body))
    }
}

#[test]
fn fuzz_c4_every_api_body_gets_a_2xx_or_a_clear_4xx_never_a_5xx() {
    let Served { rt, base, admin: token, _dir } = serve();
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

/// The edges T5 names, as JSON: 0, -1, 2^63, a huge number-like string and a huge string.
fn edges() -> Vec<Value> {
    vec![json!(0), json!(-1), json!(9_223_372_036_854_775_808u64), json!("9".repeat(40)), json!("x".repeat(100_000))]
}

#[test]
fn t5_every_duration_and_count_field_of_every_request_at_its_edges_is_a_2xx_or_a_4xx_naming_it() {
    let s = serve();
    let (status, answer) = s.post("/api/v1/apply", &s.admin, json!({"files": [{"name": "o.yaml", "content": OFFICE}]}));
    assert_eq!(status, 200, "{answer}");
    let (status, laptop) = s.post("/api/v1/tokens", &s.admin, json!({"machine": "laptop"}));
    assert_eq!(status, 200);
    let laptop: Value = serde_json::from_str(&laptop).expect("token");
    let laptop = laptop["token"].as_str().expect("token").to_string();
    let claim = json!({"queue": "q", "owner": "w", "lease": "30s", "limit": 1});
    let send = json!({"to": "desk", "subject": "s", "body": "b"});
    let enqueue = json!({"queue": "q", "function": "work"});
    let report = json!({"token": "t"});
    let cases: &[(&str, &Value, &str)] = &[
        ("/api/v1/jobs/claim", &claim, "limit"),
        ("/api/v1/jobs/claim", &claim, "lease"),
        ("/api/v1/jobs", &enqueue, "maxAttempts"),
        ("/api/v1/jobs", &enqueue, "runAfter"),
        ("/api/v1/jobs", &enqueue, "priority"),
        ("/api/v1/mail", &send, "ttl"),
        ("/api/v1/jobs/job-000000000000/heartbeat", &report, "lease"),
    ];
    for (path, base, field) in cases {
        for edge in edges() {
            let mut body = (*base).clone();
            body[*field] = edge.clone();
            let (status, answer) = s.post(path, &laptop, body);
            let shown = edge.to_string().chars().take(30).collect::<String>();
            assert!(status < 500, "{path} {field}={shown}: {status} {answer}");
            if status >= 400 && status != 404 {
                assert!(answer.contains(field), "{path} {field}={shown}: {status} does not name the field: {answer}");
            }
        }
    }
    // The values just past each bound, as durations: out of range, named, never an overflow.
    for (path, base, field, value) in [
        ("/api/v1/jobs/claim", &claim, "lease", "99999999d"),
        ("/api/v1/jobs/claim", &claim, "lease", "11m"),
        ("/api/v1/jobs/claim", &claim, "limit", "101"),
        ("/api/v1/jobs", &enqueue, "runAfter", "366d"),
        ("/api/v1/jobs", &enqueue, "maxAttempts", "101"),
        ("/api/v1/mail", &send, "ttl", "366d"),
    ] {
        let mut body = base.clone();
        body[field] = serde_json::from_str(value).unwrap_or_else(|_| json!(value));
        let (status, answer) = s.post(path, &laptop, body);
        assert_eq!(status, 422, "{path} {field}={value}: {answer}");
        assert!(answer.contains(&format!("{field} ")) && answer.contains("out of range"), "{answer}");
    }
}

#[test]
fn t5_every_duration_and_count_field_of_every_manifest_kind_at_its_edges_is_refused_naming_it() {
    let s = serve();
    let kinds: &[(&str, &str, &[&str])] = &[
        ("MailPolicy", "{}", &["ttl", "undeliveredAfter", "receiverDownAfter", "maxHop"]),
        ("IntentPolicy", "{}", &["remindAfter", "remindEvery", "escalateAfter"]),
        ("WorkerPool", "{workers: 1}", &["workers", "leaseDuration", "staleAfter", "maxAttempts", "maxLease"]),
        ("Function", "{command: [x], mode: generate}", &["timeout"]),
        ("Ledger", "{project: p}", &["viewCap"]),
    ];
    let before = s.call("GET", "/api/v1/specs", &s.admin, None).1;
    for (kind, base, fields) in kinds {
        for field in *fields {
            for edge in ["0", "-1", "9223372036854775808", &"9".repeat(40), &format!("\"{}\"", "x".repeat(100_000))] {
                let mut spec: serde_yaml_ng::Value = serde_yaml_ng::from_str(base).expect("spec");
                spec[*field] = serde_yaml_ng::from_str(edge).expect("edge");
                let spec = serde_yaml_ng::to_string(&spec).expect("yaml");
                let doc =
                    format!("apiVersion: pcmail/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec:\n{}", indent(&spec));
                let (status, answer) =
                    s.post("/api/v1/apply", &s.admin, json!({"files": [{"name": "m.yaml", "content": doc}]}));
                let shown = edge.chars().take(30).collect::<String>();
                assert!(status < 500, "{kind}.{field}={shown}: {status} {answer}");
                if status != 200 {
                    assert!(answer.contains(field), "{kind}.{field}={shown}: does not name the field: {answer}");
                } else {
                    let path = format!("/api/v1/specs/{}/x", kind.to_lowercase());
                    assert_eq!(s.call("DELETE", &path, &s.admin, None).0, 200, "{kind}.{field}={shown} was applied");
                }
            }
        }
    }
    assert_eq!(s.call("GET", "/api/v1/specs", &s.admin, None).1, before, "nothing invalid was stored");
}

fn indent(yaml: &str) -> String {
    yaml.lines().map(|l| format!("  {l}\n")).collect()
}

#[test]
fn t6_names_and_texts_are_refused_with_the_rule_named_and_metrics_stay_bounded() {
    let s = serve();
    let (status, answer) = s.post("/api/v1/apply", &s.admin, json!({"files": [{"name": "o.yaml", "content": OFFICE}]}));
    assert_eq!(status, 200, "{answer}");
    let as_desk = |path: &str, body: Value| {
        s.rt.block_on(async {
            let r = reqwest::Client::new()
                .post(format!("{}{path}", s.base))
                .bearer_auth(&s.admin)
                .header("x-pcmail-as", "desk")
                .json(&body)
                .send()
                .await
                .expect("answer");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    };
    for (field, subject, body, rule) in [
        ("subject", "a\0b", "b", "U+0000"),
        ("subject", "\u{202E}gnp.exe", "b", "U+202E"),
        ("subject", "one\u{2028}two", "b", "one line"),
        ("subject", "one\ntwo", "b", "one line"),
        ("body", "s", "pay \u{2066}now\u{2069}", "U+2066"),
        ("body", "s", "nul\0", "U+0000"),
    ] {
        let (status, answer) = as_desk("/api/v1/mail", json!({"to": "laptop", "subject": subject, "body": body}));
        assert_eq!(status, 422, "{field} {subject:?}: {answer}");
        assert!(answer.contains(field) && answer.contains(rule), "{answer}");
    }
    let (status, answer) = as_desk(
        "/api/v1/ledger/push",
        json!({"items": [{"source": "s", "task": "ok"}, {"source": "s", "task": "x\u{202D}"}]}),
    );
    assert_eq!(status, 422, "{answer}");
    assert!(answer.contains("items[1].task contains U+202D"), "{answer}");
    let series = |text: &str| text.lines().filter(|l| !l.starts_with('#')).count();
    let metrics = || {
        s.rt.block_on(async {
            reqwest::get(format!("{}/metrics", s.base)).await.expect("metrics").text().await.expect("text")
        })
    };
    let before = series(&metrics());
    for n in 0..300 {
        let (status, answer) = as_desk("/api/v1/jobs", json!({"queue": format!("q{n}"), "function": "work"}));
        assert_eq!(status, 422, "an undeclared queue is refused: {answer}");
        assert!(answer.contains("not declared by any WorkerPool"), "{answer}");
        let (status, _) = as_desk("/api/v1/jobs/claim", json!({"queue": format!("q{n}"), "owner": "w"}));
        assert_eq!(status, 422);
    }
    for bad in ["Q", "q q", "q/../x", "q\u{202E}", &"q".repeat(64)] {
        let (status, answer) = as_desk("/api/v1/jobs", json!({"queue": bad, "function": "work"}));
        assert_eq!(status, 422, "{bad:?}: {answer}");
        assert!(answer.contains("queue") && answer.contains("not a valid name"), "{answer}");
    }
    assert_eq!(series(&metrics()), before, "no series for queues nobody declared");
}
