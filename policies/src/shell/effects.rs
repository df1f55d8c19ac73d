//! Which commands can change what a session's snapshot holds.
//!
//! A snapshot records the shell's cwd, exported variables, functions and
//! aliases. Only the shell itself can change those: an external program runs in
//! a child process and cannot touch them. So a command whose text runs nothing
//! but external programs and harmless builtins leaves the snapshot current, and
//! the session engine skips writing it (the shell still checks cwd and `PATH`
//! itself).
//!
//! This reads the same [`Script`] the policy gate judges, and errs one way only:
//! anything not understood counts as a possible change. Text that does not
//! parse, a command word built at run time, a name the session defined, a
//! stateful builtin anywhere (even in a subshell, where it is harmless), and
//! every state fact the reader records all say "may change". A wrong "may
//! change" costs one snapshot (tens of microseconds); a wrong "cannot change"
//! would leave the snapshot behind the live shell.

use std::collections::HashSet;

use super::grammar::is_name;
use super::{Script, parse};
use crate::argv;

/// Builtins that can change cwd, variables, functions or aliases, or run text
/// the reader cannot see (`eval`, `source`, `.`).
const STATEFUL: &[&str] = &[
    ".",
    "alias",
    "builtin",
    "cd",
    "command",
    "coproc",
    "declare",
    "enable",
    "eval",
    "exec",
    "export",
    "fc",
    "getopts",
    "hash",
    "let",
    "local",
    "mapfile",
    "popd",
    "pushd",
    "read",
    "readarray",
    "readonly",
    "set",
    "shopt",
    "source",
    "trap",
    "typeset",
    "unalias",
    "unset",
    "umask",
    "ulimit",
];

/// Builtins that can define a function, change how a builtin resolves (`enable`,
/// a shell option), replace a trap, or run text the reader cannot see. After a
/// command that may do any of that, the loop runs its guard (see berth-core's
/// `session::script`), which undoes what would break the loop.
/// `fc` runs earlier text again, and `mapfile`'s callback (`-C`) is any text.
const DEFINING: &[&str] = &[
    ".",
    "builtin",
    "command",
    "enable",
    "eval",
    "exec",
    "fc",
    "mapfile",
    "readarray",
    "set",
    "shopt",
    "source",
    "trap",
];

/// Builtins that can define, change or remove a function or an alias besides
/// those in [`DEFINING`]: `unset` removes a function when no variable has the
/// name.
const REDEFINING: &[&str] = &["alias", "unalias", "unset"];

/// Builtins that touch functions only when an option says so (`-f`): `export
/// -f`, `readonly -f`, `declare -fx`.
const DECLARING: &[&str] = &["declare", "typeset", "export", "readonly", "local"];

/// Builtins whose effect outlasts the command: once seen, every later command in
/// the session counts as a possible change (a trap can run any code later).
const STICKY: &[&str] = &["trap", "enable"];

/// What reading a command found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The command may change the shell's state.
    pub may_change: bool,
    /// The command sets up something (a trap) that can change state later.
    pub sticky: bool,
    /// The command may define a function, change how builtins resolve, or
    /// replace a trap: a subset of `may_change`.
    pub may_define: bool,
    /// The command may define, change or remove a function (or an alias by
    /// the `alias` builtin): a superset of `may_define`, and a subset of
    /// `may_change`. Only after such a command does the shell write its
    /// functions again. Aliases are in every snapshot: one can be set through
    /// `BASH_ALIASES`, by a name no reading can follow.
    pub may_redefine: bool,
}

/// Read `text` and tell whether running it at the shell's top level may change
/// the state a snapshot holds. `names` are the shell's function and alias names:
/// calling one of those can do anything.
pub fn effects(text: &str, names: &HashSet<String>) -> Effects {
    let Ok(script) = parse(text) else {
        return Effects {
            may_change: true,
            sticky: false,
            may_define: true,
            may_redefine: true,
        };
    };
    of_script(&script, names)
}

/// [`effects`] of text already read.
pub fn of_script(script: &Script, names: &HashSet<String>) -> Effects {
    let mut fx = Effects {
        may_change: !script.state.is_empty() || !script.opaque.is_empty(),
        sticky: false,
        may_define: !script.opaque.is_empty() || !script.functions.is_empty(),
        may_redefine: false,
    };
    for cmd in &script.commands {
        let first = cmd.argv.iter().position(|w| super::assignment(w).is_none());
        let Some(first) = first else {
            continue;
        };
        if !cmd.is_literal(first) {
            fx.may_change = true;
            fx.may_define = true;
        }
        for view in argv::views(&cmd.argv) {
            let Some(prog) = view.first().map(String::as_str) else {
                continue;
            };
            if STICKY.contains(&prog) {
                fx.sticky = true;
            }
            if STATEFUL.contains(&prog) || names.contains(prog) {
                fx.may_change = true;
            }
            if DEFINING.contains(&prog) || names.contains(prog) {
                fx.may_define = true;
            }
            if prog == "printf" && view.iter().any(|a| a.starts_with("-v")) {
                fx.may_change = true;
            }
            // `wait -p NAME` (bash 5.1) assigns the pid it reaped.
            if prog == "wait" && view.iter().skip(1).any(|a| is_option_with(a, 'p')) {
                fx.may_change = true;
            }
            if REDEFINING.contains(&prog) {
                fx.may_redefine = true;
            }
            if DECLARING.contains(&prog) && names_functions(cmd, view.len()) {
                fx.may_redefine = true;
            }
        }
        // The word as written, before wrappers are peeled: `ll` may be an alias
        // even where `views` would read it as a path.
        if names.contains(&cmd.argv[first]) {
            fx.may_change = true;
            fx.may_define = true;
        }
    }
    fx.may_redefine |= fx.may_define;
    fx
}

/// Whether `word` is an option word (`-p`, `-np`) that carries `letter`.
fn is_option_with(word: &str, letter: char) -> bool {
    word.starts_with('-') && word != "--" && word.contains(letter)
}

/// The most names a journal record carries; a command that may assign more is
/// snapshotted whole.
pub const JOURNAL_NAMES_MAX: usize = 16;

/// Names whose assignment changes more than the variable (aliases through
/// `BASH_ALIASES`, the shell's options) or that are the engine's own.
fn journal_refuses(name: &str) -> bool {
    name.starts_with("BASH")
        || name.starts_with("__berth")
        || matches!(name, "SHELLOPTS" | "POSIXLY_CORRECT")
}

/// [`effects`], and when the text can change nothing but variables it names
/// and the cwd, those names: every variable the text may assign or export,
/// with `PWD` and `OLDPWD` when it may `cd`. The list is a superset of what
/// the command can change, so the engine may journal the current values of
/// those names instead of writing a whole snapshot (see berth-core's
/// `session::script`). `None` whenever the reader is not sure: a state fact
/// other than a plain assignment (a `for` variable, `${x:=y}`, arithmetic), a
/// stateful builtin other than `export` and `cd`, an `export` with an option
/// or a word built at run time, an array element (its subscript is
/// arithmetic), and all that [`of_script`] reads as possibly defining (a call
/// of a name the session defined, a command word built at run time, text it
/// cannot see). The shell still checks each name when it writes the record (a
/// nameref, a read-only variable, an array or an unset name is snapshotted
/// whole).
pub fn journal(text: &str, names: &HashSet<String>) -> (Effects, Option<Vec<String>>) {
    let Ok(script) = parse(text) else {
        return (effects(text, names), None);
    };
    let fx = of_script(&script, names);
    let listed = if fx.may_change && !fx.may_redefine && !fx.sticky {
        journal_names(&script)
    } else {
        None
    };
    (fx, listed)
}

/// The names for [`journal`], of text that [`of_script`] read as defining
/// nothing: no opaque part, no function, no call of the session's names and
/// no command word built at run time reach here.
fn journal_names(script: &Script) -> Option<Vec<String>> {
    if script.state.iter().any(|s| *s != "a variable assignment") {
        return None;
    }
    let mut out: Vec<String> = Vec::new();
    // Past the most names a record carries, the answer is `None`: stop
    // there, so a command of many assignments costs linear time.
    let mut add = |name: &str| -> Option<()> {
        if !is_name(name) || journal_refuses(name) {
            return None;
        }
        if !out.iter().any(|n| n == name) {
            if out.len() >= JOURNAL_NAMES_MAX {
                return None;
            }
            out.push(name.to_string());
        }
        Some(())
    };
    for cmd in &script.commands {
        let first = cmd.argv.iter().position(|w| super::assignment(w).is_none());
        for w in &cmd.argv[..first.unwrap_or(cmd.argv.len())] {
            let (key, value) = super::assignment(w)?;
            // An array's subscripts are arithmetic, which can assign.
            if value.starts_with('(') {
                return None;
            }
            add(key.strip_suffix('+').unwrap_or(key))?;
        }
        let Some(first) = first else {
            continue;
        };
        for (depth, view) in argv::views(&cmd.argv).iter().enumerate() {
            let Some(prog) = view.first().map(String::as_str) else {
                continue;
            };
            match prog {
                "cd" => {
                    add("PWD")?;
                    add("OLDPWD")?;
                }
                // The builtin itself, with its words as written.
                "export" if depth == 0 && cmd.argv[first] == "export" => {
                    for i in first + 1..cmd.argv.len() {
                        let w = &cmd.argv[i];
                        if !cmd.is_literal(i) && super::assignment(w).is_none() {
                            return None;
                        }
                        match super::assignment(w) {
                            Some((_, value)) if value.starts_with('(') => return None,
                            Some((key, _)) => add(key.strip_suffix('+').unwrap_or(key))?,
                            None if w == "--" => {}
                            None => add(w)?,
                        }
                    }
                }
                p if STATEFUL.contains(&p) => return None,
                "printf" if view.iter().any(|a| a.starts_with("-v")) => return None,
                "wait" if view.iter().skip(1).any(|a| is_option_with(a, 'p')) => return None,
                _ => {}
            }
        }
    }
    (out.len() <= JOURNAL_NAMES_MAX).then_some(out)
}

/// Whether the last `args` words of a `declare`-like command may name
/// functions: an option word with an `f` in it (`-f`, `-fx`, `+f`), or a word
/// the reader cannot know before it runs, other than an assignment's value.
fn names_functions(cmd: &super::Command, args: usize) -> bool {
    let start = cmd.argv.len().saturating_sub(args.saturating_sub(1));
    cmd.argv.iter().enumerate().skip(start).any(|(i, w)| {
        if super::assignment(w).is_some() {
            return false;
        }
        if !cmd.is_literal(i) {
            return true;
        }
        (w.starts_with('-') || w.starts_with('+')) && w != "--" && w.contains(['f', 'F'])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changes(text: &str) -> bool {
        effects(text, &HashSet::new()).may_change
    }

    #[test]
    fn plain_programs_cannot_change_state() {
        for t in [
            "echo hi",
            "ls -la | grep foo > out.txt 2>&1",
            "python3 -c 'import os; os.chdir(\"/\")'",
            "git commit -m \"export stuff; cd /\"",
            "cargo test --release -- --nocapture",
            "if [ -f x ]; then cat x; else echo none; fi",
            "[[ -f x ]] && cat x",
            "[ 1 -eq 1 ] && echo same",
            "grep -rn 'declare' src/ || true",
            "echo $HOME \"$PWD\" ${USER}",
            "find . -name '*.rs' -exec wc -l {} +",
            "curl -s http://x/?a=b",
            "echo hi # cd /tmp",
            "printf '%s\\n' a b",
            "sleep 100 & sleep 100; wait",
            "cat <<EOF\nhello\nEOF",
            "uname -a && whoami",
            "make -j2 2>&1 | tail -n 20",
            "case x in a) echo a ;; *) echo b ;; esac",
            "echo $((1 + 2))",
            "[[ $x =~ ^a(b|c)$ ]] && echo y",
        ] {
            assert!(!changes(t), "{t:?} was read as changing state");
        }
    }

    #[test]
    fn state_changes_are_seen() {
        for t in [
            "cd /tmp",
            "mkdir -p a && cd a",
            "export A=1",
            "A=1",
            "PATH=$PATH:/opt/bin",
            "arr[3]=x",
            "x+=y",
            "a=(1 2 3)",
            "arr+=(x)",
            "declare -a a=(1 2)",
            "unset A",
            "declare -x A=1",
            "typeset -A m",
            "source .venv/bin/activate",
            ". ./env.sh",
            "true; . ./env.sh",
            "eval \"$(ssh-agent)\"",
            "f() { echo hi; }",
            "f () { echo hi; }",
            "function f { echo hi; }",
            "alias ll='ls -l'",
            "unalias ll",
            "pushd /tmp",
            "popd",
            "set -a",
            "shopt -s extglob",
            "read -r line < file",
            "mapfile -t lines < file",
            "for f in *; do echo $f; done",
            "for ((i=0;i<3;i++)); do :; done",
            "((i++))",
            "echo $((x = 1))",
            "echo $[x=1]",
            ": ${A:=default}",
            "echo ${A=default}",
            "printf -v out '%s' x",
            "$cmd arg",
            "\"$EDITOR\" file",
            "$(which cd) /tmp",
            "`echo cd` /tmp",
            "exec bash",
            "command cd /tmp",
            "builtin cd /tmp",
            "time cd /tmp",
            "! cd /nope",
            "{ cd /tmp; }",
            "ls; cd /tmp",
            "ls && cd /tmp",
            "ls || cd /tmp",
            "ls | cd /tmp",
            "(cd /tmp)",
            "'cd' /tmp",
            "c\\d /tmp",
            "trap 'cd /' DEBUG",
            "hash -r",
            "let x=1",
            "getopts ab opt",
            "coproc cat",
            "while read l; do :; done < f",
            "[[ 1 -eq PATH=5 ]]",
            "[[ -v 'a[PATH=1]' ]]",
            "echo hi {fd}>/dev/null",
            "case $x in (a) cd /tmp ;; esac",
            "echo $(case a in a) cd / ;; esac)",
            "umask 077",
            "echo 'unterminated",
        ] {
            assert!(changes(t), "{t:?} was read as unable to change state");
        }
    }

    #[test]
    fn functions_and_aliases_count_as_changes() {
        let names: HashSet<String> = ["nvm", "ll"].iter().map(|s| s.to_string()).collect();
        assert!(effects("nvm use 18", &names).may_change);
        assert!(effects("ls && ll", &names).may_change);
        assert!(effects("echo x | ll", &names).may_change);
        assert!(effects("sudo ll", &names).may_change);
        assert!(!effects("ls -l", &names).may_change);
    }

    #[test]
    fn traps_are_sticky() {
        assert!(effects("trap 'export X=1' DEBUG", &HashSet::new()).sticky);
        assert!(effects("enable -f ./x.so x", &HashSet::new()).sticky);
        assert!(!effects("grep -rn trap src", &HashSet::new()).sticky);
        assert!(!effects("cd /tmp", &HashSet::new()).sticky);
    }

    /// What can break the session loop (a function that shadows `builtin`, a
    /// disabled builtin, a replaced trap) is a narrower set than what changes
    /// state: `export` and `cd` change state but cannot define anything, so
    /// they skip the guard that runs after definitions.
    #[test]
    fn definitions_are_told_apart_from_other_changes() {
        let defines = |t: &str, names: &[&str]| {
            let names: HashSet<String> = names.iter().map(|s| s.to_string()).collect();
            effects(t, &names)
        };
        for t in [
            "export A=1",
            "cd /tmp",
            "A=1; B=2",
            "unset A",
            "declare -x A=1",
            "alias ll='ls -l'",
            "read -r x < f",
            "umask 022",
        ] {
            let fx = defines(t, &[]);
            assert!(fx.may_change && !fx.may_define, "{t:?}: {fx:?}");
        }
        for t in [
            "f() { :; }",
            "function builtin { :; }",
            "eval \"$x\"",
            "source ./env.sh",
            ". ./env.sh",
            "enable -n read",
            "trap 'echo' USR1",
            "builtin eval x",
            "command eval x",
            "set -o posix",
            "shopt -s extglob",
            "$cmd arg",
            "exec 3>&-",
            "x=$(echo hi); \"$x\"",
            "fc -s",
            "mapfile -C 'f() { :; }; :' -c 1 a < f",
            // bash 5.3 runs `${ …; }` in the shell itself.
            "echo ${ f() { :; }; }",
            "echo \"${ cd /tmp; }\"",
            "x=${| builtin() { :; }; }",
        ] {
            let fx = defines(t, &[]);
            assert!(fx.may_define && fx.may_change, "{t:?} may define: {fx:?}");
        }
        // A function or alias the session defined can do anything.
        assert!(defines("mkvenv", &["mkvenv"]).may_define);
        assert!(!defines("echo hi", &["mkvenv"]).may_define);
        // Text that does not parse is assumed to define.
        assert!(defines("if then fi (", &[]).may_define);
    }

    /// The shell writes its functions and aliases again only after a command
    /// read as able to change one: `export` and `cd` cannot, `alias`, `unset`
    /// (which removes a function when no variable has the name) and `export -f`
    /// can, and so can everything that may define one.
    #[test]
    fn redefinitions_are_told_apart_from_other_changes() {
        let fx = |t: &str| effects(t, &["mkvenv".to_string()].into_iter().collect());
        for t in [
            "export A=1",
            "export PATH=$PATH:/opt/bin",
            "cd /tmp",
            "A=1; B=2",
            "declare -x A=1",
            "declare -n r=BASH_ALIASES",
            "readonly A",
            "local -i n=1",
            "typeset -A m",
            "export -n A",
            "read -r x < f",
            "pushd /tmp",
            "umask 022",
            "printf -v x %s y",
        ] {
            let f = fx(t);
            assert!(f.may_change && !f.may_redefine, "{t:?}: {f:?}");
        }
        for t in [
            "alias ll='ls -l'",
            "unalias ll",
            "unset A",
            "unset -f f",
            "export -f f",
            "declare -fx f",
            "readonly -f f",
            "typeset +f f",
            "command export -f f",
            "declare $opts f",
            "export \"$x\"",
            "fc -s",
            "mapfile -C cb -c 1 a < f",
            "readarray a < f",
            "f() { :; }",
            "eval \"$x\"",
            "source ./env.sh",
            "trap 'echo' USR1",
            "set -o posix",
            "$cmd arg",
            "mkvenv",
            "ls && mkvenv",
            "if then fi (",
        ] {
            let f = fx(t);
            assert!(f.may_redefine, "{t:?} may redefine: {f:?}");
            assert!(f.may_change, "{t:?} may redefine but not change? {f:?}");
        }
        assert!(!fx("echo hi").may_redefine);
    }

    fn listed(text: &str) -> Option<Vec<String>> {
        let names: HashSet<String> = ["mkvenv", "ll"].iter().map(|s| s.to_string()).collect();
        journal(text, &names).1
    }

    /// The journal's names are a superset of what the text can change, and
    /// there are none whenever the reader cannot be sure of that.
    #[test]
    fn journal_names_cover_every_assignment_or_are_refused() {
        let some = |t: &str, want: &[&str]| {
            let got = listed(t).unwrap_or_else(|| panic!("{t:?} was refused a journal"));
            assert_eq!(got, want, "{t:?}");
        };
        some("export BERTH_BENCH=1; echo hi", &["BERTH_BENCH"]);
        some("A=1", &["A"]);
        some("A+=x B=$(date) C=\"$HOME/x\"", &["A", "B", "C"]);
        some("export A B=2 -- C", &["A", "B", "C"]);
        some("export PATH=$PATH:/opt/bin", &["PATH"]);
        some("cd /tmp", &["PWD", "OLDPWD"]);
        some("mkdir -p a && cd a && export X=1", &["PWD", "OLDPWD", "X"]);
        some("if [ -f x ]; then export A=1; else B=2; fi", &["A", "B"]);
        some("A=1 make -j2", &["A"]);
        some("(export A=1); echo $(cd /; pwd)", &["A", "PWD", "OLDPWD"]);
        some("A=1; A=2; export A", &["A"]);
        for t in [
            // Anything that may change more than named variables.
            "export -n A",
            "export -f f",
            "export $name",
            "export \"$name\"=1",
            "export A$x=1",
            "declare -x A=1",
            "readonly A=1",
            "local A=1",
            "unset A",
            "arr[3]=x",
            "a[i++]=1",
            "a=(1 2)",
            "export a=([i++]=1)",
            "for i in 1 2; do :; done",
            ": ${A:=x}",
            "A=$((B=1))",
            "((i++))",
            "read -r A",
            "printf -v A x",
            "wait -p A",
            "pushd /tmp",
            "source env.sh",
            "set -a",
            "shopt -s extglob",
            "eval \"A=1\"",
            "$cmd",
            "command cd /tmp",
            "builtin export A=1",
            "mkvenv",
            "ll; export A=1",
            "f() { :; }; export A=1",
            "alias x=y",
            "trap 'export A=1' DEBUG",
            // Assignments whose effect reaches past the variable.
            "BASH_ALIASES[x]=y",
            "BASH_ALIASES=()",
            "export BASH_ENV=x",
            "POSIXLY_CORRECT=1",
            "__berth_j=x",
            "echo 'unterminated",
        ] {
            assert_eq!(listed(t), None, "{t:?} was given a journal");
        }
        let many: String = (0..=JOURNAL_NAMES_MAX)
            .map(|i| format!("V{i}=1; "))
            .collect();
        assert_eq!(listed(&many), None, "more names than a record carries");
        // Commands that cannot change state need no journal either way, and
        // `wait -p` is a change.
        assert!(!changes("wait"));
        assert!(changes("wait -p pid"));
    }
}
