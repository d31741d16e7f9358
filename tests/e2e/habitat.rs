//! DESIGN §16 (K) against the real Claude Code CLI: pcmail's plugin installed as a user installs
//! it, in print-mode sessions against the Messages API stand-in (`claude.rs`), each test in a
//! network namespace of its own. Skipped, with a message, only where `claude` is not installed.

use serde_json::{Value, json};

use crate::claude::*;
use crate::harness::*;

fn state(s: &Server, token: &str, id: &str) -> Value {
    json(s.ctl(token, &["status", id, "-o", "json"]))["mail"].clone()
}

/// A PC logged in as `machine`, its cursor set by a first poll.
fn pc(s: &Server, machine: &str) -> (String, std::path::PathBuf) {
    let token = s.token(machine);
    ok(s.ctl(&token, &["login", "--server", &s.url, "--token", &token]));
    ok(s.ctl(&token, &["poll"]));
    let home = s.home_of(&token);
    (token, home)
}

fn habitat(test: impl FnOnce() + Send + 'static) {
    if present() {
        in_own_netns(test);
    }
}

#[test]
fn k2_hook_mail_reaches_the_first_and_the_next_request_and_the_stop_hook_holds_once() {
    habitat(|| {
        let s = Server::start();
        let desk = s.token("desk");
        let (laptop, home) = pc(&s, "laptop");
        let before = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "early", "--body", "sent before"]));
        ok(s.ctl(&laptop, &["poll"]));
        let model = Model::start();
        let h = Habitat::new(&home, false);
        let mut session = h.session(&model, false, &[]);
        session.say("hello");
        session.await_turn();
        let first = &model.requests()[0];
        assert_eq!(times(first, &before), 1, "H2 at session start, once: {}", shown(first));
        assert!(shown(first).contains(&format!("{TOOL_PREFIX}read")), "K5: the listing names the plugin's tools");

        // Between the turns: a work request and an urgent decision; the session's own poller
        // (the plugin's MCP server) fetches them.
        let between =
            ok(s.ctl(&desk, &["send", "--to", "laptop", "--kind", "work", "--subject", "mid", "--body", "b"]));
        let urgent = ok(s.ctl(
            &desk,
            &["send", "--to", "laptop", "--kind", "decision", "--urgent", "--subject", "ship?", "--body", "yes/no"],
        ));
        eventually(20, "the session's poller fetched both into the PC's cache", || {
            let db = rusqlite::Connection::open(home.join("cache.db")).ok()?;
            let n: i64 = db
                .query_row("SELECT count(*) FROM inbox WHERE id IN (?1, ?2)", [&between, &urgent], |r| r.get(0))
                .ok()?;
            (n == 2).then_some(())
        });
        let asked = model.requests().len();
        session.say("anything new?");
        session.await_turn();
        let requests = model.requests();
        let second = &requests[asked];
        for id in [&between, &urgent] {
            assert_eq!(times(second, id), 1, "H2 on the next prompt, once: {}", shown(second));
        }
        // H3: the hook queued a `seen`; the PC's next poll sends it.
        ok(s.ctl(&laptop, &["poll"]));
        assert_eq!(state(&s, &desk, &between)["state"], "seen");

        // H4: the stop was held once — one more request, carrying the reason — and not again.
        assert_eq!(requests.len(), asked + 2, "the stop hook held exactly once: {}", requests.len() - asked);
        let held = shown(&requests[asked + 1]);
        assert!(held.contains(&urgent), "{held}");
        for tool in ["read", "reply"] {
            assert!(held.contains(&format!("{TOOL_PREFIX}{tool}")), "K5: the reason names the plugin's {tool}: {held}");
        }
        session.say("and now?");
        session.await_turn();
        assert_eq!(model.requests().len(), asked + 3, "blocked once per decision, never again");
        session.finish();
        h.assert_hooks_clean();
    });
}

#[test]
fn k1_the_plugins_tools_are_listed_and_a_scripted_inbox_then_reply_leaves_the_mail_done() {
    habitat(|| {
        let s = Server::start();
        let desk = s.token("desk");
        let (_laptop, home) = pc(&s, "laptop");
        let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--kind", "work", "--subject", "deploy", "--body", "go"]));
        let model = Model::start();
        model.script(vec![
            tool(&format!("{TOOL_PREFIX}inbox"), json!({})),
            tool(&format!("{TOOL_PREFIX}reply"), json!({"id": id, "body": "deployed by claude"})),
            text("replied"),
        ]);
        let h = Habitat::new(&home, false);
        let mut session = h.session(&model, false, &[]);
        session.say("work through your mail");
        let result = session.await_turn();
        assert_eq!(result["subtype"], "success", "{result}");
        let requests = model.requests();
        assert_eq!(requests.len(), 3, "inbox, reply, the closing text");
        let names = tools(&requests[0]);
        for t in [
            "send",
            "inbox",
            "read",
            "reply",
            "ack",
            "fail",
            "status",
            "search",
            "intents",
            "telegram_reply",
            "telegram_react",
        ] {
            assert!(names.contains(&format!("{TOOL_PREFIX}{t}")), "K1: {t} missing from {names:?}");
        }
        let after_inbox = shown(&requests[1]);
        assert!(after_inbox.contains(&id) && after_inbox.contains("deploy"), "the inbox tool's result: {after_inbox}");
        assert!(!shown(&requests[2]).contains("rror"), "the reply tool succeeded: {}", shown(&requests[2]));
        let m = state(&s, &desk, &id);
        assert_eq!((m["state"].as_str(), m["result"].as_str()), (Some("done"), Some("deployed by claude")), "{m}");
        session.finish();
        h.assert_hooks_clean();
    });
}

/// K4 in one session: a push while idle starts a turn, one during a tool call is attached to
/// that turn's next request, and no request shows either mail twice.
fn pushed_mail_reaches_the_model_once(channels_env: Option<&'static str>) {
    habitat(move || {
        let s = Server::start();
        let desk = s.token("desk");
        let (_laptop, home) = pc(&s, "laptop");
        let model = Model::start();
        let h = Habitat::new(&home, true);
        let env: Vec<(&str, &str)> = channels_env.map(|v| ("PCMAIL_CHANNELS", v)).into_iter().collect();
        let mut session = h.session(&model, true, &env);
        session.say("hello");
        session.await_turn();
        let label = format!("PCMAIL_CHANNELS={channels_env:?}");

        // Idle: the push starts a turn.
        let asked = model.requests().len();
        let idle = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "while idle", "--body", "pushed"]));
        session.await_turn();
        let requests = model.requests();
        assert!(requests.len() > asked, "{label}: the push started no turn");
        let turn = &requests[asked];
        assert!(shown(turn).contains("<channel source=\"plugin:pcmail:pcmail\""), "{label}: {}", shown(turn));
        assert_eq!(times(turn, &idle), 1, "{label}: K4, once: {}", shown(turn));

        // During a tool call: attached to the request that carries the tool's result.
        model.script(vec![tool("Bash", json!({"command": "sleep 6", "description": "wait"})), text("done")]);
        let asked = model.requests().len();
        session.say("wait a little");
        model.await_requests(asked + 1);
        let busy = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "while busy", "--body", "pushed too"]));
        session.await_turn();
        let requests = model.requests();
        assert!(requests.len() >= asked + 2, "{label}: the tool's result went back");
        assert_eq!(times(&requests[asked + 1], &busy), 1, "{label}: mid-turn, once: {}", shown(&requests[asked + 1]));

        // The next turn: its prompt hook does not show either again.
        session.say("anything else?");
        session.await_turn();
        for (n, r) in model.requests().iter().enumerate() {
            for id in [&idle, &busy] {
                assert!(times(r, id) <= 1, "{label}: K4: request {n} shows {id} twice: {}", shown(r));
            }
        }
        let last = model.requests().last().cloned().expect("a request");
        assert_eq!((times(&last, &idle), times(&last, &busy)), (1, 1), "{label}: in the history once");
        for id in [&idle, &busy] {
            assert_ne!(state(&s, &desk, id)["state"], "done", "a push never closes a mail");
        }
        session.finish();
        h.assert_hooks_clean();
    });
}

#[test]
fn k4_a_pushed_mail_reaches_the_model_once_per_turn_with_pcmail_channels_unset() {
    pushed_mail_reaches_the_model_once(None);
}

#[test]
fn k4_a_pushed_mail_reaches_the_model_once_per_turn_with_pcmail_channels_1() {
    pushed_mail_reaches_the_model_once(Some("1"));
}

#[test]
fn k4_a_pushed_mail_reaches_the_model_once_per_turn_with_pcmail_channels_true() {
    pushed_mail_reaches_the_model_once(Some("true"));
}

#[test]
fn i8_k8_telegram_messages_before_and_during_a_session_reach_the_model_a_reply_closes_exactly_its_intent_an_edit_is_an_event()
 {
    use crate::botapi::BotApi;
    use crate::telegram::{agent, bot_pc, intents, server, state_of};
    habitat(|| {
        let api = BotApi::start();
        let (s, _dir) = server("");
        let (_desk, home) = bot_pc(&s, "desk", &api);
        // Before the session: the PC's agent records the message, then stops (the session's
        // MCP server polls the bot from then on).
        let early = api.message(-1001, "kim", "are you there?");
        let mut poller = agent(&home);
        eventually(20, "the early message recorded", || {
            (!state_of(&home, &format!("telegram--1001-{early}")).is_empty()).then_some(())
        });
        let _ = poller.kill();
        let _ = poller.wait();

        let model = Model::start();
        let h = Habitat::new(&home, true);
        let mut session = h.session(&model, true, &[]);
        session.say("hello");
        session.await_turn();
        let first = shown(&model.requests()[0]);
        assert!(
            first.contains(&format!("chat_id=-1001 reply_to={early}")) && first.contains("are you there?"),
            "I5: the session starts with the pending message: {first}"
        );

        // During the session, idle: the message is pushed and starts a turn, which answers it
        // and reacts to the early one.
        let asked = model.requests().len();
        let during = 2;
        model.script(vec![
            tool(
                &format!("{TOOL_PREFIX}telegram_reply"),
                json!({"chat_id": "-1001", "reply_to": during, "text": "on it"}),
            ),
            tool(
                &format!("{TOOL_PREFIX}telegram_react"),
                json!({"chat_id": "-1001", "message_id": early, "emoji": "👀"}),
            ),
            text("answered"),
        ]);
        assert_eq!(api.message(-1001, "kim", "deploy the fix"), during);
        session.await_turn();
        let requests = model.requests();
        assert!(requests.len() >= asked + 3, "reply, react, text: {}", requests.len() - asked);
        let pushed = shown(&requests[asked]);
        assert!(
            pushed.contains(&format!("chat_id=\"-1001\" message_id=\"{during}\"")) && pushed.contains("deploy the fix"),
            "I8: pushed with where to answer it: {pushed}"
        );
        let tag = pushed.split("<channel ").nth(1).and_then(|t| t.split('>').next()).unwrap_or_default();
        assert_eq!(tag.matches("source=").count(), 1, "one source attribute (Claude Code's): {tag}");
        assert!(tag.contains("channel=\"telegram\""), "{tag}");
        assert_eq!(state_of(&home, &format!("telegram--1001-{during}")), "done", "the reply closed its intent");
        assert_ne!(state_of(&home, &format!("telegram--1001-{early}")), "done", "a react does not close");
        let sent = api.sent();
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert_eq!(sent[0]["reply_parameters"]["message_id"].as_i64(), Some(during));
        assert_eq!(api.reactions().len(), 1);

        // K8: the early message edited — an event on its intent, pushed, never a second intent.
        let asked = model.requests().len();
        api.edit(-1001, early, "are you there? it is urgent");
        session.await_turn();
        let edited = shown(&model.requests()[asked]);
        assert!(
            edited.contains("edited=\"true\"")
                && edited.contains("are you there? it is urgent")
                && edited.contains(&format!("message_id=\"{early}\"")),
            "K8: the edit pushed as an event on its intent: {edited}"
        );
        let keys: Vec<String> = intents(&home).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys.len(), 2, "K8: never a second intent: {keys:?}");
        let db = rusqlite::Connection::open(home.join("cache.db")).expect("cache");
        let body: String = db
            .query_row("SELECT body FROM inbox WHERE external_key = ?1", [format!("telegram--1001-{early}")], |r| {
                r.get(0)
            })
            .expect("the intent");
        assert!(body.starts_with("are you there? it is urgent") && body.ends_with("are you there?"), "history: {body}");
        session.finish();
        h.assert_hooks_clean();
    });
}

/// A 1×1 PNG: a photo the session's model can be shown.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1F, 0x15, 0xC4, 0x89, 0x00, 0x00, 0x00, 0x0D, 0x49,
    0x44, 0x41, 0x54, 0x78, 0xDA, 0x63, 0xFC, 0xCF, 0xC0, 0xF0, 0x1F, 0x00, 0x05, 0x06, 0x02, 0x00, 0xA4, 0x5E, 0xC3,
    0x8C, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

/// The PC's bot logged in again with K6/K7 settings (`telegram login` flags).
fn bot_settings(home: &std::path::Path, s: &Server, api: &crate::botapi::BotApi, extra: &[&str]) {
    let file = s.dir.path().join("settings.bot");
    std::fs::write(&file, format!("{}\n", crate::botapi::TOKEN)).expect("token file");
    let file = file.display().to_string();
    let mut args = vec!["telegram", "login", "--token-file", &file, "--api", &api.url];
    args.extend_from_slice(extra);
    let out = crate::telegram::pc(home, &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn k7_a_photo_is_kept_on_the_pc_and_read_through_the_tool_a_document_over_the_bound_is_recorded_not_downloaded() {
    use crate::botapi::BotApi;
    use crate::telegram::{bot_pc, intents, server};
    habitat(|| {
        let api = BotApi::start();
        let (s, _dir) = server("");
        let (desk, home) = bot_pc(&s, "desk", &api);
        bot_settings(&home, &s, &api, &["--max-file-bytes", "1000"]);
        // A mail waiting at the start, so the session-start hook has something to say (K2).
        ok(s.ctl(&s.token("laptop"), &["send", "--to", "desk", "--subject", "early", "--body", "hi"]));
        ok(s.ctl(&desk, &["poll"]));
        let model = Model::start();
        let h = Habitat::new(&home, true);
        let mut session = h.session(&model, true, &[]);
        session.say("hello");
        session.await_turn();

        // A photo while idle: pushed with its caption and where its file is read; the scripted
        // turn reads it through the tool.
        let asked = model.requests().len();
        model.script(vec![
            tool(&format!("{TOOL_PREFIX}intents"), json!({"key": "telegram--1001-1"})),
            text("seen the photo"),
        ]);
        assert_eq!(api.photo(-1001, "kim", "the broken screen", PNG), 1);
        session.await_turn();
        let requests = model.requests();
        assert!(requests.len() >= asked + 2, "the tool call and its result: {}", requests.len() - asked);
        let pushed = shown(&requests[asked]);
        assert!(
            pushed.contains("the broken screen")
                && pushed.contains(&format!("a photo, {} bytes, kept on this PC", PNG.len()))
                && pushed.contains("the intents tool with key telegram--1001-1 reads it"),
            "K7: recorded like text, with its caption and a note: {pushed}"
        );
        let kept = home.join("telegram-files").join("-1001_1_photo.jpg");
        assert_eq!(std::fs::read(&kept).expect("the photo in the PC's cache"), PNG);
        let result = &requests[asked + 1];
        assert!(
            shown(result).contains(&kept.display().to_string()),
            "the tool's result names the file: {}",
            shown(result)
        );
        use base64::Engine;
        let data = base64::engine::general_purpose::STANDARD.encode(PNG);
        assert!(result.to_string().contains(&data), "K7: the model is shown the photo itself: {}", result["messages"]);
        assert_eq!(api.downloads(), 1, "the largest size only, once");

        // A document over the bound: recorded with a note, not downloaded.
        let asked = model.requests().len();
        assert_eq!(api.document(-1001, "kim", "dump.bin", "the log", &[7u8; 5000]), 2);
        session.await_turn();
        let pushed = shown(&model.requests()[asked]);
        assert!(
            pushed.contains("the log")
                && pushed.contains("a document dump.bin of 5000 bytes, over the 1000-byte bound: not downloaded"),
            "K7: {pushed}"
        );
        assert_eq!(api.downloads(), 1, "nothing more downloaded");
        assert!(!home.join("telegram-files").join("-1001_2_dump.bin").exists());
        assert_eq!(intents(&home).len(), 2, "both recorded as intents");
        session.finish();
        h.assert_hooks_clean();
    });
}

/// The request id of the prompt pcmail relayed to `chat` about `command`, once it is there.
fn relayed_prompt(api: &crate::botapi::BotApi, chat: i64, command: &str) -> String {
    eventually(60, &format!("a permission prompt about {command:?} in chat {chat}"), || {
        api.sent().iter().find_map(|m| {
            let text = m["text"].as_str()?;
            (m["chat_id"].as_i64() == Some(chat) && text.contains("asks to run Bash") && text.contains(command))
                .then(|| text.split("\"yes ").nth(1)?.get(..5).map(String::from))?
        })
    })
}

#[test]
fn k6_a_permission_prompt_is_relayed_to_the_owners_chat_a_yes_there_runs_the_tool_a_no_stops_it_a_foreign_answer_does_nothing()
 {
    use crate::botapi::BotApi;
    use crate::telegram::{bot_pc, intents, server};
    habitat(|| {
        let api = BotApi::start();
        let (s, _dir) = server("");
        let (desk, home) = bot_pc(&s, "desk", &api);
        let owner = 555;
        bot_settings(&home, &s, &api, &["--owner-chat", &owner.to_string(), "--permission-timeout", "120"]);
        ok(s.ctl(&s.token("laptop"), &["send", "--to", "desk", "--subject", "early", "--body", "hi"]));
        ok(s.ctl(&desk, &["poll"]));
        let model = Model::start();
        let h = Habitat::new(&home, true);
        h.seed(json!({"cachedGrowthBookFeatures": {"tengu_harbor_permissions": true}}));
        let project = h.dir.path().join("project");
        model.script(vec![
            tool("Bash", json!({"command": "echo k6 > allowed.txt", "description": "Write allowed.txt"})),
            text("written"),
        ]);
        let term = h.interactive(
            &model,
            &["--channels", "plugin:pcmail@pcmail", "--allowedTools", "mcp__plugin_pcmail_pcmail"],
        );
        term.await_screen("for shortcuts");
        // Claude Code routes a prompt to a channel only once that channel is registered; the
        // screen is ready before, and a tool call then gets the terminal's own dialog instead
        // (seen in about 1 run in 8).
        eventually(30, "pcmail's channel registered", || {
            h.debug_log()
                .lines()
                .any(|l| l.contains("\"plugin:pcmail:pcmail\": Channel notifications registered"))
                .then_some(())
        });
        term.type_line("write the file");
        let id = relayed_prompt(&api, owner, "echo k6 > allowed.txt");

        // T13: the same answer from another chat is an ordinary message (recorded), no verdict.
        let foreign = api.message(-1001, "eve", &format!("yes {id}"));
        eventually(30, "the foreign answer recorded as a message", || {
            intents(&home).iter().any(|(k, _)| *k == format!("telegram--1001-{foreign}")).then_some(())
        });
        assert!(!project.join("allowed.txt").exists(), "T13: a foreign chat's yes runs nothing");
        assert!(!api.sent().iter().any(|m| m["text"] == format!("{id}: allowed")), "{:?}", api.sent());

        // The owner's yes: the tool runs, the model gets its result.
        let asked = model.requests().len();
        api.message(owner, "kim", &format!("yes {id}"));
        eventually(60, "the allowed command ran", || project.join("allowed.txt").exists().then_some(()));
        model.await_requests(asked + 1);
        assert!(api.sent().iter().any(|m| m["chat_id"] == owner && m["text"] == format!("{id}: allowed")));
        assert!(
            !intents(&home).iter().any(|(k, _)| k.starts_with(&format!("telegram-{owner}-"))),
            "a verdict is not a message to answer: {:?}",
            intents(&home)
        );

        // The owner's no: the tool does not run, and the model is told.
        term.await_screen("written");
        model.script(vec![
            tool("Bash", json!({"command": "echo k6 > denied.txt", "description": "Write denied.txt"})),
            text("stopped"),
        ]);
        let asked = model.requests().len();
        term.type_line("write the other file");
        let id = relayed_prompt(&api, owner, "echo k6 > denied.txt");
        api.message(owner, "kim", &format!("no {id}"));
        model.await_requests(asked + 2);
        let after = &model.requests()[asked + 1];
        assert!(!project.join("denied.txt").exists(), "K6: a denial stops the tool call");
        let result = after["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .rfind(|b| b["type"] == "tool_result")
            .expect("the tool's result");
        eprintln!("k6: the denied call's result: {result}");
        assert_eq!(result["is_error"], true, "K6: the model is told the call was refused: {result}");
        assert!(result["content"].to_string().contains("Denied via channel plugin:pcmail:pcmail"), "{result}");
        assert!(api.sent().iter().any(|m| m["chat_id"] == owner && m["text"] == format!("{id}: denied")));
        let log = h.debug_log();
        for line in log.lines().filter(|l| l.contains("hannel") && !l.contains("file permissions")).take(12) {
            eprintln!("k6 debug log: {line}");
        }
        h.assert_hooks_clean();
        drop(term);
    });
}
