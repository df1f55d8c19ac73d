//! The wrapper's command line, built by type: berth's side of the contract
//! with [`crate::exec`], which parses the same flags with clap. Nothing else in
//! berth spells the hidden subcommand or its flags.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use berth_policies::{LimitsTable, LocalPolicy};

use crate::error::{Error, Result};
use crate::exec::SUBCOMMAND;

/// How to start a process inside a local sandbox: `berth __sandbox-exec …`
/// with the policy, ready to be given each spawn's [`SpawnTarget`].
#[derive(Clone, Debug)]
pub struct WrapperCommand {
    exe: PathBuf,
    policy: String,
    unrestricted: bool,
    /// The policy's limits, for each sandbox's memory bound.
    limits: LimitsTable,
    /// The host's RAM, which the default memory bound is a part of.
    host_ram: u64,
}

/// The one spawn a wrapper argv is for.
#[derive(Clone, Copy, Debug)]
pub struct SpawnTarget<'a> {
    /// The sandbox's directory (holding `work/`, `tmp/`, `.berth/`).
    pub dir: &'a Path,
    /// The sandbox's name.
    pub name: &'a str,
    /// Whether the sandbox's own spec asks for network (the policy can also).
    pub network: bool,
    /// Run the program from a private copy, not dumpable (see
    /// [`crate::private`]): a session's shell.
    pub nondumpable: bool,
    /// The network door's directory (`--network allow:`), if it has one.
    pub door: Option<&'a Path>,
}

impl WrapperCommand {
    /// The wrapper at `exe` (berth's own executable) enforcing `policy`.
    pub fn new(exe: impl Into<PathBuf>, policy: &LocalPolicy) -> Result<Self> {
        let policy = serde_json::to_string(policy)
            .map_err(|e| Error::Usage(format!("local policy: {e}")))?;
        Ok(Self {
            exe: exe.into(),
            policy,
            unrestricted: false,
            limits: LimitsTable::default(),
            host_ram: crate::cgroup::host_ram(),
        })
    }

    /// Bound each sandbox's memory as `limits` say (`memory_max_bytes`).
    pub fn with_limits(mut self, limits: &LimitsTable) -> Self {
        self.limits = limits.clone();
        self
    }

    /// The memory bound of sandbox `name` in bytes, if it has one.
    pub fn memory_max(&self, name: &str) -> Option<u64> {
        self.limits.for_sandbox(name).memory_max(self.host_ram)
    }

    /// Whether the policy names sandbox `name`'s memory bound itself (rather
    /// than leaving it at the default): one that cannot be applied is then
    /// worth a warning.
    pub fn memory_asked(&self, name: &str) -> bool {
        self.limits
            .for_sandbox(name)
            .memory_max_bytes
            .is_some_and(|n| n > 0)
    }

    /// Run processes WITHOUT kernel restrictions (the wrapper says so loudly).
    pub fn unrestricted(mut self, yes: bool) -> Self {
        self.unrestricted = yes;
        self
    }

    /// Whether this wrapper leaves processes unconfined.
    pub fn is_unrestricted(&self) -> bool {
        self.unrestricted
    }

    /// The argv prefix for one spawn; the program and its arguments follow.
    pub fn argv(&self, t: &SpawnTarget<'_>) -> Vec<OsString> {
        let mut v: Vec<OsString> = vec![
            self.exe.clone().into(),
            SUBCOMMAND.into(),
            "--policy".into(),
            self.policy.clone().into(),
            "--sandbox-dir".into(),
            t.dir.into(),
            "--name".into(),
            t.name.into(),
            "--network".into(),
            if t.network { "on" } else { "off" }.into(),
        ];
        if self.unrestricted {
            v.push("--unrestricted".into());
        } else if let Some(m) = self.memory_max(t.name) {
            v.push("--memory-max".into());
            v.push(m.to_string().into());
        }
        if t.nondumpable {
            v.push("--nondumpable".into());
        }
        if let Some(d) = t.door {
            v.push("--door".into());
            v.push(d.into());
        }
        v.push("--".into());
        v
    }

    /// The argv that kills what is left of a sandbox and removes its pids cgroup.
    pub fn remove_cgroup_argv(&self, dir: &Path, name: &str) -> Vec<OsString> {
        vec![
            self.exe.clone().into(),
            SUBCOMMAND.into(),
            "--sandbox-dir".into(),
            dir.into(),
            "--name".into(),
            name.into(),
            "--remove-cgroup".into(),
        ]
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn argv_is_what_the_wrapper_parses() {
        let w = WrapperCommand::new("/usr/bin/berth", &LocalPolicy::default()).unwrap();
        let t = SpawnTarget {
            dir: Path::new("/s/d"),
            name: "d",
            network: true,
            nondumpable: true,
            door: None,
        };
        let argv = w.argv(&t);
        assert_eq!(argv[1], SUBCOMMAND);
        assert_eq!(argv.last().unwrap(), "--");
        let mut full: Vec<OsString> = argv[2..].to_vec();
        full.push("true".into());
        let parsed = crate::exec::parse_args(full).unwrap();
        assert_eq!(parsed.sandbox_dir, Path::new("/s/d"));
        assert_eq!(parsed.name, "d");
        assert!(
            parsed.policy.network,
            "the spec's network reaches the policy"
        );
        assert!(!parsed.unrestricted);
        assert!(parsed.nondumpable);
        assert_eq!(parsed.argv, vec![OsString::from("true")]);
    }

    #[test]
    fn the_memory_bound_reaches_the_wrapper_per_sandbox() {
        let limits: LimitsTable = berth_policies::Policy::from_toml(
            "[limits]\nmemory_max_bytes = 1048576\n[limits.sandbox.big]\nmemory_max_bytes = 0\n",
            "test",
        )
        .unwrap()
        .limits;
        let w = WrapperCommand::new("/usr/bin/berth", &LocalPolicy::default())
            .unwrap()
            .with_limits(&limits);
        let parse = |name: &str| {
            let t = SpawnTarget {
                dir: Path::new("/s/d"),
                name,
                network: false,
                nondumpable: false,
                door: None,
            };
            let mut full: Vec<OsString> = w.argv(&t)[2..].to_vec();
            full.push("true".into());
            crate::exec::parse_args(full).unwrap().memory_max
        };
        assert_eq!(parse("small"), Some(1 << 20));
        assert_eq!(parse("big"), None, "0 is no bound");
        assert!(w.memory_asked("small") && !w.memory_asked("big"));
    }
}
