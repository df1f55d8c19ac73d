//! `memory` and `history_search`: notes across runs, and a search over past
//! runs' transcripts (see [`crate::memory`]). How far they reach is the
//! policy's `[tools] memory`: a sandbox's own notes and runs by default.

use berth_policies::MemoryAccess;
use serde_json::json;

use super::args::{HistorySearchArgs, MemoryAction, MemoryArgs, MemoryScope};
use super::{Call, ToolOutcome};
use crate::memory::{self, Scope, View};
use berth_core::runtime::Runtime;

/// How many notes a search returns.
const NOTES_SHOWN: usize = 20;

/// The policy's reach for the memory tools (no policy: a sandbox's own).
pub(super) fn access(rt: &Runtime) -> MemoryAccess {
    rt.gate()
        .map(|g| g.policy().tools.memory)
        .unwrap_or_default()
}

fn view(call: &Call<'_>, reach: MemoryAccess) -> View {
    match reach {
        MemoryAccess::User => View::All,
        _ => View::Sandbox {
            backend: call.ctx.backend,
            sandbox: call.ctx.sandbox.clone(),
        },
    }
}

fn listing(notes: &[memory::Note]) -> String {
    notes
        .iter()
        .map(|n| format!("[{}] ({}) {}", n.id, n.scope, n.text))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn run(call: &Call<'_>, a: MemoryArgs) -> ToolOutcome {
    let rt = &call.ctx.runtime;
    let reach = access(rt);
    let redact = |t: &str| rt.redact(t);
    match a.action {
        MemoryAction::Add => {
            let Some(text) = a.text.as_deref() else {
                return ToolOutcome::invalid("invalid arguments: `text` is required to add a note");
            };
            let scope = match a.scope.unwrap_or_default() {
                MemoryScope::User if reach != MemoryAccess::User => {
                    return ToolOutcome::error(
                        "notes for every sandbox are a person's to write here (`berth memory add --user`), or the policy's [tools] memory = \"user\"; add it without a scope to keep it for this sandbox",
                    );
                }
                MemoryScope::User => Scope::User,
                MemoryScope::Sandbox => Scope::sandbox(call.ctx.backend, &call.ctx.sandbox),
            };
            match memory::add(rt.store(), &scope, text, "model", &redact) {
                Ok(n) => ToolOutcome::ok(
                    format!(
                        "kept note {} ({}); runs started from now on see it",
                        n.id, n.scope
                    ),
                    json!({ "note": n }),
                ),
                Err(e) => e.into(),
            }
        }
        MemoryAction::Search => {
            let v = view(call, reach);
            let found = match a.query.as_deref().filter(|q| !q.trim().is_empty()) {
                Some(q) => memory::search(rt.store(), &v, q, NOTES_SHOWN),
                None => memory::list(rt.store(), &v, NOTES_SHOWN),
            };
            match found {
                Ok(notes) if notes.is_empty() => {
                    ToolOutcome::ok("no notes match", json!({ "notes": [] }))
                }
                Ok(notes) => ToolOutcome::ok(listing(&notes), json!({ "notes": notes })),
                Err(e) => e.into(),
            }
        }
        MemoryAction::Forget => {
            let Some(id) = a.id else {
                return ToolOutcome::invalid(
                    "invalid arguments: `id` is required to forget a note (search shows ids)",
                );
            };
            let v = view(call, reach);
            match memory::forget(rt.store(), &v, id, reach == MemoryAccess::User) {
                Ok(n) => ToolOutcome::ok(format!("forgot note {}", n.id), json!({ "note": n })),
                Err(e) => e.into(),
            }
        }
    }
}

pub(super) fn history(call: &Call<'_>, a: HistorySearchArgs) -> ToolOutcome {
    let rt = &call.ctx.runtime;
    let limit = a.limit.unwrap_or(10).clamp(1, 50) as usize;
    let redact = |t: &str| rt.redact(t);
    let v = view(call, access(rt));
    let Some(history) = call.history else {
        return ToolOutcome::invalid(
            "history_search is not offered here: no run history was given",
        );
    };
    match history.search(rt.store(), &v, &a.query, limit, &redact) {
        Ok(hits) if hits.is_empty() => ToolOutcome::ok(
            "no past messages match; try fewer or other words",
            json!({ "hits": [] }),
        ),
        Ok(hits) => {
            let text = hits
                .iter()
                .map(|h| {
                    format!(
                        "run {} step {} ({}), task \"{}\":\n  {}",
                        h.run_id,
                        h.step,
                        h.role,
                        h.task.replace('\n', " "),
                        h.snippet.replace('\n', " ")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            ToolOutcome::ok(text, json!({ "hits": hits }))
        }
        Err(e) => e.into(),
    }
}
