//! The E2B backend: a cloud sandbox per berth sandbox, driven over E2B's
//! control-plane REST API and the envd daemon inside it.
//!
//! Flow at a glance:
//! - [`E2bConfig`] is read from the vendor's variables (`E2B_API_KEY`,
//!   `E2B_DOMAIN`, `E2B_API_URL`, `E2B_SANDBOX_URL`) plus berth's template and
//!   idle timeout; with only a key set it targets the real service.
//! - `provision` lists sandboxes by berth's metadata label (`berth.sandbox`)
//!   and re-attaches with connect (which also resumes a paused one), or creates
//!   one from the template ([`api`]). A helper process makes the workspace and
//!   reports `$HOME`, which anchors the [`Layout`].
//! - `spawn` is one envd `Start` stream with stdin enabled ([`process`]); the
//!   session engine runs its one bash over it for the sandbox's life.
//! - Files move through envd's `/files` ([`envd`]).
//! - While any process of a sandbox handle is alive, a task keeps pushing the
//!   sandbox's timeout forward; once berth lets go, E2B kills it after the idle
//!   timeout, so an abandoned sandbox stops costing money.

pub mod api;
pub mod bench;
pub mod connect;
pub mod envd;
pub mod process;
pub mod proto;
mod sandbox;

pub use sandbox::E2bSandbox;
use sandbox::{Inner, keep_alive};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::backend::{
    Backend, Layout, Process, Provisioned, RemoveOpts, Sandbox, SandboxInfo, SandboxSpec,
    SpawnOpts, check_sandbox_name,
};
use berth_core::error::{BackendFailure, Error, Result};
use tracing::{debug, warn};

use api::{Api, ListedSandbox, NewSandbox, SandboxRecord, gone};
use connect::CallError;
use envd::Envd;
use process::{E2bProcess, StartError, StartSpec};
use proto::{ProcessConfig, StartRequest};

/// The backend's short name.
pub const KIND: &str = "e2b";
/// The metadata key every berth sandbox carries.
pub const LABEL_MANAGED: &str = "berth.managed";
/// The metadata key holding the berth sandbox's name.
pub const LABEL_SANDBOX: &str = "berth.sandbox";
/// The template used when none is configured: E2B's default.
pub const DEFAULT_TEMPLATE: &str = "base";
/// Seconds a sandbox lives after berth stops extending it.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The oldest envd berth speaks to (the official SDK's floor).
const MIN_ENVD: (u64, u64, u64) = (0, 1, 0);

/// How control-plane calls are retried.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub retries: u32,
    /// The first backoff; it doubles each time.
    pub base_delay: Duration,
    /// The longest wait between attempts.
    pub max_delay: Duration,
    /// One attempt's limit.
    pub request_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retries: 4,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(8),
            request_timeout: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// Exponential backoff with full jitter: uniform in `[0, base * 2^attempt]`,
    /// capped, so many clients retrying at once spread out.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let cap = self
            .base_delay
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_delay);
        cap.mul_f64(rand::random::<f64>())
    }
}

/// Settings, by the vendor's own variable names.
#[derive(Clone)]
pub struct E2bConfig {
    /// `E2B_API_KEY`.
    pub api_key: Option<String>,
    /// `E2B_DOMAIN`, default `e2b.app`.
    pub domain: String,
    /// `E2B_API_URL`, default `https://api.{domain}`.
    pub api_url: String,
    /// `E2B_SANDBOX_URL`: one envd base URL for every sandbox (requests are
    /// routed by header); default `https://49983-{id}.{domain}`.
    pub sandbox_url: Option<String>,
    /// `BERTH_E2B_TEMPLATE`, default `base`; a spec's `template` option or
    /// image wins.
    pub template: String,
    /// `BERTH_E2B_TIMEOUT` (seconds): how long a sandbox outlives berth's last use.
    pub timeout_secs: u64,
    /// The sandbox user processes run as.
    pub user: String,
    /// Control-plane retries.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for E2bConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bConfig")
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("domain", &self.domain)
            .field("api_url", &self.api_url)
            .field("sandbox_url", &self.sandbox_url)
            .field("template", &self.template)
            .field("timeout_secs", &self.timeout_secs)
            .field("user", &self.user)
            .finish()
    }
}

impl E2bConfig {
    /// From this process's environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// From any variable source (tests pass a stand-in's settings).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Self {
        let var = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let domain = var("E2B_DOMAIN").unwrap_or_else(|| "e2b.app".into());
        Self {
            api_key: var("E2B_API_KEY"),
            api_url: var("E2B_API_URL").unwrap_or_else(|| format!("https://api.{domain}")),
            sandbox_url: var("E2B_SANDBOX_URL"),
            template: var("BERTH_E2B_TEMPLATE").unwrap_or_else(|| DEFAULT_TEMPLATE.into()),
            timeout_secs: var("BERTH_E2B_TIMEOUT")
                .and_then(|s| s.parse().ok())
                .filter(|s| *s > 0)
                .unwrap_or(DEFAULT_TIMEOUT_SECS),
            user: "user".into(),
            retry: RetryPolicy::default(),
            domain,
        }
    }

    /// envd's base URL for a sandbox.
    fn envd_url(&self, id: &str, domain: Option<&str>) -> String {
        match &self.sandbox_url {
            Some(u) => u.clone(),
            None => format!(
                "https://{}-{id}.{}",
                envd::ENVD_PORT,
                domain.filter(|d| !d.is_empty()).unwrap_or(&self.domain)
            ),
        }
    }
}

struct Shared {
    cfg: E2bConfig,
    http: reqwest::Client,
    api: Api,
}

/// The E2B backend.
#[derive(Clone)]
pub struct E2bBackend {
    shared: Arc<Shared>,
}

impl E2bBackend {
    /// A backend with these settings. Fails only if no HTTP client can be built.
    pub fn new(cfg: E2bConfig) -> Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(15))
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                Error::backend_call(
                    KIND,
                    BackendFailure::Local,
                    "cannot build the HTTP client (is the system's TLS set up?)",
                    e,
                )
            })?;
        let api = Api::new(http.clone(), cfg.clone());
        Ok(Self {
            shared: Arc::new(Shared { cfg, http, api }),
        })
    }

    /// A backend configured from the environment.
    pub fn from_env() -> Result<Self> {
        Self::new(E2bConfig::from_env())
    }

    /// The settings in use.
    pub fn config(&self) -> &E2bConfig {
        &self.shared.cfg
    }

    /// The control-plane client.
    pub fn api(&self) -> &Api {
        &self.shared.api
    }

    /// berth's live E2B sandboxes called `name`, newest first.
    async fn find(&self, name: &str) -> Result<Vec<ListedSandbox>> {
        self.shared
            .api
            .list(&[(LABEL_MANAGED, "true"), (LABEL_SANDBOX, name)])
            .await
    }

    /// The E2B id of the sandbox called `name`.
    pub async fn sandbox_id(&self, name: &str) -> Result<Option<String>> {
        Ok(self
            .find(name)
            .await?
            .into_iter()
            .next()
            .map(|s| s.sandbox_id))
    }

    /// Pause the sandbox called `name`: its memory and disk are kept, it costs
    /// storage only, and the next `provision` resumes it.
    pub async fn pause(&self, name: &str) -> Result<()> {
        let Some(id) = self.sandbox_id(name).await? else {
            return Err(gone(name, "E2B has no sandbox with this name"));
        };
        self.shared.api.pause(&id, name).await
    }

    /// A concrete handle on the existing sandbox called `name`, for the calls
    /// the `Sandbox` trait has no room for (a deadline, stdin off).
    pub async fn attach_by_name(&self, name: &str) -> Result<E2bSandbox> {
        let spec = SandboxSpec::named(name);
        let missing = || gone(name, "E2B has no sandbox with this name");
        let Some(id) = self.sandbox_id(name).await? else {
            return Err(missing());
        };
        self.attach(&id, &spec).await?.ok_or_else(missing)
    }

    /// Re-attach to `id`; `Ok(None)` when E2B says it is gone.
    async fn attach(&self, id: &str, spec: &SandboxSpec) -> Result<Option<E2bSandbox>> {
        let timeout = self.timeout_for(spec)?;
        match self.shared.api.connect(id, &spec.name, timeout).await {
            Ok((rec, resumed)) => {
                if resumed {
                    debug!(sandbox = %spec.name, id, "resumed a paused e2b sandbox");
                }
                Ok(Some(self.open(rec, spec, timeout).await?))
            }
            Err(Error::SandboxGone { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn timeout_for(&self, spec: &SandboxSpec) -> Result<u64> {
        match spec.option("timeout") {
            Some(t) => t.parse().ok().filter(|t| *t > 0).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "e2b option timeout={t:?}: give the idle timeout in whole seconds"
                ))
            }),
            None => Ok(self.shared.cfg.timeout_secs),
        }
    }

    /// Build the sandbox handle and learn its layout.
    async fn open(
        &self,
        rec: SandboxRecord,
        spec: &SandboxSpec,
        timeout: u64,
    ) -> Result<E2bSandbox> {
        check_envd_version(&rec.envd_version)?;
        let cfg = &self.shared.cfg;
        let envd = Envd::new(
            self.shared.http.clone(),
            cfg.envd_url(&rec.sandbox_id, rec.domain.as_deref()),
            rec.sandbox_id.clone(),
            rec.envd_access_token.clone(),
            cfg.user.clone(),
        );
        let inner = Arc::new(Inner {
            backend: self.clone(),
            id: rec.sandbox_id.clone(),
            name: spec.name.clone(),
            envd,
            env: spec.env.clone(),
            live: Arc::new(AtomicUsize::new(0)),
            timeout,
        });
        let home = inner.home().await?;
        let layout = Layout {
            workdir: format!("{home}/workspace"),
            berth_dir: format!("{home}/.berth"),
        };
        tokio::spawn(keep_alive(Arc::downgrade(&inner)));
        Ok(E2bSandbox { inner, layout })
    }
}

fn check_envd_version(v: &str) -> Result<()> {
    let mut parts = v.trim_start_matches('v').split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u64>()
            .unwrap_or(0)
    });
    let got = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    if got < MIN_ENVD {
        return Err(Error::backend(
            KIND,
            BackendFailure::Rejected,
            format!(
                "the sandbox's envd is version {v:?}, older than the 0.1.0 berth needs; rebuild the template with a current E2B base image"
            ),
        ));
    }
    Ok(())
}

/// What E2B's allow-list cannot promise that berth's proxy does.
pub const NATIVE_LIMITS: &str = "E2B filters names by the TLS SNI and HTTP Host a program sends on \
ports 80 and 443, not by the address connected to: a name allowed here that resolves to a private \
or metadata address is not refused by address; lookups through E2B's resolver (8.8.8.8) stay open, \
so a lookup can carry data out; connections are not asked about, not reported as berth events, and \
get no credentials from berth";

#[async_trait]
impl Backend for E2bBackend {
    fn kind(&self) -> berth_core::backend::BackendKind {
        berth_core::backend::BackendKind::E2b
    }

    fn network_door(&self) -> std::result::Result<(), String> {
        Err("E2B holds `--network allow:` rules with its own allow-list, not berth's proxy".into())
    }

    fn native_allow_list(&self) -> Option<(&'static str, &'static str)> {
        Some(("E2B", NATIVE_LIMITS))
    }

    async fn set_allow_list(&self, spec: &SandboxSpec) -> Result<()> {
        let list = spec.allow_list.as_ref().ok_or_else(|| {
            Error::InvalidInput(format!(
                "sandbox `{}` has no allow-list to give E2B",
                spec.name
            ))
        })?;
        let Some(id) = self.sandbox_id(&spec.name).await? else {
            return Err(gone(
                &spec.name,
                "E2B has no such sandbox; its rules change when it is made again",
            ));
        };
        self.shared
            .api
            .set_network(&id, &spec.name, &api::NetworkConfig::only(list))
            .await
    }

    async fn provision(&self, spec: &SandboxSpec) -> Result<Provisioned> {
        check_sandbox_name(&spec.name)?;
        let mut recreated = None;
        if let Some(found) = self.find(&spec.name).await?.into_iter().next() {
            match self.attach(&found.sandbox_id, spec).await? {
                Some(sb) => {
                    return Ok(Provisioned {
                        sandbox: Arc::new(sb),
                        created: false,
                        recreated: None,
                    });
                }
                None => {
                    recreated = Some(format!(
                        "E2B sandbox {} was gone when berth reconnected; a new one was created (files in the old one are lost)",
                        found.sandbox_id
                    ));
                }
            }
        }
        let timeout = self.timeout_for(spec)?;
        let template = spec
            .option("template")
            .or(spec.image.as_deref())
            .unwrap_or(&self.shared.cfg.template)
            .to_string();
        let mut metadata = BTreeMap::new();
        metadata.insert(LABEL_MANAGED.to_string(), "true".to_string());
        metadata.insert(LABEL_SANDBOX.to_string(), spec.name.clone());
        let rec = self
            .shared
            .api
            .create(&NewSandbox {
                template_id: template,
                timeout,
                metadata,
                env_vars: spec.env.clone(),
                // With an allow-list, E2B's filter decides; without, the
                // sandbox is open or closed.
                allow_internet_access: spec.network.is_open() || spec.allow_list.is_some(),
                network: spec.allow_list.as_ref().map(api::NetworkConfig::only),
            })
            .await?;
        debug!(sandbox = %spec.name, id = %rec.sandbox_id, "created an e2b sandbox");
        let sb = match self.open(rec.clone(), spec, timeout).await {
            Ok(sb) => sb,
            Err(e) => {
                // A sandbox berth cannot use would only cost money: kill it.
                let _ = self.shared.api.kill(&rec.sandbox_id).await;
                return Err(e);
            }
        };
        Ok(Provisioned {
            sandbox: Arc::new(sb),
            created: recreated.is_none(),
            recreated,
        })
    }

    async fn list(&self) -> Result<Vec<SandboxInfo>> {
        let found = self.shared.api.list(&[(LABEL_MANAGED, "true")]).await?;
        Ok(found
            .into_iter()
            .map(|s| SandboxInfo {
                name: s
                    .metadata
                    .get(LABEL_SANDBOX)
                    .cloned()
                    .unwrap_or_else(|| s.sandbox_id.clone()),
                created_unix: s.started_at.as_deref().and_then(parse_rfc3339),
                id: s.sandbox_id,
                state: s.state,
            })
            .collect())
    }

    async fn remove(&self, name: &str, _opts: RemoveOpts) -> Result<()> {
        check_sandbox_name(name)?;
        for s in self.find(name).await? {
            self.shared.api.kill(&s.sandbox_id).await?;
        }
        Ok(())
    }
}

/// Unix seconds of an RFC 3339 timestamp (`2024-05-01T12:00:00.123Z`, or
/// with an offset).
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let num = |a: usize, b: usize| s.get(a..b)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, se) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let mut rest = s.get(19..)?;
    if let Some(r) = rest.strip_prefix('.') {
        rest = r.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    let offset = match rest {
        "Z" | "z" => 0,
        r if r.len() == 6 && (r.starts_with('+') || r.starts_with('-')) => {
            let oh: i64 = r.get(1..3)?.parse().ok()?;
            let om: i64 = r.get(4..6)?.parse().ok()?;
            let o = oh * 3600 + om * 60;
            if r.starts_with('-') { -o } else { o }
        }
        _ => return None,
    };
    // Howard Hinnant's days-from-civil.
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se - offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_with_fractions_and_offsets() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2023-11-14T22:13:20.123456Z"),
            Some(1_700_000_000)
        );
        assert_eq!(
            parse_rfc3339("2023-11-15T00:13:20+02:00"),
            Some(1_700_000_000)
        );
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(951_782_400));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }

    #[test]
    fn defaults_target_the_real_service() {
        let c = E2bConfig::from_lookup(|k| (k == "E2B_API_KEY").then(|| "e2b_x".to_string()));
        assert_eq!(c.api_url, "https://api.e2b.app");
        assert_eq!(c.envd_url("abc", None), "https://49983-abc.e2b.app");
        assert_eq!(
            c.envd_url("abc", Some("eu.e2b.dev")),
            "https://49983-abc.eu.e2b.dev"
        );
        assert_eq!(c.template, "base");
        let c = E2bConfig::from_lookup(|k| (k == "E2B_DOMAIN").then(|| "example.org".to_string()));
        assert_eq!(c.api_url, "https://api.example.org");
        assert!(c.api_key.is_none());
        assert!(
            !format!(
                "{:?}",
                E2bConfig::from_lookup(|k| (k == "E2B_API_KEY").then(|| "e2b_s3cr3t".into()))
            )
            .contains("s3cr3t")
        );
    }

    #[test]
    fn backoff_is_jittered_under_a_doubling_cap() {
        let p = RetryPolicy::default();
        for attempt in 0..10 {
            let cap = p.base_delay.saturating_mul(1 << attempt).min(p.max_delay);
            assert!(p.backoff(attempt) <= cap);
        }
    }

    #[test]
    fn old_envd_is_refused() {
        assert!(check_envd_version("0.0.9").is_err());
        assert!(check_envd_version("0.1.0").is_ok());
        assert!(check_envd_version("0.5.7").is_ok());
    }
}
