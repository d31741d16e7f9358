//! M3: recipients resolve by exact match on the Roster, never by substring.
//!
//! The old system matched `label.indexOf(to)`, so `kim` reached whichever PC polled first.
//! Here a name resolves only if it equals a label, a number, a hostname (case-insensitively) or
//! an alias of exactly one machine; otherwise nothing is sent and the closest names are offered.

use crate::manifest::spec::{Machine, RosterSpec};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("no Roster is applied, so no recipient can be resolved; apply one with `pcmail-ctl apply -f`")]
    NoRoster,
    #[error("recipient {query:?} does not exactly match any machine in the Roster")]
    Unresolved { query: String, candidates: Vec<String> },
}

impl ResolveError {
    pub fn candidates(&self) -> &[String] {
        match self {
            ResolveError::NoRoster => &[],
            ResolveError::Unresolved { candidates, .. } => candidates,
        }
    }
}

/// Resolves `query` to the canonical label of exactly one machine.
pub fn resolve(roster: Option<&RosterSpec>, query: &str) -> Result<String, ResolveError> {
    let roster = roster.ok_or(ResolveError::NoRoster)?;
    let q = query.trim();
    let q_lower = q.to_lowercase();
    let hit = |m: &&Machine| {
        m.label.to_lowercase() == q_lower
            || m.number.to_string() == q
            || m.hostname.as_ref().is_some_and(|h| h.to_lowercase() == q_lower)
            || m.aliases.iter().any(|a| a.to_lowercase() == q_lower)
    };
    let mut hits = roster.machines.iter().filter(hit);
    match (hits.next(), hits.next()) {
        (Some(m), None) => Ok(m.label.clone()),
        _ => Err(ResolveError::Unresolved { query: q.to_string(), candidates: candidates(roster, q) }),
    }
}

/// Up to three labels that look like `query`: containing it, contained in it, or within two
/// edits of one of the machine's names. Offered to the user, never used to deliver.
pub fn candidates(roster: &RosterSpec, query: &str) -> Vec<String> {
    let q = query.to_lowercase();
    let mut scored: Vec<(usize, &str)> = roster
        .machines
        .iter()
        .filter_map(|m| {
            m.names()
                .map(|n| n.to_lowercase())
                .filter_map(|n| {
                    if q.is_empty() {
                        None
                    } else if n.contains(&q) || q.contains(&n) {
                        Some(n.len().abs_diff(q.len()))
                    } else {
                        let d = edit_distance(&n, &q);
                        (d <= 2).then_some(d + 1)
                    }
                })
                .min()
                .map(|score| (score, m.label.as_str()))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(3).map(|(_, l)| l.to_string()).collect()
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roster() -> RosterSpec {
        let m = |number, label: &str, host: &str, aliases: &[&str]| Machine {
            number,
            label: label.into(),
            hostname: Some(host.into()),
            aliases: aliases.iter().map(|s| s.to_string()).collect(),
        };
        RosterSpec {
            owner: "kim-desk".into(),
            machines: vec![
                m(1, "kim-desk", "DESKTOP-K1", &["desk"]),
                m(2, "kim-laptop", "LAPTOP-K2", &[]),
                m(3, "lee", "lee-pc", &["builder"]),
            ],
        }
    }

    #[test]
    fn m3_exact_label_number_hostname_alias_resolve_to_label() {
        let r = roster();
        for q in ["kim-desk", "KIM-DESK", "1", "desktop-k1", "desk", " desk "] {
            assert_eq!(resolve(Some(&r), q), Ok("kim-desk".into()), "{q}");
        }
        assert_eq!(resolve(Some(&r), "builder"), Ok("lee".into()));
    }

    #[test]
    fn m3_partial_address_never_delivers() {
        let err = resolve(Some(&roster()), "kim").expect_err("partial must not resolve");
        assert_eq!(err.candidates(), ["kim-desk".to_string(), "kim-laptop".to_string()]);
        assert!(resolve(Some(&roster()), "le").is_err());
        assert!(resolve(Some(&roster()), "").is_err());
    }

    #[test]
    fn m3_near_misses_are_offered_as_candidates() {
        let err = resolve(Some(&roster()), "kim-dsk").expect_err("typo");
        assert_eq!(err.candidates().first().map(String::as_str), Some("kim-desk"));
    }

    #[test]
    fn m3_server_fails_closed_without_a_roster() {
        assert_eq!(resolve(None, "kim-desk"), Err(ResolveError::NoRoster));
    }
}
