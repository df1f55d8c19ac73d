//! Checkpoints: a sandbox's workspace and its sessions' state at one moment,
//! taken, restored and copied through what every backend has (a spawned
//! process with piped stdio), so the five backends share one implementation
//! and one set of semantics.
//!
//! Flow at a glance:
//! - A scan lists the workspace with `find -printf` (kind, bits, size,
//!   times, inode, path, link target; NUL-separated, so any name survives).
//!   Taking and restoring are each one process in the sandbox that scans,
//!   hears back from berth what to do, and does it.
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

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use berth_policies::CheckpointPolicy;
use tokio::io::AsyncWriteExt;

use crate::backend::{Sandbox, SpawnOpts, run_to_end};
use crate::error::{BackendFailure, Error, Result};
use crate::session::{CaptureLimits, ExecOpts, Session, SessionConfig};
pub use manifest::{Entry, Kind, Manifest, Skipped};

/// The most a scan or a pack's digests may print.
const OUTPUT_LIMIT: usize = 512 << 20;
/// How long one step (a scan, packing, a restore) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// The most input a helper gets in its command text rather than as a file.
const INLINE_INPUT: usize = 256 << 10;
/// How often a checkpoint tries again when files change while it reads them.
const ATTEMPTS: usize = 3;

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
    /// Packs changed in the sandbox since berth wrote them: none of their
    /// copies was trusted, and the files they held were stored anew.
    pub tampered: Vec<String>,
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
        sb.kind().as_str(),
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

/// Take a checkpoint: the workspace against `base`, new and changed paths
/// stored in a pack named `id`. One process in the sandbox per attempt
/// (see [`scripts::TAKE`]); a file that changed while it was read makes
/// the attempt start over.
pub async fn take(
    shell: &mut Session,
    base: Option<&Manifest>,
    policy: &CheckpointPolicy,
    id: &str,
) -> Result<Taken> {
    let sb = shell.sandbox().clone();
    let sb = sb.as_ref();
    let mut last_moved = Vec::new();
    for _ in 0..ATTEMPTS {
        match take_once(shell, base, policy, id).await? {
            Attempt::Taken(t) => return Ok(t),
            Attempt::Moved(paths) => last_moved = paths,
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

enum Attempt {
    Taken(Taken),
    /// These changed while they were read.
    Moved(Vec<Vec<u8>>),
}

/// Where the scan's part of [`scripts::TAKE`]'s output ends: after the
/// listing (pairs of NUL-ended fields up to an empty one) and the packs
/// (NUL-ended names up to an empty one). Kept across reads.
#[derive(Default)]
struct ScanEnd {
    pos: usize,
    field: usize,
    /// 0: a header is next, 1: a link field, 2: in the packs.
    phase: u8,
}

impl ScanEnd {
    fn advance(&mut self, buf: &[u8]) -> Option<usize> {
        while self.pos < buf.len() {
            let i = self.pos;
            self.pos += 1;
            if buf[i] != 0 {
                continue;
            }
            let empty = i == self.field;
            self.field = i + 1;
            match self.phase {
                0 if empty => self.phase = 2,
                0 => self.phase = 1,
                1 => self.phase = 0,
                _ if empty => return Some(i + 1),
                _ => {}
            }
        }
        None
    }
}

/// What a checkpoint's or a restore's two halves came to: `reply`'s value
/// (when the scan arrived whole), what the second half printed, and its
/// exit code. On failure the output's end says why.
struct Conversed<T> {
    replied: Option<Result<T>>,
    rest: Vec<u8>,
    code: i32,
    stderr: String,
}

/// The shell berth runs its checkpoint helpers in, one per sandbox, kept
/// warm by the runtime: a checkpoint then costs a round trip to it, not a
/// process spawned through the backend (a confined spawn on the local
/// backend, a `docker exec`, an SSH channel, an HTTP call). Its own state
/// lives apart from the sessions' (`checkpoint-shell` in the berth dir), so
/// no checkpoint holds it and no restore touches it.
pub async fn helper_shell(sb: std::sync::Arc<dyn Sandbox>) -> Result<Session> {
    let mut cfg = SessionConfig::named(format!("{}/{}/checkpoint", sb.kind(), sb.name()));
    cfg.dir = Some(format!("{}/checkpoint-shell", sb.layout().berth_dir));
    Session::open(sb, cfg).await
}

/// `body` run in a subshell of the helper shell with `args` as its
/// positional parameters, fed `stdin`: its exit code and output.
async fn half(
    shell: &mut Session,
    body: &str,
    args: &[String],
    stdin: Option<Vec<u8>>,
    what: &str,
) -> Result<(i32, Vec<u8>)> {
    let quoted: Vec<String> = args
        .iter()
        .map(|a| crate::session::script::quote(a))
        .collect();
    let sub = format!("( set -- {}\n{body}\n) 2>&1", quoted.join(" "));
    // Small input travels in the command itself, as base64 in a here-doc:
    // stdin as a file is a backend call (a docker put_archive, an SFTP
    // write), which costs more than the rest of a small checkpoint.
    let (command, stdin) = match stdin {
        Some(b) if b.is_empty() => (sub, None),
        Some(b) if b.len() <= INLINE_INPUT => {
            use base64::Engine;
            let text = base64::engine::general_purpose::STANDARD.encode(&b);
            let mut lines = String::with_capacity(text.len() + text.len() / 76 + 64);
            for chunk in text.as_bytes().chunks(76) {
                lines.push_str(std::str::from_utf8(chunk).unwrap_or_default());
                lines.push('\n');
            }
            (
                format!("{sub} < <(base64 -d <<'__BERTH_INPUT__'\n{lines}__BERTH_INPUT__\n)"),
                None,
            )
        }
        other => (sub, other),
    };
    let opts = ExecOpts {
        timeout: Some(STEP_TIMEOUT),
        stdin,
        limits: CaptureLimits {
            head: OUTPUT_LIMIT,
            tail: 0,
        },
        ..ExecOpts::default()
    };
    let r = shell.exec(&command, opts).await?;
    if r.output.truncated() {
        return Err(failed(
            shell.sandbox().as_ref(),
            what,
            format!(
                "it printed {} bytes, more than berth reads",
                r.output.total_bytes
            ),
        ));
    }
    if r.timed_out {
        return Err(failed(
            shell.sandbox().as_ref(),
            what,
            format!("it did not finish within {}s", STEP_TIMEOUT.as_secs()),
        ));
    }
    Ok((r.exit_code, r.output.head))
}

/// The last words of a failed half's output.
fn said(out: &[u8]) -> String {
    let from = out.len().saturating_sub(600);
    String::from_utf8_lossy(&out[from..]).trim().to_string()
}

/// Run a checkpoint's or a restore's two halves in the helper shell: the
/// scan, then `act` fed what `reply` answers to the scan. An error from
/// `reply` runs no second half, so nothing changes.
async fn converse<T>(
    shell: &mut Session,
    act: &str,
    act_args: Vec<String>,
    scan_args: Vec<String>,
    what: &str,
    reply: impl FnOnce(&[u8]) -> Result<(Vec<u8>, T)>,
) -> Result<Conversed<T>> {
    let (code, scanned) = half(shell, scripts::SCAN, &scan_args, None, what).await?;
    let mut end = ScanEnd::default();
    let cut = match (code, end.advance(&scanned)) {
        (0, Some(c)) => c,
        _ => {
            return Ok(Conversed {
                replied: None,
                rest: Vec::new(),
                code,
                stderr: said(&scanned),
            });
        }
    };
    let (bytes, value) = match reply(&scanned[..cut]) {
        Ok(x) => x,
        Err(e) => {
            return Ok(Conversed {
                replied: Some(Err(e)),
                rest: Vec::new(),
                code: 0,
                stderr: String::new(),
            });
        }
    };
    let (code, rest) = half(shell, act, &act_args, Some(bytes), what).await?;
    let stderr = if code == 0 {
        String::new()
    } else {
        said(&rest)
    };
    Ok(Conversed {
        replied: Some(Ok(value)),
        rest,
        code,
        stderr,
    })
}

/// The packs present, each with its stamp (size, change time, inode).
type Packs = BTreeMap<String, String>;

/// The entries and the packs present, from a conversation's scan part.
fn read_scan(scanned: &[u8]) -> Result<(Vec<Entry>, Vec<Skipped>, Packs)> {
    let (entries, skipped, rest) = manifest::parse_scan(scanned, false)?;
    let packs = rest
        .split(|&b| b == 0)
        .filter_map(|r| {
            let r = std::str::from_utf8(r).ok()?;
            let (name, stamp) = r.split_once(".tar ")?;
            Some((name.to_string(), stamp.to_string()))
        })
        .collect();
    Ok((entries, skipped, packs))
}

/// The stamps a new base keeps: for each pack it names, the stamp berth
/// knew (`known`), or the one found now for a pack berth had none for (a
/// clone's packs, just copied in; a base from before stamps).
fn stamps_for(m: &Manifest, known: &Packs, now: &Packs) -> Packs {
    m.packs()
        .into_iter()
        .filter_map(|p| {
            let s = known.get(&p).or_else(|| now.get(&p))?.clone();
            Some((p, s))
        })
        .collect()
}

async fn take_once(
    shell: &mut Session,
    base: Option<&Manifest>,
    policy: &CheckpointPolicy,
    id: &str,
) -> Result<Attempt> {
    let sb = shell.sandbox().clone();
    let sb = sb.as_ref();
    let layout = sb.layout();
    let mut scan_args = vec![layout.workdir.clone(), layout.berth_dir.clone()];
    scan_args.extend(prune_args(sb, policy));
    let act_args = vec![
        layout.workdir.clone(),
        layout.berth_dir.clone(),
        id.to_string(),
    ];
    let c = converse(
        shell,
        scripts::TAKE,
        act_args,
        scan_args,
        "checkpoint",
        |scanned| {
            let d = decide(sb, scanned, base, policy)?;
            Ok((d.stdin.clone(), d))
        },
    )
    .await?;
    let mut d = match c.replied {
        Some(d) => d?,
        None => return Err(failed(sb, "scanning the workspace", c.stderr)),
    };
    if c.code == scripts::MOVED {
        return Ok(Attempt::Moved(d.changed));
    }
    if c.code != 0 {
        return Err(failed(sb, "storing changed files", c.stderr));
    }
    // The new pack's stamp, then the digests.
    let at = c.rest.iter().position(|&b| b == 0).unwrap_or(c.rest.len());
    let stamp = String::from_utf8_lossy(&c.rest[..at]).trim().to_string();
    let rest = c.rest.get(at + 1..).unwrap_or_default();
    let split = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let files: Vec<Vec<u8>> = d
        .changed
        .iter()
        .filter(|p| {
            d.manifest
                .entries
                .get(*p)
                .is_some_and(|e| e.kind == Kind::File)
        })
        .cloned()
        .collect();
    let sums = manifest::parse_sums(&rest[..split], files.len())?;
    let (after, _, session) =
        manifest::parse_scan(rest.get(split + 1..).unwrap_or_default(), true)?;
    if !d.changed.is_empty() {
        let seen: std::collections::HashMap<&[u8], &Entry> =
            after.iter().map(|e| (e.path.as_slice(), e)).collect();
        let moved: Vec<Vec<u8>> = d
            .changed
            .iter()
            .filter(|p| {
                !matches!((d.manifest.entries.get(*p), seen.get(p.as_slice())),
                    (Some(a), Some(b)) if a.same_stat(b))
            })
            .cloned()
            .collect();
        if !moved.is_empty() {
            drop_packs_named(sb, &[id.to_string()]).await?;
            return Ok(Attempt::Moved(moved));
        }
    }
    for (p, h) in files.iter().zip(sums) {
        if let Some(e) = d.manifest.entries.get_mut(p) {
            e.hash = h;
        }
    }
    for p in &d.changed {
        if let Some(e) = d.manifest.entries.get_mut(p) {
            e.pack = id.to_string();
        }
    }
    let mut now = d.packs.clone();
    if !d.changed.is_empty() {
        if stamp.is_empty() {
            return Err(failed(
                sb,
                "storing changed files",
                format!("pack {id} was written but cannot be looked at"),
            ));
        }
        now.insert(id.to_string(), stamp);
    }
    let known = base.map(|b| b.stamps.clone()).unwrap_or_default();
    d.manifest.stamps = stamps_for(&d.manifest, &known, &now);
    Ok(Attempt::Taken(Taken {
        pack: (!d.changed.is_empty()).then(|| id.to_string()),
        changed: d.changed.len(),
        new_bytes: d.new_bytes,
        manifest: d.manifest,
        session: session.to_vec(),
        skipped: d.skipped,
        tampered: d.tampered,
    }))
}

/// What a scan and the base say: the manifest so far and what changed.
struct Decided {
    manifest: Manifest,
    changed: Vec<Vec<u8>>,
    new_bytes: u64,
    skipped: Vec<Skipped>,
    /// The changed paths as records for the helper's stdin.
    stdin: Vec<u8>,
    /// The packs present, with their stamps.
    packs: Packs,
    /// Packs the base names whose stamp moved.
    tampered: Vec<String>,
}

fn decide(
    sb: &dyn Sandbox,
    scanned: &[u8],
    base: Option<&Manifest>,
    policy: &CheckpointPolicy,
) -> Result<Decided> {
    let (entries, skipped, packs) = read_scan(scanned)?;
    // A pack is trusted while its stat is the one berth recorded: one that
    // was rewritten in the sandbox would break every later restore that
    // needs it, so its files are stored anew, and it is reported.
    let tampered: Vec<String> = base
        .map(|b| {
            b.stamps
                .iter()
                .filter(|(p, was)| packs.get(*p).is_some_and(|now| now != *was))
                .map(|(p, _)| p.clone())
                .collect()
        })
        .unwrap_or_default();
    let trusted = |p: &str| packs.contains_key(p) && !tampered.iter().any(|t| t == p);
    let mut manifest = Manifest::default();
    let mut changed: Vec<Vec<u8>> = Vec::new();
    for mut e in entries {
        let kept = base
            .and_then(|b| b.entries.get(&e.path))
            .filter(|b| b.same_stat(&e) && b.stored())
            .filter(|b| b.pack.is_empty() || trusted(&b.pack));
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
    let mut stdin = Vec::new();
    for p in &changed {
        if let Some(e) = manifest.entries.get(p) {
            stdin.push(if e.kind == Kind::File { b'F' } else { b'L' });
            stdin.extend_from_slice(&e.dotted());
            stdin.push(0);
        }
    }
    Ok(Decided {
        manifest,
        changed,
        new_bytes,
        skipped,
        stdin,
        packs,
        tampered,
    })
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

/// Bring the workspace back to `target` and its sessions' state to
/// `session`. `base` is the sandbox's last known manifest: a file it shows
/// untouched with the target's digest is not written again. Nothing changes
/// unless every stored copy needed reads back with its digest. `moved_from`
/// is the workspace the checkpoint was taken in, when it was another
/// sandbox's (a clone): the session's paths under it move to this one's.
pub async fn restore(
    shell: &mut Session,
    target: &Manifest,
    session: &[u8],
    base: Option<&Manifest>,
    policy: &CheckpointPolicy,
    moved_from: Option<&str>,
) -> Result<Restored> {
    let sb = shell.sandbox().clone();
    let sb = sb.as_ref();
    let layout = sb.layout();
    let mut args = vec![layout.workdir.clone(), layout.berth_dir.clone()];
    args.extend(prune_args(sb, policy));
    // The stamps berth knows for this sandbox's packs: the target's when it
    // was taken here, the base's (newer) over them.
    let mut known: Packs = match moved_from {
        None => target.stamps.clone(),
        Some(_) => Packs::new(),
    };
    if let Some(b) = base {
        known.extend(b.stamps.clone());
    }
    let remap = moved_from
        .filter(|f| *f != layout.workdir)
        .map(|f| (sed_pattern(f), sed_replacement(&layout.workdir)));
    let c = converse(
        shell,
        scripts::RESTORE,
        args.clone(),
        args,
        "restoring the workspace",
        |scanned| {
            let (now, _, packs) = read_scan(scanned)?;
            let present: BTreeSet<String> = packs.keys().cloned().collect();
            let missing: Vec<String> = target.packs().difference(&present).cloned().collect();
            if !missing.is_empty() {
                return Err(unreadable(
                    sb,
                    format!("its packs {} are missing", missing.join(", ")),
                ));
            }
            let mut plan = plan::plan(target, &now, base);
            // `N` first: a plan with nothing to do is still a plan.
            let mut records = b"N\0".to_vec();
            if !session.is_empty() {
                use base64::Engine;
                records.push(b'Z');
                records.extend_from_slice(
                    base64::engine::general_purpose::STANDARD
                        .encode(session)
                        .as_bytes(),
                );
                records.push(0);
                if let Some((from, to)) = &remap {
                    for (tag, v) in [(b'X', from), (b'Y', to)] {
                        records.push(tag);
                        records.extend_from_slice(v.as_bytes());
                        records.push(0);
                    }
                }
            }
            records.append(&mut plan.records);
            Ok((records, (plan.written, plan.removed, packs)))
        },
    )
    .await?;
    let (written, removed, packs) = match c.replied {
        Some(r) => r?,
        None => return Err(failed(sb, "scanning the workspace", c.stderr)),
    };
    match c.code {
        0 => {}
        scripts::UNREADABLE => return Err(unreadable(sb, c.stderr)),
        _ => return Err(failed(sb, "restoring the workspace", c.stderr)),
    }
    let out = c.rest;
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
    // The stamps berth knew stay: a pack rewritten before this restore is
    // still found out by the next checkpoint.
    base.stamps = stamps_for(&base, &known, &packs);
    Ok(Restored {
        base,
        written,
        removed,
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

/// Remove the sandbox's packs in `gone` (unless `keep` names them), and
/// every other pack but `keep` older than ten minutes: leftovers of
/// checkpoints that never finished.
pub async fn drop_packs_except(
    sb: &dyn Sandbox,
    keep: &BTreeSet<String>,
    gone: &BTreeSet<String>,
) -> Result<usize> {
    let mut stdin = Vec::new();
    for k in keep {
        stdin.extend_from_slice(format!("+{k}\n").as_bytes());
    }
    for g in gone.difference(keep) {
        stdin.extend_from_slice(format!("-{g}\n").as_bytes());
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

#[cfg(test)]
mod tests {
    use super::ScanEnd;

    #[test]
    fn the_scan_part_ends_after_the_packs_whatever_the_reads() {
        let out = b"f 644 1 1 1 1 a\0\0l 777 1 1 1 2 b\0target\0\0k1.tar\0k2.tar\0\0DIGESTS";
        let whole = out.len() - b"DIGESTS".len();
        for step in [1, 3, 7, out.len()] {
            let mut end = ScanEnd::default();
            let mut got = None;
            let mut n = 0;
            while got.is_none() && n < out.len() {
                n = (n + step).min(out.len());
                got = end.advance(&out[..n]);
            }
            assert_eq!(got, Some(whole), "reads of {step}");
        }
        // An empty workspace and no packs.
        assert_eq!(ScanEnd::default().advance(b"\0\0rest"), Some(2));
        assert_eq!(ScanEnd::default().advance(b"f 644 1 1 1 1 a\0\0"), None);
    }
}
