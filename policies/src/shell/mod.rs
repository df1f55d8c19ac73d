//! berth's one reader of shell text, for the policy gate and for the session
//! engine's "may this change the shell's state?" question.
//!
//! Flow at a glance:
//! - [`parse`] follows bash's grammar ([`grammar`]): lists, pipelines, `!`,
//!   subshells, `{ …; }`, `if`/`while`/`until`/`for`/`select`/`case`, `((…))`,
//!   `[[ … ]]`, functions, `coproc`, here-documents. Words are read as bash
//!   tokenises them ([`words`]): only space, tab and newline separate words; quotes,
//!   backslashes, `$'…'`, parameter expansions and array assignments are followed
//!   exactly.
//! - It descends into every place that runs code of its own: `$(…)`, backticks,
//!   `<(…)`/`>(…)`, unquoted here-documents, `${…}`, and the strings given to
//!   `bash -c`, `sh -c`, `eval`, `su -c`, `env -S`, `alias`, `trap` and
//!   `find -exec`. Aliases and functions defined earlier in the text, or by the
//!   session ([`Defined`]), are expanded where they are used.
//! - Every simple command found, however deeply nested, becomes one [`Command`]
//!   with its words after quote removal and, for each word, whether it is a
//!   literal. Facts that are not commands (a `coproc`, a name the session defined
//!   but berth cannot see, an assignment hidden in arithmetic) are recorded on the
//!   [`Script`].
//! - [`effects`] answers the engine's question from the same [`Script`].
//!
//! Text bash would refuse (an unterminated quote, `fi` without `if`) is a
//! [`ParseError`]; callers treat it as a refusal. What bash accepts but berth
//! cannot know before it runs (a command word built at run time) is not an error:
//! it is marked, and the policy decides what it gets.

mod arith;
mod builtins;
mod compound;
mod effects;
mod grammar;
mod simple;
mod words;

use std::collections::{HashMap, HashSet};

pub use effects::{Effects, JOURNAL_NAMES_MAX, effects, journal};

/// How deeply substitutions, quotes, groups and nested shell strings may nest
/// before the reader gives up (and the command is refused).
const MAX_DEPTH: usize = 32;

/// The longest text the reader reads, in bytes. Longer text is refused: no
/// command an agent writes is this long, and bounding it bounds the reader's
/// work and memory.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// The most simple commands one text may hold, counting those nested in
/// substitutions, shell strings, aliases and functions. Judging compares some
/// commands with every other (pipes, nesting), so this bounds that work.
pub const MAX_COMMANDS: usize = 10_000;

/// Why a command could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot read this command: {what} at character {at}")]
pub struct ParseError {
    /// What went wrong.
    pub what: String,
    /// Character offset in the text being read (of the innermost string).
    pub at: usize,
}

impl ParseError {
    /// Whether the text was refused for passing one of the reader's limits
    /// (nesting, size) rather than for its syntax.
    pub fn is_limit(&self) -> bool {
        self.what.contains("the limit of")
    }
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
    /// The expansion of an alias its parent's command word names.
    Alias,
    /// The body of a function its parent calls.
    Function,
}

/// A redirection such as `> file` or `2>> log`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Redirect {
    /// The fd number written before the operator (`2` in `2>`, `{fd}` in `{fd}>`), or empty.
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
    /// For each word of `argv`: it is a literal (no expansion, substitution, glob
    /// or brace expansion), so bash runs exactly that text.
    pub literal: Vec<bool>,
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

    /// Whether word `i` is a literal.
    pub fn is_literal(&self, i: usize) -> bool {
        self.literal.get(i).copied().unwrap_or(false)
    }
}

/// `NAME=value` as (name, value), if `w` is an assignment word. `NAME+=value`,
/// `NAME[i]=value` and `NAME[i]+=value` are assignments too; the name returned
/// keeps any subscript and drops the `+`.
pub fn assignment(w: &str) -> Option<(&str, &str)> {
    let (k, v) = w.split_once('=')?;
    let k = k.strip_suffix('+').unwrap_or(k);
    let name = match k.find('[') {
        Some(i) if k.ends_with(']') => &k[..i],
        Some(_) => return None,
        None => k,
    };
    let mut cs = name.chars();
    let ok = matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && cs.all(|c| c.is_ascii_alphanumeric() || c == '_');
    ok.then_some((k, v))
}

/// Quote a word so that it reads back as itself; `$` stays bare so that an
/// expansion kept as text is still seen as one when re-read.
pub(crate) fn quote_for_display(w: &str) -> String {
    if w.chars().any(needs_escape) {
        // `$'…'` keeps control characters out of terminals and logs while the
        // text still reads back as the same word.
        let mut out = String::from("$'");
        for c in w.chars() {
            match c {
                '\'' => out.push_str("\\'"),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if needs_escape(c) && (c as u32) < 0x100 => {
                    out.push_str(&format!("\\x{:02x}", c as u32));
                }
                c if needs_escape(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('\'');
        return out;
    }
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,~*$".contains(c))
    {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

/// Characters that must not reach a terminal raw: C0 and C1 controls, DEL, and
/// the bidirectional overrides that make text display in another order.
pub fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character of [`needs_escape`] written as an escape
/// (`\r`, `\x1b`, `\u202e`), for printing command text to a terminal.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) && (c as u32) < 0x100 => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if needs_escape(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Something in the text whose effect berth cannot know before it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Opaque {
    /// The command it belongs to, if any.
    pub command: Option<usize>,
    /// What it is, in words.
    pub why: String,
    /// It runs nothing now: it sets up state whose later use runs what
    /// berth cannot read (a variable that makes programs load code, such
    /// as `LD_PRELOAD`). Restoring such state is not running it.
    pub later: bool,
}

/// Aliases and functions a session defined before this text runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Defined {
    /// Every alias and function name the session has.
    pub names: HashSet<String>,
    /// Alias values, where known.
    pub aliases: HashMap<String, String>,
    /// Function bodies (as shell text), where known.
    pub functions: HashMap<String, String>,
}

impl Defined {
    /// Read the definitions out of shell text such as a snapshot's `alias -p`
    /// and `declare -f` output. Text that does not read is ignored: its names,
    /// if known, stay without definitions and so stay opaque.
    pub fn read(names: HashSet<String>, text: &str) -> Defined {
        let mut d = Defined {
            names,
            ..Defined::default()
        };
        // The snapshot is the session's own shell state, which the commands
        // built up one judged call at a time: no size or count limit here
        // (an agent must not blind the gate to its aliases by defining many
        // functions), only the nesting limit that keeps the stack bounded.
        // Only the definitions are wanted, so calls inside them are not
        // expanded: reading stays linear however the functions call each
        // other.
        if let Ok(script) = grammar::parse_script(text, &Defined::default(), usize::MAX, false) {
            for (k, v) in script.aliases {
                d.aliases.insert(k, v);
            }
            for (k, v) in script.function_bodies {
                d.functions.insert(k, v);
            }
        }
        d
    }
}

/// Check that `text`, a snapshot berth is about to replay into a new shell,
/// only restores state: every command at its top level assigns variables or
/// runs `declare`, `export`, `alias`, `builtin cd` or `builtin unset`, with
/// redirections to `/dev/null` only, and nothing in it runs as it is read but
/// function bodies' definitions. Snapshots live where commands in the sandbox
/// can edit them, and a replay is not judged by the gate: a line added to one
/// would run unjudged. `Err` names the first command that does not belong.
pub fn declarations_only(text: &str) -> Result<(), String> {
    // As for [`Defined::read`]: no size limit, only the nesting one, and no
    // expansion of calls.
    let script = grammar::parse_script(text, &Defined::default(), usize::MAX, false)
        .map_err(|e| format!("it does not parse ({})", e.what))?;
    // A value read as code (an alias's, or a variable such as `PAGER` the
    // gate reads as a command line) runs when it is called or used, not now;
    // the command that sets it is checked on its own below.
    fn in_a_value<'a>(all: &'a [Command], mut c: &'a Command) -> bool {
        while let Some(p) = c.parent.and_then(|p| all.get(p)) {
            if c.via == Via::ShellString && p.parent.is_none() && p.via == Via::Top {
                return true;
            }
            c = p;
        }
        false
    }
    for c in &script.commands {
        if c.function.is_some() || c.via == Via::Function || in_a_value(&script.commands, c) {
            continue;
        }
        let bad = || Err(format!("`{}`", printable(&c.display())));
        if c.parent.is_some() || c.via != Via::Top {
            return bad();
        }
        if c.redirects
            .iter()
            .any(|r| r.target != "/dev/null" || r.op.contains('<'))
        {
            return bad();
        }
        let words: Vec<&str> = c
            .argv
            .iter()
            .skip_while(|w| assignment(w).is_some())
            .map(String::as_str)
            .collect();
        let ok = matches!(
            words.as_slice(),
            [] | ["declare" | "export" | "alias", ..] | ["builtin", "cd" | "unset", ..]
        );
        if !ok {
            return bad();
        }
    }
    if let Some(o) = script.opaque.iter().find(|o| {
        !o.later
            && o.command
                .is_none_or(|i| script.commands.get(i).is_some_and(|c| c.function.is_none()))
    }) {
        return Err(o.why.clone());
    }
    Ok(())
}

/// Everything found in a piece of shell text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Script {
    /// Every simple command, in the order found; nested ones follow their parent.
    pub commands: Vec<Command>,
    /// Names of the functions defined.
    pub functions: Vec<String>,
    /// The functions defined, with their bodies as text.
    pub function_bodies: Vec<(String, String)>,
    /// Aliases defined with literal `alias name=value` words.
    pub aliases: Vec<(String, String)>,
    /// What berth cannot know before the text runs.
    pub opaque: Vec<Opaque>,
    /// Here-document bodies, with the command they are fed to.
    pub heredocs: Vec<(usize, String)>,
    /// Ways the text changes the shell's state besides the commands it runs
    /// (a `for` variable, an arithmetic assignment, `${x:=y}`, `{fd}>`).
    pub state: Vec<&'static str>,
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

    /// The commands in the stage just before `down`'s in its innermost pipeline.
    pub fn feeders(&self, down: usize) -> Vec<usize> {
        let Some(&(pid, stage)) = self.commands.get(down).and_then(|c| c.pipes.last()) else {
            return Vec::new();
        };
        if stage == 0 {
            return Vec::new();
        }
        (0..self.commands.len())
            .filter(|&j| self.commands[j].pipes.contains(&(pid, stage - 1)))
            .collect()
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
    parse_with(src, &Defined::default())
}

/// Read shell text that runs in a session which already defined `defined`.
pub fn parse_with(src: &str, defined: &Defined) -> Result<Script, ParseError> {
    if src.len() > MAX_TEXT_BYTES {
        return Err(ParseError {
            what: format!(
                "the text is {} bytes, over the limit of {MAX_TEXT_BYTES} bytes berth reads",
                src.len()
            ),
            at: 0,
        });
    }
    let mut script = grammar::parse_script(src, defined, MAX_COMMANDS, true)?;
    if let Some(o) = names_the_engine(src, &script, defined) {
        script.opaque.push(o);
    }
    Ok(script)
}

/// The prefix of the variables berth's engine keeps in the session's shell.
pub const ENGINE_PREFIX: &str = "__berth";

/// Text that names a variable of berth's engine (`__berth_seq`, ...), in
/// the command or in the body of a session function it calls, is opaque:
/// the engine expands and evaluates those variables between commands
/// (arithmetic, a nameref's subscript, a journal's values), so their
/// values are text berth runs without having read it as a command. The
/// check is on the text with its quote characters removed and on every
/// word after quote removal, so `__ber''th_seq` and `$'\x5f_berth_seq'`
/// are caught as well; a name built when the command runs is opaque
/// already, as any computed name is.
fn names_the_engine(src: &str, script: &Script, defined: &Defined) -> Option<Opaque> {
    let bare = |t: &str| -> bool {
        t.chars()
            .filter(|c| !matches!(c, '\'' | '"' | '\\'))
            .collect::<String>()
            .contains(ENGINE_PREFIX)
    };
    let called = script
        .commands
        .iter()
        .filter_map(|c| c.function.as_ref())
        .filter_map(|f| defined.functions.get(f));
    let named = bare(src)
        || called.into_iter().any(|body| bare(body))
        || script
            .commands
            .iter()
            .any(|c| c.argv.iter().any(|w| w.contains(ENGINE_PREFIX)));
    named.then(|| Opaque {
        command: script
            .commands
            .iter()
            .position(|c| c.argv.iter().any(|w| w.contains(ENGINE_PREFIX))),
        why: format!(
            "the text names a variable of berth's own shell (`{ENGINE_PREFIX}_*`), which berth evaluates between commands without reading it"
        ),
        later: false,
    })
}

/// bash's blanks: the only bytes besides newline and the metacharacters that
/// end a word. A CR, a form feed or a non-breaking space is part of a word.
pub(crate) fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// Split text the way bash splits an unquoted expansion with the default `IFS`.
pub(crate) fn ifs_split(s: &str) -> impl Iterator<Item = &str> {
    s.split([' ', '\t', '\n']).filter(|w| !w.is_empty())
}

/// The characters that end an unquoted word: the blanks, newline and bash's
/// metacharacters.
pub(crate) fn is_meta(c: char) -> bool {
    is_blank(c) || matches!(c, '\n' | ';' | '&' | '|' | '(' | ')' | '<' | '>')
}
