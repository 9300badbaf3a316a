//! The broker crate's files in layers, without cycles: `cargo test -p braid-broker --test
//! module_cycles` reads every file under `src/`, follows its `crate::`, `super::`, `self::` and
//! child-module (`x::` after `mod x;`) paths, outside `#[cfg(test)]` modules, to the files they
//! name, and fails naming each import cycle, each import from a layer above the file's own (the
//! table in docs/architecture.md, which must place every file), and each clock reading, spawn
//! or file access in the sans-IO core. Declaring a child module (`mod x;`) is not importing it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module path (`["broker", "timers"]`) for each file, and the file for each path.
struct Tree {
    root: PathBuf,
    files: BTreeMap<Vec<String>, PathBuf>,
}

impl Tree {
    fn read(root: &Path) -> Tree {
        let mut files = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).expect("read src dir") {
                let path = entry.expect("dir entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.insert(module_path(root, &path), path);
                }
            }
        }
        Tree { root: root.to_path_buf(), files }
    }

    /// The deepest file that `path` (a module path, possibly ending in item names) names.
    fn resolve(&self, path: &[String]) -> Option<&Vec<String>> {
        (0..=path.len()).rev().find_map(|n| self.files.get_key_value(&path[..n]).map(|(k, _)| k))
    }

    fn name(&self, module: &[String]) -> String {
        let p = &self.files[module];
        p.strip_prefix(&self.root).unwrap_or(p).display().to_string()
    }
}

/// `src/broker/mod.rs` -> `["broker"]`, `src/broker/timers.rs` -> `["broker", "timers"]`,
/// `src/lib.rs` -> `[]`.
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under src");
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    match last.as_str() {
        "mod.rs" | "lib.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_string()),
    }
    parts
}

/// The module paths a file's code refers to: every `crate::a::b`, `super::x`, `self::x` path,
/// including each branch of a `use a::{b, c::d}` group. Test modules are left out.
fn references(source: &str, module: &[String]) -> Vec<Vec<String>> {
    let code = source.split("#[cfg(test)]").next().unwrap_or(source);
    let code: String =
        code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    // `super` and `self` are relative to the file's module (a `mod.rs` is its folder's).
    let here: Vec<String> = module.to_vec();
    let parent = |m: &[String]| m[..m.len().saturating_sub(1)].to_vec();
    // Child modules this file declares (`mod x;`): `x::...` is a path into the child.
    let children: Vec<String> = code
        .lines()
        .filter_map(|l| {
            let l = l.trim_start().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            l.strip_prefix("mod ")?.strip_suffix(';').map(|name| format!("{name}::"))
        })
        .collect();
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &code[i..];
        let prev = (i > 0).then(|| bytes[i - 1]);
        let boundary = !prev.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
        let prefixes =
            ["crate::", "super::", "self::"].into_iter().chain(children.iter().map(String::as_str));
        let start = prefixes.filter(|_| boundary).find(|p| rest.starts_with(*p));
        let Some(prefix) = start else {
            i += 1;
            continue;
        };
        let mut base = match prefix {
            "crate::" => Vec::new(),
            "super::" => parent(&here),
            "self::" => here.clone(),
            child => here.iter().cloned().chain([child.trim_end_matches("::").to_string()]).collect(),
        };
        let mut j = i + prefix.len();
        // Further `super::` steps.
        while code[j..].starts_with("super::") {
            base = parent(&base);
            j += "super::".len();
        }
        let (paths, end) = parse_tree(&code, j);
        for p in paths {
            let mut full = base.clone();
            full.extend(p);
            out.push(full);
        }
        i = end.max(i + 1);
    }
    out
}

/// Parses a path or a `{...}` use-tree at `at`; returns the paths it spells and where it ends.
fn parse_tree(code: &str, mut at: usize) -> (Vec<Vec<String>>, usize) {
    let bytes = code.as_bytes();
    let mut segments = Vec::new();
    loop {
        let start = at;
        while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
            at += 1;
        }
        if at > start {
            segments.push(code[start..at].to_string());
        }
        let group = if code[at..].starts_with("::{") {
            Some(3)
        } else {
            (at == start && code[at..].starts_with('{')).then_some(1)
        };
        if let Some(skip) = group {
            at += skip;
            let mut paths = Vec::new();
            loop {
                while at < bytes.len() && (bytes[at] as char).is_whitespace() {
                    at += 1;
                }
                if at >= bytes.len() || bytes[at] == b'}' {
                    return (
                        paths
                            .into_iter()
                            .map(|p: Vec<String>| segments.iter().cloned().chain(p).collect())
                            .collect(),
                        at + 1,
                    );
                }
                let (inner, end) = parse_tree(code, at);
                paths.extend(inner);
                at = end;
                while at < bytes.len() && matches!(bytes[at], b',' | b' ' | b'\n' | b'\t') {
                    at += 1;
                }
            }
        }
        if code[at..].starts_with("::") {
            at += 2;
            continue;
        }
        // `as name` and anything else end the path.
        while code[at..].starts_with(" as ") {
            at += 4;
            while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
                at += 1;
            }
        }
        return (vec![segments], at);
    }
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct State<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, usize>,
        low: BTreeMap<&'g Vec<String>, usize>,
        stack: Vec<&'g Vec<String>>,
        on_stack: BTreeSet<&'g Vec<String>>,
        found: Vec<Vec<Vec<String>>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g Vec<String>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

/// The crate's files, and for each the files its code imports (with the paths that do it).
struct Imports {
    tree: Tree,
    graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    why: BTreeMap<(Vec<String>, Vec<String>), BTreeSet<String>>,
}

impl Imports {
    fn read() -> Imports {
        let tree = Tree::read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
        assert!(tree.files.len() > 40, "read the crate's files");
        let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        let mut why: BTreeMap<(Vec<String>, Vec<String>), BTreeSet<String>> = BTreeMap::new();
        for (module, file) in &tree.files {
            let source = fs::read_to_string(file).expect("read source");
            let edges = graph.entry(module.clone()).or_default();
            for path in references(&source, module) {
                let Some(target) = tree.resolve(&path) else { continue };
                // A path into the file itself, or the crate root, is not an import between files.
                if target == module || target.is_empty() {
                    continue;
                }
                edges.insert(target.clone());
                why.entry((module.clone(), target.clone())).or_default().insert(path.join("::"));
            }
        }
        Imports { tree, graph, why }
    }
}

#[test]
fn the_broker_crate_has_no_import_cycle() {
    let Imports { tree, graph, why } = Imports::read();
    let found = cycles(&graph);
    let report: Vec<String> = found
        .iter()
        .map(|component| {
            let members: BTreeSet<&Vec<String>> = component.iter().collect();
            let mut lines = vec![format!("cycle of {} files:", component.len())];
            for from in &members {
                for to in graph[*from].iter().filter(|t| members.contains(t)) {
                    let paths: Vec<&String> = why[&((*from).clone(), to.clone())].iter().collect();
                    lines.push(format!("  {} -> {}: {paths:?}", tree.name(from), tree.name(to)));
                }
            }
            lines.join("\n")
        })
        .collect();
    assert!(found.is_empty(), "import cycles between files of src/:\n{}", report.join("\n"));
}

/// The layers of the table in docs/architecture.md, top first: a name and the files and
/// folders (ending in `/`) of src/ that make it up (rows naming another crate have none).
fn layers() -> Vec<(String, Vec<String>)> {
    let doc = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/architecture.md"))
        .expect("read docs/architecture.md");
    let table =
        doc.split("| layer | where | what |").nth(1).expect("the layer table in docs/architecture.md");
    table
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|row| {
            let cells: Vec<&str> = row.split('|').collect();
            let paths: Vec<String> = cells
                .get(2)?
                .split('`')
                .skip(1)
                .step_by(2)
                .filter(|p| p.ends_with(".rs") || p.ends_with('/'))
                .map(str::to_string)
                .collect();
            (!paths.is_empty()).then(|| (cells[1].trim().to_string(), paths))
        })
        .collect()
}

/// The index in `layers` of the layer a file (its path under src/) belongs to.
fn layer_of(layers: &[(String, Vec<String>)], file: &str) -> Option<usize> {
    layers.iter().position(|(_, paths)| {
        paths.iter().any(|p| if p.ends_with('/') { file.starts_with(p.as_str()) } else { file == p })
    })
}

/// The layers that make up the sans-IO core, which reads no clock, spawns nothing and touches
/// no file (time and work come in as arguments; see docs/architecture.md).
const CORE: [&str; 3] = ["core", "router", "session"];

/// What the core must not call.
const NOT_IN_CORE: [&str; 7] = [
    "Instant::now(",
    "SystemTime::now(",
    "spawn(",
    "std::fs",
    "tokio::fs",
    "std::thread",
    "std::net::TcpStream",
];

#[test]
fn no_file_imports_from_a_layer_above_its_own_and_the_core_does_no_io() {
    let Imports { tree, graph, why } = Imports::read();
    let layers = layers();
    assert!(layers.len() >= 8, "read the layer table: {layers:?}");
    let mut problems = Vec::new();
    let place = |module: &Vec<String>| layer_of(&layers, &tree.name(module));
    for (module, file) in &tree.files {
        let name = tree.name(module);
        if module.is_empty() {
            continue; // lib.rs: the crate root declares the modules.
        }
        let Some(here) = place(module) else {
            problems.push(format!("{name} is in no layer of docs/architecture.md's table"));
            continue;
        };
        for target in &graph[module] {
            if let Some(there) = place(target).filter(|&there| there < here) {
                let paths: Vec<&String> = why[&(module.clone(), target.clone())].iter().collect();
                problems.push(format!(
                    "{name} ({}) imports {} ({}), a layer above it: {paths:?}",
                    layers[here].0,
                    tree.name(target),
                    layers[there].0
                ));
            }
        }
        if CORE.contains(&layers[here].0.as_str()) {
            let source = fs::read_to_string(file).expect("read source");
            let code = source.split("#[cfg(test)]").next().unwrap_or(&source);
            for (n, line) in code.lines().enumerate().filter(|(_, l)| !l.trim_start().starts_with("//")) {
                for call in NOT_IN_CORE.iter().filter(|c| line.contains(*c)) {
                    problems.push(format!("{name}:{}: the sans-IO core uses {call}", n + 1));
                }
            }
        }
    }
    assert!(problems.is_empty(), "layering (docs/architecture.md):\n{}", problems.join("\n"));
}

#[test]
fn the_layer_table_places_files_and_folders() {
    let layers = vec![
        ("server".to_string(), vec!["server.rs".to_string()]),
        ("session".to_string(), vec!["session/".to_string()]),
    ];
    assert_eq!(layer_of(&layers, "server.rs"), Some(0));
    assert_eq!(layer_of(&layers, "session/state.rs"), Some(1));
    assert_eq!(layer_of(&layers, "sessions.rs"), None);
    assert_eq!(layer_of(&layers, "server.rs/x"), None);
}

#[test]
fn the_checker_sees_paths_groups_and_relative_imports() {
    let module = vec!["broker".to_string(), "lifecycle".to_string()];
    let src = "mod inner;\nuse super::timers::Timer;\nuse crate::session::{Release, Session};\n\
               use crate::{a::B, c};\nfn f() { crate::store::unix_now(); inner::Thing::new(); }\n\
               // crate::commented::out\n#[cfg(test)]\nmod tests { use crate::x; }";
    let refs: Vec<String> = references(src, &module).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        refs,
        [
            "broker::timers::Timer",
            "session::Release",
            "session::Session",
            "a::B",
            "c",
            "store::unix_now",
            "broker::lifecycle::inner::Thing::new"
        ]
    );
}
