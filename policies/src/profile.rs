//! The kernel sandbox profile of a local sandbox: what Landlock grants, which
//! syscalls seccomp refuses, which rlimits apply. Pure data, built here from the
//! policy and enforced by `berth __sandbox-exec` in the child before exec.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Directories a shell needs to read and execute from, granted when present.
pub const SYSTEM_READ_EXEC: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];

/// Device files a shell reads and writes. Not `/dev/pts` (another terminal,
/// the operator's included, would take escape sequences from the sandbox), not
/// `/dev/ptmx`, and not `/dev/shm` (shared by every sandbox and the host).
pub const DEVICES_RW: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/urandom",
    "/dev/random",
    "/dev/fd",
];

/// Host secrets that are never granted, even below a granted directory (see
/// [`is_secret`]; every `/etc/ssh/*_key` is one too).
pub const SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/security/opasswd",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/root",
];

/// Whether `p` is a host secret: one of [`SECRETS`] or below one, or an ssh
/// host key (`/etc/ssh/*_key`).
pub fn is_secret(p: &Path) -> bool {
    if SECRETS.iter().any(|s| p.starts_with(s)) {
        return true;
    }
    p.parent() == Some(Path::new("/etc/ssh"))
        && p.file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with("_key"))
}

/// Process limits applied with setrlimit (soft = hard).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RLimits {
    /// Processes (RLIMIT_NPROC; per user, so not enforced for root: see `pids`).
    pub nproc: u64,
    /// Open files (RLIMIT_NOFILE).
    pub nofile: u64,
    /// Largest file written, bytes (RLIMIT_FSIZE).
    pub fsize_bytes: u64,
    /// Address space, bytes (RLIMIT_AS).
    pub address_space_bytes: u64,
    /// Processes in the sandbox's pids cgroup (enforced for root too).
    pub pids: u64,
}

impl Default for RLimits {
    fn default() -> Self {
        Self {
            nproc: 4096,
            nofile: 4096,
            fsize_bytes: 8 << 30,
            address_space_bytes: 16 << 30,
            pids: 512,
        }
    }
}

/// What the policy file says about local sandboxes (`[local]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LocalPolicy {
    /// Whether local sandboxes are kernel-restricted at all.
    pub restricted: bool,
    /// Whether sandboxed processes may use the network (TCP and UDP).
    pub network: bool,
    /// Extra paths granted read and execute.
    pub read: Vec<PathBuf>,
    /// Extra paths granted read and write.
    pub write: Vec<PathBuf>,
    /// Process limits.
    pub rlimits: RLimits,
    /// On a kernel without Landlock scopes (ABI < 6), run anyway, though a
    /// sandbox can then signal every process of berth's user. Off: refuse.
    pub unscoped_signals: bool,
    /// When berth runs as root: run local sandboxes as uid 0 (with no
    /// capabilities) instead of a uid of their own. Off: each sandbox runs as
    /// its own unprivileged uid, so root's private files are not its own.
    pub run_as_root: bool,
}

impl Default for LocalPolicy {
    fn default() -> Self {
        Self {
            restricted: true,
            network: false,
            read: Vec::new(),
            write: Vec::new(),
            rlimits: RLimits::default(),
            unscoped_signals: false,
            run_as_root: false,
        }
    }
}

/// Everything the exec wrapper enforces, serialised to JSON on its command line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxProfile {
    /// The sandbox's name (names its pids cgroup).
    pub name: String,
    /// Paths granted read and execute.
    pub read_exec: Vec<PathBuf>,
    /// Paths granted read, write, create and remove.
    pub read_write: Vec<PathBuf>,
    /// The sandbox's own directories (`work`, `tmp`, `.berth`), granted as
    /// they are even where the state dir lies below a host secret (berth run
    /// as root keeps it in `/root/.local/state`): they are berth's, not the
    /// host's. Only a real directory, not a link, is granted this way.
    #[serde(default)]
    pub own: Vec<PathBuf>,
    /// Whether TCP/UDP networking is allowed.
    pub network: bool,
    /// Process limits.
    pub rlimits: RLimits,
    /// Run without signal scoping where the kernel cannot scope signals.
    pub allow_unscoped_signals: bool,
}

impl LocalPolicy {
    /// The profile of the sandbox whose directory is `dir` (holding `work/`,
    /// `tmp/` and `.berth/`). `exists` says which system paths are present.
    pub fn profile(
        &self,
        name: &str,
        dir: &Path,
        exists: impl Fn(&Path) -> bool,
    ) -> SandboxProfile {
        let mut read_exec: Vec<PathBuf> = SYSTEM_READ_EXEC
            .iter()
            .map(PathBuf::from)
            .chain(
                ["/proc", "/sys/devices/system/cpu"]
                    .iter()
                    .map(PathBuf::from),
            )
            .chain(self.read.iter().cloned())
            .filter(|p| exists(p))
            .collect();
        read_exec.dedup();
        let own: Vec<PathBuf> = ["work", "tmp", ".berth"]
            .iter()
            .map(|s| dir.join(s))
            .collect();
        let mut read_write: Vec<PathBuf> = own
            .iter()
            .cloned()
            .chain(DEVICES_RW.iter().map(PathBuf::from).filter(|p| exists(p)))
            .chain(self.write.iter().cloned())
            .collect();
        read_write.dedup();
        SandboxProfile {
            name: name.to_string(),
            read_exec,
            read_write,
            own,
            network: self.network,
            rlimits: self.rlimits.clone(),
            allow_unscoped_signals: self.unscoped_signals,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_workspace_and_present_system_dirs_only() {
        let p = LocalPolicy::default().profile("s1", Path::new("/state/sandboxes/local/s1"), |p| {
            p != Path::new("/lib32")
        });
        assert!(p.read_exec.contains(&PathBuf::from("/usr")));
        assert!(!p.read_exec.contains(&PathBuf::from("/lib32")));
        assert!(
            !p.read_exec
                .iter()
                .any(|p| p.starts_with("/root") || p.starts_with("/home"))
        );
        assert_eq!(
            p.read_write[0],
            PathBuf::from("/state/sandboxes/local/s1/work")
        );
        assert!(
            p.read_write
                .iter()
                .all(|w| !w.starts_with("/state/berth.db"))
        );
        assert!(!p.network);
        for shared in ["/dev/pts", "/dev/ptmx", "/dev/shm"] {
            assert!(!p.read_write.contains(&PathBuf::from(shared)), "{shared}");
        }
    }

    #[test]
    fn secrets_are_named() {
        for s in [
            "/etc/shadow",
            "/etc/sudoers.d/x",
            "/etc/ssh/ssh_host_ed25519_key",
            "/root/.ssh",
        ] {
            assert!(is_secret(Path::new(s)), "{s}");
        }
        for s in [
            "/etc/passwd",
            "/etc/ssh/ssh_host_ed25519_key.pub",
            "/etc/ssh/sshd_config",
            "/rootfs",
        ] {
            assert!(!is_secret(Path::new(s)), "{s}");
        }
    }
}
