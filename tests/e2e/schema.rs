//! DESIGN §18 X2: `pcmail-ctl schema` and `explain`, written from the field table apply
//! validates with, held against a real JSON Schema validator (Python's `jsonschema`, draft
//! 2020-12): the committed `manifests/schema.json`, every manifest under `manifests/`, the
//! README's examples, and the invalid manifests apply refuses — each at the field apply names.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use pcmail_core::manifest::{parse_file, validate_documents};

use crate::harness::*;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn schema_path() -> PathBuf {
    root().join("manifests/schema.json")
}

/// Validates YAML texts with `jsonschema` against `manifests/schema.json`. For each text: the
/// fields its errors are at (`spec.entries[0].maxPerRun`; an unknown or missing key is named
/// itself), or null when the text is no YAML. `fragment` fills in an example's left-out
/// apiVersion, metadata and spec, as the README shows only the fields at hand.
const VALIDATE: &str = r#"
import json, sys, yaml, jsonschema
validator = jsonschema.Draft202012Validator(json.load(open(sys.argv[1])))
fragment = sys.argv[2] == "fragment"
def field(e):
    path = list(e.absolute_path)
    if e.validator == "additionalProperties":
        path += sorted(set(e.instance) - set(e.schema.get("properties", {})))[:1]
    elif e.validator == "required":
        path.append(e.message.split("'")[1])
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + p
    return out
answers = []
for text in json.load(sys.stdin):
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        answers.append(None)
        continue
    fields = []
    for d in docs:
        if fragment and isinstance(d, dict):
            d.setdefault("apiVersion", "pcmail/v1")
            d.setdefault("metadata", {"name": "example"})
            d.setdefault("spec", {})
        fields += [field(e) for e in validator.iter_errors(d)]
    answers.append(sorted(set(fields)))
print(json.dumps(answers))
"#;

fn validate(texts: &[String], fragment: bool) -> Vec<Option<Vec<String>>> {
    jsonschema::check_schema();
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(VALIDATE)
        .arg(schema_path())
        .arg(if fragment { "fragment" } else { "whole" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test installs python3-jsonschema and python3-yaml)");
    child.stdin.take().unwrap().write_all(serde_json::to_string(texts).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the validator: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("the validator's answer")
}

mod jsonschema {
    /// The committed schema is itself a valid draft 2020-12 schema.
    pub fn check_schema() {
        let program =
            "import json, sys, jsonschema\njsonschema.Draft202012Validator.check_schema(json.load(open(sys.argv[1])))";
        let out = std::process::Command::new("python3")
            .args(["-c", program])
            .arg(super::schema_path())
            .output()
            .expect("python3");
        assert!(out.status.success(), "manifests/schema.json is no valid schema: {}", super::stderr(&out));
    }
}

const MODELINE: &str = "# yaml-language-server: $schema=";

/// The pcmail manifests under `manifests/` (a YAML file with a `pcmail/v1` document); the
/// Kubernetes and Prometheus files there are other tools' YAML.
fn manifest_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root().join("manifests")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
                && std::fs::read_to_string(&path).unwrap().lines().any(|l| l.trim() == "apiVersion: pcmail/v1")
            {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn x2_the_committed_schema_is_what_schema_prints() {
    let out = Command::new(BIN).arg("schema").output().unwrap();
    let printed = ok(out);
    let schema: serde_json::Value = serde_json::from_str(&printed).expect("schema prints JSON");
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    if std::env::var("PCMAIL_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::write(schema_path(), &printed).unwrap();
    }
    let committed = std::fs::read_to_string(schema_path()).unwrap_or_default();
    assert!(
        committed == printed,
        "manifests/schema.json is not what `pcmail-ctl schema` prints; run this test with PCMAIL_UPDATE_GOLDEN=1"
    );
}

#[test]
fn x2_every_manifest_begins_with_the_modeline_and_validates() {
    let files = manifest_files();
    assert!(files.len() >= 3, "the examples are found: {files:?}");
    let mut texts = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let first = text.lines().next().unwrap_or_default();
        let target = first.strip_prefix(MODELINE).unwrap_or_else(|| panic!("{}: begins {first:?}", file.display()));
        let named = file.parent().unwrap().join(target);
        assert_eq!(named.canonicalize().ok(), schema_path().canonicalize().ok(), "{}: the modeline", file.display());
        // apply takes them too (parse and every rule of the whole set).
        parse_file(&file.display().to_string(), &text).unwrap_or_else(|e| panic!("{e:?}"));
        texts.push(text);
    }
    for (file, errors) in files.iter().zip(validate(&texts, false)) {
        assert_eq!(errors, Some(vec![]), "{}", file.display());
    }
}

/// The README's ```yaml blocks (indented ones too), each without its indentation.
fn readme_examples() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for line in readme.lines() {
        let indent = line.len() - line.trim_start().len();
        match &mut current {
            None if line.trim() == "```yaml" => current = Some((indent, String::new())),
            None => {}
            Some(_) if line.trim() == "```" => blocks.extend(current.take().map(|(_, b)| b)),
            Some((at, block)) => {
                *block += line.get((*at).min(indent)..).unwrap_or_default();
                block.push('\n');
            }
        }
    }
    blocks
}

#[test]
fn x2_the_readmes_examples_validate() {
    let blocks = readme_examples();
    let kinds: Vec<&String> = blocks.iter().filter(|b| b.contains("kind:")).collect();
    assert!(kinds.len() >= 4, "the README's manifest examples are found: {blocks:?}");
    for (block, errors) in blocks.iter().zip(validate(&blocks, true)) {
        assert_eq!(errors, Some(vec![]), "README example:\n{block}");
    }
}

fn doc(kind: &str, metadata: &str, spec: &str) -> String {
    format!("apiVersion: pcmail/v1\nkind: {kind}\nmetadata: {metadata}\nspec:\n{spec}")
}

/// The invalid manifests of the apply tests (`specs.rs`, `trust.rs` and the validator's unit
/// tests), each with the field apply refuses it at.
fn invalid() -> Vec<(&'static str, String, &'static str)> {
    let m = "{name: x}";
    vec![
        ("unknown kind", "apiVersion: pcmail/v1\nkind: Pod\nmetadata: {name: p}\nspec: {}\n".into(), "kind"),
        (
            "wrong apiVersion",
            "apiVersion: pcmail/v2\nkind: MailPolicy\nmetadata: {name: p}\nspec: {}\n".into(),
            "apiVersion",
        ),
        ("unknown field", doc("MailPolicy", m, "  tll: 1h\n"), "spec.tll"),
        ("bad duration", doc("WorkerPool", m, "  workers: 2\n  leaseDuration: 60 seconds\n"), "spec.leaseDuration"),
        ("bad name", doc("Function", "{name: a.b}", "  command: [x]\n  mode: generate\n"), "metadata.name"),
        (
            "label keys",
            doc("Function", "\n  name: f\n  labels: {\"A B\": c}", "  command: [x]\n  mode: generate\n"),
            "metadata.labels",
        ),
        ("missing field", doc("WorkerPool", m, "  queues: [q]\n"), "spec.workers"),
        ("workers", doc("WorkerPool", m, "  workers: 257\n"), "spec.workers"),
        ("maxAttempts", doc("WorkerPool", m, "  workers: 1\n  maxAttempts: 101\n"), "spec.maxAttempts"),
        ("queue name", doc("WorkerPool", m, "  workers: 1\n  queues: [\"Q/1\"]\n"), "spec.queues[0]"),
        ("maxHop", doc("MailPolicy", m, "  maxHop: 0\n"), "spec.maxHop"),
        ("webhook", doc("MailPolicy", m, "  notify:\n    webhook: ftp://x\n"), "spec.notify.webhook"),
        (
            "format",
            doc("MailPolicy", m, "  notify:\n    webhook: https://x\n    format: teams\n"),
            "spec.notify.format",
        ),
        ("viewCap", doc("Ledger", m, "  project: p\n  viewCap: 0\n"), "spec.viewCap"),
        ("project", doc("Ledger", m, "  project: \"a/b?c#d\"\n"), "spec.project"),
        ("recorders", doc("IntentPolicy", m, "  recorders: [Desk]\n"), "spec.recorders[0]"),
        (
            "rateLimit",
            doc("Function", m, "  command: [echo]\n  mode: generate\n  rateLimit:\n    perMinute: 0\n"),
            "spec.rateLimit.perMinute",
        ),
        ("mode", doc("Function", m, "  command: [echo]\n  mode: x\n"), "spec.mode"),
        ("timeout", doc("Function", m, "  command: [echo]\n  mode: generate\n  timeout: 0s\n"), "spec.timeout"),
        ("NUL in argv", doc("Function", m, "  command: [\"ec\\0ho\"]\n  mode: generate\n"), "spec.command[0]"),
        ("env name", doc("Function", m, "  command: [echo]\n  mode: generate\n  env: {\"A=B\": x}\n"), "spec.env"),
        (
            "time zone",
            doc("Schedule", m, "  timezone: Mars/Olympus\n  entries: [{role: sync, cron: \"0 2 * * *\"}]\n"),
            "spec.timezone",
        ),
        ("no entry", doc("Schedule", m, "  entries: []\n"), "spec.entries"),
        (
            "cron fields",
            doc("Schedule", m, "  entries:\n  - role: sync\n    cron: \"0 2 * *\"\n"),
            "spec.entries[0].cron",
        ),
        ("role", doc("Schedule", m, "  entries:\n  - role: backup\n    cron: \"0 2 * * *\"\n"), "spec.entries[0].role"),
        (
            "maxPerRun",
            doc("Schedule", m, "  entries:\n  - role: sync\n    cron: \"0 2 * * *\"\n    maxPerRun: 0\n"),
            "spec.entries[0].maxPerRun",
        ),
        ("no machine", doc("Roster", m, "  owner: a\n  machines: []\n"), "spec.machines"),
        (
            "machine label",
            doc("Roster", m, "  owner: a\n  machines:\n  - number: 1\n    label: a\n  - number: 2\n    label: B_2\n"),
            "spec.machines[1].label",
        ),
    ]
}

/// The lines apply's error may be on: the field's own key (`spec.machines[1].label`: the
/// second `label:`); for a missing field, its parent's key or the parent mapping's first line
/// (where serde places a missing field).
fn lines_of(text: &str, field: &str) -> Vec<usize> {
    let segments: Vec<&str> = field.split('.').collect();
    let key = |s: &str| s.split('[').next().unwrap_or_default().to_string();
    let index = |s: &str| s.split_once('[').and_then(|(_, i)| i.trim_end_matches(']').parse::<usize>().ok());
    let line = |k: &str, nth: usize| {
        let written = |l: &&str| l.trim_start().trim_start_matches("- ").starts_with(&format!("{k}:"));
        text.lines().enumerate().filter(|(_, l)| written(l)).nth(nth).map(|(i, _)| i + 1)
    };
    let Some((last, parents)) = segments.split_last() else { return vec![] };
    let nth = parents.last().and_then(|p| index(p)).unwrap_or(0);
    match line(&key(last), nth) {
        Some(l) => vec![l],
        None => parents.iter().rev().find_map(|p| line(&key(p), 0)).map_or(vec![], |l| vec![l, l + 1]),
    }
}

#[test]
fn x2_the_schema_refuses_each_invalid_manifest_of_the_apply_tests_at_the_field_apply_names() {
    let cases = invalid();
    let texts: Vec<String> = cases.iter().map(|(_, text, _)| text.clone()).collect();
    for ((what, text, field), schema) in cases.iter().zip(validate(&texts, false)) {
        // apply's parse and validation, as `apply` runs them on the server.
        let errors = match parse_file("m.yaml", text) {
            Ok(docs) => validate_documents(&docs, &[]),
            Err(errors) => errors,
        };
        let lines = lines_of(text, field);
        assert!(
            errors.iter().any(|e| lines.contains(&e.line)),
            "{what}: apply refuses at {field} (line {lines:?}): {errors:?}"
        );
        assert_eq!(schema, Some(vec![field.to_string()]), "{what}: the schema refuses at {field}");
    }
}

/// What no JSON Schema can say — a YAML syntax error, names unique across items, a field
/// naming another, a duration's range, a cron field's values — apply alone refuses; the
/// schema accepts these documents, and an editor shows the rest.
#[test]
fn x2_what_apply_alone_refuses_is_named() {
    let m = "{name: x}";
    let beyond = [
        (
            "bad indentation",
            "apiVersion: pcmail/v1\nkind: Function\nmetadata:\n  name: f\n   mode: x\nspec: {}\n".to_string(),
            None,
        ),
        (
            "duplicate label",
            doc("Roster", m, "  owner: a\n  machines:\n  - {number: 1, label: a}\n  - {number: 2, label: a}\n"),
            Some(vec![]),
        ),
        ("owner not a machine", doc("Roster", m, "  owner: b\n  machines:\n  - {number: 1, label: a}\n"), Some(vec![])),
        ("ttl past 365d", doc("MailPolicy", m, "  ttl: 366d\n"), Some(vec![])),
        ("cron values", doc("Schedule", m, "  entries: [{role: sync, cron: \"99 99 99 99 99\"}]\n"), Some(vec![])),
        ("lease past maxLease", doc("WorkerPool", m, "  workers: 1\n  leaseDuration: 2h\n"), Some(vec![])),
    ];
    let texts: Vec<String> = beyond.iter().map(|(_, t, _)| t.clone()).collect();
    for ((what, text, expected), schema) in beyond.iter().zip(validate(&texts, false)) {
        let refused =
            parse_file("m.yaml", text).map(|docs| validate_documents(&docs, &[])).map_or(true, |e| !e.is_empty());
        assert!(refused, "{what}: apply refuses it");
        assert_eq!(&schema, expected, "{what}");
    }
}

fn explain(path: &str) -> std::process::Output {
    Command::new(BIN).args(["explain", path]).output().unwrap()
}

#[test]
fn x2_explain_workerpool_spec_ratelimit_prints_its_type_default_and_description() {
    let out = ok(explain("workerpool.spec.rateLimit"));
    assert!(out.contains("KIND:     WorkerPool"), "{out}");
    assert!(out.contains("FIELD:    spec.rateLimit <Object>"), "the type: {out}");
    assert!(out.contains("DEFAULT:  none"), "the default: {out}");
    assert!(out.contains("At most perMinute job starts a minute"), "the description: {out}");
    assert!(out.contains("perMinute\t<integer> -required-") && out.contains("(default 1)"), "its fields: {out}");
    let out = ok(explain("WorkerPool.spec.leaseDuration"));
    assert!(out.contains("<duration>") && out.contains("DEFAULT:  60s") && out.contains("ALLOWED:  1s to 1d"), "{out}");
    let out = ok(explain("WORKERPOOLS"));
    for field in ["workers\t<integer> -required-", "queues\t<[]string>", "rateLimit\t<Object>", "maxLease\t<duration>"]
    {
        assert!(out.contains(field), "explain workerpool lists {field}: {out}");
    }
    let out = explain("workerpool.spec.ratelimt");
    assert_eq!(code(&out), 1);
    let err = stderr(&out);
    assert!(err.contains("workerpool.spec has no field \"ratelimt\"") && err.contains("rateLimit"), "{err}");
    let out = explain("pod");
    assert_eq!(code(&out), 1);
    assert!(stderr(&out).contains("known kinds: roster"), "{}", stderr(&out));
}
