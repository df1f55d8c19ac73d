//! The berth CLI's side of `berth serve`, in a crate of its own so that the
//! thin `berth` binary links only this: the gRPC protocol
//! (`proto/berth/server.proto`), the command line of the calls the client
//! makes itself (`exec`, and the global options), and the calls.
//!
//! Flow at a glance:
//! 1. a CLI call (`berth exec`) reads `BERTH_SERVER` (`auto` by default);
//! 2. the client connects to `<state dir>/server.sock`; with no server there (no
//!    socket, or a stale one nobody listens on) it starts `berth-engine serve`
//!    detached, as OpenSSH's ControlPersist does, and waits for the socket;
//! 3. the call carries the client's identity (version, protocol, the engine's
//!    build, the configuration); a server that differs refuses it, is told to
//!    shut down, and a new one is started;
//! 4. the call runs in the server's `Runtime`, where the sandbox's shell stays
//!    warm: output streams back, then the report; Ctrl-C sends `Interrupt`, and
//!    a client that goes away interrupts its command too. `CallTool` runs a
//!    tool call for `berth mcp --server`/`berth run --server`. Every other
//!    subcommand is the engine's: `job`, `sandbox`, `events` and approvals
//!    call the typed API (`berth.v1`, berth-service) on the same socket;
//!    nothing crosses as a command line;
//! 5. the server checks every peer's uid (`SO_PEERCRED`), and exits after its
//!    idle time with nothing running, or when its socket is removed.
//!
//! With `BERTH_SERVER=off` every command runs in-process in `berth-engine`.

pub mod args;
pub mod client;
pub mod diag;
pub mod quick;
pub mod report;

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The generated gRPC code for `proto/berth/server.proto`, client and server.
#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("berth.server");
}

/// The backend used when none is named.
pub const DEFAULT_BACKEND: &str = "local";
/// The sandbox used when none is named (`berth_core::runtime::DEFAULT_SANDBOX`).
pub const DEFAULT_SANDBOX: &str = "default";
/// A sandbox's first session (`berth_core::runtime::MAIN_SESSION`).
pub const MAIN_SESSION: &str = "main";

/// Exit code for berth's own failures (as opposed to the command's).
pub const EXIT_BERTH_ERROR: u8 = 125;

/// The file name of the binary that holds the runtime (`berth serve`, and
/// every command the thin client does not make itself).
pub const ENGINE: &str = "berth-engine";

/// The async runtime of a CLI process: one thread, so a round trip to the
/// server or the shell wakes no other thread.
pub fn cli_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The runtime `berth serve` runs on: one worker per core (at least two), so
/// a call that waits (SQLite's busy handler hands its worker's other tasks to
/// another thread with `block_in_place`) never stops the sessions, job
/// watchers and clients of the others.
pub fn server_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().max(2));
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("berth-serve")
        .enable_all()
        .build()
}

/// The thin client's file name.
pub const CLIENT: &str = "berth";

/// An error and its causes on one line. berth's errors keep their causes
/// (`#[source]`) and most also name them in their own message, so a cause is
/// added only when the text so far does not already say it.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

/// The exit status of a berth whose stdout was closed under it (`berth …
/// | head -1`): 128 + SIGPIPE, the status a shell shows for a program that
/// SIGPIPE ended, as it ends `yes | head -1`'s `yes`.
pub const EXIT_CLOSED_STDOUT: u8 = 141;

/// Whether `e` is a write to a pipe nobody reads any more.
pub fn closed_pipe(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

/// Make a closed stdout a quiet exit ([`EXIT_CLOSED_STDOUT`]) for every
/// command of this process. berth ignores SIGPIPE (a write to a pipe must
/// fail, not kill the process: the backends write to their commands'
/// pipes), so `println!` to a closed stdout panics ("failed printing to
/// stdout: Broken pipe"). That panic, and only it, ends the process here
/// without a word: the reader has gone, as it does under `| head -1`.
/// Every other panic is reported as before.
pub fn quiet_on_closed_stdout() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.starts_with("failed printing to stdout")
            && msg.contains(&format!("(os error {})", libc::EPIPE))
        {
            std::process::exit(EXIT_CLOSED_STDOUT.into());
        }
        report(info)
    }));
}

/// The engine beside this executable: `berth` and `berth-engine` are built
/// and installed together.
pub fn engine_path() -> Result<PathBuf> {
    let me = std::env::current_exe().context("cannot find berth's own executable")?;
    if me.file_name().and_then(|n| n.to_str()) == Some(ENGINE) {
        return Ok(me);
    }
    Ok(me.with_file_name(ENGINE))
}

/// Resolve the state directory: flag or BERTH_STATE_DIR, else the XDG state dir.
pub fn state_dir(flag: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(d) = flag {
        return Ok(d);
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("berth"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither --state-dir, BERTH_STATE_DIR, XDG_STATE_HOME nor HOME is set; pass --state-dir DIR")?;
    Ok(PathBuf::from(home).join(".local/state/berth"))
}

/// The config file: BERTH_CONFIG, else $XDG_CONFIG_HOME/berth/config.toml,
/// else ~/.config/berth/config.toml. It need not exist.
pub fn config_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BERTH_CONFIG").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("berth/config.toml"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither BERTH_CONFIG, XDG_CONFIG_HOME nor HOME is set; set BERTH_CONFIG=FILE")?;
    Ok(PathBuf::from(home).join(".config/berth/config.toml"))
}

/// The policy file: BERTH_POLICY, else the XDG config dir.
pub fn policy_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BERTH_POLICY").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("berth/policy.toml"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither BERTH_POLICY, XDG_CONFIG_HOME nor HOME is set; set BERTH_POLICY=FILE")?;
    Ok(PathBuf::from(home).join(".config/berth/policy.toml"))
}

/// The wire protocol's revision: bump it on a change an older peer cannot read.
pub const PROTOCOL: u32 = 5;

/// How long an idle server lives by default (seconds).
pub const DEFAULT_IDLE_SECS: u64 = 300;

/// The socket's file name in the state dir.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("server.sock")
}

/// The lock a running server holds, so one state dir has one server.
pub fn lock_path(state_dir: &Path) -> PathBuf {
    state_dir.join("server.lock")
}

/// Where a server started by the CLI writes its diagnostics.
pub fn log_path(state_dir: &Path) -> PathBuf {
    state_dir.join("server.log")
}

/// Fail early with a clear message when the state dir cannot hold a socket path.
pub fn check_socket_path(state_dir: &Path) -> Result<()> {
    let p = socket_path(state_dir);
    // sun_path holds 108 bytes with its NUL.
    if p.as_os_str().len() >= 108 {
        bail!(
            "the server socket path {} is too long for a unix socket (107 bytes at most); use a shorter --state-dir or BERTH_SERVER=off",
            p.display()
        );
    }
    Ok(())
}

/// Whether the CLI uses a server (`BERTH_SERVER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Use the running server, starting one if none runs (the default).
    Auto,
    /// Run everything in-process.
    Off,
    /// Use the running server; fail if none runs.
    Require,
}

impl Mode {
    /// From `BERTH_SERVER`.
    pub fn from_env() -> Result<Mode> {
        match std::env::var("BERTH_SERVER").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("auto") => Ok(Mode::Auto),
            Ok("off") | Ok("0") => Ok(Mode::Off),
            Ok("require") => Ok(Mode::Require),
            Ok(other) => bail!(
                "BERTH_SERVER={other:?} is not one of auto, off, require; unset it to use the default (auto)"
            ),
        }
    }
}

/// The server's idle time from `BERTH_SERVER_IDLE` (seconds), else the default.
pub fn idle_from_env() -> Result<u64> {
    match std::env::var("BERTH_SERVER_IDLE") {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<u64>().map_err(|_| {
            anyhow::anyhow!("BERTH_SERVER_IDLE={v:?} is not a whole number of seconds")
        }),
        _ => Ok(DEFAULT_IDLE_SECS),
    }
}

/// This client's identity, as a server compares it with its own.
pub fn identity() -> proto::ClientId {
    proto::ClientId {
        version: env!("CARGO_PKG_VERSION").to_string(),
        protocol: PROTOCOL,
        exe_id: crate::exe_id(),
        config_key: crate::config_key(),
    }
}

/// The identity of the engine's executable: a rebuilt or upgraded berth
/// differs, so a server left over from an older build is replaced. The same in
/// the thin client (the engine beside it) and in the server (itself).
pub fn exe_id() -> String {
    use std::os::unix::fs::MetadataExt;
    engine_path()
        .ok()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| format!("{}:{}:{}.{}", m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
        .unwrap_or_default()
}

/// The variables that change what a server does, by name or as `PREFIX*`:
/// berth's own settings; the backends' (the docker daemon, the ssh agent,
/// E2B, Modal and the kubeconfig); where berth's files are; the proxies and CA files its
/// HTTP clients follow; the locale and time zone a sandbox is given; the
/// browser the dashboard opens. Besides these, every variable whose name
/// marks a secret (see [`SECRET_PARTS`]) and every variable the policy's
/// `[env] allow` passes into sandboxes count. Nothing else does: another
/// `PATH`, venv, conda env or prompt uses the same server.
pub const KEY_ENV: &[&str] = &[
    "BERTH_*",
    "DOCKER_*",
    "SSH_AUTH_SOCK",
    "SSH_ASKPASS",
    "E2B_*",
    "MODAL_*",
    "KUBECONFIG",
    "HOME",
    "USER",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
    "XDG_CACHE_HOME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "BROWSER",
];

/// Parts of a variable's name (in upper case) that mark a secret: the server
/// redacts such values from output, and a provider's key is one of them.
/// The redactor's own list (`berth_policies::redact::SECRET_NAME_PARTS`; a
/// test keeps the two alike), without its exceptions, so no secret is missed.
pub const SECRET_PARTS: &[&str] = &[
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
    "API",
];

/// Prefixes of terminal emulators' and multiplexers' per-window variables,
/// which may look like secrets (`KITTY_PUBLIC_KEY`, `TERM_SESSION_ID`) but
/// differ between terminals of one user and change nothing berth does.
const TERMINAL_PREFIXES: &[&str] = &[
    "TERM",
    "TMUX",
    "STY",
    "ITERM_",
    "KONSOLE_",
    "VTE_",
    "WEZTERM_",
    "KITTY_",
    "XDG_SESSION_",
    "WINDOWID",
    "SSH_TTY",
    "SSH_CLIENT",
    "SSH_CONNECTION",
];

/// Variables of [`KEY_ENV`] that differ between calls of one user without
/// changing what the server does: how this call reaches a server, and its
/// log filter.
const VOLATILE_ENV: &[&str] = &[
    "BERTH_SERVER",
    "BERTH_SERVER_IDLE",
    "BERTH_STATE_DIR",
    "BERTH_LOG",
];

fn glob_match(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether the variable `name` is part of the server's identity, given the
/// policy's `[env] allow` patterns `allowed`.
fn keyed(name: &str, allowed: &[String]) -> bool {
    if VOLATILE_ENV.contains(&name) || TERMINAL_PREFIXES.iter().any(|p| name.starts_with(p)) {
        return false;
    }
    let up = name.to_ascii_uppercase();
    KEY_ENV.iter().any(|p| glob_match(p, name))
        || SECRET_PARTS.iter().any(|p| up.contains(p))
        || allowed.iter().any(|p| glob_match(p, name))
}

/// The `[env] allow` patterns of the policy file at `path` (none when it is
/// missing or unreadable: the server then fails on it with a clear error).
fn policy_env_allow(path: &Path) -> Vec<String> {
    #[derive(serde::Deserialize, Default)]
    struct Env {
        #[serde(default)]
        allow: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    struct Policy {
        #[serde(default)]
        env: Env,
    }
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| toml::from_str::<Policy>(&t).ok())
        .map(|p| p.env.allow)
        .unwrap_or_default()
}

/// A digest of what shapes the server's runtime: the policy file, and the
/// variables of berth's environment that change what it does ([`KEY_ENV`],
/// secrets, what the policy passes into sandboxes). A client whose key
/// differs restarts the server, so a server never runs a call under another
/// caller's settings; a call from another `PATH` or venv reuses it.
pub fn config_key() -> String {
    let policy = policy_path().ok();
    let allowed = policy.as_deref().map(policy_env_allow).unwrap_or_default();
    let mut vars: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| keyed(k, &allowed))
        .collect();
    vars.sort();
    let mut h = std::hash::DefaultHasher::new();
    vars.hash(&mut h);
    if let Some(p) = policy {
        use std::os::unix::fs::MetadataExt;
        p.hash(&mut h);
        if let Ok(m) = std::fs::metadata(&p) {
            (m.ino(), m.len(), m.mtime(), m.mtime_nsec()).hash(&mut h);
        }
    }
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::keyed;

    #[test]
    fn only_variables_that_change_what_berth_does_key_the_server() {
        let allowed = vec!["MY_TOOL_*".to_string()];
        for v in [
            "PATH",
            "VIRTUAL_ENV",
            "CONDA_PREFIX",
            "PS1",
            "PWD",
            "TERM",
            "TMUX_PANE",
            "SHLVL",
            "BERTH_SERVER",
            "BERTH_STATE_DIR",
        ] {
            assert!(!keyed(v, &allowed), "{v}");
        }
        for v in [
            "SSH_AUTH_SOCK",
            "BERTH_POLICY",
            "HOME",
            "DOCKER_HOST",
            "API_TOKEN",
            "OPENAI_API_KEY",
            "LC_ALL",
            "https_proxy",
            "MY_TOOL_HOME",
        ] {
            assert!(keyed(v, &allowed), "{v}");
        }
    }
}
