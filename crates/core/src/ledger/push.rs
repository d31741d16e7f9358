//! T11: whose rows a push may write. A push's rows are keyed by their source (L4), so a
//! machine that may name only its own sources can neither create, fill nor refresh the rows
//! of another source — an admin's file, another machine's pushes — whose content goes into
//! an AI function's prompt.

use super::Incoming;
use crate::mail::Principal;
use crate::manifest::spec::LedgerSpec;

/// The source a machine's pushes go to when they name none: its own.
pub fn own_source(machine: &str) -> String {
    format!("push:{machine}")
}

/// A machine's item that names no source is of its own source (the admin must name one).
pub fn default_sources(who: &Principal, items: &mut [Incoming]) {
    if let Principal::Machine(machine) = who {
        for item in items.iter_mut().filter(|i| i.source.trim().is_empty()) {
            item.source = own_source(machine);
        }
    }
}

/// T11: the admin pushes to any source; a machine to its own (`push:<machine>`) and to the
/// sources its project's Ledger grants it in `pushers`. The refusal names the rule and what
/// the machine may use instead.
pub fn may_push(who: &Principal, source: &str, ledger: Option<&LedgerSpec>) -> Result<(), PushRefused> {
    let Principal::Machine(machine) = who else { return Ok(()) };
    let own = own_source(machine);
    let granted: Vec<String> = ledger
        .into_iter()
        .flat_map(|l| &l.pushers)
        .filter(|p| &p.machine == machine)
        .flat_map(|p| p.sources.iter().cloned())
        .collect();
    if source == own || granted.iter().any(|g| g == source) {
        return Ok(());
    }
    Err(PushRefused { machine: machine.clone(), own, granted, asked: source.to_string() })
}

/// T11: a machine named a source that is neither its own nor granted to it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{machine} may push only to its own source {own}{also} (T11; a Ledger grants more in `pushers`), not to {asked:?}",
    also = or_granted(.granted)
)]
pub struct PushRefused {
    pub machine: String,
    pub own: String,
    pub granted: Vec<String>,
    /// The source the push named.
    pub asked: String,
}

fn or_granted(granted: &[String]) -> String {
    if granted.is_empty() { String::new() } else { format!(" or {}", granted.join(", ")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::spec::Pusher;

    fn ledger() -> LedgerSpec {
        LedgerSpec {
            pushers: vec![Pusher { machine: "builder".into(), sources: vec!["ci".into()] }],
            ..LedgerSpec::new("office")
        }
    }

    #[test]
    fn t11_a_machine_pushes_only_to_its_own_source_and_those_granted_to_it() {
        let builder = Principal::Machine("builder".into());
        let l = ledger();
        assert_eq!(may_push(&builder, "push:builder", Some(&l)), Ok(()));
        assert_eq!(may_push(&builder, "ci", Some(&l)), Ok(()));
        let refused = may_push(&builder, "admin-file", Some(&l)).expect_err("another source").to_string();
        assert!(refused.contains("T11") && refused.contains("push:builder or ci"), "{refused}");
        let laptop = Principal::Machine("laptop".into());
        assert!(may_push(&laptop, "ci", Some(&l)).is_err(), "a grant is the named machine's only");
        assert!(may_push(&laptop, "push:builder", Some(&l)).is_err(), "another machine's own source");
        assert_eq!(may_push(&Principal::Admin, "admin-file", Some(&l)), Ok(()));
    }
}
