//! The backend seam: the three narrow traits every transport implements.
//!
//! Flow at a glance:
//! - [`Backend::provision`] turns a [`SandboxSpec`] into a live [`Sandbox`],
//!   creating it or re-attaching to the one that already carries the name.
//! - [`Sandbox::spawn`] starts a [`Process`] inside it, with piped stdio.
//! - Everything else (sessions, jobs, snapshots, tree kills) is built once in
//!   core on top of `spawn`, `read_file` and `write_file`.
//!
//! Backends know nothing of sessions, policies or the store.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{BackendFailure, Error, Result};

/// A boxed byte source: a process's stdout or stderr.
pub type BoxRead = Pin<Box<dyn AsyncRead + Send>>;
/// A boxed byte sink: a process's stdin.
pub type BoxWrite = Pin<Box<dyn AsyncWrite + Send>>;

/// Resource limits applied to a sandbox where the backend can enforce them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory ceiling in MiB.
    pub memory_mb: Option<u64>,
    /// CPU quota in thousandths of a core.
    pub milli_cpu: Option<u64>,
    /// Maximum number of processes.
    pub pids: Option<u64>,
}

/// What a caller asks for when it wants a sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The sandbox's name, unique per backend. It is the handle for re-attaching.
    pub name: String,
    /// Image or template, where the backend has such a thing.
    pub image: Option<String>,
    /// Environment given to every process in the sandbox. Already filtered by
    /// policy: nothing of berth's own environment reaches here unless allow-listed.
    pub env: BTreeMap<String, String>,
    /// Where the sandbox's connections may go.
    pub network: Network,
    /// Resource limits.
    pub limits: Limits,
    /// Backend-specific settings (for example `host` for ssh, `read_only` for docker).
    pub options: BTreeMap<String, String>,
    /// Where the sandbox's egress proxy listens on the host, when its
    /// network is [`Network::Allow`]: a directory holding `proxy.sock`,
    /// which the backend puts in the sandbox as its one door out. Filled in
    /// by the runtime for each provision, never stored.
    #[serde(skip)]
    pub door: Option<std::path::PathBuf>,
    /// Variables the runtime gives a sandbox with a door beyond
    /// [`door_env`]: each credential's placeholder (the proxy holds the
    /// value). Filled in by the runtime, never stored.
    #[serde(skip)]
    pub door_env: Vec<(String, String)>,
    /// The `--network allow:` rules as the platform's own allow-list, for
    /// a backend that holds them itself ([`Backend::native_allow_list`]).
    /// Filled in by the runtime, never stored.
    #[serde(skip)]
    pub allow_list: Option<berth_policies::egress::AllowList>,
}

/// The name of the egress proxy's socket in [`SandboxSpec::door`].
pub const DOOR_SOCKET: &str = "proxy.sock";
/// Where a sandbox with a door reaches it: the relay inside the sandbox.
pub const DOOR_RELAY: &str = "127.0.0.1:3128";

/// The certificates a sandbox with a door trusts, in the door directory:
/// the roots berth's proxy trusts and the sandbox's own CA (which signs
/// what the sandbox is shown for a host carrying a credential).
pub const DOOR_BUNDLE: &str = "ca-bundle.pem";

/// The variables that send a sandbox's programs through its door (both
/// cases: curl reads `http_proxy` only in lower case, others upper case),
/// and those that have them trust `bundle` (the sandbox's path of
/// [`DOOR_BUNDLE`]): OpenSSL, curl, Python's requests, pip, git, Node.
pub fn door_env(bundle: &str) -> Vec<(String, String)> {
    let url = format!("http://{DOOR_RELAY}");
    let mut out: Vec<(String, String)> = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"]
        .iter()
        .flat_map(|k| {
            [
                (k.to_string(), url.clone()),
                (k.to_lowercase(), url.clone()),
            ]
        })
        .collect();
    out.extend(
        [
            "SSL_CERT_FILE",
            "CURL_CA_BUNDLE",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "GIT_SSL_CAINFO",
            "NODE_EXTRA_CA_CERTS",
        ]
        .iter()
        .map(|k| (k.to_string(), bundle.to_string())),
    );
    out
}

/// Where a sandbox's connections may go. A setting of the sandbox: clone,
/// recreate and restart keep it.
///
/// Stored as `false` (off), `true` (open) or `{"allow": [...], "deny":
/// [...]}`, so a row an older berth wrote (a bool) reads back as it meant.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "NetworkRow", into = "NetworkRow")]
pub enum Network {
    /// No network at all.
    #[default]
    Off,
    /// The host's network, unfiltered.
    Open,
    /// No route of its own: one door, berth's egress proxy, which lets
    /// through what these rules allow and refuses the rest.
    Allow(NetRules),
}

/// The rules of a [`Network::Allow`] sandbox, as written (`pypi.org`,
/// `*.github.com`, `10.1.2.3:5432`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetRules {
    /// Hosts let through.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Hosts refused, before any allow rule is read.
    #[serde(default)]
    pub deny: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum NetworkRow {
    Flag(bool),
    Rules(NetRules),
}

impl From<NetworkRow> for Network {
    fn from(r: NetworkRow) -> Self {
        match r {
            NetworkRow::Flag(false) => Network::Off,
            NetworkRow::Flag(true) => Network::Open,
            NetworkRow::Rules(r) => Network::Allow(r),
        }
    }
}

impl From<Network> for NetworkRow {
    fn from(n: Network) -> Self {
        match n {
            Network::Off => NetworkRow::Flag(false),
            Network::Open => NetworkRow::Flag(true),
            Network::Allow(r) => NetworkRow::Rules(r),
        }
    }
}

impl Network {
    /// Read `--network`'s text: `off`, `on` (or `open`), `allow:HOST,HOST…`.
    /// Each host is checked as a rule here, so a typo fails at create, not
    /// at the first connection.
    pub fn parse(text: &str) -> std::result::Result<Network, String> {
        let e = berth_policies::egress::Egress::parse_flag(text)?;
        Ok(match e.mode {
            berth_policies::egress::Mode::Off => Network::Off,
            berth_policies::egress::Mode::Open => Network::Open,
            berth_policies::egress::Mode::Allow => Network::Allow(NetRules {
                allow: e.allow.iter().map(|r| r.text().to_string()).collect(),
                deny: Vec::new(),
            }),
        })
    }

    /// Its mode, as the egress policy names them.
    pub fn mode(&self) -> berth_policies::egress::Mode {
        use berth_policies::egress::Mode;
        match self {
            Network::Off => Mode::Off,
            Network::Open => Mode::Open,
            Network::Allow(_) => Mode::Allow,
        }
    }

    /// True when the sandbox reaches anything at all.
    pub fn any(&self) -> bool {
        !matches!(self, Network::Off)
    }

    /// True when the sandbox has the host's network unfiltered.
    pub fn is_open(&self) -> bool {
        matches!(self, Network::Open)
    }

    /// The rules, when the sandbox's way out is berth's proxy.
    pub fn rules(&self) -> Option<&NetRules> {
        match self {
            Network::Allow(r) => Some(r),
            _ => None,
        }
    }

    /// The policy its proxy judges by (`None` unless [`Network::Allow`]).
    /// A rule that no longer reads (written by a newer berth) is an error
    /// naming it.
    pub fn egress(&self) -> std::result::Result<Option<berth_policies::egress::Egress>, String> {
        use berth_policies::egress::{Egress, Mode, Rule};
        let Some(r) = self.rules() else {
            return Ok(None);
        };
        let read = |list: &[String]| -> std::result::Result<Vec<Rule>, String> {
            list.iter().map(|t| Rule::parse(t)).collect()
        };
        Ok(Some(Egress {
            mode: Mode::Allow,
            allow: read(&r.allow)?,
            deny: read(&r.deny)?,
            ask: false,
        }))
    }
}

impl std::fmt::Display for Network {
    /// As `--network` takes it (`off`, `on`, `allow:a,b`), with `deny:` rules after.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Network::Off => f.write_str("off"),
            Network::Open => f.write_str("on"),
            Network::Allow(r) => {
                write!(f, "allow:{}", r.allow.join(","))?;
                if !r.deny.is_empty() {
                    write!(f, " deny:{}", r.deny.join(","))?;
                }
                Ok(())
            }
        }
    }
}

impl SandboxSpec {
    /// A spec with just a name and default settings.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ..Self::default()
        }
    }

    /// A backend option, if set.
    pub fn option(&self, key: &str) -> Option<&str> {
        self.options.get(key).map(String::as_str)
    }
}

/// Where things live inside a sandbox, as paths the sandbox's own shell understands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The workspace: the session's first cwd.
    pub workdir: String,
    /// berth's private directory inside the sandbox: snapshots, job logs, stdin files.
    /// It must survive whatever the sandbox survives (a container recreation, a reconnect).
    pub berth_dir: String,
}

impl Layout {
    /// `path` in the sandbox: an absolute path as it is, a relative one under
    /// the workspace. Text only: what the path names is the backend's to
    /// check (the local backend opens it beneath its root).
    pub fn resolve(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.workdir)
        }
    }
}

/// `path` made absolute against `base` (a directory in the sandbox) with
/// `.` and `..` applied as text, the way the file tools and `berth cp` name
/// what a policy's file rules judge. `..` at the root stays at the root.
pub fn normalize_path(base: &str, path: &str) -> String {
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", base.trim_end_matches('/'))
    };
    let mut parts: Vec<&str> = Vec::new();
    for p in joined.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The backends berth knows, by name: what `--backend` takes and what the
/// store records. A build may leave some out (`berth_backends::available`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The kernel-restricted local shell: the default backend.
    #[default]
    Local,
    /// A remote host over SSH.
    Ssh,
    /// A Docker container.
    Docker,
    /// An E2B cloud sandbox.
    E2b,
    /// A Modal sandbox.
    Modal,
    /// A pod on a Kubernetes cluster (an agent-sandbox `Sandbox` where its
    /// CRDs are installed).
    K8s,
}

impl BackendKind {
    /// Every kind, in the order berth lists them.
    pub const ALL: [BackendKind; 6] = [
        BackendKind::Local,
        BackendKind::Ssh,
        BackendKind::Docker,
        BackendKind::E2b,
        BackendKind::Modal,
        BackendKind::K8s,
    ];

    /// Its name: `local`, `ssh`, `docker`, `e2b`, `modal`, `k8s`.
    pub const fn as_str(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Ssh => "ssh",
            BackendKind::Docker => "docker",
            BackendKind::E2b => "e2b",
            BackendKind::Modal => "modal",
            BackendKind::K8s => "k8s",
        }
    }

    /// The kind called `name`, if berth knows one.
    pub fn parse(name: &str) -> Option<BackendKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// The kind called `name`, or the error every front end shows for a
    /// name it was given: `unknown backend `x`; berth has: local, ssh, …`.
    pub fn named(name: &str) -> std::result::Result<BackendKind, String> {
        Self::parse(name)
            .ok_or_else(|| format!("unknown backend `{name}`; berth has: {}", Self::names()))
    }

    /// Every kind's name, comma separated, for messages.
    pub fn names() -> String {
        Self::ALL.map(BackendKind::as_str).join(", ")
    }
}

/// A stored backend name this berth does not know: a newer berth, with a
/// backend this one lacks, wrote the row into the same state directory.
#[derive(Debug)]
pub struct UnknownBackend(pub String);

impl std::fmt::Display for UnknownBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the state names backend '{}', which this berth ({}) does not know \
             (it knows {}); a newer berth wrote it: run that one",
            self.0,
            env!("CARGO_PKG_VERSION"),
            BackendKind::names()
        )
    }
}

impl std::error::Error for UnknownBackend {}

impl rusqlite::ToSql for BackendKind {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl rusqlite::types::FromSql for BackendKind {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let name = v.as_str()?;
        BackendKind::parse(name).ok_or_else(|| {
            rusqlite::types::FromSqlError::Other(Box::new(UnknownBackend(name.to_string())))
        })
    }
}

impl std::fmt::Display for BackendKind {
    /// Its name, padded as the format asks (`{:<8}` in a table).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The result of [`Backend::provision`].
pub struct Provisioned {
    /// The live sandbox.
    pub sandbox: Arc<dyn Sandbox>,
    /// True when nothing carried this name before.
    pub created: bool,
    /// Set when an existing sandbox had to be recreated, with the reason.
    pub recreated: Option<String>,
}

/// One sandbox as [`Backend::list`] finds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxInfo {
    /// The sandbox's name.
    pub name: String,
    /// The backend's own id (container id, host, directory).
    pub id: String,
    /// A short state word: running, exited, stopped, missing.
    pub state: String,
    /// Unix seconds when it was created, where known.
    pub created_unix: Option<i64>,
}

/// Options for [`Backend::remove`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RemoveOpts {
    /// Also delete durable data (volumes, workspaces).
    pub volumes: bool,
}

/// A kind of sandbox transport: local, docker, ssh, modal, e2b.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The backend: its name is what `--backend` takes.
    fn kind(&self) -> BackendKind;

    /// Create the sandbox, or re-attach to the one with this name. Idempotent.
    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned>;

    /// berth's sandboxes on this backend, found by their labels.
    async fn list(&self) -> Result<Vec<SandboxInfo>>;

    /// Tear down the named sandbox, whatever state it is in.
    async fn remove(&self, name: &str, opts: RemoveOpts) -> Result<()>;

    /// Write into `spec` the settings of this call that belong to the
    /// sandbox (ssh: the host and how to reach it, given as `--host`, `-J`,
    /// `-i`, ...) where it has none, and those `stored` (the sandbox's
    /// record, when it exists) holds, so a sandbox keeps them for every
    /// later call. A setting given two ways that differ (the call's, the
    /// spec's own, the record's) is an error that names them: such settings
    /// are part of the sandbox. Returns whether `spec` changed. Backends
    /// whose sandboxes take nothing from the call leave it as it is.
    fn settle_spec(&self, spec: &mut SandboxSpec, stored: Option<&SandboxSpec>) -> Result<bool> {
        let _ = (spec, stored);
        Ok(false)
    }

    /// Whether this backend puts [`SandboxSpec::door`] in a sandbox as its
    /// only way out (`--network allow:`). `Err` says, for a person, why
    /// not and what to do instead: a backend that cannot stand a proxy
    /// between its sandbox and the network never takes rules it would not
    /// enforce.
    fn network_door(&self) -> std::result::Result<(), String> {
        Err(format!(
            "{} sandboxes cannot have `--network allow:` yet; use --network on or off",
            self.kind()
        ))
    }

    /// For a platform that holds `--network allow:` rules with an
    /// allow-list of its own (E2B, Modal): its name, and what its list
    /// cannot promise that berth's proxy does (shown to the person). The
    /// runtime fills [`SandboxSpec::allow_list`] for it.
    fn native_allow_list(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Give the running sandbox `spec.name` the allow-list in
    /// `spec.allow_list` (`berth sandbox network` on a platform that holds
    /// the list itself).
    async fn set_allow_list(&self, spec: &SandboxSpec) -> Result<()> {
        Err(Error::Unsupported(format!(
            "{} sets a sandbox's allow-list when the sandbox is made, and berth cannot change it while it runs; \
             make sandbox `{}` again (`berth sandbox rm`, then `sandbox create --network allow:…`) with the rules it needs",
            self.kind(),
            spec.name
        )))
    }

    /// [`Backend::remove`] for a sandbox whose recorded spec is known: a
    /// backend that reaches a sandbox through its spec (ssh's host) reaches
    /// it there.
    async fn remove_spec(&self, spec: &SandboxSpec, opts: RemoveOpts) -> Result<()> {
        self.remove(&spec.name, opts).await
    }

    /// [`Backend::list`], knowing the recorded specs of this backend's
    /// sandboxes: a backend whose sandboxes live in several places (ssh's
    /// hosts) looks in each of them.
    async fn list_specs(&self, specs: &[SandboxSpec]) -> Result<Vec<SandboxInfo>> {
        let _ = specs;
        self.list().await
    }
}

/// Options for [`Sandbox::spawn`].
#[derive(Clone, Debug, Default)]
pub struct SpawnOpts {
    /// Extra environment for this process, on top of the sandbox's.
    pub env: Vec<(String, String)>,
    /// Working directory; the sandbox's workdir when `None`.
    pub cwd: Option<String>,
    /// Run the program on a terminal (a PTY): its stdin and stdout are the
    /// terminal, stderr is merged into stdout, and it leads a session whose
    /// controlling terminal that is. Backends without terminals refuse it.
    pub tty: bool,
    /// The terminal's size when `tty` is set; [`TermSize::default`] when `None`.
    pub tty_size: Option<TermSize>,
    /// berth's own short helper (a tree kill, a job's status or log), never
    /// agent code. The local backend confines every spawn, helpers too, to
    /// its own tree's signals: what must reach the whole sandbox there is
    /// signalled by berth's own process, through pidfds it checked (#32).
    pub helper: bool,
    /// What this process is, by a key unique within its sandbox (a session's
    /// shell). A backend whose processes outlive the link that started them
    /// (envd keeps a process whose stream dropped) tags it with the key and
    /// this berth ([`crate::owner`]), and first ends any process under the
    /// same key whose berth is gone: a berth killed mid-command leaves no idle
    /// shell behind. Backends whose processes end with their link ignore it.
    pub replaces: Option<String>,
}

/// A terminal's size in character cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TermSize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

impl Default for TermSize {
    /// 80x24, what a terminal is when nobody said otherwise.
    fn default() -> Self {
        TermSize { cols: 80, rows: 24 }
    }
}

impl std::str::FromStr for TermSize {
    type Err = Error;

    /// `COLSxROWS`, e.g. `120x40`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            Error::InvalidInput(format!(
                "terminal size {s:?} is not COLSxROWS with both between 1 and 65535, e.g. 120x40"
            ))
        };
        let (c, r) = s.split_once(['x', 'X']).ok_or_else(bad)?;
        let cols: u16 = c.trim().parse().map_err(|_| bad())?;
        let rows: u16 = r.trim().parse().map_err(|_| bad())?;
        if cols == 0 || rows == 0 {
            return Err(bad());
        }
        Ok(TermSize { cols, rows })
    }
}

impl std::fmt::Display for TermSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.cols, self.rows)
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that killed it, when it was killed.
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// The shell convention: the code, or 128 + the signal.
    pub fn shell_code(&self) -> i32 {
        match (self.code, self.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => -1,
        }
    }
}

/// A signal berth may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Signal {
    /// SIGINT
    Int,
    /// SIGTERM
    Term,
    /// SIGKILL
    Kill,
}

impl Signal {
    /// The Linux signal number.
    pub fn number(self) -> i32 {
        match self {
            Signal::Int => 2,
            Signal::Term => 15,
            Signal::Kill => 9,
        }
    }

    /// The name without the SIG prefix.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Int => "INT",
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
        }
    }
}

/// A process running inside a sandbox.
#[async_trait]
pub trait Process: Send {
    /// The process's pipes, which the `take_*` methods hand out.
    fn pipes(&mut self) -> &mut Pipes;
    /// Take the stdin pipe. Returns `None` after the first call.
    fn take_stdin(&mut self) -> Option<BoxWrite> {
        self.pipes().stdin.take()
    }
    /// Take the stdout pipe. Returns `None` after the first call.
    fn take_stdout(&mut self) -> Option<BoxRead> {
        self.pipes().stdout.take()
    }
    /// Take the stderr pipe. Returns `None` after the first call.
    fn take_stderr(&mut self) -> Option<BoxRead> {
        self.pipes().stderr.take()
    }
    /// For a process on this machine whose stdout is a non-blocking pipe: its raw
    /// descriptor, which the session engine reads directly, without waiting, for
    /// a few microseconds after sending a command. A reply then arrives without
    /// the thread going to sleep and being woken, which on a VM is most of a
    /// round trip. Call before `take_stdout`; the descriptor is valid for as long
    /// as the reader that call returns.
    fn stdout_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Wait for the process to end.
    async fn wait(&mut self) -> Result<ExitStatus>;
    /// Change the size of the process's terminal (spawned with `tty`); the
    /// kernel then sends its foreground process group SIGWINCH.
    async fn resize(&mut self, size: TermSize) -> Result<()> {
        let _ = size;
        Err(Error::Unsupported(
            "resizing a process that has no terminal (spawn it with `tty`)".into(),
        ))
    }
    /// Tear the process down from outside: the transport's own kill (a signal
    /// locally, closing the exec or channel elsewhere). Used when a shell is replaced.
    async fn terminate(&mut self) -> Result<()>;
}

/// A process's three pipes, each handed out once by [`Process`]'s `take_*`.
/// A pipe the process does not have (stderr on a terminal, stdin of a process
/// started without one) is `None` from the start.
#[derive(Default)]
pub struct Pipes {
    /// Its stdin.
    pub stdin: Option<BoxWrite>,
    /// Its stdout.
    pub stdout: Option<BoxRead>,
    /// Its stderr.
    pub stderr: Option<BoxRead>,
}

impl Pipes {
    /// All three pipes.
    pub fn new(stdin: BoxWrite, stdout: BoxRead, stderr: BoxRead) -> Self {
        Self {
            stdin: Some(stdin),
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }
}

/// A live sandbox.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// The sandbox's name.
    fn name(&self) -> &str;
    /// The backend it belongs to.
    fn kind(&self) -> BackendKind;
    /// Where the workspace and berth's private directory are.
    fn layout(&self) -> &Layout;
    /// Start `argv` inside the sandbox with piped stdio.
    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>>;
    /// Read up to `limit` bytes of a file.
    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>>;
    /// Create or replace a file, creating its parent directories.
    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()>;
    /// Whether the sandbox is still there and usable. Cheap; used to tell a dead
    /// sandbox from a dead shell.
    async fn alive(&self) -> Result<bool>;
    /// Destroy the sandbox.
    async fn destroy(&self) -> Result<()>;
    /// Whether the sandbox's processes are berth's own: in berth's pid
    /// namespace, under its uid, with paths as berth sees them (the local
    /// backend). The engine then signals them from its own process rather than
    /// through a helper it spawns, which a command that filled its process
    /// limit would leave no room for.
    fn host_processes(&self) -> bool {
        false
    }
    /// How berth tells this sandbox's processes from the host's before it
    /// signals a pid read from the sandbox's files (see
    /// [`crate::procs::SandboxProc`]). Only for a sandbox whose processes are
    /// berth's ([`Sandbox::host_processes`]).
    fn sandbox_procs(&self) -> crate::procs::SandboxProcs {
        crate::procs::SandboxProcs::Nobody
    }
    /// The sandbox's memory bound and how many of its processes the kernel's
    /// OOM killer has ended, where berth bounds its memory itself (the local
    /// backend's memory cgroup); `None` elsewhere.
    fn memory(&self) -> Option<MemoryState> {
        None
    }
}

/// How a sandbox's memory bound stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryState {
    /// The bound, in bytes (swap included).
    pub limit_bytes: u64,
    /// Processes the OOM killer has ended in the sandbox, so far.
    pub oom_kills: u64,
}

/// What [`run_to_end`] collected.
#[derive(Clone, Debug)]
pub struct Collected {
    /// How the process ended.
    pub status: ExitStatus,
    /// Its stdout, up to the limit.
    pub stdout: Vec<u8>,
    /// Its stderr, up to the limit.
    pub stderr: Vec<u8>,
}

/// Run a short helper process in a sandbox: feed it `stdin`, collect up to `limit`
/// bytes of each output stream, and give up after `timeout`.
pub async fn run_to_end(
    sandbox: &dyn Sandbox,
    argv: &[String],
    stdin: Option<&[u8]>,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Collected> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let opts = SpawnOpts {
        helper: true,
        ..SpawnOpts::default()
    };
    let mut p = sandbox.spawn(argv, opts).await?;
    let input = p.take_stdin();
    let out = p.take_stdout();
    let err = p.take_stderr();
    let work = async {
        let feed = async {
            if let Some(mut i) = input {
                if let Some(data) = stdin {
                    i.write_all(data)
                        .await
                        .map_err(|e| Error::stream("writing to a helper process", e))?;
                }
                let _ = i.shutdown().await;
            }
            Ok::<(), Error>(())
        };
        let read = |r: Option<BoxRead>| async move {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(limit as u64).read_to_end(&mut buf).await;
            }
            buf
        };
        let (fed, stdout, stderr) = tokio::join!(feed, read(out), read(err));
        fed?;
        let status = p.wait().await?;
        Ok::<Collected, Error>(Collected {
            status,
            stdout,
            stderr,
        })
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(Error::backend(
            sandbox.kind().as_str(),
            BackendFailure::Timeout,
            format!(
                "helper `{}` in sandbox `{}` did not finish within {}s",
                argv.first().map(String::as_str).unwrap_or("?"),
                sandbox.name(),
                timeout.as_secs()
            ),
        )),
    }
}

/// A note a transport puts in a process's output stream, as a read error of
/// kind `ConnectionAborted`: the link to the process broke and was re-attached,
/// so the bytes written between the two are lost, and the stream goes on. A
/// reader that gets one reports what it was reading as lost, and may read on.
#[derive(Debug)]
pub struct OutputGap(pub String);

impl std::fmt::Display for OutputGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "output lost: {}; re-attached to the process", self.0)
    }
}

impl std::error::Error for OutputGap {}

impl OutputGap {
    /// The read error that carries this gap.
    pub fn into_io(self) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionAborted, self)
    }

    /// The gap a read error carries, if it is one.
    pub fn of(e: &std::io::Error) -> Option<&OutputGap> {
        e.get_ref()?.downcast_ref::<OutputGap>()
    }
}

/// `mkdir -p DIR` inside a sandbox, as its user, through one helper spawn:
/// for transports that move files with no directory call of their own.
pub async fn mkdir_p(sandbox: &dyn Sandbox, dir: &str) -> Result<()> {
    let argv = ["mkdir", "-p", "--", dir].map(String::from);
    let c = run_to_end(
        sandbox,
        &argv,
        None,
        4096,
        std::time::Duration::from_secs(30),
    )
    .await?;
    if c.status.code == Some(0) {
        return Ok(());
    }
    Err(Error::backend(
        sandbox.kind().as_str(),
        BackendFailure::Rejected,
        format!(
            "sandbox `{}`: cannot create directory `{dir}`: {}",
            sandbox.name(),
            String::from_utf8_lossy(&c.stderr).trim()
        ),
    ))
}

/// See [`crate::identity::SANDBOX_MARKER`].
pub use crate::identity::SANDBOX_MARKER;

/// Check that a sandbox name is one berth accepts. It becomes a directory
/// name: 1-63 letters, digits, '-', '_' or '.', not starting with '.' (so
/// never `..` or a hidden file).
pub fn check_sandbox_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidInput(format!(
            "invalid sandbox name {name:?}: use 1-63 letters, digits, '-', '_' or '.', not starting with '.'"
        )))
    }
}

/// Seconds since the Unix epoch: berth's one clock in seconds (see
/// [`crate::clock::now_ms`] for milliseconds).
pub fn now_unix_secs() -> i64 {
    crate::clock::now_ms() / 1000
}

#[cfg(test)]
mod kind_tests {
    use super::{BackendKind, normalize_path};

    #[test]
    fn paths_are_normalized_against_the_base_as_text() {
        assert_eq!(normalize_path("/workspace", "a/./b/../c"), "/workspace/a/c");
        assert_eq!(normalize_path("/workspace/", "."), "/workspace");
        assert_eq!(normalize_path("/workspace", "/etc//x/"), "/etc/x");
        assert_eq!(normalize_path("/workspace", "../../../.."), "/");
    }

    #[test]
    fn a_backend_kind_pads_in_a_table() {
        assert_eq!(format!("{:<8}|", BackendKind::K8s), "k8s     |");
        assert_eq!(format!("{}", BackendKind::Docker), "docker");
    }

    #[test]
    fn every_backend_kind_reads_back_as_itself() {
        for k in BackendKind::ALL {
            assert_eq!(BackendKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(BackendKind::parse("kubernetes"), None);
        assert_eq!(BackendKind::Docker.to_string(), "docker");
    }
}
