//! The rules serde cannot express: names, ranges, exclusive fields and cross-object checks.

use std::collections::{BTreeMap, BTreeSet};

use super::fields::{self, Field, Ty};
use super::spec::*;
use super::{Document, Kind, ManifestError, Spec, SpecRecord};
use crate::duration::Dur;
use crate::{bounds, text};

/// Checks a whole apply set against itself and the objects already stored.
/// Any error refuses the whole set.
pub fn validate_documents(docs: &[Document], existing: &[SpecRecord]) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    let mut seen: BTreeMap<(Kind, &str), &Document> = BTreeMap::new();
    for doc in docs {
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
    errors.extend(machines_named(docs, existing));
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

/// The machines an object names by label (`recorders`, `externalWorkers`, `pushers`), with
/// the field that names them; empty for kinds that name none.
fn labels_named(spec: &Spec) -> (&'static str, Vec<&String>) {
    match spec {
        Spec::IntentPolicy(p) => ("recorders", p.recorders.iter().collect()),
        Spec::WorkerPool(w) => ("externalWorkers", w.external_workers.iter().collect()),
        Spec::Ledger(l) => ("pushers", l.pushers.iter().map(|p| &p.machine).collect()),
        _ => ("", Vec::new()),
    }
}

/// T19: the machines a policy, pool or ledger names (`recorders`, `externalWorkers`,
/// `pushers`) are Roster labels — the Roster applied with them, or the one stored — since the
/// rules that use them compare labels. A Roster applied on its own is checked the other way
/// round: it may not drop (or rename) a machine a stored object still names.
fn machines_named(docs: &[Document], existing: &[SpecRecord]) -> Vec<ManifestError> {
    let incoming = docs.iter().find_map(|d| match &d.spec {
        Spec::Roster(r) => Some((d, r.clone())),
        _ => None,
    });
    let stored = || {
        let record = existing.iter().find(|r| r.kind == Kind::Roster)?;
        serde_json::from_value::<RosterSpec>(record.spec.clone()).ok()
    };
    let roster = incoming.as_ref().map(|(_, r)| r.clone()).or_else(stored);
    let mut errors = Vec::new();
    for doc in docs {
        let (field, named) = labels_named(&doc.spec);
        // A name that is no valid name is already refused by T6.
        for name in named.into_iter().filter(|n| text::is_name(n)) {
            let problem = match &roster {
                None => format!("{field} names {name:?}, but no Roster is applied; apply the Roster first or with it"),
                Some(r) if r.machines.iter().any(|m| &m.label == name) => continue,
                Some(r) => match r.machines.iter().find(|m| m.names().any(|n| n.eq_ignore_ascii_case(name))) {
                    Some(m) => format!("{field} names {name:?}, which is a name of {}; use its label", m.label),
                    None => format!("{field} names {name:?}, which is no machine of the Roster (T19)"),
                },
            };
            errors.push(doc.error_in(field, name, 0, problem));
        }
    }
    if let Some((doc, roster)) = incoming {
        let labels: Vec<&str> = roster.machines.iter().map(|m| m.label.as_str()).collect();
        let replaced = |r: &SpecRecord| docs.iter().any(|d| d.kind() == r.kind && d.name == r.name);
        for (object, field, name) in still_named(existing.iter().filter(|r| !replaced(r)), &labels) {
            errors.push(doc.error_at(
                "machines:",
                0,
                format!(
                    "this Roster has no machine {name:?}, which {object} names in {field} (T19); change {object} first or with it"
                ),
            ));
        }
    }
    errors
}

/// T19 for a Roster's change or deletion: the `(object, field, label)` of every machine the
/// stored `objects` name that `labels` (the Roster after the change; empty once deleted) lacks.
pub fn still_named<'a>(
    objects: impl IntoIterator<Item = &'a SpecRecord>,
    labels: &[&str],
) -> Vec<(String, &'static str, String)> {
    let mut missing = Vec::new();
    for record in objects {
        let Ok(spec) = Spec::from_json(record.kind, record.spec.clone()) else { continue };
        let (field, named) = labels_named(&spec);
        for name in named.into_iter().filter(|n| !labels.contains(&n.as_str())) {
            missing.push((format!("{}/{}", record.kind.lower(), record.name), field, name.clone()));
        }
    }
    missing
}

/// One rule an object breaks, and where its document shows it: the `nth` (from 0) whole-word
/// occurrence of `needle` (or the document's start when that is not found).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub needle: String,
    pub nth: usize,
    pub message: String,
}

impl Problem {
    fn at(needle: &str, message: impl Into<String>) -> Problem {
        Problem { needle: needle.to_string(), nth: 0, message: message.into() }
    }
}

/// Every rule one object must hold on its own (T5 ranges, T6 names and texts, T7 crons, time
/// zones and argv, and the field rules), whether it arrives in an apply or was stored by an
/// older build: the same list refuses an apply and fences a stored object off at start-up.
/// The range of every count and duration is the field table's (X2), as `schema` and `explain`
/// show it; the rules no schema can say follow, kind by kind.
pub fn check_object(name: &str, spec: &Spec) -> Vec<Problem> {
    let mut problems = Vec::new();
    if !text::is_name(name) {
        problems.push(Problem::at("name:", format!("metadata.name {name:?} is not a valid name: use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit")));
    }
    let mut seen = BTreeMap::new();
    check_ranges(fields::kind_fields(spec.kind()).spec, &spec.to_json(), "", &mut seen, &mut problems);
    let mut err =
        |needle: &str, nth: usize, m: String| problems.push(Problem { needle: needle.to_string(), nth, message: m });
    match spec {
        Spec::Roster(r) => check_roster(r, &mut err),
        Spec::MailPolicy(p) => check_mail_policy(p, &mut err),
        Spec::IntentPolicy(p) => check_intent_policy(p, &mut err),
        Spec::WorkerPool(w) => check_worker_pool(w, &mut err),
        Spec::Function(f) => check_function(f, &mut err),
        Spec::Ledger(l) => check_ledger(l, &mut err),
        Spec::Schedule(s) => check_schedule(s, &mut err),
    }
    problems
}

/// T5 from the field table: each count and duration of `value` (a spec's canonical JSON) in
/// its field's range, named by its path (`rateLimit.perMinute`, `entries[1].maxPerRun`) and
/// placed at the field's `seen`-th occurrence.
fn check_ranges<'a>(
    fields: &'a [Field],
    value: &serde_json::Value,
    path: &str,
    seen: &mut BTreeMap<&'a str, usize>,
    problems: &mut Vec<Problem>,
) {
    for f in fields {
        let Some(v) = value.get(f.name) else { continue };
        let path = if path.is_empty() { f.name.to_string() } else { format!("{path}.{}", f.name) };
        check_value(f, &f.ty, v, &path, seen, problems);
    }
}

fn check_value<'a>(
    f: &'a Field,
    ty: &'a Ty,
    v: &serde_json::Value,
    path: &str,
    seen: &mut BTreeMap<&'a str, usize>,
    problems: &mut Vec<Problem>,
) {
    let mut problem = |seen: &mut BTreeMap<&'a str, usize>, message: String| {
        let nth = seen.get(f.name).copied().unwrap_or(0);
        problems.push(Problem { needle: f.name.to_string(), nth, message });
    };
    match ty {
        Ty::Count { min, max } => {
            if let Some(Err(e)) = v.as_u64().map(|n| bounds::count(path, n, *min, *max)) {
                problem(seen, e.to_string());
            }
        }
        Ty::Duration { min, max } => {
            let Some(d) = v.as_str().and_then(|s| s.parse::<Dur>().ok()) else { return };
            if let Err(e) = bounds::duration(path, d, Dur::default(), *max) {
                problem(seen, e.to_string());
            } else if d < *min && min.as_millis() == 1 {
                problem(seen, format!("{path} must be longer than 0s"));
            } else if d < *min {
                problem(seen, format!("{path} must be at least {min}"));
            }
        }
        Ty::Object(inner) => check_ranges(inner, v, path, seen, problems),
        Ty::List(t) | Ty::NonEmptyList(t) => {
            for (i, item) in v.as_array().into_iter().flatten().enumerate() {
                check_value(f, t, item, &format!("{path}[{i}]"), seen, problems);
            }
            return;
        }
        _ => {}
    }
    *seen.entry(f.name).or_default() += 1;
}

type Sink<'e> = dyn FnMut(&str, usize, String) + 'e;

fn check_roster(r: &RosterSpec, err: &mut Sink) {
    for m in &r.machines {
        name_of("label", &m.label, err);
        for a in &m.aliases {
            name_of("alias", a, err);
        }
        if let Some(h) = &m.hostname
            && let Err(e) = text::check_line(h)
        {
            err(h, 0, format!("hostname {e}"));
        }
    }
}

fn check_mail_policy(p: &MailPolicySpec, err: &mut Sink) {
    if let Some(n) = &p.notify
        && (!(n.webhook.starts_with("http://") || n.webhook.starts_with("https://"))
            || text::check_line(&n.webhook).is_err())
    {
        err("webhook", 0, format!("notify.webhook {:?} must be an http:// or https:// URL", n.webhook));
    }
}

fn check_intent_policy(p: &IntentPolicySpec, err: &mut Sink) {
    name_of("channel", &p.channel, err);
    for r in &p.recorders {
        name_of("recorders", r, err);
    }
    for (field, tool) in [("replyTool", &p.reply_tool), ("reactTool", &p.react_tool)] {
        if tool.is_empty() || text::check_line(tool).is_err() {
            err(field, 0, format!("{field} {tool:?} must be a tool name on one line"));
        }
    }
}

fn check_worker_pool(w: &WorkerPoolSpec, err: &mut Sink) {
    // The table bounds each lease on its own; a lease is also at most the pool's maxLease.
    let max_lease = w.max_lease.unwrap_or(bounds::DEFAULT_MAX_LEASE);
    let within = |d: Dur| (bounds::MIN_LEASE..=bounds::MAX_MAX_LEASE).contains(&d);
    if within(max_lease)
        && within(w.lease_duration)
        && let Err(e) = bounds::duration("leaseDuration", w.lease_duration, bounds::MIN_LEASE, max_lease)
    {
        err("leaseDuration", 0, format!("{e} (the pool's maxLease)"));
    }
    for q in &w.queues {
        name_of("queues", q, err);
    }
    for m in &w.external_workers {
        name_of("externalWorkers", m, err);
    }
}

fn check_function(f: &FunctionSpec, err: &mut Sink) {
    if f.command.first().is_none_or(|c| c.trim().is_empty()) {
        err("command", 0, "command must name a program as its first element".into());
    }
    if let Some(i) = f.command.iter().position(|a| a.contains('\0')) {
        err("command", 0, format!("command[{i}] contains NUL, which no program can receive"));
    }
    for (k, v) in &f.env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            err("env", 0, format!("env {k:?} must be a name without '=' or NUL, and its value without NUL"));
        }
    }
}

fn check_ledger(l: &LedgerSpec, err: &mut Sink) {
    name_of("project", &l.project, err);
    for p in &l.pushers {
        name_of("pushers", &p.machine, err);
        if let Some(s) = p.sources.iter().find(|s| s.is_empty() || text::check_line(s).is_err()) {
            err("sources", 0, format!("pushers: source name {s:?} must be one line"));
        }
    }
    let mut names = BTreeSet::new();
    for s in &l.sources {
        if !names.insert(&s.name) {
            err(&s.name, 1, format!("source name {:?} is used twice", s.name));
        }
        if s.name.is_empty() || text::check_line(&s.name).is_err() {
            err(&s.name, 0, format!("source name {:?} must be one line", s.name));
        }
        if s.file.is_some() == s.command.is_some() {
            err(&s.name, 0, format!("source {:?} needs exactly one of `file` or `command`", s.name));
        }
        if s.name.starts_with("push:") {
            err(&s.name, 0, format!("source name {:?}: push: names a machine's own pushes", s.name));
        }
        let argv = s.command.iter().flatten().chain(&s.file);
        if argv.into_iter().any(|a| a.contains('\0')) {
            err(&s.name, 0, format!("source {:?}: file and command must not contain NUL", s.name));
        }
    }
}

fn check_schedule(s: &ScheduleSpec, err: &mut Sink) {
    if let Err(e) = crate::cron::parse_tz(&s.timezone) {
        err("timezone", 0, format!("timezone: {e}"));
    }
    if s.entries.is_empty() {
        err("entries", 0, "a Schedule needs at least one entry".into());
    }
    for e in &s.entries {
        if let Err(problem) = e.cron.parse::<crate::cron::Cron>() {
            err(&e.cron, 0, problem.to_string());
        }
    }
}

fn validate_spec(doc: &Document) -> Vec<ManifestError> {
    let mut errors: Vec<ManifestError> =
        check_object(&doc.name, &doc.spec).into_iter().map(|p| doc.error_at(&p.needle, p.nth, p.message)).collect();
    if let Spec::Roster(r) = &doc.spec {
        errors.extend(validate_roster(doc, r));
    }
    // T6 for labels too: short, one line, no NUL or bidi override; keys without spaces.
    for (key, value) in &doc.labels {
        let bad_key = key.is_empty() || key.contains(char::is_whitespace) || text::check_line(key).is_err();
        if bad_key || key.chars().count() > 63 || value.chars().count() > 63 || text::check_line(value).is_err() {
            errors.push(doc.error_at(
                "labels:",
                0,
                format!("label {key:?}: keys and values are one line of at most 63 characters, keys without spaces"),
            ));
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
        let own: BTreeSet<String> = m.names().map(|n| n.to_lowercase()).collect();
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

/// T6 for a name inside a spec (a label, a queue, a project), pointed at where it is written.
fn name_of(field: &str, value: &str, err: &mut Sink) {
    if let Err(e) = text::check_name(value) {
        err(value, 0, format!("{field}: {e}"));
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
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: pc1\n  machines:\n  - {number: 1, label: pc1}\n  - {number: 1, label: pc2, aliases: [pc1]}\n",
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
        assert!(errors[0].message.contains("ttl 99999d is out of range: it must be at most 365d"), "{errors:?}");
        assert_eq!(errors[0].line, 5);
    }

    #[test]
    fn the_same_object_twice_in_one_apply_is_refused() {
        let doc =
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: f}\nspec: {command: [echo], mode: generate}\n";
        let errors = check(&format!("{doc}---\n{doc}"));
        assert!(errors[0].message.contains("function/f is defined twice"), "{errors:?}");
    }

    fn doc(kind: &str, spec: &str) -> String {
        format!("apiVersion: pcmail/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec:\n{spec}")
    }

    #[track_caller]
    fn refused(kind: &str, spec: &str, needle: &str) -> ManifestError {
        let errors = check(&doc(kind, spec));
        assert_eq!(errors.len(), 1, "{kind} {spec}: {errors:?}");
        assert!(errors[0].message.contains(needle), "{}", errors[0]);
        errors[0].clone()
    }

    #[test]
    fn t6_names_in_specs_are_lowercase_dns_labels() {
        refused(
            "Roster",
            "  owner: Desk\n  machines:\n  - {number: 1, label: Desk}\n",
            "label: \"Desk\" is not a valid name",
        );
        refused("Roster", "  owner: a\n  machines:\n  - {number: 1, label: a, aliases: [\"b\\u202E\"]}\n", "alias:");
        refused("Roster", "  owner: a\n  machines:\n  - {number: 1, label: a, aliases: [\"<b>x</b>\"]}\n", "alias:");
        refused("WorkerPool", "  workers: 1\n  queues: [Q]\n", "queues: \"Q\"");
        refused("WorkerPool", "  workers: 1\n  queues: [q]\n  externalWorkers: [\"a b\"]\n", "externalWorkers:");
        refused("Ledger", "  project: \"a/b?c#d\"\n", "project: \"a/b?c#d\"");
        refused("IntentPolicy", "  recorders: [Desk]\n", "recorders:");
        let errors = check(
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: a.b}\nspec: {command: [x], mode: generate}\n",
        );
        assert!(errors[0].message.contains("metadata.name \"a.b\" is not a valid name"), "{errors:?}");
        assert_eq!(errors[0].line, 3);
    }

    #[test]
    fn t19_recorders_external_workers_and_pushers_name_machines_of_the_roster() {
        let roster = "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: desk\n  machines:\n  - {number: 1, label: desk, aliases: [main]}\n---\n";
        let with = |kind: &str, spec: &str| check(&format!("{roster}{}", doc(kind, spec)));
        assert!(with("IntentPolicy", "  recorders: [desk]\n").is_empty());
        let e = with("IntentPolicy", "  recorders: [desk, ghost]\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].message.contains("\"ghost\", which is no machine of the Roster (T19)"), "{}", e[0]);
        let e = with("WorkerPool", "  workers: 0\n  queues: [q]\n  externalWorkers: [main]\n");
        assert!(e[0].message.contains("a name of desk; use its label"), "{e:?}");
        let e = with("Ledger", "  project: office\n  pushers:\n  - {machine: builder, sources: [ci]}\n");
        assert!(e[0].message.contains("pushers names \"builder\""), "{e:?}");
        // Without a Roster nothing is a machine; a stored Roster counts like one applied with it.
        refused("IntentPolicy", "  recorders: [desk]\n", "no Roster is applied");
        let docs = parse_file("m.yaml", roster).expect("roster");
        let Spec::Roster(r) = &docs[0].spec else { panic!("a roster") };
        let stored = SpecRecord {
            kind: Kind::Roster,
            name: "office".into(),
            labels: BTreeMap::new(),
            generation: 1,
            spec: serde_json::to_value(r).expect("json"),
            status: super::super::Status::default(),
            created_at: chrono::DateTime::UNIX_EPOCH,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        };
        let policy = parse_file("p.yaml", &doc("IntentPolicy", "  recorders: [desk]\n")).expect("policy");
        assert!(validate_documents(&policy, std::slice::from_ref(&stored)).is_empty());
    }

    #[test]
    fn t19_a_roster_cannot_drop_a_machine_a_stored_object_names() {
        let stored = |kind: Kind, spec: serde_json::Value| SpecRecord {
            kind,
            name: "x".into(),
            labels: BTreeMap::new(),
            generation: 1,
            spec,
            status: super::super::Status::default(),
            created_at: chrono::DateTime::UNIX_EPOCH,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        };
        let policy = stored(Kind::IntentPolicy, serde_json::json!({"recorders": ["desk"]}));
        let pool =
            stored(Kind::WorkerPool, serde_json::json!({"workers": 0, "queues": ["q"], "externalWorkers": ["laptop"]}));
        let without_desk = parse_file(
            "r.yaml",
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: office}\nspec:\n  owner: laptop\n  machines:\n  - {number: 2, label: laptop}\n",
        )
        .expect("roster");
        let errors = validate_documents(&without_desk, &[policy.clone(), pool.clone()]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].message.contains("no machine \"desk\", which intentpolicy/x names in recorders (T19)"),
            "{}",
            errors[0]
        );
        assert_eq!(errors[0].line, 6, "placed at machines:");
        // Changing the policy in the same apply is the way through.
        let mut both = without_desk.clone();
        both.extend(parse_file("p.yaml", &doc("IntentPolicy", "  recorders: [laptop]\n")).expect("policy"));
        assert!(validate_documents(&both, &[policy.clone(), pool.clone()]).is_empty());
        // Deleting the Roster: every label named is missing.
        let missing = still_named([&policy, &pool], &[]);
        assert_eq!(
            missing,
            vec![
                ("intentpolicy/x".to_string(), "recorders", "desk".to_string()),
                ("workerpool/x".to_string(), "externalWorkers", "laptop".to_string())
            ]
        );
    }

    #[test]
    fn t6_labels_are_short_single_lines() {
        for labels in ["{\"A B\": c}", "{a: \"b\\nc\"}", "{a: \"b\\u202e\"}"] {
            let text = format!(
                "apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: f, labels: {labels}}}\nspec: {{command: [x], mode: generate}}\n"
            );
            let errors = check(&text);
            assert!(errors.iter().any(|e| e.message.contains("keys and values are one line")), "{labels}: {errors:?}");
        }
        let fine = "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: f, labels: {team: office}}\nspec: {command: [x], mode: generate}\n";
        assert!(check(fine).is_empty());
    }

    #[test]
    fn t7_each_invalid_schedule_and_function_field_is_refused_at_its_line() {
        let e = refused(
            "Schedule",
            "  timezone: Mars/Olympus\n  entries: [{role: sync, cron: \"0 2 * * *\"}]\n",
            "Mars/Olympus",
        );
        assert_eq!(e.line, 5);
        let e = refused("Schedule", "  entries:\n  - {role: sync, cron: \"99 99 99 99 99\"}\n", "minute field \"99\"");
        assert_eq!(e.line, 6);
        refused("Schedule", "  entries: [{role: sync, cron: \"0 2 * *\"}]\n", "expected 5 fields");
        refused(
            "Schedule",
            "  entries: [{role: sync, cron: \"0 2 * * *\", maxPerRun: 0}]\n",
            "maxPerRun 0 is out of range",
        );
        refused("Function", "  command: [\"ec\\0ho\"]\n  mode: generate\n", "command[0] contains NUL");
        refused("Function", "  command: [echo]\n  mode: generate\n  env: {\"A=B\": x}\n", "env \"A=B\"");
        refused(
            "Function",
            "  command: [echo]\n  mode: generate\n  rateLimit: {perMinute: 0}\n",
            "rateLimit.perMinute 0",
        );
        refused("Function", "  command: [echo]\n  mode: generate\n  timeout: 0s\n", "timeout must be longer");
    }

    #[test]
    fn t5_pool_leases_attempts_and_counts_have_ranges() {
        refused("WorkerPool", "  workers: 1\n  maxLease: 2d\n", "maxLease 2d is out of range: it must be at most 1d");
        refused(
            "WorkerPool",
            "  workers: 1\n  leaseDuration: 2h\n",
            "leaseDuration 2h is out of range: it must be at most 1h",
        );
        assert!(check(&doc("WorkerPool", "  workers: 1\n  leaseDuration: 2h\n  maxLease: 3h\n")).is_empty());
        refused("WorkerPool", "  workers: 1\n  maxAttempts: 101\n", "maxAttempts 101 is out of range");
        refused("WorkerPool", "  workers: 257\n", "workers 257 is out of range");
        refused("MailPolicy", "  maxHop: 0\n", "maxHop 0 is out of range");
        refused("Ledger", "  project: p\n  viewCap: 0\n", "viewCap 0");
        refused("MailPolicy", "  ttl: 366d\n", "ttl 366d is out of range");
    }

    #[test]
    fn t5_t6_a_stored_object_is_checked_by_the_same_rules_without_a_document() {
        let spec = Spec::WorkerPool(WorkerPoolSpec { queues: vec!["Bad Queue".into()], ..WorkerPoolSpec::default() });
        let problems = check_object("Old.Pool", &spec);
        let messages: Vec<&str> = problems.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(problems.len(), 2, "{messages:?}");
        assert!(messages[0].contains("metadata.name \"Old.Pool\"") && messages[1].contains("queues: \"Bad Queue\""));
        assert!(check_object("ok", &Spec::WorkerPool(WorkerPoolSpec::default())).is_empty());
    }

    #[test]
    fn ledger_source_needs_exactly_one_of_file_or_command() {
        let errors = check(
            "apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {name: l}\nspec:\n  project: p\n  sources:\n  - {name: s, file: a.csv, command: [cat]}\n",
        );
        assert!(errors[0].message.contains("exactly one of"), "{errors:?}");
    }
}
