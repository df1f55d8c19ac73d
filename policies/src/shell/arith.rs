//! Text bash evaluates as arithmetic, and the names whose values it reads.
//!
//! bash evaluates arithmetic in `((…))`, `$((…))`, `$[…]`, `let`, the
//! arithmetic compares of `[[ … ]]` and `test`, array subscripts, `${x:off}`
//! and every builtin that takes a number or a variable name (`kill`, `shift`,
//! `read -t`, `printf -v`, `unset`, `declare`, …). Evaluating a name reads its
//! value as arithmetic in turn, and a subscript in that value runs the
//! command substitutions in it: with `x='a[$(rm f)]'`, `$((x))` runs `rm f`.
//! So arithmetic is read, not trusted: every name it reads must hold a value
//! the gate knows to be a number (a literal assigned earlier in the text, or
//! a name the arithmetic itself assigned), and every expansion in it must be
//! one whose value is a number (`$?`, `$#`, `${#x}`, a nested `$((…))`).
//! Anything else makes the command opaque.

use super::grammar::{Parser, is_name};

/// Names bash keeps read-only and always numeric.
const READONLY_NUMBERS: &[&str] = &["PPID", "UID", "EUID"];

impl Parser<'_, '_> {
    /// Whether the gate knows `name` holds a number.
    fn known_number(&self, name: &str) -> bool {
        match self.sh.vars.get(name) {
            Some(v) => is_number(v.trim()),
            None => self.sh.numeric.contains(name) || READONLY_NUMBERS.contains(&name),
        }
    }

    /// Record that the command being read may not be what its text says
    /// because of `why`.
    pub(super) fn evaluated_opaque(&mut self, why: String) {
        let command = self.cur.or(self.ctx.parent);
        // Arithmetic at command position in a function's body runs when the
        // function is called, and a call is read where it is made.
        let later = command.is_none() && self.ctx.function.is_some();
        self.sh.opaque.push(super::Opaque {
            later,
            command,
            why,
        });
    }

    /// The first part of arithmetic `text` whose value the gate cannot know,
    /// described; `None` when every name and expansion in it holds a known
    /// number. Names the text assigns with `=` count as numbers after it.
    pub(super) fn arith_unknown(&mut self, text: &str) -> Option<String> {
        let s: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < s.len() {
            let c = s[i];
            if c == '`' {
                return Some(format!("`{text}` holds a command's output"));
            }
            if c == '$' {
                let (next, why) = self.arith_dollar(&s, i);
                if why.is_some() {
                    return why;
                }
                i = next;
                continue;
            }
            if c.is_ascii_digit() {
                // A number in any base: `10`, `0x1f`, `16#ff`, `64#_@`.
                while i < s.len()
                    && (s[i].is_ascii_alphanumeric() || matches!(s[i], '#' | '_' | '@'))
                {
                    i += 1;
                }
                continue;
            }
            if c.is_ascii_alphabetic() || c == '_' {
                let start = i;
                while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '_') {
                    i += 1;
                }
                let name: String = s[start..i].iter().collect();
                let mut k = i;
                let subscript = s.get(k) == Some(&'[');
                if subscript {
                    // The subscript is scanned as arithmetic in its turn.
                    let mut level = 0usize;
                    while k < s.len() {
                        match s[k] {
                            '[' => level += 1,
                            ']' => {
                                level -= 1;
                                if level == 0 {
                                    k += 1;
                                    break;
                                }
                            }
                            _ => {}
                        }
                        k += 1;
                    }
                }
                let mut after = k;
                while after < s.len() && s[after].is_whitespace() {
                    after += 1;
                }
                let assigns = s.get(after) == Some(&'=') && s.get(after + 1) != Some(&'=');
                if assigns {
                    if !subscript {
                        self.sh.numeric.insert(name);
                    }
                    continue;
                }
                if subscript || !self.known_number(&name) {
                    let shown: String = s[start..k].iter().collect();
                    return Some(format!(
                        "`{shown}` is read as arithmetic, and berth cannot know its value"
                    ));
                }
                continue;
            }
            i += 1;
        }
        None
    }

    /// A `$` expansion inside arithmetic at `s[i]`: where scanning goes on,
    /// and why its value is unknown, if it is.
    fn arith_dollar(&self, s: &[char], i: usize) -> (usize, Option<String>) {
        let unknown = |what: String| {
            Some(format!(
                "`{what}` is read as arithmetic, and berth cannot know its value"
            ))
        };
        match s.get(i + 1).copied() {
            Some('?' | '#' | '$' | '!') => (i + 2, None),
            Some('(') if s.get(i + 2) == Some(&'(') => {
                // A nested `$((…))`, read on its own: its value is a number.
                let mut level = 0usize;
                let mut k = i + 1;
                while k < s.len() {
                    match s[k] {
                        '(' => level += 1,
                        ')' => {
                            level -= 1;
                            if level == 0 {
                                return (k + 1, None);
                            }
                        }
                        _ => {}
                    }
                    k += 1;
                }
                (s.len(), None)
            }
            Some('(') => (i, unknown("$(…)".into())),
            Some('{') => {
                let end = s[i..]
                    .iter()
                    .position(|&c| c == '}')
                    .map_or(s.len(), |p| i + p);
                let body: String = s[(i + 2).min(end)..end].iter().collect();
                let known = (body.starts_with('#') && is_name(&body[1..]))
                    || (is_name(&body) && self.known_number(&body));
                (
                    end + 1,
                    (!known).then(|| {
                        format!(
                            "`${{{body}}}` is read as arithmetic, and berth cannot know its value"
                        )
                    }),
                )
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let mut k = i + 1;
                while k < s.len() && (s[k].is_ascii_alphanumeric() || s[k] == '_') {
                    k += 1;
                }
                let name: String = s[i + 1..k].iter().collect();
                let known = self.known_number(&name);
                (
                    k,
                    (!known).then(|| {
                        format!("`${name}` is read as arithmetic, and berth cannot know its value")
                    }),
                )
            }
            Some(c) => (i + 2, unknown(format!("${c}"))),
            None => (i + 1, None),
        }
    }

    /// The first part of `word`, a variable name a builtin evaluates (`NAME`
    /// or `NAME[SUBSCRIPT]`), whose value the gate cannot know, described.
    pub(super) fn name_unknown(&mut self, word: &str) -> Option<String> {
        if is_name(word) {
            return None;
        }
        if let Some(open) = word.find('[')
            && word.ends_with(']')
            && is_name(&word[..open])
        {
            let sub = &word[open + 1..word.len() - 1];
            if sub == "@" || sub == "*" {
                return None;
            }
            return self
                .arith_unknown(sub)
                .map(|why| format!("the subscript of `{word}` is evaluated as arithmetic: {why}"));
        }
        Some(format!(
            "`{word}` is evaluated as a variable name, and berth cannot read what it names"
        ))
    }
}

/// Whether `v` is a decimal integer.
pub(super) fn is_number(v: &str) -> bool {
    let d = v.strip_prefix(['-', '+']).unwrap_or(v);
    !d.is_empty() && d.chars().all(|c| c.is_ascii_digit())
}
