//! Idle reaping: sandboxes unused for longer than their policy's idle lifetime
//! are removed (`berth sandbox reap`). The store's `last_used` is the clock, so
//! this works the same after a restart and for every backend.

use serde::Serialize;

use crate::backend::BackendKind;

use crate::error::Result;
use crate::events::EventKind;
use crate::runtime::Runtime;
use crate::store::{Event, now_ms};

/// A sandbox found idle too long.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Idle {
    /// Backend short name.
    pub backend: BackendKind,
    /// Sandbox name.
    pub name: String,
    /// How long it has been unused, in seconds.
    pub idle_secs: u64,
    /// Its idle lifetime, in seconds.
    pub lifetime_secs: u64,
    /// Whether it was removed (false on a dry run, or when removal failed).
    pub removed: bool,
    /// Why removal failed, if it did.
    pub error: Option<String>,
}

/// Find, and unless `dry_run` remove, the sandboxes idle past their lifetime.
pub async fn reap_idle(rt: &Runtime, dry_run: bool) -> Result<Vec<Idle>> {
    let now = now_ms();
    let default_limits = berth_policies::Limits::default();
    let mut out = Vec::new();
    for row in rt.store().sandboxes(None)? {
        let limits = rt
            .gate()
            .map(|g| g.limits(&row.name).clone())
            .unwrap_or_else(|| default_limits.clone());
        let Some(lifetime) = limits.idle_lifetime() else {
            continue;
        };
        let idle_ms = (now - row.last_used).max(0) as u64;
        if idle_ms <= lifetime.as_millis() as u64 {
            continue;
        }
        let mut idle = Idle {
            backend: row.backend,
            name: row.name.clone(),
            idle_secs: idle_ms / 1000,
            lifetime_secs: lifetime.as_secs(),
            removed: false,
            error: None,
        };
        if !dry_run {
            match rt.remove_sandbox(row.backend, &row.name, true).await {
                Ok(()) => {
                    idle.removed = true;
                    rt.store().append(&Event {
                        kind: EventKind::SandboxReaped,
                        backend: Some(row.backend),
                        sandbox: Some(row.name.clone()),
                        detail: Some(
                            serde_json::json!({ "idle_secs": idle.idle_secs, "lifetime_secs": idle.lifetime_secs })
                                .to_string(),
                        ),
                        ..Default::default()
                    })?;
                }
                Err(e) => idle.error = Some(e.full_text()),
            }
        }
        out.push(idle);
    }
    Ok(out)
}
