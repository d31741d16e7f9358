//! Every metric of DESIGN §9, registered once. Labels are bounded: machine labels, states,
//! kinds and spec names — never mail ids or titles.
//!
//! Gauges are set for every known label value (0 included), so a dashboard query returns a
//! series even when nothing is wrong, and a breach that clears drops to 0 rather than vanishing.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use pcmail_core::agent::QueuedCall;
use pcmail_core::alert::{AlertKind, Breaches, Urgency};
use pcmail_core::conns::Closed;
use pcmail_core::jobs::JobState;
use pcmail_core::ledger::RowState;
use pcmail_core::mail::MailState;
use pcmail_core::manifest::spec::{FunctionSpec, LedgerSpec, WorkerPoolSpec};
use pcmail_store::health::WriteReason;
use prometheus::GaugeVec;

use crate::key::Key;

/// The registry and its series, grouped by the part of the server that records them. Each group
/// takes typed events (`jobs.claimed(queue, n)`, `mail.moved(from, to)`), so a label's values come
/// from the core's enums and no call site spells a label list.
pub struct Metrics {
    registry: Registry,
    pub mail: MailMetrics,
    pub machines: MachineMetrics,
    pub ledger: LedgerMetrics,
    pub jobs: JobMetrics,
    pub control: ControlMetrics,
    pub surface: SurfaceMetrics,
    pub store: StoreMetrics,
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

/// Registers a metric in `registry` and hands it back.
fn reg<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: Result<M, prometheus::Error>,
) -> Result<M, prometheus::Error> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec, prometheus::Error> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

fn counter(name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        Ok(Metrics {
            mail: MailMetrics::register(&registry)?,
            machines: MachineMetrics::register(&registry)?,
            ledger: LedgerMetrics::register(&registry)?,
            jobs: JobMetrics::register(&registry)?,
            control: ControlMetrics::register(&registry)?,
            surface: SurfaceMetrics::register(&registry)?,
            store: StoreMetrics::register(&registry)?,
            registry,
        })
    }

    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut out = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
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
        self.control.declare();
        self.mail.declare(machines);
        self.ledger.declare(ledgers, functions);
        self.jobs.declare(pools);
    }
}

/// Mail and its alerts: counts by state, the sweep's breaches, M1's moves, notification posts.
pub struct MailMetrics {
    by_state: IntGaugeVec,
    undelivered: IntGaugeVec,
    unread_sla_breached: IntGaugeVec,
    transitions: IntCounterVec,
    alerts_firing: IntGaugeVec,
    notifications: IntCounterVec,
}

impl MailMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = MailMetrics {
            by_state: reg(r, gauge("pcmail_mail", "Mail by state.", &["state"]))?,
            undelivered: reg(
                r,
                gauge("pcmail_mail_undelivered", "Mail still new after undeliveredAfter, by recipient.", &["to"]),
            )?,
            unread_sla_breached: reg(
                r,
                gauge(
                    "pcmail_mail_unread_sla_breached",
                    "Mail delivered but unread past its SLA, by recipient and urgency.",
                    &["to", "urgency"],
                ),
            )?,
            transitions: reg(r, counter("pcmail_mail_transitions_total", "Mail state transitions.", &["from", "to"]))?,
            alerts_firing: reg(r, gauge("pcmail_alerts_firing", "Alerts firing, by kind.", &["kind"]))?,
            notifications: reg(
                r,
                counter("pcmail_notifications_total", "Notification posts by outcome.", &["outcome"]),
            )?,
        };
        for outcome in Notified::ALL {
            m.notifications.with_label_values(&[outcome.as_str()]);
        }
        // Every forward move of M1 (and "none" for a new mail), so rates exist from the start.
        for from in [None, Some(MailState::New), Some(MailState::Delivered), Some(MailState::Seen)] {
            let rank = from.map_or(0, |f| f.rank() + 1);
            for to in MailState::ALL.into_iter().filter(|t| t.rank() >= rank) {
                m.transitions.with_label_values(&[Self::from_label(from), to.as_str()]);
            }
        }
        Ok(m)
    }

    fn from_label(from: Option<MailState>) -> &'static str {
        from.map_or("none", MailState::as_str)
    }

    /// A committed move of one mail (`from` None: it was created).
    pub fn moved(&self, from: Option<MailState>, to: MailState) {
        self.transitions.with_label_values(&[Self::from_label(from), to.as_str()]).inc();
    }

    pub fn notified(&self, outcome: Notified, posts: u64) {
        self.notifications.with_label_values(&[outcome.as_str()]).inc_by(posts);
    }

    /// Mail counts by state, every state present.
    pub fn set_counts(&self, counts: &[(MailState, u64)]) {
        for s in MailState::ALL {
            let n: u64 = counts.iter().filter(|(st, _)| *st == s).map(|(_, n)| n).sum();
            self.by_state.with_label_values(&[s.as_str()]).set(n as i64);
        }
    }

    /// The sweep's breach counts, with 0 for every Roster machine that has none.
    pub fn set_breaches(&self, b: &Breaches, machines: &[String]) {
        self.undelivered.reset();
        self.unread_sla_breached.reset();
        for m in machines {
            self.undelivered.with_label_values(&[m]).set(0);
            for u in Urgency::ALL {
                self.unread_sla_breached.with_label_values(&[m, u.as_str()]).set(0);
            }
        }
        for (to, n) in &b.undelivered {
            self.undelivered.with_label_values(&[to]).set(*n as i64);
        }
        for ((to, urgency), n) in &b.unread {
            self.unread_sla_breached.with_label_values(&[to, urgency.as_str()]).set(*n as i64);
        }
        for kind in Self::gauged_alerts() {
            let n = b.firing.get(&kind).copied().unwrap_or(0);
            self.alerts_firing.with_label_values(&[kind.as_str()]).set(n as i64);
        }
    }

    /// The alert kinds `pcmail_alerts_firing` counts: those of the alerts tab but the one-shot
    /// arrival notice.
    fn gauged_alerts() -> impl Iterator<Item = AlertKind> {
        AlertKind::ALL.into_iter().filter(|k| k.is_stored() && *k != AlertKind::Arrival)
    }

    fn declare(&self, machines: &[String]) {
        for m in machines {
            self.undelivered.with_label_values(&[m]).add(0);
            for u in Urgency::ALL {
                self.unread_sla_breached.with_label_values(&[m, u.as_str()]).add(0);
            }
        }
        for kind in Self::gauged_alerts() {
            self.alerts_firing.with_label_values(&[kind.as_str()]).add(0);
        }
    }
}

/// The PCs as their polls and reports show them: last poll, client version, their chat pollers'
/// intents, and the queued calls the server refused.
pub struct MachineMetrics {
    last_poll: GaugeVec,
    /// V1: 1 for each machine's client version as its last poll to this replica said.
    client_info: IntGaugeVec,
    client_versions: std::sync::Mutex<std::collections::HashMap<String, String>>,
    intents_pending: IntGaugeVec,
    intents_dropped: IntCounterVec,
    pending_refused: IntCounterVec,
}

impl MachineMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = MachineMetrics {
            last_poll: reg(
                r,
                GaugeVec::new(
                    Opts::new("pcmail_machine_last_poll_timestamp_seconds", "Unix time of each machine's last poll."),
                    &["machine"],
                ),
            )?,
            client_info: reg(
                r,
                gauge(
                    "pcmail_client_info",
                    "1 for the pcmail-ctl version each machine last polled with (V1); \"\" for a client that did not say.",
                    &["machine", "version"],
                ),
            )?,
            client_versions: Default::default(),
            intents_pending: reg(
                r,
                gauge("pcmail_intents_pending", "Inbound messages not yet answered, by channel.", &["channel"]),
            )?,
            intents_dropped: reg(
                r,
                counter(
                    "pcmail_intents_dropped_total",
                    "Chat messages a PC's poller dropped: their chat is outside allowedChats (I9).",
                    &["channel"],
                ),
            )?,
            pending_refused: reg(
                r,
                counter(
                    "pcmail_pending_refused_total",
                    "Queued PC calls the server refused for good, as the PCs report them (T10).",
                    &["action"],
                ),
            )?,
        };
        for call in QueuedCall::ALL {
            m.pending_refused.with_label_values(&[call.as_str()]);
        }
        Ok(m)
    }

    pub fn polled(&self, machine: &str, at: pcmail_core::Ts) {
        self.last_poll.with_label_values(&[machine]).set(at.timestamp_millis() as f64 / 1000.0);
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

    pub fn set_intents_pending(&self, channel: &str, pending: u64) {
        self.intents_pending.with_label_values(&[channel]).set(pending as i64);
    }

    pub fn intents_dropped(&self, channel: &str, dropped: u64) {
        self.intents_dropped.with_label_values(&[channel]).inc_by(dropped);
    }

    pub fn call_refused(&self, call: QueuedCall) {
        self.pending_refused.with_label_values(&[call.as_str()]).inc();
    }
}

/// Ledger rows by state and the Functions' runs.
pub struct LedgerMetrics {
    rows: IntGaugeVec,
    runs: IntCounterVec,
    failures: IntCounterVec,
}

impl LedgerMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(LedgerMetrics {
            rows: reg(r, gauge("pcmail_ledger_rows", "Ledger rows by project and state.", &["project", "state"]))?,
            runs: reg(
                r,
                counter("pcmail_ledger_runs_total", "Ledger function runs by outcome.", &["function", "outcome"]),
            )?,
            failures: reg(r, counter("pcmail_ledger_failures_total", "Ledger run failures by project.", &["project"]))?,
        })
    }

    /// One Function run for `project`'s row ended with `outcome` (a failure counts for the project).
    pub fn ran(&self, project: &str, function: &str, outcome: RunOutcome) {
        self.runs.with_label_values(&[function, outcome.as_str()]).inc();
        if outcome != RunOutcome::Ok {
            self.failures.with_label_values(&[project]).inc();
        }
    }

    pub fn set_rows(&self, project: &str, state: RowState, n: u64) {
        self.rows.with_label_values(&[project, state.as_str()]).set(n as i64);
    }

    fn declare(&self, ledgers: &[&LedgerSpec], functions: &[(&str, &FunctionSpec)]) {
        for l in ledgers {
            for s in RowState::ALL {
                self.rows.with_label_values(&[&l.project, s.as_str()]).add(0);
            }
            self.failures.with_label_values(&[&l.project]);
        }
        for (name, _) in functions {
            for outcome in RunOutcome::ALL {
                self.runs.with_label_values(&[name, outcome.as_str()]);
            }
        }
    }
}

/// The job queue and its worker pools.
pub struct JobMetrics {
    by_state: IntGaugeVec,
    claims: IntCounterVec,
    rescues: IntCounterVec,
    failures: IntCounterVec,
    workers: IntGaugeVec,
}

impl JobMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        Ok(JobMetrics {
            by_state: reg(r, gauge("pcmail_jobs", "Jobs by queue and state.", &["queue", "state"]))?,
            claims: reg(r, counter("pcmail_job_claims_total", "Jobs claimed.", &["queue"]))?,
            rescues: reg(r, counter("pcmail_job_rescues_total", "Expired leases rescued.", &["queue"]))?,
            failures: reg(r, counter("pcmail_job_failures_total", "Job attempts that failed.", &["queue"]))?,
            workers: reg(r, gauge("pcmail_workers", "Workers running, by pool.", &["pool"]))?,
        })
    }

    pub fn claimed(&self, queue: &str, n: u64) {
        self.claims.with_label_values(&[queue]).inc_by(n);
    }

    pub fn failed(&self, queue: &str) {
        self.failures.with_label_values(&[queue]).inc();
    }

    pub fn rescued(&self, queue: &str) {
        self.rescues.with_label_values(&[queue]).inc();
    }

    pub fn set_count(&self, queue: &str, state: JobState, n: u64) {
        self.by_state.with_label_values(&[queue, state.as_str()]).set(n as i64);
    }

    pub fn set_workers(&self, pool: &str, workers: u32) {
        self.workers.with_label_values(&[pool]).set(i64::from(workers));
    }

    fn declare(&self, pools: &[(&str, &WorkerPoolSpec)]) {
        for (name, pool) in pools {
            self.workers.with_label_values(&[name]).add(0);
            for q in &pool.queues {
                for s in JobState::ALL {
                    self.by_state.with_label_values(&[q, s.as_str()]).add(0);
                }
                self.claims.with_label_values(&[q]);
                self.rescues.with_label_values(&[q]);
                self.failures.with_label_values(&[q]);
            }
        }
    }
}

/// The controller itself: its reconciles, work queue, leadership, pruning and build.
pub struct ControlMetrics {
    reconcile_duration: HistogramVec,
    reconcile_errors: IntCounterVec,
    workqueue_depth: IntGauge,
    build_info: IntGaugeVec,
    leader: IntGauge,
    pruned: IntCounterVec,
}

impl ControlMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = ControlMetrics {
            reconcile_duration: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new("pcmail_reconcile_duration_seconds", "Time per reconcile.")
                        .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0]),
                    &["reconciler"],
                ),
            )?,
            reconcile_errors: reg(
                r,
                counter("pcmail_reconcile_errors_total", "Reconciles that failed, by why.", &["reconciler", "reason"]),
            )?,
            workqueue_depth: reg(r, IntGauge::new("pcmail_workqueue_depth", "Keys waiting in the work queue."))?,
            build_info: reg(r, gauge("pcmail_build_info", "Build information.", &["version"]))?,
            leader: reg(r, IntGauge::new("pcmail_leader", "1 while this replica holds the leader lease (C1)."))?,
            pruned: reg(r, counter("pcmail_pruned_total", "Rows pruned past their retention (E7).", &["tab"]))?,
        };
        m.build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        for key in Key::EVERY {
            for reason in crate::error::ReconcileError::reasons() {
                m.reconcile_errors.with_label_values(&[key.name(), reason]);
            }
        }
        Ok(m)
    }

    /// Times one reconcile of `key` until the timer drops (or is observed).
    pub fn reconcile_timer(&self, key: &Key) -> prometheus::HistogramTimer {
        self.reconcile_duration.with_label_values(&[key.name()]).start_timer()
    }

    pub fn reconcile_failed(&self, key: &Key, reason: &str) {
        self.reconcile_errors.with_label_values(&[key.name(), reason]).inc();
    }

    pub fn set_queue_depth(&self, depth: usize) {
        self.workqueue_depth.set(depth as i64);
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn pruned(&self, tab: &str, n: u64) {
        self.pruned.with_label_values(&[tab]).inc_by(n);
    }

    fn declare(&self) {
        for tab in pcmail_store::Prune::TABS {
            self.pruned.with_label_values(&[tab]).inc_by(0);
        }
    }
}

/// What the HTTP surfaces see: failed authentication, parked waits, closed connections, the TLS
/// certificate's expiry.
pub struct SurfaceMetrics {
    auth_failures: IntCounterVec,
    waits_parked: IntGaugeVec,
    /// E1/T15: connections the server closed, by why (`pcmail_core::conns::Closed`).
    connections_closed: IntCounterVec,
    tls_expiry: IntGauge,
}

impl SurfaceMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = SurfaceMetrics {
            auth_failures: reg(
                r,
                counter(
                    "pcmail_auth_failures_total",
                    "Requests whose token was not recognized, per surface; each client address is slowed after 5 (T18).",
                    &["surface"],
                ),
            )?,
            waits_parked: reg(
                r,
                gauge(
                    "pcmail_waits_parked",
                    "Long-polls (poll) and status waits (status) parked until something moves.",
                    &["kind"],
                ),
            )?,
            connections_closed: reg(
                r,
                counter(
                    "pcmail_connections_closed_total",
                    "Connections the server closed: a head, body or answer too slow, idle too long, or evicted when full.",
                    &["reason"],
                ),
            )?,
            tls_expiry: reg(
                r,
                IntGauge::new(
                    "pcmail_tls_cert_expiry_timestamp_seconds",
                    "When the served TLS certificate expires, as a Unix time; 0 without --tls-cert (T17).",
                ),
            )?,
        };
        for surface in Surface::ALL {
            m.auth_failures.with_label_values(&[surface.as_str()]);
        }
        for reason in Closed::ALL {
            m.connections_closed.with_label_values(&[reason.as_str()]);
        }
        for wait in Wait::ALL {
            m.waits_parked.with_label_values(&[wait.as_str()]);
        }
        Ok(m)
    }

    pub fn auth_failed(&self, surface: Surface) {
        self.auth_failures.with_label_values(&[surface.as_str()]).inc();
    }

    /// Counts a wait in `pcmail_waits_parked` for as long as the answer lives.
    pub fn parked(&self, wait: Wait) -> Parked {
        Parked::new(self.waits_parked.with_label_values(&[wait.as_str()]))
    }

    /// The counter the accept loop counts its closes in (it outlives any one borrow of the app).
    pub fn connections_closed(&self) -> ClosedConnections {
        ClosedConnections(self.connections_closed.clone())
    }

    /// The gauge the certificate watcher keeps at the served certificate's expiry.
    pub fn tls_expiry(&self) -> IntGauge {
        self.tls_expiry.clone()
    }
}

/// `pcmail_connections_closed_total`, counted by [`Closed`].
#[derive(Clone)]
pub struct ClosedConnections(IntCounterVec);

impl ClosedConnections {
    pub fn count(&self, reason: Closed) {
        self.0.with_label_values(&[reason.as_str()]).inc();
    }
}

/// The store's health as this replica sees it.
pub struct StoreMetrics {
    /// E15: store writes that failed, by `pcmail_store::health::WriteReason`.
    write_errors: IntCounterVec,
    /// E15: 1 while the store refuses writes for want of space.
    unwritable: IntGauge,
    /// E18: 1 when the last scrape could not read the store (its gauges keep their last value).
    read_failed: IntGauge,
}

impl StoreMetrics {
    fn register(r: &Registry) -> Result<Self, prometheus::Error> {
        let m = StoreMetrics {
            write_errors: reg(
                r,
                counter(
                    "pcmail_store_write_errors_total",
                    "Store writes that failed, by reason: no_space (a full disk), unavailable, other (E15).",
                    &["reason"],
                ),
            )?,
            unwritable: reg(
                r,
                IntGauge::new(
                    "pcmail_store_unwritable",
                    "1 while the store refuses writes because its disk is full (E15).",
                ),
            )?,
            read_failed: reg(
                r,
                IntGauge::new(
                    "pcmail_store_read_failed",
                    "1 when /metrics could not read the store; the store-read gauges keep their last value (E18).",
                ),
            )?,
        };
        for reason in WriteReason::ALL {
            m.write_errors.with_label_values(&[reason.as_str()]);
        }
        Ok(m)
    }

    /// E15: the store's health as it stands in memory (the counters only ever move up).
    pub fn set_health(&self, health: &pcmail_store::health::WriteHealth) {
        for reason in WriteReason::ALL {
            let counter = self.write_errors.with_label_values(&[reason.as_str()]);
            counter.inc_by(health.failed(reason).saturating_sub(counter.get()));
        }
        self.unwritable.set(i64::from(health.refusing().is_some()));
    }

    pub fn set_read_failed(&self, failed: bool) {
        self.read_failed.set(i64::from(failed));
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
        m.mail.moved(None, MailState::New);
        m.mail.moved(Some(MailState::New), MailState::Delivered);
        m.mail.set_counts(&[(MailState::New, 3), (MailState::Seen, 1), (MailState::New, 2)]);
        let mut b = Breaches::default();
        b.undelivered.insert("pc1".into(), 2);
        b.unread.insert(("pc2".into(), Urgency::Urgent), 1);
        b.firing.insert(AlertKind::UnreadSla, 1);
        m.mail.set_breaches(&b, &["pc1".into(), "pc2".into()]);
        m.mail.notified(Notified::Sent, 2);
        m.mail.notified(Notified::Failed, 1);
        m.machines.polled("pc1", pcmail_core::Ts::from_timestamp_millis(1_700_000_000_500).expect("ts"));
        m.machines.set_intents_pending("telegram", 4);
        m.machines.intents_dropped("telegram", 3);
        m.machines.call_refused(QueuedCall::ALL[0]);
        m.ledger.set_rows("proj", RowState::ALL[0], 5);
        m.ledger.ran("proj", "fn", RunOutcome::Timeout);
        m.jobs.set_count("q", JobState::ALL[0], 7);
        m.jobs.claimed("q", 3);
        m.jobs.rescued("q");
        m.jobs.failed("q");
        // Its time is the run's own: the series is declared, its observations vary.
        m.control.reconcile_timer(&Key::EVERY[0]).stop_and_discard();
        m.control.reconcile_failed(&Key::EVERY[0], crate::error::ReconcileError::reasons().next().expect("reason"));
        m.control.set_queue_depth(2);
        m.jobs.set_workers("pool", 2);
        m.control.set_leader(true);
        m.control.pruned(pcmail_store::Prune::TABS[0], 9);
        m.surface.auth_failed(Surface::Console);
        m.surface.tls_expiry().set(1_800_000_000);
        m.machines.client_seen("pc1", "0.1.0");
        m.machines.client_seen("pc1", "0.2.0");
        m.machines.client_seen("pc2", "");
        m.surface.connections_closed().count(Closed::ALL[0]);
        m.store.set_read_failed(true);
        let parked = m.surface.parked(Wait::Poll);
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
