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

// ---- R5: the rules written down (docs/rules.md) ----

/// The rule families DESIGN uses: `M9`, `T14`, `E13` …
const FAMILIES: &str = "MAHILJCPTEOUKVXR";

/// The rule ids `text` cites: `M9` in prose (not `A1:C5`, a sheet range, nor `E2E`), and the ids a
/// test's name starts with (`fn m6_m7_reply_…` cites M6 and M7).
fn cited_ids(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for i in 0..chars.len() {
        if !FAMILIES.contains(chars[i]) || (i > 0 && (ident(chars[i - 1]) || "!:".contains(chars[i - 1]))) {
            continue;
        }
        let digits = chars[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        let after = chars.get(i + 1 + digits).copied();
        let range = after == Some(':') && chars.get(i + 2 + digits).is_some_and(|c| c.is_ascii_uppercase());
        // `P95` and `P99` are percentiles, not performance targets (P1–P14).
        let percentile = chars[i] == 'P' && digits == 2 && chars[i + 1] >= '5';
        if (1..=2).contains(&digits) && !after.is_some_and(ident) && !range && !percentile {
            out.push(chars[i..=i + digits].iter().collect());
        }
    }
    for name in text.split("fn ").skip(1).map(|r| r.split(|c: char| !ident(c)).next().unwrap_or("")) {
        for part in name.split('_') {
            let mut cs = part.chars();
            let Some(f) = cs.next().filter(|f| FAMILIES.contains(f.to_ascii_uppercase()) && f.is_lowercase()) else {
                break;
            };
            let num: String = cs.collect();
            let percentile = f == 'p' && num.len() == 2 && num.as_str() >= "50";
            if num.is_empty() || num.len() > 2 || !num.chars().all(|c| c.is_ascii_digit()) || percentile {
                break;
            }
            out.push(format!("{}{num}", f.to_ascii_uppercase()));
        }
    }
    out
}

/// One entry of docs/rules.md: its id, the tests it names (function, file) and its `Untested:` reason.
struct Entry {
    id: String,
    held_by: Vec<(String, String)>,
    untested: Option<String>,
}

fn rule_entries(doc: &str) -> Vec<Entry> {
    let mut out: Vec<Entry> = Vec::new();
    for line in doc.lines() {
        if let Some(head) = line.strip_prefix("### ") {
            let id = head.split_whitespace().next().unwrap_or("").to_string();
            out.push(Entry { id, held_by: Vec::new(), untested: None });
        } else if let Some(entry) = out.last_mut() {
            if let Some(held) = line.strip_prefix("Held by: ") {
                for named in held.split(';') {
                    let ticks: Vec<&str> = named.split('`').skip(1).step_by(2).collect();
                    if let [name, file, ..] = ticks[..] {
                        entry.held_by.push((name.to_string(), file.to_string()));
                    }
                }
            } else if let Some(why) = line.strip_prefix("Untested: ") {
                entry.untested = Some(why.to_string());
            }
        }
    }
    out
}

#[test]
fn r5_the_rules_checker_reads_citations_and_entries() {
    let cited = cited_ids(
        "/// M9 and T14: see E13's 'A1:C5' E2E P95 (U6) x4\nfn m6_m7_reply_x() {} fn u2_p95_y() {} fn u_ok() {}",
    );
    assert_eq!(cited, ["M9", "T14", "E13", "U6", "M6", "M7", "U2"]);
    let doc = "### M1 — x\n\ntext\n\nHeld by: `a` in `b.rs`; `c` in `d.rs`.\n\n### K6 — y\n\nUntested: not yet.\n";
    let entries = rule_entries(doc);
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0].held_by, [("a".to_string(), "b.rs".to_string()), ("c".to_string(), "d.rs".to_string())]);
    assert_eq!((entries[1].id.as_str(), entries[1].untested.as_deref()), ("K6", Some("not yet.")));
}

/// R5: every id cited in a `.rs` file of the tree has an entry in docs/rules.md, and every entry
/// names tests that exist (`fn NAME` in the file it gives) or says why none holds it yet.
#[test]
fn r5_every_cited_rule_has_an_entry_and_every_entry_a_test() {
    let doc = std::fs::read_to_string(root().join("docs/rules.md")).expect("docs/rules.md");
    let entries = rule_entries(&doc);
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for e in &entries {
        if !seen.insert(e.id.clone()) {
            problems.push(format!("{}: two entries", e.id));
        }
        match (&e.untested, e.held_by.is_empty()) {
            (None, true) => problems.push(format!("{}: names no test and says no `Untested:` reason", e.id)),
            (Some(_), false) => problems.push(format!("{}: both `Held by:` and `Untested:`", e.id)),
            _ => {}
        }
        for (name, file) in &e.held_by {
            let text = std::fs::read_to_string(root().join(file)).unwrap_or_default();
            if ![format!("fn {name}("), format!("fn {name}<")].iter().any(|f| text.contains(f.as_str())) {
                problems.push(format!("{}: no `fn {name}` in {file}", e.id));
            }
        }
    }
    let mut cited: std::collections::BTreeMap<String, String> = Default::default();
    for file in tree(&root()).into_iter().filter(|f| f.ends_with(".rs")) {
        let text = std::fs::read_to_string(root().join(&file)).unwrap_or_default();
        for id in cited_ids(&text) {
            cited.entry(id).or_insert_with(|| file.clone());
        }
    }
    for (id, file) in &cited {
        if !seen.contains(id) {
            problems.push(format!("{id} (cited in {file}): no entry in docs/rules.md"));
        }
    }
    let untested: Vec<String> =
        entries.iter().filter_map(|e| e.untested.as_ref().map(|why| format!("{}: {why}", e.id))).collect();
    println!("{} entries, {} ids cited, {} not yet held by a test:", entries.len(), cited.len(), untested.len());
    for line in &untested {
        println!("  {line}");
    }
    assert!(cited.len() > 100, "the tree cites rule ids ({} found)", cited.len());
    assert!(problems.is_empty(), "docs/rules.md and the tree disagree: {problems:#?}");
}

// ---- R4: no `Result<_, String>`, no function over 80 lines (docs/long-functions.txt) ----

/// `code` with comments, string and char literals and `#[cfg(test)]` items blanked to spaces, line
/// breaks kept, so what is left is shipped code and its line numbers are the file's.
fn blank_non_code(code: &str) -> String {
    blank_code(code, false)
}

/// [`blank_non_code`], or with `keep_strings` the shipped code with its string literals kept
/// (their braces read as parentheses, so only the code's own braces delimit items).
fn blank_code(code: &str, keep_strings: bool) -> String {
    let b: Vec<char> = code.chars().collect();
    let mut out: Vec<char> = b.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(b.len())).skip(from) {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let at = |i: usize, k: usize| b.get(i + k).copied().unwrap_or('\0');
    let unbrace = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(b.len())).skip(from) {
            *c = match *c {
                '{' => '(',
                '}' => ')',
                c => c,
            };
        }
    };
    let mut i = 0;
    while i < b.len() {
        let start = i;
        if b[i] == '/' && at(i, 1) == '/' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if b[i] == '/' && at(i, 1) == '*' {
            i += 2;
            while i < b.len() && !(b[i] == '*' && at(i, 1) == '/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == 'r'
            && (at(i, 1) == '"' || (at(i, 1) == '#' && (at(i, 2) == '"' || at(i, 2) == '#')))
            && (i == 0 || !(b[i - 1].is_alphanumeric() || b[i - 1] == '_'))
        {
            let hashes = b[i + 1..].iter().take_while(|c| **c == '#').count();
            i += 2 + hashes;
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            while i < b.len() && !b[i..].iter().take(close.len()).copied().eq(close.chars()) {
                i += 1;
            }
            i += close.len();
            if keep_strings {
                unbrace(&mut out, start, i);
                continue;
            }
        } else if b[i] == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            if keep_strings {
                unbrace(&mut out, start, i);
                continue;
            }
        } else if b[i] == '\''
            && (at(i, 2) == '\'' || (at(i, 1) == '\\' && b[i + 2..].iter().take(10).any(|c| *c == '\'')))
        {
            i += if at(i, 1) == '\\' { 3 + b[i + 3..].iter().position(|c| *c == '\'').unwrap_or(0) + 1 } else { 3 };
        } else {
            i += 1;
            continue;
        }
        blank(&mut out, start, i);
    }
    // `#[cfg(test)]` items: from the attribute to the end of the item's block (or its `;`).
    let text: String = out.iter().collect();
    let mut cut: Vec<(usize, usize)> = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]").map(|a| a + from) {
        let after = at + "#[cfg(test)]".len();
        let (block, semi) = (text[after..].find('{').map(|b| b + after), text[after..].find(';').map(|s| s + after));
        let end = match (block, semi) {
            (Some(b), s) if s.is_none_or(|s| b < s) => {
                let mut depth = 0i32;
                let start = chars.iter().position(|(o, _)| *o == b).unwrap_or(0);
                chars[start..]
                    .iter()
                    .find_map(|(o, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        (depth == 0).then_some(o + 1)
                    })
                    .unwrap_or(text.len())
            }
            (_, Some(s)) => s + 1,
            _ => text.len(),
        };
        cut.push((at, end));
        from = end;
    }
    let mut kept = text.clone().into_bytes();
    for (a, e) in cut {
        for byte in kept.iter_mut().take(e).skip(a) {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
    }
    String::from_utf8_lossy(&kept).into_owned()
}

/// The shipped Rust files (relative to the root) and their code as [`blank_non_code`] leaves it:
/// `src/` and every `crates/*/src/`, less the file modules `#[cfg(test)]` declares and the
/// store's contract suite (tests every adapter runs, compiled into the crate for its macro).
fn shipped_sources() -> Vec<(String, String)> {
    shipped_sources_as(false)
}

/// [`shipped_sources`], with the string literals kept when `keep_strings`.
fn shipped_sources_as(keep_strings: bool) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dirs = vec!["src".to_string()];
    for krate in ["core", "store", "server", "agent"] {
        dirs.push(format!("crates/{krate}/src"));
    }
    for dir in dirs {
        let files: Vec<String> = tree(&root().join(&dir)).into_iter().filter(|f| f.ends_with(".rs")).collect();
        let mut test_only: Vec<String> = vec!["contract.rs".into()];
        let mut sources = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(root().join(&dir).join(file)).unwrap_or_default();
            let (_, tests) = shipped(&text);
            let sub = match file.rsplit_once('/') {
                Some((d, "mod.rs" | "lib.rs" | "main.rs")) => format!("{d}/"),
                None if matches!(file.as_str(), "lib.rs" | "main.rs") => String::new(),
                Some(_) | None => format!("{}/", file.trim_end_matches(".rs")),
            };
            test_only.extend(tests.iter().flat_map(|t| [format!("{sub}{t}.rs"), format!("{sub}{t}/")]));
            sources.push((file.clone(), text));
        }
        for (file, text) in sources {
            if test_only.iter().any(|t| file == *t || (t.ends_with('/') && file.starts_with(t.as_str()))) {
                continue;
            }
            out.push((format!("{dir}/{file}"), blank_code(&text, keep_strings)));
        }
    }
    out
}

/// Whether a type as written is `String`, by any of its paths.
fn is_string_type(ty: &str) -> bool {
    let ty: String = ty.split_whitespace().collect();
    let ty = ty.trim_start_matches("::");
    ["String", "std::string::String", "alloc::string::String"].contains(&ty)
}

/// The 1-based lines of `code` where a `Result<…, String>` is written (a signature's or an
/// alias's), and a `type Err = String`; `String` by any of its paths.
fn string_results(code: &str) -> Vec<usize> {
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let (mut depth, mut last_arg) = (0i32, at + "Result<".len());
        for (i, c) in code[at + "Result".len()..].char_indices() {
            let i = i + at + "Result".len();
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' if code[..i].ends_with('-') => {}
                '>' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        // `Result<String>` is an alias's success type, not an error.
                        if last_arg > at + "Result<".len() && is_string_type(&code[last_arg..i]) {
                            out.push(line_of(at));
                        }
                        break;
                    }
                }
                ',' if depth == 1 => last_arg = i + 1,
                _ => {}
            }
        }
    }
    for (n, line) in code.lines().enumerate() {
        let squeezed: String = line.split_whitespace().collect::<Vec<_>>().join(" ");
        let err_type = squeezed.split_once("type Err").and_then(|(before, after)| {
            let after = after.trim_start().strip_prefix('=')?;
            let ends_word = before.is_empty() || before.ends_with(|c: char| !c.is_alphanumeric() && c != '_');
            ends_word.then(|| after.split(';').next().unwrap_or(after))
        });
        if err_type.is_some_and(is_string_type) {
            out.push(n + 1);
        }
    }
    out.sort_unstable();
    out
}

/// Every function with a body in `code`: its name, first line and length in lines (from `fn` to
/// its closing brace).
fn function_lengths(code: &str) -> Vec<(String, usize, usize)> {
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut out = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        if code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let (Some(open), semi) = (code[at..].find('{'), code[at..].find(';')) else { continue };
        if name.is_empty() || semi.is_some_and(|s| s < open) {
            continue;
        }
        let mut depth = 0i32;
        let close = code[at + open..].char_indices().find_map(|(i, c)| {
            depth += match c {
                '{' => 1,
                '}' => -1,
                _ => 0,
            };
            (depth == 0).then_some(at + open + i)
        });
        if let Some(close) = close {
            out.push((name, line_of(at), line_of(close) - line_of(at) + 1));
        }
    }
    out
}

#[test]
fn r4_the_scanners_see_code_only() {
    let code = "fn a() -> Result<u8, String> { let s = \"fn b() { Result<u8, String> }\"; '{'; }\n\
                // fn c() -> Result<(), String> {\n\
                fn d(f: impl Fn(u8) -> Result<u8, Box<String>>) -> std::result::Result<Vec<u8>,\n String> {\n}\n\
                #[cfg(test)]\nmod tests {\n    fn e() -> Result<(), String> {\n    }\n}\n";
    let blanked = blank_non_code(code);
    assert_eq!(blanked.lines().count(), code.lines().count());
    assert_eq!(string_results(&blanked), [1, 3]);
    let lengths: Vec<(String, usize, usize)> = function_lengths(&blanked);
    assert_eq!(lengths, [("a".to_string(), 1, 1), ("d".to_string(), 3, 3)]);
}

/// R4: the string-error scanner sees `String` however it is spelled and wherever the error type
/// is declared: a `FromStr`'s `type Err`, a `Result` alias, the full path.
#[test]
fn r4_the_string_error_scanner_sees_every_spelling() {
    let code = "impl FromStr for A {\n    type Err = String;\n}\n\
                impl FromStr for B {\n    type Err=std::string::String;\n}\n\
                type Res<T> = Result<T, String>;\n\
                type Alias<T> = std::result::Result<T, ::std::string::String>;\n\
                fn f() -> Result<(), std::string::String> {}\n\
                fn g() -> Result<(), alloc::string::String> {}\n\
                impl FromStr for C {\n    type Err = StringError;\n}\n\
                type MyErr = String;\n\
                fn h() -> Result<String, MyString> {}\n\
                fn i() -> io::Result<String> {}\n";
    let found = string_results(&blank_non_code(code));
    assert_eq!(found, [2, 5, 7, 8, 9, 10], "{code}");
}

/// R4: no shipped function answers a bare `String` error; each module says what went wrong with
/// its own `thiserror` type. The files that still do are listed with their count in
/// docs/string-errors.txt (`file count`): no file may gain one, and none may be added.
#[test]
fn r4_no_shipped_function_returns_a_string_error() {
    let list = std::fs::read_to_string(root().join("docs/string-errors.txt")).expect("docs/string-errors.txt");
    let allowed: std::collections::BTreeMap<&str, usize> = list
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(' ').map(|(f, n)| (f, n.trim().parse().unwrap_or(0))))
        .collect();
    let (mut problems, mut total) = (Vec::new(), 0);
    for (file, code) in shipped_sources() {
        let found = string_results(&code);
        total += found.len();
        let max = allowed.get(file.as_str()).copied().unwrap_or(0);
        for line in &found {
            println!("{file}:{line}");
        }
        if found.len() > max {
            problems.push(format!("{file}: {} `Result<_, String>` (listed: {max}) at lines {found:?}", found.len()));
        }
    }
    println!("{total} `Result<_, String>` / `type Err = String` left in shipped code");
    assert!(problems.is_empty(), "new `Result<_, String>` in shipped code: {problems:#?}");
}

/// R4: no shipped function over 80 lines. The ones longer today are listed, with their length, in
/// docs/long-functions.txt (`file name lines`): none may be added and none may grow.
#[test]
fn r4_no_shipped_function_grows_past_80_lines() {
    let list = std::fs::read_to_string(root().join("docs/long-functions.txt")).expect("docs/long-functions.txt");
    let mut allowed: std::collections::BTreeMap<(String, String), Vec<usize>> = Default::default();
    for line in list.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [file, name, lines] = parts[..] else {
            panic!("docs/long-functions.txt: `{line}` is not `file name lines`")
        };
        let lines: usize = lines.parse().unwrap_or_else(|_| panic!("docs/long-functions.txt: `{line}`: a line count"));
        allowed.entry((file.to_string(), name.to_string())).or_default().push(lines);
    }
    let mut long: std::collections::BTreeMap<(String, String), Vec<(usize, usize)>> = Default::default();
    for (file, code) in shipped_sources() {
        for (name, at, lines) in function_lengths(&code).into_iter().filter(|f| f.2 > 80) {
            long.entry((file.clone(), name)).or_default().push((lines, at));
        }
    }
    let (mut problems, mut shrank) = (Vec::new(), Vec::new());
    let mut count = 0;
    for ((file, name), mut found) in long {
        found.sort_by(|a, b| b.cmp(a));
        let mut ok = allowed.remove(&(file.clone(), name.clone())).unwrap_or_default();
        ok.sort_by(|a, b| b.cmp(a));
        for (i, (lines, at)) in found.iter().enumerate() {
            count += 1;
            println!("{file}:{at} {name} {lines}");
            match ok.get(i) {
                None => problems.push(format!("{file}:{at} `{name}` is {lines} lines (at most 80)")),
                Some(max) if lines > max => {
                    problems.push(format!("{file}:{at} `{name}` grew to {lines} lines (listed at {max})"))
                }
                Some(max) if lines < max => shrank.push(format!("{file} {name}: {max} → {lines}")),
                Some(_) => {}
            }
        }
    }
    println!(
        "{count} shipped functions over 80 lines; shrank or gone (lower their line in the list): {shrank:?} {:?}",
        allowed.keys().collect::<Vec<_>>()
    );
    assert!(
        problems.is_empty(),
        "functions over 80 lines not in docs/long-functions.txt, or longer than listed: {problems:#?}"
    );
}

// ---- R6: doctests run and the claimed toolchain is the one that builds ----

#[test]
fn r6_the_declared_rust_version_is_the_toolchain_that_builds() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let declared = manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("the workspace declares a rust-version");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc).arg("--version").output().expect("rustc --version");
    let version = String::from_utf8_lossy(&out.stdout).split_whitespace().nth(1).unwrap_or("").to_string();
    let minor: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
    assert_eq!(minor, declared, "Cargo.toml claims rust-version {declared}; this build uses rustc {version}");
    for krate in ["core", "store", "server", "agent"] {
        let text = std::fs::read_to_string(root().join(format!("crates/{krate}/Cargo.toml"))).expect("Cargo.toml");
        assert!(!text.contains("doctest = false"), "crates/{krate} turns doctests off");
    }
}

// ---- V6: the changelog names the release Cargo.toml declares ----

#[test]
fn v6_the_changelogs_newest_release_is_the_declared_version_with_breaking_changes_first() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("the workspace declares a version");
    let changelog = std::fs::read_to_string(root().join("CHANGELOG.md")).expect("CHANGELOG.md");
    let newest = changelog.lines().find(|l| l.starts_with("## [")).expect("CHANGELOG.md names a release");
    assert!(
        newest.starts_with(&format!("## [{version}]")),
        "Cargo.toml is {version}; CHANGELOG.md's newest is {newest:?}"
    );
    let release: Vec<&str> = changelog
        .lines()
        .skip_while(|l| *l != newest)
        .skip(1)
        .take_while(|l| !l.starts_with("## ["))
        .filter(|l| l.starts_with("### "))
        .collect();
    if let Some(breaking) = release.iter().position(|l| *l == "### Breaking") {
        assert_eq!(breaking, 0, "{newest}: Breaking comes first, sections are {release:?}");
    }
}

// ---- R2/R3: no state or kind written out in a query; the store's filters come from the core ----

/// Where `code` writes a model name into a SQL filter by hand (`state IN ('new'`, `kind = 'intent'`):
/// `(line, the filter)`. A filter built from the core (`state IN ({})`, `kind = '{}'`) is not one.
fn sql_name_literals(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    // R1: an event's reason and its object's kind are the core's too (`pcmail_core::trail`).
    for column in ["state", "kind", "reason", "object"] {
        for op in [" IN (", " = ", " != ", " LIKE "] {
            let prefix = format!("{column}{op}");
            for (at, _) in code.match_indices(&prefix) {
                let rest = &code[at + prefix.len()..];
                if rest.starts_with('\'') && rest[1..].starts_with(|c: char| c.is_ascii_alphabetic()) {
                    let line = code[..at].matches('\n').count() + 1;
                    out.push((line, code[at..].chars().take(prefix.len() + 20).collect()));
                }
            }
        }
    }
    out
}

/// Migrations are history: applied once, replayed by the fixture stores (V5), never regenerated.
fn without_migrations(code: &str) -> String {
    let Some(at) = code.find("MIGRATIONS: &[") else { return code.to_string() };
    let end = code[at..].find("\n];").map_or(code.len(), |e| at + e);
    let cut: String = code[at..end].chars().map(|c| if c == '\n' { c } else { ' ' }).collect();
    format!("{}{cut}{}", &code[..at], &code[end..])
}

#[test]
fn r3_the_scanner_finds_a_state_written_into_a_query() {
    let hand = "let q = \"SELECT * FROM mail WHERE state IN ('new', 'seen') AND kind = 'intent'\";";
    let found = sql_name_literals(hand);
    assert_eq!(found.len(), 2, "{found:?}");
    let trail = "\"SELECT 1 FROM events WHERE s.reason = 'Sent' AND d.object LIKE 'mail/%'\"";
    assert_eq!(sql_name_literals(trail).len(), 2, "R1: reasons and object kinds too");
    assert!(sql_name_literals("format!(\"state IN ({}) AND kind = '{}'\", a, b)").is_empty());
    let code = blank_code("const MIGRATIONS: &[&str] = &[\n    \"WHERE state = 'new'\",\n];\nfn f() {}", true);
    assert!(sql_name_literals(&without_migrations(&code)).is_empty());
    let tested = blank_code("#[cfg(test)]\nmod tests { const Q: &str = \"state = 'new'\"; }", true);
    assert!(sql_name_literals(&tested).is_empty(), "tests may write names out");
}

#[test]
fn r3_no_shipped_query_writes_a_state_or_kind_out() {
    let mut found = Vec::new();
    for (file, code) in shipped_sources_as(true) {
        if file.ends_with("/schema.rs") || file.ends_with("/earlier.rs") {
            continue;
        }
        for (line, filter) in sql_name_literals(&without_migrations(&code)) {
            found.push(format!("{file}:{line}: {filter}"));
        }
    }
    assert!(
        found.is_empty(),
        "queries that write a model name out instead of deriving it from the core \
         (crates/store/src/predicates.rs, MailState::open_sql, …): {found:#?}"
    );
}

// ---- R2/R3: a mail state or kind is spelled once, where its enum declares it ----

/// Where `code` spells one of `names` as a literal of its own: a string that is the name
/// (`"seen"`) or quotes it for SQL (`'seen'`), as `(line, the line)`. A variant of an enum's
/// declaration (`Seen = "seen",`, or `Failed => "failed"` in a label list) names a variant of its
/// own enum and is not one; a match arm (`Action::Seen => "seen"`) copies a name and is.
fn model_name_literals(code: &str, names: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        for name in names {
            for quote in ['"', '\''] {
                let literal = format!("{quote}{name}{quote}");
                for (at, _) in line.match_indices(&literal) {
                    if !declares_a_variant(&line[..at]) {
                        out.push((n + 1, line.trim().to_string()));
                    }
                }
            }
        }
    }
    out.dedup();
    out
}

/// Whether `before` (a line up to a literal) ends `Variant =` or `Variant =>`, a bare capitalised
/// name: a variant's own declaration, not a path to one.
fn declares_a_variant(before: &str) -> bool {
    let before = before.trim_end();
    let Some(rest) = before.strip_suffix("=>").or_else(|| before.strip_suffix('=')) else { return false };
    let rest = rest.trim_end();
    let ident: String = rest.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    let ahead = rest[..rest.len() - ident.len()].chars().next_back();
    ident.chars().last().is_some_and(|c| c.is_ascii_uppercase()) && !matches!(ahead, Some(':' | '.'))
}

/// Literals that are another program's words, spelled as that program spells them.
const FOREIGN_WORDS: &[(&str, &str, &str)] = &[
    ("crates/agent/src/hooks.rs", "\"decision\"", "Claude Code's Stop hook answers {\"decision\": \"block\"}"),
    ("crates/agent/src/install.rs", "\"failed\"", "what `systemctl --user is-active` prints"),
];

#[test]
fn r3_the_name_scanner_tells_a_copy_from_a_declaration() {
    let names = ["seen", "new"];
    let copies = "let q = \"state = 'seen'\";\nmatch a { Action::Seen => \"seen\", _ => \"x\" }\nf(\"new\");";
    assert_eq!(model_name_literals(copies, &names).iter().map(|(l, _)| *l).collect::<Vec<_>>(), [1, 2, 3]);
    let declared = "enum A {\n    Seen = \"seen\",\n}\nlabels! { Outcome { New => \"new\", Old => \"old\" } }";
    assert!(model_name_literals(declared, &names).is_empty());
    assert!(model_name_literals("f(\"seen by\"); g(\"renew\"); h(MailState::New)", &names).is_empty());
}

#[test]
fn r3_no_shipped_code_spells_a_mail_state_or_kind_outside_its_declaration() {
    use pcmail_core::mail::{MailKind, MailState};
    let names: Vec<&str> = MailState::NAMES.into_iter().chain(MailKind::NAMES).collect();
    let home = "crates/core/src/mail/mod.rs";
    let mut found = Vec::new();
    for (file, code) in shipped_sources_as(true) {
        // The schemas and migrations are history (V5): applied once, never regenerated; the
        // predicates their indexes were written for are checked against the core by R3's tests.
        if file.ends_with("/schema.rs") || file.ends_with("/earlier.rs") {
            continue;
        }
        for (line, text) in model_name_literals(&without_migrations(&code), &names) {
            let foreign = FOREIGN_WORDS.iter().any(|(f, word, _)| file == *f && text.contains(word));
            let declared_here = file == home && text.starts_with(|c: char| c.is_ascii_uppercase());
            if !foreign && !declared_here {
                found.push(format!("{file}:{line}: {text}"));
            }
        }
    }
    let foreign_seen = FOREIGN_WORDS
        .iter()
        .all(|(f, word, _)| std::fs::read_to_string(root().join(f)).is_ok_and(|t| t.contains(word)));
    assert!(foreign_seen, "an entry of FOREIGN_WORDS no longer names a word in its file: {FOREIGN_WORDS:?}");
    assert!(
        found.is_empty(),
        "mail states and kinds spelled outside {home}'s declaration (use MailState/MailKind's names, \
         as_str or sql_in): {found:#?}"
    );
}
