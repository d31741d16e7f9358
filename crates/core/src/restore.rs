//! E14: what a restore brings back, what the store it goes into held and loses, and when it
//! needs `--force`: going back in time (the target holds newer mail than the backup) or
//! replacing machine tokens (the target's token hashes are not the backup's). Pure: the CLI
//! surveys both stores and prints what this answers.

use std::collections::BTreeMap;

use crate::Ts;

/// One store as a restore weighs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holdings {
    /// Rows per tab, in the copy's tab order.
    pub rows: Vec<(String, u64)>,
    /// The highest mail `seq` (0 for none).
    pub last_seq: i64,
    /// When the newest mail was sent.
    pub newest_mail: Option<Ts>,
    /// Each machine's token hash.
    pub tokens: BTreeMap<String, String>,
}

impl Holdings {
    /// Whether the store holds any row at all.
    pub fn is_empty(&self) -> bool {
        self.rows.iter().all(|(_, n)| *n == 0)
    }

    /// One line: the tabs that hold rows with their counts, the newest mail, the machines with
    /// tokens.
    pub fn describe(&self) -> String {
        let tabs: Vec<String> = self.rows.iter().filter(|(_, n)| *n > 0).map(|(t, n)| format!("{t} {n}")).collect();
        if tabs.is_empty() {
            return "nothing".into();
        }
        let mut line = tabs.join(", ");
        if let Some(newest) = self.newest_mail {
            line.push_str(&format!("; newest mail {} (seq {})", newest.to_rfc3339(), self.last_seq));
        }
        if !self.tokens.is_empty() {
            let machines: Vec<&str> = self.tokens.keys().map(String::as_str).collect();
            line.push_str(&format!("; tokens of {}", machines.join(", ")));
        }
        line
    }
}

/// What a restore of `backup` over `target` does, and why it would need `--force`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestorePlan {
    /// Reasons the restore is refused without `--force`, each a sentence.
    pub needs_force: Vec<String>,
    /// Whether the target holds rows the restore replaces.
    pub replaces: bool,
}

/// E14: weighs a restore. Over an empty target nothing is lost. Over a store holding rows, the
/// restore replaces them all; it needs `--force` when that goes back in time — the target's
/// mail runs further (a higher seq, or a newer mail) than the backup's — or when it replaces
/// machine tokens (the target holds tokens and the backup's hashes differ: a revoked token
/// would come back, or this server's machines would be locked out by another's).
pub fn plan_restore(backup: &Holdings, target: &Holdings) -> RestorePlan {
    if target.is_empty() {
        return RestorePlan { needs_force: vec![], replaces: false };
    }
    let mut needs_force = Vec::new();
    let newer = match (target.newest_mail, backup.newest_mail) {
        (Some(t), Some(b)) => t > b,
        (Some(_), None) => true,
        _ => false,
    };
    if target.last_seq > backup.last_seq || newer {
        needs_force.push(format!(
            "the target holds newer mail than the backup (seq {} against {}): restoring goes back in time and \
             drops it",
            target.last_seq, backup.last_seq
        ));
    }
    if !target.tokens.is_empty() && target.tokens != backup.tokens {
        let mut machines: Vec<&str> = target
            .tokens
            .iter()
            .filter(|(m, h)| backup.tokens.get(*m) != Some(*h))
            .map(|(m, _)| m.as_str())
            .chain(backup.tokens.keys().filter(|m| !target.tokens.contains_key(*m)).map(String::as_str))
            .collect();
        machines.sort();
        machines.dedup();
        needs_force.push(format!(
            "the backup's machine tokens differ from the target's ({}): restoring replaces them",
            machines.join(", ")
        ));
    }
    RestorePlan { needs_force, replaces: true }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    fn held(seq: i64, newest: i64, tokens: &[(&str, &str)]) -> Holdings {
        Holdings {
            rows: vec![("specs".into(), 3), ("mail".into(), seq as u64), ("tokens".into(), tokens.len() as u64)],
            last_seq: seq,
            newest_mail: Some(at(newest)),
            tokens: tokens.iter().map(|(m, h)| (m.to_string(), h.to_string())).collect(),
        }
    }

    #[test]
    fn e14_a_restore_into_an_empty_store_needs_nothing() {
        let plan = plan_restore(&held(5, 50, &[("desk", "h1")]), &Holdings::default());
        assert_eq!(plan, RestorePlan { needs_force: vec![], replaces: false });
        assert_eq!(Holdings::default().describe(), "nothing");
    }

    #[test]
    fn e14_restoring_an_older_backup_goes_back_in_time_and_needs_force() {
        let plan = plan_restore(&held(5, 50, &[("desk", "h1")]), &held(9, 90, &[("desk", "h1")]));
        assert!(plan.replaces);
        assert_eq!(plan.needs_force.len(), 1);
        assert!(plan.needs_force[0].contains("seq 9 against 5"), "{:?}", plan.needs_force);
        // Newer mail by time alone (a store that was emptied and refilled) counts too.
        assert_eq!(plan_restore(&held(9, 50, &[]), &held(2, 90, &[])).needs_force.len(), 1);
        // The backup is as new or newer: nothing goes back.
        assert!(plan_restore(&held(9, 90, &[("desk", "h1")]), &held(5, 50, &[("desk", "h1")])).needs_force.is_empty());
    }

    #[test]
    fn e14_another_servers_tokens_or_a_revoked_one_need_force() {
        let target = held(5, 50, &[("desk", "h2"), ("laptop", "h3")]);
        let other = plan_restore(&held(5, 50, &[("desk", "h1"), ("laptop", "h3")]), &target);
        assert_eq!(other.needs_force.len(), 1);
        assert!(other.needs_force[0].contains("(desk)"), "{:?}", other.needs_force);
        let gone = plan_restore(&held(5, 50, &[("desk", "h2"), ("laptop", "h3"), ("old", "h9")]), &target);
        assert!(gone.needs_force[0].contains("(old)"), "a token the target no longer has: {:?}", gone.needs_force);
        let describe = target.describe();
        assert!(describe.contains("mail 5") && describe.contains("tokens of desk, laptop"), "{describe}");
    }
}
