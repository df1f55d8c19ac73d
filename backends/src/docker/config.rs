//! The container's hardened configuration, derived from a [`SandboxSpec`].
//!
//! Defaults, each overridable per sandbox:
//! - every capability dropped (`cap_add` option adds some back);
//! - `no-new-privileges`, so setuid binaries cannot raise privileges;
//! - berth's own seccomp profile ([`super::seccomp`]): socket families an
//!   allow-list, no namespaces, no io_uring, no setuid/setgid mode bits;
//! - pids, memory and CPU limits (`spec.limits`);
//! - network mode `none` unless `spec.network` is open; with `allow:`
//!   rules, still `none`, and one door: the egress proxy's socket directory
//!   bind-mounted at [`DOOR_MOUNT`], a relay (socat, in berth's image) on
//!   `127.0.0.1:3128` as the container's main process, and the proxy
//!   variables set, so pip, git and curl go through it. A program that
//!   ignores them finds no route;
//! - a non-root user (`user` option, default uid:gid 1000:1000, `berth` in our
//!   image); `user=root` adds [`ROOT_CAPS`] unless `cap_add` is given;
//! - optional read-only root filesystem with a tmpfs `/tmp` (`read_only` option).
//!
//! Nothing of berth's own environment is copied in: the container gets a fixed
//! PATH, HOME and LANG; the sandbox's (policy-filtered) env is passed per exec.

use std::collections::HashMap;

use berth_core::backend::SandboxSpec;
use berth_core::error::{Error, Result};
use bollard::models::{ContainerCreateBody, HostConfig};

use super::{BERTH_DIR, Names, SANDBOX_PATH, WORKDIR};

/// Default memory ceiling, MiB.
pub const DEFAULT_MEMORY_MB: u64 = 2048;
/// Default CPU quota, thousandths of a core.
pub const DEFAULT_MILLI_CPU: u64 = 1000;
/// Default process limit: room for builds and test runners, not for a fork bomb.
pub const DEFAULT_PIDS: u64 = 512;
/// Size of the tmpfs `/tmp` on a read-only root filesystem, MiB.
pub const TMPFS_MB: u64 = 512;

/// The capabilities a sandbox running as root gets when its spec names none
/// (`cap_add`): what a package manager needs (dpkg changes owners and
/// modes of files it does not own, apt drops to its `_apt` user to
/// download). Still no-new-privileges, berth's seccomp profile, and none of
/// the capabilities that reach past the container (no SYS_ADMIN, NET_ADMIN,
/// SYS_PTRACE, MKNOD).
pub const ROOT_CAPS: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
];

/// Where a `--network allow:` sandbox sees its door (the proxy's socket
/// directory, read-only).
pub const DOOR_MOUNT: &str = "/run/berth-egress";
/// The container's main process when it has a door: the relay, started
/// again if it ends (a sandboxed program may kill it; the network is then
/// shut until it is back, never open).
fn relay_cmd() -> Vec<String> {
    let sock = format!("{DOOR_MOUNT}/{}", berth_core::backend::DOOR_SOCKET);
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "while :; do socat TCP-LISTEN:3128,bind=127.0.0.1,reuseaddr,fork UNIX-CONNECT:{sock}; sleep 1; done"
        ),
    ]
}

/// The options a docker sandbox understands in `SandboxSpec::options`.
pub const OPTIONS: &[&str] = &["read_only", "cap_add", "user"];

/// The user a sandbox's processes run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxUser {
    /// As given to Docker (`uid:gid` or a name).
    pub spec: String,
    /// Numeric owner for files written through the archive API.
    pub uid: u64,
    /// Numeric group for those files.
    pub gid: u64,
}

impl SandboxUser {
    /// Read `uid:gid`, `root` or `berth` (either side).
    pub fn parse(s: &str) -> Result<Self> {
        let (u, g) = s.split_once(':').unwrap_or((s, s));
        let num = |x: &str| -> Option<u64> {
            match x {
                "root" => Some(0),
                "berth" => Some(1000),
                _ => x.parse().ok(),
            }
        };
        match (num(u), num(g)) {
            (Some(uid), Some(gid)) => Ok(Self {
                spec: format!("{uid}:{gid}"),
                uid,
                gid,
            }),
            _ => Err(Error::InvalidInput(format!(
                "docker option user={s:?}: give numeric `uid:gid`, `root` or `berth`"
            ))),
        }
    }
}

/// Everything berth decides about a sandbox's container.
#[derive(Clone, Debug)]
pub struct ContainerPlan {
    /// The user processes run as.
    pub user: SandboxUser,
    /// The capabilities added back after dropping all.
    pub cap_add: Vec<String>,
    /// Whether the root filesystem is read-only.
    pub read_only: bool,
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(Error::InvalidInput(format!(
            "docker option {key}={v:?}: use true or false"
        ))),
    }
}

impl ContainerPlan {
    /// Check the spec's docker options and derive the plan.
    pub fn from_spec(spec: &SandboxSpec) -> Result<Self> {
        for key in spec.options.keys() {
            if !OPTIONS.contains(&key.as_str()) {
                return Err(Error::InvalidInput(format!(
                    "unknown docker option `{key}`; known: {}",
                    OPTIONS.join(", ")
                )));
            }
        }
        let user = SandboxUser::parse(spec.option("user").unwrap_or("1000:1000"))?;
        let read_only = parse_bool("read_only", spec.option("read_only").unwrap_or("false"))?;
        // None by default. Processes run as a non-root uid, for which the
        // bounding set grants nothing anyway: reading, writing and killing its own
        // files and processes need no capability, and with no-new-privileges no
        // setuid binary can pick one up. A workload that runs as root inside the
        // sandbox (an sshd, a package install) names what it needs, e.g.
        // `cap_add=CHOWN,SETUID,SETGID,SYS_CHROOT,NET_BIND_SERVICE`. Root
        // without a `cap_add` gets what installing packages takes
        // ([`ROOT_CAPS`]); a `cap_add` of its own must keep DAC_OVERRIDE.
        let root_caps = ROOT_CAPS.join(",");
        let default_caps = if user.uid == 0 {
            root_caps.as_str()
        } else {
            ""
        };
        let cap_add = spec
            .option("cap_add")
            .unwrap_or(default_caps)
            .split(',')
            .map(|c| c.trim().to_ascii_uppercase())
            .filter(|c| !c.is_empty())
            .map(|c| c.strip_prefix("CAP_").map(str::to_string).unwrap_or(c))
            .collect::<Vec<_>>();
        if let Some(bad) = cap_add
            .iter()
            .find(|c| !c.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_'))
        {
            return Err(Error::InvalidInput(format!(
                "docker option cap_add: `{bad}` is not a capability name"
            )));
        }
        // The workspace and berth's state in the sandbox are volumes owned
        // by the image's user (1000), which root can write only with
        // DAC_OVERRIDE: without it the session could not save its state, and
        // each command would fail with "Permission denied".
        if user.uid == 0 && !cap_add.iter().any(|c| c == "DAC_OVERRIDE") {
            return Err(Error::InvalidInput(format!(
                "docker option user=root with cap_add={}: root needs DAC_OVERRIDE to write the workspace and berth's state, which belong to the image's user (uid 1000); add DAC_OVERRIDE to cap_add, or leave cap_add out (root then gets {})",
                cap_add.join(","),
                ROOT_CAPS.join(",")
            )));
        }
        Ok(Self {
            user,
            cap_add,
            read_only,
        })
    }
}

/// The create body for the sandbox's container.
pub fn container_body(
    spec: &SandboxSpec,
    plan: &ContainerPlan,
    image: &str,
    names: &Names,
) -> ContainerCreateBody {
    let labels = names.labels(&spec.name);
    let memory_mb = spec.limits.memory_mb.unwrap_or(DEFAULT_MEMORY_MB);
    let milli_cpu = spec.limits.milli_cpu.unwrap_or(DEFAULT_MILLI_CPU);
    let pids = spec.limits.pids.unwrap_or(DEFAULT_PIDS);
    let memory = (memory_mb.saturating_mul(1024 * 1024)).min(i64::MAX as u64) as i64;
    let tmpfs = plan.read_only.then(|| {
        HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={TMPFS_MB}m,mode=1777"),
        )])
    });
    let mut binds = vec![
        format!("{}:{WORKDIR}", names.workspace_volume(&spec.name)),
        format!("{}:{BERTH_DIR}", names.state_volume(&spec.name)),
    ];
    let mut env = base_env();
    let mut cmd = vec!["sleep".to_string(), "infinity".to_string()];
    if let Some(door) = &spec.door {
        binds.push(format!("{}:{DOOR_MOUNT}:ro", door.display()));
        let bundle = format!("{DOOR_MOUNT}/{}", berth_core::backend::DOOR_BUNDLE);
        env.extend(
            berth_core::backend::door_env(&bundle)
                .into_iter()
                .chain(spec.door_env.iter().cloned())
                .map(|(k, v)| format!("{k}={v}")),
        );
        cmd = relay_cmd();
    }
    let host_config = HostConfig {
        binds: Some(binds),
        cap_drop: Some(vec!["ALL".to_string()]),
        cap_add: (!plan.cap_add.is_empty()).then(|| plan.cap_add.clone()),
        security_opt: Some(vec![
            "no-new-privileges".to_string(),
            // INET sockets with any network: with a door the container has
            // only `lo`, and the relay on it is the one way out.
            super::seccomp::security_opt(spec.network.any()),
        ]),
        network_mode: Some(
            if spec.network.is_open() {
                "bridge"
            } else {
                "none"
            }
            .to_string(),
        ),
        memory: Some(memory),
        // Same as memory: no swap on top.
        memory_swap: Some(memory),
        nano_cpus: Some((milli_cpu.min(i64::MAX as u64 / 1_000_000) * 1_000_000) as i64),
        pids_limit: Some(pids.min(i64::MAX as u64) as i64),
        readonly_rootfs: Some(plan.read_only),
        tmpfs,
        // berth restarts or recreates the container itself, and says so.
        restart_policy: None,
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(image.to_string()),
        // tini (from the image) is PID 1 and reaps the zombies that exec'd
        // processes leave behind; `sleep infinity` just keeps the container
        // up (the relay does, when there is a door).
        entrypoint: Some(vec!["/usr/bin/tini".to_string(), "--".to_string()]),
        cmd: Some(cmd),
        user: Some(plan.user.spec.clone()),
        working_dir: Some(WORKDIR.to_string()),
        env: Some(env),
        labels: Some(labels),
        hostname: Some(hostname(&spec.name)),
        stop_signal: Some("SIGTERM".to_string()),
        stop_timeout: Some(2),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// The environment every process in the container starts from.
pub fn base_env() -> Vec<String> {
    vec![
        format!("PATH={SANDBOX_PATH}"),
        "HOME=/home/berth".to_string(),
        "LANG=C.UTF-8".to_string(),
    ]
}

/// A valid hostname from a sandbox name.
fn hostname(name: &str) -> String {
    let h: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    h.trim_matches('-').to_string()
}

/// Check a sandbox name: it becomes part of container and volume names, which
/// must start with a letter or digit; the rest is the shared rule.
pub fn check_name(name: &str) -> Result<()> {
    if name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
    {
        return berth_core::backend::check_sandbox_name(name);
    }
    Err(Error::InvalidInput(format!(
        "invalid sandbox name {name:?}: use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_hardened() -> Result<()> {
        let spec = SandboxSpec::named("t");
        let plan = ContainerPlan::from_spec(&spec)?;
        let body = container_body(&spec, &plan, "img", &Names::new("0123456789"));
        // Named and labelled for its installation, volumes included.
        let labels = body.labels.clone().unwrap_or_default();
        assert_eq!(
            labels
                .get(crate::docker::LABEL_INSTALLATION)
                .map(String::as_str),
            Some("0123456789")
        );
        let hc = body.host_config.unwrap_or_default();
        assert_eq!(
            hc.binds,
            Some(vec![
                "berth-0123456789-t-workspace:/workspace".to_string(),
                "berth-0123456789-t-state:/var/lib/berth".to_string(),
            ])
        );
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.cap_add, None);
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.pids_limit, Some(DEFAULT_PIDS as i64));
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        Ok(())
    }

    #[test]
    fn options_are_checked() {
        let mut spec = SandboxSpec::named("t");
        spec.options.insert("bogus".into(), "1".into());
        assert!(ContainerPlan::from_spec(&spec).is_err());
        let mut spec = SandboxSpec::named("t");
        spec.options
            .insert("cap_add".into(), "cap_chown, setuid".into());
        spec.options.insert("read_only".into(), "true".into());
        let plan = ContainerPlan::from_spec(&spec);
        assert!(matches!(plan, Ok(ref p) if p.cap_add == ["CHOWN", "SETUID"] && p.read_only));
        let mut spec = SandboxSpec::named("t");
        spec.options.insert("user".into(), "nobody".into());
        assert!(ContainerPlan::from_spec(&spec).is_err());
        // Root gets what a package manager needs, unless it names its own.
        let mut spec = SandboxSpec::named("t");
        spec.options.insert("user".into(), "root".into());
        let plan = ContainerPlan::from_spec(&spec);
        assert!(matches!(plan, Ok(ref p) if p.cap_add == ROOT_CAPS && p.user.uid == 0));
        // Root without DAC_OVERRIDE could not write its own workspace.
        spec.options.insert("cap_add".into(), "".into());
        let plan = ContainerPlan::from_spec(&spec);
        assert!(
            matches!(plan, Err(Error::InvalidInput(ref m)) if m.contains("add DAC_OVERRIDE")),
            "{plan:?}"
        );
        spec.options
            .insert("cap_add".into(), "chown,dac_override".into());
        let plan = ContainerPlan::from_spec(&spec);
        assert!(matches!(plan, Ok(ref p) if p.cap_add == ["CHOWN", "DAC_OVERRIDE"]));
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("web-1").is_ok());
        assert!(check_name("-x").is_err());
        assert!(check_name("a/b").is_err());
        assert!(check_name("").is_err());
    }
}
