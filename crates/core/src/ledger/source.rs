//! L7 pull sources: items from CSV, JSON, YAML or JSON lines text. Pure: the shell reads the
//! file or runs the command.

use serde::Deserialize;

use super::Incoming;
use crate::manifest::spec::{LedgerSource, SourceFormat};

/// An item as sources write it; fields other than these are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Item {
    pub task: String,
    pub content: String,
    pub evidence: String,
    pub due: String,
    pub assignee: String,
    pub function: String,
}

impl Item {
    pub fn into_incoming(self, source: &str) -> Incoming {
        Incoming {
            source: source.to_string(),
            task: self.task,
            content: self.content,
            evidence: self.evidence,
            due: self.due,
            assignee: self.assignee,
            function: self.function,
            refresh: false,
        }
    }
}

/// The format a source is read in: its own `format`, else the file's extension, else JSON
/// lines (what a command prints).
pub fn format_of(source: &LedgerSource) -> SourceFormat {
    if let Some(f) = source.format {
        return f;
    }
    let ext = source.file.as_deref().and_then(|f| f.rsplit_once('.')).map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("csv") => SourceFormat::Csv,
        Some("json") => SourceFormat::Json,
        Some("yaml" | "yml") => SourceFormat::Yaml,
        _ => SourceFormat::Jsonl,
    }
}

pub fn parse_items(format: SourceFormat, text: &str) -> Result<Vec<Item>, String> {
    match format {
        SourceFormat::Json => serde_json::from_str(text).map_err(|e| format!("JSON: {e}")),
        SourceFormat::Yaml => serde_yaml_ng::from_str(text).map_err(|e| format!("YAML: {e}")),
        SourceFormat::Jsonl => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", i + 1)))
            .collect(),
        SourceFormat::Csv => parse_csv(text),
    }
}

/// RFC 4180 CSV with a header row naming the item fields (others ignored).
fn parse_csv(text: &str) -> Result<Vec<Item>, String> {
    let records = csv_records(text.trim_start_matches('\u{feff}'))?;
    let Some((header, rows)) = records.split_first() else { return Ok(vec![]) };
    let col = |name: &str| header.iter().position(|h| h.trim().eq_ignore_ascii_case(name));
    let task = col("task").ok_or("CSV: the header row has no `task` column")?;
    let cols = [col("content"), col("evidence"), col("due"), col("assignee"), col("function")];
    let cell = |r: &[String], c: Option<usize>| c.and_then(|c| r.get(c)).cloned().unwrap_or_default();
    Ok(rows
        .iter()
        .filter(|r| r.iter().any(|c| !c.trim().is_empty()))
        .map(|r| Item {
            task: cell(r, Some(task)),
            content: cell(r, cols[0]),
            evidence: cell(r, cols[1]),
            due: cell(r, cols[2]),
            assignee: cell(r, cols[3]),
            function: cell(r, cols[4]),
        })
        .collect())
}

fn csv_records(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let (mut record, mut field) = (Vec::new(), String::new());
    let (mut quoted, mut chars) = (false, text.chars().peekable());
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => field.push(c),
            (false, '"') if field.is_empty() => quoted = true,
            (false, ',') => record.push(std::mem::take(&mut field)),
            (false, '\r') => {}
            (false, '\n') => {
                record.push(std::mem::take(&mut field));
                records.push(std::mem::take(&mut record));
            }
            (false, c) => field.push(c),
        }
    }
    if quoted {
        return Err("CSV: a quoted field is not closed".into());
    }
    if !field.is_empty() || !record.is_empty() {
        record.push(field);
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l7_csv_with_header_quotes_and_japanese() {
        let text = "task,content,due,extra\n\"見積書, A社\",\"line1\nline2\",2026-12-01,x\n\n\"say \"\"hi\"\"\",,,\n";
        let items = parse_items(SourceFormat::Csv, text).expect("parses");
        assert_eq!(items.len(), 2);
        assert_eq!(
            (items[0].task.as_str(), items[0].content.as_str(), items[0].due.as_str()),
            ("見積書, A社", "line1\nline2", "2026-12-01")
        );
        assert_eq!(items[1].task, "say \"hi\"");
        assert!(parse_items(SourceFormat::Csv, "content\nx\n").is_err_and(|e| e.contains("no `task` column")));
    }

    #[test]
    fn l7_json_yaml_and_json_lines() {
        assert_eq!(parse_items(SourceFormat::Json, r#"[{"task": "a", "other": 1}]"#).expect("json")[0].task, "a");
        assert_eq!(
            parse_items(SourceFormat::Yaml, "- task: b\n  due: '2026-12-01'\n").expect("yaml")[0].due,
            "2026-12-01"
        );
        let lines = parse_items(SourceFormat::Jsonl, "{\"task\": \"c\"}\n\n{\"task\": \"d\"}\n").expect("jsonl");
        assert_eq!(lines.len(), 2);
        assert!(
            parse_items(SourceFormat::Jsonl, "{\"task\": \"c\"}\nnot json\n").is_err_and(|e| e.starts_with("line 2"))
        );
    }
}
