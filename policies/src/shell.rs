//! A shell reader made for policy checks, not for running code.
//!
//! Flow at a glance: [`parse`] walks the text the way bash would split it into
//! simple commands (lists, pipelines, subshells, brace groups, functions) and
//! descends into every place that runs code of its own: `$(…)`, backticks,
//! `<(…)`/`>(…)`, unquoted here-documents, and the strings given to
//! `bash -c`, `sh -c`, `eval`, `su -c`, `env -S`, `alias` and `find -exec`.
//! Every simple command found, however deeply nested, becomes one [`Command`]
//! with its words after quote removal, so a dangerous part cannot hide behind a
//! harmless prefix, quoting or backslashes.
//!
//! It leans strict: text it does not understand is read as more commands
//! rather than skipped, and input it cannot read at all is an error the caller
//! treats as a refusal.

use std::collections::HashMap;

use crate::argv;

/// How deeply substitutions and nested shell strings may nest before the reader
/// gives up (and the command is refused).
const MAX_DEPTH: usize = 32;

/// Why a command could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read this command: {what} at character {at}")]
pub struct ParseError {
    /// What went wrong.
    pub what: String,
    /// Character offset in the text being read (of the innermost string).
    pub at: usize,
}

/// How a command came to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Written directly in the text.
    Top,
    /// Inside `$(…)` or backticks of its parent's words.
    Subst,
    /// Inside `<(…)` or `>(…)` of its parent's words.
    ProcSubst,
    /// Inside a string its parent runs as shell code (`bash -c`, `eval`, …).
    ShellString,
    /// A here-document body's substitution, fed to its parent.
    HereDoc,
}

/// A redirection such as `> file` or `2>> log`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// The fd number written before the operator (`2` in `2>`), or empty.
    pub fd: String,
    /// The operator without its fd number: `>`, `>>`, `<`, `&>`, `<<`, `<<<`, …
    pub op: String,
    /// The target word after quote removal.
    pub target: String,
}

/// One simple command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Its words after quote removal; expansions that cannot be known are kept as text.
    pub argv: Vec<String>,
    /// Its redirections.
    pub redirects: Vec<Redirect>,
    /// The pipelines it sits in, outermost first: (pipeline id, stage).
    pub pipes: Vec<(usize, usize)>,
    /// Started with `&`.
    pub background: bool,
    /// The command whose words (or shell string) contain this one.
    pub parent: Option<usize>,
    /// How it came to run.
    pub via: Via,
    /// The function whose body holds it, if any.
    pub function: Option<String>,
}

impl Command {
    /// The command as one line, for messages.
    pub fn display(&self) -> String {
        let mut parts: Vec<String> = self.argv.iter().map(|w| quote_for_display(w)).collect();
        for r in &self.redirects {
            parts.push(format!("{}{}{}", r.fd, r.op, quote_for_display(&r.target)));
        }
        parts.join(" ")
    }
}

fn quote_for_display(w: &str) -> String {
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,~*$".contains(c))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// Everything found in a piece of shell text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// Every simple command, in the order found; nested ones follow their parent.
    pub commands: Vec<Command>,
    /// Names of the functions defined.
    pub functions: Vec<String>,
}

impl Script {
    /// Whether command `i` shares a pipeline with another stage.
    pub fn is_piped(&self, i: usize) -> bool {
        let Some(c) = self.commands.get(i) else {
            return false;
        };
        c.pipes.iter().any(|&(pid, stage)| {
            stage > 0
                || self
                    .commands
                    .iter()
                    .any(|o| o.pipes.iter().any(|&(p2, s2)| p2 == pid && s2 > 0))
        })
    }

    /// Whether command `up` feeds command `down` through a pipe (`up | … | down`).
    pub fn is_upstream(&self, up: usize, down: usize) -> bool {
        let (Some(u), Some(d)) = (self.commands.get(up), self.commands.get(down)) else {
            return false;
        };
        u.pipes
            .iter()
            .any(|&(p, s)| d.pipes.iter().any(|&(p2, s2)| p2 == p && s < s2))
    }

    /// Whether command `inner` is nested (through any chain) inside `outer`.
    pub fn is_inside(&self, inner: usize, outer: usize) -> bool {
        let mut cur = self.commands.get(inner).and_then(|c| c.parent);
        let mut steps = 0;
        while let Some(p) = cur {
            if p == outer {
                return true;
            }
            steps += 1;
            if steps > self.commands.len() {
                return false;
            }
            cur = self.commands.get(p).and_then(|c| c.parent);
        }
        false
    }
}

/// Read shell text into its simple commands.
pub fn parse(src: &str) -> Result<Script, ParseError> {
    let mut shared = Shared::default();
    let ctx = Ctx {
        parent: None,
        via: Via::Top,
        pipes: Vec::new(),
        function: None,
    };
    parse_into(src, &mut shared, ctx, 0)?;
    Ok(Script {
        commands: shared.commands,
        functions: shared.functions,
    })
}

#[derive(Default)]
struct Shared {
    commands: Vec<Command>,
    functions: Vec<String>,
    vars: HashMap<String, String>,
    next_pipeline: usize,
}

#[derive(Clone)]
struct Ctx {
    parent: Option<usize>,
    via: Via,
    pipes: Vec<(usize, usize)>,
    function: Option<String>,
}

fn parse_into(src: &str, sh: &mut Shared, ctx: Ctx, depth: usize) -> Result<(), ParseError> {
    if depth > MAX_DEPTH {
        return Err(ParseError {
            what: format!("nested more than {MAX_DEPTH} levels deep"),
            at: 0,
        });
    }
    let mut p = Parser {
        s: src.chars().collect(),
        i: 0,
        sh,
        ctx,
        cur: None,
        depth,
        heredocs: Vec::new(),
        split_word: false,
    };
    p.parse_list(Term::Eof)?;
    p.finish_heredocs_at_eof()
}

/// Scan text that undergoes expansion but not word splitting (a here-document
/// body, the inside of `${…}`) for the substitutions it runs.
fn scan_expansions(src: &str, sh: &mut Shared, ctx: Ctx, depth: usize) -> Result<(), ParseError> {
    if depth > MAX_DEPTH {
        return Err(ParseError {
            what: format!("nested more than {MAX_DEPTH} levels deep"),
            at: 0,
        });
    }
    let mut p = Parser {
        s: src.chars().collect(),
        i: 0,
        sh,
        cur: ctx.parent,
        ctx,
        depth,
        heredocs: Vec::new(),
        split_word: false,
    };
    let mut sink = String::new();
    while let Some(c) = p.peek() {
        match c {
            '\\' => p.i += 2,
            '$' => p.dollar(&mut sink, true)?,
            '`' => p.backtick(&mut sink)?,
            _ => p.i += 1,
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Term {
    Eof,
    Paren,
    Brace,
}

struct PendingHereDoc {
    delim: String,
    expands: bool,
    strip_tabs: bool,
    owner: Option<usize>,
}

struct Parser<'a> {
    s: Vec<char>,
    i: usize,
    sh: &'a mut Shared,
    ctx: Ctx,
    /// The command whose words are being read (parent of any substitution).
    cur: Option<usize>,
    depth: usize,
    heredocs: Vec<PendingHereDoc>,
    /// Set when an unquoted known variable was expanded into the current word.
    split_word: bool,
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t' || c == '\r'
}

fn is_meta(c: char) -> bool {
    is_blank(c) || matches!(c, '\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>')
}

fn is_name(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

const KEYWORDS: &[&str] = &[
    "!", "if", "then", "else", "elif", "fi", "while", "until", "do", "done", "esac", "in",
];

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn peek_at(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    fn err(&self, what: impl Into<String>) -> ParseError {
        ParseError {
            what: what.into(),
            at: self.i,
        }
    }

    fn text(&self, from: usize, to: usize) -> String {
        self.s[from.min(self.s.len())..to.min(self.s.len())]
            .iter()
            .collect()
    }

    /// Skip blanks and line continuations.
    fn skip_blanks(&mut self) {
        loop {
            match self.peek() {
                Some(c) if is_blank(c) => self.i += 1,
                Some('\\') if self.peek_at(1) == Some('\n') => self.i += 2,
                _ => return,
            }
        }
    }

    fn skip_comment(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                return;
            }
            self.i += 1;
        }
    }

    /// Consume a newline; here-documents begun on the line now have their bodies.
    fn newline(&mut self) -> Result<(), ParseError> {
        self.i += 1;
        let pending = std::mem::take(&mut self.heredocs);
        for h in pending {
            let start = self.i;
            let mut body_end = self.s.len();
            let mut after = self.s.len();
            while self.i < self.s.len() {
                let line_start = self.i;
                while self.i < self.s.len() && self.s[self.i] != '\n' {
                    self.i += 1;
                }
                let line = self.text(line_start, self.i);
                let line = if h.strip_tabs {
                    line.trim_start_matches('\t').to_string()
                } else {
                    line
                };
                let next = (self.i + 1).min(self.s.len());
                if line == h.delim {
                    body_end = line_start;
                    after = next;
                    break;
                }
                self.i = next;
            }
            self.i = after;
            let body = self.text(start, body_end);
            let owner_reads_code = h
                .owner
                .and_then(|o| self.sh.commands.get(o))
                .is_some_and(|c| argv::reads_code_from_stdin(&c.argv));
            if owner_reads_code {
                // `sh <<EOF … EOF`: the body is the script.
                let ctx = Ctx {
                    parent: h.owner,
                    via: Via::ShellString,
                    ..self.ctx.clone()
                };
                parse_into(&body, self.sh, ctx, self.depth + 1)?;
            } else if h.expands {
                let ctx = Ctx {
                    parent: h.owner,
                    via: Via::HereDoc,
                    ..self.ctx.clone()
                };
                scan_expansions(&body, self.sh, ctx, self.depth + 1)?;
            }
        }
        Ok(())
    }

    fn finish_heredocs_at_eof(&mut self) -> Result<(), ParseError> {
        if self.heredocs.is_empty() {
            return Ok(());
        }
        // bash runs an unterminated here-document to end of input; read it so.
        self.s.push('\n');
        self.i = self.s.len() - 1;
        self.newline()
    }

    /// Whether the next word is exactly `w`, unquoted, followed by a separator.
    fn at_word(&self, w: &str) -> bool {
        let n = w.chars().count();
        let matches = w
            .chars()
            .enumerate()
            .all(|(k, c)| self.peek_at(k) == Some(c));
        matches
            && match self.peek_at(n) {
                None => true,
                Some(c) => is_meta(c),
            }
    }

    fn parse_list(&mut self, term: Term) -> Result<(), ParseError> {
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("nested more than {MAX_DEPTH} levels deep")));
        }
        loop {
            // Separators, blank lines and comments between commands.
            loop {
                self.skip_blanks();
                match self.peek() {
                    Some('\n') => self.newline()?,
                    Some(';') => self.i += 1,
                    Some('&') if self.peek_at(1) != Some('>') => self.i += 1,
                    Some('|') => self.i += 1,
                    Some('#') => self.skip_comment(),
                    Some(')') if term != Term::Paren => self.i += 1,
                    _ => break,
                }
            }
            match self.peek() {
                None if term == Term::Eof => return Ok(()),
                None => {
                    return Err(self.err(if term == Term::Paren {
                        "missing `)`"
                    } else {
                        "missing `}`"
                    }));
                }
                Some(')') if term == Term::Paren => return Ok(()),
                _ => {}
            }
            if term == Term::Brace && self.at_word("}") {
                self.i += 1;
                return Ok(());
            }
            let first = self.sh.commands.len();
            self.parse_pipeline(term)?;
            self.skip_blanks();
            if self.peek() == Some('&') && !matches!(self.peek_at(1), Some('&' | '>')) {
                for c in &mut self.sh.commands[first..] {
                    c.background = true;
                }
                self.i += 1;
            }
        }
    }

    fn parse_pipeline(&mut self, term: Term) -> Result<(), ParseError> {
        let id = self.sh.next_pipeline;
        self.sh.next_pipeline += 1;
        let mut stage = 0;
        loop {
            self.ctx.pipes.push((id, stage));
            let r = self.parse_command(term);
            self.ctx.pipes.pop();
            r?;
            self.skip_blanks();
            if self.peek() == Some('|') && self.peek_at(1) != Some('|') {
                self.i += 1;
                if self.peek() == Some('&') {
                    self.i += 1;
                }
                // A pipe may be followed by newlines before the next stage.
                loop {
                    self.skip_blanks();
                    match self.peek() {
                        Some('\n') => self.newline()?,
                        Some('#') => self.skip_comment(),
                        _ => break,
                    }
                }
                stage += 1;
                continue;
            }
            return Ok(());
        }
    }

    fn parse_command(&mut self, term: Term) -> Result<(), ParseError> {
        self.skip_blanks();
        // Reserved words that only shape control flow.
        loop {
            let kw = KEYWORDS.iter().find(|k| self.at_word(k));
            match kw {
                Some(k) => {
                    self.i += k.chars().count();
                    self.skip_blanks();
                }
                None => break,
            }
        }
        if term == Term::Brace && self.at_word("}") {
            return Ok(());
        }
        if self.at_word("function") {
            self.i += "function".len();
            self.skip_blanks();
            let name = self.word()?;
            self.skip_blanks();
            if self.peek() == Some('(') {
                self.i += 1;
                self.skip_blanks();
                if self.peek() != Some(')') {
                    return Err(self.err("expected `)` after `function NAME(`"));
                }
                self.i += 1;
            }
            return self.function_body(name, term);
        }
        match self.peek() {
            Some('(') => {
                self.i += 1;
                self.depth += 1;
                let r = self.parse_list(Term::Paren);
                self.depth -= 1;
                r?;
                if self.peek() != Some(')') {
                    return Err(self.err("missing `)`"));
                }
                self.i += 1;
                self.simple(term)
            }
            Some('{') if self.at_word("{") => {
                self.i += 1;
                self.depth += 1;
                let r = self.parse_list(Term::Brace);
                self.depth -= 1;
                r?;
                self.simple(term)
            }
            _ => self.simple(term),
        }
    }

    fn function_body(&mut self, name: String, term: Term) -> Result<(), ParseError> {
        self.sh.functions.push(name.clone());
        let saved = self.ctx.function.replace(name);
        loop {
            self.skip_blanks();
            if self.peek() == Some('\n') {
                self.newline()?;
            } else {
                break;
            }
        }
        let r = self.parse_command(term);
        self.ctx.function = saved;
        r
    }

    /// A simple command: words and redirections up to an operator.
    fn simple(&mut self, term: Term) -> Result<(), ParseError> {
        let idx = self.sh.commands.len();
        self.sh.commands.push(Command {
            argv: Vec::new(),
            redirects: Vec::new(),
            pipes: self.ctx.pipes.clone(),
            background: false,
            parent: self.ctx.parent,
            via: self.ctx.via,
            function: self.ctx.function.clone(),
        });
        let saved_cur = self.cur.replace(idx);
        let r = self.simple_words(idx, term);
        self.cur = saved_cur;
        r?;
        let cmd = &self.sh.commands[idx];
        if cmd.argv.is_empty() && cmd.redirects.is_empty() {
            // Nothing of its own; nested commands keep pointing at it harmlessly.
            return Ok(());
        }
        let argv = cmd.argv.clone();
        if argv.iter().all(|w| argv::assignment(w).is_some()) {
            for w in &argv {
                if let Some((k, v)) = argv::assignment(w) {
                    self.sh.vars.insert(k.to_string(), v.to_string());
                }
            }
        }
        for code in argv::shell_strings(&argv) {
            let ctx = Ctx {
                parent: Some(idx),
                via: Via::ShellString,
                pipes: self.ctx.pipes.clone(),
                function: self.ctx.function.clone(),
            };
            parse_into(&code, self.sh, ctx, self.depth + 1)?;
        }
        // Code fed to a shell's stdin: `sh <<< 'code'`, `echo code | sh`.
        if argv::reads_code_from_stdin(&argv) {
            let mut fed: Vec<String> = self.sh.commands[idx]
                .redirects
                .iter()
                .filter(|r| r.op == "<<<")
                .map(|r| r.target.clone())
                .collect();
            if let Some(&(pid, stage)) = self.ctx.pipes.last()
                && stage > 0
            {
                for c in &self.sh.commands {
                    if c.pipes.last() == Some(&(pid, stage - 1)) {
                        let up = argv::inner(&c.argv);
                        if matches!(up.first().map(String::as_str), Some("echo" | "printf")) {
                            let words: Vec<&String> =
                                up[1..].iter().filter(|w| !w.starts_with('-')).collect();
                            fed.push(
                                words
                                    .iter()
                                    .map(|w| w.as_str())
                                    .collect::<Vec<_>>()
                                    .join(" "),
                            );
                        }
                    }
                }
            }
            for code in fed {
                let ctx = Ctx {
                    parent: Some(idx),
                    via: Via::ShellString,
                    pipes: self.ctx.pipes.clone(),
                    function: self.ctx.function.clone(),
                };
                parse_into(&code, self.sh, ctx, self.depth + 1)?;
            }
        }
        for payload in argv::exec_payloads(&argv) {
            let code = payload
                .iter()
                .map(|w| quote_for_display(w))
                .collect::<Vec<_>>()
                .join(" ");
            let ctx = Ctx {
                parent: Some(idx),
                via: Via::ShellString,
                pipes: self.ctx.pipes.clone(),
                function: self.ctx.function.clone(),
            };
            parse_into(&code, self.sh, ctx, self.depth + 1)?;
        }
        Ok(())
    }

    fn simple_words(&mut self, idx: usize, term: Term) -> Result<(), ParseError> {
        loop {
            self.skip_blanks();
            let Some(c) = self.peek() else { return Ok(()) };
            match c {
                '\n' | ';' | ')' => return Ok(()),
                '|' => return Ok(()),
                '&' if self.peek_at(1) != Some('>') => return Ok(()),
                '#' => {
                    self.skip_comment();
                    return Ok(());
                }
                '}' if term == Term::Brace && self.at_word("}") => return Ok(()),
                '(' => {
                    let cmd = &self.sh.commands[idx];
                    if cmd.argv.len() == 1 && cmd.redirects.is_empty() {
                        // NAME () body: a function definition.
                        self.i += 1;
                        self.skip_blanks();
                        if self.peek() != Some(')') {
                            return Err(self.err("expected `)` in function definition"));
                        }
                        self.i += 1;
                        let name = self.sh.commands[idx].argv.remove(0);
                        let saved = self.ctx.pipes.clone();
                        let r = self.function_body(name, term);
                        self.ctx.pipes = saved;
                        return r;
                    }
                    return Err(self.err("unexpected `(`"));
                }
                _ => {}
            }
            if let Some((fd, op)) = self.redirect_op() {
                self.skip_blanks();
                let quoted_start = self.i;
                let target = self.word()?;
                if op == "<<" || op == "<<-" {
                    let raw = self.text(quoted_start, self.i);
                    let expands = !raw.contains(['\'', '"', '\\']);
                    self.heredocs.push(PendingHereDoc {
                        delim: target.clone(),
                        expands,
                        strip_tabs: op == "<<-",
                        owner: Some(idx),
                    });
                }
                self.sh.commands[idx]
                    .redirects
                    .push(Redirect { fd, op, target });
                continue;
            }
            self.split_word = false;
            let w = self.word()?;
            let split = std::mem::take(&mut self.split_word);
            let cmd = &mut self.sh.commands[idx];
            if split {
                cmd.argv.extend(w.split_whitespace().map(str::to_string));
            } else {
                cmd.argv.push(w);
            }
        }
    }

    /// A redirection operator at the cursor (with an optional fd number), consumed.
    fn redirect_op(&mut self) -> Option<(String, String)> {
        let start = self.i;
        let mut k = 0;
        while matches!(self.peek_at(k), Some(c) if c.is_ascii_digit()) {
            k += 1;
        }
        if k > 0 && self.peek_at(k) == Some('{') {
            return None;
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

    /// One word, with quotes removed and substitutions read (and recorded).
    fn word(&mut self) -> Result<String, ParseError> {
        let mut out = String::new();
        let start = self.i;
        while let Some(c) = self.peek() {
            match c {
                '<' | '>' if self.peek_at(1) == Some('(') => {
                    self.i += 2;
                    self.nested_list(Via::ProcSubst)?;
                    out.push_str(&self.text(start, self.i));
                }
                c if is_meta(c) => break,
                '\\' => {
                    match self.peek_at(1) {
                        Some('\n') => {}
                        Some(n) => out.push(n),
                        None => {}
                    }
                    self.i += 2;
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
                }
                '"' => self.dquote(&mut out)?,
                '$' => self.dollar(&mut out, false)?,
                '`' => self.backtick(&mut out)?,
                _ => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
        self.i = self.i.min(self.s.len());
        Ok(out)
    }

    fn dquote(&mut self, out: &mut String) -> Result<(), ParseError> {
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
                Some('`') => self.backtick(out)?,
                Some(c) => {
                    out.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// Read `( list )` whose opening has been consumed, as nested commands.
    fn nested_list(&mut self, via: Via) -> Result<(), ParseError> {
        let saved = self.ctx.clone();
        self.ctx.parent = self.cur;
        self.ctx.via = via;
        let saved_cur = self.cur;
        let saved_heredocs = std::mem::take(&mut self.heredocs);
        self.depth += 1;
        let r = self.parse_list(Term::Paren);
        self.depth -= 1;
        self.ctx = saved;
        self.cur = saved_cur;
        let inner = std::mem::replace(&mut self.heredocs, saved_heredocs);
        self.heredocs.extend(inner);
        r?;
        if self.peek() != Some(')') {
            return Err(self.err("missing `)`"));
        }
        self.i += 1;
        Ok(())
    }

    fn dollar(&mut self, out: &mut String, quoted: bool) -> Result<(), ParseError> {
        let start = self.i;
        match self.peek_at(1) {
            Some('(') if self.peek_at(2) == Some('(') => {
                // Arithmetic: skip to the matching `))`, keep the text.
                self.i += 3;
                let mut level = 2usize;
                while level > 0 {
                    match self.peek() {
                        None => return Err(self.err("unterminated `$((`")),
                        Some('(') => level += 1,
                        Some(')') => level -= 1,
                        _ => {}
                    }
                    self.i += 1;
                }
                out.push_str(&self.text(start, self.i));
            }
            Some('(') => {
                self.i += 2;
                self.nested_list(Via::Subst)?;
                out.push_str(&self.text(start, self.i));
            }
            Some('{') => {
                self.i += 2;
                let body_start = self.i;
                let mut level = 1usize;
                loop {
                    match self.peek() {
                        None => return Err(self.err("unterminated `${`")),
                        Some('\\') => self.i += 1,
                        Some('{') => level += 1,
                        Some('}') => {
                            level -= 1;
                            if level == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    self.i += 1;
                }
                let body = self.text(body_start, self.i);
                self.i += 1;
                if is_name(&body) {
                    self.push_var(out, &body, quoted);
                } else {
                    if body.contains('$') || body.contains('`') {
                        let ctx = Ctx {
                            parent: self.cur,
                            via: Via::Subst,
                            ..self.ctx.clone()
                        };
                        scan_expansions(&body, self.sh, ctx, self.depth + 1)?;
                    }
                    out.push_str(&self.text(start, self.i));
                }
            }
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
                out.push_str(&self.text(start, self.i));
            }
            _ => {
                out.push('$');
                self.i += 1;
            }
        }
        Ok(())
    }

    fn push_var(&mut self, out: &mut String, name: &str, quoted: bool) {
        match self.sh.vars.get(name) {
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

    fn backtick(&mut self, out: &mut String) -> Result<(), ParseError> {
        let start = self.i;
        self.i += 1;
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
        let ctx = Ctx {
            parent: self.cur,
            via: Via::Subst,
            ..self.ctx.clone()
        };
        parse_into(&inner, self.sh, ctx, self.depth + 1)?;
        out.push_str(&self.text(start, self.i));
        Ok(())
    }
}
