//! Terminal lines of `berth shell`: a line whose program needs a terminal
//! runs on one, as `ssh -t` runs it.
//!
//! Flow at a glance:
//! 1. [`classify`] says how a line runs: `tty COMMAND` always on a terminal;
//!    a line that is nothing but a known terminal program (an editor, a
//!    pager, `top`, a REPL given no script or query, `ssh HOST`) also;
//!    anything else in the session's shell as before, without a terminal;
//! 2. [`run`] starts the line as a terminal job in the same sandbox, launched
//!    from the session (so with its cwd and exported environment, and past
//!    the policy gate like any command), at the size of the user's terminal;
//! 3. the user's terminal is connected to it ([`crate::terminal::connect`])
//!    until the program ends, and the job is then pruned: it was one line of
//!    the shell, which the event log records, and `berth job ls` is for
//!    jobs that are still of interest. Ctrl-] detaches instead: the job goes
//!    on, named [`JOB_NAME`], and the user is told how to return to it. If
//!    the terminal closes (SIGHUP), the program is ended, as ssh ends it.
//!
//! The program runs in a child of the session's shell, like a subshell: a
//! `cd` or `export` inside it does not come back to the session.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use berth_core::backend::Signal;
use berth_core::jobs::{Job, JobOptions};
use berth_core::runtime::Runtime;
use berth_core::session::Tee;

use crate::terminal::{self, Connect, Ended};

/// The name of a terminal line's job, so that `berth job ls` run elsewhere,
/// or a detached one, says where it came from.
pub const JOB_NAME: &str = "shell-tty";
/// Ctrl-]: detaches, as in `berth attach`.
pub const DETACH_KEY: u8 = 0x1d;
/// How long a program that could not be shown has to end on SIGTERM.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// How a line of `berth shell` runs.
#[derive(Debug, PartialEq, Eq)]
pub enum Line<'a> {
    /// In the session's shell, without a terminal.
    Plain,
    /// `tty COMMAND`: this command, on a terminal.
    Explicit(&'a str),
    /// The whole line is this program, which needs a terminal.
    Detected(String),
}

/// How `line` runs. `tty` followed by a word that is not an option is the
/// explicit form (`tty` alone, or `tty -s`, is the real `tty`, which takes
/// no operands). Detection is conservative: only a line that is one simple
/// command (words and quotes; no pipe, list, redirection, substitution or
/// `$`) whose program, after any `NAME=value` words, is one of a known few,
/// with arguments that leave it interactive.
pub fn classify(line: &str) -> Line<'_> {
    let line = line.trim();
    if let Some(rest) = line.strip_prefix("tty")
        && rest.starts_with(char::is_whitespace)
    {
        let rest = rest.trim_start();
        if !rest.starts_with('-') {
            return Line::Explicit(rest);
        }
    }
    let Some(words) = simple_words(line) else {
        return Line::Plain;
    };
    let mut words = words.iter().skip_while(|w| is_assignment(w));
    let Some(first) = words.next() else {
        return Line::Plain;
    };
    let program = first.rsplit('/').next().unwrap_or(first.as_str());
    let args: Vec<&str> = words.map(String::as_str).collect();
    if needs_terminal(program, &args) {
        Line::Detected(program.to_string())
    } else {
        Line::Plain
    }
}

/// The words of a line that is one simple command, quotes removed; `None`
/// for anything more, which detection leaves alone.
fn simple_words(line: &str) -> Option<Vec<String>> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '\'' => break,
                        c => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next()? {
                        '"' => break,
                        '$' | '`' => return None,
                        '\\' => {
                            let n = chars.next()?;
                            if !matches!(n, '"' | '\\') {
                                word.push('\\');
                            }
                            word.push(n);
                        }
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.push(chars.next()?);
            }
            '|' | '&' | ';' | '<' | '>' | '(' | ')' | '$' | '`' | '\n' | '\r' => return None,
            '#' if !in_word => return None,
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Some(words)
}

/// `NAME=value`: an assignment before a command.
fn is_assignment(word: &str) -> bool {
    let Some((name, _)) = word.split_once('=') else {
        return false;
    };
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `program` run with `args` is a known program that needs a terminal.
fn needs_terminal(program: &str, args: &[&str]) -> bool {
    match program {
        "vi" | "vim" | "nvim" | "nano" | "emacs" | "less" | "more" | "man" | "top" | "htop" => true,
        "python" | "python3" => python_repl(args),
        p if p.strip_prefix("python3.").is_some_and(is_number) => python_repl(args),
        "ipython" | "ipython3" => args.is_empty() || args.contains(&"-i"),
        "node" => node_repl(args),
        "irb" => args
            .iter()
            .all(|a| a.starts_with('-') && !is_info(a) && !matches!(*a, "-v" | "-h")),
        "bash" | "sh" | "zsh" => args
            .iter()
            .all(|a| matches!(*a, "-i" | "-l" | "--login" | "--norc" | "--noprofile")),
        // Not with a command or file to run, or asked only to list or report.
        "psql" => !args.iter().any(|a| {
            a.starts_with("--command")
                || a.starts_with("--file")
                || a.starts_with("--list")
                || is_info(a)
                || short_flags(a).is_some_and(|f| f.contains(['c', 'f', 'l']))
        }),
        "mysql" | "mariadb" => !args.iter().any(|a| {
            a.starts_with("--execute")
                || is_info(a)
                || short_flags(a).is_some_and(|f| f.contains('e'))
        }),
        // `sqlite3 [FILE]`; a second word would be SQL to run.
        "sqlite3" => args.len() <= 1 && !args.iter().any(|a| a.starts_with('-')),
        "ssh" => ssh_to_a_host(args),
        _ => false,
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())
}

/// `--version`, `--help` and the short forms most programs share: a
/// report, not a session. (`-h` and `-v` are a host and a variable to psql,
/// a host and verbosity to mysql; the programs that read them as help and
/// version say so themselves.)
fn is_info(a: &str) -> bool {
    matches!(
        a,
        "--version" | "-version" | "-V" | "--help" | "-help" | "-?"
    )
}

/// The letters of a cluster of short options (`-Atc`), if `a` is one.
fn short_flags(a: &str) -> Option<&str> {
    a.strip_prefix('-').filter(|f| !f.starts_with('-'))
}

/// python with no script, `-c` or `-m` (`-i` before any of them runs it
/// and then stays interactive).
fn python_repl(args: &[&str]) -> bool {
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match *a {
            "-i" => return true,
            "-W" | "-X" => {
                args.next();
            }
            "-q" | "-u" | "-B" | "-E" | "-s" | "-S" | "-I" | "-b" | "-bb" | "-O" | "-OO" | "-d"
            | "-P" | "-R" => {}
            _ => return false,
        }
    }
    true
}

/// node with no script or `-e`/`-p` (or with `-i`).
fn node_repl(args: &[&str]) -> bool {
    for a in args {
        match *a {
            "-i" | "--interactive" => return true,
            "-e" | "--eval" | "-p" | "--print" | "-c" | "--check" | "-v" | "-h" => return false,
            a if is_info(a) || !a.starts_with('-') => return false,
            _ => {}
        }
    }
    true
}

/// `ssh [OPTIONS] HOST`: one host and no remote command, with only options
/// that leave it an interactive login.
fn ssh_to_a_host(args: &[&str]) -> bool {
    let mut hosts = 0;
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match *a {
            "-4" | "-6" | "-A" | "-a" | "-C" | "-K" | "-k" | "-q" | "-t" | "-v" | "-X" | "-x"
            | "-Y" | "-y" => {}
            "-p" | "-l" | "-i" | "-J" | "-o" | "-F" | "-L" | "-R" | "-D" => {
                if args.next().is_none() {
                    return false;
                }
            }
            a if a.starts_with('-') => return false,
            _ => hosts += 1,
        }
    }
    hosts == 1
}

/// How a terminal line ended.
pub enum Ran {
    /// Its program ended with this status.
    Exited(i32),
    /// Ctrl-]: the job of this id goes on.
    Detached(String),
    /// berth's terminal closed: the program was ended.
    HungUp,
}

/// Where a terminal line runs.
pub struct Place<'a> {
    pub backend: berth_core::backend::BackendKind,
    pub sandbox: &'a str,
    pub session: &'a str,
}

/// Run `command` on a terminal job launched from the session, with this
/// terminal connected to it, until it ends or is detached from. Its output
/// goes to `out`. The job is pruned once it has ended; a job whose
/// connection failed, or whose terminal closed (`hangup`), is ended first,
/// so that no program goes on unseen.
pub async fn run(
    rt: &Runtime,
    at: Place<'_>,
    command: &str,
    out: Tee,
    hangup: &mut tokio::signal::unix::Signal,
) -> Result<Ran> {
    let opts = JobOptions {
        name: Some(JOB_NAME.into()),
        pty: Some(terminal::size().unwrap_or_default()),
        session: Some(at.session.into()),
        ..JobOptions::default()
    };
    let held = terminal::TypeAhead::hold();
    let job = rt
        .start_job_with(at.backend, at.sandbox, command, opts)
        .await?;
    let how = Connect {
        detach: DETACH_KEY,
        redraw: false,
    };
    let connected = tokio::select! {
        r = terminal::connect(rt, job.clone(), how, out) => Some(r),
        _ = hangup.recv() => None,
    };
    drop(held);
    let Some(connected) = connected else {
        end_unseen(rt, &job).await;
        return Ok(Ran::HungUp);
    };
    match connected {
        Ok(Ended::Exited(job)) => {
            let code = status_of(&job);
            forget(rt, job).await;
            Ok(Ran::Exited(code))
        }
        Ok(Ended::Detached(job)) => Ok(Ran::Detached(job.id)),
        // The terminal is gone; the SIGHUP that says so may come after.
        Ok(Ended::Closed(job)) => {
            end_unseen(rt, &job).await;
            Ok(Ran::HungUp)
        }
        Err(e) => {
            end_unseen(rt, &job).await;
            Err(e)
        }
    }
}

/// End a line's job that nobody sees any more, and prune it. Said on
/// stderr only if it cannot be ended, and only if there is a stderr.
async fn end_unseen(rt: &Runtime, job: &Job) {
    match rt
        .kill_job_with_grace(&job.id, Signal::Term, KILL_GRACE)
        .await
    {
        Ok(_) => {
            if let Ok(job) = rt.job(&job.id).await {
                forget(rt, job).await;
            }
        }
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "berth: could not end job {id}, which runs unseen: {e}; `berth job kill {id}` \
                 ends it",
                id = job.id
            );
        }
    }
}

/// The status a line's program ended with, for the prompt and `$?`: its
/// exit code, or berth's own failure code, told why, when it has none.
fn status_of(job: &Job) -> i32 {
    match job.exit_code {
        Some(c) => c.clamp(0, 255) as i32,
        None => {
            eprintln!(
                "berth: job {} {}{}",
                job.id,
                job.state.as_str(),
                job.reason
                    .as_ref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            );
            i32::from(crate::EXIT_BERTH_ERROR)
        }
    }
}

/// Prune an ended line's job; one still going (its end not yet seen) is
/// named in a message instead.
async fn forget(rt: &Runtime, job: Job) {
    let id = job.id.clone();
    // Not eprintln: after a hang-up there is no terminal to write to.
    let mut err = std::io::stderr();
    if !job.state.is_final() {
        let _ = writeln!(
            err,
            "berth: job {id} has not finished yet; `berth job ls` shows it"
        );
        return;
    }
    if let Err(e) = rt.prune_jobs(vec![job]).await {
        let _ = writeln!(
            err,
            "berth: could not prune job {id}: {e}; `berth job prune` removes it"
        );
    }
}

/// A [`Tee`] to berth's stdout that knows whether the last line it wrote
/// holds text, escape sequences aside: a full-screen program (vim, less)
/// ends by putting back the screen and cursor it found, with no newline,
/// and the prompt belongs right there; a program that printed a partial
/// line needs one first.
pub fn stdout_tee() -> (Tee, Arc<Mutex<OpenLine>>) {
    let line = Arc::new(Mutex::new(OpenLine::default()));
    let seen = line.clone();
    let out = terminal::stdout();
    let tee: Tee = Arc::new(move |b: &[u8]| {
        out(b);
        if let Ok(mut l) = seen.lock() {
            l.feed(b);
        }
    });
    (tee, line)
}

/// Whether a terminal's current line has text on it, from its output.
#[derive(Debug, Default)]
pub struct OpenLine {
    text: bool,
    escape: Escape,
    /// The parameters of the control sequence being read (`?1049`).
    params: String,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Escape {
    #[default]
    None,
    /// After ESC.
    Start,
    /// In `ESC [ ... final`.
    Csi,
    /// In `ESC ] ... BEL` (or `ESC \`).
    Osc,
}

impl OpenLine {
    /// Take in output as the terminal does.
    pub fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.escape = match (self.escape, b) {
                (_, 0x1b) => Escape::Start,
                (Escape::Start, b'[') => {
                    self.params.clear();
                    Escape::Csi
                }
                (Escape::Start, b']') => Escape::Osc,
                (Escape::Start, _) => Escape::None,
                (Escape::Csi, 0x40..=0x7e) => {
                    // Leaving the alternate screen puts back the cursor
                    // where it was before it: what was drawn there is gone.
                    if b == b'l' && matches!(self.params.as_str(), "?1049" | "?1047" | "?47") {
                        self.text = false;
                    }
                    Escape::None
                }
                (Escape::Csi, _) => {
                    if self.params.len() < 16 {
                        self.params.push(char::from(b));
                    }
                    Escape::Csi
                }
                (Escape::Osc, 0x07) => Escape::None,
                (Escape::Osc, _) => Escape::Osc,
                (Escape::None, b'\n') => {
                    self.text = false;
                    Escape::None
                }
                (Escape::None, b) => {
                    if b >= 0x20 && b != 0x7f {
                        self.text = true;
                    }
                    Escape::None
                }
            };
        }
    }

    /// Whether the line has text on it.
    pub fn has_text(&self) -> bool {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detected(line: &str) -> bool {
        matches!(classify(line), Line::Detected(_))
    }

    #[test]
    fn tty_before_a_command_always_runs_it_on_a_terminal() {
        assert_eq!(classify("tty read x"), Line::Explicit("read x"));
        assert_eq!(
            classify("  tty   cat log | less "),
            Line::Explicit("cat log | less")
        );
        // The real `tty`, which takes no operands.
        assert_eq!(classify("tty"), Line::Plain);
        assert_eq!(classify("tty -s"), Line::Plain);
        assert_eq!(classify("ttyx vim"), Line::Plain);
    }

    #[test]
    fn editors_pagers_and_monitors_are_detected_with_any_arguments() {
        for line in [
            "vim",
            "vi notes.txt",
            "nvim +10 'my file'",
            "nano x",
            "emacs -nw",
            "less README.md",
            "more x",
            "man bash",
            "top",
            "htop -d 5",
            "/usr/bin/vim x",
            "TERM=xterm EDITOR=vi vim x",
        ] {
            assert!(detected(line), "{line}");
        }
        assert_eq!(classify("vim x"), Line::Detected("vim".into()));
    }

    #[test]
    fn repls_are_detected_only_without_a_script_or_query() {
        for line in [
            "python3",
            "python",
            "python3 -q",
            "python3 -i",
            "python3 -i script.py",
            "python3.12",
            "ipython",
            "node",
            "node -i",
            "irb",
            "bash",
            "sh",
            "zsh -l",
            "psql",
            "psql -h db -U me app",
            "mysql -u root",
            "mysql -h db -u root",
            "psql -v ON_ERROR_STOP=1 app",
            "sqlite3",
            "sqlite3 app.db",
            "ssh box",
            "ssh -p 2222 me@box",
        ] {
            assert!(detected(line), "{line}");
        }
        for line in [
            "python3 script.py",
            "python3 -c 'print(1)'",
            "python3 -m http.server",
            "python3 --version",
            "python3 -V",
            "node app.js",
            "node -e '1'",
            "bash script.sh",
            "bash -c 'echo hi'",
            "sh -c true",
            "psql -c 'select 1'",
            "psql -Atc 'select 1'",
            "psql -f x.sql",
            "psql --list",
            "mysql -e 'select 1'",
            "mysql --execute='select 1'",
            "sqlite3 app.db 'select 1'",
            "sqlite3 -version",
            "ssh box uptime",
            "ssh -N box",
            "irb --version",
            "irb -v",
            "node -v",
            "mysql --version",
            "psql -V",
        ] {
            assert!(!detected(line), "{line}");
        }
    }

    #[test]
    fn anything_but_a_simple_command_runs_as_before() {
        for line in [
            "cat x | less",
            "vim x; ls",
            "vim x && ls",
            "python3 < script.py",
            "python3 > out",
            "vim $FILE",
            "vim \"$FILE\"",
            "vim `ls`",
            "(vim)",
            "vim &",
            "# vim",
            "echo vim",
            "pythonista",
            "vimx",
            "",
            "A=1",
        ] {
            assert!(!detected(line), "{line}");
        }
        // Quotes are words, not syntax.
        assert!(detected("vim 'a | b'"));
        assert!(detected("vim \"a; b\""));
        assert!(detected("vim a\\ b"));
    }

    #[test]
    fn a_line_is_open_while_it_holds_text_escape_sequences_aside() {
        let mut l = OpenLine::default();
        assert!(!l.has_text());
        l.feed(b"hello");
        assert!(l.has_text());
        l.feed(b"\r\n");
        assert!(!l.has_text());
        // vim's goodbye: its last message on the alternate screen, which it
        // leaves, the cursor put back where it was.
        l.feed(b"\x1b[?1049h\x1b[40;1H\"notes.txt\" 1L, 15B written");
        assert!(l.has_text());
        l.feed(b"\x1b[?1049l\x1b[23;0;0t\x1b[?1l\x1b>");
        assert!(!l.has_text());
        l.feed(b"\x1b]0;title\x07");
        assert!(!l.has_text());
        l.feed(b"\x1b[1mno newline\x1b[0m");
        assert!(l.has_text());
    }
}
