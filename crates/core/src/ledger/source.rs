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

/// Why a source's text gave no items; each names where in the text, as a person finds it.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("JSON: {0}")]
    Json(serde_json::Error),
    #[error("YAML: {0}")]
    Yaml(serde_yaml_ng::Error),
    #[error("line {line}: {error}")]
    JsonLine { line: usize, error: serde_json::Error },
    #[error("CSV line {line}, column {column}: a quoted field opened here is never closed")]
    UnclosedQuote { line: usize, column: usize },
    #[error("CSV line 1: the header row has no `task` column")]
    NoTaskColumn,
    #[error("{}", csv_positioned(.0))]
    Csv(csv::Error),
}

pub fn parse_items(format: SourceFormat, text: &str) -> Result<Vec<Item>, SourceError> {
    match format {
        SourceFormat::Json => serde_json::from_str(text).map_err(SourceError::Json),
        SourceFormat::Yaml => serde_yaml_ng::from_str(text).map_err(SourceError::Yaml),
        SourceFormat::Jsonl => text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| serde_json::from_str(l).map_err(|error| SourceError::JsonLine { line: i + 1, error }))
            .collect(),
        SourceFormat::Csv => parse_csv(text),
    }
}

/// RFC 4180 CSV with a header row naming the item fields (others ignored); a problem names
/// where it is.
fn parse_csv(text: &str) -> Result<Vec<Item>, SourceError> {
    let text = text.trim_start_matches('\u{feff}');
    if let Some((line, column)) = unclosed_quote(text) {
        return Err(SourceError::UnclosedQuote { line, column });
    }
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(text.as_bytes());
    let header = reader.headers().map_err(SourceError::Csv)?.clone();
    let col = |name: &str| header.iter().position(|h| h.trim().eq_ignore_ascii_case(name));
    let task = col("task").ok_or(SourceError::NoTaskColumn)?;
    let cols = [col("content"), col("evidence"), col("due"), col("assignee"), col("function")];
    let mut items = Vec::new();
    for record in reader.records() {
        let r = record.map_err(SourceError::Csv)?;
        if r.iter().all(|c| c.trim().is_empty()) {
            continue;
        }
        let cell = |c: Option<usize>| c.and_then(|c| r.get(c)).unwrap_or_default().to_string();
        items.push(Item {
            task: cell(Some(task)),
            content: cell(cols[0]),
            evidence: cell(cols[1]),
            due: cell(cols[2]),
            assignee: cell(cols[3]),
            function: cell(cols[4]),
        });
    }
    Ok(items)
}

/// A csv error as a person finds it in the file: by its line.
fn csv_positioned(e: &csv::Error) -> String {
    match e.position() {
        Some(p) => format!("CSV line {}: {e}", p.line()),
        None => format!("CSV: {e}"),
    }
}

/// Where (line, column) a quoted field opens and never closes, if one does: csv reads such a
/// field to the end of the text without a word, which would turn the rest of the file into one
/// cell.
fn unclosed_quote(text: &str) -> Option<(usize, usize)> {
    let (mut line, mut column, mut opened, mut at_field_start) = (1, 0, None, true);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        column += 1;
        match (opened, c) {
            (Some(_), '"') if chars.peek() == Some(&'"') => {
                chars.next();
                column += 1;
            }
            (Some(_), '"') => opened = None,
            (None, '"') if at_field_start => opened = Some((line, column)),
            _ => {}
        }
        if c == '\n' {
            (line, column) = (line + 1, 0);
        }
        at_field_start = opened.is_none() && matches!(c, ',' | '\n' | '\r');
    }
    opened
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
        assert_eq!(
            parse_items(SourceFormat::Csv, "content\nx\n").map_err(|e| e.to_string()),
            Err("CSV line 1: the header row has no `task` column".into())
        );
    }

    #[test]
    fn l7_csv_keeps_crlf_inside_quotes_takes_a_bom_and_names_the_line_of_an_unclosed_quote() {
        let text = "\u{feff}task,content\r\na,\"one\r\ntwo\"\r\nb,plain\r\n";
        let items = parse_items(SourceFormat::Csv, text).expect("parses");
        assert_eq!(items.iter().map(|i| i.content.as_str()).collect::<Vec<_>>(), ["one\r\ntwo", "plain"]);
        assert_eq!(items[0].task, "a", "the BOM is not part of the first header");
        let broken = "task,content\na,ok\nb,\"never closed\nc,lost\n";
        assert_eq!(
            parse_items(SourceFormat::Csv, broken).map_err(|e| e.to_string()),
            Err("CSV line 3, column 3: a quoted field opened here is never closed".into())
        );
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
            parse_items(SourceFormat::Jsonl, "{\"task\": \"c\"}\nnot json\n")
                .is_err_and(|e| e.to_string().starts_with("line 2"))
        );
    }
}
