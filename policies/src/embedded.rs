//! Commands embedded in other programs' options and variables: the strings a
//! program hands to a shell (or runs as a command line) besides its own work.
//! `git -c alias.x='!cmd'`, `tar --to-command=cmd`, `rsync -e cmd`, sed's `e`
//! command, `ssh host cmd`, `GIT_SSH_COMMAND=cmd`, and their kin.
//!
//! [`command_strings`] returns what can be read exactly; the reader parses
//! each string as shell code run by the command ([`crate::argv::shell_strings`]
//! feeds it), so every rule judges what is inside. [`opaque`] names the forms
//! that run code berth cannot read (sed's `s///e` of a computed line, a git
//! config value taken from the environment), which get the opaque verdict.

use crate::shell::quote_for_display;

/// Programs whose options can hold a command; see [`command_strings`].
pub const PROGRAMS: &[&str] = &[
    "ssh",
    "scp",
    "sftp",
    "git",
    "tar",
    "gtar",
    "rsync",
    "zip",
    "vim",
    "vi",
    "nvim",
    "view",
    "vimdiff",
    "ex",
    "gvim",
    "rvim",
    "parallel",
    "sed",
    "gsed",
    "man",
    "rg",
    "fd",
    "fdfind",
    "nix-shell",
    "npx",
    "npm",
    "hyperfine",
    "watchexec",
    "nodemon",
    "entr",
    "tmux",
    "screen",
    "cargo",
    "awk",
    "gawk",
    "mawk",
    "nawk",
    "apt",
    "apt-get",
    "apt-cache",
    "aptitude",
    "apt-mark",
];

/// What a variable assigned before (or exported to) a command makes programs
/// run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VarCode {
    /// The value is a shell command (`GIT_SSH_COMMAND`, `PAGER`, a bash
    /// function exported as `BASH_FUNC_f%%`).
    Shell,
    /// The value is a prompt: bash runs the substitutions in it (`PS4`).
    Prompt,
    /// The value names code that is loaded or run from somewhere berth does
    /// not read: a file (`BASH_ENV`, `ENV`, `PYTHONSTARTUP`), a library
    /// (`LD_PRELOAD`), options that load modules (`NODE_OPTIONS=--require`,
    /// `PERL5OPT`). Opaque.
    Loads,
}

/// Whether variable `name` holds code some program runs, and how.
pub fn variable_code(name: &str) -> Option<VarCode> {
    if name.starts_with("BASH_FUNC_") {
        return Some(VarCode::Shell);
    }
    // The dynamic loader's variables: each can put code into every program.
    if name.starts_with("LD_") {
        return Some(VarCode::Loads);
    }
    match name {
        "BASH_ENV"
        | "ENV"
        | "BASH_LOADABLES_PATH"
        | "NODE_OPTIONS"
        | "PYTHONSTARTUP"
        | "PYTHONINSPECT"
        | "PERL5OPT"
        | "PERL5DB"
        | "RUBYOPT"
        | "JAVA_TOOL_OPTIONS"
        | "_JAVA_OPTIONS"
        | "JDK_JAVA_OPTIONS"
        | "GCONV_PATH"
        | "APT_CONFIG"
        | "GIT_CONFIG_GLOBAL"
        | "GIT_CONFIG_SYSTEM"
        | "GIT_EXEC_PATH"
        | "GIT_TEMPLATE_DIR"
        | "INPUTRC"
        | "ZDOTDIR" => Some(VarCode::Loads),
        "PS0" | "PS1" | "PS2" | "PS3" | "PS4" => Some(VarCode::Prompt),
        "PROMPT_COMMAND"
        | "GIT_SSH_COMMAND"
        | "GIT_SSH"
        | "GIT_PAGER"
        | "GIT_EDITOR"
        | "GIT_SEQUENCE_EDITOR"
        | "GIT_EXTERNAL_DIFF"
        | "GIT_ASKPASS"
        | "GIT_PROXY_COMMAND"
        | "SSH_ASKPASS"
        | "SUDO_ASKPASS"
        | "PAGER"
        | "MANPAGER"
        | "SYSTEMD_PAGER"
        | "EDITOR"
        | "VISUAL"
        | "FCEDIT"
        | "RSYNC_RSH"
        | "CVS_RSH"
        | "LESSOPEN"
        | "LESSCLOSE"
        | "BROWSER" => Some(VarCode::Shell),
        _ => None,
    }
}

/// The shell code in the value of a [`VarCode::Shell`] variable.
pub fn variable_shell_code(name: &str, value: &str) -> String {
    if name.starts_with("BASH_FUNC_") {
        // `() { body; }`: the body runs when the function is called.
        return value.trim_start().trim_start_matches("()").to_string();
    }
    if name == "LESSOPEN" || name == "LESSCLOSE" {
        return value.trim_start_matches(['|', '-']).to_string();
    }
    value.to_string()
}

/// The commands `prog ARGS` runs besides itself, as shell text, where they
/// can be read exactly.
pub fn command_strings(prog: &str, args: &[String]) -> Vec<String> {
    match prog {
        "ssh" => ssh_options(args).into_iter().chain(ssh(args)).collect(),
        "scp" | "sftp" => ssh_options(args),
        "man" => value_of(args, &["-P", "--pager"]),
        "rg" => value_of(args, &["--pre"]),
        "nix-shell" => value_of(args, &["--run", "--command"]),
        // Only `npx -c` / `npm exec -c` before the command: later words are
        // the command's own.
        "npx" => value_of(leading_options(args), &["-c", "--call"]),
        "npm" if args.first().is_some_and(|a| a == "exec" || a == "x") => {
            value_of(leading_options(&args[1..]), &["-c", "--call"])
        }
        "nodemon" => value_of(args, &["-x", "--exec"]),
        "fd" | "fdfind" => {
            let at = args
                .iter()
                .position(|a| matches!(a.as_str(), "-x" | "--exec" | "-X" | "--exec-batch"));
            at.map(|k| {
                let cmd: Vec<String> = args[k + 1..]
                    .iter()
                    .take_while(|a| *a != ";")
                    .cloned()
                    .collect();
                quoted(&cmd)
            })
            .filter(|c| !c.is_empty())
            .into_iter()
            .collect()
        }
        "awk" | "gawk" | "mawk" | "nawk" => {
            awk_programs(args).iter().flat_map(|p| awk(p).0).collect()
        }
        "hyperfine" => hyperfine(args),
        "watchexec" => watchexec(args).into_iter().collect(),
        "entr" => entr(args).into_iter().collect(),
        "tmux" => tmux(args),
        "screen" => screen(args).into_iter().collect(),
        "cargo" if args.first().is_some_and(|a| a == "watch") => {
            let mut out = value_of(args, &["-s", "--shell"]);
            out.extend(
                value_of(args, &["-x", "--exec"])
                    .into_iter()
                    .map(|c| format!("cargo {c}")),
            );
            out
        }
        "git" => git(args).0,
        "tar" | "gtar" => tar(args),
        "rsync" => rsync(args),
        "zip" => zip(args),
        "vim" | "vi" | "nvim" | "view" | "vimdiff" | "ex" | "gvim" | "rvim" => vim(args).0,
        "parallel" => parallel(args).into_iter().collect(),
        "sed" | "gsed" => sed_scripts(args)
            .iter()
            .flat_map(|s| sed(s).commands)
            .collect(),
        "apt" | "apt-get" | "apt-cache" | "aptitude" | "apt-mark" => crate::apt::commands(args),
        _ => Vec::new(),
    }
}

/// Why `prog ARGS` runs code berth cannot read, if it does.
pub fn opaque(prog: &str, args: &[String]) -> Option<String> {
    match prog {
        "git" => git(args).1,
        "awk" | "gawk" | "mawk" | "nawk" => awk_programs(args).iter().find_map(|p| awk(p).1),
        "vim" | "vi" | "nvim" | "view" | "vimdiff" | "ex" | "gvim" => vim(args).1,
        "sed" | "gsed" => sed_scripts(args).iter().find_map(|s| sed(s).opaque),
        "make" | "gmake"
            if args
                .iter()
                .any(|a| a == "-E" || a.starts_with("--eval") || a.starts_with("-E")) =>
        {
            Some("`make --eval` runs recipes from inline makefile text".into())
        }
        "parallel" if parallel(args).is_none() => {
            Some("`parallel` with no command runs the command lines it reads".into())
        }
        _ => None,
    }
}

/// The values of options `names` (each given as `-X V`, `-XV` for a short
/// one, `--name V` or `--name=V`).
fn value_of(args: &[String], names: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        if a == "--" {
            break;
        }
        for n in names {
            if a == n {
                out.extend(args.get(i).cloned());
                i += 1;
                break;
            }
            let attached = if n.starts_with("--") {
                a.strip_prefix(n).and_then(|r| r.strip_prefix('='))
            } else {
                a.strip_prefix(n).filter(|r| !r.is_empty())
            };
            if let Some(v) = attached {
                out.push(v.to_string());
                break;
            }
        }
    }
    out
}

/// The options before the first operand, with the value of a `-c`/`--call`.
fn leading_options(args: &[String]) -> &[String] {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') || a == "--" {
            break;
        }
        i += if matches!(a.as_str(), "-c" | "--call" | "-p" | "--package") {
            2
        } else {
            1
        };
    }
    &args[..i.min(args.len())]
}

/// `ssh -o ProxyCommand=CMD` (and `LocalCommand`, `KnownHostsCommand`): a
/// command ssh runs on this machine; `RemoteCommand` runs on the host.
fn ssh_options(args: &[String]) -> Vec<String> {
    value_of(args, &["-o"])
        .into_iter()
        .filter_map(|kv| {
            let kv = kv.trim_start();
            let split = kv.find(['=', ' ', '\t'])?;
            let (k, v) = kv.split_at(split);
            let v = v.trim_start_matches(['=', ' ', '\t']);
            matches!(
                k.to_ascii_lowercase().as_str(),
                "proxycommand" | "localcommand" | "knownhostscommand" | "remotecommand"
            )
            .then(|| v.to_string())
        })
        .collect()
}

/// `hyperfine [options] CMD…`: each operand, and `--prepare`/`--setup`/
/// `--cleanup` values, is run by a shell.
fn hyperfine(args: &[String]) -> Vec<String> {
    const CODE: &[&str] = &["-p", "--prepare", "-s", "--setup", "-c", "--cleanup"];
    const VALUE: &[&str] = &[
        "-w",
        "--warmup",
        "-r",
        "--runs",
        "-m",
        "--min-runs",
        "-M",
        "--max-runs",
        "-S",
        "--shell",
        "-n",
        "--command-name",
        "-D",
        "--parameter-step-size",
        "--style",
        "-u",
        "--time-unit",
        "--output",
        "--input",
        "--sort",
        "--export-asciidoc",
        "--export-csv",
        "--export-json",
        "--export-markdown",
        "--export-orgmode",
        "--reference",
    ];
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        let opt = a.split_once('=').map_or(a.as_str(), |(o, _)| o);
        if CODE.contains(&opt) {
            match a.split_once('=') {
                Some((_, v)) => out.push(v.to_string()),
                None => {
                    out.extend(args.get(i).cloned());
                    i += 1;
                }
            }
        } else if matches!(opt, "-P" | "--parameter-scan") {
            i += 3;
        } else if matches!(opt, "-L" | "--parameter-list") {
            i += 2;
        } else if VALUE.contains(&opt) {
            i += usize::from(!a.contains('='));
        } else if !a.starts_with('-') {
            out.push(a.clone());
        }
    }
    out
}

/// `watchexec [options] [--] CMD…`: the command words, run by a shell.
fn watchexec(args: &[String]) -> Option<String> {
    const VALUE: &[&str] = &[
        "-e",
        "--exts",
        "-w",
        "--watch",
        "-W",
        "--watch-non-recursive",
        "-i",
        "--ignore",
        "-f",
        "--filter",
        "-s",
        "--signal",
        "--stop-signal",
        "--stop-timeout",
        "-d",
        "--debounce",
        "--delay-run",
        "--shell",
        "--project-origin",
        "--workdir",
        "-E",
        "--env",
        "-F",
        "--filter-file",
        "--ignore-file",
        "--on-busy-update",
        "-j",
        "--filter-prog",
        "--emit-events-to",
        "--poll",
        "--timings",
    ];
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') {
            break;
        }
        i += if !a.contains('=') && VALUE.contains(&a.as_str()) {
            2
        } else {
            1
        };
    }
    let rest = args.get(i..).unwrap_or(&[]);
    (!rest.is_empty()).then(|| rest.join(" "))
}

/// `entr [-acdnprz] CMD…` runs CMD; with `-s` its first operand is shell code.
fn entr(args: &[String]) -> Option<String> {
    let flags: Vec<&String> = args.iter().take_while(|a| a.starts_with('-')).collect();
    let rest = &args[flags.len()..];
    let shell = flags.iter().any(|f| f.contains('s'));
    match (shell, rest.first()) {
        (true, Some(code)) => Some(code.clone()),
        (false, Some(_)) => Some(quoted(rest)),
        _ => None,
    }
}

/// tmux commands that start a shell command (`new-session 'cmd'`,
/// `run-shell`, `if-shell`, `-c cmd`) or type one (`send-keys`).
fn tmux(args: &[String]) -> Vec<String> {
    const GLOBAL_VALUE: &[&str] = &["-L", "-S", "-f", "-T"];
    const VALUE: &[&str] = &[
        "-c", "-e", "-F", "-n", "-s", "-t", "-x", "-y", "-l", "-p", "-w",
    ];
    let mut out = value_of(
        &args[..args
            .iter()
            .position(|a| !a.starts_with('-'))
            .unwrap_or(args.len())],
        &["-c"],
    );
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') {
            break;
        }
        i += if GLOBAL_VALUE.contains(&a.as_str()) {
            2
        } else {
            1
        };
    }
    // Commands may be chained with `;`.
    let words = args.get(i..).unwrap_or(&[]);
    for cmd in words.split(|w| w == ";" || w == "\\;") {
        let Some(sub) = cmd.first().map(String::as_str) else {
            continue;
        };
        let rest = &cmd[1..];
        let mut k = 0;
        while let Some(a) = rest.get(k) {
            if !a.starts_with('-') || a == "-" {
                break;
            }
            let short_value = a.len() == 2
                && (VALUE.contains(&a.as_str())
                    || (matches!(sub, "send-keys" | "send") && a == "-N"));
            k += if short_value { 2 } else { 1 };
        }
        let operands = rest.get(k..).unwrap_or(&[]);
        match sub {
            "new-session" | "new" | "new-window" | "neww" | "split-window" | "splitw"
            | "respawn-pane" | "respawnp" | "respawn-window" | "respawnw" | "run-shell" | "run"
            | "display-popup" | "popup" | "pipe-pane" | "pipep"
                if !operands.is_empty() =>
            {
                out.push(operands.join(" "));
            }
            "if-shell" | "if" => out.extend(operands.first().cloned()),
            "send-keys" | "send" => {
                let typed: Vec<&str> = operands
                    .iter()
                    .map(String::as_str)
                    .filter(|w| !matches!(*w, "Enter" | "C-m" | "KPEnter" | "C-j"))
                    .collect();
                if !typed.is_empty() {
                    out.push(typed.join(" "));
                }
            }
            _ => {}
        }
    }
    out
}

/// `screen [options] CMD…` starts CMD in a new window.
fn screen(args: &[String]) -> Option<String> {
    const VALUE: &str = "ScehpsTtX";
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') {
            break;
        }
        i += 1;
        let letters = &a[1..];
        for (k, l) in letters.char_indices() {
            if VALUE.contains(l) {
                if l == 'X' {
                    // A command to a running session, not a program.
                    return None;
                }
                if k + 1 == letters.len() {
                    i += 1;
                }
                break;
            }
        }
    }
    let rest = args.get(i..).unwrap_or(&[]);
    (!rest.is_empty()).then(|| quoted(rest))
}

fn quoted(args: &[String]) -> String {
    args.iter()
        .map(|a| quote_for_display(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `ssh [options] DEST [COMMAND…]`: the remote shell runs COMMAND.
fn ssh(args: &[String]) -> Option<String> {
    const VALUE: &str = "BbcDEeFIiJLlmOoPpQRSWw";
    let mut i = 0;
    let mut dest = false;
    while let Some(a) = args.get(i) {
        if a == "--" {
            i += 1;
            if !dest {
                dest = true;
                i += 1;
            }
            break;
        }
        if a.starts_with('-') && a.len() > 1 {
            i += 1;
            for (k, l) in a.char_indices().skip(1) {
                if VALUE.contains(l) {
                    if k + 1 == a.len() {
                        i += 1;
                    }
                    break;
                }
            }
            continue;
        }
        if dest {
            break;
        }
        dest = true;
        i += 1;
    }
    let rest = args.get(i..).unwrap_or(&[]);
    (dest && !rest.is_empty()).then(|| rest.join(" "))
}

/// Git configuration keys whose values are commands git runs (lower case;
/// `*` is one dotted part).
const GIT_EXEC_KEYS: &[&str] = &[
    "core.sshcommand",
    "core.pager",
    "core.editor",
    "core.fsmonitor",
    "core.askpass",
    "core.gitproxy",
    "sequence.editor",
    "diff.external",
    "gpg.program",
    "gpg.*.program",
    "credential.helper",
    "credential.*.helper",
    "uploadpack.packobjectshook",
    "web.browser",
    "interactive.difffilter",
    "sendemail.tocmd",
    "sendemail.cccmd",
    "sendemail.headercmd",
    "sendemail.smtpserver",
    "pager.*",
    "diff.*.textconv",
    "diff.*.command",
    "filter.*.clean",
    "filter.*.smudge",
    "filter.*.process",
    "merge.*.driver",
    "mergetool.*.cmd",
    "difftool.*.cmd",
    "browser.*.cmd",
    "man.*.cmd",
    "remote.*.uploadpack",
    "remote.*.receivepack",
];

fn git_exec_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let parts: Vec<&str> = key.split('.').collect();
    GIT_EXEC_KEYS.iter().any(|k| {
        let want: Vec<&str> = k.split('.').collect();
        if want.len() == 3 && parts.len() >= 3 {
            // `section.<subsection>.name`: the subsection may hold dots.
            return want[0] == parts[0] && want[2] == parts[parts.len() - 1];
        }
        want.len() == parts.len() && want.iter().zip(&parts).all(|(w, p)| *w == "*" || w == p)
    })
}

/// The shell code a git configuration value makes git run, for key `key`
/// when the command's subcommand is `sub` with arguments `rest`.
fn git_value_code(key: &str, value: &str, sub: Option<&str>, rest: &[String]) -> Option<String> {
    let lower = key.to_ascii_lowercase();
    if let Some(name) = lower.strip_prefix("alias.") {
        let called = sub.is_some_and(|s| s.eq_ignore_ascii_case(name));
        let args = if called && !rest.is_empty() {
            format!(" {}", quoted(rest))
        } else {
            String::new()
        };
        return match value.strip_prefix('!') {
            // A shell alias: git runs it with the alias's arguments appended.
            Some(code) => Some(format!("{code}{args}")),
            // A git alias: `git VALUE ARGS`.
            None if called => Some(format!("git {value}{args}")),
            None => None,
        };
    }
    if !git_exec_key(&lower) {
        return None;
    }
    if lower.starts_with("credential.") {
        // `!cmd` is shell; a bare name is `git credential-NAME`.
        return value
            .strip_prefix('!')
            .map(str::to_string)
            .or_else(|| value.starts_with('/').then(|| value.to_string()));
    }
    Some(value.to_string())
}

/// Git's options before the subcommand that take a separate value.
const GIT_VALUE_OPTS: &[&str] = &[
    "-C",
    "-c",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--super-prefix",
    "--config-env",
    "--list-cmds",
];

/// Commands a git invocation runs (exactly read), and why it is opaque.
fn git(args: &[String]) -> (Vec<String>, Option<String>) {
    let mut configs: Vec<(String, String)> = Vec::new();
    let mut from_env: Option<String> = None;
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') {
            break;
        }
        let (opt, inline) = match a.split_once('=') {
            Some((o, v)) if o.starts_with("--") => (o, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let value = if GIT_VALUE_OPTS.contains(&opt) && inline.is_none() {
            i += 1;
            args.get(i).cloned()
        } else {
            inline
        };
        i += 1;
        match (opt, value) {
            ("-c", Some(kv)) => {
                let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), "true"));
                configs.push((k.to_string(), v.to_string()));
            }
            ("--config-env", Some(kv)) => {
                let key = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
                if key.to_ascii_lowercase().starts_with("alias.") || git_exec_key(key) {
                    from_env = Some(format!(
                        "`git --config-env` sets `{key}`, a command git runs, from a variable berth cannot see"
                    ));
                }
            }
            _ => {}
        }
    }
    let sub = args.get(i).map(String::as_str);
    let rest = args.get(i + 1..).unwrap_or(&[]);
    let mut out: Vec<String> = configs
        .iter()
        .filter_map(|(k, v)| git_value_code(k, v, sub, rest))
        .collect();
    match sub {
        Some("config") => out.extend(git_config(rest)),
        Some("submodule") if rest.first().is_some_and(|s| s == "foreach") => {
            let cmd: Vec<&String> = rest[1..]
                .iter()
                .skip_while(|a| a.starts_with('-'))
                .collect();
            if !cmd.is_empty() {
                out.push(cmd.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "));
            }
        }
        Some("bisect") if rest.first().is_some_and(|s| s == "run") && rest.len() > 1 => {
            out.push(quoted(&rest[1..]));
        }
        Some("rebase" | "filter-branch" | "difftool" | "send-email" | "grep") => {
            const STRING_OPTS: &[&str] = &[
                "-x",
                "--exec",
                "--env-filter",
                "--tree-filter",
                "--index-filter",
                "--parent-filter",
                "--msg-filter",
                "--commit-filter",
                "--tag-name-filter",
                "--extcmd",
                "--to-cmd",
                "--cc-cmd",
                "--header-cmd",
                "-O",
                "--open-files-in-pager",
            ];
            let mut k = 0;
            while let Some(a) = rest.get(k) {
                if let Some((o, v)) = a.split_once('=')
                    && STRING_OPTS.contains(&o)
                {
                    out.push(v.to_string());
                } else if STRING_OPTS.contains(&a.as_str()) {
                    if let Some(v) = rest.get(k + 1) {
                        out.push(v.clone());
                    }
                    k += 1;
                } else if let Some(v) = a.strip_prefix("-x").filter(|v| !v.is_empty()) {
                    out.push(v.to_string());
                }
                k += 1;
            }
        }
        _ => {}
    }
    (out, from_env)
}

/// Where git's subcommand sits in its arguments, after the global options.
fn git_subcommand_at(args: &[String]) -> usize {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') {
            break;
        }
        i += if GIT_VALUE_OPTS.contains(&a.as_str()) {
            2
        } else {
            1
        };
    }
    i
}

/// Configuration given to git through its environment: `GIT_CONFIG_COUNT`
/// with `GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`, and `GIT_CONFIG_PARAMETERS`
/// (`'key'='value' …`, shell-quoted). `vars` are the variables assigned for
/// a command; `git_args` the arguments of the `git` it runs, if any. Returns
/// the commands those settings make git run.
pub fn git_env_config(vars: &[(String, String)], git_args: Option<&[String]>) -> Vec<String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (name, value) in vars {
        if let Some(n) = name.strip_prefix("GIT_CONFIG_KEY_")
            && let Some((_, v)) = vars
                .iter()
                .find(|(k, _)| k.strip_prefix("GIT_CONFIG_VALUE_") == Some(n))
        {
            pairs.push((value.clone(), v.clone()));
        }
        if name == "GIT_CONFIG_PARAMETERS" {
            for kv in sq_words(value) {
                let (k, v) = kv.split_once('=').unwrap_or((kv.as_str(), "true"));
                pairs.push((k.to_string(), v.to_string()));
            }
        }
    }
    let (sub, rest) = match git_args {
        Some(args) => {
            let at = git_subcommand_at(args);
            (
                args.get(at).map(String::as_str),
                args.get(at + 1..).unwrap_or(&[]),
            )
        }
        None => (None, &[][..]),
    };
    pairs
        .iter()
        .filter_map(|(k, v)| git_value_code(k, v, sub, rest))
        .collect()
}

/// Words of text quoted the way git quotes `GIT_CONFIG_PARAMETERS`: single
/// quotes, backslash escapes outside them, blanks between words. Read
/// without the shell reader, so a value cannot nest readers in each other.
fn sq_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if !quoted => {
                cur.extend(chars.next());
                in_word = true;
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

/// `git config [options] [set] KEY VALUE`: a command-valued key being set.
fn git_config(args: &[String]) -> Option<String> {
    const VALUE_OPTS: &[&str] = &[
        "-f",
        "--file",
        "--blob",
        "--type",
        "--default",
        "--comment",
        "--value",
    ];
    const READS: &[&str] = &[
        "--get",
        "--get-all",
        "--get-regexp",
        "--get-urlmatch",
        "--unset",
        "--unset-all",
        "-l",
        "--list",
        "-e",
        "--edit",
        "--remove-section",
        "--rename-section",
    ];
    let mut operands: Vec<&String> = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if READS.contains(&a.as_str()) {
            return None;
        }
        if a.starts_with('-') {
            i += if VALUE_OPTS.contains(&a.as_str()) {
                2
            } else {
                1
            };
            continue;
        }
        operands.push(a);
        i += 1;
    }
    let operands: &[&String] = match operands.first().map(|s| s.as_str()) {
        Some("set") => &operands[1..],
        Some("get" | "unset" | "list" | "edit" | "rename-section" | "remove-section") => {
            return None;
        }
        _ => &operands,
    };
    let (key, value) = (operands.first()?, operands.get(1)?);
    git_value_code(key, value, None, &[]).or_else(|| {
        // A git alias (not `!`) set now runs as `git VALUE` when used.
        key.to_ascii_lowercase()
            .starts_with("alias.")
            .then(|| format!("git {value}"))
    })
}

/// `tar` options that run a command: `--checkpoint-action=exec=`,
/// `--to-command`, `--use-compress-program`/`-I`, `--info-script`/`-F`,
/// `--new-volume-script`, `--rsh-command`.
fn tar(args: &[String]) -> Vec<String> {
    // GNU tar accepts any unambiguous prefix of a long option.
    const LONG: &[(&str, &str)] = &[
        ("--to-command", "--to-c"),
        ("--use-compress-program", "--use-"),
        ("--info-script", "--inf"),
        ("--new-volume-script", "--new-"),
        ("--rsh-command", "--rsh"),
        ("--checkpoint-action", "--checkpoint-"),
    ];
    // Short options that take a value; `I` and `F` take a command.
    const SHORT_VALUE: &str = "fbCIFTXKNLVgH";
    let mut out = Vec::new();
    let push = |out: &mut Vec<String>, long: &str, v: &str| {
        if long == "--checkpoint-action" {
            if let Some(cmd) = v.strip_prefix("exec=") {
                out.push(cmd.to_string());
            }
        } else {
            out.push(v.to_string());
        }
    };
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        if a == "--" {
            break;
        }
        if let Some(body) = a.strip_prefix("--") {
            let (name, inline) = match body.split_once('=') {
                Some((n, v)) => (format!("--{n}"), Some(v)),
                None => (a.clone(), None),
            };
            let Some((long, _)) = LONG
                .iter()
                .find(|(long, min)| name.starts_with(min) && long.starts_with(name.as_str()))
            else {
                continue;
            };
            match inline {
                Some(v) => push(&mut out, long, v),
                None => {
                    if let Some(v) = args.get(i) {
                        push(&mut out, long, v);
                    }
                    i += 1;
                }
            }
            continue;
        }
        // `-xvIcmd`, `-cI cmd`, and the old style `cfI a.tar cmd` (the first
        // word without a dash: each letter that takes a value takes the next
        // word in turn).
        let old_style = i == 1 && !a.starts_with('-');
        let Some(letters) = a.strip_prefix('-').or(old_style.then_some(a.as_str())) else {
            continue;
        };
        for (k, l) in letters.char_indices() {
            if !SHORT_VALUE.contains(l) {
                continue;
            }
            let attached = &letters[k + l.len_utf8()..];
            let value = if !old_style && !attached.is_empty() {
                Some(attached.to_string())
            } else {
                let v = args.get(i).cloned();
                i += 1;
                v
            };
            if let Some(v) = value
                && matches!(l, 'I' | 'F')
            {
                out.push(v);
            }
            if !old_style {
                break;
            }
        }
    }
    out
}

/// `rsync -e CMD`, `--rsh=CMD`, `--rsync-path=CMD`.
fn rsync(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        if a == "--" {
            break;
        }
        if let Some(body) = a.strip_prefix("--") {
            let (name, inline) = body
                .split_once('=')
                .map_or((body, None), |(n, v)| (n, Some(v)));
            if matches!(name, "rsh" | "rsync-path") {
                match inline {
                    Some(v) => out.push(v.to_string()),
                    None => {
                        if let Some(v) = args.get(i) {
                            out.push(v.clone());
                        }
                        i += 1;
                    }
                }
            }
            continue;
        }
        let Some(letters) = a.strip_prefix('-') else {
            continue;
        };
        for (k, l) in letters.char_indices() {
            if "fBTM".contains(l) {
                break;
            }
            if l == 'e' {
                let attached = &letters[k + 1..];
                if attached.is_empty() {
                    if let Some(v) = args.get(i) {
                        out.push(v.clone());
                    }
                    i += 1;
                } else {
                    out.push(attached.to_string());
                }
                break;
            }
        }
    }
    out
}

/// `zip -TT CMD` / `--unzip-command CMD`: the command that tests the archive.
fn zip(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for (k, a) in args.iter().enumerate() {
        if a == "-TT" || a == "--unzip-command" {
            if let Some(v) = args.get(k + 1) {
                out.push(v.clone());
            }
        } else if let Some(v) = a.strip_prefix("--unzip-command=") {
            out.push(v.to_string());
        }
    }
    out
}

/// Vim's `-c CMD`, `--cmd CMD` and `+CMD`: an ex command `!cmd` runs a shell
/// command; other ex commands that reach a shell or a script are opaque.
fn vim(args: &[String]) -> (Vec<String>, Option<String>) {
    let mut out = Vec::new();
    let mut why = None;
    for (k, a) in args.iter().enumerate() {
        let ex = if a == "-c" || a == "--cmd" {
            args.get(k + 1).map(String::as_str)
        } else {
            a.strip_prefix('+')
        };
        let Some(ex) = ex else { continue };
        let ex = ex.trim_start_matches([':', ' ', '\t']);
        if let Some(cmd) = ex.strip_prefix('!') {
            out.push(cmd.to_string());
            continue;
        }
        let lower = ex.to_ascii_lowercase();
        const SHELLISH: &[&str] = &[
            "!", "system", "term", "sh", "py", "lua", "perl", "ruby", "tcl", "mz", "exe", "call",
            "so", "norm", "let", "au", "make", "grep", "r ", "w ",
        ];
        if !ex.chars().all(|c| c.is_ascii_digit() || c == '$')
            && SHELLISH.iter().any(|s| lower.contains(s))
        {
            why = Some(format!(
                "the editor command `{ex}` can run programs berth cannot read"
            ));
        }
    }
    (out, why)
}

/// GNU parallel's command template: its words before `:::`/`::::`.
fn parallel(args: &[String]) -> Option<String> {
    const VALUE: &[&str] = &[
        "-j",
        "-P",
        "-a",
        "-d",
        "-E",
        "-I",
        "-L",
        "-l",
        "-N",
        "-n",
        "-S",
        "-C",
        "--jobs",
        "--arg-file",
        "--delimiter",
        "--sshlogin",
        "--sshloginfile",
        "--colsep",
        "--joblog",
        "--results",
        "--tmpdir",
        "--workdir",
        "--wd",
        "--env",
        "--timeout",
        "--retries",
        "--delay",
        "--halt",
        "--memfree",
        "--load",
        "--nice",
        "--tagstring",
        "--tag-string",
        "--basefile",
        "--return",
        "--transferfile",
        "--ssh",
        "--max-args",
        "--max-replace-args",
        "--max-lines",
        "--replace",
    ];
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a.starts_with(":::") {
            break;
        }
        let opt = a.split_once('=').map_or(a.as_str(), |(o, _)| o);
        i += if !a.contains('=') && VALUE.contains(&opt) {
            2
        } else {
            1
        };
    }
    let words: Vec<&str> = args
        .get(i..)
        .unwrap_or(&[])
        .iter()
        .map(String::as_str)
        .take_while(|w| !w.starts_with(":::") && !w.starts_with("::::"))
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// The program texts of an awk command line: `-e`/`--source` values (gawk),
/// or the first operand when no `-f` file or `-e` is given.
fn awk_programs(args: &[String]) -> Vec<String> {
    const VALUE: &[&str] = &[
        "-F",
        "-v",
        "-f",
        "-i",
        "-l",
        "-E",
        "--field-separator",
        "--assign",
        "--file",
        "--include",
        "--load",
        "--exec",
    ];
    let mut programs = Vec::new();
    let mut file = false;
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        if a == "--" {
            break;
        }
        if !a.starts_with('-') || a == "-" {
            if programs.is_empty() && !file {
                programs.push(a.clone());
            }
            break;
        }
        let opt = a.split_once('=').map_or(a.as_str(), |(o, _)| o);
        let value = |i: &mut usize| -> Option<String> {
            match a.split_once('=') {
                Some((_, v)) if a.starts_with("--") => Some(v.to_string()),
                _ if opt.len() > 2 && !opt.starts_with("--") => Some(opt[2..].to_string()),
                _ => {
                    *i += 1;
                    args.get(*i - 1).cloned()
                }
            }
        };
        let short = if opt.starts_with("--") {
            opt
        } else {
            &opt[..2.min(opt.len())]
        };
        match short {
            "-e" | "--source" => programs.extend(value(&mut i)),
            "-f" | "--file" | "-E" | "--exec" => {
                file = true;
                value(&mut i);
            }
            o if VALUE.contains(&o) => {
                value(&mut i);
            }
            _ => {}
        }
    }
    if file && programs.is_empty() {
        return Vec::new();
    }
    if programs.is_empty() {
        programs.extend(args.get(i).cloned());
    }
    programs
}

/// What an awk program runs: the literal commands of `system("…")`,
/// `print … | "…"` and `"…" | getline`, and why it runs something else.
fn awk(program: &str) -> (Vec<String>, Option<String>) {
    #[derive(PartialEq)]
    enum Tok {
        Str(String),
        Word(String),
        Pipe,
        Punct(char),
    }
    let s: Vec<char> = program.chars().collect();
    let mut toks: Vec<Tok> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '#' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c.is_whitespace() || c == '\\' {
            i += 1;
            continue;
        }
        if c == '"' {
            let mut lit = String::new();
            i += 1;
            while i < s.len() && s[i] != '"' {
                if s[i] == '\\' && i + 1 < s.len() {
                    i += 1;
                    lit.push(match s[i] {
                        'n' => '\n',
                        't' => '\t',
                        o => o,
                    });
                } else {
                    lit.push(s[i]);
                }
                i += 1;
            }
            i += 1;
            toks.push(Tok::Str(lit));
            continue;
        }
        if c == '/' {
            // A regex where an operand is expected; division after one.
            let regex = match toks.last() {
                None | Some(Tok::Pipe) => true,
                Some(Tok::Punct(p)) => "(,~!{};&|=<>+-*%?:".contains(*p),
                Some(Tok::Word(w)) => matches!(w.as_str(), "if" | "while" | "return" | "in"),
                Some(Tok::Str(_)) => false,
            };
            if regex {
                i += 1;
                let mut class = false;
                while i < s.len() && (s[i] != '/' || class) {
                    match s[i] {
                        '\\' => i += 1,
                        '[' => class = true,
                        ']' => class = false,
                        _ => {}
                    }
                    i += 1;
                }
                i += 1;
                toks.push(Tok::Word("/regex/".into()));
                continue;
            }
        }
        if c.is_ascii_alphanumeric() || c == '_' || c == '$' {
            let start = i;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '_' || s[i] == '$') {
                i += 1;
            }
            toks.push(Tok::Word(s[start..i].iter().collect()));
            continue;
        }
        if c == '|' {
            if s.get(i + 1) == Some(&'|') {
                toks.push(Tok::Punct('|'));
                i += 2;
                continue;
            }
            toks.push(Tok::Pipe);
            i += if s.get(i + 1) == Some(&'&') { 2 } else { 1 };
            continue;
        }
        toks.push(Tok::Punct(c));
        i += 1;
    }
    let mut out = Vec::new();
    let mut why = None;
    let computed = || Some("awk runs a command line it builds when it runs".to_string());
    for (k, t) in toks.iter().enumerate() {
        match t {
            Tok::Word(w) if w == "system" => {
                match (toks.get(k + 1), toks.get(k + 2), toks.get(k + 3)) {
                    (Some(Tok::Punct('(')), Some(Tok::Str(cmd)), Some(Tok::Punct(')'))) => {
                        out.push(cmd.clone());
                    }
                    _ => why = why.or_else(computed),
                }
            }
            Tok::Pipe => match (toks.get(k + 1), k.checked_sub(1).and_then(|p| toks.get(p))) {
                (Some(Tok::Word(g)), Some(Tok::Str(cmd))) if g == "getline" => {
                    out.push(cmd.clone())
                }
                (Some(Tok::Word(g)), _) if g == "getline" => why = why.or_else(computed),
                (Some(Tok::Str(cmd)), _) => out.push(cmd.clone()),
                _ => why = why.or_else(computed),
            },
            _ => {}
        }
    }
    (out, why)
}

/// The scripts a sed command line runs: `-e S`, `--expression=S`, or the
/// first operand when neither is given.
fn sed_scripts(args: &[String]) -> Vec<String> {
    let mut scripts = Vec::new();
    let mut file = false;
    let mut first_operand = None;
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        if a == "--" {
            if first_operand.is_none() {
                first_operand = args.get(i).cloned();
            }
            break;
        }
        if let Some(s) = a.strip_prefix("--expression=") {
            scripts.push(s.to_string());
        } else if a == "--expression" {
            scripts.extend(args.get(i).cloned());
            i += 1;
        } else if a.starts_with("--file") {
            file = true;
            i += usize::from(!a.contains('='));
        } else if a == "-l" || a == "--line-length" {
            i += 1;
        } else if a.starts_with("--") {
        } else if let Some(letters) = a.strip_prefix('-').filter(|l| !l.is_empty()) {
            // `-ne SCRIPT`, `-es/a/b/`, `-i.bak` (the suffix is not a script).
            if letters.starts_with('i') {
                continue;
            }
            if let Some(k) = letters.find(['e', 'f', 'l']) {
                let attached = &letters[k + 1..];
                let value = if attached.is_empty() {
                    i += 1;
                    args.get(i - 1).cloned()
                } else {
                    Some(attached.to_string())
                };
                match &letters[k..k + 1] {
                    "e" => scripts.extend(value),
                    "f" => file = true,
                    _ => {}
                }
            }
        } else if first_operand.is_none() {
            first_operand = Some(a.clone());
        }
    }
    if scripts.is_empty() && !file {
        scripts.extend(first_operand);
    }
    scripts
}

/// What a sed script runs.
#[derive(Debug, Default)]
struct SedExec {
    /// `e COMMAND` commands, and `s/^.*$/COMMAND/e` whose line is exactly
    /// COMMAND.
    commands: Vec<String>,
    /// Why it runs something berth cannot read.
    opaque: Option<String>,
}

/// Read a GNU sed script far enough to find what it runs: the `e` command,
/// and the `e` flag of `s`.
fn sed(script: &str) -> SedExec {
    let s: Vec<char> = script.chars().collect();
    let mut out = SedExec::default();
    let mut i = 0;
    let to_eol = |i: &mut usize| -> String {
        let start = *i;
        while *i < s.len() && s[*i] != '\n' {
            // A backslash-newline continues a text argument.
            if s[*i] == '\\' && *i + 1 < s.len() {
                *i += 1;
            }
            *i += 1;
        }
        s[start..*i].iter().collect()
    };
    // The body of a delimited part (`/re/`, `s/a/b/`), with `\delim` unescaped.
    let delimited = |i: &mut usize, d: char| -> Option<String> {
        let mut part = String::new();
        while *i < s.len() {
            let c = s[*i];
            *i += 1;
            if c == '\\' && *i < s.len() {
                let n = s[*i];
                *i += 1;
                if n != d {
                    part.push('\\');
                }
                part.push(n);
                continue;
            }
            if c == d {
                return Some(part);
            }
            part.push(c);
        }
        None
    };
    let unreadable = |out: &mut SedExec| {
        out.opaque
            .get_or_insert_with(|| "sed runs a command line it builds from its input".into());
    };
    loop {
        while i < s.len() && (s[i].is_whitespace() || s[i] == ';' || s[i] == '}') {
            i += 1;
        }
        if i >= s.len() {
            break;
        }
        if s[i] == '#' {
            to_eol(&mut i);
            continue;
        }
        // Up to two addresses, then `!`.
        for n in 0..2 {
            if n == 1 {
                if i < s.len() && s[i] == ',' {
                    i += 1;
                } else {
                    break;
                }
            }
            match s.get(i) {
                Some(c) if c.is_ascii_digit() || matches!(c, '+' | '~') => {
                    while i < s.len() && (s[i].is_ascii_digit() || matches!(s[i], '+' | '~')) {
                        i += 1;
                    }
                }
                Some('$') => i += 1,
                Some('/') => {
                    i += 1;
                    delimited(&mut i, '/');
                }
                Some('\\') => {
                    let d = s.get(i + 1).copied().unwrap_or('/');
                    i += 2;
                    delimited(&mut i, d);
                }
                _ => {}
            }
            while i < s.len() && matches!(s[i], 'I' | 'M') {
                i += 1;
            }
        }
        while i < s.len() && (s[i] == ' ' || s[i] == '\t' || s[i] == '!') {
            i += 1;
        }
        let Some(&cmd) = s.get(i) else { break };
        i += 1;
        match cmd {
            '{' => {}
            ':' | 'b' | 't' | 'T' | 'v' => {
                while i < s.len() && !matches!(s[i], '\n' | ';' | '}') {
                    i += 1;
                }
            }
            'a' | 'i' | 'c' | 'r' | 'R' | 'w' | 'W' => {
                to_eol(&mut i);
            }
            'e' => {
                let line = to_eol(&mut i);
                let line = line.trim();
                if line.is_empty() {
                    out.opaque
                        .get_or_insert_with(|| "sed `e` runs each input line as a command".into());
                } else {
                    out.commands.push(line.to_string());
                }
            }
            'y' => {
                let Some(&d) = s.get(i) else { break };
                i += 1;
                delimited(&mut i, d);
                delimited(&mut i, d);
            }
            's' => {
                let Some(&d) = s.get(i) else { break };
                i += 1;
                let (Some(re), Some(rep)) = (delimited(&mut i, d), delimited(&mut i, d)) else {
                    // Not closed: sed refuses it, and it runs nothing.
                    break;
                };
                let mut flags = String::new();
                while i < s.len() && !matches!(s[i], '\n' | ';' | '}') {
                    if s[i] == 'w' {
                        to_eol(&mut i);
                        break;
                    }
                    flags.push(s[i]);
                    i += 1;
                }
                if flags.contains('e') {
                    // The line after the substitution runs: exactly the
                    // replacement when the regex takes the whole line and the
                    // replacement copies nothing from it.
                    let whole = matches!(re.as_str(), ".*" | "^.*" | "^.*$" | ".*$");
                    let copies = rep.contains('&')
                        || rep.char_indices().any(|(k, c)| {
                            c == '\\'
                                && rep[k + 1..]
                                    .starts_with(|n: char| n.is_ascii_digit() || n == 'n')
                        });
                    if whole && !copies {
                        out.commands.push(rep);
                    } else {
                        unreadable(&mut out);
                    }
                }
            }
            'q' | 'Q' | 'l' | 'L' => {
                while i < s.len() && (s[i].is_ascii_digit() || s[i] == ' ') {
                    i += 1;
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn sed_scripts_are_found() {
        assert_eq!(sed_scripts(&v(&["-n", "s/a/b/p", "f"])), v(&["s/a/b/p"]));
        assert_eq!(sed_scripts(&v(&["-ne", "e ls", "f"])), v(&["e ls"]));
        assert_eq!(sed_scripts(&v(&["-i.bak", "s/a/b/", "f"])), v(&["s/a/b/"]));
        assert_eq!(sed("1e ls -l\np").commands, v(&["ls -l"]));
        assert!(sed("s/x/y/e").opaque.is_some());
        assert!(sed("s/exec/run/g;/e/d").opaque.is_none());
    }

    #[test]
    fn git_exec_keys_match_subsections() {
        assert!(git_exec_key("diff.foo.bar.textconv"));
        assert!(git_exec_key("Core.SSHCommand"));
        assert!(!git_exec_key("user.name"));
    }
}
