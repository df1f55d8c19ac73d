//! bash builtins that evaluate their arguments: a number is evaluated as
//! arithmetic and a variable name's subscript too (see `arith.rs`), so an
//! argument whose text the gate cannot see, or one that holds code in a
//! subscript, makes the command opaque. Builtins not listed here take their
//! arguments as plain strings (`echo`, `cd`, `pwd`, `type`, …); `test` and
//! `printf` evaluate only some (arithmetic compares and `-v`; numeric
//! conversions and `-v`). Callbacks that builtins run as code (`mapfile -C`,
//! `complete -C`) are read as shell strings in `simple.rs`.

use super::ParseError;
use super::grammar::Parser;
use crate::argv;

/// The builtins that declare variables: names, with `-i` values evaluated as
/// arithmetic and `-n` values naming other variables.
const DECLARERS: &[&str] = &["declare", "typeset", "local", "export", "readonly"];

/// Builtins whose operands (options aside) are numbers or job specs, all
/// evaluated as arithmetic.
const NUMBERS: &[&str] = &[
    "shift", "exit", "return", "break", "continue", "wait", "history", "jobs", "fg", "bg",
    "disown", "suspend", "ulimit", "fc",
];

impl Parser<'_, '_> {
    /// Mark command `idx` opaque when a builtin in it evaluates an argument
    /// whose value berth cannot know.
    pub(super) fn evaluated_operands(
        &mut self,
        idx: usize,
        words: &[String],
        assigns: usize,
    ) -> Result<(), ParseError> {
        // Subscripts of assignments (`a[i]=x`, `a=([i]=x)`) are arithmetic.
        for w in &words[..assigns] {
            if let Some((name, value)) = super::assignment(w) {
                self.check_assignment(idx, name, value, Attrs::default());
            }
        }
        for view in argv::views(words) {
            let Some(prog) = view.first().map(String::as_str) else {
                continue;
            };
            let args = &view[1..];
            let why = match prog {
                "test" | "[" => self.test_operands(args),
                "let" => args.iter().find_map(|a| self.arith_unknown(a)),
                "printf" => self.printf_operands(args),
                "read" => self.option_operands(args, "a", "tnNu", "pdi", true),
                "mapfile" | "readarray" => self.option_operands(args, "", "nOscu", "dC", true),
                "getopts" => args.get(1).and_then(|n| self.name_unknown(n)),
                "unset" if !args.iter().any(|a| a.starts_with('-') && a.contains('f')) => args
                    .iter()
                    .filter(|a| !a.starts_with('-'))
                    .find_map(|a| self.name_unknown(a)),
                "kill" => self.kill_operands(args),
                "pushd" | "popd" => args
                    .iter()
                    .filter(|a| a.starts_with(['+', '-']) && a.len() > 1)
                    .find_map(|a| self.arith_unknown(&a[1..])),
                "trap" => args
                    .iter()
                    .skip(1)
                    .filter(|a| !a.starts_with('-'))
                    .find_map(|a| self.signal_unknown(a)),
                p if NUMBERS.contains(&p) => args
                    .iter()
                    .filter(|a| !a.starts_with('-') || a.len() == 1 || is_negative(a))
                    .filter(|a| !matches!(a.as_str(), "unlimited" | "soft" | "hard"))
                    .find_map(|a| self.arith_unknown(a.trim_start_matches('%'))),
                p if DECLARERS.contains(&p) => {
                    self.declarer_operands(idx, p, args);
                    None
                }
                _ => None,
            };
            if let Some(why) = why {
                self.sh.opaque.push(super::Opaque {
                    later: false,
                    command: Some(idx),
                    why: format!("`{prog}` evaluates its argument: {why}"),
                });
            }
        }
        Ok(())
    }

    /// `NAME[SUB]=VALUE`: the subscript, and for `-i`/`-n` the value.
    fn check_assignment(&mut self, idx: usize, name: &str, value: &str, attrs: Attrs) {
        let Attrs {
            int,
            nameref,
            assoc,
        } = attrs;
        // An associative array's keys are strings, not arithmetic.
        let plain = name.split('[').next().unwrap_or(name);
        if assoc {
            self.sh.assoc.insert(plain.to_string());
        }
        if nameref && self.sh.assoc.contains(value) {
            self.sh.assoc.insert(plain.to_string());
        }
        let assoc = assoc || self.sh.assoc.contains(plain);
        let mut why = self.name_unknown(if assoc { plain } else { name });
        if why.is_none() && value.starts_with('(') && !assoc {
            // `a=([i]=x …)`: each element's subscript.
            why = value
                .split_whitespace()
                .filter_map(|el| {
                    let el = el.trim_start_matches('(');
                    let body = el.strip_prefix('[')?;
                    let close = body.find("]=").or_else(|| body.find("]+="))?;
                    Some(body[..close].to_string())
                })
                .collect::<Vec<_>>()
                .iter()
                .find_map(|sub| self.arith_unknown(sub));
        } else if why.is_none() && int {
            why = self.arith_unknown(value);
        } else if why.is_none() && nameref {
            why = self.name_unknown(value);
        }
        if let Some(why) = why {
            self.sh.opaque.push(super::Opaque {
                later: false,
                command: Some(idx),
                why: format!("the assignment `{name}=…` evaluates: {why}"),
            });
        }
    }

    fn declarer_operands(&mut self, idx: usize, prog: &str, args: &[String]) {
        // `export -n` unexports; only these three take `-i` and `-n`.
        let attributes = matches!(prog, "declare" | "typeset" | "local");
        let mut attrs = Attrs::default();
        let mut functions = false;
        for a in args {
            if (a.starts_with('-') || a.starts_with('+')) && a.len() > 1 && a != "--" {
                let on = a.starts_with('-') && attributes;
                attrs.int |= on && a.contains('i');
                attrs.nameref |= on && a.contains('n');
                attrs.assoc |= on && a.contains('A');
                functions |= a.contains(['f', 'F']);
                continue;
            }
            if functions || a == "--" {
                continue;
            }
            match super::assignment(a) {
                Some((name, value)) => self.check_assignment(idx, name, value, attrs),
                None if attrs.assoc => {
                    self.sh.assoc.insert(a.clone());
                }
                None => {
                    if let Some(why) = self.name_unknown(a) {
                        self.sh.opaque.push(super::Opaque {
                            later: false,
                            command: Some(idx),
                            why: format!("a declaring builtin evaluates its argument: {why}"),
                        });
                    }
                }
            }
        }
    }

    /// `test`/`[`: the operands of the arithmetic compares, and `-v NAME`.
    fn test_operands(&mut self, args: &[String]) -> Option<String> {
        for (k, a) in args.iter().enumerate() {
            match a.as_str() {
                "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge" => {
                    let sides = [k.checked_sub(1).and_then(|p| args.get(p)), args.get(k + 1)];
                    for side in sides.into_iter().flatten() {
                        if let Some(why) = self.arith_unknown(side) {
                            return Some(why);
                        }
                    }
                }
                "-v" => {
                    if let Some(why) = args.get(k + 1).and_then(|n| self.name_unknown(n)) {
                        return Some(why);
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// `printf [-v NAME] FORMAT ARGS`: the name, and the arguments when the
    /// format has a numeric conversion (or berth cannot see the format).
    fn printf_operands(&mut self, args: &[String]) -> Option<String> {
        let mut i = 0;
        while let Some(a) = args.get(i) {
            if a == "--" {
                i += 1;
                break;
            }
            if let Some(v) = a.strip_prefix("-v") {
                let name = if v.is_empty() {
                    i += 1;
                    args.get(i)?.clone()
                } else {
                    v.to_string()
                };
                if let Some(why) = self.name_unknown(&name) {
                    return Some(why);
                }
                i += 1;
                continue;
            }
            break;
        }
        let format = args.get(i)?;
        let rest = args.get(i + 1..).unwrap_or(&[]);
        if rest.is_empty() || !numeric_format(format) {
            return None;
        }
        rest.iter().find_map(|a| self.arith_unknown(a))
    }

    /// `read`/`mapfile` options: `names` take a variable name, `numbers` a
    /// number, `strings` a plain string; with `operands`, the words after the
    /// options are variable names.
    fn option_operands(
        &mut self,
        args: &[String],
        names: &str,
        numbers: &str,
        strings: &str,
        operands: bool,
    ) -> Option<String> {
        let mut i = 0;
        while let Some(a) = args.get(i) {
            i += 1;
            if a == "--" {
                break;
            }
            let Some(letters) = a.strip_prefix('-').filter(|l| !l.is_empty()) else {
                i -= 1;
                break;
            };
            for (k, l) in letters.char_indices() {
                let takes = names.contains(l) || numbers.contains(l) || strings.contains(l);
                if !takes {
                    continue;
                }
                let attached = &letters[k + l.len_utf8()..];
                let value = if attached.is_empty() {
                    i += 1;
                    args.get(i - 1).cloned()
                } else {
                    Some(attached.to_string())
                };
                let Some(value) = value else { break };
                let why = if names.contains(l) {
                    self.name_unknown(&value)
                } else if numbers.contains(l) {
                    self.arith_unknown(&value)
                } else {
                    None
                };
                if why.is_some() {
                    return why;
                }
                break;
            }
        }
        if !operands {
            return None;
        }
        args.get(i..)
            .unwrap_or(&[])
            .iter()
            .find_map(|a| self.name_unknown(a))
    }

    /// `kill [-s SIG | -n NUM | -SIG] PID|JOB…`: signal numbers and pids are
    /// evaluated as arithmetic; a signal name is looked up first.
    fn kill_operands(&mut self, args: &[String]) -> Option<String> {
        let mut i = 0;
        let mut options = true;
        while let Some(a) = args.get(i) {
            i += 1;
            if options && a == "--" {
                options = false;
                continue;
            }
            if options && matches!(a.as_str(), "-s" | "-n") {
                let v = args.get(i)?;
                i += 1;
                if let Some(why) = self.signal_unknown(v) {
                    return Some(why);
                }
                continue;
            }
            if options && a.starts_with('-') && a.len() > 1 && !is_negative(a) {
                if matches!(a.as_str(), "-l" | "-L") {
                    return None;
                }
                if let Some(why) = self.signal_unknown(&a[1..]) {
                    return Some(why);
                }
                continue;
            }
            options = false;
            let pid = a.trim_start_matches('%');
            if pid.is_empty() || matches!(pid, "%" | "+" | "-") {
                continue;
            }
            if let Some(why) = self.arith_unknown(pid) {
                return Some(why);
            }
        }
        None
    }

    /// A signal given by name (`TERM`, `SIGKILL`, `EXIT`) is looked up, not
    /// evaluated; anything else is read as a number.
    fn signal_unknown(&mut self, sig: &str) -> Option<String> {
        let upper = sig.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        let known = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-')
            && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
        if known {
            return None;
        }
        self.arith_unknown(sig)
    }
}

/// The attributes a declaring builtin gives the variables it names.
#[derive(Clone, Copy, Default)]
struct Attrs {
    /// `-i`: values are evaluated as arithmetic.
    int: bool,
    /// `-n`: values name other variables.
    nameref: bool,
    /// `-A`: subscripts are strings.
    assoc: bool,
}

/// Whether `w` is a negative number (`-1`, `-4321`): an operand, not an option.
fn is_negative(w: &str) -> bool {
    w.strip_prefix('-')
        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
}

/// Whether a printf format holds a numeric conversion, or a `*` width or
/// precision, whose argument bash evaluates as arithmetic. A format berth
/// cannot see (`$fmt`) may hold one.
fn numeric_format(format: &str) -> bool {
    if format.contains('$') || format.contains('`') {
        return true;
    }
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            continue;
        }
        for d in chars.by_ref() {
            if d == '*' {
                return true;
            }
            if d.is_ascii_alphabetic() {
                if "diouxXaAeEfFgG".contains(d) {
                    return true;
                }
                break;
            }
        }
    }
    false
}

/// Code that builtins in `argv` run as callbacks: `mapfile -C CODE`,
/// `complete -C CODE`, and `compgen -W`/`complete -W` word lists, which bash
/// expands (running their substitutions) each time they are used.
pub(super) fn callbacks(argv: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for view in argv::views(argv) {
        let Some(prog) = view.first().map(String::as_str) else {
            continue;
        };
        let (code_opts, list_opts): (&str, &str) = match prog {
            "mapfile" | "readarray" => ("C", ""),
            "complete" | "compgen" => ("C", "W"),
            _ => continue,
        };
        let args = &view[1..];
        let mut i = 0;
        while let Some(a) = args.get(i) {
            i += 1;
            let Some(letters) = a.strip_prefix('-').filter(|l| !l.is_empty()) else {
                continue;
            };
            if let Some(k) = letters.find(|l: char| code_opts.contains(l) || list_opts.contains(l))
            {
                let l = &letters[k..k + 1];
                let attached = &letters[k + 1..];
                let value = if attached.is_empty() {
                    i += 1;
                    args.get(i - 1).cloned()
                } else {
                    Some(attached.to_string())
                };
                if let Some(v) = value {
                    out.push(if list_opts.contains(l) {
                        format!(": {v}")
                    } else {
                        v
                    });
                }
            }
        }
    }
    out
}
