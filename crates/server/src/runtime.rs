//! What the stored specs mean to the running controller, rebuilt whole on every change.
//!
//! Start-up and every later apply or delete go through [`build`]: one path, so a spec applied
//! at start behaves exactly like the same spec applied later.

use pcmail_core::Ts;
use pcmail_core::manifest::spec::{MailPolicySpec, RosterSpec};
use pcmail_core::manifest::{Kind, Spec, SpecRecord, Status};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Runtime {
    /// None until a Roster is applied: the server then refuses to resolve any recipient (M3).
    pub roster: Option<RosterSpec>,
    pub mail_policy: MailPolicySpec,
}

/// Builds the runtime from the stored specs, and the status each object should now show.
pub fn build(specs: &[SpecRecord], now: Ts) -> (Runtime, Vec<(Kind, String, Status)>) {
    let mut runtime = Runtime::default();
    let mut statuses = Vec::new();
    for record in specs {
        let mut status = record.status.clone();
        match Spec::from_json(record.kind, record.spec.clone()) {
            Ok(spec) => {
                let acting = match spec {
                    Spec::Roster(r) => {
                        runtime.roster = Some(r);
                        true
                    }
                    Spec::MailPolicy(p) => {
                        runtime.mail_policy = p;
                        true
                    }
                    _ => false,
                };
                status.observed_generation = record.generation;
                if acting {
                    status.set_condition("Ready", true, "Applied", "in effect", now);
                } else {
                    let message = format!(
                        "stored and validated; this build does not act on {} objects yet",
                        record.kind
                    );
                    status.set_condition("Ready", false, "ControllerPending", &message, now);
                }
            }
            Err(e) => {
                let message = format!("stored spec does not fit this build: {e}");
                status.set_condition("Ready", false, "InvalidSpec", &message, now);
            }
        }
        if status != record.status {
            statuses.push((record.kind, record.name.clone(), status));
        }
    }
    (runtime, statuses)
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn observed_generation_follows_generation_and_ready_tells_the_truth() {
        let roster =
            serde_json::json!({"owner": "pc1", "machines": [{"number": 1, "label": "pc1"}]});
        let pool = serde_json::json!({"workers": 2});
        let (rt, statuses) = build(
            &[
                record(Kind::Roster, 3, roster),
                record(Kind::WorkerPool, 1, pool),
            ],
            at(5),
        );
        assert_eq!(rt.roster.map(|r| r.owner), Some("pc1".into()));
        assert_eq!(statuses[0].2.observed_generation, 3);
        assert_eq!(statuses[0].2.conditions[0].status, "True");
        assert_eq!(statuses[1].2.conditions[0].reason, "ControllerPending");
    }

    #[test]
    fn unchanged_status_is_not_rewritten() {
        let roster =
            serde_json::json!({"owner": "pc1", "machines": [{"number": 1, "label": "pc1"}]});
        let (_, statuses) = build(&[record(Kind::Roster, 1, roster.clone())], at(5));
        let mut settled = record(Kind::Roster, 1, roster);
        settled.status = statuses[0].2.clone();
        assert!(build(&[settled], at(9)).1.is_empty());
    }

    #[test]
    fn default_mail_policy_applies_without_a_manifest() {
        let (rt, _) = build(&[], at(0));
        assert_eq!((rt.mail_policy.max_hop, rt.roster), (3, None));
    }
}
