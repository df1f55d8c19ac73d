//! `berth run "TASK"`: the agent loop from the command line; `berth runs
//! ls|show`: its journal.
//!
//! Flow at a glance: resolve the providers (config file by name, or an ad-hoc
//! one from `--base-url`/`--model`), open the runtime and the run's sandbox,
//! start, resume or fork a run, and drive it with Ctrl-C wired to a cancel
//! token (a second Ctrl-C exits at once; the journal is consistent either
//! way). Events are printed for people, or as one JSON object per line.

use berth_core::backend::BackendKind;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use berth_agent::journal::{self, RunState};
use berth_agent::provider::{Api, Failover, ProviderConfig};
use berth_agent::runner::checkpoint::SandboxCheckpoints;
use berth_agent::runner::delegate::{Children, Delegation, Place};
use berth_agent::runner::{Agent, AgentEvent, Budget, EventSink, Setup};
use berth_agent::{RegistryTools, ToolHost};
use berth_core::backend::SandboxSpec;
use berth_core::checkpoint::record;
use berth_core::runtime::Runtime;
use berth_core::store::Store;
use berth_tools::memory;
use clap::{Args, Subcommand};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::load_config;
use crate::context;

#[derive(Args, Debug)]
#[command(after_help = "Examples:\n  \
berth run --base-url http://127.0.0.1:8080/v1 --model qwen 'count the files in /etc'\n  \
berth run --provider claude,local --max-steps 20 'make the tests pass'\n  \
berth run --resume r18f3c2a9b1   # after Ctrl-C, a crash, or `berth approve N`\n  \
berth run --fork r18f3c2a9b1 --at 2 --provider other\n\n\
berth run --resume r18f3c2a9b1 --on job:build   # sleep until the job ends; the server wakes the run

Exit codes: 0 done, 2 budget spent, 3 awaiting approval, 4 provider failed, 5 waiting, 130 interrupted, 125 error.")]
pub struct RunArgs {
    /// The task. Without one on a terminal, berth asks for it and then chats.
    pub task: Option<String>,
    /// Backend of the sandbox (local, docker, ssh).
    #[arg(long, default_value = context::DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
    pub backend: BackendKind,
    /// Sandbox to work in (`default` is created on first use).
    #[arg(long, default_value = berth_core::runtime::DEFAULT_SANDBOX)]
    pub sandbox: String,
    /// Providers from the config file to try in order, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub provider: Vec<String>,
    /// An ad-hoc provider's API root, e.g. http://127.0.0.1:8080/v1.
    #[arg(long, requires = "model")]
    pub base_url: Option<String>,
    /// The ad-hoc provider's model.
    #[arg(long)]
    pub model: Option<String>,
    /// The ad-hoc provider's wire format.
    #[arg(long, default_value = "openai")]
    pub api: Api,
    /// The variable holding the ad-hoc provider's key (default OPENAI_API_KEY
    /// or ANTHROPIC_API_KEY; a local server needs none).
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// Ask the ad-hoc provider for whole answers instead of a stream.
    #[arg(long)]
    pub no_stream: bool,
    /// Model calls the run may make.
    #[arg(long)]
    pub max_steps: Option<u32>,
    /// Tokens (input plus output) the run may use.
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Money the run may spend, at the providers' configured prices.
    #[arg(long)]
    pub max_cost: Option<f64>,
    /// The model's context window in tokens, for every provider of the run
    /// (else each provider's `context_window`, else what its endpoint says,
    /// else what its first refusal for size says).
    #[arg(long, value_name = "TOKENS")]
    pub context_window: Option<u64>,
    /// Compact the transcript when a request would pass this share of the
    /// window (default 0.75).
    #[arg(long, value_name = "SHARE")]
    pub compact_at: Option<f64>,
    /// At most this many tokens of memory notes (`berth memory`) in a new
    /// run's instructions; 0 leaves them out.
    #[arg(long, value_name = "TOKENS", default_value_t = berth_agent::runner::MEMORY_TOKENS)]
    pub memory_tokens: u64,
    /// Wait for approvals instead of saving the run and exiting.
    #[arg(long)]
    pub wait: bool,
    /// Run the tools in the berth server the CLI uses (started if none runs),
    /// on its warm shells: the run and a person at the CLI share one session.
    #[arg(long)]
    pub server: bool,
    /// One JSON event per line on stdout.
    #[arg(long)]
    pub json: bool,
    /// Carry on a run after Ctrl-C, a crash or an approval.
    #[arg(long, value_name = "RUN", conflicts_with_all = ["task", "fork"])]
    pub resume: Option<String>,
    /// With --resume: do not carry on now; wait for an event, and let the
    /// berth server carry the run on when it comes: `job:ID` (its end),
    /// `job:ID:REGEX` (a line of its output), `approval:N` (its answer),
    /// `after:SECS`.
    #[arg(long, value_name = "EVENT", requires = "resume")]
    pub on: Option<String>,
    /// The schedule that starts this run (set by `berth serve`).
    #[arg(long, hide = true, value_name = "NAME")]
    pub schedule: Option<String>,
    /// Start a new run from a past run's transcript (with --at).
    #[arg(long, value_name = "RUN", requires = "at", conflicts_with = "task")]
    pub fork: Option<String>,
    /// The step to fork after: the new run keeps steps 1..=STEP.
    #[arg(long, value_name = "STEP")]
    pub at: Option<i64>,
}

#[derive(Subcommand, Debug)]
pub enum RunsCmd {
    /// Restore a run's sandbox to its checkpoint at a step and carry the run
    /// on from there. The steps after it stay in the journal, marked.
    #[command(
        after_help = "Examples:\n  berth runs rollback r18f3c2a9b1 --to 2\n  berth runs rollback r18f3c2a9b1 --to 0 --no-resume"
    )]
    Rollback {
        /// The run's id.
        id: String,
        /// The last step to keep (0: back to before the first).
        #[arg(long, value_name = "STEP")]
        to: i64,
        /// Restore and rewind only; carry on later with `berth run --resume ID`.
        #[arg(long)]
        no_resume: bool,
        /// Print JSON events (as `berth run --json`).
        #[arg(long)]
        json: bool,
    },
    /// List runs, newest first.
    Ls {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// A run's transcript, step by step, with timings and its exit reason.
    Show {
        /// The run's id.
        id: String,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Find words in past runs' transcripts (full-text, secrets masked).
    #[command(
        after_help = "Examples:\n  berth runs search 'flaky test'\n  berth runs search postgres --sandbox prod --backend ssh --json"
    )]
    Search {
        /// The words (all must match; failing that, any).
        text: String,
        /// Only runs in this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        /// The sandbox's backend (with --sandbox).
        #[arg(long, default_value = context::DEFAULT_BACKEND, value_parser = crate::api_client::parse_backend)]
        backend: BackendKind,
        /// How many matches.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

/// The providers to use, in order.
fn providers(a: &RunArgs, stored: &[ProviderConfig]) -> Result<Vec<ProviderConfig>> {
    let (cfg, path) = load_config()?;
    let by_name = |n: &str| -> Result<ProviderConfig> {
        cfg.providers
            .iter()
            .find(|p| p.name == n)
            .cloned()
            .with_context(|| {
                let known: Vec<&str> = cfg.providers.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "no provider `{n}` in {} (it has: {}); add a [[providers]] entry or pass --base-url and --model",
                    path.display(),
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                )
            })
    };
    let mut out = Vec::new();
    for n in &a.provider {
        out.push(by_name(n)?);
    }
    if let (Some(url), Some(model)) = (&a.base_url, &a.model) {
        let mut p = ProviderConfig::new("adhoc", a.api, url, model);
        p.api_key_env = a.api_key_env.clone();
        p.stream = !a.no_stream;
        out.push(p);
    }
    if out.is_empty() && !stored.is_empty() {
        // A resume or fork keeps the run's providers, refreshed from the config.
        for s in stored {
            out.push(
                cfg.providers
                    .iter()
                    .find(|p| p.name == s.name)
                    .cloned()
                    .unwrap_or_else(|| s.clone()),
            );
        }
    }
    if out.is_empty() {
        if let Some(d) = &cfg.default_provider {
            for n in d.split(',') {
                out.push(by_name(n.trim())?);
            }
        } else if let Some(p) = cfg.providers.first() {
            out.push(p.clone());
        }
    }
    for p in &mut out {
        if let Some(w) = a.context_window {
            p.context_window = Some(w);
        }
        if let Some(f) = a.compact_at {
            p.compact_at = Some(f);
        }
    }
    if out.is_empty() {
        bail!(
            "no model provider: pass --base-url URL --model NAME (OpenAI-compatible; --api anthropic for Anthropic), or add [[providers]] to {}",
            path.display()
        );
    }
    Ok(out)
}

pub async fn run(state_dir: Option<PathBuf>, a: RunArgs) -> Result<u8> {
    if a.context_window == Some(0) {
        bail!("--context-window must be a number of tokens above 0");
    }
    if let Some(f) = a.compact_at
        && !(f > 0.0 && f <= 1.0)
    {
        bail!("--compact-at is a share of the window: a number above 0 and at most 1, e.g. 0.75");
    }
    let dir = context::state_dir(state_dir)?;
    let rt = Arc::new(context::runtime(Some(dir.clone()))?);
    let store = rt.store().clone();
    // Which run, in which sandbox.
    let (run_id, backend, sandbox, stored) = match (&a.resume, &a.fork) {
        (Some(id), _) => {
            let row = journal::run(&store, id)?
                .with_context(|| format!("no run `{id}`; list runs with `berth runs ls`"))?;
            if row.state == RunState::Done {
                eprintln!(
                    "berth: run {id} is done; continuing it needs a new message (chat) or a fork"
                );
            }
            let setup: Setup = serde_json::from_value(row.setup.clone())?;
            (Some(id.clone()), row.backend, row.sandbox, setup.providers)
        }
        (None, Some(from)) => {
            let at = a.at.context("--fork needs --at STEP")?;
            let id = Agent::fork(&store, from, at)?;
            let row = journal::run(&store, &id)?.context("the forked run vanished")?;
            let setup: Setup = serde_json::from_value(row.setup.clone())?;
            let sandbox = fork_sandbox(&rt, &row, from, at).await?;
            (Some(id), row.backend, sandbox, setup.providers)
        }
        (None, None) => (None, a.backend, a.sandbox.clone(), vec![]),
    };
    if let (Some(id), Some(on)) = (&run_id, &a.on) {
        return wait_on(&store, &dir, id, on).await;
    }
    let providers = providers(&a, &stored)?;
    let mut tools = RegistryTools::new(rt.clone(), backend, &sandbox);
    let mut server = None;
    if a.server {
        let mode = match crate::server::Mode::from_env()? {
            crate::server::Mode::Off => anyhow::bail!(
                "--server runs the tools in the berth server, and BERTH_SERVER=off turns it off; drop one of them"
            ),
            m => m,
        };
        let remote = crate::server::tools::ServerTools::new(dir.clone(), mode);
        remote.check().await?;
        tools = tools.dispatched_by(Arc::new(remote));
        server = Some((dir.clone(), mode));
    } else {
        // Fail early, with the runtime's own hint, if the sandbox cannot be had.
        rt.attach(backend, &sandbox)
            .await
            .with_context(|| format!("sandbox `{sandbox}` ({backend})"))?;
    }
    let host: Arc<dyn ToolHost> = Arc::new(tools);
    let printer = Arc::new(Printer::new(a.json));
    let sink: EventSink = {
        let p = printer.clone();
        Arc::new(move |e: &AgentEvent| p.event(e))
    };
    let redact = {
        let rt = rt.clone();
        Arc::new(move |t: &str| rt.redact(t))
    };
    let mut agent = Agent::new(
        store.clone(),
        host,
        Failover::new(providers)?,
        Budget {
            max_steps: a.max_steps,
            max_tokens: a.max_tokens,
            max_cost: a.max_cost,
        },
        sink,
        redact,
    )
    .wait_for_approvals(a.wait)
    .with_memory_tokens(a.memory_tokens)
    .with_delegation(Delegation {
        children: Arc::new(CliChildren {
            rt: rt.clone(),
            server,
        }),
        policy: rt
            .gate()
            .map(|g| g.policy().agent.clone())
            .unwrap_or_default(),
    });
    if rt.checkpoint_policy().runs {
        agent = agent.with_checkpoints(Arc::new(SandboxCheckpoints::new(
            rt.clone(),
            backend,
            &sandbox,
        )));
    }
    let chat = a.task.is_none() && run_id.is_none() && std::io::stdin().is_terminal();
    let run_id = match run_id {
        Some(id) => id,
        None => {
            let task = match &a.task {
                Some(t) => t.clone(),
                None if chat => match ask("task> ")? {
                    Some(t) => t,
                    None => return Ok(0),
                },
                None => bail!(
                    "give the task as an argument: berth run \"TASK\" (or run on a terminal to be asked)"
                ),
            };
            let id = agent.start(&task, backend, &sandbox)?;
            if let Some(name) = &a.schedule {
                crate::schedules::tag_run(&store, &id, name)?;
            }
            id
        }
    };
    let hooks = nudge_webhooks(&dir).await;
    let server_dir = dir.clone();
    let cancel = CancellationToken::new();
    let watcher = tokio::spawn(ctrl_c(cancel.clone()));
    let mut exit = agent.run(&run_id, &cancel).await?;
    // A chat: each answer of the person is a step of the same durable run.
    while chat && exit.reason == RunState::Done && !cancel.is_cancelled() {
        let Some(more) = ask("you> ")? else { break };
        agent.say(&run_id, &more)?;
        exit = agent.run(&run_id, &cancel).await?;
    }
    watcher.abort();
    rt.shutdown().await;
    if exit.reason == RunState::Waiting {
        // The server holds the wait.
        ensure_server(&server_dir).await;
    } else if hooks {
        // The server that delivers the end message may have idled out.
        nudge_webhooks(&server_dir).await;
    }
    Ok(match exit.reason {
        RunState::Done | RunState::Running => 0,
        RunState::BudgetSpent => 2,
        RunState::AwaitingApproval => 3,
        RunState::ProviderFailed => 4,
        RunState::Waiting => 5,
        RunState::Interrupted => 130,
        RunState::Error => crate::EXIT_BERTH_ERROR,
    })
}

/// Sub-agents' tools, made the way the run's own are: in this process, or
/// dispatched to the berth server with `--server`.
struct CliChildren {
    rt: Arc<Runtime>,
    server: Option<(PathBuf, crate::server::Mode)>,
}

#[async_trait::async_trait(?Send)]
impl Children for CliChildren {
    async fn host(&self, place: &Place) -> std::result::Result<Arc<dyn ToolHost>, String> {
        let text = |e: berth_core::Error| e.full_text();
        if let Some((b, s)) = &place.like {
            // Made like the parent's (image, limits, network, host) where
            // the backend is the same; with the backend's defaults elsewhere.
            let mut spec = if *b == place.backend {
                self.rt
                    .store()
                    .sandbox(*b, s)
                    .map_err(text)?
                    .map(|r| r.spec)
                    .unwrap_or_default()
            } else {
                SandboxSpec::default()
            };
            spec.name = place.sandbox.clone();
            self.rt
                .create_sandbox(place.backend, spec)
                .await
                .map_err(text)?;
        } else if self.server.is_none() {
            self.rt
                .attach(place.backend, &place.sandbox)
                .await
                .map_err(text)?;
        }
        let mut tools = RegistryTools::new(self.rt.clone(), place.backend, &place.sandbox)
            .in_session(place.session.clone());
        if let Some((dir, mode)) = &self.server {
            tools = tools.dispatched_by(Arc::new(crate::server::tools::ServerTools::new(
                dir.clone(),
                *mode,
            )));
        }
        Ok(Arc::new(tools))
    }

    async fn release(&self, place: &Place) {
        if let Err(e) = self
            .rt
            .remove_sandbox(place.backend, &place.sandbox, true)
            .await
        {
            eprintln!(
                "berth: could not remove the sub-agent's sandbox {}/{}: {}; remove it with `berth sandbox rm {} --backend {}`",
                place.backend,
                place.sandbox,
                e.full_text(),
                place.sandbox,
                place.backend
            );
        }
    }
}

/// `--resume ID --on EVENT`: the run waits for the event; the server resumes it.
async fn wait_on(store: &Store, dir: &std::path::Path, id: &str, on: &str) -> Result<u8> {
    use berth_agent::waits::{self, Wait};
    let mut w = Wait {
        run_id: id.into(),
        ..Default::default()
    };
    let bad = || {
        anyhow::anyhow!(
            "--on {on:?}: use job:ID (its end), job:ID:REGEX (a line of its output), approval:N or after:SECS"
        )
    };
    let (kind, rest) = on.split_once(':').ok_or_else(bad)?;
    match kind {
        "job" => {
            let (job, pattern) = match rest.split_once(':') {
                Some((j, p)) => (j, Some(p)),
                None => (rest, None),
            };
            let j = store.job(job).map_err(|e| anyhow::anyhow!(e.full_text()))?;
            if let Some(p) = pattern {
                regex::Regex::new(p)
                    .with_context(|| format!("--on: {p:?} is not a regular expression"))?;
            }
            w.job = Some(j.id);
            w.pattern = pattern.map(str::to_string);
        }
        "approval" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            store
                .approval(n)
                .map_err(|e| anyhow::anyhow!(e.full_text()))?;
            w.approval = Some(n);
        }
        "after" => {
            let secs: f64 = rest.parse().map_err(|_| bad())?;
            w.deadline_ms = Some(berth_core::store::now_ms() + (secs * 1000.0) as i64);
        }
        _ => return Err(bad()),
    }
    let row = journal::run(store, id)?.with_context(|| format!("no run `{id}`"))?;
    if row.state == RunState::Running && journal::claim(store, id).is_err() {
        bail!("run {id} is running in another berth; stop it (Ctrl-C) before it waits");
    }
    waits::put(store, &w)?;
    journal::set_state(
        store,
        id,
        RunState::Waiting,
        Some(&format!("waits for {on}")),
    )?;
    ensure_server(dir).await;
    eprintln!(
        "berth: run {id} waits for {on}; the berth server carries it on when it comes (`berth runs ls` shows it)"
    );
    Ok(5)
}

/// Make sure a berth server runs (it holds waits and sends webhooks).
async fn ensure_server(dir: &std::path::Path) {
    match crate::server::Mode::from_env() {
        Ok(crate::server::Mode::Off) | Err(_) => eprintln!(
            "berth: BERTH_SERVER=off: the run waits until a berth server runs (`berth serve`)"
        ),
        Ok(mode) => {
            if let Err(e) = crate::server::client::connect(dir, mode).await {
                eprintln!(
                    "berth: no berth server to hold the wait: {}; start one with `berth serve`",
                    berth_client::error_text(&e)
                );
            }
        }
    }
}

/// With webhooks in the config, make sure a berth server runs: it delivers
/// them from the event log (this run's end included). True when there are some.
async fn nudge_webhooks(dir: &std::path::Path) -> bool {
    let hooks = load_config().is_ok_and(|(c, _)| !c.webhooks.is_empty());
    if !hooks {
        return false;
    }
    match crate::server::Mode::from_env() {
        Ok(crate::server::Mode::Off) | Err(_) => {
            eprintln!(
                "berth: webhooks are configured, but BERTH_SERVER=off: they are sent when a berth server next runs"
            );
        }
        Ok(mode) => {
            if let Err(e) = crate::server::client::connect(dir, mode).await {
                eprintln!(
                    "berth: no berth server to send webhooks: {}",
                    berth_client::error_text(&e)
                );
            }
        }
    }
    true
}

/// First Ctrl-C: interrupt (the tool's process tree is killed, the run is
/// saved as interrupted). Second: exit now; every journal write is a
/// transaction, so what is on disk is consistent, and a call left `started`
/// is reported as cut off on resume.
async fn ctrl_c(cancel: CancellationToken) {
    if tokio::signal::ctrl_c().await.is_err() {
        return;
    }
    eprintln!("\nberth: interrupting; press Ctrl-C again to exit at once");
    cancel.cancel();
    if tokio::signal::ctrl_c().await.is_ok() {
        eprintln!("berth: exiting now; resume with `berth run --resume ID`");
        std::process::exit(130);
    }
}

fn ask(prompt: &str) -> Result<Option<String>> {
    eprint!("{prompt}");
    std::io::stderr().flush()?;
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let line = line.trim().to_string();
    Ok(if line.is_empty() { None } else { Some(line) })
}

/// Shows events: JSON lines, or text for a person with a spinner while a
/// tool runs.
struct Printer {
    json: bool,
    tty: bool,
    spinner: std::sync::Mutex<Option<(Arc<AtomicBool>, Instant)>>,
    mid_line: AtomicBool,
}

impl Printer {
    fn new(json: bool) -> Self {
        Self {
            json,
            tty: std::io::stderr().is_terminal(),
            spinner: std::sync::Mutex::new(None),
            mid_line: AtomicBool::new(false),
        }
    }

    fn stop_spinner(&self) -> Option<Duration> {
        let s = self.spinner.lock().ok()?.take()?;
        s.0.store(true, Ordering::Relaxed);
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        Some(s.1.elapsed())
    }

    fn newline(&self) {
        if self.mid_line.swap(false, Ordering::Relaxed) {
            println!();
        }
    }

    fn event(&self, e: &AgentEvent) {
        if self.json {
            if let Ok(line) = serde_json::to_string(e) {
                println!("{line}");
            }
            return;
        }
        match e {
            AgentEvent::Run {
                run_id,
                resumed,
                backend,
                sandbox,
            } => eprintln!(
                "berth: {} run {run_id} in {backend}/{sandbox}",
                if *resumed { "resuming" } else { "starting" }
            ),
            AgentEvent::Step { step, summary } if *summary => {
                eprintln!("berth: step {step}: budget spent, asking for a summary (tools off)")
            }
            AgentEvent::Step { .. } => {}
            AgentEvent::Child { run_id, event, .. } => self.child(run_id, event),
            AgentEvent::Text { delta } => {
                print!("{delta}");
                let _ = std::io::stdout().flush();
                self.mid_line
                    .store(!delta.ends_with('\n'), Ordering::Relaxed);
            }
            AgentEvent::Failover { attempt } => {
                self.newline();
                eprintln!(
                    "berth: provider {} {}: {}",
                    attempt.provider,
                    attempt.outcome,
                    attempt.why.clone().unwrap_or_default()
                );
            }
            AgentEvent::StepEnd { .. } => self.newline(),
            AgentEvent::Checkpoint {
                step,
                error: Some(e),
                ..
            } => {
                self.newline();
                eprintln!("berth: no checkpoint after step {step} (the run goes on): {e}");
            }
            AgentEvent::Checkpoint { .. } => {}
            AgentEvent::Compaction {
                step,
                stage,
                segment,
                tokens_before,
                tokens_after,
                window,
                note,
                ..
            } => {
                self.newline();
                eprintln!(
                    "berth: step {step}: compacted the transcript ({}, segment {segment}): {tokens_before} → {tokens_after} tokens of a {window}-token window{}",
                    stage.as_str(),
                    note.as_ref().map(|n| format!("; {n}")).unwrap_or_default()
                );
            }
            AgentEvent::ToolCall { describe, .. } => {
                self.newline();
                eprintln!("▸ {describe}");
                let done = Arc::new(AtomicBool::new(false));
                if let Ok(mut s) = self.spinner.lock() {
                    *s = Some((done.clone(), Instant::now()));
                }
                if self.tty {
                    tokio::spawn(async move {
                        let t0 = Instant::now();
                        let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
                        let mut i = 0;
                        while !done.load(Ordering::Relaxed) {
                            eprint!(
                                "\r  {} {:.1}s",
                                frames[i % frames.len()],
                                t0.elapsed().as_secs_f64()
                            );
                            i += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    });
                }
            }
            AgentEvent::Verdict {
                verdict, detail, ..
            } => {
                self.stop_spinner();
                eprintln!("  {verdict}: {detail}");
            }
            AgentEvent::Result {
                is_error,
                bytes,
                detail,
                duration_ms,
                ..
            } => {
                self.stop_spinner();
                let code = detail["exit_code"]
                    .as_i64()
                    .map(|c| format!("exit {c} · "))
                    .unwrap_or_default();
                let out = detail["bytes"].as_u64().unwrap_or(*bytes as u64);
                eprintln!(
                    "  {}{code}{out} bytes · {:.1}s",
                    if *is_error { "error · " } else { "" },
                    *duration_ms as f64 / 1000.0
                );
            }
            AgentEvent::Exit {
                run_id,
                reason,
                detail,
                steps,
                usage,
                ..
            } => {
                self.stop_spinner();
                self.newline();
                eprintln!(
                    "berth: run {run_id}: {reason} after {steps} step(s), {} tokens in ({} cached), {} out{}",
                    usage.input_tokens,
                    usage.cached_input_tokens,
                    usage.output_tokens,
                    detail
                        .as_ref()
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default()
                );
                if matches!(
                    reason,
                    RunState::Interrupted
                        | RunState::ProviderFailed
                        | RunState::Error
                        | RunState::BudgetSpent
                ) {
                    eprintln!("berth: carry on with `berth run --resume {run_id}`");
                }
            }
        }
    }
}

impl Printer {
    /// A sub-agent's event, one line for the ones a person follows: its
    /// commands, verdicts and end (its streamed text would interleave).
    fn child(&self, run_id: &str, e: &AgentEvent) {
        match e {
            AgentEvent::Child { run_id, event, .. } => self.child(run_id, event),
            AgentEvent::Run {
                backend,
                sandbox,
                resumed,
                ..
            } => {
                self.newline();
                eprintln!(
                    "  ↳ {run_id}: {} in {backend}/{sandbox}",
                    if *resumed { "resumed" } else { "started" }
                );
            }
            AgentEvent::ToolCall { describe, .. } => {
                self.newline();
                eprintln!("  ↳ {run_id}: ▸ {describe}");
            }
            AgentEvent::Verdict {
                verdict, detail, ..
            } => {
                eprintln!("  ↳ {run_id}: {verdict}: {detail}")
            }
            AgentEvent::Exit {
                reason,
                steps,
                detail,
                ..
            } => {
                self.newline();
                eprintln!(
                    "  ↳ {run_id}: {reason} after {steps} step(s){}",
                    detail
                        .as_ref()
                        .map(|d| format!(": {d}"))
                        .unwrap_or_default()
                );
            }
            _ => {}
        }
    }
}

/// `berth runs search`: matches in past transcripts, best first.
fn search(
    store: &Store,
    text: &str,
    only: Option<(BackendKind, String)>,
    limit: usize,
    json: bool,
) -> Result<u8> {
    let gate = context::gate()?;
    let redact = |t: &str| gate.redact(t).into_owned();
    let view = match only {
        Some((backend, sandbox)) => memory::View::Sandbox { backend, sandbox },
        None => memory::View::All,
    };
    let hits = berth_agent::history::search_runs(store, &view, text, limit, &redact)?;
    for h in &hits {
        if json {
            println!("{}", serde_json::to_string(h)?);
        } else {
            println!(
                "{}  step {:<3} {:<9} {}/{}  {}\n    {}",
                h.run_id,
                h.step,
                h.role,
                h.backend,
                h.sandbox,
                berth_policies::shell::printable(&h.task),
                berth_policies::shell::printable(&h.snippet.replace('\n', " "))
            );
        }
    }
    if hits.is_empty() && !json {
        eprintln!("berth: no past run says that; try fewer or other words");
        return Ok(1);
    }
    Ok(0)
}

pub async fn runs(state_dir: Option<PathBuf>, cmd: RunsCmd) -> Result<u8> {
    let dir = context::state_dir(state_dir)?;
    let store = Store::open(&dir)?;
    match cmd {
        RunsCmd::Rollback {
            id,
            to,
            no_resume,
            json,
        } => rollback(dir, &id, to, no_resume, json).await,
        RunsCmd::Search {
            text,
            sandbox,
            backend,
            limit,
            json,
        } => search(&store, &text, sandbox.map(|s| (backend, s)), limit, json),
        RunsCmd::Ls { json, limit } => {
            let rows = journal::runs(&store, limit)?;
            // A tree: each sub-agent under the run that delegated to it.
            let listed =
                |id: &Option<String>| id.as_ref().is_some_and(|p| rows.iter().any(|r| &r.id == p));
            let mut order: Vec<(&journal::RunRow, usize)> = Vec::new();
            fn below<'a>(
                rows: &'a [journal::RunRow],
                parent: &str,
                depth: usize,
                out: &mut Vec<(&'a journal::RunRow, usize)>,
            ) {
                let mut kids: Vec<&journal::RunRow> = rows
                    .iter()
                    .filter(|r| {
                        r.kind.as_deref() == Some("child") && r.parent.as_deref() == Some(parent)
                    })
                    .collect();
                kids.sort_by_key(|r| (r.created_ms, r.child_idx));
                for k in kids {
                    out.push((k, depth));
                    below(rows, &k.id, depth + 1, out);
                }
            }
            for r in &rows {
                if r.kind.as_deref() == Some("child") && listed(&r.parent) {
                    continue;
                }
                order.push((r, 0));
                below(&rows, &r.id, 1, &mut order);
            }
            for (r, level) in order {
                let steps = journal::steps(&store, &r.id)?;
                let tokens: u64 = steps.iter().map(|s| s.usage.total()).sum();
                if json {
                    println!(
                        "{}",
                        json!({
                            "id": r.id, "state": r.state, "reason": r.reason, "task": r.task,
                            "backend": r.backend, "sandbox": r.sandbox, "steps": steps.len(),
                            "tokens": tokens, "created_ms": r.created_ms, "updated_ms": r.updated_ms,
                            "parent": r.parent, "parent_step": r.parent_step, "kind": r.kind,
                            "parent_call": r.parent_call, "child_idx": r.child_idx, "depth": r.depth,
                        })
                    );
                } else {
                    let task: String = r.task.chars().take(50).collect();
                    let id = if level == 0 {
                        r.id.clone()
                    } else {
                        format!("{}└ {}", "  ".repeat(level - 1), r.id)
                    };
                    println!(
                        "{:<24} {:<18} {:>5} {:>8}  {}",
                        id,
                        r.state.as_str(),
                        steps.len(),
                        tokens,
                        task.replace('\n', " ")
                    );
                }
            }
            if !json && rows.is_empty() {
                eprintln!("berth: no runs yet; start one with `berth run \"TASK\"`");
            }
            Ok(0)
        }
        RunsCmd::Show { id, json } => {
            let row = journal::run(&store, &id)?
                .with_context(|| format!("no run `{id}`; list runs with `berth runs ls`"))?;
            let steps = journal::steps(&store, &id)?;
            let msgs = journal::all_messages(&store, &id)?;
            let calls = journal::calls(&store, &id)?;
            let compactions = journal::compactions(&store, &id)?;
            let checkpoints = record::of_run(&store, &id)?;
            let rollbacks = journal::rollbacks(&store, &id)?;
            let rolled_back = |n: i64| rollbacks.iter().any(|r| n > r.to_step && n <= r.from_step);
            if json {
                let messages: Vec<_> = msgs
                    .iter()
                    .map(
                        |(s, m)| json!({ "step": s, "message": m, "rolled_back": rolled_back(*s) }),
                    )
                    .collect();
                println!(
                    "{}",
                    json!({ "run": row, "steps": steps, "messages": messages, "calls": calls,
                            "compactions": compactions, "checkpoints": checkpoints, "rollbacks": rollbacks })
                );
                return Ok(0);
            }
            println!(
                "run {}  {}  {}/{}",
                row.id, row.state, row.backend, row.sandbox
            );
            if let Some(r) = &row.reason {
                println!("  reason: {r}");
            }
            if let Some(p) = &row.parent {
                if row.kind.as_deref() == Some("child") {
                    println!(
                        "  sub-agent of {p} (its call {} at step {})",
                        row.parent_call.clone().unwrap_or_default(),
                        row.parent_step.unwrap_or(0)
                    );
                } else {
                    println!(
                        "  forked from {p} after step {}",
                        row.parent_step.unwrap_or(0)
                    );
                }
            }
            for c in journal::descendants(&store, &id)?
                .iter()
                .filter(|c| c.parent.as_deref() == Some(id.as_str()))
            {
                println!(
                    "  sub-agent {} ({}/{}, call {}): {}",
                    c.id,
                    c.backend,
                    c.sandbox,
                    c.parent_call.clone().unwrap_or_default(),
                    c.state
                );
            }
            let last = msgs
                .iter()
                .map(|(s, _)| *s)
                .chain(steps.iter().map(|s| s.step))
                .max()
                .unwrap_or(0);
            for n in 0..=last {
                for c in compactions.iter().filter(|c| c.step == n) {
                    println!(
                        "\n══ compaction before step {n} · {} · segment {} · {} → {} tokens (window {}){}",
                        c.stage.as_str(),
                        c.segment,
                        c.tokens_before,
                        c.tokens_after,
                        c.window,
                        c.note
                            .as_ref()
                            .map(|n| format!(" · {n}"))
                            .unwrap_or_default()
                    );
                    if let Some(text) = &c.summary {
                        println!("summary:\n{text}");
                    }
                }
                if let Some(s) = steps.iter().find(|s| s.step == n) {
                    let skipped: Vec<String> = s
                        .attempts
                        .iter()
                        .filter(|a| a.outcome != "answered")
                        .map(|a| {
                            format!(
                                "{} {} ({})",
                                a.provider,
                                a.outcome,
                                a.why.clone().unwrap_or_default()
                            )
                        })
                        .collect();
                    println!(
                        "\n── step {n}{} · {} · {} ms · {} in ({} cached) / {} out{}",
                        if compactions.iter().any(|c| c.summary_step == Some(n)) {
                            " (compaction summary)"
                        } else if s.summary {
                            " (summary)"
                        } else {
                            ""
                        },
                        s.provider.clone().unwrap_or_default(),
                        s.ended_ms - s.started_ms,
                        s.usage.input_tokens,
                        s.usage.cached_input_tokens,
                        s.usage.output_tokens,
                        if skipped.is_empty() {
                            String::new()
                        } else {
                            format!(" · before it: {}", skipped.join("; "))
                        }
                    );
                    if rolled_back(n) {
                        println!("   (rolled back: not in the run's transcript any more)");
                    }
                }
                for c in checkpoints.iter().filter(|c| c.step == Some(n)) {
                    println!(
                        "   ◆ checkpoint {} {} the sandbox: {} changed, {} bytes stored, {} ms",
                        c.id,
                        if n == 0 {
                            "before step 1 of"
                        } else {
                            "after this step of"
                        },
                        c.changed,
                        c.new_bytes,
                        c.took_ms
                    );
                }
                for r in rollbacks.iter().filter(|r| r.from_step == n) {
                    println!(
                        "   ↺ rolled back to step {} (sandbox restored to checkpoint {})",
                        r.to_step, r.checkpoint
                    );
                }
                for (_, m) in msgs.iter().filter(|(s, _)| *s == n) {
                    match m.role {
                        berth_agent::provider::Role::User => println!("user: {}", m.text),
                        berth_agent::provider::Role::Assistant => {
                            if !m.text.is_empty() {
                                println!("model: {}", m.text);
                            }
                            for c in &m.tool_calls {
                                let state = calls
                                    .iter()
                                    .find(|x| x.call_id == c.id)
                                    .map(|x| {
                                        let ms = x
                                            .ended_ms
                                            .map(|e| format!(", {} ms", e - x.started_ms))
                                            .unwrap_or_default();
                                        format!("{}{ms}", x.state)
                                    })
                                    .unwrap_or_else(|| "not run".into());
                                println!("call {} {} {} [{state}]", c.id, c.name, c.arguments);
                            }
                        }
                        berth_agent::provider::Role::Tool => {
                            let preview: String = m.text.chars().take(400).collect();
                            println!(
                                "result {}{}: {}",
                                m.tool_call_id.clone().unwrap_or_default(),
                                if m.is_error { " (error)" } else { "" },
                                preview
                            );
                        }
                    }
                }
            }
            Ok(0)
        }
    }
}

/// `berth runs rollback ID --to STEP`: restore the run's sandbox to the
/// checkpoint that holds it as step STEP left it, rewind the transcript to
/// that step (the journal keeps the rest, marked), and carry on.
async fn rollback(dir: PathBuf, id: &str, to: i64, no_resume: bool, json: bool) -> Result<u8> {
    let rt = Arc::new(context::runtime(Some(dir.clone()))?);
    let store = rt.store().clone();
    let row = journal::run(&store, id)?
        .with_context(|| format!("no run `{id}`; list runs with `berth runs ls`"))?;
    if row.kind.as_deref() == Some("child") {
        anyhow::bail!(
            "run {id} is a sub-agent; roll back the run that delegated to it ({})",
            row.parent.clone().unwrap_or_default()
        );
    }
    // This process takes the run: one that another berth carries on now is refused.
    journal::claim(&store, id)?;
    let last = journal::messages(&store, id)?
        .iter()
        .map(|(s, _)| *s)
        .chain(journal::steps(&store, id)?.iter().map(|s| s.step))
        .max()
        .unwrap_or(0);
    let free = |why: &str| journal::set_state(&store, id, RunState::Interrupted, Some(why));
    if to < 0 || to >= last {
        free("a rollback was refused")?;
        anyhow::bail!(
            "run {id} is at step {last}; --to takes a step from 0 to {}",
            last - 1
        );
    }
    let cks = record::of_run(&store, id)?;
    let Some(ck) = record::at_step(&cks, &row.sandbox, to) else {
        free("a rollback was refused")?;
        anyhow::bail!(
            "run {id} has no checkpoint at or before step {to} (checkpoints: {}); runs take them unless `[checkpoints] runs = false` in the policy",
            if cks.is_empty() {
                "none".to_string()
            } else {
                cks.iter()
                    .map(|c| format!("step {}", c.step.unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    };
    // A server may hold the sandbox's shells: they would write their state
    // over the restored one.
    crate::server::client::forget(&dir, row.backend.as_str(), &row.sandbox).await;
    let restored = rt
        .restore_checkpoint(row.backend, &row.sandbox, &ck.id, false)
        .await;
    let restored = match restored {
        Ok(r) => r,
        Err(e) => {
            free("a rollback failed")?;
            return Err(e.into());
        }
    };
    journal::roll_back(&store, id, to, last, &ck.id)?;
    free(&format!("rolled back to step {to}"))?;
    eprintln!(
        "berth: rolled run {id} back to step {to}: sandbox {} restored to checkpoint {} (taken after step {}; {} written back, {} removed); steps {}..{last} stay in the journal, marked in `berth runs show`",
        row.sandbox,
        ck.id,
        ck.step.unwrap_or(0),
        restored.written,
        restored.removed,
        to + 1
    );
    rt.shutdown().await;
    if no_resume {
        eprintln!("berth: carry on with `berth run --resume {id}`");
        return Ok(0);
    }
    #[derive(clap::Parser)]
    struct Resume {
        #[command(flatten)]
        run: RunArgs,
    }
    let mut argv = vec!["run", "--resume", id];
    if json {
        argv.push("--json");
    }
    let r = <Resume as clap::Parser>::try_parse_from(argv)?;
    run(Some(dir), r.run).await
}

/// The sandbox a fork runs in: a clone of its parent's, at the checkpoint
/// that holds it as step `at` left it, so the parent's sandbox is untouched
/// and both can run side by side. Without such a checkpoint, the parent's
/// sandbox as it is now (said so).
async fn fork_sandbox(
    rt: &berth_core::runtime::Runtime,
    row: &journal::RunRow,
    from: &str,
    at: i64,
) -> Result<String> {
    let id = &row.id;
    let cks = record::of_run(rt.store(), from)?;
    let Some(ck) = record::at_step(&cks, &row.sandbox, at) else {
        eprintln!(
            "berth: run {id} forked from {from} after step {at}; {from} has no checkpoint at or before that step, so its commands see sandbox {} as it is now",
            row.sandbox
        );
        return Ok(row.sandbox.clone());
    };
    let clone = format!("fork-{id}");
    let c = rt
        .clone_sandbox(row.backend, &row.sandbox, row.backend, &clone, Some(&ck.id))
        .await
        .with_context(|| format!("cloning sandbox {} for the fork", row.sandbox))?;
    journal::set_sandbox(rt.store(), id, &clone)?;
    eprintln!(
        "berth: run {id} forked from {from} after step {at}, in sandbox {clone}: a clone of {} at checkpoint {} (after step {}), made in {} ms; {} is untouched",
        row.sandbox,
        ck.id,
        ck.step.unwrap_or(0),
        c.took_ms,
        row.sandbox
    );
    Ok(clone)
}
