//! Printing objects as a table, YAML or JSON (`-o`), with the tab's field names in JSON.

use serde::Serialize;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use crate::args::Output;

/// Prints `value` as YAML or JSON; returns false for `table`, which the caller prints itself.
pub fn structured<T: Serialize>(output: Output, value: &T) -> anyhow::Result<bool> {
    match output {
        Output::Table | Output::Wide => Ok(false),
        Output::Json => {
            println!("{}", serde_json::to_string_pretty(value)?);
            Ok(true)
        }
        Output::Yaml => {
            print!("{}", serde_yaml_ng::to_string(value)?);
            Ok(true)
        }
    }
}

/// V4: the names of the list envelopes' kinds, one per list verb (README lists them).
pub mod kinds {
    pub const MAIL: &str = "MailList";
    pub const ALERT: &str = "AlertList";
    pub const JOB: &str = "JobList";
    pub const LEDGER_ROW: &str = "LedgerRowList";

    /// `get KIND`: `RosterList`, `MailPolicyList`, … after the spec kind's own name.
    pub fn of_spec(kind: pcmail_core::manifest::Kind) -> String {
        format!("{}List", kind.as_str())
    }
}

/// V4: every list verb's structured output is this one envelope, whatever it lists — scripts
/// read `items` and `more` the same way for mail, jobs, ledger rows, alerts and spec objects.
pub fn envelope<T: Serialize>(kind: &str, items: &[T], more: u64) -> serde_json::Value {
    serde_json::json!({ "kind": kind, "items": items, "more": more })
}

/// U6/V4: prints a listing — `-o json|yaml` as the envelope, a table otherwise — and ends
/// stderr with how many more match, when some do: nothing is left out silently.
pub fn listing<T: Serialize>(
    kind: &str,
    items: &[T],
    more: u64,
    output: Output,
    table: impl FnOnce(&[T]),
) -> anyhow::Result<()> {
    if !structured(output, &envelope(kind, items, more))? {
        table(items);
    }
    if more > 0 {
        eprintln!("{more} more (use --limit or --all)");
    }
    Ok(())
}

/// Left-aligned columns sized to their widest cell, in display columns: a Japanese character
/// takes two, so a ledger of Japanese tasks lines up like an English one.
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    print!("{}", render_table(headers, rows));
}

fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.width()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.width());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            text += cell;
            if i + 1 < cells.len() {
                text += &" ".repeat(w - cell.width() + 2);
            }
        }
        out += text.trim_end();
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// Cuts `s` to `max` display columns on a character boundary, marking the cut.
pub fn cut(s: &str, max: usize) -> String {
    let one_line = s.replace(['\n', '\r'], " ");
    if one_line.width() <= max {
        return one_line;
    }
    let mut used = 0;
    let kept: String = one_line
        .chars()
        .take_while(|c| {
            used += c.width().unwrap_or(0);
            used < max
        })
        .collect();
    kept + "…"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_every_listing_is_one_envelope_of_kind_items_and_more() {
        let v = envelope(kinds::JOB, &["a", "b"], 3);
        assert_eq!(v, serde_json::json!({"kind": "JobList", "items": ["a", "b"], "more": 3}));
        let keys: Vec<&String> = v.as_object().map(|m| m.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["items", "kind", "more"], "nothing beside the three keys");
        assert_eq!(kinds::of_spec(pcmail_core::manifest::Kind::Roster), "RosterList");
        assert_eq!(envelope::<u8>(kinds::MAIL, &[], 0)["items"], serde_json::json!([]));
    }

    #[test]
    fn cut_counts_display_columns_and_never_splits_a_character() {
        assert_eq!(cut("日本語のテキスト", 7), "日本語…", "3 wide characters and the mark: 7 columns");
        assert_eq!(cut("日本語のテキスト", 6), "日本…");
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("a\nb", 10), "a b");
    }

    /// The display column at which each cell of `line` starts, given the header's starts.
    fn starts(line: &str) -> Vec<usize> {
        let mut out = vec![0];
        let (mut col, mut gap) = (0, 0);
        for c in line.chars() {
            if c == ' ' {
                gap += 1;
            } else {
                if gap >= 2 {
                    out.push(col);
                }
                gap = 0;
            }
            col += c.width().unwrap_or(0);
        }
        out
    }

    #[test]
    fn a_table_of_japanese_cells_aligns_every_column_by_display_width() {
        let rows = vec![
            vec!["T-0001".into(), "todo 未着手".into(), "請求書を作る".into(), "2026-12-24".into()],
            vec!["T-0002".into(), "review 確認待ち".into(), "write the estimate".into(), "".into()],
            vec!["T-0003".into(), "needs-human 要対応".into(), "見積".into(), "2026-12-31".into()],
        ];
        let text = render_table(&["ID", "STATE", "TASK", "DUE"], &rows);
        let lines: Vec<&str> = text.lines().collect();
        let header = starts(lines[0]);
        assert_eq!(header.len(), 4);
        for line in [lines[1], lines[3]] {
            assert_eq!(starts(line), header, "{text}");
        }
        // A row whose last cell is empty ends early, its other columns where the header's are.
        assert_eq!(starts(lines[2]), header[..3], "{text}");
    }
}
