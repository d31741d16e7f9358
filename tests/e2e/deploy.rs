//! `manifests/deploy/`: the systemd unit and the Kubernetes Deployment start `serve` as written,
//! with flags that exist, probes that answer and the metrics port annotated for scraping.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

fn deploy(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/deploy").join(file)).expect(file)
}

/// Every `--flag` of `pcmail-ctl serve --help`.
fn serve_flags() -> Vec<String> {
    let help = ok(Command::new(BIN).args(["serve", "--help"]).output().expect("help"));
    help.split_whitespace().filter(|w| w.starts_with("--")).map(|w| w.trim_end_matches(',').to_string()).collect()
}

#[test]
fn deploy_systemd_unit_runs_serve_with_flags_that_exist() {
    let unit = deploy("pcmail.service");
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("ExecStart");
    let words: Vec<&str> = exec.split_whitespace().collect();
    assert!(words[0].ends_with("/pcmail-ctl") && words[1] == "serve", "{exec}");
    let flags = serve_flags();
    for flag in words.iter().filter(|w| w.starts_with("--")) {
        assert!(flags.iter().any(|f| f == flag), "{flag} is not a flag of serve: {flags:?}");
    }
    assert!(unit.contains("KillSignal=SIGTERM") && unit.contains("Restart=always"));
    // E1: systemd's default soft limit (1,024) would hold fewer connections than serve may.
    let nofile: u64 =
        unit.lines().find_map(|l| l.strip_prefix("LimitNOFILE=")).and_then(|v| v.parse().ok()).expect("LimitNOFILE");
    assert!(nofile >= 2048 + pcmail_core::conns::RESERVED_FDS, "LimitNOFILE={nofile}");
}

#[test]
fn deploy_kubernetes_two_replicas_with_probes_start_serve_on_postgres_as_written() {
    let text = deploy("kubernetes/pcmail.yaml");
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("YAML document"))
        .collect();
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment");
    let service = docs.iter().find(|d| d["kind"] == "Service").expect("a Service");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"];
    assert_eq!(service["spec"]["selector"], pod["metadata"]["labels"], "the Service selects the pods");
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    let port = container["ports"][0]["containerPort"].as_u64().expect("port");
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let store_env = container["env"].as_array().expect("env").iter().find(|e| e["name"] == "PCMAIL_STORE");
    assert!(store_env.is_some(), "the store URL comes from the Secret through PCMAIL_STORE");

    // Run those args, with the pod's paths swapped for a scratch dir and a scratch database.
    let pg = PgScratch::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    std::fs::write(data.join("admin.token"), "pcm_admin_from_the_secret\n").expect("token");
    // O4: the manifests as the kubelet mounts a ConfigMap — a hidden timestamped folder, a
    // `..data` link to it, and a link per file.
    let configmap = dir.path().join("manifests");
    let stamped = configmap.join("..2026_11_30_22_09_00.123456789");
    std::fs::create_dir_all(&stamped).expect("configmap dir");
    std::os::unix::fs::symlink(stamped.file_name().expect("name"), configmap.join("..data")).expect("..data");
    let mut applied = 0;
    for entry in std::fs::read_dir(examples()).expect("examples") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let name = path.file_name().expect("name").to_owned();
            std::fs::copy(&path, stamped.join(&name)).expect("copy");
            std::os::unix::fs::symlink(std::path::Path::new("..data").join(&name), configmap.join(&name))
                .expect("link");
            applied += 1;
        }
    }
    assert!(applied >= 3);
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| match a.as_str().expect("arg") {
            "/var/lib/pcmail" => data.display().to_string(),
            "/etc/pcmail/manifests" => configmap.display().to_string(),
            "0.0.0.0:7420" => "0.0.0.0:0".to_string(),
            other => other.to_string(),
        })
        .collect();
    let mut child = Command::new(BIN)
        .args(&args)
        .env("PCMAIL_STORE", &pg.url)
        .env("PCMAIL_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("address line");
    let port = line.trim().rsplit(':').next().expect("port").to_string();
    let base = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Runtime::new().expect("rt");
    let (health, ready, metrics, specs) = rt.block_on(async {
        let get = |path: &str, token: Option<&str>| {
            let mut r = reqwest::Client::new().get(format!("{base}{path}")).timeout(Duration::from_secs(10));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            r.send()
        };
        let health = get("/healthz", None).await.expect("healthz").status().as_u16();
        let ready = get("/readyz", None).await.expect("readyz").status().as_u16();
        let metrics = get("/metrics", None).await.expect("metrics").text().await.expect("text");
        let specs = get("/api/v1/specs", Some("pcm_admin_from_the_secret")).await.expect("specs").status().as_u16();
        (health, ready, metrics, specs)
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!((health, ready, specs), (200, 200, 200), "probes answer; the Secret's admin token is the admin's");
    assert!(metrics.lines().any(|l| l == "pcmail_leader 1"), "a sole replica leads");
    let stored = pg.query("SELECT count(*) FROM specs");
    assert!(stored[0][0].parse::<u64>().expect("count") >= 3, "the ConfigMap's manifests were applied to PostgreSQL");
}
