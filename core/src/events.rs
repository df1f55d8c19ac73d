//! The kinds of event in the event log, one enum: producers name a kind
//! here, consumers match on it, and the store keeps its text
//! ([`EventKind::as_str`]), which is what `berth events --json` shows.

use crate::job_state::JobState;

/// What an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A command was admitted and starts.
    ExecStarted,
    /// A command ended (its exit code is in the event).
    ExecFinished,
    /// A command could not run or its outcome is unknown.
    ExecFailed,
    /// The policy refused a command.
    ExecDenied,
    /// A sandbox was made.
    SandboxCreated,
    /// A sandbox had to be made again (the detail says why).
    SandboxRecreated,
    /// An existing sandbox was attached to.
    SandboxAttached,
    /// A sandbox was removed.
    SandboxRemoved,
    /// An idle sandbox was removed by the reaper.
    SandboxReaped,
    /// A checkpoint of a sandbox was taken.
    CheckpointTaken,
    /// A sandbox was restored to a checkpoint.
    CheckpointRestored,
    /// A background job started.
    JobStarted,
    /// A job reached this state (`job.exited`, `job.killed`, ...).
    Job(JobState),
    /// A job was sent a signal.
    JobSignalled,
    /// A line of a job's output matched a watch pattern.
    JobWatch,
    /// Watch matches past the rate limit were dropped.
    JobWatchDropped,
    /// A command waits for an approval it already has a row for.
    ApprovalWaiting,
    /// A command asked for a person's approval.
    ApprovalRequested,
    /// An approval let the command run.
    ApprovalGranted,
    /// An approval was denied or expired.
    ApprovalRefused,
    /// A person answered an approval.
    ApprovalAnswered,
    /// A tool call started.
    ToolStarted,
    /// A tool call ended.
    ToolFinished,
    /// An agent run stopped (done, paused on an approval, failed...).
    RunEnded,
    /// `berth cp` was admitted and starts copying.
    CopyStarted,
    /// `berth cp` copied everything (files and bytes are in the event).
    CopyFinished,
    /// `berth cp` failed part way or before it began (the detail says why).
    CopyFailed,
    /// A sandbox's connection went through berth's egress proxy (host,
    /// address, port, rule and bytes are in the detail), reported when it ended.
    NetConnect,
    /// berth's egress proxy refused a sandbox's connection (the verdict
    /// names the rule; the detail says why).
    NetRefused,
    /// A kind this berth does not know, as a newer berth wrote it into the
    /// same state directory. Its text is kept, so `berth events` shows and
    /// filters it like any other; see [`EventKind::read`].
    Other(&'static str),
}

impl EventKind {
    /// The kind's text in the store: `exec.started`, `job.exited`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::ExecStarted => "exec.started",
            EventKind::ExecFinished => "exec.finished",
            EventKind::ExecFailed => "exec.failed",
            EventKind::ExecDenied => "exec.denied",
            EventKind::SandboxCreated => "sandbox.created",
            EventKind::SandboxRecreated => "sandbox.recreated",
            EventKind::SandboxAttached => "sandbox.attached",
            EventKind::SandboxRemoved => "sandbox.removed",
            EventKind::SandboxReaped => "sandbox.reaped",
            EventKind::CheckpointTaken => "checkpoint.taken",
            EventKind::CheckpointRestored => "checkpoint.restored",
            EventKind::JobStarted => "job.started",
            EventKind::Job(JobState::Starting) => "job.starting",
            EventKind::Job(JobState::Running) => "job.running",
            EventKind::Job(JobState::Exited) => "job.exited",
            EventKind::Job(JobState::Killed) => "job.killed",
            EventKind::Job(JobState::Lost) => "job.lost",
            EventKind::Job(JobState::Failed) => "job.failed",
            EventKind::Job(JobState::Unknown) => "job.unknown",
            EventKind::JobSignalled => "job.signalled",
            EventKind::JobWatch => "job.watch",
            EventKind::JobWatchDropped => "job.watch.dropped",
            EventKind::ApprovalWaiting => "approval.waiting",
            EventKind::ApprovalRequested => "approval.requested",
            EventKind::ApprovalGranted => "approval.granted",
            EventKind::ApprovalRefused => "approval.refused",
            EventKind::ApprovalAnswered => "approval.answered",
            EventKind::ToolStarted => "tool.started",
            EventKind::ToolFinished => "tool.finished",
            EventKind::RunEnded => "run.ended",
            EventKind::CopyStarted => "copy.started",
            EventKind::CopyFinished => "copy.finished",
            EventKind::CopyFailed => "copy.failed",
            EventKind::NetConnect => "net.connect",
            EventKind::NetRefused => "net.refused",
            EventKind::Other(text) => text,
        }
    }

    /// Every kind, for parsing and for tests.
    pub const ALL: [EventKind; 35] = [
        EventKind::ExecStarted,
        EventKind::ExecFinished,
        EventKind::ExecFailed,
        EventKind::ExecDenied,
        EventKind::SandboxCreated,
        EventKind::SandboxRecreated,
        EventKind::SandboxAttached,
        EventKind::SandboxRemoved,
        EventKind::SandboxReaped,
        EventKind::CheckpointTaken,
        EventKind::CheckpointRestored,
        EventKind::JobStarted,
        EventKind::Job(JobState::Starting),
        EventKind::Job(JobState::Running),
        EventKind::Job(JobState::Exited),
        EventKind::Job(JobState::Killed),
        EventKind::Job(JobState::Lost),
        EventKind::Job(JobState::Failed),
        EventKind::Job(JobState::Unknown),
        EventKind::JobSignalled,
        EventKind::JobWatch,
        EventKind::JobWatchDropped,
        EventKind::ApprovalWaiting,
        EventKind::ApprovalRequested,
        EventKind::ApprovalGranted,
        EventKind::ApprovalRefused,
        EventKind::ApprovalAnswered,
        EventKind::ToolStarted,
        EventKind::ToolFinished,
        EventKind::RunEnded,
        EventKind::CopyStarted,
        EventKind::CopyFinished,
        EventKind::CopyFailed,
        EventKind::NetConnect,
        EventKind::NetRefused,
    ];

    /// The kind a stored text names; `None` for one this berth does not know
    /// (a newer berth wrote it).
    pub fn parse(s: &str) -> Option<EventKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The kind a stored text names, known or not: a text this berth does
    /// not know becomes [`EventKind::Other`], so a row a newer berth wrote
    /// still reads. Unknown texts are interned (leaked once each), which
    /// keeps the kind `Copy` and its text `'static`; they come only from the
    /// user's own state directory, and past [`MAX_OTHER`] distinct ones the
    /// rest read as `other`.
    pub fn read(s: &str) -> EventKind {
        if let Some(k) = Self::parse(s) {
            return k;
        }
        static SEEN: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
        let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = seen.iter().find(|t| **t == s) {
            return EventKind::Other(t);
        }
        if seen.len() >= MAX_OTHER {
            return EventKind::Other("other");
        }
        let t: &'static str = Box::leak(s.to_owned().into_boxed_str());
        seen.push(t);
        EventKind::Other(t)
    }

    /// The event is about a background job.
    pub fn is_job(self) -> bool {
        matches!(
            self,
            EventKind::JobStarted
                | EventKind::Job(_)
                | EventKind::JobSignalled
                | EventKind::JobWatch
                | EventKind::JobWatchDropped
        )
    }
}

/// Distinct unknown kind texts [`EventKind::read`] keeps.
pub const MAX_OTHER: usize = 1024;

impl Default for EventKind {
    /// Only so an [`crate::store::Event`] can be built with `..Default::default()`;
    /// every producer names its kind.
    fn default() -> Self {
        EventKind::Other("")
    }
}

impl serde::Serialize for EventKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for EventKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(EventKind::read(&text))
    }
}

impl rusqlite::ToSql for EventKind {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl rusqlite::types::FromSql for EventKind {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        v.as_str().map(EventKind::read)
    }
}

impl From<EventKind> for String {
    fn from(k: EventKind) -> String {
        k.as_str().to_string()
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_as_itself() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
        }
        let mut names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EventKind::ALL.len());
        assert_eq!(EventKind::parse("job.teleported"), None);
        assert!(EventKind::Job(JobState::Lost).is_job());
        assert!(!EventKind::ExecStarted.is_job());
    }

    #[test]
    fn a_kind_a_newer_berth_wrote_reads_back_as_its_text() -> serde_json::Result<()> {
        let k = EventKind::read("job.teleported");
        assert_eq!(k, EventKind::Other("job.teleported"));
        assert_eq!(k.as_str(), "job.teleported");
        assert!(!k.is_job());
        assert_eq!(EventKind::read("exec.started"), EventKind::ExecStarted);
        let json = serde_json::to_string(&k)?;
        assert_eq!(json, "\"job.teleported\"");
        let back: EventKind = serde_json::from_str(&json)?;
        assert_eq!(back, k);
        Ok(())
    }
}
