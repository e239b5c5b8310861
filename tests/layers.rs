//! The runtime's layers, read from its own source: every `crate::` and
//! `super::` path in `src/` (the command-line tool in `src/bin/` and test
//! modules aside) is an edge from its file to the file of the module it
//! names (through a re-export to the file that defines the item), and
//!
//! - no file names a file of a higher layer (ARCHITECTURE.md's code map);
//! - the files form no cycle, within a layer or across.
//!
//! It reads text, not a compiled crate, with the simple rules of this
//! code base (one item per `use` tree, no macros that name modules), and
//! fails loudly on a path it cannot resolve, so that what it checks stays
//! what the code does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first: a file may name files of its own layer or
/// of lower ones. A file's layer is that of the longest entry that is a
/// prefix of its path (relative to `src/`).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "addr.rs",
            "config.rs",
            "error.rs",
            "files.rs",
            "identity.rs",
            "invite.rs",
            "json.rs",
            "time.rs",
            "clock.rs",
            "seeded_bugs.rs",
            "contact.rs",
            "store/",
            "trace/",
        ],
    ),
    ("protocol", &["proto/"]),
    (
        "node state",
        &["audit/", "authority.rs", "tap.rs", "tasks/", "host/mod.rs"],
    ),
    ("dispatch", &["dispatch/"]),
    ("connections", &["net/"]),
    (
        "api",
        &["client/", "control.rs", "handle.rs", "stream.rs", "task.rs"],
    ),
    ("capabilities", &["core/", "host/"]),
    (
        "node",
        &[
            "node/",
            "grants.rs",
            "stats.rs",
            "prometheus/",
            "fuzzing.rs",
            "lib.rs",
            "host/in_process.rs",
        ],
    ),
];

/// The one recursion the layers allow: a node makes child nodes. The
/// in-process host starts nodes with the node builder, and the runtime
/// takes the in-process host when it is given no other; the three files
/// name each other, all in the node layer.
const ALLOWED_CYCLES: &[&[&str]] = &[&["host/in_process.rs", "node/builder.rs", "node/runtime.rs"]];

fn layer_of(file: &str) -> (usize, &'static str) {
    let mut best: Option<(usize, usize, &'static str)> = None;
    for (i, (name, prefixes)) in LAYERS.iter().enumerate() {
        for p in *prefixes {
            if file.starts_with(p) && best.is_none_or(|(len, _, _)| p.len() > len) {
                best = Some((p.len(), i, name));
            }
        }
    }
    match best {
        Some((_, i, name)) => (i, name),
        None => panic!("src/{file} is in no layer: add it to LAYERS and to ARCHITECTURE.md"),
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "bin") {
                continue;
            }
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            // Unit tests kept in a file of their own (`#[cfg(test)] mod tests;`).
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// The module path of a file: `net/session.rs` is `net::session`,
/// `net/mod.rs` is `net`, `lib.rs` is the crate root.
fn module_of(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .trim_end_matches(".rs")
        .split('/')
        .map(String::from)
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text without comments, string literals and `#[cfg(test)]` items.
fn code(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i..].starts_with(b"r#\"") {
            i += 3;
            while i < b.len() && !b[i..].starts_with(b"\"#") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x' or '\n'); lifetimes are left alone.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    strip_tests(&out)
}

/// Removes each item behind `#[cfg(test)]`: the attribute, then up to the
/// end of the item (its braces, or a `;`).
fn strip_tests(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let b = after.as_bytes();
        let mut i = "#[cfg(test)]".len();
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                // The end of the block around it: the item (a field, an
                // arm) ended before.
                b'}' if depth == 0 => break,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b';' | b',' if depth == 0 => {
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        rest = &after[i.min(after.len())..];
    }
    out.push_str(rest);
    out
}

fn ident(b: &[u8], mut i: usize) -> (String, usize) {
    let start = i;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    (String::from_utf8_lossy(&b[start..i]).into_owned(), i)
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// The paths of a use tree starting at `i` (after `prefix::`), and where
/// it ends.
fn tree(b: &[u8], i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut i = skip_ws(b, i);
    if i < b.len() && b[i] == b'{' {
        i += 1;
        loop {
            i = skip_ws(b, i);
            if i >= b.len() {
                return i;
            }
            if b[i] == b'}' {
                return i + 1;
            }
            if b[i] == b',' {
                i += 1;
                continue;
            }
            i = tree(b, i, prefix, out);
        }
    }
    let (name, mut j) = ident(b, i);
    if name.is_empty() {
        // `*` or something this reader does not follow: the prefix.
        out.push(prefix.to_vec());
        return (i + 1).min(b.len());
    }
    let mut path = prefix.to_vec();
    if name != "self" {
        path.push(name);
    }
    if b[j..].starts_with(b"::") {
        j += 2;
        return tree(b, j, &path, out);
    }
    out.push(path);
    j
}

/// Every `crate::` and `super::` path in `code`, as module paths from the
/// crate root; `module` is the file's own module.
fn paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        if boundary && b[i..].starts_with(b"crate::") {
            i = tree(b, i + "crate::".len(), &[], &mut out);
        } else if boundary && b[i..].starts_with(b"super::") {
            // `super` is the parent of the file's module (for `a/mod.rs`,
            // whose module is `a`, the crate root).
            let mut base = module.to_vec();
            base.pop();
            let mut j = i + "super::".len();
            while b[j..].starts_with(b"super::") {
                base.pop();
                j += "super::".len();
            }
            i = tree(b, j, &base, &mut out);
        } else {
            i += 1;
        }
    }
    out
}

struct Crate {
    /// module path -> file.
    modules: BTreeMap<Vec<String>, String>,
    /// file -> its code.
    code: BTreeMap<String, String>,
}

impl Crate {
    fn read() -> Self {
        let root = src();
        let mut all = Vec::new();
        files(&root, &mut all);
        let mut modules = BTreeMap::new();
        let mut code_of = BTreeMap::new();
        for p in all {
            let rel = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            modules.insert(module_of(&rel), rel.clone());
            code_of.insert(rel, code(&fs::read_to_string(&p).unwrap()));
        }
        Self {
            modules,
            code: code_of,
        }
    }

    /// The file a path leads to: the longest prefix that is a module, then
    /// through a re-export in that module to the child that defines it.
    fn resolve(&self, path: &[String]) -> Option<String> {
        for n in (0..=path.len()).rev() {
            let Some(file) = self.modules.get(&path[..n]) else {
                continue;
            };
            if let Some(item) = path.get(n) {
                // `pub use child::{Item}` or `pub(crate) use child::Item`:
                // the item lives in the child's file.
                let code = &self.code[file];
                for child in self
                    .modules
                    .keys()
                    .filter(|m| m.len() == n + 1 && m[..n] == path[..n])
                {
                    let c = &child[n];
                    let reexported = code.lines().any(|l| {
                        let l = l.trim();
                        (l.starts_with("pub use") || l.starts_with("pub(crate) use"))
                            && (l.contains(&format!(" {c}::"))
                                || l.contains(&format!("self::{c}::")))
                            && contains_word(l, item)
                    });
                    if reexported {
                        return Some(self.modules[child].clone());
                    }
                }
            }
            return Some(file.clone());
        }
        None
    }

    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (file, code) in &self.code {
            let module = module_of(file);
            let mut to = BTreeSet::new();
            for p in paths(code, &module) {
                let Some(target) = self.resolve(&p) else {
                    panic!("{file}: cannot resolve crate path {}", p.join("::"));
                };
                if &target != file {
                    to.insert(target);
                }
            }
            edges.insert(file.clone(), to);
        }
        edges
    }
}

fn contains_word(line: &str, word: &str) -> bool {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w == word)
}

/// The strongly connected components with more than one file.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in &t.edges[v] {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[v].min(t.low[w]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.low[v].min(t.index[w]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn the_runtime_has_no_import_cycle() {
    let edges = Crate::read().edges();
    let found: Vec<Vec<String>> = cycles(&edges)
        .into_iter()
        .filter(|c| {
            !ALLOWED_CYCLES
                .iter()
                .any(|a| c.iter().map(String::as_str).eq(a.iter().copied()))
        })
        .collect();
    assert!(found.is_empty(), "import cycles: {found:#?}");
}

#[test]
fn no_layer_names_a_higher_one() {
    let edges = Crate::read().edges();
    let mut upward = Vec::new();
    for (from, to) in &edges {
        let (lf, nf) = layer_of(from);
        for t in to {
            let (lt, nt) = layer_of(t);
            if lt > lf {
                upward.push(format!("{from} ({nf}) -> {t} ({nt})"));
            }
        }
    }
    assert!(upward.is_empty(), "imports up the layers: {upward:#?}");
}

#[test]
fn the_reader_sees_what_the_code_names() {
    // A check of the checker: known edges of the request path are seen.
    let edges = Crate::read().edges();
    assert!(
        edges["net/conn.rs"].contains("dispatch/job.rs"),
        "{:?}",
        edges["net/conn.rs"]
    );
    assert!(edges["dispatch/mod.rs"].contains("proto/ledger.rs"));
    let total: usize = edges.values().map(BTreeSet::len).sum();
    assert!(total > 200, "{total} edges");
}
