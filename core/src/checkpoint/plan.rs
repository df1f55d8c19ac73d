//! What a restore must do: the records [`super::scripts::RESTORE`] reads.
//!
//! - `Q<pack>`: a pack to extract from; `P<pack>:./path`: a member of it.
//! - `V<line>`: a `sha256sum -c` line for an extracted file.
//! - `R./path`: remove (a path the target lacks, or of another kind).
//! - `D./path`: a directory to create.
//! - `O<mode>`: a mode used below; `M<mode>:./path`: a directory to set to it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::manifest::{Entry, Kind, Manifest, check_line};

/// The records, and what they amount to.
pub(super) struct Plan {
    /// The records, each ended by a NUL.
    pub records: Vec<u8>,
    /// Files and links written back.
    pub written: usize,
    /// Paths removed (a removed directory counts once).
    pub removed: usize,
}

fn record(out: &mut Vec<u8>, tag: &[u8], body: &[u8]) {
    out.extend_from_slice(tag);
    out.extend_from_slice(body);
    out.push(0);
}

/// Whether `path` lies under one of `dirs` (which are whole removals).
fn under_any(path: &[u8], dirs: &BTreeSet<Vec<u8>>) -> bool {
    let mut p = path;
    while let Some(cut) = p.iter().rposition(|&b| b == b'/') {
        p = &p[..cut];
        if dirs.contains(p) {
            return true;
        }
    }
    false
}

/// The plan that turns `now` into `target`. `base` vouches for files it
/// shows untouched: their digest is known without reading them.
pub(super) fn plan(target: &Manifest, now: &[Entry], base: Option<&Manifest>) -> Plan {
    let now: HashMap<&[u8], &Entry> = now.iter().map(|e| (e.path.as_slice(), e)).collect();
    let mut remove: BTreeSet<Vec<u8>> = BTreeSet::new();
    let mut mkdir: Vec<&Entry> = Vec::new();
    let mut chmod: BTreeMap<u32, Vec<&[u8]>> = BTreeMap::new();
    let mut extract: BTreeMap<&str, Vec<&Entry>> = BTreeMap::new();
    // Paths the target lacks.
    for (path, e) in &now {
        if !target.entries.contains_key(*path) {
            remove.insert(e.path.clone());
        }
    }
    for t in target.entries.values() {
        let cur = now.get(t.path.as_slice()).copied();
        match t.kind {
            Kind::Dir => match cur {
                Some(c) if c.kind == Kind::Dir => {
                    if c.mode != t.mode {
                        chmod.entry(t.mode).or_default().push(&t.path);
                    }
                }
                other => {
                    if other.is_some() {
                        remove.insert(t.path.clone());
                    }
                    mkdir.push(t);
                    chmod.entry(t.mode).or_default().push(&t.path);
                }
            },
            Kind::File | Kind::Link => {
                let untouched = cur.is_some_and(|c| {
                    c.same_stat(t)
                        || (c.kind == t.kind
                            && c.mode == t.mode
                            && c.link == t.link
                            && base.and_then(|b| b.entries.get(&t.path)).is_some_and(|b| {
                                b.same_stat(c) && !b.hash.is_empty() && b.hash == t.hash
                            }))
                });
                if untouched {
                    continue;
                }
                if cur.is_some_and(|c| c.kind == Kind::Dir) {
                    remove.insert(t.path.clone());
                }
                extract.entry(t.pack.as_str()).or_default().push(t);
            }
        }
    }
    // A directory the copy passes through gets the copy's mode; set it back.
    let dirs_touched: BTreeSet<&[u8]> = extract
        .values()
        .flatten()
        .flat_map(|e| {
            let mut parents = Vec::new();
            let mut p = e.path.as_slice();
            while let Some(cut) = p.iter().rposition(|&b| b == b'/') {
                p = &p[..cut];
                parents.push(p);
            }
            parents
        })
        .collect();
    for d in dirs_touched {
        if let Some(t) = target.entries.get(d)
            && t.kind == Kind::Dir
            && !chmod.get(&t.mode).is_some_and(|v| v.contains(&d))
        {
            chmod.entry(t.mode).or_default().push(&t.path);
        }
    }
    let mut records = Vec::new();
    let mut written = 0;
    for (pack, entries) in &extract {
        record(&mut records, b"Q", pack.as_bytes());
        for e in entries {
            let mut member = pack.as_bytes().to_vec();
            member.push(b':');
            member.extend_from_slice(&e.dotted());
            record(&mut records, b"P", &member);
            if e.kind == Kind::File {
                record(&mut records, b"V", &check_line(&e.hash, &e.dotted()));
            }
            written += 1;
        }
    }
    // Only the topmost of nested removals.
    let mut top: BTreeSet<Vec<u8>> = BTreeSet::new();
    for p in &remove {
        if !under_any(p, &top) {
            top.insert(p.clone());
        }
    }
    for p in &top {
        let mut d = b"./".to_vec();
        d.extend_from_slice(p);
        record(&mut records, b"R", &d);
    }
    for e in mkdir {
        record(&mut records, b"D", &e.dotted());
    }
    for (mode, paths) in &chmod {
        let m = format!("{mode:o}");
        record(&mut records, b"O", m.as_bytes());
        for p in paths {
            let mut r = m.as_bytes().to_vec();
            r.extend_from_slice(b":./");
            r.extend_from_slice(p);
            record(&mut records, b"M", &r);
        }
    }
    Plan {
        records,
        written,
        removed: top.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(path: &str, kind: Kind, ino: u64, hash: &str) -> Entry {
        Entry {
            path: path.as_bytes().to_vec(),
            kind,
            mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
            size: 1,
            mtime: "1".into(),
            ctime: "1".into(),
            ino,
            link: vec![],
            hash: hash.into(),
            pack: if kind == Kind::Dir {
                String::new()
            } else {
                "k1".into()
            },
        }
    }

    fn records(p: &Plan) -> Vec<String> {
        p.records
            .split(|&b| b == 0)
            .filter(|r| !r.is_empty())
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()
    }

    #[test]
    fn a_plan_removes_what_is_new_and_writes_back_what_changed() {
        let mut target = Manifest::default();
        for x in [
            e("d", Kind::Dir, 1, ""),
            e("d/kept", Kind::File, 2, "aa"),
            e("d/changed", Kind::File, 3, "bb"),
            e("gone", Kind::File, 4, "cc"),
        ] {
            target.entries.insert(x.path.clone(), x);
        }
        let now = vec![
            e("d", Kind::Dir, 1, ""),
            e("d/kept", Kind::File, 2, ""),
            e("d/changed", Kind::File, 30, ""),
            e("new", Kind::Dir, 5, ""),
            e("new/inner", Kind::File, 6, ""),
        ];
        let p = plan(&target, &now, None);
        let r = records(&p);
        assert!(r.contains(&"Qk1".to_string()), "{r:?}");
        assert!(r.contains(&"Pk1:./d/changed".to_string()), "{r:?}");
        assert!(r.contains(&"Pk1:./gone".to_string()), "{r:?}");
        assert!(!r.iter().any(|x| x.contains("d/kept")), "{r:?}");
        assert!(r.contains(&"R./new".to_string()), "{r:?}");
        assert!(!r.contains(&"R./new/inner".to_string()), "{r:?}");
        assert!(r.contains(&"Vbb  ./d/changed".to_string()), "{r:?}");
        assert_eq!((p.written, p.removed), (2, 1));
    }

    #[test]
    fn a_file_the_base_vouches_for_is_not_written_again() {
        let mut target = Manifest::default();
        let t = e("f", Kind::File, 1, "aa");
        target.entries.insert(t.path.clone(), t);
        let now = vec![e("f", Kind::File, 9, "")];
        let mut base = Manifest::default();
        let b = e("f", Kind::File, 9, "aa");
        base.entries.insert(b.path.clone(), b);
        assert_eq!(plan(&target, &now, Some(&base)).written, 0);
        assert_eq!(plan(&target, &now, None).written, 1);
    }

    #[test]
    fn a_path_of_another_kind_is_removed_first() {
        let mut target = Manifest::default();
        let t = e("x", Kind::Dir, 1, "");
        target.entries.insert(t.path.clone(), t);
        let mut link = e("x", Kind::Link, 2, "");
        link.link = b"/etc".to_vec();
        let r = records(&plan(&target, &[link], None));
        assert!(
            r.contains(&"R./x".to_string()) && r.contains(&"D./x".to_string()),
            "{r:?}"
        );
    }
}
