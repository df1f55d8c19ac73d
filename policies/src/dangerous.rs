//! Named patterns for known-dangerous commands. Each looks at one simple command
//! (after wrappers are peeled off) in the context of the whole script, and says
//! why it matched.

use serde::{Deserialize, Serialize};

use crate::argv::{self, flags};
use crate::caution;
use crate::shell::Script;

/// A known-dangerous form a rule can name with `pattern = "…"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// `rm -r` of `/`, `~`, `$HOME` or a system directory, or `--no-preserve-root`.
    RmRecursiveRoot,
    /// Making a filesystem: `mkfs*`, `mke2fs`, `mkswap`.
    Mkfs,
    /// Writing to a device: `dd of=/dev/…`, `> /dev/sdX`, `tee`/`cp`/`shred` to a device.
    DeviceWrite,
    /// Running downloaded code: `curl … | sh`, `bash <(curl …)`, `sh -c "$(wget …)"`.
    PipeToShell,
    /// A function that calls itself in a pipe or in the background.
    ForkBomb,
    /// `chmod -R`/`chown -R` of `/`, `~` or a system directory.
    RecursivePermissionsRoot,
    /// `shutdown`, `reboot`, `halt`, `poweroff`, `init 0|6`, `systemctl reboot`, …
    Shutdown,
    /// `git reset --hard`, `git clean -f`, `git push --force` and their kin.
    GitDiscard,
    /// `rm -r` of anything.
    RmRecursive,
    /// `find … -delete` or `find … -exec rm`.
    FindDelete,
    /// `chmod -R` to a mode others can write (`777`, `o+w`).
    ChmodWorldWritable,
    /// Writing a file that grants access or runs at login: `/etc/*`,
    /// `~/.ssh/authorized_keys`, `~/.bashrc` and kin.
    SensitiveFileWrite,
    /// `kill … -1`, `killall5`, `pkill -u USER`: a signal to every process the
    /// user may signal (a built-in deny: on ssh it ends the account's session).
    KillAll,
    /// A request to a cloud metadata service (`169.254.169.254` and its spellings).
    MetadataEndpoint,
    /// SQL `DROP`, `DELETE` or `TRUNCATE` through a database client.
    SqlDestructive,
}

impl Pattern {
    /// Every pattern, for the built-in rules and for documentation.
    pub const ALL: &[Pattern] = &[
        Pattern::RmRecursiveRoot,
        Pattern::Mkfs,
        Pattern::DeviceWrite,
        Pattern::PipeToShell,
        Pattern::ForkBomb,
        Pattern::RecursivePermissionsRoot,
        Pattern::Shutdown,
        Pattern::KillAll,
    ];

    /// The `standard` profile's ask tier.
    pub const CAUTION: &[Pattern] = &[
        Pattern::GitDiscard,
        Pattern::RmRecursive,
        Pattern::FindDelete,
        Pattern::ChmodWorldWritable,
        Pattern::SensitiveFileWrite,
        Pattern::MetadataEndpoint,
        Pattern::SqlDestructive,
    ];

    /// The name used in policy files.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::GitDiscard => "git-discard",
            Pattern::RmRecursive => "rm-recursive",
            Pattern::FindDelete => "find-delete",
            Pattern::ChmodWorldWritable => "chmod-world-writable",
            Pattern::SensitiveFileWrite => "sensitive-file-write",
            Pattern::KillAll => "kill-all",
            Pattern::MetadataEndpoint => "metadata-endpoint",
            Pattern::SqlDestructive => "sql-destructive",
            Pattern::RmRecursiveRoot => "rm-recursive-root",
            Pattern::Mkfs => "mkfs",
            Pattern::DeviceWrite => "device-write",
            Pattern::PipeToShell => "pipe-to-shell",
            Pattern::ForkBomb => "fork-bomb",
            Pattern::RecursivePermissionsRoot => "recursive-permissions-root",
            Pattern::Shutdown => "shutdown",
        }
    }

    /// Whether command `idx` of `script` has this form; if so, why.
    pub fn check(self, script: &Script, idx: usize) -> Option<String> {
        let cmd = script.commands.get(idx)?;
        let inner = argv::inner(&cmd.argv);
        let prog = inner.first().map(String::as_str).unwrap_or("");
        let args = inner.get(1..).unwrap_or(&[]);
        match self {
            Pattern::RmRecursiveRoot => rm_root(prog, args),
            Pattern::Mkfs => (prog == "mkfs"
                || prog.starts_with("mkfs.")
                || matches!(prog, "mke2fs" | "mkswap" | "mkdosfs" | "mkntfs"))
            .then(|| format!("`{prog}` makes a filesystem, destroying what was there")),
            Pattern::DeviceWrite => device_write(prog, args, cmd),
            Pattern::PipeToShell => pipe_to_shell(script, idx, prog),
            Pattern::ForkBomb => {
                let f = cmd.function.as_deref()?;
                (prog == f && (cmd.background || script.is_piped(idx))).then(|| {
                    format!("function `{f}` starts copies of itself without bound (a fork bomb)")
                })
            }
            Pattern::RecursivePermissionsRoot => perms_root(prog, args),
            Pattern::GitDiscard => caution::git_discard(prog, args),
            Pattern::RmRecursive => caution::rm_recursive(prog, args),
            Pattern::FindDelete => caution::find_delete(prog, args),
            Pattern::ChmodWorldWritable => caution::chmod_world_writable(prog, args),
            Pattern::SensitiveFileWrite => caution::sensitive_write(prog, args, cmd),
            Pattern::KillAll => caution::kill_all(prog, args),
            Pattern::MetadataEndpoint => caution::metadata(prog, args, cmd),
            Pattern::SqlDestructive => caution::sql_destructive(script, idx, prog, args),
            Pattern::Shutdown => shutdown(prog, args),
        }
    }
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Pattern::ALL
            .iter()
            .chain(Pattern::CAUTION)
            .copied()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Pattern::ALL
                    .iter()
                    .chain(Pattern::CAUTION)
                    .map(|p| p.name())
                    .collect();
                format!(
                    "unknown pattern `{s}`; known patterns: {}",
                    names.join(", ")
                )
            })
    }
}

const SYSTEM_DIRS: &[&str] = &[
    "/",
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/media",
    "/mnt",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/srv",
    "/sys",
    "/usr",
    "/var",
    "/usr/bin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/local",
    "/usr/sbin",
    "/usr/share",
    "/usr/include",
    "/var/lib",
    "/var/log",
    "/etc/ssh",
];

/// Whether a path word names `/`, a home directory or a system directory (or all
/// of its entries, `dir/*`).
pub fn is_protected_target(w: &str) -> bool {
    let home_rest = if let Some(r) = w.strip_prefix("$HOME") {
        Some(r)
    } else if let Some(r) = w.strip_prefix("${HOME}") {
        Some(r)
    } else {
        // `~` or `~user`
        w.strip_prefix('~').map(|r| {
            r.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
    };
    if let Some(rest) = home_rest {
        return rest.chars().all(|c| matches!(c, '/' | '*' | '.'));
    }
    if !w.starts_with('/') {
        return false;
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in w.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    // `dir/*` and `dir/.*` empty the directory itself.
    while matches!(parts.last(), Some(&"*") | Some(&".*") | Some(&"{*,.*}")) {
        parts.pop();
    }
    let norm = format!("/{}", parts.join("/"));
    SYSTEM_DIRS.contains(&norm.as_str())
}

fn rm_root(prog: &str, args: &[String]) -> Option<String> {
    if prog != "rm" {
        return None;
    }
    let f = flags(args, &['r', 'R']);
    if f.no_preserve_root {
        return Some("`rm --no-preserve-root` removes the whole filesystem".into());
    }
    let target = f.operands.iter().find(|o| is_protected_target(o))?;
    f.recursive
        .then(|| format!("`rm -r {target}` deletes `/`, a home directory or a system directory"))
}

fn perms_root(prog: &str, args: &[String]) -> Option<String> {
    if !matches!(prog, "chmod" | "chown" | "chgrp") {
        return None;
    }
    let f = flags(args, &['R']);
    let target = f.operands.iter().skip(1).find(|o| is_protected_target(o))?;
    f.recursive.then(|| {
        format!("`{prog} -R … {target}` rewrites permissions of `/`, a home directory or a system directory")
    })
}

const SAFE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/stdin",
    "/dev/ptmx",
    "/dev/console",
];

fn is_device(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/dev/") else {
        return false;
    };
    !(SAFE_DEVICES.contains(&path)
        || rest.starts_with("fd/")
        || rest.starts_with("pts/")
        || rest.starts_with("shm/")
        || rest.starts_with("mqueue/")
        // bash pseudo-devices, not files
        || rest.starts_with("tcp/")
        || rest.starts_with("udp/"))
}

fn device_write(prog: &str, args: &[String], cmd: &crate::shell::Command) -> Option<String> {
    for r in &cmd.redirects {
        if r.op.contains('>') && is_device(&r.target) {
            return Some(format!(
                "`{}{}` writes straight to a device",
                r.op, r.target
            ));
        }
    }
    match prog {
        "dd" => args
            .iter()
            .filter_map(|a| a.strip_prefix("of="))
            .find(|t| is_device(t))
            .map(|t| format!("`dd of={t}` overwrites a device")),
        "tee" | "cp" | "shred" | "wipefs" | "blkdiscard" | "sgdisk" | "fdisk" | "sfdisk"
        | "parted" | "badblocks" => args
            .iter()
            .find(|a| is_device(a))
            .map(|t| format!("`{prog} … {t}` writes to a device")),
        _ => None,
    }
}

const FETCHERS: &[&str] = &[
    "curl",
    "wget",
    "fetch",
    "http",
    "https",
    "aria2c",
    "lwp-request",
    "GET",
];

fn pipe_to_shell(script: &Script, idx: usize, prog: &str) -> Option<String> {
    let is_shell = argv::SHELLS.contains(&prog) || matches!(prog, "eval" | "source" | ".");
    if !is_shell {
        return None;
    }
    let cmd = script.commands.get(idx)?;
    for (j, other) in script.commands.iter().enumerate() {
        // Cheap tests first: this runs for every shell in the text against
        // every other command. A fetcher can only feed this shell through a
        // pipeline they share, or sit inside it (nested commands are recorded
        // after their parent).
        let shares_pipe = other
            .pipes
            .iter()
            .any(|(p, _)| cmd.pipes.iter().any(|(q, _)| p == q));
        let may_be_inside = j > idx && other.parent.is_some();
        if j == idx
            || !(shares_pipe || may_be_inside)
            || !other
                .argv
                .iter()
                .any(|w| FETCHERS.contains(&argv::program_name(w)))
        {
            continue;
        }
        let p = argv::inner(&other.argv);
        let Some(fetcher) = p.first().filter(|p| FETCHERS.contains(&p.as_str())) else {
            continue;
        };
        if script.is_upstream(j, idx) {
            return Some(format!(
                "output of `{fetcher}` is piped into `{prog}`: it runs downloaded code"
            ));
        }
        if script.is_inside(j, idx) {
            return Some(format!("`{prog}` runs code fetched by `{fetcher}`"));
        }
    }
    None
}

fn shutdown(prog: &str, args: &[String]) -> Option<String> {
    let hit = match prog {
        "shutdown" | "reboot" | "halt" | "poweroff" => true,
        "init" | "telinit" => args.iter().any(|a| a == "0" || a == "6"),
        "systemctl" | "loginctl" => args.iter().any(|a| {
            matches!(
                a.as_str(),
                "poweroff" | "reboot" | "halt" | "kexec" | "soft-reboot"
            )
        }),
        _ => false,
    };
    hit.then(|| {
        let line: Vec<&str> = std::iter::once(prog)
            .chain(args.iter().map(String::as_str))
            .collect();
        format!("`{}` shuts the machine down or restarts it", line.join(" "))
    })
}
