//! A sandbox's container as the engine has it: its real settings (network,
//! limits, user, root filesystem, capabilities, image) and size, read back
//! through the inspect API. `provision` compares them with the spec before it
//! attaches to, starts or unpauses a container, so a sandbox never runs with
//! settings other than the ones on record; `sandbox inspect` shows them.

use bollard::models::{ContainerInspectResponse, HostConfig};
use bollard::query_parameters::InspectContainerOptions;
use serde::Serialize;

use berth_core::backend::SandboxSpec;
use berth_core::error::{Error, Result};

use super::config::{self, ContainerPlan};
use super::{DockerBackend, api_error, status_of};

/// A container's settings, as the engine reports them (or as berth would
/// create them, for comparison).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ContainerSettings {
    /// The network mode: `none` (no network) or `bridge`.
    pub network: String,
    /// Memory ceiling, MiB.
    pub memory_mb: Option<u64>,
    /// CPU quota, thousandths of a core.
    pub milli_cpu: Option<u64>,
    /// Process limit.
    pub pids: Option<u64>,
    /// The user processes run as (`uid:gid`).
    pub user: String,
    /// Whether the root filesystem is read-only.
    pub read_only: bool,
    /// Capabilities added back after dropping all, sorted.
    pub cap_add: Vec<String>,
    /// The image, as named at creation; empty in a plan for the default
    /// image (whose tag changes with berth's recipe, so it is not compared).
    pub image: String,
}

impl ContainerSettings {
    fn of(user: Option<&str>, image: Option<&str>, hc: Option<&HostConfig>) -> Self {
        let hc = hc.cloned().unwrap_or_default();
        let positive = |v: Option<i64>| v.filter(|n| *n > 0).map(|n| n as u64);
        let mut cap_add: Vec<String> = hc
            .cap_add
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let c = c.to_ascii_uppercase();
                c.strip_prefix("CAP_").map(str::to_string).unwrap_or(c)
            })
            .collect();
        cap_add.sort();
        Self {
            network: hc.network_mode.unwrap_or_default(),
            memory_mb: positive(hc.memory).map(|b| b >> 20),
            milli_cpu: positive(hc.nano_cpus).map(|n| n / 1_000_000),
            pids: positive(hc.pids_limit),
            user: user.unwrap_or_default().to_string(),
            read_only: hc.readonly_rootfs.unwrap_or(false),
            cap_add,
            image: image.unwrap_or_default().to_string(),
        }
    }

    /// The settings berth gives a new container for `spec`.
    pub fn planned(spec: &SandboxSpec, plan: &ContainerPlan) -> Self {
        let names = super::Names::new("-");
        let body = config::container_body(spec, plan, "", &names);
        Self::of(
            body.user.as_deref(),
            spec.image.as_deref(),
            body.host_config.as_ref(),
        )
    }

    /// The settings of an inspected container.
    pub fn inspected(c: &ContainerInspectResponse) -> Self {
        Self::of(
            c.config.as_ref().and_then(|c| c.user.as_deref()),
            c.config.as_ref().and_then(|c| c.image.as_deref()),
            c.host_config.as_ref(),
        )
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|x| x.to_string())
        .unwrap_or_else(|| "no limit".into())
}

/// Each setting in which the container (`has`) differs from what the spec
/// gives (`wants`), as `SETTING: the container has X, the spec Y`.
pub fn differences(wants: &ContainerSettings, has: &ContainerSettings) -> Vec<String> {
    let mut out = Vec::new();
    let mut one = |what: &str, has: String, wants: String| {
        if has != wants {
            out.push(format!("{what}: the container has {has}, the spec {wants}"));
        }
    };
    one("network", has.network.clone(), wants.network.clone());
    one("memory (MiB)", opt(&has.memory_mb), opt(&wants.memory_mb));
    one(
        "cpus (thousandths)",
        opt(&has.milli_cpu),
        opt(&wants.milli_cpu),
    );
    one("pids", opt(&has.pids), opt(&wants.pids));
    one("user", has.user.clone(), wants.user.clone());
    one(
        "read_only",
        has.read_only.to_string(),
        wants.read_only.to_string(),
    );
    one(
        "cap_add",
        format!("[{}]", has.cap_add.join(",")),
        format!("[{}]", wants.cap_add.join(",")),
    );
    if !wants.image.is_empty() {
        one("image", has.image.clone(), wants.image.clone());
    }
    out
}

/// A sandbox's container as `sandbox inspect` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ContainerFacts {
    /// The Docker daemon it lives on.
    pub daemon: String,
    /// The container's name.
    pub container: String,
    /// The container's id.
    pub id: String,
    /// `running`, `exited`, `paused`, ...
    pub state: String,
    /// Its settings, as the engine has them.
    pub settings: ContainerSettings,
    /// Bytes the container wrote outside its volumes (its writable layer).
    pub size_rw: Option<i64>,
    /// The size of its whole root filesystem, image included.
    pub size_root_fs: Option<i64>,
    /// The workspace and state volumes' names.
    pub volumes: Vec<String>,
    /// Bytes in the workspace (`du` in the container), when it runs.
    pub workspace_bytes: Option<u64>,
}

impl DockerBackend {
    /// The sandbox's container as the engine has it; `None` when there is no
    /// container under its name.
    pub async fn inspect_sandbox(&self, name: &str) -> Result<Option<ContainerFacts>> {
        config::check_name(name)?;
        let cname = self.names.container(name);
        let opts = InspectContainerOptions { size: true };
        let c = match self.docker.inspect_container(&cname, Some(opts)).await {
            Ok(c) => c,
            Err(e) if status_of(&e) == Some(404) => return Ok(None),
            Err(e) => return Err(api_error(&self.host, name, "inspecting the container", e)),
        };
        let state = c.state.as_ref();
        let state = match state {
            Some(s) if s.paused == Some(true) => "paused".to_string(),
            Some(s) => s
                .status
                .as_ref()
                .map(|x| x.to_string())
                .unwrap_or_else(|| "unknown".into()),
            None => "unknown".into(),
        };
        let settings = ContainerSettings::inspected(&c);
        let workspace_bytes = if state == "running" {
            self.workspace_bytes(name, &settings.user).await
        } else {
            None
        };
        Ok(Some(ContainerFacts {
            daemon: self.host.clone(),
            container: cname,
            id: c.id.clone().unwrap_or_default(),
            state,
            settings,
            size_rw: c.size_rw,
            size_root_fs: c.size_root_fs,
            volumes: vec![
                self.names.workspace_volume(name),
                self.names.state_volume(name),
            ],
            workspace_bytes,
        }))
    }

    /// The workspace's size, measured in the running container; `None` when
    /// it cannot be (the measure is a help, not a claim).
    async fn workspace_bytes(&self, name: &str, user: &str) -> Option<u64> {
        let user = config::SandboxUser::parse(user).ok()?;
        let sb = super::DockerSandbox::new(self, name, Default::default(), user);
        let argv = ["du", "-sxb", super::WORKDIR].map(String::from);
        let c = berth_core::backend::run_to_end(
            &sb,
            &argv,
            None,
            4096,
            std::time::Duration::from_secs(30),
        )
        .await
        .ok()?;
        String::from_utf8_lossy(&c.stdout)
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }
}

/// The error for a container whose settings are not its spec's: berth never
/// runs a sandbox with settings other than the ones on record.
pub(crate) fn mismatch(name: &str, diff: &[String]) -> Error {
    Error::InvalidInput(format!(
        "sandbox `{name}`: its container does not have the settings berth has on record for it:\n  {}\nberth does not run it with other settings than its own. `berth sandbox inspect {name} -b docker` shows both; to make a container with the recorded settings on the same workspace, `berth sandbox rm {name} -b docker --keep-workspace` and `berth sandbox create {name} -b docker` with the settings you want",
        diff.join("\n  ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_settings_read_like_inspected_ones() -> Result<()> {
        let mut spec = SandboxSpec::named("t");
        spec.network = berth_core::backend::Network::Open;
        spec.limits.memory_mb = Some(300);
        spec.limits.milli_cpu = Some(500);
        spec.limits.pids = Some(64);
        spec.options.insert("user".into(), "root".into());
        spec.options
            .insert("cap_add".into(), "setuid,CAP_CHOWN,dac_override".into());
        let plan = ContainerPlan::from_spec(&spec)?;
        let s = ContainerSettings::planned(&spec, &plan);
        assert_eq!(s.network, "bridge");
        assert_eq!(s.memory_mb, Some(300));
        assert_eq!(s.milli_cpu, Some(500));
        assert_eq!(s.pids, Some(64));
        assert_eq!(s.user, "0:0");
        assert_eq!(s.cap_add, ["CHOWN", "DAC_OVERRIDE", "SETUID"]);
        let plain = ContainerPlan::from_spec(&SandboxSpec::named("t"))?;
        let d = differences(
            &ContainerSettings::planned(&SandboxSpec::named("t"), &plain),
            &s,
        )
        .join("\n");
        assert!(
            d.contains("network: the container has bridge, the spec none"),
            "{d}"
        );
        assert!(d.contains("user: the container has 0:0, the spec 1000:1000"));
        Ok(())
    }
}
