//! The shape of the code, checked: no two source files import each other, and
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

#[test]
fn no_two_files_import_each_other() {
    let mut pairs = Vec::new();
    for root in ROOTS {
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
        for (a, b) in &edges {
            if a < b && edges.contains(&(b.clone(), a.clone())) {
                pairs.push(format!("{root}: {} <-> {}", name(a), name(b)));
            }
        }
    }
    assert!(
        pairs.is_empty(),
        "these files import each other; move what both need to the module that owns it, or to a third:\n{}",
        pairs.join("\n")
    );
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
}
