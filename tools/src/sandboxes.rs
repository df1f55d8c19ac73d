//! `sandbox`: list, create and destroy sandboxes. The registry offers it only
//! when the policy turns it on (`[tools] sandbox = true`).

use serde_json::json;

use super::args::{SandboxAction, SandboxArgs};
use super::{Call, ToolOutcome};
use berth_core::backend::{BackendKind, SandboxSpec, check_sandbox_name};

pub(crate) async fn run(call: &Call<'_>, a: SandboxArgs) -> ToolOutcome {
    let ctx = call.ctx;
    let rt = &ctx.runtime;
    let backend = match a.backend.as_deref() {
        None => ctx.backend,
        Some(b) => match BackendKind::named(b) {
            Ok(k) => k,
            Err(e) => return ToolOutcome::invalid(format!("invalid arguments: {e}")),
        },
    };
    let name = || -> Result<String, ToolOutcome> {
        let Some(n) = a.name.clone().filter(|n| !n.is_empty()) else {
            return Err(ToolOutcome::invalid(format!(
                "invalid arguments: `name` is required for action {:?}",
                a.action
            )));
        };
        check_sandbox_name(&n).map_err(ToolOutcome::from)?;
        Ok(n)
    };
    match a.action {
        SandboxAction::List => match rt.list_sandboxes(backend).await {
            Ok(list) => {
                let text = if list.is_empty() {
                    format!("no sandboxes on {backend}")
                } else {
                    list.iter()
                        .map(|s| {
                            format!(
                                "{} ({}) {}{}",
                                s.name,
                                s.backend,
                                s.state,
                                if s.orphan { " orphan" } else { "" }
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                };
                ToolOutcome::ok(text, json!({ "sandboxes": list }))
            }
            Err(e) => e.into(),
        },
        SandboxAction::Create => {
            let n = match name() {
                Ok(n) => n,
                Err(o) => return o,
            };
            // The tool asks for no settings: a sandbox that exists is
            // attached to with its own (a new one gets the defaults), never
            // refused for settings the caller did not ask to change.
            let spec = match rt.store().sandbox(backend, &n) {
                Ok(Some(row)) => row.spec,
                Ok(None) => SandboxSpec::named(&n),
                Err(e) => return e.into(),
            };
            match rt.create_sandbox(backend, spec).await {
                Ok((_, created, recreated)) => ToolOutcome::ok(
                    format!(
                        "sandbox `{n}` ({backend}) {}",
                        if created {
                            "created"
                        } else {
                            "already existed"
                        }
                    ),
                    json!({ "name": n, "backend": backend, "created": created, "recreated": recreated }),
                ),
                Err(e) => e.into(),
            }
        }
        SandboxAction::Destroy => {
            let n = match name() {
                Ok(n) => n,
                Err(o) => return o,
            };
            if n == ctx.sandbox && backend == ctx.backend {
                return ToolOutcome::error(format!(
                    "`{n}` is the sandbox these tools run in; it cannot destroy itself"
                ));
            }
            match rt.remove_sandbox(backend, &n, true).await {
                Ok(()) => ToolOutcome::ok(
                    format!("sandbox `{n}` ({backend}) destroyed"),
                    json!({ "name": n, "backend": backend }),
                ),
                Err(e) => e.into(),
            }
        }
    }
}
