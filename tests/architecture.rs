//! The house rules of `src/`, read from the source (ARCHITECTURE.md draws them): the layers'
//! folders import only downwards, no two files import each other through any circle, only
//! `sync.rs` names `parking_lot` or `loom`, and no file's own code (its unit tests aside) is
//! over 1,000 lines.
//!
//! An import is any path into the crate a file's code names (a `use`, or a path in an
//! expression or a type): `crate::…`, `super::…`, `self::…`, or a child module by its name.
//! Paths through the crate's public re-exports (`crate::TaskId`) count as imports of the file
//! that defines the item. Comments, doc links and unit-test modules are not code here.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The layers, bottom first: a file may import its own layer and the ones before it.
const LAYERS: &[&[&str]] = &[
    &["sync", "unwind"],
    &["model"],
    &["gates"],
    &["observe"],
    &["store"],
    &["client"],
    &["runtime"],
    &["api"],
    &["lib"],
];

/// Lines of a file's own code (its unit tests aside) a file may have.
const MAX_LINES: usize = 1_000;

struct Crate {
    /// Module path (`["store", "memory", "state"]`) -> file, relative to `src/`.
    files: BTreeMap<Vec<String>, String>,
    /// Each file's code: comments, doc comments and its unit-test module removed.
    code: BTreeMap<String, String>,
    /// What lib.rs re-exports: a public name -> the module path it comes from.
    reexports: HashMap<String, Vec<String>>,
}

fn read_crate() -> Crate {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    walk(&root, &mut paths);
    let mut files = BTreeMap::new();
    let mut code = BTreeMap::new();
    for path in paths {
        let rel = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut module: Vec<String> = rel
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_owned)
            .collect();
        if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        code.insert(rel.clone(), strip(&text));
        files.insert(module, rel);
    }
    let reexports = reexports(&std::fs::read_to_string(root.join("lib.rs")).unwrap());
    Crate {
        files,
        code,
        reexports,
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The file's code without comments and without its unit-test module (which, by this crate's
/// habit, comes last).
fn strip(text: &str) -> String {
    let mut kept = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let next = lines.peek().map_or("", |l| l.trim_start());
        if trimmed.starts_with("#[cfg(")
            && trimmed.contains("test")
            && next.starts_with("mod tests")
        {
            break;
        }
        let code = match line.find("//") {
            // A `//` inside a string literal is rare here; good enough for `use` lines.
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        };
        kept.push_str(code);
        kept.push('\n');
    }
    kept
}

/// lib.rs's `pub use a::b::{C, D};` and `pub use a::b::C;` lines: name -> module path.
fn reexports(lib: &str) -> HashMap<String, Vec<String>> {
    let mut map = HashMap::new();
    let lib = strip(lib);
    for statement in lib.split(';') {
        // After any attribute (`#[cfg(feature = "postgres")]`).
        let Some((_, rest)) = statement.split_once("pub use ") else {
            continue;
        };
        let rest = rest.trim_start_matches("crate::");
        let (module, names) = match rest.find("::{") {
            Some(at) => (&rest[..at], rest[at + 3..].trim_end_matches('}')),
            None => rest.rsplit_once("::").unwrap_or(("", rest)),
        };
        let module: Vec<String> = module.split("::").map(str::to_owned).collect();
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            map.insert(name.to_owned(), module.clone());
        }
    }
    map
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path in `code` that starts with `head::` (where `head` is a whole word, not the tail
/// of a longer path), with `use` groups expanded: `crate::a::{b, c::d}` gives `a::b`, `a::c::d`.
fn paths_after(code: &str, head: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let pattern = format!("{head}::");
    let mut from = 0;
    while let Some(found) = code[from..].find(&pattern) {
        let at = from + found;
        from = at + pattern.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| is_ident(c) || c == ':' || c == '$') {
            continue;
        }
        expand(&code[from..], &[], &mut out);
    }
    out
}

/// Reads one path (and its `{…}` group, recursively) from the start of `rest`.
fn expand(rest: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut segs = prefix.to_vec();
    let mut rest = rest;
    loop {
        let rest_trim = rest.trim_start();
        if let Some(group) = rest_trim.strip_prefix('{') {
            // Split the group at its top-level commas.
            let mut depth = 0;
            let mut start = 0;
            let chars: Vec<char> = group.chars().collect();
            let mut parts = Vec::new();
            for (i, &c) in chars.iter().enumerate() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        parts.push(chars[start..i].iter().collect::<String>());
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(chars[start..i].iter().collect::<String>());
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            for part in parts {
                let part = part.trim();
                if part.is_empty() || part == "self" {
                    out.push(segs.clone());
                    continue;
                }
                expand(part, &segs, out);
            }
            return;
        }
        let word: String = rest_trim.chars().take_while(|&c| is_ident(c)).collect();
        if word.is_empty() {
            break;
        }
        segs.push(word.clone());
        rest = &rest_trim[word.len()..];
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    if !segs.is_empty() {
        out.push(segs);
    }
}

impl Crate {
    /// The file a module path lands in: the longest prefix that is a file, through lib.rs's
    /// re-exports for a path that names a re-exported item.
    fn resolve(&self, path: &[String]) -> Option<&String> {
        let mut path = path.to_vec();
        if let Some(module) = path.first().and_then(|first| self.reexports.get(first)) {
            let mut through = module.clone();
            through.extend(path.drain(1..));
            path = through;
        }
        (0..=path.len())
            .rev()
            .find_map(|n| self.files.get(&path[..n]))
    }

    /// Every file each file imports.
    fn imports(&self) -> BTreeMap<&String, BTreeSet<&String>> {
        let mut graph = BTreeMap::new();
        for (module, file) in &self.files {
            let code = &self.code[file];
            let mut targets = BTreeSet::new();
            let mut add = |path: Vec<String>| {
                if let Some(target) = self.resolve(&path) {
                    if target != file {
                        targets.insert(target);
                    }
                }
            };
            for path in paths_after(code, "crate") {
                add(path);
            }
            let parent = &module[..module.len().saturating_sub(1)];
            for path in paths_after(code, "super") {
                let mut base = parent.to_vec();
                let mut path = path.as_slice();
                while path.first().is_some_and(|s| s == "super") {
                    base.pop();
                    path = &path[1..];
                }
                base.extend(path.iter().cloned());
                add(base);
            }
            for path in paths_after(code, "self") {
                let mut base = module.clone();
                base.extend(path);
                add(base);
            }
            // Children named bare (`state::State`, `use queue::{…}`).
            for (child, _) in self.files.range(module.clone()..) {
                if child.len() != module.len() + 1 || !child.starts_with(module) {
                    continue;
                }
                let name = child.last().unwrap();
                for path in paths_after(code, name) {
                    let mut full = child.clone();
                    full.extend(path);
                    add(full);
                }
            }
            graph.insert(file, targets);
        }
        graph
    }
}

fn layer_of(file: &str) -> usize {
    let top = file.split('/').next().unwrap().trim_end_matches(".rs");
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top))
        .unwrap_or_else(|| panic!("{file} is in no layer: add its folder to LAYERS"))
}

#[test]
fn every_import_runs_down_the_layers() {
    let krate = read_crate();
    let mut up = Vec::new();
    for (file, targets) in krate.imports() {
        for target in targets {
            if layer_of(target) > layer_of(file) {
                up.push(format!("{file} -> {target}"));
            }
        }
    }
    assert!(
        up.is_empty(),
        "imports running up a layer:\n{}",
        up.join("\n")
    );
}

#[test]
fn no_files_import_each_other_through_a_circle() {
    let krate = read_crate();
    let graph = krate.imports();
    // Tarjan's strongly connected components: a component of more than one file is a circle.
    struct Walk<'a> {
        graph: &'a BTreeMap<&'a String, BTreeSet<&'a String>>,
        index: HashMap<&'a String, usize>,
        low: HashMap<&'a String, usize>,
        stack: Vec<&'a String>,
        circles: Vec<Vec<&'a String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, file: &'a String) {
            let n = self.index.len();
            self.index.insert(file, n);
            self.low.insert(file, n);
            self.stack.push(file);
            for &next in self.graph.get(file).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[file].min(self.low[next]);
                    self.low.insert(file, low);
                } else if self.stack.contains(&next) {
                    let low = self.low[file].min(self.index[next]);
                    self.low.insert(file, low);
                }
            }
            if self.low[file] == self.index[file] {
                let mut component = Vec::new();
                while let Some(top) = self.stack.pop() {
                    component.push(top);
                    if top == file {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.circles.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph: &graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        circles: Vec::new(),
    };
    for &file in graph.keys() {
        if !walk.index.contains_key(file) {
            walk.visit(file);
        }
    }
    assert!(
        walk.circles.is_empty(),
        "import circles: {:?}",
        walk.circles
    );
}

#[test]
fn only_sync_rs_names_parking_lot_or_loom() {
    let krate = read_crate();
    let naming: Vec<_> = krate
        .code
        .iter()
        .filter(|(file, _)| file.as_str() != "sync.rs")
        .filter(|(_, code)| code.contains("parking_lot") || code.contains("loom::"))
        .map(|(file, _)| file)
        .collect();
    assert!(naming.is_empty(), "{naming:?} name parking_lot or loom");
}

#[test]
fn no_file_is_over_a_thousand_lines_of_its_own_code() {
    let krate = read_crate();
    let long: Vec<_> = krate
        .code
        .iter()
        .map(|(file, code)| (file.as_str(), code.lines().count()))
        .filter(|&(_, lines)| lines > MAX_LINES)
        .collect();
    assert!(long.is_empty(), "files over {MAX_LINES} lines: {long:?}");
}

/// The checks above can fail: a hand-made crate with a circle and an arrow up is caught.
#[test]
fn the_reader_sees_circles_and_arrows_up() {
    let mut krate = Crate {
        files: BTreeMap::new(),
        code: BTreeMap::new(),
        reexports: HashMap::new(),
    };
    for (module, file, code) in [
        (
            vec!["model", "a"],
            "model/a.rs",
            "use crate::api::b::B;\nfn f() {}\n",
        ),
        (
            vec!["api", "b"],
            "api/b.rs",
            "use crate::model::{a::A, c};\n// crate::observe::x is a comment\n",
        ),
        (
            vec!["model", "c"],
            "model/c.rs",
            "fn g() { super::a::f() }\n",
        ),
    ] {
        let module = module.into_iter().map(str::to_owned).collect();
        krate.files.insert(module, file.to_owned());
        krate.code.insert(file.to_owned(), strip(code));
    }
    let graph = krate.imports();
    let edges: Vec<String> = graph
        .iter()
        .flat_map(|(from, to)| to.iter().map(move |to| format!("{from} -> {to}")))
        .collect();
    assert_eq!(
        edges,
        [
            "api/b.rs -> model/a.rs",
            "api/b.rs -> model/c.rs",
            "model/a.rs -> api/b.rs",
            "model/c.rs -> model/a.rs",
        ]
    );
    assert!(layer_of("model/a.rs") < layer_of("api/b.rs"));
}
