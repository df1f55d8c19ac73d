//! `berth __sandbox-exec`: the exec wrapper of the local backend.
//!
//! Flow at a glance, in a fresh single-threaded process (nothing of berth's
//! async runtime exists yet):
//! 1. parse the wrapper's own flags (clap) and build the
//!    [`SandboxProfile`] from the local policy and the sandbox dir;
//! 2. check that this kernel can enforce all of it, else refuse and say what is
//!    missing (exit 125);
//! 3. mark inherited fds close-on-exec, join the sandbox's pids and memory
//!    cgroups, set rlimits, drop capabilities, set no_new_privs, apply
//!    Landlock (files, TCP, scopes), install seccomp;
//! 4. exec.
//!
//! It must run before any thread exists and must end in `exec`: capabilities,
//! Landlock and seccomp bind the calling thread, so called from a
//! multi-threaded process they would cover one thread only. That is why the
//! entry is [`dispatch`], called first thing in `main`, and not a library call.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use berth_policies::{LocalPolicy, SandboxProfile};
use clap::Parser;

use crate::error::{Error, Result};

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "__sandbox-exec";

/// Exit code when the kernel cannot enforce the profile.
pub const EXIT_UNSUPPORTED: u8 = 125;
/// Exit code when the wrapper's own setup failed or the program cannot run.
pub const EXIT_FAILED: u8 = 126;

/// The one variable berth starts the wrapper with: the environment of the
/// sandboxed program, as JSON pairs. The wrapper itself runs with nothing
/// else in its environment, so no variable the sandbox chose (`LD_PRELOAD`,
/// `GCONV_PATH`, `GLIBC_TUNABLES`, …) acts on the wrapper while it is still
/// unconfined: the dynamic loader reads those before `main`, where no check
/// of the wrapper's could come in time. The program gets them only at the
/// final exec, confined.
pub const ENV_CARRIER: &str = "BERTH_SANDBOX_EXEC_ENV";

/// If this process was started as the wrapper, run it (never returns on
/// success, since it execs). Call this first thing in `main`.
pub fn dispatch() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let _self = args.next();
    if args.next().as_deref() != Some(OsStr::new(SUBCOMMAND)) {
        return None;
    }
    let err = match run(args.collect()) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    Some(match err {
        Error::Unsupported(what) => {
            eprintln!(
                "berth: refusing to run: this kernel cannot enforce the local sandbox policy: {what}. \
                 Use a kernel with Landlock ABI >= 4 and seccomp filters, or set `restricted = false` \
                 under [local] in the policy file (or pass --unrestricted) to run WITHOUT kernel restrictions."
            );
            ExitCode::from(EXIT_UNSUPPORTED)
        }
        other => {
            eprintln!("berth: sandbox setup failed: {other}");
            ExitCode::from(EXIT_FAILED)
        }
    })
}

/// The wrapper's flags. Built by [`crate::WrapperCommand`]; parsed here.
#[derive(Debug, Parser)]
#[command(name = "berth __sandbox-exec", no_binary_name = true)]
pub(crate) struct Args {
    /// The `[local]` policy as JSON.
    #[arg(long, value_parser = parse_policy, default_value = "{}")]
    pub policy: LocalPolicy,
    /// The sandbox's directory (holding work/, tmp/, .berth/).
    #[arg(long)]
    pub sandbox_dir: PathBuf,
    /// The sandbox's name (its directory's name when absent).
    #[arg(long, default_value = "")]
    pub name: String,
    /// Network for this sandbox (`on` also when the policy says so).
    #[arg(long, value_parser = ["on", "off"], default_value = "off")]
    network: String,
    /// Run WITHOUT kernel restrictions.
    #[arg(long)]
    pub unrestricted: bool,
    /// Bound the sandbox's memory (swap included) to this many bytes through
    /// its memory cgroup, where there is one.
    #[arg(long)]
    pub memory_max: Option<u64>,
    /// Run the program from a private copy nobody can read, so the process is
    /// not dumpable (see [`crate::private`]): a session's shell.
    #[arg(long)]
    pub nondumpable: bool,
    /// The network door (`--network allow:`): the directory of berth's
    /// egress proxy socket. The sandbox then gets a network namespace of
    /// its own, and a relay on 127.0.0.1:3128 as its only way out.
    #[arg(long)]
    pub door: Option<PathBuf>,
    /// Kill what is left of the sandbox and remove its pids cgroup, then exit.
    #[arg(long)]
    pub remove_cgroup: bool,
    /// The program and its arguments.
    #[arg(last = true)]
    pub argv: Vec<OsString>,
}

fn parse_policy(s: &str) -> std::result::Result<LocalPolicy, String> {
    serde_json::from_str(s).map_err(|e| format!("--policy is not a valid local policy: {e}"))
}

pub(crate) fn parse_args(args: Vec<OsString>) -> Result<Args> {
    let mut a = Args::try_parse_from(args).map_err(|e| Error::Usage(e.to_string()))?;
    if a.network == "on" {
        a.policy.network = true;
    }
    if a.argv.is_empty() && !a.remove_cgroup {
        return Err(Error::Usage(
            "no program to run; usage: berth __sandbox-exec [--policy JSON] --sandbox-dir DIR --name NAME [--network on|off] [--unrestricted] -- ARGV...".into(),
        ));
    }
    if a.name.is_empty() {
        a.name = a
            .sandbox_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
    }
    Ok(a)
}

enum Never {}

fn run(args: Vec<OsString>) -> Result<Never> {
    let args = parse_args(args)?;
    if args.remove_cgroup {
        for dir in crate::cgroup::dirs_for(&args.name, &args.sandbox_dir) {
            crate::cgroup::remove(&dir)
                .map_err(|e| Error::setup(format!("removing cgroup {}", dir.display()), e))?;
        }
        std::process::exit(0);
    }
    crate::env::close_inherited_fds()?;
    let env = program_env()?;
    // Opened while berth's state is in reach; the relay connects through it.
    let door = args
        .door
        .as_deref()
        .map(crate::door::DoorDir::open)
        .transpose()?;
    // Read now, while every file is still in reach.
    let copy = args
        .nondumpable
        .then(|| private_copy(&args.argv[0], env.as_ref()))
        .flatten();
    if door.is_some() && (args.unrestricted || !args.policy.restricted) {
        return Err(Error::Unsupported(format!(
            "sandbox `{}` has `--network allow:` rules, which only a restricted sandbox can be held to \
             (its own network namespace, berth's proxy its one door); unset BERTH_UNRESTRICTED or \
             `restricted = false`, or make the sandbox with --network on or off",
            args.name
        )));
    }
    if args.unrestricted || !args.policy.restricted {
        eprintln!(
            "berth: WARNING: sandbox `{}` runs WITHOUT kernel restrictions (no Landlock, no seccomp, no rlimits): \
             its processes can read and write anything this user can, including ~/.ssh and berth's state.",
            args.name
        );
        return exec(&args.argv, env, copy.as_ref());
    }
    let mut profile = args
        .policy
        .profile(&args.name, &args.sandbox_dir, |p: &Path| p.exists());
    if door.is_some() {
        // TCP is allowed, in a namespace whose only interface is `lo` and
        // whose only listener is the relay: the namespace is the boundary.
        profile.network = true;
    }
    let abi = crate::landlock::abi();
    check_support(&profile, abi)?;
    crate::cgroup::join_for(&profile, &args.sandbox_dir)?;
    crate::cgroup::join_memory_for(&profile.name, &args.sandbox_dir, args.memory_max);
    crate::rlimits::apply(&profile.rlimits)?;
    // Before the capabilities go: making the namespace needs them (as root).
    // A kernel that gives no namespace leaves the rest of the sandbox as it is.
    let marker = crate::mounts::marker_point(&args.sandbox_dir)?;
    let view = crate::mounts::read_only_view(&crate::landlock::write_grants(&profile))?;
    // Who a process is, berth decides from kernel facts: the sandbox's pids
    // cgroup, or the marker mount of its namespace. Without either, its
    // processes could not be told from the user's own (the dashboard and the
    // server would take them for the user), so the sandbox does not run.
    match &view {
        crate::mounts::View::Made { .. } => crate::mounts::mount_marker(
            &marker,
            &crate::mounts::marker_source(&args.name, &args.sandbox_dir),
        )?,
        crate::mounts::View::Unavailable(why)
            if !std::fs::read_to_string("/proc/self/cgroup").is_ok_and(|c| {
                c.contains(&crate::cgroup::leaf_for(&profile.name, &args.sandbox_dir))
            }) =>
        {
            return Err(Error::Unsupported(format!(
                "berth cannot mark this sandbox's processes: {why}, and no pids cgroup holds them; \
                 allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or \
                 kernel.apparmor_restrict_unprivileged_userns=0), or delegate a pids cgroup to this user"
            )));
        }
        crate::mounts::View::Unavailable(_) => {}
    }
    if door.is_some() {
        // With the capabilities the view's namespace (or root) still gives.
        crate::door::isolate()?;
    }
    if view == (crate::mounts::View::Made { terminals: true }) {
        // Its own devpts instance: the host's terminals are not in it.
        profile.read_write.extend(
            crate::mounts::PRIVATE_TERMINALS
                .iter()
                .map(std::path::PathBuf::from),
        );
    }
    // Root's powers are gone below; as root, so is root's ownership of
    // root's files: the sandbox becomes a uid of its own, its grants
    // idmapped so its files stay root's on disk.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0
        && !args.policy.run_as_root
        && matches!(view, crate::mounts::View::Made { .. })
    {
        crate::caps::drop_bounding()?;
        crate::own_uid::become_own(
            crate::own_uid::uid_for(&args.name, &args.sandbox_dir),
            &crate::landlock::write_grants(&profile),
            &crate::landlock::read_grants(&profile),
        )?;
    }
    crate::caps::drop_all()?;
    set_no_new_privs()?;
    if let Some(d) = &door {
        // As the sandbox's uid, without capabilities, before the filters.
        crate::door::start_relay(d)?;
    }
    // Every process of the sandbox, berth's helpers too, may signal only its
    // own tree: a helper acts on pids the sandbox wrote into its files, and
    // unscoped, a `1` there would have it signal the whole host. What must
    // reach an earlier spawn's processes, berth does from its own process,
    // once it knows them to be the sandbox's (`berth_core::procs`).
    crate::landlock::apply(&profile, abi)?;
    crate::seccomp::apply(&profile)?;
    exec(&args.argv, env, copy.as_ref())
}

/// The program's private copy, or `None` (and a warning on stderr, which a
/// session keeps for its diagnostics) when one cannot be made: the program
/// then runs as it is, dumpable.
fn private_copy(
    program: &OsStr,
    env: Option<&Vec<(String, String)>>,
) -> Option<crate::private::PrivateCopy> {
    let path = match env {
        Some(pairs) => pairs
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| OsString::from(v)),
        None => std::env::var_os("PATH"),
    };
    let made = crate::private::resolve(program, path.as_deref())
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
        .and_then(|exe| crate::private::PrivateCopy::of(&exe));
    match made {
        Ok(copy) => Some(copy),
        Err(e) => {
            eprintln!(
                "berth: warning: cannot run {:?} from a private copy ({e}); it runs dumpable, so processes it starts can read its memory",
                program.to_string_lossy()
            );
            None
        }
    }
}

/// The sandboxed program's environment: from [`ENV_CARRIER`] when berth
/// passed one, else the wrapper's own (a person running the wrapper by hand).
fn program_env() -> Result<Option<Vec<(String, String)>>> {
    let Some(raw) = std::env::var_os(ENV_CARRIER) else {
        return Ok(None);
    };
    let pairs: Vec<(String, String)> = serde_json::from_slice(raw.as_encoded_bytes())
        .map_err(|e| Error::Usage(format!("{ENV_CARRIER} is not a list of pairs: {e}")))?;
    Ok(Some(pairs))
}

fn exec(
    argv: &[OsString],
    env: Option<Vec<(String, String)>>,
    copy: Option<&crate::private::PrivateCopy>,
) -> Result<Never> {
    set_child_subreaper()?;
    let mut cmd = match copy {
        Some(c) => {
            let mut cmd = std::process::Command::new(c.path());
            cmd.arg0(&argv[0]);
            cmd
        }
        None => std::process::Command::new(&argv[0]),
    };
    cmd.args(&argv[1..]);
    match env {
        Some(pairs) => {
            cmd.env_clear().envs(pairs);
        }
        None => {
            cmd.env_remove(ENV_CARRIER);
        }
    }
    let err = cmd.exec();
    Err(Error::setup(
        format!("cannot run {:?}", argv[0].to_string_lossy()),
        err,
    ))
}

fn check_support(profile: &SandboxProfile, abi: i32) -> Result<()> {
    if abi < 1 {
        return Err(Error::Unsupported(
            "Landlock is not available (not built in or not enabled in the `lsm=` boot parameter), so file access cannot be confined".into(),
        ));
    }
    if !profile.network && abi < 4 {
        return Err(Error::Unsupported(format!(
            "the policy turns the network off, which needs Landlock ABI 4 to deny TCP connect and bind; this kernel has ABI {abi}"
        )));
    }
    if abi < 6 && !profile.allow_unscoped_signals {
        return Err(Error::Unsupported(format!(
            "confining signals and abstract unix sockets to the sandbox needs Landlock ABI 6; this kernel has ABI {abi}. \
             Set `unscoped_signals = true` under [local] to accept that a sandbox can signal this user's other processes"
        )));
    }
    // SAFETY: PR_GET_SECCOMP takes no pointers and only reports the mode.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if mode < 0 {
        return Err(Error::Unsupported(
            "seccomp is not available (kernel built without CONFIG_SECCOMP)".into(),
        ));
    }
    Ok(())
}

/// Make the program berth starts (the flag outlives exec) the adopter of
/// every orphan of its tree: a process that a command detaches from itself
/// (`(setsid sleep 1000 &)`: its parent exits at once) is then the
/// program's child, not init's, and the session shell's stop finds it by its
/// parents (`berth_core::session::tree`). Without this it would be no
/// process of the shell's session or tree, and outlive every stop.
fn set_child_subreaper() -> Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer and no pointers; it
    // only sets a flag of this process.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if r != 0 {
        return Err(Error::setup(
            "making the program a child subreaper (PR_SET_CHILD_SUBREAPER)",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Without no_new_privs a setuid binary would shed seccomp and Landlock's
/// limits on exec; with it, exec can never gain privileges.
pub fn set_no_new_privs() -> Result<()> {
    nix::sys::prctl::set_no_new_privs().map_err(|e| Error::setup("setting no_new_privs", e))
}
