//! How a background job stands. Its own module, below both [`crate::jobs`]
//! (which moves a job through the states) and [`crate::events`] (whose
//! `job.<state>` kinds name them), so neither of those imports the other.

use serde::{Deserialize, Serialize};

/// How a job stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Its row is written; it is being launched.
    Starting,
    /// It runs.
    Running,
    /// It ended by itself; see the exit code.
    Exited,
    /// berth killed it.
    Killed,
    /// It is gone without a recorded status (its sandbox vanished, or it was killed
    /// from outside before its wrapper could write one).
    Lost,
    /// It could not be started.
    Failed,
    /// berth could not check on it (its sandbox's host did not answer, or
    /// could not be reached as the call stood): it may still run. The next
    /// look checks again; `lost` is only for a job berth saw gone.
    Unknown,
}

impl JobState {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Starting => "starting",
            JobState::Running => "running",
            JobState::Exited => "exited",
            JobState::Killed => "killed",
            JobState::Lost => "lost",
            JobState::Failed => "failed",
            JobState::Unknown => "unknown",
        }
    }

    /// The state a stored text names; an unknown one reads as `lost`.
    pub(crate) fn parse(s: &str) -> JobState {
        match s {
            "starting" => JobState::Starting,
            "running" => JobState::Running,
            "exited" => JobState::Exited,
            "killed" => JobState::Killed,
            "failed" => JobState::Failed,
            "unknown" => JobState::Unknown,
            _ => JobState::Lost,
        }
    }

    /// True once the job can change no more.
    pub fn is_final(self) -> bool {
        !matches!(
            self,
            JobState::Starting | JobState::Running | JobState::Unknown
        )
    }
}
