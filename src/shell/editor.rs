//! The line editor of `berth shell`, on a thread of its own.
//!
//! Flow at a glance:
//! - the async loop sends a prompt; the editor thread reads one line (rustyline
//!   on a terminal, plain lines from a pipe) and sends back an [`Input`];
//! - while it reads, a Tab sends [`Input::Complete`] and the thread waits for
//!   the loop to answer it from the sandbox's session;
//! - accepted lines go to the history, appended to the sandbox's history file
//!   at once so a killed berth loses nothing.
//!
//! rustyline blocks, so it cannot run on the async runtime; one thread owns
//! the editor for the life of the shell.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use rustyline::completion::{Completer, Pair};
use rustyline::config::{CompletionType, Config};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::DefaultHistory;
use rustyline::validate::Validator;
use rustyline::{Context, Editor, Helper};
use tokio::sync::mpsc;

/// How long a Tab waits for the sandbox before it offers nothing.
const COMPLETE_WAIT: Duration = Duration::from_secs(10);
/// History entries kept per sandbox.
const HISTORY_SIZE: usize = 10_000;

/// What the editor thread sends to the shell loop.
pub enum Input {
    /// A line the user entered.
    Line(String),
    /// Ctrl-C at the prompt: the line was dropped.
    Interrupted,
    /// Ctrl-D on an empty line, or the end of piped input.
    Eof,
    /// The terminal failed.
    Failed(String),
    /// Tab: the candidates for the word ending at `pos` of `line`.
    Complete {
        line: String,
        pos: usize,
        reply: std_mpsc::Sender<Vec<(String, String)>>,
    },
}

/// Start the editor thread. Each prompt sent on the returned sender makes it
/// read one line and answer on the returned receiver.
pub fn spawn(history: Option<PathBuf>) -> (std_mpsc::Sender<String>, mpsc::Receiver<Input>) {
    let (prompt_tx, prompt_rx) = std_mpsc::channel::<String>();
    let (input_tx, input_rx) = mpsc::channel::<Input>(4);
    std::thread::spawn(move || {
        if std::io::stdin().is_terminal() {
            run_terminal(history, prompt_rx, input_tx);
        } else {
            run_piped(prompt_rx, input_tx);
        }
    });
    (prompt_tx, input_rx)
}

/// The rustyline helper: only completion, answered by the shell loop.
struct Completion {
    ask: mpsc::Sender<Input>,
}

impl Completer for Completion {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let start = super::complete::Word::at(line, pos).start;
        let (reply, answer) = std_mpsc::channel();
        let asked = self.ask.blocking_send(Input::Complete {
            line: line.to_string(),
            pos,
            reply,
        });
        if asked.is_err() {
            return Ok((start, Vec::new()));
        }
        let found = answer.recv_timeout(COMPLETE_WAIT).unwrap_or_default();
        Ok((
            start,
            found
                .into_iter()
                .map(|(display, replacement)| Pair {
                    display,
                    replacement,
                })
                .collect(),
        ))
    }
}

impl Hinter for Completion {
    type Hint = String;
}
impl Highlighter for Completion {}
impl Validator for Completion {}
impl Helper for Completion {}

struct Terminal {
    editor: Editor<Completion, DefaultHistory>,
    history: Option<PathBuf>,
}

fn terminal_editor(ask: mpsc::Sender<Input>, history: Option<PathBuf>) -> Result<Terminal, String> {
    let config = Config::builder()
        .completion_type(CompletionType::List)
        .auto_add_history(false)
        .history_ignore_space(true)
        .history_ignore_dups(true)
        .and_then(|b| b.max_history_size(HISTORY_SIZE))
        .map_err(|e| format!("cannot set up the line editor: {e}"))?
        .build();
    let mut editor = Editor::<Completion, DefaultHistory>::with_config(config)
        .map_err(|e| format!("cannot set up the line editor on this terminal: {e}"))?;
    editor.set_helper(Some(Completion { ask }));
    if let Some(path) = history.as_ref().filter(|p| p.exists())
        && let Err(e) = editor.load_history(path)
    {
        eprintln!(
            "berth: could not read the history in {}: {e}; going on without it",
            path.display()
        );
    }
    Ok(Terminal { editor, history })
}

/// One editor per line: rustyline catches SIGINT for as long as an editor
/// exists, and berth needs that signal back while a command runs. (Its
/// `signal-hook` feature would leave SIGINT alone, but then it loses keys
/// typed ahead in one read.) The history is reloaded from the file, where
/// every line is appended as soon as it is entered.
fn run_terminal(
    history: Option<PathBuf>,
    prompts: std_mpsc::Receiver<String>,
    out: mpsc::Sender<Input>,
) {
    while let Ok(prompt) = prompts.recv() {
        let input = match terminal_editor(out.clone(), history.clone()) {
            Ok(mut t) => {
                let input = match t.editor.readline(&prompt) {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            remember(&mut t, &line);
                        }
                        Input::Line(line)
                    }
                    Err(ReadlineError::Interrupted) => Input::Interrupted,
                    Err(ReadlineError::Eof) => Input::Eof,
                    Err(e) => Input::Failed(e.to_string()),
                };
                // Dropped before the command runs: SIGINT is berth's again.
                drop(t);
                input
            }
            Err(e) => Input::Failed(e),
        };
        let last = matches!(input, Input::Eof | Input::Failed(_));
        if out.blocking_send(input).is_err() || last {
            break;
        }
    }
}

/// Add a line to the history and append it to the file.
fn remember(t: &mut Terminal, line: &str) {
    if !matches!(t.editor.add_history_entry(line), Ok(true)) {
        return;
    }
    let Some(path) = &t.history else { return };
    if let Err(e) = private_file(path).and_then(|()| {
        t.editor
            .append_history(path)
            .map_err(|e| std::io::Error::other(e.to_string()))
    }) {
        eprintln!(
            "berth: could not save the history to {}: {e}",
            path.display()
        );
    }
}

/// Create the history file readable by its owner only: it holds whatever
/// was typed, secrets included.
fn private_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map(drop)
}

/// Piped input: no editing, the prompt on stderr so stdout holds only output.
fn run_piped(prompts: std_mpsc::Receiver<String>, out: mpsc::Sender<Input>) {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    while let Ok(prompt) = prompts.recv() {
        eprint!("{prompt}");
        let _ = std::io::stderr().flush();
        let input = match lines.next() {
            Some(Ok(line)) => Input::Line(line),
            Some(Err(e)) => Input::Failed(e.to_string()),
            None => Input::Eof,
        };
        let last = matches!(input, Input::Eof | Input::Failed(_));
        if out.blocking_send(input).is_err() || last {
            break;
        }
    }
}
