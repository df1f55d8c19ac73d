//! A real test sshd known as `box1`, as a person's `~/.ssh/config` names a
//! server: the tests of the `berth` binary on the ssh backend share it.

use std::path::PathBuf;
use std::process::Command;

use berth_backends::ssh::testing::{Sshd, SshdConfig};

use super::BoxError;

/// A test sshd whose sessions see a temp dir as their home (so sandboxes land
/// in the test's own directory), and a local home whose `~/.ssh/config`
/// names it `box1`.
pub struct Box1 {
    pub sshd: Sshd,
    pub home: PathBuf,
    /// The home the host's sessions see.
    pub remote: tempfile::TempDir,
}

impl Box1 {
    pub fn start() -> Result<Box1, BoxError> {
        let remote = tempfile::tempdir()?;
        let sshd = Sshd::start_with(SshdConfig {
            extra: format!("SetEnv HOME={} SHLVL=1\n", remote.path().display()),
            ..SshdConfig::default()
        })?;
        let home = sshd.home();
        std::fs::write(
            home.join(".ssh/config"),
            format!(
                "Host box1\n  HostName 127.0.0.1\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n",
                sshd.port(),
                sshd.user(),
                sshd.user_key().display(),
                sshd.known_hosts().display()
            ),
        )?;
        Ok(Box1 { sshd, home, remote })
    }

    /// Point a `berth` command at this home: its `~/.ssh/config` and keys,
    /// and no agent or default host from the caller's environment.
    pub fn apply<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("HOME", &self.home)
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("BERTH_SSH_HOST")
    }
}
