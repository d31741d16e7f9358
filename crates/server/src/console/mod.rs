//! The web console under `/ui`: server-rendered pages for the people who supervise — the ledger
//! (review and correct rows, tick ▶ run), mail per machine with each mail's timeline, alerts,
//! job queues and every spec object's status. Forms work without JavaScript. Behind the admin
//! token through a login form; an HttpOnly SameSite=Strict session cookie; a CSRF token in
//! every form. Every value shown goes through `html::esc`.

mod html;
mod session;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use pcmail_core::ids::sha256_hex;
use pcmail_core::ledger::{RowState, Trigger, is_overdue};
use pcmail_store::{MailQuery, Store};
use serde::Deserialize;

use crate::app::App;
use html::{Lang, esc, lang, page, seg, t, table};
pub use session::Sessions;

pub fn routes(sessions: Arc<Sessions>) -> Router<App> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(|| async { Redirect::to("/ui/ledger") }))
        .route("/ui/", get(|| async { Redirect::to("/ui/ledger") }))
        .route("/ui/style.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], html::CSS) }))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/ledger", get(ledger))
        .route("/ui/ledger/{project}/{id}", get(row_page).post(row_edit))
        .route("/ui/mail", get(mail))
        .route("/ui/mail/{id}", get(mail_timeline))
        .route("/ui/alerts", get(alerts))
        .route("/ui/jobs", get(jobs))
        .route("/ui/specs", get(specs))
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

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &App) -> Result<Ctx, Response> {
        let sessions = parts.extensions.get::<Arc<Sessions>>();
        let csrf = session::cookie(&parts.headers).and_then(|id| sessions?.csrf(&id));
        match csrf {
            Some(csrf) => Ok(Ctx { lang: language(&parts.headers), csrf }),
            None => Err(Redirect::to("/ui/login").into_response()),
        }
    }
}

impl Ctx {
    /// A posted form's CSRF token must be the session's: otherwise a 403 to answer, and
    /// nothing changes.
    fn forged(&self, posted: &str) -> Option<Response> {
        if !posted.is_empty() && crate::auth::constant_time_eq(posted, &self.csrf) {
            return None;
        }
        let body = format!(
            "<p class=\"error\">{}</p>",
            t(
                self.lang,
                "This form was not sent from this console (its CSRF token is missing or wrong); nothing was changed.",
                "このフォームはコンソールから送られていません（CSRF トークンがないか不正です）。何も変更していません。"
            )
        );
        Some((StatusCode::FORBIDDEN, Html(page(self.lang, "403", Some(&self.csrf), &body))).into_response())
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
    let body = format!("<p class=\"error\">{}</p>", esc(message));
    (status, Html(page(ctx.lang, t(ctx.lang, "Error", "エラー"), Some(&ctx.csrf), &body))).into_response()
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
    let body = format!("<p class=\"error\">{}</p>", t(lang, "No such page.", "そのページはありません。"));
    (StatusCode::NOT_FOUND, Html(page(lang, "404", None, &body))).into_response()
}

async fn login_form(headers: HeaderMap) -> Html<String> {
    Html(login_page(language(&headers), None))
}

fn login_page(lang: Lang, error: Option<&str>) -> String {
    let error = error.map(|e| format!("<p class=\"error\">{}</p>", esc(e))).unwrap_or_default();
    let body = format!(
        "{error}<form method=\"post\" action=\"/ui/login\"><label>{} <input type=\"password\" name=\"token\" id=\"token\" \
         autocomplete=\"current-password\"></label><button id=\"login\">{}</button></form>",
        t(lang, "Admin token (the contents of admin.token)", "管理トークン（admin.token の中身）"),
        t(lang, "Sign in", "ログイン"),
    );
    page(lang, t(lang, "Sign in", "ログイン"), None, &body)
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
    if let Err(wait) = sessions.sign_in_attempt(&client, crate::clock::now()) {
        tracing::warn!(%client, "console sign-in refused: too many failed sign-ins from this address");
        let message = match lang {
            Lang::Ja => format!("サインインの失敗が多すぎます。{wait} 秒後にもう一度どうぞ。"),
            Lang::En => format!("Too many failed sign-ins from this address; try again in {wait} s."),
        };
        let body = login_page(lang, Some(&message));
        return (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, wait.to_string())], Html(body)).into_response();
    }
    if !crate::auth::constant_time_eq(&sha256_hex(form.token.trim()), app.admin_token_hash()) {
        sessions.sign_in_failed(&client);
        tracing::warn!(%client, "console sign-in failed: not the admin token");
        let message = t(lang, "That is not the admin token.", "管理トークンが違います。");
        return (StatusCode::UNAUTHORIZED, Html(login_page(lang, Some(message)))).into_response();
    }
    sessions.sign_in_succeeded(&client);
    let id = match sessions.create() {
        Ok(id) => id,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    };
    ([(header::SET_COOKIE, session::set_cookie(&id))], Redirect::to("/ui/ledger")).into_response()
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

fn state_label(lang: Lang, s: RowState) -> &'static str {
    match lang {
        Lang::Ja => s.ja(),
        Lang::En => s.as_str(),
    }
}

async fn ledger(State(app): State<App>, ctx: Ctx) -> Page {
    let rows = app.store().ledger_rows(None).await.map_err(unavailable(&ctx))?;
    let today = crate::clock::now().format("%Y-%m-%d").to_string();
    let l = ctx.lang;
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let (review, overdue) = (r.state == RowState::Review, is_overdue(r, &today));
            vec![
                esc(&r.project),
                format!("<a href=\"/ui/ledger/{}/{}\">{}</a>", seg(&r.project), seg(&r.id), esc(&r.id)),
                format!(
                    "<span class=\"{}\">{}</span>",
                    if review { "review" } else { "" },
                    esc(state_label(l, r.state))
                ),
                esc(&r.task),
                format!("<span class=\"{}\">{}</span>", if overdue { "overdue" } else { "" }, esc(&r.due)),
                r.failures.to_string(),
                if r.run_requested { "▶".into() } else { String::new() },
            ]
        })
        .collect();
    let headers_row = [
        t(l, "Project", "案件"),
        t(l, "Task ID", "タスクID"),
        t(l, "State", "状態"),
        t(l, "Task", "タスク"),
        t(l, "Due", "期限"),
        t(l, "Failures", "失敗回数"),
        t(l, "▶Run", "▶AI実行"),
    ];
    let review = rows.iter().filter(|r| r.state == RowState::Review).count();
    let overdue = rows.iter().filter(|r| is_overdue(r, &today)).count();
    let summary = format!(
        "<p id=\"summary\">{}: {review} · {}: {overdue}</p>",
        t(l, "Waiting for review", "要確認"),
        t(l, "Overdue", "期限超過")
    );
    Ok(Html(page(l, t(l, "Ledger", "台帳"), Some(&ctx.csrf), &(summary + &table(&headers_row, &cells))))
        .into_response())
}

async fn row_page(State(app): State<App>, ctx: Ctx, Path((project, id)): Path<(String, String)>) -> Page {
    render_row(&app, &ctx, &project, &id, None).await
}

async fn render_row(app: &App, ctx: &Ctx, project: &str, id: &str, error: Option<&str>) -> Page {
    let l = ctx.lang;
    let rows = app.store().ledger_rows(Some(project)).await.map_err(unavailable(ctx))?;
    let Some(row) = rows.into_iter().find(|r| r.id == id) else {
        return Err(failure(ctx, StatusCode::NOT_FOUND, &format!("{project}/{id} not found")));
    };
    let history = app.store().events_for(&format!("ledger/{project}/{id}")).await.map_err(unavailable(ctx))?;
    let fields: Vec<Vec<String>> = [
        (t(l, "State", "状態"), format!("<span id=\"state\">{}</span>", esc(state_label(l, row.state)))),
        (t(l, "Task", "タスク"), esc(&row.task)),
        (t(l, "Content", "内容"), format!("<pre>{}</pre>", esc(&row.content))),
        (t(l, "Source", "発生源"), esc(&row.source)),
        (t(l, "Evidence", "根拠"), esc(&row.evidence)),
        (t(l, "Due", "期限"), esc(&row.due)),
        (t(l, "AI function", "AI機能"), esc(&row.function)),
        (t(l, "Result", "実行結果"), format!("<pre id=\"result\">{}</pre>", esc(&row.result))),
        (t(l, "Executed at", "実行日時"), row.executed_at.map(|t| esc(&t.to_rfc3339())).unwrap_or_default()),
        (t(l, "Failures", "失敗回数"), row.failures.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| vec![esc(k), v])
    .collect();
    let options: String = RowState::ALL
        .iter()
        .filter(|s| **s != RowState::Running)
        .map(|s| {
            let selected = if *s == row.state { " selected" } else { "" };
            format!("<option value=\"{}\"{selected}>{}</option>", s.as_str(), esc(state_label(l, *s)))
        })
        .collect();
    let form = format!(
        "<form method=\"post\" action=\"/ui/ledger/{}/{}\" id=\"edit\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <label>{} <select name=\"state\" id=\"state-input\">{options}</select></label>\
         <label>{}<textarea name=\"instruction\" id=\"instruction\">{}</textarea></label>\
         <label><input type=\"checkbox\" name=\"run\" id=\"run\" value=\"on\"> {}</label>\
         <button id=\"save\">{}</button></form>",
        seg(project),
        seg(id),
        esc(&ctx.csrf),
        t(l, "State", "状態"),
        t(l, "Correction instruction (goes to this row's next run)", "修正指示（この行の次の実行に渡ります）"),
        esc(&row.instruction),
        t(l, "▶ Run now (waits for the result)", "▶ いま実行する（結果を待ちます）"),
        t(l, "Save", "保存"),
    );
    let events: Vec<Vec<String>> = history
        .iter()
        .rev()
        .map(|e| vec![esc(&e.at.to_rfc3339()), esc(&e.reason), esc(&e.message), esc(&e.actor)])
        .collect();
    let history =
        table(&[t(l, "At", "日時"), t(l, "Reason", "理由"), t(l, "Message", "内容"), t(l, "By", "操作者")], &events);
    let error = error.map(|e| format!("<p class=\"error\" id=\"error\">{}</p>", esc(e))).unwrap_or_default();
    let body = format!(
        "{error}{}{form}<h2>{}</h2>{history}",
        table(&[t(l, "Field", "項目"), t(l, "Value", "値")], &fields),
        t(l, "History", "履歴")
    );
    let status = if error.is_empty() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    Ok((status, Html(page(l, &format!("{project} / {id}"), Some(&ctx.csrf), &body))).into_response())
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

async fn mail(State(app): State<App>, ctx: Ctx) -> Page {
    let l = ctx.lang;
    let all = app.store().list_mail(MailQuery { limit: 500, ..Default::default() }).await.map_err(unavailable(&ctx))?;
    let policy = app.runtime().mail_policy.clone();
    let now = crate::clock::now();
    let mut by_machine: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in &all {
        let late = pcmail_core::alert::is_unread_past_sla(m, &policy, now);
        let row = format!(
            "<tr><td><a href=\"/ui/mail/{}\">{}</a></td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td></tr>",
            seg(&m.id),
            esc(&m.id),
            esc(&m.from),
            if late { "overdue" } else { "" },
            esc(m.state.as_str()),
            esc(&m.subject),
            esc(&m.created_at.to_rfc3339()),
        );
        by_machine.entry(m.to.clone()).or_default().push(row);
    }
    let body: String = by_machine
        .iter()
        .map(|(machine, rows)| {
            format!(
                "<h2>{}</h2><table><thead><tr><th>id</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
                esc(machine),
                t(l, "From", "送信元"),
                t(l, "State (red: unread past SLA)", "状態（赤: 未読 SLA 超過）"),
                t(l, "Subject", "件名"),
                t(l, "Sent", "送信日時"),
                rows.concat()
            )
        })
        .collect();
    Ok(Html(page(l, t(l, "Mail", "メール"), Some(&ctx.csrf), &body)).into_response())
}

async fn mail_timeline(State(app): State<App>, ctx: Ctx, Path(id): Path<String>) -> Page {
    let l = ctx.lang;
    let Some(m) = app.store().get_mail(&id).await.map_err(unavailable(&ctx))? else {
        return Err(failure(&ctx, StatusCode::NOT_FOUND, &format!("mail {id} not found")));
    };
    let events = app.store().events_for(&format!("mail/{id}")).await.map_err(unavailable(&ctx))?;
    let stamps: Vec<Vec<String>> = [
        ("created", Some(m.created_at)),
        ("delivered", m.delivered_at),
        ("seen", m.seen_at),
        ("done", m.done_at),
        ("expires", Some(m.expires_at)),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some(vec![esc(k), esc(&v?.to_rfc3339())]))
    .collect();
    let rows: Vec<Vec<String>> =
        events.iter().map(|e| vec![esc(&e.at.to_rfc3339()), esc(&e.reason), esc(&e.message), esc(&e.actor)]).collect();
    let body = format!(
        "<p>{} → {} · <b>{}</b></p><h2>{}</h2><pre>{}</pre>{}<h2>{}</h2>{}",
        esc(&m.from),
        esc(&m.to),
        esc(m.state.as_str()),
        esc(&m.subject),
        esc(&m.body),
        table(&[t(l, "Stamp", "時刻"), ""], &stamps),
        t(l, "Timeline", "経過"),
        table(&[t(l, "At", "日時"), t(l, "Reason", "理由"), t(l, "Message", "内容"), t(l, "By", "操作者")], &rows)
    );
    Ok(Html(page(l, &id, Some(&ctx.csrf), &body)).into_response())
}

async fn alerts(State(app): State<App>, ctx: Ctx) -> Page {
    let l = ctx.lang;
    let alerts = app.store().list_alerts(200).await.map_err(unavailable(&ctx))?;
    let rows: Vec<Vec<String>> = alerts
        .iter()
        .map(|a| {
            vec![
                esc(a.kind.as_str()),
                esc(&a.subject),
                esc(a.state.as_str()),
                esc(&a.summary),
                esc(a.notified.map(|n| n.as_str()).unwrap_or("")),
                esc(&a.updated_at.to_rfc3339()),
            ]
        })
        .collect();
    let headers_row = [
        t(l, "Kind", "種類"),
        t(l, "Subject", "対象"),
        t(l, "State", "状態"),
        t(l, "Summary", "概要"),
        t(l, "Notified", "通知済み"),
        t(l, "Changed", "更新"),
    ];
    Ok(Html(page(l, t(l, "Alerts", "アラート"), Some(&ctx.csrf), &table(&headers_row, &rows))).into_response())
}

async fn jobs(State(app): State<App>, ctx: Ctx) -> Page {
    let l = ctx.lang;
    let counts = app.store().job_counts().await.map_err(unavailable(&ctx))?;
    let rows: Vec<Vec<String>> = counts.iter().map(|(q, s, n)| vec![esc(q), esc(s), n.to_string()]).collect();
    let recent = app
        .store()
        .list_jobs(pcmail_store::JobQuery { limit: 50, ..Default::default() })
        .await
        .map_err(unavailable(&ctx))?;
    let recent: Vec<Vec<String>> = recent
        .iter()
        .map(|j| {
            vec![
                esc(&j.id),
                esc(&j.queue),
                esc(&j.function),
                esc(j.state.as_str()),
                j.attempts.to_string(),
                esc(j.last_error.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    let body = format!(
        "{}<h2>{}</h2>{}",
        table(&[t(l, "Queue", "キュー"), t(l, "State", "状態"), t(l, "Jobs", "件数")], &rows),
        t(l, "Latest jobs", "最近のジョブ"),
        table(
            &[
                "id",
                t(l, "Queue", "キュー"),
                t(l, "Function", "機能"),
                t(l, "State", "状態"),
                t(l, "Attempts", "試行"),
                t(l, "Last error", "直近のエラー")
            ],
            &recent
        )
    );
    Ok(Html(page(l, t(l, "Jobs", "ジョブ"), Some(&ctx.csrf), &body)).into_response())
}

async fn specs(State(app): State<App>, ctx: Ctx) -> Page {
    let l = ctx.lang;
    let specs = app.store().list_specs().await.map_err(unavailable(&ctx))?;
    let rows: Vec<Vec<String>> = specs
        .iter()
        .map(|s| {
            let conditions: String = s
                .status
                .conditions
                .iter()
                .map(|c| format!("{}={} ({}) {}", esc(&c.type_), esc(&c.status), esc(&c.reason), esc(&c.message)))
                .collect::<Vec<_>>()
                .join("<br>");
            vec![esc(s.kind.as_str()), esc(&s.name), s.generation.to_string(), conditions]
        })
        .collect();
    let headers_row =
        [t(l, "Kind", "種類"), t(l, "Name", "名前"), t(l, "Generation", "世代"), t(l, "Conditions", "状態")];
    Ok(Html(page(l, t(l, "Specs", "設定"), Some(&ctx.csrf), &table(&headers_row, &rows))).into_response())
}
