//! The `standard` profile's ask tier: commands that destroy or expose things
//! but have legitimate uses, so a person says yes to each one. Each function
//! looks at one command (after wrappers) and says why it matched.

use crate::argv::flags;
use crate::shell::{Command, Script};

/// Git's options that come before the subcommand and take a value.
const GIT_VALUE_OPTS: &[&str] = &[
    "-C",
    "-c",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--exec-path",
    "--super-prefix",
    "--config-env",
];

fn short_cluster_has(a: &str, letter: char) -> bool {
    a.starts_with('-') && !a.starts_with("--") && a[1..].contains(letter)
}

/// `git reset --hard`, `git clean -f`, `git push --force` and kin.
pub fn git_discard(prog: &str, args: &[String]) -> Option<String> {
    if prog != "git" {
        return None;
    }
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
    let sub = args.get(i)?.as_str();
    let rest = &args[i + 1..];
    let any = |f: &dyn Fn(&str) -> bool| rest.iter().any(|a| f(a));
    let why = match sub {
        "reset" if any(&|a| a == "--hard" || a == "--merge") => {
            "`git reset --hard` throws away uncommitted work"
        }
        "clean" if any(&|a| a == "--force" || short_cluster_has(a, 'f')) => {
            "`git clean -f` deletes untracked files"
        }
        "push"
            if any(&|a| {
                a == "--force"
                    || a.starts_with("--force-with-lease")
                    || a == "--force-if-includes"
                    || a == "--mirror"
                    || a == "--delete"
                    || a == "--prune"
                    || short_cluster_has(a, 'f')
                    || short_cluster_has(a, 'd')
                    || (a.starts_with('+') && a.len() > 1)
                    || (a.starts_with(':') && a.len() > 1)
            }) =>
        {
            "a forced or deleting `git push` rewrites or removes shared history"
        }
        "checkout" | "switch"
            if any(&|a| a == "--force" || a == "-f" || a == "--discard-changes") =>
        {
            "a forced checkout throws away uncommitted work"
        }
        "branch"
            if any(&|a| {
                a == "-D" || (a.starts_with('-') && !a.starts_with("--") && a.contains('D'))
            }) =>
        {
            "`git branch -D` deletes a branch whether merged or not"
        }
        "stash" if rest.first().is_some_and(|a| a == "clear" || a == "drop") => {
            "it deletes stashed work"
        }
        _ => return None,
    };
    Some(why.to_string())
}

/// `rm -r` of anything.
pub fn rm_recursive(prog: &str, args: &[String]) -> Option<String> {
    if prog != "rm" {
        return None;
    }
    let f = flags(args, &['r', 'R']);
    f.recursive
        .then(|| format!("`rm -r {}` deletes a directory tree", f.operands.join(" ")))
}

/// `find … -delete`, or `find … -exec rm …`.
pub fn find_delete(prog: &str, args: &[String]) -> Option<String> {
    if prog != "find" {
        return None;
    }
    for (k, a) in args.iter().enumerate() {
        if a == "-delete" {
            return Some("`find -delete` deletes every file it matches".into());
        }
        if matches!(a.as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
            let next = args.get(k + 1).map(|p| crate::argv::program_name(p));
            if matches!(next, Some("rm" | "unlink" | "shred" | "rmdir")) {
                return Some("`find -exec rm` deletes every file it matches".into());
            }
        }
    }
    None
}

/// `chmod -R` to a mode that lets others write.
pub fn chmod_world_writable(prog: &str, args: &[String]) -> Option<String> {
    if prog != "chmod" {
        return None;
    }
    let f = flags(args, &['R']);
    let mode = f.operands.first()?;
    let world = if mode.chars().all(|c| c.is_ascii_digit()) {
        mode.chars()
            .last()
            .and_then(|c| c.to_digit(8))
            .is_some_and(|d| d & 2 != 0)
    } else {
        mode.split(',').any(|clause| {
            let who: String = clause.chars().take_while(|c| "ugoa".contains(*c)).collect();
            let rest = &clause[who.len()..];
            (who.contains('o') || who.contains('a'))
                && (rest.starts_with('+') || rest.starts_with('='))
                && rest.contains('w')
        })
    };
    (f.recursive && world)
        .then(|| format!("`chmod -R {mode}` lets every user write the whole tree"))
}

/// File names that grant access or run code at login wherever they are.
const SENSITIVE_NAMES: &[&str] = &[
    "authorized_keys",
    "authorized_keys2",
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zprofile",
    ".zshenv",
    ".zlogin",
    ".gitconfig",
    ".pam_environment",
    ".xinitrc",
    ".xprofile",
    "config.fish",
];

/// Whether writing `path` changes who may log in or what runs at login.
pub fn is_sensitive_path(path: &str) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    if SENSITIVE_NAMES.contains(&base) {
        return true;
    }
    let normal = normalize(path);
    normal == "/etc"
        || normal.starts_with("/etc/")
        || normal.starts_with("/var/spool/cron")
        || path.contains("/.ssh/")
        || path.starts_with(".ssh/")
        || path.ends_with("/.ssh")
        || path.contains("/.config/systemd/")
        || path.contains("/.config/autostart")
}

/// `/a/./b/../c` → `/a/c` for absolute paths; others unchanged.
fn normalize(path: &str) -> String {
    if !path.starts_with('/') {
        return path.to_string();
    }
    let mut parts: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Programs that write or remove the files they are given.
const FILE_WRITERS: &[&str] = &[
    "tee", "cp", "mv", "install", "ln", "rsync", "scp", "truncate", "touch", "rm", "shred",
    "unlink", "chmod", "chown", "chgrp", "chattr", "setfacl", "sponge", "patch", "ed", "ex", "vi",
    "vim", "nvim", "nano", "emacs",
];

/// Writing `/etc/*`, `~/.ssh/*`, shell start-up files, crontabs, users.
pub fn sensitive_write(prog: &str, args: &[String], cmd: &Command) -> Option<String> {
    for r in &cmd.redirects {
        if (r.op.contains('>') || r.op == "<>") && is_sensitive_path(&r.target) {
            return Some(format!(
                "`{}{}` writes a system or login file",
                r.op, r.target
            ));
        }
    }
    if matches!(
        prog,
        "useradd"
            | "usermod"
            | "userdel"
            | "groupadd"
            | "groupmod"
            | "passwd"
            | "chpasswd"
            | "visudo"
            | "vipw"
            | "vigr"
            | "adduser"
            | "deluser"
    ) {
        return Some(format!("`{prog}` changes users, groups or sudo rights"));
    }
    if prog == "crontab" && !args.iter().any(|a| a == "-l") {
        return Some("`crontab` installs commands that run on a schedule".into());
    }
    let in_place = matches!(prog, "sed" | "perl")
        && args
            .iter()
            .any(|a| a.starts_with("-i") || a == "--in-place");
    let operands: Vec<&String> = if prog == "dd" {
        return args
            .iter()
            .filter_map(|a| a.strip_prefix("of="))
            .find(|t| is_sensitive_path(t))
            .map(|t| format!("`dd of={t}` writes a system or login file"));
    } else if FILE_WRITERS.contains(&prog) || in_place {
        args.iter().filter(|a| !a.starts_with('-')).collect()
    } else {
        return None;
    };
    operands
        .into_iter()
        .find(|t| is_sensitive_path(t))
        .map(|t| format!("`{prog} … {t}` writes a system or login file"))
}

/// Whether a pid operand of `kill` is `-1` (in any spelling the shell's and
/// procps' `kill` parse the same way: `-1`, `-01`, `-0001`).
fn is_every_process(operand: &str) -> bool {
    operand.parse::<i64>() == Ok(-1)
}

/// Whether a process-name pattern (a regular expression for `pkill` and
/// `killall -r`) matches every name: empty, or made only of `.*+?^$()|`.
fn matches_every_name(pattern: &str) -> bool {
    pattern.chars().all(|c| ".*+?^$()|".contains(c)) && !pattern.contains("$^")
}

/// `kill … -1`, `killall5`, `pkill -u USER` and kin: a signal to every process
/// the user may signal (on an ssh backend, every process of the account).
pub fn kill_all(prog: &str, args: &[String]) -> Option<String> {
    const EVERY: &str = "signals every process the user may signal";
    match prog {
        "killall5" => Some(format!("`killall5` {EVERY}")),
        "kill" => {
            let mut i = 0;
            let mut operands: Vec<&String> = Vec::new();
            while let Some(a) = args.get(i) {
                match a.as_str() {
                    "-l" | "-L" | "--list" | "--table" => return None,
                    "-s" | "-n" | "--signal" | "-q" | "--queue" => i += 2,
                    "--timeout" => i += 3,
                    "--" => {
                        operands.extend(args[i + 1..].iter());
                        break;
                    }
                    // The first word is the signal when more words follow
                    // (`kill -1 1234` sends SIGHUP to 1234).
                    a if i == 0 && a.starts_with('-') && args.len() > 1 => i += 1,
                    a if a.starts_with("-s") || a.starts_with("--") => i += 1,
                    _ => {
                        operands.push(&args[i]);
                        i += 1;
                    }
                }
            }
            // `kill -1` alone: procps and util-linux read it as the pid -1.
            let lone = args.len() == 1 && is_every_process(&args[0]);
            (lone || operands.iter().any(|o| is_every_process(o)))
                .then(|| format!("`kill … -1` {EVERY}"))
        }
        "pkill" | "killall" | "skill" => {
            let value_opts: &[&str] = match prog {
                "pkill" => &[
                    "-g",
                    "-G",
                    "-P",
                    "-s",
                    "-t",
                    "-u",
                    "-U",
                    "-F",
                    "-O",
                    "--pgroup",
                    "--group",
                    "--parent",
                    "--session",
                    "--terminal",
                    "--euid",
                    "--uid",
                    "--pidfile",
                    "--older",
                    "--signal",
                    "--ns",
                    "--nslist",
                    "--env",
                    "-q",
                    "--queue",
                ],
                "killall" => &[
                    "-s",
                    "-u",
                    "-o",
                    "-y",
                    "-n",
                    "-Z",
                    "--signal",
                    "--user",
                    "--older-than",
                    "--younger-than",
                    "--ns",
                    "--context",
                ],
                _ => &[
                    "-u",
                    "-t",
                    "-p",
                    "-c",
                    "--user",
                    "--tty",
                    "--pid",
                    "--command",
                ],
            };
            let user_wide: &[&str] = match prog {
                "pkill" => &["-u", "-U", "--euid", "--uid", "-G", "--group"],
                "killall" => &["-u", "--user"],
                _ => &["-u", "--user"],
            };
            let mut by_user = false;
            let mut regex = false;
            let mut names: Vec<&String> = Vec::new();
            let mut i = 0;
            while let Some(a) = args.get(i) {
                let opt = a.split_once('=').map_or(a.as_str(), |(o, _)| o);
                if a == "--" {
                    names.extend(args[i + 1..].iter());
                    break;
                }
                if user_wide.contains(&opt)
                    || (prog != "skill"
                        && user_wide
                            .iter()
                            .any(|u| u.len() == 2 && a.starts_with(u) && a.len() > 2))
                {
                    by_user = true;
                }
                if matches!(a.as_str(), "-r" | "--regexp") {
                    regex = true;
                }
                if value_opts.contains(&opt) {
                    i += if a.contains('=') { 1 } else { 2 };
                    continue;
                }
                if a.starts_with('-') && a.len() > 1 {
                    i += 1;
                    continue;
                }
                names.push(a);
                i += 1;
            }
            let every_name =
                (prog == "pkill" || regex) && names.iter().any(|n| matches_every_name(n));
            if (by_user && names.is_empty()) || every_name {
                return Some(format!(
                    "`{prog}` with no name to match, or a pattern that matches every name, {EVERY}"
                ));
            }
            None
        }
        _ => None,
    }
}

/// Whether `host` names the link-local metadata range or a cloud metadata name,
/// in any spelling `inet_aton` accepts (`169.254.169.254`, `2852039166`,
/// `0xa9fea9fe`, `0251.0376.0251.0376`).
pub fn is_metadata_host(host: &str) -> bool {
    let h = host
        .trim_matches(|c| c == '[' || c == ']')
        .to_ascii_lowercase();
    if matches!(
        h.as_str(),
        "metadata.google.internal" | "metadata.goog" | "metadata" | "100.100.100.200"
    ) || h.starts_with("fd00:ec2::")
    {
        return true;
    }
    let v4 = h.strip_prefix("::ffff:").unwrap_or(&h);
    parse_inet_aton(v4).is_some_and(|ip| ip >> 16 == 0xa9fe)
}

fn parse_num(s: &str) -> Option<u64> {
    if let Some(x) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(x, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn parse_inet_aton(s: &str) -> Option<u64> {
    let parts: Vec<u64> = s.split('.').map(parse_num).collect::<Option<_>>()?;
    let (last, head) = parts.split_last()?;
    if head.len() > 3 || head.iter().any(|&p| p > 255) {
        return None;
    }
    let mut ip = 0u64;
    for (k, p) in head.iter().enumerate() {
        ip |= p << (24 - 8 * k);
    }
    let room = 32 - 8 * head.len() as u32;
    if *last >= 1u64 << room {
        return None;
    }
    Some(ip | last)
}

/// The host part of a URL-ish word: `http://u@h:80/x` → `h`.
fn host_of(word: &str) -> &str {
    let w = word.split_once("://").map(|(_, r)| r).unwrap_or(word);
    let w = w.rsplit_once('@').map(|(_, r)| r).unwrap_or(w);
    if let Some(rest) = w.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    let end = w.find(['/', '?', '#', ':']).unwrap_or(w.len());
    &w[..end]
}

/// A request to a cloud metadata service.
pub fn metadata(prog: &str, args: &[String], cmd: &Command) -> Option<String> {
    let redirect = cmd
        .redirects
        .iter()
        .filter_map(|r| {
            r.target
                .strip_prefix("/dev/tcp/")
                .or_else(|| r.target.strip_prefix("/dev/udp/"))
        })
        .map(|t| t.split('/').next().unwrap_or(t));
    let words = args.iter().map(|a| {
        // `--url=http://…`, `-Hhost`: look past an option's name.
        let v = a.split_once('=').map(|(_, v)| v).unwrap_or(a);
        host_of(v)
    });
    let hit = redirect.chain(words).find(|h| is_metadata_host(h))?;
    Some(format!(
        "`{prog}` reaches the cloud metadata service at `{hit}`, which hands out the machine's credentials"
    ))
}

const SQL_CLIENTS: &[&str] = &[
    "psql",
    "mysql",
    "mariadb",
    "sqlite3",
    "sqlite",
    "sqlcmd",
    "clickhouse-client",
    "clickhouse",
    "cockroach",
    "duckdb",
    "mongosh",
    "mongo",
    "redis-cli",
    "cqlsh",
    "isql",
    "bq",
    "snowsql",
    "usql",
    "pgcli",
    "mycli",
    "litecli",
];

const SQL_WORDS: &[&str] = &[
    "drop",
    "delete",
    "truncate",
    "dropdatabase",
    "deletemany",
    "deleteone",
    "flushall",
    "flushdb",
];

fn has_sql_destruction(text: &str) -> bool {
    text.to_ascii_lowercase()
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| SQL_WORDS.contains(&w))
}

/// SQL `DROP`/`DELETE`/`TRUNCATE` given to a database client: in its
/// arguments, a here-string or here-document, or piped in from `echo`/`printf`.
pub fn sql_destructive(script: &Script, idx: usize, prog: &str, args: &[String]) -> Option<String> {
    if !SQL_CLIENTS.contains(&prog) {
        return None;
    }
    let cmd = script.commands.get(idx)?;
    let mut texts: Vec<&str> = args.iter().map(String::as_str).collect();
    texts.extend(
        cmd.redirects
            .iter()
            .filter(|r| r.op == "<<<")
            .map(|r| r.target.as_str()),
    );
    texts.extend(
        script
            .heredocs
            .iter()
            .filter(|(owner, _)| *owner == idx)
            .map(|(_, body)| body.as_str()),
    );
    for f in script.feeders(idx) {
        texts.extend(script.commands[f].argv.iter().map(String::as_str));
    }
    texts
        .into_iter()
        .any(has_sql_destruction)
        .then(|| format!("`{prog}` is given SQL that drops or deletes data"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_spellings() {
        for h in [
            "169.254.169.254",
            "2852039166",
            "0xa9fea9fe",
            "0251.0376.0251.0376",
            "169.254.43518",
            "0xa9.0xfe.0xa9.0xfe",
            "[::ffff:169.254.169.254]",
            "169.254.170.2",
            "metadata.google.internal",
            "[fd00:ec2::254]",
        ] {
            assert!(is_metadata_host(host_of(h)), "{h}");
        }
        for h in ["169.255.169.254", "example.com", "10.0.0.1", "1.2.3.4"] {
            assert!(!is_metadata_host(host_of(h)), "{h}");
        }
        assert_eq!(
            host_of("http://user@169.254.169.254:80/latest"),
            "169.254.169.254"
        );
    }
}
