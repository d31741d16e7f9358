//! The rules serde cannot express: names, ranges, exclusive fields and cross-object checks.

use std::collections::{BTreeMap, BTreeSet};

use super::spec::*;
use super::{Document, Kind, ManifestError, Spec, SpecRecord};
use crate::roster;

/// Checks a whole apply set against itself and the objects already stored.
/// Any error refuses the whole set.
pub fn validate_documents(docs: &[Document], existing: &[SpecRecord]) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    let mut seen: BTreeMap<(Kind, &str), &Document> = BTreeMap::new();
    for doc in docs {
        if let Err(m) = check_name(&doc.name) {
            errors.push(doc.error_at("name:", 0, m));
        }
        errors.extend(validate_spec(doc));
        if let Some(first) = seen.insert((doc.kind(), &doc.name), doc) {
            errors.push(doc.error_at(
                "name:",
                0,
                format!(
                    "{}/{} is defined twice (first at {}:{})",
                    doc.kind().lower(),
                    doc.name,
                    first.file,
                    first.line
                ),
            ));
        }
    }
    for kind in Kind::ALL.into_iter().filter(|k| k.is_singleton()) {
        let incoming: BTreeSet<&str> = docs.iter().filter(|d| d.kind() == kind).map(|d| d.name.as_str()).collect();
        let stored = existing.iter().filter(|r| r.kind == kind).map(|r| r.name.as_str());
        let all: BTreeSet<&str> = incoming.iter().copied().chain(stored).collect();
        if all.len() > 1
            && let Some(doc) = docs.iter().find(|d| d.kind() == kind)
        {
            let names: Vec<_> = all.into_iter().collect();
            errors.push(doc.error_at(
                "name:",
                0,
                format!(
                    "only one {kind} may exist, but this would make {}: {}; delete the old one first",
                    names.len(),
                    names.join(", ")
                ),
            ));
        }
    }
    let mut projects: BTreeMap<&str, &str> = existing
        .iter()
        .filter(|r| r.kind == Kind::Ledger && !docs.iter().any(|d| d.kind() == Kind::Ledger && d.name == r.name))
        .filter_map(|r| Some((r.spec.get("project")?.as_str()?, r.name.as_str())))
        .collect();
    for doc in docs {
        if let Spec::Ledger(l) = &doc.spec
            && let Some(other) = projects.insert(&l.project, &doc.name)
        {
            errors.push(doc.error_at(
                "project:",
                0,
                format!("project {:?} already has the Ledger {other:?}; one Ledger per project", l.project),
            ));
        }
    }
    errors
}

/// Object names are DNS-label-like so that they are safe in URLs, file names and metric labels.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "invalid name {name:?}: use 1-63 lowercase letters, digits, '-' or '.', starting with a letter or digit"
        ))
    }
}

/// Durations past ten years are typos, and would overflow time arithmetic.
const MAX_DURATION: crate::duration::Dur = crate::duration::Dur::from_hours(24 * 3650);

fn durations(spec: &Spec) -> Vec<(&'static str, crate::duration::Dur)> {
    match spec {
        Spec::MailPolicy(p) => {
            let mut v = vec![
                ("ttl", p.ttl),
                ("urgent", p.unread_sla.urgent),
                ("normal", p.unread_sla.normal),
                ("undeliveredAfter", p.undelivered_after),
                ("receiverDownAfter", p.receiver_down_after),
            ];
            v.extend(p.notify.as_ref().map(|n| ("minInterval", n.min_interval)));
            v
        }
        Spec::IntentPolicy(p) => {
            vec![("remindAfter", p.remind_after), ("remindEvery", p.remind_every), ("escalateAfter", p.escalate_after)]
        }
        Spec::WorkerPool(w) => vec![("leaseDuration", w.lease_duration), ("staleAfter", w.stale_after)],
        Spec::Function(f) => vec![("timeout", f.timeout)],
        Spec::Roster(_) | Spec::Ledger(_) | Spec::Schedule(_) => vec![],
    }
}

fn validate_spec(doc: &Document) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    let mut err = |needle: &str, nth: usize, m: String| errors.push(doc.error_at(needle, nth, m));
    for (field, d) in durations(&doc.spec) {
        if d > MAX_DURATION {
            err(field, 0, format!("{field} {d} is longer than the limit of {MAX_DURATION}"));
        }
    }
    match &doc.spec {
        Spec::Roster(r) => return validate_roster(doc, r),
        Spec::MailPolicy(p) => {
            if p.max_hop == 0 {
                err("maxHop", 0, "maxHop must be at least 1".into());
            }
            if p.ttl.as_millis() == 0 {
                err("ttl", 0, "ttl must be longer than 0s".into());
            }
            if let Some(n) = &p.notify
                && !(n.webhook.starts_with("http://") || n.webhook.starts_with("https://"))
            {
                err("webhook", 0, format!("notify.webhook {:?} must be an http:// or https:// URL", n.webhook));
            }
        }
        Spec::IntentPolicy(p) => {
            if p.remind_every.as_millis() == 0 {
                err("remindEvery", 0, "remindEvery must be longer than 0s".into());
            }
        }
        Spec::WorkerPool(w) => {
            if w.workers > 256 {
                err("workers", 0, format!("workers {} is more than the limit of 256", w.workers));
            }
            if w.lease_duration.as_millis() < 1000 {
                err("leaseDuration", 0, "leaseDuration must be at least 1s".into());
            }
            if w.max_attempts == 0 {
                err("maxAttempts", 0, "maxAttempts must be at least 1".into());
            }
            check_rate(w.rate_limit, &mut err);
        }
        Spec::Function(f) => {
            if f.command.first().is_none_or(|c| c.trim().is_empty()) {
                err("command", 0, "command must name a program as its first element".into());
            }
            if f.timeout.as_millis() == 0 {
                err("timeout", 0, "timeout must be longer than 0s".into());
            }
            check_rate(f.rate_limit, &mut err);
        }
        Spec::Ledger(l) => {
            if l.project.trim().is_empty() {
                err("project", 0, "project must not be empty".into());
            }
            let mut names = BTreeSet::new();
            for s in &l.sources {
                if !names.insert(&s.name) {
                    err(&s.name, 1, format!("source name {:?} is used twice", s.name));
                }
                if s.file.is_some() == s.command.is_some() {
                    err(&s.name, 0, format!("source {:?} needs exactly one of `file` or `command`", s.name));
                }
            }
        }
        Spec::Schedule(s) => {
            if s.entries.is_empty() {
                err("entries", 0, "a Schedule needs at least one entry".into());
            }
            for e in &s.entries {
                if e.cron.split_whitespace().count() != 5 {
                    err(
                        &e.cron,
                        0,
                        format!("cron {:?} must have 5 fields: minute hour day-of-month month day-of-week", e.cron),
                    );
                }
            }
        }
    }
    errors
}

fn validate_roster(doc: &Document, r: &RosterSpec) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    let mut err = |needle: &str, nth: usize, m: String| errors.push(doc.error_at(needle, nth, m));
    let mut dup_errors = Vec::new();
    let mut err_in =
        |section: &str, needle: &str, nth: usize, m: String| dup_errors.push(doc.error_in(section, needle, nth, m));
    if r.machines.is_empty() {
        err("machines", 0, "a Roster needs at least one machine".into());
    }
    // Every name any machine answers to must be unique, or M3's exact match would be ambiguous.
    let mut owners: BTreeMap<String, &str> = BTreeMap::new();
    let mut occurrences: BTreeMap<String, usize> = BTreeMap::new();
    for m in &r.machines {
        if m.label.is_empty() || m.label.chars().any(|c| c.is_whitespace() || c == ',') {
            err(&m.label, 0, format!("label {:?} must be non-empty, without spaces or commas", m.label));
        }
        let own: BTreeSet<String> = roster::names(m).map(|n| n.to_lowercase()).collect();
        for name in own {
            let nth = occurrences.entry(name.clone()).or_default();
            if let Some(first) = owners.insert(name.clone(), &m.label) {
                let what = if name == m.number.to_string() { "number" } else { "label" };
                err_in(
                    "machines:",
                    &name,
                    *nth,
                    format!("duplicate {what} {name:?}: machines {first:?} and {:?} both answer to it", m.label),
                );
            }
            *nth += 1;
        }
    }
    let owner = r.owner.to_lowercase();
    if !owners.contains_key(owner.trim()) {
        err("owner", 0, format!("owner {:?} is not a machine of this Roster", r.owner));
    }
    errors.extend(dup_errors);
    errors
}

fn check_rate(rate: Option<RateLimit>, err: &mut impl FnMut(&str, usize, String)) {
    if rate.is_some_and(|r| r.per_minute == 0 || r.burst == 0) {
        err("rateLimit", 0, "rateLimit.perMinute and burst must be at least 1".into());
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_file;
    use super::*;

    fn check(text: &str) -> Vec<ManifestError> {
        let docs = parse_file("m.yaml", text).expect("parses");
        validate_documents(&docs, &[])
    }

    #[test]
    fn duplicate_roster_label_is_refused_at_the_second_occurrence() {
        let errors = check(
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: pc1\n  machines:\n  - {number: 1, label: pc1}\n  - {number: 2, label: pc1}\n",
        );
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!((errors[0].line, errors[0].column), (8, 24), "{}", errors[0]);
        assert!(errors[0].message.contains("duplicate label \"pc1\""), "{}", errors[0]);
    }

    #[test]
    fn duplicate_roster_number_and_alias_clash_are_refused() {
        let errors = check(
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: pc1\n  machines:\n  - {number: 1, label: pc1}\n  - {number: 1, label: pc2, aliases: [PC1]}\n",
        );
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors.iter().any(|e| e.message.contains("duplicate number \"1\"")));
    }

    #[test]
    fn roster_owner_must_be_a_machine() {
        let errors = check(
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: pc9\n  machines:\n  - {number: 1, label: pc1}\n",
        );
        assert_eq!(errors[0].line, 5);
    }

    #[test]
    fn singletons_count_stored_objects_too() {
        let docs = parse_file("m.yaml", "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: b}\nspec: {}\n")
            .expect("parses");
        let now = chrono::DateTime::UNIX_EPOCH;
        let stored = SpecRecord {
            kind: Kind::MailPolicy,
            name: "a".into(),
            labels: Default::default(),
            generation: 1,
            spec: serde_json::json!({}),
            status: Default::default(),
            created_at: now,
            updated_at: now,
        };
        let errors = validate_documents(&docs, std::slice::from_ref(&stored));
        assert!(errors[0].message.contains("only one MailPolicy"), "{errors:?}");
        let renamed = SpecRecord { name: "b".into(), ..stored };
        assert!(validate_documents(&docs, &[renamed]).is_empty());
    }

    #[test]
    fn durations_past_ten_years_are_refused() {
        let errors = check("apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: p}\nspec:\n  ttl: 99999d\n");
        assert!(errors[0].message.contains("ttl 99999d is longer than the limit"), "{errors:?}");
        assert_eq!(errors[0].line, 5);
    }

    #[test]
    fn the_same_object_twice_in_one_apply_is_refused() {
        let doc =
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: f}\nspec: {command: [echo], mode: generate}\n";
        let errors = check(&format!("{doc}---\n{doc}"));
        assert!(errors[0].message.contains("function/f is defined twice"), "{errors:?}");
    }

    #[test]
    fn ledger_source_needs_exactly_one_of_file_or_command() {
        let errors = check(
            "apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {name: l}\nspec:\n  project: p\n  sources:\n  - {name: s, file: a.csv, command: [cat]}\n",
        );
        assert!(errors[0].message.contains("exactly one of"), "{errors:?}");
    }
}
