//! Input to a running job: bytes to its stdin, key presses and resizes of a
//! terminal job, and the screen its terminal shows.

use super::*;

impl Runtime {
    /// Write to a job's stdin, and optionally close it.
    pub async fn send_job(&self, id: &str, data: &[u8], eof: bool) -> Result<()> {
        let job = self.job(id).await?;
        if job.state.is_final() {
            return Err(Error::InvalidInput(format!(
                "job {} has {} ({}); there is no stdin to write to",
                job.id,
                job.state.as_str(),
                job.exit_code
                    .map(|c| format!("exit {c}"))
                    .unwrap_or_else(|| "no exit code".into())
            )));
        }
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let dir = job.dir(sb.as_ref());
        if !data.is_empty() {
            let cmd = format!(
                "exec timeout 10 cat > {}/in",
                crate::session::script::quote(&dir)
            );
            let c = run_to_end(
                sb.as_ref(),
                &argv(&["bash", "-c", &cmd]),
                Some(data),
                4096,
                HELPER_TIMEOUT,
            )
            .await?;
            if c.status.code != Some(0) {
                return Err(Error::backend(
                    sb.kind().as_str(),
                    BackendFailure::Rejected,
                    format!(
                        "could not write to job {}'s stdin (is it still reading?)",
                        job.id
                    ),
                ));
            }
        }
        if eof && sb.host_processes() {
            // berth stops the holder itself, once it knows the pid in the
            // job's `holder` file is the sandbox's (see `here`).
            let base = format!("{}/jobs", sb.layout().berth_dir);
            let stopped = here::signal_one(
                std::path::Path::new(&base),
                &job.id,
                "holder",
                &sb.sandbox_procs(),
                nix::sys::signal::Signal::SIGTERM,
            );
            // Stopped by the job's wrapper when the job ended (a job that
            // read what was sent and exited): its stdin is closed already,
            // or will be within moments (the wrapper's stop is in flight).
            let gone = || here::gone(std::path::Path::new(&base), &job.id, "holder");
            let mut closed = stopped || gone();
            for _ in 0..50 {
                if closed {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                closed = gone();
            }
            if !closed {
                return Err(Error::backend(
                    sb.kind().as_str(),
                    BackendFailure::Rejected,
                    format!("could not close job {}'s stdin (already closed?)", job.id),
                ));
            }
        } else if eof {
            let args = argv(&["bash", "-c", script::EOF, "berth-eof", &dir]);
            let c = run_to_end(sb.as_ref(), &args, None, 4096, HELPER_TIMEOUT).await?;
            if c.status.code != Some(0) {
                return Err(Error::backend(
                    sb.kind().as_str(),
                    BackendFailure::Rejected,
                    format!("could not close job {}'s stdin (already closed?)", job.id),
                ));
            }
        }
        Ok(())
    }

    /// A terminal job, or an error that says it is not one.
    pub(super) async fn pty_job(&self, id: &str) -> Result<(Job, TermSize)> {
        let job = self.job(id).await?;
        let size = terminal_of(&job)?;
        Ok((job, size))
    }

    /// Write key presses (by name: `Enter`, `C-c`, `Up`, ...) to a job.
    pub async fn send_keys<S: AsRef<str>>(&self, id: &str, keys: &[S]) -> Result<usize> {
        if keys.is_empty() {
            return Err(Error::InvalidInput(
                "no keys to send: name at least one, e.g. `Enter` or `C-c`".into(),
            ));
        }
        self.send_input(id, b"", keys, false).await
    }

    /// Write `text`, then key presses by name, to a job's stdin, and close it
    /// after with `eof`. The keys are the bytes the job's input expects
    /// ([`pty::keys_bytes_for`]): `Enter` is `\r` on a terminal job, `\n`
    /// on a job that reads a pipe. Returns the bytes written.
    pub async fn send_input<S: AsRef<str>>(
        &self,
        id: &str,
        text: &[u8],
        keys: &[S],
        eof: bool,
    ) -> Result<usize> {
        let job = self.store().job(id)?;
        let mut bytes = text.to_vec();
        bytes.extend(pty::keys_bytes_for(keys, job.pty.is_some())?);
        self.send_job(&job.id, &bytes, eof).await?;
        Ok(bytes.len())
    }

    /// Change a terminal job's size; its program gets SIGWINCH.
    pub async fn resize_job(&self, id: &str, size: TermSize) -> Result<()> {
        let (job, _) = self.pty_job(id).await?;
        self.resize_fresh(&job, size).await
    }

    /// [`Runtime::resize_job`] for a job just brought up to date
    /// ([`Runtime::job`]): `berth attach` looks its job up once, not once per
    /// step (each look at a running job asks its sandbox).
    pub async fn resize_fresh(&self, job: &Job, size: TermSize) -> Result<()> {
        terminal_of(job)?;
        job.still_running("its terminal is gone")?;
        let sb = self.attach(job.backend, &job.sandbox).await?;
        if sb.host_processes() {
            self.resize_here(sb.as_ref(), job, size).await?;
            self.store().note_pty(&job.id, size)?;
            return Ok(());
        }
        let args = argv(&[
            "bash",
            "-c",
            script::RESIZE,
            "berth-resize",
            &job.dir(sb.as_ref()),
            &size.cols.to_string(),
            &size.rows.to_string(),
        ]);
        let c = run_to_end(sb.as_ref(), &args, None, 4096, HELPER_TIMEOUT).await?;
        if c.status.code != Some(0) {
            return Err(Error::backend(
                sb.kind().as_str(),
                BackendFailure::Rejected,
                format!(
                    "could not resize job {}'s terminal: {}",
                    job.id,
                    String::from_utf8_lossy(&c.stderr).trim()
                ),
            ));
        }
        self.store().note_pty(&job.id, size)?;
        Ok(())
    }

    /// [`script::RESIZE`]'s steps from berth's own process, for a sandbox
    /// whose processes are berth's: a helper there may signal only its own
    /// tree, and the resizer is the job's. The size goes to `winsize`, the
    /// resizer (known to be the sandbox's) gets SIGUSR1, and its
    /// acknowledgement in `resized` is awaited.
    async fn resize_here(&self, sb: &dyn Sandbox, job: &Job, size: TermSize) -> Result<()> {
        let base = format!("{}/jobs", sb.layout().berth_dir);
        let base = std::path::Path::new(&base);
        let dir = job.dir(sb);
        let resizer = std::path::PathBuf::from(format!("{}/resizer", job.id));
        // A job started a moment ago may not have started its resizer yet.
        for _ in 0..100 {
            if crate::procs::read_small(base, &resizer).is_some_and(|s| !s.trim().is_empty()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let seq = format!(
            "{}.{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        let line = format!("{seq} {} {}\n", size.cols, size.rows);
        sb.write_file(&format!("{dir}/winsize"), line.as_bytes(), 0o600)
            .await?;
        let gone = || {
            Error::backend(
                sb.kind().as_str(),
                BackendFailure::Rejected,
                format!(
                    "could not resize job {}'s terminal: the job's terminal is gone",
                    job.id
                ),
            )
        };
        if !here::signal_one(
            base,
            &job.id,
            "resizer",
            &sb.sandbox_procs(),
            nix::sys::signal::Signal::SIGUSR1,
        ) {
            return Err(gone());
        }
        let ack = std::path::PathBuf::from(format!("{}/resized", job.id));
        for _ in 0..250 {
            if crate::procs::read_small(base, &ack).is_some_and(|s| s.trim() == seq) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Error::backend(
            sb.kind().as_str(),
            BackendFailure::Timeout,
            format!(
                "could not resize job {}'s terminal: it did not take the new size within 5s",
                job.id
            ),
        ))
    }

    /// A terminal emulator fed with a terminal job's output so far (its last
    /// [`SCREEN_TAIL`] bytes at most: a screen depends on recent output only,
    /// and a program that draws full screens redraws them whole).
    pub async fn job_emulator(&self, id: &str) -> Result<(Job, pty::Emulator)> {
        let (job, _) = self.pty_job(id).await?;
        self.emulator_fresh(job).await
    }

    /// [`Runtime::job_emulator`] for a job just brought up to date.
    pub async fn emulator_fresh(&self, job: Job) -> Result<(Job, pty::Emulator)> {
        terminal_of(&job)?;
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let sizes = sb
            .read_file(&format!("{}/sizes", job.dir(sb.as_ref())), 1 << 20)
            .await
            .unwrap_or_default();
        let start = (job.out_bytes.max(0) as u64).saturating_sub(SCREEN_TAIL);
        let mut emu = pty::Emulator::new(pty::parse_sizes(&String::from_utf8_lossy(&sizes)), start);
        let mut sink = |b: &[u8]| emu.feed(b);
        self.job_logs(&job.id, start, false, &mut sink).await?;
        Ok((job, emu))
    }

    /// The screen of a terminal job, as a terminal showing it would look now.
    pub async fn job_screen(&self, id: &str) -> Result<pty::Screen> {
        Ok(self.job_emulator(id).await?.1.screen())
    }

    /// A stream into a job's stdin that stays open (`berth attach`'s keys),
    /// rather than one helper per write as [`Runtime::send_job`] does.
    pub async fn job_input(&self, id: &str) -> Result<JobInput> {
        let job = self.job(id).await?;
        self.input_fresh(&job).await
    }

    /// [`Runtime::job_input`] for a job just brought up to date.
    pub async fn input_fresh(&self, job: &Job) -> Result<JobInput> {
        job.still_running("there is no stdin to write to")?;
        let sb = self.attach(job.backend, &job.sandbox).await?;
        let cmd = format!(
            "exec cat > {}/in",
            crate::session::script::quote(&job.dir(sb.as_ref()))
        );
        let opts = SpawnOpts {
            helper: true,
            ..SpawnOpts::default()
        };
        let mut process = sb.spawn(&argv(&["bash", "-c", &cmd]), opts).await?;
        let stdin = process.take_stdin().ok_or_else(|| {
            Error::backend(
                sb.kind().as_str(),
                BackendFailure::Protocol,
                "the input helper has no stdin",
            )
        })?;
        Ok(JobInput {
            stdin,
            _process: process,
        })
    }
}

/// A job's terminal size, or an error that says it is not on a terminal.
fn terminal_of(job: &Job) -> Result<TermSize> {
    match job.pty {
        Some(size) => Ok(size),
        None => Err(Error::InvalidInput(format!(
            "job {} is not on a terminal; start it with `berth job start --pty -- COMMAND` \
             for a screen, keys and resizes (its output is in `berth job logs {}`)",
            job.id, job.id
        ))),
    }
}

/// The last output a screen is rendered from.
pub const SCREEN_TAIL: u64 = 4 << 20;

/// An open stdin of a job: write to `stdin`; dropping it closes the helper.
pub struct JobInput {
    /// Bytes written here reach the job's stdin (its terminal, for a terminal job).
    pub stdin: crate::backend::BoxWrite,
    _process: Box<dyn crate::backend::Process>,
}

impl Job {
    /// An error naming how the job ended and `what` that means, once it has.
    fn still_running(&self, what: &str) -> Result<()> {
        if !self.state.is_final() {
            return Ok(());
        }
        Err(Error::InvalidInput(format!(
            "job {} has {}; {what}",
            self.id,
            self.state.as_str()
        )))
    }
}
