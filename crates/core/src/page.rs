//! U3: every listing — mail, ledger rows, jobs, alerts — narrowed by the same filters and paged
//! by a cursor (the place of the last item shown), so a page never shifts when items arrive,
//! change or leave the filter.
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

/// T15: the most bytes one page of a listing answers; a page whose items would pass it is
/// answered short (at least one item), the rest counted in `x-pcmail-more` and reached by the
/// cursor as always. With the connection's own buffers (a 64 KiB read buffer) a client that
/// never reads its answer holds well under 1 MiB of the server, and a burst of large pages
/// read at once leaves little behind in the allocator.
pub const MAX_PAGE_BYTES: usize = 256 * 1024;

/// T15: whether the next item (`next` bytes) joins a page that already has `shown` items in
/// `used` bytes: while the page stays within `budget`, and always the first item, so a cursor
/// moves even past an item larger than the budget.
pub fn fits(used: usize, next: usize, shown: usize, budget: usize) -> bool {
    shown == 0 || used.saturating_add(next) <= budget
}

/// T15: the items that fit `budget` bytes (each `size` long), in order and at least the first,
/// and how many were left out.
pub fn within_bytes<T>(items: Vec<T>, budget: usize, size: impl Fn(&T) -> usize) -> (Vec<T>, u64) {
    let total = items.len();
    let mut used = 0usize;
    let kept: Vec<T> = items
        .into_iter()
        .enumerate()
        .take_while(|(i, item)| {
            let n = size(item);
            let keep = fits(used, n, *i, budget);
            used = used.saturating_add(n);
            keep
        })
        .map(|(_, item)| item)
        .collect();
    let left = (total - kept.len()) as u64;
    (kept, left)
}

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
    /// The cursor: the page starts after this place (the last item of the page before).
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

/// One page of `items` (already filtered): at most `limit` of those whose position is after the
/// cursor's, in position order, and how many follow the page. The cursor is a position, not an
/// item (keyset paging): an item that changed, moved or left the filter since the cursor was
/// taken shifts nothing, so no page repeats or skips one.
pub fn page<T, K: Ord>(
    mut items: Vec<T>,
    after: Option<&K>,
    limit: usize,
    position: impl Fn(&T) -> K,
) -> (Vec<T>, u64) {
    items.sort_by_key(|item| position(item));
    let rest: Vec<T> = match after {
        None => items,
        Some(cursor) => items.into_iter().filter(|item| position(item) > *cursor).collect(),
    };
    let more = rest.len().saturating_sub(limit) as u64;
    (rest.into_iter().take(limit).collect(), more)
}

/// A ledger row's place in the listing: project, then the number of its id.
type RowPosition = (String, u64, String);

fn row_position(row: &Row) -> RowPosition {
    position_of(&row.project, &row.id)
}

fn position_of(project: &str, id: &str) -> RowPosition {
    let number = id.trim_start_matches(|c: char| !c.is_ascii_digit()).parse().unwrap_or(u64::MAX);
    (project.to_string(), number, id.to_string())
}

/// The cursor a ledger row leaves for the next page: `project/T-0001`.
pub fn row_cursor(row: &Row) -> String {
    format!("{}/{}", row.project, row.id)
}

/// A page of ledger rows after a [`row_cursor`]; a cursor that is not one is an empty page.
pub fn rows_page(rows: Vec<Row>, after: Option<&str>, limit: usize) -> (Vec<Row>, u64) {
    let cursor = match after.map(|a| a.split_once('/')) {
        None => None,
        Some(Some((project, id))) => Some(position_of(project, id)),
        Some(None) => return (vec![], 0),
    };
    page(rows, cursor.as_ref(), limit, row_position)
}

/// An alert's place in the listing: most recently changed first, then kind and subject.
type AlertPosition = (std::cmp::Reverse<i64>, String, String);

fn alert_position(alert: &Alert) -> AlertPosition {
    (std::cmp::Reverse(alert.updated_at.timestamp_millis()), alert.kind.as_str().to_string(), alert.subject.clone())
}

/// The cursor an alert leaves for the next page: `<changed, ms>/<kind>/<subject>`.
pub fn alert_cursor(alert: &Alert) -> String {
    format!("{}/{}/{}", alert.updated_at.timestamp_millis(), alert.kind.as_str(), alert.subject)
}

/// A page of alerts after an [`alert_cursor`]; a cursor that is not one is an empty page.
pub fn alerts_page(alerts: Vec<Alert>, after: Option<&str>, limit: usize) -> (Vec<Alert>, u64) {
    let cursor = match after {
        None => None,
        Some(a) => {
            let mut parts = a.splitn(3, '/');
            match (parts.next().and_then(|ms| ms.parse::<i64>().ok()), parts.next(), parts.next()) {
                (Some(ms), Some(kind), Some(subject)) => {
                    Some((std::cmp::Reverse(ms), kind.to_string(), subject.to_string()))
                }
                _ => return (vec![], 0),
            }
        }
    };
    page(alerts, cursor.as_ref(), limit, alert_position)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u3_pages_follow_the_cursor_and_count_what_is_left() {
        let items: Vec<u32> = (1..=120).collect();
        let (first, more) = page(items.clone(), None, 50, |n| *n);
        assert_eq!((first.len(), first[0], more), (50, 1, 70));
        let (second, more) = page(items.clone(), Some(&50), 50, |n| *n);
        assert_eq!((second[0], second[49], more), (51, 100, 20));
        let (last, more) = page(items.clone(), Some(&100), 50, |n| *n);
        assert_eq!((last.len(), more), (20, 0));
        // The cursor is a position: the item it was taken from may be gone (or filtered out).
        let without_50: Vec<u32> = items.into_iter().filter(|n| *n != 50).collect();
        assert_eq!(page(without_50, Some(&50), 5, |n| *n).0, [51, 52, 53, 54, 55]);
    }

    fn alert(kind: &str, subject: &str, changed: i64) -> Alert {
        serde_json::from_value(serde_json::json!({
            "kind": kind, "subject": subject, "state": "firing", "summary": "", "labels": {},
            "firingSince": "2026-12-01T00:00:00Z", "resolvedAt": null, "notified": null, "lastSentAt": null,
            "updatedAt": chrono::DateTime::from_timestamp(changed, 0).unwrap_or_default(),
        }))
        .expect("an alert")
    }

    #[test]
    fn u3_an_alert_that_changes_between_pages_neither_repeats_nor_skips_one() {
        let alerts: Vec<Alert> = (1..=6).map(|n| alert("arrival", &format!("m-{n}"), 100 - n)).collect();
        let (first, more) = alerts_page(alerts.clone(), None, 3);
        let subjects = |a: &[Alert]| a.iter().map(|a| a.subject.clone()).collect::<Vec<_>>();
        assert_eq!((subjects(&first), more), (vec!["m-1".to_string(), "m-2".into(), "m-3".into()], 3));
        let cursor = alert_cursor(&first[2]);
        // m-3 changes (resolved) and jumps to the top: the next page is still m-4 to m-6.
        let mut changed = alerts;
        changed[2].updated_at = chrono::DateTime::from_timestamp(500, 0).unwrap_or_default();
        let (second, more) = alerts_page(changed, Some(&cursor), 3);
        assert_eq!((subjects(&second), more), (vec!["m-4".to_string(), "m-5".into(), "m-6".into()], 0));
        assert_eq!(alerts_page(second, Some("no cursor"), 3), (vec![], 0), "a cursor that is not one");
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
        assert_eq!(row_cursor(&row), "office/T-0001");
        let mut later = row.clone();
        later.id = "T-10000".into();
        let (after, more) = rows_page(vec![later, row.clone()], Some("office/T-9999"), 5);
        assert_eq!((after.len(), more), (1, 0), "ids past T-9999 follow it by number, not by text");
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

    #[test]
    fn t15_a_page_stops_before_the_item_that_passes_its_bytes_but_always_shows_one() {
        assert!(fits(0, 10 * MAX_PAGE_BYTES, 0, MAX_PAGE_BYTES), "the first item always");
        assert!(fits(100, MAX_PAGE_BYTES - 100, 1, MAX_PAGE_BYTES), "exactly full");
        assert!(!fits(100, MAX_PAGE_BYTES - 99, 1, MAX_PAGE_BYTES));
        assert!(!fits(usize::MAX, 1, 3, MAX_PAGE_BYTES), "no overflow");
        // 500 mails of 60 KiB: a page of 4, the other 496 counted as more.
        let shown =
            (0..500).scan(0usize, |used, i| fits(*used, 61_500, i, MAX_PAGE_BYTES).then(|| *used += 61_500)).count();
        assert_eq!(shown, 4);
        let (kept, left) = within_bytes(vec![100_000usize; 5], MAX_PAGE_BYTES, |n| *n);
        assert_eq!((kept.len(), left), (2, 3));
        let (kept, left) = within_bytes(vec![10 * MAX_PAGE_BYTES, 1], MAX_PAGE_BYTES, |n| *n);
        assert_eq!((kept.len(), left), (1, 1), "the first item always");
    }
}
