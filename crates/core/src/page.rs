//! U3: every listing — mail, ledger rows, jobs, alerts — narrowed by the same filters and paged
//! by a cursor (the key of the last item shown), so a page never shifts when items arrive.
//!
//! Mail and jobs grow without bound and are paged by the store's SQL; ledger rows (kept by
//! people) and alerts (pruned by E7) are read whole and paged here.

use serde::Deserialize;

use crate::alert::Alert;
use crate::ledger::Row;

/// Items a console page shows.
pub const PER_PAGE: usize = 50;

/// The largest page a listing answers.
pub const MAX_PAGE: usize = 1000;

/// The largest page of mail: its bodies are larger.
pub const MAX_MAIL_PAGE: usize = 500;

/// The response header that says how many items the filters match after a page, on every
/// listing that answers a JSON array (the body keeps the shape older clients parse).
pub const MORE_HEADER: &str = "x-pcmail-more";

/// What a listing is narrowed to, and where its page starts; `None` is any. Each listing uses the
/// fields it has: mail has `state` and `machine` (from or to), ledger rows `project`, `state`,
/// `function` and `machine` (the assignee), jobs `queue`, `state` and `function`, alerts `state`
/// and `machine` (a label naming it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Listing {
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub machine: Option<String>,
    #[serde(default)]
    pub queue: Option<String>,
    #[serde(default)]
    pub function: Option<String>,
    /// The cursor: the page starts after this item (the last of the page before).
    #[serde(default)]
    pub after: Option<String>,
}

impl Listing {
    /// Blank fields as absent, so a form's "any" (`?queue=&state=dead`) filters by state alone.
    pub fn normalized(self) -> Listing {
        let given = |v: Option<String>| v.map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        Listing {
            project: given(self.project),
            state: given(self.state),
            machine: given(self.machine),
            queue: given(self.queue),
            function: given(self.function),
            after: given(self.after),
        }
    }

    /// The filters as `(name, value)` pairs, in a fixed order, the cursor last.
    pub fn pairs(&self) -> Vec<(&'static str, &str)> {
        [
            ("project", &self.project),
            ("state", &self.state),
            ("machine", &self.machine),
            ("queue", &self.queue),
            ("function", &self.function),
            ("after", &self.after),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value.as_deref()?)))
        .collect()
    }

    /// The value of the filter `name` (one of [`Listing::pairs`]'s names).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs().into_iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The same filters with another cursor.
    pub fn with_cursor(&self, after: Option<&str>) -> Listing {
        Listing { after: after.map(String::from), ..self.clone() }
    }

    pub fn row_matches(&self, row: &Row) -> bool {
        is(&self.project, &row.project)
            && is(&self.state, row.state.as_str())
            && is(&self.function, &row.function)
            && is(&self.machine, &row.assignee)
    }

    /// An alert is a machine's when any of its labels names it (`to`, `from`, `machine`).
    pub fn alert_matches(&self, alert: &Alert) -> bool {
        let names_machine =
            |m: &String| ["to", "from", "machine"].iter().any(|label| alert.labels.get(*label).is_some_and(|v| v == m));
        is(&self.state, alert.state.as_str()) && self.machine.as_ref().is_none_or(names_machine)
    }
}

fn is(wanted: &Option<String>, value: &str) -> bool {
    wanted.as_deref().is_none_or(|w| w == value)
}

/// One page of `items` (already filtered, in listing order): at most `limit` after the item keyed
/// `after`, and how many follow the page. A cursor that names no item is an empty page, never the
/// first: a stale or foreign cursor shows nothing rather than restarting.
pub fn page<T>(items: Vec<T>, after: Option<&str>, limit: usize, key: impl Fn(&T) -> String) -> (Vec<T>, u64) {
    let start = match after {
        None => 0,
        Some(cursor) => match items.iter().position(|item| key(item) == cursor) {
            Some(i) => i + 1,
            None => items.len(),
        },
    };
    let rest = items.len().saturating_sub(start);
    let shown: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    let more = (rest - shown.len()) as u64;
    (shown, more)
}

/// The key a ledger row is paged by across projects.
pub fn row_key(row: &Row) -> String {
    format!("{}/{}", row.project, row.id)
}

/// The key an alert is paged by (an alert is one per kind and subject).
pub fn alert_key(alert: &Alert) -> String {
    format!("{}/{}", alert.kind.as_str(), alert.subject)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u3_pages_follow_the_cursor_and_count_what_is_left() {
        let items: Vec<String> = (1..=120).map(|i| format!("i{i}")).collect();
        let key = |s: &String| s.clone();
        let (first, more) = page(items.clone(), None, 50, key);
        assert_eq!((first.len(), first[0].as_str(), more), (50, "i1", 70));
        let (second, more) = page(items.clone(), Some("i50"), 50, key);
        assert_eq!((second[0].as_str(), second[49].as_str(), more), ("i51", "i100", 20));
        let (last, more) = page(items.clone(), Some("i100"), 50, key);
        assert_eq!((last.len(), more), (20, 0));
        let (unknown, more) = page(items, Some("nobody"), 50, key);
        assert!(unknown.is_empty() && more == 0, "a cursor naming nothing is an empty page, not the first");
    }

    #[test]
    fn u3_filters_match_rows_by_project_state_function_and_assignee_and_alerts_by_a_machine_label() {
        let row: Row = serde_json::from_value(serde_json::json!({
            "project": "office", "id": "T-0001", "state": "review", "runRequested": false, "task": "t",
            "content": "", "source": "s", "evidence": "", "due": "", "assignee": "laptop", "function": "draft",
            "result": "", "executedAt": null, "instruction": "", "key": "k", "failures": 0, "refresh": false,
        }))
        .expect("a row");
        let by = |f: fn(&mut Listing)| {
            let mut l = Listing::default();
            f(&mut l);
            l
        };
        assert!(Listing::default().row_matches(&row));
        assert!(by(|l| l.state = Some("review".into())).row_matches(&row));
        assert!(!by(|l| l.state = Some("todo".into())).row_matches(&row));
        assert!(!by(|l| l.project = Some("home".into())).row_matches(&row));
        assert!(!by(|l| l.function = Some("research".into())).row_matches(&row));
        assert!(by(|l| l.machine = Some("laptop".into())).row_matches(&row));
        let alert: Alert = serde_json::from_value(serde_json::json!({
            "kind": "undelivered", "subject": "m-1", "state": "firing", "summary": "",
            "labels": {"to": "laptop", "from": "desk"}, "firingSince": "2026-12-01T00:00:00Z",
            "resolvedAt": null, "notified": null, "lastSentAt": null, "updatedAt": "2026-12-01T00:00:00Z",
        }))
        .expect("an alert");
        assert!(by(|l| l.machine = Some("desk".into())).alert_matches(&alert));
        assert!(!by(|l| l.machine = Some("builder".into())).alert_matches(&alert));
        assert!(!by(|l| l.state = Some("resolved".into())).alert_matches(&alert));
        assert_eq!(alert_key(&alert), "undelivered/m-1");
        assert_eq!(row_key(&row), "office/T-0001");
    }

    #[test]
    fn u3_blank_filters_are_any_and_the_cursor_comes_last() {
        let l = Listing {
            queue: Some(" ".into()),
            state: Some("dead".into()),
            after: Some("j-9".into()),
            ..Default::default()
        };
        let l = l.normalized();
        assert_eq!(l.queue, None);
        assert_eq!(l.pairs(), vec![("state", "dead"), ("after", "j-9")]);
    }
}
