//! `berth __sandbox-exec`: the exec wrapper of the local backend. It restricts
//! itself with the kernel's help and then execs the real argv, so the
//! restrictions hold for the whole process tree that follows.
//!
//! Flow at a glance, in a fresh single-threaded process (nothing of berth's
//! async runtime exists yet):
//! 1. build the [`SandboxProfile`] from the local policy and the sandbox dir
//!    (pure, in `berth-policies`);
//! 2. check that this kernel can enforce all of it, else refuse and say what is
//!    missing (exit 125);
//! 3. join the sandbox's pids cgroup, set rlimits, drop capabilities, set
//!    no_new_privs, apply Landlock (files, TCP, scopes), install seccomp;
//! 4. exec.
//!
//! It lives in the binary rather than a library because it must run before any
//! thread exists and must end in `exec`: a library entry point would invite
//! calling it from a multi-threaded process, where the restrictions would only
//! cover one thread.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use berth_backends::local_cgroup;
use berth_policies::{LocalPolicy, SandboxProfile};
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// The hidden subcommand's name.
pub const SUBCOMMAND: &str = "__sandbox-exec";

/// Exit code when the kernel cannot enforce the profile.
const EXIT_UNSUPPORTED: u8 = 125;
/// Exit code when the wrapper's own setup failed or the program cannot run.
const EXIT_FAILED: u8 = 126;

/// If this process was started as the wrapper, run it (never returns on
/// success, since it execs). Call this first thing in `main`.
pub fn dispatch() -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let _self = args.next();
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SUBCOMMAND)) {
        return None;
    }
    Some(match run(args.collect()) {
        Ok(never) => match never {},
        Err(Failure::Unsupported(what)) => {
            eprintln!(
                "berth: refusing to run: this kernel cannot enforce the local sandbox policy: {what}. \
                 Use a kernel with Landlock ABI >= 4 and seccomp filters, or set `restricted = false` \
                 under [local] in the policy file (or pass --unrestricted) to run WITHOUT kernel restrictions."
            );
            ExitCode::from(EXIT_UNSUPPORTED)
        }
        Err(Failure::Setup(what)) => {
            eprintln!("berth: sandbox setup failed: {what}");
            ExitCode::from(EXIT_FAILED)
        }
    })
}

enum Failure {
    Unsupported(String),
    Setup(String),
}

enum Never {}

struct Args {
    policy: LocalPolicy,
    sandbox_dir: PathBuf,
    name: String,
    unrestricted: bool,
    remove_cgroup: bool,
    argv: Vec<OsString>,
}

fn parse_args(args: Vec<OsString>) -> Result<Args, Failure> {
    let usage = "usage: berth __sandbox-exec [--policy JSON] --sandbox-dir DIR --name NAME [--network on|off] [--unrestricted] -- ARGV... | --sandbox-dir DIR --name NAME --remove-cgroup";
    let mut policy = LocalPolicy::default();
    let mut sandbox_dir = None;
    let mut name = None;
    let mut unrestricted = false;
    let mut remove_cgroup = false;
    let mut network_on = false;
    let mut it = args.into_iter();
    let mut argv = Vec::new();
    while let Some(a) = it.next() {
        let a_str = a.to_string_lossy();
        let mut value = |flag: &str| {
            it.next()
                .ok_or_else(|| Failure::Setup(format!("{flag} needs a value; {usage}")))
        };
        match a_str.as_ref() {
            "--policy" => {
                let v = value("--policy")?;
                policy = serde_json::from_str(&v.to_string_lossy()).map_err(|e| {
                    Failure::Setup(format!("--policy is not a valid local policy: {e}"))
                })?;
            }
            "--sandbox-dir" => sandbox_dir = Some(PathBuf::from(value("--sandbox-dir")?)),
            "--name" => name = Some(value("--name")?.to_string_lossy().into_owned()),
            "--unrestricted" => unrestricted = true,
            "--network" => match value("--network")?.to_string_lossy().as_ref() {
                "on" => network_on = true,
                "off" => {}
                other => {
                    return Err(Failure::Setup(format!(
                        "--network takes `on` or `off`, not {other:?}"
                    )));
                }
            },
            "--remove-cgroup" => remove_cgroup = true,
            "--" => {
                argv = it.by_ref().collect();
                break;
            }
            other => {
                return Err(Failure::Setup(format!(
                    "unknown argument {other:?}; {usage}"
                )));
            }
        }
    }
    if network_on {
        policy.network = true;
    }
    if argv.is_empty() && !remove_cgroup {
        return Err(Failure::Setup(format!("no program to run; {usage}")));
    }
    let sandbox_dir =
        sandbox_dir.ok_or_else(|| Failure::Setup(format!("--sandbox-dir is required; {usage}")))?;
    let name = name.unwrap_or_else(|| {
        sandbox_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    Ok(Args {
        policy,
        sandbox_dir,
        name,
        unrestricted,
        remove_cgroup,
        argv,
    })
}

fn run(args: Vec<OsString>) -> Result<Never, Failure> {
    let args = parse_args(args)?;
    if args.remove_cgroup {
        // `--sandbox-dir D --name N --remove-cgroup`: clean up after a sandbox.
        if let Some(dir) = local_cgroup::dir_for(&args.name, &args.sandbox_dir) {
            local_cgroup::remove(&dir).map_err(|e| {
                Failure::Setup(format!("removing pids cgroup {}: {e}", dir.display()))
            })?;
        }
        std::process::exit(0);
    }
    if args.unrestricted || !args.policy.restricted {
        eprintln!(
            "berth: WARNING: sandbox `{}` runs WITHOUT kernel restrictions (no Landlock, no seccomp, no rlimits): \
             its processes can read and write anything this user can, including ~/.ssh and berth's state.",
            args.name
        );
        return exec(&args.argv);
    }
    let profile = args
        .policy
        .profile(&args.name, &args.sandbox_dir, |p: &Path| p.exists());
    let abi = landlock_abi();
    check_support(&profile, abi)?;
    join_pids_cgroup(&profile, &args.sandbox_dir)?;
    set_rlimits(&profile)?;
    drop_capabilities()?;
    set_no_new_privs()?;
    apply_landlock(&profile, abi)?;
    apply_seccomp(&profile)?;
    exec(&args.argv)
}

fn exec(argv: &[OsString]) -> Result<Never, Failure> {
    let err = std::process::Command::new(&argv[0]).args(&argv[1..]).exec();
    Err(Failure::Setup(format!(
        "cannot run {:?}: {err}",
        argv[0].to_string_lossy()
    )))
}

/// The kernel's Landlock ABI version; 0 when Landlock is absent or disabled.
fn landlock_abi() -> i64 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attr, size 0 and the VERSION flag the syscall only
    // returns the ABI version (or -1); it reads and writes no memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}

fn check_support(profile: &SandboxProfile, abi: i64) -> Result<(), Failure> {
    if abi < 1 {
        return Err(Failure::Unsupported(
            "Landlock is not available (not built in or not enabled in the `lsm=` boot parameter), so file access cannot be confined".into(),
        ));
    }
    if !profile.network && abi < 4 {
        return Err(Failure::Unsupported(format!(
            "the policy turns the network off, which needs Landlock ABI 4 to deny TCP connect and bind; this kernel has ABI {abi}"
        )));
    }
    // SAFETY: PR_GET_SECCOMP takes no pointers and only reports the mode.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if mode < 0 {
        return Err(Failure::Unsupported(
            "seccomp is not available (kernel built without CONFIG_SECCOMP)".into(),
        ));
    }
    Ok(())
}

/// Root is exempt from RLIMIT_NPROC, so for root the process bound comes from
/// a pids cgroup shared by the whole sandbox. Without one, root is refused.
fn join_pids_cgroup(profile: &SandboxProfile, sandbox_dir: &Path) -> Result<(), Failure> {
    let max = profile.rlimits.pids;
    if max == 0 {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match local_cgroup::dir_for(&profile.name, sandbox_dir) {
        Some(dir) => {
            let joined = local_cgroup::join(&dir, max);
            match joined {
                Ok(()) => Ok(()),
                Err(e) if root => Err(Failure::Unsupported(format!(
                    "cannot bound processes: joining pids cgroup {} failed ({e}); RLIMIT_NPROC does not apply to root",
                    dir.display()
                ))),
                Err(_) => Ok(()),
            }
        }
        None if root => Err(Failure::Unsupported(
            "cannot bound processes for root: no writable pids cgroup controller is mounted, and RLIMIT_NPROC does not apply to root; run berth as a non-root user, mount the pids controller, or set `rlimits.pids = 0` under [local] to accept no bound".into(),
        )),
        None => Ok(()),
    }
}

fn set_rlimits(profile: &SandboxProfile) -> Result<(), Failure> {
    let r = &profile.rlimits;
    for (res, val, what) in [
        (libc::RLIMIT_NPROC, r.nproc, "nproc"),
        (libc::RLIMIT_NOFILE, r.nofile, "nofile"),
        (libc::RLIMIT_FSIZE, r.fsize_bytes, "fsize"),
        (libc::RLIMIT_AS, r.address_space_bytes, "as"),
    ] {
        if val == 0 {
            continue;
        }
        let lim = libc::rlimit {
            rlim_cur: val as libc::rlim_t,
            rlim_max: val as libc::rlim_t,
        };
        // SAFETY: `lim` is a valid rlimit that outlives the call.
        if unsafe { libc::setrlimit(res, &lim) } != 0 {
            return Err(Failure::Setup(format!(
                "setrlimit {what}={val}: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// Empty the capability bounding, ambient and current sets, so a sandbox
/// running as root cannot raise rlimits, bypass file modes or regain
/// capabilities through exec.
fn drop_capabilities() -> Result<(), Failure> {
    for cap in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes an integer; EINVAL past the last cap ends the loop.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            if e.raw_os_error() == Some(libc::EPERM) {
                // Not allowed to drop: we have no CAP_SETPCAP, so we hold no caps worth dropping.
                break;
            }
            return Err(Failure::Setup(format!("dropping capability {cap}: {e}")));
        }
    }
    // SAFETY: integer-only prctl.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut hdr = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a v3 header and two data structs, both valid for the call.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut Header, data.as_ptr()) };
    if r != 0 {
        return Err(Failure::Setup(format!(
            "dropping capabilities: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

fn set_no_new_privs() -> Result<(), Failure> {
    // SAFETY: integer-only prctl.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(Failure::Setup(format!(
            "setting no_new_privs: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

fn landlock_abi_enum(abi: i64) -> ABI {
    match abi {
        ..=1 => ABI::V1,
        2 => ABI::V2,
        3 => ABI::V3,
        4 => ABI::V4,
        5 => ABI::V5,
        6 => ABI::V6,
        7 => ABI::V7,
        8 => ABI::V8,
        _ => ABI::V9,
    }
}

fn apply_landlock(profile: &SandboxProfile, abi_num: i64) -> Result<(), Failure> {
    let abi = landlock_abi_enum(abi_num);
    let ll = |e: landlock::RulesetError| Failure::Setup(format!("Landlock: {e}"));
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    if !profile.network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(ll)?;
    }
    // Not Scope::Signal: the session engine stops a command's tree from a
    // second spawn, which is a sibling domain and would be refused.
    if abi_num >= 6 {
        ruleset = ruleset.scope(Scope::AbstractUnixSocket).map_err(ll)?;
    }
    let present =
        |v: &Vec<PathBuf>| -> Vec<PathBuf> { v.iter().filter(|p| p.exists()).cloned().collect() };
    let read = present(&profile.read_exec);
    let write = present(&profile.read_write);
    let status = ruleset
        .create()
        .map_err(ll)?
        .add_rules(path_beneath_rules(&read, AccessFs::from_read(abi)))
        .map_err(ll)?
        .add_rules(path_beneath_rules(&write, AccessFs::from_all(abi)))
        .map_err(ll)?
        .restrict_self()
        .map_err(ll)?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(Failure::Unsupported(format!(
            "Landlock enforced the ruleset only {:?}",
            status.ruleset
        )));
    }
    Ok(())
}

fn apply_seccomp(profile: &SandboxProfile) -> Result<(), Failure> {
    let sc = |e: seccompiler::BackendError| Failure::Setup(format!("seccomp filter: {e}"));
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    let cond = |arg: u8, op: SeccompCmpOp, v: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, v).map_err(sc)
    };
    let mut socket_rules = vec![
        SeccompRule::new(vec![cond(0, SeccompCmpOp::Eq, libc::AF_PACKET as u64)?]).map_err(sc)?,
        SeccompRule::new(vec![cond(
            1,
            SeccompCmpOp::MaskedEq(0xf),
            libc::SOCK_RAW as u64,
        )?])
        .map_err(sc)?,
    ];
    if !profile.network {
        for family in [
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_UNIX,
            libc::AF_NETLINK,
        ] {
            // AF_UNIX too: Landlock below ABI 9 cannot confine connects to
            // pathname sockets (such as docker.sock).
            socket_rules.push(
                SeccompRule::new(vec![cond(0, SeccompCmpOp::Eq, family as u64)?]).map_err(sc)?,
            );
        }
    }
    rules.insert(libc::SYS_socket, socket_rules);
    // Landlock does not cover mode changes, so refuse setuid/setgid bits
    // outright: nothing in a sandbox has a reason to plant them.
    let mut chmods = vec![(libc::SYS_fchmod, 1u8), (libc::SYS_fchmodat, 2u8)];
    #[cfg(target_arch = "x86_64")]
    chmods.push((libc::SYS_chmod, 1u8));
    for (nr, arg) in chmods {
        let mut r = Vec::new();
        for bits in [0o4000u64, 0o2000, 0o6000] {
            r.push(
                SeccompRule::new(vec![cond(arg, SeccompCmpOp::MaskedEq(0o6000), bits)?])
                    .map_err(sc)?,
            );
        }
        rules.insert(nr, r);
    }
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| Failure::Unsupported(format!("seccomp on {}: {e}", std::env::consts::ARCH)))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(sc)?;
    let prog: BpfProgram = filter.try_into().map_err(sc)?;
    seccompiler::apply_filter(&prog).map_err(|e| match e {
        seccompiler::Error::Seccomp(io) if io.raw_os_error() == Some(libc::EINVAL) => {
            Failure::Unsupported("seccomp filters are not supported (CONFIG_SECCOMP_FILTER)".into())
        }
        other => Failure::Setup(format!("installing seccomp filter: {other}")),
    })
}

/// Syscalls no sandboxed process may make: tracing other processes, mounting,
/// kernel modules and images, BPF, namespaces, and io_uring (which can make
/// network calls past a socket() filter).
fn denied_syscalls() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_bpf,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_open_by_handle_at,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    v
}
