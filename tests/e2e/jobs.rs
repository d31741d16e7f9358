//! DESIGN §8 end to end: enqueue, unique keys, an external worker, fencing after a rescue, and
//! retries until dead.

use crate::harness::*;

fn setup() -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\npayload=$(cat)\ncase \"$payload\" in *fail*) echo \"no good: $payload\" >&2; exit 1;; esac\necho \"did $PCMAIL_JOB_ID with $payload\"\n",
    )
    .expect("script");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let manifests = dir.path().join("m");
    std::fs::create_dir(&manifests).expect("dir");
    std::fs::copy(examples().join("roster.yaml"), manifests.join("roster.yaml")).expect("roster");
    std::fs::write(
        manifests.join("jobs.yaml"),
        format!(
            "apiVersion: pcmail/v1\nkind: Function\nmetadata: {{name: work}}\nspec:\n  command: [{}]\n  mode: heavy\n---\n\
             apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {{name: default}}\nspec:\n  workers: 1\n  queues: [q]\n  maxAttempts: 2\n",
            script.display()
        ),
    )
    .expect("manifests");
    (Server::start_opts(Some(manifests), "127.0.0.1:0", &["--resync", "300ms"]), dir)
}

fn post(s: &Server, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", s.url))
            .bearer_auth(s.admin_token())
            .json(&body)
            .send()
            .await
            .expect("post");
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or_default())
    })
}

fn job(s: &Server, id: &str) -> serde_json::Value {
    let jobs = json(s.admin(&["jobs", "list", "-o", "json"]));
    jobs.as_array().and_then(|a| a.iter().find(|j| j["id"] == id).cloned()).unwrap_or_default()
}

#[test]
fn j6_j7_unique_keys_and_an_external_worker_running_jobs_over_the_api() {
    let (s, _dir) = setup();
    let a = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work", "--payload", "{\"n\": 1}"]));
    let b = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work", "--unique-key", "nightly"]));
    let again = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work", "--unique-key", "nightly"]));
    assert_eq!(b, again, "J6: a live job holding the key answers");
    assert!(a.starts_with("job-") && a != b);
    let out = s.admin(&["worker", "--queue", "q", "--once"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let done = job(&s, &a);
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["result"], format!("did {a} with {{\"n\":1}}"));
    assert_eq!(job(&s, &b)["state"], "succeeded");
    let fresh = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work", "--unique-key", "nightly"]));
    assert_ne!(fresh, b, "a finished job no longer holds its key");
}

#[test]
fn j2_j3_a_worker_whose_lease_was_rescued_can_neither_heartbeat_nor_complete() {
    let (s, _dir) = setup();
    let id = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work"]));
    let (status, claimed) =
        post(&s, "/api/v1/jobs/claim", serde_json::json!({"queue": "q", "owner": "zombie", "lease": "1s"}));
    assert_eq!(status, 200);
    let token = claimed["jobs"][0]["leaseToken"].as_str().expect("token").to_string();
    eventually(15, "the reaper to rescue the lease", || (job(&s, &id)["rescues"] == 1).then_some(()));
    let rescued = job(&s, &id);
    assert_eq!(
        (rescued["state"].as_str(), rescued["attempts"].as_u64()),
        (Some("queued"), Some(1)),
        "J3: the attempt counts"
    );
    for action in ["heartbeat", "complete"] {
        let (status, body) = post(&s, &format!("/api/v1/jobs/{id}/{action}"), serde_json::json!({"token": token}));
        assert_eq!(status, 409, "{action}: {body}");
        assert!(
            body["error"]["message"].as_str().is_some_and(|m| m.contains("not running") || m.contains("taken")),
            "{body}"
        );
    }
    assert_eq!(job(&s, &id)["state"], "queued", "nothing the zombie said was recorded");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let metrics = rt.block_on(async {
        reqwest::get(format!("{}/metrics", s.url)).await.expect("metrics").text().await.expect("text")
    });
    assert!(metrics.contains("pcmail_job_rescues_total{queue=\"q\"} 1"), "J3: rescues are counted");
}

#[test]
fn j4_a_failing_job_retries_with_backoff_then_is_dead() {
    let (s, _dir) = setup();
    let id = ok(s.admin(&["jobs", "enqueue", "--queue", "q", "--function", "work", "--payload", "\"fail\""]));
    let first = s.admin(&["worker", "--queue", "q", "--once"]);
    assert!(first.status.success());
    let after_one = job(&s, &id);
    assert_eq!((after_one["state"].as_str(), after_one["attempts"].as_u64()), (Some("queued"), Some(1)), "{after_one}");
    assert!(after_one["lastError"].as_str().is_some_and(|e| e.contains("no good")), "{after_one}");
    assert!(after_one["runAfter"].as_str() > after_one["createdAt"].as_str(), "backed off");
    eventually(20, "the retry to run and the job to die", || {
        s.admin(&["worker", "--queue", "q", "--once"]);
        (job(&s, &id)["state"] == "dead").then_some(())
    });
    assert_eq!(job(&s, &id)["attempts"], 2, "maxAttempts of the WorkerPool");
    let retried = ok(s.admin(&["jobs", "retry", &id]));
    assert!(retried.ends_with("queued"), "{retried}");
}
