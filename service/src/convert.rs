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
        Ok(proto::Backend::K8s) => BackendKind::K8s,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "backend {b} is not one berth knows: use BACKEND_LOCAL, BACKEND_DOCKER, BACKEND_SSH, BACKEND_E2B, BACKEND_MODAL or BACKEND_K8S"
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
        BackendKind::K8s => proto::Backend::K8s,
    }
}

/// A reference to sandbox `name` of `backend`.
pub fn sandbox_ref(backend: BackendKind, name: &str) -> proto::SandboxRef {
    proto::SandboxRef {
        backend: backend_out(backend) as i32,
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
        sandbox: Some(sandbox_ref(j.backend, &j.sandbox)),
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
        watch: j.watch,
        pty: j.pty.map(term_size_out),
    }
}

/// A proto job back as the runtime's (for a front end that prints jobs as
/// the runtime's own type does).
pub fn job_row(j: proto::Job) -> Job {
    let (backend, sandbox) = place(j.sandbox);
    Job {
        id: j.id,
        name: j.name,
        backend,
        sandbox,
        command: j.command,
        state: job_state_in(j.state),
        exit_code: j.exit_code,
        pid: j.pid,
        created_at: j.created_ms,
        ended_at: j.ended_ms,
        reason: j.reason,
        watch: j.watch,
        scan_offset: 0,
        out_bytes: j.output_bytes,
        kill_signal: j.kill_signal,
        pty: j.pty.map(|t| term_size_in(Some(t))),
    }
}

/// A proto job state as the runtime's (an unknown number: unknown).
pub fn job_state_in(s: i32) -> JobState {
    match proto::JobState::try_from(s) {
        Ok(proto::JobState::JobStarting) => JobState::Starting,
        Ok(proto::JobState::JobRunning) => JobState::Running,
        Ok(proto::JobState::JobExited) => JobState::Exited,
        Ok(proto::JobState::JobKilled) => JobState::Killed,
        Ok(proto::JobState::JobLost) => JobState::Lost,
        Ok(proto::JobState::JobFailed) => JobState::Failed,
        _ => JobState::Unknown,
    }
}

pub fn term_size_out(t: berth_core::backend::TermSize) -> proto::TermSize {
    proto::TermSize {
        cols: t.cols.into(),
        rows: t.rows.into(),
    }
}

/// A terminal size from a call (unset or 0x0: the default, 80x24); a side
/// past 65535 is refused by [`term_size_checked`].
pub fn term_size_in(t: Option<proto::TermSize>) -> berth_core::backend::TermSize {
    match t {
        Some(t) if t.cols > 0 && t.rows > 0 => berth_core::backend::TermSize {
            cols: u16::try_from(t.cols).unwrap_or(u16::MAX),
            rows: u16::try_from(t.rows).unwrap_or(u16::MAX),
        },
        _ => berth_core::backend::TermSize::default(),
    }
}

/// A terminal size from a call, each side 1 to 65535 (unset or 0x0: the
/// default).
pub fn term_size_checked(
    t: Option<proto::TermSize>,
) -> Result<berth_core::backend::TermSize, Status> {
    if let Some(t) = &t
        && (t.cols > u32::from(u16::MAX)
            || t.rows > u32::from(u16::MAX)
            || (t.cols == 0) != (t.rows == 0))
    {
        return Err(Status::invalid_argument(format!(
            "a terminal of {}x{} cannot be: give both sides between 1 and 65535, e.g. 120x40",
            t.cols, t.rows
        )));
    }
    Ok(term_size_in(t))
}

/// A listing's filter as the service's.
pub fn job_filter(r: &proto::ListJobs) -> Result<crate::service::JobFilter, Status> {
    let mut f = crate::service::JobFilter {
        ended: r.ended,
        ..Default::default()
    };
    if let Some(s) = &r.sandbox {
        let (b, name) = target(Some(s))?;
        f.backend = Some(b);
        f.sandbox = Some(name);
    }
    if r.backend != proto::Backend::Unspecified as i32 {
        f.backend = Some(backend(r.backend)?);
    }
    if let Some(n) = &r.sandbox_name {
        f.sandbox = Some(n.clone());
    }
    for s in &r.states {
        match proto::JobState::try_from(*s) {
            Ok(proto::JobState::Unspecified) | Err(_) => {
                return Err(Status::invalid_argument(format!(
                    "job state {s} is not one to list by: use JOB_STARTING, JOB_RUNNING, JOB_EXITED, JOB_KILLED, JOB_LOST, JOB_FAILED or JOB_UNKNOWN"
                )));
            }
            Ok(_) => f.states.push(job_state_in(*s)),
        }
    }
    Ok(f)
}

pub fn screen(s: berth_core::jobs::pty::Screen) -> proto::TerminalScreen {
    proto::TerminalScreen {
        cols: s.cols.into(),
        rows: s.rows.into(),
        lines: s.lines,
        cursor_row: s.cursor_row.into(),
        cursor_col: s.cursor_col.into(),
        cursor_hidden: s.cursor_hidden,
        alternate_screen: s.alternate_screen,
        offset: s.offset,
    }
}

pub fn screen_row(s: proto::TerminalScreen) -> berth_core::jobs::pty::Screen {
    let n = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
    berth_core::jobs::pty::Screen {
        cols: n(s.cols),
        rows: n(s.rows),
        lines: s.lines,
        cursor_row: n(s.cursor_row),
        cursor_col: n(s.cursor_col),
        cursor_hidden: s.cursor_hidden,
        alternate_screen: s.alternate_screen,
        offset: s.offset,
    }
}

pub fn checkpoint(c: CheckpointRow) -> proto::CheckpointInfo {
    proto::CheckpointInfo {
        sandbox: Some(sandbox_ref(c.backend, &c.sandbox)),
        id: c.id,
        created_ms: c.created_ms,
        label: c.label,
        files: c.files,
        bytes: c.bytes,
        new_bytes: c.new_bytes,
        took_ms: c.took_ms,
        changed: c.changed,
        skipped: c.skipped,
        run_id: c.run_id,
        step: c.step,
        origin: c.origin,
        outside_workspace: None,
    }
}

/// A proto checkpoint back as the store's row.
pub fn checkpoint_row(c: proto::CheckpointInfo) -> CheckpointRow {
    let (backend, sandbox) = place(c.sandbox);
    CheckpointRow {
        id: c.id,
        backend,
        sandbox,
        created_ms: c.created_ms,
        label: c.label,
        run_id: c.run_id,
        step: c.step,
        files: c.files,
        bytes: c.bytes,
        changed: c.changed,
        new_bytes: c.new_bytes,
        took_ms: c.took_ms,
        skipped: c.skipped,
        origin: c.origin,
    }
}

/// A reference's backend and sandbox name, for a row a front end prints.
/// Unset is the default backend, as in a call. A number this build does
/// not know cannot come: the client's handshake replaces a server of
/// another version before any call.
pub fn place(r: Option<proto::SandboxRef>) -> (BackendKind, String) {
    r.map_or_else(Default::default, |r| {
        (backend(r.backend).unwrap_or_default(), r.name)
    })
}

/// A listed sandbox as the API carries it.
pub fn sandbox_status(s: berth_core::runtime::SandboxStatus) -> proto::Sandbox {
    proto::Sandbox {
        sandbox: Some(sandbox_ref(s.backend, &s.name)),
        workdir: String::new(),
        created: false,
        recreated: None,
        state: s.state,
        created_at_ms: s.created_at,
        last_used_ms: s.last_used,
        id: s.id,
        orphan: s.orphan,
        pool_member: None,
    }
}

/// A proto listing's sandbox back as the runtime's.
pub fn sandbox_status_row(s: proto::Sandbox) -> berth_core::runtime::SandboxStatus {
    let (backend, name) = place(s.sandbox);
    berth_core::runtime::SandboxStatus {
        backend,
        name,
        state: s.state,
        id: s.id,
        created_at: s.created_at_ms,
        last_used: s.last_used_ms,
        orphan: s.orphan,
    }
}

/// A sandbox's settings as shown: the environment by name only.
pub fn settings(spec: &berth_core::backend::SandboxSpec) -> proto::SandboxSettings {
    proto::SandboxSettings {
        image: spec.image.clone(),
        network: spec.network.is_open(),
        network_rules: spec.network.rules().map(|r| proto::NetworkRules {
            allow: r.allow.clone(),
            deny: r.deny.clone(),
        }),
        memory_mb: spec.limits.memory_mb,
        milli_cpu: spec.limits.milli_cpu,
        pids: spec.limits.pids,
        options: spec.options.clone().into_iter().collect(),
        env_names: spec.env.keys().cloned().collect(),
    }
}

/// An inspection as the API carries it.
pub fn inspection(
    backend: BackendKind,
    name: &str,
    i: crate::service::Inspection,
) -> proto::SandboxDetail {
    proto::SandboxDetail {
        sandbox: Some(sandbox_ref(backend, name)),
        record: i.record.as_ref().map(settings),
        state: i.state,
        id: i.id,
        #[cfg(feature = "docker")]
        container: i.container.map(container),
        #[cfg(not(feature = "docker"))]
        container: None,
        differences: i.differences,
    }
}

#[cfg(feature = "docker")]
fn container(f: berth_backends::docker::inspect::ContainerFacts) -> proto::Container {
    let s = f.settings;
    proto::Container {
        daemon: f.daemon,
        name: f.container,
        id: f.id,
        state: f.state,
        settings: Some(proto::ContainerSettings {
            network: s.network,
            memory_mb: s.memory_mb,
            milli_cpu: s.milli_cpu,
            pids: s.pids,
            user: s.user,
            read_only: s.read_only,
            cap_add: s.cap_add,
            image: s.image,
        }),
        size_rw: f.size_rw,
        size_root_fs: f.size_root_fs,
        volumes: f.volumes,
        workspace_bytes: f.workspace_bytes,
    }
}

pub fn idle(i: berth_core::reaper::Idle) -> proto::IdleSandbox {
    proto::IdleSandbox {
        sandbox: Some(sandbox_ref(i.backend, &i.name)),
        idle_secs: i.idle_secs,
        lifetime_secs: i.lifetime_secs,
        removed: i.removed,
        error: i.error,
    }
}

pub fn idle_row(i: proto::IdleSandbox) -> berth_core::reaper::Idle {
    let (backend, name) = place(i.sandbox);
    berth_core::reaper::Idle {
        backend,
        name,
        idle_secs: i.idle_secs,
        lifetime_secs: i.lifetime_secs,
        removed: i.removed,
        error: i.error,
    }
}

pub fn collected(c: crate::service::Collected) -> proto::Collected {
    proto::Collected {
        checkpoints: c
            .checkpoints
            .into_iter()
            .map(|p| proto::CheckpointsPruned {
                sandbox: p.sandbox,
                checkpoints: p.checkpoints as i64,
                packs: p.packs as i64,
                error: p.error,
            })
            .collect(),
        removed: c.removed,
        removed_volumes: c.removed_volumes,
        kept: c.kept as u64,
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
        sandbox: Some(sandbox_ref(a.backend, &a.sandbox)),
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

/// An event as the API carries it: its detail text as a structured value
/// (text that is not JSON, as a string).
pub fn event(e: berth_core::store::Event) -> proto::Event {
    let detail = e.detail.map(|d| match serde_json::from_str(&d) {
        Ok(v) => value(v),
        Err(_) => value(serde_json::Value::String(d)),
    });
    proto::Event {
        id: e.id,
        ts_ms: e.ts_ms,
        kind: e.kind.as_str().to_string(),
        call_id: e.call_id,
        backend: e.backend.map_or(proto::Backend::Unspecified, backend_out) as i32,
        sandbox: e.sandbox,
        session: e.session,
        command: e.command,
        verdict: e.verdict,
        exit_code: e.exit_code,
        duration_ms: e.duration_ms,
        bytes_out: e.bytes_out,
        detail,
    }
}

/// A JSON value as protobuf's `Value`.
pub fn value(v: serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    let kind = match v {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        J::String(s) => Kind::StringValue(s),
        J::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.into_iter().map(value).collect(),
        }),
        J::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o.into_iter().map(|(k, v)| (k, value(v))).collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

/// Protobuf's `Value` as JSON (a number with no fraction as an integer).
pub fn json(v: &prost_types::Value) -> serde_json::Value {
    use prost_types::value::Kind;
    use serde_json::Value as J;
    match &v.kind {
        None | Some(Kind::NullValue(_)) => J::Null,
        Some(Kind::BoolValue(b)) => J::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                J::from(*n as i64)
            } else {
                serde_json::Number::from_f64(*n).map_or(J::Null, J::Number)
            }
        }
        Some(Kind::StringValue(s)) => J::String(s.clone()),
        Some(Kind::ListValue(l)) => J::Array(l.values.iter().map(json).collect()),
        Some(Kind::StructValue(s)) => {
            J::Object(s.fields.iter().map(|(k, v)| (k.clone(), json(v))).collect())
        }
    }
}

/// A proto event back as the store's row (its detail as JSON text, or the
/// text itself where it was not JSON), for a front end that prints rows.
pub fn event_row(e: proto::Event) -> berth_core::store::Event {
    let backend = match proto::Backend::try_from(e.backend) {
        Ok(proto::Backend::Unspecified) | Err(_) => None,
        Ok(_) => backend(e.backend).ok(),
    };
    berth_core::store::Event {
        id: e.id,
        ts_ms: e.ts_ms,
        kind: berth_core::events::EventKind::read(&e.kind),
        call_id: e.call_id,
        backend,
        sandbox: e.sandbox,
        session: e.session,
        command: e.command,
        verdict: e.verdict,
        exit_code: e.exit_code,
        duration_ms: e.duration_ms,
        bytes_out: e.bytes_out,
        detail: e.detail.map(|d| match json(&d) {
            serde_json::Value::String(s) => s,
            v => v.to_string(),
        }),
    }
}

/// A sandbox's network from the API's two fields: rules, when given, make
/// it berth's egress proxy; else the flag says open or off.
pub fn network(open: bool, rules: Option<proto::NetworkRules>) -> berth_core::backend::Network {
    use berth_core::backend::{NetRules, Network};
    match rules {
        Some(r) => Network::Allow(NetRules {
            allow: r.allow,
            deny: r.deny,
        }),
        None if open => Network::Open,
        None => Network::Off,
    }
}

/// A pool as the API shows it.
pub fn pool(p: berth_core::runtime::PoolStatus) -> proto::Pool {
    let spec = p.row.spec;
    proto::Pool {
        name: p.row.name,
        backend: backend_out(p.row.backend) as i32,
        size: p.row.size,
        ready: p.ready,
        making: p.making,
        image: spec.image,
        network: spec.network.is_open(),
        memory_mb: spec.limits.memory_mb,
        milli_cpu: spec.limits.milli_cpu,
        pids: spec.limits.pids,
        options: spec.options.into_iter().collect(),
        created_at_ms: p.row.created_at,
    }
}
