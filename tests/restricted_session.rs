//! The persistent session engine over the local backend with every process
//! run through `berth __sandbox-exec`: state persists, timeouts kill the tree,
//! a new session restores from the snapshot, and the restrictions hold.
//! Kernel-dependent like `sandbox_escape.rs`: on a kernel that cannot enforce
//! the profile the wrapper refuses and this test fails with its message.
#![allow(clippy::expect_used, clippy::unwrap_used)] // in tests a panic is the failure report

use berth_core::backend::BackendKind;
use std::time::Duration;

use berth_backends::local::LocalBackend;
use berth_core::backend::{Backend, SandboxSpec};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use berth_sandbox::WrapperCommand;

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

fn wrapped(state: &std::path::Path) -> LocalBackend {
    let policy: berth_policies::LocalPolicy =
        serde_json::from_str(r#"{"rlimits":{"pids":256}}"#).unwrap();
    LocalBackend::new(state).with_wrapper(WrapperCommand::new(BERTH, &policy).unwrap())
}

/// Processes still running `sleep SECS`, a test's marker.
fn sleepers(secs: &str) -> usize {
    let marker = format!("sleep\0{secs}\0");
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == marker.as_bytes())
                })
                .count()
        })
        .unwrap_or(0)
}

/// A wrapped local sandbox named `prefix` + this process's pid, removed (with
/// its cgroup) when the guard drops, and a session on it.
struct Opened {
    name: String,
    sb: std::sync::Arc<dyn berth_core::backend::Sandbox>,
    session: Session,
    _guard: CgroupGuard,
    _dir: tempfile::TempDir,
}

async fn open_wrapped(prefix: &str) -> Opened {
    open_wrapped_in(prefix, tempfile::tempdir().unwrap()).await
}

/// [`open_wrapped`] with the state dir `dir`.
async fn open_wrapped_in(prefix: &str, dir: tempfile::TempDir) -> Opened {
    let name = format!("{prefix}{}", std::process::id());
    let guard = CgroupGuard(
        dir.path().join("sandboxes").join("local").join(&name),
        name.clone(),
    );
    let sb = wrapped(dir.path())
        .provision(&SandboxSpec::named(&name))
        .await
        .unwrap()
        .sandbox;
    let session = Session::open(sb.clone(), SessionConfig::named("t"))
        .await
        .unwrap();
    Opened {
        name,
        sb,
        session,
        _guard: guard,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_restricted_session_keeps_its_state_and_its_limits() {
    let o = open_wrapped("rs").await;
    let (name, sb, mut s) = (o.name.clone(), o.sb.clone(), o.session);
    let r = s
        .exec(
            "mkdir -p sub && cd sub && export A=1; echo hi > f",
            ExecOpts::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{}", r.output.text());
    let r = s
        .exec("pwd; echo $A; cat f", ExecOpts::default())
        .await
        .unwrap();
    assert!(
        r.output.text().ends_with("/work/sub\n1\nhi\n"),
        "{}",
        r.output.text()
    );
    let r = s
        .exec(
            &format!("echo x > /tmp/berth-session-escape-{name}; echo rc=$?"),
            ExecOpts::default(),
        )
        .await
        .unwrap();
    // Landlock's denial, or the read-only view's where /tmp is not a mount
    // of its own (the kernel checks the mount first).
    let text = r.output.text();
    assert!(
        text.contains("Permission denied") || text.contains("Read-only file system"),
        "{text}"
    );
    assert!(!std::path::Path::new(&format!("/tmp/berth-session-escape-{name}")).exists());
    let r = s
        .exec(
            "sleep 101.17 | sleep 101.17",
            ExecOpts {
                timeout: Some(Duration::from_millis(300)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.timed_out);
    // The whole tree dies, though the killer is a separate confined spawn.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sleepers("101.17") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the timed-out command's tree survived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = s.exec("echo still $A", ExecOpts::default()).await.unwrap();
    assert_eq!(r.output.text(), "still 1\n");
    drop(s);
    // A new session (as after a berth restart) restores cwd and env, still confined.
    let mut s = Session::open(sb.clone(), SessionConfig::named("t"))
        .await
        .unwrap();
    let r = s
        .exec(
            "pwd; echo $A; grep -c . /proc/self/status >/dev/null; grep Seccomp: /proc/self/status",
            ExecOpts::default(),
        )
        .await
        .unwrap();
    let out = r.output.text();
    assert!(out.contains("/work/sub\n1\n"), "{out} {:?}", r.notices);
    assert!(out.contains("Seccomp:\t2"), "{out}");
}

/// Removes the sandbox (and so its pids cgroup) even when the test fails.
struct CgroupGuard(std::path::PathBuf, String);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        for cg in berth_sandbox::cgroup::dirs_for(&self.1, &self.0) {
            let _ = berth_sandbox::cgroup::remove(&cg);
        }
    }
}

#[tokio::test]
async fn a_refusing_wrapper_is_reported_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    // Stands in for a kernel without Landlock: the wrapper refuses, as
    // `berth __sandbox-exec` does, with exit 125 and a reason on stderr.
    let refuser = dir.path().join("refuser");
    std::fs::write(
        &refuser,
        "#!/bin/sh\necho 'berth: refusing to run: Landlock is not available' >&2; exit 125\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &refuser,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let wrapper = WrapperCommand::new(&refuser, &Default::default()).unwrap();
    let backend = LocalBackend::new(dir.path()).with_wrapper(wrapper);
    let sb = backend
        .provision(&SandboxSpec::named("r"))
        .await
        .unwrap()
        .sandbox;
    let err = match Session::open(sb, SessionConfig::named("t")).await {
        Ok(mut s) => s.exec("echo hi", ExecOpts::default()).await.err(),
        Err(e) => Some(e),
    };
    let msg = err.map(|e| e.to_string()).unwrap_or_default();
    assert!(
        msg.contains("Landlock is not available"),
        "the refusal was not reported: {msg:?}"
    );
}

#[tokio::test]
async fn a_sandbox_cgroup_goes_when_its_last_process_ends() {
    let dir = tempfile::tempdir().unwrap();
    let name = format!("cg{}", std::process::id());
    let sb_dir = dir.path().join("sandboxes").join("local").join(&name);
    let _guard = CgroupGuard(sb_dir.clone(), name.clone());
    let cg = berth_sandbox::cgroup::dir_for(&name, &sb_dir)
        .expect("no pids cgroup controller: this test needs one (as root, or delegated)");
    let backend = wrapped(dir.path());
    let sb = backend
        .provision(&SandboxSpec::named(&name))
        .await
        .unwrap()
        .sandbox;
    // A background process keeps the cgroup alive past its spawn's end...
    let argv: Vec<String> = ["bash", "-c", "sleep 101.29 >/dev/null 2>&1 & echo started"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let c =
        berth_core::backend::run_to_end(sb.as_ref(), &argv, None, 4096, Duration::from_secs(10))
            .await
            .unwrap();
    assert_eq!(String::from_utf8_lossy(&c.stdout), "started\n");
    assert!(cg.exists(), "the cgroup went while a process of it runs");
    // ...and once the last one has ended, the next process end berth waits
    // for removes it (the kill is asynchronous: try again until it is done).
    // (From the host: a later spawn is a Landlock domain of its own, whose
    // signals cannot reach an earlier spawn's processes.)
    let killed = std::process::Command::new("pkill")
        .args(["-KILL", "-f", "sleep 101.29"])
        .status()
        .unwrap();
    assert!(killed.success(), "pkill found no `sleep 101.29`");
    let done: Vec<String> = vec!["true".into()];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cg.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "{} outlived its sandbox's last process",
            cg.display()
        );
        berth_core::backend::run_to_end(sb.as_ref(), &done, None, 4096, Duration::from_secs(10))
            .await
            .unwrap();
    }
    // Removing the sandbox with processes still running kills them first.
    berth_core::backend::run_to_end(sb.as_ref(), &argv, None, 4096, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(cg.exists());
    backend.remove(&name, Default::default()).await.unwrap();
    assert!(!cg.exists(), "sandbox rm left its cgroup");
}

/// A command that fills its sandbox's process bound (a fork bomb meets the
/// pids cgroup) is still killed whole on its timeout, and the exec does not
/// return until the tree is gone: the kill script forks nothing, and repeats
/// until no process of the command is left (#10 item 20).
#[tokio::test]
async fn a_command_at_the_process_bound_is_killed_whole_on_timeout() {
    let o = open_wrapped("rb").await;
    let mut s = o.session;
    s.exec("export KEEP=1", ExecOpts::default()).await.unwrap();
    // Spawners that keep forking marker sleeps until the bound (256) stops them.
    let bomb =
        "for i in 1 2 3 4; do (trap '' INT TERM; while :; do sleep 101.18 & done) & done; wait";
    let r = s
        .exec(
            bomb,
            ExecOpts {
                timeout: Some(Duration::from_secs(2)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.timed_out, "{}", r.output.text());
    let left = sleepers("101.18");
    assert_eq!(
        left, 0,
        "{left} of the command's processes outlived its report"
    );
    let r = s
        .exec("echo still $KEEP", ExecOpts::default())
        .await
        .unwrap();
    assert_eq!(r.output.text(), "still 1\n", "{:?}", r.notices);
}

/// berth run as root keeps its state in `/root/.local/state/berth`, below
/// `/root`, a host secret that is never granted. The sandbox's own directories
/// are granted all the same (its workspace is writable, its snapshots are
/// written and restored), while the rest of `/root` stays dark.
#[tokio::test]
async fn a_sandbox_below_a_secret_directory_owns_its_own_directories() {
    let base = tempfile::Builder::new()
        .prefix("berth-test-")
        .tempdir_in("/root")
        .expect("the suite runs as root (as CI does): this test needs a dir in /root");
    let outside = base.path().join("outside");
    std::fs::write(&outside, "host secret").unwrap();
    let outside = outside.display().to_string();
    let o = open_wrapped_in("rr", base).await;
    let (sb, mut s) = (o.sb.clone(), o.session);
    let r = s
        .exec(
            &format!("touch f && echo wrote; export A=1; cat {outside} || echo dark"),
            ExecOpts::default(),
        )
        .await
        .unwrap();
    let out = r.output.text();
    assert!(out.starts_with("wrote\n"), "{out}");
    assert!(
        out.ends_with("dark\n") && !out.contains("host secret"),
        "{out}"
    );
    assert!(!out.contains("snap"), "the snapshot was not written: {out}");
    drop(s);
    let mut s = Session::open(sb, SessionConfig::named("t")).await.unwrap();
    let r = s.exec("echo A=$A; ls", ExecOpts::default()).await.unwrap();
    assert_eq!(r.output.text(), "A=1\nf\n", "{:?}", r.notices);
}

/// Hands one backend to a runtime.
struct OneBackend(std::sync::Arc<dyn Backend>);

#[async_trait::async_trait]
impl berth_core::runtime::BackendSource for OneBackend {
    async fn open(
        &self,
        _kind: berth_core::backend::BackendKind,
    ) -> berth_core::Result<std::sync::Arc<dyn Backend>> {
        Ok(self.0.clone())
    }
}

/// `memory_max_bytes` bounds a local sandbox through its memory cgroup: a
/// process that allocates past it is ended by the kernel's OOM killer, the
/// session lives on, and the call says what happened and what to change.
#[tokio::test]
async fn a_process_past_the_memory_bound_is_killed_and_the_call_says_why() {
    const MAX: u64 = 64 << 20;
    let state = tempfile::tempdir().unwrap();
    let name = format!("mem{}", std::process::id());
    let _guard = CgroupGuard(
        state.path().join("sandboxes").join("local").join(&name),
        name.clone(),
    );
    let limits =
        berth_policies::Policy::from_toml(&format!("[limits]\nmemory_max_bytes = {MAX}\n"), "test")
            .unwrap()
            .limits;
    let policy: berth_policies::LocalPolicy =
        serde_json::from_str(r#"{"rlimits":{"pids":256}}"#).unwrap();
    let wrapper = WrapperCommand::new(BERTH, &policy)
        .unwrap()
        .with_limits(&limits);
    let backend: std::sync::Arc<dyn Backend> =
        std::sync::Arc::new(LocalBackend::new(state.path()).with_wrapper(wrapper));
    let store = berth_core::store::Store::open(state.path()).unwrap();
    let rt = berth_core::runtime::Runtime::new(
        std::sync::Arc::new(store),
        std::sync::Arc::new(OneBackend(backend)),
        berth_core::runtime::RuntimeConfig::new(state.path().to_path_buf()),
    );
    rt.create_sandbox(BackendKind::Local, SandboxSpec::named(&name))
        .await
        .unwrap();
    let exec = |cmd: &str| {
        rt.exec(berth_core::runtime::ExecRequest {
            backend: BackendKind::Local,
            sandbox: name.clone(),
            command: cmd.into(),
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        })
    };
    let r = exec("echo ready").await.unwrap();
    assert_eq!(r.result.output.text().trim(), "ready");
    assert!(r.result.notices.is_empty(), "{:?}", r.result.notices);
    // The bound is the sandbox's cgroup's, read back from the kernel.
    let dir = state.path().join("sandboxes").join("local").join(&name);
    let cg = berth_sandbox::cgroup::memory_dir_for(&name, &dir)
        .expect("no memory cgroup controller: this test needs one (as root, or delegated)");
    assert_eq!(
        berth_sandbox::cgroup::memory_state(&cg).map(|(limit, _)| limit),
        Some(MAX),
        "{}",
        cg.display()
    );
    // A child shell that holds 200 MB in a variable, well past the bound.
    let r = exec(
        "bash -c 'x=$(head -c 200000000 /dev/zero | tr \"\\0\" a); echo survived ${#x}'; echo exit=$?",
    )
    .await
    .unwrap();
    let out = r.result.output.text();
    assert!(!out.contains("survived 200000000"), "{out}");
    assert!(out.contains("exit=137"), "{out}");
    let notice = r.result.notices.join("\n");
    assert!(
        notice.contains("memory limit of 64 MiB")
            && notice.contains("OOM killer")
            && notice.contains("memory_max_bytes"),
        "{notice:?}"
    );
    // Only the process that grew was ended: the session goes on.
    let r = exec("echo alive").await.unwrap();
    assert_eq!(r.result.output.text().trim(), "alive");
    assert!(r.result.notices.is_empty(), "{:?}", r.result.notices);
    rt.shutdown().await;
}

/// Starting many sandboxes at once (#49 item 23): each wrapper sweeps away
/// the empty `berth-*` cgroups of others, and a fresh cgroup is empty until
/// its wrapper has joined it, so a sweep could remove it between the two
/// steps; joining then failed with ENODEV and the sandbox's first command
/// failed. 64 sandboxes started at the same moment must each run, confined
/// and in a pids cgroup of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_sandboxes_started_at_once_all_run_confined() {
    const N: usize = 64;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test checks each sandbox's pids cgroup, which berth uses as root: run it as root (as CI does)"
    );
    let state = tempfile::tempdir().unwrap();
    let backend = std::sync::Arc::new(wrapped(state.path()));
    let names: Vec<String> = (0..N)
        .map(|i| format!("many{i}x{}", std::process::id()))
        .collect();
    let _guards: Vec<CgroupGuard> = names
        .iter()
        .map(|n| {
            CgroupGuard(
                state.path().join("sandboxes").join("local").join(n),
                n.clone(),
            )
        })
        .collect();
    let mut sandboxes = Vec::new();
    for n in &names {
        sandboxes.push(
            backend
                .provision(&SandboxSpec::named(n))
                .await
                .unwrap()
                .sandbox,
        );
    }
    // Every shell starts at the same moment: nothing is awaited in between.
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(N));
    let mut set = tokio::task::JoinSet::new();
    for (n, sb) in names.iter().cloned().zip(sandboxes) {
        let start = start.clone();
        set.spawn(async move {
            start.wait().await;
            let run = async {
                let mut s = Session::open(sb, SessionConfig::named("t")).await?;
                s.exec(
                    "grep -E '^[0-9]+:pids:' /proc/self/cgroup; grep Seccomp: /proc/self/status; \
                     cat /etc/shadow >/dev/null 2>&1 || echo dark",
                    ExecOpts::default(),
                )
                .await
            };
            (n, run.await)
        });
    }
    let mut failed = Vec::new();
    while let Some(joined) = set.join_next().await {
        let (n, r) = joined.unwrap();
        match r {
            Ok(r) => {
                let out = r.output.text();
                let confined = r.exit_code == 0
                    && out.contains(&format!("/berth-{n}-"))
                    && out.contains("Seccomp:\t2")
                    && out.ends_with("dark\n");
                if !confined {
                    failed.push(format!("{n}: exit {} {out:?} {:?}", r.exit_code, r.notices));
                }
            }
            Err(e) => failed.push(format!("{n}: {e}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {N} sandboxes did not run confined:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A command that detaches a process from itself (`(setsid sleep &)`: a
/// session of its own, and its parent exits at once, so it is neither in
/// the shell's session nor below the shell) is still stopped with the
/// command on its timeout (#49 item 19): the shell adopts it (the wrapper
/// makes it a child subreaper) and the stop finds it there. Before, it
/// outlived a report that said every process the command started was
/// stopped. Control: one an earlier command detached, and that command
/// ended normally, is not this command's and lives on.
#[tokio::test]
async fn a_process_a_command_detached_with_setsid_is_stopped_on_timeout() {
    let o = open_wrapped("rd").await;
    let mut s = o.session;
    let r = s
        .exec(
            "(setsid sleep 101.33 >/dev/null 2>&1 &); echo detached",
            ExecOpts::default(),
        )
        .await
        .unwrap();
    assert_eq!(r.output.text(), "detached\n");
    let r = s
        .exec(
            "(setsid sleep 101.32 >/dev/null 2>&1 &); (setsid -f sleep 101.32 >/dev/null 2>&1); sleep 101.34",
            ExecOpts {
                timeout: Some(Duration::from_millis(500)),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(r.timed_out, "{}", r.output.text());
    let left = sleepers("101.32");
    assert_eq!(
        left, 0,
        "{left} detached process(es) outlived the report: {:?}",
        r.notices
    );
    assert_eq!(sleepers("101.34"), 0);
    assert_eq!(
        sleepers("101.33"),
        1,
        "an earlier command's detached process was taken for this one's"
    );
    let r = s.exec("echo alive", ExecOpts::default()).await.unwrap();
    assert_eq!(r.output.text(), "alive\n", "{:?}", r.notices);
    kill_sleepers("101.33");
}

/// KILL the test's own marker processes, `sleep SECS`, by pid.
fn kill_sleepers(secs: &str) {
    let marker = format!("sleep\0{secs}\0");
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == marker.as_bytes())
            && let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<i32>().ok())
        {
            // SAFETY: kill takes a pid and a signal number; no memory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Issue 49 item 8 on the local backend: the restricted shell is not
/// dumpable, so a command's child cannot read the end nonce from its memory.
#[tokio::test]
async fn a_child_cannot_forge_the_end_from_its_shells_memory() {
    let o = open_wrapped("fg").await;
    let (sb, mut s) = (o.sb.clone(), o.session);
    crate::conformance::a_child_cannot_forge_the_end_from_its_shells_memory(&sb, &mut s)
        .await
        .unwrap();
    s.close().await;
}
