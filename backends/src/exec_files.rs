//! Files, moved through short execs, on the backends with no file API
//! every sandbox offers (Modal's router, Kubernetes' `pods/exec`): every
//! image berth runs has a shell and coreutils.
//!
//! - read: `head -c LIMIT`, after telling a missing path (exit 44), a
//!   directory (exit 21) and a FIFO, socket or device (exit 45) apart from a
//!   read error.
//! - write: `cat` into a temporary file beside the target, `chmod`, then
//!   `mv` over the target, so a reader never sees half a file.
//!
//! The path is an argument, never part of the script text.

use std::time::Duration;

use berth_core::backend::{Sandbox, run_to_end};
use berth_core::error::{BackendFailure, Error, Result};

/// How long one file operation may take.
const FILE_TIMEOUT: Duration = Duration::from_secs(120);
const MISSING: i32 = 44;
const IS_DIR: i32 = 21;
const NOT_REGULAR: i32 = 45;

// A FIFO, socket or device is refused before `head` could block on it.
const READ: &str = r#"p=$1
if [ -d "$p" ]; then exit 21; fi
if [ ! -e "$p" ]; then exit 44; fi
if [ ! -f "$p" ]; then exit 45; fi
exec head -c "$2" -- "$p""#;

const WRITE: &str = r#"set -e
p=$1
d=$(dirname -- "$p")
mkdir -p -- "$d"
t="$d/.berth-write.$$"
trap 'rm -f -- "$t"' EXIT
cat > "$t"
chmod "$2" "$t"
mv -f -- "$t" "$p"
trap - EXIT"#;

fn argv(script: &str, path: &str, arg: String) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        script.into(),
        "berth-file".into(),
        path.into(),
        arg,
    ]
}

/// Up to `limit` bytes of `path` in `sb`, a sandbox of backend `kind`.
pub(crate) async fn read_file(
    sb: &dyn Sandbox,
    kind: &'static str,
    path: &str,
    limit: u64,
) -> Result<Vec<u8>> {
    let full = sb.layout().resolve(path);
    let c = run_to_end(
        sb,
        &argv(READ, &full, limit.to_string()),
        None,
        usize::try_from(limit).unwrap_or(usize::MAX),
        FILE_TIMEOUT,
    )
    .await?;
    match c.status.code {
        Some(0) => Ok(c.stdout),
        Some(MISSING) => Err(Error::NotFound {
            what: "file",
            name: path.into(),
            hint: String::new(),
        }),
        Some(IS_DIR) => Err(Error::InvalidInput(format!(
            "`{path}` is a directory, not a file"
        ))),
        Some(NOT_REGULAR) => Err(Error::InvalidInput(format!(
            "`{path}` in sandbox `{}` is not a regular file (a FIFO, device or socket); berth reads only regular files",
            sb.name()
        ))),
        _ => Err(Error::backend(
            kind,
            BackendFailure::Rejected,
            format!(
                "sandbox `{}`: reading `{path}` failed ({}): {}",
                sb.name(),
                c.status.shell_code(),
                String::from_utf8_lossy(&c.stderr).trim()
            ),
        )),
    }
}

/// `path` in `sb`, a sandbox of backend `kind`, made to hold `data` with
/// `mode`, replaced at once.
pub(crate) async fn write_file(
    sb: &dyn Sandbox,
    kind: &'static str,
    path: &str,
    data: &[u8],
    mode: u32,
) -> Result<()> {
    let full = sb.layout().resolve(path);
    let c = run_to_end(
        sb,
        &argv(WRITE, &full, format!("{:o}", mode & 0o7777)),
        Some(data),
        64 * 1024,
        FILE_TIMEOUT,
    )
    .await?;
    if c.status.code == Some(0) {
        return Ok(());
    }
    Err(Error::backend(
        kind,
        BackendFailure::Rejected,
        format!(
            "sandbox `{}`: writing `{path}` failed ({}): {}",
            sb.name(),
            c.status.shell_code(),
            String::from_utf8_lossy(&c.stderr).trim()
        ),
    ))
}
