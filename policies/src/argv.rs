//! What an argv really runs: wrapper programs (`env`, `sudo`, `nohup`, …) and
//! leading assignments are peeled off, program paths are reduced to their
//! names, and strings handed to a shell (`bash -c`, `eval`, …) are found.

/// A program word reduced to its name: `/usr/bin/rm` → `rm`.
pub fn program_name(w: &str) -> &str {
    w.rsplit('/').next().unwrap_or(w)
}

/// Shells whose `-c` string (or stdin) is code.
pub const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "yash", "posh", "busybox",
];

/// Each layer an argv runs through, outermost first, with leading assignments
/// dropped and the program reduced to its name. The last layer is the program
/// that really runs. Empty when the argv runs no program (only assignments).
pub fn views(argv: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut cur = normalize(argv);
    let mut guard = 0;
    while !cur.is_empty() && guard < 32 {
        guard += 1;
        let next = unwrap_once(&cur);
        out.push(cur);
        match next {
            Some(n) => cur = normalize(&n),
            None => break,
        }
    }
    out
}

/// The program that really runs, after all wrappers.
pub fn inner(argv: &[String]) -> Vec<String> {
    views(argv).pop().unwrap_or_default()
}

fn normalize(argv: &[String]) -> Vec<String> {
    let mut v: Vec<String> = argv
        .iter()
        .skip_while(|w| crate::shell::assignment(w).is_some())
        .cloned()
        .collect();
    if let Some(first) = v.first_mut() {
        *first = program_name(first).to_string();
    }
    v
}

/// Options that take a separate value, per wrapper.
fn takes_value(prog: &str, opt: &str) -> bool {
    let set: &[&str] = match prog {
        "sudo" => &[
            "-u", "-g", "-h", "-p", "-C", "-D", "-R", "-T", "-U", "-r", "-t", "--user", "--group",
            "--chdir", "--prompt",
        ],
        "doas" => &["-u", "-C"],
        "env" => &["-u", "--unset", "-C", "--chdir"],
        "exec" => &["-a"],
        "nice" => &["-n", "--adjustment"],
        "ionice" => &["-c", "-n", "-p", "-P", "-u", "--class", "--classdata"],
        "timeout" => &["-s", "-k", "--signal", "--kill-after"],
        "stdbuf" => &["-i", "-o", "-e", "--input", "--output", "--error"],
        "xargs" => &[
            "-I",
            "-L",
            "-n",
            "-P",
            "-d",
            "-E",
            "-s",
            "-a",
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-procs",
            "--max-lines",
            "--replace",
        ],
        "chrt" => &[
            "-T",
            "-P",
            "-D",
            "--sched-runtime",
            "--sched-period",
            "--sched-deadline",
        ],
        "taskset" => &[],
        "flock" => &["-w", "-E", "--timeout", "--conflict-exit-code"],
        "watch" => &["-n", "-d", "--interval"],
        "setpriv" => &[
            "--reuid",
            "--regid",
            "--ruid",
            "--rgid",
            "--euid",
            "--egid",
            "--groups",
            "--inh-caps",
            "--ambient-caps",
            "--bounding-set",
            "--securebits",
            "--pdeathsig",
            "--selinux-label",
            "--apparmor-profile",
            "--landlock-access",
            "--landlock-rule",
            "--seccomp-filter",
        ],
        "prlimit" => &["-p", "--pid", "-o", "--output"],
        "fakeroot" => &["-l", "--lib", "--faked", "-s", "-i", "-b"],
        "numactl" => &[
            "-i",
            "-p",
            "-m",
            "-N",
            "-C",
            "-P",
            "-w",
            "-b",
            "--interleave",
            "--preferred",
            "--preferred-many",
            "--membind",
            "--cpunodebind",
            "--physcpubind",
            "--weighted-interleave",
        ],
        "unshare" => &[
            "-S",
            "-G",
            "-R",
            "-w",
            "--setuid",
            "--setgid",
            "--root",
            "--wd",
            "--map-user",
            "--map-group",
            "--map-users",
            "--map-groups",
            "--setgroups",
            "--propagation",
            "--monotonic",
            "--boottime",
        ],
        "nsenter" => &["-t", "-S", "-G", "--target", "--setuid", "--setgid"],
        "strace" => &[
            "-a", "-b", "-e", "-E", "-I", "-o", "-O", "-p", "-P", "-s", "-S", "-u", "-U", "-X",
            "--output", "--attach", "--user",
        ],
        "ltrace" => &[
            "-a", "-A", "-D", "-e", "-F", "-l", "-n", "-o", "-p", "-s", "-u", "-x", "-w",
        ],
        "systemd-run" => &[
            "-p",
            "-u",
            "-E",
            "-M",
            "-H",
            "--property",
            "--unit",
            "--setenv",
            "--machine",
            "--host",
            "--description",
            "--slice",
            "--uid",
            "--gid",
            "--nice",
            "--working-directory",
        ],
        "runuser" => &[
            "-u",
            "-g",
            "-G",
            "-s",
            "-w",
            "--user",
            "--group",
            "--supp-group",
            "--shell",
        ],
        "faketime" => &["-p", "--date-prog"],
        "xvfb-run" => &[
            "-n",
            "-s",
            "-f",
            "-e",
            "-p",
            "-w",
            "--server-num",
            "--server-args",
            "--auth-file",
            "--error-file",
            "--xauth-protocol",
            "--wait",
        ],
        "perf" => &[
            "-e", "-o", "-p", "-t", "-C", "-r", "-x", "-G", "-F", "-c", "-m", "--event", "--output",
        ],
        "chroot" => &["--userspec", "--groups"],
        "time" => &["-f", "-o", "--format", "--output"],
        "pkexec" => &["--user"],
        "run0" => &[
            "-u",
            "-g",
            "-D",
            "--user",
            "--group",
            "--nice",
            "--chdir",
            "--setenv",
            "--property",
            "--unit",
            "--description",
            "--slice",
            "--machine",
            "--background",
        ],
        "cpulimit" => &["-l", "-p", "-e", "--limit", "--pid", "--exe"],
        "ssh-agent" => &["-a", "-E", "-t", "-P", "-O"],
        "sshpass" => &["-f", "-d", "-p", "-P"],
        "tini" => &["-p", "-e"],
        "dbus-launch" => &["--autolaunch", "--config-file"],
        // The dynamic loader, run directly (see [`is_loader`]).
        "ld.so" => &[
            "--library-path",
            "--preload",
            "--audit",
            "--argv0",
            "--inhibit-rpath",
            "--glibc-hwcaps-prepend",
            "--glibc-hwcaps-mask",
        ],
        _ => &[],
    };
    set.contains(&opt)
}

/// Programs that run the rest of their argv (after their own options and
/// operands) as a command: [`unwrap_once`] peels them off.
pub const WRAPPERS: &[&str] = &[
    "sudo",
    "doas",
    "env",
    "command",
    "builtin",
    "exec",
    "nohup",
    "time",
    "nice",
    "ionice",
    "stdbuf",
    "xargs",
    "setsid",
    "unbuffer",
    "flock",
    "timeout",
    "chronic",
    "caffeinate",
    "systemd-run",
    "runuser",
    "chroot",
    "taskset",
    "chrt",
    "busybox",
    "torsocks",
    "proxychains",
    "proxychains4",
    "setpriv",
    "prlimit",
    "fakeroot",
    "fakechroot",
    "numactl",
    "unshare",
    "nsenter",
    "strace",
    "ltrace",
    "valgrind",
    "firejail",
    "eatmydata",
    "catchsegv",
    "setarch",
    "linux32",
    "linux64",
    "i386",
    "x86_64",
    "faketime",
    "xvfb-run",
    "dbus-run-session",
    "perf",
    "capsh",
    "pkexec",
    "run0",
    "flatpak-spawn",
    "cpulimit",
    "ssh-agent",
    "dbus-launch",
    "sshpass",
    "gosu",
    "su-exec",
    "setuidgid",
    "tini",
    "dumb-init",
    "ifne",
];

/// Whether `name` is a dynamic loader (`ld-linux-x86-64.so.2`, `ld.so`,
/// `ld-musl-x86_64.so.1`, `ld64.so.2`): run directly, it runs the program
/// named in its arguments.
pub fn is_loader(name: &str) -> bool {
    name == "ld.so"
        || name.starts_with("ld-linux")
        || name.starts_with("ld64.so")
        || name.starts_with("ld-musl")
        || (name.starts_with("ld-") && name.contains(".so"))
}

/// If `argv` is a wrapper around another command, that command.
fn unwrap_once(argv: &[String]) -> Option<Vec<String>> {
    let prog = argv.first()?.as_str();
    let prog = if is_loader(prog) { "ld.so" } else { prog };
    let rest = &argv[1..];
    if !WRAPPERS.contains(&prog) && prog != "ld.so" {
        return runner(prog, rest);
    }
    if prog == "capsh" {
        // `capsh [options] -- ARGS` runs `bash ARGS` (or `--shell=PROG ARGS`).
        let dd = rest.iter().position(|a| a == "--")?;
        let shell = rest[..dd]
            .iter()
            .find_map(|a| a.strip_prefix("--shell="))
            .unwrap_or("bash");
        let mut inner = vec![shell.to_string()];
        inner.extend(rest[dd + 1..].iter().cloned());
        return Some(inner);
    }
    let mut i = 0;
    // Operands that come before the options.
    match prog {
        "setarch" => i += 1,
        "perf" => {
            // Only the subcommands that run a workload.
            if !rest
                .first()
                .is_some_and(|s| matches!(s.as_str(), "stat" | "record" | "trace"))
            {
                return None;
            }
            i += 1;
        }
        _ => {}
    }
    // Options.
    let mut named_user = false;
    while i < rest.len() {
        let a = rest[i].as_str();
        if a == "--" {
            i += 1;
            break;
        }
        // `env NAME=value` and `sudo NAME=value`: any word with `=` before the
        // command sets a variable, whatever its name (`BASH_FUNC_f%%=…`).
        if matches!(prog, "env" | "sudo" | "doas") && !a.starts_with('-') && a.contains('=') {
            i += 1;
            continue;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        // `env -S 'cmd args'` is found by shell_strings; stop here.
        if prog == "env"
            && (env_split_string(&rest[i..]).is_some() || a.starts_with("--split-string"))
        {
            return None;
        }
        if a.starts_with("--") {
            let opt = a.split_once('=').map(|(o, _)| o).unwrap_or(a);
            if opt == "--user" {
                named_user = true;
            }
            i += if a.contains('=') || !takes_value(prog, opt) {
                1
            } else {
                2
            };
            continue;
        }
        // A cluster of short options (`-Eu root`, `-n5`): the first letter that
        // takes a value takes the rest of the cluster, or the next word.
        i += 1;
        for (k, l) in a.char_indices().skip(1) {
            if takes_value(prog, &format!("-{l}")) {
                if l == 'u' {
                    named_user = true;
                }
                if k + l.len_utf8() == a.len() {
                    i += 1;
                }
                break;
            }
        }
    }
    // Positional operands that come before the command.
    match prog {
        "timeout" | "flock" | "chroot" | "faketime" | "gosu" | "su-exec" | "setuidgid" => i += 1,
        "nice" if rest.get(i).is_some_and(|a| a.parse::<i32>().is_ok()) => i += 1,
        "chrt" | "taskset" => {
            while rest.get(i).is_some_and(|a| {
                a.chars()
                    .all(|c| c.is_ascii_hexdigit() || c == ',' || c == '-' || c == 'x')
            }) {
                i += 1;
            }
        }
        // runuser USER [-c CMD] (the command form is found by shell_strings);
        // `runuser -u USER CMD` names the user as an option.
        "runuser" if !named_user => i += 1,
        _ => {}
    }
    let inner: Vec<String> = rest.get(i..)?.to_vec();
    if inner.is_empty() {
        return None;
    }
    if matches!(prog, "env" | "sudo" | "doas") && inner.iter().all(|w| w.contains('=')) {
        return None;
    }
    Some(inner)
}

/// Project and package runners whose subcommand runs the rest of the argv:
/// `uv run CMD`, `poetry run CMD`, `bundle exec CMD`, `npx CMD`,
/// `nix develop -c CMD`, `direnv exec DIR CMD`, and kin.
fn runner(prog: &str, rest: &[String]) -> Option<Vec<String>> {
    let sub = rest.first().map(String::as_str);
    let (skip, value_opts): (usize, &[&str]) = match (prog, sub) {
        ("uv", Some("run")) => (
            1,
            &[
                "--with",
                "--with-editable",
                "--with-requirements",
                "-p",
                "--python",
                "--package",
                "--extra",
                "--group",
                "--only-group",
                "--no-group",
                "--env-file",
                "--directory",
                "--project",
                "--index",
                "--default-index",
                "-i",
                "--index-url",
                "--extra-index-url",
                "-f",
                "--find-links",
                "--config-file",
                "--cache-dir",
            ],
        ),
        ("poetry" | "pipenv" | "pdm" | "rye", Some("run")) => {
            (1, &["-C", "--directory", "-P", "--project", "-p"])
        }
        ("hatch", Some("run")) => (1, &["-e", "--env"]),
        ("conda" | "mamba" | "micromamba", Some("run")) => {
            (1, &["-n", "--name", "-p", "--prefix", "--cwd"])
        }
        ("bundle", Some("exec")) => (1, &["--gemfile"]),
        ("direnv", Some("exec")) => (2, &[]),
        ("nix", Some("develop" | "shell")) => {
            // `nix develop [INSTALLABLE] -c CMD…`
            let c = rest.iter().position(|a| a == "-c" || a == "--command")?;
            let inner = rest.get(c + 1..)?.to_vec();
            return (!inner.is_empty()).then_some(inner);
        }
        ("npx" | "bunx" | "pnpx", _) => (0, &["-p", "--package", "--node-options"]),
        ("npm", Some("exec" | "x")) | ("pnpm" | "yarn", Some("exec" | "dlx")) => (
            1,
            &[
                "-p",
                "--package",
                "-w",
                "--workspace",
                "-C",
                "--dir",
                "--filter",
            ],
        ),
        ("toolbox", Some("run")) => (
            1,
            &["-c", "--container", "-d", "--distro", "-r", "--release"],
        ),
        // `distrobox enter NAME -- CMD`, `kubectl exec POD -- CMD`: the command
        // follows `--`.
        ("distrobox", Some("enter"))
        | ("distrobox-enter", _)
        | ("kubectl" | "oc", Some("exec")) => {
            let dd = rest.iter().position(|a| a == "--")?;
            let inner = rest.get(dd + 1..)?.to_vec();
            return (!inner.is_empty()).then_some(inner);
        }
        // `docker exec [OPTIONS] CONTAINER CMD…`
        ("docker" | "podman", Some("exec")) => {
            const VALUE: &[&str] = &[
                "-e",
                "--env",
                "-u",
                "--user",
                "-w",
                "--workdir",
                "--env-file",
                "--detach-keys",
            ];
            let mut i = 1;
            while let Some(a) = rest.get(i) {
                if !a.starts_with('-') {
                    break;
                }
                i += if !a.contains('=') && VALUE.contains(&a.as_str()) {
                    2
                } else {
                    1
                };
            }
            let inner = rest.get(i + 1..)?.to_vec();
            return (!inner.is_empty()).then_some(inner);
        }
        _ => return None,
    };
    let mut i = skip;
    while let Some(a) = rest.get(i) {
        if a == "--" {
            i += 1;
            break;
        }
        // `npx -c 'cmd'` runs a shell string: found by shell_strings.
        if matches!(a.as_str(), "-c" | "--call") && matches!(prog, "npx" | "npm" | "pnpx") {
            return None;
        }
        if !a.starts_with('-') {
            break;
        }
        i += if !a.contains('=') && value_opts.contains(&a.as_str()) {
            2
        } else {
            1
        };
    }
    let inner = rest.get(i..)?.to_vec();
    (!inner.is_empty()).then_some(inner)
}

/// Strings that `argv` (at any wrapper layer) runs as shell code.
pub fn shell_strings(argv: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for view in views(argv) {
        let Some(prog) = view.first().map(String::as_str) else {
            continue;
        };
        let args = &view[1..];
        match prog {
            p if SHELLS.contains(&p) => {
                let args = if p == "busybox" {
                    match args.first().map(String::as_str) {
                        Some(s) if SHELLS.contains(&s) => &args[1..],
                        _ => continue,
                    }
                } else {
                    args
                };
                if let Some(code) = dash_c(args) {
                    out.push(code);
                }
            }
            "eval" => out.push(args.join(" ")),
            "su" | "runuser" => {
                if let Some(k) = args.iter().position(|a| a == "-c" || a == "--command") {
                    if let Some(code) = args.get(k + 1) {
                        out.push(code.clone());
                    }
                } else if let Some(code) = args.iter().find_map(|a| a.strip_prefix("--command=")) {
                    out.push(code.to_string());
                }
            }
            "env" => {
                if let Some(code) = env_split_string(args) {
                    out.push(code);
                } else if let Some(k) = args.iter().position(|a| a == "--split-string") {
                    out.push(args[k + 1..].join(" "));
                } else if let Some(s) = args.iter().position(|a| a.starts_with("--split-string=")) {
                    let first = args[s].trim_start_matches("--split-string=").to_string();
                    let mut parts = vec![first];
                    parts.extend(args[s + 1..].iter().cloned());
                    out.push(parts.join(" "));
                }
            }
            "alias" => {
                for a in args {
                    if let Some((_, v)) = a.split_once('=') {
                        out.push(v.to_string());
                    }
                }
            }
            "trap" => {
                if let Some(code) = args.first() {
                    out.push(code.clone());
                }
            }
            // These hand a string to `sh -c`.
            "script" | "flock" => {
                let dash_c = |a: &String| {
                    a == "--command"
                        || (a.starts_with('-') && !a.starts_with("--") && a.ends_with('c'))
                };
                if let Some(k) = args.iter().position(dash_c) {
                    if let Some(code) = args.get(k + 1) {
                        out.push(code.clone());
                    }
                } else if let Some(code) = args.iter().find_map(|a| a.strip_prefix("--command=")) {
                    out.push(code.to_string());
                }
            }
            "sg" => {
                // `sg GROUP [-c] COMMAND`: the command is given to `/bin/sh -c`.
                let words: Vec<&String> = args.iter().skip(1).filter(|a| *a != "-c").collect();
                if !words.is_empty() && !args.is_empty() {
                    out.push(
                        words
                            .iter()
                            .map(|w| w.as_str())
                            .collect::<Vec<_>>()
                            .join(" "),
                    );
                }
            }
            "watch" => {
                let mut i = 0;
                while let Some(a) = args.get(i) {
                    if !a.starts_with('-') {
                        break;
                    }
                    i += if !a.contains('=') && takes_value("watch", a) {
                        2
                    } else {
                        1
                    };
                }
                if let Some(rest) = args.get(i..).filter(|r| !r.is_empty()) {
                    out.push(rest.join(" "));
                }
            }
            _ => {}
        }
    }
    out
}

/// Commands that `argv` (at any wrapper layer) runs from its options
/// (`git -c alias.x='!cmd'`, `tar --to-command=cmd`, `ssh host cmd`, …; see
/// [`crate::embedded`]).
pub fn embedded_strings(argv: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for view in views(argv) {
        if let Some(p) = view.first().map(String::as_str)
            && crate::embedded::PROGRAMS.contains(&p)
        {
            out.extend(crate::embedded::command_strings(p, &view[1..]));
        }
    }
    out
}

/// The string `env -S` splits into a command (with the words after it), when
/// one of `env`'s leading short-option clusters holds `S`: `-S 'cmd'`,
/// `-iS'cmd'`, `-S'cmd' more`.
pub fn env_split_string(args: &[String]) -> Option<String> {
    let mut k = 0;
    while let Some(a) = args.get(k) {
        if a == "--" || !a.starts_with('-') || a.starts_with("--") || a == "-" {
            return None;
        }
        let mut skip_next = false;
        for (j, l) in a.char_indices().skip(1) {
            match l {
                'S' => {
                    let inline = &a[j + 1..];
                    let (first, next) = if inline.is_empty() {
                        (args.get(k + 1)?.as_str(), k + 2)
                    } else {
                        (inline, k + 1)
                    };
                    let mut parts = vec![first];
                    parts.extend(args.get(next..).unwrap_or(&[]).iter().map(String::as_str));
                    return Some(parts.join(" "));
                }
                // Options that take the rest of the cluster or the next word.
                'u' | 'C' => {
                    skip_next = j + 1 == a.len();
                    break;
                }
                _ => {}
            }
        }
        k += if skip_next { 2 } else { 1 };
    }
    None
}

/// Whether `argv` is a shell that reads its script from stdin (`sh`, `bash -s`,
/// `sudo bash -e`): no `-c` string and no script file operand.
pub fn reads_code_from_stdin(argv: &[String]) -> bool {
    let inner = inner(argv);
    let Some(prog) = inner.first().map(String::as_str) else {
        return false;
    };
    let args = &inner[1..];
    if matches!(prog, "at" | "batch") {
        // They queue the commands they read, for `sh` to run later.
        return !args
            .iter()
            .any(|a| a.starts_with("-f") || a == "-l" || a == "-d" || a == "-r" || a == "-c");
    }
    let args = if prog == "busybox" {
        match args.first().map(String::as_str) {
            Some(s) if SHELLS.contains(&s) => &args[1..],
            _ => return false,
        }
    } else if SHELLS.contains(&prog) {
        args
    } else {
        return false;
    };
    if dash_c(args).is_some() {
        return false;
    }
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "-s" {
            return true;
        }
        if a == "-o" || a == "+o" || a == "-O" || a == "+O" {
            i += 2;
            continue;
        }
        if a.starts_with('-') || a.starts_with('+') {
            i += 1;
            continue;
        }
        return false;
    }
    true
}

/// The code string of a shell invoked with `-c`, if any.
fn dash_c(args: &[String]) -> Option<String> {
    let mut has_c = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--" {
            i += 1;
            break;
        }
        if a == "-o" || a == "+o" || a == "-O" || a == "+O" || a == "--rcfile" || a == "--init-file"
        {
            i += 2;
            continue;
        }
        if a.starts_with("--") {
            i += 1;
            continue;
        }
        if (a.starts_with('-') || a.starts_with('+')) && a.len() > 1 {
            if a[1..].contains('c') {
                has_c = true;
            }
            i += 1;
            continue;
        }
        break;
    }
    if has_c { args.get(i).cloned() } else { None }
}

/// Commands that `find … -exec CMD … ;` (and friends) run.
pub fn exec_payloads(argv: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let inner = inner(argv);
    if inner.first().map(String::as_str) != Some("find") {
        return out;
    }
    let mut i = 1;
    while i < inner.len() {
        if matches!(inner[i].as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
            let start = i + 1;
            let mut end = start;
            while end < inner.len() && inner[end] != ";" && inner[end] != "+" {
                end += 1;
            }
            if end > start {
                out.push(inner[start..end].to_vec());
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    out
}

/// The options of an `rm`/`chmod`-like command that matter to a rule: whether
/// it recurses (a short flag among `recursive_letters`, or `--recursive`),
/// `--no-preserve-root`, and its operands (everything after `--` too).
pub(crate) struct Flags {
    pub(crate) recursive: bool,
    pub(crate) no_preserve_root: bool,
    pub(crate) operands: Vec<String>,
}

pub(crate) fn flags(args: &[String], recursive_letters: &[char]) -> Flags {
    let mut f = Flags {
        recursive: false,
        no_preserve_root: false,
        operands: Vec::new(),
    };
    let mut after_dashdash = false;
    for a in args {
        if after_dashdash {
            f.operands.push(a.clone());
        } else if a == "--" {
            after_dashdash = true;
        } else if let Some(long) = a.strip_prefix("--") {
            match long {
                "recursive" => f.recursive = true,
                "no-preserve-root" => f.no_preserve_root = true,
                _ => {}
            }
        } else if a.starts_with('-') && a.len() > 1 {
            if a[1..].chars().any(|c| recursive_letters.contains(&c)) {
                f.recursive = true;
            }
        } else {
            f.operands.push(a.clone());
        }
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn peels_wrappers() {
        assert_eq!(
            inner(&v("sudo -u root env FOO=1 nohup /bin/rm -rf /")),
            v("rm -rf /")
        );
        assert_eq!(inner(&v("A=1 B=2 command -p rm x")), v("rm x"));
        assert_eq!(
            inner(&v("timeout -s KILL 10 nice -n 5 dd if=x")),
            v("dd if=x")
        );
        assert_eq!(inner(&v("xargs -0 -I {} rm -rf")), v("rm -rf"));
        assert_eq!(inner(&v("env -i -u X ls")), v("ls"));
        assert_eq!(
            inner(&v("exec -a foo /usr/sbin/mkfs.ext4 /dev/sda")),
            v("mkfs.ext4 /dev/sda")
        );
        assert_eq!(views(&v("X=1")).len(), 0);
    }

    #[test]
    fn finds_shell_strings() {
        let a = vec!["bash".to_string(), "-lc".into(), "rm -rf /".into()];
        assert_eq!(shell_strings(&a), vec!["rm -rf /".to_string()]);
        let a = vec![
            "sudo".to_string(),
            "sh".into(),
            "-e".into(),
            "-c".into(),
            "x".into(),
        ];
        assert_eq!(shell_strings(&a), vec!["x".to_string()]);
        assert!(shell_strings(&v("bash script.sh -c")).is_empty());
        assert_eq!(
            shell_strings(&v("eval rm -rf /")),
            vec!["rm -rf /".to_string()]
        );
        assert_eq!(
            exec_payloads(&v("find / -exec rm -rf {} ;")),
            vec![v("rm -rf {}")]
        );
    }
}
