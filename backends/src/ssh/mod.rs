//! The ssh backend: a sandbox is a host plus a workspace directory on it.
//!
//! Flow at a glance:
//! - [`SshBackend`] keeps one [`Connection`] per `user@host:port`; every sandbox,
//!   session shell, helper spawn and file transfer on that host shares it as
//!   channels. Keepalives (interval x count, from the options or the config's
//!   `ServerAliveInterval`/`ServerAliveCountMax`) declare a silent link dead.
//! - A sandbox `NAME` is `~/.berth/sandboxes/NAME` on the host (the root can be
//!   changed with [`SshOptions::sandbox_root`]):
//!   ```text
//!   ~/.berth/sandboxes/NAME/          the workspace: first cwd
//!     .berth/sandbox.json             the marker that makes it berth's (list finds it)
//!     .berth/                         snapshots, job logs
//!   ```
//! - Processes start through [`process::spawn`]: argv on the channel's exec
//!   request, environment values over stdin, so no secret lands in argv or in
//!   sshd's log, whatever the server's `AcceptEnv` says. Each process is the
//!   session leader sshd created. `SpawnOpts::tty` is ignored: a terminal would
//!   echo the environment block.
//! - Files move over SFTP or, without it, through exec ([`files`]).
//!
//! Safety and faults:
//! - Host keys are checked against known_hosts, strictly: an unknown host is
//!   refused with its fingerprint unless `accept_new` (then recorded); a changed
//!   or revoked key is always refused, naming the file and line.
//! - When the link drops, the running process's `wait` fails with
//!   `Error::Unreachable` (never an exit code), the next use redials with backoff
//!   (a timeout ends that call's attempts; host key and auth refusals are final),
//!   and the session engine restores its shell from the remote snapshot.
//!   [`Sandbox::alive`] answers `Ok(false)` when the host answers but the
//!   workspace is gone, and `Err(Unreachable)` when the host does not answer.
//!
//! For the CLI: `--host` -> [`SshOptions::host`], `--accept-new`,
//! `--ssh-config`, `--known-hosts`, `-i`, `-J`; `SSH_AUTH_SOCK`, `HOME` and
//! `BERTH_SSH_PASSPHRASE` via [`SshOptions::from_env`]. Where a sandbox is
//! and how to reach it (host, jump hosts, identities, known_hosts, config)
//! is recorded in its spec when it is made, and wins over the call's
//! ([`settings`]); `-o workdir=DIR` starts its sessions in `DIR`.
//!
//! Module map: `settings` (what a sandbox keeps), `config` (~/.ssh/config),
//! `known_hosts` (host keys), `auth`,
//! `connection` (dial, redial with backoff), `process` (a channel as a
//! [`Process`]), `files`, `bench`, `testing` (a real sshd for tests).

pub mod auth;
pub mod bench;
pub mod config;
pub mod connection;
pub mod files;
pub mod known_hosts;
pub mod process;
pub mod settings;
pub mod target;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use berth_core::backend::{
    Backend, Layout, Process, Provisioned, RemoveOpts, Sandbox, SandboxInfo, SandboxSpec,
    SpawnOpts, check_sandbox_name, now_unix_secs,
};
use berth_core::error::{BackendFailure, Error, Result};
use serde::{Deserialize, Serialize};

pub use connection::Connection;
pub use target::Target;

use crate::SshOptions;
use files::{Files, helper};

/// The backend's short name.
pub const KIND: &str = "ssh";
/// Where sandboxes live on a host unless configured otherwise.
pub const DEFAULT_ROOT: &str = "~/.berth/sandboxes";

/// One host: its connection and its file mover.
#[derive(Clone)]
pub struct HostLink {
    /// The shared connection.
    pub conn: Arc<Connection>,
    files: Arc<Files>,
}

/// The ssh backend.
pub struct SshBackend {
    opts: Arc<SshOptions>,
    pool: Mutex<HashMap<String, HostLink>>,
}

/// The marker written into every sandbox.
#[derive(Serialize, Deserialize)]
struct Marker {
    name: String,
    created_unix: i64,
    berth: String,
}

impl SshBackend {
    /// A backend with these settings.
    pub fn new(opts: SshOptions) -> Self {
        Self {
            opts: Arc::new(opts),
            pool: Mutex::new(HashMap::new()),
        }
    }

    /// The shared link to `host` (an alias or `[user@]host[:port]`), created on first use.
    pub fn link(&self, host: &str) -> Result<HostLink> {
        self.link_with(&self.opts, host)
    }

    /// The link to the host a sandbox's spec records, reached the way the
    /// spec records (jump hosts, identities, known_hosts, config).
    fn link_for(&self, spec: &SandboxSpec) -> Result<(String, HostLink)> {
        let opts = Arc::new(settings::for_spec(&self.opts, spec));
        let host = host_of(&opts)?;
        let link = self.link_with(&opts, &host)?;
        Ok((host, link))
    }

    fn link_with(&self, opts: &Arc<SshOptions>, host: &str) -> Result<HostLink> {
        let target = Target::resolve(opts, host)?;
        let key = target.label();
        let mut pool = self
            .pool
            .lock()
            .map_err(|_| Error::InvalidInput("ssh connection pool poisoned".into()))?;
        Ok(pool
            .entry(key)
            .or_insert_with(|| HostLink {
                conn: Arc::new(Connection::new(target, opts.clone())),
                files: Arc::new(Files::default()),
            })
            .clone())
    }

    /// Close every pooled connection.
    pub async fn close(&self) {
        let links: Vec<HostLink> = match self.pool.lock() {
            Ok(mut p) => p.drain().map(|(_, l)| l).collect(),
            Err(_) => Vec::new(),
        };
        for l in links {
            l.conn.close().await;
        }
    }

    fn root(&self) -> String {
        self.opts
            .sandbox_root
            .clone()
            .unwrap_or_else(|| DEFAULT_ROOT.to_string())
    }
}

/// The host `opts` names, or an error saying how to name one.
fn host_of(opts: &SshOptions) -> Result<String> {
    opts.host.clone().ok_or_else(|| {
        Error::InvalidInput(
            "the ssh backend needs a host: pass --host HOST (an ~/.ssh/config alias or user@host[:port]); a sandbox made with one keeps it"
                .into(),
        )
    })
}

/// The root with a leading `~` expanded by the remote shell.
const ROOT_PRELUDE: &str =
    r#"root=$1; case $root in "~") root=$HOME;; "~/"*) root=$HOME/${root#"~/"};; esac; "#;

const PROVISION_SCRIPT: &str = r#"dir=$root/$2; m=$dir/.berth/sandbox.json
if [ -f "$m" ]; then state=existing; elif [ -e "$dir" ]; then state=adopted; else state=created; fi
mkdir -p -- "$dir/.berth" || exit 3
[ -f "$m" ] || printf '%s\n' "$3" > "$m" || exit 4
printf '%s\n' "$state"; cd -- "$dir" && pwd -P || exit 5
w=${4:-}; case $w in "") exit 0;; "~") w=$HOME;; "~/"*) w=$HOME/${w#"~/"};; esac
cd -- "$w" 2>/dev/null || { printf 'its workdir %s is not a directory on the host\n' "$w" >&2; exit 6; }
pwd -P"#;

const LIST_SCRIPT: &str = r#"for m in "$root"/*/.berth/sandbox.json; do [ -f "$m" ] || continue; d=${m%/.berth/sandbox.json}; printf '%s\t' "${d##*/}"; tr -d '\n' < "$m"; printf '\n'; done"#;

const REMOVE_SCRIPT: &str =
    r#"dir=$root/$2; [ -f "$dir/.berth/sandbox.json" ] || exit 44; rm -rf -- "$dir""#;

/// Run a short script on `link`'s host; returns (exit code, stdout, stderr).
async fn run_script(link: &HostLink, script: &str, args: &[&str]) -> Result<(i32, String, String)> {
    let full = format!("{ROOT_PRELUDE}{script}");
    let argv = helper(&full, args);
    let p = process::spawn(&link.conn, &argv, &[], ".").await?;
    let (st, out, err) = p.collect(b"").await?;
    Ok((
        st.shell_code(),
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).trim().to_string(),
    ))
}

#[async_trait]
impl Backend for SshBackend {
    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Ssh
    }

    fn network_door(&self) -> std::result::Result<(), String> {
        Err("an ssh sandbox is a shell on a host berth does not own: that host's own network and firewall apply, and berth cannot stand between it and the network. Filter on the host, or run the work in a docker sandbox (`-b docker --network allow:…`)".into())
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        check_sandbox_name(&spec.name)?;
        let (_, link) = self.link_for(spec)?;
        let marker = serde_json::to_string(&Marker {
            name: spec.name.clone(),
            created_unix: now_unix_secs(),
            berth: env!("CARGO_PKG_VERSION").into(),
        })
        .map_err(|e| Error::InvalidInput(format!("sandbox marker: {e}")))?;
        let root = self.root();
        let workdir_opt = spec.option("workdir").unwrap_or("");
        let (code, out, err) = run_script(
            &link,
            PROVISION_SCRIPT,
            &[&root, &spec.name, &marker, workdir_opt],
        )
        .await?;
        let mut lines = out.lines();
        let (Some(state), Some(dir), 0) = (lines.next(), lines.next(), code) else {
            return Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "{}: could not create the sandbox directory {root}/{} (exit {code}): {err}",
                    link.conn.target().label(),
                    spec.name
                ),
            ));
        };
        let mut env: Vec<(String, String)> = vec![("BERTH_SANDBOX".into(), spec.name.clone())];
        env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        // `-o workdir=DIR`: the session starts there (`~` is the remote
        // home); berth's own files stay in the sandbox's directory.
        let workdir = lines.next().unwrap_or(dir);
        let sandbox = SshSandbox {
            name: spec.name.clone(),
            dir: dir.to_string(),
            layout: Layout {
                workdir: workdir.to_string(),
                berth_dir: format!("{dir}/.berth"),
            },
            link,
            env,
        };
        Ok(Provisioned {
            sandbox: Arc::new(sandbox),
            created: state == "created",
            recreated: (state == "adopted").then(|| {
                "its directory existed without berth's marker; berth adopted it".to_string()
            }),
        })
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let host = host_of(&self.opts)?;
        let link = self.link(&host)?;
        self.list_on(&link, &host).await
    }

    async fn remove(&self, name: &str, opts: RemoveOpts) -> Result<()> {
        let mut spec = SandboxSpec::named(name);
        self.settle_spec(&mut spec, None)?;
        self.remove_spec(&spec, opts).await
    }

    fn settle_spec(&self, spec: &mut SandboxSpec, stored: Option<&SandboxSpec>) -> Result<bool> {
        settings::settle(&self.opts, spec, stored)
    }

    async fn remove_spec(&self, spec: &SandboxSpec, _opts: RemoveOpts) -> Result<()> {
        let name = spec.name.as_str();
        check_sandbox_name(name)?;
        let (host, link) = self.link_for(spec)?;
        let (code, _, err) = run_script(&link, REMOVE_SCRIPT, &[&self.root(), name]).await?;
        match code {
            0 => Ok(()),
            44 => Err(Error::NotFound {
                what: "sandbox",
                name: name.into(),
                hint: format!("list sandboxes with `berth sandbox ls --backend ssh --host {host}`"),
            }),
            _ => Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "{}: removing sandbox {name} failed: {err}",
                    link.conn.target().label()
                ),
            )),
        }
    }

    /// Every host a recorded sandbox is on, and the call's own: a host that
    /// does not answer shows its recorded sandboxes as `unreachable`.
    async fn list_specs(&self, specs: &[SandboxSpec]) -> Result<Vec<SandboxInfo>> {
        let mut places: Vec<(Option<String>, Vec<String>)> = Vec::new();
        let mut add = |host: Option<String>, spec: Option<&SandboxSpec>| {
            let i = match places.iter().position(|(h, _)| *h == host) {
                Some(i) => i,
                None => {
                    places.push((host, Vec::new()));
                    places.len() - 1
                }
            };
            if let Some(s) = spec {
                places[i].1.push(s.name.clone());
            }
        };
        if self.opts.host.is_some() {
            add(self.opts.host.clone(), None);
        }
        for spec in specs {
            add(spec.option("host").map(str::to_string), Some(spec));
        }
        let mut out: Vec<SandboxInfo> = Vec::new();
        for (host, names) in places {
            let Some(host) = host else {
                // Older records name no host: where they are is unknown.
                out.extend(names.into_iter().map(|name| SandboxInfo {
                    name,
                    id: "(no host recorded: pass --host once to record it)".into(),
                    state: "unknown".into(),
                    created_unix: None,
                }));
                continue;
            };
            let spec = specs
                .iter()
                .find(|s| s.option("host") == Some(host.as_str()))
                .cloned()
                .unwrap_or_else(|| {
                    let mut s = SandboxSpec::named("-");
                    s.options.insert("host".into(), host.clone());
                    s
                });
            let found = match self.link_for(&spec) {
                Ok((_, link)) => self.list_on(&link, &host).await,
                Err(e) => Err(e),
            };
            match found {
                Ok(v) => {
                    let seen: Vec<String> = v.iter().map(|i| i.name.clone()).collect();
                    out.extend(v);
                    // A sandbox recorded on this host but not found there.
                    out.extend(names.into_iter().filter(|n| !seen.contains(n)).map(|name| {
                        SandboxInfo {
                            name,
                            id: host.clone(),
                            state: "missing".into(),
                            created_unix: None,
                        }
                    }));
                }
                Err(e) if names.is_empty() => return Err(e),
                Err(e) => out.extend(names.into_iter().map(|name| SandboxInfo {
                    name,
                    id: format!("{host}: {}", e.full_text()),
                    state: "unreachable".into(),
                    created_unix: None,
                })),
            }
        }
        Ok(out)
    }
}

impl SshBackend {
    /// berth's sandboxes on `link`'s host, whose ids name it `shown`: as
    /// the user typed it (`box1`, not the `root@127.0.0.1:2222` it resolves
    /// to), as `ssh` and `~/.ssh/config` name hosts.
    async fn list_on(&self, link: &HostLink, shown: &str) -> Result<Vec<SandboxInfo>> {
        let (code, out, err) = run_script(link, LIST_SCRIPT, &[&self.root()]).await?;
        if code != 0 {
            return Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "{}: listing sandboxes failed: {err}",
                    link.conn.target().label()
                ),
            ));
        }
        let mut v: Vec<SandboxInfo> = out
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(name, json)| {
                let marker = serde_json::from_str::<Marker>(json).ok();
                SandboxInfo {
                    name: name.to_string(),
                    id: format!("{shown}:{}/{name}", self.root()),
                    state: if marker.is_some() { "ready" } else { "broken" }.into(),
                    created_unix: marker.map(|m| m.created_unix),
                }
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }
}

/// A sandbox on a remote host.
pub struct SshSandbox {
    name: String,
    /// The sandbox's directory, `ROOT/NAME`: its marker and berth's files.
    dir: String,
    layout: Layout,
    link: HostLink,
    env: Vec<(String, String)>,
}

impl SshSandbox {
    /// The connection this sandbox uses.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.link.conn
    }
}

#[async_trait]
impl Sandbox for SshSandbox {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Ssh
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn spawn(&self, argv: &[String], opts: SpawnOpts) -> Result<Box<dyn Process>> {
        let cwd = opts.cwd.unwrap_or_else(|| self.layout.workdir.clone());
        let mut env = self.env.clone();
        for (k, v) in opts.env {
            env.retain(|(ek, _)| *ek != k);
            env.push((k, v));
        }
        let wrapped = crate::subreaper::wrap(argv, opts.replaces.as_deref(), opts.tty);
        let argv = &wrapped[..];
        let spawned = if opts.tty {
            let size = opts.tty_size.unwrap_or_default();
            process::spawn_terminal(&self.link.conn, argv, &env, &cwd, size).await
        } else {
            process::spawn(&self.link.conn, argv, &env, &cwd).await
        };
        match spawned {
            Ok(p) => Ok(Box::new(p)),
            Err(Error::Spawn {
                kind: berth_core::error::SpawnFailure::BadCwd,
                ..
            }) if cwd == self.layout.workdir || !self.alive().await.unwrap_or(true) => {
                Err(self.gone("its workspace directory is missing on the host"))
            }
            Err(e) => Err(e),
        }
    }

    async fn read_file(&self, path: &str, limit: u64) -> Result<Vec<u8>> {
        self.link
            .files
            .read(&self.link.conn, &self.layout.resolve(path), limit)
            .await
    }

    async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<()> {
        self.link
            .files
            .write(&self.link.conn, &self.layout.resolve(path), data, mode)
            .await
    }

    /// `Ok(false)` when the host answers but the workspace is gone; an
    /// `Unreachable` error when the host does not answer.
    async fn alive(&self) -> Result<bool> {
        let argv = helper(
            r#"[ -d "$1" ] && [ -f "$2/sandbox.json" ]"#,
            &[&self.layout.workdir, &self.layout.berth_dir],
        );
        let p = process::spawn(&self.link.conn, &argv, &[], "/").await?;
        let (st, _, _) = p.collect(b"").await?;
        Ok(st.code == Some(0))
    }

    async fn destroy(&self) -> Result<()> {
        let argv = helper(
            r#"[ -f "$1/.berth/sandbox.json" ] || exit 44; rm -rf -- "$1""#,
            &[&self.dir],
        );
        let p = process::spawn(&self.link.conn, &argv, &[], "/").await?;
        let (st, _, err) = p.collect(b"").await?;
        match st.code {
            Some(0) | Some(44) => Ok(()),
            _ => Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "{}: removing {} failed: {}",
                    self.link.conn.target().label(),
                    self.dir,
                    String::from_utf8_lossy(&err).trim()
                ),
            )),
        }
    }
}

impl SshSandbox {
    fn gone(&self, reason: &str) -> Error {
        Error::sandbox_gone(
            KIND,
            &self.name,
            format!("{} ({})", reason, self.layout.workdir),
            format!(
                "run the command again to recreate it, or `berth sandbox rm {}`",
                self.name
            ),
        )
    }
}
