//! E11 and E17 as issue #30's fault injection tried them, through a real `serve`: a PostgreSQL
//! of the test's own stopped for 6 s and for 30 s under a pool of long jobs (every job runs
//! once: heartbeats, starts and results are retried while their leases live), a SIGTERM of
//! `serve` mid-job (the job comes back with its attempt), and a kill -9 while a job waits
//! claimed ahead (its attempt is not spent). Runs are counted by a Function that appends its
//! job id to a file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::endurance::call;
use crate::harness::*;

/// A PostgreSQL instance of the test's own (its own `initdb` data dir, a free port), so it can
/// be stopped and started without touching anyone else's database. As root it runs as the
/// `postgres` user, which the Debian packages create.
pub(crate) struct OwnPostgres {
    pub(crate) dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl OwnPostgres {
    pub(crate) fn start() -> OwnPostgres {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's server binaries in /usr/lib/postgresql (scripts/test installs them)")
            .flatten()
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("initdb").exists())
            .collect();
        versions.sort();
        let bin = versions.pop().expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().expect("tempdir");
        // SAFETY: geteuid has no preconditions.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        if as_postgres {
            let status = Command::new("chown").args(["postgres:postgres"]).arg(dir.path()).status().expect("chown");
            assert!(status.success(), "chown the data dir to postgres");
        }
        let pg = OwnPostgres { dir, bin, port: free_port(), as_postgres };
        let data = pg.data().display().to_string();
        pg.run("initdb", &["-D", &data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]);
        pg.up();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let path = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let out = cmd.args(args).current_dir(self.dir.path()).output().expect(tool);
        assert!(out.status.success(), "{tool} {args:?}: {}{}", stdout(&out), stderr(&out));
    }

    /// Starts the server and waits until it accepts connections.
    fn up(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off",
            self.port,
            self.dir.path().display()
        );
        let (data, log) = (self.data().display().to_string(), self.dir.path().join("pg.log").display().to_string());
        self.run("pg_ctl", &["-D", &data, "-o", &opts, "-l", &log, "-w", "-t", "30", "start"]);
    }

    /// Stops it as an operator would (`-m fast`: sessions are ended, connections refused).
    fn down(&self) {
        let data = self.data().display().to_string();
        self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "-t", "30", "stop"]);
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let data = self.data().display().to_string();
        let path = self.bin.join("pg_ctl");
        let args = ["-D", data.as_str(), "-m", "immediate", "-w", "stop"];
        let _ = if self.as_postgres {
            Command::new("runuser").args(["-u", "postgres", "--"]).arg(path).args(args).output()
        } else {
            Command::new(path).args(args).output()
        };
    }
}

/// Manifests for a pool `p` of `workers` on queue `q` and Functions that append their job id
/// to `runs` and then sleep: `long` 35 s, `slow` 3 s, `quick` none, `stuck` 120 s.
fn manifests(dir: &Path, runs: &Path, pool: &str) -> PathBuf {
    let m = dir.join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    let function = |name: &str, sleep: u32| {
        format!(
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: {name}}}\nspec: {{command: [sh, -c, 'echo $PCMAIL_JOB_ID >> {}; exec sleep {sleep}'], mode: heavy, timeout: 300s}}\n---\n",
            runs.display()
        )
    };
    let pool =
        format!("apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {{name: p}}\nspec: {{queues: [q], {pool}}}\n");
    let docs = [function("long", 35), function("slow", 3), function("quick", 0), function("stuck", 120), pool];
    std::fs::write(m.join("pool.yaml"), docs.concat()).expect("manifests");
    m
}

fn enqueue(s: &Server, function: &str) -> String {
    let (status, body) = call(s, "POST", "/api/v1/jobs", &s.admin_token(), json!({"queue": "q", "function": function}));
    assert_eq!(status, 200, "{body}");
    body["job"]["id"].as_str().expect("id").to_string()
}

/// Every job of queue `q`, by id.
fn jobs(s: &Server) -> std::collections::BTreeMap<String, serde_json::Value> {
    let (_, body) = call(s, "GET", "/api/v1/jobs?queue=q", &s.admin_token(), json!(null));
    let list = body["jobs"].as_array().cloned().unwrap_or_default();
    list.into_iter().map(|j| (j["id"].as_str().unwrap_or_default().to_string(), j)).collect()
}

/// How many times each job id was run, as the Functions wrote it.
fn runs(file: &Path) -> std::collections::BTreeMap<String, usize> {
    let mut seen = std::collections::BTreeMap::new();
    for id in std::fs::read_to_string(file).unwrap_or_default().lines() {
        *seen.entry(id.to_string()).or_insert(0) += 1;
    }
    seen
}

/// Sleeps until `at`.
fn until(at: Instant) {
    std::thread::sleep(at.saturating_duration_since(Instant::now()));
}

#[test]
fn e11_a_6s_and_a_30s_store_outage_under_a_pool_of_long_jobs_run_every_job_once() {
    let pg = OwnPostgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("runs");
    // 60 s leases, heartbeats every 20 s: each outage begins at most 20 s after a heartbeat.
    let m = manifests(dir.path(), &file, "workers: 2, leaseDuration: 60s, maxAttempts: 3");
    let url = pg.url();
    let s = Server::start_logged_opts(Some(m), &["--store", &url, "--resync", "1s"]);
    let long = [enqueue(&s, "long"), enqueue(&s, "long")];
    eventually(30, "both long jobs to start", || long.iter().all(|id| runs(&file).contains_key(id)).then_some(()));
    let t = Instant::now();
    // Claimed ahead, it waits for a slot through both outages.
    let ahead = enqueue(&s, "quick");
    eventually(10, "the quick job to be claimed ahead", || {
        (jobs(&s).get(&ahead)?["leaseOwner"] == "pool:p (claimed ahead)").then_some(())
    });
    // Over the first heartbeat (20 s after the claim): it is retried until the store is back.
    until(t + Duration::from_secs(16));
    pg.down();
    std::thread::sleep(Duration::from_secs(6));
    pg.up();
    // The long jobs end 35 s in, inside this outage: their results wait for the store, and so
    // does the start of the job claimed ahead, which gets its slot then.
    until(t + Duration::from_secs(28));
    pg.down();
    std::thread::sleep(Duration::from_secs(30));
    pg.up();
    let ended = eventually(60, "every job to succeed", || {
        let all = jobs(&s);
        (all.len() == 3 && all.values().all(|j| j["state"] == "succeeded")).then_some(all)
    });
    let ran = runs(&file);
    for id in long.iter().chain([&ahead]) {
        assert_eq!(ran.get(id), Some(&1), "job {id} ran {:?} times: {ran:?}", ran.get(id));
        assert_eq!((&ended[id]["attempts"], &ended[id]["rescues"]), (&json!(1), &json!(0)), "{}", ended[id]);
    }
    assert_eq!(ran.len(), 3, "{ran:?}");
    assert_eq!(ended[&ahead]["leaseOwner"], "pool:p", "its start was recorded: {}", ended[&ahead]);
    // Each outage is said once (and its end once), not per retry.
    let log = s.log();
    let said = log.matches("the store is unavailable: claims wait").count();
    assert!((1..=4).contains(&said), "said {said} times:\n{log}");
    assert!(!log.contains("heartbeat refused") && !log.contains("results not recorded"), "{log}");
}

#[test]
fn e17_sigterm_of_serve_mid_job_hands_the_job_back_with_its_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("runs");
    let m = manifests(dir.path(), &file, "workers: 1, leaseDuration: 30s, maxAttempts: 1");
    let mut s = Server::start_opts(Some(m), "127.0.0.1:0", &["--shutdown-grace", "1s", "--resync", "500ms"]);
    let running = enqueue(&s, "slow");
    eventually(30, "the first job to start", || runs(&file).contains_key(&running).then_some(()));
    let ahead = enqueue(&s, "slow");
    eventually(10, "the second job to be claimed ahead", || {
        (jobs(&s).get(&ahead)?["leaseOwner"] == "pool:p (claimed ahead)").then_some(())
    });
    let (code, took) = s.terminate();
    assert_eq!(code, Some(0), "serve stopped cleanly in {took:?}");
    assert_eq!(runs(&file).get(&running), Some(&1), "cut by the grace before it could end");
    // A plain restart: with maxAttempts 1 both still run, each once more at most.
    s.spawn();
    let ended = eventually(30, "both jobs to succeed", || {
        let all = jobs(&s);
        (all.len() == 2 && all.values().all(|j| j["state"] == "succeeded")).then_some(all)
    });
    for id in [&running, &ahead] {
        assert_eq!((&ended[id]["attempts"], &ended[id]["rescues"]), (&json!(1), &json!(0)), "{}", ended[id]);
    }
    let ran = runs(&file);
    assert_eq!((ran.get(&running), ran.get(&ahead)), (Some(&2), Some(&1)), "{ran:?}");
}

#[test]
fn e17_a_job_that_ends_within_the_shutdown_grace_is_recorded_before_serve_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("runs");
    let m = manifests(dir.path(), &file, "workers: 1, leaseDuration: 30s, maxAttempts: 1");
    let mut s = Server::start_opts(Some(m), "127.0.0.1:0", &["--shutdown-grace", "20s"]);
    let id = enqueue(&s, "slow");
    eventually(30, "the job to start", || runs(&file).contains_key(&id).then_some(()));
    let (code, took) = s.terminate();
    assert_eq!(code, Some(0), "serve stopped cleanly in {took:?}");
    s.spawn();
    let job = jobs(&s).remove(&id).expect("the job");
    assert_eq!((&job["state"], &job["attempts"]), (&json!("succeeded"), &json!(1)), "{job}");
    assert_eq!(runs(&file).get(&id), Some(&1));
}

#[test]
fn e17_a_crash_never_spends_the_attempt_of_a_job_claimed_ahead() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("runs");
    let m = manifests(dir.path(), &file, "workers: 1, leaseDuration: 3s, maxAttempts: 1");
    let mut s = Server::start_opts(Some(m), "127.0.0.1:0", &["--resync", "500ms", "--lease", "2s"]);
    let started = enqueue(&s, "stuck");
    eventually(30, "the first job to start", || runs(&file).contains_key(&started).then_some(()));
    let ahead = enqueue(&s, "quick");
    eventually(10, "the second job to be claimed ahead", || {
        (jobs(&s).get(&ahead)?["leaseOwner"] == "pool:p (claimed ahead)").then_some(())
    });
    s.kill9();
    s.spawn();
    let ended = eventually(30, "both leases rescued and the job claimed ahead run", || {
        let all = jobs(&s);
        let done = |id: &String| all.get(id).and_then(|j| j["state"].as_str().map(String::from));
        (done(&started)? == "dead" && done(&ahead)? == "succeeded").then_some(all)
    });
    assert_eq!(ended[&started]["attempts"], 1, "the run that began spent its attempt (J3)");
    let job = &ended[&ahead];
    assert_eq!((&job["attempts"], &job["rescues"]), (&json!(1), &json!(1)), "{job}");
    assert!(job["lastError"].as_str().is_some_and(|e| e.contains("before its run began")), "{job}");
    assert_eq!(runs(&file).get(&ahead), Some(&1));
}
