//! Each `--network allow:` sandbox's one door out: berth's egress proxy
//! serving a unix socket in `STATE/egress/BACKEND-NAME/`, which the backend
//! puts in the sandbox (docker bind-mounts the directory; a relay inside
//! listens on `127.0.0.1:3128`). The sandbox itself has no route: what does
//! not go through the door goes nowhere.
//!
//! The proxy runs in the process that holds the runtime, normally `berth
//! serve`. A process finds a door already served by another (the socket
//! answers) and leaves it; a dead one's socket is bound again. While no
//! berth process serves it, the door is shut, never open. The proxy reads
//! the sandbox's rules from the store for each connection, so `berth
//! sandbox network` changes them at once, whichever process serves.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use berth_egress::{Ask, Credentials, Hook, Proxy, Record, Resolve, TableResolver, tls};
use berth_policies::egress::{Action, Verdict};

use super::*;
use crate::backend::{DOOR_BUNDLE, DOOR_SOCKET, NetRules, Network};

/// Names for the proxy to resolve from a table instead of DNS
/// (`name=addr,…`): for tests, which must not look anything up outside the
/// machine.
pub const HOSTS_ENV: &str = "BERTH_EGRESS_HOSTS";

/// A door this process serves.
pub(super) struct Door {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Door {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Runtime {
    /// Where `name`'s door is on the host.
    pub fn door_dir(&self, backend: BackendKind, name: &str) -> PathBuf {
        self.cfg
            .state_dir
            .join("egress")
            .join(format!("{backend}-{name}"))
    }

    /// Where the key of `name`'s CA is: berth's state, never in the door
    /// directory the sandbox sees.
    fn door_key(&self, backend: BackendKind, name: &str) -> PathBuf {
        self.cfg
            .state_dir
            .join("egress-keys")
            .join(format!("{backend}-{name}.key"))
    }

    /// Give `spec` its door when its network is berth's proxy: the proxy
    /// serving (here, unless another berth process already does), and
    /// `spec.door` naming the directory. Nothing for any other network.
    pub(super) async fn open_door(
        &self,
        backend: BackendKind,
        spec: &mut SandboxSpec,
    ) -> Result<()> {
        let file = self
            .gate
            .as_ref()
            .map(|g| g.policy().network.clone())
            .unwrap_or_default();
        let Some(policy) = spec.network.egress().map_err(|e| {
            Error::InvalidInput(format!(
                "sandbox `{}`: its network rule {e}; set the rules again with `berth sandbox network`",
                spec.name
            ))
        })?
        else {
            return Ok(());
        };
        let policy = file.applied_to(policy);
        if let Some((who, _)) = self.backend(backend).await?.native_allow_list() {
            // The platform holds the rules with its own list; no door.
            let list = policy
                .allow_list(who)
                .map_err(|e| Error::InvalidInput(format!("sandbox `{}`: {e}", spec.name)))?;
            spec.allow_list = Some(list);
            return Ok(());
        }
        let dir = self.door_dir(backend, &spec.name);
        spec.door_env = file
            .credentials
            .iter()
            .map(|c| (c.value_env.clone(), c.placeholder()))
            .collect();
        let key = (backend, spec.name.clone());
        let mut doors = self.doors.lock().await;
        let ours = doors.get(&key).is_some_and(|d| !d.task.is_finished());
        let sock = dir.join(DOOR_SOCKET);
        if !ours && !answers(&sock) {
            let listener = bind(&dir, &sock).map_err(|source| Error::Io {
                context: "cannot open the sandbox's network door (berth's egress proxy) at",
                path: sock.clone(),
                source,
            })?;
            let ca = self.door_ca(backend, &spec.name, &dir)?;
            let store = self.store.clone();
            let name = spec.name.clone();
            let report = Arc::new(move |r: Record| {
                if let Err(e) = store.append(&net_event(backend, &name, r)) {
                    warn!(error = %e, "could not record a connection");
                }
            });
            let store = self.store.clone();
            let name = spec.name.clone();
            let credentials = file.credentials.clone();
            // The stored rules, read for each connection; a row that is gone
            // (the sandbox removed) shuts the door.
            let source = Arc::new(move || match store.sandbox(backend, &name) {
                Ok(Some(row)) => row
                    .spec
                    .network
                    .egress()
                    .ok()
                    .flatten()
                    .map(|e| file.applied_to(e)),
                Ok(None) => Some(berth_policies::egress::Egress::default()),
                Err(_) => None,
            });
            let timeout = Duration::from_secs(
                self.gate
                    .as_ref()
                    .map(|g| g.policy().approvals.timeout_secs)
                    .unwrap_or(600),
            );
            let asker = Arc::new(NetAsk {
                store: self.store.clone(),
                backend,
                name: spec.name.clone(),
                timeout,
            });
            let mut proxy = Proxy::new(policy, report)
                .with_source(source)
                .with_asker(asker);
            if !credentials.is_empty() {
                // This process holds the values (its environment) and puts
                // them on requests: made not dumpable, its /proc files
                // (environ, mem) are closed to processes of the same uid
                // without CAP_SYS_PTRACE, such as a local sandbox of an
                // ordinary user, which runs under that user's uid.
                // SAFETY: prctl with constant arguments changes only this
                // process's dumpable flag.
                unsafe {
                    libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
                }
                proxy = proxy.with_credentials(Credentials {
                    list: credentials,
                    ca,
                    client: tls_client()?,
                    secret: Arc::new(|k: &str| std::env::var(k).ok()),
                });
            }
            if let Some(table) = std::env::var(HOSTS_ENV).ok().filter(|t| !t.is_empty()) {
                let r = TableResolver::parse(&table)
                    .map_err(|e| Error::InvalidInput(format!("{HOSTS_ENV}: {e}")))?;
                proxy = proxy.with_resolver(Arc::new(r) as Arc<dyn Resolve>);
            }
            let proxy = Arc::new(proxy);
            let task = tokio::spawn(async move {
                if let Err(e) = proxy.serve(listener).await {
                    warn!(error = %e, "a sandbox's network door stopped");
                }
            });
            doors.insert(key, Door { task });
        }
        spec.door = Some(dir);
        Ok(())
    }

    /// The sandbox's CA (made the first time), with its certificate and
    /// the bundle the sandbox trusts written into the door directory.
    fn door_ca(&self, backend: BackendKind, name: &str, dir: &Path) -> Result<Arc<tls::Ca>> {
        let key = self.door_key(backend, name);
        let ca = tls::Ca::load_or_make(&key, &format!("{backend}-{name}")).map_err(|source| {
            Error::Io {
                context: "cannot make or read the sandbox's CA (for HTTPS credentials) at",
                path: key.clone(),
                source,
            }
        })?;
        let bundle = dir.join(DOOR_BUNDLE);
        let write = |path: &Path, text: &str| {
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, text)
                .and_then(|()| {
                    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))
                })
                .and_then(|()| std::fs::rename(&tmp, path))
                .map_err(|source| Error::Io {
                    context: "cannot write the sandbox's certificates at",
                    path: path.to_path_buf(),
                    source,
                })
        };
        write(&bundle, &ca.bundle(roots()))?;
        write(&dir.join("ca.pem"), ca.cert_pem())?;
        Ok(Arc::new(ca))
    }

    /// Open the door of every sandbox whose network is berth's proxy, so
    /// background jobs reach their hosts again after a restart (the server
    /// calls it when it starts). A door that cannot open is logged.
    pub async fn open_doors(&self) -> Result<usize> {
        let mut n = 0;
        for row in self.store.sandboxes(None)? {
            if row.spec.network.rules().is_none() {
                continue;
            }
            let mut spec = row.spec.clone();
            match self.open_door(row.backend, &mut spec).await {
                Ok(()) => n += 1,
                Err(e) => warn!(sandbox = %row.name, error = %e, "network door not opened"),
            }
        }
        Ok(n)
    }

    /// Stop serving a removed sandbox's door and remove its directory.
    pub(super) async fn close_door(&self, backend: BackendKind, name: &str) {
        self.doors.lock().await.remove(&(backend, name.to_string()));
        let key = self.door_key(backend, name);
        if let Err(e) = std::fs::remove_file(&key)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(key = %key.display(), error = %e, "could not remove a sandbox's CA key");
        }
        let dir = self.door_dir(backend, name);
        if let Err(e) = std::fs::remove_dir_all(&dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(dir = %dir.display(), error = %e, "could not remove a network door");
        }
    }

    /// Change a `--network allow:` sandbox's rules while it runs: `allow`
    /// or `deny` `host` (added; a rule already there is not repeated;
    /// `allow` takes the host off the deny list and the other way round).
    /// The next connection is judged by the new rules. Returns them.
    pub async fn set_network_rule(
        &self,
        backend: BackendKind,
        name: &str,
        allow: bool,
        host: &str,
    ) -> Result<NetRules> {
        let before = self.store.sandbox(backend, name)?;
        let rules = add_network_rule(&self.store, backend, name, allow, host)?;
        let b = self.backend(backend).await?;
        if b.native_allow_list().is_some()
            && let Some(mut row) = self.store.sandbox(backend, name)?
        {
            // The platform's list changes too, or nothing does.
            let changed = match self.open_door(backend, &mut row.spec).await {
                Ok(()) => b.set_allow_list(&row.spec).await,
                Err(e) => Err(e),
            };
            if let Err(e) = changed {
                if let Some(old) = before {
                    self.store.put_sandbox(backend, &old.spec)?;
                }
                return Err(e);
            }
        }
        Ok(rules)
    }
}

/// `allow` or `deny` `host` in the stored rules of sandbox `name` (a
/// `--network allow:` one): added once; `allow` takes the host off the deny
/// list and the other way round. What [`Runtime::set_network_rule`] and an
/// approval answered "always" both do. Returns the rules.
pub fn add_network_rule(
    store: &Store,
    backend: BackendKind,
    name: &str,
    allow: bool,
    host: &str,
) -> Result<NetRules> {
    let rule = berth_policies::egress::Rule::parse(host).map_err(Error::InvalidInput)?;
    let text = rule.text().to_string();
    let Some(mut row) = store.sandbox(backend, name)? else {
        return Err(Error::NotFound {
            what: "sandbox",
            name: name.into(),
            hint: format!("list them with `berth sandbox ls --backend {backend}`"),
        });
    };
    let Network::Allow(rules) = &mut row.spec.network else {
        return Err(Error::InvalidInput(format!(
            "sandbox `{name}` has network {}: its rules can change only when its way out is berth's proxy (made with `--network allow:HOST,…`). A sandbox's kind of network is fixed when it is made; make another with `berth sandbox create NAME -b {backend} --network allow:{text}`",
            row.spec.network
        )));
    };
    let (add, take) = if allow {
        (&mut rules.allow, &mut rules.deny)
    } else {
        (&mut rules.deny, &mut rules.allow)
    };
    take.retain(|r| *r != text);
    if !add.contains(&text) {
        add.push(text);
    }
    let out = rules.clone();
    store.put_sandbox(backend, &row.spec)?;
    Ok(out)
}

/// The rule under which an approval is a network one (`connect HOST:PORT`).
pub const NET_ASK_RULE: &str = "network: ask";

/// Puts a host no rule names to a person: an approval (`berth approve N`,
/// the dashboard, a webhook on `approval.requested`), waited on like a
/// command's. "Always" is answered by adding the host to the sandbox's
/// allow rules ([`add_network_rule`], done by whoever answers).
struct NetAsk {
    store: Arc<Store>,
    backend: BackendKind,
    name: String,
    timeout: Duration,
}

impl Ask for NetAsk {
    fn ask(
        &self,
        host: String,
        port: u16,
        addr: Option<std::net::SocketAddr>,
        verdict: Verdict,
    ) -> Hook<std::result::Result<(), String>> {
        let (store, backend, name, timeout) = (
            self.store.clone(),
            self.backend,
            self.name.clone(),
            self.timeout,
        );
        Box::pin(async move {
            let target = match host.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V6(_)) => format!("[{host}]:{port}"),
                _ => format!("{host}:{port}"),
            };
            let command = format!("connect {target}");
            let asked = async {
                let event = |kind, detail: serde_json::Value| Event {
                    kind,
                    backend: Some(backend),
                    sandbox: Some(name.clone()),
                    command: Some(command.clone()),
                    verdict: Some("ask (rule network: ask)".into()),
                    detail: Some(detail.to_string()),
                    ..Default::default()
                };
                let pending = match store.reusable_approval(&name, backend, &command)? {
                    Some(a) => a,
                    None => {
                        let a = store.create_approval(&crate::approvals::NewApproval {
                            sandbox: name.clone(),
                            backend,
                            command: command.clone(),
                            part: command.clone(),
                            // What "always" adds: the host (and port) as a rule.
                            argv: vec![target.clone()],
                            rule: NET_ASK_RULE.into(),
                            reason: verdict.reason.clone(),
                        })?;
                        store.append(&event(
                            EventKind::ApprovalRequested,
                            serde_json::json!({
                                "approval": a.id, "rule": NET_ASK_RULE, "reason": verdict.reason,
                                "part": command, "addr": addr.map(|a| a.ip().to_string()),
                            }),
                        ))?;
                        a
                    }
                };
                let decided = if pending.state == crate::approvals::ApprovalState::Pending {
                    crate::approvals::wait(&store, pending.id, timeout, Duration::from_millis(200))
                        .await?
                } else {
                    pending
                };
                Ok::<_, Error>(decided)
            };
            let decided = asked
                .await
                .map_err(|e| format!("the approval could not be asked: {e}"))?;
            let id = decided.id;
            match decided.state {
                crate::approvals::ApprovalState::Approved => {
                    let _ = store.mark_approval_used(id);
                    Ok(())
                }
                crate::approvals::ApprovalState::Expired => Err(format!(
                    "nobody answered approval #{id} within {}s, so it was refused (berth fails closed)",
                    timeout.as_secs()
                )),
                _ => Err(format!(
                    "approval #{id} was denied by {}",
                    decided.decided_by.as_deref().unwrap_or("someone")
                )),
            }
        })
    }
}

/// The roots this machine trusts, read once.
fn roots() -> &'static [berth_egress::rustls::pki_types::CertificateDer<'static>] {
    static ROOTS: std::sync::OnceLock<
        Vec<berth_egress::rustls::pki_types::CertificateDer<'static>>,
    > = std::sync::OnceLock::new();
    ROOTS.get_or_init(tls::roots)
}

/// The proxy's TLS client, made once.
fn tls_client() -> Result<Arc<berth_egress::rustls::ClientConfig>> {
    static CLIENT: std::sync::OnceLock<
        std::result::Result<Arc<berth_egress::rustls::ClientConfig>, String>,
    > = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| tls::client(roots()))
        .clone()
        .map_err(|e| Error::InvalidInput(format!("berth's TLS client could not be made: {e}")))
}

/// True when something serves the socket (another berth process's proxy).
fn answers(sock: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(sock).is_ok()
}

/// Bind the door's socket afresh. The directory holds the socket alone
/// (the backend shows the whole directory to the sandbox); the socket is
/// open to every user, since the sandbox's user is not berth's, and the
/// state directory above it keeps other users of the host out.
fn bind(dir: &Path, sock: &Path) -> std::io::Result<tokio::net::UnixListener> {
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    match std::fs::remove_file(sock) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let l = tokio::net::UnixListener::bind(sock)?;
    std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// The event for one connection the proxy saw.
fn net_event(backend: BackendKind, name: &str, r: Record) -> Event {
    let allowed = r.verdict.action == Action::Allow;
    Event {
        kind: if allowed {
            EventKind::NetConnect
        } else {
            EventKind::NetRefused
        },
        backend: Some(backend),
        sandbox: Some(name.to_string()),
        command: Some(format!("connect {}:{}", r.host, r.port)),
        verdict: Some(if allowed { "allow" } else { "deny" }.to_string()),
        bytes_out: Some(r.bytes_down.min(i64::MAX as u64) as i64),
        detail: Some(
            serde_json::json!({
                "host": r.host,
                "port": r.port,
                "addr": r.addr.map(|a| a.ip().to_string()),
                "rule": r.verdict.rule,
                "reason": r.verdict.reason,
                "bytes_up": r.bytes_up,
                "bytes_down": r.bytes_down,
                "error": r.error,
                "credential": r.credential,
            })
            .to_string(),
        ),
        ..Default::default()
    }
}
