//! What `apply` and `diff` would do: one pure diff of desired documents against stored objects.

use std::fmt;

use super::{Document, SpecRecord, Status};
use crate::Ts;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApplyOutcome {
    Created,
    Configured,
    Unchanged,
}

impl fmt::Display for ApplyOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ApplyOutcome::Created => "created",
            ApplyOutcome::Configured => "configured",
            ApplyOutcome::Unchanged => "unchanged",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApplyStep {
    pub outcome: ApplyOutcome,
    /// The object as it will be stored.
    pub record: SpecRecord,
    pub previous: Option<SpecRecord>,
}

/// Plans an apply. `generation` moves only when the spec changes; labels alone make the
/// object `configured` without a new generation, as in Kubernetes.
pub fn plan_apply(existing: &[SpecRecord], docs: &[Document], now: Ts) -> Vec<ApplyStep> {
    docs.iter()
        .map(|doc| {
            let spec = doc.spec.to_json();
            let previous = existing.iter().find(|r| r.kind == doc.kind() && r.name == doc.name);
            match previous {
                None => ApplyStep {
                    outcome: ApplyOutcome::Created,
                    record: SpecRecord {
                        kind: doc.kind(),
                        name: doc.name.clone(),
                        labels: doc.labels.clone(),
                        generation: 1,
                        spec,
                        status: Status::default(),
                        created_at: now,
                        updated_at: now,
                    },
                    previous: None,
                },
                Some(prev) => {
                    let spec_changed = prev.spec != spec;
                    let changed = spec_changed || prev.labels != doc.labels;
                    ApplyStep {
                        outcome: if changed { ApplyOutcome::Configured } else { ApplyOutcome::Unchanged },
                        record: SpecRecord {
                            labels: doc.labels.clone(),
                            generation: prev.generation + u64::from(spec_changed),
                            spec,
                            updated_at: if changed { now } else { prev.updated_at },
                            ..prev.clone()
                        },
                        previous: Some(prev.clone()),
                    }
                }
            }
        })
        .collect()
}

/// A minimal line diff (LCS) of two texts, `-`/`+`/` ` prefixed, for `diff -f`.
pub fn line_diff(old: &str, new: &str) -> String {
    let a: Vec<&str> = old.lines().collect();
    let b: Vec<&str> = new.lines().collect();
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            out += &format!("  {}\n", a[i]);
            i += 1;
            j += 1;
        } else if i < a.len() && (j == b.len() || lcs[i + 1][j] >= lcs[i][j + 1]) {
            out += &format!("- {}\n", a[i]);
            i += 1;
        } else {
            out += &format!("+ {}\n", b[j]);
            j += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::parse_file;
    use super::*;

    fn docs(spec: &str, labels: &str) -> Vec<Document> {
        let text = format!(
            "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {{name: default, labels: {{{labels}}}}}\nspec: {{{spec}}}\n"
        );
        parse_file("m.yaml", &text).expect("valid")
    }

    fn at(secs: i64) -> Ts {
        Ts::from_timestamp(secs, 0).unwrap_or_default()
    }

    #[test]
    fn apply_creates_then_leaves_unchanged_then_configures() {
        let first = plan_apply(&[], &docs("ttl: 1h", ""), at(1));
        assert_eq!(first[0].outcome, ApplyOutcome::Created);
        assert_eq!(first[0].record.generation, 1);
        let stored = vec![first[0].record.clone()];

        let again = plan_apply(&stored, &docs("ttl: 1h", ""), at(2));
        assert_eq!(again[0].outcome, ApplyOutcome::Unchanged);
        assert_eq!(again[0].record, stored[0]);

        let changed = plan_apply(&stored, &docs("ttl: 2h", ""), at(3));
        assert_eq!(changed[0].outcome, ApplyOutcome::Configured);
        assert_eq!(changed[0].record.generation, 2);
        assert_eq!(changed[0].record.created_at, at(1));
    }

    #[test]
    fn generation_changes_only_when_spec_changes() {
        let stored = vec![plan_apply(&[], &docs("ttl: 1h", ""), at(1))[0].record.clone()];
        let relabeled = plan_apply(&stored, &docs("ttl: 1h", "team: a"), at(2));
        assert_eq!(relabeled[0].outcome, ApplyOutcome::Configured);
        assert_eq!(relabeled[0].record.generation, 1);
        // Writing a default explicitly is the same spec.
        let explicit = plan_apply(&stored, &docs("ttl: 1h, maxHop: 3", ""), at(2));
        assert_eq!(explicit[0].outcome, ApplyOutcome::Unchanged);
    }

    #[test]
    fn line_diff_marks_removed_and_added_lines() {
        assert_eq!(line_diff("a\nb\nc\n", "a\nx\nc\n"), "  a\n- b\n+ x\n  c\n");
    }
}
