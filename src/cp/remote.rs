//! The sandbox's side of `berth cp`: what a path is there, and `tar`
//! packing or unpacking it, each through `Sandbox::spawn` as the sandbox's
//! own user, so what lands in a sandbox is that user's (uid 1000 in a
//! docker sandbox by default) and no helper runs with more than its
//! commands have. Any backend with `sh`, `tar` and `find` serves.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use berth_core::backend::{Sandbox, SpawnOpts, run_to_end};
use berth_core::error::{Error, SpawnFailure};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::ends::Found;
use super::host::SideStopped;
use super::pipe::{ChunkReader, ChunkWriter, collect, feed, pump};
use super::progress::Progress;

/// How long a probe of one path may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of a `tar`'s stderr kept for its error.
const STDERR_KEEP: usize = 8 * 1024;

/// Args: PATH. Prints what is at PATH: `dir`, `file` (anything else that
/// exists, a dangling link too), `none` (in a directory that exists) or
/// `noparent`.
const PROBE_DEST: &str = r#"if [ -d "$1" ]; then echo dir
elif [ -e "$1" ] || [ -L "$1" ]; then echo file
elif [ -d "$(dirname -- "$1")" ]; then echo none
else echo noparent; fi"#;

/// Args: PATH MODE. Prints what PATH is on one line (`link`, `dir`,
/// `file SIZE`, `other`, `none`), a link first, unfollowed (a trailing `/`
/// follows it). With MODE `list` and a directory, then every path beneath
/// it as `TYPE SIZE PATH` records ended by NUL, PATH relative to it.
const PROBE_SRC: &str = r#"s=$1
if [ -L "$s" ]; then echo link
elif [ -d "$s" ]; then echo dir
elif [ -f "$s" ]; then echo "file $(stat -c %s -- "$s")"
elif [ -e "$s" ]; then echo other
else echo none; exit 0; fi
[ "$2" = list ] && [ -d "$s" ] && ! [ -L "$s" ] || exit 0
exec find "$s" -mindepth 1 -printf '%y %s %P\0'"#;

fn sh(script: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec!["sh".into(), "-c".into(), script.into(), "berth-cp".into()];
    argv.extend(args.iter().map(|a| a.to_string()));
    argv
}

fn opts() -> SpawnOpts {
    SpawnOpts {
        helper: true,
        ..SpawnOpts::default()
    }
}

/// What is at `path` in the sandbox.
pub async fn probe_dest(sb: &dyn Sandbox, path: &str) -> Result<Found> {
    let c = run_to_end(sb, &sh(PROBE_DEST, &[path]), None, 4096, PROBE_TIMEOUT).await?;
    let out = String::from_utf8_lossy(&c.stdout);
    Ok(match (c.status.code, out.trim()) {
        (Some(0), "dir") => Found::Dir,
        (Some(0), "file") => Found::NotDir,
        (Some(0), "none") => Found::Nothing,
        (Some(0), "noparent") => Found::NoParent,
        _ => bail!(
            "cannot look at `{path}` in sandbox `{}`: {}{}",
            sb.name(),
            out.trim(),
            String::from_utf8_lossy(&c.stderr).trim()
        ),
    })
}

/// What a source in the sandbox is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A directory (or a link to one, followed).
    Dir,
    /// A regular file of this many bytes.
    File(u64),
    /// A link, not followed.
    Link,
    /// A FIFO, socket or device.
    Other,
    /// Nothing.
    Missing,
}

/// Told each path beneath a directory: its path relative to it, its type
/// letter (`find -printf %y`) and its size.
pub type Listing<'a> = &'a mut dyn FnMut(&str, char, u64);

/// What `path` is in the sandbox; with `listing`, each path beneath a
/// directory (relative to it), its type letter (`find -printf %y`) and
/// size are handed to `listing` as they arrive.
pub async fn probe_src(
    sb: &dyn Sandbox,
    path: &str,
    mut listing: Option<Listing<'_>>,
) -> Result<Source> {
    let mode = if listing.is_some() { "list" } else { "stat" };
    let mut p = sb.spawn(&sh(PROBE_SRC, &[path, mode]), opts()).await?;
    drop(p.take_stdin());
    let out = p
        .take_stdout()
        .ok_or_else(|| anyhow!("the probe in the sandbox has no stdout"))?;
    let err = collect(p.take_stderr(), STDERR_KEEP);
    let read = async {
        let mut out = BufReader::new(out);
        let mut first = Vec::new();
        out.read_until(b'\n', &mut first).await?;
        let first = String::from_utf8_lossy(&first).trim().to_string();
        let mut rec = Vec::new();
        loop {
            rec.clear();
            if out.read_until(0, &mut rec).await? == 0 {
                break;
            }
            let text = String::from_utf8_lossy(rec.strip_suffix(&[0]).unwrap_or(&rec));
            let mut parts = text.splitn(3, ' ');
            let (Some(kind), Some(size), Some(rel)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if let Some(f) = listing.as_mut() {
                let kind = kind.chars().next().unwrap_or('?');
                f(rel, kind, size.parse().unwrap_or(0));
            }
        }
        Ok::<String, std::io::Error>(first)
    };
    let (first, err) = tokio::join!(read, err);
    let first = first.context("cannot read the probe's answer from the sandbox")?;
    let status = p.wait().await?;
    if status.code != Some(0) {
        bail!(
            "cannot list `{path}` in sandbox `{}`: {}",
            sb.name(),
            String::from_utf8_lossy(&err).trim()
        );
    }
    let mut words = first.split(' ');
    Ok(match (words.next(), words.next()) {
        (Some("dir"), _) => Source::Dir,
        (Some("file"), Some(n)) => Source::File(n.parse().unwrap_or(0)),
        (Some("link"), _) => Source::Link,
        (Some("other"), _) => Source::Other,
        (Some("none"), _) => Source::Missing,
        _ => bail!(
            "cannot look at `{path}` in sandbox `{}`: {first}{}",
            sb.name(),
            String::from_utf8_lossy(&err).trim()
        ),
    })
}

/// How a `tar` in the sandbox ended well: what it said on stderr, if
/// anything (a warning, such as a file that changed while it was read).
pub type Said = String;

/// A failed spawn of `tar`, with what to do about it.
fn spawn_error(sb: &dyn Sandbox, e: Error) -> anyhow::Error {
    match e {
        Error::Spawn {
            kind: SpawnFailure::NotFound,
            ..
        } => anyhow!(
            "sandbox `{}` ({}) has no `tar`, which berth cp runs there; install it in the sandbox (Debian: `apt-get install tar`)",
            sb.name(),
            sb.kind()
        ),
        e => anyhow::Error::new(e).context(format!(
            "cannot start `tar` in sandbox `{}` ({})",
            sb.name(),
            sb.kind()
        )),
    }
}

/// What a `tar` that failed in the sandbox said, as an error.
fn tar_failed(sb: &dyn Sandbox, doing: &str, code: i32, stderr: &[u8]) -> anyhow::Error {
    let said = String::from_utf8_lossy(stderr);
    let said = said.trim();
    anyhow!(
        "`tar` in sandbox `{}` ({}) failed {doing} (exit {code}){}",
        sb.name(),
        sb.kind(),
        if said.is_empty() {
            String::new()
        } else {
            format!(":\n{said}")
        }
    )
}

/// Unpack what `pack` writes into directory `dir` of the sandbox:
/// `tar -x` there as the sandbox's user, never taking owners from the
/// archive (`--no-same-owner`: a root sandbox without CAP_CHOWN, such as a
/// local one run by root, would fail every file).
pub async fn tar_in<T: Send + 'static>(
    sb: &dyn Sandbox,
    dir: &str,
    progress: &Arc<Progress>,
    pack: impl FnOnce(ChunkWriter) -> Result<T> + Send + 'static,
) -> Result<(T, Said)> {
    let argv = ["tar", "-x", "-f", "-", "-C", dir, "--no-same-owner"].map(String::from);
    let mut p = sb
        .spawn(&argv, opts())
        .await
        .map_err(|e| spawn_error(sb, e))?;
    let stdin = p
        .take_stdin()
        .ok_or_else(|| anyhow!("`tar` in the sandbox has no stdin"))?;
    let (w, rx) = ChunkWriter::new();
    let packing = tokio::task::spawn_blocking(move || pack(w));
    let (fed, _, stderr) = tokio::join!(
        feed(rx, stdin, progress),
        collect(p.take_stdout(), STDERR_KEEP),
        collect(p.take_stderr(), STDERR_KEEP)
    );
    let packed = packing
        .await
        .map_err(|e| anyhow!("the packing thread failed: {e}"))?;
    let status = p.wait().await?;
    let code = status.shell_code();
    // A packing error of its own (a file here that cannot be read) comes
    // first; one that only says the sandbox stopped reading does not: the
    // sandbox's tar says why.
    let stopped = packed
        .as_ref()
        .err()
        .is_some_and(|e| e.downcast_ref::<SideStopped>().is_some());
    match packed {
        Err(e) if !stopped => Err(e.context(format!(
            "the copy into `{dir}` stopped; what was sent before it is there"
        ))),
        _ if code != 0 => Err(tar_failed(
            sb,
            &format!("unpacking into `{dir}`"),
            code,
            &stderr,
        )),
        Err(e) => Err(e),
        Ok(v) => {
            fed.with_context(|| format!("cannot send the copy to sandbox `{}`", sb.name()))?;
            Ok((v, String::from_utf8_lossy(&stderr).trim().to_string()))
        }
    }
}

/// Pack `name` in directory `dir` of the sandbox (`tar -c -C DIR -- NAME`)
/// and hand the stream to `unpack`. Should `unpack` fail, the sandbox's
/// `tar` is stopped; should it end before the stream does (the archive's
/// end is read, padding follows), the rest is read and dropped.
pub async fn tar_out<T: Send + 'static>(
    sb: &dyn Sandbox,
    dir: &str,
    name: &str,
    progress: &Arc<Progress>,
    unpack: impl FnOnce(ChunkReader) -> Result<T> + Send + 'static,
) -> Result<(T, Said)> {
    let argv = ["tar", "-c", "-f", "-", "-C", dir, "--", name].map(String::from);
    let mut p = sb
        .spawn(&argv, opts())
        .await
        .map_err(|e| spawn_error(sb, e))?;
    drop(p.take_stdin());
    let out = p
        .take_stdout()
        .ok_or_else(|| anyhow!("`tar` in the sandbox has no stdout"))?;
    let err = p.take_stderr();
    let (r, tx) = ChunkReader::new();
    let unpacking = tokio::task::spawn_blocking(move || unpack(r));
    let watch = async {
        let r = unpacking
            .await
            .map_err(|e| anyhow!("the unpacking thread failed: {e}"));
        if !matches!(r, Ok(Ok(_))) {
            let _ = p.terminate().await;
        }
        r
    };
    let ((), stderr, unpacked) =
        tokio::join!(pump(out, tx, progress), collect(err, STDERR_KEEP), watch);
    let unpacked = unpacked?;
    let status = p.wait().await?;
    let code = status.shell_code();
    let said = String::from_utf8_lossy(&stderr).trim().to_string();
    let doing = format!("packing `{name}` in `{dir}`");
    match unpacked {
        // GNU tar's 1: some file changed while it was read; the archive is whole.
        Ok(v) if code == 0 || code == 1 => Ok((v, said)),
        Ok(_) => Err(tar_failed(sb, &doing, code, &stderr)),
        // The stream broke because tar failed: its words first.
        Err(e) if code != 0 && code != 1 && !said.is_empty() => {
            Err(e.context(tar_failed(sb, &doing, code, &stderr).to_string()))
        }
        Err(e) => Err(e),
    }
}
