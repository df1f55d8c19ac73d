//! The webhooks' part of berth's config file (`[[webhooks]]`). The server
//! reads only this part, so a key it does not know elsewhere in the file (a
//! provider's, say, which `berth run` checks) does not stop notifications.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

/// The part of the file read here.
#[derive(Debug, Default, Deserialize)]
struct Part {
    #[serde(default)]
    webhooks: Vec<Webhook>,
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

/// The webhooks in the config file at `path` (none where it does not exist).
pub fn load(path: &Path) -> Result<(Vec<Webhook>, PathBuf)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), path.into())),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let part: Part = toml::from_str(&text)
        .with_context(|| format!("{} is not a valid berth config", path.display()))?;
    Ok((part.webhooks, path.into()))
}
