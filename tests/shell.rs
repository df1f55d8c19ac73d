//! `berth shell` in a real terminal: tmux runs the binary, sends keys and
//! reads the screen back. tmux must be installed; without it the test fails.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{BoxError, TestResult};

/// How long a screen may take to show what a step expects.
const DEADLINE: Duration = Duration::from_secs(90);

/// A tmux server of its own (its own socket), killed when the test ends.
pub(crate) struct Tmux {
    socket: String,
}

impl Tmux {
    /// Start a 120x40 terminal running `script` under `sh`.
    pub(crate) fn start(script: &str) -> Result<Tmux, BoxError> {
        let socket = format!("berth-test-{}-{}", std::process::id(), rand_suffix());
        let t = Tmux { socket };
        let o = t
            .cmd()
            .args(["new-session", "-d", "-x", "120", "-y", "40", "-s", "t"])
            .arg(script)
            .output()
            .map_err(|e| format!("cannot run tmux ({e}); install it: apt-get install tmux"))?;
        if !o.status.success() {
            return Err(format!(
                "tmux new-session failed: {}",
                String::from_utf8_lossy(&o.stderr)
            )
            .into());
        }
        Ok(t)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket, "-f", "/dev/null"]);
        c
    }

    /// Send tmux key names (`Enter`, `C-c`, `Up`) or literal text with `-l`.
    fn keys(&self, keys: &[&str]) -> TestResult {
        let o = self
            .cmd()
            .args(["send-keys", "-t", "t"])
            .args(keys)
            .output()?;
        if !o.status.success() {
            return Err(format!("tmux send-keys: {}", String::from_utf8_lossy(&o.stderr)).into());
        }
        Ok(())
    }

    pub(crate) fn type_line(&self, text: &str) -> TestResult {
        self.keys(&["-l", text])?;
        self.keys(&["Enter"])
    }

    /// The screen and its scrollback.
    fn screen(&self) -> Result<String, BoxError> {
        let o = self
            .cmd()
            .args(["capture-pane", "-p", "-J", "-S", "-1000", "-t", "t"])
            .output()?;
        if !o.status.success() {
            return Err(
                format!("tmux capture-pane: {}", String::from_utf8_lossy(&o.stderr)).into(),
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The visible screen only.
    fn visible(&self) -> Result<String, BoxError> {
        let o = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()?;
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Wait until the screen satisfies `what`; fail with the screen if it never does.
    pub(crate) fn wait(
        &self,
        label: &str,
        what: impl Fn(&str) -> bool,
    ) -> Result<String, BoxError> {
        let start = Instant::now();
        loop {
            let s = self.screen()?;
            if what(&s) {
                return Ok(s);
            }
            if start.elapsed() > DEADLINE {
                return Err(format!("the terminal never showed {label}; it shows:\n{s}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Wait until `needle` appears `n` times.
    fn wait_count(&self, needle: &str, n: usize) -> Result<String, BoxError> {
        self.wait(&format!("{n} x {needle:?}"), |s| {
            s.matches(needle).count() >= n
        })
    }
}

impl Tmux {
    /// Close the terminal, as closing its window does: what runs in it gets SIGHUP.
    fn close(&self) -> TestResult {
        let o = self.cmd().arg("kill-server").output()?;
        if !o.status.success() {
            return Err(format!("tmux kill-server: {}", String::from_utf8_lossy(&o.stderr)).into());
        }
        Ok(())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").output();
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

fn shell_script(state: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_berth");
    let state = state.display();
    // Twice, to see the history survive; each exit status is printed.
    format!(
        "export BERTH_STATE_DIR='{state}' BERTH_POLICY='{state}/policy.toml'; \
         '{bin}' shell; echo \"first-exit-$?\"; '{bin}' shell; echo \"second-exit-$?\"; exec sleep 600"
    )
}

/// The prompt as capture-pane shows it: an empty line's trailing space is trimmed.
const PROMPT: &str = "berth:default:~ $";

#[test]
fn berth_shell_edits_recalls_completes_and_survives_ctrl_c() -> TestResult {
    let dir = tempfile::tempdir()?;
    let t = Tmux::start(&shell_script(dir.path()))?;
    t.wait_count(PROMPT, 1)?;

    // State, and a line to recall.
    t.type_line("export KEEP=kept; touch uniquefile-abc")?;
    t.wait_count(PROMPT, 2)?;
    t.type_line("echo answer-$((6*7))")?;
    t.wait_count("answer-42", 1)?;
    t.wait_count(PROMPT, 3)?;

    // Up recalls the last line; Enter runs it again.
    t.keys(&["Up"])?;
    t.wait("the recalled line", |s| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.ends_with("echo answer-$((6*7))"))
    })?;
    t.keys(&["Enter"])?;
    t.wait_count("answer-42", 2)?;
    t.wait_count(PROMPT, 4)?;

    // Tab completes a path from the sandbox's own shell.
    t.keys(&["-l", "cat uniquef"])?;
    t.keys(&["Tab"])?;
    t.wait("the completed path", |s| s.contains("cat uniquefile-abc"))?;
    t.keys(&["Enter"])?;
    t.wait_count(PROMPT, 5)?;

    // Ctrl-C at the prompt drops the line.
    t.keys(&["-l", "echo never-run-$((1+1))"])?;
    t.keys(&["C-c"])?;
    t.wait_count(PROMPT, 6)?;

    // Ctrl-C during a command stops only the command.
    t.type_line("echo sleeping-now; sleep 30")?;
    t.wait("the command running", |s| {
        s.lines().any(|l| l == "sleeping-now")
    })?;
    t.keys(&["C-c"])?;
    t.wait_count("berth:default:~ [130] $", 1)?;
    t.type_line("echo status=$? keep=$KEEP")?;
    let s = t.wait_count("keep=kept", 1)?;
    assert!(s.contains("status=130 keep=kept"), "{s}");
    assert!(
        !s.contains("never-run-2"),
        "a line dropped with Ctrl-C ran:\n{s}"
    );

    // Ctrl-D leaves with 0.
    t.wait_count(PROMPT, 7)?;
    t.keys(&["C-d"])?;
    t.wait_count("first-exit-0", 1)?;

    // The history is kept per sandbox: a new shell recalls the last line.
    t.wait_count(PROMPT, 8)?;
    t.keys(&["Up"])?;
    t.wait("the history of the last shell", |s| {
        s.lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.ends_with("echo status=$? keep=$KEEP"))
    })?;
    t.keys(&["C-c"])?;
    t.wait_count(PROMPT, 9)?;
    t.type_line("exit")?;
    t.wait_count("second-exit-0", 1)?;
    Ok(())
}

/// `berth attach` in a real terminal, on a docker terminal job: the job takes
/// the terminal's size, keys reach the program (Ctrl-C included), Ctrl-]
/// detaches and leaves it running, and attaching again redraws its screen.
#[test]
fn berth_attach_drives_a_terminal_job_and_detaches() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bin = env!("CARGO_BIN_EXE_berth");
    let berth = |args: &[&str]| -> Result<std::process::Output, BoxError> {
        Ok(Command::new(bin)
            .env("BERTH_STATE_DIR", dir.path())
            .env("BERTH_SERVER", "off")
            .args(args)
            .output()?)
    };
    let o = berth(&["sandbox", "create", "attach", "-b", "docker"])?;
    assert!(o.status.success(), "{o:?}");
    // Removed however the test ends, a failed assertion included.
    struct Remove<'a>(&'a dyn Fn(&[&str]) -> Result<std::process::Output, BoxError>);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["sandbox", "rm", "attach", "-b", "docker"]);
        }
    }
    let _remove = Remove(&berth);
    let o = berth(&[
        "job", "start", "-b", "docker", "-s", "attach", "--pty", "--name", "py", "--", "python3",
        "-q", "-i",
    ])?;
    assert!(o.status.success(), "{o:?}");
    let script = format!(
        "export BERTH_STATE_DIR='{}' BERTH_SERVER=off; '{bin}' attach py; echo \"attach-exit-$?\"; \
         read -r _; echo ==second==; '{bin}' attach py; echo \"second-attach-exit-$?\"; exec sleep 600",
        dir.path().display()
    );
    let t = Tmux::start(&script)?;
    {
        t.wait(">>> prompt", |s| s.contains(">>>"))?;
        t.type_line("import os; print(os.get_terminal_size())")?;
        t.wait("the terminal's size", |s| {
            s.contains("os.terminal_size(columns=120, lines=40)")
        })?;
        t.type_line("import time; time.sleep(60)")?;
        std::thread::sleep(Duration::from_millis(500));
        t.keys(&["C-c"])?;
        t.wait("KeyboardInterrupt", |s| s.contains("KeyboardInterrupt"))?;
        t.type_line("6*7")?;
        t.wait("42", |s| s.lines().any(|l| l.trim() == "42"))?;
        // Ctrl-] detaches; the job goes on.
        t.keys(&["C-]"])?;
        t.wait_count("attach-exit-0", 1)?;
        let o = berth(&["job", "ls", "--json"])?;
        let ls: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        assert_eq!(ls[0]["state"], "running", "{ls}");
        assert_eq!(ls[0]["pty"], "120x40", "{ls}");
        // The screen from the CLI, as the terminal showed it.
        let o = berth(&["job", "screen", "py"])?;
        let screen = String::from_utf8_lossy(&o.stdout);
        assert!(screen.lines().any(|l| l == "42"), "{screen}");
        assert!(screen.trim_end().ends_with(">>>"), "{screen}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("screen 120x40"), "{err}");
        let o = berth(&["job", "screen", "py", "--json"])?;
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)?;
        assert_eq!(v["cols"], 120, "{v}");
        assert!(
            v["lines"]
                .as_array()
                .is_some_and(|l| l.iter().any(|l| l == "42")),
            "{v}"
        );
        // Attached again, the screen is drawn as it was, and the job's end ends it.
        t.keys(&["Enter"])?;
        let start = Instant::now();
        loop {
            let v = t.visible()?;
            if !v.contains("==second==") && v.lines().any(|l| l.trim() == "42") {
                break;
            }
            if start.elapsed() > DEADLINE {
                return Err(format!("attaching again did not redraw the screen:\n{v}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        t.type_line("exit()")?;
        t.wait_count("second-attach-exit-0", 1)?;
    }
    Ok(())
}

/// The `berth` binary with this state dir, on the local backend, in-process.
fn berth_in(state: &Path, args: &[&str]) -> Result<std::process::Output, BoxError> {
    Ok(Command::new(env!("CARGO_BIN_EXE_berth"))
        .env("BERTH_STATE_DIR", state)
        .env("BERTH_POLICY", state.join("policy.toml"))
        .env("BERTH_SERVER", "off")
        .stdin(std::process::Stdio::null())
        .args(args)
        .output()?)
}

/// One `berth shell` in tmux, then its exit status.
fn one_shell_script(state: &Path) -> String {
    let bin = env!("CARGO_BIN_EXE_berth");
    let state = state.display();
    format!(
        "export BERTH_STATE_DIR='{state}' BERTH_POLICY='{state}/policy.toml' BERTH_SERVER=off; \
         '{bin}' shell; echo \"shell-exit-$?\"; exec sleep 600"
    )
}

/// Lines that need a terminal get one, as with `ssh -t`: python3's REPL
/// (on a terminal of this one's size, in the session's cwd and exported
/// environment), `tty read`, vim. `$?` is the program's, the session is
/// intact after each, Ctrl-] detaches, and an ended line's job is gone
/// from `berth job ls`.
#[test]
fn berth_shell_runs_terminal_programs_on_a_terminal() -> TestResult {
    let dir = tempfile::tempdir()?;
    let t = Tmux::start(&one_shell_script(dir.path()))?;
    let s = t.wait_count(PROMPT, 1)?;
    assert!(
        s.contains("without a terminal") && s.contains("tty COMMAND"),
        "the banner does not say how to get a terminal:\n{s}"
    );
    t.type_line("mkdir -p sub && cd sub && export KEEP=kept")?;
    let sub = "berth:default:~/sub $";
    t.wait_count(sub, 1)?;

    // python3, as typed, gets a REPL.
    t.type_line("python3")?;
    t.wait(">>> prompt", |s| s.lines().any(|l| l.starts_with(">>>")))?;
    t.type_line(
        "import os; print('seen', os.getcwd().endswith('/sub'), os.environ.get('KEEP'), \
         os.isatty(0), tuple(os.get_terminal_size()))",
    )?;
    t.wait("python's view of its terminal", |s| {
        s.contains("seen True kept True (120, 40)")
    })?;
    t.type_line("6*7")?;
    t.wait("42", |s| s.lines().any(|l| l.trim() == "42"))?;
    t.type_line("exit()")?;
    t.wait_count(sub, 2)?;
    t.type_line("echo pwd=$PWD keep=$KEEP status=$?")?;
    let s = t.wait_count("keep=kept status=0", 1)?;
    assert!(s.contains("/sub keep=kept status=0"), "{s}");
    t.wait_count(sub, 3)?;

    // `tty` puts any line on a terminal: `read` reads what is typed, and
    // the line's status is `$?`.
    t.type_line("tty read -p 'name? ' x; echo \"got=$x\"; exit 3")?;
    t.wait("read's prompt", |s| {
        s.lines().any(|l| l.trim_end().ends_with("name?"))
    })?;
    t.type_line("berth")?;
    t.wait_count("got=berth", 1)?;
    t.wait_count("berth:default:~/sub [3] $", 1)?;
    t.type_line("echo status=$?")?;
    t.wait_count("status=3", 1)?;
    t.wait_count(sub, 4)?;

    // vim opens full screen, takes keys, and `:wq` comes back to the prompt.
    t.type_line("vim notes.txt")?;
    let vim_screen = |s: &str| s.lines().filter(|l| l.starts_with('~')).count() >= 10;
    wait_visible(&t, "vim's screen", vim_screen)?;
    t.keys(&["i"])?;
    wait_visible(&t, "insert mode", |s| s.contains("-- INSERT --"))?;
    t.keys(&["-l", "hello from vim"])?;
    t.keys(&["Escape"])?;
    wait_visible(&t, "normal mode", |s| {
        s.contains("hello from vim") && !s.contains("-- INSERT --")
    })?;
    t.type_line(":wq")?;
    t.wait_count(sub, 5)?;
    t.type_line("tr a-z A-Z < notes.txt")?;
    t.wait_count("HELLO FROM VIM", 1)?;
    t.wait_count(sub, 6)?;

    // Ctrl-] detaches: the program goes on as a job, and the prompt is back.
    t.type_line("tty python3 -q -i -c 'print(\"py-\" + \"ready\")'")?;
    t.wait_count("py-ready", 1)?;
    t.keys(&["C-]"])?;
    t.wait("the detach", |s| s.contains("goes on as job"))?;
    t.wait_count(sub, 7)?;
    let o = berth_in(dir.path(), &["job", "ls", "--json"])?;
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    let jobs = jobs.as_array().ok_or("job ls --json is not a list")?;
    // Only the detached one: the others were pruned when they ended.
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["name"], "shell-tty", "{jobs:?}");
    assert_eq!(jobs[0]["state"], "running", "{jobs:?}");
    assert_eq!(jobs[0]["pty"], "120x40", "{jobs:?}");
    let o = berth_in(dir.path(), &["job", "kill", "shell-tty"])?;
    assert!(o.status.success(), "{o:?}");

    // The shell is intact after all of it.
    t.type_line("echo still=$KEEP")?;
    t.wait_count("still=kept", 1)?;
    t.type_line("exit")?;
    t.wait_count("shell-exit-0", 1)?;
    Ok(())
}

/// Wait until the visible screen (the alternate one, under a full-screen
/// program) satisfies `what`.
fn wait_visible(t: &Tmux, label: &str, what: impl Fn(&str) -> bool) -> Result<String, BoxError> {
    let start = Instant::now();
    loop {
        let s = t.visible()?;
        if what(&s) {
            return Ok(s);
        }
        if start.elapsed() > DEADLINE {
            return Err(format!("the terminal never showed {label}; it shows:\n{s}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A terminal line passes the policy gate like any line: a denied program
/// never starts, and the shell goes on.
#[test]
fn a_terminal_line_is_judged_by_the_policy() -> TestResult {
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("policy.toml"),
        "[[rules]]\nname = \"no-nano\"\naction = \"deny\"\nprefix = \"nano\"\n",
    )?;
    let t = Tmux::start(&one_shell_script(dir.path()))?;
    t.wait_count(PROMPT, 1)?;
    t.type_line("nano notes.txt")?;
    // The whole refusal, rule and all: the screen is read while it is drawn.
    let s = t.wait("the refusal", |s| {
        s.contains("policy refused") && s.contains("no-nano")
    })?;
    assert!(s.contains("matches `nano`"), "{s}");
    t.wait_count(PROMPT, 2)?;
    let o = berth_in(dir.path(), &["job", "ls", "--json"])?;
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(jobs, serde_json::json!([]), "a refused line left a job");
    t.type_line("exit")?;
    t.wait_count("shell-exit-0", 1)?;
    Ok(())
}

/// Without a terminal (piped input), nothing runs on one: a detected
/// program runs as before with a note, and `tty` says why it cannot.
#[test]
fn piped_berth_shell_never_opens_a_terminal() -> TestResult {
    use std::io::Write;
    let dir = tempfile::tempdir()?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .env("BERTH_STATE_DIR", dir.path())
        .env("BERTH_POLICY", dir.path().join("policy.toml"))
        .env("BERTH_SERVER", "off")
        .arg("shell")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    {
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        stdin.write_all(b"python3\necho after-python-$?\ntty read x\necho after-tty-$?\n")?;
    }
    let o = child.wait_with_output()?;
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    // python3 read EOF from /dev/null and ended at once, as before.
    assert!(out.contains("after-python-0"), "{out}\n{err}");
    assert!(
        err.contains("python3 runs without a terminal")
            && err.contains("berth job start --pty -- python3"),
        "{err}"
    );
    assert!(
        err.contains("`tty` needs berth shell on a terminal"),
        "{err}"
    );
    assert!(out.contains("after-tty-2"), "{out}\n{err}");
    assert!(
        !err.contains("commands here run without a terminal"),
        "a banner without a terminal:\n{err}"
    );
    let o = berth_in(dir.path(), &["job", "ls", "--json"])?;
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(jobs, serde_json::json!([]), "piped lines started jobs");
    Ok(())
}

/// The same on docker: python3 at the prompt of a docker sandbox's shell
/// gets a REPL on a terminal in the session's cwd, and the session is
/// intact after it.
#[test]
fn berth_shell_runs_a_repl_on_a_terminal_on_docker() -> TestResult {
    let dir = tempfile::tempdir()?;
    let berth = |args: &[&str]| berth_in(dir.path(), args);
    let o = berth(&["sandbox", "create", "shelltty", "-b", "docker"])?;
    assert!(o.status.success(), "{o:?}");
    // Removed however the test ends, a failed assertion included.
    struct Remove<'a>(&'a dyn Fn(&[&str]) -> Result<std::process::Output, BoxError>);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = (self.0)(&["sandbox", "rm", "shelltty", "-b", "docker"]);
        }
    }
    let _remove = Remove(&berth);
    let bin = env!("CARGO_BIN_EXE_berth");
    let state = dir.path().display();
    let t = Tmux::start(&format!(
        "export BERTH_STATE_DIR='{state}' BERTH_POLICY='{state}/policy.toml' BERTH_SERVER=off; \
         '{bin}' shell -b docker -s shelltty; echo \"shell-exit-$?\"; exec sleep 600"
    ))?;
    let prompt = "berth(docker):shelltty:~/sub $";
    t.wait_count("berth(docker):shelltty:~ $", 1)?;
    t.type_line("mkdir -p sub && cd sub && export KEEP=kept")?;
    t.wait_count(prompt, 1)?;
    t.type_line("python3")?;
    t.wait(">>> prompt", |s| s.lines().any(|l| l.starts_with(">>>")))?;
    t.type_line("import os; print('seen', os.getcwd(), os.environ.get('KEEP'), os.isatty(0))")?;
    t.wait("python's view", |s| {
        s.contains("seen /workspace/sub kept True")
    })?;
    t.type_line("6*7")?;
    t.wait("42", |s| s.lines().any(|l| l.trim() == "42"))?;
    t.type_line("exit()")?;
    t.wait_count(prompt, 2)?;
    t.type_line("echo pwd=$PWD keep=$KEEP")?;
    t.wait_count("pwd=/workspace/sub keep=kept", 1)?;
    let o = berth(&["job", "ls", "--json"])?;
    let jobs: serde_json::Value = serde_json::from_slice(&o.stdout)?;
    assert_eq!(jobs, serde_json::json!([]), "the ended line's job was kept");
    t.type_line("exit")?;
    t.wait_count("shell-exit-0", 1)?;
    Ok(())
}

/// A closed terminal ends the program a terminal line runs, as ssh does:
/// it does not go on unseen in the sandbox.
#[test]
fn closing_the_terminal_ends_a_terminal_lines_program() -> TestResult {
    let dir = tempfile::tempdir()?;
    let t = Tmux::start(&one_shell_script(dir.path()))?;
    t.wait_count(PROMPT, 1)?;
    t.type_line("python3 -q")?;
    t.wait(">>> prompt", |s| s.lines().any(|l| l.starts_with(">>>")))?;
    let jobs = |dir: &Path| -> Result<serde_json::Value, BoxError> {
        let o = berth_in(dir, &["job", "ls", "--json"])?;
        Ok(serde_json::from_slice(&o.stdout)?)
    };
    let running = jobs(dir.path())?;
    assert_eq!(running[0]["state"], "running", "{running}");
    t.close()?;
    let start = Instant::now();
    loop {
        let now = jobs(dir.path())?;
        if now == serde_json::json!([]) {
            break;
        }
        if start.elapsed() > DEADLINE {
            return Err(format!("the program outlived its terminal: {now}").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
