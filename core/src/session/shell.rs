//! The shell's lifecycle: starting one, restoring it from its newest snapshot,
//! and replacing or reaping it when it dies. Also the local-only spin read, the
//! one `unsafe` read of a shell's stdout (see [`SPIN`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tracing::{debug, warn};

use super::framing::{Names, SnapshotFile, parse_functions, parse_journal, parse_snapshot};
use super::script::{self, SnapshotMode};
use super::{
    BULK, BULK_READ, DID_NOT_EXIT, READ_BUF, SETTLE, SNAPSHOT_LIMIT, SPIN, STARTUP_DEADLINE,
    Session, ShellInfo,
};
use crate::backend::{BoxWrite, Process, SpawnOpts};
use crate::error::{Error, Result};

pub(super) struct Shell {
    pub(super) process: Box<dyn Process>,
    pub(super) stdin: BoxWrite,
    pub(super) stdout: crate::backend::BoxRead,
    /// `stdout`'s raw non-blocking descriptor, for a local shell: see [`SPIN`].
    pub(super) spin_fd: Option<std::os::fd::RawFd>,
    /// Bytes read but not yet attributed to a command. Output is read
    /// straight into its spare room (see [`Shell::reserve`]), not copied in.
    pub(super) pending: Vec<u8>,
    /// The shell's own stderr as its reader hands it on (see [`super::stderr::ErrFeed`]).
    pub(super) stderr_feed: Arc<Mutex<super::stderr::ErrFeed>>,
    /// Rung for each piece of stderr, and when it ends.
    pub(super) stderr_bell: Arc<tokio::sync::Notify>,
    /// The task collecting stderr; done once the shell's stderr is closed.
    pub(super) stderr_reader: Option<tokio::task::JoinHandle<()>>,
    pub(super) info: ShellInfo,
    /// The shell's function and alias names as of its last snapshot; `None` until
    /// it first reports them, and until then every command snapshots.
    pub(super) names: Option<HashSet<String>>,
    /// The two parts of `names`: a snapshot without the functions reports
    /// only the aliases.
    pub(super) function_names: HashSet<String>,
    pub(super) alias_names: HashSet<String>,
    /// What the shell's functions and aliases are, as its end markers carried
    /// them (`declare -f`, `alias -p`): the policy gate's view. `None` when
    /// unknown (before the first snapshot, or after one a command's forged
    /// or cut marker reported), which makes every session name opaque.
    pub(super) function_defs: Option<String>,
    pub(super) alias_defs: Option<String>,
    /// A command set up something (a trap) that can change state at any time:
    /// every command snapshots from then on.
    pub(super) always_snapshot: bool,
    /// Journal records the shell appended since its last whole snapshot (see
    /// [`script::JOURNAL_MAX`]).
    pub(super) journal_len: usize,
    /// The shell's watermark (time and pid), from its last end marker (see `KILL_TREE`).
    pub(super) watermark: u64,
    /// When berth sent the running (or last) command; `None` before the
    /// first. A process outside the shell's session that is older is not
    /// the command's (see `tree::Tree::adopted_since`).
    pub(super) command_sent: Option<std::time::Instant>,
    /// The shell's children when the command was sent, where the sandbox's
    /// processes are berth's: orphans of earlier commands and jobs that the
    /// shell (a child subreaper) adopted, which a stop must leave alone even
    /// when they started a moment before the command (the start times of
    /// `/proc` count in ticks of 10 ms).
    pub(super) children_before: Vec<i32>,
    /// cwd and the length of `PATH` from the last end marker, and as of the last
    /// snapshot. When they differ after a command that skipped its snapshot, the
    /// engine asks for one: a backstop behind the reading of command texts.
    pub(super) last_place: (String, u64),
    pub(super) saved_place: Option<(String, u64)>,
    /// The link to the shell broke and was re-attached: output of a lost
    /// command may still be on its way, so the next command first sends an
    /// empty one and drops everything up to its marker.
    pub(super) resync: bool,
}

impl Shell {
    /// Take the names a marker reported; `names` is their union.
    pub(super) fn learn_names(&mut self, n: &Names) {
        let mut changed = self.names.is_none();
        if let Some(f) = &n.functions
            && *f != self.function_names
        {
            self.function_names = f.clone();
            changed = true;
        }
        if n.aliases != self.alias_names {
            self.alias_names = n.aliases.clone();
            changed = true;
        }
        if changed {
            let all = self.function_names.union(&self.alias_names).cloned();
            self.names = Some(all.collect());
        }
    }

    /// Take the definitions an end marker carried.
    pub(super) fn learn_defs(&mut self, d: super::framing::Defs) {
        if let Some(f) = d.functions {
            self.function_defs = Some(f);
        }
        self.alias_defs = Some(d.aliases);
    }

    /// The definitions are unknown until the next snapshot.
    pub(super) fn forget_defs(&mut self) {
        self.function_defs = None;
        self.alias_defs = None;
    }

    /// The definitions as shell text, functions first (a function's body was
    /// read before the aliases it might name); what is unknown is left out,
    /// so its names stay opaque.
    pub(super) fn defs_text(&self) -> String {
        let mut out = String::new();
        for part in [&self.function_defs, &self.alias_defs]
            .into_iter()
            .flatten()
        {
            out.push_str(part);
            out.push('\n');
        }
        out
    }

    /// Poll a local shell's stdout without waiting, for up to [`SPIN`], until the
    /// end marker is in `pending`, the output ends, or time is up. Whatever it
    /// reads lands in `pending` for the normal read loop to attribute.
    pub(super) fn spin(&mut self, end_pat: &[u8]) {
        let Some(fd) = self.spin_fd else {
            return;
        };
        let until = Instant::now() + SPIN;
        loop {
            self.reserve();
            let len = self.pending.len();
            let spare = self.pending.spare_capacity_mut();
            // SAFETY: `fd` belongs to `self.stdout`, which is alive for as long as
            // `self` is; it is non-blocking (checked when the shell started), so
            // this read returns at once; `spare` is valid for `spare.len()` bytes.
            let n = unsafe { libc::read(fd, spare.as_mut_ptr().cast(), spare.len()) };
            match usize::try_from(n) {
                Ok(0) => return,
                Ok(n) => {
                    // SAFETY: the read initialised the `n` bytes after `len`.
                    unsafe { self.pending.set_len(len + n) };
                    // Only the new bytes, and a marker they may complete.
                    let from = len.saturating_sub(end_pat.len().saturating_sub(1));
                    if memchr::memmem::find(&self.pending[from..], end_pat).is_some() {
                        return;
                    }
                }
                Err(_) => {
                    let e = std::io::Error::last_os_error();
                    if e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::Interrupted
                    {
                        return;
                    }
                }
            }
            if Instant::now() >= until {
                return;
            }
            // Let the shell run, should it share this CPU.
            std::thread::yield_now();
        }
    }
}

impl Shell {
    /// Let a local shell's pipe fill before the next read, once a command has
    /// streamed [`BULK`] bytes and the last read found less than
    /// [`BULK_READ`]: the reader is keeping pace with the writer, and would
    /// otherwise wake for each of its small writes (4-8 KiB for most tools),
    /// each wake-up and pass of the capture costing microseconds that the
    /// writer's own processes want on a small machine. [`SETTLE`] lets about
    /// 400 KiB gather at 1.4 GB/s, within the pipe's 1 MiB, so the writer
    /// never waits. Like [`Shell::spin`], a short blocking wait in place of a
    /// timer: tokio's timers count milliseconds, and a millisecond's pause
    /// fills the pipe and stalls the writer.
    pub(super) fn settle(&self, streamed: u64, last_read: usize) {
        if self.spin_fd.is_some() && streamed > BULK && last_read < BULK_READ {
            std::thread::sleep(SETTLE);
        }
    }

    /// Make room in `pending` for one read of [`READ_BUF`] bytes. Its memory
    /// is kept across commands, so this allocates once per shell.
    pub(super) fn reserve(&mut self) {
        self.pending.reserve(READ_BUF);
    }
}

/// Whether a descriptor is in non-blocking mode.
pub(super) fn is_nonblocking(fd: std::os::fd::RawFd) -> bool {
    // SAFETY: F_GETFL only reads the descriptor's flags; an invalid descriptor
    // yields -1, which reads as "no".
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

impl Session {
    /// Start a shell if there is none, restored from the last snapshot, within
    /// `limit`. A snapshot the shell cannot replay within it is set aside: a
    /// clean shell starts instead, and says so.
    pub(super) async fn ensure_shell(&mut self, limit: Duration) -> Result<()> {
        if self.shell.is_some() {
            return Ok(());
        }
        let until = Instant::now() + limit;
        self.reap_cut_off().await?;
        self.start_shell(limit).await?;
        let Some((seq, text)) = self.newest_snapshot(limit).await else {
            return Ok(());
        };
        let left = until.saturating_duration_since(Instant::now());
        match self.replay(seq, &text, left).await {
            Ok(()) => Ok(()),
            Err(e) => {
                warn!(session = %self.cfg.name, seq, error = %e, "could not restore snapshot");
                self.drop_shell().await;
                self.notices.push(format!(
                    "snapshot {seq} could not be restored ({e}); the session started from a clean shell"
                ));
                let left = until.saturating_duration_since(Instant::now());
                self.start_shell(left.max(Duration::from_secs(1))).await?;
                // Carry on the sequence, so the next snapshot supersedes the bad one.
                self.internal(
                    &format!("__berth_seq={seq}"),
                    SnapshotMode::Never,
                    STARTUP_DEADLINE,
                )
                .await?;
                Ok(())
            }
        }
    }

    /// Spawn a shell, send it the loop, and learn its pid and session id.
    pub(super) async fn start_shell(&mut self, limit: Duration) -> Result<()> {
        let layout = self.sandbox.layout().clone();
        let argv: Vec<String> = ["bash", "--noprofile", "--norc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut process = self
            .sandbox
            .spawn(
                &argv,
                SpawnOpts {
                    env: self.cfg.env.clone(),
                    cwd: Some(layout.workdir.clone()),
                    helper: false,
                    replaces: Some(format!("berth-shell:{}", self.cfg.name)),
                    ..SpawnOpts::default()
                },
            )
            .await?;
        let spin_fd = process.stdout_fd().filter(|fd| is_nonblocking(*fd));
        let (stdin, stdout, stderr) = match (
            process.take_stdin(),
            process.take_stdout(),
            process.take_stderr(),
        ) {
            (Some(i), Some(o), e) => (i, o, e),
            _ => {
                let _ = process.terminate().await;
                return Err(self.session_error("the backend gave the shell no stdin or stdout"));
            }
        };
        let stderr_feed = Arc::new(Mutex::new(super::stderr::ErrFeed::default()));
        let stderr_bell = Arc::new(tokio::sync::Notify::new());
        let stderr_reader = stderr.map(|err| {
            tokio::spawn(super::stderr::keep_tail(
                err,
                stderr_feed.clone(),
                stderr_bell.clone(),
                self.cfg.name.clone(),
            ))
        });
        let mut shell = Shell {
            process,
            stdin,
            stdout,
            spin_fd,
            pending: Vec::new(),
            stderr_feed,
            stderr_bell,
            stderr_reader,
            info: ShellInfo {
                pid: 0,
                sid: 0,
                restored_seq: None,
            },
            names: None,
            function_names: HashSet::new(),
            alias_names: HashSet::new(),
            function_defs: None,
            alias_defs: None,
            always_snapshot: false,
            journal_len: 0,
            watermark: 0,
            command_sent: None,
            children_before: Vec::new(),
            last_place: Default::default(),
            saved_place: None,
            resync: false,
        };
        let boot = script::bootstrap(
            self.cfg.dir.as_deref().unwrap_or(&layout.berth_dir),
            &layout.workdir,
        );
        if let Err(e) = shell.stdin.write_all(boot.as_bytes()).await {
            // It died at once: its stderr says why (say, the sandbox wrapper's refusal).
            if let Some(reader) = shell.stderr_reader.take() {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
            }
            let said = shell
                .stderr_feed
                .lock()
                .map(|f| String::from_utf8_lossy(&f.tail).trim().to_string())
                .unwrap_or_default();
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            };
            return Err(self.session_error(&format!("could not start the shell: {e}{said}")));
        }
        self.shell = Some(shell);

        let hello = self
            .internal(script::HELLO, SnapshotMode::Never, limit)
            .await?;
        let mut parts = hello.split_whitespace().map(str::parse::<u32>);
        let (pid, sid) = match (parts.next(), parts.next()) {
            (Some(Ok(p)), Some(Ok(s))) => (p, s),
            _ => {
                self.drop_shell().await;
                return Err(
                    self.session_error(&format!("the shell's handshake was garbled ({hello:?})"))
                );
            }
        };
        if let Some(sh) = self.shell.as_mut() {
            sh.info.pid = pid;
            sh.info.sid = sid;
        }
        if pid != sid {
            debug!(session = %self.cfg.name, pid, sid, "shell is not a session leader; tree kills use descent only");
        }
        Ok(())
    }

    /// The newest intact snapshot in the sandbox, if any, with the functions it
    /// goes with in front (functions before aliases: a function's body was
    /// read before the aliases it might name) and the journal records written
    /// after it, and the sequence of the last of those. Each read is bounded by
    /// `limit`: the files live where commands can replace them (by a FIFO, say).
    pub(super) async fn newest_snapshot(&mut self, limit: Duration) -> Option<(u64, String)> {
        let mut best: Option<(u8, SnapshotFile)> = None;
        for slot in 0..2 {
            let Some(data) = self.read_state_file(&format!("snap.{slot}"), limit).await else {
                continue;
            };
            match parse_snapshot(&data) {
                Some(snap) => {
                    if best.as_ref().is_none_or(|(_, b)| snap.seq > b.seq) {
                        best = Some((slot, snap));
                    }
                }
                None => self.discard_corrupt(slot, "snapshot", "snap"),
            }
        }
        let (slot, best) = best?;
        let text = match best.functions.filter(|&f| f > 0) {
            None => best.text,
            Some(wanted) => match self.functions_file(wanted, limit).await {
                Some(functions) => functions + &best.text,
                None => {
                    warn!(session = %self.cfg.name, seq = best.seq, functions = wanted, "the snapshot's functions are missing");
                    self.notices.push(format!(
                        "the shell's functions (written with snapshot {wanted}) could not be found; its variables, cwd and aliases were restored without them"
                    ));
                    best.text
                }
            },
        };
        Some(self.with_journal(best.seq, slot, text, limit).await)
    }

    /// The functions file with sequence `wanted`.
    async fn functions_file(&mut self, wanted: u64, limit: Duration) -> Option<String> {
        for slot in 0..2 {
            let Some(data) = self.read_state_file(&format!("defs.{slot}"), limit).await else {
                continue;
            };
            match parse_functions(&data) {
                Some((seq, functions)) if seq == wanted => return Some(functions),
                Some(_) => {}
                None => self.discard_corrupt(slot, "functions file", "defs"),
            }
        }
        None
    }

    /// `text`, the snapshot `base` from `slot`, with the journal records written
    /// after it put in before its aliases (an alias must not reach into a
    /// record's lines), and the shell's own counters: the next whole snapshot
    /// goes to the other slot, so a write cut short leaves this one. Returns
    /// the last record's sequence, or `base`.
    async fn with_journal(
        &mut self,
        base: u64,
        slot: u8,
        text: String,
        limit: Duration,
    ) -> (u64, String) {
        let (records, last, count) = match self.read_state_file("journal", limit).await {
            Some(data) => parse_journal(&data, base),
            None => (String::new(), base, 0),
        };
        if count > 0 {
            debug!(session = %self.cfg.name, base, last, count, "journal records follow the snapshot");
        }
        let counters = format!("__berth_sb={slot} __berth_base={base}\n");
        let at = text
            .find("\n# berth aliases\n")
            .map(|i| i + 1)
            .unwrap_or(text.len());
        let mut out = String::with_capacity(text.len() + records.len() + counters.len());
        out.push_str(&text[..at]);
        out.push_str(&records);
        out.push_str(&counters);
        out.push_str(&text[at..]);
        (last, out)
    }

    /// One of berth's files in the session's directory in the sandbox, or
    /// `None` (with a notice) when it cannot be read within `limit`.
    async fn read_state_file(&mut self, name: &str, limit: Duration) -> Option<Vec<u8>> {
        let path = format!("{}/{name}", self.state_dir());
        let read = self.sandbox.read_file(&path, SNAPSHOT_LIMIT);
        match tokio::time::timeout(limit, read).await {
            Ok(Ok(d)) => Some(d),
            Ok(Err(Error::NotFound { .. })) => None,
            Err(_) => {
                warn!(session = %self.cfg.name, %path, "reading a snapshot timed out");
                self.notices.push(format!(
                    "snapshot {path} could not be read within {}s; ignored",
                    limit.as_secs_f64()
                ));
                None
            }
            Ok(Err(e)) => {
                warn!(session = %self.cfg.name, %path, error = %e, "cannot read snapshot");
                self.notices
                    .push(format!("snapshot {path} could not be read ({e}); ignored"));
                None
            }
        }
    }

    fn discard_corrupt(&mut self, slot: u8, what: &str, stem: &str) {
        let path = format!("{}/{stem}.{slot}", self.state_dir());
        warn!(session = %self.cfg.name, %path, "discarding corrupt {what}");
        self.notices.push(format!(
            "{what} {path} is corrupt or incomplete and was discarded"
        ));
    }

    /// Replay a snapshot into the new shell.
    /// The text comes from files commands in the sandbox can edit, and no
    /// gate judges it: only text that restores state is replayed.
    pub(super) async fn replay(&mut self, seq: u64, text: &str, limit: Duration) -> Result<()> {
        let replay = script::strip_own(text);
        if let Err(what) = crate::gate::reading(&replay, || {
            berth_policies::shell::declarations_only(&replay)
        }) {
            warn!(session = %self.cfg.name, seq, %what, "a snapshot holds more than state");
            return Err(self.session_error(&format!(
                "it holds {what}, which no snapshot berth writes holds: it was changed from inside the sandbox, so it was not replayed"
            )));
        }
        let out = self.internal(&replay, SnapshotMode::Force, limit).await?;
        debug!(session = %self.cfg.name, seq, output = %out, "restored snapshot");
        if let Some(sh) = self.shell.as_mut() {
            sh.info.restored_seq = Some(seq);
        }
        self.restored = Some(seq);
        Ok(())
    }

    /// Kill the shell itself and forget it.
    pub(super) async fn replace_shell(&mut self) {
        // A local shell is berth's own child, ended by `drop_shell` below.
        if let Some(shell) = self
            .shell
            .as_ref()
            .filter(|_| !self.sandbox.host_processes())
        {
            let argv = vec![
                "kill".to_string(),
                "-KILL".to_string(),
                shell.info.pid.to_string(),
            ];
            if let Err(e) = self.run_helper(&argv).await {
                debug!(session = %self.cfg.name, error = %e, "could not kill the shell in-band");
            }
        }
        self.drop_shell().await;
    }

    pub(super) async fn drop_shell(&mut self) {
        if let Some(mut shell) = self.shell.take() {
            let _ = shell.process.terminate().await;
            let _ = tokio::time::timeout(Duration::from_secs(2), shell.process.wait()).await;
        }
    }

    /// The shell's stdout ended (or it said it exits): collect how it ended
    /// and forget it.
    pub(super) async fn reap_dead_shell(&mut self) -> Result<String> {
        let Some(mut shell) = self.shell.take() else {
            return Ok("unknown status".into());
        };
        Ok(
            match tokio::time::timeout(Duration::from_secs(5), shell.process.wait()).await {
                Ok(Ok(st)) => match (st.code, st.signal) {
                    (Some(c), _) => format!("exit code {c}"),
                    (None, Some(s)) => format!("killed by signal {s}"),
                    _ => "unknown status".into(),
                },
                Ok(Err(e @ Error::Unreachable { .. })) => return Err(e),
                Ok(Err(e)) => format!("status unknown: {e}"),
                Err(_) => {
                    let _ = shell.process.terminate().await;
                    DID_NOT_EXIT.into()
                }
            },
        )
    }

    /// After a re-attached link, drop what the lost command still writes:
    /// an empty command's marker ends it. A lost command that still runs is
    /// stopped when `limit` passes, as any command would be.
    pub(super) async fn resync(&mut self, limit: Duration) -> Result<()> {
        if !self.shell.as_ref().is_some_and(|s| s.resync) {
            return Ok(());
        }
        let dropped = self.internal(":", SnapshotMode::Never, limit).await?;
        debug!(session = %self.cfg.name, dropped = dropped.len(), "resynchronised a re-attached shell");
        if let Some(sh) = self.shell.as_mut() {
            sh.resync = false;
        }
        self.notices.push(
            "the link to the shell broke and was re-attached; the shell kept its state".into(),
        );
        Ok(())
    }
}
