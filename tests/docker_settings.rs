//! Docker sandboxes that keep their settings (issue 50, items 4 to 9), from
//! the CLI against the real engine: settings refused when they differ from
//! the sandbox's, kept through clone, recreate and restart, shown by
//! `sandbox inspect` from the container itself; the image's pip and venv and
//! the root option; the hint naming --network; a killed container started
//! again on the next call; a clone to local as root; `~/.local` named as left
//! out of checkpoints and clones.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::TestResult;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn berth_in(
    state: &Path,
    server: &str,
    env: &[(String, String)],
    args: &[&str],
) -> std::io::Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("BERTH_STATE_DIR", state)
        .env("BERTH_POLICY", state.join("policy.toml"))
        .env("BERTH_SERVER", server)
        .stdin(Stdio::null())
        .output()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A state dir whose docker sandboxes and server go when the test ends.
pub(crate) struct State {
    dir: tempfile::TempDir,
    server: &'static str,
    sandboxes: Vec<(String, String)>,
    /// Warm pools to remove at the end.
    pools: Vec<String>,
    /// Given to every berth this state runs (and so to its server).
    pub(crate) env: Vec<(String, String)>,
    /// The backend `create` and `exec` use (docker unless set).
    pub(crate) backend: &'static str,
}

impl State {
    pub(crate) fn new(server: &'static str) -> Result<Self, BoxError> {
        Ok(Self {
            dir: tempfile::tempdir()?,
            server,
            sandboxes: Vec::new(),
            pools: Vec::new(),
            env: Vec::new(),
            backend: "docker",
        })
    }

    /// Run later calls with `BERTH_SERVER=server`.
    pub(crate) fn set_server(&mut self, server: &'static str) {
        self.server = server;
    }

    /// The state directory (its `policy.toml` is the policy file).
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    pub(crate) fn run(&self, args: &[&str]) -> std::io::Result<Output> {
        berth_in(self.dir.path(), self.server, &self.env, args)
    }

    /// Run, expecting exit 0; returns stdout.
    pub(crate) fn ok(&self, args: &[&str]) -> Result<String, BoxError> {
        let o = self.run(args)?;
        if o.status.code() != Some(0) {
            return Err(format!(
                "berth {args:?} exited {:?}: {}{}",
                o.status.code(),
                text(&o.stdout),
                text(&o.stderr)
            )
            .into());
        }
        Ok(text(&o.stdout))
    }

    /// Remove pool `name` (and its members) when the test ends.
    pub(crate) fn owns_pool(&mut self, name: &str) {
        self.pools.push(name.to_string());
    }

    /// Remove `name` (on `backend`) too when the test ends (a clone, say).
    pub(crate) fn owns(&mut self, name: &str, backend: &str) {
        self.sandboxes.push((name.to_string(), backend.to_string()));
    }

    pub(crate) fn create(&mut self, name: &str, flags: &[&str]) -> Result<String, BoxError> {
        self.sandboxes
            .push((name.to_string(), self.backend.to_string()));
        let mut args = vec!["sandbox", "create", name, "-b", self.backend];
        args.extend_from_slice(flags);
        self.ok(&args)
    }

    pub(crate) fn exec(&self, name: &str, cmd: &str) -> std::io::Result<Output> {
        self.run(&["exec", "-b", self.backend, "-s", name, "--", cmd])
    }

    /// The container's settings, as `sandbox inspect --json` reads them
    /// from the engine.
    fn settings(&self, name: &str) -> Result<Value, BoxError> {
        let v: Value = serde_json::from_str(
            &self.ok(&["sandbox", "inspect", name, "-b", "docker", "--json"])?,
        )?;
        let diff = v["differences"].as_array().map_or(0, |d| d.len());
        if diff > 0 {
            return Err(format!("{name}: the container differs from the record: {v}").into());
        }
        Ok(v["container"]["settings"].clone())
    }

    /// The docker backend of this state dir's installation.
    pub(crate) fn engine(
        &self,
    ) -> Result<
        (
            tokio::runtime::Runtime,
            berth_backends::docker::DockerBackend,
        ),
        BoxError,
    > {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let id = berth_backends::installation_id(self.dir.path())?;
        let b = rt.block_on(berth_backends::docker::DockerBackend::connect())?;
        Ok((rt, b.with_installation(&id)))
    }

    /// `docker kill` the sandbox's container, and wait until the engine says
    /// it is not running.
    fn kill(&self, name: &str) -> TestResult {
        let (rt, b) = self.engine()?;
        let cname = b.names().container(name);
        rt.block_on(async {
            b.client().kill_container(&cname, None).await?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let c = b.client().inspect_container(&cname, None).await?;
                if c.state.and_then(|s| s.running) != Some(true) {
                    return Ok::<(), BoxError>(());
                }
                if Instant::now() > deadline {
                    return Err("the killed container still runs after 30 s".into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }

    /// `docker rm -f` the sandbox's container (its volumes stay).
    fn remove_container(&self, name: &str) -> TestResult {
        self.kill(name)?;
        let (rt, b) = self.engine()?;
        let cname = b.names().container(name);
        rt.block_on(b.client().remove_container(&cname, None))?;
        Ok(())
    }
}

impl Drop for State {
    fn drop(&mut self) {
        for p in &self.pools {
            let _ = self.run(&["pool", "rm", p]);
        }
        for (s, b) in &self.sandboxes {
            let _ = self.run(&["sandbox", "rm", s, "-b", b]);
        }
        let _ = self.run(&["server", "stop"]);
    }
}

pub(crate) fn unique(tag: &str) -> String {
    format!("t{tag}-{}", std::process::id())
}

/// The settings every check below compares, from `sandbox inspect --json`.
fn same_settings(name: &str, want: &Value, got: &Value) -> TestResult {
    for key in [
        "network",
        "memory_mb",
        "milli_cpu",
        "pids",
        "user",
        "read_only",
        "cap_add",
    ] {
        if want[key] != got[key] {
            return Err(format!(
                "{name}: setting {key} is {} where the sandbox was made with {}",
                got[key], want[key]
            )
            .into());
        }
    }
    Ok(())
}

/// Item 4: every setting, as the container really has it, is the same after
/// a clone, after the container is removed (recreated on its volumes) and
/// after it is killed (started again).
#[test]
fn docker_settings_survive_clone_recreate_and_restart() -> TestResult {
    let mut st = State::new("auto")?;
    let name = unique("set");
    st.create(
        &name,
        &[
            "--network",
            "--memory-mb",
            "300",
            "--cpus",
            "0.5",
            "--pids",
            "100",
            "-o",
            "user=root",
            "-o",
            "read_only=true",
            "-o",
            "cap_add=CHOWN,FOWNER,DAC_OVERRIDE",
        ],
    )?;
    let want = st.settings(&name)?;
    // What was asked is what the engine has.
    assert_eq!(want["network"], "bridge", "{want}");
    assert_eq!(want["memory_mb"], 300, "{want}");
    assert_eq!(want["milli_cpu"], 500, "{want}");
    assert_eq!(want["pids"], 100, "{want}");
    assert_eq!(want["user"], "0:0", "{want}");
    assert_eq!(want["read_only"], true, "{want}");
    assert_eq!(
        want["cap_add"],
        serde_json::json!(["CHOWN", "DAC_OVERRIDE", "FOWNER"])
    );
    st.ok(&["exec", "-b", "docker", "-s", &name, "--", "echo kept > f"])?;
    // Clone.
    let clone = format!("{name}-c");
    st.owns(&clone, "docker");
    st.ok(&["sandbox", "clone", "-b", "docker", &name, &clone])?;
    same_settings(&clone, &want, &st.settings(&clone)?)?;
    // Recreate: the container is gone, its volumes stay.
    st.remove_container(&name)?;
    let o = st.exec(&name, "cat f; id -u")?;
    assert_eq!(text(&o.stdout), "kept\n0\n", "{}", text(&o.stderr));
    same_settings(&format!("{name} recreated"), &want, &st.settings(&name)?)?;
    // Restart: the container was killed.
    st.kill(&name)?;
    let o = st.exec(&name, "cat f")?;
    assert_eq!(text(&o.stdout), "kept\n", "{}", text(&o.stderr));
    same_settings(&format!("{name} restarted"), &want, &st.settings(&name)?)?;
    // The defaults hold too: the issue's own case, a network-off sandbox
    // asked again with --network, then cloned and recreated.
    let plain = unique("plain");
    st.create(&plain, &[])?;
    let defaults = st.settings(&plain)?;
    assert_eq!(defaults["network"], "none", "{defaults}");
    assert_eq!(defaults["user"], "1000:1000", "{defaults}");
    let o = st.run(&["sandbox", "create", &plain, "-b", "docker", "--network"])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stdout));
    let plain_clone = format!("{plain}-c");
    st.owns(&plain_clone, "docker");
    st.ok(&["sandbox", "clone", "-b", "docker", &plain, &plain_clone])?;
    same_settings(&plain_clone, &defaults, &st.settings(&plain_clone)?)?;
    st.remove_container(&plain)?;
    st.ok(&["exec", "-b", "docker", "-s", &plain, "--", "true"])?;
    same_settings(&plain, &defaults, &st.settings(&plain)?)?;
    Ok(())
}

/// Item 4: `sandbox create` of a sandbox that exists, with any one setting
/// other than its own, is refused, names that setting and what to do, and
/// changes nothing (neither the record nor the container).
#[test]
fn docker_create_with_other_settings_is_refused_per_setting() -> TestResult {
    let mut st = State::new("off")?;
    let name = unique("diff");
    st.create(&name, &["--memory-mb", "400"])?;
    let before = st.settings(&name)?;
    // The same settings again: an attach.
    let out = st.create(&name, &["--memory-mb", "400"])?;
    assert!(out.contains("attached to existing"), "{out}");
    for (flags, setting) in [
        (&["--memory-mb", "400", "--network"][..], "network"),
        (&["--memory-mb", "500"][..], "memory"),
        (&["--memory-mb", "400", "--cpus", "2"][..], "cpus"),
        (&["--memory-mb", "400", "--pids", "50"][..], "pids"),
        (&["--memory-mb", "400", "--image", "debian"][..], "image"),
        (
            &["--memory-mb", "400", "-o", "user=root"][..],
            "option user",
        ),
        (
            &["--memory-mb", "400", "-o", "read_only=true"][..],
            "option read_only",
        ),
        (
            &["--memory-mb", "400", "-o", "cap_add=CHOWN"][..],
            "option cap_add",
        ),
        (&["--memory-mb", "400", "-e", "A=1"][..], "environment: A"),
        (&[][..], "memory"),
    ] {
        let mut args = vec!["sandbox", "create", &name, "-b", "docker"];
        args.extend_from_slice(flags);
        let o = st.run(&args)?;
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{flags:?}: {err}");
        assert!(
            err.contains(&format!("  {setting}")) && err.contains("berth sandbox rm"),
            "{flags:?} must name {setting} and what to do: {err}"
        );
        same_settings(&name, &before, &st.settings(&name)?)?;
    }
    Ok(())
}

/// Item 5: `sandbox inspect` shows backend, daemon, image, limits, network
/// and size from the container, and names a container that differs from its
/// record.
#[test]
fn docker_sandbox_inspect_reads_the_container() -> TestResult {
    let mut st = State::new("off")?;
    let name = unique("insp");
    st.create(&name, &["--pids", "77"])?;
    st.ok(&[
        "exec",
        "-b",
        "docker",
        "-s",
        &name,
        "--",
        "head -c 2000000 /dev/zero > big",
    ])?;
    let v: Value =
        serde_json::from_str(&st.ok(&["sandbox", "inspect", &name, "-b", "docker", "--json"])?)?;
    assert_eq!(v["backend"], "docker", "{v}");
    assert_eq!(v["record"]["pids"], 77, "{v}");
    let c = &v["container"];
    assert_eq!(c["state"], "running", "{v}");
    assert_eq!(c["settings"]["pids"], 77, "{v}");
    assert_eq!(c["settings"]["network"], "none", "{v}");
    assert_eq!(c["settings"]["memory_mb"], 2048, "{v}");
    assert!(
        c["settings"]["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("berth-sandbox:")),
        "{v}"
    );
    assert!(c["daemon"].as_str().is_some_and(|d| !d.is_empty()), "{v}");
    assert!(
        c["workspace_bytes"]
            .as_u64()
            .is_some_and(|b| b >= 2_000_000),
        "{v}"
    );
    let human = st.ok(&["sandbox", "inspect", &name, "-b", "docker"])?;
    for want in [
        "network none",
        "pids 77",
        "memory 2048 MiB",
        "image berth-sandbox:",
        "size: workspace 1.9 MiB",
    ] {
        assert!(human.contains(want), "{want} in:\n{human}");
    }
    // A container that is not what the record says is named, and refused.
    let (rt, b) = st.engine()?;
    let spec = {
        let mut s = berth_core::backend::SandboxSpec::named(&name);
        s.limits.pids = Some(77);
        s
    };
    st.remove_container(&name)?;
    let mut other = spec.clone();
    other.network = berth_core::backend::Network::Open;
    rt.block_on(berth_core::backend::Backend::provision(&b, &other))?;
    let v: Value =
        serde_json::from_str(&st.ok(&["sandbox", "inspect", &name, "-b", "docker", "--json"])?)?;
    let diff = v["differences"].to_string();
    assert!(
        diff.contains("network: the container has bridge, the spec none"),
        "{v}"
    );
    let o = st.exec(&name, "true")?;
    assert_eq!(o.status.code(), Some(125));
    assert!(
        text(&o.stderr).contains("network: the container has bridge"),
        "{}",
        text(&o.stderr)
    );
    Ok(())
}

/// Item 6: the README's `pip --version` runs; venv works without root; the
/// root option installs a package with dpkg; a network failure in a
/// network-off sandbox gets a hint naming --network.
#[test]
fn docker_image_installs_things_and_names_the_network() -> TestResult {
    let mut st = State::new("off")?;
    let name = unique("pip");
    st.create(&name, &[])?;
    // The README's example, as shown.
    let o = st.run(&[
        "exec",
        "--backend",
        "docker",
        "--sandbox",
        &name,
        "--",
        "pip --version",
    ])?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).starts_with("pip "), "{}", text(&o.stdout));
    let o = st.exec(
        &name,
        "python3 -m venv .venv && .venv/bin/pip --version && .venv/bin/python -c 'import sys; print(sys.prefix)'",
    )?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("/workspace/.venv\n"),
        "{}",
        text(&o.stdout)
    );
    // A package built here, installed by dpkg: refused to the default user,
    // done as root.
    let build = "mkdir -p pkg/DEBIAN pkg/usr/local/bin && printf 'Package: berth-probe\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: probe\\n' > pkg/DEBIAN/control && printf '#!/bin/sh\\necho probed\\n' > pkg/usr/local/bin/berth-probe && chmod 755 pkg/usr/local/bin/berth-probe && dpkg-deb --root-owner-group --build pkg probe.deb >/dev/null";
    let o = st.exec(&name, &format!("{build} && dpkg -i probe.deb"))?;
    assert_ne!(
        o.status.code(),
        Some(0),
        "dpkg as uid 1000: {}",
        text(&o.stdout)
    );
    let root = unique("root");
    st.create(&root, &["-o", "user=root"])?;
    let o = st.exec(
        &root,
        &format!("{build} && dpkg -i probe.deb >/dev/null && berth-probe && id -u"),
    )?;
    assert_eq!(text(&o.stdout), "probed\n0\n", "{}", text(&o.stderr));
    // No network: curl fails, and berth says what the sandbox lacks.
    let o = st.exec(&name, "curl -sS --max-time 5 https://deb.debian.org/")?;
    assert_ne!(o.status.code(), Some(0));
    let err = text(&o.stderr);
    assert!(
        err.contains("has no network") && err.contains("--network"),
        "{err}"
    );
    // A failure with nothing of the network in it gets no such hint.
    let o = st.exec(&name, "ls /nonexistent")?;
    assert!(
        !text(&o.stderr).contains("--network"),
        "{}",
        text(&o.stderr)
    );
    Ok(())
}

/// Item 7: the first call after `docker kill` starts the container again
/// and runs, through the server (whose shell died with the container) and
/// in-process alike, and says "started again", not "recreated". A job
/// started after a kill runs too.
#[test]
fn docker_first_call_after_a_kill_starts_the_container_again() -> TestResult {
    for server in ["auto", "off"] {
        let mut st = State::new(server)?;
        let name = unique(&format!("kill{server}"));
        st.create(&name, &[])?;
        st.ok(&["exec", "-b", "docker", "-s", &name, "--", "export KEPT=yes"])?;
        st.kill(&name)?;
        let o = st.exec(&name, "echo $KEPT")?;
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{server}: {err}");
        assert_eq!(text(&o.stdout), "yes\n", "{server}: {err}");
        assert!(err.contains("it was started again"), "{server}: {err}");
        assert!(!err.contains("recreated"), "{server}: {err}");
        st.kill(&name)?;
        let o = st.run(&[
            "job", "start", "-b", "docker", "-s", &name, "--name", "after", "--", "echo ran",
        ])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", text(&o.stderr));
        let o = st.run(&["job", "wait", "after", "--timeout", "60"])?;
        assert_eq!(o.status.code(), Some(0), "{server}: {}", text(&o.stderr));
    }
    Ok(())
}

/// Items 8 and 9: a docker sandbox (files of uid 1000) clones into a local
/// one while berth runs as root; files under `~/.local` (pip --user) are
/// named as left out of the checkpoint and the clone.
#[test]
fn docker_clone_to_local_as_root_and_home_left_out_is_named() -> TestResult {
    let mut st = State::new("off")?;
    let name = unique("toloc");
    st.create(&name, &[])?;
    st.ok(&[
        "exec",
        "-b",
        "docker",
        "-s",
        &name,
        "--",
        "mkdir -p app && echo hello > app/f && cd app && export MOVED=1 && mkdir -p ~/.local/lib && echo x > ~/.local/lib/userpkg.py",
    ])?;
    let out = st.ok(&["sandbox", "checkpoint", &name, "-b", "docker"])?;
    assert!(
        out.contains("left out: 1 files under /home/berth/.local")
            && out.contains("python3 -m venv"),
        "{out}"
    );
    let dst = unique("local");
    let cloned = st.run(&[
        "sandbox", "clone", "-b", "docker", &name, &dst, "--to", "local",
    ]);
    let read = st.run(&["exec", "-s", &dst, "--", "cat f; echo $MOVED"]);
    let _ = st.run(&["sandbox", "rm", &dst]);
    let o = cloned?;
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("not carried over: 1 files under /home/berth/.local"),
        "{}",
        text(&o.stdout)
    );
    let o = read?;
    assert_eq!(text(&o.stdout), "hello\n1\n", "{}", text(&o.stderr));
    Ok(())
}

/// A create the backend refuses for its settings (an option docker does
/// not take) makes nothing, and leaves no row that `sandbox ls` would show
/// as a missing sandbox; the name is free for a good create after.
#[test]
fn a_refused_create_leaves_no_sandbox_behind() -> TestResult {
    let mut st = State::new("off")?;
    let name = unique("refused");
    let o = st.run(&[
        "sandbox", "create", &name, "-b", "docker", "--opt", "bogus=1",
    ])?;
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("unknown docker option `bogus`"),
        "{}",
        text(&o.stderr)
    );
    let ls = st.ok(&["sandbox", "ls", "-b", "docker", "--json"])?;
    let list: Value = serde_json::from_str(&ls)?;
    assert!(
        !list
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["name"] == name.as_str())),
        "{ls}"
    );
    st.create(&name, &[])?;
    assert_eq!(text(&st.exec(&name, "echo made")?.stdout), "made\n");
    Ok(())
}
