//! YAML text → typed documents, with every error placed at file:line:column.
//!
//! Each document is deserialized straight into its kind's struct (never through a generic
//! `Value`), because only then does serde_yaml_ng know where an unknown field or a bad duration
//! sits in the text.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny};

use super::{API_VERSION, Kind, Spec};

/// One parsed object and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub file: String,
    /// 1-based line of the document's first line in `file`.
    pub line: usize,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub spec: Spec,
    /// The document's own text, padded so that its line numbers are the file's.
    pub(super) text: String,
}

impl Document {
    pub fn kind(&self) -> Kind {
        self.spec.kind()
    }

    /// An error placed at the `nth` (from 0) whole-word, case-insensitive occurrence of
    /// `needle` in this document, else at the document's start.
    pub fn error_at(&self, needle: &str, nth: usize, message: String) -> ManifestError {
        self.error_in("", needle, nth, message)
    }

    /// As [`Document::error_at`], counting only occurrences after the first line containing
    /// `section` (e.g. `machines:`), so that a name mentioned earlier does not shift the count.
    pub fn error_in(&self, section: &str, needle: &str, nth: usize, message: String) -> ManifestError {
        let skip = self.text.lines().position(|l| l.contains(section)).unwrap_or(0);
        let found = self
            .text
            .lines()
            .enumerate()
            .skip(skip)
            .flat_map(|(i, l)| word_matches(l, needle).map(move |c| (i, c)))
            .nth(nth);
        let (line, column) = found.map_or((self.line, 1), |(i, c)| (i + 1, c + 1));
        ManifestError { file: self.file.clone(), line, column, message }
    }
}

/// Byte offsets where `needle` occurs in `line` as a whole word, ignoring ASCII case.
fn word_matches<'a>(line: &'a str, needle: &'a str) -> impl Iterator<Item = usize> + 'a {
    let hay = line.to_ascii_lowercase();
    let pat = needle.to_ascii_lowercase();
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || "-_.".contains(c));
    let starts: Vec<usize> = if pat.is_empty() {
        Vec::new()
    } else {
        hay.match_indices(&pat)
            .map(|(i, _)| i)
            .filter(|&i| !is_word(hay[..i].chars().next_back()) && !is_word(hay[i + pat.len()..].chars().next()))
            .collect()
    };
    starts.into_iter()
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ManifestError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw<S> {
    api_version: String,
    #[allow(dead_code)] // read once as a Value to pick the spec type
    kind: String,
    metadata: Metadata,
    spec: S,
    /// Accepted and ignored, so that `get -o yaml` output can be applied back.
    #[serde(default)]
    #[allow(dead_code)]
    status: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Metadata {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    #[allow(dead_code)]
    generation: Option<IgnoredAny>,
    #[serde(default)]
    #[allow(dead_code)]
    creation_timestamp: Option<IgnoredAny>,
}

/// Parses every document of one file. Empty documents (only comments or blank) are skipped.
pub fn parse_file(file: &str, text: &str) -> Result<Vec<Document>, Vec<ManifestError>> {
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for (start, chunk) in split_documents(text) {
        match parse_document(file, start, &chunk) {
            Ok(Some(doc)) => docs.push(doc),
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(docs) } else { Err(errors) }
}

/// Splits on `---` lines. Each chunk is padded with the newlines before it, so that the
/// positions serde_yaml_ng reports inside a chunk are positions in the whole file.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let is_separator = line.starts_with("---") && line[3..].chars().next().is_none_or(char::is_whitespace);
        if is_separator {
            chunks.push((start, std::mem::take(&mut current)));
            current = "\n".repeat(i + 1);
            start = i + 2;
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    chunks.push((start, current));
    chunks
}

fn parse_document(file: &str, start: usize, chunk: &str) -> Result<Option<Document>, ManifestError> {
    let at =
        |line: usize, column: usize, message: String| ManifestError { file: file.to_string(), line, column, message };
    let yaml_err = |e: serde_yaml_ng::Error| {
        let (line, column) = e.location().map_or((start, 1), |l| (l.line(), l.column()));
        let message = strip_position(&e.to_string());
        let (line, column) = refine_position(chunk, line, column, &message);
        at(line, column, message)
    };

    if let Some((line, column)) = too_deep(chunk, MAX_DEPTH) {
        return Err(at(line, column, format!("nesting deeper than {MAX_DEPTH} levels; a manifest needs far fewer")));
    }
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(chunk).map_err(yaml_err)?;
    if value.is_null() {
        return Ok(None);
    }
    let key_line = |key: &str| chunk.lines().position(|l| l.starts_with(&format!("{key}:"))).map_or(start, |i| i + 1);
    let Some(map) = value.as_mapping() else {
        return Err(at(
            start,
            1,
            "a manifest document must be a mapping with apiVersion, kind, metadata and spec".into(),
        ));
    };
    let kind_name = match map.get("kind") {
        Some(serde_yaml_ng::Value::String(k)) => k.clone(),
        Some(_) => return Err(at(key_line("kind"), 1, "kind must be a string".into())),
        None => return Err(at(start, 1, "missing field `kind`".into())),
    };
    let kind = Kind::parse_manifest(&kind_name).map_err(|e| at(key_line("kind"), 7, e.to_string()))?;

    /// The typed document; an error names the field it is in (`spec.ttl`, `spec.machines[1].number`).
    fn typed<S: DeserializeOwned>(chunk: &str) -> Result<Raw<S>, (String, serde_yaml_ng::Error)> {
        serde_path_to_error::deserialize(serde_yaml_ng::Deserializer::from_str(chunk))
            .map_err(|e| (e.path().to_string(), e.into_inner()))
    }
    let field_err = |(path, e): (String, serde_yaml_ng::Error)| {
        let mut error = yaml_err(e);
        // serde_yaml_ng names at most the enclosing key; the path names the field itself.
        let own =
            error.message.split_once(": ").filter(|(p, _)| !p.contains(' ')).map_or(error.message.as_str(), |(_, m)| m);
        if path != "." && !path.is_empty() {
            error.message = format!("{path}: {own}");
        }
        error
    };
    let (api_version, metadata, spec) = match kind {
        Kind::Roster => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::Roster(r.spec))),
        Kind::MailPolicy => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::MailPolicy(r.spec))),
        Kind::IntentPolicy => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::IntentPolicy(r.spec))),
        Kind::WorkerPool => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::WorkerPool(r.spec))),
        Kind::Function => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::Function(r.spec))),
        Kind::Ledger => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::Ledger(r.spec))),
        Kind::Schedule => typed(chunk).map(|r| (r.api_version, r.metadata, Spec::Schedule(r.spec))),
    }
    .map_err(field_err)?;
    if api_version != API_VERSION {
        return Err(at(
            key_line("apiVersion"),
            1,
            format!("unsupported apiVersion {api_version:?}; expected {API_VERSION:?}"),
        ));
    }
    Ok(Some(Document {
        file: file.to_string(),
        line: start,
        name: metadata.name,
        labels: metadata.labels,
        spec,
        text: chunk.to_string(),
    }))
}

/// E9: how deep a manifest may nest (a real one needs about six levels).
pub const MAX_DEPTH: usize = 64;

/// E9: where `text` first nests deeper than `max` — block indentation, `- ` sequence markers and
/// `[ {` flow brackets together — found in one linear pass before any parser sees the text (a
/// 100,000-deep document would otherwise cost the parser seconds before it is refused). Quoted
/// strings, comments and block scalars (`|`, `>`) are skipped.
fn too_deep(text: &str, max: usize) -> Option<(usize, usize)> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut scalar_above: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let body = &line[indent..];
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        if let Some(parent) = scalar_above {
            if indent > parent {
                continue;
            }
            scalar_above = None;
        }
        let mut column = indent;
        if flow == 0 {
            while indents.last().is_some_and(|&top| top >= indent) {
                indents.pop();
            }
            indents.push(indent);
            let mut rest = body;
            while let Some(after) = rest.strip_prefix("- ").or_else(|| (rest == "-").then_some("")) {
                indents.push(column + 1);
                column += 2;
                rest = after.trim_start_matches(' ');
            }
        }
        if indents.len() + flow > max {
            return Some((n + 1, column + 1));
        }
        let mut quote: Option<char> = None;
        let mut chars = line[column.min(line.len())..].char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match (quote, c) {
                (Some('"'), '\\') => {
                    chars.next();
                }
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') => break,
                (None, '[' | '{') => {
                    flow += 1;
                    if indents.len() + flow > max {
                        return Some((n + 1, column + i + 1));
                    }
                }
                (None, ']' | '}') => flow = flow.saturating_sub(1),
                _ => {}
            }
        }
        let trimmed = body.trim_end();
        if flow == 0
            && ["|", ">", "|-", ">-", "|+", ">+"].iter().any(|m| trimmed.ends_with(&format!(": {m}")) || trimmed == *m)
        {
            scalar_above = Some(indent);
        }
    }
    None
}

/// Errors raised by a field's own parser (a bad duration) are placed by serde_yaml_ng at the
/// enclosing mapping; the offending value is quoted in the message, so point at it instead.
fn refine_position(chunk: &str, line: usize, column: usize, message: &str) -> (usize, usize) {
    let quoted = message.split_once("invalid duration \"").and_then(|(_, rest)| rest.split_once('"')).map(|(v, _)| v);
    let Some(value) = quoted.filter(|v| !v.is_empty()) else {
        return (line, column);
    };
    chunk
        .lines()
        .enumerate()
        .skip(line.saturating_sub(1))
        .find_map(|(i, l)| l.find(value).map(|c| (i + 1, c + 1)))
        .unwrap_or((line, column))
}

/// serde_yaml_ng appends " at line L column C"; we print the position up front instead.
fn strip_position(message: &str) -> String {
    match message.find(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<ManifestError> {
        parse_file("m.yaml", text).expect_err("should fail")
    }

    const ROSTER: &str = "apiVersion: pcmail/v1
kind: Roster
metadata:
  name: office
spec:
  owner: pc1
  machines:
    - {number: 1, label: pc1}
";

    #[test]
    fn multi_document_files_parse_each_document_with_its_own_line() {
        let text = format!(
            "# comment only\n---\n{ROSTER}---\n---\napiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {{name: default}}\nspec: {{ttl: 1h}}\n"
        );
        let docs = parse_file("m.yaml", &text).expect("valid");
        assert_eq!(docs.len(), 2);
        assert_eq!((docs[0].kind(), docs[0].line), (Kind::Roster, 3));
        assert_eq!((docs[1].kind(), docs[1].line), (Kind::MailPolicy, 13));
    }

    #[test]
    fn unknown_field_is_refused_at_its_line_and_column() {
        let text = ROSTER.replace("  owner: pc1", "  owner: pc1\n  ownr: pc2");
        let e = &errors(&text)[0];
        assert_eq!((e.line, e.column), (7, 3), "{e}");
        assert!(e.message.contains("unknown field `ownr`"), "{e}");
    }

    #[test]
    fn unknown_kind_names_the_known_kinds() {
        let e = &errors("apiVersion: pcmail/v1\nkind: Pod\nmetadata: {name: x}\nspec: {}\n")[0];
        assert_eq!(e.line, 2);
        assert!(e.message.contains("unknown kind \"Pod\"") && e.message.contains("Roster"), "{e}");
    }

    #[test]
    fn bad_indentation_is_a_syntax_error_with_position() {
        let e = &errors("apiVersion: pcmail/v1\nkind: Roster\nmetadata:\n  name: a\n   bad: indent\nspec: {}\n")[0];
        assert_eq!(e.file, "m.yaml");
        assert!(e.line >= 4, "{e}");
    }

    #[test]
    fn bad_duration_names_the_value_and_its_place() {
        let text = "apiVersion: pcmail/v1\nkind: MailPolicy\nmetadata: {name: p}\nspec:\n  ttl: 72 hours\n";
        let e = &errors(text)[0];
        assert_eq!((e.line, e.column), (5, 8), "{e}");
        assert!(e.message.contains("invalid duration \"72 hours\""), "{e}");
    }

    #[test]
    fn wrong_api_version_is_refused() {
        let e = &errors(&ROSTER.replace("pcmail/v1", "pcmail/v2"))[0];
        assert_eq!(e.line, 1);
        assert!(e.message.contains("apiVersion"), "{e}");
    }

    #[test]
    fn yaml_alias_bombs_and_deep_nesting_are_refused_not_expanded() {
        let mut bomb =
            String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for (i, prev) in ["a", "b", "c", "d", "e", "f", "g", "h"].iter().enumerate() {
            let name = (b'b' + i as u8) as char;
            bomb +=
                &format!("{name}: &{name} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n");
        }
        let doc = format!(
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {{name: x}}\nspec:\n  owner: a\n  machines: []\n{bomb}"
        );
        let e = &errors(&doc)[0];
        assert!(e.message.contains("repetition limit"), "{e}");
        let deep = format!(
            "apiVersion: pcmail/v1\nkind: Roster\nmetadata: {{name: x}}\nspec: {}{}\n",
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        let e = &errors(&deep)[0];
        assert!(e.message.contains("nesting deeper than 64 levels"), "{e}");
        assert_eq!((e.line, e.column), (4, 70), "at the 64th bracket: {e}");
    }

    #[test]
    fn e9_nesting_is_refused_at_depth_64_before_any_parser_runs() {
        let block: String = (0..100_000).map(|i| format!("{}k{i}:\n", " ".repeat(i % 2000))).collect();
        let dashes = format!("spec:\n  x:\n  {}a\n", "- ".repeat(100_000));
        let flow = format!("spec: {}\n", "{a: ".repeat(100_000));
        for text in [block, dashes, flow] {
            let doc = format!("apiVersion: pcmail/v1\nkind: Roster\nmetadata: {{name: x}}\n{text}");
            let e = &errors(&doc)[0];
            assert!(e.message.contains("nesting deeper than 64"), "{e}");
        }
        let fine = "apiVersion: pcmail/v1\nkind: Function\nmetadata: {name: f}\nspec:\n  command: [sh, -c, \"echo '[[[[{{{{'\"]  # [[[\n  mode: generate\n  env:\n    NOTE: |\n      [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n";
        assert!(parse_file("m.yaml", fine).is_ok(), "quotes, comments and block scalars do not nest");
        let depth = |n: usize| {
            let nested: String = (0..n).map(|i| format!("{}k:\n", "  ".repeat(i))).collect();
            too_deep(&nested, MAX_DEPTH)
        };
        assert_eq!(depth(MAX_DEPTH), None);
        assert_eq!(depth(MAX_DEPTH + 1), Some((MAX_DEPTH + 1, 2 * MAX_DEPTH + 1)));
    }

    #[test]
    fn get_output_with_status_and_metadata_applies_back() {
        let text = ROSTER.replace("  name: office", "  name: office\n  generation: 3\n  creationTimestamp: x")
            + "status:\n  observedGeneration: 3\n";
        assert_eq!(parse_file("m.yaml", &text).expect("valid").len(), 1);
    }
}

/// Hostile input, fuzzed for a bounded number of cases in every test run: the parser and the
/// validator answer every text with documents or errors, never a panic.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = include_str!("../../../../manifests/examples/work.yaml");

    /// The example manifests with a few characters replaced, inserted or deleted.
    fn mutated() -> impl Strategy<Value = String> {
        proptest::collection::vec((0..EXAMPLE.len(), any::<char>(), 0..3u8), 1..8).prop_map(|edits| {
            let mut text: Vec<char> = EXAMPLE.chars().collect();
            for (at, c, how) in edits {
                let at = at % (text.len() + 1);
                match how {
                    0 if at < text.len() => text[at] = c,
                    1 => text.insert(at, c),
                    _ if at < text.len() => {
                        text.remove(at);
                    }
                    _ => {}
                }
            }
            text.into_iter().collect()
        })
    }

    fn check(text: &str) -> Result<(), TestCaseError> {
        match parse_file("fuzz.yaml", text) {
            Ok(docs) => {
                for e in crate::manifest::validate::validate_documents(&docs, &[]) {
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                for e in errors {
                    prop_assert!(e.to_string().contains("fuzz.yaml"), "errors name the file: {e}");
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn fuzz_manifest_parser_answers_any_text(text in any::<String>()) {
            check(&text)?;
        }

        #[test]
        fn fuzz_manifest_parser_answers_mutated_manifests(text in mutated()) {
            check(&text)?;
        }

        #[test]
        fn fuzz_manifest_parser_answers_yaml_shaped_noise(
            text in "(apiVersion: pcmail/v1\nkind: (Roster|MailPolicy|Ledger|Function|WorkerPool|Schedule|Bogus)\nmetadata: \\{name: [a-z-]{0,6}\\}\nspec:( \\{[a-zA-Z]{1,8}: [-a-z0-9 *&!:\\[\\]{}]{0,12}\\})?\n---\n){1,3}"
        ) {
            check(&text)?;
        }
    }
}
