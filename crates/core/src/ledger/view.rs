//! L15 (the cross-project view) and L16 (purging a source's untouched rows).

use super::{Row, RowState};

/// One project's part of the view.
pub struct ViewProject<'a> {
    pub project: &'a str,
    pub rows: &'a [Row],
    /// Sources marked `countOnly`: shown as a count, never as rows.
    pub count_only: &'a [String],
    pub cap: usize,
}

/// L15: an open row past its due date (`today` and `due` as `YYYY-MM-DD`).
pub fn is_overdue(row: &Row, today: &str) -> bool {
    !row.state.is_closed() && !row.due.is_empty() && row.due.as_str() < today
}

/// One line of the cross-project view: what the CLI prints and the spreadsheet's view tab shows.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "line", rename_all = "camelCase")]
pub enum ViewLine {
    Project {
        project: String,
    },
    Row {
        row: Box<Row>,
        mark: Option<ViewMark>,
    },
    /// The rows past the project's cap: never cut silently.
    More {
        project: String,
        count: usize,
    },
    /// A `countOnly` source's open rows.
    Count {
        source: String,
        count: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ViewMark {
    Overdue,
    Review,
}

/// L15: open rows by due date (undated last), `countOnly` sources as counts, at most `cap`
/// rows a project with a `… N more` line, overdue and review marked.
pub fn view_lines(projects: &[ViewProject<'_>], today: &str) -> Vec<ViewLine> {
    let mut lines = Vec::new();
    for p in projects {
        let open: Vec<&Row> = p.rows.iter().filter(|r| !r.state.is_closed()).collect();
        let (counted, mut listed): (Vec<&Row>, Vec<&Row>) =
            open.into_iter().partition(|r| p.count_only.contains(&r.source));
        listed.sort_by(|a, b| (a.due.is_empty(), &a.due, &a.id).cmp(&(b.due.is_empty(), &b.due, &b.id)));
        lines.push(ViewLine::Project { project: p.project.to_string() });
        for r in listed.iter().take(p.cap) {
            let mark = match (r.state, is_overdue(r, today)) {
                (RowState::Review, _) => Some(ViewMark::Review),
                (_, true) => Some(ViewMark::Overdue),
                _ => None,
            };
            lines.push(ViewLine::Row { row: Box::new((*r).clone()), mark });
        }
        if listed.len() > p.cap {
            lines.push(ViewLine::More { project: p.project.to_string(), count: listed.len() - p.cap });
        }
        for source in p.count_only {
            let count = counted.iter().filter(|r| &r.source == source).count();
            lines.push(ViewLine::Count { source: source.clone(), count });
        }
    }
    lines
}

/// The view as text, a line each.
pub fn render_view(lines: &[ViewLine]) -> String {
    let mut out = String::new();
    for line in lines {
        match line {
            ViewLine::Project { project } => out += &format!("## {project}\n"),
            ViewLine::Row { row: r, mark } => {
                let mark = match mark {
                    Some(ViewMark::Review) => "[review] ",
                    Some(ViewMark::Overdue) => "[overdue] ",
                    None => "",
                };
                let due = if r.due.is_empty() { "-".to_string() } else { r.due.clone() };
                out += format!("{mark}{} {due} {} ({}) {}", r.id, r.task, r.state, r.assignee).trim_end();
                out.push('\n');
            }
            ViewLine::More { project, count } => out += &format!("… {count} more in {project}\n"),
            ViewLine::Count { source, count } => out += &format!("{source}: {count} open (see its own dashboard)\n"),
        }
    }
    out
}

/// L14 sync order: projects round-robin starting after the stored `cursor`, at most `cap` of
/// them; answers the projects to sync now and how many were left for next time.
pub fn sync_order<'a>(projects: &[&'a str], cursor: &str, cap: Option<usize>) -> (Vec<&'a str>, usize) {
    let mut sorted = projects.to_vec();
    sorted.sort_unstable();
    let start = sorted.iter().position(|p| *p > cursor).unwrap_or(0);
    let order: Vec<&str> = sorted.iter().cycle().skip(start).take(sorted.len()).copied().collect();
    let cap = cap.unwrap_or(order.len()).min(order.len());
    (order[..cap].to_vec(), order.len() - cap)
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PurgePlan {
    /// Untouched rows of the source, bottom-up (highest id first).
    pub delete: Vec<String>,
    /// Rows of the source that a person or a run touched, with the reason they stay.
    pub kept: Vec<(String, String)>,
}

/// L16: deletes only untouched rows (todo, empty result, empty instruction), bottom-up, and
/// says why every other row of the source stays.
pub fn plan_purge(rows: &[Row], source: &str) -> PurgePlan {
    let mut plan = PurgePlan::default();
    let mut mine: Vec<&Row> = rows.iter().filter(|r| r.source == source).collect();
    mine.sort_by(|a, b| b.id.len().cmp(&a.id.len()).then(b.id.cmp(&a.id)));
    for r in mine {
        let reason = if r.state != RowState::Todo {
            Some(format!("state is {} ({})", r.state, r.state.ja()))
        } else if !r.result.trim().is_empty() {
            Some("it has a result".to_string())
        } else if !r.instruction.trim().is_empty() {
            Some("it has a correction instruction".to_string())
        } else {
            None
        };
        match reason {
            Some(why) => plan.kept.push((r.id.clone(), why)),
            None => plan.delete.push(r.id.clone()),
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::row;
    use super::*;

    #[test]
    fn l16_purge_deletes_only_untouched_rows_bottom_up_and_says_why_others_stay() {
        let mut rows: Vec<Row> = (1..=5).map(|n| row(n, "old", &format!("t{n}"), RowState::Todo)).collect();
        rows[1].result = "x".into();
        rows[2].instruction = "y".into();
        rows[3].state = RowState::Done;
        rows.push(row(6, "other", "keep me", RowState::Todo));
        rows.push(row(10, "old", "t10", RowState::Todo));
        let plan = plan_purge(&rows, "old");
        assert_eq!(plan.delete, ["T-0010", "T-0005", "T-0001"]);
        let kept: Vec<&str> = plan.kept.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(kept, ["T-0004", "T-0003", "T-0002"]);
        assert!(plan.kept[0].1.contains("完了"));
    }

    #[test]
    fn l14_sync_walks_projects_round_robin_and_reports_what_it_left() {
        let projects = ["b", "a", "c"];
        assert_eq!(sync_order(&projects, "", Some(2)), (vec!["a", "b"], 1));
        assert_eq!(sync_order(&projects, "b", Some(2)), (vec!["c", "a"], 1), "from after the cursor, wrapping");
        assert_eq!(sync_order(&projects, "c", None), (vec!["a", "b", "c"], 0));
        assert_eq!(sync_order(&[], "x", Some(1)), (vec![], 0));
    }

    #[test]
    fn l15_overdue_is_an_open_row_past_its_due_date() {
        let mut r = row(1, "s", "t", RowState::Todo);
        assert!(!is_overdue(&r, "2026-12-01"), "no due date, never overdue");
        r.due = "2026-11-30".into();
        assert!(is_overdue(&r, "2026-12-01"));
        assert!(!is_overdue(&r, "2026-11-30"), "due today is not late");
        r.state = RowState::Done;
        assert!(!is_overdue(&r, "2026-12-01"), "closed rows are never overdue");
    }

    #[test]
    fn l15_view_sorts_by_due_caps_per_project_marks_and_counts() {
        let mut rows: Vec<Row> = (1..=4).map(|n| row(n, "s", &format!("task {n}"), RowState::Todo)).collect();
        rows[0].due = "2026-12-10".into();
        rows[1].due = "2026-11-01".into();
        rows[2].state = RowState::Review;
        rows[2].due = "2026-12-01".into();
        rows.push(row(5, "gantt", "from the gantt chart", RowState::Todo));
        rows.push(row(6, "s", "finished", RowState::Done));
        let count_only = vec!["gantt".to_string()];
        let view = render_view(&view_lines(
            &[ViewProject { project: "p", rows: &rows, count_only: &count_only, cap: 2 }],
            "2026-11-30",
        ));
        let lines: Vec<&str> = view.lines().collect();
        assert_eq!(lines[0], "## p");
        assert!(lines[1].starts_with("[overdue] T-0002 2026-11-01"), "{view}");
        assert!(lines[2].starts_with("[review] T-0003 2026-12-01"), "{view}");
        assert_eq!(lines[3], "… 2 more in p");
        assert_eq!(lines[4], "gantt: 1 open (see its own dashboard)");
        assert!(!view.contains("finished"));
    }
}
