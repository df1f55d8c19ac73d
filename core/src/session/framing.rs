//! The framing between the engine and the shell's loop: sending one framed
//! command and reading its output up to its end marker (or the shell's end,
//! or the end of the stop sequence), the marker's fields, and a snapshot's
//! header and trailer.

use std::collections::HashSet;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::script::{self, SnapshotMode};
use super::stop::Stop;
use super::{Capture, CaptureLimits, STARTUP_DEADLINE, Session};
use crate::backend::OutputGap;
use crate::error::{Error, Result};

/// How one command is framed: when its snapshot is written, and whether the
/// loop's guard runs after it (see `script::GUARD`).
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) snapshot: SnapshotMode,
    pub(super) guard: bool,
    /// The command may run code the engine cannot read (a call of a name the
    /// session defined, `source`, `eval`, a command word built at run time),
    /// which may replace the loop's interrupt handlers: stopping it kills its
    /// shell rather than trusting the handlers.
    pub(super) distrust: bool,
    /// For [`SnapshotMode::Journal`]: the names to journal, one space apart.
    pub(super) journal: String,
    /// The command reads the input berth wrote for it.
    pub(super) stdin: bool,
}

/// How a framed command ended.
pub(super) enum Ending {
    Marker {
        code: i32,
        cwd: String,
        /// The shell's function and alias names, sent after a snapshot (and only then).
        names: Option<Names>,
        /// The shell appended a journal record instead of a snapshot.
        journaled: bool,
        /// The shell is exiting (`exit`, `set -e`), its state saved.
        exiting: bool,
        /// The shell's watermark before this command.
        watermark_before: u64,
        /// The length of the shell's `PATH` after the command.
        path_len: u64,
        /// The shell's definitions, sent after a snapshot (see [`Defs`]).
        defs: Option<Defs>,
        /// The marker carries the cut nonce: the command did not end on its
        /// own (a stop, `exit`), or the marker is forged (see `script`).
        cut: bool,
    },
    /// The shell closed its stdout: it exited or died.
    Eof,
    /// The transport lost the link to the shell and re-attached to it: the
    /// shell lives on, but what it wrote in between is lost (see
    /// [`crate::backend::OutputGap`]).
    Gap(String),
}

/// Whether a dead shell's status says its loop lost the framing.
pub(super) fn is_lost_framing(status: &str) -> bool {
    status == format!("exit code {}", script::LOST_FRAMING)
}

/// A marker's two ends for one nonce.
pub(super) struct Pattern {
    pub(super) nonce: String,
    pub(super) start: Vec<u8>,
    pub(super) end: Vec<u8>,
}

impl Pattern {
    pub(super) fn new(nonce: &str) -> Pattern {
        Pattern {
            nonce: nonce.to_string(),
            start: format!("\u{1e}{nonce}:").into_bytes(),
            end: format!(":{nonce}\u{1e}").into_bytes(),
        }
    }
}

/// Move output out of `pending` into `capture` until the first marker of any
/// of `pats`; return the ending, and which pattern it matched, once the whole
/// marker is there.
pub(super) fn scan(
    pending: &mut Vec<u8>,
    pats: &[&Pattern],
    capture: &mut Capture,
) -> Result<Option<(usize, Ending)>> {
    if pending.is_empty() {
        return Ok(None);
    }
    let first = pats
        .iter()
        .enumerate()
        .filter_map(|(k, p)| memchr::memmem::find(pending, &p.start).map(|i| (i, k)))
        .min();
    match first {
        Some((i, k)) => {
            let pat = pats[k];
            if i > 0 {
                capture.push(&pending[..i])?;
                pending.drain(..i);
            }
            let body_start = pat.start.len();
            if let Some(j) = memchr::memmem::find(&pending[body_start..], &pat.end) {
                let body =
                    String::from_utf8_lossy(&pending[body_start..body_start + j]).into_owned();
                pending.drain(..body_start + j + pat.end.len());
                return Ok(Some((k, parse_marker(&body, &pat.nonce))));
            }
            Ok(None)
        }
        None => {
            // Hold back only a suffix that could begin a marker, so output reaches
            // a live tee as soon as it arrives. A marker's only 0x1e is its first
            // byte, so the last 0x1e is the only candidate.
            let longest = pats.iter().map(|p| p.start.len()).max().unwrap_or(1);
            let window = pending.len().saturating_sub(longest - 1);
            let cut = match memchr::memrchr(0x1e, &pending[window..]) {
                Some(k)
                    if pats
                        .iter()
                        .any(|p| p.start.starts_with(&pending[window + k..])) =>
                {
                    window + k
                }
                _ => pending.len(),
            };
            if cut > 0 {
                capture.push(&pending[..cut])?;
                pending.drain(..cut);
            }
            Ok(None)
        }
    }
}

/// The shell's definitions as a marker after a snapshot carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Defs {
    /// `declare -f`; `None` after a snapshot without the functions.
    pub(super) functions: Option<String>,
    /// `alias -p`.
    pub(super) aliases: String,
}

/// The shell's names as a marker after a snapshot reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Names {
    /// Function names; `None` when the snapshot left the functions out, since
    /// the command could not have changed one.
    pub(super) functions: Option<HashSet<String>>,
    /// Alias names, and after them, as `$NAME`, the exported variables that
    /// make programs run code berth did not read (`LD_PRELOAD`, `BASH_ENV`,
    /// `GIT_SSH_COMMAND`, …): a snapshot restores them, and a sandbox can
    /// write its snapshot. `$!NAME` says such a variable the shell started
    /// with (berth's `PAGER=cat`) has another value now.
    pub(super) aliases: HashSet<String>,
}

fn name_list(list: &str) -> HashSet<String> {
    list.lines()
        .filter(|n| !n.is_empty() && !n.starts_with("__berth_"))
        .filter(|n| match n.strip_prefix('$') {
            // An exported variable (`$NAME`, no alias can hold a `$`), or one
            // whose value is no longer the one the shell started with
            // (`$!NAME`): kept only when it makes programs run code.
            Some(var) => {
                let var = var.strip_prefix('!').unwrap_or(var);
                berth_policies::embedded::variable_code(var).is_some()
            }
            None => true,
        })
        .map(str::to_string)
        .collect()
}

/// Read a marker's body: `<exit>\x1f<names>\x1f<watermark>\x1f<PATH length>\x1f<cwd>`, where
/// `<names>` is an optional `!` (the shell is exiting), then `-` (no snapshot),
/// `+` (a journal record), `~` and one alias name per line (a snapshot without
/// the functions), or `=`, one function name per line, `\x1d`, and one alias
/// name per line. The
/// watermark is returned in `watermark_before`, which the caller swaps with the
/// shell's current one.
pub(super) fn parse_marker(body: &str, nonce: &str) -> Ending {
    // The definitions come last, each part after the nonce, which neither the
    // cwd nor a definition can hold (see `script`).
    let sep = format!("\u{1e}{nonce}");
    let (body, defs) = match body.split_once(&sep) {
        Some((fields, defs)) => (fields, parse_defs(defs, &sep)),
        None => (body, None),
    };
    let mut parts = body.splitn(5, '\u{1f}');
    let code = parts.next().and_then(|c| c.parse().ok()).unwrap_or(-1);
    let names = parts.next().unwrap_or_default();
    let (exiting, names) = match names.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, names),
    };
    let journaled = names == "+";
    let names = if let Some(list) = names.strip_prefix('=') {
        let (functions, aliases) = list.rsplit_once('\u{1d}').unwrap_or((list, ""));
        Some(Names {
            functions: Some(name_list(functions)),
            aliases: name_list(aliases),
        })
    } else {
        names.strip_prefix('~').map(|aliases| Names {
            functions: None,
            aliases: name_list(aliases),
        })
    };
    let watermark = parts.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let path_len = parts.next().and_then(|w| w.parse().ok()).unwrap_or(0);
    let cwd = parts.next().unwrap_or_default().to_string();
    Ending::Marker {
        code,
        cwd,
        names,
        journaled,
        exiting,
        watermark_before: watermark,
        path_len,
        defs,
        cut: false,
    }
}

/// `F<functions>\x1e<nonce>A<aliases>` or `A<aliases>`.
fn parse_defs(defs: &str, sep: &str) -> Option<Defs> {
    if let Some(aliases) = defs.strip_prefix('A') {
        return Some(Defs {
            functions: None,
            aliases: aliases.to_string(),
        });
    }
    let (functions, aliases) = defs.strip_prefix('F')?.split_once(sep)?;
    Some(Defs {
        functions: Some(functions.to_string()),
        aliases: aliases.strip_prefix('A')?.to_string(),
    })
}

/// A snapshot as read from its file.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct SnapshotFile {
    pub(super) seq: u64,
    /// The sequence of the functions file it goes with (see [`parse_functions`]):
    /// `None` for an older snapshot that holds its functions itself, `Some(0)`
    /// when the shell had written none.
    pub(super) functions: Option<u64>,
    pub(super) text: String,
}

/// Check a snapshot's header and trailer; return its sequence and text. Snapshots
/// are rewritten in place, so bytes after the matching trailer are stale and ignored.
pub(super) fn parse_snapshot(data: &[u8]) -> Option<SnapshotFile> {
    let nl = memchr::memchr(b'\n', data)?;
    let first = std::str::from_utf8(&data[..nl]).ok()?;
    let (seq, functions) = match first.strip_prefix("# berth snapshot v3 seq=") {
        Some(rest) => {
            let (seq, functions) = rest.split_once(" functions=")?;
            (seq, Some(functions.parse().ok()?))
        }
        None => (
            first
                .strip_prefix("# berth snapshot v2 seq=")
                .or_else(|| first.strip_prefix("# berth snapshot v1 seq="))?,
            None,
        ),
    };
    let seq: u64 = seq.parse().ok()?;
    let text = cut_at_trailer(data, &format!("\n# berth snapshot end seq={seq}\n"))?;
    Some(SnapshotFile {
        seq,
        functions,
        text,
    })
}

/// Check a functions file's header and trailer; return its sequence and text.
/// The shell writes its functions to a file of their own, and only after a
/// command that may have changed one; each snapshot names the one it goes with.
pub(super) fn parse_functions(data: &[u8]) -> Option<(u64, String)> {
    let nl = memchr::memchr(b'\n', data)?;
    let first = std::str::from_utf8(&data[..nl]).ok()?;
    let seq: u64 = first.strip_prefix("# berth functions seq=")?.parse().ok()?;
    let text = cut_at_trailer(data, &format!("\n# berth functions end seq={seq}\n"))?;
    Some((seq, text))
}

/// The journal records that follow the snapshot with sequence `base`, in
/// order: their text, the last one's sequence (`base` when there are none),
/// and their count. The shell appends a record per state change it journals,
/// each closed by a trailer, and empties the file after each whole snapshot;
/// records of another base (a whole snapshot was written, or torn, before the
/// file was emptied) are skipped, and reading stops at the first torn record
/// or a gap in the sequence.
pub(super) fn parse_journal(data: &[u8], base: u64) -> (String, u64, usize) {
    let (mut text, mut last, mut count) = (String::new(), base, 0);
    let mut rest = data;
    while let Some(nl) = memchr::memchr(b'\n', rest) {
        let Some((b, seq)) = std::str::from_utf8(&rest[..nl])
            .ok()
            .and_then(|l| l.strip_prefix("# berth journal base="))
            .and_then(|l| l.split_once(" seq="))
            .and_then(|(b, s)| Some((b.parse::<u64>().ok()?, s.parse::<u64>().ok()?)))
        else {
            break;
        };
        let trailer = format!("\n# berth journal end seq={seq}\n");
        let Some(end) = memchr::memmem::find(rest, trailer.as_bytes()).map(|e| e + trailer.len())
        else {
            break;
        };
        if b == base {
            let Some(record) = std::str::from_utf8(&rest[..end])
                .ok()
                .filter(|_| seq == last + 1)
            else {
                break;
            };
            text.push_str(record);
            last = seq;
            count += 1;
        }
        rest = &rest[end..];
    }
    (text, last, count)
}

/// The text up to and with `trailer`. Cut before decoding: the stale bytes
/// past the trailer may split a UTF-8 sequence of the older text they came from.
fn cut_at_trailer(data: &[u8], trailer: &str) -> Option<String> {
    let end = memchr::memmem::find(data, trailer.as_bytes())? + trailer.len();
    std::str::from_utf8(&data[..end]).ok().map(str::to_string)
}

/// 64 random bits: unguessable for one command's lifetime.
pub(super) fn new_nonce() -> String {
    let n: u64 = rand::random();
    format!("{n:016x}")
}

impl Session {
    /// Run berth's own command in the shell and return its output as text.
    pub(super) async fn internal(
        &mut self,
        text: &str,
        snapshot: SnapshotMode,
        limit: Duration,
    ) -> Result<String> {
        let mut capture = Capture::new(
            CaptureLimits {
                head: 64 * 1024,
                tail: 0,
            },
            None,
        )?;
        // berth's own commands finish at once: one that does not is not stopped
        // step by step like a user's, its shell is replaced.
        // berth's own text (a snapshot's replay) defines functions: guarded.
        let plan = Plan {
            snapshot,
            guard: true,
            distrust: false,
            journal: String::new(),
            stdin: false,
        };
        let framed = self.run_framed(text, plan, &mut capture, None, None, None);
        let Ok(framed) = tokio::time::timeout(limit, framed).await else {
            self.replace_shell().await;
            return Err(self.session_error(&format!(
                "the shell did not answer berth's own command within {:.1}s; it was replaced",
                limit.as_secs_f64()
            )));
        };
        let (ending, _) = framed?;
        let out = capture.finish()?.text();
        if let Some(Ending::Marker { .. }) = ending {
            return Ok(out);
        }
        // The shell ended. Its last words (say, the sandbox wrapper's refusal)
        // may still be in flight on stderr: give the reader a moment to finish,
        // and keep them before the shell is reaped, which drops its stderr.
        if let Some(reader) = self.shell.as_mut().and_then(|s| s.stderr_reader.take()) {
            let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
        }
        let stderr = self.stderr_text();
        if matches!(ending, Some(Ending::Eof))
            && self
                .reap_dead_shell()
                .await
                .is_ok_and(|st| is_lost_framing(&st))
        {
            return Err(self.lost_framing());
        }
        self.drop_shell().await;
        Err(self.session_error(&format!(
            "the shell died while starting{}",
            if stderr.is_empty() {
                String::new()
            } else {
                format!(": {stderr}")
            }
        )))
    }

    /// Send one framed command and read until its marker, the shell's end, or the
    /// end of the stop sequence. Returns `None` as the ending when the shell had to
    /// be replaced.
    pub(super) async fn run_framed(
        &mut self,
        text: &str,
        plan: Plan,
        capture: &mut Capture,
        timeout: Option<Duration>,
        cancel: Option<CancellationToken>,
        stderr: Option<&mut Capture>,
    ) -> Result<(Option<Ending>, Option<Stop>)> {
        if text.len() > script::MAX_TEXT {
            return Err(Error::InvalidInput(format!(
                "the command text is {} bytes, more than a frame carries ({} bytes); write it to a file and run that",
                text.len(),
                script::MAX_TEXT
            )));
        }
        let (nonce, cut_nonce) = (new_nonce(), new_nonce());
        let frame = script::frame(
            &nonce,
            &cut_nonce,
            text,
            plan.snapshot,
            script::Io {
                stdin: plan.stdin,
                stderr_apart: stderr.is_some(),
            },
            plan.guard,
            &plan.journal,
        );

        let end_pat = Pattern::new(&nonce);
        let cut_pat = Pattern::new(&cut_nonce);
        let cancel = cancel.unwrap_or_default();
        // A command that sets traps may have replaced the one that abandons it
        // on an interrupt: stopping it kills its shell instead. So may one that
        // runs code the engine cannot read, though its text never says `trap`.
        let distrust = text.contains("trap") || plan.distrust;
        let mut deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut stop: Option<Stop> = None;
        let mut stage = 0usize;

        let host_processes = self.sandbox.host_processes();
        let Some(shell) = self.shell.as_mut() else {
            return Err(self.session_error("no shell"));
        };
        shell.command_sent = Some(std::time::Instant::now());
        let mut err = stderr.map(|c| {
            super::stderr::ErrSide::new(
                c,
                shell.stderr_feed.clone(),
                shell.stderr_bell.clone(),
                &nonce,
                &cut_nonce,
            )
        });
        if host_processes {
            shell.children_before = super::tree::children(shell.info.pid);
        }
        // The shell is idle at its `read`, so the frame drains promptly; a shell that
        // does not take it within the deadline is wedged and gets replaced.
        let write = async {
            shell.stdin.write_all(&frame).await?;
            shell.stdin.flush().await
        };
        let write_limit = timeout.unwrap_or(STARTUP_DEADLINE).min(STARTUP_DEADLINE);
        match tokio::time::timeout(write_limit, write).await {
            Ok(Ok(())) => {}
            // A closed stdin means the shell is gone; its stdout ends too and the
            // loop below reports that.
            Ok(Err(e)) => debug!(session = %self.cfg.name, error = %e, "shell stdin closed"),
            Err(_) => {
                self.replace_shell().await;
                return Err(self.session_error(
                    "the shell stopped reading its input; it was replaced, run the command again",
                ));
            }
        }

        if let Some(shell) = self.shell.as_mut() {
            shell.spin(&end_pat.end);
        }
        let (mut streamed, mut last) = (0u64, 0usize);
        let err_bell = err.as_ref().map(|e| e.bell.clone());
        let ended = loop {
            // Attribute whatever is pending.
            let found = match self.shell.as_mut() {
                Some(shell) => scan(&mut shell.pending, &[&end_pat, &cut_pat], capture)?,
                None => None,
            };
            if let Some((which, mut ending)) = found {
                let by_cut = which == 1;
                // A cut marker is the shell's own only while berth stops the
                // command, or when the shell exits (which the caller checks):
                // anywhere else a command read the cut nonce from the pipe
                // and printed it, and may still be running.
                if by_cut
                    && stop.is_none()
                    && matches!(ending, Ending::Marker { exiting: false, .. })
                {
                    warn!(session = %self.cfg.name, "a cut marker while no stop was under way: forged");
                    self.replace_shell().await;
                    return Err(self.lost_framing());
                }
                if let Some(shell) = self.shell.as_mut()
                    && let Ending::Marker {
                        names,
                        journaled,
                        watermark_before,
                        cwd,
                        path_len,
                        defs,
                        cut,
                        ..
                    } = &mut ending
                {
                    *cut = by_cut;
                    shell.last_place = (cwd.clone(), *path_len);
                    if let Some(n) = names {
                        shell.learn_names(n);
                        shell.saved_place = Some(shell.last_place.clone());
                        shell.journal_len = 0;
                        // Only the end nonce vouches for the definitions: after
                        // any other ending they are unknown until the next
                        // snapshot, and the gate treats the names as opaque.
                        match defs.take().filter(|_| !by_cut) {
                            Some(d) => shell.learn_defs(d),
                            None => shell.forget_defs(),
                        }
                    } else if *journaled {
                        shell.saved_place = Some(shell.last_place.clone());
                        shell.journal_len += 1;
                    }
                    // The marker carried the watermark after the command.
                    std::mem::swap(&mut shell.watermark, watermark_before);
                }
                break Ok((Some(ending), stop));
            }
            let Some(shell) = self.shell.as_mut() else {
                break Ok((None, stop));
            };
            shell.reserve();
            shell.settle(streamed, last);
            let err_open = err.as_ref().is_some_and(|e| !e.done);
            let sleep = async move {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // Read in place rather than through a pump task: one fewer hop per
                // round trip, and the pipe itself is the backpressure. The bytes
                // land in `pending` itself, not in a buffer to copy from.
                n = shell.stdout.read_buf(&mut shell.pending) => match n {
                    Ok(0) => {
                        capture.push(&std::mem::take(&mut shell.pending))?;
                        break Ok((Some(Ending::Eof), stop));
                    }
                    Ok(n) => {
                        streamed += n as u64;
                        last = n;
                    }
                    Err(e) if OutputGap::of(&e).is_some() => {
                        capture.push(&std::mem::take(&mut shell.pending))?;
                        let why = OutputGap::of(&e).map(|g| g.0.clone()).unwrap_or_default();
                        break Ok((Some(Ending::Gap(why)), stop));
                    }
                    Err(e) => {
                        debug!(session = %self.cfg.name, error = %e, "shell stdout failed");
                        capture.push(&std::mem::take(&mut shell.pending))?;
                        break Ok((Some(Ending::Eof), stop));
                    }
                },
                _ = sleep => {
                    let why = stop.unwrap_or(Stop::Timeout);
                    stop = Some(why);
                    if !self.escalate(stage, why, distrust).await {
                        break Ok((None, stop));
                    }
                    stage += 1;
                    deadline = Some(tokio::time::Instant::now() + self.cfg.grace);
                }
                _ = cancel.cancelled(), if stop.is_none() => {
                    stop = Some(Stop::Interrupt);
                    if !self.escalate(stage, Stop::Interrupt, distrust).await {
                        break Ok((None, stop));
                    }
                    stage += 1;
                    deadline = Some(tokio::time::Instant::now() + self.cfg.grace);
                }
                _ = async {
                    match &err_bell {
                        Some(b) => b.notified().await,
                        None => std::future::pending().await,
                    }
                }, if err_open => {
                    if let Some(e) = err.as_mut() {
                        e.take()?;
                    }
                }
            }
        };
        if let Some(e) = err.as_mut() {
            // The fence was written before the end marker; after any other
            // ending, take what is there.
            let wait = match &ended {
                Ok((Some(Ending::Marker { .. }), _)) => super::stderr::FENCE_WAIT,
                _ => Duration::from_millis(200),
            };
            e.settle(wait).await?;
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap() -> Capture {
        match Capture::new(CaptureLimits::default(), None) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn scan_finds_marker_split_across_chunks() -> Result<()> {
        let (end, cut) = (Pattern::new("abc"), Pattern::new("def"));
        let mut c = cap();
        let mut pending = b"hello \x1eab".to_vec();
        assert!(scan(&mut pending, &[&end, &cut], &mut c)?.is_none());
        pending.extend_from_slice(b"c:0\x1f-\x1f77\x1f9\x1f/tm");
        assert!(scan(&mut pending, &[&end, &cut], &mut c)?.is_none());
        pending.extend_from_slice(b"p:x\x1fy:abc\x1eleft");
        match scan(&mut pending, &[&end, &cut], &mut c)? {
            Some((
                0,
                Ending::Marker {
                    code,
                    cwd,
                    names,
                    journaled,
                    exiting,
                    watermark_before,
                    path_len,
                    defs,
                    cut,
                },
            )) => {
                assert_eq!(code, 0);
                assert!(!journaled);
                assert_eq!(cwd, "/tmp:x\x1fy");
                assert_eq!(path_len, 9);
                assert!(names.is_none() && defs.is_none());
                assert!(!exiting && !cut);
                assert_eq!(watermark_before, 77);
            }
            _ => panic!("no marker"),
        }
        assert_eq!(pending, b"left");
        assert_eq!(c.finish()?.text(), "hello ");
        Ok(())
    }

    #[test]
    fn scan_takes_whichever_nonce_comes_first() -> Result<()> {
        let (end, cut) = (Pattern::new("abc"), Pattern::new("def"));
        let mut c = cap();
        let mut pending =
            b"x\x1edef:1\x1f!-\x1f0\x1f0\x1f/:def\x1e\x1eabc:0\x1f-\x1f0\x1f0\x1f/:abc\x1e"
                .to_vec();
        match scan(&mut pending, &[&end, &cut], &mut c)? {
            Some((
                1,
                Ending::Marker {
                    code: 1,
                    exiting: true,
                    ..
                },
            )) => {}
            _ => panic!("the cut marker comes first"),
        }
        match scan(&mut pending, &[&end, &cut], &mut c)? {
            Some((0, Ending::Marker { code: 0, .. })) => {}
            _ => panic!("then the end marker"),
        }
        Ok(())
    }

    /// The definitions follow the cwd, each part behind the nonce; what a
    /// definition or the cwd holds cannot end a part early, since neither can
    /// hold the nonce.
    #[test]
    fn a_marker_carries_definitions_after_a_snapshot() {
        let body = "0\x1f=f\x1dll\x1f1\x1f0\x1f/a\x1e\x1exyz\x1eabcFf () \n{ \n    echo '\x1exyzA x'\n}\n\x1exyzFnot\x1eabcAalias ll='ls \x1f'\n";
        match parse_marker(body, "abc") {
            Ending::Marker { cwd, defs, .. } => {
                assert_eq!(cwd, "/a\x1e\x1exyz");
                let Some(d) = defs else {
                    panic!("no definitions")
                };
                assert_eq!(
                    d.functions.as_deref(),
                    Some("f () \n{ \n    echo '\x1exyzA x'\n}\n\x1exyzFnot")
                );
                assert_eq!(d.aliases, "alias ll='ls \x1f'\n");
            }
            _ => panic!("no marker"),
        }
        match parse_marker("0\x1f~ll\x1f1\x1f0\x1f/\x1eabcAalias ll='ls'\n", "abc") {
            Ending::Marker { defs, .. } => assert_eq!(
                defs,
                Some(Defs {
                    functions: None,
                    aliases: "alias ll='ls'\n".into()
                })
            ),
            _ => panic!("no marker"),
        }
    }

    #[test]
    fn exports_that_load_code_are_kept_among_the_names_and_no_others() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        match parse_marker(
            "0\x1f~ll\n$PATH\n$LD_PRELOAD\n$HOME\n$BASH_ENV\n\x1f1\x1f0\x1f/",
            "n",
        ) {
            Ending::Marker { names, .. } => assert_eq!(
                names.map(|n| n.aliases),
                Some(set(&["ll", "$LD_PRELOAD", "$BASH_ENV"]))
            ),
            _ => panic!("no marker"),
        }
    }

    #[test]
    fn a_marker_carries_names_after_a_snapshot() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<HashSet<_>>();
        match parse_marker(
            "3\x1f!=hello\n__berth_post\n\x1dll\n\x1f12\x1f4\x1f/a b",
            "n",
        ) {
            Ending::Marker {
                code,
                cwd,
                names,
                exiting,
                ..
            } => {
                assert_eq!(code, 3);
                assert_eq!(cwd, "/a b");
                assert!(exiting);
                assert_eq!(
                    names,
                    Some(Names {
                        functions: Some(set(&["hello"])),
                        aliases: set(&["ll"]),
                    })
                );
            }
            _ => panic!("no marker"),
        }
        match parse_marker("0\x1f=\x1d\x1f1\x1f0\x1f/", "n") {
            Ending::Marker { names, .. } => {
                assert_eq!(names, Some(Names::default().with_functions()))
            }
            _ => panic!("no marker"),
        }
        // A journal record reports no names.
        match parse_marker("0\x1f+\x1f1\x1f0\x1f/", "n") {
            Ending::Marker {
                names, journaled, ..
            } => assert!(names.is_none() && journaled),
            _ => panic!("no marker"),
        }
        // A snapshot without the functions reports the aliases only.
        match parse_marker("0\x1f~ll\nla\n\x1f1\x1f0\x1f/", "n") {
            Ending::Marker { names, .. } => assert_eq!(
                names,
                Some(Names {
                    functions: None,
                    aliases: set(&["ll", "la"]),
                })
            ),
            _ => panic!("no marker"),
        }
    }

    impl Names {
        fn with_functions(mut self) -> Self {
            self.functions.get_or_insert_default();
            self
        }
    }

    #[test]
    fn a_marker_with_another_nonce_is_output() -> Result<()> {
        let mut c = cap();
        let mut pending = b"\x1exyz:0:/:xyz\x1e".to_vec();
        assert!(scan(&mut pending, &[&Pattern::new("abc")], &mut c)?.is_none());
        pending.clear();
        let out = c.finish()?;
        assert!(out.text().contains("xyz:0"));
        Ok(())
    }

    #[test]
    fn snapshot_needs_its_trailer() {
        let good = b"# berth snapshot v1 seq=7\nexport A=1\n# berth snapshot end seq=7\n";
        assert_eq!(parse_snapshot(good).map(|s| s.seq), Some(7));
        let cut = b"# berth snapshot v1 seq=7\nexport A=1\n";
        assert!(parse_snapshot(cut).is_none());
        let wrong = b"# berth snapshot v1 seq=7\n# berth snapshot end seq=6\n";
        assert!(parse_snapshot(wrong).is_none());
        // Rewritten in place over a longer, older one: the stale tail is cut off.
        let stale = b"# berth snapshot v1 seq=9\nexport B=2\n# berth snapshot end seq=9\nexport OLD=1\n# berth snapshot end seq=7\n";
        let snap = parse_snapshot(stale);
        assert_eq!(snap.as_ref().map(|s| s.seq), Some(9));
        assert!(snap.is_some_and(|s| !s.text.contains("OLD")));
        // ... even where the cut splits a UTF-8 sequence of the older one.
        let split =
            b"# berth snapshot v1 seq=9\nexport B=2\n# berth snapshot end seq=9\n\x98\x80x\n";
        assert_eq!(parse_snapshot(split).map(|s| s.seq), Some(9));
        assert!(parse_snapshot(b"\xff\xfe").is_none());
    }

    #[test]
    fn journal_records_of_the_base_are_read_in_order_up_to_a_torn_one() {
        let rec = |b: u64, s: u64, body: &str| {
            format!(
                "# berth journal base={b} seq={s}\n__berth_seq={s}\n{body}# berth journal end seq={s}\n"
            )
        };
        let whole = [
            rec(3, 4, "declare -x OLD='x'\n"),
            rec(7, 8, "declare -x A='1'\n"),
            rec(7, 9, "builtin unset -v B\n"),
        ]
        .concat();
        let (text, last, n) = parse_journal(whole.as_bytes(), 7);
        assert_eq!((last, n), (9, 2));
        assert_eq!(
            text,
            [
                rec(7, 8, "declare -x A='1'\n"),
                rec(7, 9, "builtin unset -v B\n")
            ]
            .concat()
        );
        // A record cut off by a kill ends the journal there.
        let torn = format!("{whole}# berth journal base=7 seq=10\ndeclare -x C=");
        assert_eq!(parse_journal(torn.as_bytes(), 7).1, 9);
        // So does a gap in the sequence.
        let gap = format!("{whole}{}", rec(7, 11, ""));
        assert_eq!(parse_journal(gap.as_bytes(), 7).1, 9);
        // Records of another base are not this snapshot's.
        assert_eq!(parse_journal(whole.as_bytes(), 8), (String::new(), 8, 0));
        assert_eq!(parse_journal(b"", 8), (String::new(), 8, 0));
        assert_eq!(parse_journal(b"garbage\n", 8).2, 0);
    }

    #[test]
    fn a_v3_snapshot_names_its_functions_file() {
        let snap = b"# berth snapshot v3 seq=12 functions=10\nexport A=1\n# berth snapshot end seq=12\nstale";
        let parsed = parse_snapshot(snap);
        assert_eq!(
            parsed.as_ref().map(|s| (s.seq, s.functions)),
            Some((12, Some(10)))
        );
        assert!(parsed.is_some_and(|s| s.text.ends_with("end seq=12\n")));
        let old = b"# berth snapshot v2 seq=3\n# berth snapshot end seq=3\n";
        assert_eq!(parse_snapshot(old).map(|s| s.functions), Some(None));
        // A header that names no functions file is not a v3 snapshot.
        assert!(
            parse_snapshot(b"# berth snapshot v3 seq=4\n# berth snapshot end seq=4\n").is_none()
        );

        let funcs =
            b"# berth functions seq=10\nf () \n{ \n    :\n}\n# berth functions end seq=10\nf () \n";
        let (seq, text) = parse_functions(funcs).unwrap_or_default();
        assert_eq!(seq, 10);
        assert!(text.contains("    :") && text.ends_with("end seq=10\n"));
        assert!(parse_functions(b"# berth functions seq=10\nf () \n").is_none());
        assert!(
            parse_functions(b"# berth functions seq=10\n# berth functions end seq=9\n").is_none()
        );
    }
}
