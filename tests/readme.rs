//! The README's examples, run as shown (issue 50): the tour on the local
//! backend, the Docker block against the real engine, the SSH block of
//! "What a sandbox keeps" against a real sshd that `~/.ssh/config` calls
//! `box1`, as the README does, the E2B and Modal blocks against the
//! stand-in binaries the README offers to those without an account, the
//! agent block against the provider stand-in (its chat in tmux), and the
//! MCP block with the official SDK's client.
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

/// Lines that are a person's only when they are the whole line, and where
/// each is driven in a real terminal.
const INTERACTIVE_WHOLE: [(&str, &str); 1] = [(
    "berth run",
    "the_agent_block_runs_against_the_provider_stand_in, in tmux",
)];

/// The lines of the first `sh` block after the heading `heading`.
fn block(heading: &str) -> Result<Vec<String>, BoxError> {
    let text = fenced(heading, "sh")?;
    // A line that ends in `\` goes on in the next, as in a shell.
    let mut lines: Vec<String> = Vec::new();
    let mut open = false;
    for l in text.lines() {
        match lines.last_mut() {
            Some(last) if open => {
                last.pop();
                last.push(' ');
                last.push_str(l.trim_start());
            }
            _ => lines.push(l.to_string()),
        }
        open = l.ends_with('\\');
    }
    Ok(lines)
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
            if INTERACTIVE.iter().any(|(p, _)| line.cmd.starts_with(p))
                || INTERACTIVE_WHOLE.iter().any(|(w, _)| line.cmd == *w)
            {
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
    assert_eq!(json["stdout"], "tests passed\n", "{json}");
    assert_eq!(json["stderr"], "", "{json}");
    // stdout and stderr come back apart, served and in-process alike.
    let out = |cmd: &str| -> Result<String, BoxError> {
        Ok(String::from_utf8_lossy(&r.sh(cmd)?.stdout).into_owned())
    };
    for server in ["", "BERTH_SERVER=off "] {
        let both = format!("{server}berth exec -- 'echo out; echo err >&2; ls /nonexistent-berth'");
        assert_eq!(out(&format!("{both} 2>/dev/null"))?, "out\n");
        let err = out(&format!("{both} 2>&1 >/dev/null"))?;
        assert!(
            err.starts_with("err\n") && err.contains("nonexistent-berth"),
            "{err}"
        );
        let json: Value = serde_json::from_str(&out(&format!(
            "{server}berth exec --json -- 'echo out; echo err >&2'"
        ))?)?;
        assert_eq!(
            (&json["stdout"], &json["stderr"], &json["output"]),
            (&"out\n".into(), &"err\n".into(), &"out\nerr\n".into()),
            "{json}"
        );
    }
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

/// "Warm pools": made, taken, used, measured (two runs a series, not ten)
/// and removed.
#[cfg(feature = "docker")]
#[test]
fn the_pools_block_runs_as_shown() -> TestResult {
    let mut r = Reader::new()?;
    let fewer = |_: &Reader, cmd: &str| {
        Ok(if cmd.starts_with("berth bench --create") {
            format!("{cmd} -n 2")
        } else {
            cmd.to_string()
        })
    };
    let result = r.follow("### Warm pools", &fewer);
    if result.is_err() {
        let _ = r.sh("berth sandbox rm task-1 --backend docker");
        let _ = r.sh("berth pool rm agents");
    }
    let ran = result?;
    assert_eq!(ran.len(), 6, "{ran:?}");
    let took = r.stdout("berth sandbox create task-1 --from-pool agents")?;
    assert!(
        took.contains("from pool agents (member pool-agents-"),
        "{took}"
    );
    assert_eq!(
        r.stdout("berth exec --backend docker --sandbox task-1 -- 'echo ready'")?,
        "ready\n"
    );
    let bench = r.stdout("berth bench --create -b docker")?;
    assert!(bench.contains("warm (from a pool)"), "{bench}");
    let rm = r.stdout("berth pool rm agents")?;
    assert!(rm.contains("removed pool agents and 3 sandboxes"), "{rm}");
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
pub(crate) struct StandinBin {
    child: std::process::Child,
    pub(crate) vars: Vec<(String, String)>,
}

impl StandinBin {
    pub(crate) fn start(name: &str, keys: usize) -> Result<StandinBin, BoxError> {
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
    /// SIGTERM first, so a stand-in that cleans up after itself (the k8s
    /// one removes its containers and volumes) can; SIGKILL after 10 s.
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid, which it still is
            // until it has been waited for.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if matches!(self.child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
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
    removed(&r, "e2b", "agent")?;
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

/// The Kubernetes block, against `k8s-standin` (pods run as containers of
/// berth's image on the local Docker engine), with `BERTH_K8S_IMAGE`
/// naming that image instead of the block's registry.
#[cfg(all(feature = "k8s", feature = "docker"))]
#[test]
fn the_k8s_block_runs_against_its_stand_in() -> TestResult {
    let image = tokio::runtime::Runtime::new()?.block_on(async {
        berth_backends::docker::DockerBackend::connect()
            .await?
            .ensure_image()
            .await
    })?;
    let standin = StandinBin::start("k8s-standin", 1)?;
    let mut r = Reader::new()?;
    r.env = standin.vars.clone();
    r.env.push(("BERTH_K8S_IMAGE".into(), image));
    let same = |_: &Reader, cmd: &str| Ok(cmd.to_string());
    let ran = r.follow("### Kubernetes", &same)?;
    assert_eq!(ran.len(), 4, "{ran:?}");
    let out = r.stdout("berth exec --backend k8s --sandbox agent -- 'id -u; pwd'")?;
    assert_eq!(out, "1000\n/workspace\n");
    removed(&r, "k8s", "agent")?;
    Ok(())
}

/// That the block's last line removed sandbox `name` of `backend`.
#[cfg(any(feature = "e2b", all(feature = "k8s", feature = "docker")))]
fn removed(r: &Reader, backend: &str, name: &str) -> TestResult {
    let ls = r.ok(&format!("berth sandbox ls --backend {backend} --json"))?;
    let list: Value = serde_json::from_str(&ls)?;
    assert!(
        !list
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["name"] == name)),
        "the block's last line removed its sandbox: {ls}"
    );
    Ok(())
}

/// The first `lang` block after the heading `heading`, whole.
fn fenced(heading: &str, lang: &str) -> Result<String, BoxError> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))?;
    let at = readme
        .find(&format!("\n{heading}\n"))
        .ok_or_else(|| format!("README.md has no heading `{heading}`"))?;
    let rest = &readme[at..];
    let open = format!("```{lang}\n");
    let start = rest
        .find(&open)
        .ok_or_else(|| format!("no {lang} block under `{heading}`"))?
        + open.len();
    let len = rest[start..]
        .find("```\n")
        .ok_or_else(|| format!("the {lang} block under `{heading}` does not end"))?;
    Ok(rest[start..start + len].to_string())
}

/// "An agent: `berth run`", each line against the provider stand-in, which
/// speaks the OpenAI and the Anthropic API alike: every endpoint a line names
/// (a local server, api.openai.com, api.anthropic.com) is the stand-in's
/// URL here, so no key goes anywhere. The line without `--base-url` uses the
/// config file the README shows next, with the same URLs put in. The docker
/// line runs in the sandbox `web` the Docker section makes. The chat (`berth
/// run` alone, on a terminal) runs in tmux: a task, an answer, one more turn.
#[test]
fn the_agent_block_runs_against_the_provider_stand_in() -> TestResult {
    use berth_standins::provider::{ProviderStandin, Reply};
    let standin = ProviderStandin::start(vec![
        Reply::call(
            "c1",
            "terminal",
            r#"{"command": "find . -name '*.rs' | xargs cat | wc -l"}"#,
        ),
        Reply::text("LINES-COUNTED"),
        Reply::text("OPENAI-ANSWERED"),
        Reply::call(
            "c2",
            "terminal",
            r#"{"command": "cat /etc/hostname; id -u"}"#,
        ),
        Reply::text("ANTHROPIC-ANSWERED"),
        Reply::text("CONFIG-ANSWERED"),
        Reply::text("CHAT-FIRST"),
        Reply::text("CHAT-SECOND"),
    ])?;
    let url = standin.url();
    let mut r = Reader::new()?;
    let endpoints = [
        "http://127.0.0.1:8080/v1",
        "https://api.openai.com/v1",
        "https://api.anthropic.com/v1",
    ];
    let here_url = |t: &str| {
        endpoints
            .iter()
            .fold(t.to_string(), |t, e| t.replace(e, &url))
    };
    let config = r.dir.path().join("config.toml");
    let shown = fenced("## An agent: `berth run`", "toml")?;
    assert!(
        shown.contains("[[providers]]"),
        "the README's config block moved: {shown}"
    );
    std::fs::write(&config, here_url(&shown))?;
    r.env = vec![
        ("BERTH_CONFIG".into(), config.display().to_string()),
        ("ANTHROPIC_API_KEY".into(), "sk-ant-readme".into()),
    ];
    r.ok("berth sandbox create web --backend docker")?;
    // Something to count in the sandbox the first line works in.
    r.ok("berth exec -- 'mkdir -p src && printf \"fn main() {}\\n// two\\n\" > src/main.rs'")?;
    let fill = |_: &Reader, cmd: &str| Ok(here_url(cmd));
    let ran = r.follow("## An agent: `berth run`", &fill)?;
    assert_eq!(ran.len(), 4, "{ran:?}");
    let said = |line: &str| -> Result<String, BoxError> {
        let o = r
            .seen
            .get(line)
            .ok_or_else(|| format!("the README line `{line}` did not run"))?;
        Ok(text(o))
    };
    let first = said(
        "berth run --base-url http://127.0.0.1:8080/v1 --model local \"count the lines of every .rs file\"",
    )?;
    assert!(first.contains("LINES-COUNTED"), "{first}");
    let reqs = standin.requests();
    // The first line's tool ran in its sandbox: the model was given the count.
    assert!(
        reqs.get(1).is_some_and(|q| q
            .body
            .to_string()
            .contains(r#""content":"2\n[exit code 0]""#)),
        "the line count never reached the model: {:?}",
        reqs.get(1).map(|q| q.body.to_string())
    );
    // Each API as its endpoint expects it, with the key of its line.
    let openai = reqs.get(2).ok_or("no request of the second line")?;
    assert!(
        openai.path.ends_with("/chat/completions"),
        "{}",
        openai.path
    );
    assert_eq!(openai.header("authorization"), Some("Bearer sk-…"));
    let anthropic = reqs.get(3).ok_or("no request of the third line")?;
    assert!(anthropic.path.ends_with("/messages"), "{}", anthropic.path);
    assert_eq!(anthropic.header("x-api-key"), Some("…"));
    // The third line's tool ran in the docker sandbox as uid 1000.
    let docker = reqs.get(4).map(|q| q.body.to_string()).unwrap_or_default();
    assert!(docker.contains("1000"), "{docker}");
    // The config's default provider (the first of `claude,local`) answered
    // the line that names none, as JSON lines.
    let json = r.stdout("berth run --json \"…\"")?;
    assert!(
        json.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok())
            && json.contains("CONFIG-ANSWERED"),
        "{json}"
    );
    let by_config = reqs.get(5).ok_or("no request of the fourth line")?;
    assert!(by_config.path.ends_with("/messages"), "{}", by_config.path);
    assert_eq!(by_config.header("x-api-key"), Some("sk-ant-readme"));

    // The chat, as a person has it.
    let script = r.dir.path().join("chat.sh");
    let bin = Path::new(BERTH).parent().ok_or("berth has no directory")?;
    write_exec(
        &script,
        &format!(
            "cd '{here}' && export PATH='{bin}':\"$PATH\" BERTH_STATE_DIR='{state}' \
             BERTH_POLICY='{policy}' BERTH_CONFIG='{config}' ANTHROPIC_API_KEY=sk-ant-readme \
             && berth run; echo CHAT-EXIT-$?; sleep 600\n",
            here = r.here().display(),
            bin = bin.display(),
            state = r.dir.path().join("state").display(),
            policy = r.dir.path().join("policy.toml").display(),
            config = config.display(),
        ),
    )?;
    let t = crate::shell::Tmux::start(&format!("bash {}", script.display()))?;
    t.wait("the task prompt", |s| s.contains("task>"))?;
    t.type_line("say something")?;
    t.wait("the first answer and the next prompt", |s| {
        s.contains("CHAT-FIRST") && s.contains("you>")
    })?;
    t.type_line("and again")?;
    t.wait("the second answer", |s| s.contains("CHAT-SECOND"))?;
    // An empty line ends the chat, with the run done.
    t.type_line("")?;
    t.wait("the chat's end", |s| s.contains("CHAT-EXIT-0"))?;
    r.kill_jobs("docker");
    let _ = r.sh("berth sandbox rm web --backend docker");
    Ok(())
}

/// "Agents over MCP": the sandbox and the token file made as shown, the HTTP
/// server started as shown (its port a free one here), and the official SDK's client
/// (rmcp) over it with the token from the file: the session keeps its cwd
/// from one `terminal` call to the next. Without the token it is refused.
#[test]
fn the_mcp_block_serves_the_sdk_client() -> TestResult {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    let mut r = Reader::new()?;
    let home = r.dir.path().join("home");
    std::fs::create_dir(&home)?;
    r.home = Some(home.clone());
    let lines: Vec<Line> = block("## Agents over MCP")?
        .iter()
        .filter_map(|l| parse(l))
        .collect();
    let [create, make, serve] = &lines[..] else {
        return Err(format!("the MCP block is not three lines: {lines:?}").into());
    };
    r.ok(&create.cmd)?;
    r.ok(&make.cmd)?;
    let token = std::fs::read_to_string(home.join(".berth-mcp-token"))?;
    let token = token.trim().to_string();
    assert_eq!(token.len(), 48, "{token}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let cmd = serve.cmd.replace(":8765", &format!(":{port}"));
    assert_ne!(
        cmd, serve.cmd,
        "the MCP block no longer listens on 8765: {cmd}"
    );
    let mut child = r
        .command(&cmd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let _server = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some(url) = line
                .split("at ")
                .nth(1)
                .filter(|u| u.starts_with("http://"))
            {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx
        .recv_timeout(Duration::from_secs(60))
        .map_err(|_| format!("`{cmd}` never said where it listens"))?;
    assert_eq!(url, format!("http://127.0.0.1:{port}/mcp"));
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let call = |command: &str| {
            let mut p = CallToolRequestParams::new("terminal");
            if let Value::Object(m) = serde_json::json!({ "command": command }) {
                p = p.with_arguments(m);
            }
            p
        };
        // Without the token: refused before any tool.
        let anonymous = ().serve(StreamableHttpClientTransport::from_uri(url.clone())).await;
        assert!(anonymous.is_err(), "a client without the token was served");
        let client = ()
            .serve(StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(token),
            ))
            .await?;
        let first = client
            .peer()
            .call_tool(call("mkdir -p sub && cd sub"))
            .await?;
        assert_ne!(first.is_error, Some(true), "{first:?}");
        let second = client.peer().call_tool(call("pwd")).await?;
        let said = serde_json::to_string(&second.content)?;
        assert!(said.contains("/sub"), "the cwd was not kept: {said}");
        let _ = client.cancel().await;
        Ok::<(), BoxError>(())
    })?;
    Ok(())
}
