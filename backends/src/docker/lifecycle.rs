//! Sandbox lifecycle: provision (attach, start or recreate), list, remove, gc.
//!
//! A sandbox `NAME` of installation `I` is the container `berth-I-NAME` plus the
//! volumes `berth-I-NAME-workspace` and `berth-I-NAME-state`, all labelled with
//! `I`. The container is disposable; the volumes are what survive a killed
//! container: a later `provision` brings the workspace and the session snapshot
//! back. Removing the sandbox removes its state volume too (a new sandbox of the
//! same name starts fresh), and its workspace unless asked to keep it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use berth_core::backend::{Backend, Provisioned, RemoveOpts, SandboxInfo, SandboxSpec};
use berth_core::error::{Error, Result};
use bollard::Docker;
use bollard::models::VolumeCreateRequest;
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use tracing::{debug, info};

use super::config::{self, ContainerPlan};
use super::inspect::{self, ContainerSettings};
use super::{
    DockerBackend, DockerSandbox, KIND, LABEL_INSTALLATION, LABEL_SANDBOX, Names, api_error,
    failure_of, status_of, unreachable,
};

/// What [`DockerBackend::gc`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Sandboxes whose containers were removed.
    pub removed: Vec<String>,
    /// Orphaned volumes removed: this installation's volumes whose sandbox has
    /// no container and is not kept.
    pub removed_volumes: Vec<String>,
    /// berth containers left alone (running, or too young).
    pub kept: usize,
}

/// What `provision` found under the sandbox's name: its state, and the
/// settings the engine has for it.
enum Found {
    Running(ContainerSettings),
    Paused(ContainerSettings),
    Stopped(String, ContainerSettings),
    Missing,
}

impl DockerBackend {
    async fn find(&self, name: &str) -> Result<Found> {
        let cname = self.names.container(name);
        match self.docker.inspect_container(&cname, None).await {
            Ok(c) => {
                let labels = c.config.as_ref().and_then(|c| c.labels.as_ref());
                let ours = labels.is_some_and(|l| {
                    l.get(LABEL_SANDBOX).is_some_and(|s| s == name)
                        && l.get(LABEL_INSTALLATION)
                            .is_some_and(|i| i == self.names.installation())
                });
                if !ours {
                    return Err(Error::InvalidInput(format!(
                        "a container named `{cname}` exists but this berth installation did not create it (no {LABEL_SANDBOX}={name} and {} labels); rename or remove it, or choose another sandbox name",
                        self.names.filter()
                    )));
                }
                let settings = ContainerSettings::inspected(&c);
                let state = c.state.unwrap_or_default();
                if state.paused == Some(true) {
                    return Ok(Found::Paused(settings));
                }
                if state.running == Some(true) {
                    return Ok(Found::Running(settings));
                }
                let status = state
                    .status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "unknown".into());
                let how = match state.exit_code {
                    Some(code) if status == "exited" => {
                        format!("its container had exited (code {code})")
                    }
                    _ => format!("its container was {status}"),
                };
                Ok(Found::Stopped(how, settings))
            }
            Err(e) if status_of(&e) == Some(404) => Ok(Found::Missing),
            Err(e) => Err(api_error(&self.host, name, "inspecting the container", e)),
        }
    }

    /// Whether `volume` exists; one with the name but not this installation's
    /// labels is refused, never mounted.
    async fn volume_exists(&self, volume: &str, sandbox: &str) -> Result<bool> {
        match self.docker.inspect_volume(volume).await {
            Ok(v) => {
                let want = self.names.labels(sandbox);
                if want.iter().any(|(k, val)| v.labels.get(k) != Some(val)) {
                    return Err(Error::InvalidInput(format!(
                        "a volume named `{volume}` exists but this berth installation did not create it (labels {:?}); remove it, or choose another sandbox name",
                        v.labels
                    )));
                }
                Ok(true)
            }
            Err(e) if status_of(&e) == Some(404) => Ok(false),
            Err(e) => Err(api_error(&self.host, volume, "inspecting a volume", e)),
        }
    }

    async fn create_volumes(&self, name: &str) -> Result<()> {
        for volume in [
            self.names.workspace_volume(name),
            self.names.state_volume(name),
        ] {
            // Never mount a same-named volume of another installation.
            self.volume_exists(&volume, name).await?;
            let req = VolumeCreateRequest {
                name: Some(volume.clone()),
                labels: Some(self.names.labels(name)),
                ..Default::default()
            };
            // Creating a volume that exists returns it unchanged.
            self.docker
                .create_volume(req)
                .await
                .map_err(|e| api_error(&self.host, name, "creating its volume", e))?;
        }
        Ok(())
    }

    async fn create_container(&self, spec: &SandboxSpec, plan: &ContainerPlan) -> Result<()> {
        let image = match &spec.image {
            Some(image) => {
                check_image(&self.docker, &self.host, image).await?;
                image.clone()
            }
            None => self.ensure_image().await?,
        };
        self.create_volumes(&spec.name).await?;
        let body = config::container_body(spec, plan, &image, &self.names);
        let opts = CreateContainerOptions {
            name: Some(self.names.container(&spec.name)),
            ..Default::default()
        };
        match self.docker.create_container(Some(opts), body).await {
            Ok(r) => {
                debug!(sandbox = %spec.name, id = %r.id, "created container");
                Ok(())
            }
            // Another provision of the same name won the race; use its container.
            Err(e) if status_of(&e) == Some(409) => Ok(()),
            Err(e) => Err(api_error(
                &self.host,
                &spec.name,
                "creating its container",
                e,
            )),
        }
    }

    async fn start(&self, name: &str) -> Result<()> {
        match self
            .docker
            .start_container(&self.names.container(name), None)
            .await
        {
            Ok(()) => Ok(()),
            // Already running.
            Err(e) if status_of(&e) == Some(304) => Ok(()),
            Err(e) => Err(api_error(&self.host, name, "starting its container", e)),
        }
    }

    /// Remove berth's exited, dead or never-started containers that stopped more
    /// than `older_than` ago. Volumes are kept: `provision` brings the sandbox
    /// back on them, and `remove` with volumes deletes them for good.
    pub async fn gc(&self, older_than: Duration) -> Result<GcReport> {
        self.gc_where(older_than, |_| true).await
    }

    /// [`gc`](Self::gc), limited to the sandboxes whose names pass `select`.
    pub async fn gc_where(
        &self,
        older_than: Duration,
        select: impl Fn(&str) -> bool + Send,
    ) -> Result<GcReport> {
        let now = berth_core::backend::now_unix_secs();
        let cutoff = now - older_than.as_secs().min(i64::MAX as u64) as i64;
        let mut report = GcReport::default();
        for c in self.berth_containers().await? {
            let name = label_name(&c.labels);
            if !select(&name) {
                continue;
            }
            let id = c.id.clone().unwrap_or_default();
            let state = c.state.map(|s| s.to_string()).unwrap_or_default();
            if !matches!(state.as_str(), "exited" | "dead" | "created") {
                report.kept += 1;
                continue;
            }
            // When it stopped, or when it was created if it never ran.
            let stopped = match self.docker.inspect_container(&id, None).await {
                Ok(i) => i
                    .state
                    .and_then(|s| s.finished_at)
                    .and_then(|t| parse_rfc3339(&t))
                    .filter(|t| *t > 0)
                    .or(c.created),
                Err(e) if status_of(&e) == Some(404) => continue,
                Err(e) => return Err(api_error(&self.host, &name, "inspecting the container", e)),
            };
            if stopped.unwrap_or(now) > cutoff {
                report.kept += 1;
                continue;
            }
            match self
                .docker
                .remove_container(&id, Some(force_remove()))
                .await
            {
                Ok(()) => {
                    info!(sandbox = %name, %id, "gc removed container");
                    report.removed.push(name);
                }
                Err(e) if status_of(&e) == Some(404) => {}
                Err(e) => return Err(api_error(&self.host, &name, "removing the container", e)),
            }
        }
        Ok(report)
    }

    /// Remove this installation's orphaned volumes: those whose sandbox has no
    /// container and for which `known` (the sandboxes on record) says no. A
    /// state volume is useless without its sandbox; a workspace volume may be
    /// one kept on purpose (`sandbox rm --keep-workspace`), so it goes only
    /// with `workspaces`. Returns the volumes removed.
    pub async fn gc_volumes(
        &self,
        known: impl Fn(&str) -> bool + Send,
        workspaces: bool,
    ) -> Result<Vec<String>> {
        let with_container: std::collections::HashSet<String> = self
            .berth_containers()
            .await?
            .iter()
            .map(|c| label_name(&c.labels))
            .collect();
        let opts = bollard::query_parameters::ListVolumesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![self.names.filter()],
            )])),
        };
        let listed = self
            .docker
            .list_volumes(Some(opts))
            .await
            .map_err(|e| api_error(&self.host, "-", "listing volumes", e))?;
        let mut removed = Vec::new();
        for v in listed.volumes.unwrap_or_default() {
            let Some(sandbox) = v.labels.get(LABEL_SANDBOX).cloned() else {
                continue;
            };
            if with_container.contains(&sandbox) || known(&sandbox) {
                continue;
            }
            let is_state = v.name == self.names.state_volume(&sandbox);
            let is_workspace = v.name == self.names.workspace_volume(&sandbox);
            if (is_state || (workspaces && is_workspace))
                && remove_volume(&self.docker, &self.host, &sandbox, &v.name).await?
            {
                info!(sandbox = %sandbox, volume = %v.name, "gc removed orphaned volume");
                removed.push(v.name);
            }
        }
        removed.sort();
        Ok(removed)
    }

    async fn berth_containers(&self) -> Result<Vec<bollard::models::ContainerSummary>> {
        let opts = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![self.names.filter()],
            )])),
            ..Default::default()
        };
        self.docker.list_containers(Some(opts)).await.map_err(|e| {
            if super::is_connection_error(&e) {
                unreachable(&self.host, e)
            } else {
                Error::backend_call(KIND, failure_of(&e), "listing berth's containers failed", e)
            }
        })
    }
}

#[async_trait]
impl Backend for DockerBackend {
    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Docker
    }

    fn network_door(&self) -> std::result::Result<(), String> {
        // `network_mode: none`, the door's directory bind-mounted, and a
        // relay inside on 127.0.0.1:3128 (`config::container_body`).
        Ok(())
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        config::check_name(&spec.name)?;
        let plan = ContainerPlan::from_spec(spec)?;
        let name = spec.name.as_str();
        let mut created = false;
        let mut recreated = None;
        let found = self.find(name).await?;
        // A container is used only with the settings its spec gives: one
        // that differs is refused, never attached to, started or unpaused.
        if let Found::Running(has) | Found::Paused(has) | Found::Stopped(_, has) = &found {
            let diff = inspect::differences(&ContainerSettings::planned(spec, &plan), has);
            if !diff.is_empty() {
                return Err(inspect::mismatch(name, &diff));
            }
        }
        match found {
            Found::Running(_) => {}
            Found::Paused(_) => {
                self.docker
                    .unpause_container(&self.names.container(name))
                    .await
                    .map_err(|e| api_error(&self.host, name, "unpausing its container", e))?;
                recreated = Some("its container was paused; it was unpaused".to_string());
            }
            Found::Stopped(how, _) => {
                info!(sandbox = %name, %how, "starting stopped container");
                match self.start(name).await {
                    Ok(()) => recreated = Some(format!("{how}; it was started again")),
                    Err(e) => {
                        // A container that cannot start (its image or a mount is
                        // gone) is replaced; the volumes carry the state over.
                        info!(sandbox = %name, error = %e, "replacing container that will not start");
                        remove_container(&self.docker, &self.host, &self.names, name).await?;
                        self.create_container(spec, &plan).await?;
                        self.start(name).await?;
                        recreated = Some(format!(
                            "{how} and could not be started ({e}); it was recreated on its volumes"
                        ));
                    }
                }
            }
            Found::Missing => {
                let had_volume = self
                    .volume_exists(&self.names.workspace_volume(name), name)
                    .await?;
                self.create_container(spec, &plan).await?;
                self.start(name).await?;
                if had_volume {
                    recreated = Some(
                        "its container was gone; a new one was created on its existing volumes"
                            .to_string(),
                    );
                } else {
                    created = true;
                }
            }
        }
        let sandbox = DockerSandbox::new(self, name, spec.env.clone(), plan.user);
        Ok(Provisioned {
            sandbox: Arc::new(sandbox),
            created,
            recreated,
        })
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let mut out: Vec<SandboxInfo> = self
            .berth_containers()
            .await?
            .into_iter()
            .map(|c| SandboxInfo {
                name: label_name(&c.labels),
                id: c.id.unwrap_or_default(),
                state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                created_unix: c.created,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn remove(&self, name: &str, opts: RemoveOpts) -> Result<()> {
        config::check_name(name)?;
        let found =
            remove_sandbox(&self.docker, &self.host, &self.names, name, opts.volumes).await?;
        if found {
            Ok(())
        } else {
            Err(Error::NotFound {
                what: "sandbox",
                name: name.into(),
                hint: "list sandboxes with `berth sandbox ls --backend docker`".into(),
            })
        }
    }
}

fn force_remove() -> RemoveContainerOptions {
    RemoveContainerOptions {
        force: true,
        ..Default::default()
    }
}

/// Remove the sandbox's container and its state volume (the session snapshot
/// belongs to this sandbox alone: a new one of the same name must not restore
/// it), and with `volumes` its workspace volume too. Returns whether anything
/// existed.
pub(crate) async fn remove_sandbox(
    docker: &Docker,
    host: &str,
    names: &Names,
    name: &str,
    volumes: bool,
) -> Result<bool> {
    let mut found = remove_container(docker, host, names, name).await?;
    let mut doomed = vec![names.state_volume(name)];
    if volumes {
        doomed.push(names.workspace_volume(name));
    }
    for volume in doomed {
        found |= remove_volume(docker, host, name, &volume).await?;
    }
    Ok(found)
}

/// Remove one volume. Returns whether it existed.
async fn remove_volume(docker: &Docker, host: &str, name: &str, volume: &str) -> Result<bool> {
    match docker
        .remove_volume(
            volume,
            None::<bollard::query_parameters::RemoveVolumeOptions>,
        )
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if status_of(&e) == Some(404) => Ok(false),
        Err(e) => Err(api_error(host, name, "removing its volume", e)),
    }
}

/// Remove the sandbox's container, whatever its state. Returns whether it existed.
pub(crate) async fn remove_container(
    docker: &Docker,
    host: &str,
    names: &Names,
    name: &str,
) -> Result<bool> {
    match docker
        .remove_container(&names.container(name), Some(force_remove()))
        .await
    {
        Ok(()) => Ok(true),
        Err(e) if status_of(&e) == Some(404) => Ok(false),
        Err(e) => Err(api_error(host, name, "removing its container", e)),
    }
}

/// A caller-chosen image must exist: this engine may have no registry to pull from.
async fn check_image(docker: &Docker, host: &str, image: &str) -> Result<()> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(()),
        Err(e) if status_of(&e) == Some(404) => Err(Error::NotFound {
            what: "image",
            name: image.into(),
            hint: "berth does not pull images; build or load it first (`berth image build` builds the default sandbox image), or leave the image unset".into(),
        }),
        Err(e) if super::is_connection_error(&e) => Err(unreachable(host, e)),
        Err(e) => Err(Error::backend_call(
            KIND,
            failure_of(&e),
            format!("inspecting image {image} failed"),
            e,
        )),
    }
}

fn label_name(labels: &Option<HashMap<String, String>>) -> String {
    labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SANDBOX))
        .cloned()
        .unwrap_or_default()
}

/// Seconds since the epoch of a Docker timestamp (`2024-05-01T12:34:56.789Z`).
/// Docker's zero time (`0001-01-01T00:00:00Z`) comes out negative.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let num = |r: std::ops::Range<usize>| -> Option<i64> { s.get(r)?.parse().ok() };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_docker_timestamps() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2024-05-01T12:34:56.789012345Z"),
            Some(1_714_566_896)
        );
        assert!(parse_rfc3339("0001-01-01T00:00:00Z").is_some_and(|t| t < 0));
        assert_eq!(parse_rfc3339("garbage"), None);
    }
}
