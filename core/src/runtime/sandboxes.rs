//! Sandboxes as the runtime manages them: created and recorded, listed with
//! what the backend sees (orphans too), and removed with their sessions.

use super::*;
use crate::pools::{INSTANCE, instance_of, on_backend};

/// A sandbox as `ls` shows it: what the store knows and what the backend sees.
#[derive(Clone, Debug, Serialize)]
pub struct SandboxStatus {
    /// Its backend.
    pub backend: BackendKind,
    /// Sandbox name.
    pub name: String,
    /// Live state from the backend, or `missing`.
    pub state: String,
    /// The backend's id for it.
    pub id: Option<String>,
    /// Creation time, ms since the epoch.
    pub created_at: Option<i64>,
    /// Last use, ms since the epoch.
    pub last_used: Option<i64>,
    /// True when the backend has it but the store does not (an orphan).
    pub orphan: bool,
}

impl Runtime {
    /// Create a sandbox (or re-attach to it) and record it.
    pub async fn create_sandbox(
        &self,
        backend: BackendKind,
        spec: SandboxSpec,
    ) -> Result<(Arc<dyn Sandbox>, bool, Option<String>)> {
        let b = self.backend(backend).await?;
        let mut spec = spec;
        if spec.network.rules().is_some()
            && b.native_allow_list().is_none()
            && let Err(why) = b.network_door()
        {
            return Err(Error::InvalidInput(format!(
                "sandbox `{}`: {why}",
                spec.name
            )));
        }
        // The policy file's `[network] most` caps what any sandbox may have.
        if let Some(g) = &self.gate
            && let Err(why) = g.policy().network.admits(spec.network.mode())
        {
            return Err(Error::InvalidInput(format!(
                "sandbox `{}`: {why}",
                spec.name
            )));
        }
        // Rules are read once here, so a bad one (from the API, which the
        // CLI's parser did not see) fails the create, not a later connection.
        spec.network
            .egress()
            .map_err(|e| Error::InvalidInput(format!("--network allow: {e}")))?;
        // The settings that belong to the sandbox (ssh's host) are recorded
        // with it, and must agree with those an existing one keeps.
        let stored = self.store.sandbox(backend, &spec.name)?;
        // The member a sandbox was taken from is berth's to record, and is
        // kept: a create that attaches to such a sandbox names it too.
        match stored.as_ref().and_then(|r| r.spec.option(INSTANCE)) {
            Some(instance) => {
                spec.options.insert(INSTANCE.into(), instance.to_string());
            }
            None if spec.option(INSTANCE).is_some() => {
                return Err(Error::InvalidInput(format!(
                    "sandbox `{}`: `--opt {INSTANCE}=` is berth's own (the pool member a sandbox was taken from); leave it out",
                    spec.name
                )));
            }
            None => {}
        }
        b.settle_spec(&mut spec, stored.as_ref().map(|r| &r.spec))?;
        // A sandbox's settings are fixed when it is made: asking for others
        // is an error naming each, never an attach that keeps the old ones
        // while the record takes the new (a later clone or recreate would
        // then come up with settings the sandbox never had).
        if let Some(row) = &stored {
            let diff = crate::spec_diff::differences(&row.spec, &spec);
            if !diff.is_empty() {
                let name = &spec.name;
                return Err(Error::InvalidInput(format!(
                    "sandbox `{name}` ({backend}) already exists with other settings:\n  {}\nA sandbox keeps the settings it was made with. To use it as it is, leave those options out or give them as shown (`berth sandbox inspect {name} -b {backend}` shows them); to change them, remove it (`berth sandbox rm {name} -b {backend}`, with --keep-workspace on docker to keep the files) and create it again",
                    diff.join("\n  ")
                )));
            }
        }
        // Written first: if berth dies mid-provision, `ls` still shows the sandbox
        // and `rm` can clean up whatever the backend made.
        self.store.put_sandbox(backend, &spec)?;
        self.open_door(backend, &mut spec).await?;
        let p = match self.provision_row(b.as_ref(), &spec).await {
            Ok(p) => p,
            // A new sandbox the backend refused for its settings (an option
            // it does not take, a limit it cannot set) was never made: no
            // row is left behind for `ls` to show as missing.
            Err(e @ (Error::InvalidInput(_) | Error::Unsupported(_))) if stored.is_none() => {
                self.close_door(backend, &spec.name).await;
                self.store.delete_sandbox(backend, &spec.name)?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        self.store.append(&Event {
            kind: if p.created {
                EventKind::SandboxCreated
            } else {
                EventKind::SandboxAttached
            },
            backend: Some(backend),
            sandbox: Some(spec.name.clone()),
            detail: p
                .recreated
                .as_ref()
                .map(|r| serde_json::json!({ "recreated": r }).to_string()),
            ..Default::default()
        })?;
        Ok((p.sandbox, p.created, p.recreated))
    }

    /// Remove a sandbox from the backend and the store.
    pub async fn remove_sandbox(
        &self,
        backend: BackendKind,
        name: &str,
        volumes: bool,
    ) -> Result<()> {
        let slots: Vec<SessionSlot> = {
            let mut map = self.sessions.lock().await;
            let keys: Vec<SessionKey> = map
                .keys()
                .filter(|k| k.0 == backend && k.1 == name)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for slot in slots {
            // Wait for a running command, then let the shell go.
            if let Some(s) = slot.lock().await.take() {
                drop(s.lock().await);
            }
        }
        self.forget_checkpoint_shell(backend, name).await;
        let known = self.store.sandbox(backend, name)?;
        let b = self.backend(backend).await?;
        let opts = RemoveOpts { volumes };
        let removal = match &known {
            // Where the record says it is (ssh: on its own host).
            Some(row) => b.remove_spec(&on_backend(&row.spec), opts).await,
            None => b.remove(name, opts).await,
        };
        let removed = match removal {
            Ok(()) => true,
            Err(Error::NotFound { .. }) => false,
            Err(e) => return Err(e),
        };
        self.store.delete_sandbox(backend, name)?;
        self.close_door(backend, name).await;
        crate::checkpoint::record::forget_sandbox(&self.store, backend, name)?;
        if known.is_none() && !removed {
            return Err(Error::NotFound {
                what: "sandbox",
                name: name.into(),
                hint: format!("list them with `berth sandbox ls --backend {backend}`"),
            });
        }
        self.store.append(&Event {
            kind: EventKind::SandboxRemoved,
            backend: Some(backend),
            sandbox: Some(name.into()),
            ..Default::default()
        })?;
        Ok(())
    }

    /// Sandboxes of one backend: the store's rows joined with the backend's view.
    pub async fn list_sandboxes(&self, backend: BackendKind) -> Result<Vec<SandboxStatus>> {
        let rows = self.store.sandboxes(Some(backend))?;
        let specs: Vec<SandboxSpec> = rows
            .iter()
            .map(|r| on_backend(&r.spec).into_owned())
            .collect();
        let mut live: Vec<SandboxInfo> = self.backend(backend).await?.list_specs(&specs).await?;
        // The backend knows a sandbox taken from a pool by its member's
        // name; a member not yet taken is the pool's, not an orphan.
        let members = crate::pools::member_instances(&self.store, backend)?;
        live.retain(|l| !members.contains(&l.name));
        for l in &mut live {
            if let Some(r) = rows.iter().find(|r| instance_of(&r.spec) == l.name) {
                l.name = r.name.clone();
            }
        }
        let mut out: Vec<SandboxStatus> = rows
            .iter()
            .map(|r| {
                let l = live.iter().find(|l| l.name == r.name);
                SandboxStatus {
                    backend,
                    name: r.name.clone(),
                    state: l
                        .map(|l| l.state.clone())
                        .unwrap_or_else(|| "missing".into()),
                    id: l.map(|l| l.id.clone()),
                    created_at: Some(r.created_at),
                    last_used: Some(r.last_used),
                    orphan: false,
                }
            })
            .collect();
        for l in live {
            if !rows.iter().any(|r| r.name == l.name) {
                out.push(SandboxStatus {
                    backend,
                    name: l.name,
                    state: l.state,
                    id: Some(l.id),
                    created_at: l.created_unix.map(|s| s * 1000),
                    last_used: None,
                    orphan: true,
                });
            }
        }
        Ok(out)
    }

    /// The stored row of a sandbox, creating `default` on first use. The
    /// call's settings that belong to the sandbox (ssh's host) must agree
    /// with the record's, and fill in what an older record lacks; with
    /// `lenient` (a look at a job's sandbox, whatever this call names), a
    /// disagreement leaves the record as it is, and the record wins.
    pub(super) fn sandbox_row(
        &self,
        b: &dyn Backend,
        backend: BackendKind,
        name: &str,
        lenient: bool,
    ) -> Result<SandboxRow> {
        if let Some(mut row) = self.store.sandbox(backend, name)? {
            let stored = row.spec.clone();
            match b.settle_spec(&mut row.spec, Some(&stored)) {
                Ok(true) => self.store.put_sandbox(backend, &row.spec)?,
                Ok(false) => {}
                Err(_) if lenient => row.spec = stored,
                Err(e) => return Err(e),
            }
            return Ok(row);
        }
        if name == DEFAULT_SANDBOX {
            let mut spec = SandboxSpec::named(name);
            b.settle_spec(&mut spec, None)?;
            self.store.put_sandbox(backend, &spec)?;
            if let Some(row) = self.store.sandbox(backend, name)? {
                return Ok(row);
            }
        }
        Err(Error::NotFound {
            what: "sandbox",
            name: name.into(),
            hint: format!(
                "create it with `berth sandbox create {name} --backend {backend}`, or list sandboxes with `berth sandbox ls --backend {backend}`"
            ),
        })
    }
}
