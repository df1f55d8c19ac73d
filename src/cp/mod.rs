//! `berth cp`: files and directory trees between this machine and a
//! sandbox, either way, streamed: no size limit, nothing held whole in
//! memory, progress on a terminal.
//!
//! Flow at a glance:
//! - read SRC and DEST ([`ends`]): exactly one is in a sandbox; `-` is a
//!   tar archive on stdin or stdout.
//! - look at this machine's side first (a missing source fails before any
//!   sandbox is touched), then attach to the sandbox as `exec` does (only
//!   `default` is made on first use) and probe its side ([`remote`]).
//! - decide where the copy lands, as `cp -a` and `docker cp` do.
//! - judge every path it writes in the sandbox (or reads from it) with the
//!   policy's file rules, as the file tools are judged, and admit the copy
//!   once with the strictest verdict (an *ask* waits for an approval).
//! - stream a tar: packed here from the walked tree into `tar -x` in the
//!   sandbox, or from `tar -c` there into a checked unpack here ([`host`]),
//!   through bounded chunks ([`pipe`]).
//! - log `copy.started` and `copy.finished` (or `copy.failed`); print one
//!   JSON object with `--json`, a summary on a terminal, nothing otherwise.

mod ends;
mod host;
mod pipe;
mod progress;
mod remote;

use berth_core::backend::BackendKind;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use berth_core::backend::{Layout, Sandbox, normalize_path};
use berth_core::events::EventKind;
use berth_core::gate::{Gate, judge_file};
use berth_core::runtime::Runtime;
use berth_core::store::Event;
use berth_policies::{Action, FileOp, Verdict};
use serde_json::json;

use crate::context;
use ends::{End, Found, Kind, Landing, Shape, base_name, landing, split};
use host::Counts;
use progress::Progress;
use remote::Source;

/// `berth cp`'s arguments.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
SRC and DEST: exactly one of them is in a sandbox. `:PATH` is in the sandbox \
given with -s (`default` when none, made on first use as by `exec`); \
`NAME:PATH` in sandbox NAME. A relative sandbox path starts at the sandbox's \
workspace, and `:` alone is the workspace. A path on this machine with a \
colon in it is written `./a:b`. `-` is an uncompressed tar archive: read \
from stdin and unpacked into DEST (an existing directory), or written to \
stdout, as `docker cp` does.

Where a copy lands, as with `cp -a` and `docker cp`: onto an existing \
directory it goes inside it under its own name; onto anything else it \
takes DEST's name (a DEST ending in `/` must be an existing directory). \
Directories copy recursively, links stay links, modes and times are kept; \
`DIR/.` copies what is in DIR rather than DIR itself. Files written into a \
sandbox belong to the sandbox's user (uid 1000 in a docker sandbox); files \
copied out belong to you.

Every path written into the sandbox is judged by the policy's file rules as \
a write, every path copied out as a read, as the file tools are: a refusal \
exits 126; an `ask` waits for `berth approve`. berth's own failures exit 125.

Progress (bytes, rate) is drawn on stderr when it is a terminal; --json \
prints one object: bytes, files, dirs, src, dest.

Examples:
  berth cp ./data.csv :data/               # into the workspace's data/ directory
  berth cp :out/report.txt ./              # out, into the current directory
  berth cp -s web ./src :app               # a tree into sandbox web, as app/
  berth cp web:/var/log/nginx ./logs       # a tree out of sandbox web, as ./logs
  berth cp -b docker -s ci ./dump.sql.gz : # any size: streamed, never held in memory
  berth cp --json :build/. ./dist          # what is in build/, into ./dist
  tar -c -C site . | berth cp - :www/      # an archive on stdin, unpacked into www/
  berth cp :results - | tar -t             # a tree out, as an archive on stdout")]
pub struct CpArgs {
    /// Backend of the sandbox.
    #[arg(long, short = 'b', default_value = context::DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// The sandbox `:PATH` names [default: `default`].
    #[arg(long, short = 's')]
    pub sandbox: Option<String>,
    /// Print one JSON object: bytes, files, dirs, src, dest.
    #[arg(long)]
    pub json: bool,
    /// No progress line, even on a terminal.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// What to copy: a path here, `:PATH` or `SANDBOX:PATH` in the sandbox,
    /// or `-` for a tar archive on stdin.
    #[arg(value_name = "SRC")]
    pub src: String,
    /// Where to: a path here, `:PATH` or `SANDBOX:PATH` in the sandbox, or
    /// `-` for a tar archive on stdout.
    #[arg(value_name = "DEST")]
    pub dest: String,
}

/// What a copy did.
struct Done {
    counts: Counts,
    src: String,
    dest: String,
    /// What the sandbox's `tar` said while it succeeded (a warning).
    said: String,
}

/// The copy's call, for the event log.
struct Call<'a> {
    rt: &'a Runtime,
    id: String,
    backend: BackendKind,
    sandbox: String,
    command: String,
    started: Instant,
    /// `copy.started` was logged: whatever ends the copy is logged too.
    began: std::cell::Cell<bool>,
}

impl Call<'_> {
    fn event(&self, kind: EventKind) -> Event {
        Event {
            kind,
            call_id: Some(self.id.clone()),
            backend: Some(self.backend),
            sandbox: Some(self.sandbox.clone()),
            command: Some(self.rt.redact(&self.command)),
            ..Default::default()
        }
    }

    fn log(&self, e: Event) {
        if let Err(err) = self.rt.store().append(&e) {
            tracing::warn!(call = %self.id, error = %err, "could not record a copy");
        }
    }

    /// Admit the copy with `verdict` (the strictest of its paths') and log
    /// its start.
    async fn admit(&self, subject: &str, verdict: Verdict) -> Result<()> {
        let admission = self
            .rt
            .admit_verdict(&self.id, self.backend, &self.sandbox, subject, verdict)
            .await?;
        let mut e = self.event(EventKind::CopyStarted);
        e.verdict = Some(admission.summary());
        self.log(e);
        self.began.set(true);
        Ok(())
    }
}

/// `berth cp`.
pub async fn run(state_dir: Option<PathBuf>, a: CpArgs) -> Result<u8> {
    let src = End::parse(&a.src)?;
    let dest = End::parse(&a.dest)?;
    let named = match (&src, &dest) {
        (End::Sandbox { .. }, End::Sandbox { .. }) => {
            bail!("both SRC and DEST are in a sandbox; copy out to this machine first, then in")
        }
        (End::Sandbox { name, .. }, _) | (_, End::Sandbox { name, .. }) => name.clone(),
        _ => bail!(
            "neither SRC nor DEST is in a sandbox: write the sandbox's side as `:PATH` (the sandbox given with -s, `default` when none) or `SANDBOX:PATH`, e.g. `berth cp ./data.csv :data/`"
        ),
    };
    let sandbox = match (a.sandbox.clone(), named) {
        (Some(s), Some(n)) if s != n => {
            bail!("two sandboxes are named, `-s {s}` and `{n}:`; name one")
        }
        (_, Some(n)) => n,
        (Some(s), None) => s,
        (None, None) => berth_client::DEFAULT_SANDBOX.to_string(),
    };
    berth_core::backend::check_sandbox_name(&sandbox)?;
    if dest == End::Stdio && std::io::stdout().is_terminal() {
        bail!(
            "DEST `-` writes a tar archive to stdout, which is a terminal; redirect it (`> out.tar`) or pipe it (`| tar -x`)"
        );
    }
    if src == End::Stdio && std::io::stdin().is_terminal() {
        bail!(
            "SRC `-` reads a tar archive from stdin, which is a terminal; pipe one in (`tar -c DIR | berth cp - :DEST`)"
        );
    }
    let rt = context::runtime(state_dir)?;
    let progress = Arc::new(Progress::new(!a.quiet && std::io::stderr().is_terminal()));
    let call = Call {
        rt: &rt,
        id: berth_core::runtime::new_call_id(),
        backend: a.backend,
        sandbox: sandbox.clone(),
        command: format!("cp {} {}", a.src, a.dest),
        started: Instant::now(),
        began: std::cell::Cell::new(false),
    };
    let done = match (&src, &dest) {
        (End::Sandbox { path, .. }, _) => copy_out(&call, path, &dest, &progress).await,
        (_, End::Sandbox { path, .. }) => copy_in(&call, &src, path, &progress).await,
        _ => Err(anyhow!("no side of the copy is in a sandbox")),
    };
    progress.clear();
    let code = finish(&call, &a, done, &progress);
    rt.shutdown().await;
    code
}

/// Log how the copy ended and say so: the exit code, or berth's own error.
fn finish(call: &Call<'_>, a: &CpArgs, done: Result<Done>, progress: &Progress) -> Result<u8> {
    let elapsed = call.started.elapsed();
    let done = match done {
        Ok(d) => d,
        Err(e) => {
            let denied = denial(&e).map(|d| d.to_string());
            // A refusal before the copy began is logged by the gate
            // (`exec.denied`); one met on the way (an entry of an archive
            // on stdin) ends a copy that began, and is logged as its end.
            if denied.is_none() || call.began.get() {
                let mut ev = call.event(EventKind::CopyFailed);
                ev.exit_code = Some(berth_client::EXIT_BERTH_ERROR.into());
                ev.duration_ms = Some(elapsed.as_millis() as i64);
                ev.detail = Some(json!({ "error": berth_client::error_text(&e) }).to_string());
                call.log(ev);
            }
            if a.json {
                context::print_json(&json!({
                    "error": berth_client::error_text(&e),
                    "denied": denied.is_some(),
                }));
            }
            return match denied {
                Some(d) => {
                    eprintln!("berth: {d}");
                    Ok(berth_client::report::EXIT_DENIED)
                }
                None => Err(e),
            };
        }
    };
    let c = &done.counts;
    let _ = call.rt.store().touch_sandbox(call.backend, &call.sandbox);
    let mut ev = call.event(EventKind::CopyFinished);
    ev.exit_code = Some(0);
    ev.duration_ms = Some(elapsed.as_millis() as i64);
    ev.bytes_out = Some(c.bytes as i64);
    ev.detail = Some(
        json!({
            "src": done.src, "dest": done.dest,
            "files": c.files, "dirs": c.dirs, "bytes": c.bytes,
            "left_out": c.left_out,
        })
        .to_string(),
    );
    call.log(ev);
    if !done.said.is_empty() {
        eprintln!("berth: cp: tar in the sandbox said: {}", done.said);
    }
    for l in &c.left_out {
        eprintln!("berth: cp: left out: {l}");
    }
    if a.json {
        context::print_json(&json!({
            "src": done.src,
            "dest": done.dest,
            "bytes": c.bytes,
            "files": c.files,
            "dirs": c.dirs,
            "left_out": c.left_out,
            "backend": call.backend,
            "sandbox": call.sandbox,
            "duration_ms": elapsed.as_millis() as u64,
        }));
    }
    if progress.shown() {
        eprintln!(
            "copied {} {}, {}{} in {:.1} s ({}): {} -> {}",
            c.files,
            if c.files == 1 { "file" } else { "files" },
            progress::size(c.bytes),
            match c.dirs {
                0 => String::new(),
                1 => ", 1 directory".to_string(),
                n => format!(", {n} directories"),
            },
            elapsed.as_secs_f64(),
            progress::rate(progress.done(), elapsed),
            done.src,
            done.dest
        );
    }
    Ok(0)
}

/// The policy's refusal in `e`, if that is what stopped the copy.
fn denial(e: &anyhow::Error) -> Option<&berth_core::Error> {
    e.chain()
        .filter_map(|c| c.downcast_ref::<berth_core::Error>())
        .find(|c| matches!(c, berth_core::Error::Denied { .. }))
}

/// The stricter of two verdicts (deny over ask over allow); the first of
/// two alike, so the first path that decided is the one named.
fn stricter(a: Option<Verdict>, b: Option<Verdict>) -> Option<Verdict> {
    match (a, b) {
        (Some(a), Some(b)) if b.action > a.action => Some(b),
        (None, b) => b,
        (a, _) => a,
    }
}

/// What lets a copy through when no gate and no rule had a word on it.
fn allowed(subject: &str) -> Verdict {
    Verdict {
        action: Action::Allow,
        rule: "default".into(),
        reason: "no file rule applies".into(),
        part: subject.to_string(),
        argv: Vec::new(),
    }
}

/// Whether any file rule of the policy judges `op`: only then can two
/// paths of a tree get different verdicts.
fn rules_judge(gate: Option<&Gate>, op: FileOp) -> bool {
    gate.is_some_and(|g| g.policy().files.rules.iter().any(|r| r.ops.contains(&op)))
}

/// A path on this machine made absolute, `.` parts dropped, without a
/// trailing `/`; one ending in `..` by its real name.
fn host_path(p: &str) -> Result<PathBuf> {
    let abs = std::path::absolute(p).map_err(|e| anyhow!("cannot read the path `{p}`: {e}"))?;
    let abs = if abs.ends_with("..") || p == ".." || p.ends_with("/..") {
        std::fs::canonicalize(&abs).map_err(|e| anyhow!("cannot read `{p}`: {e}"))?
    } else {
        abs.components().collect()
    };
    Ok(abs)
}

/// What is at `p` on this machine (a link to a directory is a directory).
fn host_found(p: &Path) -> Result<Found> {
    match std::fs::symlink_metadata(p) {
        Ok(_) if p.is_dir() => Ok(Found::Dir),
        Ok(_) => Ok(Found::NotDir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match p.parent().map(|d| d.is_dir()) {
                Some(false) => Ok(Found::NoParent),
                _ => Ok(Found::Nothing),
            }
        }
        Err(e) => Err(anyhow!("cannot read `{}`: {e}", p.display())),
    }
}

fn text(p: &Path) -> Result<String> {
    p.to_str().map(String::from).ok_or_else(|| {
        anyhow!(
            "`{}` is not UTF-8; rename it or copy its directory",
            p.display()
        )
    })
}

/// `dir/name`, or `dir` when there is no name.
fn joined(dir: &str, name: Option<&str>) -> String {
    match name {
        Some(n) => normalize_path(dir, n),
        None => dir.to_string(),
    }
}

/// Judge every path `names` gives (relative to `dir`) for `op`.
fn judge_all<'a>(
    gate: Option<&Gate>,
    op: FileOp,
    layout: &Layout,
    dir: &str,
    subject: &str,
    names: impl Iterator<Item = &'a Path>,
) -> Option<Verdict> {
    let mut v = None;
    for n in names {
        let abs = normalize_path(dir, &n.to_string_lossy());
        v = stricter(v, judge_file(gate, op, &abs, layout, subject));
    }
    v
}

/// This machine to the sandbox.
async fn copy_in(
    call: &Call<'_>,
    src: &End,
    dest_text: &str,
    progress: &Arc<Progress>,
) -> Result<Done> {
    // This machine's side first: a source that is not there fails before
    // any sandbox is touched (or made).
    let here = match src {
        End::Here(p) => {
            let shape = Shape::of(p);
            let abs = host_path(p)?;
            let top = if shape.follow {
                PathBuf::from(format!("{}/", abs.display()))
            } else {
                abs.clone()
            };
            let tree = tokio::task::spawn_blocking(move || host::walk(&top, shape.follow))
                .await
                .map_err(|e| anyhow!("the walking thread failed: {e}"))??;
            if tree.items.is_empty() {
                bail!("`{p}` is not a file, directory or link; berth cp copies those");
            }
            if shape.contents && !tree.is_dir {
                bail!("`{p}` is not a directory");
            }
            Some((shape, abs, tree))
        }
        _ => None,
    };
    let rt = call.rt;
    let sb = rt.attach_as_called(call.backend, &call.sandbox).await?;
    let layout = sb.layout().clone();
    let dest = normalize_path(&layout.workdir, dest_text);
    let found = remote::probe_dest(sb.as_ref(), &dest).await?;
    let gate = rt.gate().map(|g| g.as_ref());
    let Some((shape, abs, tree)) = here else {
        if found != Found::Dir {
            bail!(
                "an archive from stdin is unpacked into a directory, and `{dest}` is not one in sandbox `{}`; create it first (`berth exec -s {} -- mkdir -p {dest}`)",
                call.sandbox,
                call.sandbox
            );
        }
        return copy_archive_in(call, sb, layout, dest, progress).await;
    };
    let kind = if tree.is_dir { Kind::Dir } else { Kind::Single };
    let base = abs.file_name().and_then(|n| n.to_str());
    let landed = landing(kind, shape, base, &dest, dest_text, found)
        .map_err(|e| e.context(format!("in sandbox `{}`", call.sandbox)))?;
    let (dir, top) = match landed {
        Landing::Named { dir, name } => (dir, Some(name)),
        Landing::Into { dir } => (dir, None),
    };
    let target = joined(&dir, top.as_deref());
    let src_text = text(&abs)?;
    let shown_dest = format!("{}:{target}", call.sandbox);
    let subject = format!("cp {src_text} {shown_dest}");
    let names = tree
        .items
        .iter()
        .filter_map(|i| host::archive_name(top.as_deref(), &i.rel));
    let names: Vec<PathBuf> = names.collect();
    let top_v = judge_file(gate, FileOp::Write, &target, &layout, &subject);
    let v = stricter(
        top_v,
        judge_all(
            gate,
            FileOp::Write,
            &layout,
            &dir,
            &subject,
            names.iter().map(PathBuf::as_path),
        ),
    );
    call.admit(&subject, v.unwrap_or_else(|| allowed(&subject)))
        .await?;
    progress.set_total(tree.bytes);
    let (counts, said) = remote::tar_in(sb.as_ref(), &dir, progress, move |w| {
        host::pack(&tree, top.as_deref(), w)
    })
    .await?;
    Ok(Done {
        counts,
        src: src_text,
        dest: shown_dest,
        said,
    })
}

/// A tar archive on stdin into directory `dest` of the sandbox. Its
/// entries are judged as they pass: one the rules do not allow stops the
/// copy (an *ask* cannot be waited for in the middle of a stream; copy
/// from a directory instead, which is judged whole first).
async fn copy_archive_in(
    call: &Call<'_>,
    sb: Arc<dyn Sandbox>,
    layout: Layout,
    dest: String,
    progress: &Arc<Progress>,
) -> Result<Done> {
    let shown_dest = format!("{}:{dest}", call.sandbox);
    let subject = format!("cp - {shown_dest}");
    let gate = call.rt.gate().cloned();
    let v = judge_file(gate.as_deref(), FileOp::Write, &dest, &layout, &subject);
    call.admit(&subject, v.unwrap_or_else(|| allowed(&subject)))
        .await?;
    let dir = dest.clone();
    let (counts, said) = remote::tar_in(sb.as_ref(), &dest, progress, move |w| {
        let mut judge = |rel: &Path| -> Result<()> {
            let abs = normalize_path(&dir, &rel.to_string_lossy());
            match judge_file(gate.as_deref(), FileOp::Write, &abs, &layout, &subject) {
                Some(v) if v.action == Action::Deny => Err(berth_core::Error::Denied {
                    rule: v.rule,
                    reason: v.reason,
                    part: abs,
                    hint: "the entries before it were copied".into(),
                }
                .into()),
                Some(v) if v.action == Action::Ask => Err(berth_core::Error::Denied {
                    rule: v.rule,
                    reason: v.reason,
                    part: abs,
                    hint: "it needs an approval, which a stream from stdin cannot wait for; unpack the archive here and copy the directory (`berth cp DIR :DEST`), which asks once; the entries before it were copied".into(),
                }
                .into()),
                _ => Ok(()),
            }
        };
        host::restream(std::io::stdin().lock(), w, &mut judge)
    })
    .await?;
    Ok(Done {
        counts,
        src: "-".into(),
        dest: shown_dest,
        said,
    })
}

/// The sandbox to this machine (or to stdout).
async fn copy_out(
    call: &Call<'_>,
    src_text: &str,
    dest: &End,
    progress: &Arc<Progress>,
) -> Result<Done> {
    // This machine's side first: a destination whose directory is missing
    // fails before any sandbox is touched.
    let here = match dest {
        End::Here(p) => {
            let abs = host_path(p)?;
            let found = host_found(&abs)?;
            if found == Found::NoParent {
                let (dir, _) = split(&text(&abs)?);
                bail!(
                    "the destination's directory `{dir}` does not exist on this machine; create it first (`mkdir -p {dir}`)"
                );
            }
            Some((p.as_str(), abs, found))
        }
        _ => None,
    };
    let rt = call.rt;
    let sb = rt.attach_as_called(call.backend, &call.sandbox).await?;
    let layout = sb.layout().clone();
    let shape = Shape::of(src_text);
    let abs = normalize_path(&layout.workdir, src_text);
    let at = if shape.follow && abs != "/" {
        format!("{abs}/")
    } else {
        abs.clone()
    };
    let shown_src = format!("{}:{abs}", call.sandbox);
    let dest_shown = match &here {
        Some((_, p, _)) => text(p)?,
        None => "-".into(),
    };
    let subject = format!("cp {shown_src} {dest_shown}");
    let gate = rt.gate().map(|g| g.as_ref());
    let mut verdict = judge_file(gate, FileOp::Read, &abs, &layout, &subject);
    if let Some(v) = verdict.clone().filter(|v| v.action == Action::Deny) {
        // Refused whole: nothing in the sandbox is looked at.
        call.admit(&subject, v).await?;
    }
    if berth_policies::files::is_under(&layout.berth_dir, &abs) {
        // A tree that holds berth's own directory: refused whole, whatever
        // the rules say (its paths need not even be readable to list).
        let v = Verdict {
            action: Action::Deny,
            rule: "builtin:berth-dir".into(),
            reason: format!(
                "`{abs}` holds berth's private directory in the sandbox, `{}`, which is never copied; copy what is beside it",
                layout.berth_dir
            ),
            part: subject.clone(),
            argv: Vec::new(),
        };
        call.admit(&subject, v).await?;
    }
    // Paths beneath it are judged one by one when a rule could tell them
    // apart; the listing also gives the total a progress line shows.
    let judging = rules_judge(gate, FileOp::Read);
    let mut total = 0u64;
    let source = if judging || progress.shown() {
        let mut listing = |rel: &str, kind: char, size: u64| {
            if kind == 'f' {
                total += size;
            }
            if judging {
                let p = normalize_path(&abs, rel);
                let v = judge_file(gate, FileOp::Read, &p, &layout, &subject);
                verdict = stricter(verdict.take(), v);
            }
        };
        let listing: &mut dyn FnMut(&str, char, u64) = &mut listing;
        remote::probe_src(sb.as_ref(), &at, Some(listing)).await?
    } else {
        remote::probe_src(sb.as_ref(), &at, None).await?
    };
    let kind = match source {
        Source::Missing => bail!(
            "`{abs}` does not exist in sandbox `{}`; see what is there with `berth exec -s {} -- ls -la {}`",
            call.sandbox,
            call.sandbox,
            split(&abs).0
        ),
        Source::Other => bail!(
            "`{abs}` in sandbox `{}` is not a file, directory or link (a FIFO, socket or device); berth cp copies those",
            call.sandbox
        ),
        Source::Dir => Kind::Dir,
        Source::File(n) => {
            total = n;
            Kind::Single
        }
        Source::Link => Kind::Single,
    };
    if shape.contents && kind != Kind::Dir {
        bail!("`{abs}` in sandbox `{}` is not a directory", call.sandbox);
    }
    call.admit(&subject, verdict.unwrap_or_else(|| allowed(&subject)))
        .await?;
    progress.set_total(total);
    let (parent, name) = split(&abs);
    let name = name.to_string();
    let Some((dest_text, dest_abs, found)) = here else {
        // To stdout: the archive holds NAME/... as `docker cp` writes it, or
        // the directory's entries for `DIR/.` (and for `/`).
        let (dir, name) = if shape.contents || name.is_empty() {
            (at.clone(), ".".to_string())
        } else {
            (parent, name)
        };
        let (counts, said) = remote::tar_out(sb.as_ref(), &dir, &name, progress, move |r| {
            let out = std::io::BufWriter::with_capacity(pipe::CHUNK, std::io::stdout().lock());
            host::restream(r, out, &mut |_: &Path| Ok(()))
        })
        .await?;
        return Ok(Done {
            counts,
            src: shown_src,
            dest: "-".into(),
            said,
        });
    };
    let dest_str = text(&dest_abs)?;
    let landed = landing(kind, shape, base_name(&abs), &dest_str, dest_text, found)?;
    let (counts, said, target) = match (kind, landed) {
        (Kind::Dir, landed) => {
            let root = match landed {
                Landing::Named { dir, name } => PathBuf::from(dir).join(name),
                Landing::Into { dir } => PathBuf::from(dir),
            };
            let make = match std::fs::symlink_metadata(&root) {
                Ok(_) if root.is_dir() => false,
                Ok(_) => bail!(
                    "`{}` exists and is not a directory: the directory `{abs}` cannot be copied onto it",
                    root.display()
                ),
                Err(_) => true,
            };
            let into = root.clone();
            let (c, s) = remote::tar_out(sb.as_ref(), &at, ".", progress, move |r| {
                host::unpack_tree(r, &into, make)
            })
            .await?;
            (c, s, root)
        }
        (Kind::Single, Landing::Named { dir, name: to }) => {
            let target = PathBuf::from(dir).join(to);
            let into = target.clone();
            let from = name.clone();
            let (c, s) = remote::tar_out(sb.as_ref(), &parent, &name, progress, move |r| {
                host::unpack_one(r, &from, &into)
            })
            .await?;
            (c, s, target)
        }
        (Kind::Single, Landing::Into { .. }) => {
            bail!("`{abs}` is not a directory; name the file to write")
        }
    };
    Ok(Done {
        counts,
        src: shown_src,
        dest: text(&target)?,
        said,
    })
}
