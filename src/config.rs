//! berth's config file (TOML): model providers for `berth run`, and the
//! webhooks `berth serve` tells about runs, approvals and watch matches.
//! Secrets never go in it: a provider names the variable holding its key,
//! and a webhook may name the variable holding its URL (Slack's and
//! Discord's URLs are credentials).

use std::path::PathBuf;

use anyhow::{Context, Result};
use berth_agent::provider::ProviderConfig;
use serde::Deserialize;

/// The file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Providers by name.
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    /// The provider(s) used when none is named.
    #[serde(default)]
    pub default_provider: Option<String>,
    /// Where to POST notifications.
    #[serde(default)]
    pub webhooks: Vec<Webhook>,
}

/// A webhook: where, in which format, about what.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// The URL.
    #[serde(default)]
    pub url: Option<String>,
    /// Or the variable that holds it.
    #[serde(default)]
    pub url_env: Option<String>,
    /// `slack`, `discord` or `json` (default).
    #[serde(default)]
    pub format: HookFormat,
    /// Which events: `run.ended`, `approval.requested`, `job.watch`
    /// (default: all three).
    #[serde(default)]
    pub events: Option<Vec<String>>,
}

/// A webhook's message format.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum HookFormat {
    /// Slack's incoming webhooks: `{"text": …}`.
    Slack,
    /// Discord's: `{"content": …}`.
    Discord,
    /// berth's own: the event's facts and a `text`.
    #[default]
    Json,
}

impl Webhook {
    /// Its URL, from the file or the variable it names.
    pub fn resolve_url(&self) -> Result<String> {
        match (&self.url, &self.url_env) {
            (Some(u), None) => Ok(u.clone()),
            (None, Some(var)) => std::env::var(var)
                .with_context(|| format!("the webhook's url_env names ${var}, which is not set")),
            _ => anyhow::bail!("a [[webhooks]] entry needs exactly one of `url` and `url_env`"),
        }
    }
}

/// The config file: BERTH_CONFIG, else $XDG_CONFIG_HOME/berth/config.toml,
/// else ~/.config/berth/config.toml. It need not exist.
pub fn config_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BERTH_CONFIG").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(x) = std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(x).join("berth/config.toml"));
    }
    let home = std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .context("neither BERTH_CONFIG, XDG_CONFIG_HOME nor HOME is set; set BERTH_CONFIG=FILE")?;
    Ok(PathBuf::from(home).join(".config/berth/config.toml"))
}

/// The config and where it was looked for.
pub fn load_config() -> Result<(Config, PathBuf)> {
    let path = config_path()?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Config::default(), path)),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let cfg: Config = toml::from_str(&text)
        .with_context(|| format!("{} is not a valid berth config", path.display()))?;
    Ok((cfg, path))
}
