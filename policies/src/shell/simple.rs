//! bash's simple commands: assignments (arrays too), words and redirections,
//! function definitions, and what the command runs besides itself: the strings
//! it hands to a shell, code fed to a shell's stdin, `find -exec` payloads, and
//! the aliases and functions it calls.

use super::grammar::{Ctx, Parser, PendingHereDoc, parse_into};
use super::{Opaque, ParseError, Redirect, Via, quote_for_display};
use crate::argv;

/// The builtins whose `NAME=(…)` arguments bash reads as array assignments.
const DECLARERS: &[&str] = &["declare", "typeset", "local", "export", "readonly"];

impl Parser<'_, '_> {
    /// A simple command: assignments, words and redirections up to an operator.
    pub(super) fn simple(&mut self) -> Result<(), ParseError> {
        let idx = self.push_command()?;
        let saved_cur = self.cur.replace(idx);
        let r = self.simple_words(idx);
        self.cur = saved_cur;
        r?;
        let cmd = &self.sh.commands[idx];
        if cmd.argv.is_empty() {
            return Ok(());
        }
        let argv = cmd.argv.clone();
        let literal = cmd.literal.clone();
        let assigns = argv
            .iter()
            .take_while(|w| super::assignment(w).is_some())
            .count();
        if assigns > 0 {
            self.sh.state.push("a variable assignment");
        }
        self.variable_code(idx, &argv, &literal, assigns)?;
        self.evaluated_operands(idx, &argv, assigns)?;
        if assigns == argv.len() {
            for (w, lit) in argv.iter().zip(&literal) {
                if let Some((k, v)) = super::assignment(w) {
                    self.sh.numeric.remove(k);
                    // A value whose expansions were all of values the text
                    // set (`x="${IFS}"`, `y=$x`) is known too: no expansion
                    // is left in its text.
                    if *lit || !v.contains(['$', '`']) {
                        self.sh.vars.insert(k.to_string(), v.to_string());
                    } else {
                        self.sh.vars.remove(k);
                    }
                }
            }
            return Ok(());
        }
        if self.expand_alias_or_function(idx)? {
            return Ok(());
        }
        // Most commands run a plain program: look at the layers' names once,
        // and read further only for the programs that run more code.
        let views = argv::views(&argv);
        let runs_code = views.iter().any(|v| {
            v.first().is_some_and(|p| {
                argv::SHELLS.contains(&p.as_str())
                    || crate::embedded::PROGRAMS.contains(&p.as_str())
                    || matches!(
                        p.as_str(),
                        "eval"
                            | "sg"
                            | "su"
                            | "runuser"
                            | "env"
                            | "alias"
                            | "trap"
                            | "find"
                            | "watch"
                            | "flock"
                            | "script"
                            | "at"
                            | "batch"
                            | "mapfile"
                            | "readarray"
                            | "complete"
                            | "compgen"
                    )
            })
        });
        if !runs_code {
            return Ok(());
        }
        let inner = views.last().cloned().unwrap_or_default();
        if inner.first().map(String::as_str) == Some("alias") {
            for (w, lit) in argv.iter().zip(&literal).skip(argv.len() - inner.len() + 1) {
                if let Some((k, v)) = w.split_once('=')
                    && *lit
                {
                    self.sh.aliases.push((k.to_string(), v.to_string()));
                }
            }
        }
        for code in argv::shell_strings(&argv) {
            self.nested(&code, idx, Via::ShellString)?;
        }
        for code in argv::embedded_strings(&argv) {
            self.nested_or_opaque(&code, idx)?;
        }
        for code in super::builtins::callbacks(&argv) {
            self.nested_or_opaque(&code, idx)?;
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
                            let words: Vec<&str> = up[1..]
                                .iter()
                                .filter(|w| !w.starts_with('-'))
                                .map(String::as_str)
                                .collect();
                            fed.push(words.join(" "));
                        }
                    }
                }
            }
            for code in fed {
                self.nested(&code, idx, Via::ShellString)?;
            }
        }
        for payload in argv::exec_payloads(&argv) {
            let code = payload
                .iter()
                .map(|w| quote_for_display(w))
                .collect::<Vec<_>>()
                .join(" ");
            self.nested(&code, idx, Via::ShellString)?;
        }
        Ok(())
    }

    /// Variables whose values programs run (`GIT_SSH_COMMAND=…`, `PS4=…`, a
    /// bash function exported as `BASH_FUNC_f%%=…`), assigned before the
    /// command, through `env`/`sudo`, or by `export`/`declare`: their code is
    /// read as commands the command runs.
    fn variable_code(
        &mut self,
        idx: usize,
        argv: &[String],
        literal: &[bool],
        assigns: usize,
    ) -> Result<(), ParseError> {
        let mut words: Vec<usize> = (0..assigns).collect();
        // Words that set state for later commands (a bare assignment, or a
        // declaring builtin's), not for a program this command runs.
        let mut declared: Vec<usize> = Vec::new();
        if assigns == argv.len() {
            declared.extend(0..assigns);
        }
        for view in argv::views(argv) {
            let at = argv.len() - view.len();
            let prog = view.first().map(String::as_str).unwrap_or("");
            if matches!(prog, "env" | "sudo" | "doas") {
                words.extend(
                    (at + 1..argv.len())
                        .take_while(|&i| argv[i].starts_with('-') || argv[i].contains('='))
                        .filter(|&i| !argv[i].starts_with('-')),
                );
            }
            if DECLARERS.contains(&prog) {
                let named = (at + 1..argv.len()).filter(|&i| super::assignment(&argv[i]).is_some());
                declared.extend(named.clone());
                words.extend(named);
            }
        }
        // git's configuration through its environment.
        let vars: Vec<(String, String)> = words
            .iter()
            .filter_map(|&i| argv[i].split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if vars.iter().any(|(k, _)| k.starts_with("GIT_CONFIG_")) {
            let views = argv::views(argv);
            let git = views
                .iter()
                .find(|v| v.first().is_some_and(|p| p == "git"))
                .map(|v| &v[1..]);
            for code in crate::embedded::git_env_config(&vars, git) {
                self.nested_or_opaque(&code, idx)?;
            }
        }
        for i in words {
            let Some((name, value)) = argv[i].split_once('=') else {
                continue;
            };
            let name = name.trim_end_matches('+');
            let Some(kind) = crate::embedded::variable_code(name) else {
                continue;
            };
            let lit = literal.get(i).copied().unwrap_or(false);
            match kind {
                crate::embedded::VarCode::Shell => {
                    let code = crate::embedded::variable_shell_code(name, value);
                    self.nested_or_opaque(&code, idx)?;
                }
                crate::embedded::VarCode::Prompt if lit => {
                    let ctx = Ctx {
                        parent: Some(idx),
                        via: Via::ShellString,
                        pipes: self.ctx.pipes.clone(),
                        function: self.ctx.function.clone(),
                    };
                    match super::grammar::scan_expansions(value, self.sh, ctx, self.depth + 1) {
                        Err(e) if e.is_limit() => return Err(e),
                        // bash reads a prompt only when it shows it: one that
                        // does not read is opaque, not a refusal of the text.
                        Err(e) => self.sh.opaque.push(Opaque { later: false,
                            command: Some(idx),
                            why: format!("berth cannot read the prompt `{name}` ({})", e.what),
                        }),
                        Ok(()) => {}
                    }
                }
                crate::embedded::VarCode::Loads if loads_nothing(name, value) => {}
                crate::embedded::VarCode::Loads => self.sh.opaque.push(Opaque { later: declared.contains(&i),
                    command: Some(idx),
                    why: format!(
                        "`{name}` makes programs load code from somewhere berth does not read"
                    ),
                }),
                crate::embedded::VarCode::Prompt => self.sh.opaque.push(Opaque { later: false,
                    command: Some(idx),
                    why: format!(
                        "`{name}` is a prompt whose substitutions bash runs, set to a value built when the command runs"
                    ),
                }),
            }
        }
        Ok(())
    }

    /// Read a command string a program runs (an option's or a variable's
    /// value). The program, not bash, takes it apart, so text that does not
    /// read as shell is opaque rather than refused; the reader's limits still
    /// refuse.
    fn nested_or_opaque(&mut self, code: &str, idx: usize) -> Result<(), ParseError> {
        let first = self.sh.commands.len();
        let r = self.nested(code, idx, Via::ShellString);
        // `git -c alias.x='!sh' x`, `awk '{ print | "sh" }'`: a shell the
        // program starts reads its commands from what the program feeds it.
        let stdin_shell = self.sh.commands[first.min(self.sh.commands.len())..]
            .iter()
            .any(|c| {
                c.parent == Some(idx)
                    && argv::reads_code_from_stdin(&c.argv)
                    && !c.redirects.iter().any(|r| r.op.starts_with('<'))
            });
        if r.is_ok() && stdin_shell {
            self.sh.opaque.push(Opaque { later: false,
                command: Some(idx),
                why: format!(
                    "the command string `{code}` starts a shell that reads its commands from input berth does not see"
                ),
            });
        }
        match r {
            Err(e) if !e.is_limit() => {
                self.sh.opaque.push(Opaque {
                    later: false,
                    command: Some(idx),
                    why: format!(
                        "berth cannot read the command string `{code}` it runs ({})",
                        e.what
                    ),
                });
                Ok(())
            }
            r => r,
        }
    }

    /// Read `code` as commands run by command `idx`.
    pub(super) fn nested(&mut self, code: &str, idx: usize, via: Via) -> Result<(), ParseError> {
        let ctx = Ctx {
            parent: Some(idx),
            via,
            pipes: self.ctx.pipes.clone(),
            function: self.ctx.function.clone(),
        };
        parse_into(code, self.sh, ctx, self.depth + 1)
    }

    /// If command `idx` calls an alias or function defined earlier (in this text
    /// or by the session), read what it really runs. Returns whether its words
    /// were replaced by an alias's.
    pub(super) fn expand_alias_or_function(&mut self, idx: usize) -> Result<bool, ParseError> {
        if !self.sh.expand_calls {
            return Ok(false);
        }
        let cmd = &self.sh.commands[idx];
        let assigns = cmd
            .argv
            .iter()
            .take_while(|w| super::assignment(w).is_some())
            .count();
        let Some(word) = cmd.argv.get(assigns) else {
            return Ok(false);
        };
        let known = self.sh.defined.names.contains(word)
            || self.sh.defined.aliases.contains_key(word)
            || self.sh.defined.functions.contains_key(word)
            || self.sh.aliases.iter().any(|(k, _)| k == word)
            || self.sh.function_bodies.iter().any(|(k, _)| k == word);
        if !known || !cmd.is_literal(assigns) || self.sh.expanding.contains(word) {
            return Ok(false);
        }
        let word = word.clone();
        let alias = self.alias(&word);
        let function = self
            .sh
            .function_bodies
            .iter()
            .rev()
            .find(|(k, _)| *k == word)
            .map(|(_, v)| v.clone())
            .or_else(|| self.sh.defined.functions.get(&word).cloned());
        let rest: Vec<String> = cmd.argv[assigns + 1..]
            .iter()
            .map(|w| quote_for_display(w))
            .collect();
        self.sh.expanding.insert(word.clone());
        let r = if let Some(value) = alias {
            // bash reads the alias text in place of the word; a value ending in
            // a blank makes the next word an alias candidate too.
            let mut code = value.clone();
            let mut last = value;
            let mut k = 0;
            while last.ends_with([' ', '\t']) && k < rest.len() {
                let next_word = &self.sh.commands[idx].argv[assigns + 1 + k];
                match self
                    .alias(next_word)
                    .filter(|_| self.sh.commands[idx].is_literal(assigns + 1 + k))
                {
                    Some(v) => {
                        code.push_str(&v);
                        last = v;
                        k += 1;
                    }
                    None => break,
                }
            }
            code.push(' ');
            code.push_str(&rest[k..].join(" "));
            let r = self.nested(&code, idx, Via::Alias);
            // bash never runs the alias's own name.
            self.sh.commands[idx].argv.clear();
            self.sh.commands[idx].literal.clear();
            r.map(|_| true)
        } else if let Some(body) = function {
            self.nested(&body, idx, Via::Function).map(|_| false)
        } else {
            if self.sh.defined.names.contains(&word) {
                self.sh.opaque.push(Opaque { later: false,
                    command: Some(idx),
                    why: format!(
                        "`{word}` is a function or alias the session defined, and berth cannot see what it runs"
                    ),
                });
            }
            Ok(false)
        };
        self.sh.expanding.remove(&word);
        r
    }

    /// The value of alias `name`, defined in this text or by the session.
    pub(super) fn alias(&self, name: &str) -> Option<String> {
        self.sh
            .aliases
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.sh.defined.aliases.get(name).cloned())
    }

    pub(super) fn simple_words(&mut self, idx: usize) -> Result<(), ParseError> {
        // Whether every word so far is an assignment, and whether the first
        // word that is not names a declaring builtin: kept as the words come,
        // so a command of many words is read in linear time.
        let mut in_assignments = true;
        let mut declaring = false;
        loop {
            self.skip_blanks();
            let Some(c) = self.peek() else { return Ok(()) };
            match c {
                '\n' | ';' | ')' | '|' => return Ok(()),
                '&' if self.peek_at(1) != Some('>') => return Ok(()),
                '(' => {
                    let cmd = &self.sh.commands[idx];
                    if cmd.argv.len() == 1 && cmd.redirects.is_empty() && cmd.literal[0] {
                        // NAME () body: a function definition.
                        self.i += 1;
                        self.skip_blanks();
                        if self.peek() != Some(')') {
                            return Err(self.err("expected `)` in function definition"));
                        }
                        self.i += 1;
                        let name = self.sh.commands[idx].argv.remove(0);
                        self.sh.commands[idx].literal.remove(0);
                        return self.function_body(name);
                    }
                    return Err(self.err("unexpected `(`"));
                }
                _ => {}
            }
            if self.redirection(idx)? {
                continue;
            }
            // `NAME=(…)` is an array in assignment position and as an argument
            // of a declaring builtin.
            self.split_word = false;
            let start = self.i;
            let (w, lit) = self.word_allowing_array(in_assignments || declaring)?;
            let split = std::mem::take(&mut self.split_word);
            if in_assignments && super::assignment(&w).is_none() {
                in_assignments = false;
                declaring = DECLARERS.contains(&argv::program_name(&w));
            }
            let words = if split {
                Some(match self.sh.vars.get("IFS") {
                    // An `IFS` the text set: split where bash would.
                    Some(ifs) => w
                        .split(|c: char| ifs.contains(c))
                        .filter(|p| !p.is_empty())
                        .map(str::to_string)
                        .collect::<Vec<_>>(),
                    None => super::ifs_split(&w).map(str::to_string).collect(),
                })
            } else if self.s.get(start) == Some(&'{') {
                braces(&self.text(start, self.i))
            } else {
                None
            };
            let cmd = &mut self.sh.commands[idx];
            if let Some(words) = words {
                for part in words {
                    cmd.argv.push(part);
                    cmd.literal.push(false);
                }
            } else {
                cmd.argv.push(w);
                cmd.literal.push(lit);
            }
        }
    }

    /// A redirection at the cursor, read into command `idx`. Returns whether
    /// there was one.
    pub(super) fn redirection(&mut self, idx: usize) -> Result<bool, ParseError> {
        let Some((fd, op)) = self.redirect_op() else {
            return Ok(false);
        };
        if fd.starts_with('{') {
            self.sh
                .state
                .push("`{name}>` assigns a file descriptor variable");
        }
        self.skip_blanks();
        let quoted_start = self.i;
        let (target, _) = self.word()?;
        if target.is_empty() && self.i == quoted_start {
            return Err(self.err(format!("`{op}` without a target")));
        }
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
        Ok(true)
    }
}

/// The words of a plain brace expansion written as one word, `{rm,-rf,/}`:
/// bash expands it to `rm -rf /`, so the gate reads those words. Only the
/// simplest form (one pair of braces around the whole word, no quotes,
/// expansions or nested braces) is expanded; anything else stays one word,
/// marked as not a literal.
fn braces(raw: &str) -> Option<Vec<String>> {
    let inner = raw.strip_prefix('{')?.strip_suffix('}')?;
    if !inner.contains(',') || inner.contains(['{', '}', '\'', '"', '\\', '$', '`', '*', '?', '['])
    {
        return None;
    }
    Some(
        inner
            .split(',')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// `NODE_OPTIONS` (and the JVM's) values made only of options known to load
/// nothing (`--max-old-space-size=4096`, `-Xmx2g`), and an emptied variable.
fn loads_nothing(name: &str, value: &str) -> bool {
    const NODE: &[&str] = &[
        "--max-old-space-size",
        "--max-semi-space-size",
        "--stack-size",
        "--enable-source-maps",
        "--no-warnings",
        "--no-deprecation",
        "--trace-warnings",
        "--trace-deprecation",
        "--trace-uncaught",
        "--unhandled-rejections",
        "--openssl-legacy-provider",
        "--experimental-vm-modules",
        "--dns-result-order",
        "--use-openssl-ca",
        "--max-http-header-size",
    ];
    if value.trim().is_empty() {
        return true;
    }
    let mut words = value.split_whitespace();
    match name {
        "NODE_OPTIONS" => words
            .map(|w| w.split_once('=').map_or(w, |(o, _)| o))
            .all(|o| NODE.contains(&o)),
        "JAVA_TOOL_OPTIONS" | "_JAVA_OPTIONS" | "JDK_JAVA_OPTIONS" => words.all(|w| {
            [
                "-Xmx",
                "-Xms",
                "-Xss",
                "-Dfile.encoding=",
                "-Duser.timezone=",
            ]
            .iter()
            .any(|p| w.starts_with(p))
        }),
        _ => false,
    }
}
