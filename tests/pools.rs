//! Warm pools (issue 53, item 3) from the CLI against the real Docker
//! engine and the k8s stand-in: `berth pool create` makes sandboxes ahead,
//! `sandbox create --from-pool` takes one (its shell already up), the
//! server refills the pool behind it, a killed server loses none of it, and
//! bad input is refused with nothing left behind. `bench --create` runs and
//! cleans up after itself.

use std::time::{Duration, Instant};

use serde_json::Value;

use berth_core::backend::Backend;

use crate::docker_settings::{State, unique};
use crate::support::TestResult;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn pool(st: &State, name: &str) -> Result<Value, BoxError> {
    let v: Value = serde_json::from_str(&st.ok(&["pool", "ls", "--json"])?)?;
    v.as_array()
        .and_then(|l| l.iter().find(|p| p["name"] == name).cloned())
        .ok_or_else(|| format!("pool {name} is not listed: {v}").into())
}

/// Wait until pool `name` has `ready` members.
fn wait_ready(st: &State, name: &str, ready: u64) -> Result<Value, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = pool(st, name)?;
        if p["ready"].as_u64() == Some(ready) {
            return Ok(p);
        }
        if Instant::now() > deadline {
            return Err(format!("pool {name} never had {ready} ready: {p}").into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the engine has the container of backend-side sandbox `instance`.
fn has_container(st: &State, instance: &str) -> Result<bool, BoxError> {
    let (rt, b) = st.engine()?;
    let cname = b.names().container(instance);
    Ok(rt
        .block_on(b.client().inspect_container(&cname, None))
        .is_ok())
}

fn members_of(st: &State, name: &str) -> Result<Vec<String>, BoxError> {
    let (rt, b) = st.engine()?;
    let prefix = format!("pool-{name}-");
    let listed = rt.block_on(b.list())?;
    Ok(listed
        .into_iter()
        .map(|s| s.name)
        .filter(|n| n.starts_with(&prefix))
        .collect())
}

fn failed(o: &std::process::Output) -> String {
    format!(
        "exit {:?}: {}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The whole round on docker through a server: made ahead, taken warm with
/// the pool's settings, used as any sandbox, refilled, kept by `gc`, and
/// removed with its pool.
#[test]
fn a_docker_pool_hands_out_ready_sandboxes_and_refills() -> TestResult {
    let mut st = State::new("auto")?;
    let p = unique("pool");
    st.owns_pool(&p);
    let made = st.ok(&[
        "pool",
        "create",
        &p,
        "--backend",
        "docker",
        "--size",
        "2",
        "--memory-mb",
        "256",
    ])?;
    assert!(made.contains("2 of 2 ready"), "{made}");
    let listed = pool(&st, &p)?;
    assert_eq!(listed["backend"], "docker", "{listed}");
    assert_eq!(listed["memory_mb"], 256, "{listed}");
    let members = members_of(&st, &p)?;
    assert_eq!(members.len(), 2, "{members:?}");
    // Pool members are the pool's: not listed as sandboxes, nor as orphans.
    let ls = st.ok(&["sandbox", "ls", "-b", "docker", "--json"])?;
    assert!(!ls.contains(&format!("pool-{p}")), "{ls}");

    let a = unique("froma");
    st.owns(&a, "docker");
    let got: Value =
        serde_json::from_str(&st.ok(&["sandbox", "create", &a, "--from-pool", &p, "--json"])?)?;
    assert_eq!(got["backend"], "docker", "{got}");
    let member = got["member"]
        .as_str()
        .ok_or_else(|| format!("no member taken: {got}"))?
        .to_string();
    assert!(members.contains(&member), "{member} of {members:?}");
    // A sandbox like any other: its session keeps its state.
    let o = st.exec(&a, "cd /tmp && export FROM_POOL=yes && hostname")?;
    assert_eq!(o.status.code(), Some(0), "{}", failed(&o));
    let o = st.exec(&a, "echo $FROM_POOL $(pwd)")?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "yes /tmp\n",
        "{}",
        failed(&o)
    );
    // Its settings are the pool's, on record and on the engine.
    let inspected: Value =
        serde_json::from_str(&st.ok(&["sandbox", "inspect", &a, "-b", "docker", "--json"])?)?;
    assert_eq!(
        inspected["container"]["settings"]["memory_mb"], 256,
        "{inspected}"
    );
    assert_eq!(
        inspected["differences"].as_array().map(|d| d.len()),
        Some(0),
        "{inspected}"
    );
    // Listed by its own name, running, not an orphan.
    let ls: Value = serde_json::from_str(&st.ok(&["sandbox", "ls", "-b", "docker", "--json"])?)?;
    let row = ls
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == a.as_str()).cloned())
        .ok_or_else(|| format!("{a} not listed: {ls}"))?;
    assert_eq!(row["state"], "running", "{row}");
    assert_eq!(row["orphan"], false, "{row}");

    // The server made a new member behind the one taken (the engine has
    // it, the two ready and the taken one, which is `a`).
    wait_ready(&st, &p, 2)?;
    let now = members_of(&st, &p)?;
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(now.contains(&member), "{now:?}");

    // A garbage collection keeps members and taken sandboxes.
    st.ok(&["sandbox", "gc", "-b", "docker", "--workspaces"])?;
    assert!(has_container(&st, &member)?, "gc removed {member}");
    assert_eq!(members_of(&st, &p)?, now);
    let o = st.exec(&a, "echo $FROM_POOL")?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "yes\n",
        "{}",
        failed(&o)
    );

    // The name is the sandbox's now: a second take of it is refused.
    let o = st.run(&["sandbox", "create", &a, "--from-pool", &p])?;
    assert_eq!(o.status.code(), Some(125), "{}", failed(&o));
    assert!(failed(&o).contains("exists"), "{}", failed(&o));

    // Removing the sandbox removes the member it is.
    st.ok(&["sandbox", "rm", &a, "-b", "docker"])?;
    assert!(
        !has_container(&st, &member)?,
        "{member} outlived its sandbox"
    );

    // Removing the pool removes its members.
    let rm = st.ok(&["pool", "rm", &p, "--json"])?;
    let rm: Value = serde_json::from_str(&rm)?;
    assert_eq!(rm["members"].as_array().map(|m| m.len()), Some(2), "{rm}");
    assert!(members_of(&st, &p)?.is_empty());
    let ls = st.ok(&["pool", "ls"])?;
    assert!(ls.contains("no pools"), "{ls}");
    Ok(())
}

/// Without a server: the CLI refills the pool before it leaves; and a
/// killed server (kill -9) loses no member: the next one warms them.
#[test]
fn a_pool_is_refilled_without_a_server_and_survives_a_killed_one() -> TestResult {
    let mut st = State::new("off")?;
    let p = unique("poff");
    st.owns_pool(&p);
    st.ok(&["pool", "create", &p, "--size", "1"])?;
    let a = unique("offa");
    st.owns(&a, "docker");
    let got: Value =
        serde_json::from_str(&st.ok(&["sandbox", "create", &a, "--from-pool", &p, "--json"])?)?;
    assert!(got["member"].is_string(), "{got}");
    // Refilled before the CLI left.
    assert_eq!(pool(&st, &p)?["ready"], 1);
    let o = st.exec(&a, "echo hi")?;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hi\n", "{}", failed(&o));

    // Now through a server, killed with SIGKILL: the member stays, and a
    // take after the restart works.
    st.set_server("auto");
    st.ok(&["sandbox", "ls", "-b", "docker"])?;
    let status: Value = serde_json::from_str(&st.ok(&["server", "status", "--json"])?)?;
    let pid = status["pid"].as_u64().ok_or("no server runs")? as libc::pid_t;
    // SAFETY: SIGKILL to the server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    gone(pid)?;
    let b = unique("offb");
    st.owns(&b, "docker");
    let got: Value =
        serde_json::from_str(&st.ok(&["sandbox", "create", &b, "--from-pool", &p, "--json"])?)?;
    assert!(got["member"].is_string(), "the member was lost: {got}");
    let o = st.exec(&b, "echo after")?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "after\n",
        "{}",
        failed(&o)
    );
    wait_ready(&st, &p, 1)?;
    Ok(())
}

/// Wait until process `pid` is dead (gone, or a zombie).
fn gone(pid: libc::pid_t) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return Ok(()),
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z')) =>
            {
                return Ok(());
            }
            Ok(_) if Instant::now() > deadline => {
                return Err(format!("process {pid} still runs after SIGKILL").into());
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Bad input: each refused with what to do, and nothing left behind.
#[test]
fn bad_pools_are_refused_and_leave_nothing() -> TestResult {
    let mut st = State::new("off")?;
    let cases: &[(&[&str], &str)] = &[
        (
            &["pool", "create", "x", "--backend", "local"],
            "docker and k8s",
        ),
        (&["pool", "create", "x", "--size", "0"], "1 to 64"),
        (&["pool", "create", "a b"], "pool name"),
        (
            &["pool", "create", "x", "--network", "allow:pypi.org"],
            "--network allow:",
        ),
        (
            &["pool", "create", "x", "--opt", "instance=y"],
            "berth's own",
        ),
        (
            &["sandbox", "create", "y", "--from-pool", "nope"],
            "berth pool ls",
        ),
        (
            &["sandbox", "create", "y", "--from-pool", "x", "--image", "i"],
            "cannot be used with",
        ),
        (
            &[
                "sandbox",
                "create",
                "y",
                "-b",
                "docker",
                "--opt",
                "instance=z",
            ],
            "berth's own",
        ),
    ];
    for (args, want) in cases {
        let o = st.run(args)?;
        assert_ne!(o.status.code(), Some(0), "{args:?}: {}", failed(&o));
        assert!(
            failed(&o).contains(want),
            "{args:?}: want {want:?} in {}",
            failed(&o)
        );
    }
    // An image the engine lacks: the create fails, naming it, and neither
    // the pool nor a member stays.
    let p = unique("pbad");
    let o = st.run(&[
        "pool",
        "create",
        &p,
        "--image",
        "berth-no-such-image:1",
        "--size",
        "1",
    ])?;
    assert_ne!(o.status.code(), Some(0), "{}", failed(&o));
    assert!(failed(&o).contains("berth-no-such-image"), "{}", failed(&o));
    assert!(st.ok(&["pool", "ls"])?.contains("no pools"));
    assert!(members_of(&st, &p)?.is_empty());
    // A pool name is taken once.
    let q = unique("ptwice");
    st.owns_pool(&q);
    st.ok(&["pool", "create", &q, "--size", "1"])?;
    let o = st.run(&["pool", "create", &q, "--size", "1"])?;
    assert!(failed(&o).contains("exists"), "{}", failed(&o));
    assert_eq!(pool(&st, &q)?["ready"], 1);
    Ok(())
}

/// A pool on the k8s stand-in (agent-sandbox installed): taken warm, used,
/// removed with its sandbox.
#[cfg(feature = "k8s")]
#[test]
fn a_k8s_pool_hands_out_ready_sandboxes() -> TestResult {
    let image = tokio::runtime::Runtime::new()?.block_on(async {
        berth_backends::docker::DockerBackend::connect()
            .await?
            .ensure_image()
            .await
    })?;
    let standin = crate::readme::StandinBin::start("k8s-standin", 1)?;
    let mut st = State::new("auto")?;
    st.env = standin.vars.clone();
    st.env.push(("BERTH_K8S_IMAGE".into(), image));
    st.backend = "k8s";
    let p = unique("pk8s");
    st.owns_pool(&p);
    let made = st.ok(&["pool", "create", &p, "--backend", "k8s", "--size", "1"])?;
    assert!(made.contains("1 of 1 ready"), "{made}");
    let a = unique("k8sa");
    st.owns(&a, "k8s");
    let got: Value =
        serde_json::from_str(&st.ok(&["sandbox", "create", &a, "--from-pool", &p, "--json"])?)?;
    assert_eq!(got["backend"], "k8s", "{got}");
    assert!(got["member"].is_string(), "{got}");
    let o = st.exec(&a, "export K=1; id -u")?;
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "1000\n",
        "{}",
        failed(&o)
    );
    let o = st.exec(&a, "echo $K")?;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "1\n", "{}", failed(&o));
    let ls = st.ok(&["sandbox", "ls", "-b", "k8s", "--json"])?;
    assert!(ls.contains(&a), "{ls}");
    assert!(!ls.contains(&format!("pool-{p}")), "{ls}");
    wait_ready(&st, &p, 1)?;
    st.ok(&["sandbox", "rm", &a, "-b", "k8s"])?;
    st.ok(&["pool", "rm", &p])?;
    let ls = st.ok(&["sandbox", "ls", "-b", "k8s", "--json"])?;
    assert!(!ls.contains(&p) && !ls.contains(&a), "{ls}");
    Ok(())
}

/// `bench --create` on docker: the floor, cold and warm series, as JSON,
/// and no pool or sandbox left behind. (No time is asserted.)
#[test]
fn bench_create_measures_cold_and_warm_and_cleans_up() -> TestResult {
    let st = State::new("off")?;
    let out = st.ok(&["bench", "--create", "-b", "docker", "-n", "2", "--json"])?;
    let v: Value = serde_json::from_str(&out)?;
    assert!(v["floor_ms"].as_f64().is_some_and(|f| f > 0.0), "{v}");
    let row = &v["backends"][0];
    assert_eq!(row["backend"], "docker", "{v}");
    for key in ["cold_ms", "warm_ms", "cold_vs_floor", "warm_vs_floor"] {
        assert!(row[key].as_f64().is_some_and(|f| f > 0.0), "{key}: {v}");
    }
    assert_eq!(row["warm_misses"], 0, "{v}");
    assert!(st.ok(&["pool", "ls"])?.contains("no pools"));
    let (rt, b) = st.engine()?;
    let left = rt.block_on(b.list())?;
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}
