//! A session's shell as a child subreaper, on the backends whose sandboxes
//! berth starts no process of its own in (ssh, E2B, Modal): the local
//! backend's wrapper and docker's `tini -s` do the same there.

/// Whether `argv` spawned with `opts` starts a session's shell (the session
/// engine names its spawns `berth-shell:...`), not a job, a helper or a
/// terminal. Takes the two fields, so a caller may have moved the others.
pub(crate) fn is_shell(argv: &[String], replaces: Option<&str>, tty: bool) -> bool {
    replaces.is_some_and(|r| r.starts_with("berth-shell:"))
        && argv.first().is_some_and(|p| p == "bash")
        && !tty
}

/// Makes the process a child subreaper (`PR_SET_CHILD_SUBREAPER`, 36, which
/// an exec keeps), then execs `argv[1:]`; any failure of the first step is
/// ignored, so the program runs either way.
const SUBREAPER_PY: &str = "import ctypes, os, sys\ntry:\n    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)\nexcept Exception:\n    pass\nos.execvp(sys.argv[1], sys.argv[1:])";

/// `argv` (a session's shell) started as a child subreaper, so that a
/// process a command detaches (`(setsid sleep 1000 &)`) is adopted by the
/// shell and not by the host's (or container's) PID 1, and the tree kill
/// finds it below the shell, as on the local backend. bash cannot ask for
/// this itself; the sandbox's `python3` does, through libc's `prctl`, then
/// becomes the shell by exec (one pid: on ssh the shell stays the session
/// leader sshd made). A sandbox without python3 runs the shell as before,
/// and such a process survives a timeout there (docs/POLICIES.md says so).
pub(crate) fn as_subreaper(argv: &[String]) -> Vec<String> {
    let mut out: Vec<String> = [
        "sh",
        "-c",
        r#"py=$1; shift; if command -v python3 >/dev/null 2>&1; then exec python3 -c "$py" "$@"; fi; exec "$@""#,
        "berth-subreaper",
        SUBREAPER_PY,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    out.extend(argv.iter().cloned());
    out
}

/// `argv` as a spawn should run it: a session's shell wrapped by
/// [`as_subreaper`], anything else as given.
pub(crate) fn wrap<'a>(
    argv: &'a [String],
    replaces: Option<&str>,
    tty: bool,
) -> std::borrow::Cow<'a, [String]> {
    if is_shell(argv, replaces, tty) {
        std::borrow::Cow::Owned(as_subreaper(argv))
    } else {
        std::borrow::Cow::Borrowed(argv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_is_wrapped_and_runs_as_given() {
        let argv: Vec<String> = ["bash", "--noprofile"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let w = as_subreaper(&argv);
        assert_eq!(&w[..2], ["sh", "-c"]);
        assert!(w[4].contains("prctl(36, 1"));
        assert_eq!(&w[5..], &argv[..]);
        assert!(is_shell(&argv, Some("berth-shell:x"), false));
        assert!(!is_shell(&argv, Some("berth-shell:x"), true));
        assert!(!is_shell(&argv, None, false));
    }
}
