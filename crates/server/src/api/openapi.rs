//! The OpenAPI document as served: `openapi.json` as committed, with every `"x-pcmail-enum":
//! NAME` filled in as an `enum` from the core's declaration of that model enum (R2), so the
//! document cannot list a state or kind the server does not have.

use std::sync::LazyLock;

use pcmail_core::agent::QueuedCall;
use pcmail_core::alert::{AlertKind, AlertState};
use pcmail_core::jobs::JobState;
use pcmail_core::ledger::RowState;
use pcmail_core::mail::{Action, MailKind, MailState};
use serde_json::Value;

/// The description as committed: everything but the model's enums.
const COMMITTED: &str = include_str!("openapi.json");

/// The wire names an `x-pcmail-enum` marker stands for, or None for a name the core lacks.
fn model_enum(name: &str) -> Option<Vec<&'static str>> {
    Some(match name {
        "mail-state" => MailState::NAMES.to_vec(),
        "mail-kind" => MailKind::NAMES.to_vec(),
        "mail-action" => Action::NAMES.to_vec(),
        "sendable-mail-kind" => MailKind::ALL.into_iter().filter(|k| k.can_be_sent()).map(MailKind::as_str).collect(),
        "alert-kind" => AlertKind::NAMES.to_vec(),
        "alert-state" => AlertState::NAMES.to_vec(),
        "job-state" => JobState::NAMES.to_vec(),
        "ledger-state" => RowState::NAMES.to_vec(),
        "queued-call" => QueuedCall::NAMES.to_vec(),
        "search-scope" => pcmail_core::search::Scope::NAMES.to_vec(),
        _ => return None,
    })
}

/// Fills every marker under `v`; the names of markers the core does not know.
fn fill(v: &mut Value, unknown: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(name) = map.get("x-pcmail-enum").and_then(Value::as_str).map(str::to_string) {
                match model_enum(&name) {
                    Some(names) => {
                        map.insert("enum".into(), names.into_iter().map(Value::from).collect());
                    }
                    None => unknown.push(name),
                }
            }
            map.values_mut().for_each(|v| fill(v, unknown));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| fill(v, unknown)),
        _ => {}
    }
}

/// The committed document with its markers filled, and the marker names the core lacks.
fn generate() -> (String, Vec<String>) {
    let mut unknown = Vec::new();
    let Ok(mut doc) = serde_json::from_str::<Value>(COMMITTED) else {
        // The committed file is a test-held constant; served as it is if it ever failed to parse.
        return (COMMITTED.to_string(), unknown);
    };
    fill(&mut doc, &mut unknown);
    (serde_json::to_string_pretty(&doc).unwrap_or_else(|_| COMMITTED.to_string()), unknown)
}

static SERVED: LazyLock<String> = LazyLock::new(|| generate().0);

/// The OpenAPI 3.1 description of the HTTP API, served at `/api/v1/openapi.json`.
pub fn document() -> &'static str {
    SERVED.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enums(v: &Value, at: String, out: &mut Vec<(String, Vec<String>)>) {
        match v {
            Value::Object(map) => {
                if let Some(Value::Array(names)) = map.get("enum") {
                    let names = names.iter().filter_map(Value::as_str).map(str::to_string).collect();
                    out.push((at.clone(), names));
                }
                map.iter().for_each(|(k, v)| enums(v, format!("{at}/{k}"), out));
            }
            Value::Array(items) => items.iter().enumerate().for_each(|(i, v)| enums(v, format!("{at}/{i}"), out)),
            _ => {}
        }
    }

    #[test]
    fn r2_the_served_openapi_enums_are_the_cores_and_none_is_written_out() {
        let (served, unknown) = generate();
        assert!(unknown.is_empty(), "markers the core does not declare: {unknown:?}");
        let doc: Value = serde_json::from_str(&served).expect("the served document is JSON");
        let mut found = Vec::new();
        enums(&doc, String::new(), &mut found);
        let of = |at: &str| found.iter().find(|(p, _)| p.ends_with(at)).map(|(_, n)| n.clone()).unwrap_or_default();
        let sendable: Vec<&str> = MailKind::ALL.into_iter().filter(|k| k.can_be_sent()).map(MailKind::as_str).collect();
        assert_eq!(of("SendRequest/properties/kind"), sendable);
        assert!(!sendable.contains(&MailKind::Intent.as_str()) && sendable.contains(&MailKind::Note.as_str()));
        assert_eq!(of("Mail/properties/kind"), MailKind::NAMES);
        assert_eq!(of("Mail/properties/state"), MailState::NAMES);
        assert_eq!(of("RefusedCall/properties/action"), ["seen", "ack", "fail", "intent"]);
        assert_eq!(of("{step}/post/parameters/1/schema"), Action::NAMES, "the step route names the core's actions");
        let committed: Value = serde_json::from_str(COMMITTED).expect("committed JSON");
        let mut literal = Vec::new();
        enums(&committed, String::new(), &mut literal);
        let model: Vec<&str> = ["mail-state", "mail-kind", "sendable-mail-kind", "alert-kind", "alert-state"]
            .into_iter()
            .chain(["job-state", "ledger-state", "queued-call", "mail-action"])
            .flat_map(|m| model_enum(m).unwrap_or_default())
            .collect();
        for (at, names) in literal {
            assert!(!names.iter().any(|n| model.contains(&n.as_str())), "{at} writes a model enum out: {names:?}");
        }
        let states = found.iter().filter(|(p, _)| p.contains("parameters")).count();
        assert!(states >= 4, "the state filters of mail, alerts, jobs and ledger carry their enums ({found:?})");
    }
}
