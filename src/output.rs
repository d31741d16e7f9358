//! Printing objects as a table, YAML or JSON (`-o`), with the tab's field names in JSON.

use serde::Serialize;

use crate::args::Output;

/// Prints `value` as YAML or JSON; returns false for `table`, which the caller prints itself.
pub fn structured<T: Serialize>(output: Output, value: &T) -> anyhow::Result<bool> {
    match output {
        Output::Table => Ok(false),
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

/// Left-aligned columns sized to their widest cell (in characters, so Japanese lines up
/// no worse than ASCII).
pub fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out += cell;
            } else {
                out += &format!("{cell}{}  ", " ".repeat(w - cell.chars().count()));
            }
        }
        println!("{}", out.trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Cuts `s` to `max` characters on a character boundary, marking the cut.
pub fn cut(s: &str, max: usize) -> String {
    let one_line = s.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        one_line.chars().take(max.saturating_sub(1)).chain(['…']).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_never_splits_a_utf8_sequence() {
        assert_eq!(cut("日本語のテキスト", 4), "日本語…");
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("a\nb", 10), "a b");
    }
}
