//! The web console under `/ui`: server-rendered pages for the people who supervise — the ledger
//! (review and correct rows, tick ▶ run), mail per machine with each mail's timeline, alerts,
//! job queues and every spec object's status. Forms work without JavaScript. Behind the admin
//! token through a login form; an HttpOnly SameSite=Strict session cookie; a CSRF token in
//! every form. Handlers read; `views` renders, through maud templates that escape by type.

mod chart;
mod html;
mod session;
mod views;

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use pcmail_core::alert::AlertState;
use pcmail_core::ids::sha256_hex;
use pcmail_core::jobs::{Job, JobState};
use pcmail_core::ledger::{RowState, Trigger, is_overdue};
use pcmail_core::mail::{Mail, MailState};
use pcmail_core::page::{self, Listing, PER_PAGE, alert_cursor, row_cursor};
use pcmail_store::{EVERY, JobQuery, MailQuery, Store};
use serde::Deserialize;

use crate::app::App;
use crate::error::Failure;
use crate::metrics::Surface;
use html::{Lang, lang, page, t};
pub use session::Sessions;
use views::Choice;

pub fn routes(sessions: Arc<Sessions>) -> Router<App> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(|| async { Redirect::to("/ui/overview") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/overview") }))
        .route("/ui/overview", get(overview))
        .route("/ui/style.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], html::CSS) }))
        .route(
            "/ui/live.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], html::LIVE_JS) }),
        )
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/ledger", get(ledger))
        .route("/ui/ledger/{project}/{id}", get(row_page).post(row_edit))
        .route("/ui/mail", get(mail))
        .route("/ui/mail/{id}", get(mail_timeline))
        .route("/ui/alerts", get(alerts))
        .route("/ui/jobs", get(jobs))
        .route("/ui/jobs/{id}/{action}", post(job_action))
        .route("/ui/specs", get(specs))
        .route("/ui/search", get(search))
        // Unknown console paths answer from here, with the console's headers (T9).
        .route("/ui/{*rest}", get(not_found))
        .layer(Extension(sessions))
        .layer(axum::middleware::map_response(guard_headers))
}

/// T9 on every console answer: nothing but our own resources load, no page in a frame, nothing
/// cached (a shared PC's back button shows no ledger), no referrer leaving with a URL.
async fn guard_headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, "default-src 'self'; form-action 'self'; frame-ancestors 'none'"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        h.insert(name, header::HeaderValue::from_static(value));
    }
    response
}

/// The client's address, when the server was started with connection info (T9's throttle).
struct ClientAddr(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<ClientAddr, Self::Rejection> {
        let addr = parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        Ok(ClientAddr(addr.map_or_else(|| "unknown".into(), |a| a.0.ip().to_string())))
    }
}

/// The signed-in person's page context: their language and the session's CSRF token.
struct Ctx {
    lang: Lang,
    csrf: String,
}

fn language(headers: &HeaderMap) -> Lang {
    lang(headers.get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()))
}

/// Every console page needs a session: the cookie's, or a redirect to the login form.
impl axum::extract::FromRequestParts<App> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, app: &App) -> Result<Ctx, Response> {
        let sessions = parts.extensions.get::<Arc<Sessions>>();
        let admin = app.access().admin_token_hash();
        let csrf = session::cookie(&parts.headers).and_then(|id| sessions?.csrf(&id, &admin));
        match csrf {
            Some(csrf) => Ok(Ctx { lang: language(&parts.headers), csrf }),
            None => Err(Redirect::to("/ui/login").into_response()),
        }
    }
}

impl Ctx {
    /// A signed-in page: the navigation carries the session's CSRF token for logging out.
    fn page(&self, title: &str, body: maud::Markup) -> Html<String> {
        Html(page(self.lang, title, Some(&self.csrf), body).into_string())
    }

    /// A posted form's CSRF token must be the session's: otherwise a 403 to answer, and
    /// nothing changes.
    fn forged(&self, posted: &str) -> Option<Response> {
        if !posted.is_empty() && crate::auth::constant_time_eq(posted, &self.csrf) {
            return None;
        }
        let body = views::message(t(
            self.lang,
            "This form was not sent from this console (its CSRF token is missing or wrong); nothing was changed.",
            "このフォームはコンソールから送られていません（CSRF トークンがないか不正です）。何も変更していません。",
        ));
        Some((StatusCode::FORBIDDEN, self.page("403", body)).into_response())
    }
}

/// A page, or the error page that stands in for it.
type Page = Result<Response, Response>;

/// A store that cannot answer shows as an error page (503) naming why, never as an empty list
/// or a "not found".
fn unavailable(ctx: &Ctx) -> impl Fn(pcmail_store::StoreError) -> Response + '_ {
    move |e| failure(ctx, StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
}

fn failure(ctx: &Ctx, status: StatusCode, message: &str) -> Response {
    (status, ctx.page(t(ctx.lang, "Error", "エラー"), views::message(message))).into_response()
}

async fn not_found(uri: axum::http::Uri, headers: HeaderMap) -> Response {
    // `/ui/ledger/` is `/ui/ledger`: a trailing slash (a typed or bookmarked URL) leads to the
    // page without it.
    let path = uri.path();
    if path.ends_with('/') {
        let canonical = path.trim_end_matches('/');
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        return Redirect::permanent(&format!("{canonical}{query}")).into_response();
    }
    let lang = language(&headers);
    let body = views::message(t(lang, "No such page.", "そのページはありません。"));
    (StatusCode::NOT_FOUND, Html(page(lang, "404", None, body).into_string())).into_response()
}

async fn login_form(headers: HeaderMap) -> Html<String> {
    Html(login_page(language(&headers), None))
}

fn login_page(lang: Lang, error: Option<&str>) -> String {
    page(lang, t(lang, "Sign in", "ログイン"), None, views::login(lang, error)).into_string()
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

async fn login(
    State(app): State<App>,
    Extension(sessions): Extension<Arc<Sessions>>,
    ClientAddr(client): ClientAddr,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let lang = language(&headers);
    let now = crate::clock::now();
    if let Err(wait) = app.access().failures().attempt(&client, now) {
        tracing::warn!(%client, "console sign-in refused: too many failed sign-ins from this address");
        let message = match lang {
            Lang::Ja => format!("サインインの失敗が多すぎます。{wait} 秒後にもう一度どうぞ。"),
            Lang::En => format!("Too many failed sign-ins from this address; try again in {wait} s."),
        };
        let body = login_page(lang, Some(&message));
        return (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, wait.to_string())], Html(body)).into_response();
    }
    if !crate::auth::constant_time_eq(&sha256_hex(form.token.trim()), &app.access().admin_token_hash()) {
        app.access().failures().failed(&client, now);
        app.metrics().surface.auth_failed(Surface::Console);
        tracing::warn!(%client, "console sign-in failed: not the admin token");
        let message = t(lang, "That is not the admin token.", "管理トークンが違います。");
        return (StatusCode::UNAUTHORIZED, Html(login_page(lang, Some(message)))).into_response();
    }
    app.access().failures().succeeded(&client);
    let id = match sessions.create(&app.access().admin_token_hash()) {
        Ok(id) => id,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    ([(header::SET_COOKIE, session::set_cookie(&id))], Redirect::to("/ui/overview")).into_response()
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(
    ctx: Ctx,
    Extension(sessions): Extension<Arc<Sessions>>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Response {
    if let Some(refused) = ctx.forged(&form.csrf) {
        return refused;
    }
    if let Some(id) = session::cookie(&headers) {
        sessions.remove(&id);
    }
    ([(header::SET_COOKIE, session::clear_cookie())], Redirect::to("/ui/login")).into_response()
}

async fn overview(State(app): State<App>, ctx: Ctx) -> Page {
    let store = app.store();
    let totals = views::Totals {
        mail: store.mail_counts().await.map_err(unavailable(&ctx))?.into_iter().map(|c| (c.state, c.count)).collect(),
        ledger: store.ledger_counts().await.map_err(unavailable(&ctx))?,
        jobs: store.job_counts().await.map_err(unavailable(&ctx))?,
        alerts_firing: {
            let firing = Listing { state: Some(AlertState::Firing.as_str().into()), ..Default::default() };
            store.alert_page(firing, 0).await.map_err(unavailable(&ctx))?.1
        },
        machines: store.machines_seen().await.map_err(unavailable(&ctx))?,
    };
    // The window ends with the hour now is in, so the last point is this hour so far.
    let hour = chrono::TimeDelta::hours(1);
    let this_hour = chrono::DurationRound::duration_trunc(crate::clock::now(), hour)
        .map_err(|e| failure(&ctx, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))?;
    let since = this_hour - hour * (views::CHART_HOURS as i32 - 1);
    let activity = store.activity(since, hour).await.map_err(unavailable(&ctx))?;
    let deliveries = store.deliveries(since).await.map_err(unavailable(&ctx))?;
    let body = views::overview(ctx.lang, &totals, &activity, &deliveries, since);
    Ok(ctx.page(t(ctx.lang, "Overview", "概要"), body).into_response())
}

/// U3: a listing's filters from its query string; a malformed one, or a state the listing does
/// not have, is the message of a 400 page naming it (never an empty list that looks like
/// "nothing").
fn listing_of<S: std::str::FromStr<Err = pcmail_core::names::UnknownName>>(
    app: &App,
    q: Result<Query<Listing>, QueryRejection>,
) -> Result<Listing, BadListing> {
    let mut listing = q?.0.normalized();
    listing.machine = listing.machine.map(|m| app.runtime().machine_label(&m));
    if let Some(state) = &listing.state {
        state.parse::<S>()?;
    }
    Ok(listing)
}

/// U3: a listing's query string that names no page: malformed, or a state the listing lacks.
#[derive(Debug, thiserror::Error)]
enum BadListing {
    /// In axum's own words for the malformed query.
    #[error("{}", .0.body_text())]
    Query(#[from] QueryRejection),
    #[error(transparent)]
    State(#[from] pcmail_core::names::UnknownName),
}

fn bad_request(ctx: &Ctx) -> impl Fn(BadListing) -> Response + '_ {
    move |e| failure(ctx, StatusCode::BAD_REQUEST, &e.to_string())
}

/// Where a page of `shown` items with `left` after it sits among `matching`.
fn paged<T>(items: &[T], matching: u64, left: u64, key: impl Fn(&T) -> String) -> views::Paged {
    views::Paged { matching, left, shown: items.len(), last: items.last().map(key) }
}

/// The machines of the Roster, by label (the name mail carries).
fn machines(app: &App) -> Vec<String> {
    app.runtime().roster.iter().flat_map(|r| r.machines.iter().map(|m| m.label.clone())).collect()
}

/// The filter by state, offering every state the listing's items have.
fn state_choice(l: Lang, states: impl IntoIterator<Item = &'static str>) -> Choice<'static> {
    Choice { field: "state", label: t(l, "State", "状態"), options: states.into_iter().map(String::from).collect() }
}

async fn ledger(State(app): State<App>, ctx: Ctx, q: Result<Query<Listing>, QueryRejection>) -> Page {
    let listing = listing_of::<RowState>(&app, q).map_err(bad_request(&ctx))?;
    let store = app.store();
    // Every row the filters match is read once: the summary counts them all, the page shows 50.
    let (all, _) = store.ledger_page(listing.with_cursor(None), EVERY).await.map_err(unavailable(&ctx))?;
    let today = crate::clock::now().format("%Y-%m-%d").to_string();
    let summary = (
        all.iter().filter(|r| r.state == RowState::Review).count(),
        all.iter().filter(|r| is_overdue(r, &today)).count(),
    );
    let matching = all.len() as u64;
    let (rows, left) = page::rows_page(all, listing.after.as_deref(), PER_PAGE);
    let functions = app.runtime().functions.iter().map(|(name, _)| name.clone()).collect();
    let l = ctx.lang;
    let listed = views::Listed {
        choices: vec![
            Choice {
                field: "project",
                label: t(l, "Project", "案件"),
                options: store.ledger_projects().await.map_err(unavailable(&ctx))?,
            },
            state_choice(l, RowState::ALL.iter().map(|s| s.as_str())),
            Choice { field: "function", label: t(l, "AI function", "AI機能"), options: functions },
            Choice { field: "machine", label: t(l, "Assignee", "担当"), options: machines(&app) },
        ],
        paged: paged(&rows, matching, left, row_cursor),
        listing,
    };
    Ok(ctx.page(t(l, "Ledger", "台帳"), views::ledger(l, &rows, summary, &today, &listed)).into_response())
}

async fn row_page(State(app): State<App>, ctx: Ctx, Path((project, id)): Path<(String, String)>) -> Page {
    render_row(&app, &ctx, &project, &id, None).await
}

async fn render_row(app: &App, ctx: &Ctx, project: &str, id: &str, error: Option<&str>) -> Page {
    let rows = app.store().ledger_rows(Some(project)).await.map_err(unavailable(ctx))?;
    let Some(row) = rows.into_iter().find(|r| r.id == id) else {
        return Err(failure(ctx, StatusCode::NOT_FOUND, &format!("{project}/{id} not found")));
    };
    let history = app.store().events_for(&format!("ledger/{project}/{id}")).await.map_err(unavailable(ctx))?;
    let status = if error.is_none() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let body = views::row(ctx.lang, &ctx.csrf, &row, history, error);
    Ok((status, ctx.page(&format!("{project} / {id}"), body)).into_response())
}

#[derive(Deserialize)]
struct RowForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    instruction: String,
    #[serde(default)]
    run: Option<String>,
}

async fn row_edit(
    State(app): State<App>,
    ctx: Ctx,
    Path((project, id)): Path<(String, String)>,
    Form(form): Form<RowForm>,
) -> Page {
    if let Some(refused) = ctx.forged(&form.csrf) {
        return Err(refused);
    }
    let edit = pcmail_core::api::RowEdit {
        project: Some(project.clone()),
        state: Some(form.state).filter(|s| !s.is_empty()),
        instruction: Some(form.instruction),
        ..Default::default()
    };
    let outcome = async {
        crate::ledger::set_row(&app, &project, &id, edit, crate::clock::now()).await?;
        if form.run.is_some() {
            crate::ledger::run_row(&app, &project, &id, Trigger::Manual, crate::clock::now()).await?;
        }
        Ok::<_, crate::error::ServiceError>(())
    }
    .await;
    match outcome {
        Ok(()) => Ok(Redirect::to(&format!("/ui/ledger/{project}/{id}")).into_response()),
        Err(e) => render_row(&app, &ctx, &project, &id, Some(e.message())).await,
    }
}

async fn mail(State(app): State<App>, ctx: Ctx, q: Result<Query<Listing>, QueryRejection>) -> Page {
    let listing = listing_of::<MailState>(&app, q).map_err(bad_request(&ctx))?;
    let states = listing.state.iter().filter_map(|s| s.parse().ok()).collect();
    let query = MailQuery { states, machine: listing.machine.clone(), limit: 0, ..Default::default() };
    let store = app.store();
    let (_, matching) = store.mail_page(query.clone()).await.map_err(unavailable(&ctx))?;
    let page = MailQuery { after: listing.after.clone(), limit: PER_PAGE, ..query };
    // The first page's rest is the total less the page: one count, not two.
    let (mail, left) = match page.after {
        None => {
            let mail = store.list_mail(page).await.map_err(unavailable(&ctx))?;
            let left = matching.saturating_sub(mail.len() as u64);
            (mail, left)
        }
        Some(_) => store.mail_page(page).await.map_err(unavailable(&ctx))?,
    };
    let l = ctx.lang;
    let listed = views::Listed {
        choices: vec![
            state_choice(l, MailState::ALL.iter().map(|s| s.as_str())),
            Choice {
                field: "machine",
                label: t(l, "Machine (from or to)", "マシン（送信元か宛先）"),
                options: machines(&app),
            },
        ],
        paged: paged(&mail, matching, left, |m: &Mail| m.id.clone()),
        listing,
    };
    let policy = app.runtime().mail_policy.clone();
    let body = views::mail(l, &mail, &policy, crate::clock::now(), &listed);
    Ok(ctx.page(t(l, "Mail", "メール"), body).into_response())
}

async fn mail_timeline(State(app): State<App>, ctx: Ctx, Path(id): Path<String>) -> Page {
    let Some(m) = app.store().get_mail(&id).await.map_err(unavailable(&ctx))? else {
        return Err(failure(&ctx, StatusCode::NOT_FOUND, &format!("mail {id} not found")));
    };
    let events = app.store().events_for(&format!("mail/{id}")).await.map_err(unavailable(&ctx))?;
    Ok(ctx.page(&id, views::timeline(ctx.lang, &m, events)).into_response())
}

async fn alerts(State(app): State<App>, ctx: Ctx, q: Result<Query<Listing>, QueryRejection>) -> Page {
    let listing = listing_of::<AlertState>(&app, q).map_err(bad_request(&ctx))?;
    let (all, _) = app.store().alert_page(listing.with_cursor(None), EVERY).await.map_err(unavailable(&ctx))?;
    let matching = all.len() as u64;
    let (alerts, left) = page::alerts_page(all, listing.after.as_deref(), PER_PAGE);
    let l = ctx.lang;
    let listed = views::Listed {
        choices: vec![
            state_choice(l, AlertState::ALL.iter().map(|s| s.as_str())),
            Choice { field: "machine", label: t(l, "Machine", "マシン"), options: machines(&app) },
        ],
        paged: paged(&alerts, matching, left, alert_cursor),
        listing,
    };
    Ok(ctx.page(t(l, "Alerts", "アラート"), views::alerts(l, &alerts, &listed)).into_response())
}

async fn jobs(State(app): State<App>, ctx: Ctx, q: Result<Query<Listing>, QueryRejection>) -> Page {
    let listing = listing_of::<JobState>(&app, q).map_err(bad_request(&ctx))?;
    let store = app.store();
    let counts = store.job_counts().await.map_err(unavailable(&ctx))?;
    let query = JobQuery {
        queue: listing.queue.clone(),
        state: listing.state.clone(),
        function: listing.function.clone(),
        limit: 0,
        ..Default::default()
    };
    let (_, matching) = store.job_page(query.clone()).await.map_err(unavailable(&ctx))?;
    let page = JobQuery { after: listing.after.clone(), limit: PER_PAGE, ..query };
    let (jobs, left) = store.job_page(page).await.map_err(unavailable(&ctx))?;
    let rt = app.runtime();
    let mut queues: Vec<String> = counts.iter().map(|c| c.group.clone()).collect();
    queues.extend(rt.pools.iter().flat_map(|(_, p)| p.queues.iter().cloned()));
    queues.sort();
    queues.dedup();
    let l = ctx.lang;
    let listed = views::Listed {
        choices: vec![
            Choice { field: "queue", label: t(l, "Queue", "キュー"), options: queues },
            state_choice(l, JobState::ALL.iter().map(|s| s.as_str())),
            Choice {
                field: "function",
                label: t(l, "Function", "機能"),
                options: rt.functions.iter().map(|(n, _)| n.clone()).collect(),
            },
        ],
        paged: paged(&jobs, matching, left, |j: &Job| j.id.clone()),
        listing,
    };
    Ok(ctx.page(t(l, "Jobs", "ジョブ"), views::jobs(l, &ctx.csrf, &counts, &jobs, &listed)).into_response())
}

#[derive(Deserialize)]
struct JobActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(flatten)]
    back: Listing,
}

/// A person's retry or cancel of one job (the CLI's `jobs retry|cancel`), then back to the
/// listing they were on.
async fn job_action(
    State(app): State<App>,
    ctx: Ctx,
    Path((id, action)): Path<(String, String)>,
    Form(form): Form<JobActionForm>,
) -> Page {
    if let Some(refused) = ctx.forged(&form.csrf) {
        return Err(refused);
    }
    let retry = match action.as_str() {
        "retry" => true,
        "cancel" => false,
        _ => return Err(failure(&ctx, StatusCode::NOT_FOUND, &format!("no job action {action:?}"))),
    };
    if let Err(e) = crate::jobs::admin_move(&app, &id, retry, app.leadership().now()).await {
        let status = match e.failure() {
            Failure::NotFound => StatusCode::NOT_FOUND,
            Failure::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::CONFLICT,
        };
        return Err(failure(&ctx, status, e.message()));
    }
    let back = form.back.normalized();
    Ok(Redirect::to(&views::href("/ui/jobs", &back, back.after.as_deref())).into_response())
}

#[derive(Deserialize)]
struct SearchForm {
    #[serde(default)]
    q: String,
}

/// U5: the console's search box: mail and rows holding the text, whoever's (the console is the
/// admin's).
async fn search(State(app): State<App>, ctx: Ctx, form: Result<Query<SearchForm>, QueryRejection>) -> Page {
    let form = form.map_err(|e| failure(&ctx, StatusCode::BAD_REQUEST, &e.body_text()))?.0;
    let text = form.q.trim().to_string();
    let found = if text.is_empty() {
        pcmail_store::Found::default()
    } else {
        let text =
            pcmail_core::api::search_text(&text).map_err(|e| failure(&ctx, StatusCode::BAD_REQUEST, &e.message))?;
        let search = pcmail_store::Search {
            text: text.clone(),
            machine: None,
            mail: true,
            ledger: true,
            limit: 50,
            ..Default::default()
        };
        app.store().search(search).await.map_err(unavailable(&ctx))?
    };
    Ok(ctx.page(t(ctx.lang, "Search", "検索"), views::search(ctx.lang, &text, &found)).into_response())
}

async fn specs(State(app): State<App>, ctx: Ctx) -> Page {
    let specs = app.store().list_specs().await.map_err(unavailable(&ctx))?;
    Ok(ctx.page(t(ctx.lang, "Specs", "設定"), views::specs(ctx.lang, &specs)).into_response())
}
