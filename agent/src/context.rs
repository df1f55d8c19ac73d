//! What a run sends, as opposed to what it stores: the journal keeps every
//! message; a [`Compaction`] says which of them the model is shown in full,
//! which as a stub, and which through a summary.
//!
//! Flow at a glance: [`view`] builds the transcript to send from the stored
//! messages and the run's latest compaction. [`plan`] picks the cheapest
//! compaction that brings a transcript under a token target, in stages:
//! mask old tool results, then summarise the elided middle keeping recent
//! turns, then rotate to a new segment that keeps only the newest turn.
//! Tokens are estimated from bytes ([`estimate`]); the loop corrects the
//! estimate with the provider's reported usage where it has one.
//!
//! Never elided: the task (the first message), anything the person said,
//! and the newest turn (its tool results, and so any pending approval).
//! The system prompt and the tool schemas are not part of the transcript and
//! never change.

use serde::{Deserialize, Serialize};

use super::provider::{Message, Role};

/// Bytes per token of the estimate. Tokenizers give about 4 bytes of
/// English per token and fewer for code and JSON; 3 errs on the side of
/// compacting early.
pub const BYTES_PER_TOKEN: u64 = 3;
/// Framing per message (role, ids, separators), in bytes.
const MESSAGE_OVERHEAD: u64 = 24;

/// How far a compaction went, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Old tool results replaced by stubs.
    Mask,
    /// The middle replaced by the model's summary; recent turns kept.
    Summary,
    /// A new segment: the task, the summary and the newest turn.
    Rotate,
}

impl Stage {
    /// Its name in the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Mask => "mask",
            Stage::Summary => "summary",
            Stage::Rotate => "rotate",
        }
    }

    /// From its name in the journal.
    pub fn parse(s: &str) -> Option<Stage> {
        match s {
            "mask" => Some(Stage::Mask),
            "summary" => Some(Stage::Summary),
            "rotate" => Some(Stage::Rotate),
            _ => None,
        }
    }
}

/// One compaction of a run, cumulative: the latest one alone says what is
/// sent. Positions index the run's stored messages (0 is the task).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// The step whose request it shaped.
    pub step: i64,
    /// How far it went.
    pub stage: Stage,
    /// The transcript segment sent from now on (0 before any rotation).
    pub segment: i64,
    /// Tool results before this position are sent as stubs.
    pub masked: usize,
    /// Messages in `1..summarised` are sent as the summary (0: none).
    pub summarised: usize,
    /// The summary of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The tools-off model call that wrote the summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary_step: Option<i64>,
    /// Estimated tokens of the request before.
    pub tokens_before: u64,
    /// And after.
    pub tokens_after: u64,
    /// The window it was fitted to.
    pub window: u64,
    /// What went wrong on the way (a summary berth had to write itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Tokens of `bytes` bytes.
pub fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(BYTES_PER_TOKEN)
}

/// Estimated tokens of one message.
pub fn estimate(m: &Message) -> u64 {
    let calls: usize = m
        .tool_calls
        .iter()
        .map(|c| c.id.len() + c.name.len() + c.arguments.len() + 16)
        .sum();
    tokens(m.text.len() + calls) + MESSAGE_OVERHEAD / BYTES_PER_TOKEN
}

/// Estimated tokens of a transcript.
pub fn estimate_all(msgs: &[Message]) -> u64 {
    msgs.iter().map(estimate).sum()
}

/// A person's words, as opposed to berth's notes (which start `[berth:`).
pub fn from_person(m: &Message) -> bool {
    m.role == Role::User && !m.text.starts_with("[berth:")
}

/// The stub a masked tool result is sent as.
pub fn stub(text: &str, run_id: &str) -> String {
    let code = text
        .rfind("[exit code ")
        .and_then(|at| {
            let rest = &text[at + "[exit code ".len()..];
            rest.find(']').map(|end| rest[..end].to_string())
        })
        .map(|c| format!(", exit code {c}"))
        .unwrap_or_default();
    format!(
        "[berth: output elided to fit the context window ({} bytes{code}). The journal keeps it: `berth runs show {run_id}`; or run the command again, or read_file a file it wrote.]",
        text.len()
    )
}

/// Positions where a model turn starts: where the transcript can be cut
/// without parting a tool call from its result.
pub fn turn_starts(msgs: &[(i64, Message)]) -> Vec<usize> {
    msgs.iter()
        .enumerate()
        .filter(|(_, (_, m))| m.role == Role::Assistant)
        .map(|(i, _)| i)
        .collect()
}

/// The transcript to send: stored messages shaped by the latest compaction.
/// Tool results longer than `result_cap` bytes are cut in the middle (the
/// journal keeps them whole).
pub fn view(
    msgs: &[(i64, Message)],
    c: Option<&Compaction>,
    run_id: &str,
    result_cap: Option<usize>,
) -> Vec<Message> {
    let newest = turn_starts(msgs).last().copied().unwrap_or(0);
    let (masked, summarised) = c.map_or((0, 0), |c| {
        (c.masked.min(newest), c.summarised.min(newest.max(1)))
    });
    let mut out = Vec::with_capacity(msgs.len());
    let Some((_, task)) = msgs.first() else {
        return out;
    };
    out.push(task.clone());
    let mut from = 1;
    if let Some(c) = c
        && summarised > 1
    {
        out.extend(
            msgs[1..summarised]
                .iter()
                .filter(|(_, m)| from_person(m))
                .map(|(_, m)| m.clone()),
        );
        out.push(summary_message(c, run_id));
        from = summarised;
    }
    for (i, (_, m)) in msgs.iter().enumerate().skip(from) {
        let mut m = m.clone();
        if m.role == Role::Tool {
            if i < masked && m.text.len() > 240 {
                m.text = stub(&m.text, run_id);
            } else if let Some(cap) = result_cap {
                m.text = bound(&m.text, cap);
            }
        }
        out.push(m);
    }
    out
}

fn summary_message(c: &Compaction, run_id: &str) -> Message {
    Message::user(format!(
        "[berth: the earlier steps of this run were compacted to fit the model's context window (segment {}). Their summary follows; the full transcript is in berth's journal (`berth runs show {run_id}`).]\n\n{}",
        c.segment,
        c.summary.as_deref().unwrap_or("(no summary)")
    ))
}

/// What a compaction should reach.
pub struct Target {
    /// Tokens the transcript may take (the window's share, minus the fixed
    /// prefix).
    pub tokens: u64,
    /// Go at least this far (a refusal for size asks for more than before).
    pub at_least: Stage,
}

/// The plan for the next compaction, before any summary is written.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// How far it goes.
    pub stage: Stage,
    /// Stubs before this position.
    pub masked: usize,
    /// Summary of `1..summarised` (equal to the previous one when only
    /// masking).
    pub summarised: usize,
}

/// Tokens a summary may take in the transcript.
pub fn summary_allowance(window: u64) -> u64 {
    (window / 10).clamp(64, 2048)
}

/// The cheapest compaction that brings the transcript under `t.tokens`
/// (it may not get there: the loop checks the result).
pub fn plan(msgs: &[(i64, Message)], prev: Option<&Compaction>, run_id: &str, t: &Target) -> Plan {
    let starts = turn_starts(msgs);
    let newest = starts.last().copied().unwrap_or(0);
    let prev_masked = prev.map_or(0, |c| c.masked);
    let prev_summarised = prev.map_or(0, |c| c.summarised);
    // Stage a: stubs for every tool result before the newest turn.
    if t.at_least <= Stage::Mask {
        let mut probe = prev.cloned().unwrap_or_else(|| blank(0));
        probe.masked = newest;
        probe.summary = prev.and_then(|c| c.summary.clone());
        let sent = estimate_all(&view(msgs, Some(&probe), run_id, None));
        if sent <= t.tokens && newest > prev_masked {
            return Plan {
                stage: Stage::Mask,
                masked: newest,
                summarised: prev_summarised,
            };
        }
    }
    // Stage b: summarise up to the earliest turn start whose tail fits,
    // keeping recent turns (masked) after the summary.
    let allowance = summary_allowance(t.tokens);
    let head: u64 = estimate(&msgs[0].1)
        + msgs[1..]
            .iter()
            .filter(|(_, m)| from_person(m))
            .map(|(_, m)| estimate(m))
            .sum::<u64>()
        + allowance;
    if t.at_least <= Stage::Summary {
        for &s in starts.iter().filter(|s| **s > prev_summarised.max(1)) {
            if s == newest {
                break;
            }
            let tail: u64 = msgs[s..]
                .iter()
                .enumerate()
                .map(|(k, (_, m))| {
                    if m.role == Role::Tool && s + k < newest && m.text.len() > 240 {
                        tokens(stub(&m.text, run_id).len()) + MESSAGE_OVERHEAD / BYTES_PER_TOKEN
                    } else {
                        estimate(m)
                    }
                })
                .sum();
            if head + tail <= t.tokens {
                return Plan {
                    stage: Stage::Summary,
                    masked: newest,
                    summarised: s,
                };
            }
        }
    }
    // Stage c: a new segment with only the newest turn.
    Plan {
        stage: Stage::Rotate,
        masked: newest,
        summarised: newest,
    }
}

/// No compaction yet, for a `window`: everything is sent.
pub fn blank(window: u64) -> Compaction {
    Compaction {
        step: 0,
        stage: Stage::Mask,
        segment: 0,
        masked: 0,
        summarised: 0,
        summary: None,
        summary_step: None,
        tokens_before: 0,
        tokens_after: 0,
        window,
        note: None,
    }
}

impl Compaction {
    /// The compaction `plan` describes, after `prev`.
    pub fn from_plan(p: &Plan, prev: Option<&Compaction>, step: i64, window: u64) -> Compaction {
        let mut c = prev.cloned().unwrap_or_else(|| blank(0));
        c.step = step;
        c.stage = p.stage;
        c.masked = p.masked;
        c.note = None;
        c.summary_step = None;
        c.summarised = p.summarised;
        if p.stage == Stage::Rotate {
            c.segment += 1;
        }
        c.window = window;
        c
    }
}

/// `text` cut to about `limit` bytes: its head and tail, with the exact count
/// of what was left out between them.
pub fn bound(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut head = limit / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (limit - limit / 2);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[berth: {} of {} bytes omitted]\n{}",
        &text[..head],
        tail - head,
        text.len(),
        &text[tail..]
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::provider::ToolCall;

    fn turn(step: i64, out: &str) -> Vec<(i64, Message)> {
        let id = format!("c{step}");
        vec![
            (
                step,
                Message {
                    role: Role::Assistant,
                    text: String::new(),
                    tool_calls: vec![ToolCall {
                        id: id.clone(),
                        name: "terminal".into(),
                        arguments: format!("{{\"command\":\"step {step}\"}}"),
                    }],
                    tool_call_id: None,
                    is_error: false,
                    truncated: false,
                },
            ),
            (
                step,
                Message::tool(&id, format!("{out}\n[exit code {step}]"), false),
            ),
        ]
    }

    fn transcript(n: i64) -> Vec<(i64, Message)> {
        let mut msgs = vec![(0, Message::user("the task"))];
        for s in 1..=n {
            msgs.extend(turn(s, &"x".repeat(3000)));
            if s == 3 {
                msgs.push((s, Message::user("the person says: use /tmp")));
            }
        }
        msgs
    }

    #[test]
    fn a_stub_keeps_the_exit_code_and_says_how_to_get_the_output_back() {
        let s = stub("lots\n[exit code 3]", "r1");
        assert!(
            s.contains("exit code 3") && s.contains("berth runs show r1"),
            "{s}"
        );
    }

    #[test]
    fn masking_keeps_calls_the_task_and_the_newest_result_whole() {
        let msgs = transcript(6);
        let big = estimate_all(&view(&msgs, None, "r1", None));
        let p = plan(
            &msgs,
            None,
            "r1",
            &Target {
                tokens: big / 2,
                at_least: Stage::Mask,
            },
        );
        assert_eq!(p.stage, Stage::Mask);
        let c = Compaction::from_plan(&p, None, 7, 8000);
        let v = view(&msgs, Some(&c), "r1", None);
        assert_eq!(v.len(), msgs.len());
        assert_eq!(v[0].text, "the task");
        assert!(v[2].text.contains("exit code 1") && v[2].text.len() < 300);
        assert_eq!(v.last().unwrap().text, msgs.last().unwrap().1.text);
        assert!(v.iter().any(|m| m.text == "the person says: use /tmp"));
        assert!(estimate_all(&v) <= big / 2);
    }

    #[test]
    fn summary_then_rotation_keep_the_task_the_person_and_the_newest_turn() {
        let msgs = transcript(40);
        let p = plan(
            &msgs,
            None,
            "r1",
            &Target {
                tokens: 2000,
                at_least: Stage::Mask,
            },
        );
        assert_eq!(p.stage, Stage::Summary, "{p:?}");
        let mut c = Compaction::from_plan(&p, None, 41, 8000);
        c.summary = Some("## Task\nthe task".into());
        let v = view(&msgs, Some(&c), "r1", None);
        assert!(estimate_all(&v) <= 2000, "{}", estimate_all(&v));
        assert_eq!(v[0].text, "the task");
        assert_eq!(v[1].text, "the person says: use /tmp");
        assert!(v[2].text.contains("## Task"));
        assert_eq!(v[3].role, Role::Assistant, "the tail starts at a turn");
        assert_eq!(v.last().unwrap().text, msgs.last().unwrap().1.text);
        // Asked for more than a summary: a new segment with the newest turn only.
        let p = plan(
            &msgs,
            Some(&c),
            "r1",
            &Target {
                tokens: 2000,
                at_least: Stage::Rotate,
            },
        );
        assert_eq!(p.stage, Stage::Rotate);
        let r = Compaction::from_plan(&p, Some(&c), 42, 8000);
        assert_eq!(r.segment, 1);
        let v = view(&msgs, Some(&r), "r1", None);
        assert_eq!(
            v.len(),
            5,
            "task, person, summary, the newest call and result"
        );
    }
}
