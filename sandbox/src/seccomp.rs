//! seccomp: the syscalls a sandbox may not make, and the arguments it may not
//! pass. Three filters, one per answer:
//! - `EPERM`: tracing and reading other processes, mounts, modules, BPF,
//!   namespaces (`unshare`, `setns`, and `clone` with a `CLONE_NEW*` flag),
//!   io_uring (its ops bypass these filters), keyrings, file handles,
//!   userfaultfd, perf, terminal input injection (`TIOCSTI`), exotic
//!   personalities; setuid/setgid mode bits on every path that sets a mode
//!   (the chmod family, creating `open`/`openat`/`creat`, `mkdir`, `mknod`);
//!   every socket family but an allow-list; `socketpair` other than a
//!   connected AF_UNIX stream or seqpacket pair.
//! - `ENOSYS`: `clone3` and `openat2`, whose flags and modes sit behind a
//!   pointer seccomp cannot read. libc and runtimes fall back to `clone` and
//!   `openat`, which are filtered by argument. inotify, whose watches see
//!   names in directories Landlock denies; watchers fall back to polling.
//! - `EOPNOTSUPP`: setting or removing extended attributes (POSIX ACLs, file
//!   capabilities). Tools read that as "this file system has none" and go on.

use std::collections::BTreeMap;

use berth_policies::SandboxProfile;
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

// Syscalls newer than some libc releases know: the same number on every arch.
const SYS_MOUNT_SETATTR: i64 = 442;
const SYS_FCHMODAT2: i64 = 452;
const SYS_SETXATTRAT: i64 = 463;
const SYS_REMOVEXATTRAT: i64 = 466;
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// Namespace flags `clone` may not carry.
const CLONE_NS_FLAGS: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// The obsolete packet socket type (deprecated in libc, still in the kernel).
const SOCK_PACKET: u64 = 10;

/// `__O_TMPFILE`: the bit that makes `O_TMPFILE` create a file.
const O_TMPFILE_BIT: u64 = (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64;

fn bpf_err(e: seccompiler::BackendError) -> Error {
    Error::setup("seccomp filter", std::io::Error::other(e.to_string()))
}

fn cond(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, v: u64) -> Result<SeccompCondition> {
    SeccompCondition::new(arg, len, op, v).map_err(bpf_err)
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule> {
    SeccompRule::new(conds).map_err(bpf_err)
}

/// Syscalls refused outright.
pub fn denied_syscalls() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_pidfd_getfd,
        libc::SYS_kcmp,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_fsopen,
        libc::SYS_fsmount,
        libc::SYS_fsconfig,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        SYS_MOUNT_SETATTR,
        SYS_OPEN_TREE_ATTR,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_bpf,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_name_to_handle_at,
        libc::SYS_open_by_handle_at,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_fanotify_init,
        libc::SYS_chroot,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([libc::SYS_iopl, libc::SYS_ioperm, libc::SYS_uselib]);
    v
}

/// Rules that refuse a setuid or setgid bit in argument `mode_arg`, when
/// `extra` (if any) also holds.
fn no_setid_bits(mode_arg: u8, extra: Option<SeccompCondition>) -> Result<Vec<SeccompRule>> {
    let mut out = Vec::new();
    for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
        let mut c = vec![cond(
            mode_arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(bit),
            bit,
        )?];
        c.extend(extra.clone());
        out.push(rule(c)?);
    }
    Ok(out)
}

/// Creating opens: with `O_CREAT` or `O_TMPFILE` in `flags_arg`, no setuid or
/// setgid bit in `mode_arg`.
fn creating_open(flags_arg: u8, mode_arg: u8) -> Result<Vec<SeccompRule>> {
    let mut out = Vec::new();
    for creates in [libc::O_CREAT as u64, O_TMPFILE_BIT] {
        let c = cond(
            flags_arg,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(creates),
            creates,
        )?;
        out.extend(no_setid_bits(mode_arg, Some(c))?);
    }
    Ok(out)
}

/// The `EPERM` filter's rules.
pub fn eperm_rules(profile: &SandboxProfile) -> Result<Rules> {
    let mut rules: Rules = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }

    // Socket families: an allow-list. With the network off, none. Never
    // AF_UNIX, network or not: Landlock before ABI 9 cannot confine
    // connecting to pathname sockets, and every socket of the user (or, as
    // root, of the host) would be in reach: docker.sock, berth's own
    // server.sock (where approvals are answered), an ssh-agent's.
    // (socketpair still gives pipes.)
    let socket = if profile.network {
        let mut not_allowed = Vec::new();
        for family in [libc::AF_INET, libc::AF_INET6] {
            not_allowed.push(cond(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                family as u64,
            )?);
        }
        vec![
            rule(not_allowed)?,
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(0xf),
                libc::SOCK_RAW as u64,
            )?])?,
            rule(vec![cond(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(0xf),
                SOCK_PACKET,
            )?])?,
        ]
    } else {
        Vec::new()
    };
    rules.insert(libc::SYS_socket, socket);
    // socketpair: AF_UNIX only, and only the connection-oriented types. A
    // datagram socket of a pair is a socket like any other: `sendto` with an
    // address, or `connect` to a new one, reaches every pathname datagram
    // socket the uid may write (`/dev/log`, `/run/systemd/notify`, a
    // listener in a directory Landlock denies, which it does not check for
    // sockets before ABI 9). A stream or seqpacket pair is connected from
    // birth: `connect` fails (EISCONN) and the address of a send is refused
    // (stream) or ignored (seqpacket). (The kernel makes an AF_UNIX
    // `SOCK_RAW` a datagram socket; no other type exists for it.)
    let pair_not_unix = rule(vec![cond(
        0,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::Ne,
        libc::AF_UNIX as u64,
    )?])?;
    let mut pair = vec![pair_not_unix];
    for ty in [libc::SOCK_DGRAM as u64, libc::SOCK_RAW as u64] {
        pair.push(rule(vec![cond(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(0xf),
            ty,
        )?])?);
    }
    rules.insert(libc::SYS_socketpair, pair);

    // Namespaces through clone's flags (clone3 gets ENOSYS below).
    let mut clone = Vec::new();
    for flag in CLONE_NS_FLAGS {
        clone.push(rule(vec![cond(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(flag),
            flag,
        )?])?);
    }
    rules.insert(libc::SYS_clone, clone);

    // Setuid/setgid bits, on every syscall that sets a mode.
    rules.insert(libc::SYS_fchmod, no_setid_bits(1, None)?);
    rules.insert(libc::SYS_fchmodat, no_setid_bits(2, None)?);
    rules.insert(SYS_FCHMODAT2, no_setid_bits(2, None)?);
    rules.insert(libc::SYS_openat, creating_open(2, 3)?);
    rules.insert(libc::SYS_mkdirat, no_setid_bits(2, None)?);
    rules.insert(libc::SYS_mknodat, no_setid_bits(2, None)?);
    #[cfg(target_arch = "x86_64")]
    {
        rules.insert(libc::SYS_chmod, no_setid_bits(1, None)?);
        rules.insert(libc::SYS_open, creating_open(1, 2)?);
        rules.insert(libc::SYS_creat, no_setid_bits(1, None)?);
        rules.insert(libc::SYS_mkdir, no_setid_bits(1, None)?);
        rules.insert(libc::SYS_mknod, no_setid_bits(1, None)?);
    }

    // Pushing bytes into a terminal's input queue runs them as the operator.
    let mut ioctl = Vec::new();
    for req in [libc::TIOCSTI, libc::TIOCLINUX] {
        ioctl.push(rule(vec![cond(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::Eq,
            req,
        )?])?);
    }
    rules.insert(libc::SYS_ioctl, ioctl);

    // Only the ordinary personalities (and the query): READ_IMPLIES_EXEC and
    // ADDR_NO_RANDOMIZE weaken memory protections.
    let mut odd = Vec::new();
    for p in [0u64, 0x8, 0x20000, 0x20008, 0xffff_ffff] {
        odd.push(cond(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p)?);
    }
    rules.insert(libc::SYS_personality, vec![rule(odd)?]);
    Ok(rules)
}

/// The `ENOSYS` filter's syscalls.
///
/// inotify is here too: a watch needs only a path the sandbox can look up,
/// not one Landlock lets it read, so a watch on `/root`, `~/.ssh` or berth's
/// state dir would report every name created there. Landlock has no right
/// for watches, and seccomp cannot read the path. ENOSYS is what a kernel
/// without inotify answers, and what file watchers handle: `tail -f`,
/// watchdog, inotify-tools' users, node's and cargo's watchers fall back to
/// polling. (fanotify is refused outright, above.)
pub fn enosys_syscalls() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_clone3,
        libc::SYS_openat2,
        libc::SYS_inotify_init1,
        libc::SYS_inotify_add_watch,
    ];
    #[cfg(target_arch = "x86_64")]
    v.push(libc::SYS_inotify_init);
    v
}

/// The `EOPNOTSUPP` filter's syscalls: writing extended attributes.
pub fn xattr_write_syscalls() -> Vec<i64> {
    vec![
        libc::SYS_setxattr,
        libc::SYS_lsetxattr,
        libc::SYS_fsetxattr,
        SYS_SETXATTRAT,
        libc::SYS_removexattr,
        libc::SYS_lremovexattr,
        libc::SYS_fremovexattr,
        SYS_REMOVEXATTRAT,
    ]
}

fn compile(rules: Rules, errno: i32) -> Result<BpfProgram> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| Error::Unsupported(format!("seccomp on {}: {e}", std::env::consts::ARCH)))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch,
    )
    .map_err(bpf_err)?;
    filter.try_into().map_err(bpf_err)
}

fn whole(nrs: Vec<i64>) -> Rules {
    nrs.into_iter().map(|nr| (nr, Vec::new())).collect()
}

/// Install the three filters on the calling thread (inherited by all it execs).
pub fn apply(profile: &SandboxProfile) -> Result<()> {
    let progs = [
        compile(eperm_rules(profile)?, libc::EPERM)?,
        compile(whole(enosys_syscalls()), libc::ENOSYS)?,
        compile(whole(xattr_write_syscalls()), libc::EOPNOTSUPP)?,
    ];
    for prog in &progs {
        seccompiler::apply_filter(prog).map_err(|e| match e {
            seccompiler::Error::Seccomp(io) if io.raw_os_error() == Some(libc::EINVAL) => {
                Error::Unsupported(
                    "seccomp filters are not supported (CONFIG_SECCOMP_FILTER)".into(),
                )
            }
            other => Error::setup(
                "installing seccomp filter",
                std::io::Error::other(other.to_string()),
            ),
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn errno_of(r: libc::c_long) -> i32 {
        if r >= 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        }
    }

    #[test]
    fn the_filters_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, "x").unwrap();
        let r = crate::readback::in_child("seccomp::tests::the_filters_read_back", || {
            let p = berth_policies::LocalPolicy::default().profile("t", dir.path(), |_| true);
            nix::sys::prctl::set_no_new_privs().unwrap();
            apply(&p).unwrap();
            let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
            let field = |k: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(str::trim)
                    .unwrap_or("?")
                    .to_string()
            };
            let path = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: raw syscalls with valid pointers or none; each only
            // returns a result, which is what is read back.
            let (suid, plain, clone3, vsock, xattr) = unsafe {
                (
                    errno_of(libc::syscall(
                        SYS_FCHMODAT2,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        0o4755,
                        0,
                    )),
                    errno_of(libc::syscall(
                        SYS_FCHMODAT2,
                        libc::AT_FDCWD,
                        path.as_ptr(),
                        0o755,
                        0,
                    )),
                    errno_of(libc::syscall(
                        libc::SYS_clone3,
                        std::ptr::null::<u8>(),
                        0usize,
                    )),
                    errno_of(libc::syscall(
                        libc::SYS_socket,
                        libc::AF_VSOCK,
                        libc::SOCK_STREAM,
                        0,
                    )),
                    errno_of(libc::syscall(
                        libc::SYS_setxattr,
                        path.as_ptr(),
                        c"user.x".as_ptr(),
                        c"1".as_ptr(),
                        1usize,
                        0,
                    )),
                )
            };
            format!(
                "mode={} filters={} suid={suid} plain={plain} clone3={clone3} vsock={vsock} xattr={xattr}",
                field("Seccomp:"),
                field("Seccomp_filters:"),
            )
        });
        r.expect_line(&format!(
            "mode=2 filters=3 suid={} plain=0 clone3={} vsock={} xattr={}",
            libc::EPERM,
            libc::ENOSYS,
            libc::EPERM,
            libc::EOPNOTSUPP
        ));
    }
}
