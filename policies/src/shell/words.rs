//! bash's words: quoting, backslashes, `$'…'`, parameter expansions,
//! substitutions, arithmetic, globs, brace expansion and array assignments,
//! read the way bash's tokeniser reads them. Each word comes back after quote
//! removal with whether it is a literal, that is whether bash runs exactly that
//! text (no expansion, substitution, glob or brace expansion in it).

use super::Via;
use super::grammar::{Parser, is_name};
use super::{ParseError, is_meta};

impl Parser<'_, '_> {
    /// One word, with quotes removed and substitutions read (and recorded), and
    /// whether it is a literal.
    pub(super) fn word(&mut self) -> Result<(String, bool), ParseError> {
        self.word_allowing_array(false)
    }

    /// A word; with `arrays`, `NAME=(…)` and `NAME+=(…)` are read whole.
    pub(super) fn word_allowing_array(
        &mut self,
        arrays: bool,
    ) -> Result<(String, bool), ParseError> {
        let outer = std::mem::replace(&mut self.expanded, false);
        let r = self.word_inner(arrays);
        let literal = !self.expanded;
        self.expanded = outer;
        r.map(|w| (w, literal))
    }

    fn word_inner(&mut self, arrays: bool) -> Result<String, ParseError> {
        let mut out = String::new();
        // Where the last unquoted `{` sits in `out`: a `}` after it makes a
        // brace expansion only with a `,` or `..` between (`{}` is literal).
        let mut brace: Option<usize> = None;
        let mut bracket = false;
        // Whether the last character of `out` came from unquoted text.
        let mut last_bare = false;
        while let Some(c) = self.peek() {
            match c {
                '<' | '>' if self.peek_at(1) == Some('(') => {
                    let from = self.i;
                    self.i += 2;
                    self.expanded = true;
                    self.nested_list(Via::ProcSubst)?;
                    out.push_str(&self.text(from, self.i));
                    last_bare = false;
                    continue;
                }
                '(' if arrays && is_array_start(&out) => {
                    self.array_value(&mut out)?;
                    last_bare = false;
                    continue;
                }
                '(' if last_bare && out.ends_with(['?', '*', '+', '@', '!']) => {
                    // An extglob pattern, `@(a|b)`.
                    self.expanded = true;
                    let from = self.i;
                    self.balanced_parens()?;
                    out.push_str(&self.text(from, self.i));
                    continue;
                }
                c if is_meta(c) => break,
                '\\' => {
                    match self.peek_at(1) {
                        Some('\n') => {}
                        Some(n) => out.push(n),
                        None => {}
                    }
                    self.i += 2;
                    last_bare = false;
                    continue;
                }
                '\'' => {
                    self.i += 1;
                    loop {
                        match self.peek() {
                            None => return Err(self.err("unterminated single quote")),
                            Some('\'') => {
                                self.i += 1;
                                break;
                            }
                            Some(ch) => {
                                out.push(ch);
                                self.i += 1;
                            }
                        }
                    }
                    last_bare = false;
                    continue;
                }
                '"' => {
                    self.dquote(&mut out)?;
                    last_bare = false;
                    continue;
                }
                '$' => {
                    self.dollar(&mut out, false)?;
                    last_bare = false;
                    continue;
                }
                '`' => {
                    self.backtick(&mut out, false)?;
                    last_bare = false;
                    continue;
                }
                '*' | '?' => self.expanded = true,
                '[' => bracket = true,
                ']' if bracket => self.expanded = true,
                '{' => brace = Some(out.len()),
                '}' => {
                    if let Some(at) = brace
                        && out
                            .get(at..)
                            .is_some_and(|b| b.contains(',') || b.contains(".."))
                    {
                        self.expanded = true;
                    }
                }
                _ => {}
            }
            out.push(c);
            self.i += 1;
            last_bare = true;
        }
        Ok(out)
    }

    /// `(…)` of an array assignment; the cursor is on `(`.
    fn array_value(&mut self, out: &mut String) -> Result<(), ParseError> {
        let from = self.i;
        self.i += 1;
        loop {
            loop {
                self.skip_blanks();
                match self.peek() {
                    Some('\n') => self.newline()?,
                    Some('#') => {
                        while self.peek().is_some_and(|c| c != '\n') {
                            self.i += 1;
                        }
                    }
                    _ => break,
                }
            }
            match self.peek() {
                None => return Err(self.err("unterminated array assignment `(`")),
                Some(')') => {
                    self.i += 1;
                    break;
                }
                Some(c) => {
                    let at = self.i;
                    self.word()?;
                    if self.i == at {
                        return Err(self.err(format!("unexpected `{c}` in an array assignment")));
                    }
                }
            }
        }
        out.push_str(&self.text(from, self.i));
        Ok(())
    }

    /// Skip `(…)` with nesting, quotes and substitutions; the cursor is on `(`.
    fn balanced_parens(&mut self) -> Result<(), ParseError> {
        let mut level = 0usize;
        let mut sink = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("missing `)`")),
                Some('(') => level += 1,
                Some(')') => {
                    level -= 1;
                    if level == 0 {
                        self.i += 1;
                        return Ok(());
                    }
                }
                Some('\'' | '"' | '$' | '`') => {
                    self.word_part(&mut sink)?;
                    continue;
                }
                Some('\\') => self.i += 1,
                _ => {}
            }
            self.i += 1;
        }
    }

    /// One quoted part or expansion at the cursor (`'…'`, `"…"`, `$…`, `` `…` ``).
    pub(super) fn word_part(&mut self, out: &mut String) -> Result<(), ParseError> {
        match self.peek() {
            Some('\'') => {
                self.i += 1;
                while let Some(c) = self.peek() {
                    self.i += 1;
                    if c == '\'' {
                        return Ok(());
                    }
                    out.push(c);
                }
                Err(self.err("unterminated single quote"))
            }
            Some('"') => self.dquote(out),
            Some('$') => self.dollar(out, false),
            Some('`') => self.backtick(out, false),
            _ => {
                self.i += 1;
                Ok(())
            }
        }
    }

    pub(super) fn dquote(&mut self, out: &mut String) -> Result<(), ParseError> {
        self.enter()?;
        let r = self.dquote_body(out);
        self.leave();
        r
    }

    fn dquote_body(&mut self, out: &mut String) -> Result<(), ParseError> {
        self.i += 1;
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated double quote")),
                Some('"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some('\\') => {
                    match self.peek_at(1) {
                        Some('\n') => {}
                        Some(n @ ('$' | '`' | '"' | '\\')) => out.push(n),
                        Some(n) => {
                            out.push('\\');
                            out.push(n);
                        }
                        None => return Err(self.err("unterminated double quote")),
                    }
                    self.i += 2;
                }
                Some('$') => self.dollar(out, true)?,
                Some('`') => self.backtick(out, true)?,
                Some(c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    pub(super) fn dollar(&mut self, out: &mut String, quoted: bool) -> Result<(), ParseError> {
        let start = self.i;
        match self.peek_at(1) {
            Some('(') if self.peek_at(2) == Some('(') => {
                self.i += 3;
                self.expanded = true;
                self.arithmetic("))")?;
                out.push_str(&self.text(start, self.i));
            }
            Some('(') => {
                self.i += 2;
                self.expanded = true;
                self.nested_list(Via::Subst)?;
                out.push_str(&self.text(start, self.i));
            }
            Some('[') => {
                // `$[…]`, bash's old arithmetic.
                self.i += 2;
                self.expanded = true;
                let from = self.i;
                while self.peek().is_some_and(|c| c != ']') {
                    self.i += 1;
                }
                if self.peek().is_none() {
                    return Err(self.err("unterminated `$[`"));
                }
                let body = self.text(from, self.i);
                self.i += 1;
                if let Some(why) = self.arith_unknown(&body) {
                    self.evaluated_opaque(why);
                }
                if body.contains(['$', '`']) {
                    let ctx = super::grammar::Ctx {
                        parent: self.cur,
                        via: Via::Subst,
                        ..self.ctx.clone()
                    };
                    super::grammar::scan_expansions(&body, self.sh, ctx, self.depth + 1)?;
                }
                self.sh.state.push("arithmetic can assign variables");
                out.push_str(&self.text(start, self.i));
            }
            Some('{') => self.parameter(out, quoted)?,
            Some('\'') if !quoted => {
                self.i += 2;
                self.ansi_c(out)?;
            }
            Some('"') if !quoted => {
                self.i += 1;
                self.dquote(out)?;
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                self.i += 1;
                let ns = self.i;
                while matches!(self.peek(), Some(c) if c.is_ascii_alphanumeric() || c == '_') {
                    self.i += 1;
                }
                let name = self.text(ns, self.i);
                self.push_var(out, &name, quoted);
            }
            Some(c) if c.is_ascii_digit() || "@*#?$!-".contains(c) => {
                self.i += 2;
                self.expanded = true;
                out.push_str(&self.text(start, self.i));
            }
            _ => {
                out.push('$');
                self.i += 1;
            }
        }
        Ok(())
    }

    /// `${…}`, read with bash's nesting: quotes, `$(…)`, backticks and inner
    /// `${…}` inside it are followed, and their commands recorded.
    fn parameter(&mut self, out: &mut String, quoted: bool) -> Result<(), ParseError> {
        self.enter()?;
        let r = self.parameter_body(out, quoted);
        self.leave();
        r
    }

    fn parameter_body(&mut self, out: &mut String, quoted: bool) -> Result<(), ParseError> {
        let start = self.i;
        self.i += 2;
        self.expanded = true;
        // bash 5.3 reads `${ list; }` and `${| list; }` as commands run in the
        // shell itself, not in a subshell as `$(…)` is: they can change its
        // state and define functions. Older bash refuses them as a bad
        // substitution. Read the list, so its commands are judged, and count
        // it as opaque.
        if matches!(self.peek(), Some(' ' | '\t' | '\n' | '|')) {
            if self.peek() == Some('|') {
                self.i += 1;
            }
            self.sh.opaque.push(super::Opaque { later: false,
                command: self.cur,
                why: "`${ …; }` runs commands in the shell itself (bash 5.3), where berth cannot follow them".into(),
            });
            self.nested_group(Via::Subst)?;
            out.push_str(&self.text(start, self.i));
            return Ok(());
        }
        let body_start = self.i;
        let mut level = 1usize;
        let mut sink = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated `${`")),
                Some('\\') => self.i += 2,
                Some('\'') if !quoted => self.word_part(&mut sink)?,
                Some('"') => self.dquote(&mut sink)?,
                Some('$') => self.dollar(&mut sink, true)?,
                Some('`') => self.backtick(&mut sink, true)?,
                Some('{') => {
                    level += 1;
                    self.i += 1;
                }
                Some('}') => {
                    level -= 1;
                    if level == 0 {
                        break;
                    }
                    self.i += 1;
                }
                Some(_) => self.i += 1,
            }
        }
        let body = self.text(body_start, self.i);
        self.i += 1;
        self.parameter_evaluates(&body);
        if is_name(&body) {
            self.push_var(out, &body, quoted);
            return Ok(());
        }
        // `${x@P}` expands the value as a prompt, which runs the substitutions
        // in it: read a known value's, and treat an unknown one like `eval`.
        if let Some(name) = body.strip_suffix("@P") {
            let known = is_name(name)
                .then(|| self.sh.vars.get(name).cloned())
                .flatten();
            match known {
                Some(value) => {
                    let ctx = super::grammar::Ctx {
                        parent: self.cur,
                        via: Via::Subst,
                        ..self.ctx.clone()
                    };
                    super::grammar::scan_expansions(&value, self.sh, ctx, self.depth + 1)?;
                    self.push_var(out, name, quoted);
                }
                None => {
                    self.sh.opaque.push(super::Opaque { later: false,
                        command: self.cur,
                        why: format!(
                            "`${{{body}}}` expands a value as a prompt, running the substitutions in it, and berth cannot see the value"
                        ),
                    });
                    out.push_str(&self.text(start, self.i));
                }
            }
            return Ok(());
        }
        // `${x=y}`, `${x:=y}` (and for arrays `${a[i]:=y}`) assign.
        let name_end = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(body.len());
        let mut rest = &body[name_end..];
        if rest.starts_with('[')
            && let Some(close) = rest.find(']')
        {
            rest = &rest[close + 1..];
        }
        if name_end > 0 && (rest.starts_with('=') || rest.starts_with(":=")) {
            self.sh.state.push("`${name:=value}` assigns");
        }
        out.push_str(&self.text(start, self.i));
        Ok(())
    }

    /// What `${BODY}` evaluates besides the value it expands: an indirect
    /// `${!x}` names a variable (and its subscript) by `x`'s value, a
    /// subscript `${a[i]}` and the offset and length of `${x:1:n}` are
    /// arithmetic. Each whose value berth cannot know makes it opaque.
    fn parameter_evaluates(&mut self, body: &str) {
        if let Some(name) = body.strip_prefix('!')
            && is_name(name)
        {
            let named = self.sh.vars.get(name).cloned();
            let why = match named {
                Some(v) => self.name_unknown(&v),
                None => Some(format!(
                    "`${{!{name}}}` expands the variable that `{name}` names, and berth cannot see which"
                )),
            };
            if let Some(why) = why {
                self.evaluated_opaque(why);
            }
            return;
        }
        let name_end = body
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(body.len());
        if name_end == 0 || !is_name(&body[..name_end]) {
            return;
        }
        let mut rest = &body[name_end..];
        let assoc = self.sh.assoc.contains(&body[..name_end]);
        if rest.starts_with('[')
            && let Some(close) = rest.rfind(']')
        {
            let sub = &rest[1..close];
            if sub != "@"
                && sub != "*"
                && !assoc
                && let Some(why) = self.arith_unknown(sub)
            {
                self.evaluated_opaque(why);
            }
            rest = &rest[close + 1..];
        }
        if let Some(range) = rest.strip_prefix(':')
            && !range.starts_with(['-', '=', '?', '+'])
        {
            for part in range.splitn(2, ':') {
                if let Some(why) = self.arith_unknown(part) {
                    self.evaluated_opaque(why);
                    break;
                }
            }
        }
    }

    fn push_var(&mut self, out: &mut String, name: &str, quoted: bool) {
        self.expanded = true;
        // `IFS` the text has not set holds bash's default, blank, tab and
        // newline: `rm${IFS}-rf${IFS}/` is `rm -rf /`, and is judged so.
        let value = match (self.sh.vars.get(name), name) {
            (Some(v), _) => Some(v.as_str()),
            (None, "IFS") => Some(" \t\n"),
            (None, _) => None,
        };
        match value {
            Some(v) => {
                out.push_str(v);
                if !quoted {
                    self.split_word = true;
                }
            }
            None => {
                out.push('$');
                out.push_str(name);
            }
        }
    }

    /// `$'…'` with C escapes; the cursor is just past the opening quote.
    fn ansi_c(&mut self, out: &mut String) -> Result<(), ParseError> {
        loop {
            let Some(c) = self.peek() else {
                return Err(self.err("unterminated $'…' string"));
            };
            self.i += 1;
            match c {
                '\'' => return Ok(()),
                '\\' => {
                    let Some(e) = self.peek() else {
                        return Err(self.err("unterminated $'…' string"));
                    };
                    self.i += 1;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        'a' => out.push('\x07'),
                        'b' => out.push('\x08'),
                        'e' | 'E' => out.push('\x1b'),
                        'f' => out.push('\x0c'),
                        'v' => out.push('\x0b'),
                        'c' => {
                            // `\cX`: a control character.
                            let x = self.peek().unwrap_or('@');
                            self.i += 1;
                            out.push(char::from_u32((x as u32) & 0x1f).unwrap_or('\u{fffd}'));
                        }
                        'x' => {
                            let v = self.radix_digits(16, 2);
                            out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                        }
                        'u' | 'U' => {
                            let v = self.radix_digits(16, if e == 'u' { 4 } else { 8 });
                            out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                        }
                        '0'..='7' => {
                            self.i -= 1;
                            let v = self.radix_digits(8, 3);
                            out.push(char::from_u32(v).unwrap_or('\u{fffd}'));
                        }
                        other => out.push(other),
                    }
                }
                other => out.push(other),
            }
        }
    }

    fn radix_digits(&mut self, radix: u32, max: usize) -> u32 {
        let mut v = 0u32;
        for _ in 0..max {
            match self.peek().and_then(|c| c.to_digit(radix)) {
                Some(d) => {
                    v = v.saturating_mul(radix).saturating_add(d);
                    self.i += 1;
                }
                None => break,
            }
        }
        v
    }

    pub(super) fn backtick(&mut self, out: &mut String, quoted: bool) -> Result<(), ParseError> {
        let start = self.i;
        self.i += 1;
        self.expanded = true;
        let mut inner = String::new();
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated backquote")),
                Some('`') => {
                    self.i += 1;
                    break;
                }
                Some('\\') => {
                    match self.peek_at(1) {
                        Some(n @ ('`' | '\\' | '$')) => inner.push(n),
                        Some('"') if quoted => inner.push('"'),
                        Some(n) => {
                            inner.push('\\');
                            inner.push(n);
                        }
                        None => return Err(self.err("unterminated backquote")),
                    }
                    self.i += 2;
                }
                Some(c) => {
                    inner.push(c);
                    self.i += 1;
                }
            }
        }
        let ctx = super::grammar::Ctx {
            parent: self.cur,
            via: Via::Subst,
            ..self.ctx.clone()
        };
        super::grammar::parse_into(&inner, self.sh, ctx, self.depth + 1)?;
        out.push_str(&self.text(start, self.i));
        Ok(())
    }

    /// A redirection operator at the cursor (with an optional fd number or
    /// `{name}`), consumed.
    pub(super) fn redirect_op(&mut self) -> Option<(String, String)> {
        let start = self.i;
        let mut k = 0;
        if self.peek() == Some('{') {
            k = 1;
            while matches!(self.peek_at(k), Some(c) if c.is_ascii_alphanumeric() || c == '_') {
                k += 1;
            }
            if k == 1
                || self.peek_at(k) != Some('}')
                || !matches!(self.peek_at(k + 1), Some('<' | '>'))
            {
                return None;
            }
            k += 1;
        } else {
            while matches!(self.peek_at(k), Some(c) if c.is_ascii_digit()) {
                k += 1;
            }
        }
        let rest: String = (0..3).filter_map(|j| self.peek_at(k + j)).collect();
        const OPS: &[&str] = &[
            "<<<", "<<-", "&>>", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "<", ">",
        ];
        for op in OPS {
            if rest.starts_with(op) {
                if k > 0 && op.starts_with('&') {
                    return None;
                }
                // `<(` and `>(` are process substitutions, read as words.
                if (*op == "<" || *op == ">") && rest[1..].starts_with('(') {
                    return None;
                }
                self.i = start + k + op.len();
                return Some((self.text(start, start + k), (*op).to_string()));
            }
        }
        None
    }
}

/// Whether `out` is `NAME=`, `NAME+=` or `NAME[…]=` (and `+=`), so a `(`
/// after it opens an array.
fn is_array_start(out: &str) -> bool {
    let Some(head) = out.strip_suffix('=') else {
        return false;
    };
    let head = head.strip_suffix('+').unwrap_or(head);
    let name = match head.find('[') {
        Some(i) if head.ends_with(']') => &head[..i],
        Some(_) => return false,
        None => head,
    };
    is_name(name)
}
