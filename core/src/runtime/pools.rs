//! Warm pools as the runtime runs them (see [`crate::pools`]): made,
//! filled, taken from and removed.
//!
//! A ready member has been provisioned and, while this runtime runs, has
//! its main shell open in `warm`; taking it moves that shell into the new
//! sandbox's session slot, so the sandbox's first command runs over a live
//! shell. A member this runtime has not warmed (made by another process, or
//! before a restart) is warmed by the next fill.

use super::*;
use crate::pools::{self as pool, Aliased, PoolRow, Taken};

/// A pool as `pool ls` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PoolStatus {
    /// Its record.
    #[serde(flatten)]
    pub row: PoolRow,
    /// Members ready to be taken.
    pub ready: u32,
    /// Members being made.
    pub making: u32,
}

/// What [`Runtime::take_from_pool`] gave.
#[derive(Clone, Debug)]
pub struct FromPool {
    /// The backend the sandbox is on (the pool's).
    pub backend: BackendKind,
    /// Where its workspace is.
    pub workdir: String,
    /// The member it is, when one was ready; `None`: none was, and it was
    /// made cold with the pool's settings.
    pub instance: Option<String>,
}

impl Runtime {
    /// Provision a recorded sandbox: under its instance's name when it was
    /// taken from a pool, shown under its own.
    pub(super) async fn provision_row(
        &self,
        b: &dyn Backend,
        spec: &SandboxSpec,
    ) -> Result<crate::backend::Provisioned> {
        let mut p = b.provision(&pool::on_backend(spec)).await?;
        p.sandbox = Aliased::wrap(p.sandbox, &spec.name);
        Ok(p)
    }

    /// The names the backend knows this installation's recorded sandboxes
    /// and pool members by: what a garbage collection must keep.
    pub fn backend_names(&self, backend: BackendKind) -> Result<Vec<String>> {
        let mut out: Vec<String> = self
            .store
            .sandboxes(Some(backend))?
            .iter()
            .map(|r| pool::instance_of(&r.spec).to_string())
            .collect();
        out.extend(pool::member_instances(&self.store, backend)?);
        Ok(out)
    }

    /// Record a pool of `size` sandboxes of `spec`'s settings on `backend`.
    /// Its members are made by [`Runtime::fill_pool`].
    pub async fn create_pool(
        &self,
        name: &str,
        backend: BackendKind,
        size: u32,
        spec: SandboxSpec,
    ) -> Result<PoolRow> {
        pool::check_pool_name(name)?;
        if !pool::POOL_BACKENDS.contains(&backend) {
            return Err(Error::Unsupported(format!(
                "pools are made on docker and k8s, not {backend}: a {backend} sandbox is made with `berth sandbox create NAME --backend {backend}`"
            )));
        }
        if size == 0 || size > 64 {
            return Err(Error::InvalidInput(format!(
                "--size {size}: a pool keeps 1 to 64 ready sandboxes"
            )));
        }
        if spec.option(pool::INSTANCE).is_some() {
            return Err(Error::InvalidInput(format!(
                "`--opt {}=` is berth's own (the member a sandbox was taken from); leave it out",
                pool::INSTANCE
            )));
        }
        if spec.network.rules().is_some() {
            return Err(Error::Unsupported(
                "a pool's sandboxes cannot have `--network allow:` yet (each needs its own egress door, opened when it is taken); make a pool with `--network off` or `on`, or create the sandbox without a pool".into(),
            ));
        }
        if let Some(g) = &self.gate
            && let Err(why) = g.policy().network.admits(spec.network.mode())
        {
            return Err(Error::InvalidInput(format!("pool `{name}`: {why}")));
        }
        // The backend's own checks (options it takes, its context) run now,
        // not at the first member.
        let b = self.backend(backend).await?;
        let mut spec = spec;
        spec.name = String::new();
        b.settle_spec(&mut spec, None)?;
        let row = PoolRow {
            name: name.to_string(),
            backend,
            size,
            spec,
            created_at: crate::clock::now_ms(),
        };
        pool::put_pool(&self.store, &row)?;
        Ok(row)
    }

    /// Every pool with how many of its members are ready.
    pub fn pools(&self) -> Result<Vec<PoolStatus>> {
        pool::pools(&self.store)?
            .into_iter()
            .map(|row| {
                let members = pool::members(&self.store, row.backend, &row.name)?;
                let ready = members.iter().filter(|m| m.state == "ready").count() as u32;
                Ok(PoolStatus {
                    making: members.len() as u32 - ready,
                    ready,
                    row,
                })
            })
            .collect()
    }

    /// Bring pool `name` to its size: finish members a stopped berth left
    /// half made, warm ready ones whose shell this runtime has not opened,
    /// and make new ones. Returns how many are ready. One fill of a pool
    /// runs at a time in this runtime.
    pub async fn fill_pool(&self, name: &str) -> Result<u32> {
        let lock = self
            .pool_fills
            .lock()
            .await
            .entry(name.to_string())
            .or_default()
            .clone();
        let _one = lock.lock().await;
        let Some(row) = pool::pool(&self.store, name)? else {
            return Err(pool_not_found(name));
        };
        let backend = row.backend;
        let b = self.backend(backend).await?;
        let mut ready = 0;
        for m in pool::members(&self.store, backend, name)? {
            let warm = self
                .warm
                .lock()
                .await
                .contains_key(&(backend, m.instance.clone()));
            if m.state == "ready" && warm {
                ready += 1;
                continue;
            }
            match self.make_member(b.as_ref(), &row, &m.instance).await {
                Ok(true) => ready += 1,
                // Taken meanwhile: a sandbox now, not the pool's.
                Ok(false) => {}
                Err(e) => {
                    warn!(pool = %name, member = %m.instance, error = %e.full_text(), "a pool member could not be made; removing it");
                    self.drop_member(b.as_ref(), &row, &m.instance).await;
                }
            }
        }
        let mut failures = 0;
        while ready < row.size {
            // Still a pool? A removal meanwhile stops the fill.
            if pool::pool(&self.store, name)?.is_none() {
                break;
            }
            let instance = pool::member_name(name);
            pool::add_member(&self.store, backend, name, &instance)?;
            match self.make_member(b.as_ref(), &row, &instance).await {
                Ok(true) => ready += 1,
                Ok(false) => {}
                Err(e) => {
                    self.drop_member(b.as_ref(), &row, &instance).await;
                    failures += 1;
                    // One failure may be passing (a pull, a busy API);
                    // two in a row are the pool's settings or its backend.
                    if failures >= 2 {
                        return Err(e);
                    }
                }
            }
        }
        Ok(ready)
    }

    /// Fill every pool, as a server does when it starts: members a stopped
    /// berth left half made are finished, ready ones get their shell.
    /// Returns how many pools are full.
    pub async fn fill_pools(&self) -> Result<usize> {
        let mut full = 0;
        for p in pool::pools(&self.store)? {
            match self.fill_pool(&p.name).await {
                Ok(n) if n >= p.size => full += 1,
                Ok(_) => {}
                Err(e) => warn!(pool = %p.name, error = %e.full_text(), "could not fill a pool"),
            }
        }
        Ok(full)
    }

    /// Provision member `instance` of `pool`, open its shell and mark it
    /// ready. False when it is no longer the pool's (taken meanwhile).
    async fn make_member(
        &self,
        b: &dyn Backend,
        pool_row: &PoolRow,
        instance: &str,
    ) -> Result<bool> {
        let mut spec = pool_row.spec.clone();
        spec.name = instance.to_string();
        let p = b.provision(&spec).await?;
        let cfg = self.session_config(pool_row.backend, instance, MAIN_SESSION, &p.sandbox);
        let session = Session::open(p.sandbox, cfg).await?;
        // The shell is offered before the member is marked ready, so a take
        // that sees it ready finds its shell.
        let key = (pool_row.backend, instance.to_string());
        self.warm
            .lock()
            .await
            .insert(key.clone(), Arc::new(Mutex::new(session)));
        if !pool::mark_ready(&self.store, pool_row.backend, instance)? {
            self.close_warm_one(&key).await;
            return Ok(false);
        }
        Ok(true)
    }

    async fn close_warm_one(&self, key: &(BackendKind, String)) {
        let s = self.warm.lock().await.remove(key);
        if let Some(s) = s
            && let Ok(s) = Arc::try_unwrap(s)
        {
            s.into_inner().close().await;
        }
    }

    /// Remove a member from the record and the backend. Whoever deletes a
    /// member's row owns it: one taken meanwhile (a sandbox now) is left
    /// alone. A failure is a log line only; a leftover is listed as an
    /// orphan.
    async fn drop_member(&self, b: &dyn Backend, pool_row: &PoolRow, instance: &str) -> bool {
        self.close_warm_one(&(pool_row.backend, instance.to_string()))
            .await;
        match pool::delete_member(&self.store, pool_row.backend, instance) {
            Ok(true) => {}
            Ok(false) => return false,
            Err(e) => {
                warn!(member = %instance, error = %e.full_text(), "forgetting a pool member failed");
                return false;
            }
        }
        let mut spec = pool_row.spec.clone();
        spec.name = instance.to_string();
        match b.remove_spec(&spec, RemoveOpts { volumes: true }).await {
            Ok(()) | Err(Error::NotFound { .. }) => {}
            Err(e) => {
                warn!(member = %instance, error = %e.full_text(), "removing a pool member failed")
            }
        }
        true
    }

    /// Remove pool `name` and every member not yet taken. Returns the
    /// members removed.
    pub async fn remove_pool(&self, name: &str) -> Result<Vec<String>> {
        let Some(row) = pool::pool(&self.store, name)? else {
            return Err(pool_not_found(name));
        };
        // Forgotten first: a fill running now stops making members.
        pool::delete_pool(&self.store, name)?;
        let lock = self
            .pool_fills
            .lock()
            .await
            .entry(name.to_string())
            .or_default()
            .clone();
        let _one = lock.lock().await;
        let b = self.backend(row.backend).await?;
        let mut removed = Vec::new();
        for m in pool::members(&self.store, row.backend, name)? {
            if self.drop_member(b.as_ref(), &row, &m.instance).await {
                removed.push(m.instance);
            }
        }
        Ok(removed)
    }

    /// Make sandbox `asked.name` from pool `pool_name`: a ready member when
    /// there is one (its shell already open), else a new sandbox made with
    /// the pool's settings. The pool's settings are the sandbox's: any that
    /// `asked` gives must agree with them. `backend`, when given, must be
    /// the pool's. The caller refills the pool ([`Runtime::fill_pool`]).
    pub async fn take_from_pool(
        &self,
        pool_name: &str,
        backend: Option<BackendKind>,
        asked: &SandboxSpec,
    ) -> Result<FromPool> {
        let name = asked.name.as_str();
        let Some(row) = pool::pool(&self.store, pool_name)? else {
            return Err(pool_not_found(pool_name));
        };
        let bare = SandboxSpec {
            name: asked.name.clone(),
            ..Default::default()
        };
        if *asked != bare {
            let mut made = row.spec.clone();
            made.name = name.to_string();
            let mut asked = asked.clone();
            for (k, v) in &made.options {
                asked.options.entry(k.clone()).or_insert_with(|| v.clone());
            }
            let diff = crate::spec_diff::differences(&made, &asked);
            if !diff.is_empty() {
                return Err(Error::InvalidInput(format!(
                    "pool `{pool_name}` makes its sandboxes with other settings:\n  {}\nA sandbox from a pool has the pool's settings: leave these out, or make a pool with them (`berth pool create`)",
                    diff.join("\n  ")
                )));
            }
        }
        if let Some(b) = backend
            && b != row.backend
        {
            return Err(Error::InvalidInput(format!(
                "pool `{pool_name}` is on {}, not {b}; leave --backend out, or give --backend {}",
                row.backend, row.backend
            )));
        }
        let backend = row.backend;
        let mut spec = row.spec.clone();
        spec.name = name.to_string();
        let instance = match pool::take_member(&self.store, backend, pool_name, &spec)? {
            Taken::Exists => {
                return Err(Error::InvalidInput(format!(
                    "sandbox `{name}` ({backend}) exists; a pool makes new sandboxes only. Pick another name, or remove it first (`berth sandbox rm {name} -b {backend}`)"
                )));
            }
            Taken::Empty => {
                let (sb, _, _) = self.create_sandbox(backend, spec).await?;
                return Ok(FromPool {
                    backend,
                    workdir: sb.layout().workdir.clone(),
                    instance: None,
                });
            }
            Taken::Member(instance) => instance,
        };
        let warm = self.warm.lock().await.remove(&(backend, instance.clone()));
        let workdir = match warm {
            Some(session) => {
                let workdir = {
                    let mut s = session.lock().await;
                    s.rename(format!("{backend}/{name}/{MAIN_SESSION}"), name);
                    s.sandbox().layout().workdir.clone()
                };
                let slot = self.slot(backend, name, MAIN_SESSION).await;
                *slot.lock().await = Some(session);
                workdir
            }
            // Made by another process: its shell opens at the first command.
            None => {
                let b = self.backend(backend).await?;
                let row = self.sandbox_row(b.as_ref(), backend, name, false)?;
                self.provision_row(b.as_ref(), &row.spec)
                    .await?
                    .sandbox
                    .layout()
                    .workdir
                    .clone()
            }
        };
        self.store.append(&Event {
            kind: EventKind::SandboxCreated,
            backend: Some(backend),
            sandbox: Some(name.to_string()),
            detail: Some(
                serde_json::json!({ "pool": pool_name, "instance": instance }).to_string(),
            ),
            ..Default::default()
        })?;
        Ok(FromPool {
            backend,
            workdir,
            instance: Some(instance),
        })
    }

    /// The members this runtime holds a shell for: closed (at shutdown).
    pub(super) async fn close_warm(&self) {
        let warm: Vec<_> = self.warm.lock().await.drain().collect();
        for (_, s) in warm {
            if let Ok(s) = Arc::try_unwrap(s) {
                s.into_inner().close().await;
            }
        }
    }
}

fn pool_not_found(name: &str) -> Error {
    Error::NotFound {
        what: "pool",
        name: name.to_string(),
        hint: "list pools with `berth pool ls`, or make one with `berth pool create NAME --backend docker --size 2`".into(),
    }
}
