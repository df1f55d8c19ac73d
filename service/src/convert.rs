//! Between the runtime's types and `berth.v1`'s, in one place each way.

use berth_core::approvals::{Approval, ApprovalState};
use berth_core::backend::BackendKind;
use berth_core::checkpoint::record::CheckpointRow;
use berth_core::error::Error;
use berth_core::jobs::{Job, JobState};
use tonic::Status;

use crate::proto;

/// The sandbox a call names when it names none.
pub const DEFAULT_SANDBOX: &str = "default";

/// A proto backend as the runtime's kind (unspecified: local, the default).
pub fn backend(b: i32) -> Result<BackendKind, Status> {
    Ok(match proto::Backend::try_from(b) {
        Ok(proto::Backend::Unspecified | proto::Backend::Local) => BackendKind::Local,
        Ok(proto::Backend::Docker) => BackendKind::Docker,
        Ok(proto::Backend::Ssh) => BackendKind::Ssh,
        Ok(proto::Backend::E2b) => BackendKind::E2b,
        Ok(proto::Backend::Modal) => BackendKind::Modal,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "backend {b} is not one berth knows: use BACKEND_LOCAL, BACKEND_DOCKER, BACKEND_SSH, BACKEND_E2B or BACKEND_MODAL"
            )));
        }
    })
}

/// The runtime's kind as the proto enum.
pub fn backend_out(b: BackendKind) -> proto::Backend {
    match b {
        BackendKind::Local => proto::Backend::Local,
        BackendKind::Docker => proto::Backend::Docker,
        BackendKind::Ssh => proto::Backend::Ssh,
        BackendKind::E2b => proto::Backend::E2b,
        BackendKind::Modal => proto::Backend::Modal,
    }
}

/// A backend's name (as rows keep it) as the proto enum.
fn backend_named(name: &str) -> proto::Backend {
    BackendKind::ALL
        .into_iter()
        .find(|k| k.as_str() == name)
        .map_or(proto::Backend::Unspecified, backend_out)
}

/// A reference to sandbox `name` of `backend` (as rows keep it).
pub fn sandbox_ref(backend: &str, name: &str) -> proto::SandboxRef {
    proto::SandboxRef {
        backend: backend_named(backend) as i32,
        name: name.to_string(),
    }
}

/// The backend and name a reference names (unset: the default sandbox on
/// the default backend).
pub fn target(r: Option<&proto::SandboxRef>) -> Result<(BackendKind, String), Status> {
    let (b, name) = r.map_or((0, ""), |r| (r.backend, r.name.as_str()));
    let name = if name.trim().is_empty() {
        DEFAULT_SANDBOX
    } else {
        name
    };
    Ok((backend(b)?, name.to_string()))
}

/// A runtime error as the status a client can act on.
pub fn status(e: Error) -> Status {
    let text = e.full_text();
    match e {
        Error::InvalidInput(_) => Status::invalid_argument(text),
        Error::NotFound { .. } => Status::not_found(text),
        Error::Denied { .. } => Status::permission_denied(text),
        Error::Unsupported(_) => Status::unimplemented(text),
        Error::Unreachable { .. } | Error::SandboxGone { .. } => Status::unavailable(text),
        _ => Status::internal(text),
    }
}

/// An error of the answering path (anyhow) as a status: the runtime's own
/// error keeps its code; anything else is the state refusing the answer.
pub fn status_any(e: anyhow::Error) -> Status {
    match e.downcast::<Error>() {
        Ok(e) => status(e),
        Err(e) => Status::failed_precondition(format!("{e:#}")),
    }
}

pub fn job_state(s: JobState) -> proto::JobState {
    match s {
        JobState::Starting => proto::JobState::JobStarting,
        JobState::Running => proto::JobState::JobRunning,
        JobState::Exited => proto::JobState::JobExited,
        JobState::Killed => proto::JobState::JobKilled,
        JobState::Lost => proto::JobState::JobLost,
        JobState::Failed => proto::JobState::JobFailed,
        JobState::Unknown => proto::JobState::JobUnknown,
    }
}

pub fn job(j: Job) -> proto::Job {
    proto::Job {
        sandbox: Some(sandbox_ref(&j.backend, &j.sandbox)),
        state: job_state(j.state) as i32,
        id: j.id,
        name: j.name,
        command: j.command,
        exit_code: j.exit_code,
        pid: j.pid,
        created_ms: j.created_at,
        ended_ms: j.ended_at,
        reason: j.reason,
        output_bytes: j.out_bytes,
        kill_signal: j.kill_signal,
    }
}

pub fn checkpoint(c: CheckpointRow) -> proto::CheckpointInfo {
    proto::CheckpointInfo {
        sandbox: Some(sandbox_ref(&c.backend, &c.sandbox)),
        id: c.id,
        created_ms: c.created_ms,
        label: c.label,
        files: c.files,
        bytes: c.bytes,
        new_bytes: c.new_bytes,
        took_ms: c.took_ms,
    }
}

/// An approval, its command, part, reason and words redacted with
/// `redact`; `rule_added` is the allow rule an `always` answer wrote, and
/// its file.
pub fn approval(
    a: Approval,
    rule_added: Option<(String, String)>,
    redact: impl Fn(&str) -> String,
) -> proto::Approval {
    let (rule_added, rule_file) = rule_added.unzip();
    proto::Approval {
        argv: a.argv.iter().map(|w| redact(w)).collect(),
        decided_unix: a.decided_unix,
        decided_by: a.decided_by.clone(),
        rule_file,
        sandbox: Some(sandbox_ref(&a.backend, &a.sandbox)),
        id: a.id,
        command: redact(&a.command),
        part: redact(&a.part),
        rule: a.rule,
        reason: redact(&a.reason),
        state: match a.state {
            ApprovalState::Pending => proto::ApprovalState::ApprovalPending,
            ApprovalState::Approved => proto::ApprovalState::ApprovalApproved,
            ApprovalState::Denied => proto::ApprovalState::ApprovalDenied,
            ApprovalState::Expired => proto::ApprovalState::ApprovalExpired,
        } as i32,
        always: a.always,
        created_unix: a.created_unix,
        rule_added,
    }
}

/// A proto signal as the runtime's (unspecified: SIGTERM).
pub fn signal(s: i32) -> Result<berth_core::backend::Signal, Status> {
    use berth_core::backend::Signal;
    Ok(match proto::Signal::try_from(s) {
        Ok(proto::Signal::Unspecified | proto::Signal::Term) => Signal::Term,
        Ok(proto::Signal::Int) => Signal::Int,
        Ok(proto::Signal::Kill) => Signal::Kill,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "signal {s} is not one a job can be sent: use SIGNAL_TERM, SIGNAL_INT or SIGNAL_KILL"
            )));
        }
    })
}

/// A duration in seconds from a call, which must be positive and finite.
pub fn seconds(what: &str, s: Option<f64>) -> Result<Option<std::time::Duration>, Status> {
    match s {
        None => Ok(None),
        Some(t) if t.is_finite() && t > 0.0 => Ok(Some(std::time::Duration::from_secs_f64(t))),
        Some(t) => Err(Status::invalid_argument(format!(
            "{what} must be a positive number of seconds, got {t}; e.g. 30"
        ))),
    }
}
