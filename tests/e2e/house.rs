//! The house rules of the source tree itself (issue "house"): ARCHITECTURE.md's code map names
//! only files that exist, and no crate declares a dependency its sources never use.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file and directory under `dir` (build output and VCS data left out), relative to it,
/// directories with a trailing `/`.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if name == "target" || name == ".git" || name == "node_modules" {
                continue;
            }
            let rel = path.strip_prefix(dir).map(|p| p.to_string_lossy().to_string()).unwrap_or_default();
            if path.is_dir() {
                out.push(format!("{rel}/"));
                todo.push(path);
            } else {
                out.push(rel);
            }
        }
    }
    out
}

/// The backticked names in `text` that look like a path of the tree: `jobs.rs`, `mail/`,
/// `controller/pools.rs`.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.ends_with(".rs") || (t.ends_with('/') && t.len() > 1))
        .filter(|t| t.chars().all(|c| c.is_ascii_alphanumeric() || "_-./".contains(c)))
        .map(String::from)
        .collect()
}

#[test]
fn house_architecture_code_map_names_only_files_that_exist() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let map = text.split("## Code map").nth(1).and_then(|t| t.split("\n## ").next()).expect("a code map section");
    let mut missing = Vec::new();
    let mut checked = 0;
    let mut base = root();
    let mut files = tree(&base);
    for line in map.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            // A section about one crate resolves names inside it; any other, in the whole tree.
            base = match heading.strip_prefix("`crates/").and_then(|h| h.split('`').next()) {
                Some(krate) => root().join("crates").join(krate),
                None => root(),
            };
            files = tree(&base);
            continue;
        }
        // Build output (`target/…`) is made by the tests, not kept in the tree.
        for name in named_paths(line).into_iter().filter(|n| !n.starts_with("target/")) {
            checked += 1;
            let found = files.iter().any(|f| f == &name || f.ends_with(&format!("/{name}")));
            if !found {
                missing.push(format!("{name} (under {})", base.strip_prefix(root()).unwrap_or(&base).display()));
            }
        }
    }
    assert!(checked > 100, "the code map names files ({checked} checked)");
    assert!(missing.is_empty(), "ARCHITECTURE.md's code map names what the tree does not hold: {missing:#?}");
}

/// The dependency names of one `[…dependencies]` table in a Cargo.toml.
fn dependencies(manifest: &str, table: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            // `[dependencies]` and `[target.'cfg(unix)'.dependencies]`, not the workspace's table.
            inside =
                line == format!("[{table}]") || (line.starts_with("[target.") && line.ends_with(&format!(".{table}]")));
            continue;
        }
        if inside
            && !line.is_empty()
            && !line.starts_with('#')
            && let Some(name) = line.split(['=', '.', ' ']).next()
        {
            out.push(name.to_string());
        }
    }
    out
}

/// Whether any Rust file under `dirs` names the crate `dep` in code.
fn used(dirs: &[PathBuf], dep: &str) -> bool {
    let ident = dep.replace('-', "_");
    let uses = [format!("{ident}::"), format!("use {ident}"), format!("{ident}!")];
    dirs.iter().any(|dir| {
        tree(dir).iter().filter(|f| f.ends_with(".rs")).any(|f| {
            let text = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            uses.iter().any(|u| text.contains(u.as_str()))
        })
    })
}

#[test]
fn house_no_crate_declares_a_dependency_its_sources_never_use() {
    let mut unused = Vec::new();
    let crates = ["", "crates/core", "crates/store", "crates/server", "crates/agent"];
    for krate in crates {
        let dir = root().join(krate);
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
        let normal: Vec<String> =
            dependencies(&manifest, "dependencies").into_iter().filter(|d| !d.starts_with("target")).collect();
        let sources = [dir.join("src")];
        for dep in &normal {
            if !used(&sources, dep) {
                unused.push(format!("{krate}: {dep}"));
            }
        }
        // Tests and benches may use the library's own dependencies; a dev-dependency that
        // repeats one only adds features.
        let everywhere = [dir.join("src"), dir.join("tests"), dir.join("benches")];
        for dep in dependencies(&manifest, "dev-dependencies").iter().filter(|d| !normal.contains(d)) {
            if !used(&everywhere, dep) {
                unused.push(format!("{krate} (dev): {dep}"));
            }
        }
    }
    assert!(unused.is_empty(), "declared but never used: {unused:#?}");
}

#[test]
fn house_the_pc_side_builds_the_store_with_sqlite_alone() {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["tree", "-p", "pcmail-agent", "-e", "normal", "--prefix", "none", "--offline"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.lines().any(|l| l.starts_with("rusqlite ")), "the cache's SQLite is there:\n{tree}");
    for server_only in ["tokio-postgres ", "governor ", "backon "] {
        assert!(!tree.lines().any(|l| l.starts_with(server_only)), "the PC side builds {server_only}");
    }
}
