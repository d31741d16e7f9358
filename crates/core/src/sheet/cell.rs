//! Cells as Sheets answers them and as the controller compares them.
//!
//! Sheets converts what it stores: a `TRUE` string becomes a boolean, `0042` may become 42, and
//! `UNFORMATTED_VALUE` answers numbers and booleans as JSON numbers and booleans. Comparing raw
//! values reports false mismatches (seed 000: a row written correctly read back as "mismatch"
//! and was sent again). Both sides are compared in one normal form.

use super::layout::Field;

/// The normal form: booleans `true`/`false`, numbers in their shortest canonical text (`3`, not
/// `3.0`), empty and absent as `""`, objects and arrays as JSON text, strings as they are.
pub fn normalize(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => canonical_number(n),
        Value::String(s) => s.clone(),
        Value::Array(_) | Value::Object(_) => v.to_string(),
    }
}

fn canonical_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    match n.as_f64() {
        // Integral floats (Sheets answers 3 as 3.0 in some paths) print as integers.
        Some(f) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => (f as i64).to_string(),
        Some(f) => f.to_string(),
        None => n.to_string(),
    }
}

/// How a field's cells are written and read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellKind {
    Text,
    /// A checkbox.
    Boolean,
    /// A date people type and sort by.
    Date,
}

impl CellKind {
    pub fn of(field: &Field) -> CellKind {
        if field.boolean {
            CellKind::Boolean
        } else if field.date {
            CellKind::Date
        } else {
            CellKind::Text
        }
    }
}

/// A cell as the controller writes it (`valueInputOption=RAW`): `true`/`false` as booleans so a
/// checkbox column stays a checkbox, a `YYYY-MM-DD` date as its serial number (the column's
/// date format shows it as a date, and the sheet sorts by it), everything else as text, so
/// Sheets has nothing to convert.
pub fn to_wire(cell: &str, kind: CellKind) -> serde_json::Value {
    match (kind, cell) {
        (CellKind::Boolean, "true") => serde_json::Value::Bool(true),
        (CellKind::Boolean, "false") => serde_json::Value::Bool(false),
        (CellKind::Date, _) => date_serial(cell).map_or_else(|| cell.into(), serde_json::Value::from),
        _ => serde_json::Value::String(cell.to_string()),
    }
}

/// Sheets' day 0 (serial numbers count days from it).
fn epoch() -> chrono::NaiveDateTime {
    chrono::NaiveDate::from_ymd_opt(1899, 12, 30).and_then(|d| d.and_hms_opt(0, 0, 0)).unwrap_or_default()
}

/// The serial number of a date written exactly `YYYY-MM-DD`; `None` for any other text (which is
/// then written as the text it is, so it reads back unchanged).
pub fn date_serial(date: &str) -> Option<i64> {
    let day = chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").ok()?;
    let serial = (day.and_hms_opt(0, 0, 0)? - epoch()).num_days();
    (serial_date(serial as f64).as_deref() == Some(date)).then_some(serial)
}

/// A date cell Sheets answered as a number (`UNFORMATTED_VALUE` gives a typed date as its serial,
/// in the spreadsheet's own time zone): `YYYY-MM-DD`, with ` HH:MM` when it holds a time of day —
/// the wall-clock date a person typed. `None` for a number that is no date (before 1900, after
/// 9999, not finite): the cell is then read as the number it is.
pub fn serial_date(serial: f64) -> Option<String> {
    if !serial.is_finite() || !(1.0..2_958_466.0).contains(&serial) {
        return None;
    }
    let seconds = (serial * 86_400.0).round() as i64;
    let at = epoch().checked_add_signed(chrono::TimeDelta::try_seconds(seconds)?)?;
    Some(if seconds % 86_400 == 0 {
        at.format("%Y-%m-%d").to_string()
    } else {
        at.format("%Y-%m-%d %H:%M").to_string()
    })
}

/// A date column's cell as read: a number is a typed date, anything else (a date typed as text,
/// `来週`) is read as it is.
pub fn read_date(v: &serde_json::Value) -> String {
    v.as_f64().filter(|_| v.is_number()).and_then(serial_date).unwrap_or_else(|| normalize(v))
}

/// `0 → A`, `25 → Z`, `26 → AA`.
pub fn column_letters(index: usize) -> String {
    let mut n = index + 1;
    let mut out = Vec::new();
    while n > 0 {
        let rem = (n - 1) % 26;
        out.push(b'A' + rem as u8);
        n = (n - 1) / 26;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// A sheet title quoted for A1 notation: `'my tab'`, with `'` doubled.
pub fn quote_title(title: &str) -> String {
    format!("'{}'", title.replace('\'', "''"))
}

/// `'tab'!C5:E5`: columns `first..=last` (0-based) of sheet row `row` (1-based).
pub fn a1_row_range(title: &str, row: usize, first: usize, last: usize) -> String {
    format!("{}!{}{row}:{}{row}", quote_title(title), column_letters(first), column_letters(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sheets_type_coercion_never_reads_as_a_mismatch() {
        // What the controller wrote (left) and what UNFORMATTED_VALUE answers (right).
        assert_eq!(normalize(&json!("true")), normalize(&json!(true)));
        assert_eq!(normalize(&json!("false")), normalize(&json!(false)));
        assert_eq!(normalize(&json!("3")), normalize(&json!(3)));
        assert_eq!(normalize(&json!("3")), normalize(&json!(3.0)));
        assert_eq!(normalize(&json!("1.5")), normalize(&json!(1.5)));
        assert_eq!(normalize(&json!("")), normalize(&json!(null)));
        assert_eq!(normalize(&json!({"a": 1})), r#"{"a":1}"#);
        assert_eq!(normalize(&json!("日本語")), "日本語");
        assert_ne!(normalize(&json!("3.10")), normalize(&json!(3.1)), "text that only looks numeric stays text");
    }

    #[test]
    fn checkboxes_are_written_as_booleans_dates_as_serials_and_the_rest_as_text() {
        assert_eq!(to_wire("true", CellKind::Boolean), json!(true));
        assert_eq!(to_wire("false", CellKind::Boolean), json!(false));
        assert_eq!(to_wire("true", CellKind::Text), json!("true"));
        assert_eq!(to_wire("0042", CellKind::Text), json!("0042"));
        assert_eq!(to_wire("2026-12-24", CellKind::Date), json!(46380), "issue 23's example: 46380 is 2026-12-24");
        assert_eq!(to_wire("来週", CellKind::Date), json!("来週"), "text that is no date stays text");
        assert_eq!(to_wire("", CellKind::Date), json!(""));
    }

    #[test]
    fn a_date_typed_as_a_date_or_as_text_reads_as_the_same_date() {
        assert_eq!(read_date(&json!(46380)), "2026-12-24");
        assert_eq!(read_date(&json!(46380.0)), "2026-12-24");
        assert_eq!(read_date(&json!("2026-12-24")), "2026-12-24");
        assert_eq!(read_date(&json!(46380.375)), "2026-12-24 09:00", "a time of day, as typed");
        assert_eq!(read_date(&json!("来週")), "来週");
        assert_eq!(read_date(&json!(null)), "");
        assert_eq!(read_date(&json!(date_serial("2027-03-01"))), "2027-03-01");
    }

    #[test]
    fn only_numbers_that_are_dates_read_as_dates_and_only_exact_dates_are_written_as_serials() {
        assert_eq!(read_date(&json!("20261224")), "20261224", "text that looks like a number stays text");
        assert_eq!(read_date(&json!("NaN")), "NaN");
        assert_eq!(read_date(&json!(1e15)), "1000000000000000", "a pasted phone number is no date, and no panic");
        assert_eq!(read_date(&json!(-3)), "-3");
        assert_eq!(date_serial("2026-1-5"), None, "written as text, so it reads back as typed");
        assert_eq!(date_serial(" 2026-12-24"), None);
        assert_eq!(date_serial("9999-12-31"), Some(2_958_465));
    }

    #[test]
    fn a1_notation_quotes_titles_and_counts_columns_past_z() {
        assert_eq!(column_letters(0), "A");
        assert_eq!(column_letters(25), "Z");
        assert_eq!(column_letters(26), "AA");
        assert_eq!(column_letters(701), "ZZ");
        assert_eq!(column_letters(702), "AAA");
        assert_eq!(a1_row_range("台帳", 5, 2, 4), "'台帳'!C5:E5");
        assert_eq!(a1_row_range("it's", 2, 0, 0), "'it''s'!A2:A2");
    }
}
