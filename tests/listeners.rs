//! Who may talk to berth's TCP listeners (the dashboard, `berth mcp
//! --listen`) and whom berth signals: decided by kernel facts, never by the
//! environment (#49 items 1-6).
//!
//! A sandboxed process that double-forks and execs with an empty
//! environment is still the sandbox's (its mount namespace holds berth's
//! marker, its cgroup is berth's); a process of another uid is refused
//! whatever token it holds; a peer that binds a non-loopback source address
//! is looked up all the same; the browser's opener carries no token;
//! `mcp --listen --token X` is refused; and a pid the sandbox writes into
//! its job's files is signalled only when the kernel says it is that very
//! sandbox's.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{BoxError, TestResult, text};

const BERTH: &str = env!("CARGO_BIN_EXE_berth");

const ASK: &str = "[[rules]]\nname = \"ask-touch\"\naction = \"ask\"\nprefix = \"touch\"\nreason = \"touching needs a yes\"\n[approvals]\ntimeout_secs = 120\n";

/// A non-loopback IPv4 address of this host (`hostname -I`), for a client
/// that binds it and connects to `127.0.0.1`.
fn host_address() -> Result<String, BoxError> {
    let o = Command::new("hostname").arg("-I").output()?;
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback())
        })
        .map(str::to_string)
        .ok_or_else(|| "this host has no non-loopback IPv4 address (`hostname -I`) to bind".into())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Run the program `args` as uid 65534 with no groups (the tests run as root).
fn as_nobody(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args);
    c
}

fn chown_to_nobody(path: &Path) -> TestResult {
    let s = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(path)
        .status()?;
    if !s.success() {
        return Err(format!("chown -R nobody {} failed", path.display()).into());
    }
    Ok(())
}

/// A state dir with its own server, run as root or as nobody.
struct State {
    root: tempfile::TempDir,
    nobody: bool,
}

impl State {
    fn new(policy: &str, nobody: bool) -> Result<State, BoxError> {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir()?;
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755))?;
        std::fs::write(root.path().join("policy.toml"), policy)?;
        std::fs::create_dir(root.path().join("state"))?;
        if nobody {
            chown_to_nobody(root.path())?;
        }
        Ok(State { root, nobody })
    }

    fn state(&self) -> PathBuf {
        self.root.path().join("state")
    }

    fn sandbox_dir(&self, name: &str) -> PathBuf {
        self.state().join("sandboxes").join("local").join(name)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = if self.nobody {
            as_nobody(&[BERTH])
        } else {
            Command::new(BERTH)
        };
        c.args(args)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", self.root.path())
            .env("BERTH_STATE_DIR", self.state())
            .env("BERTH_POLICY", self.root.path().join("policy.toml"))
            .env("BERTH_CONFIG", self.root.path().join("config.toml"))
            .env("BERTH_SERVER", "auto")
            .current_dir(self.root.path())
            .stdin(Stdio::null());
        c
    }

    fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
        let o = self.cmd(args).output()?;
        if o.status.code() != Some(0) {
            return Err(format!("berth {args:?}: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The dashboard's address and token.
    fn dashboard(&self) -> Result<(String, String), BoxError> {
        let v: Value = serde_json::from_str(&self.ok(&["ui", "--no-open", "--json"])?)?;
        let url = v["url"].as_str().ok_or("no url")?;
        let (base, token) = url.split_once("/?token=").ok_or("no token in the url")?;
        Ok((
            base.trim_start_matches("http://").to_string(),
            token.to_string(),
        ))
    }

    /// `berth exec -- COMMAND` in the background, for a command the policy
    /// asks about: the running exec and its pending approval's id.
    fn ask(&self, command: &str) -> Result<(Child, i64), BoxError> {
        let exec = self
            .cmd(&["exec", "--", command])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(line) = self.ok(&["approvals", "ls", "--json"])?.lines().next() {
                let v: Value = serde_json::from_str(line)?;
                return Ok((exec, v["id"].as_i64().ok_or("an approval without an id")?));
            }
            if Instant::now() > deadline {
                return Err(format!("`{command}` raised no approval within 30 s").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pending(&self) -> Result<usize, BoxError> {
        Ok(self.ok(&["approvals", "ls", "--json"])?.lines().count())
    }

    /// `berth mcp --listen 127.0.0.1:0` with `token`: the server and its port.
    fn mcp(&self, token: &str) -> Result<(Guard, String), BoxError> {
        let mut child = self
            .cmd(&["mcp", "--listen", "127.0.0.1:0"])
            .env("BERTH_MCP_TOKEN", token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let guard = Guard(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[berth mcp] {line}");
                if let Some(rest) = line.split("at http://").nth(1) {
                    let _ = tx.send(rest.trim().trim_end_matches("/mcp").to_string());
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .map_err(|_| "berth mcp --listen did not say where it listens")?;
        Ok((guard, addr))
    }
}

impl Drop for State {
    fn drop(&mut self) {
        let _ = self.cmd(&["server", "stop"]).output();
    }
}

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sends a request file's bytes to HOST PORT, from SOURCE when given (bound
/// with IP_FREEBIND, so any address will do), and prints the reply's status
/// line (`ANSWERED …`) or `CLOSED`.
const PROBE: &str = r#"import socket, sys
host, port, req = sys.argv[1], int(sys.argv[2]), open(sys.argv[3], "rb").read()
c = socket.socket()
c.settimeout(10)
try:
    if len(sys.argv) > 4:
        c.setsockopt(socket.SOL_IP, 15, 1)
        c.bind((sys.argv[4], 0))
    c.connect((host, port))
    c.sendall(req)
    r = c.recv(300)
    print("ANSWERED " + r.decode(errors="replace").split("\r")[0] if r else "CLOSED")
except Exception as e:
    print("CLOSED", type(e).__name__, e)
"#;

/// The probe's files in `dir`, readable by everyone: the script and one
/// request file per name.
fn write_probe(dir: &Path, requests: &[(&str, String)]) -> TestResult {
    std::fs::write(dir.join("probe.py"), PROBE)?;
    for (name, req) in requests {
        std::fs::write(dir.join(name), req)?;
    }
    Ok(())
}

/// Run the probe from inside sandbox `sandbox` the way the red team did: a
/// double fork and an exec with an empty environment, so neither it nor
/// any ancestor it still has carries `BERTH_SANDBOX`.
fn probe_from_sandbox(
    s: &State,
    sandbox: &str,
    addr: &str,
    request: &str,
    source: Option<&str>,
) -> Result<String, BoxError> {
    let (host, port) = addr.rsplit_once(':').ok_or("no port")?;
    let out = format!("out-{request}");
    let work = s.sandbox_dir(sandbox).join("work");
    let cmd = format!(
        "cd {work} && rm -f {out}; (env -i /usr/bin/python3 probe.py {host} {port} {request} {src} > {out} 2>&1 &); \
         i=0; while [ ! -s {out} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; cat {out}",
        work = work.display(),
        src = source.unwrap_or("")
    );
    let o = s
        .cmd(&["exec", "--sandbox", sandbox, "--", &cmd])
        .output()?;
    if o.status.code() != Some(0) {
        return Err(format!("the probe did not run: {}", text(&o)).into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The same probe from outside every sandbox, as `who` (root or nobody).
fn probe_outside(
    dir: &Path,
    nobody: bool,
    addr: &str,
    request: &str,
    source: Option<&str>,
) -> Result<String, BoxError> {
    let (host, port) = addr.rsplit_once(':').ok_or("no port")?;
    let req = dir.join(request);
    let script = dir.join("probe.py");
    let mut args: Vec<String> = vec![
        "/usr/bin/python3".into(),
        script.display().to_string(),
        host.into(),
        port.into(),
        req.display().to_string(),
    ];
    args.extend(source.map(str::to_string));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = if nobody {
        as_nobody(&argv)
    } else {
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..]);
        c
    };
    let o = c.stdin(Stdio::null()).output()?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn mcp_initialize(addr: &str, token: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}"#;
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// A raw request from this process; the whole reply.
fn http(addr: &str, request: &str) -> Result<String, BoxError> {
    let mut c = std::net::TcpStream::connect(addr)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    c.write_all(request.as_bytes())?;
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The dashboard's cookie (`name=value`) from its answer to the token.
fn cookie(addr: &str, token: &str) -> Result<String, BoxError> {
    let reply = http(
        addr,
        &format!("GET /?token={token} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    )?;
    let line = reply
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .ok_or_else(|| format!("no cookie in {reply}"))?;
    Ok(line.split(';').next().unwrap_or("").to_string())
}

/// [`cookie`], asked by uid 65534 when `nobody` (its dashboard answers
/// only its own uid).
fn cookie_as(nobody: bool, addr: &str, token: &str) -> Result<String, BoxError> {
    if !nobody {
        return cookie(addr, token);
    }
    let script = r#"import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
c = socket.create_connection((host, int(port)), 10)
c.sendall(("GET /?token=%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (sys.argv[2], sys.argv[1])).encode())
r = b""
while True:
    d = c.recv(4096)
    if not d:
        break
    r += d
for l in r.decode(errors="replace").split("\r\n"):
    if l.lower().startswith("set-cookie: "):
        print(l[12:].split(";")[0])
"#;
    let o = as_nobody(&["/usr/bin/python3", "-c", script, addr, token]).output()?;
    let line = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if line.is_empty() {
        return Err(format!("no cookie for uid 65534: {}", text(&o)).into());
    }
    Ok(line)
}

/// Items 1, 4 and 5: a sandbox with the network on, whose probe drops its
/// environment, reaches neither the dashboard nor MCP over HTTP, with the
/// token, the cookie and the bearer in hand; nor does it from a
/// non-loopback source address. The same bytes from outside every sandbox
/// are answered. As root, another uid holding everything is refused too
/// (item 2).
fn a_sandbox_without_its_environment_is_refused(nobody: bool) -> TestResult {
    if !is_root() {
        return Err("this test runs berth as root and as uid 65534 through setpriv; run it as root (as CI does)".into());
    }
    let s = State::new(ASK, nobody)?;
    let (dash, token) = s.dashboard()?;
    let mcp_token = "listener-test-token-0123456789";
    let (_mcp, mcp) = s.mcp(mcp_token)?;
    s.ok(&["sandbox", "create", "net", "--network"])?;
    let (mut exec, n) = s.ask("touch self-approved")?;
    let cookie = cookie_as(nobody, &dash, &token)?;
    let source = host_address()?;
    let foreign = Some(source.as_str());
    let work = s.sandbox_dir("net").join("work");
    // The probe's files: in the sandbox, and outside it for everyone.
    let outside = s.root.path().join("probe");
    std::fs::create_dir(&outside)?;
    let requests = [
        (
            "get",
            format!("GET /?token={token} HTTP/1.1\r\nHost: {dash}\r\nConnection: close\r\n\r\n"),
        ),
        (
            "always",
            format!(
                "POST /approvals/{n}/always HTTP/1.1\r\nHost: {dash}\r\nCookie: {cookie}\r\nOrigin: http://{dash}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            ),
        ),
        ("mcp", mcp_initialize(&mcp, mcp_token)),
    ];
    write_probe(&work, &requests)?;
    write_probe(&outside, &requests)?;
    if nobody {
        chown_to_nobody(&work)?;
    }
    let tries = [
        ("get", &dash, None),
        ("always", &dash, None),
        ("mcp", &mcp, None),
        ("get", &dash, foreign),
        ("always", &dash, foreign),
        ("mcp", &mcp, foreign),
    ];
    for (req, addr, source) in tries {
        let out = probe_from_sandbox(&s, "net", addr, req, source)?;
        assert!(
            out.contains("CLOSED") && !out.contains("ANSWERED"),
            "the sandbox's {req} (source {source:?}) was served: {out}"
        );
    }
    assert_eq!(s.pending()?, 1, "the approval is still pending");
    // Another uid, outside every sandbox, with everything: refused.
    if !nobody {
        for (req, addr) in [("get", &dash), ("always", &dash), ("mcp", &mcp)] {
            let out = probe_outside(&outside, true, addr, req, None)?;
            assert!(
                out.contains("CLOSED") && !out.contains("ANSWERED"),
                "uid 65534's {req} was served by root's listener: {out}"
            );
        }
    }
    // Control: the same bytes from outside every sandbox, as the owner, from
    // the foreign source address too, are answered.
    for (req, addr, source, want) in [
        ("get", &dash, foreign, "ANSWERED HTTP/1.1 303"),
        ("mcp", &mcp, foreign, "ANSWERED HTTP/1.1 200"),
        ("mcp", &mcp, None, "ANSWERED HTTP/1.1 200"),
        ("always", &dash, foreign, "ANSWERED HTTP/1.1 303"),
    ] {
        let out = probe_outside(&outside, nobody, addr, req, source)?;
        assert!(out.contains(want), "the owner's {req} ({source:?}): {out}");
    }
    assert_eq!(s.pending()?, 0);
    exec.wait()?;
    Ok(())
}

#[test]
fn a_sandbox_without_its_environment_is_refused_by_root_listeners() -> TestResult {
    a_sandbox_without_its_environment_is_refused(false)
}

#[test]
fn a_sandbox_without_its_environment_is_refused_by_an_ordinary_users_listeners() -> TestResult {
    a_sandbox_without_its_environment_is_refused(true)
}

/// Item 3: the browser is opened on a one-time code, not the token: the
/// opener's command line is readable by every process of the host. The
/// code signs in once.
#[test]
fn the_browser_opener_gets_a_one_time_code_and_never_the_token() -> TestResult {
    use std::os::unix::fs::PermissionsExt;
    let s = State::new("", false)?;
    let seen = s.root.path().join("opener-argv");
    let opener = s.root.path().join("opener");
    std::fs::write(
        &opener,
        format!(
            "#!/bin/sh\ntr '\\0' ' ' < /proc/$$/cmdline > {0}.tmp; mv {0}.tmp {0}\n",
            seen.display()
        ),
    )?;
    std::fs::set_permissions(&opener, std::fs::Permissions::from_mode(0o755))?;
    let o = s
        .cmd(&["ui"])
        .env("DISPLAY", ":99")
        .env("BROWSER", &opener)
        .output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.exists() {
        if Instant::now() > deadline {
            return Err("the opener was not run within 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let argv = std::fs::read_to_string(&seen)?;
    let v: Value = serde_json::from_slice(&std::fs::read(s.state().join("ui.json"))?)?;
    let token = v["token"].as_str().ok_or("no token")?;
    assert!(
        !argv.contains(token),
        "the opener's command line holds the token: {argv}"
    );
    let url = argv
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .ok_or_else(|| format!("no URL in {argv}"))?;
    assert!(url.contains("/?once="), "{url}");
    let rest = url.trim_start_matches("http://");
    let (addr, path) = rest.split_once('/').ok_or("no path")?;
    let get = || {
        http(
            addr,
            &format!("GET /{path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
        )
    };
    let first = get()?;
    assert!(first.starts_with("HTTP/1.1 303"), "{first}");
    assert!(first.contains("set-cookie: berth_ui_"), "{first}");
    // The cookie is not the token either: a page that sends it to another
    // port hands over nothing that works elsewhere.
    assert!(!first.contains(token), "{first}");
    let again = get()?;
    assert!(
        again.starts_with("HTTP/1.1 401"),
        "the code worked twice: {again}"
    );
    Ok(())
}

/// Item 5: the token is never taken from the command line.
#[test]
fn mcp_listen_refuses_a_token_on_the_command_line() -> TestResult {
    let s = State::new("", false)?;
    let o = s
        .cmd(&[
            "mcp",
            "--listen",
            "127.0.0.1:0",
            "--token",
            "on-the-command-line-0123456789",
        ])
        .output()?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--token-file") && err.contains("BERTH_MCP_TOKEN"),
        "the refusal says what to use instead: {err}"
    );
    Ok(())
}

/// A job started in `s`'s sandbox `default`: its id and its process's pid.
fn job(s: &State, secs: &str) -> Result<(String, i32), BoxError> {
    let id = s
        .ok(&["job", "start", "--", &format!("sleep {secs}")])?
        .trim()
        .to_string();
    let pid_file = s
        .sandbox_dir("default")
        .join(".berth/jobs")
        .join(&id)
        .join("pid");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
        {
            return Ok((id, pid));
        }
        if Instant::now() > deadline {
            return Err(format!("job {id} wrote no pid within 20 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// Item 6: a root sandbox writes another sandbox's pid into its own job's
/// pid file, and `job kill` is asked to end its job. The other sandbox is
/// `default` too, of another state dir of the same user, or of another
/// user: berth must not signal it (it carries `BERTH_SANDBOX=default`,
/// which is all berth checked before).
#[test]
fn a_forged_job_pid_naming_another_state_dirs_or_users_sandbox_is_not_signalled() -> TestResult {
    if !is_root() {
        return Err(
            "this test runs a victim as uid 65534 through setpriv; run it as root (as CI does)"
                .into(),
        );
    }
    let attacker = State::new("", false)?;
    let same_user = State::new("", false)?;
    let other_user = State::new("", true)?;
    for (victim, who) in [
        (&same_user, "another state dir"),
        (&other_user, "another user"),
    ] {
        let (victim_job, victim_pid) = job(victim, "1001")?;
        let (id, own_pid) = job(&attacker, "1002")?;
        let pid_file = attacker
            .sandbox_dir("default")
            .join(".berth/jobs")
            .join(&id)
            .join("pid");
        attacker.ok(&[
            "exec",
            "--",
            &format!("printf {victim_pid} > {}", pid_file.display()),
        ])?;
        assert_eq!(
            std::fs::read_to_string(&pid_file)?.trim(),
            victim_pid.to_string()
        );
        let o = attacker
            .cmd(&["job", "kill", &id, "--signal", "kill"])
            .output()?;
        assert!(
            alive(victim_pid),
            "{who}'s job {victim_job} (pid {victim_pid}) was killed through a forged pid: {}",
            text(&o)
        );
        // Clean up: the victim's own kill works, and so does the attacker's
        // job's, by its real pid.
        victim.ok(&["job", "kill", &victim_job, "--signal", "kill"])?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while alive(victim_pid) {
            if Instant::now() > deadline {
                return Err(format!("{who}'s own job kill left pid {victim_pid}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(own_pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    Ok(())
}

/// Item 3: a restarted dashboard that finds its old port taken moves; a
/// page still holding the old cookie (which it would send to whoever holds
/// the old port now) gets nothing from the new address with it.
#[test]
fn a_dashboard_that_moves_takes_no_cookie_of_its_old_address() -> TestResult {
    let s = State::new("", false)?;
    let (old, token) = s.dashboard()?;
    let old_cookie = cookie(&old, &token)?;
    let get = |addr: &str, cookie: &str| {
        http(
            addr,
            &format!(
                "GET / HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    assert!(get(&old, &old_cookie)?.starts_with("HTTP/1.1 200"));
    s.ok(&["server", "stop"])?;
    // Someone else takes the old port as soon as it is free.
    let deadline = Instant::now() + Duration::from_secs(20);
    let _squatter = loop {
        match std::net::TcpListener::bind(&old) {
            Ok(l) => break l,
            Err(e) if Instant::now() > deadline => {
                return Err(format!("the old port {old} stayed taken: {e}").into());
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let (new, token2) = s.dashboard()?;
    assert_eq!(token, token2, "the token is kept");
    assert_ne!(
        new, old,
        "the dashboard could not have rebound its taken port"
    );
    // The old cookie, renamed for the new port as a page cannot do but an
    // impostor could: refused.
    let value = old_cookie.split_once('=').map_or("", |(_, v)| v);
    let port = new.rsplit(':').next().unwrap_or("");
    let forged = format!("berth_ui_{port}={value}");
    let r = get(&new, &forged)?;
    assert!(
        r.starts_with("HTTP/1.1 401"),
        "the old cookie works at the new address: {r}"
    );
    // Control: the token signs in at the new address.
    let fresh = cookie(&new, &token)?;
    assert!(get(&new, &fresh)?.starts_with("HTTP/1.1 200"));
    Ok(())
}

/// Item 8 and its siblings, through the CLI, as root and as an ordinary
/// user (berth run by uid 65534): a command's child reads its shell's
/// memory for the end marker's nonce, its descriptors (where they lead,
/// and the frames of the calls to come) and its environment. (Root may
/// still list the descriptors' numbers: a non-dumpable process's `/proc`
/// entries belong to root; they tell nothing more.) Each is refused, because the
/// session's shell is not dumpable, so berth reports the command's own
/// exit code and cwd.
#[test]
fn a_childs_look_into_its_shell_is_refused_as_root_and_as_a_user() -> TestResult {
    assert!(
        is_root(),
        "this test runs berth as uid 65534 too and must run as root (as CI does)"
    );
    for nobody in [false, true] {
        let who = if nobody { "nobody" } else { "root" };
        let s = State::new("", nobody)?;
        s.ok(&[
            "exec",
            "--",
            &format!("cat > forger.py <<'EOF'\n{}EOF", crate::conformance::FORGER),
        ])?;
        let o = s
            .cmd(&[
                "exec",
                "--json",
                "--",
                "/usr/bin/python3 forger.py; \
                 readlink /proc/$PPID/fd/1 >/dev/null 2>&1 && echo READ-FDS; \
                 head -c1 /proc/$PPID/fd/0 >/dev/null 2>&1 && echo READ-FRAMES; \
                 head -c1 /proc/$PPID/environ >/dev/null 2>&1 && echo READ-ENVIRON; \
                 /bin/sleep 1; cd /; exit 7",
            ])
            .output()?;
        let v: Value =
            serde_json::from_slice(&o.stdout).map_err(|e| format!("{who}: {e}: {}", text(&o)))?;
        let out = v["output"].as_str().unwrap_or_default();
        assert_eq!(v["exit_code"], 7, "{who}: the forged end was believed: {v}");
        assert_eq!(v["cwd"], "/", "{who}: {v}");
        assert!(
            out.contains("denied"),
            "{who}: the shell's memory was readable: {out}"
        );
        for bad in ["READ-FDS", "READ-FRAMES", "READ-ENVIRON"] {
            assert!(!out.contains(bad), "{who}: {bad}: {out}");
        }
        // The session is whole: the next call runs and reports as ever.
        assert_eq!(s.ok(&["exec", "--", "echo $((6*7))"])?, "42\n", "{who}");
        let _ = s.cmd(&["server", "stop"]).output();
    }
    Ok(())
}

/// Issue 49 item 19 through the CLI, as root and as uid 65534: a process a
/// command detached with `setsid` (its parent gone at once) is stopped with
/// the command at its timeout, and an earlier command's detached process is
/// left alone. The conformance case runs this on every backend as root; an
/// ordinary user's sandbox has no pids cgroup to sweep, so only the shell's
/// adoption of the orphan finds it.
#[test]
fn a_detached_process_is_stopped_on_timeout_as_root_and_as_a_user() -> TestResult {
    assert!(
        is_root(),
        "this test runs berth as uid 65534 too and must run as root (as CI does)"
    );
    let running = |pattern: &str| -> bool {
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim() == pattern)
            })
    };
    for nobody in [false, true] {
        let who = if nobody { "nobody" } else { "root" };
        let s = State::new("", nobody)?;
        let tag = format!("{}{}", std::process::id(), u8::from(nobody));
        let earlier = format!("sleep 8888.{tag}");
        let detached = format!("sleep 7777.{tag}");
        s.ok(&["exec", "--", &format!("(setsid {earlier} &)")])?;
        // The subshell returns before its child has exec'd `sleep`: wait
        // for the control to show under its own name.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !running(&earlier) {
            assert!(Instant::now() < deadline, "{who}: the control never ran");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(200));
        let o = s
            .cmd(&[
                "exec",
                "--timeout",
                "2",
                "--",
                &format!("(setsid {detached} &); sleep 60"),
            ])
            .output()?;
        assert_eq!(o.status.code(), Some(124), "{who}: {}", text(&o));
        let deadline = Instant::now() + Duration::from_secs(10);
        while running(&detached) {
            assert!(
                Instant::now() < deadline,
                "{who}: the detached process outlived the timeout"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            running(&earlier),
            "{who}: an earlier command's orphan was stopped with this one"
        );
        assert_eq!(s.ok(&["exec", "--", "echo $((6*7))"])?, "42\n", "{who}");
        let _ = Command::new("pkill").args(["-f", &earlier]).status();
        let _ = s.cmd(&["server", "stop"]).output();
    }
    Ok(())
}
