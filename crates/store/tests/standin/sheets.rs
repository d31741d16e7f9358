//! A local stand-in for Google's Sheets API v4 and OAuth token endpoint, for tests: this machine
//! cannot reach Google. It speaks the documented wire format (held to the recorded exchanges in
//! `tests/sheets-wire/`): a JWT bearer grant checked against the service account's public key,
//! `spreadsheets.get`, `values:batchGet` with ragged rows (trailing empty cells and rows
//! omitted) and typed values (a typed date as its serial number: `dateTimeRenderOption`
//! defaults to SERIAL_NUMBER), `values:batchUpdate`, `values:append`, and atomic
//! `spreadsheets:batchUpdate` (`addSheet` with its own id and grid, `deleteDimension`,
//! `appendDimension`, `updateSheetProperties` for the frozen rows and the title,
//! `updateDimensionProperties` for hidden columns, `repeatCell` formats, `setDataValidation`).
//! Grids have limits: a value written past a tab's last column (or, outside an append, its last
//! row) is refused with Google's "exceeds grid limits". It counts calls and answers 429 on
//! demand. With `coerce`, written text that looks like a number or TRUE/FALSE is stored as one,
//! as Sheets does with what people type.
//!
//! Included as a module by the tests that use it; its parent names the adapter's JWT helpers
//! `jwt` (`claims`, `verify`).

use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A test service account: its key file for the adapter and its public key for the stand-in.
pub struct Account {
    pub dir: tempfile::TempDir,
    pub private_pem: String,
    pub public_der: Vec<u8>,
}

/// One RSA key per test process (generating one takes a moment).
pub fn account() -> &'static Account {
    static ACCOUNT: OnceLock<Account> = OnceLock::new();
    ACCOUNT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("key.pem");
        let public = dir.path().join("public.der");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl").args(args).output().expect("openssl (Debian's package)");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        run(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &key.display().to_string()]);
        run(&[
            "rsa",
            "-in",
            &key.display().to_string(),
            "-RSAPublicKey_out",
            "-outform",
            "DER",
            "-out",
            &public.display().to_string(),
        ]);
        Account {
            private_pem: std::fs::read_to_string(&key).expect("key"),
            public_der: std::fs::read(&public).expect("public key"),
            dir,
        }
    })
}

#[derive(Debug, Clone, Default)]
struct Tab {
    id: i64,
    title: String,
    cells: Vec<Vec<Value>>,
    rows: usize,
    columns: usize,
    frozen_rows: u64,
    hidden_columns: std::collections::BTreeSet<usize>,
    /// Cells (0-based row, column) with a checkbox rule.
    checkboxes: std::collections::BTreeSet<(usize, usize)>,
    /// Background colours by 0-based row (formats applied to whole rows).
    backgrounds: std::collections::BTreeMap<usize, Value>,
    /// Number formats by column.
    number_formats: std::collections::BTreeMap<usize, Value>,
}

impl Tab {
    fn new(id: i64, title: &str, rows: usize, columns: usize) -> Tab {
        Tab { id, title: title.into(), rows, columns, ..Tab::default() }
    }

    /// Rows `start..end` (0-based) gone: what was below moves up, formats and rules with it.
    fn delete_rows(&mut self, start: usize, end: usize) {
        for row in (start..end.min(self.cells.len())).rev() {
            self.cells.remove(row);
        }
        let shift = |row: usize| {
            if row >= end {
                Some(row - (end - start))
            } else if row < start {
                Some(row)
            } else {
                None
            }
        };
        self.checkboxes = self.checkboxes.iter().filter_map(|&(r, c)| Some((shift(r)?, c))).collect();
        self.backgrounds =
            std::mem::take(&mut self.backgrounds).into_iter().filter_map(|(r, v)| Some((shift(r)?, v))).collect();
        self.rows -= end - start;
    }
}

/// A request's GridRange as 0-based half-open row and column spans (open ends to the grid's).
fn span(range: &Value, tab: &Tab) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let at = |k: &str, default: usize| range[k].as_u64().map_or(default, |v| v as usize);
    (at("startRowIndex", 0)..at("endRowIndex", tab.rows), at("startColumnIndex", 0)..at("endColumnIndex", tab.columns))
}

#[derive(Default)]
struct Shared {
    tabs: Mutex<Vec<Tab>>,
    calls: Mutex<Vec<String>>,
    throttle: Mutex<u32>,
    tokens: Mutex<Vec<String>>,
    coerce: Mutex<bool>,
    base: Mutex<String>,
    /// Edits a person makes right after the next read is answered: (tab, row, column, value).
    after_read: Mutex<Vec<(String, usize, usize, Value)>>,
}

pub struct Standin {
    pub url: String,
    pub spreadsheet_id: String,
    shared: Arc<Shared>,
}

impl Standin {
    /// Serves on a free loopback port from the current tokio runtime.
    pub async fn start() -> Standin {
        let shared = Arc::new(Shared::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        *shared.base.lock().expect("lock") = url.clone();
        let app = axum::Router::new()
            .route("/token", axum::routing::post(token))
            .route("/v4/spreadsheets/{*rest}", axum::routing::any(sheets))
            .with_state(shared.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        shared.tabs.lock().expect("lock").push(Tab::new(0, "Sheet1", 1000, 26));
        Standin { url, spreadsheet_id: "1standinSpreadsheetId".into(), shared }
    }

    /// The adapter's URL for this stand-in, with a key file for the test account.
    pub fn store_url(&self, extra: &str) -> String {
        let account = account();
        let path =
            account.dir.path().join(format!("service-account-{}.json", self.url.rsplit(':').next().unwrap_or("0")));
        let key = json!({
            "type": "service_account",
            "client_email": "pcmail-test@pcmail.iam.gserviceaccount.com",
            "private_key": account.private_pem,
            "token_uri": format!("{}/token", self.url),
        });
        std::fs::write(&path, key.to_string()).expect("key file");
        format!(
            "sheets://{}?credentials={}&api={}&reads=50&writes=50{extra}",
            self.spreadsheet_id,
            path.display(),
            self.url
        )
    }

    /// The next `n` API calls answer 429 RESOURCE_EXHAUSTED.
    pub fn throttle_next(&self, n: u32) {
        *self.shared.throttle.lock().expect("lock") = n;
    }

    pub fn coerce(&self, on: bool) {
        *self.shared.coerce.lock().expect("lock") = on;
    }

    /// Calls so far, each named `get`, `batchGet`, `values.batchUpdate`, `append`,
    /// `batchUpdate`, or `token`; a throttled call is suffixed ` 429`.
    pub fn calls(&self) -> Vec<String> {
        self.shared.calls.lock().expect("lock").clone()
    }

    pub fn reset_calls(&self) {
        self.shared.calls.lock().expect("lock").clear();
    }

    /// A tab's cells as stored (untrimmed rows as written).
    pub fn cells(&self, title: &str) -> Vec<Vec<Value>> {
        let tabs = self.shared.tabs.lock().expect("lock");
        tabs.iter().find(|t| t.title == title).map(|t| t.cells.clone()).unwrap_or_default()
    }

    /// A person edits one cell (1-based row, 0-based column), as in the browser.
    pub fn edit(&self, title: &str, row: usize, column: usize, value: Value) {
        let mut tabs = self.shared.tabs.lock().expect("lock");
        let tab = tabs.iter_mut().find(|t| t.title == title).expect("tab");
        set(&mut tab.cells, row - 1, column, value);
    }

    /// A person edits a cell just after the next `batchGet` is answered: between the
    /// controller's read and its write.
    pub fn edit_after_next_read(&self, title: &str, row: usize, column: usize, value: Value) {
        self.shared.after_read.lock().expect("lock").push((title.into(), row, column, value));
    }

    /// A person types a date into a cell (1-based row): Sheets stores it as its serial number.
    pub fn type_date(&self, title: &str, row: usize, column: usize, date: &str) {
        let day = chrono::NaiveDate::parse_from_str(date, "%Y-%m-%d").expect("a YYYY-MM-DD date");
        let epoch = chrono::NaiveDate::from_ymd_opt(1899, 12, 30).expect("epoch");
        self.edit(title, row, column, json!((day - epoch).num_days()));
    }

    /// A tab a person made: `columns` wide (exactly its header, when that is as wide), with
    /// these rows (the header first).
    pub fn add_tab(&self, title: &str, columns: usize, rows: Vec<Vec<Value>>) {
        let mut tabs = self.shared.tabs.lock().expect("lock");
        let id = tabs.iter().map(|t| t.id).max().unwrap_or(0) + 100;
        let mut tab = Tab::new(id, title, 1000, columns);
        tab.cells = rows;
        tabs.push(tab);
    }

    /// A person deletes a whole tab.
    pub fn delete_tab(&self, title: &str) {
        self.shared.tabs.lock().expect("lock").retain(|t| t.title != title);
    }

    /// The titles of the tabs, in order.
    pub fn titles(&self) -> Vec<String> {
        self.shared.tabs.lock().expect("lock").iter().map(|t| t.title.clone()).collect()
    }

    fn with_tab<T>(&self, title: &str, f: impl FnOnce(&Tab) -> T) -> T {
        let tabs = self.shared.tabs.lock().expect("lock");
        f(tabs.iter().find(|t| t.title == title).expect("tab"))
    }

    /// A tab's grid: (rows, columns, frozen rows).
    pub fn grid(&self, title: &str) -> (usize, usize, u64) {
        self.with_tab(title, |t| (t.rows, t.columns, t.frozen_rows))
    }

    pub fn hidden_columns(&self, title: &str) -> Vec<usize> {
        self.with_tab(title, |t| t.hidden_columns.iter().copied().collect())
    }

    /// Sheet rows (1-based) whose cell in `column` has a checkbox.
    pub fn checkbox_rows(&self, title: &str, column: usize) -> Vec<usize> {
        self.with_tab(title, |t| t.checkboxes.iter().filter(|(_, c)| *c == column).map(|(r, _)| r + 1).collect())
    }

    /// A sheet row's (1-based) background colour, if one was set.
    pub fn background(&self, title: &str, row: usize) -> Option<Value> {
        self.with_tab(title, |t| t.backgrounds.get(&(row - 1)).cloned())
    }

    pub fn number_format(&self, title: &str, column: usize) -> Option<Value> {
        self.with_tab(title, |t| t.number_formats.get(&column).cloned())
    }

    /// A person deletes a sheet row (1-based).
    pub fn delete_row(&self, title: &str, row: usize) {
        let mut tabs = self.shared.tabs.lock().expect("lock");
        let tab = tabs.iter_mut().find(|t| t.title == title).expect("tab");
        if row - 1 < tab.cells.len() {
            tab.cells.remove(row - 1);
        }
    }
}

fn set(cells: &mut Vec<Vec<Value>>, row: usize, column: usize, value: Value) {
    if cells.len() <= row {
        cells.resize(row + 1, Vec::new());
    }
    let r = &mut cells[row];
    if r.len() <= column {
        r.resize(column + 1, Value::String(String::new()));
    }
    r[column] = value;
}

fn google_error(status: StatusCode, message: &str) -> Response {
    let name = match status.as_u16() {
        400 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        404 => "NOT_FOUND",
        429 => "RESOURCE_EXHAUSTED",
        _ => "INTERNAL",
    };
    (status, axum::Json(json!({"error": {"code": status.as_u16(), "message": message, "status": name}})))
        .into_response()
}

async fn token(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let form = query_pairs(&String::from_utf8_lossy(&body));
    shared.calls.lock().expect("lock").push("token".into());
    let get = |k: &str| form.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone()).unwrap_or_default();
    if get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
        return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": "unsupported_grant_type"}))).into_response();
    }
    let assertion = get("assertion");
    let claims = super::jwt::claims(&assertion).unwrap_or_default();
    let audience = format!("{}/token", shared.base.lock().expect("lock"));
    let now = chrono::Utc::now().timestamp();
    let valid = super::jwt::verify(&assertion, &account().public_der)
        && claims["aud"] == audience
        && claims["scope"].as_str().is_some_and(|s| s.contains("spreadsheets"))
        && claims["exp"].as_i64().is_some_and(|e| e > now);
    if !valid {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."})),
        )
            .into_response();
    }
    let mut tokens = shared.tokens.lock().expect("lock");
    let issued = format!("ya29.standin-{}", tokens.len() + 1);
    tokens.push(issued.clone());
    axum::Json(json!({"access_token": issued, "expires_in": 3599, "token_type": "Bearer"})).into_response()
}

/// `'title'!A1:C5` → (title, first row, first column, last row, last column), 0-based,
/// open ends as `usize::MAX`.
fn parse_range(range: &str) -> Option<(String, usize, usize, usize, usize)> {
    let (title, cells) = match range.rfind('!') {
        Some(i) if !range[i..].contains('\'') => (&range[..i], Some(&range[i + 1..])),
        _ => (range, None),
    };
    let title =
        title.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')).map_or(title.to_string(), |t| t.replace("''", "'"));
    let Some(cells) = cells else { return Some((title, 0, 0, usize::MAX, usize::MAX)) };
    let corner = |s: &str| -> Option<(usize, usize)> {
        let letters: String = s.chars().take_while(|c| c.is_ascii_alphabetic()).collect();
        let digits = &s[letters.len()..];
        let column = if letters.is_empty() {
            usize::MAX
        } else {
            letters.to_ascii_uppercase().bytes().fold(0usize, |n, b| n * 26 + (b - b'A' + 1) as usize) - 1
        };
        let row = if digits.is_empty() { usize::MAX } else { digits.parse::<usize>().ok()?.checked_sub(1)? };
        Some((row, column))
    };
    let (a, b) = cells.split_once(':').unwrap_or((cells, cells));
    let ((r0, c0), (r1, c1)) = (corner(a)?, corner(b)?);
    Some((title, if r0 == usize::MAX { 0 } else { r0 }, if c0 == usize::MAX { 0 } else { c0 }, r1, c1))
}

/// What `values.get` answers: trailing empty cells and trailing empty rows omitted.
fn trimmed(cells: &[Vec<Value>]) -> Vec<Vec<Value>> {
    let empty = |v: &Value| v.is_null() || v.as_str() == Some("");
    let mut rows: Vec<Vec<Value>> = cells
        .iter()
        .map(|r| {
            let keep = r.iter().rposition(|v| !empty(v)).map_or(0, |i| i + 1);
            r[..keep].to_vec()
        })
        .collect();
    while rows.last().is_some_and(|r| r.is_empty()) {
        rows.pop();
    }
    rows
}

/// What Sheets makes of typed text: TRUE/FALSE become booleans, plain numbers become numbers
/// (a leading zero keeps text text, as a phone number would).
fn coerced(v: &Value) -> Value {
    let Some(s) = v.as_str() else { return v.clone() };
    match s {
        "TRUE" | "true" => Value::Bool(true),
        "FALSE" | "false" => Value::Bool(false),
        _ if s.len() > 1 && s.starts_with('0') && !s.starts_with("0.") => v.clone(),
        _ => s.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map_or(v.clone(), Value::Number),
    }
}

async fn sheets(
    State(shared): State<Arc<Shared>>,
    method: Method,
    Path(rest): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let (id_and_verb, tail) = rest.split_once('/').map_or((rest.as_str(), ""), |(a, b)| (a, b));
    let kind = match (method.as_str(), tail) {
        ("GET", "") => "get",
        ("GET", "values:batchGet") => "batchGet",
        ("POST", "values:batchUpdate") => "values.batchUpdate",
        ("POST", t) if t.starts_with("values/") && t.ends_with(":append") => "append",
        ("POST", "") if id_and_verb.ends_with(":batchUpdate") => "batchUpdate",
        _ => return google_error(StatusCode::NOT_FOUND, &format!("no such method: {method} {rest}")),
    };
    let authorized = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| shared.tokens.lock().expect("lock").iter().any(|i| i == t));
    {
        let mut throttle = shared.throttle.lock().expect("lock");
        if *throttle > 0 {
            *throttle -= 1;
            shared.calls.lock().expect("lock").push(format!("{kind} 429"));
            return google_error(
                StatusCode::TOO_MANY_REQUESTS,
                "Quota exceeded for quota metric 'Write requests' and limit 'Write requests per minute per user'",
            );
        }
    }
    shared.calls.lock().expect("lock").push(kind.into());
    if !authorized {
        return google_error(StatusCode::UNAUTHORIZED, "Request had invalid authentication credentials.");
    }
    let query = query.unwrap_or_default();
    let params: Vec<(String, String)> = query_pairs(&query);
    let body: Value = if body.is_empty() { Value::Null } else { serde_json::from_slice(&body).unwrap_or(Value::Null) };
    let spreadsheet_id = id_and_verb.trim_end_matches(":batchUpdate").to_string();
    let coerce = *shared.coerce.lock().expect("lock");
    let mut tabs = shared.tabs.lock().expect("lock");
    match kind {
        "get" => {
            let sheets: Vec<Value> = tabs
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    json!({"properties": {"sheetId": t.id, "title": t.title, "index": i, "sheetType": "GRID",
                    "gridProperties": {"rowCount": t.rows, "columnCount": t.columns, "frozenRowCount": t.frozen_rows}}})
                })
                .collect();
            axum::Json(json!({"spreadsheetId": spreadsheet_id, "properties": {"title": "pcmail"}, "sheets": sheets}))
                .into_response()
        }
        "batchGet" => {
            let mut ranges = Vec::new();
            for (_, r) in params.iter().filter(|(k, _)| k == "ranges") {
                let Some((title, r0, c0, r1, c1)) = parse_range(r) else {
                    return google_error(StatusCode::BAD_REQUEST, &format!("Unable to parse range: {r}"));
                };
                let Some(tab) = tabs.iter().find(|t| t.title == title) else {
                    return google_error(StatusCode::BAD_REQUEST, &format!("Unable to parse range: {r}"));
                };
                let window: Vec<Vec<Value>> = tab
                    .cells
                    .iter()
                    .skip(r0)
                    .take(r1.saturating_sub(r0).saturating_add(1))
                    .map(|row| row.iter().skip(c0).take(c1.saturating_sub(c0).saturating_add(1)).cloned().collect())
                    .collect();
                let mut entry = json!({"range": r, "majorDimension": "ROWS"});
                let values = trimmed(&window);
                if !values.is_empty() {
                    entry["values"] = json!(values);
                }
                ranges.push(entry);
            }
            for (title, row, column, value) in shared.after_read.lock().expect("lock").drain(..) {
                if let Some(tab) = tabs.iter_mut().find(|t| t.title == title) {
                    set(&mut tab.cells, row - 1, column, value);
                }
            }
            axum::Json(json!({"spreadsheetId": spreadsheet_id, "valueRanges": ranges})).into_response()
        }
        "values.batchUpdate" => {
            let mut next = tabs.clone();
            let mut cells = 0;
            for d in body["data"].as_array().into_iter().flatten() {
                let r = d["range"].as_str().unwrap_or_default();
                let Some((title, r0, c0, _, _)) = parse_range(r) else {
                    return google_error(StatusCode::BAD_REQUEST, &format!("Unable to parse range: {r}"));
                };
                let Some(tab) = next.iter_mut().find(|t| t.title == title) else {
                    return google_error(StatusCode::BAD_REQUEST, &format!("Unable to parse range: {r}"));
                };
                for (i, row) in d["values"].as_array().into_iter().flatten().enumerate() {
                    let width = row.as_array().map_or(0, Vec::len);
                    if r0 + i >= tab.rows || c0 + width > tab.columns {
                        return google_error(
                            StatusCode::BAD_REQUEST,
                            &format!(
                                "Range ({r}) exceeds grid limits. Max rows: {}, max columns: {}",
                                tab.rows, tab.columns
                            ),
                        );
                    }
                    for (j, v) in row.as_array().into_iter().flatten().enumerate() {
                        set(&mut tab.cells, r0 + i, c0 + j, if coerce { coerced(v) } else { v.clone() });
                        cells += 1;
                    }
                }
            }
            *tabs = next;
            axum::Json(json!({"spreadsheetId": spreadsheet_id, "totalUpdatedCells": cells})).into_response()
        }
        "append" => {
            let range = tail.trim_start_matches("values/").trim_end_matches(":append");
            let range = percent_decode(range);
            let Some((title, first_row, ..)) = parse_range(&range) else {
                return google_error(StatusCode::BAD_REQUEST, &format!("Unable to parse range: {range}"));
            };
            let Some(tab) = tabs.iter_mut().find(|t| t.title == title) else {
                return google_error(StatusCode::BAD_REQUEST, &format!("Unable to parse range: {range}"));
            };
            // The table is the block of rows with data from the range's first row down; the first
            // empty row ends it, and the values go there (rows further down are not the table's).
            let empty = |row: &Vec<Value>| row.iter().all(|v| v.is_null() || v.as_str() == Some(""));
            let mut start = first_row;
            while tab.cells.get(start).is_some_and(|r| !empty(r)) {
                start += 1;
            }
            let rows = body["values"].as_array().cloned().unwrap_or_default();
            // INSERT_ROWS adds rows as needed; columns it does not add.
            if let Some(wide) = rows.iter().map(|r| r.as_array().map_or(0, Vec::len)).find(|w| *w > tab.columns) {
                return google_error(
                    StatusCode::BAD_REQUEST,
                    &format!("Range ({range}) exceeds grid limits. Max columns: {} (a row of {wide})", tab.columns),
                );
            }
            // INSERT_ROWS inserts rows for the data (what was below, rules and formats too,
            // moves down); OVERWRITE writes into the rows after the table. Both add rows past the
            // grid's end as needed.
            if params.iter().any(|(k, v)| k == "insertDataOption" && v == "INSERT_ROWS") {
                let n = rows.len();
                let moved = |r: usize| if r >= start { r + n } else { r };
                tab.checkboxes = tab.checkboxes.iter().map(|&(r, c)| (moved(r), c)).collect();
                tab.backgrounds =
                    std::mem::take(&mut tab.backgrounds).into_iter().map(|(r, v)| (moved(r), v)).collect();
                tab.rows += n;
                if start < tab.cells.len() {
                    tab.cells.splice(start..start, std::iter::repeat_n(Vec::new(), n));
                }
            }
            for (i, row) in rows.iter().enumerate() {
                if let Some(old) = tab.cells.get_mut(start + i) {
                    old.clear();
                }
                for (j, v) in row.as_array().into_iter().flatten().enumerate() {
                    set(&mut tab.cells, start + i, j, if coerce { coerced(v) } else { v.clone() });
                }
            }
            tab.rows = tab.rows.max(start + rows.len());
            let updated = format!("{}!A{}:Z{}", tab.title, start + 1, start + rows.len());
            axum::Json(json!({"spreadsheetId": spreadsheet_id, "updates": {"spreadsheetId": spreadsheet_id,
                "updatedRange": updated, "updatedRows": rows.len()}}))
            .into_response()
        }
        _ => {
            // spreadsheets:batchUpdate: every request applies, in order, or none does.
            let mut next = tabs.clone();
            let mut replies = Vec::new();
            for request in body["requests"].as_array().into_iter().flatten() {
                let sheet_of = |next: &[Tab], id: &Value| next.iter().position(|t| Some(t.id) == id.as_i64());
                let no_grid = |id: &Value| google_error(StatusCode::BAD_REQUEST, &format!("No grid with id: {id}"));
                if let Some(add) = request.get("addSheet") {
                    let p = &add["properties"];
                    let title = p["title"].as_str().unwrap_or_default().to_string();
                    if next.iter().any(|t| t.title == title) {
                        return google_error(
                            StatusCode::BAD_REQUEST,
                            &format!("A sheet with the name \"{title}\" already exists."),
                        );
                    }
                    let id = match p["sheetId"].as_i64() {
                        Some(id) if next.iter().any(|t| t.id == id) => {
                            return google_error(
                                StatusCode::BAD_REQUEST,
                                &format!("A sheet with id {id} already exists."),
                            );
                        }
                        Some(id) => id,
                        None => next.iter().map(|t| t.id).max().unwrap_or(0) + 1,
                    };
                    let grid = &p["gridProperties"];
                    let size = |k: &str, default: u64| grid[k].as_u64().unwrap_or(default) as usize;
                    let mut tab = Tab::new(id, &title, size("rowCount", 1000), size("columnCount", 26));
                    tab.frozen_rows = grid["frozenRowCount"].as_u64().unwrap_or(0);
                    next.push(tab);
                    replies.push(json!({"addSheet": {"properties": {"sheetId": id, "title": title}}}));
                } else if let Some(grow) = request.get("appendDimension") {
                    let Some(i) = sheet_of(&next, &grow["sheetId"]) else {
                        return no_grid(&grow["sheetId"]);
                    };
                    let length = grow["length"].as_u64().unwrap_or(0) as usize;
                    match grow["dimension"].as_str() {
                        Some("ROWS") => next[i].rows += length,
                        Some("COLUMNS") => next[i].columns += length,
                        _ => return google_error(StatusCode::BAD_REQUEST, "Invalid appendDimension"),
                    }
                    replies.push(json!({}));
                } else if let Some(update) = request.get("updateSheetProperties") {
                    let p = &update["properties"];
                    let Some(i) = sheet_of(&next, &p["sheetId"]) else {
                        return no_grid(&p["sheetId"]);
                    };
                    for field in update["fields"].as_str().unwrap_or_default().split(',') {
                        match field.trim() {
                            "title" => next[i].title = p["title"].as_str().unwrap_or_default().into(),
                            "gridProperties.frozenRowCount" => {
                                next[i].frozen_rows = p["gridProperties"]["frozenRowCount"].as_u64().unwrap_or(0)
                            }
                            other => {
                                return google_error(StatusCode::BAD_REQUEST, &format!("unsupported field {other}"));
                            }
                        }
                    }
                    replies.push(json!({}));
                } else if let Some(update) = request.get("updateDimensionProperties") {
                    let range = &update["range"];
                    let Some(i) = sheet_of(&next, &range["sheetId"]) else {
                        return no_grid(&range["sheetId"]);
                    };
                    let (start, end) = (
                        range["startIndex"].as_u64().unwrap_or(0) as usize,
                        range["endIndex"].as_u64().unwrap_or(0) as usize,
                    );
                    if range["dimension"] != "COLUMNS" || end > next[i].columns || update["fields"] != "hiddenByUser" {
                        return google_error(StatusCode::BAD_REQUEST, "Invalid updateDimensionProperties");
                    }
                    let hide = update["properties"]["hiddenByUser"].as_bool().unwrap_or(false);
                    for c in start..end {
                        if hide {
                            next[i].hidden_columns.insert(c);
                        } else {
                            next[i].hidden_columns.remove(&c);
                        }
                    }
                    replies.push(json!({}));
                } else if let Some(repeat) = request.get("repeatCell") {
                    let Some(i) = sheet_of(&next, &repeat["range"]["sheetId"]) else {
                        return no_grid(&repeat["range"]["sheetId"]);
                    };
                    let (rows, columns) = span(&repeat["range"], &next[i]);
                    if rows.end > next[i].rows || columns.end > next[i].columns {
                        return google_error(StatusCode::BAD_REQUEST, "Range exceeds grid limits");
                    }
                    let format = &repeat["cell"]["userEnteredFormat"];
                    match repeat["fields"].as_str() {
                        Some("userEnteredFormat.backgroundColor") => {
                            for r in rows {
                                next[i].backgrounds.insert(r, format["backgroundColor"].clone());
                            }
                        }
                        Some("userEnteredFormat.numberFormat") => {
                            for c in columns {
                                next[i].number_formats.insert(c, format["numberFormat"].clone());
                            }
                        }
                        _ => return google_error(StatusCode::BAD_REQUEST, "unsupported repeatCell fields"),
                    }
                    replies.push(json!({}));
                } else if let Some(rule) = request.get("setDataValidation") {
                    let Some(i) = sheet_of(&next, &rule["range"]["sheetId"]) else {
                        return no_grid(&rule["range"]["sheetId"]);
                    };
                    let (rows, columns) = span(&rule["range"], &next[i]);
                    if rows.end > next[i].rows || columns.end > next[i].columns {
                        return google_error(StatusCode::BAD_REQUEST, "Range exceeds grid limits");
                    }
                    if rule["rule"]["condition"]["type"] != "BOOLEAN" {
                        return google_error(StatusCode::BAD_REQUEST, "only BOOLEAN rules are modelled");
                    }
                    for r in rows {
                        for c in columns.clone() {
                            next[i].checkboxes.insert((r, c));
                        }
                    }
                    replies.push(json!({}));
                } else if let Some(del) = request.get("deleteDimension") {
                    let range = &del["range"];
                    let id = range["sheetId"].as_i64().unwrap_or(-1);
                    let Some(tab) = next.iter_mut().find(|t| t.id == id) else {
                        return google_error(StatusCode::BAD_REQUEST, &format!("No grid with id: {id}"));
                    };
                    let (start, end) = (
                        range["startIndex"].as_u64().unwrap_or(0) as usize,
                        range["endIndex"].as_u64().unwrap_or(0) as usize,
                    );
                    if range["dimension"] != "ROWS" || start >= end || end > tab.rows {
                        return google_error(StatusCode::BAD_REQUEST, "Invalid deleteDimension range");
                    }
                    tab.delete_rows(start, end);
                    replies.push(json!({}));
                } else {
                    return google_error(StatusCode::BAD_REQUEST, &format!("unsupported request {request}"));
                }
            }
            *tabs = next;
            axum::Json(json!({"spreadsheetId": spreadsheet_id, "replies": replies})).into_response()
        }
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `a=1&b=2` pairs, percent- and plus-decoded.
fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(&k.replace('+', " ")), percent_decode(&v.replace('+', " ")))
        })
        .collect()
}
