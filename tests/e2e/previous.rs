//! The previous release's `pcmail-ctl`, built from its commit for the tests that run two
//! releases side by side (V1, V2, V5). Built once into `target/previous/` (the sources
//! extracted there by `git archive`, `target/previous/` their `CARGO_TARGET_DIR`, so a second
//! run reuses every compiled crate) and cached as `target/previous/pcmail-ctl-VERSION`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The previous release: its version and the commit that is it (the parent of the commit that
/// bumped `Cargo.toml` to this release).
pub const RELEASE: &str = "0.1.0";
pub const COMMIT: &str = "16e3ba3^";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// This build's `target/` (the test binary's `pcmail-ctl` is `target/debug/pcmail-ctl`).
fn target() -> PathBuf {
    let bin = Path::new(crate::harness::BIN);
    bin.parent().and_then(Path::parent).map_or_else(|| repo().join("target"), Path::to_path_buf)
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn build() -> PathBuf {
    let dir = target().join("previous");
    let cached = dir.join(format!("pcmail-ctl-{RELEASE}"));
    if cached.exists() {
        return cached;
    }
    let known = Command::new("git")
        .args(["cat-file", "-e", &format!("{COMMIT}{{commit}}")])
        .current_dir(repo())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        known,
        "THE PREVIOUS RELEASE ({RELEASE}) CANNOT BE BUILT: its commit {COMMIT} is not in this clone's history \
         (a shallow clone?). Fetch the whole history (`git fetch --unshallow`) or put a {RELEASE} binary at {}",
        cached.display()
    );
    let src = dir.join(format!("src-{RELEASE}"));
    if !src.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&src).expect("target/previous");
        let tar = dir.join(format!("src-{RELEASE}.tar"));
        run(
            Command::new("git").args(["archive", "-o"]).arg(&tar).arg(COMMIT).current_dir(repo()),
            "git archive of the previous release",
        );
        run(Command::new("tar").arg("-xf").arg(&tar).arg("-C").arg(&src), "extracting the previous release");
        let _ = std::fs::remove_file(&tar);
    }
    let started = std::time::Instant::now();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    // Not the variables `cargo test` gives this process (a crate's CARGO_PKG_*): the build sees
    // what one from a shell sees, so either reuses the other's crates.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| (k.starts_with("CARGO_") && k != "CARGO_HOME") || k == "OUT_DIR") {
            build.env_remove(k);
        }
    }
    run(
        build
            .args(["build", "--locked", "--bin", "pcmail-ctl"])
            .env("CARGO_TARGET_DIR", &dir)
            .env_remove("RUSTC_WRAPPER")
            .current_dir(&src),
        &format!("cargo build of the previous release ({RELEASE}, {COMMIT})"),
    );
    eprintln!("V5: the previous release ({RELEASE}) built in {:?}", started.elapsed());
    std::fs::copy(dir.join("debug/pcmail-ctl"), &cached).expect("cache the previous release's binary");
    cached
}

/// The previous release's `pcmail-ctl`, built on first use (minutes on a fresh machine);
/// `PCMAIL_PREVIOUS_BIN` names another build to use instead (one of an earlier commit).
pub fn binary() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| std::env::var_os("PCMAIL_PREVIOUS_BIN").map_or_else(build, PathBuf::from)).clone()
}

/// The release [`binary`] says it is (`pcmail-ctl --version`).
pub fn release() -> String {
    let out = Command::new(binary()).arg("--version").output().expect("the previous release runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).unwrap_or_else(|| panic!("a version in {text:?}")).to_string()
}
