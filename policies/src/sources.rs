//! Where a program's code comes from. An interpreter runs a program: when
//! that program is text on the command line (`bash -c '…'`, a here-document
//! fed to `sh`), the reader reads it; when it is a file, the program's own
//! input, a descriptor or a process substitution (`bash s.sh`, `sh < f`,
//! `bash <(…)`, `python3 -`, `awk -f /dev/stdin`), the gate has not read it
//! and the command is opaque. The rule is an allow-list: an interpreter is
//! read only in the forms known to run nothing but what the text holds
//! (`python3 --version`, `python3 -m MODULE` names an installed program the
//! way a command word does). The same holds for programs that load code
//! named elsewhere: a dynamic loader run directly, `apt -o` options outside
//! a known set, `apt -c FILE`.

use crate::argv;
use crate::shell::Script;

/// Interpreter families (see [`family`]) whose program is a file or their
/// input unless told otherwise, with the options that take a value.
const INTERPRETERS: &[(&str, &[&str])] = &[
    ("python", &["-W", "-X", "--check-hash-based-pycs"]),
    ("pypy", &["-W", "-X"]),
    ("perl", &["-I", "-M", "-m", "-x"]),
    ("ruby", &["-I", "-r", "-C", "-E", "-x"]),
    (
        "node",
        &[
            "-r",
            "--require",
            "--import",
            "--loader",
            "--input-type",
            "--env-file",
        ],
    ),
    (
        "nodejs",
        &[
            "-r",
            "--require",
            "--import",
            "--loader",
            "--input-type",
            "--env-file",
        ],
    ),
    ("php", &["-c", "-d", "-z"]),
    ("lua", &["-l"]),
    ("luajit", &["-l", "-j"]),
    ("rscript", &[]),
    ("tclsh", &[]),
    ("wish", &[]),
    ("expect", &[]),
    ("osascript", &["-l"]),
    ("pwsh", &[]),
    ("powershell", &[]),
    ("jshell", &[]),
];

/// Options that only print something about the interpreter.
const INFO: &[&str] = &["--version", "-V", "-VV", "-v", "--help", "-h", "-help"];

/// The interpreter family of a program name: `python3.12` → `python`.
pub fn family(prog: &str) -> String {
    let p = prog.to_ascii_lowercase();
    p.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-')
        .to_string()
}

/// Whether `p` names a file whose content is the command's input or an
/// inherited descriptor, not text on the command line: `-`, `/dev/stdin`,
/// `/dev/fd/N`, `/proc/…/fd/N`, or a process substitution `<(…)`.
pub fn is_input(p: &str) -> bool {
    p == "-"
        || p == "/dev/stdin"
        || p.starts_with("/dev/fd/")
        || (p.starts_with("/proc/") && p.contains("/fd/"))
        || p.starts_with("<(")
}

/// Why command `idx` of `script`, one of whose layers is `prog ARGS`,
/// runs code that is not on its command line, if it does.
pub fn elsewhere(script: &Script, idx: usize, prog: &str, args: &[String]) -> Option<String> {
    if argv::SHELLS.contains(&prog) {
        let args = if prog == "busybox" {
            match args.first().map(String::as_str) {
                Some(s) if argv::SHELLS.contains(&s) => &args[1..],
                _ => return None,
            }
        } else {
            args
        };
        return shell(script, idx, prog, args);
    }
    if matches!(prog, "source" | ".") {
        return args.first().map(|f| {
            format!("`{prog} {f}` runs the commands in a file, which berth does not read")
        });
    }
    if argv::is_loader(prog) {
        return Some(format!(
            "`{prog}` is the dynamic loader: it runs the program it is given with code it loads besides"
        ));
    }
    let fam = family(prog);
    if let Some((_, value_opts)) = INTERPRETERS.iter().find(|(f, _)| *f == fam) {
        return interpreter(prog, args, value_opts);
    }
    match prog {
        "awk" | "gawk" | "mawk" | "nawk" => file_option(
            args,
            &[
                "-f",
                "--file",
                "-E",
                "--exec",
                "-i",
                "--include",
                "-l",
                "--load",
            ],
            "",
        )
        .map(|f| format!("`{prog}` runs its program from `{f}`, which berth does not read")),
        "sed" | "gsed" => file_option(args, &["-f", "--file"], "nrEsuz")
            .map(|f| format!("`{prog}` runs its script from `{f}`, which berth does not read")),
        "make" | "gmake" => file_option(args, &["-f", "--file", "--makefile"], "")
            .filter(|f| is_input(f))
            .map(|f| format!("`{prog}` reads its makefile from `{f}`, its input")),
        "apt" | "apt-get" | "apt-cache" | "aptitude" | "apt-mark" | "apt-config" => apt(args),
        _ => None,
    }
}

/// A shell with no `-c` string: it runs a script file, or its input.
fn shell(script: &Script, idx: usize, prog: &str, args: &[String]) -> Option<String> {
    let cmd = script.commands.get(idx)?;
    if !args.is_empty()
        && args
            .iter()
            .all(|a| matches!(a.as_str(), "--version" | "--help"))
    {
        return None;
    }
    let view: Vec<String> = std::iter::once(prog.to_string())
        .chain(args.iter().cloned())
        .collect();
    if !argv::shell_strings(&view).is_empty() {
        return None;
    }
    if !argv::reads_code_from_stdin(&view) {
        let file = args
            .iter()
            .find(|a| !a.starts_with(['-', '+']))
            .map_or("?", String::as_str);
        return Some(format!(
            "`{prog} {file}` runs the commands in a file, which berth does not read"
        ));
    }
    // Its input is the script: read when it is a here-document, a here-string
    // or a literal `echo`/`printf` piped in (the reader reads those as code,
    // and `opaque::reason` judges other feeders).
    let fed_from_file = cmd
        .redirects
        .iter()
        .any(|r| (r.fd.is_empty() || r.fd == "0") && matches!(r.op.as_str(), "<" | "<&" | "<>"));
    if fed_from_file {
        return Some(format!(
            "`{prog}` runs the commands it reads from a file or descriptor, which berth does not read"
        ));
    }
    let heredoc = cmd
        .redirects
        .iter()
        .any(|r| matches!(r.op.as_str(), "<<" | "<<-" | "<<<"));
    if heredoc || !script.feeders(idx).is_empty() {
        return None;
    }
    Some(format!(
        "`{prog}` runs the commands on its input, which berth does not see"
    ))
}

/// An interpreter that is not given inline code (that case is judged in
/// `opaque.rs`): opaque unless it only prints about itself, or runs a
/// module it names (`python3 -m pip`).
fn interpreter(prog: &str, args: &[String], value_opts: &[&str]) -> Option<String> {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        // `python3 -m MODULE` runs an installed module it names.
        if family(prog) == "python" && a.starts_with("-m") {
            return None;
        }
        if a == "--" {
            break;
        }
        if a == "-" || !a.starts_with('-') {
            i -= 1;
            break;
        }
        let opt = a.split_once('=').map_or(a.as_str(), |(o, _)| o);
        if value_opts.contains(&opt) && !a.contains('=') && opt.len() == a.len() {
            i += 1;
        }
    }
    match args.get(i) {
        Some(f) if is_input(f) => Some(format!(
            "`{prog} {f}` runs the program on its input, which berth does not see"
        )),
        Some(f) => Some(format!(
            "`{prog} {f}` runs a program file, which berth does not read"
        )),
        None if !args.is_empty() && args.iter().all(|a| INFO.contains(&a.as_str())) => None,
        None => Some(format!(
            "`{prog}` runs the program on its input, which berth does not see"
        )),
    }
}

/// The value of the first of `names` (as `-f V`, `-fV`, `--file V`,
/// `--file=V`, or `-nf V` after letters of `flags`, options that take no
/// value) in `args`.
fn file_option(args: &[String], names: &[&str], flags: &str) -> Option<String> {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        i += 1;
        if a == "--" {
            return None;
        }
        for n in names {
            if a == n {
                return Some(args.get(i).cloned().unwrap_or_default());
            }
            if n.starts_with("--") {
                if let Some(v) = a.strip_prefix(n).and_then(|r| r.strip_prefix('=')) {
                    return Some(v.to_string());
                }
            } else if let Some(rest) = a.strip_prefix(n) {
                // `-fFILE`.
                return Some(rest.to_string());
            } else if let Some(letters) = a.strip_prefix('-').filter(|l| !l.starts_with('-'))
                && letters.ends_with(&n[1..])
                && letters[..letters.len() - 1]
                    .chars()
                    .all(|c| flags.contains(c))
            {
                // A cluster of flags ending in the option: `-nf FILE`.
                return Some(args.get(i).cloned().unwrap_or_default());
            }
        }
    }
    None
}

fn apt(args: &[String]) -> Option<String> {
    if let Some(f) = file_option(args, &["-c", "--config-file"], "") {
        return Some(format!(
            "`apt -c {f}` loads configuration, which can name commands apt runs, from a file berth does not read"
        ));
    }
    crate::apt::unknown_option(args)
}
