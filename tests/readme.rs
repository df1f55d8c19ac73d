//! The README's examples, run as shown (issue 50): the tour on the local
//! backend, the Docker block against the real engine, the SSH block of
//! "What a sandbox keeps" against a real sshd that `~/.ssh/config` calls
//! `box1`, as the README does, and the E2B and Modal blocks against the
//! stand-in binaries the README offers to those without an account.
//!
//! Each line of a block is read from README.md itself and run with `bash -c`,
//! the built `berth` first on `PATH`, from a directory holding what the
//! README says the block starts from. A line passes when it exits as its
//! comment says (`exits N`), or with 0; an optional part (`[--json]`) runs in
//! its plain form. Lines that need a person at a terminal are left out by
//! name, each with the test that drives it in a real one. A few lines'
//! output is checked too, where the README's comment promises it.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{BoxError, TestResult, text};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

/// How long one line may take (a docker sandbox's first start included).
const LINE_DEADLINE: Duration = Duration::from_secs(180);

/// Lines a person drives at a terminal, and where each is tested so.
const INTERACTIVE: [(&str, &str); 3] = [
    ("berth attach ", "tests/terminal.rs"),
    ("berth shell ", "tests/shell.rs, in tmux"),
    ("berth ui", "tests/ui.rs, in headless Chromium"),
];

/// The lines of the first `sh` block after the heading `heading`.
fn block(heading: &str) -> Result<Vec<String>, BoxError> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))?;
    let at = readme
        .find(&format!("\n{heading}\n"))
        .ok_or_else(|| format!("README.md has no heading `{heading}`"))?;
    let rest = &readme[at..];
    let start = rest
        .find("```sh\n")
        .ok_or_else(|| format!("no sh block under `{heading}`"))?
        + "```sh\n".len();
    let len = rest[start..]
        .find("```\n")
        .ok_or_else(|| format!("the sh block under `{heading}` does not end"))?;
    Ok(rest[start..start + len].lines().map(String::from).collect())
}

/// One line of a block: the command as it runs, and the status it promises.
#[derive(Debug, PartialEq)]
struct Line {
    cmd: String,
    exit: i32,
}

/// A README line as it runs: its comment gone, its optional parts left out.
/// `None` for a comment or a blank line.
fn parse(raw: &str) -> Option<Line> {
    let t = raw.trim();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    let (cmd, comment) = t.find(" # ").map_or((t, ""), |i| (&t[..i], &t[i..]));
    let mut plain = String::new();
    let mut depth = 0;
    for c in cmd.chars() {
        match c {
            '[' => depth += 1,
            ']' if depth > 0 => depth -= 1,
            c if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let exit = comment
        .split("exits ")
        .nth(1)
        .and_then(|r| {
            r.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0);
    Some(Line {
        cmd: plain.split_whitespace().collect::<Vec<_>>().join(" "),
        exit,
    })
}

/// A place to run README lines from: a project directory, a state dir, and
/// how every command is set up (`HOME`, for the ssh block).
struct Reader {
    dir: tempfile::TempDir,
    home: Option<PathBuf>,
    /// Variables every line gets (a stand-in's settings, as exported).
    env: Vec<(String, String)>,
    /// The run of each line, by its command.
    seen: HashMap<String, Output>,
}

impl Reader {
    fn new() -> Result<Reader, BoxError> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("here"))?;
        Ok(Reader {
            dir,
            home: None,
            env: Vec::new(),
            seen: HashMap::new(),
        })
    }

    /// The directory the README's lines run from.
    fn here(&self) -> PathBuf {
        self.dir.path().join("here")
    }

    fn command(&self, shell: &str) -> Command {
        let bin = Path::new(BERTH).parent().map(Path::to_path_buf);
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs: Vec<PathBuf> = bin.into_iter().collect();
        dirs.extend(std::env::split_paths(&path));
        let mut c = Command::new("bash");
        c.arg("-c")
            .arg(shell)
            .current_dir(self.here())
            .env("PATH", std::env::join_paths(dirs).unwrap_or(path))
            .env("BERTH_STATE_DIR", self.dir.path().join("state"))
            .env("BERTH_POLICY", self.dir.path().join("policy.toml"))
            .env_remove("BERTH_SERVER")
            .env_remove("BERTH_SERVER_IDLE")
            .env_remove("BERTH_SSH_HOST")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        if let Some(h) = &self.home {
            c.env("HOME", h).env_remove("SSH_AUTH_SOCK");
        }
        c
    }

    /// Run `shell` to its end, or fail after [`LINE_DEADLINE`].
    fn sh(&self, shell: &str) -> Result<Output, BoxError> {
        let out = self.dir.path().join("stdout");
        let err = self.dir.path().join("stderr");
        let mut child = self
            .command(shell)
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?)
            .spawn()?;
        let deadline = Instant::now() + LINE_DEADLINE;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{shell}` still ran after {LINE_DEADLINE:?}; stderr: {}",
                    std::fs::read_to_string(&err).unwrap_or_default()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Output {
            status,
            stdout: std::fs::read(&out)?,
            stderr: std::fs::read(&err)?,
        })
    }

    /// `shell`, which must exit 0; its stdout.
    fn ok(&self, shell: &str) -> Result<String, BoxError> {
        let o = self.sh(shell)?;
        if o.status.code() != Some(0) {
            return Err(format!("`{shell}`: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Run every line of the block under `heading`, in order, each through
    /// `fill` (for a value only known at run time); each must exit as it
    /// says. Returns the commands run.
    fn follow(
        &mut self,
        heading: &str,
        fill: &dyn Fn(&Reader, &str) -> Result<String, BoxError>,
    ) -> Result<Vec<String>, BoxError> {
        let mut ran = Vec::new();
        for raw in block(heading)? {
            let Some(line) = parse(&raw) else { continue };
            if INTERACTIVE.iter().any(|(p, _)| line.cmd.starts_with(p)) {
                continue;
            }
            let cmd = fill(self, &line.cmd)?;
            let o = self.sh(&cmd)?;
            if o.status.code() != Some(line.exit) {
                return Err(format!(
                    "README line `{}` (run as `{cmd}`) should exit {}: {}",
                    raw.trim(),
                    line.exit,
                    text(&o)
                )
                .into());
            }
            ran.push(line.cmd.clone());
            self.seen.insert(line.cmd, o);
        }
        Ok(ran)
    }

    /// What the line `cmd` printed when it ran.
    fn stdout(&self, cmd: &str) -> Result<String, BoxError> {
        let o = self
            .seen
            .get(cmd)
            .ok_or_else(|| format!("the README line `{cmd}` did not run"))?;
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Kill the jobs left running in `backend`'s sandboxes.
    fn kill_jobs(&self, backend: &str) {
        let Ok(ls) = self.ok(&format!("berth job ls -b {backend} --json")) else {
            return;
        };
        let jobs: Value = serde_json::from_str(&ls).unwrap_or_default();
        for j in jobs.as_array().into_iter().flatten() {
            if j["state"] == "running"
                && let Some(id) = j["id"].as_str()
            {
                let _ = self.sh(&format!("berth job kill -b {backend} {id} --signal kill"));
            }
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.sh("berth server stop");
    }
}

fn write_exec(path: &Path, body: &str) -> TestResult {
    std::fs::write(path, body)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Wait until `cond` holds, for up to 30 s.
fn eventually(what: &str, mut cond: impl FnMut() -> Result<bool, BoxError>) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond()? {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within 30 s").into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

#[test]
fn readme_lines_read_as_they_run() {
    let l = |cmd: &str, exit| {
        Some(Line {
            cmd: cmd.into(),
            exit,
        })
    };
    assert_eq!(
        parse("berth exec --timeout 5 -- 'sleep 60'       # exits 124; the sleep"),
        l("berth exec --timeout 5 -- 'sleep 60'", 124)
    );
    assert_eq!(
        parse("berth sandbox clone web web2 [--at ID]     # a new sandbox"),
        l("berth sandbox clone web web2", 0)
    );
    assert_eq!(
        parse("berth job wait build --timeout 600  # exits with the job's code"),
        l("berth job wait build --timeout 600", 0)
    );
    assert_eq!(parse("# ...where `python3`"), None);
    assert_eq!(parse("   "), None);
}

/// The tour of "A short tour", on the default (local) backend.
#[test]
fn the_tour_runs_as_shown() -> TestResult {
    let mut r = Reader::new()?;
    let here = r.here();
    std::fs::create_dir(here.join("app"))?;
    std::fs::write(
        here.join("app/Makefile"),
        "all:\n\t@echo built\ntest:\n\t@echo tests passed\n",
    )?;
    write_exec(
        &here.join("app/serve.sh"),
        "#!/bin/sh\nread -r answer\necho \"got $answer\"\nexec sleep 300\n",
    )?;
    std::fs::write(here.join("data.csv"), "id,v\n1,2\n")?;
    // The checkpoint id is the one `checkpoints` lists for the label.
    let fill = |r: &Reader, cmd: &str| -> Result<String, BoxError> {
        if !cmd.contains("k1a2b3c4d5") {
            return Ok(cmd.to_string());
        }
        let list: Value = serde_json::from_str(&r.ok("berth sandbox checkpoints web --json")?)?;
        let id = list
            .as_array()
            .and_then(|l| l.iter().find(|c| c["label"] == "clean"))
            .and_then(|c| c["id"].as_str())
            .ok_or_else(|| format!("no checkpoint labelled clean: {list}"))?;
        Ok(cmd.replace("k1a2b3c4d5", id))
    };
    let result = r.follow("## A short tour", &fill).and_then(|ran| {
        eventually("python's answer on the screen", || {
            Ok(r.ok("berth job screen py")
                .unwrap_or_default()
                .contains("42"))
        })?;
        Ok(ran)
    });
    r.kill_jobs("local");
    let ran = result?;
    assert!(ran.len() >= 25, "{ran:?}");
    // What the comments promise.
    let pwd = r.stdout("berth exec -- 'pwd; echo $A'")?;
    assert!(pwd.ends_with("/app\n1\n"), "{pwd}");
    assert!(
        r.stdout("berth exec --session tests -- 'make -C app test'")?
            .contains("tests passed")
    );
    let json: Value = serde_json::from_str(&r.stdout("berth exec --json -- make test")?)?;
    assert_eq!(json["exit_code"], 0, "{json}");
    assert!(
        json["cwd"].as_str().is_some_and(|c| c.ends_with("/app")),
        "{json}"
    );
    assert_eq!(
        r.stdout("echo data | berth exec --stdin -- wc -c")?.trim(),
        "5"
    );
    assert_eq!(
        std::fs::read_to_string(here.join("results/data.csv"))?,
        "id,v\n1,2\n",
        "the tree out holds the file copied in"
    );
    assert!(here.join("results/serve.sh").exists());
    assert!(r.stdout("berth job logs build --follow")?.contains("built"));
    assert!(r.stdout("berth sandbox checkpoints web")?.contains("clean"));
    Ok(())
}

/// The Docker block, against the real engine and the image `images/` builds.
#[cfg(feature = "docker")]
#[test]
fn the_docker_block_runs_as_shown() -> TestResult {
    let mut r = Reader::new()?;
    let same = |_: &Reader, cmd: &str| Ok(cmd.to_string());
    let result = r.follow("### Docker", &same);
    if result.is_err() {
        let _ = r.sh("berth sandbox rm web --backend docker");
    }
    let ran = result?;
    assert_eq!(ran.len(), 7, "{ran:?}");
    let pip = r.stdout("berth exec --backend docker --sandbox web -- 'pip --version'")?;
    assert!(pip.starts_with("pip "), "{pip}");
    let inspect = r.stdout("berth sandbox inspect web --backend docker")?;
    assert!(inspect.contains("network"), "{inspect}");
    Ok(())
}

/// "What a sandbox keeps", against a real sshd known as `box1`.
#[cfg(feature = "ssh")]
#[test]
fn the_ssh_block_runs_as_shown() -> TestResult {
    let host = crate::support::box1::Box1::start()?;
    let mut r = Reader::new()?;
    r.home = Some(host.home.clone());
    write_exec(
        &r.here().join("serve"),
        "#!/bin/sh\necho serving\nexec sleep 300\n",
    )?;
    let same = |_: &Reader, cmd: &str| Ok(cmd.to_string());
    let result = r.follow("#### What a sandbox keeps", &same);
    if result.is_err() {
        r.kill_jobs("ssh");
        let _ = r.sh("berth sandbox rm srv -b ssh");
    }
    let ran = result?;
    assert_eq!(ran.len(), 7, "{ran:?}");
    assert!(!r.stdout("berth exec -b ssh -s srv -- uptime")?.is_empty());
    let all = r.stdout("berth sandbox ls --all")?;
    assert!(all.contains("srv") && all.contains("ssh"), "{all}");
    Ok(())
}

/// A stand-in binary (`e2b-standin`, `modal-standin`) started as the README
/// says, `--port 0`, and the `KEY=VALUE` lines it prints; killed on drop.
struct StandinBin {
    child: std::process::Child,
    vars: Vec<(String, String)>,
}

impl StandinBin {
    fn start(name: &str, keys: usize) -> Result<StandinBin, BoxError> {
        use std::io::BufRead;
        let bin = Path::new(BERTH).parent().ok_or("no target dir")?.join(name);
        if !bin.exists() {
            return Err(format!(
                "{} is missing: build it with `cargo build -p berth-standins --bins`",
                bin.display()
            )
            .into());
        }
        let mut child = Command::new(&bin)
            .args(["--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child.stdout.take().ok_or("no stdout")?;
        let mut lines = std::io::BufReader::new(out).lines();
        let mut vars = Vec::new();
        while vars.len() < keys {
            let Some(line) = lines.next() else {
                let _ = child.kill();
                return Err(format!("{name} exited before printing its settings").into());
            };
            let line = line?;
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("{name} printed `{line}`, not KEY=VALUE"))?;
            vars.push((k.to_string(), v.to_string()));
        }
        Ok(StandinBin { child, vars })
    }
}

impl Drop for StandinBin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The E2B block, against `e2b-standin`, whose settings are exported as
/// the README says to (its own `export` line sets a placeholder key in a
/// shell of its own, as pasting it alone would).
#[cfg(feature = "e2b")]
#[test]
fn the_e2b_block_runs_against_its_stand_in() -> TestResult {
    let standin = StandinBin::start("e2b-standin", 3)?;
    let mut r = Reader::new()?;
    r.env = standin.vars.clone();
    let same = |_: &Reader, cmd: &str| Ok(cmd.to_string());
    let ran = r.follow("### E2B", &same)?;
    assert_eq!(ran.len(), 4, "{ran:?}");
    let py = r.stdout("berth exec --backend e2b --sandbox agent -- 'python3 --version'")?;
    assert!(py.starts_with("Python 3"), "{py}");
    let ls = r.ok("berth sandbox ls --backend e2b --json")?;
    let list: Value = serde_json::from_str(&ls)?;
    assert!(
        !list
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["name"] == "agent")),
        "the block's last line removed its sandbox: {ls}"
    );
    Ok(())
}

/// The Modal block, against `modal-standin` (its `--image` left out: the
/// stand-in pulls nothing).
#[cfg(feature = "modal")]
#[test]
fn the_modal_block_runs_against_its_stand_in() -> TestResult {
    let standin = StandinBin::start("modal-standin", 3)?;
    let mut r = Reader::new()?;
    r.env = standin.vars.clone();
    // No ~/.modal.toml of the machine's may stand in for the exported token.
    let home = r.dir.path().join("home");
    std::fs::create_dir(&home)?;
    r.home = Some(home);
    let same = |_: &Reader, cmd: &str| Ok(cmd.to_string());
    let ran = r.follow("### Modal", &same)?;
    assert_eq!(ran.len(), 4, "{ran:?}");
    let uname = r.stdout("berth exec --backend modal --sandbox box -- 'uname -a'")?;
    assert!(uname.starts_with("Linux "), "{uname}");
    Ok(())
}
