//! The dashboard's pages and the fragments their live parts replace,
//! rendered on the server with maud (compiled templates: every value is
//! escaped unless marked `PreEscaped`, which only berth's own SVG is).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, PreEscaped, html};

use super::Ui;
use super::data::{self, EventFilter, JobView, Overview, RunView};
use super::html::{Nav, duration, failed, layout, not_found, page, short, state_badge, when};
use super::{seen, svg};

/// How long a job ran, once it ended: a live page is replaced only when
/// something changed, and a clock would change it every time (and take the
/// keyboard's focus from its buttons).
fn ran(j: &berth_core::jobs::Job) -> String {
    if j.state.is_final() {
        duration(j.runtime_ms())
    } else {
        "still running".into()
    }
}

// ---- the overview

pub async fn overview(State(ui): State<Arc<Ui>>) -> Response {
    match data::overview(&ui.rt).await {
        Ok(o) => page(StatusCode::OK, overview_page(&o)),
        Err(e) => failed(&e),
    }
}

fn overview_page(o: &Overview) -> Markup {
    let (a, j, r, s) = (
        approvals(o).into_string(),
        jobs(o).into_string(),
        runs(o).into_string(),
        sandboxes(o).into_string(),
    );
    let live = format!(
        "/live/overview?{}",
        seen::query(&[
            ("approvals", &a),
            ("jobs", &j),
            ("runs", &r),
            ("sandboxes", &s)
        ])
    );
    layout(
        "Overview",
        Nav::Overview,
        html! {
            h1 { "Overview" }
            div data-live=(live) {
                section aria-labelledby="h-approvals" {
                    h2 #h-approvals { "Waiting for you" }
                    div #approvals aria-live="polite" { (PreEscaped(a)) }
                }
                section aria-labelledby="h-jobs" {
                    h2 #h-jobs { "Jobs" }
                    div #jobs { (PreEscaped(j)) }
                }
                section aria-labelledby="h-runs" {
                    h2 #h-runs { "Agent runs" }
                    div #runs { (PreEscaped(r)) }
                }
                section aria-labelledby="h-sandboxes" {
                    h2 #h-sandboxes { "Sandboxes" }
                    div #sandboxes { (PreEscaped(s)) }
                }
            }
        },
    )
}

pub fn approvals(o: &Overview) -> Markup {
    html! {
        @if o.approvals.is_empty() {
            p.empty { "No command waits for an approval." }
        } @else {
            ul.approvals {
                @for a in &o.approvals {
                    li.approval #{ "approval-" (a.id) } {
                        p {
                            strong { "#" (a.id) } " in " (a.backend) "/" (a.sandbox) ": "
                            code { (short(&a.command, 300)) }
                        }
                        p.why { "Rule " code { (a.rule) } ": " (a.reason) }
                        div.buttons role="group" aria-label={ "Answer approval " (a.id) } {
                            form method="post" action={ "/approvals/" (a.id) "/approve" } {
                                button #{ "approve-" (a.id) } type="submit" .approve { "Approve" }
                            }
                            form method="post" action={ "/approvals/" (a.id) "/deny" } {
                                button #{ "deny-" (a.id) } type="submit" .deny { "Deny" }
                            }
                            form method="post" action={ "/approvals/" (a.id) "/always" } {
                                button #{ "always-" (a.id) } type="submit" title="Approve, and add an allow rule for this command to the policy" { "Always" }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub fn jobs(o: &Overview) -> Markup {
    html! {
        @if o.jobs.is_empty() {
            p.empty { "No jobs. Start one with " code { "berth job start -- CMD" } "." }
        } @else {
            table {
                caption.sr { "Running and recent jobs" }
                thead { tr { th scope="col" { "Job" } th scope="col" { "Sandbox" } th scope="col" { "Command" } th scope="col" { "State" } th scope="col" { "Exit" } th scope="col" { "Started" } th scope="col" { "Ran" } } }
                tbody {
                    @for j in &o.jobs {
                        tr {
                            td { a href={ "/jobs/" (j.id) } { (j.name.as_deref().unwrap_or(&j.id)) } }
                            td { (j.backend) "/" (j.sandbox) }
                            td { code { (short(&j.command, 80)) } }
                            td { (state_badge(j.state.as_str())) }
                            td { (j.exit_code.map(|c| c.to_string()).unwrap_or_default()) }
                            td { (when(j.created_at)) }
                            td { (ran(j)) }
                        }
                    }
                }
            }
        }
    }
}

pub fn runs(o: &Overview) -> Markup {
    html! {
        @if o.runs.is_empty() {
            p.empty { "No agent runs. Start one with " code { "berth run \"TASK\"" } "." }
        } @else {
            table {
                caption.sr { "Agent runs, newest first" }
                thead { tr { th scope="col" { "Run" } th scope="col" { "Task" } th scope="col" { "State" } th scope="col" { "Steps" } th scope="col" { "Tokens" } th scope="col" { "Cost" } th scope="col" { "Updated" } } }
                tbody {
                    @for r in &o.runs {
                        tr {
                            td { a href={ "/runs/" (r.row.id) } { (r.row.id) } }
                            td { (short(&r.row.task, 80)) }
                            td { (state_badge(r.row.state.as_str())) }
                            td { (r.steps) }
                            td { (r.tokens) }
                            td { (r.cost.map(|c| format!("${c:.4}")).unwrap_or_else(|| "—".into())) }
                            td { (when(r.row.updated_ms)) }
                        }
                    }
                }
            }
        }
    }
}

pub fn sandboxes(o: &Overview) -> Markup {
    html! {
        @if o.sandboxes.is_empty() {
            p.empty { "No sandboxes yet. " code { "berth exec -- CMD" } " makes the default one." }
        } @else {
            table {
                caption.sr { "Sandboxes" }
                thead { tr { th scope="col" { "Sandbox" } th scope="col" { "Backend" } th scope="col" { "State" } th scope="col" { "Sessions" } th scope="col" { "Last use" } } }
                tbody {
                    @for s in &o.sandboxes {
                        tr {
                            td { a href={ "/events?sandbox=" (s.row.name) } { (s.row.name) } }
                            td { (s.row.backend) }
                            td { (state_badge(if s.busy { "busy" } else { "idle" })) }
                            td { (s.sessions) }
                            td { (when(s.row.last_used)) }
                        }
                    }
                }
            }
        }
    }
}

// ---- a job

pub async fn job(State(ui): State<Arc<Ui>>, Path(id): Path<String>) -> Response {
    match data::job(&ui.rt, &id).await {
        Ok(Some(v)) => page(StatusCode::OK, job_page(&v)),
        Ok(None) => not_found("job", &id),
        Err(e) => failed(&e),
    }
}

fn job_page(v: &JobView) -> Markup {
    let j = &v.job;
    let title = format!("Job {}", j.name.as_deref().unwrap_or(&j.id));
    let state = job_state(v).into_string();
    let live = format!("/live/jobs/{}?{}", j.id, seen::query(&[("state", &state)]));
    layout(
        &title,
        Nav::Other,
        html! {
            h1 { (title) }
            div data-live=(live) {
                section aria-labelledby="h-state" {
                    h2 #h-state { "State" }
                    div #job-state aria-live="polite" { (PreEscaped(state)) }
                }
                @if let Some(size) = j.pty {
                    section aria-labelledby="h-screen" {
                        h2 #h-screen { "Screen (" (size.cols) "×" (size.rows) ")" }
                        pre #screen .screen aria-label="The job's terminal screen" {}
                    }
                }
                section aria-labelledby="h-log" {
                    h2 #h-log { "Output" }
                    p.hint { "The newest output, followed live; the page keeps the last 256 KiB. " code { "berth job logs " (j.id) } " prints all of it." }
                    pre #log .log tabindex="0" aria-label="The job's output" {}
                }
            }
        },
    )
}

pub fn job_state(v: &JobView) -> Markup {
    let j = &v.job;
    html! {
        dl.facts {
            dt { "Command" } dd { code { (j.command) } }
            dt { "Sandbox" } dd { (j.backend) "/" (j.sandbox) }
            dt { "State" } dd { (state_badge(j.state.as_str())) @if let Some(r) = &j.reason { " " (r) } }
            @if let Some(c) = j.exit_code { dt { "Exit" } dd { (c) } }
            dt { "Started" } dd { (when(j.created_at)) }
            dt { "Ran" } dd { (ran(j)) }
            dt { "Output" } dd { (j.out_bytes) " bytes" }
            @if !j.watch.is_empty() { dt { "Watching for" } dd { @for w in &j.watch { code { (w) } " " } } }
        }
        @if !v.matches.is_empty() {
            h3 { "Watch matches" }
            ul.matches { @for (ts, pat, line) in &v.matches { li { (when(*ts)) " " code { (pat) } ": " (short(line, 200)) } } }
        }
        @if !j.state.is_final() {
            form method="post" action={ "/jobs/" (j.id) "/kill" } {
                button #kill type="submit" .deny { "Kill" }
            }
        }
    }
}

// ---- a run

pub async fn run(State(ui): State<Arc<Ui>>, Path(id): Path<String>) -> Response {
    match data::run(&ui.rt, &id).await {
        Ok(Some(v)) => page(StatusCode::OK, run_page(&v)),
        Ok(None) => not_found("run", &id),
        Err(e) => failed(&e),
    }
}

fn run_page(v: &RunView) -> Markup {
    let title = format!("Run {}", v.row.id);
    let body = run_body(v).into_string();
    let live = format!("/live/runs/{}?{}", v.row.id, seen::query(&[("run", &body)]));
    layout(
        &title,
        Nav::Other,
        html! {
            h1 { (title) }
            div data-live=(live) {
                div #run aria-live="polite" { (PreEscaped(body)) }
            }
        },
    )
}

pub fn run_body(v: &RunView) -> Markup {
    let r = &v.row;
    let stoppable = matches!(
        r.state,
        berth_agent::RunState::Interrupted
            | berth_agent::RunState::AwaitingApproval
            | berth_agent::RunState::Error
            | berth_agent::RunState::ProviderFailed
            | berth_agent::RunState::BudgetSpent
    );
    html! {
        dl.facts {
            dt { "Task" } dd { (r.task) }
            dt { "State" } dd { (state_badge(r.state.as_str())) @if let Some(why) = &r.reason { " " (why) } }
            dt { "Sandbox" } dd { (r.backend) "/" (r.sandbox) }
            dt { "Steps" } dd { (v.line.steps) }
            dt { "Tokens" } dd { (v.line.tokens) }
            dt { "Cost" } dd { (v.line.cost.map(|c| format!("${c:.4}")).unwrap_or_else(|| "unknown".into())) }
            @if let (Some(p), Some(kind)) = (&r.parent, &r.kind) {
                dt { (if kind == "fork" { "Forked from" } else { "Delegated by" }) }
                dd { a href={ "/runs/" (p) } { (p) } @if let Some(s) = r.parent_step { " at step " (s) } }
            }
            @if let Some(w) = &v.waits {
                @if w.woke_ms.is_none() {
                    dt { "Waiting for" }
                    dd {
                        @if let Some(j) = &w.job { "job " a href={ "/jobs/" (j) } { (j) } @if let Some(p) = &w.pattern { " to print " code { (p) } } }
                        @if let Some(a) = w.approval { "approval #" (a) }
                    }
                }
            }
        }
        div.buttons role="group" aria-label="Run actions" {
            @if stoppable {
                form method="post" action={ "/runs/" (r.id) "/resume" } { button #resume type="submit" { "Resume" } }
            }
            @if !v.steps.is_empty() {
                form.fork method="post" action={ "/runs/" (r.id) "/fork" } {
                    label for="fork-at" { "Fork at step" }
                    input #fork-at type="number" name="at" min="1" max=(v.steps.len()) value=(v.steps.len()) required;
                    button #fork type="submit" { "Fork" }
                }
            }
        }
        section aria-labelledby="h-timeline" {
            h2 #h-timeline { "Timeline" }
            (PreEscaped(svg::timeline(v)))
        }
        section aria-labelledby="h-tokens" {
            h2 #h-tokens { "Tokens and cost per step" }
            (PreEscaped(svg::tokens(v)))
        }
        @if !v.children.is_empty() {
            section aria-labelledby="h-children" {
                h2 #h-children { "Sub-agents" }
                (children(v))
            }
        }
        section aria-labelledby="h-steps" {
            h2 #h-steps { "Steps" }
            @if let Some(c) = &v.first_checkpoint {
                p.checkpoint { "◆ checkpoint " code { (c.id) } " before step 1" }
            }
            @for s in &v.steps {
                article.step .rolled[s.rolled_back] aria-labelledby={ "step-" (s.row.step) } {
                    h3 #{ "step-" (s.row.step) } {
                        "Step " (s.row.step)
                        @if s.row.summary { " (summary)" }
                        @if s.rolled_back { " — rolled back" }
                    }
                    p.meta {
                        (s.row.provider.as_deref().unwrap_or("no provider")) " · "
                        (s.row.usage.input_tokens) " in / " (s.row.usage.output_tokens) " out"
                        @if let Some(c) = s.row.cost { " · $" (format!("{c:.4}")) }
                        " · " (duration(s.row.ended_ms - s.row.started_ms))
                        " · " (when(s.row.started_ms))
                    }
                    @for c in v.compactions.iter().filter(|c| c.step == s.row.step) {
                        p.compaction { "Context " (c.stage.as_str()) ": " (c.tokens_before) " → " (c.tokens_after) " tokens (window " (c.window) ")" }
                    }
                    @for t in &s.text { div.said { (t) } }
                    @if !s.calls.is_empty() {
                        ul.calls {
                            @for c in &s.calls {
                                li {
                                    details {
                                        summary {
                                            code { (c.name) } " "
                                            (state_badge(c.state.as_str()))
                                            @if let Some(vd) = &c.verdict { " " span.verdict { (vd) } }
                                            @if let Some(a) = c.approval { " approval #" (a) }
                                            @if let Some(e) = c.ended_ms { " · " (duration(e - c.started_ms)) }
                                        }
                                        h4 { "Arguments" }
                                        pre { (short_block(&c.args, 4000)) }
                                        @if let Some(res) = &c.result {
                                            h4 { "Result" }
                                            pre { (short_block(res.get("text").and_then(|t| t.as_str()).map(str::to_string).unwrap_or_else(|| res.to_string()).as_str(), 8000)) }
                                        }
                                    }
                                }
                            }
                        }
                    }
                    @if let Some(c) = &s.checkpoint {
                        p.checkpoint { "◆ checkpoint " code { (c.id) } }
                    }
                }
            }
            @for rb in &v.rollbacks {
                p.rollback { "↺ rolled back to step " (rb.to_step) " (steps " (rb.to_step + 1) "–" (rb.from_step) " left the transcript) at " (when(rb.at_ms)) }
            }
        }
    }
}

fn children(v: &RunView) -> Markup {
    // Each child under its parent: descendants come depth-first from the store.
    html! {
        ul.tree {
            @for c in &v.children {
                li class={ "depth-" ((c.depth - v.row.depth - 1).clamp(0, 6)) } {
                    a href={ "/runs/" (c.id) } { (c.id) } " " (state_badge(c.state.as_str())) " " (short(&c.task, 100))
                }
            }
        }
    }
}

fn short_block(text: &str, n: usize) -> String {
    if text.len() <= n {
        text.to_string()
    } else {
        let mut end = n;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}\n… ({} more bytes)", &text[..end], text.len() - end)
    }
}

// ---- events

pub async fn events(State(ui): State<Arc<Ui>>, Query(f): Query<EventFilter>) -> Response {
    match data::events(&ui.rt, f.clone()).await {
        Ok(list) => page(StatusCode::OK, events_page(&f, &list)),
        Err(e) => failed(&e),
    }
}

fn events_page(f: &EventFilter, list: &[berth_core::store::Event]) -> Markup {
    let after = list.first().map(|e| e.id).unwrap_or(0);
    layout(
        "Events",
        Nav::Events,
        html! {
            h1 { "Events" }
            form.filters method="get" action="/events" role="search" aria-label="Filter events" {
                label { "Sandbox " input name="sandbox" value=(f.sandbox) size="14"; }
                label { "Kind starts with " input name="kind" value=(f.kind) size="14" placeholder="job."; }
                label { "Last minutes " input name="minutes" type="number" min="1" value=(f.minutes) size="6"; }
                button type="submit" { "Filter" }
            }
            table data-live={ "/live/events?" (f.query()) "&after=" (after) } {
                caption.sr { "Events, newest first" }
                thead { tr { th scope="col" { "When" } th scope="col" { "Kind" } th scope="col" { "Sandbox" } th scope="col" { "Command" } th scope="col" { "Verdict" } th scope="col" { "Exit" } th scope="col" { "Took" } } }
                tbody #events { (event_rows(list)) }
            }
        },
    )
}

pub fn event_rows(list: &[berth_core::store::Event]) -> Markup {
    html! {
        @for e in list {
            tr {
                td { (when(e.ts_ms)) }
                td { code { (e.kind) } }
                td { (e.backend.map_or("", |b| b.as_str())) @if e.sandbox.is_some() { "/" } (e.sandbox.as_deref().unwrap_or("")) }
                td {
                    @if e.kind.is_job() {
                        @if let Some(id) = &e.call_id { a href={ "/jobs/" (id) } { (id) } " " }
                    }
                    code { (short(e.command.as_deref().unwrap_or(""), 100)) }
                }
                td { (e.verdict.as_deref().unwrap_or("")) }
                td { (e.exit_code.map(|c| c.to_string()).unwrap_or_default()) }
                td { (e.duration_ms.map(duration).unwrap_or_default()) }
            }
        }
    }
}
