//! Watching jobs from outside: a refresh asks the sandbox how each unfinished
//! job stands, turns transitions into events, and scans new output for the
//! job's watch patterns; `wait_job` waits for a job's end.

use std::time::Duration;

use super::*;

impl Runtime {
    pub(super) async fn refresh_group(
        &self,
        backend: BackendKind,
        sandbox: &str,
        jobs: Vec<Job>,
    ) -> Result<()> {
        let checked = async {
            let sb = self.attach(backend, sandbox).await?;
            let base = format!("{}/jobs", sb.layout().berth_dir);
            let ids: Vec<String> = jobs.iter().map(|j| j.id.clone()).collect();
            let text = if sb.host_processes() {
                here::status(std::path::Path::new(&base), &ids, &sb.sandbox_procs())
            } else {
                let mut args = argv(&["bash", "-c", script::STATUS, "berth-status", &base]);
                args.extend(ids);
                let c = run_to_end(sb.as_ref(), &args, None, 1 << 20, HELPER_TIMEOUT).await?;
                String::from_utf8_lossy(&c.stdout).into_owned()
            };
            Ok::<_, Error>((sb, text))
        };
        let (sb, text) = match checked.await {
            Ok(found) => found,
            // The sandbox is gone (removed, or seen missing): so are its jobs.
            Err(e)
                if e.is_sandbox_gone()
                    || matches!(
                        e,
                        Error::NotFound {
                            what: "sandbox",
                            ..
                        }
                    ) =>
            {
                for mut j in jobs {
                    self.end_job(
                        &mut j,
                        JobState::Lost,
                        None,
                        Some(format!("its sandbox is gone: {}", e.full_text())),
                    )?;
                }
                return Ok(());
            }
            // Not checked (a host that does not answer): it may still run,
            // and the next look checks again.
            Err(e) => {
                // One still starting keeps its launch's grace.
                for mut j in jobs.into_iter().filter(|j| j.state != JobState::Starting) {
                    j.state = JobState::Unknown;
                    j.reason = Some(format!(
                        "berth could not check on it, so it may still run: {}",
                        e.full_text()
                    ));
                    self.store().note_reach(&j)?;
                }
                return Ok(());
            }
        };
        for mut job in jobs {
            let line = text
                .lines()
                .find(|l| l.split(' ').next() == Some(job.id.as_str()));
            let fields: Vec<&str> = line.map(|l| l.split(' ').collect()).unwrap_or_default();
            let (state, status, size) = match fields.as_slice() {
                [_, st, status, size] => (*st, *status, *size),
                _ => ("missing", "-", "-"),
            };
            if let Ok(n) = size.parse::<i64>() {
                job.out_bytes = n;
            }
            if job.state == JobState::Unknown {
                // Checked again: what follows is what berth saw.
                job.state = JobState::Running;
                job.reason = None;
                self.store().note_reach(&job)?;
            }
            if !job.watch.is_empty() {
                self.scan_watch(sb.as_ref(), &mut job, state != "running")
                    .await?;
            }
            match state {
                "running" => {
                    if job.state == JobState::Starting {
                        job.state = JobState::Running;
                    }
                    self.store().save_job(&job)?;
                }
                "exited" => {
                    let code = status.parse::<i64>().ok();
                    let killed = job.kill_signal.is_some() && code.is_some_and(|c| c > 128);
                    let st = if killed {
                        JobState::Killed
                    } else {
                        JobState::Exited
                    };
                    self.end_job(&mut job, st, code, None)?;
                }
                // Its launcher has saved the row but not yet started the wrapper
                // (it may be waiting for the sandbox's session): still starting.
                "missing" | "unlaunched"
                    if job.state == JobState::Starting
                        && now_ms() - job.created_at < LAUNCH_GRACE.as_millis() as i64 => {}
                "missing" | "unlaunched" if job.state == JobState::Starting => {
                    self.end_job(
                        &mut job,
                        JobState::Lost,
                        None,
                        Some("its launch never finished (berth stopped while starting it?)".into()),
                    )?;
                }
                // berth signalled it: a kill that also took its wrapper (a
                // SIGKILL to the group, or a wrapper that could not fork to
                // write the status while a fork bomb held the user's process
                // limit) is still berth's kill, not a loss.
                "lost" | "unlaunched" if job.kill_signal.is_some() => {
                    let lost = "its wrapper ended with it, before it could record an exit status";
                    let why = match job.reason.take() {
                        Some(r) => format!("{r}; {lost}"),
                        None => lost.to_string(),
                    };
                    self.end_job(&mut job, JobState::Killed, None, Some(why))?;
                }
                "lost" | "unlaunched" => {
                    self.end_job(
                        &mut job,
                        JobState::Lost,
                        None,
                        Some("its process is gone and no exit status was recorded (killed from outside, or the sandbox restarted)".into()),
                    )?;
                }
                _ => {
                    self.end_job(
                        &mut job,
                        JobState::Lost,
                        None,
                        Some("its directory is gone from the sandbox (the sandbox was recreated or wiped)".into()),
                    )?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn end_job(
        &self,
        job: &mut Job,
        state: JobState,
        code: Option<i64>,
        reason: Option<String>,
    ) -> Result<()> {
        job.state = state;
        job.exit_code = code;
        // A kill's own account (an escalation to SIGKILL) outlives the ending.
        if reason.is_some() || state != JobState::Killed {
            job.reason = reason;
        }
        job.ended_at = Some(now_ms());
        if !self.store().save_job(job)? {
            // Another waiter recorded this ending first, with its event.
            return Ok(());
        }
        self.job_event(job, EventKind::Job(state), None)
    }

    /// Scan output past `scan_offset` for the job's watch patterns and record
    /// matches as events, at most a few per refresh; the rest are counted.
    ///
    /// Each chunk's matches are recorded in the transaction that moves the
    /// job's scan offset past it, and only if no other refresh moved it
    /// first (`record_scan` in the jobs store): the server's watcher, a
    /// restarted server catching up, a `job wait` and an `events --follow`
    /// may all refresh one job at once, and each match is recorded once. A
    /// match's `offset` (where its line starts in the output) names it.
    pub(super) async fn scan_watch(
        &self,
        sb: &dyn Sandbox,
        job: &mut Job,
        ended: bool,
    ) -> Result<()> {
        let patterns: Vec<Regex> = job
            .watch
            .iter()
            .filter_map(|w| Regex::new(w).ok())
            .collect();
        let file = crate::session::script::quote(&format!("{}/out", job.dir(sb)));
        let mut recorded = 0usize;
        let mut dropped = 0usize;
        // Names this refresh's scan, so a reader can check the limit per refresh.
        let window = job.scan_offset;
        loop {
            let from = job.scan_offset;
            let cmd = format!(
                "tail -c +{} -- {file} 2>/dev/null | head -c {SCAN_CHUNK}",
                from + 1
            );
            let data = run_to_end(
                sb,
                &argv(&["bash", "-c", &cmd]),
                None,
                SCAN_CHUNK,
                HELPER_TIMEOUT,
            )
            .await?
            .stdout;
            let full = data.len() >= SCAN_CHUNK;
            // Whole lines only while the job runs: a partial line is scanned once complete.
            let usable = match memchr::memrchr(b'\n', &data) {
                _ if ended => data.len(),
                Some(i) => i + 1,
                None if full => data.len(),
                None => 0,
            };
            if usable == 0 {
                break;
            }
            let (mut found, mut lost) = (Vec::new(), 0usize);
            let mut at = from;
            for line in data[..usable].split(|b| *b == b'\n') {
                let line_at = at;
                at += line.len() as i64 + 1;
                let text = String::from_utf8_lossy(line);
                let Some(src) = patterns
                    .iter()
                    .zip(&job.watch)
                    .find(|(re, _)| re.is_match(&text))
                    .map(|(_, s)| s)
                else {
                    continue;
                };
                if recorded + found.len() < WATCH_EVENTS_PER_REFRESH {
                    let shown: String = text.chars().take(500).collect();
                    found.push(self.job_event_of(
                        job,
                        EventKind::JobWatch,
                        Some(serde_json::json!({
                            "pattern": src, "line": shown, "window": window, "offset": line_at,
                        })),
                    ));
                } else {
                    lost += 1;
                }
            }
            let to = from + usable as i64;
            if !self.store().record_scan(&job.id, from, to, &found)? {
                // Another refresh scanned this output: its matches are its to record.
                job.scan_offset = self.store().scan_offset(&job.id)?.max(from);
                break;
            }
            recorded += found.len();
            dropped += lost;
            job.scan_offset = to;
            if !full {
                break;
            }
        }
        if dropped > 0 {
            self.job_event(
                job,
                EventKind::JobWatchDropped,
                Some(serde_json::json!({
                    "dropped": dropped,
                    "limit": WATCH_EVENTS_PER_REFRESH,
                    "window": window,
                })),
            )?;
        }
        Ok(())
    }

    /// Wait for a job to end, up to `timeout`. Returns the job as it then stands.
    pub async fn wait_job(&self, id: &str, timeout: Option<Duration>) -> Result<Job> {
        let job = self.job(id).await?;
        if job.state.is_final() {
            return Ok(job);
        }
        let wait = async {
            let mut pause = Duration::from_millis(50);
            loop {
                let sb = self.attach(job.backend, &job.sandbox).await?;
                let args = argv(&[
                    "bash",
                    "-c",
                    script::WAIT,
                    "berth-wait",
                    &job.dir(sb.as_ref()),
                ]);
                run_to_end(
                    sb.as_ref(),
                    &args,
                    None,
                    4096,
                    Duration::from_secs(u32::MAX as u64),
                )
                .await?;
                let now = self.job(&job.id).await?;
                if now.state.is_final() {
                    return Ok(now);
                }
                // Still starting: the waiter found no job to wait on yet. Try
                // again once the launch has had a moment.
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        };
        match timeout {
            Some(t) => match tokio::time::timeout(t, wait).await {
                Ok(r) => r,
                Err(_) => self.job(&job.id).await,
            },
            None => wait.await,
        }
    }
}
