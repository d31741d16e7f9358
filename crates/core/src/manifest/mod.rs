//! Declarative objects (`apiVersion: pcmail/v1`): their kinds, stored records and status.
//!
//! `parse` turns YAML text into typed documents with file/line/column errors, `validate` checks
//! what serde cannot (ranges from `fields`' table, cross-field and cross-object rules), `schema`
//! writes the JSON Schema and `explain` from the same table, and `plan` computes what `apply`,
//! `diff` and `delete` would change — the one diff path used at start-up and for every change.

pub mod fields;
mod parse;
mod plan;
pub mod schema;
pub mod spec;
mod validate;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Ts;
use crate::names::UnknownName;
pub use parse::{Document, ManifestError, parse_file};
pub use plan::{ApplyOutcome, ApplyStep, line_diff, plan_apply};
use spec::*;
pub use validate::{Problem, check_object, still_named, validate_documents};

pub const API_VERSION: &str = "pcmail/v1";

crate::wire_enum! {
    /// A manifest's `kind`, spelled as in the YAML.
    pub enum Kind as "kind" {
        Roster = "Roster",
        MailPolicy = "MailPolicy",
        IntentPolicy = "IntentPolicy",
        WorkerPool = "WorkerPool",
        Function = "Function",
        Ledger = "Ledger",
        Schedule = "Schedule",
    }
}

impl Kind {
    /// The lowercase form used in `roster/office created` lines and URLs.
    pub fn lower(self) -> String {
        self.cli_name().to_string()
    }

    /// [`Kind::lower`] without an allocation: what completion offers (the wire name, lowercased).
    pub fn cli_name(self) -> &'static str {
        static LOWER: std::sync::LazyLock<Vec<String>> =
            std::sync::LazyLock::new(|| Kind::NAMES.iter().map(|n| n.to_ascii_lowercase()).collect());
        LOWER.get(self as usize).map_or("", String::as_str)
    }

    /// What kubectl users type: any case, singular or plural.
    pub fn from_cli(s: &str) -> Option<Kind> {
        let l = s.to_ascii_lowercase();
        let singular = match l.as_str() {
            "mailpolicies" => "mailpolicy",
            "intentpolicies" => "intentpolicy",
            other => other.strip_suffix('s').unwrap_or(other),
        };
        Kind::ALL.into_iter().find(|k| k.lower() == singular)
    }

    /// [`Kind::from_cli`], or the error listing what a command line may name.
    pub fn parse_cli(s: &str) -> Result<Kind, UnknownName> {
        let known = Kind::ALL.map(Kind::cli_name);
        Kind::from_cli(s).ok_or_else(|| UnknownName::new("kind", s, format!("; known kinds: {}", known.join(", "))))
    }

    /// A manifest's `kind:`, exactly as written, or the error listing the kinds a manifest may declare.
    pub fn parse_manifest(s: &str) -> Result<Kind, UnknownName> {
        Kind::from_name(s)
            .ok_or_else(|| UnknownName::new("kind", s, format!("; known kinds: {}", Kind::NAMES.join(", "))))
    }

    /// Kinds that configure the whole controller: two of them would contradict each other.
    pub fn is_singleton(self) -> bool {
        matches!(self, Kind::Roster | Kind::MailPolicy | Kind::IntentPolicy)
    }
}

/// A typed spec; the variant always matches the object's kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    Roster(RosterSpec),
    MailPolicy(MailPolicySpec),
    IntentPolicy(IntentPolicySpec),
    WorkerPool(WorkerPoolSpec),
    Function(FunctionSpec),
    Ledger(LedgerSpec),
    Schedule(ScheduleSpec),
}

impl Spec {
    pub fn kind(&self) -> Kind {
        match self {
            Spec::Roster(_) => Kind::Roster,
            Spec::MailPolicy(_) => Kind::MailPolicy,
            Spec::IntentPolicy(_) => Kind::IntentPolicy,
            Spec::WorkerPool(_) => Kind::WorkerPool,
            Spec::Function(_) => Kind::Function,
            Spec::Ledger(_) => Kind::Ledger,
            Spec::Schedule(_) => Kind::Schedule,
        }
    }

    /// The canonical JSON form that is stored and compared: defaults filled in, so that writing
    /// a default explicitly or leaving it out is the same spec and leaves `generation` alone.
    pub fn to_json(&self) -> serde_json::Value {
        let v = match self {
            Spec::Roster(s) => serde_json::to_value(s),
            Spec::MailPolicy(s) => serde_json::to_value(s),
            Spec::IntentPolicy(s) => serde_json::to_value(s),
            Spec::WorkerPool(s) => serde_json::to_value(s),
            Spec::Function(s) => serde_json::to_value(s),
            Spec::Ledger(s) => serde_json::to_value(s),
            Spec::Schedule(s) => serde_json::to_value(s),
        };
        // Serializing plain structs of strings, numbers and maps cannot fail.
        v.unwrap_or(serde_json::Value::Null)
    }

    /// Reads a stored spec back; an error means the stored JSON no longer fits this build's types.
    pub fn from_json(kind: Kind, v: serde_json::Value) -> Result<Spec, serde_json::Error> {
        Ok(match kind {
            Kind::Roster => Spec::Roster(serde_json::from_value(v)?),
            Kind::MailPolicy => Spec::MailPolicy(serde_json::from_value(v)?),
            Kind::IntentPolicy => Spec::IntentPolicy(serde_json::from_value(v)?),
            Kind::WorkerPool => Spec::WorkerPool(serde_json::from_value(v)?),
            Kind::Function => Spec::Function(serde_json::from_value(v)?),
            Kind::Ledger => Spec::Ledger(serde_json::from_value(v)?),
            Kind::Schedule => Spec::Schedule(serde_json::from_value(v)?),
        })
    }
}

/// One stored object: what `apply` wrote plus the status the controller keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecRecord {
    pub kind: Kind,
    pub name: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Counts spec changes only (not label or status changes), as in Kubernetes.
    pub generation: u64,
    pub spec: serde_json::Value,
    #[serde(default)]
    pub status: Status,
    pub created_at: Ts,
    pub updated_at: Ts,
}

impl SpecRecord {
    /// The Kubernetes-shaped object that `get -o yaml|json` prints and `apply` accepts back.
    pub fn to_object(&self) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {
                "name": self.name,
                "labels": self.labels,
                "generation": self.generation,
                "creationTimestamp": self.created_at,
            },
            "spec": self.spec,
            "status": self.status,
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub observed_generation: u64,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// WorkerPool: the `workers` asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_workers: Option<u32>,
    /// WorkerPool: workers running now (draining ones excluded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_workers: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown", as in Kubernetes.
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition_time: Ts,
}

impl Status {
    /// Sets a condition, keeping its lastTransitionTime when its status did not change.
    pub fn set_condition(&mut self, type_: &str, status: bool, reason: &str, message: &str, now: Ts) {
        let status = if status { "True" } else { "False" };
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = now;
                }
                c.status = status.into();
                c.reason = reason.into();
                c.message = message.into();
            }
            None => self.conditions.push(Condition {
                type_: type_.into(),
                status: status.into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: now,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_found_the_way_kubectl_users_type_them() {
        assert_eq!(Kind::from_cli("roster"), Some(Kind::Roster));
        assert_eq!(Kind::from_cli("Rosters"), Some(Kind::Roster));
        assert_eq!(Kind::from_cli("mailpolicies"), Some(Kind::MailPolicy));
        assert_eq!(Kind::from_cli("WorkerPool"), Some(Kind::WorkerPool));
        assert_eq!(Kind::from_cli("pods"), None);
    }

    #[test]
    fn condition_transition_time_moves_only_when_status_flips() {
        let t0 = Ts::from_timestamp(1_000, 0).unwrap_or_default();
        let t1 = Ts::from_timestamp(2_000, 0).unwrap_or_default();
        let mut s = Status::default();
        s.set_condition("Ready", true, "Applied", "ok", t0);
        s.set_condition("Ready", true, "Applied", "still ok", t1);
        assert_eq!(s.conditions[0].last_transition_time, t0);
        s.set_condition("Ready", false, "Broken", "no", t1);
        assert_eq!(s.conditions[0].last_transition_time, t1);
        assert_eq!(s.conditions.len(), 1);
    }
}
