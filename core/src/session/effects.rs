//! Which commands can change what a snapshot holds.
//!
//! A snapshot records the shell's cwd, exported variables, functions and aliases.
//! Only the shell itself can change those: an external program runs in a child
//! process and cannot touch them. So a command whose text runs nothing but
//! external programs and harmless builtins leaves the snapshot current, and the
//! engine skips writing it (the shell still checks cwd and `PATH` itself).
//!
//! The reader here is deliberately coarse and errs one way only: anything it does
//! not understand counts as a possible change. A wrong "may change" costs one
//! snapshot (tens of microseconds); a wrong "cannot change" would leave the
//! snapshot behind the live shell until the next state-changing command, so
//! every rule below leans to "may change".

use std::collections::HashSet;

/// Builtins and keywords that can change cwd, variables, functions or aliases, or
/// run text the reader cannot see (`eval`, `source`, `.`). `for` and `select`
/// assign their loop variable, `read`, `mapfile` and `getopts` assign theirs.
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
    "for",
    "function",
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
    "select",
    "set",
    "shopt",
    "source",
    "trap",
    "typeset",
    "unalias",
    "unset",
];

/// Builtins whose effect outlasts the command: once seen, every later command in
/// the session counts as a possible change (a trap can run any code later).
const STICKY: &[&str] = &["trap", "enable"];

/// Reserved words after which the next word is again a command name.
const LEADING_KEYWORDS: &[&str] = &[
    "if", "then", "else", "elif", "while", "until", "do", "time", "!", "{", "}",
];

/// What reading a command found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The command may change the shell's state.
    pub may_change: bool,
    /// The command sets up something (a trap) that can change state later.
    pub sticky: bool,
}

/// Read `text` and tell whether running it at the shell's top level may change
/// the state a snapshot holds. `names` are the shell's function and alias names:
/// calling one of those can do anything.
pub fn effects(text: &str, names: &HashSet<String>) -> Effects {
    let mut fx = Effects::default();
    // Arithmetic assigns (`((i++))`, `$((x = 1))`), as do `${x:=y}` and `${x=y}`.
    if text.contains("((") || text.contains("$[") || param_assigns(text) {
        fx.may_change = true;
    }
    if text.contains("printf") && text.contains("-v") {
        fx.may_change = true;
    }
    // `[[ 1 -eq x=2 ]]` and `[[ -v a[i=2] ]]` evaluate arithmetic, which assigns.
    if text.contains("[[")
        && ["-eq", "-ne", "-lt", "-le", "-gt", "-ge", "-v"]
            .iter()
            .any(|op| text.contains(op))
    {
        fx.may_change = true;
    }
    // `cmd {fd}>file` assigns the variable `fd`.
    if text.contains("}>") || text.contains("}<") {
        fx.may_change = true;
    }
    let mut command_position = true;
    for w in words(text) {
        match w {
            Token::Separator => command_position = true,
            Token::FunctionParens => fx.may_change = true,
            Token::Word(w) => {
                let literal = w.literal();
                if let Some(v) = &literal {
                    // Anywhere at all: a safety net for the position tracking.
                    if w.plain && v != "." && (STATEFUL.contains(&v.as_str()) || names.contains(v))
                    {
                        fx.may_change = true;
                    }
                }
                if !command_position {
                    continue;
                }
                if is_assignment(&w.raw) {
                    // `NAME=value`: the next word is still a command name.
                    fx.may_change = true;
                    continue;
                }
                match literal {
                    None => {
                        // `$cmd args`, `"$(which x)" ...`: could be anything.
                        fx.may_change = true;
                        command_position = false;
                    }
                    Some(v) => {
                        if STICKY.contains(&v.as_str()) {
                            fx.sticky = true;
                        }
                        if STATEFUL.contains(&v.as_str()) || names.contains(&v) {
                            fx.may_change = true;
                        }
                        command_position = LEADING_KEYWORDS.contains(&v.as_str());
                    }
                }
            }
        }
    }
    fx
}

/// `${name=...}` or `${name:=...}`: a parameter expansion that assigns.
fn param_assigns(text: &str) -> bool {
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        let after = &rest[i + 2..];
        let end = after.find('}').unwrap_or(after.len());
        if after[..end].contains('=') {
            return true;
        }
        rest = after;
    }
    false
}

/// `NAME=`, `NAME+=` or `NAME[...]=` at the start of a word.
fn is_assignment(raw: &str) -> bool {
    let b = raw.as_bytes();
    if b.is_empty() || !(b[0].is_ascii_alphabetic() || b[0] == b'_') {
        return false;
    }
    let mut i = 1;
    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
        i += 1;
    }
    if i < b.len() && b[i] == b'[' {
        match raw[i..].find(']') {
            Some(j) => i += j + 1,
            None => return false,
        }
    }
    if i < b.len() && b[i] == b'+' {
        i += 1;
    }
    i < b.len() && b[i] == b'='
}

#[derive(Debug, PartialEq, Eq)]
enum Token {
    Word(Word),
    /// `;`, `&`, `|`, `(`, `)`, a newline, a backquote or `$(`: a new command
    /// may start after it.
    Separator,
    /// `()`: a function definition.
    FunctionParens,
}

#[derive(Debug, PartialEq, Eq)]
struct Word {
    /// The word as written.
    raw: String,
    /// The word after quote removal, if it holds no expansion.
    value: String,
    /// It holds `$` or a backquote outside single quotes.
    expands: bool,
    /// It holds no quoting at all.
    plain: bool,
}

impl Word {
    fn literal(&self) -> Option<String> {
        (!self.expands).then(|| self.value.clone())
    }
}

/// Split shell text into words and separators. Quotes are honoured; expansions
/// are marked, not expanded. Redirection operators end a word and are dropped.
fn words(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut cur: Option<Word> = None;
    let mut chars = text.chars().peekable();
    fn word(cur: &mut Option<Word>) -> &mut Word {
        cur.get_or_insert_with(|| Word {
            raw: String::new(),
            value: String::new(),
            expands: false,
            plain: true,
        })
    }
    fn flush(out: &mut Vec<Token>, cur: &mut Option<Word>) {
        if let Some(w) = cur.take() {
            out.push(Token::Word(w));
        }
    }
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => flush(&mut out, &mut cur),
            '\n' | ';' | '&' | '|' | ')' | '`' => {
                flush(&mut out, &mut cur);
                out.push(Token::Separator);
            }
            '(' => {
                let dollar = cur.as_ref().is_some_and(|w| w.raw.ends_with('$'));
                flush(&mut out, &mut cur);
                if !dollar && chars.peek() == Some(&')') {
                    out.push(Token::FunctionParens);
                } else {
                    out.push(Token::Separator);
                }
            }
            '<' | '>' => flush(&mut out, &mut cur),
            '#' if cur.is_none() => {
                // A comment runs to the end of the line.
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push(Token::Separator);
                        break;
                    }
                }
            }
            '\'' => {
                let w = word(&mut cur);
                w.plain = false;
                w.raw.push(c);
                for c in chars.by_ref() {
                    w.raw.push(c);
                    if c == '\'' {
                        break;
                    }
                    w.value.push(c);
                }
            }
            '"' => {
                let w = word(&mut cur);
                w.plain = false;
                w.raw.push(c);
                while let Some(c) = chars.next() {
                    w.raw.push(c);
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                w.raw.push(n);
                                w.value.push(n);
                            }
                        }
                        '$' | '`' => {
                            w.expands = true;
                            w.value.push(c);
                        }
                        _ => w.value.push(c),
                    }
                }
            }
            '\\' => {
                let w = word(&mut cur);
                w.plain = false;
                w.raw.push(c);
                if let Some(n) = chars.next() {
                    w.raw.push(n);
                    if n != '\n' {
                        w.value.push(n);
                    }
                }
            }
            '$' => {
                let w = word(&mut cur);
                w.expands = true;
                w.raw.push(c);
                w.value.push(c);
            }
            _ => {
                let w = word(&mut cur);
                w.raw.push(c);
                w.value.push(c);
            }
        }
    }
    flush(&mut out, &mut cur);
    out
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
            "((i++))",
            "echo $((x = 1))",
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
        assert!(!effects("ls -l", &names).may_change);
    }

    #[test]
    fn traps_are_sticky() {
        assert!(effects("trap 'export X=1' DEBUG", &HashSet::new()).sticky);
        assert!(effects("enable -f ./x.so x", &HashSet::new()).sticky);
        assert!(!effects("grep -rn trap src", &HashSet::new()).sticky);
        assert!(!effects("cd /tmp", &HashSet::new()).sticky);
    }

    #[test]
    fn assignments_are_recognised() {
        assert!(is_assignment("A=1"));
        assert!(is_assignment("_a9=1"));
        assert!(is_assignment("a[1]=x"));
        assert!(is_assignment("a+=x"));
        assert!(!is_assignment("--opt=x"));
        assert!(!is_assignment("9a=1"));
        assert!(!is_assignment("a"));
        assert!(!is_assignment("a[1"));
    }
}
