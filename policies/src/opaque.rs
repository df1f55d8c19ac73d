//! Commands whose real program berth cannot know from the text: the command
//! word is built at run time, or the code that runs is a string the gate cannot
//! read (inline interpreter code, `eval` of an expansion, a shell fed from a
//! pipe). Such a command gets the policy's `opaque` verdict rather than being
//! judged by what it looks like.

use crate::argv;
use crate::shell::Script;

/// Interpreters and the options that take inline code.
const INLINE: &[(&str, &[&str])] = &[
    ("python", &["-c"]),
    ("perl", &["-e", "-E"]),
    ("ruby", &["-e"]),
    ("node", &["-e", "--eval", "-p", "--print"]),
    ("nodejs", &["-e", "--eval", "-p", "--print"]),
    ("bun", &["-e", "--eval", "-p", "--print"]),
    ("php", &["-r"]),
    ("lua", &["-e"]),
    ("luajit", &["-e"]),
    ("rscript", &["-e"]),
    ("osascript", &["-e"]),
    ("pwsh", &["-c", "-command", "-encodedcommand", "-ec"]),
    ("powershell", &["-c", "-command", "-encodedcommand", "-ec"]),
    ("tclsh", &[]),
    ("expect", &["-c"]),
    ("jshell", &[]),
    ("gdb", &["-ex", "--eval-command"]),
];

/// The interpreter family of a program name: `python3.12` → `python`.
fn family(prog: &str) -> String {
    let p = prog.to_ascii_lowercase();
    let base = p.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.' || c == '-');
    base.to_string()
}

/// Whether command `idx` of `script` is opaque; if so, why.
pub fn reason(script: &Script, idx: usize) -> Option<String> {
    let cmd = script.commands.get(idx)?;
    let views = argv::views(&cmd.argv);
    for view in &views {
        // Views are suffixes of argv, so a view's first word sits at this index.
        let at = cmd.argv.len() - view.len();
        let word = &cmd.argv[at];
        if !cmd.is_literal(at) {
            return Some(format!(
                "the command word `{word}` is built when the command runs (an expansion, substitution or glob), so berth cannot tell what it runs"
            ));
        }
        let prog = view[0].as_str();
        let args = &view[1..];
        let args_literal = (at + 1..cmd.argv.len()).all(|i| cmd.is_literal(i));
        match prog {
            "eval" if !args_literal => {
                return Some("`eval` of text built when the command runs".into());
            }
            "source" | "." if !cmd.is_literal(at + 1) && !args.is_empty() => {
                return Some(format!("`{prog}` of a file named at run time"));
            }
            "source" | "." if args.first().is_some_and(|f| is_stdin_path(f)) => {
                return Some(format!(
                    "`{prog}` of its own input, which berth does not read as code"
                ));
            }
            "hash"
                if args.iter().any(|a| {
                    a.starts_with("-p")
                        || (a.starts_with('-') && !a.starts_with("--") && a.contains('p'))
                }) =>
            {
                return Some("`hash -p` makes a command name run another program".into());
            }
            "enable" => {
                return Some("`enable` changes which builtins and commands names run".into());
            }
            "env" => {
                if let Some(code) = argv::env_split_string(args)
                    && (code.contains('$') || !args_literal)
                {
                    return Some("`env -S` of a string with variables in it".into());
                }
            }
            "trap" if !args_literal => {
                return Some("`trap` of code built when the command runs".into());
            }
            p if argv::SHELLS.contains(&p) || matches!(p, "at" | "batch") => {
                // `sh -c "$x"`: the code word itself is not a literal.
                let shell_strings = argv::shell_strings(view);
                if !shell_strings.is_empty() && !args_literal {
                    let code_words_literal = (at + 1..cmd.argv.len())
                        .filter(|&i| shell_strings.contains(&cmd.argv[i]))
                        .all(|i| cmd.is_literal(i));
                    if !code_words_literal {
                        return Some(format!("`{p} -c` of code built when the command runs"));
                    }
                }
                if args.iter().any(|a| is_stdin_path(a)) {
                    return Some(format!("`{p}` runs a script from its own input"));
                }
                if argv::reads_code_from_stdin(view) {
                    let feeders = script.feeders(idx);
                    for f in feeders {
                        let up = argv::inner(&script.commands[f].argv);
                        let literal_echo =
                            matches!(up.first().map(String::as_str), Some("echo" | "printf"))
                                && (0..script.commands[f].argv.len())
                                    .all(|i| script.commands[f].is_literal(i));
                        if !literal_echo && !up.is_empty() {
                            return Some(format!(
                                "`{p}` runs code it reads from the output of `{}`",
                                up[0]
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
        if let Some(why) = interpreter(prog, args) {
            return Some(why);
        }
        if let Some(why) = crate::sources::elsewhere(script, idx, prog, args) {
            return Some(why);
        }
        if let Some(why) = crate::embedded::opaque(prog, args) {
            return Some(why);
        }
        // `xargs -I{} {} f`, `find -exec {} \;`: the program is filled in
        // from input when the command runs.
        let placeholder = if prog == "xargs" {
            xargs_replace(args)
        } else {
            None
        };
        if let Some(next) = views.iter().skip_while(|v| !std::ptr::eq(*v, view)).nth(1)
            && let Some(ph) = placeholder
            && next.first().is_some_and(|w| w.contains(ph.as_str()))
        {
            return Some(format!(
                "the command word `{}` is filled in by `{prog}` when it runs",
                next[0]
            ));
        }
        if view[0].contains("{}") {
            return Some(format!(
                "the command word `{}` is filled in when the command runs",
                view[0]
            ));
        }
        if matches!(prog, "xargs" | "parallel") && !args_literal {
            return Some(format!("`{prog}` runs a command built when it runs"));
        }
    }
    None
}

/// The string `xargs -I STR` (or `-i`, `--replace`) replaces in its command.
fn xargs_replace(args: &[String]) -> Option<String> {
    let mut i = 0;
    while let Some(a) = args.get(i) {
        if !a.starts_with('-') || a == "--" {
            return None;
        }
        if a == "-I" {
            return args.get(i + 1).cloned();
        }
        if let Some(r) = a.strip_prefix("-I") {
            return Some(r.to_string());
        }
        if a == "-i" || a == "--replace" {
            return Some("{}".into());
        }
        if let Some(r) = a.strip_prefix("--replace=").or(a.strip_prefix("-i")) {
            return Some(r.to_string());
        }
        i += 1;
    }
    None
}

/// Paths that are a process's own input or an inherited fd: code read from
/// them is whatever was fed in, which berth does not see as text.
fn is_stdin_path(p: &str) -> bool {
    p == "/dev/stdin"
        || p.starts_with("/dev/fd/")
        || (p.starts_with("/proc/") && p.contains("/fd/"))
}

/// Inline code given to an interpreter.
fn interpreter(prog: &str, args: &[String]) -> Option<String> {
    let fam = family(prog);
    if fam == "deno" && args.first().is_some_and(|a| a == "eval") {
        return Some("`deno eval` runs inline code berth cannot read".into());
    }
    let (_, opts) = INLINE.iter().find(|(f, _)| *f == fam)?;
    for a in args {
        let lower = a.to_ascii_lowercase();
        if !a.starts_with('-') {
            // The script operand: what follows are its arguments.
            return None;
        }
        let hit = opts.iter().any(|o| {
            lower == *o
                || lower.starts_with(&format!("{o}="))
                // A short-option cluster ending in the code option: `-Sc`, `-ne`, `-lne`.
                || (o.len() == 2 && !lower.starts_with("--") && lower.len() > 2 && lower[1..].contains(&o[1..]))
        });
        if hit {
            return Some(format!("`{prog} {a}` runs inline code berth cannot read"));
        }
    }
    None
}
