//! V2: a recorded corpus of client requests — every verb of `pcmail-ctl` that calls the server,
//! as one release's client sent them — replayed against today's server, which must answer each
//! with something that client can parse.
//!
//! `tests/corpus/RELEASE/NN-verb.json` holds one verb's exchanges: method, path, query, the
//! headers that matter (`User-Agent`, `Authorization`, `X-Pcmail-As`, `Content-Type`), the body,
//! and the answer its own release's server gave (status, body, whether `x-pcmail-more` came).
//! Secrets, ids and paths are normalised to placeholders (`{{pcm_#2}}`, `{{mail--#1}}`,
//! `{{repo}}`): on replay, a placeholder is bound from the answer where the recording first met
//! it, or made up fresh where the client made it up. An answer passes when its status class is the recorded one,
//! its `Server` release is one the recorded client serves (V2), and its JSON keeps the recorded
//! answer's shape (tests/e2e/golden.rs: a lost or retyped field fails, a new one passes).
//!
//! `PCMAIL_UPDATE_GOLDEN=1` records again: this build's client against this build's server, and
//! the previous release's client against its own server (tests/e2e/previous.rs), through a small
//! recording proxy between `pcmail-ctl` and `serve`.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::golden::{lost, shape};
use crate::harness::*;

/// The request headers a client's answer depends on.
const HEADERS: [&str; 4] = ["user-agent", "authorization", "x-pcmail-as", "content-type"];
/// What a secret or an id starts with; what follows is `[A-Za-z0-9_-]`, 6 or more, a digit in it.
const IDS: [&str; 3] = ["pcm_", "mail--", "job-"];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Exchange {
    method: String,
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    query: Option<String>,
    headers: BTreeMap<String, String>,
    body: Value,
    status: u16,
    /// Whether the answer carried `x-pcmail-more` (the client reads it, U3).
    more: bool,
    answer: Value,
}

#[derive(Debug, Serialize, Deserialize)]
struct Step {
    /// Who ran the verb (`admin`, or a machine's label) and its arguments, normalised.
    by: String,
    verb: Vec<String>,
    exchanges: Vec<Exchange>,
}

/// A body as the corpus keeps it: JSON, or `{"$text": …}`, or null when empty.
fn body_value(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes).unwrap_or_else(|_| json!({"$text": String::from_utf8_lossy(bytes)}))
}

/// A recording proxy: every request to `url` goes on to `upstream`, and the exchange is kept.
struct Recorder {
    url: String,
    seen: Arc<Mutex<Vec<Exchange>>>,
}

impl Recorder {
    fn start(upstream: &str) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (upstream, kept) = (upstream.to_string(), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (upstream, kept) = (upstream.clone(), kept.clone());
                std::thread::spawn(move || relay(stream, &upstream, &kept));
            }
        });
        Recorder { url, seen }
    }

    fn take(&self) -> Vec<Exchange> {
        std::mem::take(&mut *self.seen.lock().expect("recorder"))
    }
}

/// One connection's requests, each sent on to `upstream` and its answer sent back as it came.
fn relay(stream: TcpStream, upstream: &str, kept: &Mutex<Vec<Exchange>>) {
    let http = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(None)
        .build()
        .expect("client");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or_default().to_string(), parts.next().unwrap_or_default());
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p.to_string(), Some(q.to_string())),
            None => (target.to_string(), None),
        };
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).expect("a header");
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        assert!(header("transfer-encoding").is_none(), "the recorder reads bodies of a content-length only");
        let len = header("content-length").and_then(|l| l.parse().ok()).unwrap_or(0usize);
        let mut body = vec![0; len];
        reader.read_exact(&mut body).expect("the body");

        let url = format!("{upstream}{target}");
        let mut req = http.request(method.parse().expect("a method"), url).body(body.clone());
        for (k, v) in headers.iter().filter(|(k, _)| !matches!(k.as_str(), "host" | "content-length" | "connection")) {
            req = req.header(k, v);
        }
        let answer = req.send().expect("the server answers");
        let status = answer.status();
        let answer_headers = answer.headers().clone();
        let bytes = answer.bytes().expect("the answer's body");
        let mut head = format!("HTTP/1.1 {} {}\r\n", status.as_u16(), status.canonical_reason().unwrap_or(""));
        for (k, v) in &answer_headers {
            if !matches!(k.as_str(), "content-length" | "transfer-encoding" | "connection") {
                head.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap_or_default()));
            }
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", bytes.len()));
        // Kept before it is answered: the verb's exchanges are all kept when it exits.
        kept.lock().expect("recorder").push(Exchange {
            method,
            path,
            query,
            headers: headers.into_iter().filter(|(k, _)| HEADERS.contains(&k.as_str())).collect(),
            body: body_value(&body),
            status: status.as_u16(),
            more: answer_headers.contains_key(pcmail_core::page::MORE_HEADER),
            answer: body_value(&bytes),
        });
        if writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(&bytes)).is_err() {
            return;
        }
    }
}

/// Every secret or id in `text`.
fn ids_in(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for prefix in IDS {
        for (at, _) in text.match_indices(prefix) {
            let rest = &text[at + prefix.len()..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).unwrap_or(rest.len());
            let tail = &rest[..end];
            if tail.len() >= 6 && tail.contains(|c: char| c.is_ascii_digit()) {
                found.push(format!("{prefix}{tail}"));
            }
        }
    }
    found
}

/// The placeholders a recording gave each secret and id, in the order it met them.
#[derive(Default)]
struct Names {
    of: HashMap<String, String>,
    counts: HashMap<&'static str, usize>,
}

impl Names {
    fn learn(&mut self, text: &str) {
        self.learn_ids(ids_in(text));
    }

    /// The value of every `token` and `…Token` field (a job's lease token) is a secret too, and
    /// `store` (the store's identity a poll names) an id.
    fn learn_tokens(&mut self, v: &Value) {
        match v {
            Value::Object(map) => map.iter().for_each(|(k, v)| match v {
                Value::String(t) if (k == "token" || k == "store" || k.ends_with("Token")) && t.len() >= 8 => {
                    self.learn_ids(vec![t.clone()])
                }
                v => self.learn_tokens(v),
            }),
            Value::Array(items) => items.iter().for_each(|v| self.learn_tokens(v)),
            _ => {}
        }
    }

    fn learn_ids(&mut self, ids: Vec<String>) {
        for id in ids {
            if self.of.contains_key(&id) {
                continue;
            }
            let prefix = IDS.iter().copied().find(|p| id.starts_with(p)).unwrap_or("secret");
            let n = self.counts.entry(prefix).or_default();
            *n += 1;
            self.of.insert(id, format!("{{{{{prefix}#{n}}}}}"));
        }
    }

    /// `text` with every known secret and id replaced, the longest first.
    fn normalise(&self, text: &str) -> String {
        let mut known: Vec<(&String, &String)> = self.of.iter().collect();
        known.sort_by_key(|(k, _)| std::cmp::Reverse(k.len()));
        known.into_iter().fold(text.to_string(), |t, (k, v)| t.replace(k.as_str(), v))
    }

    fn value(&self, v: &Value) -> Value {
        let text = self.normalise(&v.to_string());
        serde_json::from_str(&text).expect("still JSON")
    }

    /// One exchange: first every id it holds is named, then each part is written with the names.
    fn exchange(&mut self, x: Exchange) -> Exchange {
        self.learn_tokens(&x.answer);
        self.learn_tokens(&x.body);
        self.learn(&serde_json::to_string(&x).expect("json"));
        Exchange {
            path: self.normalise(&x.path),
            query: x.query.as_deref().map(|q| self.normalise(q)),
            headers: x.headers.iter().map(|(k, v)| (k.clone(), self.normalise(v))).collect(),
            body: self.value(&x.body),
            answer: self.value(&x.answer),
            ..x
        }
    }
}

/// The steps every release's corpus records: each verb that calls the server, run by whom.
fn script(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let examples = examples().display().to_string();
    let extra = dir.join("extra.yaml");
    std::fs::write(
        &extra,
        "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: corpus}\nspec: {command: [\"true\"], mode: generate}\n\
         ---\napiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: corpus}\n\
         spec: {workers: 0, queues: [corpus], externalWorkers: [laptop]}\n",
    )
    .expect("extra manifest");
    let extra = extra.display().to_string();
    let s = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
    vec![
        ("admin", s(&["version"])),
        ("admin", s(&["apply", "-f", &examples])),
        ("admin", s(&["diff", "-f", &examples])),
        ("admin", s(&["token", "issue", "desk"])),
        ("admin", s(&["token", "issue", "laptop"])),
        ("admin", s(&["apply", "-f", &extra])),
        ("admin", s(&["get", "roster"])),
        ("admin", s(&["get", "roster", "-o", "wide"])),
        ("admin", s(&["get", "function", "corpus", "-o", "json"])),
        ("admin", s(&["describe", "function", "corpus"])),
        ("desk", s(&["send", "--to", "laptop", "--subject", "one", "--body", "the first"])),
        ("desk", s(&["send", "--to", "laptop", "--subject", "two", "--body", "the second"])),
        ("desk", s(&["send", "--to", "laptop", "--subject", "three", "--body", "the third"])),
        ("laptop", s(&["poll"])),
        ("laptop", s(&["inbox", "-o", "json"])),
        ("laptop", s(&["read", "@1"])),
        ("laptop", s(&["reply", "@1", "--body", "done"])),
        ("laptop", s(&["ack", "@2"])),
        ("laptop", s(&["fail", "@3", "--reason", "cannot"])),
        ("laptop", s(&["poll"])),
        ("desk", s(&["status", "@1"])),
        ("desk", s(&["search", "first"])),
        ("desk", s(&["intent", "record", "--chat", "-100123", "--message", "7", "--from", "kim", "--text", "hi"])),
        ("desk", s(&["telegram", "status"])),
        ("admin", s(&["alerts", "-o", "json"])),
        ("admin", s(&["ledger", "push", "--source", "manual", "--task", "write it", "--function", "corpus"])),
        ("admin", s(&["ledger", "list", "-o", "json"])),
        ("admin", s(&["ledger", "view"])),
        ("admin", s(&["ledger", "set-row", "@row", "--instruction", "carefully"])),
        ("admin", s(&["ledger", "run", "@row", "--no-wait"])),
        ("admin", s(&["ledger", "sync"])),
        ("admin", s(&["ledger", "purge-source", "manual"])),
        ("admin", s(&["ledger", "execute-checked"])),
        ("admin", s(&["jobs", "enqueue", "--queue", "corpus", "--function", "corpus", "--run-after", "1d"])),
        ("admin", s(&["jobs", "list", "-o", "json"])),
        ("admin", s(&["jobs", "cancel", "@job"])),
        ("admin", s(&["jobs", "retry", "@job"])),
        ("admin", s(&["worker", "--queue", "corpus", "--once"])),
        ("admin", s(&["delete", "function", "corpus"])),
    ]
}

/// Runs the script with `bin` as the client against `s` through a recorder; each step's
/// exchanges, normalised. `@1`…`@3` are the mail `send` printed, `@row` the ledger's first
/// row, `@job` the job `enqueue` printed.
fn record(s: &Server, bin: &Path) -> Vec<Step> {
    let recorder = Recorder::start(&s.url);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut names = Names::default();
    names.of.insert(s.admin_token(), "{{admin}}".into());
    // Where the manifests were read from: the replaying machine's checkout and a dir of its own.
    names.of.insert(env!("CARGO_MANIFEST_DIR").into(), "{{repo}}".into());
    names.of.insert(dir.path().display().to_string(), "{{dir}}".into());
    let mut tokens: HashMap<&str, String> = HashMap::from([("admin", s.admin_token())]);
    let (mut mail, mut row, mut job) = (Vec::<String>::new(), String::new(), String::new());
    let mut steps = Vec::new();
    for (by, verb) in script(dir.path()) {
        let args: Vec<String> = verb
            .iter()
            .map(|w| match w.as_str() {
                "@row" => row.clone(),
                "@job" => job.clone(),
                w if w.starts_with('@') => mail[w[1..].parse::<usize>().expect("@N") - 1].clone(),
                w => w.to_string(),
            })
            .collect();
        let token = tokens.get(by).unwrap_or_else(|| panic!("{by}'s token before its first verb")).clone();
        let out = s.ctl_via(bin, &recorder.url, &token, &args.iter().map(String::as_str).collect::<Vec<_>>(), None);
        let printed = ok(out);
        match verb[..] {
            [ref t, _, ref m] if t == "token" => {
                tokens.insert(if m == "desk" { "desk" } else { "laptop" }, printed.clone());
            }
            [ref v, ..] if v == "send" => mail.push(printed.clone()),
            [ref j, ref e, ..] if j == "jobs" && e == "enqueue" => job = printed.clone(),
            [ref l, ref p, ..] if l == "ledger" && p == "push" => {
                let list = json(s.admin(&["ledger", "list", "-o", "json"]));
                row = list["items"][0]["id"].as_str().unwrap_or_else(|| panic!("a row: {list}")).to_string();
            }
            _ => {}
        }
        let exchanges: Vec<Exchange> = recorder.take().into_iter().map(|x| names.exchange(x)).collect();
        let verb = args.iter().map(|a| names.normalise(a)).collect();
        steps.push(Step { by: by.into(), verb, exchanges });
    }
    steps
}

fn write(release: &str, steps: &[Step]) {
    let dir = corpus_dir().join(release);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("corpus dir");
    for (n, step) in steps.iter().enumerate() {
        let words: Vec<&str> =
            step.verb.iter().take(2).filter(|w| !w.starts_with(['-', '{'])).map(|w| w.as_str()).collect();
        let name = format!("{:02}-{}.json", n + 1, words.join("-"));
        let text = serde_json::to_string_pretty(step).expect("json") + "\n";
        std::fs::write(dir.join(name), text).expect("write a corpus file");
    }
}

fn read(release: &Path) -> Vec<Step> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(release)
        .expect("a corpus release")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).expect("read");
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        })
        .collect()
}

/// What the placeholders stand for on replay.
struct Bound {
    of: HashMap<String, String>,
    made: usize,
}

impl Bound {
    /// `text` with each placeholder replaced; one not yet bound (an id the client made up)
    /// gets a fresh value of its kind.
    fn fill(&mut self, text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("{{") {
            let Some(end) = rest[at..].find("}}") else { break };
            let name = &rest[at..at + end + 2];
            out.push_str(&rest[..at]);
            if !self.of.contains_key(name) {
                self.made += 1;
                let prefix = name.trim_start_matches("{{").split('#').next().unwrap_or_default();
                self.of.insert(name.into(), format!("{prefix}{:08x}{:08x}", std::process::id(), self.made));
            }
            out.push_str(&self.of[name]);
            rest = &rest[at + end + 2..];
        }
        out + rest
    }

    /// Binds the placeholders in the recorded answer to what stands in their place now.
    fn learn(&mut self, recorded: &Value, now: &Value) {
        match (recorded, now) {
            (Value::String(r), Value::String(n)) => {
                if let (Some(at), Some(end)) = (r.find("{{"), r.find("}}")) {
                    let (before, after) = (&r[..at], &r[end + 2..]);
                    if n.starts_with(before) && n.ends_with(after) && n.len() >= before.len() + after.len() {
                        let value = &n[before.len()..n.len() - after.len()];
                        self.of.entry(r[at..end + 2].to_string()).or_insert_with(|| value.to_string());
                    }
                }
            }
            (Value::Array(r), Value::Array(n)) => r.iter().zip(n).for_each(|(r, n)| self.learn(r, n)),
            (Value::Object(r), Value::Object(n)) => {
                r.iter().filter_map(|(k, rv)| Some((rv, n.get(k)?))).for_each(|(r, n)| self.learn(r, n))
            }
            _ => {}
        }
    }
}

/// Replays `steps` (recorded from release `client`) against `s`; what each answer lacks that
/// the recorded client needs, one line each.
fn replay(s: &Server, client: &str, steps: &[Step]) -> Vec<String> {
    use pcmail_core::version::{Release, server_release, serves};
    let client_release = Release::parse(client).expect("a corpus is named by its release");
    let http = reqwest::blocking::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("http");
    let dir = tempfile::tempdir().expect("tempdir");
    let of = HashMap::from([
        ("{{admin}}".to_string(), s.admin_token()),
        ("{{repo}}".to_string(), env!("CARGO_MANIFEST_DIR").to_string()),
        ("{{dir}}".to_string(), dir.path().display().to_string()),
    ]);
    let mut bound = Bound { of, made: 0 };
    let mut problems = Vec::new();
    for step in steps {
        for (i, x) in step.exchanges.iter().enumerate() {
            let what = format!("{client} `{}` #{} {} {}", step.verb.join(" "), i + 1, x.method, x.path);
            let path = bound.fill(&x.path);
            let url = match &x.query {
                Some(q) => format!("{}{path}?{}", s.url, bound.fill(q)),
                None => format!("{}{path}", s.url),
            };
            let mut req = http.request(x.method.parse().expect("a method"), url);
            for (k, v) in &x.headers {
                req = req.header(k, bound.fill(v));
            }
            let body = match &x.body {
                Value::Null => String::new(),
                Value::Object(o) if o.contains_key("$text") => bound.fill(o["$text"].as_str().unwrap_or_default()),
                v => bound.fill(&v.to_string()),
            };
            let answer = req.body(body).send().expect("today's server answers");
            let status = answer.status().as_u16();
            let server = answer.headers().get("server").and_then(|v| server_release(v.to_str().ok()?));
            let more = answer.headers().contains_key(pcmail_core::page::MORE_HEADER);
            let now = body_value(&answer.bytes().expect("body"));
            if status / 100 != x.status / 100 {
                problems.push(format!("{what}: answered {status}, recorded {}: {now}", x.status));
                continue;
            }
            if let Some(server) = server.filter(|&r| !serves(client_release, r)) {
                problems.push(format!("{what}: server {server} is outside the {client} client's window"));
            }
            if x.more && !more {
                problems.push(format!("{what}: x-pcmail-more is gone"));
            }
            if x.answer.get("$text").is_none() {
                problems.extend(lost(&shape(&x.answer, false), &shape(&now, false), &format!("{what}: answer")));
            }
            bound.learn(&x.answer, &now);
        }
    }
    problems
}

#[test]
fn v2_every_recorded_clients_requests_get_answers_that_client_can_parse() {
    if std::env::var("PCMAIL_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        let today = Server::start_with(None);
        write(env!("CARGO_PKG_VERSION"), &record(&today, Path::new(BIN)));
        let previous = crate::previous::binary();
        let theirs = Server::start_bin(&previous, None, &[]);
        write(crate::previous::RELEASE, &record(&theirs, &previous));
    }
    let mut releases: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("tests/corpus (PCMAIL_UPDATE_GOLDEN=1 records it)")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_dir())
        .collect();
    releases.sort();
    let ours = pcmail_core::version::Release::this();
    let mut replayed = 0;
    for dir in releases {
        let release = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let steps = read(&dir);
        let client = pcmail_core::version::Release::parse(&release).expect("a release directory");
        if !pcmail_core::version::serves(ours, client) {
            eprintln!("V2: the {release} corpus is outside this server's window: not replayed (remove it)");
            continue;
        }
        let s = Server::start_with(None);
        let problems = replay(&s, &release, &steps);
        assert!(problems.is_empty(), "V2: today's server answers the {release} client:\n{}", problems.join("\n"));
        let exchanges: usize = steps.iter().map(|s| s.exchanges.len()).sum();
        eprintln!("V2: {release}: {} verbs, {exchanges} requests replayed", steps.len());
        replayed += 1;
    }
    assert!(replayed >= 1, "no corpus of a release this server serves under tests/corpus");
}

#[test]
fn v2_the_corpus_names_ids_and_secrets_binds_them_again_on_replay_and_allows_added_fields() {
    let x = Exchange {
        method: "GET".into(),
        path: "/api/v1/whoami".into(),
        query: None,
        headers: BTreeMap::new(),
        body: Value::Null,
        status: 200,
        more: false,
        answer: json!({"machine": "desk", "admin": false}),
    };
    let mut names = Names::default();
    let token = "pcm_0a1b2c3d4e5f6789";
    let named = names.exchange(Exchange { answer: json!({"token": token, "for": format!("mail--{}", "00ff12")}), ..x });
    assert_eq!(named.answer, json!({"token": "{{pcm_#1}}", "for": "{{mail--#1}}"}));
    let mut bound = Bound { of: HashMap::new(), made: 0 };
    bound.learn(&named.answer, &json!({"token": "pcm_new", "for": "mail--0000beef"}));
    assert_eq!(bound.fill("/api/v1/mail/{{mail--#1}}?t={{pcm_#1}}"), "/api/v1/mail/mail--0000beef?t=pcm_new");
    assert!(bound.fill("{{job-#4}}").starts_with("job-"), "an id the client made up is made up again");
    let golden = shape(&json!({"machine": "desk", "admin": false}), false);
    assert_eq!(
        lost(&golden, &shape(&json!({"machine": "d", "admin": true, "new": 1}), false), "w"),
        Vec::<String>::new()
    );
    assert_eq!(lost(&golden, &shape(&json!({"machine": "d"}), false), "w"), ["w.admin is gone"]);
}
