//! Mail routes: send, list, status (with wait), seen/ack/fail, poll.

use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use pcmail_core::api::{MailStatus, PollResponse, SendRequest, SendResponse, StepRequest, WhoAmI};
use pcmail_core::bounds;
use pcmail_core::duration::Dur;
use pcmail_core::ids::is_stored_id;
use pcmail_core::mail::{Action, Mail, MailState, Step, can_view};
use pcmail_core::names::UnknownName;
use pcmail_store::{MailQuery, Store};
use serde::Deserialize;

use super::{JsonBody, detached, parse_json};
use crate::app::App;
use crate::auth::Caller;
use crate::error::ServiceError;
use crate::mailbox;

/// Long-polls are capped so that a proxy or client timeout never cuts one off mid-answer.
const MAX_WAIT: Duration = Duration::from_secs(60);
const MAX_LIMIT: usize = pcmail_core::page::MAX_MAIL_PAGE;

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ServiceError> {
    q.map(|Query(v)| v).map_err(|e| ServiceError::bad_request(format!("invalid query string: {}", e.body_text())))
}

/// T5 for a query's wait: at most [`MAX_WAIT`] (a client repeats a longer wait).
fn wait(field: &str, d: Option<Dur>) -> Result<Option<Duration>, ServiceError> {
    let max = Dur::from_millis(MAX_WAIT.as_millis() as u64);
    d.map(|d| bounds::duration(field, d, Dur::default(), max).map(Dur::to_std)).transpose().map_err(ServiceError::from)
}

/// T5 for a query's limit: 1 to [`MAX_LIMIT`], `default` when absent.
fn limit(n: Option<usize>, default: usize) -> Result<usize, ServiceError> {
    let n = n.unwrap_or(default) as u64;
    Ok(bounds::count("limit", n, 1, MAX_LIMIT as u64)? as usize)
}

fn check_id(id: &str) -> Result<(), ServiceError> {
    if is_stored_id(id) {
        Ok(())
    } else {
        let shape = pcmail_core::ids::MAIL_ID_SHAPE;
        Err(ServiceError::bad_request(format!("{id:?} is not a mail id ({shape}) nor an intent's (intent--…)")))
    }
}

pub async fn whoami(Extension(caller): Extension<Caller>) -> Result<Json<WhoAmI>, ServiceError> {
    Ok(Json(WhoAmI { machine: caller.machine().map(String::from), admin: caller.admin }))
}

pub async fn send(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(req): JsonBody<SendRequest>,
) -> Result<(StatusCode, Json<SendResponse>), ServiceError> {
    let sender = caller.require_machine()?.to_string();
    let response = detached(async move { mailbox::send(&app, &sender, req, crate::clock::now()).await }).await?;
    let status = if response.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(response)))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListQuery {
    /// `inbox` (mail to me, the default), `sent` (mail from me), or `all` (admin only).
    #[serde(default, rename = "box")]
    mailbox: Option<String>,
    /// Include done, failed and expired mail.
    #[serde(default)]
    all: bool,
    /// U3: only mail in this state (any state, closed ones too).
    #[serde(default)]
    state: Option<String>,
    /// U3: only mail from or to this machine.
    #[serde(default)]
    machine: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
    /// U3: the cursor, the last mail of the page before.
    #[serde(default)]
    after: Option<String>,
}

/// A page of mail, newest first; how many more match is the `x-pcmail-more` header.
pub async fn list(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<impl axum::response::IntoResponse, ServiceError> {
    let q = query(q)?;
    let mut filter = MailQuery {
        limit: limit(q.limit, 100)?,
        machine: q.machine.filter(|m| !m.trim().is_empty()).map(|m| app.runtime().machine_label(&m)),
        after: q.after.filter(|a| !a.is_empty()),
        max_bytes: Some(pcmail_core::page::MAX_PAGE_BYTES),
        ..Default::default()
    };
    match q.mailbox.as_deref().unwrap_or("inbox") {
        "inbox" => filter.to = Some(caller.require_machine()?.to_string()),
        "sent" => filter.from = Some(caller.require_machine()?.to_string()),
        "all" => caller.require_admin()?,
        other => {
            return Err(ServiceError::bad_request(format!("box must be inbox, sent or all, not {other:?}")));
        }
    }
    filter.states = match q.state.filter(|s| !s.is_empty()) {
        Some(state) => vec![state.parse::<MailState>().map_err(|e| ServiceError::bad_request(e.to_string()))?],
        None if q.all => vec![],
        None => vec![MailState::New, MailState::Delivered, MailState::Seen],
    };
    let (mail, more) = app.store().mail_page(filter).await?;
    Ok(super::with_more(mail, more))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StatusQuery {
    #[serde(default)]
    wait_for: Option<MailState>,
    #[serde(default)]
    timeout: Option<Dur>,
}

pub async fn status(
    State(app): State<App>,
    Path(id): Path<String>,
    Extension(caller): Extension<Caller>,
    q: Result<Query<StatusQuery>, QueryRejection>,
) -> Result<Json<MailStatus>, ServiceError> {
    let q = query(q)?;
    check_id(&id)?;
    // T16: another machine's mail answers exactly as a missing one.
    let visible = app.store().get_mail(&id).await?.filter(|m| can_view(m, &caller.principal));
    let mail = visible.ok_or_else(|| ServiceError::mail_not_found(&id))?;
    let mail = match q.wait_for {
        Some(target) => {
            let wait = wait("timeout", q.timeout)?.unwrap_or(MAX_WAIT);
            mailbox::wait_for(&app, &caller, &id, Some(target), wait).await?
        }
        None => mail,
    };
    let events = app.store().events_for(&format!("mail/{id}")).await?;
    Ok(Json(MailStatus { mail, events }))
}

pub async fn step(
    State(app): State<App>,
    Path((id, step)): Path<(String, String)>,
    Extension(caller): Extension<Caller>,
    body: Bytes,
) -> Result<Json<Mail>, ServiceError> {
    check_id(&id)?;
    let req: StepRequest = if body.is_empty() { StepRequest::default() } else { parse_json(&body)? };
    let action: Action = step.parse().map_err(|e: UnknownName| ServiceError::not_found(e.to_string()))?;
    let step = match action {
        Action::Seen => Step::See,
        Action::Ack => Step::Done { result: req.result },
        Action::Fail => match req.reason.filter(|r| !r.trim().is_empty()) {
            Some(reason) => Step::Fail { reason },
            None => return Err(ServiceError::bad_request("fail needs a non-empty reason")),
        },
    };
    Ok(Json(detached(async move { mailbox::step(&app, &caller, &id, step, crate::clock::now()).await }).await?))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PollQuery {
    #[serde(default)]
    cursor: i64,
    /// The store identity the cursor belongs to (E5), as the last poll answered it.
    #[serde(default)]
    store: Option<String>,
    #[serde(default)]
    wait: Option<Dur>,
    #[serde(default)]
    limit: Option<usize>,
}

pub async fn poll(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    headers: axum::http::HeaderMap,
    q: Result<Query<PollQuery>, QueryRejection>,
) -> Result<Json<PollResponse>, ServiceError> {
    let q = query(q)?;
    caller.require_machine()?;
    let wait = wait("wait", q.wait)?.unwrap_or(Duration::ZERO);
    let limit = limit(q.limit, 100)?;
    // V1: the client's version, kept with the poll's heartbeat.
    let client = headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(pcmail_core::api::client_version)
        .unwrap_or_default();
    Ok(Json(mailbox::poll(&app, &caller, (q.cursor, q.store.as_deref()), limit, wait, &client).await?))
}

/// I1 on the server: stores an inbound message as an intent for the Roster owner; the same key
/// twice answers the same id and adds nothing.
pub async fn record_intent(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(msg): JsonBody<pcmail_core::intent::InboundMessage>,
) -> Result<(StatusCode, Json<SendResponse>), ServiceError> {
    let response =
        detached(async move { mailbox::record_intent(&app, &caller, msg, crate::clock::now()).await }).await?;
    let status = if response.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(response)))
}

/// I9: how a PC's own chat poller is; a conflict raises `channel-conflict`, drops are counted.
pub async fn poller_report(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(report): JsonBody<pcmail_core::api::PollerReport>,
) -> Result<Json<serde_json::Value>, ServiceError> {
    detached(async move { mailbox::poller_report(&app, &caller, report, crate::clock::now()).await }).await?;
    Ok(Json(serde_json::json!({"ok": true})))
}

/// T10: a PC's report of a queued call the server refused for good.
pub async fn refused(
    State(app): State<App>,
    Extension(caller): Extension<Caller>,
    JsonBody(call): JsonBody<pcmail_core::api::RefusedCall>,
) -> Result<Json<serde_json::Value>, ServiceError> {
    detached(async move { mailbox::refused(&app, &caller, call, crate::clock::now()).await }).await?;
    Ok(Json(serde_json::json!({"ok": true})))
}

/// The IntentPolicy the PC's hooks follow (they cannot ask the server themselves).
pub async fn policy(
    State(app): State<App>,
) -> Result<Json<pcmail_core::manifest::spec::IntentPolicySpec>, ServiceError> {
    Ok(Json(app.runtime().intent_policy.clone()))
}
