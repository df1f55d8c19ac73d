//! Keeping a run inside its model's context window.
//!
//! Flow at a glance, before each model call ([`Agent::fit`]): learn the
//! window (configured, else asked of the endpoint once), count the request's
//! tokens (the last reported usage plus an estimate of what was added since,
//! or the estimate alone, scaled by what the provider reported before), and
//! when it passes the threshold, compact: stubs for old tool results, then a
//! summary the model writes with tools off (a step of its own), then a new
//! segment. The compaction is journaled once it is whole, with its summary
//! step; the stored messages never change. A refusal for size is answered
//! by [`Agent::run`]'s loop with one harder compaction and one retry.

use super::*;
use crate::context::{self, Compaction, Plan, Stage, Target, bound};

/// What the loop knows about the run's size between steps.
pub(super) struct Meter {
    /// The latest compaction.
    pub compaction: Option<Compaction>,
    /// Tokens of the system prompt and the tool schemas.
    fixed: u64,
    /// Reported input tokens over estimated ones, from the last reported step.
    ratio: f64,
    /// The last request: its transcript length and the tokens the provider
    /// counted for it (none when it does not report usage, or a compaction
    /// has changed the transcript since).
    last: Option<(usize, u64)>,
    /// The transcript of the request about to be sent.
    pending: usize,
    pending_estimate: u64,
}

impl Meter {
    pub(super) fn new(setup: &Setup, compaction: Option<Compaction>) -> Self {
        let tools = serde_json::to_string(&setup.tools).unwrap_or_default();
        Meter {
            compaction,
            fixed: context::tokens(setup.system.len() + tools.len()),
            ratio: 1.0,
            last: None,
            pending: 0,
            pending_estimate: 0,
        }
    }

    /// Tokens of a request with this transcript.
    fn count(&self, view: &[Message]) -> u64 {
        if let Some((len, input)) = self.last
            && len <= view.len()
        {
            return input + self.scaled(context::estimate_all(&view[len..]));
        }
        self.scaled(self.fixed + context::estimate_all(view))
    }

    /// Tokens of a request with this transcript, by estimate alone.
    fn fresh(&self, view: &[Message]) -> u64 {
        self.scaled(self.fixed + context::estimate_all(view))
    }

    fn scaled(&self, n: u64) -> u64 {
        (n as f64 * self.ratio).ceil() as u64
    }

    /// A request went out and was answered with `usage`.
    pub(super) fn answered(&mut self, usage: &Usage) {
        if usage.input_tokens == 0 {
            self.last = None;
            return;
        }
        if self.pending_estimate > 0 {
            self.ratio =
                (usage.input_tokens as f64 / self.pending_estimate as f64).clamp(0.25, 4.0);
        }
        // The answer itself joins the transcript; the estimate covers it.
        self.last = Some((self.pending, usage.input_tokens));
    }

    fn sending(&mut self, view: &[Message]) {
        self.pending = view.len();
        self.pending_estimate = self.fixed + context::estimate_all(view);
    }
}

/// The result of fitting a request.
pub(super) enum Fit {
    /// Send this transcript; `tokens` is its count.
    Send(Vec<Message>, u64),
    /// Stop the run.
    Stop((RunState, Option<String>, Option<String>)),
}

/// The largest tool result sent whole, for a window of `window` tokens.
fn result_cap(window: u64) -> usize {
    ((window * context::BYTES_PER_TOKEN / 4) as usize).max(2048)
}

impl Agent {
    /// The transcript for the next request, compacted if it would pass the
    /// threshold (or, `harder`, after a refusal for size, to half the window).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fit(
        &mut self,
        id: &str,
        setup: &Setup,
        msgs: &[(i64, Message)],
        step: &mut i64,
        totals: &mut Totals,
        meter: &mut Meter,
        harder: bool,
        cancel: &CancellationToken,
    ) -> Result<Fit> {
        self.failover.probe_windows().await;
        let window = self.failover.window();
        let cap = window.map(result_cap);
        let view = context::view(msgs, meter.compaction.as_ref(), id, cap);
        let before = meter.count(&view);
        let Some(window) = window else {
            meter.sending(&view);
            return Ok(Fit::Send(view, before));
        };
        let at = self.failover.compact_at();
        let threshold = (window as f64 * at) as u64;
        if before <= threshold && !harder {
            meter.sending(&view);
            return Ok(Fit::Send(view, before));
        }
        // The least a request can hold: the task, what the person said and
        // the newest turn. If that does not fit, compacting cannot help.
        let cut = context::turn_starts(msgs)
            .last()
            .copied()
            .unwrap_or(msgs.len())
            .max(1);
        let least: Vec<Message> = msgs
            .iter()
            .enumerate()
            .filter(|(i, (_, m))| *i == 0 || *i >= cut || context::from_person(m))
            .map(|(_, (_, m))| {
                let mut m = m.clone();
                if m.role == Role::Tool
                    && let Some(cap) = cap
                {
                    m.text = bound(&m.text, cap);
                }
                m
            })
            .collect();
        if meter.fresh(&least) > window {
            return Ok(Fit::Stop(self.too_small(id, msgs, &least, window, meter)));
        }
        // Compact well below the threshold, so the next steps have room.
        let goal = if harder {
            window * 2 / 5
        } else {
            threshold * 2 / 3
        };
        let fixed = meter.scaled(meter.fixed);
        let budget = |n: u64| (n.saturating_sub(fixed) as f64 / meter.ratio) as u64;
        let mut at_least = Stage::Mask;
        loop {
            let prev = meter.compaction.clone();
            let plan = context::plan(
                msgs,
                prev.as_ref(),
                id,
                &Target {
                    tokens: budget(goal),
                    at_least,
                },
            );
            let mut c = Compaction::from_plan(&plan, prev.as_ref(), *step + 1, window);
            c.tokens_before = before;
            if plan.stage >= Stage::Summary {
                match self
                    .summarise(
                        id,
                        setup,
                        msgs,
                        prev.as_ref(),
                        &plan,
                        window,
                        step,
                        totals,
                        cancel,
                    )
                    .await?
                {
                    Ok((text, row, note)) => {
                        c.step = *step + 1;
                        c.summary = Some(text);
                        c.summary_step = row.as_ref().map(|r| r.step);
                        c.note = note;
                        let sent = context::view(msgs, Some(&c), id, cap);
                        meter.last = None;
                        c.tokens_after = meter.count(&sent);
                        if c.tokens_after > window && plan.stage < Stage::Rotate {
                            // Keep the summary's step; go on to a new segment.
                            if let Some(r) = &row {
                                journal::put_step(&self.store, id, r)?;
                            }
                            at_least = Stage::Rotate;
                            continue;
                        }
                        if c.tokens_after > window {
                            if let Some(r) = &row {
                                journal::put_step(&self.store, id, r)?;
                            }
                            return Ok(Fit::Stop(self.too_small(id, msgs, &sent, window, meter)));
                        }
                        journal::put_compaction(&self.store, id, &c, row.as_ref())?;
                        self.compacted(&c);
                        meter.compaction = Some(c);
                        meter.sending(&sent);
                        return Ok(Fit::Send(
                            sent,
                            meter.compaction.as_ref().map_or(0, |c| c.tokens_after),
                        ));
                    }
                    Err(stop) => return Ok(Fit::Stop(stop)),
                }
            }
            let sent = context::view(msgs, Some(&c), id, cap);
            meter.last = None;
            c.tokens_after = meter.count(&sent);
            if c.tokens_after > threshold.max(goal) && plan.stage == Stage::Mask {
                at_least = Stage::Summary;
                continue;
            }
            if c.tokens_after > window {
                return Ok(Fit::Stop(self.too_small(id, msgs, &sent, window, meter)));
            }
            journal::put_compaction(&self.store, id, &c, None)?;
            self.compacted(&c);
            let after = c.tokens_after;
            meter.compaction = Some(c);
            meter.sending(&sent);
            return Ok(Fit::Send(sent, after));
        }
    }

    fn compacted(&self, c: &Compaction) {
        (self.events)(&AgentEvent::Compaction {
            step: c.step,
            stage: c.stage,
            segment: c.segment,
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
            window: c.window,
            summary: c.summary.clone(),
            note: c.note.clone(),
        });
    }

    /// The window cannot hold even the smallest transcript: say what takes
    /// the room, and how to carry on.
    fn too_small(
        &self,
        id: &str,
        msgs: &[(i64, Message)],
        sent: &[Message],
        window: u64,
        meter: &Meter,
    ) -> (RunState, Option<String>, Option<String>) {
        let task = msgs.first().map_or(0, |(_, m)| context::estimate(m));
        let newest: u64 = sent
            .iter()
            .rev()
            .take_while(|m| m.role != Role::Assistant)
            .map(context::estimate)
            .sum();
        (
            RunState::Error,
            Some(format!(
                "the context window ({window} tokens, the smallest of the run's providers') cannot hold this run even compacted as far as it goes: the system prompt and tool schemas take about {} tokens, the task about {}, the newest tool result(s) about {}, {} in all. Use a provider with a larger window (or set its `context_window` right if it is wrong, or pass --context-window), then carry on with `berth run --resume {id}`",
                meter.scaled(meter.fixed),
                meter.scaled(task),
                meter.scaled(newest),
                meter.fresh(sent),
            )),
            None,
        )
    }

    /// The model's summary of the messages a plan elides, with tools off;
    /// when that call fails or is refused, a summary berth writes from the
    /// journal, with a note saying so.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    async fn summarise(
        &mut self,
        id: &str,
        setup: &Setup,
        msgs: &[(i64, Message)],
        prev: Option<&Compaction>,
        plan: &Plan,
        window: u64,
        step: &mut i64,
        totals: &mut Totals,
        cancel: &CancellationToken,
    ) -> Result<
        std::result::Result<
            (String, Option<StepRow>, Option<String>),
            (RunState, Option<String>, Option<String>),
        >,
    > {
        let from = prev.map_or(1, |c| c.summarised.max(1));
        let upto = plan.summarised.max(from);
        let starts = context::turn_starts(msgs);
        let limit = (window as f64 * 0.6) as u64;
        // The elided middle, every tool result a stub; when even that is too
        // much, its oldest turns go (the previous summary covers the start).
        let mut first = from;
        let ask = loop {
            let mut c = prev.cloned().unwrap_or_else(|| context::blank(window));
            c.masked = upto;
            c.summarised = if first > 1 { first } else { 0 };
            if c.summary.is_none() && first > 1 {
                c.summary = Some("(the steps before these were dropped to fit)".into());
            }
            let mut v = context::view(&msgs[..upto], Some(&c), id, None);
            // `view` keeps the newest turn of `part` whole: stub it too.
            for m in v
                .iter_mut()
                .filter(|m| m.role == Role::Tool && m.text.len() > 240)
            {
                m.text = context::stub(&m.text, id);
            }
            v.push(Message::user(SUMMARY_ASK));
            let n = meter_estimate(setup, &v);
            if n <= limit {
                break v;
            }
            match starts.iter().find(|s| **s > first && **s < upto) {
                Some(s) => first = *s,
                None => break v,
            }
        };
        *step += 1;
        let started_ms = now_ms();
        let req = Request {
            system: &setup.system,
            messages: &ask,
            tools: &setup.tools,
            tool_choice: ToolChoice::None,
        };
        let events = self.events.clone();
        let mut on_retry = |a: &Attempt| events(&AgentEvent::Failover { attempt: a.clone() });
        let mut quiet = |_: &str| {};
        let answer = self
            .failover
            .complete(&req, &mut quiet, &mut on_retry, cancel)
            .await;
        let why = match answer {
            Ok(a) if !a.turn.text.trim().is_empty() => {
                let provider = &self.failover.providers()[a.provider];
                let cost = provider.cost(&a.turn.usage);
                add(&mut totals.usage, &a.turn.usage);
                totals.cost += cost.unwrap_or(0.0);
                let row = StepRow {
                    step: *step,
                    provider: Some(provider.name.clone()),
                    attempts: a.attempts,
                    usage: a.turn.usage,
                    cost,
                    started_ms,
                    ended_ms: now_ms(),
                    summary: true,
                };
                let note = (first > from).then(|| {
                    format!("the summary covers steps from message {first}: the ones before did not fit the summary call")
                });
                return Ok(Ok((a.turn.text, Some(row), note)));
            }
            Ok(_) => "the model answered with no text".to_string(),
            Err((ProviderError::Cancelled, _)) => {
                return Ok(Err((
                    RunState::Interrupted,
                    Some("interrupted by the user while the model was summarising".into()),
                    None,
                )));
            }
            Err((e, _)) => {
                if let ProviderError::TooLarge { window: named, .. } = &e {
                    self.failover
                        .learn_refusal(*named, meter_estimate(setup, &ask));
                }
                e.to_string()
            }
        };
        let why = (self.redact)(&why);
        let text = fallback_summary(msgs, from, upto, &why);
        Ok(Ok((
            text,
            None,
            Some(format!(
                "the model's summary call failed ({why}); berth wrote the summary from the journal"
            )),
        )))
    }
}

/// What the model is asked when it summarises.
const SUMMARY_ASK: &str = "[berth: the transcript above is about to be compacted to fit your context window. Tools are off for this answer. Write a summary of the steps above for yourself to carry on from, in exactly these sections:\n## Task\n## Decisions\n## State of the sandbox\n## Open questions\n## Next step\nBe specific: paths, commands, results, what failed and why.]";

fn meter_estimate(setup: &Setup, v: &[Message]) -> u64 {
    let tools = serde_json::to_string(&setup.tools).unwrap_or_default();
    context::tokens(setup.system.len() + tools.len()) + context::estimate_all(v)
}

/// A summary in the fixed structure, from the journal alone.
fn fallback_summary(msgs: &[(i64, Message)], from: usize, upto: usize, why: &str) -> String {
    let task = msgs.first().map_or("", |(_, m)| m.text.as_str());
    let mut calls = Vec::new();
    for (i, (s, m)) in msgs.iter().enumerate().take(upto).skip(from) {
        for c in &m.tool_calls {
            let outcome = msgs[i + 1..upto]
                .iter()
                .find(|(_, r)| r.tool_call_id.as_deref() == Some(c.id.as_str()))
                .map(|(_, r)| {
                    let stub = context::stub(&r.text, "");
                    match stub.find(", exit code ") {
                        Some(at) => stub[at + 2..].split(')').next().unwrap_or("").to_string(),
                        None if r.is_error => "refused or failed".into(),
                        None => "done".into(),
                    }
                })
                .unwrap_or_else(|| "no result".into());
            let args: String = c.arguments.chars().take(160).collect();
            calls.push(format!("- step {s}: `{}` {args} → {outcome}", c.name));
        }
    }
    let skip = calls.len().saturating_sub(30);
    format!(
        "## Task\n{task}\n## Decisions\n(berth wrote this summary itself: {why}.)\n## State of the sandbox\nCalls made in the compacted steps{}:\n{}\n## Open questions\nThe outputs of these calls are not in view; check the sandbox before relying on them.\n## Next step\nCarry on with the task from the newest result.",
        if skip > 0 {
            format!(" (the last 30 of {})", calls.len())
        } else {
            String::new()
        },
        calls[skip..].join("\n")
    )
}
