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

use crate::support::text;

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
        self.command(policy, extra, script)
            .output()
            .expect("run berth")
    }

    /// The command [`Sandbox::run_with`] runs, to be started by the caller.
    fn command(&self, policy: &str, extra: &[&str], script: &str) -> Command {
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
        cmd
    }

    fn run(&self, script: &str) -> Output {
        self.run_with("{}", &[], script)
    }

    fn unrestricted(&self, script: &str) -> Output {
        self.run_with("{}", &["--unrestricted"], script)
    }
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

/// Landlock has no right for metadata: `chmod`, `chown` and `utimes` of a file
/// the sandbox's uid owns went through wherever the file was (as root: all of
/// /etc). Outside the write grants every mount is read-only for the sandbox
/// now, so each fails with EROFS; inside the workspace each still works, and
/// the workspace is mounted nosuid.
#[test]
fn metadata_outside_the_workspace_cannot_change() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let sb = Sandbox::new();
    let outside = sb.dir.parent().unwrap().join("mine.txt");
    std::fs::write(&outside, "x").unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mtime = std::fs::metadata(&outside).unwrap().mtime();
    let script = format!(
        "o='{o}'; chmod 666 \"$o\" && echo CHMOD; chown \"$(id -u):$(id -g)\" \"$o\" && echo CHOWN; \
         touch -d 2001-01-01 \"$o\" && echo TOUCH; echo in > f; chmod 755 f && touch -d 2001-01-01 f && \
         chown \"$(id -u)\" f && echo INSIDE_OK; grep \" $PWD \" /proc/self/mountinfo",
        o = outside.display()
    );
    let o = sb.run(&script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    for bad in ["CHMOD", "CHOWN", "TOUCH"] {
        assert!(!out.contains(bad), "{bad}: {}", text(&o));
    }
    assert!(out.contains("INSIDE_OK"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Read-only file system"),
        "{}",
        text(&o)
    );
    let work_mount = out.lines().find(|l| l.contains(" rw,")).unwrap_or("");
    assert!(work_mount.contains("nosuid"), "{}", text(&o));
    let meta = std::fs::metadata(&outside).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.mtime(), mtime);
    // Control: the same chmod works without the restrictions.
    let o = sb.unrestricted(&format!("chmod 640 '{}'", outside.display()));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777,
        0o640
    );
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

/// Every syscall that sets a file mode, each asked for a setuid and a setgid
/// bit; prints `name:mode` for each file that got one.
const MODE_WALK: &str = r#"
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
sc = libc.syscall
sc.restype = ctypes.c_long
AT = -100
O_CREAT, O_WRONLY, O_TMPFILE = 0o100, 0o1, 0o20200000
S_IFREG = 0o100000
got = []
def check(name, path):
    try:
        m = os.lstat(path).st_mode
    except OSError:
        return
    if m & 0o6000:
        got.append("%s:%o" % (name, m & 0o7777))
for bits in (0o4755, 0o2755):
    tag = "u" if bits & 0o4000 else "g"
    def fresh(n):
        p = ("%s.%s" % (n, tag)).encode()
        open(p, "w").close()
        return p
    def new(n):
        return ("%s.%s.new" % (n, tag)).encode()
    p = fresh("chmod"); sc(90, p, bits); check("chmod", p)
    p = fresh("fchmod"); fd = os.open(p, os.O_RDONLY); sc(91, fd, bits); os.close(fd); check("fchmod", p)
    p = fresh("fchmodat"); sc(268, AT, p, bits, 0); check("fchmodat", p)
    p = fresh("fchmodat2"); sc(452, AT, p, bits, 0); check("fchmodat2", p)
    p = new("open"); fd = sc(2, p, O_CREAT | O_WRONLY, bits); check("open", p)
    p = new("openat"); fd = sc(257, AT, p, O_CREAT | O_WRONLY, bits); check("openat", p)
    how = struct.pack("QQQ", O_CREAT | O_WRONLY, bits, 0)
    p = new("openat2"); sc(437, AT, p, ctypes.c_char_p(how), 24); check("openat2", p)
    p = new("creat"); sc(85, p, bits); check("creat", p)
    p = new("mkdir"); sc(83, p, bits | 0o7000); check("mkdir", p)
    p = new("mkdirat"); sc(258, AT, p, bits | 0o7000); check("mkdirat", p)
    p = new("mknod"); sc(133, p, S_IFREG | bits, 0); check("mknod", p)
    p = new("mknodat"); sc(259, AT, p, S_IFREG | bits, 0); check("mknodat", p)
    fd = sc(257, AT, b".", O_TMPFILE | O_WRONLY, bits)
    if fd >= 0:
        m = os.fstat(fd).st_mode
        if m & 0o6000:
            got.append("o_tmpfile:%o" % (m & 0o7777))
print("SETID", " ".join(got) or "none")
"#;

#[test]
fn no_mode_setting_syscall_plants_setid_bits() {
    let sb = Sandbox::new();
    let o = sb.run(&format!("python3 -c '{MODE_WALK}'"));
    ran(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("SETID none\n"),
        "{}",
        text(&o)
    );
    // Control: unconfined, the same walk plants them.
    let o = sb.unrestricted(&format!("rm -rf ./*; python3 -c '{MODE_WALK}'"));
    let out = String::from_utf8_lossy(&o.stdout);
    for name in ["fchmodat2:4755", "openat:4755", "creat:4755", "mknod:4755"] {
        assert!(out.contains(name), "{name}: {}", text(&o));
    }
}

#[test]
fn cannot_signal_a_host_process_of_the_same_uid() {
    let sb = Sandbox::new();
    let mut victim = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = victim.id();
    let o = sb.run(&format!(
        "kill -0 {pid} && echo REACHED; kill -9 {pid} && echo KILLED; \
         python3 -c 'import os; os.kill({pid}, 9)' 2>/dev/null && echo PYKILLED; \
         sleep 30 & kill $! && echo OWN_CHILD"
    ));
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("REACHED") && !out.contains("KILLED"),
        "{}",
        text(&o)
    );
    assert!(out.contains("OWN_CHILD"), "its own children: {}", text(&o));
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the host process died"
    );
    // Control: unconfined, the same uid reaches it.
    let o = sb.unrestricted(&format!("kill -0 {pid} && echo REACHED"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("REACHED"),
        "{}",
        text(&o)
    );
    victim.kill().unwrap();
    victim.wait().unwrap();
}

const ABSTRACT: &str = r#"
import socket, sys
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(b"\0" + sys.argv[1].encode())
    print("ABSTRACT connected")
except OSError as e:
    print("ABSTRACT refused", e.errno)
"#;

#[test]
fn abstract_unix_sockets_of_the_host_are_out_of_reach() {
    let sb = Sandbox::new();
    let name = format!("berth-test-{}", sb.name);
    let listener = std::os::unix::net::UnixListener::bind_addr(
        &<std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap(),
    )
    .unwrap();
    // Network on: AF_UNIX sockets are refused all the same.
    let script = format!("python3 -c '{ABSTRACT}' {name}");
    let o = sb.run_with(r#"{"network":true}"#, &[], &script);
    ran(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ABSTRACT refused 1"),
        "{}",
        text(&o)
    );
    let o = sb.unrestricted(&script);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("ABSTRACT connected"),
        "{}",
        text(&o)
    );
    drop(listener);
}

#[test]
fn host_secrets_are_not_on_the_read_list() {
    let sb = Sandbox::new();
    let secrets = "/etc/shadow /etc/gshadow /etc/sudoers /proc/self/root/etc/shadow /etc/ssh/*_key";
    let o = sb.run(&format!(
        "for f in {secrets}; do [ -e \"$f\" ] || continue; head -c1 \"$f\" >/dev/null 2>&1 && echo \"READ $f\"; done; \
         ls /root >/dev/null 2>&1 && echo 'READ /root'; ls /etc/sudoers.d >/dev/null 2>&1 && echo 'READ sudoers.d'; \
         head -c1 /etc/passwd >/dev/null && echo PASSWD_OK"
    ));
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!out.contains("READ"), "{}", text(&o));
    assert!(out.contains("PASSWD_OK"), "{}", text(&o));
    // Control: berth's user reads them unconfined (as root, /etc/shadow).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let o = sb.unrestricted("head -c1 /etc/shadow >/dev/null && echo READ");
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("READ"),
            "{}",
            text(&o)
        );
    }
}

/// Secrets below /etc are denied by default, not by name (#32 item 10): a
/// file there that others may not read (as /etc/docker/key.json), and a
/// directory they may not search, stay out of a root sandbox's reach,
/// while the world-readable file beside them is read. Control: unconfined,
/// root reads them all.
#[test]
fn etc_files_others_cannot_read_are_secrets_by_default() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test plants files in /etc and reads them through a root sandbox: it must run as root (as CI does)"
    );
    use std::os::unix::fs::PermissionsExt;
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let base = PathBuf::from(format!("/etc/berth-test-{}", std::process::id()));
    let _gone = Gone(base.clone());
    let locked = base.join("locked");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    for (name, mode) in [
        ("key.json", 0o600),
        ("group-only", 0o640),
        ("public", 0o644),
    ] {
        let f = base.join(name);
        std::fs::write(&f, "s3cret\n").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::write(locked.join("inner"), "s3cret\n").unwrap();
    let script = format!(
        "for f in key.json group-only locked/inner public; do cat {b}/$f >/dev/null 2>&1 && echo \"READ $f\"; done; true",
        b = base.display()
    );
    let sb = Sandbox::new();
    let o = sb.run(&script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(out.trim(), "READ public", "{}", text(&o));
    let o = sb.unrestricted(&script);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).lines().count(),
        4,
        "control: {}",
        text(&o)
    );
}

/// A root sandbox runs as a uid of its own (#49 item 13): a file root owns
/// and others may not read is out of its reach wherever Landlock grants
/// reads (`/opt`, `/usr/local`, not only `/etc`), a file's mode is the
/// kernel's second line behind Landlock. Its workspace is still its own to
/// write, and what it writes is root's on disk, so berth's side sees no
/// change. Control: with `run_as_root` the same sandbox is uid 0 and reads
/// the file, as before.
#[test]
fn a_root_sandbox_runs_as_a_uid_of_its_own() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test plants a root-only file in /opt and reads it through a root sandbox: it must run as root (as CI does)"
    );
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let base = PathBuf::from(format!("/opt/berth-test-{}", std::process::id()));
    let _gone = Gone(base.clone());
    std::fs::create_dir_all(&base).unwrap();
    std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = base.join("secret.env");
    std::fs::write(&secret, "TOKEN=s3cret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let script = format!(
        "echo \"uid $(id -u) gid $(id -g)\"; cat {s} && echo READ; echo mine > mine && echo WROTE; \
         mkdir -p d/e && echo sub > d/e/f && echo NESTED; echo \"owner $(stat -c %u mine)\"; \
         echo t > \"$TMPDIR/t\" && echo TMP_OK; cd / && cd \"$OLDPWD\" && echo BACK",
        s = secret.display()
    );
    let sb = Sandbox::new();
    let o = sb.run(&script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let uid: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("uid "))
        .and_then(|l| l.split(' ').next())
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no uid: {}", text(&o)));
    assert!(
        (0x6000_0000..0x7000_0000).contains(&uid),
        "the sandbox runs as uid {uid}: {}",
        text(&o)
    );
    assert!(out.contains(&format!("gid {uid}")), "{}", text(&o));
    assert!(!out.contains("READ"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Permission denied"),
        "{}",
        text(&o)
    );
    for ok in ["WROTE", "NESTED", "TMP_OK", "BACK"] {
        assert!(out.contains(ok), "{ok}: {}", text(&o));
    }
    // Inside, its files are its own; on disk, root's.
    assert!(out.contains(&format!("owner {uid}")), "{}", text(&o));
    for f in ["mine", "d/e/f", "d"] {
        let m = std::fs::metadata(sb.work().join(f)).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{f} on disk");
    }
    assert_eq!(std::fs::metadata(sb.dir.join("tmp/t")).unwrap().uid(), 0);
    // Control: the policy keeps uid 0, which reads the file as before.
    let o = sb.run_with(r#"{"run_as_root":true}"#, &[], &script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("uid 0 gid 0"), "control: {}", text(&o));
    assert!(out.contains("READ"), "control: {}", text(&o));
}

const XATTR: &str = r#"
import os, sys
for p in sys.argv[1:]:
    try:
        os.setxattr(p, "user.berth", b"1")
        print("XATTR set", p)
    except OSError as e:
        print("XATTR refused", e.errno)
    try:
        os.removexattr(p, "user.berth")
        print("XATTR removed", p)
    except OSError as e:
        print("XATTR refused", e.errno)
"#;

#[test]
fn extended_attributes_and_acls_cannot_be_written() {
    let sb = Sandbox::new();
    let inside = sb.work().join("f");
    std::fs::write(&inside, "x").unwrap();
    let db = sb.state.join("berth.db");
    let script = format!(
        "python3 -c '{XATTR}' {} {}; setfacl -m u:nobody:rwx {} 2>/dev/null && echo ACL_SET; true",
        inside.display(),
        db.display(),
        db.display()
    );
    let o = sb.run(&script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        !out.contains("XATTR set") && !out.contains("ACL_SET"),
        "{}",
        text(&o)
    );
    assert!(
        out.contains(&format!("XATTR refused {}", libc::EOPNOTSUPP)),
        "{}",
        text(&o)
    );
    let o = sb.unrestricted(&format!("python3 -c '{XATTR}' {}", inside.display()));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("XATTR set"),
        "{}",
        text(&o)
    );
}

const CLONE_NS: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
sc = libc.syscall
sc.restype = ctypes.c_long
SIGCHLD = 17
res = []
for name, flag in [("user", 0x10000000), ("mnt", 0x20000), ("pid", 0x20000000), ("net", 0x40000000), ("uts", 0x4000000), ("ipc", 0x8000000), ("cgroup", 0x2000000)]:
    r = sc(56, flag | SIGCHLD, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
        res.append(name + ":made")
    else:
        res.append(name + ":%d" % ctypes.get_errno())
r = sc(435, 0, 0)
res.append("clone3:%d" % (ctypes.get_errno() if r < 0 else 0))
print("NS", " ".join(res))
"#;

#[test]
fn clone_cannot_make_namespaces() {
    let sb = Sandbox::new();
    let o = sb.run(&format!(
        "python3 -c '{CLONE_NS}'; (sleep 0 & wait) && echo FORK_OK"
    ));
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("NS user:1 mnt:1 pid:1 net:1 uts:1 ipc:1 cgroup:1 clone3:38\n"),
        "{}",
        text(&o)
    );
    assert!(out.contains("FORK_OK"), "{}", text(&o));
    // Control: unconfined, a user namespace is made with clone.
    let o = sb.unrestricted(&format!("python3 -c '{CLONE_NS}'"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("user:made"),
        "{}",
        text(&o)
    );
}

const FAMILIES: &str = r#"
import socket
res = []
for name, fam in [("unix", 1), ("inet", 2), ("inet6", 10), ("netlink", 16), ("packet", 17), ("key", 15), ("alg", 38), ("vsock", 40), ("bluetooth", 31), ("can", 29), ("xdp", 44), ("tipc", 30), ("rds", 21)]:
    try:
        socket.socket(fam, socket.SOCK_DGRAM if fam != 15 else socket.SOCK_RAW, 0).close()
        res.append(name + ":open")
    except OSError as e:
        res.append("%s:%d" % (name, e.errno))
print("FAM", " ".join(res))
"#;

#[test]
fn socket_families_are_an_allow_list() {
    let sb = Sandbox::new();
    let script = format!("python3 -c '{FAMILIES}'");
    let o = sb.run(&script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().find(|l| l.starts_with("FAM ")).unwrap_or("");
    for word in line.split_whitespace().skip(1) {
        assert!(word.ends_with(":1"), "network off, {word}: {}", text(&o));
    }
    let o = sb.run_with(r#"{"network":true}"#, &[], &script);
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out.lines().find(|l| l.starts_with("FAM ")).unwrap_or("");
    assert!(
        line.starts_with("FAM unix:1 inet:open inet6:open netlink:1 packet:1 key:1 alg:1 vsock:1"),
        "network on: {}",
        text(&o)
    );
    assert!(
        line.split_whitespace().skip(4).all(|w| w.ends_with(":1")),
        "{}",
        text(&o)
    );
    // Control: unconfined, netlink opens.
    let o = sb.unrestricted(&script);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("netlink:open"),
        "{}",
        text(&o)
    );
}

/// A pathname unix socket of the host (docker.sock, berth's own server.sock,
/// an ssh-agent's) is out of reach of a sandbox, with the network on too:
/// Landlock before ABI 9 cannot confine `connect` to one, so the sandbox
/// gets no AF_UNIX socket at all. Control: unconfined, the same connect
/// reaches the listener and reads its greeting.
#[test]
fn unix_sockets_of_the_host_are_out_of_reach_with_the_network_on() {
    let sb = Sandbox::new();
    let outside = tempfile::tempdir().unwrap();
    let path = outside.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let serve = std::thread::spawn(move || {
        use std::io::Write;
        // Answers every connection; detached, it ends with the test process.
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { break };
            if c.write_all(b"GREETING\n").is_err() {
                break;
            }
        }
    });
    let probe = format!(
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); s.connect(\"{}\"); print(s.recv(64).decode().strip())'",
        path.display()
    );
    for policy in [r#"{"network":true}"#, "{}"] {
        let o = sb.run_with(policy, &[], &probe);
        ran(&o);
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("GREETING"),
            "policy {policy}: the sandbox reached a host socket: {}",
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("PermissionError"),
            "policy {policy}: {}",
            text(&o)
        );
    }
    let o = sb.unrestricted(&probe);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("GREETING"),
        "control: {}",
        text(&o)
    );
    drop(serve);
}

#[test]
fn terminals_and_shared_memory_of_the_host_are_out_of_reach() {
    let sb = Sandbox::new();
    let shm = format!("/dev/shm/berth-{}", sb.name);
    // A terminal of the host's, open while the sandbox runs: its slave is
    // what an attack would write escape sequences to.
    let mut master: libc::c_int = -1;
    let mut slave: libc::c_int = -1;
    // SAFETY: openpty writes two descriptors into the ints given; no name,
    // termios or size is passed.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    let host_pty = std::fs::read_link(format!("/proc/self/fd/{slave}")).unwrap();
    let o = sb.run(&format!(
        "echo x 2>/dev/null > {pty} && echo WROTE_HOST_PTY; ls /dev/pts | grep -qx {n} && echo SEES_HOST_PTY; \
         for t in /dev/pts/*; do [ \"$t\" = /dev/pts/ptmx ] && continue; echo x 2>/dev/null > \"$t\" && echo \"WROTE $t\"; done; \
         echo x > {shm} && echo SHM_WRITTEN; ls /dev/shm >/dev/null && echo SHM_LISTED; \
         script -qec 'tty' /dev/null </dev/null | grep -q '^/dev/pts/' && echo OWN_TERMINAL; true",
        pty = host_pty.display(),
        n = host_pty.file_name().unwrap().to_string_lossy(),
    ));
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    for bad in [
        "WROTE_HOST_PTY",
        "SEES_HOST_PTY",
        "WROTE",
        "SHM_WRITTEN",
        "SHM_LISTED",
    ] {
        assert!(!out.contains(bad), "{bad}: {}", text(&o));
    }
    // It may open terminals of its own (a devpts instance nobody else sees).
    assert!(out.contains("OWN_TERMINAL"), "{}", text(&o));
    assert!(!Path::new(&shm).exists());
    // Control: unconfined, the same write reaches the host's terminal.
    let o = sb.unrestricted(&format!(
        "echo x > {} && echo WROTE_HOST_PTY",
        host_pty.display()
    ));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("WROTE_HOST_PTY"),
        "{}",
        text(&o)
    );
    // SAFETY: closing the two descriptors openpty gave this test.
    unsafe {
        libc::close(slave);
        libc::close(master);
    }
    let o = sb.unrestricted(&format!("echo x > {shm} && echo SHM_WRITTEN; rm -f {shm}"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("SHM_WRITTEN"),
        "{}",
        text(&o)
    );
}

/// The same guarantees when berth runs as an ordinary user (here: `nobody`,
/// through `setpriv`, when the tests run as root; as a user they hold already).
#[test]
fn an_ordinary_users_sandbox_is_confined_too() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test switches to uid 65534 with setpriv and must run as root (as CI does)"
    );
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = root.path().join("s");
    let outside = root.path().join("outside");
    for d in [
        dir.join("work"),
        dir.join("tmp"),
        dir.join(".berth"),
        outside.clone(),
    ] {
        std::fs::create_dir_all(&d).unwrap();
    }
    chown_to_nobody(root.path());
    let as_nobody = |args: &[&str]| {
        let mut c = as_nobody();
        c.args(args);
        c
    };
    let mut victim = as_nobody(&["sleep", "60"]).spawn().unwrap();
    let pid = victim.id();
    let script = format!(
        "kill -0 {pid} && echo REACHED; echo x > {o}/f && echo WROTE; cp /bin/true t; chmod 4755 t && echo SUID; \
         python3 -c 'import socket; socket.socket(40, 1)' 2>/dev/null && echo VSOCK; \
         chmod 777 {o} && echo CHMOD; touch -d 2001-01-01 {o} && echo TOUCH; id -u",
        o = outside.display()
    );
    let o = as_nobody(&[BERTH, "__sandbox-exec", "--sandbox-dir"])
        .arg(&dir)
        .args(["--name", "nobody-test", "--", "bash", "-c", &script])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir(dir.join("work"))
        .output()
        .unwrap();
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    for bad in ["REACHED", "WROTE", "SUID", "VSOCK", "CHMOD", "TOUCH"] {
        assert!(!out.contains(bad), "{bad}: {}", text(&o));
    }
    assert!(out.contains("65534"), "{}", text(&o));
    // Control: the same user, unconfined, reaches its own process.
    let o = as_nobody(&["kill", "-0", &pid.to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    victim.kill().unwrap();
    victim.wait().unwrap();
}

/// A mount an ordinary user cannot reach (beneath a directory it may not
/// search, as docker's fuse-overlayfs mounts and root's FUSE mounts are)
/// does not stop that user's sandbox from starting (#32 item 11): before,
/// making the read-only view failed on it with EACCES, and every local
/// sandbox of every ordinary user failed while one existed.
#[test]
fn a_mount_the_user_cannot_reach_does_not_stop_its_sandbox() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test mounts a file system and switches to uid 65534: it must run as root (as CI does)"
    );
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = root.path().join("s");
    for d in [dir.join("work"), dir.join("tmp"), dir.join(".berth")] {
        std::fs::create_dir_all(&d).unwrap();
    }
    chown_to_nobody(root.path());
    // Root's: a private directory, and a mount in it.
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let point = private.path().join("m");
    std::fs::create_dir(&point).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "berth-test"])
        .arg(&point)
        .status()
        .unwrap();
    assert!(mounted.success(), "could not mount a tmpfs for the test");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(point.clone());
    let o = as_nobody()
        .args([BERTH, "__sandbox-exec", "--sandbox-dir"])
        .arg(&dir)
        .args(["--name", "nobody-mounts", "--", "bash", "-c"])
        .arg(format!(
            "echo STARTED; ls {} 2>/dev/null && echo LISTED; true",
            point.display()
        ))
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir(dir.join("work"))
        .output()
        .unwrap();
    ran(&o);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("STARTED"), "{}", text(&o));
    assert!(!out.contains("LISTED"), "{}", text(&o));
}

/// SysV shared memory (and semaphores and message queues, and POSIX
/// message queues) is named by a key, not a path: Landlock never sees it,
/// and its modes are checked by uid. A segment of mode 0600 made by a
/// process of berth's user (root, or an ordinary user) was open to that
/// user's sandboxes. Each sandbox process now gets an IPC namespace of its
/// own, so a host key names nothing inside. Control: unconfined, the same
/// user attaches the segment and reads it.
#[test]
fn sysv_shared_memory_of_the_host_is_out_of_reach() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test runs as root and as uid 65534 (setpriv): it must run as root (as CI does)"
    );
    use std::io::{BufRead, Write};
    use std::os::unix::fs::PermissionsExt;
    const SHM: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
key = int(sys.argv[2])
if sys.argv[1] == "make":
    i = libc.shmget(key, 4096, 0o1000 | 0o600)
    a = libc.shmat(i, None, 0)
    ctypes.memmove(a, b"s3cret", 6)
    print("MADE", i, flush=True)
    sys.stdin.read()
    libc.shmctl(i, 0, None)
else:
    i = libc.shmget(key, 0, 0)
    if i < 0:
        print("NOSEG", ctypes.get_errno()); sys.exit(0)
    a = libc.shmat(i, None, 0o10000)
    if a is None or a == ctypes.c_void_p(-1).value:
        print("NOATTACH", ctypes.get_errno()); sys.exit(0)
    print("READ", ctypes.string_at(a, 6).decode())
"#;
    for nobody in [false, true] {
        let key = (std::process::id() as i32 & 0xffff) * 16 + i32::from(nobody) + 0x4000_0000;
        let who = |mut c: Command| {
            if nobody {
                let mut n = as_nobody();
                n.arg(c.get_program()).args(c.get_args());
                n.env_clear().env("PATH", "/usr/bin:/bin");
                if let Some(d) = c.get_current_dir() {
                    n.current_dir(d);
                }
                c = n;
            }
            c
        };
        let mut maker = who({
            let mut c = Command::new("python3");
            c.args(["-c", SHM, "make", &key.to_string()]);
            c
        })
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(maker.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("MADE"), "maker: {line}");
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = root.path().join("s");
        for d in ["work", "tmp", ".berth"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        if nobody {
            chown_to_nobody(root.path());
        }
        let look = format!("python3 -c '{}' look {key}", SHM.replace('\'', "'\\''"));
        let run = |extra: &[&str]| {
            let mut c = Command::new(BERTH);
            c.arg("__sandbox-exec")
                .arg("--sandbox-dir")
                .arg(&dir)
                .args(["--name", "ipc-test"])
                .args(extra)
                .args(["--", "bash", "-c", &look])
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .current_dir(dir.join("work"));
            who(c).output().unwrap()
        };
        let o = run(&[]);
        ran(&o);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            !out.contains("READ"),
            "nobody={nobody}: the sandbox read the host's segment: {}",
            text(&o)
        );
        assert!(out.contains("NOSEG"), "nobody={nobody}: {}", text(&o));
        let o = run(&["--unrestricted"]);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("READ s3cret"),
            "control, nobody={nobody}: {}",
            text(&o)
        );
        let _ = maker.stdin.take().map(|mut i| i.write_all(b""));
        maker.wait().unwrap();
        let _ = Command::new(BERTH)
            .arg("__sandbox-exec")
            .arg("--sandbox-dir")
            .arg(&dir)
            .args(["--name", "ipc-test", "--remove-cgroup"])
            .status();
    }
}

/// Give `path` and everything under it to the user nobody.
fn chown_to_nobody(path: &std::path::Path) {
    let chown = Command::new("chown")
        .args(["-R", "nobody:"])
        .arg(path)
        .status()
        .unwrap();
    assert!(chown.success());
}

/// A command that runs what its arguments say as the user nobody, with no
/// supplementary groups (the tests run as root).
fn as_nobody() -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    c
}

/// Processes whose command line is `sleep SECS`, a test's marker.
fn marked(secs: &str) -> Vec<i32> {
    let marker = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == marker.as_bytes()))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// A fork bomb run by an ordinary user with no pids cgroup to bound it fills
/// the user's process limit, so berth itself can start no process of that
/// user: its stop must still end the whole tree, and say so only when it did
/// (#10 item 20). Before, the stop's helper could not start, 110 processes
/// outlived an exec that reported them stopped, and `job kill` failed.
#[test]
fn an_ordinary_users_fork_bomb_is_stopped_whole() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test switches to uid 65534 with setpriv and must run as root (as CI does)"
    );
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = root.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The sandbox's own bound is the user's: berth's process shares it.
    std::fs::write(home.join("policy.toml"), "[local.rlimits]\nnproc = 120\n").unwrap();
    chown_to_nobody(root.path());
    let berth = |args: &[&str]| {
        let mut c = as_nobody();
        c.args(["prlimit", "--nproc=120:120", BERTH])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .env("BERTH_POLICY", home.join("policy.toml"))
            .env("BERTH_STATE_DIR", home.join("state"))
            .env("BERTH_SERVER", "off")
            .current_dir(&home);
        c.output().unwrap()
    };
    let bomb = |secs: &str| {
        format!(
            "for i in 1 2 3 4; do (trap '' INT TERM; while :; do sleep {secs} & done) & done; wait"
        )
    };
    let o = berth(&["exec", "--", "export KEEP=1"]);
    assert!(o.status.success(), "{}", text(&o));

    let o = berth(&["exec", "--timeout", "2", "--", &bomb("101.31")]);
    let left = marked("101.31");
    for &p in &left {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    assert_eq!(o.status.code(), Some(124), "{}", text(&o));
    assert!(
        left.is_empty(),
        "{} of the command's processes outlived its stop: {}",
        left.len(),
        text(&o)
    );
    let o = berth(&["exec", "--", "echo still $KEEP"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "still 1\n",
        "{}",
        text(&o)
    );

    // The same bomb as a background job, ended by `job kill`.
    let o = berth(&["job", "start", "--name", "bomb", "--", &bomb("101.32")]);
    assert!(o.status.success(), "{}", text(&o));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while marked("101.32").len() < 60 {
        assert!(
            std::time::Instant::now() < deadline,
            "the bomb never filled the limit"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = berth(&["job", "kill", "--grace", "1", "bomb"]);
    let left = marked("101.32");
    for &p in &left {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
    // `job kill` exits 0 once the job is gone, and names the signal.
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(" killed by SIG") && o.status.code() == Some(0),
        "{}",
        text(&o)
    );
    assert!(
        left.is_empty(),
        "{} of the job's processes outlived `job kill`: {}",
        left.len(),
        text(&o)
    );
    let o = berth(&["job", "ls", "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\"killed\""), "{}", text(&o));
}

/// berth through its CLI, in-process (no server), with its own state.
fn berth_cli(home: &Path, extra_env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(BERTH)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("BERTH_STATE_DIR", home.join("state"))
        .env("BERTH_SERVER", "off")
        .envs(extra_env.iter().copied())
        .current_dir(home)
        .output()
        .unwrap()
}

/// A library whose constructor writes `flag`, wherever it is loaded.
fn preload_library(dir: &Path, flag: &Path) -> PathBuf {
    let src = dir.join("pre.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void hit(void) {{\n  FILE *f = fopen(\"{}\", \"a\");\n  if (f) {{ fputs(\"loaded\\n\", f); fclose(f); }}\n}}\n",
            flag.display()
        ),
    )
    .unwrap();
    let lib = dir.join("pre.so");
    let cc = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("cc (the Rust toolchain's linker) builds the test's library");
    assert!(cc.status.success(), "{}", text(&cc));
    lib
}

/// The sandbox's spec environment (`sandbox create --env`) is the sandbox's
/// to choose, and so is anything an agent writes into it: none of it may act
/// on berth's wrapper while the wrapper is still unconfined. Before, a
/// `LD_PRELOAD` there ran its library in the wrapper, before Landlock and
/// seccomp, as berth's user with all its capabilities (#32 item 1). Control:
/// unrestricted, the same library runs and writes outside.
#[test]
fn a_sandboxs_environment_never_reaches_the_unconfined_wrapper() {
    let home = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let flag = outside.path().join("escaped");
    let lib = preload_library(outside.path(), &flag);
    let preload = format!("LD_PRELOAD={}", lib.display());
    for var in [preload.as_str(), "GCONV_PATH=/nonexistent"] {
        let o = berth_cli(
            home.path(),
            &[],
            &[
                "sandbox",
                "create",
                "pre",
                "--backend",
                "local",
                "--env",
                var,
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        let o = berth_cli(
            home.path(),
            &[],
            &["exec", "--sandbox", "pre", "--", "echo confined-ran"],
        );
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("confined-ran"),
            "{}",
            text(&o)
        );
        let o = berth_cli(home.path(), &[], &["sandbox", "rm", "pre"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    assert!(
        !flag.exists(),
        "the library ran outside the sandbox's confinement: {:?}",
        std::fs::read_to_string(&flag)
    );
    // Control: unconfined, the library runs and writes outside.
    let o = berth_cli(
        home.path(),
        &[("BERTH_UNRESTRICTED", "1")],
        &[
            "sandbox",
            "create",
            "open",
            "--backend",
            "local",
            "--env",
            &preload,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = berth_cli(
        home.path(),
        &[("BERTH_UNRESTRICTED", "1")],
        &["exec", "--sandbox", "open", "--", "true"],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(flag.exists(), "control: the library did not run unconfined");
}

/// The pid in a job's files is the sandbox's to write. berth signals a pid
/// from there only when it is a process of the sandbox: a job whose `pid`
/// says 1, or a host process's pid, has nothing of the host signalled, and
/// the same goes for the `holder` that closing stdin stops (#32 item 2).
#[test]
fn job_files_cannot_aim_berths_signals_at_the_host() {
    let home = tempfile::tempdir().unwrap();
    // A host process of the same user, which a forged pid names.
    let mut victim = Command::new("sleep").arg("313.7").spawn().unwrap();
    let vpid = victim.id().to_string();
    let o = berth_cli(
        home.path(),
        &[],
        &["job", "start", "--json", "--", "sleep 300"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let job: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    // From inside the sandbox: aim the job's pid and holder at the victim.
    let forge = format!(
        "d=$HOME/../.berth/jobs/{id}; echo {vpid} > $d/pid; echo {vpid} > $d/holder; echo {vpid} > $d/wrapper"
    );
    let o = berth_cli(home.path(), &[], &["exec", "--", &forge]);
    assert!(o.status.success(), "{}", text(&o));
    // The forgery landed where berth reads the job's files.
    let o = berth_cli(
        home.path(),
        &[],
        &["exec", "--", &format!("cat $HOME/../.berth/jobs/{id}/pid")],
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        vpid,
        "{}",
        text(&o)
    );
    let _ = berth_cli(home.path(), &[], &["job", "kill", &id]);
    let _ = berth_cli(home.path(), &[], &["job", "send", &id, "--eof"]);
    assert!(
        victim.try_wait().unwrap().is_none(),
        "berth signalled a host process named in the sandbox's files"
    );
    // Control: berth's own signal to the victim does reach it.
    victim.kill().unwrap();
    victim.wait().unwrap();
    let _ = berth_cli(home.path(), &[], &["sandbox", "rm", "default"]);
}

/// Sends from both ends of a socket pair of each AF_UNIX type: a datagram
/// to a pathname socket and to an abstract one, and a `connect` to a
/// pathname stream socket. Prints what each step answered.
const PAIRS: &str = r#"
import socket, sys
dgram, stream, abstract = sys.argv[1:4]
for name, ty in (("dgram", socket.SOCK_DGRAM), ("seqpacket", socket.SOCK_SEQPACKET), ("stream", socket.SOCK_STREAM)):
    try:
        a, b = socket.socketpair(socket.AF_UNIX, ty)
    except OSError as e:
        print(name, "pair", e.errno); continue
    for what, f in (("sendto", lambda: a.sendto(b"path", dgram)), ("abstract", lambda: a.sendto(b"abstract", "\0" + abstract)), ("connect", lambda: a.connect(stream)), ("sendmsg", lambda: b.sendmsg([b"msg"], [], 0, dgram))):
        try:
            f(); print(name, what, "sent")
        except OSError as e:
            print(name, what, e.errno)
"#;

/// A host's pathname datagram socket (`/dev/log`, `/run/systemd/notify`,
/// a listener in a directory Landlock denies) is out of reach with the
/// network off (#49 item 7). Before, `socketpair(AF_UNIX, SOCK_DGRAM)` gave
/// a datagram socket whose `sendto` reached any of them. The class: every
/// way a socket pair could address a host socket (`sendto`, `sendmsg`,
/// `connect`; pathname and abstract), for every pair type. Control:
/// unconfined, the datagrams arrive.
#[test]
fn socket_pairs_cannot_reach_host_unix_sockets() {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram, UnixListener};
    let sb = Sandbox::new();
    let outside = tempfile::tempdir().unwrap();
    let dgram_path = outside.path().join("dgram.sock");
    let stream_path = outside.path().join("stream.sock");
    let dgram = UnixDatagram::bind(&dgram_path).unwrap();
    dgram.set_nonblocking(true).unwrap();
    let listener = UnixListener::bind(&stream_path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let abstract_name = format!("berth-test-dgram-{}", sb.name);
    let abstract_sock =
        UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(abstract_name.as_bytes()).unwrap())
            .unwrap();
    abstract_sock.set_nonblocking(true).unwrap();
    let script = format!(
        "python3 -c '{PAIRS}' {} {} {abstract_name}",
        dgram_path.display(),
        stream_path.display()
    );
    let received = || {
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        for s in [&dgram, &abstract_sock] {
            while let Ok(n) = s.recv(&mut buf) {
                got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        while let Ok((_, _)) = listener.accept() {
            got.push("a connection".into());
        }
        got
    };
    for policy in ["{}", r#"{"network":true}"#] {
        let o = sb.run_with(policy, &[], &script);
        ran(&o);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("dgram pair 1"),
            "policy {policy}: {}",
            text(&o)
        );
        assert!(
            out.contains("stream connect") && out.contains("seqpacket connect"),
            "policy {policy}: the pairs that stay allowed were not tried: {}",
            text(&o)
        );
        let got = received();
        assert!(
            got.is_empty(),
            "policy {policy}: the sandbox reached a host socket: {got:?}\n{}",
            text(&o)
        );
    }
    let o = sb.unrestricted(&script);
    let got = received();
    assert!(
        got.contains(&"path".to_string())
            && got.contains(&"msg".to_string())
            && got.contains(&"abstract".to_string()),
        "control: {got:?}\n{}",
        text(&o)
    );
}

/// Watches a directory (`$1`) for a name created in it: prints `WATCHING`
/// once the watch is set, then the first name created, or why it could not.
const WATCH: &str = r#"
import ctypes, os, select, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
if fd < 0:
    print("NO_INOTIFY", ctypes.get_errno(), flush=True); sys.exit(0)
if libc.inotify_add_watch(fd, sys.argv[1].encode(), 0x100) < 0:
    print("NO_WATCH", ctypes.get_errno(), flush=True); sys.exit(0)
print("WATCHING", flush=True)
if select.select([fd], [], [], 20)[0]:
    buf = os.read(fd, 4096)
    wd, mask, cookie, n = struct.unpack_from("iIII", buf)
    print("SAW", buf[16:16 + n].rstrip(b"\0").decode(), flush=True)
"#;

/// inotify cannot watch a directory Landlock denies (#49 item 15): a watch
/// needs only a path the process can look up, so a sandbox saw every name
/// created in `/root`, `~/.ssh` or berth's state dir. inotify now answers
/// ENOSYS, as on a kernel without it, and a watcher falls back to polling
/// the files it may read (`tail -f` still follows a file in the
/// workspace). Control: unconfined, the watch sees the name.
#[test]
fn inotify_cannot_watch_a_denied_directory() {
    use std::io::BufRead;
    let sb = Sandbox::new();
    let watched = tempfile::tempdir().unwrap();
    let script = format!("python3 -c '{WATCH}' {}", watched.path().display());
    let watch = |extra: &[&str], name: &str| -> String {
        let mut child = sb
            .command("{}", extra, &script)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            seen.push_str(&line);
            seen.push('\n');
            if line == "WATCHING" {
                std::fs::write(watched.path().join(name), "x").unwrap();
            }
        }
        let st = child.wait().unwrap();
        assert_ne!(
            st.code(),
            Some(125),
            "the kernel cannot enforce the sandbox"
        );
        seen
    };
    let out = watch(&[], "id_ed25519");
    assert!(
        out.starts_with(&format!("NO_INOTIFY {}", libc::ENOSYS)),
        "{out}"
    );
    assert!(!out.contains("SAW"), "{out}");
    // Control: unconfined, the watch sees the name created.
    let out = watch(&["--unrestricted"], "id_rsa");
    assert!(out.contains("SAW id_rsa"), "control: {out}");
    // A watcher falls back: `tail -f` still follows a file it may read.
    let o = sb.run("echo one > f; (sleep 0.3; echo two >> f) & timeout 4 tail -f f; true");
    ran(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("one\ntwo\n"),
        "{}",
        text(&o)
    );
}
