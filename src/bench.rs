//! `berth bench`: a persistent session against a fresh process per command,
//! measured side by side in one run, so the ratio holds on any machine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use berth_core::backend::{Sandbox, SandboxSpec};
use berth_core::session::{ExecOpts, Session, SessionConfig};
use clap::Args;
use serde_json::json;

use berth_core::backend::BackendKind;

use crate::context::{self, DEFAULT_BACKEND};

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// Backend to measure; with --cli, several, comma separated
    /// (`-b local,docker,ssh`), each against its own floor and `bash -c`.
    #[arg(long, short = 'b', default_value = DEFAULT_BACKEND)]
    pub backend: String,
    /// Commands per measurement.
    #[arg(long, short = 'n', default_value_t = 300)]
    pub count: usize,
    /// Backend option for the bench sandbox (repeatable), e.g. `host=myserver`
    /// for ssh; `BACKEND:KEY=VALUE` gives it to that backend only, for a
    /// --cli run over several (`-o ssh:host=myserver`).
    #[arg(long = "opt", short = 'o', value_name = "KEY=VALUE")]
    pub options: Vec<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Also measure a `terminal` call through the tool registry, and through
    /// `berth mcp` on stdio (a child process spoken to as an MCP client would).
    #[arg(long)]
    pub mcp: bool,
    /// Measure whole CLI processes instead: `berth exec -- echo hi` with the
    /// server, with `BERTH_SERVER=off`, and the backend's own way without
    /// berth: `bash -c`, `docker exec`, or `ssh` over a ControlMaster (at most
    /// 100 runs each).
    #[arg(long)]
    pub cli: bool,
    /// Measure checkpoints instead: the first, one after 10 small changes,
    /// one after none, and a restore, against `cp -a` and `tar` of the same
    /// workspace (and a shadow git repository, where the sandbox has git).
    #[arg(long, conflicts_with_all = ["cli", "mcp"])]
    pub checkpoint: bool,
    /// Measure berth's egress proxy instead (`--network allow:`): a request
    /// per connection and a --size-mb download, through the proxy and
    /// directly, to one origin on loopback.
    #[arg(long, conflicts_with_all = ["cli", "mcp", "checkpoint"])]
    pub egress: bool,
    /// Measure creating a sandbox instead: create and first command, made
    /// cold and taken from a warm pool (`berth pool`), on docker and k8s
    /// (`-b docker,k8s`; docker by default), against `docker run --rm` of
    /// the same image (at most 10 runs each).
    #[arg(long, conflicts_with_all = ["cli", "mcp", "checkpoint", "egress"])]
    pub create: bool,
    /// With --checkpoint: the workspace's size in MiB (1024 when not
    /// given); with --egress, the download's (100 when not given).
    #[arg(long, value_name = "MIB")]
    pub size_mb: Option<u64>,
}

/// One measured series.
struct Series {
    label: &'static str,
    per_cmd: Duration,
}

const BENCH_SANDBOX: &str = "berth-bench";
/// A command that cannot change the shell's state: no snapshot is due.
const PROBE: &str = "echo hi";
/// A command that changes it: the shell writes a snapshot after each.
const STATEFUL_PROBE: &str = "export BERTH_BENCH=1; echo hi";
/// Functions a session defines before the last series, as sourcing a tool
/// (nvm, conda, a venv's `activate`) does: a snapshot after a plain `export`
/// need not print them again.
const FUNCTIONS: usize = 200;
/// Exported variables the last series adds, as a session that set up a
/// project does: a whole snapshot prints each of them, a journal record only
/// the one the probe exports.
const VARIABLES: usize = 40;

impl BenchArgs {
    /// Refuse arguments no series can run with.
    pub fn check(&self) -> Result<()> {
        if self.count == 0 {
            bail!("--count must be at least 1");
        }
        Ok(())
    }
}

/// The in-process series; `--cli` runs `bench_cli::run` instead
/// (the caller picks, so neither module calls the other).
pub async fn run(state_dir: Option<PathBuf>, a: BenchArgs) -> Result<u8> {
    a.check()?;
    let backend = crate::api_client::backend_kind(&a.backend)?;
    let rt = Arc::new(context::runtime(state_dir.clone())?);
    let mut spec = SandboxSpec::named(BENCH_SANDBOX);
    for o in &a.options {
        let Some((k, v)) = o.split_once('=') else {
            bail!("--opt takes KEY=VALUE, got {o:?}");
        };
        spec.options.insert(k.into(), v.into());
    }
    let spec_host = spec.options.get("host").cloned();
    let (sandbox, _, _) = rt
        .create_sandbox(backend, spec)
        .await
        .with_context(|| format!("creating the bench sandbox on {}", a.backend))?;

    let on = session_series(&sandbox, a.count, None, PROBE, "persistent session").await?;
    let stateful = session_series(
        &sandbox,
        a.count,
        None,
        STATEFUL_PROBE,
        "persistent session, `export` + snapshot",
    )
    .await?;
    let define = format!(
        "for i in $(seq {FUNCTIONS}); do eval \"berth_bench_fn_$i() {{ local x=\\${{1:-$i}}; [[ -n \\$x ]] && echo \\$x; }}\"; done"
    );
    let with_functions = session_series(
        &sandbox,
        a.count,
        Some(&define),
        STATEFUL_PROBE,
        "  the same, 200 functions defined",
    )
    .await?;
    let exports = format!(
        "for i in $(seq {VARIABLES}); do export BERTH_BENCH_VAR_$i=\"value number $i\"; done"
    );
    let with_variables = session_series(
        &sandbox,
        a.count,
        Some(&exports),
        STATEFUL_PROBE,
        "  the same, 40 more variables exported",
    )
    .await?;
    let floor = floor_series(
        backend,
        &sandbox,
        &spec_host,
        &rt.config().state_dir,
        a.count,
    )
    .await?;
    let job_wake = crate::bench_jobs::job_wake_latency(&rt, backend, BENCH_SANDBOX).await?;
    let out = output_throughput(&rt, backend).await?;
    let mbps = |d: Duration| THROUGHPUT_BYTES as f64 / 1e6 / d.as_secs_f64().max(1e-9);
    let over = |d: Duration| d.as_secs_f64() / out.floor.as_secs_f64().max(1e-9) - 1.0;
    let (out_berth, out_floor) = (out.berth, out.floor);
    let out_overhead = over(out.berth);
    let cat_overhead = over(out.cat);
    let reader_overhead = over(out.reader);
    // What berth adds beyond what any reader of the pipe costs the pipeline.
    let own_overhead =
        (out.berth.as_secs_f64() - out.reader.as_secs_f64()) / out.floor.as_secs_f64().max(1e-9);
    let mcp = if a.mcp {
        Some((
            registry_series(&rt, backend, a.count).await?,
            mcp_series(&state_dir, backend, a.count).await?,
        ))
    } else {
        None
    };

    let ratio = floor.per_cmd.as_secs_f64() / on.per_cmd.as_secs_f64().max(1e-9);
    let stateful_ratio = floor.per_cmd.as_secs_f64() / stateful.per_cmd.as_secs_f64().max(1e-9);
    let snapshot_cost = stateful.per_cmd.saturating_sub(on.per_cmd);
    let functions_cost = with_functions.per_cmd.saturating_sub(on.per_cmd);
    let variables_cost = with_variables.per_cmd.saturating_sub(on.per_cmd);
    if a.json {
        context::print_json(&json!({
            "backend": a.backend,
            "count": a.count,
            "probe": PROBE,
            "session_ms": ms(on.per_cmd),
            "stateful_probe": STATEFUL_PROBE,
            "session_stateful_ms": ms(stateful.per_cmd),
            "snapshot_cost_ms": ms(snapshot_cost),
            "functions_defined": FUNCTIONS,
            "session_stateful_functions_ms": ms(with_functions.per_cmd),
            "snapshot_cost_functions_ms": ms(functions_cost),
            "variables_exported": VARIABLES,
            "session_stateful_variables_ms": ms(with_variables.per_cmd),
            "snapshot_cost_variables_ms": ms(variables_cost),
            "floor": floor.label,
            "floor_ms": ms(floor.per_cmd),
            "speedup": ratio,
            "speedup_stateful": stateful_ratio,
            "job_wake_ms": ms(job_wake),
            "output_bytes": THROUGHPUT_BYTES,
            "output_ms": ms(out_berth),
            "output_mb_per_s": mbps(out_berth),
            "output_floor_ms": ms(out_floor),
            "output_floor_mb_per_s": mbps(out_floor),
            "output_overhead": out_overhead,
            "output_cat_ms": ms(out.cat),
            "output_cat_mb_per_s": mbps(out.cat),
            "output_cat_overhead": cat_overhead,
            "output_reader_ms": ms(out.reader),
            "output_reader_overhead": reader_overhead,
            "output_own_overhead": own_overhead,
            "registry_ms": mcp.as_ref().map(|(r, _)| ms(r.per_cmd)),
            "mcp_stdio_ms": mcp.as_ref().map(|(_, m)| ms(m.per_cmd)),
            "mcp_overhead_ms": mcp.as_ref().map(|(_, m)| ms(m.per_cmd) - ms(on.per_cmd)),
        }));
    } else {
        println!(
            "berth bench: backend {}, {} commands per series ({PROBE:?})",
            a.backend, a.count
        );
        for s in [&on, &stateful, &with_functions, &with_variables, &floor] {
            println!("  {:<40} {:>9.3} ms/command", s.label, ms(s.per_cmd));
        }
        if let Some((reg, m)) = &mcp {
            for s in [reg, m] {
                println!("  {:<40} {:>9.3} ms/command", s.label, ms(s.per_cmd));
            }
            println!(
                "  MCP terminal call costs {:+.3} ms over the session figure",
                ms(m.per_cmd) - ms(on.per_cmd)
            );
        }
        println!(
            "  snapshot cost                            {:>9.3} ms/command",
            ms(snapshot_cost)
        );
        println!(
            "    with {FUNCTIONS} functions defined                {:>9.3} ms/command",
            ms(functions_cost)
        );
        println!(
            "    with {VARIABLES} more exported variables            {:>9.3} ms/command",
            ms(variables_cost)
        );
        println!(
            "  speedup: persistent session is {ratio:.1}x faster than {} ({stateful_ratio:.1}x with a snapshot)",
            floor.label
        );
        println!(
            "  job wait wakes after the job's end       {:>9.3} ms (median of 5)",
            ms(job_wake)
        );
        println!(
            "  {} MB of output through berth               {:>9.1} MB/s ({:.0} ms)",
            THROUGHPUT_BYTES / 1_000_000,
            mbps(out_berth),
            ms(out_berth)
        );
        println!(
            "  the same pipeline to /dev/null           {:>9.1} MB/s ({:.0} ms)",
            mbps(out_floor),
            ms(out_floor)
        );
        println!(
            "  the same pipeline through `cat` to /dev/null{:>6.1} MB/s ({:.0} ms)",
            mbps(out.reader),
            ms(out.reader)
        );
        println!(
            "  the same pipeline through `cat` to a file{:>9.1} MB/s ({:.0} ms)",
            mbps(out.cat),
            ms(out.cat)
        );
        println!(
            "  berth's overhead on large output         {:>8.0} % of the pipeline's own time",
            out_overhead * 100.0
        );
        println!(
            "    of which a pipe and its reader cost    {:>8.0} % (`cat` to /dev/null)",
            reader_overhead * 100.0
        );
        println!(
            "    and berth itself                       {:>8.0} % (capture, redaction, spool)",
            own_overhead * 100.0
        );
        println!(
            "  `cat` to a file's overhead (the least a spooling reader costs) {:.0} %",
            cat_overhead * 100.0
        );
    }
    let _ = rt.remove_sandbox(backend, BENCH_SANDBOX, true).await;
    Ok(0)
}

/// Bytes the output figure streams.
const THROUGHPUT_BYTES: u64 = 50_000_000;

/// The output figures: medians of three runs each.
struct Throughput {
    /// The pipeline's output through berth.
    berth: Duration,
    /// The pipeline writing to /dev/null.
    floor: Duration,
    /// The pipeline through `cat` into a file: one more reader of a pipe that
    /// keeps what it reads, as berth's spool does, and does nothing else.
    cat: Duration,
    /// The pipeline through `cat` to /dev/null: what writing into a pipe and
    /// a reader draining it cost, which any capture of output pays. On a VM
    /// it is most of the overhead: the writer copies every byte into pipe
    /// pages and wakes the reader, where /dev/null takes nothing.
    reader: Duration,
}

/// Large output through the whole runtime path (capture, spool, redaction, a
/// live tee as the CLI has) against the same pipeline writing to /dev/null,
/// and through `cat` into a file, in the same session.
async fn output_throughput(
    rt: &berth_core::runtime::Runtime,
    backend: BackendKind,
) -> Result<Throughput> {
    use berth_core::runtime::ExecRequest;
    let pipeline = format!("head -c {THROUGHPUT_BYTES} /dev/zero | tr '\\0' a");
    let run = async |command: String, tee: bool| -> Result<(Duration, u64)> {
        let tee: Option<berth_core::session::Tee> = tee.then(|| Arc::new(|_: &[u8]| {}) as _);
        let t = Instant::now();
        let r = rt
            .exec(ExecRequest {
                backend,
                sandbox: BENCH_SANDBOX.into(),
                command,
                timeout: Some(Duration::from_secs(120)),
                tee,
                ..Default::default()
            })
            .await?;
        let took = t.elapsed();
        if r.result.exit_code != 0 {
            bail!("the output probe exited {}", r.result.exit_code);
        }
        Ok((took, r.result.output.total_bytes as u64))
    };
    let (mut through, mut floor, mut cat, mut reader) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        floor.push(run(format!("{pipeline} > /dev/null"), false).await?.0);
        reader.push(run(format!("{pipeline} | cat > /dev/null"), false).await?.0);
        cat.push(
            run(
                format!("f=$(mktemp) && {{ {pipeline} | cat > \"$f\"; }}; rm -f \"$f\""),
                false,
            )
            .await?
            .0,
        );
        let (took, bytes) = run(pipeline.clone(), true).await?;
        if bytes != THROUGHPUT_BYTES {
            bail!("the output probe returned {bytes} bytes, not {THROUGHPUT_BYTES}");
        }
        through.push(took);
    }
    through.sort();
    floor.sort();
    cat.sort();
    reader.sort();
    Ok(Throughput {
        berth: through[1],
        floor: floor[1],
        cat: cat[1],
        reader: reader[1],
    })
}

/// `terminal` calls through the tool registry in this process: validation,
/// gate, event log, redaction and bounds on top of the session.
async fn registry_series(
    rt: &Arc<berth_core::runtime::Runtime>,
    backend: BackendKind,
    n: usize,
) -> Result<Series> {
    use berth_tools::{OutcomeKind, Registry, ToolContext};
    let reg = Registry::new(rt).with_history(std::sync::Arc::new(berth_agent::history::Journal));
    let ctx = ToolContext::new(rt.clone(), backend, BENCH_SANDBOX);
    let args = json!({ "command": PROBE });
    let one = async || -> Result<()> {
        let o = reg.dispatch(&ctx, "terminal", args.clone()).await;
        if o.kind != OutcomeKind::Ok || o.text != "hi\n[exit code 0]" {
            bail!("registry probe returned {:?}: {}", o.kind, o.text);
        }
        Ok(())
    };
    for _ in 0..10 {
        one().await?;
    }
    let t = Instant::now();
    for _ in 0..n {
        one().await?;
    }
    Ok(Series {
        label: "terminal tool (registry, in process)",
        per_cmd: t.elapsed() / n as u32,
    })
}

/// `terminal` calls through `berth mcp` on stdio: a child process, one
/// JSON-RPC request per line and its reply, as an MCP client sends them.
async fn mcp_series(state_dir: &Option<PathBuf>, backend: BackendKind, n: usize) -> Result<Series> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let exe = std::env::current_exe().context("finding berth's own executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    if let Some(d) = state_dir {
        cmd.arg("--state-dir").arg(d);
    }
    let mut child = cmd
        .args([
            "mcp",
            "--backend",
            backend.as_str(),
            "--sandbox",
            BENCH_SANDBOX,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("starting berth mcp")?;
    let mut input = child.stdin.take().context("berth mcp has no stdin")?;
    let mut output =
        BufReader::new(child.stdout.take().context("berth mcp has no stdout")?).lines();
    let mut id = 0u64;
    let mut request = async |method: &str,
                             params: serde_json::Value|
           -> Result<serde_json::Value> {
        id += 1;
        let mut line =
            json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string();
        line.push('\n');
        input.write_all(line.as_bytes()).await?;
        input.flush().await?;
        loop {
            let reply = output
                .next_line()
                .await?
                .context("berth mcp closed stdout")?;
            let v: serde_json::Value = serde_json::from_str(&reply)?;
            if v["id"] == id {
                return Ok(v);
            }
        }
    };
    request(
        "initialize",
        json!({ "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": { "name": "berth-bench", "version": "0" } }),
    )
    .await?;
    let call = json!({ "name": "terminal", "arguments": { "command": PROBE } });
    for _ in 0..10 {
        request("tools/call", call.clone()).await?;
    }
    let t = Instant::now();
    for _ in 0..n {
        let r = request("tools/call", call.clone()).await?;
        if r["result"]["content"][0]["text"] != "hi\n[exit code 0]" {
            bail!("MCP probe returned {r}");
        }
    }
    let per = t.elapsed() / n as u32;
    drop(child);
    Ok(Series {
        label: "terminal tool through berth mcp (stdio)",
        per_cmd: per,
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn session_series(
    sandbox: &Arc<dyn Sandbox>,
    n: usize,
    setup: Option<&str>,
    probe: &str,
    label: &'static str,
) -> Result<Series> {
    let mut s = Session::open(sandbox.clone(), SessionConfig::named("bench")).await?;
    if let Some(setup) = setup {
        let r = s.exec(setup, ExecOpts::default()).await?;
        if r.exit_code != 0 {
            bail!(
                "the bench's setup exited {}: {}",
                r.exit_code,
                r.output.text()
            );
        }
    }
    for _ in 0..10 {
        s.exec(probe, ExecOpts::default()).await?;
    }
    let t = Instant::now();
    for _ in 0..n {
        let r = s.exec(probe, ExecOpts::default()).await?;
        if r.exit_code != 0 || r.output.text() != "hi\n" {
            bail!(
                "bench probe returned {:?} (exit {})",
                r.output.text(),
                r.exit_code
            );
        }
    }
    let per = t.elapsed() / n as u32;
    s.close().await;
    Ok(Series {
        label,
        per_cmd: per,
    })
}

/// The floor each backend is measured against: a fresh process per command,
/// the way tools without a persistent shell run.
async fn floor_series(
    backend: BackendKind,
    sandbox: &Arc<dyn Sandbox>,
    spec_host: &Option<String>,
    state_dir: &std::path::Path,
    n: usize,
) -> Result<Series> {
    #[cfg(not(feature = "docker"))]
    let _ = state_dir; // only docker names its containers by installation
    #[cfg(not(feature = "ssh"))]
    let _ = spec_host; // only ssh has a host to name
    match backend {
        BackendKind::Local => {
            let t = Instant::now();
            for _ in 0..n {
                let out = tokio::process::Command::new("bash")
                    .arg("-c")
                    .arg(PROBE)
                    .current_dir(&sandbox.layout().workdir)
                    .stdin(std::process::Stdio::null())
                    .output()
                    .await?;
                if out.stdout != b"hi\n" {
                    bail!(
                        "bash -c probe printed {:?}",
                        String::from_utf8_lossy(&out.stdout)
                    );
                }
            }
            Ok(Series {
                label: "`bash -c` spawned per command",
                per_cmd: t.elapsed() / n as u32,
            })
        }
        #[cfg(feature = "ssh")]
        BackendKind::Ssh => {
            let opts = context::ssh_options();
            let Some(host) = spec_host.clone().or_else(|| opts.host.clone()) else {
                bail!("berth bench --backend ssh needs --host HOST");
            };
            let per =
                berth_backends::ssh::bench::openssh_per_command(&opts, &host, n, PROBE, b"hi\n")
                    .await?;
            Ok(Series {
                label: "fresh `ssh host cmd` (ControlMaster)",
                per_cmd: per,
            })
        }
        #[cfg(feature = "docker")]
        BackendKind::Docker => {
            // The sandbox's container, as this state dir's installation names it.
            let installation = berth_backends::installation_id(state_dir)?;
            let per = berth_backends::docker::bench::fresh_exec_per_command(
                &installation,
                sandbox.name(),
                n,
                PROBE,
            )
            .await?;
            Ok(Series {
                label: "a fresh exec per command (bollard)",
                per_cmd: per,
            })
        }
        #[cfg(feature = "e2b")]
        BackendKind::E2b => {
            let per = berth_backends::e2b::bench::fresh_start_per_command(sandbox.name(), n, PROBE)
                .await?;
            Ok(Series {
                label: "a fresh envd Start per command (the SDK's commands.run)",
                per_cmd: per,
            })
        }
        // No CLI to compare with: the same sandbox, one fresh exec (through the
        // task command router, or `pods/exec`) per command.
        BackendKind::Modal | BackendKind::K8s => {
            let t = Instant::now();
            for _ in 0..n {
                let argv = ["bash", "-c", PROBE].map(String::from);
                let c = berth_core::backend::run_to_end(
                    sandbox.as_ref(),
                    &argv,
                    None,
                    4096,
                    Duration::from_secs(60),
                )
                .await?;
                if c.stdout != b"hi\n" {
                    bail!(
                        "fresh exec probe printed {:?}",
                        String::from_utf8_lossy(&c.stdout)
                    );
                }
            }
            Ok(Series {
                label: if backend == BackendKind::K8s {
                    "a fresh exec per command (pods/exec, as kubectl exec)"
                } else {
                    "a fresh exec per command (router)"
                },
                per_cmd: t.elapsed() / n as u32,
            })
        }
        // Reached in a build that leaves a backend out.
        #[allow(unreachable_patterns)]
        _ => bail!("no benchmark floor for backend `{backend}` yet"),
    }
}
