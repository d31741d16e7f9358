//! The Sheets API v4 over reqwest, within Google's quotas: reads and writes each paced by a
//! token bucket (1/s by default), 429 and 5xx retried with exponential backoff and jitter
//! honouring Retry-After. A call Google may have applied before failing (a 5xx or a timeout
//! on a write that is not idempotent) is not repeated here: the next sync cycle re-reads the
//! sheet and plans from what is there, which is what makes every write land exactly once.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::de::DeserializeOwned;

use super::auth::{GOOGLE_TOKEN_URL, ServiceAccount, Signer};
use super::wire::{
    AppendResponse, BatchGetResponse, BatchUpdateRequest, BatchUpdateResponse, BatchUpdateValuesRequest, ErrorBody,
    Spreadsheet, TokenResponse, ValueRange,
};
use crate::StoreError;

pub const GOOGLE_API: &str = "https://sheets.googleapis.com";
const RETRY_AFTER_CAP: Duration = Duration::from_secs(120);

/// What a `sheets://SPREADSHEET_ID?credentials=PATH[&api=URL][&token_url=URL][&reads=R][&writes=W][&headers=ja|en]`
/// URL says. `reads`/`writes` are calls per second.
#[derive(Debug, Clone, PartialEq)]
pub struct SheetsConfig {
    pub spreadsheet_id: String,
    pub credentials: PathBuf,
    pub api: String,
    pub token_url: Option<String>,
    pub reads_per_second: f64,
    pub writes_per_second: f64,
    /// The header preset of tabs this adapter creates (`headers=ja|en`, ja by default).
    pub headers: pcmail_core::sheet::layout::Lang,
}

impl SheetsConfig {
    pub fn from_url(url: &str) -> Result<SheetsConfig, StoreError> {
        let bad = |reason: String| StoreError::BadUrl { url: url.into(), reason };
        let rest = url
            .strip_prefix("sheets://")
            .ok_or_else(|| bad("expected sheets://SPREADSHEET_ID?credentials=PATH".into()))?;
        let (id, query) = rest.split_once('?').unwrap_or((rest, ""));
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            return Err(bad("the spreadsheet id (from its URL, /d/ID/edit) is missing or malformed".into()));
        }
        let mut config = SheetsConfig {
            spreadsheet_id: id.into(),
            credentials: PathBuf::new(),
            api: GOOGLE_API.into(),
            token_url: None,
            reads_per_second: 1.0,
            writes_per_second: 1.0,
            headers: pcmail_core::sheet::layout::Lang::Ja,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let rate = |v: &str| v.parse::<f64>().ok().filter(|r| *r > 0.0 && r.is_finite());
            match k {
                "credentials" => config.credentials = PathBuf::from(v),
                "api" => config.api = v.trim_end_matches('/').into(),
                "token_url" => config.token_url = Some(v.into()),
                "reads" => {
                    config.reads_per_second = rate(v).ok_or_else(|| bad(format!("reads={v} is not a rate > 0")))?
                }
                "writes" => {
                    config.writes_per_second = rate(v).ok_or_else(|| bad(format!("writes={v} is not a rate > 0")))?
                }
                "headers" => {
                    config.headers = match v {
                        "ja" => pcmail_core::sheet::layout::Lang::Ja,
                        "en" => pcmail_core::sheet::layout::Lang::En,
                        _ => return Err(bad(format!("headers={v}: expected ja or en"))),
                    }
                }
                other => return Err(bad(format!("unknown parameter {other:?}"))),
            }
        }
        if config.credentials.as_os_str().is_empty() {
            return Err(bad("credentials=PATH (a service account's JSON key) is required".into()));
        }
        Ok(config)
    }
}

/// API calls made, by kind: what P8 counts.
#[derive(Debug, Default)]
pub struct Calls {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub tokens: AtomicU64,
    /// Answers of 429 or 5xx that were waited out and repeated.
    pub retried: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    /// A write that can be repeated as is (values written to fixed cells).
    IdempotentWrite,
    /// A write that must not be repeated blindly (appends, row deletions).
    Write,
}

pub struct Client {
    http: reqwest::Client,
    config: SheetsConfig,
    signer: Signer,
    token_url: String,
    token: tokio::sync::Mutex<Option<(String, Instant)>>,
    reads: DefaultDirectRateLimiter,
    writes: DefaultDirectRateLimiter,
    pub calls: Calls,
}

#[derive(Debug)]
struct CallError {
    error: StoreError,
    retry: bool,
    retry_after: Option<Duration>,
}

fn limiter(per_second: f64) -> DefaultDirectRateLimiter {
    let quota = Quota::with_period(Duration::from_secs_f64(1.0 / per_second))
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN));
    RateLimiter::direct(quota)
}

impl Client {
    pub fn new(config: SheetsConfig) -> Result<Client, StoreError> {
        let account = ServiceAccount::load(&config.credentials)?;
        let signer = Signer::new(&account)?;
        let token_url = config.token_url.clone().or(account.token_uri).unwrap_or_else(|| GOOGLE_TOKEN_URL.into());
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| StoreError::Backend(format!("HTTP client: {e}")))?;
        Ok(Client {
            http,
            reads: limiter(config.reads_per_second),
            writes: limiter(config.writes_per_second),
            config,
            signer,
            token_url,
            token: tokio::sync::Mutex::new(None),
            calls: Calls::default(),
        })
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/v4/spreadsheets/{}{tail}", self.config.api, self.config.spreadsheet_id)
    }

    /// The cached access token, or a fresh one when it expires within a minute.
    async fn access_token(&self) -> Result<String, StoreError> {
        let mut slot = self.token.lock().await;
        if let Some((token, until)) = &*slot
            && Instant::now() + Duration::from_secs(60) < *until
        {
            return Ok(token.clone());
        }
        let now = chrono::Utc::now().timestamp();
        let assertion = self.signer.assertion(&self.token_url, now)?;
        self.calls.tokens.fetch_add(1, Ordering::Relaxed);
        let resp = self
            .http
            .post(&self.token_url)
            .form(&[("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"), ("assertion", &assertion)])
            .send()
            .await
            .map_err(|e| StoreError::Unavailable(format!("token endpoint {}: {e}", self.token_url)))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            return Err(StoreError::Unavailable(format!(
                "token endpoint {} refused the service account ({status}): {}",
                self.token_url,
                body.chars().take(300).collect::<String>()
            )));
        }
        let token: TokenResponse = serde_json::from_str(&body)
            .map_err(|e| StoreError::Backend(format!("token endpoint answered an unexpected body: {e}")))?;
        let until = Instant::now() + Duration::from_secs(token.expires_in);
        *slot = Some((token.access_token.clone(), until));
        Ok(token.access_token)
    }

    async fn call<T: DeserializeOwned>(
        &self,
        kind: Kind,
        build: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<T, StoreError> {
        let attempt = || async {
            match kind {
                Kind::Read => self.reads.until_ready().await,
                Kind::Write | Kind::IdempotentWrite => self.writes.until_ready().await,
            }
            let counter = if kind == Kind::Read { &self.calls.reads } else { &self.calls.writes };
            let token =
                self.access_token().await.map_err(|error| CallError { error, retry: false, retry_after: None })?;
            counter.fetch_add(1, Ordering::Relaxed);
            let sent = build(&self.http).bearer_auth(token).send().await;
            let resp = match sent {
                Ok(r) => r,
                // Not sent at all can be repeated; sent and unanswered only if repeating is harmless.
                Err(e) => {
                    let retry = e.is_connect() || kind != Kind::Write;
                    return Err(CallError {
                        error: StoreError::Unavailable(format!("sheets API: {e}")),
                        retry,
                        retry_after: None,
                    });
                }
            };
            let status = resp.status().as_u16();
            let header =
                resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).map(String::from);
            let body = resp.text().await.unwrap_or_default();
            if (200..300).contains(&status) {
                return serde_json::from_str::<T>(&body).map_err(|e| CallError {
                    error: StoreError::Backend(format!("sheets API answered an unexpected body: {e}")),
                    retry: false,
                    retry_after: None,
                });
            }
            let message = serde_json::from_str::<ErrorBody>(&body)
                .map(|b| b.error.message)
                .unwrap_or_else(|_| body.chars().take(300).collect());
            // A 429 was refused, not applied: always safe to repeat. A 5xx may have been applied.
            let retry = status == 429 || (pcmail_core::retry::retryable(status) && kind != Kind::Write);
            let error = if status == 429 || status >= 500 {
                StoreError::Unavailable(format!("sheets API {status}: {message}"))
            } else {
                StoreError::Backend(format!("sheets API {status}: {message}"))
            };
            Err(CallError {
                error,
                retry,
                retry_after: pcmail_core::retry::retry_after(header.as_deref(), RETRY_AFTER_CAP),
            })
        };
        let backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(500))
            .with_max_delay(Duration::from_secs(32))
            .with_max_times(6)
            .with_jitter();
        attempt
            .retry(backoff)
            .when(|e: &CallError| e.retry)
            .adjust(|e: &CallError, d| e.retry_after.or(d))
            .notify(|_, _| {
                self.calls.retried.fetch_add(1, Ordering::Relaxed);
            })
            .await
            .map_err(|e| e.error)
    }

    /// The tabs and their numeric ids.
    pub async fn spreadsheet(&self) -> Result<Spreadsheet, StoreError> {
        let url = self.url("?includeGridData=false");
        self.call(Kind::Read, |h| h.get(&url)).await
    }

    /// Every range in one call, values unformatted (numbers and booleans as JSON types).
    pub async fn batch_get(&self, ranges: &[String]) -> Result<Vec<ValueRange>, StoreError> {
        let url = self.url("/values:batchGet");
        let mut query: Vec<(&str, &str)> = ranges.iter().map(|r| ("ranges", r.as_str())).collect();
        query.push(("valueRenderOption", "UNFORMATTED_VALUE"));
        query.push(("majorDimension", "ROWS"));
        let answer: BatchGetResponse = self.call(Kind::Read, |h| h.get(&url).query(&query)).await?;
        Ok(answer.value_ranges)
    }

    /// Cells written as given (`RAW`), every range in one call.
    pub async fn update_values(&self, data: Vec<ValueRange>) -> Result<(), StoreError> {
        let url = self.url("/values:batchUpdate");
        let body = BatchUpdateValuesRequest { value_input_option: "RAW".into(), data };
        let _: serde_json::Value = self.call(Kind::IdempotentWrite, |h| h.post(&url).json(&body)).await?;
        Ok(())
    }

    /// Structural requests (add tabs, append or delete rows), applied atomically in one call.
    pub async fn batch_update(&self, requests: Vec<serde_json::Value>) -> Result<BatchUpdateResponse, StoreError> {
        let url = self.url(":batchUpdate");
        let body = BatchUpdateRequest { requests };
        self.call(Kind::Write, |h| h.post(&url).json(&body)).await
    }

    /// Rows appended after the last row of `range`'s table, into the grid's existing empty rows
    /// (`OVERWRITE`: the checkboxes set on those rows beforehand stay on them; `INSERT_ROWS`
    /// would push them down past the data).
    pub async fn append(&self, range: &str, rows: Vec<Vec<serde_json::Value>>) -> Result<AppendResponse, StoreError> {
        let url = self.url(&format!("/values/{}:append", encode_path(range)));
        let body = ValueRange { range: range.into(), major_dimension: Some("ROWS".into()), values: rows };
        let query = [("valueInputOption", "RAW"), ("insertDataOption", "OVERWRITE")];
        self.call(Kind::Write, |h| h.post(&url).query(&query).json(&body)).await
    }
}

/// Percent-encodes an A1 range for a URL path segment.
fn encode_path(range: &str) -> String {
    let mut out = String::new();
    for b in range.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sheets_urls_name_their_problem() {
        let c = SheetsConfig::from_url("sheets://1abc_-X?credentials=/k.json&reads=2&writes=0.5").expect("ok");
        assert_eq!((c.spreadsheet_id.as_str(), c.reads_per_second, c.writes_per_second), ("1abc_-X", 2.0, 0.5));
        assert_eq!(c.api, GOOGLE_API);
        for (url, says) in [
            ("sheets://?credentials=/k.json", "spreadsheet id"),
            ("sheets://abc", "credentials=PATH"),
            ("sheets://abc?credentials=/k&reads=0", "reads=0"),
            ("sheets://abc?credentials=/k&colour=red", "colour"),
            ("sheets://a/b?credentials=/k", "malformed"),
        ] {
            let err = SheetsConfig::from_url(url).expect_err(url).to_string();
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    use super::super::standin::Standin;
    use serde_json::json;

    async fn client(standin: &Standin) -> Client {
        Client::new(SheetsConfig::from_url(&standin.store_url("")).expect("url")).expect("client")
    }

    #[tokio::test]
    async fn a_signed_service_account_token_is_fetched_once_and_reused() {
        let standin = Standin::start().await;
        let c = client(&standin).await;
        c.spreadsheet().await.expect("get");
        c.batch_get(&["'Sheet1'".into()]).await.expect("batchGet");
        assert_eq!(standin.calls(), ["token", "get", "batchGet"], "the stand-in checked the RS256 signature once");
        assert_eq!(c.calls.tokens.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn p8_quota_429s_are_waited_out_and_the_write_lands_once() {
        let standin = Standin::start().await;
        let c = client(&standin).await;
        c.spreadsheet().await.expect("token first");
        standin.throttle_next(2);
        let data = vec![ValueRange {
            range: "'Sheet1'!A1:B1".into(),
            major_dimension: None,
            values: vec![vec![json!("a"), json!(true)]],
        }];
        c.update_values(data).await.expect("lands after the 429s");
        let writes: Vec<String> = standin.calls().into_iter().filter(|c| c.starts_with("values.batchUpdate")).collect();
        assert_eq!(writes, ["values.batchUpdate 429", "values.batchUpdate 429", "values.batchUpdate"]);
        assert_eq!(standin.cells("Sheet1"), vec![vec![json!("a"), json!(true)]]);
        assert_eq!(c.calls.retried.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn batch_get_reads_ragged_rows_typed() {
        let standin = Standin::start().await;
        standin.edit("Sheet1", 1, 0, json!("id"));
        standin.edit("Sheet1", 1, 2, json!("state"));
        standin.edit("Sheet1", 3, 1, json!(3));
        standin.edit("Sheet1", 3, 3, json!(""));
        let c = client(&standin).await;
        let got = c.batch_get(&["'Sheet1'".into()]).await.expect("batchGet");
        assert_eq!(
            got[0].values,
            vec![vec![json!("id"), json!(""), json!("state")], vec![], vec![json!(""), json!(3)]]
        );
    }

    #[tokio::test]
    async fn an_unreachable_token_endpoint_is_named() {
        let standin = Standin::start().await;
        let url = standin.store_url("&token_url=http://127.0.0.1:9/token");
        let c = Client::new(SheetsConfig::from_url(&url).expect("url")).expect("client");
        let err = c.spreadsheet().await.expect_err("no token").to_string();
        assert!(err.contains("token endpoint http://127.0.0.1:9/token"), "{err}");
    }

    #[test]
    fn ranges_are_encoded_for_the_path() {
        assert_eq!(encode_path("'台帳'!A1:B2"), "%27%E5%8F%B0%E5%B8%B3%27%21A1%3AB2");
    }
}
