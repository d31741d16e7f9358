//! What the stored specs mean to the running controller, rebuilt whole on every change.
//!
//! Start-up and every later apply or delete go through [`build`]: one path, so a spec applied
//! at start behaves exactly like the same spec applied later.

use pcmail_core::Ts;
use pcmail_core::cron::parse_tz;
use pcmail_core::duration::Dur;
use pcmail_core::manifest::spec::{
    FunctionMode, FunctionSpec, IntentPolicySpec, LedgerSpec, MailPolicySpec, RosterSpec, ScheduleRole, ScheduleSpec,
    WorkerPoolSpec,
};
use pcmail_core::manifest::{Spec, SpecRecord, Status, check_object};

use chrono_tz::Tz;
use pcmail_core::cron::Cron;

use crate::key::{Key, key_for};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Runtime {
    /// None until a Roster is applied: the server then refuses to resolve any recipient (M3).
    pub roster: Option<RosterSpec>,
    pub mail_policy: MailPolicySpec,
    /// The IntentPolicy (defaults when none is applied): hooks read it through the agent,
    /// the sweep escalates by it (I4).
    pub intent_policy: IntentPolicySpec,
    pub crons: Vec<CronEntry>,
    /// L11: a ledger run left running longer than this was killed (the first WorkerPool's
    /// `staleAfter`, else 30m).
    pub stale_after: Dur,
    /// `maxPerRun` of the Schedule entries, by role (the first entry that sets one wins).
    pub max_per_run: Vec<(ScheduleRole, u32)>,
    pub ledgers: Vec<LedgerSpec>,
    pub functions: Vec<(String, FunctionSpec)>,
    pub pools: Vec<(String, WorkerPoolSpec)>,
    /// Stored objects this build refuses (stored by an older one before a rule existed), each
    /// with the rules it breaks: left out of the running configuration, the rest serves.
    pub fenced: Vec<String>,
}

impl Runtime {
    /// A machine as a listing's filter names it (label, number, hostname or alias, M3's exact
    /// match), as its label — the name mail and alerts carry; an unknown name stays as given.
    pub fn machine_label(&self, name: &str) -> String {
        pcmail_core::roster::resolve(self.roster.as_ref(), name).unwrap_or_else(|_| name.to_string())
    }

    /// The mode of the Function named `name`; None when no such Function is applied.
    pub fn function_mode(&self, name: &str) -> Option<FunctionMode> {
        self.functions.iter().find(|(n, _)| n == name).map(|(_, f)| f.mode)
    }

    /// L14: how much one pass of `role` takes (`ScheduleRole::max_per_run`); None is no cap.
    pub fn max_per_run(&self, role: ScheduleRole) -> Option<usize> {
        role.max_per_run(&self.max_per_run).map(|n| n as usize)
    }
}

/// One runnable cron entry.
#[derive(Debug, Clone, PartialEq)]
pub struct CronEntry {
    pub tz: Tz,
    pub cron: Cron,
    /// The expression as written: with the role and zone, what names the entry's last run (E13).
    pub cron_text: String,
    pub key: Key,
}

/// Facts from outside the specs that conditions report on.
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// The last notification failure, cleared by the next success.
    pub notify_error: Option<String>,
    /// Workers running now, by WorkerPool name.
    pub ready_workers: std::collections::BTreeMap<String, u32>,
}

/// Builds the runtime from the stored specs, and the status each object should now show
/// (only those that differ from what is stored).
pub fn build(specs: &[SpecRecord], health: &Health, now: Ts) -> (Runtime, Vec<(SpecRecord, Status)>) {
    let mut rt = Runtime { stale_after: Dur::from_mins(30), ..Runtime::default() };
    let mut statuses = Vec::new();
    for record in specs {
        let mut status = record.status.clone();
        status.observed_generation = record.generation;
        let object = format!("{}/{}", record.kind.lower(), record.name);
        match Spec::from_json(record.kind, record.spec.clone()) {
            Ok(spec) => {
                let problems = check_object(&record.name, &spec);
                if problems.is_empty() {
                    conditions(&mut rt, spec, &record.name, health, &mut status, now);
                } else {
                    let broken: Vec<String> = problems.into_iter().map(|p| p.message).collect();
                    let message = format!(
                        "not in effect: {}; correct the manifest and apply it again (rename: apply under a valid name, then delete {object})",
                        broken.join("; ")
                    );
                    status.set_condition("Ready", false, "InvalidSpec", &message, now);
                    rt.fenced.push(format!("{object}: {message}"));
                }
            }
            Err(e) => {
                let message = format!("stored spec does not fit this build: {e}");
                status.set_condition("Ready", false, "InvalidSpec", &message, now);
                rt.fenced.push(format!("{object}: {message}"));
            }
        }
        if status != record.status {
            statuses.push((record.clone(), status));
        }
    }
    (rt, statuses)
}

fn conditions(rt: &mut Runtime, spec: Spec, name: &str, health: &Health, status: &mut Status, now: Ts) {
    match spec {
        Spec::Roster(r) => {
            rt.roster = Some(r);
            status.set_condition("Ready", true, "Applied", "recipients resolve against this Roster", now);
        }
        Spec::MailPolicy(p) => {
            status.set_condition("Ready", true, "Applied", "in effect for sweeps and sends", now);
            match (&p.notify, &health.notify_error) {
                (Some(_), Some(e)) => status.set_condition("Degraded", true, "NotifyFailing", e, now),
                (Some(_), None) => {
                    status.set_condition("Degraded", false, "AsExpected", "notifications are delivered", now)
                }
                (None, _) => status.set_condition(
                    "Degraded",
                    false,
                    "NoWebhook",
                    "alerts are kept in the alerts tab and metrics only",
                    now,
                ),
            }
            rt.mail_policy = p;
        }
        Spec::IntentPolicy(p) => {
            rt.intent_policy = p;
            status.set_condition("Ready", true, "Applied", "hooks remind and the sweep escalates by this policy", now);
        }
        Spec::Schedule(s) => schedule(rt, &s, status, now),
        Spec::Ledger(l) => {
            rt.ledgers.push(l);
            rt.ledgers.sort_by(|a, b| a.project.cmp(&b.project));
            status.set_condition("Ready", true, "Applied", "synced and executed by the ledger schedules", now);
        }
        Spec::Function(f) => {
            rt.functions.push((name.to_string(), f));
            status.set_condition("Ready", true, "Applied", "ledger rows naming it can run", now);
        }
        Spec::WorkerPool(w) => {
            if rt.pools.is_empty() {
                rt.stale_after = w.stale_after;
            }
            let ready = health.ready_workers.get(name).copied().unwrap_or(0);
            status.desired_workers = Some(w.workers);
            status.ready_workers = Some(ready);
            let converged = ready == w.workers;
            let message = format!("{ready} of {} workers running on {}", w.workers, w.queues.join(", "));
            status.set_condition("Ready", converged, if converged { "Converged" } else { "Scaling" }, &message, now);
            rt.pools.push((name.to_string(), w));
        }
    }
}

fn schedule(rt: &mut Runtime, s: &ScheduleSpec, status: &mut Status, now: Ts) {
    let Ok(tz) = parse_tz(&s.timezone) else {
        status.set_condition("Ready", false, "InvalidTimezone", &format!("unknown time zone {}", s.timezone), now);
        return;
    };
    let mut roles = Vec::new();
    let mut invalid = Vec::new();
    for e in &s.entries {
        let role = serde_json::to_value(e.role).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        if let Some(n) = e.max_per_run.filter(|_| !rt.max_per_run.iter().any(|(r, _)| *r == e.role)) {
            rt.max_per_run.push((e.role, n));
        }
        // Crons are validated at apply; a stored one that no longer parses is reported.
        match e.cron.parse() {
            Ok(cron) => {
                rt.crons.push(CronEntry { tz, cron, cron_text: e.cron.clone(), key: key_for(e.role) });
                roles.push(role);
            }
            Err(err) => invalid.push(format!("{role}: {err}")),
        }
    }
    if invalid.is_empty() {
        status.set_condition("Ready", true, "Scheduled", &format!("running: {}", roles.join(", ")), now);
    } else {
        status.set_condition("Ready", false, "InvalidCron", &invalid.join("; "), now);
    }
}

#[cfg(test)]
mod tests {
    use pcmail_core::manifest::Kind;

    use super::*;

    fn at(s: i64) -> Ts {
        Ts::from_timestamp(s, 0).unwrap_or_default()
    }

    fn record(kind: Kind, generation: u64, spec: serde_json::Value) -> SpecRecord {
        SpecRecord {
            kind,
            name: "x".into(),
            labels: Default::default(),
            generation,
            spec,
            status: Status::default(),
            created_at: at(0),
            updated_at: at(0),
        }
    }

    fn ready(s: &Status) -> (&str, &str) {
        let c = s.conditions.iter().find(|c| c.type_ == "Ready").expect("Ready");
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn observed_generation_follows_generation_and_ready_tells_the_truth() {
        let roster = serde_json::json!({"owner": "pc1", "machines": [{"number": 1, "label": "pc1"}]});
        let pool = serde_json::json!({"workers": 2});
        let specs = [record(Kind::Roster, 3, roster), record(Kind::WorkerPool, 1, pool)];
        let (rt, statuses) = build(&specs, &Health::default(), at(5));
        assert_eq!(rt.roster.map(|r| r.owner), Some("pc1".into()));
        assert_eq!(statuses[0].1.observed_generation, 3);
        assert_eq!(ready(&statuses[0].1), ("True", "Applied"));
        assert_eq!(ready(&statuses[1].1), ("False", "Scaling"));
        assert_eq!((statuses[1].1.desired_workers, statuses[1].1.ready_workers), (Some(2), Some(0)));
    }

    #[test]
    fn unchanged_status_is_not_rewritten() {
        let roster = serde_json::json!({"owner": "pc1", "machines": [{"number": 1, "label": "pc1"}]});
        let (_, statuses) = build(&[record(Kind::Roster, 1, roster.clone())], &Health::default(), at(5));
        let mut settled = record(Kind::Roster, 1, roster);
        settled.status = statuses[0].1.clone();
        assert!(build(&[settled], &Health::default(), at(9)).1.is_empty());
    }

    #[test]
    fn mail_policy_is_degraded_while_notifications_fail() {
        let policy = serde_json::json!({"notify": {"webhook": "http://127.0.0.1:9/hook"}});
        let failing = Health { notify_error: Some("connection refused".into()), ..Health::default() };
        let (_, statuses) = build(&[record(Kind::MailPolicy, 1, policy)], &failing, at(5));
        let degraded = statuses[0].1.conditions.iter().find(|c| c.type_ == "Degraded").expect("Degraded");
        assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "NotifyFailing"));
    }

    #[test]
    fn schedule_runs_every_role_and_keeps_max_per_run() {
        let spec = serde_json::json!({"timezone": "Asia/Tokyo", "entries": [
            {"role": "mail-sweep", "cron": "*/1 * * * *"}, {"role": "sync", "cron": "0 2 * * *"},
            {"role": "execute-checked", "cron": "*/10 * * * *", "maxPerRun": 1}]});
        let (rt, statuses) = build(&[record(Kind::Schedule, 1, spec)], &Health::default(), at(5));
        assert_eq!(rt.crons.len(), 3);
        assert_eq!(ready(&statuses[0].1), ("True", "Scheduled"));
        assert_eq!(rt.max_per_run, vec![(ScheduleRole::ExecuteChecked, 1)]);
    }

    #[test]
    fn t5_t6_a_stored_object_breaking_todays_rules_is_fenced_off_and_the_rest_serves() {
        let old_roster = serde_json::json!({"owner": "PC1", "machines": [{"number": 1, "label": "PC1"}]});
        let old_pool = serde_json::json!({"workers": 1, "queues": ["q"], "leaseDuration": "3650d"});
        let function = serde_json::json!({"command": ["true"], "mode": "generate"});
        let specs = [
            record(Kind::Roster, 1, old_roster),
            record(Kind::WorkerPool, 1, old_pool),
            record(Kind::Function, 1, function),
        ];
        let (rt, statuses) = build(&specs, &Health::default(), at(5));
        assert_eq!(
            (rt.roster.is_none(), rt.pools.len(), rt.functions.len()),
            (true, 0, 1),
            "only the valid one serves"
        );
        assert_eq!(rt.fenced.len(), 2, "{:?}", rt.fenced);
        assert!(
            rt.fenced[0].starts_with("roster/x: not in effect: label: \"PC1\" is not a valid name"),
            "{}",
            rt.fenced[0]
        );
        assert!(rt.fenced[1].contains("leaseDuration 3650d is out of range"), "{}", rt.fenced[1]);
        assert_eq!(ready(&statuses[0].1), ("False", "InvalidSpec"));
        assert_eq!(ready(&statuses[2].1), ("True", "Applied"));
    }

    #[test]
    fn default_mail_policy_applies_without_a_manifest() {
        let (rt, _) = build(&[], &Health::default(), at(0));
        assert_eq!((rt.mail_policy.max_hop, rt.roster, rt.intent_policy.channel.as_str()), (3, None, "telegram"));
    }
}
