//! The batch stage's module layout, checked from the source files (issue 53).
//!
//! `rust/src/batch` holds the stage's shared files (`mod.rs`, `pipeline.rs`, `units.rs`,
//! `panics.rs`), the shared kit (`kit/`) and one folder a kind (`square/`, `naflex/`, `text/`,
//! `interleaved/`, and whatever kind comes next). The rules, each a test below:
//! - a kind imports the kit, the shared files and the stages below; never another kind's folder;
//!   the kit and the shared files import no kind (a kind stands on them, not they on it);
//! - nothing else lies loose at the top of `batch/`: a new file goes in its kind or the kit;
//! - the read stage imports nothing from `batch` (batch stands on read, not read on batch);
//! - no import circle between the files of `batch`.
//!
//! Imports are read as text: every `crate::batch::…` path and every `super::…` path in a line
//! of code (comments and doc comments are passed over), resolved to the file that defines the
//! module it names. Inline modules (`mod tests { … }`, closed by a `}` at their indentation, as
//! rustfmt writes them) move `super` one level, as the compiler does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The files at the top of `batch/` that are no kind's: the stage's shared files.
const SHARED_FILES: [&str; 4] = ["mod.rs", "pipeline.rs", "units.rs", "panics.rs"];

/// The folder under `batch/` that every kind may take from and that takes from no kind.
const KIT: &str = "kit";

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/src")
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module path (under `batch`) a file under `batch/` defines: `a/b.rs` and `a/b/mod.rs`
/// are `[a, b]`; `mod.rs` is `[]`.
fn module_of(batch: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(batch).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    if last != "mod.rs" {
        parts.push(last.trim_end_matches(".rs").to_string());
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The `::`-separated identifiers at the start of `s` (a path's tail), with the items of a
/// `{a::B, c}` group each as a path of its own.
fn path_tails(s: &str) -> Vec<Vec<String>> {
    let mut segs = Vec::new();
    let mut rest = s;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            let mut out = Vec::new();
            let (mut item_depth, mut start) = (0, 0);
            let inner = &group[..end];
            for (i, c) in inner.char_indices().chain([(inner.len(), ',')]) {
                match c {
                    '{' => item_depth += 1,
                    '}' => item_depth -= 1,
                    ',' if item_depth == 0 => {
                        for tail in path_tails(inner[start..i].trim()) {
                            let mut p = segs.clone();
                            p.extend(tail);
                            out.push(p);
                        }
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return out;
        }
        let n = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if n == 0 {
            break;
        }
        segs.push(rest[..n].to_string());
        match rest[n..].strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    vec![segs]
}

/// One import found in a file: its line and the module path it names, from `batch`'s root.
struct Import {
    line: usize,
    text: String,
    target: Vec<String>,
}

/// Whether `line` is code (not blank, not a comment or doc comment).
fn code(line: &str) -> Option<&str> {
    let t = line.trim_start();
    (!t.is_empty() && !t.starts_with("//")).then_some(line)
}

/// The `crate::batch::…` and `super::…` paths of a file under `batch/` (the module `module`),
/// resolved to module paths under `batch`.
fn imports_of(source: &str, module: &[String]) -> Vec<Import> {
    let mut out = Vec::new();
    // Inline modules open here: (indentation, name).
    let mut inline: Vec<(usize, String)> = Vec::new();
    for (n, raw) in source.lines().enumerate() {
        let Some(line) = code(raw) else { continue };
        let indent = line.len() - line.trim_start().len();
        if let Some(&(at, _)) = inline.last() {
            if indent == at && line.trim() == "}" {
                inline.pop();
                continue;
            }
        }
        let mut here: Vec<String> = module.to_vec();
        here.extend(inline.iter().map(|(_, m)| m.clone()));
        let t = line.trim();
        let decl = t
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub(super) ")
            .trim_start_matches("pub ");
        if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(" {")) {
            inline.push((indent, name.trim().to_string()));
            continue;
        }
        for (at, _) in line.match_indices("crate::batch::") {
            if line[..at].ends_with(|c: char| is_ident(c) || c == ':') {
                continue;
            }
            for tail in path_tails(&line[at + "crate::batch::".len()..]) {
                out.push(Import {
                    line: n + 1,
                    text: t.to_string(),
                    target: tail,
                });
            }
        }
        for (at, _) in line.match_indices("super::") {
            if line[..at].ends_with(|c: char| is_ident(c) || c == ':') {
                continue;
            }
            let mut rest = &line[at..];
            let mut up = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                up += 1;
                rest = r;
            }
            let tails = if rest.starts_with('*') {
                vec![Vec::new()]
            } else {
                path_tails(rest)
            };
            let Some(base) = here.len().checked_sub(up) else {
                continue;
            };
            for tail in tails {
                let mut target = here[..base].to_vec();
                target.extend(tail);
                out.push(Import {
                    line: n + 1,
                    text: t.to_string(),
                    target,
                });
            }
        }
    }
    out
}

/// The batch stage's files, each with its module path and imports.
struct Batch {
    root: PathBuf,
    files: BTreeMap<Vec<String>, (PathBuf, Vec<Import>)>,
    /// The folders under `batch/` other than the kit: the kinds.
    kinds: BTreeSet<String>,
}

impl Batch {
    fn read(root: &Path) -> Batch {
        let mut files = BTreeMap::new();
        for file in rust_files(root) {
            let module = module_of(root, &file);
            let text = std::fs::read_to_string(&file).unwrap();
            let imports = imports_of(&text, &module);
            files.insert(module, (file, imports));
        }
        let kinds = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir())
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .filter(|name| name != KIT)
            .collect();
        Batch {
            root: root.to_path_buf(),
            files,
            kinds,
        }
    }

    /// The file that defines the module `target` names (its longest prefix that is a file's
    /// module); None for a path outside the stage's files.
    fn file_of(&self, target: &[String]) -> Option<&Vec<String>> {
        (0..=target.len())
            .rev()
            .find_map(|n| self.files.get_key_value(&target[..n]).map(|(k, _)| k))
    }

    fn name(&self, module: &[String]) -> String {
        let file = &self.files[module].0;
        format!(
            "rust/src/batch/{}",
            file.strip_prefix(&self.root).unwrap().display()
        )
    }

    /// Each file's imports of other files: (importer, imported, line, text).
    fn edges(&self) -> Vec<(&Vec<String>, &Vec<String>, usize, &str)> {
        let mut out = Vec::new();
        for (module, (_, imports)) in &self.files {
            for import in imports {
                if let Some(to) = self.file_of(&import.target) {
                    if to != module {
                        out.push((module, to, import.line, import.text.as_str()));
                    }
                }
            }
        }
        out
    }

    /// The kind a module belongs to (its folder), None for the kit and the shared files.
    fn kind_of<'a>(&self, module: &'a [String]) -> Option<&'a str> {
        module
            .first()
            .map(String::as_str)
            .filter(|first| self.kinds.contains(*first))
    }

    fn kind_crossings(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = BTreeSet::new();
        for (from, to, line, text) in self.edges() {
            if !seen.insert((from, to, line)) {
                continue;
            }
            let Some(target) = self.kind_of(to) else {
                continue;
            };
            let owner = match self.kind_of(from) {
                Some(kind) => format!("the {kind} kind"),
                None => "shared code (the kit or a stage file)".to_string(),
            };
            if self.kind_of(from) != Some(target) {
                out.push(format!(
                    "{}:{line}: {owner} imports the {target} kind's `{}`: `{text}`",
                    self.name(from),
                    to.join("::"),
                ));
            }
        }
        out
    }

    fn loose_files(&self) -> Vec<String> {
        self.files
            .iter()
            .filter(|(module, (file, _))| {
                module.len() == 1
                    && file.parent() == Some(self.root.as_path())
                    && !SHARED_FILES.contains(&file.file_name().unwrap().to_str().unwrap())
            })
            .map(|(module, _)| {
                format!(
                    "{}: a loose file at the top of batch/ (it belongs in its kind's folder or the kit)",
                    self.name(module)
                )
            })
            .collect()
    }

    /// Every import circle, one a strongly connected set of files, named by a path round it.
    fn cycles(&self) -> Vec<String> {
        let mut next: BTreeMap<&Vec<String>, BTreeMap<&Vec<String>, usize>> = BTreeMap::new();
        for (from, to, line, _) in self.edges() {
            next.entry(from).or_default().entry(to).or_insert(line);
        }
        let nodes: Vec<&Vec<String>> = self.files.keys().collect();
        let reaches = |a: &Vec<String>, b: &Vec<String>| {
            let mut seen = BTreeSet::new();
            let mut stack = vec![a];
            while let Some(n) = stack.pop() {
                if n == b {
                    return true;
                }
                if seen.insert(n) {
                    stack.extend(next.get(n).into_iter().flat_map(|m| m.keys().copied()));
                }
            }
            false
        };
        let mut done: BTreeSet<&Vec<String>> = BTreeSet::new();
        let mut out = Vec::new();
        for &a in &nodes {
            if done.contains(a) {
                continue;
            }
            let set: Vec<&Vec<String>> = nodes
                .iter()
                .copied()
                .filter(|&b| b != a && reaches(a, b) && reaches(b, a))
                .collect();
            if set.is_empty() {
                continue;
            }
            done.insert(a);
            done.extend(set.iter().copied());
            // A path round the circle: from `a`, breadth first, back to `a`.
            let mut from: BTreeMap<&Vec<String>, &Vec<String>> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([a]);
            let mut back = None;
            while let Some(n) = queue.pop_front() {
                for &m in next.get(n).into_iter().flat_map(|m| m.keys()) {
                    if m == a {
                        back = Some(n);
                        break;
                    }
                    if !from.contains_key(m) && m != a {
                        from.insert(m, n);
                        queue.push_back(m);
                    }
                }
                if back.is_some() {
                    break;
                }
            }
            let mut path = vec![a];
            let mut at = back.expect("a circle");
            while at != a {
                path.push(at);
                at = from[at];
            }
            path[1..].reverse();
            path.push(a);
            let named: Vec<String> = path
                .windows(2)
                .map(|w| format!("{} (line {})", self.name(w[0]), next[w[0]][w[1]]))
                .chain([self.name(a)])
                .collect();
            let members: Vec<String> = [a].into_iter().chain(set).map(|m| self.name(m)).collect();
            out.push(format!(
                "import circle: {} (the circle's files: {})",
                named.join(" -> "),
                members.join(", ")
            ));
        }
        out
    }
}

/// `crate::batch` named in a code line of a file under `dir` (read: nothing).
fn batch_imports_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for file in rust_files(dir) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if code(line).is_some_and(|l| l.contains("crate::batch")) {
                out.push(format!(
                    "{}:{}: the read stage imports the batch stage: `{}`",
                    file.strip_prefix(src()).unwrap().display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    out
}

fn assert_none(what: &str, found: Vec<String>) {
    assert!(
        found.is_empty(),
        "{what} ({}):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn no_kind_imports_another_kind_and_shared_code_imports_no_kind() {
    let batch = Batch::read(&src().join("batch"));
    assert!(batch.files.len() > 10, "the batch stage's files were read");
    assert_none("imports across kinds", batch.kind_crossings());
}

#[test]
fn nothing_lies_loose_at_the_top_of_batch() {
    let batch = Batch::read(&src().join("batch"));
    assert_none("loose files", batch.loose_files());
}

#[test]
fn the_read_stage_imports_nothing_from_batch() {
    assert_none(
        "read imports batch",
        batch_imports_under(&src().join("read")),
    );
}

#[test]
fn the_batch_stage_has_no_import_circle() {
    let batch = Batch::read(&src().join("batch"));
    assert_none("import circles", batch.cycles());
}

#[test]
fn imports_are_resolved_as_the_compiler_resolves_them() {
    let module: Vec<String> = ["kind", "pack"].map(String::from).to_vec();
    let source = "use super::measure::{Item, Measured};\n\
                  use crate::batch::kit::{unit::Unit, visits::{visits, Visit}};\n\
                  // use crate::batch::other::Gone;\n\
                  fn f() -> crate::batch::pipeline::Lent { todo!() }\n\
                  #[cfg(test)]\n\
                  mod tests {\n    use super::super::spec::Grid;\n    use super::*;\n}\n\
                  use super::Spec;\n";
    let found: Vec<(usize, String)> = imports_of(source, &module)
        .into_iter()
        .map(|i| (i.line, i.target.join("::")))
        .collect();
    let want = [
        (1, "kind::measure::Item"),
        (1, "kind::measure::Measured"),
        (2, "kit::unit::Unit"),
        (2, "kit::visits::visits"),
        (2, "kit::visits::Visit"),
        (4, "pipeline::Lent"),
        (7, "kind::spec::Grid"),
        (8, "kind::pack"),
        (10, "kind::Spec"),
    ];
    let want: Vec<(usize, String)> = want.iter().map(|&(l, p)| (l, p.to_string())).collect();
    assert_eq!(found, want);
}
