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

/// The source of `text` without comments and without the items `#[cfg(test)]` gates: what
/// ships. Answers also the names of test-only file modules it declares (`#[cfg(test)] mod x;`).
fn shipped(text: &str) -> (String, Vec<String>) {
    let code: String = text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let (mut out, mut test_files, mut rest) = (String::new(), Vec::new(), code.as_str());
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let (block, semi) = (item.find('{'), item.find(';'));
        let end = match (block, semi) {
            (Some(b), s) if s.is_none_or(|s| b < s) => {
                let mut depth = 0;
                let close = item[b..].char_indices().find_map(|(i, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    (depth == 0).then_some(b + i + 1)
                });
                close.unwrap_or(item.len())
            }
            (_, Some(s)) => {
                if let Some(name) = item[..s].lines().last().and_then(|l| l.trim().strip_prefix("mod ")) {
                    test_files.push(name.trim().to_string());
                }
                s + 1
            }
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_files)
}

/// The first segment of every `crate::` path in `code`, each name of a `crate::{a, b::c}` group.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let after = &code[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && (c.is_alphanumeric() || c == '_') => {
                        out.push(String::new());
                        start = false;
                        if let Some(last) = out.last_mut() {
                            last.push(c);
                        }
                    }
                    c if !start && depth == 0 && (c.is_alphanumeric() || c == '_') => {
                        if let Some(last) = out.last_mut().filter(|l| !l.contains(':')) {
                            last.push(c);
                        }
                    }
                    ':' if depth == 0 => {
                        if let Some(last) = out.last_mut().filter(|l| !l.contains(':')) {
                            last.push(':');
                        }
                    }
                    c if c.is_whitespace() => {}
                    _ => {}
                }
            }
        } else {
            out.push(ident(after));
        }
    }
    out.into_iter().map(|n| n.trim_end_matches(':').to_string()).filter(|n| !n.is_empty() && n != "self").collect()
}

/// The names the crate root re-exports (`pub use sqlite::{SqliteStore, …}`), by the module
/// they come from: a path through such a name uses that module, not the root.
fn reexports(root_code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for stmt in root_code.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else { continue };
        let Some((module, names)) = path.split_once("::") else { continue };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for name in names.split(',') {
            let name = name.rsplit("::").next().unwrap_or("").trim();
            let alias = name.rsplit(" as ").next().unwrap_or(name).trim();
            if !alias.is_empty() {
                out.push((alias.to_string(), module.trim().to_string()));
            }
        }
    }
    out
}

/// The use graph of a crate's top-level modules, shipped code only: `module → modules it
/// names`. The crate root is `crate`: its `pub use` lines are the crate's face, not uses, but a
/// module naming one of the root's own items depends on the root, and the root's own code on
/// every module it names.
fn module_graph(src: &Path) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    let files: Vec<String> = tree(src).into_iter().filter(|f| f.ends_with(".rs")).collect();
    let module_of = |file: &str| -> String {
        let first = file.split('/').next().unwrap_or(file);
        match first.strip_suffix(".rs") {
            Some("lib" | "main") => "crate".to_string(),
            Some(m) => m.to_string(),
            None => first.to_string(),
        }
    };
    let modules: std::collections::BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let mut test_only: Vec<String> = Vec::new();
    let mut sources = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(src.join(file)).unwrap_or_default();
        let (code, tests) = shipped(&text);
        // A test-only file module lives beside the file that declares it, or in its folder.
        let dir = match file.rsplit_once('/') {
            Some((d, "mod.rs" | "lib.rs" | "main.rs")) => format!("{d}/"),
            None if matches!(file.as_str(), "lib.rs" | "main.rs") => String::new(),
            Some(_) | None => format!("{}/", file.trim_end_matches(".rs")),
        };
        test_only.extend(tests.iter().flat_map(|t| [format!("{dir}{t}.rs"), format!("{dir}{t}/")]));
        sources.push((file.clone(), code));
    }
    let aliases: Vec<(String, String)> =
        sources.iter().filter(|(f, _)| module_of(f) == "crate").flat_map(|(_, code)| reexports(code)).collect();
    let words = |code: &str| -> Vec<String> {
        code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map(|w| w.split("::").next().unwrap_or("").to_string())
            .collect()
    };
    let mut graph: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for (file, code) in sources {
        if test_only.iter().any(|t| file == *t || (t.ends_with('/') && file.starts_with(t.as_str()))) {
            continue;
        }
        let from = module_of(&file);
        let mut names = crate_paths(&code);
        if from == "crate" {
            // The root names its modules, and what it re-exports from them, without `crate::`.
            let own: String = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("#["))
                .collect::<Vec<_>>()
                .join("\n")
                .split(';')
                .filter(|s| {
                    let s = s.trim();
                    let declared = s.trim_start_matches("pub(crate) ").trim_start_matches("pub ").starts_with("mod ");
                    !(declared || s.starts_with("pub use "))
                })
                .collect();
            names
                .extend(words(&own).into_iter().filter(|w| modules.contains(w) || aliases.iter().any(|(a, _)| a == w)));
        } else if !file.contains('/') && code.contains("super::") {
            names.push("crate".into());
        }
        for name in names {
            let to = match aliases.iter().find(|(a, _)| *a == name) {
                Some((_, module)) => module.clone(),
                None if modules.contains(&name) => name,
                None => "crate".to_string(),
            };
            if to != from {
                graph.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// A cycle of `graph`, as the path that closes it, if there is one.
fn find_cycle(graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph.keys().find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn house_the_graph_checker_finds_a_cycle_and_ignores_tests_and_comments() {
    let (code, tests) = shipped(
        "use crate::a; // crate::b\n#[cfg(test)]\nmod fuzz;\n#[cfg(test)]\nmod tests { use crate::c; }\nfn f() { crate::{d, e::f}::g(); }",
    );
    assert_eq!(tests, vec!["fuzz".to_string()]);
    assert_eq!(crate_paths(&code), vec!["a", "d", "e"]);
    let graph = |edges: &[(&str, &str)]| {
        let mut g: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    assert_eq!(find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).map(|c| c.len()), Some(4));
}

/// Issue 21: every crate's top-level modules are layers — none uses a module that uses it
/// back, directly or around a loop — so each can be read knowing only those below it.
#[test]
fn house_no_crate_has_a_module_cycle() {
    let crates = ["src", "crates/core/src", "crates/store/src", "crates/server/src", "crates/agent/src"];
    for src in crates {
        let graph = module_graph(&root().join(src));
        assert!(graph.len() > 1 || src == "src", "{src}: the checker saw no modules at all: {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{src}: the modules {} use each other in a cycle", cycle.join(" → "));
        }
    }
}
