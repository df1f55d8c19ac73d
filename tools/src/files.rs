//! `read_file`, `write_file`, `edit_file`: file access through the gate.
//!
//! Flow at a glance: resolve the path (relative to the cwd of the session
//! `terminal` runs in, as its last command left it, `.` and `..` applied), refuse berth's own directory in the sandbox, judge the operation
//! with the policy's file rules (an *ask* becomes an approval like a command's),
//! then read or write through the backend with a deadline, so a FIFO or a stuck
//! transport cannot hold the call (or the server) forever. A read is redacted
//! whole before lines are picked from it.

use std::time::Duration;

use berth_policies::{Action, FileOp};
use serde_json::json;

use super::args::{EditFileArgs, ReadFileArgs, WriteFileArgs};
use super::terminal::admit;
use super::{Call, ToolOutcome};
use berth_core::backend::Sandbox;

/// The largest file the file tools load.
const READ_MAX: u64 = 16 * 1024 * 1024;
/// Lines `read_file` returns by default.
const DEFAULT_LINES: u64 = 2000;
/// Deadline of one file operation in the sandbox.
const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// `path` made absolute against `workdir` with `.` and `..` applied.
pub(crate) fn resolve(workdir: &str, path: &str) -> Result<String, ToolOutcome> {
    if path.is_empty() {
        return Err(ToolOutcome::invalid("invalid argument `path`: it is empty"));
    }
    if path.contains('\0') {
        return Err(ToolOutcome::invalid(
            "invalid argument `path`: it contains a NUL byte",
        ));
    }
    Ok(berth_core::backend::normalize_path(workdir, path))
}

/// The directory a relative path starts from: the cwd of the session
/// `terminal` runs in, as its last command left it, so `write_file
/// notes/todo.txt` and `cat notes/todo.txt` name the same file; the
/// workspace before any command ran there (a session starts in it).
fn base_dir(call: &Call<'_>, workdir: &str) -> String {
    let ctx = call.ctx;
    ctx.runtime
        .store()
        .session_cwd(ctx.backend, &ctx.sandbox, &ctx.session)
        .ok()
        .flatten()
        .filter(|c| c.starts_with('/'))
        .unwrap_or_else(|| workdir.to_string())
}

/// How a result names the file: its absolute path, and for a relative
/// path, the directory it was taken from.
fn named(abs: &str, path: &str, base: &str) -> String {
    if path.starts_with('/') {
        abs.to_string()
    } else {
        format!("{abs} (`{path}` from the shell's cwd, {base})")
    }
}

/// The sandbox, the resolved path, the directory a relative path started
/// from, and the gate's admission for `op` on it.
async fn gated(
    call: &Call<'_>,
    op: FileOp,
    path: &str,
) -> Result<(std::sync::Arc<dyn Sandbox>, String, String), ToolOutcome> {
    let ctx = call.ctx;
    let rt = &ctx.runtime;
    let sb = rt
        .attach(ctx.backend, &ctx.sandbox)
        .await
        .map_err(ToolOutcome::from)?;
    let layout = sb.layout().clone();
    let base = base_dir(call, &layout.workdir);
    let abs = resolve(&base, path)?;
    let tool = match op {
        FileOp::Read => "read_file",
        FileOp::Write => "write_file",
    };
    let subject = format!("{tool} {abs}");
    let verdict =
        berth_core::gate::judge_file(rt.gate().map(|g| g.as_ref()), op, &abs, &layout, &subject);
    match verdict {
        Some(v) if rt.gate().is_some() => admit(call, &subject, Some(v)).await?,
        Some(v) if v.action != Action::Allow => {
            return Err(ToolOutcome::new(
                super::OutcomeKind::Denied {
                    rule: v.rule.clone(),
                },
                format!("refused: {} (rule `{}`)", v.reason, v.rule),
            ));
        }
        _ => {}
    }
    Ok((sb, abs, base))
}

async fn load(sb: &dyn Sandbox, abs: &str) -> Result<Vec<u8>, ToolOutcome> {
    match tokio::time::timeout(FILE_TIMEOUT, sb.read_file(abs, READ_MAX + 1)).await {
        Ok(r) => r.map_err(ToolOutcome::from),
        Err(_) => Err(ToolOutcome::error(format!(
            "reading `{abs}` did not finish within {}s (is it a FIFO or a device?)",
            FILE_TIMEOUT.as_secs()
        ))),
    }
}

async fn store(sb: &dyn Sandbox, abs: &str, data: &[u8]) -> Result<(), ToolOutcome> {
    match tokio::time::timeout(FILE_TIMEOUT, sb.write_file(abs, data, 0o644)).await {
        Ok(r) => r.map_err(ToolOutcome::from),
        Err(_) => Err(ToolOutcome::error(format!(
            "writing `{abs}` did not finish within {}s",
            FILE_TIMEOUT.as_secs()
        ))),
    }
}

pub(crate) async fn read(call: &Call<'_>, a: ReadFileArgs) -> ToolOutcome {
    let (sb, abs, base) = match gated(call, FileOp::Read, &a.path).await {
        Ok(x) => x,
        Err(o) => return o,
    };
    let data = match load(sb.as_ref(), &abs).await {
        Ok(d) => d,
        Err(mut o) => {
            o.text = format!("{}; the path was {}", o.text, named(&abs, &a.path, &base));
            return o;
        }
    };
    if data.len() as u64 > READ_MAX {
        return ToolOutcome::error(format!(
            "`{abs}` is larger than {} MiB; read parts of it with the terminal tool (e.g. `sed -n '1,200p'`, `head -c`)",
            READ_MAX >> 20
        ));
    }
    if data[..data.len().min(8000)].contains(&0) {
        return ToolOutcome::ok(
            format!("`{abs}` is a binary file ({} bytes); not shown", data.len()),
            json!({ "path": abs, "bytes": data.len(), "binary": true }),
        );
    }
    // Redacted whole, so a secret is masked whatever lines are picked.
    let data = match call.ctx.runtime.gate() {
        Some(g) => g.redact_bytes(&data).into_owned(),
        None => data,
    };
    let text = String::from_utf8_lossy(&data);
    let first = a.offset.unwrap_or(1).max(1);
    let limit = a.limit.unwrap_or(DEFAULT_LINES).max(1);
    let total = text.lines().count() as u64;
    // Lines up to what one result may hold, so none is cut out of the
    // middle of a page and skipped by the next offset.
    let room = super::output::result_cap(&call.ctx.runtime, &call.ctx.sandbox)
        .saturating_sub(super::output::TRAILER_ROOM)
        .max(512);
    let mut used = 0usize;
    let picked: Vec<&str> = text
        .lines()
        .skip((first - 1) as usize)
        .take(limit as usize)
        .take_while(|l| {
            used += l.len() + 1;
            used <= room || used == l.len() + 1
        })
        .collect();
    let last = first - 1 + picked.len() as u64;
    let mut out = picked.join("\n");
    if text.ends_with('\n') && last == total && !out.is_empty() {
        out.push('\n');
    }
    if picked.is_empty() && total > 0 {
        out = format!("[berth: `{abs}` has {total} lines; offset {first} is past the end]");
    } else if last < total {
        out.push_str(&format!(
            "\n[berth: lines {first}-{last} of {total}; read on with offset={}]",
            last + 1
        ));
    }
    ToolOutcome::ok(
        out,
        json!({ "path": abs, "base": base, "bytes": data.len(), "lines": total, "first": first, "last": last }),
    )
}

pub(crate) async fn write(call: &Call<'_>, a: WriteFileArgs) -> ToolOutcome {
    let (sb, abs, base) = match gated(call, FileOp::Write, &a.path).await {
        Ok(x) => x,
        Err(o) => return o,
    };
    if let Err(o) = store(sb.as_ref(), &abs, a.content.as_bytes()).await {
        return o;
    }
    ToolOutcome::ok(
        format!(
            "wrote {} bytes to {}",
            a.content.len(),
            named(&abs, &a.path, &base)
        ),
        json!({ "path": abs, "base": base, "bytes": a.content.len() }),
    )
}

pub(crate) async fn edit(call: &Call<'_>, a: EditFileArgs) -> ToolOutcome {
    if a.old.is_empty() {
        return ToolOutcome::invalid(
            "invalid argument `old`: it is empty; to create a file use write_file",
        );
    }
    if a.old == a.new {
        return ToolOutcome::invalid("invalid arguments: `old` and `new` are the same");
    }
    let (sb, abs, base) = match gated(call, FileOp::Read, &a.path).await {
        Ok(x) => x,
        Err(o) => return o,
    };
    if let Err(o) = gated(call, FileOp::Write, &a.path).await {
        return o;
    }
    let data = match load(sb.as_ref(), &abs).await {
        Ok(d) => d,
        Err(o) => return o,
    };
    if data.len() as u64 > READ_MAX {
        return ToolOutcome::error(format!(
            "`{abs}` is larger than {} MiB; edit it with the terminal tool",
            READ_MAX >> 20
        ));
    }
    let Ok(text) = String::from_utf8(data) else {
        return ToolOutcome::error(format!(
            "`{abs}` is not UTF-8 text; edit it with the terminal tool"
        ));
    };
    let count = text.matches(a.old.as_str()).count();
    match count {
        0 => {
            return ToolOutcome::error(format!(
                "`old` was not found in {abs}; nothing changed. Read the file again and copy the text exactly (whitespace and indentation count)"
            ));
        }
        1 => {}
        n => {
            return ToolOutcome::error(format!(
                "`old` occurs {n} times in {abs}; nothing changed. Include more surrounding lines so it matches exactly once"
            ));
        }
    }
    let line = text[..text.find(a.old.as_str()).unwrap_or(0)]
        .matches('\n')
        .count()
        + 1;
    let updated = text.replacen(a.old.as_str(), &a.new, 1);
    if let Err(o) = store(sb.as_ref(), &abs, updated.as_bytes()).await {
        return o;
    }
    ToolOutcome::ok(
        format!(
            "replaced 1 occurrence in {} at line {line}",
            named(&abs, &a.path, &base)
        ),
        json!({ "path": abs, "base": base, "line": line, "bytes": updated.len() }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_workspace() {
        let r = |p| resolve("/work/", p).map_err(|o| o.text);
        assert_eq!(r("a/b").as_deref(), Ok("/work/a/b"));
        assert_eq!(r("./a/../b").as_deref(), Ok("/work/b"));
        assert_eq!(r("../../etc/passwd").as_deref(), Ok("/etc/passwd"));
        assert_eq!(r("/x//y/").as_deref(), Ok("/x/y"));
        assert!(r("").is_err());
        assert!(r("a\0b").is_err());
    }
}
