//! V4: the shape of every list verb's `-o json` (one envelope) and of `get KIND NAME -o json`
//! (the object itself), held by golden files under `tests/golden/`.
//!
//! A golden file is the document's shape, not its values: every string, number and bool is
//! replaced by its type (ids and timestamps are strings like any other), except the document's
//! `kind` and every `apiVersion`, kept as they are. Changes are additive (DESIGN V4): a field
//! the golden file has that the output lost, or whose type changed, fails; a new field passes.
//! `PCMAIL_UPDATE_GOLDEN=1` writes the files again from today's output.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use crate::harness::*;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The shape of `v`; `literal` keeps this string as it is (an `apiVersion`).
pub(crate) fn shape(v: &Value, literal: bool) -> Value {
    match v {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(s) if literal => json!(s),
        Value::String(_) => json!("string"),
        Value::Array(items) => {
            let merged = items.iter().map(|i| shape(i, false)).reduce(merge);
            Value::Array(merged.into_iter().collect())
        }
        Value::Object(map) => Value::Object(
            map.iter().map(|(k, v)| (k.clone(), shape(v, k == "apiVersion"))).collect::<Map<String, Value>>(),
        ),
    }
}

/// The union of two elements' shapes: every key either has; a null gives way to a type.
fn merge(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Object(mut a), Value::Object(b)) => {
            for (k, vb) in b {
                let va = a.remove(&k);
                a.insert(
                    k,
                    match va {
                        Some(va) => merge(va, vb),
                        None => vb,
                    },
                );
            }
            Value::Object(a)
        }
        (Value::Array(a), Value::Array(b)) => Value::Array(a.into_iter().chain(b).reduce(merge).into_iter().collect()),
        (a, b) if a == json!("null") => b,
        (a, _) => a,
    }
}

/// What `now` lost of `golden`'s shape, one line each (empty: compatible).
pub(crate) fn lost(golden: &Value, now: &Value, path: &str) -> Vec<String> {
    let null = json!("null");
    if golden == &null || now == &null {
        return vec![]; // an optional field, set in one run and not in the other
    }
    match (golden, now) {
        (Value::Object(g), Value::Object(n)) => g
            .iter()
            .flat_map(|(k, gv)| match n.get(k) {
                Some(nv) => lost(gv, nv, &format!("{path}.{k}")),
                None if gv == &null => vec![], // a field left out while it has no value
                None => vec![format!("{path}.{k} is gone")],
            })
            .collect(),
        (Value::Array(g), Value::Array(n)) => match (g.first(), n.first()) {
            (Some(gv), Some(nv)) => lost(gv, nv, &format!("{path}[]")),
            _ => vec![],
        },
        (g, n) if g == n => vec![],
        (g, n) => vec![format!("{path} was {g}, is now {n}")],
    }
}

/// Every list verb and `get` of every kind, on a server holding one of each thing.
fn documents(s: &Server) -> Vec<(String, Value)> {
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: default}\nspec: {undeliveredAfter: 1s}\n",
    )
    .expect("policy");
    ok(s.admin(&["apply", "-f", &policy.display().to_string()]));
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "golden", "--body", "b"]));
    ok(s.ctl(&desk, &["send", "--to", "builder", "--body", "nobody polls"]));
    ok(s.admin(&["ledger", "push", "--source", "manual", "--task", "write it", "--function", "summarize"]));
    ok(s.admin(&["jobs", "enqueue", "--queue", "default", "--function", "summarize", "--run-after", "1d"]));
    eventually(20, "an undelivered alert", || {
        let alerts = json(s.admin(&["alerts", "-o", "json"]));
        (!alerts["items"].as_array()?.is_empty()).then_some(())
    });
    let mut docs = vec![
        ("inbox".to_string(), json(s.ctl(&laptop, &["inbox", "-o", "json"]))),
        ("alerts".into(), json(s.admin(&["alerts", "-o", "json"]))),
        ("jobs-list".into(), json(s.admin(&["jobs", "list", "-o", "json"]))),
        ("ledger-list".into(), json(s.admin(&["ledger", "list", "-o", "json"]))),
    ];
    for kind in pcmail_core::manifest::Kind::ALL {
        let lower = kind.lower();
        let list = json(s.admin(&["get", &lower, "-o", "json"]));
        let name = list["items"][0]["metadata"]["name"].as_str().unwrap_or_else(|| panic!("a {lower}: {list}"));
        docs.push((format!("get-{lower}"), json(s.admin(&["get", &lower, name, "-o", "json"]))));
        docs.push((format!("get-{lower}-list"), list));
    }
    docs
}

#[test]
fn v4_every_list_verb_and_get_keep_the_shape_of_their_golden_files() {
    let s = Server::start();
    let update = std::env::var("PCMAIL_UPDATE_GOLDEN").is_ok_and(|v| v == "1");
    let mut problems = Vec::new();
    for (name, doc) in documents(&s) {
        let listing = doc.get("items").is_some();
        if listing {
            let kind = doc["kind"].as_str().unwrap_or_default();
            assert!(kind.ends_with("List") && doc["more"].is_u64(), "{name}: not the V4 envelope: {doc}");
        }
        // The envelope's kind and a spec object's kind are part of the shape.
        let mut now = shape(&doc, false);
        now["kind"] = doc["kind"].clone();
        let path = golden_dir().join(format!("{name}.json"));
        if update {
            std::fs::create_dir_all(golden_dir()).expect("golden dir");
            std::fs::write(&path, serde_json::to_string_pretty(&now).expect("json") + "\n").expect("write golden");
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            problems.push(format!("{name}: no {} (run with PCMAIL_UPDATE_GOLDEN=1)", path.display()));
            continue;
        };
        let golden: Value = serde_json::from_str(&text).expect("a golden file is JSON");
        problems.extend(lost(&golden, &now, &name));
    }
    assert!(
        problems.is_empty(),
        "V4: the output changed shape (PCMAIL_UPDATE_GOLDEN=1 to accept):\n{}",
        problems.join("\n")
    );
}

#[test]
fn v4_a_lost_field_or_a_changed_type_fails_and_a_new_field_passes() {
    let golden = shape(&json!({"kind": "JobList", "items": [{"id": "j", "at": null}], "more": 0}), false);
    let same = shape(&json!({"kind": "JobList", "items": [{"id": "k", "at": "2026"}], "more": 3}), false);
    assert_eq!(lost(&golden, &same, "d"), Vec::<String>::new());
    let added = shape(&json!({"kind": "JobList", "items": [{"id": "k", "new": 1}], "more": 0}), false);
    // (`at` was null in the golden file: an unset field left out is no change either)
    assert_eq!(lost(&golden, &added, "d"), Vec::<String>::new(), "additive is fine");
    let gone = shape(&json!({"kind": "JobList", "items": [{"at": null}]}), false);
    assert_eq!(lost(&golden, &gone, "d"), ["d.items[].id is gone", "d.more is gone"]);
    let retyped = shape(&json!({"kind": "JobList", "items": [{"id": 7}], "more": "0"}), false);
    assert_eq!(lost(&golden, &retyped, "d").len(), 2);
    let mut renamed = golden.clone();
    renamed["kind"] = json!("Jobs");
    let mut was = golden.clone();
    was["kind"] = json!("JobList");
    assert_eq!(lost(&was, &renamed, "d"), ["d.kind was \"JobList\", is now \"Jobs\""]);
}
