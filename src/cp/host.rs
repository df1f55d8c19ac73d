//! This machine's side of `berth cp`: a tree walked and packed into a tar
//! stream for the sandbox, and a stream from the sandbox checked and
//! unpacked here (or passed on as an archive).
//!
//! Everything here is blocking I/O, run on a blocking thread; the bytes
//! reach the sandbox's `tar` through `super::pipe`.
//!
//! A stream from a sandbox is untrusted, since the sandbox's own code may
//! have written it. Every entry must lie beneath the place the copy was
//! asked for (no absolute name, no `..`), and unpacking never writes
//! through a link out of it: the tar crate's `unpack_in` checks each
//! entry's real parent. Ownership is never taken from an archive; files
//! copied out are the user's.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};

/// What a copy moved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Regular files, links and other entries that are not directories.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Bytes of the regular files' contents.
    pub bytes: u64,
    /// What was not copied, and why (a FIFO, a socket, a device).
    pub left_out: Vec<String>,
}

impl Counts {
    fn count(&mut self, kind: tar::EntryType, size: u64) {
        if kind.is_dir() {
            self.dirs += 1;
        } else {
            self.files += 1;
            if kind.is_file() || kind == tar::EntryType::Continuous {
                self.bytes += size;
            }
        }
    }
}

/// One path of a tree on this machine.
#[derive(Debug)]
pub struct Item {
    /// Where it is.
    pub path: PathBuf,
    /// Its path below the top of the tree; empty for the top itself.
    pub rel: PathBuf,
    /// Bytes, for a regular file.
    pub size: u64,
    /// Whether it is a directory.
    pub dir: bool,
}

/// A tree on this machine, walked before it is sent: what it holds is
/// judged by the policy path by path before a byte leaves.
#[derive(Debug, Default)]
pub struct Tree {
    /// Directories before what they hold, names in order.
    pub items: Vec<Item>,
    /// Bytes of its regular files.
    pub bytes: u64,
    /// FIFOs, sockets and devices, which are not sent.
    pub left_out: Vec<String>,
    /// Whether the top is a directory.
    pub is_dir: bool,
}

/// Walk `top` without following links (but `top` itself when `follow`).
pub fn walk(top: &Path, follow: bool) -> Result<Tree> {
    let meta = if follow {
        fs::metadata(top)
    } else {
        fs::symlink_metadata(top)
    };
    let meta = meta.map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => anyhow!(
            "`{}` does not exist on this machine; check the path (a path in the sandbox is written `:PATH`)",
            top.display()
        ),
        _ => anyhow!("cannot read `{}`: {e}", top.display()),
    })?;
    let mut tree = Tree {
        is_dir: meta.is_dir(),
        ..Tree::default()
    };
    let mut stack = vec![(top.to_path_buf(), PathBuf::new(), meta)];
    while let Some((path, rel, meta)) = stack.pop() {
        let ft = meta.file_type();
        if ft.is_dir() {
            let mut children = fs::read_dir(&path)
                .and_then(|d| d.collect::<io::Result<Vec<_>>>())
                .with_context(|| format!("cannot read directory `{}`", path.display()))?;
            children.sort_by_key(|c| c.file_name());
            for c in children.into_iter().rev() {
                let p = c.path();
                let m = fs::symlink_metadata(&p)
                    .with_context(|| format!("cannot read `{}`", p.display()))?;
                stack.push((p, rel.join(c.file_name()), m));
            }
        } else if !ft.is_file() && !ft.is_symlink() {
            tree.left_out.push(format!(
                "{} (not a file, directory or link)",
                path.display()
            ));
            continue;
        }
        let size = if ft.is_file() { meta.len() } else { 0 };
        tree.bytes += size;
        tree.items.push(Item {
            path,
            rel,
            size,
            dir: ft.is_dir(),
        });
    }
    Ok(tree)
}

/// The name an item takes in the archive: `top/rel`, or `rel` alone when
/// `top` is `None` (a directory's contents, which skips the top itself).
pub fn archive_name(top: Option<&str>, rel: &Path) -> Option<PathBuf> {
    match top {
        Some(t) if rel.as_os_str().is_empty() => Some(PathBuf::from(t)),
        Some(t) => Some(Path::new(t).join(rel)),
        None if rel.as_os_str().is_empty() => None,
        None => Some(rel.to_path_buf()),
    }
}

/// Pack `tree` into `out` as a tar stream, under `top` (see [`archive_name`]).
pub fn pack(tree: &Tree, top: Option<&str>, out: impl Write) -> Result<Counts> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    let mut counts = Counts {
        left_out: tree.left_out.clone(),
        ..Counts::default()
    };
    for item in &tree.items {
        let Some(name) = archive_name(top, &item.rel) else {
            continue;
        };
        b.append_path_with_name(&item.path, &name)
            .map_err(|e| stream_error(e, format!("cannot send `{}`", item.path.display())))?;
        if item.dir {
            counts.dirs += 1;
        } else {
            counts.files += 1;
            counts.bytes += item.size;
        }
    }
    b.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| stream_error(e, "cannot finish the archive".into()))?;
    Ok(counts)
}

/// The other side of the stream stopped taking it: its own error says why.
#[derive(Debug)]
pub struct SideStopped(String);

impl std::fmt::Display for SideStopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: the other side of the copy stopped", self.0)
    }
}

impl std::error::Error for SideStopped {}

/// An I/O error of the stream with what was being done.
fn stream_error(e: io::Error, doing: String) -> anyhow::Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        anyhow::Error::new(SideStopped(doing))
    } else {
        anyhow!("{doing}: {e}")
    }
}

/// `path`, an entry's name in an archive, as a relative path of plain names
/// (`.` parts dropped); an absolute name or a `..` is refused, since it
/// would land outside the copy.
pub fn checked_rel(path: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            _ => bail!(
                "the archive has an entry `{}` that leads outside the copy; it was refused, with all that follows it",
                path.display()
            ),
        }
    }
    Ok(out)
}

/// Entries that carry no file of their own (extension headers).
fn is_meta(kind: tar::EntryType) -> bool {
    kind.is_pax_global_extensions()
        || kind.is_pax_local_extensions()
        || kind.is_gnu_longname()
        || kind.is_gnu_longlink()
}

/// Entries that are neither a file, a directory nor a link: not unpacked here.
fn is_special(kind: tar::EntryType) -> bool {
    kind.is_fifo() || kind.is_character_special() || kind.is_block_special()
}

fn archive<R: Read>(r: R) -> tar::Archive<R> {
    let mut a = tar::Archive::new(r);
    a.set_preserve_permissions(false);
    a.set_preserve_ownerships(false);
    a.set_unpack_xattrs(false);
    a.set_overwrite(true);
    a
}

/// Call `f` with each entry of an archive from the sandbox, its kind and
/// its checked relative path (see [`checked_rel`]); pax and GNU metadata
/// entries are skipped.
fn each_entry<R: Read>(
    r: R,
    mut f: impl FnMut(&mut tar::Entry<'_, R>, tar::EntryType, PathBuf) -> Result<()>,
) -> Result<()> {
    let mut a = archive(r);
    let entries = a
        .entries()
        .context("cannot read the archive from the sandbox")?;
    for entry in entries {
        let mut e = entry.context("cannot read the archive from the sandbox")?;
        let kind = e.header().entry_type();
        if is_meta(kind) {
            continue;
        }
        let rel = checked_rel(&e.path()?)?;
        f(&mut e, kind, rel)?;
    }
    Ok(())
}

/// Unpack a stream of a directory's entries (`./`, `./a`, `./a/b`...) into
/// `root`, made first when `make_root`. Directories the archive makes
/// unwritable get their mode at the end, so what they hold can be written.
pub fn unpack_tree(r: impl Read, root: &Path, make_root: bool) -> Result<Counts> {
    if make_root {
        fs::create_dir(root)
            .with_context(|| format!("cannot create directory `{}`", root.display()))?;
    } else if !root.is_dir() {
        bail!("`{}` is not a directory", root.display());
    }
    let mut counts = Counts::default();
    // Directory modes to set once everything under them is written.
    let mut modes: Vec<(PathBuf, u32)> = Vec::new();
    each_entry(r, |e, kind, rel| {
        let mode = e.header().mode().unwrap_or(0o755) & 0o777;
        let at = root.join(&rel);
        if is_special(kind) {
            counts
                .left_out
                .push(format!("{} (not a file, directory or link)", at.display()));
            return Ok(());
        }
        if rel.as_os_str().is_empty() {
            if !kind.is_dir() {
                bail!("the archive from the sandbox does not start with its directory");
            }
            if make_root {
                modes.push((at, mode));
            }
            return Ok(());
        }
        let size = e.header().size().unwrap_or(0);
        e.unpack_in(root)
            .with_context(|| format!("cannot write `{}`", at.display()))?;
        if kind.is_dir() && mode & 0o700 != 0o700 {
            fs::set_permissions(&at, fs::Permissions::from_mode(mode | 0o700))
                .with_context(|| format!("cannot write into `{}`", at.display()))?;
            modes.push((at, mode));
        }
        counts.count(kind, size);
        Ok(())
    })?;
    for (p, mode) in modes.iter().rev() {
        fs::set_permissions(p, fs::Permissions::from_mode(*mode))
            .with_context(|| format!("cannot set the mode of `{}`", p.display()))?;
    }
    Ok(counts)
}

/// Unpack a stream of one entry called `name` (a file or a link) to
/// `target`: written beside it first, then renamed over it, so a failed
/// copy leaves `target` as it was.
pub fn unpack_one(r: impl Read, name: &str, target: &Path) -> Result<Counts> {
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let stage = tempfile::Builder::new()
        .prefix(".berth-cp-")
        .tempdir_in(parent)
        .with_context(|| format!("cannot write in `{}`", parent.display()))?;
    let mut counts = Counts::default();
    each_entry(r, |e, kind, rel| {
        if rel != Path::new(name) || counts.files > 0 {
            bail!(
                "the archive from the sandbox has `{}` where only `{name}` was asked for; nothing was written",
                rel.display()
            );
        }
        if kind.is_dir() || kind.is_hard_link() || is_special(kind) {
            bail!(
                "`{name}` changed in the sandbox during the copy (it is no longer a file or a link); nothing was written"
            );
        }
        let size = e.header().size().unwrap_or(0);
        e.unpack_in(stage.path())
            .with_context(|| format!("cannot write `{}`", target.display()))?;
        counts.count(kind, size);
        Ok(())
    })?;
    if counts.files == 0 {
        bail!("the archive from the sandbox was empty: `{name}` was not sent; nothing was written");
    }
    fs::rename(stage.path().join(name), target)
        .with_context(|| format!("cannot write `{}`", target.display()))?;
    Ok(counts)
}

/// Pass an archive from `r` to `w` entry by entry, each name checked (see
/// [`checked_rel`]) and handed to `judge` first; an entry that names the
/// top itself (`./`) is dropped, so the destination directory keeps its
/// own mode.
pub fn restream(
    r: impl Read,
    w: impl Write,
    judge: &mut dyn FnMut(&Path) -> Result<()>,
) -> Result<Counts> {
    let mut counts = Counts::default();
    let mut a = tar::Archive::new(r);
    let mut b = tar::Builder::new(w);
    let entries = a.entries().context("cannot read the archive")?;
    for entry in entries {
        let mut e = entry.context("cannot read the archive")?;
        let kind = e.header().entry_type();
        if is_meta(kind) {
            continue;
        }
        let rel = checked_rel(&e.path()?)?;
        if rel.as_os_str().is_empty() {
            continue;
        }
        judge(&rel)?;
        let mut h = e.header().clone();
        let size = h.size().unwrap_or(0);
        let passed = if kind.is_symlink() || kind.is_hard_link() {
            let target = e
                .link_name()?
                .ok_or_else(|| anyhow!("the link `{}` has no target", rel.display()))?
                .into_owned();
            if kind.is_hard_link() {
                checked_rel(&target)?;
            }
            b.append_link(&mut h, &rel, &target)
        } else {
            b.append_data(&mut h, &rel, &mut e)
        };
        passed.map_err(|e| stream_error(e, format!("cannot pass on `{}`", rel.display())))?;
        counts.count(kind, size);
    }
    b.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(|e| stream_error(e, "cannot finish the archive".into()))?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    fn sample(dir: &Path) -> io::Result<PathBuf> {
        let top = dir.join("src");
        fs::create_dir_all(top.join("sub"))?;
        fs::write(top.join("a.txt"), b"alpha")?;
        fs::write(top.join("sub/run.sh"), b"#!/bin/sh\necho hi\n")?;
        fs::set_permissions(top.join("sub/run.sh"), fs::Permissions::from_mode(0o755))?;
        symlink("a.txt", top.join("link"))?;
        Ok(top)
    }

    #[test]
    fn a_tree_packed_here_unpacks_the_same_with_links_and_modes() -> TestResult {
        let dir = tempfile::tempdir()?;
        let top = sample(dir.path())?;
        let tree = walk(&top, false)?;
        assert!(tree.is_dir);
        let rels: Vec<_> = tree.items.iter().map(|i| i.rel.clone()).collect();
        let want: Vec<PathBuf> = ["", "a.txt", "link", "sub", "sub/run.sh"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(rels, want);
        let mut tar = Vec::new();
        let sent = pack(&tree, None, &mut tar)?;
        assert_eq!((sent.files, sent.dirs, sent.bytes), (3, 1, 5 + 18));
        let out = dir.path().join("out");
        let got = unpack_tree(&tar[..], &out, true)?;
        assert_eq!((got.files, got.dirs, got.bytes), (3, 1, 23));
        assert_eq!(fs::read(out.join("a.txt"))?, b"alpha");
        assert_eq!(fs::read_link(out.join("link"))?, Path::new("a.txt"));
        let mode = fs::metadata(out.join("sub/run.sh"))?.permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        Ok(())
    }

    /// An archive crafted to climb out, or to write through a link it
    /// planted, is refused.
    #[test]
    fn an_archive_from_a_sandbox_cannot_write_outside_the_copy() -> TestResult {
        let dir = tempfile::tempdir()?;
        let outside = dir.path().join("outside");
        fs::create_dir(&outside)?;
        // `./up -> ../outside` then `./up/owned`.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, "up", "../outside")?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(5);
        b.append_data(&mut h, "up/owned", &b"owned"[..])?;
        let tar = b.into_inner()?;
        let root = dir.path().join("root");
        let e = unpack_tree(&tar[..], &root, true);
        assert!(e.is_err(), "{e:?}");
        assert!(!outside.join("owned").exists());
        // A `..` in a name is refused before anything is written.
        assert!(checked_rel(Path::new("a/../../etc/passwd")).is_err());
        assert!(checked_rel(Path::new("/etc/passwd")).is_err());
        assert_eq!(checked_rel(Path::new("./a/b"))?, PathBuf::from("a/b"));
        Ok(())
    }

    #[test]
    fn one_file_replaces_its_target_whole_or_not_at_all() -> TestResult {
        let dir = tempfile::tempdir()?;
        let top = sample(dir.path())?;
        let tree = walk(&top.join("a.txt"), false)?;
        let mut tar = Vec::new();
        pack(&tree, Some("a.txt"), &mut tar)?;
        let target = dir.path().join("copy.txt");
        fs::write(&target, b"old")?;
        let got = unpack_one(&tar[..], "a.txt", &target)?;
        assert_eq!((got.files, got.bytes), (1, 5));
        assert_eq!(fs::read(&target)?, b"alpha");
        // Another name than the one asked for writes nothing.
        let e = unpack_one(&tar[..], "b.txt", &target);
        assert!(e.is_err());
        assert_eq!(fs::read(&target)?, b"alpha");
        let strays: Vec<_> = fs::read_dir(dir.path())?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".berth-cp-"))
            .collect();
        assert!(strays.is_empty(), "{strays:?}");
        Ok(())
    }

    #[test]
    fn a_restreamed_archive_keeps_its_entries_and_refuses_what_is_judged_out() -> TestResult {
        let dir = tempfile::tempdir()?;
        let top = sample(dir.path())?;
        let tree = walk(&top, false)?;
        let mut tar = Vec::new();
        pack(&tree, Some("src"), &mut tar)?;
        let mut again = Vec::new();
        let mut seen = Vec::new();
        let counts = restream(&tar[..], &mut again, &mut |p| {
            seen.push(p.to_path_buf());
            Ok(())
        })?;
        assert_eq!((counts.files, counts.dirs), (3, 2));
        assert_eq!(seen.len(), 5);
        let out = dir.path().join("out");
        fs::create_dir(&out)?;
        tar::Archive::new(&again[..]).unpack(&out)?;
        assert_eq!(
            fs::read(out.join("src/sub/run.sh"))?,
            b"#!/bin/sh\necho hi\n"
        );
        let refused = restream(&tar[..], io::sink(), &mut |p| {
            if p.ends_with("run.sh") {
                bail!("refused");
            }
            Ok(())
        });
        assert!(refused.is_err());
        Ok(())
    }
}
