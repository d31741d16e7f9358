//! Store rows as a tab's fields (text in the sheet's normal form) and back, through the shared
//! codec: one column list per tab, whatever the backend.

use pcmail_core::Ts;
use pcmail_core::sheet::layout::{LEDGER, Lang, Tab};
use pcmail_core::sheet::plan::Fields;

use crate::codec::{Columns, Value, from_ms, ms};
use crate::{Result, StoreError};

/// `seq, id, "from"` → `["seq", "id", "from"]`.
pub fn names(columns: &str) -> Vec<&str> {
    columns.split(',').map(|c| c.trim().trim_matches('"')).collect()
}

fn time_text(t: Ts) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The fields of `tab` from parameters named `names` (a codec column list and its values).
pub fn fields(tab: &Tab, lang: Lang, names: &[&str], values: &[Value<'_>]) -> Fields {
    tab.fields
        .iter()
        .map(|f| {
            let Some(i) = names.iter().position(|n| *n == f.key).filter(|_| !f.secret) else { return String::new() };
            let text = match values.get(i) {
                Some(Value::Text(t)) => t.unwrap_or_default().to_string(),
                Some(Value::Int(Some(v))) if f.time => time_text(from_ms(*v)),
                Some(Value::Int(v)) => v.map(|v| v.to_string()).unwrap_or_default(),
                Some(Value::Bool(b)) => b.to_string(),
                None => String::new(),
            };
            // People read and set the ledger's state in their own words (seed 001's labels).
            if *tab == LEDGER && f.key == "state" && lang == Lang::Ja {
                return text.parse::<pcmail_core::ledger::RowState>().map_or(text, |s| s.ja().to_string());
            }
            text
        })
        .collect()
}

/// A tab's fields read back as a row in a codec column order, for the codec's decoders.
pub struct FieldRow {
    values: Vec<String>,
    times: Vec<bool>,
}

impl FieldRow {
    pub fn new(tab: &Tab, names: &[&str], fields: &Fields) -> FieldRow {
        let (values, times) = names
            .iter()
            .map(|n| match tab.fields.iter().position(|f| f.key == *n) {
                Some(i) => (fields.get(i).cloned().unwrap_or_default(), tab.fields[i].time),
                None => (String::new(), false),
            })
            .unzip();
        FieldRow { values, times }
    }

    fn cell(&self, i: usize) -> &str {
        self.values.get(i).map_or("", |s| s.trim())
    }
}

impl Columns for FieldRow {
    fn text(&self, i: usize) -> Result<String> {
        Ok(self.values.get(i).cloned().unwrap_or_default())
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>> {
        Ok(Some(self.text(i)?).filter(|s| !s.is_empty()))
    }

    fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.map_or(Ok(0), Ok)
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        let cell = self.cell(i);
        if cell.is_empty() {
            return Ok(None);
        }
        let bad =
            || StoreError::Corrupt(format!("cell {cell:?} is not a {}", if self.times[i] { "time" } else { "number" }));
        if self.times[i] {
            return chrono::DateTime::parse_from_rfc3339(cell).map(|t| Some(ms(t.to_utc()))).map_err(|_| bad());
        }
        cell.parse::<i64>().map(Some).or_else(|_| cell.parse::<f64>().map(|f| Some(f as i64))).map_err(|_| bad())
    }

    fn flag(&self, i: usize) -> Result<bool> {
        Ok(matches!(self.cell(i), "true" | "TRUE" | "1"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{self, LEDGER_COLUMNS};
    use pcmail_core::ledger::{Row, RowState};

    #[test]
    fn ledger_rows_round_trip_through_japanese_fields() {
        let row = Row {
            project: "p".into(),
            id: "T-0007".into(),
            state: RowState::Review,
            run_requested: true,
            task: "タスク".into(),
            content: "内容".into(),
            source: "src".into(),
            evidence: String::new(),
            due: "2026-12-01".into(),
            assignee: String::new(),
            function: "summarize".into(),
            result: "https://example/doc".into(),
            executed_at: Some(from_ms(1_800_000_000_123)),
            instruction: "もっと短く".into(),
            key: "src|タスク".into(),
            failures: 2,
            refresh: false,
        };
        let names = names(LEDGER_COLUMNS);
        let f = fields(&LEDGER, Lang::Ja, &names, &codec::ledger_params(&row));
        assert!(
            f.contains(&"AI実行済(要確認)".to_string()) && f.contains(&"2027-01-15T08:00:00.123Z".to_string()),
            "{f:?}"
        );
        let back = codec::ledger_row(&FieldRow::new(&LEDGER, &names, &f)).expect("decodes");
        assert_eq!(back, row);
    }
}
