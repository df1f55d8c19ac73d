//! A checkpoint's manifest: every file, directory and link of a workspace
//! with its metadata, where its bytes are kept (a pack) and their digest.
//!
//! The same record is the scan's output (`find -printf`) and the stored
//! manifest, so a path is carried as bytes, whatever it holds (a newline, a
//! tab, bytes that are not UTF-8), and never parsed as text.

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link, kept as a link and never followed.
    Link,
}

impl Kind {
    fn letter(self) -> u8 {
        match self {
            Kind::File => b'f',
            Kind::Dir => b'd',
            Kind::Link => b'l',
        }
    }
}

/// One path of the workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the workspace, without a leading `./`.
    pub path: Vec<u8>,
    /// File, directory or link.
    pub kind: Kind,
    /// Permission bits, octal as `find` prints them.
    pub mode: u32,
    /// Size in bytes.
    pub size: u64,
    /// Modification and change times and inode, as printed: together with
    /// the size, the stat cache that tells an untouched file without reading it.
    pub mtime: String,
    /// The change time (a write that restores the mtime still moves it).
    pub ctime: String,
    /// The inode number.
    pub ino: u64,
    /// A link's target, as stored in the link.
    pub link: Vec<u8>,
    /// A file's SHA-256, hex; empty until the file is stored.
    pub hash: String,
    /// The pack that holds the file or link; empty until it is stored.
    pub pack: String,
}

impl Entry {
    /// Whether `other` is this same path left untouched: same kind, bits,
    /// size, times, inode and link target.
    pub fn same_stat(&self, other: &Entry) -> bool {
        self.kind == other.kind
            && self.mode == other.mode
            && self.size == other.size
            && self.mtime == other.mtime
            && self.ctime == other.ctime
            && self.ino == other.ino
            && self.link == other.link
    }

    /// Whether the entry's content is stored (directories have none).
    pub fn stored(&self) -> bool {
        self.kind == Kind::Dir || !self.pack.is_empty()
    }

    /// The path as `./path`, safe as an operand of any tool.
    pub fn dotted(&self) -> Vec<u8> {
        let mut p = b"./".to_vec();
        p.extend_from_slice(&self.path);
        p
    }

    /// The path for messages.
    pub fn shown(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }
}

/// A special file a scan found and a checkpoint leaves out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Relative path.
    pub path: String,
    /// What it is: fifo, socket, device.
    pub what: &'static str,
}

/// Every entry of a workspace, by path.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Keyed by path bytes, so parents sort before their children.
    pub entries: BTreeMap<Vec<u8>, Entry>,
    /// Each pack's stat (size, change time, inode) when berth wrote it or
    /// last found it whole: a pack whose stat moved was written by someone
    /// else, and is not trusted again.
    pub stamps: BTreeMap<String, String>,
}

impl Manifest {
    /// Files, by count.
    pub fn files(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.kind == Kind::File)
            .count()
    }

    /// Bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.entries
            .values()
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.size)
            .sum()
    }

    /// The packs the entries name.
    pub fn packs(&self) -> std::collections::BTreeSet<String> {
        self.entries
            .values()
            .filter(|e| !e.pack.is_empty())
            .map(|e| e.pack.clone())
            .collect()
    }

    /// The stored form: one record per entry, `KIND MODE SIZE MTIME CTIME INO
    /// HASH PACK`, then the path and the link target, each ended by a NUL.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for e in self.entries.values() {
            out.extend_from_slice(
                format!(
                    "{} {:o} {} {} {} {} {} {}\0",
                    e.kind.letter() as char,
                    e.mode,
                    e.size,
                    e.mtime,
                    e.ctime,
                    e.ino,
                    dash(&e.hash),
                    dash(&e.pack)
                )
                .as_bytes(),
            );
            out.extend_from_slice(&e.path);
            out.push(0);
            out.extend_from_slice(&e.link);
            out.push(0);
        }
        // A pack's stamp: a record of kind `p`, its name as the path and its
        // stamp as the link.
        for (pack, stamp) in &self.stamps {
            out.extend_from_slice(b"p 0 0 - - 0 - -\0");
            out.extend_from_slice(pack.as_bytes());
            out.push(0);
            out.extend_from_slice(stamp.as_bytes());
            out.push(0);
        }
        out
    }

    /// Read the stored form back.
    pub fn decode(data: &[u8]) -> Result<Manifest> {
        let bad = |why: &str| Error::Store(format!("a checkpoint's manifest is damaged: {why}"));
        let mut m = Manifest::default();
        let mut fields = data.split(|&b| b == 0);
        while let Some(head) = fields.next().filter(|h| !h.is_empty()) {
            let path = fields.next().ok_or_else(|| bad("a record has no path"))?;
            let link = fields.next().ok_or_else(|| bad("a record has no link"))?;
            let head = std::str::from_utf8(head).map_err(|_| bad("a header is not text"))?;
            let f: Vec<&str> = head.split(' ').collect();
            if f.len() != 8 {
                return Err(bad("a header has the wrong number of fields"));
            }
            if f[0] == "p" {
                m.stamps.insert(
                    String::from_utf8_lossy(path).into_owned(),
                    String::from_utf8_lossy(link).into_owned(),
                );
                continue;
            }
            let kind = match f[0] {
                "f" => Kind::File,
                "d" => Kind::Dir,
                "l" => Kind::Link,
                _ => return Err(bad("unknown entry kind")),
            };
            let e = Entry {
                path: path.to_vec(),
                kind,
                mode: u32::from_str_radix(f[1], 8).map_err(|_| bad("mode"))?,
                size: f[2].parse().map_err(|_| bad("size"))?,
                mtime: f[3].to_string(),
                ctime: f[4].to_string(),
                ino: f[5].parse().map_err(|_| bad("inode"))?,
                link: link.to_vec(),
                hash: undash(f[6]),
                pack: undash(f[7]),
            };
            m.entries.insert(e.path.clone(), e);
        }
        Ok(m)
    }
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

fn undash(s: &str) -> String {
    if s == "-" {
        String::new()
    } else {
        s.to_string()
    }
}

/// What a scan printed: `find -printf '%y %m %s %T@ %C@ %i %P\0%l\0'` per
/// path (`%p` with `dotted`), up to an empty header or the end.
/// Returns the entries, the special files, and the bytes after the header.
pub fn parse_scan(data: &[u8], dotted: bool) -> Result<(Vec<Entry>, Vec<Skipped>, &[u8])> {
    let bad = |why: String| Error::Store(format!("a workspace scan printed {why}"));
    let mut entries = Vec::new();
    let mut skipped = Vec::new();
    let mut rest = data;
    loop {
        let Some(end) = rest.iter().position(|&b| b == 0) else {
            if rest.is_empty() {
                return Ok((entries, skipped, rest));
            }
            return Err(bad("a record cut short".into()));
        };
        let head = &rest[..end];
        rest = &rest[end + 1..];
        if head.is_empty() {
            return Ok((entries, skipped, rest));
        }
        let link_end = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| bad("a record without its link field".into()))?;
        let link = rest[..link_end].to_vec();
        rest = &rest[link_end + 1..];
        // Six space-separated fields, then the path (which may hold spaces).
        let mut parts = head.splitn(7, |&b| b == b' ');
        let mut next = || -> Result<&str> {
            let p = parts
                .next()
                .ok_or_else(|| bad("a header with too few fields".into()))?;
            std::str::from_utf8(p).map_err(|_| bad("a header that is not text".into()))
        };
        let (y, mode, size, mtime, ctime, ino) =
            (next()?, next()?, next()?, next()?, next()?, next()?);
        let mut path = parts.next().unwrap_or_default().to_vec();
        if dotted {
            path = path.strip_prefix(b"./").map(<[u8]>::to_vec).unwrap_or(path);
        }
        if path.is_empty() || path == b"." {
            continue;
        }
        let kind = match y {
            "f" => Kind::File,
            "d" => Kind::Dir,
            "l" => Kind::Link,
            other => {
                skipped.push(Skipped {
                    path: String::from_utf8_lossy(&path).into_owned(),
                    what: match other {
                        "p" => "fifo",
                        "s" => "socket",
                        "b" | "c" => "device",
                        _ => "unreadable entry",
                    },
                });
                continue;
            }
        };
        entries.push(Entry {
            path,
            kind,
            mode: u32::from_str_radix(mode, 8).map_err(|_| bad(format!("mode {mode:?}")))?,
            size: size.parse().map_err(|_| bad(format!("size {size:?}")))?,
            mtime: mtime.to_string(),
            ctime: ctime.to_string(),
            ino: ino.parse().map_err(|_| bad(format!("inode {ino:?}")))?,
            link: if kind == Kind::Link { link } else { Vec::new() },
            hash: String::new(),
            pack: String::new(),
        });
    }
}

/// The hashes `sha256sum` printed, one line per file in the order asked.
pub fn parse_sums(text: &[u8], want: usize) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(want);
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        // An escaped name (a backslash or newline in it) starts the line with `\`.
        let line = line.strip_prefix(b"\\").unwrap_or(line);
        let hash = line.get(..64).and_then(|h| std::str::from_utf8(h).ok());
        match hash {
            Some(h) if h.bytes().all(|b| b.is_ascii_hexdigit()) => out.push(h.to_string()),
            _ => {
                return Err(Error::Store(
                    "sha256sum printed a line that is not a digest".into(),
                ));
            }
        }
    }
    if out.len() != want {
        return Err(Error::Store(format!(
            "sha256sum gave {} digests for {want} files",
            out.len()
        )));
    }
    Ok(out)
}

/// A `sha256sum -c` line for `hash` and `./path`: a name holding a newline or
/// a backslash is escaped and the line marked with a leading backslash.
pub fn check_line(hash: &str, dotted: &[u8]) -> Vec<u8> {
    let needs = dotted.iter().any(|&b| b == b'\n' || b == b'\\');
    let mut line = Vec::new();
    if needs {
        line.push(b'\\');
    }
    line.extend_from_slice(hash.as_bytes());
    line.extend_from_slice(b"  ");
    for &b in dotted {
        match b {
            b'\n' if needs => line.extend_from_slice(b"\\n"),
            b'\\' if needs => line.extend_from_slice(b"\\\\"),
            _ => line.push(b),
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &[u8], kind: Kind) -> Entry {
        Entry {
            path: path.to_vec(),
            kind,
            mode: 0o644,
            size: 3,
            mtime: "1.5".into(),
            ctime: "2.25".into(),
            ino: 7,
            link: if kind == Kind::Link {
                b"../outside target".to_vec()
            } else {
                vec![]
            },
            hash: if kind == Kind::File {
                "ab".repeat(32)
            } else {
                String::new()
            },
            pack: if kind == Kind::Dir {
                String::new()
            } else {
                "k1".into()
            },
        }
    }

    #[test]
    fn a_manifest_reads_back_whatever_its_paths_hold() -> Result<()> {
        let mut m = Manifest::default();
        for e in [
            entry(b"plain.txt", Kind::File),
            entry(b"a dir", Kind::Dir),
            entry(b"new\nline and\ttab \xff", Kind::File),
            entry(b"link", Kind::Link),
        ] {
            m.entries.insert(e.path.clone(), e);
        }
        let back = Manifest::decode(&m.encode())?;
        assert_eq!(back, m);
        assert_eq!(back.files(), 2);
        assert_eq!(back.packs().len(), 1);
        assert!(Manifest::decode(b"f 644 3\0x\0").is_err());
        Ok(())
    }

    #[test]
    fn a_scan_keeps_links_and_reports_special_files() -> Result<()> {
        let data = b"f 644 5 1.0 1.0 9 a b\0\0d 755 4096 1.0 1.0 10 dir\0\0l 777 3 1.0 1.0 11 ln\0/etc/passwd\0p 644 0 1.0 1.0 12 fifo\0\0\0TAIL";
        let (entries, skipped, rest) = parse_scan(data, false)?;
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].path, b"a b");
        assert_eq!(entries[2].link, b"/etc/passwd");
        assert_eq!(
            skipped,
            vec![Skipped {
                path: "fifo".into(),
                what: "fifo"
            }]
        );
        assert_eq!(rest, b"TAIL");
        assert!(parse_scan(b"f 644 5\0", false).is_err());
        Ok(())
    }

    #[test]
    fn sums_and_check_lines_escape_odd_names() -> Result<()> {
        let h = "0f".repeat(32);
        let out = format!("{h}  ./a\n\\{h}  ./b\\nc\n");
        assert_eq!(parse_sums(out.as_bytes(), 2)?, vec![h.clone(), h.clone()]);
        assert!(parse_sums(out.as_bytes(), 3).is_err());
        assert_eq!(check_line(&h, b"./a"), format!("{h}  ./a").into_bytes());
        assert_eq!(
            check_line(&h, b"./b\nc"),
            format!("\\{h}  ./b\\nc").into_bytes()
        );
        Ok(())
    }
}
