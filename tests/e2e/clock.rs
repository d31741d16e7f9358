//! E13 end to end: `serve` under libfaketime (`LD_PRELOAD`, the wall clock only —
//! `FAKETIME_DONT_FAKE_MONOTONIC=1`, as an NTP step or a VM restore moves it). Leases are judged
//! on the monotonic clock on SQLite, and Schedule entries run once per scheduled time however
//! the wall clock steps.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::harness::{Server, eventually, examples, ok};

/// Debian's libfaketime (`scripts/test` installs the `faketime` package).
pub fn libfaketime() -> PathBuf {
    ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("libfaketime is installed (apt-get install faketime; scripts/test does)")
}

/// serve's environment for a wall clock offset by what `offsets` holds (`+3h`, `-70`), re-read
/// every second, so a test steps the clock of a running serve by writing the file.
pub fn faked(offsets: &Path) -> Vec<(String, String)> {
    [
        ("LD_PRELOAD", libfaketime().display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offsets.display().to_string()),
        ("FAKETIME_CACHE_DURATION", "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub fn as_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// Sets the faked clock `offset` seconds from the real one.
pub fn step_to(offsets: &Path, offset: i64) {
    std::fs::write(offsets, format!("{offset:+}\n")).expect("offset file");
}

fn real_now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[test]
fn e13_a_leader_within_two_lease_durations_after_a_run_at_plus_3h_and_a_kill() {
    const LEASE: u64 = 4;
    let dir = tempfile::tempdir().expect("tempdir");
    let offsets = dir.path().join("offset");
    step_to(&offsets, 3 * 3600);
    let env = faked(&offsets);
    let lease = format!("{LEASE}s");
    let mut s = Server::start_env(Some(examples()), &["--lease", &lease, "--resync", "1s"], &as_refs(&env));
    eventually(10, "the serve at +3 h to lead", || s.is_leader().then_some(()));
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", "sent at +3 h"]));

    // Killed at +3 h: its lease row says it holds the lease for 3 more hours. Back at real time:
    s.kill9();
    s.set_env(&[]);
    s.spawn();
    let back = Instant::now();
    let mail = ok(s.ctl(&desk, &["send", "--to", "laptop", "--ttl", "5s", "--body", "expires on time"]));
    eventually(3 * LEASE, "a leader after the clock went back", || s.is_leader().then_some(()));
    assert!(back.elapsed() <= Duration::from_secs(2 * LEASE), "no leader for {:?}", back.elapsed());
    // Its sweep expires the 5 s mail on time: by then, plus a resync or two.
    let expired = eventually(20, "the 5 s mail to expire", || {
        let status = ok(s.ctl(&desk, &["status", &mail, "-o", "json"]));
        status.contains("\"expired\"").then(|| back.elapsed())
    });
    assert!(expired <= Duration::from_secs(5 + 3), "expired {expired:?} after the restart");
}

#[test]
fn e13_schedule_entries_run_once_across_a_70s_step_back_and_once_late_across_a_5min_step_forward() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir(&manifests).expect("dir");
    // Every minute; daily at 00:01 (run just before the step back) and 00:03 (stepped over).
    std::fs::write(
        manifests.join("schedule.yaml"),
        "apiVersion: pcmail/v1\nkind: Schedule\nmetadata: {name: clock}\nspec:\n  timezone: UTC\n  entries:\n\
         \x20   - {role: rebuild-view, cron: \"* * * * *\"}\n\
         \x20   - {role: sync, cron: \"1 0 * * *\"}\n\
         \x20   - {role: auto-execute, cron: \"3 0 * * *\"}\n",
    )
    .expect("schedule");
    // The faked clock starts at 00:00:55 UTC on a day to come.
    let start = chrono::NaiveDate::from_ymd_opt(2031, 3, 4)
        .and_then(|d| d.and_hms_opt(0, 0, 55))
        .expect("date")
        .and_utc()
        .timestamp();
    let offsets = dir.path().join("offset");
    let mut offset = start - real_now();
    step_to(&offsets, offset);
    let env = faked(&offsets);
    let s = Server::start_env(Some(manifests), &[], &as_refs(&env));
    let runs = |role: &str| {
        s.metric(&format!("pcmail_reconcile_duration_seconds_count{{reconciler=\"{role}\"}}")).unwrap_or(0.0) as u32
    };
    let counts = || (runs("rebuild-view"), runs("ledger-sync"), runs("auto-execute"));
    eventually(20, "00:01's entries to run", || (counts().0 >= 1 && counts().1 >= 1).then_some(()));
    assert_eq!(counts(), (1, 1, 0), "00:01: the minutely and the daily entry once each");

    // 70 s back (to 23:59:5x the day before), then forward again past 00:01: nothing repeats.
    offset -= 70;
    step_to(&offsets, offset);
    std::thread::sleep(Duration::from_secs(4));
    offset += 70;
    step_to(&offsets, offset);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(counts(), (1, 1, 0), "a step back never repeats an entry");

    // 5 minutes ahead, over 00:02–00:06 and the daily 00:03: each runs once, late.
    offset += 300;
    step_to(&offsets, offset);
    eventually(10, "the stepped-over entries to run", || (counts().0 >= 2 && counts().2 >= 1).then_some(()));
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(counts(), (2, 1, 1), "a step forward over entries runs each once");
}

/// A serve at +3 h (on `store`, when given) claims a job for a worker, and is killed with the
/// worker; back at real time the job is rescued one lease after the restart, not 3 h later.
fn a_job_claimed_at_plus_3h_is_rescued_after_the_clock_went_back(store: &[&str]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).expect("dir");
    std::fs::write(
        manifests.join("jobs.yaml"),
        "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: work}\nspec:\n  command: [/bin/true]\n  mode: heavy\n---\n\
         apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: default}\nspec:\n  workers: 0\n  queues: [q]\n  maxAttempts: 3\n",
    )
    .expect("manifests");
    let offsets = dir.path().join("offset");
    step_to(&offsets, 3 * 3600);
    let env = faked(&offsets);
    let args = [store, &["--lease", "3s", "--resync", "500ms"]].concat();
    let mut s = Server::start_env(Some(manifests), &args, &as_refs(&env));
    eventually(10, "the serve at +3 h to lead", || s.is_leader().then_some(()));
    let job = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work"]));
    let claim = || {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        rt.block_on(async {
            reqwest::Client::new()
                .post(format!("{}/api/v1/jobs/claim", s.url))
                .bearer_auth(s.admin_token())
                .json(&serde_json::json!({"queue": "q", "owner": "gone", "lease": "5s"}))
                .send()
                .await
                .expect("claim")
                .text()
                .await
                .expect("body")
        })
    };
    assert!(claim().contains(&job), "claimed at +3 h");
    s.kill9();
    s.set_env(&[]);
    s.spawn();
    let state = || {
        let jobs = crate::harness::json(s.admin(&["jobs", "list", "-o", "json"]));
        let found = jobs["items"].as_array().and_then(|a| a.iter().find(|j| j["id"] == job.as_str()).cloned());
        found.map(|j| (j["state"].as_str().unwrap_or("").to_string(), j["rescues"].as_u64().unwrap_or(0)))
    };
    let rescued = eventually(25, "the job claimed at +3 h to be rescued", || state().filter(|(_, r)| *r == 1));
    assert_eq!(rescued.0, "queued", "back in the queue for another attempt");
}

#[test]
fn e13_a_job_claimed_at_plus_3h_on_sqlite_is_rescued_one_lease_after_the_restart() {
    a_job_claimed_at_plus_3h_is_rescued_after_the_clock_went_back(&[]);
}

#[test]
fn e13_a_job_claimed_at_plus_3h_on_postgresql_is_rescued_one_lease_after_the_restart() {
    let pg = crate::harness::PgScratch::new();
    a_job_claimed_at_plus_3h_is_rescued_after_the_clock_went_back(&["--store", &pg.url]);
}
