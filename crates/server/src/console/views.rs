//! The console's pages as templates over what the handlers read: no IO, no clock (the time a
//! page judges by comes in), so each renders the same for the same data.

use maud::{Markup, html};
use pcmail_core::Ts;
use pcmail_core::alert::{Alert, is_unread_past_sla};
use pcmail_core::api::Event;
use pcmail_core::jobs::{Job, JobState};
use pcmail_core::ledger::{Row, RowState, is_overdue};
use pcmail_core::mail::{Mail, MailState};
use pcmail_core::manifest::SpecRecord;
use pcmail_core::manifest::spec::MailPolicySpec;
use pcmail_core::page::Listing;
use pcmail_core::trail::Reason;

use pcmail_store::{Activity, Found, StateCount};

use super::chart::line_chart;
use super::html::{Lang, seg, t, table};

/// One sentence in the error colour.
pub fn message(text: &str) -> Markup {
    html! { p.error { (text) } }
}

pub fn login(l: Lang, error: Option<&str>) -> Markup {
    html! {
        @if let Some(e) = error { (message(e)) }
        form method="post" action="/ui/login" {
            label {
                (t(l, "Admin token (the contents of admin.token)", "管理トークン（admin.token の中身）")) " "
                input #token type="password" name="token" autocomplete="current-password";
            }
            button #login { (t(l, "Sign in", "ログイン")) }
        }
    }
}

fn state_label(l: Lang, s: RowState) -> &'static str {
    match l {
        Lang::Ja => s.ja(),
        Lang::En => s.as_str(),
    }
}

fn events_table(l: Lang, events: impl IntoIterator<Item = Event>) -> Markup {
    let rows = events
        .into_iter()
        .map(|e| vec![html! { (e.at.to_rfc3339()) }, html! { (e.reason) }, html! { (e.message) }, html! { (e.actor) }]);
    table(&[t(l, "At", "日時"), t(l, "Reason", "理由"), t(l, "Message", "内容"), t(l, "By", "操作者")], rows)
}

/// What the overview counts, read from the store's trigger-kept and grouped counts.
pub struct Totals {
    pub mail: Vec<(MailState, u64)>,
    pub ledger: Vec<StateCount<RowState>>,
    pub jobs: Vec<StateCount<JobState>>,
    pub alerts_firing: u64,
    /// V1: each machine's last poll and client version.
    pub machines: Vec<pcmail_core::api::MachineSeen>,
}

/// The 95th percentile of each hour's delivery times (ms) from `since`, 0 for an hour without
/// deliveries (nearest rank: the smallest time at least 95 % of the hour's deliveries took).
pub fn p95_per_hour(deliveries: &[(Ts, i64)], since: Ts, hours: usize) -> Vec<u64> {
    let mut per_hour: Vec<Vec<u64>> = vec![Vec::new(); hours];
    for (at, ms) in deliveries {
        // Floored, so a delivery just before `since` is no hour's (truncation would make it hour 0's).
        let hour = (*at - since).num_milliseconds().div_euclid(3_600_000);
        if let Some(slot) = usize::try_from(hour).ok().and_then(|h| per_hour.get_mut(h)) {
            slot.push(u64::try_from(*ms).unwrap_or(0));
        }
    }
    per_hour
        .into_iter()
        .map(|mut times| {
            times.sort_unstable();
            let rank = (times.len() * 95).div_ceil(100);
            rank.checked_sub(1).and_then(|i| times.get(i).copied()).unwrap_or(0)
        })
        .collect()
}

/// Hours the overview's charts span.
pub const CHART_HOURS: usize = 24;

/// U2: the office at a glance — mail, ledger rows and jobs by state, alerts firing — and the
/// last day's moves per hour (`activity`, from `since` in steps of an hour).
pub fn overview(l: Lang, totals: &Totals, activity: &[Activity], deliveries: &[(Ts, i64)], since: Ts) -> Markup {
    let total = |key: String, n: u64| html! { span.total data-total=(key) { (n) } };
    fn sum<S: PartialEq>(rows: &[StateCount<S>], state: S) -> u64 {
        rows.iter().filter(|r| r.state == state).map(|r| r.count).sum()
    }
    let per_hour = |series: &str| {
        let mut v = vec![0; CHART_HOURS];
        for a in activity.iter().filter(|a| a.series == series) {
            if let Some(slot) = v.get_mut(a.step as usize) {
                *slot += a.count;
            }
        }
        v
    };
    let mail_rows = MailState::ALL.iter().map(|s| {
        let n = totals.mail.iter().filter(|(st, _)| st == s).map(|(_, n)| n).sum();
        vec![html! { (s.as_str()) }, total(format!("mail:{}", s.as_str()), n)]
    });
    let ledger_rows = RowState::ALL.iter().map(|s| {
        vec![html! { (state_label(l, *s)) }, total(format!("ledger:{}", s.as_str()), sum(&totals.ledger, *s))]
    });
    let job_rows = JobState::ALL
        .iter()
        .map(|s| vec![html! { (s.as_str()) }, total(format!("jobs:{}", s.as_str()), sum(&totals.jobs, *s))]);
    let machine_rows = totals.machines.iter().map(|m| {
        let client = if m.client.is_empty() { "-" } else { m.client.as_str() };
        vec![
            html! { (m.name) },
            html! { time datetime=(m.last_poll_at.to_rfc3339()) { (m.last_poll_at.format("%Y-%m-%d %H:%M:%S")) } },
            html! { span data-client=(m.name) { (client) } },
        ]
    });
    let hours = (t(l, "24 h ago", "24時間前"), t(l, "now", "現在"));
    html! {
        div #totals data-live {
            p {
                a href="/ui/alerts" { (t(l, "Alerts firing", "発報中のアラート")) }
                ": " (total("alerts:firing".into(), totals.alerts_firing))
            }
            div.columns {
                section { h2 { a href="/ui/mail" { (t(l, "Mail", "メール")) } } (table(&[t(l, "State", "状態"), t(l, "Count", "件数")], mail_rows)) }
                section { h2 { a href="/ui/ledger" { (t(l, "Ledger", "台帳")) } } (table(&[t(l, "State", "状態"), t(l, "Count", "件数")], ledger_rows)) }
                section { h2 { a href="/ui/jobs" { (t(l, "Jobs", "ジョブ")) } } (table(&[t(l, "State", "状態"), t(l, "Count", "件数")], job_rows)) }
                section.wide {
                    h2 { (t(l, "Machines", "マシン")) }
                    (table(&[t(l, "Machine", "マシン"), t(l, "Last poll", "最終ポーリング"), t(l, "Client", "クライアント")], machine_rows))
                }
            }
        }
        div #charts data-live {
            (line_chart("chart-mail", t(l, "Mail moves per hour", "メールの動き（1時間ごと）"), hours, CHART_HOURS,
                &[Reason::Sent, Reason::Delivered, Reason::Seen, Reason::Done].map(|r| (r.as_str(), per_hour(&format!("mail:{r}"))))))
            (line_chart("chart-delivery", t(l, "Send → delivered, p95 per hour (ms)", "送信→配達 p95（1時間ごと, ms）"), hours, CHART_HOURS,
                &[("p95", p95_per_hour(deliveries, since, CHART_HOURS))]))
            (line_chart("chart-ledger", t(l, "Ledger runs per hour", "台帳の実行（1時間ごと）"), hours, CHART_HOURS,
                &[Reason::Succeeded, Reason::Failed].map(|r| (r.as_str(), per_hour(&format!("ledger:{r}"))))))
            (line_chart("chart-jobs", t(l, "Jobs ended per hour", "ジョブの終了（1時間ごと）"), hours, CHART_HOURS,
                &[JobState::Succeeded, JobState::Dead].map(|s| (s.as_str(), per_hour(&format!("job:{s}"))))))
        }
    }
}

/// U3: a page of ledger rows, filtered by project, state, function and assignee; review rows and
/// overdue dates marked, and counted over every row the filters match (`summary`); `today` judges
/// what is overdue.
pub fn ledger(l: Lang, rows: &[Row], summary: (usize, usize), today: &str, listed: &Listed) -> Markup {
    let (review, overdue) = summary;
    let cells = rows.iter().map(|r| {
        vec![
            html! { (r.project) },
            html! { a.row-id href={ "/ui/ledger/" (seg(&r.project)) "/" (seg(&r.id)) } { (r.id) } },
            html! { span.review[r.state == RowState::Review] { (state_label(l, r.state)) } },
            html! { (r.task) },
            html! { span.overdue[is_overdue(r, today)] { (r.due) } },
            html! { (r.function) },
            html! { (r.assignee) },
            html! { (r.failures) },
            html! { @if r.run_requested { "▶" } },
        ]
    });
    let headers = [
        t(l, "Project", "案件"),
        t(l, "Task ID", "タスクID"),
        t(l, "State", "状態"),
        t(l, "Task", "タスク"),
        t(l, "Due", "期限"),
        t(l, "AI function", "AI機能"),
        t(l, "Assignee", "担当"),
        t(l, "Failures", "失敗回数"),
        t(l, "▶Run", "▶AI実行"),
    ];
    let list = html! {
        div #ledger-rows data-live {
            p #summary { (t(l, "Waiting for review", "要確認")) ": " (review) " · " (t(l, "Overdue", "期限超過")) ": " (overdue) }
            (table(&headers, cells))
        }
    };
    listing_page(l, "/ui/ledger", listed, list)
}

/// One row: its fields, the correction form (with the session's CSRF token) and its history,
/// newest first; `error` says why the last correction was refused.
pub fn row(l: Lang, csrf: &str, row: &Row, history: Vec<Event>, error: Option<&str>) -> Markup {
    let fields = [
        (t(l, "State", "状態"), html! { span #state data-live { (state_label(l, row.state)) } }),
        (t(l, "Task", "タスク"), html! { (row.task) }),
        (t(l, "Content", "内容"), html! { pre { (row.content) } }),
        (t(l, "Source", "発生源"), html! { (row.source) }),
        (t(l, "Evidence", "根拠"), html! { (row.evidence) }),
        (t(l, "Due", "期限"), html! { (row.due) }),
        (t(l, "AI function", "AI機能"), html! { (row.function) }),
        (t(l, "Result", "実行結果"), html! { pre #result data-live { (row.result) } }),
        (t(l, "Executed at", "実行日時"), html! { @if let Some(at) = row.executed_at { (at.to_rfc3339()) } }),
        (t(l, "Failures", "失敗回数"), html! { (row.failures) }),
    ];
    html! {
        @if let Some(e) = error { p.error #error { (e) } }
        (table(&[t(l, "Field", "項目"), t(l, "Value", "値")], fields.into_iter().map(|(k, v)| vec![html! { (k) }, v])))
        form #edit method="post" action={ "/ui/ledger/" (seg(&row.project)) "/" (seg(&row.id)) } {
            input type="hidden" name="csrf" value=(csrf);
            label {
                (t(l, "State", "状態")) " "
                select #state-input name="state" {
                    @for s in RowState::ALL.iter().filter(|s| **s != RowState::Running) {
                        option value=(s.as_str()) selected[*s == row.state] { (state_label(l, *s)) }
                    }
                }
            }
            label {
                (t(l, "Correction instruction (goes to this row's next run)", "修正指示（この行の次の実行に渡ります）"))
                textarea #instruction name="instruction" { (row.instruction) }
            }
            label {
                input #run type="checkbox" name="run" value="on";
                " " (t(l, "▶ Run now (waits for the result)", "▶ いま実行する（結果を待ちます）"))
            }
            button #save { (t(l, "Save", "保存")) }
        }
        h2 { (t(l, "History", "履歴")) }
        div #history data-live { (events_table(l, history.into_iter().rev())) }
    }
}

/// U3: a page of mail, newest first, filtered by state and machine; red where unread past its
/// SLA at `now`.
pub fn mail(l: Lang, mails: &[Mail], policy: &MailPolicySpec, now: Ts, listed: &Listed) -> Markup {
    let headers = [
        "id",
        t(l, "From", "送信元"),
        t(l, "To", "宛先"),
        t(l, "State (red: unread past SLA)", "状態（赤: 未読 SLA 超過）"),
        t(l, "Subject", "件名"),
        t(l, "Sent", "送信日時"),
    ];
    let rows = mails.iter().map(|m| {
        vec![
            html! { a.mail-id href={ "/ui/mail/" (seg(&m.id)) } { (m.id) } },
            html! { (m.from) },
            html! { (m.to) },
            html! { span.overdue[is_unread_past_sla(m, policy, now)] { (m.state.as_str()) } },
            html! { (m.subject) },
            html! { (m.created_at.to_rfc3339()) },
        ]
    });
    listing_page(l, "/ui/mail", listed, html! { div #mail-list data-live { (table(&headers, rows)) } })
}

/// One mail: who to whom, its stamps and its timeline.
pub fn timeline(l: Lang, m: &Mail, events: Vec<Event>) -> Markup {
    let stamps = m.timeline().into_iter().filter_map(|e| {
        let at = e.at?;
        Some(vec![html! { (e.milestone.label()) }, html! { (at.to_rfc3339()) }])
    });
    html! {
        p { (m.from) " → " (m.to) " · " b { (m.state.as_str()) } }
        h2 { (m.subject) }
        pre { (m.body) }
        (table(&[t(l, "Stamp", "時刻"), t(l, "At", "日時")], stamps))
        h2 { (t(l, "Timeline", "経過")) }
        (events_table(l, events))
    }
}

/// U3: a page of alerts, most recently changed first, filtered by state and machine.
pub fn alerts(l: Lang, alerts: &[Alert], listed: &Listed) -> Markup {
    let rows = alerts.iter().map(|a| {
        vec![
            html! { (a.kind.as_str()) },
            html! { span.alert-subject { (a.subject) } },
            html! { (a.state.as_str()) },
            html! { (a.summary) },
            html! { @if let Some(n) = a.notified { (n.as_str()) } },
            html! { (a.updated_at.to_rfc3339()) },
        ]
    });
    let headers = [
        t(l, "Kind", "種類"),
        t(l, "Subject", "対象"),
        t(l, "State", "状態"),
        t(l, "Summary", "概要"),
        t(l, "Notified", "通知済み"),
        t(l, "Changed", "更新"),
    ];
    listing_page(l, "/ui/alerts", listed, html! { div #alert-list data-live { (table(&headers, rows)) } })
}

/// U3: a listing's link with its filters, from the page after `after`.
pub fn href(base: &str, listing: &Listing, after: Option<&str>) -> String {
    let query: Vec<String> =
        listing.with_cursor(after).pairs().iter().map(|(name, value)| format!("{name}={}", seg(value))).collect();
    if query.is_empty() { base.to_string() } else { format!("{base}?{}", query.join("&")) }
}

/// Where one page sits in what the filters match, and the key of its last item (the next page's
/// cursor).
pub struct Paged {
    /// Items the filters match, on every page.
    pub matching: u64,
    /// Of those, the ones after this page.
    pub left: u64,
    pub shown: usize,
    pub last: Option<String>,
}

/// A listing's filters, the choices its form offers and where its page sits.
pub struct Listed<'a> {
    pub listing: Listing,
    pub choices: Vec<Choice<'a>>,
    pub paged: Paged,
}

/// One select of a listing's filter form: the filter it sets, its label, its choices.
pub struct Choice<'a> {
    pub field: &'static str,
    pub label: &'a str,
    pub options: Vec<String>,
}

/// U3: a listing — its filter form, its total ("120 件 · 51–100"), the page (`list`, refreshed
/// live) and the links to the newest and the next page.
fn listing_page(l: Lang, base: &str, listed: &Listed, list: Markup) -> Markup {
    let Listed { listing, choices, paged } = listed;
    let Paged { matching, left, shown, last } = paged;
    let first = matching.saturating_sub(left + *shown as u64);
    html! {
        form #filter method="get" action=(base) {
            @for c in choices {
                label.inline {
                    (c.label) " "
                    select id={ "filter-" (c.field) } name=(c.field) {
                        option value="" { (t(l, "any", "すべて")) }
                        @for o in &c.options { option value=(o) selected[listing.get(c.field) == Some(o.as_str())] { (o) } }
                    }
                }
            }
            button #filter-apply { (t(l, "Show", "表示")) }
        }
        p #page-info data-live {
            (matching) " " (t(l, "in all", "件"))
            @if *shown > 0 { " · " (first + 1) "–" (first + *shown as u64) }
        }
        (list)
        p.pager #pager data-live {
            @if listing.after.is_some() { a #page-first href=(href(base, listing, None)) { "« " (t(l, "newest", "最初")) } " " }
            @if let (true, Some(last)) = (*left > 0, last) {
                a #page-next href=(href(base, listing, Some(last))) { (t(l, "next", "次へ")) " →" }
            }
        }
    }
}

/// A listing's filters as hidden fields, so a form posted from the page leads back to it.
fn hidden_listing(listing: &Listing) -> Markup {
    html! { @for (name, value) in listing.pairs() { input type="hidden" name=(name) value=(value); } }
}

/// Job counts by queue and state, then the listing: filters, one page, and a retry or cancel
/// button where a person may press one.
pub fn jobs(l: Lang, csrf: &str, counts: &[StateCount<JobState>], jobs: &[Job], listed: &Listed) -> Markup {
    let counts = counts.iter().map(|c| vec![html! { (c.group) }, html! { (c.state) }, html! { (c.count) }]);
    let action = |id: &str, verb: &str, label: &str| {
        html! {
            form.inline method="post" action={ "/ui/jobs/" (seg(id)) "/" (verb) } {
                input type="hidden" name="csrf" value=(csrf);
                (hidden_listing(&listed.listing))
                button.action data-job=(id) data-action=(verb) { (label) }
            }
        }
    };
    let rows = jobs.iter().map(|j| {
        let retry = matches!(j.state, JobState::Dead | JobState::Failed | JobState::Cancelled);
        let cancel = matches!(j.state, JobState::Queued | JobState::Failed | JobState::Running);
        vec![
            html! { span.job-id { (j.id) } },
            html! { (j.queue) },
            html! { (j.function) },
            html! { span.job-state { (j.state.as_str()) } },
            html! { (j.attempts) },
            html! { @if let Some(e) = &j.last_error { (e) } },
            html! {
                @if retry { (action(&j.id, "retry", t(l, "Retry", "再実行"))) }
                @if cancel { (action(&j.id, "cancel", t(l, "Cancel", "取消"))) }
            },
        ]
    });
    let headers = [
        "id",
        t(l, "Queue", "キュー"),
        t(l, "Function", "機能"),
        t(l, "State", "状態"),
        t(l, "Attempts", "試行"),
        t(l, "Last error", "直近のエラー"),
        t(l, "Actions", "操作"),
    ];
    html! {
        div #job-counts data-live { (table(&[t(l, "Queue", "キュー"), t(l, "State", "状態"), t(l, "Jobs", "件数")], counts)) }
        h2 { (t(l, "Jobs", "ジョブ")) }
        (listing_page(l, "/ui/jobs", listed, html! { div #job-list data-live { (table(&headers, rows)) } }))
    }
}

/// U5: what a search found, mail then ledger rows, each linked to its page.
pub fn search(l: Lang, text: &str, found: &Found) -> Markup {
    let mail = found.mail.iter().map(|m| {
        vec![
            html! { a href={ "/ui/mail/" (seg(&m.id)) } { (m.id) } },
            html! { (m.from) " → " (m.to) },
            html! { (m.state.as_str()) },
            html! { (m.subject) },
        ]
    });
    let rows = found.rows.iter().map(|r| {
        vec![
            html! { a href={ "/ui/ledger/" (seg(&r.project)) "/" (seg(&r.id)) } { (r.project) "/" (r.id) } },
            html! { (state_label(l, r.state)) },
            html! { (r.task) },
        ]
    });
    html! {
        form #search method="get" action="/ui/search" {
            label.inline {
                (t(l, "Text to find", "検索する語")) " "
                input #search-text type="search" name="q" value=(text);
            }
            button #search-go { (t(l, "Search", "検索")) }
        }
        @if found.truncated {
            p #search-truncated { (t(l, "The search stopped at its time budget: there may be more (a longer text finds fewer).", "検索は制限時間で打ち切られました。ほかにもあるかもしれません(長い語ほど絞れます)。")) }
        }
        @if !text.is_empty() {
            h2 { (t(l, "Mail", "メール")) " (" span #found-mail { (found.mail.len()) } ")" }
            (table(&["id", t(l, "From → to", "送信元 → 宛先"), t(l, "State", "状態"), t(l, "Subject", "件名")], mail))
            h2 { (t(l, "Ledger", "台帳")) " (" span #found-rows { (found.rows.len()) } ")" }
            (table(&[t(l, "Task ID", "タスクID"), t(l, "State", "状態"), t(l, "Task", "タスク")], rows))
        }
    }
}

/// Every spec object with its generation and conditions.
pub fn specs(l: Lang, specs: &[SpecRecord]) -> Markup {
    let rows = specs.iter().map(|s| {
        let conditions = html! {
            @for (i, c) in s.status.conditions.iter().enumerate() {
                @if i > 0 { br; }
                (c.type_) "=" (c.status) " (" (c.reason) ") " (c.message)
            }
        };
        vec![html! { (s.kind.as_str()) }, html! { (s.name) }, html! { (s.generation) }, conditions]
    });
    let headers = [t(l, "Kind", "種類"), t(l, "Name", "名前"), t(l, "Generation", "世代"), t(l, "Conditions", "状態")];
    table(&headers, rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(project: &str, task: &str, state: RowState, due: &str) -> Row {
        serde_json::from_value(serde_json::json!({
            "project": project, "id": "T-0001", "state": state, "runRequested": true, "task": task,
            "content": "", "source": "s", "evidence": "", "due": due, "assignee": "", "function": "draft",
            "result": "", "executedAt": null, "instruction": "", "key": "k", "failures": 0, "refresh": false,
        }))
        .expect("a row")
    }

    #[test]
    fn t9_the_ledger_shows_hostile_text_as_text_and_keeps_each_name_one_link_segment() {
        let rows = [row("a/b?c", "<script>steal()</script>", RowState::Review, "2026-12-01")];
        let listed = Listed {
            listing: Listing::default(),
            choices: vec![],
            paged: Paged { matching: 1, left: 0, shown: 1, last: None },
        };
        let page = ledger(Lang::Ja, &rows, (1, 1), "2026-12-02", &listed).into_string();
        assert!(!page.contains("<script>"), "{page}");
        assert!(page.contains("&lt;script&gt;steal()&lt;/script&gt;"), "{page}");
        assert!(page.contains("href=\"/ui/ledger/a%2Fb%3Fc/T-0001\""), "{page}");
        assert!(page.contains("要確認: 1 · 期限超過: 1"), "review and overdue counted: {page}");
        assert!(page.contains("<span class=\"review\">AI実行済(要確認)</span>"), "{page}");
        assert!(page.contains("<span class=\"overdue\">2026-12-01</span>"), "{page}");
    }

    #[test]
    fn u2_p95_per_hour_is_the_nearest_rank_of_each_hours_deliveries() {
        let since = chrono::DateTime::from_timestamp(0, 0).unwrap_or_default();
        let at = |secs| since + chrono::TimeDelta::seconds(secs);
        let mut deliveries: Vec<(Ts, i64)> = (1..=20).map(|ms| (at(10), ms)).collect();
        deliveries.push((at(3_600 * 2 + 5), 700));
        deliveries.push((at(-1), 9_999));
        deliveries.push((at(3_600 * 30), 9_999));
        assert_eq!(p95_per_hour(&deliveries, since, 3), vec![19, 0, 700], "19 of 20 took at most 19 ms");
    }
}
