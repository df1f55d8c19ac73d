//! `berth cp` from the outside (issue 50): files and trees both ways on the
//! local backend, the docker backend (real engine) and the ssh backend (a
//! real sshd); a file past 40 MiB both ways, compared by digest, with the
//! engine's memory bounded; ownership in docker; tar archives on stdin and
//! stdout; errors that say what to do; the policy's file rules; the
//! per-user server running beside it.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::support::{BoxError, TestResult, text};

/// A state dir, a policy and a working directory on this side; sandboxes
/// made here and the server a call started go when the test ends.
struct Berth {
    dir: tempfile::TempDir,
    server: &'static str,
    sandboxes: Vec<(String, String)>,
}

impl Berth {
    fn new(server: &'static str) -> Result<Berth, BoxError> {
        Berth::with_policy(server, "")
    }

    fn with_policy(server: &'static str, policy: &str) -> Result<Berth, BoxError> {
        let dir = tempfile::tempdir()?;
        std::fs::create_dir(dir.path().join("here"))?;
        std::fs::write(dir.path().join("policy.toml"), policy)?;
        Ok(Berth {
            dir,
            server,
            sandboxes: vec![("local".into(), "default".into())],
        })
    }

    /// This side's working directory, where the calls run.
    fn here(&self) -> PathBuf {
        self.dir.path().join("here")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The local sandbox's workspace, as this side sees it.
    fn work(&self, sandbox: &str) -> PathBuf {
        self.state()
            .join("sandboxes/local")
            .join(sandbox)
            .join("work")
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_berth"));
        c.args(args)
            .current_dir(self.here())
            .env("BERTH_STATE_DIR", self.state())
            .env("BERTH_POLICY", self.dir.path().join("policy.toml"))
            .env("BERTH_SERVER", self.server)
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> std::io::Result<Output> {
        self.cmd(args).output()
    }

    /// Run with `input` on stdin.
    fn run_with(&self, args: &[&str], input: &[u8]) -> Result<Output, BoxError> {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let input = input.to_vec();
        let feeder = std::thread::spawn(move || stdin.write_all(&input));
        let o = child.wait_with_output()?;
        // berth may refuse before it reads all of stdin: a write that met a
        // closed pipe is no failure of the test.
        let _ = feeder.join();
        Ok(o)
    }

    /// Run, expecting exit 0; its stdout.
    fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
        let o = self.run(args)?;
        if o.status.code() != Some(0) {
            return Err(format!("berth {args:?}: {}", text(&o)).into());
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// Run, expecting `code`; stdout and stderr.
    fn fails(&self, args: &[&str], code: i32) -> Result<String, BoxError> {
        let o = self.run(args)?;
        if o.status.code() != Some(code) {
            return Err(format!("berth {args:?}: wanted exit {code}: {}", text(&o)).into());
        }
        Ok(text(&o))
    }

    /// Run with stdout and stderr to files, and wait for it with `wait4`:
    /// its exit code and its peak resident memory in KiB (the largest of
    /// the process's and those of the children it waited for).
    fn run_measured(&self, args: &[&str]) -> Result<(Option<i32>, i64, String), BoxError> {
        let mut err = tempfile::tempfile()?;
        let child = self
            .cmd(args)
            .stdout(Stdio::null())
            .stderr(err.try_clone()?)
            .spawn()?;
        let pid = child.id() as libc::pid_t;
        let mut status: libc::c_int = 0;
        // SAFETY: rusage is plain data, valid when zeroed.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is this process's own child, not yet waited for;
        // `status` and `usage` are valid for writes.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r != pid {
            return Err(std::io::Error::last_os_error().into());
        }
        let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
        let mut said = String::new();
        std::io::Seek::rewind(&mut err)?;
        err.read_to_string(&mut said)?;
        Ok((code, usage.ru_maxrss, said))
    }

    fn create(&mut self, backend: &str, name: &str, flags: &[&str]) -> Result<(), BoxError> {
        self.sandboxes.push((backend.into(), name.into()));
        let mut args = vec!["sandbox", "create", name, "-b", backend];
        args.extend_from_slice(flags);
        self.ok(&args)?;
        Ok(())
    }

    /// `berth exec` in a sandbox; its stdout.
    fn exec(&self, backend: &str, sandbox: &str, cmd: &str) -> Result<String, BoxError> {
        self.ok(&["exec", "-b", backend, "-s", sandbox, "--", cmd])
    }

    /// `berth events --json`, as one string.
    fn events(&self) -> Result<String, BoxError> {
        self.ok(&["events", "--json", "-n", "100"])
    }

    fn sandbox_names(&self, backend: &str) -> Result<Vec<String>, BoxError> {
        let v: Value =
            serde_json::from_str(&self.ok(&["sandbox", "ls", "-b", backend, "--json"])?)?;
        Ok(v.as_array()
            .ok_or("sandbox ls: not a list")?
            .iter()
            .filter_map(|s| s["name"].as_str().map(String::from))
            .collect())
    }
}

impl Drop for Berth {
    fn drop(&mut self) {
        for (backend, name) in &self.sandboxes {
            if backend != "local" || self.work(name).exists() {
                let _ = self.run(&["sandbox", "rm", name, "-b", backend]);
            }
        }
        let _ = self.run(&["server", "stop"]);
    }
}

fn sha256_file(p: &Path) -> Result<String, BoxError> {
    let mut f = std::fs::File::open(p)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// `len` bytes that do not compress, the same every run.
fn noise_file(p: &Path, len: usize) -> Result<(), BoxError> {
    let mut w = std::io::BufWriter::new(std::fs::File::create(p)?);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut left = len;
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        let n = left.min(8);
        w.write_all(&b[..n])?;
        left -= n;
    }
    w.flush()?;
    Ok(())
}

const RUN_SH: &str = "#!/bin/sh\necho ran-$1\n";

/// A tree with a nested file, an executable, a link and an empty directory.
fn sample_tree(at: &Path) -> Result<(), BoxError> {
    std::fs::create_dir_all(at.join("sub/deeper"))?;
    std::fs::create_dir_all(at.join("empty"))?;
    std::fs::write(at.join("a.txt"), "alpha\n")?;
    std::fs::write(at.join("sub/deeper/b.txt"), "beta\n")?;
    std::fs::write(at.join("sub/run.sh"), RUN_SH)?;
    std::fs::set_permissions(
        at.join("sub/run.sh"),
        std::fs::Permissions::from_mode(0o755),
    )?;
    std::os::unix::fs::symlink("a.txt", at.join("link"))?;
    Ok(())
}

/// `got` holds what `sample_tree` made, links as links and modes kept.
fn assert_sample_tree(got: &Path) -> TestResult {
    assert_eq!(std::fs::read_to_string(got.join("a.txt"))?, "alpha\n");
    assert_eq!(
        std::fs::read_to_string(got.join("sub/deeper/b.txt"))?,
        "beta\n"
    );
    assert_eq!(std::fs::read_link(got.join("link"))?, Path::new("a.txt"));
    assert!(got.join("empty").is_dir());
    let mode = std::fs::metadata(got.join("sub/run.sh"))?
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "{mode:o}");
    let mode = std::fs::metadata(got.join("a.txt"))?.permissions().mode();
    assert_eq!(mode & 0o111, 0, "{mode:o}");
    Ok(())
}

/// The tree as the sandbox's shell sees it, run from inside it.
const CHECK_TREE: &str = "cat a.txt sub/deeper/b.txt && readlink link && test -d empty && test -x sub/run.sh && ! test -x a.txt && sub/run.sh ok";

fn json_line(out: &str) -> Result<Value, BoxError> {
    Ok(serde_json::from_str(out.trim())?)
}

// ---------------------------------------------------------------- local

#[test]
fn a_file_goes_in_and_comes_back_out_on_local() -> TestResult {
    let b = Berth::new("auto")?;
    // The server runs (`exec` started it); cp spawns beside its shells.
    b.exec("local", "default", "mkdir -p data && echo ready")?;
    std::fs::write(b.here().join("data.csv"), "id,v\n1,2\n")?;
    let out = b.ok(&["cp", "--json", "./data.csv", ":data/"])?;
    let v = json_line(&out)?;
    assert_eq!(v["bytes"], 9, "{v}");
    assert_eq!(v["files"], 1, "{v}");
    assert!(
        v["dest"]
            .as_str()
            .unwrap_or("")
            .ends_with("/work/data/data.csv"),
        "{v}"
    );
    assert!(
        v["src"].as_str().unwrap_or("").ends_with("/here/data.csv"),
        "{v}"
    );
    // The session sees it at once.
    assert_eq!(
        b.exec("local", "default", "cat data/data.csv")?,
        "id,v\n1,2\n"
    );
    // A new name, then out again to this side: to a directory, and to a name.
    b.ok(&["cp", "data.csv", ":copy.csv"])?;
    std::fs::create_dir(b.here().join("back"))?;
    let o = b.run(&["cp", ":copy.csv", "back"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Quiet when stderr is not a terminal: no progress, no summary.
    assert!(o.stderr.is_empty(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(b.here().join("back/copy.csv"))?,
        "id,v\n1,2\n"
    );
    b.ok(&["cp", ":data/data.csv", "./renamed.csv"])?;
    let meta = std::fs::metadata(b.here().join("renamed.csv"))?;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(meta.uid(), unsafe { libc::geteuid() });
    // Onto an existing file: replaced whole.
    std::fs::write(
        b.here().join("renamed.csv"),
        "old and longer than the new one\n",
    )?;
    b.ok(&["cp", ":data/data.csv", "./renamed.csv"])?;
    assert_eq!(
        std::fs::read_to_string(b.here().join("renamed.csv"))?,
        "id,v\n1,2\n"
    );
    // Both calls are in the event log.
    let events = b.events()?;
    assert!(events.contains("\"kind\":\"copy.started\""), "{events}");
    assert!(events.contains("\"kind\":\"copy.finished\""), "{events}");
    Ok(())
}

#[test]
fn a_tree_with_a_link_and_an_exec_bit_goes_both_ways_on_local() -> TestResult {
    let b = Berth::new("off")?;
    sample_tree(&b.here().join("proj"))?;
    let v = json_line(&b.ok(&["cp", "--json", "proj", ":app"])?)?;
    assert_eq!(
        (v["files"].as_u64(), v["dirs"].as_u64()),
        (Some(4), Some(4)),
        "{v}"
    );
    assert_eq!(v["bytes"], "alpha\nbeta\n".len() + RUN_SH.len(), "{v}");
    let seen = b.exec("local", "default", &format!("(cd app && {CHECK_TREE})"))?;
    assert_eq!(seen, "alpha\nbeta\na.txt\nran-ok\n");
    // Onto an existing directory: inside it, under its own name.
    b.ok(&["cp", "proj", ":app"])?;
    b.exec("local", "default", "test -f app/proj/sub/deeper/b.txt")?;
    // Out: as a new directory, and what is in it (`/.`) into an existing one.
    b.ok(&["cp", ":app", "./out"])?;
    assert_sample_tree(&b.here().join("out"))?;
    assert!(b.here().join("out/proj/a.txt").is_file());
    std::fs::create_dir(b.here().join("merged"))?;
    std::fs::write(b.here().join("merged/kept.txt"), "mine")?;
    b.ok(&["cp", ":app/sub/.", "./merged"])?;
    assert!(b.here().join("merged/run.sh").is_file());
    assert!(b.here().join("merged/deeper/b.txt").is_file());
    assert_eq!(
        std::fs::read_to_string(b.here().join("merged/kept.txt"))?,
        "mine"
    );
    Ok(())
}

#[test]
fn a_file_past_40_mib_streams_both_ways_intact_in_bounded_memory() -> TestResult {
    let b = Berth::new("off")?;
    noise_file(&b.here().join("small.bin"), 4096)?;
    noise_file(&b.here().join("big.bin"), (41 << 20) + 123)?;
    let want = sha256_file(&b.here().join("big.bin"))?;
    let (code, small_in, said) = b.run_measured(&["cp", "small.bin", ":small.bin"])?;
    assert_eq!(code, Some(0), "{said}");
    let (code, big_in, said) = b.run_measured(&["cp", "big.bin", ":big.bin"])?;
    assert_eq!(code, Some(0), "{said}");
    let inside = b.exec("local", "default", "sha256sum big.bin")?;
    assert_eq!(inside.split_whitespace().next(), Some(want.as_str()));
    let (code, small_out, said) = b.run_measured(&["cp", ":small.bin", "small.back"])?;
    assert_eq!(code, Some(0), "{said}");
    let (code, big_out, said) = b.run_measured(&["cp", ":big.bin", "big.back"])?;
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(sha256_file(&b.here().join("big.back"))?, want);
    // Held whole, the file alone would add 41 MiB to the peak.
    for (what, small, big) in [("in", small_in, big_in), ("out", small_out, big_out)] {
        assert!(
            big < small + 24 * 1024,
            "copying 41 MiB {what} peaked at {big} KiB, a 4 KiB copy at {small} KiB"
        );
    }
    Ok(())
}

#[test]
fn archives_go_in_from_stdin_and_out_to_stdout() -> TestResult {
    let b = Berth::new("off")?;
    sample_tree(&b.here().join("site"))?;
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    tar.append_dir_all("site", b.here().join("site"))?;
    let archive = tar.into_inner()?;
    b.exec("local", "default", "mkdir www")?;
    let o = b.run_with(&["cp", "--json", "-", ":www"], &archive)?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v = json_line(&String::from_utf8_lossy(&o.stdout))?;
    assert_eq!(v["src"], "-", "{v}");
    let seen = b.exec(
        "local",
        "default",
        &format!("(cd www/site && {CHECK_TREE})"),
    )?;
    assert_eq!(seen, "alpha\nbeta\na.txt\nran-ok\n");
    // A directory that does not exist is not made for an archive.
    let e = b.run_with(&["cp", "-", ":nowhere"], &archive)?;
    assert_eq!(e.status.code(), Some(125), "{}", text(&e));
    assert!(text(&e).contains("mkdir -p"), "{}", text(&e));
    // Out as an archive that holds `site/...`, as docker cp writes it.
    let o = b.run(&["cp", ":www/site", "-"])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = b.here().join("unpacked");
    std::fs::create_dir(&out)?;
    tar::Archive::new(&o.stdout[..]).unpack(&out)?;
    assert_sample_tree(&out.join("site"))?;
    Ok(())
}

#[test]
fn errors_say_what_to_do_and_exit_125() -> TestResult {
    let b = Berth::new("off")?;
    // A missing source here fails before any sandbox is made.
    let e = b.fails(&["cp", "./nope.txt", ":"], 125)?;
    assert!(e.contains("does not exist on this machine"), "{e}");
    assert!(!b.work("default").exists(), "the default sandbox was made");
    // A sandbox that does not exist is not made either (as with exec).
    std::fs::write(b.here().join("f.txt"), "x")?;
    let e = b.fails(&["cp", "f.txt", "ghost:f.txt"], 125)?;
    assert!(
        e.contains("sandbox `ghost` not found") && e.contains("berth sandbox create ghost"),
        "{e}"
    );
    let e = b.fails(&["cp", "-s", "ghost", ":f.txt", "."], 125)?;
    assert!(e.contains("sandbox `ghost` not found"), "{e}");
    assert!(!b.work("ghost").exists());
    // Missing in the sandbox.
    let e = b.fails(&["cp", ":missing.txt", "."], 125)?;
    assert!(
        e.contains("does not exist in sandbox `default`") && e.contains("ls -la"),
        "{e}"
    );
    // A destination directory that does not exist, there and here.
    let e = b.fails(&["cp", "f.txt", ":no/such/f.txt"], 125)?;
    assert!(
        e.contains("/work/no/such` does not exist") && e.contains("mkdir -p"),
        "{e}"
    );
    let e = b.fails(&["cp", "f.txt", ":newdir/"], 125)?;
    assert!(e.contains("does not exist"), "{e}");
    b.ok(&["cp", "f.txt", ":f.txt"])?;
    let e = b.fails(&["cp", ":f.txt", "./no/such/"], 125)?;
    assert!(e.contains("does not exist on this machine"), "{e}");
    // A directory onto a file.
    std::fs::create_dir(b.here().join("d"))?;
    let e = b.fails(&["cp", "d", ":f.txt"], 125)?;
    assert!(e.contains("is not a directory"), "{e}");
    // Neither side, or both, in a sandbox; two sandboxes named.
    let e = b.fails(&["cp", "f.txt", "g.txt"], 125)?;
    assert!(e.contains("`:PATH`"), "{e}");
    let e = b.fails(&["cp", ":a", ":b"], 125)?;
    assert!(e.contains("both"), "{e}");
    let e = b.fails(&["cp", "-s", "one", "two:a", "."], 125)?;
    assert!(e.contains("name one"), "{e}");
    // tar failing in the sandbox: its own words are shown. The local
    // sandbox may not write outside its directories.
    let e = b.fails(&["cp", "f.txt", ":/usr/"], 125)?;
    assert!(
        e.contains("`tar` in sandbox `default` (local) failed"),
        "{e}"
    );
    assert!(e.contains("tar: f.txt: Cannot open"), "{e}");
    let events = b.events()?;
    assert!(events.contains("\"kind\":\"copy.failed\""), "{events}");
    Ok(())
}

const FILE_RULES: &str = r#"
[[files.rules]]
name = "no-secrets-in"
action = "deny"
ops = ["write"]
paths = ["**/secret*"]
reason = "secrets stay out of sandboxes"

[[files.rules]]
name = "keys-stay"
action = "deny"
ops = ["read"]
paths = ["**/*.key"]

[[files.rules]]
name = "ask-for-config"
action = "ask"
ops = ["write"]
paths = ["**/config.toml"]
"#;

#[test]
fn copies_are_judged_by_the_file_rules_path_by_path() -> TestResult {
    let b = Berth::with_policy("off", FILE_RULES)?;
    std::fs::write(b.here().join("secret.txt"), "s3cr3t")?;
    // The rules judge the path written in the sandbox, not the one here.
    b.ok(&["cp", "secret.txt", ":notes.txt"])?;
    let e = b.fails(&["cp", "secret.txt", ":"], 126)?;
    assert!(e.contains("rule `no-secrets-in`"), "{e}");
    // One path deep in a tree refuses the whole copy, before a byte is sent.
    std::fs::create_dir_all(b.here().join("tree/deep"))?;
    std::fs::write(b.here().join("tree/ok.txt"), "ok")?;
    std::fs::write(b.here().join("tree/deep/secret.env"), "s")?;
    let e = b.fails(&["cp", "tree", ":tree"], 126)?;
    assert!(e.contains("/work/tree/deep/secret.env"), "{e}");
    b.exec("local", "default", "test ! -e tree")?;
    // Out: reads are judged, one path of a tree too.
    b.exec(
        "local",
        "default",
        "mkdir -p keys && echo k > keys/id.key && echo p > keys/id.pub",
    )?;
    let e = b.fails(&["cp", ":keys/id.key", "."], 126)?;
    assert!(e.contains("keys-stay"), "{e}");
    let e = b.fails(&["cp", ":keys", "./keys"], 126)?;
    assert!(e.contains("keys-stay"), "{e}");
    assert!(!b.here().join("keys").exists());
    b.ok(&["cp", ":keys/id.pub", "."])?;
    // berth's own directory in the sandbox is never written or read.
    let e = b.fails(&["cp", "tree/ok.txt", ":../.berth/"], 126)?;
    assert!(e.contains("builtin:berth-dir"), "{e}");
    let e = b.fails(&["cp", ":..", "./all"], 126)?;
    assert!(e.contains("builtin:berth-dir"), "{e}");
    let events = b.events()?;
    assert!(events.contains("\"kind\":\"exec.denied\""), "{events}");
    // An ask waits for a person, like a command's.
    std::fs::write(b.here().join("config.toml"), "a = 1\n")?;
    let mut child = b
        .cmd(&["cp", "config.toml", ":"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let id = loop {
        let o = b.run(&["approvals", "ls", "--json"])?;
        if let Some(line) = String::from_utf8_lossy(&o.stdout).lines().next() {
            let v: Value = serde_json::from_str(line)?;
            break v["id"].as_i64().ok_or("an approval without an id")?;
        }
        if let Some(status) = child.try_wait()? {
            return Err(format!("cp ended ({status}) without asking").into());
        }
        assert!(
            Instant::now() < deadline,
            "no approval appeared: {}",
            text(&o)
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    b.ok(&["approve", &id.to_string()])?;
    let o = child.wait_with_output()?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(b.work("default").join("config.toml"))?,
        "a = 1\n"
    );
    Ok(())
}

/// On a terminal the copy draws its progress and ends with a summary
/// (through `script`, which gives it one); elsewhere it is quiet (see
/// `a_file_goes_in_and_comes_back_out_on_local`).
#[test]
fn progress_and_a_summary_are_drawn_on_a_terminal() -> TestResult {
    let b = Berth::new("off")?;
    noise_file(&b.here().join("n.bin"), 3 << 20)?;
    let line = format!("{} cp n.bin :n.bin", env!("CARGO_BIN_EXE_berth"));
    let o = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(b.here())
        .env("BERTH_STATE_DIR", b.state())
        .env("BERTH_POLICY", b.dir.path().join("policy.toml"))
        .env("BERTH_SERVER", "off")
        .stdin(Stdio::null())
        .output()?;
    let seen = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        seen.contains("copied 1 file, 3.0 MiB in") && seen.contains("/s): "),
        "{seen}"
    );
    assert!(b.work("default").join("n.bin").is_file());
    Ok(())
}

#[test]
fn help_teaches_with_examples() -> TestResult {
    let b = Berth::new("off")?;
    let help = b.ok(&["cp", "--help"])?;
    for want in [
        "berth cp ./data.csv :data/",
        "berth cp :out/report.txt ./",
        "SANDBOX:PATH",
        "126",
        "125",
        "--json",
    ] {
        assert!(help.contains(want), "{want} missing from:\n{help}");
    }
    Ok(())
}

// ---------------------------------------------------------------- docker

#[cfg(feature = "docker")]
#[test]
fn files_and_trees_go_both_ways_on_docker_owned_by_the_sandbox_user() -> TestResult {
    let mut b = Berth::new("auto")?;
    let name = format!("cp-{}", std::process::id());
    b.create("docker", &name, &[])?;
    let sb = |p: &str| format!("{name}:{p}");
    std::fs::write(b.here().join("data.csv"), "id,v\n1,2\n")?;
    b.ok(&["cp", "-b", "docker", "data.csv", &sb("data.csv")])?;
    sample_tree(&b.here().join("proj"))?;
    b.ok(&["cp", "-b", "docker", "proj", &sb("app")])?;
    let seen = b.exec("docker", &name, &format!("(cd app && {CHECK_TREE})"))?;
    assert_eq!(seen, "alpha\nbeta\na.txt\nran-ok\n");
    // Everything written belongs to the sandbox's user, not root.
    let owners = b.exec(
        "docker",
        &name,
        "stat -c %u:%g data.csv; find app -exec stat -c %u:%g {} + | sort -u",
    )?;
    assert_eq!(owners, "1000:1000\n1000:1000\n");
    // And out again, as this side's user.
    b.ok(&["cp", "-b", "docker", &sb("app"), "./out"])?;
    assert_sample_tree(&b.here().join("out"))?;
    b.ok(&["cp", "-b", "docker", &sb("data.csv"), "./back.csv"])?;
    assert_eq!(
        std::fs::read_to_string(b.here().join("back.csv"))?,
        "id,v\n1,2\n"
    );
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        std::fs::metadata(b.here().join("out/sub/run.sh"))?.uid(),
        me
    );
    // A file past 40 MiB, both ways.
    noise_file(&b.here().join("big.bin"), (41 << 20) + 7)?;
    let want = sha256_file(&b.here().join("big.bin"))?;
    let v = json_line(&b.ok(&["cp", "-b", "docker", "--json", "big.bin", &sb("")])?)?;
    assert_eq!(v["bytes"], (41 << 20) + 7, "{v}");
    let inside = b.exec("docker", &name, "sha256sum big.bin; stat -c %u big.bin")?;
    assert_eq!(inside, format!("{want}  big.bin\n1000\n"));
    b.ok(&["cp", "-b", "docker", &sb("big.bin"), "big.back"])?;
    assert_eq!(sha256_file(&b.here().join("big.back"))?, want);
    // A tar the sandbox's user cannot run to the end shows its stderr.
    let e = b.fails(&["cp", "-b", "docker", "data.csv", &sb("/etc/")], 125)?;
    assert!(
        e.contains("`tar` in sandbox") && e.contains("Permission denied"),
        "{e}"
    );
    // A sandbox that does not exist is not made.
    let e = b.fails(&["cp", "-b", "docker", "data.csv", "ghost-cp:"], 125)?;
    assert!(e.contains("sandbox `ghost-cp` not found"), "{e}");
    assert!(!b.sandbox_names("docker")?.contains(&"ghost-cp".to_string()));
    Ok(())
}

// ---------------------------------------------------------------- ssh

#[cfg(feature = "ssh")]
mod over_ssh {
    use super::*;

    /// berth with a test sshd known as `box1` in its `~/.ssh/config`.
    struct Box1 {
        host: crate::support::box1::Box1,
        berth: Berth,
    }

    impl Box1 {
        fn start() -> Result<Box1, BoxError> {
            Ok(Box1 {
                host: crate::support::box1::Box1::start()?,
                berth: Berth::new("off")?,
            })
        }

        fn run(&self, args: &[&str]) -> std::io::Result<Output> {
            self.host.apply(&mut self.berth.cmd(args)).output()
        }

        fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
            let o = self.run(args)?;
            if o.status.code() != Some(0) {
                return Err(format!("berth {args:?}: {}", text(&o)).into());
            }
            Ok(String::from_utf8_lossy(&o.stdout).into_owned())
        }
    }

    #[test]
    fn files_and_trees_go_both_ways_over_ssh_and_a_dead_host_is_named() -> TestResult {
        let mut b = Box1::start()?;
        b.ok(&["sandbox", "create", "cpbox", "-b", "ssh", "--host", "box1"])?;
        let here = b.berth.here();
        std::fs::write(here.join("data.csv"), "id,v\n1,2\n")?;
        sample_tree(&here.join("proj"))?;
        b.ok(&["cp", "-b", "ssh", "-s", "cpbox", "data.csv", ":"])?;
        b.ok(&["cp", "-b", "ssh", "proj", "cpbox:app"])?;
        let seen = b.ok(&[
            "exec",
            "-b",
            "ssh",
            "-s",
            "cpbox",
            "--",
            &format!("cat data.csv && (cd app && {CHECK_TREE})"),
        ])?;
        assert_eq!(seen, "id,v\n1,2\nalpha\nbeta\na.txt\nran-ok\n");
        b.ok(&["cp", "-b", "ssh", "cpbox:app", "./out"])?;
        assert_sample_tree(&here.join("out"))?;
        // Another host than the sandbox's is refused, as exec refuses it.
        let o = b.run(&[
            "cp",
            "-b",
            "ssh",
            "--host",
            "127.0.0.2",
            "data.csv",
            "cpbox:",
        ])?;
        assert_eq!(o.status.code(), Some(125), "{}", text(&o));
        assert!(text(&o).contains("keeps its host `box1`"), "{}", text(&o));
        // The host gone: the copy fails, saying what to check.
        b.host.sshd.stop();
        let o = b.run(&["cp", "-b", "ssh", "data.csv", "cpbox:again.csv"])?;
        assert_eq!(o.status.code(), Some(125), "{}", text(&o));
        assert!(
            text(&o).contains("connection refused") && text(&o).contains("host is up"),
            "{}",
            text(&o)
        );
        b.host.sshd.restart()?;
        b.ok(&["sandbox", "rm", "cpbox", "-b", "ssh"])?;
        Ok(())
    }
}
