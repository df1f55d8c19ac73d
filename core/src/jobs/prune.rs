//! `job prune`: forget jobs that have ended, and their files in the sandbox.

use super::*;

impl Runtime {
    /// Forget the ended jobs among `jobs` (exited, killed, failed, lost):
    /// their rows go, and their directories (output, status) go from their
    /// sandboxes where those can still be reached (a removed sandbox took
    /// them with it). A job still running is left alone. Returns the jobs
    /// forgotten.
    pub async fn prune_jobs(&self, jobs: Vec<Job>) -> Result<Vec<Job>> {
        let mut gone = Vec::new();
        for job in jobs.into_iter().filter(|j| j.state.is_final()) {
            if let Ok(sb) = self.attach(job.backend, &job.sandbox).await {
                let dir = job.dir(sb.as_ref());
                let args = argv(&["rm", "-rf", "--", &dir]);
                if let Err(e) = run_to_end(sb.as_ref(), &args, None, 4096, HELPER_TIMEOUT).await {
                    tracing::debug!(job = %job.id, error = %e, "removing a pruned job's files");
                }
            }
            self.store().delete_job(&job.id)?;
            gone.push(job);
        }
        Ok(gone)
    }
}
