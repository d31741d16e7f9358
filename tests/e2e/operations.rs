//! DESIGN §14 (O1–O8) end to end: HTTPS with a certificate that is renewed on disk, backups and
//! restores, moving a store between adapters.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::*;

/// A CA of its own in `dir/<name>-ca.pem` (and key), with openssl.
fn ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (dir.join(format!("{name}-ca.pem")), dir.join(format!("{name}-ca.key")));
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        &format!("/CN=pcmail test CA {name}"),
        "-keyout",
        &key.display().to_string(),
        "-out",
        &pem.display().to_string(),
    ]);
    pem
}

/// A server certificate for 127.0.0.2 signed by `ca`, written to `cert` and `key` (replacing
/// them in one rename each, as a renewal does).
fn server_cert(ca: &Path, cert: &Path, key: &Path) {
    let dir = cert.parent().expect("dir");
    let ext = dir.join("san.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.2,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    let (new_key, csr, new_cert) = (dir.join("new.key"), dir.join("new.csr"), dir.join("new.pem"));
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=127.0.0.2",
        "-keyout",
        &new_key.display().to_string(),
        "-out",
        &csr.display().to_string(),
    ]);
    let ca_key = ca.with_extension("key");
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr.display().to_string(),
        "-CA",
        &ca.display().to_string(),
        "-CAkey",
        &ca_key.display().to_string(),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &ext.display().to_string(),
        "-out",
        &new_cert.display().to_string(),
    ]);
    std::fs::rename(&new_key, key).expect("key");
    std::fs::rename(&new_cert, cert).expect("cert");
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CLI verb against `url` as `token`, trusting `ca` (or only the system's roots).
fn client(url: &str, token: &str, home: &Path, ca: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env("PCMAIL_SERVER", url).env("PCMAIL_TOKEN", token).env("PCMAIL_HOME", home);
    match ca {
        Some(ca) => cmd.env("PCMAIL_CA", ca),
        None => cmd.env_remove("PCMAIL_CA"),
    };
    cmd.output().expect("pcmail-ctl")
}

#[test]
fn o1_serve_over_https_logins_with_ca_refuses_an_untrusting_client_and_serves_a_renewed_certificate() {
    let pki = tempfile::tempdir().expect("tempdir");
    let (ca_a, ca_b) = (ca(pki.path(), "a"), ca(pki.path(), "b"));
    let (cert, key) = (pki.path().join("server.pem"), pki.path().join("server.key"));
    server_cert(&ca_a, &cert, &key);
    let s = Server::start_tls(&format!("127.0.0.2:{}", free_port()), &cert, &key, &ca_a);
    assert!(s.url.starts_with("https://127.0.0.2:"), "{}", s.url);
    let (desk, laptop) = (s.token("desk"), s.token("laptop"));

    // The laptop logs in with the CA once; afterwards it needs nothing else.
    ok(s.ctl(&laptop, &["login", "--server", &s.url, "--token", &laptop, "--ca", &ca_a.display().to_string()]));
    let id = ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "over TLS", "--body", "b"]));
    let waiting = {
        let (url, desk, ca, home) = (s.url.clone(), desk.clone(), ca_a.clone(), s.home_of(&desk));
        let id = id.clone();
        std::thread::spawn(move || {
            client(&url, &desk, &home, Some(&ca), &["status", &id, "--wait-for", "seen", "--timeout", "20s"])
        })
    };
    let laptop_home = s.home_of(&laptop);
    let poll = Command::new(BIN)
        .args(["poll"])
        .env("PCMAIL_HOME", &laptop_home)
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .env_remove("PCMAIL_CA")
        .output()
        .expect("poll");
    assert!(poll.status.success(), "{}", stderr(&poll));
    let read = Command::new(BIN)
        .args(["read", &id])
        .env("PCMAIL_HOME", &laptop_home)
        .env_remove("PCMAIL_SERVER")
        .env_remove("PCMAIL_TOKEN")
        .env_remove("PCMAIL_CA")
        .output()
        .expect("read");
    assert!(read.status.success() && stdout(&read).contains("over TLS"), "{}", stderr(&read));
    let waited = waiting.join().expect("wait");
    assert!(waited.status.success(), "status --wait-for seen over HTTPS: {}", stderr(&waited));

    // A client that does not trust the server's CA is refused, and told what to do.
    let stranger = tempfile::tempdir().expect("home");
    let refused = client(&s.url, &desk, stranger.path(), None, &["inbox"]);
    assert!(!refused.status.success());
    let why = stderr(&refused);
    assert!(why.contains("does not trust") && why.contains("--ca"), "{why}");

    // The certificate is renewed on disk (by another CA): served without a restart.
    server_cert(&ca_b, &cert, &key);
    let renewed = eventually(15, "the renewed certificate to be served", || {
        let out = client(&s.url, &desk, stranger.path(), Some(&ca_b), &["inbox", "-o", "json"]);
        out.status.success().then_some(out)
    });
    assert!(stdout(&renewed).starts_with('['));
    let old = client(&s.url, &desk, stranger.path(), Some(&ca_a), &["inbox"]);
    assert!(!old.status.success() && stderr(&old).contains("does not trust"), "the old certificate is gone");
}
