//! bash's compound commands: `((…))`, `[[ … ]]`, `for`/`select`, `case`,
//! function bodies, and the redirections that may follow any of them.

use super::ParseError;
use super::grammar::{Ctx, End, Parser, Stops, is_name};
use super::{Via, is_blank};

impl Parser<'_, '_> {
    /// Redirections after a compound command, held by a command of no words.
    pub(super) fn compound_tail(&mut self) -> Result<(), ParseError> {
        let idx = self.push_command()?;
        let saved_cur = self.cur.replace(idx);
        let r = (|| loop {
            self.skip_blanks();
            if !self.redirection(idx)? {
                return Ok(());
            }
        })();
        self.cur = saved_cur;
        r
    }

    /// `((…))` or `$((…))` whose opening has been consumed, up to `close`.
    pub(super) fn arithmetic(&mut self, close: &str) -> Result<String, ParseError> {
        let start = self.i;
        let mut level = 0usize;
        loop {
            match self.peek() {
                None => return Err(self.err("unterminated arithmetic")),
                Some('(') => level += 1,
                Some(')') if level == 0 => break,
                Some(')') => level -= 1,
                _ => {}
            }
            self.i += 1;
        }
        let body = self.text(start, self.i);
        let closing: Vec<char> = close.chars().collect();
        if !closing
            .iter()
            .enumerate()
            .all(|(k, c)| self.peek_at(k) == Some(*c))
        {
            return Err(self.err("unterminated arithmetic"));
        }
        self.i += closing.len();
        if let Some(why) = self.arith_unknown(&body) {
            self.evaluated_opaque(why);
        }
        if body.contains(['$', '`']) {
            let ctx = Ctx {
                parent: self.cur.or(self.ctx.parent),
                via: Via::Subst,
                ..self.ctx.clone()
            };
            super::grammar::scan_expansions(&body, self.sh, ctx, self.depth + 1)?;
        }
        // A name in arithmetic can hold an assignment; only digits and
        // operators without `=` are sure to leave the state alone.
        if body
            .chars()
            .any(|c| c.is_alphabetic() || "_=$[`".contains(c))
            || body.contains("++")
            || body.contains("--")
        {
            self.sh.state.push("arithmetic can assign variables");
        }
        Ok(body)
    }

    /// `[[ … ]]` whose opening has been consumed.
    pub(super) fn conditional(&mut self) -> Result<(), ParseError> {
        let idx = self.push_command()?;
        let saved_cur = self.cur.replace(idx);
        let r = self.conditional_words();
        self.cur = saved_cur;
        r
    }

    pub(super) fn conditional_words(&mut self) -> Result<(), ParseError> {
        let mut after_regex_op = false;
        // The word before an operator, and an arithmetic operator waiting
        // for its right operand.
        let mut last: Option<String> = None;
        let mut pending: Option<String> = None;
        loop {
            loop {
                self.skip_blanks();
                if self.peek() == Some('\n') {
                    self.newline()?;
                } else {
                    break;
                }
            }
            let Some(c) = self.peek() else {
                return Err(self.err("missing `]]`"));
            };
            if self.at_word("]]") {
                self.i += 2;
                return Ok(());
            }
            if after_regex_op {
                // The right side of `=~` is read to a blank, with `(`, `)`
                // and `|` as part of it.
                after_regex_op = false;
                let mut depth = 0usize;
                let mut sink = String::new();
                while let Some(c) = self.peek() {
                    match c {
                        '(' => depth += 1,
                        ')' if depth > 0 => depth -= 1,
                        c if (is_blank(c) || c == '\n') && depth == 0 => break,
                        '\\' => self.i += 1,
                        '\'' | '"' | '$' | '`' => {
                            self.word_part(&mut sink)?;
                            continue;
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                continue;
            }
            if matches!(c, '(' | ')' | '!' | '<' | '>') {
                self.i += 1;
                continue;
            }
            if (c == '&' && self.peek_at(1) == Some('&'))
                || (c == '|' && self.peek_at(1) == Some('|'))
            {
                self.i += 2;
                continue;
            }
            let (w, _) = self.word()?;
            if w.is_empty() {
                return Err(self.err(format!("unexpected `{c}` in `[[ … ]]`")));
            }
            match w.as_str() {
                "=~" => after_regex_op = true,
                // Arithmetic comparisons evaluate their operands, which can assign.
                "-eq" | "-ne" | "-lt" | "-le" | "-gt" | "-ge" | "-v" => {
                    self.sh.state.push("`[[ … ]]` evaluates arithmetic");
                    if w != "-v"
                        && let Some(left) = &last
                        && let Some(why) = self.arith_unknown(left)
                    {
                        self.evaluated_opaque(why);
                    }
                    pending = Some(w.clone());
                    last = Some(w);
                    continue;
                }
                _ => {}
            }
            match pending.take().as_deref() {
                Some("-v") => {
                    if let Some(why) = self.name_unknown(&w) {
                        self.evaluated_opaque(why);
                    }
                }
                Some(_) => {
                    if let Some(why) = self.arith_unknown(&w) {
                        self.evaluated_opaque(why);
                    }
                }
                None => {}
            }
            last = Some(w);
        }
    }

    pub(super) fn for_clause(&mut self) -> Result<(), ParseError> {
        self.skip_blanks();
        self.sh.state.push("`for` assigns its loop variable");
        if self.peek() == Some('(') && self.peek_at(1) == Some('(') {
            self.i += 2;
            self.arithmetic("))")?;
        } else {
            let idx = self.push_command()?;
            let saved_cur = self.cur.replace(idx);
            let r = self.for_words();
            self.cur = saved_cur;
            r?;
        }
        self.skip_blanks();
        if self.peek() == Some(';') {
            self.i += 1;
        }
        self.skip_linebreaks()?;
        if self.eat_word("{") {
            self.list_to(&["}"])?;
        } else if self.eat_word("do") {
            self.list_to(&["done"])?;
        } else {
            return Err(self.err("expected `do` in `for`"));
        }
        self.compound_tail()
    }

    /// `NAME [in WORDS]` of a `for` or `select`.
    pub(super) fn for_words(&mut self) -> Result<(), ParseError> {
        let (name, _) = self.word()?;
        if !is_name(&name) {
            return Err(self.err(format!("`{name}` is not a valid loop variable")));
        }
        self.skip_linebreaks()?;
        if self.eat_word("in") {
            loop {
                self.skip_blanks();
                match self.peek() {
                    None | Some('\n' | ';') => return Ok(()),
                    _ => {
                        let (w, _) = self.word()?;
                        if w.is_empty() {
                            return Err(self.err("unexpected character in `for … in`"));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    pub(super) fn case_clause(&mut self) -> Result<(), ParseError> {
        let idx = self.push_command()?;
        let saved_cur = self.cur.replace(idx);
        let r = self.case_body();
        self.cur = saved_cur;
        r?;
        self.compound_tail()
    }

    pub(super) fn case_body(&mut self) -> Result<(), ParseError> {
        self.skip_blanks();
        self.word()?;
        self.skip_linebreaks()?;
        if !self.eat_word("in") {
            return Err(self.err("expected `in` in `case`"));
        }
        loop {
            self.skip_linebreaks()?;
            if self.eat_word("esac") {
                return Ok(());
            }
            if self.peek() == Some('(') {
                self.i += 1;
            }
            // Patterns: words separated by `|`, up to `)`.
            loop {
                self.skip_blanks();
                let (w, _) = self.word()?;
                self.skip_blanks();
                match self.peek() {
                    Some('|') => self.i += 1,
                    Some(')') if !w.is_empty() => {
                        self.i += 1;
                        break;
                    }
                    None => return Err(self.err("missing `esac`")),
                    _ => return Err(self.err("expected `)` after a `case` pattern")),
                }
            }
            self.depth += 1;
            let end = Stops {
                paren: false,
                words: &[],
                case_arm: true,
            };
            let r = self.parse_list(end);
            self.depth -= 1;
            match r? {
                End::CaseArm => {
                    // `;;`, `;&` or `;;&`.
                    self.i += 2;
                    if self.peek() == Some('&') {
                        self.i += 1;
                    }
                }
                End::Word("esac") => {
                    self.i += 4;
                    return Ok(());
                }
                _ => return Err(self.err("missing `esac`")),
            }
        }
    }

    pub(super) fn function_body(&mut self, name: String) -> Result<(), ParseError> {
        self.sh.functions.push(name.clone());
        self.sh.state.push("a function definition");
        let saved = self.ctx.function.replace(name.clone());
        let saved_pipes = std::mem::take(&mut self.ctx.pipes);
        let r = (|| {
            self.enter()?;
            self.skip_linebreaks()?;
            let start = self.i;
            let r = self.parse_command();
            self.leave();
            r?;
            Ok(self.text(start, self.i))
        })();
        self.ctx.function = saved;
        self.ctx.pipes = saved_pipes;
        let body = r?;
        self.sh.function_bodies.push((name, body));
        Ok(())
    }
}
