//! A session's shell as a child subreaper, on the backends whose sandboxes
//! berth starts no process of its own in (ssh, E2B, Modal): the local
//! backend's wrapper does the same there, and on berth's own image (docker,
//! k8s) [`under_tini`] does it with the image's `tini -s`.

/// berth's image's copy of bash that its user may execute but not read (see
/// `images/setup.sh`): a process running it is not dumpable.
pub(crate) const PRIVATE_BASH: &str = "/usr/local/libexec/berth/bash";

/// berth's image's tini (also its entrypoint).
pub(crate) const TINI: &str = "/usr/bin/tini";

/// A session's shell `argv` (`bash ARGS`) as it runs on berth's image: under
/// a `tini -s` of its own, a child subreaper, so a process a command
/// detaches (`(setsid sleep 1000 &)`) is adopted by it, not by the
/// container's PID 1, and the tree kill finds it there; from the image's
/// execute-only copy of bash, which leaves it non-dumpable, so the processes
/// its commands start cannot read its memory or open its descriptors. An
/// image without tini or the copy runs without them.
#[cfg(any(feature = "docker", feature = "k8s"))]
pub(crate) fn under_tini(argv: &[String]) -> Vec<String> {
    let mut cmd = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!(
            r#"p={PRIVATE_BASH}; [ -x "$p" ] || p=bash; if [ -x {TINI} ]; then exec {TINI} -s -- setsid -w "$p" "$@"; fi; exec setsid -w "$p" "$@""#
        ),
        "bash".to_string(),
    ];
    cmd.extend(argv.iter().skip(1).cloned());
    cmd
}

/// Whether `argv` spawned with `opts` starts a session's shell (the session
/// engine names its spawns `berth-shell:...`), not a job, a helper or a
/// terminal. Takes the two fields, so a caller may have moved the others.
#[cfg(any(feature = "ssh", feature = "e2b", feature = "modal", feature = "k8s"))]
pub(crate) fn is_shell(argv: &[String], replaces: Option<&str>, tty: bool) -> bool {
    replaces.is_some_and(|r| r.starts_with("berth-shell:"))
        && argv.first().is_some_and(|p| p == "bash")
        && !tty
}

/// Makes the process a child subreaper (`PR_SET_CHILD_SUBREAPER`, 36, which
/// an exec keeps), then execs `argv[1:]` from a private copy: a close-on-exec
/// memfd of mode `0111` (`MFD_EXEC` where the kernel wants it said), which
/// its user may execute but not read, so the kernel leaves the shell
/// non-dumpable and a command's child cannot read the end nonce from its
/// memory (issue 49, item 8; `berth_sandbox::private` does the same on
/// local). Any failure of either step is ignored, so the program runs either
/// way.
#[cfg(any(feature = "ssh", feature = "e2b", feature = "modal"))]
const SUBREAPER_PY: &str = r#"import ctypes, os, shutil, sys
try:
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
except Exception:
    pass
try:
    exe = shutil.which(sys.argv[1])
    with open(exe, "rb") as f:
        data = f.read()
    try:
        fd = os.memfd_create("berth-private", os.MFD_CLOEXEC | 0x10)
    except OSError:
        fd = os.memfd_create("berth-private", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    ro = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC)
    os.close(fd)
    os.fchmod(ro, 0o111)
    os.execv("/proc/self/fd/%d" % ro, sys.argv[1:])
except Exception:
    pass
os.execvp(sys.argv[1], sys.argv[1:])"#;

/// `argv` (a session's shell) started as a child subreaper, so that a
/// process a command detaches (`(setsid sleep 1000 &)`) is adopted by the
/// shell and not by the host's (or container's) PID 1, and the tree kill
/// finds it below the shell, as on the local backend. bash cannot ask for
/// this itself; the sandbox's `python3` does, through libc's `prctl`, then
/// becomes the shell by exec (one pid: on ssh the shell stays the session
/// leader sshd made). A sandbox without python3 runs the shell as before,
/// and such a process survives a timeout there (docs/POLICIES.md says so).
#[cfg(any(feature = "ssh", feature = "e2b", feature = "modal"))]
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
#[cfg(any(feature = "ssh", feature = "e2b", feature = "modal"))]
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

#[cfg(all(test, feature = "ssh", feature = "e2b", feature = "modal"))]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Run `argv` as uid 65534 (the tests run as root, as CI does) and
    /// return its stdout.
    fn as_nobody(argv: &[String]) -> String {
        // SAFETY: geteuid takes no argument and cannot fail.
        let euid = unsafe { libc::geteuid() };
        assert!(
            euid == 0,
            "this test runs a shell as uid 65534 through setpriv; run it as root (as CI does)"
        );
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(argv)
            .current_dir("/")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Issue 49 item 8 on ssh, E2B and Modal: the shell the wrapper starts
    /// is not dumpable, so a child of the same uid cannot read its memory,
    /// where a plain bash's child can.
    #[test]
    fn the_wrapped_shell_is_not_dumpable_for_its_own_user() {
        let probe = r#"python3 -c 'import os
try:
    open("/proc/%d/mem" % os.getppid(), "rb").close(); print("read")
except OSError as e:
    print("denied", e.errno)'; exit"#;
        let shell: Vec<String> = ["bash", "-c", probe]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let plain = as_nobody(&shell);
        assert_eq!(plain, "read\n", "the control");
        let wrapped = as_nobody(&as_subreaper(&shell));
        assert_eq!(wrapped, "denied 13\n");
    }

    #[test]
    fn a_shell_is_wrapped_and_runs_as_given() {
        let argv: Vec<String> = ["bash", "--noprofile"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let w = as_subreaper(&argv);
        assert_eq!(&w[..2], ["sh", "-c"]);
        assert!(w[4].contains("prctl(36, 1"));
        assert!(w[4].contains("0o111"));
        assert_eq!(&w[5..], &argv[..]);
        assert!(is_shell(&argv, Some("berth-shell:x"), false));
        assert!(!is_shell(&argv, Some("berth-shell:x"), true));
        assert!(!is_shell(&argv, None, false));
    }
}
