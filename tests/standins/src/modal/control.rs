//! `modal.client.ModalClient`: apps, images, sandboxes, tokens.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::pb::client::Sandbox as Sandbox_;
use super::pb::client::generic_result::GenericStatus;
use super::pb::client::modal_client_server::ModalClient;
use super::pb::client::*;
use super::sandbox::Sandbox;
use super::{BUILDER_VERSION, State, clamp_wait, now_secs};

/// The control-plane service.
pub struct Control(pub Arc<State>);

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn success() -> GenericResult {
    GenericResult {
        status: GenericStatus::Success as i32,
        ..GenericResult::default()
    }
}

fn info(sb: &Sandbox) -> SandboxInfo {
    SandboxInfo {
        id: sb.id.clone(),
        created_at: sb.created_at,
        task_info: Some(TaskInfo {
            id: sb.task_id.clone(),
            started_at: sb.created_at,
            finished_at: 0.0,
            result: sb.result(),
            enqueued_at: sb.created_at,
            sandbox_id: sb.id.clone(),
        }),
        app_id: sb.app_id.clone(),
        tags: sb
            .tags
            .lock()
            .map(|t| {
                t.iter()
                    .map(|(k, v)| SandboxTag {
                        tag_name: k.clone(),
                        tag_value: v.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        name: sb.name.clone().unwrap_or_default(),
        image_id: sb.image_id.clone(),
        timeout_secs: sb.timeout_secs,
    }
}

impl Control {
    /// Create a sandbox and start its entrypoint; `v2` gives it V2-shaped ids.
    fn create(
        &self,
        app_id: &str,
        def: Sandbox_,
        tags: Vec<SandboxTag>,
        v2: bool,
    ) -> Result<Arc<Sandbox>, Status> {
        let known_app = self
            .0
            .apps
            .lock()
            .map(|a| a.values().any(|id| id == app_id))
            .unwrap_or(false);
        if !known_app {
            return Err(Status::not_found(format!("App {app_id} not found")));
        }
        let image_known = self
            .0
            .images
            .lock()
            .map(|i| i.contains_key(&def.image_id))
            .unwrap_or(false);
        if !image_known {
            return Err(Status::not_found(format!(
                "Image {} not found",
                def.image_id
            )));
        }
        let mut list = self
            .0
            .sandboxes
            .lock()
            .map_err(|_| Status::internal("state poisoned"))?;
        if let Some(name) = &def.name
            && list.iter().any(|s| {
                s.app_id == app_id && s.name.as_ref() == Some(name) && s.result().is_none()
            })
        {
            return Err(Status::already_exists(format!(
                "Sandbox with name '{name}' already exists in this app"
            )));
        }
        // As Modal refuses it: an allow-list on a sandbox with no network.
        let allowlist = def.network_access.as_ref().is_some_and(|n| {
            n.network_access_type == network_access::NetworkAccessType::Allowlist as i32
        });
        if def.block_network && allowlist {
            return Err(Status::invalid_argument(
                "an outbound allow-list cannot be used when block_network is enabled",
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("modal-standin-sb-")
            .tempdir()
            .map_err(|e| Status::internal(format!("cannot make the sandbox's directory: {e}")))?;
        let env: BTreeMap<String, String> = def
            .environment_variables
            .map(|m| m.contents.into_iter().collect())
            .unwrap_or_default();
        let (result, _) = tokio::sync::watch::channel(None);
        let sb = Arc::new(Sandbox {
            // The SDK tells a V2 sandbox by its id's shape, and its task by a
            // trailing `V`.
            id: if v2 {
                format!("{}V", self.0.next_id("sb"))
            } else {
                self.0.next_id("sb")
            },
            task_id: if v2 {
                format!("{}V", self.0.next_id("ta"))
            } else {
                self.0.next_id("ta")
            },
            app_id: app_id.to_string(),
            name: def.name.clone(),
            tags: std::sync::Mutex::new(
                tags.into_iter()
                    .map(|t| (t.tag_name, t.tag_value))
                    .collect(),
            ),
            created_at: now_secs(),
            image_id: def.image_id.clone(),
            timeout_secs: def.timeout_secs,
            dir,
            env,
            workdir: def.workdir.clone(),
            block_network: def.block_network,
            network_access: def.network_access.clone(),
            result,
            execs: std::sync::Mutex::new(Default::default()),
        });
        let entry = if def.entrypoint_args.is_empty() {
            vec!["sleep".to_string(), "infinity".to_string()]
        } else {
            def.entrypoint_args.clone()
        };
        sb.start_entrypoint(&entry).map_err(|e| {
            Status::invalid_argument(format!("cannot start the entrypoint {entry:?}: {e}"))
        })?;
        list.push(sb.clone());
        Ok(sb)
    }
}

#[tonic::async_trait]
impl ModalClient for Control {
    async fn client_hello(&self, r: Request<()>) -> Result<Response<ClientHelloResponse>, Status> {
        self.0.check_control("ClientHello", &r)?;
        Ok(Response::new(ClientHelloResponse {
            warning: String::new(),
            image_builder_version: BUILDER_VERSION.into(),
        }))
    }

    async fn auth_token_get(
        &self,
        r: Request<AuthTokenGetRequest>,
    ) -> Result<Response<AuthTokenGetResponse>, Status> {
        self.0.check_control("AuthTokenGet", &r)?;
        Ok(Response::new(AuthTokenGetResponse {
            token: self.0.issue(None),
        }))
    }

    async fn environment_get_or_create(
        &self,
        r: Request<EnvironmentGetOrCreateRequest>,
    ) -> Result<Response<EnvironmentGetOrCreateResponse>, Status> {
        self.0.check_control("EnvironmentGetOrCreate", &r)?;
        let name = r.into_inner().deployment_name;
        let name = if name.is_empty() { "main".into() } else { name };
        Ok(Response::new(EnvironmentGetOrCreateResponse {
            environment_id: format!("en-{name}"),
            metadata: Some(EnvironmentMetadata {
                name,
                settings: Some(EnvironmentSettings {
                    image_builder_version: BUILDER_VERSION.into(),
                    webhook_suffix: String::new(),
                }),
            }),
        }))
    }

    async fn app_get_or_create(
        &self,
        r: Request<AppGetOrCreateRequest>,
    ) -> Result<Response<AppGetOrCreateResponse>, Status> {
        self.0.check_control("AppGetOrCreate", &r)?;
        let q = r.into_inner();
        if q.app_name.is_empty() {
            return Err(Status::invalid_argument("app_name is required"));
        }
        let key = (q.environment_name.clone(), q.app_name.clone());
        let mut apps = self
            .0
            .apps
            .lock()
            .map_err(|_| Status::internal("state poisoned"))?;
        if let Some(id) = apps.get(&key) {
            if q.object_creation_type == ObjectCreationType::CreateFailIfExists as i32 {
                return Err(Status::already_exists(format!(
                    "App '{}' already exists",
                    q.app_name
                )));
            }
            return Ok(Response::new(AppGetOrCreateResponse { app_id: id.clone() }));
        }
        if q.object_creation_type == ObjectCreationType::Unspecified as i32 {
            return Err(Status::not_found(format!("App '{}' not found", q.app_name)));
        }
        let id = self.0.next_id("ap");
        apps.insert(key, id.clone());
        Ok(Response::new(AppGetOrCreateResponse { app_id: id }))
    }

    async fn image_get_or_create(
        &self,
        r: Request<ImageGetOrCreateRequest>,
    ) -> Result<Response<ImageGetOrCreateResponse>, Status> {
        self.0.check_control("ImageGetOrCreate", &r)?;
        let q = r.into_inner();
        let image = q.image.unwrap_or_default();
        if image.dockerfile_commands.is_empty() && image.base_images.is_empty() {
            return Err(Status::invalid_argument(
                "an image needs dockerfile commands or a base image",
            ));
        }
        // The image id is a function of its definition, as Modal's content hash is.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for c in image
            .dockerfile_commands
            .iter()
            .chain(image.base_images.iter().map(|b| &b.image_id))
            .chain(std::iter::once(&q.builder_version))
        {
            for b in c.bytes().chain(std::iter::once(0)) {
                h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
        }
        let id = format!("im-{h:016x}");
        let mut images = self
            .0
            .images
            .lock()
            .map_err(|_| Status::internal("state poisoned"))?;
        // The first request starts a "build": its result comes on the join stream.
        let built = images.insert(id.clone(), true).is_some();
        Ok(Response::new(ImageGetOrCreateResponse {
            image_id: id,
            result: built.then(success),
        }))
    }

    async fn image_join_streaming(
        &self,
        r: Request<ImageJoinStreamingRequest>,
    ) -> Result<Response<Stream_<ImageJoinStreamingResponse>>, Status> {
        self.0.check_control("ImageJoinStreaming", &r)?;
        let q = r.into_inner();
        let known = self
            .0
            .images
            .lock()
            .map(|i| i.contains_key(&q.image_id))
            .unwrap_or(false);
        if !known {
            return Err(Status::not_found(format!("Image {} not found", q.image_id)));
        }
        let items = vec![
            Ok(ImageJoinStreamingResponse {
                result: None,
                entry_id: "1-0".into(),
                eof: false,
            }),
            Ok(ImageJoinStreamingResponse {
                result: Some(success()),
                entry_id: "2-0".into(),
                eof: true,
            }),
        ];
        Ok(Response::new(Box::pin(tokio_stream::iter(items))))
    }

    async fn sandbox_create(
        &self,
        r: Request<SandboxCreateRequest>,
    ) -> Result<Response<SandboxCreateResponse>, Status> {
        self.0.check_control("SandboxCreate", &r)?;
        let q = r.into_inner();
        let sb = self.create(&q.app_id, q.definition.unwrap_or_default(), q.tags, false)?;
        Ok(Response::new(SandboxCreateResponse {
            sandbox_id: sb.id.clone(),
            metadata: Some(SandboxHandleMetadata {
                result: None,
                app_id: q.app_id,
            }),
        }))
    }

    async fn sandbox_create_v2(
        &self,
        r: Request<SandboxCreateV2Request>,
    ) -> Result<Response<SandboxCreateV2Response>, Status> {
        self.0.check_control("SandboxCreateV2", &r)?;
        let q = r.into_inner();
        let mut def = q.definition.unwrap_or_default();
        // V2 sends the `env` dict inline as ephemeral secrets.
        if let Some(env) = q.ephemeral_secrets {
            def.environment_variables
                .get_or_insert_with(StringMap::default)
                .contents
                .extend(env.contents);
        }
        let sb = self.create(&q.app_id, def, q.tags, true)?;
        Ok(Response::new(SandboxCreateV2Response {
            sandbox_id: sb.id.clone(),
            task_id: sb.task_id.clone(),
            metadata: Some(SandboxHandleMetadata {
                result: None,
                app_id: q.app_id,
            }),
            command_router_access: Some(CommandRouterAccess {
                jwt: self.0.issue(Some(&sb.task_id)),
                url: self.0.url.clone(),
            }),
            sandbox_token: String::new(),
        }))
    }

    async fn sandbox_get_command_router_access(
        &self,
        r: Request<SandboxGetCommandRouterAccessRequest>,
    ) -> Result<Response<SandboxGetCommandRouterAccessResponse>, Status> {
        use super::pb::client::sandbox_get_command_router_access_request::Target;
        self.0.check_control("SandboxGetCommandRouterAccess", &r)?;
        let sb = match r.into_inner().target {
            Some(Target::SandboxId(id)) => self.0.by_id(&id)?,
            Some(Target::TaskId(id)) => self.0.by_task(&id)?,
            None => {
                return Err(Status::invalid_argument(
                    "sandbox_id or task_id is required",
                ));
            }
        };
        if sb.result().is_some() {
            return Err(Status::failed_precondition(format!(
                "Sandbox {} has finished",
                sb.id
            )));
        }
        Ok(Response::new(SandboxGetCommandRouterAccessResponse {
            jwt: self.0.issue(Some(&sb.task_id)),
            url: self.0.url.clone(),
            worker_ipv4_address: "127.0.0.1".into(),
        }))
    }

    async fn sandbox_get_from_name_v2(
        &self,
        r: Request<SandboxGetFromNameRequest>,
    ) -> Result<Response<SandboxGetFromNameResponse>, Status> {
        self.sandbox_get_from_name(r).await
    }

    async fn sandbox_get_task_id_v2(
        &self,
        r: Request<SandboxGetTaskIdRequest>,
    ) -> Result<Response<SandboxGetTaskIdResponse>, Status> {
        self.sandbox_get_task_id(r).await
    }

    async fn sandbox_list_v2(
        &self,
        r: Request<SandboxListRequest>,
    ) -> Result<Response<SandboxListResponse>, Status> {
        self.sandbox_list(r).await
    }

    async fn sandbox_tags_set_v2(
        &self,
        r: Request<SandboxTagsSetRequest>,
    ) -> Result<Response<()>, Status> {
        self.sandbox_tags_set(r).await
    }

    async fn sandbox_terminate_v2(
        &self,
        r: Request<SandboxTerminateRequest>,
    ) -> Result<Response<SandboxTerminateResponse>, Status> {
        self.sandbox_terminate(r).await
    }

    async fn sandbox_wait_v2(
        &self,
        r: Request<SandboxWaitRequest>,
    ) -> Result<Response<SandboxWaitResponse>, Status> {
        self.sandbox_wait(r).await
    }

    async fn sandbox_get_task_id(
        &self,
        r: Request<SandboxGetTaskIdRequest>,
    ) -> Result<Response<SandboxGetTaskIdResponse>, Status> {
        self.0.check_control("SandboxGetTaskId", &r)?;
        let sb = self.0.by_id(&r.get_ref().sandbox_id)?;
        let result = sb.result();
        Ok(Response::new(SandboxGetTaskIdResponse {
            task_id: if result.is_none() {
                Some(sb.task_id.clone())
            } else {
                None
            },
            task_result: result,
        }))
    }

    async fn sandbox_get_from_name(
        &self,
        r: Request<SandboxGetFromNameRequest>,
    ) -> Result<Response<SandboxGetFromNameResponse>, Status> {
        self.0.check_control("SandboxGetFromName", &r)?;
        let q = r.into_inner();
        let app_id = self
            .0
            .apps
            .lock()
            .ok()
            .and_then(|a| {
                a.get(&(q.environment_name.clone(), q.app_name.clone()))
                    .cloned()
            })
            .ok_or_else(|| Status::not_found(format!("App '{}' not found", q.app_name)))?;
        let found = self.0.sandboxes.lock().ok().and_then(|s| {
            s.iter()
                .rev()
                .find(|s| {
                    s.app_id == app_id
                        && s.name.as_deref() == Some(q.sandbox_name.as_str())
                        && (q.include_terminated || s.result().is_none())
                })
                .cloned()
        });
        match found {
            Some(sb) => Ok(Response::new(SandboxGetFromNameResponse {
                sandbox_id: sb.id.clone(),
                metadata: Some(SandboxHandleMetadata {
                    result: sb.result(),
                    app_id,
                }),
            })),
            None => Err(Status::not_found(format!(
                "Sandbox with name '{}' not found",
                q.sandbox_name
            ))),
        }
    }

    async fn sandbox_list(
        &self,
        r: Request<SandboxListRequest>,
    ) -> Result<Response<SandboxListResponse>, Status> {
        self.0.check_control("SandboxList", &r)?;
        let q = r.into_inner();
        /// Modal's page size.
        const PAGE: usize = 100;
        let mut found: Vec<SandboxInfo> = self
            .0
            .sandboxes
            .lock()
            .map(|s| {
                s.iter()
                    .filter(|s| q.app_id.is_empty() || s.app_id == q.app_id)
                    .filter(|s| q.include_finished || s.result().is_none())
                    .filter(|s| q.before_timestamp <= 0.0 || s.created_at < q.before_timestamp)
                    .filter(|s| {
                        let tags = s.tags.lock().map(|t| t.clone()).unwrap_or_default();
                        q.tags
                            .iter()
                            .all(|t| tags.get(&t.tag_name) == Some(&t.tag_value))
                    })
                    .map(|s| info(s))
                    .collect()
            })
            .unwrap_or_default();
        found.sort_by(|a, b| b.created_at.total_cmp(&a.created_at));
        found.truncate(PAGE);
        Ok(Response::new(SandboxListResponse { sandboxes: found }))
    }

    async fn sandbox_tags_set(
        &self,
        r: Request<SandboxTagsSetRequest>,
    ) -> Result<Response<()>, Status> {
        self.0.check_control("SandboxTagsSet", &r)?;
        let q = r.into_inner();
        let sb = self.0.by_id(&q.sandbox_id)?;
        if let Ok(mut t) = sb.tags.lock() {
            for tag in q.tags {
                t.insert(tag.tag_name, tag.tag_value);
            }
        }
        Ok(Response::new(()))
    }

    async fn sandbox_terminate(
        &self,
        r: Request<SandboxTerminateRequest>,
    ) -> Result<Response<SandboxTerminateResponse>, Status> {
        self.0.check_control("SandboxTerminate", &r)?;
        let sb = self.0.by_id(&r.get_ref().sandbox_id)?;
        let before = sb.finish(GenericStatus::Terminated, 0, "terminated by request");
        Ok(Response::new(SandboxTerminateResponse {
            existing_result: before,
        }))
    }

    async fn sandbox_wait(
        &self,
        r: Request<SandboxWaitRequest>,
    ) -> Result<Response<SandboxWaitResponse>, Status> {
        self.0.check_control("SandboxWait", &r)?;
        let q = r.into_inner();
        let sb = self.0.by_id(&q.sandbox_id)?;
        let mut rx = sb.result.subscribe();
        let _ = tokio::time::timeout(clamp_wait(q.timeout), rx.wait_for(|r| r.is_some())).await;
        let result = sb.result();
        Ok(Response::new(SandboxWaitResponse {
            result: result.clone(),
            metadata: Some(SandboxHandleMetadata {
                result,
                app_id: sb.app_id.clone(),
            }),
        }))
    }

    async fn task_get_command_router_access(
        &self,
        r: Request<TaskGetCommandRouterAccessRequest>,
    ) -> Result<Response<TaskGetCommandRouterAccessResponse>, Status> {
        self.0.check_control("TaskGetCommandRouterAccess", &r)?;
        let task_id = r.into_inner().task_id;
        let sb = self.0.by_task(&task_id)?;
        if sb.result().is_some() {
            return Err(Status::failed_precondition(format!(
                "Task {task_id} has finished"
            )));
        }
        Ok(Response::new(TaskGetCommandRouterAccessResponse {
            jwt: self.0.issue(Some(&task_id)),
            url: self.0.url.clone(),
        }))
    }
}
