//! berth's own seccomp profile for docker sandboxes, passed at container
//! create in place of Docker's default.
//!
//! It keeps what Docker's default denies for a container without capabilities
//! (which `cap_drop: ALL` makes fail anyway) and adds what berth's local
//! sandbox refuses and Docker's default lets through: socket families outside
//! an allow-list (`AF_VSOCK` reaches the host's hypervisor sockets), `clone`
//! with namespace flags, `clone3` (ENOSYS, so libc falls back to `clone`),
//! io_uring, userfaultfd, perf, keyrings, BPF, file handles, `TIOCSTI`, and
//! setuid/setgid mode bits. The rest is allowed: a docker sandbox is a whole
//! distribution and must run its tools.

use serde_json::{Value, json};

const EPERM: i64 = libc::EPERM as i64;

/// Syscalls refused outright (by name, as libseccomp knows them).
const DENIED: &[&str] = &[
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "init_module",
    "finit_module",
    "delete_module",
    "unshare",
    "setns",
    "name_to_handle_at",
    "open_by_handle_at",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "syslog",
    "vhangup",
    "fanotify_init",
    "chroot",
    "iopl",
    "ioperm",
    "uselib",
    "personality",
];

/// Families `socket` may make: only AF_UNIX without network.
fn allowed_families(network: bool) -> Vec<i64> {
    let mut v = vec![libc::AF_UNIX as i64];
    if network {
        v.extend([libc::AF_INET as i64, libc::AF_INET6 as i64]);
    }
    v
}

/// One rule refusing `names` when argument `index` masked by `mask` equals `value`.
fn masked(names: &[&str], index: u32, mask: u64, value: u64) -> Value {
    json!({
        "names": names,
        "action": "SCMP_ACT_ERRNO",
        "errnoRet": EPERM,
        "args": [{ "index": index, "value": mask, "valueTwo": value, "op": "SCMP_CMP_MASKED_EQ" }],
    })
}

/// The profile for a sandbox with or without network, as Docker's
/// `seccomp=<json>` security option takes it.
pub fn profile(network: bool) -> Value {
    let mut rules = vec![
        json!({ "names": DENIED, "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM }),
        json!({ "names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": libc::ENOSYS as i64 }),
    ];
    // libseccomp takes one comparison per argument in a rule, so the
    // allow-list is written as one denial per other family (the kernel knows
    // fewer than 64).
    let allowed = allowed_families(network);
    for family in (0..64).filter(|f| !allowed.contains(f)) {
        rules.push(json!({
            "names": ["socket", "socketpair"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{ "index": 0, "value": family, "op": "SCMP_CMP_EQ" }],
        }));
    }
    rules.push(masked(&["socket"], 1, 0xf, libc::SOCK_RAW as u64));
    for flag in [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWCGROUP,
    ] {
        rules.push(masked(&["clone"], 0, flag as u64, flag as u64));
    }
    for bit in [libc::S_ISUID as u64, libc::S_ISGID as u64] {
        rules.push(masked(
            &["chmod", "fchmod", "creat", "mkdir", "mknod"],
            1,
            bit,
            bit,
        ));
        rules.push(masked(
            &["fchmodat", "fchmodat2", "mkdirat", "mknodat"],
            2,
            bit,
            bit,
        ));
    }
    for req in [libc::TIOCSTI, libc::TIOCLINUX] {
        rules.push(json!({
            "names": ["ioctl"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{ "index": 1, "value": req, "op": "SCMP_CMP_EQ" }],
        }));
    }
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
        "syscalls": rules,
    })
}

/// The `security_opt` entry carrying the profile.
pub fn security_opt(network: bool) -> String {
    format!("seccomp={}", profile(network))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vsock_is_refused_and_inet_only_with_network() {
        let off = profile(false).to_string();
        let denies = |p: &Value, fam: i64| {
            p["syscalls"].as_array().into_iter().flatten().any(|r| {
                r["names"]
                    .as_array()
                    .is_some_and(|n| n.iter().any(|x| x == "socket"))
                    && r["args"][0]["index"] == 0
                    && r["args"][0]["value"] == fam
            })
        };
        assert!(off.contains("SCMP_ACT_ALLOW"));
        let (p_off, p_on) = (profile(false), profile(true));
        assert!(denies(&p_off, libc::AF_VSOCK as i64));
        assert!(denies(&p_on, libc::AF_VSOCK as i64));
        assert!(denies(&p_off, libc::AF_INET as i64));
        assert!(!denies(&p_on, libc::AF_INET as i64));
        assert!(!denies(&p_off, libc::AF_UNIX as i64));
    }
}
