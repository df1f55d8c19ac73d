//! The kernel-restricted local shell: each test tries an escape through
//! `berth __sandbox-exec` and must fail, with a control run (unrestricted, or
//! with the feature allowed) proving the same attempt works when not confined,
//! so none of these can pass by accident.
//!
//! Kernel-dependent: they need Landlock ABI >= 4, seccomp filters, and (when run
//! as root) a pids cgroup controller. On a kernel without them the wrapper
//! refuses to run (exit 125) and these tests FAIL with the wrapper's message
//! naming the missing feature; they never skip silently.
#![allow(clippy::expect_used, clippy::unwrap_used)] // in tests a panic is the failure report

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

struct Sandbox {
    _root: tempfile::TempDir,
    state: PathBuf,
    dir: PathBuf,
    name: String,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = Command::new(BERTH)
            .arg("__sandbox-exec")
            .arg("--sandbox-dir")
            .arg(&self.dir)
            .args(["--name", &self.name, "--remove-cgroup"])
            .status();
    }
}

impl Sandbox {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let state = root.path().join("state");
        // Unique per test, so each gets its own pids cgroup.
        let name = format!(
            "t{}",
            root.path()
                .file_name()
                .unwrap()
                .to_string_lossy()
                .replace('.', "")
        );
        let dir = state.join("sandboxes").join("local").join(&name);
        for sub in ["work", "tmp", ".berth"] {
            std::fs::create_dir_all(dir.join(sub)).expect("mkdir");
        }
        std::fs::write(state.join("berth.db"), "state").expect("write db");
        Self {
            _root: root,
            state,
            dir,
            name,
        }
    }

    fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    fn run_with(&self, policy: &str, extra: &[&str], script: &str) -> Output {
        let mut cmd = Command::new(BERTH);
        cmd.arg("__sandbox-exec")
            .arg("--policy")
            .arg(policy)
            .arg("--sandbox-dir")
            .arg(&self.dir)
            .arg("--name")
            .arg(&self.name)
            .args(extra)
            .arg("--")
            .args(["bash", "-c", script])
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("HOME", self.work())
            .env("TMPDIR", self.dir.join("tmp"))
            .current_dir(self.work());
        cmd.output().expect("run berth")
    }

    fn run(&self, script: &str) -> Output {
        self.run_with("{}", &[], script)
    }

    fn unrestricted(&self, script: &str) -> Output {
        self.run_with("{}", &["--unrestricted"], script)
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The wrapper must have run the script (not refused for a missing feature).
fn ran(o: &Output) {
    assert_ne!(
        o.status.code(),
        Some(125),
        "the kernel cannot enforce the sandbox, see stderr:\n{}",
        text(o)
    );
    assert_ne!(
        o.status.code(),
        Some(126),
        "wrapper setup failed:\n{}",
        text(o)
    );
}

#[test]
fn a_confined_shell_still_works_in_its_workspace() {
    let sb = Sandbox::new();
    let o = sb.run(
        "set -e; echo hello > f.txt; cat f.txt; mkdir -p d/e; mv f.txt d/e/; rm -r d; \
         echo t > \"$TMPDIR/x\"; cat \"$TMPDIR/x\"; echo b > .berth_probe; ls /usr/bin/env >/dev/null; \
         python3 -c 'print(6*7)'; echo x > /dev/null; test -r /etc/passwd && echo ok",
    );
    ran(&o);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "hello\nt\n42\nok\n",
        "{}",
        text(&o)
    );
}

#[test]
fn cannot_write_outside_the_workspace() {
    let sb = Sandbox::new();
    let outside = sb.dir.parent().unwrap().join("escaped.txt");
    let db = sb.state.join("berth.db");
    let script = format!(
        "echo x > '{}'; echo $?; echo x >> '{}'; echo $?; touch /tmp/berth-escape-$$; echo $?; \
         mkdir '{}/newdir'; echo $?",
        outside.display(),
        db.display(),
        sb.state.display()
    );
    let o = sb.run(&script);
    ran(&o);
    let codes: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(codes.len(), 4, "{}", text(&o));
    assert!(
        codes.iter().all(|c| c != "0"),
        "a write escaped: {}",
        text(&o)
    );
    assert!(!outside.exists());
    assert_eq!(std::fs::read_to_string(&db).unwrap(), "state");
    assert!(!sb.state.join("newdir").exists());
    // Control: the same write works without the restrictions.
    let o = sb.unrestricted(&format!("echo x > '{}'", outside.display()));
    assert!(o.status.success() && outside.exists(), "{}", text(&o));
}

#[test]
fn cannot_read_ssh_keys_or_berths_state() {
    let sb = Sandbox::new();
    let home = tempfile::tempdir().expect("fake home");
    let ssh = home.path().join(".ssh");
    std::fs::create_dir_all(&ssh).unwrap();
    std::fs::write(ssh.join("id_ed25519"), "PRIVATE-KEY-MATERIAL").unwrap();
    let script = format!(
        "cat '{k}'; ls '{d}'; cat '{db}'; cat /root/.ssh/* 2>&1 | head -1 >&2; true",
        k = ssh.join("id_ed25519").display(),
        d = ssh.display(),
        db = sb.state.join("berth.db").display()
    );
    let o = sb.run(&script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("PRIVATE-KEY-MATERIAL"), "{}", text(&o));
    assert!(!out.contains("id_ed25519"), "{}", text(&o));
    assert!(!out.contains("state"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        text(&o)
    );
    let o = sb.unrestricted(&format!("cat '{}'", ssh.join("id_ed25519").display()));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("PRIVATE-KEY-MATERIAL"),
        "{}",
        text(&o)
    );
}

#[test]
fn cannot_read_the_environment_of_berth_itself() {
    let sb = Sandbox::new();
    // The wrapper's parent here is this test process.
    let o = sb.run("cat /proc/$PPID/environ > /dev/null && echo LEAKED");
    ran(&o);
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("LEAKED"),
        "{}",
        text(&o)
    );
    let o = sb.unrestricted("cat /proc/$PPID/environ > /dev/null && echo LEAKED");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("LEAKED"),
        "{}",
        text(&o)
    );
}

const FORK_PROBE: &str = r#"
import os, sys, time
r, w = os.pipe()
n = 0
err = None
for _ in range(400):
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
os.close(w)
print(n, err)
"#;

#[test]
fn a_fork_bomb_is_contained() {
    let sb = Sandbox::new();
    let policy = r#"{"rlimits":{"pids":40,"nproc":40}}"#;
    let o = sb.run_with(policy, &[], &format!("python3 -c '{FORK_PROBE}'"));
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let mut f = out.split_whitespace();
    let n: usize = f
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", text(&o)));
    let err = f.next().unwrap_or("None");
    assert!(
        n < 40,
        "forked {n} processes past a bound of 40: {}",
        text(&o)
    );
    assert_eq!(err, "11", "fork should fail with EAGAIN: {}", text(&o));
    // Control: without the bound all 400 forks succeed.
    let o = sb.unrestricted(&format!("python3 -c '{FORK_PROBE}'"));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("400 None"),
        "{}",
        text(&o)
    );
}

const RAW_SOCKET: &str = r#"
import socket
for fam, typ, proto, name in [(socket.AF_INET, socket.SOCK_RAW, 1, "raw"), (socket.AF_PACKET, socket.SOCK_RAW, 0, "packet"), (socket.AF_INET, socket.SOCK_DGRAM, 0, "udp")]:
    try:
        socket.socket(fam, typ, proto).close()
        print(name, "opened")
    except OSError as e:
        print(name, "denied", e.errno)
"#;

#[test]
fn network_off_blocks_tcp_udp_and_raw_sockets() {
    let sb = Sandbox::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let tcp = format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED");
    let o = sb.run(&format!(
        "{tcp}; curl -sS -m 5 http://127.0.0.1:{port}/ && echo CURLED; python3 -c '{RAW_SOCKET}'"
    ));
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("CONNECTED") && !out.contains("CURLED"),
        "{}",
        text(&o)
    );
    for name in ["raw", "packet", "udp"] {
        assert!(
            out.contains(&format!("{name} denied 1")),
            "{name}: {}",
            text(&o)
        );
    }
    // Control: with the network on, TCP connects (raw and packet stay denied).
    let o = sb.run_with(
        r#"{"network":true}"#,
        &[],
        &format!("{tcp}; python3 -c '{RAW_SOCKET}'"),
    );
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("CONNECTED"), "{}", text(&o));
    assert!(
        out.contains("raw denied 1") && out.contains("packet denied 1"),
        "{}",
        text(&o)
    );
    assert!(out.contains("udp opened"), "{}", text(&o));
}

const PTRACE: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
r = libc.ptrace(16, int(sys.argv[1]), 0, 0)  # PTRACE_ATTACH
print("ptrace", r, ctypes.get_errno())
"#;

#[test]
fn ptrace_of_a_sibling_is_denied() {
    let sb = Sandbox::new();
    let script = format!(
        "sleep 30 >/dev/null 2>&1 & pid=$!; python3 -c '{PTRACE}' $pid; strace -p $pid -e trace=none 2>&1 | head -2 >&2; kill -9 $pid"
    );
    let o = sb.run(&script);
    ran(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ptrace -1 1\n"),
        "{}",
        text(&o)
    );
    let o = sb.unrestricted(&format!(
        "sleep 30 >/dev/null 2>&1 & pid=$!; python3 -c '{PTRACE}' $pid; kill -9 $pid"
    ));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ptrace 0 0\n"),
        "{}",
        text(&o)
    );
}

#[test]
fn setuid_bits_cannot_be_planted() {
    let sb = Sandbox::new();
    let o = sb.run("cp /bin/true t && chmod 755 t && echo MODE_OK; chmod u+s t && echo SUID; chmod g+s t && echo SGID; stat -c %a t");
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("MODE_OK") && out.ends_with("755\n"),
        "{}",
        text(&o)
    );
    assert!(
        !out.contains("SUID") && !out.contains("SGID"),
        "{}",
        text(&o)
    );
    let o = sb.unrestricted("chmod u+s t && echo SUID");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("SUID"),
        "{}",
        text(&o)
    );
}

#[test]
fn mount_and_namespaces_are_denied() {
    let sb = Sandbox::new();
    let o = sb.run(
        "mkdir -p m; mount -t tmpfs none m && echo MOUNTED; unshare -m true && echo UNSHARED; \
         unshare -r -m true && echo USERNS; grep -q ' m ' /proc/self/mounts && echo SEEN; true",
    );
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    for bad in ["MOUNTED", "UNSHARED", "USERNS", "SEEN"] {
        assert!(!out.contains(bad), "{bad}: {}", text(&o));
    }
    // Control: as root, unconfined, the mount namespace trick works.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let o = sb.unrestricted("unshare -m true && echo UNSHARED");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("UNSHARED"),
            "{}",
            text(&o)
        );
    }
}

#[test]
fn unrestricted_is_loud() {
    let sb = Sandbox::new();
    let o = sb.unrestricted("true");
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("WARNING") && err.contains("WITHOUT kernel restrictions"),
        "{err}"
    );
}

#[test]
fn bad_wrapper_arguments_are_explained() {
    let o = Command::new(BERTH)
        .args(["__sandbox-exec", "--policy", "{nope", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(126));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--policy is not a valid"),
        "{}",
        text(&o)
    );
    let o = Command::new(BERTH)
        .args(["__sandbox-exec", "--sandbox-dir", "/nonexistent"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no program to run"),
        "{}",
        text(&o)
    );
    let _ = Path::new("/");
}
