//! Sandbox lifecycle: provision (re-attach or create), list, remove.
//!
//! A berth sandbox `NAME` is the running Modal sandbox named `NAME` in berth's
//! app (`berth`, or `BERTH_MODAL_APP`: [`crate::ModalSettings`]), tagged
//! `berth.managed=1` and `berth.sandbox=NAME`. Modal keeps the name while the
//! sandbox runs, so after a berth restart `SandboxGetFromName` finds it again;
//! the tags are how `list` finds all of them. A sandbox that ended is gone for
//! good (its filesystem with it): the next provision creates a new one and
//! says so.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use berth_core::backend::{
    Backend, Layout, Provisioned, RemoveOpts, SandboxInfo, SandboxSpec, check_sandbox_name,
    run_to_end,
};
use berth_core::error::{BackendFailure, Error, Result};
use futures::StreamExt;
use tokio::sync::OnceCell;
use tonic::Code;

use super::auth::Resolved;
use super::client::{ControlPlane, status_error};
use super::proto::client::generic_result::GenericStatus;
use super::proto::client::{
    AppGetOrCreateRequest, EnvironmentGetOrCreateRequest, Image, ImageGetOrCreateRequest,
    ImageJoinStreamingRequest, ObjectCreationType, Resources, Sandbox as SandboxDef,
    SandboxCreateRequest, SandboxGetFromNameRequest, SandboxGetTaskIdRequest, SandboxListRequest,
    SandboxTag, SandboxTerminateRequest, SandboxWaitRequest, StringMap,
};
use super::router::Router;
use super::{
    DEFAULT_IMAGE, DEFAULT_TIMEOUT_SECS, KIND, ModalSandbox, SandboxInner, TAG_MANAGED,
    TAG_SANDBOX, ended, status_name,
};
use crate::ModalSettings;

/// How long a new sandbox may take to be scheduled and start.
const START_DEADLINE: Duration = Duration::from_secs(10 * 60);
/// How long an image build may take.
const BUILD_DEADLINE: Duration = Duration::from_secs(30 * 60);
/// The image builder version when neither the settings nor the environment name one.
const FALLBACK_BUILDER_VERSION: &str = "2024.10";
/// Finds (and makes) the sandbox user's home, where berth keeps the workspace
/// and its own state; prints the home.
const LAYOUT_PROBE: &str =
    r#"h=${HOME:-/root}; mkdir -p "$h/workspace" "$h/.berth" && cd "$h" && pwd -P"#;

/// The modal backend.
pub struct ModalBackend {
    settings: ModalSettings,
    control: OnceCell<Arc<ControlPlane>>,
    app_id: OnceCell<String>,
    builder_version: OnceCell<String>,
}

impl ModalBackend {
    /// A backend with these settings. Nothing is contacted until it is used,
    /// and missing credentials are reported then.
    pub fn new(settings: ModalSettings) -> Self {
        Self {
            settings,
            control: OnceCell::new(),
            app_id: OnceCell::new(),
            builder_version: OnceCell::new(),
        }
    }

    /// The control-plane connection, opened on first use.
    pub async fn control(&self) -> Result<Arc<ControlPlane>> {
        self.control
            .get_or_try_init(|| async {
                let cfg = Resolved::from_settings(&self.settings)?;
                Ok::<_, Error>(Arc::new(ControlPlane::connect(cfg)?))
            })
            .await
            .cloned()
    }

    fn tags(name: &str) -> Vec<SandboxTag> {
        vec![
            SandboxTag {
                tag_name: TAG_MANAGED.into(),
                tag_value: "1".into(),
            },
            SandboxTag {
                tag_name: TAG_SANDBOX.into(),
                tag_value: name.into(),
            },
        ]
    }

    async fn app_id(&self, cp: &ControlPlane) -> Result<String> {
        self.app_id
            .get_or_try_init(|| async {
                let req = AppGetOrCreateRequest {
                    app_name: cp.cfg.app.clone(),
                    environment_name: cp.cfg.environment.clone(),
                    object_creation_type: ObjectCreationType::CreateIfMissing as i32,
                };
                let r = cp
                    .call("AppGetOrCreate", req, |mut c, r| async move {
                        c.app_get_or_create(r).await
                    })
                    .await?;
                Ok::<_, Error>(r.app_id)
            })
            .await
            .cloned()
    }

    async fn builder_version(&self, cp: &ControlPlane) -> String {
        if let Some(v) = &self.settings.image_builder_version {
            return v.clone();
        }
        self.builder_version
            .get_or_init(|| async {
                let req = EnvironmentGetOrCreateRequest {
                    deployment_name: cp.cfg.environment.clone(),
                    object_creation_type: ObjectCreationType::Unspecified as i32,
                };
                let r = cp
                    .unary("EnvironmentGetOrCreate", req, |mut c, r| async move {
                        c.environment_get_or_create(r).await
                    })
                    .await;
                r.ok()
                    .and_then(|r| r.metadata)
                    .and_then(|m| m.settings)
                    .map(|s| s.image_builder_version)
                    .filter(|v| !v.is_empty())
                    .unwrap_or_else(|| FALLBACK_BUILDER_VERSION.to_string())
            })
            .await
            .clone()
    }

    /// Build (or find) the image and wait for its build to finish.
    async fn image_id(&self, cp: &ControlPlane, app_id: &str, image: &str) -> Result<String> {
        let req = ImageGetOrCreateRequest {
            image: Some(Image {
                base_images: vec![],
                dockerfile_commands: vec![format!("FROM {image}")],
            }),
            app_id: app_id.to_string(),
            builder_version: self.builder_version(cp).await,
            ..ImageGetOrCreateRequest::default()
        };
        let r = cp
            .call("ImageGetOrCreate", req, |mut c, r| async move {
                c.image_get_or_create(r).await
            })
            .await?;
        let mut result = r.result.filter(|r| r.status != 0);
        let image_id = r.image_id;
        let deadline = Instant::now() + BUILD_DEADLINE;
        let mut last_entry_id = String::new();
        let mut breaks = 0u32;
        while result.is_none() {
            if Instant::now() > deadline {
                return Err(Error::backend(
                    KIND,
                    BackendFailure::Timeout,
                    format!(
                        "image `{image}` ({image_id}) did not finish building within {} minutes",
                        BUILD_DEADLINE.as_secs() / 60
                    ),
                ));
            }
            let req = ImageJoinStreamingRequest {
                image_id: image_id.clone(),
                timeout: 55.0,
                last_entry_id: last_entry_id.clone(),
                include_logs_for_finished: false,
            };
            let opened = cp
                .stream("ImageJoinStreaming", req, |mut c, r| async move {
                    c.image_join_streaming(r).await
                })
                .await;
            let mut stream = match opened {
                Ok(s) => s,
                Err(s)
                    if super::client::retryable(s.code())
                        && breaks < super::client::MAX_RETRIES =>
                {
                    breaks += 1;
                    tokio::time::sleep(super::client::backoff(breaks)).await;
                    continue;
                }
                Err(s) => return Err(status_error(&cp.cfg, "ImageJoinStreaming", s)),
            };
            while let Some(item) = stream.next().await {
                match item {
                    Ok(m) => {
                        if !m.entry_id.is_empty() {
                            last_entry_id = m.entry_id;
                        }
                        if let Some(r) = m.result.filter(|r| r.status != 0) {
                            result = Some(r);
                            break;
                        }
                        if m.eof {
                            break;
                        }
                    }
                    // The build goes on server-side; join again where we were.
                    Err(s) if super::client::retryable(s.code()) => {
                        breaks += 1;
                        if breaks > super::client::MAX_RETRIES {
                            return Err(status_error(&cp.cfg, "ImageJoinStreaming", s));
                        }
                        break;
                    }
                    Err(s) => return Err(status_error(&cp.cfg, "ImageJoinStreaming", s)),
                }
            }
        }
        match result {
            Some(r) if r.status == GenericStatus::Success as i32 => Ok(image_id),
            Some(r) => Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "building image `{image}` failed ({}): {}",
                    status_name(r.status),
                    r.exception
                ),
            )),
            None => Err(Error::backend(
                KIND,
                BackendFailure::Protocol,
                format!("building image `{image}` ended without a result"),
            )),
        }
    }

    /// The id of the running sandbox called `name`, if there is one.
    async fn lookup(&self, cp: &ControlPlane, name: &str) -> Result<Option<String>> {
        let req = SandboxGetFromNameRequest {
            sandbox_name: name.to_string(),
            environment_name: cp.cfg.environment.clone(),
            app_name: cp.cfg.app.clone(),
            include_terminated: false,
        };
        match cp
            .unary("SandboxGetFromName", req, |mut c, r| async move {
                c.sandbox_get_from_name(r).await
            })
            .await
        {
            Ok(r) if !r.sandbox_id.is_empty() => Ok(Some(r.sandbox_id)),
            Ok(_) => Ok(None),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(status_error(&cp.cfg, "SandboxGetFromName", s)),
        }
    }

    /// berth's sandboxes in the app, optionally only those tagged with `name`.
    async fn find(
        &self,
        cp: &ControlPlane,
        name: Option<&str>,
        include_finished: bool,
    ) -> Result<Vec<super::proto::client::SandboxInfo>> {
        let app_id = self.app_id(cp).await?;
        let mut tags = Self::tags(name.unwrap_or_default());
        if name.is_none() {
            tags.truncate(1);
        }
        let mut out = Vec::new();
        let mut seen = HashSet::new();
        let mut before = 0.0f64;
        // Pages come newest first; each asks for those created before the last.
        loop {
            let req = SandboxListRequest {
                app_id: app_id.clone(),
                before_timestamp: before,
                environment_name: cp.cfg.environment.clone(),
                include_finished,
                tags: tags.clone(),
            };
            let r = cp
                .call("SandboxList", req, |mut c, r| async move {
                    c.sandbox_list(r).await
                })
                .await?;
            let mut fresh = false;
            for s in r.sandboxes {
                if seen.insert(s.id.clone()) {
                    fresh = true;
                    before = if before == 0.0 {
                        s.created_at
                    } else {
                        before.min(s.created_at)
                    };
                    out.push(s);
                }
            }
            if !fresh || before <= 0.0 {
                return Ok(out);
            }
        }
    }

    /// The task running sandbox `id`, waiting for it to be scheduled.
    async fn task_id(&self, cp: &ControlPlane, name: &str, id: &str) -> Result<String> {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            let req = SandboxGetTaskIdRequest {
                sandbox_id: id.to_string(),
                timeout: Some(55.0),
                wait_until_ready: false,
            };
            let r = cp
                .unary("SandboxGetTaskId", req, |mut c, r| async move {
                    c.sandbox_get_task_id(r).await
                })
                .await;
            match r {
                Ok(r) => {
                    if let Some(res) = r.task_result.filter(|r| r.status != 0) {
                        return Err(ended(name, &res));
                    }
                    if let Some(t) = r.task_id.filter(|t| !t.is_empty()) {
                        return Ok(t);
                    }
                }
                Err(s) if s.code() == Code::NotFound => {
                    return Err(super::gone(name, &format!("Modal has no sandbox {id}")));
                }
                Err(s) => return Err(status_error(&cp.cfg, "SandboxGetTaskId", s)),
            }
            if Instant::now() > deadline {
                return Err(Error::backend(
                    KIND,
                    BackendFailure::Timeout,
                    format!(
                        "sandbox `{name}` ({id}) was not scheduled within {} minutes",
                        START_DEADLINE.as_secs() / 60
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Create the sandbox; returns its id.
    async fn create(&self, cp: &ControlPlane, spec: &SandboxSpec) -> Result<String> {
        let app_id = self.app_id(cp).await?;
        let image = spec
            .image
            .clone()
            .unwrap_or_else(|| DEFAULT_IMAGE.to_string());
        let image_id = self.image_id(cp, &app_id, &image).await?;
        let num = |k: &str| -> Result<Option<u32>> {
            spec.option(k)
                .map(|v| {
                    v.parse::<u32>().map_err(|_| {
                        Error::InvalidInput(format!(
                            "modal: option `{k}` must be a number of seconds, got {v:?}"
                        ))
                    })
                })
                .transpose()
        };
        let clamp = |v: Option<u64>| v.map(|v| u32::try_from(v).unwrap_or(u32::MAX));
        use super::proto::client::{NetworkAccess, network_access};
        let def = SandboxDef {
            entrypoint_args: vec!["sleep".into(), "infinity".into()],
            image_id,
            resources: Some(Resources {
                memory_mb: clamp(spec.limits.memory_mb).unwrap_or(0),
                milli_cpu: clamp(spec.limits.milli_cpu).unwrap_or(0),
            }),
            timeout_secs: num("timeout")?.unwrap_or(DEFAULT_TIMEOUT_SECS),
            workdir: None,
            // With an allow-list, Modal's list decides; without, the
            // sandbox is open or blocked.
            block_network: !spec.network.is_open() && spec.allow_list.is_none(),
            network_access: spec.allow_list.as_ref().map(|l| NetworkAccess {
                network_access_type: network_access::NetworkAccessType::Allowlist as i32,
                allowed_cidrs: l.nets.clone(),
                allowed_domains: l.names.clone(),
            }),
            name: Some(spec.name.clone()),
            idle_timeout_secs: num("idle_timeout")?,
            environment_variables: Some(StringMap {
                contents: spec.env.clone().into_iter().collect(),
            }),
        };
        let req = SandboxCreateRequest {
            app_id,
            definition: Some(def),
            environment_name: cp.cfg.environment.clone(),
            tags: Self::tags(&spec.name),
        };
        match cp
            .unary("SandboxCreate", req, |mut c, r| async move {
                c.sandbox_create(r).await
            })
            .await
        {
            Ok(r) => Ok(r.sandbox_id),
            // Another provision of the same name won the race: use its sandbox.
            Err(s) if s.code() == Code::AlreadyExists => self
                .lookup(cp, &spec.name)
                .await?
                .ok_or_else(|| Error::backend(KIND, BackendFailure::Rejected, format!(
                        "sandbox `{}`: Modal says the name is taken, but no running sandbox has it",
                        spec.name
                    ))),
            Err(s) => Err(status_error(&cp.cfg, "SandboxCreate", s)),
        }
    }

    /// A handle on a running sandbox: router access and berth's directories.
    async fn attach(
        &self,
        cp: &Arc<ControlPlane>,
        name: &str,
        id: &str,
        env: BTreeMap<String, String>,
    ) -> Result<ModalSandbox> {
        let task = self.task_id(cp, name, id).await?;
        let router = Router::connect(cp.clone(), &task).await?;
        let inner = Arc::new(SandboxInner {
            name: name.to_string(),
            sandbox_id: id.to_string(),
            router,
        });
        let provisional = Layout {
            workdir: "/".into(),
            berth_dir: "/".into(),
        };
        let sb = ModalSandbox::new(inner, provisional, env.clone());
        let probe = ["sh", "-c", LAYOUT_PROBE].map(String::from);
        let c = run_to_end(&sb, &probe, None, 4096, Duration::from_secs(60)).await?;
        let home = String::from_utf8_lossy(&c.stdout).trim().to_string();
        if c.status.code != Some(0) || !home.starts_with('/') {
            return Err(Error::backend(
                KIND,
                BackendFailure::Rejected,
                format!(
                    "sandbox `{name}`: cannot prepare berth's directories under the home directory ({}): {}",
                    c.status.shell_code(),
                    String::from_utf8_lossy(&c.stderr).trim()
                ),
            ));
        }
        let home = home.trim_end_matches('/');
        Ok(ModalSandbox::new(
            sb.inner,
            Layout {
                workdir: format!("{home}/workspace"),
                berth_dir: format!("{home}/.berth"),
            },
            env,
        ))
    }
}

/// Terminate sandbox `id` and wait (briefly) until Modal reports it ended.
pub(crate) async fn terminate(cp: &ControlPlane, id: &str) -> Result<()> {
    let req = SandboxTerminateRequest {
        sandbox_id: id.to_string(),
    };
    match cp
        .unary("SandboxTerminate", req, |mut c, r| async move {
            c.sandbox_terminate(r).await
        })
        .await
    {
        Ok(_) => {}
        Err(s) if s.code() == Code::NotFound => return Ok(()),
        Err(s) => return Err(status_error(&cp.cfg, "SandboxTerminate", s)),
    }
    let req = SandboxWaitRequest {
        sandbox_id: id.to_string(),
        timeout: 10.0,
    };
    match cp
        .unary("SandboxWait", req, |mut c, r| async move {
            c.sandbox_wait(r).await
        })
        .await
    {
        Ok(_) => Ok(()),
        Err(s) if s.code() == Code::NotFound => Ok(()),
        Err(s) => Err(status_error(&cp.cfg, "SandboxWait", s)),
    }
}

/// What Modal's allow-list cannot promise that berth's proxy does.
pub const NATIVE_LIMITS: &str = "Modal filters by its own outbound allow-list (domains and CIDR \
blocks, no ports): a name allowed here is judged by name, not by the address connected to; the \
list is fixed when the sandbox is made (berth does not change it while it runs); connections are \
not asked about, not reported as berth events, and get no credentials from berth";

#[async_trait]
impl Backend for ModalBackend {
    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::Modal
    }

    fn network_door(&self) -> std::result::Result<(), String> {
        Err(
            "Modal holds `--network allow:` rules with its own allow-list, not berth's proxy"
                .into(),
        )
    }

    fn native_allow_list(&self) -> Option<(&'static str, &'static str)> {
        Some(("Modal", NATIVE_LIMITS))
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        check_sandbox_name(&spec.name)?;
        let cp = self.control().await?;
        let mut recreated = None;
        if let Some(id) = self.lookup(&cp, &spec.name).await? {
            match self.attach(&cp, &spec.name, &id, spec.env.clone()).await {
                Ok(sb) => {
                    tracing::debug!(sandbox = %spec.name, id, "re-attached to the running Modal sandbox");
                    return Ok(Provisioned {
                        sandbox: Arc::new(sb),
                        created: false,
                        recreated: None,
                    });
                }
                Err(e @ Error::SandboxGone { .. }) => recreated = Some(e.to_string()),
                Err(e) => return Err(e),
            }
        } else {
            // A sandbox of this name that ended is news: its files are gone.
            let old = self.find(&cp, Some(&spec.name), true).await?;
            if let Some(s) = old.first() {
                let result = s.task_info.as_ref().and_then(|t| t.result.clone());
                recreated = Some(match result {
                    Some(r) => ended(&spec.name, &r).to_string(),
                    None => format!("the Modal sandbox {} is no longer running", s.id),
                });
            }
        }
        let id = self.create(&cp, spec).await?;
        let sb = self.attach(&cp, &spec.name, &id, spec.env.clone()).await?;
        tracing::info!(sandbox = %spec.name, id, task = %sb.task_id(), "created a Modal sandbox");
        Ok(Provisioned {
            sandbox: Arc::new(sb),
            created: recreated.is_none(),
            recreated,
        })
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let cp = self.control().await?;
        let found = self.find(&cp, None, false).await?;
        Ok(found
            .into_iter()
            .map(|s| {
                let name = s
                    .tags
                    .iter()
                    .find(|t| t.tag_name == TAG_SANDBOX)
                    .map(|t| t.tag_value.clone())
                    .unwrap_or_else(|| s.name.clone());
                let result = s.task_info.as_ref().and_then(|t| t.result.as_ref());
                let state = match result.filter(|r| r.status != 0) {
                    Some(r) => status_name(r.status).to_lowercase(),
                    None => "running".into(),
                };
                SandboxInfo {
                    name,
                    id: s.id,
                    state,
                    created_unix: (s.created_at > 0.0).then_some(s.created_at as i64),
                }
            })
            .collect())
    }

    async fn remove(&self, name: &str, _opts: RemoveOpts) -> Result<()> {
        check_sandbox_name(name)?;
        let cp = self.control().await?;
        match self.lookup(&cp, name).await? {
            Some(id) => terminate(&cp, &id).await,
            None => Err(Error::NotFound {
                what: "sandbox",
                name: name.into(),
                hint: "list sandboxes with `berth sandbox ls --backend modal`".into(),
            }),
        }
    }
}
