//! `berth shell` in a real terminal: tmux runs the binary, sends keys and
//! reads the screen back. tmux must be installed; without it the test fails.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{BoxError, TestResult};

/// How long a screen may take to show what a step expects.
const DEADLINE: Duration = Duration::from_secs(90);

/// A tmux server of its own (its own socket), killed when the test ends.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Start a 120x40 terminal running `script` under `sh`.
    fn start(script: &str) -> Result<Tmux, BoxError> {
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

    fn type_line(&self, text: &str) -> TestResult {
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
    fn wait(&self, label: &str, what: impl Fn(&str) -> bool) -> Result<String, BoxError> {
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
