//! Faults under the store: `serve` killed in the middle of a burst of sends, and the disk under
//! its data dir filling up. An acknowledged write is never lost, nothing is half-written, the
//! API says 503 with the reason, and it recovers by itself.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::*;

/// What the sends of a burst were told: the ids acknowledged, and how many got no answer.
#[derive(Default)]
struct Burst {
    acked: Vec<String>,
    unanswered: usize,
}

/// `senders` tasks sending as fast as they can to `laptop` until `stop` says so.
fn burst(
    url: &str,
    token: &str,
    senders: usize,
    body: usize,
    stop: Arc<Mutex<bool>>,
) -> std::thread::JoinHandle<Burst> {
    let (url, token) = (url.to_string(), token.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        rt.block_on(async {
            let out = Arc::new(Mutex::new(Burst::default()));
            let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
            let mut tasks = Vec::new();
            for _ in 0..senders {
                let (url, token, out, client, stop) =
                    (url.clone(), token.clone(), out.clone(), client.clone(), stop.clone());
                tasks.push(tokio::spawn(async move {
                    while !*stop.lock().expect("lock") {
                        let sent = client
                            .post(format!("{url}/api/v1/mail"))
                            .bearer_auth(&token)
                            .json(&serde_json::json!({"to": "laptop", "subject": "burst", "body": "x".repeat(body)}))
                            .send()
                            .await;
                        match sent {
                            Ok(r) if r.status().is_success() => {
                                let v: serde_json::Value = r.json().await.unwrap_or_default();
                                out.lock().expect("lock").acked.push(v["id"].as_str().unwrap_or_default().to_string());
                            }
                            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                            Err(_) => {
                                out.lock().expect("lock").unanswered += 1;
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            let mut out = out.lock().expect("lock");
            std::mem::take(&mut *out)
        })
    })
}

/// SQLite's own check of the file, and the trigger-kept counts against the rows.
fn integrity(db: &Path) -> (String, i64, i64) {
    let conn = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("db");
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).expect("check");
    let rows: i64 = conn.query_row("SELECT count(*) FROM mail", [], |r| r.get(0)).expect("count");
    let counted: i64 = conn.query_row("SELECT coalesce(sum(n), 0) FROM mail_counts", [], |r| r.get(0)).expect("sum");
    (check, rows, counted)
}

#[test]
fn fault_sigkill_in_a_burst_of_sends_keeps_every_acknowledged_send_and_half_writes_nothing() {
    let mut s = Server::start();
    let desk = s.token("desk");
    let stop = Arc::new(Mutex::new(false));
    let senders = burst(&s.url, &desk, 8, 200, stop.clone());
    std::thread::sleep(Duration::from_millis(1500));
    s.kill9();
    *stop.lock().expect("lock") = true;
    let burst = senders.join().expect("senders");
    s.spawn();
    assert!(burst.acked.len() > 20, "the burst was under way: {} acknowledged", burst.acked.len());
    let db = s.dir.path().join("data/pcmail.db");
    let conn = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("db");
    let mut stmt = conn.prepare("SELECT id FROM mail").expect("query");
    let stored: std::collections::BTreeSet<String> =
        stmt.query_map([], |r| r.get(0)).expect("rows").map(|r| r.expect("row")).collect();
    for id in &burst.acked {
        assert!(stored.contains(id), "{id} was acknowledged before the kill and is gone");
    }
    let (check, rows, counted) = integrity(&db);
    assert_eq!(check, "ok");
    assert_eq!(rows, counted, "counts kept by triggers match the rows: nothing half-written");
    eprintln!(
        "fault: {} sends acknowledged, {} cut by the kill, all {} kept",
        burst.acked.len(),
        burst.unanswered,
        stored.len()
    );
}

/// A `serve` started by hand, killed when the test ends however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A small tmpfs of its own under the data dir, unmounted when the test ends.
pub struct SmallDisk(pub PathBuf);

impl SmallDisk {
    pub fn mount(at: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(at).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("mount (this machine kind runs tests as root)");
        assert!(status.success(), "mounting a {size} tmpfs at {} failed", at.display());
        SmallDisk(at.to_path_buf())
    }

    pub fn remount(&self, options: &str) {
        let status = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .expect("remount");
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn send(url: &str, token: &str, body: usize) -> (u16, String) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{url}/api/v1/mail"))
            .bearer_auth(token)
            .json(&serde_json::json!({"to": "laptop", "subject": "disk", "body": "y".repeat(body)}))
            .send()
            .await
            .expect("send");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    })
}

#[test]
fn fault_a_full_disk_answers_503_naming_it_corrupts_nothing_and_recovers_when_space_returns() {
    let root = tempfile::tempdir().expect("tempdir");
    let disk = SmallDisk::mount(&root.path().join("small"), "3m");
    let data = disk.0.join("data");
    let mut serve = KillOnDrop(
        std::process::Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--apply"])
            .arg(examples())
            .arg("--data-dir")
            .arg(&data)
            .env("PCMAIL_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("serve"),
    );
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(serve.0.stdout.take().expect("stdout")), &mut line)
        .expect("address");
    let s_url = line.trim().rsplit(' ').next().expect("url").to_string();
    let admin = std::fs::read_to_string(data.join("admin.token")).expect("token").trim().to_string();
    let issue = |machine: &str| -> String {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        rt.block_on(async {
            let v: serde_json::Value = reqwest::Client::new()
                .post(format!("{s_url}/api/v1/tokens"))
                .bearer_auth(&admin)
                .json(&serde_json::json!({"machine": machine}))
                .send()
                .await
                .expect("issue")
                .json()
                .await
                .expect("json");
            v["token"].as_str().expect("token").to_string()
        })
    };
    let desk = issue("desk");

    // Fill the disk: 60 KiB bodies until the store refuses.
    let mut acked = Vec::new();
    let refusal = loop {
        let (status, body) = send(&s_url, &desk, 60 * 1024);
        match status {
            200 | 201 => acked.push(serde_json::from_str::<serde_json::Value>(&body).expect("json")["id"].to_string()),
            _ => break (status, body),
        }
        assert!(acked.len() < 200, "a 3 MiB disk took 12 MiB of mail");
    };
    assert_eq!(refusal.0, 503, "{}", refusal.1);
    assert!(refusal.1.contains("full"), "the reason is named: {}", refusal.1);
    let (status, _) = get(&s_url, "/healthz");
    assert_eq!(status, 200, "serve keeps answering");

    // Space returns: the next send succeeds without a restart.
    disk.remount("size=64m");
    let (status, body) = send(&s_url, &desk, 1024);
    assert!(status < 300, "after space returned: {status} {body}");

    drop(serve);
    let (check, rows, counted) = integrity(&data.join("pcmail.db"));
    assert_eq!(check, "ok", "the file is sound");
    assert_eq!(rows, counted);
    assert_eq!(rows as usize, acked.len() + 1, "every acknowledged send and nothing else");
    eprintln!("fault: {} sends filled a 3 MiB disk; refused with: {}", acked.len(), refusal.1);
}

fn get(base: &str, path: &str) -> (u16, String) {
    let rt = tokio::runtime::Runtime::new().expect("rt");
    rt.block_on(async {
        let r = reqwest::get(format!("{base}{path}")).await.expect("get");
        (r.status().as_u16(), r.text().await.unwrap_or_default())
    })
}
