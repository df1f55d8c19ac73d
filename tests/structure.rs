//! The shape of the code, checked: no source files import each other, in a
//! pair or round a circle of any length, and
//! the crates go one way (core links no HTTP client for models and no crate
//! above it).
//!
//! A file *imports* another when it names an item of the other's module by a
//! `crate::` or `super::` path (in a `use` or inline). Test modules
//! (`#[cfg(test)] mod tests`) are left out: a test may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The source roots whose files must not import each other.
const ROOTS: &[&str] = &[
    "src",
    "client/src",
    "service/src",
    "server/src",
    "ui/src",
    "mcp/src",
    "schedules/src",
    "webhooks/src",
    "core/src",
    "tools/src",
    "agent/src",
    "backends/src",
    "policies/src",
    "sandbox/src",
];

type Module = Vec<String>;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `root`, by its module path (`a/mod.rs` and `a.rs`
/// are module `a`; `lib.rs`, `main.rs` and `thin.rs` are the crate root).
fn modules(root: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let Ok(rel) = p.strip_prefix(root) else {
                continue;
            };
            let mut parts: Module = rel
                .with_extension("")
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|l| l == "mod") {
                parts.pop();
            }
            if matches!(parts.as_slice(), [one] if one == "lib" || one == "main" || one == "thin") {
                parts.clear();
            }
            out.insert(parts, p);
        }
    }
    out
}

/// `s` without `//` comments and without its `#[cfg(test)] mod tests` part.
fn code_of(s: &str) -> String {
    let s = match s.find("#[cfg(test)]\nmod tests") {
        Some(i) => &s[..i],
        None => s,
    };
    s.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expand a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(prefix: &[String], tree: &str) -> Vec<Vec<String>> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let mut p = prefix.to_vec();
        p.extend(tree.split("::").filter(|x| !x.is_empty()).map(String::from));
        return vec![p];
    };
    let mut head = prefix.to_vec();
    head.extend(
        tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(String::from),
    );
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut cur, mut out) = (0, String::new(), Vec::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            out.extend(expand(&head, &cur));
            cur.clear();
        } else {
            cur.push(ch);
        }
    }
    if !cur.trim().is_empty() {
        out.extend(expand(&head, &cur));
    }
    out
}

/// The `crate::`/`super::`/`self::` paths `code` names.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` items, trees expanded.
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before_ok = i == 0
            || !rest.as_bytes()[i - 1].is_ascii_alphanumeric() && rest.as_bytes()[i - 1] != b'_';
        let after = &rest[i + 4..];
        let Some(end) = after.find(';') else { break };
        let tree: String = after[..end].split_whitespace().collect();
        if before_ok
            && ["crate::", "super::", "self::"]
                .iter()
                .any(|p| tree.starts_with(p))
        {
            out.extend(expand(&[], &tree));
        }
        rest = &after[end..];
    }
    // Inline paths.
    for start in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            let prev = code[..at].chars().next_back();
            from = at + start.len();
            if prev.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            out.push(
                path.split("::")
                    .filter(|x| !x.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
    }
    out
}

/// The module file a path from module `at` lands in: the longest prefix that
/// is a module.
fn resolve(at: &Module, path: &[String], mods: &BTreeMap<Module, PathBuf>) -> Option<Module> {
    let (mut base, mut rest): (Module, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (at.clone(), &path[1..]),
        Some("super") => (at.clone(), path),
        _ => return None,
    };
    while rest.first().is_some_and(|p| p == "super") {
        base.pop();
        rest = &rest[1..];
    }
    let mut best = None;
    for n in 0..=rest.len() {
        let mut m = base.clone();
        m.extend(rest[..n].iter().cloned());
        if mods.contains_key(&m) {
            best = Some(m);
        }
    }
    best
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "(crate root)".into()
    } else {
        m.join("/")
    }
}

/// The strongly connected groups of more than one module in `edges`, each as
/// one circle through all of them (`a -> b -> c -> a`), found with Tarjan's
/// algorithm.
fn circles(edges: &BTreeSet<(Module, Module)>) -> Vec<Vec<Module>> {
    let mut next: BTreeMap<&Module, Vec<&Module>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct Walk<'a> {
        next: &'a BTreeMap<&'a Module, Vec<&'a Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        groups: Vec<Vec<&'a Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for &w in &self.next[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on_stack.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    group.push(w);
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.groups.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for v in next.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    // One circle per group: from its first module, a shortest way back to it
    // through the group (breadth first).
    let mut out = Vec::new();
    for group in walk.groups {
        let members: BTreeSet<&Module> = group.iter().copied().collect();
        let Some(&start) = members.iter().next() else {
            continue;
        };
        let mut came: BTreeMap<&Module, &Module> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut last = None;
        'search: while let Some(v) = queue.pop_front() {
            for &w in &next[v] {
                if !members.contains(w) {
                    continue;
                }
                if w == start {
                    last = Some(v);
                    break 'search;
                }
                if !came.contains_key(w) {
                    came.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut circle = vec![start.clone()];
        let mut at = last;
        while let Some(v) = at {
            if v == start {
                break;
            }
            circle.push(v.clone());
            at = came.get(v).copied();
        }
        circle.push(start.clone());
        circle.reverse();
        out.push(circle);
    }
    out
}

/// The import edges between the files of `root`.
fn imports(root: &str) -> BTreeSet<(Module, Module)> {
    let dir = workspace().join(root);
    let mods = modules(&dir);
    assert!(mods.len() > 1, "no sources found under {}", dir.display());
    let mut edges: BTreeSet<(Module, Module)> = BTreeSet::new();
    for (m, file) in &mods {
        let Ok(text) = std::fs::read_to_string(file) else {
            panic!("cannot read {}", file.display());
        };
        for p in paths(&code_of(&text)) {
            if let Some(to) = resolve(m, &p, &mods)
                && &to != m
            {
                edges.insert((m.clone(), to));
            }
        }
    }
    edges
}

#[test]
fn no_files_import_each_other_round_a_circle() {
    let mut found = Vec::new();
    for root in ROOTS {
        for c in circles(&imports(root)) {
            let names: Vec<String> = c.iter().map(name).collect();
            found.push(format!("{root}: {}", names.join(" -> ")));
        }
    }
    assert!(
        found.is_empty(),
        "these files import each other, round a circle; move what they share to the module that owns it, or to one of its own:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_checker_sees_a_circle_of_three() {
    let m = |s: &str| vec![s.to_string()];
    let edges: BTreeSet<(Module, Module)> = [
        (m("argv"), m("embedded")),
        (m("embedded"), m("shell")),
        (m("shell"), m("argv")),
        (m("shell"), m("words")),
        (m("x"), m("y")),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        circles(&edges),
        vec![vec![m("argv"), m("embedded"), m("shell"), m("argv")]]
    );
    let pair: BTreeSet<(Module, Module)> =
        [(m("a"), m("b")), (m("b"), m("a"))].into_iter().collect();
    assert_eq!(circles(&pair), vec![vec![m("a"), m("b"), m("a")]]);
}

#[test]
fn the_checker_sees_a_pair_that_imports_each_other() {
    // The check above must be able to fail: two modules naming each other.
    let mods: BTreeMap<Module, PathBuf> = [
        (vec![], PathBuf::new()),
        (vec!["a".to_string()], PathBuf::new()),
        (vec!["b".to_string()], PathBuf::new()),
    ]
    .into_iter()
    .collect();
    let a_code = code_of("use crate::b::{Thing, other::X};\n// use crate::c;\n");
    let b_code = code_of("fn f() { super::a::g() }\n#[cfg(test)]\nmod tests { use crate::c; }");
    let a_to: Vec<_> = paths(&a_code)
        .iter()
        .filter_map(|p| resolve(&vec!["a".into()], p, &mods))
        .collect();
    let b_to: Vec<_> = paths(&b_code)
        .iter()
        .filter_map(|p| resolve(&vec!["b".into()], p, &mods))
        .collect();
    assert!(a_to.contains(&vec!["b".to_string()]), "{a_to:?}");
    assert!(b_to.contains(&vec!["a".to_string()]), "{b_to:?}");
    assert!(
        paths(&b_code)
            .iter()
            .all(|p| p.last().is_none_or(|l| l != "c"))
    );
}

/// The `[dependencies]` table of a crate's manifest, as text.
fn dependencies(manifest: &str) -> String {
    let Ok(text) = std::fs::read_to_string(workspace().join(manifest)) else {
        panic!("cannot read {manifest}");
    };
    let Some(start) = text.find("\n[dependencies]") else {
        panic!("{manifest} has no [dependencies]");
    };
    let table = &text[start + 1..];
    let end = table[1..].find("\n[").map_or(table.len(), |i| i + 1);
    table[..end].to_string()
}

#[test]
fn the_crates_go_one_way() {
    let core = dependencies("core/Cargo.toml");
    for above in ["reqwest", "berth-tools", "berth-agent", "berth-backends"] {
        assert!(
            !core.lines().any(|l| l.starts_with(above)),
            "berth-core depends on {above}"
        );
    }
    let tools = dependencies("tools/Cargo.toml");
    for above in ["reqwest", "berth-agent", "berth-backends"] {
        assert!(
            !tools.lines().any(|l| l.starts_with(above)),
            "berth-tools depends on {above}"
        );
    }
    assert!(
        dependencies("agent/Cargo.toml")
            .lines()
            .any(|l| l.starts_with("berth-tools")),
        "berth-agent should reach the tools through berth-tools"
    );
    // The service layer answers typed calls: no command line (clap) and no
    // front end (the binary, the client, the agent) below it.
    let service = dependencies("service/Cargo.toml");
    for above in ["clap", "berth-client", "berth-agent", "berth-tools"] {
        assert!(
            !service.lines().any(|l| l.starts_with(above)),
            "berth-service depends on {above}"
        );
    }
    // The server and what runs beside it answer typed calls and events: no
    // command line (clap) in any of them. The CLI parses and prints.
    for c in ["server", "ui", "mcp", "schedules", "webhooks"] {
        let deps = dependencies(&format!("{c}/Cargo.toml"));
        assert!(
            !deps.lines().any(|l| l.starts_with("clap")),
            "berth-{c} depends on clap"
        );
    }
}

/// The `.rs` files under `dir`, with their text.
fn sources(dir: &str) -> Vec<(PathBuf, String)> {
    let root = workspace().join(dir);
    let mut out = Vec::new();
    for (_, p) in modules(&root) {
        let Ok(text) = std::fs::read_to_string(&p) else {
            panic!("cannot read {}", p.display());
        };
        out.push((p, text));
    }
    assert!(!out.is_empty(), "no sources under {}", root.display());
    out
}

#[test]
fn the_dashboard_mcp_and_server_hold_no_sql() {
    // They ask the service and the crates that own the tables; a raw
    // connection or a statement here would reach another crate's tables.
    for c in ["server", "ui", "mcp", "webhooks"] {
        let deps = dependencies(&format!("{c}/Cargo.toml"));
        assert!(
            !deps.lines().any(|l| l.starts_with("rusqlite")),
            "berth-{c} depends on rusqlite"
        );
        for (p, text) in sources(&format!("{c}/src")) {
            let code = code_of(&text);
            for word in [
                "SELECT ",
                "INSERT ",
                "UPDATE ",
                "DELETE FROM",
                "with_conn",
                "with_db",
            ] {
                assert!(!code.contains(word), "{} holds SQL ({word:?})", p.display());
            }
        }
    }
}
