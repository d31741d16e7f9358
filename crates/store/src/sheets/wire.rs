//! The Sheets API v4 and OAuth token endpoint bodies this adapter sends and reads, held to the
//! recorded exchanges in `shared/sheets-wire/` by the tests below.

use serde::{Deserialize, Serialize};

/// `values.get` / one entry of `values:batchGet`. Rows are ragged: trailing empty cells are
/// omitted, and empty trailing rows may be `[]` or missing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValueRange {
    pub range: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major_dimension: Option<String>,
    #[serde(default)]
    pub values: Vec<Vec<serde_json::Value>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchGetResponse {
    pub spreadsheet_id: String,
    #[serde(default)]
    pub value_ranges: Vec<ValueRange>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchUpdateValuesRequest {
    pub value_input_option: String,
    pub data: Vec<ValueRange>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchUpdateValuesResponse {
    pub spreadsheet_id: String,
    #[serde(default)]
    pub total_updated_cells: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppendResponse {
    pub spreadsheet_id: String,
    #[serde(default)]
    pub table_range: Option<String>,
    pub updates: UpdatedRange,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpdatedRange {
    pub updated_range: String,
    #[serde(default)]
    pub updated_rows: u64,
}

/// `spreadsheets.get` (without grid data): the tabs and their numeric ids.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spreadsheet {
    pub spreadsheet_id: String,
    #[serde(default)]
    pub sheets: Vec<Sheet>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sheet {
    pub properties: SheetProperties,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SheetProperties {
    #[serde(default)]
    pub sheet_id: i64,
    pub title: String,
    #[serde(default)]
    pub grid_properties: Option<GridProperties>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GridProperties {
    #[serde(default)]
    pub row_count: u64,
    #[serde(default)]
    pub column_count: u64,
}

/// `spreadsheets:batchUpdate`: requests applied in order, atomically.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchUpdateRequest {
    pub requests: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchUpdateResponse {
    pub spreadsheet_id: String,
    #[serde(default)]
    pub replies: Vec<serde_json::Value>,
}

/// A `deleteDimension` request for sheet rows `first..=last` (1-based, as the plan gives them).
pub fn delete_rows(sheet_id: i64, first: usize, last: usize) -> serde_json::Value {
    serde_json::json!({"deleteDimension": {"range": {
        "sheetId": sheet_id, "dimension": "ROWS", "startIndex": first - 1, "endIndex": last
    }}})
}

/// A GridRange over sheet rows `first..=last` (1-based) and, when given, columns `first..=last`
/// (0-based); without columns it spans whole rows.
fn grid_range(sheet_id: i64, rows: (usize, usize), columns: Option<(usize, usize)>) -> serde_json::Value {
    let mut range = serde_json::json!({"sheetId": sheet_id, "startRowIndex": rows.0 - 1, "endRowIndex": rows.1});
    if let Some((first, last)) = columns {
        range["startColumnIndex"] = first.into();
        range["endColumnIndex"] = (last + 1).into();
    }
    range
}

/// `addSheet`: a tab with our own id (so later requests of the same call can name it), sized to
/// its columns, its header row frozen.
pub fn add_sheet(sheet_id: i64, title: &str, rows: usize, columns: usize) -> serde_json::Value {
    serde_json::json!({"addSheet": {"properties": {"sheetId": sheet_id, "title": title, "gridProperties": {
        "rowCount": rows, "columnCount": columns, "frozenRowCount": 1
    }}}})
}

/// `appendDimension`: `length` more rows or columns at the end of a tab's grid.
pub fn grow(sheet_id: i64, dimension: &str, length: usize) -> serde_json::Value {
    serde_json::json!({"appendDimension": {"sheetId": sheet_id, "dimension": dimension, "length": length}})
}

pub fn freeze_header(sheet_id: i64) -> serde_json::Value {
    serde_json::json!({"updateSheetProperties": {
        "properties": {"sheetId": sheet_id, "gridProperties": {"frozenRowCount": 1}},
        "fields": "gridProperties.frozenRowCount"
    }})
}

pub fn rename_sheet(sheet_id: i64, title: &str) -> serde_json::Value {
    serde_json::json!({"updateSheetProperties": {"properties": {"sheetId": sheet_id, "title": title}, "fields": "title"}})
}

/// Hides one column (0-based) from people; the API still reads and writes it.
pub fn hide_column(sheet_id: i64, column: usize) -> serde_json::Value {
    serde_json::json!({"updateDimensionProperties": {
        "range": {"sheetId": sheet_id, "dimension": "COLUMNS", "startIndex": column, "endIndex": column + 1},
        "properties": {"hiddenByUser": true},
        "fields": "hiddenByUser"
    }})
}

/// A column's rows `first..=last` (1-based) shown as `yyyy-mm-dd` dates (a format: it writes no
/// value).
pub fn date_column(sheet_id: i64, column: usize, first: usize, last: usize) -> serde_json::Value {
    serde_json::json!({"repeatCell": {
        "range": grid_range(sheet_id, (first, last), Some((column, column))),
        "cell": {"userEnteredFormat": {"numberFormat": {"type": "DATE", "pattern": "yyyy-mm-dd"}}},
        "fields": "userEnteredFormat.numberFormat"
    }})
}

/// Checkboxes (a BOOLEAN validation rule) on one column of sheet rows `first..=last` (1-based).
pub fn checkboxes(sheet_id: i64, column: usize, first: usize, last: usize) -> serde_json::Value {
    serde_json::json!({"setDataValidation": {
        "range": grid_range(sheet_id, (first, last), Some((column, column))),
        "rule": {"condition": {"type": "BOOLEAN"}, "strict": true}
    }})
}

/// Sheet rows `first..=last` (1-based, whole rows) with a background colour (RGB, 0–1).
pub fn background(sheet_id: i64, first: usize, last: usize, rgb: (f64, f64, f64)) -> serde_json::Value {
    serde_json::json!({"repeatCell": {
        "range": grid_range(sheet_id, (first, last), None),
        "cell": {"userEnteredFormat": {"backgroundColor": {"red": rgb.0, "green": rgb.1, "blue": rgb.2}}},
        "fields": "userEnteredFormat.backgroundColor"
    }})
}

/// Google's error body: `{"error": {"code", "message", "status"}}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    #[serde(default)]
    pub code: u16,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub status: String,
}

/// The OAuth token endpoint's answer to a JWT bearer grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenResponse {
    pub access_token: String,
    #[serde(default = "default_expiry")]
    pub expires_in: u64,
    #[serde(default)]
    pub token_type: String,
}

fn default_expiry() -> u64 {
    3600
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    /// Every recorded (status, response body) of `method` whose URI `endpoint` accepts.
    pub fn recorded(method: &str, endpoint: impl Fn(&str) -> bool) -> Vec<(u16, String)> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sheets-wire/exchanges.json");
        let exchanges: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(path).expect("recordings")).expect("json");
        exchanges
            .iter()
            .filter(|x| x["method"] == method && endpoint(x["uri"].as_str().unwrap_or_default()))
            .map(|x| (x["status"].as_u64().unwrap_or(0) as u16, x["response"].as_str().unwrap_or_default().to_string()))
            .collect()
    }

    #[test]
    fn recorded_batch_get_answers_decode_with_ragged_rows() {
        let answers = recorded("GET", |u| u.contains("values:batchGet"));
        assert!(!answers.is_empty());
        for (code, body) in answers.iter().filter(|(c, _)| *c == 200) {
            let r: BatchGetResponse = serde_json::from_str(body).unwrap_or_else(|e| panic!("{code}: {e}: {body}"));
            assert!(!r.value_ranges.is_empty());
        }
    }

    #[test]
    fn recorded_values_get_answers_decode_typed_and_trimmed() {
        let answers = recorded("GET", |u| u.contains("/values/") && !u.contains("batchGet"));
        let mut typed = false;
        for (_, body) in answers.iter().filter(|(c, _)| *c == 200) {
            let r: ValueRange = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
            typed |= r.values.iter().flatten().any(|v| v.is_number() || v.is_boolean());
        }
        assert!(typed, "UNFORMATTED_VALUE answers carry JSON numbers or booleans");
    }

    #[test]
    fn recorded_writes_and_metadata_decode() {
        for (_, body) in recorded("POST", |u| u.contains("values:batchUpdate")).iter().filter(|(c, _)| *c == 200) {
            serde_json::from_str::<BatchUpdateValuesResponse>(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        }
        for (_, body) in recorded("POST", |u| u.contains(":append")).iter().filter(|(c, _)| *c == 200) {
            serde_json::from_str::<AppendResponse>(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        }
        for (_, body) in
            recorded("POST", |u| u.ends_with(":batchUpdate") && !u.contains("values")).iter().filter(|(c, _)| *c == 200)
        {
            serde_json::from_str::<BatchUpdateResponse>(body).unwrap_or_else(|e| panic!("{e}: {body}"));
        }
        let sheets = recorded("GET", |u| u.contains("includeGridData=false"));
        assert!(!sheets.is_empty());
        for (_, body) in sheets.iter().filter(|(c, _)| *c == 200) {
            let s: Spreadsheet = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
            assert!(s.sheets.iter().all(|t| !t.properties.title.is_empty()));
        }
    }

    #[test]
    fn recorded_errors_decode_with_their_message() {
        let errors: Vec<_> = recorded("GET", |_| true)
            .into_iter()
            .chain(recorded("POST", |_| true))
            .filter(|(c, _)| *c >= 400)
            .collect();
        assert!(!errors.is_empty(), "the recordings hold 4xx answers");
        for (code, body) in errors {
            let e: ErrorBody = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
            assert_eq!(e.error.code, code);
            assert!(!e.error.message.is_empty());
        }
    }

    #[test]
    fn recorded_delete_request_has_our_shape() {
        // test_delete_row deletes sheet row 2: {"startIndex": 1, "endIndex": 2}.
        assert_eq!(
            delete_rows(0, 2, 2),
            serde_json::json!({"deleteDimension": {"range": {"sheetId": 0, "dimension": "ROWS", "startIndex": 1, "endIndex": 2}}})
        );
    }
}
