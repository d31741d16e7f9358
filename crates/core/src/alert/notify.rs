//! M10: the bodies posted for alerts — Alertmanager webhook v4, Alertmanager's own
//! `/api/v2/alerts`, Discord and Slack. Pure: the notifier shell only posts them.

use serde_json::{Value, json};

use super::{Alert, AlertState};
use crate::Ts;
use crate::ids::sha256_hex;
use crate::manifest::spec::NotifyFormat;

/// Alertmanager's "zero time", used as `endsAt` of a firing alert in webhook payloads.
const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

fn labels(a: &Alert) -> serde_json::Map<String, Value> {
    let mut l = serde_json::Map::new();
    l.insert("alertname".into(), a.kind.alertname().into());
    l.insert("kind".into(), a.kind.as_str().into());
    l.insert("subject".into(), a.subject.clone().into());
    l.insert("source".into(), "pcmail".into());
    l.insert("severity".into(), super::severity(a).into());
    for (k, v) in &a.labels {
        l.insert(k.clone(), v.clone().into());
    }
    l
}

fn annotations(a: &Alert) -> serde_json::Map<String, Value> {
    [("summary".to_string(), Value::from(a.summary.clone()))].into_iter().collect()
}

/// O6: what every one of `maps` holds alike (Alertmanager's `commonLabels` and
/// `commonAnnotations`).
fn common(maps: &[serde_json::Map<String, Value>]) -> Value {
    let Some((first, rest)) = maps.split_first() else { return json!({}) };
    let shared = first.iter().filter(|(k, v)| rest.iter().all(|m| m.get(*k) == Some(v)));
    Value::Object(shared.map(|(k, v)| (k.clone(), v.clone())).collect())
}

fn status(a: &Alert) -> &'static str {
    match a.state {
        AlertState::Resolved => "resolved",
        AlertState::Firing | AlertState::Notice => "firing",
    }
}

fn ends_at(a: &Alert) -> String {
    match (a.state, a.resolved_at) {
        (AlertState::Resolved, Some(t)) => t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        _ => ZERO_TIME.into(),
    }
}

/// The body for a webhook of `format` carrying `alerts` (all of them in one post).
pub fn webhook_body(format: NotifyFormat, alerts: &[Alert], external_url: &str) -> Value {
    match format {
        NotifyFormat::Alertmanager | NotifyFormat::AlertmanagerApi => {
            let any_firing = alerts.iter().any(|a| a.state != AlertState::Resolved);
            let all_labels: Vec<_> = alerts.iter().map(labels).collect();
            let all_annotations: Vec<_> = alerts.iter().map(annotations).collect();
            let items: Vec<Value> = alerts
                .iter()
                .map(|a| {
                    json!({
                        "status": status(a),
                        "labels": labels(a),
                        "annotations": annotations(a),
                        "startsAt": a.firing_since.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                        "endsAt": ends_at(a),
                        "generatorURL": external_url,
                        "fingerprint": &sha256_hex(&format!("{}/{}", a.kind, a.subject))[..16],
                    })
                })
                .collect();
            json!({
                "version": "4",
                "groupKey": "{}:{source=\"pcmail\"}",
                "truncatedAlerts": 0,
                "status": if any_firing { "firing" } else { "resolved" },
                "receiver": "pcmail",
                "groupLabels": {"source": "pcmail"},
                "commonLabels": common(&all_labels),
                "commonAnnotations": common(&all_annotations),
                "externalURL": external_url,
                "alerts": items,
            })
        }
        NotifyFormat::Discord => json!({"content": chat_text(alerts, 2000)}),
        NotifyFormat::Slack => json!({"text": chat_text(alerts, 40_000)}),
    }
}

/// The array Alertmanager's `POST /api/v2/alerts` takes. Firing alerts are re-sent while they
/// fire with an `endsAt` a few resend periods ahead; resolved ones carry their resolve time.
pub fn alertmanager_api_body(alerts: &[Alert], external_url: &str, now: Ts, hold: chrono::TimeDelta) -> Value {
    let fmt = |t: Ts| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    Value::Array(
        alerts
            .iter()
            .map(|a| {
                let ends = match a.state {
                    AlertState::Resolved => a.resolved_at.unwrap_or(now),
                    AlertState::Firing | AlertState::Notice => now + hold,
                };
                json!({
                    "labels": labels(a),
                    "annotations": annotations(a),
                    "startsAt": fmt(a.firing_since),
                    "endsAt": fmt(ends),
                    "generatorURL": external_url,
                })
            })
            .collect(),
    )
}

/// One line per alert, cut to `max` characters in all (Discord allows 2000).
pub fn chat_text(alerts: &[Alert], max: usize) -> String {
    let mut out = String::new();
    for (i, a) in alerts.iter().enumerate() {
        let mark = match a.state {
            AlertState::Firing => "FIRING",
            AlertState::Resolved => "RESOLVED",
            AlertState::Notice => "NEW",
        };
        let line = match super::severity(a) {
            "critical" => format!("[{mark} critical urgency=urgent] {}: {}\n", a.kind, a.summary),
            _ => format!("[{mark}] {}: {}\n", a.kind, a.summary),
        };
        if out.chars().count() + line.chars().count() > max.saturating_sub(40) {
            out += &format!("… and {} more\n", alerts.len() - i);
            break;
        }
        out += &line;
    }
    out.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::super::{AlertKind, AlertState};
    use super::*;
    use crate::mail::fixtures::at;

    fn alert(state: AlertState) -> Alert {
        Alert {
            kind: AlertKind::Undelivered,
            subject: "mail--00000001".into(),
            state,
            summary: "mail--00000001 to pc2 not delivered for 31m".into(),
            labels: [("to".to_string(), "pc2".to_string())].into(),
            firing_since: at(0),
            resolved_at: (state == AlertState::Resolved).then(|| at(60)),
            notified: None,
            last_sent_at: None,
            updated_at: at(0),
        }
    }

    #[test]
    fn m10_alertmanager_webhook_v4_shape() {
        let body = webhook_body(NotifyFormat::Alertmanager, &[alert(AlertState::Firing)], "http://pcmail");
        assert_eq!(body["version"], "4");
        assert_eq!(body["status"], "firing");
        let a = &body["alerts"][0];
        assert_eq!(
            (a["status"].as_str(), a["labels"]["alertname"].as_str()),
            (Some("firing"), Some("PcmailMailUndelivered"))
        );
        assert_eq!(a["labels"]["severity"], "warning");
        assert_eq!(a["labels"]["to"], "pc2");
        assert_eq!(a["endsAt"], ZERO_TIME);
        let resolved = webhook_body(NotifyFormat::Alertmanager, &[alert(AlertState::Resolved)], "http://pcmail");
        assert_eq!(resolved["status"], "resolved");
        assert_eq!(resolved["alerts"][0]["endsAt"], "1970-01-01T00:01:00.000Z");
        assert_eq!(resolved["alerts"][0]["fingerprint"], a["fingerprint"], "same alert, same fingerprint");
    }

    #[test]
    fn o6_common_labels_are_what_every_alert_of_the_post_shares_and_urgent_is_critical() {
        let one = webhook_body(NotifyFormat::Alertmanager, &[alert(AlertState::Firing)], "");
        assert_eq!(one["commonLabels"], one["alerts"][0]["labels"], "a one-alert post shares all its labels");
        assert_eq!(one["commonAnnotations"], one["alerts"][0]["annotations"]);
        let mut urgent = alert(AlertState::Firing);
        urgent.subject = "mail--00000002".into();
        urgent.summary = "another".into();
        urgent.labels.insert("urgency".into(), "urgent".into());
        let two = webhook_body(NotifyFormat::Alertmanager, &[alert(AlertState::Firing), urgent], "");
        assert_eq!(two["alerts"][1]["labels"]["severity"], "critical");
        assert_eq!(
            two["commonLabels"],
            json!({"alertname": "PcmailMailUndelivered", "kind": "undelivered", "source": "pcmail", "to": "pc2"})
        );
        assert_eq!(two["commonAnnotations"], json!({}));
    }

    #[test]
    fn o6_pcmail_alertnames_are_never_the_prometheus_rules_ones() {
        let rules = include_str!("../../../../manifests/prometheus/pcmail-rules.yaml");
        let names: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(str::trim).collect();
        assert!(names.len() >= 5, "{names:?}");
        for kind in super::super::AlertKind::ALL {
            assert!(!names.contains(&kind.alertname()), "{} is also a Prometheus rule", kind.alertname());
        }
    }

    #[test]
    fn m10_discord_and_slack_bodies_carry_one_line_per_alert() {
        let alerts = [alert(AlertState::Firing), alert(AlertState::Resolved)];
        let d = webhook_body(NotifyFormat::Discord, &alerts, "");
        let text = d["content"].as_str().unwrap_or_default();
        assert!(text.starts_with("[FIRING] undelivered: mail--00000001") && text.contains("\n[RESOLVED]"), "{text}");
        assert_eq!(webhook_body(NotifyFormat::Slack, &alerts, "")["text"], d["content"]);
        let many: Vec<Alert> = (0..200).map(|_| alert(AlertState::Firing)).collect();
        let cut = chat_text(&many, 2000);
        assert!(cut.chars().count() <= 2000 && cut.ends_with("more"), "{}", cut.len());
    }

    #[test]
    fn o6_urgent_alerts_are_critical_with_their_urgency_in_every_format() {
        let mut urgent = alert(AlertState::Firing);
        urgent.labels.insert("urgency".into(), "urgent".into());
        let both = [urgent, alert(AlertState::Firing)];
        for format in [NotifyFormat::Alertmanager, NotifyFormat::AlertmanagerApi] {
            let body = webhook_body(format, &both, "");
            let labels = &body["alerts"][0]["labels"];
            assert_eq!((labels["severity"].as_str(), labels["urgency"].as_str()), (Some("critical"), Some("urgent")));
            assert_eq!(body["alerts"][1]["labels"]["severity"], "warning");
        }
        let api = alertmanager_api_body(&both, "", at(0), chrono::TimeDelta::seconds(60));
        assert_eq!(
            (api[0]["labels"]["severity"].as_str(), api[1]["labels"]["severity"].as_str()),
            (Some("critical"), Some("warning"))
        );
        for format in [NotifyFormat::Discord, NotifyFormat::Slack] {
            let body = webhook_body(format, &both, "");
            let text = body["content"].as_str().or(body["text"].as_str()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            assert!(lines[0].starts_with("[FIRING critical urgency=urgent] undelivered"), "{text}");
            assert!(lines[1].starts_with("[FIRING] undelivered"), "{text}");
        }
    }

    #[test]
    fn m10_alertmanager_api_resends_with_ends_at_ahead_and_resolves_with_its_time() {
        let body = alertmanager_api_body(
            &[alert(AlertState::Firing), alert(AlertState::Resolved)],
            "",
            at(100),
            chrono::TimeDelta::seconds(300),
        );
        assert_eq!(body[0]["endsAt"], "1970-01-01T00:06:40.000Z");
        assert_eq!(body[1]["endsAt"], "1970-01-01T00:01:00.000Z");
    }
}
