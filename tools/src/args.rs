//! The tools' typed arguments. Each struct is the one source of a tool's JSON
//! schema (derived with schemars) and of its parsing (serde), so the two cannot
//! drift apart. Doc comments here are what the model reads.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Tool, ToolOutcome, ToolSpec};

/// `terminal`: run a command in the sandbox's persistent shell.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TerminalArgs {
    /// The command line, run by bash in the session's shell.
    pub command: String,
    /// Seconds before the command and its process tree are stopped
    /// (default: the sandbox's default timeout, 600 s unless the policy says
    /// otherwise). The session itself survives a timeout.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Run in this directory (relative to the workspace); the session's cwd is
    /// left as it was.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Start as a background job instead and return its id at once. Use for
    /// servers, watchers and anything longer than a few minutes; follow it with
    /// the `process` tool.
    #[serde(default)]
    pub background: Option<bool>,
    /// background: regular expressions over the job's output; each matching
    /// line is reported (as an MCP logging notification, and in the event log).
    #[serde(default)]
    pub watch: Option<Vec<String>>,
    /// background: run on a terminal of its own, for programs that need one
    /// (a REPL such as `python3 -i`, `psql`, `vim`, `top`, a `[y/N]` prompt);
    /// then read it with `process` action `screen` and type with `keys`.
    #[serde(default)]
    pub pty: Option<bool>,
    /// pty: the terminal's size as COLSxROWS (default 80x24).
    #[serde(default)]
    pub size: Option<String>,
    /// Run in this named session of the sandbox: a shell of its own, with its
    /// own cwd and environment, sharing the sandbox's files (say, `server` for
    /// a dev server and `tests` beside it). Default: the tools' session.
    #[serde(default)]
    pub session: Option<String>,
}

/// What `process` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProcessAction {
    /// Every background job of this sandbox.
    List,
    /// One job's state and exit code.
    Status,
    /// A job's output from `offset`.
    #[serde(alias = "logs")]
    Log,
    /// Wait for a job to end, up to `timeout` seconds.
    Wait,
    /// Signal the job's whole process group.
    Kill,
    /// Write `data` to the job's stdin (and close it with `eof`).
    Send,
    /// A terminal job's screen, as a person would see it: rows and cursor.
    Screen,
    /// Press keys in a terminal job: `keys` by name, after `data` if given.
    Keys,
}

/// `process`: manage background jobs started with `terminal` `background: true`.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessArgs {
    /// list | status | log | wait | kill | send | screen | keys
    pub action: ProcessAction,
    /// The job's id (or name); required for everything but `list`.
    #[serde(default)]
    pub job_id: Option<String>,
    /// send: text for the job's stdin.
    #[serde(default)]
    pub data: Option<String>,
    /// send: close the job's stdin afterwards.
    #[serde(default)]
    pub eof: Option<bool>,
    /// wait: seconds to wait at most (default 60).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// log: the byte offset to read from (default 0; each result says where the next read starts).
    #[serde(default)]
    pub offset: Option<u64>,
    /// log: at most this many bytes (default 65536).
    #[serde(default)]
    pub limit: Option<u64>,
    /// kill: TERM (default), INT or KILL.
    #[serde(default)]
    pub signal: Option<String>,
    /// keys: key names, pressed in order: Enter, Tab, Escape, BSpace, Up, Down,
    /// Left, Right, Home, End, PageUp, PageDown, Delete, F1..F12, C-c (control
    /// keys), M-x (meta), or any single character.
    #[serde(default)]
    pub keys: Option<Vec<String>>,
}

/// `read_file`: read a text file from the sandbox.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The file; a relative path starts from the terminal session's current directory.
    pub path: String,
    /// The first line to return, counting from 1 (default 1).
    #[serde(default)]
    pub offset: Option<u64>,
    /// How many lines to return at most (default 2000).
    #[serde(default)]
    pub limit: Option<u64>,
}

/// `write_file`: create or replace a file.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The file; a relative path starts from the terminal session's current directory. Parent directories are created.
    pub path: String,
    /// The whole new content.
    pub content: String,
}

/// `edit_file`: replace one exact piece of text in a file.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// The file; a relative path starts from the terminal session's current directory.
    pub path: String,
    /// The exact text to replace; it must occur exactly once in the file.
    pub old: String,
    /// The text to put in its place.
    pub new: String,
}

/// What `sandbox` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SandboxAction {
    /// The sandboxes of a backend.
    List,
    /// Create a sandbox (or re-attach to the one with that name).
    Create,
    /// Destroy a sandbox and its workspace.
    Destroy,
}

/// `sandbox`: list, create and destroy sandboxes.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// list | create | destroy
    pub action: SandboxAction,
    /// The sandbox's name (create, destroy).
    #[serde(default)]
    pub name: Option<String>,
    /// Its backend (default: this session's).
    #[serde(default)]
    pub backend: Option<String>,
}

/// What `memory` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemoryAction {
    /// Keep a note for later runs.
    Add,
    /// Find notes by words (all of them, else any); no query lists the newest.
    Search,
    /// Drop a note that turned out wrong or stale.
    Forget,
}

/// Whose a new note is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemoryScope {
    /// This sandbox's (the default).
    #[default]
    Sandbox,
    /// The user's, seen from every sandbox (only when the policy allows).
    User,
}

/// `memory`: curated notes that later runs start with.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryArgs {
    /// add | search | forget
    pub action: MemoryAction,
    /// add: the note, one fact in a sentence or two.
    #[serde(default)]
    pub text: Option<String>,
    /// search: words to look for.
    #[serde(default)]
    pub query: Option<String>,
    /// forget: the note's id, as search shows it.
    #[serde(default)]
    pub id: Option<i64>,
    /// add: sandbox (default) or user.
    #[serde(default)]
    pub scope: Option<MemoryScope>,
}

/// `history_search`: find words in past runs' transcripts.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistorySearchArgs {
    /// Words to look for (all of them, else any).
    pub query: String,
    /// At most this many matches (default 10, at most 50).
    #[serde(default)]
    pub limit: Option<u64>,
}

/// Parse `raw` into `A`, or an invalid-arguments outcome that names the field.
pub(crate) fn parse<A: DeserializeOwned>(raw: Value) -> Result<A, ToolOutcome> {
    let raw = if raw.is_null() {
        Value::Object(Default::default())
    } else {
        raw
    };
    if !raw.is_object() {
        return Err(ToolOutcome::invalid(format!(
            "arguments must be a JSON object, not {}",
            kind_of(&raw)
        )));
    }
    serde_path_to_error::deserialize::<_, A>(raw).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        ToolOutcome::invalid(if path == "." {
            format!("invalid arguments: {inner}")
        } else {
            format!("invalid argument `{path}`: {inner}")
        })
    })
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn schema<A: JsonSchema>() -> Value {
    let mut v = serde_json::to_value(schemars::schema_for!(A)).unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
        o.remove("description");
    }
    v
}

const TERMINAL: &str = "Run a bash command in the sandbox's persistent shell session. State persists between calls: the working directory (cd), exported variables, shell functions and aliases, and activated virtualenvs. Output is stdout, then stderr after a `[stderr]` line; long output keeps its head and tail. A timeout stops the command and its process tree, and the session survives it. For servers, watchers or anything longer than a few minutes, set background=true and follow the job with the `process` tool. Each result ends with the exit code.";
const PROCESS: &str = "Manage background jobs started with terminal(background=true). Jobs run detached from the session and survive restarts of berth. Actions: list; status (state, exit code); log (output from a byte offset, with the offset to read from next); wait (until the job ends or `timeout` seconds pass; the job keeps running after a timeout); kill (signal the job's whole process group); send (write to the job's stdin, eof=true closes it).";
const READ_FILE: &str = "Read a text file in the sandbox. Relative paths are under the workspace. Returns lines offset..offset+limit (default the first 2000) and says how to read on; secrets are masked. Prefer it to `cat` for files you mean to edit.";
const WRITE_FILE: &str = "Create or replace a file in the sandbox with the given content, creating parent directories. Relative paths are under the workspace.";
const EDIT_FILE: &str = "Replace one exact piece of text in a file: `old` must occur exactly once (include surrounding lines to make it unique; whitespace counts). Fails, changing nothing, when `old` is missing or occurs more than once.";
const MEMORY: &str = "Keep notes across runs. add: a fact worth knowing next time (how to build or test this project, where things are, what failed and why); later runs in this sandbox start with the newest notes in their instructions. search: find notes by words. forget: drop a note by id when it turns out wrong or stale. Secrets are masked before a note is kept.";
const HISTORY_SEARCH: &str = "Search the transcripts of past runs (and of this one, including tool results dropped from your context) by words. Returns matching passages with their run id and step; a person reads a whole run with `berth runs show RUN`.";
const SANDBOX: &str = "List, create or destroy sandboxes. A sandbox is an isolated machine with its own files, persistent shell and jobs; destroying one deletes its workspace.";

/// The spec of `tool`.
pub(crate) fn spec(tool: Tool) -> ToolSpec {
    let (description, input_schema) = match tool {
        Tool::Terminal => (TERMINAL, schema::<TerminalArgs>()),
        Tool::Process => (PROCESS, schema::<ProcessArgs>()),
        Tool::ReadFile => (READ_FILE, schema::<ReadFileArgs>()),
        Tool::WriteFile => (WRITE_FILE, schema::<WriteFileArgs>()),
        Tool::EditFile => (EDIT_FILE, schema::<EditFileArgs>()),
        Tool::Sandbox => (SANDBOX, schema::<SandboxArgs>()),
        Tool::Memory => (MEMORY, schema::<MemoryArgs>()),
        Tool::HistorySearch => (HISTORY_SEARCH, schema::<HistorySearchArgs>()),
    };
    ToolSpec {
        name: tool.name().into(),
        description: description.into(),
        input_schema,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field() {
        let e = parse::<TerminalArgs>(json!({"command": 5})).unwrap_err();
        assert!(e.text.contains("`command`"), "{}", e.text);
        let e = parse::<TerminalArgs>(json!({})).unwrap_err();
        assert!(e.text.contains("missing field `command`"), "{}", e.text);
        let e = parse::<TerminalArgs>(json!({"command": "ls", "timout": 3})).unwrap_err();
        assert!(e.text.contains("timout"), "{}", e.text);
        let e = parse::<ProcessArgs>(json!({"action": "explode"})).unwrap_err();
        assert!(
            e.text.contains("`action`") && e.text.contains("explode"),
            "{}",
            e.text
        );
        let e = parse::<ReadFileArgs>(json!("x")).unwrap_err();
        assert!(e.text.contains("JSON object"), "{}", e.text);
        let ok = parse::<ProcessArgs>(json!({"action": "logs", "job_id": "j1"})).unwrap();
        assert_eq!(ok.action, ProcessAction::Log);
    }

    #[test]
    fn schemas_are_objects_with_required_fields() {
        for t in [
            Tool::Terminal,
            Tool::ReadFile,
            Tool::EditFile,
            Tool::Process,
        ] {
            let s = spec(t).input_schema;
            assert_eq!(s["type"], "object", "{s}");
            assert!(s["required"].is_array(), "{s}");
        }
        let s = spec(Tool::Terminal).input_schema;
        assert_eq!(s["required"], json!(["command"]));
        assert!(s["properties"]["timeout"].is_object());
    }
}
