//! The launcher a spawn runs first on the backends whose transport carries
//! no environment or working directory berth may trust with a secret (ssh's
//! `exec` request, Kubernetes' `pods/exec`, both visible as argv or in an
//! audit log): `bash -c LAUNCHER berth-spawn CWD ARGV...` reads the
//! environment from the process's stdin as NUL-separated `KEY=VALUE` records
//! ending in an empty one (bash reads a pipe byte by byte, so it takes
//! nothing beyond), exports it, changes directory, checks that the program
//! exists, prints [`READY`] and `exec`s the program.

use berth_core::error::{Error, Result, SpawnFailure};

/// The token the launcher prints once the program is about to start.
pub(crate) const READY: &[u8] = b"berth-spawn-ready\n";

/// The launcher run by `bash -c`: `$1` is the cwd, the rest is argv. Exit codes
/// 121/122/123 before the ready token mean bad environment, bad cwd, not found;
/// they differ from the shell's own 126/127 so a host without bash is told apart
/// from a missing program.
/// It holds no backslash, so any POSIX login shell passes it through unchanged.
pub(crate) const LAUNCHER: &str = r#"while IFS= read -r -d '' __kv && [ -n "$__kv" ]; do export "$__kv" 2>/dev/null || exit 121; done; unset __kv; cd -- "$1" 2>/dev/null || exit 122; shift; command -v -- "$1" >/dev/null 2>&1 || exit 123; printf '%s\n' berth-spawn-ready; exec "$@""#;

/// The launcher for a program on a terminal, which starts raw and silent so
/// the environment block is neither echoed back nor edited by the line
/// discipline; once it is read, `stty sane` gives the program an ordinary
/// terminal. The ready token is printed before, while output is still
/// untranslated, so it arrives byte for byte.
pub(crate) const TERMINAL_LAUNCHER: &str = r#"while IFS= read -r -d '' __kv && [ -n "$__kv" ]; do export "$__kv" 2>/dev/null || exit 121; done; unset __kv; cd -- "$1" 2>/dev/null || exit 122; shift; command -v -- "$1" >/dev/null 2>&1 || exit 123; printf '%s\n' berth-spawn-ready; stty sane 2>/dev/null; exec "$@""#;

/// The launcher exited 121: an environment variable was refused.
pub(crate) const BAD_ENV: i32 = 121;
/// The launcher exited 122: the working directory is not there.
pub(crate) const BAD_CWD: i32 = 122;
/// The launcher exited 123: no such program.
pub(crate) const NOT_FOUND: i32 = 123;

/// `env` as the launcher reads it from stdin, after checking that every
/// name is a shell name and no value holds a NUL.
pub(crate) fn env_block(env: &[(String, String)]) -> Result<Vec<u8>> {
    let mut block = Vec::new();
    for (k, v) in env {
        let valid = !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(Error::InvalidInput(format!(
                "environment variable name {k:?} is not a valid shell name"
            )));
        }
        if v.contains('\0') {
            return Err(Error::InvalidInput(format!(
                "environment variable {k} holds a NUL byte, which no environment can carry"
            )));
        }
        block.extend_from_slice(k.as_bytes());
        block.push(b'=');
        block.extend_from_slice(v.as_bytes());
        block.push(0);
    }
    block.push(0);
    Ok(block)
}

/// The launcher's own exit before [`READY`] as berth's error, where its code
/// is one of the launcher's; `None` for any other code. `place` says where
/// (`host.example`, `pod berth-…`).
pub(crate) fn refusal(code: i32, program: &str, cwd: &str, place: &str) -> Option<Error> {
    let (kind, detail) = match code {
        BAD_CWD => (
            SpawnFailure::BadCwd,
            format!("working directory {cwd} does not exist on {place}"),
        ),
        NOT_FOUND => (
            SpawnFailure::NotFound,
            format!("no such program on {place}"),
        ),
        BAD_ENV => (
            SpawnFailure::Other,
            "the remote shell rejected an environment variable".to_string(),
        ),
        _ => return None,
    };
    Some(Error::Spawn {
        kind,
        program: program.into(),
        detail,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_block_ends_in_an_empty_record_and_refuses_what_no_environment_holds() {
        let b = env_block(&[("A".into(), "x y".into()), ("B_2".into(), "".into())]).unwrap();
        assert_eq!(b, b"A=x y\0B_2=\0\0");
        assert!(env_block(&[("1A".into(), "v".into())]).is_err());
        assert!(env_block(&[("A-B".into(), "v".into())]).is_err());
        assert!(env_block(&[("A".into(), "a\0b".into())]).is_err());
    }

    /// `bash -c LAUNCHER` in `cwd`, as a backend starts it.
    fn launcher(cwd: &str) -> std::process::Command {
        let mut c = std::process::Command::new("bash");
        c.args(["--noprofile", "--norc", "-c", LAUNCHER, "berth-spawn", cwd]);
        c
    }

    /// The launcher as bash runs it: the environment from stdin, the cwd,
    /// the ready token, then the program with the rest of stdin.
    #[test]
    fn the_launcher_exports_the_block_and_leaves_the_rest_of_stdin() {
        use std::io::Write;
        let mut child = launcher("/tmp")
            .args(["sh", "-c", "pwd; printf '%s\\n' \"$GREETING\"; cat"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = env_block(&[("GREETING".into(), "hello\nthere".into())]).unwrap();
        input.extend_from_slice(b"rest of stdin\n");
        child.stdin.take().unwrap().write_all(&input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "berth-spawn-ready\n/tmp\nhello\nthere\nrest of stdin\n"
        );
        let code = |cwd: &str, program: &str| {
            launcher(cwd)
                .arg(program)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
                .status
                .code()
                .unwrap()
        };
        assert_eq!(code("/nonexistent-dir", "true"), BAD_CWD);
        assert_eq!(code("/tmp", "no-such-program-berth"), NOT_FOUND);
    }
}
