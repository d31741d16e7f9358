//! The web console in a real browser: Debian's headless chromium driven over WebDriver
//! (chromedriver), through login, a ledger correction with a re-run, and every page, each
//! saved as a screenshot under `target/console-screenshots/` for review; and (X6) every page
//! again on a phone's 390×844 screen, checked for sideways scroll and by axe-core.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use crate::harness::*;
use crate::ledger::{push, runs_of, setup_with};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// X6: a phone's screen in CSS px (an iPhone 12–15's).
const PHONE: (u32, u32) = (390, 844);

/// A chromedriver process and one headless chromium session, in Japanese.
struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::blocking::Client,
}

impl Browser {
    fn start() -> Browser {
        Browser::start_as(json!({"args": ["--window-size=1280,900"]}))
    }

    /// X6: a phone's screen — chromium's mobile emulation at 390×844 CSS px (so the page's
    /// viewport meta tag decides its layout width, as on a phone), in Japanese.
    fn phone() -> Browser {
        let browser = Browser::start_as(json!({"mobileEmulation": {"deviceMetrics": {
            "width": PHONE.0, "height": PHONE.1, "pixelRatio": 1.0, "touch": true, "mobile": true
        }}}));
        browser.call(reqwest::Method::POST, "/timeouts", Some(json!({"script": 120_000})));
        browser
    }

    /// One session; `options` adds its window or emulation to the chromium options.
    fn start_as(options: Value) -> Browser {
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; .ci/run installs it)");
        let base = format!("http://127.0.0.1:{port}");
        let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
        let mut args = vec![
            json!("--headless=new"),
            json!("--no-sandbox"),
            json!("--disable-gpu"),
            json!("--disable-dev-shm-usage"),
        ];
        args.extend(options["args"].as_array().cloned().unwrap_or_default());
        let mut chrome =
            json!({"binary": "/usr/bin/chromium", "args": args, "prefs": {"intl.accept_languages": "ja,en"}});
        if !options["mobileEmulation"].is_null() {
            chrome["mobileEmulation"] = options["mobileEmulation"].clone();
        }
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": chrome}}});
        let created: Value = eventually(60, "chromedriver and chromium to start", || {
            http.post(format!("{base}/session")).json(&caps).send().ok()?.json().ok()
        });
        let session =
            created["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no session: {created}")).to_string();
        Browser { driver, base, session, http }
    }

    fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut req = self.http.request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let v: Value = req.send().expect("webdriver").json().expect("json");
        assert!(v["value"]["error"].is_null(), "webdriver {path}: {v}");
        v["value"].clone()
    }

    fn go(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})));
    }

    fn find(&self, css: &str) -> String {
        let v = self.call(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css})));
        v[ELEMENT].as_str().expect("element id").to_string()
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call(reqwest::Method::POST, &format!("/element/{e}/clear"), Some(json!({})));
        self.call(reqwest::Method::POST, &format!("/element/{e}/value"), Some(json!({"text": text})));
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call(reqwest::Method::POST, &format!("/element/{e}/click"), Some(json!({})));
    }

    fn text(&self, css: &str) -> String {
        let e = self.find(css);
        self.call(reqwest::Method::GET, &format!("/element/{e}/text"), None).as_str().unwrap_or_default().to_string()
    }

    fn source(&self) -> String {
        self.call(reqwest::Method::GET, "/source", None).as_str().unwrap_or_default().to_string()
    }

    /// Waits for the page a click started to arrive: WebDriver may answer a click before the
    /// form's response has loaded on a busy machine.
    fn until(&self, what: &str, arrived: impl Fn(&Browser) -> bool) {
        eventually(30, what, || arrived(self).then_some(()));
    }

    /// Runs `js` in the page and answers what it returns.
    fn script(&self, js: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", Some(json!({"script": js, "args": []})))
    }

    /// Runs `js` in the page with a callback as its last argument and answers what it passes.
    fn script_async(&self, js: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/async", Some(json!({"script": js, "args": []})))
    }

    /// X6: where the page is wider than the screen — the layout width the viewport meta tag gave
    /// (a phone's 390 px, not a desktop's 980), the page's scroll width, and each element that
    /// sticks out of the screen (its tag, id, class and right edge) unless a box of its own scrolls.
    fn overflow(&self) -> (u64, u64, Vec<String>) {
        let v = self.script(
            "const w = window.innerWidth;
             const scrolls = e => { for (let p = e.parentElement; p; p = p.parentElement) {
               if (getComputedStyle(p).overflowX === 'auto' || getComputedStyle(p).overflowX === 'scroll') return true; } return false; };
             const out = Array.from(document.body.querySelectorAll('*'))
               .filter(e => e.getBoundingClientRect().right > w + 0.5 && !scrolls(e))
               .slice(0, 10).map(e => e.tagName + '#' + e.id + '.' + e.className + ' right=' + Math.round(e.getBoundingClientRect().right));
             return [w, document.documentElement.scrollWidth, out];",
        );
        let n = |i: usize| v[i].as_u64().unwrap_or(u64::MAX);
        let wide = v[2].as_array().into_iter().flatten().filter_map(|e| e.as_str().map(String::from)).collect();
        (n(0), n(1), wide)
    }

    /// X6: axe-core's violations of impact serious or critical on the page, one line each with
    /// its rule id, impact, help and the nodes it names (axe injected first, from `axe`).
    fn axe_violations(&self, axe: &str) -> Vec<String> {
        self.script(&format!("{axe}\n;return typeof axe;"));
        let found = self.script_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, {resultTypes: ['violations']})
               .then(r => done(r.violations.filter(v => v.impact === 'serious' || v.impact === 'critical')
                 .map(v => v.id + ' (' + v.impact + '): ' + v.help + ' — ' +
                   v.nodes.map(n => n.target.join(' ') + ' [' + (n.failureSummary || '').replace(/\\s+/g, ' ') + ']').join('; '))))
               .catch(e => done(['axe.run failed: ' + e]));",
        );
        found.as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect()
    }

    /// The text of every element `css` selects, in page order.
    fn texts(&self, css: &str) -> Vec<String> {
        let js = format!("return Array.from(document.querySelectorAll({css:?})).map(e => e.textContent);");
        self.script(&js).as_array().into_iter().flatten().filter_map(|v| v.as_str().map(String::from)).collect()
    }

    fn sign_in(&self, s: &Server) {
        self.go(&format!("{}/ui/login", s.url));
        self.type_into("#token", &s.admin_token());
        self.click("#login");
        self.until("the overview after signing in", |b| b.url().ends_with("/ui/overview"));
    }

    fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None).as_str().unwrap_or_default().to_string()
    }

    /// Saves the page as `target/console-screenshots/NAME.png`.
    fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call(reqwest::Method::GET, "/screenshot", None);
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap_or_default()).expect("png");
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, &bytes).expect("screenshot");
        // `PCMAIL_PUBLISH_SCREENSHOTS=1` also writes the ones the README shows.
        let shown = ["overview", "search", "phone-overview", "phone-ledger", "phone-jobs"];
        if std::env::var_os("PCMAIL_PUBLISH_SCREENSHOTS").is_some() && shown.contains(&name) {
            let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs");
            std::fs::create_dir_all(&docs).expect("docs");
            std::fs::write(docs.join(format!("console-{name}.png")), &bytes).expect("published screenshot");
        }
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.http.delete(format!("{}/session/{}", self.base, self.session)).send();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[test]
fn console_a_person_signs_in_corrects_a_row_reruns_it_and_sees_the_result() {
    let setup = setup_with("30m", &[]);
    let s = &setup.s;
    let hostile = "<script>alert('x')</script>見積書を送る";
    assert_eq!(push(s, "manual", hostile, "draft")["added"], 1);
    let browser = Browser::start();

    // Any page asks for the admin token first.
    browser.go(&format!("{}/ui/ledger", s.url));
    assert!(browser.url().ends_with("/ui/login"), "{}", browser.url());
    browser.screenshot("login");
    browser.type_into("#token", "not the token");
    browser.click("#login");
    browser.until("a wrong token refused, in Japanese", |b| b.source().contains("管理トークンが違います"));
    browser.type_into("#token", &s.admin_token());
    browser.click("#login");
    browser.until("the overview after signing in", |b| b.url().ends_with("/ui/overview"));
    browser.go(&format!("{}/ui/ledger", s.url));

    // The task's markup is text on the page, not markup.
    let page = browser.source();
    assert!(page.contains("台帳") && page.contains("未着手"), "Japanese labels");
    assert!(page.contains("&lt;script&gt;alert") && !page.contains("<script>alert"), "escaped");
    browser.screenshot("ledger");

    // Correct the row: an instruction, and ▶ run now.
    browser.click("a[href='/ui/ledger/office/T-0001']");
    browser.until("the row page", |b| b.url().ends_with("/ui/ledger/office/T-0001"));
    browser.type_into("#instruction", "敬語で短く");
    browser.click("#run");
    browser.click("#save");
    browser.until("the row after its run", |b| b.source().contains("done T-0001"));
    assert_eq!(browser.text("#state"), "AI実行済(要確認)");
    assert!(browser.text("#result").contains("done T-0001"), "{}", browser.text("#result"));
    assert!(browser.source().contains("敬語で短く"), "the instruction stays in its cell");
    let log = std::fs::read_to_string(&setup.log).expect("log");
    assert!(log.contains("=== T-0001 instruction=[敬語で短く]"), "the run got the instruction: {log}");
    assert_eq!(runs_of(&setup.log, "T-0001"), 1);
    browser.screenshot("row");

    // Mail, alerts, jobs and specs render for the same session.
    let desk = s.token("desk");
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "<b>bold?</b>", "--body", "b"]));
    for (name, path, expect) in [
        ("mail", "/ui/mail".to_string(), "laptop"),
        ("mail-timeline", format!("/ui/mail/{id}"), "&lt;b&gt;bold?&lt;/b&gt;"),
        ("alerts", "/ui/alerts".to_string(), "アラート"),
        ("jobs", "/ui/jobs".to_string(), "ジョブ"),
        ("specs", "/ui/specs".to_string(), "office"),
    ] {
        browser.go(&format!("{}{path}", s.url));
        browser.until(&format!("{path} to show {expect}"), |b| b.source().contains(expect));
        browser.screenshot(name);
    }
}

#[test]
fn console_a_form_post_without_the_csrf_token_is_refused_and_changes_nothing() {
    let setup = setup_with("30m", &[]);
    let s = &setup.s;
    assert_eq!(push(s, "manual", "write the estimate", "draft")["added"], 1);
    let client =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let login = client.post(format!("{}/ui/login", s.url)).form(&[("token", s.admin_token())]).send().expect("login");
    assert_eq!(login.status().as_u16(), 303);
    let cookie = login.headers().get("set-cookie").and_then(|v| v.to_str().ok()).expect("cookie").to_string();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"), "{cookie}");
    let session = cookie.split(';').next().expect("pair").to_string();
    let forged = client
        .post(format!("{}/ui/ledger/office/T-0001", s.url))
        .header("cookie", &session)
        .form(&[("state", "dropped"), ("instruction", "forged")])
        .send()
        .expect("post");
    assert_eq!(forged.status().as_u16(), 403);
    let wrong = client
        .post(format!("{}/ui/ledger/office/T-0001", s.url))
        .header("cookie", &session)
        .form(&[("csrf", "guess"), ("state", "dropped")])
        .send()
        .expect("post");
    assert_eq!(wrong.status().as_u16(), 403);
    let row = crate::ledger::row(s, "T-0001");
    assert_eq!((row["state"].as_str(), row["instruction"].as_str()), (Some("todo"), Some("")), "nothing changed");
    // Bad input to a page is a page naming the problem, never a store error.
    for (path, says) in [("/ui/search?q=a%00b", "U+0000"), ("/ui/jobs?queue=a&queue=b", "duplicate field")] {
        let r = client.get(format!("{}{path}", s.url)).header("cookie", &session).send().expect("get");
        let (status, kind) = (r.status().as_u16(), r.headers()["content-type"].to_str().unwrap_or("").to_string());
        let body = r.text().unwrap_or_default();
        assert_eq!((status, kind.starts_with("text/html")), (400, true), "{path}: {body}");
        assert!(body.contains(says) && !body.contains('\0'), "{path}: {body}");
    }
    let anonymous = client.get(format!("{}/ui/ledger", s.url)).send().expect("get");
    assert_eq!(anonymous.status().as_u16(), 303, "no session, no page");
}

#[test]
fn u_the_root_and_paths_with_a_trailing_slash_lead_to_the_console_pages() {
    let s = Server::start();
    let client =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    for (path, to) in [
        ("/", "/ui"),
        ("/ui", "/ui/overview"),
        ("/ui/", "/ui/overview"),
        ("/ui/ledger/", "/ui/ledger"),
        ("/ui/jobs/?state=dead", "/ui/jobs?state=dead"),
    ] {
        let r = client.get(format!("{}{path}", s.url)).send().expect("get");
        assert!(r.status().is_redirection(), "{path}: {}", r.status());
        assert_eq!(r.headers()["location"], to, "{path}");
    }
    // Followed to the end, each lands on the sign-in page (no JSON 404 on the way).
    let r = reqwest::blocking::get(format!("{}/ui/ledger/", s.url)).expect("get");
    assert!(r.url().path().starts_with("/ui/login"), "{}", r.url());
    assert!(r.text().expect("body").contains("<form"), "the sign-in form");
}

/// Issue 21: a store that cannot answer shows as an error page (503) that says why — never as
/// an empty list, nor as "not found" for a mail or row that may well exist.
#[test]
fn console_a_store_that_cannot_answer_shows_an_error_page_never_an_empty_list() {
    let pg = PgScratch::new();
    let s = Server::start_opts(None, "127.0.0.1:0", &["--store", pg.url.as_str()]);
    let client =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let login = client.post(format!("{}/ui/login", s.url)).form(&[("token", s.admin_token())]).send().expect("login");
    let session = login.headers().get("set-cookie").and_then(|v| v.to_str().ok()).expect("cookie").to_string();
    let session = session.split(';').next().expect("pair").to_string();
    let get = |path: &str| {
        let r = client.get(format!("{}{path}", s.url)).header("cookie", &session).send().expect("get");
        (r.status().as_u16(), r.text().unwrap_or_default())
    };
    let lists = ["/ui/ledger", "/ui/mail", "/ui/alerts", "/ui/jobs", "/ui/specs"];
    for path in lists {
        assert_eq!(get(path).0, 200, "{path} with the store answering");
    }
    assert_eq!(get("/ui/mail/m-none").0, 404, "an unknown mail while the store answers");
    drop(pg);
    for path in lists.iter().chain(&["/ui/mail/m-none", "/ui/ledger/office/T-0001"]) {
        let (status, body) = get(path);
        assert_eq!(status, 503, "{path} with the store gone: {body}");
        assert!(body.contains("class=\"error\""), "{path} says why: {body}");
        assert!(!body.contains("<table"), "{path} shows no empty list: {body}");
    }
}

/// U3/U5: the jobs page lists 50 a page, newest first, narrows by queue and state, and retries a
/// dead job with the session's CSRF token (a forged one changes nothing); a row's page that is
/// open while its run goes on shows the result when it comes, without a reload.
#[test]
fn u3_u5_console_pages_filters_and_retries_jobs_and_a_running_rows_page_updates_itself() {
    let setup = setup_with("30m", &[]);
    let s = &setup.s;
    let pool = setup._dir.path().join("parked.yaml");
    std::fs::write(
        &pool,
        "apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: parked}\nspec:\n  workers: 0\n  queues: [parked, other]\n  maxAttempts: 1\n",
    )
    .expect("pool");
    ok(s.admin(&["apply", "-f", &pool.display().to_string()]));
    let lines: String =
        (0..120).map(|n| format!("{{\"queue\": \"parked\", \"function\": \"render\", \"payload\": {n}}}\n")).collect();
    ok(s.ctl_stdin(&s.admin_token(), &["jobs", "enqueue", "-f", "-"], Some(lines.as_bytes())));
    let newest: Vec<String> = json(s.admin(&["jobs", "list", "--limit", "1000", "-o", "json"]))["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|j| j["id"].as_str().map(String::from))
        .collect();
    assert_eq!(newest.len(), 120);
    // Two jobs of the other queue die at their first failure, through the API as a worker would.
    let http = reqwest::blocking::Client::new();
    let admin = s.admin_token();
    let api = |path: &str, body: Value| -> Value {
        let r = http.post(format!("{}{path}", s.url)).bearer_auth(&admin).json(&body).send().expect("post");
        r.json().expect("json")
    };
    let mut dead = Vec::new();
    for n in 0..2 {
        let job = api("/api/v1/jobs", json!({"queue": "other", "function": "render", "payload": n}));
        let id = job["job"]["id"].as_str().expect("id").to_string();
        let claimed = api("/api/v1/jobs/claim", json!({"queue": "other", "owner": "w", "lease": "60s"}));
        let token = claimed["jobs"][0]["leaseToken"].as_str().expect("token").to_string();
        assert_eq!(api(&format!("/api/v1/jobs/{id}/fail"), json!({"token": token, "error": "no"}))["state"], "dead");
        dead.push(id);
    }

    let desk = s.token("desk");
    for subject in ["one", "two"] {
        ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", subject, "--body", "b"]));
    }
    push(s, "manual", "a row to count", "draft");

    let browser = Browser::start();
    browser.sign_in(s);
    // U2: the overview's totals are the store's counts, and its charts draw a line per series.
    let totals: BTreeMap<String, u64> = serde_json::from_value(browser.script(
        "const t = {}; document.querySelectorAll('[data-total]').forEach(e => { if (e.tagName === 'SPAN') t[e.dataset.total] = Number(e.textContent); }); return t;",
    ))
    .expect("totals");
    let all = json(s.admin(&["jobs", "list", "--all", "-o", "json"]));
    let jobs_in =
        |state: &str| all["items"].as_array().into_iter().flatten().filter(|j| j["state"] == state).count() as u64;
    for state in ["queued", "dead", "running", "succeeded"] {
        assert_eq!(totals.get(&format!("jobs:{state}")), Some(&jobs_in(state)), "jobs {state}: {totals:?}");
    }
    assert_eq!(totals.get("jobs:queued"), Some(&120));
    let rows = json(s.admin(&["ledger", "list", "-o", "json"]));
    let todo = rows["items"].as_array().into_iter().flatten().filter(|r| r["state"] == "todo").count() as u64;
    assert_eq!(totals.get("ledger:todo"), Some(&todo), "{totals:?}");
    assert_eq!(totals.get("mail:new").copied(), s.metric("pcmail_mail{state=\"new\"}").map(|n| n as u64), "{totals:?}");
    assert_eq!(totals.get("mail:new"), Some(&2));
    let lines = |chart: &str| -> Vec<(String, u64)> {
        let js = format!(
            "return Array.from(document.querySelectorAll('#{chart} polyline')).map(p => [p.dataset.series, Number(p.dataset.total)]);"
        );
        serde_json::from_value(browser.script(&js)).expect("series")
    };
    assert_eq!(lines("chart-jobs"), [("succeeded".to_string(), 0), ("dead".to_string(), 2)]);
    let mail = lines("chart-mail");
    assert_eq!(mail.len(), 4, "a line per series: {mail:?}");
    assert_eq!(mail[0], ("Sent".to_string(), 2));
    assert_eq!(lines("chart-delivery").len(), 1, "the p95 of send → delivered");
    browser.screenshot("overview");

    browser.go(&format!("{}/ui/jobs?queue=parked", s.url));
    browser.until("page 1 of the parked jobs", |b| b.texts(".job-id") == newest[..50]);
    browser.click("#page-next");
    browser.until("page 2", |b| b.url().contains(&format!("after={}", newest[49])));
    assert_eq!(browser.texts(".job-id"), newest[50..100].to_vec(), "page 2 shows the 51st to the 100th newest");
    assert!(browser.text("#page-info").contains("120 件 · 51–100"), "{}", browser.text("#page-info"));
    browser.click("#page-next");
    browser.until("page 3", |b| b.url().contains(&format!("after={}", newest[99])));
    assert_eq!(browser.texts(".job-id"), newest[100..].to_vec());
    assert!(browser.source().contains("page-first") && !browser.source().contains("page-next"), "the last page");
    browser.screenshot("jobs-page-3");

    // The filter form narrows by queue and state.
    browser.go(&format!("{}/ui/jobs", s.url));
    let pick = |select: &str, value: &str| {
        let js = format!("document.querySelector({select:?}).value = {value:?}; return true;");
        browser.script(&js);
    };
    pick("#filter-queue", "other");
    pick("#filter-state", "dead");
    browser.click("#filter-apply");
    browser.until("the filtered listing", |b| b.url().contains("queue=other") && b.url().contains("state=dead"));
    let mut shown = browser.texts(".job-id");
    shown.sort();
    let mut want = dead.clone();
    want.sort();
    assert_eq!(shown, want, "only the dead jobs of queue other");

    // A forged CSRF token retries nothing; the page's own button does.
    let client =
        reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let login = client.post(format!("{}/ui/login", s.url)).form(&[("token", admin.as_str())]).send().expect("login");
    let cookie = login.headers().get("set-cookie").and_then(|v| v.to_str().ok()).expect("cookie");
    let cookie = cookie.split(';').next().expect("pair").to_string();
    let forged = client
        .post(format!("{}/ui/jobs/{}/retry", s.url, dead[1]))
        .header("cookie", &cookie)
        .form(&[("csrf", "guess")])
        .send()
        .expect("post");
    assert_eq!(forged.status().as_u16(), 403);
    let state_of = |id: &str| {
        let list = json(s.admin(&["jobs", "list", "--queue", "other", "-o", "json"]));
        let job = list["items"].as_array().and_then(|a| a.iter().find(|j| j["id"] == id).cloned());
        job.map(|j| j["state"].as_str().unwrap_or_default().to_string()).unwrap_or_default()
    };
    assert_eq!(state_of(&dead[1]), "dead", "the forged retry changed nothing");
    browser.click(&format!("button[data-job='{}'][data-action='retry']", dead[0]));
    browser.until("back on the filtered listing", |b| b.url().contains("state=dead") && b.texts(".job-id").len() == 1);
    assert_eq!(state_of(&dead[0]), "queued", "retried from the console");
    assert_eq!(state_of(&dead[1]), "dead");
    browser.screenshot("jobs-filtered");

    // A row's page open while its run goes on: the result arrives without a reload.
    push(s, "manual", "pause, then draft", "draft");
    ok(s.admin(&["ledger", "run", "T-0002", "--no-wait"]));
    browser.go(&format!("{}/ui/ledger/office/T-0002", s.url));
    browser.until("the row running", |b| b.text("#state") == "実行中");
    browser.script("window.stillTheSamePage = true; return true;");
    browser.until("the result without a reload", |b| b.text("#state") == "AI実行済(要確認)");
    assert!(browser.text("#result").contains("done T-0002"), "{}", browser.text("#result"));
    assert_eq!(browser.script("return window.stillTheSamePage === true;"), json!(true), "the page was not reloaded");

    // U5: the search box on every page finds part of a word, in mail and rows.
    push(s, "manual", "請求書を作る", "");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "先週の請求書", "--body", "b"]));
    browser.type_into("#search-q", "請求\u{E007}");
    browser.until("the search's answer", |b| b.url().contains("/ui/search?q="));
    assert_eq!((browser.text("#found-mail"), browser.text("#found-rows")), ("1".to_string(), "1".to_string()));
    let page = browser.source();
    assert!(page.contains("先週の請求書") && page.contains("office/T-0003"), "{page}");
    browser.screenshot("search");

    // U3 on the other lists: the same filter form narrows mail and ledger rows, and the heading
    // counts what matches.
    ok(s.ctl(&s.token("builder"), &["send", "--to", "laptop", "--subject", "not the desk's", "--body", "b"]));
    browser.go(&format!("{}/ui/mail", s.url));
    assert_eq!(browser.texts(".mail-id").len(), 4);
    pick("#filter-machine", "desk");
    pick("#filter-state", "new");
    browser.click("#filter-apply");
    browser.until("the filtered mail", |b| b.url().contains("machine=desk") && b.url().contains("state=new"));
    assert_eq!(browser.texts(".mail-id").len(), 3, "the desk's new mail");
    assert_eq!(browser.text("#page-info"), "3 件 · 1–3");
    browser.go(&format!("{}/ui/ledger?state=review", s.url));
    assert_eq!(browser.texts(".row-id"), ["T-0002"], "the row waiting for review");
    assert_eq!(browser.text("#page-info"), "1 件 · 1–1");
}

/// X6: axe-core's script, installed by `scripts/test` (npm, pinned) where `PCMAIL_AXE` says or
/// under `target/axe-core/`. Missing is a failure naming the fix, never a skip.
fn axe_source() -> String {
    let path = std::env::var_os("PCMAIL_AXE").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/axe-core/node_modules/axe-core/axe.min.js")
    });
    std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "axe-core is not at {} ({e}): scripts/test installs it (npm install --prefix target/axe-core axe-core@VERSION, \
             the version pinned there), or point PCMAIL_AXE at an axe.min.js",
            path.display()
        )
    })
}

/// X6: every console page on a phone — 390 px wide through the page's viewport meta tag, no
/// horizontal scroll of the page (a wide table scrolls inside its own box), and no axe-core
/// violation of impact serious or critical — with every list holding rows, long ones among them
/// (wide content is the point).
#[test]
fn x6_every_console_page_fits_a_phone_and_has_no_serious_accessibility_violation() {
    let axe = axe_source();
    let setup = setup_with("30m", &[]);
    let s = &setup.s;
    let dir = setup._dir.path();
    std::fs::write(
        dir.join("x6.yaml"),
        "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: default}\nspec: {undeliveredAfter: 1s}\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: parked}\nspec:\n  workers: 0\n  queues: [parked]\n  maxAttempts: 1\n",
    )
    .expect("manifests");
    ok(s.admin(&["apply", "-f", &dir.join("x6.yaml").display().to_string()]));
    // Ledger rows: a long task with no spaces to break at, a run waiting for review.
    let long = "見積書を送る前に先方の担当者と金額と納期と支払条件を確認し、社内の承認を得てから送付する".repeat(3);
    push(s, "manual", &long, "draft");
    push(s, "manual", "https://example.invalid/a/very/long/link/without/any/space/to/break/at/all/of/it", "draft");
    ok(s.admin(&["ledger", "run", "T-0001"]));
    // Mail: nobody polls builder, so its mail fires an undelivered alert.
    let desk = s.token("desk");
    let mail = ok(s.ctl(&desk, &["send", "--to", "builder", "--subject", &long, "--body", &long]));
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "請求書", "--body", "請求書の件"]));
    // Jobs: queued ones, and one dead with a long error.
    let http = reqwest::blocking::Client::new();
    let admin = s.admin_token();
    let api = |path: &str, body: Value| -> Value {
        let r = http.post(format!("{}{path}", s.url)).bearer_auth(&admin).json(&body).send().expect("post");
        r.json().expect("json")
    };
    for n in 0..3 {
        api("/api/v1/jobs", json!({"queue": "parked", "function": "render", "payload": n}));
    }
    let claimed = api("/api/v1/jobs/claim", json!({"queue": "parked", "owner": "w", "lease": "60s"}));
    let token = claimed["jobs"][0]["leaseToken"].as_str().expect("token").to_string();
    let error = format!("render failed: {}", "/var/lib/pcmail/work/a-very-long-path-without-spaces".repeat(3));
    let id = claimed["jobs"][0]["id"].as_str().expect("id").to_string();
    let failed = api(&format!("/api/v1/jobs/{id}/fail"), json!({"token": token, "error": error}));
    assert_eq!(failed["state"], "dead", "{failed}");
    eventually(20, "the undelivered alert", || {
        let alerts = json(s.admin(&["alerts", "--state", "firing", "-o", "json"]));
        (!alerts["items"].as_array()?.is_empty()).then_some(())
    });

    let browser = Browser::phone();
    let mut failures = Vec::new();
    let mut check = |name: &str, path: &str, expect: &str| {
        browser.go(&format!("{}{path}", s.url));
        browser.until(&format!("{path} to show {expect}"), |b| b.source().contains(expect));
        let (width, scroll, wide) = browser.overflow();
        if width != u64::from(PHONE.0) {
            failures
                .push(format!("{path}: laid out {width} px wide, not the phone's {} (the viewport meta tag)", PHONE.0));
        }
        if scroll > width || !wide.is_empty() {
            failures.push(format!("{path}: scrolls sideways ({scroll} px in {width}); sticking out: {wide:?}"));
        }
        for v in browser.axe_violations(&axe) {
            failures.push(format!("{path}: {v}"));
        }
        browser.screenshot(&format!("phone-{name}"));
    };
    check("login", "/ui/login", "token");
    browser.sign_in(s);
    check("overview", "/ui/overview", "chart-jobs");
    check("ledger", "/ui/ledger", "T-0002");
    check("row", "/ui/ledger/office/T-0001", "done T-0001");
    check("mail", "/ui/mail", "請求書");
    check("mail-timeline", &format!("/ui/mail/{mail}"), "builder");
    check("alerts", "/ui/alerts", "undelivered");
    check("jobs", "/ui/jobs", "render failed");
    check("specs", "/ui/specs", "office");
    check("search", "/ui/search?q=請求書", "found-mail");
    check("search-empty", "/ui/search", "search-text");
    check("not-found", "/ui/nowhere", "404");
    assert!(failures.is_empty(), "X6 at {}×{}:\n{}", PHONE.0, PHONE.1, failures.join("\n"));
}
