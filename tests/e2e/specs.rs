//! DESIGN §3: apply (all or nothing, with file:line:column errors), diff, get, describe, delete.

use std::path::Path;

use crate::harness::*;

const GOOD_POLICY: &str = "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata:\n  name: default\nspec:\n  ttl: 24h\n";

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write manifest");
    p.display().to_string()
}

fn objects(s: &Server, kind: &str) -> serde_json::Value {
    json(s.admin(&["get", kind, "-o", "json"]))["items"].clone()
}

#[test]
fn apply_reports_created_configured_unchanged_and_generation_follows_spec() {
    let s = Server::start_with(None);
    let f = write(s.dir.path(), "p.yaml", GOOD_POLICY);
    assert_eq!(ok(s.admin(&["apply", "-f", &f])), "mailpolicy/default created");
    assert_eq!(ok(s.admin(&["apply", "-f", &f])), "mailpolicy/default unchanged");
    let obj = json(s.admin(&["get", "mailpolicy", "default", "-o", "json"]));
    assert_eq!(
        (obj["metadata"]["generation"].as_u64(), obj["status"]["observedGeneration"].as_u64()),
        (Some(1), Some(1))
    );

    write(s.dir.path(), "p.yaml", &GOOD_POLICY.replace("24h", "48h"));
    assert_eq!(ok(s.admin(&["apply", "-f", &f])), "mailpolicy/default configured");
    let obj = json(s.admin(&["get", "mailpolicy", "default", "-o", "json"]));
    assert_eq!(
        (obj["metadata"]["generation"].as_u64(), obj["status"]["observedGeneration"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(obj["spec"]["ttl"], "2d");
    assert_eq!(obj["status"]["conditions"][0]["type"], "Ready");

    // `get -o yaml` output applies back unchanged.
    let yaml = ok(s.admin(&["get", "mailpolicy", "default", "-o", "yaml"]));
    let back = write(s.dir.path(), "back.yaml", &yaml);
    assert_eq!(ok(s.admin(&["apply", "-f", &back])), "mailpolicy/default unchanged");
}

#[test]
fn dry_run_and_diff_change_nothing_and_diff_exits_0_1_or_2() {
    let s = Server::start();
    let examples = examples().display().to_string();
    let out = s.admin(&["diff", "-f", &examples]);
    assert_eq!(code(&out), 0, "examples are applied: {}", stdout(&out));

    let f = write(s.dir.path(), "p.yaml", &GOOD_POLICY.replace("default", "other"));
    let out = s.admin(&["apply", "-f", &f, "--dry-run"]);
    assert_eq!(code(&out), 1, "a second MailPolicy is refused even in a dry run: {}", stderr(&out));

    let g = write(
        s.dir.path(),
        "g.yaml",
        "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: default}\nspec: {ttl: 1h}\n",
    );
    assert_eq!(ok(s.admin(&["apply", "-f", &g, "--dry-run"])), "mailpolicy/default configured (dry run)");
    let out = s.admin(&["diff", "-f", &g]);
    assert_eq!(code(&out), 1);
    assert!(stdout(&out).contains("- ttl: 3d") && stdout(&out).contains("+ ttl: 1h"), "{}", stdout(&out));
    assert_eq!(objects(&s, "mailpolicy")[0]["spec"]["ttl"], "3d", "neither dry run nor diff applied");

    let broken = write(s.dir.path(), "b.yaml", "kind: [\n");
    assert_eq!(code(&s.admin(&["diff", "-f", &broken])), 2);
}

/// Each malformed manifest sits after a good document in the same file: nothing is applied.
#[test]
fn malformed_manifests_exit_1_name_file_line_column_and_apply_nothing() {
    let s = Server::start_with(None);
    let cases = [
        (
            "bad indentation",
            "apiVersion: pcmail/v1\nkind: Function\nmetadata:\n  name: f\n   mode: x\nspec: {}\n",
            ":12:8:",
        ),
        ("unknown kind", "apiVersion: pcmail/v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n", ":9:7:"),
        ("unknown field", "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: x}\nspec:\n  tll: 1h\n", ":12:3:"),
        (
            "bad duration",
            "apiVersion: pcmail/v1\nkind: WorkerPool\nmetadata: {name: w}\nspec:\n  workers: 2\n  leaseDuration: 60 seconds\n",
            ":13:18:",
        ),
        (
            "duplicate label",
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {name: r}\nspec:\n  owner: a\n  machines:\n  - {number: 1, label: a}\n  - {number: 2, label: a}\n",
            ":15:24:",
        ),
    ];
    for (what, bad, position) in cases {
        let f = write(s.dir.path(), "m.yaml", &format!("{GOOD_POLICY}---\n{bad}"));
        let out = s.admin(&["apply", "-f", &f]);
        assert_eq!(code(&out), 1, "{what}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(&format!("{f}{position}")), "{what}: expected {f}{position} in {err}");
        assert_eq!(
            objects(&s, "mailpolicy").as_array().map(Vec::len),
            Some(0),
            "{what}: the good document was applied"
        );
    }
}

#[test]
fn describe_shows_status_and_events_and_delete_removes() {
    let s = Server::start();
    let out = ok(s.admin(&["describe", "roster", "office"]));
    assert!(out.contains("observedGeneration: 1") && out.contains("Created"), "{out}");
    // The example pool asks for 2 workers; its status says when they run.
    eventually(10, "the pool to converge", || {
        let table = ok(s.admin(&["get", "workerpools"]));
        table.lines().any(|l| l.starts_with("default") && l.contains("True") && l.contains("Converged")).then_some(())
    });
    let pool = json(s.admin(&["get", "workerpool", "default", "-o", "json"]));
    assert_eq!(
        (pool["status"]["desiredWorkers"].as_u64(), pool["status"]["readyWorkers"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(ok(s.admin(&["delete", "workerpool", "default"])), "workerpool/default deleted");
    assert_eq!(objects(&s, "workerpool").as_array().map(Vec::len), Some(0));
    let out = s.admin(&["delete", "workerpool", "default"]);
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("workerpool/default not found"), "{}", stderr(&out));
}

#[test]
fn serve_apply_at_start_is_the_same_path_as_apply_later() {
    let mut s = Server::start();
    let before = objects(&s, "roster");
    s.restart();
    let after = objects(&s, "roster");
    assert_eq!(
        before[0]["metadata"]["generation"], after[0]["metadata"]["generation"],
        "re-applying at start is unchanged"
    );
    assert_eq!(after[0]["status"]["observedGeneration"], 1);
}
