//! berth's config file (TOML): model providers for `berth run`, and the
//! webhooks `berth serve` tells about runs, approvals and watch matches.
//! Secrets never go in it: a provider names the variable holding its key,
//! and a webhook may name the variable holding its URL (Slack's and
//! Discord's URLs are credentials).

use std::path::PathBuf;

use anyhow::{Context, Result};
use berth_agent::provider::ProviderConfig;
pub use berth_client::config_path;
pub use berth_webhooks::Webhook;
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
