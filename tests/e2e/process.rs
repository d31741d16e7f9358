//! E16 and E17's last sentence as issue #30's fault injection tried them, through a real
//! `serve`: strays of a Function (a background child, a `setsid` grandchild) at its exit, its
//! timeout and serve's SIGTERM; a child holding stdout; 1 GB on stdout; a ledger source
//! command's environment and cap. Each stray sleeps a number no other test uses, so `/proc`
//! tells whether it is still running.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::endurance::call;
use crate::harness::*;

/// Live (not zombie) processes whose argv is exactly `argv`.
fn running(argv: &[&str]) -> Vec<String> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").expect("proc").flatten().take(1 << 20) {
        let pid = entry.file_name().to_string_lossy().to_string();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()) == Some("Z");
        if cmdline == want && !zombie {
            found.push(pid);
        }
    }
    found
}

/// Whether no `sleep N` of `ns` runs, waiting up to 3 s for the kill to land.
fn all_gone(ns: &[&str]) -> bool {
    for _ in 0..60 {
        if ns.iter().all(|n| running(&["sleep", n]).is_empty()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Kills what a failed test left, so a later run does not see it.
fn clean(ns: &[&str]) {
    for n in ns {
        for pid in running(&["sleep", n]) {
            let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
        }
    }
}

/// A field of `/proc/PID/status` in kB: `VmRSS` now, `VmHWM` its peak so far.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_default();
    line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0)
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A pool `p` (2 workers, one attempt a job) and the Functions each test runs.
fn setup() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    let function = |name: &str, script: &str, timeout: &str| {
        format!(
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: {name}}}\nspec: {{command: [sh, -c, '{script}'], mode: heavy, timeout: {timeout}}}\n---\n"
        )
    };
    let manifests = [
        function("strays", "sleep 3001 & setsid sleep 3002 & echo started", "30s"),
        function("slow", "sleep 3003 & setsid sleep 3004 & sleep 3005", "1s"),
        function("holder", "(sleep 3006; echo late) & echo early", "30s"),
        function("flood", "head -c 1000000000 /dev/zero", "120s"),
        function("term", "sleep 3007 & setsid sleep 3008 & sleep 3009", "120s"),
        function("crash", "sleep 3010 & setsid sleep 3011 & sleep 3012", "120s"),
        "apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: p}\nspec: {workers: 2, queues: [q], maxAttempts: 1, leaseDuration: 30s}\n".into(),
    ];
    std::fs::write(m.join("functions.yaml"), manifests.concat()).expect("manifests");
    (Server::start_opts(Some(m), "127.0.0.1:0", &["--resync", "300ms", "--shutdown-grace", "1s"]), dir)
}

fn enqueue(s: &Server, function: &str) -> String {
    let (status, body) = call(s, "POST", "/api/v1/jobs", &s.admin_token(), json!({"queue": "q", "function": function}));
    assert_eq!(status, 200, "{body}");
    body["job"]["id"].as_str().expect("id").to_string()
}

/// The job `id` as the jobs listing shows it (null while it is not there).
fn job(s: &Server, admin: &str, id: &str) -> serde_json::Value {
    let (_, jobs) = call(s, "GET", "/api/v1/jobs?queue=q", admin, json!(null));
    jobs["jobs"].as_array().and_then(|a| a.iter().find(|j| j["id"] == id).cloned()).unwrap_or_default()
}

/// The job once it ended, looked at until `secs` pass.
fn ended(s: &Server, id: &str, secs: u64) -> serde_json::Value {
    let admin = s.admin_token();
    eventually(secs, &format!("job {id} to end"), || {
        let job = job(s, &admin, id);
        ["succeeded", "failed", "dead"].contains(&job["state"].as_str()?).then_some(job)
    })
}

#[test]
fn e16_a_function_that_exits_0_succeeds_and_leaves_no_process_of_its_run() {
    let (s, _dir) = setup();
    let job = ended(&s, &enqueue(&s, "strays"), 30);
    let gone = all_gone(&["3001", "3002"]);
    clean(&["3001", "3002"]);
    assert_eq!((job["state"].as_str(), job["result"].as_str()), (Some("succeeded"), Some("started")), "{job}");
    assert!(gone, "the background child or the setsid grandchild outlived a successful Function");
}

#[test]
fn e16_a_function_that_times_out_takes_its_grandchildren_with_it() {
    let (s, _dir) = setup();
    let job = ended(&s, &enqueue(&s, "slow"), 30);
    let gone = all_gone(&["3003", "3004", "3005"]);
    clean(&["3003", "3004", "3005"]);
    assert_eq!(job["state"], "dead", "{job}");
    assert!(job["lastError"].as_str().is_some_and(|e| e.contains("timed out after 1s")), "{job}");
    assert!(gone, "a process of the timed-out run is still running");
}

#[test]
fn e16_a_function_whose_child_keeps_stdout_open_is_recorded_succeeded_at_once() {
    let (s, _dir) = setup();
    let started = Instant::now();
    let job = ended(&s, &enqueue(&s, "holder"), 30);
    let took = started.elapsed();
    let gone = all_gone(&["3006"]);
    clean(&["3006"]);
    eprintln!("E16: a Function with a child holding its stdout recorded in {took:?}");
    assert_eq!((job["state"].as_str(), job["result"].as_str()), (Some("succeeded"), Some("early")), "{job}");
    assert!(took < Duration::from_secs(3), "recorded after {took:?}: it waited for the pipe");
    assert!(gone, "the child holding stdout outlived the Function");
}

#[test]
fn e16_a_gigabyte_on_stdout_is_drained_through_the_cap_and_serve_grows_at_most_16_mb() {
    let (s, _dir) = setup();
    let pid = s.pid();
    let (before, hwm_before) = (rss_kib(pid), status_kib(pid, "VmHWM:"));
    let id = enqueue(&s, "flood");
    let admin = s.admin_token();
    let started = Instant::now();
    let mut peak = before;
    let job = loop {
        peak = peak.max(rss_kib(pid));
        let job = job(&s, &admin, &id);
        if ["succeeded", "dead"].contains(&job["state"].as_str().unwrap_or_default()) {
            break job;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the flood never ended: {job}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Between samples too: a high-water mark that rose was reached during the flood.
    let hwm = status_kib(pid, "VmHWM:");
    peak = peak.max(rss_kib(pid)).max(if hwm > hwm_before { hwm } else { 0 });
    eprintln!("E16: 1 GB on stdout in {:?}; serve's RSS {before} kB → peak {peak} kB", started.elapsed());
    assert_eq!(job["state"], "dead", "{job}");
    let error = job["lastError"].as_str().unwrap_or_default();
    assert!(error.contains("stdout passed its 1048576-byte cap (1000000000 bytes written)"), "{job}");
    assert!(peak.saturating_sub(before) <= 16 * 1024, "RSS grew {before} kB → {peak} kB");
}

#[test]
fn e16_sigterm_of_serve_mid_job_kills_the_function_and_its_grandchildren() {
    let (mut s, _dir) = setup();
    let id = enqueue(&s, "term");
    let admin = s.admin_token();
    eventually(30, "the Function to start its strays", || {
        let job = job(&s, &admin, &id);
        let all = ["3007", "3008", "3009"].iter().all(|n| !running(&["sleep", n]).is_empty());
        (job["state"] == "running" && all).then_some(())
    });
    let (code, took) = s.terminate();
    let gone = all_gone(&["3007", "3008", "3009"]);
    clean(&["3007", "3008", "3009"]);
    assert_eq!(code, Some(0), "serve stopped cleanly in {took:?}");
    assert!(gone, "a process of the running Function outlived serve's SIGTERM");
}

#[test]
fn e16_after_a_sigkill_of_serve_the_next_start_kills_what_its_functions_left_and_nothing_else() {
    let (mut s, _dir) = setup();
    let id = enqueue(&s, "crash");
    let admin = s.admin_token();
    let strays = ["3010", "3011", "3012"];
    eventually(30, "the Function to start its strays", || {
        let job = job(&s, &admin, &id);
        (job["state"] == "running" && strays.iter().all(|n| !running(&["sleep", n]).is_empty())).then_some(())
    });
    let records = s.dir.path().join("data/runs");
    assert_eq!(std::fs::read_dir(&records).expect("the runs' records").count(), 1, "one record while it runs");
    s.kill9();
    // Only the Function itself dies with serve (PDEATHSIG): its children and the setsid
    // grandchild are orphans now, with nothing of this serve left to kill them.
    let left: Vec<&str> = strays.iter().copied().filter(|n| !running(&["sleep", n]).is_empty()).collect();
    let mut unrelated = std::process::Command::new("sleep").arg("3013").spawn().expect("an unrelated sleep");
    s.spawn();
    let gone = all_gone(&strays);
    let spared = running(&["sleep", "3013"]).len();
    clean(&["3010", "3011", "3012", "3013"]);
    let _ = unrelated.wait();
    assert!(left.contains(&"3011"), "the setsid grandchild outlived the SIGKILL: {left:?}");
    assert!(gone, "the next serve killed what the killed one's Function left: {left:?}");
    assert_eq!(spared, 1, "a process that is no run's is never killed");
}

#[test]
fn e17_a_ledger_source_command_sees_none_of_serves_environment_and_is_capped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = dir.path().join("env.txt");
    let m = dir.path().join("m");
    std::fs::create_dir(&m).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), m.join("roster.yaml")).expect("roster");
    std::fs::write(
        m.join("ledger.yaml"),
        format!(
            "apiVersion: pcmail/v1\nkind: Ledger\nmetadata: {{name: office}}\nspec:\n  project: office\n  sources:\n  \
             - {{name: listed, command: [sh, -c, 'env > {}; echo \"{{\\\"task\\\": \\\"from the command\\\"}}\"']}}\n  \
             - {{name: flood, command: [sh, -c, 'head -c 20000000 /dev/zero']}}\n",
            seen.display()
        ),
    )
    .expect("manifests");
    let store = format!("sqlite:{}", dir.path().join("store.db").display());
    let env = [("PCMAIL_STORE", store.as_str()), ("PCMAIL_E17_SECRET", "hunter2")];
    let s = Server::start_env(Some(m), &[], &env);
    let report = json(s.admin(&["ledger", "sync"]));
    let env = std::fs::read_to_string(&seen).expect("the command ran");
    assert!(!env.contains("PCMAIL_STORE") && !env.contains("hunter2"), "serve's environment leaked: {env}");
    assert!(env.contains("PATH=") && env.contains("PCMAIL_RUN="), "{env}");
    assert_eq!(report["counts"]["added"], 1, "{report}");
    let errors = report["errors"].to_string();
    assert!(
        errors.contains("source flood: sh: output passed its 8388608-byte cap (20000000 bytes written)"),
        "{report}"
    );
}
