//! bash's grammar above the word: lists, and-or lists, pipelines, the choice
//! of command (compound ones are read in `compound.rs`, simple ones in
//! `simple.rs`), here-documents and substitutions' nested lists.
//!
//! The reader is recursive descent over the characters of one string. Every
//! place that runs code of its own (a substitution, a `bash -c` string, an
//! alias, a function body) is read by a nested reader that shares the [`Shared`]
//! tables, so one [`Script`] holds every command found at any depth.

use std::collections::{HashMap, HashSet};

use super::{Command, Defined, MAX_DEPTH, Opaque, ParseError, Script, Via, is_blank};
use crate::argv;

/// What every nested reader of one text shares.
pub(super) struct Shared<'d> {
    pub(super) commands: Vec<Command>,
    pub(super) functions: Vec<String>,
    pub(super) function_bodies: Vec<(String, String)>,
    pub(super) aliases: Vec<(String, String)>,
    pub(super) opaque: Vec<Opaque>,
    pub(super) heredocs: Vec<(usize, String)>,
    pub(super) state: Vec<&'static str>,
    /// Variables assigned a literal earlier in the text.
    pub(super) vars: HashMap<String, String>,
    /// Variables that arithmetic earlier in the text assigned a number.
    pub(super) numeric: HashSet<String>,
    /// Associative arrays (bash's own, those the text declared with `-A`,
    /// and namerefs to them): their subscripts are strings, not arithmetic.
    pub(super) assoc: HashSet<String>,
    pub(super) next_pipeline: usize,
    /// What the session defined before the text.
    pub(super) defined: &'d Defined,
    /// Aliases and functions being expanded, so recursion stops.
    pub(super) expanding: HashSet<String>,
    /// The most simple commands this text may hold.
    pub(super) max_commands: usize,
    /// Whether calls of aliases and functions are expanded where they are
    /// made (not when only the definitions are wanted, as in a snapshot).
    pub(super) expand_calls: bool,
}

/// Where the commands being read sit.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) parent: Option<usize>,
    pub(super) via: Via,
    pub(super) pipes: Vec<(usize, usize)>,
    pub(super) function: Option<String>,
}

pub(super) fn parse_script(
    src: &str,
    defined: &Defined,
    max_commands: usize,
    expand_calls: bool,
) -> Result<Script, ParseError> {
    let mut shared = Shared {
        commands: Vec::new(),
        functions: Vec::new(),
        function_bodies: Vec::new(),
        aliases: Vec::new(),
        opaque: Vec::new(),
        heredocs: Vec::new(),
        state: Vec::new(),
        vars: HashMap::new(),
        numeric: HashSet::new(),
        assoc: ["BASH_ALIASES", "BASH_CMDS"]
            .iter()
            .map(|n| n.to_string())
            .collect(),
        next_pipeline: 0,
        defined,
        expanding: HashSet::new(),
        max_commands,
        expand_calls,
    };
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
        function_bodies: shared.function_bodies,
        aliases: shared.aliases,
        opaque: shared.opaque,
        heredocs: shared.heredocs,
        state: shared.state,
    })
}

fn too_deep() -> ParseError {
    ParseError {
        what: format!("too deeply nested: more than the limit of {MAX_DEPTH} levels"),
        at: 0,
    }
}

/// Read `src` as a complete script into `sh`.
pub(super) fn parse_into(
    src: &str,
    sh: &mut Shared<'_>,
    ctx: Ctx,
    depth: usize,
) -> Result<(), ParseError> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    let mut p = Parser::new(src, sh, ctx, depth);
    match p.parse_list(Stops::EOF)? {
        End::Eof => {}
        End::Paren => return Err(p.err("unexpected `)`")),
        End::Word(w) => return Err(p.err(format!("unexpected `{w}`"))),
        End::CaseArm => return Err(p.err("`;;` outside `case`")),
    }
    p.finish_heredocs_at_eof()
}

/// Scan text that undergoes expansion but not word splitting (a here-document
/// body, arithmetic) for the substitutions it runs.
pub(super) fn scan_expansions(
    src: &str,
    sh: &mut Shared<'_>,
    ctx: Ctx,
    depth: usize,
) -> Result<(), ParseError> {
    if depth > MAX_DEPTH {
        return Err(too_deep());
    }
    let cur = ctx.parent;
    let mut p = Parser::new(src, sh, ctx, depth);
    p.cur = cur;
    let mut sink = String::new();
    while let Some(c) = p.peek() {
        match c {
            '\\' => p.i += 2,
            '$' => p.dollar(&mut sink, true)?,
            '`' => p.backtick(&mut sink, true)?,
            _ => p.i += 1,
        }
    }
    Ok(())
}

/// What may end a list.
#[derive(Clone, Copy)]
pub(super) struct Stops {
    /// A `)` (of a subshell or substitution).
    pub(super) paren: bool,
    /// Reserved words, at command position.
    pub(super) words: &'static [&'static str],
    /// `;;`, `;&`, `;;&` and `esac`.
    pub(super) case_arm: bool,
}

impl Stops {
    const EOF: Stops = Stops {
        paren: false,
        words: &[],
        case_arm: false,
    };
    pub(super) const PAREN: Stops = Stops {
        paren: true,
        words: &[],
        case_arm: false,
    };
    pub(super) const fn words(words: &'static [&'static str]) -> Stops {
        Stops {
            paren: false,
            words,
            case_arm: false,
        }
    }
}

/// How a list ended. Nothing is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    Eof,
    Paren,
    Word(&'static str),
    CaseArm,
}

pub(super) struct PendingHereDoc {
    pub(super) delim: String,
    pub(super) expands: bool,
    pub(super) strip_tabs: bool,
    pub(super) owner: Option<usize>,
}

/// Reserved words that end a list and never start a command.
const CLOSERS: &[&str] = &[
    "then", "else", "elif", "fi", "do", "done", "esac", "}", "in",
];

pub(super) struct Parser<'a, 'd> {
    pub(super) s: Vec<char>,
    pub(super) i: usize,
    pub(super) sh: &'a mut Shared<'d>,
    pub(super) ctx: Ctx,
    /// The command whose words are being read (parent of any substitution).
    pub(super) cur: Option<usize>,
    pub(super) depth: usize,
    pub(super) heredocs: Vec<PendingHereDoc>,
    /// Set when the word being read holds an expansion, glob or brace.
    pub(super) expanded: bool,
    /// Set when an unquoted known variable was expanded into the current word.
    pub(super) split_word: bool,
}

impl<'a, 'd> Parser<'a, 'd> {
    fn new(src: &str, sh: &'a mut Shared<'d>, ctx: Ctx, depth: usize) -> Self {
        Parser {
            s: src.chars().collect(),
            i: 0,
            sh,
            cur: None,
            ctx,
            depth,
            heredocs: Vec::new(),
            expanded: false,
            split_word: false,
        }
    }

    pub(super) fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    pub(super) fn peek_at(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    pub(super) fn err(&self, what: impl Into<String>) -> ParseError {
        ParseError {
            what: what.into(),
            at: self.i,
        }
    }

    pub(super) fn text(&self, from: usize, to: usize) -> String {
        self.s[from.min(self.s.len())..to.min(self.s.len())]
            .iter()
            .collect()
    }

    /// Skip blanks and line continuations.
    pub(super) fn skip_blanks(&mut self) {
        loop {
            match self.peek() {
                Some(c) if is_blank(c) => self.i += 1,
                Some('\\') if self.peek_at(1) == Some('\n') => self.i += 2,
                _ => return,
            }
        }
    }

    pub(super) fn skip_comment(&mut self) {
        while let Some(c) = self.peek() {
            if c == '\n' {
                return;
            }
            self.i += 1;
        }
    }

    /// Skip blanks, newlines and comments (where a list may continue).
    pub(super) fn skip_linebreaks(&mut self) -> Result<(), ParseError> {
        loop {
            self.skip_blanks();
            match self.peek() {
                Some('\n') => self.newline()?,
                Some('#') => self.skip_comment(),
                _ => return Ok(()),
            }
        }
    }

    /// Whether the next word is exactly `w`, unquoted, followed by a separator.
    pub(super) fn at_word(&self, w: &str) -> bool {
        // Reserved words are ASCII: one char per byte.
        let rest = &self.s[self.i.min(self.s.len())..];
        let n = w.len();
        rest.len() >= n
            && w.bytes().zip(rest).all(|(b, &c)| c == b as char)
            && match rest.get(n) {
                None => true,
                Some(&c) => super::is_meta(c),
            }
    }

    pub(super) fn eat_word(&mut self, w: &str) -> bool {
        if self.at_word(w) {
            self.i += w.len();
            true
        } else {
            false
        }
    }

    /// Consume a newline; here-documents begun on the line now have their bodies.
    pub(super) fn newline(&mut self) -> Result<(), ParseError> {
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
            if let Some(o) = h.owner {
                self.sh.heredocs.push((o, body.clone()));
            }
            let owner_reads_code = h
                .owner
                .and_then(|o| self.sh.commands.get(o))
                .is_some_and(|c| argv::reads_code_from_stdin(&c.argv));
            let via = if owner_reads_code {
                Via::ShellString
            } else {
                Via::HereDoc
            };
            let ctx = Ctx {
                parent: h.owner,
                via,
                ..self.ctx.clone()
            };
            if owner_reads_code {
                // `sh <<EOF … EOF`: the body is the script. Unquoted, it is
                // expanded first; its substitutions run either way.
                if h.expands {
                    scan_expansions(&body, self.sh, ctx.clone(), self.depth + 1)?;
                }
                parse_into(&body, self.sh, ctx, self.depth + 1)?;
            } else if h.expands {
                scan_expansions(&body, self.sh, ctx, self.depth + 1)?;
            }
        }
        Ok(())
    }

    pub(super) fn finish_heredocs_at_eof(&mut self) -> Result<(), ParseError> {
        if self.heredocs.is_empty() {
            return Ok(());
        }
        // bash runs an unterminated here-document to end of input; read it so.
        self.s.push('\n');
        self.i = self.s.len() - 1;
        self.newline()
    }

    /// A list of and-or lists, up to one of `stops` (not consumed).
    pub(super) fn parse_list(&mut self, stops: Stops) -> Result<End, ParseError> {
        if self.depth > MAX_DEPTH {
            return Err(too_deep());
        }
        loop {
            loop {
                self.skip_blanks();
                match self.peek() {
                    Some('\n') => self.newline()?,
                    Some('#') => self.skip_comment(),
                    Some(';') => {
                        if matches!(self.peek_at(1), Some(';' | '&')) {
                            if stops.case_arm {
                                return Ok(End::CaseArm);
                            }
                            return Err(self.err("`;;` outside `case`"));
                        }
                        self.i += 1;
                    }
                    _ => break,
                }
            }
            match self.peek() {
                None => return Ok(End::Eof),
                Some(')') if stops.paren => return Ok(End::Paren),
                Some(')') => return Err(self.err("unexpected `)`")),
                _ => {}
            }
            if let Some(w) = stops.words.iter().find(|w| self.at_word(w)) {
                return Ok(End::Word(w));
            }
            if stops.case_arm && self.at_word("esac") {
                return Ok(End::Word("esac"));
            }
            let first = self.sh.commands.len();
            self.parse_and_or()?;
            self.skip_blanks();
            if self.peek() == Some('&') && !matches!(self.peek_at(1), Some('&' | '>')) {
                for c in &mut self.sh.commands[first..] {
                    c.background = true;
                }
                self.i += 1;
            }
        }
    }

    fn parse_and_or(&mut self) -> Result<(), ParseError> {
        loop {
            self.parse_pipeline()?;
            self.skip_blanks();
            let op = (self.peek(), self.peek_at(1));
            if op == (Some('&'), Some('&')) || op == (Some('|'), Some('|')) {
                self.i += 2;
                self.skip_linebreaks()?;
                continue;
            }
            return Ok(());
        }
    }

    fn parse_pipeline(&mut self) -> Result<(), ParseError> {
        let id = self.sh.next_pipeline;
        self.sh.next_pipeline += 1;
        let mut stage = 0;
        loop {
            // `!` and `time [-p]` shape the pipeline, not its commands.
            loop {
                self.skip_blanks();
                if self.eat_word("!") {
                    continue;
                }
                if self.eat_word("time") {
                    self.skip_blanks();
                    self.eat_word("-p");
                    continue;
                }
                break;
            }
            self.ctx.pipes.push((id, stage));
            let r = self.parse_command();
            self.ctx.pipes.pop();
            r?;
            self.skip_blanks();
            if self.peek() == Some('|') && self.peek_at(1) != Some('|') {
                self.i += 1;
                if self.peek() == Some('&') {
                    self.i += 1;
                }
                self.skip_linebreaks()?;
                stage += 1;
                continue;
            }
            return Ok(());
        }
    }

    /// Read a nested list to its stop word and consume that word.
    pub(super) fn list_to(
        &mut self,
        words: &'static [&'static str],
    ) -> Result<&'static str, ParseError> {
        self.depth += 1;
        let r = self.parse_list(Stops::words(words));
        self.depth -= 1;
        match r? {
            End::Word(w) => {
                self.i += w.len();
                Ok(w)
            }
            _ => Err(self.err(format!("expected `{}`", words.join("` or `")))),
        }
    }

    pub(super) fn parse_command(&mut self) -> Result<(), ParseError> {
        self.skip_blanks();
        if let Some(w) = CLOSERS.iter().find(|w| self.at_word(w)) {
            return Err(self.err(format!("unexpected `{w}`")));
        }
        if self.eat_word("{") {
            self.list_to(&["}"])?;
            return self.compound_tail();
        }
        if self.peek() == Some('(') {
            if self.peek_at(1) == Some('(') {
                self.i += 2;
                self.arithmetic("))")?;
                return self.compound_tail();
            }
            self.i += 1;
            self.depth += 1;
            let r = self.parse_list(Stops::PAREN);
            self.depth -= 1;
            if r? != End::Paren {
                return Err(self.err("missing `)`"));
            }
            self.i += 1;
            return self.compound_tail();
        }
        if self.eat_word("[[") {
            self.conditional()?;
            return self.compound_tail();
        }
        if self.eat_word("if") {
            loop {
                self.list_to(&["then"])?;
                match self.list_to(&["elif", "else", "fi"])? {
                    "elif" => continue,
                    "else" => {
                        self.list_to(&["fi"])?;
                        break;
                    }
                    _ => break,
                }
            }
            return self.compound_tail();
        }
        if self.eat_word("while") || self.eat_word("until") {
            self.list_to(&["do"])?;
            self.list_to(&["done"])?;
            return self.compound_tail();
        }
        if self.eat_word("for") || self.eat_word("select") {
            return self.for_clause();
        }
        if self.eat_word("case") {
            return self.case_clause();
        }
        if self.eat_word("function") {
            self.skip_blanks();
            let name = self.word()?.0;
            self.skip_blanks();
            if self.peek() == Some('(') {
                self.i += 1;
                self.skip_blanks();
                if self.peek() != Some(')') {
                    return Err(self.err("expected `)` after `function NAME(`"));
                }
                self.i += 1;
            }
            return self.function_body(name);
        }
        if self.eat_word("coproc") {
            self.sh.opaque.push(Opaque {
                later: false,
                command: None,
                why: "`coproc` runs a command berth cannot follow once it starts".into(),
            });
            self.skip_blanks();
            // `coproc NAME compound`: skip the name.
            let save = self.i;
            let (w, lit) = self.word()?;
            self.skip_blanks();
            let compound = [
                "{", "((", "[[", "if", "while", "until", "for", "select", "case",
            ]
            .iter()
            .any(|k| self.at_word(k))
                || self.peek() == Some('(');
            if !(lit && is_name(&w) && compound) {
                self.i = save;
            }
            self.enter()?;
            let r = self.parse_command();
            self.leave();
            return r;
        }
        self.simple()
    }

    /// Go one level deeper (a quote, an expansion, a function body), or
    /// refuse text nested past [`MAX_DEPTH`]. Pair with [`Parser::leave`].
    pub(super) fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            self.depth -= 1;
            return Err(too_deep());
        }
        Ok(())
    }

    pub(super) fn leave(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    pub(super) fn push_command(&mut self) -> Result<usize, ParseError> {
        let idx = self.sh.commands.len();
        if idx >= self.sh.max_commands {
            return Err(self.err(format!(
                "more than the limit of {} simple commands in one text",
                self.sh.max_commands
            )));
        }
        self.sh.commands.push(Command {
            argv: Vec::new(),
            literal: Vec::new(),
            redirects: Vec::new(),
            pipes: self.ctx.pipes.clone(),
            background: false,
            parent: self.ctx.parent,
            via: self.ctx.via,
            function: self.ctx.function.clone(),
        });
        Ok(idx)
    }

    /// Read `( list )` whose opening has been consumed, as nested commands.
    pub(super) fn nested_list(&mut self, via: Via) -> Result<(), ParseError> {
        self.nested_until(via, None)
    }

    /// Read `list }` (bash 5.3's `${ list; }`), as nested commands.
    pub(super) fn nested_group(&mut self, via: Via) -> Result<(), ParseError> {
        self.nested_until(via, Some("}"))
    }

    fn nested_until(&mut self, via: Via, word: Option<&'static str>) -> Result<(), ParseError> {
        let saved = self.ctx.clone();
        self.ctx.parent = self.cur;
        self.ctx.via = via;
        let saved_cur = self.cur;
        let saved_expanded = self.expanded;
        let saved_split = self.split_word;
        let saved_heredocs = std::mem::take(&mut self.heredocs);
        self.depth += 1;
        let r = match word {
            None => self.parse_list(Stops::PAREN),
            Some("}") => self.parse_list(Stops::words(&["}"])),
            Some(_) => unreachable!("only `}}` closes a nested group"),
        };
        self.depth -= 1;
        self.ctx = saved;
        self.cur = saved_cur;
        self.expanded = saved_expanded;
        self.split_word = saved_split;
        let inner = std::mem::replace(&mut self.heredocs, saved_heredocs);
        self.heredocs.extend(inner);
        match (r?, word) {
            (End::Paren, None) => self.i += 1,
            (End::Word(w), Some(want)) if w == want => self.i += w.len(),
            (_, None) => return Err(self.err("missing `)`")),
            (_, Some(want)) => return Err(self.err(format!("missing `{want}`"))),
        }
        Ok(())
    }
}

pub(super) fn is_name(s: &str) -> bool {
    let mut cs = s.chars();
    matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
