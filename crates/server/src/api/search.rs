//! U5: one search over mail and ledger rows; a machine finds only the mail it sent or received.
//! T14: the store bounds it by the core's budget, and it stops when the client hangs up (axum
//! drops this handler's future, and the store's search with it).

use axum::Extension;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use pcmail_core::api::SearchResults;
use pcmail_core::search::Scope;
use pcmail_store::{Search, Store};
use serde::Deserialize;

use crate::app::App;
use crate::auth::Caller;
use crate::error::ServiceError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchQuery {
    q: String,
    /// `mail` or `ledger`; both when absent.
    #[serde(default, rename = "in")]
    within: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

pub async fn search(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<SearchResults>, ServiceError> {
    let q = q.map_err(|e| ServiceError::bad_request(e.body_text()))?.0;
    let text = pcmail_core::api::search_text(&q.q)?;
    let within = q.within.as_deref().map(str::parse::<Scope>).transpose();
    let within = within.map_err(|e| ServiceError::unprocessable(format!("in: {e}")))?;
    let (mail, ledger) = within.map_or((true, true), |s| (s == Scope::Mail, s == Scope::Ledger));
    let limit = pcmail_core::bounds::count("limit", q.limit.unwrap_or(20) as u64, 1, 100)? as usize;
    let machine = caller.machine().map(String::from);
    let found = app.store().search(Search { text, machine, mail, ledger, limit, ..Search::default() }).await?;
    // T15: an answer a slow reader holds is bounded; one cut to fit says so like one cut by
    // its time budget.
    use pcmail_core::page::{MAX_PAGE_BYTES, within_bytes};
    let (mail, cut_mail) = within_bytes(found.mail, MAX_PAGE_BYTES / 2, super::json_len);
    let (rows, cut_rows) = within_bytes(found.rows, MAX_PAGE_BYTES / 2, super::json_len);
    let truncated = found.truncated || cut_mail + cut_rows > 0;
    Ok(Json(SearchResults { mail, rows, truncated, behind: found.behind }))
}
