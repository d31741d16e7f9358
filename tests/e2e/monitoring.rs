//! M9, M10 and §9 end to end: `serve` with SLAs of seconds, a real Prometheus scraping it, and
//! a local webhook receiver.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::harness::*;
use crate::webhook::{Answer, Receiver};

/// The example manifests with a MailPolicy of seconds that posts to `webhook`, in a folder for
/// `serve --apply` (so a restart re-applies the same policy).
pub fn manifests(webhook: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for f in ["roster.yaml", "work.yaml"] {
        std::fs::copy(examples().join(f), dir.path().join(f)).expect("copy example");
    }
    let text = format!(
        "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {{name: default}}\nspec:\n  ttl: 1h\n  undeliveredAfter: 2s\n  \
         unreadSla: {{urgent: 1h, normal: 1h}}\n  receiverDownAfter: 1h\n  \
         notify: {{webhook: \"{webhook}\", format: alertmanager, minInterval: 100ms}}\n"
    );
    std::fs::write(dir.path().join("policy.yaml"), text).expect("write policy");
    dir
}

struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/prometheus/pcmail-rules.yaml");
        let config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [\"{}\"]\n\
             scrape_configs:\n  - job_name: pcmail\n    static_configs: [{{targets: [\"{target}\"]}}]\n",
            rules.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("config");
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus must be installed (apt-get install prometheus; .ci/run does it)");
        let p = Prometheus { child, url: format!("http://127.0.0.1:{port}"), _dir: dir };
        eventually(30, "prometheus ready", || get(&format!("{}/-/ready", p.url)).filter(|(s, _)| *s == 200));
        p
    }

    /// The instant-query result vector for `expr`.
    fn query(&self, expr: &str) -> Vec<serde_json::Value> {
        let client = reqwest::blocking_free_get(&format!("{}/api/v1/query", self.url), &[("query", expr)]);
        client["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A blocking GET for a test that has no runtime of its own.
fn get(url: &str) -> Option<(u16, String)> {
    let rt = tokio::runtime::Runtime::new().ok()?;
    rt.block_on(async {
        let r = reqwest::get(url).await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    })
}

mod reqwest {
    pub use ::reqwest::*;

    /// GET with query parameters, answering the JSON body (Null on any failure).
    pub fn blocking_free_get(url: &str, query: &[(&str, &str)]) -> serde_json::Value {
        let Ok(rt) = tokio::runtime::Runtime::new() else { return serde_json::Value::Null };
        rt.block_on(async {
            let Ok(r) = Client::new().get(url).query(query).send().await else { return serde_json::Value::Null };
            r.json().await.unwrap_or(serde_json::Value::Null)
        })
    }
}

/// The states posted for the undelivered alert of `machine` (E18: one per machine).
pub fn undelivered(receiver: &Receiver, subject: &str) -> Vec<String> {
    receiver
        .alerts()
        .into_iter()
        .filter(|(name, s, _)| name == "PcmailMailUndelivered" && s == subject)
        .map(|(_, _, st)| st)
        .collect()
}

#[test]
fn m9_m10_undelivered_fires_once_resolves_once_across_sigkill_and_prometheus_sees_it() {
    let receiver = Receiver::start(vec![]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let m = manifests(&receiver.url);
    let mut s = Server::start_opts(Some(m.path().to_path_buf()), &listen, &["--resync", "300ms"]);
    let prom = Prometheus::start(&listen);
    let (desk, builder) = (s.token("desk"), s.token("builder"));

    let id = ok(s.ctl(&desk, &["send", "--to", "builder", "--subject", "nightly build", "--body", "go"]));
    eventually(20, "the firing notification", || (undelivered(&receiver, "builder") == ["firing"]).then_some(()));
    eventually(20, "pcmail_mail_undelivered in Prometheus", || {
        let r = prom.query("pcmail_mail_undelivered{to=\"builder\"}");
        r.first().and_then(|v| v["value"][1].as_str().map(String::from)).filter(|v| v == "1")
    });
    let alerts = json(s.admin(&["alerts", "-o", "json"]));
    assert_eq!(alerts["items"][0]["notified"], "firing", "the row records what was posted");
    assert!(alerts["items"][0]["summary"].as_str().is_some_and(|t| t.contains(&id)), "E18: it lists {id}: {alerts}");

    s.kill9();
    s.restart();
    s.await_passes("notify", 2);
    assert_eq!(undelivered(&receiver, "builder"), ["firing"], "a restart posts no duplicate");

    ok(s.ctl(&builder, &["poll"]));
    eventually(20, "the resolved notification", || {
        (undelivered(&receiver, "builder") == ["firing", "resolved"]).then_some(())
    });
    s.await_passes("notify", 2);
    assert_eq!(undelivered(&receiver, "builder"), ["firing", "resolved"], "each state posted exactly once");
    eventually(20, "the gauge back at 0", || {
        let r = prom.query("pcmail_mail_undelivered{to=\"builder\"}");
        r.first().and_then(|v| v["value"][1].as_str().map(String::from)).filter(|v| v == "0")
    });

    // Every PromQL expression of the dashboard returns a series from this Prometheus.
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/pcmail.json"))
            .expect("dashboard"),
    )
    .expect("dashboard json");
    assert_eq!(dashboard["templating"]["list"][0]["type"], "datasource");
    // O6: Grafana's import dialog asks for the Prometheus data source.
    assert_eq!(
        (dashboard["__inputs"][0]["type"].as_str(), dashboard["__inputs"][0]["pluginId"].as_str()),
        (Some("datasource"), Some("prometheus"))
    );
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().expect("expr").replace("$__rate_interval", "10s").replace("$__range", "1m"))
        .collect();
    assert!(exprs.len() >= 12);
    for expr in exprs {
        eventually(20, &format!("a series for {expr}"), || (!prom.query(&expr).is_empty()).then_some(()));
    }
}

#[test]
fn m10_a_webhook_that_is_down_slow_or_rate_limited_delays_but_loses_nothing() {
    let script = vec![
        Answer::Status(500, None),
        Answer::Slow(std::time::Duration::from_secs(11)),
        Answer::Status(429, Some(1)),
        Answer::Status(503, None),
    ];
    let receiver = Receiver::start(script);
    let m = manifests(&receiver.url);
    let s = Server::start_opts(Some(m.path().to_path_buf()), "127.0.0.1:0", &["--resync", "300ms"]);
    let desk = s.token("desk");
    let id = ok(s.ctl(&desk, &["send", "--to", "builder", "--subject", "s", "--body", "b"]));

    // While the notifier struggles, the API answers at once.
    eventually(20, "the first failed attempt", || (receiver.attempts() >= 1).then_some(()));
    let started = std::time::Instant::now();
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "still here", "--body", "b"]));
    ok(s.ctl(&desk, &["status", &id]));
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "API blocked: {:?}", started.elapsed());

    eventually(60, "the notification, after the failures", || {
        (undelivered(&receiver, "builder") == ["firing"]).then_some(())
    });
    assert!(receiver.attempts() >= 5, "every scripted failure was met: {}", receiver.attempts());
    let metrics = get(&format!("{}/metrics", s.url)).expect("metrics").1;
    let failed: f64 = metrics
        .lines()
        .find(|l| l.starts_with("pcmail_notifications_total{outcome=\"failed\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .expect("failed counter");
    assert!(failed >= 4.0, "{failed}");
    s.await_passes("notify", 2);
    assert_eq!(undelivered(&receiver, "builder"), ["firing"], "posted once, not once per retry");
}

#[test]
fn m10_a_dead_webhook_is_counted_as_such_among_the_reconcile_errors() {
    let dead = format!("http://127.0.0.1:{}/hook", free_port());
    let m = manifests(&dead);
    let s = Server::start_opts(Some(m.path().to_path_buf()), "127.0.0.1:0", &["--resync", "300ms"]);
    ok(s.ctl(&s.token("desk"), &["send", "--to", "laptop", "--urgent", "--subject", "prod down", "--body", "b"]));
    let reason = |r: &str| s.metric(&format!("pcmail_reconcile_errors_total{{reason=\"{r}\",reconciler=\"notify\"}}"));
    eventually(60, "a notify pass to fail on the webhook", || reason("webhook").filter(|n| *n >= 1.0));
    assert_eq!(reason("store_unavailable"), Some(0.0), "not counted as a store failure");
}

#[test]
fn m10_decision_and_urgent_mail_notify_once_on_arrival() {
    let receiver = Receiver::start(vec![]);
    let m = manifests(&receiver.url);
    let s = Server::start_opts(Some(m.path().to_path_buf()), "127.0.0.1:0", &["--resync", "300ms"]);
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));
    let decision =
        ok(s.ctl(&desk, &["send", "--to", "laptop", "--kind", "decision", "--subject", "merge?", "--body", "b"]));
    let urgent = ok(s.ctl(&desk, &["send", "--to", "laptop", "--urgent", "--subject", "prod down", "--body", "b"]));
    let note = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "fyi", "--body", "b"]));
    ok(s.ctl(&laptop, &["poll"]));
    let arrivals = || -> Vec<String> {
        receiver.alerts().into_iter().filter(|(name, _, _)| name == "PcmailArrival").map(|(_, s, _)| s).collect()
    };
    eventually(20, "both arrival notices", || (arrivals().len() == 2).then_some(()));
    s.await_passes("notify", 2);
    let mut got = arrivals();
    got.sort();
    let mut want = vec![decision, urgent];
    want.sort();
    assert_eq!(got, want, "once per id, and not for the note {note}");
}

#[test]
fn c4_metrics_expose_every_family_of_design_section_9() {
    let s = Server::start_opts(Some(examples()), "127.0.0.1:0", &["--resync", "300ms"]);
    ok(s.ctl(&s.token("laptop"), &["poll"]));
    let body = eventually(10, "the sweep to see the poll", || {
        get(&format!("{}/metrics", s.url))
            .map(|r| r.1)
            .filter(|b| b.contains("pcmail_machine_last_poll_timestamp_seconds{machine=\"laptop\"}"))
    });
    assert!(body.contains("pcmail_mail_transitions_total{from=\"none\",to=\"new\"} 0"), "counters start at 0");
    for family in [
        "pcmail_mail",
        "pcmail_mail_undelivered",
        "pcmail_mail_unread_sla_breached",
        "pcmail_mail_transitions_total",
        "pcmail_alerts_firing",
        "pcmail_notifications_total",
        "pcmail_machine_last_poll_timestamp_seconds",
        "pcmail_intents_pending",
        "pcmail_ledger_rows",
        "pcmail_ledger_runs_total",
        "pcmail_ledger_failures_total",
        "pcmail_jobs",
        "pcmail_job_claims_total",
        "pcmail_job_rescues_total",
        "pcmail_job_failures_total",
        "pcmail_reconcile_duration_seconds",
        "pcmail_reconcile_errors_total",
        "pcmail_workqueue_depth",
        "pcmail_workers",
        "pcmail_build_info",
    ] {
        assert!(body.contains(&format!("# TYPE {family} ")), "{family} missing from /metrics");
    }
}

#[test]
fn prometheus_rules_pass_promtool_check() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/prometheus/pcmail-rules.yaml");
    let out =
        Command::new("promtool").args(["check", "rules"]).arg(&rules).output().expect("promtool must be installed");
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("SUCCESS"), "{}", stdout(&out));
}

#[test]
fn o6_an_urgent_mails_undelivered_alert_is_posted_critical_with_its_urgency() {
    let receiver = Receiver::start(vec![]);
    let m = manifests(&receiver.url);
    let s = Server::start_opts(Some(m.path().to_path_buf()), "127.0.0.1:0", &["--resync", "300ms"]);
    ok(s.ctl(&s.token("desk"), &["send", "--to", "laptop", "--urgent", "--subject", "prod down", "--body", "b"]));
    let labels = eventually(30, "the undelivered alert's post", || {
        receiver
            .posts()
            .iter()
            .flat_map(|p| p["alerts"].as_array().cloned().unwrap_or_default())
            .find(|a| a["labels"]["alertname"] == "PcmailMailUndelivered")
            .map(|a| a["labels"].clone())
    });
    assert_eq!(
        (labels["severity"].as_str(), labels["urgency"].as_str()),
        (Some("critical"), Some("urgent")),
        "{labels}"
    );
}
