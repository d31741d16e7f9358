//! Every metric of DESIGN §9, registered once. Labels are bounded: machine labels, states,
//! kinds and spec names — never mail ids or titles.
//!
//! Gauges are set for every known label value (0 included), so a dashboard query returns a
//! series even when nothing is wrong, and a breach that clears drops to 0 rather than vanishing.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use pcmail_core::alert::{AlertKind, Breaches, Urgency};
use pcmail_core::jobs::JobState;
use pcmail_core::ledger::RowState;
use pcmail_core::mail::MailState;
use pcmail_core::manifest::spec::{FunctionSpec, LedgerSpec, WorkerPoolSpec};
use prometheus::GaugeVec;

use crate::key::Key;

pub struct Metrics {
    registry: Registry,
    pub mail: IntGaugeVec,
    pub mail_undelivered: IntGaugeVec,
    pub mail_unread_sla_breached: IntGaugeVec,
    pub mail_transitions: IntCounterVec,
    pub alerts_firing: IntGaugeVec,
    notifications: IntCounterVec,
    pub machine_last_poll: GaugeVec,
    pub intents_pending: IntGaugeVec,
    pub ledger_rows: IntGaugeVec,
    ledger_runs: IntCounterVec,
    pub ledger_failures: IntCounterVec,
    pub jobs: IntGaugeVec,
    pub job_claims: IntCounterVec,
    pub job_rescues: IntCounterVec,
    pub job_failures: IntCounterVec,
    pub reconcile_duration: HistogramVec,
    pub reconcile_errors: IntCounterVec,
    pub workqueue_depth: IntGauge,
    pub workers: IntGaugeVec,
    pub build_info: IntGaugeVec,
    pub leader: IntGauge,
    pub pruned: IntCounterVec,
    pub intents_dropped: IntCounterVec,
    pub pending_refused: IntCounterVec,
    pub auth_failures: IntCounterVec,
    pub tls_expiry: IntGauge,
    waits_parked: IntGaugeVec,
    /// V1: 1 for each machine's client version as its last poll to this replica said.
    client_info: IntGaugeVec,
    client_versions: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// E1/T15: connections the server closed, by why (`pcmail_core::conns::Closed`).
    pub connections_closed: IntCounterVec,
    /// E15: store writes that failed, by `pcmail_store::health::WriteReason`.
    store_write_errors: IntCounterVec,
    /// E15: 1 while the store refuses writes for want of space.
    store_unwritable: IntGauge,
    /// E18: 1 when the last scrape could not read the store (its gauges keep their last value).
    pub store_read_failed: IntGauge,
}

/// A closed set of label values: code names a variant, the registry declares every one at 0.
macro_rules! label_values {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &[$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }
    };
}

label_values! {
    /// How notification posts ended (`pcmail_notifications_total{outcome}`).
    Notified { Sent => "sent", Failed => "failed", Skipped => "skipped" }
}

label_values! {
    /// How a ledger row's Function run ended (`pcmail_ledger_runs_total{outcome}`).
    RunOutcome { Ok => "ok", Failed => "failed", Timeout => "timeout" }
}

label_values! {
    /// Where authentication failed (`pcmail_auth_failures_total{surface}`, T18).
    Surface { Api => "api", Console => "console" }
}

label_values! {
    /// What a parked request waits for (`pcmail_waits_parked{kind}`).
    Wait { Poll => "poll", Status => "status" }
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m;
                registry.register(Box::new(m.clone()))?;
                m
            }};
        }
        let gauge = |name: &str, help: &str, labels: &[&str]| IntGaugeVec::new(Opts::new(name, help), labels);
        let counter = |name: &str, help: &str, labels: &[&str]| IntCounterVec::new(Opts::new(name, help), labels);
        let m = Metrics {
            mail: reg!(gauge("pcmail_mail", "Mail by state.", &["state"])?),
            mail_undelivered: reg!(gauge(
                "pcmail_mail_undelivered",
                "Mail still new after undeliveredAfter, by recipient.",
                &["to"]
            )?),
            mail_unread_sla_breached: reg!(gauge(
                "pcmail_mail_unread_sla_breached",
                "Mail delivered but unread past its SLA, by recipient and urgency.",
                &["to", "urgency"]
            )?),
            mail_transitions: reg!(counter(
                "pcmail_mail_transitions_total",
                "Mail state transitions.",
                &["from", "to"]
            )?),
            alerts_firing: reg!(gauge("pcmail_alerts_firing", "Alerts firing, by kind.", &["kind"])?),
            notifications: reg!(counter("pcmail_notifications_total", "Notification posts by outcome.", &["outcome"])?),
            machine_last_poll: reg!(GaugeVec::new(
                Opts::new("pcmail_machine_last_poll_timestamp_seconds", "Unix time of each machine's last poll."),
                &["machine"]
            )?),
            intents_pending: reg!(gauge(
                "pcmail_intents_pending",
                "Inbound messages not yet answered, by channel.",
                &["channel"]
            )?),
            ledger_rows: reg!(gauge("pcmail_ledger_rows", "Ledger rows by project and state.", &["project", "state"])?),
            ledger_runs: reg!(counter(
                "pcmail_ledger_runs_total",
                "Ledger function runs by outcome.",
                &["function", "outcome"]
            )?),
            ledger_failures: reg!(counter(
                "pcmail_ledger_failures_total",
                "Ledger run failures by project.",
                &["project"]
            )?),
            jobs: reg!(gauge("pcmail_jobs", "Jobs by queue and state.", &["queue", "state"])?),
            job_claims: reg!(counter("pcmail_job_claims_total", "Jobs claimed.", &["queue"])?),
            job_rescues: reg!(counter("pcmail_job_rescues_total", "Expired leases rescued.", &["queue"])?),
            job_failures: reg!(counter("pcmail_job_failures_total", "Job attempts that failed.", &["queue"])?),
            reconcile_duration: reg!(HistogramVec::new(
                HistogramOpts::new("pcmail_reconcile_duration_seconds", "Time per reconcile.")
                    .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
                &["reconciler"]
            )?),
            reconcile_errors: reg!(counter(
                "pcmail_reconcile_errors_total",
                "Reconciles that failed, by why.",
                &["reconciler", "reason"]
            )?),
            workqueue_depth: reg!(IntGauge::new("pcmail_workqueue_depth", "Keys waiting in the work queue.")?),
            workers: reg!(gauge("pcmail_workers", "Workers running, by pool.", &["pool"])?),
            build_info: reg!(gauge("pcmail_build_info", "Build information.", &["version"])?),
            leader: reg!(IntGauge::new("pcmail_leader", "1 while this replica holds the leader lease (C1).")?),
            pruned: reg!(counter("pcmail_pruned_total", "Rows pruned past their retention (E7).", &["tab"])?),
            waits_parked: reg!(gauge(
                "pcmail_waits_parked",
                "Long-polls (poll) and status waits (status) parked until something moves.",
                &["kind"]
            )?),
            intents_dropped: reg!(counter(
                "pcmail_intents_dropped_total",
                "Chat messages a PC's poller dropped: their chat is outside allowedChats (I9).",
                &["channel"]
            )?),
            pending_refused: reg!(counter(
                "pcmail_pending_refused_total",
                "Queued PC calls the server refused for good, as the PCs report them (T10).",
                &["action"]
            )?),
            auth_failures: reg!(counter(
                "pcmail_auth_failures_total",
                "Requests whose token was not recognized, per surface; each client address is slowed after 5 (T18).",
                &["surface"]
            )?),
            tls_expiry: reg!(IntGauge::new(
                "pcmail_tls_cert_expiry_timestamp_seconds",
                "When the served TLS certificate expires, as a Unix time; 0 without --tls-cert (T17)."
            )?),
            client_info: reg!(gauge(
                "pcmail_client_info",
                "1 for the pcmail-ctl version each machine last polled with (V1); \"\" for a client that did not say.",
                &["machine", "version"]
            )?),
            client_versions: Default::default(),
            connections_closed: reg!(counter(
                "pcmail_connections_closed_total",
                "Connections the server closed: a head, body or answer too slow, idle too long, or evicted when full.",
                &["reason"]
            )?),
            store_write_errors: reg!(counter(
                "pcmail_store_write_errors_total",
                "Store writes that failed, by reason: no_space (a full disk), unavailable, other (E15).",
                &["reason"]
            )?),
            store_unwritable: reg!(IntGauge::new(
                "pcmail_store_unwritable",
                "1 while the store refuses writes because its disk is full (E15)."
            )?),
            store_read_failed: reg!(IntGauge::new(
                "pcmail_store_read_failed",
                "1 when /metrics could not read the store; the store-read gauges keep their last value (E18)."
            )?),
            registry,
        };
        for reason in pcmail_store::health::WriteReason::ALL {
            m.store_write_errors.with_label_values(&[reason.as_str()]);
        }
        m.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        for surface in Surface::ALL {
            m.auth_failures.with_label_values(&[surface.as_str()]);
        }
        for call in pcmail_core::agent::QueuedCall::ALL {
            m.pending_refused.with_label_values(&[call.as_str()]);
        }
        for outcome in Notified::ALL {
            m.notifications.with_label_values(&[outcome.as_str()]);
        }
        for reason in pcmail_core::conns::Closed::ALL {
            m.connections_closed.with_label_values(&[reason.as_str()]);
        }
        for wait in Wait::ALL {
            m.waits_parked.with_label_values(&[wait.as_str()]);
        }
        // Every forward move of M1 (and "none" for a new mail), so rates exist from the start.
        let from =
            std::iter::once("none").chain([MailState::New, MailState::Delivered, MailState::Seen].map(|s| s.as_str()));
        for (i, f) in from.enumerate() {
            for t in MailState::ALL.iter().filter(|t| t.rank() as usize >= i) {
                m.mail_transitions.with_label_values(&[f, t.as_str()]);
            }
        }
        for key in Key::EVERY {
            for reason in crate::error::ReconcileError::reasons() {
                m.reconcile_errors.with_label_values(&[key.name(), reason]);
            }
        }
        Ok(m)
    }

    pub fn notified(&self, outcome: Notified, posts: u64) {
        self.notifications.with_label_values(&[outcome.as_str()]).inc_by(posts);
    }

    pub fn ledger_ran(&self, function: &str, outcome: RunOutcome) {
        self.ledger_runs.with_label_values(&[function, outcome.as_str()]).inc();
    }

    /// V1: `machine` polls with `version` now; the series of its earlier version goes.
    pub fn client_seen(&self, machine: &str, version: &str) {
        let mut last = self.client_versions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.insert(machine.to_string(), version.to_string()) {
            Some(old) if old == version => return,
            Some(old) => {
                let _ = self.client_info.remove_label_values(&[machine, &old]);
            }
            None => {}
        }
        self.client_info.with_label_values(&[machine, version]).set(1);
    }

    /// Counts a wait in `pcmail_waits_parked` for as long as the answer lives.
    pub fn parked(&self, wait: Wait) -> Parked {
        Parked::new(self.waits_parked.with_label_values(&[wait.as_str()]))
    }

    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// E15: the store's health as it stands in memory (the counters only ever move up).
    pub fn set_store_health(&self, health: &pcmail_store::health::WriteHealth) {
        for reason in pcmail_store::health::WriteReason::ALL {
            let counter = self.store_write_errors.with_label_values(&[reason.as_str()]);
            counter.inc_by(health.failed(reason).saturating_sub(counter.get()));
        }
        self.store_unwritable.set(i64::from(health.refusing().is_some()));
    }

    /// Mail counts by state, every state present.
    pub fn set_mail_counts(&self, counts: &[(MailState, u64)]) {
        for s in MailState::ALL {
            let n: u64 = counts.iter().filter(|(st, _)| *st == s).map(|(_, n)| n).sum();
            self.mail.with_label_values(&[s.as_str()]).set(n as i64);
        }
    }

    /// The sweep's breach counts, with 0 for every Roster machine that has none.
    pub fn set_breaches(&self, b: &Breaches, machines: &[String]) {
        self.mail_undelivered.reset();
        self.mail_unread_sla_breached.reset();
        for m in machines {
            self.mail_undelivered.with_label_values(&[m]).set(0);
            for u in Urgency::ALL {
                self.mail_unread_sla_breached.with_label_values(&[m, u.as_str()]).set(0);
            }
        }
        for (to, n) in &b.undelivered {
            self.mail_undelivered.with_label_values(&[to]).set(*n as i64);
        }
        for ((to, urgency), n) in &b.unread {
            self.mail_unread_sla_breached.with_label_values(&[to, urgency.as_str()]).set(*n as i64);
        }
        for kind in AlertKind::ALL.into_iter().filter(|k| k.is_stored() && *k != AlertKind::Arrival) {
            let n = b.firing.get(&kind).copied().unwrap_or(0);
            self.alerts_firing.with_label_values(&[kind.as_str()]).set(n as i64);
        }
    }

    /// Series for every machine, ledger, function, queue and pool the specs declare, created at
    /// 0 if absent (an existing value is left for the sweep to update).
    pub fn declare_specs(
        &self,
        machines: &[String],
        ledgers: &[&LedgerSpec],
        functions: &[(&str, &FunctionSpec)],
        pools: &[(&str, &WorkerPoolSpec)],
    ) {
        for tab in pcmail_store::Prune::TABS {
            self.pruned.with_label_values(&[tab]).inc_by(0);
        }
        for m in machines {
            self.mail_undelivered.with_label_values(&[m]).add(0);
            for u in Urgency::ALL {
                self.mail_unread_sla_breached.with_label_values(&[m, u.as_str()]).add(0);
            }
        }
        for kind in AlertKind::ALL.into_iter().filter(|k| k.is_stored() && *k != AlertKind::Arrival) {
            self.alerts_firing.with_label_values(&[kind.as_str()]).add(0);
        }
        for l in ledgers {
            for s in RowState::ALL {
                self.ledger_rows.with_label_values(&[&l.project, s.as_str()]).add(0);
            }
            self.ledger_failures.with_label_values(&[&l.project]);
        }
        for (name, _) in functions {
            for outcome in RunOutcome::ALL {
                self.ledger_runs.with_label_values(&[name, outcome.as_str()]);
            }
        }
        for (name, pool) in pools {
            self.workers.with_label_values(&[name]).add(0);
            for q in &pool.queues {
                for s in JobState::ALL {
                    self.jobs.with_label_values(&[q, s.as_str()]).add(0);
                }
                self.job_claims.with_label_values(&[q]);
                self.job_rescues.with_label_values(&[q]);
                self.job_failures.with_label_values(&[q]);
            }
        }
    }
}

/// One parked wait, counted in `pcmail_waits_parked` for as long as it lives (a dropped request
/// uncounts itself too).
pub struct Parked(prometheus::IntGauge);

impl Parked {
    fn new(gauge: prometheus::IntGauge) -> Parked {
        gauge.inc();
        Parked(gauge)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pcmail_core::manifest::spec::{LedgerSpec, WorkerPoolSpec};

    /// One of each event the server records, with fixed values, so the exposition they leave is
    /// the same text on every run.
    fn exercised() -> Metrics {
        let m = Metrics::new().expect("registry");
        let ledger = LedgerSpec::new("proj");
        let function: FunctionSpec =
            serde_json::from_value(serde_json::json!({"command": ["true"], "mode": "generate"})).expect("function");
        let pool = WorkerPoolSpec { queues: vec!["q".into()], workers: 2, ..WorkerPoolSpec::default() };
        m.declare_specs(&["pc1".into(), "pc2".into()], &[&ledger], &[("fn", &function)], &[("pool", &pool)]);
        m.mail_transitions.with_label_values(&["none", "new"]).inc();
        m.mail_transitions.with_label_values(&["new", "delivered"]).inc();
        m.set_mail_counts(&[(MailState::New, 3), (MailState::Seen, 1), (MailState::New, 2)]);
        let mut b = Breaches::default();
        b.undelivered.insert("pc1".into(), 2);
        b.unread.insert(("pc2".into(), Urgency::Urgent), 1);
        b.firing.insert(AlertKind::UnreadSla, 1);
        m.set_breaches(&b, &["pc1".into(), "pc2".into()]);
        m.notified(Notified::Sent, 2);
        m.notified(Notified::Failed, 1);
        m.machine_last_poll.with_label_values(&["pc1"]).set(1_700_000_000.5);
        m.intents_pending.with_label_values(&["telegram"]).set(4);
        m.intents_dropped.with_label_values(&["telegram"]).inc_by(3);
        m.pending_refused.with_label_values(&[pcmail_core::agent::QueuedCall::ALL[0].as_str()]).inc();
        m.ledger_rows.with_label_values(&["proj", RowState::ALL[0].as_str()]).set(5);
        m.ledger_ran("fn", RunOutcome::Timeout);
        m.ledger_failures.with_label_values(&["proj"]).inc();
        m.jobs.with_label_values(&["q", JobState::ALL[0].as_str()]).set(7);
        m.job_claims.with_label_values(&["q"]).inc_by(3);
        m.job_rescues.with_label_values(&["q"]).inc();
        m.job_failures.with_label_values(&["q"]).inc();
        m.reconcile_duration.with_label_values(&[Key::EVERY[0].name()]).observe(0.003);
        m.reconcile_errors.with_label_values(&[Key::EVERY[0].name(), crate::error::ReconcileError::reasons().next().expect("reason")]).inc();
        m.workqueue_depth.set(2);
        m.workers.with_label_values(&["pool"]).set(2);
        m.leader.set(1);
        m.pruned.with_label_values(&[pcmail_store::Prune::TABS[0]]).inc_by(9);
        m.auth_failures.with_label_values(&[Surface::Console.as_str()]).inc();
        m.tls_expiry.set(1_800_000_000);
        m.client_seen("pc1", "0.1.0");
        m.client_seen("pc1", "0.2.0");
        m.client_seen("pc2", "");
        m.connections_closed.with_label_values(&[pcmail_core::conns::Closed::ALL[0].as_str()]).inc();
        m.store_read_failed.set(1);
        let parked = m.parked(Wait::Poll);
        std::mem::forget(parked);
        m
    }

    /// R1: the typed events write exactly the series the string-labelled calls wrote: the same
    /// names, labels, help and values (`PCMAIL_BLESS=1` rewrites the golden file after a change
    /// that means to alter the exposition).
    #[test]
    fn r1_the_exposition_is_byte_identical_to_its_golden_file() {
        let text = exercised().encode().expect("encode").replace(env!("CARGO_PKG_VERSION"), "VERSION");
        let golden = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/metrics.golden.txt");
        if std::env::var_os("PCMAIL_BLESS").is_some() {
            std::fs::write(&golden, &text).expect("bless");
        }
        let want = std::fs::read_to_string(&golden).expect("golden file");
        assert!(text == want, "the exposition changed; diff it against {}:\n{text}", golden.display());
    }
}
