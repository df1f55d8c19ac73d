//! Credentials and settings: where berth finds Modal's token, and what it
//! sends with every call.
//!
//! Flow at a glance:
//! - [`ModalSettings`] (in the crate root) carries what the environment said:
//!   `MODAL_TOKEN_ID`/`MODAL_TOKEN_SECRET`, `MODAL_SERVER_URL`, `MODAL_PROFILE`,
//!   `MODAL_CONFIG_PATH`, `MODAL_ENVIRONMENT`.
//! - [`Resolved::from_settings`] fills the gaps from `~/.modal.toml` (the file
//!   `modal token new` writes): the profile named by `MODAL_PROFILE`, else the
//!   one marked `active = true`, else the only one.
//! - Every control-plane call carries the token headers; [`TokenCache`] adds the
//!   short-lived JWT from `AuthTokenGet`, refreshed before its `exp`.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use berth_core::backend::BackendKind;
use berth_core::error::{BackendFailure, Error, Result};

use crate::ModalSettings;

/// [`BackendKind`] rather than taken from the parent module, which uses this
/// one's client.
const KIND: &str = BackendKind::Modal.as_str();

/// Modal's public API endpoint.
pub const DEFAULT_SERVER_URL: &str = "https://api.modal.com:443";
/// What berth says it is in `x-modal-client-type`: the spec's CLIENT_TYPE_CLIENT.
pub const CLIENT_TYPE: &str = "1";
/// What berth says its version is in `x-modal-client-version`. The server uses
/// it to refuse clients it no longer supports; berth speaks the protocol of
/// this SDK release.
pub const CLIENT_VERSION: &str = "1.6.4";
/// Refresh a JWT this long before it expires.
const REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);

/// Settings with the token found.
#[derive(Clone)]
pub struct Resolved {
    /// The control plane's URL.
    pub server_url: String,
    /// The token id (`ak-…`).
    pub token_id: String,
    /// The token secret (`as-…`).
    pub token_secret: String,
    /// Where the token came from, for error messages.
    pub source: String,
    /// The Modal environment (empty: the workspace's default).
    pub environment: String,
    /// The Modal app berth's sandboxes belong to.
    pub app: String,
}

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolved")
            .field("server_url", &self.server_url)
            .field("token_id", &self.token_id)
            .field("token_secret", &"<redacted>")
            .field("source", &self.source)
            .field("environment", &self.environment)
            .field("app", &self.app)
            .finish()
    }
}

/// One profile of `~/.modal.toml`.
#[derive(Default, Debug, serde::Deserialize)]
struct Profile {
    token_id: Option<String>,
    token_secret: Option<String>,
    server_url: Option<String>,
    environment: Option<String>,
    #[serde(default)]
    active: bool,
}

/// How to get credentials, said once for every error that lacks them.
pub const CREDENTIALS_HINT: &str = "set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET (from https://modal.com/settings/tokens), or run `modal token new` to write ~/.modal.toml";

impl Resolved {
    /// Resolve the settings: explicit values first, then `~/.modal.toml`.
    pub fn from_settings(s: &ModalSettings) -> Result<Self> {
        let path = s
            .config_path
            .clone()
            .or_else(|| s.home.as_ref().map(|h| h.join(".modal.toml")));
        let profile = match &path {
            Some(p) => read_profile(p, s.profile.as_deref())?,
            None => None,
        };
        let (pname, prof) = profile.unwrap_or_default();
        let from_file = |what: &str| {
            format!(
                "{what} from profile `{pname}` of {}",
                path.as_deref()
                    .map(Path::display)
                    .map(|d| d.to_string())
                    .unwrap_or_default()
            )
        };
        let (token_id, token_secret, source) = match (&s.token_id, &s.token_secret) {
            (Some(id), Some(secret)) => (
                id.clone(),
                secret.clone(),
                "MODAL_TOKEN_ID/MODAL_TOKEN_SECRET".to_string(),
            ),
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::InvalidInput(format!(
                    "modal: only one of MODAL_TOKEN_ID and MODAL_TOKEN_SECRET is set; {CREDENTIALS_HINT}"
                )));
            }
            (None, None) => match (prof.token_id.clone(), prof.token_secret.clone()) {
                (Some(id), Some(secret)) => (id, secret, from_file("token")),
                _ => {
                    return Err(Error::unreachable(
                        KIND,
                        BackendFailure::Auth,
                        "no Modal credentials: MODAL_TOKEN_ID and MODAL_TOKEN_SECRET are unset and ~/.modal.toml has no token",
                        CREDENTIALS_HINT,
                    ));
                }
            },
        };
        let server_url = s
            .server_url
            .clone()
            .or(prof.server_url)
            .unwrap_or_else(|| DEFAULT_SERVER_URL.to_string());
        Ok(Self {
            server_url,
            token_id,
            token_secret,
            source,
            environment: s
                .environment
                .clone()
                .or(prof.environment)
                .unwrap_or_default(),
            app: s.app.clone().unwrap_or_else(|| "berth".to_string()),
        })
    }
}

/// The chosen profile of a `.modal.toml`, or `None` when the file is missing.
fn read_profile(path: &Path, wanted: Option<&str>) -> Result<Option<(String, Profile)>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("reading the Modal config", path, e)),
    };
    let mut profiles: std::collections::BTreeMap<String, Profile> =
        toml::from_str(&text).map_err(|e| {
            Error::InvalidInput(format!(
                "modal: {} is not a valid Modal config: {e}",
                path.display()
            ))
        })?;
    if let Some(name) = wanted {
        return match profiles.remove(name) {
            Some(p) => Ok(Some((name.to_string(), p))),
            None => Err(Error::InvalidInput(format!(
                "modal: MODAL_PROFILE is `{name}` but {} has no such profile (it has: {})",
                path.display(),
                profiles.keys().cloned().collect::<Vec<_>>().join(", ")
            ))),
        };
    }
    if let Some(name) = profiles
        .iter()
        .find(|(_, p)| p.active)
        .map(|(n, _)| n.clone())
    {
        return Ok(profiles.remove(&name).map(|p| (name, p)));
    }
    if profiles.len() == 1 {
        return Ok(profiles.pop_first());
    }
    Ok(None)
}

/// The `exp` claim of a JWT, read without verifying it (the server verifies).
pub fn jwt_expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = v.get("exp")?.as_f64()?;
    Some(UNIX_EPOCH + Duration::from_secs_f64(exp.max(0.0)))
}

/// A JWT and when to fetch a new one.
#[derive(Clone, Debug)]
pub struct CachedToken {
    /// The token itself.
    pub token: String,
    refresh_at: SystemTime,
}

impl CachedToken {
    /// Cache `token`: refresh it [`REFRESH_MARGIN`] before its expiry, or half
    /// way through a shorter life. A token without `exp` is used until the
    /// server rejects it.
    pub fn new(token: String) -> Self {
        let now = SystemTime::now();
        let refresh_at = match jwt_expiry(&token) {
            Some(exp) => {
                let life = exp.duration_since(now).unwrap_or_default();
                let margin = REFRESH_MARGIN.min(life / 2);
                exp.checked_sub(margin).unwrap_or(now)
            }
            None => now + Duration::from_secs(20 * 60),
        };
        Self { token, refresh_at }
    }

    /// Whether the token is still good to send.
    pub fn fresh(&self) -> bool {
        SystemTime::now() < self.refresh_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(home: &Path) -> ModalSettings {
        ModalSettings {
            home: Some(home.to_path_buf()),
            ..ModalSettings::default()
        }
    }

    #[test]
    fn env_wins_over_the_file() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", "/tmp", e))?;
        std::fs::write(
            dir.path().join(".modal.toml"),
            "[a]\ntoken_id = \"ak-file\"\ntoken_secret = \"as-file\"\n",
        )
        .map_err(|e| Error::io("write", dir.path(), e))?;
        let mut s = settings(dir.path());
        let r = Resolved::from_settings(&s)?;
        assert_eq!(r.token_id, "ak-file");
        assert!(r.source.contains("profile `a`"), "{}", r.source);
        s.token_id = Some("ak-env".into());
        s.token_secret = Some("as-env".into());
        let r = Resolved::from_settings(&s)?;
        assert_eq!(
            (r.token_id.as_str(), r.server_url.as_str()),
            ("ak-env", DEFAULT_SERVER_URL)
        );
        Ok(())
    }

    #[test]
    fn the_active_profile_is_chosen_and_a_missing_one_is_named() -> Result<()> {
        let dir = tempfile::tempdir().map_err(|e| Error::io("tempdir", "/tmp", e))?;
        std::fs::write(
            dir.path().join(".modal.toml"),
            "[a]\ntoken_id = \"ak-a\"\ntoken_secret = \"as-a\"\n[b]\ntoken_id = \"ak-b\"\ntoken_secret = \"as-b\"\nactive = true\n",
        )
        .map_err(|e| Error::io("write", dir.path(), e))?;
        let mut s = settings(dir.path());
        assert_eq!(Resolved::from_settings(&s)?.token_id, "ak-b");
        s.profile = Some("zzz".into());
        let e = Resolved::from_settings(&s).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("zzz") && e.contains("a, b")),
            "{e:?}"
        );
        Ok(())
    }

    #[test]
    fn no_credentials_names_the_variables() {
        let dir = tempfile::tempdir().ok();
        let s = settings(
            dir.as_ref()
                .map(|d| d.path())
                .unwrap_or(Path::new("/nonexistent")),
        );
        let e = Resolved::from_settings(&s)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("MODAL_TOKEN_ID") && e.contains("MODAL_TOKEN_SECRET"),
            "{e}"
        );
    }

    #[test]
    fn jwt_expiry_is_read_and_refresh_comes_early() {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let exp = SystemTime::now() + Duration::from_secs(3600);
        let secs = exp
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let tok = format!("{}.{}.sig", b64("{}"), b64(&format!("{{\"exp\":{secs}}}")));
        assert!(jwt_expiry(&tok).is_some());
        assert!(CachedToken::new(tok).fresh());
        let old = format!("{}.{}.sig", b64("{}"), b64("{\"exp\":10}"));
        assert!(!CachedToken::new(old).fresh());
    }
}
