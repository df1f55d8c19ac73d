//! Checkpoints: a sandbox's workspace and its sessions' state at one moment,
//! taken, restored and copied through what every backend has (a spawned
//! process with piped stdio), so the five backends share one implementation
//! and one set of semantics.
//!
//! Flow at a glance:
//! - [`scan`] lists the workspace with `find -printf` (kind, bits, size,
//!   times, inode, path, link target; NUL-separated, so any name survives)
//!   and tars the sessions' state files (snapshots, functions, journal).
//! - [`take`] compares the scan with the sandbox's base manifest (the last
//!   checkpoint or restore): an entry whose stat is unchanged keeps its
//!   stored copy; the rest go into one new pack (a tar in the sandbox's berth
//!   dir), hashed with SHA-256 and checked again after packing, so a file
//!   written while it was read is taken again, not stored torn. Cost grows
//!   with what changed: an untouched workspace costs one `find`.
//! - [`restore`] extracts what differs from the packs into a staging
//!   directory, checks every digest, and only then removes, creates and
//!   copies into the workspace: a checkpoint that cannot be read back leaves
//!   the workspace as it was. The sessions' state files are put back for the
//!   next shell to restore.
//! - [`copy_packs`] streams packs from one sandbox to another, any backend to
//!   any backend: a clone.
//!
//! Why not a shadow git repository (what the peers use): git will not store
//! a nested `.git` (a workspace's own repository must come back byte for
//! byte), it needs git in every sandbox, and it compresses every file it
//! adds. The stat cache plus packs does what git's index and packfiles do,
//! with the tools every Debian-like sandbox already has (bash, find, tar,
//! sha256sum, sed, xargs). docs/ARCHITECTURE.md has the measurements.

pub mod manifest;
mod plan;
pub mod record;
mod scripts;

use std::collections::BTreeSet;
use std::time::Duration;

use berth_policies::CheckpointPolicy;
use tokio::io::AsyncWriteExt;

use crate::backend::{Sandbox, SpawnOpts, run_to_end};
use crate::error::{BackendFailure, Error, Result};
pub use manifest::{Entry, Kind, Manifest, Skipped};

/// The most a scan or a pack's digests may print.
const OUTPUT_LIMIT: usize = 512 << 20;
/// How long one step (a scan, packing, a restore) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// How often a checkpoint tries again when files change while it reads them.
const ATTEMPTS: usize = 3;

/// A workspace as a scan found it.
#[derive(Debug)]
pub struct Scan {
    /// Files, directories and links.
    pub entries: Vec<Entry>,
    /// Special files, left out.
    pub skipped: Vec<Skipped>,
    /// The packs the sandbox holds.
    pub packs: BTreeSet<String>,
    /// The sessions' state files, as a tar.
    pub session: Vec<u8>,
}

/// What [`take`] made.
#[derive(Debug)]
pub struct Taken {
    /// Every entry, each with its stored copy.
    pub manifest: Manifest,
    /// The sessions' state files, as a tar.
    pub session: Vec<u8>,
    /// The new pack, when something changed.
    pub pack: Option<String>,
    /// Files stored anew, and their bytes.
    pub changed: usize,
    /// Their bytes.
    pub new_bytes: u64,
    /// Special files left out.
    pub skipped: Vec<Skipped>,
}

/// What [`restore`] did.
#[derive(Debug)]
pub struct Restored {
    /// The workspace as it is now, with the checkpoint's stored copies: the
    /// next checkpoint's base.
    pub base: Manifest,
    /// Paths written back, and paths removed.
    pub written: usize,
    /// Paths removed.
    pub removed: usize,
}

/// Run one of the scripts with `args`, feeding `stdin`; its stdout, or an
/// error naming `what` with what it printed on stderr.
async fn script(
    sb: &dyn Sandbox,
    body: &str,
    args: &[String],
    stdin: Option<&[u8]>,
    what: &str,
) -> Result<(i32, Vec<u8>, String)> {
    let mut argv = vec![
        "bash".to_string(),
        "-c".into(),
        body.to_string(),
        "berth-checkpoint".into(),
    ];
    argv.extend_from_slice(args);
    let c = run_to_end(sb, &argv, stdin, OUTPUT_LIMIT, STEP_TIMEOUT).await?;
    let err = String::from_utf8_lossy(&c.stderr).trim().to_string();
    let code = c.status.shell_code();
    if code == 127 && err.contains("bash") {
        return Err(failed(sb, what, "the sandbox has no bash".into()));
    }
    Ok((code, c.stdout, err))
}

fn failed(sb: &dyn Sandbox, what: &str, why: String) -> Error {
    Error::backend(
        sb.kind(),
        BackendFailure::Rejected,
        format!("sandbox `{}`: {what}: {why}", sb.name()),
    )
}

/// The `find` operators that leave out the policy's names and berth's own
/// directory when it lies inside the workspace (ssh).
fn prune_args(sb: &dyn Sandbox, policy: &CheckpointPolicy) -> Vec<String> {
    let layout = sb.layout();
    let mut args = vec!["-false".to_string()];
    if let Some(rel) = layout
        .berth_dir
        .strip_prefix(&format!("{}/", layout.workdir.trim_end_matches('/')))
    {
        args.extend(["-o".into(), "-path".into(), format!("./{rel}")]);
    }
    for name in &policy.exclude {
        args.extend(["-o".into(), "-name".into(), name.clone()]);
    }
    args
}

/// List the workspace and read the sessions' state.
pub async fn scan(sb: &dyn Sandbox, policy: &CheckpointPolicy) -> Result<Scan> {
    let layout = sb.layout();
    let mut args = vec![layout.workdir.clone(), layout.berth_dir.clone()];
    args.extend(prune_args(sb, policy));
    let (code, out, err) = script(sb, scripts::SCAN, &args, None, "scanning the workspace").await?;
    if code != 0 {
        return Err(failed(sb, "scanning the workspace", err));
    }
    let (entries, skipped, rest) = manifest::parse_scan(&out, false)?;
    // Then the packs present, each ended by a NUL, an empty one, the tar.
    let mut packs = BTreeSet::new();
    let mut rest = rest;
    loop {
        let end = rest.iter().position(|&b| b == 0).ok_or_else(|| {
            failed(
                sb,
                "scanning the workspace",
                "its output was cut short".into(),
            )
        })?;
        let name = &rest[..end];
        rest = &rest[end + 1..];
        if name.is_empty() {
            break;
        }
        if let Some(id) = std::str::from_utf8(name)
            .ok()
            .and_then(|n| n.strip_suffix(".tar"))
        {
            packs.insert(id.to_string());
        }
    }
    Ok(Scan {
        entries,
        skipped,
        packs,
        session: rest.to_vec(),
    })
}

/// Take a checkpoint: the workspace against `base`, new and changed paths
/// stored in a pack named `id`.
pub async fn take(
    sb: &dyn Sandbox,
    base: Option<&Manifest>,
    policy: &CheckpointPolicy,
    id: &str,
) -> Result<Taken> {
    let mut last_moved = Vec::new();
    for _ in 0..ATTEMPTS {
        let scan = scan(sb, policy).await?;
        let mut manifest = Manifest::default();
        let mut changed: Vec<Vec<u8>> = Vec::new();
        for mut e in scan.entries {
            let kept = base
                .and_then(|b| b.entries.get(&e.path))
                .filter(|b| b.same_stat(&e) && b.stored())
                .filter(|b| b.pack.is_empty() || scan.packs.contains(&b.pack));
            match kept {
                Some(b) => {
                    e.hash = b.hash.clone();
                    e.pack = b.pack.clone();
                }
                None if e.kind != Kind::Dir => changed.push(e.path.clone()),
                None => {}
            }
            manifest.entries.insert(e.path.clone(), e);
        }
        let new_bytes: u64 = changed
            .iter()
            .filter_map(|p| manifest.entries.get(p))
            .filter(|e| e.kind == Kind::File)
            .map(|e| e.size)
            .sum();
        if new_bytes > policy.max_bytes() {
            return Err(too_large(sb, &manifest, &changed, new_bytes, policy));
        }
        if changed.is_empty() {
            return Ok(Taken {
                manifest,
                session: scan.session,
                pack: None,
                changed: 0,
                new_bytes: 0,
                skipped: scan.skipped,
            });
        }
        match store_pack(sb, &mut manifest, &changed, id).await? {
            Packed::Whole => {
                return Ok(Taken {
                    manifest,
                    session: scan.session,
                    pack: Some(id.to_string()),
                    changed: changed.len(),
                    new_bytes,
                    skipped: scan.skipped,
                });
            }
            Packed::Moved(paths) => last_moved = paths,
        }
    }
    let shown: Vec<String> = last_moved
        .iter()
        .take(5)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Err(failed(
        sb,
        "checkpoint",
        format!(
            "files kept changing while they were read ({}), {ATTEMPTS} times; take it again when what writes them has stopped",
            shown.join(", ")
        ),
    ))
}

fn too_large(
    sb: &dyn Sandbox,
    manifest: &Manifest,
    changed: &[Vec<u8>],
    new_bytes: u64,
    policy: &CheckpointPolicy,
) -> Error {
    let mut big: Vec<&Entry> = changed
        .iter()
        .filter_map(|p| manifest.entries.get(p))
        .collect();
    big.sort_by_key(|e| std::cmp::Reverse(e.size));
    let shown: Vec<String> = big
        .iter()
        .take(3)
        .map(|e| format!("{} ({} MiB)", e.shown(), e.size >> 20))
        .collect();
    Error::InvalidInput(format!(
        "a checkpoint of sandbox `{}` would store {} MiB, over the {} MiB cap (largest: {}); leave such paths out with `exclude` under [checkpoints] in the policy file, or raise `max_mb` there",
        sb.name(),
        new_bytes >> 20,
        policy.max_mb,
        shown.join(", ")
    ))
}

enum Packed {
    /// Every path went in as the scan saw it.
    Whole,
    /// These changed while they were read; the pack was dropped.
    Moved(Vec<Vec<u8>>),
}

/// Store `changed` in pack `id`, filling their digests and pack.
async fn store_pack(
    sb: &dyn Sandbox,
    manifest: &mut Manifest,
    changed: &[Vec<u8>],
    id: &str,
) -> Result<Packed> {
    let mut stdin = Vec::new();
    let mut files = Vec::new();
    for p in changed {
        let Some(e) = manifest.entries.get(p) else {
            continue;
        };
        stdin.push(if e.kind == Kind::File { b'F' } else { b'L' });
        stdin.extend_from_slice(&e.dotted());
        stdin.push(0);
        if e.kind == Kind::File {
            files.push(p.clone());
        }
    }
    let layout = sb.layout();
    let args = [
        layout.workdir.clone(),
        layout.berth_dir.clone(),
        id.to_string(),
    ];
    let (code, out, err) = script(
        sb,
        scripts::PACK,
        &args,
        Some(&stdin),
        "storing changed files",
    )
    .await?;
    if code == scripts::MOVED {
        return Ok(Packed::Moved(changed.to_vec()));
    }
    if code != 0 {
        return Err(failed(sb, "storing changed files", err));
    }
    let split = out.iter().position(|&b| b == 0).unwrap_or(out.len());
    let sums = manifest::parse_sums(&out[..split], files.len())?;
    let (after, _, _) = manifest::parse_scan(out.get(split + 1..).unwrap_or_default(), true)?;
    let mut moved = Vec::new();
    let seen: std::collections::HashMap<&[u8], &Entry> =
        after.iter().map(|e| (e.path.as_slice(), e)).collect();
    for p in changed {
        let same = match (manifest.entries.get(p), seen.get(p.as_slice())) {
            (Some(a), Some(b)) => a.same_stat(b),
            _ => false,
        };
        if !same {
            moved.push(p.clone());
        }
    }
    if !moved.is_empty() {
        drop_packs_named(sb, &[id.to_string()]).await?;
        return Ok(Packed::Moved(moved));
    }
    for (p, h) in files.iter().zip(sums) {
        if let Some(e) = manifest.entries.get_mut(p) {
            e.hash = h;
        }
    }
    for p in changed {
        if let Some(e) = manifest.entries.get_mut(p) {
            e.pack = id.to_string();
        }
    }
    Ok(Packed::Whole)
}

/// Bring the workspace back to `target` and its sessions' state to
/// `session`. `base` is the sandbox's last known manifest: a file it shows
/// untouched with the target's digest is not written again. Nothing changes
/// unless every stored copy needed reads back with its digest. `moved_from`
/// is the workspace the checkpoint was taken in, when it was another
/// sandbox's (a clone): the session's paths under it move to this one's.
pub async fn restore(
    sb: &dyn Sandbox,
    target: &Manifest,
    session: &[u8],
    base: Option<&Manifest>,
    policy: &CheckpointPolicy,
    moved_from: Option<&str>,
) -> Result<Restored> {
    let now = scan(sb, policy).await?;
    let missing: Vec<String> = target.packs().difference(&now.packs).cloned().collect();
    if !missing.is_empty() {
        return Err(unreadable(
            sb,
            format!("its packs {} are missing", missing.join(", ")),
        ));
    }
    let plan = plan::plan(target, &now.entries, base);
    let layout = sb.layout();
    let mut args = vec![layout.workdir.clone(), layout.berth_dir.clone()];
    args.extend(prune_args(sb, policy));
    let (code, out, err) = script(
        sb,
        scripts::RESTORE,
        &args,
        Some(&plan.records),
        "restoring the workspace",
    )
    .await?;
    match code {
        0 => {}
        scripts::UNREADABLE => return Err(unreadable(sb, err)),
        _ => return Err(failed(sb, "restoring the workspace", err)),
    }
    if !session.is_empty() {
        let mut args = vec![layout.berth_dir.clone()];
        if let Some(from) = moved_from.filter(|f| *f != layout.workdir) {
            args.push(sed_pattern(from));
            args.push(sed_replacement(&layout.workdir));
        }
        let (code, _, err) = script(
            sb,
            scripts::SESSION,
            &args,
            Some(session),
            "restoring the session state",
        )
        .await?;
        if code != 0 {
            return Err(failed(sb, "restoring the session state", err));
        }
    }
    let (after, _, _) = manifest::parse_scan(&out, false)?;
    let mut base = Manifest::default();
    for mut e in after {
        if let Some(t) = target.entries.get(&e.path)
            && t.kind == e.kind
            && t.size == e.size
            && t.link == e.link
        {
            e.hash = t.hash.clone();
            e.pack = t.pack.clone();
        }
        base.entries.insert(e.path.clone(), e);
    }
    Ok(Restored {
        base,
        written: plan.written,
        removed: plan.removed,
    })
}

/// `s` as a basic regular expression for sed with `|` as its delimiter.
fn sed_pattern(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if matches!(c, '\\' | '|' | '.' | '*' | '[' | ']' | '^' | '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// `s` as sed's replacement text with `|` as the delimiter.
fn sed_replacement(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if matches!(c, '\\' | '|' | '&') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn unreadable(sb: &dyn Sandbox, why: String) -> Error {
    failed(
        sb,
        "the checkpoint cannot be read back, so nothing was restored",
        why,
    )
}

/// Copy packs from one sandbox's berth dir to another's, streamed through
/// berth, any backend to any backend.
pub async fn copy_packs(
    src: &dyn Sandbox,
    dst: &dyn Sandbox,
    packs: &BTreeSet<String>,
) -> Result<()> {
    for id in packs {
        let from = format!("{}/packs/{id}.tar", src.layout().berth_dir);
        let dir = format!("{}/packs", dst.layout().berth_dir);
        let read = ["cat".to_string(), "--".into(), from.clone()];
        let write = [
            "bash".to_string(),
            "-c".into(),
            r#"mkdir -p -- "$1" && cat > "$1/.$2.copy" && mv -f -- "$1/.$2.copy" "$1/$2.tar""#
                .into(),
            "berth-checkpoint".into(),
            dir,
            id.clone(),
        ];
        let helper = || SpawnOpts {
            helper: true,
            ..SpawnOpts::default()
        };
        let mut r = src.spawn(&read, helper()).await?;
        let mut w = dst.spawn(&write, helper()).await?;
        let mut out = r
            .take_stdout()
            .ok_or_else(|| failed(src, "copying a pack", "no stdout".into()))?;
        let mut inp = w
            .take_stdin()
            .ok_or_else(|| failed(dst, "copying a pack", "no stdin".into()))?;
        let copied = tokio::io::copy(&mut out, &mut inp).await;
        let _ = inp.shutdown().await;
        drop(inp);
        let rs = r.wait().await?;
        let ws = w.wait().await?;
        copied.map_err(|e| Error::stream("copying a checkpoint pack between sandboxes", e))?;
        if rs.code != Some(0) {
            return Err(unreadable(src, format!("pack {id} cannot be read")));
        }
        if ws.code != Some(0) {
            return Err(failed(
                dst,
                "copying a pack",
                format!("writing pack {id} failed"),
            ));
        }
    }
    Ok(())
}

/// Remove every pack of the sandbox but `keep`, and leftovers of
/// checkpoints that never finished (older than ten minutes).
pub async fn drop_packs_except(sb: &dyn Sandbox, keep: &BTreeSet<String>) -> Result<usize> {
    let mut stdin = Vec::new();
    for k in keep {
        stdin.extend_from_slice(k.as_bytes());
        stdin.push(b'\n');
    }
    let args = [sb.layout().berth_dir.clone()];
    let (code, out, err) = script(sb, scripts::PRUNE, &args, Some(&stdin), "pruning packs").await?;
    if code != 0 {
        return Err(failed(sb, "pruning packs", err));
    }
    Ok(String::from_utf8_lossy(&out).trim().parse().unwrap_or(0))
}

async fn drop_packs_named(sb: &dyn Sandbox, ids: &[String]) -> Result<()> {
    let mut argv = vec![
        "bash".to_string(),
        "-c".into(),
        r#"d=$1; shift; for id; do rm -f -- "$d/packs/$id.tar"; done"#.into(),
        "berth-checkpoint".into(),
        sb.layout().berth_dir.clone(),
    ];
    argv.extend_from_slice(ids);
    run_to_end(sb, &argv, None, 4096, Duration::from_secs(60)).await?;
    Ok(())
}
