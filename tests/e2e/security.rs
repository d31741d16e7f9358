//! C2–C4: tokens, per-machine authorization, and bad input refused before anything is stored.

use crate::harness::*;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

#[test]
fn c2_missing_or_wrong_token_is_401_and_exit_6() {
    let s = Server::start();
    let rt = rt();
    let (none, wrong) = rt.block_on(async {
        let c = s.http();
        let none = c.get(format!("{}/api/v1/mail", s.url)).send().await.expect("send");
        let wrong = c.get(format!("{}/api/v1/mail", s.url)).bearer_auth("pcm_wrong").send().await.expect("send");
        (none.status().as_u16(), wrong.status().as_u16())
    });
    assert_eq!((none, wrong), (401, 401));
    let out = s.ctl("pcm_wrong", &["inbox"]);
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    assert!(stderr(&out).contains("token not recognized"), "{}", stderr(&out));
}

#[test]
fn c2_token_is_shown_once_and_stored_hashed_reissue_revokes_the_old() {
    let s = Server::start();
    let first = s.token("laptop");
    let db = std::fs::read(s.dir.path().join("data/pcmail.db")).expect("db");
    assert!(!String::from_utf8_lossy(&db).contains(&first), "the token itself is never stored");
    let second = s.token("laptop");
    assert_eq!(code(&s.ctl(&first, &["inbox"])), 6);
    ok(s.ctl(&second, &["inbox"]));
}

#[test]
fn c3_a_machine_cannot_read_move_or_see_mail_between_two_others() {
    let s = Server::start();
    let (desk, laptop, builder) = (s.token("desk"), s.token("laptop"), s.token("builder"));
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "private", "--body", "b"]));
    for args in [
        vec!["status", id.as_str()],
        vec!["read", id.as_str()],
        vec!["ack", id.as_str()],
        vec!["fail", id.as_str(), "--reason", "x"],
        vec!["reply", id.as_str(), "--body", "x"],
    ] {
        // T16: to a third machine, the mail answers exactly as a missing one.
        let out = s.ctl(&builder, &args);
        assert_eq!(code(&out), 1, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&format!("mail {id} not found")), "{args:?}: {}", stderr(&out));
    }
    let inbox = json(s.ctl(&builder, &["inbox", "--all", "-o", "json"]));
    assert_eq!(inbox["items"].as_array().map(Vec::len), Some(0));
    // The sender sees status but cannot move the mail; admin verbs need the admin token.
    ok(s.ctl(&desk, &["status", &id]));
    assert_eq!(code(&s.ctl(&desk, &["ack", &id])), 6);
    assert_eq!(code(&s.ctl(&laptop, &["get", "roster"])), 6);
    assert_eq!(code(&s.ctl(&laptop, &["token", "issue", "desk"])), 6);
    let status = json(s.ctl(&laptop, &["status", &id, "-o", "json"]));
    assert_eq!(status["mail"]["state"], "new", "nothing moved");

    let rt = rt();
    let hidden = rt.block_on(async {
        s.http()
            .get(format!("{}/api/v1/mail/{id}", s.url))
            .bearer_auth(&builder)
            .send()
            .await
            .expect("send")
            .status()
            .as_u16()
    });
    assert_eq!(hidden, 404, "T16: as if it were not there");
    // A machine token cannot borrow another machine's identity.
    let out = s.ctl(&builder, &["--as", "laptop", "inbox"]);
    assert_eq!(code(&out), 6, "{}", stderr(&out));
}

#[test]
fn c4_bad_bodies_get_4xx_naming_the_problem_and_store_nothing() {
    let s = Server::start();
    let desk = s.token("desk");
    let rt = rt();
    let post = |body: Vec<u8>| {
        rt.block_on(async {
            let r = s
                .http()
                .post(format!("{}/api/v1/mail", s.url))
                .bearer_auth(&desk)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .expect("send");
            let status = r.status().as_u16();
            (status, r.text().await.expect("text"))
        })
    };
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("oversize request", vec![b' '; 300 * 1024], 413, "larger than"),
        (
            "oversize mail body",
            serde_json::to_vec(&serde_json::json!({"to": "laptop", "subject": "s", "body": "x".repeat(70_000)}))
                .expect("json"),
            422,
            "limit of 65536",
        ),
        ("invalid UTF-8", b"{\"to\": \"laptop\", \"subject\": \"\xff\xfe\"}".to_vec(), 400, "not valid UTF-8"),
        ("unknown field", br#"{"to": "laptop", "subject": "s", "bodee": "x"}"#.to_vec(), 400, "unknown field `bodee`"),
        ("malformed JSON", br#"{"to": "laptop""#.to_vec(), 400, "invalid JSON"),
        ("bad id", br#"{"id": "mail--XYZ", "to": "laptop", "subject": "s"}"#.to_vec(), 422, "8 to 32 lowercase hex"),
    ];
    for (what, body, status, needle) in cases {
        let (got, text) = post(body);
        assert_eq!(got, status, "{what}: {text}");
        assert!(text.contains(needle), "{what}: {text}");
    }
    let admin_view = json(s.admin(&["--as", "laptop", "inbox", "--all", "-o", "json"]));
    assert_eq!(admin_view["items"].as_array().map(Vec::len), Some(0), "nothing was stored");
}

#[test]
fn c2_non_loopback_listen_is_refused_without_the_insecure_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("serve");
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("without TLS"), "{}", stderr(&out));
}

#[test]
fn c4_health_readiness_and_the_openapi_description_answer_and_unknown_routes_are_json_404() {
    let s = Server::start();
    let rt = rt();
    let (health, ready, missing, openapi) = rt.block_on(async {
        let c = s.http();
        let h = c.get(format!("{}/healthz", s.url)).send().await.expect("healthz").status().as_u16();
        let r = c.get(format!("{}/readyz", s.url)).send().await.expect("readyz").status().as_u16();
        let m = c.get(format!("{}/api/v2/nothing", s.url)).send().await.expect("404").text().await.expect("text");
        let o: serde_json::Value =
            c.get(format!("{}/api/v1/openapi.json", s.url)).send().await.expect("openapi").json().await.expect("json");
        (h, r, m, o)
    });
    assert_eq!((health, ready), (200, 200));
    assert!(missing.contains("not_found"), "{missing}");
    assert!(openapi["paths"]["/api/v1/mail"]["post"].is_object(), "served without a token: {openapi}");
}

/// C3/C4 over every API route: no token and a wrong token get 401 before anything is read;
/// a machine token on an admin route gets 403. (`*` marks admin-only routes.)
#[test]
fn c3_c4_every_route_refuses_no_token_a_wrong_token_and_a_machine_on_admin_routes() {
    let s = Server::start();
    let machine = s.token("laptop");
    let id = "mail--00000001";
    let routes: &[(&str, &str, bool)] = &[
        ("GET", "/api/v1/whoami", false),
        ("GET", "/api/v1/alerts", true),
        ("GET", "/api/v1/specs", true),
        ("GET", "/api/v1/specs/roster/office", true),
        ("DELETE", "/api/v1/specs/function/summarize", true),
        ("POST", "/api/v1/apply", true),
        ("POST", "/api/v1/diff", true),
        ("POST", "/api/v1/tokens", true),
        ("POST", "/api/v1/mail", false),
        ("GET", "/api/v1/mail", false),
        ("GET", &format!("/api/v1/mail/{id}"), false),
        ("POST", &format!("/api/v1/mail/{id}/seen"), false),
        ("GET", "/api/v1/poll", false),
        ("POST", "/api/v1/intents", false),
        ("GET", "/api/v1/policy", false),
        ("POST", "/api/v1/jobs", false),
        ("GET", "/api/v1/jobs", false),
        ("POST", "/api/v1/jobs/claim", false),
        ("POST", "/api/v1/jobs/job-1/retry", true),
        ("GET", "/api/v1/ledger", false),
        ("GET", "/api/v1/ledger/view", false),
        ("POST", "/api/v1/ledger/push", false),
        ("POST", "/api/v1/ledger/sync", true),
        ("POST", "/api/v1/ledger/purge", true),
        ("POST", "/api/v1/ledger/execute-checked", true),
        ("POST", "/api/v1/ledger/rows/T-0001", true),
        ("POST", "/api/v1/ledger/rows/T-0001/run", true),
    ];
    let rt = rt();
    // Each request from an address of its own (127.0.0.0/8 is all loopback): T18 slows an
    // address after 5 wrong tokens, and this matrix sends one per route.
    let from = std::cell::Cell::new(1u8);
    let call = |method: &str, path: &str, token: Option<&str>, body: serde_json::Value| {
        from.set(from.get().wrapping_add(1).max(2));
        let local = std::net::IpAddr::from([127, 0, 1, from.get()]);
        rt.block_on(async {
            let c = reqwest::Client::builder().local_address(local).build().expect("client");
            let url = format!("{}{path}", s.url);
            let mut req = match method {
                "GET" => c.get(url),
                "DELETE" => c.delete(url),
                _ => c.post(url).json(&body),
            };
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            req.send().await.expect("send").status().as_u16()
        })
    };
    // Bodies that parse for each admin route, so a 403 is about who calls, not what is sent.
    let body_for = |path: &str| match path {
        "/api/v1/apply" | "/api/v1/diff" => serde_json::json!({"files": []}),
        "/api/v1/tokens" => serde_json::json!({"machine": "desk"}),
        "/api/v1/ledger/purge" => serde_json::json!({"source": "x"}),
        "/api/v1/jobs/job-1/retry" => serde_json::json!({}),
        _ => serde_json::json!({}),
    };
    for (method, path, admin_only) in routes {
        // A malformed body must not be parsed before the token is checked.
        assert_eq!(
            call(method, path, None, serde_json::json!({"bogus": true})),
            401,
            "{method} {path} without a token"
        );
        assert_eq!(
            call(method, path, Some("pcm_wrong"), serde_json::json!({"bogus": true})),
            401,
            "{method} {path} with a wrong token"
        );
        if *admin_only {
            assert_eq!(call(method, path, Some(&machine), body_for(path)), 403, "{method} {path} with a machine token");
        }
    }
}
