//! The shell of `apply`, `diff` and `delete`: parse and validate (core), plan against the
//! stored objects (core), write in one transaction, then rebuild the runtime.

use pcmail_core::Ts;
use pcmail_core::api::{ApplyResult, Event, ManifestFile};
use pcmail_core::manifest::{
    ApplyOutcome, Document, Kind, ManifestError, line_diff, parse_file, plan_apply, still_named, validate_documents,
};
use pcmail_core::trail::{ObjectRef, Reason};
use pcmail_store::{SpecWrites, Store};

use crate::app::App;
use crate::error::ServiceError;
use crate::runtime;

fn parse_all(files: &[ManifestFile]) -> Result<Vec<Document>, Vec<ManifestError>> {
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for f in files {
        match parse_file(&f.name, &f.content) {
            Ok(d) => docs.extend(d),
            Err(e) => errors.extend(e),
        }
    }
    if errors.is_empty() { Ok(docs) } else { Err(errors) }
}

/// Validates everything first; any error applies nothing (all-or-nothing, DESIGN §3).
pub async fn apply(
    app: &App,
    files: Vec<ManifestFile>,
    dry_run: bool,
    now: Ts,
) -> Result<Vec<ApplyResult>, ServiceError> {
    let docs = parse_all(&files).map_err(ServiceError::invalid_manifest)?;
    if docs.is_empty() {
        return Err(ServiceError::bad_request("no objects found in the given manifests"));
    }
    let _serialized = app.lock_specs().await;
    let existing = app.store().list_specs().await?;
    let errors = validate_documents(&docs, &existing);
    if !errors.is_empty() {
        return Err(ServiceError::invalid_manifest(errors));
    }
    let steps = plan_apply(&existing, &docs, now);
    let results = steps
        .iter()
        .map(|s| ApplyResult {
            kind: s.record.kind.lower(),
            name: s.record.name.clone(),
            outcome: s.outcome,
            generation: s.record.generation,
            diff: match (&s.previous, s.outcome) {
                (_, ApplyOutcome::Unchanged) => String::new(),
                (Some(p), _) => line_diff(&yaml(&p.spec), &yaml(&s.record.spec)),
                (None, _) => line_diff("", &yaml(&s.record.spec)),
            },
        })
        .collect();
    if !dry_run {
        let changed: Vec<_> = steps.into_iter().filter(|s| s.outcome != ApplyOutcome::Unchanged).collect();
        let events = changed
            .iter()
            .map(|s| Event {
                at: now,
                object: ObjectRef::spec(s.record.kind, &s.record.name),
                reason: if s.outcome == ApplyOutcome::Created { Reason::Created } else { Reason::Configured },
                message: format!("generation {}", s.record.generation),
                actor: "admin".into(),
            })
            .collect();
        let upsert = changed.into_iter().map(|s| s.record).collect();
        app.store().write_specs(SpecWrites { upsert, delete: vec![], events }).await?;
        sync(app, now).await?;
    }
    Ok(results)
}

pub async fn delete(app: &App, kind: Kind, name: &str, now: Ts) -> Result<(), ServiceError> {
    let _serialized = app.lock_specs().await;
    let existing = app.store().list_specs().await?;
    if !existing.iter().any(|r| r.kind == kind && r.name == name) {
        return Err(ServiceError::not_found(format!("{}/{name} not found", kind.lower())));
    }
    if kind == Kind::Roster {
        let named = still_named(&existing, &[]);
        if let Some((object, field, machine)) = named.first() {
            return Err(ServiceError::conflict(format!(
                "roster/{name} cannot be deleted: {object} names its machine {machine:?} in {field} (T19){}; change or delete those first",
                match named.len() {
                    1 => String::new(),
                    n => format!(", and {} more name one", n - 1),
                }
            )));
        }
    }
    let event = Event {
        at: now,
        object: ObjectRef::spec(kind, name),
        reason: Reason::Deleted,
        message: String::new(),
        actor: "admin".into(),
    };
    app.store()
        .write_specs(SpecWrites { upsert: vec![], delete: vec![(kind, name.into())], events: vec![event] })
        .await?;
    sync(app, now).await?;
    Ok(())
}

/// Rebuilds the runtime from the store and writes the statuses that changed. The one path
/// for start-up, every apply and delete, and every resync.
pub async fn sync(app: &App, now: Ts) -> Result<(), pcmail_store::StoreError> {
    let specs = app.store().list_specs().await?;
    let (rt, statuses) = runtime::build(&specs, &app.health(), now);
    let ledgers: Vec<_> = rt.ledgers.iter().collect();
    let functions: Vec<_> = rt.functions.iter().map(|(n, f)| (n.as_str(), f)).collect();
    let pools: Vec<_> = rt.pools.iter().map(|(n, p)| (n.as_str(), p)).collect();
    let machines: Vec<String> = rt.roster.iter().flat_map(|r| r.machines.iter().map(|m| m.label.clone())).collect();
    app.metrics().declare_specs(&machines, &ledgers, &functions, &pools);
    // The pools follow the new runtime on their own (`controller::pools::run`).
    app.set_runtime(rt);
    // C1: statuses are the leader's to write, so replicas never overwrite each other's.
    if app.leadership().is_leader() {
        for (record, status) in statuses {
            app.store().set_spec_status(record.kind, &record.name, status).await?;
        }
    }
    Ok(())
}

fn yaml(v: &serde_json::Value) -> String {
    serde_yaml_ng::to_string(v).unwrap_or_else(|_| v.to_string())
}
