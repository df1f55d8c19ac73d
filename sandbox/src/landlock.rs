//! Landlock: what a sandbox may touch in the file system, which TCP ports it
//! may use, and (scopes) that it may signal only processes of its own tree and
//! reach abstract unix sockets only of its own tree.
//!
//! Rights: the workspace, tmp and berth's private dir get every file right
//! (truncate and device ioctls included); the system directories get read and
//! execute only, so truncating, ioctls on devices and writes fail there. Host
//! secrets ([`berth_policies::profile::SECRETS`]) never enter the read list: a
//! granted directory that holds one is granted child by child, without it.

use std::path::{Path, PathBuf};

use berth_policies::SandboxProfile;
use berth_policies::profile::is_secret;
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

use crate::error::{Error, Result};

/// The kernel's Landlock ABI version; 0 when Landlock is absent or disabled.
pub fn abi() -> i32 {
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
    i32::try_from(v.max(0)).unwrap_or(0)
}

fn abi_enum(abi: i32) -> ABI {
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

/// `paths` as Landlock grants, with every secret carved out: a path that holds
/// a secret below it is replaced by its children, recursively, minus the
/// secrets themselves and symlinks that lead to one.
///
/// A secret is one of [`SECRETS`](berth_policies::profile::SECRETS) by name,
/// and also, by default, anything below `/etc` that an ordinary user could
/// not read: a file not readable by others, a directory not searchable by
/// them (`/etc/docker/key.json`, a service's credentials). A root sandbox
/// would read those through its DAC override; no list of names keeps up.
pub fn without_secrets(paths: &[PathBuf]) -> Vec<PathBuf> {
    let private = private_below(Path::new(PRIVATE_ROOT));
    let mut out = Vec::new();
    for p in paths {
        carve(p, &mut out, 0, &private);
    }
    out
}

/// Where files an ordinary user cannot read are secrets by default.
const PRIVATE_ROOT: &str = "/etc";

/// How deep a grant is split to carve out a secret; a directory deeper than
/// this that still holds one is left out whole.
const CARVE_DEPTH: u32 = 6;

/// Every entry below `root` (not through symlinks) that others may not
/// read: files without `o+r`, directories without `o+rx` (not entered).
fn private_below(root: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![(root.to_path_buf(), 0u32)];
    while let Some((dir, depth)) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            let mode = m.permissions().mode();
            if m.is_dir() {
                if mode & 0o005 != 0o005 {
                    out.push(e.path());
                } else if depth < CARVE_DEPTH {
                    todo.push((e.path(), depth + 1));
                }
            } else if m.is_file() && mode & 0o004 == 0 {
                out.push(e.path());
            }
        }
    }
    out
}

fn secret(p: &Path, private: &[PathBuf]) -> bool {
    is_secret(p) || private.iter().any(|s| p.starts_with(s))
}

/// Whether a secret lies strictly below `dir` (`/etc/ssh` holds its host keys).
fn holds_secret(dir: &Path, private: &[PathBuf]) -> bool {
    let named = berth_policies::profile::SECRETS
        .iter()
        .map(Path::new)
        .chain(private.iter().map(PathBuf::as_path))
        .any(|s| s != dir && s.starts_with(dir));
    named || Path::new("/etc/ssh").starts_with(dir)
}

fn carve(p: &Path, out: &mut Vec<PathBuf>, depth: u32, private: &[PathBuf]) {
    if secret(p, private) {
        return;
    }
    // A symlink is granted as its target: judge the target.
    let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    if real != p && (secret(&real, private) || holds_secret(&real, private)) {
        return;
    }
    if !holds_secret(p, private) {
        if p.exists() {
            out.push(p.to_path_buf());
        }
        return;
    }
    if depth > CARVE_DEPTH {
        // Fail closed: too deep to carve, so none of it.
        return;
    }
    let Ok(entries) = std::fs::read_dir(p) else {
        return;
    };
    for e in entries.flatten() {
        carve(&e.path(), out, depth + 1, private);
    }
}

/// The write grants: the sandbox's own directories as they are (a real
/// directory, not a link to elsewhere), everything else with secrets carved out.
/// The paths the profile lets the sandbox write, secrets carved out.
pub fn write_grants(profile: &SandboxProfile) -> Vec<PathBuf> {
    let private = private_below(Path::new(PRIVATE_ROOT));
    let mut out = Vec::new();
    for p in &profile.read_write {
        let own = profile.own.contains(p)
            && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
            && std::fs::canonicalize(p).is_ok_and(|real| real == *p);
        if own {
            out.push(p.clone());
        } else {
            carve(p, &mut out, 0, &private);
        }
    }
    out
}

/// The paths the profile lets the sandbox read, secrets carved out.
pub fn read_grants(profile: &SandboxProfile) -> Vec<PathBuf> {
    without_secrets(&profile.read_exec)
}

/// Restrict the calling thread (and all it execs) to the profile, signals
/// and abstract unix sockets to its own tree where the kernel can scope them.
pub fn apply(profile: &SandboxProfile, abi_num: i32) -> Result<()> {
    let abi = abi_enum(abi_num);
    let ll =
        |e: landlock::RulesetError| Error::setup("Landlock", std::io::Error::other(e.to_string()));
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .map_err(ll)?;
    if !profile.network {
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(ll)?;
    }
    if abi_num >= 6 {
        ruleset = ruleset
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(ll)?;
    }
    let read = without_secrets(&profile.read_exec);
    let write = write_grants(profile);
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
        return Err(Error::Unsupported(format!(
            "Landlock enforced the ruleset only {:?}",
            status.ruleset
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn secrets_are_carved_out_of_etc() {
        let grants = without_secrets(&[PathBuf::from("/etc"), PathBuf::from("/usr")]);
        assert!(grants.contains(&PathBuf::from("/usr")));
        assert!(!grants.contains(&PathBuf::from("/etc")));
        assert!(!grants.contains(&PathBuf::from("/etc/ssh")));
        assert!(grants.contains(&PathBuf::from("/etc/passwd")));
        for g in &grants {
            assert!(!is_secret(g), "{} is a secret", g.display());
        }
        assert!(!grants.iter().any(|g| g.ends_with("shadow")));
        assert!(
            !grants
                .iter()
                .any(|g| g.starts_with("/etc/ssh") && g.to_string_lossy().ends_with("_key"))
        );
    }

    #[test]
    fn the_ruleset_reads_back_as_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let inside = dir.path().join("work");
        std::fs::create_dir_all(&inside).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        let r = crate::readback::in_child(
            "landlock::tests::the_ruleset_reads_back_as_enforced",
            || {
                let mut p =
                    berth_policies::LocalPolicy::default()
                        .profile("t", dir.path(), |p: &Path| p.exists());
                p.read_write = vec![inside.clone()];
                apply(&p, abi()).unwrap();
                let w = std::fs::write(inside.join("f"), "y").is_ok();
                let r = std::fs::read(&outside).is_ok();
                let shadow = std::fs::read("/etc/shadow").is_ok();
                let passwd = std::fs::read("/etc/passwd").is_ok();
                // SAFETY: kill with signal 0 only checks permission; pid 1 is the host's init.
                let sig = unsafe { libc::kill(1, 0) } == 0;
                format!(
                    "write_inside={w} read_outside={r} shadow={shadow} passwd={passwd} signal_init={sig}"
                )
            },
        );
        r.expect_line(
            "write_inside=true read_outside=false shadow=false passwd=true signal_init=false",
        );
    }
}
