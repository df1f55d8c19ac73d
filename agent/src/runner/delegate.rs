//! `delegate`: sub-agents. A model hands tasks to child agents; each child is
//! a run of its own, with its own journal, tools that are a subset of its
//! parent's, a budget carved out of its parent's, and a sandbox: the
//! parent's (in a shell session of its own) or a new one per child.
//!
//! Flow at a glance, for one model turn ([`Agent::delegate_turn`]):
//! 1. every unanswered `delegate` call of the turn is journaled started, and
//!    the children they ask for are counted against the policy's fan-out
//!    cap (over the whole turn) and depth cap: a model that asks for more is
//!    told so, and nothing starts;
//! 2. each child's run is found by (parent, call, place in the fan-out) or
//!    created, so a resume after `kill -9` finds the children it started:
//!    one that ended is never run again, one that had not is resumed (its own
//!    journal reports its cut-off calls, and never reruns them);
//! 3. all children of the turn run at once, each under a child of the
//!    parent's cancel token (Ctrl-C, a spent budget, a deny stop them all);
//! 4. each call's result is its children's final answers, each bounded.
//!    A child that fails is a result, not a crash; a child that waits for an
//!    approval pauses its parent, whose resume resumes it.

use std::collections::HashMap;

use async_trait::async_trait;
use berth_policies::AgentPolicy;
use futures::future::LocalBoxFuture;

use super::*;
use crate::context::bound;
use crate::journal::{CallState, Link, RunRow};

/// The tool's name.
pub const DELEGATE: &str = "delegate";
/// The most of a child's final answer its parent is sent, in bytes.
const CHILD_RESULT_LIMIT: usize = 4 * 1024;
/// Model calls a child may make when neither its parent's budget nor the
/// call bounds them: a child is never unbounded.
const CHILD_DEFAULT_STEPS: u32 = 30;

/// Where a child works.
#[derive(Clone, Debug, PartialEq)]
pub struct Place {
    /// Backend.
    pub backend: BackendKind,
    /// Sandbox.
    pub sandbox: String,
    /// The shell session its commands run in: a child in its parent's
    /// sandbox gets one of its own, so the two never share a cwd.
    pub session: Option<String>,
    /// A new sandbox, made like this one (backend, sandbox) where the
    /// backends match; removed when the child ends unless kept.
    pub like: Option<(BackendKind, String)>,
}

/// What a delegating agent needs from its front end: tools for its children.
#[async_trait(?Send)]
pub trait Children: Send + Sync {
    /// The tools of a child working at `place`; a new sandbox (`place.like`)
    /// is created first (idempotent: a resumed child re-attaches to it).
    async fn host(&self, place: &Place) -> std::result::Result<Arc<dyn ToolHost>, String>;
    /// The child at `place` ended: a new sandbox of its own may go.
    async fn release(&self, place: &Place);
}

/// An agent's sub-agents: how their tools are made, and the policy's bounds.
#[derive(Clone)]
pub struct Delegation {
    /// Tools for children.
    pub children: Arc<dyn Children>,
    /// Depth, fan-out, backends.
    pub policy: AgentPolicy,
}

/// The tool as the model sees it.
pub fn spec() -> ToolSpec {
    ToolSpec {
        name: DELEGATE.into(),
        description: "Hand self-contained tasks to sub-agents that work at the same time; each one's final answer comes back as this call's result. Calls in one turn run together too.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {
                "tasks": { "type": "array", "items": { "type": "string" }, "minItems": 1,
                           "description": "One sub-agent per task; it sees nothing of this conversation." },
                "tools": { "type": "array", "items": { "type": "string" }, "description": "Some of your tools (default all)." },
                "sandbox": { "type": "string", "enum": ["same", "new"], "description": "same: a session of its own in your sandbox; new: a sandbox of its own, removed after." },
                "backend": { "type": "string" },
                "keep_sandbox": { "type": "boolean" },
                "max_steps": { "type": "integer", "minimum": 1 },
                "max_tokens": { "type": "integer", "minimum": 1 },
                "max_cost": { "type": "number", "minimum": 0 }
            },
            "required": ["tasks"]
        }),
    }
}

/// A `delegate` call's arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    tasks: Vec<String>,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    sandbox: Option<String>,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default)]
    keep_sandbox: bool,
    #[serde(default)]
    max_steps: Option<u32>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_cost: Option<f64>,
}

/// One `delegate` call of the turn, as settle hands it over.
pub(super) struct Pending {
    /// Its place in the turn.
    pub idx: i64,
    /// The provider's id.
    pub call_id: String,
    /// Its arguments, checked against the schema.
    pub args: Value,
    /// As journaled (redacted).
    pub args_text: String,
}

/// How one child came out.
struct ChildEnd {
    run_id: String,
    place: Place,
    state: RunState,
    detail: Option<String>,
    answer: Option<String>,
    steps: i64,
    tokens: u64,
    /// The approval it waits on, when it paused.
    approval: Option<i64>,
}

/// One child to carry out: its run and where it works.
struct Job {
    call_id: String,
    place: Place,
    keep: bool,
    budget: Budget,
    row: RunRow,
}

impl Agent {
    /// Give this agent sub-agents (the `delegate` tool).
    pub fn with_delegation(mut self, d: Delegation) -> Self {
        self.delegation = Some(d);
        self
    }

    /// Whether a run at `depth` gets the `delegate` tool.
    pub(super) fn may_delegate(&self, depth: i64) -> bool {
        self.delegation
            .as_ref()
            .is_some_and(|d| depth < d.policy.max_depth as i64)
    }

    /// Run every unanswered `delegate` call of run `id`'s turn `step` at
    /// once. Returns each call's outcome by id, or the run's stop (a child
    /// paused on an approval, or the run was cancelled).
    pub(super) async fn delegate_turn(
        &self,
        id: &str,
        setup: &Setup,
        step: i64,
        batch: &[Pending],
        cancel: &CancellationToken,
    ) -> Result<std::result::Result<HashMap<String, ToolOutcome>, Stopped>> {
        let mut out: HashMap<String, ToolOutcome> = HashMap::new();
        for p in batch {
            journal::call_started(
                &self.store,
                id,
                &p.call_id,
                step,
                p.idx,
                DELEGATE,
                &p.args_text,
            )?;
            (self.events)(&AgentEvent::ToolCall {
                step,
                call_id: p.call_id.clone(),
                name: DELEGATE.into(),
                args: serde_json::from_str(&p.args_text).unwrap_or(Value::Null),
                describe: describe(&p.args),
            });
        }
        let Some(row) = journal::run(&self.store, id)? else {
            return Err(not_found(id));
        };
        let refuse_all = |why: String| -> HashMap<String, ToolOutcome> {
            batch
                .iter()
                .map(|p| {
                    (
                        p.call_id.clone(),
                        ToolOutcome::error(format!("[berth: {why}]")),
                    )
                })
                .collect()
        };
        let Some(deleg) = self.delegation.clone() else {
            return Ok(Ok(refuse_all(
                "this berth has no sub-agents: delegate is not available here. Do the work yourself."
                    .into(),
            )));
        };
        if row.depth >= deleg.policy.max_depth as i64 {
            return Ok(Ok(refuse_all(format!(
                "this run is a sub-agent at depth {} and the policy allows {} level(s) of sub-agents ([agent] max_depth): it may not delegate. Do the work yourself.",
                row.depth, deleg.policy.max_depth
            ))));
        }
        // Parse each call; a bad one is answered alone.
        let mut parsed: Vec<(&Pending, Args)> = Vec::new();
        for p in batch {
            match serde_json::from_value::<Args>(p.args.clone()) {
                Ok(a) => parsed.push((p, a)),
                Err(e) => {
                    out.insert(
                        p.call_id.clone(),
                        ToolOutcome::error(format!(
                            "[berth: delegate's arguments are wrong: {e}. Nothing was started.]"
                        )),
                    );
                }
            }
        }
        let wanted: usize = parsed.iter().map(|(_, a)| a.tasks.len()).sum();
        let cap = deleg.policy.max_fanout as usize;
        if wanted > cap {
            for (p, _) in &parsed {
                out.insert(
                    p.call_id.clone(),
                    ToolOutcome::error(format!(
                        "[berth: this turn asks for {wanted} sub-agents in all, and the policy allows at most {cap} at once ([agent] max_fanout). Nothing was started: give fewer tasks per turn, or do some of the work yourself.]"
                    )),
                );
            }
            return Ok(Ok(out));
        }
        // What the parent may still spend, shared among this turn's children:
        // their budgets add up to no more than what is left, so the parent's
        // budget bounds its whole tree, at every depth.
        let spent = totals_of(&self.store, id)?;
        let share = match self.share(&spent, wanted.max(1)) {
            Ok(s) => s,
            Err(why) => {
                for (p, _) in &parsed {
                    out.insert(
                        p.call_id.clone(),
                        ToolOutcome::error(format!(
                            "[berth: {why}. Nothing was started: give fewer tasks, or do the work yourself.]"
                        )),
                    );
                }
                return Ok(Ok(out));
            }
        };
        let mut jobs: Vec<Job> = Vec::new();
        for (p, a) in &parsed {
            match self.plan(&row, setup, step, p, a, share, &deleg.policy) {
                Ok(mut j) => jobs.append(&mut j),
                Err(why) => {
                    out.insert(
                        p.call_id.clone(),
                        ToolOutcome::error(format!("[berth: {why}]")),
                    );
                }
            }
        }
        let futs: Vec<LocalBoxFuture<'_, Result<(String, ChildEnd)>>> = jobs
            .into_iter()
            .map(|j| {
                let deleg = deleg.clone();
                let fut: LocalBoxFuture<'_, Result<(String, ChildEnd)>> = Box::pin(async move {
                    let end = self
                        .carry(j.row, &j.place, j.budget, &deleg, cancel)
                        .await?;
                    if !j.keep && j.place.like.is_some() && end.state.is_final() {
                        deleg.children.release(&j.place).await;
                    }
                    Ok((j.call_id, end))
                });
                fut
            })
            .collect();
        let ends = futures::future::join_all(futs).await;
        let mut by_call: HashMap<String, Vec<ChildEnd>> = HashMap::new();
        for e in ends {
            let (call, end) = e?;
            by_call.entry(call).or_default().push(end);
        }
        if cancel.is_cancelled() {
            return Ok(Err(Some(interrupted())));
        }
        let paused: Vec<&ChildEnd> = by_call
            .values()
            .flatten()
            .filter(|e| e.state == RunState::AwaitingApproval)
            .collect();
        if let Some(first) = paused.first() {
            let what: Vec<String> = paused
                .iter()
                .map(|e| match e.approval {
                    Some(a) => format!("sub-agent {} waits for approval #{a}", e.run_id),
                    None => format!("sub-agent {} waits for an approval", e.run_id),
                })
                .collect();
            let answer = first
                .approval
                .map(|a| format!("`berth approve {a}` or `berth deny {a}`"))
                .unwrap_or_else(|| "`berth approvals ls`".into());
            return Ok(Err(Some((
                RunState::AwaitingApproval,
                Some(format!(
                    "{}: answer with {answer}, then carry on with `berth run --resume {id}`",
                    what.join("; ")
                )),
                None,
            ))));
        }
        for (p, _) in &parsed {
            if out.contains_key(&p.call_id) {
                continue;
            }
            let ends = by_call.remove(&p.call_id).unwrap_or_default();
            out.insert(p.call_id.clone(), report(&ends));
        }
        Ok(Ok(out))
    }

    /// The part of what the parent may still spend that each of `n`
    /// children may have, per dimension (`None`: the parent is unbounded
    /// there); the shares add up to no more than what is left. A child's
    /// share of model calls includes its last, tool-less summary call, so
    /// its budget of steps is one less. An error when what is left cannot
    /// give each child something.
    fn share(&self, spent: &Totals, n: usize) -> std::result::Result<Budget, String> {
        let n64 = n as u64;
        let max_steps = match self.budget.max_steps {
            None => None,
            Some(m) => {
                let left = (m as i64 - spent.steps).max(0) as u64;
                let each = left / n64;
                if each < 2 {
                    return Err(format!(
                        "this run has {left} model call(s) of its budget left, and each of {n} sub-agent(s) needs at least 2 (a step and its summary)"
                    ));
                }
                Some((each - 1) as u32)
            }
        };
        let max_tokens = match self.budget.max_tokens {
            None => None,
            Some(m) => {
                let left = m.saturating_sub(spent.usage.total());
                let each = left / n64;
                if each == 0 {
                    return Err(format!(
                        "this run has {left} token(s) of its budget left: none to give {n} sub-agent(s)"
                    ));
                }
                Some(each)
            }
        };
        let max_cost = match self.budget.max_cost {
            None => None,
            Some(m) => {
                let left = m - spent.cost;
                if left <= 0.0 {
                    return Err("this run has no cost budget left for sub-agents".into());
                }
                Some(left / n as f64)
            }
        };
        Ok(Budget {
            max_steps,
            max_tokens,
            max_cost,
        })
    }

    /// The children one call asks for: found in the journal, or created.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        row: &RunRow,
        setup: &Setup,
        step: i64,
        p: &Pending,
        a: &Args,
        share: Budget,
        policy: &AgentPolicy,
    ) -> std::result::Result<Vec<Job>, String> {
        if a.tasks.iter().any(|t| t.trim().is_empty()) {
            return Err(
                "a task is empty: say what each sub-agent should do. Nothing was started.".into(),
            );
        }
        let new = match a.sandbox.as_deref() {
            None | Some("same") => false,
            Some("new") => true,
            Some(other) => {
                return Err(format!(
                    "sandbox `{other}` is neither `same` nor `new`. Nothing was started."
                ));
            }
        };
        let backend = match a.backend.as_deref() {
            None => row.backend,
            Some(b) => BackendKind::named(b).map_err(|e| format!("{e}. Nothing was started."))?,
        };
        if !new && backend != row.backend {
            return Err(format!(
                "backend `{backend}` needs `sandbox: new` (a child in your sandbox works on your backend, {}). Nothing was started.",
                row.backend
            ));
        }
        if !policy.allows_backend(row.backend.as_str(), backend.as_str()) {
            return Err(format!(
                "the policy lets sub-agents of a run on {} get new sandboxes on {} only ([agent] backends), not on `{backend}`. Nothing was started.",
                row.backend,
                std::iter::once(row.backend.as_str())
                    .chain(policy.backends.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        // Tools: a subset of the parent's, never more.
        let mine: Vec<&str> = setup.tools.iter().map(|t| t.name.as_str()).collect();
        let names: Vec<String> = match &a.tools {
            Some(list) => {
                if let Some(bad) = list.iter().find(|n| !mine.contains(&n.as_str())) {
                    return Err(format!(
                        "`{bad}` is not one of your tools ({}); a sub-agent gets a subset of yours. Nothing was started.",
                        mine.join(", ")
                    ));
                }
                list.clone()
            }
            None => mine.iter().map(|s| s.to_string()).collect(),
        };
        let depth = row.depth + 1;
        let tools: Vec<ToolSpec> = setup
            .tools
            .iter()
            .filter(|t| names.contains(&t.name))
            .filter(|t| t.name != DELEGATE || self.may_delegate(depth))
            .cloned()
            .collect();
        let asked = Budget {
            max_steps: a.max_steps,
            max_tokens: a.max_tokens,
            max_cost: a.max_cost,
        };
        let budget = carve(asked, share);
        let existing =
            journal::children(&self.store, &row.id, &p.call_id).map_err(|e| e.to_string())?;
        let mut jobs = Vec::new();
        for (i, task) in a.tasks.iter().enumerate() {
            let child = match existing.iter().find(|c| c.child_idx == Some(i as i64)) {
                Some(c) => c.clone(),
                None => {
                    let child_id = journal::new_run_id();
                    let (sandbox, session, like) = if new {
                        (
                            format!("child-{child_id}"),
                            None,
                            Some((row.backend, row.sandbox.clone())),
                        )
                    } else {
                        (row.sandbox.clone(), Some(format!("child-{child_id}")), None)
                    };
                    let child_setup = Setup {
                        system: child_system(backend, &sandbox, &tools),
                        tools: tools.clone(),
                        max_calls_per_turn: setup.max_calls_per_turn,
                        providers: setup.providers.clone(),
                        child: Some(ChildSetup {
                            budget,
                            session,
                            like,
                            keep_sandbox: a.keep_sandbox,
                        }),
                    };
                    let value = serde_json::to_value(&child_setup).map_err(|e| e.to_string())?;
                    journal::create(
                        &self.store,
                        &child_id,
                        task,
                        backend,
                        &sandbox,
                        &value,
                        Link::Child {
                            parent: &row.id,
                            step,
                            call: &p.call_id,
                            idx: i as i64,
                            depth,
                        },
                    )
                    .and_then(|()| {
                        journal::append_message(&self.store, &child_id, 0, &Message::user(task))
                    })
                    .map_err(|e| e.to_string())?;
                    journal::run(&self.store, &child_id)
                        .map_err(|e| e.to_string())?
                        .ok_or_else(|| format!("the new sub-agent run {child_id} vanished"))?
                }
            };
            let cs: Setup = serde_json::from_value(child.setup.clone())
                .map_err(|e| format!("sub-agent {}: its setup does not read: {e}", child.id))?;
            let c = cs.child.unwrap_or_default();
            jobs.push(Job {
                call_id: p.call_id.clone(),
                place: Place {
                    backend: child.backend,
                    sandbox: child.sandbox.clone(),
                    session: c.session,
                    like: c.like,
                },
                keep: c.keep_sandbox,
                budget: c.budget,
                row: child,
            });
        }
        Ok(jobs)
    }

    /// Carry one child to its end: run it, or read how it ended.
    async fn carry(
        &self,
        row: RunRow,
        place: &Place,
        budget: Budget,
        deleg: &Delegation,
        cancel: &CancellationToken,
    ) -> Result<ChildEnd> {
        let id = row.id.clone();
        if !row.state.is_final() {
            match deleg.children.host(place).await {
                Err(why) => {
                    let why = format!(
                        "no sandbox for the sub-agent ({}/{}): {why}",
                        place.backend, place.sandbox
                    );
                    journal::set_state(&self.store, &id, RunState::Error, Some(&why))?;
                }
                Ok(host) => {
                    let events = self.events.clone();
                    let (parent, child) = (row.parent.clone().unwrap_or_default(), id.clone());
                    let mut agent = Agent {
                        store: self.store.clone(),
                        host,
                        failover: self.failover.clone(),
                        budget,
                        wait_approvals: self.wait_approvals,
                        events: Arc::new(move |e: &AgentEvent| {
                            events(&AgentEvent::Child {
                                parent: parent.clone(),
                                run_id: child.clone(),
                                event: Box::new(e.clone()),
                            })
                        }),
                        redact: self.redact.clone(),
                        memory_tokens: self.memory_tokens,
                        delegation: self.delegation.clone(),
                        // A child's steps are its parent's call: the parent's
                        // checkpoint after that step holds what they did.
                        checkpoints: None,
                    };
                    // Boxed: a child's run may delegate in turn.
                    let run: LocalBoxFuture<'_, Result<Exit>> =
                        Box::pin(async move { agent.run(&id, &cancel.child_token()).await });
                    run.await?;
                }
            }
        }
        self.ended(&row.id, place)
    }

    /// How a child stands, from its journal.
    fn ended(&self, id: &str, place: &Place) -> Result<ChildEnd> {
        let Some(row) = journal::run(&self.store, id)? else {
            return Err(not_found(id));
        };
        let t = totals_of(&self.store, id)?;
        let answer = journal::messages(&self.store, id)?
            .into_iter()
            .rev()
            .find(|(_, m)| m.role == Role::Assistant && m.tool_calls.is_empty())
            .map(|(_, m)| m.text)
            .filter(|_| matches!(row.state, RunState::Done | RunState::BudgetSpent));
        let approval = if row.state == RunState::AwaitingApproval {
            journal::calls(&self.store, id)?
                .into_iter()
                .rev()
                .find(|c| c.state == CallState::AwaitingApproval)
                .and_then(|c| c.approval)
        } else {
            None
        };
        Ok(ChildEnd {
            run_id: id.into(),
            place: place.clone(),
            state: row.state,
            detail: row.reason,
            answer,
            steps: t.steps,
            tokens: t.usage.total(),
            approval,
        })
    }
}

/// A child's own budget: what the call asks for, within its share of the
/// parent's; never unbounded in steps.
fn carve(asked: Budget, share: Budget) -> Budget {
    fn min<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<T> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if a < b { a } else { b }),
            (a, b) => a.or(b),
        }
    }
    let mut b = Budget {
        max_steps: min(asked.max_steps, share.max_steps),
        max_tokens: min(asked.max_tokens, share.max_tokens),
        max_cost: min(asked.max_cost, share.max_cost),
    };
    if b.max_steps.is_none() {
        b.max_steps = Some(CHILD_DEFAULT_STEPS);
    }
    b
}

/// A child's system prompt.
fn child_system(backend: BackendKind, sandbox: &str, tools: &[ToolSpec]) -> String {
    let mut s = default_system(backend, sandbox);
    if tools.iter().any(|t| t.name == "memory") {
        s.push_str(MEMORY_HINT);
    }
    if tools.iter().any(|t| t.name == DELEGATE) {
        s.push_str(DELEGATE_HINT);
    }
    s.push_str("\nYou are a sub-agent: another agent gave you this task and reads only your final answer. End with a short, complete report of what you did and what you found.");
    s
}

/// The system prompt's line on `delegate`, when the run has it.
pub(super) const DELEGATE_HINT: &str = "\n- `delegate` hands self-contained tasks to sub-agents that work at the same time and report back; use it for independent pieces of work.";

/// A line for people.
fn describe(args: &Value) -> String {
    let n = args["tasks"].as_array().map_or(0, Vec::len);
    let first = args["tasks"][0].as_str().unwrap_or("");
    let first: String = first.chars().take(60).collect();
    let where_ = match args["sandbox"].as_str() {
        Some("new") => format!(
            " in new {} sandboxes",
            args["backend"].as_str().unwrap_or("same-backend")
        ),
        _ => String::new(),
    };
    format!("delegate {n} task(s){where_}: {first}…")
}

/// A call's result: each child's answer, bounded, with how it ended.
fn report(ends: &[ChildEnd]) -> ToolOutcome {
    let mut text = String::new();
    let mut children = Vec::new();
    for (i, e) in ends.iter().enumerate() {
        text.push_str(&format!(
            "── sub-agent {} of {} (run {}, {}/{}): {} after {} step(s), {} tokens\n",
            i + 1,
            ends.len(),
            e.run_id,
            e.place.backend,
            e.place.sandbox,
            e.state,
            e.steps,
            e.tokens
        ));
        match (&e.answer, &e.detail) {
            (Some(a), _) => text.push_str(&bound(a, CHILD_RESULT_LIMIT)),
            (None, Some(d)) => text.push_str(&format!("[berth: it ended without an answer: {d}]")),
            (None, None) => text.push_str("[berth: it ended without an answer]"),
        }
        if !text.ends_with('\n') {
            text.push('\n');
        }
        children.push(json!({
            "run_id": e.run_id, "state": e.state, "backend": e.place.backend,
            "sandbox": e.place.sandbox, "steps": e.steps, "tokens": e.tokens,
        }));
    }
    let failed = ends
        .iter()
        .filter(|e| !matches!(e.state, RunState::Done | RunState::BudgetSpent))
        .count();
    ToolOutcome::Done {
        text,
        is_error: !ends.is_empty() && failed == ends.len(),
        detail: json!({ "children": children }),
    }
}

/// What a run spent: its own model calls (steps) and every model call of
/// every run below it.
pub(super) fn totals_of(store: &Store, id: &str) -> Result<Totals> {
    let mut t = Totals {
        steps: 0,
        usage: Usage::default(),
        cost: 0.0,
    };
    let mut ids = vec![id.to_string()];
    ids.extend(journal::descendants(store, id)?.into_iter().map(|r| r.id));
    for r in ids {
        // A run's own summary calls are not its steps; every model call a
        // sub-agent makes, its summaries included, is its parent's spend.
        let own = r == id;
        for s in journal::steps(store, &r)? {
            if !s.summary || !own {
                t.steps += 1;
            }
            add(&mut t.usage, &s.usage);
            t.cost += s.cost.unwrap_or(0.0);
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_budget_is_within_its_share_and_never_unbounded() {
        let share = Budget {
            max_steps: Some(5),
            max_tokens: None,
            max_cost: Some(0.5),
        };
        let asked = Budget {
            max_steps: Some(9),
            max_tokens: Some(1000),
            max_cost: None,
        };
        let b = carve(asked, share);
        assert_eq!(b.max_steps, Some(5));
        assert_eq!(b.max_tokens, Some(1000));
        assert_eq!(b.max_cost, Some(0.5));
        let b = carve(Budget::default(), Budget::default());
        assert_eq!(b.max_steps, Some(CHILD_DEFAULT_STEPS));
    }
}
