//! P9 and P10 on a real release `serve`: the job queue's own cost beside the work it runs.
//!
//! P9: 10k jobs drained by a WorkerPool of 4 whose Function is `true`, against the rate at
//! which this machine spawns `true` from 4 threads in the same run.
//!
//! P10: enqueue through the API from one client (one thread, as a script is), one job per
//! request, against a raw SQLite loop of one-insert FULL-sync transactions in the same run; and
//! bulk requests of 1,000. Its bound, measured in the same rounds: the raw commits each after a
//! refused request, since a disk that waits a round trip between flushes may answer each later
//! than back to back.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::pcside::Serve;
use crate::table::Row;

const P9_JOBS: usize = 10_000;
const P10_SINGLE: usize = 2_000;
const P10_BULK: usize = 20;

fn pool_manifest(workers: u32) -> String {
    format!(
        "apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: noop}}\nspec:\n  command: [\"true\"]\n  mode: heavy\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {{name: bench}}\nspec:\n  workers: {workers}\n  queues: [bench]\n"
    )
}

/// A client of `serve` acting as the admin: one keep-alive connection, as a script would use.
struct Admin {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Admin {
    fn of(serve: &Serve) -> Admin {
        Admin { http: reqwest::Client::new(), url: serve.url.clone(), token: serve.admin().to_string() }
    }

    async fn post(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await
            .expect("post");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("json")
    }

    /// A request the server must refuse (4xx), its answer read whole.
    async fn refused(&self, path: &str, body: &serde_json::Value) {
        let r = self.http.post(format!("{}{path}", self.url)).bearer_auth(&self.token).json(body).send().await;
        let r = r.expect("post");
        assert!(r.status().is_client_error(), "{path}: {}", r.status());
        r.bytes().await.expect("answer");
    }

    /// One request of `n` jobs; the answer is received whole but not parsed (the client's JSON
    /// decoding of 1,000 jobs is not the server's cost).
    async fn enqueue_bulk(&self, n: usize) {
        let jobs: Vec<_> = (0..n).map(|i| json!({"queue": "bench", "function": "noop", "payload": {"n": i}})).collect();
        let r = self
            .http
            .post(format!("{}/api/v1/jobs", self.url))
            .bearer_auth(&self.token)
            .json(&jobs)
            .send()
            .await
            .expect("post");
        assert!(r.status().is_success(), "bulk enqueue: {}", r.status());
        r.bytes().await.expect("answer");
    }
}

/// The store file, read-only, as a person's query would read it: opened once, so the
/// measuring costs the machine little beside what is measured.
fn reader(serve: &Serve) -> rusqlite::Connection {
    let path = serve.dir.path().join("data/pcmail.db");
    rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("open the store")
}

/// The CPU time process `pid` has spent itself (user and system), its reaped children's not.
fn own_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's closing parenthesis: state is field 3, utime 14 and stime 15.
    let fields: Vec<u64> =
        stat.rsplit(')').next().unwrap_or("").split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    // SAFETY: sysconf reads a constant.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100).max(1);
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

/// Jobs of the bench queue that succeeded.
fn succeeded(db: &rusqlite::Connection) -> usize {
    db.query_row("SELECT count(*) FROM jobs WHERE state = 'succeeded'", [], |r| r.get::<_, i64>(0)).unwrap_or(0)
        as usize
}

/// Whether any job waits or runs, through the claim's and the leases' partial indexes: a probe
/// that costs the same however many jobs have finished (counting them, every 20 ms of a drain,
/// spent CPU the measured server needs).
fn any_open(db: &rusqlite::Connection) -> bool {
    db.query_row(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'queued') OR EXISTS (SELECT 1 FROM jobs WHERE state = 'running')",
        [],
        |r| r.get(0),
    )
    .unwrap_or(true)
}

/// `n` spawns of `true` spread over 4 threads, per second. `fork`: with a `pre_exec` hook, as
/// `exec.rs` needs for PR_SET_PDEATHSIG, which makes std fork instead of posix_spawn (vfork).
fn spawn_rate(n: usize, fork: bool) -> f64 {
    let started = Instant::now();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                for _ in 0..n / 4 {
                    let mut cmd = std::process::Command::new("true");
                    if fork {
                        // SAFETY: the hook only returns.
                        unsafe { std::os::unix::process::CommandExt::pre_exec(&mut cmd, || Ok(())) };
                    }
                    let status = cmd.status().expect("spawn true");
                    assert!(status.success());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("thread");
    }
    n as f64 / started.elapsed().as_secs_f64()
}

pub async fn p9() -> Vec<Row> {
    let serve = Serve::start_with(&["bench".to_string()], &pool_manifest(0), &[]);
    let admin = Admin::of(&serve);
    for _ in 0..P9_JOBS / 1000 {
        admin.enqueue_bulk(1000).await;
    }
    // The baseline's spawns come half just before the drain and half just after it, so a
    // drift of the machine's speed through the run falls on both sides of the ratio.
    let before = spawn_rate(P9_JOBS / 2, false);
    let db = reader(&serve);
    let cpu_before = own_cpu(serve.pid());
    let started = Instant::now();
    let apply = json!({"files": [{"name": "pool.yaml", "content": pool_manifest(4)}]});
    admin.post("/api/v1/apply", &apply).await;
    // Applied before the first look, so a queued job is there until the pool has drained.
    while any_open(&db) {
        assert!(started.elapsed() < Duration::from_secs(600), "the pool drained {} jobs", succeeded(&db));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ours = P9_JOBS as f64 / started.elapsed().as_secs_f64();
    assert_eq!(succeeded(&db), P9_JOBS, "every job succeeded");
    let serve_cpu = own_cpu(serve.pid()).saturating_sub(cpu_before);
    drop(db);
    drop(serve);
    let after = spawn_rate(P9_JOBS / 2, false);
    // Both halves' spawns over both halves' time.
    let raw = 2.0 / (1.0 / before + 1.0 / after);
    let forked = spawn_rate(P9_JOBS, true);
    vec![
        Row::note(
            "P9",
            format!("{P9_JOBS} jobs drained by a WorkerPool of 4, Function `true`"),
            format!("{ours:.0} /s"),
        ),
        Row::note(
            "",
            "baseline: `true` spawned from 4 threads, half before the drain and half after",
            format!("{raw:.0} /s ({before:.0} before, {after:.0} after)"),
        ),
        Row::at_least("", "pool ÷ baseline", ours / raw, 0.8, "×"),
        Row::note(
            "",
            "serve's own CPU per job (its threads', not the Functions')",
            format!("{:.0} µs", serve_cpu.as_secs_f64() * 1e6 / P9_JOBS as f64),
        ),
        Row::note(
            "",
            "the same spawns forked by std behind a pre_exec hook (what serve did before its clone spawner)",
            format!("{forked:.0} /s"),
        ),
    ]
}

/// One-insert transactions in a jobs table of the store's own schema, WAL and FULL sync like
/// the store.
struct RawInserts {
    conn: rusqlite::Connection,
    next: usize,
}

impl RawInserts {
    fn open(dir: &std::path::Path) -> RawInserts {
        let conn = rusqlite::Connection::open(dir.join("raw.db")).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
        conn.pragma_update(None, "synchronous", "FULL").expect("sync");
        conn.execute_batch(
            "CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, queue TEXT NOT NULL, \
             function TEXT NOT NULL, payload TEXT NOT NULL, state TEXT NOT NULL, priority INTEGER NOT NULL, \
             run_after INTEGER NOT NULL, created_at INTEGER NOT NULL); \
             CREATE INDEX jobs_claim ON jobs(queue, priority DESC, run_after, seq) WHERE state = 'queued';",
        )
        .expect("schema");
        RawInserts { conn, next: 0 }
    }

    /// `n` more inserts, per second.
    fn rate(&mut self, n: usize) -> f64 {
        let started = Instant::now();
        for _ in 0..n {
            self.insert();
        }
        n as f64 / started.elapsed().as_secs_f64()
    }

    /// One more insert, in its own transaction.
    fn insert(&mut self) {
        let i = self.next;
        self.next += 1;
        let now = chrono::Utc::now().timestamp_millis();
        self.conn
            .execute(
                "INSERT INTO jobs (id, queue, function, payload, state, priority, run_after, created_at) \
                 VALUES (?1, 'bench', 'noop', ?2, 'queued', 0, ?3, ?3)",
                rusqlite::params![format!("job-{i:012}"), format!("{{\"n\":{i}}}"), now],
            )
            .expect("insert");
    }
}

/// "One client" is one thread, as a script is: its requests wait on no other thread of its own.
fn one_client_thread<T: Send, F: std::future::Future<Output = T>>(run: impl FnOnce() -> F + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("client runtime");
            rt.block_on(run())
        })
        .join()
        .expect("client thread")
    })
}

/// P10's rounds: ours and the raw loop take turns, so a swing of the machine's disk or CPU
/// falls on both; each figure is the median of its rounds.
const P10_ROUNDS: usize = 5;

pub async fn p10() -> Vec<Row> {
    let serve = Serve::start_with(&["bench".to_string()], &pool_manifest(0), &[]);
    let raw_db = serve.dir.path().join("raw");
    std::fs::create_dir_all(&raw_db).expect("raw dir");
    let mut raw_loop = RawInserts::open(&raw_db);
    let each = P10_SINGLE / P10_ROUNDS;
    let (mut ours, mut raw, mut refused, mut paced) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut serve_cpu = Duration::ZERO;
    let bulk = one_client_thread(|| async {
        let admin = Admin::of(&serve);
        admin.post("/api/v1/jobs", &json!({"queue": "bench", "function": "noop"})).await;
        // The same request refused before the store (an undeclared queue): the hop alone.
        let refusal = json!({"queue": "undeclared", "function": "noop"});
        let mut n = 0;
        for _ in 0..P10_ROUNDS {
            let cpu_before = own_cpu(serve.pid());
            let started = Instant::now();
            for _ in 0..each {
                n += 1;
                admin.post("/api/v1/jobs", &json!({"queue": "bench", "function": "noop", "payload": {"n": n}})).await;
            }
            ours.push(each as f64 / started.elapsed().as_secs_f64());
            serve_cpu += own_cpu(serve.pid()).saturating_sub(cpu_before);
            raw.push(raw_loop.rate(each));
            let started = Instant::now();
            for _ in 0..each {
                admin.refused("/api/v1/jobs", &refusal).await;
            }
            refused.push(each as f64 / started.elapsed().as_secs_f64());
            // The raw commits again, each after the refused request: what the machine's disk
            // gives a commit that waits on a round trip before it, as every API's commit does.
            let started = Instant::now();
            for _ in 0..each {
                admin.refused("/api/v1/jobs", &refusal).await;
                raw_loop.insert();
            }
            paced.push(each as f64 / started.elapsed().as_secs_f64());
        }
        let started = Instant::now();
        for _ in 0..P10_BULK {
            admin.enqueue_bulk(1000).await;
        }
        (P10_BULK * 1000) as f64 / started.elapsed().as_secs_f64()
    });
    // A commit's time once the round trip is taken out of the turns, each round's own: on a
    // virtual disk that idles between requests, longer than back to back, and no server can
    // win it back.
    let paced_commit = median(paced.iter().zip(&refused).map(|(p, r)| 1.0 / p - 1.0 / r).collect());
    let (single, raw, hop, bound) = (median(ours), median(raw), median(refused), median(paced));
    vec![
        Row::note(
            "P10",
            format!("enqueue through the API, one client, one job per request (median of {P10_ROUNDS} rounds)"),
            format!("{single:.0} /s"),
        ),
        Row::note(
            "",
            "baseline: one-insert FULL-sync SQLite transactions, rounds between ours",
            format!("{raw:.0} /s"),
        ),
        Row::at_least("", "API ÷ baseline", single / raw, 0.5, "×"),
        Row::note(
            "",
            "serve's own CPU per job enqueued, one a request",
            format!("{:.0} µs", serve_cpu.as_secs_f64() * 1e6 / (each * P10_ROUNDS) as f64),
        ),
        Row::note("", "the same request refused before the store (the round trip alone)", format!("{hop:.0} /s")),
        Row::note(
            "",
            "round trip + raw commit, taking turns (the most one job a request could reach)",
            format!("{bound:.0} /s = {:.2}× the baseline", bound / raw),
        ),
        Row::note(
            "",
            "a raw commit's time after a round trip ÷ its time back to back (the disk's wake-up)",
            format!("{:.0} µs ÷ {:.0} µs = {:.2}×", paced_commit * 1e6, 1e6 / raw, paced_commit * raw),
        ),
        Row::note("", "API ÷ round trip + raw commit", format!("{:.2}×", single / bound)),
        Row::at_least("", format!("enqueue in bulk requests of 1,000 ({P10_BULK} requests)"), bulk, 30_000.0, "jobs/s"),
    ]
}

fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}
