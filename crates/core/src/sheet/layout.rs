//! Where a tab's fields are: columns are found by their header text, so people may reorder
//! columns or add their own (never read, never written). Headers come in a Japanese and an
//! English preset; either is recognized whatever preset the spreadsheet was created with.

/// One field of a tab: the store's column name, its headers, and who writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub key: &'static str,
    pub en: &'static str,
    pub ja: &'static str,
    /// People edit it in the spreadsheet (state, ▶run, correction instruction, …): their edit is
    /// taken into the store and never overwritten. Other fields are the controller's.
    pub editable: bool,
    /// A checkbox: written as a boolean, only on rows that exist.
    pub boolean: bool,
    /// A time: RFC 3339 in the sheet, milliseconds in the store.
    pub time: bool,
    /// A date people type (`YYYY-MM-DD` in the store): written as a date Sheets sorts by, and a
    /// date typed as one (read back as a serial number) read as `YYYY-MM-DD`.
    pub date: bool,
    /// The controller's bookkeeping, hidden from people (seed 001 §1: キー and 失敗回数).
    pub hidden: bool,
    /// Added to the layout after spreadsheets already had the tab: a header row without it
    /// gets it appended, where any other missing header is an error.
    pub late: bool,
    /// T1/T19: kept by the working copy alone; its cell is always written blank, so no one who
    /// can open the spreadsheet reads it (lease tokens).
    pub secret: bool,
}

const fn field(key: &'static str, en: &'static str, ja: &'static str) -> Field {
    Field {
        key,
        en,
        ja,
        editable: false,
        boolean: false,
        time: false,
        date: false,
        hidden: false,
        late: false,
        secret: false,
    }
}

/// A controller's column whose header is its store name in both presets.
const fn plain(key: &'static str) -> Field {
    field(key, key, key)
}

const fn time(f: Field) -> Field {
    Field { time: true, ..f }
}

const fn editable(f: Field) -> Field {
    Field { editable: true, ..f }
}

const fn checkbox(f: Field) -> Field {
    Field { boolean: true, ..f }
}

const fn date(f: Field) -> Field {
    Field { date: true, ..f }
}

const fn hidden(f: Field) -> Field {
    Field { hidden: true, ..f }
}

const fn late(f: Field) -> Field {
    Field { late: true, ..f }
}

const fn secret(f: Field) -> Field {
    Field { secret: true, ..f }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Ja,
    En,
}

impl Lang {
    pub fn header(self, f: &Field) -> &'static str {
        match self {
            Lang::Ja => f.ja,
            Lang::En => f.en,
        }
    }
}

/// A tab: its title, fields, and the fields that identify a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tab {
    pub title: &'static str,
    pub fields: &'static [Field],
    pub key: &'static [&'static str],
}

/// The title of a project's ledger tab (seed 001 §1: one ledger sheet per project).
pub fn ledger_title(lang: Lang, project: &str) -> String {
    match lang {
        Lang::Ja => format!("{LEDGER_JA}{project}"),
        Lang::En => format!("{LEDGER_EN}{project}"),
    }
}

/// X7: the projects that get a ledger tab — every project with rows or ids issued, and every
/// applied Ledger's project, rows or not (a person opening the sheet to add tasks by hand finds
/// the tab). Sorted, each once.
pub fn ledger_tab_projects(stored: Vec<String>, specs: &[crate::manifest::SpecRecord]) -> Vec<String> {
    let applied = specs
        .iter()
        .filter(|r| r.kind == crate::manifest::Kind::Ledger)
        .filter_map(|r| r.spec.get("project").and_then(|p| p.as_str()).map(str::to_string));
    let all: std::collections::BTreeSet<String> = stored.into_iter().chain(applied).collect();
    all.into_iter().collect()
}

/// The project a ledger tab's title names, in either preset./// The project a ledger tab's title names, in either preset.
pub fn ledger_project(title: &str) -> Option<&str> {
    title.strip_prefix(LEDGER_JA).or_else(|| title.strip_prefix(LEDGER_EN)).filter(|p| !p.is_empty())
}

const LEDGER_JA: &str = "台帳-";
const LEDGER_EN: &str = "ledger-";

/// The tab every project's ledger shared before a tab per project: migrated once, then renamed.
pub const SHARED_LEDGER_TITLE: &str = "ledger";

/// The cross-project view's tab (seed 001 §7), rebuilt by the `rebuild-view` role.
pub fn view_title(lang: Lang) -> &'static str {
    match lang {
        Lang::Ja => "横断ビュー",
        Lang::En => "view",
    }
}

/// The task ledger of seed 001, in its column order.
pub const LEDGER: Tab = Tab {
    title: "ledger",
    fields: &[
        field("project", "Project", "案件"),
        field("id", "Task ID", "タスクID"),
        editable(field("state", "State", "状態")),
        checkbox(editable(field("run_requested", "▶Run", "▶AI実行"))),
        field("task", "Task", "タスク"),
        field("content", "Content", "内容"),
        field("source", "Source", "発生源"),
        field("evidence", "Evidence", "根拠"),
        date(editable(field("due", "Due", "期限"))),
        editable(field("assignee", "Assignee", "担当")),
        field("function", "AI function", "AI機能"),
        field("result", "Result", "実行結果"),
        time(field("executed_at", "Executed at", "実行日時")),
        editable(field("instruction", "Instruction", "修正指示")),
        hidden(field("key", "Key", "キー")),
        hidden(field("failures", "Failures", "失敗回数")),
        checkbox(field("refresh", "Refresh", "集約")),
    ],
    key: &["project", "id"],
};

/// The mail tab: what people read to see where every mail is. The controller writes it all.
pub const MAIL: Tab = Tab {
    title: "mail",
    fields: &[
        plain("id"),
        plain("from"),
        plain("to"),
        plain("kind"),
        plain("subject"),
        plain("body"),
        checkbox(plain("urgent")),
        checkbox(plain("auto")),
        plain("hop"),
        plain("reply_to"),
        plain("channel"),
        plain("external_key"),
        plain("state"),
        time(plain("created_at")),
        time(plain("expires_at")),
        time(plain("delivered_at")),
        plain("delivered_by"),
        time(plain("seen_at")),
        plain("seen_by"),
        time(plain("done_at")),
        plain("result"),
        plain("fail_reason"),
        time(plain("presented_at")),
        plain("presented_session"),
        time(plain("last_reminded_at")),
    ],
    key: &["id"],
};

/// The job queue.
pub const JOBS: Tab = Tab {
    title: "jobs",
    fields: &[
        plain("id"),
        plain("queue"),
        plain("function"),
        plain("payload"),
        plain("state"),
        plain("priority"),
        plain("attempts"),
        plain("max_attempts"),
        time(plain("run_after")),
        plain("lease_owner"),
        secret(plain("lease_token")),
        time(plain("lease_expires_at")),
        time(plain("heartbeat_at")),
        plain("rescues"),
        plain("last_error"),
        plain("result"),
        plain("unique_key"),
        plain("ledger_ref"),
        time(plain("created_at")),
        time(plain("finished_at")),
        late(plain("enqueued_by")),
    ],
    key: &["id"],
};

/// Alerts (M9): one row per (kind, subject).
pub const ALERTS: Tab = Tab {
    title: "alerts",
    fields: &[
        plain("kind"),
        plain("subject"),
        plain("state"),
        plain("summary"),
        plain("labels"),
        time(plain("firing_since")),
        time(plain("resolved_at")),
        plain("notified"),
        time(plain("last_sent_at")),
        time(plain("updated_at")),
    ],
    key: &["kind", "subject"],
};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("tab {tab:?} has no column headed {header:?} (or {other:?}); add it to the header row")]
    MissingColumn { tab: String, header: String, other: String },
    #[error("tab {tab:?} has two columns headed {header:?}; rename one")]
    DuplicateColumn { tab: String, header: String },
}

/// The sheet column (0-based) of each field of `tab`, in field order, found in `header`. A
/// late field missing from it is placed after the header's last column (the caller writes its
/// header there: a column at or past `header.len()`).
pub fn locate(tab: &Tab, header: &[String]) -> Result<Vec<usize>, LayoutError> {
    let mut appended = header.len();
    tab.fields
        .iter()
        .map(|f| {
            let names = [f.ja, f.en, f.key];
            let mut hits = header.iter().enumerate().filter(|(_, h)| names.contains(&h.trim()));
            let Some((column, _)) = hits.next() else {
                if f.late {
                    appended += 1;
                    return Ok(appended - 1);
                }
                return Err(LayoutError::MissingColumn {
                    tab: tab.title.into(),
                    header: f.ja.into(),
                    other: f.en.into(),
                });
            };
            if hits.next().is_some() {
                return Err(LayoutError::DuplicateColumn { tab: tab.title.into(), header: header[column].clone() });
            }
            Ok(column)
        })
        .collect()
}

/// The header row a new tab gets.
pub fn header_row(tab: &Tab, lang: Lang) -> Vec<String> {
    tab.fields.iter().map(|f| lang.header(f).to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn x7_an_applied_ledger_gets_its_tab_rows_or_not() {
        let spec = |kind: crate::manifest::Kind, project: &str| crate::manifest::SpecRecord {
            kind,
            name: project.into(),
            labels: Default::default(),
            generation: 1,
            spec: serde_json::json!({"project": project}),
            status: Default::default(),
            created_at: crate::mail::fixtures::at(0),
            updated_at: crate::mail::fixtures::at(0),
        };
        let specs = [spec(crate::manifest::Kind::Ledger, "empty"), spec(crate::manifest::Kind::Roster, "not-a-ledger")];
        assert_eq!(ledger_tab_projects(strings(&["old", "empty"]), &specs), strings(&["empty", "old"]));
        assert_eq!(ledger_tab_projects(vec![], &specs), strings(&["empty"]));
    }

    #[test]
    fn columns_are_found_by_header_whatever_their_order_or_language() {
        let mut header = header_row(&LEDGER, Lang::Ja);
        header.reverse();
        header.insert(3, "メモ (people's own column)".into());
        let columns = locate(&LEDGER, &header).expect("found");
        let state = LEDGER.fields.iter().position(|f| f.key == "state").expect("state");
        assert_eq!(header[columns[state]], "状態");
        let en = header_row(&LEDGER, Lang::En);
        assert_eq!(locate(&LEDGER, &en).expect("found"), (0..LEDGER.fields.len()).collect::<Vec<_>>());
    }

    #[test]
    fn a_late_field_missing_from_an_older_tab_is_placed_after_its_last_column() {
        let mut header = header_row(&JOBS, Lang::En);
        header.pop();
        header.push("notes".into());
        let columns = locate(&JOBS, &header).expect("a late field is not an error");
        assert_eq!(columns.last(), Some(&header.len()), "appended after the person's own column");
        assert_eq!(&columns[..columns.len() - 1], &(0..header.len() - 1).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn a_missing_or_doubled_header_is_named() {
        let mut header = header_row(&LEDGER, Lang::Ja);
        header.retain(|h| h != "修正指示");
        let err = locate(&LEDGER, &header).expect_err("missing");
        assert!(err.to_string().contains("修正指示") && err.to_string().contains("Instruction"), "{err}");
        let mut doubled = header_row(&LEDGER, Lang::En);
        doubled.push("State".into());
        assert!(matches!(locate(&LEDGER, &doubled), Err(LayoutError::DuplicateColumn { .. })));
        assert!(locate(&LEDGER, &strings(&[])).is_err());
    }

    #[test]
    fn seed_001_ledger_headers_are_the_japanese_preset() {
        let ja = header_row(&LEDGER, Lang::Ja);
        for h in [
            "タスクID",
            "状態",
            "▶AI実行",
            "タスク",
            "内容",
            "発生源",
            "根拠",
            "期限",
            "担当",
            "AI機能",
            "実行結果",
            "実行日時",
            "修正指示",
            "キー",
            "失敗回数",
        ] {
            assert!(ja.iter().any(|x| x == h), "{h}");
        }
    }
}
